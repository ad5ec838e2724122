/*
 * plugins/directory/directory.h - what the directory plugin's files share: the host
 * table, the core's "rooms/1" interface, the settings, and small database helpers.
 *
 * Files by concern: directory.c (the descriptor, settings, migrations, routes and the
 * "directory/1" interface table), aliases.c (room aliases: grammar, the client endpoints
 * and the interface's alias functions), listing.c (publishing and the public room list),
 * remote_lookup.c (look-ups on other servers under the outbound budget, shared and cached).
 * Internal prefix: dir_.
 */
#ifndef ATRIUM_PLUGIN_DIRECTORY_H
#define ATRIUM_PLUGIN_DIRECTORY_H

#include <stdbool.h>

#include "atrium/directory.h"
#include "atrium/host.h"
#include "atrium/rooms.h"

#define DIR_ALIAS_MAX_BYTES 255 /* the spec's limit on a room alias */

/* Who may list a room in the public room list (plugins.directory.publish). */
enum dir_publish_rule {
    DIR_PUBLISH_EVERYONE = 0, /* a room member whose power lets them set the canonical alias */
    DIR_PUBLISH_ADMINS = 1,   /* server admins only */
};

typedef struct dir_settings {
    const char *publish;       /* "everyone" or "admins" */
    int64_t remote_timeout_ms; /* dir_remote.timeout_ms */
    int64_t remote_cache_ms;   /* dir_remote.cache_ms */
} dir_settings;

extern const atrium_host *dir_host;        /* valid from init to fini */
extern atrium_plugin *dir_self;
extern const atrium_rooms *dir_rooms;      /* the core's rooms/1, from start() */
extern enum dir_publish_rule dir_publish_rule;

/* One statement: the result (tuples or command OK), or NULL after logging. *unique (may be
 * NULL) tells a unique-constraint failure. */
PGresult *dir_q(PGconn *c, const char *sql, int n, const char *const *params, bool *unique);

/* [req] A connection, or NULL after answering 503. */
PGconn *dir_db(atrium_req *req);

/* aliases.c */
/* Is alias "#local:server" well-formed (length, one '#', a non-empty localpart without ':'
 * or whitespace, a server)? *server gets the part after the first ':'. */
bool dir_alias_ok(const char *alias, const char **server);
int dir_alias_create(PGconn *c, const char *alias, const char *room_id, const char *creator);
int dir_alias_resolve(PGconn *c, const char *alias, char room_id[ATRIUM_ROOM_ID_MAX_BYTES + 1]);
/* directory/1 room_aliases_delete: every alias of room_id goes. */
int dir_room_aliases_delete(PGconn *c, const char *room_id, json_t **deleted);
int dir_alias_routes(void);

/* remote_lookup.c: look-ups on other servers under the outbound budget (ADR-0079). */
typedef struct dir_remote_settings {
    int64_t timeout_ms; /* a look-up's deadline */
    int64_t cache_ms;   /* how long an answer is reused */
} dir_remote_settings;
extern dir_remote_settings dir_remote;
/* [req] Create the metrics (init). 0 or a negative error. */
int dir_remote_init(void);
/* [req] Answer with server's public room list: GET (filter NULL, limit -1 = none) or POST
 * with filter. Parks the request; call it on every run of the handler. */
int dir_remote_rooms(atrium_req *req, const char *server, long limit, const char *since,
                     const json_t *filter);
/* [req] Answer with the room alias names on server (its directory's answer). Likewise. */
int dir_remote_alias(atrium_req *req, const char *alias, const char *server);
/* [req] directory/1 alias_resolve_remote: the same look-up, its answer for the caller. */
int dir_remote_alias_resolve(atrium_req *req, const char *alias,
                             char room_id[ATRIUM_ROOM_ID_MAX_BYTES + 1], json_t **servers);

/* listing.c */
int dir_room_publish(PGconn *c, const char *room_id, bool visible);
int dir_room_changed(PGconn *c, const char *room_id);
/* Is room_id in the list? 1, 0, ATRIUM_E_DB. */
int dir_room_listed(PGconn *c, const char *room_id);
int dir_may_publish(const char *user_id, bool server_admin);
int dir_listing_routes(void);

#endif
