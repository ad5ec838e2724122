/*
 * plugins/media/delivery.c - how every GET/HEAD of media content begins: the delivery
 * line, then authorization, then the media row, the trust-and-safety policy and the wait
 * for an asynchronous upload; plus what every success and every failure says.
 *
 * Decisions owned here (docs/adr/0002-delivery-held-to-the-last-byte.md):
 *   - a delivery slot is taken before anything else, in a fair parked line keyed by the
 *     client's address (tokens are not verified yet, so they are never keys); the slot is
 *     a hold, released by the core after the last body byte or when the client leaves;
 *   - the access token is checked only once the slot is held, so a request that waited
 *     is judged by the token's state when it is served (a revoked token is refused);
 *   - past the line: 429 with retry_after_ms, Retry-After and no-store;
 *   - quarantined media (by ID or by content hash) is 404 M_NOT_FOUND, exactly like
 *     media that does not exist;
 *   - a download of created-but-empty media waits parked (no thread) up to timeout_ms,
 *     re-reading its row when the upload lands, here or in another process (its
 *     notification, cluster.c), and every UPLOAD_RECHECK_MS besides (every
 *     UPLOAD_RECHECK_LIVE_MS while notifications arrive), then 504 M_NOT_YET_UPLOADED;
 *   - successful media responses carry the sandboxing CSP, CORP cross-origin,
 *     `Cache-Control: private, max-age=86400`, nosniff and the ETag; failures carry
 *     no-store (host->respond_error adds it).
 * Another server's media leaves delivery_locate for remote.c (the remote cache and the
 * fetch); a federation route (the core verified the calling server: req_origin) skips
 * the token and is answered multipart/mixed (fed_serve.c).
 * JSON endpoints, /health and /versions never come here, so they never wait.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "media.h"
#include "atrium/parse.h"

/* A waiter for an asynchronous upload re-reads its row this often: rarely while the other
 * processes' notifications arrive (they wake it when the upload lands anywhere), often
 * while they may be missed. */
#define UPLOAD_RECHECK_MS 2000
#define UPLOAD_RECHECK_LIVE_MS 10000

media_req *media_req_state(media *m, atrium_req *req)
{
    const atrium_host *h = m->h;
    media_req *st = h->req_state(req);
    if (st) return st;
    st = h->req_alloc(req, sizeof(*st));
    if (!st) {
        h->respond_error(req, 500, "M_UNKNOWN", "Out of memory");
        return NULL;
    }
    memset(st, 0, sizeof(*st));
    st->arrival_ms = h->now_ms();
    h->req_set_state(req, st);
    return st;
}

size_t media_bucket(const char *key)
{
    uint64_t x = 1469598103934665603ull; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)key; *p; p++) {
        x ^= *p;
        x *= 1099511628211ull;
    }
    return (size_t)(x % MEDIA_EVENT_BUCKETS);
}

int64_t media_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int media_reply(media *m, atrium_req *req, json_t *body)
{
    return m->h->respond_json(req, 200, body) < 0 ? ATRIUM_E_NOMEM : ATRIUM_DONE;
}

/* ---- the line and authorization ----------------------------------------------------- */

const char *media_authenticate(media *m, atrium_req *req)
{
    /* The host's failures (401, 503) already carry Cache-Control: no-store. */
    return m->h->req_authenticate(req);
}

typedef struct delivering_hold {
    media *m;
} delivering_hold;

static void delivering_release(void *arg)
{
    delivering_hold *d = arg;
    d->m->h->metric_add(d->m->m_delivering, -1);
}

/* The admission rule's answer for a request the line did not take. */
static int refuse_admission(media *m, atrium_req *req, int rc)
{
    const atrium_host *h = m->h;
    switch (rc) {
    case ATRIUM_E_LIMIT:
        h->respond_limited(req, m->cfg.delivery_retry_after_ms,
                           "Too many media requests are waiting; retry shortly");
        return ATRIUM_DONE;
    case ATRIUM_E_TIMEOUT:
        h->respond_limited(req, m->cfg.delivery_retry_after_ms,
                           "Waited too long for a media delivery slot; retry shortly");
        return ATRIUM_DONE;
    case ATRIUM_E_STOPPED:
        h->respond_error(req, 503, "M_UNKNOWN", "The server is stopping");
        return ATRIUM_DONE;
    default: return rc < 0 ? rc : ATRIUM_E_STATE;
    }
}

