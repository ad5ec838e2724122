/*
 * core/federation/rooms/fed_rooms_backfill.c - history older than the stream, read from other
 * servers (fed_rooms_backfill, for a client's /messages that paged past what is stored:
 * a room joined over federation starts at the join).
 *
 * From the deepest backward extremity (fed_rooms_backward_extremities), /backfill at the
 * room's creating server, then at its other servers; each event of the answer checked as
 * a received PDU is (fed_rooms_recv.c, through fed_rooms_recv.h) up to its auth
 * events: format, room, ID, the signatures the version requires, the content hash (a
 * mismatch keeps it redacted), the auth rules against its auth events, fetched when
 * missing; an event of another room than the one asked (its room_id says so; an auth
 * event of another room fails the auth rules) is refused and stored nowhere. The state
 * before it is not computed: it never becomes current state. Those
 * that pass are stored below the stream (ROOMS_PDU_BACKFILLED: positions <= 0, each batch
 * below the last, so /messages pages into them and /sync never sees them), those refused
 * by the auth rules kept as rejected. An extremity that gave nothing new rests
 * RECV_BACKFILL_DEAD_END_MS (backfill_dead_ends), so one event that never passes costs a
 * request per while, not per page. The connection goes back to the pool while a peer is
 * waited for (fed_rooms_recv_ask, and fed_rooms_recv_verify while a signer's key is fetched), so a
 * slow server pins none. Backfills of one room may run at
 * once (two clients' pages, two processes) and read the same events: each is looked up
 * again under the room's lock before it is stored, so the later one finds it there and
 * stores nothing twice.
 *
 * Metrics: atrium_rooms_backfilled_events_total{outcome} (stored, refused, rejected).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rooms/rooms_tx.h"
#include "core/federation/transport/fed_call.h"
#include "core/federation/rooms/fed_rooms.h"
#include "core/federation/rooms/fed_rooms_recv.h"
#include "core/rooms/state_pdus.h"
#include "core/runtime/uri.h"

#define RECV_BACKFILL_FROM_MAX 5    /* backward extremities one backfill tries */
#define RECV_BACKFILL_SERVERS_MAX 3 /* servers asked in turn for one extremity */
#define RECV_BACKFILL_DEAD_END_MS (60 * 60 * 1000) /* an extremity that gave nothing rests */
#define RECV_URI_BYTES FED_ROOMS_RECV_URI_BYTES

static struct {
    rt_metric *stored, *refused, *rejected;
} bf_metrics;

static int by_depth_desc(const void *x, const void *y)
{
    return fed_rooms_recv_by_depth(y, x);
}

/* The servers to ask for room_id's history: the room's creating server first, then those
 * with a user joined now; ours never. A new array. */
static json_t *backfill_servers(PGconn *c, const char *room_id)
{
    const char *own = fed_state()->server_name;
    json_t *out = json_array();
    const char *creator = room_auth_domain(room_id);
    if (strcmp(creator, own) != 0) json_array_append_new(out, json_string(creator));
    const char *p[2] = {room_id, own};
    PGresult *res = rooms_q(c,
                            "SELECT DISTINCT substr(state_key, strpos(state_key, ':') + 1)"
                            " FROM current_state WHERE room_id = $1 AND type = 'm.room.member'"
                            " AND membership = 'join'"
                            " AND substr(state_key, strpos(state_key, ':') + 1) <> $2 LIMIT 8",
                            2, p, NULL);
    for (int i = 0; res && i < PQntuples(res); i++) {
        const char *s = PQgetvalue(res, i, 0);
        bool seen = false;
        for (size_t j = 0; j < json_array_size(out) && !seen; j++)
            seen = strcmp(json_string_value(json_array_get(out, j)), s) == 0;
        if (!seen) json_array_append_new(out, json_string(s));
    }
    PQclear(res);
    return out;
}

/* One event of a /backfill answer: checked and stored (at a position below the stream)
 * or kept as rejected. 1 stored, 0 not, -1 database. */
