/*
 * core/http/server.c - the libmicrohttpd listener: its request pool, the access handler
 * that routes, reads bodies, runs handlers and queues responses, and the request-completed
 * callback where holds are released.
 *
 * Decisions owned here (docs/architecture.md, 'A request's journey', and
 * docs/adr/0001-request-threads-never-block.md): the request pool is one libmicrohttpd
 * daemon per thread (server.http.request_threads, epoll), fed by the gate (gate.c), which
 * owns the client listening socket, enforces the header deadline and answers bad framing;
 * every connection has an inactivity timeout; the connection limit is derived from
 * RLIMIT_NOFILE minus what PostgreSQL, outbound sockets and files need, and shared out
 * between the gate, requests that wait and a reserve for cheap ones - past it connections
 * wait in the kernel's accept queue, never refused (gate.c,
 * docs/adr/0025-queue-past-the-connection-limit.md); /health and /metrics may also have a
 * listener of their own with its own connections (server.ops, start_ops); paths reach the
 * router still percent-encoded; every refusal known from the headers is answered before
 * the body, one decided mid-body is written to the socket at once (answer_mid_body);
 * responses are queued only on the connection's own thread (a pool worker stores its
 * response and resumes); shutdown resumes every suspended connection before
 * MHD_stop_daemon. The connection's inactivity timeout follows what it does (set_phase):
 * a client that stops sending its body, or stops reading its response, is cut well before
 * the idle timeout, one that is slow but steady is not; and a request's handoff deadline
 * counts from the end of its body, so a long upload is never refused for the time its
 * bytes took to arrive. A file response goes out corked (cork_file_response), so its
 * headers share the first packet with its bytes.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "atrium/parse.h"
#include "core/http/http.h"

/* libmicrohttpd's memory per connection: the request's head (in a read buffer of half of
 * it at first, grown within it), its parsed headers (from the pool's end, about 56 bytes
 * each) and the response's head. One and a half HTTP_MAX_HEAD_BYTES holds a head at that
 * limit with HTTP_MAX_HEADERS headers, kept-alive requests included (test_bad_input).
 * Kept small on purpose: libmicrohttpd 0.9.75 zeroes the whole pool before each request
 * of a connection, and at 64 KiB that was the largest single cost of serving a cached
 * 100 KB file; and a parked long-poll keeps its pool, whose untouched pages between the
 * head and the header list are resident when malloc reuses memory freed by handlers: 8.0
 * KiB per parked /sync at 24 KiB against 9.0 at 32 KiB (docs/performance.md, 'Parked
 * long-polls'). Under 32 KiB libmicrohttpd takes it from malloc, not mmap. */
#define CONNECTION_MEMORY_LIMIT_BYTES (HTTP_MAX_HEAD_BYTES + HTTP_MAX_HEAD_BYTES / 2) /* 24 KiB */
#define OUTBOUND_SOCKET_RESERVE 16 /* the coming federation client's connection cap */
#define DRAIN_POLL_MS 20
#define FED_CONNECTION_SHARE 4 /* the federation listener gets 1/4 of the connections */
#define FED_MIN_CONNECTIONS 8
#define WIRE_ERROR_MAX_BYTES 2048 /* an error written straight to the socket */
#define WORKER_LIMIT_SLACK 3 /* libmicrohttpd's limit per worker, times the gate's share (cheap requests may use twice the share) */
#define GATE_SHARE 4              /* 1/4 of the client connections may be sending headers */
#define GATE_MIN_PENDING 8
#define CHEAP_RESERVE_SHARE 8     /* 1/8 of the served connections is never held by waiters */
#define CHEAP_RESERVE_MIN 4
#define OPS_IDLE_TIMEOUT_S 5      /* the operational listener: a connection idle this long goes */
#define OPS_OWN_FDS 3             /* its listening socket, epoll set and wake-up descriptor */

static atomic_int open_connections;
static atomic_int inflight_requests; /* received and not yet completed */

/* Keep the raw path: the router splits it before decoding. Query values are decoded
 * when the request copies them. */
static size_t no_unescape(void *cls, struct MHD_Connection *c, char *s)
{
    (void)cls;
    (void)c;
    return strlen(s);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof(line), fmt, ap);
    size_t n = strlen(line);
    while (n && line[n - 1] == '\n') line[--n] = '\0';
    /* Our own MHD_NO after answer_mid_body, and what a client's bad framing makes it say,
     * are the client's doing, not the operator's business: debug only. */
    bool client_caused = strstr(line, "Application reported internal error") ||
                         strstr(line, "Closing connection") || strstr(line, "Error processing request");
    rt_log(client_caused ? ATRIUM_LOG_DEBUG : ATRIUM_LOG_WARN, "http", "libmicrohttpd: %s", line);
}

/* The connection's inactivity timeout for what it does now (libmicrohttpd closes it after
 * that long without a byte either way), one rule per phase:
 *   - a request body arriving: server.http.body_idle_timeout_s;
 *   - a response being sent: server.http.send_stall_timeout_s, so a client that stops
 *     reading loses what its request holds (a delivery slot) long before the idle timeout;
 *   - otherwise (between requests): server.http.connection_timeout_s (on the operational
 *     listener OPS_IDLE_TIMEOUT_S: its few connections are not held by idle ones).
 * The header deadline is the gate's (gate.c). On the connection's own thread only. */
