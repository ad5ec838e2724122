/*
 * core/client/accounts/register.c - open registration: POST /_matrix/client/v3/register with
 * user-interactive auth (m.login.dummy, after m.login.registration_token when
 * registration.requires_token), and GET /register/available.
 *
 * The order of checks is the client's experience: the rate limit and whether registration
 * is open come first, then the body's fields and the username (so a client learns that a
 * name is taken before it completes auth), then the UIA stage: a request without `auth`
 * always gets the 401 challenge, even a complete one (Element sends `{}` first to learn the
 * flows). Once auth passed, the request goes to the auth pool, where the password is
 * hashed and the account created (acc_create_account). A guest (kind=guest, only with
 * registration.guest_access) needs no auth and no password: a random user ID, a device
 * and a token, and the rights auth_guest.c gives guests. An application service registers
 * users of its namespaces with its as_token and type m.login.application_service: no
 * user-interactive auth, no password, no rate limit, even with registration disabled; a
 * name in a namespace a service holds exclusively is 400 M_EXCLUSIVE to everyone else
 * (core/client/appservice/appservice.h). A registration's UIA session keeps what its first
 * request gave (uia_body: the parameters; here: the password's hash, made on the auth pool
 * before the challenge, as Synapse does), so a client may send them once; it survives the
 * registration, naming the user it created, so a retry of a finished registration answers
 * that user again (logged in on a new device) instead of failing. What this file
 * does not do: admin registration (admin_register.c) or log anyone in afterwards beyond
 * the token the answer carries.
 */
#include <sodium.h>
#include <string.h>

#include "core/client/accounts/accounts.h"
#include "core/client/appservice/appservice.h"
#include "core/client/ratelimits.h"

#define REGISTER_PURPOSE "register"

typedef struct register_state {
    acc_new_account account;
    const char *const *flow; /* challenge: hash the password into a new session first */
} register_state;

static const char *const FLOW_DUMMY[] = {UIA_STAGE_DUMMY, NULL};
static const char *const FLOW_TOKEN[] = {UIA_STAGE_REGISTRATION_TOKEN, UIA_STAGE_DUMMY, NULL};

/* What a registration session kept: the user it registered, the registration token it
 * reserved, the hash of its first request's password (each NULL when none). */
typedef struct session_kept {
    const char *registered_user, *registration_token, *password_hash;
} session_kept;

/* Read what session kept into *k; false after answering 503. */
static bool session_kept_load(atrium_req *r, const char *session, session_kept *k)
{
    *k = (session_kept){0};
    if (!session) return true;
    PGconn *c = http_db_checkout(r);
    if (!c) return false;
    const char *p[2] = {session, REGISTER_PURPOSE};
    PGresult *res = acc_q(c, "SELECT registered_user, registration_token, password_hash"
                             " FROM uia_sessions WHERE session_id = $1 AND purpose = $2"
                             " AND expires_ts >= (extract(epoch from now()) * 1000)::bigint",
                          2, p);
    http_db_checkin(c);
    if (!res) {
        acc_db_failed(r);
        return false;
    }
    const char **out[3] = {&k->registered_user, &k->registration_token, &k->password_hash};
    for (int i = 0; i < 3 && PQntuples(res) == 1; i++)
        if (!PQgetisnull(res, 0, i)) *out[i] = rt_arena_strdup(r->arena, PQgetvalue(res, 0, i));
    PQclear(res);
    return true;
}

/* [auth pool] The first request gave a password: a new session keeps its hash (so the
 * client need not send it again), and the answer is the challenge. */
static int challenge_keeping_password(atrium_req *r, const register_state *st)
{
    char hash[crypto_pwhash_STRBYTES];
    if (auth_hash_password(st->account.password, hash) < 0)
        return http_respond_error(r, 503, "M_UNKNOWN", "The server is busy; retry");
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    const char *session = uia_session_open(r, c, REGISTER_PURPOSE, "");
    const char *p[2] = {session, hash};
    bool ok = session && db_exec(c, "UPDATE uia_sessions SET password_hash = $2"
                                    " WHERE session_id = $1", 2, p);
    http_db_checkin(c);
    sodium_memzero(hash, sizeof(hash));
    if (!ok) return acc_db_failed(r);
    return uia_challenge_flow(r, st->flow, REGISTER_PURPOSE, "", session, NULL, NULL);
}

/* A retry of a registration its session finished: the same user, logged in again on a
 * new (or the named) device unless inhibit_login, as Synapse answers. */
