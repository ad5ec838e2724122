/*
 * tests/unit/test_flight.c - single flight's contract (core/runtime/flight.h): one piece of
 * work per key, its result handed to every waiter, a waiter that leaves is never called and
 * the work goes on for the others, the bounds refuse at once (held full here) with their
 * metric, and concurrent joins of one key make exactly one leader.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime/flight.h"

typedef struct probe {
    rt_flight_waiter w;
    rt_flight *f;
    int calls;
    int seen_result;
} probe;

static void probe_done(void *arg)
{
    probe *p = arg;
    p->calls++;
    assert_true(rt_flight_ended(p->f, &p->seen_result, NULL));
}

static int join(rt_flights *t, const char *key, probe *p)
{
    memset(p, 0, sizeof(*p));
    p->w.done = probe_done;
    p->w.arg = p;
    return rt_flight_join(t, key, 0, &p->w, &p->f);
}

static int frees;
static void count_free(void *v)
{
    frees++;
    free(v);
}

static rt_metric *metric(rt_metrics *reg, const char *name, bool counter)
{
    return counter ? rt_metric_counter(reg, name, "flights=\"t\"", "")
                   : rt_metric_gauge(reg, name, "flights=\"t\"", "");
}

static void test_flight_first_join_leads_the_others_wait_and_all_get_the_result(void **state)
{
    (void)state;
    rt_flights *t = rt_flights_new("t", 4, 16, NULL);
    probe a, b, c;
    assert_int_equal(join(t, "mxc/one", &a), RT_FLIGHT_LEAD);
    assert_int_equal(join(t, "mxc/one", &b), RT_FLIGHT_JOINED);
    assert_int_equal(join(t, "mxc/one", &c), RT_FLIGHT_JOINED);
    assert_ptr_equal(a.f, b.f);
    assert_ptr_equal(a.f, c.f);
    assert_int_equal(rt_flights_in_flight(t), 1);
    assert_int_equal(rt_flights_waiting(t), 2); /* the leader is not counted */
    assert_int_equal(a.calls + b.calls + c.calls, 0);

    frees = 0;
    int *value = malloc(sizeof(int));
    *value = 42;
    rt_flight_finish(a.f, 7, value, count_free);
    assert_int_equal(a.calls, 1);
    assert_int_equal(b.calls, 1);
    assert_int_equal(c.calls, 1);
    assert_int_equal(b.seen_result, 7);
    void *v = NULL;
    int result = 0;
    assert_true(rt_flight_ended(c.f, &result, &v));
    assert_int_equal(result, 7);
    assert_int_equal(*(int *)v, 42);
    assert_int_equal(rt_flights_in_flight(t), 0);
    assert_int_equal(rt_flights_waiting(t), 0);
    /* The value lives while any joiner holds its reference. */
    rt_flight_unref(a.f);
    rt_flight_unref(b.f);
    assert_int_equal(frees, 0);
    rt_flight_unref(c.f);
    assert_int_equal(frees, 1);
    rt_flights_free(t);
}

static void test_flight_after_the_finish_the_key_starts_new_work(void **state)
{
    (void)state;
    rt_flights *t = rt_flights_new("t", 4, 16, NULL);
    probe a, b;
    assert_int_equal(join(t, "k", &a), RT_FLIGHT_LEAD);
    rt_flight_finish(a.f, 1, NULL, NULL);
    assert_int_equal(join(t, "k", &b), RT_FLIGHT_LEAD);
    assert_ptr_not_equal(a.f, b.f);
    assert_false(rt_flight_ended(b.f, NULL, NULL));
    rt_flight_finish(b.f, 2, NULL, NULL);
    assert_int_equal(b.seen_result, 2);
    rt_flight_unref(a.f);
    rt_flight_unref(b.f);
    rt_flights_free(t);
}

static void test_flight_a_waiter_that_leaves_is_never_called_and_the_work_goes_on(void **state)
{
    (void)state;
    rt_metrics *reg = rt_metrics_new();
    rt_flights *t = rt_flights_new("t", 4, 16, reg);
    probe a, b;
    assert_int_equal(join(t, "k", &a), RT_FLIGHT_LEAD);
    assert_int_equal(join(t, "k", &b), RT_FLIGHT_JOINED);
    assert_int_equal(rt_flight_wanted(a.f), 2);
    assert_true(rt_flight_leave(&a.w)); /* the leader's own deadline passed */
    assert_false(rt_flight_leave(&a.w)); /* once */
    assert_int_equal(rt_flight_wanted(a.f), 1);
    assert_int_equal(rt_metric_value(metric(reg, "atrium_flights_left_total", true)), 1);
    rt_flight_finish(a.f, 5, NULL, NULL);
    assert_int_equal(a.calls, 0);
    assert_int_equal(b.calls, 1);
    assert_int_equal(b.seen_result, 5);
    assert_false(rt_flight_leave(&b.w)); /* ended first: the result is there */
    rt_flight_unref(a.f);
    rt_flight_unref(b.f);
    rt_flights_free(t);
    rt_metrics_free(reg);
}

