/*
 * core/rooms/events_graph.h - the event graph of a room beside its stream: prev and auth
 * edges, forward extremities, events kept outside the timeline, and the state each
 * federated event was authorized against (migration 4 of owner "rooms", rooms.c).
 *
 * The stream (events.stream_pos) stays the order clients read in: an event is appended to
 * it once accepted, whoever created it. The graph is what other servers reason with: an
 * event's prev_events are the room's forward extremities when it was created (several
 * after servers sent concurrently), its depth one more than the deepest of them, and its
 * auth chain follows event_auth_edges. Events that are not part of the timeline live in
 * event_outliers with a status: 'outlier' (auth chain and state of a room joined over
 * federation, invites to it), 'soft_failed' (valid but refused by the current state, kept
 * so other servers' references resolve) and 'rejected' (failed the auth rules: kept only
 * so it is not fetched again). Client readers never read that table.
 *
 * The state before an event: for an event of the stream, the newest state event per
 * (type, state_key) at an earlier position (the line), unless event_state_before names a
 * snapshot (state_snapshots: a set of event IDs, shared by every event with the same
 * state), which federated events get: the state they were authorized against.
 * remote_invites keeps the stripped state sent with an invite to a room this server is not
 * in (the invite itself an outlier, the membership a row of memberships). Internal
 * prefix: rooms_graph_.
 */
#ifndef ATRIUM_CORE_ROOMS_EVENTS_GRAPH_H
#define ATRIUM_CORE_ROOMS_EVENTS_GRAPH_H

#include <jansson.h>
#include <libpq-fe.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/rooms/events.h"

#define ROOMS_GRAPH_MAX_PREV_EVENTS 10   /* prev_events of an event this server creates */
#define ROOMS_GRAPH_ID_BYTES (EVENT_MAX_ID_BYTES + 1) /* any room version's event ID */
#define ROOMS_GRAPH_MAX_AUTH_CHAIN 20000 /* events of an auth chain served or read */
#define ROOMS_GRAPH_MAX_STATE 50000      /* events of one room state served or read */

/* The forward extremities of a room, deepest first. */
typedef struct rooms_graph_tips {
    char ids[ROOMS_GRAPH_MAX_PREV_EVENTS][ROOMS_GRAPH_ID_BYTES];
    int n;
    int64_t max_depth; /* of the deepest; 0 when the room has no event yet */
} rooms_graph_tips;

/* Read room_id's forward extremities (at most ROOMS_GRAPH_MAX_PREV_EVENTS, the deepest).
 * 0, or -1 on a database failure (logged). */
int rooms_graph_tips_load(PGconn *c, const char *room_id, rooms_graph_tips *out);

/* Record the prev and auth edges of a stored event (stream or outlier). Inside the
 * caller's transaction. 0 or -1. */
int rooms_graph_record_edges(PGconn *c, const char *room_id, const char *event_id,
                             const json_t *pdu);

/* Room versions 1 and 2: make the plain event IDs of a new event's prev_events and
 * auth_events the [event ID, {"sha256": reference hash}] pairs the format asks for, each
 * hash of the stored event it names (rooms_graph_load). Other versions: nothing. 0, or -1
 * when a named event is not stored, not canonical, or the database failed (logged). */
int rooms_graph_refs_as_pairs(PGconn *c, const room_version *v, json_t *pdu);

/* A new event of the stream became a forward extremity: its prev_events no longer are.
 * An event some stored event already names as a prev_event does not become one. 0 or -1. */
int rooms_graph_advance(PGconn *c, const char *room_id, const char *event_id,
                        const json_t *pdu);

/* Store the state event IDs (a JSON array of strings) as a snapshot of room_id (shared
 * when the same set exists) and record it as the state before event_id. 0 or -1. */
int rooms_graph_set_state_before(PGconn *c, const char *room_id, const char *event_id,
                                 const json_t *state_ids);

/* The state before event_id (an event of the stream or one with a snapshot) as a new
 * JSON array of event IDs into *out. 1 found, 0 unknown event (or an outlier without a
 * snapshot), -1 database. */
int rooms_graph_state_before(PGconn *c, const char *room_id, const char *event_id,
                             json_t **out);

/* The auth chain of the events in ids (a JSON array): every event reachable over auth
 * edges, not the events themselves, as a new JSON array of IDs into *out (at most
 * ROOMS_GRAPH_MAX_AUTH_CHAIN). 0 or -1. */
int rooms_graph_auth_chain(PGconn *c, const json_t *ids, json_t **out);

/* Where a stored event is. */
typedef enum rooms_graph_where {
    ROOMS_GRAPH_ABSENT = 0,
    ROOMS_GRAPH_STREAM,      /* events: accepted, in the timeline */
    ROOMS_GRAPH_OUTLIER,     /* event_outliers 'outlier' */
    ROOMS_GRAPH_SOFT_FAILED, /* event_outliers 'soft_failed' */
    ROOMS_GRAPH_REJECTED,    /* event_outliers 'rejected' */
} rooms_graph_where;

/* The stored PDU of event_id (as other servers get it: redacted when it was redacted;
 * signatures kept), its room (room_id_out, may be NULL, ROOMS_GRAPH_ID_BYTES) and where it
 * is. A new object or NULL (absent, or a database failure: *where_out says
 * ROOMS_GRAPH_ABSENT and *db_failed is set). */
json_t *rooms_graph_load(PGconn *c, const char *event_id, char *room_id_out,
                         rooms_graph_where *where_out, bool *db_failed);

/* The stored PDUs of ids (a JSON array of IDs), as rooms_graph_load gives them, in the
 * given order, unknown and rejected ones left out: a new array into *out. 0 or -1. */
int rooms_graph_load_many(PGconn *c, const json_t *ids, json_t **out);

/* Keep pdu outside the timeline with a status ('outlier', 'soft_failed', 'rejected'),
 * why (may be NULL) and the server it came from. An event already stored (anywhere) is
 * left as it is. Inside the caller's transaction. 0 or -1. */
int rooms_graph_store_outlier(PGconn *c, const char *room_id, const char *event_id,
                              const json_t *pdu, const char *status, const char *why,
                              const char *origin);

#endif
