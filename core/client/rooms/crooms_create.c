/*
 * core/client/rooms/crooms_create.c - POST /_matrix/client/v3/createRoom.
 *
 * Owns the spec's order of a new room's events (create, the creator's join, power levels,
 * the preset's join rules / history visibility / guest access, initial_state, name,
 * topic, invites) and the presets' meaning. Every event goes through the one write path
 * (core/rooms/rooms_tx.c) inside one transaction, so a room is created whole or not at all.
 * room_alias_name becomes the alias #<name>:<server>, created through the room directory
 * (include/atrium/directory.h) in the same transaction, followed by an
 * m.room.canonical_alias event; visibility "public" lists the room, in that transaction too
 * (403 first when the directory's publication rule does not let the user).
 * So a room and its alias exist together or neither does. Without an enabled directory,
 * room_alias_name is 400 M_UNRECOGNIZED and visibility "public" creates an unlisted room.
 * Users of other servers in `invite` are invited once the room exists, each through their
 * server (its signature is needed), on the rooms module's remote pool: the request is
 * handed off with the room's ID in its core_state, so the run there invites and answers
 * (a refusal is the answer; the room stays, as with an invite sent afterwards).
 * Third-party invites (invite_3pid) are refused with 400 M_INVALID_PARAM.
 */
#include <sodium.h>
#include <stdio.h>
#include <string.h>

#include "core/client/accounts/accounts.h"
#include "core/client/appservice/appservice.h"
#include "core/client/auth/auth.h"
#include "core/rooms/canonical_json.h"
#include "core/client/ratelimits.h"
#include "core/client/rooms/crooms_api.h"
#include "core/rooms/canonical_json.h"

/* Levels of the default m.room.power_levels (Synapse-compatible). */
#define PL_CREATOR 100
#define PL_MODERATOR 50
#define PL_ADMIN_EVENTS 100

typedef struct preset {
    const char *name;
    const char *join_rule, *history_visibility, *guest_access;
    int invite_level;
    bool invitees_are_admins;
} preset;

static const preset PRESETS[] = {
    {"private_chat", "invite", "shared", "can_join", 0, false},
    {"trusted_private_chat", "invite", "shared", "can_join", 0, true},
    {"public_chat", "public", "shared", "forbidden", PL_MODERATOR, false},
};

static const preset *find_preset(const char *name)
{
    for (size_t i = 0; i < sizeof(PRESETS) / sizeof(PRESETS[0]); i++)
        if (strcmp(PRESETS[i].name, name) == 0) return &PRESETS[i];
    return NULL;
}

static json_t *default_power_levels(const char *creator, const preset *p, json_t *invites)
{
    json_t *users = json_pack("{s:i}", creator, PL_CREATOR);
    if (p->invitees_are_admins)
        for (size_t i = 0; i < json_array_size(invites); i++)
            json_object_set_new(users, json_string_value(json_array_get(invites, i)),
                                json_integer(PL_CREATOR));
    return json_pack("{s:o, s:i, s:{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i}, s:i, s:i, s:i, s:i,"
                     " s:i, s:i, s:{s:i}}",
                     "users", users, "users_default", 0, "events", "m.room.name", PL_MODERATOR,
                     "m.room.power_levels", PL_ADMIN_EVENTS, "m.room.history_visibility",
                     PL_ADMIN_EVENTS, "m.room.canonical_alias", PL_MODERATOR, "m.room.avatar",
                     PL_MODERATOR, "m.room.tombstone", PL_ADMIN_EVENTS, "m.room.server_acl",
                     PL_ADMIN_EVENTS, "m.room.encryption", PL_ADMIN_EVENTS, "events_default", 0,
                     "state_default", PL_MODERATOR, "ban", PL_MODERATOR, "kick", PL_MODERATOR,
                     "redact", PL_MODERATOR, "invite", p->invite_level, "notifications", "room",
                     PL_MODERATOR);
}

