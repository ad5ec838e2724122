/*
 * plugins/media/remote.c - another server's media on the request path: the refusals, the
 * remote cache look-up, the negative cache, and a request's way to the one fetch of its
 * file (docs/adr/0005-remote-media-fetch-pool.md owns the design; remote_fetch.c runs the
 * fetch, remote_stream.c lets waiters follow its bytes).
 *
 * A download or thumbnail whose serverName is not ours comes here from delivery_locate,
 * holding a delivery slot. In defer mode (the request pool) it is refused (404) when
 * fetching is off, allow_remote=false or the origin is blocked; a cache hit is served like
 * local media; a miss takes a fetch budget slot and is handed to the fetch pool. In
 * admitted mode (the fetch pool) the cache is looked at again, then the request joins the
 * fetch of its file - the host's single flight of its key, leading it if none runs - and
 * parks until it ends (or, following the bytes, until its landing is published); woken, it
 * reads the stored copy or answers the failure. A fetch that lands between a request's
 * miss and its join would be started twice: the table counts landed fetches, and a
 * request that finds none running but the count moved looks again (REMOTE_MAX_LOOK_AGAIN
 * times).
 *
 * The answers (Element does not retry media, so they are exact): 404 M_NOT_FOUND only when
 * the origin says the file does not exist; 502 for an unreachable origin, a bad answer, a
 * file past max_upload_size (M_TOO_LARGE) or an origin that kept answering 429; 504 at the
 * request's own deadline (timeout_ms, counted from its first run); all no-store.
 *
 * Remote thumbnails are asked of the origin at the size thumbnail.c chose while the
 * original is not cached; when the origin has none, that is remembered like a 404 and the
 * original is fetched and rendered here. The negative cache remembers a 404 or a file too
 * large for remote_not_found_cache_ms, a failure for remote_failure_cache_ms, per remote
 * file, at most REMOTE_NEGATIVE_MAX entries. The cache's bound is cache.c's. The steps one
 * by one, with their settings, are listed in plugins/media/README.md, "Remote media".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "remote.h"
#include "s3.h"

#define REMOTE_NEGATIVE_MAX 4096 /* remembered failures, at most */
#define REMOTE_MAX_ROUNDS 3 /* fetches one request may wait for (thumbnail, original, ...) */
#define REMOTE_MAX_LOOK_AGAIN 3 /* cache look-ups one request repeats before fetching anyway */
/* Fetches under way at once, per fetch budget slot: a fetch goes on after the requests
 * that wanted it were answered by their deadlines (up to remote_fetch_timeout_ms), so
 * more run than requests hold slots; past this a miss is answered 503 at once. Waiters:
 * each holds a slot, so media_fetch_max_in_flight of them at most. */
#define REMOTE_FLIGHTS_PER_SLOT 4

