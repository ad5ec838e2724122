/*
 * core/client/accounts/devices.c - a user's devices and password: GET /devices, GET/PUT/DELETE
 * /devices/{deviceId}, POST /delete_devices, POST /account/password.
 *
 * Deleting devices and changing the password are sensitive: both need the user's password
 * again through user-interactive auth (m.login.password), checked on the auth pool. A
 * deleted device's tokens go with it, at once. A password change logs out every other
 * device unless the request says logout_devices: false; the device that asked stays.
 * What this file does not do: end-to-end keys of devices or device-list updates to other
 * users (the E2EE work), or logging in (login.c).
 */
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/accounts/accounts.h"
#include "core/client/e2ee/e2ee.h"

#define DEVICES_DELETE_PURPOSE "delete_devices"
#define PASSWORD_PURPOSE "password"
#define DELETE_DEVICES_MAX 1000 /* device IDs in one POST /delete_devices */

static json_t *device_json(PGresult *res, int row)
{
    json_t *d = json_pack("{s:s}", "device_id", PQgetvalue(res, row, 0));
    if (!d) return NULL;
    if (!PQgetisnull(res, row, 1))
        json_object_set_new(d, "display_name", json_string(PQgetvalue(res, row, 1)));
    if (!PQgetisnull(res, row, 2))
        json_object_set_new(d, "last_seen_ts",
                            json_integer(strtoll(PQgetvalue(res, row, 2), NULL, 10)));
    if (!PQgetisnull(res, row, 3))
        json_object_set_new(d, "last_seen_ip", json_string(PQgetvalue(res, row, 3)));
    return d;
}

#define DEVICE_COLUMNS "device_id, display_name, last_seen_ts, last_seen_ip"

/* GET /_matrix/client/v3/devices */
static int get_devices(atrium_req *r)
{
    if (!auth_request(r)) return ATRIUM_DONE;
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    const char *p[1] = {r->user};
    PGresult *res = acc_q(c, "SELECT " DEVICE_COLUMNS " FROM devices WHERE user_id = $1"
                             " ORDER BY device_id", 1, p);
    http_db_checkin(c);
    if (!res) return acc_db_failed(r);
    json_t *list = json_array();
    for (int i = 0; list && i < PQntuples(res); i++) json_array_append_new(list, device_json(res, i));
    PQclear(res);
    return http_respond_json(r, 200, json_pack("{s:o}", "devices", list));
}

/* GET /_matrix/client/v3/devices/{deviceId} */
static int get_device(atrium_req *r)
{
    if (!auth_request(r)) return ATRIUM_DONE;
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    const char *p[2] = {r->user, http_req_param(r, "deviceId")};
    PGresult *res = acc_q(c, "SELECT " DEVICE_COLUMNS " FROM devices WHERE user_id = $1"
                             " AND device_id = $2", 2, p);
    http_db_checkin(c);
    if (!res) return acc_db_failed(r);
    json_t *d = PQntuples(res) == 1 ? device_json(res, 0) : NULL;
    int found = PQntuples(res);
    PQclear(res);
    if (!found) return http_respond_error(r, 404, "M_NOT_FOUND", "No such device");
    return http_respond_json(r, 200, d);
}

/* PUT /_matrix/client/v3/devices/{deviceId} {display_name} */
static int put_device(atrium_req *r)
{
    if (!auth_request(r)) return ATRIUM_DONE;
    json_t *body = http_req_json(r);
    const char *name;
    if (!body || !http_field_string(r, body, "display_name", false, ACC_DEVICE_NAME_MAX_BYTES, &name))
        return ATRIUM_DONE;
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    const char *p[3] = {r->user, http_req_param(r, "deviceId"), name};
    PGresult *res = acc_q(c, "UPDATE devices SET display_name = COALESCE($3, display_name)"
                             " WHERE user_id = $1 AND device_id = $2", 3, p);
    bool found = res && strcmp(PQcmdTuples(res), "1") == 0;
    if (found && name) e2ee_wake_key_change(c, r->user); /* a rename is a device-list change */
    http_db_checkin(c);
    if (!res) return acc_db_failed(r);
    PQclear(res);
    if (!found) return http_respond_error(r, 404, "M_NOT_FOUND", "No such device");
    return http_respond_json(r, 200, json_object());
}

typedef struct delete_state {
    uia_password auth;
    const char **ids;
    size_t n;
} delete_state;

/* [auth pool] After the password passed: delete, then answer {}. */
static int finish_delete(atrium_req *r, const delete_state *st)
{
    if (!uia_password_verify(r, &st->auth, DEVICES_DELETE_PURPOSE)) return ATRIUM_DONE;
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    bool ok = db_begin(c) && acc_delete_devices(c, r->user, st->ids, st->n, NULL);
    if (ok) uia_forget(c, st->auth.session);
    ok = ok && db_commit(c);
    if (!ok) db_rollback(c);
    else acc_tokens_revoked(c, r->user);
    int rc = ok ? auth_revoke_answer(r, c, r->user, 200, json_object()) : ATRIUM_DONE;
    http_db_checkin(c);
    if (!ok) return acc_db_failed(r);
    return rc;
}

/* The shared first half of both delete endpoints. */
static int begin_delete(atrium_req *r, json_t *body, const char **ids, size_t n)
{
    delete_state *st = rt_arena_alloc(r->arena, sizeof(*st));
    if (!st) return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    st->ids = ids;
    st->n = n;
    if (!uia_password_begin(r, body, DEVICES_DELETE_PURPOSE, &st->auth)) return ATRIUM_DONE;
    return acc_to_auth_pool(r, st);
}

