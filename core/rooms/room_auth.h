/*
 * core/rooms/room_auth.h - the authorization rules of room versions 1 to 11: may this
 * sender send this event, given a state of the room?
 *
 * The rules are the spec's ("Authorization rules" of each room version): the create event,
 * the event's auth events, m.federate, m.room.aliases (v1-5), membership transitions
 * (join, restricted joins (v8+, knock_restricted v10+), invite, third-party invites with
 * their identity-server signature, leave, kick, ban, unban, knock (v7+)), the sender's
 * membership, m.room.third_party_invite, power levels for event types, state keys that
 * name users, changes to m.room.power_levels itself (string levels before v10, the
 * notifications map from v6) and, in v1-2, m.room.redaction. Each variant is a flag of
 * room_version (events.h), read where the rule is. Two callers: the local write path fills
 * room_auth_state from the room's current state and calls room_auth_allows; events from
 * other servers and state resolution call room_auth_check_event with the whole PDU and a
 * state getter. A refusal becomes 403 M_FORBIDDEN for a client, a rejection for a PDU.
 * Pure: no database, no request. Internal prefix: room_auth_.
 *
 * Not here: signature checks (the rules that say "if the event is not validly signed by
 * ..." are met by checking every server event_required_signers names before the rules
 * run), and redaction rights in v3+ (room_auth_may_redact: those versions leave them to
 * the moment a redaction is applied).
 */
#ifndef ATRIUM_CORE_ROOM_AUTH_H
#define ATRIUM_CORE_ROOM_AUTH_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/rooms/events.h"

/* Levels the spec defines for a room without m.room.power_levels, and the defaults of
 * missing keys in one. */
#define ROOM_AUTH_CREATOR_LEVEL_NO_PL 100
#define ROOM_AUTH_STATE_DEFAULT_NO_PL 0
#define ROOM_AUTH_STATE_DEFAULT 50
#define ROOM_AUTH_ACTION_DEFAULT 50 /* ban, kick, redact */
#define ROOM_AUTH_INVITE_DEFAULT 0
#define ROOM_AUTH_WHY_LEN 160

/* A state of the room (its auth events, the state before an event, or the room's current
 * state, as the caller chooses): the PDU at (type, state_key), or NULL. Borrowed: it must
 * stay valid until the check that called it returns. */
typedef const json_t *(*room_state_get_fn)(void *ctx, const char *type, const char *state_key);

/* The state the rules read, borrowed from the caller. Contents are as the rules see them
 * (already redacted when the event was redacted). Fields after only_create are optional
 * (zero for the local write path). */
typedef struct room_auth_state {
    const room_version *version;
    const json_t *create;          /* the m.room.create event (whole PDU), NULL if none */
    const json_t *power_levels;    /* content of m.room.power_levels, NULL if none */
    const json_t *join_rules;      /* content of m.room.join_rules, NULL if none */
    const char *sender_membership; /* the sender's current membership, NULL if none */
    const char *target_membership; /* m.room.member only: the state_key user's, NULL if none */
    bool only_create;              /* the room's only event so far is m.room.create */
    const json_t *pdu;             /* the whole event being checked, NULL when unknown: the
                                      rules then skip what only the PDU says (prev_events,
                                      room_id, event IDs of a v1-2 redaction) */
    room_state_get_fn get;         /* more of the same state: the authorising user of a
                                      restricted join, m.room.third_party_invite; NULL: events
                                      needing them are refused */
    void *get_ctx;
    const char *cosigner;          /* a server that adds its signature beside the sender's
                                      (a make_join template: this server co-signs the join
                                      its user authorises), NULL: the sender's server only */
} room_auth_state;

/* The room's creator: content.creator (v1-10) or the create event's sender (v11). */
const char *room_auth_creator(const room_auth_state *st);
/* A power level as room version v reads it into *out: an integer; before v10 also a string
 * holding one (optional surrounding whitespace, one optional sign, digits, leading zeros);
 * before v6 also a finite number, truncated toward zero. false for anything else. */
bool room_auth_level_value(const room_version *v, const json_t *val, int64_t *out);
/* Is id a user ID ("@localpart:server", at most EVENT_MAX_ID_BYTES)? */
bool room_auth_is_user_id(const char *id);

/* A user's power level. */
int64_t room_auth_user_level(const room_auth_state *st, const char *user_id);
/* The level needed to send an event of `type` (a state event when is_state). */
int64_t room_auth_event_level(const room_auth_state *st, const char *type, bool is_state);
/* The level of an action: "ban", "kick", "redact" or "invite". */
int64_t room_auth_action_level(const room_auth_state *st, const char *action);

/* May `sender` send this event? true, or false with why (a sentence for the client). */
bool room_auth_allows(const room_auth_state *st, const char *type, const char *state_key,
                      const char *sender, const json_t *content, char why[ROOM_AUTH_WHY_LEN]);

/* May `sender` redact an event sent by `original_sender`? Its own events always; others'
 * with the redact level. */
bool room_auth_may_redact(const room_auth_state *st, const char *sender,
                          const char *original_sender);

/* The server part of a user or room ID ("@a:example.org" -> "example.org"), or "". */
const char *room_auth_domain(const char *id);

/* ---- checking a whole event against a state --------------------------------------- */

/* May this PDU (federation format, any supported room version) be accepted given the state
 * that get answers? true, or false with why. This is the entry point for events this
 * server did not write (federation), and the one state resolution's iterative auth checks
 * call; it reads the event's own fields (type, state_key, sender, content, prev_events)
 * and asks get for create, power levels, join rules and the memberships the rules need. */
bool room_auth_check_event(const room_version *v, const json_t *pdu, room_state_get_fn get,
                           void *ctx, char why[ROOM_AUTH_WHY_LEN]);

/* Rule 2 of every version, on the event's own auth_events: auth[0..n) are the PDUs that
 * pdu's auth_events name, loaded by the caller (who rejects the event first when one of
 * them is missing or was itself rejected: this function cannot know that). true when no
 * (type, state_key) pair repeats, each is one that auth events selection picks for this
 * event (create, power levels, the sender's membership; for m.room.member the target's,
 * join rules for join/invite/knock, the m.room.third_party_invite of a third-party
 * invite's token, and from v8 the membership of a join's authorising user), an
 * m.room.create is among them, and each is of pdu's room. Always true for m.room.create.
 * false with why otherwise. */
bool room_auth_check_auth_events(const room_version *v, const json_t *pdu,
                                 const json_t *const *auth, size_t n,
                                 char why[ROOM_AUTH_WHY_LEN]);

/* A state getter over an array of PDUs (an event's auth events): pass room_auth_list_get
 * and a room_auth_list to room_auth_check_event. */
typedef struct room_auth_list {
    const json_t *const *events;
    size_t n;
} room_auth_list;
const json_t *room_auth_list_get(void *list, const char *type, const char *state_key);

#endif
