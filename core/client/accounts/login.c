/*
 * core/client/accounts/login.c - logging in and out: GET/POST /_matrix/client/v3/login (password
 * login, m.login.token with a token from login_token.c), POST /logout and /logout/all, and
 * GET /account/whoami. A login that sends refresh_token: true gets an expiring access token
 * and a refresh token (refresh.c).
 *
 * Login checks the password on the auth pool and answers a wrong password and an unknown
 * user identically (403 M_FORBIDDEN, same work done: auth_verify_password), so a login
 * form cannot be used to find out who has an account; a deactivated account (whose name
 * stays taken anyway) gets 403 M_USER_DEACTIVATED whatever the password. A login names
 * its device or gets a new one; re-using a device ID revokes that device's older tokens.
 * Logout deletes the device and its tokens in PostgreSQL, so the token stops working at
 * once in every process (auth_request reads the table on every request). An application
 * service logs in a user of its namespaces with m.login.application_service and its
 * as_token, without a password (core/client/appservice/appservice.h). What this file
 * does not do: tokens' format and look-up (auth.c), device management (devices.c).
 */
#include <string.h>

#include "core/client/accounts/accounts.h"
#include "core/client/appservice/appservice.h"
#include "core/client/ratelimits.h"

#define LOGIN_TOKEN_TYPE "m.login.token"

typedef struct login_state {
    const char *user_id; /* NULL: cannot be a local user (checked against a dummy hash) */
    const char *password;
    const char *device_id;
    const char *device_name;
    bool refresh; /* refresh_token: true (refresh.c) */
} login_state;

/* GET /_matrix/client/v3/login: the password flow, m.login.token with get_login_token
 * when signing in from an existing session is on (login_token.c), and
 * m.login.application_service when application services are registered. */
static int get_login(atrium_req *r)
{
    json_t *flows = json_pack("[{s:s}]", "type", "m.login.password");
    if (flows && acc_login_token_enabled(r))
        json_array_append_new(flows, json_pack("{s:s, s:b}", "type", LOGIN_TOKEN_TYPE,
                                               "get_login_token", 1));
    if (flows && as_count()) /* only where a service may use it */
        json_array_append_new(flows, json_pack("{s:s}", "type", AS_LOGIN_TYPE));
    return http_respond_json(r, 200, json_pack("{s:o}", "flows", flows));
}

static int open_login_session(atrium_req *r, const login_state *st);

/* [auth pool] The second half: check the password, then open the session. */
static int finish_login(atrium_req *r, const login_state *st)
{
    char *hash = NULL;
    bool deactivated = false;
    if (st->user_id) {
        PGconn *c = http_db_checkout(r);
        if (!c) return ATRIUM_DONE;
        const char *p[1] = {st->user_id};
        PGresult *res = acc_q(c, "SELECT password_hash, deactivated FROM users WHERE user_id = $1",
                              1, p);
        if (res && PQntuples(res) == 1) {
            if (!PQgetisnull(res, 0, 0)) hash = rt_arena_strdup(r->arena, PQgetvalue(res, 0, 0));
            deactivated = PQgetvalue(res, 0, 1)[0] == 't';
        }
        PQclear(res);
        http_db_checkin(c); /* never held across the slow check */
        if (!res) return acc_db_failed(r);
    }
    bool password_ok = auth_verify_password(hash, st->password);
    /* A deactivated account has no password left (deactivate.c): whatever the
     * password, the answer says why, as Synapse's does. */
    if (deactivated && (password_ok || !hash))
        return http_respond_error(r, 403, "M_USER_DEACTIVATED", "This account is deactivated");
    if (!password_ok)
        return http_respond_error(r, 403, "M_FORBIDDEN", "Invalid username or password");
    return open_login_session(r, st);
}

/* The login was accepted: a device (st->device_id, or a new one) and a token for
 * st->user_id. */
