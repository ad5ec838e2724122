/*
 * core/http/http.h - the core's HTTP layer, internal: the server object, the request
 * object behind atrium_req, the router, and the suspend/resume machinery (park, handoff,
 * deadlines, events, admission lines).
 *
 * The public face of all this is include/atrium/host.h; this header is what core files
 * share among themselves. Internal prefixes: http_ (server, request, response),
 * router_, susp_ (suspension).
 */
#ifndef ATRIUM_CORE_HTTP_H
#define ATRIUM_CORE_HTTP_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "atrium/host.h"
#include "core/config/config.h"
#include "core/runtime/flight.h"
#include "core/runtime/runtime.h"
#include "core/store/db.h"

/* ---- outcomes: what handlers and their helpers return ---------------------------------- */

/* The rule, the core's and the plugins' alike (plugins/media/media.h states the media
 * plugin's). A handler returns an enum atrium_outcome (include/atrium/host.h) - ATRIUM_DONE
 * (0) means "answered" - or a negative atrium_err. A helper on a handler's way that may
 * answer returns int: either what the handler must return as it is (an outcome or an
 * error: it answered, parked or handed off), or a code of a named step enum of its own
 * module saying how the caller goes on (like enum pdu_step in
 * core/federation/rooms/fed_rooms_recv.c). So no helper uses 0 for "go on" (0 is
 * ATRIUM_DONE, and ROOMS_OK, and FED_PDU_ACCEPTED), `rc != X_GO` always reads "return rc",
 * and each step code is written out, from 200 up, apart from every outcome, error and the
 * media plugin's codes (100 up): none is made by arithmetic on another. A code of one enum
 * is never returned where another enum's is expected; the function's comment names which.
 * Helpers that cannot answer return their module's own result enum (enum rooms_failure,
 * ...) or bool, never an outcome. */

/* ---- router ------------------------------------------------------------------------- */

typedef struct router router;
typedef struct route_entry {
    atrium_route route;
    const char *owner;  /* "core" or the plugin's name */
    const char *path;   /* the template, owned (route.path points here) */
    size_t n_segs;
    const char **segs;  /* literal text, or NULL for a {param} segment */
    const char **names; /* param name per segment, or NULL */
    uint64_t *seg_hash; /* the hash of each literal segment (0 for a parameter) */
    int literals;       /* how many literal segments: more literals win */
} route_entry;

router *router_new(void);
void router_free(router *rt);
/* 0, or ATRIUM_E_EXISTS / ATRIUM_E_INVAL with err naming both owners / the problem. A
 * /_matrix/client/v3/ or /_matrix/media/v3/ route is also added under r0 (router_r0_twin). */
int router_add(router *rt, const atrium_route *route, const char *owner, char *err,
               size_t errlen);
/* The owner ("core" or a plugin's name) of the route registered for method and a path
 * template of the same shape, or NULL. Main thread, at start-up. */
const char *router_owner(const router *rt, const char *method, const char *path);
/* Match method + raw (still percent-encoded) path. Segments are percent-decoded after
 * splitting, so an encoded "/" stays inside its segment. On a match, the param names and
 * decoded values are allocated in `arena`. NULL when nothing matches; *wrong_method is
 * set when the path matches a route of another method (-> 405). HEAD matches GET.
 * Every parameter value is checked to be text (http_decode_text): when one is not, the
 * route is still returned and *invalid names that parameter (the caller answers 400
 * before anything reads it); else *invalid is NULL. */
const route_entry *router_match(const router *rt, const char *method, const char *raw_path,
                                rt_arena *arena, const char ***names, const char ***values,
                                size_t *n, bool *wrong_method, const char **invalid);
/* The r0 path serving the same endpoint as the v3 template `path` (written to out): true
 * when r0.6.1 had the endpoint, false for other prefixes and endpoints newer than r0. */
bool router_r0_twin(const char *path, char *out, size_t outlen);
/* Percent-decode in place; returns false on a malformed escape or an embedded NUL. */
bool http_percent_decode(char *s);
/* Is s (NUL-terminated) well-formed UTF-8: no overlong forms, no surrogates, nothing past
 * U+10FFFF? */
bool http_utf8_valid(const char *s);
/* The one rule for a value a client put in a path or query string: percent-decode in
 * place, then require UTF-8 text without NUL. false when it is not (the caller answers
 * 400 M_INVALID_PARAM; s is then unspecified). */
bool http_decode_text(char *s);

/* ---- server ------------------------------------------------------------------------- */

