/*
 * tests/unit/test_db_prepared.c - db_query's prepared statements (core/store/db_prepared.c)
 * against the run's PostgreSQL (ATRIUM_TEST_PG_CONNINFO, set by tests/run.sh; skipped
 * without it), read back through the connection's own pg_prepared_statements: a statement
 * is prepared once and reused; a failing statement returns exactly PQexecParams's error,
 * also in an aborted transaction; one prepared in a transaction that rolls back stays
 * usable; parameter types are inferred as PQexecParams infers them; the bound holds with
 * the cache full (later statements run unprepared and are counted); a reset connection
 * starts an empty cache; the pool's connections report to its metrics and
 * database.prepared_statements false prepares nothing.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/store/db.h"

static const char *pg_conninfo(void)
{
    const char *v = getenv("ATRIUM_TEST_PG_CONNINFO");
    return v && *v ? v : NULL;
}

#define NEED_PG()                                                                          \
    do {                                                                                   \
        if (!pg_conninfo()) {                                                              \
            fprintf(stderr, "ATRIUM_TEST_PG_CONNINFO is not set (run through "             \
                            "tests/run.sh): skipping\n");                                  \
            skip();                                                                        \
        }                                                                                  \
    } while (0)

static char conninfo[1024];

static PGconn *connect_pg(void)
{
    snprintf(conninfo, sizeof(conninfo), "%s dbname=postgres", pg_conninfo());
    PGconn *c = PQconnectdb(conninfo);
    if (PQstatus(c) != CONNECTION_OK) fail_msg("cannot reach PostgreSQL: %s", PQerrorMessage(c));
    return c;
}

/* Statements the server holds prepared on c's session, asked unprepared. */
static int server_prepared(PGconn *c)
{
    PGresult *r = PQexec(c, "SELECT count(*) FROM pg_prepared_statements");
    if (PQresultStatus(r) != PGRES_TUPLES_OK) fail_msg("%s", PQresultErrorMessage(r));
    int n = atoi(PQgetvalue(r, 0, 0));
    PQclear(r);
    return n;
}

static void exec_ok(PGconn *c, const char *sql)
{
    PGresult *r = PQexec(c, sql);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) fail_msg("%s: %s", sql, PQresultErrorMessage(r));
    PQclear(r);
}

/* db_query's first value of sql with one parameter, as an int; fails the test on error. */
static int query_int(PGconn *c, const char *sql, const char *param)
{
    const char *p[1] = {param};
    PGresult *r = db_query(c, sql, param ? 1 : 0, p);
    if (PQresultStatus(r) != PGRES_TUPLES_OK) fail_msg("%s: %s", sql, PQresultErrorMessage(r));
    int v = atoi(PQgetvalue(r, 0, 0));
    PQclear(r);
    return v;
}

static void test_a_statement_is_prepared_once_and_reused(void **state)
{
    (void)state;
    NEED_PG();
    PGconn *c = connect_pg();
    for (int i = 1; i <= 5; i++) {
        char v[8];
        snprintf(v, sizeof(v), "%d", i);
        assert_int_equal(query_int(c, "SELECT $1::int * 2", v), 2 * i);
    }
    assert_int_equal(db_prepared_count(c), 1);
    assert_int_equal(server_prepared(c), 1);
    /* The same text built elsewhere at run time is the same statement. */
    char built[32];
    snprintf(built, sizeof(built), "SELECT $1::int * %d", 2);
    assert_int_equal(query_int(c, built, "7"), 14);
    assert_int_equal(server_prepared(c), 1);
    assert_int_equal(query_int(c, "SELECT $1::int * 3", "7"), 21);
    assert_int_equal(server_prepared(c), 2);
    PQfinish(c);
}

/* db_query's and PQexecParams's results for the same statement carry the same error. */
static void assert_same_error(PGconn *c, const char *sql, int n, const char *const *p)
{
    PGresult *plain = PQexecParams(c, sql, n, NULL, p, NULL, NULL, 0);
    PGresult *ours = db_query(c, sql, n, p);
    assert_int_equal(PQresultStatus(ours), PGRES_FATAL_ERROR);
    assert_int_equal(PQresultStatus(ours), PQresultStatus(plain));
    assert_string_equal(PQresultErrorMessage(ours), PQresultErrorMessage(plain));
    assert_string_equal(PQresultErrorField(ours, PG_DIAG_SQLSTATE),
                        PQresultErrorField(plain, PG_DIAG_SQLSTATE));
    PQclear(plain);
    PQclear(ours);
}

static void test_a_failing_statement_returns_exactly_its_error(void **state)
{
    (void)state;
    NEED_PG();
    PGconn *c = connect_pg();
    const char *p[1] = {"0"};
    assert_same_error(c, "SELEC $1", 1, p); /* refused at prepare */
    assert_same_error(c, "SELECT * FROM no_such_table", 0, NULL);
    assert_int_equal(db_prepared_count(c), 0);
    assert_same_error(c, "SELECT 1 / $1::int", 1, p); /* fails when run, prepared */
    assert_int_equal(db_prepared_count(c), 1);
    /* In an aborted transaction nothing can be prepared: the error is the transaction's. */
    exec_ok(c, "BEGIN");
    PQclear(PQexec(c, "SELECT 1 / 0"));
    assert_same_error(c, "SELECT $1::int + 100", 1, p);
    assert_same_error(c, "SELECT 1 / $1::int", 1, p); /* prepared before */
    exec_ok(c, "ROLLBACK");
    assert_int_equal(query_int(c, "SELECT $1::int + 100", "1"), 101);
    assert_int_equal(db_prepared_count(c), 2);
    assert_int_equal(server_prepared(c), 2);
    PQfinish(c);
}

