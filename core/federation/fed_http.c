/*
 * core/federation/fed_http.c - the one outbound HTTP client (see fed_http.h for the
 * contract): a bounded submission queue, one I/O thread that owns the libcurl multi
 * handle and every easy handle, and the rules every outbound byte obeys.
 *
 * Threads. Callers only touch the queue (under `mu`) and curl_multi_wakeup, which libcurl
 * documents as callable from any thread; everything else curl (easy setup, the multi
 * loop, the callbacks, cleanup of a finished transfer) runs on the I/O thread, as libcurl
 * 7.88 wants: no handle is ever used by two threads, and no share handle exists. The I/O
 * thread's loop is: take the queued requests, start them, apply cancellations, let curl
 * make progress, finish what curl finished, finish what passed its deadline, then
 * curl_multi_poll until a socket is ready, curl's own timer, the nearest deadline, or a
 * wakeup.
 *
 * Deadlines. Each transfer gets CURLOPT_TIMEOUT_MS from its absolute deadline, but curl
 * does not run that clock while a transfer waits for a connection slot (the per-host or
 * total cap), so the I/O thread also keeps the running requests in a list sorted by
 * deadline and ends the expired ones itself. Removing a transfer mid-flight closes its
 * connection, so a peer that never answers gives its slot back at the deadline.
 *
 * Limits on what comes back: a declared Content-Length over max_body_bytes is refused in
 * the header callback, before any body byte; a body without one (chunked, or read to the
 * close) is counted as it arrives; response headers are capped as well. Both end the
 * request with FED_HTTP_E_TOO_LARGE. Headers are collected per response and reset at
 * each new status line, so a 100 Continue's headers never mix with the final answer's.
 *
 * Where connections go. Curl never resolves a name: the caller's addresses go in through
 * CURLOPT_RESOLVE, an IP-literal URL needs none, and no proxy is used (CURLOPT_PROXY ""
 * overrides the http_proxy environment, which would otherwise let a proxy connect where
 * the address rule does not look). Every socket is opened by open_socket, which asks
 * fed_iprange_allowed about the address being connected to and refuses with
 * CURL_SOCKET_BAD; the refusal is remembered so the request ends FED_HTTP_E_BLOCKED with
 * the address named, not as a generic connect error. Redirects are never followed.
 *
 * TLS: verification is on unless a request says otherwise (logged once per host as a
 * warning); the settings' CA files, concatenated into one PEM blob, replace the system's
 * store (CURLOPT_CAINFO_BLOB with CAINFO and CAPATH cleared). HTTP/2 is used where the
 * peer offers it over TLS, multiplexed on one connection.
 *
 * Deliberately not here: signing, server discovery, retries and backoff (fed_backoff.h):
 * a request is attempted once and its outcome reported.
 */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "core/federation/fed_http.h"
#include "core/federation/fed_iprange.h"

#ifndef ATRIUM_VERSION
#define ATRIUM_VERSION "dev"
#endif

#define FED_HTTP_DEFAULT_MAX_CONNECTIONS 16
#define FED_HTTP_DEFAULT_MAX_PER_HOST 8
#define FED_HTTP_DEFAULT_QUEUE_DEPTH 1024
#define FED_HTTP_MAX_QUEUE_DEPTH (1 << 20)
#define FED_HTTP_MAX_HEADER_BYTES (64 * 1024)   /* of one response's header block */
#define FED_HTTP_MAX_CONNECT_ADDRS 16
#define FED_HTTP_MAX_CA_BYTES (8 * 1024 * 1024) /* all CA files together */
#define FED_HTTP_POLL_MAX_MS 1000                /* the loop looks around at least this often */
#define FED_HTTP_HOST_GAUGES_MAX 256             /* distinct host labels; then host="other" */
#define FED_HTTP_WARNED_HOSTS_MAX 256            /* "verify off" hosts remembered as warned */
#define FED_HTTP_BODY_INITIAL_BYTES 4096
#define FED_HTTP_ERROR_BYTES 512
#define FED_HTTP_IP_BYTES 64

static const char *const OUTCOME_NAMES[] = {
    "ok", "timeout", "connect", "tls", "blocked", "too_large", "protocol", "cancelled", "internal",
};
#define FED_HTTP_N_OUTCOMES (sizeof(OUTCOME_NAMES) / sizeof(OUTCOME_NAMES[0]))

typedef struct fed_http_hdr {
    char *name, *value;
} fed_http_hdr;

typedef struct host_gauge {
    char *key;
    rt_metric *gauge;
} host_gauge;

struct fed_http_handle {
    fed_http *c;
    fed_http_handle *next, *prev; /* the submission queue, then the running list */

    /* The request, copied at submit. */
    char *method, *url, *host_key, *body, *content_type, *host_header;
    size_t body_len;
    char **headers;     /* NULL-terminated */
    char *resolve_line; /* "host:port:addr,addr" or NULL for an IP-literal URL */
    bool https;
    int64_t deadline_ms, max_body_bytes;
    bool verify_tls;
    int (*on_chunk)(void *arg, fed_http_handle *h, const char *data, size_t len);
    void (*on_done)(void *arg, const fed_http_result *res);
    void *arg;

    bool cancel_req; /* under c->mu */

