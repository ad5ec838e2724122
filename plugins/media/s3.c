/*
 * plugins/media/s3.c - media on an S3-compatible object store (storage: s3): the settings
 * check, the start-up HEAD of the bucket, PUT of an original and GET of one into the local
 * folder, which is then a cache of the bucket (docs/adr/0011-media-on-an-object-store.md).
 *
 * Requests are signed with AWS Signature Version 4 by libcurl (CURLOPT_AWS_SIGV4, in the
 * libcurl the host already initialized: the plugin never calls curl_global_init). The
 * payload is sent as UNSIGNED-PAYLOAD in x-amz-content-sha256, which S3 and the RADOS
 * Gateway require beside the signature (over TLS the transport protects the body; the
 * original's SHA-256 is kept in its row and checked by verify-media). One easy handle per
 * request, made and freed on the calling pool thread; at most s3_max_concurrent requests
 * run at once (the rest wait, at most s3_timeout_ms, for a slot), each bounded by
 * s3_timeout_ms. Nothing here runs on a request-pool thread (s3.h).
 *
 * Metrics: atrium_media_store_requests_total{kind,outcome}, atrium_media_store_bytes_total
 * {direction}, atrium_media_store_in_flight, atrium_media_store_request_ms_total{kind},
 * atrium_media_store_cache_hits_total and _misses_total (originals asked of the local
 * folder; the folder's bound and its metrics are s3_cache.c's). The secret is never logged.
 */
#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "media.h"
#include "s3.h"

#define S3_URL_MAX 2048
#define S3_SECRET_MAX 256
#define S3_ERROR_BODY_MAX 512
#define S3_CONNECT_TIMEOUT_MS 5000
#define S3_KEY_MAX 320
#define S3_POOL_QUEUE 1024 /* downloads waiting for a store worker (then 503) */

enum s3_kind { KIND_HEAD = 0, KIND_PUT, KIND_GET, N_KINDS };
enum s3_outcome { OUT_OK = 0, OUT_NOT_FOUND, OUT_REFUSED, OUT_FAILED, N_OUTCOMES };
static const char *const KIND_NAMES[N_KINDS] = {"head", "put", "get"};
static const char *const OUTCOME_NAMES[N_OUTCOMES] = {"ok", "not_found", "refused", "failed"};

struct media_s3 {
    char secret[S3_SECRET_MAX];
    char sigv4[128]; /* "aws:amz:<region>:s3" */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* CLOCK_MONOTONIC (host->cond_init) */
    int in_flight;
    atrium_metric *m_requests[N_KINDS][N_OUTCOMES];
    atrium_metric *m_ms[N_KINDS];
    atrium_metric *m_bytes_up, *m_bytes_down, *m_in_flight, *m_hits, *m_misses;
};

/* One request and what came back. */
typedef struct s3_call {
    int kind;
    const char *key; /* NULL: the bucket itself */
    FILE *upload;
    int64_t upload_size;
    int out_fd; /* GET: the body goes here when the status is 200 */
    bool write_failed;
    CURL *easy;
    long status;
    CURLcode cc;
    int64_t bytes;
    int64_t length; /* HEAD: the object's Content-Length (-1 unknown) */
    char curl_err[CURL_ERROR_SIZE];
    char err_body[S3_ERROR_BODY_MAX];
    size_t err_len;
} s3_call;

bool s3_enabled(const media *m)
{
    return m->s3 != NULL;
}

/* ---- settings ------------------------------------------------------------------------ */

static int refuse(media *m, const char *key, const char *why)
{
    m->h->log(m->self, ATRIUM_LOG_ERROR, "invalid configuration: plugins.media.%s: %s", key, why);
    return ATRIUM_E_INVAL;
}

static bool empty(const char *s)
{
    return !s || !*s;
}

/* Bucket names as S3 allows them: 3-63 of [a-z0-9.-], starting and ending alphanumeric. */
static bool bucket_valid(const char *b)
{
    size_t n = strlen(b);
    if (n < 3 || n > 63 || !isalnum((unsigned char)b[0]) || !isalnum((unsigned char)b[n - 1]))
        return false;
    for (size_t i = 0; i < n; i++)
        if (!islower((unsigned char)b[i]) && !isdigit((unsigned char)b[i]) && b[i] != '.' &&
            b[i] != '-')
            return false;
    return true;
}