enum conn_phase { PHASE_IDLE, PHASE_BODY, PHASE_SENDING };

static void set_phase(const atrium_req *r, struct MHD_Connection *c, enum conn_phase phase)
{
    const struct core_config *cfg = r->srv->cfg;
    int idle_s = r->listener == HTTP_LISTENER_OPS ? OPS_IDLE_TIMEOUT_S
                                                  : cfg->http.connection_timeout_s;
    int secs = phase == PHASE_BODY      ? cfg->http.body_idle_timeout_s
               : phase == PHASE_SENDING ? cfg->http.send_stall_timeout_s
                                        : idle_s;
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)secs);
}

/* A file response (sendfile) on the client listener is sent with TCP_CORK set from before
 * its headers until the request completes (uncork_response, from on_completed), as nginx's
 * tcp_nopush does: libmicrohttpd 0.9.75 pushes the headers of a file response as a packet
 * of their own (it pushes only the last piece of a response it holds in memory), which
 * costs the client a wake-up and a read, and both sides a packet, per request. Corked, the
 * headers leave in the first full segment of the file and the tail when the cork is
 * removed. Where libmicrohttpd sets TCP_NODELAY or uncorks itself (the first response on
 * a connection, the last chunk of a large file), it merely pushes early: never later than
 * without the cork. A HEAD or any other response is sent as before. */
static void cork_file_response(atrium_req *r)
{
    if (!r->response_file || r->sock_fd < 0 || r->listener != HTTP_LISTENER_CLIENT ||
        strcmp(r->method, "GET") != 0)
        return;
    int on = 1;
    r->corked = setsockopt(r->sock_fd, IPPROTO_TCP, TCP_CORK, &on, sizeof(on)) == 0;
}

/* The end of a corked response (sent, or the connection is closing: libmicrohttpd closes
 * the socket only after this callback, so sock_fd is still this connection's). */
static void uncork_response(atrium_req *r)
{
    if (!r->corked) return;
    r->corked = false;
    int off = 0; /* fails only on a connection already gone: nothing is left to push */
    (void)setsockopt(r->sock_fd, IPPROTO_TCP, TCP_CORK, &off, sizeof(off));
}

static enum MHD_Result queue(atrium_req *r, int status, struct MHD_Response *resp)
{
    if (!resp) resp = http_error_response(500, "M_UNKNOWN", "Internal server error", 0);
    if (!resp) return MHD_NO;
    http_add_cors(resp); /* the one place every response gets its CORS headers */
    http_req_answered(r); /* answer holds go before the first byte can reach the client */
    enum MHD_Result rc = http_mhd_queue_response(r->conn, (unsigned)status, resp);
    if (rc == MHD_YES) set_phase(r, r->conn, PHASE_SENDING);
    MHD_destroy_response(resp);
    http_count_status(r->srv, status);
    r->in_dispatch_done = true;
    return rc;
}

static enum MHD_Result queue_own(atrium_req *r)
{
    http_finalize_response(r);
    cork_file_response(r);
    struct MHD_Response *resp = r->response;
    r->response = NULL;
    return queue(r, r->status, resp);
}

/* Run the handler on this request-pool thread and act on its outcome. */
static enum MHD_Result dispatch(atrium_req *r)
{
    int rc = http_req_run(r);
    if (rc == ATRIUM_PARKED || rc == ATRIUM_HANDED_OFF) return MHD_YES; /* not ours now */
    if (rc < 0) {
        bool stopping = atomic_load(&r->srv->stopping);
        if (rc != ATRIUM_E_STOPPED && rc != ATRIUM_E_LIMIT && !stopping)
            rt_log(ATRIUM_LOG_ERROR, "core", "[req %s] %s %s: handler failed (%d)", r->id,
                   r->method, r->path, rc);
        if (rc == ATRIUM_E_STOPPED || stopping)
            http_respond_error(r, 503, "M_UNKNOWN", "The server is stopping");
        else if (rc == ATRIUM_E_DB)
            http_respond_error(r, 503, "M_UNKNOWN", "The database is unavailable; retry");
        else if (rc == ATRIUM_E_LIMIT) /* e.g. no room left to wait (susp_room_to_wait) */
            http_respond_limited(r, 1000, "The server is busy; retry shortly");
        else
            http_respond_error(r, 500, "M_UNKNOWN", "Internal server error");
    } else if (!r->response) {
        rt_log(ATRIUM_LOG_ERROR, "core", "[req %s] %s %s: handler set no response", r->id,
               r->method, r->path);
        http_respond_error(r, 500, "M_UNKNOWN", "Internal server error");
    }
    return queue_own(r);
}

static int call_body_chunk(atrium_req *r, const char *data, size_t size);

/* dispatch, counted as a busy thread of its worker (the gate gives new connections to
 * workers whose thread is not inside a handler). */
static enum MHD_Result dispatch_on(http_listener *l, atrium_req *r)
{
    atomic_fetch_add(&l->busy, 1);
    enum MHD_Result rc = dispatch(r);
    atomic_fetch_sub(&l->busy, 1);
    return rc;
}