    /* The I/O thread's. */
    CURL *easy;
    bool added;
    struct curl_slist *header_list, *resolve_list;
    char errbuf[CURL_ERROR_SIZE];
    int status;
    fed_http_hdr *hdrs;
    size_t n_hdrs, cap_hdrs, header_bytes;
    char *buf;
    size_t len, cap;
    int64_t received;
    bool too_large, chunk_refused, out_of_memory, blocked;
    char why[FED_HTTP_ERROR_BYTES]; /* what too_large/blocked refers to */
    rt_metric *host_gauge;
};

struct fed_http {
    int max_connections, max_per_host, queue_depth;
    const fed_iprange_list *blacklist, *whitelist;
    struct curl_blob ca_blob; /* .data NULL: the system's store */
    CURLM *multi;
    rt_metrics *metrics;

    pthread_t thread;
    bool started, stopped;

    pthread_mutex_t mu; /* the queue, stopping, cancel requests */
    fed_http_handle *q_head, *q_tail;
    int n_queued;
    bool stopping;
    int n_cancels;

    /* The I/O thread's. */
    fed_http_handle *r_head, *r_tail; /* running, ascending deadline */
    host_gauge hosts[FED_HTTP_HOST_GAUGES_MAX];
    int n_hosts;
    rt_metric *host_other;
    char *warned[FED_HTTP_WARNED_HOSTS_MAX];
    int n_warned;

    rt_metric *m_outcome[FED_HTTP_N_OUTCOMES];
    rt_metric *m_in_flight, *m_queued, *m_refused;
};

/* ---- the client ------------------------------------------------------------------------ */

/* The CA files as one PEM blob. -1 after logging which file failed. */
static int load_cas(fed_http *c, const char *const *files, size_t n)
{
    if (n == 0) return 0;
    char *blob = NULL;
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        FILE *f = fopen(files[i], "rb");
        if (!f) {
            rt_log(ATRIUM_LOG_ERROR, "core", "cannot read CA file %s: %s (federation.custom_ca_list)",
                   files[i], strerror(errno));
            goto fail;
        }
        char chunk[4096];
        size_t got, start = len;
        while ((got = fread(chunk, 1, sizeof(chunk), f)) > 0) {
            if (len + got + 2 > FED_HTTP_MAX_CA_BYTES) {
                fclose(f);
                rt_log(ATRIUM_LOG_ERROR, "core", "CA files are over %d bytes together (at %s)",
                       FED_HTTP_MAX_CA_BYTES, files[i]);
                goto fail;
            }
            char *nb = realloc(blob, len + got + 2);
            if (!nb) {
                fclose(f);
                goto fail;
            }
            blob = nb;
            memcpy(blob + len, chunk, got);
            len += got;
        }
        bool read_error = ferror(f);
        fclose(f);
        if (read_error || !blob || !memmem(blob + start, len - start, "-----BEGIN CERTIFICATE-----", 27)) {
            rt_log(ATRIUM_LOG_ERROR, "core",
                   "CA file %s holds no PEM certificate (federation.custom_ca_list)", files[i]);
            goto fail;
        }
        blob[len++] = '\n'; /* a file without a final newline must not glue to the next */
    }
    c->ca_blob.data = blob;
    c->ca_blob.len = len;
    c->ca_blob.flags = CURL_BLOB_NOCOPY;
    return 0;
fail:
    free(blob);
    return -1;
}

fed_http *fed_http_new(const fed_http_settings *s, rt_metrics *metrics)
{
    fed_http *c = calloc(1, sizeof(*c));
    if (!c) return NULL;
    c->max_connections = s->max_connections > 0 ? s->max_connections : FED_HTTP_DEFAULT_MAX_CONNECTIONS;
    c->max_per_host = s->max_connections_per_host > 0 ? s->max_connections_per_host
                                                      : FED_HTTP_DEFAULT_MAX_PER_HOST;
    c->queue_depth = s->queue_depth > 0 ? s->queue_depth : FED_HTTP_DEFAULT_QUEUE_DEPTH;
    if (c->queue_depth > FED_HTTP_MAX_QUEUE_DEPTH) c->queue_depth = FED_HTTP_MAX_QUEUE_DEPTH;
    c->blacklist = s->blacklist;
    c->whitelist = s->whitelist;
    c->metrics = metrics;
    pthread_mutex_init(&c->mu, NULL);
    if (load_cas(c, s->ca_files, s->n_ca_files) < 0) goto fail;

    c->multi = curl_multi_init();
    if (!c->multi ||
        curl_multi_setopt(c->multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)c->max_connections) ||
        curl_multi_setopt(c->multi, CURLMOPT_MAX_HOST_CONNECTIONS, (long)c->max_per_host) ||
        curl_multi_setopt(c->multi, CURLMOPT_MAXCONNECTS, (long)c->max_connections) ||
        curl_multi_setopt(c->multi, CURLMOPT_PIPELINING, CURLPIPE_MULTIPLEX)) {
        rt_log(ATRIUM_LOG_ERROR, "core", "the outbound HTTP client could not be set up (libcurl)");
        goto fail;
    }

    for (size_t i = 0; i < FED_HTTP_N_OUTCOMES; i++) {
        char labels[RT_METRIC_LABELS_MAX_BYTES];
        rt_metric_label(labels, sizeof(labels), "outcome", OUTCOME_NAMES[i]);
        c->m_outcome[i] = rt_metric_counter(metrics, "atrium_federation_outbound_requests_total",
                                            labels, "Outbound HTTP requests by how they ended");
    }
    c->m_in_flight = rt_metric_gauge(metrics, "atrium_federation_outbound_in_flight", NULL,
                                     "Outbound HTTP requests being performed");
    c->m_queued = rt_metric_gauge(metrics, "atrium_federation_outbound_queued", NULL,
                                  "Outbound HTTP requests submitted, not yet started");
    c->m_refused = rt_metric_counter(metrics, "atrium_federation_outbound_refused_total", NULL,
                                     "Outbound HTTP submissions refused (queue full or stopping)");
    c->host_other = rt_metric_gauge(metrics, "atrium_federation_outbound_host_in_flight",
                                    "host=\"other\"",
                                    "Outbound HTTP requests being performed, per destination");
    return c;
