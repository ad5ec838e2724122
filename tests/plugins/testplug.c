/*
 * tests/plugins/testplug.c - a plugin built only from include/atrium/, used by the
 * integration tests to drive every core mechanism through the public ABI: handoff to its
 * own pool, parking on an event, holds on a slow response, an admission line, the
 * outbound budget against a peer the test controls, a rate limit, PostgreSQL with its
 * own migration, and what a media plugin needs most: a streamed body (with the
 * headers-first call), respond_file, req_authenticate and a response that waits for
 * its bytes (respond_stream_wait; tests/integration/test_plugin_streams.py), notifications
 * between processes (ABI 1.3: /_test/notify, tests/integration/test_multiprocess.py), the
 * SHA-256 and wall clock of ABI 1.5 (on /_test/stream) and a
 * once-only job's lease with the instance name (ABI 1.3: /_test/lease,
 * tests/integration/test_scaleout.py).
 *
 * Compiled several times with different TESTPLUG_NAME / TESTPLUG_PROVIDES to test the
 * loader's duplicate checks. Not shipped.
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "atrium/host.h"

#ifndef TESTPLUG_NAME
#define TESTPLUG_NAME "testplug"
#endif
#ifndef TESTPLUG_PROVIDES
#define TESTPLUG_PROVIDES "test/1"
#endif
#ifndef TESTPLUG_PREFIX
#define TESTPLUG_PREFIX "/_test"
#endif

#define OUTBOUND_PEER_WAIT_MS 15000
#define DB_WAIT_MS 2000
#define STREAM_MAX_BODY_BYTES (1024 * 1024) /* the core answers 413 past it */
#define FILE_BYTES 65536                    /* the file /_test/file serves */
#define FNV_OFFSET 1469598103934665603ull
#define FNV_PRIME 1099511628211ull

static const atrium_host *h;
static atrium_plugin *me;

typedef struct testplug {
    atrium_pool *work;
    atrium_event *bell;
    atrium_line *line;
    atrium_ratelimit *limit;
    atrium_metric *holds;
    atrium_metric *runs_on_pool;
    atrium_metric *stream_holds;          /* holds of /_test/stream not yet released */
    atrium_metric *released_under_handler; /* a hold released while its handler ran */
    atrium_event *tap_ev;                  /* the tap was fed */
} testplug;

static testplug tp;

static const atrium_migration MIGRATIONS[] = {
    {1, "items", "CREATE TABLE testplug_items (id integer PRIMARY KEY, label text NOT NULL)"},
    {2, "seed", "INSERT INTO testplug_items VALUES (1, 'one'), (2, 'two'), (3, 'three')"},
};

