/*
 * core/client/rooms/crooms_remote.c - joining a room through other servers, as the joining
 * server: make_join to the via servers in turn, the join completed from the template,
 * signed (rooms_event_seal) and sent with send_join, and the returned state and auth chain
 * checked and stored before the join itself.
 *
 * It runs on the rooms module's remote pool (crooms_to_remote_pool): the client's request
 * is handed off, so no request-pool thread waits while peers answer; the pool thread waits
 * on each request and signature check with its deadline (fed_call.h), and holds no
 * database connection while it does: one is borrowed for each step that needs the
 * database (the member event's profile, storing the answer, the invite under the room's
 * lock) and given back before the next peer is asked, so a hung peer pins a pool thread,
 * never a connection. (When none is free for the storing, the client is answered 503
 * though the resident has the join; its retry joins again.) The checks of each received
 * event are the spec's, in its order: the room it claims, its format
 * (event_check_format: sizes, canonical JSON), its ID (the reference hash
 * under the room's version), its content hash (a mismatch keeps the redacted event), the
 * signatures the version requires (fed_call_verify_event), and the auth rules against its
 * own auth events (rule 2 on them first: room_auth_check_auth_events), which must
 * themselves have passed: an event whose auth event was
 * refused is refused. The state is stored in depth order as historical events of the
 * stream (so current state is the resident's state, and /sync shows the room), the rest
 * of the auth chain as outliers, then the join with the state it was authorized against.
 *
 * A restricted room's join keeps the authorising user the resident's template names, and
 * the resident's co-signed copy of the join (send_join's `event`) is the one stored.
 *
 * Not here: partial-state joins (the full state is asked for), and resolving another
 * server's alias (the directory's:
 * crooms_membership.c passes the servers its answer names as the first vias).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/rooms/crooms_api.h"
#include "core/client/sync/notifier.h"
#include "core/federation/transport/fed_call.h"
#include "core/rooms/canonical_json.h"
#include "core/rooms/state_pdus.h"
#include "core/runtime/server_name.h"
#include "core/runtime/uri.h"

#define REMOTE_URI_BYTES 2048
#define REMOTE_JOIN_MAX_BODY_BYTES (64 * 1024 * 1024) /* a send_join answer: the full state */
#define REMOTE_MAKE_MAX_BODY_BYTES (256 * 1024)
#define REMOTE_MAX_VIAS 8 /* via servers tried at most */

int crooms_join_needs_remote(PGconn *c, const char *room_id)
{
    const char *p[2] = {room_id, rooms_server_name()};
    PGresult *res = rooms_q(c,
                            "SELECT EXISTS (SELECT 1 FROM rooms WHERE room_id = $1),"
                            " coalesce(bool_or(substr(state_key, strpos(state_key, ':') + 1) = $2),"
                            "  false),"
                            " coalesce(bool_or(substr(state_key, strpos(state_key, ':') + 1) <> $2),"
                            "  false)"
                            " FROM current_state WHERE room_id = $1 AND type = 'm.room.member'"
                            " AND membership = 'join'",
                            2, p, NULL);
    if (!res) return ROOMS_E_DB;
    bool known = PQgetvalue(res, 0, 0)[0] == 't', ours = PQgetvalue(res, 0, 1)[0] == 't',
         theirs = PQgetvalue(res, 0, 2)[0] == 't';
    PQclear(res);
    if (!known) return strcmp(room_auth_domain(room_id), rooms_server_name()) != 0;
    return !ours && theirs;
}

int crooms_remote_answer_failure(atrium_req *r, const struct fed_call_result *res,
                                const char *what)
{
    if (res->outcome == FED_REQ_E_URI_TOO_LONG)
        return http_respond_error(r, 400, "M_INVALID_PARAM", "%s: %s", what, res->error);
    if (res->outcome == FED_HTTP_E_TIMEOUT)
        return http_respond_error(r, 504, "M_UNKNOWN", "%s: the server did not answer in time", what);
    if (res->outcome == FED_REQ_E_NOT_ALLOWED)
        return http_respond_error(r, 403, "M_FORBIDDEN", "%s: federation with that server is not "
                                  "allowed", what);
    if (res->outcome != FED_HTTP_OK)
        return http_respond_error(r, 502, "M_UNKNOWN", "%s: %s", what, res->error);
    const char *code = json_string_value(json_object_get(res->json, "errcode"));
    const char *msg = json_string_value(json_object_get(res->json, "error"));
    int status = res->status >= 400 && res->status < 500 ? res->status : 502;
    return http_respond_error(r, status, code ? code : "M_UNKNOWN", "%s: %s", what,
                              msg ? msg : "refused");
}

