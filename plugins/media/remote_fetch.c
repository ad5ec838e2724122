/*
 * plugins/media/remote_fetch.c - one fetch of a remote file: its job, the transfer, the
 * origin's 429 absorbed, the commit to the remote cache, and the per-origin cap on fetches
 * running at once (docs/adr/0005-remote-media-fetch-pool.md).
 *
 * No thread waits on the peer. A fetch-pool thread opens the temporary file and queues
 * the request (host->fed_request, asynchronous); the answer's bytes arrive on the core's
 * outbound-client thread (job_chunk), which only parses the multipart framing, hashes and
 * write(2)s them - never fsync, never PostgreSQL. When the transfer ends, the judgement
 * and the commit (fsync, link under a fresh name, the image header probe, with storage: s3
 * the PUT to the bucket (remote_s3.c), the row) run on
 * the fetch pool. Only then is the row written, so a fetch cut off midway, garbage or too
 * large leaves nothing in the cache; a later copy gets a new name and the old file is
 * unlinked, so a reader holding the old descriptor is never torn.
 *
 * The phases, each followed once: the signed federation download (a multipart answer,
 * multipart.c); the legacy /_matrix/media/v3 download when the origin does not know that
 * endpoint; a Location part or a legacy redirect, fetched unsigned over https. Across
 * processes a fetch is claimed before it starts (remote_claim.c). The request side, the
 * answers given to clients and the negative cache are remote.c's.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "remote.h"
#include "s3.h"

#define REMOTE_URI_MAX (2 * (MEDIA_SERVER_NAME_MAX_CHARS + MEDIA_ID_MAX_CHARS) + 128)
#define REMOTE_FRAMING_BYTES (MP_HEADERS_MAX * 2 + MP_JSON_MAX + 1024) /* multipart overhead */
#define DEFAULT_CONTENT_TYPE "application/octet-stream"
/* An origin answering 429 (its own rate limiter: Synapse's federation limiter answers part
 * of a burst so) is asked again after the delay it names (retry_after_ms), else after
 * RETRY_429_BASE_MS doubling per try, at most RETRY_429_MAX_DELAY_MS, as long as the
 * transfer's deadline allows; the fetch keeps its per-origin slot meanwhile, which paces
 * that origin. Its 429 is never passed on to a client. */
#define RETRY_429_BASE_MS 200
#define RETRY_429_MAX_DELAY_MS 2000
#define RETRY_429_MAX_TRIES 20

/* ---- the job ------------------------------------------------------------------------- */

remote_job *remote_job_new(media *m, atrium_flight *f, const char *key, const char *origin,
                           const char *media_id, const media_size *thumb)
{
    remote_job *j = calloc(1, sizeof(*j));
    mp_parser *mp = j ? calloc(1, sizeof(*mp)) : NULL;
    if (!mp) {
        free(j);
        return NULL;
    }
    j->mp = mp;
    j->m = m;
    j->flight = f;
    snprintf(j->key, sizeof(j->key), "%s", key);
    snprintf(j->origin, sizeof(j->origin), "%s", origin);
    snprintf(j->media_id, sizeof(j->media_id), "%s", media_id);
    j->thumb = thumb != NULL;
    if (thumb) j->size = *thumb;
    return j;
}

void remote_job_free(remote_job *j)
{
    if (j->tmp_open) store_tmp_discard(&j->tmp);
    free(j->mp);
    free(j);
}

