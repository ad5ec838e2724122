/*
 * core/client/rooms/crooms_knock.c - knocking: POST /_matrix/client/v3/knock/{roomIdOrAlias}
 * (server_name / via query parameters, an optional reason), and the knocking server's half
 * of a knock on a room of other servers (make_knock, send_knock).
 *
 * A knock is an m.room.member event "knock" of the user about themselves. Whether it is
 * allowed is the auth rules' decision (room_auth.c: room version 7+, join rule knock, or
 * knock_restricted from version 10; not while banned, invited or joined), so a knock on a
 * room this server is in is one event of the write path, like a join. The room's members
 * answer a knock with the actions they already have: an invite accepts it (the auth rules
 * let an invite follow a knock), a kick rejects it; the knocker withdraws it by leaving.
 *
 * A room this server is not in is knocked on through the servers that are, on the remote
 * pool (no request-pool thread waits on a peer): GET /v1/make_knock at each via in turn
 * (offering every room version we support), the template completed, sealed and sent with
 * PUT /v1/send_knock to the server that made it. That server's answer, the stripped state
 * of the room (knock_room_state), is kept with the knock (remote_knocks) for /sync's
 * knock_state; the knock itself is an outlier and the user's newest membership, as an
 * invite from another server is (core/federation/rooms/fed_rooms_invite.c). The resident server
 * then reaches us through the paths every room uses: its invite is PUT /v2/invite, its
 * kick a PDU for our user (fed_rooms_outsider.c). The user withdraws the knock by leaving
 * (crooms_knock_withdraw): make_leave / send_leave through the server that took the knock;
 * when no resident takes the leave (unreachable, or the knock already over there: Synapse
 * does not send its rejections to servers outside the room) it is withdrawn here all the
 * same, with a leave of our own that only this server keeps, so no knock stays stuck.
 *
 * The stripped state of a room for those who are not in it (rooms_stripped_state: which
 * events, and which fields of each) is the room model's (core/rooms/state_pdus.c).
 *
 * Not here: the resident server's side (core/federation/rooms/fed_rooms_join.c), /sync's knock
 * section (core/client/sync/sync_rooms.c), leaving (crooms_membership.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/auth/auth.h"
#include "core/client/rooms/crooms_api.h"
#include "core/client/sync/notifier.h"
#include "core/federation/transport/fed_call.h"
#include "core/rooms/canonical_json.h"
#include "core/rooms/state_pdus.h"
#include "core/runtime/uri.h"

#define KNOCK_URI_BYTES 2048
#define KNOCK_MAKE_MAX_BODY_BYTES (256 * 1024)  /* a make_knock answer: one template */
#define KNOCK_SEND_MAX_BODY_BYTES (1024 * 1024) /* a send_knock answer: stripped state */
#define KNOCK_MAX_VIAS 8                        /* via servers tried at most */
#define KNOCK_MAX_STATE 64                      /* stripped state events kept with a knock */

/* ---- knocking through other servers -------------------------------------------------- */

/* make_<membership> ("knock", "leave") at each via in turn: the answer ({"event",
 * "room_version"} of a version that knows knocks) and the via that gave it; NULL with
 * *last the last failure. */