static long query_long(atrium_req *req, const char *name, long def)
{
    const char *v = h->req_query(req, name);
    return v ? strtol(v, NULL, 10) : def;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- handoff ---------------------------------------------------------------------- */

static int handoff_or_refuse(atrium_req *req)
{
    atrium_scope_value v[] = {{ATRIUM_SCOPE_FETCH_MODE, (void *)(intptr_t)ATRIUM_FETCH_ADMITTED},
                              {ATRIUM_SCOPE_RATE_ADMITTED, (void *)(intptr_t)1}};
    int rc = h->handoff(req, tp.work, v, 2);
    if (rc == 0) return ATRIUM_HANDED_OFF;
    if (rc == ATRIUM_E_LIMIT) return h->respond_limited(req, 1000, "The test pool is full");
    return h->respond_error(req, 503, "M_UNKNOWN", "The test pool has stopped");
}

/* GET /_test/handoff?sleep_ms=N: runs on the pool, which says where it ran. */
static int get_handoff(atrium_req *req)
{
    if (h->req_run_reason(req) != ATRIUM_RUN_HANDOFF) return handoff_or_refuse(req);
    long ms = query_long(req, "sleep_ms", 0);
    if (ms > 0) sleep_ms(ms);
    h->metric_add(tp.runs_on_pool, 1);
    intptr_t mode = (intptr_t)h->scope_get(ATRIUM_SCOPE_FETCH_MODE);
    json_t *body = json_pack("{s:b, s:I, s:s}", "ran_on_pool", 1, "fetch_mode", (json_int_t)mode,
                             "request", h->req_id(req));
    return h->respond_json(req, 200, body);
}

/* POST /_test/pool/stop */
static int post_pool_stop(atrium_req *req)
{
    h->pool_stop(tp.work);
    return h->respond_json(req, 200, json_pack("{s:b}", "stopped", 1));
}

/* ---- parking ---------------------------------------------------------------------- */

/* GET /_test/park?timeout_ms=N: parks on the bell; says what woke it. */
static int get_park(atrium_req *req)
{
    switch (h->req_run_reason(req)) {
    case ATRIUM_RUN_FIRST: {
        long timeout = query_long(req, "timeout_ms", 30000);
        int rc = h->park(req, tp.bell, h->now_ms() + timeout);
        if (rc == 0) return ATRIUM_PARKED;
        return h->respond_error(req, 503, "M_UNKNOWN", "Cannot park now");
    }
    case ATRIUM_RUN_WOKEN:
        return h->respond_json(req, 200, json_pack("{s:s}", "woken_by", "event"));
    case ATRIUM_RUN_DEADLINE:
        return h->respond_json(req, 200, json_pack("{s:s}", "woken_by", "deadline"));
    default:
        return h->respond_error(req, 503, "M_UNKNOWN", "The server is stopping");
    }
}

/* POST /_test/ring */
static int post_ring(atrium_req *req)
{
    int n = h->event_signal(tp.bell);
    return h->respond_json(req, 200, json_pack("{s:i}", "woken", n));
}

/* ---- holds and streams ------------------------------------------------------------ */

typedef struct pattern {
    uint64_t size;
} pattern;

static int64_t pattern_read(void *arg, uint64_t pos, char *buf, size_t max)
{
    pattern *p = arg;
    if (pos >= p->size) return ATRIUM_STREAM_END;
    size_t n = (size_t)(p->size - pos < max ? p->size - pos : max);
    for (size_t i = 0; i < n; i++) buf[i] = (char)('a' + (pos + i) % 26);
    return (int64_t)n;
}

/* The tap: bytes the test feeds (POST /_test/tap/feed?bytes=N, then /_test/tap/end),
 * which GET /_test/tap streams with respond_stream_wait as they come (1.3). One tap for
 * the plugin; POST /_test/tap/reset empties it. */
static struct {
    pthread_mutex_t mu;
    uint64_t fed;
    bool ended;
} tap = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int64_t tap_read(void *arg, uint64_t pos, char *buf, size_t max)
{
    (void)arg;
    pthread_mutex_lock(&tap.mu);
    uint64_t fed = tap.fed;
    bool ended = tap.ended;
    pthread_mutex_unlock(&tap.mu);
    if (pos >= fed) return ended ? ATRIUM_STREAM_END : ATRIUM_STREAM_WAIT;
    size_t n = (size_t)(fed - pos < max ? fed - pos : max);
    for (size_t i = 0; i < n; i++) buf[i] = (char)('a' + (pos + i) % 26);
    return (int64_t)n;
}

/* GET /_test/tap?size=N&deadline_ms=D: the tap's bytes as they are fed (size -1: chunked). */
static int get_tap(atrium_req *req)
{
    long size = query_long(req, "size", -1);
    long deadline = query_long(req, "deadline_ms", 30000);
    return h->respond_stream_wait(req, 200, "application/octet-stream", size, tap_read, NULL,
                                  NULL, tp.tap_ev, h->now_ms() + deadline);
}

static int post_tap(atrium_req *req)
{
    const char *what = h->req_param(req, "what");
    pthread_mutex_lock(&tap.mu);
    if (strcmp(what, "feed") == 0) tap.fed += (uint64_t)query_long(req, "bytes", 0);
    else if (strcmp(what, "end") == 0) tap.ended = true;
    else tap.fed = 0, tap.ended = false;
    pthread_mutex_unlock(&tap.mu);
    int woken = h->event_signal(tp.tap_ev);
    return h->respond_json(req, 200, json_pack("{s:i}", "woken", woken));
}

static void hold_release(void *arg)
{
    (void)arg;
    h->metric_add(tp.holds, -1);
}

static int respond_pattern(atrium_req *req)
{
    long bytes = query_long(req, "bytes", 1024);
    pattern *p = malloc(sizeof(*p));
    if (!p) return ATRIUM_E_NOMEM;
    p->size = (uint64_t)(bytes > 0 ? bytes : 0);
    return h->respond_stream(req, 200, "application/octet-stream", (int64_t)p->size, pattern_read,
                             p, free);
}

/* GET /_test/slow?bytes=N: a body of N bytes with a hold counted by a gauge. */
static int get_slow(atrium_req *req)
{
    h->metric_add(tp.holds, 1);
    h->req_hold(req, hold_release, NULL);
    return respond_pattern(req);
}

/* GET /_test/line?bytes=N: admission line first, then a body; the slot is a hold. */
static int get_line(atrium_req *req)
{
    int rc = h->line_admit(req, tp.line);
    if (rc == ATRIUM_PARKED) return ATRIUM_PARKED;
    if (rc == ATRIUM_E_LIMIT) return h->respond_limited(req, 1000, "The line is full");
    if (rc == ATRIUM_E_TIMEOUT) return h->respond_limited(req, 1000, "Waited too long");
    if (rc < 0) return h->respond_error(req, 503, "M_UNKNOWN", "The server is stopping");
    return respond_pattern(req);
}

/* ---- outbound budget -------------------------------------------------------------- */

/* GET /_test/outbound?port=P[&bytes=N]: waits on a peer the test controls, on this
 * request-pool thread, under the outbound budget; then answers JSON, or N bytes. */
static int get_outbound(atrium_req *req)
{
    if (h->outbound_acquire(req) < 0)
        return h->respond_limited(req, 1000, "Too many requests waiting on other servers");
    long port = query_long(req, "port", 0);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        if (fd >= 0) close(fd);
        return h->respond_error(req, 502, "M_UNKNOWN", "The peer is unreachable");
    }
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int n = poll(&p, 1, OUTBOUND_PEER_WAIT_MS);
    close(fd);
    if (n <= 0) return h->respond_error(req, 504, "M_UNKNOWN", "The peer did not answer");
    if (query_long(req, "bytes", 0) > 0) return respond_pattern(req);
    return h->respond_json(req, 200, json_pack("{s:s}", "peer", "answered"));
}

