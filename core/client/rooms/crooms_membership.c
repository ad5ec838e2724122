/*
 * core/client/rooms/crooms_membership.c - joining and leaving: POST /rooms/{roomId}/join,
 * /join/{roomIdOrAlias}, /rooms/{roomId}/leave, invite, kick, ban, unban and forget, plus
 * crooms_write_one, the "write one event and answer" step the single-event endpoints share.
 *
 * Each endpoint only says which membership event it wants; whether it is allowed is the
 * auth rules' decision (room_auth.c through core/rooms/rooms_tx.c). What this file adds: a join
 * of a user already joined writes nothing, kick and unban need a target that is in the
 * room / banned, membership events carry the user's profile (and a /join/{roomIdOrAlias}
 * body's other keys, crooms_join_extras, also for a join through another server), and invites reach only local
 * users that exist; other servers' users are invited through their server
 * (crooms_remote.c). A kick of a knocking user rejects the knock; a knock withdrawn on a room
 * this server is not in is crooms_knock.c's (crooms_knock_withdraw). /join/#alias resolves the alias through the room directory, another
 * server's by asking it (join_alias), and joins through the servers the answer names.
 *
 * It also owns which profile fields a membership event carries (add_profile: displayname
 * and avatar_url, an empty value being no value), both for new memberships and for
 * crooms_member_profile_refresh, the one-room step that carries a profile change into a
 * joined room's member event. Which rooms to refresh, and how many, is profile.c's
 * decision. Likewise crooms_member_leave is the one-room step of an account deactivation
 * (which rooms, and how many: core/client/accounts/deactivate.c).
 */
#include <stdio.h>
#include <string.h>

#include "core/client/accounts/accounts.h"
#include "core/client/appservice/appservice.h"
#include "core/client/auth/auth.h"
#include "core/client/rooms/crooms_api.h"
#include "core/rooms/rooms_space.h"
#include "core/rooms/canonical_json.h"
#include "core/runtime/server_name.h"

/* ---- shared helpers ----------------------------------------------------------------- */

/* The profile fields a membership event carries, in the profiles table's column order. */
static const char *const MEMBER_PROFILE_KEYS[] = {"displayname", "avatar_url"};
#define N_MEMBER_PROFILE_KEYS (sizeof(MEMBER_PROFILE_KEYS) / sizeof(MEMBER_PROFILE_KEYS[0]))

/* Set in content the profile fields of user_id that have a value; an empty string is no
 * value (a cleared field). ROOMS_OK (also for a user without a profile row) or ROOMS_E_DB. */
static int add_profile(PGconn *c, const char *user_id, json_t *content)
{
    const char *p[1] = {user_id};
    PGresult *res = rooms_q(c, "SELECT displayname, avatar_url FROM profiles WHERE user_id = $1",
                            1, p, NULL);
    if (!res) return ROOMS_E_DB;
    for (int i = 0; PQntuples(res) == 1 && i < (int)N_MEMBER_PROFILE_KEYS; i++)
        if (!PQgetisnull(res, 0, i) && PQgetvalue(res, 0, i)[0])
            json_object_set_new(content, MEMBER_PROFILE_KEYS[i],
                                json_string(PQgetvalue(res, 0, i)));
    PQclear(res);
    return ROOMS_OK;
}

json_t *crooms_member_content(PGconn *c, const char *user_id, const char *membership)
{
    json_t *content = json_pack("{s:s}", "membership", membership);
    (void)add_profile(c, user_id, content); /* a failed read leaves the bare membership */
    return content;
}

int crooms_check_invitee(PGconn *c, const char *user_id, rooms_err *e)
{
    const char *p[1] = {user_id};
    PGresult *res = rooms_q(c, "SELECT deactivated FROM users WHERE user_id = $1", 1, p, NULL);
    if (!res) return rooms_set_err(e, ROOMS_E_DB, "database");
    int rows = PQntuples(res);
    bool deactivated = rows == 1 && PQgetvalue(res, 0, 0)[0] == 't';
    PQclear(res);
    if (!rows) return rooms_set_err(e, ROOMS_E_NOT_FOUND, "Unknown user %.64s", user_id);
    if (deactivated)
        return rooms_set_err(e, ROOMS_E_FORBIDDEN, "%.64s has deactivated their account",
                             user_id);
    return ROOMS_OK;
}

