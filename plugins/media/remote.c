/*
 * plugins/media/remote.c - another server's media: the remote cache, and the one fetch
 * per remote file that fills it (docs/adr/0005-remote-media-fetch-pool.md).
 *
 * A download or thumbnail whose serverName is not ours comes here from delivery_locate,
 * after the delivery slot and the access token. The path, in order:
 *   1. defer mode (the request pool; ATRIUM_SCOPE_FETCH_MODE absent or DEFER): the quick
 *      part - 404 M_NOT_FOUND when remote fetching is off (remote_fetch_enabled), the
 *      request says allow_remote=false, or the origin is in prevent_media_downloads_from;
 *      the remote-cache look-up (a row in media_remote whose file exists; quarantine by
 *      ID or hash is 404 like missing media); on a hit the request is served like local
 *      media, with the cached copy's path;
 *   2. on a miss: a slot of the fetch budget (fetch_budget.c: a hold, or a parked wait in
 *      its fair line, or 429), then a handoff to the fetch pool with FETCH_MODE=ADMITTED
 *      and RATE_ADMITTED published;
 *   3. admitted mode (the fetch pool): the cache is looked at again (a fetch may have
 *      landed meanwhile), then the request joins the fetch of its file - starting it if
 *      none runs - and parks (host->req_wait) until the fetch ends: the one fetch per
 *      (origin, media ID) is the coalescing, and every request for the file, the first
 *      included, waits the same way. A fetch that ends between a request's look-up and
 *      its join would otherwise be started again: the table counts landed fetches, and a
 *      request that finds no fetch running but a count moved since its look-up looks
 *      again (REMOTE_MAX_LOOK_AGAIN times at most);
 *   4. woken on the request pool, it reads the stored copy (step 1's look-up again), or
 *      answers the fetch's failure.
 *
 * Why no thread ever waits on the peer: host->fed_request is asynchronous. The fetch pool
 * thread that starts a fetch only opens the temporary file and queues the request (both
 * local and quick) and returns; the request waits parked, holding no thread. The answer
 * arrives on the core's outbound-client thread, in on_chunk, which only parses the
 * multipart framing, hashes and write(2)s the bytes to the temporary file - never fsync,
 * never PostgreSQL. When the transfer ends, on_done queues the rest (fsync, link under the
 * final name, the image header probe, the media_remote row) on the fetch pool: local work
 * that may take milliseconds but never waits on another server. So a peer that never
 * answers holds neither request-pool nor fetch-pool threads: only its fetch budget slots
 * (until each waiting request's deadline) and its outbound connection.
 *
 * The fetch (Matrix server-server API, "Content repository"): first the authenticated
 * GET /_matrix/federation/v1/media/download/{mediaId} (signed), a multipart/mixed answer
 * read as it arrives (multipart.c); when the origin says the endpoint is unknown (404 or
 * 405 with M_UNRECOGNIZED, a 404 without a Matrix error, or 400), the legacy
 * GET /_matrix/media/v3/download/{origin}/{mediaId}?allow_remote=false&allow_redirect=true.
 * The body is capped at max_upload_size while it is read (the transfer is aborted past
 * it). The bytes go to a temporary file (store.c), fsynced and given a fresh name, and
 * only then the row is written: a fetch cut off midway, garbage, or too large leaves
 * nothing in the cache. A later copy of the same file gets a new name (the row is
 * switched to it and the old file unlinked), so a reader holding the old descriptor is
 * never torn.
 *
 * The codes (Element does not retry media, so they must be exact): 404 M_NOT_FOUND only
 * when the origin says the file does not exist; 502 M_UNKNOWN for an unreachable origin,
 * a garbage or truncated answer, or any other failure of the origin; 502 M_TOO_LARGE past
 * max_upload_size; 504 when the request's own deadline passes (timeout_ms, default
 * upload_wait_default_ms, capped at upload_wait_max_ms, counted from the request's first
 * run, the waits in the fetch line included); all with Cache-Control: no-store.
 *
 * Per-origin cap: at most remote_fetch_max_per_origin fetches of one origin run at once;
 * the next wait (as jobs, their requests parked on them) and start, in order, when one of
 * that origin's ends - unless every request that wanted one has been answered meanwhile
 * (then it ends without asking). So one dead or slow origin holds at most that many
 * outbound transfers, and other origins are fetched as usual.
 *
 * Negative cache: a 404 or a too-large file is remembered for remote_not_found_cache_ms,
 * an unreachable origin or a garbage answer for remote_failure_cache_ms (per remote file,
 * in memory, at most REMOTE_NEGATIVE_MAX entries); meanwhile the same answer is given at
 * once, without a budget slot and without asking the origin again.
 *
 * An origin's 429 is absorbed: the fetch is asked again after the delay the origin names
 * (timer.c), within the transfer's deadline; see RETRY_429_BASE_MS.
 *
 * Remote thumbnails: while the original is not cached, a thumbnail request asks the
 * origin's GET /_matrix/federation/v1/media/thumbnail/{mediaId} for the configured size
 * thumbnail.c chose (one fetch per origin, media ID and size, like originals), stores it
 * in media_remote_thumbnails and serves it as it is. When the origin has none (any answer
 * but a complete multipart with a safe image type), that is remembered like a 404 and the
 * original is fetched and rendered here. Once the original is cached, thumbnails are
 * rendered from it.
 *
 * The cache's bound, last access and the purge live in cache.c.
 *
 * A Location part (the file lives elsewhere, e.g. a CDN), or a redirect (301, 302, 303,
 * 307, 308) of the legacy endpoint, is followed once: an unsigned GET of that https URL
 * through the same outbound client (host->fed_request's url), the address blacklist
 * applying at connect; its body is the file, capped the same way. Anything but a 200
 * there (another redirect included) is 502. Stored fetches are counted by the kind of
 * answer that delivered the file (atrium_media_remote_fetched_total{via=federation,
 * legacy, location}).
 *
 * Across processes sharing the database and the store, a fetch is claimed before it
 * starts (job_begin; remote_claim.c): a process that finds the claim held ends its job
 * with REMOTE_ELSEWHERE and its requests wait for the other's notification, then read
 * the copy it stored from the shared store.
 *
 * Streaming: a plain download waiting for an original follows its bytes as they are
 * written (see "following a file as it arrives" below). Requests waiting in another
 * process read the stored copy once it lands: they do not follow the bytes.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "media.h"

#define REMOTE_TABLE_BUCKETS 256
#define REMOTE_KEY_MAX (MEDIA_SERVER_NAME_MAX_CHARS + MEDIA_ID_MAX_CHARS + 2)
#define REMOTE_URI_MAX (2 * (MEDIA_SERVER_NAME_MAX_CHARS + MEDIA_ID_MAX_CHARS) + 128)
#define REMOTE_ERROR_BODY_MAX 4096 /* an error answer's body kept to read its errcode */
#define REMOTE_FRAMING_BYTES (MP_HEADERS_MAX * 2 + MP_JSON_MAX + 1024) /* multipart overhead */
#define DEFAULT_CONTENT_TYPE "application/octet-stream"
#define REMOTE_ORIGIN_BUCKETS 64
#define REMOTE_NEGATIVE_MAX 4096 /* remembered failures, at most */

