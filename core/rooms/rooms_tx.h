/*
 * core/rooms/rooms_tx.h - the room model's write path: one transaction writing events into
 * one room (rooms_tx.c), the events it is given, the failures it ends in and how they
 * read as Matrix errors, the stripped state shown to those outside a room
 * (state_pdus.c), and the hooks through which the write path tells the layers above it
 * what it did.
 *
 * The client's endpoints (core/client/rooms/) and the federation's room endpoints
 * (core/federation/rooms/) both write through these functions, so neither depends on the
 * other. What a stored event means beyond the room model - other servers must receive
 * it, the outbound sender should run, /sync's waiters should wake, a public room list
 * should change, the event should be signed as this server - belongs to higher layers,
 * which register a hook here at start-up (the way the federation's transport takes its
 * PDU handler, core/federation/transport/fed_txn.h). A hook not registered is skipped
 * (unit tests, CLI subcommands): nothing is signed, queued or woken. Internal prefix:
 * rooms_tx_ (with rooms_event_seal, rooms_load_auth and rooms_bundle_ of the write path).
 */
#ifndef ATRIUM_CORE_ROOMS_TX_H
#define ATRIUM_CORE_ROOMS_TX_H

#include <jansson.h>
#include <libpq-fe.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/http/http.h"
#include "core/rooms/events_graph.h"
#include "core/rooms/rooms.h"

#define ROOMS_MAX_INVITES 100 /* createRoom's invite list; users one transaction wakes */

/* ---- failures as Matrix errors ------------------------------------------------------ */

/* [req] Answer the failure (status and errcode by code, error = why). Returns ATRIUM_DONE. */
int rooms_fail(atrium_req *r, const rooms_err *e);

/* ---- transactions ------------------------------------------------------------------- */

/* One transaction writing events into one room, holding the room's row lock. */
typedef struct room_tx {
    PGconn *c;
    const char *room_id;
    const room_version *ver;
    char last_event_id[EVENT_ID_LEN]; /* "" before the create event */
    int64_t depth;                    /* of the deepest extremity, 0 before the create event */
    rooms_graph_tips tips;            /* the forward extremities: the next prev_events */
    const char *wake_users[ROOMS_MAX_INVITES + 2]; /* users to wake beside the members */
    bool listing_changed; /* an event changed what a public room list shows of the room */
    int n_wake;
    rt_arena *arena;
} room_tx;

typedef struct room_new_event {
    const char *sender;
    const char *type;
    const char *state_key; /* NULL: not a state event */
    json_t *content;       /* borrowed; must be canonical-ready (cjson_normalize'd) */
    const char *redacts;   /* m.room.redaction: the target */
    const char *txn_device, *txn_id; /* send idempotency, or NULL */
    const char *txn_key;             /* the idempotency key when not txn_id ("redact|<txn>") */
} room_new_event;

/* BEGIN and lock an existing room. ROOMS_OK, ROOMS_E_NOT_FOUND, ROOMS_E_DB (e set; the
 * transaction is rolled back on failure). */
int rooms_tx_begin(room_tx *tx, PGconn *c, rt_arena *arena, const char *room_id, rooms_err *e);
/* BEGIN and insert a new room row. */
int rooms_tx_begin_new(room_tx *tx, PGconn *c, rt_arena *arena, const char *room_id,
                       const room_version *ver, const char *creator, rooms_err *e);
/* Authorize, build and store one event (current state, memberships, redaction, the
 * transaction ID updated). id_out gets its event ID. On failure the caller rolls back. */
int rooms_tx_append(room_tx *tx, const room_new_event *ev, char id_out[EVENT_ID_LEN],
                    rooms_err *e);
/* Authorize an event against the current state and build its PDU (prev_events, auth
 * events, depth) without hash, ID or signature: the template other servers complete
 * (make_join, make_leave). *pdu_out is new. ROOMS_OK, ROOMS_E_FORBIDDEN, ROOMS_E_DB. */
int rooms_tx_template(room_tx *tx, const room_new_event *ev, json_t **pdu_out, rooms_err *e);
/* Append an event another server created (already checked: format, signatures, hashes,
 * auth) to the stream, with everything that follows (current state, memberships, graph,
 * the state it was authorized against when state_before, a JSON array of event IDs, is
 * given); origin is the server that delivered it (NULL: created here, queued for the
 * room's other servers unless flags say otherwise). A redaction takes effect only when
 * its sender may redact the target. On failure the caller rolls back. */
enum {
    ROOMS_PDU_HISTORICAL = 1, /* state of a room joined over federation: no forward
                               * extremity, queued for nobody */
    ROOMS_PDU_NO_QUEUE = 2,   /* created here but delivered by another server (our
                               * send_join's join): queued for nobody */
    ROOMS_PDU_BACKFILLED = 4, /* history older than the stream (/backfill): at a position
                               * below every other (rooms_backfill_seq), no current state,
                               * membership row or forward extremity, queued for nobody */
};
int rooms_tx_append_pdu(room_tx *tx, json_t *pdu, const char *event_id, const char *origin,
                        const json_t *state_before, unsigned flags, rooms_err *e);
