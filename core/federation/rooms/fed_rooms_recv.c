/*
 * core/federation/rooms/fed_rooms_recv.c - the room model's handler of PDUs received in
 * transactions (fed_txn_set_pdu_handler): each PDU checked in the spec's order ("Checks
 * performed on receipt of a PDU") and then accepted into the room's stream, soft-failed
 * or rejected.
 *
 *   1. format and room version (event_check_format), for a room this server is in, from a
 *      server its ACL allows and that has a member in the room's state (any membership:
 *      a banned user's server sends what the auth rules then refuse), or a membership
 *      event of one of its own users; a PDU from a server with no part in the room is
 *      refused without being kept;
 *   2. the signatures the room version requires (fed_call_verify_event);
 *   3. the content hash: a mismatch goes on with the redacted event, stored redacted;
 *   4. the auth rules against the event's own auth events (first the spec's rule 2 on
 *      them: of this room, no pair twice, only those selection picks;
 *      fed_rooms_recv_auth_passes), every one of which must be known, of the event's own room
 *      and not rejected (missing ones are fetched with /event, checked the same way and
 *      kept as outliers: an outlier whose auth events sit in another room is rejected);
 *      one that cannot be fetched now (the origin does not answer) decides nothing: the
 *      PDU is not kept and is answered with an error, so the event can still be accepted
 *      when it comes again or is fetched later;
 *   5. missing prev_events: asked for with /get_missing_events, round after round back to
 *      the events known here (RECV_MISSING_LIMIT a round, RECV_GAP_MAX_EVENTS in all,
 *      within RECV_GAP_BUDGET_MS), and processed first, oldest first;
 *   6. the auth rules against the state before the event: the state after its one prev
 *      event, or the resolution (state_res.h) of the states after each of several. A prev
 *      event still missing is bridged with the state at it from the origin (/state_ids at
 *      that prev event, as Synapse asks, and the event itself with /event), a prev event
 *      rejected here with the state before it (state_after_prev);
 *   7. the auth rules against the room's current state: a refusal there is a soft
 *      failure (kept, not in the timeline, not current state).
 * A rejected event is kept as 'rejected' (so it is not fetched again) and never served;
 * a soft-failed one as 'soft_failed'. An accepted one is appended to the stream with the
 * state it was authorized against (rooms_tx_append_pdu), where /sync, /messages and
 * /members find it. Runs on the inbound pool's threads (fed_inbound.c): it may wait for
 * other servers, each request and key fetch with a deadline (fed_call.h), and never with
 * a database connection held: fed_rooms_recv_ask and fed_rooms_recv_verify give it back for the wait.
 *
 * When the room then has several forward extremities whose states differ, the current
 * state becomes their resolution (resolve_current): current_state and, for memberships, a
 * new row of memberships; the stream keeps its events in arrival order.
 *
 * History older than what the stream holds is read with /backfill: fed_rooms_backfill.c,
 * which shares this file's checks through fed_rooms_recv.h.
 *
 * Metrics: atrium_rooms_inbound_pdus_total{outcome, check}, state resolutions by outcome
 * and their duration.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rooms/rooms_tx.h"
#include "core/federation/transport/fed_call.h"
#include "core/federation/rooms/fed_rooms.h"
#include "core/federation/rooms/fed_rooms_recv.h"
#include "core/federation/transport/fed_txn.h"
#include "core/rooms/canonical_json.h"
#include "core/rooms/state_map.h"
#include "core/rooms/state_pdus.h"
#include "core/rooms/state_res.h"
#include "core/runtime/uri.h"

#define RECV_MISSING_LIMIT 10       /* events asked for with one get_missing_events */
#define RECV_GAP_MAX_EVENTS 500     /* events one gap walk collects at most */
#define RECV_GAP_MAX_ROUNDS 60      /* get_missing_events one gap walk makes at most */
#define RECV_MAX_NESTING 1          /* missing events' own gaps are not chased further */
/* Wall time one received PDU may spend filling its gap (the walk with get_missing_events
 * at most the first half of it, then processing what came, oldest first): a peer that
 * names thousands of missing events gets what fits, the rest bridged by /state_ids, and
 * the transaction answered within the handoff deadline (server.http.handoff_deadline_ms,
 * 60 s by default) instead of a 504 while the work goes on. A server back after a long
 * absence (100 events missed: test_room_federation_partition) fits in it. */
#define RECV_GAP_BUDGET_MS 30000
#define RECV_STATE_HOPS 3           /* rejected prev events looked through for a state */
#define RECV_FETCH_MAX 200          /* events one PDU may fetch with /event (auth, gap) */
#define RECV_REQUEST_TIMEOUT_MS 10000
#define RECV_URI_BYTES FED_ROOMS_RECV_URI_BYTES
#define RECV_MAX_BODY_BYTES (16 * 1024 * 1024)

enum recv_check {
    RC_FORMAT = 0, RC_ROOM, RC_ACL, RC_ORIGIN, RC_SIGNATURE, RC_AUTH_EVENTS, RC_PREV_EVENTS,
    RC_STATE_BEFORE, RC__N
};
static const char *const CHECK_NAMES[RC__N] = {"format", "room", "acl", "origin", "signature",
                                               "auth_events", "prev_events", "state_before"};

static struct {
    rt_metric *rejected[RC__N], *accepted, *soft_failed, *redacted;
    rt_metric *resolutions_ok, *resolutions_failed, *resolution_seconds;
} recv_metrics;

static int reject(pdu_job *rx, int check, char err[FED_PDU_ERR_LEN], const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int reject(pdu_job *rx, int check, char err[FED_PDU_ERR_LEN], const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, FED_PDU_ERR_LEN, fmt, ap);
    va_end(ap);
    rt_metric_add(recv_metrics.rejected[check], 1);
    rt_log(ATRIUM_LOG_INFO, "federation", "a PDU from %s for %s rejected (check %s): %s",
           rx->origin, rx->room_id ? rx->room_id : "?", CHECK_NAMES[check], err);
    return FED_PDU_REJECTED;
}

