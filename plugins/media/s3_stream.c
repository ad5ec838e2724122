/*
 * plugins/media/s3_stream.c - storage: s3, a GET whose original is not in the local folder:
 * its bytes go to the client as they arrive from the store, while they land in the local
 * folder (docs/adr/0031-streaming-media-to-and-from-the-object-store.md).
 *
 * A miss starts a fetch on the store pool (one GET of the object into a temp file of the
 * local folder, hashed as it arrives) or joins the one under way for the same media ID, so
 * one GET serves every request of a cold object however many come at once. The request
 * waits (req_wait: no thread waits) until the fetch has bytes to release, then answers 200
 * with the row's Content-Length and ETag and a body that follows the temp file
 * (host->respond_stream_wait: each read returns what has landed, or WAIT; the writer
 * signals the event per S3S_SIGNAL_STEP_BYTES). The last S3S_TAIL_HOLD_BYTES are released
 * only once the object came whole and its SHA-256 and size match the row, checked in the
 * receive callback as the last byte lands (then the local copy is fsynced and named; the
 * clients need not wait for that); a fetch that fails
 * (the store cut off, timed out, a mismatch) ends every follower's body before its
 * Content-Length and names nothing. A small object, or a fetch
 * that fails before releasing anything, is answered with its exact code (404 for a row
 * without its object, 503 for a store that failed), as before.
 *
 * A Range on a miss is a ranged GET (kind "range") of exactly those bytes into an unnamed
 * temp file, streamed the same way and then dropped: the local folder caches whole
 * originals only. Each ranged miss is its own GET.
 *
 * Bounds: a fetch is a task of the store pool (s3_max_concurrent workers, 1024 queued:
 * past that 429, as for the read-through), each GET one of the s3_max_concurrent request
 * slots; the requests following a fetch hold their delivery slots to the last byte.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "media.h"
#include "s3.h"
#include "s3_call.h"
#include "sha256.h"

#define S3S_TAIL_HOLD_BYTES (64 * 1024)
/* A follower that caught up is resumed once per step: at 64 KiB a cold 5 MB download took
 * 0.52x a direct GET's time, at 256 KiB 0.62x (bench/media_s3.sh, one loaded run each);
 * with the hash no longer the bottleneck (sha256.c), 0.80x at 64 KiB, 0.91x at 256 KiB
 * (20 alternating pairs each, load ~20). */
#define S3S_SIGNAL_STEP_BYTES (256 * 1024)
#define S3S_RETRY_MS 1000
/* A follower may wait this long past the fetch's own bound (slot wait + GET), for the
 * file's fsync and naming. */
#define S3S_SLACK_MS 10000

enum { S3S_RUNNING = 0, S3S_DONE, S3S_FAILED };

typedef struct s3_landing s3_landing;
typedef struct s3_streams s3_streams;

typedef struct s3_waiter {
    atrium_req *req;
    struct s3_waiter *next;
    bool woken; /* under the table's lock */
} s3_waiter;

struct s3_landing {
    atomic_int refs;
    atomic_llong readable; /* bytes a follower may read; final once DONE */
    atomic_int state;
    atomic_int result; /* enum s3_result, once not RUNNING */
    int fd;            /* the temp file, for the followers' preads */
    atrium_event *ev;
    int64_t deadline_ms;
    bool ranged;
    int64_t size; /* the bytes expected: the row's size, or the range's length */
    /* the writer's (one store worker) */
    media *m;
    store_tmp tmp;
    sha256_ctx hash;
    int64_t signalled;
    bool released;
    bool hashed;    /* the whole size came: digest holds its SHA-256 */
    bool tail_sent; /* ... it is the row's, and the held tail went to the followers */
    char digest[SHA256_HEX_CHARS + 1];
    char media_id[MEDIA_ID_MAX_CHARS + 1];
    char path[MEDIA_PATH_MAX];
    char sha256[SHA256_HEX_CHARS + 1];
    char range[64];
    /* under the table's lock */
    s3_waiter *waiters;
    struct s3_landing *next; /* whole-object fetches under way */
};