typedef struct http_server http_server;
typedef struct susp_timer susp_timer;

/* Which listener a request came in on: the client listener serves no federation path, the
 * federation listener serves only those (http_path_is_federation), the operational
 * listener (server.ops) only /health and /metrics (http_path_is_operational). */
enum http_listener_kind {
    HTTP_LISTENER_CLIENT = 0,
    HTTP_LISTENER_FEDERATION = 1,
    HTTP_LISTENER_OPS = 2,
    HTTP_LISTENER_KINDS
};
typedef struct http_listener {
    http_server *srv;
    int kind; /* enum http_listener_kind */
    atomic_int open_connections; /* open now, counted by the connection callback */
    /* A client worker (one libmicrohttpd daemon with one thread, fed by the gate): */
    struct MHD_Daemon *daemon;
    struct http_listener *parent; /* the client listener, whose counts it adds to */
    atomic_int busy;              /* handler runs in progress on its thread */
    /* Connections handed over by the gate whose first request has not reached on_access
     * yet: its thread's backlog, which a cheap request handed to it waits behind. The gate
     * hands a worker at most HTTP_WORKER_BACKLOG of those that may wait (gate.c). */
    atomic_int unstarted;
    int max_connections;          /* its share of the client connections */
    /* Its woken requests (resumed to run their handler again, ACT_REDISPATCH) whose run has
     * not started, at most HTTP_WORKER_RESUMES; the others wait in its resume line, in wake
     * order, still suspended (resume_line.c). Changed under resume_mu. */
    pthread_mutex_t resume_mu;
    atomic_int resumed;
    struct atrium_req *rl_head, *rl_tail;
} http_listener;

/* ---- the resume line (resume_line.c) ------------------------------------------------ */
/* Woken requests a worker runs again at once; the rest wait suspended in its line, so a
 * fan-out of a thousand woken long-polls never puts more than these ahead of a cheap
 * request handed to that worker (docs/performance.md, "The wake fan-out"). */
#define HTTP_WORKER_RESUMES 2
/* Resume r (its state already SUSP_RESUMING with `action`): a woken run on a client worker
 * takes a place among its HTTP_WORKER_RESUMES or waits in its line; anything else is
 * resumed at once. Any thread, r->mu not held. */
void http_resume(atrium_req *r, int action);
/* r's woken run starts, or its connection closed before: its place goes to the oldest in
 * the line. The worker's thread; no-op when r holds none. */
void http_resume_done(atrium_req *r);
/* Resume every request still in a line (shutdown, before the workers stop). */
void http_resume_flush(http_server *s);

/* Count d connections opened (+1) or closed (-1) on l and its parent. */
void http_listener_count(http_listener *l, int d);

/* ---- libmicrohttpd's own answers (mhd_answers.c) ----------------------------------- */
/* Queue resp on c: libmicrohttpd's MHD_queue_response, for every response of Atrium's
 * own (the name MHD_queue_response is taken over to turn libmicrohttpd's made-up HTML
 * error pages into Matrix errors). Same contract and thread as MHD_queue_response. */
enum MHD_Result http_mhd_queue_response(struct MHD_Connection *c, unsigned int status,
                                        struct MHD_Response *resp);
/* Write wire (a whole HTTP message, Connection: close) on c's socket at once, beside
 * libmicrohttpd - through c's TLS session when it has one - and read a little of what
 * the client still sends, so the close that must follow (the caller returns MHD_NO) does
 * not reset the answer away. For a connection with nothing of a response written yet, on
 * its own thread. false when it could not be written whole. */
bool http_answer_now(struct MHD_Connection *c, const char *wire, size_t len);

/* ---- framing (framing.c): where a request's body ends -------------------------------- */
/* A request head's Content-Length and Transfer-Encoding headers, judged as they are fed
 * one by one (zero-initialise it). */
typedef struct http_framing {
    bool have_length, have_coding, chunked_last, other_coding;
    int chunked_count;
    int64_t length;
    int status;                /* the first refusal, or 0 */
    const char *errcode, *msg; /* static strings, set with status */
} http_framing;
/* Feed one header (slices, need not be NUL-terminated; the value is trimmed here): 0, or
 * the status of the refusal (400 a Content-Length that is no decimal number or disagrees
 * with an earlier one, 413 one at or past 2^63), with f->errcode and f->msg set. Once
 * refused, f keeps its first refusal. Pure. */