/* Does the request announce a body (a Content-Length above 0, or any Transfer-Encoding)? */
static bool announces_body(atrium_req *r)
{
    const char *cl = http_req_header(r, "Content-Length");
    return http_req_header(r, "Transfer-Encoding") || (cl && strcmp(cl, "0") != 0);
}

/* The head limits and framing rules (framing.c) for every request libmicrohttpd parsed:
 * later requests on a kept-alive connection and the federation listener never passed the
 * gate. (The raw path leaves out the query string, so the byte count is a little low.) What
 * libmicrohttpd refuses itself (a Content-Length that is no number, say) never gets here:
 * its answer is made a Matrix error in mhd_answers.c. Returns true after answering. */
static bool refuse_framing(atrium_req *r)
{
    size_t head_bytes = strlen(r->method) + strlen(r->raw_path) + 12; /* "M P HTTP/1.1\r\n" */
    for (size_t i = 0; i < r->n_headers; i++)
        head_bytes += strlen(r->headers[i].name) + strlen(r->headers[i].value) + 4;
    const char *errcode, *msg;
    int over = http_head_limits(head_bytes, r->n_headers, r->n_args, &errcode, &msg);
    if (over) {
        http_respond_error(r, over, errcode, "%s", msg);
        return true;
    }
    http_framing f = {0};
    for (size_t i = 0; i < r->n_headers && !f.status; i++)
        http_framing_header(&f, r->headers[i].name, strlen(r->headers[i].name),
                            r->headers[i].value, strlen(r->headers[i].value));
    int status = http_framing_end(&f);
    if (status) http_respond_error(r, status, f.errcode, "%s", f.msg);
    return status != 0;
}

/* First call for a request: route it and decide whether it is answered before its body
 * (true: answer now, MHD closes the connection after without reading the body). Every
 * refusal known from the headers alone is sent before the body when one is announced:
 * a client is never made to upload what will be refused. */
static bool prepare_route(atrium_req *r);

static bool prepare(atrium_req *r)
{
    bool answered = prepare_route(r);
    if (!answered && r->response && announces_body(r)) answered = true;
    if (answered) http_respond_header(r, "Connection", "close");
    return answered;
}

/* Route r and apply the checks that need only its headers. true: answered now. */
static bool prepare_route(atrium_req *r)
{
    http_server *s = r->srv;
    rt_metric_add(s->m_requests, 1);
    if (atomic_load(&s->draining)) {
        http_respond_error(r, 503, "M_UNKNOWN", "The server is stopping");
        return true;
    }
    if (refuse_framing(r)) return true;
    if (strcmp(r->method, "OPTIONS") == 0) {
        http_respond_json(r, 200, json_object()); /* CORS preflight: headers do the work */
        return false;
    }
    /* Each listener serves its own paths only (a client probing federation paths on the
     * client port, or anything but federation on the federation port, learns nothing). */
    bool federation_path = http_path_is_federation(r->raw_path);
    if ((r->listener == HTTP_LISTENER_OPS && !http_path_is_operational(r->raw_path)) ||
        (r->listener != HTTP_LISTENER_OPS &&
         federation_path != (r->listener == HTTP_LISTENER_FEDERATION) &&
         !http_path_on_both_listeners(r->raw_path))) {
        http_respond_error(r, 404, "M_UNRECOGNIZED", "Unrecognized request");
        return false;
    }
    bool wrong_method = false;
    const char *invalid = NULL;
    r->route = router_match(s->router, r->method, r->raw_path, r->arena, &r->param_names,
                            &r->param_values, &r->n_params, &wrong_method, &invalid);
    /* An unknown federation path is answered 404 only after its signature was checked. */
    if (!r->route && federation_path && s->fed_fallback.route.handler &&
        strncmp(r->raw_path, "/_matrix/federation/", 20) == 0)
        r->route = &s->fed_fallback;
    if (!r->route) {
        if (wrong_method)
            http_respond_error(r, 405, "M_UNRECOGNIZED", "Method %s not allowed on this path",
                               r->method);
        else
            http_respond_error(r, 404, "M_UNRECOGNIZED", "Unrecognized request");
        return false;
    }
    /* Path and query values reach handlers (and PostgreSQL) as UTF-8 text only. */
    if (invalid || r->invalid_arg) {
        http_respond_error(r, 400, "M_INVALID_PARAM", "The %s '%s' is not UTF-8 text",
                           invalid ? "path parameter" : "query parameter",
                           invalid ? invalid : r->invalid_arg);
        return false;
    }
    r->max_body = r->route->route.max_body_bytes > 0 ? r->route->route.max_body_bytes
                                                     : s->cfg->http.max_json_body_bytes;
    /* libmicrohttpd accepted the value as a number below 2^64; past the route's limit (or
     * past int64) it is answered before any byte of the body. */
    const char *cl = http_req_header(r, "Content-Length");
    int64_t declared = 0;
    if (cl && atrium_parse_int64(cl, 0, r->max_body, &declared) != 0) {
        http_respond_error(r, 413, "M_TOO_LARGE", "The request body is larger than %lld bytes",
                           (long long)r->max_body);
        r->body_too_large = true;
    }
    if (r->body_too_large) return true;
    /* ATRIUM_ROUTE_HEADERS_FIRST: the plugin sees the headers before any of the body and
     * may refuse now, so a stranger's upload is answered before it is sent. */
    const atrium_route *route = &r->route->route;
    if ((route->flags & ATRIUM_ROUTE_HEADERS_FIRST) && route->body_chunk) {
        int rc = call_body_chunk(r, NULL, 0);
        if (rc < 0) {
            r->body_failed = true;
            if (!r->response) http_respond_error(r, 400, "M_UNKNOWN", "The request was refused");
            return true; /* prepare adds Connection: close */
        }
    }
    return false;
}

