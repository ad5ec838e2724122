/*
 * core/store/db.c - the shared PostgreSQL connection pool (see db.h for the contract).
 *
 * Checkout and checkin run under one mutex with a condition variable; a checkout waits at
 * most its timeout, so an exhausted pool becomes a clean 503 upstream, never a hang and
 * never a misleading error. Health is checked at checkout: a connection whose status is
 * bad (its server restarted, or a query on it failed at the socket level) is reset then.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/runtime/core_runtime.h"
#include "core/store/db.h"

#define DB_RETRY_INTERVAL_MS 1000

typedef struct db_conn {
    PGconn *conn;
    bool busy;
} db_conn;

struct db_pool {
    char *conninfo;
    int size;
    db_conn *conns;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int idle;
    int64_t request_wait_ms; /* database.checkout_timeout_ms: what DB_WAIT_CONFIGURED means */
    rt_metric *m_in_use, *m_size, *m_timeouts, *m_resets;
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

db_pool *db_pool_new(const char *conninfo, int size, int64_t request_wait_ms,
                     rt_metrics *metrics)
{
    db_pool *p = calloc(1, sizeof(*p));
    if (!p) return NULL;
    p->conninfo = strdup(conninfo);
    p->size = size;
    p->request_wait_ms = request_wait_ms;
    p->conns = calloc((size_t)size, sizeof(db_conn));
    if (!p->conninfo || !p->conns) {
        db_pool_free(p);
        return NULL;
    }
    pthread_mutex_init(&p->mu, NULL);
    rt_cond_init(&p->cv);
    p->m_in_use = rt_metric_gauge(metrics, "atrium_db_connections_in_use", NULL,
                                  "PostgreSQL connections checked out");
    p->m_size = rt_metric_gauge(metrics, "atrium_db_connections", NULL,
                                "PostgreSQL connections in the pool");
    p->m_timeouts = rt_metric_counter(metrics, "atrium_db_acquire_timeouts_total", NULL,
                                      "Checkouts that found no connection in time");
    p->m_resets = rt_metric_counter(metrics, "atrium_db_resets_total", NULL,
                                    "Connections re-established after a failure");
    rt_metric_set(p->m_size, size);
    return p;
}

static void ignore_notice(void *arg, const char *message)
{
    (void)arg;
    (void)message;
}

static PGconn *open_one(const char *conninfo, char *err, size_t errlen)
{
    PGconn *c = PQconnectdb(conninfo);
    if (!c || PQstatus(c) != CONNECTION_OK) {
        snprintf(err, errlen, "%s", c ? PQerrorMessage(c) : "out of memory");
        size_t n = strlen(err);
        while (n && (err[n - 1] == '\n' || err[n - 1] == ' ')) err[--n] = '\0';
        if (c) PQfinish(c);
        return NULL;
    }
    /* Notices (e.g. "relation already exists, skipping") are not the operator's business. */
    PQsetNoticeProcessor(c, ignore_notice, NULL);
    return c;
}

