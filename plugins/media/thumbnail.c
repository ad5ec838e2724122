/*
 * plugins/media/thumbnail.c - GET/HEAD /_matrix/client/v1/media/thumbnail/{serverName}/
 * {mediaId} (and the legacy /_matrix/media/v3/thumbnail path): which bytes answer a
 * thumbnail request, and who renders them.
 *
 * Decisions owned here (docs/architecture.md, "Media: the plugin's rules"; the Matrix
 * client-server API, Content repository, "Thumbnails"):
 *   - an original that already fits inside the request (or inside the chosen configured
 *     size) and is a static JPEG/PNG/GIF/WebP is its own thumbnail: never upscaled;
 *   - otherwise the configured size sizes.c chooses is rendered once per (original's
 *     SHA-256, size, method): the host's single flight (ABI 1.8, flight_join;
 *     docs/adr/0029-single-flight.md) makes the first request the leader, which submits
 *     one render job to the render pool (render_threads workers, so concurrent renders and
 *     their memory are bounded); every request for the same key parks - no thread - on
 *     that flight, each within its own render_wait_ms, and is served the file when the
 *     render ends. The table here keeps only what the flight does not: the failures
 *     remembered, and the renders another process claimed;
 *   - once across processes sharing the database and the store: before rendering, the
 *     job claims its key (cluster.c, a media_claims row with an expiry; no connection is
 *     held while rendering). When another process holds the claim, requests here wait on
 *     the job (ELSEWHERE) for that process's notification that the render ended, looking
 *     at the file and the claim themselves every RENDER_RECHECK_LIVE_MS (every
 *     RENDER_RECHECK_MS while notifications may be missed), so a renderer that died is
 *     replaced once its claim lapses. A failure is kept in the claim for as long as it is
 *     remembered here, so the other processes answer it without decoding the file;
 *   - a render that cannot start (pool queue full) or finish within render_wait_ms: the
 *     nearest thumbnail that already exists, else 503 with Retry-After; never the
 *     original in its place;
 *   - what the header says decides quickly: not an image -> 400 M_UNKNOWN, more pixels
 *     than max_image_pixels -> 413 M_TOO_LARGE, before any decoding; a render that fails
 *     (truncated, corrupt) gives 400 M_UNKNOWN and is remembered for a while so clients
 *     retrying do not re-decode a bad file (the original still downloads);
 *   - thumbnails are written atomically as derived files (store.c,
 *     store_tmp_open_derived: the bytes fsynced before the name exists, no folder fsync),
 *     so whatever file exists under a thumbnail's name is complete; a crash may lose the
 *     name, and the next request renders it again.
 * The delivery slot taken in delivery.c is held while a request waits for its render and
 * while its body is sent. Remote media (remote.c): when the original is not cached, the
 * origin's thumbnail of the chosen configured size is fetched and served as it is;
 * when the origin has none, the original is fetched and rendered here like local media.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "media.h"
#include "s3.h"
#include "atrium/parse.h"

#define RENDER_TABLE_BUCKETS 256
#define RENDER_FAILED_MAX 4096              /* remembered failures, at most */
#define RENDER_FAILED_CONTENT_TTL_MS 600000 /* a bad file stays bad: remember 10 minutes */
#define RENDER_FAILED_TRANSIENT_TTL_MS 5000 /* out of memory, disk trouble: 5 seconds */
#define THUMB_KEY_MAX (SHA256_HEX_CHARS + 32)
#define THUMB_NAME "thumbnail"
#define FALLBACK_OTHER_METHOD_PENALTY (1L << 40) /* prefer any size of the asked method */

/* A render as the table knows it: CLAIMING while its leader asks the database for its
 * claim, ELSEWHERE while another process's claim holds it (requests here wait for that
 * process's notification, re-checking now and then), FAILED once remembered as failed. A
 * render running here is its flight's (m->render_flights) and the render job's. */
enum job_state { JOB_FAILED = 1, JOB_CLAIMING, JOB_ELSEWHERE };
/* How a render's flight ended besides a render_result: another process renders it, or it
 * could not be queued here. */
#define RENDER_ELSEWHERE 1
#define RENDER_UNQUEUED 2
/* Requests parked on renders under way in this process, at most (each holds a delivery
 * slot too); past it a request gets the nearest size or 503. */
