/*
 * core/client/rooms/crooms_iface.c - the seam between the rooms module and the room
 * directory, both ways: the interface "rooms/1" the core provides to plugins
 * (include/atrium/rooms.h: a room's summary, a user's membership, whether a user may send
 * a state event), and the core's one way to reach "directory/1" (include/atrium/directory.h).
 *
 * The summary is the room model's (rooms_summary, core/rooms/rooms_space.c: computed from
 * current_state with one query, as the space hierarchy shows it too). It also owns what
 * the room's m.room.canonical_alias may name (every alias of this server must point to the
 * room) and, when the directory deletes an alias, sending that event again without it (as
 * the user who deleted it, when the auth rules let them: the spec's recommendation and
 * what Synapse does; never as another user). What this file does not do: decide anything
 * about aliases or listing; that is the directory's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/rooms/crooms_api.h"
#include "core/runtime/iface.h"
#include "core/rooms/canonical_json.h"
#include "core/rooms/rooms_space.h"

static int canonical_content(PGconn *c, const char *room_id, json_t **out);

static int summary(PGconn *c, const char *room_id, json_t **out)
{
    return rooms_summary(c, room_id, false, out);
}

static int membership(PGconn *c, const char *room_id, const char *user_id,
                      char out[ATRIUM_MEMBERSHIP_LEN])
{
    bool failed = false;
    if (!rooms_version_of(c, room_id, &failed)) return failed ? ATRIUM_E_DB : ATRIUM_E_NOTFOUND;
    return rooms_membership_at(c, room_id, user_id, INT64_MAX, out, NULL) == ROOMS_OK
               ? 0
               : ATRIUM_E_DB;
}

static int may_send_state(PGconn *c, const char *room_id, const char *user_id,
                          const char *event_type)
{
    bool failed = false;
    const room_version *ver = rooms_version_of(c, room_id, &failed);
    if (!ver) return failed ? ATRIUM_E_DB : ATRIUM_E_NOTFOUND;
    room_auth_load a;
    int rc = rooms_load_auth(c, room_id, ver, user_id, NULL, &a);
    if (rc < 0) {
        json_decref(a.holder);
        return ATRIUM_E_DB;
    }
    json_t *content = json_object();
    char why[ROOM_AUTH_WHY_LEN];
    bool ok = room_auth_allows(&a.st, event_type, "", user_id, content, why);
    json_decref(content);
    json_decref(a.holder);
    return ok ? 1 : 0;
}

/* content of an m.room.canonical_alias event without alias (from `alias` and
 * `alt_aliases`; an alt_aliases left empty goes): a new object, or NULL when it does not
 * name alias. */
static json_t *canonical_without(const json_t *content, const char *alias)
{
    json_t *next = json_deep_copy(content);
    if (!next) return NULL;
    bool named = false;
    const char *main_alias = json_string_value(json_object_get(next, "alias"));
    if (main_alias && strcmp(main_alias, alias) == 0) {
        json_object_del(next, "alias");
        named = true;
    }
    json_t *alt = json_object_get(next, "alt_aliases");
    for (size_t i = json_array_size(alt); i-- > 0;) {
        const char *a = json_string_value(json_array_get(alt, i));
        if (a && strcmp(a, alias) == 0) {
            json_array_remove(alt, i);
            named = true;
        }
    }
    if (json_is_array(alt) && json_array_size(alt) == 0) json_object_del(next, "alt_aliases");
    if (!named) {
        json_decref(next);
        return NULL;
    }
    return next;
}

/* The content of the room's current m.room.canonical_alias (NULL when it has none or it
 * is redacted) into *out. ROOMS_OK or ROOMS_E_DB. */
static int canonical_content(PGconn *c, const char *room_id, json_t **out)
{
    *out = NULL;
    const char *p[1] = {room_id};
    PGresult *res = rooms_q(c,
                            "SELECT e.pdu FROM current_state cs JOIN events e"
                            " ON e.event_id = cs.event_id WHERE cs.room_id = $1"
                            " AND cs.type = 'm.room.canonical_alias' AND cs.state_key = ''"
                            " AND e.redacted_by IS NULL",
                            1, p, NULL);
    if (!res) return ROOMS_E_DB;
    json_t *pdu = PQntuples(res) == 1 ? json_loads(PQgetvalue(res, 0, 0), 0, NULL) : NULL;
    PQclear(res);
    json_t *content = json_object_get(pdu, "content");
    if (json_is_object(content)) *out = json_incref(content);
    json_decref(pdu);
    return ROOMS_OK;
}

#define CANONICAL_DROP_ARENA_BYTES 4096 /* the write path's scratch for one event */

