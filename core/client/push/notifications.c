/*
 * core/client/push/notifications.c - GET /_matrix/client/v3/notifications: the events that
 * notified the user, newest first, as the push sender decided them (push_send.c writes the
 * push_notifications rows, one per event and user, with the deciding rule's actions).
 *
 * Paging: `from` is the id of the last row of the previous page (next_token), exclusive;
 * `limit` defaults to NOTIFICATIONS_DEFAULT_LIMIT and is clamped to
 * NOTIFICATIONS_MAX_LIMIT; only=highlight keeps the highlighting ones. next_token is
 * given when the page is full (there may be more). `read` is whether the user's read
 * receipt in the room is at or after the event. An event that is no longer stored (or a
 * row whose event cannot be rendered) is left out of the page.
 */
#include <stdlib.h>
#include <string.h>

#include "atrium/parse.h"
#include "core/client/accounts/accounts.h"
#include "core/client/push/pushers.h"
#include "core/rooms/rooms.h"

#define NOTIFICATIONS_DEFAULT_LIMIT 20
#define NOTIFICATIONS_MAX_LIMIT 100

/* The event of one notification in the client format, or NULL. */
static json_t *notified_event(atrium_req *r, PGconn *c, const char *event_id)
{
    const char *p[1] = {event_id};
    PGresult *res = acc_q(c, EVENTS_SELECT "WHERE e.event_id = $1", 1, p);
    if (!res) return NULL;
    /* Only members of the room at an event are notified of it: erasure hides nothing. */
    events_view v = {.user_id = r->user, .device_id = r->device, .with_room_id = true,
                     .now_ms = rt_wall_ms(), .reader_joined = true};
    json_t *ev = PQntuples(res) == 1 ? events_render(&v, res, 0) : NULL;
    PQclear(res);
    return ev;
}

/* GET /_matrix/client/v3/notifications */
static int get_notifications(atrium_req *r)
{
    if (!auth_request(r)) return ATRIUM_DONE;
    int64_t from = INT64_MAX, limit = NOTIFICATIONS_DEFAULT_LIMIT;
    const char *from_s = http_req_query(r, "from"), *limit_s = http_req_query(r, "limit");
    const char *only = http_req_query(r, "only");
    if (from_s && from_s[0] && atrium_parse_int64(from_s, 0, INT64_MAX, &from) < 0)
        return http_respond_error(r, 400, "M_INVALID_PARAM", "'from' is not a token of "
                                  "this endpoint");
    if (limit_s) {
        int rc = atrium_parse_int64(limit_s, 0, NOTIFICATIONS_MAX_LIMIT, &limit);
        if (rc == ATRIUM_E_INVAL || (rc == ATRIUM_E_LIMIT && limit != NOTIFICATIONS_MAX_LIMIT))
            return http_respond_error(r, 400, "M_INVALID_PARAM",
                                      "'limit' must be a non-negative integer");
    }
    bool highlight_only = only && strcmp(only, "highlight") == 0;
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    const char *p[4] = {r->user, rt_arena_printf(r->arena, "%lld", (long long)from),
                        rt_arena_printf(r->arena, "%lld", (long long)limit),
                        highlight_only ? "t" : "f"};
    PGresult *res = acc_q(c,
                          "SELECT n.id, n.event_id, n.room_id, n.actions::text, n.ts,"
                          " n.stream_pos <= coalesce((SELECT max(x.stream_pos) FROM receipts rc"
                          "  JOIN events x ON x.event_id = rc.event_id WHERE rc.room_id = n.room_id"
                          "  AND rc.user_id = n.user_id"
                          "  AND rc.receipt_type IN ('m.read', 'm.read.private')), 0)"
                          " FROM push_notifications n WHERE n.user_id = $1 AND n.id < $2::bigint"
                          " AND (NOT $4::boolean OR n.highlight)"
                          " ORDER BY n.id DESC LIMIT $3::int",
                          4, p);
    json_t *list = res ? json_array() : NULL;
    for (int i = 0; list && i < PQntuples(res); i++) {
        json_t *ev = notified_event(r, c, PQgetvalue(res, i, 1));
        if (!ev) continue;
        json_t *actions = json_loads(PQgetvalue(res, i, 3), 0, NULL);
        json_array_append_new(list, json_pack("{s:o, s:o, s:s, s:I, s:b}", "actions",
                                              actions ? actions : json_array(), "event", ev,
                                              "room_id", PQgetvalue(res, i, 2), "ts",
                                              (json_int_t)atoll(PQgetvalue(res, i, 4)), "read",
                                              PQgetvalue(res, i, 5)[0] == 't'));
    }
    http_db_checkin(c);
    if (!res) return acc_db_failed(r);
    json_t *body = list ? json_pack("{s:o}", "notifications", list) : NULL;
    int n = PQntuples(res);
    if (body && n > 0 && n == limit)
        json_object_set_new(body, "next_token", json_string(PQgetvalue(res, n - 1, 0)));
    PQclear(res);
    if (!body) return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    return http_respond_json(r, 200, body);
}

int notifications_routes(http_server *s)
{
    return client_route(s, "GET", "/_matrix/client/v3/notifications", get_notifications, 0);
}