/* Did the answer say the route is unknown there? (What servers answer for a route they do
 * not have: Atrium and Synapse 404 or 405 M_UNRECOGNIZED, older Synapses 400
 * M_UNRECOGNIZED, others a 404 with no Matrix error at all.) A 404 with another errcode
 * (M_NOT_FOUND: no such user) is the route's own answer. */
static bool route_unknown(const fed_call_result *res)
{
    if (res->outcome != FED_HTTP_OK && res->outcome != FED_REQ_E_NOT_JSON) return false;
    const char *code = json_string_value(json_object_get(res->json, "errcode"));
    if (res->status == 400) return code && strcmp(code, "M_UNRECOGNIZED") == 0;
    return (res->status == 404 || res->status == 405) &&
           (!code || strcmp(code, "M_UNRECOGNIZED") == 0);
}

void crooms_remote_put_step(atrium_req *r, const char *dest, const char *step,
                           const char *room_enc, const char *id_enc, const json_t *v2_body,
                           const json_t *v1_body, int64_t max_body, fed_call_result *res)
{
    char uri[REMOTE_URI_BYTES];
    snprintf(uri, sizeof(uri), "/_matrix/federation/v2/%s/%s/%s", step, room_enc, id_enc);
    fed_request_opts o = {.method = "PUT", .destination = dest, .uri = uri, .body = v2_body,
                          .deadline_ms = r->deadline_ms, .ignore_backoff = true,
                          .max_body_bytes = max_body};
    fed_call(&o, NULL, res);
    if (!route_unknown(res)) return;
    rt_log(ATRIUM_LOG_INFO, "core", "%s does not know /v2/%s (status %d): trying /v1/%s", dest,
           step, res->status, step);
    fed_call_result_clear(res);
    snprintf(uri, sizeof(uri), "/_matrix/federation/v1/%s/%s/%s", step, room_enc, id_enc);
    o.body = v1_body;
    o.v1_envelope = true;
    fed_call(&o, NULL, res);
}

/* One received event checked: room, ID, hash (redacted on mismatch), signatures. The
 * event to keep (a new reference, possibly redacted) with its ID, or NULL with why. */
static json_t *check_received(const room_version *v, const char *room_id, json_t *pdu,
                              char id[EVENT_ID_LEN], char why[FED_CALL_ERROR_BYTES])
{
    if (!json_is_object(pdu) || strcmp(json_string_value(json_object_get(pdu, "room_id")) ?: "",
                                       room_id) != 0) {
        snprintf(why, FED_CALL_ERROR_BYTES, "an event of another room");
        return NULL;
    }
    char fwhy[EVENT_WHY_LEN];
    if (event_check_format(v, pdu, fwhy) != EVENT_FORMAT_OK) {
        snprintf(why, FED_CALL_ERROR_BYTES, "%s", fwhy);
        return NULL;
    }
    if (event_compute_id(v, pdu, id) < 0) {
        snprintf(why, FED_CALL_ERROR_BYTES, "not canonical JSON");
        return NULL;
    }
    if (fed_call_verify_event(v, pdu, NULL, why) < 0) return NULL; /* no connection held */
    if (!event_content_hash_ok(pdu)) {
        rt_log(ATRIUM_LOG_INFO, "core", "event %s of %s: content hash mismatch, kept redacted",
               id, room_id);
        return event_redact(v, pdu);
    }
    return json_incref(pdu);
}

/* Does every auth event of pdu appear in accepted (ID -> event)? */
static bool auth_events_accepted(const json_t *pdu, const json_t *accepted)
{
    json_t *auth = json_object_get(pdu, "auth_events");
    for (size_t i = 0; i < json_array_size(auth); i++) {
        const char *aid = event_ref_id(json_array_get(auth, i));
        if (!aid || !json_object_get(accepted, aid)) return false;
    }
    return true;
}

static int by_depth(const void *a, const void *b)
{
    json_int_t da = json_integer_value(json_object_get(*(json_t *const *)a, "depth"));
    json_int_t db = json_integer_value(json_object_get(*(json_t *const *)b, "depth"));
    return da < db ? -1 : da > db;
}

/* Check every event of the answer (state and auth chain): accepted (ID -> PDU) gets those
 * that pass, checked in depth order so an event's auth events are judged before it. */
