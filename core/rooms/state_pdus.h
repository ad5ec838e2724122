/*
 * core/rooms/state_pdus.h - a room state in memory, as the auth rules and state resolution
 * read it: (type, state_key) -> PDU, held in one JSON object, with a getter of the shape
 * room_auth_check_event takes (room_state_get_fn). (state_map.h is the other form, type
 * and state key to event ID, that state resolution takes.)
 *
 * Pure except rooms_pdus_current / _of_ids, which read the database. Internal prefix:
 * rooms_pdus_.
 */
#ifndef ATRIUM_CORE_ROOMS_STATE_PDUS_H
#define ATRIUM_CORE_ROOMS_STATE_PDUS_H

#include <jansson.h>
#include <libpq-fe.h>
#include <stdbool.h>

#include "core/rooms/events.h"

/* A new, empty map. */
json_t *rooms_pdus_new(void);
/* Put a state event (borrowed: a reference is taken) at its (type, state_key); a PDU that
 * is not a state event is ignored. */
void rooms_pdus_put(json_t *map, json_t *pdu);
/* The PDU at (type, state_key), or NULL: a room_state_get_fn over a map (ctx). */
const json_t *rooms_pdus_get(void *map, const char *type, const char *state_key);
/* The event IDs of a map's events (a new array); ids are computed with v. */
json_t *rooms_pdus_ids(const room_version *v, const json_t *map);

/* The room's current state (redacted events as redacted) into a new map, and (ids_out
 * not NULL) its event IDs into a new array. 0 or -1 (database). */
int rooms_pdus_current(PGconn *c, const char *room_id, json_t **map_out, json_t **ids_out);
/* A map of the stored state events named by ids (stream or outliers; unknown ones left
 * out). 0 or -1. */
int rooms_pdus_of_ids(PGconn *c, const json_t *ids, json_t **map_out);

#endif