fail:
    if (c->multi) curl_multi_cleanup(c->multi);
    free(c->ca_blob.data);
    pthread_mutex_destroy(&c->mu);
    free(c);
    return NULL;
}

/* ---- request handles -------------------------------------------------------------------- */

static void headers_reset(fed_http_handle *h)
{
    for (size_t i = 0; i < h->n_hdrs; i++) {
        free(h->hdrs[i].name);
        free(h->hdrs[i].value);
    }
    h->n_hdrs = 0;
}

static void handle_free(fed_http_handle *h)
{
    if (!h) return;
    if (h->easy) curl_easy_cleanup(h->easy);
    curl_slist_free_all(h->header_list);
    curl_slist_free_all(h->resolve_list);
    headers_reset(h);
    free(h->hdrs);
    free(h->buf);
    if (h->headers)
        for (char **p = h->headers; *p; p++) free(*p);
    free(h->headers);
    free(h->method);
    free(h->url);
    free(h->host_key);
    free(h->body);
    free(h->content_type);
    free(h->host_header);
    free(h->resolve_line);
    free(h);
}

static bool has_crlf(const char *s)
{
    return s && strpbrk(s, "\r\n") != NULL;
}

/* An IP literal, IPv6 with or without brackets: its address text without brackets in
 * out (FED_HTTP_IP_BYTES), and whether it is IPv6. false when not an IP literal. */
static bool ip_literal(const char *s, char *out, bool *v6)
{
    size_t n = strlen(s);
    if (n >= FED_HTTP_IP_BYTES) return false;
    if (n >= 2 && s[0] == '[' && s[n - 1] == ']') {
        memcpy(out, s + 1, n - 2);
        out[n - 2] = '\0';
    } else {
        memcpy(out, s, n + 1);
    }
    unsigned char bin[16];
    if (inet_pton(AF_INET, out, bin) == 1 && s[0] != '[') {
        *v6 = false;
        return true;
    }
    if (inet_pton(AF_INET6, out, bin) == 1) {
        *v6 = true;
        return true;
    }
    return false;
}

/* Check the URL and build the CURLOPT_RESOLVE line. curl_url is a pure parser (no shared
 * state), so running it on the caller's thread keeps "everything curl on the I/O thread"
 * true where it matters: it is how curl itself will read the URL. */
static int prepare_target(fed_http_handle *h, const fed_http_req *req)
{
    CURLU *u = curl_url();
    if (!u) return ATRIUM_E_NOMEM;
    char *scheme = NULL, *host = NULL, *port = NULL;
    int rc = ATRIUM_E_INVAL;
    if (curl_url_set(u, CURLUPART_URL, req->url, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) != CURLUE_OK)
        goto out;
    if (strcmp(scheme, "https") != 0 && strcmp(scheme, "http") != 0) goto out;
    h->https = strcmp(scheme, "https") == 0;
    char lit[FED_HTTP_IP_BYTES];
    bool v6;
    bool literal = ip_literal(host, lit, &v6);
    h->host_key = strdup(req->host_key ? req->host_key : literal ? lit : host);
    if (!h->host_key) {
        rc = ATRIUM_E_NOMEM;
        goto out;
    }
    if (literal) { /* curl connects to the literal itself; connect_addrs do not apply */
        rc = 0;
        goto out;
    }
    size_t n = 0;
    while (req->connect_addrs && req->connect_addrs[n]) n++;
    if (n == 0 || n > FED_HTTP_MAX_CONNECT_ADDRS) goto out;
    size_t cap = strlen(host) + strlen(port) + 3 + n * (FED_HTTP_IP_BYTES + 3);
    char *line = malloc(cap);
    if (!line) {
        rc = ATRIUM_E_NOMEM;
        goto out;
    }
    size_t len = (size_t)snprintf(line, cap, "%s:%s:", host, port);
    for (size_t i = 0; i < n; i++) {
        if (!ip_literal(req->connect_addrs[i], lit, &v6)) {
            free(line);
            goto out;
        }
        len += (size_t)snprintf(line + len, cap - len, v6 ? "%s[%s]" : "%s%s", i ? "," : "", lit);
    }
    h->resolve_line = line;
    rc = 0;
out:
    curl_free(scheme);
    curl_free(host);
    curl_free(port);
    curl_url_cleanup(u);
    return rc;
}

static char *dup_or_null(const char *s, bool *oom)
{
    if (!s) return NULL;
    char *d = strdup(s);
    if (!d) *oom = true;
    return d;
}