static void check_all(const room_version *v, const char *room_id, const json_t *state,
                      const json_t *chain, json_t *accepted)
{
    size_t n = json_array_size(state) + json_array_size(chain), k = 0;
    json_t **all = calloc(n ? n : 1, sizeof(*all));
    if (!all) return;
    for (size_t i = 0; i < json_array_size(chain); i++) all[k++] = json_array_get(chain, i);
    for (size_t i = 0; i < json_array_size(state); i++) all[k++] = json_array_get(state, i);
    qsort(all, k, sizeof(*all), by_depth);
    for (size_t i = 0; i < k; i++) {
        char id[EVENT_ID_LEN], why[FED_CALL_ERROR_BYTES];
        json_t *ev = check_received(v, room_id, all[i], id, why);
        if (!ev) {
            rt_log(ATRIUM_LOG_INFO, "core", "join of %s: an event of the answer refused: %s",
                   room_id, why);
            continue;
        }
        if (json_object_get(accepted, id)) {
            json_decref(ev);
            continue;
        }
        json_t *auth = json_object();
        json_t *ids = json_object_get(ev, "auth_events");
        const json_t *list[EVENT_MAX_AUTH_EVENTS];
        size_t n_list = 0;
        for (size_t j = 0; j < json_array_size(ids); j++) {
            const char *aid = event_ref_id(json_array_get(ids, j));
            json_t *ae = aid ? json_object_get(accepted, aid) : NULL;
            if (ae) rooms_pdus_put(auth, ae);
            if (ae && n_list < EVENT_MAX_AUTH_EVENTS) list[n_list++] = ae;
        }
        char awhy[ROOM_AUTH_WHY_LEN];
        /* Rule 2 on its own auth events (of this room, no pair twice, only those selection
         * picks), then the auth rules against them. */
        if (auth_events_accepted(ev, accepted) &&
            room_auth_check_auth_events(v, ev, list, n_list, awhy) &&
            room_auth_check_event(v, ev, rooms_pdus_get, auth, awhy))
            json_object_set(accepted, id, ev);
        else
            rt_log(ATRIUM_LOG_INFO, "core", "join of %s: event %s refused by its auth events",
                   room_id, id);
        json_decref(auth);
        json_decref(ev);
    }
    free(all);
}

/* make_<membership> ("join", "leave") at each via in turn: the answer and the via that
 * gave it. */
static json_t *ask_make(atrium_req *r, const char *membership, const char *user,
                        const char *room_id, const json_t *vias, const char **via_out,
                        fed_call_result *last)
{
    char room_enc[REMOTE_URI_BYTES / 4], user_enc[REMOTE_URI_BYTES / 4], uri[REMOTE_URI_BYTES];
    if (!rt_uri_encode(room_id, room_enc, sizeof(room_enc)) ||
        !rt_uri_encode(user, user_enc, sizeof(user_enc))) {
        memset(last, 0, sizeof(*last));
        last->outcome = FED_REQ_E_URI_TOO_LONG;
        snprintf(last->error, sizeof(last->error), "the room or user ID is too long to send");
        return NULL;
    }
    size_t o = (size_t)snprintf(uri, sizeof(uri), "/_matrix/federation/v1/make_%s/%s/%s",
                                membership, room_enc, user_enc);
    for (size_t i = 0; strcmp(membership, "join") == 0 && ROOM_VERSIONS_SUPPORTED[i] &&
                       o < sizeof(uri); i++)
        o += (size_t)snprintf(uri + o, sizeof(uri) - o, "%sver=%s", i ? "&" : "?",
                              ROOM_VERSIONS_SUPPORTED[i]);
    memset(last, 0, sizeof(*last));
    snprintf(last->error, sizeof(last->error), "no server to join through");
    last->outcome = FED_REQ_E_RESOLVE;
    /* The refusal the client is answered with when no via makes the event: a server's own
     * Matrix refusal (a 4xx with an errcode), one that is not 404 (this via does not know
     * the room) before a 404, rather than whatever the last via failed with. */
    fed_call_result refusal = {0};
    for (size_t i = 0; i < json_array_size(vias) && i < REMOTE_MAX_VIAS; i++) {
        const char *via = json_string_value(json_array_get(vias, i));
        if (!via || strcmp(via, rooms_server_name()) == 0) continue;
        fed_call_result_clear(last);
        fed_request_opts o2 = {.method = "GET", .destination = via, .uri = uri,
                               .deadline_ms = r->deadline_ms, .ignore_backoff = true,
                               .max_body_bytes = REMOTE_MAKE_MAX_BODY_BYTES};
        fed_call(&o2, NULL, last);
        json_t *ev = fed_call_ok(last) ? json_object_get(last->json, "event") : NULL;
        const char *ver = json_string_value(json_object_get(last->json, "room_version"));
        if (json_is_object(ev) && room_version_find(ver ? ver : "1")) {
            *via_out = via;
            fed_call_result_clear(&refusal);
            return json_incref(last->json);
        }
        rt_log(ATRIUM_LOG_INFO, "core", "make_%s for %s at %s failed: %s (status %d)", membership,
               room_id, via, last->error, last->status);
        bool refused = last->outcome == FED_HTTP_OK && last->status >= 400 && last->status < 500 &&
                       json_is_string(json_object_get(last->json, "errcode"));
        if (refused && (!refusal.json || (refusal.status == 404 && last->status != 404))) {
            fed_call_result_clear(&refusal);
            refusal = *last;
            last->json = json_incref(refusal.json);
        }
    }
    if (refusal.json) {
        fed_call_result_clear(last);
        *last = refusal;
    }
    return NULL;
}