/* ---- rate limit, database --------------------------------------------------------- */

/* GET /_test/limited: burst 2, then 429; also hands off once to prove a re-run is not
 * counted twice. */
static int get_limited(atrium_req *req)
{
    int64_t wait = h->ratelimit_check(req, tp.limit);
    if (wait > 0) return h->respond_limited(req, wait, "Slow down");
    if (h->req_query(req, "via_pool") && h->req_run_reason(req) != ATRIUM_RUN_HANDOFF) {
        int rc = h->handoff(req, tp.work, NULL, 0);
        if (rc == 0) return ATRIUM_HANDED_OFF;
        return h->respond_error(req, 503, "M_UNKNOWN", "pool refused");
    }
    return h->respond_json(req, 200, json_pack("{s:b}", "allowed", 1));
}

/* GET /_test/db: counts the rows its migrations created. */
static int get_db(atrium_req *req)
{
    PGconn *c = h->db_acquire(DB_WAIT_MS);
    if (!c) return h->respond_error(req, 503, "M_UNKNOWN", "No database connection");
    PGresult *res = PQexec(c, "SELECT count(*) FROM testplug_items");
    int ok = PQresultStatus(res) == PGRES_TUPLES_OK;
    long n = ok ? atol(PQgetvalue(res, 0, 0)) : -1;
    if (!ok) h->log(me, ATRIUM_LOG_WARN, "query failed: %s", PQresultErrorMessage(res));
    PQclear(res);
    h->db_release(c);
    if (!ok) return h->respond_error(req, 503, "M_UNKNOWN", "The database query failed; retry");
    return h->respond_json(req, 200, json_pack("{s:i}", "items", (int)n));
}

/* GET /_test/db/hold?ms=N: holds a database connection for N ms on the test pool, so a
 * test can hold the shared pool full without blocking a request thread. */
