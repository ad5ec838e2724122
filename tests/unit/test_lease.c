/*
 * tests/unit/test_lease.c - leases (core/store/lease.c) against the run's PostgreSQL
 * (ATRIUM_TEST_PG_CONNINFO, set by tests/run.sh; skipped without it), with two lease
 * services on one database standing for two processes: a lease is held by one of them
 * only; one given up at stop moves within a quarter of its ttl; one whose holder died
 * (its row left to expire) moves within the ttl; a holder whose renewal hangs stops
 * believing before its row expires; bad names and ttls are refused; a lease shared out by
 * choice (lease_create_idle, lease_want) is tried only while wanted and, given up, reads
 * as not held at once and moves within a quarter of its ttl; lease_count_live counts the
 * live leases under a prefix and prunes long-expired ones. Runs under TSan (the lease
 * thread against lease_held readers and lease_want callers).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/store/lease.h"

#define TTL_MS 1500
#define SLACK_MS 700 /* scheduling and statement time on a loaded 2-core machine */
#define POLL_MS 10

static char db_name[64];
static char conninfo[1024];

static const char *pg_conninfo(void)
{
    const char *v = getenv("ATRIUM_TEST_PG_CONNINFO");
    return v && *v ? v : NULL;
}

static PGconn *connect_to(const char *dbname)
{
    char ci[1024];
    snprintf(ci, sizeof(ci), "%s dbname=%s", pg_conninfo(), dbname);
    PGconn *c = PQconnectdb(ci);
    if (PQstatus(c) != CONNECTION_OK) fail_msg("cannot reach PostgreSQL: %s", PQerrorMessage(c));
    return c;
}

static void exec_on(PGconn *c, const char *sql)
{
    PGresult *r = PQexec(c, sql);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
        fail_msg("%s: %s", sql, PQresultErrorMessage(r));
    PQclear(r);
}

static void admin_exec(const char *sql)
{
    PGconn *c = connect_to("postgres");
    exec_on(c, sql);
    PQfinish(c);
}

static int setup(void **state)
{
    (void)state;
    if (!pg_conninfo()) return 0;
    char sql[128];
    snprintf(db_name, sizeof(db_name), "atrium_test_lease_%d", (int)getpid());
    snprintf(sql, sizeof(sql), "CREATE DATABASE \"%s\"", db_name);
    admin_exec(sql);
    snprintf(conninfo, sizeof(conninfo), "%s dbname=%s", pg_conninfo(), db_name);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (!pg_conninfo()) return 0;
    char sql[128];
    snprintf(sql, sizeof(sql), "DROP DATABASE \"%s\" WITH (FORCE)", db_name);
    admin_exec(sql);
    return 0;
}

#define NEED_PG()                                                                          \
    do {                                                                                   \
        if (!pg_conninfo()) {                                                              \
            fprintf(stderr, "ATRIUM_TEST_PG_CONNINFO is not set (run through "             \
                            "tests/run.sh): skipping\n");                                  \
            skip();                                                                        \
        }                                                                                  \
    } while (0)

/* A "process": its own pool and lease service. */
typedef struct proc {
    db_pool *db;
    lease_service *s;
} proc;

static proc start_proc(const char *holder)
{
    proc p = {.db = db_pool_new(conninfo, 2, 2000, NULL)};
    assert_non_null(p.db);
    assert_int_equal(db_pool_connect(p.db, 5), 0);
    p.s = lease_service_new(p.db, holder, NULL);
    assert_non_null(p.s);
    assert_int_equal(lease_service_start(p.s), 0);
    return p;
}

static void end_proc(proc *p)
{
    lease_service_free(p->s);
    db_pool_free(p->db);
}

/* Wait up to ms for l to be held (want 1) or not (want 0); the ms it took, or -1. */
static int64_t wait_held(const lease *l, bool want, int64_t ms)
{
    int64_t t0 = rt_now_ms();
    while (rt_now_ms() - t0 <= ms) {
        if (lease_held(l) == want) return rt_now_ms() - t0;
        usleep(POLL_MS * 1000);
    }
    return -1;
}

static atomic_int gains;
static void count_gain(void *arg)
{
    (void)arg;
    atomic_fetch_add(&gains, 1);
}

/* on_gain runs just after the lease reads as held (same thread, next statement): a
 * reader that saw lease_held() true waits a moment for the callback, never longer. */
static int wait_gains(int want, int64_t ms)
{
    int64_t t0 = rt_now_ms();
    while (atomic_load(&gains) < want && rt_now_ms() - t0 <= ms) usleep(POLL_MS * 1000);
    return atomic_load(&gains);
}

