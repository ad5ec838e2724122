/*
 * core/rooms/rooms_jump.c - jumping to a date: the one rule both APIs' timestamp_to_event
 * answer with (core/client/rooms/crooms_timestamp.c for clients, core/federation/rooms/
 * fed_rooms_serve.c for other servers), and the parsing of its two query parameters.
 *
 * The event "closest to ts in a direction" is, among the room's timeline events (the
 * events table: outliers, soft-failed and rejected events live in event_outliers and are
 * never an answer), forward the one with the smallest origin_server_ts >= ts, backward the
 * one with the largest <= ts; events with one timestamp are ordered by stream position in
 * the same direction. This is Synapse's rule (it orders by origin_server_ts and ignores
 * outliers and rejected events). Who may see which event is the caller's condition: this
 * file knows no reader. It does not ask other servers when this server's copy of the room
 * has a gap (docs/architecture.md, "Not yet").
 */
#include <stdio.h>
#include <string.h>

#include "atrium/parse.h"
#include "core/rooms/rooms.h"

bool rooms_jump_parse(const char *ts_s, const char *dir_s, int64_t *ts, bool *forward)
{
    if (!dir_s || (strcmp(dir_s, "f") != 0 && strcmp(dir_s, "b") != 0)) return false;
    if (atrium_parse_int64(ts_s, 0, INT64_MAX, ts) != 0) return false;
    *forward = dir_s[0] == 'f';
    return true;
}

PGresult *rooms_jump_candidates(PGconn *c, rt_arena *a, const char *room_id, int64_t ts,
                                bool forward, const char *cond, int n_cp,
                                const char *const *cp, int limit)
{
    if (n_cp > ROOMS_JUMP_MAX_COND_PARAMS) return NULL;
    const char *p[3 + ROOMS_JUMP_MAX_COND_PARAMS] = {room_id,
                                                     rt_arena_printf(a, "%lld", (long long)ts),
                                                     rt_arena_printf(a, "%d", limit)};
    for (int i = 0; i < n_cp; i++) p[3 + i] = cp[i];
    const char *sql = rt_arena_printf(
        a,
        "SELECT e.event_id, e.origin_server_ts, e.stream_pos FROM events e"
        " WHERE e.room_id = $1 AND e.origin_server_ts %s $2::bigint%s"
        " ORDER BY e.origin_server_ts %s, e.stream_pos %s LIMIT $3::int",
        forward ? ">=" : "<=", cond ? cond : "", forward ? "ASC" : "DESC",
        forward ? "ASC" : "DESC");
    if (!p[1] || !p[2] || !sql) return NULL;
    return rooms_q(c, sql, 3 + n_cp, p, NULL);
}