/* A rejection decided by the auth rules and kept (fed_rooms_recv_store_rejected): processed. */
static int kept_rejected(int rc) { return rc == FED_PDU_REJECTED ? FED_PDU_REJECTED_KEPT : rc; }

static int retry(char err[FED_PDU_ERR_LEN])
{
    snprintf(err, FED_PDU_ERR_LEN, "The database failed; retry");
    return FED_PDU_RETRY;
}

/* A request to the origin, waited for; the JSON answer (new) or NULL. rx->c goes back to
 * the pool for the wait (fed_call_hold: a slow peer must not pin a connection the whole
 * server needs) and is borrowed again after it; when none is free in time, rx->c stays
 * NULL and the answer is dropped: the caller's next query fails as a database error. */
json_t *fed_rooms_recv_ask(pdu_job *rx, const char *method, const char *uri, const json_t *body)
{
    if (!rx->c) return NULL;
    fed_request_opts o = {.method = method, .destination = rx->origin, .uri = uri, .body = body,
                          .deadline_ms = rt_now_ms() + RECV_REQUEST_TIMEOUT_MS,
                          .max_body_bytes = RECV_MAX_BODY_BYTES};
    fed_call_result res;
    fed_call(&o, &(fed_call_hold){.c = &rx->c}, &res);
    json_t *out = fed_call_ok(&res) ? json_incref(res.json) : NULL;
    if (!out)
        rt_log(ATRIUM_LOG_INFO, "federation", "%s %s at %s failed: %s (status %d)", method, uri,
               rx->origin, res.error, res.status);
    fed_call_result_clear(&res);
    if (!rx->c) {
        json_decref(out);
        out = NULL;
    }
    return out;
}

int fed_rooms_recv_verify(pdu_job *rx, const json_t *pdu, bool *given_back,
                    char why[FED_CALL_ERROR_BYTES])
{
    fed_call_hold hold = {.c = &rx->c};
    int rc = fed_call_verify_event(rx->v, pdu, &hold, why);
    if (given_back) *given_back = hold.given_back;
    return rc;
}

/* ---- one event outside the stream: an auth event or a state event fetched ------------ */

int fed_rooms_recv_store_rejected(pdu_job *rx, const char *id, const json_t *pdu, const char *why)
{
    return rooms_graph_store_outlier(rx->c, rx->room_id, id, pdu, "rejected", why, rx->origin);
}

/* Fetch event_id with /event, check it (format, signatures, hash, its auth events known
 * and accepted, the auth rules against them) and keep it as an outlier (READY) or as
 * rejected (REFUSED); an answer that is not the event asked for, or not signed by its
 * sender's server, is REFUSED and not kept; no answer, or its own auth events not to be
 * had now, is UNAVAILABLE and nothing is kept. */
static fed_rooms_recv_auth fetch_outlier(pdu_job *rx, const char *event_id, int depth);

fed_rooms_recv_auth fed_rooms_recv_auth_events(pdu_job *rx, const json_t *pdu, int depth, json_t **auth)
{
    *auth = NULL;
    json_t *refs = json_object_get(pdu, "auth_events"), *ids = json_array();
    const char *room_id = json_string_value(json_object_get(pdu, "room_id"));
    fed_rooms_recv_auth out = FED_ROOMS_RECV_AUTH_READY;
    for (size_t i = 0; i < json_array_size(refs) && out == FED_ROOMS_RECV_AUTH_READY; i++) {
        const char *aid = event_ref_id(json_array_get(refs, i));
        if (!aid) {
            out = FED_ROOMS_RECV_AUTH_REFUSED;
            break;
        }
        rooms_graph_where w;
        bool failed;
        char in_room[ROOMS_GRAPH_ID_BYTES] = "";
        json_t *have = rooms_graph_load(rx->c, aid, in_room, &w, &failed);
        json_decref(have);
        if (failed) out = FED_ROOMS_RECV_AUTH_UNAVAILABLE;
        else if (w == ROOMS_GRAPH_REJECTED) out = FED_ROOMS_RECV_AUTH_REFUSED;
        else if (w != ROOMS_GRAPH_ABSENT && strcmp(in_room, room_id ? room_id : "") != 0)
            out = FED_ROOMS_RECV_AUTH_REFUSED; /* an event of another room authorises nothing here */
        else if (w == ROOMS_GRAPH_ABSENT)
            out = depth > 0 ? fetch_outlier(rx, aid, depth - 1) : FED_ROOMS_RECV_AUTH_UNAVAILABLE;
        json_array_append_new(ids, json_string(aid));
    }
    if (out == FED_ROOMS_RECV_AUTH_READY && rooms_pdus_of_ids(rx->c, ids, auth) < 0) {
        json_decref(*auth);
        *auth = NULL;
        out = FED_ROOMS_RECV_AUTH_UNAVAILABLE;
    }
    json_decref(ids);
    return out;
}

bool fed_rooms_recv_auth_passes(const room_version *v, const json_t *pdu, const json_t *auth,
                          char *why)
{
    /* The map holds one PDU per (type, state_key) and no event that is not state: fewer
     * than pdu names means a pair twice (or an ID twice) or a non-state event. */
    size_t named = json_array_size(json_object_get(pdu, "auth_events")), n = json_object_size(auth);
    if (n != named || n > EVENT_MAX_AUTH_EVENTS) {
        snprintf(why, ROOM_AUTH_WHY_LEN, "Its auth events name a (type, state_key) twice, or "
                 "an event that is not a state event");
        return false;
    }
    const json_t *list[EVENT_MAX_AUTH_EVENTS];
    size_t i = 0;
    const char *k;
    json_t *ev;
    json_object_foreach((json_t *)auth, k, ev) list[i++] = ev;
    return room_auth_check_auth_events(v, pdu, list, n, why) &&
           room_auth_check_event(v, pdu, rooms_pdus_get, (void *)auth, why);
}

