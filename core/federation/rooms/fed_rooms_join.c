/*
 * core/federation/rooms/fed_rooms_join.c - this server as the resident server of a room another
 * server's user joins, leaves or knocks on: GET /v1/make_join/{roomId}/{userId}?ver=..., PUT
 * /v2/send_join/{roomId}/{eventId}, GET /v1/make_leave/{roomId}/{userId}, PUT
 * /v2/send_leave/{roomId}/{eventId}, GET /v1/make_knock/{roomId}/{userId}?ver=... and PUT
 * /v1/send_knock/{roomId}/{eventId}. The older PUT /v1/send_join and /v1/send_leave, which
 * other servers still call (and fall back to when a v2 is unrecognized), are the same
 * checks with the answer in the v1 envelope the spec gives them: [200, answer].
 *
 * make_* answers a template built by the write path (rooms_tx_template: the auth rules
 * against the current state, prev_events from the forward extremities, the spec's auth
 * events), which the joining server completes, hashes and signs. send_* checks what comes
 * back, in the spec's order: the shape (a membership event of the origin's own user, for
 * this room, with the membership asked for), the event ID and content hash, the origin's
 * signature (the request parks while the key ring answers: no thread waits on a peer),
 * then the auth rules against the event's own auth events and against the current state;
 * only then is it appended to the stream (rooms_tx_append_pdu) with the state it was
 * authorized against, and queued for the room's other servers. send_join answers the
 * state before the join and its auth chain (full state: no partial joins); send_knock the
 * room's stripped state (knock_room_state, rooms_stripped_state), which the knocking server
 * shows its user. A knock on a room whose version has no knocks is 403 before any
 * template (as Synapse answers; the spec's make_knock lists 403 for a room that does not
 * take knocks), a join rule that takes none is the auth rules' 403.
 *
 * Restricted rooms (v8+, knock_restricted v10+): make_join names in the template's content
 * a user of this server who may invite (rooms_restricted_authoriser) when the joiner is a
 * member of a room the join rule allows, as this server sees it; 403 when it is in none of
 * those this server is in, 400 M_UNABLE_TO_AUTHORISE_JOIN when this server is in none of
 * them (the joining server tries another), 400 M_UNABLE_TO_GRANT_JOIN when no user here
 * may invite. send_join then adds this server's signature to the join (cosign), stores that
 * copy and answers it as `event`.
 */
#include <stdio.h>
#include <string.h>

#include "core/rooms/rooms_tx.h"
#include "core/federation/rooms/fed_rooms.h"
#include "core/federation/rooms/fed_rooms_queue.h"
#include "core/rooms/rooms_space.h"
#include "core/rooms/state_pdus.h"

/* What a send_* request carries from its first run (the checks) to its second (after the
 * signature check woke it). */
typedef struct send_state {
    bool done;     /* the signature check answered (written before the wake) */
    int result;    /* 0: signed by the origin */
    char why[160];
    const room_version *ver;
    char event_id[ROOMS_GRAPH_ID_BYTES];
} send_state;

/* What send_* answers besides the acceptance. */
enum member_answer {
    ANSWER_NOTHING,      /* send_leave: {} */
    ANSWER_STATE,        /* send_join: the state and auth chain */
    ANSWER_STRIPPED,     /* send_knock: knock_room_state */
};

/* The membership a make_/send_ route is about. */
typedef struct member_route {
    const char *membership;
    enum member_answer answer;
    bool versioned; /* make_*: ?ver= must name the room's version */
    bool v1_envelope; /* send_*: the v1 form, answered [200, answer] */
} member_route;

static const member_route JOIN = {"join", ANSWER_STATE, true, false};
static const member_route LEAVE = {"leave", ANSWER_NOTHING, false, false};
static const member_route KNOCK = {"knock", ANSWER_STRIPPED, true, false};
static const member_route JOIN_V1 = {"join", ANSWER_STATE, true, true};
static const member_route LEAVE_V1 = {"leave", ANSWER_NOTHING, false, true};

