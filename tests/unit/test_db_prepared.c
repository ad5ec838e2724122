/*
 * tests/unit/test_db_prepared.c - db_query's prepared statements (core/store/db_prepared.c)
 * against the run's PostgreSQL (ATRIUM_TEST_PG_CONNINFO, set by tests/run.sh; skipped
 * without it), read back through the connection's own pg_prepared_statements: a statement
 * is prepared once and reused; a failing statement returns exactly PQexecParams's error,
 * also in an aborted transaction; one prepared in a transaction that rolls back stays
 * usable; parameter types are inferred as PQexecParams infers them; the bound holds with
 * the cache full (later statements run unprepared and are counted); a reset connection
 * starts an empty cache; the pool's connections report to its metrics and
 * database.prepared_statements false prepares nothing. Pipelines (db_pipeline_*): results
 * in order, statements prepared at the end (at most DB_PIPELINE_LATER new ones), a failure
 * undoing the pipeline's setting; and the pool's spare connection (db_acquire_spare)
 * never taking the last idle one.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* The current plan_cache_mode of c, asked unprepared. */
static void plan_mode(PGconn *c, char *out, size_t len)
{
    PGresult *r = PQexec(c, "SHOW plan_cache_mode");
    if (PQresultStatus(r) != PGRES_TUPLES_OK) fail_msg("%s", PQresultErrorMessage(r));
    snprintf(out, len, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
}

/* The next result of c's pipeline, which must have status want (cleared unless kept). */
static PGresult *take(PGconn *c, ExecStatusType want, bool keep)
{
    PGresult *r = db_query_result(c);
    if (PQresultStatus(r) != want)
        fail_msg("%s instead of %s: %s", PQresStatus(PQresultStatus(r)), PQresStatus(want),
                 PQresultErrorMessage(r));
    if (keep) return r;
    PQclear(r);
    return NULL;
}

/* A new connection's plan_cache_mode into before, and a pipeline begun on it whose first
 * statement sets generic plans. */
static PGconn *pipeline_setting_generic_plans(char *before, size_t len)
{
    PGconn *c = connect_pg();
    plan_mode(c, before, len);
    assert_true(db_pipeline_begin(c));
    assert_true(db_query_send(c, "SELECT set_config('plan_cache_mode', 'force_generic_plan', false)", 0, NULL));
    return c;
}

/* After db_pipeline_end: one statement at a time again, with the mode of before. */
static void assert_pipeline_left(PGconn *c, const char *before)
{
    char after[64];
    assert_int_equal(PQpipelineStatus(c), PQ_PIPELINE_OFF);
    assert_int_equal(PQtransactionStatus(c), PQTRANS_IDLE);
    plan_mode(c, after, sizeof(after));
    assert_string_equal(after, before);
}

/* A pipeline's statements answer in order, each its own result; statements it sent for
 * the first time run unprepared and are prepared once it ends; a setting made and reset
 * within it is as before, and the connection takes one statement at a time again. */
static void test_a_pipeline_answers_in_order_and_prepares_at_its_end(void **state)
{
    (void)state;
    NEED_PG();
    char before[64];
    PGconn *c = pipeline_setting_generic_plans(before, sizeof(before));
    assert_true(db_query_send(c, "SELECT $1::int * 2", 1, (const char *const[]){"21"}));
    assert_true(db_query_send(c, "SELECT current_setting('plan_cache_mode')", 0, NULL));
    assert_true(db_query_send(c, "RESET plan_cache_mode", 0, NULL));
    assert_true(db_pipeline_sync(c));
    assert_int_equal(db_prepared_count(c), 0); /* nothing prepared within the pipeline */
    take(c, PGRES_TUPLES_OK, false);
    PGresult *r = take(c, PGRES_TUPLES_OK, true);
    assert_string_equal(PQgetvalue(r, 0, 0), "42");
    PQclear(r);
    r = take(c, PGRES_TUPLES_OK, true);
    assert_string_equal(PQgetvalue(r, 0, 0), "force_generic_plan");
    PQclear(r);
    take(c, PGRES_COMMAND_OK, false);
    db_pipeline_end(c);
    assert_pipeline_left(c, before);
    assert_int_equal(server_prepared(c), 4);
    /* Prepared now: the same statement runs prepared, one statement at a time. */
    assert_int_equal(query_int(c, "SELECT $1::int * 2", "5"), 10);
    assert_int_equal(server_prepared(c), 4);
    PQfinish(c);
}

/* A failing statement fails the later ones of its pipeline and undoes the earlier ones'
 * setting; what was not taken is dropped at the end, and the connection works on. */
static void test_a_failure_in_a_pipeline_undoes_it_and_the_connection_works_on(void **state)
{
    (void)state;
    NEED_PG();
    char before[64];
    PGconn *c = pipeline_setting_generic_plans(before, sizeof(before));
    assert_true(db_query_send(c, "SELECT 1 / $1::int", 1, (const char *const[]){"0"}));
    assert_true(db_query_send(c, "SELECT 7", 0, NULL));
    assert_true(db_query_send(c, "SELECT 8", 0, NULL));
    assert_true(db_pipeline_sync(c));
    take(c, PGRES_TUPLES_OK, false);
    PGresult *r = take(c, PGRES_FATAL_ERROR, true);
    assert_string_equal(PQresultErrorField(r, PG_DIAG_SQLSTATE), "22012"); /* division_by_zero */
    PQclear(r);
    take(c, PGRES_PIPELINE_ABORTED, false);
    db_pipeline_end(c); /* "SELECT 8" never taken */
    assert_pipeline_left(c, before);
    assert_int_equal(query_int(c, "SELECT $1::int + 1", "8"), 9);
    PQfinish(c);
}

/* Past DB_PIPELINE_LATER new statements in one pipeline, the rest run unprepared and are
 * prepared by a later pipeline that sends them again; every result is still right. */
static void test_a_pipeline_prepares_at_most_its_bound_of_new_statements(void **state)
{
    (void)state;
    NEED_PG();
    PGconn *c = connect_pg();
    enum { N = DB_PIPELINE_LATER + 3 };
    char sql[N][64];
    for (int i = 0; i < N; i++) snprintf(sql[i], sizeof(sql[i]), "SELECT %d + $1::int", i);
    for (int round = 0; round < 2; round++) {
        assert_true(db_pipeline_begin(c));
        for (int i = 0; i < N; i++) assert_true(db_query_send(c, sql[i], 1, (const char *const[]){"100"}));
        assert_true(db_pipeline_sync(c));
        for (int i = 0; i < N; i++) {
            PGresult *r = take(c, PGRES_TUPLES_OK, true);
            assert_int_equal(atoi(PQgetvalue(r, 0, 0)), 100 + i);
            PQclear(r);
        }
        db_pipeline_end(c);
        assert_int_equal(server_prepared(c), round == 0 ? DB_PIPELINE_LATER : N);
    }
    PQfinish(c);
}

/* A spare connection is lent only while another stays idle or the pool may open one
 * more (which it is then asked to); with the pool at its bound and one idle, none is
 * spared and an ordinary checkout still gets that one. */
static void test_a_spare_connection_never_takes_the_last_one(void **state)
{
    (void)state;
    NEED_PG();
    rt_metrics *m = rt_metrics_new();
    snprintf(conninfo, sizeof(conninfo), "%s dbname=postgres", pg_conninfo());
    db_pool *p = db_pool_new(conninfo, 3, 2000, m);
    assert_non_null(p);
    assert_int_equal(db_pool_connect(p, 5), 0);
    PGconn *held = db_acquire(p, 2000); /* the one opened at start */
    assert_non_null(held);
    /* None idle: no spare, but the pool is asked for one more. */
    assert_null(db_acquire_spare(p));
    PGconn *spare = NULL;
    for (int waited = 0; !spare && waited < 5000; waited += 10) {
        spare = db_acquire_spare(p); /* one idle and a slot left to open: lent */
        if (!spare) usleep(10000);
    }
    assert_non_null(spare);
    db_release(p, spare);
    /* Wait for the third (asked for when the spare left none idle). */
    rt_metric *open = rt_metric_gauge(m, "atrium_db_connections", NULL, "t");
    for (int waited = 0; rt_metric_value(open) < 3 && waited < 5000; waited += 10) usleep(10000);
    assert_int_equal(rt_metric_value(open), 3);
    spare = db_acquire_spare(p); /* two idle: one lent */
    assert_non_null(spare);
    assert_null(db_acquire_spare(p)); /* one idle, no slot left: kept for others */
    PGconn *last = db_acquire(p, 0);
    assert_non_null(last);
    db_release(p, last);
    db_release(p, spare);
    db_release(p, held);
    db_pool_free(p);
    rt_metrics_free(m);
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
        cmocka_unit_test(test_a_pipeline_answers_in_order_and_prepares_at_its_end),
        cmocka_unit_test(test_a_failure_in_a_pipeline_undoes_it_and_the_connection_works_on),
        cmocka_unit_test(test_a_pipeline_prepares_at_most_its_bound_of_new_statements),
        cmocka_unit_test(test_a_spare_connection_never_takes_the_last_one),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
