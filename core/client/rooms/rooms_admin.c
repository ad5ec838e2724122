/*
 * core/client/rooms/rooms_admin.c - the Synapse-shaped room admin API, for server admins:
 * GET /_synapse/admin/v1/rooms/{roomId}, a room's details as Synapse's admin API gives them
 * (so existing admin tools read them): name, topic, avatar, canonical alias, members (all,
 * this server's, this server's devices), version, creator, encryption, federatable,
 * whether it is listed in the public room list, join rule, guest access, history
 * visibility, state events, room type, and whether every local user forgot it.
 *
 * Everything but `public` comes from the room's current state with one query; `public`
 * is the room directory's (directory/1 room_listed; false when no directory is enabled
 * or it cannot say). Changing a room's listing and deleting its aliases as an admin go
 * through the client endpoints of the directory, as on Synapse (a server admin may list,
 * unlist and delete any room's). Not here: deleting (shutting down or purging) a room.
 */
#include <stdlib.h>
#include <string.h>

#include "core/client/auth/auth.h"
#include "core/client/rooms/rooms_api.h"

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

/* GET /_synapse/admin/v1/rooms/{roomId} */
static int get_room(atrium_req *r)
{
    if (!auth_request(r)) return ATRIUM_DONE;
    int admin = auth_is_admin(r);
    if (admin < 0) return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    if (!admin) return http_respond_error(r, 403, "M_FORBIDDEN", "You are not a server admin");
    const char *room_id = rooms_param_room(r);
    if (!room_id) return ATRIUM_DONE;
    PGconn *c = rooms_db(r);
    if (!c) return ATRIUM_DONE;
    json_t *d = NULL;
    int rc = room_details(c, room_id, &d);
    const atrium_directory *dir = rooms_directory();
    int listed = rc == ROOMS_OK && dir && ATRIUM_DIRECTORY_HAS(dir, room_listed)
                     ? dir->room_listed(c, room_id)
                     : 0;
    rooms_db_release(c);
    if (rc == ROOMS_E_NOT_FOUND) return http_respond_error(r, 404, "M_NOT_FOUND", "Room not found");
    if (rc != ROOMS_OK || listed < 0) {
        json_decref(d);
        return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    }
    json_object_set_new(d, "public", json_boolean(listed == 1));
    return http_respond_json(r, 200, d);
}

int rooms_admin_routes(http_server *s)
{
    return client_route(s, "GET", "/_synapse/admin/v1/rooms/{roomId}", get_room, 0);
}