/* One body_chunk call, inside the request's scopes; park, handoff and the like refuse
 * while it runs (the request is not a handler's yet). */
static int call_body_chunk(atrium_req *r, const char *data, size_t size)
{
    RT_SCOPE(ATRIUM_SCOPE_REQUEST, r);
    RT_SCOPE(ATRIUM_SCOPE_REQUEST_ID, r->id);
    r->in_body_chunk = true;
    int rc = r->route->route.body_chunk(r, data, size);
    r->in_body_chunk = false;
    return rc;
}

/* An answer decided while the body is still arriving (413 past the limit, a body_chunk
 * refusal): libmicrohttpd queues responses only before the body or after all of it, and
 * reading the rest (hundreds of megabytes, maybe) just to refuse it is what a client must
 * not be able to make us do. So the error goes straight to the connection
 * (http_answer_now: the socket, or its TLS session) - the connection's own thread is the
 * only writer, and nothing of a response was written yet - and returning MHD_NO closes
 * the connection. */
static enum MHD_Result answer_mid_body(atrium_req *r)
{
    char wire[WIRE_ERROR_MAX_BYTES];
    size_t n = http_error_wire(r, 0, NULL, NULL, wire, sizeof(wire));
    if (n == 0) /* an error response without recorded JSON: say what it was */
        n = http_error_wire(r, r->status >= 400 ? r->status : 400, "M_UNKNOWN",
                            http_reason_phrase(r->status >= 400 ? r->status : 400), wire,
                            sizeof(wire));
    if (n > 0 && http_answer_now(r->conn, wire, n)) http_count_status(r->srv, r->status);
    rt_log(ATRIUM_LOG_DEBUG, "core", "[req %s] answered %d before the end of its body; closing",
           r->id, r->status);
    r->in_dispatch_done = true;
    return MHD_NO;
}

/* Take one piece of the body. Returns true when the request has been refused (the caller
 * answers at once with answer_mid_body). */
static bool take_body(atrium_req *r, const char *data, size_t size)
{
    if (r->response || r->body_failed) return r->response != NULL; /* already refused */
    const atrium_route *route = &r->route->route;
    if ((int64_t)(r->body_len + size) > r->max_body) {
        r->body_too_large = true;
        http_respond_error(r, 413, "M_TOO_LARGE", "The request body is larger than %lld bytes",
                           (long long)r->max_body);
        return true;
    }
    if (route->flags & ATRIUM_ROUTE_STREAM_BODY) {
        r->body_len += size;
        int rc = route->body_chunk ? call_body_chunk(r, data, size) : 0;
        if (rc < 0) {
            r->body_failed = true;
            if (!r->response) http_respond_error(r, 400, "M_UNKNOWN", "The body was refused");
            return true;
        }
        return false;
    }
    if (r->body_len + size + 1 > r->body_cap) {
        size_t cap = r->body_cap ? r->body_cap : 4096;
        while (cap < r->body_len + size + 1) cap *= 2;
        char *n = realloc(r->body, cap);
        if (!n) {
            r->body_failed = true;
            http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
            return true;
        }
        r->body = n;
        r->body_cap = cap;
    }
    memcpy(r->body + r->body_len, data, size);
    r->body_len += size;
    r->body[r->body_len] = '\0';
    return false;
}

/* The first request of a connection the gate handed to client worker l has reached it:
 * l's backlog shrinks (http_listener.unstarted). The connection's socket context is a flag
 * set in on_connection, so later requests on a kept-alive connection do not count. */