int crooms_txn_lookup(PGconn *c, const char *user_id, const char *device_id, const char *key,
                     char id_out[EVENT_ID_LEN])
{
    const char *p[3] = {user_id, device_id, key};
    PGresult *res = rooms_q(c,
                            "SELECT event_id FROM event_txns"
                            " WHERE user_id = $1 AND device_id = $2 AND txn_id = $3",
                            3, p, NULL);
    if (!res) return ROOMS_E_DB;
    int found = PQntuples(res) == 1;
    if (found) snprintf(id_out, EVENT_ID_LEN, "%s", PQgetvalue(res, 0, 0));
    PQclear(res);
    return found;
}

int crooms_write_one(atrium_req *r, const char *room_id, const room_new_event *ev, json_t *answer)
{
    PGconn *c = http_db_checkout(r);
    if (!c) {
        json_decref(answer);
        return ATRIUM_DONE;
    }
    room_tx tx;
    rooms_err e = {0};
    char id[EVENT_ID_LEN] = "";
    int rc = rooms_tx_begin(&tx, c, r->arena, room_id, &e);
    if (rc == ROOMS_OK) {
        rc = rooms_tx_append(&tx, ev, id, &e);
        if (rc == ROOMS_OK) rc = rooms_tx_commit(&tx, &e);
        else rooms_tx_rollback(&tx);
    }
    if (rc == ROOMS_E_TXN_RACE) {
        /* The same transaction ID committed meanwhile on another connection: its event is
         * the answer. */
        int found = crooms_txn_lookup(c, ev->sender, ev->txn_device,
                                     ev->txn_key ? ev->txn_key : ev->txn_id, id);
        rc = found == 1 ? ROOMS_OK : rooms_set_err(&e, ROOMS_E_DB, "database");
    }
    http_db_checkin(c);
    if (rc != ROOMS_OK) {
        json_decref(answer);
        return rooms_fail(r, &e);
    }
    return http_respond_json(r, 200, answer ? answer : json_pack("{s:s}", "event_id", id));
}

/* ---- profile changes ---------------------------------------------------------------- */

/* The content of user_id's current join event in the room of tx (as redacted, when it
 * was), into *out; *out NULL when the user is not joined. ROOMS_OK or ROOMS_E_DB. */
static int joined_content(room_tx *tx, const char *user_id, json_t **out)
{
    *out = NULL;
    const char *p[2] = {tx->room_id, user_id};
    PGresult *res = rooms_q(tx->c,
                            "SELECT e.pdu, e.redacted_by IS NOT NULL FROM current_state cs"
                            " JOIN events e ON e.event_id = cs.event_id"
                            " WHERE cs.room_id = $1 AND cs.type = 'm.room.member'"
                            " AND cs.state_key = $2 AND cs.membership = 'join'",
                            2, p, NULL);
    if (!res) return ROOMS_E_DB;
    json_t *pdu = PQntuples(res) == 1 ? json_loads(PQgetvalue(res, 0, 0), 0, NULL) : NULL;
    bool redacted = pdu && PQgetvalue(res, 0, 1)[0] == 't';
    PQclear(res);
    json_t *content = json_object_get(pdu, "content");
    if (json_is_object(content))
        *out = redacted ? event_redact_content(tx->ver, "m.room.member", content)
                        : json_deep_copy(content);
    json_decref(pdu);
    return ROOMS_OK;
}

/* current with its profile fields replaced by those of profile (absent there: removed). A
 * new object, or NULL when nothing would change. */
static json_t *with_profile(const json_t *current, const json_t *profile)
{
    json_t *next = json_deep_copy(current);
    for (size_t i = 0; next && i < N_MEMBER_PROFILE_KEYS; i++) {
        json_t *v = json_object_get(profile, MEMBER_PROFILE_KEYS[i]);
        if (v) json_object_set(next, MEMBER_PROFILE_KEYS[i], v);
        else json_object_del(next, MEMBER_PROFILE_KEYS[i]);
    }
    if (next && json_equal(next, (json_t *)current)) {
        json_decref(next);
        return NULL;
    }
    return next;
}