int db_pool_connect(db_pool *p, int retry_s)
{
    int64_t until = rt_now_ms() + (int64_t)retry_s * 1000;
    char err[512] = "";
    for (int i = 0; i < p->size; i++) {
        for (;;) {
            p->conns[i].conn = open_one(p->conninfo, err, sizeof(err));
            if (p->conns[i].conn) break;
            if (rt_now_ms() >= until) {
                rt_log(ATRIUM_LOG_ERROR, "core",
                       "cannot connect to PostgreSQL after %d s: %s - check database.conninfo "
                       "and that the server is running",
                       retry_s, err);
                return -1;
            }
            if (i == 0)
                rt_log(ATRIUM_LOG_WARN, "core", "PostgreSQL not reachable yet (%s); retrying", err);
            struct timespec ts = {.tv_sec = DB_RETRY_INTERVAL_MS / 1000,
                                  .tv_nsec = (DB_RETRY_INTERVAL_MS % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    p->idle = p->size;
    return 0;
}

PGconn *db_acquire(db_pool *p, int64_t timeout_ms)
{
    if (!p) return NULL;
    if (timeout_ms == DB_WAIT_CONFIGURED) timeout_ms = p->request_wait_ms;
    int64_t until = rt_now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    pthread_mutex_lock(&p->mu);
    while (p->idle == 0) {
        struct timespec ts = {.tv_sec = until / 1000, .tv_nsec = (until % 1000) * 1000000L};
        if (rt_now_ms() >= until || pthread_cond_timedwait(&p->cv, &p->mu, &ts) != 0) {
            if (p->idle > 0) break;
            pthread_mutex_unlock(&p->mu);
            rt_metric_add(p->m_timeouts, 1);
            return NULL;
        }
    }
    db_conn *dc = NULL;
    for (int i = 0; i < p->size; i++) {
        if (!p->conns[i].busy) {
            dc = &p->conns[i];
            break;
        }
    }
    dc->busy = true;
    p->idle--;
    pthread_mutex_unlock(&p->mu);
    rt_metric_add(p->m_in_use, 1);

    /* Heal outside the lock: a reset may take a network round trip. */
    if (!dc->conn || PQstatus(dc->conn) != CONNECTION_OK) {
        rt_metric_add(p->m_resets, 1);
        if (dc->conn) PQreset(dc->conn);
        if (!dc->conn || PQstatus(dc->conn) != CONNECTION_OK) {
            char err[512];
            PGconn *fresh = open_one(p->conninfo, err, sizeof(err));
            if (!fresh) {
                rt_log(ATRIUM_LOG_ERROR, "core", "PostgreSQL connection lost and not restored: %s",
                       err);
                db_release(p, dc->conn);
                return NULL;
            }
            if (dc->conn) PQfinish(dc->conn);
            dc->conn = fresh;
        }
        rt_log(ATRIUM_LOG_INFO, "core", "PostgreSQL connection re-established");
    }
    return dc->conn;
}

void db_release(db_pool *p, PGconn *c)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->size; i++) {
        if (p->conns[i].busy && p->conns[i].conn == c) {
            p->conns[i].busy = false;
            p->idle++;
            pthread_cond_signal(&p->cv);
            break;
        }
    }
    pthread_mutex_unlock(&p->mu);
    rt_metric_add(p->m_in_use, -1);
}

const char *db_pool_conninfo(const db_pool *p)
{
    return p->conninfo;
}

void db_pool_free(db_pool *p)
{
    if (!p) return;
    if (p->conns) {
        for (int i = 0; i < p->size; i++)
            if (p->conns[i].conn) PQfinish(p->conns[i].conn);
    }
    free(p->conns);
    free(p->conninfo);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}

/* ---- migrations --------------------------------------------------------------------- */

static bool exec_ok(PGconn *c, const char *sql, char *err, size_t errlen)
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
    PGconn *c = db_acquire(p, DB_MIGRATE_WAIT_MS);
    if (!c) {
        rt_log(ATRIUM_LOG_ERROR, "core", "migrations for \"%s\": no database connection", owner);
        return -1;
    }
    char err[1024] = "";
    int applied = 0;
    bool ok = exec_ok(c, "BEGIN", err, sizeof(err)) &&
              /* One lock for every owner and process: migrations never race. */
              exec_ok(c, "SELECT pg_advisory_xact_lock(" DB_LOCK_MIGRATIONS ")", err,
                      sizeof(err)) &&
              exec_ok(c,
                      "CREATE TABLE IF NOT EXISTS atrium_migrations ("
                      " owner text NOT NULL, version integer NOT NULL, name text NOT NULL,"
                      " applied_at timestamptz NOT NULL DEFAULT now(),"
                      " PRIMARY KEY (owner, version))",
                      err, sizeof(err));
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
        if (!exec_ok(c, m->sql, err, sizeof(err))) {
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
    if (ok) ok = exec_ok(c, "COMMIT", err, sizeof(err));
    if (!ok) {
        PQclear(PQexec(c, "ROLLBACK"));
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