enum remote_result {
    REMOTE_OK = 0,
    REMOTE_NOT_FOUND,   /* the origin says it does not exist */
    REMOTE_UNREACHABLE, /* no answer, or an answer other than the file */
    REMOTE_BAD_ANSWER,  /* garbage, truncated */
    REMOTE_TOO_LARGE,   /* past max_upload_size */
    REMOTE_INTERNAL,    /* our disk or database */
    REMOTE_STOPPING,
    REMOTE_ABANDONED, /* nobody waited for it any more: never started */
    REMOTE_NO_THUMBNAIL, /* the origin has no thumbnail for it: fetch the original */
    REMOTE_ELSEWHERE,    /* another process fetches it: wait for it (remote_claim.c) */
    REMOTE_ORIGIN_BUSY,  /* it kept answering 429 until the deadline (never remembered) */
};
#define REMOTE_STARTED (-1) /* job_begin: the transfer is under way */
#define REMOTE_MAX_ROUNDS 3 /* fetches one request may wait for (thumbnail, original, ...) */
#define REMOTE_MAX_LOOK_AGAIN 3 /* cache look-ups one request repeats before fetching anyway */
#define REMOTE_LOOK_AGAIN (MEDIA_GO + 2) /* join_fetch: a fetch landed since our miss: look again */
#define REMOTE_STREAMING (REMOTE_ORIGIN_BUSY + 1) /* a waiter's result: follow the landing */
/* An origin answering 429 (its own rate limiter: Synapse's federation limiter answers part
 * of a burst so) is asked again after the delay it names (retry_after_ms), else after
 * RETRY_429_BASE_MS doubling per try, at most RETRY_429_MAX_DELAY_MS, as long as the
 * transfer's deadline allows; the fetch keeps its per-origin slot meanwhile, which paces
 * that origin. Its 429 is never passed on to a client. */
#define RETRY_429_BASE_MS 200
#define RETRY_429_MAX_DELAY_MS 2000
#define RETRY_429_MAX_TRIES 20
/* Streams to waiters: the last bytes are held back until the file is stored and its hash
 * checked against the quarantine, so no client gets a whole file that fails either; and a
 * wake-up is sent per this many new bytes (and at the end), not per write. */
#define STREAM_TAIL_HOLD_BYTES (64 * 1024)
#define STREAM_SIGNAL_STEP_BYTES (64 * 1024)
/* A stream may wait this long past its fetch's own deadline (the commit's fsync and row). */
#define STREAM_COMMIT_SLACK_MS 10000

/* PHASE_LOCATION: the URL a multipart answer's Location part named (followed once). */
enum fetch_phase { PHASE_FEDERATION = 0, PHASE_LEGACY, PHASE_LOCATION };

struct remote_waiter {
    atrium_req *req;
    int result; /* enum remote_result, set (under the table's lock) before the wake */
    bool done;
    bool abandoned; /* its deadline answered it: the fetch need not start for it */
    bool stream;    /* it may follow the file as it arrives (REMOTE_STREAMING) */
    remote_landing *landing; /* with REMOTE_STREAMING: a reference for it */
    remote_waiter *next;
};

/* A remote file being fetched, as its followers see it: the bytes written so far (a
 * descriptor of the temporary file, read with pread) and how the fetch ended. Shared by
 * the fetch and every stream following it (refs); freed by the last. The writer (the
 * outbound client's thread) raises `readable` and signals `ev`; readers (request-pool
 * threads) never block. */
enum landing_state { LANDING_RUNNING = 0, LANDING_DONE, LANDING_FAILED };
struct remote_landing {
    atomic_int refs;
    int fd;
    atomic_int_least64_t readable; /* bytes followers may read now */
    atomic_int state;              /* enum landing_state; readable is final once DONE */
    int64_t signalled;             /* readable at the last signal (the writer's only) */
    atrium_event *ev;
    int64_t deadline_ms; /* when a follower stops waiting for bytes */
    char content_type[MEDIA_TYPE_MAX_BYTES + 1];
    char upload_name[MEDIA_NAME_MAX_BYTES + 1];
};

/* Fetches of one origin: how many run, and those waiting for the per-origin cap. */
typedef struct remote_origin {
    char origin[MEDIA_SERVER_NAME_MAX_CHARS + 1];
    int running;
    struct remote_job *pending_head, *pending_tail;
    struct remote_origin *next;
} remote_origin;

/* A remembered failure of one remote file (the negative cache). */
typedef struct remote_negative {
    char key[REMOTE_KEY_MAX];
    int result;
    int64_t until_ms;
    struct remote_negative *next;
} remote_negative;

typedef struct remote_job {
    char key[REMOTE_KEY_MAX];
    char origin[MEDIA_SERVER_NAME_MAX_CHARS + 1];
    char media_id[MEDIA_ID_MAX_CHARS + 1];
    media *m;
    bool thumb;        /* the origin's thumbnail of `size`, not the original */
    media_size size;
    remote_waiter *waiters; /* under the table's lock */
    struct remote_job *next;
    struct remote_job *pending_next; /* in its origin's pending list */
    bool running;                    /* counted in its origin's running fetches */
    bool counted;                    /* counted in atrium_media_remote_fetches_running */
    bool claimed;                    /* under this process's claim (remote_claim.c) */
    bool elsewhere;                  /* answered by another process's fetch: not counted */

    /* the transfer: written on the outbound client's thread, read after on_done */
    int phase;
    int outcome, status;
    bool started, bad, too_large, io_error;
    mp_parser *mp;
    store_tmp tmp;
    bool tmp_open;
    sha256_ctx sha;
    int64_t bytes;
    char content_type[MP_HEADER_VALUE_MAX], disposition[MP_HEADER_VALUE_MAX];
    char err_body[REMOTE_ERROR_BODY_MAX + 1];
    size_t err_len;
    char file_rel[MEDIA_FILE_NAME_MAX], file_abs[MEDIA_PATH_MAX];
    char location[MP_HEADER_VALUE_MAX]; /* PHASE_LOCATION's URL */
    char redirect[MP_HEADER_VALUE_MAX]; /* a 3xx answer's Location header */
    int64_t transfer_deadline_ms;       /* the current transfer's */
    remote_landing *landing; /* once file bytes flow (an original): set under the lock */
    bool quarantined;        /* job_commit: the stored copy's hash is quarantined */
    int tries_429;           /* answers of 429 so far */
} remote_job;

struct remote_table {
    pthread_mutex_t mu;
    remote_job *buckets[REMOTE_TABLE_BUCKETS];
    remote_origin *origins[REMOTE_ORIGIN_BUCKETS];
    remote_negative *negative[REMOTE_TABLE_BUCKETS];
    size_t n_negative;
    uint64_t landed; /* fetches that stored a file: a miss older than one may be stale */
};

int remote_init(media *m)
{
    m->remote = calloc(1, sizeof(*m->remote));
    if (!m->remote) return ATRIUM_E_NOMEM;
    pthread_mutex_init(&m->remote->mu, NULL);
    m->timer = media_timer_start(m->h);
    return m->timer ? 0 : ATRIUM_E_NOMEM;
}

void remote_fini(media *m)
{
    media_timer_stop(m->timer);
    m->timer = NULL;
    if (!m->remote) return;
    /* Retries not yet due ended with the timer (job_retry_due finds the pool stopped).
     * Jobs still listed belong to transfers the core cancelled at shutdown; their memory
     * goes with the process. */
    remote_table *t = m->remote;
    for (size_t i = 0; i < REMOTE_ORIGIN_BUCKETS; i++)
        for (remote_origin *o = t->origins[i], *next; o; o = next) {
            next = o->next;
            free(o);
        }
    for (size_t i = 0; i < REMOTE_TABLE_BUCKETS; i++)
        for (remote_negative *n = t->negative[i], *next; n; n = next) {
            next = n->next;
            free(n);
        }
    pthread_mutex_destroy(&m->remote->mu);
    free(m->remote);
    m->remote = NULL;
}

/* ---- answers ------------------------------------------------------------------------- */

/* The one mapping from a fetch's result to what the client is told. */
static int remote_respond_failure(media *m, atrium_req *req, int result, const char *origin)
{
    const atrium_host *h = m->h;
    switch (result) {
    case REMOTE_NOT_FOUND: h->respond_error(req, 404, "M_NOT_FOUND", "Media not found"); break;
    case REMOTE_TOO_LARGE:
        h->respond_error(req, 502, "M_TOO_LARGE",
                         "The remote file is larger than this server accepts");
        break;
    case REMOTE_BAD_ANSWER:
        h->respond_error(req, 502, "M_UNKNOWN", "%s sent a malformed answer for the media",
                         origin);
        break;
    case REMOTE_INTERNAL:
        h->respond_error(req, 503, "M_UNKNOWN", "The media could not be stored; retry shortly");
        break;
    case REMOTE_STOPPING: h->respond_error(req, 503, "M_UNKNOWN", "The server is stopping"); break;
    case REMOTE_ORIGIN_BUSY:
        h->respond_error(req, 502, "M_UNKNOWN", "%s kept refusing the fetch as too many",
                         origin);
        break;
    default:
        h->respond_error(req, 502, "M_UNKNOWN", "Could not fetch the media from %s", origin);
        break;
    }
    return ATRIUM_DONE;
}