/* Track how many authorizations run at once, and the most ever seen. */
static void authorizing_begin(media *m)
{
    int now = atomic_fetch_add(&m->authorizing, 1) + 1;
    m->h->metric_add(m->m_authorizing, 1);
    int peak = atomic_load(&m->authorizing_peak);
    while (now > peak && !atomic_compare_exchange_weak(&m->authorizing_peak, &peak, now)) {
    }
    if (now > peak) m->h->metric_set(m->m_authorizing_peak, now);
}

static void authorizing_end(media *m)
{
    atomic_fetch_sub(&m->authorizing, 1);
    m->h->metric_add(m->m_authorizing, -1);
}

int delivery_begin(media *m, atrium_req *req, bool legacy, media_req **st)
{
    if (legacy && !m->cfg.legacy_media) {
        m->h->respond_error(req, 404, "M_NOT_FOUND",
                            "Media not found: use the authenticated /_matrix/client/v1/media "
                            "endpoints");
        return ATRIUM_DONE;
    }
    *st = media_req_state(m, req);
    if (!*st) return ATRIUM_DONE;
    /* A federation route: the core verified the calling server; there is no token. */
    if (m->h->req_origin(req)) (*st)->federation = true;
    return delivery_enter(m, req, *st, !legacy && !(*st)->federation);
}

int delivery_enter(media *m, atrium_req *req, media_req *st, bool authenticate)
{
    const atrium_host *h = m->h;
    if (h->req_run_reason(req) == ATRIUM_RUN_SHUTDOWN) {
        if (st->fw) return fetch_budget_enter(m, req, st); /* leaves the line, answers 503 */
        h->respond_error(req, 503, "M_UNKNOWN", "The server is stopping");
        return ATRIUM_DONE;
    }
    if (!st->admitted) {
        int rc = h->line_admit(req, m->delivery);
        if (rc == ATRIUM_PARKED) return ATRIUM_PARKED;
        if (rc != ATRIUM_OK) return refuse_admission(m, req, rc);
        st->admitted = true;
        delivering_hold *d = h->req_alloc(req, sizeof(*d));
        if (d) {
            d->m = m;
            h->metric_add(m->m_delivering, 1);
            h->req_hold(req, delivering_release, d);
        }
    }
    if (!authenticate) return MEDIA_GO;
    authorizing_begin(m);
    const char *user = media_authenticate(m, req);
    authorizing_end(m);
    if (!st->counted_auth) {
        st->counted_auth = true;
        h->metric_add(m->m_authorizations, 1);
    }
    return user ? MEDIA_GO : ATRIUM_DONE;
}

/* ---- the media row -------------------------------------------------------------------- */

static int read_row(media *m, atrium_req *req, media_req *st, const char *media_id)
{
    const atrium_host *h = m->h;
    if (rowcache_get(m, m->server_name, media_id, &st->row)) {
        st->have_row = true;
        return MEDIA_GO;
    }
    uint64_t cache_gen = rowcache_gen(m);
    PGconn *c = h->db_acquire(MEDIA_DB_WAIT_MS);
    if (!c) {
        h->respond_error(req, 503, "M_UNKNOWN", "The database is busy or unreachable; retry");
        return ATRIUM_DONE;
    }
    int rc = media_db_get(h, m->self, c, media_id, &st->row);
    h->db_release(c);
    if (rc == ATRIUM_E_DB) {
        h->respond_error(req, 503, "M_UNKNOWN", "The database is busy or unreachable; retry");
        return ATRIUM_DONE;
    }
    if (rc == MEDIA_DB_NOTFOUND) {
        h->respond_error(req, 404, "M_NOT_FOUND", "Media not found");
        return ATRIUM_DONE;
    }
    st->have_row = true;
    rowcache_put(m, m->server_name, &st->row, cache_gen);
    return MEDIA_GO;
}

int64_t delivery_timeout_ms(media *m, atrium_req *req)
{
    const char *v = m->h->req_query(req, "timeout_ms");
    if (!v) return m->cfg.upload_wait_default_ms;
    int64_t ms, max = m->cfg.upload_wait_max_ms;
    int rc = atrium_parse_int64(v, 0, max, &ms); /* past the maximum: clamped to it */
    if (rc == ATRIUM_E_INVAL || (rc == ATRIUM_E_LIMIT && ms != max)) return -1;
    return ms;
}

