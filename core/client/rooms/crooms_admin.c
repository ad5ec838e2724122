/*
 * core/client/rooms/crooms_admin.c - the Synapse-shaped room admin API, for server admins:
 * GET and DELETE /_synapse/admin/v1/rooms/{roomId}. GET gives a room's details as Synapse's admin API gives them
 * (so existing admin tools read them): name, topic, avatar, canonical alias, members (all,
 * this server's, this server's devices), version, creator, encryption, federatable,
 * whether it is listed in the public room list, join rule, guest access, history
 * visibility, state events, room type, and whether every local user forgot it.
 *
 * Everything but `public` comes from the room's current state with one query; `public`
 * is the room directory's (directory/1 room_listed; false when no directory is enabled
 * or it cannot say). Changing a room's listing and deleting its aliases as an admin go
 * through the client endpoints of the directory, as on Synapse (a server admin may list,
 * unlist and delete any room's). DELETE on the same path shuts a room down (delete_room
 * says what that is here, and what of Synapse's it refuses: purging, blocking, a new room).
 */
#include <stdlib.h>
#include <string.h>

#include "core/client/auth/auth.h"
#include "core/client/rooms/crooms_api.h"

/* The details, from current state and the tables, into *out (a new object). ROOMS_OK,
 * ROOMS_E_NOT_FOUND, ROOMS_E_DB. */
static int room_details(PGconn *c, const char *room_id, json_t **out)
{
    *out = NULL;
    const char *p[2] = {room_id, rooms_server_name()};
    PGresult *res = rooms_q(
        c,
        "SELECT r.room_version, r.creator,"
        " (SELECT count(*) FROM current_state m WHERE m.room_id = r.room_id"
        "  AND m.type = 'm.room.member' AND m.membership = 'join'),"
        " (SELECT count(*) FROM current_state m WHERE m.room_id = r.room_id"
        "  AND m.type = 'm.room.member' AND m.membership = 'join'"
        "  AND substr(m.state_key, strpos(m.state_key, ':') + 1) = $2),"
        " (SELECT count(*) FROM devices d JOIN current_state m ON m.state_key = d.user_id"
        "  WHERE m.room_id = r.room_id AND m.type = 'm.room.member' AND m.membership = 'join'),"
        " (SELECT count(*) FROM current_state s WHERE s.room_id = r.room_id),"
        " coalesce((SELECT jsonb_object_agg(cs.type, e.pdu::jsonb -> 'content')"
        "  FROM current_state cs JOIN events e ON e.event_id = cs.event_id"
        "  WHERE cs.room_id = r.room_id AND cs.state_key = '' AND e.redacted_by IS NULL"
        "  AND cs.type IN ('m.room.create', 'm.room.name', 'm.room.topic', 'm.room.avatar',"
        "  'm.room.canonical_alias', 'm.room.join_rules', 'm.room.guest_access',"
        "  'm.room.history_visibility', 'm.room.encryption')), '{}')::text,"
        /* forgotten: some local user was in it, and every local user's newest membership
         * row of it is forgotten */
        " coalesce((SELECT bool_and(f.forgotten) FROM (SELECT DISTINCT ON (user_id) forgotten"
        "  FROM memberships WHERE room_id = r.room_id ORDER BY user_id, stream_pos DESC) f),"
        "  false)"
        " FROM rooms r WHERE r.room_id = $1",
        2, p, NULL);
    if (!res) return ROOMS_E_DB;
    if (PQntuples(res) == 0) {
        PQclear(res);
        return ROOMS_E_NOT_FOUND;
    }
    json_t *state = json_loads(PQgetvalue(res, 0, 6), 0, NULL);
#define COUNT(col) ((json_int_t)strtoll(PQgetvalue(res, 0, col), NULL, 10))
    json_t *d = json_pack("{s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:b}", "room_id", room_id,
                          "version", PQgetvalue(res, 0, 0), "creator", PQgetvalue(res, 0, 1),
                          "joined_members", COUNT(2), "joined_local_members", COUNT(3),
                          "joined_local_devices", COUNT(4), "state_events", COUNT(5),
                          "forgotten", PQgetvalue(res, 0, 7)[0] == 't');
#undef COUNT
    PQclear(res);
    if (!state || !d) {
        json_decref(state);
        json_decref(d);
        return ROOMS_E_DB;
    }
    /* Synapse's names for each, null when the room has no such state. */
    static const struct {
        const char *type, *key, *as;
    } FIELDS[] = {
        {"m.room.name", "name", "name"},
        {"m.room.topic", "topic", "topic"},
        {"m.room.avatar", "url", "avatar"},
        {"m.room.canonical_alias", "alias", "canonical_alias"},
        {"m.room.join_rules", "join_rule", "join_rules"},
        {"m.room.guest_access", "guest_access", "guest_access"},
        {"m.room.history_visibility", "history_visibility", "history_visibility"},
        {"m.room.encryption", "algorithm", "encryption"},
        {"m.room.create", "type", "room_type"},
    };
    for (size_t i = 0; i < sizeof(FIELDS) / sizeof(FIELDS[0]); i++) {
        json_t *v = json_object_get(json_object_get(state, FIELDS[i].type), FIELDS[i].key);
        json_object_set_new(d, FIELDS[i].as, json_is_string(v) ? json_incref(v) : json_null());
    }
    /* m.federate: absent means true */
    json_t *federate = json_object_get(json_object_get(state, "m.room.create"), "m.federate");
    json_object_set_new(d, "federatable", json_boolean(!json_is_false(federate)));
    json_decref(state);
    *out = d;
    return ROOMS_OK;
}

