/*
 * plugins/directory/directory.c - the room directory plugin (provides "directory/1").
 *
 * This file is the plugin's frame: the descriptor, its one setting (who may list rooms),
 * the migrations of its two tables, its routes, and the "directory/1" interface table
 * (include/atrium/directory.h) through which the core creates and resolves aliases and
 * lists rooms without including anything of this plugin. The work lives in aliases.c
 * (room aliases) and listing.c (publishing and the public room list). It is built only
 * against include/atrium/, like any third-party plugin, and reads the core's rooms only
 * through "rooms/1" (include/atrium/rooms.h). remote_lookup.c asks other servers
 * (publicRooms?server=, their aliases) under the outbound budget of ADR-0079
 * (docs/adr/0079-outbound-budget.md).
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "directory.h"

const atrium_host *dir_host;
atrium_plugin *dir_self;
const atrium_rooms *dir_rooms;
enum dir_publish_rule dir_publish_rule;

static const atrium_migration MIGRATIONS[] = {
    {1, "public_rooms",
     "CREATE TABLE directory_public_rooms ("
     " room_id text PRIMARY KEY,"
     " name text, topic text, canonical_alias text, avatar_url text,"
     " num_joined_members integer NOT NULL DEFAULT 0,"
     " world_readable boolean NOT NULL DEFAULT false,"
     " guest_can_join boolean NOT NULL DEFAULT false,"
     " join_rule text NOT NULL DEFAULT 'public',"
     " published_at timestamptz NOT NULL DEFAULT now())"},
    {2, "room_type", "ALTER TABLE directory_public_rooms ADD COLUMN room_type text"},
    {3, "aliases",
     "CREATE TABLE directory_aliases ("
     " alias text PRIMARY KEY,"
     " room_id text NOT NULL,"
     " creator text NOT NULL,"
     " created_at timestamptz NOT NULL DEFAULT now());"
     "CREATE INDEX directory_aliases_room ON directory_aliases (room_id)"},
    {4, "appservice_networks",
     /* A room an application service listed for one of its networks
      * (PUT /directory/list/appservice/{networkId}/{roomId}): shown only to a search of
      * that network (third_party_instance_id "<service id>|<network id>") or of all. */
     "ALTER TABLE directory_public_rooms ADD COLUMN appservice_id text,"
     " ADD COLUMN network_id text"},
};

static dir_settings settings;
#define FIELD(f) offsetof(dir_settings, f)

static const atrium_setting SETTINGS[] = {
    {.key = "publish", .type = ATRIUM_SETTING_STRING,
     .offset = offsetof(dir_settings, publish), .def_string = "everyone",
     .help = "Who may list rooms in the public room list: \"everyone\" (a member with the "
             "power to set the room's canonical alias) or \"admins\" (server admins only)."},
    {.key = "remote_timeout_ms", .type = ATRIUM_SETTING_INT64, .offset = FIELD(remote_timeout_ms),
     .def = 20000, .min = 1000, .max = 120000, .unit = "ms",
     .help = "A look-up on another server (publicRooms?server=, a remote alias) fails with 504 "
             "after this long; keep it under clients' own timeouts."},
    {.key = "remote_cache_ms", .type = ATRIUM_SETTING_INT64, .offset = FIELD(remote_cache_ms),
     .def = 30000, .min = 0, .max = 3600000, .unit = "ms",
     .help = "How long another server's answer is reused for identical look-ups; 0 = not "
             "reused (identical look-ups in flight are still shared)."},
};

static const atrium_directory DIRECTORY_IFACE = {
    .size = sizeof(atrium_directory),
    .version = ATRIUM_DIRECTORY_VERSION,
    .alias_create = dir_alias_create,
    .alias_resolve = dir_alias_resolve,
    .room_publish = dir_room_publish,
    .room_changed = dir_room_changed,
    .may_publish = dir_may_publish,
    .alias_resolve_remote = dir_remote_alias_resolve,
    .room_listed = dir_room_listed,
    .room_aliases_delete = dir_room_aliases_delete,
};

PGresult *dir_q(PGconn *c, const char *sql, int n, const char *const *params, bool *unique)
{
    PGresult *res = PQexecParams(c, sql, n, NULL, params, NULL, NULL, 0);
    ExecStatusType st = PQresultStatus(res);
    if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK) return res;
    const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
    bool dup = state && strcmp(state, "23505") == 0;
    if (unique) *unique = dup;
    if (!dup)
        dir_host->log(dir_self, ATRIUM_LOG_ERROR, "directory query failed: %s",
                      PQresultErrorMessage(res));
    PQclear(res);
    return NULL;
}

PGconn *dir_db(atrium_req *req)
{
    PGconn *c = dir_host->db_acquire(dir_host->db_wait_ms());
    if (!c) dir_host->respond_error(req, 503, "M_UNKNOWN", "The database is busy; retry");
    return c;
}

static int directory_init(const atrium_host *host, atrium_plugin *self, const atrium_config *cfg,
                          void **state)
{
    dir_host = host;
    dir_self = self;
    if (host->config_load(self, cfg, &settings) < 0) return ATRIUM_E_INVAL;
    if (strcmp(settings.publish, "everyone") == 0) dir_publish_rule = DIR_PUBLISH_EVERYONE;
    else if (strcmp(settings.publish, "admins") == 0) dir_publish_rule = DIR_PUBLISH_ADMINS;
    else {
        host->log(self, ATRIUM_LOG_ERROR, "plugins.directory.publish is \"%s\"; set it to "
                  "\"everyone\" or \"admins\"", settings.publish);
        return ATRIUM_E_INVAL;
    }
    dir_remote.timeout_ms = settings.remote_timeout_ms;
    dir_remote.cache_ms = settings.remote_cache_ms;
    int rc = dir_remote_init();
    if (rc == 0) rc = host->db_migrations(self, MIGRATIONS, sizeof(MIGRATIONS) / sizeof(MIGRATIONS[0]));
    if (rc == 0) rc = host->iface_provide(self, ATRIUM_DIRECTORY_IFACE, &DIRECTORY_IFACE);
    if (rc == 0) rc = dir_alias_routes();
    if (rc == 0) rc = dir_listing_routes();
    *state = NULL;
    return rc;
}

static int directory_start(void *state)
{
    (void)state;
    dir_rooms = dir_host->iface_get(ATRIUM_ROOMS_IFACE, ATRIUM_ROOMS_V0_SIZE);
    if (!dir_rooms) {
        dir_host->log(dir_self, ATRIUM_LOG_ERROR, "this server does not provide \"%s\"; use a "
                      "directory plugin built for it", ATRIUM_ROOMS_IFACE);
        return ATRIUM_E_STATE;
    }
    return 0;
}

ATRIUM_PLUGIN(.name = "directory", .version = "0.4.0", .provides = ATRIUM_DIRECTORY_IFACE,
              .init = directory_init, .start = directory_start, .settings = SETTINGS,
              .n_settings = sizeof(SETTINGS) / sizeof(SETTINGS[0]))
