/*
 * plugins/media/cache.c - the remote cache's bound: last access recorded in batches,
 * eviction of the least recently used copies past remote_cache_max_bytes, and the
 * Synapse-shaped admin purge (POST /_synapse/admin/v1/purge_media_cache?before_ts=).
 *
 * Decisions owned here:
 *   - a cache hit does not write to PostgreSQL: it adds (origin, media ID) to an in-memory
 *     batch, written as one UPDATE of last_access_ts when the batch is full or older than
 *     CACHE_ACCESS_FLUSH_MS (on the io pool), and always before an eviction picks its
 *     victims;
 *   - the bytes of media_remote are counted in memory (read once at start, then kept up
 *     to date by every store and removal); when a stored copy takes the total past
 *     remote_cache_max_bytes (0 = no bound), the copies accessed longest ago are removed,
 *     a batch at a time, until it fits: row first, then the file (and the origin's
 *     thumbnails of that media). A request already reading a removed copy keeps its
 *     descriptor (unlinking never tears an open file); one that read the row but had not
 *     opened the file yet sees it missing and fetches it again;
 *   - the purge removes every copy (and origin thumbnail) last accessed before before_ts,
 *     like Synapse's, answering {"deleted": n}; it runs on the io pool.
 *   - with several processes on one database and store (cluster.c), eviction runs in one
 *     of them at a time, the holder of the lease "remote_cache.evict": it recounts the
 *     total from PostgreSQL before each pass (the others' copies count), and the others,
 *     instead of evicting, announce each copy they store on "cache.stored" so the holder
 *     looks. A host without leases evicts in every process, each on its own count.
 * Thumbnails rendered here from remote originals live with local thumbnails, keyed by
 * content hash, and are not counted. With storage: s3 a removed copy's object goes too,
 * and every process drops its local copy (forget_gone). The removal then waits on the
 * store: it runs on the fetch pool (after a store) or the io pool (the purge, a check
 * asked by another process), never on a request-pool thread.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "media.h"
#include "s3.h"

#define CACHE_ACCESS_BATCH 256      /* touches written in one UPDATE */
#define CACHE_ACCESS_FLUSH_MS 10000 /* ... or after this long */
#define CACHE_EVICT_BATCH 32        /* copies removed per DELETE */
#define CACHE_KEY_MAX (MEDIA_SERVER_NAME_MAX_CHARS + MEDIA_ID_MAX_CHARS + 2)
#define I64_CHARS 24

typedef struct access_batch {
    media *m;
    size_t n;
    char origin[CACHE_ACCESS_BATCH][MEDIA_SERVER_NAME_MAX_CHARS + 1];
    char media_id[CACHE_ACCESS_BATCH][MEDIA_ID_MAX_CHARS + 1];
    int64_t at_ms[CACHE_ACCESS_BATCH]; /* wall clock of each access */
} access_batch;

struct remote_cache {
    pthread_mutex_t mu;
    atomic_bool evict_queued; /* an eviction check asked by another process is queued */
    access_batch *pending; /* touches not yet written */
    int64_t pending_since_ms;
    int64_t bytes;         /* of media_remote, as counted */
    pthread_mutex_t evict_mu; /* one eviction at a time */
};

int cache_init(media *m)
{
    m->cache = calloc(1, sizeof(*m->cache));
    if (!m->cache) return ATRIUM_E_NOMEM;
    pthread_mutex_init(&m->cache->mu, NULL);
    pthread_mutex_init(&m->cache->evict_mu, NULL);
    return 0;
}

void cache_fini(media *m)
{
    if (!m->cache) return;
    free(m->cache->pending);
    pthread_mutex_destroy(&m->cache->mu);
    pthread_mutex_destroy(&m->cache->evict_mu);
    free(m->cache);
    m->cache = NULL;
}

/* The gauge from the count; called without mu held (an eviction may run meanwhile). */
static void publish(media *m)
{
    pthread_mutex_lock(&m->cache->mu);
    int64_t bytes = m->cache->bytes;
    pthread_mutex_unlock(&m->cache->mu);
    m->h->metric_set(m->m_remote_cache_bytes, bytes);
}

int cache_start(media *m)
{
    const atrium_host *h = m->h;
    PGconn *c = h->db_acquire(MEDIA_DB_WAIT_MS);
    if (!c) return ATRIUM_E_DB;
    PGresult *res = PQexec(c, "SELECT coalesce(sum(size_bytes), 0) FROM media_remote");
    int rc = ATRIUM_E_DB;
    if (PQresultStatus(res) == PGRES_TUPLES_OK) {
        int64_t bytes = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
        pthread_mutex_lock(&m->cache->mu);
        m->cache->bytes = bytes;
        pthread_mutex_unlock(&m->cache->mu);
        rc = 0;
    } else {
        h->log(m->self, ATRIUM_LOG_ERROR, "cannot read the remote cache's size: %s",
               PQresultErrorMessage(res));
    }
    PQclear(res);
    media_db_claims_prune(h, m->self, c); /* lapsed claims (cluster.c): housekeeping only */
    h->db_release(c);
    publish(m);
    return rc;
}