#define RENDER_WAITERS_MAX 4096
/* A claim lapses this long after it was taken (its process died, or the render took
 * longer: then another process may render the same key, and the second finds the
 * first's file). */
#define RENDER_CLAIM_TTL_MS 15000
/* How often requests waiting for another process's render look for its file (and at
 * its claim) themselves: seldom while notifications arrive, often while not. */
#define RENDER_RECHECK_LIVE_MS 1000
#define RENDER_RECHECK_MS 200
#define RENDER_CLAIM_PREFIX "render:"

/* An entry of the table (under its lock). */
typedef struct render_job {
    char key[THUMB_KEY_MAX]; /* "<sha256>/<W>x<H>-<method>" */
    int state;  /* enum job_state */
    int result; /* enum render_result once failed */
    int64_t failed_at_ms;
    bool ended_elsewhere;    /* CLAIMING: the notification came meanwhile */
    int64_t recheck_at_ms;   /* ELSEWHERE: look at the file and the claim again then */
    struct render_job *next;
} render_job;

/* A render running here: its flight's work, on the render pool. */
typedef struct render_task_arg {
    char key[THUMB_KEY_MAX];
    media *m;
    atrium_flight *flight;
    char src[MEDIA_PATH_MAX], dst[MEDIA_PATH_MAX];
    /* storage: s3, local media: the original is read through from the bucket first */
    char media_id[MEDIA_ID_MAX_CHARS + 1];
    media_size size;
} render_task_arg;

struct render_table {
    pthread_mutex_t mu;
    render_job *buckets[RENDER_TABLE_BUCKETS];
    size_t n_failed; /* FAILED and ELSEWHERE entries: only a cache, pruned */
};

int thumbnails_init(media *m)
{
    m->renders = calloc(1, sizeof(*m->renders));
    if (!m->renders) return ATRIUM_E_NOMEM;
    pthread_mutex_init(&m->renders->mu, NULL);
    m->render_flights = m->h->flights_create(m->self, "render",
                                             m->cfg.render_threads + m->cfg.render_queue,
                                             RENDER_WAITERS_MAX);
    return m->render_flights ? 0 : ATRIUM_E_NOMEM;
}

void thumbnails_fini(media *m)
{
    if (!m->renders) return;
    for (size_t i = 0; i < RENDER_TABLE_BUCKETS; i++) {
        render_job *j = m->renders->buckets[i];
        while (j) {
            render_job *next = j->next;
            free(j);
            j = next;
        }
    }
    pthread_mutex_destroy(&m->renders->mu);
    free(m->renders);
    m->renders = NULL;
}

/* ---- the job table (caller holds mu) ------------------------------------------------- */

static render_job **slot_of(render_table *t, const char *key)
{
    size_t b = media_bucket(key) * 7919u % RENDER_TABLE_BUCKETS;
    render_job **pp = &t->buckets[b];
    while (*pp && strcmp((*pp)->key, key) != 0) pp = &(*pp)->next;
    return pp;
}

static void prune_failures(render_table *t, int64_t now);

static void unlink_job(render_table *t, render_job *j)
{
    render_job **pp = slot_of(t, j->key);
    if (*pp == j) *pp = j->next;
    if (j->state == JOB_FAILED || j->state == JOB_ELSEWHERE) t->n_failed--;
}

/* Remember that key's render failed with result (caller holds the lock). */
static void remember_failure(render_table *t, const char *key, int result, int64_t now)
{
    prune_failures(t, now);
    render_job **pp = slot_of(t, key), *j = *pp;
    if (j) unlink_job(t, j);
    else if (!(j = calloc(1, sizeof(*j)))) return; /* only a cache */
    snprintf(j->key, sizeof(j->key), "%s", key);
    j->state = JOB_FAILED;
    j->result = result;
    j->failed_at_ms = now;
    j->next = NULL;
    *slot_of(t, key) = j;
    t->n_failed++;
}

/* How long a failed render is remembered (here, and in its claim for the others). */
static int64_t failure_ttl_ms(int result)
{
    return result == RENDER_E_NOMEM || result == RENDER_E_IO ? RENDER_FAILED_TRANSIENT_TTL_MS
                                                             : RENDER_FAILED_CONTENT_TTL_MS;
}