static void test_bad_names_and_ttls_are_refused(void **state)
{
    (void)state;
    NEED_PG();
    proc a = start_proc("a");
    assert_null(lease_create(a.s, "", TTL_MS, NULL, NULL));
    assert_null(lease_create(a.s, "Upper.Case", TTL_MS, NULL, NULL));
    assert_null(lease_create(a.s, "with space", TTL_MS, NULL, NULL));
    assert_null(lease_create(a.s, "short.ttl", LEASE_MIN_TTL_MS - 1, NULL, NULL));
    assert_null(lease_create(a.s, "long.ttl", LEASE_MAX_TTL_MS + 1, NULL, NULL));
    assert_non_null(lease_create(a.s, "once", TTL_MS, NULL, NULL));
    assert_null(lease_create(a.s, "once", TTL_MS, NULL, NULL)); /* one lease per name */
    assert_true(lease_held(NULL)); /* no service: the job runs (a single process) */
    end_proc(&a);
}

static void test_a_lease_created_later_is_tried_at_once(void **state)
{
    (void)state;
    NEED_PG();
    proc a = start_proc("a");
    const int64_t long_ttl_ms = 8000; /* the first lease's next renewal is 2 s away */
    lease *first = lease_create(a.s, "test.first", long_ttl_ms, NULL, NULL);
    assert_true(wait_held(first, true, TTL_MS) >= 0);
    lease *second = lease_create(a.s, "test.second", long_ttl_ms, NULL, NULL);
    int64_t took = wait_held(second, true, long_ttl_ms / 4 - 500);
    assert_true(took >= 0); /* not at the first one's renewal */
    end_proc(&a);
}

static void test_one_process_holds_a_lease_and_a_stop_hands_it_over(void **state)
{
    (void)state;
    NEED_PG();
    proc a = start_proc("a");
    atomic_store(&gains, 0);
    lease *la = lease_create(a.s, "test.handover", TTL_MS, count_gain, NULL);
    assert_true(wait_held(la, true, TTL_MS) >= 0);
    assert_int_equal(wait_gains(1, SLACK_MS), 1);

    proc b = start_proc("b");
    lease *lb = lease_create(b.s, "test.handover", TTL_MS, NULL, NULL);
    /* b tries at once and then every ttl / 4: over a whole ttl it never gets it. */
    assert_int_equal(wait_held(lb, true, TTL_MS), -1);
    assert_true(lease_held(la));
    assert_int_equal(atomic_load(&gains), 1); /* renewals are not gains */

    lease_service_stop(a.s); /* gives the lease up */
    assert_false(lease_held(la));
    int64_t took = wait_held(lb, true, TTL_MS / 4 + SLACK_MS);
    assert_true(took >= 0);
    end_proc(&a);
    end_proc(&b);
}

static void test_a_dead_holders_lease_moves_within_its_ttl(void **state)
{
    (void)state;
    NEED_PG();
    proc b = start_proc("b");
    /* What a holder that died just after a renewal leaves: its row, expiring 2/3 ttl on. */
    PGconn *c = connect_to(db_name);
    char sql[512];
    snprintf(sql, sizeof(sql),
             "INSERT INTO core_leases (name, holder, expires_at, since) VALUES ('test.dead',"
             " 'dead/00000000', clock_timestamp() + interval '%d milliseconds', now())",
             TTL_MS * 2 / 3);
    exec_on(c, sql);
    int64_t t0 = rt_now_ms();
    lease *lb = lease_create(b.s, "test.dead", TTL_MS, NULL, NULL);
    assert_true(wait_held(lb, true, TTL_MS + SLACK_MS) >= 0);
    int64_t took = rt_now_ms() - t0;
    assert_true(took >= TTL_MS * 2 / 3 - 50); /* not before the dead one's row expired */
    assert_true(took <= TTL_MS + SLACK_MS);
    PGresult *r = PQexec(c, "SELECT holder FROM core_leases WHERE name = 'test.dead'");
    assert_int_equal(PQntuples(r), 1);
    assert_int_equal(strncmp(PQgetvalue(r, 0, 0), "b/", 2), 0);
    PQclear(r);
    PQfinish(c);
    end_proc(&b);
}

static void test_a_holder_whose_renewal_hangs_stops_believing_before_its_row_expires(
    void **state)
{
    (void)state;
    NEED_PG();
    proc a = start_proc("a");
    lease *la = lease_create(a.s, "test.hang", TTL_MS, NULL, NULL);
    assert_true(wait_held(la, true, TTL_MS) >= 0);
    /* Another session locks the table: a's next renewal waits on the lock. */
    PGconn *c = connect_to(db_name);
    exec_on(c, "BEGIN");
    exec_on(c, "LOCK TABLE core_leases IN ACCESS EXCLUSIVE MODE");
    int64_t t0 = rt_now_ms();
    assert_true(wait_held(la, false, TTL_MS) >= 0); /* within ttl / 2 of the last renewal */
    assert_true(rt_now_ms() - t0 <= TTL_MS / 2 + SLACK_MS);
    /* At that moment the row a wrote has not expired yet by the database's clock (read
     * inside the locking transaction): no other process could have taken the lease while
     * a still believed it held it. */
    PGresult *r = PQexec(c, "SELECT expires_at > clock_timestamp() FROM core_leases"
                            " WHERE name = 'test.hang'");
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    assert_int_equal(PQntuples(r), 1);
    assert_string_equal(PQgetvalue(r, 0, 0), "t");
    PQclear(r);
    exec_on(c, "COMMIT");
    /* The lock gone, renewals succeed again and a holds it once more. */
    assert_true(wait_held(la, true, TTL_MS + SLACK_MS) >= 0);
    PQfinish(c);
    end_proc(&a);
}

