/*
 * plugins/directory/listing.c - publishing rooms and the public room list:
 * GET/PUT /_matrix/client/v3/directory/list/room/{roomId}, GET /publicRooms (no token
 * needed) and POST /publicRooms (a token; a search term and room types as filters), and
 * the listing functions of "directory/1" (createRoom's visibility "public", and the
 * core's note that a listed room's state changed).
 *
 * The list is the table directory_public_rooms: one row per listed room holding what the
 * list shows (name, topic, avatar, canonical alias, members, join rule, guest access,
 * world-readability, room type), written when the room is listed and rewritten by
 * room_changed in the transaction of every state change the core says matters, so a page
 * is one indexed query, fresh, with no scan of the rooms' state. The summary itself comes
 * from the core (rooms/1 room_summary). Paging: rooms are ordered by joined members (most
 * first), then room ID; a page token is the offset into that order ("o<N>"). A room that
 * joins or leaves the list between two pages can shift one entry, which the spec allows
 * (the count is an estimate). Who may list a room: plugins.directory.publish.
 *
 * Application services' networks (ABI 1.6, req_appservice): a service lists a room for one
 * of its networks with PUT /directory/list/appservice/{networkId}/{roomId}; the row then
 * carries its id and the network, and shows only in a POST publicRooms for that network
 * (third_party_instance_id "<service id>|<network id>") or for all (include_all_networks),
 * never in the main list. One row per room: listing it in the main list moves it back.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "directory.h"
#include "atrium/parse.h"

#define h dir_host

#define DIRECTORY_DEFAULT_LIMIT 100
#define DIRECTORY_MAX_LIMIT 100            /* rooms per page at most */
#define DIRECTORY_MAX_OFFSET 1000000       /* deepest page token accepted */
#define DIRECTORY_MAX_SEARCH_BYTES 256     /* generic_search_term */
#define DIRECTORY_MAX_ROOM_TYPES 16        /* entries of filter.room_types */
#define DIRECTORY_MAX_ROOM_TYPE_BYTES 255  /* one room type */
#define DIRECTORY_MAX_NETWORK_BYTES 255    /* an application service's networkId */

/* Write summary s (rooms/1 room_summary) as the room's row of the list. */
static int store_summary(PGconn *c, const json_t *s)
{
#define STR(k) json_string_value(json_object_get(s, k))
    char members[24];
    snprintf(members, sizeof(members), "%lld",
             (long long)json_integer_value(json_object_get(s, "num_joined_members")));
    const char *p[10] = {STR("room_id"), STR("name"), STR("topic"), STR("canonical_alias"),
                         STR("avatar_url"), members,
                         json_is_true(json_object_get(s, "world_readable")) ? "t" : "f",
                         json_is_true(json_object_get(s, "guest_can_join")) ? "t" : "f",
                         STR("join_rule"), STR("room_type")};
#undef STR
    PGresult *res = dir_q(
        c,
        "INSERT INTO directory_public_rooms (room_id, name, topic, canonical_alias, avatar_url,"
        " num_joined_members, world_readable, guest_can_join, join_rule, room_type)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, coalesce($9, 'invite'), $10)"
        " ON CONFLICT (room_id) DO UPDATE SET name = EXCLUDED.name, topic = EXCLUDED.topic,"
        " canonical_alias = EXCLUDED.canonical_alias, avatar_url = EXCLUDED.avatar_url,"
        " num_joined_members = EXCLUDED.num_joined_members,"
        " world_readable = EXCLUDED.world_readable, guest_can_join = EXCLUDED.guest_can_join,"
        " join_rule = EXCLUDED.join_rule, room_type = EXCLUDED.room_type",
        10, p, NULL);
    if (!res) return ATRIUM_E_DB;
    PQclear(res);
    return 0;
}

static int refresh(PGconn *c, const char *room_id)
{
    json_t *s = NULL;
    int rc = dir_rooms->room_summary(c, room_id, &s);
    if (rc == 0) rc = store_summary(c, s);
    json_decref(s);
    return rc;
}

/* List room_id (refreshed) in the main list (as_id and network NULL) or in a service's
 * network's. */
static int publish_in(PGconn *c, const char *room_id, const char *as_id, const char *network)
{
    int rc = refresh(c, room_id);
    if (rc < 0) return rc;
    const char *p[3] = {room_id, as_id, network};
    PGresult *res = dir_q(c, "UPDATE directory_public_rooms SET appservice_id = $2,"
                             " network_id = $3 WHERE room_id = $1", 3, p, NULL);
    if (!res) return ATRIUM_E_DB;
    PQclear(res);
    return 0;
}

