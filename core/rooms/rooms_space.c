/*
 * core/rooms/rooms_space.c - a room as a space hierarchy and the public room list show it:
 * its summary, a space's ordered children, and the rule of who may see a room there
 * (rooms_space.h). Everything is read from current_state, the contract other modules
 * read, so a room none of our users is in answers from what it was when we left: callers
 * that care ask rooms_space_resident first. What this file does not do: walk a tree,
 * page, or ask other servers (the client's and the federation's hierarchy do).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rooms/rooms.h"
#include "core/rooms/rooms_space.h"
#include "core/rooms/rooms_tx.h"

/* The room's version, joined count and the contents of the state a summary shows. */
static int summary_state(PGconn *c, const char *room_id, json_t **state, json_int_t *members,
                         char version[32])
{
    const char *p[1] = {room_id};
    PGresult *res = rooms_q(
        c,
        "SELECT r.joined_members,"
        " coalesce(jsonb_object_agg(cs.type, e.pdu::jsonb -> 'content')"
        "  FILTER (WHERE cs.type IS NOT NULL AND e.redacted_by IS NULL), '{}')::text,"
        " r.room_version"
        " FROM rooms r LEFT JOIN current_state cs ON cs.room_id = r.room_id"
        "  AND cs.state_key = '' AND cs.type IN ('m.room.create', 'm.room.name',"
        "  'm.room.topic', 'm.room.avatar', 'm.room.canonical_alias', 'm.room.join_rules',"
        "  'm.room.guest_access', 'm.room.history_visibility', 'm.room.encryption')"
        " LEFT JOIN events e ON e.event_id = cs.event_id"
        " WHERE r.room_id = $1 GROUP BY r.room_id",
        1, p, NULL);
    if (!res) return ATRIUM_E_DB;
    if (PQntuples(res) == 0) {
        PQclear(res);
        return ATRIUM_E_NOTFOUND;
    }
    *state = json_loads(PQgetvalue(res, 0, 1), 0, NULL);
    *members = (json_int_t)strtoll(PQgetvalue(res, 0, 0), NULL, 10);
    snprintf(version, 32, "%s", PQgetvalue(res, 0, 2));
    PQclear(res);
    return *state ? 0 : ATRIUM_E_DB;
}

/* The m.room_membership rooms of a restricted join rule's content, as a new array. */
static json_t *allowed_rooms(const json_t *join_rules)
{
    json_t *out = json_array();
    const char *rule = json_string_value(json_object_get(join_rules, "join_rule"));
    if (!out || !rule || (strcmp(rule, "restricted") != 0 && strcmp(rule, "knock_restricted") != 0))
        return out;
    size_t i;
    json_t *a;
    json_array_foreach(json_object_get(join_rules, "allow"), i, a) {
        const char *type = json_string_value(json_object_get(a, "type"));
        const char *room = json_string_value(json_object_get(a, "room_id"));
        if (json_array_size(out) >= ROOMS_SPACE_MAX_ALLOWED) break;
        if (type && strcmp(type, "m.room_membership") == 0 && room && rooms_room_id_ok(room))
            json_array_append_new(out, json_string(room));
    }
    return out;
}

