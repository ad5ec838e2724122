/*
 * plugins/directory/directory.h - what the directory plugin's files share: the host
 * table, the core's "rooms/1" interface, the settings, and small database helpers.
 *
 * Files by concern: directory.c (the descriptor, settings, migrations, routes and the
 * "directory/1" interface table), aliases.c (room aliases: grammar, the client endpoints
 * and the interface's alias functions), listing.c (publishing and the public room list).
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
    const char *publish; /* "everyone" or "admins" */
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
int dir_alias_routes(void);

/* listing.c */
int dir_room_publish(PGconn *c, const char *room_id, bool visible);
int dir_room_changed(PGconn *c, const char *room_id);
int dir_listing_routes(void);

#endif
