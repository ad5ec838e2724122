/*
 * plugins/directory/aliases.c - room aliases: the alias grammar, the client endpoints
 * PUT/GET/DELETE /_matrix/client/v3/directory/room/{roomAlias} and
 * GET /rooms/{roomId}/aliases, and the alias functions of "directory/1" the core calls
 * (createRoom's room_alias_name, join by alias, m.room.canonical_alias checks).
 *
 * Rules this file owns: an alias is created only for this server's name, only by a user
 * joined to the room (or a server admin), and a taken alias is M_ROOM_IN_USE; it is
 * deleted by whoever created it, a member whose power level lets them set the room's
 * m.room.canonical_alias, or a server admin. Deleting an alias leaves the room alone; the
 * room's m.room.canonical_alias stops naming it (rooms/1 canonical_alias_drop: sent as the
 * deleting user when the room lets them). It also answers other servers' look-ups
 * (GET /_matrix/federation/v1/query/directory). Aliases of other servers are looked up
 * by remote_lookup.c. Application services (ABI 1.6): an alias in a service's exclusive namespace
 * is 400 M_EXCLUSIVE to everyone else (alias_exclusive), and an unknown local alias a
 * service claims is asked of it before GET answers 404 (alias_query).
 */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "directory.h"

#define h dir_host

bool dir_alias_ok(const char *alias, const char **server)
{
    if (!alias || alias[0] != '#' || strlen(alias) > DIR_ALIAS_MAX_BYTES) return false;
    const char *colon = strchr(alias, ':');
    if (!colon || colon == alias + 1 || !colon[1]) return false;
    for (const char *p = alias + 1; p < colon; p++)
        if (isspace((unsigned char)*p) || iscntrl((unsigned char)*p) || *p == '#') return false;
    /* The core's server-name grammar (ABI 1.4): a name that is not one is never asked. */
    if (h->server_name_valid(colon + 1) != 1) return false;
    if (server) *server = colon + 1;
    return true;
}

static bool local_alias(const char *alias)
{
    const char *server;
    return dir_alias_ok(alias, &server) && strcmp(server, h->server_name()) == 0;
}

int dir_alias_create(PGconn *c, const char *alias, const char *room_id, const char *creator)
{
    if (!local_alias(alias) || !room_id || strlen(room_id) > ATRIUM_ROOM_ID_MAX_BYTES)
        return ATRIUM_E_INVAL;
    const char *p[3] = {alias, room_id, creator};
    bool unique = false;
    PGresult *res = dir_q(c,
                          "INSERT INTO directory_aliases (alias, room_id, creator)"
                          " VALUES ($1, $2, $3)",
                          3, p, &unique);
    if (!res) return unique ? ATRIUM_E_EXISTS : ATRIUM_E_DB;
    PQclear(res);
    return 0;
}

int dir_alias_resolve(PGconn *c, const char *alias, char room_id[ATRIUM_ROOM_ID_MAX_BYTES + 1])
{
    if (!local_alias(alias)) return ATRIUM_E_INVAL;
    const char *p[1] = {alias};
    PGresult *res = dir_q(c, "SELECT room_id FROM directory_aliases WHERE alias = $1", 1, p, NULL);
    if (!res) return ATRIUM_E_DB;
    int rc = ATRIUM_E_NOTFOUND;
    if (PQntuples(res) == 1) {
        snprintf(room_id, ATRIUM_ROOM_ID_MAX_BYTES + 1, "%s", PQgetvalue(res, 0, 0));
        rc = 0;
    }
    PQclear(res);
    return rc;
}

int dir_room_aliases_delete(PGconn *c, const char *room_id, json_t **deleted)
{
    *deleted = NULL;
    const char *p[1] = {room_id};
    PGresult *res = dir_q(c, "DELETE FROM directory_aliases WHERE room_id = $1 RETURNING alias",
                          1, p, NULL);
    if (!res) return ATRIUM_E_DB;
    json_t *out = json_array();
    for (int i = 0; i < PQntuples(res); i++)
        json_array_append_new(out, json_string(PQgetvalue(res, i, 0)));
    PQclear(res);
    *deleted = out;
    return out ? 0 : ATRIUM_E_NOMEM;
}

/* The {roomAlias} parameter when it is a well-formed alias; NULL after answering 400. */
static const char *param_alias(atrium_req *req)
{
    const char *alias = h->req_param(req, "roomAlias");
    if (dir_alias_ok(alias, NULL)) return alias;
    h->respond_error(req, 400, "M_INVALID_PARAM",
                     "Not a room alias: expected #localpart:server, at most %d bytes",
                     DIR_ALIAS_MAX_BYTES);
    return NULL;
}