int s3_settings_check(media *m)
{
    const media_config *c = &m->cfg;
    if (strcmp(c->storage, "local") == 0) return 0;
    if (strcmp(c->storage, "s3") != 0) return refuse(m, "storage", "must be \"local\" or \"s3\"");
    const char *e = c->s3_endpoint;
    if (empty(e) || (strncmp(e, "http://", 7) != 0 && strncmp(e, "https://", 8) != 0) ||
        strpbrk(e, "?#@ ") || strlen(e) > S3_URL_MAX / 2)
        return refuse(m, "s3_endpoint",
                      "must be the store's http:// or https:// URL (scheme, host, optional "
                      "port), e.g. https://s3.example.org");
    if (!bucket_valid(c->s3_bucket))
        return refuse(m, "s3_bucket", "must be 3-63 characters of a-z, 0-9, '.' and '-'");
    if (empty(c->s3_region) || strlen(c->s3_region) > 64 || strpbrk(c->s3_region, ": /"))
        return refuse(m, "s3_region", "must be a region name such as us-east-1");
    if (empty(c->s3_access_key_id) || strlen(c->s3_access_key_id) > 128 ||
        strchr(c->s3_access_key_id, ':'))
        return refuse(m, "s3_access_key_id", "must be set (at most 128 characters, no ':')");
    if (empty(c->s3_secret_access_key) == empty(c->s3_secret_access_key_file))
        return refuse(m, "s3_secret_access_key",
                      "set exactly one of s3_secret_access_key and s3_secret_access_key_file");
    return 0;
}

/* The secret from s3_secret_access_key_file: its first line. */
static int read_secret_file(media *m, char *out, size_t cap)
{
    const char *path = m->cfg.s3_secret_access_key_file;
    FILE *f = fopen(path, "re");
    if (!f) {
        m->h->log(m->self, ATRIUM_LOG_ERROR,
                  "invalid configuration: plugins.media.s3_secret_access_key_file: cannot "
                  "read %s: %s",
                  path, strerror(errno));
        return ATRIUM_E_INVAL;
    }
    size_t n = fread(out, 1, cap - 1, f);
    fclose(f);
    out[n] = '\0';
    out[strcspn(out, "\r\n")] = '\0';
    if (!out[0]) return refuse(m, "s3_secret_access_key_file", "the file is empty");
    return 0;
}

static int create_metrics(media *m, media_s3 *s)
{
    const atrium_host *h = m->h;
    char labels[64];
    for (int k = 0; k < N_KINDS; k++) {
        for (int o = 0; o < N_OUTCOMES; o++) {
            snprintf(labels, sizeof(labels), "kind=\"%s\",outcome=\"%s\"", KIND_NAMES[k],
                     OUTCOME_NAMES[o]);
            s->m_requests[k][o] = h->metric_counter(
                m->self, "atrium_media_store_requests_total", labels,
                "Requests to the object store, by kind and outcome (not_found: 404; "
                "refused: another answer than success; failed: no answer in time)");
        }
        snprintf(labels, sizeof(labels), "kind=\"%s\"", KIND_NAMES[k]);
        s->m_ms[k] = h->metric_counter(m->self, "atrium_media_store_request_ms_total", labels,
                                       "Milliseconds spent in object store requests, by kind");
    }
    s->m_bytes_up = h->metric_counter(m->self, "atrium_media_store_bytes_total",
                                      "direction=\"up\"", "Bytes sent to or read from the object store");
    s->m_bytes_down = h->metric_counter(m->self, "atrium_media_store_bytes_total",
                                        "direction=\"down\"", "Bytes sent to or read from the object store");
    s->m_in_flight = h->metric_gauge(m->self, "atrium_media_store_in_flight", NULL,
                                     "Object store requests running now (at most s3_max_concurrent)");
    s->m_hits = h->metric_counter(m->self, "atrium_media_store_cache_hits_total", NULL,
                                  "Originals found in the local folder");
    s->m_misses = h->metric_counter(m->self, "atrium_media_store_cache_misses_total", NULL,
                                    "Originals read through from the object store");
    return s->m_in_flight && s->m_hits && s->m_misses ? 0 : ATRIUM_E_NOMEM;
}