static int respond_timeout(media *m, atrium_req *req)
{
    m->h->respond_error(req, 504, "M_UNKNOWN", "Timed out fetching the remote media; retry later");
    return ATRIUM_DONE;
}

/* ---- policy --------------------------------------------------------------------------- */

static bool origin_blocked(const media *m, const char *origin)
{
    for (size_t i = 0; i < m->cfg.n_blocked_origins; i++)
        if (strcasecmp(m->cfg.blocked_origins[i], origin) == 0) return true;
    return false;
}

/* The refusals of defer mode: MEDIA_GO, or ATRIUM_DONE with 404 set. */
static int remote_refusal(media *m, atrium_req *req, const char *origin)
{
    const char *allow = m->h->req_query(req, "allow_remote");
    bool refused = !m->cfg.remote_fetch_enabled || (allow && strcmp(allow, "false") == 0) ||
                   origin_blocked(m, origin);
    if (!refused) return MEDIA_GO;
    m->h->respond_error(req, 404, "M_NOT_FOUND", "Media not found");
    return ATRIUM_DONE;
}

/* ---- the cache ---------------------------------------------------------------------- */

enum { CACHE_HIT = MEDIA_GO, CACHE_MISS = MEDIA_GO + 1 };

/* What a cache row look-up (rc: a media_db_remote_*_get result, ATRIUM_E_DB also for no
 * connection) leads to: 503 for the database, CACHE_MISS, 404 for a quarantined copy, or
 * CACHE_HIT to go on and check the file. One rule for originals and thumbnails. */
static int judge_row(media *m, atrium_req *req, int rc, const media_row *row)
{
    if (rc == ATRIUM_E_DB) {
        m->h->respond_error(req, 503, "M_UNKNOWN", "The database is busy or unreachable; retry");
        return ATRIUM_DONE;
    }
    if (rc == MEDIA_DB_NOTFOUND) return CACHE_MISS;
    if (row->quarantined) {
        m->h->metric_add(m->m_refused_policy, 1);
        m->h->respond_error(req, 404, "M_NOT_FOUND", "Media not found");
        return ATRIUM_DONE;
    }
    return CACHE_HIT;
}

/* CACHE_HIT with st->row, CACHE_MISS, or ATRIUM_DONE with the answer set. */
static int cache_lookup(media *m, atrium_req *req, media_req *st, const char *origin,
                        const char *media_id)
{
    const atrium_host *h = m->h;
    PGconn *c = h->db_acquire(MEDIA_DB_WAIT_MS);
    int rc = c ? media_db_remote_get(h, m->self, c, origin, media_id, &st->row) : ATRIUM_E_DB;
    if (c) h->db_release(c);
    if ((rc = judge_row(m, req, rc, &st->row)) != CACHE_HIT) return rc;
    char path[MEDIA_PATH_MAX];
    if (store_row_path(m, &st->row, path, sizeof(path)) < 0 || access(path, F_OK) < 0) {
        h->log(m->self, ATRIUM_LOG_WARN,
               "remote media %s/%s: the cached copy %s is missing; fetching it again", origin,
               media_id, st->row.file_name);
        return CACHE_MISS;
    }
    st->have_row = true;
    h->metric_add(m->m_remote_hits, 1);
    cache_touch(m, origin, media_id);
    return CACHE_HIT;
}

/* What names one upstream resource: "<origin>/<media ID>" for the original,
 * "<origin>/<media ID>/<W>x<H>-<method>[-anim]" for the origin's thumbnail of a size. */
static void remote_key(const char *origin, const char *media_id, const media_size *thumb,
                       char *out, size_t cap)
{
    if (!thumb) {
        snprintf(out, cap, "%s/%s", origin, media_id);
        return;
    }
    snprintf(out, cap, "%s/%s/%dx%d-%s%s", origin, media_id, thumb->width, thumb->height,
             thumb->crop ? "crop" : "scale", thumb->animated ? "-anim" : "");
}

/* ---- the job table (under the table's lock) ---------------------------------------- */

static remote_job **job_slot(remote_table *t, const char *key)
{
    remote_job **pp = &t->buckets[media_bucket(key) * 7919u % REMOTE_TABLE_BUCKETS];
    while (*pp && strcmp((*pp)->key, key) != 0) pp = &(*pp)->next;
    return pp;
}

/* ---- the negative cache (under the table's lock) ------------------------------------ */

/* How long a result is remembered: 0 = not at all. */
static int64_t negative_ttl_ms(const media *m, int result)
{
    switch (result) {
    case REMOTE_NOT_FOUND:
    case REMOTE_TOO_LARGE:
    case REMOTE_NO_THUMBNAIL: return m->cfg.remote_not_found_cache_ms;
    case REMOTE_UNREACHABLE:
    case REMOTE_BAD_ANSWER: return m->cfg.remote_failure_cache_ms;
    default: return 0;
    }
}

static remote_negative **negative_slot(remote_table *t, const char *key)
{
    remote_negative **pp = &t->negative[media_bucket(key) * 7919u % REMOTE_TABLE_BUCKETS];
    while (*pp && strcmp((*pp)->key, key) != 0) pp = &(*pp)->next;
    return pp;
}

/* Drop expired entries; when still full, all of them (they are only a cache). */
static void negative_prune(remote_table *t, int64_t now)
{
    for (int pass = 0; pass < 2 && t->n_negative >= REMOTE_NEGATIVE_MAX; pass++)
        for (size_t i = 0; i < REMOTE_TABLE_BUCKETS; i++) {
            remote_negative **pp = &t->negative[i];
            while (*pp) {
                remote_negative *n = *pp;
                if (pass == 1 || n->until_ms <= now) {
                    *pp = n->next;
                    t->n_negative--;
                    free(n);
                } else {
                    pp = &n->next;
                }
            }
        }
}

static void negative_remember(media *m, remote_table *t, const char *key, int result)
{
    int64_t ttl = negative_ttl_ms(m, result);
    if (ttl <= 0) return;
    int64_t now = m->h->now_ms();
    negative_prune(t, now);
    remote_negative **pp = negative_slot(t, key), *n = *pp;
    if (!n) {
        if (!(n = calloc(1, sizeof(*n)))) return;
        snprintf(n->key, sizeof(n->key), "%s", key);
        *pp = n;
        t->n_negative++;
    }
    n->result = result;
    n->until_ms = now + ttl;
}

/* The remembered result for key, or -1. */
static int negative_lookup(media *m, remote_table *t, const char *key)
{
    remote_negative **pp = negative_slot(t, key), *n = *pp;
    if (!n) return -1;
    if (n->until_ms > m->h->now_ms()) return n->result;
    *pp = n->next;
    t->n_negative--;
    free(n);
    return -1;
}

/* ---- the per-origin cap (under the table's lock) ------------------------------------ */

static remote_origin *origin_get(remote_table *t, const char *origin)
{
    remote_origin **pp = &t->origins[media_bucket(origin) % REMOTE_ORIGIN_BUCKETS];
    while (*pp && strcmp((*pp)->origin, origin) != 0) pp = &(*pp)->next;
    if (*pp) return *pp;
    remote_origin *o = calloc(1, sizeof(*o));
    if (!o) return NULL;
    snprintf(o->origin, sizeof(o->origin), "%s", origin);
    *pp = o;
    return o;
}

/* The rule: may another fetch from this origin start now? */
static bool origin_allows(const media *m, const remote_origin *o)
{
    return o->running < m->cfg.remote_fetch_max_per_origin;
}

static void job_free(remote_job *j)
{
    if (j->tmp_open) store_tmp_discard(&j->tmp);
    free(j->mp);
    free(j);
}