static int open_login_session(atrium_req *r, const login_state *st)
{
    char device[ACC_RANDOM_ID_CHARS + 1];
    const char *device_id = st->device_id;
    if (!device_id) {
        acc_random_device_id(device);
        device_id = device;
    }
    char token[AUTH_TOKEN_CHARS + 1];
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    bool ok = db_begin(c);
    ok = ok && acc_open_session(c, st->user_id, device_id, st->device_name, r->client_addr,
                                auth_user_agent(r), token) == 0;
    char refresh[AUTH_TOKEN_CHARS + 1];
    int64_t lifetime_ms = r->srv->cfg->auth.refreshable_access_token_lifetime_ms;
    ok = ok && (!st->refresh || acc_session_refreshable(c, st->user_id, device_id, lifetime_ms,
                                                        token, refresh) == 0);
    ok = ok && db_commit(c);
    if (!ok) db_rollback(c);
    else auth_cache_forget_user(st->user_id); /* a re-used device ID lost its old tokens */
    int rc = ATRIUM_DONE;
    if (ok) {
        json_t *body = json_pack("{s:s, s:s, s:s, s:s}", "user_id", st->user_id,
                                 "access_token", token, "device_id", device_id, "home_server",
                                 r->srv->cfg->server_name);
        if (body && st->refresh) {
            json_object_set_new(body, "refresh_token", json_string(refresh));
            json_object_set_new(body, "expires_in_ms", json_integer(lifetime_ms));
        }
        /* A re-used device's old tokens are gone everywhere before the answer. */
        rc = st->device_id ? auth_revoke_answer(r, c, st->user_id, 200, body)
                           : http_respond_json(r, 200, body);
    }
    http_db_checkin(c);
    if (!ok) return acc_db_failed(r);
    return rc;
}

/* Who is logging in (acc_user_identifier); third-party identifiers are refused. *user is
 * NULL after answering 400. */
static bool login_user(atrium_req *r, json_t *body, const char **user)
{
    if (!acc_user_identifier(r, body, user)) return false;
    if (*user) return true;
    const char *medium;
    if (!http_field_string(r, body, "medium", false, 0, &medium)) return false;
    if (medium)
        http_respond_error(r, 400, "M_UNKNOWN", "Third-party identifiers are not supported");
    else
        http_respond_error(r, 400, "M_MISSING_PARAM", "Missing 'identifier'");
    return false;
}

/* POST /login {type: m.login.application_service, identifier} with an as_token: a user of
 * the service's namespaces that exists, logged in without a password. */
static int login_appservice(atrium_req *r, json_t *body)
{
    const as_service *svc = as_of_request(r);
    if (!svc)
        return http_respond_error(r, 401, auth_token_of(r) ? "M_UNKNOWN_TOKEN" : "M_MISSING_TOKEN",
                                  "m.login.application_service needs an application "
                                  "service's as_token");
    const char *user, *device_id, *device_name;
    if (!login_user(r, body, &user) ||
        !http_field_string(r, body, "device_id", false, ACC_DEVICE_ID_MAX_BYTES, &device_id) ||
        !http_field_string(r, body, "initial_device_display_name", false,
                           ACC_DEVICE_NAME_MAX_BYTES, &device_name))
        return ATRIUM_DONE;
    if (device_id && !device_id[0])
        return http_respond_error(r, 400, "M_INVALID_PARAM", "device_id must not be empty");
    const char *user_id = acc_local_user(r, user);
    if (!user_id || !as_user_in(svc, user_id))
        return http_respond_error(r, 403, "M_FORBIDDEN", "The user is not in the application "
                                  "service's namespaces");
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    int exists = acc_user_exists(c, user_id);
    http_db_checkin(c);
    if (exists < 0) return acc_db_failed(r);
    if (!exists) return http_respond_error(r, 403, "M_FORBIDDEN", "No such user");
    login_state *st = rt_arena_alloc(r->arena, sizeof(*st));
    if (!st) return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    *st = (login_state){.user_id = user_id, .device_id = device_id, .device_name = device_name};
    return open_login_session(r, st);
}

/* The fields every login type shares: device_id, initial_device_display_name and
 * refresh_token, into st. false after answering 400. */
static bool login_device(atrium_req *r, json_t *body, login_state *st)
{
    if (!http_field_string(r, body, "device_id", false, ACC_DEVICE_ID_MAX_BYTES, &st->device_id) ||
        !http_field_string(r, body, "initial_device_display_name", false,
                           ACC_DEVICE_NAME_MAX_BYTES, &st->device_name) ||
        !http_field_bool(r, body, "refresh_token", false, &st->refresh))
        return false;
    if (st->device_id && !st->device_id[0]) {
        http_respond_error(r, 400, "M_INVALID_PARAM", "device_id must not be empty");
        return false;
    }
    return true;
}