static bool failure_expired(const render_job *j, int64_t now)
{
    return now - j->failed_at_ms >= failure_ttl_ms(j->result);
}

/* Drop expired failures; when still full, all of them (they are only a cache). */
static void prune_failures(render_table *t, int64_t now)
{
    for (int pass = 0; pass < 2 && t->n_failed >= RENDER_FAILED_MAX; pass++) {
        for (size_t i = 0; i < RENDER_TABLE_BUCKETS; i++) {
            render_job **pp = &t->buckets[i];
            while (*pp) {
                render_job *j = *pp;
                bool stale = j->state == JOB_ELSEWHERE && j->recheck_at_ms <= now;
                bool drop = j->state == JOB_FAILED && (pass == 1 || failure_expired(j, now));
                if (stale || drop) {
                    *pp = j->next;
                    t->n_failed--;
                    free(j);
                } else {
                    pp = &j->next;
                }
            }
        }
    }
}

/* ---- the render task (render pool) ----------------------------------------------------- */

static int write_thumbnail(media *m, const char *dst, const uint8_t *buf, size_t len)
{
    store_tmp t;
    if (store_tmp_open_derived(m, dst, &t) < 0) return RENDER_E_IO;
    if (store_write_all(t.fd, buf, len) < 0) {
        m->h->log(m->self, ATRIUM_LOG_ERROR, "cannot write thumbnail %s: %s", dst, strerror(errno));
        store_tmp_discard(&t);
        return RENDER_E_IO;
    }
    int rc = store_tmp_commit(m, &t, dst, false);
    /* EEXIST: the same thumbnail was committed meanwhile (another process): fine. */
    return rc == 0 || rc == -EEXIST ? RENDER_OK : RENDER_E_IO;
}

static void render_task(void *arg, bool cancelled)
{
    render_task_arg *j = arg;
    media *m = j->m;
    const atrium_host *h = m->h;
    int rc = RENDER_UNQUEUED;
    if (!cancelled) {
        h->metric_add(m->m_renders_running, 1);
        uint8_t *buf = NULL;
        size_t len = 0;
        rc = RENDER_OK;
        /* storage: s3 - rendered before (here, or by another process): read through. */
        bool from_bucket = s3_enabled(m) && s3_thumbnail_fetch(m, j->dst) == S3_OK;
        if (!from_bucket && j->media_id[0] && s3_fetch_original(m, j->media_id, j->src) != S3_OK)
            rc = RENDER_E_IO; /* logged; the request falls back or gets 503 */
        if (!from_bucket && rc == RENDER_OK)
            rc = render_thumbnail(j->src, &j->size, m->cfg.max_image_pixels, &buf, &len);
        if (!from_bucket && rc == RENDER_OK) {
            rc = write_thumbnail(m, j->dst, buf, len);
            render_free(buf);
            /* In the bucket before the claim ends: the next process reads it through. */
            if (rc == RENDER_OK && s3_enabled(m)) s3_thumbnail_store(m, j->dst);
        }
        h->metric_add(m->m_renders_running, -1);
        if (!from_bucket) h->metric_add(rc == RENDER_OK ? m->m_renders_ok : m->m_renders_failed, 1);
        if (rc != RENDER_OK)
            h->log(m->self,
                   rc == RENDER_E_IO || rc == RENDER_E_NOMEM ? ATRIUM_LOG_ERROR : ATRIUM_LOG_INFO,
                   "thumbnail %s: %s", j->key, render_strerror(rc));
    }
    /* The file is committed (or the failure known) before the claim ends: a process
     * that takes the claim after this finds the file. Cancelled (stopping): the claim
     * lapses. */
    char claim[THUMB_KEY_MAX + sizeof(RENDER_CLAIM_PREFIX)];
    snprintf(claim, sizeof(claim), RENDER_CLAIM_PREFIX "%s", j->key);
    if (!cancelled)
        cluster_claim_end(m, MEDIA_CH_RENDER, claim, j->key, rc,
                          rc == RENDER_OK ? 0 : failure_ttl_ms(rc));
    if (rc != RENDER_OK && rc != RENDER_UNQUEUED) { /* later requests learn it too, a while */
        render_table *t = m->renders;
        pthread_mutex_lock(&t->mu);
        remember_failure(t, j->key, rc, h->now_ms());
        pthread_mutex_unlock(&t->mu);
    }
    h->flight_finish(j->flight, rc, NULL, NULL); /* wakes every request waiting for it */
    free(j);
}