static void job_start_task(void *arg, bool cancelled);
static void landing_open(remote_job *j);
static void landing_advance(remote_job *j);
static void landing_end(remote_job *j, bool stored);


/* The fetch ended: remember a failure, tell every waiter, wake them (after the lock),
 * forget the job, and let the origin's next pending fetch start. */
static void job_complete(remote_job *j, int result)
{
    media *m = j->m;
    const atrium_host *h = m->h;
    remote_table *t = m->remote;
    remote_job *start = NULL;
    /* Before the waiters here: the other processes learn the end as soon (stopping: the
     * claim lapses, this thread may not reach PostgreSQL). */
    if (j->claimed && result != REMOTE_STOPPING)
        remote_claim_end(m, j->key, result, negative_ttl_ms(m, result));
    landing_end(j, result == REMOTE_OK && !j->quarantined); /* its followers end too */
    pthread_mutex_lock(&t->mu);
    remote_job **pp = job_slot(t, j->key);
    if (*pp == j) *pp = j->next;
    if (result == REMOTE_OK) t->landed++;
    negative_remember(m, t, j->key, result);
    remote_waiter *w = j->waiters;
    j->waiters = NULL;
    for (remote_waiter *x = w; x; x = x->next) {
        x->result = result;
        x->done = true;
    }
    if (j->running) {
        remote_origin *o = origin_get(t, j->origin);
        if (o) {
            o->running--;
            if (o->pending_head && origin_allows(m, o)) {
                start = o->pending_head;
                o->pending_head = start->pending_next;
                if (!o->pending_head) o->pending_tail = NULL;
                start->running = true;
                o->running++;
            }
        }
    }
    pthread_mutex_unlock(&t->mu);
    /* Counted before the waiters wake: whoever reads the metrics after an answer sees it. */
    atrium_metric *outcome = result == REMOTE_OK          ? m->m_fetches_ok
                             : result == REMOTE_NOT_FOUND ? m->m_fetches_not_found
                             : result == REMOTE_TOO_LARGE ? m->m_fetches_too_large
                                                          : m->m_fetches_failed;
    if (!j->elsewhere) {
        h->metric_add(outcome, 1);
        if (result == REMOTE_OK) h->metric_add(m->m_fetched_via[j->phase], 1);
    }
    while (w) {
        remote_waiter *next = w->next; /* w may be freed once its request is woken */
        h->req_wake(w->req);
        w = next;
    }
    if (j->counted) h->metric_add(m->m_fetches_running, -1);
    job_free(j);
    if (start && h->pool_submit(m->fetch_pool, job_start_task, start) < 0)
        job_complete(start, REMOTE_STOPPING);
}

/* ---- the transfer (the outbound client's thread: quick, never blocking) --------------- */

/* File bytes: capped, hashed, written to the temporary file. Non-zero aborts. */
static int job_write(void *arg, const char *data, size_t len)
{
    remote_job *j = arg;
    if (j->bytes + (int64_t)len > j->m->cfg.max_upload_bytes) {
        j->too_large = true;
        return 1;
    }
    j->bytes += (int64_t)len;
    sha256_update(&j->sha, data, len);
    if (store_write_all(j->tmp.fd, data, len) < 0) {
        j->io_error = true;
        return 1;
    }
    landing_advance(j);
    return 0;
}

static int job_chunk(void *arg, const atrium_fed_response *res, const char *data, size_t len)
{
    remote_job *j = arg;
    const atrium_host *h = j->m->h;
    j->status = res->status;
    if (res->status != 200) { /* keep the start of an error answer for its errcode */
        size_t room = REMOTE_ERROR_BODY_MAX - j->err_len;
        size_t n = len < room ? len : room;
        memcpy(j->err_body + j->err_len, data, n);
        j->err_len += n;
        j->err_body[j->err_len] = '\0';
        return 0;
    }
    if (!j->started) {
        j->started = true;
        const char *ct = h->fed_response_header(res, "Content-Type");
        if (j->phase == PHASE_FEDERATION) {
            if (mp_init(j->mp, ct) < 0) {
                j->bad = true;
                return 1;
            }
            j->mp->on_body = job_write;
            j->mp->arg = j;
        } else {
            const char *cd = h->fed_response_header(res, "Content-Disposition");
            snprintf(j->content_type, sizeof(j->content_type), "%s", ct ? ct : "");
            snprintf(j->disposition, sizeof(j->disposition), "%s", cd ? cd : "");
        }
    }
    if (j->phase != PHASE_FEDERATION) return job_write(j, data, len);
    int rc = mp_feed(j->mp, data, len);
    if (rc != 0 && !j->too_large && !j->io_error) j->bad = true;
    return rc;
}

static void job_after_transfer(void *arg, bool cancelled);

static void job_done(void *arg, const atrium_fed_response *res)
{
    remote_job *j = arg;
    j->outcome = res->outcome;
    if (res->outcome == ATRIUM_FED_OK) j->status = res->status;
    j->redirect[0] = '\0';
    if (res->outcome == ATRIUM_FED_OK && res->status / 100 == 3) {
        const char *loc = j->m->h->fed_response_header(res, "Location");
        snprintf(j->redirect, sizeof(j->redirect), "%s", loc ? loc : "");
    }
    if (res->outcome != ATRIUM_FED_OK && res->error)
        j->m->h->log(j->m->self, ATRIUM_LOG_INFO, "remote media %s: %s", j->key, res->error);
    /* The rest touches the disk and the database: on the fetch pool. */
    if (j->m->h->pool_submit(j->m->fetch_pool, job_after_transfer, j) < 0) job_complete(j, REMOTE_STOPPING);
}

/* ---- starting a fetch (the fetch pool) ------------------------------------------------ */

static int job_start(remote_job *j)
{
    media *m = j->m;
    const atrium_host *h = m->h;
    landing_end(j, false); /* bytes of an earlier answer (never expected): cut them */
    if (j->tmp_open) store_tmp_discard(&j->tmp);
    j->tmp_open = false;
    j->started = j->bad = j->too_large = j->io_error = false;
    j->status = 0;
    j->bytes = 0;
    j->err_len = 0;
    j->err_body[0] = '\0';
    sha256_init(&j->sha);
    if (store_remote_name(m, j->origin, j->media_id, j->file_rel, sizeof(j->file_rel), j->file_abs,
                          sizeof(j->file_abs)) < 0 ||
        store_tmp_open(m, j->file_abs, &j->tmp) < 0)
        return REMOTE_INTERNAL;
    j->tmp_open = true;
    char uri[REMOTE_URI_MAX];
    if (j->thumb)
        snprintf(uri, sizeof(uri),
                 "/_matrix/federation/v1/media/thumbnail/%s?width=%d&height=%d&method=%s"
                 "&animated=%s",
                 j->media_id, j->size.width, j->size.height, j->size.crop ? "crop" : "scale",
                 j->size.animated ? "true" : "false");
    else if (j->phase == PHASE_FEDERATION)
        snprintf(uri, sizeof(uri), "/_matrix/federation/v1/media/download/%s", j->media_id);
    else
        snprintf(uri, sizeof(uri),
                 "/_matrix/media/v3/download/%s/%s?allow_remote=false&allow_redirect=true",
                 j->origin, j->media_id);
    atrium_fed_request q = {
        .size = sizeof(q),
        .method = "GET",
        .destination = j->origin,
        .uri = uri,
        .deadline_ms = j->transfer_deadline_ms = h->now_ms() + m->cfg.remote_fetch_timeout_ms,
        .max_body_bytes = m->cfg.max_upload_bytes + REMOTE_FRAMING_BYTES,
        .on_chunk = job_chunk,
        .on_done = job_done,
        .arg = j,
    };
    if (j->phase == PHASE_LEGACY) h->metric_add(m->m_fetch_legacy, 1);
    if (j->phase == PHASE_LOCATION) { /* https only: no ATRIUM_FED_ALLOW_HTTP */
        q.url = j->location;
        q.destination = q.uri = NULL;
    }
    int rc = h->fed_request(&q);
    if (rc == ATRIUM_E_STOPPED) return REMOTE_STOPPING;
    return rc < 0 ? REMOTE_UNREACHABLE : REMOTE_OK;
}

