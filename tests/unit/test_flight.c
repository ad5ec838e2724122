/*
 * tests/unit/test_flight.c - single flight's contract (core/runtime/flight.h): one piece of
 * work per key, its result handed to every waiter, a waiter that leaves is never called and
 * the work goes on for the others, the bounds refuse at once (held full here) with their
 * metric, and concurrent joins of one key make exactly one leader. The early result
 * (rt_flight_publish) releases only the waiters that asked for it, is handed at once to
 * joins that ask while it is out, and races with joins, leaves and the finish cleanly.
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


/* ---- the early result ---------------------------------------------------------------- */

typedef struct eprobe {
    rt_flight_waiter w;
    rt_flight *f;
    int calls;
    int kind, result;
    void *value;
} eprobe;

static void eprobe_done(void *arg)
{
    eprobe *p = arg;
    p->calls++;
    p->kind = rt_flight_waiter_result(&p->w, &p->result, &p->value);
}

static int ejoin(rt_flights *t, const char *key, unsigned flags, eprobe *p)
{
    memset(p, 0, sizeof(*p));
    p->w.done = eprobe_done;
    p->w.arg = p;
    p->kind = -1;
    return rt_flight_join(t, key, flags, &p->w, &p->f);
}

static void test_flight_an_early_result_releases_only_the_waiters_that_asked_for_it(void **state)
{
    (void)state;
    rt_metrics *reg = rt_metrics_new();
    rt_flights *t = rt_flights_new("t", 4, 16, reg);
    eprobe lead, early, late, now, only, plain;
    assert_int_equal(ejoin(t, "mxc/f", RT_FLIGHT_EARLY, &lead), RT_FLIGHT_LEAD);
    assert_int_equal(ejoin(t, "mxc/f", RT_FLIGHT_EARLY, &early), RT_FLIGHT_JOINED);
    assert_int_equal(ejoin(t, "mxc/f", 0, &late), RT_FLIGHT_JOINED);
    /* Nothing out yet: a join that only takes an early result finds none. */
    assert_int_equal(ejoin(t, "mxc/f", RT_FLIGHT_EARLY_ONLY, &only), ATRIUM_E_NOTFOUND);
    assert_int_equal(ejoin(t, "mxc/none", RT_FLIGHT_EARLY_ONLY, &only), ATRIUM_E_NOTFOUND);
    assert_int_equal(rt_flights_in_flight(t), 1);
    assert_int_equal(rt_flights_waiting(t), 2);

    frees = 0;
    int *landing = malloc(sizeof(int));
    *landing = 11;
    assert_true(rt_flight_publish(lead.f, 5, landing, count_free));
    /* The two that asked are done with the early result; the other still waits. */
    assert_int_equal(lead.calls, 1);
    assert_int_equal(early.calls, 1);
    assert_int_equal(late.calls, 0);
    assert_int_equal(early.kind, RT_FLIGHT_RESULT_EARLY);
    assert_int_equal(early.result, 5);
    assert_ptr_equal(early.value, landing);
    assert_int_equal(lead.kind, RT_FLIGHT_RESULT_EARLY);
    assert_int_equal(rt_flights_waiting(t), 1);
    assert_int_equal(rt_flight_wanted(lead.f), 1);
    assert_false(rt_flight_leave(&early.w)); /* released: nothing to leave */
    /* While it is out, a join that asks gets it at once, nothing linked. */
    assert_int_equal(ejoin(t, "mxc/f", RT_FLIGHT_EARLY, &now), RT_FLIGHT_PUBLISHED);
    assert_int_equal(now.calls, 0);
    assert_int_equal(rt_flight_waiter_result(&now.w, &now.result, &now.value),
                     RT_FLIGHT_RESULT_EARLY);
    assert_int_equal(now.result, 5);
    assert_int_equal(ejoin(t, "mxc/f", RT_FLIGHT_EARLY_ONLY, &only), RT_FLIGHT_PUBLISHED);
    assert_int_equal(ejoin(t, "mxc/f", 0, &plain), RT_FLIGHT_JOINED);
    assert_int_equal(rt_flights_waiting(t), 2);
    assert_int_equal(rt_metric_value(metric(reg, "atrium_flights_early_total", true)), 4);
    /* Once per flight. */
    assert_false(rt_flight_publish(lead.f, 6, NULL, NULL));

    rt_flight_finish(lead.f, 0, NULL, NULL);
    assert_int_equal(late.calls, 1);
    assert_int_equal(late.kind, RT_FLIGHT_RESULT_END);
    assert_int_equal(late.result, 0);
    assert_int_equal(plain.kind, RT_FLIGHT_RESULT_END);
    assert_int_equal(lead.calls + early.calls, 2); /* never called twice */
    /* The early value stays readable as long as a reference is held. */
    eprobe *refs[] = {&lead, &early, &late, &now, &only};
    for (size_t i = 0; i < sizeof(refs) / sizeof(refs[0]); i++) rt_flight_unref(refs[i]->f);
    assert_int_equal(frees, 0);
    assert_int_equal(*(int *)now.value, 11);
    rt_flight_unref(plain.f);
    assert_int_equal(frees, 1);
    rt_flights_free(t);
    rt_metrics_free(reg);
}