/* ---- answers ------------------------------------------------------------------------- */

static int respond_render_failure(media *m, atrium_req *req, int result)
{
    const atrium_host *h = m->h;
    switch (result) {
    case RENDER_E_TOO_LARGE:
        h->respond_error(req, 413, "M_TOO_LARGE", "The image is too large to thumbnail");
        break;
    case RENDER_E_NOT_IMAGE:
    case RENDER_E_DECODE:
        h->respond_error(req, 400, "M_UNKNOWN",
                         "Cannot generate thumbnails for the requested content");
        break;
    default:
        h->respond_error(req, 503, "M_UNKNOWN",
                         "The thumbnail could not be generated now; retry shortly");
        break;
    }
    return ATRIUM_DONE;
}

/* What names a rendering: "<sha256>/<W>x<H>-<method>[-anim]" (job key and ETag). */
static void thumb_key(const char *sha256, const media_size *s, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%dx%d-%s%s", sha256, s->width, s->height, s->crop ? "crop" : "scale",
             s->animated ? "-anim" : "");
}

static void thumb_etag(const char *sha256, const media_size *s, char *out, size_t cap)
{
    char key[THUMB_KEY_MAX];
    thumb_key(sha256, s, key, sizeof(key));
    snprintf(out, cap, "\"%s\"", key);
}

/* Serve an open thumbnail (or original) file inline. */
static int serve_file(media *m, atrium_req *req, int fd, uint64_t size, const char *type,
                      const char *ext, const char *etag)
{
    const atrium_host *h = m->h;
    char disposition[64];
    snprintf(disposition, sizeof(disposition), "inline; filename=\"" THUMB_NAME ".%s\"", ext);
    int rc = delivery_respond_file(m, req, 200, type, disposition, fd, 0, size);
    if (rc < 0) return rc;
    delivery_success_headers(m, req, etag);
    media_req *st = h->req_state(req);
    if (!st || !st->federation) h->respond_header(req, "Content-Disposition", disposition);
    h->metric_add(m->m_thumbnails, 1);
    return ATRIUM_DONE;
}

static const char *ext_of(const char *content_type)
{
    if (strncasecmp(content_type, "image/jpeg", 10) == 0) return "jpg";
    if (strncasecmp(content_type, "image/png", 9) == 0) return "png";
    if (strncasecmp(content_type, "image/gif", 9) == 0) return "gif";
    return "webp";
}

/* A stored image served as it is, under its own type: an original that is its own
 * thumbnail, or the origin's thumbnail of remote media (a safe image type). */
static int serve_original(media *m, atrium_req *req, const media_row *row)
{
    char etag[SHA256_HEX_CHARS + 3], path[MEDIA_PATH_MAX];
    snprintf(etag, sizeof(etag), "\"%s\"", row->sha256);
    if (media_etag_matches(m->h->req_header(req, "If-None-Match"), etag))
        return delivery_not_modified(m, req, etag);
    if (store_row_path(m, row, path, sizeof(path)) < 0) return ATRIUM_E_INVAL;
    int rc = download_read_through(m, req, row, path);
    if (rc != MEDIA_GO) return rc;
    uint64_t size;
    int fd = delivery_open(m, req, path, &size);
    if (fd < 0) return ATRIUM_DONE;
    return serve_file(m, req, fd, size, row->content_type, ext_of(row->content_type), etag);
}

/* Open an existing thumbnail: fd, -1 when there is none, -2 with a response set. */
static int open_thumb(media *m, atrium_req *req, const char *path, uint64_t *size)
{
    if (access(path, F_OK) < 0 && errno == ENOENT) return -1;
    int fd = delivery_open(m, req, path, size);
    return fd >= 0 ? fd : -2;
}

static int serve_thumb(media *m, atrium_req *req, const media_row *row, const media_size *s, int fd,
                       uint64_t size)
{
    char etag[THUMB_KEY_MAX + 8];
    thumb_etag(row->sha256, s, etag, sizeof(etag));
    return serve_file(m, req, fd, size, "image/webp", "webp", etag);
}