/* PUT /_matrix/client/v3/directory/room/{roomAlias} {"room_id"} */
static int put_alias(atrium_req *req)
{
    const char *user = h->req_authenticate(req);
    if (!user) return ATRIUM_DONE;
    const char *alias = param_alias(req);
    if (!alias) return ATRIUM_DONE;
    if (!local_alias(alias))
        return h->respond_error(req, 400, "M_INVALID_PARAM",
                                "Aliases can only be created on this server (:%s)",
                                h->server_name());
    if (h->alias_exclusive(req, alias) == 1) /* ABI 1.6 */
        return h->respond_error(req, 400, "M_EXCLUSIVE", "Room alias %s is reserved by an "
                                "application service", alias);
    json_t *body = h->req_json(req);
    if (!body) return ATRIUM_DONE;
    const char *room_id = json_string_value(json_object_get(body, "room_id"));
    if (!room_id || room_id[0] != '!' || strlen(room_id) > ATRIUM_ROOM_ID_MAX_BYTES)
        return h->respond_error(req, 400, "M_BAD_JSON", "room_id must be a room ID");
    PGconn *c = dir_db(req);
    if (!c) return ATRIUM_DONE;
    char m[ATRIUM_MEMBERSHIP_LEN];
    int rc = dir_rooms->membership(c, room_id, user, m);
    if (rc == 0 && strcmp(m, "join") != 0 && h->req_is_admin(req) != 1) rc = ATRIUM_E_STATE;
    if (rc == 0) rc = dir_alias_create(c, alias, room_id, user);
    h->db_release(c);
    switch (rc) {
    case 0: return h->respond_json(req, 200, json_object());
    case ATRIUM_E_NOTFOUND: return h->respond_error(req, 404, "M_NOT_FOUND", "Unknown room");
    case ATRIUM_E_STATE:
        return h->respond_error(req, 403, "M_FORBIDDEN",
                                "You must be joined to the room to give it an alias");
    case ATRIUM_E_EXISTS:
        return h->respond_error(req, 409, "M_ROOM_IN_USE", "Room alias %s already exists", alias);
    default: return h->respond_error(req, 503, "M_UNKNOWN", "The database failed; retry");
    }
}

/* GET /_matrix/client/v3/directory/room/{roomAlias}: {room_id, servers} */
static int get_alias(atrium_req *req)
{
    const char *alias = param_alias(req);
    if (!alias) return ATRIUM_DONE;
    if (!local_alias(alias)) return dir_remote_alias(req, alias, strchr(alias, ':') + 1);
    PGconn *c = dir_db(req);
    if (!c) return ATRIUM_DONE;
    char room_id[ATRIUM_ROOM_ID_MAX_BYTES + 1];
    int rc = dir_alias_resolve(c, alias, room_id);
    h->db_release(c);
    if (rc == ATRIUM_E_NOTFOUND) { /* a bridge may make it (ABI 1.6): ask, then look again */
        int asked = h->alias_query(req, alias);
        if (asked != ATRIUM_CONTINUE) return asked;
        return h->respond_error(req, 404, "M_NOT_FOUND", "Room alias %s not found", alias);
    }
    if (rc < 0) return h->respond_error(req, 503, "M_UNKNOWN", "The database failed; retry");
    return h->respond_json(req, 200, json_pack("{s:s, s:[s]}", "room_id", room_id, "servers",
                                               h->server_name()));
}

/* GET /_matrix/federation/v1/query/directory?room_alias=: another server resolves one of
 * this server's aliases. */
static int fed_query_directory(atrium_req *req)
{
    const char *alias = h->req_query(req, "room_alias");
    if (!local_alias(alias))
        return h->respond_error(req, 404, "M_NOT_FOUND", "Not a room alias of this server");
    PGconn *c = dir_db(req);
    if (!c) return ATRIUM_DONE;
    char room_id[ATRIUM_ROOM_ID_MAX_BYTES + 1];
    int rc = dir_alias_resolve(c, alias, room_id);
    h->db_release(c);
    if (rc == ATRIUM_E_NOTFOUND) { /* a bridge may make it (ABI 1.6): ask, then look again */
        int asked = h->alias_query(req, alias);
        if (asked != ATRIUM_CONTINUE) return asked;
        return h->respond_error(req, 404, "M_NOT_FOUND", "Room alias %s not found", alias);
    }
    if (rc < 0) return h->respond_error(req, 503, "M_UNKNOWN", "The database failed; retry");
    return h->respond_json(req, 200, json_pack("{s:s, s:[s]}", "room_id", room_id, "servers",
                                               h->server_name()));
}

/* May user delete an alias of room_id that creator made? 1, 0, or a negative error. */
static int may_delete(atrium_req *req, PGconn *c, const char *user, const char *room_id,
                      const char *creator)
{
    if (strcmp(user, creator) == 0 || h->req_is_admin(req) == 1) return 1;
    int rc = dir_rooms->may_send_state(c, room_id, user, "m.room.canonical_alias");
    return rc == ATRIUM_E_NOTFOUND ? 0 : rc; /* the room is gone: only creator and admins */
}

