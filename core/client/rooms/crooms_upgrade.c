/*
 * core/client/rooms/crooms_upgrade.c - POST /_matrix/client/v3/rooms/{roomId}/upgrade.
 *
 * Owns the spec's "Room Upgrades" server behaviour: a user who may send m.room.tombstone in
 * the old room gets a replacement room of the requested version whose create event names
 * the old room as its `predecessor` (with the old room's last event, and its `type` and
 * `m.federate: false` carried over), the transferable state copied (server ACL,
 * encryption, name, avatar, topic, guest access, history visibility, join rules, power
 * levels), then a tombstone in the old room pointing at the new one and the old room's
 * power levels raised so that ordinary members can no longer talk or invite there.
 *
 * Two transactions of the one write path (core/rooms/rooms_tx.c), new room first: the tombstone
 * names the new room, and the new room must exist when a client follows it. Whether the
 * user may send the tombstone is asked before anything is written, so the second
 * transaction fails only on a database failure (the new room then stays, unreferenced).
 * The copied power levels are written twice when the upgrader needs more power to copy
 * the rest: first with the upgrader raised to what the copied state needs, last as they
 * were (Synapse does the same). Levels that older room versions wrote as strings become
 * integers, which newer versions require. Not here: moving local aliases (the directory
 * interface, include/atrium/directory.h, has no way to list a room's aliases) and
 * membership (the spec leaves it behind).
 */
#include <stdio.h>
#include <string.h>

#include "core/client/auth/auth.h"
#include "core/client/ratelimits.h"
#include "core/client/rooms/crooms_api.h"

#define UPGRADE_MAX_BODY_BYTES 4096
#define UPGRADE_RESTRICTED_LEVEL 50 /* old room's events_default/invite at least this */
#define UPGRADE_TOMBSTONE_BODY "This room has been replaced"

/* State the spec recommends carrying into the replacement room, in the order written
 * (power levels come first, see write_new_room). */
static const char *const TRANSFERABLE[] = {
    "m.room.server_acl", "m.room.encryption", "m.room.name", "m.room.avatar", "m.room.topic",
    "m.room.guest_access", "m.room.history_visibility", "m.room.join_rules", NULL};

/* What the new room is built from, read from the old room's current state. */
typedef struct old_room {
    const room_version *ver;
    const char *last_event_id;
    json_t *create;     /* content of m.room.create */
    json_t *pl;         /* content of m.room.power_levels, or NULL */
    json_t *state;      /* {type: content} of the TRANSFERABLE types present */
} old_room;

static void old_room_free(old_room *o)
{
    json_decref(o->create);
    json_decref(o->pl);
    json_decref(o->state);
}

/* Read the old room's create event, power levels and transferable state (contents as the
 * rules see them: redacted ones redacted). ROOMS_OK, ROOMS_E_NOT_FOUND, ROOMS_E_DB. */
static int load_old_room(PGconn *c, rt_arena *a, const char *room_id, old_room *o, rooms_err *e)
{
    memset(o, 0, sizeof(*o));
    bool db_failed = false;
    o->ver = rooms_version_of(c, room_id, &db_failed);
    if (!o->ver) return db_failed ? rooms_set_err(e, ROOMS_E_DB, "database")
                                  : rooms_set_err(e, ROOMS_E_NOT_FOUND, "Unknown room");
    const char *p[1] = {room_id};
    PGresult *res = rooms_q(c, "SELECT last_event_id FROM rooms WHERE room_id = $1", 1, p, NULL);
    if (!res || PQntuples(res) != 1) {
        if (res) PQclear(res);
        return rooms_set_err(e, ROOMS_E_DB, "database");
    }
    o->last_event_id = rt_arena_printf(a, "%s", PQgetvalue(res, 0, 0));
    PQclear(res);
    res = rooms_q(c,
                  "SELECT cs.type, e.pdu, e.redacted_by IS NOT NULL"
                  " FROM current_state cs JOIN events e ON e.event_id = cs.event_id"
                  " WHERE cs.room_id = $1 AND cs.state_key = '' AND cs.type IN ("
                  "'m.room.create', 'm.room.power_levels', 'm.room.server_acl', "
                  "'m.room.encryption', 'm.room.name', 'm.room.avatar', 'm.room.topic', "
                  "'m.room.guest_access', 'm.room.history_visibility', 'm.room.join_rules')",
                  1, p, NULL);
    if (!res) return rooms_set_err(e, ROOMS_E_DB, "database");
    o->state = json_object();
    for (int i = 0; i < PQntuples(res); i++) {
        const char *type = PQgetvalue(res, i, 0);
        json_t *pdu = json_loads(PQgetvalue(res, i, 1), 0, NULL);
        json_t *content = json_object_get(pdu, "content");
        json_t *kept = PQgetvalue(res, i, 2)[0] == 't' ? event_redact_content(o->ver, type, content)
                                                       : json_deep_copy(content);
        json_decref(pdu);
        if (!kept) continue;
        if (strcmp(type, "m.room.create") == 0) o->create = kept;
        else if (strcmp(type, "m.room.power_levels") == 0) o->pl = kept;
        else json_object_set_new(o->state, type, kept);
    }
    PQclear(res);
    if (!o->create) return rooms_set_err(e, ROOMS_E_NOT_FOUND, "Unknown room");
    return ROOMS_OK;
}