static int backfill_one(pdu_job *rx, const json_t *pdu_in)
{
    char why[EVENT_WHY_LEN] = "", id[EVENT_ID_LEN], sig[FED_CALL_ERROR_BYTES];
    const char *claimed = json_string_value(json_object_get(pdu_in, "room_id"));
    if (!json_is_object(pdu_in) || strcmp(claimed ?: "", rx->room_id) != 0 ||
        event_check_format(rx->v, pdu_in, why) != EVENT_FORMAT_OK ||
        event_compute_id(rx->v, pdu_in, id) < 0) {
        /* A server that answers for another room than the one asked (or with what is not
         * an event of this room's version) gets nothing stored, in either room. */
        rt_metric_add(bf_metrics.refused, 1);
        rt_log(ATRIUM_LOG_INFO, "federation", "an event backfilled into %s from %s refused: %s",
               rx->room_id, rx->origin,
               strcmp(claimed ?: "", rx->room_id) != 0 ? "its room_id is not the room asked for"
               : why[0]                                ? why
                                                       : "its event ID cannot be computed");
        return 0;
    }
    rooms_graph_where w;
    bool failed;
    json_t *have = rooms_graph_load(rx->c, id, NULL, &w, &failed);
    json_decref(have);
    if (failed) return -1;
    if (w == ROOMS_GRAPH_STREAM || w == ROOMS_GRAPH_REJECTED || w == ROOMS_GRAPH_SOFT_FAILED)
        return 0;
    int vrc = fed_rooms_recv_verify(rx, pdu_in, NULL, sig); /* the look-up above is made again
                                                        * under the room's lock below */
    if (!rx->c) return -1;
    if (vrc < 0) {
        rt_metric_add(bf_metrics.refused, 1);
        rt_log(ATRIUM_LOG_INFO, "federation", "backfilled %s from %s refused: %s", id, rx->origin, sig);
        return 0;
    }
    json_t *pdu = event_content_hash_ok(pdu_in) ? json_incref((json_t *)pdu_in)
                                                : event_redact(rx->v, pdu_in);
    json_t *auth = NULL;
    char awhy[ROOM_AUTH_WHY_LEN] = "its auth events are not known or were rejected";
    int rc;
    fed_rooms_recv_auth ar = fed_rooms_recv_auth_events(rx, pdu, 1, &auth);
    if (ar == FED_ROOMS_RECV_AUTH_UNAVAILABLE) { /* not decided: a later backfill may have it */
        rt_log(ATRIUM_LOG_INFO, "federation", "backfilled %s from %s skipped: an auth event "
               "of it could not be fetched now", id, rx->origin);
        rc = 0;
    } else if (ar != FED_ROOMS_RECV_AUTH_READY ||
               !fed_rooms_recv_auth_passes(rx->v, pdu, auth, awhy)) {
        rt_metric_add(bf_metrics.rejected, 1);
        rt_log(ATRIUM_LOG_INFO, "federation", "backfilled %s from %s rejected: %s", id, rx->origin, awhy);
        rc = fed_rooms_recv_store_rejected(rx, id, pdu, awhy) < 0 ? -1 : 0;
    } else {
        room_tx tx;
        rooms_err e = {0};
        rt_arena *a = rt_arena_new(1024);
        rc = a ? rooms_tx_begin(&tx, rx->c, a, rx->room_id, &e) : ROOMS_E_DB;
        int in = 0;
        if (rc == ROOMS_OK) {
            /* Asked again under the room's lock: another backfill of the room (another
             * client's page, another process) may have stored it since it was looked up
             * above, while this one waited for the peer or the signing keys. */
            const char *p[1] = {id};
            in = fed_rooms_event_pos(rx->c, rx->room_id, id, NULL);
            if (in < 0 || (in == 0 && !db_exec(rx->c, "DELETE FROM event_outliers"
                                                      " WHERE event_id = $1", 1, p)))
                rc = rooms_set_err(&e, ROOMS_E_DB, "database");
            else if (in == 0)
                rc = rooms_tx_append_pdu(&tx, pdu, id, rx->origin, NULL, ROOMS_PDU_BACKFILLED, &e);
            if (rc == ROOMS_OK && in == 0) rc = rooms_tx_commit(&tx, &e);
            else rooms_tx_rollback(&tx);
        }
        rt_arena_free(a);
        rc = rc != ROOMS_OK ? (rc == ROOMS_E_DB ? -1 : 0) : in == 0;
        if (rc == 1) rt_metric_add(bf_metrics.stored, 1);
    }
    json_decref(auth);
    json_decref(pdu);
    return rc;
}

/* One /backfill of room_id from the backward extremity `from` at the first server of
 * servers that answers (*answered false when none did); the events stored (checked by
 * backfill_one), or -1 database. */
