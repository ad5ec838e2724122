/*
 * plugins/media/s3.c - media on an S3-compatible object store (storage: s3): the settings
 * check, the start-up HEAD of the bucket, PUT of an original and GET of one into the local
 * folder, which is then a cache of the bucket (docs/adr/0011-media-on-an-object-store.md).
 *
 * Requests are signed with AWS Signature Version 4 by libcurl (CURLOPT_AWS_SIGV4, in the
 * libcurl the host already initialized: the plugin never calls curl_global_init). The
 * payload is sent as UNSIGNED-PAYLOAD in x-amz-content-sha256, which S3 and the RADOS
 * Gateway require beside the signature (over TLS the transport protects the body; the
 * original's SHA-256 is kept in its row and checked by verify-media). At most
 * s3_max_concurrent requests run at once (the rest wait, at most s3_timeout_ms, for a
 * slot), each bounded by s3_timeout_ms. Nothing here runs on a request-pool thread (s3.h).
 *
 * Connections to the store are reused: a request slot comes with an easy handle kept from
 * an earlier request (handle_take), whose one connection libcurl keeps open between
 * requests, so a GET needs no new TCP connection (nor TLS handshake). At most
 * s3_max_concurrent handles exist, so at most that many connections, idle or not; a
 * connection idle S3_IDLE_CONNECTION_MAX_S is closed rather than reused, and a handle
 * whose request failed is dropped with its connection. A connection the store closed
 * while idle is seen dead before use; one it closes as a request goes out has the request
 * sent again on a new connection by libcurl, but only where that is safe: every request here may be
 * sent twice (GET, HEAD, PUT and UploadPart of the same bytes, DELETE) except the two
 * POSTs (CreateMultipartUpload, CompleteMultipartUpload), which always go on a new
 * connection (libcurl retries only on a reused one). A PUT's body is sent again from its
 * start (on_seek).
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
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "media.h"
#include "s3.h"
#include "s3_call.h"

#define S3_URL_MAX 2048
#define S3_SECRET_MAX 256
#define S3_CONNECT_TIMEOUT_MS 5000
#define S3_PART_MIN_BYTES (5LL * 1024 * 1024) /* S3's smallest part (but the last) */
#define S3_POOL_QUEUE 1024 /* downloads waiting for a store worker (then 503) */
/* libcurl's receive buffer for a GET's body (its default is 16 KiB): one per running GET,
 * so at most s3_max_concurrent of them. A cold 5 MB download streamed from the store took
 * ~320 receive, write and hash rounds at 16 KiB; at 256 KiB the socket gives what it has
 * in a few (bench/media_s3.sh: 0.86x a direct GET at 16 KiB, 0.90x at 256 KiB, 30 pairs;
 * docs/adr/0031-streaming-media-to-and-from-the-object-store.md). */
#define S3_GET_BUFFER_BYTES (256L * 1024)
/* A connection idle this long is closed, not reused: below the idle timeouts stores keep
 * (a connection the store closes first costs a failed attempt and libcurl's retry). */
#define S3_IDLE_CONNECTION_MAX_S 20L

static const char *const KIND_NAMES[S3_N_KINDS] = {
    "head", "put", "get", "delete", "list", "create", "part", "complete", "abort", "range"};
static const char *const OUTCOME_NAMES[S3_N_OUTCOMES] = {"ok", "not_found", "refused", "failed"};

struct media_s3 {
    char secret[S3_SECRET_MAX];
    char sigv4[128]; /* "aws:amz:<region>:s3" */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* CLOCK_MONOTONIC (host->cond_init) */
    int in_flight;
    CURL **idle; /* handles kept for the next request: n_idle of s3_max_concurrent */
    int n_idle;
    atrium_metric *m_requests[S3_N_KINDS][S3_N_OUTCOMES];
    atrium_metric *m_ms[S3_N_KINDS];
    atrium_metric *m_bytes_up, *m_bytes_down, *m_in_flight, *m_hits, *m_misses;
    atrium_metric *m_connects, *m_idle;
    atrium_metric *m_thumbs_render, *m_thumbs_bucket;
};

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