static void test_flight_wanted_counts_only_waiters_within_their_deadline(void **state)
{
    (void)state;
    rt_flights *t = rt_flights_new("t", 4, 16, NULL);
    probe a, b;
    memset(&a, 0, sizeof(a));
    a.w = (rt_flight_waiter){.done = probe_done, .arg = &a, .deadline_ms = rt_now_ms() - 1};
    assert_int_equal(rt_flight_join(t, "k", 0, &a.w, &a.f), RT_FLIGHT_LEAD);
    assert_int_equal(rt_flight_wanted(a.f), 0); /* nobody waits: need not begin */
    memset(&b, 0, sizeof(b));
    b.w = (rt_flight_waiter){.done = probe_done, .arg = &b, .deadline_ms = rt_now_ms() + 60000};
    assert_int_equal(rt_flight_join(t, "k", 0, &b.w, &b.f), RT_FLIGHT_JOINED);
    assert_int_equal(rt_flight_wanted(a.f), 1);
    rt_flight_finish(a.f, 0, NULL, NULL);
    assert_int_equal(a.calls + b.calls, 2);
    rt_flight_unref(a.f);
    rt_flight_unref(b.f);
    rt_flights_free(t);
}

static void test_flight_held_full_refuses_new_keys_and_waiters_at_once(void **state)
{
    (void)state;
    rt_metrics *reg = rt_metrics_new();
    rt_flights *t = rt_flights_new("t", 2, 1, reg);
    assert_int_equal(rt_metric_value(metric(reg, "atrium_flights_limit", false)), 2);
    probe a, b, c, d, e;
    assert_int_equal(join(t, "k1", &a), RT_FLIGHT_LEAD);
    assert_int_equal(join(t, "k2", &b), RT_FLIGHT_LEAD);
    assert_int_equal(rt_metric_value(metric(reg, "atrium_flights_in_flight", false)), 2);
    /* Keys full: a third key is refused, nothing linked; its own key is not remembered. */
    assert_int_equal(join(t, "k3", &c), ATRIUM_E_LIMIT);
    assert_int_equal(rt_flights_in_flight(t), 2);
    /* A key in flight may still be joined, up to the waiters' bound. */
    assert_int_equal(join(t, "k1", &d), RT_FLIGHT_JOINED);
    assert_int_equal(join(t, "k1", &e), ATRIUM_E_LIMIT);
    assert_int_equal(rt_metric_value(metric(reg, "atrium_flights_refused_total", true)), 2);
    assert_int_equal(rt_metric_value(metric(reg, "atrium_flights_waiters", false)), 1);
    assert_int_equal(rt_metric_value(metric(reg, "atrium_flights_shared_total", true)), 1);
    /* One ends: room for a new key again. */
    rt_flight_finish(b.f, 0, NULL, NULL);
    assert_int_equal(join(t, "k3", &c), RT_FLIGHT_LEAD);
    rt_flight_finish(a.f, 0, NULL, NULL);
    rt_flight_finish(c.f, 0, NULL, NULL);
    assert_int_equal(a.calls + b.calls + c.calls + d.calls, 4);
    assert_int_equal(rt_metric_value(metric(reg, "atrium_flights_in_flight", false)), 0);
    assert_int_equal(rt_metric_value(metric(reg, "atrium_flights_waiters", false)), 0);
    rt_flight_unref(a.f);
    rt_flight_unref(b.f);
    rt_flight_unref(c.f);
    rt_flight_unref(d.f);
    rt_flights_free(t);
    rt_metrics_free(reg);
}

static void test_flight_join_only_waits_for_work_under_way_and_never_leads(void **state)
{
    (void)state;
    rt_flights *t = rt_flights_new("t", 2, 4, NULL);
    probe a, b;
    memset(&a, 0, sizeof(a));
    a.w = (rt_flight_waiter){.done = probe_done, .arg = &a};
    assert_int_equal(rt_flight_join(t, "k", RT_FLIGHT_JOIN_ONLY, &a.w, &a.f), ATRIUM_E_NOTFOUND);
    assert_int_equal(rt_flights_in_flight(t), 0);
    assert_int_equal(join(t, "k", &b), RT_FLIGHT_LEAD);
    assert_int_equal(rt_flight_join(t, "k", RT_FLIGHT_JOIN_ONLY, &a.w, &a.f), RT_FLIGHT_JOINED);
    assert_int_equal(rt_flight_join(t, "k", 0x8u, &a.w, &a.f), ATRIUM_E_INVAL);
    rt_flight_finish(b.f, 9, NULL, NULL);
    assert_int_equal(a.seen_result, 9);
    rt_flight_unref(a.f);
    rt_flight_unref(b.f);
    rt_flights_free(t);
}

