/*
 * core/store/lease.c - leases for once-only background jobs, kept in PostgreSQL.
 *
 * Several processes share one database; a job such as the federation sender must run in
 * one of them at a time, and in another one soon after that one dies. This file owns how
 * a process knows it is the one. A lease is a row of core_leases (name, holder, expires_at)
 * and one statement both takes and renews it: an upsert that writes this process as the
 * holder with a new expiry only where the row is absent, already ours, or expired
 * (judged by the database's clock, so the processes' clocks need not agree). The row it
 * returns, or none, is the answer. One thread per process (the "lease thread") runs that
 * statement for each lease every ttl / 4 (ttl / 8 after a failure), borrowing a pooled
 * connection for the statement only.
 *
 * Why a row and not a session advisory lock: an advisory lock is held by a connection,
 * so it would pin one connection per lease (or a dedicated connection for all of them,
 * whose loss must then be noticed before another process may run the job: a held lock
 * outlives a silent network partition until TCP gives up). A row with an expiry makes
 * the bound explicit: whatever happens to the holder, the job moves after the expiry,
 * and the holder stops believing before that moment without asking anyone.
 *
 * The arithmetic. A statement sent at local monotonic time t writes expires_at = the
 * database's now + 2/3 ttl; the holder trusts its lease until t + 1/2 ttl (lease_held
 * compares the clock, nothing else). The database's now is later than t, so the belief
 * ends at least ttl / 6 before the row expires: two processes never both believe they
 * hold it, with ttl / 6 to spare for clocks that run at slightly different rates. The
 * belief outlasts the next renewal (ttl / 4 later) by ttl / 4, so one slow or failed
 * renewal (retried after ttl / 8) does not drop the lease. A holder that dies leaves a
 * row that expires at most 2/3 ttl later, and every other process tries every ttl / 4,
 * so one takes it over within 11/12 ttl of the death: the "within ttl" of lease_create.
 * A renewal that fails (no connection, a statement error, PostgreSQL unreachable)
 * changes nothing: the belief runs out by itself, also while a statement hangs. A
 * process that stops gives its leases up (DELETE), so a restart moves jobs within ttl / 4.
 *
 * A lease may also be shared out by choice rather than taken by whoever is first: one
 * made with lease_create_idle is tried only while its process wants it (lease_want), and
 * a process that stops wanting one stops believing at once and deletes its row at the
 * next round (woken at once), so another takes it within ttl / 4. This is how the
 * federation sender's destination groups move between live processes
 * (core/federation/transport/fed_outbound_groups.c); lease_count_live counts the
 * processes that announce themselves with a lease of their own.
 *
 * What this file does not do: run or stop the jobs. A job checks lease_held before each
 * run and is woken by on_gain when its process takes the lease over; a job already
 * running when its lease lapses finishes that run (keep runs short against the ttl).
 * Metrics: atrium_lease_held{lease} (1 while held), atrium_lease_taken_total{lease}.
 */
#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/store/lease.h"

#define LEASE_HOLDER_SUFFIX_BYTES 4 /* random bytes after the instance name, as hex */
#define LEASE_HOLDER_MAX_BYTES 96
#define LEASE_RENEW_DIVISOR 4       /* a lease is renewed (or tried) every ttl / 4 */
#define LEASE_RETRY_DIVISOR 8       /* after a failed statement: every ttl / 8 */
/* See the arithmetic above: the row lasts 2/3 ttl after a renewal, the belief 1/2 ttl. */
#define LEASE_ROW_NUM 2
#define LEASE_ROW_DEN 3
#define LEASE_BELIEF_DIVISOR 2
#define LEASE_DB_WAIT_MAX_MS 1000   /* a round's wait for a pooled connection, at most */
#define LEASE_RELEASE_DB_WAIT_MS 2000