/* The room of an admin route, once the caller is known to be a server admin; NULL when
 * the request was answered (no token, not an admin, database failure, bad room ID). */
static const char *admin_room(atrium_req *r)
{
    if (!auth_request(r)) return NULL;
    int admin = auth_is_admin(r);
    if (admin < 0) {
        http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
        return NULL;
    }
    if (!admin) {
        http_respond_error(r, 403, "M_FORBIDDEN", "You are not a server admin");
        return NULL;
    }
    return crooms_param_room(r);
}

/* GET /_synapse/admin/v1/rooms/{roomId} */
static int get_room(atrium_req *r)
{
    const char *room_id = admin_room(r);
    if (!room_id) return ATRIUM_DONE;
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    json_t *d = NULL;
    int rc = room_details(c, room_id, &d);
    const atrium_directory *dir = crooms_directory();
    int listed = rc == ROOMS_OK && dir && ATRIUM_DIRECTORY_HAS(dir, room_listed)
                     ? dir->room_listed(c, room_id)
                     : 0;
    http_db_checkin(c);
    if (rc == ROOMS_E_NOT_FOUND) return http_respond_error(r, 404, "M_NOT_FOUND", "Room not found");
    if (rc != ROOMS_OK || listed < 0) {
        json_decref(d);
        return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    }
    json_object_set_new(d, "public", json_boolean(listed == 1));
    return http_respond_json(r, 200, d);
}

/* A boolean field of the DELETE body: its value, def when absent. false after 400. */
static bool body_flag(atrium_req *r, const json_t *body, const char *key, bool def, bool *out)
{
    const json_t *v = json_object_get(body, key);
    *out = v ? json_is_true(v) : def;
    if (!v || json_is_boolean(v)) return true;
    http_respond_error(r, 400, "M_BAD_JSON", "Param '%s' must be a boolean, if given", key);
    return false;
}

/* This server's users the room still counts (joined or invited: not banned, not gone). A
 * result or NULL. */
static PGresult *local_members(PGconn *c, const char *room_id)
{
    const char *p[2] = {room_id, rooms_server_name()};
    return rooms_q(c,
                   "SELECT state_key FROM current_state WHERE room_id = $1"
                   " AND type = 'm.room.member' AND membership IN ('join', 'invite')"
                   " AND substr(state_key, strpos(state_key, ':') + 1) = $2 ORDER BY state_key",
                   2, p, NULL);
}