static int get_db_hold(atrium_req *req)
{
    if (h->req_run_reason(req) != ATRIUM_RUN_HANDOFF) return handoff_or_refuse(req);
    PGconn *c = h->db_acquire(DB_WAIT_MS);
    if (!c) return h->respond_error(req, 503, "M_UNKNOWN", "No database connection");
    sleep_ms(query_long(req, "ms", 1000));
    h->db_release(c);
    return h->respond_json(req, 200, json_pack("{s:b}", "held", 1));
}

/* GET /_test/param/{value}?q=: the decoded path parameter and query value back. */
static int get_param(atrium_req *req)
{
    const char *q = h->req_query(req, "q");
    return h->respond_json(req, 200, json_pack("{s:s, s:s?}", "value", h->req_param(req, "value"),
                                               "q", q));
}

/* ---- streamed body, file, authentication ------------------------------------------ */

typedef struct stream_state {
    bool headers_seen;   /* the headers-first call came before any data */
    int park_in_chunk;   /* what park returned when called from body_chunk */
    int64_t bytes, chunks;
    uint64_t fnv;        /* FNV-1a of the body, to check every byte arrived in order */
    atrium_sha256 sha;   /* (1.5) the host's SHA-256 of the body, chunk by chunk */
} stream_state;

static void stream_release(void *arg)
{
    (void)arg;
    h->metric_add(tp.stream_holds, -1);
}

/* POST /_test/stream?auth=1&refuse=1: the body as it arrives. The headers-first call
 * (data NULL) authenticates when asked, or refuses, before any byte is read. */
static int stream_chunk(atrium_req *req, const char *data, size_t len)
{
    stream_state *st = h->req_state(req);
    if (!data) {
        if (st) return ATRIUM_E_STATE; /* the headers-first call comes once */
        if (query_long(req, "auth", 0) && !h->req_authenticate(req)) return ATRIUM_E_INVAL;
        if (query_long(req, "refuse", 0)) {
            h->respond_error(req, 403, "M_FORBIDDEN", "Refused before the body");
            return ATRIUM_E_INVAL;
        }
        st = h->req_alloc(req, sizeof(*st));
        if (!st) return ATRIUM_E_NOMEM;
        memset(st, 0, sizeof(*st));
        st->headers_seen = true;
        st->fnv = FNV_OFFSET;
        if (h->sha256_init(&st->sha) < 0) return ATRIUM_E_STATE;
        h->req_set_state(req, st);
        h->metric_add(tp.stream_holds, 1);
        return h->req_hold(req, stream_release, NULL); /* released even if this fails */
    }
    if (!st) return ATRIUM_E_STATE;
    if (st->chunks == 0) st->park_in_chunk = h->park(req, tp.bell, h->now_ms() + 1000);
    for (size_t i = 0; i < len; i++) st->fnv = (st->fnv ^ (unsigned char)data[i]) * FNV_PRIME;
    if (h->sha256_update(&st->sha, data, len) < 0) return ATRIUM_E_STATE;
    st->bytes += (int64_t)len;
    st->chunks++;
    return 0;
}

static int post_stream(atrium_req *req)
{
    stream_state *st = h->req_state(req);
    size_t buffered = 0;
    h->req_body(req, &buffered);
    char fnv[17], sha_hex[ATRIUM_SHA256_HEX_BYTES] = "";
    snprintf(fnv, sizeof(fnv), "%016llx", (unsigned long long)(st ? st->fnv : FNV_OFFSET));
    unsigned char digest[ATRIUM_SHA256_BYTES];
    if (st && h->sha256_final(&st->sha, digest) == 0) atrium_sha256_hex(digest, sha_hex);
    return h->respond_json(req, 200,
                           json_pack("{s:b, s:I, s:I, s:s, s:i, s:I, s:s, s:I}", "headers_first",
                                     st && st->headers_seen, "bytes",
                                     (json_int_t)(st ? st->bytes : 0), "chunks",
                                     (json_int_t)(st ? st->chunks : 0), "fnv", fnv,
                                     "park_in_chunk", st ? st->park_in_chunk : 0, "buffered",
                                     (json_int_t)buffered, "sha256", sha_hex, "wall_ms",
                                     (json_int_t)h->wall_ms()));
}