int http_framing_header(http_framing *f, const char *name, size_t name_len, const char *value,
                        size_t value_len);
/* After the last header: 0, or the refusal (as above, and: 400 for Content-Length with
 * Transfer-Encoding or a last coding other than chunked, 501 for a coding other than
 * chunked before it). */
int http_framing_end(http_framing *f);
/* The size of a request head, the same for every request (the gate's first ones and
 * libmicrohttpd's later ones): request line and headers, header lines, query
 * parameters. 16 KiB, the total Synapse's HTTP layer (Twisted) admits too: a bigger
 * limit needs a bigger libmicrohttpd pool per connection (server.c,
 * CONNECTION_MEMORY_LIMIT_BYTES), which it zeroes again before every request. */
#define HTTP_MAX_HEAD_BYTES (16 * 1024)
#define HTTP_MAX_HEADERS 100
#define HTTP_MAX_QUERY_ARGS 256
/* 0 when a head of head_bytes with that many header lines and query parameters is within
 * the limits above, else the status (431 too large or too many headers, 400
 * M_INVALID_PARAM too many query parameters) with *errcode and *msg (static) set. Pure. */
int http_head_limits(size_t head_bytes, size_t headers, size_t query_args, const char **errcode,
                     const char **msg);

/* ---- the gate (gate.c): the client listener's front door ----------------------------- */
typedef struct http_gate http_gate;
/* Descriptors the gate holds past the connection limit (server.c leaves them out of it):
 * one spare kept for accepting at EMFILE. */
#define HTTP_GATE_EXTRA_FDS 1
/* Connections a worker may have been handed whose first request has not started, past
 * which one that may wait (not cheap) stays ready in the gate: a burst of long-polls is
 * spread as the workers take them, and a cheap request waits behind a few at most. */
#define HTTP_WORKER_BACKLOG 2
/* Listen on addr and hand every new connection whose request headers are complete and
 * well-framed to one of s->workers (libmicrohttpd daemons started with
 * MHD_USE_NO_LISTEN_SOCKET): the least busy one with room. Others get a Matrix error
 * (400, 408 after server.http.header_timeout_ms, 413, 431, 505; 503 only when the process
 * is out of descriptors) and are closed; past the connection limit new ones wait in the
 * accept queue. *port_out gets the bound port. NULL with errno set when the
 * socket cannot be bound. Main thread. */
http_gate *http_gate_start(http_server *s, const struct sockaddr *addr, socklen_t addrlen,
                           int *port_out);
/* Stop accepting and close every connection still waiting for its headers. */
void http_gate_stop(http_gate *g);
/* A worker's backlog (unstarted) fell: the gate may hand it a connection waiting for room.
 * Any thread; cheap (one eventfd write, only while connections wait in the gate). */
void http_gate_poke(http_server *s);
/* Where the header block of buf ends (just past the empty line), or 0 when it does not
 * end within len bytes. Pure. */
size_t http_gate_head_end(const char *buf, size_t len);
/* Is this request head one of the few that are answered without waiting (/health,
 * /versions, /metrics, whoami, .well-known), which may use the connections kept in
 * reserve? Pure. */
bool http_gate_cheap_request(const char *head, size_t len);
/* Judge a complete request head (buf[0..len), up to and including the empty line): 0
 * when libmicrohttpd may have it, else the status to answer, with *errcode and msg set.
 * Checks the request line (method token, target without blanks or controls, at most 256
 * query parameters, HTTP/1.0 or 1.1 else 505), header lines (at most 100, no folding,
 * token names), and the body's framing (http_framing_header). Pure; any thread. */
int http_gate_check_head(const char *buf, size_t len, const char **errcode, char *msg,
                         size_t msglen);

/* The check the federation module runs before every handler of an ATRIUM_ROUTE_FEDERATION
 * route (X-Matrix): 0 with r->origin set, ATRIUM_DONE with a refusal set as the response,
 * or ATRIUM_PARKED while a key is being fetched (the request runs again when it lands). */
typedef int (*http_fed_auth_fn)(atrium_req *r);