static int answer_again(atrium_req *r, const char *user_id, const acc_new_account *a)
{
    if (a->inhibit_login) return http_respond_json(r, 200, json_pack("{s:s}", "user_id", user_id));
    char device[ACC_RANDOM_ID_CHARS + 1], token[AUTH_TOKEN_CHARS + 1], refresh[AUTH_TOKEN_CHARS + 1];
    const char *device_id = a->device_id;
    if (!device_id) {
        acc_random_device_id(device);
        device_id = device;
    }
    int64_t lifetime_ms = r->srv->cfg->auth.refreshable_access_token_lifetime_ms;
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    bool ok = db_begin(c) &&
              acc_open_session(c, user_id, device_id, a->device_name, r->client_addr,
                               auth_user_agent(r), token) == 0 &&
              (!a->refresh || acc_session_refreshable(c, user_id, device_id, lifetime_ms, token,
                                                      refresh) == 0) &&
              db_commit(c);
    if (!ok) db_rollback(c);
    http_db_checkin(c);
    if (!ok) return acc_db_failed(r);
    auth_cache_forget_user(user_id); /* a re-used device ID lost its old tokens */
    json_t *body = json_pack("{s:s, s:s, s:s}", "user_id", user_id, "access_token", token,
                             "device_id", device_id);
    if (body && a->refresh) {
        json_object_set_new(body, "refresh_token", json_string(refresh));
        json_object_set_new(body, "expires_in_ms", json_integer(lifetime_ms));
    }
    return http_respond_json(r, 200, body);
}

/* The m.login.registration_token flow: complete the stage auth.type names in the session
 * (reserving a use of the token for its stage). 1: every stage is done, go on (*session
 * set); ATRIUM_DONE: answered (401 with what is completed, 503). */
static int token_flow_stage(atrium_req *r, json_t *auth, const char *type, const char **session)
{
    const char *token = NULL;
    bool token_stage = strcmp(type, UIA_STAGE_REGISTRATION_TOKEN) == 0;
    if (token_stage &&
        !http_field_string(r, auth, "token", true, ACC_PASSWORD_MAX_BYTES, &token))
        return ATRIUM_DONE;
    session_kept k;
    if (!session_kept_load(r, *session, &k)) return ATRIUM_DONE;
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    int all = 0, reserved = 1;
    bool fresh_token = token_stage && !k.registration_token; /* a use once per session */
    bool ok = db_begin(c);
    if (ok && !*session) ok = (*session = uia_session_open(r, c, REGISTER_PURPOSE, "")) != NULL;
    if (ok && fresh_token) ok = (reserved = acc_registration_tokens_reserve(c, token)) >= 0;
    if (ok && fresh_token && reserved == 1) {
        const char *p[2] = {*session, token};
        ok = db_exec(c, "UPDATE uia_sessions SET registration_token = $2 WHERE session_id = $1",
                     2, p);
    }
    if (ok && reserved == 1) ok = (all = uia_complete_stage(c, *session, type, FLOW_TOKEN)) >= 0;
    ok = ok && db_commit(c); /* a new session is kept even when the token was refused */
    if (!ok) db_rollback(c);
    http_db_checkin(c);
    if (!ok) return acc_db_failed(r);
    if (reserved == 0)
        return uia_challenge_flow(r, FLOW_TOKEN, REGISTER_PURPOSE, "", *session, "M_UNAUTHORIZED",
                                  "Invalid registration token");
    if (!all) return uia_challenge_flow(r, FLOW_TOKEN, REGISTER_PURPOSE, "", *session, NULL, NULL);
    return 1;
}

/* The username of a request, lower-cased, as a user ID; NULL after answering 400. */
static const char *wanted_user_id(atrium_req *r, const char *username)
{
    const char *user_id = acc_user_id_for_username(r, username);
    if (!user_id)
        http_respond_error(r, 400, "M_INVALID_USERNAME",
                           "A username may only hold a-z, 0-9 and . _ = - / +, and the user ID "
                           "must fit %d bytes", ACC_USER_ID_MAX_BYTES);
    return user_id;
}

/* 400 M_EXCLUSIVE when an application service other than svc (NULL: any) holds user_id's
 * namespace exclusively. true: free of them. */
static bool not_exclusive(atrium_req *r, const char *user_id, const as_service *svc)
{
    if (!as_user_exclusive_elsewhere(user_id, svc)) return true;
    http_respond_error(r, 400, "M_EXCLUSIVE", "This user ID is reserved by an application "
                       "service");
    return false;
}

