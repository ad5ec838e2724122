/*
 * core/client/sync/sync_legacy.h - reshaping a /sync response for the deprecated
 * /initialSync, /rooms/{roomId}/initialSync and /events (sync_legacy.c). Each returns a new
 * object (the caller owns it) and leaves resp alone.
 */
#ifndef ATRIUM_CORE_SYNC_LEGACY_H
#define ATRIUM_CORE_SYNC_LEGACY_H

#include <jansson.h>

json_t *sync_legacy_initial(const json_t *resp);
/* NULL when the user is neither joined to nor invited to room_id. */
json_t *sync_legacy_room(const json_t *resp, const char *room_id);
json_t *sync_legacy_events(const json_t *resp, const char *start);

#endif