static fed_rooms_recv_auth fetch_outlier(pdu_job *rx, const char *event_id, int depth)
{
    if (rx->fetched >= RECV_FETCH_MAX) return FED_ROOMS_RECV_AUTH_UNAVAILABLE;
    rx->fetched++;
    char enc[RECV_URI_BYTES / 2], uri[RECV_URI_BYTES];
    if (!rt_uri_encode(event_id, enc, sizeof(enc))) {
        rt_log(ATRIUM_LOG_INFO, "federation", "event %s not fetched from %s: the ID is too long "
               "to send", event_id, rx->origin);
        return FED_ROOMS_RECV_AUTH_UNAVAILABLE;
    }
    snprintf(uri, sizeof(uri), "/_matrix/federation/v1/event/%s", enc);
    json_t *answer = fed_rooms_recv_ask(rx, "GET", uri, NULL);
    if (!answer) return FED_ROOMS_RECV_AUTH_UNAVAILABLE;
    json_t *pdu = json_array_get(json_object_get(answer, "pdus"), 0);
    char why[EVENT_WHY_LEN], id[EVENT_ID_LEN], sig[FED_CALL_ERROR_BYTES];
    bool ok = json_is_object(pdu) &&
              strcmp(json_string_value(json_object_get(pdu, "room_id")) ?: "", rx->room_id) == 0 &&
              event_check_format(rx->v, pdu, why) == EVENT_FORMAT_OK &&
              event_compute_id(rx->v, pdu, id) == 0 && strcmp(id, event_id) == 0 &&
              fed_rooms_recv_verify(rx, pdu, NULL, sig) == 0;
    if (!ok || !rx->c) { /* no connection back after a key fetch: decided later */
        json_decref(answer);
        return ok ? FED_ROOMS_RECV_AUTH_UNAVAILABLE : FED_ROOMS_RECV_AUTH_REFUSED;
    }
    json_t *ev = event_content_hash_ok(pdu) ? json_incref(pdu) : event_redact(rx->v, pdu);
    json_decref(answer);
    json_t *auth = NULL;
    char awhy[ROOM_AUTH_WHY_LEN] = "its auth events are not known";
    fed_rooms_recv_auth out = fed_rooms_recv_auth_events(rx, ev, depth, &auth);
    if (out == FED_ROOMS_RECV_AUTH_READY && !fed_rooms_recv_auth_passes(rx->v, ev, auth, awhy))
        out = FED_ROOMS_RECV_AUTH_REFUSED;
    int rc = 0;
    if (out == FED_ROOMS_RECV_AUTH_READY)
        rc = rooms_graph_store_outlier(rx->c, rx->room_id, id, ev, "outlier", NULL, rx->origin);
    else if (out == FED_ROOMS_RECV_AUTH_REFUSED)
        rc = fed_rooms_recv_store_rejected(rx, id, ev, awhy);
    json_decref(auth);
    json_decref(ev);
    if (rc != 0) return FED_ROOMS_RECV_AUTH_UNAVAILABLE;
    return out;
}

/* ---- the state before an event -------------------------------------------------------- */

/* The state after stored event id (the state before it, plus itself when it is a state
 * event that was accepted) as a PDU map (new); NULL when unknown or on failure. */
static json_t *state_after(pdu_job *rx, const char *id)
{
    json_t *ids = NULL;
    if (rooms_graph_state_before(rx->c, rx->room_id, id, &ids) != 1) return NULL;
    json_t *map = NULL;
    int rc = rooms_pdus_of_ids(rx->c, ids, &map);
    json_decref(ids);
    if (rc < 0) return NULL;
    rooms_graph_where w;
    bool failed;
    json_t *pdu = rooms_graph_load(rx->c, id, NULL, &w, &failed);
    if (pdu && w == ROOMS_GRAPH_STREAM) rooms_pdus_put(map, pdu);
    json_decref(pdu);
    return map;
}

/* A PDU map as a state_map (type, state key -> event ID); NULL on out-of-memory. */
static state_map *as_state_map(const room_version *v, const json_t *map)
{
    state_map *sm = state_map_new();
    const char *k;
    json_t *pdu;
    json_object_foreach((json_t *)map, k, pdu) {
        char id[EVENT_ID_LEN];
        const char *type = json_string_value(json_object_get(pdu, "type"));
        if (sm && event_compute_id(v, pdu, id) == 0 &&
            state_map_set(sm, type, event_state_key(pdu), id) < 0) {
            state_map_free(sm);
            return NULL;
        }
    }
    return sm;
}

static json_t *load_for_resolution(void *ctx, const char *event_id, bool *rejected)
{
    pdu_job *rx = ctx;
    rooms_graph_where w;
    bool failed;
    json_t *pdu = rooms_graph_load(rx->c, event_id, NULL, &w, &failed);
    *rejected = w == ROOMS_GRAPH_REJECTED;
    return pdu;
}