/* 400 M_USER_IN_USE when taken. true: free (or answered on trouble: check r->response). */
static bool user_free(atrium_req *r, const char *user_id)
{
    PGconn *c = http_db_checkout(r);
    if (!c) return false;
    int exists = acc_user_exists(c, user_id);
    http_db_checkin(c);
    if (exists < 0) {
        acc_db_failed(r);
        return false;
    }
    if (exists) {
        http_respond_error(r, 400, "M_USER_IN_USE", "That user ID is already taken");
        return false;
    }
    return true;
}

static const char *random_user_id(atrium_req *r)
{
    char lp[ACC_RANDOM_ID_CHARS + 1];
    acc_random_chars(lp, ACC_RANDOM_ID_CHARS);
    return acc_user_id(r, lp);
}

/* POST /register?kind=guest {initial_device_display_name?}: a guest account, at once. */
static int register_guest(atrium_req *r)
{
    if (!r->srv->cfg->registration.guest_access)
        return http_respond_error(r, 403, "M_GUEST_ACCESS_FORBIDDEN",
                                  "Guest access is not enabled on this server");
    json_t *body = r->body_len ? http_req_json(r) : NULL;
    if (r->body_len && !body) return ATRIUM_DONE;
    const char *device_name = NULL;
    if (body && !http_field_string(r, body, "initial_device_display_name", false,
                                   ACC_DEVICE_NAME_MAX_BYTES, &device_name))
        return ATRIUM_DONE;
    register_state *st = rt_arena_alloc(r->arena, sizeof(*st));
    if (!st) return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    st->account = (acc_new_account){
        .user_id = random_user_id(r),
        .device_name = device_name,
        .guest = true,
    };
    return acc_to_auth_pool(r, st);
}

/* POST /register {type: m.login.application_service, username} with an as_token. */
static int register_appservice(atrium_req *r, json_t *body)
{
    const as_service *svc = as_of_request(r);
    if (!svc)
        return http_respond_error(r, 401, auth_token_of(r) ? "M_UNKNOWN_TOKEN" : "M_MISSING_TOKEN",
                                  "m.login.application_service needs an application "
                                  "service's as_token");
    const char *type = json_string_value(json_object_get(body, "type"));
    if (!body || !type || strcmp(type, AS_LOGIN_TYPE) != 0)
        return http_respond_error(r, 400, "M_MISSING_PARAM", "An application service "
                                  "registers with type m.login.application_service");
    const char *username, *device_id, *device_name;
    bool inhibit_login;
    if (!http_field_string(r, body, "username", true, ACC_USER_ID_MAX_BYTES, &username) ||
        !http_field_string(r, body, "device_id", false, ACC_DEVICE_ID_MAX_BYTES, &device_id) ||
        !http_field_string(r, body, "initial_device_display_name", false,
                           ACC_DEVICE_NAME_MAX_BYTES, &device_name) ||
        !http_field_bool(r, body, "inhibit_login", false, &inhibit_login))
        return ATRIUM_DONE;
    if (device_id && !device_id[0])
        return http_respond_error(r, 400, "M_INVALID_PARAM", "device_id must not be empty");
    const char *user_id = wanted_user_id(r, username);
    if (!user_id) return ATRIUM_DONE;
    if (!as_user_in(svc, user_id))
        return http_respond_error(r, 400, "M_EXCLUSIVE", "This user ID is not in the "
                                  "application service's namespaces");
    if (!not_exclusive(r, user_id, svc) || !user_free(r, user_id)) return ATRIUM_DONE;
    register_state *st = rt_arena_alloc(r->arena, sizeof(*st));
    if (!st) return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    st->account = (acc_new_account){.user_id = user_id, .device_id = device_id,
                                    .device_name = device_name, .inhibit_login = inhibit_login};
    return acc_to_auth_pool(r, st);
}