int crooms_member_profile_refresh(PGconn *c, rt_arena *arena, const char *room_id,
                                 const char *user_id, char id_out[EVENT_ID_LEN], rooms_err *e)
{
    id_out[0] = '\0';
    room_tx tx;
    int rc = rooms_tx_begin(&tx, c, arena, room_id, e);
    if (rc != ROOMS_OK) return rc;
    json_t *current = NULL, *profile = json_object(), *next = NULL;
    rc = profile ? joined_content(&tx, user_id, &current) : ROOMS_E_DB;
    if (rc == ROOMS_OK && current) rc = add_profile(c, user_id, profile);
    if (rc != ROOMS_OK) rooms_set_err(e, rc, "database");
    char why[ROOM_AUTH_WHY_LEN];
    if (rc == ROOMS_OK && current && (next = with_profile(current, profile)) &&
        cjson_normalize(next, why, sizeof(why)) < 0)
        rc = rooms_set_err(e, ROOMS_E_BAD_JSON, "%s", why);
    if (rc == ROOMS_OK && next) {
        room_new_event ev = {.sender = user_id, .type = "m.room.member", .state_key = user_id,
                             .content = next};
        rc = rooms_tx_append(&tx, &ev, id_out, e);
        if (rc == ROOMS_OK) rc = rooms_tx_commit(&tx, e); /* rolls back itself on failure */
        else rooms_tx_rollback(&tx);
    } else {
        rooms_tx_rollback(&tx); /* nothing to write, or a failure */
    }
    if (rc != ROOMS_OK) id_out[0] = '\0';
    json_decref(current);
    json_decref(profile);
    json_decref(next);
    return rc;
}

/* ---- account deactivation ------------------------------------------------------------ */

int crooms_member_leave(PGconn *c, rt_arena *arena, const char *room_id, const char *user_id,
                       char id_out[EVENT_ID_LEN], rooms_err *e)
{
    id_out[0] = '\0';
    room_tx tx;
    int rc = rooms_tx_begin(&tx, c, arena, room_id, e);
    if (rc != ROOMS_OK) return rc;
    char membership[16] = "";
    rc = rooms_membership_at(c, room_id, user_id, INT64_MAX, membership, NULL);
    if (rc != ROOMS_OK) rooms_set_err(e, rc, "database");
    bool member = strcmp(membership, "join") == 0 || strcmp(membership, "invite") == 0 ||
                  strcmp(membership, "knock") == 0;
    json_t *content = rc == ROOMS_OK && member ? json_pack("{s:s}", "membership", "leave") : NULL;
    if (content) {
        room_new_event ev = {.sender = user_id, .type = "m.room.member", .state_key = user_id,
                             .content = content};
        rc = rooms_tx_append(&tx, &ev, id_out, e);
        if (rc == ROOMS_OK) rc = rooms_tx_commit(&tx, e); /* rolls back itself on failure */
        else rooms_tx_rollback(&tx);
    } else {
        if (rc == ROOMS_OK && member) rc = rooms_set_err(e, ROOMS_E_DB, "out of memory");
        rooms_tx_rollback(&tx); /* not a member any more, or a failure */
    }
    if (rc != ROOMS_OK) id_out[0] = '\0';
    json_decref(content);
    return rc;
}

/* ---- requests ----------------------------------------------------------------------- */

/* The optional "reason" of a membership request, into content. false after answering. */
static bool take_reason(atrium_req *r, json_t *body, json_t *content)
{
    const char *reason;
    if (!http_field_string(r, body, "reason", false, CROOMS_MAX_REASON_BYTES, &reason)) return false;
    if (reason) json_object_set_new(content, "reason", json_string(reason));
    return true;
}

/* POST /join/{roomIdOrAlias}: the body's other keys go into the membership event as they
 * are, as Synapse's does (its /rooms/{roomId}/join keeps only the reason, and so does
 * ours). A displayname or avatar_url of the body is a per-room profile and wins over the
 * global one, held to the profile's types and sizes; membership and
 * join_authorised_via_users_server stay the server's. false after answering 400. */