static json_t *ask_make(atrium_req *r, const char *membership, const char *user,
                        const char *room_id, const json_t *vias, const char **via_out,
                        fed_call_result *last)
{
    char room_enc[KNOCK_URI_BYTES / 4], user_enc[KNOCK_URI_BYTES / 4], uri[KNOCK_URI_BYTES];
    memset(last, 0, sizeof(*last));
    last->outcome = FED_REQ_E_RESOLVE;
    snprintf(last->error, sizeof(last->error), "no server to ask");
    if (!rt_uri_encode(room_id, room_enc, sizeof(room_enc)) ||
        !rt_uri_encode(user, user_enc, sizeof(user_enc))) {
        last->outcome = FED_REQ_E_URI_TOO_LONG;
        snprintf(last->error, sizeof(last->error), "the room or user ID is too long to send");
        return NULL;
    }
    size_t o = (size_t)snprintf(uri, sizeof(uri), "/_matrix/federation/v1/make_%s/%s/%s",
                                membership, room_enc, user_enc);
    for (size_t i = 0; ROOM_VERSIONS_SUPPORTED[i] && o < sizeof(uri); i++)
        o += (size_t)snprintf(uri + o, sizeof(uri) - o, "%sver=%s", i ? "&" : "?",
                              ROOM_VERSIONS_SUPPORTED[i]);
    size_t tried = 0;
    for (size_t i = 0; i < json_array_size(vias) && tried < KNOCK_MAX_VIAS; i++) {
        const char *via = json_string_value(json_array_get(vias, i));
        if (!via || !*via || strcmp(via, rooms_server_name()) == 0) continue;
        tried++;
        fed_call_result_clear(last);
        fed_request_opts req = {.method = "GET", .destination = via, .uri = uri,
                                .deadline_ms = r->deadline_ms, .ignore_backoff = true,
                                .max_body_bytes = KNOCK_MAKE_MAX_BODY_BYTES};
        fed_call(&req, NULL, last);
        json_t *ev = fed_call_ok(last) ? json_object_get(last->json, "event") : NULL;
        const char *ver = json_string_value(json_object_get(last->json, "room_version"));
        const room_version *v = ver ? room_version_find(ver) : NULL;
        if (json_is_object(ev) && v && v->knock) {
            *via_out = via;
            return json_incref(last->json);
        }
        rt_log(ATRIUM_LOG_INFO, "core", "make_%s for %s at %s failed: %s (status %d)", membership,
               room_id, via, last->error, last->status);
    }
    return NULL;
}

/* Keep the sent knock: outlier, the stripped state the resident answered (the knock
 * last), the user's newest membership. true, or false (database; rolled back). */
static bool keep_knock(PGconn *c, const room_version *v, const char *room_id, const char *user,
                       const char *via, const char *id, const json_t *knock, const json_t *given)
{
    json_t *state = json_array();
    for (size_t i = 0; i < json_array_size(given) && json_array_size(state) < KNOCK_MAX_STATE; i++) {
        json_t *one = rooms_stripped_event(json_array_get(given, i));
        const char *type = json_string_value(json_object_get(one, "type"));
        /* The knock ends the list: an older member event of ours in the answer is not kept. */
        if (one && strcmp(type, "m.room.member") == 0 &&
            strcmp(json_string_value(json_object_get(one, "state_key")), user) == 0)
            json_decref(one);
        else if (one)
            json_array_append_new(state, one);
    }
    json_t *mine = rooms_stripped_event(knock);
    if (mine) json_array_append_new(state, mine);
    char *text = json_dumps(state, JSON_COMPACT);
    json_decref(state);
    if (!text) return false;
    char now[24];
    snprintf(now, sizeof(now), "%lld", (long long)rooms_wall_ms());
    const char *p[7] = {id, room_id, user, via, v->id, text, now};
    bool ok = db_begin(c) &&
              rooms_graph_store_outlier(c, room_id, id, knock, "outlier", NULL, via) == 0 &&
              db_exec(c,
                      "WITH ins AS (INSERT INTO remote_knocks (event_id, room_id, user_id, via,"
                      " room_version, knock_state, sent_ts) VALUES ($1, $2, $3, $4, $5, $6, $7)"
                      " ON CONFLICT (event_id) DO NOTHING RETURNING event_id)"
                      " INSERT INTO memberships (stream_pos, room_id, user_id, membership,"
                      " event_id, sender) SELECT stream_next(), $2, $3, 'knock', $1, $3 FROM ins",
                      7, p) &&
              db_commit(c);
    free(text);
    if (!ok) db_rollback(c);
    return ok;
}