static void test_a_statement_prepared_in_a_rolled_back_transaction_stays_usable(void **state)
{
    (void)state;
    NEED_PG();
    PGconn *c = connect_pg();
    exec_ok(c, "BEGIN");
    assert_int_equal(query_int(c, "SELECT $1::int - 1", "5"), 4);
    exec_ok(c, "ROLLBACK");
    assert_int_equal(server_prepared(c), 1);
    assert_int_equal(query_int(c, "SELECT $1::int - 1", "9"), 8);
    assert_int_equal(db_prepared_count(c), 1);
    PQfinish(c);
}

static void test_parameter_types_are_inferred_as_unprepared(void **state)
{
    (void)state;
    NEED_PG();
    PGconn *c = connect_pg();
    const char *sqls[] = {"SELECT $1 || 'x'", "SELECT length($1)", "SELECT $1 = 'a'",
                          "SELECT coalesce($1, 'none')"};
    for (size_t i = 0; i < sizeof(sqls) / sizeof(sqls[0]); i++) {
        for (int run = 0; run < 2; run++) {
            const char *p[1] = {run ? NULL : "abc"};
            PGresult *plain = PQexecParams(c, sqls[i], 1, NULL, p, NULL, NULL, 0);
            PGresult *ours = db_query(c, sqls[i], 1, p);
            assert_int_equal(PQresultStatus(ours), PQresultStatus(plain));
            if (PQresultStatus(plain) == PGRES_TUPLES_OK) {
                assert_int_equal(PQftype(ours, 0), PQftype(plain, 0));
                assert_int_equal(PQgetisnull(ours, 0, 0), PQgetisnull(plain, 0, 0));
                assert_string_equal(PQgetvalue(ours, 0, 0), PQgetvalue(plain, 0, 0));
            } else {
                assert_string_equal(PQresultErrorMessage(ours), PQresultErrorMessage(plain));
            }
            PQclear(plain);
            PQclear(ours);
        }
    }
    PQfinish(c);
}

static void test_a_full_cache_holds_its_bound_and_runs_the_rest_unprepared(void **state)
{
    (void)state;
    NEED_PG();
    rt_metrics *m = rt_metrics_new();
    db_prepared_stats stats = {
        .statements = rt_metric_gauge(m, "atrium_db_prepared_statements", NULL, "t"),
        .unprepared = rt_metric_counter(m, "atrium_db_unprepared_total", NULL, "t"),
    };
    PGconn *c = connect_pg();
    assert_true(db_prepared_attach(c, &stats));
    char sql[64];
    for (int i = 0; i < DB_PREPARED_MAX + 20; i++) {
        snprintf(sql, sizeof(sql), "SELECT $1::int + %d", i);
        assert_int_equal(query_int(c, sql, "1"), i + 1);
    }
    assert_int_equal(db_prepared_count(c), DB_PREPARED_MAX);
    assert_int_equal(server_prepared(c), DB_PREPARED_MAX);
    assert_int_equal(rt_metric_value(stats.statements), DB_PREPARED_MAX);
    assert_int_equal(rt_metric_value(stats.unprepared), 20);
    /* What is cached is still used: the first statement runs prepared. */
    assert_int_equal(query_int(c, "SELECT $1::int + 0", "5"), 5);
    assert_int_equal(rt_metric_value(stats.unprepared), 20);
    /* libpq's reset opens a new session: the cache starts empty and fills again. */
    PQreset(c);
    assert_int_equal(PQstatus(c), CONNECTION_OK);
    assert_int_equal(db_prepared_count(c), 0);
    assert_int_equal(rt_metric_value(stats.statements), 0);
    assert_int_equal(query_int(c, "SELECT $1::int + 0", "6"), 6);
    assert_int_equal(server_prepared(c), 1);
    assert_int_equal(rt_metric_value(stats.statements), 1);
    PQfinish(c);
    assert_int_equal(rt_metric_value(stats.statements), 0);
    rt_metrics_free(m);
}

/* A pool's connection prepares (counted in its metrics), unless turned off. */
static void check_pool(bool prepare)
{
    rt_metrics *m = rt_metrics_new();
    snprintf(conninfo, sizeof(conninfo), "%s dbname=postgres", pg_conninfo());
    db_pool *p = db_pool_new(conninfo, 1, 2000, m);
    assert_non_null(p);
    db_pool_prepare(p, prepare);
    assert_int_equal(db_pool_connect(p, 5), 0);
    PGconn *c = db_acquire(p, 2000);
    assert_non_null(c);
    assert_true(db_exec(c, "SELECT $1::int", 1, (const char *const[]){"1"}));
    assert_true(db_exec(c, "SELECT $1::int", 1, (const char *const[]){"2"}));
    assert_int_equal(server_prepared(c), prepare ? 1 : 0);
    rt_metric *g = rt_metric_gauge(m, "atrium_db_prepared_statements", NULL, "t");
    assert_int_equal(rt_metric_value(g), prepare ? 1 : 0);
    db_release(p, c);
    db_pool_free(p);
    assert_int_equal(rt_metric_value(g), 0);
    rt_metrics_free(m);
}

static void test_the_pools_connections_prepare_unless_turned_off(void **state)
{
    (void)state;
    NEED_PG();
    check_pool(true);
    check_pool(false);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_statement_is_prepared_once_and_reused),
        cmocka_unit_test(test_a_failing_statement_returns_exactly_its_error),
        cmocka_unit_test(test_a_statement_prepared_in_a_rolled_back_transaction_stays_usable),
        cmocka_unit_test(test_parameter_types_are_inferred_as_unprepared),
        cmocka_unit_test(test_a_full_cache_holds_its_bound_and_runs_the_rest_unprepared),
        cmocka_unit_test(test_the_pools_connections_prepare_unless_turned_off),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
