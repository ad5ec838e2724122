/*
 * core/federation/rooms/fed_rooms_invite.c - an invite of one of our users by another server:
 * PUT /_matrix/federation/v2/invite/{roomId}/{eventId}, and its older form PUT
 * /v1/invite/{roomId}/{eventId}, which other servers still call (and fall back to when v2
 * is unrecognized): its body is the event itself with the stripped state in
 * unsigned.invite_room_state and no room version, its answer [200, {"event": ...}]. The
 * version a v1 invite is read under is the room's when the room is known here, else the
 * one its m.room.create in the stripped state names (the spec's default, "1", when it
 * names none): an unknown one is 400 M_INCOMPATIBLE_ROOM_VERSION, as for v2.
 *
 * The invite is checked in the spec's order (a version we support, an m.room.member
 * invite of an existing local user sent by one of the origin's users, for this room, its
 * ID and content hash, the origin's signature while the request is parked), then signed
 * with our key and given back: the inviting server needs the invitee's server's signature
 * to send it on. When no user of ours is in the room, this server cannot see the room, so
 * the invite is kept as an outlier with the stripped state the inviter sent
 * (remote_invites) and a row of memberships, which is what /sync's invite section reads;
 * when we are in the room the invite arrives again as a PDU of a transaction and joins the
 * stream then. Accepting (a join) and declining (a leave) go through the inviting server
 * (crooms_remote.c).
 */
#include <stdio.h>
#include <string.h>

#include "core/rooms/rooms_tx.h"
#include "core/federation/rooms/fed_rooms.h"
#include "core/rooms/state_pdus.h"

#define FED_INVITE_MAX_STATE 64 /* stripped state events kept with an invite */

typedef struct invite_wait {
    bool done;
    int result;
    char why[160];
    const room_version *ver;
} invite_wait;

static void checked(void *arg, int result, const char *why)
{
    atrium_req *r = arg;
    invite_wait *st = r->core_state;
    st->result = result;
    snprintf(st->why, sizeof(st->why), "%s", why ? why : "");
    st->done = true;
    susp_wake(r);
}

static int incompatible(atrium_req *r, const char *ver)
{
    return http_respond_json(r, 400, json_pack("{s:s, s:s, s:s}", "errcode",
                                               "M_INCOMPATIBLE_ROOM_VERSION", "error",
                                               "This server does not support the room's version",
                                               "room_version", ver ? ver : ""));
}

/* Is user_id a user of ours that exists and is not deactivated? 1, 0, -1 database. */
static int local_user_exists(PGconn *c, const char *user_id)
{
    const char *p[1] = {user_id};
    PGresult *res = rooms_q(c, "SELECT 1 FROM users WHERE user_id = $1 AND NOT deactivated", 1, p,
                            NULL);
    if (!res) return -1;
    int n = PQntuples(res);
    PQclear(res);
    return n == 1;
}

/* The first run: every check but the signature, then the signature check (parked). */
static int invite_begin(atrium_req *r, const char *room_id, const char *event_id, json_t *body)
{
    json_t *pdu = json_object_get(body, "event");
    const char *ver_id = json_string_value(json_object_get(body, "room_version"));
    const room_version *v = room_version_find(ver_id);
    if (!json_is_object(pdu)) return http_respond_error(r, 400, "M_BAD_JSON", "event is required");
    if (!v) return incompatible(r, ver_id);
    const char *type = json_string_value(json_object_get(pdu, "type"));
    const char *sender = json_string_value(json_object_get(pdu, "sender"));
    const char *target = event_state_key(pdu);
    if (!type || strcmp(type, "m.room.member") != 0 || !target ||
        strcmp(event_content_str(pdu, "membership") ?: "", "invite") != 0)
        return http_respond_error(r, 400, "M_BAD_JSON", "Not an m.room.member invite");
    if (strcmp(json_string_value(json_object_get(pdu, "room_id")) ?: "", room_id) != 0)
        return http_respond_error(r, 400, "M_BAD_JSON", "The event is for another room");
    if (!sender || strcmp(room_auth_domain(sender), r->origin) != 0)
        return http_respond_error(r, 403, "M_FORBIDDEN", "The inviter is not on your server");
    if (strcmp(room_auth_domain(target), fed_state()->server_name) != 0)
        return http_respond_error(r, 400, "M_INVALID_PARAM", "The invitee is not on this server");
    char id[EVENT_ID_LEN];
    if (event_compute_id(v, pdu, id) < 0 || strcmp(id, event_id) != 0)
        return http_respond_error(r, 400, "M_BAD_JSON", "The event ID is not the event's own");
    if (!event_id_names_origin(v, id, r->origin))
        return http_respond_error(r, 400, "M_BAD_JSON", "The event ID is not of your server");
    if (!event_content_hash_ok(pdu))
        return http_respond_error(r, 400, "M_BAD_JSON", "The content hash does not match");
    PGconn *c = db_acquire(db_global(), DB_WAIT_CONFIGURED);
    if (!c) return http_respond_error(r, 503, "M_UNKNOWN", "The database is busy; retry");
    int exists = local_user_exists(c, target);
    fed_rooms_close(c);
    if (exists < 0) return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    if (!exists) return http_respond_error(r, 404, "M_NOT_FOUND", "No such user");
    invite_wait *st = rt_arena_alloc(r->arena, sizeof(*st));
    if (!st) return ATRIUM_E_NOMEM;
    st->ver = v;
    r->core_state = st;
    json_t *red = event_redact(v, pdu);
    if (!red) return ATRIUM_E_NOMEM;
    if (susp_wait(r, r->deadline_ms) < 0) {
        json_decref(red);
        return http_respond_error(r, 503, "M_UNKNOWN", "The server is stopping");
    }
    int rc = federation_verify_json(red, r->origin,
                                    json_integer_value(json_object_get(pdu, "origin_server_ts")),
                                    checked, r);
    json_decref(red);
    if (rc < 0) checked(r, rc, "the signature could not be checked");
    return ATRIUM_PARKED;
}

