/*
 * plugins/media/preview.c - URL previews: GET /_matrix/client/v1/media/preview_url and the
 * older /_matrix/media/v3/preview_url (the router also serves it under r0), both
 * authenticated, both served only with url_preview_enabled (off by default: then neither
 * route exists and a request is 404 M_UNRECOGNIZED, as on a server without previews).
 *
 * A request, in order (on the request pool, all quick):
 *   1. the access token; url (missing: 400 M_MISSING_PARAM) normalised by
 *      preview_html.c (not an absolute http(s) URL, or user information: 400
 *      M_INVALID_PARAM); ts (not an integer: 400 M_INVALID_PARAM; absent: now);
 *   2. the cache: an answer kept in media_url_previews for (url, ts rounded down to
 *      url_preview_cache_ttl_ms) that has not expired is answered as it is, without
 *      asking the site (atrium_media_url_previews_total{result="cached"});
 *   3. one fetch per (url, bucket), the host's single flight (ABI 1.8, flight_join;
 *      docs/adr/0029-single-flight.md): when another request's fetch of them is under
 *      way, the request joins it - one of url_preview_max_waiting (429 past it, at once) -
 *      parks and is answered from that fetch's result - its answer or its error - when it
 *      ends (result="coalesced"); past its own deadline it answers 504 itself, as the
 *      first does, and the fetch goes on for the others;
 *   4. else a slot of the preview budget (url_preview_max_in_flight in all, ..._per_user
 *      of one user; 429 past either, at once), held by the fetch until it ends;
 *   5. the request leads the flight, parked too, and the fetch starts (host->fed_request's
 *      url: asynchronous, so no thread waits on the site).
 *
 * The fetch goes through the host's one outbound client, so its address blacklist
 * (federation.ip_range_blacklist / _whitelist) is checked at connect time for every
 * address of every request - the page, each redirect, the image - and a site that
 * resolves to a private address is refused there (403 M_UNKNOWN "IP address blocked").
 * Bounds: each answer's body is capped at url_preview_max_bytes while it is read (the
 * host aborts past it: 502 M_TOO_LARGE for the page, no image for an image); the whole
 * preview - page, redirects, image - has url_preview_timeout_ms (504 past it); at most
 * url_preview_max_redirects redirects (301, 302, 303, 307, 308) are followed per
 * document (502 past them).
 *
 * Answers arrive on the outbound client's thread, which only copies them; the rest -
 * judging the answer, reading the HTML, storing an image, writing the cache - runs on
 * the "preview" pool, never on a request-pool thread. A page (text/html or
 * application/xhtml+xml) gives its OpenGraph (preview_html.c); its og:image, resolved
 * against the page's URL, is fetched the same way and stored as local media of the
 * requesting user, answered as an mxc URI with og:image:type, matrix:image:size and the
 * dimensions its header declares; an image that cannot be had leaves og:image out and
 * the rest is answered. An image URL previews as itself (og:image of its own bytes).
 * Other types answer {}. The site's non-2xx answer is 502 M_UNKNOWN. Only successes
 * are cached.
 *
 * Plain http:// URLs are fetched too (ATRIUM_FED_ALLOW_HTTP: the page, its redirects,
 * which may go from https to http, and its og:image), under the same blacklist and
 * bounds. A host older than that flag refuses them: the URL is then 400 M_INVALID_PARAM,
 * and a redirect or og:image to http:// one that cannot be followed.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "media.h"
#include "atrium/parse.h"

#define PREVIEW_PATH_V3 "/_matrix/media/v3/preview_url"
#define PREVIEW_POOL_THREADS 2
#define PREVIEW_POOL_SPARE_TASKS 16 /* beyond the budget: nothing queued is ever refused */
/* A parked request waits this long past its fetch's deadline for the image's store and
 * the cache row (local work) before it answers 504 itself. */
#define PREVIEW_COMMIT_SLACK_MS 5000
#define PREVIEW_RETRY_AFTER_MS 1000 /* suggested to a client refused by the budget */
#define PREVIEW_ERROR_MAX 256
#define MXC_MAX (MEDIA_SERVER_NAME_MAX_CHARS + MEDIA_ID_MAX_CHARS + 8)

enum preview_phase { PHASE_PAGE = 0, PHASE_IMAGE };

