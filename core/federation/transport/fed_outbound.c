/*
 * core/federation/transport/fed_outbound.c - the outbound half of fed_txn.h: the persisted queue
 * (federation_outbound, fed_migrations.c) and the sender that drains it into transactions.
 *
 * The queue is written inside the caller's transaction (fed_outbound_enqueue_*), so what
 * commits is sent and what rolls back is not; the sender is one thread of its own
 * ("fed-outbound"), woken by fed_outbound_kick after such a commit, by the answer of a
 * transaction, when a destination's backoff ends, and every FED_OUTBOUND_POLL_MS in any
 * case (rows another process queued, a kick lost to a crash). It never waits on a peer:
 * each transaction is a fed_request_submit whose callback, on the outbound client's
 * thread, only records the answer and wakes the sender, which does the database work.
 *
 * Per destination: at most one transaction in flight. Rows are put in a transaction by
 * writing its ID into them (txn_id) before the first attempt, and deleted only after a
 * 200, so a retry after a failure or a restart sends the same rows under the same ID and
 * the receiver's idempotency (per origin and transaction ID) absorbs it. A failure that
 * the transport does not count as one (any non-200 answer) is recorded in the backoff
 * table here, so a peer that refuses a transaction is retried on the backoff schedule
 * rather than at once.
 *
 * Catch-up: after a failed transaction (and at start, when nothing is known about the
 * destinations), a destination is "catching up". Before its next transaction is made,
 * every room with more than FED_OUTBOUND_CATCHUP_THRESHOLD_PDUS PDUs queued for it keeps
 * only its newest FED_OUTBOUND_CATCHUP_KEEP_PDUS: the receiver sees the newest event, finds
 * its prev_events unknown and fetches the gap itself (get_missing_events), which is what
 * a server coming back after a long absence needs rather than a replay of every
 * transaction it missed. A destination leaves catch-up at the first transaction made
 * without anything to collapse. EDUs are kept (to-device messages must all arrive), but
 * for typing notices older than FED_OUTBOUND_TYPING_STALE_MS, which ran out long ago.
 *
 * Several processes sharing one database: destinations are hashed into groups, and a
 * destination is sent to only by the process holding its group's lease
 * (fed_outbound_groups.c shares the groups out between live processes: ADR-0026). A pass
 * tracks only the destinations of groups this process holds; one whose group it does not
 * hold (any more) is forgotten once nothing is in flight to it (the rows keep their
 * transaction IDs, so the holder resends them under the same ones). Whether the group is
 * held is asked right before each submit, and a group being given up is first drained
 * (no new transaction; those in flight answered), so a process that loses or gives up a
 * group stops sending to it before another can start (a lease's belief ends before its
 * row expires). A kick in a process that does not hold every group reaches the other
 * senders as a notification on FED_OUTBOUND_CHANNEL (core/store/notify.h; the poll covers
 * one missed). When a process dies its groups are taken within server.lease_ttl_ms and
 * their senders start at once (on_gain). An answer is settled whoever holds the group by
 * then: a 200 deletes exactly the rows of that transaction, which another sender resending
 * it would have delivered under the same ID (the receiver's idempotency absorbs both).
 *
 * Not here: what a PDU means (the room model decides which events to queue) and the
 * inbound half (fed_inbound.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config/config.h"
#include "core/federation/transport/fed_internal.h"
#include "core/federation/transport/fed_outbound_groups.h"
#include "core/federation/transport/fed_txn.h"
#include "core/runtime/core_runtime.h"
#include "core/runtime/keytab.h"
#include "core/store/lease.h"
#include "core/store/notify.h"

#define FED_OUTBOUND_POLL_MS 5000      /* the queue is read this often even when not kicked */
#define FED_OUTBOUND_DB_WAIT_MS 5000   /* the sender waits this long for a connection */
#define FED_OUTBOUND_DB_RETRY_MS 1000  /* a pass that failed on the database runs again */
#define FED_OUTBOUND_SUBMIT_RETRY_MS 1000 /* the outbound client's queue was full */
#define FED_OUTBOUND_MAX_DESTINATIONS 10000 /* destinations tracked per pass; more wait */
#define FED_OUTBOUND_MAX_DEPTH_GAUGES 1000  /* per-destination gauges exported at most */
/* Catch-up (see above): a room with more PDUs queued than the threshold for a destination
 * that is catching up keeps only its newest few. */
