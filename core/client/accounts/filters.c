/*
 * core/client/accounts/filters.c - sync filters: POST /user/{userId}/filter stores a filter and
 * answers its ID, GET /user/{userId}/filter/{filterId} gives it back as stored.
 *
 * matrix-js-sdk creates a filter before its first sync and compares what GET returns with
 * its own copy, so a filter is stored exactly as sent (jsonb keeps every key). The same
 * filter posted again by the same user gets the same ID, so a client that re-creates its
 * filter at every start does not grow the table. IDs are decimal numbers (never starting
 * with "{", which /sync reads as an inline filter). Only the types of the fields are
 * checked here, as Synapse's filter schema does: the event filters (room.state, timeline,
 * ephemeral, account_data, and the top-level presence and account_data) by the rule /sync
 * applies (rooms_filter_parse: a limit that is no integer, a non-boolean
 * lazy_load_members or a types list of non-strings is 400 here, not a surprise at the
 * next sync), the room lists, include_leave, event_fields and event_format. Every refusal
 * is 400 M_BAD_JSON (Synapse answers M_UNKNOWN). What each field means is /sync's business.
 */
#include <stdlib.h>
#include <string.h>

#include "core/client/accounts/accounts.h"
#include "core/rooms/rooms.h"

#define FILTER_ID_MAX_DIGITS 18 /* fits a bigint */

/* The user a /user/{userId}/... path names must be the caller: 403 otherwise. */
static bool own_path(atrium_req *r)
{
    if (strcmp(http_req_param(r, "userId"), r->user) == 0) return true;
    http_respond_error(r, 403, "M_FORBIDDEN", "You can only use your own filters");
    return false;
}

/* v, when present, is a list of strings. */
static bool string_list_or_absent(const json_t *v)
{
    if (!v) return true;
    if (!json_is_array(v)) return false;
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) if (!json_is_string(s)) return false;
    return true;
}

/* v, when present, is true or false. */
static bool boolean_or_absent(const json_t *v) { return !v || json_is_boolean(v); }

/* The event filters of a filter: room.{state,timeline,ephemeral,account_data} and the
 * top-level presence and account_data, each as /sync reads it (rooms_filter_parse). false
 * after answering 400. */
static bool event_filters_ok(atrium_req *r, json_t *filter)
{
    static const struct {
        const char *part, *key;
    } EVENT_FILTERS[] = {{"room", "state"},       {"room", "timeline"}, {"room", "ephemeral"},
                         {"room", "account_data"}, {NULL, "presence"},  {NULL, "account_data"}};
    for (size_t i = 0; i < sizeof(EVENT_FILTERS) / sizeof(EVENT_FILTERS[0]); i++) {
        const char *part = EVENT_FILTERS[i].part, *key = EVENT_FILTERS[i].key;
        json_t *holder = part ? json_object_get(filter, part) : filter;
        room_filter parsed;
        char why[128];
        if (!rooms_filter_parse(r->arena, json_object_get(holder, key), &parsed, why, sizeof(why))) {
            http_respond_error(r, 400, "M_BAD_JSON", "%s%s%s: %s", part ? part : "", part ? "." : "",
                               key, why);
            return false;
        }
    }
    return true;
}