struct lease {
    lease_service *s;
    lease *next; /* written before the lease is published, never after */
    char name[LEASE_NAME_MAX_BYTES];
    int64_t ttl_ms;
    void (*on_gain)(void *arg);
    void *arg;
    _Atomic int64_t held_until_ms; /* monotonic; 0 = not held */
    _Atomic bool wanted;  /* false: not tried, given up (lease_want) */
    _Atomic bool changed; /* lease_want changed `wanted`: due at the next round */
    /* lease thread only */
    int64_t next_try_ms;
    bool was_held;
    rt_metric *m_held, *m_taken;
};

struct lease_service {
    db_pool *db;
    rt_metrics *metrics;
    char holder[LEASE_HOLDER_MAX_BYTES];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    lease *leases; /* under mu */
    bool stopping, started;
    pthread_t thread;
};

static const atrium_migration LEASE_MIGRATIONS[] = {
    {1, "core_leases",
     "CREATE TABLE core_leases ("
     " name text PRIMARY KEY,"
     " holder text NOT NULL,"
     " expires_at timestamptz NOT NULL,"
     " since timestamptz NOT NULL)"},
};

/* The one statement that takes or renews a lease (see the top of the file): a row back
 * means this process holds it until the new expiry. */
static const char LEASE_TAKE_SQL[] =
    "INSERT INTO core_leases AS l (name, holder, expires_at, since)"
    " VALUES ($1, $2, clock_timestamp() + $3::bigint * interval '1 millisecond',"
    " clock_timestamp())"
    " ON CONFLICT (name) DO UPDATE SET holder = excluded.holder,"
    " expires_at = excluded.expires_at,"
    " since = CASE WHEN l.holder = excluded.holder THEN l.since ELSE excluded.since END"
    " WHERE l.holder = excluded.holder OR l.expires_at < clock_timestamp()"
    " RETURNING 1";

static bool name_ok(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n >= LEASE_NAME_MAX_BYTES) return false;
    for (const char *c = name; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_' || *c == '.'))
            return false;
    return true;
}

lease_service *lease_service_new(db_pool *db, const char *holder, rt_metrics *metrics)
{
    lease_service *s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    unsigned char raw[LEASE_HOLDER_SUFFIX_BYTES];
    char hex[2 * LEASE_HOLDER_SUFFIX_BYTES + 1];
    randombytes_buf(raw, sizeof(raw));
    sodium_bin2hex(hex, sizeof(hex), raw, sizeof(raw));
    snprintf(s->holder, sizeof(s->holder), "%.64s/%s", holder && *holder ? holder : "atrium",
             hex);
    s->db = db;
    s->metrics = metrics;
    pthread_mutex_init(&s->mu, NULL);
    rt_cond_init(&s->cv);
    return s;
}

bool lease_held(const lease *l)
{
    if (!l) return true;
    return atomic_load(&l->wanted) && rt_now_ms() < atomic_load(&l->held_until_ms);
}

const char *lease_name(const lease *l)
{
    return l ? l->name : "";
}

const char *lease_holder(const lease *l)
{
    return l ? l->s->holder : "";
}

/* One statement for l on c: take or renew it. Returns false when the statement failed
 * (nothing is known then; the belief runs out by itself). */
static bool take_or_renew(lease_service *s, PGconn *c, lease *l)
{
    char valid[24];
    snprintf(valid, sizeof(valid), "%lld",
             (long long)(l->ttl_ms * LEASE_ROW_NUM / LEASE_ROW_DEN));
    const char *p[3] = {l->name, s->holder, valid};
    int64_t sent = rt_now_ms();
    PGresult *res = db_query(c, LEASE_TAKE_SQL, 3, p);
    bool ok = PQresultStatus(res) == PGRES_TUPLES_OK;
    if (ok) {
        atomic_store(&l->held_until_ms,
                     PQntuples(res) > 0 ? sent + l->ttl_ms / LEASE_BELIEF_DIVISOR : 0);
        /* lease_want(l, false) meanwhile: whichever order the two stores ran in, the
         * belief ends here (its release round follows, `changed` is set). */
        if (!atomic_load(&l->wanted)) atomic_store(&l->held_until_ms, 0);
    } else
        rt_log(ATRIUM_LOG_WARN, "core", "lease %s could not be renewed: %s", l->name,
               PQerrorMessage(c));
    PQclear(res);
    return ok;
}