static int canonical_alias_drop(PGconn *c, const char *room_id, const char *alias,
                                const char *user_id)
{
    rt_arena *arena = rt_arena_new(CANONICAL_DROP_ARENA_BYTES);
    if (!arena) return ATRIUM_E_NOMEM;
    room_tx tx;
    rooms_err e = {0};
    int rc = rooms_tx_begin(&tx, c, arena, room_id, &e);
    if (rc != ROOMS_OK) {
        rt_arena_free(arena);
        return rc == ROOMS_E_NOT_FOUND ? 0 : ATRIUM_E_DB;
    }
    json_t *content = NULL, *next = NULL;
    char why[ROOM_AUTH_WHY_LEN], id[EVENT_ID_LEN];
    rc = canonical_content(c, room_id, &content);
    if (rc == ROOMS_OK && content && (next = canonical_without(content, alias)) &&
        cjson_normalize(next, why, sizeof(why)) < 0)
        rc = rooms_set_err(&e, ROOMS_E_BAD_JSON, "%s", why);
    int out = 0;
    if (rc == ROOMS_OK && next) {
        room_new_event ev = {.sender = user_id, .type = "m.room.canonical_alias",
                             .state_key = "", .content = next};
        rc = rooms_tx_append(&tx, &ev, id, &e);
        if (rc == ROOMS_OK) rc = rooms_tx_commit(&tx, &e); /* rolls back itself on failure */
        else rooms_tx_rollback(&tx);
        if (rc == ROOMS_OK) out = 1;
        else if (rc == ROOMS_E_FORBIDDEN)
            rt_log(ATRIUM_LOG_INFO, "core", "alias %s of %s deleted; %s may not update the room's "
                   "canonical alias event, which still names it (%s)", alias, room_id, user_id,
                   e.why);
    } else {
        rooms_tx_rollback(&tx); /* nothing names the alias, or a failure */
    }
    json_decref(content);
    json_decref(next);
    rt_arena_free(arena);
    return rc == ROOMS_E_DB ? ATRIUM_E_DB : out;
}

static const atrium_rooms ROOMS_IFACE = {
    .size = sizeof(atrium_rooms),
    .version = ATRIUM_ROOMS_VERSION,
    .room_summary = summary,
    .membership = membership,
    .may_send_state = may_send_state,
    .canonical_alias_drop = canonical_alias_drop,
};

/* The write path's listing hook (core/rooms/rooms_tx.h): the directory plugin, when one
 * is enabled, refreshes its public list inside the transaction that changed the room. */
static int listing_changed(PGconn *c, const char *room_id)
{
    const atrium_directory *dir = crooms_directory();
    return dir ? dir->room_changed(c, room_id) : 0;
}

int crooms_iface_provide(void)
{
    rooms_tx_set_listing_hook(listing_changed);
    return rt_iface_add("core", ATRIUM_ROOMS_IFACE, &ROOMS_IFACE);
}

const atrium_directory *crooms_directory(void)
{
    return rt_iface_get(ATRIUM_DIRECTORY_IFACE, ATRIUM_DIRECTORY_V0_SIZE);
}

int crooms_directory_disabled(atrium_req *r)
{
    rooms_err e = {.code = ROOMS_E_NO_DIRECTORY};
    return rooms_fail(r, &e); /* the answer is written once, there */
}

int crooms_resolve_alias(PGconn *c, const char *alias, char room_id[ATRIUM_ROOM_ID_MAX_BYTES + 1],
                        rooms_err *e)
{
    const atrium_directory *d = crooms_directory();
    if (!d) return rooms_set_err(e, ROOMS_E_NO_DIRECTORY, "the room directory is disabled");
    int rc = d->alias_resolve(c, alias, room_id);
    if (rc == ATRIUM_E_NOTFOUND || rc == ATRIUM_E_INVAL)
        return rooms_set_err(e, ROOMS_E_NOT_FOUND, "Room alias %.255s not found", alias);
    if (rc < 0) return rooms_set_err(e, ROOMS_E_DB, "database");
    return ROOMS_OK;
}

/* Does canonical alias content name alias (as `alias` or in `alt_aliases`)? */
static bool canonical_names(const json_t *content, const char *alias)
{
    const char *main_alias = json_string_value(json_object_get(content, "alias"));
    if (main_alias && strcmp(main_alias, alias) == 0) return true;
    size_t i;
    const json_t *v;
    json_array_foreach(json_object_get(content, "alt_aliases"), i, v) {
        const char *a = json_string_value(v);
        if (a && strcmp(a, alias) == 0) return true;
    }
    return false;
}

