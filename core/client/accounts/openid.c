/*
 * core/client/accounts/openid.c - OpenID tokens, the way widgets and calls learn who a user
 * is: POST /_matrix/client/v3/user/{userId}/openid/request_token mints one for the
 * authenticated user themself, and GET /_matrix/federation/v1/openid/userinfo?access_token=
 * tells whoever holds it (a widget's or a call's backend) which user it was minted for.
 *
 * The userinfo route has no X-Matrix signature (no ATRIUM_ROUTE_FEDERATION flag): the
 * caller is a third-party service, not a homeserver, and the OpenID token is the only
 * credential; it is served on the federation listener because its path is a federation
 * path (http_path_is_federation, core/http/server.c). Both routes live in this client
 * module, beside the table they share, so the federation layers never read it.
 *
 * Only a SHA-256 of the token is stored (openid_tokens, migration 11 in accounts.c), as for
 * access tokens (core/client/auth/auth.c). The table is bounded: minting a token deletes
 * the user's expired ones and keeps only the newest OPENID_TOKENS_PER_USER_MAX, and a
 * look-up of an expired token deletes it. What this file does not do: any OpenID Connect
 * discovery, or claims beyond "sub".
 */
#include <sodium.h>
#include <stdio.h>
#include <string.h>

#include "core/client/accounts/accounts.h"

#define OPENID_TOKEN_TTL_MS (3600 * 1000) /* expires_in is this in seconds */
#define OPENID_TOKEN_CHARS 32             /* a-z0-9: about 165 bits */
#define OPENID_TOKENS_PER_USER_MAX 10     /* older live tokens are deleted on minting */
#define OPENID_HASH_HEX_BYTES (crypto_hash_sha256_BYTES * 2 + 1)

/* The stored form of a token: lower-case hex of its SHA-256. */
static void openid_token_hash(const char *token, char out[OPENID_HASH_HEX_BYTES])
{
    unsigned char h[crypto_hash_sha256_BYTES];
    crypto_hash_sha256(h, (const unsigned char *)token, strlen(token));
    sodium_bin2hex(out, OPENID_HASH_HEX_BYTES, h, sizeof(h));
}

/* Store hash for user_id until expires_ts, dropping the user's expired tokens and all but
 * the newest OPENID_TOKENS_PER_USER_MAX, in one transaction. true on success. */
static bool openid_token_store(PGconn *c, const char *user_id, const char *hash, int64_t now_ms)
{
    char now[24], expires[24], keep[16];
    snprintf(now, sizeof(now), "%lld", (long long)now_ms);
    snprintf(expires, sizeof(expires), "%lld", (long long)(now_ms + OPENID_TOKEN_TTL_MS));
    snprintf(keep, sizeof(keep), "%d", OPENID_TOKENS_PER_USER_MAX);
    const char *ins[] = {hash, user_id, now, expires};
    const char *expired[] = {user_id, now};
    const char *prune[] = {user_id, keep};
    bool ok = db_begin(c) &&
              db_exec(c, "DELETE FROM openid_tokens WHERE user_id = $1 AND expires_ts <= $2", 2,
                      expired) &&
              db_exec(c, "INSERT INTO openid_tokens (token_hash, user_id, created_ts, expires_ts)"
                         " VALUES ($1, $2, $3, $4)", 4, ins) &&
              db_exec(c, "DELETE FROM openid_tokens WHERE user_id = $1 AND id < ALL"
                         " (SELECT id FROM openid_tokens WHERE user_id = $1"
                         "  ORDER BY id DESC LIMIT $2::int)", 2, prune) &&
              db_commit(c);
    if (!ok) db_rollback(c);
    return ok;
}

/* POST /_matrix/client/v3/user/{userId}/openid/request_token (body {}) */
static int request_token(atrium_req *r)
{
    if (!auth_request(r)) return ATRIUM_DONE;
    const char *user_id = http_req_param(r, "userId");
    if (!user_id || strcmp(user_id, r->user) != 0)
        return http_respond_error(r, 403, "M_FORBIDDEN",
                                  "An OpenID token can only be requested for yourself");
    char token[OPENID_TOKEN_CHARS + 1], hash[OPENID_HASH_HEX_BYTES];
    acc_random_chars(token, OPENID_TOKEN_CHARS);
    openid_token_hash(token, hash);
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    bool ok = openid_token_store(c, r->user, hash, rt_wall_ms());
    http_db_checkin(c);
    if (!ok) return acc_db_failed(r);
    return http_respond_json(r, 200, json_pack("{s:s,s:s,s:s,s:I}", "access_token", token,
                                               "token_type", "Bearer", "matrix_server_name",
                                               r->srv->cfg->server_name, "expires_in",
                                               (json_int_t)(OPENID_TOKEN_TTL_MS / 1000)));
}

/* GET /_matrix/federation/v1/openid/userinfo?access_token=... (no X-Matrix: the token is
 * the credential). 401 M_UNKNOWN_TOKEN for an unknown or expired token, or one of a
 * deactivated user; 400 M_MISSING_PARAM without one (as Synapse). */
static int get_userinfo(atrium_req *r)
{
    const char *token = http_req_query(r, "access_token");
    if (!token || !*token)
        return http_respond_error(r, 400, "M_MISSING_PARAM", "access_token is required");
    char hash[OPENID_HASH_HEX_BYTES], now[24];
    openid_token_hash(token, hash);
    snprintf(now, sizeof(now), "%lld", (long long)rt_wall_ms());
    const char *params[] = {hash, now};
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    PGresult *res = acc_q(c, "SELECT t.user_id, t.expires_ts > $2::bigint FROM openid_tokens t"
                             " JOIN users u ON u.user_id = t.user_id"
                             " WHERE t.token_hash = $1 AND NOT u.deactivated", 2, params);
    if (!res) {
        http_db_checkin(c);
        return acc_db_failed(r);
    }
    bool found = PQntuples(res) == 1;
    bool live = found && strcmp(PQgetvalue(res, 0, 1), "t") == 0;
    json_t *body = live ? json_pack("{s:s}", "sub", PQgetvalue(res, 0, 0)) : NULL;
    PQclear(res);
    /* An expired token is of no further use: forget it now (a failure only logs). */
    if (found && !live &&
        !db_exec(c, "DELETE FROM openid_tokens WHERE token_hash = $1", 1, params))
        rt_log(ATRIUM_LOG_WARN, "accounts", "could not delete an expired OpenID token; the "
               "next request for a token by its user deletes it");
    http_db_checkin(c);
    if (!live)
        return http_respond_error(r, 401, "M_UNKNOWN_TOKEN",
                                  "The OpenID token is not recognised or has expired");
    if (!body) return ATRIUM_E_NOMEM;
    return http_respond_json(r, 200, body);
}

int acc_openid_routes(http_server *s)
{
    /* Not ATRIUM_ROUTE_FEDERATION: no X-Matrix signature is asked for (see the top). */
    static const atrium_route userinfo = {.method = "GET",
                                          .path = "/_matrix/federation/v1/openid/userinfo",
                                          .handler = get_userinfo};
    char err[256];
    if (router_add(s->router, &userinfo, "core", err, sizeof(err)) < 0) {
        rt_log(ATRIUM_LOG_ERROR, "accounts", "%s", err);
        return -1;
    }
    return client_route(s, "POST", "/_matrix/client/v3/user/{userId}/openid/request_token",
                        request_token, ACC_MAX_BODY_BYTES);
}