json_t *crooms_remote_complete_member(PGconn *c, const room_version *v, const json_t *tmpl,
                                     const char *user, const char *membership,
                                     const char *reason, const json_t *extra,
                                     char id[EVENT_ID_LEN], rooms_err *e)
{
    json_t *pdu = json_deep_copy(tmpl);
    if (!pdu) {
        rooms_set_err(e, ROOMS_E_DB, "out of memory");
        return NULL;
    }
    json_object_del(pdu, "event_id");
    json_object_del(pdu, "hashes");
    json_object_del(pdu, "signatures");
    json_object_del(pdu, "unsigned");
    if (!v->v11_redaction) json_object_set_new(pdu, "origin", json_string(rooms_server_name()));
    else json_object_del(pdu, "origin");
    json_object_set_new(pdu, "origin_server_ts", json_integer(rooms_wall_ms()));
    bool profile = c && (strcmp(membership, "join") == 0 || strcmp(membership, "knock") == 0);
    json_t *content = profile ? crooms_member_content(c, user, membership)
                              : json_pack("{s:s}", "membership", membership);
    if (reason) json_object_set_new(content, "reason", json_string(reason));
    /* A restricted room: the resident named who vouches for the join (and co-signs it). */
    const char *vouch = strcmp(membership, "join") == 0
                            ? json_string_value(json_object_get(json_object_get(tmpl, "content"),
                                                                "join_authorised_via_users_server"))
                            : NULL;
    if (vouch) json_object_set_new(content, "join_authorised_via_users_server", json_string(vouch));
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)extra, key, value) json_object_set(content, key, value);
    json_object_set_new(pdu, "content", content);
    char why[ROOM_AUTH_WHY_LEN];
    if (cjson_normalize(pdu, why, sizeof(why)) < 0) {
        json_decref(pdu);
        rooms_set_err(e, ROOMS_E_BAD_JSON, "%s", why);
        return NULL;
    }
    if (strcmp(json_string_value(json_object_get(pdu, "sender")) ?: "", user) != 0 ||
        strcmp(event_state_key(pdu) ?: "", user) != 0 ||
        strcmp(json_string_value(json_object_get(pdu, "type")) ?: "", "m.room.member") != 0) {
        json_decref(pdu);
        rooms_set_err(e, ROOMS_E_FORBIDDEN, "The resident server's template is not this %s",
                      membership);
        return NULL;
    }
    if (rooms_event_seal(v, pdu, id, e) != ROOMS_OK) {
        json_decref(pdu);
        return NULL;
    }
    return pdu;
}