static void first_request_started(http_listener *l, struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    bool *started = info ? info->socket_context : NULL;
    if (!started || *started) return;
    *started = true;
    atomic_fetch_sub(&l->unstarted, 1);
    http_gate_poke(l->srv);
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *c, const char *url,
                                 const char *method, const char *version,
                                 const char *upload_data, size_t *upload_data_size,
                                 void **con_cls)
{
    (void)version;
    http_listener *listener = cls;
    http_server *s = listener->srv;
    atrium_req *r = *con_cls;
    if (!r) {
        if (listener->parent) first_request_started(listener, c);
        r = http_req_new(s, c, method, url, listener->kind);
        if (!r) return MHD_NO;
        if (listener->parent) r->worker = listener;
        *con_cls = r;
        atomic_fetch_add(&inflight_requests, 1);
        /* Refused before its body: answer now; MHD closes the connection after. */
        if (prepare(r)) return queue_own(r);
        if (announces_body(r)) set_phase(r, c, PHASE_BODY);
        return MHD_YES;
    }
    if (*upload_data_size) {
        if (r->in_dispatch_done) return MHD_NO; /* answered mid-body: never read on */
        bool refused = take_body(r, upload_data, *upload_data_size);
        *upload_data_size = 0;
        return refused ? answer_mid_body(r) : MHD_YES;
    }
    if (r->in_dispatch_done) return MHD_YES;

    pthread_mutex_lock(&r->mu);
    int state = r->susp;
    int action = r->action, reason = r->resume_reason, status = r->resume_status;
    struct MHD_Response *resp = r->resume_response;
    if (state == SUSP_RESUMING) {
        r->susp = SUSP_ACTIVE;
        r->susp_kind = SUSP_NONE;
        r->action = ACT_NONE;
        r->resume_response = NULL;
    }
    pthread_mutex_unlock(&r->mu);

    if (state == SUSP_RESUMING) {
        http_resume_done(r); /* its place in the worker's woken runs: the next one's */
        if (action == ACT_RESPOND) return queue(r, status, resp);
        r->run_reason = reason;
        return dispatch_on(listener, r);
    }
    if (r->response) return queue_own(r); /* answered before running (404, 405, 413, ...) */
    if (r->runs > 0) {
        /* The handler said it parked or handed off but did not: a plugin bug. */
        rt_log(ATRIUM_LOG_ERROR, "core", "[req %s] handler returned a wait without waiting",
               r->id);
        http_respond_error(r, 500, "M_UNKNOWN", "Internal server error");
        return queue_own(r);
    }
    /* The whole request is here: the connection is idle-timed as any other again, and the
     * deadline counts from now. */
    if (announces_body(r)) set_phase(r, c, PHASE_IDLE);
    r->deadline_ms = rt_now_ms() + s->cfg->http.handoff_deadline_ms;
    r->run_reason = ATRIUM_RUN_FIRST;
    return dispatch_on(listener, r);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    atrium_req *r = *con_cls;
    if (!r) return;
    *con_cls = NULL;
    http_resume_done(r); /* resumed from a line, then closed before it ran */
    set_phase(r, c, PHASE_IDLE); /* kept alive: waiting for the next request */
    uncork_response(r);
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
        rt_log(ATRIUM_LOG_DEBUG, "core", "[req %s] ended early (%d)", r->id, (int)toe);
    susp_request_done(r);
    http_req_release_holds(r);
    http_req_unref(r);
    atomic_fetch_sub(&inflight_requests, 1);
}

void http_listener_count(http_listener *l, int d)
{
    atomic_fetch_add(&l->open_connections, d);
    if (l->parent) atomic_fetch_add(&l->parent->open_connections, d);
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    http_server *s = ((http_listener *)cls)->srv;
    (void)c;
    int d = toe == MHD_CONNECTION_NOTIFY_STARTED ? 1 : -1;
    http_listener *l = cls;
    if (l->parent && d > 0) { /* counted unstarted by the gate (admit) until its first request */
        *socket_context = calloc(1, sizeof(bool));
        if (!*socket_context) atomic_fetch_sub(&l->unstarted, 1);
    } else if (l->parent) { /* closed: unstarted still if it never sent a request */
        bool *started = *socket_context;
        if (started && !*started) {
            atomic_fetch_sub(&l->unstarted, 1);
            http_gate_poke(s);
        }
        free(started);
        *socket_context = NULL;
    }
    atomic_fetch_add(&open_connections, d);
    /* A client worker's connections were counted by the gate when it handed them over
     * (http_gate_count): a burst is spread before any has started. */
    if (!l->parent || d < 0) http_listener_count(l, d);
    rt_metric_add(s->m_connections, d);
}

http_server *http_server_new(const struct core_config *cfg, rt_metrics *metrics)
{
    http_server *s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    s->cfg = cfg;
    s->metrics = metrics;
    s->gate_poke_fd = -1;
    atomic_init(&s->gate_ready, 0);
    s->router = router_new();
    pthread_mutex_init(&s->events_mu, NULL);
    s->ratelimit_enabled = cfg->ratelimit.enabled;
    for (int k = HTTP_LISTENER_CLIENT; k < HTTP_LISTENER_KINDS; k++) {
        s->listeners[k].srv = s;
        s->listeners[k].kind = k;
        atomic_init(&s->listeners[k].open_connections, 0);
    }
    int outbound_cap = cfg->http.request_threads / 2;
    if (outbound_cap < 1) outbound_cap = 1;
    s->outbound = rt_budget_new("outbound", outbound_cap, 1, metrics);
    s->m_requests = rt_metric_counter(metrics, "atrium_http_requests_total", NULL,
                                      "Requests received");
    s->m_connections = rt_metric_gauge(metrics, "atrium_http_connections", NULL,
                                       "Open client connections");
    s->m_parked = rt_metric_gauge(metrics, "atrium_http_parked", NULL,
                                  "Requests parked (waiting for an event or a line slot)");
    s->m_handed_off = rt_metric_gauge(metrics, "atrium_http_handed_off", NULL,
                                      "Requests handed off to a pool and not yet answered");
    s->m_holds = rt_metric_gauge(metrics, "atrium_http_holds", NULL,
                                 "Holds attached to requests and not yet released");
    s->m_handoff_expired = rt_metric_counter(metrics, "atrium_http_handoff_expired_total", NULL,
                                             "Handed-off requests answered by their deadline");
    s->m_handoff_client_gone = rt_metric_counter(
        metrics, "atrium_http_handoff_client_gone_total", NULL,
        "Handed-off requests dropped because the client had gone");
    s->m_handoff_cancelled = rt_metric_counter(metrics, "atrium_http_handoff_cancelled_total",
                                               NULL, "Handed-off requests whose pool stopped");
    s->m_streams_waiting = rt_metric_gauge(
        metrics, "atrium_http_streams_waiting", NULL,
        "Responses being sent that wait, suspended, for their next bytes (respond_stream_wait)");
    s->m_streams_cut = rt_metric_counter(
        metrics, "atrium_http_streams_cut_total", NULL,
        "Waiting responses cut before their end by their deadline or shutdown");
    s->m_resumes_waiting = rt_metric_gauge(
        metrics, "atrium_http_resumes_waiting", NULL,
        "Woken requests waiting in a worker's resume line to run again (resume_line.c)");
    static const char *const classes[] = {NULL, "1xx", "2xx", "3xx", "4xx", "5xx"};
    for (int i = 1; i <= 5; i++) {
        char labels[32];
        snprintf(labels, sizeof(labels), "class=\"%s\"", classes[i]);
        s->m_responses[i] = rt_metric_counter(metrics, "atrium_http_responses_total", labels,
                                              "Responses sent, by status class");
    }
    s->timer = susp_timer_new(s);
    s->gate_poke_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!s->router || !s->outbound || !s->timer || s->gate_poke_fd < 0) {
        http_server_free(s);
        return NULL;
    }
    return s;
}