/* The store's own settings (endpoint, bucket, region, key, secret, part size). */
static int check_store_settings(media *m)
{
    const media_config *c = &m->cfg;
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
    if (c->s3_part_size_bytes < S3_PART_MIN_BYTES)
        return refuse(m, "s3_part_size_bytes",
                      "must be at least 5242880 (5 MiB): S3 refuses smaller parts of a "
                      "multipart upload");
    return 0;
}

int s3_settings_check(media *m)
{
    const char *storage = m->cfg.storage;
    if (strcmp(storage, "local") == 0) return 0;
    if (strcmp(storage, "s3") != 0) return refuse(m, "storage", "must be \"local\" or \"s3\"");
    return check_store_settings(m);
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
    for (int k = 0; k < S3_N_KINDS; k++) {
        for (int o = 0; o < S3_N_OUTCOMES; o++) {
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
    s->m_connects = h->metric_counter(
        m->self, "atrium_media_store_connections_total", NULL,
        "Connections opened to the object store (a request on a kept connection opens none)");
    s->m_idle = h->metric_gauge(m->self, "atrium_media_store_handles_idle", NULL,
                                "Kept connections to the object store waiting for a request "
                                "(with those in use, at most s3_max_concurrent)");
    s->m_hits = h->metric_counter(m->self, "atrium_media_store_cache_hits_total", NULL,
                                  "Originals found in the local folder");
    s->m_misses = h->metric_counter(m->self, "atrium_media_store_cache_misses_total", NULL,
                                    "Originals read through from the object store");
    s->m_thumbs_render = h->metric_counter(
        m->self, "atrium_media_store_thumbnails_total", "source=\"render\"",
        "Thumbnails a render needed, by where they came from (render: rendered here and put in "
        "the bucket; bucket: read through, rendered before)");
    s->m_thumbs_bucket = h->metric_counter(
        m->self, "atrium_media_store_thumbnails_total", "source=\"bucket\"",
        "Thumbnails a render needed, by where they came from (render: rendered here and put in "
        "the bucket; bucket: read through, rendered before)");
    return s->m_in_flight && s->m_connects && s->m_idle && s->m_hits && s->m_misses &&
                   s->m_thumbs_render && s->m_thumbs_bucket
               ? 0
               : ATRIUM_E_NOMEM;
}

int s3_client_init(media *m)
{
    int rc = check_store_settings(m);
    if (rc < 0) return rc;
    media_s3 *s = calloc(1, sizeof(*s));
    if (!s) return ATRIUM_E_NOMEM;
    if (!empty(m->cfg.s3_secret_access_key_file))
        rc = read_secret_file(m, s->secret, sizeof(s->secret));
    else if (strlen(m->cfg.s3_secret_access_key) >= sizeof(s->secret))
        rc = refuse(m, "s3_secret_access_key", "longer than 255 characters");
    else
        snprintf(s->secret, sizeof(s->secret), "%s", m->cfg.s3_secret_access_key);
    snprintf(s->sigv4, sizeof(s->sigv4), "aws:amz:%s:s3", m->cfg.s3_region);
    if (rc == 0) rc = create_metrics(m, s);
    if (rc == 0 && !(s->idle = calloc((size_t)m->cfg.s3_max_concurrent, sizeof(*s->idle))))
        rc = ATRIUM_E_NOMEM;
    if (rc == 0 && m->h->cond_init(&s->cv) != 0) rc = ATRIUM_E_NOMEM;
    if (rc < 0) {
        explicit_bzero(s->secret, sizeof(s->secret));
        free(s->idle);
        free(s);
        return rc;
    }
    pthread_mutex_init(&s->mu, NULL);
    m->s3 = s;
    return 0;
}

int s3_init(media *m)
{
    if (strcmp(m->cfg.storage, "s3") != 0) return 0;
    int rc = s3_client_init(m);
    if (rc < 0) return rc;
    m->store_pool = m->h->pool_create(m->self, "store", m->cfg.s3_max_concurrent, S3_POOL_QUEUE);
    if (!m->store_pool) {
        s3_fini(m);
        return ATRIUM_E_NOMEM;
    }
    return 0;
}

void s3_fini(media *m)
{
    media_s3 *s = m->s3;
    if (!s) return;
    for (int i = 0; i < s->n_idle; i++) curl_easy_cleanup(s->idle[i]);
    free(s->idle);
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

/* The URL of call's key (NULL: the bucket) and query, path style or virtual-host style.
 * Keys are built here from validated media IDs ([A-Za-z0-9_-]), hashes and '/', so they
 * need no encoding; query values come escaped (s3_query_escape). */
static int object_url(const media *m, const s3_call *call, char *out, size_t cap)
{
    const media_config *c = &m->cfg;
    const char *e = c->s3_endpoint;
    const char *key = call->key;
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
    if (n >= 0 && (size_t)n < cap && call->query)
        n += snprintf(out + n, cap - (size_t)n, "?%s", call->query);
    return n < 0 || (size_t)n >= cap ? ATRIUM_E_INVAL : 0;
}

int s3_query_escape(const char *s, char *out, size_t cap)
{
    static const char HEX[] = "0123456789ABCDEF";
    size_t o = 0;
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        bool plain = isalnum(ch) || ch == '-' || ch == '_' || ch == '.' || ch == '~';
        if (o + (plain ? 1 : 3) >= cap) return ATRIUM_E_INVAL;
        if (plain) {
            out[o++] = (char)ch;
        } else {
            out[o++] = '%';
            out[o++] = HEX[ch >> 4];
            out[o++] = HEX[ch & 15];
        }
    }
    if (o >= cap) return ATRIUM_E_INVAL;
    out[o] = '\0';
    return 0;
}

bool s3_xml_text(const char *from, const char *end, const char *tag, char *out, size_t cap)
{
    char open[64];
    snprintf(open, sizeof(open), "<%s>", tag);
    const char *p = strstr(from, open);
    if (!p || (end && p >= end)) return false;
    p += strlen(open);
    const char *q = strchr(p, '<');
    if (!q || (end && q > end) || (size_t)(q - p) >= cap) return false;
    memcpy(out, p, (size_t)(q - p));
    out[q - p] = '\0';
    return true;
}

static void keep_text(char *buf, size_t cap, size_t *len, const char *data, size_t n,
                      bool *truncated)
{
    size_t room = cap - 1 - *len;
    size_t take = n < room ? n : room;
    if (take < n && truncated) *truncated = true;
    memcpy(buf + *len, data, take);
    *len += take;
    buf[*len] = '\0';
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *arg)
{
    s3_call *call = arg;
    size_t len = size * nmemb;
    if (!call->status) curl_easy_getinfo(call->easy, CURLINFO_RESPONSE_CODE, &call->status);
    bool body = call->status == 200 || (call->range && call->status == 206);
    if (body && (call->out_fd >= 0 || call->body_hash)) {
        if (call->out_fd >= 0 && store_write_all(call->out_fd, data, len) < 0) {
            call->write_failed = true;
            return 0; /* aborts the transfer */
        }
        if (call->body_hash) sha256_update(call->body_hash, data, len);
        call->bytes += (int64_t)len;
        if (call->on_bytes && !call->on_bytes(call->on_bytes_arg, call->bytes)) {
            call->write_failed = true;
            return 0;
        }
        return len;
    }
    if (call->resp && call->resp_cap > 0)
        keep_text(call->resp, call->resp_cap, &call->resp_len, data, len, &call->resp_truncated);
    else
        keep_text(call->err_body, sizeof(call->err_body), &call->err_len, data, len, NULL);
    return len;
}

/* Acknowledge at once what call's connection received. A store that writes an answer's
 * head and its body apart with Nagle's algorithm on (the RADOS Gateway's default, no
 * tcp_nodelay) holds a small body until the head is acknowledged, and on a kept
 * connection Linux delays that acknowledgement (up to 40 ms: it expects a request to
 * carry it). Every small answer on a kept connection then took 40 ms more than on a new
 * one (bench/media_s3.sh: 150 thumbnails, a 404 GET of the thumbnail's key and a GET of
 * the original each, 1.6x slower);
 * docs/adr/0031-streaming-media-to-and-from-the-object-store.md. */
static void ack_now(const s3_call *call)
{
#ifdef TCP_QUICKACK
    if (call->sock == CURL_SOCKET_BAD) return;
    int one = 1;
    (void)setsockopt(call->sock, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof(one));
#else
    (void)call;
#endif
}

/* A new connection's socket (libcurl asks only for those): the one call's answer comes on. */
static int on_socket(void *arg, curl_socket_t fd, curlsocktype purpose)
{
    s3_call *call = arg;
    (void)purpose;
    call->sock = fd;
    return CURL_SOCKOPT_OK;
}

/* The answer's ETag header, for UploadPart; the end of the head acknowledged (ack_now). */
static size_t on_header(char *data, size_t size, size_t nmemb, void *arg)
{
    s3_call *call = arg;
    size_t len = size * nmemb;
    if (len >= 1 && len <= 2 && (data[0] == '\r' || data[0] == '\n')) {
        ack_now(call); /* the end of the head: the body may be waiting for our ACK */
        return len;
    }
    if (len > 5 && strncasecmp(data, "etag:", 5) == 0) {
        const char *v = data + 5;
        size_t n = len - 5;
        while (n && (*v == ' ' || *v == '\t')) v++, n--;
        while (n && (v[n - 1] == '\r' || v[n - 1] == '\n' || v[n - 1] == ' ')) n--;
        if (n < sizeof(call->etag)) {
            memcpy(call->etag, v, n);
            call->etag[n] = '\0';
        }
    }
    return len;
}

/* A PUT's body: upload_size bytes of upload_fd from upload_offset (pread: the descriptor's
 * offset is not used, so a part needs no seek and no FILE). */
static size_t on_read(char *buf, size_t size, size_t nmemb, void *arg)
{
    s3_call *call = arg;
    int64_t left = call->upload_size - call->bytes_sent;
    size_t want = size * nmemb;
    if (left <= 0) return 0;
    if ((int64_t)want > left) want = (size_t)left;
    ssize_t n;
    do
        n = pread(call->upload_fd, buf, want, (off_t)(call->upload_offset + call->bytes_sent));
    while (n < 0 && errno == EINTR);
    if (n <= 0) return CURL_READFUNC_ABORT; /* a short file: never send a torn object */
    call->bytes_sent += n;
    return (size_t)n;
}

/* libcurl sends a PUT's body again (its request retried on a new connection): from the
 * start of this request's bytes. */
static int on_seek(void *arg, curl_off_t offset, int origin)
{
    s3_call *call = arg;
    if (origin != SEEK_SET || offset < 0 || offset > call->upload_size)
        return CURL_SEEKFUNC_CANTSEEK;
    call->bytes_sent = (int64_t)offset;
    return CURL_SEEKFUNC_OK;
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

/* [with a slot] The most recently kept handle (its connection the likeliest still open),
 * or a new one; NULL when out of memory. */
static CURL *handle_take(media *m)
{
    media_s3 *s = m->s3;
    CURL *e = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->n_idle > 0) e = s->idle[--s->n_idle];
    pthread_mutex_unlock(&s->mu);
    if (!e) return curl_easy_init();
    m->h->metric_add(s->m_idle, -1);
    return e;
}

/* [with a slot] Keep e and its connection for the next request, unless its request failed
 * (then its connection may be in any state: both go). At most s3_max_concurrent handles
 * exist (one per slot), so the list never overflows. */
static void handle_give(media *m, CURL *e, bool failed)
{
    media_s3 *s = m->s3;
    bool kept = false;
    if (!failed) {
        curl_easy_reset(e); /* keeps its connection (and TLS session), forgets call's buffers */
        pthread_mutex_lock(&s->mu);
        if (s->n_idle < m->cfg.s3_max_concurrent) {
            s->idle[s->n_idle++] = e;
            kept = true;
        }
        pthread_mutex_unlock(&s->mu);
    }
    if (kept)
        m->h->metric_add(s->m_idle, 1);
    else
        curl_easy_cleanup(e);
}

static int outcome_of(const s3_call *call)
{
    if (call->cc != CURLE_OK) return S3_OUT_FAILED;
    if (call->status >= 200 && call->status < 300) return S3_OUT_OK;
    return call->status == 404 ? S3_OUT_NOT_FOUND : S3_OUT_REFUSED;
}

/* The method and body of call's kind. */
static void set_method(CURL *e, s3_call *call)
{
    switch (call->kind) {
    case S3_KIND_HEAD:
        curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
        break;
    case S3_KIND_PUT:
    case S3_KIND_PART:
        curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(e, CURLOPT_READFUNCTION, on_read);
        curl_easy_setopt(e, CURLOPT_READDATA, call);
        curl_easy_setopt(e, CURLOPT_SEEKFUNCTION, on_seek);
        curl_easy_setopt(e, CURLOPT_SEEKDATA, call);
        curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE, (curl_off_t)call->upload_size);
        break;
    case S3_KIND_CREATE:
    case S3_KIND_COMPLETE:
        /* Not to be sent twice (a second Create opens another upload; a second Complete
         * finds none): a new connection, which libcurl never retries on. */
        curl_easy_setopt(e, CURLOPT_FRESH_CONNECT, 1L);
        curl_easy_setopt(e, CURLOPT_POST, 1L);
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)call->post_len);
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, call->post_body ? call->post_body : "");
        break;
    case S3_KIND_DELETE:
    case S3_KIND_ABORT:
        curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, "DELETE");
        break;
    case S3_KIND_GET:
    case S3_KIND_RANGE:
        curl_easy_setopt(e, CURLOPT_BUFFERSIZE, S3_GET_BUFFER_BYTES);
        break;
    default: /* LIST */
        break;
    }
}

