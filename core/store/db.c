/*
 * core/store/db.c - the shared PostgreSQL connection pool (see db.h for the contract).
 *
 * Checkout and checkin run under one mutex with a condition variable; a checkout waits at
 * most its timeout, so an exhausted pool becomes a clean 503 upstream, never a hang and
 * never a misleading error.
 *
 * The decision this file owns is that no thread waits on PostgreSQL without a bound,
 * whatever libpq call it makes (plugins call libpq themselves, so the bound cannot live in
 * a query wrapper). A monitor thread watches every borrowed connection. One borrowed for
 * longer than DB_SUSPECT_MS makes it probe the server on a connection of its own, with
 * libpq's asynchronous calls and a deadline (database.unresponsive_ms); it also probes
 * every DB_PROBE_INTERVAL_MS. A probe that gets no answer in time (a frozen or partitioned
 * server: TCP still accepts, nothing replies, and PQcancel would wait on the same frozen
 * postmaster) makes the database unavailable: the monitor shuts down the socket of every
 * borrowed connection (through its own duplicate of the descriptor, so a descriptor libpq
 * already closed and the kernel recycled is never touched), which makes the blocked libpq
 * call return a connection error at once; and every checkout fails at once until a probe
 * is answered. The outage is logged once when it starts and once when it ends, with the
 * count of checkouts refused meanwhile.
 *
 * The pool opens its connections as they are needed, up to database.pool_size: one at
 * start (with the probe's), another when a checkout has found none idle for
 * DB_GROW_GRACE_MS (a background sender's or a migration's, db_acquire_background:
 * DB_GROW_GRACE_BACKGROUND_MS)
 * and no connection already being opened will serve it. The monitor
 * opens it, with a deadline, exactly as it re-establishes a broken one; the checkout only
 * waits its own timeout. A failure to open
 * one more (PostgreSQL at max_connections, say) is not an outage while others work: the
 * slot stays unopened and growth is retried after DB_GROW_RETRY_MS. Connections, once
 * open, stay open (an idle pool holds what its busiest moment needed).
 *
 * Broken connections (cut, found closed by the server, or failed under their caller) are
 * re-established by the monitor with a deadline, never on a request thread. A checkout
 * skips an idle connection whose socket became readable (the server closed it, as after a
 * restart) and hands it to the monitor. What this file does not do: retry a query (the
 * caller answers 503 with Retry-After and the client retries).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/runtime/core_runtime.h"
#include "core/store/db.h"

#define DB_RETRY_INTERVAL_MS 1000
/* A connection borrowed this long makes the monitor check that the server still answers. */
#define DB_SUSPECT_MS 200
/* The monitor's rhythm: how often it looks at borrowed and broken connections. */
#define DB_MONITOR_TICK_MS 50
/* A probe at least this often, even when nothing looks wrong (keeps db_available fresh). */
#define DB_PROBE_INTERVAL_MS 2000
/* While unavailable, and while suspicious, probes are this far apart at least. */
#define DB_REPROBE_INTERVAL_MS 250
/* A checkout that finds no idle connection waits this long for one to be given back
 * before the pool grows (a burst of short queries, as at start, shares what is open). */
#define DB_GROW_GRACE_MS 5
/* The same for background work (db_acquire_background): the start's wake-ups share one. */
#define DB_GROW_GRACE_BACKGROUND_MS 250
/* After a failure to open one more connection, no other attempt for this long. */
#define DB_GROW_RETRY_MS 1000
/* Defaults written into the conninfo where it sets none: a connection attempt gives up
 * after connect_timeout; a silent peer is detected by TCP keepalives (idle, interval,
 * count) and unacknowledged data by tcp_user_timeout. */
#define DB_CONNECT_TIMEOUT_S "5"
#define DB_KEEPALIVES_IDLE_S "10"
#define DB_KEEPALIVES_INTERVAL_S "5"
#define DB_KEEPALIVES_COUNT "3"
#define DB_TCP_USER_TIMEOUT_MS "20000"

typedef enum {
    DB_CONN_CLOSED,  /* never opened (no libpq connection): opened when the pool must grow */
    DB_CONN_IDLE,    /* healthy, free */
    DB_CONN_BUSY,    /* borrowed */
    DB_CONN_BROKEN,  /* to be re-established by the monitor */
    DB_CONN_OPENING, /* was CLOSED: a checkout asked the monitor to open it */
    DB_CONN_HEALING, /* the monitor is (re-)establishing it (outside the lock) */
} db_conn_state;

typedef struct db_conn {
    PGconn *conn;
    int cut_fd; /* our dup of conn's socket (-1: none): shutdown() here cuts the connection */
    db_conn_state state;
    int64_t busy_since_ms;
    bool cut; /* cut while borrowed: broken when given back */
} db_conn;

