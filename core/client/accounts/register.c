/*
 * core/client/accounts/register.c - open registration: POST /_matrix/client/v3/register with
 * user-interactive auth (m.login.dummy), and GET /register/available.
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
 * (core/client/appservice/appservice.h). What this file
 * does not do: admin registration (admin_register.c) or log anyone in afterwards beyond
 * the token the answer carries.
 */
#include <string.h>

#include "core/client/accounts/accounts.h"
#include "core/client/appservice/appservice.h"
#include "core/client/ratelimits.h"

#define REGISTER_PURPOSE "register"

typedef struct register_state {
    acc_new_account account;
} register_state;

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
    const char *user_id = username ? wanted_user_id(r, username) : NULL;
    if (username && !user_id) return ATRIUM_DONE;
    if (user_id && (!not_exclusive(r, user_id, NULL) || !user_free(r, user_id)))
        return ATRIUM_DONE;
    if (!auth)
        return uia_challenge(r, UIA_STAGE_DUMMY, REGISTER_PURPOSE, "", NULL, NULL, NULL);
    const char *session;
    if (!uia_check(r, auth, UIA_STAGE_DUMMY, REGISTER_PURPOSE, "", &session)) return ATRIUM_DONE;
    if (!password)
        return http_respond_error(r, 400, "M_MISSING_PARAM", "Missing 'password'");
    if (!password[0])
        return http_respond_error(r, 400, "M_WEAK_PASSWORD", "The password must not be empty");
    register_state *st = rt_arena_alloc(r->arena, sizeof(*st));
    if (!st) return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    st->account = (acc_new_account){
        .user_id = user_id ? user_id : random_user_id(r),
        .password = password,
        .device_id = device_id,
        .device_name = device_name,
        .inhibit_login = inhibit_login,
        .refresh = refresh,
        .uia_session = session,
    };
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