/* How many client connections the descriptors allow: RLIMIT_NOFILE minus the database
 * pool, outbound sockets, the configured reserve for files, MHD's own descriptors and the
 * operational listener's. */
static int connection_limit(const struct core_config *cfg)
{
    struct rlimit rl;
    long nofile = getrlimit(RLIMIT_NOFILE, &rl) == 0 ? (long)rl.rlim_cur : 1024;
    long reserve = (long)cfg->database.pool_size + OUTBOUND_SOCKET_RESERVE + cfg->http.fd_reserve +
                   4L * cfg->http.request_threads + 16 + HTTP_GATE_EXTRA_FDS +
                   (cfg->ops.enabled ? cfg->ops.max_connections + OPS_OWN_FDS : 0);
    long limit = nofile - reserve;
    if (limit < 8) limit = 8;
    if (cfg->http.max_connections > 0 && cfg->http.max_connections < limit)
        limit = cfg->http.max_connections;
    else if (cfg->http.max_connections > limit)
        rt_log(ATRIUM_LOG_WARN, "core",
               "server.http.max_connections %d exceeds what RLIMIT_NOFILE %ld allows; using %ld",
               cfg->http.max_connections, nofile, limit);
    return (int)limit;
}

bool http_path_is_federation(const char *raw_path)
{
    return strncmp(raw_path, "/_matrix/federation/", 20) == 0 ||
           strcmp(raw_path, "/_matrix/federation") == 0 ||
           strncmp(raw_path, "/_matrix/key/", 13) == 0;
}

bool http_path_on_both_listeners(const char *raw_path)
{
    return strncmp(raw_path, "/_matrix/media/v3/download/", 27) == 0;
}

bool http_path_is_operational(const char *raw_path)
{
    return strcmp(raw_path, "/health") == 0 || strcmp(raw_path, "/metrics") == 0;
}

void http_server_set_federation(http_server *s, http_fed_auth_fn auth, atrium_handler fallback)
{
    s->fed_enabled = true;
    s->fed_auth = auth;
    memset(&s->fed_fallback, 0, sizeof(s->fed_fallback));
    s->fed_fallback.route.method = "GET";
    s->fed_fallback.route.path = "/_matrix/federation/{unknown}";
    s->fed_fallback.route.handler = fallback;
    s->fed_fallback.route.flags = ATRIUM_ROUTE_FEDERATION;
    s->fed_fallback.owner = "core";
}

/* Fill ss from an address literal and port; false when it is no IPv4/IPv6 literal. */
static bool bind_sockaddr(const char *address, int port, struct sockaddr_storage *ss,
                          unsigned *flags)
{
    memset(ss, 0, sizeof(*ss));
    struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, address, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)port);
        return true;
    }
    if (inet_pton(AF_INET6, address, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)port);
        *flags |= MHD_USE_IPv6;
        return true;
    }
    return false;
}

/* The federation listener: its own small pool, TLS through the reloadable certificate. */
static int start_federation(http_server *s)
{
    const struct core_fed_listener *fl = &s->cfg->fed_listener;
    struct sockaddr_storage ss;
    unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (!bind_sockaddr(fl->bind_address, fl->port, &ss, &flags)) {
        rt_log(ATRIUM_LOG_ERROR, "core",
               "server.federation.bind_address \"%s\" is not an IPv4 or IPv6 address",
               fl->bind_address);
        return -1;
    }
    if (fl->tls) flags |= MHD_USE_TLS;
    http_listener *l = &s->listeners[HTTP_LISTENER_FEDERATION];
    s->fed_daemon = MHD_start_daemon(
        flags, (uint16_t)fl->port, NULL, NULL, on_access, l, MHD_OPTION_EXTERNAL_LOGGER, mhd_log,
        NULL, MHD_OPTION_SOCK_ADDR, &ss, MHD_OPTION_THREAD_POOL_SIZE,
        (unsigned)fl->request_threads, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)s->fed_max_connections, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)s->cfg->http.connection_timeout_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)CONNECTION_MEMORY_LIMIT_BYTES, MHD_OPTION_NOTIFY_COMPLETED, on_completed, l,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, l, MHD_OPTION_UNESCAPE_CALLBACK,
        no_unescape, NULL,
        fl->tls ? MHD_OPTION_HTTPS_CERT_CALLBACK : MHD_OPTION_END, http_tls_cert_callback(),
        MHD_OPTION_END);
    if (!s->fed_daemon) {
        rt_log(ATRIUM_LOG_ERROR, "core",
               "cannot listen for federation on %s:%d (%s): is another server using the "
               "port? Change server.federation.port or server.federation.bind_address",
               fl->bind_address, fl->port, strerror(errno));
        return -1;
    }
    rt_log(ATRIUM_LOG_INFO, "core", "federation listening on %s://%s:%d (%d threads)",
           fl->tls ? "https" : "http", fl->bind_address, fl->port, fl->request_threads);
    return 0;
}

