/*
 * core/federation/transport/fed_backoff.c - per-destination backoff (see fed_backoff.h for the
 * contract).
 *
 * The table in memory decides; PostgreSQL is its copy for the next start. Each change of
 * a destination's state (a failure, or a success that ends a backoff) is snapshotted under
 * the lock and handed to the writer pool as one upsert or one delete; the pool has one
 * thread, so the writes reach the database in the order the changes happened. A write
 * that cannot be queued is dropped and counted (atrium_federation_backoff_writes_dropped_
 * total): the next change of that destination writes its whole state again.
 *
 * Destination names come from other servers, so the table is a SipHash keyed table
 * (core/runtime/keytab.h) and bounded (max_destinations): past the bound a new failing
 * destination is simply not delayed, and that is logged once. An entry whose delay has
 * passed stays until the destination succeeds, so a further failure grows the delay from
 * where it was rather than starting over.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/federation/transport/fed_backoff.h"
#include "core/runtime/keytab.h"

#define FED_BACKOFF_DB_WAIT_MS 5000    /* a writer waits this long for a connection */
#define FED_BACKOFF_LOAD_WAIT_MS 10000 /* start-up waits this long to read the table */
#define FED_BACKOFF_TABLE_LOAD 4       /* keys per bucket when the table is full */
#define FED_BACKOFF_POOL_NAME "core.federation_backoff"

typedef struct dest_ent {
    rt_keyent ke; /* ke.key is name */
    char *name;
    int64_t failure_ts, retry_last_ts, interval_ms;
} dest_ent;

struct fed_backoff {
    fed_backoff_settings s;
    db_pool *db;
    rt_pool *writer;
    pthread_mutex_t mu;
    pthread_cond_t drained;
    rt_keytab tab;
    int pending; /* writes queued or running */
    bool started; /* the writer runs (only then can pending writes drain) */
    bool full_logged;
    uint64_t rng; /* xorshift64*, for the jitter */
    rt_metric *m_dests, *m_dropped;
};

typedef struct write_task {
    fed_backoff *b;
    bool remove;
    int64_t failure_ts, retry_last_ts, interval_ms;
    char dest[]; /* NUL-terminated */
} write_task;

void fed_backoff_settings_defaults(fed_backoff_settings *s)
{
    if (s->min_interval_ms <= 0) s->min_interval_ms = FED_BACKOFF_DEFAULT_MIN_INTERVAL_MS;
    if (!(s->multiplier >= 1.0)) s->multiplier = FED_BACKOFF_DEFAULT_MULTIPLIER;
    if (s->max_interval_ms <= 0) s->max_interval_ms = FED_BACKOFF_DEFAULT_MAX_INTERVAL_MS;
    if (s->max_interval_ms < s->min_interval_ms) s->max_interval_ms = s->min_interval_ms;
    if (!(s->jitter > 0.0)) s->jitter = FED_BACKOFF_DEFAULT_JITTER;
    if (s->max_destinations <= 0) s->max_destinations = FED_BACKOFF_DEFAULT_MAX_DESTINATIONS;
    if (s->write_queue_depth <= 0) s->write_queue_depth = FED_BACKOFF_DEFAULT_WRITE_QUEUE;
}

int64_t fed_backoff_next_interval_ms(const fed_backoff_settings *s, int64_t prev_interval_ms,
                                     double u)
{
    double base = prev_interval_ms > 0 ? (double)prev_interval_ms * s->multiplier
                                       : (double)s->min_interval_ms;
    if (base < (double)s->min_interval_ms) base = (double)s->min_interval_ms;
    double next = base + base * s->jitter * (u < 0 ? 0 : u >= 1 ? 1 : u);
    /* Compared as doubles first: prev * multiplier may be past what int64_t holds. */
    if (!(next < (double)s->max_interval_ms)) return s->max_interval_ms;
    return (int64_t)next;
}

fed_backoff *fed_backoff_new(const fed_backoff_settings *s, db_pool *db, rt_metrics *metrics)
{
    fed_backoff *b = calloc(1, sizeof(*b));
    if (!b) return NULL;
    if (s) b->s = *s;
    fed_backoff_settings_defaults(&b->s);
    b->db = db;
    size_t buckets = (size_t)b->s.max_destinations / FED_BACKOFF_TABLE_LOAD + 1;
    if (rt_keytab_init(&b->tab, buckets) < 0) {
        free(b);
        return NULL;
    }
    b->writer = rt_pool_new(FED_BACKOFF_POOL_NAME, 1, b->s.write_queue_depth, metrics);
    if (!b->writer) {
        rt_keytab_destroy(&b->tab);
        free(b);
        return NULL;
    }
    pthread_mutex_init(&b->mu, NULL);
    rt_cond_init(&b->drained);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    b->rng = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ (uint64_t)(uintptr_t)b;
    if (!b->rng) b->rng = 0x9e3779b97f4a7c15ULL;
    b->m_dests = rt_metric_gauge(metrics, "atrium_federation_backoff_destinations", NULL,
                                 "Destinations whose requests are delayed after failures");
    b->m_dropped = rt_metric_counter(metrics, "atrium_federation_backoff_writes_dropped_total",
                                     NULL,
                                     "Backoff changes not written to PostgreSQL (queue full)");
    return b;
}

