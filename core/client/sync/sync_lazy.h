/*
 * core/client/sync/sync_lazy.h - which member events lazy loading already sent to a device,
 * so a sync does not send them again (the spec's include_redundant_members: false).
 * Internal prefix: sync_lazy_.
 */
#ifndef ATRIUM_CORE_SYNC_LAZY_H
#define ATRIUM_CORE_SYNC_LAZY_H

#include <jansson.h>
#include <stdbool.h>

/* The device starts from nothing (an initial or full_state sync): forget what it was
 * sent. Any thread. */
void sync_lazy_forget_device(const char *user_id, const char *device_id);
/* Drop from `state` the m.room.member events the device was already sent for room_id (the
 * same event for the same member), unless room_full (the device gets the room's whole
 * state: it is sent everything and the room's record starts again). Then record the member
 * events of `state` and `timeline` as sent. Any thread. */
void sync_lazy_filter_and_record(const char *user_id, const char *device_id, const char *room_id,
                                 bool room_full, json_t *state, const json_t *timeline);

#endif
