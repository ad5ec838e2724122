/*
 * core/client/accounts/account_util.c - the helpers every account file uses (see accounts.h):
 * typed body fields with the spec's error codes, the localpart grammar, short database
 * calls, and the two places that create rows for a person: a new account
 * (acc_create_account) and a login session on a device (acc_open_session).
 *
 * The localpart rule lives in acc_localpart_ok alone: registration, admin registration,
 * availability checks and login all call it. It does not route requests or decide any
 * endpoint's answer beyond the shared error shapes.
 */
#include <ctype.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>

#include "core/client/accounts/accounts.h"
#include "core/client/e2ee/e2ee.h"

/* ---- request bodies ---------------------------------------------------------------------- */

bool acc_user_identifier(atrium_req *r, json_t *obj, const char **user)
{
    json_t *ident;
    *user = NULL;
    if (!http_field_object(r, obj, "identifier", false, &ident)) return false;
    if (!ident) return http_field_string(r, obj, "user", false, ACC_USER_ID_MAX_BYTES, user);
    const char *itype;
    if (!http_field_string(r, ident, "type", true, 0, &itype)) return false;
    if (strcmp(itype, "m.id.user") != 0) {
        http_respond_error(r, 400, "M_UNKNOWN", "Only m.id.user identifiers are supported");
        return false;
    }
    return http_field_string(r, ident, "user", true, ACC_USER_ID_MAX_BYTES, user);
}

/* ---- user IDs ---------------------------------------------------------------------------- */

static bool localpart_char_ok(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || strchr("._=-/+", c) != NULL;
}

bool acc_localpart_ok(const struct core_config *cfg, const char *lp)
{
    size_t len = strlen(lp);
    /* "@" + localpart + ":" + server name */
    if (len == 0 || 2 + len + strlen(cfg->server_name) > ACC_USER_ID_MAX_BYTES) return false;
    for (const char *c = lp; *c; c++)
        if (!localpart_char_ok(*c)) return false;
    return true;
}

char *acc_user_id(atrium_req *r, const char *localpart)
{
    return rt_arena_printf(r->arena, "@%s:%s", localpart, r->srv->cfg->server_name);
}

const char *acc_user_id_for_username(atrium_req *r, const char *username)
{
    char *folded = rt_arena_strdup(r->arena, username);
    if (!folded) return NULL;
    for (char *c = folded; *c; c++) *c = (char)tolower((unsigned char)*c);
    return acc_localpart_ok(r->srv->cfg, folded) ? acc_user_id(r, folded) : NULL;
}

const char *acc_local_user(atrium_req *r, const char *user)
{
    if (user[0] != '@') return acc_user_id_for_username(r, user);
    const char *colon = strchr(user, ':');
    if (!colon || strcmp(colon + 1, r->srv->cfg->server_name) != 0) return NULL;
    char *lp = rt_arena_strndup(r->arena, user + 1, (size_t)(colon - user - 1));
    return lp ? acc_user_id_for_username(r, lp) : NULL;
}

const char *acc_localpart_of(atrium_req *r, const char *user_id)
{
    const char *colon = user_id[0] == '@' ? strchr(user_id, ':') : NULL;
    if (!colon || strcmp(colon + 1, r->srv->cfg->server_name) != 0) return NULL;
    return rt_arena_strndup(r->arena, user_id + 1, (size_t)(colon - user_id - 1));
}

void acc_random_chars(char *out, size_t n)
{
    static const char alphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
    for (size_t i = 0; i < n; i++)
        out[i] = alphabet[randombytes_uniform((uint32_t)(sizeof(alphabet) - 1))];
    out[n] = '\0';
}

void acc_random_device_id(char out[ACC_RANDOM_ID_CHARS + 1])
{
    acc_random_chars(out, ACC_RANDOM_ID_CHARS);
    for (char *d = out; *d; d++) *d = (char)toupper((unsigned char)*d);
}

/* ---- database ---------------------------------------------------------------------------- */

PGresult *acc_q(PGconn *c, const char *sql, int n, const char *const *params)
{
    PGresult *res = db_query(c, sql, n, params);
    ExecStatusType st = PQresultStatus(res);
    if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK) return res;
    rt_log(ATRIUM_LOG_ERROR, "core", "accounts query failed: %s", PQresultErrorMessage(res));
    PQclear(res);
    return NULL;
}