/* A uniform double in [0, 1); under b->mu. */
static double next_uniform_locked(fed_backoff *b)
{
    b->rng ^= b->rng >> 12;
    b->rng ^= b->rng << 25;
    b->rng ^= b->rng >> 27;
    return (double)((b->rng * 0x2545F4914F6CDD1DULL) >> 11) / (double)(1ULL << 53);
}

static dest_ent *find_locked(fed_backoff *b, const char *dest)
{
    rt_keyent *e = rt_keytab_find(&b->tab, dest, rt_keytab_hash(&b->tab, dest));
    return (dest_ent *)e;
}

/* A new entry for dest, or NULL when the table is full or memory is out. */
static dest_ent *insert_locked(fed_backoff *b, const char *dest)
{
    if (b->tab.count >= (size_t)b->s.max_destinations) {
        if (!b->full_logged)
            rt_log(ATRIUM_LOG_WARN, "core",
                   "federation backoff: %d destinations are in backoff already; further failing "
                   "destinations are not delayed",
                   b->s.max_destinations);
        b->full_logged = true;
        return NULL;
    }
    dest_ent *e = calloc(1, sizeof(*e));
    char *name = strdup(dest);
    if (!e || !name) {
        free(e);
        free(name);
        return NULL;
    }
    e->name = name;
    e->ke.key = name;
    e->ke.hash = rt_keytab_hash(&b->tab, name);
    rt_keytab_insert(&b->tab, &e->ke);
    rt_metric_set(b->m_dests, (int64_t)b->tab.count);
    return e;
}

static void remove_locked(fed_backoff *b, dest_ent *e)
{
    rt_keytab_remove(&b->tab, &e->ke);
    free(e->name);
    free(e);
    rt_metric_set(b->m_dests, (int64_t)b->tab.count);
    if (b->tab.count < (size_t)b->s.max_destinations) b->full_logged = false;
}

/* ---- the writer ------------------------------------------------------------------------ */

static void write_one(fed_backoff *b, const write_task *t)
{
    PGconn *c = db_acquire_background(b->db, FED_BACKOFF_DB_WAIT_MS);
    if (!c) {
        rt_log(ATRIUM_LOG_WARN, "core",
               "federation backoff: no database connection; the state of %s is not saved",
               t->dest);
        return;
    }
    char failure[24], last[24], interval[24];
    snprintf(failure, sizeof(failure), "%lld", (long long)t->failure_ts);
    snprintf(last, sizeof(last), "%lld", (long long)t->retry_last_ts);
    snprintf(interval, sizeof(interval), "%lld", (long long)t->interval_ms);
    const char *params[4] = {t->dest, failure, last, interval};
    PGresult *res =
        t->remove
            ? db_query(c, "DELETE FROM federation_destinations WHERE destination = $1", 1, params)
            : db_query(c,
                       "INSERT INTO federation_destinations"
                       " (destination, failure_ts, retry_last_ts, retry_interval_ms)"
                       " VALUES ($1, $2, $3, $4) ON CONFLICT (destination) DO UPDATE SET"
                       " failure_ts = EXCLUDED.failure_ts,"
                       " retry_last_ts = EXCLUDED.retry_last_ts,"
                       " retry_interval_ms = EXCLUDED.retry_interval_ms",
                       4, params);
    if (PQresultStatus(res) != PGRES_COMMAND_OK)
        rt_log(ATRIUM_LOG_WARN, "core", "federation backoff: saving the state of %s failed: %s",
               t->dest, PQresultErrorMessage(res));
    PQclear(res);
    db_release(b->db, c);
}

static void write_task_run(void *arg, bool cancelled)
{
    write_task *t = arg;
    fed_backoff *b = t->b;
    if (!cancelled) write_one(b, t);
    free(t);
    pthread_mutex_lock(&b->mu);
    b->pending--;
    pthread_cond_broadcast(&b->drained);
    pthread_mutex_unlock(&b->mu);
}

/* Queue the write of e's state (remove: its deletion); under b->mu. */
static void queue_write_locked(fed_backoff *b, const char *dest, const dest_ent *e, bool remove)
{
    if (!b->db) return;
    size_t n = strlen(dest) + 1;
    write_task *t = malloc(sizeof(*t) + n);
    int rc = ATRIUM_E_NOMEM;
    if (t) {
        t->b = b;
        t->remove = remove;
        t->failure_ts = e ? e->failure_ts : 0;
        t->retry_last_ts = e ? e->retry_last_ts : 0;
        t->interval_ms = e ? e->interval_ms : 0;
        memcpy(t->dest, dest, n);
        b->pending++; /* before submit: the task may end before submit returns */
        rc = rt_pool_submit(b->writer, write_task_run, t);
        if (rc < 0) {
            b->pending--;
            free(t);
        }
    }
    if (rc < 0) {
        rt_metric_add(b->m_dropped, 1);
        rt_log(ATRIUM_LOG_WARN, "core",
               "federation backoff: the change for %s is not saved (%s); it holds in memory",
               dest, rc == ATRIUM_E_LIMIT ? "the write queue is full" : "the writer is stopped");
    }
}