/* Is user_id a user of the requesting server? */
static bool users_server(atrium_req *r, const char *user_id)
{
    return rooms_user_id_ok(user_id) && strcmp(room_auth_domain(user_id), r->origin) == 0;
}

/* Does the ?ver= list (default: "1", as the spec says) name v? */
static bool version_offered(atrium_req *r, const room_version *v)
{
    bool any = false;
    for (size_t i = 0; i < r->n_args; i++) {
        if (strcmp(r->args[i].name, "ver") != 0 || !r->args[i].value) continue;
        any = true;
        if (strcmp(r->args[i].value, v->id) == 0) return true;
    }
    return !any && strcmp(v->id, "1") == 0;
}

static int make_member(atrium_req *r, const member_route *mr)
{
    const char *room_id = http_req_param(r, "roomId"), *user = http_req_param(r, "userId");
    if (!users_server(r, user))
        return http_respond_error(r, 403, "M_FORBIDDEN", "The user is not on your server");
    PGconn *c = fed_rooms_open(r, room_id);
    if (!c) return ATRIUM_DONE;
    room_tx tx;
    rooms_err e = {0};
    json_t *pdu = NULL;
    int rc = rooms_tx_begin(&tx, c, r->arena, room_id, &e);
    if (rc == ROOMS_OK) {
        if (mr->versioned && !version_offered(r, tx.ver)) {
            const char *ver = tx.ver->id;
            rooms_tx_rollback(&tx);
            fed_rooms_close(c);
            return http_respond_json(r, 400, json_pack("{s:s, s:s, s:s}", "errcode",
                                                       "M_INCOMPATIBLE_ROOM_VERSION", "error",
                                                       "Your server does not support the room's "
                                                       "version", "room_version", ver));
        }
        if (mr == &KNOCK && !tx.ver->knock) {
            const char *ver = tx.ver->id;
            rooms_tx_rollback(&tx);
            fed_rooms_close(c);
            return http_respond_error(r, 403, "M_FORBIDDEN", "Room version %s does not support "
                                      "knocking", ver);
        }
        json_t *content = json_pack("{s:s}", "membership", mr->membership);
        /* A restricted room: the template names the user of this server who vouches for
         * the joiner (send_join then adds this server's signature). */
        char via[ROOMS_USER_ID_BYTES] = "";
        if (mr == &JOIN) rc = rooms_restricted_authoriser(c, room_id, user, via, &e);
        if (rc == ROOMS_OK && via[0])
            json_object_set_new(content, "join_authorised_via_users_server", json_string(via));
        room_new_event ev = {.sender = user, .type = "m.room.member", .state_key = user,
                             .content = content};
        if (rc == ROOMS_OK) rc = rooms_tx_template(&tx, &ev, &pdu, &e);
        json_decref(content);
        rooms_tx_rollback(&tx); /* a template writes nothing */
    }
    const char *ver = rc == ROOMS_OK ? tx.ver->id : NULL;
    fed_rooms_close(c);
    if (rc != ROOMS_OK) return rooms_fail(r, &e);
    return http_respond_json(r, 200, json_pack("{s:o, s:s}", "event", pdu, "room_version", ver));
}

static void signature_checked(void *arg, int result, const char *why)
{
    atrium_req *r = arg;
    send_state *st = r->core_state;
    st->result = result;
    snprintf(st->why, sizeof(st->why), "%s", why ? why : "");
    st->done = true;
    susp_wake(r);
}

/* The first run of send_*: the shape, ID and hash checks, then the signature check
 * started (parked). ATRIUM_PARKED, or ATRIUM_DONE after answering. */