struct http_server {
    const struct core_config *cfg;
    rt_metrics *metrics;
    router *router;
    http_listener *workers; /* the client listener's request pool: one daemon per thread */
    int n_workers;
    http_gate *gate;      /* the client listener's front door */
    int gate_max_pending; /* connections it may hold while their headers arrive */
    int cheap_reserve;    /* connections only cheap requests may take (gate.c) */
    int gate_poke_fd;     /* eventfd the workers wake the gate with (http_gate_poke) */
    atomic_int gate_ready; /* connections waiting in the gate for a worker with room */
    susp_timer *timer;
    rt_budget *outbound; /* ADR-0079 (docs/adr/0079-outbound-budget.md) */
    atomic_bool stopping;
    atomic_bool draining; /* stop signal taken: new requests get 503 */
    int max_connections;
    pthread_mutex_t events_mu;
    struct atrium_event *events; /* every event, for shutdown */
    rt_metric *m_requests, *m_connections, *m_parked, *m_handed_off, *m_holds;
    rt_metric *m_handoff_expired, *m_handoff_client_gone, *m_handoff_cancelled;
    rt_metric *m_streams_waiting, *m_streams_cut, *m_resumes_waiting;
    rt_metric *m_responses[6]; /* by status class 1xx..5xx, [0] unused */
    bool ratelimit_enabled;

    /* federation listener (none until http_server_set_federation) */
    struct MHD_Daemon *fed_daemon;
    http_listener listeners[HTTP_LISTENER_KINDS]; /* by enum http_listener_kind: daemons' cls */
    bool fed_enabled;
    http_fed_auth_fn fed_auth;
    route_entry fed_fallback; /* unmatched federation paths: signature check, then 404 */
    int fed_max_connections;

    /* operational listener (server.ops.enabled): /health and /metrics, its own connections */
    struct MHD_Daemon *ops_daemon;
};

http_server *http_server_new(const struct core_config *cfg, rt_metrics *metrics);
/* Bind and listen (MHD's thread pool starts). 0 or -1 (logged). */
int http_server_start(http_server *s);
/* Refuse new requests with 503 (Connection: close) and keep serving those in flight.
 * The listening socket stays open until http_server_stop: MHD_quiesce_daemon races its
 * own epoll workers in libmicrohttpd 0.9.75 and can abort the process. */
void http_server_quiesce(http_server *s);
/* Answer every parked or handed-off request (parked ones run again with reason
 * _SHUTDOWN; handed-off ones get 503) and refuse new parks and handoffs. */
void http_server_expire_suspended(http_server *s);
/* Wait until no request is in flight (idle keep-alive connections do not count) or
 * grace_ms passed. */
void http_server_drain(http_server *s, int grace_ms);
void http_server_stop(http_server *s); /* MHD_stop_daemon; after expire */
void http_server_free(http_server *s);
/* Register a table of the core's routes (owner "core", each as router_add does), in
 * order. The first refusal is logged under `component` (the log's component name) and
 * ends the table: 0, or that refusal's error, the routes before it staying registered
 * (start-up fails anyway). Main thread, at start-up. HTTP_ROUTES_ADD takes a static array
 * and counts it. */
int http_routes_add(http_server *s, const atrium_route *routes, size_t n, const char *component);
/* One entry of such a table, for the tables that name only these four. */
#define HTTP_ROUTE(m, p, h, max_body)                                                       \
    {.method = (m), .path = (p), .handler = (h), .max_body_bytes = (max_body)}
#define HTTP_ROUTES_ADD(s, table, component)                                                \
    http_routes_add((s), (table), sizeof(table) / sizeof((table)[0]), (component))
/* Register the core's own routes (/health, /versions, /metrics, ...). */
int http_builtin_routes(http_server *s);
/* Advertise `name` (a static string) as true in /versions' unstable_features. [init]
 * only: from a module's init, before the listener opens. 0, or -1 past the table's bound
 * (logged). */
int http_unstable_feature_add(const char *name);
/* Serve federation: a second listener (server.federation.*) for federation and key paths,
 * TLS unless server.federation.tls is false (the certificate must be loaded with
 * http_tls_load first). `auth` runs before every ATRIUM_ROUTE_FEDERATION handler;
 * `fallback` answers unmatched federation paths (after `auth`). Before http_server_start. */
void http_server_set_federation(http_server *s, http_fed_auth_fn auth, atrium_handler fallback);
/* Is this raw path one the federation listener serves (/_matrix/federation/, /_matrix/key/)? */
bool http_path_is_federation(const char *raw_path);
/* Is this raw path served on both listeners? The legacy unauthenticated media download
 * (/_matrix/media/v3/download/...), which servers that do not know the federation media
 * endpoints fall back to; the media plugin answers it, under plugins.media.legacy_media,
 * the same on either. */
bool http_path_on_both_listeners(const char *raw_path);
/* Is this raw path one the operational listener serves (/health, /metrics)? */
bool http_path_is_operational(const char *raw_path);