/* Resolve several states (PDU maps) into one PDU map (new), or NULL (logged). */
static json_t *resolve(pdu_job *rx, json_t *const *maps, size_t n)
{
    const state_map *states[STATE_RES_MAX_STATES];
    size_t k = 0;
    for (size_t i = 0; i < n && k < STATE_RES_MAX_STATES; i++)
        if ((states[k] = as_state_map(rx->v, maps[i]))) k++;
    state_res_request rq = {.version = rx->v, .room_id = rx->room_id, .states = states,
                            .n_states = k, .load = load_for_resolution, .load_ctx = rx};
    state_map *out = NULL;
    state_res_report rep;
    int rc = state_res_resolve(&rq, &out, &rep);
    for (size_t i = 0; i < k; i++) state_map_free((state_map *)states[i]);
    rt_metric_add(rc == STATE_RES_OK ? recv_metrics.resolutions_ok : recv_metrics.resolutions_failed, 1);
    rt_metric_observe(recv_metrics.resolution_seconds, (double)rep.elapsed_us / 1e6);
    if (rc != STATE_RES_OK) {
        rt_log(ATRIUM_LOG_INFO, "federation", "state resolution in %s failed (%s): %s",
               rx->room_id, state_res_outcome_name(rc), rep.why);
        return NULL;
    }
    json_t *ids = json_array();
    for (size_t i = 0; i < state_map_count(out); i++) {
        const char *eid;
        if (state_map_entry(out, i, NULL, NULL, &eid)) json_array_append_new(ids, json_string(eid));
    }
    state_map_free(out);
    json_t *map = NULL;
    if (rooms_pdus_of_ids(rx->c, ids, &map) < 0) map = NULL;
    json_decref(ids);
    return map;
}

/* The state before event_id from the origin: /state_ids at it, /event for the events not
 * known here (kept as outliers; one refused is left out of the state). Each must be an
 * event of this room. A PDU map (new) or NULL. */
static json_t *state_before_from_origin(pdu_job *rx, const char *event_id)
{
    char room[RECV_URI_BYTES / 4], ev[RECV_URI_BYTES / 4], uri[RECV_URI_BYTES];
    if (!rt_uri_encode(rx->room_id, room, sizeof(room)) ||
        !rt_uri_encode(event_id, ev, sizeof(ev))) {
        rt_log(ATRIUM_LOG_INFO, "federation", "state at %s in %s not asked of %s: an ID is too "
               "long to send", event_id, rx->room_id, rx->origin);
        return NULL;
    }
    snprintf(uri, sizeof(uri), "/_matrix/federation/v1/state_ids/%s?event_id=%s", room, ev);
    json_t *answer = fed_rooms_recv_ask(rx, "GET", uri, NULL);
    json_t *ids = json_object_get(answer, "pdu_ids");
    bool ok = json_is_array(ids);
    for (size_t i = 0; ok && i < json_array_size(ids); i++) {
        const char *id = json_string_value(json_array_get(ids, i));
        rooms_graph_where w;
        bool failed;
        char in_room[ROOMS_GRAPH_ID_BYTES] = "";
        json_t *have = id ? rooms_graph_load(rx->c, id, in_room, &w, &failed) : NULL;
        json_decref(have);
        if (!id || failed) ok = false;
        else if (w == ROOMS_GRAPH_ABSENT) ok = fetch_outlier(rx, id, 1) != FED_ROOMS_RECV_AUTH_UNAVAILABLE;
        else ok = strcmp(in_room, rx->room_id) == 0; /* another room's event: a lie */
    }
    json_t *map = NULL;
    if (ok && rooms_pdus_of_ids(rx->c, ids, &map) < 0) map = NULL;
    json_decref(answer);
    return map;
}

static json_t *state_before(pdu_job *rx, const json_t *pdu, int hops, bool *bridged);

/* The state after prev event id of an event being received, a PDU map (new) or NULL: as
 * stored for an event of the stream; for one kept here as rejected (it changes nothing)
 * or soft-failed (its own state event counts), the state before it from its own prev
 * events while hops last; otherwise (a gap get_missing_events did not fill) the state
 * before it from the origin (/state_ids at that missing event, not at the event being
 * received, which the origin may not answer for) plus the event itself when it is a
 * state event not rejected here (fetched with /event when unknown); *bridged is then set. */
static json_t *state_after_prev(pdu_job *rx, const char *id, int hops, bool *bridged)
{
    int in = id ? fed_rooms_event_pos(rx->c, rx->room_id, id, NULL) : -1;
    if (in != 0) return in > 0 ? state_after(rx, id) : NULL;
    rooms_graph_where w;
    bool failed;
    char in_room[ROOMS_GRAPH_ID_BYTES] = "";
    json_t *prev = rooms_graph_load(rx->c, id, in_room, &w, &failed), *map = NULL;
    if (failed || (prev && strcmp(in_room, rx->room_id) != 0)) goto out; /* another room's */
    if (prev && hops > 0 && (w == ROOMS_GRAPH_REJECTED || w == ROOMS_GRAPH_SOFT_FAILED)) {
        map = state_before(rx, prev, hops - 1, bridged);
        if (map && w == ROOMS_GRAPH_SOFT_FAILED && event_state_key(prev)) rooms_pdus_put(map, prev);
        goto out;
    }
    *bridged = true;
    if (!(map = state_before_from_origin(rx, id))) goto out;
    if (!prev && fetch_outlier(rx, id, 1) != FED_ROOMS_RECV_AUTH_UNAVAILABLE)
        prev = rooms_graph_load(rx->c, id, NULL, &w, &failed);
    if (!prev) { /* not to be had: whether it changed the state is unknown */
        json_decref(map);
        map = NULL;
    } else if (w != ROOMS_GRAPH_REJECTED && event_state_key(prev)) {
        rooms_pdus_put(map, prev);
    }
out:
    json_decref(prev);
    return map;
}

/* The state before pdu: the states after its prev events (state_after_prev), resolved
 * together (state_res.h) when they differ: forks meet here. A PDU map (new) or NULL. */
static json_t *state_before(pdu_job *rx, const json_t *pdu, int hops, bool *bridged)
{
    json_t *refs = json_object_get(pdu, "prev_events");
    size_t n = json_array_size(refs);
    if (n == 0 || n > EVENT_MAX_PREV_EVENTS) return NULL;
    json_t *maps[EVENT_MAX_PREV_EVENTS];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *m = state_after_prev(rx, event_ref_id(json_array_get(refs, i)), hops, bridged);
        if (!m) {
            for (size_t j = 0; j < k; j++) json_decref(maps[j]);
            return NULL;
        }
        maps[k++] = m;
    }
    bool same = true;
    for (size_t i = 1; i < k && same; i++) same = json_equal(maps[0], maps[i]);
    json_t *out = same ? json_incref(maps[0]) : resolve(rx, maps, k);
    for (size_t i = 0; i < k; i++) json_decref(maps[i]);
    return out;
}