struct s3_streams {
    pthread_mutex_t mu;
    s3_landing *running;
    atrium_metric *m_running, *m_whole, *m_ranged, *m_followers, *m_stored, *m_cut;
};

static s3_landing *landing_ref(s3_landing *l)
{
    atomic_fetch_add(&l->refs, 1);
    return l;
}

static void landing_unref(s3_landing *l)
{
    if (!l || atomic_fetch_sub(&l->refs, 1) != 1) return;
    if (l->fd >= 0) close(l->fd);
    store_tmp_discard(&l->tmp);
    free(l);
}

static void landing_free_arg(void *arg)
{
    landing_unref(arg);
}

int s3_stream_init(media *m)
{
    if (!m->s3) return 0;
    const atrium_host *h = m->h;
    s3_streams *t = calloc(1, sizeof(*t));
    if (!t) return ATRIUM_E_NOMEM;
    pthread_mutex_init(&t->mu, NULL);
    m->s3_streams = t;
    t->m_running = h->metric_gauge(m->self, "atrium_media_store_streams_running", NULL,
                                   "Fetches from the object store streaming to clients now");
    const char *help = "Misses streamed from the object store, by kind (whole: a GET of the "
                       "object, cached; range: a ranged GET, not cached)";
    t->m_whole = h->metric_counter(m->self, "atrium_media_store_streams_total",
                                   "kind=\"whole\"", help);
    t->m_ranged = h->metric_counter(m->self, "atrium_media_store_streams_total",
                                    "kind=\"range\"", help);
    t->m_followers = h->metric_counter(
        m->self, "atrium_media_store_stream_followers_total", NULL,
        "Misses that followed a fetch of the same object already under way (no GET of their own)");
    const char *end_help = "Streamed fetches by how they ended (stored: whole, checked and named "
                           "in the local folder, or a range sent whole; cut: failed, followers' "
                           "bodies ended short)";
    t->m_stored = h->metric_counter(m->self, "atrium_media_store_stream_ends_total",
                                    "outcome=\"stored\"", end_help);
    t->m_cut = h->metric_counter(m->self, "atrium_media_store_stream_ends_total",
                                 "outcome=\"cut\"", end_help);
    return t->m_running && t->m_whole && t->m_ranged && t->m_followers && t->m_stored && t->m_cut
               ? 0
               : ATRIUM_E_NOMEM;
}

void s3_stream_fini(media *m)
{
    s3_streams *t = m->s3_streams;
    if (!t) return;
    pthread_mutex_destroy(&t->mu);
    free(t);
    m->s3_streams = NULL;
}

/* ---- the writer (a store pool worker) -------------------------------------------------- */

/* Wake the requests waiting for l's first bytes or its end. */
static void wake_waiters(media *m, s3_landing *l)
{
    s3_streams *t = m->s3_streams;
    pthread_mutex_lock(&t->mu);
    s3_waiter *w = l->waiters;
    l->waiters = NULL;
    for (s3_waiter *x = w; x; x = x->next) x->woken = true;
    pthread_mutex_unlock(&t->mu);
    while (w) {
        s3_waiter *next = w->next; /* w may be freed once its request is woken */
        m->h->req_wake(w->req);
        w = next;
    }
}

/* [store worker] The row's size has come, and clients follow (an object above the held
 * tail): is it the row's SHA-256? If so the tail goes now, at the last byte, not after
 * libcurl ends the transfer and the worker closes the connection; land() names the file
 * after that, or fails the fetch for what comes next (a byte past the size, a transfer
 * error). A small object (all of it held) is still answered at the fetch's end, with the
 * file named or the exact code. */
static void verify_at_size(s3_landing *l)
{
    sha256_final_hex(&l->hash, l->digest);
    l->hashed = true;
    if (strcmp(l->digest, l->sha256) != 0) return; /* land() logs and fails it */
    l->tail_sent = true;
    atomic_store(&l->readable, l->size);
    l->signalled = l->size;
    l->m->h->event_signal(l->ev);
}

/* [store worker] bytes of the body have landed: release what may go (all of a range; all
 * but the held tail of a whole object, until the whole is checked). false (the transfer
 * stops) past the size. */