/* ---- TLS (tls.c) -------------------------------------------------------------------- */
/* Load a PEM certificate (or chain) and key as the federation listener's certificate; new
 * handshakes use it from then on (SIGHUP calls this again). 0, or -1 with err set (the
 * certificate in use stays). Any thread. */
int http_tls_load(const char *cert_path, const char *key_path, char *err, size_t errlen);
void http_tls_free_all(void); /* after the listener stopped */
void *http_tls_cert_callback(void); /* for MHD_OPTION_HTTPS_CERT_CALLBACK */

/* ---- request ------------------------------------------------------------------------ */

enum susp_state { SUSP_ACTIVE = 0, SUSP_SUSPENDED, SUSP_RESUMING };
/* SUSP_STREAM: a response being sent whose reader said ATRIUM_STREAM_WAIT (1.3): the
 * connection waits, linked on an event like a park, until the event is signalled (its
 * reader runs again) or the stream's deadline passes (the response is cut). */
enum susp_kind { SUSP_NONE = 0, SUSP_PARK, SUSP_LINE, SUSP_HANDOFF, SUSP_WAIT, SUSP_STREAM };
enum susp_action { ACT_NONE = 0, ACT_RESPOND, ACT_REDISPATCH };

typedef struct http_kv {
    const char *name, *value;
} http_kv;

typedef struct http_hold {
    void (*release)(void *arg);
    void *arg;
    bool until_answer; /* http_req_add_answer_hold */
    struct http_hold *next;
} http_hold;

typedef struct http_out_header {
    const char *name, *value;
    struct http_out_header *next;
} http_out_header;

#define HTTP_MAX_HANDOFF_VALUES 8
#define HTTP_MAX_RATELIMITS_PER_REQ 8

struct atrium_req {
    http_server *srv;
    struct MHD_Connection *conn;
    rt_arena *arena;
    atomic_int refs;
    pthread_mutex_t mu; /* guards the suspension fields below */
    char id[20];

    const char *method;
    const char *path;     /* percent-decoded */
    const char *raw_path; /* as received */
    const char *raw_query; /* the query string as received (without '?'), or "" */
    const route_entry *route;
    size_t n_params;
    const char **param_names, **param_values;
    http_kv *headers, *args;
    size_t n_headers, n_args;
    const char *invalid_arg; /* raw name of the first query argument that is not text */
    const char *client_addr;
    int listener;       /* enum http_listener_kind */
    const char *origin; /* the server whose X-Matrix signature was verified, or NULL */
    const char *user;   /* authenticated user ID, or NULL */
    const char *device; /* the access token's device ID, or NULL */
    int is_admin;       /* the user is a server admin (valid when user is set) */
    int is_guest;       /* the user is a guest (valid when user is set); -1: a guest refused */
    int sock_fd;
    int64_t start_ms, deadline_ms;

    /* body */
    char *body;
    size_t body_len, body_cap;
    int64_t max_body;
    bool body_too_large, body_failed;
    json_t *json;

    /* running */
    int run_reason;
    int runs;
    void *plugin_state; /* a plugin handler's own (host->req_state, req_set_state); the
                         * core never reads or writes it */
    void *core_state; /* a core handler's own progress across its runs (after a park or a
                       * handoff), and the federation check's while it waits for a key, in
                       * request memory; plugins use plugin_state */
    void *as_query;   /* an application service asked about a user or alias in an earlier
                       * run (core/client/appservice/as_query.c), in request memory */
    bool in_dispatch_done; /* the response was queued */

    /* the response under construction, owned by the owning thread */
    struct MHD_Response *response;
    int status;
    /* when that response is an error (status >= 400): its JSON and Retry-After seconds
     * (0 = none), so it can also be written straight to the socket (http_error_wire) */
    const char *error_json;
    int64_t error_retry_after_s;
    http_out_header *out_headers;
    bool response_file; /* that response sends a file (http_respond_file): corked */
    bool corked;        /* TCP_CORK set on sock_fd for it, until the request completes */

    /* suspension: guarded by mu */
    int susp;        /* enum susp_state */
    int susp_kind;   /* enum susp_kind */
    int action;      /* enum susp_action, set with SUSP_RESUMING */
    int resume_reason;
    struct MHD_Response *resume_response;
    int resume_status;
    size_t heap_idx; /* position in the deadline heap, or SIZE_MAX */
    int64_t susp_deadline;
    bool worker_running; /* a handoff's task runs the handler (mu): its answer, not the
                            deadline's, ends the request */

