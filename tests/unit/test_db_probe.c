/*
 * tests/unit/test_db_probe.c - the pool's probe (core/store/db.c) against the run's
 * PostgreSQL (ATRIUM_TEST_PG_CONNINFO, set by tests/run.sh; skipped without it), seen from
 * pg_stat_activity through the pool's own application_name: the probe keeps a connection
 * of its own from the start, so a database that refuses new connections while the pool's
 * keep working (at max_connections, say) is not taken for an outage when every pool
 * connection is borrowed. (Probing on an idle pool connection and opening the probe's
 * only when none was idle saved a session a start, and made exactly that case an outage:
 * a clean-clone run of the suite failed on it.)
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

/* Runs sql on admin, failing the test on an error. */
static void admin_exec(PGconn *admin, const char *sql)
{
    PGresult *r = PQexec(admin, sql);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) fail_msg("%s: %s", sql, PQresultErrorMessage(r));
    PQclear(r);
}

static void test_a_database_refusing_new_connections_is_no_outage_while_the_pool_is_busy(void **state)
{
    (void)state;
    if (!pg_conninfo()) {
        fprintf(stderr, "ATRIUM_TEST_PG_CONNINFO is not set (run through tests/run.sh): "
                        "skipping\n");
        skip();
    }
    snprintf(app_name, sizeof(app_name), "atrium-test-db-probe-%d", (int)getpid());
    char db[64], sql[256], conninfo[1024], admin_info[1024];
    snprintf(db, sizeof(db), "atrium_test_db_probe_%d", (int)getpid());
    snprintf(admin_info, sizeof(admin_info), "%s dbname=postgres", pg_conninfo());
    PGconn *admin = PQconnectdb(admin_info);
    if (PQstatus(admin) != CONNECTION_OK)
        fail_msg("cannot reach PostgreSQL: %s", PQerrorMessage(admin));
    snprintf(sql, sizeof(sql), "DROP DATABASE IF EXISTS %s", db);
    admin_exec(admin, sql);
    snprintf(sql, sizeof(sql), "CREATE DATABASE %s", db);
    admin_exec(admin, sql);
    snprintf(conninfo, sizeof(conninfo), "%s dbname=%s application_name=%s", pg_conninfo(), db,
             app_name);

    rt_metrics *m = rt_metrics_new();
    db_pool *p = db_pool_new(conninfo, 1, 2000, m);
    assert_non_null(p);
    assert_int_equal(db_pool_connect(p, 5), 0);
    /* Connected: the pool's first connection and the probe's own. */
    assert_int_equal(await_sessions(admin, NULL, 2), 2);

    /* New connections refused from now on; the open ones go on working. */
    snprintf(sql, sizeof(sql), "ALTER DATABASE %s WITH ALLOW_CONNECTIONS false", db);
    admin_exec(admin, sql);
    /* The pool's only connection borrowed, longer than DB_SUSPECT_MS: the monitor probes,
     * on its own connection, and PostgreSQL answers. */
    PGconn *only = db_acquire(p, 2000);
    assert_non_null(only);
    sleep_ms(WAIT_FOR_PROBES_MS);
    assert_true(db_available(p));
    PGresult *r = PQexec(only, "SELECT 1");
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK); /* not cut under its borrower */
    PQclear(r);
    db_release(p, only);
    PGconn *again = db_acquire(p, 2000);
    assert_non_null(again);
    db_release(p, again);

    db_pool_free(p);
    rt_metrics_free(m);
    snprintf(sql, sizeof(sql), "ALTER DATABASE %s WITH ALLOW_CONNECTIONS true", db);
    admin_exec(admin, sql);
    snprintf(sql, sizeof(sql), "DROP DATABASE %s WITH (FORCE)", db);
    admin_exec(admin, sql);
    PQfinish(admin);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_database_refusing_new_connections_is_no_outage_while_the_pool_is_busy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
