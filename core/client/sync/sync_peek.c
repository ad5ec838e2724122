/*
 * core/client/sync/sync_peek.c - GET /events?room_id= for a user not joined to the room: a
 * peek into a room whose history visibility is world_readable, as Synapse serves it (403
 * otherwise). The chunk holds the room's timeline events after `from` that the visibility
 * rule shows, oldest first; nothing else (no presence, typing or receipts: they are the
 * joined users' streams). When there are none it parks like /events, on the room's own
 * notifier entry: notifier_wake_room wakes the key room_id beside the members, so a peeker
 * is woken by every event of the room without being one of its users. The entry is made
 * only once the room is known to be world_readable, so no client can grow the notifier's
 * table with made-up room IDs. Decisions: docs/adr/0020-legacy-sync-follows-synapse.md.
 */
#include <stdio.h>
#include <string.h>

#include "core/client/sync/notifier.h"
#include "core/client/sync/sync.h"
#include "core/client/sync/sync_legacy.h"
#include "core/client/rooms/crooms_api.h"

#define PEEK_MAX_EVENTS 100 /* events in one answer; `end` then stops at the last one */
#define PEEK_ROOM_ID_MAX 256

int sync_events_peek(atrium_req *r, const char *user, const char *room_id, int64_t since,
                     int64_t deadline_ms)
{
    if (!rooms_room_id_ok(room_id))
        return http_respond_error(r, 400, "M_INVALID_PARAM", "'room_id' is not a room ID");
    crooms_reader rd = {.user = user, .room = room_id};
    if (!crooms_reader_open(r, &rd)) return ATRIUM_DONE; /* 404 unknown room, 403 */
    if (!rd.vis.world_readable) {
        http_db_checkin(rd.c);
        return http_respond_error(r, 403, "M_FORBIDDEN", "Non-joined access not allowed");
    }
    /* The room's entry exists from here on, so a write after the read below is counted. */
    struct atrium_event *ev = notifier_event_for(r->srv, room_id);
    uint64_t wakes_before = notifier_wake_count(room_id);
    int64_t upto = sync_stream_upto(rd.c), last = 0;
    if (since > upto) since = upto; /* a token from a newer database: start there */
    json_t *chunk = json_array();
    int n = upto < 0 ? ROOMS_E_DB : crooms_reader_events(r, &rd, since, upto, PEEK_MAX_EVENTS, chunk, &last);
    http_db_checkin(rd.c);
    if (n < 0 || !chunk) {
        json_decref(chunk);
        return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    }
    bool may_wait = r->run_reason != ATRIUM_RUN_DEADLINE && r->run_reason != ATRIUM_RUN_SHUTDOWN &&
                    deadline_ms > rt_now_ms();
    if (n == 0 && may_wait && ev) {
        char room[PEEK_ROOM_ID_MAX];
        snprintf(room, sizeof(room), "%s", room_id); /* r may be gone once parked */
        if (susp_park(r, ev, deadline_ms) == 0) {
            json_decref(chunk);
            if (notifier_wake_count(room) != wakes_before) notifier_wake_local(room);
            return ATRIUM_PARKED;
        }
    }
    /* A full chunk ends at its last event: the next poll goes on from there. */
    int64_t end = n == PEEK_MAX_EVENTS ? last : upto;
    return http_respond_json(r, 200, json_pack("{s:s, s:s, s:o}", "start", crooms_token(r, since),
                                               "end", crooms_token(r, end), "chunk", chunk));
}