/* The first start of a fetch (the fetch pool): claimed across processes first. Returns
 * REMOTE_STARTED, or the result to complete the job with: REMOTE_OK when another process
 * stored the file meanwhile, REMOTE_ELSEWHERE while another fetches it, the result it
 * ended with there, or job_start's failure. */
static int job_begin(remote_job *j)
{
    media *m = j->m;
    int result = REMOTE_INTERNAL;
    int who = remote_claim_take(m, j->key, j->origin, j->media_id, j->thumb ? &j->size : NULL,
                                &result);
    if (who != CLAIM_MINE) {
        j->elsewhere = true;
        return who == CLAIM_HELD ? REMOTE_ELSEWHERE : who == REMOTE_CLAIM_LANDED ? REMOTE_OK : result;
    }
    j->claimed = true;
    m->h->metric_add(m->m_fetches_running, 1);
    j->counted = true;
    int rc = job_start(j);
    return rc == REMOTE_OK ? REMOTE_STARTED : rc;
}

/* A fetch that waited for its origin's cap: start it, unless every request that wanted it
 * has been answered already (then it ends without asking the origin). */
static void job_start_task(void *arg, bool cancelled)
{
    remote_job *j = arg;
    media *m = j->m;
    if (cancelled) {
        job_complete(j, REMOTE_STOPPING);
        return;
    }
    pthread_mutex_lock(&m->remote->mu);
    bool wanted = false;
    for (remote_waiter *w = j->waiters; w; w = w->next)
        if (!w->abandoned) wanted = true;
    pthread_mutex_unlock(&m->remote->mu);
    if (!wanted) {
        job_complete(j, REMOTE_ABANDONED);
        return;
    }
    int rc = job_begin(j);
    if (rc != REMOTE_STARTED) job_complete(j, rc);
}

/* Does an error answer say "this endpoint is unknown here" (so: try the legacy path)? */
static bool endpoint_unknown(const remote_job *j)
{
    if (j->status == 400) return true;
    if (j->status != 404 && j->status != 405) return false;
    json_error_t err;
    json_t *body = json_loadb(j->err_body, j->err_len, 0, &err);
    const char *code = json_string_value(json_object_get(body, "errcode"));
    bool unknown = !code || strcmp(code, "M_UNRECOGNIZED") == 0;
    json_decref(body);
    return unknown;
}

/* The file name of a Content-Disposition (filename="..." or filename*=utf-8''...). */
static void disposition_name(const char *cd, char *out, size_t cap)
{
    out[0] = '\0';
    const char *p = strcasestr(cd, "filename*=utf-8''");
    if (p) {
        p += strlen("filename*=utf-8''");
        size_t n = 0;
        while (*p && *p != ';' && n + 1 < cap) {
            unsigned hi, lo;
            if (*p == '%' && sscanf(p + 1, "%1x%1x", &hi, &lo) == 2) {
                out[n++] = (char)(hi * 16 + lo);
                p += 3;
            } else {
                out[n++] = *p++;
            }
        }
        out[n] = '\0';
        return;
    }
    p = strcasestr(cd, "filename=");
    if (!p) return;
    p += strlen("filename=");
    size_t n = 0;
    if (*p == '"') {
        for (p++; *p && *p != '"' && n + 1 < cap; p++) {
            if (*p == '\\' && p[1]) p++;
            out[n++] = *p;
        }
    } else {
        while (*p && *p != ';' && *p != ' ' && n + 1 < cap) out[n++] = *p++;
    }
    out[n] = '\0';
}

/* The type and file name the answer declared for the file (the part's, or the response's
 * headers), made safe to store and serve. */
static void job_meta(const remote_job *j, char *type, size_t type_cap, char *name,
                     size_t name_cap)
{
    const char *ct = j->phase == PHASE_FEDERATION ? j->mp->content_type : j->content_type;
    const char *cd = j->phase == PHASE_FEDERATION ? j->mp->disposition : j->disposition;
    if (j->phase == PHASE_LOCATION && !cd[0]) cd = j->mp->disposition; /* the part's name */
    snprintf(type, type_cap, "%.*s", MEDIA_TYPE_MAX_BYTES,
             media_type_acceptable(ct) ? ct : DEFAULT_CONTENT_TYPE);
    disposition_name(cd, name, name_cap);
    if (!media_name_acceptable(name)) name[0] = '\0';
}

/* ---- following a file as it arrives ------------------------------------------------- */
/* Waiters of an original that may stream (a plain GET of the whole file) are woken with
 * REMOTE_STREAMING as soon as it has bytes to release, and answer 200 at once with a
 * chunked body that follows the temporary file (host->respond_stream_wait): each read
 * returns what has been written, or WAIT; the writer signals the landing's event per
 * STREAM_SIGNAL_STEP_BYTES. The last STREAM_TAIL_HOLD_BYTES are released only once the
 * file is stored and its hash is not quarantined; a fetch that fails (cut off, too large,
 * garbage) or a quarantined hash ends every follower's body without its last chunk, so a
 * client can tell, and the cache keeps nothing. Requests that come while it streams follow
 * it too, without a fetch budget slot; a follower gives its slot back when it starts. */

static remote_landing *landing_ref(remote_landing *l)
{
    atomic_fetch_add(&l->refs, 1);
    return l;
}

static void landing_unref(remote_landing *l)
{
    if (!l || atomic_fetch_sub(&l->refs, 1) != 1) return;
    close(l->fd);
    free(l);
}

static void landing_free_arg(void *arg)
{
    landing_unref(arg);
}

/* [outbound thread] An original has bytes to release (more than the held tail landed):
 * its landing, and the waiters that may follow it woken (after the lock). So a small file,
 * or a fetch that fails early, is answered with its exact code as before; once a follower
 * got its 200, a failure can only cut its body. Without memory or a descriptor there is
 * no landing: everyone waits for the end. */
static void landing_open(remote_job *j)
{
    media *m = j->m;
    if (!m->can_stream || j->thumb) return;
    remote_landing *l = calloc(1, sizeof(*l));
    if (!l) return;
    l->fd = fcntl(j->tmp.fd, F_DUPFD_CLOEXEC, 0);
    if (l->fd < 0) {
        free(l);
        return;
    }
    atomic_init(&l->refs, 1);
    atomic_init(&l->readable, 0);
    atomic_init(&l->state, LANDING_RUNNING);
    l->ev = m->stream_events[media_bucket(j->key)];
    l->deadline_ms = j->transfer_deadline_ms + STREAM_COMMIT_SLACK_MS;
    job_meta(j, l->content_type, sizeof(l->content_type), l->upload_name, sizeof(l->upload_name));
    remote_table *t = m->remote;
    remote_waiter *wake = NULL;
    pthread_mutex_lock(&t->mu);
    j->landing = l;
    for (remote_waiter **pp = &j->waiters; *pp;) {
        remote_waiter *w = *pp;
        if (!w->stream || w->abandoned) {
            pp = &w->next;
            continue;
        }
        *pp = w->next;
        w->result = REMOTE_STREAMING;
        w->done = true;
        w->landing = landing_ref(l);
        w->next = wake;
        wake = w;
    }
    pthread_mutex_unlock(&t->mu);
    while (wake) {
        remote_waiter *next = wake->next; /* wake may be freed once its request runs */
        m->h->req_wake(wake->req);
        wake = next;
    }
}

/* [outbound thread] Bytes were written: release them to the followers (all but the held
 * tail), signalling per step. */
static void landing_advance(remote_job *j)
{
    int64_t readable = j->bytes - STREAM_TAIL_HOLD_BYTES;
    if (readable <= 0) return;
    if (!j->landing) landing_open(j); /* the first bytes to release: waiters may follow */
    remote_landing *l = j->landing;
    if (!l) return;
    atomic_store(&l->readable, readable);
    if (l->signalled == 0 || readable - l->signalled >= STREAM_SIGNAL_STEP_BYTES) {
        l->signalled = readable;
        j->m->h->event_signal(l->ev);
    }
}

