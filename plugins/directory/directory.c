/*
 * plugins/directory/directory.c - the room directory plugin (provides "directory/1").
 *
 * This first version owns the directory's table and serves the local public room list
 * from it. Publishing rooms, aliases and remote look-ups (under the outbound budget of
 * ADR-0079) come with the room and federation issues.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atrium/host.h"

#define DIRECTORY_DB_WAIT_MS 2000
#define DIRECTORY_DEFAULT_LIMIT 100

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
};

typedef struct directory {
    const atrium_host *host;
    atrium_plugin *self;
} directory;

static const atrium_host *h; /* the host table, valid from init to fini */

static void set_optional(json_t *o, const char *key, PGresult *res, int row, int col)
{
    if (!PQgetisnull(res, row, col)) json_object_set_new(o, key, json_string(PQgetvalue(res, row, col)));
}

static int get_public_rooms(atrium_req *req)
{
    directory *d = h->req_route_arg(req);
    long limit = DIRECTORY_DEFAULT_LIMIT;
    const char *ls = h->req_query(req, "limit");
    if (ls) {
        char *end = NULL;
        limit = strtol(ls, &end, 10);
        if (!*ls || *end || limit < 0)
            return h->respond_error(req, 400, "M_INVALID_PARAM", "limit must be a non-negative integer");
        if (limit > 500) limit = 500;
    }
    if (h->req_query(req, "server") && strcmp(h->req_query(req, "server"), h->server_name()) != 0)
        return h->respond_error(req, 400, "M_INVALID_PARAM",
                                "Remote room directories are not supported yet");
    PGconn *c = h->db_acquire(DIRECTORY_DB_WAIT_MS);
    if (!c) return h->respond_error(req, 503, "M_UNKNOWN", "The database is busy; retry");
    char lim[24];
    snprintf(lim, sizeof(lim), "%ld", limit);
    const char *params[1] = {lim};
    PGresult *res = PQexecParams(c,
                                 "SELECT room_id, name, topic, canonical_alias, avatar_url,"
                                 " num_joined_members, world_readable, guest_can_join, join_rule,"
                                 " (SELECT count(*) FROM directory_public_rooms)"
                                 " FROM directory_public_rooms"
                                 " ORDER BY num_joined_members DESC, room_id LIMIT $1",
                                 1, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        h->log(d->self, ATRIUM_LOG_ERROR, "public room query failed: %s", PQresultErrorMessage(res));
        PQclear(res);
        h->db_release(c);
        return h->respond_error(req, 503, "M_UNKNOWN", "The database failed; retry");
    }
    json_t *chunk = json_array();
    for (int i = 0; i < PQntuples(res); i++) {
        json_t *room = json_pack("{s:s, s:i, s:b, s:b, s:s}", "room_id", PQgetvalue(res, i, 0),
                                 "num_joined_members", atoi(PQgetvalue(res, i, 5)),
                                 "world_readable", PQgetvalue(res, i, 6)[0] == 't',
                                 "guest_can_join", PQgetvalue(res, i, 7)[0] == 't', "join_rule",
                                 PQgetvalue(res, i, 8));
        set_optional(room, "name", res, i, 1);
        set_optional(room, "topic", res, i, 2);
        set_optional(room, "canonical_alias", res, i, 3);
        set_optional(room, "avatar_url", res, i, 4);
        json_array_append_new(chunk, room);
    }
    long total = PQntuples(res) ? atol(PQgetvalue(res, 0, 9)) : 0;
    PQclear(res);
    h->db_release(c);
    return h->respond_json(req, 200, json_pack("{s:o, s:I}", "chunk", chunk,
                                               "total_room_count_estimate", (json_int_t)total));
}

static int directory_init(const atrium_host *host, atrium_plugin *self, const atrium_config *cfg,
                          void **state)
{
    static const char *const keys[] = {NULL};
    if (host->config_check_keys(self, cfg, keys) < 0) return ATRIUM_E_INVAL;
    directory *d = calloc(1, sizeof(*d));
    if (!d) return ATRIUM_E_NOMEM;
    d->host = host;
    d->self = self;
    h = host;
    int rc = host->db_migrations(self, MIGRATIONS, sizeof(MIGRATIONS) / sizeof(MIGRATIONS[0]));
    const atrium_route route = {.method = "GET", .path = "/_matrix/client/v3/publicRooms",
                                .handler = get_public_rooms, .arg = d};
    if (rc == 0) rc = host->route_add(self, &route);
    if (rc < 0) {
        free(d);
        return rc;
    }
    *state = d;
    return 0;
}

static void directory_fini(void *state)
{
    free(state);
}

ATRIUM_PLUGIN(.name = "directory", .version = "0.1.0", .provides = "directory/1",
              .init = directory_init, .fini = directory_fini)