/* GET /_test/file?offset=N&len=M: bytes i % 251 of a 64 KiB file, through respond_file
 * (the file is already unlinked: the descriptor is all that is left of it). */
static int get_file(atrium_req *req)
{
    char path[] = "/tmp/atrium-testplug-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return ATRIUM_E_IO;
    unlink(path);
    char buf[FILE_BYTES];
    for (size_t i = 0; i < sizeof(buf); i++) buf[i] = (char)(i % 251);
    if (write(fd, buf, sizeof(buf)) != (ssize_t)sizeof(buf)) {
        close(fd);
        return ATRIUM_E_IO;
    }
    long offset = query_long(req, "offset", 0), len = query_long(req, "len", FILE_BYTES);
    if (offset < 0 || len < 0 || offset + len > FILE_BYTES) {
        close(fd);
        return h->respond_error(req, 416, "M_UNKNOWN", "Outside the file");
    }
    return h->respond_file(req, 200, "application/octet-stream", fd, (uint64_t)offset,
                           (uint64_t)len);
}

/* GET /_test/whoami: req_authenticate, then what the host knows of the caller. */
static int get_whoami(atrium_req *req)
{
    const char *user = h->req_authenticate(req);
    if (!user) return ATRIUM_DONE;
    const char *device = h->req_device(req);
    return h->respond_json(req, 200,
                           json_pack("{s:s, s:s?, s:b, s:s}", "user_id", user, "device_id",
                                     device, "admin", h->req_is_admin(req) == 1, "client_key",
                                     h->req_client_key(req)));
}

/* GET /_test/handoff_hold?sleep_ms=N: a hold, then a handler on the pool that outlives
 * the request's deadline (the core answers 504 meanwhile). The hold must not be released
 * while that handler runs: it checks once it wakes. */
typedef struct hold_probe {
    atomic_bool released;
} hold_probe;

static void probe_release(void *arg)
{
    hold_probe *p = arg;
    atomic_store(&p->released, true);
    h->metric_add(tp.holds, -1);
}

static int get_handoff_hold(atrium_req *req)
{
    hold_probe *p = h->req_state(req);
    if (h->req_run_reason(req) != ATRIUM_RUN_HANDOFF) {
        p = h->req_alloc(req, sizeof(*p));
        if (!p) return ATRIUM_E_NOMEM;
        atomic_init(&p->released, false);
        h->req_set_state(req, p);
        h->metric_add(tp.holds, 1);
        if (h->req_hold(req, probe_release, p) < 0) return ATRIUM_E_EXPIRED;
        return handoff_or_refuse(req);
    }
    sleep_ms(query_long(req, "sleep_ms", 0));
    if (atomic_load(&p->released)) h->metric_add(tp.released_under_handler, 1);
    int rc = h->respond_json(req, 200, json_pack("{s:b}", "late", true));
    return rc == ATRIUM_E_EXPIRED ? ATRIUM_DONE : rc;
}

/* POST /_test/echo: the JSON body back. */
static int post_echo(atrium_req *req)
{
    json_t *body = h->req_json(req);
    if (!body) return ATRIUM_DONE;
    return h->respond_json(req, 200, json_incref(body));
}

/* ---- notifications (ABI 1.3) ------------------------------------------------------- */

#define NOTE_CHANNEL "test.ping"
#define NOTES_KEPT 16 /* the newest payloads /_test/notify/seen reports */

static struct {
    pthread_mutex_t mu;
    char *seen[NOTES_KEPT]; /* oldest first */
    int n_seen, n_missed;
} notes = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* On the core's notification thread: keep the payload (NULL: count "may have missed"). */
static void on_note(void *arg, const char *payload)
{
    (void)arg;
    pthread_mutex_lock(&notes.mu);
    if (!payload) {
        notes.n_missed++;
    } else {
        if (notes.n_seen == NOTES_KEPT) {
            free(notes.seen[0]);
            memmove(notes.seen, notes.seen + 1, (NOTES_KEPT - 1) * sizeof(notes.seen[0]));
            notes.n_seen--;
        }
        notes.seen[notes.n_seen++] = strdup(payload);
    }
    pthread_mutex_unlock(&notes.mu);
}