/* The operational listener (server.ops): /health and /metrics on a port of their own, one
 * thread, server.ops.max_connections connections kept for it. Load balancers ask it: on
 * the client listener a probe past the connection limit waits in the accept queue behind
 * every client connection there (gate.c). Plain HTTP: bind it where only they reach. */
static int start_ops(http_server *s)
{
    const struct core_config *cfg = s->cfg;
    struct sockaddr_storage ss;
    unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (!bind_sockaddr(cfg->ops.bind_address, cfg->ops.port, &ss, &flags)) {
        rt_log(ATRIUM_LOG_ERROR, "core",
               "server.ops.bind_address \"%s\" is not an IPv4 or IPv6 address",
               cfg->ops.bind_address);
        return -1;
    }
    http_listener *l = &s->listeners[HTTP_LISTENER_OPS];
    s->ops_daemon = MHD_start_daemon(
        flags, (uint16_t)cfg->ops.port, NULL, NULL, on_access, l, MHD_OPTION_EXTERNAL_LOGGER,
        mhd_log, NULL, MHD_OPTION_SOCK_ADDR, &ss, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)cfg->ops.max_connections, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)OPS_IDLE_TIMEOUT_S, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)CONNECTION_MEMORY_LIMIT_BYTES, MHD_OPTION_NOTIFY_COMPLETED, on_completed, l,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, l, MHD_OPTION_UNESCAPE_CALLBACK,
        no_unescape, NULL, MHD_OPTION_END);
    if (!s->ops_daemon) {
        rt_log(ATRIUM_LOG_ERROR, "core",
               "cannot listen for /health and /metrics on %s:%d (%s): is another server using "
               "the port? Change server.ops.port or server.ops.bind_address",
               cfg->ops.bind_address, cfg->ops.port, strerror(errno));
        return -1;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->ops_daemon, MHD_DAEMON_INFO_BIND_PORT);
    rt_log(ATRIUM_LOG_INFO, "core", "operational endpoints on http://%s:%d (%d connections)",
           cfg->ops.bind_address, info ? (int)info->port : cfg->ops.port,
           cfg->ops.max_connections);
    return 0;
}