/* DELETE /_matrix/client/v3/devices/{deviceId} (UIA; the body may be empty at first) */
static int delete_device(atrium_req *r)
{
    int rerun_rc;
    if (auth_revoke_rerun(r, &rerun_rc)) return rerun_rc; /* after a revocation's wait */
    if (!auth_request(r)) return ATRIUM_DONE;
    if (r->run_reason == ATRIUM_RUN_HANDOFF) return finish_delete(r, r->core_state);
    json_t *body = uia_body(r);
    if (!body) return ATRIUM_DONE;
    const char **ids = rt_arena_alloc(r->arena, sizeof(char *));
    if (!ids) return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    ids[0] = http_req_param(r, "deviceId");
    return begin_delete(r, body, ids, 1);
}

/* POST /_matrix/client/v3/delete_devices {devices: [...], auth} */
static int post_delete_devices(atrium_req *r)
{
    int rerun_rc;
    if (auth_revoke_rerun(r, &rerun_rc)) return rerun_rc; /* after a revocation's wait */
    if (!auth_request(r)) return ATRIUM_DONE;
    if (r->run_reason == ATRIUM_RUN_HANDOFF) return finish_delete(r, r->core_state);
    json_t *body = uia_body(r);
    if (!body) return ATRIUM_DONE;
    json_t *list = json_object_get(body, "devices");
    if (!list) return http_respond_error(r, 400, "M_MISSING_PARAM", "Missing 'devices'");
    if (!json_is_array(list))
        return http_respond_error(r, 400, "M_BAD_JSON", "'devices' must be a list of device IDs");
    size_t n = json_array_size(list);
    if (n > DELETE_DEVICES_MAX)
        return http_respond_error(r, 400, "M_INVALID_PARAM", "At most %d devices at once",
                                  DELETE_DEVICES_MAX);
    const char **ids = rt_arena_alloc(r->arena, (n + 1) * sizeof(char *));
    if (!ids) return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(list, i);
        if (!json_is_string(v))
            return http_respond_error(r, 400, "M_BAD_JSON", "'devices' must hold strings");
        ids[i] = json_string_value(v);
    }
    return begin_delete(r, body, ids, n);
}

typedef struct password_state {
    uia_password auth;
    const char *new_password;
    bool logout_devices;
} password_state;

/* [auth pool] Check the old password, hash the new one, store it. */
static int finish_password(atrium_req *r, const password_state *st)
{
    if (!uia_password_verify(r, &st->auth, PASSWORD_PURPOSE)) return ATRIUM_DONE;
    char hash[crypto_pwhash_STRBYTES];
    if (auth_hash_password(st->new_password, hash) < 0)
        return http_respond_error(r, 503, "M_UNKNOWN", "The server is busy; retry");
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    const char *p[2] = {r->user, hash};
    bool ok = db_begin(c) &&
              db_exec(c, "UPDATE users SET password_hash = $2 WHERE user_id = $1", 2, p);
    if (ok && st->logout_devices) ok = acc_delete_devices(c, r->user, NULL, 0, r->device);
    if (ok) uia_forget(c, st->auth.session);
    ok = ok && db_commit(c);
    if (!ok) db_rollback(c);
    else acc_tokens_revoked(c, r->user);
    /* Only other devices' tokens went (logout_devices); without it nothing to wait for. */
    int rc = !ok ? ATRIUM_DONE
             : st->logout_devices ? auth_revoke_answer(r, c, r->user, 200, json_object())
                                  : http_respond_json(r, 200, json_object());
    http_db_checkin(c);
    sodium_memzero(hash, sizeof(hash));
    if (!ok) return acc_db_failed(r);
    return rc;
}

/* POST /_matrix/client/v3/account/password {new_password, logout_devices, auth} */
static int post_password(atrium_req *r)
{
    int rerun_rc;
    if (auth_revoke_rerun(r, &rerun_rc)) return rerun_rc; /* after a revocation's wait */
    if (!auth_request(r)) return ATRIUM_DONE;
    if (r->run_reason == ATRIUM_RUN_HANDOFF) return finish_password(r, r->core_state);
    json_t *body = uia_body(r);
    if (!body) return ATRIUM_DONE;
    password_state *st = rt_arena_alloc(r->arena, sizeof(*st));
    if (!st) return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    if (!http_field_string(r, body, "new_password", false, ACC_PASSWORD_MAX_BYTES, &st->new_password) ||
        !http_field_bool(r, body, "logout_devices", true, &st->logout_devices))
        return ATRIUM_DONE;
    if (!uia_password_begin(r, body, PASSWORD_PURPOSE, &st->auth)) return ATRIUM_DONE;
    if (!st->new_password)
        return http_respond_error(r, 400, "M_MISSING_PARAM", "Missing 'new_password'");
    if (!st->new_password[0])
        return http_respond_error(r, 400, "M_WEAK_PASSWORD", "The password must not be empty");
    return acc_to_auth_pool(r, st);
}

int acc_devices_routes(http_server *s)
{
    if (client_route(s, "GET", "/_matrix/client/v3/devices", get_devices, 0) < 0 ||
        client_route(s, "GET", "/_matrix/client/v3/devices/{deviceId}", get_device, 0) < 0 ||
        client_route(s, "PUT", "/_matrix/client/v3/devices/{deviceId}", put_device,
                     ACC_MAX_BODY_BYTES) < 0 ||
        client_route(s, "DELETE", "/_matrix/client/v3/devices/{deviceId}", delete_device,
                     ACC_MAX_BODY_BYTES) < 0 ||
        client_route(s, "POST", "/_matrix/client/v3/delete_devices", post_delete_devices,
                     ACC_MAX_BODY_BYTES) < 0 ||
        client_route(s, "POST", "/_matrix/client/v3/account/password", post_password,
                     ACC_MAX_BODY_BYTES) < 0)
        return -1;
    return 0;
}