static void test_flight_an_unpublished_early_result_makes_joins_wait_for_the_end(void **state)
{
    (void)state;
    rt_flights *t = rt_flights_new("t", 4, 16, NULL);
    eprobe lead, first, after, only;
    assert_int_equal(ejoin(t, "k", 0, &lead), RT_FLIGHT_LEAD);
    assert_true(rt_flight_publish(lead.f, 1, NULL, NULL));
    assert_int_equal(lead.calls, 0); /* it did not ask */
    assert_int_equal(ejoin(t, "k", RT_FLIGHT_EARLY, &first), RT_FLIGHT_PUBLISHED);
    rt_flight_unpublish(lead.f); /* the work starts over: what was out is stale */
    assert_int_equal(ejoin(t, "k", RT_FLIGHT_EARLY, &after), RT_FLIGHT_JOINED);
    assert_int_equal(ejoin(t, "k", RT_FLIGHT_EARLY_ONLY, &only), ATRIUM_E_NOTFOUND);
    /* Those released keep what they read. */
    assert_int_equal(rt_flight_waiter_result(&first.w, &first.result, NULL),
                     RT_FLIGHT_RESULT_EARLY);
    assert_int_equal(first.result, 1);
    rt_flight_finish(lead.f, 2, NULL, NULL);
    assert_int_equal(after.calls, 1);
    assert_int_equal(after.kind, RT_FLIGHT_RESULT_END);
    assert_int_equal(after.result, 2);
    assert_int_equal(lead.kind, RT_FLIGHT_RESULT_END);
    /* After the finish the key is free: an early-only join finds nothing. */
    assert_int_equal(ejoin(t, "k", RT_FLIGHT_EARLY_ONLY, &only), ATRIUM_E_NOTFOUND);
    rt_flight_unref(lead.f);
    rt_flight_unref(first.f);
    rt_flight_unref(after.f);
    rt_flights_free(t);
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

/* Joins (asking for the early result or not), leaves, the publish and the finish of one
 * key, all at once: every waiter is done exactly once or has left, those released early
 * asked for it, and the early value is freed once, after everyone let go. */
typedef struct early_racer {
    rt_flights *t;
    int id;
    atomic_int *early, *ends, *left, *leads, *frees_seen;
    pthread_barrier_t *start;
} early_racer;

typedef struct early_waiter {
    rt_flight_waiter w;
    atomic_int calls;
} early_waiter;

static void early_race_done(void *arg)
{
    early_waiter *ew = arg;
    atomic_fetch_add(&ew->calls, 1);
}

static void race_free(void *v)
{
    atomic_fetch_add((atomic_int *)v, 1);
}

static void *early_race_main(void *arg)
{
    early_racer *r = arg;
    for (int round = 0; round < ROUNDS; round++) {
        char key[32];
        snprintf(key, sizeof(key), "early-%d", round);
        early_waiter *ew = calloc(1, sizeof(*ew));
        ew->w = (rt_flight_waiter){.done = early_race_done, .arg = ew};
        unsigned flags = (r->id % 2) ? RT_FLIGHT_EARLY : 0;
        pthread_barrier_wait(r->start);
        rt_flight *f = NULL;
        int rc = rt_flight_join(r->t, key, flags, &ew->w, &f);
        assert_true(rc == RT_FLIGHT_LEAD || rc == RT_FLIGHT_JOINED || rc == RT_FLIGHT_PUBLISHED);
        if (rc == RT_FLIGHT_LEAD) {
            atomic_fetch_add(r->leads, 1); /* a late joiner may lead the key's next flight */
            /* The value is a counter of its frees: the flight owns it from here. */
            rt_flight_publish(f, round, r->frees_seen, race_free);
            rt_flight_finish(f, -round, NULL, NULL);
        } else if (r->id % 3 == 0 && rc == RT_FLIGHT_JOINED && rt_flight_leave(&ew->w)) {
            atomic_fetch_add(r->left, 1);
        }
        pthread_barrier_wait(r->start); /* the round's flight has ended */
        bool handed = rc == RT_FLIGHT_PUBLISHED || atomic_load(&ew->calls) == 1;
        if (handed) {
            int result = 0;
            int kind = rt_flight_waiter_result(&ew->w, &result, NULL);
            if (kind == RT_FLIGHT_RESULT_EARLY) {
                assert_true(flags & RT_FLIGHT_EARLY);
                assert_int_equal(result, round);
                atomic_fetch_add(r->early, 1);
            } else {
                assert_int_equal(result, -round);
                atomic_fetch_add(r->ends, 1);
            }
        }
        assert_true(atomic_load(&ew->calls) <= 1);
        if (rc == RT_FLIGHT_PUBLISHED) assert_int_equal(atomic_load(&ew->calls), 0);
        rt_flight_unref(f);
        free(ew);
    }
    return NULL;
}

static void test_flight_early_results_race_joins_leaves_and_the_finish(void **state)
{
    (void)state;
    rt_flights *t = rt_flights_new("t", 4, THREADS, NULL);
    atomic_int early = 0, ends = 0, left = 0, leads = 0, frees_seen = 0;
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, THREADS);
    early_racer r[THREADS];
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) {
        r[i] = (early_racer){.t = t, .id = i, .early = &early, .ends = &ends, .left = &left,
                             .leads = &leads, .frees_seen = &frees_seen, .start = &start};
        pthread_create(&th[i], NULL, early_race_main, &r[i]);
    }
    for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
    /* Each waiter was handed one result or left; only askers saw the early one. */
    assert_int_equal(atomic_load(&early) + atomic_load(&ends) + atomic_load(&left),
                     ROUNDS * THREADS);
    assert_true(atomic_load(&early) > 0);
    assert_true(atomic_load(&early) <= ROUNDS * (THREADS / 2));
    /* Every published value freed once, when its flight's last reference went. */
    assert_true(atomic_load(&leads) >= ROUNDS);
    assert_int_equal(atomic_load(&frees_seen), atomic_load(&leads));
    assert_int_equal(rt_flights_in_flight(t), 0);
    assert_int_equal(rt_flights_waiting(t), 0);
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
        cmocka_unit_test(test_flight_an_early_result_releases_only_the_waiters_that_asked_for_it),
        cmocka_unit_test(test_flight_an_unpublished_early_result_makes_joins_wait_for_the_end),
        cmocka_unit_test(test_flight_early_results_race_joins_leaves_and_the_finish),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