int dir_room_publish(PGconn *c, const char *room_id, bool visible)
{
    if (visible) return publish_in(c, room_id, NULL, NULL);
    const char *p[1] = {room_id};
    PGresult *res = dir_q(c, "DELETE FROM directory_public_rooms WHERE room_id = $1", 1, p, NULL);
    if (!res) return ATRIUM_E_DB;
    PQclear(res);
    return 0;
}

int dir_room_listed(PGconn *c, const char *room_id)
{
    const char *p[1] = {room_id};
    PGresult *res =
        dir_q(c, "SELECT 1 FROM directory_public_rooms WHERE room_id = $1", 1, p, NULL);
    if (!res) return ATRIUM_E_DB;
    int listed = PQntuples(res) > 0;
    PQclear(res);
    return listed;
}

int dir_room_changed(PGconn *c, const char *room_id)
{
    int listed = dir_room_listed(c, room_id);
    if (listed <= 0) return listed;
    int rc = refresh(c, room_id);
    return rc == ATRIUM_E_NOTFOUND ? 0 : rc;
}

/* GET /_matrix/client/v3/directory/list/room/{roomId}: {"visibility"} */
static int get_visibility(atrium_req *req)
{
    const char *room_id = h->req_param(req, "roomId");
    PGconn *c = dir_db(req);
    if (!c) return ATRIUM_DONE;
    json_t *s = NULL;
    int rc = dir_rooms->room_summary(c, room_id, &s);
    json_decref(s);
    int listed = rc == 0 ? dir_room_listed(c, room_id) : 0;
    if (listed < 0) rc = listed;
    h->db_release(c);
    if (rc == ATRIUM_E_NOTFOUND) return h->respond_error(req, 404, "M_NOT_FOUND", "Unknown room");
    if (rc < 0) return h->respond_error(req, 503, "M_UNKNOWN", "The database failed; retry");
    return h->respond_json(req, 200, json_pack("{s:s}", "visibility",
                                               listed == 1 ? "public" : "private"));
}

int dir_may_publish(const char *user_id, bool server_admin)
{
    (void)user_id;
    return server_admin || dir_publish_rule == DIR_PUBLISH_EVERYONE;
}

/* May the requesting user list or unlist room_id? 1, 0, or a negative error. */
static int may_publish(atrium_req *req, PGconn *c, const char *user, const char *room_id)
{
    if (h->req_is_admin(req) == 1) return 1;
    if (dir_publish_rule == DIR_PUBLISH_ADMINS) return 0;
    return dir_rooms->may_send_state(c, room_id, user, "m.room.canonical_alias");
}

/* PUT /_matrix/client/v3/directory/list/room/{roomId} {"visibility": "public"|"private"} */
static int put_visibility(atrium_req *req)
{
    const char *user = h->req_authenticate(req);
    if (!user) return ATRIUM_DONE;
    const char *room_id = h->req_param(req, "roomId");
    json_t *body = h->req_json(req);
    if (!body) return ATRIUM_DONE;
    const char *v = json_string_value(json_object_get(body, "visibility"));
    if (v && strcmp(v, "public") != 0 && strcmp(v, "private") != 0)
        return h->respond_error(req, 400, "M_INVALID_PARAM",
                                "visibility must be \"public\" or \"private\"");
    bool visible = v && strcmp(v, "public") == 0;
    PGconn *c = dir_db(req);
    if (!c) return ATRIUM_DONE;
    int rc = may_publish(req, c, user, room_id);
    if (rc == 1) rc = dir_room_publish(c, room_id, visible) == 0 ? 1 : ATRIUM_E_DB;
    h->db_release(c);
    if (rc == 1) return h->respond_json(req, 200, json_object());
    if (rc == 0)
        return h->respond_error(req, 403, "M_FORBIDDEN",
                                dir_publish_rule == DIR_PUBLISH_ADMINS
                                    ? "Only server admins may change the public room list here"
                                    : "You need the power to set the room's canonical alias to "
                                      "list it");
    if (rc == ATRIUM_E_NOTFOUND) return h->respond_error(req, 404, "M_NOT_FOUND", "Unknown room");
    return h->respond_error(req, 503, "M_UNKNOWN", "The database failed; retry");
}