int rooms_summary(PGconn *c, const char *room_id, bool extended, json_t **out)
{
    *out = NULL;
    json_t *state = NULL;
    json_int_t members = 0;
    char version[32];
    int rc = summary_state(c, room_id, &state, &members, version);
    if (rc < 0) return rc;
#define FIELD(type, key) json_object_get(json_object_get(state, type), key)
    const char *jr = json_string_value(FIELD("m.room.join_rules", "join_rule"));
    const char *ga = json_string_value(FIELD("m.room.guest_access", "guest_access"));
    const char *hv = json_string_value(FIELD("m.room.history_visibility", "history_visibility"));
    json_t *s = json_pack("{s:s, s:I, s:s, s:b, s:b}", "room_id", room_id,
                          "num_joined_members", members, "join_rule", jr ? jr : "invite",
                          "guest_can_join", ga && strcmp(ga, "can_join") == 0,
                          "world_readable", hv && strcmp(hv, "world_readable") == 0);
    static const struct {
        const char *type, *key, *as;
        bool extended;
    } OPTIONAL[] = {
        {"m.room.name", "name", "name", false},
        {"m.room.topic", "topic", "topic", false},
        {"m.room.avatar", "url", "avatar_url", false},
        {"m.room.canonical_alias", "alias", "canonical_alias", false},
        {"m.room.create", "type", "room_type", false},
        {"m.room.encryption", "algorithm", "encryption", true},
    };
    for (size_t i = 0; s && i < sizeof(OPTIONAL) / sizeof(OPTIONAL[0]); i++) {
        json_t *v = FIELD(OPTIONAL[i].type, OPTIONAL[i].key);
        if ((extended || !OPTIONAL[i].extended) && json_is_string(v) && json_string_length(v) > 0)
            json_object_set(s, OPTIONAL[i].as, v);
    }
    if (s && extended) {
        json_object_set_new(s, "room_version", json_string(version));
        json_object_set_new(s, "allowed_room_ids",
                            allowed_rooms(json_object_get(state, "m.room.join_rules")));
    }
#undef FIELD
    json_decref(state);
    if (!s) return ATRIUM_E_NOMEM;
    *out = s;
    return 0;
}

/* ---- children ----------------------------------------------------------------------- */

bool rooms_space_order_ok(const json_t *order)
{
    const char *s = json_string_value(order);
    size_t n = s ? json_string_length(order) : 0;
    if (n == 0 || n > ROOMS_SPACE_MAX_ORDER_CHARS) return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e) return false;
    return true;
}

static bool via_ok(const json_t *via)
{
    if (!json_is_array(via) || json_array_size(via) == 0) return false;
    size_t i;
    json_t *v;
    json_array_foreach(via, i, v) if (!json_is_string(v) || json_string_length(v) == 0) return false;
    return true;
}

/* The spec's order of children: a valid `order` first, by it; then origin_server_ts; then
 * the room ID. */
static int child_cmp(const void *a, const void *b)
{
    const json_t *x = *(json_t *const *)a, *y = *(json_t *const *)b;
    const json_t *ox = json_object_get(json_object_get(x, "content"), "order");
    const json_t *oy = json_object_get(json_object_get(y, "content"), "order");
    bool vx = rooms_space_order_ok(ox), vy = rooms_space_order_ok(oy);
    if (vx != vy) return vx ? -1 : 1;
    if (vx) {
        int c = strcmp(json_string_value(ox), json_string_value(oy));
        if (c) return c;
    }
    json_int_t tx = json_integer_value(json_object_get(x, "origin_server_ts"));
    json_int_t ty = json_integer_value(json_object_get(y, "origin_server_ts"));
    if (tx != ty) return tx < ty ? -1 : 1;
    return strcmp(json_string_value(json_object_get(x, "state_key")),
                  json_string_value(json_object_get(y, "state_key")));
}

json_t *rooms_space_children_filter(const json_t *stripped, bool suggested_only)
{
    size_t n = json_array_size(stripped), k = 0;
    json_t **kids = calloc(n + 1, sizeof(*kids));
    if (!kids) return NULL;
    for (size_t i = 0; i < n; i++) {
        const json_t *ev = json_array_get(stripped, i);
        const json_t *content = json_object_get(ev, "content");
        const char *key = json_string_value(json_object_get(ev, "state_key"));
        const char *type = json_string_value(json_object_get(ev, "type"));
        const char *sender = json_string_value(json_object_get(ev, "sender"));
        json_t *ts = json_object_get(ev, "origin_server_ts");
        if (!key || !rooms_room_id_ok(key) || !type || strcmp(type, "m.space.child") != 0 ||
            !sender || !json_is_integer(ts) || !via_ok(json_object_get(content, "via")) ||
            (suggested_only && !json_is_true(json_object_get(content, "suggested"))))
            continue;
        kids[k] = json_pack("{s:s, s:s, s:O, s:s, s:O}", "type", type, "state_key", key,
                            "content", content, "sender", sender, "origin_server_ts", ts);
        if (kids[k]) k++;
    }
    qsort(kids, k, sizeof(*kids), child_cmp);
    json_t *arr = json_array();
    for (size_t i = 0; i < k; i++) {
        if (arr && i < ROOMS_SPACE_MAX_CHILDREN) json_array_append(arr, kids[i]);
        json_decref(kids[i]);
    }
    free(kids);
    return arr;
}