/* Knock on room_id through the vias (on the remote pool's thread). Answers r. */
static int remote_knock(atrium_req *r, const char *user, const char *room_id, const json_t *vias,
                        const char *reason)
{
    fed_call_result mk;
    const char *via = NULL;
    json_t *made = ask_make(r, "knock", user, room_id, vias, &via, &mk);
    if (!made) {
        int out = crooms_remote_answer_failure(r, &mk, "No server could take the knock");
        fed_call_result_clear(&mk);
        return out;
    }
    fed_call_result_clear(&mk);
    const room_version *v = room_version_find(json_string_value(json_object_get(made, "room_version")));
    PGconn *c = http_db_checkout(r);
    if (!c) {
        json_decref(made);
        return ATRIUM_DONE;
    }
    rooms_err e = {0};
    char id[EVENT_ID_LEN];
    json_t *knock = crooms_remote_complete_member(c, v, json_object_get(made, "event"), user,
                                                 "knock", reason, NULL, id, &e);
    json_decref(made);
    http_db_checkin(c); /* no connection is held while a peer answers */
    if (!knock) return rooms_fail(r, &e);
    char room_enc[KNOCK_URI_BYTES / 4], id_enc[KNOCK_URI_BYTES / 4], uri[KNOCK_URI_BYTES];
    if (!rt_uri_encode(room_id, room_enc, sizeof(room_enc)) ||
        !rt_uri_encode(id, id_enc, sizeof(id_enc))) {
        json_decref(knock);
        return http_respond_error(r, 400, "M_INVALID_PARAM",
                                  "The room ID is too long to send to another server");
    }
    snprintf(uri, sizeof(uri), "/_matrix/federation/v1/send_knock/%s/%s", room_enc, id_enc);
    fed_request_opts req = {.method = "PUT", .destination = via, .uri = uri, .body = knock,
                            .deadline_ms = r->deadline_ms, .ignore_backoff = true,
                            .max_body_bytes = KNOCK_SEND_MAX_BODY_BYTES};
    fed_call_result sent;
    fed_call(&req, NULL, &sent);
    if (!fed_call_ok(&sent) || !(c = http_db_checkout(r))) {
        json_decref(knock);
        int out = fed_call_ok(&sent) ? ATRIUM_DONE
                                     : crooms_remote_answer_failure(r, &sent, "The resident server refused the knock");
        fed_call_result_clear(&sent);
        return out;
    }
    /* knock_room_state is the spec's name; knock_state_events the proposal's, which older
     * servers answer with. */
    json_t *given = json_object_get(sent.json, "knock_room_state");
    if (!json_is_array(given)) given = json_object_get(sent.json, "knock_state_events");
    bool ok = keep_knock(c, v, room_id, user, via, id, knock, given);
    http_db_checkin(c);
    json_decref(knock);
    fed_call_result_clear(&sent);
    if (!ok) return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    notifier_wake_user(user);
    rt_log(ATRIUM_LOG_INFO, "core", "%s knocked on %s through %s", user, room_id, via);
    return http_respond_json(r, 200, json_pack("{s:s}", "room_id", room_id));
}

/* ---- withdrawing a knock on a room this server is not in ------------------------------- */

/* The user's standing knock on room_id as this server kept it: the event and its room
 * version. NULL when there is none (or on failure). */
static json_t *kept_knock(PGconn *c, const char *room_id, const char *user, const room_version **v)
{
    const char *p[2] = {room_id, user};
    PGresult *res = rooms_q(c,
                            "SELECT k.room_version, g.pdu FROM (SELECT event_id, membership"
                            "  FROM memberships WHERE room_id = $1 AND user_id = $2"
                            "  ORDER BY stream_pos DESC LIMIT 1) m"
                            " JOIN remote_knocks k ON k.event_id = m.event_id"
                            " JOIN event_outliers g ON g.event_id = m.event_id"
                            " WHERE m.membership = 'knock'",
                            2, p, NULL);
    json_t *knock = res && PQntuples(res) == 1 ? json_loads(PQgetvalue(res, 0, 1), 0, NULL) : NULL;
    *v = knock ? room_version_find(PQgetvalue(res, 0, 0)) : NULL;
    PQclear(res);
    if (!*v) {
        json_decref(knock);
        return NULL;
    }
    return knock;
}

/* A leave of this server's own making that follows the knock (its one prev and auth
 * event), for when no resident server made one: it is kept here only. A new event with
 * its ID, or NULL with e set. */
