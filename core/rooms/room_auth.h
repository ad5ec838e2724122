/*
 * core/rooms/room_auth.h - the authorization rules of room versions 10 and 11 for events
 * this server writes: may this sender send this event, given the room's current state?
 *
 * The rules are the spec's ("Authorization rules" of the room versions), applied to the
 * current state of a local room: membership transitions (join, invite, leave, kick, ban,
 * unban, knock), the sender's membership, power levels for event types, state keys that
 * name users, and changes to m.room.power_levels itself. The caller gathers the state the
 * rules look at (room_auth_state) and turns a refusal into 403 M_FORBIDDEN. Pure: no
 * database, no request. Internal prefix: room_auth_.
 *
 * Not here: redaction rights (room_auth_may_redact, checked by the client API because room
 * versions 3+ leave it to the moment a redaction is applied), restricted-join signatures
 * and third-party invites (refused), and state resolution for federated rooms.
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

/* The state the rules read, borrowed from the caller. Contents are as the rules see them
 * (already redacted when the event was redacted). */
typedef struct room_auth_state {
    const room_version *version;
    const json_t *create;          /* the m.room.create event (whole PDU), NULL if none */
    const json_t *power_levels;    /* content of m.room.power_levels, NULL if none */
    const json_t *join_rules;      /* content of m.room.join_rules, NULL if none */
    const char *sender_membership; /* the sender's current membership, NULL if none */
    const char *target_membership; /* m.room.member only: the state_key user's, NULL if none */
    bool only_create;              /* the room's only event so far is m.room.create */
} room_auth_state;

/* The room's creator: content.creator (v10) or the create event's sender (v11). */
const char *room_auth_creator(const room_auth_state *st);
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

/* The state an event is checked against (its auth events, the state before it, or the
 * room's current state, as the caller chooses): the PDU at (type, state_key), or NULL.
 * Borrowed: it must stay valid until room_auth_check_event returns. */
typedef const json_t *(*room_state_get_fn)(void *ctx, const char *type, const char *state_key);

/* May this PDU (federation format, any supported room version) be accepted given the state
 * that get answers? true, or false with why. This is the entry point for events this
 * server did not write (federation), and the one state resolution's iterative auth checks
 * call; it reads the event's own fields (type, state_key, sender, content, prev_events)
 * and asks get for create, power levels, join rules and the memberships the rules need. */
bool room_auth_check_event(const room_version *v, const json_t *pdu, room_state_get_fn get,
                           void *ctx, char why[ROOM_AUTH_WHY_LEN]);

#endif