/* ---- last access --------------------------------------------------------------------- */

static void write_batch(media *m, PGconn *c, const access_batch *b)
{
    if (b->n == 0) return;
    /* Two arrays, unnested pairwise: one statement for the whole batch. */
    size_t cap = b->n * (MEDIA_SERVER_NAME_MAX_CHARS + MEDIA_ID_MAX_CHARS + 8) + 8;
    size_t ts_cap = b->n * (I64_CHARS + 1) + 8;
    char *origins = malloc(cap), *ids = malloc(cap), *ts = malloc(ts_cap);
    if (!origins || !ids || !ts) {
        free(origins);
        free(ids);
        free(ts);
        return;
    }
    size_t on = 0, in = 0, tn = 0;
    origins[on++] = '{';
    ids[in++] = '{';
    ts[tn++] = '{';
    for (size_t i = 0; i < b->n; i++) {
        /* Server names and media IDs are validated: no quotes, commas or braces. */
        on += (size_t)snprintf(origins + on, cap - on, "%s\"%s\"", i ? "," : "", b->origin[i]);
        in += (size_t)snprintf(ids + in, cap - in, "%s\"%s\"", i ? "," : "", b->media_id[i]);
        tn += (size_t)snprintf(ts + tn, ts_cap - tn, "%s%" PRId64, i ? "," : "", b->at_ms[i]);
    }
    snprintf(origins + on, cap - on, "}");
    snprintf(ids + in, cap - in, "}");
    snprintf(ts + tn, ts_cap - tn, "}");
    const char *p[] = {origins, ids, ts};
    PGresult *res = PQexecParams(c,
                                 "UPDATE media_remote r SET last_access_ts ="
                                 " greatest(r.last_access_ts, t.at_ms)"
                                 " FROM (SELECT origin, media_id, max(at_ms) AS at_ms FROM"
                                 " unnest($1::text[], $2::text[], $3::bigint[])"
                                 " AS u(origin, media_id, at_ms) GROUP BY 1, 2) t"
                                 " WHERE r.origin = t.origin AND r.media_id = t.media_id",
                                 3, NULL, p, NULL, NULL, 0);
    if (PQresultStatus(res) != PGRES_COMMAND_OK)
        m->h->log(m->self, ATRIUM_LOG_WARN, "cannot record remote media accesses: %s",
                  PQresultErrorMessage(res));
    PQclear(res);
    free(origins);
    free(ids);
    free(ts);
}

static void flush_task(void *arg, bool cancelled)
{
    access_batch *b = arg;
    media *m = b->m;
    PGconn *c = cancelled ? NULL : m->h->db_acquire(MEDIA_DB_WAIT_MS);
    if (c) {
        write_batch(m, c, b);
        m->h->db_release(c);
    }
    free(b);
}

/* Take the pending batch (under mu). */
static access_batch *take_pending(remote_cache *rc)
{
    access_batch *b = rc->pending;
    rc->pending = NULL;
    return b;
}

void cache_touch(media *m, const char *origin, const char *media_id)
{
    remote_cache *rc = m->cache;
    access_batch *full = NULL;
    int64_t now = m->h->now_ms();
    pthread_mutex_lock(&rc->mu);
    if (!rc->pending) {
        rc->pending = calloc(1, sizeof(*rc->pending));
        rc->pending_since_ms = now;
        if (rc->pending) rc->pending->m = m;
    }
    access_batch *b = rc->pending;
    if (b && b->n < CACHE_ACCESS_BATCH) {
        snprintf(b->origin[b->n], sizeof(b->origin[b->n]), "%s", origin);
        snprintf(b->media_id[b->n], sizeof(b->media_id[b->n]), "%s", media_id);
        b->at_ms[b->n] = media_wall_ms();
        b->n++;
    }
    if (b && (b->n == CACHE_ACCESS_BATCH || now - rc->pending_since_ms >= CACHE_ACCESS_FLUSH_MS))
        full = take_pending(rc);
    pthread_mutex_unlock(&rc->mu);
    if (full && m->h->pool_submit(m->io_pool, flush_task, full) < 0) free(full);
}

/* ---- removal --------------------------------------------------------------------------- */

/* The copies whose rows a statement removed: their files go at once, their objects and
 * the other processes' copies after the database connection is given back (forget_gone:
 * a DELETE waits on the store). */