/* One alias named by an m.room.canonical_alias event: well-formed, and when it is this
 * server's and new (current, the room's current content, does not name it), pointing to
 * room_id. The spec leaves aliases already in the event unchecked, so an alias deleted
 * while its deleter could not update the event does not block the next update. */
static int check_one_alias(PGconn *c, const char *room_id, const json_t *current,
                           const json_t *v, rooms_err *e)
{
    const char *alias = json_string_value(v);
    const char *colon = alias ? strchr(alias, ':') : NULL;
    if (!alias || alias[0] != '#' || !colon || colon == alias + 1 || !colon[1] ||
        strlen(alias) > ATRIUM_ROOM_ID_MAX_BYTES)
        return rooms_set_err(e, ROOMS_E_INVALID, "%.255s is not a room alias",
                             alias ? alias : "(not a string)");
    if (strcmp(colon + 1, rooms_server_name()) != 0) return ROOMS_OK; /* see the header */
    if (current && canonical_names(current, alias)) return ROOMS_OK;
    const atrium_directory *d = crooms_directory();
    if (!d)
        return rooms_set_err(e, ROOMS_E_BAD_ALIAS, "Room alias %.255s cannot be checked: the "
                             "room directory is disabled", alias);
    char target[ATRIUM_ROOM_ID_MAX_BYTES + 1];
    int rc = d->alias_resolve(c, alias, target);
    if (rc == ATRIUM_E_DB) return rooms_set_err(e, ROOMS_E_DB, "database");
    if (rc < 0 || strcmp(target, room_id) != 0)
        return rooms_set_err(e, ROOMS_E_BAD_ALIAS, "Room alias %.255s does not point to this room",
                             alias);
    return ROOMS_OK;
}

int crooms_check_canonical_alias(PGconn *c, const char *room_id, const json_t *content,
                                rooms_err *e)
{
    const json_t *alias = json_object_get(content, "alias");
    const json_t *alt = json_object_get(content, "alt_aliases");
    if (alt && !json_is_null(alt) && !json_is_array(alt))
        return rooms_set_err(e, ROOMS_E_INVALID, "alt_aliases must be a list of room aliases");
    json_t *current = NULL;
    if (canonical_content(c, room_id, &current) != ROOMS_OK)
        return rooms_set_err(e, ROOMS_E_DB, "database");
    int rc = ROOMS_OK;
    if (alias && !json_is_null(alias)) rc = check_one_alias(c, room_id, current, alias, e);
    size_t i;
    const json_t *v;
    json_array_foreach(json_is_array(alt) ? alt : NULL, i, v) {
        if (rc != ROOMS_OK) break;
        rc = check_one_alias(c, room_id, current, v, e);
    }
    json_decref(current);
    return rc;
}

/* One alias of another server the new content names: asked of its server when the room's
 * current event does not name it already. */
static bool remote_alias_ok(atrium_req *r, const atrium_directory *d, const char *room_id,
                            const json_t *current, const json_t *v, int *out)
{
    const char *alias = json_string_value(v);
    const char *colon = alias ? strchr(alias, ':') : NULL;
    if (!colon || strcmp(colon + 1, rooms_server_name()) == 0) return true; /* local: checked */
    if (current && canonical_names(current, alias)) return true;
    char target[ATRIUM_ROOM_ID_MAX_BYTES + 1];
    json_t *servers = NULL;
    int rc = d->alias_resolve_remote(r, alias, target, &servers);
    json_decref(servers);
    if (rc != ATRIUM_DIRECTORY_RESOLVED) {
        *out = rc;
        return false;
    }
    if (strcmp(target, room_id) == 0) return true;
    *out = http_respond_error(r, 400, "M_BAD_ALIAS", "Room alias %.255s does not point to this room",
                              alias);
    return false;
}

bool crooms_check_remote_canonical(atrium_req *r, PGconn *c, const char *room_id,
                                  const json_t *content, int *out)
{
    const atrium_directory *d = crooms_directory();
    if (!d || !ATRIUM_DIRECTORY_HAS(d, alias_resolve_remote)) return true; /* not checked */
    json_t *current = NULL;
    if (canonical_content(c, room_id, &current) != ROOMS_OK) {
        *out = http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
        return false;
    }
    bool ok = true;
    const json_t *alias = json_object_get(content, "alias");
    if (json_is_string(alias)) ok = remote_alias_ok(r, d, room_id, current, alias, out);
    size_t i;
    const json_t *v;
    json_array_foreach(json_object_get(content, "alt_aliases"), i, v) {
        if (!ok) break;
        ok = remote_alias_ok(r, d, room_id, current, v, out);
    }
    json_decref(current);
    return ok;
}