int s3_init(media *m)
{
    if (strcmp(m->cfg.storage, "s3") != 0) return 0;
    media_s3 *s = calloc(1, sizeof(*s));
    if (!s) return ATRIUM_E_NOMEM;
    int rc = 0;
    if (!empty(m->cfg.s3_secret_access_key_file))
        rc = read_secret_file(m, s->secret, sizeof(s->secret));
    else if (strlen(m->cfg.s3_secret_access_key) >= sizeof(s->secret))
        rc = refuse(m, "s3_secret_access_key", "longer than 255 characters");
    else
        snprintf(s->secret, sizeof(s->secret), "%s", m->cfg.s3_secret_access_key);
    snprintf(s->sigv4, sizeof(s->sigv4), "aws:amz:%s:s3", m->cfg.s3_region);
    if (rc == 0) rc = create_metrics(m, s);
    if (rc == 0) {
        m->store_pool =
            m->h->pool_create(m->self, "store", m->cfg.s3_max_concurrent, S3_POOL_QUEUE);
        if (!m->store_pool) rc = ATRIUM_E_NOMEM;
    }
    if (rc == 0 && m->h->cond_init(&s->cv) != 0) rc = ATRIUM_E_NOMEM;
    if (rc < 0) {
        free(s);
        return rc;
    }
    pthread_mutex_init(&s->mu, NULL);
    m->s3 = s;
    return 0;
}

void s3_fini(media *m)
{
    media_s3 *s = m->s3;
    if (!s) return;
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    explicit_bzero(s->secret, sizeof(s->secret));
    free(s);
    m->s3 = NULL;
}

/* ---- one request ------------------------------------------------------------------------ */

int s3_original_key(const char *media_id, char *out, size_t cap)
{
    int n = snprintf(out, cap, "originals/%s", media_id);
    return n < 0 || (size_t)n >= cap ? ATRIUM_E_INVAL : 0;
}

/* The URL of key (NULL: the bucket), path style or virtual-host style. Keys are built
 * here from validated media IDs ([A-Za-z0-9_-]) and '/', so they need no encoding. */
static int object_url(const media *m, const char *key, char *out, size_t cap)
{
    const media_config *c = &m->cfg;
    const char *e = c->s3_endpoint;
    size_t elen = strlen(e);
    while (elen && e[elen - 1] == '/') elen--;
    int n;
    if (c->s3_path_style) {
        n = snprintf(out, cap, "%.*s/%s%s%s", (int)elen, e, c->s3_bucket, key ? "/" : "",
                     key ? key : "");
    } else {
        const char *host = strstr(e, "://") + 3;
        n = snprintf(out, cap, "%.*s%s.%.*s/%s", (int)(host - e), e, c->s3_bucket,
                     (int)(elen - (size_t)(host - e)), host, key ? key : "");
    }
    return n < 0 || (size_t)n >= cap ? ATRIUM_E_INVAL : 0;
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *arg)
{
    s3_call *call = arg;
    size_t len = size * nmemb;
    if (!call->status) curl_easy_getinfo(call->easy, CURLINFO_RESPONSE_CODE, &call->status);
    if (call->status == 200 && call->out_fd >= 0) {
        if (store_write_all(call->out_fd, data, len) < 0) {
            call->write_failed = true;
            return 0; /* aborts the transfer */
        }
        call->bytes += (int64_t)len;
        return len;
    }
    size_t room = sizeof(call->err_body) - 1 - call->err_len;
    size_t take = len < room ? len : room;
    memcpy(call->err_body + call->err_len, data, take);
    call->err_len += take;
    call->err_body[call->err_len] = '\0';
    return len;
}

