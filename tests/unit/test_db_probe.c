/*
 * tests/unit/test_db_probe.c - the pool's probe (core/store/db.c) against the run's
 * PostgreSQL (ATRIUM_TEST_PG_CONNINFO, set by tests/run.sh; skipped without it), seen from
 * pg_stat_activity through the pool's own application_name: a connected pool holds one
 * session (the probe opens none of its own at start); probes run on an idle pool
 * connection while there is one; with every pool connection borrowed, the probe opens a
 * connection of its own and the database stays available.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/store/db.h"

/* Longer than db.c's DB_SUSPECT_MS plus a few of its re-probe intervals. */
#define WAIT_FOR_PROBES_MS 5000

static const char *pg_conninfo(void)
{
    const char *v = getenv("ATRIUM_TEST_PG_CONNINFO");
    return v && *v ? v : NULL;
}

static char app_name[64];

/* Sessions of the pool under test (its application_name), all or those whose last
 * statement was `query`, counted on admin's own session. */
static int sessions(PGconn *admin, const char *query)
{
    const char *params[2] = {app_name, query};
    PGresult *r = PQexecParams(admin,
                               "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1"
                               " AND ($2::text IS NULL OR query = $2)",
                               2, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK) fail_msg("%s", PQresultErrorMessage(r));
    int n = atoi(PQgetvalue(r, 0, 0));
    PQclear(r);
    return n;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Waits up to WAIT_FOR_PROBES_MS for sessions(admin, query) to reach want; the count. */
static int await_sessions(PGconn *admin, const char *query, int want)
{
    int n = sessions(admin, query);
    for (int waited = 0; n != want && waited < WAIT_FOR_PROBES_MS; waited += 20) {
        sleep_ms(20);
        n = sessions(admin, query);
    }
    return n;
}

static void test_probes_use_an_idle_pool_connection_and_their_own_only_when_none_is(void **state)
{
    (void)state;
    if (!pg_conninfo()) {
        fprintf(stderr, "ATRIUM_TEST_PG_CONNINFO is not set (run through tests/run.sh): "
                        "skipping\n");
        skip();
    }
    snprintf(app_name, sizeof(app_name), "atrium-test-db-probe-%d", (int)getpid());
    char conninfo[1024];
    snprintf(conninfo, sizeof(conninfo), "%s dbname=postgres application_name=%s",
             pg_conninfo(), app_name);
    char admin_info[1024];
    snprintf(admin_info, sizeof(admin_info), "%s dbname=postgres", pg_conninfo());
    PGconn *admin = PQconnectdb(admin_info);
    if (PQstatus(admin) != CONNECTION_OK)
        fail_msg("cannot reach PostgreSQL: %s", PQerrorMessage(admin));

    rt_metrics *m = rt_metrics_new();
    db_pool *p = db_pool_new(conninfo, 2, 2000, m);
    assert_non_null(p);
    assert_int_equal(db_pool_connect(p, 5), 0);
    /* Connected: the pool's first connection, and no probe connection beside it. */
    assert_int_equal(sessions(admin, NULL), 1);

    /* A second pool connection, idle (nothing run on it yet). */
    PGconn *first = db_acquire(p, 2000);
    assert_non_null(first);
    PGconn *second = db_acquire(p, 2000);
    assert_non_null(second);
    db_release(p, second);
    assert_int_equal(sessions(admin, NULL), 2);

    /* The first one borrowed long enough to make the monitor suspicious: it probes, on the
     * idle second connection (its last statement becomes the probe's), opening nothing. */
    assert_int_equal(await_sessions(admin, "SELECT 1", 1), 1);
    assert_int_equal(sessions(admin, NULL), 2);
    assert_true(db_available(p));

    /* Both borrowed: the probe needs a connection of its own, and PostgreSQL answers it. */
    second = db_acquire(p, 2000);
    assert_non_null(second);
    assert_int_equal(await_sessions(admin, NULL, 3), 3);
    assert_int_equal(await_sessions(admin, "SELECT 1", 2), 2);
    assert_true(db_available(p));
    rt_metric *size = rt_metric_gauge(m, "atrium_db_connections", NULL, "t");
    assert_int_equal(rt_metric_value(size), 2); /* the probe's is not the pool's */

    db_release(p, second);
    db_release(p, first);
    db_pool_free(p);
    rt_metrics_free(m);
    PQfinish(admin);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_probes_use_an_idle_pool_connection_and_their_own_only_when_none_is),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