int rooms_space_children(PGconn *c, const char *room_id, bool suggested_only, json_t **out)
{
    *out = NULL;
    const char *p[1] = {room_id};
    /* Read more than kept: children without a via are common (removed ones). */
    PGresult *res = rooms_q(c,
                            "SELECT e.pdu FROM current_state cs"
                            " JOIN events e ON e.event_id = cs.event_id"
                            " WHERE cs.room_id = $1 AND cs.type = 'm.space.child'"
                            " AND e.redacted_by IS NULL ORDER BY cs.state_key LIMIT 1000",
                            1, p, NULL);
    if (!res) return ATRIUM_E_DB;
    json_t *all = json_array();
    for (int i = 0; all && i < PQntuples(res); i++)
        json_array_append_new(all, json_loads(PQgetvalue(res, i, 0), 0, NULL));
    PQclear(res);
    *out = all ? rooms_space_children_filter(all, suggested_only) : NULL;
    json_decref(all);
    return *out ? 0 : ATRIUM_E_DB;
}

/* ---- who may see ------------------------------------------------------------------- */

int rooms_space_resident(PGconn *c, const char *room_id)
{
    const char *p[2] = {room_id, rooms_server_name()};
    PGresult *res = rooms_q(c,
                            "SELECT 1 FROM current_state WHERE room_id = $1"
                            " AND type = 'm.room.member' AND membership = 'join'"
                            " AND substr(state_key, strpos(state_key, ':') + 1) = $2 LIMIT 1",
                            2, p, NULL);
    if (!res) return -1;
    int n = PQntuples(res);
    PQclear(res);
    return n > 0;
}

/* Is user_id (or one of server's users) a member of room_id: joined (with invite_counts,
 * or invited)? A user's invite to a room this server is not in is their newest membership
 * (an outlier kept with remote_invites), not current state. 1, 0, -1. */
static int member_of(PGconn *c, const char *room_id, const char *user_id, const char *server,
                     bool invite_counts)
{
    const char *p[3] = {room_id, user_id ? user_id : server, invite_counts ? "t" : "f"};
    PGresult *res = rooms_q(
        c,
        user_id ? "SELECT 1 FROM current_state WHERE room_id = $1 AND type = 'm.room.member'"
                  " AND state_key = $2 AND (membership = 'join'"
                  "  OR ($3::boolean AND membership = 'invite'))"
                  " UNION ALL SELECT 1 FROM (SELECT membership FROM memberships"
                  "  WHERE room_id = $1 AND user_id = $2 ORDER BY stream_pos DESC LIMIT 1) m"
                  " WHERE $3::boolean AND m.membership = 'invite'"
                : "SELECT 1 FROM current_state WHERE room_id = $1 AND type = 'm.room.member'"
                  " AND substr(state_key, strpos(state_key, ':') + 1) = $2"
                  " AND (membership = 'join' OR ($3::boolean AND membership = 'invite')) LIMIT 1",
        3, p, NULL);
    if (!res) return -1;
    int n = PQntuples(res);
    PQclear(res);
    return n > 0;
}

int rooms_space_may_see(PGconn *c, const json_t *summary, const char *user_id,
                        const char *server)
{
    const char *room = json_string_value(json_object_get(summary, "room_id"));
    const char *rule = json_string_value(json_object_get(summary, "join_rule"));
    if (!room || !rule) return 0;
    if (strcmp(rule, "public") == 0 || strcmp(rule, "knock") == 0 ||
        strcmp(rule, "knock_restricted") == 0 ||
        json_is_true(json_object_get(summary, "world_readable")))
        return 1;
    int rc = member_of(c, room, user_id, server, true);
    if (rc != 0) return rc;
    if (strcmp(rule, "restricted") != 0) return 0;
    size_t i;
    json_t *a;
    json_array_foreach(json_object_get(summary, "allowed_room_ids"), i, a) {
        rc = member_of(c, json_string_value(a), user_id, server, false);
        if (rc != 0) return rc;
    }
    return 0;
}