/* One preview being fetched, the work of its flight (m->preview_flights, keyed by
 * "<ts_bucket>|<url>": one fetch per key, however many requests wait for it). The fetch's
 * fields are written by one thread at a time (the outbound client's, then the pool's, in
 * turn); at the end the job becomes its flight's value, read by every waiter after its
 * wake and freed by the flight once the last of them is gone. */
typedef struct preview_job {
    media *m;
    atrium_flight *flight;
    char user_id[MEDIA_USER_ID_MAX_BYTES + 1]; /* the leader's: the budget slot, the image */
    char url[PREVIEW_URL_MAX]; /* as normalised: the cache key */
    int64_t ts_bucket;
    int64_t deadline_ms; /* of the whole preview (monotonic) */
    /* the current transfer */
    int phase;
    char cur[PREVIEW_URL_MAX];
    int redirects;
    int outcome, status;
    char content_type[MEDIA_TYPE_MAX_BYTES + 1];
    char location[PREVIEW_URL_MAX];
    char why[PREVIEW_ERROR_MAX];
    char *body;
    size_t body_len;
    json_t *og; /* the page's answer while its image is fetched */
    /* the result */
    char *answer; /* the 200 body (JSON text), or NULL with the error below */
    int err_status;
    const char *errcode;
    char message[PREVIEW_ERROR_MAX];
} preview_job;

typedef struct preview_req {
    atrium_flight *flight;
} preview_req;

static void job_free(void *arg)
{
    preview_job *j = arg;
    free(j->body);
    free(j->answer);
    if (j->og) json_decref(j->og);
    free(j);
}

/* ---- the end of a preview --------------------------------------------------------------- */

/* The fetch is over: give the budget slot back and hand the job to its flight, which
 * frees the key (a request arriving from now on finds the cache, or fetches anew after a
 * failure) and wakes every request that waits for it. */
static void job_end(preview_job *j)
{
    media *m = j->m;
    const atrium_host *h = m->h;
    h->budget_release(m->preview_budget, j->user_id);
    h->metric_add(j->answer ? m->m_preview_fetched : m->m_preview_failed, 1);
    free(j->body);
    j->body = NULL;
    h->flight_finish(j->flight, 0, j, job_free);
}

/* [preview pool] Answer j->og: kept in the cache for its TTL, then to the request. */
static void job_succeed(preview_job *j)
{
    media *m = j->m;
    j->answer = json_dumps(j->og, JSON_COMPACT);
    if (!j->answer) {
        j->err_status = 500;
        j->errcode = "M_UNKNOWN";
        snprintf(j->message, sizeof(j->message), "Out of memory");
        job_end(j);
        return;
    }
    int64_t now = media_wall_ms();
    PGconn *c = m->h->db_acquire(MEDIA_DB_WAIT_MS);
    if (!c || media_db_preview_put(m->h, m->self, c, j->url, j->ts_bucket, j->answer, now,
                                   now + m->cfg.url_preview_cache_ttl_ms) != MEDIA_DB_OK)
        m->h->log(m->self, ATRIUM_LOG_WARN,
                  "the URL preview of %s was answered but not cached (the database is busy "
                  "or unreachable): the next request for it asks the site again", j->url);
    if (c) m->h->db_release(c);
    job_end(j);
}

/* The image could not be had: the page's answer without it. */
static void image_dropped(preview_job *j)
{
    json_object_del(j->og, "og:image");
    job_succeed(j);
}