int acc_db_failed(atrium_req *r)
{
    http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    return ATRIUM_DONE;
}

int acc_user_exists(PGconn *c, const char *user_id)
{
    const char *p[1] = {user_id};
    PGresult *res = acc_q(c, "SELECT 1 FROM users WHERE user_id = $1", 1, p);
    if (!res) return ATRIUM_E_DB;
    int n = PQntuples(res);
    PQclear(res);
    return n > 0;
}

/* ---- accounts and login sessions -------------------------------------------------------- */

int acc_open_session(PGconn *c, const char *user_id, const char *device_id, const char *name,
                     const char *ip, const char *user_agent, char *token_out)
{
    const char *p[5] = {user_id, device_id, name, ip, user_agent};
    /* A re-used device ID keeps the device (and its keys) but not its old tokens. */
    if (!db_exec(c,
                 "INSERT INTO devices (user_id, device_id, display_name, last_seen_ts,"
                 " last_seen_ip, last_seen_user_agent)"
                 " VALUES ($1, $2, $3, (extract(epoch from now()) * 1000)::bigint, $4, $5)"
                 " ON CONFLICT (user_id, device_id) DO UPDATE SET"
                 " display_name = COALESCE($3, devices.display_name),"
                 " last_seen_ts = EXCLUDED.last_seen_ts, last_seen_ip = $4,"
                 " last_seen_user_agent = $5",
                 5, p) ||
        !db_exec(c, "DELETE FROM access_tokens WHERE user_id = $1 AND device_id = $2", 2, p) ||
        !db_exec(c, "DELETE FROM refresh_tokens WHERE user_id = $1 AND device_id = $2", 2, p))
        return ATRIUM_E_DB;
    /* A new device is a device-list change (recorded by a trigger, e2ee.c): a woken sync
     * reads the stream only once this transaction committed. */
    e2ee_wake_key_change(c, user_id);
    return auth_issue_token(c, user_id, device_id, token_out);
}

void acc_tokens_revoked(PGconn *c, const char *user_id)
{
    auth_cache_forget_user(user_id);
    e2ee_wake_key_change(c, user_id);
}

bool acc_delete_devices(PGconn *c, const char *user_id, const char *const *device_ids,
                        size_t n, const char *keep_device)
{
    const char *keep = keep_device ? keep_device : "";
    if (!device_ids) {
        const char *p[2] = {user_id, keep};
        return db_exec(c, "DELETE FROM access_tokens WHERE user_id = $1 AND device_id <> $2",
                       2, p) &&
               db_exec(c, "DELETE FROM devices WHERE user_id = $1 AND device_id <> $2", 2, p);
    }
    for (size_t i = 0; i < n; i++) {
        if (strcmp(device_ids[i], keep) == 0) continue;
        const char *p[2] = {user_id, device_ids[i]};
        if (!db_exec(c, "DELETE FROM access_tokens WHERE user_id = $1 AND device_id = $2", 2,
                     p) ||
            !db_exec(c, "DELETE FROM devices WHERE user_id = $1 AND device_id = $2", 2, p))
            return false;
    }
    return true;
}

/* Insert the user and its profile; 1 created, 0 taken, ATRIUM_E_DB. Inside a transaction. */
static int insert_user(PGconn *c, const acc_new_account *a, const char *hash,
                       const char *displayname)
{
    const char *p[4] = {a->user_id, hash, a->admin ? "t" : "f", a->guest ? "t" : "f"};
    PGresult *res = acc_q(c,
                          "INSERT INTO users (user_id, password_hash, is_admin, is_guest,"
                          " created_ts) VALUES ($1, $2, $3, $4,"
                          " (extract(epoch from now()) * 1000)::bigint)"
                          " ON CONFLICT (user_id) DO NOTHING",
                          4, p);
    if (!res) return ATRIUM_E_DB;
    bool created = strcmp(PQcmdTuples(res), "1") == 0;
    PQclear(res);
    if (!created) return 0;
    const char *pp[2] = {a->user_id, displayname};
    return db_exec(c, "INSERT INTO profiles (user_id, displayname) VALUES ($1, $2)", 2, pp)
               ? 1
               : ATRIUM_E_DB;
}