static json_t *local_leave(const room_version *v, const json_t *knock, const char *user,
                           char id[EVENT_ID_LEN], rooms_err *e)
{
    char knock_id[EVENT_ID_LEN];
    if (event_compute_id(v, knock, knock_id) < 0) {
        rooms_set_err(e, ROOMS_E_DB, "The kept knock is not canonical JSON");
        return NULL;
    }
    json_t *pdu = json_pack("{s:O, s:s, s:s, s:s, s:{s:s}, s:I, s:I}", "room_id",
                            json_object_get(knock, "room_id"), "type", "m.room.member", "sender",
                            user, "state_key", user, "content", "membership", "leave", "depth",
                            json_integer_value(json_object_get(knock, "depth")) + 1,
                            "origin_server_ts", (json_int_t)rooms_wall_ms());
    if (!pdu) {
        rooms_set_err(e, ROOMS_E_DB, "out of memory");
        return NULL;
    }
    if (!v->v11_redaction) json_object_set_new(pdu, "origin", json_string(rooms_server_name()));
    json_t *ref = v->event_id_format == ROOM_EVENT_ID_OPAQUE ? event_ref_pair(v, knock_id, knock)
                                                             : json_string(knock_id);
    json_object_set_new(pdu, "prev_events", json_pack("[O]", ref));
    json_object_set_new(pdu, "auth_events", json_pack("[O]", ref));
    json_decref(ref);
    if (rooms_event_seal(v, pdu, id, e) != ROOMS_OK) {
        json_decref(pdu);
        return NULL;
    }
    return pdu;
}

/* Keep a leave that ends the knock: an outlier and the user's newest membership. */
static bool keep_leave(PGconn *c, const char *room_id, const char *user, const char *id,
                       const json_t *leave, const char *via)
{
    const char *p[3] = {id, room_id, user};
    bool ok = db_begin(c) &&
              rooms_graph_store_outlier(c, room_id, id, leave, "outlier", NULL, via) == 0 &&
              db_exec(c,
                      "INSERT INTO memberships (stream_pos, room_id, user_id, membership,"
                      " event_id, sender) VALUES (stream_next(), $2, $3, 'leave', $1, $3)",
                      3, p) &&
              db_commit(c);
    if (!ok) db_rollback(c);
    return ok;
}

/* make_leave / send_leave through the vias: the sent leave and the via that took it, or
 * NULL (any failure: logged). Holds no database connection. */
static json_t *send_leave(atrium_req *r, const char *user, const char *room_id,
                          const json_t *vias, char id[EVENT_ID_LEN], const char **via_out)
{
    fed_call_result mk;
    json_t *made = ask_make(r, "leave", user, room_id, vias, via_out, &mk);
    fed_call_result_clear(&mk);
    if (!made) return NULL;
    const room_version *v = room_version_find(json_string_value(json_object_get(made, "room_version")));
    rooms_err e = {0};
    const char *reason = json_string_value(json_object_get(r->json, "reason"));
    json_t *leave = crooms_remote_complete_member(NULL, v, json_object_get(made, "event"), user,
                                                 "leave", reason, NULL, id, &e);
    json_decref(made);
    if (!leave) {
        rt_log(ATRIUM_LOG_INFO, "core", "withdrawing %s's knock on %s: %s", user, room_id, e.why);
        return NULL;
    }
    char room_enc[KNOCK_URI_BYTES / 4], id_enc[KNOCK_URI_BYTES / 4];
    if (!rt_uri_encode(room_id, room_enc, sizeof(room_enc)) ||
        !rt_uri_encode(id, id_enc, sizeof(id_enc))) {
        rt_log(ATRIUM_LOG_INFO, "core", "withdrawing %s's knock on %s: the room ID is too long "
               "to send", user, room_id);
        json_decref(leave);
        return NULL;
    }
    fed_call_result sent;
    crooms_remote_put_step(r, *via_out, "send_leave", room_enc, id_enc, leave, leave,
                          KNOCK_MAKE_MAX_BODY_BYTES, &sent);
    bool ok = fed_call_ok(&sent);
    if (!ok)
        rt_log(ATRIUM_LOG_INFO, "core", "send_leave of %s's knock on %s at %s failed: %s (status %d)",
               user, room_id, *via_out, sent.error, sent.status);
    fed_call_result_clear(&sent);
    if (!ok) {
        json_decref(leave);
        return NULL;
    }
    return leave;
}