struct db_pool {
    char *conninfo;  /* as configured */
    char *effective; /* with the pool's defaults (after db_pool_connect) */
    int size;
    db_conn *conns;
    pthread_mutex_t mu;
    pthread_cond_t cv;     /* a connection became idle, or the database unavailable */
    pthread_cond_t mon_cv; /* the monitor has work (a broken connection), or must stop */
    int idle;
    int waiting; /* checkouts waiting on cv now */
    int64_t request_wait_ms; /* database.checkout_timeout_ms: what DB_WAIT_CONFIGURED means */
    int unresponsive_ms;
    int statement_timeout_ms;
    /* The monitor's state (mu): */
    pthread_t monitor;
    bool monitor_started, stopping;
    atomic_bool down;
    int64_t down_since_ms;
    int64_t refused; /* checkouts refused in the current outage */
    PGconn *probe;   /* the monitor's own connection (monitor thread only) */
    int64_t last_probe_ms;
    int64_t heal_after_ms; /* no reconnect before (after one failed) */
    int64_t grow_after_ms; /* no new connection before (after opening one failed) */
    bool grow_failing;     /* the last attempt to open one more failed (logged once) */
    rt_metric *m_in_use, *m_size, *m_timeouts, *m_resets, *m_available, *m_refused, *m_cuts;
    db_prepared_stats prepared; /* its connections' prepared statements (db_prepared.c) */
};

int64_t db_request_wait_ms(const db_pool *p)
{
    return p ? p->request_wait_ms : 0;
}

db_pool *db_global(void)
{
    core_runtime *rt = core_runtime_get();
    return rt ? rt->db : NULL;
}

void db_pool_prepare(db_pool *p, bool enabled)
{
    p->prepared.off = !enabled;
}

bool db_available(const db_pool *p)
{
    return !p || !atomic_load(&p->down);
}

db_pool *db_pool_new(const char *conninfo, int size, int64_t request_wait_ms,
                     rt_metrics *metrics)
{
    db_pool *p = calloc(1, sizeof(*p));
    if (!p) return NULL;
    p->conninfo = strdup(conninfo);
    p->size = size;
    p->request_wait_ms = request_wait_ms;
    p->unresponsive_ms = DB_DEFAULT_UNRESPONSIVE_MS;
    p->statement_timeout_ms = DB_DEFAULT_STATEMENT_TIMEOUT_MS;
    p->conns = calloc((size_t)size, sizeof(db_conn));
    if (!p->conninfo || !p->conns) {
        free(p->conns);
        free(p->conninfo);
        free(p);
        return NULL;
    }
    for (int i = 0; i < size; i++) p->conns[i].cut_fd = -1;
    atomic_init(&p->down, false);
    pthread_mutex_init(&p->mu, NULL);
    rt_cond_init(&p->cv);
    rt_cond_init(&p->mon_cv);
    p->m_in_use = rt_metric_gauge(metrics, "atrium_db_connections_in_use", NULL,
                                  "PostgreSQL connections checked out");
    p->m_size = rt_metric_gauge(metrics, "atrium_db_connections", NULL,
                                "PostgreSQL connections the pool holds open (it opens them "
                                "as needed, up to database.pool_size)");
    p->m_timeouts = rt_metric_counter(metrics, "atrium_db_acquire_timeouts_total", NULL,
                                      "Checkouts that found no connection in time");
    p->m_resets = rt_metric_counter(metrics, "atrium_db_resets_total", NULL,
                                    "Connections re-established after a failure");
    p->m_available = rt_metric_gauge(metrics, "atrium_db_available", NULL,
                                     "1 while PostgreSQL answers the pool's probes, else 0");
    p->m_refused = rt_metric_counter(metrics, "atrium_db_refused_total", NULL,
                                     "Checkouts refused at once because PostgreSQL was unavailable");
    p->m_cuts = rt_metric_counter(metrics, "atrium_db_cuts_total", NULL,
                                  "Borrowed connections cut because PostgreSQL stopped answering");
    p->prepared.statements = rt_metric_gauge(
        metrics, "atrium_db_prepared_statements", NULL,
        "Statements prepared on the pool's connections (at most 512 per connection)");
    p->prepared.unprepared = rt_metric_counter(
        metrics, "atrium_db_unprepared_total", NULL,
        "Statements run unprepared because their connection's cache was full");
    rt_metric_set(p->m_available, 1);
    return p;
}

void db_pool_tune(db_pool *p, int unresponsive_ms, int statement_timeout_ms)
{
    if (unresponsive_ms > 0) p->unresponsive_ms = unresponsive_ms;
    if (statement_timeout_ms >= 0) p->statement_timeout_ms = statement_timeout_ms;
}