/* A copy of the request, or NULL with *rc set. */
static fed_http_handle *handle_new(fed_http *c, const fed_http_req *req, int *rc)
{
    *rc = ATRIUM_E_INVAL;
    if (!req || !req->url || !req->method || !req->on_done || req->deadline_ms <= 0 ||
        req->max_body_bytes < 0 || (!req->body && req->body_len) ||
        has_crlf(req->host_header) || has_crlf(req->content_type))
        return NULL;
    static const char *const methods[] = {"GET", "POST", "PUT", "DELETE"};
    bool known = false;
    for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++)
        known = known || strcmp(req->method, methods[i]) == 0;
    if (!known) return NULL;
    size_t n_headers = 0;
    for (; req->headers && req->headers[n_headers]; n_headers++)
        if (has_crlf(req->headers[n_headers]) || !strchr(req->headers[n_headers], ':'))
            return NULL;

    *rc = ATRIUM_E_NOMEM;
    fed_http_handle *h = calloc(1, sizeof(*h));
    if (!h) return NULL;
    h->c = c;
    bool oom = false;
    h->method = dup_or_null(req->method, &oom);
    h->url = dup_or_null(req->url, &oom);
    h->content_type = dup_or_null(req->content_type, &oom);
    h->host_header = dup_or_null(req->host_header, &oom);
    h->headers = calloc(n_headers + 1, sizeof(char *));
    if (!h->headers) oom = true;
    for (size_t i = 0; !oom && i < n_headers; i++) h->headers[i] = dup_or_null(req->headers[i], &oom);
    if (req->body) {
        h->body = malloc(req->body_len + 1);
        if (h->body) {
            memcpy(h->body, req->body, req->body_len);
            h->body[req->body_len] = '\0';
        } else {
            oom = true;
        }
    }
    h->body_len = req->body_len;
    h->deadline_ms = req->deadline_ms;
    h->max_body_bytes = req->max_body_bytes;
    h->verify_tls = req->verify_tls;
    h->on_chunk = req->on_chunk;
    h->on_done = req->on_done;
    h->arg = req->arg;
    if (oom) {
        handle_free(h);
        return NULL;
    }
    *rc = prepare_target(h, req);
    if (*rc < 0) {
        handle_free(h);
        return NULL;
    }
    return h;
}

/* ---- submission (any thread) ------------------------------------------------------------ */

int fed_http_submit(fed_http *c, const fed_http_req *req, fed_http_handle **out)
{
    if (out) *out = NULL;
    int rc;
    fed_http_handle *h = handle_new(c, req, &rc);
    if (!h) return rc;
    if (out) *out = h; /* before it is queued: on_done may run before we return */
    pthread_mutex_lock(&c->mu);
    if (c->stopping || c->n_queued >= c->queue_depth) {
        rc = c->stopping ? ATRIUM_E_STOPPED : ATRIUM_E_LIMIT;
        pthread_mutex_unlock(&c->mu);
        rt_metric_add(c->m_refused, 1);
        if (out) *out = NULL;
        handle_free(h);
        return rc;
    }
    h->prev = c->q_tail;
    if (c->q_tail) c->q_tail->next = h;
    else c->q_head = h;
    c->q_tail = h;
    c->n_queued++;
    rt_metric_add(c->m_queued, 1);
    pthread_mutex_unlock(&c->mu);
    curl_multi_wakeup(c->multi);
    return 0;
}

void fed_http_cancel(fed_http *c, fed_http_handle *h)
{
    if (!h) return;
    pthread_mutex_lock(&c->mu);
    if (!h->cancel_req) {
        h->cancel_req = true;
        c->n_cancels++;
    }
    pthread_mutex_unlock(&c->mu);
    curl_multi_wakeup(c->multi);
}

/* ---- callbacks (I/O thread) ------------------------------------------------------------- */

static void refuse_too_large(fed_http_handle *h, const char *fmt, long long n)
{
    h->too_large = true;
    snprintf(h->why, sizeof(h->why), fmt, n, (long long)h->max_body_bytes);
}

static bool header_add(fed_http_handle *h, const char *name, size_t nlen, const char *value,
                       size_t vlen)
{
    if (h->n_hdrs == h->cap_hdrs) {
        size_t cap = h->cap_hdrs ? h->cap_hdrs * 2 : 16;
        fed_http_hdr *nh = realloc(h->hdrs, cap * sizeof(*nh));
        if (!nh) return false;
        h->hdrs = nh;
        h->cap_hdrs = cap;
    }
    char *n = strndup(name, nlen), *v = strndup(value, vlen);
    if (!n || !v) {
        free(n);
        free(v);
        return false;
    }
    h->hdrs[h->n_hdrs].name = n;
    h->hdrs[h->n_hdrs].value = v;
    h->n_hdrs++;
    return true;
}

/* Does this status carry a body whose Content-Length means what it says? */
static bool status_has_body(int status)
{
    return status >= 200 && status != 204 && status != 304;
}