/* The stripped state to keep: objects with type, state_key, sender, content only. */
static json_t *stripped_state(const json_t *given)
{
    json_t *out = json_array();
    for (size_t i = 0; i < json_array_size(given) && json_array_size(out) < FED_INVITE_MAX_STATE; i++) {
        json_t *e = json_array_get(given, i);
        json_t *t = json_object_get(e, "type"), *sk = json_object_get(e, "state_key"),
               *s = json_object_get(e, "sender"), *c = json_object_get(e, "content");
        if (!json_is_string(t) || !json_is_string(sk) || !json_is_string(s) || !json_is_object(c))
            continue;
        json_array_append_new(out, json_pack("{s:O, s:O, s:O, s:O}", "type", t, "state_key", sk,
                                             "sender", s, "content", c));
    }
    return out;
}

/* Keep the invite for /sync: outlier, stripped state, membership row. 0 or -1. */
static int keep_invite(PGconn *c, const char *room_id, const char *event_id, json_t *pdu,
                       const room_version *v, const json_t *invite_state, const char *origin)
{
    json_t *stripped = stripped_state(invite_state);
    /* The invite itself ends the list, as /sync serves it. */
    json_array_append_new(stripped, json_pack("{s:s, s:O, s:O, s:O}", "type", "m.room.member",
                                              "state_key", json_object_get(pdu, "state_key"),
                                              "sender", json_object_get(pdu, "sender"),
                                              "content", json_object_get(pdu, "content")));
    char *text = json_dumps(stripped, JSON_COMPACT);
    json_decref(stripped);
    if (!text) return -1;
    char now[24];
    snprintf(now, sizeof(now), "%lld", (long long)rooms_wall_ms());
    const char *target = event_state_key(pdu);
    const char *sender = json_string_value(json_object_get(pdu, "sender"));
    const char *p[7] = {event_id, room_id, target, sender, v->id, text, now};
    bool ok = db_begin(c);
    if (ok) ok = rooms_graph_store_outlier(c, room_id, event_id, pdu, "outlier", NULL, origin) == 0;
    if (ok)
        ok = db_exec(c,
                     "WITH ins AS (INSERT INTO remote_invites (event_id, room_id, user_id, sender,"
                     " room_version, invite_state, received_ts) VALUES ($1, $2, $3, $4, $5, $6, $7)"
                     " ON CONFLICT (event_id) DO NOTHING RETURNING event_id)"
                     " INSERT INTO memberships (stream_pos, room_id, user_id, membership, event_id,"
                     " sender) SELECT stream_next(), $2, $3, 'invite', $1, $4 FROM ins",
                     7, p);
    free(text);
    if (ok) ok = db_commit(c);
    if (!ok) db_rollback(c);
    return ok ? 0 : -1;
}

/* The room version a v1 invite names: the room's when known here, else its stripped
 * m.room.create's (default "1"). NULL with the request answered (database). */
static const char *v1_version(atrium_req *r, const char *room_id, const json_t *pdu)
{
    PGconn *c = db_acquire(db_global(), DB_WAIT_CONFIGURED);
    if (!c) {
        http_respond_error(r, 503, "M_UNKNOWN", "The database is busy; retry");
        return NULL;
    }
    bool failed = false;
    const room_version *known = rooms_version_of(c, room_id, &failed);
    fed_rooms_close(c);
    if (failed) {
        http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
        return NULL;
    }
    if (known) return known->id;
    json_t *stripped = json_object_get(json_object_get(pdu, "unsigned"), "invite_room_state");
    for (size_t i = 0; i < json_array_size(stripped); i++) {
        json_t *e = json_array_get(stripped, i);
        if (strcmp(json_string_value(json_object_get(e, "type")) ?: "", "m.room.create") == 0)
            return json_string_value(json_object_get(json_object_get(e, "content"),
                                                     "room_version")) ?: "1";
    }
    return "1";
}