static bool filter_shape_ok(atrium_req *r, json_t *filter)
{
    static const char *const object_keys[] = {"room", "presence", "account_data", NULL};
    for (size_t i = 0; object_keys[i]; i++) {
        json_t *v = json_object_get(filter, object_keys[i]);
        if (v && !json_is_object(v)) {
            http_respond_error(r, 400, "M_BAD_JSON", "'%s' must be an object", object_keys[i]);
            return false;
        }
    }
    if (!event_filters_ok(r, filter)) return false;
    json_t *room = json_object_get(filter, "room");
    if (!string_list_or_absent(json_object_get(room, "rooms")) ||
        !string_list_or_absent(json_object_get(room, "not_rooms"))) {
        http_respond_error(r, 400, "M_BAD_JSON", "room.rooms and room.not_rooms must be lists of "
                           "room IDs");
        return false;
    }
    if (!boolean_or_absent(json_object_get(room, "include_leave")) ||
        !boolean_or_absent(json_object_get(json_object_get(room, "state"),
                                           "include_redundant_members"))) {
        http_respond_error(r, 400, "M_BAD_JSON", "room.include_leave and "
                           "room.state.include_redundant_members must be true or false");
        return false;
    }
    if (!string_list_or_absent(json_object_get(filter, "event_fields"))) {
        http_respond_error(r, 400, "M_BAD_JSON", "'event_fields' must be a list of strings");
        return false;
    }
    json_t *format = json_object_get(filter, "event_format");
    if (format && (!json_is_string(format) || (strcmp(json_string_value(format), "client") != 0 &&
                                               strcmp(json_string_value(format), "federation") != 0))) {
        http_respond_error(r, 400, "M_BAD_JSON", "'event_format' must be client or federation");
        return false;
    }
    return true;
}

/* POST /_matrix/client/v3/user/{userId}/filter */
static int post_filter(atrium_req *r)
{
    if (!auth_request(r) || !own_path(r)) return ATRIUM_DONE;
    json_t *filter = http_req_json(r);
    if (!filter || !filter_shape_ok(r, filter)) return ATRIUM_DONE;
    char *text = json_dumps(filter, JSON_COMPACT);
    if (!text) return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    PGconn *c = http_db_checkout(r);
    if (!c) {
        free(text);
        return ATRIUM_DONE;
    }
    const char *p[2] = {r->user, text};
    /* Same filter, same ID: look first, insert only when new. */
    PGresult *res = acc_q(c, "WITH found AS (SELECT filter_id FROM filters"
                             "  WHERE user_id = $1 AND filter = $2::jsonb LIMIT 1),"
                             " added AS (INSERT INTO filters (user_id, filter_id, filter)"
                             "  SELECT $1, nextval('filter_ids'), $2::jsonb"
                             "  WHERE NOT EXISTS (SELECT 1 FROM found) RETURNING filter_id)"
                             " SELECT filter_id FROM found UNION ALL SELECT filter_id FROM added",
                          2, p);
    http_db_checkin(c);
    free(text);
    if (!res || PQntuples(res) < 1) {
        PQclear(res);
        return acc_db_failed(r);
    }
    json_t *body = json_pack("{s:s}", "filter_id", PQgetvalue(res, 0, 0));
    PQclear(res);
    return http_respond_json(r, 200, body);
}

int acc_filter_load(PGconn *c, const char *user_id, const char *filter_id, json_t **out)
{
    *out = NULL;
    size_t len = strlen(filter_id);
    if (len == 0 || len > FILTER_ID_MAX_DIGITS || strspn(filter_id, "0123456789") != len)
        return 0;
    const char *p[2] = {user_id, filter_id};
    PGresult *res = acc_q(c, "SELECT filter FROM filters WHERE user_id = $1"
                             " AND filter_id = $2::bigint", 2, p);
    if (!res) return ATRIUM_E_DB;
    if (PQntuples(res) == 1) *out = json_loads(PQgetvalue(res, 0, 0), 0, NULL);
    PQclear(res);
    return *out ? 1 : 0;
}

/* GET /_matrix/client/v3/user/{userId}/filter/{filterId} */
static int get_filter(atrium_req *r)
{
    if (!auth_request(r) || !own_path(r)) return ATRIUM_DONE;
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    json_t *filter;
    int found = acc_filter_load(c, r->user, http_req_param(r, "filterId"), &filter);
    http_db_checkin(c);
    if (found < 0) return acc_db_failed(r);
    if (!found) return http_respond_error(r, 404, "M_NOT_FOUND", "No such filter");
    return http_respond_json(r, 200, filter);
}

int acc_filters_routes(http_server *s)
{
    if (client_route(s, "POST", "/_matrix/client/v3/user/{userId}/filter", post_filter,
                     ACC_MAX_BODY_BYTES) < 0 ||
        client_route(s, "GET", "/_matrix/client/v3/user/{userId}/filter/{filterId}", get_filter,
                     0) < 0)
        return -1;
    return 0;
}