/* PUT /_matrix/client/v3/directory/list/appservice/{networkId}/{roomId} {"visibility"}:
 * an application service lists a room for one of its networks (or takes it off). */
static int put_network_visibility(atrium_req *req)
{
    if (!h->req_authenticate(req)) return ATRIUM_DONE;
    const char *as_id = h->req_appservice(req); /* ABI 1.6 */
    if (!as_id)
        return h->respond_error(req, 403, "M_FORBIDDEN", "Only an application service may list "
                                "rooms for a network");
    const char *network = h->req_param(req, "networkId"), *room_id = h->req_param(req, "roomId");
    if (!network || !network[0] || strlen(network) > DIRECTORY_MAX_NETWORK_BYTES ||
        strchr(network, '|'))
        return h->respond_error(req, 400, "M_INVALID_PARAM", "networkId must be 1 to %d bytes "
                                "without '|'", DIRECTORY_MAX_NETWORK_BYTES);
    if (!room_id || room_id[0] != '!' || strlen(room_id) > ATRIUM_ROOM_ID_MAX_BYTES)
        return h->respond_error(req, 400, "M_INVALID_PARAM", "Not a room ID");
    json_t *body = h->req_json(req);
    if (!body) return ATRIUM_DONE;
    const char *v = json_string_value(json_object_get(body, "visibility"));
    if (!v || (strcmp(v, "public") != 0 && strcmp(v, "private") != 0))
        return h->respond_error(req, 400, "M_INVALID_PARAM",
                                "visibility must be \"public\" or \"private\"");
    PGconn *c = dir_db(req);
    if (!c) return ATRIUM_DONE;
    int rc;
    if (strcmp(v, "public") == 0) {
        PGresult *res = dir_q(c, "BEGIN", 0, NULL, NULL);
        rc = res ? publish_in(c, room_id, as_id, network) : ATRIUM_E_DB;
        PQclear(res);
        res = dir_q(c, rc == 0 ? "COMMIT" : "ROLLBACK", 0, NULL, NULL);
        if (!res && rc == 0) rc = ATRIUM_E_DB;
        PQclear(res);
    } else {
        const char *p[3] = {room_id, as_id, network};
        PGresult *res = dir_q(c, "DELETE FROM directory_public_rooms WHERE room_id = $1"
                                 " AND appservice_id = $2 AND network_id = $3", 3, p, NULL);
        rc = res ? 0 : ATRIUM_E_DB;
        PQclear(res);
    }
    h->db_release(c);
    if (rc == 0) return h->respond_json(req, 200, json_object());
    if (rc == ATRIUM_E_NOTFOUND) return h->respond_error(req, 404, "M_NOT_FOUND", "Unknown room");
    return h->respond_error(req, 503, "M_UNKNOWN", "The database failed; retry");
}

/* One page request, from the query string (GET) or the body (POST). */
typedef struct page_query {
    long limit;
    long offset;
    const char *search;     /* generic_search_term, or NULL */
    char *types_json;       /* filter.room_types as a JSON array (null = no type), or NULL */
    bool all_networks;      /* include_all_networks: every room, whichever network */
    const char *as_id;      /* third_party_instance_id's service, or NULL: the main list */
    const char *network;    /* and its network */
} page_query;


static void set_optional(json_t *o, const char *key, PGresult *res, int row, int col)
{
    if (!PQgetisnull(res, row, col))
        json_object_set_new(o, key, json_string(PQgetvalue(res, row, col)));
}

/* A page token "o<N>" into *offset; false for anything else. */
static bool parse_since(const char *since, long *offset)
{
    if (since[0] != 'o' || !isdigit((unsigned char)since[1])) return false;
    int64_t n;
    if (atrium_parse_int64(since + 1, 0, DIRECTORY_MAX_OFFSET, &n) != 0) return false;
    *offset = (long)n;
    return true;
}

/* The `server` parameter when it names another server, else NULL (absent or this one). */
static const char *remote_server(atrium_req *req)
{
    const char *server = h->req_query(req, "server");
    return server && server[0] && strcmp(server, h->server_name()) != 0 ? server : NULL;
}

/* Is `server` (from remote_server) a server name (the core's grammar, ABI 1.4)? false after
 * answering 400: a name that is not one is never asked. */
static bool server_ok(atrium_req *req, const char *server)
{
    if (!server || h->server_name_valid(server) == 1) return true;
    h->respond_error(req, 400, "M_INVALID_PARAM", "'server' is not a server name: %.64s", server);
    return false;
}