static size_t on_header(char *data, size_t size, size_t nitems, void *ud)
{
    fed_http_handle *h = ud;
    size_t total = size * nitems, len = total;
    while (len && (data[len - 1] == '\n' || data[len - 1] == '\r')) len--;

    if (len >= 5 && memcmp(data, "HTTP/", 5) == 0) { /* a new response starts */
        headers_reset(h);
        h->header_bytes = 0;
        const char *p = memchr(data, ' ', len);
        h->status = 0;
        if (p)
            for (p++; p < data + len && *p >= '0' && *p <= '9'; p++)
                h->status = h->status * 10 + (*p - '0');
    }
    h->header_bytes += total;
    if (h->header_bytes > FED_HTTP_MAX_HEADER_BYTES) {
        h->too_large = true;
        snprintf(h->why, sizeof(h->why), "the response headers are over %d bytes",
                 FED_HTTP_MAX_HEADER_BYTES);
        return 0;
    }
    if (len == 0 || (len >= 5 && memcmp(data, "HTTP/", 5) == 0)) return total;

    if ((data[0] == ' ' || data[0] == '\t') && h->n_hdrs) { /* an obsolete folded line */
        fed_http_hdr *last = &h->hdrs[h->n_hdrs - 1];
        size_t old = strlen(last->value);
        char *nv = realloc(last->value, old + len + 1);
        if (!nv) goto oom;
        memcpy(nv + old, data, len);
        nv[old + len] = '\0';
        last->value = nv;
        return total;
    }
    const char *colon = memchr(data, ':', len);
    if (!colon) return total; /* not a header; curl decides whether that is fatal */
    const char *v = colon + 1, *end = data + len;
    while (v < end && (*v == ' ' || *v == '\t')) v++;
    while (end > v && (end[-1] == ' ' || end[-1] == '\t')) end--;
    if (!header_add(h, data, (size_t)(colon - data), v, (size_t)(end - v))) goto oom;

    if (status_has_body(h->status) && colon - data == 14 &&
        strncasecmp(data, "content-length", 14) == 0) {
        char num[32];
        size_t vl = (size_t)(end - v);
        if (vl < sizeof(num)) {
            memcpy(num, v, vl);
            num[vl] = '\0';
            char *e;
            errno = 0;
            long long declared = strtoll(num, &e, 10);
            if (e != num && *e == '\0' &&
                (errno == ERANGE || declared > h->max_body_bytes)) {
                refuse_too_large(h, "the response declares %lld bytes (the cap is %lld)",
                                 declared);
                return 0;
            }
        }
    }
    return total;
oom:
    h->out_of_memory = true;
    return 0;
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *ud)
{
    fed_http_handle *h = ud;
    size_t len = size * nmemb;
    if (len == 0) return 0;
    if ((int64_t)len > h->max_body_bytes - h->received) {
        refuse_too_large(h, "the response body passed %lld bytes (the cap is %lld)",
                         (long long)h->received + (long long)len);
        return 0;
    }
    h->received += (int64_t)len;
    if (h->on_chunk) {
        if (h->on_chunk(h->arg, h, data, len) != 0) {
            h->chunk_refused = true;
            return 0;
        }
        return len;
    }
    if (h->len + len + 1 > h->cap) {
        size_t cap = h->cap ? h->cap : FED_HTTP_BODY_INITIAL_BYTES;
        while (cap < h->len + len + 1) cap *= 2;
        char *nb = realloc(h->buf, cap);
        if (!nb) {
            h->out_of_memory = true;
            return 0;
        }
        h->buf = nb;
        h->cap = cap;
    }
    memcpy(h->buf + h->len, data, len);
    h->len += len;
    h->buf[h->len] = '\0';
    return len;
}

static void sockaddr_text(const struct sockaddr *sa, char *out, size_t n)
{
    const char *raw = (const char *)sa;
    sa_family_t family;
    memcpy(&family, raw + offsetof(struct sockaddr, sa_family), sizeof(family));
    unsigned char addr[16];
    if (family == AF_INET) memcpy(addr, raw + offsetof(struct sockaddr_in, sin_addr), 4);
    else if (family == AF_INET6) memcpy(addr, raw + offsetof(struct sockaddr_in6, sin6_addr), 16);
    if ((family != AF_INET && family != AF_INET6) || !inet_ntop(family, addr, out, (socklen_t)n))
        snprintf(out, n, "(address family %d)", (int)family);
}

/* The address rule, on the address actually being connected to. */
static curl_socket_t open_socket(void *ud, curlsocktype purpose, struct curl_sockaddr *a)
{
    fed_http_handle *h = ud;
    (void)purpose;
    if (!fed_iprange_allowed(h->c->blacklist, h->c->whitelist, &a->addr)) {
        char ip[FED_HTTP_IP_BYTES];
        sockaddr_text(&a->addr, ip, sizeof(ip));
        h->blocked = true;
        snprintf(h->why, sizeof(h->why),
                 "connecting to %s was refused: the address is in federation.ip_range_blacklist "
                 "and not in federation.ip_range_whitelist",
                 ip);
        return CURL_SOCKET_BAD;
    }
    return socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
}

/* ---- the I/O thread ---------------------------------------------------------------------- */

static rt_metric *host_gauge_for(fed_http *c, const char *key)
{
    for (int i = 0; i < c->n_hosts; i++)
        if (strcmp(c->hosts[i].key, key) == 0) return c->hosts[i].gauge;
    char labels[RT_METRIC_LABELS_MAX_BYTES];
    if (c->n_hosts == FED_HTTP_HOST_GAUGES_MAX ||
        rt_metric_label(labels, sizeof(labels), "host", key) < 0)
        return c->host_other;
    char *k = strdup(key);
    rt_metric *g = k ? rt_metric_gauge(c->metrics, "atrium_federation_outbound_host_in_flight",
                                       labels, NULL)
                     : NULL;
    if (!k || (!g && c->metrics)) {
        free(k);
        return c->host_other;
    }
    c->hosts[c->n_hosts].key = k;
    c->hosts[c->n_hosts].gauge = g;
    c->n_hosts++;
    return g;
}