/* ---- the conninfo with the pool's defaults ------------------------------------------ */

static bool sb_add(char **buf, size_t *len, size_t *cap, const char *key, const char *val)
{
    size_t need = strlen(key) + 2 * strlen(val) + 6;
    if (*len + need >= *cap) {
        size_t ncap = (*cap + need) * 2;
        char *n = realloc(*buf, ncap);
        if (!n) return false;
        *buf = n;
        *cap = ncap;
    }
    char *o = *buf + *len;
    if (*len) *o++ = ' ';
    o += sprintf(o, "%s='", key);
    for (const char *v = val; *v; v++) {
        if (*v == '\'' || *v == '\\') *o++ = '\\';
        *o++ = *v;
    }
    *o++ = '\'';
    *o = '\0';
    *len = (size_t)(o - *buf);
    return true;
}

/* The configured conninfo (keyword form or URI) as a keyword string, with the defaults
 * above for what it leaves unset and the statement_timeout appended to its options. NULL
 * when libpq cannot parse it (err says why) or on OOM. */
static char *with_defaults(const char *conninfo, int statement_timeout_ms, char *err,
                           size_t errlen)
{
    char *perr = NULL;
    PQconninfoOption *opts = PQconninfoParse(conninfo, &perr);
    if (!opts) {
        snprintf(err, errlen, "%s", perr ? perr : "out of memory");
        PQfreemem(perr);
        return NULL;
    }
    static const char *const DEFAULTS[][2] = {
        {"connect_timeout", DB_CONNECT_TIMEOUT_S},
        {"keepalives", "1"},
        {"keepalives_idle", DB_KEEPALIVES_IDLE_S},
        {"keepalives_interval", DB_KEEPALIVES_INTERVAL_S},
        {"keepalives_count", DB_KEEPALIVES_COUNT},
        {"tcp_user_timeout", DB_TCP_USER_TIMEOUT_MS},
    };
    char *buf = NULL;
    size_t len = 0, cap = 0;
    bool ok = true, have_options = false;
    for (PQconninfoOption *o = opts; ok && o->keyword; o++) {
        if (!o->val || !*o->val) continue;
        if (strcmp(o->keyword, "options") == 0) {
            have_options = true;
            if (statement_timeout_ms > 0 && !strstr(o->val, "statement_timeout")) {
                char v[1024];
                snprintf(v, sizeof(v), "%s -c statement_timeout=%d", o->val,
                         statement_timeout_ms);
                ok = sb_add(&buf, &len, &cap, "options", v);
                continue;
            }
        }
        ok = sb_add(&buf, &len, &cap, o->keyword, o->val);
    }
    for (size_t i = 0; ok && i < sizeof(DEFAULTS) / sizeof(DEFAULTS[0]); i++) {
        bool set = false;
        for (PQconninfoOption *o = opts; o->keyword; o++)
            if (strcmp(o->keyword, DEFAULTS[i][0]) == 0 && o->val && *o->val) set = true;
        if (!set) ok = sb_add(&buf, &len, &cap, DEFAULTS[i][0], DEFAULTS[i][1]);
    }
    if (ok && !have_options && statement_timeout_ms > 0) {
        char v[64];
        snprintf(v, sizeof(v), "-c statement_timeout=%d", statement_timeout_ms);
        ok = sb_add(&buf, &len, &cap, "options", v);
    }
    PQconninfoFree(opts);
    if (!ok || !buf) {
        free(buf);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    return buf;
}

/* ---- connections with a deadline ---------------------------------------------------- */

static void ignore_notice(void *arg, const char *message)
{
    (void)arg;
    (void)message;
}

static void trim_err(char *err)
{
    size_t n = strlen(err);
    while (n && (err[n - 1] == '\n' || err[n - 1] == ' ')) err[--n] = '\0';
}

/* Wait for fd to become readable (or writable) until deadline_ms. 1 ready, 0 deadline,
 * -1 poll failed. */
static int wait_fd(int fd, bool for_write, int64_t deadline_ms)
{
    for (;;) {
        int64_t left = deadline_ms - rt_now_ms();
        if (left <= 0) return 0;
        struct pollfd pfd = {.fd = fd, .events = for_write ? POLLOUT : POLLIN};
        int n = poll(&pfd, 1, (int)(left > 1000 ? 1000 : left));
        if (n > 0) return 1;
        if (n < 0 && errno != EINTR) return -1;
    }
}

/* A new connection, never waiting past deadline_ms (libpq's asynchronous connect). NULL
 * with err filled on failure. */
static PGconn *connect_by(const char *conninfo, int64_t deadline_ms, char *err, size_t errlen)
{
    PGconn *c = PQconnectStart(conninfo);
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    PostgresPollingStatusType st = PGRES_POLLING_WRITING;
    if (PQstatus(c) == CONNECTION_BAD) st = PGRES_POLLING_FAILED;
    while (st != PGRES_POLLING_OK) {
        if (st == PGRES_POLLING_FAILED) {
            snprintf(err, errlen, "%s", PQerrorMessage(c));
            trim_err(err);
            PQfinish(c);
            return NULL;
        }
        int ready = wait_fd(PQsocket(c), st == PGRES_POLLING_WRITING, deadline_ms);
        if (ready <= 0) {
            snprintf(err, errlen, "no answer while connecting");
            PQfinish(c);
            return NULL;
        }
        st = PQconnectPoll(c);
    }
    /* Notices (e.g. "relation already exists, skipping") are not the operator's business. */
    PQsetNoticeProcessor(c, ignore_notice, NULL);
    return c;
}

/* Run sql on c and read every result, never waiting past deadline_ms. True when each
 * result succeeded. On false the connection is in an unknown state: finish it. */
static bool query_by(PGconn *c, const char *sql, int64_t deadline_ms)
{
    if (!PQsendQuery(c, sql)) return false;
    bool ok = true;
    for (;;) {
        if (PQisBusy(c)) {
            if (wait_fd(PQsocket(c), false, deadline_ms) <= 0 || !PQconsumeInput(c)) return false;
            continue;
        }
        PGresult *res = PQgetResult(c);
        if (!res) return ok;
        ExecStatusType st = PQresultStatus(res);
        if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) ok = false;
        PQclear(res);
    }
}