#define FED_OUTBOUND_CATCHUP_THRESHOLD_PDUS 50
#define FED_OUTBOUND_CATCHUP_KEEP_PDUS 1
/* A typing notice queued longer ago than this is not sent to a destination catching up. */
#define FED_OUTBOUND_TYPING_STALE_MS 30000
#define FED_OUTBOUND_TXN_ID_BYTES 48
#define FED_OUTBOUND_URI_BYTES 128
#define FED_OUTBOUND_CHANNEL "atrium.fed_outbound" /* a kick for the other processes' senders */

enum { KIND_PDU = 0, KIND_EDU = 1 };

typedef struct out_dest {
    rt_keyent ke; /* ke.key is name */
    struct out_dest *next;
    char *name;
    int group; /* fed_groups_of(name) */
    char txn_id[FED_OUTBOUND_TXN_ID_BYTES]; /* the transaction being sent, or "" */
    bool catch_up;
    bool seen; /* listed by the current pass */
    /* under o->mu: set by the sender before submit, by the callback after the answer */
    bool in_flight, answered, ok, drop;
    rt_metric *depth; /* atrium_federation_outbound_queue_depth{destination=...}, or NULL */
} out_dest;

struct fed_outbound {
    db_pool *db;
    fed_backoff *backoff;
    const char *server_name;
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool kicked, stopping;
    rt_keytab tab;
    out_dest *dests; /* every tracked destination, for the passes (sender thread only) */
    unsigned long long seq; /* transaction IDs made by this process */
    int n_gauges;
    rt_metrics *metrics;
    rt_metric *m_sent, *m_failed, *m_catchup, *m_dropped;
    fed_groups *groups; /* which destinations this process sends to */
};

/* ---- queueing (inside the caller's transaction) --------------------------------------- */

static const char *own_server_name(void)
{
    fed_module *m = fed_state();
    if (m) return m->server_name;
    core_runtime *rt = core_runtime_get();
    return rt ? rt->cfg->server_name : "";
}

/* The servers of room_id's joined members, minus this server: rows of one text column. */
static PGresult *room_servers(PGconn *c, const char *room_id)
{
    const char *p[2] = {room_id, own_server_name()};
    PGresult *res = db_query(
        c,
        "SELECT DISTINCT substr(state_key, strpos(state_key, ':') + 1) AS d FROM current_state"
        " WHERE room_id = $1 AND type = 'm.room.member' AND membership = 'join'"
        " AND strpos(state_key, ':') > 0 AND substr(state_key, strpos(state_key, ':') + 1) <> $2",
        2, p);
    if (PQresultStatus(res) == PGRES_TUPLES_OK) return res;
    rt_log(ATRIUM_LOG_ERROR, "federation", "outbound queue: %s", PQerrorMessage(c));
    PQclear(res);
    return NULL;
}

int fed_outbound_enqueue_pdu_to(PGconn *c, const char *destination, const char *room_id,
                                const char *event_id)
{
    if (!c || !destination || !room_id || !event_id) return -1;
    if (!*destination || strcmp(destination, own_server_name()) == 0) return 0;
    if (fed_state() && !fed_domain_allowed(destination)) return 0; /* never sendable */
    char now[24];
    snprintf(now, sizeof(now), "%lld", (long long)rt_wall_ms());
    const char *q[4] = {destination, room_id, event_id, now};
    return db_exec(c,
                   "INSERT INTO federation_outbound (destination, kind, room_id, event_id,"
                   " queued_ts) VALUES ($1, 0, $2, $3, $4)"
                   " ON CONFLICT (destination, event_id) WHERE kind = 0 DO NOTHING",
                   4, q)
               ? 0
               : -1;
}