/* Store the checked answer and the join in one transaction. */
static int store_join(atrium_req *r, PGconn *c, const room_version *v, const char *room_id,
                      const char *via, const json_t *accepted, const json_t *state,
                      json_t *join, const char *join_id, rooms_err *e)
{
    /* The state events that passed, one per key (the answer's), and their IDs. */
    json_t *map = rooms_pdus_new(), *state_ids = json_array(), *in_state = json_object();
    for (size_t i = 0; i < json_array_size(state); i++) {
        char id[EVENT_ID_LEN];
        json_t *s = json_array_get(state, i);
        json_t *ok = event_compute_id(v, s, id) == 0 ? json_object_get(accepted, id) : NULL;
        if (!ok || json_object_get(in_state, id)) continue;
        rooms_pdus_put(map, ok);
        json_object_set_new(in_state, id, json_true());
        json_array_append_new(state_ids, json_string(id));
    }
    const json_t *create = rooms_pdus_get(map, "m.room.create", "");
    char why[ROOM_AUTH_WHY_LEN];
    int rc = ROOMS_OK;
    if (!create)
        rc = rooms_set_err(e, ROOMS_E_FORBIDDEN, "The resident server's state has no valid "
                           "m.room.create event");
    else if (!room_auth_check_event(v, join, rooms_pdus_get, map, why))
        rc = rooms_set_err(e, ROOMS_E_FORBIDDEN, "The join is refused by the room's state: %s", why);
    room_tx tx;
    bool failed = false, known = rc == ROOMS_OK && rooms_version_of(c, room_id, &failed) != NULL;
    if (failed) rc = rooms_set_err(e, ROOMS_E_DB, "database");
    if (rc == ROOMS_OK) {
        const char *creator = v->creator_is_sender
                                  ? json_string_value(json_object_get(create, "sender"))
                                  : event_content_str(create, "creator");
        rc = known ? rooms_tx_begin(&tx, c, r->arena, room_id, e)
                   : rooms_tx_begin_new(&tx, c, r->arena, room_id, v, creator ? creator : "", e);
        if (rc == ROOMS_OK) {
            tx.ver = v;
            /* The auth chain beyond the state: outliers. */
            const char *k;
            json_t *ev;
            json_object_foreach((json_t *)accepted, k, ev) {
                if (rc != ROOMS_OK) break;
                if (!json_object_get(in_state, k) &&
                    rooms_graph_store_outlier(c, room_id, k, ev, "outlier", NULL, via) < 0)
                    rc = rooms_set_err(e, ROOMS_E_DB, "database");
            }
            /* The state, oldest first, into the stream (events already there are kept). */
            size_t n = json_array_size(state_ids);
            json_t **sorted = calloc(n ? n : 1, sizeof(*sorted));
            if (!sorted) rc = rooms_set_err(e, ROOMS_E_DB, "out of memory");
            size_t m = 0;
            json_object_foreach(map, k, ev) if (sorted && m < n) sorted[m++] = ev;
            if (sorted) qsort(sorted, m, sizeof(*sorted), by_depth);
            for (size_t i = 0; rc == ROOMS_OK && i < m; i++) {
                char id[EVENT_ID_LEN];
                if (event_compute_id(v, sorted[i], id) < 0) continue;
                rooms_graph_where w;
                bool f2;
                json_t *have = rooms_graph_load(c, id, NULL, &w, &f2);
                json_decref(have);
                if (f2) rc = rooms_set_err(e, ROOMS_E_DB, "database");
                else if (w != ROOMS_GRAPH_STREAM)
                    rc = rooms_tx_append_pdu(&tx, sorted[i], id, via, NULL, ROOMS_PDU_HISTORICAL, e);
            }
            free(sorted);
            if (rc == ROOMS_OK)
                rc = rooms_tx_append_pdu(&tx, join, join_id, NULL, state_ids, ROOMS_PDU_NO_QUEUE, e);
            /* The join is the one forward extremity: what this server knew of the room
             * before (a rejoin) is behind it. */
            const char *q[2] = {room_id, join_id};
            if (rc == ROOMS_OK &&
                !db_exec(c, "DELETE FROM room_extremities WHERE room_id = $1 AND event_id <> $2",
                         2, q))
                rc = rooms_set_err(e, ROOMS_E_DB, "database");
            if (rc == ROOMS_OK) rc = rooms_tx_commit(&tx, e);
            else rooms_tx_rollback(&tx);
        }
    }
    json_decref(map);
    json_decref(state_ids);
    json_decref(in_state);
    return rc;
}

/* A membership change through other servers, its remote half: make_<kind> at the vias
 * in turn, the event completed and signed here, then send_<kind> (v2) to the server that
 * made it. No database connection is held on return, nor while either peer is asked. On
 * success the caller owns what remote_member holds (remote_member_clear); on failure the
 * request has been answered and *out says what to return. */
typedef struct remote_member {
    const room_version *v;
    const char *via;          /* the server that made the event */
    json_t *event;            /* our signed member event */
    char id[EVENT_ID_LEN];
    fed_call_result sent;     /* the send_<kind> answer */
} remote_member;

static void remote_member_clear(remote_member *m)
{
    json_decref(m->event);
    fed_call_result_clear(&m->sent);
}