bool crooms_join_extras(atrium_req *r, json_t *body, json_t *content)
{
    static const struct {
        const char *key;
        size_t max_bytes;
    } PROFILE[] = {{"displayname", ACC_DISPLAYNAME_MAX_BYTES}, {"avatar_url", ACC_AVATAR_URL_MAX_BYTES}};
    for (size_t i = 0; i < sizeof(PROFILE) / sizeof(PROFILE[0]); i++) {
        const char *v;
        if (!http_field_string(r, body, PROFILE[i].key, false, PROFILE[i].max_bytes, &v)) return false;
    }
    const char *key;
    json_t *v;
    json_object_foreach(body, key, v)
    {
        if (strcmp(key, "membership") == 0 || strcmp(key, "join_authorised_via_users_server") == 0)
            continue;
        json_object_set(content, key, v);
    }
    return true;
}

/* A body that may be empty (some clients send none for join/leave/forget). */
static json_t *optional_body(atrium_req *r)
{
    if (r->body_len == 0) {
        if (!r->json) r->json = json_object();
        return r->json;
    }
    return http_req_json(r);
}

/* [req] A restricted room (v8+): name in the join's content the user of this server who
 * vouches for user, a member of a room the join rule allows (rooms_restricted_authoriser,
 * core/rooms/rooms_space.c). Nothing when the room is not restricted or user is invited.
 * false after answering: 403 not a member of an allowed room, 400 M_UNABLE_TO_GRANT_JOIN
 * when none of our users may invite. */
static bool vouch_for(atrium_req *r, const char *room_id, const char *user, json_t *content)
{
    PGconn *c = http_db_checkout(r);
    if (!c) return false;
    char via[ROOMS_USER_ID_BYTES];
    rooms_err e = {0};
    int rc = rooms_restricted_authoriser(c, room_id, user, via, &e);
    http_db_checkin(c);
    if (rc == ROOMS_E_UNABLE_TO_AUTHORISE) /* our user is in none of the rooms we are not in */
        rc = rooms_set_err(&e, ROOMS_E_FORBIDDEN,
                           "You are not a member of any room this room's join rule allows");
    if (rc != ROOMS_OK) {
        rooms_fail(r, &e);
        return false;
    }
    if (via[0]) json_object_set_new(content, "join_authorised_via_users_server", json_string(via));
    return true;
}

/* Join room_id; alias_vias (may be NULL): the servers a remote alias's answer named, tried
 * first when the join goes through other servers. */
static int join_room(atrium_req *r, const char *user, const char *room_id,
                     const json_t *alias_vias)
{
    json_t *body = optional_body(r);
    if (!body) return ATRIUM_DONE;
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    /* A room this server is not in: through the servers that are, on the remote pool. */
    int remote = crooms_join_needs_remote(c, room_id);
    if (remote == 1) {
        if (r->run_reason != ATRIUM_RUN_HANDOFF) {
            http_db_checkin(c);
            return crooms_to_remote_pool(r);
        }
        json_t *vias = alias_vias ? json_deep_copy(alias_vias) : json_array();
        json_t *more = crooms_remote_vias(r, c, room_id, false);
        http_db_checkin(c);
        json_array_extend(vias, more);
        json_decref(more);
        int out = crooms_remote_join(r, user, room_id, vias);
        json_decref(vias);
        return out;
    }
    char membership[16];
    bool failed = remote < 0;
    bool exists = !failed && rooms_version_of(c, room_id, &failed) != NULL;
    int rc = failed ? ROOMS_E_DB : rooms_membership_at(c, room_id, user, INT64_MAX, membership, NULL);
    json_t *content = rc == ROOMS_OK && exists ? crooms_member_content(c, user, "join") : NULL;
    bool guest_refused = false;
    if (rc == ROOMS_OK && exists && r->is_guest > 0 && strcmp(membership, "join") != 0) {
        /* Guests join only rooms that let them (m.room.guest_access: can_join). */
        const char *p[1] = {room_id};
        PGresult *res = rooms_q(c,
                                "SELECT 1 FROM current_state cs JOIN events e"
                                " ON e.event_id = cs.event_id WHERE cs.room_id = $1"
                                " AND cs.type = 'm.room.guest_access' AND cs.state_key = ''"
                                " AND (e.pdu::jsonb) -> 'content' ->> 'guest_access' = 'can_join'",
                                1, p, NULL);
        if (!res) rc = ROOMS_E_DB;
        else guest_refused = PQntuples(res) == 0;
        PQclear(res);
    }
    http_db_checkin(c);
    if (guest_refused) {
        json_decref(content);
        return http_respond_error(r, 403, "M_FORBIDDEN", "Guests may not join this room");
    }
    if (rc != ROOMS_OK) return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    if (!exists)
        return http_respond_error(r, 404, "M_NOT_FOUND", "Unknown room");
    json_t *answer = json_pack("{s:s}", "room_id", room_id);
    if (strcmp(membership, "join") == 0) {
        json_decref(content);
        return http_respond_json(r, 200, answer);
    }
    bool by_join_path = http_req_param(r, "roomIdOrAlias") != NULL; /* POST /join/{...} */
    if (!take_reason(r, body, content) || (by_join_path && !crooms_join_extras(r, body, content)) ||
        !vouch_for(r, room_id, user, content)) {
        json_decref(content);
        json_decref(answer);
        return ATRIUM_DONE;
    }
    room_new_event ev = {.sender = user, .type = "m.room.member", .state_key = user, .content = content};
    int out = crooms_write_one(r, room_id, &ev, answer);
    json_decref(content);
    return out;
}