/* Seal a built event as this server: content hash, event ID (into id_out), this server's
 * signature over the redacted event (by the signer hook; none without one: unit tests), and
 * the size limit checked on the signed event. ROOMS_OK, ROOMS_E_TOO_LARGE ("The event is
 * N bytes; ..."), ROOMS_E_BAD_JSON (e set). */
int rooms_event_seal(const room_version *v, json_t *pdu, char id_out[EVENT_ID_LEN], rooms_err *e);
/* COMMIT (after telling the listing hook, when the transaction changed what a public room
 * list shows), then tell the commit hooks: the outbound sender, and the wake-ups of the
 * room's members and of the users the events named. */
int rooms_tx_commit(room_tx *tx, rooms_err *e);
void rooms_tx_rollback(room_tx *tx);

/* The room's state the auth rules read for a sender and a target (target may be NULL);
 * JSON objects are owned by *holder (json_decref it). ROOMS_OK or ROOMS_E_DB. Also gives
 * the event IDs for auth_events. */
typedef struct room_auth_load {
    room_auth_state st;
    json_t *holder;
    const char *create_id, *pl_id, *jr_id, *sender_member_id, *target_member_id;
    const char *authoriser_member_id; /* a restricted join's authorising user's (v8+) */
} room_auth_load;
int rooms_load_auth(PGconn *c, const char *room_id, const room_version *ver,
                    const char *sender, const char *target, room_auth_load *out);

/* Does a state event of this type change what a public room list shows of its room? */
bool rooms_listing_type(const char *type);

/* ---- relations at write time ------------------------------------------------------- */

/* The spec's relation types. */
#define REL_THREAD "m.thread"
#define REL_REPLACE "m.replace"
#define REL_REFERENCE "m.reference"
#define REL_ANNOTATION "m.annotation"

/* What m.relates_to says. Pointers borrow from the content passed to rooms_bundle_parse. */
typedef struct rooms_relation {
    const char *rel_type, *event_id;
    const char *key; /* m.annotation's aggregation key, or NULL */
} rooms_relation;

/* Is content (an event's content object, may be NULL) a relation? true with *out filled
 * when m.relates_to is an object with a non-empty string rel_type and event_id, each at
 * most EVENT_MAX_ID_BYTES long; key is set only for m.annotation with a string key. Pure;
 * any thread. */
bool rooms_bundle_parse(const json_t *content, rooms_relation *out);

/* Inside the write path's transaction, after the event's row is stored: record ev in
 * event_relations when it is a relation, and when it is a redaction forget the relation
 * it redacts. pos is the event's stream position (decimal text). false after a logged
 * database failure (the caller rolls back). */
bool rooms_bundle_index(PGconn *c, const char *pos, const char *event_id, const char *room_id,
                        const room_new_event *ev);

/* ---- stripped state (state_pdus.c) -------------------------------------------------- */

/* The stripped state of a room for someone outside it (an invite's invite_room_state, a
 * knock's knock_room_state): its descriptive events found in map (a state map of
 * state_pdus.h: create, join rules, name, avatar, canonical alias, encryption, topic) and,
 * when member is not NULL, that user's member event, each as {type, state_key, sender,
 * content}. A new array (never NULL). */
json_t *rooms_stripped_state(const json_t *map, const char *member);
/* ev (an event, may be NULL) reduced to the fields of a stripped state event. A new
 * object, NULL when ev lacks one of them. */
json_t *rooms_stripped_event(const json_t *ev);

/* ---- hooks of the layers above ------------------------------------------------------ */

/* Each setter is called once, on the main thread, during start-up before any request is
 * served (the hooks are read without a lock afterwards); NULL clears. */

/* Sign obj (a redacted event) as this server: 0, ATRIUM_E_STOPPED (no key: the event goes
 * unsigned), or another negative error (the write fails). The federation's transport. */
typedef int (*rooms_tx_sign_fn)(json_t *obj);
void rooms_tx_set_signer(rooms_tx_sign_fn sign);

/* Queue event_id, created here, for the room's other servers, inside the transaction that
 * stores it: 0, or -1 (the write rolls back). After the commit, kick the sender. The
 * federation's room endpoints (core/federation/rooms/fed_rooms_queue.h). */
typedef int (*rooms_tx_queue_fn)(PGconn *c, const char *room_id, const char *event_id);
typedef void (*rooms_tx_kick_fn)(void);
void rooms_tx_set_outbound(rooms_tx_queue_fn queue, rooms_tx_kick_fn kick);

/* Inside the transaction, before COMMIT, when an event changed what a public room list
 * shows of room_id: 0, or -1 (the write rolls back). The client's directory seam. */
typedef int (*rooms_tx_listing_fn)(PGconn *c, const char *room_id);
void rooms_tx_set_listing_hook(rooms_tx_listing_fn changed);

/* After the commit: wake those waiting on room_id's members (conn is the transaction's,
 * idle again), and each user an event of the transaction named. /sync's notifier. */
typedef void (*rooms_tx_wake_room_fn)(PGconn *c, const char *room_id);
typedef void (*rooms_tx_wake_user_fn)(const char *user_id);
void rooms_tx_set_wake(rooms_tx_wake_room_fn room, rooms_tx_wake_user_fn user);
/* Wake user_id through that hook, for a change stored outside a room transaction (an
 * outlier: an invite or knock of a room this server is not in). Any thread. */
void rooms_tx_wake_user(const char *user_id);

#endif