static bool make_and_send(atrium_req *r, const char *kind, const char *user, const char *room_id,
                          const json_t *vias, int64_t max_body, remote_member *m, int *out)
{
    memset(m, 0, sizeof(*m));
    fed_call_result mk;
    char why[96];
    json_t *made = ask_make(r, kind, user, room_id, vias, &m->via, &mk);
    if (!made) {
        snprintf(why, sizeof(why), "No server could help %s the room",
                 strcmp(kind, "join") == 0 ? "joining" : "leaving");
        *out = crooms_remote_answer_failure(r, &mk, why);
        fed_call_result_clear(&mk);
        return false;
    }
    fed_call_result_clear(&mk);
    const char *ver_id = json_string_value(json_object_get(made, "room_version"));
    m->v = room_version_find(ver_id ? ver_id : "1");
    /* POST /join/{roomIdOrAlias} keeps the body's other keys, as for a local room. */
    json_t *extra = NULL;
    if (strcmp(kind, "join") == 0 && http_req_param(r, "roomIdOrAlias") && r->json) {
        extra = json_object();
        if (!extra || !crooms_join_extras(r, r->json, extra)) {
            json_decref(extra);
            json_decref(made);
            *out = extra ? ATRIUM_DONE : http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
            return false;
        }
    }
    PGconn *c = http_db_checkout(r); /* for the member event's profile only */
    if (!c) {
        json_decref(extra);
        json_decref(made);
        *out = ATRIUM_DONE;
        return false;
    }
    rooms_err e = {0};
    m->event = crooms_remote_complete_member(
        c, m->v, json_object_get(made, "event"), user, kind,
        json_string_value(json_object_get(r->json, "reason")), extra, m->id, &e);
    http_db_checkin(c);
    json_decref(extra);
    json_decref(made);
    if (!m->event) {
        remote_member_clear(m);
        *out = rooms_fail(r, &e);
        return false;
    }
    char room_enc[REMOTE_URI_BYTES / 4], id_enc[REMOTE_URI_BYTES / 4], step[16];
    if (!rt_uri_encode(room_id, room_enc, sizeof(room_enc)) ||
        !rt_uri_encode(m->id, id_enc, sizeof(id_enc))) {
        *out = http_respond_error(r, 400, "M_INVALID_PARAM",
                                  "The room ID is too long to send to another server");
        remote_member_clear(m);
        return false;
    }
    snprintf(step, sizeof(step), "send_%s", kind);
    crooms_remote_put_step(r, m->via, step, room_enc, id_enc, m->event, m->event, max_body,
                          &m->sent);
    if (!fed_call_ok(&m->sent)) {
        snprintf(why, sizeof(why), "The resident server refused the %s", kind);
        *out = crooms_remote_answer_failure(r, &m->sent, why);
        remote_member_clear(m);
        return false;
    }
    return true;
}

int crooms_remote_join(atrium_req *r, const char *user, const char *room_id, const json_t *vias)
{
    remote_member m;
    int out;
    if (!make_and_send(r, "join", user, room_id, vias, REMOTE_JOIN_MAX_BODY_BYTES, &m, &out))
        return out;
    const room_version *v = m.v;
    const char *via = m.via;
    json_t *join = m.event;
    const char *join_id = m.id;
    fed_call_result sj = m.sent;
    rooms_err e = {0};
    /* The resident may add its signature to the join (restricted rooms): keep its copy when
     * it is the same event. */
    json_t *theirs = json_object_get(sj.json, "event");
    char tid[EVENT_ID_LEN];
    if (json_is_object(theirs) && event_compute_id(v, theirs, tid) == 0 && strcmp(tid, join_id) == 0) {
        json_decref(join);
        join = json_incref(theirs);
    }
    /* The answer checked with no connection held (the signers' keys may be fetched), then
     * stored with one. */
    json_t *accepted = json_object();
    check_all(v, room_id, json_object_get(sj.json, "state"), json_object_get(sj.json, "auth_chain"),
              accepted);
    PGconn *c = http_db_checkout(r);
    int rc = c ? store_join(r, c, v, room_id, via, accepted, json_object_get(sj.json, "state"),
                            join, join_id, &e)
               : ROOMS_OK;
    http_db_checkin(c);
    json_decref(accepted);
    json_decref(join);
    fed_call_result_clear(&sj);
    if (!c) return ATRIUM_DONE; /* answered 503 by rooms_db */
    if (rc != ROOMS_OK) return rooms_fail(r, &e);
    rt_log(ATRIUM_LOG_INFO, "core", "%s joined %s through %s", user, room_id, via);
    return http_respond_json(r, 200, json_pack("{s:s}", "room_id", room_id));
}