static void upload_waiter_release(void *arg)
{
    media *m = arg;
    atomic_fetch_sub(&m->upload_waiters, 1);
    m->h->metric_add(m->m_upload_waiters, -1);
}

/* Count the request among those waiting for an upload until it ends (a hold); false when
 * half the delivery slots already wait so. */
static bool upload_waiter_enter(media *m, atrium_req *req)
{
    int cap = m->cfg.delivery_slots / 2 > 0 ? m->cfg.delivery_slots / 2 : 1;
    if (atomic_fetch_add(&m->upload_waiters, 1) >= cap) {
        atomic_fetch_sub(&m->upload_waiters, 1);
        return false;
    }
    m->h->metric_add(m->m_upload_waiters, 1);
    return m->h->req_hold(req, upload_waiter_release, m) == 0;
}

static int64_t upload_recheck_ms(const media *m)
{
    return cluster_live(m) ? UPLOAD_RECHECK_LIVE_MS : UPLOAD_RECHECK_MS;
}

/* The row says "created, not uploaded": wait parked, or answer. */
static int await_upload(media *m, atrium_req *req, media_req *st, uint64_t gen)
{
    const atrium_host *h = m->h;
    const media_row *row = &st->row;
    int64_t now = h->now_ms();
    if (row->expires_ts > 0 && row->expires_ts <= media_wall_ms()) {
        h->respond_error(req, 404, "M_NOT_FOUND", "Media not found");
        return ATRIUM_DONE;
    }
    if (!st->waiting_upload) {
        int64_t wait_ms = delivery_timeout_ms(m, req);
        if (wait_ms < 0) {
            h->respond_error(req, 400, "M_INVALID_PARAM",
                             "timeout_ms must be a non-negative integer");
            return ATRIUM_DONE;
        }
        /* A waiter keeps its delivery slot: at most half the slots may wait for uploads,
         * the others give up at once (the spec lets a server answer before timeout_ms). */
        if (wait_ms > 0 && !upload_waiter_enter(m, req)) wait_ms = 0;
        st->waiting_upload = true;
        st->upload_deadline_ms = now + wait_ms;
    }
    if (now >= st->upload_deadline_ms) {
        h->metric_add(m->m_not_yet_uploaded, 1);
        h->respond_error(req, 504, "M_NOT_YET_UPLOADED",
                         "The media has not been uploaded yet; retry later");
        return ATRIUM_DONE;
    }
    int64_t until = st->upload_deadline_ms, recheck = upload_recheck_ms(m);
    if (until > now + recheck) until = now + recheck;
    /* Re-read when woken, or now when the upload landed after our read (set before
     * parking: once parked, another thread may own the request). row points into st. */
    char media_id[MEDIA_ID_MAX_CHARS + 1];
    snprintf(media_id, sizeof(media_id), "%s", row->media_id);
    st->have_row = false;
    int rc = media_park_unless_woken(m, req, media_id, gen, until);
    if (rc == PARK_WOKEN) return LOCATE_AGAIN;
    if (rc != ATRIUM_PARKED) {
        h->respond_error(req, 503, "M_UNKNOWN", "The server is stopping");
        return ATRIUM_DONE;
    }
    return ATRIUM_PARKED;
}

