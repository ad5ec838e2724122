/*
 * core/rooms/rooms_space.h - rooms as a space hierarchy shows them, for both APIs: a
 * room's summary (the public room list's fields, and for the hierarchy its version,
 * encryption and the rooms a restricted join rule allows), a space's children (its
 * m.space.child state, in the spec's order) and who may see a room there. The client's
 * GET /hierarchy (core/client/rooms/crooms_hierarchy.c) and the federation's
 * (core/federation/rooms/fed_rooms_hierarchy.c) are built on these; the walk itself and
 * asking other servers are theirs. Internal prefix: rooms_.
 */
#ifndef ATRIUM_CORE_ROOMS_SPACE_H
#define ATRIUM_CORE_ROOMS_SPACE_H

#include <jansson.h>
#include <stdbool.h>

#include "core/rooms/rooms.h"
#include "core/store/db.h"

#define ROOMS_SPACE_MAX_CHILDREN 100  /* m.space.child events read of one space */
#define ROOMS_SPACE_MAX_ORDER_CHARS 50 /* a longer `order` is not valid (the spec) */
#define ROOMS_SPACE_MAX_ALLOWED 16    /* allow entries of a join rule honoured */

/* The summary of a room known here, from its current state: room_id, num_joined_members,
 * join_rule ("invite" when unset), guest_can_join, world_readable, and when set name,
 * topic, avatar_url, canonical_alias, room_type. With extended (the hierarchy's chunk,
 * spec v1.15): also room_version, encryption when set, allowed_room_ids (the m.room_membership
 * rooms of a restricted or knock_restricted join rule; empty otherwise). A redacted state
 * event counts as unset. 0 with *out a new object, ATRIUM_E_NOTFOUND (unknown room),
 * ATRIUM_E_DB, ATRIUM_E_NOMEM. */
int rooms_summary(PGconn *c, const char *room_id, bool extended, json_t **out);

/* The children of space room_id: its current m.space.child events whose content has a
 * non-empty `via` of strings (and, with suggested_only, `suggested` true), as stripped
 * events {type, state_key, content, sender, origin_server_ts}, ordered as the spec says:
 * those with a valid `order` (at most ROOMS_SPACE_MAX_ORDER_CHARS characters, each
 * 0x20-0x7E) first by it, then by the event's origin_server_ts, then by room ID; at most
 * ROOMS_SPACE_MAX_CHILDREN (the first by that order). 0 with *out a new array, ATRIUM_E_DB. */
int rooms_space_children(PGconn *c, const char *room_id, bool suggested_only, json_t **out);
/* The same rule over stripped m.space.child events another server sent (anything that is
 * not one, with a room ID as state_key, a sender and an integer origin_server_ts, is
 * dropped): a new array {type, state_key, content, sender, origin_server_ts}, or NULL on
 * out-of-memory. */
json_t *rooms_space_children_filter(const json_t *stripped, bool suggested_only);
/* Is an `order` value valid (a string of 1 .. ROOMS_SPACE_MAX_ORDER_CHARS printable ASCII
 * characters)? Pure. */
bool rooms_space_order_ok(const json_t *order);

/* Is room_id's current state this server's to answer from: one of our users joined? 1, 0,
 * -1 database. A room none of our users is in may have moved on without us. */
int rooms_space_resident(PGconn *c, const char *room_id);

/* Who may see a room in a hierarchy (the spec's list for GET /hierarchy, and for a server
 * the same with "one of its users", as Synapse does): a member, joined or invited (for a
 * user, also a pending invite to a room this server is not in); anyone when
 * the join rule is public, knock or knock_restricted, or history_visibility is
 * world_readable; under restricted, a member of one of allowed_room_ids. summary is the
 * room's extended rooms_summary. Exactly one of user_id and server is given. 1, 0, -1
 * database. */
int rooms_space_may_see(PGconn *c, const json_t *summary, const char *user_id,
                        const char *server);

/* ---- restricted joins (room versions 8+; knock_restricted 10+) ---------------------- */

/* Who vouches for user_id's join of room_id, a room this server is resident in, when its
 * join rule is restricted (or knock_restricted): a user of this server joined to the room
 * whose power level reaches the invite level (the highest such, then the first by ID).
 * ROOMS_OK with out "" when the join needs nobody (another join rule, a version without
 * restricted joins, or the user already invited or joined); ROOMS_OK with out the
 * authoriser when user_id is joined to one of the rule's m.room_membership rooms as this
 * server sees them; ROOMS_E_FORBIDDEN when it is joined to none of those this server is in;
 * ROOMS_E_UNABLE_TO_AUTHORISE when this server is in none of them (it cannot tell);
 * ROOMS_E_UNABLE_TO_GRANT when none of our users may invite; ROOMS_E_NOT_FOUND (unknown
 * room), ROOMS_E_DB. e set on failures. */
#define ROOMS_USER_ID_BYTES 256
int rooms_restricted_authoriser(PGconn *c, const char *room_id, const char *user_id,
                                char out[ROOMS_USER_ID_BYTES], rooms_err *e);

#endif