int http_server_start(http_server *s)
{
    const struct core_config *cfg = s->cfg;
    struct sockaddr_storage ss;
    unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (!bind_sockaddr(cfg->http.bind_address, cfg->http.port, &ss, &flags)) {
        rt_log(ATRIUM_LOG_ERROR, "core",
               "server.http.bind_address \"%s\" is not an IPv4 or IPv6 address",
               cfg->http.bind_address);
        return -1;
    }
    s->max_connections = connection_limit(cfg);
    if (s->fed_enabled) { /* a quarter of the connections for other servers */
        s->fed_max_connections = s->max_connections / FED_CONNECTION_SHARE;
        if (s->fed_max_connections < FED_MIN_CONNECTIONS) s->fed_max_connections = FED_MIN_CONNECTIONS;
        s->max_connections -= s->fed_max_connections;
        if (s->max_connections < FED_MIN_CONNECTIONS) s->max_connections = FED_MIN_CONNECTIONS;
        /* Federation first: once the client listener answers /health, both are up. */
        if (start_federation(s) < 0) return -1;
    }
    /* The operational listener before the client one, as federation. */
    if (cfg->ops.enabled && start_ops(s) < 0) return -1;
    /* The client connections are shared out: some for connections still sending their
     * headers (held by the gate), the rest served by libmicrohttpd, of which a reserve is
     * kept for requests answered without waiting (gate.c, pick_worker). */
    s->gate_max_pending = s->max_connections / GATE_SHARE;
    if (s->gate_max_pending < GATE_MIN_PENDING) s->gate_max_pending = GATE_MIN_PENDING;
    s->max_connections -= s->gate_max_pending;
    if (s->max_connections < FED_MIN_CONNECTIONS) s->max_connections = FED_MIN_CONNECTIONS;
    /* Shared evenly by the request pool's daemons (one per thread). */
    int per_worker = s->max_connections / cfg->http.request_threads;
    if (per_worker < 1) per_worker = 1;
    s->max_connections = per_worker * cfg->http.request_threads;
    s->cheap_reserve = s->max_connections / CHEAP_RESERVE_SHARE;
    if (s->cheap_reserve < CHEAP_RESERVE_MIN) s->cheap_reserve = CHEAP_RESERVE_MIN;
    rt_metric_set(rt_metric_gauge(s->metrics, "atrium_http_max_connections", NULL,
                                  "Client connections allowed at once (from RLIMIT_NOFILE)"),
                  s->max_connections);
    /* The request pool: one libmicrohttpd daemon per thread, without a listening socket.
     * The gate (gate.c) owns that socket and hands each connection whose headers are
     * complete and well-framed to the least busy daemon (MHD_add_connection): a thread
     * blocked in a handler is not given new connections. */
    flags |= MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC;
    s->n_workers = cfg->http.request_threads;
    s->workers = calloc((size_t)s->n_workers, sizeof(*s->workers));
    bool workers_ok = s->workers != NULL;
    for (int i = 0; workers_ok && i < s->n_workers; i++)
        pthread_mutex_init(&s->workers[i].resume_mu, NULL);
    for (int i = 0; workers_ok && i < s->n_workers; i++) {
        http_listener *w = &s->workers[i];
        w->srv = s;
        w->kind = HTTP_LISTENER_CLIENT;
        w->parent = &s->listeners[HTTP_LISTENER_CLIENT];
        w->max_connections = per_worker;
        atomic_init(&w->open_connections, 0);
        atomic_init(&w->busy, 0);
        atomic_init(&w->unstarted, 0);
        atomic_init(&w->resumed, 0);
        w->daemon = MHD_start_daemon(
            flags, 0, NULL, NULL, on_access, w, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
            /* The gate enforces per_worker with counts from the connection callback;
             * libmicrohttpd forgets a closed connection a little later, so its own limit
             * has room for that lag (or it would close new connections unanswered). */
            MHD_OPTION_CONNECTION_LIMIT, (unsigned)(per_worker * WORKER_LIMIT_SLACK),
            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->http.connection_timeout_s,
            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)CONNECTION_MEMORY_LIMIT_BYTES,
            MHD_OPTION_NOTIFY_COMPLETED, on_completed, w,
            MHD_OPTION_NOTIFY_CONNECTION, on_connection, w,
            MHD_OPTION_UNESCAPE_CALLBACK, no_unescape, NULL, MHD_OPTION_END);
        workers_ok = w->daemon != NULL;
    }
    int port = cfg->http.port;
    if (workers_ok) {
        socklen_t len = ss.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                 : sizeof(struct sockaddr_in);
        s->gate = http_gate_start(s, (const struct sockaddr *)&ss, len, &port);
    }
    if (!workers_ok || !s->gate) {
        rt_log(ATRIUM_LOG_ERROR, "core",
               "cannot listen on %s:%d (%s): is another server using the port? Change "
               "server.http.port or server.http.bind_address",
               cfg->http.bind_address, cfg->http.port, strerror(errno));
        return -1;
    }
    rt_log(ATRIUM_LOG_INFO, "core",
           "listening on http://%s:%d (%d request threads, %d connections max, timeout %d s, "
           "headers within %d ms)",
           cfg->http.bind_address, port, cfg->http.request_threads, s->max_connections,
           cfg->http.connection_timeout_s, cfg->http.header_timeout_ms);
    return 0;
}

void http_server_quiesce(http_server *s)
{
    atomic_store(&s->draining, true);
}

void http_server_expire_suspended(http_server *s)
{
    susp_expire_all(s);
}

void http_server_drain(http_server *s, int grace_ms)
{
    (void)s;
    int64_t until = rt_now_ms() + grace_ms;
    while (atomic_load(&inflight_requests) > 0 && rt_now_ms() < until) {
        struct timespec ts = {.tv_sec = 0, .tv_nsec = DRAIN_POLL_MS * 1000000L};
        nanosleep(&ts, NULL);
    }
    int left = atomic_load(&inflight_requests);
    if (left > 0)
        rt_log(ATRIUM_LOG_WARN, "core", "%d requests still running after the grace period of %d ms",
               left, grace_ms);
}

void http_server_stop(http_server *s)
{
    http_gate_stop(s->gate); /* no new connections reach the daemon from here on */
    s->gate = NULL;
    if (s->fed_daemon) MHD_stop_daemon(s->fed_daemon);
    s->fed_daemon = NULL;
    if (s->ops_daemon) MHD_stop_daemon(s->ops_daemon);
    s->ops_daemon = NULL;
    http_resume_flush(s); /* libmicrohttpd stops no daemon with a connection suspended */
    for (int i = 0; s->workers && i < s->n_workers; i++) {
        if (s->workers[i].daemon) MHD_stop_daemon(s->workers[i].daemon);
        s->workers[i].daemon = NULL;
    }
}

void http_server_free(http_server *s)
{
    if (!s) return;
    http_server_stop(s);
    susp_timer_free(s->timer);
    susp_events_free(s);
    router_free(s->router);
    for (int i = 0; s->workers && i < s->n_workers; i++)
        pthread_mutex_destroy(&s->workers[i].resume_mu);
    free(s->workers);
    rt_budget_free(s->outbound);
    if (s->gate_poke_fd >= 0) close(s->gate_poke_fd);
    pthread_mutex_destroy(&s->events_mu);
    free(s);
}
