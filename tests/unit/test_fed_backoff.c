/*
 * tests/unit/test_fed_backoff.c - per-destination backoff: the interval arithmetic (first
 * delay, growth, jitter, the cap), the in-memory rules (a failed destination waits, a
 * success resets, an unknown one is never delayed and costs no write), a full write
 * queue that drops the write but keeps the state, and, against the run's PostgreSQL
 * (ATRIUM_TEST_PG_CONNINFO, set by tests/run.sh; skipped without it), the state written
 * through and read back by a new table, as after a restart.
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

#include "core/federation/transport/fed_backoff.h"
#include "core/federation/transport/fed_migrations.h"

#define MIN_MS (10 * 60 * 1000LL)
#define MAX_MS (24 * 60 * 60 * 1000LL)

static fed_backoff_settings defaults(void)
{
    fed_backoff_settings s = {0};
    fed_backoff_settings_defaults(&s);
    return s;
}

static void test_defaults_are_ten_minutes_doubling_to_a_day(void **state)
{
    (void)state;
    fed_backoff_settings s = defaults();
    assert_int_equal(s.min_interval_ms, MIN_MS);
    assert_true(s.multiplier == 2.0);
    assert_int_equal(s.max_interval_ms, MAX_MS);
    assert_true(s.jitter > 0 && s.jitter < 0.5);
}

static void test_the_interval_starts_at_the_minimum_and_grows(void **state)
{
    (void)state;
    fed_backoff_settings s = defaults();
    s.jitter = 0; /* exact arithmetic first */
    assert_int_equal(fed_backoff_next_interval_ms(&s, 0, 0.5), MIN_MS);
    assert_int_equal(fed_backoff_next_interval_ms(&s, MIN_MS, 0.5), 2 * MIN_MS);
    assert_int_equal(fed_backoff_next_interval_ms(&s, 2 * MIN_MS, 0.5), 4 * MIN_MS);
    /* The cap, and no overflow past it. */
    assert_int_equal(fed_backoff_next_interval_ms(&s, MAX_MS / 2 + 1, 0.5), MAX_MS);
    assert_int_equal(fed_backoff_next_interval_ms(&s, MAX_MS, 0.5), MAX_MS);
    assert_int_equal(fed_backoff_next_interval_ms(&s, INT64_MAX / 2, 0.5), MAX_MS);
    /* Doubling from the minimum reaches the day at the 9th failure. */
    int64_t iv = 0;
    int failures = 0;
    while (iv < MAX_MS) {
        iv = fed_backoff_next_interval_ms(&s, iv, 0);
        failures++;
    }
    assert_int_equal(failures, 9); /* 10 min * 2^7 = 21.3 h; the 9th is capped at 24 h */
}

static void test_jitter_lengthens_by_at_most_its_fraction(void **state)
{
    (void)state;
    fed_backoff_settings s = defaults();
    s.jitter = 0.1;
    assert_int_equal(fed_backoff_next_interval_ms(&s, 0, 0.0), MIN_MS);
    assert_int_equal(fed_backoff_next_interval_ms(&s, 0, 0.5), MIN_MS + MIN_MS / 20);
    int64_t top = fed_backoff_next_interval_ms(&s, 0, 0.999999);
    assert_true(top > MIN_MS + MIN_MS / 10 - 10 && top < MIN_MS + MIN_MS / 10);
    assert_int_equal(fed_backoff_next_interval_ms(&s, MIN_MS, 0.5), 2 * MIN_MS + MIN_MS / 10);
    /* Never past the cap, jitter or not. */
    assert_int_equal(fed_backoff_next_interval_ms(&s, MAX_MS - 1, 0.999), MAX_MS);
    /* A multiplier of 1 keeps the interval (plus jitter) steady. */
    s.multiplier = 1.0;
    s.jitter = 0;
    assert_int_equal(fed_backoff_next_interval_ms(&s, 3 * MIN_MS, 0.7), 3 * MIN_MS);
}