/* No render in time: the nearest thumbnail that exists (same method first), else 503. */
static int fallback(media *m, atrium_req *req, const media_row *row, const media_size *want)
{
    const atrium_host *h = m->h;
    const media_size *best = NULL;
    long best_score = 0;
    char path[MEDIA_PATH_MAX], best_path[MEDIA_PATH_MAX];
    for (size_t i = 0; i < m->cfg.n_sizes; i++) {
        const media_size *s = &m->cfg.sizes[i];
        if (store_thumb_path(m, row->sha256, s, path, sizeof(path)) < 0 || access(path, F_OK) < 0)
            continue;
        long score = labs((long)s->width * s->height - (long)want->width * want->height) +
                     (s->crop != want->crop ? FALLBACK_OTHER_METHOD_PENALTY : 0);
        if (best && score >= best_score) continue;
        best = s;
        best_score = score;
        snprintf(best_path, sizeof(best_path), "%s", path);
    }
    uint64_t size = 0;
    int fd = best ? open_thumb(m, req, best_path, &size) : -1;
    if (fd == -2) return ATRIUM_DONE;
    if (fd >= 0) {
        h->metric_add(m->m_fallback_nearest, 1);
        return serve_thumb(m, req, row, best, fd, size);
    }
    h->metric_add(m->m_fallback_unavailable, 1);
    h->respond_error(req, 503, "M_UNKNOWN", "The thumbnail is being generated; retry shortly");
    return ATRIUM_DONE;
}

/* The render task for key, the work of flight f; NULL on OOM. */
static render_task_arg *task_new(media *m, atrium_flight *f, const media_row *row,
                                 const media_size *s, const char *key, const char *dst)
{
    render_task_arg *j = calloc(1, sizeof(*j));
    if (!j || store_row_path(m, row, j->src, sizeof(j->src)) < 0) {
        free(j);
        return NULL;
    }
    snprintf(j->key, sizeof(j->key), "%s", key);
    snprintf(j->dst, sizeof(j->dst), "%s", dst);
    if (s3_enabled(m) && !row->file_name[0])
        snprintf(j->media_id, sizeof(j->media_id), "%s", row->media_id);
    j->m = m;
    j->flight = f;
    j->size = *s;
    return j;
}

/* What the claim of key makes of the render (caller holds the table's lock; c is its
 * CLAIMING entry, unlinked, or NULL): RENDER_OK (the file is there now: look again),
 * RENDER_ELSEWHERE (remembered here until its recheck), a failure remembered elsewhere,
 * or 0 - render it here. c is reused or freed. */
static int judge_claim_locked(media *m, render_job *c, const char *key, int who, int result,
                              bool exists)
{
    render_table *t = m->renders;
    int64_t now = m->h->now_ms();
    bool ended_elsewhere = c && c->ended_elsewhere;
    if (exists || (who == CLAIM_HELD && ended_elsewhere) || who == CLAIM_MINE) {
        free(c);
        return exists || who != CLAIM_MINE ? RENDER_OK : 0;
    }
    if (who == CLAIM_RESULT) {
        free(c);
        remember_failure(t, key, result, now);
        return result;
    }
    prune_failures(t, now);
    if (!c && !(c = calloc(1, sizeof(*c)))) return RENDER_ELSEWHERE; /* not remembered */
    snprintf(c->key, sizeof(c->key), "%s", key);
    c->state = JOB_ELSEWHERE;
    c->recheck_at_ms = now + (cluster_live(m) ? RENDER_RECHECK_LIVE_MS : RENDER_RECHECK_MS);
    render_job *old = *slot_of(t, key);
    if (old) { /* none expected: this flight leads */
        unlink_job(t, old);
        free(old);
    }
    c->next = NULL;
    *slot_of(t, key) = c;
    t->n_failed++;
    return RENDER_ELSEWHERE;
}

/* The leader of key's flight f: ask the database which process renders it (a CLAIMING
 * entry in the table meanwhile, so another process's notification of its end is not
 * missed), then queue the render here, or end the flight with what the claim says. On the
 * request's thread (one statement; no connection held while rendering). */