int crooms_knock_withdraw(atrium_req *r, const char *user, const char *room_id)
{
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    const room_version *v = NULL;
    json_t *knock = kept_knock(c, room_id, user, &v);
    if (!knock) {
        http_db_checkin(c);
        return http_respond_error(r, 403, "M_FORBIDDEN", "You are not knocking on this room");
    }
    json_t *vias = crooms_knock_vias(r, c, room_id, user);
    http_db_checkin(c); /* no connection is held while a peer answers */
    char id[EVENT_ID_LEN];
    const char *via = NULL;
    json_t *leave = send_leave(r, user, room_id, vias, id, &via);
    if (via) via = rt_arena_strdup(r->arena, via); /* it lives in vias */
    json_decref(vias);
    rooms_err e = {0};
    if (!leave) {
        /* No resident server took the leave (unreachable, or the knock is over there: a
         * rejection it never sent us). The knock is withdrawn here all the same. */
        via = NULL;
        leave = local_leave(v, knock, user, id, &e);
    }
    json_decref(knock);
    if (leave && !(c = http_db_checkout(r))) {
        json_decref(leave);
        return ATRIUM_DONE;
    }
    bool ok = leave && keep_leave(c, room_id, user, id, leave, via);
    if (leave) http_db_checkin(c);
    json_decref(leave);
    if (!ok) return e.code ? rooms_fail(r, &e) : http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    notifier_wake_user(user);
    rt_log(ATRIUM_LOG_INFO, "core", "%s withdrew the knock on %s%s%s", user, room_id,
           via ? " through " : " (here only)", via ? via : "");
    return http_respond_json(r, 200, json_object());
}

json_t *crooms_knock_vias(atrium_req *r, PGconn *c, const char *room_id, const char *user)
{
    json_t *vias = json_array();
    const char *p[2] = {room_id, user};
    PGresult *res = rooms_q(c,
                            "SELECT via FROM remote_knocks WHERE room_id = $1 AND user_id = $2"
                            " ORDER BY sent_ts DESC LIMIT 1",
                            2, p, NULL);
    if (res && PQntuples(res) == 1) json_array_append_new(vias, json_string(PQgetvalue(res, 0, 0)));
    PQclear(res);
    json_t *more = crooms_remote_vias(r, c, room_id, false);
    json_array_extend(vias, more);
    json_decref(more);
    return vias;
}

/* ---- the request --------------------------------------------------------------------- */

/* Knock on room_id; alias_vias (may be NULL): the servers a remote alias's answer named. */
static int knock_room(atrium_req *r, const char *user, const char *room_id,
                      const json_t *alias_vias)
{
    json_t *body = r->body_len == 0 ? (r->json ? r->json : (r->json = json_object()))
                                    : http_req_json(r);
    if (!body) return ATRIUM_DONE;
    const char *reason;
    if (!http_field_string(r, body, "reason", false, CROOMS_MAX_REASON_BYTES, &reason))
        return ATRIUM_DONE;
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
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
        int out = remote_knock(r, user, room_id, vias, reason);
        json_decref(vias);
        return out;
    }
    bool failed = remote < 0;
    bool exists = !failed && rooms_version_of(c, room_id, &failed) != NULL;
    json_t *content = exists && !failed ? crooms_member_content(c, user, "knock") : NULL;
    http_db_checkin(c);
    if (failed) return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    if (!exists) return http_respond_error(r, 404, "M_NOT_FOUND", "Unknown room");
    if (reason) json_object_set_new(content, "reason", json_string(reason));
    /* Whether the room takes knocks from this user (its version, join rule, the user's
     * membership) is the auth rules' decision: a refusal is 403 M_FORBIDDEN. */
    room_new_event ev = {.sender = user, .type = "m.room.member", .state_key = user,
                         .content = content};
    int out = crooms_write_one(r, room_id, &ev, json_pack("{s:s}", "room_id", room_id));
    json_decref(content);
    return out;
}

/* POST /_matrix/client/v3/knock/{roomIdOrAlias} */
static int post_knock(atrium_req *r)
{
    const char *user = auth_request(r);
    if (!user) return ATRIUM_DONE;
    if (!crooms_vias_ok(r, false)) return ATRIUM_DONE;
    const char *target = http_req_param(r, "roomIdOrAlias");
    if (target && target[0] == '#') return crooms_act_on_alias(r, user, target, knock_room);
    if (!rooms_room_id_ok(target))
        return http_respond_error(r, 400, "M_INVALID_PARAM", "Not a room ID or alias");
    return knock_room(r, user, target, NULL);
}

int crooms_knock_routes(http_server *s)
{
    return client_route(s, "POST", "/_matrix/client/v3/knock/{roomIdOrAlias}", post_knock,
                        CROOMS_MAX_BODY_BYTES);
}
