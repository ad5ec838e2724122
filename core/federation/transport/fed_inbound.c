/*
 * core/federation/transport/fed_inbound.c - the inbound half of fed_txn.h: PUT
 * /_matrix/federation/v1/send/{txnId}, the registry of PDU and EDU handlers, and the
 * record of answered transactions that makes a replay harmless.
 *
 * On the request thread only what is quick: the X-Matrix check has run (r->origin), the
 * body's shape and limits are checked (more than FED_TXN_MAX_PDUS PDUs or FED_TXN_MAX_EDUS
 * EDUs: 400 M_BAD_JSON; Synapse answers those with a bare 400, the spec names no code), its
 * `origin` must be the server that signed the request (403), and the request is handed to
 * the inbound pool ("core.federation_inbound", FED_INBOUND_POOL_THREADS threads and a
 * queue of FED_INBOUND_POOL_QUEUE: past it, 429, which a sender retries), where it runs
 * again and may wait on the database and on the handlers, who may in turn ask other
 * servers (get_missing_events) with deadlines. No request thread waits for any of that.
 *
 * On the pool: a transaction already answered (federation_inbound_txns) gets the stored
 * answer, processed no second time; one of the same origin and ID still running gets 429.
 * Otherwise each PDU goes, in order, to the room model's handler and each EDU to its
 * type's handler (unknown types are ignored, as the spec says), then the answer
 * {"pdus": {event_id: {} | {"error": why}}} is stored and sent: {} for a PDU processed
 * (accepted, soft-failed, or rejected by the auth rules and kept so, as Synapse answers),
 * an error for one refused before any verdict on it (format, signature, origin) or not
 * processed now (the database, an auth event that could not be fetched). A PDU's key is its event
 * ID, computed for the room's version when this server knows the room, else the PDU's own
 * event_id (room versions 1 and 2); a PDU with neither (a room this server has never seen,
 * in a version where IDs are hashes) is still handed to the handler but has no entry in
 * the answer, as Synapse does for rooms it does not know. Answers are kept
 * FED_INBOUND_TXN_KEEP_MS.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/federation/transport/fed_internal.h"
#include "core/federation/transport/fed_txn.h"
#include "core/rooms/events.h"
#include "core/rooms/rooms.h"

#define FED_INBOUND_POOL_NAME "core.federation_inbound"
#define FED_INBOUND_POOL_THREADS 2
#define FED_INBOUND_POOL_QUEUE 64
#define FED_INBOUND_DB_WAIT_MS 5000
#define FED_INBOUND_TXN_KEEP_MS (24 * 60 * 60 * 1000LL) /* answers kept for replays */
#define FED_INBOUND_PRUNE_EVERY_MS (60 * 1000LL)        /* old answers deleted this often */
#define FED_INBOUND_MAX_BODY_BYTES (16 * 1024 * 1024)   /* 50 PDUs of 64 KiB and EDUs */
#define FED_INBOUND_RETRY_AFTER_MS 1000
#define FED_TXN_MAX_EDU_TYPES 32
#define FED_TXN_ID_MAX_BYTES 255
#define FED_INBOUND_KEY_BYTES 512 /* origin and transaction ID of a running transaction */

/* ---- outcomes, as the metrics label them ----------------------------------------- */

enum { TXN_PROCESSED = 0, TXN_REPLAYED, TXN_REFUSED, TXN__COUNT };
static const char *const TXN_OUTCOMES[TXN__COUNT] = {"processed", "replayed", "refused"};
enum { PDU_ACCEPTED = 0, PDU_SOFT_FAILED, PDU_REJECTED, PDU_ERROR, PDU__COUNT };
static const char *const PDU_OUTCOMES[PDU__COUNT] = {"accepted", "soft_failed", "rejected",
                                                     "error"};

/* ---- the handler registry (filled by the room model and client modules at init, which
 * may run before the federation module exists; read on the pool's threads) ------------ */

typedef struct edu_entry {
    char type[64];
    fed_edu_handler_fn fn;
    void *ctx;
} edu_entry;