static void deadline_after(struct timespec *ts, int64_t ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* A request slot, waiting at most s3_timeout_ms. */
static bool slot_acquire(media *m)
{
    media_s3 *s = m->s3;
    struct timespec until;
    deadline_after(&until, m->cfg.s3_timeout_ms);
    pthread_mutex_lock(&s->mu);
    while (s->in_flight >= m->cfg.s3_max_concurrent) {
        if (pthread_cond_timedwait(&s->cv, &s->mu, &until) == ETIMEDOUT) {
            pthread_mutex_unlock(&s->mu);
            return false;
        }
    }
    s->in_flight++;
    pthread_mutex_unlock(&s->mu);
    m->h->metric_add(s->m_in_flight, 1);
    return true;
}

static void slot_release(media *m)
{
    media_s3 *s = m->s3;
    pthread_mutex_lock(&s->mu);
    s->in_flight--;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    m->h->metric_add(s->m_in_flight, -1);
}

static int outcome_of(const s3_call *call)
{
    if (call->cc != CURLE_OK) return OUT_FAILED;
    if (call->status == 200) return OUT_OK;
    return call->status == 404 ? OUT_NOT_FOUND : OUT_REFUSED;
}

/* Run call. Returns its enum s3_outcome (counted). */
static int perform(media *m, s3_call *call)
{
    media_s3 *s = m->s3;
    const media_config *c = &m->cfg;
    char url[S3_URL_MAX];
    if (object_url(m, call->key, url, sizeof(url)) < 0) {
        snprintf(call->curl_err, sizeof(call->curl_err), "the object's URL is too long");
        call->cc = CURLE_URL_MALFORMAT;
        return OUT_FAILED;
    }
    int64_t started = m->h->now_ms();
    if (!slot_acquire(m)) {
        snprintf(call->curl_err, sizeof(call->curl_err),
                 "no free request slot (s3_max_concurrent %d) within %lld ms",
                 c->s3_max_concurrent, (long long)c->s3_timeout_ms);
        call->cc = CURLE_OPERATION_TIMEDOUT;
        m->h->metric_add(s->m_requests[call->kind][OUT_FAILED], 1);
        return OUT_FAILED;
    }
    CURL *e = curl_easy_init();
    /* Only this header: libcurl 7.88 signs every header the caller sets, even one that
     * only removes a default ("Expect:"), and the store then refuses the signature. */
    struct curl_slist *hdrs = curl_slist_append(NULL, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
    if (!e || !hdrs) {
        call->cc = CURLE_OUT_OF_MEMORY;
        snprintf(call->curl_err, sizeof(call->curl_err), "out of memory");
    } else {
        call->easy = e;
        curl_easy_setopt(e, CURLOPT_URL, url);
        curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
        curl_easy_setopt(e, CURLOPT_AWS_SIGV4, s->sigv4);
        curl_easy_setopt(e, CURLOPT_USERNAME, c->s3_access_key_id);
        curl_easy_setopt(e, CURLOPT_PASSWORD, s->secret);
        curl_easy_setopt(e, CURLOPT_HTTPHEADER, hdrs);
        curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)c->s3_timeout_ms);
        long connect_ms = c->s3_timeout_ms < S3_CONNECT_TIMEOUT_MS ? (long)c->s3_timeout_ms
                                                                   : S3_CONNECT_TIMEOUT_MS;
        curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, connect_ms);
        curl_easy_setopt(e, CURLOPT_ERRORBUFFER, call->curl_err);
        if (!empty(c->s3_ca_file)) curl_easy_setopt(e, CURLOPT_CAINFO, c->s3_ca_file);
        curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(e, CURLOPT_WRITEDATA, call);
        if (call->kind == KIND_HEAD) {
            curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
        } else if (call->kind == KIND_PUT) {
            curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
            curl_easy_setopt(e, CURLOPT_READDATA, call->upload);
            curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE, (curl_off_t)call->upload_size);
        }
        call->cc = curl_easy_perform(e);
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &call->status);
        curl_off_t length = -1;
        if (curl_easy_getinfo(e, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length) != CURLE_OK)
            length = -1;
        call->length = (int64_t)length;
        if (call->cc != CURLE_OK && !call->curl_err[0])
            snprintf(call->curl_err, sizeof(call->curl_err), "%s", curl_easy_strerror(call->cc));
    }
    curl_slist_free_all(hdrs);
    if (e) curl_easy_cleanup(e);
    call->easy = NULL;
    slot_release(m);
    int out = outcome_of(call);
    m->h->metric_add(s->m_requests[call->kind][out], 1);
    m->h->metric_add(s->m_ms[call->kind], m->h->now_ms() - started);
    return out;
}

/* The <Code> of an S3 error body, or "". */
static void error_code(const s3_call *call, char *out, size_t cap)
{
    out[0] = '\0';
    const char *p = strstr(call->err_body, "<Code>");
    if (!p) return;
    p += 6;
    size_t n = strcspn(p, "<");
    snprintf(out, cap, "%.*s", (int)(n < 64 ? n : 64), p);
}

static void log_failure(media *m, const s3_call *call, const char *what)
{
    char code[72];
    error_code(call, code, sizeof(code));
    if (call->cc != CURLE_OK)
        m->h->log(m->self, ATRIUM_LOG_ERROR, "object store: %s %s failed: %s", what,
                  call->key ? call->key : m->cfg.s3_bucket, call->curl_err);
    else
        m->h->log(m->self, ATRIUM_LOG_ERROR, "object store: %s %s answered HTTP %ld %s", what,
                  call->key ? call->key : m->cfg.s3_bucket, call->status, code);
}

/* ---- the bucket, writes, reads ----------------------------------------------------------- */