/* POST /_matrix/client/v3/rooms/{roomId}/join */
static int post_room_join(atrium_req *r)
{
    const char *user = auth_request(r);
    if (!user) return ATRIUM_DONE;
    const char *room = crooms_param_room(r);
    return room ? join_room(r, user, room, NULL) : ATRIUM_DONE;
}

/* Join (or knock on) the room an alias names. The directory resolves it: a local alias
 * from its table; another server's by asking that server (directory/1
 * alias_resolve_remote: the request parks under the outbound budget while it answers, and
 * this handler runs again), then `act` goes through the servers the answer lists (on the
 * remote pool, like any join of a room this server is not in). Every run resolves again:
 * the directory keeps the answer in the request, so the run on the remote pool gets it
 * without asking. */
int crooms_act_on_alias(atrium_req *r, const char *user, const char *alias, crooms_alias_act act)
{
    const atrium_directory *d = crooms_directory();
    if (!d) return crooms_directory_disabled(r);
    if (!rt_server_name_of_id_valid(alias)) /* before the directory asks its server */
        return http_respond_error(r, 400, "M_INVALID_PARAM", "Not a room alias: expected "
                                  "#localpart:server, the server a host name, IPv4 or [IPv6] "
                                  "address with an optional port");
    const char *colon = strchr(alias, ':');
    if (colon && colon[1] && strcmp(colon + 1, rooms_server_name()) != 0) {
        if (!ATRIUM_DIRECTORY_HAS(d, alias_resolve_remote))
            return http_respond_error(r, 404, "M_NOT_FOUND", "Room alias %.255s is on another "
                                      "server, and this server's room directory does not ask "
                                      "other servers", alias);
        char room_id[ATRIUM_ROOM_ID_MAX_BYTES + 1];
        json_t *servers = NULL;
        int rc = d->alias_resolve_remote(r, alias, room_id, &servers);
        if (rc != ATRIUM_DIRECTORY_RESOLVED) return rc;
        int out = rooms_room_id_ok(room_id)
                      ? act(r, user, rt_arena_strdup(r->arena, room_id), servers)
                      : http_respond_error(r, 502, "M_UNKNOWN", "The server of %.255s answered "
                                           "with something that is not a room ID", alias);
        json_decref(servers);
        return out;
    }
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    char room_id[ATRIUM_ROOM_ID_MAX_BYTES + 1];
    rooms_err e = {0};
    int rc = crooms_resolve_alias(c, alias, room_id, &e);
    http_db_checkin(c);
    if (rc == ROOMS_E_NOT_FOUND) { /* a bridge may make it: ask, then look again */
        int asked = as_query_alias(r, alias);
        if (asked != ATRIUM_CONTINUE) return asked;
    }
    if (rc != ROOMS_OK) return rooms_fail(r, &e);
    return act(r, user, rt_arena_strdup(r->arena, room_id), NULL);
}