static void test_a_failed_destination_waits_and_a_success_resets_it(void **state)
{
    (void)state;
    rt_metrics *m = rt_metrics_new();
    fed_backoff_settings s = {.min_interval_ms = 60000, .jitter = 0.1};
    fed_backoff *b = fed_backoff_new(&s, NULL, m);
    assert_non_null(b);
    assert_int_equal(fed_backoff_start(b), 0);

    int64_t now = rt_wall_ms();
    assert_int_equal(fed_backoff_retry_in_ms(b, "a.example", now), 0);
    fed_backoff_failure(b, "a.example");
    int64_t t1 = rt_wall_ms();
    int64_t wait = fed_backoff_retry_in_ms(b, "a.example", t1);
    assert_true(wait > 60000 - 1000 && wait <= 66000);
    /* Other destinations are not affected. */
    assert_int_equal(fed_backoff_retry_in_ms(b, "b.example", t1), 0);
    /* Once the delay has passed it may be contacted again... */
    assert_int_equal(fed_backoff_retry_in_ms(b, "a.example", t1 + 66001), 0);
    /* ...and a second failure doubles it. */
    fed_backoff_failure(b, "a.example");
    int64_t t2 = rt_wall_ms();
    wait = fed_backoff_retry_in_ms(b, "a.example", t2);
    assert_true(wait > 120000 - 1000 && wait <= 145200); /* (60 s..66 s) * 2 * (1..1.1) */
    assert_int_equal(fed_backoff_count(b), 1);
    rt_metric *g = rt_metric_gauge(m, "atrium_federation_backoff_destinations", NULL, NULL);
    assert_int_equal(rt_metric_value(g), 1);

    fed_backoff_success(b, "a.example");
    assert_int_equal(fed_backoff_retry_in_ms(b, "a.example", t2), 0);
    assert_int_equal(fed_backoff_count(b), 0);
    assert_int_equal(rt_metric_value(g), 0);
    /* After the reset, a failure starts from the minimum again. */
    fed_backoff_failure(b, "a.example");
    wait = fed_backoff_retry_in_ms(b, "a.example", rt_wall_ms());
    assert_true(wait > 60000 - 1000 && wait <= 66000);

    fed_backoff_stop(b, 1000);
    fed_backoff_free(b);
    rt_metrics_free(m);
}

/* Destinations are names others choose (any user ID, alias or media path names one): the
 * table holds at most max_destinations, its gauge says how many, and a failing destination
 * past the bound is simply not delayed (never an error, never memory). */
static void test_the_table_stops_growing_at_its_bound(void **state)
{
    (void)state;
    rt_metrics *m = rt_metrics_new();
    fed_backoff_settings s = {.min_interval_ms = 60000, .max_destinations = 8};
    fed_backoff *b = fed_backoff_new(&s, NULL, m);
    assert_non_null(b);
    assert_int_equal(fed_backoff_start(b), 0);
    rt_metric *g = rt_metric_gauge(m, "atrium_federation_backoff_destinations", NULL, NULL);
    char name[64];
    for (int i = 0; i < 100; i++) {
        snprintf(name, sizeof(name), "d%d.example", i);
        fed_backoff_failure(b, name);
    }
    assert_int_equal(fed_backoff_count(b), 8);
    assert_int_equal(rt_metric_value(g), 8);
    int64_t now = rt_wall_ms();
    assert_true(fed_backoff_retry_in_ms(b, "d0.example", now) > 0);   /* within the bound */
    assert_int_equal(fed_backoff_retry_in_ms(b, "d99.example", now), 0); /* past it */
    /* A success frees a place for the next failing destination. */
    fed_backoff_success(b, "d0.example");
    fed_backoff_failure(b, "d99.example");
    assert_true(fed_backoff_retry_in_ms(b, "d99.example", rt_wall_ms()) > 0);
    assert_int_equal(rt_metric_value(g), 8);
    fed_backoff_stop(b, 1000);
    fed_backoff_free(b);
    rt_metrics_free(m);
}

/* The writer is not started, so queued writes stay visible in its pool's queued gauge. */
static void test_writes_are_queued_only_for_changes_and_dropped_when_full(void **state)
{
    (void)state;
    rt_metrics *m = rt_metrics_new();
    db_pool *db = db_pool_new("dbname=never_connected", 1, 2000, NULL); /* never used: no writer */
    fed_backoff_settings s = {.write_queue_depth = 2};
    fed_backoff *b = fed_backoff_new(&s, db, m);
    rt_metric *queued =
        rt_metric_gauge(m, "atrium_pool_queued", "pool=\"core.federation_backoff\"", NULL);
    rt_metric *dropped =
        rt_metric_counter(m, "atrium_federation_backoff_writes_dropped_total", NULL, NULL);

    fed_backoff_success(b, "never-failed.example"); /* nothing recorded: nothing written */
    assert_int_equal(rt_metric_value(queued), 0);
    fed_backoff_failure(b, "a.example");
    assert_int_equal(rt_metric_value(queued), 1);
    fed_backoff_success(b, "a.example");
    assert_int_equal(rt_metric_value(queued), 2);
    /* The queue is full: the write is dropped, the state in memory holds. */
    fed_backoff_failure(b, "b.example");
    assert_int_equal(rt_metric_value(queued), 2);
    assert_int_equal(rt_metric_value(dropped), 1);
    assert_true(fed_backoff_retry_in_ms(b, "b.example", rt_wall_ms()) > 0);

    fed_backoff_stop(b, 100); /* the queued writes end cancelled */
    assert_int_equal(rt_metric_value(queued), 0);
    fed_backoff_free(b);
    db_pool_free(db);
    rt_metrics_free(m);
}

/* ---- against PostgreSQL ------------------------------------------------------------------ */

static const char *pg_conninfo(void)
{
    const char *v = getenv("ATRIUM_TEST_PG_CONNINFO");
    return v && *v ? v : NULL;
}