/* ---- missing prev events -------------------------------------------------------------- */

static int receive(pdu_job *rx, const json_t *pdu_in, char err[FED_PDU_ERR_LEN]);

/* The prev events of pdu not in the stream, as a new array of IDs. */
static json_t *missing_prevs(pdu_job *rx, const json_t *pdu)
{
    json_t *refs = json_object_get(pdu, "prev_events"), *out = json_array();
    for (size_t i = 0; i < json_array_size(refs); i++) {
        const char *id = event_ref_id(json_array_get(refs, i));
        if (id && fed_rooms_event_pos(rx->c, rx->room_id, id, NULL) <= 0)
            json_array_append_new(out, json_string(id));
    }
    return out;
}

/* Is id known in the room's stream, or among the events a gap walk collected? */
static bool gap_known(pdu_job *rx, const json_t *collected, const char *id)
{
    return json_object_get(collected, id) || fed_rooms_event_pos(rx->c, rx->room_id, id, NULL) > 0;
}

int fed_rooms_recv_by_depth(const void *x, const void *y)
{
    json_int_t a = json_integer_value(json_object_get(*(json_t *const *)x, "depth")),
               b = json_integer_value(json_object_get(*(json_t *const *)y, "depth"));
    return a < b ? -1 : a > b;
}

/* One /get_missing_events: what lies between our forward extremities (earliest) and the
 * frontier (latest); the answer's events (new array) or NULL. */
static json_t *ask_missing(pdu_job *rx, json_t *earliest, json_t *frontier, json_int_t min_depth)
{
    json_t *body = json_pack("{s:O, s:O, s:i, s:I}", "earliest_events", earliest,
                             "latest_events", frontier, "limit", RECV_MISSING_LIMIT,
                             "min_depth", min_depth);
    char room[RECV_URI_BYTES / 2], uri[RECV_URI_BYTES];
    if (!rt_uri_encode(rx->room_id, room, sizeof(room))) {
        rt_log(ATRIUM_LOG_INFO, "federation", "missing events of %s not asked of %s: the room "
               "ID is too long to send", rx->room_id, rx->origin);
        json_decref(body);
        return NULL;
    }
    snprintf(uri, sizeof(uri), "/_matrix/federation/v1/get_missing_events/%s", room);
    json_t *answer = fed_rooms_recv_ask(rx, "POST", uri, body);
    json_decref(body);
    json_t *events = json_incref(json_object_get(answer, "events"));
    json_decref(answer);
    if (events && !json_is_array(events)) {
        json_decref(events);
        return NULL;
    }
    return events;
}

/* Has rx used its time for gaps (RECV_GAP_BUDGET_MS), or, when walking, the half of it
 * that the walk may take? */
static bool gap_over(const pdu_job *rx, bool walking)
{
    int64_t left = walking ? RECV_GAP_BUDGET_MS / 2 : 0;
    return rx->gap_deadline_ms > 0 && rt_now_ms() >= rx->gap_deadline_ms - left;
}

/* Ask the origin for what lies between our forward extremities and the event, round
 * after round (each /get_missing_events walks back from the oldest events the last one
 * gave whose prev events are still unknown), until the gap closes, a round brings
 * nothing new, or RECV_GAP_MAX_EVENTS are collected; then process them oldest first, so
 * each finds its prev events in the stream (a server back after a long absence gets the
 * newest event from catch-up and everything before it this way). What the bound leaves
 * open is bridged by the state from the origin (receive, step 6). */
static void fill_gap(pdu_job *rx, const char *event_id)
{
    rooms_graph_tips tips;
    if (rooms_graph_tips_load(rx->c, rx->room_id, &tips) < 0) return;
    json_t *earliest = json_array(), *frontier = json_array(), *collected = json_object();
    for (int i = 0; i < tips.n; i++) json_array_append_new(earliest, json_string(tips.ids[i]));
    json_array_append_new(frontier, json_string(event_id));
    json_int_t min_depth = tips.max_depth > RECV_GAP_MAX_EVENTS ? tips.max_depth - RECV_GAP_MAX_EVENTS : 0;
    for (int round = 0; round < RECV_GAP_MAX_ROUNDS && json_array_size(frontier) > 0 &&
                        json_object_size(collected) < RECV_GAP_MAX_EVENTS && !gap_over(rx, true);
         round++) {
        json_t *events = ask_missing(rx, earliest, frontier, min_depth);
        json_array_clear(frontier);
        size_t fresh = 0;
        for (size_t i = 0; i < json_array_size(events); i++) {
            json_t *ev = json_array_get(events, i);
            char id[EVENT_ID_LEN];
            if (!json_is_object(ev) || event_compute_id(rx->v, ev, id) < 0 ||
                gap_known(rx, collected, id) || json_object_size(collected) >= RECV_GAP_MAX_EVENTS)
                continue;
            json_object_set(collected, id, ev);
            fresh++;
        }
        /* The next round starts from the collected events whose prev events are unknown. */
        for (size_t i = 0; fresh && i < json_array_size(events); i++) {
            json_t *ev = json_array_get(events, i), *refs = json_object_get(ev, "prev_events");
            char id[EVENT_ID_LEN];
            if (!json_is_object(ev) || event_compute_id(rx->v, ev, id) < 0) continue;
            bool open = false;
            for (size_t j = 0; j < json_array_size(refs) && !open; j++) {
                const char *prev = event_ref_id(json_array_get(refs, j));
                open = prev && !gap_known(rx, collected, prev);
            }
            if (open) json_array_append_new(frontier, json_string(id));
        }
        json_decref(events);
        if (!fresh) break;
    }
    size_t n = json_object_size(collected);
    json_t **sorted = calloc(n ? n : 1, sizeof(*sorted));
    size_t k = 0;
    const char *key;
    json_t *ev;
    json_object_foreach(collected, key, ev) if (sorted) sorted[k++] = ev;
    if (sorted) qsort(sorted, k, sizeof(*sorted), fed_rooms_recv_by_depth);
    pdu_job inner = *rx;
    inner.nesting++;
    size_t i = 0;
    for (; sorted && i < k && !gap_over(rx, false); i++) {
        char e2[FED_PDU_ERR_LEN];
        (void)receive(&inner, sorted[i], e2);
    }
    if (i < k)
        rt_log(ATRIUM_LOG_INFO, "federation", "gap before %s in %s from %s: %zu of %zu missing "
               "events processed within %d ms; the state from the origin bridges the rest",
               event_id, rx->room_id, rx->origin, i, k, RECV_GAP_BUDGET_MS);
    rx->fetched = inner.fetched;
    rx->c = inner.c; /* the events' own waits may have given it back and borrowed another */
    free(sorted);
    json_decref(collected);
    json_decref(frontier);
    json_decref(earliest);
}