/* Give dc a new libpq connection c (or none): its cut descriptor follows. Caller owns dc. */
static void conn_set(db_conn *dc, PGconn *c)
{
    if (dc->conn) PQfinish(dc->conn);
    if (dc->cut_fd >= 0) close(dc->cut_fd);
    dc->conn = c;
    dc->cut_fd = c ? fcntl(PQsocket(c), F_DUPFD_CLOEXEC, 0) : -1;
}

/* An idle connection whose socket is readable was closed by the server (or has a message
 * nobody asked for, which a pooled connection never should): it is not handed out. */
static bool idle_conn_stale(const db_conn *dc)
{
    if (!dc->conn || dc->cut_fd < 0 || PQstatus(dc->conn) != CONNECTION_OK) return true;
    struct pollfd pfd = {.fd = dc->cut_fd, .events = POLLIN};
    return poll(&pfd, 1, 0) != 0;
}

/* ---- the monitor -------------------------------------------------------------------- */

/* Cut every borrowed connection (its blocked libpq call returns a connection error). mu. */
static void cut_borrowed_locked(db_pool *p)
{
    for (int i = 0; i < p->size; i++) {
        db_conn *dc = &p->conns[i];
        if (dc->state != DB_CONN_BUSY || dc->cut) continue;
        dc->cut = true;
        if (dc->cut_fd >= 0) shutdown(dc->cut_fd, SHUT_RDWR);
        rt_metric_add(p->m_cuts, 1);
    }
}

/* The database stops counting as available: logged once, here. mu. */
static void declare_down_locked(db_pool *p, const char *why)
{
    if (atomic_load(&p->down)) return;
    atomic_store(&p->down, true);
    p->down_since_ms = rt_now_ms();
    p->refused = 0;
    rt_metric_set(p->m_available, 0);
    cut_borrowed_locked(p);
    /* Checkouts fail at once now: nobody waits for the connections they asked for. */
    for (int i = 0; i < p->size; i++)
        if (p->conns[i].state == DB_CONN_OPENING) p->conns[i].state = DB_CONN_CLOSED;
    pthread_cond_broadcast(&p->cv); /* waiting checkouts fail now */
    rt_log(ATRIUM_LOG_ERROR, "core",
           "PostgreSQL unavailable (%s); requests needing it get 503 until it answers again - "
           "check the database server and the network to it",
           why);
}

/* The database answers again: logged once, here. mu. */
static void declare_up_locked(db_pool *p)
{
    if (!atomic_load(&p->down)) return;
    atomic_store(&p->down, false);
    p->heal_after_ms = 0; /* re-establish the pool's connections now */
    p->grow_after_ms = 0;
    rt_metric_set(p->m_available, 1);
    rt_log(ATRIUM_LOG_INFO, "core",
           "PostgreSQL answers again after %lld ms unavailable; %lld database request(s) were "
           "refused meanwhile",
           (long long)(rt_now_ms() - p->down_since_ms), (long long)p->refused);
}

/* One probe on the monitor's own connection: true when PostgreSQL answered within
 * unresponsive_ms. Monitor thread, without mu. */