static void lead_render(media *m, atrium_flight *f, const media_row *row, const media_size *s,
                        const char *key, const char *dst)
{
    const atrium_host *h = m->h;
    render_table *t = m->renders;
    render_job *c = calloc(1, sizeof(*c));
    pthread_mutex_lock(&t->mu);
    render_job **pp = slot_of(t, key);
    if (*pp) { /* a stale entry another run left: this flight's claim replaces it */
        render_job *old = *pp;
        unlink_job(t, old);
        free(old);
    }
    if (c) {
        snprintf(c->key, sizeof(c->key), "%s", key);
        c->state = JOB_CLAIMING;
        *slot_of(t, key) = c;
    }
    pthread_mutex_unlock(&t->mu);
    char claim[THUMB_KEY_MAX + sizeof(RENDER_CLAIM_PREFIX)];
    snprintf(claim, sizeof(claim), RENDER_CLAIM_PREFIX "%s", key);
    int result = 0;
    int64_t left_ms = -1;
    int who = cluster_claim(m, claim, RENDER_CLAIM_TTL_MS, &result, &left_ms);
    /* Claimed just after another process ended the same render: its file is there. */
    bool exists = access(dst, F_OK) == 0;
    if (who == CLAIM_MINE && exists) cluster_claim_end(m, MEDIA_CH_RENDER, claim, key, 0, 0);
    pthread_mutex_lock(&t->mu);
    if (c) unlink_job(t, c);
    int end = judge_claim_locked(m, c, key, who, result, exists);
    pthread_mutex_unlock(&t->mu);
    if (end != 0) {
        h->flight_finish(f, end, NULL, NULL);
        return;
    }
    render_task_arg *j = task_new(m, f, row, s, key, dst);
    if (!j || h->pool_submit(m->render_pool, render_task, j) < 0) {
        free(j);
        cluster_claim_end(m, MEDIA_CH_RENDER, claim, key, 0, 0);
        h->flight_finish(f, RENDER_UNQUEUED, NULL, NULL); /* they fall back */
    }
}

/* What another process's notification does to one job (caller holds the table's lock):
 * an ELSEWHERE job is forgotten (its waiters, woken by the caller, look at the file);
 * a CLAIMING one is marked so its claim's answer is not believed. True when j was freed. */
static bool job_ended_elsewhere(render_table *t, render_job *j)
{
    if (j->state == JOB_CLAIMING) j->ended_elsewhere = true;
    if (j->state != JOB_ELSEWHERE) return false;
    unlink_job(t, j);
    free(j);
    return true;
}

void thumbnails_ended_elsewhere(media *m, const char *key)
{
    render_table *t = m->renders;
    pthread_mutex_lock(&t->mu);
    if (key) {
        render_job *j = *slot_of(t, key);
        if (j) job_ended_elsewhere(t, j);
    } else { /* notifications may have been missed: every job */
        for (size_t i = 0; i < RENDER_TABLE_BUCKETS; i++) {
            render_job *j = t->buckets[i];
            while (j) {
                render_job *next = j->next;
                job_ended_elsewhere(t, j);
                j = next;
            }
        }
    }
    pthread_mutex_unlock(&t->mu);
}

/* A run after waiting on the render's flight (st->render_flight): MEDIA_GO to look at the
 * file (or, ELSEWHERE, at the table) again, or the outcome: its failure, the nearest size
 * past the request's own deadline or when it could not be queued, 503 while stopping. */
static int after_render(media *m, atrium_req *req, media_req *st, const media_row *row,
                        const media_size *s)
{
    atrium_flight *f = st->render_flight;
    st->render_flight = NULL;
    int result = 0;
    int rc = m->h->flight_result(req, f, &result, NULL);
    if (rc == ATRIUM_E_STOPPED) {
        m->h->respond_error(req, 503, "M_UNKNOWN", "The server is stopping");
        return ATRIUM_DONE;
    }
    if (rc < 0 || result == RENDER_UNQUEUED) return fallback(m, req, row, s);
    if (result == RENDER_OK || result == RENDER_ELSEWHERE) return MEDIA_GO;
    return respond_render_failure(m, req, result);
}

