/*
 * atrium/directory.h - the interface "directory/1": what the core asks of the room
 * directory (host->iface_get(ATRIUM_DIRECTORY_IFACE, sizeof(atrium_directory))).
 *
 * The core never includes a plugin's header: it needs aliases (createRoom's
 * room_alias_name, join by alias, m.room.canonical_alias checks) and publishing
 * (createRoom's visibility) from whichever plugin provides this interface, directory.so
 * or a replacement built from include/atrium/ alone. When no enabled plugin provides it,
 * the core answers the alias-dependent requests with 400 M_UNRECOGNIZED and serves
 * everything else.
 *
 * Every function of version 0 takes a connection the caller borrowed and may run inside
 * the caller's transaction (createRoom creates the room, its alias and its listing in
 * one), so it must never begin, commit or roll back one; a failed statement fails the
 * caller's transaction, so return ATRIUM_E_DB then. Any thread. Growth rule: members are
 * appended; a caller looks the interface up with ATRIUM_DIRECTORY_V0_SIZE and checks
 * ATRIUM_DIRECTORY_HAS(d, member) before using a later one (a provider may also leave a
 * later member NULL: it does not do that).
 */
#ifndef ATRIUM_DIRECTORY_H
#define ATRIUM_DIRECTORY_H

#include <stdbool.h>
#include <stdint.h>

#include <stddef.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "atrium/abi.h"
#include "atrium/host.h"

#define ATRIUM_DIRECTORY_IFACE "directory/1"
#define ATRIUM_DIRECTORY_VERSION 1 /* minor version of directory/1 */
#define ATRIUM_ROOM_ID_MAX_BYTES 255
/* What alias_resolve_remote returns when the answer is there (distinct from the handler
 * outcomes ATRIUM_DONE, ATRIUM_PARKED and ATRIUM_HANDED_OFF). */
#define ATRIUM_DIRECTORY_RESOLVED 16

typedef struct atrium_directory {
    uint32_t size;    /* sizeof(atrium_directory) in the provider */
    uint32_t version; /* ATRIUM_DIRECTORY_VERSION */
    /* Map alias ("#local:this.server") to room_id, created by creator. 0; ATRIUM_E_INVAL
     * (not a valid alias of this server: grammar, length, another server);
     * ATRIUM_E_EXISTS (the alias is taken); ATRIUM_E_DB. */
    int (*alias_create)(PGconn *c, const char *alias, const char *room_id,
                        const char *creator);
    /* The room a local alias points to, into room_id. 0; ATRIUM_E_NOTFOUND (no such
     * alias); ATRIUM_E_INVAL (not an alias of this server); ATRIUM_E_DB. */
    int (*alias_resolve)(PGconn *c, const char *alias,
                         char room_id[ATRIUM_ROOM_ID_MAX_BYTES + 1]);
    /* List (visible) or unlist room_id in the public room list. 0, ATRIUM_E_NOTFOUND (no
     * such room), ATRIUM_E_DB. */
    int (*room_publish)(PGconn *c, const char *room_id, bool visible);
    /* The room's state that a listing shows (name, topic, avatar, aliases, members, join
     * rule, guest access, history visibility) changed: refresh its entry if it is listed.
     * Called by the core in the transaction that changed it. 0 or ATRIUM_E_DB. */
    int (*room_changed)(PGconn *c, const char *room_id);
    /* May user_id (server_admin: a server admin) list rooms it creates? The directory's
     * publication rule, asked by createRoom before a room with visibility "public" is
     * made: 1 or 0 (the core answers 403 M_FORBIDDEN and creates nothing). */
    int (*may_publish)(const char *user_id, bool server_admin);

    /* ---- version 1 ---- */
    /* [req] The room alias ("#local:other.server") names on its own server, asked of that
     * server (GET /_matrix/federation/v1/query/directory) for req under the outbound
     * budget (docs/adr/0079-outbound-budget.md): a slot held until req ends, 429 at once
     * over either cap, the request parked while the server answers (no thread waits),
     * identical look-ups shared and answers cached. Call it on every run of the handler
     * until it returns something other than ATRIUM_PARKED; it keeps its progress in req's
     * state (req_state), which the caller must leave alone. Returns
     * ATRIUM_DIRECTORY_RESOLVED with room_id and *servers set (a new JSON array of server
     * names to join through; the caller decrefs it; nothing answered yet), ATRIUM_PARKED
     * (return it from the handler: it runs again), or ATRIUM_DONE after answering (429,
     * 404 no such alias, 502 a refusal or a broken answer, 504 no answer in time, 503
     * stopping). */
    int (*alias_resolve_remote)(atrium_req *req, const char *alias,
                                char room_id[ATRIUM_ROOM_ID_MAX_BYTES + 1], json_t **servers);
    /* Is room_id listed in the public room list? 1, 0, ATRIUM_E_DB. */
    int (*room_listed)(PGconn *c, const char *room_id);
    /* Delete every alias of room_id (a server admin shuts the room down): *deleted gets a
     * new JSON array of the aliases deleted (the caller decrefs it). 0 or ATRIUM_E_DB
     * (*deleted NULL). */
    int (*room_aliases_delete)(PGconn *c, const char *room_id, json_t **deleted);
} atrium_directory;

/* The size of version 0 (every provider has at least these members). */
#define ATRIUM_DIRECTORY_V0_SIZE ((uint32_t)offsetof(atrium_directory, alias_resolve_remote))
/* Does provider d have member (and set it)? */
#define ATRIUM_DIRECTORY_HAS(d, member)                                                        \
    ((d)->size >= offsetof(atrium_directory, member) + sizeof((d)->member) && (d)->member)

#endif