typedef struct gone_list {
    size_t n;
    char (*names)[MEDIA_FILE_NAME_MAX];
} gone_list;

/* A copy whose row went: its file here (a reader's open descriptor stays valid), kept in
 * the list for forget_gone (dropped when there is no memory: the orphan sweeps take it). */
static void forget_file(media *m, gone_list *g, const char *file_name, size_t cap)
{
    char path[MEDIA_PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", m->cfg.store_path, file_name);
    unlink(path);
    fdcache_forget(m, path);
    if (!s3_enabled(m)) return;
    if (!g->names && cap && !(g->names = calloc(cap, sizeof(*g->names)))) return;
    if (g->names && g->n < cap) snprintf(g->names[g->n++], MEDIA_FILE_NAME_MAX, "%s", file_name);
}

/* With no connection held: storage: s3 - each copy's object, and every process's local
 * copy (remote_s3.c, store_gone.c). Frees the list. */
static void forget_gone(media *m, gone_list *g)
{
    for (size_t i = 0; i < g->n; i++) {
        remote_s3_forget(m, g->names[i]);
        store_gone_publish(m, 'r', g->names[i]);
    }
    free(g->names);
    g->names = NULL;
    g->n = 0;
}

/* Run a DELETE ... RETURNING file_name, size_bytes, is_original; unlink each file and
 * count the originals' bytes out. Returns the number of originals removed, or -1. */
static int64_t remove_returned(media *m, PGconn *c, const char *sql, int n, const char *const *p,
                               gone_list *g)
{
    PGresult *res = PQexecParams(c, sql, n, NULL, p, NULL, NULL, 0);
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        m->h->log(m->self, ATRIUM_LOG_ERROR, "remote cache removal failed: %s",
                  PQresultErrorMessage(res));
        PQclear(res);
        return -1;
    }
    int64_t originals = 0, bytes = 0;
    for (int i = 0; i < PQntuples(res); i++) {
        forget_file(m, g, PQgetvalue(res, i, 0), (size_t)PQntuples(res));
        if (PQgetvalue(res, i, 2)[0] == 't') {
            originals++;
            bytes += strtoll(PQgetvalue(res, i, 1), NULL, 10);
        }
    }
    PQclear(res);
    pthread_mutex_lock(&m->cache->mu);
    m->cache->bytes -= bytes;
    pthread_mutex_unlock(&m->cache->mu);
    publish(m);
    return originals;
}

/* The copies of these media and the origins' thumbnails of them go together. */
#define REMOVE_TAIL                                                                                \
    " RETURNING r.origin, r.media_id, r.file_name, r.size_bytes),"                                         \
    " thumbs AS (DELETE FROM media_remote_thumbnails t USING gone g"                               \
    " WHERE t.origin = g.origin AND t.media_id = g.media_id RETURNING t.file_name)"                \
    " SELECT file_name, size_bytes, true FROM gone"                                                \
    " UNION ALL SELECT file_name, 0, false FROM thumbs"

/* The total of media_remote, every process's copies, into rc->bytes. */
static int recount(media *m, PGconn *c)
{
    PGresult *res = PQexec(c, "SELECT coalesce(sum(size_bytes), 0) FROM media_remote");
    int rc = ATRIUM_E_DB;
    if (PQresultStatus(res) == PGRES_TUPLES_OK) {
        pthread_mutex_lock(&m->cache->mu);
        m->cache->bytes = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
        pthread_mutex_unlock(&m->cache->mu);
        publish(m);
        rc = 0;
    } else {
        m->h->log(m->self, ATRIUM_LOG_WARN, "cannot count the remote cache: %s",
                  PQresultErrorMessage(res));
    }
    PQclear(res);
    return rc;
}

/* Past remote_cache_max_bytes: remove the least recently used copies until the cache fits.
 * With `shared` (several processes share the cache, and this one holds the eviction
 * lease) the total is recounted from PostgreSQL first, since the others' copies count
 * too. Blocks on PostgreSQL and the disk. */