int delivery_locate(media *m, atrium_req *req, media_req *st, bool legacy)
{
    const atrium_host *h = m->h;
    const char *server = st->federation ? m->server_name : h->req_param(req, "serverName");
    const char *media_id = h->req_param(req, "mediaId");
    if (!server || !media_server_name_valid(server)) {
        h->respond_error(req, 400, "M_INVALID_PARAM", "Invalid server name");
        return ATRIUM_DONE;
    }
    if (!media_id || !media_id_valid(media_id)) {
        h->respond_error(req, 400, "M_INVALID_PARAM", "Invalid media ID");
        return ATRIUM_DONE;
    }
    if (strcmp(server, m->server_name) != 0) {
        if (legacy && m->cfg.legacy_freeze_ts > 0) {
            /* Remote media on the frozen legacy paths: fetched only by the
             * authenticated endpoints. */
            h->respond_error(req, 404, "M_NOT_FOUND",
                             "Media not found: remote media is served only by the "
                             "authenticated /_matrix/client/v1/media endpoints");
            return ATRIUM_DONE;
        }
        return remote_locate(m, req, st, server, media_id);
    }
    for (;;) {
        uint64_t gen = 0;
        if (!st->have_row) {
            gen = media_wake_gen(m, media_id);
            int rc = read_row(m, req, st, media_id);
            if (rc != MEDIA_GO) return rc;
        }
        const media_row *row = &st->row;
        if (row->quarantined) {
            h->metric_add(m->m_refused_policy, 1);
            h->respond_error(req, 404, "M_NOT_FOUND", "Media not found");
            return ATRIUM_DONE;
        }
        if (legacy && m->cfg.legacy_freeze_ts > 0 && row->created_ts >= m->cfg.legacy_freeze_ts) {
            h->respond_error(req, 404, "M_NOT_FOUND",
                             "Media not found: media uploaded since the freeze is served only "
                             "by the authenticated /_matrix/client/v1/media endpoints");
            return ATRIUM_DONE;
        }
        if (row->uploaded) return MEDIA_GO;
        int rc = await_upload(m, req, st, gen);
        if (rc != LOCATE_AGAIN) return rc;
    }
}

void delivery_upload_landed(media *m, const char *media_id)
{
    media_wake(m, media_id);
}

/* ---- what responses say ---------------------------------------------------------------- */

void delivery_success_headers(media *m, atrium_req *req, const char *etag)
{
    const atrium_host *h = m->h;
    h->respond_header(req, "Content-Security-Policy", ATRIUM_MEDIA_CSP);
    h->respond_header(req, "Cross-Origin-Resource-Policy", ATRIUM_MEDIA_CORP);
    h->respond_header(req, "Cache-Control", ATRIUM_MEDIA_CACHE_OK);
    h->respond_header(req, "X-Content-Type-Options", ATRIUM_MEDIA_NOSNIFF);
    if (etag) h->respond_header(req, "ETag", etag);
}

int delivery_not_modified(media *m, atrium_req *req, const char *etag)
{
    int rc = m->h->respond_buffer(req, 304, NULL, "", 0);
    if (rc < 0) return rc;
    delivery_success_headers(m, req, etag);
    return ATRIUM_DONE;
}

int delivery_open(media *m, atrium_req *req, const char *path, uint64_t *size)
{
    const atrium_host *h = m->h;
    int fd = fdcache_open(m, path, size);
    if (fd == -2) {
        h->log(m->self, ATRIUM_LOG_ERROR, "cannot stat %s: %s", path, strerror(errno));
        h->respond_error(req, 500, "M_UNKNOWN", "The media file could not be read");
        return -1;
    }
    if (fd < 0) {
        int err = errno;
        if (err == EMFILE || err == ENFILE) {
            h->log(m->self, ATRIUM_LOG_WARN,
                   "out of file descriptors opening media (%s): lower "
                   "plugins.media.delivery_slots or raise the descriptor limit",
                   strerror(err));
            h->respond_error(req, 503, "M_UNKNOWN", "The server is busy; retry shortly");
        } else if (err == ENOENT) {
            h->log(m->self, ATRIUM_LOG_ERROR,
                   "media file %s is missing although its row exists: restore it from a "
                   "backup or delete the media",
                   path);
            h->respond_error(req, 404, "M_NOT_FOUND", "Media not found");
        } else {
            h->log(m->self, ATRIUM_LOG_ERROR, "cannot open %s: %s", path, strerror(err));
            h->respond_error(req, 500, "M_UNKNOWN", "The media file could not be read");
        }
        return -1;
    }
    return fd;
}

int64_t delivery_landing_read(int fd, int64_t readable, bool done, bool failed, uint64_t pos,
                              char *buf, size_t max)
{
    if (failed) return ATRIUM_STREAM_ERROR;
    if ((int64_t)pos >= readable) return done ? ATRIUM_STREAM_END : ATRIUM_STREAM_WAIT;
    size_t n = (size_t)(readable - (int64_t)pos) < max ? (size_t)(readable - (int64_t)pos) : max;
    ssize_t got;
    do {
        got = pread(fd, buf, n, (off_t)pos);
    } while (got < 0 && errno == EINTR);
    return got > 0 ? (int64_t)got : ATRIUM_STREAM_ERROR;
}