/* The old room's power levels with every level an integer (as v10+ require): levels in
 * string form count as the old version reads them; what is no level is left out. */
static json_t *integer_power_levels(const room_version *old_ver, const json_t *pl)
{
    json_t *out = json_object();
    const char *k;
    json_t *val;
    int64_t n;
    json_object_foreach((json_t *)pl, k, val) {
        if (json_is_object(val)) {
            json_t *m = json_object();
            const char *mk;
            json_t *mv;
            json_object_foreach(val, mk, mv)
                if (room_auth_level_value(old_ver, mv, &n)) json_object_set_new(m, mk, json_integer(n));
            json_object_set_new(out, k, m);
        } else if (room_auth_level_value(old_ver, val, &n)) {
            json_object_set_new(out, k, json_integer(n));
        }
    }
    return out;
}

/* The level the upgrader needs to write every copied state event and the final power
 * levels under pl. */
static int64_t level_needed(const room_version *v, const json_t *pl, const json_t *state)
{
    room_auth_state st = {.version = v, .power_levels = pl};
    int64_t need = room_auth_event_level(&st, "m.room.power_levels", true);
    const char *type;
    json_t *content;
    json_object_foreach((json_t *)state, type, content) {
        int64_t l = room_auth_event_level(&st, type, true);
        if (l > need) need = l;
    }
    return need;
}

static bool put(room_tx *tx, const char *sender, const char *type, json_t *content, rooms_err *e)
{
    room_new_event ev = {.sender = sender, .type = type, .state_key = "", .content = content};
    char id[EVENT_ID_LEN];
    int rc = rooms_tx_append(tx, &ev, id, e);
    json_decref(content);
    return rc == ROOMS_OK;
}

static bool write_new_room(room_tx *tx, const old_room *o, const char *old_id, const char *user,
                           rooms_err *e)
{
    const room_version *v = tx->ver;
    json_t *create = json_pack("{s:s, s:{s:s, s:s}}", "room_version", v->id, "predecessor",
                               "room_id", old_id, "event_id", o->last_event_id);
    if (!v->creator_is_sender) json_object_set_new(create, "creator", json_string(user));
    json_t *room_type = json_object_get(o->create, "type");
    if (json_is_string(room_type)) json_object_set(create, "type", room_type);
    if (json_is_false(json_object_get(o->create, "m.federate")))
        json_object_set_new(create, "m.federate", json_false());
    if (!put(tx, user, "m.room.create", create, e)) return false;
    room_new_event join = {.sender = user, .type = "m.room.member", .state_key = user,
                           .content = crooms_member_content(tx->c, user, "join")};
    char id[EVENT_ID_LEN];
    int rc = rooms_tx_append(tx, &join, id, e);
    json_decref(join.content);
    if (rc != ROOMS_OK) return false;

    json_t *pl = o->pl ? integer_power_levels(o->ver, o->pl) : NULL;
    json_t *raised = NULL;
    if (pl) {
        room_auth_state st = {.version = v, .power_levels = pl};
        int64_t need = level_needed(v, pl, o->state);
        if (room_auth_user_level(&st, user) < need) {
            raised = json_deep_copy(pl);
            json_t *users = json_object_get(raised, "users");
            if (!json_is_object(users)) json_object_set_new(raised, "users", users = json_object());
            json_object_set_new(users, user, json_integer(need));
        }
        if (!put(tx, user, "m.room.power_levels", json_incref(raised ? raised : pl), e)) goto fail;
    }
    for (size_t i = 0; TRANSFERABLE[i]; i++) {
        json_t *content = json_object_get(o->state, TRANSFERABLE[i]);
        if (content && !put(tx, user, TRANSFERABLE[i], json_deep_copy(content), e)) goto fail;
    }
    if (raised && !put(tx, user, "m.room.power_levels", json_incref(pl), e)) goto fail;
    json_decref(raised);
    json_decref(pl);
    return true;
fail:
    json_decref(raised);
    json_decref(pl);
    return false;
}

/* An integer level of pl (as version v reads it), or def. */
static int64_t pl_level(const room_version *v, const json_t *pl, const char *key, int64_t def)
{
    int64_t n;
    const json_t *val = pl ? json_object_get(pl, key) : NULL;
    return val && room_auth_level_value(v, val, &n) ? n : def;
}

/* The old room's power levels once ordinary members can no longer talk or invite:
 * events_default and invite at least max(50, users_default + 1). NULL when nothing
 * changes. */
