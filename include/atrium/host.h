/*
 * atrium/host.h - the services the host offers a plugin: one versioned table of function
 * pointers, handed to init() and valid until fini() returns.
 *
 * Growth rule: members are only appended, never inserted, removed, reordered or retyped
 * within a major version. The table starts with its own size, so a plugin built for minor N
 * can test whether a member of minor N+1 exists with ATRIUM_HOST_HAS(host, member).
 *
 * Thread classes, written next to every member:
 *   [init] only inside the plugin's init() callback (main thread, before listening).
 *   [req]  only on the thread that currently owns the request: the thread running its
 *          handler. After a handler hands a request off or parks it, the handing thread
 *          must not touch the request again (another thread may already own it).
 *   [any]  any thread; thread-safe.
 *
 * Ownership: strings and memory obtained from a request (req_*, and req_alloc) belong to
 * the request and stay valid until it ends - after its holds were released and after the
 * last handler run returned - ; never free them. Handles created in init
 * (pools, budgets, lines, events, metrics, rate limiters) belong to the host and live
 * until the server exits. Errors are negative enum atrium_err values (atrium/abi.h).
 *
 * What a handler must not do: block on another server on a request-pool thread (use the
 * outbound budget, or hand off to a pool), call libmicrohttpd, install signal handlers,
 * call curl_global_init, or exit().
 */
#ifndef ATRIUM_HOST_H
#define ATRIUM_HOST_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "atrium/abi.h"
#include "atrium/plugin.h"

typedef struct atrium_req atrium_req;         /* one HTTP request */
typedef struct atrium_pool atrium_pool;       /* a plugin's thread pool */
typedef struct atrium_budget atrium_budget;   /* in-flight counter: global + per client key */
typedef struct atrium_line atrium_line;       /* admission line: slots + fair parked queue */
typedef struct atrium_event atrium_event;     /* something parked requests wait for */
typedef struct atrium_metric atrium_metric;   /* a Prometheus counter or gauge */
typedef struct atrium_ratelimit atrium_ratelimit;
typedef struct atrium_lease atrium_lease;     /* a once-only job's lease (1.3) */
typedef struct atrium_flights atrium_flights; /* work in flight by key (1.8) */
typedef struct atrium_flight atrium_flight;   /* one piece of that work (1.8) */

/* A SHA-256 computation in progress (1.5, host->sha256_*): opaque, the caller's memory.
 * Its size and alignment are part of the ABI (tests/unit/test_abi.c). */
typedef struct atrium_sha256 {
    uint64_t opaque[16];
} atrium_sha256;
#define ATRIUM_SHA256_BYTES 32      /* a digest */
#define ATRIUM_SHA256_HEX_BYTES 65  /* its hex, with the NUL */

/* ---- routes ------------------------------------------------------------------------- */

/* What a handler returns: one of these outcomes, or a negative atrium_err (the core then
 * answers 500 M_UNKNOWN, or 503 while stopping, and logs it). */
enum atrium_outcome {
    ATRIUM_DONE = 0,       /* a respond_* call set the response */
    ATRIUM_PARKED = 1,     /* park() or line_admit() parked the request: it will run again */
    ATRIUM_HANDED_OFF = 2, /* handoff() moved the request to a pool: it will run there */
    /* (1.5) Never returned by a handler: what a step of one answers when the handler goes
     * on. ATRIUM_DONE is 0, so a helper that returns 0 for "go on" and ATRIUM_DONE after
     * answering cannot be told apart; the convention is that a step (admit, authenticate,
     * look up) returns ATRIUM_CONTINUE, or the outcome the handler returns at once:
     *     if ((rc = step(req)) != ATRIUM_CONTINUE) return rc;
     * A handler that returns it anyway is treated like ATRIUM_DONE (its response is sent,
     * else 500). A value, not a host member: it works on every 1.x host. */
    ATRIUM_CONTINUE = 3,
};

/* Why a handler runs (req_run_reason). A handler runs again from the top every time a
 * parked request is woken or a handed-off request starts on its pool, so it must be cheap
 * and idempotent up to the point where it parked or handed off. */
enum atrium_run_reason {
    ATRIUM_RUN_FIRST = 0,    /* the request just arrived */
    ATRIUM_RUN_WOKEN = 1,    /* the event it parked on was signalled */
    ATRIUM_RUN_GRANTED = 2,  /* the admission line gave it a slot */
    ATRIUM_RUN_DEADLINE = 3, /* its park deadline passed */
    ATRIUM_RUN_HANDOFF = 4,  /* it runs on the pool it was handed to */
    ATRIUM_RUN_SHUTDOWN = 5, /* the server is stopping: answer now (503 is fine) */
};

typedef int (*atrium_handler)(atrium_req *req);

/* Flags for atrium_route.flags. route_add refuses bits it does not know (ATRIUM_E_INVAL). */
#define ATRIUM_ROUTE_STREAM_BODY 0x1u /* deliver the body to body_chunk as it arrives */
/* A route other servers call (1.1): served on the federation listener only, and the core
 * verifies the request's X-Matrix signature before the handler runs (req_origin then names
 * the verified server). A missing or bad signature is answered 401 M_UNAUTHORIZED (403
 * M_FORBIDDEN for a server outside federation.domain_whitelist) without running it. */
#define ATRIUM_ROUTE_FEDERATION 0x2u
/* With ATRIUM_ROUTE_STREAM_BODY (1.2): body_chunk is first called once with data == NULL
 * and len == 0 as soon as the request's headers have arrived, before any byte of the
 * body is read, also when the body is empty. A negative return answers the request at
 * once with whatever respond_* the callback set (else 400), the body is never read and
 * the connection is closed after the answer: a plugin refuses an unauthenticated or
 * unwanted upload (req_authenticate, then return the error) before the client sends it.
 * Not for federation routes (their signature is checked later): ATRIUM_E_INVAL. */
#define ATRIUM_ROUTE_HEADERS_FIRST 0x4u
/* A route whose handed-off work commits what the request brought (an upload: a file and
 * its row) (1.2): once a pool worker runs its handler, that worker alone answers, and the
 * request's deadline or shutdown no longer does, so the client is never told "failed"
 * about work that was done, nor is the request completed (its holds released) while the
 * work still uses them. Work not yet started is still refused at the deadline (504) or
 * shutdown (503). The work must bound its own waits (database calls are bounded by the
 * host's pool). */