int remote_init(media *m)
{
    m->remote = calloc(1, sizeof(*m->remote));
    if (!m->remote) return ATRIUM_E_NOMEM;
    pthread_mutex_init(&m->remote->mu, NULL);
    int slots = m->cfg.fetch_max_in_flight;
    m->remote_flights = m->h->flights_create(m->self, "remote", slots * REMOTE_FLIGHTS_PER_SLOT,
                                             slots);
    if (!m->remote_flights) return ATRIUM_E_NOMEM;
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

/* What a cache row look-up (rc: a media_db_remote_*_get result, ATRIUM_E_DB also for no
 * connection) leads to: 503 for the database, LOOKUP_MISS, 404 for a quarantined copy, or
 * LOOKUP_HIT to go on and check the file. One rule for originals and thumbnails. */
static int judge_row(media *m, atrium_req *req, int rc, const media_row *row)
{
    if (rc == ATRIUM_E_DB) {
        m->h->respond_error(req, 503, "M_UNKNOWN", "The database is busy or unreachable; retry");
        return ATRIUM_DONE;
    }
    if (rc == MEDIA_DB_NOTFOUND) return LOOKUP_MISS;
    if (row->quarantined) {
        m->h->metric_add(m->m_refused_policy, 1);
        m->h->respond_error(req, 404, "M_NOT_FOUND", "Media not found");
        return ATRIUM_DONE;
    }
    return LOOKUP_HIT;
}

/* LOOKUP_HIT with st->row, LOOKUP_MISS, or ATRIUM_DONE with the answer set. */
static int cache_lookup(media *m, atrium_req *req, media_req *st, const char *origin,
                        const char *media_id)
{
    const atrium_host *h = m->h;
    PGconn *c = h->db_acquire(MEDIA_DB_WAIT_MS);
    int rc = c ? media_db_remote_get(h, m->self, c, origin, media_id, &st->row) : ATRIUM_E_DB;
    if (c) h->db_release(c);
    if ((rc = judge_row(m, req, rc, &st->row)) != LOOKUP_HIT) return rc;
    char path[MEDIA_PATH_MAX];
    /* Here, or (storage: s3) read through from the bucket: remote_s3.c. */
    rc = store_row_path(m, &st->row, path, sizeof(path)) < 0
             ? LOOKUP_MISS
             : remote_s3_present(m, req, &st->row, path);
    if (rc != LOOKUP_HIT) {
        if (rc == LOOKUP_MISS)
            h->log(m->self, ATRIUM_LOG_WARN,
                   "remote media %s/%s: the cached copy %s is missing; fetching it again",
                   origin, media_id, st->row.file_name);
        return rc;
    }
    st->have_row = true;
    h->metric_add(m->m_remote_hits, 1);
    cache_touch(m, origin, media_id);
    return LOOKUP_HIT;
}

/* What names one upstream resource: "<origin>/<media ID>" for the original,
 * "<origin>/<media ID>/<W>x<H>-<method>[-anim]" for the origin's thumbnail of a size. */
void remote_key(const char *origin, const char *media_id, const media_size *thumb, char *out,
                size_t cap)
{
    if (!thumb) {
        snprintf(out, cap, "%s/%s", origin, media_id);
        return;
    }
    snprintf(out, cap, "%s/%s/%dx%d-%s%s", origin, media_id, thumb->width, thumb->height,
             thumb->crop ? "crop" : "scale", thumb->animated ? "-anim" : "");
}

/* ---- the negative cache (under the table's lock) ------------------------------------ */

/* How long a result is remembered: 0 = not at all. */
int64_t remote_negative_ttl_ms(const media *m, int result)
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

void remote_negative_remember(media *m, remote_table *t, const char *key, int result)
{
    int64_t ttl = remote_negative_ttl_ms(m, result);
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

/* Is a result remembered for key (*result)? An expired entry is dropped. */
static bool negative_lookup(media *m, remote_table *t, const char *key, int *result)
{
    remote_negative **pp = negative_slot(t, key), *n = *pp;
    if (!n) return false;
    if (n->until_ms > m->h->now_ms()) {
        *result = n->result;
        return true;
    }
    *pp = n->next;
    t->n_negative--;
    free(n);
    return false;
}

/* ---- the request ---------------------------------------------------------------------- */

/* Does the request want the origin's thumbnail (not known to have none)? */
static bool wants_thumb(const media_req *st)
{
    return st->thumb_wanted && !st->thumb_fallback;
}

/* The key of what the request wants now: the origin's thumbnail, or the original. */
static void wanted_key(const media_req *st, const char *origin, const char *media_id, char *key,
                       size_t cap)
{
    remote_key(origin, media_id, wants_thumb(st) ? &st->thumb_size : NULL, key, cap);
}

/* A request that joined the fetch of key as rc said (a flight_join result, f the flight):
 * the fetch started when it leads, ATRIUM_PARKED; it follows the published landing
 * (MEDIA_GO); or the refusal answered. */
static int joined_fetch(media *m, atrium_req *req, media_req *st, int rc, atrium_flight *f,
                        const char *key, const char *origin, const char *media_id,
                        const media_size *thumb)
{
    const atrium_host *h = m->h;
    if (rc == ATRIUM_E_STOPPED) {
        h->respond_error(req, 503, "M_UNKNOWN", "The server is stopping");
        return ATRIUM_DONE;
    }
    if (rc == ATRIUM_E_LIMIT) {
        h->respond_error(req, 503, "M_UNKNOWN", "Too many remote media fetches under way; "
                                                "retry shortly");
        return ATRIUM_DONE;
    }
    if (rc < 0) return rc;
    if (rc == ATRIUM_FLIGHT_PUBLISHED) { /* it streams: follow it */
        void *landing = NULL;
        h->metric_add(m->m_fetch_coalesced, 1);
        if (h->flight_result(req, f, NULL, &landing) != ATRIUM_FLIGHT_RESULT_EARLY)
            return remote_respond_failure(m, req, REMOTE_INTERNAL, origin);
        return remote_follow_landing(m, req, st, landing);
    }
    st->remote_flight = f;
    st->fetch_rounds++;
    if (rc == ATRIUM_FLIGHT_JOINED) {
        h->metric_add(m->m_fetch_coalesced, 1);
        return ATRIUM_PARKED;
    }
    /* It leads: the job is the flight's work, finished exactly once from here. */
    remote_job *j = remote_job_new(m, f, key, origin, media_id, thumb);
    if (!j) {
        h->flight_finish(f, REMOTE_INTERNAL, NULL, NULL);
        return ATRIUM_PARKED;
    }
    pthread_mutex_lock(&m->remote->mu);
    bool start_now = remote_origin_admit(m, m->remote, j);
    pthread_mutex_unlock(&m->remote->mu);
    if (start_now) {
        int result = remote_job_begin(j);
        if (result != REMOTE_STARTED) remote_job_complete(j, result);
    }
    return ATRIUM_PARKED;
}

/* Admitted mode: join the fetch of the file (leading it when none runs) and park.
 * ATRIUM_PARKED, LOOK_AGAIN (a fetch landed since our miss: look at the cache again),
 * MEDIA_GO (it follows a landing), or the outcome to return. */
static int join_fetch(media *m, atrium_req *req, media_req *st, const char *origin,
                      const char *media_id, const media_size *thumb)
{
    const atrium_host *h = m->h;
    char key[REMOTE_KEY_MAX];
    remote_key(origin, media_id, thumb, key, sizeof(key));
    unsigned early = st->stream_ok && !thumb && m->can_stream ? ATRIUM_FLIGHT_EARLY : 0;
    atrium_flight *f = NULL;
    /* A fetch under way first (its landing, when it streams). */
    int rc = h->flight_join(req, m->remote_flights, key, st->remote_deadline_ms,
                            early | ATRIUM_FLIGHT_JOIN_ONLY, &f);
    if (rc != ATRIUM_E_NOTFOUND)
        return joined_fetch(m, req, st, rc, f, key, origin, media_id, thumb);
    /* None runs. One may have ended since our look-up: a fetch's end is remembered
     * (failure, landed count) before its flight lets the key go, so it shows here. */
    remote_table *t = m->remote;
    int remembered = REMOTE_OK;
    pthread_mutex_lock(&t->mu);
    bool known = negative_lookup(m, t, key, &remembered);
    /* One landed since our cache miss: it may have been this file's (fetching it again
     * would be a second fetch of the same file). Look at the cache again, a bounded
     * number of times. */
    bool moved = !known && t->landed != st->landed_seen && st->look_again < REMOTE_MAX_LOOK_AGAIN;
    pthread_mutex_unlock(&t->mu);
    if (known && remembered == REMOTE_NO_THUMBNAIL && thumb) { /* learnt meanwhile */
        st->thumb_fallback = true;
        return join_fetch(m, req, st, origin, media_id, NULL);
    }
    if (known) {
        h->metric_add(m->m_negative_hits, 1);
        return remote_respond_failure(m, req, remembered, origin);
    }
    if (moved) {
        st->look_again++;
        return LOOK_AGAIN;
    }
    rc = h->flight_join(req, m->remote_flights, key, st->remote_deadline_ms, early, &f);
    return joined_fetch(m, req, st, rc, f, key, origin, media_id, thumb);
}

/* The fetch mode the calling thread runs in (the handoff to the fetch pool publishes
 * ADMITTED). */
static int fetch_mode(media *m)
{
    return (int)(intptr_t)m->h->scope_get(ATRIUM_SCOPE_FETCH_MODE);
}

/* The origin's thumbnail for a thumbnail request, while the original is not cached:
 * LOOKUP_HIT (st->row is the thumbnail), LOOKUP_MISS, or ATRIUM_DONE. */
static int thumb_lookup(media *m, atrium_req *req, media_req *st, const char *origin,
                        const char *media_id)
{
    const atrium_host *h = m->h;
    PGconn *c = h->db_acquire(MEDIA_DB_WAIT_MS);
    int rc = c ? media_db_remote_thumb_get(h, m->self, c, origin, media_id, &st->thumb_size,
                                           &st->row)
               : ATRIUM_E_DB;
    if (c) h->db_release(c);
    if ((rc = judge_row(m, req, rc, &st->row)) != LOOKUP_HIT) return rc;
    char path[MEDIA_PATH_MAX];
    if (store_row_path(m, &st->row, path, sizeof(path)) < 0) return LOOKUP_MISS;
    if ((rc = remote_s3_present(m, req, &st->row, path)) != LOOKUP_HIT) return rc;
    st->row_is_thumbnail = true;
    st->have_row = true;
    h->metric_add(m->m_remote_hits, 1);
    return LOOKUP_HIT;
}

/* A remembered failure for key: the answer (or, for "no thumbnail", the switch to the
 * original) - MEDIA_GO when nothing is remembered. */
static int negative_answer(media *m, atrium_req *req, media_req *st, const char *key,
                           const char *origin)
{
    int remembered;
    pthread_mutex_lock(&m->remote->mu);
    bool known = negative_lookup(m, m->remote, key, &remembered);
    pthread_mutex_unlock(&m->remote->mu);
    if (!known) return MEDIA_GO;
    if (remembered == REMOTE_NO_THUMBNAIL) {
        st->thumb_fallback = true;
        return MEDIA_GO;
    }
    m->h->metric_add(m->m_negative_hits, 1);
    return remote_respond_failure(m, req, remembered, origin);
}

/* A run after waiting for a fetch (st->remote_flight): MEDIA_GO to look at the cache
 * again (the fetch stored the file, or the origin has no thumbnail, or another process's
 * fetch ended), MEDIA_GO with st->landing set (a stream to follow: look no further), or
 * the outcome: the fetch's failure, the deadline's 504, a wait for another process. */
static int after_fetch(media *m, atrium_req *req, media_req *st, const char *origin,
                       const char *media_id)
{
    atrium_flight *f = st->remote_flight;
    st->remote_flight = NULL;
    int result = REMOTE_INTERNAL;
    void *landing = NULL;
    int rc = m->h->flight_result(req, f, &result, &landing);
    /* Not ended: the deadline ran us; the fetch goes on for the others. */
    if (rc == ATRIUM_E_STOPPED) {
        m->h->respond_error(req, 503, "M_UNKNOWN", "The server is stopping");
        return ATRIUM_DONE;
    }
    if (rc < 0) return respond_timeout(m, req);
    if (rc == ATRIUM_FLIGHT_RESULT_EARLY) return remote_follow_landing(m, req, st, landing);
    if (result == REMOTE_ELSEWHERE) { /* wait for the other process's fetch */
        st->fetch_rounds--;
        char key[REMOTE_KEY_MAX];
        wanted_key(st, origin, media_id, key, sizeof(key));
        rc = remote_claim_wait(m, req, st, key);
        if (rc != MEDIA_GO) return rc;
    } else if (result == REMOTE_NO_THUMBNAIL) {
        st->thumb_fallback = true;
    } else if (result != REMOTE_OK) {
        return remote_respond_failure(m, req, result, origin);
    }
    if (st->fetch_rounds >= REMOTE_MAX_ROUNDS)
        return remote_respond_failure(m, req, REMOTE_INTERNAL, origin);
    return MEDIA_GO;
}

/* One look at what is here: the cached original, then the origin's cached thumbnail, the
 * remembered failures, the deadline; on a miss in admitted mode, the join of the fetch.
 * MEDIA_GO (st->row is the cached copy, or st->landing is set), LOOK_AGAIN, LOOK_FETCH (a
 * miss in defer mode: fetch it), or the outcome. */
static int look_up(media *m, atrium_req *req, media_req *st, const char *origin,
                   const char *media_id)
{
    char key[REMOTE_KEY_MAX];
    wanted_key(st, origin, media_id, key, sizeof(key));
    /* Before the look-up: a fetch ending anywhere after it wakes us (remote_claim_wait). */
    st->wake_gen = media_wake_gen(m, key);
    bool admitted = fetch_mode(m) == ATRIUM_FETCH_ADMITTED;
    if (admitted) { /* before the look-up: see join_fetch */
        pthread_mutex_lock(&m->remote->mu);
        st->landed_seen = m->remote->landed;
        pthread_mutex_unlock(&m->remote->mu);
    }
    int rc = cache_lookup(m, req, st, origin, media_id);
    if (rc != LOOKUP_MISS) return rc == LOOKUP_HIT ? MEDIA_GO : rc;
    bool want_thumb = wants_thumb(st);
    if (want_thumb) {
        rc = thumb_lookup(m, req, st, origin, media_id);
        if (rc != LOOKUP_MISS) return rc == LOOKUP_HIT ? MEDIA_GO : rc;
    }
    rc = negative_answer(m, req, st, key, origin);
    if (rc != MEDIA_GO) return rc;
    if (want_thumb && st->thumb_fallback) { /* remembered: the origin has no thumbnail */
        want_thumb = false;
        remote_key(origin, media_id, NULL, key, sizeof(key));
        rc = negative_answer(m, req, st, key, origin);
        if (rc != MEDIA_GO) return rc;
    }
    if (m->h->now_ms() >= st->remote_deadline_ms) return respond_timeout(m, req);
    if (!admitted) return LOOK_FETCH;
    return join_fetch(m, req, st, origin, media_id, want_thumb ? &st->thumb_size : NULL);
}

/* Defer mode, on a miss: follow a fetch of the file that streams already (no slot needed),
 * else take a slot of the fetch budget and hand the request to the fetch pool. */
static int defer_fetch(media *m, atrium_req *req, media_req *st, const char *origin,
                       const char *media_id)
{
    const atrium_host *h = m->h;
    if (st->stream_ok && m->can_stream && !wants_thumb(st)) {
        char key[REMOTE_KEY_MAX];
        remote_key(origin, media_id, NULL, key, sizeof(key));
        atrium_flight *f = NULL; /* never parks: the landing, when it is out, or nothing */
        int rc = h->flight_join(req, m->remote_flights, key, st->remote_deadline_ms,
                                ATRIUM_FLIGHT_EARLY_ONLY, &f);
        if (rc == ATRIUM_FLIGHT_PUBLISHED)
            return joined_fetch(m, req, st, rc, f, key, origin, media_id, NULL);
    }
    int rc = fetch_budget_enter(m, req, st);
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

int remote_locate(media *m, atrium_req *req, media_req *st, const char *origin,
                  const char *media_id)
{
    int rc;
    if (st->remote_flight) { /* a run after waiting for a fetch */
        rc = after_fetch(m, req, st, origin, media_id);
        /* MEDIA_GO with st->landing set: it follows the fetch's landing, nothing to look up. */
        if (rc != MEDIA_GO || st->landing) return rc;
    }
    /* A run after waiting in the fetch line: settle that first. */
    if (st->fw && (rc = fetch_budget_enter(m, req, st)) != MEDIA_GO) return rc;
    if ((rc = remote_refusal(m, req, origin)) != MEDIA_GO) return rc;
    if (st->remote_deadline_ms == 0) {
        int64_t timeout = delivery_timeout_ms(m, req);
        if (timeout < 0) {
            m->h->respond_error(req, 400, "M_INVALID_PARAM",
                                "timeout_ms must be a non-negative integer");
            return ATRIUM_DONE;
        }
        st->remote_deadline_ms = st->arrival_ms + timeout;
    }
    do {
        rc = look_up(m, req, st, origin, media_id);
    } while (rc == LOOK_AGAIN); /* bounded: join_fetch counts st->look_again */
    return rc == LOOK_FETCH ? defer_fetch(m, req, st, origin, media_id) : rc;
}