static json_t *restricted_power_levels(const room_auth_state *st)
{
    const room_version *v = st->version;
    int64_t floor = pl_level(v, st->power_levels, "users_default", 0) + 1;
    if (floor < UPGRADE_RESTRICTED_LEVEL) floor = UPGRADE_RESTRICTED_LEVEL;
    json_t *pl = st->power_levels ? json_deep_copy(st->power_levels) : json_object();
    bool changed = false;
    static const char *const KEYS[] = {"events_default", "invite", NULL};
    for (size_t i = 0; KEYS[i]; i++) {
        if (pl_level(v, st->power_levels, KEYS[i], 0) >= floor) continue;
        json_object_set_new(pl, KEYS[i], json_integer(floor));
        changed = true;
    }
    if (!changed) {
        json_decref(pl);
        return NULL;
    }
    return pl;
}

/* The tombstone and the restricted power levels, in the old room. */
static bool close_old_room(PGconn *c, rt_arena *a, const char *old_id, const char *new_id,
                           const char *user, rooms_err *e)
{
    room_tx tx;
    if (rooms_tx_begin(&tx, c, a, old_id, e) != ROOMS_OK) return false;
    json_t *tomb = json_pack("{s:s, s:s}", "body", UPGRADE_TOMBSTONE_BODY, "replacement_room", new_id);
    bool ok = put(&tx, user, "m.room.tombstone", tomb, e);
    if (ok) {
        room_auth_load al;
        if (rooms_load_auth(c, old_id, tx.ver, user, NULL, &al) != ROOMS_OK) {
            json_decref(al.holder);
            rooms_tx_rollback(&tx);
            rooms_set_err(e, ROOMS_E_DB, "database");
            return false;
        }
        json_t *pl = restricted_power_levels(&al.st);
        char why[ROOM_AUTH_WHY_LEN];
        /* Best effort: a user who may tombstone but not change power levels still upgrades. */
        if (pl && room_auth_allows(&al.st, "m.room.power_levels", "", user, pl, why))
            ok = put(&tx, user, "m.room.power_levels", json_incref(pl), e);
        json_decref(pl);
        json_decref(al.holder);
    }
    if (!ok) {
        rooms_tx_rollback(&tx);
        return false;
    }
    return rooms_tx_commit(&tx, e) == ROOMS_OK;
}

/* POST /_matrix/client/v3/rooms/{roomId}/upgrade */
static int post_upgrade(atrium_req *r)
{
    const char *user = auth_request(r);
    if (!user) return ATRIUM_DONE;
    const char *old_id = crooms_param_room(r);
    if (!old_id) return ATRIUM_DONE;
    json_t *body = http_req_json(r);
    if (!body) return ATRIUM_DONE;
    const char *version;
    if (!http_field_string(r, body, "new_version", true, 16, &version)) return ATRIUM_DONE;
    const room_version *ver = room_version_find_creatable(version);
    if (!ver)
        return http_respond_error(r, 400, "M_UNSUPPORTED_ROOM_VERSION", "Room version %.16s is "
                                  "not one this server creates", version);
    if (ratelimit_refused(r, ratelimit_message())) return ATRIUM_DONE;
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    rooms_err e = {0};
    old_room o;
    int rc = load_old_room(c, r->arena, old_id, &o, &e);
    char new_id[EVENT_MAX_ID_BYTES + 1];
    crooms_new_room_id(new_id, sizeof(new_id));
    if (rc == ROOMS_OK) {
        /* Step 1: may the user send the tombstone? Asked before anything is written. */
        room_auth_load al;
        if (rooms_load_auth(c, old_id, o.ver, user, NULL, &al) != ROOMS_OK) {
            rc = rooms_set_err(&e, ROOMS_E_DB, "database");
        } else {
            json_t *tomb = json_pack("{s:s, s:s}", "body", UPGRADE_TOMBSTONE_BODY,
                                     "replacement_room", new_id);
            char why[ROOM_AUTH_WHY_LEN];
            if (!room_auth_allows(&al.st, "m.room.tombstone", "", user, tomb, why))
                rc = rooms_set_err(&e, ROOMS_E_FORBIDDEN, "You may not upgrade this room: %s", why);
            json_decref(tomb);
        }
        json_decref(al.holder);
    }
    if (rc == ROOMS_OK) {
        room_tx tx;
        rc = rooms_tx_begin_new(&tx, c, r->arena, new_id, ver, user, &e);
        if (rc == ROOMS_OK && !write_new_room(&tx, &o, old_id, user, &e)) {
            rooms_tx_rollback(&tx);
            rc = e.code ? e.code : ROOMS_E_DB;
        } else if (rc == ROOMS_OK) {
            rc = rooms_tx_commit(&tx, &e);
        }
    }
    if (rc == ROOMS_OK && !close_old_room(c, r->arena, old_id, new_id, user, &e))
        rc = e.code ? e.code : ROOMS_E_DB;
    old_room_free(&o);
    http_db_checkin(c);
    if (rc != ROOMS_OK) {
        if (!e.code) rooms_set_err(&e, rc, "database");
        return rooms_fail(r, &e);
    }
    return http_respond_json(r, 200, json_pack("{s:s}", "replacement_room", new_id));
}

int crooms_upgrade_routes(http_server *s)
{
    return client_route(s, "POST", "/_matrix/client/v3/rooms/{roomId}/upgrade", post_upgrade,
                        UPGRADE_MAX_BODY_BYTES);
}