/* The thumbnail file does not exist: join the render for it (its flight: leading it, when
 * none runs here, claims it for this process when no process renders it) and park until
 * it ends; or, while another process renders it, park on its event until that process's
 * notification or the recheck. Returns MEDIA_GO when the file may exist now. */
static int await_render(media *m, atrium_req *req, media_req *st, const media_row *row,
                        const media_size *s, const char *dst)
{
    const atrium_host *h = m->h;
    char key[THUMB_KEY_MAX];
    thumb_key(row->sha256, s, key, sizeof(key));
    render_table *t = m->renders;
    int64_t now = h->now_ms();
    if (!st->waiting_render) {
        st->waiting_render = true;
        st->render_deadline_ms = now + m->cfg.render_wait_ms;
    } else if (now >= st->render_deadline_ms) {
        return fallback(m, req, row, s);
    }
    int result = 0, rc = MEDIA_GO;
    pthread_mutex_lock(&t->mu);
    render_job *j = *slot_of(t, key);
    bool stale = j && ((j->state == JOB_FAILED && failure_expired(j, now)) ||
                       (j->state == JOB_ELSEWHERE && now >= j->recheck_at_ms));
    if (stale) { /* a failure forgotten, or time to look at another process's render */
        unlink_job(t, j);
        free(j);
        j = NULL;
    }
    if (j && j->state == JOB_FAILED) {
        result = j->result;
        rc = ATRIUM_DONE;
    } else if (j && j->state == JOB_ELSEWHERE) {
        /* Parked under the table's lock, so the notification (which drops the entry under
         * the same lock, then signals) cannot pass us by. Read the row again when woken,
         * so a quarantine meanwhile applies (set before parking). */
        int64_t until = j->recheck_at_ms < st->render_deadline_ms ? j->recheck_at_ms
                                                                  : st->render_deadline_ms;
        st->have_row = false;
        rc = h->park(req, m->events[media_bucket(key)], until) == 0 ? ATRIUM_PARKED
                                                                     : ATRIUM_E_STOPPED;
    }
    pthread_mutex_unlock(&t->mu);
    if (rc == ATRIUM_DONE) return respond_render_failure(m, req, result);
    if (rc == ATRIUM_PARKED) return ATRIUM_PARKED;
    if (rc == ATRIUM_E_STOPPED) {
        h->respond_error(req, 503, "M_UNKNOWN", "The server is stopping");
        return ATRIUM_DONE;
    }
    /* A render leaves its flight only after its file was committed. */
    if (access(dst, F_OK) == 0) return MEDIA_GO;
    /* Nothing remembered: the render of this process, led or joined. */
    atrium_flight *f = NULL;
    rc = h->flight_join(req, m->render_flights, key, st->render_deadline_ms, 0, &f);
    if (rc == ATRIUM_E_LIMIT) return fallback(m, req, row, s);
    if (rc == ATRIUM_E_STOPPED) {
        h->respond_error(req, 503, "M_UNKNOWN", "The server is stopping");
        return ATRIUM_DONE;
    }
    if (rc < 0) return rc;
    st->render_flight = f;
    st->have_row = false; /* read again when woken (a quarantine meanwhile applies) */
    if (rc == ATRIUM_FLIGHT_JOINED) {
        h->metric_add(m->m_render_coalesced, 1);
        return ATRIUM_PARKED;
    }
    lead_render(m, f, row, s, key, dst); /* from here on it may end (and wake us) */
    return ATRIUM_PARKED;
}

/* ---- the request ------------------------------------------------------------------------ */

/* A positive integer query parameter up to max; 0 when absent, -1 when invalid. */
static long int_param(const char *v, long max)
{
    if (!v) return 0;
    int64_t n;
    return atrium_parse_int64(v, 1, max, &n) == 0 ? (long)n : -1;
}

typedef struct thumb_request {
    int width, height;
    bool crop, animated;
} thumb_request;