/* Does query parameter name name a server to ask? server_name and via (join, knock), and
 * with msc4235 also org.matrix.msc4235.via (the hierarchy's, MSC4235). */
static bool via_arg(const char *name, bool msc4235)
{
    return strcmp(name, "server_name") == 0 || strcmp(name, "via") == 0 ||
           (msc4235 && strcmp(name, "org.matrix.msc4235.via") == 0);
}

bool crooms_vias_ok(atrium_req *r, bool msc4235)
{
    for (size_t i = 0; i < r->n_args; i++) {
        const char *name = r->args[i].name, *value = r->args[i].value;
        if (via_arg(name, msc4235) && value && *value && !rt_server_name_valid(value)) {
            http_respond_error(r, 400, "M_INVALID_PARAM",
                               "'%s' is not a server name: %.64s", name, value);
            return false;
        }
    }
    return true;
}

json_t *crooms_remote_vias(atrium_req *r, PGconn *c, const char *room_id, bool msc4235)
{
    json_t *vias = json_array();
    for (size_t i = 0; i < r->n_args; i++)
        if (via_arg(r->args[i].name, msc4235) && r->args[i].value && *r->args[i].value)
            json_array_append_new(vias, json_string(r->args[i].value));
    json_array_append_new(vias, json_string(room_auth_domain(room_id)));
    /* Invited from another server: the inviter's server is in the room. */
    const char *q[1] = {room_id};
    PGresult *inv = rooms_q(c,
                            "SELECT DISTINCT substr(sender, strpos(sender, ':') + 1)"
                            " FROM remote_invites WHERE room_id = $1 ORDER BY 1 LIMIT 8",
                            1, q, NULL);
    for (int i = 0; inv && i < PQntuples(inv); i++)
        json_array_append_new(vias, json_string(PQgetvalue(inv, i, 0)));
    PQclear(inv);
    /* A room known here (left, now rejoined): the servers that were in it. */
    const char *p[1] = {room_id};
    PGresult *res = rooms_q(c,
                            "SELECT DISTINCT substr(state_key, strpos(state_key, ':') + 1)"
                            " FROM current_state WHERE room_id = $1 AND type = 'm.room.member'"
                            " AND membership = 'join' ORDER BY 1 LIMIT 8",
                            1, p, NULL);
    for (int i = 0; res && i < PQntuples(res); i++)
        json_array_append_new(vias, json_string(PQgetvalue(res, i, 0)));
    PQclear(res);
    return vias;
}

/* ---- inviting a user of another server ------------------------------------------------ */

