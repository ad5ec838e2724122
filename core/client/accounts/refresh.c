/*
 * core/client/accounts/refresh.c - refresh tokens: a login or registration that sends
 * `refresh_token: true` gets an access token that expires after
 * auth.refreshable_access_token_lifetime_ms and a refresh token, and POST
 * /_matrix/client/v3/refresh trades a refresh token for a new pair.
 *
 * The spec's rule for the old pair is what the tables encode (migration 12 in accounts.c):
 * the old refresh token and the old access token keep working until the new access token
 * is used or the new refresh token is refreshed in turn; then both old ones are deleted
 * (auth_retire_refresh, core/client/auth/auth.c, run by auth_request on the new access
 * token's first use and here). So a refresh whose answer was lost can be retried with the
 * same refresh token (the unused pair it made before is dropped), and a refresh token
 * whose successor was used is unknown: 401 M_UNKNOWN_TOKEN. Each device holds at most one
 * pair and one unused successor, so the tables are bounded by the devices. Only SHA-256
 * hashes of both tokens are stored. What this file does not do: make refresh tokens expire
 * (as Synapse by default, they live as long as their device).
 */
#include <stdio.h>
#include <string.h>

#include "core/client/accounts/accounts.h"

#define REFRESH_TOKEN_MAX_BYTES 256

/* Store the refresh token `refresh` paired with the access token whose hash is access_hash,
 * replacing the refresh token whose hash is retires (NULL: none). */
static bool store_refresh(PGconn *c, const char *user_id, const char *device_id,
                          const char *refresh, const char *access_hash, const char *retires)
{
    char hash[65];
    auth_token_hash(refresh, hash);
    const char *p[5] = {hash, user_id, device_id, access_hash, retires};
    return db_exec(c, "INSERT INTO refresh_tokens (token_hash, user_id, device_id, access_hash,"
                      " retires, created_ts) VALUES ($1, $2, $3, $4, $5,"
                      " (extract(epoch from now()) * 1000)::bigint)", 5, p);
}

int acc_session_refreshable(PGconn *c, const char *user_id, const char *device_id,
                            int64_t lifetime_ms, const char *access_token, char *refresh_out)
{
    char access_hash[65], lifetime[24];
    auth_token_hash(access_token, access_hash);
    snprintf(lifetime, sizeof(lifetime), "%lld", (long long)lifetime_ms);
    const char *p[3] = {access_hash, lifetime, user_id};
    auth_mint_refresh_token(refresh_out);
    bool ok = db_exec(c, "UPDATE access_tokens SET expires_ts ="
                         " (extract(epoch from now()) * 1000)::bigint + $2::bigint"
                         " WHERE token_hash = $1 AND user_id = $3", 3, p) &&
              store_refresh(c, user_id, device_id, refresh_out, access_hash, NULL);
    return ok ? 0 : ATRIUM_E_DB;
}

/* The pair a refresh answers with, or the reason it does not. */
typedef struct refresh_result {
    char access[AUTH_TOKEN_CHARS + 1];
    char refresh[AUTH_TOKEN_CHARS + 1];
    const char *user_id;
} refresh_result;

/* Inside the caller's transaction: trade the refresh token whose hash is `hash` for a new
 * pair. 1 done, 0 unknown token, ATRIUM_E_DB. */
static int trade(atrium_req *r, PGconn *c, const char *hash, int64_t lifetime_ms,
                 refresh_result *out)
{
    const char *p[1] = {hash};
    PGresult *res = acc_q(c, "SELECT t.user_id, t.device_id, t.retires, t.access_hash"
                             " FROM refresh_tokens t JOIN users u ON u.user_id = t.user_id"
                             " WHERE t.token_hash = $1 AND NOT u.deactivated FOR UPDATE OF t",
                          1, p);
    if (!res) return ATRIUM_E_DB;
    if (PQntuples(res) != 1) {
        PQclear(res);
        return 0;
    }
    const char *user_id = rt_arena_strdup(r->arena, PQgetvalue(res, 0, 0));
    const char *device_id = rt_arena_strdup(r->arena, PQgetvalue(res, 0, 1));
    const char *retires = PQgetisnull(res, 0, 2) ? NULL
                                                 : rt_arena_strdup(r->arena, PQgetvalue(res, 0, 2));
    const char *access_hash = rt_arena_strdup(r->arena, PQgetvalue(res, 0, 3));
    PQclear(res);
    if (!user_id || !device_id || !access_hash) return ATRIUM_E_DB;
    out->user_id = user_id;
    /* This token is used: the one it replaced is done with. */
    if (retires && !auth_retire_refresh(c, retires, access_hash)) return ATRIUM_E_DB;
    /* A retried refresh: the pair made before and never used is dropped. */
    if (!db_exec(c, "WITH s AS (DELETE FROM refresh_tokens WHERE retires = $1"
                    "  RETURNING access_hash)"
                    " DELETE FROM access_tokens WHERE token_hash IN (SELECT access_hash FROM s)",
                 1, p))
        return ATRIUM_E_DB;
    char new_access_hash[65];
    if (auth_issue_token_ex(c, user_id, device_id, lifetime_ms, hash, out->access) < 0)
        return ATRIUM_E_DB;
    auth_token_hash(out->access, new_access_hash);
    auth_mint_refresh_token(out->refresh);
    if (!store_refresh(c, user_id, device_id, out->refresh, new_access_hash, hash))
        return ATRIUM_E_DB;
    return 1;
}

/* POST /_matrix/client/v3/refresh {refresh_token} (no access token: it may have expired) */
static int post_refresh(atrium_req *r)
{
    json_t *body = http_req_json(r);
    if (!body) return ATRIUM_DONE;
    const char *refresh;
    if (!http_field_string(r, body, "refresh_token", true, REFRESH_TOKEN_MAX_BYTES, &refresh))
        return ATRIUM_DONE;
    char hash[65];
    auth_token_hash(refresh, hash);
    int64_t lifetime_ms = r->srv->cfg->auth.refreshable_access_token_lifetime_ms;
    refresh_result *out = rt_arena_alloc(r->arena, sizeof(*out));
    if (!out) return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    int rc = db_begin(c) ? trade(r, c, hash, lifetime_ms, out) : ATRIUM_E_DB;
    if (rc == 1 && !db_commit(c)) rc = ATRIUM_E_DB;
    if (rc != 1) db_rollback(c);
    http_db_checkin(c);
    if (rc < 0) return acc_db_failed(r);
    if (rc == 0)
        return http_respond_json(r, 401, json_pack("{s:s, s:s, s:b}", "errcode",
                                                   "M_UNKNOWN_TOKEN", "error",
                                                   "Unknown or already used refresh token",
                                                   "soft_logout", 0));
    auth_cache_forget_user(out->user_id); /* an access token the trade deleted may be cached */
    return http_respond_json(r, 200, json_pack("{s:s, s:s, s:I}", "access_token", out->access,
                                               "refresh_token", out->refresh, "expires_in_ms",
                                               (json_int_t)lifetime_ms));
}

int acc_refresh_routes(http_server *s)
{
    return client_route(s, "POST", "/_matrix/client/v3/refresh", post_refresh,
                        ACC_MAX_BODY_BYTES);
}