static struct {
    pthread_mutex_t mu;
    fed_pdu_handler_fn pdu_fn;
    void *pdu_ctx;
    edu_entry edus[FED_TXN_MAX_EDU_TYPES];
    int n_edus;
    /* transactions being processed now: "origin\ntxn_id" (at most one per pool thread) */
    char running[FED_INBOUND_POOL_THREADS][FED_INBOUND_KEY_BYTES];
    int64_t last_prune_ms;
    /* the metrics, registered once by fed_inbound_routes */
    rt_metric *txns[TXN__COUNT], *pdus[PDU__COUNT], *edus_handled, *edus_ignored;
} fed_txn_registry = {.mu = PTHREAD_MUTEX_INITIALIZER};

void fed_txn_set_pdu_handler(fed_pdu_handler_fn fn, void *ctx)
{
    pthread_mutex_lock(&fed_txn_registry.mu);
    fed_txn_registry.pdu_fn = fn;
    fed_txn_registry.pdu_ctx = ctx;
    pthread_mutex_unlock(&fed_txn_registry.mu);
}

int fed_txn_on_edu(const char *edu_type, fed_edu_handler_fn fn, void *ctx)
{
    if (!edu_type || !fn || strlen(edu_type) >= sizeof(fed_txn_registry.edus[0].type))
        return -1;
    int rc = 0;
    pthread_mutex_lock(&fed_txn_registry.mu);
    for (int i = 0; i < fed_txn_registry.n_edus; i++)
        if (strcmp(fed_txn_registry.edus[i].type, edu_type) == 0) rc = -1;
    if (rc == 0 && fed_txn_registry.n_edus == FED_TXN_MAX_EDU_TYPES) rc = -1;
    if (rc == 0) {
        edu_entry *e = &fed_txn_registry.edus[fed_txn_registry.n_edus++];
        snprintf(e->type, sizeof(e->type), "%s", edu_type);
        e->fn = fn;
        e->ctx = ctx;
    }
    pthread_mutex_unlock(&fed_txn_registry.mu);
    return rc;
}

static bool edu_handler(const char *type, fed_edu_handler_fn *fn, void **ctx)
{
    bool found = false;
    pthread_mutex_lock(&fed_txn_registry.mu);
    for (int i = 0; i < fed_txn_registry.n_edus && !found; i++) {
        if (strcmp(fed_txn_registry.edus[i].type, type) != 0) continue;
        *fn = fed_txn_registry.edus[i].fn;
        *ctx = fed_txn_registry.edus[i].ctx;
        found = true;
    }
    pthread_mutex_unlock(&fed_txn_registry.mu);
    return found;
}

/* Claim (origin, txn) as running on this thread: false when it already runs. */
static bool claim_running(const char *key)
{
    bool ok = false;
    pthread_mutex_lock(&fed_txn_registry.mu);
    int free_slot = -1;
    for (int i = 0; i < FED_INBOUND_POOL_THREADS; i++) {
        if (strcmp(fed_txn_registry.running[i], key) == 0) {
            free_slot = -2;
            break;
        }
        if (!fed_txn_registry.running[i][0] && free_slot == -1) free_slot = i;
    }
    if (free_slot >= 0) {
        snprintf(fed_txn_registry.running[free_slot], FED_INBOUND_KEY_BYTES, "%s", key);
        ok = true;
    }
    pthread_mutex_unlock(&fed_txn_registry.mu);
    return ok;
}

static void release_running(const char *key)
{
    pthread_mutex_lock(&fed_txn_registry.mu);
    for (int i = 0; i < FED_INBOUND_POOL_THREADS; i++)
        if (strcmp(fed_txn_registry.running[i], key) == 0) fed_txn_registry.running[i][0] = 0;
    pthread_mutex_unlock(&fed_txn_registry.mu);
}