bool crooms_remote_invite_send(atrium_req *r, const char *sender, const char *room_id,
                              const char *target, json_t *content)
{
    PGconn *c = http_db_checkout(r);
    if (!c) return false;
    /* The invite, built and sealed under the room's lock, which is let go, with the
     * connection, while the invitee's server answers. */
    room_tx tx;
    rooms_err e = {0};
    json_t *pdu = NULL, *map = NULL;
    char id[EVENT_ID_LEN] = "";
    const room_version *v = NULL;
    int rc = rooms_tx_begin(&tx, c, r->arena, room_id, &e);
    if (rc == ROOMS_OK) {
        v = tx.ver;
        room_new_event ev = {.sender = sender, .type = "m.room.member", .state_key = target,
                             .content = content};
        rc = rooms_tx_template(&tx, &ev, &pdu, &e);
        if (rc == ROOMS_OK && rooms_pdus_current(c, room_id, &map, NULL) < 0)
            rc = rooms_set_err(&e, ROOMS_E_DB, "database");
        rooms_tx_rollback(&tx);
    }
    http_db_checkin(c);
    if (rc == ROOMS_OK) rc = rooms_event_seal(v, pdu, id, &e);
    if (rc != ROOMS_OK) {
        json_decref(pdu);
        json_decref(map);
        rooms_fail(r, &e);
        return false;
    }
    char room_enc[REMOTE_URI_BYTES / 4], id_enc[REMOTE_URI_BYTES / 4];
    if (!rt_uri_encode(room_id, room_enc, sizeof(room_enc)) ||
        !rt_uri_encode(id, id_enc, sizeof(id_enc))) {
        json_decref(pdu);
        json_decref(map);
        http_respond_error(r, 400, "M_INVALID_PARAM",
                           "The room ID is too long to send to another server");
        return false;
    }
    json_t *stripped = rooms_stripped_state(map, sender);
    json_t *body = json_pack("{s:O, s:s, s:O}", "event", pdu, "room_version", v->id,
                             "invite_room_state", stripped);
    /* The v1 form: the event itself, the stripped state in its unsigned. */
    json_t *v1_body = json_deep_copy(pdu);
    json_object_set_new(v1_body, "unsigned", json_pack("{s:o}", "invite_room_state", stripped));
    json_decref(map);
    const char *server = room_auth_domain(target);
    fed_call_result res;
    crooms_remote_put_step(r, server, "invite", room_enc, id_enc, body, v1_body,
                          REMOTE_MAKE_MAX_BODY_BYTES, &res);
    json_decref(body);
    json_decref(v1_body);
    json_t *signed_ev = fed_call_ok(&res) ? json_object_get(res.json, "event") : NULL;
    char sid[EVENT_ID_LEN], why[FED_CALL_ERROR_BYTES] = "";
    bool same = json_is_object(signed_ev) && event_compute_id(v, signed_ev, sid) == 0 &&
                strcmp(sid, id) == 0;
    json_t *red = same ? event_redact(v, signed_ev) : NULL;
    bool signed_ok = red && fed_call_verify(red, server, rooms_wall_ms(), NULL, why) == 0;
    json_decref(red);
    if (!signed_ok) {
        json_decref(pdu);
        if (fed_call_ok(&res))
            http_respond_error(r, 502, "M_UNKNOWN", "The invitee's server answered an invite it "
                               "did not sign: %s", why);
        else
            crooms_remote_answer_failure(r, &res, "The invitee's server refused the invite");
        fed_call_result_clear(&res);
        return false;
    }
    json_decref(pdu);
    pdu = json_incref(signed_ev);
    fed_call_result_clear(&res);
    /* Stored under the lock again, checked against the state as it is now. */
    if (!(c = http_db_checkout(r))) {
        json_decref(pdu);
        return false; /* answered 503 */
    }
    rc = rooms_tx_begin(&tx, c, r->arena, room_id, &e);
    json_t *ids = NULL;
    if (rc == ROOMS_OK) {
        char awhy[ROOM_AUTH_WHY_LEN];
        if (rooms_pdus_current(c, room_id, &map, &ids) < 0)
            rc = rooms_set_err(&e, ROOMS_E_DB, "database");
        else if (!room_auth_check_event(v, pdu, rooms_pdus_get, map, awhy))
            rc = rooms_set_err(&e, ROOMS_E_FORBIDDEN, "%s", awhy);
        if (rc == ROOMS_OK) rc = rooms_tx_append_pdu(&tx, pdu, id, NULL, ids, 0, &e);
        if (rc == ROOMS_OK) rc = rooms_tx_commit(&tx, &e);
        else rooms_tx_rollback(&tx);
    }
    json_decref(map);
    json_decref(ids);
    json_decref(pdu);
    http_db_checkin(c);
    if (rc != ROOMS_OK) {
        rooms_fail(r, &e);
        return false;
    }
    return true;
}

int crooms_remote_invite(atrium_req *r, const char *sender, const char *room_id,
                        const char *target, json_t *content)
{
    return crooms_remote_invite_send(r, sender, room_id, target, content)
               ? http_respond_json(r, 200, json_object())
               : ATRIUM_DONE;
}

/* ---- declining an invite to a room this server is not in ------------------------------ */

int crooms_remote_leave(atrium_req *r, const char *user, const char *room_id, const json_t *vias)
{
    remote_member m;
    int out;
    if (!make_and_send(r, "leave", user, room_id, vias, REMOTE_MAKE_MAX_BODY_BYTES, &m, &out))
        return out;
    const char *via = m.via;
    json_t *leave = m.event;
    const char *id = m.id;
    fed_call_result sl = m.sent;
    fed_call_result_clear(&sl);
    PGconn *c = http_db_checkout(r);
    if (!c) {
        json_decref(leave);
        return ATRIUM_DONE;
    }
    /* This server is not in the room: the leave is kept like the invite was, an outlier and
     * the user's newest membership. */
    const char *p[3] = {id, room_id, user};
    bool ok = db_begin(c) &&
              rooms_graph_store_outlier(c, room_id, id, leave, "outlier", NULL, via) == 0 &&
              db_exec(c,
                      "INSERT INTO memberships (stream_pos, room_id, user_id, membership,"
                      " event_id, sender) VALUES (stream_next(), $2, $3, 'leave', $1, $3)",
                      3, p) &&
              db_commit(c);
    if (!ok) db_rollback(c);
    http_db_checkin(c);
    json_decref(leave);
    if (!ok) return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    notifier_wake_user(user);
    return http_respond_json(r, 200, json_object());
}