/* Is a request still waiting for the job (within its deadline)? */
static bool job_wanted(remote_job *j)
{
    return j->m->h->flight_wanted(j->flight) > 0;
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

bool remote_origin_admit(media *m, remote_table *t, remote_job *j)
{
    remote_origin *o = origin_get(t, j->origin);
    if (!o || origin_allows(m, o)) { /* no memory for the count: do not hold it back */
        j->running = o != NULL;
        if (o) o->running++;
        return true;
    }
    if (o->pending_tail) o->pending_tail->pending_next = j;
    else o->pending_head = j;
    o->pending_tail = j;
    return false;
}

/* j, which ran, ended: its origin's next pending fetch, now counted as running, to start
 * (NULL when none may). */
static remote_job *origin_release(media *m, remote_table *t, const remote_job *j)
{
    if (!j->running) return NULL;
    remote_origin *o = origin_get(t, j->origin);
    if (!o) return NULL;
    o->running--;
    if (!o->pending_head || !origin_allows(m, o)) return NULL;
    remote_job *start = o->pending_head;
    o->pending_head = start->pending_next;
    if (!o->pending_head) o->pending_tail = NULL;
    start->running = true;
    o->running++;
    return start;
}

/* ---- the end of a fetch ------------------------------------------------------------- */

static void job_start_task(void *arg, bool cancelled);

/* The fetch ended: remember a failure, count it, finish the flight (which wakes every
 * waiter), and let the origin's next pending fetch start. */
void remote_job_complete(remote_job *j, int result)
{
    media *m = j->m;
    const atrium_host *h = m->h;
    remote_table *t = m->remote;
    /* Before the waiters here: the other processes learn the end as soon (stopping: the
     * claim lapses, this thread may not reach PostgreSQL). */
    if (j->claimed && result != REMOTE_STOPPING)
        remote_claim_end(m, j->key, result, remote_negative_ttl_ms(m, result));
    remote_landing_end(j, result == REMOTE_OK && !j->quarantined); /* its followers end too */
    /* Remembered before the finish frees the key: a request that then finds no flight
     * finds the failure or the landed count moved (remote.c, join_fetch). */
    pthread_mutex_lock(&t->mu);
    if (result == REMOTE_OK) t->landed++;
    remote_negative_remember(m, t, j->key, result);
    remote_job *start = origin_release(m, t, j);
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
    h->flight_finish(j->flight, result, NULL, NULL); /* every waiter is woken */
    if (j->counted) h->metric_add(m->m_fetches_running, -1);
    remote_job_free(j);
    if (start && h->pool_submit(m->fetch_pool, job_start_task, start) < 0)
        remote_job_complete(start, REMOTE_STOPPING);
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
    remote_landing_advance(j);
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
    if (j->m->h->pool_submit(j->m->fetch_pool, job_after_transfer, j) < 0)
        remote_job_complete(j, REMOTE_STOPPING);
}

/* ---- starting a fetch (the fetch pool) ------------------------------------------------ */

static int job_start(remote_job *j)
{
    media *m = j->m;
    const atrium_host *h = m->h;
    remote_landing_end(j, false); /* bytes of an earlier answer (never expected): cut them */
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
int remote_job_begin(remote_job *j)
{
    media *m = j->m;
    int result = REMOTE_INTERNAL;
    int who = remote_claim_take(m, j->key, j->origin, j->media_id, j->thumb ? &j->size : NULL,
                                &result);
    if (who != REMOTE_CLAIM_MINE) {
        j->elsewhere = true;
        return who == REMOTE_CLAIM_HELD     ? REMOTE_ELSEWHERE
               : who == REMOTE_CLAIM_LANDED ? REMOTE_OK
                                            : result;
    }
    j->claimed = true;
    m->h->metric_add(m->m_fetches_running, 1);
    j->counted = true;
    int rc = job_start(j);
    return rc == REMOTE_OK ? REMOTE_STARTED : rc;
}

/* A queued fetch about to start (or start again): false, the job ended, when the pool
 * stopped or every request that wanted it has been answered meanwhile. */
static bool job_goes_on(remote_job *j, bool cancelled)
{
    if (cancelled) {
        remote_job_complete(j, REMOTE_STOPPING);
        return false;
    }
    if (!job_wanted(j)) {
        remote_job_complete(j, REMOTE_ABANDONED);
        return false;
    }
    return true;
}

/* A fetch that waited for its origin's cap: start it, unless every request that wanted it
 * has been answered already (then it ends without asking the origin). */
static void job_start_task(void *arg, bool cancelled)
{
    remote_job *j = arg;
    if (!job_goes_on(j, cancelled)) return;
    int rc = remote_job_begin(j);
    if (rc != REMOTE_STARTED) remote_job_complete(j, rc);
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
void remote_job_meta(const remote_job *j, char *type, size_t type_cap, char *name,
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

/* The bytes are all here: make them durable, probe them, record the row. */
static int job_commit(remote_job *j)
{
    media *m = j->m;
    const atrium_host *h = m->h;
    media_row row;
    memset(&row, 0, sizeof(row));
    snprintf(row.media_id, sizeof(row.media_id), "%s", j->media_id);
    remote_job_meta(j, row.content_type, sizeof(row.content_type), row.upload_name,
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
    /* storage: s3 - in the bucket before the row says it is cached (remote_s3.c). */
    if (remote_s3_put(m, j->file_rel, j->file_abs, j->bytes) < 0) {
        unlink(j->file_abs);
        return REMOTE_INTERNAL;
    }
    PGconn *c = h->db_acquire(MEDIA_DB_WAIT_MS);
    char old[MEDIA_FILE_NAME_MAX] = "";
    int64_t old_bytes = 0;
    int rc = !c        ? ATRIUM_E_DB
             : j->thumb ? media_db_remote_thumb_put(h, m->self, c, j->origin, &j->size, &row)
                        : media_db_remote_put(h, m->self, c, j->origin, &row, old, &old_bytes);
    if (c) h->db_release(c);
    if (rc != MEDIA_DB_OK) {
        unlink(j->file_abs);
        remote_s3_forget(m, j->file_rel);
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
        remote_s3_forget(m, old);
        store_gone_publish(m, 'r', old);
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
    if (!job_goes_on(j, cancelled)) return;
    int rc = job_start(j);
    if (rc != REMOTE_OK) remote_job_complete(j, rc);
}

/* The timer thread: the retry is due; the work goes to the fetch pool. */
static void job_retry_due(void *arg)
{
    remote_job *j = arg;
    if (j->m->h->pool_submit(j->m->fetch_pool, job_retry_task, j) < 0)
        remote_job_complete(j, REMOTE_STOPPING);
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

/* What the transfer's end means: a result, or REMOTE_STARTED when the next phase (the
 * legacy endpoint, a Location, a redirect) or a retry after a 429 is under way. */
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
                if (rc == REMOTE_OK) return REMOTE_STARTED;
                m->h->log(m->self, ATRIUM_LOG_INFO,
                          "remote media %s: cannot follow its Location %s", j->key, j->location);
                return rc == REMOTE_INTERNAL ? rc : REMOTE_BAD_ANSWER;
            }
        }
        return job_commit(j);
    }
    if (j->status == 429) return retry_later(j) ? REMOTE_STARTED : REMOTE_ORIGIN_BUSY;
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
        if (rc == REMOTE_OK) return REMOTE_STARTED;
        m->h->log(m->self, ATRIUM_LOG_INFO, "remote media %s: cannot follow its redirect to %s",
                  j->key, j->location);
        return rc == REMOTE_INTERNAL ? rc : REMOTE_UNREACHABLE;
    }
    if (j->phase == PHASE_FEDERATION && endpoint_unknown(j)) {
        j->phase = PHASE_LEGACY;
        int rc = job_start(j);
        return rc == REMOTE_OK ? REMOTE_STARTED : rc;
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
    if (result != REMOTE_STARTED) remote_job_complete(j, result);
}