/* Both forms: body is the v2 body (the v1 one rewritten so). */
static int invite(atrium_req *r, json_t *body, bool v1)
{
    const char *room_id = http_req_param(r, "roomId"), *event_id = http_req_param(r, "eventId");
    invite_wait *st = r->core_state;
    if (!st) return invite_begin(r, room_id, event_id, body);
    if (!st->done)
        return http_respond_error(r, r->run_reason == ATRIUM_RUN_SHUTDOWN ? 503 : 504, "M_UNKNOWN",
                                  "Your server's key could not be had in time");
    if (st->result != 0)
        return http_respond_error(r, 403, "M_FORBIDDEN", "The invite is not signed by your server: %s",
                                  st->why);
    json_t *pdu = json_deep_copy(json_object_get(body, "event"));
    /* Our signature, over the redacted event, beside the inviter's. */
    json_t *red = event_redact(st->ver, pdu);
    json_object_del(red, "signatures");
    if (!red || federation_sign_json(red) < 0) {
        json_decref(red);
        json_decref(pdu);
        return http_respond_error(r, 500, "M_UNKNOWN", "The invite could not be signed");
    }
    json_t *sigs = json_object_get(pdu, "signatures");
    if (!json_is_object(sigs)) {
        json_object_set_new(pdu, "signatures", json_object());
        sigs = json_object_get(pdu, "signatures");
    }
    json_object_update(sigs, json_object_get(red, "signatures"));
    json_decref(red);
    PGconn *c = db_acquire(db_global(), DB_WAIT_CONFIGURED);
    if (!c) {
        json_decref(pdu);
        return http_respond_error(r, 503, "M_UNKNOWN", "The database is busy; retry");
    }
    int in_room = fed_rooms_server_joined(c, room_id, fed_state()->server_name);
    int acl = in_room == 1 ? fed_rooms_acl_allows(c, room_id, r->origin) : 1;
    int rc = in_room < 0 || acl < 0 ? -1 : 0;
    if (rc == 0 && acl && in_room == 0)
        rc = keep_invite(c, room_id, event_id, pdu, st->ver,
                         json_object_get(body, "invite_room_state"), r->origin);
    fed_rooms_close(c);
    if (rc < 0) {
        json_decref(pdu);
        return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    }
    if (!acl) {
        json_decref(pdu);
        return http_respond_error(r, 403, "M_FORBIDDEN", "Server ACLs of the room deny your server");
    }
    rooms_tx_wake_user(event_state_key(pdu));
    rt_log(ATRIUM_LOG_INFO, "federation", "%s invited %s to %s (%s)",
           json_string_value(json_object_get(pdu, "sender")), event_state_key(pdu), room_id,
           event_id);
    json_t *answer = json_pack("{s:o}", "event", pdu);
    return http_respond_json(r, 200, v1 ? json_pack("[i, o]", 200, answer) : answer);
}

/* PUT /_matrix/federation/v2/invite/{roomId}/{eventId} */
static int put_invite(atrium_req *r)
{
    json_t *body = http_req_json(r);
    if (!body) return ATRIUM_DONE;
    if (!rooms_room_id_ok(http_req_param(r, "roomId")))
        return http_respond_error(r, 400, "M_INVALID_PARAM", "Not a room ID");
    return invite(r, body, false);
}

/* PUT /_matrix/federation/v1/invite/{roomId}/{eventId} */
static int put_invite_v1(atrium_req *r)
{
    const char *room_id = http_req_param(r, "roomId");
    json_t *pdu = http_req_json(r);
    if (!pdu) return ATRIUM_DONE;
    if (!rooms_room_id_ok(room_id)) return http_respond_error(r, 400, "M_INVALID_PARAM", "Not a room ID");
    if (!json_is_object(pdu)) return http_respond_error(r, 400, "M_BAD_JSON", "Not an event");
    invite_wait *st = r->core_state;
    const char *ver = st ? st->ver->id : v1_version(r, room_id, pdu);
    if (!ver) return ATRIUM_DONE;
    json_t *stripped = json_object_get(json_object_get(pdu, "unsigned"), "invite_room_state");
    json_t *body = json_pack("{s:O, s:s, s:O}", "event", pdu, "room_version", ver,
                             "invite_room_state", json_is_array(stripped) ? stripped : json_null());
    if (!body) return ATRIUM_E_NOMEM;
    int rc = invite(r, body, true);
    json_decref(body);
    return rc;
}

int fed_rooms_invite_routes(fed_module *m)
{
    static const atrium_route routes[] = {
        {.method = "PUT", .path = "/_matrix/federation/v2/invite/{roomId}/{eventId}",
         .handler = put_invite, .flags = ATRIUM_ROUTE_FEDERATION},
        {.method = "PUT", .path = "/_matrix/federation/v1/invite/{roomId}/{eventId}",
         .handler = put_invite_v1, .flags = ATRIUM_ROUTE_FEDERATION},
    };
    if (HTTP_ROUTES_ADD(m->srv, routes, "federation") < 0) return -1;
    return 0;
}