/* POST /_matrix/client/v3/register */
static int post_register(atrium_req *r)
{
    if (r->run_reason == ATRIUM_RUN_HANDOFF) {
        register_state *st = r->core_state;
        if (st->flow) return challenge_keeping_password(r, st);
        return acc_create_account(r, &st->account);
    }
    bool by_service = as_of_request(r) != NULL;
    if (!by_service && ratelimit_refused(r, ratelimit_register())) return ATRIUM_DONE;
    json_t *early = r->body_len ? http_req_json(r) : NULL;
    if (r->body_len && !early) return ATRIUM_DONE;
    const char *type = json_string_value(json_object_get(early, "type"));
    if (by_service || (type && strcmp(type, AS_LOGIN_TYPE) == 0))
        return register_appservice(r, early);
    const char *kind = http_req_query(r, "kind");
    if (kind && strcmp(kind, "guest") == 0) return register_guest(r);
    if (kind && strcmp(kind, "user") != 0)
        return http_respond_error(r, 400, "M_INVALID_PARAM", "kind must be user or guest");
    if (!r->srv->cfg->registration.enabled)
        return http_respond_error(r, 403, "M_FORBIDDEN", "Registration is disabled");
    json_t *body = uia_body(r);
    if (!body) return ATRIUM_DONE;
    const char *username, *password, *device_id, *device_name;
    bool inhibit_login, refresh;
    json_t *auth;
    if (!http_field_string(r, body, "username", false, ACC_USER_ID_MAX_BYTES, &username) ||
        !http_field_string(r, body, "password", false, ACC_PASSWORD_MAX_BYTES, &password) ||
        !http_field_string(r, body, "device_id", false, ACC_DEVICE_ID_MAX_BYTES, &device_id) ||
        !http_field_string(r, body, "initial_device_display_name", false, ACC_DEVICE_NAME_MAX_BYTES,
                    &device_name) ||
        !http_field_bool(r, body, "inhibit_login", false, &inhibit_login) ||
        !http_field_bool(r, body, "refresh_token", false, &refresh) ||
        !http_field_object(r, body, "auth", false, &auth))
        return ATRIUM_DONE;
    if (device_id && !device_id[0])
        return http_respond_error(r, 400, "M_INVALID_PARAM", "device_id must not be empty");
    register_state *st = rt_arena_alloc(r->arena, sizeof(*st));
    if (!st) return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    *st = (register_state){.account = {.password = password, .device_id = device_id,
                                       .device_name = device_name,
                                       .inhibit_login = inhibit_login, .refresh = refresh}};
    /* A retry of a finished registration, before its user ID reads as taken. */
    json_t *given = json_object_get(auth, "session");
    session_kept k;
    if (!session_kept_load(r, json_is_string(given) ? json_string_value(given) : NULL, &k))
        return ATRIUM_DONE;
    if (k.registered_user) return answer_again(r, k.registered_user, &st->account);
    const char *user_id = username ? wanted_user_id(r, username) : NULL;
    if (username && !user_id) return ATRIUM_DONE;
    if (user_id && (!not_exclusive(r, user_id, NULL) || !user_free(r, user_id)))
        return ATRIUM_DONE;
    const char *const *flow = r->srv->cfg->registration.requires_token ? FLOW_TOKEN : FLOW_DUMMY;
    if (!auth && password && password[0]) { /* the session keeps the password's hash */
        st->flow = flow;
        return acc_to_auth_pool(r, st);
    }
    if (!auth) return uia_challenge_flow(r, flow, REGISTER_PURPOSE, "", NULL, NULL, NULL);
    const char *session, *stage;
    if (!uia_check_flow(r, auth, flow, REGISTER_PURPOSE, "", &session, &stage)) return ATRIUM_DONE;
    if (flow == FLOW_TOKEN && token_flow_stage(r, auth, stage, &session) != 1) return ATRIUM_DONE;
    if (!session_kept_load(r, session, &k)) return ATRIUM_DONE;
    if (!password && !k.password_hash)
        return http_respond_error(r, 400, "M_MISSING_PARAM", "Missing 'password'");
    if (password && !password[0])
        return http_respond_error(r, 400, "M_WEAK_PASSWORD", "The password must not be empty");
    st->account.user_id = user_id ? user_id : random_user_id(r);
    st->account.password_hash = k.password_hash; /* kept: preferred, as Synapse (no rehash) */
    st->account.registration_token = k.registration_token;
    st->account.uia_session = session;
    return acc_to_auth_pool(r, st);
}

/* GET /_matrix/client/v3/register/available?username= */
static int get_available(atrium_req *r)
{
    if (ratelimit_refused(r, ratelimit_register())) return ATRIUM_DONE;
    const char *username = http_req_query(r, "username");
    if (!username)
        return http_respond_error(r, 400, "M_MISSING_PARAM", "Missing 'username'");
    const char *user_id = wanted_user_id(r, username);
    if (!user_id || !not_exclusive(r, user_id, NULL) || !user_free(r, user_id))
        return ATRIUM_DONE;
    return http_respond_json(r, 200, json_pack("{s:b}", "available", 1));
}

int acc_register_routes(http_server *s)
{
    if (client_route(s, "POST", "/_matrix/client/v3/register", post_register,
                     ACC_MAX_BODY_BYTES) < 0 ||
        client_route(s, "GET", "/_matrix/client/v3/register/available", get_available, 0) < 0)
        return -1;
    return 0;
}