static void warn_unverified(fed_http *c, const char *host)
{
    for (int i = 0; i < c->n_warned; i++)
        if (strcmp(c->warned[i], host) == 0) return;
    if (c->n_warned < FED_HTTP_WARNED_HOSTS_MAX) {
        char *k = strdup(host);
        if (k) c->warned[c->n_warned++] = k;
    }
    rt_log(ATRIUM_LOG_WARN, "core",
           "TLS certificates of %s are NOT verified: anyone on the path can impersonate it "
           "(a development setting; never in production)",
           host);
}

static void running_insert(fed_http *c, fed_http_handle *h)
{
    fed_http_handle *after = c->r_tail; /* deadlines mostly ascend: search from the tail */
    while (after && after->deadline_ms > h->deadline_ms) after = after->prev;
    h->prev = after;
    h->next = after ? after->next : c->r_head;
    if (h->next) h->next->prev = h;
    else c->r_tail = h;
    if (after) after->next = h;
    else c->r_head = h;
}

static void running_remove(fed_http *c, fed_http_handle *h)
{
    if (h->prev) h->prev->next = h->next;
    else c->r_head = h->next;
    if (h->next) h->next->prev = h->prev;
    else c->r_tail = h->prev;
    h->next = h->prev = NULL;
}

/* End a running request: the one place on_done is called (and the handle freed). */
static void finish(fed_http *c, fed_http_handle *h, int outcome, const char *error)
{
    fed_http_result res = {.outcome = outcome, .error = outcome == FED_HTTP_OK ? "" : error,
                           .connected_ip = "", .handle = h};
    char *ip = NULL;
    if (h->easy && curl_easy_getinfo(h->easy, CURLINFO_PRIMARY_IP, &ip) == CURLE_OK && ip)
        res.connected_ip = ip;
    if (outcome == FED_HTTP_OK) {
        long code = 0;
        curl_easy_getinfo(h->easy, CURLINFO_RESPONSE_CODE, &code);
        res.status = code ? (int)code : h->status;
        if (!h->on_chunk) {
            res.body = h->buf ? h->buf : "";
            res.body_len = h->len;
        }
    }
    if (h->added) {
        curl_multi_remove_handle(c->multi, h->easy);
        h->added = false;
    }
    running_remove(c, h);
    rt_metric_add(c->m_in_flight, -1);
    rt_metric_add(h->host_gauge, -1);
    rt_metric_add(c->m_outcome[-outcome], 1);
    h->on_done(h->arg, &res);
    /* A fed_http_cancel that took the lock while on_done ran is done with h after this. */
    pthread_mutex_lock(&c->mu);
    pthread_mutex_unlock(&c->mu);
    handle_free(h);
}

static void finish_curl(fed_http *c, fed_http_handle *h, CURLcode rc)
{
    if (rc == CURLE_OK) {
        finish(c, h, FED_HTTP_OK, "");
        return;
    }
    char msg[FED_HTTP_ERROR_BYTES + CURL_ERROR_SIZE];
    snprintf(msg, sizeof(msg), "%s%s%s", curl_easy_strerror(rc), h->errbuf[0] ? ": " : "",
             h->errbuf);
    int outcome;
    if (h->too_large) {
        finish(c, h, FED_HTTP_E_TOO_LARGE, h->why);
        return;
    } else if (h->chunk_refused) {
        finish(c, h, FED_HTTP_E_CANCELLED, "the body callback refused the rest of the body");
        return;
    } else if (h->out_of_memory) {
        finish(c, h, FED_HTTP_E_INTERNAL, "out of memory while reading the response");
        return;
    }
    switch (rc) {
    case CURLE_OPERATION_TIMEDOUT:
        outcome = FED_HTTP_E_TIMEOUT;
        break;
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
        if (h->blocked) {
            finish(c, h, FED_HTTP_E_BLOCKED, h->why);
            return;
        }
        outcome = FED_HTTP_E_CONNECT;
        break;
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_SSL_ENGINE_NOTFOUND:
    case CURLE_SSL_ENGINE_SETFAILED:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_ENGINE_INITFAILED:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_SHUTDOWN_FAILED:
    case CURLE_SSL_CRL_BADFILE:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_SSL_INVALIDCERTSTATUS:
    case CURLE_SSL_CLIENTCERT:
    case CURLE_USE_SSL_FAILED:
        outcome = FED_HTTP_E_TLS;
        break;
    case CURLE_FILESIZE_EXCEEDED:
        outcome = FED_HTTP_E_TOO_LARGE;
        break;
    case CURLE_OUT_OF_MEMORY:
    case CURLE_FAILED_INIT:
    case CURLE_BAD_FUNCTION_ARGUMENT:
    case CURLE_URL_MALFORMAT:
    case CURLE_NOT_BUILT_IN:
    case CURLE_UNKNOWN_OPTION:
    case CURLE_UNSUPPORTED_PROTOCOL:
        outcome = FED_HTTP_E_INTERNAL;
        break;
    default: /* GOT_NOTHING, RECV_ERROR, SEND_ERROR, PARTIAL_FILE, WEIRD_SERVER_REPLY, HTTP2 */
        outcome = FED_HTTP_E_PROTOCOL;
        break;
    }
    finish(c, h, outcome, msg);
}