void crooms_new_room_id(char *out, size_t len)
{
    static const char LETTERS[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    char local[CROOMS_ID_RANDOM_CHARS + 1];
    for (size_t i = 0; i < CROOMS_ID_RANDOM_CHARS; i++)
        local[i] = LETTERS[randombytes_uniform(sizeof(LETTERS) - 1)];
    local[CROOMS_ID_RANDOM_CHARS] = '\0';
    snprintf(out, len, "!%s:%s", local, rooms_server_name());
}

/* The parsed request. */
typedef struct create_req {
    const preset *preset;
    const room_version *ver;
    const char *name, *topic;
    const char *alias;        /* "#<room_alias_name>:<server>" in request memory, or NULL */
    bool publish;             /* visibility "public" */
    json_t *invites;          /* array of user IDs (borrowed from the body) */
    json_t *initial_state;    /* array, may be NULL */
    json_t *creation_content; /* object, may be NULL */
    json_t *pl_override;      /* object, may be NULL */
    bool is_direct;
} create_req;

static bool bad(atrium_req *r, const char *errcode, const char *msg)
{
    http_respond_error(r, 400, errcode, "%s", msg);
    return false;
}

static bool parse_invites(atrium_req *r, json_t *body, create_req *q)
{
    q->invites = json_object_get(body, "invite");
    if (!q->invites || json_is_null(q->invites)) {
        q->invites = NULL;
        return true;
    }
    if (!json_is_array(q->invites)) return bad(r, "M_BAD_JSON", "'invite' must be a list of user IDs");
    if (json_array_size(q->invites) > ROOMS_MAX_INVITES)
        return bad(r, "M_INVALID_PARAM", "Too many invites");
    for (size_t i = 0; i < json_array_size(q->invites); i++)
        if (!rooms_user_id_ok(json_string_value(json_array_get(q->invites, i))))
            return bad(r, "M_INVALID_PARAM", "'invite' holds something that is not a user ID");
    return true;
}

static bool parse_initial_state(atrium_req *r, json_t *body, create_req *q)
{
    q->initial_state = json_object_get(body, "initial_state");
    if (!q->initial_state || json_is_null(q->initial_state)) {
        q->initial_state = NULL;
        return true;
    }
    if (!json_is_array(q->initial_state)) return bad(r, "M_BAD_JSON", "'initial_state' must be a list");
    if (json_array_size(q->initial_state) > CROOMS_MAX_INITIAL_STATE)
        return bad(r, "M_INVALID_PARAM", "Too many initial_state events");
    for (size_t i = 0; i < json_array_size(q->initial_state); i++) {
        json_t *ev = json_array_get(q->initial_state, i);
        json_t *sk = json_object_get(ev, "state_key");
        if (!json_is_object(ev) || !json_is_string(json_object_get(ev, "type")) ||
            !json_is_object(json_object_get(ev, "content")) || (sk && !json_is_string(sk)))
            return bad(r, "M_BAD_JSON", "Each initial_state entry needs a string 'type', an "
                       "object 'content' and an optional string 'state_key'");
    }
    return true;
}

static bool parse_create(atrium_req *r, json_t *body, create_req *q)
{
    memset(q, 0, sizeof(*q));
    char why[ROOM_AUTH_WHY_LEN];
    if (cjson_normalize(body, why, sizeof(why)) < 0) return bad(r, "M_BAD_JSON", why);
    const char *visibility, *preset_name, *version, *alias;
    if (!http_field_string(r, body, "visibility", false, 0, &visibility) ||
        !http_field_string(r, body, "preset", false, 0, &preset_name) ||
        !http_field_string(r, body, "room_version", false, 0, &version) ||
        !http_field_string(r, body, "room_alias_name", false, 0, &alias) ||
        !http_field_string(r, body, "name", false, 0, &q->name) ||
        !http_field_string(r, body, "topic", false, 0, &q->topic) ||
        !http_field_bool(r, body, "is_direct", false, &q->is_direct) ||
        !http_field_object(r, body, "creation_content", false, &q->creation_content) ||
        !http_field_object(r, body, "power_level_content_override", false, &q->pl_override) ||
        !parse_invites(r, body, q) || !parse_initial_state(r, body, q))
        return false;
    if (visibility && strcmp(visibility, "public") != 0 && strcmp(visibility, "private") != 0)
        return bad(r, "M_INVALID_PARAM", "'visibility' must be \"public\" or \"private\"");
    q->publish = visibility && strcmp(visibility, "public") == 0;
    if (alias && alias[0]) {
        if (!crooms_directory()) {
            crooms_directory_disabled(r);
            return false;
        }
        if (strpbrk(alias, ": \t\n\r#"))
            return bad(r, "M_INVALID_PARAM", "room_alias_name is the local part of the alias: "
                       "no ':', '#' or whitespace");
        q->alias = rt_arena_printf(r->arena, "#%s:%s", alias, rooms_server_name());
        if (!q->alias) return bad(r, "M_UNKNOWN", "Out of memory");
        if (as_alias_exclusive_elsewhere(q->alias, as_of_request(r)))
            return bad(r, "M_EXCLUSIVE", "This alias is reserved by an application service");
    }
    json_t *tp = json_object_get(body, "invite_3pid");
    if (json_is_array(tp) && json_array_size(tp) > 0)
        return bad(r, "M_INVALID_PARAM", "Third-party invites are not supported");
    if (!preset_name) preset_name = visibility && strcmp(visibility, "public") == 0 ? "public_chat" : "private_chat";
    if (!(q->preset = find_preset(preset_name)))
        return bad(r, "M_INVALID_PARAM", "Unknown preset");
    q->ver = version ? room_version_find_creatable(version) : crooms_default_version();
    if (!q->ver) {
        if (room_version_find(version))
            http_respond_error(r, 400, "M_UNSUPPORTED_ROOM_VERSION", "This server joins rooms of "
                               "version %.16s but cannot create them", version);
        else
            http_respond_error(r, 400, "M_UNSUPPORTED_ROOM_VERSION", "Room version %.16s is not "
                               "supported", version);
        return false;
    }
    return true;
}

/* Append one state event; false after setting e. */
static bool put_state(room_tx *tx, const char *sender, const char *type, const char *state_key,
                      json_t *content, rooms_err *e)
{
    room_new_event ev = {.sender = sender, .type = type, .state_key = state_key, .content = content};
    char id[EVENT_ID_LEN];
    int rc = rooms_tx_append(tx, &ev, id, e);
    json_decref(content);
    return rc == ROOMS_OK;
}

static bool invitee_is_local(const char *user_id)
{
    return strcmp(room_auth_domain(user_id), rooms_server_name()) == 0;
}

/* Does the request invite users of other servers? */
static bool has_remote_invitees(const create_req *q)
{
    for (size_t i = 0; i < json_array_size(q->invites); i++)
        if (!invitee_is_local(json_string_value(json_array_get(q->invites, i)))) return true;
    return false;
}

/* The room exists: invite the users of other servers, each through their server, on the
 * remote pool (this run); the first refusal is the answer, as when inviting afterwards
 * (the room and the invites before it stay). */
static int invite_remote_invitees(atrium_req *r, const char *creator, const char *room_id,
                                  const create_req *q)
{
    for (size_t i = 0; i < json_array_size(q->invites); i++) {
        const char *invitee = json_string_value(json_array_get(q->invites, i));
        if (invitee_is_local(invitee)) continue;
        json_t *content = json_pack("{s:s}", "membership", "invite");
        if (q->is_direct) json_object_set_new(content, "is_direct", json_true());
        bool ok = crooms_remote_invite_send(r, creator, room_id, invitee, content);
        json_decref(content);
        if (!ok) return ATRIUM_DONE;
    }
    return http_respond_json(r, 200, json_pack("{s:s}", "room_id", room_id));
}

static bool write_room(atrium_req *r, room_tx *tx, const create_req *q, const char *creator,
                       rooms_err *e)
{
    json_t *create = q->creation_content ? json_deep_copy(q->creation_content) : json_object();
    json_object_set_new(create, "room_version", json_string(q->ver->id));
    if (q->ver->creator_is_sender) json_object_del(create, "creator");
    else json_object_set_new(create, "creator", json_string(creator));
    if (!put_state(tx, creator, "m.room.create", "", create, e)) return false;
    if (!put_state(tx, creator, "m.room.member", creator, crooms_member_content(tx->c, creator, "join"), e))
        return false;
    json_t *pl = default_power_levels(creator, q->preset, q->invites);
    if (q->pl_override) json_object_update(pl, q->pl_override);
    if (!put_state(tx, creator, "m.room.power_levels", "", pl, e)) return false;
    if (!put_state(tx, creator, "m.room.join_rules", "", json_pack("{s:s}", "join_rule", q->preset->join_rule), e) ||
        !put_state(tx, creator, "m.room.history_visibility", "",
                   json_pack("{s:s}", "history_visibility", q->preset->history_visibility), e) ||
        !put_state(tx, creator, "m.room.guest_access", "",
                   json_pack("{s:s}", "guest_access", q->preset->guest_access), e))
        return false;
    for (size_t i = 0; i < json_array_size(q->initial_state); i++) {
        json_t *s = json_array_get(q->initial_state, i);
        const char *sk = json_string_value(json_object_get(s, "state_key"));
        if (!put_state(tx, creator, json_string_value(json_object_get(s, "type")), sk ? sk : "",
                       json_deep_copy(json_object_get(s, "content")), e))
            return false;
    }
    if (q->name && !put_state(tx, creator, "m.room.name", "", json_pack("{s:s}", "name", q->name), e))
        return false;
    if (q->topic && !put_state(tx, creator, "m.room.topic", "", json_pack("{s:s}", "topic", q->topic), e))
        return false;
    const atrium_directory *dir = crooms_directory();
    if (q->alias) {
        int rc = dir ? dir->alias_create(tx->c, q->alias, tx->room_id, creator) : ATRIUM_E_STATE;
        if (rc == ATRIUM_E_EXISTS) {
            rooms_set_err(e, ROOMS_E_ALIAS_IN_USE, "Room alias %.255s already exists", q->alias);
            return false;
        }
        if (rc == ATRIUM_E_INVAL) {
            rooms_set_err(e, ROOMS_E_INVALID, "%.255s is not a valid room alias", q->alias);
            return false;
        }
        if (rc < 0) {
            rooms_set_err(e, ROOMS_E_DB, "database");
            return false;
        }
        if (!put_state(tx, creator, "m.room.canonical_alias", "",
                       json_pack("{s:s}", "alias", q->alias), e))
            return false;
    }
    for (size_t i = 0; i < json_array_size(q->invites); i++) {
        const char *invitee = json_string_value(json_array_get(q->invites, i));
        /* Their server must sign the invite: a request to a peer, which createRoom's one
         * transaction does not wait for; they are invited once the room exists. */
        if (!invitee_is_local(invitee)) continue;
        if (crooms_check_invitee(tx->c, invitee, e) < 0) return false;
        json_t *content = crooms_member_content(tx->c, invitee, "invite");
        if (q->is_direct) json_object_set_new(content, "is_direct", json_true());
        if (!put_state(tx, creator, "m.room.member", invitee, content, e)) return false;
    }
    (void)r;
    if (q->publish && dir && dir->room_publish(tx->c, tx->room_id, true) < 0) {
        rooms_set_err(e, ROOMS_E_DB, "database");
        return false;
    }
    return true;
}

/* POST /_matrix/client/v3/createRoom */
static int post_create_room(atrium_req *r)
{
    const char *user = auth_request(r);
    if (!user) return ATRIUM_DONE;
    json_t *body = http_req_json(r);
    if (!body) return ATRIUM_DONE;
    create_req q;
    if (!parse_create(r, body, &q)) return ATRIUM_DONE;
    /* The run on the remote pool after the room was made: its remote invites. */
    if (r->run_reason == ATRIUM_RUN_HANDOFF && r->core_state)
        return invite_remote_invitees(r, user, r->core_state, &q);
    if (ratelimit_refused(r, ratelimit_message())) return ATRIUM_DONE;
    const atrium_directory *dir = crooms_directory();
    if (q.publish && dir && dir->may_publish(user, auth_is_admin(r) == 1) != 1)
        return http_respond_error(r, 403, "M_FORBIDDEN", "You may not publish rooms to this "
                                  "server's room directory; create it with visibility private");
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    char room_id[EVENT_MAX_ID_BYTES + 1];
    crooms_new_room_id(room_id, sizeof(room_id));
    room_tx tx;
    rooms_err e = {0};
    bool ok = rooms_tx_begin_new(&tx, c, r->arena, room_id, q.ver, user, &e) == ROOMS_OK;
    if (ok && !write_room(r, &tx, &q, user, &e)) {
        rooms_tx_rollback(&tx);
        ok = false;
    }
    if (ok) ok = rooms_tx_commit(&tx, &e) == ROOMS_OK;
    http_db_checkin(c);
    if (!ok) {
        /* An event of the request that the rules refuse makes the request bad, not the
         * user unauthorized: the spec answers 400 for invalid initial state. */
        if (e.code == ROOMS_E_FORBIDDEN) {
            http_respond_error(r, 400, "M_INVALID_ROOM_STATE", "%s", e.why);
            return ATRIUM_DONE;
        }
        return rooms_fail(r, &e);
    }
    if (has_remote_invitees(&q)) {
        r->core_state = rt_arena_strdup(r->arena, room_id);
        if (r->core_state) return crooms_to_remote_pool(r);
    }
    return http_respond_json(r, 200, json_pack("{s:s}", "room_id", room_id));
}

int crooms_create_routes(http_server *s)
{
    return client_route(s, "POST", "/_matrix/client/v3/createRoom", post_create_room,
                        CROOMS_CREATE_MAX_BODY_BYTES);
}