#define ATRIUM_ROUTE_COMMITS 0x8u

typedef struct atrium_route {
    const char *method;     /* "GET" (also serves HEAD), "POST", "PUT", "DELETE" */
    const char *path;       /* template: literal segments and {name} segments, e.g.
                               "/_matrix/client/v1/media/download/{server}/{id}" */
    atrium_handler handler; /* required */
    /* 0 = the server's server.http.max_json_body_bytes. Applies to every route, streamed
     * or not: a Content-Length above it is answered 413 M_TOO_LARGE before anything of the
     * plugin runs (not even the ATRIUM_ROUTE_HEADERS_FIRST call); a body without a length
     * that grows past it is answered 413 by the core at the chunk that would pass it.
     * That chunk and the rest never reach body_chunk, the handler never runs, and the
     * plugin is not told otherwise: its holds are released when the 413 has been sent,
     * which is where a streamed upload's temporary file must be cleaned up. A plugin that
     * wants its own 413 message sets this a little above its own limit and answers from
     * body_chunk. */
    int64_t max_body_bytes;
    unsigned flags;
    /* With ATRIUM_ROUTE_STREAM_BODY: called [req] on the connection's request-pool thread
     * for each chunk of the body, in order, before the handler runs (which then runs once
     * the whole body is in, on the same kind of thread). Never called with data for an
     * empty body: the handler runs directly (with ATRIUM_ROUTE_HEADERS_FIRST, after the
     * NULL call). Return 0, or a negative error to answer the request with 400/413
     * (whatever respond_* the callback set, else 400); after a refusal the answer is
     * written at once, the rest of the body is never read, the connection is closed (on
     * a TLS listener without an answer), and the handler never runs. The callback may call the
     * [req] readers (req_header, req_query, req_param, req_route_arg, req_client_key),
     * req_alloc/req_strdup, req_state/req_set_state, req_hold, req_authenticate,
     * req_device, req_is_admin, ratelimit_check, budget_acquire_hold, the respond_*
     * family, and every [any] member; it must not park, line_admit, req_wait or
     * handoff (the request is not a handler's yet), and should keep to quick work: a
     * slow callback slows this upload only, but holds a request-pool thread. */
    int (*body_chunk)(atrium_req *req, const char *data, size_t len);
    void *arg; /* handed back by req_route_arg */
} atrium_route;

/* A scope value published on the receiving thread of a handoff. */
typedef struct atrium_scope_value {
    int key; /* enum atrium_scope_key */
    void *value;
} atrium_scope_value;

/* A migration: owner-relative version numbers start at 1 and never change once shipped. */
typedef struct atrium_migration {
    int version;
    const char *name;
    const char *sql; /* may hold several statements; runs in its owner's one transaction */
} atrium_migration;

/* A streamed body: called on the connection's request-pool thread (so it must not block
 * for long) to fill buf with up to max bytes at position pos. Return the number of bytes
 * written (> 0), ATRIUM_STREAM_END after the last byte, or ATRIUM_STREAM_ERROR to abort
 * the connection. Returning 0 is not allowed (it would spin). */
#define ATRIUM_STREAM_END (-1)
#define ATRIUM_STREAM_ERROR (-2)
/* (1.3) Only from the reader of respond_stream_wait: no bytes yet, not finished. */
#define ATRIUM_STREAM_WAIT (-3)
typedef int64_t (*atrium_stream_read)(void *arg, uint64_t pos, char *buf, size_t max);

/* ---- federation (1.1) ---------------------------------------------------------------- */

/* How a federation request ended (atrium_fed_response.outcome): ATRIUM_FED_OK when the
 * other server answered (any HTTP status), else one of the failures. */
enum atrium_fed_outcome {
    ATRIUM_FED_OK = 0,
    ATRIUM_FED_E_TIMEOUT = -1,     /* the deadline passed */
    ATRIUM_FED_E_CONNECT = -2,     /* no connection could be made */
    ATRIUM_FED_E_TLS = -3,         /* TLS or certificate verification failed */
    ATRIUM_FED_E_BLOCKED = -4,     /* the address is blacklisted (federation.ip_range_*) */
    ATRIUM_FED_E_TOO_LARGE = -5,   /* the answer passed max_body_bytes */
    ATRIUM_FED_E_PROTOCOL = -6,    /* a malformed HTTP answer, or cut off */
    ATRIUM_FED_E_CANCELLED = -7,   /* on_chunk refused, or the server is stopping */
    ATRIUM_FED_E_INTERNAL = -8,    /* out of memory, the outbound queue full */
    ATRIUM_FED_E_BACKOFF = -20,    /* the server failed recently and was not contacted */
    ATRIUM_FED_E_NOT_ALLOWED = -21, /* this server, or not in federation.domain_whitelist */
    ATRIUM_FED_E_RESOLVE = -22,    /* server discovery found nowhere to connect */
    ATRIUM_FED_E_NOT_JSON = -23,   /* ATRIUM_FED_JSON: the body is not a JSON object */
};

/* Flags for atrium_fed_request.flags. */
#define ATRIUM_FED_UNSIGNED 0x1u       /* send no X-Matrix signature */
#define ATRIUM_FED_IGNORE_BACKOFF 0x2u /* a user's explicit action: ask even when backed off */
#define ATRIUM_FED_JSON 0x4u           /* parse the answer as a JSON object (into .json) */
/* URL requests only: also accept http:// URLs (default port 80); the blacklist applies as
 * always. A host older than this flag ignores it and refuses http with ATRIUM_E_INVAL. */
#define ATRIUM_FED_ALLOW_HTTP 0x8u

typedef struct atrium_fed_response {
    int outcome;            /* enum atrium_fed_outcome */
    int status;             /* the HTTP status when outcome == ATRIUM_FED_OK */
    const json_t *json;     /* with ATRIUM_FED_JSON: the parsed body (borrowed) */
    const char *body;       /* the buffered body, NUL-terminated (NULL with on_chunk) */
    size_t body_len;
    const char *error;      /* a sentence for the log when outcome != OK */
    const char *destination;
    void *internal;         /* for fed_response_header */
} atrium_fed_response;