/* POST /_matrix/client/v3/join/{roomIdOrAlias} */
static int post_join(atrium_req *r)
{
    const char *user = auth_request(r);
    if (!user) return ATRIUM_DONE;
    if (!crooms_vias_ok(r, false)) return ATRIUM_DONE;
    const char *target = http_req_param(r, "roomIdOrAlias");
    if (target && target[0] == '#') return crooms_act_on_alias(r, user, target, join_room);
    if (!rooms_room_id_ok(target))
        return http_respond_error(r, 400, "M_INVALID_PARAM", "Not a room ID or alias");
    return join_room(r, user, target, NULL);
}

/* POST /_matrix/client/v3/rooms/{roomId}/leave */
static int post_leave(atrium_req *r)
{
    const char *user = auth_request(r);
    if (!user) return ATRIUM_DONE;
    const char *room = crooms_param_room(r);
    json_t *body = room ? optional_body(r) : NULL;
    if (!body) return ATRIUM_DONE;
    /* Declining an invite to a room this server is not in (crooms_remote.c), or withdrawing
     * a knock on one (crooms_knock.c): through the servers that are. */
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    char membership[16] = "";
    int remote = crooms_join_needs_remote(c, room);
    if (remote == 1 && rooms_membership_at(c, room, user, INT64_MAX, membership, NULL) < 0)
        remote = ROOMS_E_DB;
    bool knocked = strcmp(membership, "knock") == 0;
    bool through_remote = remote == 1 && (strcmp(membership, "invite") == 0 || knocked);
    /* An invite declined on the remote pool: the servers to decline through, read while
     * the connection is held (given back at this one place). */
    json_t *vias = through_remote && r->run_reason == ATRIUM_RUN_HANDOFF && !knocked
                       ? crooms_remote_vias(r, c, room, false)
                       : NULL;
    http_db_checkin(c);
    if (through_remote) {
        if (r->run_reason != ATRIUM_RUN_HANDOFF) return crooms_to_remote_pool(r);
        if (knocked) return crooms_knock_withdraw(r, user, room);
        int out = crooms_remote_leave(r, user, room, vias);
        json_decref(vias);
        return out;
    }
    if (remote < 0) return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    json_t *content = json_pack("{s:s}", "membership", "leave");
    if (!take_reason(r, body, content)) {
        json_decref(content);
        return ATRIUM_DONE;
    }
    room_new_event ev = {.sender = user, .type = "m.room.member", .state_key = user, .content = content};
    int out = crooms_write_one(r, room, &ev, json_object());
    json_decref(content);
    return out;
}

/* What an action on another user (invite, kick, ban, unban) writes and requires. */
typedef struct target_action {
    const char *membership;     /* written */
    const char *target_must_be; /* the target's current membership, or NULL for any */
    const char *refusal;        /* when it is not */
} target_action;

static const target_action INVITE = {"invite", NULL, NULL};
static const target_action KICK = {"leave", NULL, "The user is not in this room"}; /* nor knocking */
static const target_action BAN = {"ban", NULL, NULL};
static const target_action UNBAN = {"leave", "ban", "The user is not banned"};