/* POST /login {type: m.login.token, token}: a token from POST /login/get_token, used once. */
static int login_with_token(atrium_req *r, json_t *body)
{
    if (!acc_login_token_enabled(r))
        return http_respond_error(r, 400, "M_UNKNOWN", "m.login.token is not offered here");
    login_state *st = rt_arena_alloc(r->arena, sizeof(*st));
    if (!st) return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    *st = (login_state){0};
    const char *token;
    if (!http_field_string(r, body, "token", true, ACC_PASSWORD_MAX_BYTES, &token) ||
        !login_device(r, body, st))
        return ATRIUM_DONE;
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    int taken = acc_login_token_take(r, c, token, &st->user_id);
    http_db_checkin(c);
    if (taken < 0) return acc_db_failed(r);
    if (!taken)
        return http_respond_error(r, 403, "M_FORBIDDEN", "Invalid, used or expired login token");
    return open_login_session(r, st);
}

/* POST /_matrix/client/v3/login */
static int post_login(atrium_req *r)
{
    int rerun_rc;
    if (auth_revoke_rerun(r, &rerun_rc)) return rerun_rc; /* after a revocation's wait */
    if (r->run_reason == ATRIUM_RUN_HANDOFF) return finish_login(r, r->core_state);
    if (ratelimit_refused(r, ratelimit_login())) return ATRIUM_DONE;
    json_t *body = http_req_json(r);
    if (!body) return ATRIUM_DONE;
    const char *type, *user, *password;
    if (!http_field_string(r, body, "type", true, 0, &type)) return ATRIUM_DONE;
    if (strcmp(type, AS_LOGIN_TYPE) == 0) return login_appservice(r, body);
    if (strcmp(type, LOGIN_TOKEN_TYPE) == 0) return login_with_token(r, body);
    if (strcmp(type, "m.login.password") != 0)
        return http_respond_error(r, 400, "M_UNKNOWN", "Unknown login type; use m.login.password");
    login_state *st = rt_arena_alloc(r->arena, sizeof(*st));
    if (!st) return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    *st = (login_state){0};
    if (!login_user(r, body, &user) ||
        !http_field_string(r, body, "password", true, ACC_PASSWORD_MAX_BYTES, &password) ||
        !login_device(r, body, st))
        return ATRIUM_DONE;
    st->user_id = acc_local_user(r, user);
    st->password = password;
    return acc_to_auth_pool(r, st);
}

/* Deletes this device (all: every device of the user) with its tokens in one transaction. */
static int logout_devices(atrium_req *r, bool all)
{
    int rerun_rc;
    if (auth_revoke_rerun(r, &rerun_rc)) return rerun_rc; /* after a revocation's wait */
    if (!auth_request(r)) return ATRIUM_DONE;
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    const char *ids[1] = {r->device};
    bool ok = db_begin(c) &&
              acc_delete_devices(c, r->user, all ? NULL : ids, all ? 0 : 1, NULL) &&
              db_commit(c);
    if (!ok) db_rollback(c);
    else acc_tokens_revoked(c, r->user);
    int rc = ok ? auth_revoke_answer(r, c, r->user, 200, json_object()) : ATRIUM_DONE;
    http_db_checkin(c);
    if (!ok) return acc_db_failed(r);
    return rc;
}

/* POST /_matrix/client/v3/logout: this device and its tokens. The body may be empty. */
static int post_logout(atrium_req *r)
{
    return logout_devices(r, false);
}

/* POST /_matrix/client/v3/logout/all: every device of the user. */
static int post_logout_all(atrium_req *r)
{
    return logout_devices(r, true);
}

/* GET /_matrix/client/v3/account/whoami */
static int get_whoami(atrium_req *r)
{
    const char *user = auth_request(r);
    if (!user) return ATRIUM_DONE;
    json_t *body = json_pack("{s:s, s:s, s:b}", "user_id", user, "device_id", r->device,
                             "is_guest", r->is_guest > 0);
    return http_respond_json(r, 200, body);
}

int acc_login_routes(http_server *s)
{
    if (client_route(s, "GET", "/_matrix/client/v3/login", get_login, 0) < 0 ||
        client_route(s, "POST", "/_matrix/client/v3/login", post_login, ACC_MAX_BODY_BYTES) < 0 ||
        client_route(s, "POST", "/_matrix/client/v3/logout", post_logout, ACC_MAX_BODY_BYTES) < 0 ||
        client_route(s, "POST", "/_matrix/client/v3/logout/all", post_logout_all,
                     ACC_MAX_BODY_BYTES) < 0 ||
        client_route(s, "GET", "/_matrix/client/v3/account/whoami", get_whoami, 0) < 0)
        return -1;
    return 0;
}