/* The options of call on e (a new or reset handle). */
static void set_options(media *m, CURL *e, s3_call *call, const char *url, struct curl_slist *hdrs)
{
    const media_config *c = &m->cfg;
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_AWS_SIGV4, m->s3->sigv4);
    curl_easy_setopt(e, CURLOPT_USERNAME, c->s3_access_key_id);
    curl_easy_setopt(e, CURLOPT_PASSWORD, m->s3->secret);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_MAXCONNECTS, 1L);
    curl_easy_setopt(e, CURLOPT_MAXAGE_CONN, S3_IDLE_CONNECTION_MAX_S);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)c->s3_timeout_ms);
    long connect_ms = c->s3_timeout_ms < S3_CONNECT_TIMEOUT_MS ? (long)c->s3_timeout_ms
                                                               : S3_CONNECT_TIMEOUT_MS;
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, connect_ms);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, call->curl_err);
    if (!empty(c->s3_ca_file)) curl_easy_setopt(e, CURLOPT_CAINFO, c->s3_ca_file);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, call);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, call);
    curl_easy_setopt(e, CURLOPT_SOCKOPTFUNCTION, on_socket);
    curl_easy_setopt(e, CURLOPT_SOCKOPTDATA, call);
    /* A kept handle's connection (still known after curl_easy_reset), or none. */
    call->sock = CURL_SOCKET_BAD;
    if (curl_easy_getinfo(e, CURLINFO_ACTIVESOCKET, &call->sock) != CURLE_OK)
        call->sock = CURL_SOCKET_BAD;
    set_method(e, call);
    if (call->range) curl_easy_setopt(e, CURLOPT_RANGE, call->range);
}