static bool probe(db_pool *p, char *err, size_t errlen)
{
    int64_t deadline = rt_now_ms() + p->unresponsive_ms;
    /* While unavailable, "answers again" means a new connection works too: the pool's
     * connections must be re-established, not only the probe's kept one. */
    if (p->probe && (PQstatus(p->probe) != CONNECTION_OK || atomic_load(&p->down))) {
        PQfinish(p->probe);
        p->probe = NULL;
    }
    if (!p->probe) p->probe = connect_by(p->effective, deadline, err, errlen);
    if (!p->probe) return false;
    if (query_by(p->probe, "SELECT 1", deadline)) return true;
    snprintf(err, errlen, "no answer to a probe within %d ms", p->unresponsive_ms);
    PQfinish(p->probe);
    p->probe = NULL;
    return false;
}

/* Connections a checkout can have now or later (idle or borrowed). mu. */
static int usable_locked(const db_pool *p)
{
    int n = 0;
    for (int i = 0; i < p->size; i++)
        if (p->conns[i].state == DB_CONN_IDLE || p->conns[i].state == DB_CONN_BUSY) n++;
    return n;
}

/* Connections being opened or re-established: each will be idle soon. mu. */
static int coming_locked(const db_pool *p)
{
    int n = 0;
    for (int i = 0; i < p->size; i++) {
        db_conn_state st = p->conns[i].state;
        if (st == DB_CONN_BROKEN || st == DB_CONN_OPENING || st == DB_CONN_HEALING) n++;
    }
    return n;
}

/* atrium_db_connections: the libpq connections the pool holds. Only the monitor (and
 * db_pool_connect before it starts) sets a slot's connection, so only they count. mu. */
static void count_open_locked(db_pool *p)
{
    int n = 0;
    for (int i = 0; i < p->size; i++)
        if (p->conns[i].conn) n++;
    rt_metric_set(p->m_size, n);
}

/* A checkout found no idle connection: when the checkouts in want of one (waiting ones,
 * plus the caller) outnumber the connections on their way and a slot was never opened,
 * ask the monitor to open it. Never past database.pool_size (the slots are the bound);
 * not again within DB_GROW_RETRY_MS of a failed attempt. mu. */
static void grow_for_locked(db_pool *p, int wanting)
{
    if (rt_now_ms() < p->grow_after_ms || wanting <= coming_locked(p)) return;
    for (int i = 0; i < p->size; i++) {
        if (p->conns[i].state != DB_CONN_CLOSED) continue;
        p->conns[i].state = DB_CONN_OPENING;
        pthread_cond_signal(&p->mon_cv);
        return;
    }
}

/* Open one connection the monitor owns (HEALING): a broken one again, or one a checkout
 * asked for (OPENING). A failure makes the database unavailable only when no other
 * connection works (PostgreSQL refusing one more connection, say, is not an outage: the
 * rest are still served); otherwise a broken one is retried after DB_REPROBE_INTERVAL_MS,
 * and an asked-for one goes back to CLOSED until a checkout asks again, not within
 * DB_GROW_RETRY_MS. False when the connection could not be opened. mu held on entry and
 * exit, released meanwhile. */
static bool heal_locked(db_pool *p, db_conn *dc)
{
    bool growing = dc->state == DB_CONN_OPENING;
    dc->state = DB_CONN_HEALING;
    pthread_mutex_unlock(&p->mu);
    char err[512] = "";
    PGconn *fresh = connect_by(p->effective, rt_now_ms() + p->unresponsive_ms, err, sizeof(err));
    if (fresh) (void)db_prepared_attach(fresh, &p->prepared); /* false: runs unprepared */
    conn_set(dc, fresh);
    pthread_mutex_lock(&p->mu);
    count_open_locked(p);
    if (!fresh) {
        int usable = usable_locked(p);
        if (growing) {
            dc->state = DB_CONN_CLOSED;
            p->grow_after_ms = rt_now_ms() + DB_GROW_RETRY_MS;
            if (usable > 0 && !p->grow_failing)
                rt_log(ATRIUM_LOG_WARN, "core",
                       "cannot open another PostgreSQL connection (%s); the pool goes on with "
                       "%d of database.pool_size %d - raise PostgreSQL's max_connections or "
                       "lower database.pool_size",
                       err, usable, p->size);
            p->grow_failing = true;
        } else {
            dc->state = DB_CONN_BROKEN;
            p->heal_after_ms = rt_now_ms() + DB_REPROBE_INTERVAL_MS;
        }
        if (usable == 0) declare_down_locked(p, err);
        return false;
    }
    if (growing) p->grow_failing = false;
    else rt_metric_add(p->m_resets, 1);
    dc->state = DB_CONN_IDLE;
    p->idle++;
    pthread_cond_signal(&p->cv);
    return true;
}