/* The fetch ended (or starts over): the followers get the rest (stored) or are cut. */
static void landing_end(remote_job *j, bool stored)
{
    remote_table *t = j->m->remote;
    pthread_mutex_lock(&t->mu);
    remote_landing *l = j->landing;
    j->landing = NULL; /* no new followers */
    pthread_mutex_unlock(&t->mu);
    if (!l) return;
    if (stored) atomic_store(&l->readable, j->bytes);
    atomic_store(&l->state, stored ? LANDING_DONE : LANDING_FAILED);
    j->m->h->event_signal(l->ev);
    landing_unref(l);
}

/* A follower's read (atrium_stream_read, on its request-pool thread): never blocks. */
static int64_t landing_read(void *arg, uint64_t pos, char *buf, size_t max)
{
    remote_landing *l = arg;
    int state = atomic_load(&l->state);
    if (state == LANDING_FAILED) return ATRIUM_STREAM_ERROR;
    int64_t readable = atomic_load(&l->readable);
    if ((int64_t)pos >= readable)
        return state == LANDING_DONE ? ATRIUM_STREAM_END : ATRIUM_STREAM_WAIT;
    size_t n = (size_t)(readable - (int64_t)pos) < max ? (size_t)(readable - (int64_t)pos) : max;
    ssize_t got;
    do {
        got = pread(l->fd, buf, n, (off_t)pos);
    } while (got < 0 && errno == EINTR);
    return got > 0 ? (int64_t)got : ATRIUM_STREAM_ERROR;
}

/* The running fetch of key, when it streams: a reference to its landing, or NULL (under
 * the table's lock). */
static remote_landing *landing_find(remote_table *t, const char *key)
{
    remote_job *j = *job_slot(t, key);
    return j && j->landing ? landing_ref(j->landing) : NULL;
}

static void landing_hold_release(void *arg)
{
    media_req *st = arg;
    landing_unref(st->landing);
    st->landing = NULL;
}

/* The request follows l (a reference it now owns): MEDIA_GO with st->row describing the
 * file as far as it is known, for download.c to answer with remote_respond_stream. */
static int follow_landing(media *m, atrium_req *req, media_req *st, remote_landing *l)
{
    st->landing = l;
    /* A hold, so the reference goes with the request whatever it answers. */
    if (m->h->req_hold(req, landing_hold_release, st) < 0 || !st->landing) {
        m->h->respond_error(req, 503, "M_UNKNOWN", "The request ended");
        return ATRIUM_DONE;
    }
    memset(&st->row, 0, sizeof(st->row));
    snprintf(st->row.content_type, sizeof(st->row.content_type), "%s", l->content_type);
    snprintf(st->row.upload_name, sizeof(st->row.upload_name), "%s", l->upload_name);
    st->have_row = true;
    return MEDIA_GO;
}

int remote_respond_stream(media *m, atrium_req *req, media_req *st, const char *type,
                          const char *disposition)
{
    const atrium_host *h = m->h;
    remote_landing *l = st->landing;
    st->landing = NULL; /* the response owns the reference from here */
    fetch_budget_leave(m, st); /* no fetch of its own: the slot is for others */
    int rc = h->respond_stream_wait(req, 200, type, -1, landing_read, l, landing_free_arg, l->ev,
                                    l->deadline_ms);
    if (rc < 0) return rc;
    delivery_success_headers(m, req, NULL); /* no ETag: the hash is not known yet */
    h->respond_header(req, "Content-Disposition", disposition);
    h->metric_add(m->m_fetch_streamed, 1);
    return ATRIUM_DONE;
}

/* The bytes are all here: make them durable, probe them, record the row. */
static int job_commit(remote_job *j)
{
    media *m = j->m;
    const atrium_host *h = m->h;
    media_row row;
    memset(&row, 0, sizeof(row));
    snprintf(row.media_id, sizeof(row.media_id), "%s", j->media_id);
    job_meta(j, row.content_type, sizeof(row.content_type), row.upload_name,
             sizeof(row.upload_name));
    sha256_final_hex(&j->sha, row.sha256);
    row.size_bytes = j->bytes;
    snprintf(row.file_name, sizeof(row.file_name), "%s", j->file_rel);
    if (j->thumb && !media_type_thumbnail_safe(row.content_type)) return REMOTE_NO_THUMBNAIL;
    if (store_tmp_commit(m, &j->tmp, j->file_abs, false) < 0) {
        j->tmp_open = false;
        return REMOTE_INTERNAL;
    }
    j->tmp_open = false;
    if (!j->thumb && render_probe(j->file_abs, &row.width, &row.height, &row.frames) != RENDER_OK)
        row.width = row.height = row.frames = 0;
    PGconn *c = h->db_acquire(MEDIA_DB_WAIT_MS);
    char old[MEDIA_FILE_NAME_MAX] = "";
    int64_t old_bytes = 0;
    int rc = !c        ? ATRIUM_E_DB
             : j->thumb ? media_db_remote_thumb_put(h, m->self, c, j->origin, &j->size, &row)
                        : media_db_remote_put(h, m->self, c, j->origin, &row, old, &old_bytes);
    if (c) h->db_release(c);
    if (rc != MEDIA_DB_OK) {
        unlink(j->file_abs);
        return REMOTE_INTERNAL;
    }
    if (!j->thumb && j->landing) { /* followers get the tail only for a file one may see */
        media_row stored;
        c = h->db_acquire(MEDIA_DB_WAIT_MS);
        rc = c ? media_db_remote_get(h, m->self, c, j->origin, j->media_id, &stored) : ATRIUM_E_DB;
        if (c) h->db_release(c);
        j->quarantined = rc != MEDIA_DB_OK || stored.quarantined;
    }
    if (old[0] && strcmp(old, row.file_name) != 0) {
        /* The row names the new copy now; readers of the old one keep their descriptor. */
        char path[MEDIA_PATH_MAX];
        snprintf(path, sizeof(path), "%s/%s", m->cfg.store_path, old);
        unlink(path);
    }
    h->metric_add(m->m_fetch_bytes, j->bytes);
    if (!j->thumb) cache_stored(m, j->bytes - old_bytes);
    h->log(m->self, ATRIUM_LOG_INFO, "remote media %s stored: %" PRId64 " bytes, sha256 %s%s",
           j->key, j->bytes, row.sha256, j->phase == PHASE_LEGACY ? " (legacy endpoint)" : "");
    return REMOTE_OK;
}

/* A fetch asked again after its origin's 429 (the fetch pool, from the timer): unless
 * every request that wanted it has been answered meanwhile. */
static void job_retry_task(void *arg, bool cancelled)
{
    remote_job *j = arg;
    if (cancelled) {
        job_complete(j, REMOTE_STOPPING);
        return;
    }
    pthread_mutex_lock(&j->m->remote->mu);
    bool wanted = false;
    for (remote_waiter *w = j->waiters; w; w = w->next)
        if (!w->abandoned) wanted = true;
    pthread_mutex_unlock(&j->m->remote->mu);
    if (!wanted) {
        job_complete(j, REMOTE_ABANDONED);
        return;
    }
    int rc = job_start(j);
    if (rc != REMOTE_OK) job_complete(j, rc);
}

/* The timer thread: the retry is due; the work goes to the fetch pool. */
static void job_retry_due(void *arg)
{
    remote_job *j = arg;
    if (j->m->h->pool_submit(j->m->fetch_pool, job_retry_task, j) < 0)
        job_complete(j, REMOTE_STOPPING);
}

/* The origin answered 429: schedule the same request again (true), or give up (false:
 * too many tries, or the delay would pass the transfer's deadline). */