/* Send call on e and read its answer into call (cc, status, length); the connections it
 * opened counted. A HEAD that got nothing back on a kept connection (the store closed it
 * as the request went out) is sent once more on a new one: libcurl does that itself for
 * the other kinds, not for a request without a body. */
static void transfer(media *m, CURL *e, s3_call *call)
{
    long connects = 0;
    call->cc = curl_easy_perform(e);
    if (curl_easy_getinfo(e, CURLINFO_NUM_CONNECTS, &connects) != CURLE_OK) connects = 0;
    if (call->kind == S3_KIND_HEAD && connects == 0 &&
        (call->cc == CURLE_GOT_NOTHING || call->cc == CURLE_SEND_ERROR ||
         call->cc == CURLE_RECV_ERROR)) {
        call->curl_err[0] = '\0';
        curl_easy_setopt(e, CURLOPT_FRESH_CONNECT, 1L);
        call->cc = curl_easy_perform(e);
        connects = 1;
    }
    if (connects > 0) m->h->metric_add(m->s3->m_connects, connects);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &call->status);
    curl_off_t length = -1;
    if (curl_easy_getinfo(e, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length) != CURLE_OK)
        length = -1;
    call->length = (int64_t)length;
    if (call->cc != CURLE_OK && !call->curl_err[0])
        snprintf(call->curl_err, sizeof(call->curl_err), "%s", curl_easy_strerror(call->cc));
}