static int parse_request(media *m, atrium_req *req, thumb_request *out)
{
    const atrium_host *h = m->h;
    const char *w = h->req_query(req, "width"), *hh = h->req_query(req, "height");
    if (!w || !hh) {
        h->respond_error(req, 400, "M_MISSING_PARAM", "width and height are required");
        return ATRIUM_DONE;
    }
    long wv = int_param(w, MEDIA_THUMB_MAX_SIDE), hv = int_param(hh, MEDIA_THUMB_MAX_SIDE);
    if (wv < 1 || hv < 1) {
        h->respond_error(req, 400, "M_INVALID_PARAM",
                         "width and height must be integers from 1 to %d", MEDIA_THUMB_MAX_SIDE);
        return ATRIUM_DONE;
    }
    const char *method = h->req_query(req, "method");
    if (method && strcmp(method, "crop") != 0 && strcmp(method, "scale") != 0) {
        h->respond_error(req, 400, "M_INVALID_PARAM", "method must be \"crop\" or \"scale\"");
        return ATRIUM_DONE;
    }
    const char *animated = h->req_query(req, "animated");
    if (animated && strcmp(animated, "true") != 0 && strcmp(animated, "false") != 0) {
        h->respond_error(req, 400, "M_INVALID_PARAM", "animated must be true or false");
        return ATRIUM_DONE;
    }
    out->width = (int)wv;
    out->height = (int)hv;
    out->crop = method && strcmp(method, "crop") == 0;
    out->animated = animated && strcmp(animated, "true") == 0;
    return MEDIA_GO;
}

/* May the original answer as it is? A safe image type, static unless animation was
 * asked for, and no larger than the box. */
static bool original_serves(const media_row *row, bool animated, int w, int h)
{
    return media_type_thumbnail_safe(row->content_type) && (row->frames <= 1 || animated) &&
           media_fits_within(row->width, row->height, w, h);
}

static int serve(media *m, atrium_req *req, bool legacy)
{
    const atrium_host *h = m->h;
    media_req *st = NULL;
    int rc = delivery_begin(m, req, legacy, &st);
    if (rc != MEDIA_GO) return rc;
    thumb_request tr;
    rc = parse_request(m, req, &tr);
    if (rc != MEDIA_GO) return rc;
    /* For remote media the origin's own thumbnail of the chosen size is asked first. */
    st->thumb_wanted = true;
    st->thumb_size = *media_size_choose(m->cfg.sizes, m->cfg.n_sizes, tr.width, tr.height, tr.crop);
    st->thumb_size.animated = tr.animated;
    rc = delivery_locate(m, req, st, legacy);
    if (rc != MEDIA_GO) return rc;
    const media_row *row = &st->row;
    if (st->row_is_thumbnail) return serve_original(m, req, row);

    if (row->width <= 0 || row->height <= 0)
        return respond_render_failure(m, req, RENDER_E_NOT_IMAGE);
    if ((int64_t)row->width * row->height > m->cfg.max_image_pixels)
        return respond_render_failure(m, req, RENDER_E_TOO_LARGE);
    if (original_serves(row, tr.animated, tr.width, tr.height)) return serve_original(m, req, row);
    media_size chosen =
        *media_size_choose(m->cfg.sizes, m->cfg.n_sizes, tr.width, tr.height, tr.crop);
    const media_size *s = &chosen;
    if (original_serves(row, tr.animated, s->width, s->height)) return serve_original(m, req, row);
    /* animated=true on an animation: every frame; otherwise (false, absent, or a still
     * image) the first frame only. */
    chosen.animated = tr.animated && row->frames > 1;

    char etag[THUMB_KEY_MAX + 8], path[MEDIA_PATH_MAX];
    thumb_etag(row->sha256, s, etag, sizeof(etag));
    if (media_etag_matches(h->req_header(req, "If-None-Match"), etag))
        return delivery_not_modified(m, req, etag);
    if (store_thumb_path(m, row->sha256, s, path, sizeof(path)) < 0) return ATRIUM_E_INVAL;
    for (;;) {
        uint64_t size;
        int fd = open_thumb(m, req, path, &size);
        if (fd >= 0) return serve_thumb(m, req, row, s, fd, size);
        if (fd == -2) return ATRIUM_DONE;
        rc = st->render_flight ? after_render(m, req, st, row, s)
                               : await_render(m, req, st, row, s, path);
        if (rc != MEDIA_GO) return rc;
    }
}

int thumbnail_handler(atrium_req *req)
{
    return serve(media_of(req), req, false);
}

int thumbnail_legacy_handler(atrium_req *req)
{
    return serve(media_of(req), req, true);
}