/* ---- one PDU -------------------------------------------------------------------------- */

/* How a step of receiving one PDU tells its caller to go on; any other return is the enum
 * fed_pdu_outcome to return as it is (the rule: core/http/http.h, "outcomes"). */
enum pdu_step { PDU_GO = 200 };

/* The checks before the graph: format, room, ACL, origin in the room. PDU_GO, else the
 * outcome. */
static int precheck(pdu_job *rx, const json_t *pdu, char err[FED_PDU_ERR_LEN])
{
    const char *room_id = json_string_value(json_object_get(pdu, "room_id"));
    rx->room_id = room_id;
    if (!room_id) return reject(rx, RC_FORMAT, err, "The PDU has no room_id");
    bool failed = false;
    rx->v = rooms_version_of(rx->c, room_id, &failed);
    if (failed) return retry(err);
    if (!rx->v) return reject(rx, RC_ROOM, err, "This server is not in the room");
    char why[EVENT_WHY_LEN];
    if (event_check_format(rx->v, pdu, why) != EVENT_FORMAT_OK)
        return reject(rx, RC_FORMAT, err, "%s", why);
    const char *own = fed_state()->server_name;
    int in = fed_rooms_server_joined(rx->c, room_id, own);
    int acl = in == 1 ? fed_rooms_acl_allows(rx->c, room_id, rx->origin) : 1;
    int origin_in = in == 1 && acl == 1 ? fed_rooms_server_involved(rx->c, room_id, rx->origin) : 1;
    if (in < 0 || acl < 0 || origin_in < 0) return retry(err);
    if (!in) return reject(rx, RC_ROOM, err, "This server is not in the room");
    if (!acl) return reject(rx, RC_ACL, err, "Server ACLs of the room deny %s", rx->origin);
    const char *type = json_string_value(json_object_get(pdu, "type"));
    const char *sk = event_state_key(pdu);
    bool own_member = type && strcmp(type, "m.room.member") == 0 && sk &&
                      strcmp(room_auth_domain(sk), rx->origin) == 0;
    if (!origin_in && !own_member)
        return reject(rx, RC_ORIGIN, err, "%s is not in the room", rx->origin);
    return PDU_GO;
}

/* Make (type, state_key) of the current state the stored event pdu (id): the row of
 * current_state and, for a membership, a row of memberships at a new position so /sync
 * sees the change. Inside the room's transaction. 0 or -1. */
static int set_current(pdu_job *rx, const json_t *pdu, const char *id)
{
    const char *type = json_string_value(json_object_get(pdu, "type")), *sk = event_state_key(pdu);
    bool member = type && strcmp(type, "m.room.member") == 0;
    const char *membership = member ? event_content_str(pdu, "membership") : NULL;
    const char *p[5] = {rx->room_id, type, sk, id, membership};
    if (!db_exec(rx->c,
                 "INSERT INTO current_state (room_id, type, state_key, event_id, membership)"
                 " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (room_id, type, state_key)"
                 " DO UPDATE SET event_id = EXCLUDED.event_id, membership = EXCLUDED.membership",
                 5, p))
        return -1;
    if (!membership) return 0;
    const char *q[5] = {rx->room_id, sk, membership, id,
                        json_string_value(json_object_get(pdu, "sender"))};
    return db_exec(rx->c,
                   "INSERT INTO memberships (stream_pos, room_id, user_id, membership, event_id,"
                   " sender) VALUES (stream_next(), $1, $2, $3, $4, $5)",
                   5, q)
               ? 0
               : -1;
}

/* Where forks meet in the room's current state: with several forward extremities whose
 * states differ, the current state becomes their resolution (state_res.h), key by key.
 * After an event whose state was bridged from the origin (a gap: state_after_prev), the
 * current state as it was joins the resolution too, even with one extremity: what the
 * origin said competes with what this server knew, by the rules of state resolution,
 * instead of being taken or ignored. Inside the room's transaction, after an accepted
 * event joined the stream. A resolution that cannot run keeps the state as the stream
 * left it (logged). 0 or -1 (database). */