/* DELETE /_matrix/client/v3/directory/room/{roomAlias} */
static int delete_alias(atrium_req *req)
{
    const char *user = h->req_authenticate(req);
    if (!user) return ATRIUM_DONE;
    const char *alias = param_alias(req);
    if (!alias) return ATRIUM_DONE;
    PGconn *c = dir_db(req);
    if (!c) return ATRIUM_DONE;
    const char *p[1] = {alias};
    PGresult *res =
        dir_q(c, "SELECT room_id, creator FROM directory_aliases WHERE alias = $1", 1, p, NULL);
    int rc = !res ? ATRIUM_E_DB : PQntuples(res) == 0 ? ATRIUM_E_NOTFOUND : 0;
    char room_id[ATRIUM_ROOM_ID_MAX_BYTES + 1] = "";
    if (rc == 0) {
        snprintf(room_id, sizeof(room_id), "%s", PQgetvalue(res, 0, 0));
        rc = may_delete(req, c, user, room_id, PQgetvalue(res, 0, 1));
    }
    PQclear(res);
    if (rc == 1) {
        res = dir_q(c, "DELETE FROM directory_aliases WHERE alias = $1", 1, p, NULL);
        rc = res ? 1 : ATRIUM_E_DB;
        PQclear(res);
    }
    /* The room's canonical alias event no longer names it (sent as the user, when they may;
     * a failure there leaves the alias deleted, as the spec recommends). */
    if (rc == 1 && ATRIUM_ROOMS_HAS(dir_rooms, canonical_alias_drop))
        (void)dir_rooms->canonical_alias_drop(c, room_id, alias, user);
    h->db_release(c);
    if (rc == 1) return h->respond_json(req, 200, json_object());
    if (rc == 0)
        return h->respond_error(req, 403, "M_FORBIDDEN", "You may not delete room alias %s "
                                "(only its creator, a room admin or a server admin)", alias);
    if (rc == ATRIUM_E_NOTFOUND)
        return h->respond_error(req, 404, "M_NOT_FOUND", "Room alias %s not found", alias);
    return h->respond_error(req, 503, "M_UNKNOWN", "The database failed; retry");
}

/* GET /_matrix/client/v3/rooms/{roomId}/aliases: for members (or any user when the room
 * is world-readable). */
static int get_room_aliases(atrium_req *req)
{
    const char *user = h->req_authenticate(req);
    if (!user) return ATRIUM_DONE;
    const char *room_id = h->req_param(req, "roomId");
    PGconn *c = dir_db(req);
    if (!c) return ATRIUM_DONE;
    char m[ATRIUM_MEMBERSHIP_LEN];
    int rc = dir_rooms->membership(c, room_id, user, m);
    if (rc == 0 && strcmp(m, "join") != 0 && h->req_is_admin(req) != 1) {
        json_t *s = NULL;
        rc = dir_rooms->room_summary(c, room_id, &s);
        if (rc == 0 && !json_is_true(json_object_get(s, "world_readable"))) rc = ATRIUM_E_STATE;
        json_decref(s);
    }
    json_t *aliases = NULL;
    if (rc == 0) {
        const char *p[1] = {room_id};
        PGresult *res = dir_q(c, "SELECT alias FROM directory_aliases WHERE room_id = $1"
                                 " ORDER BY alias", 1, p, NULL);
        if (!res) rc = ATRIUM_E_DB;
        aliases = json_array();
        for (int i = 0; res && i < PQntuples(res); i++)
            json_array_append_new(aliases, json_string(PQgetvalue(res, i, 0)));
        PQclear(res);
    }
    h->db_release(c);
    if (rc == 0) return h->respond_json(req, 200, json_pack("{s:o}", "aliases", aliases));
    json_decref(aliases);
    if (rc == ATRIUM_E_NOTFOUND) return h->respond_error(req, 404, "M_NOT_FOUND", "Unknown room");
    if (rc == ATRIUM_E_STATE)
        return h->respond_error(req, 403, "M_FORBIDDEN", "You are not in this room");
    return h->respond_error(req, 503, "M_UNKNOWN", "The database failed; retry");
}

int dir_alias_routes(void)
{
    static const atrium_route ROUTES[] = {
        {.method = "PUT", .path = "/_matrix/client/v3/directory/room/{roomAlias}",
         .handler = put_alias},
        {.method = "GET", .path = "/_matrix/client/v3/directory/room/{roomAlias}",
         .handler = get_alias},
        {.method = "DELETE", .path = "/_matrix/client/v3/directory/room/{roomAlias}",
         .handler = delete_alias},
        {.method = "GET", .path = "/_matrix/client/v3/rooms/{roomId}/aliases",
         .handler = get_room_aliases},
        {.method = "GET", .path = "/_matrix/federation/v1/query/directory",
         .handler = fed_query_directory, .flags = ATRIUM_ROUTE_FEDERATION},
    };
    for (size_t i = 0; i < sizeof(ROUTES) / sizeof(ROUTES[0]); i++) {
        int rc = h->route_add(dir_self, &ROUTES[i]);
        if (rc < 0) return rc;
    }
    return 0;
}