static int refuse_arm(void *arg)
{
    (void)arg;
    return ATRIUM_E_STOPPED;
}

static void test_flight_an_arm_that_refuses_leaves_nothing_behind(void **state)
{
    (void)state;
    rt_flights *t = rt_flights_new("t", 2, 4, NULL);
    probe a;
    memset(&a, 0, sizeof(a));
    a.w = (rt_flight_waiter){.arm = refuse_arm, .done = probe_done, .arg = &a};
    assert_int_equal(rt_flight_join(t, "k", 0, &a.w, &a.f), ATRIUM_E_STOPPED);
    assert_int_equal(rt_flights_in_flight(t), 0);
    assert_int_equal(rt_flights_waiting(t), 0);
    assert_int_equal(join(t, "", &a), ATRIUM_E_INVAL);
    rt_flights_free(t);
}

static void test_flight_the_owner_may_let_go_before_the_work_ends(void **state)
{
    (void)state;
    rt_flights *t = rt_flights_new("t", 2, 4, NULL);
    probe a;
    assert_int_equal(join(t, "k", &a), RT_FLIGHT_LEAD);
    rt_flights_free(t); /* shutdown: a cancelled transfer finishes later */
    frees = 0;
    rt_flight_finish(a.f, 3, malloc(8), count_free);
    assert_int_equal(a.calls, 1);
    rt_flight_unref(a.f); /* the last: flight, value and table go (ASan watches) */
    assert_int_equal(frees, 1);
}

/* ---- threads ------------------------------------------------------------------------- */

#define THREADS 8
#define ROUNDS 200

typedef struct racer {
    rt_flights *t;
    atomic_int *leads, *dones;
    pthread_barrier_t *start;
} racer;

typedef struct race_waiter {
    rt_flight_waiter w;
    atomic_int *dones;
} race_waiter;

static void race_done(void *arg)
{
    race_waiter *rw = arg;
    atomic_fetch_add(rw->dones, 1);
}

static void *race_main(void *arg)
{
    racer *r = arg;
    for (int round = 0; round < ROUNDS; round++) {
        pthread_barrier_wait(r->start);
        char key[32];
        snprintf(key, sizeof(key), "round-%d", round);
        race_waiter *rw = calloc(1, sizeof(*rw));
        rw->dones = r->dones;
        rw->w = (rt_flight_waiter){.done = race_done, .arg = rw};
        rt_flight *f = NULL;
        int rc = rt_flight_join(r->t, key, 0, &rw->w, &f);
        assert_true(rc == RT_FLIGHT_LEAD || rc == RT_FLIGHT_JOINED);
        if (rc == RT_FLIGHT_LEAD) atomic_fetch_add(r->leads, 1);
        pthread_barrier_wait(r->start); /* everyone joined this round's flight */
        if (rc == RT_FLIGHT_LEAD) rt_flight_finish(f, round, NULL, NULL);
        pthread_barrier_wait(r->start);
        int result = -1;
        assert_true(rt_flight_ended(f, &result, NULL));
        assert_int_equal(result, round);
        rt_flight_unref(f);
        free(rw);
    }
    return NULL;
}

static void test_flight_concurrent_joins_of_one_key_make_exactly_one_leader(void **state)
{
    (void)state;
    rt_flights *t = rt_flights_new("t", 4, THREADS, NULL);
    atomic_int leads = 0, dones = 0;
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, THREADS);
    racer r = {.t = t, .leads = &leads, .dones = &dones, .start = &start};
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) pthread_create(&th[i], NULL, race_main, &r);
    for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
    assert_int_equal(atomic_load(&leads), ROUNDS);
    assert_int_equal(atomic_load(&dones), ROUNDS * THREADS);
    assert_int_equal(rt_flights_in_flight(t), 0);
    pthread_barrier_destroy(&start);
    rt_flights_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flight_first_join_leads_the_others_wait_and_all_get_the_result),
        cmocka_unit_test(test_flight_after_the_finish_the_key_starts_new_work),
        cmocka_unit_test(test_flight_a_waiter_that_leaves_is_never_called_and_the_work_goes_on),
        cmocka_unit_test(test_flight_wanted_counts_only_waiters_within_their_deadline),
        cmocka_unit_test(test_flight_held_full_refuses_new_keys_and_waiters_at_once),
        cmocka_unit_test(test_flight_join_only_waits_for_work_under_way_and_never_leads),
        cmocka_unit_test(test_flight_an_arm_that_refuses_leaves_nothing_behind),
        cmocka_unit_test(test_flight_the_owner_may_let_go_before_the_work_ends),
        cmocka_unit_test(test_flight_concurrent_joins_of_one_key_make_exactly_one_leader),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