static void register_metrics(rt_metrics *reg)
{
    char labels[64];
    for (int i = 0; i < TXN__COUNT; i++) {
        snprintf(labels, sizeof(labels), "outcome=\"%s\"", TXN_OUTCOMES[i]);
        fed_txn_registry.txns[i] =
            rt_metric_counter(reg, "atrium_federation_inbound_transactions_total", labels,
                              "Transactions received from other servers, by outcome");
    }
    for (int i = 0; i < PDU__COUNT; i++) {
        snprintf(labels, sizeof(labels), "outcome=\"%s\"", PDU_OUTCOMES[i]);
        fed_txn_registry.pdus[i] =
            rt_metric_counter(reg, "atrium_federation_inbound_pdus_total", labels,
                              "PDUs received in transactions, by the room model's verdict");
    }
    fed_txn_registry.edus_handled =
        rt_metric_counter(reg, "atrium_federation_inbound_edus_total", "outcome=\"handled\"",
                          "EDUs received in transactions");
    fed_txn_registry.edus_ignored =
        rt_metric_counter(reg, "atrium_federation_inbound_edus_total", "outcome=\"ignored\"",
                          "EDUs received in transactions");
}

/* ---- the record of answered transactions ---------------------------------------------- */

/* The stored answer of (origin, txn): a new reference, NULL when none. *db_failed. */
static json_t *stored_answer(PGconn *c, const char *origin, const char *txn, bool *db_failed)
{
    const char *p[2] = {origin, txn};
    PGresult *res = db_query(c,
                             "SELECT response FROM federation_inbound_txns"
                             " WHERE origin = $1 AND txn_id = $2",
                             2, p);
    *db_failed = PQresultStatus(res) != PGRES_TUPLES_OK;
    json_t *j = NULL;
    if (*db_failed)
        rt_log(ATRIUM_LOG_ERROR, "federation", "inbound transactions: %s", PQerrorMessage(c));
    else if (PQntuples(res) == 1)
        j = json_loads(PQgetvalue(res, 0, 0), 0, NULL);
    PQclear(res);
    return j;
}