static bool retry_later(remote_job *j)
{
    media *m = j->m;
    if (++j->tries_429 > RETRY_429_MAX_TRIES) return false;
    int64_t delay = RETRY_429_BASE_MS << (j->tries_429 < 4 ? j->tries_429 - 1 : 3);
    json_error_t err;
    json_t *body = json_loadb(j->err_body, j->err_len, 0, &err);
    json_t *named = json_object_get(body, "retry_after_ms");
    if (json_is_integer(named) && json_integer_value(named) > 0)
        delay = json_integer_value(named);
    json_decref(body);
    if (delay > RETRY_429_MAX_DELAY_MS) delay = RETRY_429_MAX_DELAY_MS;
    int64_t due = m->h->now_ms() + delay;
    if (due >= j->transfer_deadline_ms) return false;
    if (media_timer_add(m->timer, due, job_retry_due, j) < 0) return false;
    m->h->metric_add(m->m_fetch_retried, 1);
    return true;
}

/* A redirect the legacy endpoint may answer (its allow_redirect=true): 301, 302, 303, 307,
 * 308. */
static bool is_redirect(int status)
{
    return status == 301 || status == 302 || status == 303 || status == 307 || status == 308;
}

/* What the transfer's end means: a result, or -1 when the legacy fetch was started. */
static int job_judge(remote_job *j)
{
    media *m = j->m;
    if (j->too_large) return REMOTE_TOO_LARGE;
    if (j->io_error) return REMOTE_INTERNAL;
    if (j->bad) return REMOTE_BAD_ANSWER;
    if (j->outcome == ATRIUM_FED_E_TOO_LARGE) return REMOTE_TOO_LARGE;
    if (j->outcome == ATRIUM_FED_E_PROTOCOL) return REMOTE_BAD_ANSWER;
    if (j->outcome != ATRIUM_FED_OK) return REMOTE_UNREACHABLE;
    if (j->thumb && (j->status != 200 || (mp_complete(j->mp) && j->mp->location[0])))
        return REMOTE_NO_THUMBNAIL; /* whatever the reason: the original may still exist */
    if (j->status == 200) {
        if (j->phase == PHASE_FEDERATION) {
            if (!mp_complete(j->mp)) return REMOTE_BAD_ANSWER;
            if (j->mp->location[0]) { /* the file lives elsewhere: follow it, once */
                snprintf(j->location, sizeof(j->location), "%s", j->mp->location);
                j->phase = PHASE_LOCATION;
                int rc = job_start(j);
                if (rc == REMOTE_OK) return -1;
                m->h->log(m->self, ATRIUM_LOG_INFO,
                          "remote media %s: cannot follow its Location %s", j->key, j->location);
                return rc == REMOTE_INTERNAL ? rc : REMOTE_BAD_ANSWER;
            }
        }
        return job_commit(j);
    }
    if (j->status == 429) return retry_later(j) ? -1 : REMOTE_ORIGIN_BUSY;
    if (j->phase == PHASE_LEGACY && is_redirect(j->status)) { /* followed once, like a part */
        if (strncmp(j->redirect, "https://", strlen("https://")) != 0) {
            m->h->log(m->self, ATRIUM_LOG_INFO,
                      "remote media %s: the legacy endpoint answered %d to \"%.200s\", not "
                      "an https URL", j->key, j->status, j->redirect);
            return REMOTE_UNREACHABLE;
        }
        snprintf(j->location, sizeof(j->location), "%s", j->redirect);
        j->phase = PHASE_LOCATION;
        int rc = job_start(j);
        if (rc == REMOTE_OK) return -1;
        m->h->log(m->self, ATRIUM_LOG_INFO, "remote media %s: cannot follow its redirect to %s",
                  j->key, j->location);
        return rc == REMOTE_INTERNAL ? rc : REMOTE_UNREACHABLE;
    }
    if (j->phase == PHASE_FEDERATION && endpoint_unknown(j)) {
        j->phase = PHASE_LEGACY;
        int rc = job_start(j);
        return rc == REMOTE_OK ? -1 : rc;
    }
    if (j->phase == PHASE_LOCATION) {
        m->h->log(m->self, ATRIUM_LOG_INFO, "remote media %s: its Location %s answered %d",
                  j->key, j->location, j->status);
        return REMOTE_UNREACHABLE;
    }
    if (j->status == 404) return REMOTE_NOT_FOUND;
    m->h->log(m->self, ATRIUM_LOG_INFO, "remote media %s: the origin answered %d", j->key,
              j->status);
    return REMOTE_UNREACHABLE;
}

static void job_after_transfer(void *arg, bool cancelled)
{
    remote_job *j = arg;
    int result = cancelled ? REMOTE_STOPPING : job_judge(j);
    if (result >= 0) job_complete(j, result);
}

/* ---- the request ---------------------------------------------------------------------- */

/* Admitted mode: join the fetch of the file (starting it when none runs) and park. */
static int join_fetch(media *m, atrium_req *req, media_req *st, const char *origin,
                      const char *media_id, const media_size *thumb)
{
    const atrium_host *h = m->h;
    char key[REMOTE_KEY_MAX];
    remote_key(origin, media_id, thumb, key, sizeof(key));
    remote_waiter *w = h->req_alloc(req, sizeof(*w));
    if (!w) return ATRIUM_E_NOMEM;
    memset(w, 0, sizeof(*w));
    w->req = req;
    w->stream = st->stream_ok && !thumb && m->can_stream;
    remote_table *t = m->remote;
    pthread_mutex_lock(&t->mu);
    remote_landing *l = w->stream ? landing_find(t, key) : NULL;
    if (l) { /* it streams already: follow it */
        pthread_mutex_unlock(&t->mu);
        h->metric_add(m->m_fetch_coalesced, 1);
        return follow_landing(m, req, st, l);
    }
    int remembered = negative_lookup(m, t, key);
    if (remembered >= 0) {
        pthread_mutex_unlock(&t->mu);
        if (remembered == REMOTE_NO_THUMBNAIL && thumb) { /* learnt meanwhile */
            st->thumb_fallback = true;
            return join_fetch(m, req, st, origin, media_id, NULL);
        }
        h->metric_add(m->m_negative_hits, 1);
        return remote_respond_failure(m, req, remembered, origin);
    }
    remote_job **pp = job_slot(t, key), *j = *pp;
    remote_job *fresh = NULL;
    bool start_now = false;
    /* No fetch runs, but one landed since our cache miss: it may have been this file's,
     * which left the table just before we came (fetching it again would be a second
     * fetch of the same file). Look at the cache again, a bounded number of times. */
    if (!j && t->landed != st->landed_seen && st->look_again < REMOTE_MAX_LOOK_AGAIN) {
        pthread_mutex_unlock(&t->mu);
        st->look_again++;
        return REMOTE_LOOK_AGAIN;
    }
    if (!j) {
        fresh = calloc(1, sizeof(*fresh));
        mp_parser *mp = fresh ? calloc(1, sizeof(*mp)) : NULL;
        if (!mp) {
            pthread_mutex_unlock(&t->mu);
            free(fresh);
            return ATRIUM_E_NOMEM;
        }
        fresh->mp = mp;
        fresh->m = m;
        snprintf(fresh->key, sizeof(fresh->key), "%s", key);
        snprintf(fresh->origin, sizeof(fresh->origin), "%s", origin);
        snprintf(fresh->media_id, sizeof(fresh->media_id), "%s", media_id);
        fresh->thumb = thumb != NULL;
        if (thumb) fresh->size = *thumb;
        j = fresh;
    }
    /* Parked before the fetch can end (it wakes under the same lock's protection). */
    if (h->req_wait(req, st->remote_deadline_ms) < 0) {
        pthread_mutex_unlock(&t->mu);
        if (fresh) job_free(fresh);
        h->respond_error(req, 503, "M_UNKNOWN", "The server is stopping");
        return ATRIUM_DONE;
    }
    w->next = j->waiters;
    j->waiters = w;
    st->rw = w;
    st->fetch_rounds++;
    if (fresh) {
        fresh->next = NULL;
        *pp = fresh;
        remote_origin *o = origin_get(t, origin);
        if (!o || origin_allows(m, o)) { /* no memory for the count: do not hold it back */
            start_now = true;
            fresh->running = o != NULL;
            if (o) o->running++;
        } else { /* behind the per-origin cap: starts when one of the origin's ends */
            if (o->pending_tail) o->pending_tail->pending_next = fresh;
            else o->pending_head = fresh;
            o->pending_tail = fresh;
        }
    } else {
        h->metric_add(m->m_fetch_coalesced, 1);
    }
    pthread_mutex_unlock(&t->mu);
    if (start_now) {
        int rc = job_begin(fresh);
        if (rc != REMOTE_STARTED) job_complete(fresh, rc);
    }
    return ATRIUM_PARKED;
}