/* Give l's row up (if this process holds it): one DELETE on c. */
static void give_up(lease_service *s, PGconn *c, lease *l)
{
    const char *p[2] = {l->name, s->holder};
    PGresult *res = db_query(c, "DELETE FROM core_leases WHERE name = $1 AND holder = $2", 2, p);
    if (PQresultStatus(res) != PGRES_COMMAND_OK)
        rt_log(ATRIUM_LOG_WARN, "core", "lease %s could not be given up (it expires by itself "
               "within its ttl): %s", l->name, PQerrorMessage(c));
    PQclear(res);
}

/* After a statement (or none, when no connection was had): report a change of hands. */
static void note_transition(lease_service *s, lease *l)
{
    bool held = lease_held(l);
    rt_metric_set(l->m_held, held ? 1 : 0);
    if (held && !l->was_held) {
        rt_metric_add(l->m_taken, 1);
        rt_log(ATRIUM_LOG_INFO, "core", "lease %s taken (holder %s)", l->name, s->holder);
        l->was_held = true;
        if (l->on_gain) l->on_gain(l->arg);
    } else if (!held && l->was_held) {
        if (atomic_load(&l->wanted))
            rt_log(ATRIUM_LOG_WARN, "core", "lease %s lost: another process runs its job now, "
                   "or will once it takes the lease", l->name);
        else
            rt_log(ATRIUM_LOG_INFO, "core", "lease %s given up for another process", l->name);
        l->was_held = false;
    }
}

/* One round over the leases due at now (one borrowed connection for all of them). */
static void round_due(lease_service *s, lease *head, int64_t now)
{
    int64_t wait = LEASE_DB_WAIT_MAX_MS;
    for (lease *l = head; l; l = l->next)
        if (l->next_try_ms <= now && l->ttl_ms / LEASE_RETRY_DIVISOR < wait)
            wait = l->ttl_ms / LEASE_RETRY_DIVISOR;
    PGconn *c = db_acquire(s->db, wait);
    for (lease *l = head; l; l = l->next) {
        bool changed = atomic_exchange(&l->changed, false);
        if (!changed && l->next_try_ms > now) continue;
        if (atomic_load(&l->wanted)) {
            bool ok = c && take_or_renew(s, c, l);
            l->next_try_ms = rt_now_ms() + l->ttl_ms / (ok ? LEASE_RENEW_DIVISOR
                                                           : LEASE_RETRY_DIVISOR);
        } else {
            /* Not wanted: never tried. Its row goes now; without a connection it expires. */
            if (changed && c) give_up(s, c, l);
            l->next_try_ms = INT64_MAX;
        }
        note_transition(s, l);
    }
    if (c) db_release(s->db, c);
}