/* Runs the page query and answers with chunk, next_batch/prev_batch and the estimate. */
static int answer_page(atrium_req *req, const page_query *q)
{
    char lim[24], off[24];
    snprintf(lim, sizeof(lim), "%ld", q->limit);
    snprintf(off, sizeof(off), "%ld", q->offset);
    const char *params[7] = {lim, off, q->search, q->types_json, q->all_networks ? "t" : "f",
                             q->as_id, q->network};
    PGconn *c = h->db_acquire(h->db_wait_ms());
    if (!c) return h->respond_error(req, 503, "M_UNKNOWN", "The database is busy; retry");
    /* $3: case-insensitive substring of name, topic or alias (LIKE wildcards escaped);
     * $4: allowed room types, JSON null standing for rooms without one. One row more
     * than the page says whether a next page exists. */
    PGresult *res = PQexecParams(
        c,
        "WITH matching AS (SELECT * FROM directory_public_rooms r WHERE"
        " ($3::text IS NULL OR concat_ws(' ', r.name, r.topic, r.canonical_alias) ILIKE"
        "  '%' || replace(replace(replace($3, '\\', '\\\\'), '%', '\\%'), '_', '\\_') || '%')"
        " AND ($4::jsonb IS NULL OR EXISTS (SELECT 1 FROM jsonb_array_elements($4::jsonb) t"
        "  WHERE (jsonb_typeof(t) = 'null' AND r.room_type IS NULL)"
        "  OR (jsonb_typeof(t) = 'string' AND r.room_type = t #>> '{}')))"
        " AND ($5::boolean OR (r.appservice_id IS NOT DISTINCT FROM $6::text"
        "  AND r.network_id IS NOT DISTINCT FROM $7::text)))"
        " SELECT room_id, name, topic, canonical_alias, avatar_url, num_joined_members,"
        " world_readable, guest_can_join, join_rule, room_type,"
        " (SELECT count(*) FROM matching)"
        " FROM matching ORDER BY num_joined_members DESC, room_id"
        " LIMIT $1::bigint + 1 OFFSET $2::bigint",
        7, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        h->log(dir_self, ATRIUM_LOG_ERROR, "public room query failed: %s",
               PQresultErrorMessage(res));
        PQclear(res);
        h->db_release(c);
        return h->respond_error(req, 503, "M_UNKNOWN", "The database failed; retry");
    }
    int rows = PQntuples(res);
    int shown = rows > q->limit ? (int)q->limit : rows;
    json_t *chunk = json_array();
    for (int i = 0; i < shown; i++) {
        json_t *room = json_pack("{s:s, s:i, s:b, s:b, s:s}", "room_id", PQgetvalue(res, i, 0),
                                 "num_joined_members", atoi(PQgetvalue(res, i, 5)),
                                 "world_readable", PQgetvalue(res, i, 6)[0] == 't',
                                 "guest_can_join", PQgetvalue(res, i, 7)[0] == 't', "join_rule",
                                 PQgetvalue(res, i, 8));
        set_optional(room, "name", res, i, 1);
        set_optional(room, "topic", res, i, 2);
        set_optional(room, "canonical_alias", res, i, 3);
        set_optional(room, "avatar_url", res, i, 4);
        set_optional(room, "room_type", res, i, 9);
        json_array_append_new(chunk, room);
    }
    long total = rows ? atol(PQgetvalue(res, 0, 10)) : 0;
    PQclear(res);
    h->db_release(c);
    json_t *body = json_pack("{s:o, s:I}", "chunk", chunk, "total_room_count_estimate",
                             (json_int_t)total);
    char token[24];
    if (q->limit > 0 && rows > q->limit) { /* limit 0: no next page to loop on */
        snprintf(token, sizeof(token), "o%ld", q->offset + q->limit);
        json_object_set_new(body, "next_batch", json_string(token));
    }
    if (q->offset > 0) {
        long prev = q->offset > q->limit ? q->offset - q->limit : 0;
        snprintf(token, sizeof(token), "o%ld", prev);
        json_object_set_new(body, "prev_batch", json_string(token));
    }
    return h->respond_json(req, 200, body);
}

/* limit from the query string into *limit (capped; untouched when absent). false after
 * answering 400. */
