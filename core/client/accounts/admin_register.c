/*
 * core/client/accounts/admin_register.c - shared-secret admin registration, shaped like Synapse's
 * so existing tools work: GET /_synapse/admin/v1/register -> {"nonce"}, then POST with {nonce,
 * username, password, admin, mac}.
 *
 * The rules: the endpoint exists only when registration.shared_secret is set (else 404
 * M_UNRECOGNIZED, as if the route were not there); a nonce is single-use and expires after
 * ADMIN_NONCE_TTL_MS; it is consumed by the first POST that names it, whatever that POST's
 * fate, so a wrong MAC cannot be retried against the same nonce; the MAC is compared in
 * constant time. Nonces live in PostgreSQL so any process sharing the database accepts
 * them. Open registration being off (registration.enabled) does not affect this path: it is
 * how an operator creates the first accounts. The password is hashed on the auth pool like
 * any other (acc_create_account).
 */
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/accounts/accounts.h"
#include "core/client/accounts/admin_register.h"
#include "core/client/ratelimits.h"

#define ADMIN_NONCE_TTL_MS (60 * 1000)
#define ADMIN_NONCE_BYTES 16

void admin_register_mac(const char *secret, const char *nonce, const char *username,
                        const char *password, bool admin, char *hex_out)
{
    const char *role = admin ? "admin" : "notadmin";
    size_t ln = strlen(nonce), lu = strlen(username), lp = strlen(password), lr = strlen(role);
    size_t len = ln + lu + lp + lr + 3;
    unsigned char *msg = malloc(len);
    unsigned char mac[RT_SHA1_DIGEST_BYTES];
    if (!msg) { /* out of memory: never match rather than crash */
        hex_out[0] = '\0';
        return;
    }
    unsigned char *p = msg;
    memcpy(p, nonce, ln), p += ln, *p++ = '\0';
    memcpy(p, username, lu), p += lu, *p++ = '\0';
    memcpy(p, password, lp), p += lp, *p++ = '\0';
    memcpy(p, role, lr);
    rt_hmac_sha1(secret, strlen(secret), msg, len, mac);
    sodium_memzero(msg, len);
    free(msg);
    sodium_bin2hex(hex_out, ADMIN_MAC_HEX_CHARS + 1, mac, sizeof(mac));
}

static bool enabled(atrium_req *r)
{
    if (r->srv->cfg->registration.shared_secret[0]) return true;
    http_respond_error(r, 404, "M_UNRECOGNIZED",
                       "Shared-secret registration is off (registration.shared_secret is unset)");
    return false;
}

/* GET /_synapse/admin/v1/register */
static int get_nonce(atrium_req *r)
{
    if (!enabled(r) || ratelimit_refused(r, ratelimit_register())) return ATRIUM_DONE;
    unsigned char raw[ADMIN_NONCE_BYTES];
    char nonce[2 * ADMIN_NONCE_BYTES + 1], ttl[32];
    randombytes_buf(raw, sizeof(raw));
    sodium_bin2hex(nonce, sizeof(nonce), raw, sizeof(raw));
    snprintf(ttl, sizeof(ttl), "%d", ADMIN_NONCE_TTL_MS);
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    const char *p[2] = {nonce, ttl};
    bool ok = db_exec(c, "DELETE FROM admin_register_nonces"
                         " WHERE expires_ts < (extract(epoch from now()) * 1000)::bigint",
                      0, NULL) &&
              db_exec(c, "INSERT INTO admin_register_nonces (nonce, expires_ts) VALUES"
                         " ($1, (extract(epoch from now()) * 1000)::bigint + $2::bigint)",
                      2, p);
    http_db_checkin(c);
    if (!ok) return acc_db_failed(r);
    return http_respond_json(r, 200, json_pack("{s:s}", "nonce", nonce));
}

/* Take the nonce out of the table: 1 it was live, 0 unknown or expired, ATRIUM_E_DB. */
static int consume_nonce(atrium_req *r, const char *nonce)
{
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_E_DB;
    const char *p[1] = {nonce};
    PGresult *res = acc_q(c, "DELETE FROM admin_register_nonces WHERE nonce = $1"
                             " RETURNING expires_ts >= (extract(epoch from now()) * 1000)::bigint",
                          1, p);
    http_db_checkin(c);
    if (!res) {
        acc_db_failed(r);
        return ATRIUM_E_DB;
    }
    int live = PQntuples(res) == 1 && PQgetvalue(res, 0, 0)[0] == 't';
    PQclear(res);
    return live;
}

/* POST /_synapse/admin/v1/register */
static int post_register(atrium_req *r)
{
    if (r->run_reason == ATRIUM_RUN_HANDOFF) return acc_create_account(r, r->core_state);
    if (!enabled(r) || ratelimit_refused(r, ratelimit_register())) return ATRIUM_DONE;
    json_t *body = http_req_json(r);
    if (!body) return ATRIUM_DONE;
    const char *nonce, *username, *password, *mac, *displayname;
    bool admin;
    if (!http_field_string(r, body, "nonce", true, 0, &nonce) ||
        !http_field_string(r, body, "username", true, ACC_USER_ID_MAX_BYTES, &username) ||
        !http_field_string(r, body, "password", true, ACC_PASSWORD_MAX_BYTES, &password) ||
        !http_field_string(r, body, "mac", true, 0, &mac) ||
        !http_field_string(r, body, "displayname", false, ACC_DISPLAYNAME_MAX_BYTES, &displayname) ||
        !http_field_bool(r, body, "admin", false, &admin))
        return ATRIUM_DONE;
    int live = consume_nonce(r, nonce);
    if (live < 0) return ATRIUM_DONE;
    if (!live) return http_respond_error(r, 400, "M_UNKNOWN", "Unrecognised or expired nonce");
    char want[ADMIN_MAC_HEX_CHARS + 1];
    admin_register_mac(r->srv->cfg->registration.shared_secret, nonce, username, password, admin,
                       want);
    bool mac_ok = strlen(mac) == ADMIN_MAC_HEX_CHARS && want[0] &&
                  sodium_memcmp(want, mac, ADMIN_MAC_HEX_CHARS) == 0;
    sodium_memzero(want, sizeof(want));
    if (!mac_ok) return http_respond_error(r, 403, "M_FORBIDDEN", "HMAC incorrect");
    const char *user_id = acc_user_id_for_username(r, username);
    if (!user_id)
        return http_respond_error(r, 400, "M_INVALID_USERNAME",
                                  "A username may only hold a-z, 0-9 and . _ = - / +");
    if (!password[0])
        return http_respond_error(r, 400, "M_WEAK_PASSWORD", "The password must not be empty");
    acc_new_account *a = rt_arena_alloc(r->arena, sizeof(*a));
    if (!a) return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    *a = (acc_new_account){.user_id = user_id, .password = password,
                           .displayname = displayname, .admin = admin,
                           .with_home_server = true};
    return acc_to_auth_pool(r, a);
}

int acc_admin_register_routes(http_server *s)
{
    if (client_route(s, "GET", "/_synapse/admin/v1/register", get_nonce, 0) < 0 ||
        client_route(s, "POST", "/_synapse/admin/v1/register", post_register,
                     ACC_MAX_BODY_BYTES) < 0)
        return -1;
    return 0;
}