typedef struct atrium_fed_request {
    uint32_t size;           /* sizeof(atrium_fed_request): the struct grows by appending */
    const char *method;      /* "GET", "PUT", "POST", "DELETE" */
    const char *destination; /* a server name: discovery, backoff and the signature follow it */
    const char *uri;         /* path and query as sent, "/_matrix/federation/v1/..." */
    const json_t *body;      /* JSON content (copied, signed), or NULL */
    int64_t deadline_ms;     /* monotonic (now_ms); 0 = federation.client.request_timeout_ms */
    int64_t max_body_bytes;  /* 0 = 16 MiB */
    unsigned flags;          /* ATRIUM_FED_* */
    /* Optional streaming: each chunk of the answer's body as it arrives (res carries the
     * status; fed_response_header works); return 0 to go on, non-zero to abort. */
    int (*on_chunk)(void *arg, const atrium_fed_response *res, const char *data, size_t len);
    /* Called exactly once when the request ends, if and only if fed_request returned 0. */
    void (*on_done)(void *arg, const atrium_fed_response *res);
    void *arg;
    /* == appended in 1.1 (test the size with ATRIUM_FED_REQUEST_HAS) ================= */
    /* An absolute "https://host[:port]/path?query" to GET instead of destination + uri:
     * where another server said its content lives (a Location). Sent unsigned, without
     * backoff or the domain whitelist (it need not be a Matrix server); the host is looked
     * up like a server name with an explicit port (default 443) and the address blacklist
     * applies at connect as for every outbound request. destination and uri are ignored
     * (may be NULL). User info and relative URLs are ATRIUM_E_INVAL, and so are http://
     * URLs unless flags has ATRIUM_FED_ALLOW_HTTP (then sent in the clear, port 80 by
     * default, under the same blacklist, deadline and size bound). */
    const char *url;
} atrium_fed_request;

/* Does this request struct carry `member` (a plugin built for an older 1.1)? */
#define ATRIUM_FED_REQUEST_HAS(q, member)                                                  \
    ((q)->size >= offsetof(atrium_fed_request, member) + sizeof((q)->member))

/* ---- the host table ------------------------------------------------------------------ */

struct atrium_host {
    uint32_t size; /* sizeof(struct atrium_host) in this host */
    uint16_t abi_major, abi_minor;

    /* == 1.0: server, logging, configuration ========================================== */