int acc_create_account(atrium_req *r, const acc_new_account *a)
{
    RT_ASSERT(rt_pool_on_worker(auth_pool()), "%s", "password hashing off the auth pool");
    char hash[crypto_pwhash_STRBYTES] = "";
    if (a->password_hash) snprintf(hash, sizeof(hash), "%s", a->password_hash);
    else if (a->password && auth_hash_password(a->password, hash) < 0) {
        rt_log(ATRIUM_LOG_ERROR, "core", "hashing a password failed (out of memory?)");
        http_respond_error(r, 503, "M_UNKNOWN", "The server is busy; retry");
        return ATRIUM_DONE;
    }
    char device[ACC_RANDOM_ID_CHARS + 1];
    const char *device_id = a->device_id;
    if (!device_id) {
        acc_random_device_id(device);
        device_id = device;
    }
    const char *displayname = a->displayname ? a->displayname : acc_localpart_of(r, a->user_id);
    char token[AUTH_TOKEN_CHARS + 1] = "", refresh[AUTH_TOKEN_CHARS + 1] = "";
    int64_t lifetime_ms = r->srv->cfg->auth.refreshable_access_token_lifetime_ms;
    bool refreshable = a->refresh && !a->inhibit_login;
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    int created = ATRIUM_E_DB;
    if (db_begin(c)) {
        created = insert_user(c, a, hash[0] ? hash : NULL, displayname);
        if (created == 1 && !a->inhibit_login &&
            acc_open_session(c, a->user_id, device_id, a->device_name, r->client_addr,
                             auth_user_agent(r), token) < 0)
            created = ATRIUM_E_DB;
        if (created == 1 && refreshable &&
            acc_session_refreshable(c, a->user_id, device_id, lifetime_ms, token, refresh) < 0)
            created = ATRIUM_E_DB;
        if (created == 1 && (!uia_registered(c, a->uia_session, a->user_id) ||
                             (a->registration_token &&
                              !acc_registration_tokens_complete(c, a->registration_token))))
            created = ATRIUM_E_DB;
        if (created == 1 && !db_commit(c)) created = ATRIUM_E_DB;
        if (created != 1) db_rollback(c);
    }
    http_db_checkin(c);
    sodium_memzero(hash, sizeof(hash));
    if (created == 0) {
        http_respond_error(r, 400, "M_USER_IN_USE", "That user ID is already taken");
        return ATRIUM_DONE;
    }
    if (created < 0) return acc_db_failed(r);
    rt_log(ATRIUM_LOG_INFO, "core", "registered %s%s", a->user_id,
           a->admin ? " (admin)" : a->guest ? " (guest)" : "");
    json_t *body = json_pack("{s:s}", "user_id", a->user_id);
    if (body && !a->inhibit_login) {
        json_object_set_new(body, "access_token", json_string(token));
        json_object_set_new(body, "device_id", json_string(device_id));
    }
    if (body && refreshable) {
        json_object_set_new(body, "refresh_token", json_string(refresh));
        json_object_set_new(body, "expires_in_ms", json_integer(lifetime_ms));
    }
    if (body && a->with_home_server)
        json_object_set_new(body, "home_server", json_string(r->srv->cfg->server_name));
    sodium_memzero(token, sizeof(token));
    sodium_memzero(refresh, sizeof(refresh));
    if (!body) return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    http_respond_json(r, 200, body);
    return ATRIUM_DONE;
}

int acc_to_auth_pool(atrium_req *r, void *state)
{
    rt_pool *pool = auth_pool();
    if (!pool) {
        http_respond_error(r, 503, "M_UNKNOWN", "Password checks are not available");
        return ATRIUM_DONE;
    }
    r->core_state = state;
    int rc = susp_handoff(r, pool, NULL, 0);
    if (rc == 0) return ATRIUM_HANDED_OFF;
    if (rc == ATRIUM_E_LIMIT) {
        http_respond_limited(r, 1000, "Too many password checks in progress; retry");
        return ATRIUM_DONE;
    }
    http_respond_error(r, 503, "M_UNKNOWN", "The server is stopping");
    return ATRIUM_DONE;
}