    /* parked on an event (linked under the event's lock) */
    struct atrium_event *ev;
    struct atrium_req *ev_prev, *ev_next;
    bool ev_linked;

    /* parked with susp_wait until susp_wake (guarded by mu) */
    bool wait_linked;
    /* the flights it joined (susp_flight_join), in request memory; owner thread only */
    struct susp_flight_wait *flight_waits;

    /* a waiting stream's deadline passed, or shutdown: its next read ends it (mu) */
    bool stream_cut;

    /* admission line */
    rt_line *line;
    rt_line_waiter waiter;
    bool line_waiting;  /* linked in line, or granted and not yet taken as a hold */
    bool line_cancelled; /* the deadline or shutdown took it out of the line */
    int64_t line_deadline;

    /* handoff */
    rt_pool *pool;
    atrium_scope_value hvals[HTTP_MAX_HANDOFF_VALUES];
    size_t n_hvals;

    /* holds, released once in the request-completed callback - or, when a handed-off
     * handler still runs then (the deadline answered it), by that handler's pool thread
     * once it returns (guarded by holds_mu) */
    http_hold *holds;
    pthread_mutex_t holds_mu;
    bool completed;
    int on_pool;         /* handed-off handler runs in progress (a handler on one pool may
                            hand off to another, whose run starts before the first ends) */
    bool holds_deferred; /* completed while on_pool: the pool thread releases them */
    bool answer_deferred; /* answered while on_pool: the pool thread releases the answer
                             holds */

    /* its client worker (NULL on the other listeners), and its place there as a woken run
     * (resume_counted) or in its resume line (rl_next); resume_line.c */
    struct http_listener *worker;
    bool resume_counted;
    struct atrium_req *rl_next;

    /* inside a body_chunk callback: park, line_admit, req_wait and handoff refuse */
    bool in_body_chunk;

    /* run once when the last reference goes (after every callback that held one) */
    void (*on_free)(void *arg);
    void *on_free_arg;

    /* rate limiters this request was already counted by */
    void *rl_counted[HTTP_MAX_RATELIMITS_PER_REQ];
    int n_rl_counted;
};

atrium_req *http_req_new(http_server *s, struct MHD_Connection *c, const char *method,
                         const char *raw_url, int listener);
void http_req_ref(atrium_req *r);
void http_req_unref(atrium_req *r);
/* [req] Call fn(arg) once when r is freed, after its last reference went: for state a
 * late callback may still write (one per request; a second call replaces the first). */
void http_req_on_free(atrium_req *r, void (*fn)(void *arg), void *arg);
/* Release every hold once (idempotent); holds added later are released at once. */
int http_req_add_hold(atrium_req *r, void (*release)(void *arg), void *arg);
void http_req_release_holds(atrium_req *r);
/* A hold released as soon as the answer is queued, before its first byte leaves (or, as
 * any hold, when the request ends unanswered; never under a handed-off handler that still
 * runs): for a slot that counts requests waiting, not answers being sent. The outbound
 * budget (ADR-0079) is one: a client that asks one thing after the other must find its
 * last request's slot free, and an answer's last byte reaches the client before
 * libmicrohttpd's completed callback runs. */
int http_req_add_answer_hold(atrium_req *r, void (*release)(void *arg), void *arg);
/* The answer is about to be queued (server.c): releases the answer holds. */
void http_req_answered(atrium_req *r);
/* Around a handed-off handler's run (suspend.c): while it runs, http_req_release_holds
 * defers to http_req_pool_run_end, which releases them on the pool thread. begin returns
 * false when the request already completed (do not run the handler). */
bool http_req_pool_run_begin(atrium_req *r);
void http_req_pool_run_end(atrium_req *r);
/* Run the route handler on the calling thread inside the request's scopes; returns the
 * handler's outcome (errors mapped to a response). */
int http_req_run(atrium_req *r);
/* [req] Reading a request, one set of calls for the core and plugins alike (the host
 * table's req_param, req_query and req_json adapt them). All results are owned by r.
 * A path parameter by its template name ("roomId" for "{roomId}"), percent-decoded; NULL
 * when the route has no parameter of that name. */
const char *http_req_param(atrium_req *r, const char *name);
/* [req] A query argument by name, percent-decoded ("" for "?name" or "?name="); NULL when
 * absent. When a name repeats, the first occurrence wins. */