/* DELETE /_synapse/admin/v1/rooms/{roomId} {purge, block, new_room_user_id, ...}: shut the
 * room down on this server. Every local user in it (joined or invited) leaves, with their
 * own leave event; it leaves the public room list; its local aliases are deleted. The
 * answer is Synapse's: {kicked_users, failed_to_kick_users, local_aliases, new_room_id}.
 * What Synapse does beyond that is refused with 400 rather than skipped: purging the room
 * from the database (Synapse's default, so `"purge": false` must be sent), blocking it,
 * and moving its users into a new room. */
static int delete_room(atrium_req *r)
{
    const char *room_id = admin_room(r);
    if (!room_id) return ATRIUM_DONE;
    json_t *body = r->body_len ? http_req_json(r) : NULL;
    if (r->body_len && !body) return ATRIUM_DONE;
    bool purge, block, force_purge;
    if (!body_flag(r, body, "purge", true, &purge) || !body_flag(r, body, "block", false, &block) ||
        !body_flag(r, body, "force_purge", false, &force_purge))
        return ATRIUM_DONE;
    const json_t *new_owner = json_object_get(body, "new_room_user_id");
    if (purge || force_purge)
        return http_respond_error(r, 400, "M_INVALID_PARAM", "This server does not purge rooms "
                                  "from its database; send \"purge\": false to shut the room "
                                  "down (its local users leave, it is unlisted, its aliases "
                                  "deleted)");
    if (block)
        return http_respond_error(r, 400, "M_INVALID_PARAM", "This server does not block rooms");
    if (new_owner && !json_is_null(new_owner))
        return http_respond_error(r, 400, "M_INVALID_PARAM", "This server does not move a "
                                  "room's users into a new room (new_room_user_id)");
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    bool failed = false;
    if (!rooms_version_of(c, room_id, &failed)) {
        http_db_checkin(c);
        return failed ? http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry")
                      : http_respond_error(r, 404, "M_NOT_FOUND", "Room not found");
    }
    PGresult *members = local_members(c, room_id);
    json_t *kicked = json_array(), *not_kicked = json_array(), *aliases = NULL;
    for (int i = 0; members && i < PQntuples(members); i++) {
        const char *user = PQgetvalue(members, i, 0);
        char id[EVENT_ID_LEN];
        rooms_err e = {0};
        if (crooms_member_leave(c, r->arena, room_id, user, id, &e) == ROOMS_OK) {
            if (id[0]) json_array_append_new(kicked, json_string(user));
        } else {
            rt_log(ATRIUM_LOG_WARN, "core", "shutting down %s: %s could not leave: %s", room_id,
                   user, e.why);
            json_array_append_new(not_kicked, json_string(user));
        }
    }
    int rc = members ? 0 : ATRIUM_E_DB;
    PQclear(members);
    const atrium_directory *dir = crooms_directory();
    if (rc == 0 && dir) rc = dir->room_publish(c, room_id, false);
    if (rc == 0 && dir && ATRIUM_DIRECTORY_HAS(dir, room_aliases_delete))
        rc = dir->room_aliases_delete(c, room_id, &aliases);
    http_db_checkin(c);
    if (rc < 0) {
        json_decref(kicked);
        json_decref(not_kicked);
        json_decref(aliases);
        return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    }
    rt_log(ATRIUM_LOG_INFO, "core", "%s shut down room %s: %zu local users left", r->user,
           room_id, json_array_size(kicked));
    return http_respond_json(r, 200, json_pack("{s:o, s:o, s:o, s:n}", "kicked_users", kicked,
                                               "failed_to_kick_users", not_kicked,
                                               "local_aliases", aliases ? aliases : json_array(),
                                               "new_room_id"));
}

int crooms_admin_routes(http_server *s)
{
    return client_route(s, "GET", "/_synapse/admin/v1/rooms/{roomId}", get_room, 0) < 0 ||
                   client_route(s, "DELETE", "/_synapse/admin/v1/rooms/{roomId}", delete_room,
                                CROOMS_MAX_BODY_BYTES) < 0
               ? -1
               : 0;
}