static bool on_bytes(void *arg, int64_t bytes)
{
    s3_landing *l = arg;
    if (bytes > l->size) return false;
    int64_t readable = l->ranged ? bytes : bytes - S3S_TAIL_HOLD_BYTES;
    if (readable <= 0) return true;
    atomic_store(&l->readable, readable);
    if (!l->released) {
        l->released = true;
        wake_waiters(l->m, l);
    }
    if (!l->ranged && bytes == l->size) {
        verify_at_size(l);
        return true;
    }
    if (l->signalled == 0 || readable - l->signalled >= S3S_SIGNAL_STEP_BYTES) {
        l->signalled = readable;
        l->m->h->event_signal(l->ev);
    }
    return true;
}

/* [store worker] Whole, checked, named? enum s3_result (logged when not S3_OK). */
static int land(media *m, s3_landing *l, const s3_call *call, int out)
{
    if (out == S3_OUT_NOT_FOUND) {
        m->h->log(m->self, ATRIUM_LOG_ERROR,
                  "object store: original %s has a row but no object: run atrium verify-media",
                  l->media_id);
        return S3_NOT_FOUND;
    }
    if (call->bytes > l->size || (out == S3_OUT_OK && call->bytes != l->size)) {
        m->h->log(m->self, ATRIUM_LOG_ERROR,
                  "object store: original %s: the store sent %s%" PRId64 " bytes, %" PRId64
                  " expected: run atrium verify-media",
                  l->media_id, call->bytes > l->size ? "more than " : "", call->bytes, l->size);
        return S3_FAILED;
    }
    if (out != S3_OUT_OK || call->write_failed) {
        s3_log_failure(m, call, l->ranged ? "ranged GET" : "GET");
        return S3_FAILED;
    }
    if (l->ranged) return S3_OK;
    if (!l->hashed) { /* an object within the held tail: verify_at_size never ran */
        sha256_final_hex(&l->hash, l->digest);
        l->hashed = true;
    }
    if (strcmp(l->digest, l->sha256) != 0) {
        m->h->log(m->self, ATRIUM_LOG_ERROR,
                  "object store: original %s: the object's SHA-256 is not the row's: run atrium "
                  "verify-media",
                  l->media_id);
        return S3_MISMATCH;
    }
    /* Verified: the held tail may go (it went at the last byte if clients followed,
     * verify_at_size). The clients need not wait for the local copy's fsync and naming below
     * (a cache entry; they end at the last byte, the stream's END follows in fetch_end). */
    if (!l->tail_sent) {
        atomic_store(&l->readable, l->size);
        m->h->event_signal(l->ev);
    }
    int rc = store_tmp_commit(m, &l->tmp, l->path, false);
    if (rc == 0) s3_cache_added(m, l->size);
    /* Another fetch (a HEAD's read-through, another process) landed first: same bytes. */
    return rc == 0 || rc == -EEXIST ? S3_OK : S3_FAILED;
}

static void fetch_end(media *m, s3_landing *l, int result)
{
    s3_streams *t = m->s3_streams;
    if (!l->ranged) {
        pthread_mutex_lock(&t->mu);
        for (s3_landing **pp = &t->running; *pp; pp = &(*pp)->next) {
            if (*pp == l) {
                *pp = l->next;
                break;
            }
        }
        pthread_mutex_unlock(&t->mu);
    }
    store_tmp_discard(&l->tmp); /* a range, or a failure (a named file was consumed) */
    if (result == S3_OK) atomic_store(&l->readable, l->size);
    atomic_store(&l->result, result);
    atomic_store(&l->state, result == S3_OK ? S3S_DONE : S3S_FAILED);
    m->h->metric_add(result == S3_OK ? t->m_stored : t->m_cut, 1);
    m->h->metric_add(t->m_running, -1);
    m->h->event_signal(l->ev);
    wake_waiters(m, l);
    landing_unref(l);
}