const char *http_req_query(atrium_req *r, const char *name);
/* [req] A header by name (case-insensitive); NULL when absent. */
const char *http_req_header(atrium_req *r, const char *name);
const char *http_req_client_key(atrium_req *r);
/* [req] The body as a JSON object, parsed once and kept in r->json (freed with r, so it
 * survives re-runs). NULL after answering 400 M_NOT_JSON (empty, malformed, not an object). */
json_t *http_req_json(atrium_req *r);
/* [req] Typed fields of a JSON object of the request (field.c). Each returns true when the
 * field is fine (absent fields leave *out at NULL / the default), false after answering:
 * 400 M_BAD_JSON for a wrong type, 400 M_MISSING_PARAM for an absent required field, 400
 * M_INVALID_PARAM over max_bytes (0 = no limit) or for a string with a NUL. Strings point
 * into obj. */
bool http_field_string(atrium_req *r, json_t *obj, const char *key, bool required,
                       size_t max_bytes, const char **out);
bool http_field_bool(atrium_req *r, json_t *obj, const char *key, bool def, bool *out);
/* An object field (absent: *out NULL). */
bool http_field_object(atrium_req *r, json_t *obj, const char *key, bool required,
                       json_t **out);
/* [req] The one rate-limit check of a request: 0 = allowed, > 0 = refused, milliseconds
 * until a token is there. Counts r once per limiter however often its handler runs again
 * (park, handoff), never when rate limiting is off or the scope says the request was
 * already admitted (ATRIUM_SCOPE_RATE_ADMITTED). Keyed by http_req_client_key. */
int64_t http_req_ratelimit(atrium_req *r, rt_ratelimit *rl);
bool http_addr_in_list(const char *addr, const char **list, size_t n);

/* ---- responses ---------------------------------------------------------------------- */

/* A Matrix error as a complete HTTP/1.1 message with Connection: close, for an answer that
 * cannot wait for libmicrohttpd (the request's body is still arriving): r's current error
 * response, or one built from status/errcode/msg when errcode is not NULL. Written into
 * buf; its length, or 0 when r holds no error response or buf is too small. */
size_t http_error_wire(atrium_req *r, int status, const char *errcode, const char *msg,
                       char *buf, size_t cap);
/* The reason phrase of a status ("Payload Too Large"), "Error" when unknown. */
const char *http_reason_phrase(int status);
/* Build (not queue) a Matrix error response with the no-store header (CORS comes when it
 * is queued). */
struct MHD_Response *http_error_response(int status, const char *errcode, const char *msg,
                                         int64_t retry_after_ms);
/* Set r's response (replacing any). */
void http_set_response(atrium_req *r, int status, struct MHD_Response *resp);
/* Add r's custom headers to r->response. */
void http_finalize_response(atrium_req *r);
/* Add the CORS headers unless resp has them already; called once, by the function that
 * queues every response (server.c). */