static void admin_exec(const char *sql)
{
    char ci[1024];
    snprintf(ci, sizeof(ci), "%s dbname=postgres", pg_conninfo());
    PGconn *c = PQconnectdb(ci);
    if (PQstatus(c) != CONNECTION_OK) fail_msg("cannot reach PostgreSQL: %s", PQerrorMessage(c));
    PGresult *r = PQexec(c, sql);
    if (PQresultStatus(r) != PGRES_COMMAND_OK)
        fail_msg("%s: %s", sql, PQresultErrorMessage(r));
    PQclear(r);
    PQfinish(c);
}

static int64_t row_interval(db_pool *db, const char *dest)
{
    PGconn *c = db_acquire(db, 5000);
    assert_non_null(c);
    const char *params[1] = {dest};
    PGresult *r = PQexecParams(c,
                               "SELECT retry_interval_ms FROM federation_destinations"
                               " WHERE destination = $1",
                               1, NULL, params, NULL, NULL, 0);
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    int64_t v = PQntuples(r) ? strtoll(PQgetvalue(r, 0, 0), NULL, 10) : -1;
    PQclear(r);
    db_release(db, c);
    return v;
}

static void test_the_state_is_saved_and_survives_a_restart(void **state)
{
    (void)state;
    if (!pg_conninfo()) {
        fprintf(stderr, "ATRIUM_TEST_PG_CONNINFO is not set (run through tests/run.sh): "
                        "skipping the PostgreSQL part\n");
        skip();
    }
    char name[64], sql[128], ci[1024];
    snprintf(name, sizeof(name), "atrium_test_backoff_%d_%lld", (int)getpid(),
             (long long)(rt_now_ms() % 1000000));
    snprintf(sql, sizeof(sql), "CREATE DATABASE \"%s\"", name);
    admin_exec(sql);
    snprintf(ci, sizeof(ci), "%s dbname=%s", pg_conninfo(), name);
    db_pool *db = db_pool_new(ci, 2, 2000, NULL);
    assert_int_equal(db_pool_connect(db, 5), 0);
    assert_int_equal(db_migrate(db, FED_MIGRATIONS_OWNER, FED_MIGRATIONS, FED_N_MIGRATIONS), 0);

    fed_backoff_settings s = {.min_interval_ms = 60000};
    fed_backoff *b = fed_backoff_new(&s, db, NULL);
    assert_int_equal(fed_backoff_load(b), 0);
    assert_int_equal(fed_backoff_count(b), 0);
    assert_int_equal(fed_backoff_start(b), 0);
    fed_backoff_failure(b, "down.example");
    fed_backoff_failure(b, "down.example");
    fed_backoff_failure(b, "flaky.example");
    fed_backoff_success(b, "flaky.example");
    fed_backoff_success(b, "fine.example");
    int64_t before = fed_backoff_retry_in_ms(b, "down.example", rt_wall_ms());
    fed_backoff_stop(b, 5000); /* the writes are flushed first */
    fed_backoff_free(b);
    int64_t saved = row_interval(db, "down.example");
    assert_true(saved >= 120000 && saved < 145200); /* two failures, jitter up to 10% each */
    assert_int_equal(row_interval(db, "flaky.example"), -1); /* written, then deleted */
    assert_int_equal(row_interval(db, "fine.example"), -1);

    /* A new table (the next start) reads the state back. */
    b = fed_backoff_new(&s, db, NULL);
    assert_int_equal(fed_backoff_load(b), 0);
    assert_int_equal(fed_backoff_count(b), 1);
    int64_t after = fed_backoff_retry_in_ms(b, "down.example", rt_wall_ms());
    assert_true(after > 0 && after <= before);
    assert_true(after > saved - 5000);
    assert_int_equal(fed_backoff_retry_in_ms(b, "flaky.example", rt_wall_ms()), 0);
    assert_int_equal(fed_backoff_start(b), 0);
    fed_backoff_failure(b, "down.example"); /* grows from the loaded interval */
    fed_backoff_stop(b, 5000);
    fed_backoff_free(b);
    int64_t grown = row_interval(db, "down.example");
    assert_true(grown >= 2 * saved && grown < 2 * saved + 2 * saved / 10 + 1);

    b = fed_backoff_new(&s, db, NULL);
    assert_int_equal(fed_backoff_load(b), 0);
    assert_int_equal(fed_backoff_start(b), 0);
    fed_backoff_success(b, "down.example");
    fed_backoff_stop(b, 5000);
    fed_backoff_free(b);
    assert_int_equal(row_interval(db, "down.example"), -1);

    db_pool_free(db);
    snprintf(sql, sizeof(sql), "DROP DATABASE \"%s\" WITH (FORCE)", name);
    admin_exec(sql);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_are_ten_minutes_doubling_to_a_day),
        cmocka_unit_test(test_the_interval_starts_at_the_minimum_and_grows),
        cmocka_unit_test(test_jitter_lengthens_by_at_most_its_fraction),
        cmocka_unit_test(test_a_failed_destination_waits_and_a_success_resets_it),
        cmocka_unit_test(test_the_table_stops_growing_at_its_bound),
        cmocka_unit_test(test_writes_are_queued_only_for_changes_and_dropped_when_full),
        cmocka_unit_test(test_the_state_is_saved_and_survives_a_restart),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