static int resolve_current(pdu_job *rx, bool bridged)
{
    rooms_graph_tips tips;
    if (rooms_graph_tips_load(rx->c, rx->room_id, &tips) < 0) return -1;
    if (tips.n < 2 && !bridged) return 0;
    json_t *current = NULL;
    if (rooms_pdus_current(rx->c, rx->room_id, &current, NULL) < 0) return -1;
    json_t *maps[ROOMS_GRAPH_MAX_PREV_EVENTS + 1];
    int k = 0;
    for (int i = 0; i < tips.n; i++)
        if ((maps[k] = state_after(rx, tips.ids[i]))) k++;
    if (bridged) maps[k++] = json_incref(current);
    bool same = true;
    for (int i = 1; i < k && same; i++) same = json_equal(maps[0], maps[i]);
    json_t *resolved = k >= 2 && !same ? resolve(rx, maps, (size_t)k) : NULL;
    for (int i = 0; i < k; i++) json_decref(maps[i]);
    if (!resolved) {
        json_decref(current);
        return 0;
    }
    int rc = 0;
    int changed = 0;
    const char *key;
    json_t *pdu;
    json_object_foreach(resolved, key, pdu) {
        if (rc < 0) break;
        char id[EVENT_ID_LEN], cur_id[EVENT_ID_LEN];
        const json_t *cur = json_object_get(current, key);
        if (event_compute_id(rx->v, pdu, id) < 0) continue;
        if (cur && event_compute_id(rx->v, cur, cur_id) == 0 && strcmp(id, cur_id) == 0) continue;
        rc = set_current(rx, pdu, id);
        changed++;
    }
    if (rc == 0 && changed)
        rt_log(ATRIUM_LOG_INFO, "federation", "state resolution of %d forward extremities of %s "
               "changed %d key(s) of the current state", tips.n, rx->room_id, changed);
    json_decref(current);
    json_decref(resolved);
    return rc;
}

static int accept_pdu(pdu_job *rx, json_t *pdu, const char *id, const json_t *state_ids,
                      bool bridged, char err[FED_PDU_ERR_LEN])
{
    room_tx tx;
    rooms_err e = {0};
    rt_arena *a = rt_arena_new(1024);
    if (!a) return retry(err);
    int rc = rooms_tx_begin(&tx, rx->c, a, rx->room_id, &e);
    if (rc == ROOMS_OK) {
        int in = fed_rooms_event_pos(rx->c, rx->room_id, id, NULL);
        const char *p[1] = {id};
        if (in < 0 || !db_exec(rx->c, "DELETE FROM event_outliers WHERE event_id = $1", 1, p))
            rc = rooms_set_err(&e, ROOMS_E_DB, "database");
        else if (in == 0)
            rc = rooms_tx_append_pdu(&tx, pdu, id, rx->origin, state_ids, 0, &e);
        if (rc == ROOMS_OK && in == 0 && resolve_current(rx, bridged) < 0)
            rc = rooms_set_err(&e, ROOMS_E_DB, "database");
        if (rc == ROOMS_OK) rc = rooms_tx_commit(&tx, &e);
        else rooms_tx_rollback(&tx);
    }
    rt_arena_free(a);
    if (rc == ROOMS_E_DB) return retry(err);
    if (rc != ROOMS_OK) return reject(rx, RC_FORMAT, err, "%s", e.why);
    rt_metric_add(recv_metrics.accepted, 1);
    return FED_PDU_ACCEPTED;
}

/* Steps 1 and the look-up before the signatures: precheck, the event's ID (into id), and
 * what is known of it already. PDU_GO, else the outcome. An event already in the stream
 * goes on too: when "go on" and FED_PDU_ACCEPTED were both 0 its ACCEPTED read as "go
 * on", and receiving it again is what the server has always done. */
static int admit(pdu_job *rx, const json_t *pdu_in, char id[EVENT_ID_LEN],
                 char err[FED_PDU_ERR_LEN])
{
    int rc = precheck(rx, pdu_in, err);
    if (rc != PDU_GO) return rc;
    if (event_compute_id(rx->v, pdu_in, id) < 0)
        return reject(rx, RC_FORMAT, err, "The event ID cannot be computed");
    rooms_graph_where w;
    bool failed;
    json_t *have = rooms_graph_load(rx->c, id, NULL, &w, &failed);
    json_decref(have);
    if (failed) return retry(err);
    if (w == ROOMS_GRAPH_STREAM) return PDU_GO; /* seen before: received again (above) */
    if (w == ROOMS_GRAPH_SOFT_FAILED) return FED_PDU_SOFT_FAILED;
    if (w == ROOMS_GRAPH_REJECTED)
        return kept_rejected(reject(rx, RC_AUTH_EVENTS, err, "Rejected before"));
    return PDU_GO;
}