static int64_t rows_named(PGconn *c, const char *name)
{
    const char *p[1] = {name};
    PGresult *r = PQexecParams(c, "SELECT count(*) FROM core_leases WHERE name = $1", 1, NULL,
                               p, NULL, NULL, 0);
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    int64_t n = atoll(PQgetvalue(r, 0, 0));
    PQclear(r);
    return n;
}

static void test_an_idle_lease_is_taken_only_while_wanted_and_given_up_at_once(void **state)
{
    (void)state;
    NEED_PG();
    proc a = start_proc("a"), b = start_proc("b");
    PGconn *c = connect_to(db_name);
    lease *la = lease_create_idle(a.s, "test.shared", TTL_MS, NULL, NULL);
    assert_non_null(la);
    assert_null(lease_create_idle(a.s, "test.shared", TTL_MS, NULL, NULL)); /* one per name */
    /* Not wanted: never tried, over a round and more. */
    assert_int_equal(wait_held(la, true, TTL_MS / 2), -1);
    assert_int_equal(rows_named(c, "test.shared"), 0);
    lease_want(la, true);
    assert_true(wait_held(la, true, SLACK_MS) >= 0); /* tried at once, not at a round */

    lease *lb = lease_create_idle(b.s, "test.shared", TTL_MS, NULL, NULL);
    lease_want(lb, true);
    assert_int_equal(wait_held(lb, true, TTL_MS / 2), -1); /* a holds it */
    lease_want(la, false);
    assert_false(lease_held(la)); /* from the moment lease_want returns */
    int64_t took = wait_held(lb, true, TTL_MS / 4 + SLACK_MS); /* a's row deleted at once */
    assert_true(took >= 0);
    assert_false(lease_held(la));
    PGresult *r = PQexec(c, "SELECT holder FROM core_leases WHERE name = 'test.shared'");
    assert_int_equal(PQntuples(r), 1);
    assert_int_equal(strncmp(PQgetvalue(r, 0, 0), "b/", 2), 0);
    PQclear(r);
    lease_want(la, true); /* wanted again: tried, refused while b holds it */
    assert_int_equal(wait_held(la, true, TTL_MS / 2), -1);
    assert_true(lease_held(lb));
    PQfinish(c);
    end_proc(&a);
    end_proc(&b);
}

static void test_live_leases_under_a_prefix_are_counted_and_long_expired_ones_pruned(
    void **state)
{
    (void)state;
    NEED_PG();
    proc a = start_proc("a"), b = start_proc("b");
    PGconn *c = connect_to(db_name);
    lease *la = lease_create(a.s, "test.senders.a", TTL_MS, NULL, NULL);
    lease *lb = lease_create(b.s, "test.senders.b", TTL_MS, NULL, NULL);
    assert_non_null(lease_create(a.s, "test.sendersx", TTL_MS, NULL, NULL)); /* not under it */
    assert_true(wait_held(la, true, TTL_MS) >= 0);
    assert_true(wait_held(lb, true, TTL_MS) >= 0);
    char sql[512];
    snprintf(sql, sizeof(sql),
             "INSERT INTO core_leases (name, holder, expires_at, since) VALUES"
             " ('test.senders.recent', 'dead/1', clock_timestamp() - interval '1 second', now()),"
             " ('test.senders.old', 'dead/2', clock_timestamp() - interval '%lld milliseconds'"
             " - interval '1 second', now())",
             (long long)LEASE_MAX_TTL_MS);
    exec_on(c, sql);
    assert_int_equal(lease_count_live(c, "test.senders."), 2);
    assert_int_equal(rows_named(c, "test.senders.old"), 0);    /* pruned */
    assert_int_equal(rows_named(c, "test.senders.recent"), 1); /* expired lately: kept */
    end_proc(&b); /* gives its lease up */
    assert_int_equal(lease_count_live(c, "test.senders."), 1);
    PQfinish(c);
    end_proc(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_names_and_ttls_are_refused),
        cmocka_unit_test(test_a_lease_created_later_is_tried_at_once),
        cmocka_unit_test(test_one_process_holds_a_lease_and_a_stop_hands_it_over),
        cmocka_unit_test(test_a_dead_holders_lease_moves_within_its_ttl),
        cmocka_unit_test(test_a_holder_whose_renewal_hangs_stops_believing_before_its_row_expires),
        cmocka_unit_test(test_an_idle_lease_is_taken_only_while_wanted_and_given_up_at_once),
        cmocka_unit_test(test_live_leases_under_a_prefix_are_counted_and_long_expired_ones_pruned),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