static int send_member_begin(atrium_req *r, const member_route *mr, const char *room_id,
                             const char *event_id, json_t *pdu)
{
    const char *type = json_string_value(json_object_get(pdu, "type"));
    const char *sender = json_string_value(json_object_get(pdu, "sender"));
    const char *sk = event_state_key(pdu), *membership = event_content_str(pdu, "membership");
    const char *in_room = json_string_value(json_object_get(pdu, "room_id"));
    if (!type || strcmp(type, "m.room.member") != 0 || !sender || !sk || strcmp(sender, sk) != 0 ||
        !membership || strcmp(membership, mr->membership) != 0)
        return http_respond_error(r, 400, "M_BAD_JSON", "Not an m.room.member %s event of its "
                                  "sender", mr->membership);
    if (!in_room || strcmp(in_room, room_id) != 0)
        return http_respond_error(r, 400, "M_BAD_JSON", "The event is for another room");
    if (!users_server(r, sender))
        return http_respond_error(r, 403, "M_FORBIDDEN", "The user is not on your server");
    PGconn *c = fed_rooms_open(r, room_id);
    if (!c) return ATRIUM_DONE;
    bool failed = false;
    const room_version *v = rooms_version_of(c, room_id, &failed);
    fed_rooms_close(c);
    if (!v) return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    char id[EVENT_ID_LEN];
    if (event_compute_id(v, pdu, id) < 0 || strcmp(id, event_id) != 0)
        return http_respond_error(r, 400, "M_BAD_JSON", "The event ID is not the event's own");
    if (!event_id_names_origin(v, id, r->origin))
        return http_respond_error(r, 400, "M_BAD_JSON", "The event ID is not of your server");
    if (!event_content_hash_ok(pdu))
        return http_respond_error(r, 400, "M_BAD_JSON", "The content hash does not match");
    send_state *st = rt_arena_alloc(r->arena, sizeof(*st));
    if (!st) return ATRIUM_E_NOMEM;
    st->ver = v;
    snprintf(st->event_id, sizeof(st->event_id), "%s", id);
    r->core_state = st;
    json_t *red = event_redact(v, pdu);
    if (!red) return ATRIUM_E_NOMEM;
    if (susp_wait(r, r->deadline_ms) < 0) {
        json_decref(red);
        return http_respond_error(r, 503, "M_UNKNOWN", "The server is stopping");
    }
    int64_t ts = json_integer_value(json_object_get(pdu, "origin_server_ts"));
    int rc = federation_verify_json(red, r->origin, ts, signature_checked, r);
    json_decref(red);
    if (rc < 0) signature_checked(r, rc, "the signature could not be checked");
    return ATRIUM_PARKED;
}

/* The answer of send_join: the state before the join and the auth chain of it and of the
 * join, as PDUs, and the servers joined before it. */
static json_t *join_answer(PGconn *c, const json_t *state_map, const json_t *state_ids,
                           json_t *pdu)
{
    json_t *roots = json_deep_copy(state_ids), *auth_ids = event_ref_ids(pdu, "auth_events");
    json_array_extend(roots, auth_ids);
    json_decref(auth_ids);
    json_t *chain_ids = NULL, *auth = NULL;
    int rc = rooms_graph_auth_chain(c, roots, &chain_ids);
    json_decref(roots);
    if (rc == 0) rc = rooms_graph_load_many(c, chain_ids, &auth);
    json_decref(chain_ids);
    if (rc < 0) return NULL;
    json_t *state = json_array(), *servers = json_array();
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)state_map, k, v) {
        json_array_append(state, v);
        const char *t = json_string_value(json_object_get(v, "type"));
        if (!t || strcmp(t, "m.room.member") != 0 ||
            strcmp(event_content_str(v, "membership") ?: "", "join") != 0)
            continue;
        const char *server = room_auth_domain(event_state_key(v));
        bool have = false;
        for (size_t i = 0; i < json_array_size(servers); i++)
            if (strcmp(json_string_value(json_array_get(servers, i)), server) == 0) have = true;
        if (*server && !have) json_array_append_new(servers, json_string(server));
    }
    return json_pack("{s:s, s:o, s:o, s:O, s:b, s:o}", "origin", fed_state()->server_name,
                     "state", state, "auth_chain", auth, "event", pdu, "members_omitted", 0,
                     "servers_in_room", servers);
}