int s3_perform(media *m, s3_call *call)
{
    media_s3 *s = m->s3;
    const media_config *c = &m->cfg;
    char url[S3_URL_MAX];
    if (call->resp && call->resp_cap) call->resp[0] = '\0';
    if (object_url(m, call, url, sizeof(url)) < 0) {
        snprintf(call->curl_err, sizeof(call->curl_err), "the object's URL is too long");
        call->cc = CURLE_URL_MALFORMAT;
        return S3_OUT_FAILED;
    }
    int64_t started = m->h->now_ms();
    if (!slot_acquire(m)) {
        snprintf(call->curl_err, sizeof(call->curl_err),
                 "no free request slot (s3_max_concurrent %d) within %lld ms",
                 c->s3_max_concurrent, (long long)c->s3_timeout_ms);
        call->cc = CURLE_OPERATION_TIMEDOUT;
        m->h->metric_add(s->m_requests[call->kind][S3_OUT_FAILED], 1);
        return S3_OUT_FAILED;
    }
    CURL *e = handle_take(m);
    /* Only this header: libcurl 7.88 signs every header the caller sets, even one that
     * only removes a default ("Expect:"), and the store then refuses the signature. */
    struct curl_slist *hdrs = curl_slist_append(NULL, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
    if (!e || !hdrs) {
        call->cc = CURLE_OUT_OF_MEMORY;
        snprintf(call->curl_err, sizeof(call->curl_err), "out of memory");
    } else {
        call->easy = e;
        set_options(m, e, call, url, hdrs);
        transfer(m, e, call);
    }
    curl_slist_free_all(hdrs);
    /* A transfer stopped by us (write_failed) or failed: its handle and connection go. */
    if (e) handle_give(m, e, call->cc != CURLE_OK || call->write_failed);
    call->easy = NULL;
    call->sock = CURL_SOCKET_BAD;
    slot_release(m);
    int out = outcome_of(call);
    m->h->metric_add(s->m_requests[call->kind][out], 1);
    m->h->metric_add(s->m_ms[call->kind], m->h->now_ms() - started);
    if (out == S3_OUT_OK && (call->kind == S3_KIND_PUT || call->kind == S3_KIND_PART))
        m->h->metric_add(s->m_bytes_up, call->upload_size);
    return out;
}

/* The <Code> of an S3 error body, or "". */
static void error_code(const s3_call *call, char *out, size_t cap)
{
    out[0] = '\0';
    const char *text = call->err_len ? call->err_body : call->resp ? call->resp : "";
    const char *p = strstr(text, "<Code>");
    if (!p) return;
    p += 6;
    size_t n = strcspn(p, "<");
    snprintf(out, cap, "%.*s", (int)(n < 64 ? n : 64), p);
}

void s3_log_failure(media *m, const s3_call *call, const char *what)
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
    s3_call call = {.kind = S3_KIND_HEAD, .out_fd = -1};
    int out = s3_perform(m, &call);
    const char *why = NULL;
    char buf[CURL_ERROR_SIZE + 96];
    if (out == S3_OUT_FAILED) {
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
    } else if (out != S3_OUT_OK) {
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
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        m->h->log(m->self, ATRIUM_LOG_ERROR, "object store: cannot read %s: %s", path,
                  strerror(errno));
        return -1;
    }
    int rc = 0;
    if (size > m->cfg.s3_part_size_bytes) {
        rc = s3_multipart_put(m, key, fd, size); /* logged there */
    } else {
        s3_call call = {.kind = S3_KIND_PUT, .key = key, .upload_fd = fd, .upload_size = size,
                        .out_fd = -1};
        if (s3_perform(m, &call) != S3_OUT_OK) {
            s3_log_failure(m, &call, "PUT");
            rc = -1;
        }
    }
    close(fd);
    return rc;
}