static int act_on_user(atrium_req *r, const target_action *act)
{
    const char *user = auth_request(r);
    if (!user) return ATRIUM_DONE;
    const char *room = crooms_param_room(r);
    json_t *body = room ? http_req_json(r) : NULL;
    if (!body) return ATRIUM_DONE;
    const char *target;
    if (!http_field_string(r, body, "user_id", true, 0, &target)) return ATRIUM_DONE;
    if (!rooms_user_id_ok(target))
        return http_respond_error(r, 400, "M_INVALID_PARAM", "'user_id' is not a user ID");
    if (act == &INVITE && strcmp(room_auth_domain(target), rooms_server_name()) != 0) {
        /* A user of another server: their server signs the invite; on the remote pool. */
        if (r->run_reason != ATRIUM_RUN_HANDOFF) return crooms_to_remote_pool(r);
        json_t *content = json_pack("{s:s}", "membership", "invite");
        int out = take_reason(r, body, content) ? crooms_remote_invite(r, user, room, target, content)
                                                : ATRIUM_DONE;
        json_decref(content);
        return out;
    }
    if (act == &INVITE) { /* a bridge's user not made yet: ask its service first */
        int asked = as_query_user(r, target);
        if (asked != ATRIUM_CONTINUE) return asked;
    }
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    rooms_err e = {0};
    char current[16] = "";
    int rc = rooms_membership_at(c, room, target, INT64_MAX, current, NULL);
    if (rc < 0) rooms_set_err(&e, rc, "database");
    if (rc == ROOMS_OK && act == &INVITE) rc = crooms_check_invitee(c, target, &e);
    json_t *content = rc == ROOMS_OK ? crooms_member_content(c, target, act->membership) : NULL;
    http_db_checkin(c);
    if (rc != ROOMS_OK) return rooms_fail(r, &e);
    if (act != &INVITE) {
        /* Kick and ban carry no profile of the target. */
        json_object_del(content, "displayname");
        json_object_del(content, "avatar_url");
    }
    /* Kicking a knocking user rejects the knock. */
    bool kick_ok = act != &KICK || strcmp(current, "join") == 0 || strcmp(current, "invite") == 0 ||
                   strcmp(current, "knock") == 0;
    bool unban_ok = !act->target_must_be || strcmp(current, act->target_must_be) == 0;
    if (!kick_ok || !unban_ok) {
        json_decref(content);
        return http_respond_error(r, 403, "M_FORBIDDEN", "%s", act->refusal);
    }
    if (!take_reason(r, body, content)) {
        json_decref(content);
        return ATRIUM_DONE;
    }
    room_new_event ev = {.sender = user, .type = "m.room.member", .state_key = target, .content = content};
    int out = crooms_write_one(r, room, &ev, json_object());
    json_decref(content);
    return out;
}

static int post_invite(atrium_req *r) { return act_on_user(r, &INVITE); }
static int post_kick(atrium_req *r) { return act_on_user(r, &KICK); }
static int post_ban(atrium_req *r) { return act_on_user(r, &BAN); }
static int post_unban(atrium_req *r) { return act_on_user(r, &UNBAN); }

/* POST /_matrix/client/v3/rooms/{roomId}/forget */
static int post_forget(atrium_req *r)
{
    const char *user = auth_request(r);
    if (!user) return ATRIUM_DONE;
    const char *room = crooms_param_room(r);
    if (!room || !optional_body(r)) return ATRIUM_DONE;
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    char membership[16];
    int64_t pos = 0;
    int rc = rooms_membership_at(c, room, user, INT64_MAX, membership, &pos);
    bool ok = rc == ROOMS_OK;
    /* A standing membership (joined, invited, knocking) is not forgotten: it is left first. */
    bool standing = strcmp(membership, "join") == 0 || strcmp(membership, "invite") == 0 ||
                    strcmp(membership, "knock") == 0;
    if (ok && pos > 0 && !standing) {
        const char *p[1] = {crooms_i64(r, pos)};
        ok = db_exec(c, "UPDATE memberships SET forgotten = true WHERE stream_pos = $1", 1, p);
    }
    http_db_checkin(c);
    if (!ok) return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    if (pos == 0) return http_respond_error(r, 404, "M_NOT_FOUND", "You were never in this room");
    if (standing) return http_respond_error(r, 400, "M_UNKNOWN", "Leave the room before forgetting it");
    return http_respond_json(r, 200, json_object());
}

int crooms_membership_routes(http_server *s)
{
#define POST_(p, h) HTTP_ROUTE("POST", p, h, CROOMS_MAX_BODY_BYTES)
    static const atrium_route routes[] = {
        POST_("/_matrix/client/v3/rooms/{roomId}/join", post_room_join),
        POST_("/_matrix/client/v3/join/{roomIdOrAlias}", post_join),
        POST_("/_matrix/client/v3/rooms/{roomId}/leave", post_leave),
        POST_("/_matrix/client/v3/rooms/{roomId}/invite", post_invite),
        POST_("/_matrix/client/v3/rooms/{roomId}/kick", post_kick),
        POST_("/_matrix/client/v3/rooms/{roomId}/ban", post_ban),
        POST_("/_matrix/client/v3/rooms/{roomId}/unban", post_unban),
        POST_("/_matrix/client/v3/rooms/{roomId}/forget", post_forget),
    };
#undef POST_
    return HTTP_ROUTES_ADD(s, routes, "core");
}