/* A join whose content names a user of this server as its authoriser (a restricted room,
 * the template make_join gave) gets this server's signature, which the auth rules of
 * other servers ask for (v8+); the event ID does not change. 0, or -1 when it could not
 * be signed. */
static int cosign(const room_version *v, json_t *pdu)
{
    const char *via = v->restricted_join ? event_content_str(pdu, "join_authorised_via_users_server")
                                         : NULL;
    if (!via || strcmp(room_auth_domain(via), fed_state()->server_name) != 0) return 0;
    json_t *red = event_redact(v, pdu);
    int rc = red ? federation_sign_json(red) : -1;
    if (rc == 0) json_object_set(pdu, "signatures", json_object_get(red, "signatures"));
    json_decref(red);
    return rc == 0 ? 0 : -1;
}

/* The second run: authorize against the auth events and the current state, store, queue
 * for the other servers and answer. */
static int send_member_finish(atrium_req *r, const member_route *mr, const char *room_id,
                              json_t *pdu, send_state *st)
{
    if (!st->done)
        return r->run_reason == ATRIUM_RUN_SHUTDOWN
                   ? http_respond_error(r, 503, "M_UNKNOWN", "The server is stopping")
                   : http_respond_error(r, 504, "M_UNKNOWN", "Your server's key could not be had in time");
    if (st->result != 0)
        return http_respond_error(r, 403, "M_FORBIDDEN", "The event is not signed by your server: %s",
                                  st->why);
    PGconn *c = fed_rooms_open(r, room_id);
    if (!c) return ATRIUM_DONE;
    room_tx tx;
    rooms_err e = {0};
    int rc = rooms_tx_begin(&tx, c, r->arena, room_id, &e);
    json_t *state = NULL, *ids = NULL, *auth = NULL, *answer = NULL;
    if (rc == ROOMS_OK) {
        json_t *auth_ids = event_ref_ids(pdu, "auth_events");
        if (!auth_ids || rooms_pdus_current(c, room_id, &state, &ids) < 0 ||
            rooms_pdus_of_ids(c, auth_ids, &auth) < 0)
            rc = rooms_set_err(&e, ROOMS_E_DB, "database");
        json_decref(auth_ids);
        char why[ROOM_AUTH_WHY_LEN];
        if (rc == ROOMS_OK && !room_auth_check_event(tx.ver, pdu, rooms_pdus_get, auth, why))
            rc = rooms_set_err(&e, ROOMS_E_FORBIDDEN, "Refused by its auth events: %s", why);
        if (rc == ROOMS_OK && !room_auth_check_event(tx.ver, pdu, rooms_pdus_get, state, why))
            rc = rooms_set_err(&e, ROOMS_E_FORBIDDEN, "Refused by the room's state: %s", why);
        /* Already stored (a retried send_join): answer again without storing twice. */
        bool dup = false;
        if (rc == ROOMS_OK) {
            int in = fed_rooms_event_pos(c, room_id, st->event_id, NULL);
            if (in < 0) rc = rooms_set_err(&e, ROOMS_E_DB, "database");
            dup = in > 0;
        }
        if (rc == ROOMS_OK && mr->answer == ANSWER_STATE && cosign(tx.ver, pdu) < 0)
            rc = rooms_set_err(&e, ROOMS_E_DB, "The join could not be signed");
        if (rc == ROOMS_OK && !dup)
            rc = rooms_tx_append_pdu(&tx, pdu, st->event_id, r->origin, ids, 0, &e);
        if (rc == ROOMS_OK && !dup && fed_rooms_queue_pdu(c, room_id, st->event_id, r->origin) < 0)
            rc = rooms_set_err(&e, ROOMS_E_DB, "database");
        if (rc == ROOMS_OK && mr->answer == ANSWER_STATE && !(answer = join_answer(c, state, ids, pdu)))
            rc = rooms_set_err(&e, ROOMS_E_DB, "database");
        if (rc == ROOMS_OK && mr->answer == ANSWER_STRIPPED)
            answer = json_pack("{s:o}", "knock_room_state", rooms_stripped_state(state, NULL));
        if (rc == ROOMS_OK) rc = rooms_tx_commit(&tx, &e);
        else rooms_tx_rollback(&tx);
    }
    fed_rooms_close(c);
    json_decref(state);
    json_decref(ids);
    json_decref(auth);
    if (rc != ROOMS_OK) {
        json_decref(answer);
        if (rc == ROOMS_E_FORBIDDEN)
            rt_log(ATRIUM_LOG_INFO, "federation", "send_%s from %s for %s refused: %s",
                   mr->membership, r->origin, room_id, e.why);
        return rooms_fail(r, &e);
    }
    fed_rooms_kick();
    rt_log(ATRIUM_LOG_INFO, "federation", "%s's %s of %s accepted (%s)", r->origin, mr->membership,
           room_id, st->event_id);
    if (!answer) answer = json_object();
    if (mr->v1_envelope) answer = json_pack("[i, o]", 200, answer);
    return http_respond_json(r, 200, answer);
}