int fed_outbound_enqueue_pdu(PGconn *c, const char *room_id, const char *event_id,
                             const char *except_server)
{
    if (!c || !room_id || !event_id) return -1;
    PGresult *res = room_servers(c, room_id);
    if (!res) return -1;
    int rc = 0;
    for (int i = 0; i < PQntuples(res) && rc == 0; i++) {
        const char *dest = PQgetvalue(res, i, 0);
        if (except_server && strcmp(dest, except_server) == 0) continue;
        rc = fed_outbound_enqueue_pdu_to(c, dest, room_id, event_id);
    }
    PQclear(res);
    return rc;
}

int fed_outbound_enqueue_edu(PGconn *c, const char *destination, const char *edu_type,
                             const json_t *content)
{
    if (!c || !destination || !edu_type || !json_is_object(content)) return -1;
    if (strcmp(destination, own_server_name()) == 0) return 0; /* our own users: not sent */
    char *text = json_dumps(content, JSON_COMPACT);
    if (!text) return -1;
    char now[24];
    snprintf(now, sizeof(now), "%lld", (long long)rt_wall_ms());
    const char *q[4] = {destination, edu_type, text, now};
    bool ok = db_exec(c,
                      "INSERT INTO federation_outbound (destination, kind, edu_type, content,"
                      " queued_ts) VALUES ($1, 1, $2, $3, $4)",
                      4, q);
    free(text);
    return ok ? 0 : -1;
}

int fed_outbound_enqueue_room_edu(PGconn *c, const char *room_id, const char *edu_type,
                                  const json_t *content)
{
    if (!c || !room_id) return -1;
    PGresult *res = room_servers(c, room_id);
    if (!res) return -1;
    int rc = 0;
    for (int i = 0; i < PQntuples(res) && rc == 0; i++) {
        const char *dest = PQgetvalue(res, i, 0);
        if (fed_state() && !fed_domain_allowed(dest)) continue;
        rc = fed_outbound_enqueue_edu(c, dest, edu_type, content);
    }
    PQclear(res);
    return rc;
}

int fed_txn_server_in_room(PGconn *c, const char *room_id, const char *server_name)
{
    const char *p[2] = {room_id, server_name};
    PGresult *res = db_query(c,
                             "SELECT 1 FROM current_state WHERE room_id = $1"
                             " AND type = 'm.room.member' AND membership = 'join'"
                             " AND substr(state_key, strpos(state_key, ':') + 1) = $2"
                             " AND strpos(state_key, ':') > 0 LIMIT 1",
                             2, p);
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        rt_log(ATRIUM_LOG_ERROR, "federation", "room membership: %s", PQerrorMessage(c));
        PQclear(res);
        return -1;
    }
    int in = PQntuples(res) > 0;
    PQclear(res);
    return in;
}

