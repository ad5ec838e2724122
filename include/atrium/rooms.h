/*
 * atrium/rooms.h - the interface "rooms/1": what the core's room model tells plugins
 * about local rooms (host->iface_get(ATRIUM_ROOMS_IFACE, sizeof(atrium_rooms))).
 *
 * The core provides it; plugins such as the room directory read a room's summary and a
 * user's standing in a room through it instead of reading the core's tables, so the
 * tables can change without breaking them. Every function takes a connection the caller
 * borrowed (host->db_acquire) and may be called from any thread; those of version 0 may
 * run inside the caller's transaction and never begin or end one (a later member says
 * when it differs). Growth rule: members are appended; check ATRIUM_ROOMS_HAS(r, member)
 * before using a newer one (look the interface up with ATRIUM_ROOMS_V0_SIZE).
 */
#ifndef ATRIUM_ROOMS_H
#define ATRIUM_ROOMS_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "atrium/abi.h"

#define ATRIUM_ROOMS_IFACE "rooms/1"
#define ATRIUM_ROOMS_VERSION 1 /* minor version of rooms/1 */
#define ATRIUM_MEMBERSHIP_LEN 16 /* "join", "invite", "leave", "ban", "knock", "" */

typedef struct atrium_rooms {
    uint32_t size;    /* sizeof(atrium_rooms) in the core */
    uint32_t version; /* ATRIUM_ROOMS_VERSION */
    /* The room as a public room list shows it, from its current state: a new JSON object
     * {room_id, num_joined_members, join_rule, guest_can_join, world_readable, and name,
     * topic, avatar_url, canonical_alias, room_type when set} in *out (the caller decrefs
     * it). 0, ATRIUM_E_NOTFOUND (no such room here), ATRIUM_E_DB. */
    int (*room_summary)(PGconn *c, const char *room_id, json_t **out);
    /* user_id's membership in room_id now ("" when none) into out. 0, ATRIUM_E_NOTFOUND
     * (no such room), ATRIUM_E_DB. */
    int (*membership)(PGconn *c, const char *room_id, const char *user_id,
                      char out[ATRIUM_MEMBERSHIP_LEN]);
    /* 1 when user_id's power level lets them send a state event of event_type into
     * room_id now (the room's auth rules), 0 when not, ATRIUM_E_NOTFOUND, ATRIUM_E_DB. */
    int (*may_send_state)(PGconn *c, const char *room_id, const char *user_id,
                          const char *event_type);

    /* ---- version 1 ---- */
    /* The directory deleted alias of room_id at user_id's request: when the room's
     * m.room.canonical_alias names it (`alias` or one of `alt_aliases`), the event is sent
     * again without it, as user_id, if the room's auth rules let user_id send it; else
     * nothing is sent (the alias stays deleted either way, as the spec recommends). It
     * begins and commits its own transaction on c (under the room's write lock), so call
     * it outside one. 1 (the event was sent), 0 (none named it, no such room, or user_id
     * may not send it), ATRIUM_E_DB. */
    int (*canonical_alias_drop)(PGconn *c, const char *room_id, const char *alias,
                                const char *user_id);
} atrium_rooms;

/* The size of version 0 (what every core offering rooms/1 has). */
#define ATRIUM_ROOMS_V0_SIZE ((uint32_t)offsetof(atrium_rooms, canonical_alias_drop))
/* Does the core's rooms/1 r have member (and set it)? */
#define ATRIUM_ROOMS_HAS(r, member)                                                            \
    ((r)->size >= offsetof(atrium_rooms, member) + sizeof((r)->member) && (r)->member)

#endif