/* ---- the operations ---------------------------------------------------------------------- */

int fed_backoff_load(fed_backoff *b)
{
    if (!b->db) return 0;
    PGconn *c = db_acquire_background(b->db, FED_BACKOFF_LOAD_WAIT_MS);
    if (!c) {
        rt_log(ATRIUM_LOG_ERROR, "core", "federation backoff: no database connection to read it");
        return ATRIUM_E_DB;
    }
    PGresult *res = PQexec(c, "SELECT destination, coalesce(failure_ts, 0), retry_last_ts,"
                              " retry_interval_ms FROM federation_destinations"
                              " WHERE retry_interval_ms > 0");
    int rc = 0;
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        rt_log(ATRIUM_LOG_ERROR, "core", "federation backoff: reading federation_destinations: %s",
               PQresultErrorMessage(res));
        rc = ATRIUM_E_DB;
    } else {
        int loaded = 0;
        pthread_mutex_lock(&b->mu);
        for (int i = 0; i < PQntuples(res); i++) {
            const char *dest = PQgetvalue(res, i, 0);
            dest_ent *e = find_locked(b, dest);
            if (!e) e = insert_locked(b, dest);
            if (!e) break;
            e->failure_ts = strtoll(PQgetvalue(res, i, 1), NULL, 10);
            e->retry_last_ts = strtoll(PQgetvalue(res, i, 2), NULL, 10);
            e->interval_ms = strtoll(PQgetvalue(res, i, 3), NULL, 10);
            loaded++;
        }
        pthread_mutex_unlock(&b->mu);
        if (loaded)
            rt_log(ATRIUM_LOG_INFO, "core", "federation backoff: %d destination(s) in backoff",
                   loaded);
    }
    PQclear(res);
    db_release(b->db, c);
    return rc;
}

int fed_backoff_start(fed_backoff *b)
{
    int rc = rt_pool_start(b->writer);
    pthread_mutex_lock(&b->mu);
    b->started = rc == 0;
    pthread_mutex_unlock(&b->mu);
    return rc;
}

int64_t fed_backoff_retry_in_ms(fed_backoff *b, const char *dest, int64_t now_wall_ms)
{
    int64_t left = 0;
    pthread_mutex_lock(&b->mu);
    dest_ent *e = find_locked(b, dest);
    if (e) left = e->retry_last_ts + e->interval_ms - now_wall_ms;
    pthread_mutex_unlock(&b->mu);
    return left > 0 ? left : 0;
}

void fed_backoff_failure(fed_backoff *b, const char *dest)
{
    int64_t now = rt_wall_ms();
    pthread_mutex_lock(&b->mu);
    dest_ent *e = find_locked(b, dest);
    if (!e && (e = insert_locked(b, dest)) != NULL) e->failure_ts = now;
    if (e) {
        double u = next_uniform_locked(b);
        e->interval_ms = fed_backoff_next_interval_ms(&b->s, e->interval_ms, u);
        e->retry_last_ts = now;
        queue_write_locked(b, dest, e, false);
    }
    pthread_mutex_unlock(&b->mu);
}

bool fed_backoff_success(fed_backoff *b, const char *dest)
{
    pthread_mutex_lock(&b->mu);
    dest_ent *e = find_locked(b, dest);
    if (e) {
        remove_locked(b, e);
        queue_write_locked(b, dest, NULL, true);
    }
    pthread_mutex_unlock(&b->mu);
    return e != NULL;
}

int fed_backoff_count(fed_backoff *b)
{
    pthread_mutex_lock(&b->mu);
    int n = (int)b->tab.count;
    pthread_mutex_unlock(&b->mu);
    return n;
}

void fed_backoff_stop(fed_backoff *b, int64_t drain_ms)
{
    if (!b) return;
    int64_t until = rt_now_ms() + (drain_ms > 0 ? drain_ms : 0);
    pthread_mutex_lock(&b->mu);
    /* Only a started writer can drain; an unstarted one ends its queue cancelled below. */
    while (b->pending > 0 && b->started && rt_now_ms() < until)
        if (rt_scope_wait(&b->drained, &b->mu, until) == ATRIUM_E_TIMEOUT) break;
    int left = b->pending;
    pthread_mutex_unlock(&b->mu);
    if (left > 0)
        rt_log(ATRIUM_LOG_WARN, "core", "federation backoff: %d change(s) not saved at shutdown",
               left);
    rt_pool_stop(b->writer);
    rt_pool_join(b->writer);
}

void fed_backoff_free(fed_backoff *b)
{
    if (!b) return;
    rt_pool_free(b->writer);
    rt_keyent *k;
    while ((k = rt_keytab_pop_any(&b->tab)) != NULL) {
        dest_ent *e = (dest_ent *)k;
        free(e->name);
        free(e);
    }
    rt_keytab_destroy(&b->tab);
    pthread_cond_destroy(&b->drained);
    pthread_mutex_destroy(&b->mu);
    free(b);
}