static int backfill_from(pdu_job *rx, const json_t *servers, const char *from, int limit,
                         bool *answered)
{
    char room[RECV_URI_BYTES / 4], ev[RECV_URI_BYTES / 4], uri[RECV_URI_BYTES];
    *answered = false;
    if (!rt_uri_encode(rx->room_id, room, sizeof(room)) || !rt_uri_encode(from, ev, sizeof(ev))) {
        rt_log(ATRIUM_LOG_INFO, "federation", "no backfill of %s from %s: an ID is too long to "
               "send", rx->room_id, from);
        return 0;
    }
    snprintf(uri, sizeof(uri), "/_matrix/federation/v1/backfill/%s?limit=%d&v=%s", room, limit, ev);
    json_t *answer = NULL;
    for (size_t i = 0; i < json_array_size(servers) && i < RECV_BACKFILL_SERVERS_MAX && !answer; i++) {
        rx->origin = json_string_value(json_array_get(servers, i));
        answer = fed_rooms_recv_ask(rx, "GET", uri, NULL);
        if (answer && !json_is_array(json_object_get(answer, "pdus"))) {
            json_decref(answer);
            answer = NULL;
        }
    }
    *answered = answer != NULL;
    if (!answer) return 0;
    /* Newest first: each takes a position below the one before. */
    json_t *pdus = json_object_get(answer, "pdus");
    size_t k = json_array_size(pdus) < (size_t)limit ? json_array_size(pdus) : (size_t)limit;
    json_t **sorted = calloc(k ? k : 1, sizeof(*sorted));
    for (size_t i = 0; sorted && i < k; i++) sorted[i] = json_array_get(pdus, i);
    if (sorted) qsort(sorted, k, sizeof(*sorted), by_depth_desc);
    int stored = 0;
    for (size_t i = 0; sorted && i < k && stored >= 0; i++) {
        int one = backfill_one(rx, sorted[i]);
        stored = one < 0 ? -1 : stored + one;
    }
    free(sorted);
    json_decref(answer);
    rt_log(ATRIUM_LOG_INFO, "federation", "backfill of %s from %s at %s: %zu event(s) received, "
           "%d stored", rx->room_id, rx->origin, from, k, stored);
    if (stored == 0) { /* nothing new behind `from` at this server: rest it a while */
        char until[24];
        snprintf(until, sizeof(until), "%lld", (long long)(rt_wall_ms() + RECV_BACKFILL_DEAD_END_MS));
        const char *p[3] = {from, rx->room_id, until};
        if (!db_exec(rx->c, "INSERT INTO backfill_dead_ends (event_id, room_id, until_ts)"
                            " VALUES ($1, $2, $3::bigint) ON CONFLICT (event_id)"
                            " DO UPDATE SET until_ts = EXCLUDED.until_ts", 3, p))
            stored = -1;
    }
    return stored;
}

int fed_rooms_backfill(PGconn **cp, const char *room_id, int limit)
{
    if (limit > FED_ROOMS_BACKFILL_MAX) limit = FED_ROOMS_BACKFILL_MAX;
    bool failed = false;
    PGconn *c = *cp; /* only before the first request to a peer (fed_rooms_recv_ask) */
    pdu_job rx = {.c = c, .room_id = room_id, .v = rooms_version_of(c, room_id, &failed)};
    if (failed) return -1;
    if (!rx.v || limit <= 0) return 0;
    json_t *from = NULL;
    int n = fed_rooms_backward_extremities(c, room_id, RECV_BACKFILL_FROM_MAX, &from);
    if (n <= 0) {
        json_decref(from);
        return n;
    }
    /* The deepest extremity first; the next only when one gave nothing new (what its
     * server served did not pass), so one event that never passes does not stop the
     * history behind the others. No server answering ends it: the client's request is
     * waiting. */
    json_t *servers = backfill_servers(c, room_id);
    int stored = 0;
    bool answered = true;
    for (size_t i = 0; i < json_array_size(from) && stored == 0 && answered; i++)
        stored = backfill_from(&rx, servers, json_string_value(json_array_get(from, i)), limit,
                               &answered);
    json_decref(servers);
    json_decref(from);
    *cp = rx.c; /* borrowed again after each request to a peer; NULL when none was free */
    return rx.c ? stored : -1;
}

#define BACKFILL_HELP "Events read from other servers with /backfill, by outcome: stored, " \
                      "refused (format, ID, signatures) or rejected (auth rules)"

int fed_rooms_backfill_init(fed_module *m)
{
    bf_metrics.stored = rt_metric_counter(m->metrics, "atrium_rooms_backfilled_events_total",
                                          "outcome=\"stored\"", BACKFILL_HELP);
    bf_metrics.refused = rt_metric_counter(m->metrics, "atrium_rooms_backfilled_events_total",
                                           "outcome=\"refused\"", BACKFILL_HELP);
    bf_metrics.rejected = rt_metric_counter(m->metrics, "atrium_rooms_backfilled_events_total",
                                            "outcome=\"rejected\"", BACKFILL_HELP);
    return 0;
}