static void evict_over_bound(media *m, bool shared)
{
    remote_cache *rc = m->cache;
    const atrium_host *h = m->h;
    pthread_mutex_lock(&rc->evict_mu);
    PGconn *c = h->db_acquire(MEDIA_DB_WAIT_MS);
    if (!c || (shared && recount(m, c) < 0)) {
        if (c) h->db_release(c);
        pthread_mutex_unlock(&rc->evict_mu);
        return; /* the next store tries again */
    }
    pthread_mutex_lock(&rc->mu);
    bool over = rc->bytes > m->cfg.remote_cache_max_bytes;
    access_batch *b = over ? take_pending(rc) : NULL;
    pthread_mutex_unlock(&rc->mu);
    if (b) write_batch(m, c, b); /* recent accesses count before victims are chosen */
    free(b);
    pthread_mutex_lock(&rc->mu);
    int64_t excess = rc->bytes - m->cfg.remote_cache_max_bytes;
    pthread_mutex_unlock(&rc->mu);
    gone_list gone = {0};
    if (over && excess > 0) {
        char excess_s[I64_CHARS];
        snprintf(excess_s, sizeof(excess_s), "%" PRId64, excess);
        const char *p[] = {excess_s};
        /* The shortest prefix, oldest access first, whose bytes cover the excess. */
        int64_t n = remove_returned(
            m, c,
            "WITH ordered AS (SELECT origin, media_id, size_bytes, sum(size_bytes) OVER"
            " (ORDER BY last_access_ts, fetched_ts, origin, media_id) AS upto FROM media_remote),"
            " gone AS (DELETE FROM media_remote r USING ordered o WHERE r.origin = o.origin"
            " AND r.media_id = o.media_id AND o.upto - o.size_bytes < $1::bigint" REMOVE_TAIL,
            1, p, &gone);
        if (n > 0) {
            h->metric_add(m->m_remote_evictions, n);
            h->log(m->self, ATRIUM_LOG_INFO,
                   "remote cache over remote_cache_max_bytes: %" PRId64 " least recently used "
                   "cop%s removed",
                   n, n == 1 ? "y" : "ies");
        }
    }
    h->db_release(c);
    forget_gone(m, &gone);
    pthread_mutex_unlock(&rc->evict_mu);
}

void cache_stored(media *m, int64_t bytes)
{
    remote_cache *rc = m->cache;
    pthread_mutex_lock(&rc->mu);
    rc->bytes += bytes;
    bool over = m->cfg.remote_cache_max_bytes > 0 && rc->bytes > m->cfg.remote_cache_max_bytes;
    pthread_mutex_unlock(&rc->mu);
    publish(m);
    if (m->cfg.remote_cache_max_bytes <= 0) return;
    if (!cluster_shared_eviction(m)) { /* one process: its own count is the total */
        if (over) evict_over_bound(m, false);
        return;
    }
    /* Several processes: eviction runs once, in the lease holder, on the real total. */
    if (cluster_evicts_here(m)) {
        evict_over_bound(m, true);
        return;
    }
    char b[I64_CHARS];
    snprintf(b, sizeof(b), "%" PRId64, bytes);
    cluster_publish(m, MEDIA_CH_STORED, b);
}

static void evict_task(void *arg, bool cancelled)
{
    media *m = arg;
    atomic_store(&m->cache->evict_queued, false);
    if (!cancelled && cluster_evicts_here(m)) evict_over_bound(m, true);
}

void cache_stored_elsewhere(media *m)
{
    if (m->cfg.remote_cache_max_bytes <= 0 || !cluster_evicts_here(m)) return;
    if (atomic_exchange(&m->cache->evict_queued, true)) return; /* one check covers both */
    if (m->h->pool_submit(m->io_pool, evict_task, m) < 0)
        atomic_store(&m->cache->evict_queued, false);
}

int cache_purge(media *m, int64_t before_ts, int64_t *deleted)
{
    const atrium_host *h = m->h;
    PGconn *c = h->db_acquire(MEDIA_DB_WAIT_MS);
    if (!c) return ATRIUM_E_DB;
    pthread_mutex_lock(&m->cache->mu);
    access_batch *b = take_pending(m->cache);
    pthread_mutex_unlock(&m->cache->mu);
    if (b) write_batch(m, c, b);
    free(b);
    char ts[I64_CHARS];
    snprintf(ts, sizeof(ts), "%" PRId64, before_ts);
    const char *p[] = {ts};
    gone_list gone = {0}, thumbs = {0};
    int64_t n = remove_returned(m, c,
                                "WITH gone AS (DELETE FROM media_remote r"
                                " WHERE r.last_access_ts < $1::bigint" REMOVE_TAIL,
                                1, p, &gone);
    /* Origins' thumbnails of media whose original was never fetched. */
    PGresult *res = n < 0 ? NULL
                          : PQexecParams(c,
                                         "DELETE FROM media_remote_thumbnails"
                                         " WHERE fetched_ts < $1::bigint RETURNING file_name",
                                         1, NULL, p, NULL, NULL, 0);
    if (res && PQresultStatus(res) == PGRES_TUPLES_OK)
        for (int i = 0; i < PQntuples(res); i++)
            forget_file(m, &thumbs, PQgetvalue(res, i, 0), (size_t)PQntuples(res));
    PQclear(res);
    h->db_release(c);
    forget_gone(m, &gone);
    forget_gone(m, &thumbs);
    if (n < 0) return ATRIUM_E_DB;
    *deleted = n;
    return 0;
}