static void kick_local(fed_outbound *o)
{
    pthread_mutex_lock(&o->mu);
    o->kicked = true;
    pthread_cond_signal(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

void fed_outbound_kick(void)
{
    fed_module *m = fed_state();
    fed_outbound *o = m ? m->outbound : NULL;
    if (!o) return;
    kick_local(o);
    /* The sender that runs may be another process's: tell it (after the caller's commit). */
    notify_service *ns = notify_global();
    if (!fed_groups_all_held(o->groups) && ns)
        notify_publish_queued(ns, FED_OUTBOUND_CHANNEL, "kick", NOTIFY_BATCH);
}

/* Another process queued rows (or notifications were missed): a pass, if this one sends. */
static void outbound_kicked_elsewhere(void *arg, const char *payload)
{
    (void)payload;
    kick_local(arg);
}

/* ---- destinations --------------------------------------------------------------------- */

static out_dest *dest_get(fed_outbound *o, const char *name, int group)
{
    uint64_t h = rt_keytab_hash(&o->tab, name);
    out_dest *d = (out_dest *)rt_keytab_find(&o->tab, name, h);
    if (d) return d;
    if (o->tab.count >= FED_OUTBOUND_MAX_DESTINATIONS) return NULL;
    d = calloc(1, sizeof(*d));
    if (!d || !(d->name = strdup(name))) {
        free(d);
        return NULL;
    }
    d->group = group;
    d->ke.key = d->name;
    d->ke.hash = h;
    d->catch_up = true; /* nothing known yet: a backlog found at start may be an outage's */
    if (o->n_gauges < FED_OUTBOUND_MAX_DEPTH_GAUGES) {
        char labels[RT_METRIC_LABELS_MAX_BYTES];
        if (rt_metric_label(labels, sizeof(labels), "destination", name) > 0) {
            d->depth = rt_metric_gauge(o->metrics, "atrium_federation_outbound_queue_depth",
                                       labels, "PDUs and EDUs queued for a destination");
            if (d->depth) o->n_gauges++;
        }
    }
    rt_keytab_insert(&o->tab, &d->ke);
    d->next = o->dests;
    o->dests = d;
    return d;
}

static void dest_free(out_dest *d)
{
    free(d->name);
    free(d);
}

/* ---- one transaction ------------------------------------------------------------------ */

/* The answer of a transaction (on the outbound client's thread): recorded, sender woken. */
static void txn_answered(void *arg, const fed_response *res)
{
    out_dest *d = arg;
    fed_module *m = fed_state();
    fed_outbound *o = m->outbound;
    bool ok = res->outcome == FED_HTTP_OK && res->status == 200;
    if (!ok) {
        if (res->outcome == FED_HTTP_OK) /* an answer, so the transport saw no failure */
            fed_backoff_failure(m->backoff, d->name);
        if (res->outcome == FED_HTTP_OK)
            rt_log(ATRIUM_LOG_INFO, "federation",
                   "transaction %s to %s not delivered: answered %d; retried after backoff",
                   d->txn_id, d->name, res->status);
        else
            rt_log(ATRIUM_LOG_INFO, "federation",
                   "transaction %s to %s not delivered: %s; retried after backoff", d->txn_id,
                   d->name, res->error ? res->error : "no answer");
    }
    pthread_mutex_lock(&o->mu);
    d->answered = true;
    d->ok = ok;
    d->drop = res->outcome == FED_REQ_E_NOT_ALLOWED;
    o->kicked = true;
    pthread_cond_signal(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

/* Catch-up: keep the newest few PDUs of each room over the threshold, and drop typing
 * notices older than FED_OUTBOUND_TYPING_STALE_MS (they ran out long ago). Rows already in
 * a transaction stay (that transaction is resent as it was). PDUs deleted, or -1. */
static int64_t collapse(PGconn *c, const char *dest)
{
    char threshold[16], keep[16], stale[24];
    snprintf(threshold, sizeof(threshold), "%d", FED_OUTBOUND_CATCHUP_THRESHOLD_PDUS);
    snprintf(keep, sizeof(keep), "%d", FED_OUTBOUND_CATCHUP_KEEP_PDUS);
    snprintf(stale, sizeof(stale), "%lld",
             (long long)(rt_wall_ms() - FED_OUTBOUND_TYPING_STALE_MS));
    const char *q[2] = {dest, stale};
    if (!db_exec(c,
                 "DELETE FROM federation_outbound WHERE destination = $1 AND kind = 1"
                 " AND edu_type = 'm.typing' AND txn_id IS NULL AND queued_ts < $2::bigint",
                 2, q))
        return -1;
    const char *p[3] = {dest, threshold, keep};
    int64_t n = 0;
    if (!db_exec_rows(c,
                      "DELETE FROM federation_outbound o USING ("
                      " SELECT id, row_number() OVER (PARTITION BY room_id ORDER BY id DESC) AS rn,"
                      " count(*) OVER (PARTITION BY room_id) AS n FROM federation_outbound"
                      " WHERE destination = $1 AND kind = 0 AND txn_id IS NULL) x"
                      " WHERE o.id = x.id AND x.n > $2::int AND x.rn > $3::int",
                      3, p, &n))
        return -1;
    return n;
}

/* Rows put in d's new transaction ($2): the oldest PDUs and EDUs not in one yet. */
#define PICK_ROWS_SQL                                                                        \
    "UPDATE federation_outbound SET txn_id = $2 WHERE id IN ("                               \
    " (SELECT id FROM federation_outbound WHERE destination = $1 AND kind = 0"               \
    "  AND txn_id IS NULL ORDER BY id LIMIT $3::int) UNION ALL"                              \
    " (SELECT id FROM federation_outbound WHERE destination = $1 AND kind = 1"               \
    "  AND txn_id IS NULL ORDER BY id LIMIT $4::int))"

/* The transaction to send to d next: one already made (a retry, or left by a previous
 * run), else a new one of the oldest rows. false when there is nothing to send or the
 * database failed (*db_failed). */
static bool pick_txn(fed_outbound *o, PGconn *c, out_dest *d, bool *db_failed)
{
    *db_failed = false;
    if (d->txn_id[0]) return true;
    const char *p[4] = {d->name};
    PGresult *res = db_query(c,
                             "SELECT txn_id FROM federation_outbound WHERE destination = $1"
                             " AND txn_id IS NOT NULL ORDER BY id LIMIT 1",
                             1, p);
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        PQclear(res);
        return !(*db_failed = true);
    }
    if (PQntuples(res) == 1)
        snprintf(d->txn_id, sizeof(d->txn_id), "%s", PQgetvalue(res, 0, 0));
    PQclear(res);
    if (d->txn_id[0]) return true;

    if (d->catch_up) {
        int64_t dropped = collapse(c, d->name);
        if (dropped < 0) return !(*db_failed = true);
        if (dropped > 0) {
            rt_metric_add(o->m_dropped, dropped);
            rt_log(ATRIUM_LOG_INFO, "federation",
                   "%s is catching up: %lld queued events not sent (it fetches the gap)",
                   d->name, (long long)dropped);
        } else {
            d->catch_up = false;
        }
    }
    char txn[FED_OUTBOUND_TXN_ID_BYTES], maxp[16], maxe[16];
    /* Unique across restarts: the wall clock at creation, then this process's counter. */
    snprintf(txn, sizeof(txn), "%lld.%llu", (long long)rt_wall_ms(), ++o->seq);
    snprintf(maxp, sizeof(maxp), "%d", FED_TXN_MAX_PDUS);
    snprintf(maxe, sizeof(maxe), "%d", FED_TXN_MAX_EDUS);
    /* Fenced by the group's lease (when there are leases): rows are never put in a
     * transaction by a process whose group another one took meanwhile. */
    lease *l = fed_groups_lease(o->groups, d->group);
    const char *q[6] = {d->name, txn, maxp, maxe, lease_name(l), lease_holder(l)};
    int64_t n = 0;
    if (!db_exec_rows(c, l ? PICK_ROWS_SQL " AND " LEASE_FENCE_SQL("$5", "$6") : PICK_ROWS_SQL,
                      l ? 6 : 4, q, &n))
        return !(*db_failed = true);
    if (n == 0) return false;
    snprintf(d->txn_id, sizeof(d->txn_id), "%s", txn);
    return true;
}

/* The body of d's transaction: {origin, origin_server_ts, pdus, edus}, rows in queue
 * order. NULL on a database failure; a body with no PDU and no EDU when the events are
 * gone (the caller drops the rows). */
static json_t *txn_body(fed_outbound *o, PGconn *c, out_dest *d)
{
    const char *p[2] = {d->name, d->txn_id};
    PGresult *res = db_query(c,
                             "SELECT q.kind, q.edu_type, q.content, e.pdu"
                             " FROM federation_outbound q LEFT JOIN events e"
                             " ON q.kind = 0 AND e.event_id = q.event_id"
                             " WHERE q.destination = $1 AND q.txn_id = $2 ORDER BY q.id",
                             2, p);
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        rt_log(ATRIUM_LOG_ERROR, "federation", "outbound queue: %s", PQerrorMessage(c));
        PQclear(res);
        return NULL;
    }
    json_t *pdus = json_array(), *edus = json_array();
    for (int i = 0; i < PQntuples(res); i++) {
        bool pdu = atoi(PQgetvalue(res, i, 0)) == KIND_PDU;
        const char *text = PQgetvalue(res, i, pdu ? 3 : 2);
        if (PQgetisnull(res, i, pdu ? 3 : 2)) continue; /* the event is gone */
        json_t *j = json_loads(text, 0, NULL);
        if (!j) continue;
        if (pdu)
            json_array_append_new(pdus, j);
        else
            json_array_append_new(edus, json_pack("{s:s,s:o}", "edu_type",
                                                  PQgetvalue(res, i, 1), "content", j));
    }
    PQclear(res);
    return json_pack("{s:s,s:I,s:o,s:o}", "origin", o->server_name, "origin_server_ts",
                     (json_int_t)rt_wall_ms(), "pdus", pdus, "edus", edus);
}

static bool delete_txn(PGconn *c, out_dest *d)
{
    const char *p[2] = {d->name, d->txn_id};
    return db_exec(c, "DELETE FROM federation_outbound WHERE destination = $1 AND txn_id = $2",
                   2, p);
}

/* Make (or take up again) d's transaction and submit it. Returns the milliseconds after
 * which the sender should look again because of d (0: no need). */
static int64_t send_next(fed_outbound *o, PGconn *c, out_dest *d, bool *db_failed)
{
    if (!pick_txn(o, c, d, db_failed)) return 0;
    json_t *body = txn_body(o, c, d);
    if (!body) {
        *db_failed = true;
        return 0;
    }
    if (json_array_size(json_object_get(body, "pdus")) == 0 &&
        json_array_size(json_object_get(body, "edus")) == 0) {
        json_decref(body);
        if (!delete_txn(c, d)) *db_failed = true;
        d->txn_id[0] = '\0';
        return 0;
    }
    char uri[FED_OUTBOUND_URI_BYTES];
    snprintf(uri, sizeof(uri), "/_matrix/federation/v1/send/%s", d->txn_id);
    fed_request_opts req = {
        .method = "PUT",
        .destination = d->name,
        .uri = uri,
        .body = body,
        .want_json = true,
        .on_done = txn_answered,
        .arg = d,
    };
    /* Last moment to find the group gone: the transaction stays made, its rows keep its ID
     * and the group's new holder sends it. */
    if (!fed_groups_sendable(o->groups, d->group)) {
        json_decref(body);
        return 0;
    }
    pthread_mutex_lock(&o->mu);
    d->in_flight = true;
    pthread_mutex_unlock(&o->mu);
    int rc = fed_request_submit(&req);
    json_decref(body);
    if (rc == 0) return 0;
    pthread_mutex_lock(&o->mu);
    d->in_flight = false;
    pthread_mutex_unlock(&o->mu);
    return FED_OUTBOUND_SUBMIT_RETRY_MS;
}

/* ---- the sender ----------------------------------------------------------------------- */

static int64_t min_wait(int64_t a, int64_t b)
{
    return a <= 0 ? b : b <= 0 ? a : a < b ? a : b;
}

/* Settle the answered transactions: a 200 deletes its rows. */
static bool settle(fed_outbound *o, PGconn *c)
{
    bool ok = true;
    for (out_dest *d = o->dests; d; d = d->next) {
        pthread_mutex_lock(&o->mu);
        bool answered = d->answered, delivered = d->ok, drop = d->drop;
        if (answered) d->answered = d->in_flight = false;
        pthread_mutex_unlock(&o->mu);
        if (!answered) continue;
        if (delivered || drop) {
            if (drop)
                rt_log(ATRIUM_LOG_WARN, "federation",
                       "transaction %s to %s dropped: the destination may not be contacted",
                       d->txn_id, d->name);
            if (!delete_txn(c, d)) {
                ok = false; /* sent again next pass: the receiver answers from its record */
                continue;
            }
            d->txn_id[0] = '\0';
            if (delivered) rt_metric_add(o->m_sent, 1);
        } else {
            rt_metric_add(o->m_failed, 1);
            d->catch_up = true;
        }
    }
    return ok;
}

/* One pass over the queue: the milliseconds until the next one is due. */
static int64_t pass(fed_outbound *o)
{
    int64_t balance_in = fed_groups_balance_in(o->groups);
    if (!o->dests && fed_groups_count_held(o->groups) == 0 && balance_in != 0)
        return min_wait(FED_OUTBOUND_POLL_MS, balance_in); /* nothing to do here yet */
    PGconn *c = db_acquire_background(o->db, FED_OUTBOUND_DB_WAIT_MS);
    if (!c) return FED_OUTBOUND_DB_RETRY_MS;
    bool db_failed = !settle(o, c);
    if (balance_in == 0) fed_groups_balance(o->groups, c);
    int64_t wait = min_wait(FED_OUTBOUND_POLL_MS, fed_groups_balance_in(o->groups));
    fed_groups_clear_busy(o->groups);
    for (out_dest *d = o->dests; d; d = d->next) {
        pthread_mutex_lock(&o->mu);
        if (d->in_flight) fed_groups_note_busy(o->groups, d->group);
        pthread_mutex_unlock(&o->mu);
    }
    fed_groups_release_drained(o->groups);
    if (fed_groups_count_held(o->groups) == 0 && !o->dests) {
        db_release(o->db, c);
        return wait; /* a group's on_gain kicks the sender */
    }

    char limit[16];
    snprintf(limit, sizeof(limit), "%d", FED_OUTBOUND_MAX_DESTINATIONS);
    const char *p[1] = {limit};
    PGresult *res = db_query(c,
                             "SELECT destination, count(*) FROM federation_outbound"
                             " GROUP BY destination ORDER BY min(id) LIMIT $1::int",
                             1, p);
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        rt_log(ATRIUM_LOG_ERROR, "federation", "outbound queue: %s", PQerrorMessage(c));
        PQclear(res);
        db_release(o->db, c);
        return FED_OUTBOUND_DB_RETRY_MS;
    }
    for (out_dest *d = o->dests; d; d = d->next) d->seen = false;
    for (int i = 0; i < PQntuples(res); i++) {
        const char *name = PQgetvalue(res, i, 0);
        int group = fed_groups_of(o->groups, name);
        if (!fed_groups_sendable(o->groups, group)) continue; /* another process's */
        out_dest *d = dest_get(o, name, group);
        if (!d) continue;
        d->seen = true;
        rt_metric_set(d->depth, atoll(PQgetvalue(res, i, 1)));
    }
    PQclear(res);

    /* Forget destinations with nothing queued (and nothing in flight). */
    int catching_up = 0;
    for (out_dest **pp = &o->dests; *pp;) {
        out_dest *d = *pp;
        pthread_mutex_lock(&o->mu);
        bool busy = d->in_flight;
        pthread_mutex_unlock(&o->mu);
        if (!d->seen && !busy) {
            rt_metric_set(d->depth, 0);
            *pp = d->next;
            rt_keytab_remove(&o->tab, &d->ke);
            /* its gauge stays registered (at 0): the registry cannot drop one */
            dest_free(d);
            continue;
        }
        pp = &d->next;
        if (d->catch_up) catching_up++;
        if (busy || db_failed || !fed_groups_sendable(o->groups, d->group)) continue;
        int64_t backoff = fed_backoff_retry_in_ms(o->backoff, d->name, rt_wall_ms());
        if (backoff > 0) {
            wait = min_wait(wait, backoff);
            continue;
        }
        wait = min_wait(wait, send_next(o, c, d, &db_failed));
    }
    rt_metric_set(o->m_catchup, catching_up);
    db_release(o->db, c);
    return db_failed ? FED_OUTBOUND_DB_RETRY_MS : wait;
}

static void *sender_main(void *arg)
{
    fed_outbound *o = arg;
    int64_t wait = 0; /* a first pass at once: rows left by the previous run */
    pthread_mutex_lock(&o->mu);
    while (!o->stopping) {
        if (!o->kicked && wait > 0) rt_scope_wait(&o->cv, &o->mu, rt_now_ms() + wait);
        if (o->stopping) break;
        o->kicked = false;
        pthread_mutex_unlock(&o->mu);
        wait = pass(o);
        pthread_mutex_lock(&o->mu);
    }
    pthread_mutex_unlock(&o->mu);
    return NULL;
}

fed_outbound *fed_outbound_new(db_pool *db, fed_backoff *backoff, const char *server_name,
                               int sender_groups, rt_metrics *metrics)
{
    fed_outbound *o = calloc(1, sizeof(*o));
    if (!o) return NULL;
    if (!(o->groups = fed_groups_new(sender_groups, metrics))) {
        free(o);
        return NULL;
    }
    if (rt_keytab_init(&o->tab, FED_OUTBOUND_MAX_DESTINATIONS) < 0) {
        fed_groups_free(o->groups);
        free(o);
        return NULL;
    }
    o->db = db;
    o->backoff = backoff;
    o->server_name = server_name;
    o->metrics = metrics;
    pthread_mutex_init(&o->mu, NULL);
    rt_cond_init(&o->cv);
    o->m_sent = rt_metric_counter(metrics, "atrium_federation_outbound_transactions_total",
                                  "outcome=\"sent\"", "Transactions sent to other servers");
    o->m_failed = rt_metric_counter(metrics, "atrium_federation_outbound_transactions_total",
                                    "outcome=\"failed\"", "Transactions sent to other servers");
    o->m_catchup = rt_metric_gauge(metrics, "atrium_federation_outbound_catchup_destinations",
                                   NULL, "Destinations catching up after failed transactions");
    o->m_dropped =
        rt_metric_counter(metrics, "atrium_federation_outbound_catchup_skipped_pdus_total", NULL,
                          "Queued PDUs not sent because their destination was catching up");
    return o;
}

/* A group's lease came to this process (on the lease thread): start sending at once. */
static void outbound_lease_gained(void *arg)
{
    fed_outbound *o = arg;
    pthread_mutex_lock(&o->mu);
    o->kicked = true;
    pthread_cond_signal(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

int fed_outbound_start(fed_outbound *o)
{
    if (!o->db) return 0; /* no database: nothing to send */
    core_runtime *rt = core_runtime_get();
    if (rt && rt->leases) {
        int rc = fed_groups_start(o->groups, rt->leases, rt->cfg->lease_ttl_ms,
                                  outbound_lease_gained, o);
        if (rc < 0) return rc;
    }
    notify_service *ns = notify_global();
    if (ns && notify_subscribe(ns, FED_OUTBOUND_CHANNEL, NOTIFY_SKIP_OWN,
                               outbound_kicked_elsewhere, o) < 0)
        return ATRIUM_E_LIMIT;
    if (pthread_create(&o->thread, NULL, sender_main, o) != 0) {
        rt_log(ATRIUM_LOG_ERROR, "federation", "cannot start the outbound sender thread");
        return ATRIUM_E_IO;
    }
    o->started = true;
    return 0;
}

void fed_outbound_stop(fed_outbound *o)
{
    pthread_mutex_lock(&o->mu);
    o->stopping = true;
    pthread_cond_signal(&o->cv);
    pthread_mutex_unlock(&o->mu);
    if (o->started) pthread_join(o->thread, NULL);
    o->started = false;
}

void fed_outbound_free(fed_outbound *o)
{
    if (!o) return;
    for (out_dest *d = o->dests, *next; d; d = next) {
        next = d->next;
        rt_keytab_remove(&o->tab, &d->ke); /* the table asserts it is empty when destroyed */
        dest_free(d);
    }
    rt_keytab_destroy(&o->tab);
    fed_groups_free(o->groups);
    pthread_mutex_destroy(&o->mu);
    pthread_cond_destroy(&o->cv);
    free(o);
}