    /* [any] The server name (e.g. "example.org"). Owned by the host. */
    const char *(*server_name)(void);
    /* [any] Log one line under the plugin's name; the request id is added when the calling
     * thread works for a request. level: enum atrium_log_level. */
    void (*log)(atrium_plugin *self, int level, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
    /* [any] Monotonic milliseconds (for deadlines and durations; not a date: wall_ms). */
    int64_t (*now_ms)(void);

    /* [init] Read plugins.<name>.<key> from the subtree given to init. When absent, *out
     * gets def and 0 is returned. On a wrong type or out-of-range value the host logs one
     * line naming the key, the file and line, and the allowed range, and returns
     * ATRIUM_E_INVAL: return that from init. `*out` strings belong to the host and live
     * until the server exits (after fini). Values are handed over as written: a relative
     * path is relative to the server's working directory. */
    int (*config_int)(atrium_plugin *self, const atrium_config *cfg, const char *key,
                      int64_t def, int64_t min, int64_t max, int64_t *out);
    int (*config_bool)(atrium_plugin *self, const atrium_config *cfg, const char *key,
                       bool def, bool *out);
    int (*config_string)(atrium_plugin *self, const atrium_config *cfg, const char *key,
                         const char *def, const char **out);
    /* [init] Refuse keys of the subtree not in `allowed` (NULL-terminated; "enabled" and
     * "path" are always allowed). Logs the first unknown key with its place and a
     * did-you-mean, and returns ATRIUM_E_INVAL. */
    int (*config_check_keys)(atrium_plugin *self, const atrium_config *cfg,
                             const char *const *allowed);

    /* [init] Register a route. The route struct is copied; its strings must be static. A
     * method+path already registered (by the core or another plugin) is ATRIUM_E_EXISTS
     * and stops start-up with a line naming both owners. */
    int (*route_add)(atrium_plugin *self, const atrium_route *route);

    /* [init] Register this plugin's SQL migrations (owner = the plugin's name). The host
     * applies the pending ones in order, all in one transaction (a failure applies none of
     * them), before start(), serialized across processes by an advisory lock. `list` must
     * stay valid (static). */
    int (*db_migrations)(atrium_plugin *self, const atrium_migration *list, size_t n);

    /* == 1.0: the request =============================================================== */

    /* [req] Method ("GET", "HEAD", ...), path (percent-decoded), a path parameter by its
     * template name, a query parameter (decoded; NULL when absent; the first occurrence
     * when the name repeats), a header (case-insensitive; NULL when absent). All owned by
     * the request. */
    const char *(*req_method)(atrium_req *req);
    const char *(*req_path)(atrium_req *req);
    const char *(*req_param)(atrium_req *req, const char *name);
    const char *(*req_query)(atrium_req *req, const char *name);
    const char *(*req_header)(atrium_req *req, const char *name);
    /* [req] The buffered body (NUL-terminated for convenience; *len excludes the NUL).
     * Empty for ATRIUM_ROUTE_STREAM_BODY routes. */
    const char *(*req_body)(atrium_req *req, size_t *len);
    /* [req] The body parsed as a JSON object, owned by the request. On failure the host
     * has already set a 400 M_NOT_JSON response and returns NULL: return ATRIUM_DONE. */
    json_t *(*req_json)(atrium_req *req);
    /* [req] The client key: the authenticated user ID, else the client's address
     * (X-Forwarded-For honoured only from server.http.trusted_proxies). */
    const char *(*req_client_key)(atrium_req *req);
    const char *(*req_id)(atrium_req *req);
    void *(*req_route_arg)(atrium_req *req);
    int (*req_run_reason)(atrium_req *req); /* enum atrium_run_reason */
    /* [req] Memory freed when the request ends (never free it yourself); NULL on OOM. */
    void *(*req_alloc)(atrium_req *req, size_t size);
    char *(*req_strdup)(atrium_req *req, const char *s);
    /* [req] A pointer of the plugin's that survives re-runs of the handler (parks and
     * handoffs); typically req_alloc'd. */
    void *(*req_state)(atrium_req *req);
    void (*req_set_state)(atrium_req *req, void *state);
    /* [req] Attach a hold: `release(arg)` is called exactly once, on a request-pool
     * thread, when the response's last byte was sent, the client went away, or the
     * request failed (a 413 from the core included). A hold attached after the request
     * ended (ATRIUM_E_EXPIRED) or that finds no memory (ATRIUM_E_NOMEM) is released at
     * once, on the calling thread, before req_hold returns: whatever req_hold returns,
     * the release has run or will run, exactly once. Holds are released in reverse order,
     * before the request's memory (req_alloc) is freed, so arg may point into it.
     * A handed-off handler still running on its pool when the core answered the request
     * (its deadline passed: 504; or shutdown: 503) keeps its holds until it returns: they
     * are then released on that pool thread, never under a running handler. Such a
     * handler sees respond_* return ATRIUM_E_EXPIRED and req_hold release at once. */
    int (*req_hold)(atrium_req *req, void (*release)(void *arg), void *arg);
    /* [req] Authenticate the request by its access token (Authorization: Bearer, or
     * ?access_token=). Returns the user ID (owned by the request; from then on it is the
     * request's client key). On failure the host has set the response (401 M_MISSING_TOKEN
     * or M_UNKNOWN_TOKEN, 503 when the database is unreachable; all with Cache-Control:
     * no-store) and returns NULL: return
     * ATRIUM_DONE. Looks the token up in PostgreSQL (a short wait at most), so a revoked
     * token is refused at once; a second call on the same request is free. */
    const char *(*req_authenticate)(atrium_req *req);
    /* [req] The device ID of the authenticated access token, or NULL. */
    const char *(*req_device)(atrium_req *req);
    /* [req] 1 when the authenticated user is a server admin, 0 otherwise. */
    int (*req_is_admin)(atrium_req *req);

    /* == 1.0: responses ================================================================= */
    /* Each respond_* sets the request's one response; a second call replaces the first.
     * On a pool thread after the request's deadline passed (the core answered 504
     * already) they return ATRIUM_E_EXPIRED and drop what they were given. */

    /* [req] Add a header to the response being built (before or after respond_*). */
    int (*respond_header)(atrium_req *req, const char *name, const char *value);
    /* [req] JSON body; steals the reference to `body`. */
    int (*respond_json)(atrium_req *req, int status, json_t *body);
    /* [req] Bytes, copied. */
    int (*respond_buffer)(atrium_req *req, int status, const char *content_type,
                          const void *data, size_t len);
    /* [req] `len` bytes of the open file `fd` from `offset`, sent with sendfile where the
     * platform allows. Takes ownership of fd (closed when the response is done, even on
     * error). */
    int (*respond_file)(atrium_req *req, int status, const char *content_type, int fd,
                        uint64_t offset, uint64_t len);
    /* [req] A body produced by `read` (size -1 = unknown, sent chunked). free_arg(arg) is
     * called once when the response is destroyed (also on error). */
    int (*respond_stream)(atrium_req *req, int status, const char *content_type,
                          int64_t size, atrium_stream_read read, void *arg,
                          void (*free_arg)(void *arg));
    /* [req] A Matrix error {"errcode", "error"} with Cache-Control: no-store. */
    int (*respond_error)(atrium_req *req, int status, const char *errcode, const char *fmt,
                         ...) __attribute__((format(printf, 4, 5)));
    /* [req] 429 M_LIMIT_EXCEEDED with retry_after_ms, Retry-After (seconds, rounded up)
     * and Cache-Control: no-store. */
    int (*respond_limited)(atrium_req *req, int64_t retry_after_ms, const char *message);

    /* == 1.0: scopes ==================================================================== */

    /* [any] The calling thread's innermost value for key (enum atrium_scope_key), or NULL.
     * Handlers run with ATRIUM_SCOPE_REQUEST, _REQUEST_ID, _CLIENT_KEY and _DEADLINE
     * published, plus whatever values the handoff that started them carried. */
    void *(*scope_get)(int key);
    /* [any] Wait on cv (the caller holds its mutex m) until signalled or deadline_ms
     * (monotonic; <= 0 = none), releasing the lock published as ATRIUM_SCOPE_LOCK while
     * waiting. 0 when signalled, ATRIUM_E_TIMEOUT at the deadline. cv must be created with
     * cond_init. */
    int (*scope_wait)(pthread_cond_t *cv, pthread_mutex_t *m, int64_t deadline_ms);
    int (*cond_init)(pthread_cond_t *cv); /* [any] a CLOCK_MONOTONIC condition variable */

    /* == 1.0: pools and handoff ========================================================= */

    /* [init] A named pool of at most `threads` workers (started as tasks arrive, then
     * kept) with a queue of `queue_depth` tasks. The host starts it before start() and
     * stops and joins it after stop(). Metrics
     * atrium_pool_{threads,threads_limit,busy,queued,queue_limit,refused_total}{pool="<plugin>.<name>"}. */
    atrium_pool *(*pool_create)(atrium_plugin *self, const char *name, int threads,
                                int queue_depth);
    /* [any] Run fn(arg, cancelled) on the pool. Never blocks: ATRIUM_E_LIMIT when the queue
     * is full, ATRIUM_E_STOPPED after the pool stopped (fn is then never called). A task
     * accepted before a stop runs with cancelled=true and must only clean up. */
    int (*pool_submit)(atrium_pool *pool, void (*fn)(void *arg, bool cancelled), void *arg);
    /* [any] Stop the pool early: refuse new work; queued work runs cancelled. */
    void (*pool_stop)(atrium_pool *pool);
    /* [req] Move the request to `pool`: the connection is suspended (no thread waits for
     * it) and the route's handler runs again on a pool thread, with run reason
     * ATRIUM_RUN_HANDOFF and `vals` published in its scope (copied; n <= 8). Returns 0:
     * return ATRIUM_HANDED_OFF and do not touch req again. ATRIUM_E_LIMIT (queue full) or
     * ATRIUM_E_STOPPED: nothing happened; answer the request yourself (429/503). The core
     * answers 504 if the handler has not answered by the request's deadline
     * (server.http.handoff_deadline_ms), 503 if the pool stops first, and drops the work
     * if the client has gone before a worker picks it up. */
    int (*handoff)(atrium_req *req, atrium_pool *pool, const atrium_scope_value *vals,
                   size_t n);

    /* == 1.0: parking =================================================================== */

    /* [init] An event parked requests can wait for. */
    atrium_event *(*event_create)(atrium_plugin *self);
    /* [req] Park the request on ev until it is signalled or deadline_ms (monotonic) passes:
     * the connection is suspended and no thread waits. Returns 0: return ATRIUM_PARKED and
     * do not touch req again; the handler later runs again on a request-pool thread with
     * reason ATRIUM_RUN_WOKEN, _DEADLINE or _SHUTDOWN. ATRIUM_E_STOPPED while stopping.
     * The deadline is capped at 10 minutes from now. */
    int (*park)(atrium_req *req, atrium_event *ev, int64_t deadline_ms);
    /* [any] Wake every request parked on ev; returns how many. */
    int (*event_signal)(atrium_event *ev);

    /* == 1.0: budgets, admission lines, outbound budget, rate limits ===================== */

    /* [init] global_cap in flight in all, per_key_cap per client key. Metrics
     * atrium_budget_{in_use,limit,refused_total}{budget="<plugin>.<name>"}. */
    atrium_budget *(*budget_create)(atrium_plugin *self, const char *name, int global_cap,
                                    int per_key_cap);
    /* [any] Take a slot for key without blocking: 0, or ATRIUM_E_LIMIT. */
    int (*budget_try_acquire)(atrium_budget *b, const char *key);
    void (*budget_release)(atrium_budget *b, const char *key); /* [any] */
    /* [req] Take a slot for the request's client key and attach it as a hold. */
    int (*budget_acquire_hold)(atrium_req *req, atrium_budget *b);

    /* [init] An admission line: `slots` requests at a time; up to `max_waiting` more wait
     * parked (at most `max_waiting_per_key` of one client key; 0 = no per-key cap), served
     * round-robin across client keys, each for at most `max_wait_ms`. Metrics
     * atrium_line_{slots,in_use,waiting,refused_total,timed_out_total}{line="<plugin>.<name>"}. */
    atrium_line *(*line_create)(atrium_plugin *self, const char *name, int slots,
                                int max_waiting, int max_waiting_per_key,
                                int64_t max_wait_ms);
    /* [req] Enter the line; call it first thing in the handler, on every run.
     *   ATRIUM_OK        a slot is held (as a hold: released after the last byte);
     *   ATRIUM_PARKED    the request waits: return ATRIUM_PARKED; the handler runs again
     *                    (reason _GRANTED or _DEADLINE) and calls line_admit again;
     *   ATRIUM_E_LIMIT   the line is full: answer with respond_limited;
     *   ATRIUM_E_TIMEOUT it waited max_wait_ms without a slot: answer 429 too;
     *   ATRIUM_E_STOPPED the server is stopping: answer 503. */
    int (*line_admit)(atrium_req *req, atrium_line *line);

    /* [req] The outbound budget (ADR-0079, docs/adr/0079-outbound-budget.md) for a handler
     * on a request-pool thread that will
     * wait on another server: at most half the request pool across all clients and one per
     * client key. 0 = the slot is held until the answer is queued (or the request ends
     * unanswered); ATRIUM_E_LIMIT = answer 429 at once (respond_limited), never wait. */
    int (*outbound_acquire)(atrium_req *req);

    /* [init] A token bucket per client key: per_second refill, burst capacity. Metrics
     * atrium_ratelimit_{refused_total,keys}{action="<plugin>.<action>"}. */
    atrium_ratelimit *(*ratelimit_create)(atrium_plugin *self, const char *action,
                                          double per_second, double burst);
    /* [req] 0 = allowed; > 0 = refused, retry after that many ms (answer with
     * respond_limited). A request counts once however often its handler runs; requests
     * whose scope has ATRIUM_SCOPE_RATE_ADMITTED are not counted. Always 0 when the
     * operator disabled rate limiting (ratelimit.enabled: false). */
    int64_t (*ratelimit_check)(atrium_req *req, atrium_ratelimit *rl);

    /* == 1.0: metrics =================================================================== */

    /* [init] Register a metric. `name` must start with "atrium_<plugin name>_"; labels is a
     * Prometheus label list without braces ('kind="x"') or NULL. */
    atrium_metric *(*metric_counter)(atrium_plugin *self, const char *name,
                                     const char *labels, const char *help);
    atrium_metric *(*metric_gauge)(atrium_plugin *self, const char *name, const char *labels,
                                   const char *help);
    /* [any] Add to a counter or gauge; set a gauge. */
    void (*metric_add)(atrium_metric *m, int64_t delta);
    void (*metric_set)(atrium_metric *m, int64_t value);

    /* == 1.0: PostgreSQL ================================================================ */

    /* [any] Borrow a connection from the shared pool, waiting at most timeout_ms (a request
     * handler should pass a short wait and answer 503 on NULL). NULL when none could be had
     * in time or PostgreSQL is unreachable (logged). The connection is the caller's alone
     * until db_release; never hold it across a park, a handoff or a remote call. */
    PGconn *(*db_acquire)(int64_t timeout_ms);
    /* [any] Give it back (a connection left broken is reset before its next use). */
    void (*db_release)(PGconn *conn);

    /* 1.1 and later: appended below this line, never inserted above. */

    /* == 1.1: settings declared once, the configured database wait ====================== */

    /* [init] Read the subtree given to init through the settings table of the plugin's
     * descriptor (atrium_plugin_desc.settings): each row's value, or its default when the
     * key is absent, is stored at base + row.offset (base is the plugin's own settings
     * struct; strings stored there belong to the host). Keys no row declares (besides
     * "enabled" and "path") are refused as config_check_keys refuses them, so a plugin
     * using this needs no config_check_keys call. On a wrong type, an out-of-range value,
     * an unknown key or a malformed table the host logs one line naming the key, the file
     * and line and what is allowed, and returns ATRIUM_E_INVAL: return that from init.
     * Fields of rows read before the failure may have been written. */
    int (*config_load)(atrium_plugin *self, const atrium_config *cfg, void *base);
    /* [any] How long a request handler should wait for a database connection
     * (db_acquire): the operator's database.checkout_timeout_ms, the same wait the core's
     * own request paths use. Always > 0. */
    int64_t (*db_wait_ms)(void);

    /* == 1.1: federation ================================================================ */
    /* Routes flagged ATRIUM_ROUTE_FEDERATION are served on the federation listener, after
     * the core verified their X-Matrix signature. */

    /* [req] The other server whose signature the core verified for this request (a
     * federation route), or NULL. Owned by the request. */
    const char *(*req_origin)(atrium_req *req);
    /* [any] Send a request to another server: the domain whitelist and backoff are
     * checked, the destination discovered, the request signed (unless ATRIUM_FED_UNSIGNED)
     * and sent through the core's one outbound client, whose connection caps and address
     * blacklist apply. Never blocks. 0: on_done (and on_chunk) will be called on an
     * internal thread, where they must be quick and never block (no PostgreSQL, no waits);
     * on_done may even run before this returns. ATRIUM_E_INVAL (a malformed request),
     * ATRIUM_E_LIMIT (the outbound queue is full), ATRIUM_E_STOPPED: nothing is called.
     * A request handler that needs the answer parks with req_wait and has on_done call
     * req_wake. The request struct and its strings are copied. */
    int (*fed_request)(const atrium_fed_request *req);
    /* [any] Inside on_chunk or on_done: a header of the answer (case-insensitive), or NULL. */
    const char *(*fed_response_header)(const atrium_fed_response *res, const char *name);
    /* [req] Park the request until req_wake (or its deadline, capped at 10 minutes): no
     * thread waits, and the handler runs again with reason _WOKEN, _DEADLINE or _SHUTDOWN.
     * Returns 0 (return ATRIUM_PARKED) or ATRIUM_E_STOPPED (nothing happened). Call it
     * before starting what will wake it. Exactly one req_wake must follow a 0, even after
     * the deadline already ran the handler again: the request stays valid until then. */
    int (*req_wait)(atrium_req *req, int64_t deadline_ms);
    /* [any] Wake a request parked with req_wait (once per req_wait). */
    void (*req_wake)(atrium_req *req);
    /* [any] Sign obj (a JSON object) as this server: adds signatures.<server name>.<key
     * id>, keeping other signatures. 0, or ATRIUM_E_INVAL (not an object, or no canonical
     * JSON encoding: floats, integers past 2^53). */
    int (*fed_sign_json)(json_t *obj);
    /* [any] Check that obj carries a valid signature of server_name by a key valid at
     * valid_at_ms (wall clock; for a request, now). The key comes from the core's key
     * cache, or is fetched: done(arg, 0 or a negative error, a reason) is called exactly
     * once, possibly before this returns, else on an internal thread (quick, never
     * blocking). ATRIUM_E_INVAL when obj is not an object: done is not called then. */
    int (*fed_verify_json)(const json_t *obj, const char *server_name, int64_t valid_at_ms,
                           void (*done)(void *arg, int result, const char *why), void *arg);

    /* == 1.1: interfaces between plugins and the core =================================== */
    /* An interface is a static struct of function pointers whose first two fields are
     * `uint32_t size` (sizeof the struct the provider was built with; the struct only
     * grows by appending) and `uint32_t version` (the interface's minor version), named
     * "<interface>/<major>" ("directory/1"). Its header lives in include/atrium/, so a
     * replacement plugin can provide the same interface and any caller can use it. The
     * core provides "rooms/1" (atrium/rooms.h). */

    /* [init] Provide `iface` under `name`, which must be the descriptor's `provides` (a
     * plugin provides one interface). `iface` must stay valid until the server exits and
     * its functions must be callable from any thread once start() ran. ATRIUM_E_INVAL (name
     * is not this plugin's `provides`, or size < 8), ATRIUM_E_EXISTS (already provided). */
    int (*iface_provide)(atrium_plugin *self, const char *name, const void *iface);
    /* [any] The interface provided under `name`, or NULL when no enabled plugin (or the
     * core) provides it, or the provider's struct is smaller than min_size (built for an
     * older minor that lacks members the caller needs). Complete once every plugin's init
     * ran: call it in start() or later (a request handler), and keep the pointer. */
    const void *(*iface_get)(const char *name, uint32_t min_size);

    /* == 1.3: several processes on one database (docs/architecture.md) ================== */
    /* Processes that share one PostgreSQL (and one media store) tell each other what
     * changed through notifications (PostgreSQL LISTEN/NOTIFY on one listening connection
     * per process) and run once-only jobs under leases. A member left NULL is not offered
     * by this host (test with ATRIUM_HOST_HAS). */

    /* [any] This process's instance name (config server.instance_name), as it appears in
     * its log lines and metrics. */
    const char *(*instance_name)(void);
    /* [init] Call cb(arg, payload) for every notification published on `channel` by any
     * process sharing the database, this one included. `channel` is 1-40 characters of
     * [a-z0-9_.]; the host scopes it to the plugin (two plugins cannot collide). cb runs on
     * the core's notification thread and must not block: signal an atrium_event, wake a
     * request, queue work. Each time the listening connection comes up (the first time,
     * and again after it was lost), every subscriber's cb is called once with payload NULL
     * before notify_live says 1: notifications may have been missed (nobody listened), so
     * revalidate whatever they keep fresh. cb is never called after the plugin's stop
     * begins. ATRIUM_E_INVAL (bad channel or NULL cb), ATRIUM_E_STATE (not in init),
     * ATRIUM_E_LIMIT (too many subscriptions in the process). */
    int (*notify_subscribe)(atrium_plugin *self, const char *channel,
                            void (*cb)(void *arg, const char *payload), void *arg);
    /* [any] Publish `payload` (text, at most ATRIUM_NOTIFY_MAX_PAYLOAD bytes; IDs and
     * positions, never the data itself) on `channel`. With `conn` (from db_acquire, inside
     * a transaction the caller opened) it is delivered when that transaction commits and
     * never if it rolls back (a failure aborts that transaction); with conn NULL it is sent
     * at once on a pooled connection, waiting at most db_wait_ms() for one (call it after
     * your own commit). Delivery is at most once: a process whose listening connection is
     * down misses it and learns so from the NULL call above. ATRIUM_E_INVAL (bad channel or
     * payload), ATRIUM_E_DB (no connection, or the statement failed). */
    int (*notify_publish)(atrium_plugin *self, PGconn *conn, const char *channel,
                          const char *payload);
    /* [any] 1 while this process's listening connection is up, 0 while it is down (then
     * notifications are being missed: a cache kept fresh by them must be bypassed). */
    int (*notify_live)(void);
    /* [init] A lease named `name` (1-40 characters of [a-z0-9_.], scoped to the plugin):
     * at most one process sharing the database holds it at a time. The host takes and
     * renews it in the background (every ttl_ms / 4, on a core thread, with one statement
     * on a pooled connection borrowed for that statement only); when its holder dies or
     * loses the database, another process takes it over within ttl_ms; a process that
     * stops gives its leases up first. The lease belongs to the host (never freed by the
     * plugin; valid until the plugin's fini). NULL on a bad name or ttl (1 s to 10 min),
     * a name this plugin already used, or outside init (logged). */
    atrium_lease *(*lease_create)(atrium_plugin *self, const char *name, int64_t ttl_ms);
    /* [any] 1 when this process holds the lease now, 0 otherwise (and for NULL). Never
     * waits. Check it before each run of the job it guards, and keep a run well under
     * ttl_ms / 2: a run already going when the lease moves is not stopped. */
    int (*lease_held)(atrium_lease *lease);

    /* == 1.3: a streamed response that waits for its bytes ============================== */

    /* [req] Like respond_stream, and `read` may also return ATRIUM_STREAM_WAIT: no bytes
     * at pos yet, not finished (a file still being written). The connection is then
     * suspended - no thread waits, nothing polls - until `ev` (event_create) is signalled,
     * when read is called again at the same pos; so signal ev after every write a reader
     * may be waiting for (a signal that comes between read's WAIT and the suspension is
     * not lost: the host compares ev's signal count). Several streams (and parked
     * requests) may share one event: a reader woken for another's bytes just answers WAIT
     * again. A stream still waiting at deadline_ms (monotonic, capped at 10 minutes from
     * now), or one whose read answers WAIT after it, or ATRIUM_STREAM_ERROR, ends the
     * response before its end: with a size, the connection closes before size bytes;
     * with size -1 (chunked), without the last chunk - either way a client can tell the
     * body is truncated. Shutdown cuts waiting streams the same way. read runs on the
     * connection's request-pool thread (quick, never blocking); free_arg(arg) is called
     * once when the response is destroyed (also on error, and when this returns an error:
     * ATRIUM_E_INVAL without read or ev, ATRIUM_E_NOMEM). Metrics
     * atrium_http_streams_waiting and atrium_http_streams_cut_total. */
    int (*respond_stream_wait)(atrium_req *req, int status, const char *content_type,
                               int64_t size, atrium_stream_read read, void *arg,
                               void (*free_arg)(void *arg), atrium_event *ev,
                               int64_t deadline_ms);

    /* == 1.4: the server-name grammar ================================================ */

    /* [any] 1 when `name` is a server name by the spec's grammar (Appendices, "Server
     * Name": a host name of non-empty labels of letters, digits and '-', an IPv4 address
     * or an [IPv6] address, with an optional :port 1-65535; 1-255 characters), 0 otherwise
     * (NULL, "..", "a..b", "host/path"). The core's own check, the one its endpoints and
     * server discovery use: a plugin that refuses with it a name taken from a request
     * (answer 400 M_INVALID_PARAM) refuses exactly what the core would, before asking
     * that server anything. Never waits, no state. */
    int (*server_name_valid)(const char *name);

    /* == 1.5: the wall clock, SHA-256 ================================================= */

    /* [any] Wall-clock milliseconds since the Unix epoch (CLOCK_REALTIME): for dates that
     * are stored or shown (a row's created_ts, an event's origin_server_ts). It may jump
     * when the system clock is set: never for deadlines or durations (now_ms). */
    int64_t (*wall_ms)(void);
    /* [any] SHA-256 of a stream, chunk by chunk, in a context the caller provides (on its
     * stack, in req_alloc memory, in its own struct; no allocation, no state in the host):
     * sha256_init once, sha256_update for each chunk in order (len 0 is fine), then
     * sha256_final writes the ATRIUM_SHA256_BYTES digest (atrium_sha256_hex spells it
     * as the lower-case hex media/1 plugins and verify-media use) and leaves the context
     * to be initialized again. One context is one stream: used by one thread at a time.
     * Return 0, or ATRIUM_E_INVAL for a NULL pointer (data may be NULL when len is 0). */
    int (*sha256_init)(atrium_sha256 *ctx);
    int (*sha256_update)(atrium_sha256 *ctx, const void *data, size_t len);
    int (*sha256_final)(atrium_sha256 *ctx, unsigned char out[ATRIUM_SHA256_BYTES]);

    /* == 1.6: application services ==================================================== */

    /* [req] The id of the application service req authenticates as (its access token is
     * the as_token of a registration listed under app_service_config_files), or NULL (a
     * user's token, no token, a server). The string lives as long as the server. Call it
     * after req_authenticate. */
    const char *(*req_appservice)(atrium_req *req);
    /* [req] 1 when `alias` lies in an exclusive alias namespace of an application service
     * other than the one req authenticates as (req_appservice), 0 otherwise. A plugin
     * that creates aliases answers 1 with 400 M_EXCLUSIVE: only that service may take it. */
    int (*alias_exclusive)(atrium_req *req, const char *alias);
    /* [req] An alias of this server the plugin does not know: when an application service
     * claims it in its namespaces and req has not asked in an earlier run, ask the service
     * (GET /_matrix/app/v1/rooms/{roomAlias}: a bridge creates the room there and then) and
     * return ATRIUM_PARKED, which the handler returns: it runs again once the service
     * answered or the deadline passed, and looks the alias up again. ATRIUM_CONTINUE:
     * nobody to ask, or asked already (the alias stays unknown: answer 404). ATRIUM_DONE
     * after answering (429: too many requests to other servers; 503). No request thread
     * waits. */
    int (*alias_query)(atrium_req *req, const char *alias);

    /* == 1.8: single flight (docs/adr/0029-single-flight.md) ============================ */
    /* One piece of work per key (a fetch, a render, a look-up), however many requests need
     * it: the first request to join a key leads and starts the work; the others park on
     * it (no thread waits) and every one of them gets its result. Each waits within its
     * own deadline: past it the request runs again, answers on its own, and the work goes
     * on for the others. */

    /* [init] A table of at most max_keys pieces of work at once (so as many leaders) and
     * max_waiters requests parked in all on work others lead (both >= 1); past either,
     * flight_join refuses at once. NULL on a bad bound (logged). Metrics atrium_flights_{in_flight,limit,
     * waiters,refused_total,shared_total,left_total}{flights="<plugin>.<name>"}. */
    atrium_flights *(*flights_create)(atrium_plugin *self, const char *name, int max_keys,
                                      int max_waiters);
    /* [req] Join the work of key (1-4095 bytes) and park the request on it until the work
     * ends or deadline_ms (monotonic, capped at 10 minutes from now). ATRIUM_FLIGHT_LEAD:
     * there was none, *out is new: start the work now (on any thread) and end it with
     * flight_finish, exactly once, also when it cannot start; ATRIUM_FLIGHT_JOINED: it was
     * under way. Either way return ATRIUM_PARKED: the handler runs again (reason _WOKEN,
     * _DEADLINE or _SHUTDOWN) and calls flight_result. *out stays valid until the request
     * ends. flags: 0, or ATRIUM_FLIGHT_JOIN_ONLY (never lead: ATRIUM_E_NOTFOUND when
     * nothing is under way - for leaders that must pass a stricter rule first, a per-user
     * budget, before joining again without the flag). ATRIUM_E_LIMIT (max_keys or
     * max_waiters: answer 429 or 503), ATRIUM_E_STOPPED, ATRIUM_E_NOMEM, ATRIUM_E_INVAL (a
     * bad key or flag): nothing happened. */
    int (*flight_join)(atrium_req *req, atrium_flights *flights, const char *key,
                       int64_t deadline_ms, unsigned flags, atrium_flight **out);
    /* [any] The work of f ended with result (the plugin's own code) and value (NULL, or
     * memory the flight now owns: free_value(value) runs once no request refers to it any
     * more): every request parked on f is woken. From now on a join of its key starts new
     * work (a result to remember is the plugin's cache). Once per flight. */
    void (*flight_finish)(atrium_flight *f, int result, void *value,
                          void (*free_value)(void *value));
    /* [req] In the run after flight_join's park: 0 with *result and *value (either pointer
     * may be NULL; value shared by every waiter: read it, never change it) once f ended;
     * ATRIUM_E_TIMEOUT (the request's deadline ran it) or ATRIUM_E_STOPPED (shutdown) when
     * it has not: the request no longer waits - answer it (504, 503) - and f goes on for the
     * others. ATRIUM_E_INVAL when req did not join f. */
    int (*flight_result)(atrium_req *req, atrium_flight *f, int *result, void **value);
    /* [any] Requests still parked on f whose deadline has not passed: 0 = nobody waits
     * any more (work not yet begun need not begin; end it with flight_finish anyway). */
    int (*flight_wanted)(atrium_flight *f);

    /* == 1.9: a flight's early result (docs/adr/0029-single-flight.md) =================== */
    /* Work whose result is useful before its end (a file some may read while it lands)
     * releases its waiters in two steps. A request that joins with ATRIUM_FLIGHT_EARLY is
     * woken by the early result as well as by the end (whichever comes first); without it,
     * only by the end. flight_join with ATRIUM_FLIGHT_EARLY while the early result is out
     * answers ATRIUM_FLIGHT_PUBLISHED: not parked, call flight_result now. flight_result
     * answers ATRIUM_FLIGHT_RESULT_EARLY (1) with the early result and value instead of 0. */

    /* [any] f's early result: result and value (NULL, or memory the flight owns from here,
     * freed with the flight by free_value, like flight_finish's). Every request parked on f
     * with ATRIUM_FLIGHT_EARLY is woken; the others wait for the end. 0, or ATRIUM_E_STATE:
     * f published once already (once per flight; value untouched). Before flight_finish. */
    int (*flight_publish)(atrium_flight *f, int result, void *value,
                          void (*free_value)(void *value));
    /* [any] The early result went stale (the work starts over): joins from now on wait for
     * the end; requests already woken keep what they read. */
    void (*flight_unpublish)(atrium_flight *f);
};

#define ATRIUM_FLIGHT_JOIN_ONLY 0x1u /* flight_join: only wait for work under way (1.8) */
#define ATRIUM_FLIGHT_EARLY 0x2u /* flight_join: be woken by the early result too (1.9) */
/* flight_join: only take an early result that is out now: ATRIUM_FLIGHT_PUBLISHED, or
 * ATRIUM_E_NOTFOUND without parking (1.9) */
#define ATRIUM_FLIGHT_EARLY_ONLY 0x4u
#define ATRIUM_FLIGHT_RESULT_EARLY 1 /* flight_result: the early result (1.9) */

/* What flight_join made of the request (1.8). */
enum atrium_flight_role {
    ATRIUM_FLIGHT_LEAD = 1,   /* start the work, then flight_finish it */
    ATRIUM_FLIGHT_JOINED = 2, /* the work was under way */
    ATRIUM_FLIGHT_PUBLISHED = 3, /* its early result is out: not parked, read it now (1.9) */
};

/* The lower-case hex of a SHA-256 digest, NUL-terminated, into `out` (1.5; no host call). */
static inline void atrium_sha256_hex(const unsigned char digest[ATRIUM_SHA256_BYTES],
                                     char out[ATRIUM_SHA256_HEX_BYTES])
{
    static const char DIGITS[] = "0123456789abcdef";
    for (int i = 0; i < ATRIUM_SHA256_BYTES; i++) {
        out[2 * i] = DIGITS[digest[i] >> 4];
        out[2 * i + 1] = DIGITS[digest[i] & 0xf];
    }
    out[2 * ATRIUM_SHA256_BYTES] = '\0';
}

/* The longest payload notify_publish accepts, in bytes. */
#define ATRIUM_NOTIFY_MAX_PAYLOAD 1000

/* Does this host offer `member`? (For plugins that target an older minor.) */
#define ATRIUM_HOST_HAS(h, member)                                                         \
    ((h)->size >= offsetof(struct atrium_host, member) + sizeof((h)->member) && (h)->member)

#endif
