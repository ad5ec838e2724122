/*
 * core/client/rooms/crooms_relations.h - relations between events (spec "Relationships between
 * events", "Threading", "Event replacements"): what the room files share to index them at
 * write time, to bundle their aggregations into the events every reader serves, and to
 * register the relation endpoints.
 *
 * An event is a relation when its content has `m.relates_to` with a string `rel_type` and
 * a string `event_id` (m.annotation adds a string `key`). The write path records each one
 * in the table event_relations (migration "rooms" 2) and drops the row again when the
 * relation event is redacted, so a redacted relation never aggregates. crooms_bundle.c owns
 * the indexing and which aggregations are bundled; crooms_relations.c owns the endpoints
 * (/relations, /threads). Internal prefixes: crooms_bundle_ (crooms_bundle.c) and
 * crooms_relations_ (crooms_relations.c); the REL_ constants name the spec's relation types.
 */
#ifndef ATRIUM_CORE_ROOMS_RELATIONS_H
#define ATRIUM_CORE_ROOMS_RELATIONS_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/client/rooms/crooms_api.h"

#define REL_BUNDLE_MAX_REFERENCES 50 /* event IDs in one event's m.reference chunk */

/* rooms_relation, rooms_bundle_parse and rooms_bundle_index (the write path's side) are
 * the room model's: core/rooms/rooms_tx.h. */

/* Add unsigned."m.relations" to the rendered events of array `events` (all of room_id,
 * rendered with v): m.thread {latest_event, count, current_user_participated},
 * m.replace (the most recent valid replacement event, whole) and m.reference {chunk:
 * [{event_id}], at most REL_BUNDLE_MAX_REFERENCES}. Annotations are not bundled (spec
 * v1.7 on). Only relation events vis shows count. A constant number of queries per call,
 * whatever the number of events. ROOMS_OK or ROOMS_E_DB (events are then unchanged or
 * partly bundled; the caller answers 503). conn held by the caller. */
int crooms_bundle_add(PGconn *c, rt_arena *a, const events_view *v, const char *room_id,
                     const rooms_vis *vis, json_t *events);

/* An integer query parameter's text (NULL: absent) into *out: def when absent, else
 * clamped to [1, max] (an empty page would end a pagination); false when it is not a
 * non-negative decimal integer. Pure. */
bool crooms_relations_limit(const char *text, int64_t def, int64_t max, int64_t *out);

/* Route registration (crooms_relations.c): the relations and threads endpoints. */
int crooms_relations_routes(http_server *s);

#endif