int s3_start(media *m)
{
    if (!m->s3) return 0;
    const media_config *c = &m->cfg;
    s3_call call = {.kind = KIND_HEAD, .out_fd = -1};
    int out = perform(m, &call);
    const char *why = NULL;
    char buf[CURL_ERROR_SIZE + 96];
    if (out == OUT_FAILED) {
        snprintf(buf, sizeof(buf), "unreachable (%s)", call.curl_err);
        why = buf;
    } else if (call.status == 404) {
        why = "no such bucket (create it first, or fix s3_bucket)";
    } else if (call.status == 403) {
        why = "the credentials were refused (check s3_access_key_id and the secret; the key "
              "needs access to the bucket)";
    } else if (call.status == 301 || call.status == 400) {
        snprintf(buf, sizeof(buf),
                 "answered HTTP %ld (a wrong s3_region, or s3_path_style, for this store?)",
                 call.status);
        why = buf;
    } else if (out != OUT_OK) {
        snprintf(buf, sizeof(buf), "answered HTTP %ld", call.status);
        why = buf;
    }
    if (why) {
        m->h->log(m->self, ATRIUM_LOG_ERROR,
                  "object store: bucket \"%s\" at %s: %s; the media plugin cannot start",
                  c->s3_bucket, c->s3_endpoint, why);
        return ATRIUM_E_INVAL;
    }
    m->h->log(m->self, ATRIUM_LOG_INFO,
              "object store: bucket \"%s\" at %s answers; the local folder %s is its cache",
              c->s3_bucket, c->s3_endpoint, c->store_path);
    return 0;
}

int s3_put_file(media *m, const char *key, const char *path, int64_t size)
{
    FILE *f = fopen(path, "rbe");
    if (!f) {
        m->h->log(m->self, ATRIUM_LOG_ERROR, "object store: cannot read %s: %s", path,
                  strerror(errno));
        return -1;
    }
    s3_call call = {.kind = KIND_PUT, .key = key, .upload = f, .upload_size = size, .out_fd = -1};
    int out = perform(m, &call);
    fclose(f);
    if (out != OUT_OK) {
        log_failure(m, &call, "PUT");
        return -1;
    }
    m->h->metric_add(m->s3->m_bytes_up, size);
    return 0;
}

int s3_get_file(media *m, const char *key, const char *final_path)
{
    store_tmp tmp;
    if (store_tmp_open(m, final_path, &tmp) < 0) return S3_FAILED;
    s3_call call = {.kind = KIND_GET, .key = key, .out_fd = tmp.fd};
    int out = perform(m, &call);
    if (out != OUT_OK || call.write_failed) {
        store_tmp_discard(&tmp);
        if (out == OUT_NOT_FOUND) return S3_NOT_FOUND;
        log_failure(m, &call, "GET");
        return S3_FAILED;
    }
    m->h->metric_add(m->s3->m_bytes_down, call.bytes);
    int rc = store_tmp_commit(m, &tmp, final_path, false);
    /* Another fetch of the same object landed first: its bytes are the same. */
    return rc == 0 || rc == -EEXIST ? S3_OK : S3_FAILED;
}

bool s3_original_cached(media *m, const char *path)
{
    bool hit = s3_cache_touch(m, path);
    m->h->metric_add(hit ? m->s3->m_hits : m->s3->m_misses, 1);
    return hit;
}

int s3_head_object(media *m, const char *key, int64_t *size)
{
    s3_call call = {.kind = KIND_HEAD, .key = key, .out_fd = -1};
    int out = perform(m, &call);
    if (out == OUT_OK) {
        *size = call.length;
        return S3_OK;
    }
    if (out == OUT_NOT_FOUND) return S3_NOT_FOUND;
    log_failure(m, &call, "HEAD");
    return S3_FAILED;
}

int s3_fetch_original(media *m, const char *media_id, const char *path)
{
    if (s3_cache_touch(m, path)) return S3_OK; /* another fetch landed it meanwhile */
    char key[S3_KEY_MAX];
    if (s3_original_key(media_id, key, sizeof(key)) < 0) return S3_FAILED;
    int rc = s3_get_file(m, key, path);
    if (rc == S3_NOT_FOUND)
        m->h->log(m->self, ATRIUM_LOG_ERROR,
                  "object store: original %s has a row but no object %s: run "
                  "atrium-media-verify",
                  media_id, key);
    struct stat st;
    if (rc == S3_OK && stat(path, &st) == 0) s3_cache_added(m, (int64_t)st.st_size);
    return rc;
}