/* POST /_test/notify?payload=P[&tx=1][&channel=C]: publish P, inside a committed
 * transaction with tx=1, else on a pooled connection. 200, or 400 with the error's name. */
static int post_notify(atrium_req *req)
{
    const char *payload = h->req_query(req, "payload");
    const char *channel = h->req_query(req, "channel");
    const char *tx = h->req_query(req, "tx");
    int rc;
    if (tx && strcmp(tx, "1") == 0) {
        PGconn *c = h->db_acquire(DB_WAIT_MS);
        if (!c) return h->respond_error(req, 503, "M_UNKNOWN", "No database connection");
        PQclear(PQexec(c, "BEGIN"));
        rc = h->notify_publish(me, c, channel ? channel : NOTE_CHANNEL, payload ? payload : "");
        PQclear(PQexec(c, rc == 0 ? "COMMIT" : "ROLLBACK"));
        h->db_release(c);
    } else {
        rc = h->notify_publish(me, NULL, channel ? channel : NOTE_CHANNEL, payload ? payload : "");
    }
    if (rc < 0) return h->respond_error(req, 400, "M_INVALID_PARAM", "%s", atrium_err_name(rc));
    return h->respond_json(req, 200, json_pack("{s:b}", "published", 1));
}

/* GET /_test/notify/seen: {seen: [payloads, oldest first], missed: n, live: 0|1}. */
static int get_notify_seen(atrium_req *req)
{
    json_t *seen = json_array();
    pthread_mutex_lock(&notes.mu);
    for (int i = 0; i < notes.n_seen; i++) json_array_append_new(seen, json_string(notes.seen[i]));
    int missed = notes.n_missed;
    pthread_mutex_unlock(&notes.mu);
    return h->respond_json(req, 200, json_pack("{s:o, s:i, s:i}", "seen", seen, "missed", missed,
                                               "live", h->notify_live()));
}

/* ---- a once-only job's lease (ABI 1.3) ---------------------------------------------- */

static atrium_lease *job_lease; /* NULL on a host without leases */

/* GET /_test/lease: {held: 0|1, instance: name} of this process. */
static int get_lease(atrium_req *req)
{
    return h->respond_json(req, 200, json_pack("{s:i, s:s}", "held",
                                               job_lease ? h->lease_held(job_lease) : 0,
                                               "instance", h->instance_name()));
}

/* ---- lifecycle -------------------------------------------------------------------- */