static int receive(pdu_job *rx, const json_t *pdu_in, char err[FED_PDU_ERR_LEN])
{
    char id[EVENT_ID_LEN];
    int rc = admit(rx, pdu_in, id, err);
    if (rc != PDU_GO) return rc;
    /* 2. The signatures. A key to fetch is waited for with rx->c back in the pool; what
     * admit read under it (the room, its ACL, whether the event is known) is read again
     * after such a wait. */
    char sig[FED_CALL_ERROR_BYTES];
    bool given_back = false;
    rc = fed_rooms_recv_verify(rx, pdu_in, &given_back, sig);
    if (!rx->c) return retry(err);
    if (rc < 0) return reject(rx, RC_SIGNATURE, err, "%s", sig);
    if (given_back && (rc = admit(rx, pdu_in, id, err)) != PDU_GO) return rc;
    json_t *pdu = event_content_hash_ok(pdu_in) ? json_incref((json_t *)pdu_in)
                                                : event_redact(rx->v, pdu_in);
    if (!event_content_hash_ok(pdu_in)) {
        rt_metric_add(recv_metrics.redacted, 1);
        rt_log(ATRIUM_LOG_INFO, "federation", "%s from %s: content hash mismatch, kept redacted",
               id, rx->origin);
    }
    /* 4. its auth events */
    json_t *auth = NULL, *before = NULL, *current = NULL, *state_ids = NULL;
    bool bridged = false; /* the state before it came from the origin (a gap) */
    char why[ROOM_AUTH_WHY_LEN] = "its auth events are not known or were rejected";
    fed_rooms_recv_auth ar = fed_rooms_recv_auth_events(rx, pdu, 1, &auth);
    if (ar == FED_ROOMS_RECV_AUTH_UNAVAILABLE) {
        /* Nothing decided: kept as rejected, it could never be accepted later, when the
         * origin (a server just back from an outage, say) answers. */
        rt_log(ATRIUM_LOG_INFO, "federation", "%s from %s not processed: an auth event of "
               "it could not be fetched now", id, rx->origin);
        snprintf(err, FED_PDU_ERR_LEN, "An auth event of it could not be fetched; not kept");
        rc = FED_PDU_RETRY;
        goto out;
    }
    if (ar != FED_ROOMS_RECV_AUTH_READY || !fed_rooms_recv_auth_passes(rx->v, pdu, auth, why)) {
        if (fed_rooms_recv_store_rejected(rx, id, pdu, why) < 0) rc = retry(err);
        else rc = kept_rejected(reject(rx, RC_AUTH_EVENTS, err, "%s", why));
        goto out;
    }
    /* 5. prev events */
    json_t *missing = missing_prevs(rx, pdu);
    if (json_array_size(missing) > 0 && rx->nesting < RECV_MAX_NESTING) {
        fill_gap(rx, id);
        json_decref(missing);
        missing = missing_prevs(rx, pdu);
    }
    /* 6. the state before it */
    json_decref(missing);
    before = state_before(rx, pdu, RECV_STATE_HOPS, &bridged);
    if (!before) {
        rc = reject(rx, RC_PREV_EVENTS, err, "The state before the event cannot be known");
        goto out;
    }
    if (!room_auth_check_event(rx->v, pdu, rooms_pdus_get, before, why)) {
        if (fed_rooms_recv_store_rejected(rx, id, pdu, why) < 0) rc = retry(err);
        else rc = kept_rejected(reject(rx, RC_STATE_BEFORE, err, "%s", why));
        goto out;
    }
    /* 7. the current state: soft failure */
    if (rooms_pdus_current(rx->c, rx->room_id, &current, NULL) < 0) {
        rc = retry(err);
        goto out;
    }
    if (!room_auth_check_event(rx->v, pdu, rooms_pdus_get, current, why)) {
        rc = rooms_graph_store_outlier(rx->c, rx->room_id, id, pdu, "soft_failed", why, rx->origin) < 0
                 ? retry(err)
                 : FED_PDU_SOFT_FAILED;
        if (rc == FED_PDU_SOFT_FAILED) {
            rt_metric_add(recv_metrics.soft_failed, 1);
            rt_log(ATRIUM_LOG_INFO, "federation", "%s from %s soft-failed: %s", id, rx->origin, why);
        }
        goto out;
    }
    state_ids = rooms_pdus_ids(rx->v, before);
    rc = accept_pdu(rx, pdu, id, state_ids, bridged, err);
out:
    json_decref(auth);
    json_decref(before);
    json_decref(current);
    json_decref(state_ids);
    json_decref(pdu);
    return rc;
}

static int on_pdu(void *ctx, const char *origin, const json_t *pdu, char err[FED_PDU_ERR_LEN])
{
    (void)ctx;
    PGconn *c = db_acquire(db_global(), DB_WAIT_CONFIGURED);
    if (!c) return retry(err);
    /* A room we are not in: only the end of a user's knock or invite is taken. */
    int out = fed_rooms_outsider_pdu(&c, origin, pdu, err);
    if (out != FED_ROOMS_NOT_OUTSIDER) {
        if (c) db_release(db_global(), c); /* maybe another connection (a key fetched) */
        return out;
    }
    pdu_job rx = {.origin = origin, .c = c, .gap_deadline_ms = rt_now_ms() + RECV_GAP_BUDGET_MS};
    int rc = receive(&rx, pdu, err);
    if (!rx.c) return retry(err); /* not borrowed again after a request to a peer */
    db_release(db_global(), rx.c); /* maybe another connection than c (fed_rooms_recv_ask) */
    return rc;
}

#define PDUS_HELP "PDUs received, by outcome and, for rejections, the check that failed"

int fed_rooms_recv_init(fed_module *m)
{
    static const double buckets[] = {0.001, 0.005, 0.02, 0.1, 0.5, 2, 10};
    for (int i = 0; i < RC__N; i++) {
        char labels[96];
        snprintf(labels, sizeof(labels), "outcome=\"rejected\",check=\"%s\"", CHECK_NAMES[i]);
        recv_metrics.rejected[i] = rt_metric_counter(m->metrics, "atrium_rooms_inbound_pdus_total",
                                                     labels, PDUS_HELP);
    }
    recv_metrics.accepted = rt_metric_counter(m->metrics, "atrium_rooms_inbound_pdus_total",
                                              "outcome=\"accepted\",check=\"\"", PDUS_HELP);
    recv_metrics.soft_failed = rt_metric_counter(m->metrics, "atrium_rooms_inbound_pdus_total",
                                                 "outcome=\"soft_failed\",check=\"\"", PDUS_HELP);
    recv_metrics.redacted = rt_metric_counter(m->metrics, "atrium_rooms_inbound_pdus_redacted_total",
                                              NULL, "PDUs whose content hash did not match, "
                                              "kept redacted");
    recv_metrics.resolutions_ok = rt_metric_counter(m->metrics, "atrium_rooms_state_resolutions_total",
                                                    "outcome=\"ok\"", "State resolutions run");
    recv_metrics.resolutions_failed = rt_metric_counter(m->metrics,
                                                        "atrium_rooms_state_resolutions_total",
                                                        "outcome=\"failed\"", "State resolutions run");
    recv_metrics.resolution_seconds =
        rt_metric_histogram(m->metrics, "atrium_rooms_state_resolution_seconds", NULL,
                            "Time state resolutions took", buckets, sizeof(buckets) / sizeof(buckets[0]));
    fed_txn_set_pdu_handler(on_pdu, NULL);
    return fed_rooms_backfill_init(m);
}