static void fetch_task(void *arg, bool cancelled)
{
    s3_landing *l = arg;
    media *m = l->m;
    if (cancelled) {
        fetch_end(m, l, S3_FAILED);
        return;
    }
    char key[S3_KEY_MAX];
    if (s3_original_key(l->media_id, key, sizeof(key)) < 0) {
        fetch_end(m, l, S3_FAILED);
        return;
    }
    sha256_init(&l->hash);
    s3_call call = {.kind = l->ranged ? S3_KIND_RANGE : S3_KIND_GET,
                    .key = key,
                    .out_fd = l->tmp.fd,
                    .body_hash = l->ranged ? NULL : &l->hash,
                    .range = l->ranged ? l->range : NULL,
                    .on_bytes = on_bytes,
                    .on_bytes_arg = l};
    int out = s3_perform(m, &call);
    s3_count_down(m, call.bytes);
    fetch_end(m, l, land(m, l, &call, out));
}

/* ---- the requests ---------------------------------------------------------------------- */

static void hold_release(void *arg)
{
    media_req *st = arg;
    landing_unref(st->s3l);
    st->s3l = NULL;
}

/* A new fetch for the request (not yet submitted): NULL when out of memory or the temp
 * file cannot be made (logged). */
static s3_landing *landing_new(media *m, const media_row *row, const char *path, bool ranged,
                               uint64_t start, uint64_t len)
{
    s3_landing *l = calloc(1, sizeof(*l));
    if (!l) return NULL;
    atomic_init(&l->refs, 1);
    atomic_init(&l->readable, 0);
    atomic_init(&l->state, S3S_RUNNING);
    atomic_init(&l->result, S3_OK);
    l->tmp.fd = -1;
    l->fd = -1;
    if (store_tmp_open(m, path, &l->tmp) < 0) {
        free(l);
        return NULL;
    }
    l->fd = fcntl(l->tmp.fd, F_DUPFD_CLOEXEC, 0);
    if (l->fd < 0) {
        landing_unref(l);
        return NULL;
    }
    l->m = m;
    l->ranged = ranged;
    l->size = ranged ? (int64_t)len : row->size_bytes;
    l->ev = m->stream_events[media_bucket(row->media_id)];
    l->deadline_ms = m->h->now_ms() + 2 * m->cfg.s3_timeout_ms + S3S_SLACK_MS;
    snprintf(l->media_id, sizeof(l->media_id), "%s", row->media_id);
    snprintf(l->path, sizeof(l->path), "%s", path);
    snprintf(l->sha256, sizeof(l->sha256), "%s", row->sha256);
    if (ranged)
        snprintf(l->range, sizeof(l->range), "%" PRIu64 "-%" PRIu64, start, start + len - 1);
    return l;
}

/* Start a fetch, or join the whole-object fetch of the same media under way: st->s3l set
 * (a hold releases it). MEDIA_GO, or the outcome after answering (429, 503). */
static int start_or_join(media *m, atrium_req *req, media_req *st, const char *path,
                         bool ranged, uint64_t start, uint64_t len)
{
    const atrium_host *h = m->h;
    s3_streams *t = m->s3_streams;
    s3_landing *fresh = landing_new(m, &st->row, path, ranged, start, len);
    if (!fresh) {
        h->respond_error(req, 503, "M_UNKNOWN", "The media cannot be read now; retry later");
        return ATRIUM_DONE;
    }
    s3_landing *l = NULL, *refused = NULL;
    int rc = 0;
    pthread_mutex_lock(&t->mu);
    if (!ranged) {
        for (s3_landing *x = t->running; x && !l; x = x->next)
            if (strcmp(x->media_id, st->row.media_id) == 0) l = landing_ref(x);
    }
    if (!l) {
        landing_ref(fresh); /* the writer's, and the request's */
        rc = h->pool_submit(m->store_pool, fetch_task, fresh);
        if (rc == 0) {
            l = fresh;
            if (!ranged) {
                fresh->next = t->running;
                t->running = fresh;
            }
        } else {
            atomic_fetch_sub(&fresh->refs, 1);
            refused = fresh;
        }
        fresh = NULL;
    }
    pthread_mutex_unlock(&t->mu);
    landing_unref(refused);
    if (rc == ATRIUM_E_LIMIT) {
        h->respond_limited(req, S3S_RETRY_MS,
                           "Too many downloads are waiting for the media store; retry");
        return ATRIUM_DONE;
    }
    if (rc < 0) {
        h->respond_error(req, 503, "M_UNKNOWN", "The server is stopping");
        return ATRIUM_DONE;
    }
    if (fresh) { /* joined */
        landing_unref(fresh);
        h->metric_add(t->m_followers, 1);
    } else {
        h->metric_add(ranged ? t->m_ranged : t->m_whole, 1);
        h->metric_add(t->m_running, 1);
    }
    st->s3l = l;
    if (h->req_hold(req, hold_release, st) < 0 || !st->s3l) {
        h->respond_error(req, 503, "M_UNKNOWN", "The request ended");
        return ATRIUM_DONE;
    }
    return MEDIA_GO;
}