static void *lease_main(void *arg)
{
    lease_service *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!s->stopping) {
        int64_t now = rt_now_ms(), next = INT64_MAX;
        for (lease *l = s->leases; l; l = l->next) {
            if (l->next_try_ms < next) next = l->next_try_ms; /* 0: a new lease, due now */
            if (atomic_load(&l->changed)) next = now;
        }
        if (next > now) {
            /* 0: until a lease is created or wanted */
            rt_scope_wait(&s->cv, &s->mu, next == INT64_MAX ? 0 : next);
            continue;
        }
        lease *head = s->leases;
        pthread_mutex_unlock(&s->mu);
        round_due(s, head, now);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int lease_service_start(lease_service *s)
{
    if (db_migrate(s->db, "leases", LEASE_MIGRATIONS,
                   sizeof(LEASE_MIGRATIONS) / sizeof(LEASE_MIGRATIONS[0])) < 0)
        return -1;
    if (pthread_create(&s->thread, NULL, lease_main, s) != 0) {
        rt_log(ATRIUM_LOG_ERROR, "core", "cannot start the lease thread");
        return -1;
    }
    s->started = true;
    rt_log(ATRIUM_LOG_INFO, "core", "leases are held as %s", s->holder);
    return 0;
}

static lease *create(lease_service *s, const char *name, int64_t ttl_ms,
                     void (*on_gain)(void *arg), void *arg, bool wanted)
{
    if (!s || !name_ok(name) || ttl_ms < LEASE_MIN_TTL_MS || ttl_ms > LEASE_MAX_TTL_MS)
        return NULL;
    lease *l = calloc(1, sizeof(*l));
    if (!l) return NULL;
    l->s = s;
    snprintf(l->name, sizeof(l->name), "%s", name);
    l->ttl_ms = ttl_ms;
    atomic_init(&l->wanted, wanted);
    atomic_init(&l->changed, false);
    l->next_try_ms = wanted ? 0 : INT64_MAX;
    l->on_gain = on_gain;
    l->arg = arg;
    char labels[RT_METRIC_LABELS_MAX_BYTES];
    if (rt_metric_label(labels, sizeof(labels), "lease", name) < 0) labels[0] = '\0';
    l->m_held = rt_metric_gauge(s->metrics, "atrium_lease_held", labels,
                                "1 while this process holds the lease (its job runs here)");
    l->m_taken = rt_metric_counter(s->metrics, "atrium_lease_taken_total", labels,
                                   "Times this process took the lease");
    pthread_mutex_lock(&s->mu);
    for (lease *o = s->leases; o; o = o->next)
        if (strcmp(o->name, name) == 0) {
            pthread_mutex_unlock(&s->mu);
            free(l);
            return NULL;
        }
    l->next = s->leases;
    s->leases = l; /* next_try_ms 0: due at once */
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return l;
}

lease *lease_create(lease_service *s, const char *name, int64_t ttl_ms,
                    void (*on_gain)(void *arg), void *arg)
{
    return create(s, name, ttl_ms, on_gain, arg, true);
}

lease *lease_create_idle(lease_service *s, const char *name, int64_t ttl_ms,
                         void (*on_gain)(void *arg), void *arg)
{
    return create(s, name, ttl_ms, on_gain, arg, false);
}

void lease_want(lease *l, bool want)
{
    if (!l) return;
    lease_service *s = l->s;
    pthread_mutex_lock(&s->mu);
    if (atomic_load(&l->wanted) != want) {
        atomic_store(&l->wanted, want);
        if (!want) atomic_store(&l->held_until_ms, 0); /* lease_held is false from here */
        atomic_store(&l->changed, true);
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
}

int lease_count_live(PGconn *c, const char *prefix)
{
    char stale[24];
    snprintf(stale, sizeof(stale), "%lld", (long long)LEASE_MAX_TTL_MS);
    const char *p[2] = {prefix, stale};
    PGresult *res = db_query(
        c,
        "WITH gone AS (DELETE FROM core_leases WHERE left(name, length($1)) = $1"
        " AND expires_at < clock_timestamp() - $2::bigint * interval '1 millisecond')"
        " SELECT count(*) FROM core_leases WHERE left(name, length($1)) = $1"
        " AND expires_at > clock_timestamp()",
        2, p);
    int n = -1;
    if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
        n = atoi(PQgetvalue(res, 0, 0));
    else
        rt_log(ATRIUM_LOG_WARN, "core", "leases under %s could not be counted: %s", prefix,
               PQerrorMessage(c));
    PQclear(res);
    return n;
}

void lease_service_stop(lease_service *s)
{
    if (!s || !s->started) return;
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    s->started = false;
    PGconn *c = NULL;
    for (lease *l = s->leases; l; l = l->next) {
        if (!lease_held(l)) continue;
        atomic_store(&l->held_until_ms, 0);
        rt_metric_set(l->m_held, 0);
        if (!c && !(c = db_acquire(s->db, LEASE_RELEASE_DB_WAIT_MS))) continue; /* expires */
        give_up(s, c, l);
        rt_log(ATRIUM_LOG_INFO, "core", "lease %s given up", l->name);
    }
    if (c) db_release(s->db, c);
}

void lease_service_free(lease_service *s)
{
    if (!s) return;
    lease_service_stop(s);
    for (lease *l = s->leases, *next; l; l = next) {
        next = l->next;
        free(l);
    }
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}