static void store_answer(PGconn *c, const char *origin, const char *txn, const json_t *answer)
{
    char *text = json_dumps(answer, JSON_COMPACT | JSON_SORT_KEYS);
    if (!text) return;
    int64_t now = rt_wall_ms();
    char ts[24], cutoff[24];
    snprintf(ts, sizeof(ts), "%lld", (long long)now);
    const char *p[4] = {origin, txn, text, ts};
    PGresult *res = db_query(c,
                             "INSERT INTO federation_inbound_txns (origin, txn_id, response,"
                             " received_ts) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                             4, p);
    if (PQresultStatus(res) != PGRES_COMMAND_OK) /* a replay would be processed again */
        rt_log(ATRIUM_LOG_WARN, "federation", "transaction %s from %s not recorded: %s", txn,
               origin, PQerrorMessage(c));
    PQclear(res);
    free(text);

    pthread_mutex_lock(&fed_txn_registry.mu);
    bool prune = now - fed_txn_registry.last_prune_ms >= FED_INBOUND_PRUNE_EVERY_MS;
    if (prune) fed_txn_registry.last_prune_ms = now;
    pthread_mutex_unlock(&fed_txn_registry.mu);
    if (!prune) return;
    snprintf(cutoff, sizeof(cutoff), "%lld", (long long)(now - FED_INBOUND_TXN_KEEP_MS));
    const char *q[1] = {cutoff};
    PQclear(db_query(c, "DELETE FROM federation_inbound_txns WHERE received_ts < $1", 1, q));
}

/* ---- processing (on the pool) --------------------------------------------------------- */

/* The key of pdu in the answer (see the top of the file), in the request's arena; NULL
 * when it has none. */
static const char *pdu_key(atrium_req *r, PGconn *c, const json_t *pdu)
{
    const char *room_id = json_string_value(json_object_get(pdu, "room_id"));
    bool db_failed = false;
    const room_version *v = room_id ? rooms_version_of(c, room_id, &db_failed) : NULL;
    char id[EVENT_ID_LEN];
    if (v && event_compute_id(v, pdu, id) == 0) return rt_arena_strdup(r->arena, id);
    const char *own = json_string_value(json_object_get(pdu, "event_id"));
    return own ? rt_arena_strdup(r->arena, own) : NULL;
}

static int outcome_metric(int outcome)
{
    switch (outcome) {
    case FED_PDU_ACCEPTED: return PDU_ACCEPTED;
    case FED_PDU_SOFT_FAILED: return PDU_SOFT_FAILED;
    case FED_PDU_REJECTED:
    case FED_PDU_REJECTED_KEPT: return PDU_REJECTED;
    default: return PDU_ERROR;
    }
}

/* Every PDU in order, then every EDU: the answer, a new reference. keys[i] from pdu_key. */
static json_t *run_transaction(const char *origin, json_t *pdus, json_t *edus,
                               const char *const *keys)
{
    json_t *results = json_object();
    pthread_mutex_lock(&fed_txn_registry.mu);
    fed_pdu_handler_fn fn = fed_txn_registry.pdu_fn;
    void *ctx = fed_txn_registry.pdu_ctx;
    pthread_mutex_unlock(&fed_txn_registry.mu);
    size_t i;
    json_t *pdu;
    json_array_foreach(pdus, i, pdu) {
        char err[FED_PDU_ERR_LEN] = "";
        int outcome = FED_PDU_RETRY;
        if (!json_is_object(pdu))
            snprintf(err, sizeof(err), "A PDU must be a JSON object");
        else if (!fn)
            snprintf(err, sizeof(err), "This server does not accept events over federation");
        else
            outcome = fn(ctx, origin, pdu, err);
        bool ok = outcome == FED_PDU_ACCEPTED || outcome == FED_PDU_SOFT_FAILED ||
                  outcome == FED_PDU_REJECTED_KEPT;
        if (!ok && !err[0])
            snprintf(err, sizeof(err), "%s", outcome == FED_PDU_REJECTED ? "Rejected"
                                                                         : "Not processed");
        rt_metric_add(fed_txn_registry.pdus[outcome_metric(outcome)], 1);
        if (!keys[i]) continue;
        json_object_set_new(results, keys[i],
                            ok ? json_object() : json_pack("{s:s}", "error", err));
    }
    json_t *edu;
    json_array_foreach(edus, i, edu) {
        const char *type = json_string_value(json_object_get(edu, "edu_type"));
        json_t *content = json_object_get(edu, "content");
        fed_edu_handler_fn efn;
        void *ectx;
        if (!type || !json_is_object(content) || !edu_handler(type, &efn, &ectx)) {
            rt_metric_add(fed_txn_registry.edus_ignored, 1);
            continue;
        }
        efn(ectx, origin, content);
        rt_metric_add(fed_txn_registry.edus_handled, 1);
    }
    return json_pack("{s:o}", "pdus", results);
}

static int process(atrium_req *r)
{
    const char *txn = http_req_param(r, "txnId");
    json_t *body = r->json;
    json_t *pdus = json_object_get(body, "pdus"), *edus = json_object_get(body, "edus");
    PGconn *c = db_acquire(db_global(), FED_INBOUND_DB_WAIT_MS);
    if (!c) return http_respond_error(r, 503, "M_UNKNOWN", "The database is not available");
    bool db_failed = false;
    json_t *answer = stored_answer(c, r->origin, txn, &db_failed);
    if (answer || db_failed) {
        db_release(db_global(), c);
        if (db_failed)
            return http_respond_error(r, 503, "M_UNKNOWN", "The database is not available");
        rt_metric_add(fed_txn_registry.txns[TXN_REPLAYED], 1);
        return http_respond_json(r, 200, answer);
    }
    char *key = rt_arena_printf(r->arena, "%s\n%s", r->origin, txn);
    if (!key || strlen(key) >= FED_INBOUND_KEY_BYTES || !claim_running(key)) {
        db_release(db_global(), c);
        return http_respond_limited(r, FED_INBOUND_RETRY_AFTER_MS,
                                    "This transaction is being processed; retry");
    }
    size_t n = json_array_size(pdus);
    const char **keys = rt_arena_alloc(r->arena, (n ? n : 1) * sizeof(*keys));
    for (size_t i = 0; keys && i < n; i++) keys[i] = pdu_key(r, c, json_array_get(pdus, i));
    db_release(db_global(), c); /* the handlers take their own connections */
    if (!keys) {
        release_running(key);
        return ATRIUM_E_NOMEM;
    }
    answer = run_transaction(r->origin, pdus, edus, keys);
    c = db_acquire(db_global(), FED_INBOUND_DB_WAIT_MS);
    if (c) {
        store_answer(c, r->origin, txn, answer);
        db_release(db_global(), c);
    }
    release_running(key);
    rt_metric_add(fed_txn_registry.txns[TXN_PROCESSED], 1);
    return http_respond_json(r, 200, answer);
}

static int refuse(atrium_req *r, int status, const char *errcode, const char *why)
{
    rt_metric_add(fed_txn_registry.txns[TXN_REFUSED], 1);
    rt_log(ATRIUM_LOG_INFO, "federation", "transaction %s from %s refused: %s",
           http_req_param(r, "txnId"), r->origin, why);
    return http_respond_error(r, status, errcode, "%s", why);
}

/* PUT /_matrix/federation/v1/send/{txnId} (signed) */
static int put_send(atrium_req *r)
{
    if (r->run_reason == ATRIUM_RUN_HANDOFF) return process(r);
    if (r->run_reason == ATRIUM_RUN_SHUTDOWN)
        return http_respond_error(r, 503, "M_UNKNOWN", "The server is stopping");
    const char *txn = http_req_param(r, "txnId");
    if (!txn || !*txn || strlen(txn) > FED_TXN_ID_MAX_BYTES)
        return refuse(r, 400, "M_INVALID_PARAM", "The transaction ID is empty or too long");
    json_t *body = http_req_json(r);
    if (!body) return ATRIUM_DONE;
    const char *origin = json_string_value(json_object_get(body, "origin"));
    if (!origin || strcmp(origin, r->origin) != 0)
        return refuse(r, 403, "M_FORBIDDEN",
                      "The transaction's origin is not the server that signed the request");
    json_t *pdus = json_object_get(body, "pdus"), *edus = json_object_get(body, "edus");
    if (!json_is_array(pdus) || (edus && !json_is_array(edus)))
        return refuse(r, 400, "M_BAD_JSON", "pdus must be an array, and edus too when present");
    if (json_array_size(pdus) > FED_TXN_MAX_PDUS || json_array_size(edus) > FED_TXN_MAX_EDUS)
        return refuse(r, 400, "M_BAD_JSON",
                      "A transaction carries at most 50 PDUs and 100 EDUs");
    rt_pool *pool = fed_state()->inbound_pool;
    int rc = pool ? susp_handoff(r, pool, NULL, 0) : ATRIUM_E_STOPPED;
    if (rc == 0) return ATRIUM_HANDED_OFF;
    if (rc == ATRIUM_E_LIMIT)
        return http_respond_limited(r, FED_INBOUND_RETRY_AFTER_MS,
                                    "Too many transactions in progress; retry");
    return http_respond_error(r, 503, "M_UNKNOWN", "The server is stopping");
}

int fed_inbound_routes(fed_module *m)
{
    static const atrium_route route = {.method = "PUT",
                                       .path = "/_matrix/federation/v1/send/{txnId}",
                                       .handler = put_send,
                                       .max_body_bytes = FED_INBOUND_MAX_BODY_BYTES,
                                       .flags = ATRIUM_ROUTE_FEDERATION};
    register_metrics(m->metrics);
    m->inbound_pool = rt_pool_new(FED_INBOUND_POOL_NAME, FED_INBOUND_POOL_THREADS,
                                  FED_INBOUND_POOL_QUEUE, m->metrics);
    if (!m->inbound_pool) return -1;
    char err[256];
    if (router_add(m->srv->router, &route, "core", err, sizeof(err)) < 0) {
        rt_log(ATRIUM_LOG_ERROR, "federation", "%s", err);
        return -1;
    }
    return 0;
}

int fed_inbound_start(fed_module *m)
{
    return m->inbound_pool ? rt_pool_start(m->inbound_pool) : 0;
}

void fed_inbound_stop(fed_module *m)
{
    if (!m->inbound_pool) return;
    rt_pool_stop(m->inbound_pool); /* queued handoffs are answered 503 */
    rt_pool_join(m->inbound_pool);
}

void fed_inbound_free(fed_module *m)
{
    if (m->inbound_pool) rt_pool_free(m->inbound_pool);
    m->inbound_pool = NULL;
}
