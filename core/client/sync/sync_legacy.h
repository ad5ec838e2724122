/*
 * core/client/sync/sync_legacy.h - reshaping a /sync response for the deprecated
 * /initialSync, /rooms/{roomId}/initialSync and /events (sync_legacy.c). Each returns a new
 * object (the caller owns it) and leaves resp alone. And the one legacy answer not made
 * from a /sync response: a peek through /events (sync_peek.c).
 */
#ifndef ATRIUM_CORE_SYNC_LEGACY_H
#define ATRIUM_CORE_SYNC_LEGACY_H

#include <jansson.h>
#include <stdint.h>

#include "core/http/http.h"

/* Who asks, and what the reshaping needs beyond the sync response. */
typedef struct legacy_view {
    const char *user;
    const json_t *listed; /* {room_id: true} for the rooms listed in the room directory */
} legacy_view;

/* /initialSync: the rooms of rooms.join, rooms.invite and rooms.leave (there when the
 * sync was asked for them: archived=true), top-level presence, account_data and receipts
 * (the joined rooms' m.receipt events, each naming its room). */
json_t *sync_legacy_initial(const json_t *resp, const legacy_view *v);
/* NULL when the room is in none of rooms.join, rooms.invite, rooms.leave. Its presence:
 * of its joined members; its receipts: its m.receipt events (joined rooms only). */
json_t *sync_legacy_room(const json_t *resp, const char *room_id, const legacy_view *v);
json_t *sync_legacy_events(const json_t *resp, const char *start);

/* [req] GET /events?room_id= for a user not joined to room_id (sync_peek.c): the room's
 * events after position since while it is world_readable (403 otherwise, 404 for an
 * unknown room, 400 for a malformed ID), parking until deadline_ms (monotonic; 0: answer
 * at once) when there are none. Returns what the handler returns. */
int sync_events_peek(atrium_req *r, const char *user, const char *room_id, int64_t since,
                     int64_t deadline_ms);

#endif