void http_add_cors(struct MHD_Response *resp);
int http_respond_error(atrium_req *r, int status, const char *errcode, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int http_respond_json(atrium_req *r, int status, json_t *body);
int http_respond_limited(atrium_req *r, int64_t retry_after_ms, const char *message);
void http_count_status(http_server *s, int status);
int http_respond_header(atrium_req *r, const char *name, const char *value);
int http_respond_buffer(atrium_req *r, int status, const char *content_type, const void *data,
                        size_t len);
int http_respond_file(atrium_req *r, int status, const char *content_type, int fd,
                      uint64_t offset, uint64_t len);
int http_respond_stream(atrium_req *r, int status, const char *content_type, int64_t size,
                        atrium_stream_read read, void *arg, void (*free_arg)(void *));
/* host->respond_stream_wait (atrium/host.h): a stream whose reader may answer
 * ATRIUM_STREAM_WAIT; the connection then waits on ev (susp_stream_wait). */
int http_respond_stream_wait(atrium_req *r, int status, const char *content_type, int64_t size,
                             atrium_stream_read read, void *arg, void (*free_arg)(void *),
                             struct atrium_event *ev, int64_t deadline_ms);

/* ---- a request's database connection (request_db.c) --------------------------------- */

/* [req] Borrow a connection from the shared pool (db_global) for r, waiting the configured
 * request wait (DB_WAIT_CONFIGURED). NULL after answering 503 M_UNKNOWN "busy; retry": the
 * handler then returns ATRIUM_DONE. A connection is given back with http_db_checkin on the
 * same thread, before the handler parks, hands off or returns. */
PGconn *http_db_checkout(atrium_req *r) RT_MUST_CHECK;
/* Give back a connection from http_db_checkout (NULL: nothing). */
void http_db_checkin(PGconn *c);

/* ---- suspension (suspend.c) --------------------------------------------------------- */

susp_timer *susp_timer_new(http_server *s);
void susp_timer_free(susp_timer *t);
/* [req] suspend r (if not already) as `kind` with a deadline. */
void susp_suspend(atrium_req *r, int kind, int64_t deadline_ms);
/* Resume r with an action exactly once: true if this call resumed it. `resp` is consumed
 * either way. */
bool susp_resume(atrium_req *r, int action, int reason, int status, struct MHD_Response *resp);
/* The handoff task body and its submit. */
int susp_handoff(atrium_req *r, rt_pool *pool, const atrium_scope_value *vals, size_t n);
int susp_park(atrium_req *r, struct atrium_event *ev, int64_t deadline_ms);
int susp_event_signal(struct atrium_event *ev);
/* How often ev was signalled so far: read before asking a stream's reader, handed to
 * susp_stream_wait so a signal in between is never lost. Any thread. */
uint64_t susp_event_gen(struct atrium_event *ev);
/* On the connection's thread, inside the content reader of a response being sent: suspend
 * the connection on ev until it is signalled or deadline_ms passes. false (nothing done)
 * when ev was signalled since `gen`: read again. */
bool susp_stream_wait(atrium_req *r, struct atrium_event *ev, uint64_t gen, int64_t deadline_ms);
/* Was a waiting stream of r cut (its deadline, shutdown)? Clears nothing. Any thread. */
bool susp_stream_cut(atrium_req *r);
/* [req] Park r until one susp_wake(r) or its deadline (capped like a park): no thread
 * waits, and the handler runs again with reason _WOKEN, _DEADLINE or _SHUTDOWN. For waits
 * on a callback of one's own (an outbound request's completion). Takes a reference on r
 * that susp_wake gives back, so the waker must call susp_wake exactly once, even after the
 * deadline already resumed r. Returns 0 (return ATRIUM_PARKED), or ATRIUM_E_STOPPED while
 * stopping (nothing taken). Wake may come before the handler returned: that is fine. */
int susp_wait(atrium_req *r, int64_t deadline_ms);
void susp_wake(atrium_req *r); /* [any] */
/* [req] Join the flight of key (core/runtime/flight.h) and park r on it: susp_wait until the
 * flight ends or deadline_ms. RT_FLIGHT_LEAD (start the work and rt_flight_finish it) or
 * RT_FLIGHT_JOINED, *out the flight, referenced until r ends (a hold); either way return
 * ATRIUM_PARKED. RT_FLIGHT_PUBLISHED (flags RT_FLIGHT_EARLY or _EARLY_ONLY, the early
 * result is out): not parked, call susp_flight_result now. ATRIUM_E_LIMIT,
 * ATRIUM_E_NOTFOUND (flags RT_FLIGHT_JOIN_ONLY or _EARLY_ONLY), ATRIUM_E_STOPPED, ATRIUM_E_NOMEM, ATRIUM_E_INVAL: nothing happened. The flight's lock is taken before r's (the park happens under it). */
int susp_flight_join(atrium_req *r, rt_flights *t, const char *key, int64_t deadline_ms,
                     unsigned flags, rt_flight **out);
/* [req] In a run after that park: RT_FLIGHT_RESULT_END (0) with the flight's result (and
 * value, valid while r lives) when it ended, RT_FLIGHT_RESULT_EARLY (1) with its early
 * result when r was released with that; ATRIUM_E_TIMEOUT (the deadline ran r) or ATRIUM_E_STOPPED
 * (shutdown) when not: r left the flight, which goes on for the others - answer r now.
 * ATRIUM_E_INVAL when r never joined f. */
int susp_flight_result(atrium_req *r, rt_flight *f, int *result, void **value);
struct atrium_event *susp_event_new(http_server *s);
int susp_line_admit(atrium_req *r, rt_line *line, int64_t max_wait_ms);
/* Release a line slot and pass it on (used by the line hold). */
void susp_line_release(rt_line *line, const char *holder); /* holder: the waiter's key */
/* Resume every suspended request (shutdown). */
void susp_expire_all(http_server *s);
/* Cleanup at completion: a waiter still in a line leaves it. */
void susp_request_done(atrium_req *r);
void susp_events_free(http_server *s);

#endif