static int send_member(atrium_req *r, const member_route *mr)
{
    const char *room_id = http_req_param(r, "roomId"), *event_id = http_req_param(r, "eventId");
    json_t *pdu = http_req_json(r);
    if (!pdu) return ATRIUM_DONE;
    send_state *st = r->core_state;
    if (!st) return send_member_begin(r, mr, room_id, event_id, pdu);
    return send_member_finish(r, mr, room_id, pdu, st);
}

static int get_make_join(atrium_req *r) { return make_member(r, &JOIN); }
static int get_make_leave(atrium_req *r) { return make_member(r, &LEAVE); }
static int put_send_join(atrium_req *r) { return send_member(r, &JOIN); }
static int put_send_leave(atrium_req *r) { return send_member(r, &LEAVE); }
static int put_send_join_v1(atrium_req *r) { return send_member(r, &JOIN_V1); }
static int put_send_leave_v1(atrium_req *r) { return send_member(r, &LEAVE_V1); }
static int get_make_knock(atrium_req *r) { return make_member(r, &KNOCK); }
static int put_send_knock(atrium_req *r) { return send_member(r, &KNOCK); }

int fed_rooms_join_routes(fed_module *m)
{
    static const atrium_route routes[] = {
        {.method = "GET", .path = "/_matrix/federation/v1/make_join/{roomId}/{userId}",
         .handler = get_make_join, .flags = ATRIUM_ROUTE_FEDERATION},
        {.method = "PUT", .path = "/_matrix/federation/v2/send_join/{roomId}/{eventId}",
         .handler = put_send_join, .flags = ATRIUM_ROUTE_FEDERATION},
        {.method = "GET", .path = "/_matrix/federation/v1/make_leave/{roomId}/{userId}",
         .handler = get_make_leave, .flags = ATRIUM_ROUTE_FEDERATION},
        {.method = "PUT", .path = "/_matrix/federation/v2/send_leave/{roomId}/{eventId}",
         .handler = put_send_leave, .flags = ATRIUM_ROUTE_FEDERATION},
        {.method = "PUT", .path = "/_matrix/federation/v1/send_join/{roomId}/{eventId}",
         .handler = put_send_join_v1, .flags = ATRIUM_ROUTE_FEDERATION},
        {.method = "PUT", .path = "/_matrix/federation/v1/send_leave/{roomId}/{eventId}",
         .handler = put_send_leave_v1, .flags = ATRIUM_ROUTE_FEDERATION},
        {.method = "GET", .path = "/_matrix/federation/v1/make_knock/{roomId}/{userId}",
         .handler = get_make_knock, .flags = ATRIUM_ROUTE_FEDERATION},
        {.method = "PUT", .path = "/_matrix/federation/v1/send_knock/{roomId}/{eventId}",
         .handler = put_send_knock, .flags = ATRIUM_ROUTE_FEDERATION},
    };
    if (HTTP_ROUTES_ADD(m->srv, routes, "federation") < 0) return -1;
    return 0;
}
