/*
 * core/federation/transport/fed_http.c - the one outbound HTTP client (see fed_http.h for the
 * contract): a bounded submission queue, one I/O thread that owns the libcurl multi
 * handle and every easy handle, the connection caps, the deadlines, and the one place a
 * request ends. What one transfer is (its options and the callbacks that enforce the body
 * cap and the address rule) lives in fed_http_transfer.c.
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
 * Ending. finish() is the only caller of on_done: it takes the transfer out of the multi
 * handle and the running list, counts the outcome, calls back, then frees the handle. A
 * cancel only marks the handle under `mu` (the I/O thread ends it on its next turn), so
 * on_done runs on the I/O thread whoever cancels; only a client that never started ends
 * its queue on the thread that stops it.
 *
 * Deliberately not here: signing, server discovery, retries and backoff (fed_backoff.h):
 * a request is attempted once and its outcome reported.
 */
#include <curl/curl.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/federation/transport/fed_http.h"
#include "core/federation/transport/fed_http_transfer.h"

#define FED_HTTP_DEFAULT_MAX_CONNECTIONS 16
#define FED_HTTP_DEFAULT_MAX_PER_HOST 8
#define FED_HTTP_DEFAULT_QUEUE_DEPTH 1024
#define FED_HTTP_MAX_QUEUE_DEPTH (1 << 20)
#define FED_HTTP_MAX_CA_BYTES (8 * 1024 * 1024) /* all CA files together */
#define FED_HTTP_CA_READ_BYTES 4096
#define FED_HTTP_POLL_MAX_MS 1000     /* the loop looks around at least this often */
#define FED_HTTP_POLL_ERROR_PAUSE_MS 10 /* after a failed poll: never spin */
#define FED_HTTP_HOST_GAUGES_MAX 256  /* distinct host labels; then host="other" */
#define FED_HTTP_WARNED_HOSTS_MAX 256 /* "verify off" hosts remembered as warned */

static const char PEM_CERTIFICATE[] = "-----BEGIN CERTIFICATE-----";

static const char *const OUTCOME_NAMES[] = {
    "ok", "timeout", "connect", "tls", "blocked", "too_large", "protocol", "cancelled", "internal",
};
#define FED_HTTP_N_OUTCOMES (sizeof(OUTCOME_NAMES) / sizeof(OUTCOME_NAMES[0]))

typedef struct host_gauge {
    char *key;
    rt_metric *gauge;
} host_gauge;

struct fed_http {
    int max_connections, max_per_host, queue_depth;
    fed_http_rules rules;
    struct curl_blob ca_blob; /* .data NULL: the system's store (rules.ca_blob NULL) */
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
            rt_log(ATRIUM_LOG_ERROR, "core",
                   "cannot read CA file %s: %s (federation.custom_ca_list)", files[i],
                   strerror(errno));
            goto fail;
        }
        char chunk[FED_HTTP_CA_READ_BYTES];
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
        if (read_error || !blob ||
            !memmem(blob + start, len - start, PEM_CERTIFICATE, strlen(PEM_CERTIFICATE))) {
            rt_log(ATRIUM_LOG_ERROR, "core",
                   "CA file %s holds no PEM certificate (federation.custom_ca_list)", files[i]);
            goto fail;
        }
        blob[len++] = '\n'; /* a file without a final newline must not glue to the next */
    }
    c->ca_blob.data = blob;
    c->ca_blob.len = len;
    c->ca_blob.flags = CURL_BLOB_NOCOPY;
    c->rules.ca_blob = &c->ca_blob;
    return 0;
fail:
    free(blob);
    return -1;
}

fed_http *fed_http_new(const fed_http_settings *s, rt_metrics *metrics)
{
    fed_http *c = calloc(1, sizeof(*c));
    if (!c) return NULL;
    c->max_connections =
        s->max_connections > 0 ? s->max_connections : FED_HTTP_DEFAULT_MAX_CONNECTIONS;
    c->max_per_host = s->max_connections_per_host > 0 ? s->max_connections_per_host
                                                      : FED_HTTP_DEFAULT_MAX_PER_HOST;
    c->queue_depth = s->queue_depth > 0 ? s->queue_depth : FED_HTTP_DEFAULT_QUEUE_DEPTH;
    if (c->queue_depth > FED_HTTP_MAX_QUEUE_DEPTH) c->queue_depth = FED_HTTP_MAX_QUEUE_DEPTH;
    c->rules.blacklist = s->blacklist;
    c->rules.whitelist = s->whitelist;
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

/* ---- submission (any thread) ------------------------------------------------------------ */

int fed_http_submit(fed_http *c, const fed_http_req *req, fed_http_handle **out)
{
    if (out) *out = NULL;
    int rc;
    fed_http_handle *h = fed_http_handle_new(req, &rc);
    if (!h) return rc;
    if (out) *out = h; /* before it is queued: on_done may run before we return */
    pthread_mutex_lock(&c->mu);
    if (c->stopping || c->n_queued >= c->queue_depth) {
        rc = c->stopping ? ATRIUM_E_STOPPED : ATRIUM_E_LIMIT;
        pthread_mutex_unlock(&c->mu);
        rt_metric_add(c->m_refused, 1);
        if (out) *out = NULL;
        fed_http_handle_free(h);
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
    fed_http_handle_free(h);
}

static void finish_curl(fed_http *c, fed_http_handle *h, CURLcode rc)
{
    char msg[FED_HTTP_ERROR_BYTES + CURL_ERROR_SIZE];
    int outcome = fed_http_transfer_outcome(h, rc, msg, sizeof(msg));
    finish(c, h, outcome, msg);
}

static void start_request(fed_http *c, fed_http_handle *h)
{
    h->next = h->prev = NULL;
    h->host_gauge = host_gauge_for(c, h->host_key);
    running_insert(c, h);
    rt_metric_add(c->m_in_flight, 1);
    rt_metric_add(h->host_gauge, 1);
    if (!h->verify_tls && h->https) warn_unverified(c, h->host_key);
    if (!fed_http_transfer_setup(h, &c->rules)) {
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
        finish(c, c->r_head, FED_HTTP_E_TIMEOUT,
               "the deadline passed before the answer was complete");
}

static void finish_done_transfers(fed_http *c)
{
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(c->multi, &left))) {
        if (m->msg != CURLMSG_DONE) continue;
        char *priv = NULL;
        curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, &priv);
        fed_http_handle *h = (fed_http_handle *)priv;
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
            struct timespec ts = {.tv_nsec = FED_HTTP_POLL_ERROR_PAUSE_MS * 1000000L};
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