/* The preview failed with status/errcode. For the image, only the image is dropped. */
static void job_failed(preview_job *j, int status, const char *errcode, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void job_failed(preview_job *j, int status, const char *errcode, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(j->message, sizeof(j->message), fmt, ap);
    va_end(ap);
    if (j->phase == PHASE_IMAGE) {
        j->m->h->log(j->m->self, ATRIUM_LOG_INFO, "URL preview of %s: its image %s: %s",
                     j->url, j->cur, j->message);
        image_dropped(j);
        return;
    }
    j->err_status = status;
    j->errcode = errcode;
    job_end(j);
}

/* ---- transfers --------------------------------------------------------------------------- */

static void job_step(void *arg, bool cancelled);

/* [outbound client thread] Copy the answer, then judge it on the pool. */
static void job_done(void *arg, const atrium_fed_response *res)
{
    preview_job *j = arg;
    media *m = j->m;
    const atrium_host *h = m->h;
    j->outcome = res->outcome;
    j->status = res->status;
    snprintf(j->why, sizeof(j->why), "%s", res->error ? res->error : "");
    const char *ct = res->outcome == ATRIUM_FED_OK ? h->fed_response_header(res, "Content-Type") : NULL;
    const char *loc = res->outcome == ATRIUM_FED_OK ? h->fed_response_header(res, "Location") : NULL;
    snprintf(j->content_type, sizeof(j->content_type), "%s", ct ? ct : "");
    snprintf(j->location, sizeof(j->location), "%s", loc ? loc : "");
    free(j->body);
    j->body = NULL;
    j->body_len = 0;
    if (res->outcome == ATRIUM_FED_OK && res->status / 100 == 2 && res->body) {
        j->body = malloc(res->body_len + 1);
        if (j->body) {
            memcpy(j->body, res->body, res->body_len);
            j->body[res->body_len] = '\0';
            j->body_len = res->body_len;
        } else {
            j->outcome = ATRIUM_FED_E_INTERNAL;
        }
    }
    if (h->pool_submit(m->preview_pool, job_step, j) < 0) {
        j->phase = PHASE_PAGE; /* no database from this thread: fail the whole preview */
        job_failed(j, 503, "M_UNKNOWN", "The server is stopping");
    }
}

/* Ask for j->cur. 0, or the host's refusal (then on_done is never called). */
static int job_fetch(preview_job *j)
{
    media *m = j->m;
    atrium_fed_request q = {
        .size = sizeof(q),
        .method = "GET",
        .url = j->cur,
        .deadline_ms = j->deadline_ms,
        .max_body_bytes = m->cfg.url_preview_max_bytes,
        .flags = ATRIUM_FED_ALLOW_HTTP, /* pages, redirects and images may be plain http */
        .on_done = job_done,
        .arg = j,
    };
    int rc = m->h->fed_request(&q);
    if (rc == 0) m->h->metric_add(m->m_preview_requests_out, 1);
    return rc;
}

/* Start the fetch of j->cur, or fail the preview with the host's refusal (an http://
 * URL, on a host older than ATRIUM_FED_ALLOW_HTTP: 400). */
static void job_fetch_or_fail(preview_job *j)
{
    int rc = job_fetch(j);
    if (rc == ATRIUM_E_INVAL)
        job_failed(j, 400, "M_INVALID_PARAM", "The URL cannot be fetched");
    else if (rc < 0)
        job_failed(j, 503, "M_UNKNOWN", "The outbound client is busy or stopping; retry");
}

/* A transfer that got no answer (or too large an answer): the error Synapse gives. */
static void transfer_failed(preview_job *j)
{
    switch (j->outcome) {
    case ATRIUM_FED_E_BLOCKED:
        job_failed(j, 403, "M_UNKNOWN", "IP address blocked");
        return;
    case ATRIUM_FED_E_RESOLVE:
        job_failed(j, 502, "M_UNKNOWN", "DNS resolution failure during URL preview generation");
        return;
    case ATRIUM_FED_E_TIMEOUT:
        job_failed(j, 504, "M_UNKNOWN", "The site did not answer in time");
        return;
    case ATRIUM_FED_E_TOO_LARGE:
        job_failed(j, 502, "M_TOO_LARGE", "Requested file is too large > %" PRId64 " bytes",
                   j->m->cfg.url_preview_max_bytes);
        return;
    case ATRIUM_FED_E_CANCELLED:
        job_failed(j, 503, "M_UNKNOWN", "The server is stopping");
        return;
    default:
        job_failed(j, 502, "M_UNKNOWN", "Failed to download content: %s", j->why);
    }
}

static bool is_redirect(int status)
{
    return status == 301 || status == 302 || status == 303 || status == 307 || status == 308;
}

static void follow_redirect(preview_job *j)
{
    if (++j->redirects > j->m->cfg.url_preview_max_redirects) {
        job_failed(j, 502, "M_UNKNOWN", "Too many redirects (more than %d)",
                   j->m->cfg.url_preview_max_redirects);
        return;
    }
    char next[PREVIEW_URL_MAX];
    if (preview_url_join(j->cur, j->location, next, sizeof(next)) < 0) {
        job_failed(j, 502, "M_UNKNOWN", "Redirected to a URL this server cannot fetch");
        return;
    }
    snprintf(j->cur, sizeof(j->cur), "%s", next);
    job_fetch_or_fail(j);
}

/* The answer's media type, lower-cased, without parameters. */
static void main_type(const char *content_type, char *out, size_t cap)
{
    size_t n = strcspn(content_type, ";");
    while (n > 0 && content_type[n - 1] == ' ') n--;
    if (n >= cap) n = cap - 1;
    for (size_t i = 0; i < n; i++) {
        char c = content_type[i];
        out[i] = c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
    }
    out[n] = '\0';
}

/* Does the Content-Type name a single-byte Latin charset (read as ISO-8859-1)? */
static bool latin1_charset(const char *content_type)
{
    const char *cs = strcasestr(content_type, "charset=");
    if (!cs) return false;
    cs += strlen("charset=");
    if (*cs == '"') cs++;
    static const char *const latin[] = {"iso-8859-1", "latin1", "latin-1", "windows-1252",
                                        "cp1252"};
    for (size_t i = 0; i < sizeof(latin) / sizeof(latin[0]); i++)
        if (strncasecmp(cs, latin[i], strlen(latin[i])) == 0) return true;
    return false;
}

/* [preview pool] Store the answer's bytes (an image of type `type`) as local media of
 * the requesting user; og gets og:image (its mxc URI), og:image:type, matrix:image:size
 * and the dimensions its header declares. 0, or -1 (logged). */
static int store_image(preview_job *j, const char *type, json_t *og)
{
    media *m = j->m;
    const atrium_host *h = m->h;
    media_row row;
    memset(&row, 0, sizeof(row));
    char path[MEDIA_PATH_MAX];
    store_tmp t;
    if (media_generate_id(row.media_id) < 0 ||
        store_original_path(m, row.media_id, path, sizeof(path)) < 0 ||
        store_tmp_open(m, path, &t) < 0)
        return -1;
    if (store_write_all(t.fd, j->body, j->body_len) < 0) {
        store_tmp_discard(&t);
        return -1;
    }
    if (store_tmp_commit(m, &t, path, false) < 0) return -1;
    sha256_ctx sha;
    sha256_init(&sha);
    sha256_update(&sha, j->body, j->body_len);
    sha256_final_hex(&sha, row.sha256);
    snprintf(row.user_id, sizeof(row.user_id), "%s", j->user_id);
    snprintf(row.content_type, sizeof(row.content_type), "%s",
             media_type_acceptable(type) ? type : "application/octet-stream");
    row.created_ts = row.uploaded_ts = media_wall_ms();
    row.size_bytes = (int64_t)j->body_len;
    if (render_probe(path, &row.width, &row.height, &row.frames) != RENDER_OK)
        row.width = row.height = row.frames = 0;
    PGconn *c = h->db_acquire(MEDIA_DB_WAIT_MS);
    int rc = c ? media_db_insert(h, m->self, c, &row) : ATRIUM_E_DB;
    if (c) h->db_release(c);
    if (rc != MEDIA_DB_OK) {
        unlink(path); /* never answered: leave nothing behind */
        h->log(m->self, ATRIUM_LOG_WARN, "URL preview of %s: the image was not stored (the "
               "database is busy or unreachable)", j->url);
        return -1;
    }
    h->metric_add(m->m_uploads, 1);
    h->metric_add(m->m_upload_bytes, row.size_bytes);
    char mxc[MXC_MAX];
    snprintf(mxc, sizeof(mxc), "mxc://%s/%s", m->server_name, row.media_id);
    json_object_set_new(og, "og:image", json_string(mxc));
    json_object_set_new(og, "og:image:type", json_string(row.content_type));
    json_object_set_new(og, "matrix:image:size", json_integer((json_int_t)row.size_bytes));
    if (row.width > 0 && row.height > 0) {
        json_object_set_new(og, "og:image:width", json_integer(row.width));
        json_object_set_new(og, "og:image:height", json_integer(row.height));
    }
    return 0;
}

/* [preview pool] The page arrived (2xx). */
static void page_arrived(preview_job *j)
{
    char type[MEDIA_TYPE_MAX_BYTES + 1];
    main_type(j->content_type, type, sizeof(type));
    j->og = json_object();
    if (!j->og) {
        job_failed(j, 500, "M_UNKNOWN", "Out of memory");
        return;
    }
    if (strncmp(type, "image/", 6) == 0) {
        if (store_image(j, type, j->og) < 0)
            job_failed(j, 503, "M_UNKNOWN", "The image could not be stored; retry");
        else
            job_succeed(j);
        return;
    }
    if (strcmp(type, "text/html") != 0 && strcmp(type, "application/xhtml+xml") != 0) {
        job_succeed(j); /* nothing to say about other types */
        return;
    }
    json_decref(j->og);
    j->og = preview_html_og(j->body ? j->body : "", j->body_len, latin1_charset(j->content_type));
    if (!j->og) {
        job_failed(j, 500, "M_UNKNOWN", "Out of memory");
        return;
    }
    const char *image = json_string_value(json_object_get(j->og, "og:image"));
    char next[PREVIEW_URL_MAX];
    if (!image || preview_url_join(j->cur, image, next, sizeof(next)) < 0) {
        if (image)
            j->m->h->log(j->m->self, ATRIUM_LOG_INFO,
                         "URL preview of %s: its og:image is not an http(s) URL: left out", j->url);
        image_dropped(j);
        return;
    }
    j->phase = PHASE_IMAGE;
    j->redirects = 0;
    snprintf(j->cur, sizeof(j->cur), "%s", next);
    job_fetch_or_fail(j);
}

/* [preview pool] The page's og:image arrived (2xx). */
static void image_arrived(preview_job *j)
{
    char type[MEDIA_TYPE_MAX_BYTES + 1];
    main_type(j->content_type, type, sizeof(type));
    if (strncmp(type, "image/", 6) != 0) {
        job_failed(j, 502, "M_UNKNOWN", "not an image (%s)", type);
        return;
    }
    /* the page's own og:image:* values give way to the stored image's */
    json_object_del(j->og, "og:image:width");
    json_object_del(j->og, "og:image:height");
    if (store_image(j, type, j->og) < 0)
        job_failed(j, 503, "M_UNKNOWN", "could not be stored");
    else
        job_succeed(j);
}

/* [preview pool] What to do with the answer just copied. */
static void job_step(void *arg, bool cancelled)
{
    preview_job *j = arg;
    if (cancelled) {
        j->phase = PHASE_PAGE;
        job_failed(j, 503, "M_UNKNOWN", "The server is stopping");
    } else if (j->outcome != ATRIUM_FED_OK) {
        transfer_failed(j);
    } else if (is_redirect(j->status) && j->location[0]) {
        follow_redirect(j);
    } else if (j->status / 100 != 2) {
        job_failed(j, 502, "M_UNKNOWN", "Got error %d", j->status);
    } else if (j->phase == PHASE_PAGE) {
        page_arrived(j);
    } else {
        image_arrived(j);
    }
}

/* ---- the endpoint ------------------------------------------------------------------------ */

/* [req] The handler's run after the park: the fetch's result, or 504 / 503 when it has
 * not ended by the request's deadline (the fetch goes on for the others). */
static int answer(media *m, atrium_req *req, atrium_flight *f)
{
    const atrium_host *h = m->h;
    void *value = NULL;
    int rc = h->flight_result(req, f, NULL, &value);
    if (rc == ATRIUM_E_STOPPED) {
        h->respond_error(req, 503, "M_UNKNOWN", "The server is stopping");
        return ATRIUM_DONE;
    }
    if (rc < 0) {
        h->respond_error(req, 504, "M_UNKNOWN", "The site did not answer in time");
        return ATRIUM_DONE;
    }
    const preview_job *j = value;
    if (!j) return ATRIUM_E_NOMEM; /* the leader found no memory for the job */
    if (j->answer)
        return h->respond_buffer(req, 200, "application/json", j->answer, strlen(j->answer)) < 0
                   ? ATRIUM_E_NOMEM
                   : ATRIUM_DONE;
    h->respond_error(req, j->err_status, j->errcode, "%s", j->message);
    return ATRIUM_DONE;
}

/* [req] The cached answer, when there is one: ATRIUM_DONE (answered, or 503), or
 * MEDIA_GO (fetch it). */
static int from_cache(media *m, atrium_req *req, const char *url, int64_t bucket)
{
    const atrium_host *h = m->h;
    PGconn *c = h->db_acquire(MEDIA_DB_WAIT_MS);
    if (!c) {
        h->respond_error(req, 503, "M_UNKNOWN", "The database is busy or unreachable; retry");
        return ATRIUM_DONE;
    }
    char *og = NULL;
    int rc = media_db_preview_get(h, m->self, c, url, bucket, media_wall_ms(), &og);
    h->db_release(c);
    if (rc == MEDIA_DB_NOTFOUND) return MEDIA_GO;
    if (rc != MEDIA_DB_OK) {
        h->respond_error(req, 503, "M_UNKNOWN", "The database is busy or unreachable; retry");
        return ATRIUM_DONE;
    }
    h->metric_add(m->m_preview_cached, 1);
    rc = h->respond_buffer(req, 200, "application/json", og, strlen(og));
    free(og);
    return rc < 0 ? ATRIUM_E_NOMEM : ATRIUM_DONE;
}

/* A new job for (url, bucket) fetched for user, the work of flight f. */
static preview_job *job_new(media *m, atrium_flight *f, const char *user, const char *url,
                            int64_t bucket)
{
    preview_job *j = calloc(1, sizeof(*j));
    if (!j) return NULL;
    j->m = m;
    j->flight = f;
    snprintf(j->user_id, sizeof(j->user_id), "%s", user);
    snprintf(j->url, sizeof(j->url), "%s", url);
    snprintf(j->cur, sizeof(j->cur), "%s", url);
    j->ts_bucket = bucket;
    j->deadline_ms = m->h->now_ms() + m->cfg.url_preview_timeout_ms;
    j->phase = PHASE_PAGE;
    return j;
}

/* [req] Join the fetch of key, parked: the one under way (bounded by url_preview_max_waiting),
 * else a new one under a slot of the preview budget (url_preview_max_in_flight in all,
 * _per_user of one user), which the fetch holds until it ends. ATRIUM_PARKED, or the
 * request is answered (429 past a bound, 503 while stopping). */
static int join_fetch(media *m, atrium_req *req, const char *user, const char *key,
                      const char *url, int64_t bucket)
{
    const atrium_host *h = m->h;
    /* Its own deadline: as long as a fetch of its own would take, and the commit after. */
    int64_t deadline = h->now_ms() + m->cfg.url_preview_timeout_ms + PREVIEW_COMMIT_SLACK_MS;
    preview_req *pr = h->req_alloc(req, sizeof(*pr)); /* before the park: its run needs it */
    if (!pr) return ATRIUM_E_NOMEM;
    atrium_flight *f = NULL;
    int rc = h->flight_join(req, m->preview_flights, key, deadline, ATRIUM_FLIGHT_JOIN_ONLY, &f);
    bool slot = false;
    if (rc == ATRIUM_E_NOTFOUND) { /* none under way: lead one, within the budget */
        if (h->budget_try_acquire(m->preview_budget, user) < 0) {
            rc = ATRIUM_E_LIMIT;
        } else {
            slot = true;
            rc = h->flight_join(req, m->preview_flights, key, deadline, 0, &f);
        }
    }
    if (slot && rc != ATRIUM_FLIGHT_LEAD) h->budget_release(m->preview_budget, user);
    if (rc == ATRIUM_E_LIMIT) {
        h->metric_add(m->m_preview_refused, 1);
        h->respond_limited(req, PREVIEW_RETRY_AFTER_MS, "Too many URL previews at once");
        return ATRIUM_DONE;
    }
    if (rc == ATRIUM_E_STOPPED) {
        h->respond_error(req, 503, "M_UNKNOWN", "The server is stopping");
        return ATRIUM_DONE;
    }
    if (rc < 0) return rc;
    pr->flight = f;
    h->req_set_state(req, pr);
    if (rc == ATRIUM_FLIGHT_JOINED) {
        h->metric_add(m->m_preview_coalesced, 1);
        return ATRIUM_PARKED;
    }
    preview_job *j = job_new(m, f, user, url, bucket);
    if (!j) {
        h->budget_release(m->preview_budget, user);
        h->flight_finish(f, 0, NULL, NULL); /* everyone who joined answers 500 */
        return ATRIUM_PARKED;
    }
    job_fetch_or_fail(j); /* from here on j may end (and wake us) on another thread */
    return ATRIUM_PARKED;
}

static int preview_handler(atrium_req *req)
{
    media *m = media_of(req);
    const atrium_host *h = m->h;
    preview_req *pr = h->req_state(req);
    if (pr) return answer(m, req, pr->flight);
    const char *user = media_authenticate(m, req);
    if (!user) return ATRIUM_DONE;
    const char *url = h->req_query(req, "url");
    if (!url || !*url) {
        h->respond_error(req, 400, "M_MISSING_PARAM", "Missing string query parameter: url");
        return ATRIUM_DONE;
    }
    const char *ts_text = h->req_query(req, "ts");
    int64_t ts = media_wall_ms();
    if (ts_text && atrium_parse_int64(ts_text, 0, INT64_MAX, &ts) < 0) {
        h->respond_error(req, 400, "M_INVALID_PARAM", "ts must be a non-negative integer (ms)");
        return ATRIUM_DONE;
    }
    char norm[PREVIEW_URL_MAX];
    int kind = preview_url_normalize(url, norm, sizeof(norm));
    if (kind < 0) {
        h->respond_error(req, 400, "M_INVALID_PARAM",
                         "url must be an absolute http(s) URL of at most %d bytes, without user "
                         "information", PREVIEW_URL_MAX - 1);
        return ATRIUM_DONE;
    }
    int64_t bucket = ts / m->cfg.url_preview_cache_ttl_ms;
    int rc = from_cache(m, req, norm, bucket);
    if (rc != MEDIA_GO) return rc;
    /* One fetch per (url, bucket): a request finding one under way waits for it. */
    char key[PREVIEW_URL_MAX + 24];
    snprintf(key, sizeof(key), "%" PRId64 "|%s", bucket, norm);
    return join_fetch(m, req, user, key, norm, bucket);
}

int preview_init(media *m)
{
    const atrium_host *h = m->h;
    atrium_plugin *s = m->self;
    const media_config *c = &m->cfg;
    if (!c->url_preview_enabled) return 0;
    m->preview_pool = h->pool_create(s, "preview", PREVIEW_POOL_THREADS,
                                     c->url_preview_max_in_flight + PREVIEW_POOL_SPARE_TASKS);
    m->preview_budget = h->budget_create(s, "url_preview", c->url_preview_max_in_flight,
                                         c->url_preview_max_per_user);
    m->preview_flights = h->flights_create(s, "url_preview", c->url_preview_max_in_flight,
                                           c->url_preview_max_waiting);
    static const char *const help = "URL preview requests, by how they were answered";
    m->m_preview_cached = h->metric_counter(s, "atrium_media_url_previews_total",
                                            "result=\"cached\"", help);
    m->m_preview_fetched = h->metric_counter(s, "atrium_media_url_previews_total",
                                             "result=\"fetched\"", help);
    m->m_preview_failed = h->metric_counter(s, "atrium_media_url_previews_total",
                                            "result=\"failed\"", help);
    m->m_preview_refused = h->metric_counter(s, "atrium_media_url_previews_total",
                                             "result=\"refused\"", help);
    m->m_preview_coalesced = h->metric_counter(s, "atrium_media_url_previews_total",
                                               "result=\"coalesced\"", help);
    m->m_preview_requests_out =
        h->metric_counter(s, "atrium_media_url_preview_requests_total", NULL,
                          "Requests made to sites for URL previews (pages, redirects, images)");
    if (!m->preview_pool || !m->preview_budget || !m->preview_flights || !m->m_preview_cached ||
        !m->m_preview_fetched || !m->m_preview_failed || !m->m_preview_refused ||
        !m->m_preview_coalesced || !m->m_preview_requests_out)
        return ATRIUM_E_NOMEM;
    const char *const paths[] = {ATRIUM_MEDIA_PATH_PREVIEW_URL, PREVIEW_PATH_V3};
    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
        atrium_route r = {.method = "GET", .path = paths[i], .handler = preview_handler, .arg = m};
        int rc = h->route_add(s, &r);
        if (rc < 0) return rc;
    }
    return 0;
}