static bool query_limit(atrium_req *req, long *limit)
{
    const char *ls = h->req_query(req, "limit");
    if (!ls) return true;
    int64_t n;
    int rc = atrium_parse_int64(ls, 0, DIRECTORY_MAX_LIMIT, &n); /* past the maximum: clamped */
    if (rc == ATRIUM_E_INVAL || (rc == ATRIUM_E_LIMIT && n != DIRECTORY_MAX_LIMIT)) {
        h->respond_error(req, 400, "M_INVALID_PARAM", "limit must be a non-negative integer");
        return false;
    }
    *limit = (long)n;
    return true;
}

/* GET publicRooms?limit=&since= of this server's list (clients and other servers). */
static int get_local_page(atrium_req *req)
{
    page_query q = {.limit = DIRECTORY_DEFAULT_LIMIT};
    if (!query_limit(req, &q.limit)) return ATRIUM_DONE;
    const char *since = h->req_query(req, "since");
    if (since && !parse_since(since, &q.offset))
        return h->respond_error(req, 400, "M_INVALID_PARAM", "Unknown 'since' token");
    return answer_page(req, &q);
}

/* GET /_matrix/client/v3/publicRooms?limit=&since=&server= */
static int get_public_rooms(atrium_req *req)
{
    const char *server = remote_server(req);
    if (!server_ok(req, server)) return ATRIUM_DONE;
    if (!server) return get_local_page(req);
    long limit = -1;
    if (!query_limit(req, &limit)) return ATRIUM_DONE;
    return dir_remote_rooms(req, server, limit, h->req_query(req, "since"), NULL);
}

/* filter.room_types into q->types_json (request memory). false after answering 400. */
static bool read_room_types(atrium_req *req, json_t *filter, page_query *q)
{
    json_t *types = json_object_get(filter, "room_types");
    if (!types || json_is_null(types)) return true;
    if (!json_is_array(types) || json_array_size(types) > DIRECTORY_MAX_ROOM_TYPES) {
        h->respond_error(req, 400, "M_BAD_JSON",
                         "filter.room_types must be an array of at most %d strings or nulls",
                         DIRECTORY_MAX_ROOM_TYPES);
        return false;
    }
    size_t i;
    json_t *t;
    json_array_foreach(types, i, t) {
        if (json_is_null(t)) continue;
        if (!json_is_string(t) || json_string_length(t) > DIRECTORY_MAX_ROOM_TYPE_BYTES) {
            h->respond_error(req, 400, "M_BAD_JSON",
                             "each of filter.room_types must be a string (at most %d bytes) "
                             "or null", DIRECTORY_MAX_ROOM_TYPE_BYTES);
            return false;
        }
    }
    char *dumped = json_dumps(types, JSON_COMPACT);
    q->types_json = dumped ? h->req_strdup(req, dumped) : NULL;
    free(dumped);
    if (!q->types_json) {
        h->respond_error(req, 500, "M_UNKNOWN", "Out of memory");
        return false;
    }
    return true;
}

/* include_all_networks and third_party_instance_id ("<service id>|<network id>", as
 * Synapse spells it) into q. false after answering 400. */
static bool parse_networks(atrium_req *req, json_t *body, page_query *q)
{
    json_t *all = json_object_get(body, "include_all_networks");
    if (all && !json_is_null(all) && !json_is_boolean(all)) {
        h->respond_error(req, 400, "M_BAD_JSON", "include_all_networks must be a boolean");
        return false;
    }
    q->all_networks = json_is_true(all);
    json_t *tp = json_object_get(body, "third_party_instance_id");
    if (!tp || json_is_null(tp)) return true;
    const char *v = json_string_value(tp);
    const char *bar = v ? strchr(v, '|') : NULL;
    if (!v || json_string_length(tp) > 2 * DIRECTORY_MAX_NETWORK_BYTES || !bar || bar == v) {
        h->respond_error(req, 400, "M_INVALID_PARAM", "third_party_instance_id must be "
                         "\"<application service id>|<network id>\"");
        return false;
    }
    if (q->all_networks) {
        h->respond_error(req, 400, "M_INVALID_PARAM", "third_party_instance_id cannot be used "
                         "with include_all_networks");
        return false;
    }
    char *as_id = h->req_strdup(req, v);
    if (!as_id) {
        h->respond_error(req, 500, "M_UNKNOWN", "Out of memory");
        return false;
    }
    as_id[bar - v] = '\0';
    q->as_id = as_id;
    q->network = as_id + (bar - v) + 1;
    return true;
}

/* A POST publicRooms body {limit, since, filter{generic_search_term, room_types},
 * include_all_networks, third_party_instance_id} into q; with remote, since is another
 * server's token and is not read. false after answering 400. */