/* The fetch mode the calling thread runs in (the handoff to the fetch pool publishes
 * ADMITTED). */
static int fetch_mode(media *m)
{
    return (int)(intptr_t)m->h->scope_get(ATRIUM_SCOPE_FETCH_MODE);
}

/* The origin's thumbnail for a thumbnail request, while the original is not cached:
 * CACHE_HIT (st->row is the thumbnail), CACHE_MISS, or ATRIUM_DONE. */
static int thumb_lookup(media *m, atrium_req *req, media_req *st, const char *origin,
                        const char *media_id)
{
    const atrium_host *h = m->h;
    PGconn *c = h->db_acquire(MEDIA_DB_WAIT_MS);
    int rc = c ? media_db_remote_thumb_get(h, m->self, c, origin, media_id, &st->thumb_size,
                                           &st->row)
               : ATRIUM_E_DB;
    if (c) h->db_release(c);
    if ((rc = judge_row(m, req, rc, &st->row)) != CACHE_HIT) return rc;
    char path[MEDIA_PATH_MAX];
    if (store_row_path(m, &st->row, path, sizeof(path)) < 0 || access(path, F_OK) < 0)
        return CACHE_MISS;
    st->row_is_thumbnail = true;
    st->have_row = true;
    h->metric_add(m->m_remote_hits, 1);
    return CACHE_HIT;
}

/* A remembered failure for key: the answer (or, for "no thumbnail", the switch to the
 * original) - MEDIA_GO when nothing is remembered. */
static int negative_answer(media *m, atrium_req *req, media_req *st, const char *key,
                           const char *origin)
{
    pthread_mutex_lock(&m->remote->mu);
    int remembered = negative_lookup(m, m->remote, key);
    pthread_mutex_unlock(&m->remote->mu);
    if (remembered < 0) return MEDIA_GO;
    if (remembered == REMOTE_NO_THUMBNAIL) {
        st->thumb_fallback = true;
        return MEDIA_GO;
    }
    m->h->metric_add(m->m_negative_hits, 1);
    return remote_respond_failure(m, req, remembered, origin);
}

int remote_locate(media *m, atrium_req *req, media_req *st, const char *origin,
                  const char *media_id)
{
    const atrium_host *h = m->h;
    int rc;
    if (st->rw) { /* a run after waiting for a fetch */
        remote_table *t = m->remote;
        pthread_mutex_lock(&t->mu);
        bool done = st->rw->done;
        int result = st->rw->result;
        if (!done) st->rw->abandoned = true;
        pthread_mutex_unlock(&t->mu);
        /* Not done: the deadline ran us; the fetch goes on for the others and still
         * sends our one wake-up (the request stays valid until then). */
        if (!done) return respond_timeout(m, req);
        remote_landing *l = st->rw->landing;
        st->rw = NULL;
        if (result == REMOTE_ELSEWHERE) { /* wait for the other process's fetch */
            st->fetch_rounds--;
            char key[REMOTE_KEY_MAX];
            remote_key(origin, media_id, st->thumb_wanted && !st->thumb_fallback ? &st->thumb_size : NULL,
                       key, sizeof(key));
            rc = remote_claim_wait(m, req, st, key);
            if (rc != MEDIA_GO) return rc;
        } else if (result == REMOTE_STREAMING) return follow_landing(m, req, st, l);
        else if (result == REMOTE_NO_THUMBNAIL) st->thumb_fallback = true;
        else if (result != REMOTE_OK) return remote_respond_failure(m, req, result, origin);
        if (st->fetch_rounds >= REMOTE_MAX_ROUNDS)
            return remote_respond_failure(m, req, REMOTE_INTERNAL, origin);
        /* go on: the look-ups below find what the fetch stored */
    }
    if (st->fw) { /* a run after waiting in the fetch line: settle that first */
        rc = fetch_budget_enter(m, req, st);
        if (rc != MEDIA_GO) return rc;
    }
    rc = remote_refusal(m, req, origin);
    if (rc != MEDIA_GO) return rc;
    if (st->remote_deadline_ms == 0) {
        int64_t timeout = delivery_timeout_ms(m, req);
        if (timeout < 0) {
            h->respond_error(req, 400, "M_INVALID_PARAM", "timeout_ms must be a non-negative integer");
            return ATRIUM_DONE;
        }
        st->remote_deadline_ms = st->arrival_ms + timeout;
    }
look:
    { /* before the look-up: a fetch ending anywhere after it wakes us (remote_claim_wait) */
        char key[REMOTE_KEY_MAX];
        remote_key(origin, media_id, st->thumb_wanted && !st->thumb_fallback ? &st->thumb_size : NULL,
                   key, sizeof(key));
        st->wake_gen = media_wake_gen(m, key);
    }
    if (fetch_mode(m) == ATRIUM_FETCH_ADMITTED) { /* before the look-up: see join_fetch */
        pthread_mutex_lock(&m->remote->mu);
        st->landed_seen = m->remote->landed;
        pthread_mutex_unlock(&m->remote->mu);
    }
    rc = cache_lookup(m, req, st, origin, media_id);
    if (rc != CACHE_MISS) return rc;
    bool want_thumb = st->thumb_wanted && !st->thumb_fallback;
    if (want_thumb) {
        rc = thumb_lookup(m, req, st, origin, media_id);
        if (rc != CACHE_MISS) return rc;
    }
    char key[REMOTE_KEY_MAX];
    remote_key(origin, media_id, want_thumb ? &st->thumb_size : NULL, key, sizeof(key));
    rc = negative_answer(m, req, st, key, origin);
    if (rc != MEDIA_GO) return rc;
    if (want_thumb && st->thumb_fallback) { /* remembered: the origin has no thumbnail */
        want_thumb = false;
        remote_key(origin, media_id, NULL, key, sizeof(key));
        rc = negative_answer(m, req, st, key, origin);
        if (rc != MEDIA_GO) return rc;
    }
    if (h->now_ms() >= st->remote_deadline_ms) return respond_timeout(m, req);
    if (fetch_mode(m) == ATRIUM_FETCH_ADMITTED) {
        rc = join_fetch(m, req, st, origin, media_id, want_thumb ? &st->thumb_size : NULL);
        if (rc == REMOTE_LOOK_AGAIN) goto look;
        return rc;
    }

    /* Defer mode: follow a fetch of it that streams already (no slot needed), else a slot
     * of the fetch budget, then the fetch pool. */
    if (st->stream_ok && m->can_stream && !want_thumb) {
        pthread_mutex_lock(&m->remote->mu);
        remote_landing *l = landing_find(m->remote, key);
        pthread_mutex_unlock(&m->remote->mu);
        if (l) {
            h->metric_add(m->m_fetch_coalesced, 1);
            return follow_landing(m, req, st, l);
        }
    }
    rc = fetch_budget_enter(m, req, st);
    if (rc != MEDIA_GO) return rc;
    const atrium_scope_value vals[] = {
        {.key = ATRIUM_SCOPE_FETCH_MODE, .value = (void *)(intptr_t)ATRIUM_FETCH_ADMITTED},
        {.key = ATRIUM_SCOPE_RATE_ADMITTED, .value = (void *)(intptr_t)1},
    };
    rc = h->handoff(req, m->fetch_pool, vals, sizeof(vals) / sizeof(vals[0]));
    if (rc == 0) return ATRIUM_HANDED_OFF;
    if (rc == ATRIUM_E_STOPPED) {
        h->respond_error(req, 503, "M_UNKNOWN", "The server is stopping");
        return ATRIUM_DONE;
    }
    h->respond_limited(req, 1000, "Too many remote media fetches queued; retry shortly");
    return ATRIUM_DONE;
}