int s3_get_file_checked(media *m, const char *key, const char *final_path, const char *want_sha256)
{
    store_tmp tmp;
    if (store_tmp_open(m, final_path, &tmp) < 0) return S3_FAILED;
    sha256_ctx hash;
    sha256_init(&hash);
    s3_call call = {.kind = S3_KIND_GET, .key = key, .out_fd = tmp.fd,
                    .body_hash = want_sha256 ? &hash : NULL};
    int out = s3_perform(m, &call);
    if (out != S3_OUT_OK || call.write_failed) {
        store_tmp_discard(&tmp);
        if (out == S3_OUT_NOT_FOUND) return S3_NOT_FOUND;
        s3_log_failure(m, &call, "GET");
        return S3_FAILED;
    }
    m->h->metric_add(m->s3->m_bytes_down, call.bytes);
    if (want_sha256) {
        char hex[SHA256_HEX_CHARS + 1];
        sha256_final_hex(&hash, hex);
        if (strcmp(hex, want_sha256) != 0) {
            store_tmp_discard(&tmp);
            return S3_MISMATCH;
        }
    }
    int rc = store_tmp_commit(m, &tmp, final_path, false);
    /* Another fetch of the same object landed first: its bytes are the same. */
    return rc == 0 || rc == -EEXIST ? S3_OK : S3_FAILED;
}