static bool parse_post(atrium_req *req, json_t *body, page_query *q, bool remote)
{
    json_t *limit = json_object_get(body, "limit"), *since = json_object_get(body, "since");
    json_t *filter = json_object_get(body, "filter");
    if (limit && !json_is_null(limit)) {
        if (!json_is_integer(limit) || json_integer_value(limit) < 0) {
            h->respond_error(req, 400, "M_BAD_JSON", "limit must be a non-negative integer");
            return false;
        }
        json_int_t n = json_integer_value(limit);
        q->limit = n > DIRECTORY_MAX_LIMIT ? DIRECTORY_MAX_LIMIT : (long)n;
    }
    if (since && !json_is_null(since)) {
        if (!json_is_string(since)) {
            h->respond_error(req, 400, "M_BAD_JSON", "since must be a string");
            return false;
        }
        if (!remote && !parse_since(json_string_value(since), &q->offset)) {
            h->respond_error(req, 400, "M_INVALID_PARAM", "Unknown 'since' token");
            return false;
        }
    }
    if (filter && !json_is_null(filter)) {
        if (!json_is_object(filter)) {
            h->respond_error(req, 400, "M_BAD_JSON", "filter must be an object");
            return false;
        }
        json_t *term = json_object_get(filter, "generic_search_term");
        if (term && !json_is_null(term)) {
            if (!json_is_string(term) || json_string_length(term) > DIRECTORY_MAX_SEARCH_BYTES) {
                h->respond_error(req, 400, "M_BAD_JSON",
                                 "filter.generic_search_term must be a string of at most %d "
                                 "bytes", DIRECTORY_MAX_SEARCH_BYTES);
                return false;
            }
            if (json_string_length(term) > 0) q->search = json_string_value(term);
        }
        if (!read_room_types(req, filter, q)) return false;
    }
    return parse_networks(req, body, q);
}

/* POST /_matrix/client/v3/publicRooms?server=: a token is needed. */
static int post_public_rooms(atrium_req *req)
{
    if (!h->req_authenticate(req)) return ATRIUM_DONE;
    json_t *body = h->req_json(req);
    if (!body) return ATRIUM_DONE;
    const char *server = remote_server(req);
    if (!server_ok(req, server)) return ATRIUM_DONE;
    page_query q = {.limit = server ? -1 : DIRECTORY_DEFAULT_LIMIT};
    if (!parse_post(req, body, &q, server != NULL)) return ATRIUM_DONE;
    if (!server) return answer_page(req, &q);
    json_t *filter = json_object_get(body, "filter");
    return dir_remote_rooms(req, server, q.limit, json_string_value(json_object_get(body, "since")),
                            json_is_object(filter) ? filter : NULL);
}

/* POST /_matrix/federation/v1/publicRooms: another server asks for this server's list. */
static int fed_post_public_rooms(atrium_req *req)
{
    json_t *body = h->req_json(req);
    if (!body) return ATRIUM_DONE;
    page_query q = {.limit = DIRECTORY_DEFAULT_LIMIT};
    if (!parse_post(req, body, &q, false)) return ATRIUM_DONE;
    return answer_page(req, &q);
}

int dir_listing_routes(void)
{
    static const atrium_route ROUTES[] = {
        {.method = "GET", .path = "/_matrix/client/v3/publicRooms", .handler = get_public_rooms},
        {.method = "POST", .path = "/_matrix/client/v3/publicRooms",
         .handler = post_public_rooms},
        {.method = "GET", .path = "/_matrix/client/v3/directory/list/room/{roomId}",
         .handler = get_visibility},
        {.method = "PUT", .path = "/_matrix/client/v3/directory/list/room/{roomId}",
         .handler = put_visibility},
        {.method = "PUT",
         .path = "/_matrix/client/v3/directory/list/appservice/{networkId}/{roomId}",
         .handler = put_network_visibility},
        {.method = "GET", .path = "/_matrix/federation/v1/publicRooms",
         .handler = get_local_page, .flags = ATRIUM_ROUTE_FEDERATION},
        {.method = "POST", .path = "/_matrix/federation/v1/publicRooms",
         .handler = fed_post_public_rooms, .flags = ATRIUM_ROUTE_FEDERATION},
    };
    for (size_t i = 0; i < sizeof(ROUTES) / sizeof(ROUTES[0]); i++) {
        int rc = h->route_add(dir_self, &ROUTES[i]);
        if (rc < 0) return rc;
    }
    return 0;
}