static struct curl_slist *slist_add(struct curl_slist *l, const char *line, bool *ok)
{
    if (!*ok) return l;
    struct curl_slist *n = curl_slist_append(l, line);
    if (!n) {
        *ok = false;
        return l;
    }
    return n;
}

/* Build the easy handle. false when curl refused (the caller ends it E_INTERNAL). */
static bool setup_easy(fed_http *c, fed_http_handle *h)
{
    CURL *e = h->easy = curl_easy_init();
    if (!e) return false;
    bool ok = true;
    struct curl_slist *hl = NULL;
    char line[FED_HTTP_ERROR_BYTES];
    /* Expect: 100-continue would stall every larger body for a second. */
    hl = slist_add(hl, "Expect:", &ok);
    if (h->content_type) {
        snprintf(line, sizeof(line), "Content-Type: %s", h->content_type);
        hl = slist_add(hl, line, &ok);
    } else {
        hl = slist_add(hl, "Content-Type:", &ok); /* no form-encoded default for a body */
    }
    if (h->host_header) {
        size_t n = strlen(h->host_header) + 7;
        char *hh = malloc(n);
        if (hh) {
            snprintf(hh, n, "Host: %s", h->host_header);
            hl = slist_add(hl, hh, &ok);
            free(hh);
        } else {
            ok = false;
        }
    }
    for (char **p = h->headers; *p; p++) hl = slist_add(hl, *p, &ok);
    h->header_list = hl;
    if (h->resolve_line) h->resolve_list = slist_add(NULL, h->resolve_line, &ok);
    if (!ok) return false;

    int64_t left = h->deadline_ms - rt_now_ms();
    CURLcode r = CURLE_OK;
#define SET(opt, val)                                                                      \
    do {                                                                                   \
        if (r == CURLE_OK) r = curl_easy_setopt(e, opt, val);                              \
    } while (0)
    SET(CURLOPT_URL, h->url);
    SET(CURLOPT_PRIVATE, h);
    SET(CURLOPT_ERRORBUFFER, h->errbuf);
    SET(CURLOPT_NOSIGNAL, 1L);
    SET(CURLOPT_PROTOCOLS_STR, "https,http");
    SET(CURLOPT_FOLLOWLOCATION, 0L);
    SET(CURLOPT_PROXY, "");
    SET(CURLOPT_NOPROXY, "*");
    SET(CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_2TLS);
    SET(CURLOPT_PIPEWAIT, h->https ? 1L : 0L);
    SET(CURLOPT_TCP_KEEPALIVE, 1L);
    SET(CURLOPT_USERAGENT, "Atrium/" ATRIUM_VERSION);
    SET(CURLOPT_TIMEOUT_MS, (long)(left > 1 ? left : 1));
    SET(CURLOPT_HTTPHEADER, h->header_list);
    if (h->resolve_list) SET(CURLOPT_RESOLVE, h->resolve_list);
    SET(CURLOPT_OPENSOCKETFUNCTION, open_socket);
    SET(CURLOPT_OPENSOCKETDATA, h);
    SET(CURLOPT_HEADERFUNCTION, on_header);
    SET(CURLOPT_HEADERDATA, h);
    SET(CURLOPT_WRITEFUNCTION, on_body);
    SET(CURLOPT_WRITEDATA, h);
    SET(CURLOPT_SSL_VERIFYPEER, h->verify_tls ? 1L : 0L);
    SET(CURLOPT_SSL_VERIFYHOST, h->verify_tls ? 2L : 0L);
    if (c->ca_blob.data) {
        SET(CURLOPT_CAINFO, (char *)NULL);
        SET(CURLOPT_CAPATH, (char *)NULL);
        SET(CURLOPT_CAINFO_BLOB, &c->ca_blob);
    }
    if (strcmp(h->method, "GET") == 0) {
        SET(CURLOPT_HTTPGET, 1L);
    } else {
        if (strcmp(h->method, "POST") != 0) SET(CURLOPT_CUSTOMREQUEST, h->method);
        if (h->body || strcmp(h->method, "DELETE") != 0) {
            SET(CURLOPT_POSTFIELDS, h->body ? h->body : "");
            SET(CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)h->body_len);
        }
    }
#undef SET
    return r == CURLE_OK;
}

static void start_request(fed_http *c, fed_http_handle *h)
{
    h->next = h->prev = NULL;
    h->host_gauge = host_gauge_for(c, h->host_key);
    running_insert(c, h);
    rt_metric_add(c->m_in_flight, 1);
    rt_metric_add(h->host_gauge, 1);
    if (!h->verify_tls && h->https) warn_unverified(c, h->host_key);
    if (!setup_easy(c, h)) {
        finish(c, h, FED_HTTP_E_INTERNAL, "the transfer could not be set up (libcurl)");
        return;
    }
    CURLMcode mc = curl_multi_add_handle(c->multi, h->easy);
    if (mc != CURLM_OK) {
        finish(c, h, FED_HTTP_E_INTERNAL, curl_multi_strerror(mc));
        return;
    }
    h->added = true;
}

