/*
 * core/client/accounts/account_data.c - per-user account data, global and per room:
 * PUT/GET /user/{userId}/account_data/{type} and
 * PUT/GET /user/{userId}/rooms/{roomId}/account_data/{type}.
 *
 * The stream rule (core/client/sync/notifier.h) lives in acc_account_data_store: every write
 * takes a new position from stream_seq into stream_pos, and the writer wakes the user
 * after commit, so /sync sends rows whose stream_pos is past the client's token. Types the
 * server manages itself (m.push_rules, m.fully_read) are refused with 405 M_BAD_JSON, as
 * the spec says. Only the user may read or write their own account data (403). Whether the
 * user is in a room named here is not checked: the data is the user's own.
 */
#include <stdlib.h>
#include <string.h>

#include "core/client/accounts/accounts.h"
#include "core/client/sync/notifier.h"

#define ACCOUNT_DATA_TYPE_MAX_BYTES 255
#define ROOM_ID_MAX_BYTES 255

static const char *const SERVER_MANAGED_TYPES[] = {"m.push_rules", "m.fully_read", NULL};

bool acc_account_data_store(PGconn *c, const char *user_id, const char *room_id,
                            const char *type, const char *content)
{
    const char *p[4] = {user_id, room_id, type, content};
    return db_exec(c, "INSERT INTO account_data (user_id, room_id, type, content, stream_pos)"
                      " VALUES ($1, $2, $3, $4::jsonb, stream_next())"
                      " ON CONFLICT (user_id, room_id, type) DO UPDATE SET"
                      " content = EXCLUDED.content, stream_pos = EXCLUDED.stream_pos",
                   4, p);
}

/* Check the path: the caller's own user, a sane type and room. room_id NULL for global.
 * false after answering. */
static bool path_ok(atrium_req *r, const char *room_id, const char *type)
{
    if (strcmp(http_req_param(r, "userId"), r->user) != 0) {
        http_respond_error(r, 403, "M_FORBIDDEN", "You can only use your own account data");
        return false;
    }
    if (strlen(type) > ACCOUNT_DATA_TYPE_MAX_BYTES) {
        http_respond_error(r, 400, "M_INVALID_PARAM", "The type is longer than %d bytes",
                           ACCOUNT_DATA_TYPE_MAX_BYTES);
        return false;
    }
    if (room_id && (room_id[0] != '!' || !strchr(room_id, ':') ||
                    strlen(room_id) > ROOM_ID_MAX_BYTES)) {
        http_respond_error(r, 400, "M_INVALID_PARAM", "'%.64s' is not a room ID", room_id);
        return false;
    }
    return true;
}

static int put_data(atrium_req *r, const char *room_id, const char *type)
{
    if (!auth_request(r) || !path_ok(r, room_id, type)) return ATRIUM_DONE;
    for (size_t i = 0; SERVER_MANAGED_TYPES[i]; i++)
        if (strcmp(type, SERVER_MANAGED_TYPES[i]) == 0)
            return http_respond_error(r, 405, "M_BAD_JSON",
                                      "%s is managed by the server; use its own API", type);
    json_t *content = http_req_json(r);
    if (!content) return ATRIUM_DONE;
    char *text = json_dumps(content, JSON_COMPACT);
    if (!text) return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    PGconn *c = http_db_checkout(r);
    if (!c) {
        free(text);
        return ATRIUM_DONE;
    }
    bool ok = acc_account_data_store(c, r->user, room_id ? room_id : "", type, text);
    http_db_checkin(c);
    free(text);
    if (!ok) return acc_db_failed(r);
    notifier_wake_user(r->user);
    return http_respond_json(r, 200, json_object());
}

static int get_data(atrium_req *r, const char *room_id, const char *type)
{
    if (!auth_request(r) || !path_ok(r, room_id, type)) return ATRIUM_DONE;
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    const char *p[3] = {r->user, room_id ? room_id : "", type};
    PGresult *res = acc_q(c, "SELECT content FROM account_data WHERE user_id = $1"
                             " AND room_id = $2 AND type = $3", 3, p);
    http_db_checkin(c);
    if (!res) return acc_db_failed(r);
    json_t *content = PQntuples(res) == 1 ? json_loads(PQgetvalue(res, 0, 0), 0, NULL) : NULL;
    PQclear(res);
    if (!content) return http_respond_error(r, 404, "M_NOT_FOUND", "No account data of that type");
    return http_respond_json(r, 200, content);
}

/* /user/{userId}/account_data/{type} */
static int put_global(atrium_req *r) { return put_data(r, NULL, http_req_param(r, "type")); }
static int get_global(atrium_req *r) { return get_data(r, NULL, http_req_param(r, "type")); }
/* /user/{userId}/rooms/{roomId}/account_data/{type} */
static int put_room(atrium_req *r)
{
    return put_data(r, http_req_param(r, "roomId"), http_req_param(r, "type"));
}
static int get_room(atrium_req *r)
{
    return get_data(r, http_req_param(r, "roomId"), http_req_param(r, "type"));
}

int acc_account_data_routes(http_server *s)
{
#define GLOBAL "/_matrix/client/v3/user/{userId}/account_data/{type}"
#define ROOM "/_matrix/client/v3/user/{userId}/rooms/{roomId}/account_data/{type}"
    int rc = client_route(s, "PUT", GLOBAL, put_global, 0) < 0 ||
                     client_route(s, "GET", GLOBAL, get_global, 0) < 0 ||
                     client_route(s, "PUT", ROOM, put_room, 0) < 0 ||
                     client_route(s, "GET", ROOM, get_room, 0) < 0
                 ? -1
                 : 0;
#undef GLOBAL
#undef ROOM
    return rc;
}