/* ---- restricted joins --------------------------------------------------------------- */

/* The local joined member of room_id with the highest power level at or above the invite
 * level, into out ("" when none). 0 or -1 database. */
static int pick_authoriser(PGconn *c, const room_auth_state *st, const char *room_id,
                           char out[ROOMS_USER_ID_BYTES])
{
    out[0] = '\0';
    const char *p[2] = {room_id, rooms_server_name()};
    PGresult *res = rooms_q(c,
                            "SELECT state_key FROM current_state WHERE room_id = $1"
                            " AND type = 'm.room.member' AND membership = 'join'"
                            " AND substr(state_key, strpos(state_key, ':') + 1) = $2"
                            " ORDER BY state_key LIMIT 1000",
                            2, p, NULL);
    if (!res) return -1;
    int64_t need = room_auth_action_level(st, "invite"), best = INT64_MIN;
    for (int i = 0; i < PQntuples(res); i++) {
        const char *u = PQgetvalue(res, i, 0);
        int64_t level = room_auth_user_level(st, u);
        if (level >= need && level > best && strlen(u) < ROOMS_USER_ID_BYTES) {
            best = level;
            snprintf(out, ROOMS_USER_ID_BYTES, "%s", u);
        }
    }
    PQclear(res);
    return 0;
}

/* Is user_id joined to one of allowed (room IDs) as this server sees them? 1, 0 (and
 * *known: this server is in at least one of them), -1 database. */
static int joined_to_allowed(PGconn *c, const json_t *allowed, const char *user_id, bool *known)
{
    *known = false;
    size_t i;
    json_t *a;
    json_array_foreach(allowed, i, a) {
        int res = rooms_space_resident(c, json_string_value(a));
        if (res < 0) return -1;
        if (res == 0) continue;
        *known = true;
        int rc = member_of(c, json_string_value(a), user_id, NULL, false);
        if (rc != 0) return rc;
    }
    return 0;
}

int rooms_restricted_authoriser(PGconn *c, const char *room_id, const char *user_id,
                                char out[ROOMS_USER_ID_BYTES], rooms_err *e)
{
    out[0] = '\0';
    bool failed = false;
    const room_version *ver = rooms_version_of(c, room_id, &failed);
    if (!ver) return rooms_set_err(e, failed ? ROOMS_E_DB : ROOMS_E_NOT_FOUND, "Unknown room");
    room_auth_load a;
    if (rooms_load_auth(c, room_id, ver, user_id, user_id, &a) < 0) {
        json_decref(a.holder);
        return rooms_set_err(e, ROOMS_E_DB, "The database failed");
    }
    const char *rule = json_string_value(json_object_get(a.st.join_rules, "join_rule"));
    const char *mem = a.st.target_membership;
    bool restricted = rule && ((ver->restricted_join && strcmp(rule, "restricted") == 0) ||
                               (ver->knock_restricted && strcmp(rule, "knock_restricted") == 0));
    int rc = ROOMS_OK;
    if (restricted && !(mem && (strcmp(mem, "join") == 0 || strcmp(mem, "invite") == 0))) {
        json_t *allowed = allowed_rooms(a.st.join_rules);
        bool known = false;
        int joined = allowed ? joined_to_allowed(c, allowed, user_id, &known) : -1;
        json_decref(allowed);
        if (joined < 0 || (joined == 1 && pick_authoriser(c, &a.st, room_id, out) < 0))
            rc = rooms_set_err(e, ROOMS_E_DB, "The database failed");
        else if (joined == 0 && !known)
            rc = rooms_set_err(e, ROOMS_E_UNABLE_TO_AUTHORISE,
                               "This server is in none of the rooms the join rule allows");
        else if (joined == 0)
            rc = rooms_set_err(e, ROOMS_E_FORBIDDEN,
                               "You are not a member of any room this room's join rule allows");
        else if (!out[0])
            rc = rooms_set_err(e, ROOMS_E_UNABLE_TO_GRANT,
                               "No user of this server in the room may invite");
    }
    json_decref(a.holder);
    return rc;
}