int s3_get_file(media *m, const char *key, const char *final_path)
{
    return s3_get_file_checked(m, key, final_path, NULL);
}

int s3_object_sha256(media *m, const char *key, char hex[SHA256_HEX_CHARS + 1], int64_t *size)
{
    sha256_ctx hash;
    sha256_init(&hash);
    s3_call call = {.kind = S3_KIND_GET, .key = key, .out_fd = -1, .body_hash = &hash};
    int out = s3_perform(m, &call);
    if (out == S3_OUT_NOT_FOUND) return S3_NOT_FOUND;
    if (out != S3_OUT_OK) {
        s3_log_failure(m, &call, "GET");
        return S3_FAILED;
    }
    m->h->metric_add(m->s3->m_bytes_down, call.bytes);
    sha256_final_hex(&hash, hex);
    *size = call.bytes;
    return S3_OK;
}

void s3_count_down(media *m, int64_t bytes)
{
    if (bytes > 0) m->h->metric_add(m->s3->m_bytes_down, bytes);
}

void s3_count_cache(media *m, bool hit)
{
    m->h->metric_add(hit ? m->s3->m_hits : m->s3->m_misses, 1);
}

int s3_head_object(media *m, const char *key, int64_t *size)
{
    s3_call call = {.kind = S3_KIND_HEAD, .key = key, .out_fd = -1};
    int out = s3_perform(m, &call);
    if (out == S3_OUT_OK) {
        *size = call.length;
        return S3_OK;
    }
    if (out == S3_OUT_NOT_FOUND) return S3_NOT_FOUND;
    s3_log_failure(m, &call, "HEAD");
    return S3_FAILED;
}

/* ---- thumbnails, deletes --------------------------------------------------------------- */

int s3_thumbnail_key(const char *path, char *out, size_t cap)
{
    /* .../thumbnails/<a>/<b>/<sha256>/<file>: the last two names. */
    const char *file = strrchr(path, '/');
    if (!file || file == path) return ATRIUM_E_INVAL;
    const char *sha = file - 1;
    while (sha > path && *sha != '/') sha--;
    if (*sha != '/' || file - sha - 1 != SHA256_HEX_CHARS) return ATRIUM_E_INVAL;
    int n = snprintf(out, cap, "thumbnails/%s", sha + 1);
    return n < 0 || (size_t)n >= cap ? ATRIUM_E_INVAL : 0;
}

int s3_thumbnail_fetch(media *m, const char *path)
{
    char key[S3_KEY_MAX];
    if (s3_thumbnail_key(path, key, sizeof(key)) < 0) return S3_FAILED;
    int rc = s3_get_file(m, key, path);
    if (rc == S3_OK) m->h->metric_add(m->s3->m_thumbs_bucket, 1);
    return rc;
}

void s3_thumbnail_store(media *m, const char *path)
{
    m->h->metric_add(m->s3->m_thumbs_render, 1);
    char key[S3_KEY_MAX];
    struct stat st;
    if (s3_thumbnail_key(path, key, sizeof(key)) < 0 || stat(path, &st) < 0) return;
    if (s3_put_file(m, key, path, (int64_t)st.st_size) < 0)
        m->h->log(m->self, ATRIUM_LOG_WARN,
                  "object store: thumbnail %s stays in this local folder only", key);
}

int s3_delete_object(media *m, const char *key)
{
    s3_call call = {.kind = S3_KIND_DELETE, .key = key, .out_fd = -1};
    int out = s3_perform(m, &call);
    if (out == S3_OUT_OK || out == S3_OUT_NOT_FOUND) return 0;
    s3_log_failure(m, &call, "DELETE");
    return -1;
}