static void *monitor_main(void *arg)
{
    db_pool *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->stopping) {
        int64_t now = rt_now_ms();
        bool suspicious = false;
        for (int i = 0; i < p->size; i++) {
            db_conn *dc = &p->conns[i];
            if (dc->state == DB_CONN_BUSY && !dc->cut && now - dc->busy_since_ms >= DB_SUSPECT_MS)
                suspicious = true;
            /* An idle one the server closed (a restart) is healed before anyone needs it. */
            if (dc->state == DB_CONN_IDLE && idle_conn_stale(dc)) {
                dc->state = DB_CONN_BROKEN;
                p->idle--;
            }
        }
        bool down = atomic_load(&p->down);
        int64_t since = now - p->last_probe_ms;
        if (since >= DB_PROBE_INTERVAL_MS ||
            ((suspicious || down) && since >= DB_REPROBE_INTERVAL_MS)) {
            pthread_mutex_unlock(&p->mu);
            char err[512] = "";
            bool ok = probe(p, err, sizeof(err));
            pthread_mutex_lock(&p->mu);
            p->last_probe_ms = rt_now_ms();
            if (ok) declare_up_locked(p);
            else declare_down_locked(p, err);
        }
        /* Broken ones not within DB_REPROBE_INTERVAL_MS of a failed attempt; asked-for ones
         * at once (grow_for_locked keeps their own interval). The first failure ends the
         * round: against a frozen server each attempt takes unresponsive_ms, and several
         * in a row (a burst of checkouts asks for several connections just as it freezes)
         * would keep the probe, which decides the outage, waiting behind them. */
        for (int i = 0; i < p->size && !atomic_load(&p->down) && !p->stopping; i++) {
            db_conn_state st = p->conns[i].state;
            if ((st == DB_CONN_OPENING ||
                 (st == DB_CONN_BROKEN && rt_now_ms() >= p->heal_after_ms)) &&
                !heal_locked(p, &p->conns[i]))
                break;
        }
        int64_t until = rt_now_ms() + DB_MONITOR_TICK_MS;
        struct timespec ts = {.tv_sec = until / 1000, .tv_nsec = (until % 1000) * 1000000L};
        pthread_cond_timedwait(&p->mon_cv, &p->mu, &ts);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* ---- the pool ----------------------------------------------------------------------- */

int db_pool_connect(db_pool *p, int retry_s)
{
    char err[512] = "";
    free(p->effective);
    p->effective = with_defaults(p->conninfo, p->statement_timeout_ms, err, sizeof(err));
    if (!p->effective) {
        rt_log(ATRIUM_LOG_ERROR, "core", "database.conninfo is not a libpq connection string: %s",
               err);
        return -1;
    }
    /* One pool connection: the others are opened as checkouts need them. */
    int64_t until = rt_now_ms() + (int64_t)retry_s * 1000;
    for (;;) {
        int64_t now = rt_now_ms();
        int64_t deadline = now + (until > now ? until - now : 0) + p->unresponsive_ms;
        PGconn *c = connect_by(p->effective, deadline, err, sizeof(err));
        if (c) {
            (void)db_prepared_attach(c, &p->prepared); /* false: runs unprepared */
            conn_set(&p->conns[0], c);
            break;
        }
        if (rt_now_ms() >= until) {
            rt_log(ATRIUM_LOG_ERROR, "core",
                   "cannot connect to PostgreSQL after %d s: %s - check database.conninfo "
                   "and that the server is running",
                   retry_s, err);
            return -1;
        }
        rt_log(ATRIUM_LOG_WARN, "core", "PostgreSQL not reachable yet (%s); retrying", err);
        struct timespec ts = {.tv_sec = DB_RETRY_INTERVAL_MS / 1000,
                              .tv_nsec = (DB_RETRY_INTERVAL_MS % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    /* The probe's own connection now, so it is there before the first checkout (the
     * monitor re-opens it when it is lost). */
    p->probe = connect_by(p->effective, rt_now_ms() + p->unresponsive_ms, err, sizeof(err));
    pthread_mutex_lock(&p->mu);
    p->conns[0].state = DB_CONN_IDLE;
    for (int i = 1; i < p->size; i++) p->conns[i].state = DB_CONN_CLOSED;
    p->idle = 1;
    p->last_probe_ms = rt_now_ms();
    count_open_locked(p);
    pthread_mutex_unlock(&p->mu);
    if (pthread_create(&p->monitor, NULL, monitor_main, p) != 0) {
        rt_log(ATRIUM_LOG_ERROR, "core", "cannot start the database pool's monitor thread");
        return -1;
    }
    p->monitor_started = true;
    return 0;
}

/* An idle connection that is still good, or NULL (stale ones found on the way are handed
 * to the monitor). mu. */
static db_conn *take_idle_locked(db_pool *p)
{
    for (int i = 0; i < p->size && p->idle > 0; i++) {
        db_conn *c = &p->conns[i];
        if (c->state != DB_CONN_IDLE) continue;
        p->idle--;
        if (!idle_conn_stale(c)) return c;
        c->state = DB_CONN_BROKEN; /* the monitor re-establishes it */
        pthread_cond_signal(&p->mon_cv);
    }
    return NULL;
}

/* dc borrowed by the calling thread. mu on entry, released. */
static PGconn *lend_unlock(db_pool *p, db_conn *dc)
{
    dc->state = DB_CONN_BUSY;
    dc->busy_since_ms = rt_now_ms();
    dc->cut = false;
    pthread_mutex_unlock(&p->mu);
    rt_metric_add(p->m_in_use, 1);
    return dc->conn;
}

PGconn *db_acquire_spare(db_pool *p)
{
    if (!p) return NULL;
    pthread_mutex_lock(&p->mu);
    bool may_grow = false;
    for (int i = 0; i < p->size && !may_grow; i++) may_grow = p->conns[i].state == DB_CONN_CLOSED;
    db_conn *dc = NULL;
    if (!atomic_load(&p->down) && (p->idle >= 2 || (p->idle == 1 && may_grow))) dc = take_idle_locked(p);
    if (p->idle == 0 && may_grow && !atomic_load(&p->down))
        grow_for_locked(p, 1); /* none left idle: one more for whoever comes next */
    if (!dc) {
        pthread_mutex_unlock(&p->mu);
        return NULL;
    }
    return lend_unlock(p, dc);
}

static PGconn *acquire(db_pool *p, int64_t timeout_ms, int64_t grace_ms)
{
    if (!p) return NULL;
    if (timeout_ms == DB_WAIT_CONFIGURED) timeout_ms = p->request_wait_ms;
    int64_t until = rt_now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    int64_t grow_at = rt_now_ms() + (timeout_ms > 0 ? grace_ms : 0);
    pthread_mutex_lock(&p->mu);
    db_conn *dc = NULL;
    while (!dc) {
        if (atomic_load(&p->down)) {
            p->refused++;
            pthread_mutex_unlock(&p->mu);
            rt_metric_add(p->m_refused, 1);
            return NULL;
        }
        if ((dc = take_idle_locked(p))) break;
        /* None idle: past the grace the monitor opens one more when the pool may
         * grow (this thread never connects: it waits its timeout, no longer). */
        int64_t now = rt_now_ms();
        if (now >= grow_at) grow_for_locked(p, p->waiting + 1);
        bool expired = now >= until;
        if (!expired) {
            int64_t wake = grow_at > now && grow_at < until ? grow_at : until;
            struct timespec ts = {.tv_sec = wake / 1000, .tv_nsec = (wake % 1000) * 1000000L};
            p->waiting++;
            expired = pthread_cond_timedwait(&p->cv, &p->mu, &ts) != 0 && wake == until &&
                      p->idle == 0 && !atomic_load(&p->down);
            p->waiting--;
        }
        if (expired) {
            pthread_mutex_unlock(&p->mu);
            rt_metric_add(p->m_timeouts, 1);
            return NULL;
        }
    }
    return lend_unlock(p, dc);
}

PGconn *db_acquire(db_pool *p, int64_t timeout_ms)
{
    return acquire(p, timeout_ms, DB_GROW_GRACE_MS);
}

PGconn *db_acquire_background(db_pool *p, int64_t timeout_ms)
{
    return acquire(p, timeout_ms, DB_GROW_GRACE_BACKGROUND_MS);
}

void db_release(db_pool *p, PGconn *c)
{
    if (!p || !c) return;
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->size; i++) {
        db_conn *dc = &p->conns[i];
        if (dc->state != DB_CONN_BUSY || dc->conn != c) continue;
        if (dc->cut || PQstatus(c) != CONNECTION_OK) {
            dc->state = DB_CONN_BROKEN;
            pthread_cond_signal(&p->mon_cv);
        } else {
            dc->state = DB_CONN_IDLE;
            p->idle++;
            pthread_cond_signal(&p->cv);
        }
        break;
    }
    pthread_mutex_unlock(&p->mu);
    rt_metric_add(p->m_in_use, -1);
}

const char *db_pool_conninfo(const db_pool *p)
{
    return p->effective ? p->effective : p->conninfo;
}

void db_pool_free(db_pool *p)
{
    if (!p) return;
    if (p->monitor_started) {
        pthread_mutex_lock(&p->mu);
        p->stopping = true;
        pthread_cond_signal(&p->mon_cv);
        pthread_mutex_unlock(&p->mu);
        pthread_join(p->monitor, NULL);
    }
    if (p->probe) PQfinish(p->probe);
    for (int i = 0; i < p->size; i++) conn_set(&p->conns[i], NULL);
    free(p->conns);
    free(p->conninfo);
    free(p->effective);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    pthread_cond_destroy(&p->mon_cv);
    free(p);
}

/* ---- migrations --------------------------------------------------------------------- */

/* A migration's SQL, which may hold several statements (so PQexec, not db_exec's
 * parameterized call). True, or false with PostgreSQL's message in err. */
static bool run_script(PGconn *c, const char *sql, char *err, size_t errlen)
{
    PGresult *res = PQexec(c, sql);
    ExecStatusType st = PQresultStatus(res);
    bool ok = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
    if (!ok) snprintf(err, errlen, "%s", PQresultErrorMessage(res));
    PQclear(res);
    return ok;
}

int db_migrate(db_pool *p, const char *owner, const atrium_migration *list, size_t n)
{
    /* Background grace: at start the senders' first rounds briefly hold the one open
     * connection; waiting for it beats opening another PostgreSQL session for a check. */
    PGconn *c = db_acquire_background(p, DB_MIGRATE_WAIT_MS);
    if (!c) {
        rt_log(ATRIUM_LOG_ERROR, "core", "migrations for \"%s\": no database connection", owner);
        return -1;
    }
    char err[1024] = "";
    int applied = 0;
    bool ok = db_exec_quiet(c, "BEGIN", 0, NULL, err, sizeof(err)) &&
              /* A migration may take long (an index on a big table): no statement limit. */
              db_exec_quiet(c, "SET LOCAL statement_timeout = 0", 0, NULL, err, sizeof(err)) &&
              /* One lock for every owner and process: migrations never race. */
              db_exec_quiet(c, "SELECT pg_advisory_xact_lock(" DB_LOCK_MIGRATIONS ")", 0, NULL, err,
                            sizeof(err)) &&
              db_exec_quiet(c,
                            "CREATE TABLE IF NOT EXISTS atrium_migrations ("
                            " owner text NOT NULL, version integer NOT NULL, name text NOT NULL,"
                            " applied_at timestamptz NOT NULL DEFAULT now(),"
                            " PRIMARY KEY (owner, version))",
                            0, NULL, err, sizeof(err));
    int current = 0;
    if (ok) {
        const char *params[1] = {owner};
        PGresult *res = PQexecParams(
            c, "SELECT coalesce(max(version), 0) FROM atrium_migrations WHERE owner = $1", 1,
            NULL, params, NULL, NULL, 0);
        ok = PQresultStatus(res) == PGRES_TUPLES_OK;
        if (ok) current = atoi(PQgetvalue(res, 0, 0));
        else snprintf(err, sizeof(err), "%s", PQresultErrorMessage(res));
        PQclear(res);
    }
    int last = current;
    for (size_t i = 0; ok && i < n; i++) {
        const atrium_migration *m = &list[i];
        if (m->version <= last && m->version > current) {
            ok = false;
            snprintf(err, sizeof(err), "migration versions must ascend (%d after %d)", m->version,
                     last);
            break;
        }
        if (m->version <= current) continue;
        if (!run_script(c, m->sql, err, sizeof(err))) {
            ok = false;
            char tmp[1024];
            snprintf(tmp, sizeof(tmp), "migration %d (%s) failed: %s", m->version, m->name, err);
            memcpy(err, tmp, sizeof(err));
            break;
        }
        char ver[16];
        snprintf(ver, sizeof(ver), "%d", m->version);
        const char *params[3] = {owner, ver, m->name};
        PGresult *res = PQexecParams(
            c, "INSERT INTO atrium_migrations (owner, version, name) VALUES ($1, $2, $3)", 3, NULL,
            params, NULL, NULL, 0);
        ok = PQresultStatus(res) == PGRES_COMMAND_OK;
        if (!ok) snprintf(err, sizeof(err), "%s", PQresultErrorMessage(res));
        PQclear(res);
        last = m->version;
        applied++;
    }
    if (ok) ok = db_exec_quiet(c, "COMMIT", 0, NULL, err, sizeof(err));
    if (!ok) {
        db_rollback(c);
        size_t len = strlen(err);
        while (len && err[len - 1] == '\n') err[--len] = '\0';
        rt_log(ATRIUM_LOG_ERROR, "core", "migrations for \"%s\" failed; nothing applied: %s",
               owner, err);
    } else if (applied) {
        rt_log(ATRIUM_LOG_INFO, "core", "applied %d migration(s) for \"%s\" (now at version %d)",
               applied, owner, last);
    }
    db_release(p, c);
    return ok ? 0 : -1;
}