/* st->s3l has nothing to release yet: wait for its first bytes or its end. */
static int wait_for_bytes(media *m, atrium_req *req, media_req *st)
{
    s3_streams *t = m->s3_streams;
    s3_landing *l = st->s3l;
    s3_waiter *w = st->s3w_mem;
    if (!w && !(w = st->s3w_mem = m->h->req_alloc(req, sizeof(*w)))) return ATRIUM_E_NOMEM;
    bool ready = false;
    int rc = 0;
    pthread_mutex_lock(&t->mu);
    /* Looked at under the lock the writer wakes under: no wake-up is missed. */
    if (atomic_load(&l->readable) > 0 || atomic_load(&l->state) != S3S_RUNNING) {
        ready = true;
    } else if ((rc = m->h->req_wait(req, l->deadline_ms)) == 0) {
        w->req = req;
        w->woken = false;
        w->next = l->waiters;
        l->waiters = w;
        st->s3w = w;
    }
    pthread_mutex_unlock(&t->mu);
    if (ready) return MEDIA_GO;
    if (rc < 0) {
        m->h->respond_error(req, 503, "M_UNKNOWN", "The server is stopping");
        return ATRIUM_DONE;
    }
    return ATRIUM_PARKED;
}

int s3_stream_miss(media *m, atrium_req *req, media_req *st, const char *path, bool ranged,
                   uint64_t start, uint64_t len)
{
    const atrium_host *h = m->h;
    if (st->s3w) { /* a run after waiting */
        pthread_mutex_lock(&m->s3_streams->mu);
        bool woken = st->s3w->woken;
        pthread_mutex_unlock(&m->s3_streams->mu);
        /* Not woken: the deadline ran us; the fetch still sends our one wake-up (the
         * request stays valid until then), and its waiter memory is not reused. */
        if (!woken) st->s3w_mem = NULL;
        st->s3w = NULL;
        if (!woken) {
            h->respond_error(req, 504, "M_UNKNOWN", "The media store did not answer in time");
            return ATRIUM_DONE;
        }
    }
    if (!st->s3l) {
        int rc = start_or_join(m, req, st, path, ranged, start, len);
        if (rc != MEDIA_GO) return rc;
    }
    s3_landing *l = st->s3l;
    if (atomic_load(&l->state) == S3S_FAILED) {
        if (atomic_load(&l->result) == S3_NOT_FOUND)
            h->respond_error(req, 404, "M_NOT_FOUND", "Media not found");
        else
            h->respond_error(req, 503, "M_UNKNOWN", "The media store failed; retry later");
        return ATRIUM_DONE;
    }
    return wait_for_bytes(m, req, st);
}

/* A follower's read (on its request-pool thread): never blocks. */
static int64_t landing_read(void *arg, uint64_t pos, char *buf, size_t max)
{
    s3_landing *l = arg;
    int state = atomic_load(&l->state);
    /* readable is read after state: a landing marked done has published all its bytes. */
    return delivery_landing_read(l->fd, atomic_load(&l->readable), state == S3S_DONE,
                                 state == S3S_FAILED, pos, buf, max);
}

int s3_stream_respond(media *m, atrium_req *req, media_req *st, int status, const char *type)
{
    s3_landing *l = st->s3l;
    st->s3l = NULL; /* the response owns the reference from here */
    return m->h->respond_stream_wait(req, status, type, l->size, landing_read, l,
                                     landing_free_arg, l->ev, l->deadline_ms);
}
