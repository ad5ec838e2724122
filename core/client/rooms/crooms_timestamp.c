/*
 * core/client/rooms/crooms_timestamp.c - GET /_matrix/client/v1/rooms/{roomId}/timestamp_to_event
 * (spec v1.6, Element's "jump to date"): the event nearest to ?ts= in direction ?dir=
 * among those the user may see, as {"event_id", "origin_server_ts"}.
 *
 * Which event is nearest is the room model's rule (core/rooms/rooms_jump.c); which events
 * the user may see is history visibility (core/rooms/rooms_vis.c), applied in the same
 * query through rooms_vis_window, so an event hidden from the user is never the answer
 * and never hides a visible one behind it. A room the user was never in is 403, as for
 * every reader; no visible event in that direction is 404 M_NOT_FOUND. What it does not
 * do: ask other servers when this server's copy of the room has a gap before ts (the
 * spec allows it; docs/architecture.md lists it under "Not yet").
 */
#include <stdlib.h>
#include <string.h>

#include "core/client/auth/auth.h"
#include "core/client/rooms/crooms_api.h"

/* GET /_matrix/client/v1/rooms/{roomId}/timestamp_to_event?ts=&dir= */
static int get_timestamp_to_event(atrium_req *r)
{
    crooms_reader rd = {0};
    if (!(rd.user = auth_request(r)) || !(rd.room = crooms_param_room(r))) return ATRIUM_DONE;
    int64_t ts;
    bool forward;
    if (!rooms_jump_parse(http_req_query(r, "ts"), http_req_query(r, "dir"), &ts, &forward))
        return http_respond_error(r, 400, "M_INVALID_PARAM",
                                  "'ts' must be a timestamp in ms and 'dir' \"f\" or \"b\"");
    if (!crooms_reader_open(r, &rd)) return ATRIUM_DONE;
    const char *cp[ROOMS_VIS_PARAMS], *vis_sql;
    PGresult *res = NULL;
    if (rooms_vis_window(r->arena, &rd.vis, INT64_MIN, INT64_MAX, false, 4, &vis_sql, cp)) {
        res = rooms_jump_candidates(rd.c, r->arena, rd.room, ts, forward, vis_sql,
                                    ROOMS_VIS_PARAMS, cp, 1);
        if (!res) return crooms_reader_close(r, &rd, 503, NULL);
    }
    if (!res || PQntuples(res) == 0) {
        PQclear(res);
        http_db_checkin(rd.c);
        return http_respond_error(r, 404, "M_NOT_FOUND", "No event you may see %s that time",
                                  forward ? "at or after" : "at or before");
    }
    json_t *body = json_pack("{s:s, s:I}", "event_id", PQgetvalue(res, 0, 0), "origin_server_ts",
                             (json_int_t)strtoll(PQgetvalue(res, 0, 1), NULL, 10));
    PQclear(res);
    return crooms_reader_close(r, &rd, 200, body);
}

int crooms_jump_routes(http_server *s)
{
    return client_route(s, "GET", "/_matrix/client/v1/rooms/{roomId}/timestamp_to_event",
                        get_timestamp_to_event, 0);
}