static void finish_cancelled(fed_http *c)
{
    /* Collect under the lock (cancel_req is written under it), finish outside it. */
    fed_http_handle *list = NULL;
    pthread_mutex_lock(&c->mu);
    for (fed_http_handle *h = c->r_head, *next; h; h = next) {
        next = h->next;
        if (!h->cancel_req) continue;
        running_remove(c, h);
        h->next = list;
        list = h;
    }
    pthread_mutex_unlock(&c->mu);
    while (list) {
        fed_http_handle *h = list;
        list = h->next;
        running_insert(c, h); /* finish unlinks it again */
        finish(c, h, FED_HTTP_E_CANCELLED, "cancelled by the caller");
    }
}

static void finish_expired(fed_http *c, int64_t now)
{
    while (c->r_head && c->r_head->deadline_ms <= now)
        finish(c, c->r_head, FED_HTTP_E_TIMEOUT, "the deadline passed before the answer was complete");
}

static void finish_done_transfers(fed_http *c)
{
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(c->multi, &left))) {
        if (m->msg != CURLMSG_DONE) continue;
        fed_http_handle *h = NULL;
        curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&h);
        RT_ASSERT(h != NULL, "a finished transfer without its handle");
        finish_curl(c, h, m->data.result);
    }
}

static void *io_main(void *arg)
{
    fed_http *c = arg;
    sigset_t pipe_sig;
    sigemptyset(&pipe_sig);
    sigaddset(&pipe_sig, SIGPIPE); /* a peer closing mid-write is an error code, not a signal */
    pthread_sigmask(SIG_BLOCK, &pipe_sig, NULL);
    for (;;) {
        pthread_mutex_lock(&c->mu);
        fed_http_handle *batch = c->q_head;
        int taken = c->n_queued;
        c->q_head = c->q_tail = NULL;
        c->n_queued = 0;
        bool stopping = c->stopping;
        int cancels = c->n_cancels;
        c->n_cancels = 0;
        pthread_mutex_unlock(&c->mu);
        rt_metric_add(c->m_queued, -taken);

        while (batch) {
            fed_http_handle *h = batch;
            batch = h->next;
            start_request(c, h);
        }
        if (stopping) break;
        if (cancels) finish_cancelled(c);
        int running = 0;
        curl_multi_perform(c->multi, &running);
        finish_done_transfers(c);
        int64_t now = rt_now_ms();
        finish_expired(c, now);

        int64_t wait = FED_HTTP_POLL_MAX_MS;
        if (c->r_head && c->r_head->deadline_ms - now < wait) wait = c->r_head->deadline_ms - now;
        if (wait < 0) wait = 0;
        CURLMcode mc = curl_multi_poll(c->multi, NULL, 0, (int)wait, NULL);
        if (mc != CURLM_OK) {
            rt_log(ATRIUM_LOG_ERROR, "core", "outbound HTTP client: curl_multi_poll: %s",
                   curl_multi_strerror(mc));
            struct timespec ts = {.tv_nsec = 10 * 1000 * 1000}; /* never spin */
            nanosleep(&ts, NULL);
        }
    }
    while (c->r_head) finish(c, c->r_head, FED_HTTP_E_CANCELLED, "the server is stopping");
    return NULL;
}

int fed_http_start(fed_http *c)
{
    if (c->started) return ATRIUM_E_STATE;
    if (pthread_create(&c->thread, NULL, io_main, c) != 0) {
        rt_log(ATRIUM_LOG_ERROR, "core", "cannot start the outbound HTTP client's thread: %s",
               strerror(errno));
        return ATRIUM_E_IO;
    }
    pthread_setname_np(c->thread, "fed-http-io");
    c->started = true;
    return 0;
}

void fed_http_stop(fed_http *c)
{
    if (!c || c->stopped) return;
    pthread_mutex_lock(&c->mu);
    c->stopping = true;
    pthread_mutex_unlock(&c->mu);
    c->stopped = true;
    if (c->started) {
        curl_multi_wakeup(c->multi);
        pthread_join(c->thread, NULL);
        return;
    }
    /* Never started: what was queued ends here, on the caller's thread. */
    pthread_mutex_lock(&c->mu);
    fed_http_handle *batch = c->q_head;
    int taken = c->n_queued;
    c->q_head = c->q_tail = NULL;
    c->n_queued = 0;
    pthread_mutex_unlock(&c->mu);
    rt_metric_add(c->m_queued, -taken);
    while (batch) {
        fed_http_handle *h = batch;
        batch = h->next;
        h->next = h->prev = NULL;
        h->host_gauge = host_gauge_for(c, h->host_key);
        running_insert(c, h);
        rt_metric_add(c->m_in_flight, 1);
        rt_metric_add(h->host_gauge, 1);
        finish(c, h, FED_HTTP_E_CANCELLED, "the server is stopping");
    }
}

void fed_http_free(fed_http *c)
{
    if (!c) return;
    fed_http_stop(c);
    curl_multi_cleanup(c->multi);
    for (int i = 0; i < c->n_hosts; i++) free(c->hosts[i].key);
    for (int i = 0; i < c->n_warned; i++) free(c->warned[i]);
    free(c->ca_blob.data);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* ---- inside callbacks --------------------------------------------------------------------- */

int fed_http_handle_status(fed_http_handle *h)
{
    return h ? h->status : 0;
}

const char *fed_http_handle_header(fed_http_handle *h, const char *name)
{
    if (!h || !name) return NULL;
    for (size_t i = h->n_hdrs; i-- > 0;)
        if (strcasecmp(h->hdrs[i].name, name) == 0) return h->hdrs[i].value;
    return NULL;
}
