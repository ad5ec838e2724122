/*
 * core/client/accounts/login_token.c - signing in a second device from a signed-in one:
 * POST /_matrix/client/v1/login/get_token gives the authenticated user a short-lived,
 * single-use token, and POST /login with type m.login.token (login.c) trades it for a new
 * session on the other device.
 *
 * Served only with auth.login_via_existing_session (off by default, as in Synapse): a
 * stolen access token must not be enough to sign in elsewhere, so the request also needs
 * user-interactive auth with the account's password, every time (uia.c). A token lives
 * auth.login_token_lifetime_ms. Only its SHA-256 is stored (login_tokens, migration 13 in
 * accounts.c); minting one deletes the user's expired tokens and all but the newest
 * LOGIN_TOKENS_PER_USER_MAX, and using one deletes it, so the table stays small. What
 * this file does not do: the session the token buys (login.c opens it).
 */
#include <stdio.h>
#include <string.h>

#include "core/client/accounts/accounts.h"

#define LOGIN_TOKEN_CHARS 32          /* a-z0-9: about 165 bits */
#define LOGIN_TOKENS_PER_USER_MAX 10  /* older live tokens are deleted on minting */
#define GET_TOKEN_PURPOSE "get_login_token"

bool acc_login_token_enabled(atrium_req *r)
{
    return r->srv->cfg->auth.login_via_existing_session;
}

/* Store the hash of a new token of user_id, pruning as the top says; true on success. */
static bool store_token(PGconn *c, const char *user_id, const char *hash, int lifetime_ms)
{
    char lifetime[24], keep[16];
    snprintf(lifetime, sizeof(lifetime), "%d", lifetime_ms);
    snprintf(keep, sizeof(keep), "%d", LOGIN_TOKENS_PER_USER_MAX);
    const char *ins[3] = {hash, user_id, lifetime};
    const char *prune[2] = {user_id, keep};
    bool ok = db_begin(c) &&
              db_exec(c, "DELETE FROM login_tokens WHERE user_id = $1"
                         " AND expires_ts <= (extract(epoch from now()) * 1000)::bigint",
                      1, prune) &&
              db_exec(c, "INSERT INTO login_tokens (token_hash, user_id, expires_ts) VALUES"
                         " ($1, $2, (extract(epoch from now()) * 1000)::bigint + $3::bigint)",
                      3, ins) &&
              db_exec(c, "DELETE FROM login_tokens WHERE user_id = $1 AND id < ALL"
                         " (SELECT id FROM login_tokens WHERE user_id = $1"
                         "  ORDER BY id DESC LIMIT $2::int)", 2, prune) &&
              db_commit(c);
    if (!ok) db_rollback(c);
    return ok;
}

int acc_login_token_take(atrium_req *r, PGconn *c, const char *token, const char **user_id)
{
    *user_id = NULL;
    char hash[65];
    auth_token_hash(token, hash);
    const char *p[1] = {hash};
    /* Deleted whether live or not: a used or expired token is of no further use. */
    PGresult *res = acc_q(c, "WITH t AS (DELETE FROM login_tokens WHERE token_hash = $1"
                             "  RETURNING user_id, expires_ts)"
                             " SELECT t.user_id FROM t JOIN users u ON u.user_id = t.user_id"
                             " WHERE NOT u.deactivated"
                             " AND t.expires_ts > (extract(epoch from now()) * 1000)::bigint",
                          1, p);
    if (!res) return ATRIUM_E_DB;
    if (PQntuples(res) == 1) *user_id = rt_arena_strdup(r->arena, PQgetvalue(res, 0, 0));
    PQclear(res);
    return *user_id ? 1 : 0;
}

typedef struct get_token_state {
    uia_password auth;
} get_token_state;

/* [auth pool] The password was given: check it, then mint. */
static int finish_get_token(atrium_req *r, get_token_state *st)
{
    if (!uia_password_verify(r, &st->auth, GET_TOKEN_PURPOSE)) return ATRIUM_DONE;
    int lifetime_ms = r->srv->cfg->auth.login_token_lifetime_ms;
    char token[LOGIN_TOKEN_CHARS + 1], hash[65];
    acc_random_chars(token, LOGIN_TOKEN_CHARS);
    auth_token_hash(token, hash);
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    bool ok = store_token(c, r->user, hash, lifetime_ms);
    if (ok) uia_forget(c, st->auth.session);
    http_db_checkin(c);
    if (!ok) return acc_db_failed(r);
    return http_respond_json(r, 200, json_pack("{s:s, s:i}", "login_token", token,
                                               "expires_in_ms", lifetime_ms));
}

/* POST /_matrix/client/v1/login/get_token {auth} */
static int post_get_token(atrium_req *r)
{
    if (r->run_reason == ATRIUM_RUN_HANDOFF) return finish_get_token(r, r->core_state);
    if (!auth_request(r)) return ATRIUM_DONE;
    if (!acc_login_token_enabled(r)) /* as a server without the endpoint answers */
        return http_respond_error(r, 404, "M_UNRECOGNIZED",
                                  "Signing in with an existing session is not enabled");
    json_t *body = uia_body(r);
    if (!body) return ATRIUM_DONE;
    get_token_state *st = rt_arena_alloc(r->arena, sizeof(*st));
    if (!st) return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    if (!uia_password_begin(r, body, GET_TOKEN_PURPOSE, &st->auth)) return ATRIUM_DONE;
    return acc_to_auth_pool(r, st);
}

int acc_login_token_routes(http_server *s)
{
    return client_route(s, "POST", "/_matrix/client/v1/login/get_token", post_get_token,
                        ACC_MAX_BODY_BYTES);
}