static int tp_init(const atrium_host *host, atrium_plugin *self, const atrium_config *cfg,
                   void **state)
{
    h = host;
    me = self;
    static const char *const keys[] = {"threads", "queue", "line_slots", "line_waiting",
                                       "line_wait_ms", "lease_ttl_ms", NULL};
    if (host->config_check_keys(self, cfg, keys) < 0) return ATRIUM_E_INVAL;
    int64_t threads, queue, slots, waiting, wait_ms, lease_ttl_ms;
    if (host->config_int(self, cfg, "threads", 2, 1, 64, &threads) < 0 ||
        host->config_int(self, cfg, "queue", 8, 1, 1024, &queue) < 0 ||
        host->config_int(self, cfg, "line_slots", 1, 1, 64, &slots) < 0 ||
        host->config_int(self, cfg, "line_waiting", 4, 0, 1024, &waiting) < 0 ||
        host->config_int(self, cfg, "line_wait_ms", 5000, 1, 600000, &wait_ms) < 0 ||
        host->config_int(self, cfg, "lease_ttl_ms", 3000, 1000, 600000, &lease_ttl_ms) < 0)
        return ATRIUM_E_INVAL;
    tp.work = host->pool_create(self, "work", (int)threads, (int)queue);
    tp.bell = host->event_create(self);
    tp.tap_ev = host->event_create(self);
    tp.line = host->line_create(self, "line", (int)slots, (int)waiting, 0, wait_ms);
    tp.limit = host->ratelimit_create(self, "limited", 0.5, 2);
    tp.holds = host->metric_gauge(self, "atrium_" TESTPLUG_NAME "_holds", NULL,
                                  "Holds of /_test/slow not yet released");
    tp.runs_on_pool = host->metric_counter(self, "atrium_" TESTPLUG_NAME "_pool_runs_total", NULL,
                                           "Handlers run on the test pool");
    tp.stream_holds = host->metric_gauge(self, "atrium_" TESTPLUG_NAME "_stream_holds", NULL,
                                         "Holds of /_test/stream not yet released");
    tp.released_under_handler =
        host->metric_counter(self, "atrium_" TESTPLUG_NAME "_released_under_handler_total", NULL,
                             "Holds released while their handed-off handler still ran");
    if (!tp.work || !tp.bell || !tp.tap_ev || !tp.line || !tp.limit || !tp.holds || !tp.runs_on_pool ||
        !tp.stream_holds || !tp.released_under_handler)
        return ATRIUM_E_NOMEM;
    int rc = host->db_migrations(self, MIGRATIONS, sizeof(MIGRATIONS) / sizeof(MIGRATIONS[0]));
    if (rc == 0 && ATRIUM_HOST_HAS(host, notify_subscribe))
        rc = host->notify_subscribe(self, NOTE_CHANNEL, on_note, NULL);
    if (rc == 0 && ATRIUM_HOST_HAS(host, lease_create) &&
        !(job_lease = host->lease_create(self, "test.job", lease_ttl_ms)))
        rc = ATRIUM_E_INVAL;
    const atrium_route routes[] = {
        {.method = "GET", .path = TESTPLUG_PREFIX "/handoff", .handler = get_handoff},
        {.method = "POST", .path = TESTPLUG_PREFIX "/pool/stop", .handler = post_pool_stop},
        {.method = "GET", .path = TESTPLUG_PREFIX "/park", .handler = get_park},
        {.method = "POST", .path = TESTPLUG_PREFIX "/ring", .handler = post_ring},
        {.method = "GET", .path = TESTPLUG_PREFIX "/slow", .handler = get_slow},
        {.method = "GET", .path = TESTPLUG_PREFIX "/line", .handler = get_line},
        {.method = "GET", .path = TESTPLUG_PREFIX "/outbound", .handler = get_outbound},
        {.method = "GET", .path = TESTPLUG_PREFIX "/limited", .handler = get_limited},
        {.method = "GET", .path = TESTPLUG_PREFIX "/db", .handler = get_db},
        {.method = "GET", .path = TESTPLUG_PREFIX "/db/hold", .handler = get_db_hold},
        {.method = "GET", .path = TESTPLUG_PREFIX "/param/{value}", .handler = get_param},
        {.method = "POST", .path = TESTPLUG_PREFIX "/echo", .handler = post_echo,
         .max_body_bytes = 4096},
        {.method = "POST", .path = TESTPLUG_PREFIX "/stream", .handler = post_stream,
         .max_body_bytes = STREAM_MAX_BODY_BYTES,
         .flags = ATRIUM_ROUTE_STREAM_BODY | ATRIUM_ROUTE_HEADERS_FIRST,
         .body_chunk = stream_chunk},
        {.method = "GET", .path = TESTPLUG_PREFIX "/file", .handler = get_file},
        {.method = "GET", .path = TESTPLUG_PREFIX "/whoami", .handler = get_whoami},
        {.method = "GET", .path = TESTPLUG_PREFIX "/handoff_hold", .handler = get_handoff_hold},
        {.method = "POST", .path = TESTPLUG_PREFIX "/notify", .handler = post_notify},
        {.method = "GET", .path = TESTPLUG_PREFIX "/notify/seen", .handler = get_notify_seen},
        {.method = "GET", .path = TESTPLUG_PREFIX "/lease", .handler = get_lease},
        {.method = "GET", .path = TESTPLUG_PREFIX "/tap", .handler = get_tap},
        {.method = "POST", .path = TESTPLUG_PREFIX "/tap/{what}", .handler = post_tap},
    };
    for (size_t i = 0; rc == 0 && i < sizeof(routes) / sizeof(routes[0]); i++)
        rc = host->route_add(self, &routes[i]);
    *state = &tp;
    return rc;
}

ATRIUM_PLUGIN(.name = TESTPLUG_NAME, .version = "1.0.0", .provides = TESTPLUG_PROVIDES,
              .init = tp_init)
