/*
 * tests/unit/test_pool.c - the pool's contract: bounded queue, refusal without blocking,
 * reservations, workers started as tasks arrive up to the limit, and every task running
 * exactly once (cancelled after stop).
 *
 * Workers are held busy with a gate task the test opens, so the queue's state is known at
 * every step; completion is awaited on condition variables, never on sleeps.
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

#include "core/runtime/runtime.h"

/* A task that announces it runs, then blocks its worker until the test opens it. */
typedef struct gate {
    pthread_mutex_t m;
    pthread_cond_t cv;
    bool entered, open, cancelled;
} gate;

static void gate_init(gate *g)
{
    memset(g, 0, sizeof(*g));
    pthread_mutex_init(&g->m, NULL);
    pthread_cond_init(&g->cv, NULL);
}

static void gate_destroy(gate *g)
{
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->m);
}

static void gate_task(void *arg, bool cancelled)
{
    gate *g = arg;
    pthread_mutex_lock(&g->m);
    g->entered = true;
    g->cancelled = cancelled;
    pthread_cond_broadcast(&g->cv);
    while (!g->open && !cancelled)
        pthread_cond_wait(&g->cv, &g->m);
    pthread_mutex_unlock(&g->m);
}

static void gate_wait_entered(gate *g)
{
    pthread_mutex_lock(&g->m);
    while (!g->entered)
        pthread_cond_wait(&g->cv, &g->m);
    pthread_mutex_unlock(&g->m);
}

static void gate_open(gate *g)
{
    pthread_mutex_lock(&g->m);
    g->open = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->m);
}

/* A task that records how it ran. */
typedef struct record {
    pthread_mutex_t m;
    pthread_cond_t cv;
    rt_pool *pool;
    int runs, cancelled, on_worker, saw_scope;
} record;

static void record_init(record *r, rt_pool *p)
{
    memset(r, 0, sizeof(*r));
    pthread_mutex_init(&r->m, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->pool = p;
}

static void record_destroy(record *r)
{
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->m);
}

static void record_task(void *arg, bool cancelled)
{
    record *r = arg;
    bool on_worker = rt_pool_on_worker(r->pool);
    bool saw_scope = rt_scope_current() != NULL;
    pthread_mutex_lock(&r->m);
    r->runs++;
    r->cancelled += cancelled;
    r->on_worker += on_worker;
    r->saw_scope += saw_scope;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->m);
}

static void record_wait_runs(record *r, int n)
{
    pthread_mutex_lock(&r->m);
    while (r->runs < n)
        pthread_cond_wait(&r->cv, &r->m);
    pthread_mutex_unlock(&r->m);
}

/* n record tasks submitted at once, each run on one of p's workers. */
static void submit_records_and_wait(rt_pool *p, record *r, int n)
{
    for (int i = 0; i < n; i++)
        assert_int_equal(rt_pool_submit(p, record_task, r), 0);
    record_wait_runs(r, n);
    assert_int_equal(r->on_worker, n);
}

static void pool_finish(rt_pool *p)
{
    rt_pool_stop(p);
    rt_pool_join(p);
    rt_pool_free(p);
}

static void test_pool_runs_submitted_tasks_on_its_own_workers(void **state)
{
    (void)state;
    rt_pool *p = rt_pool_new("work", 2, 16, NULL);
    assert_non_null(p);
    assert_int_equal(rt_pool_start(p), 0);
    record r;
    record_init(&r, p);
    submit_records_and_wait(p, &r, 10);
    assert_int_equal(r.cancelled, 0);
    assert_false(rt_pool_on_worker(p));
    assert_string_equal(rt_pool_name(p), "work");
    assert_int_equal(rt_pool_threads(p), 2);
    pool_finish(p);
    record_destroy(&r);
}

static void test_pool_submit_refuses_at_once_when_the_queue_is_full(void **state)
{
    (void)state;
    rt_pool *p = rt_pool_new("small", 1, 2, NULL);
    assert_int_equal(rt_pool_start(p), 0);
    gate g;
    gate_init(&g);
    record r;
    record_init(&r, p);
    assert_int_equal(rt_pool_submit(p, gate_task, &g), 0);
    gate_wait_entered(&g); /* the only worker is busy: the queue fills */
    assert_int_equal(rt_pool_submit(p, record_task, &r), 0);
    assert_int_equal(rt_pool_submit(p, record_task, &r), 0);
    assert_int_equal(rt_pool_submit(p, record_task, &r), ATRIUM_E_LIMIT);
    assert_int_equal(rt_pool_queued(p), 2);
    assert_int_equal(rt_pool_busy(p), 1);
    gate_open(&g);
    record_wait_runs(&r, 2);
    assert_int_equal(r.cancelled, 0);
    pool_finish(p);
    assert_int_equal(r.runs, 2); /* the refused task never ran */
    record_destroy(&r);
    gate_destroy(&g);
}

static void test_pool_refuses_submit_and_reserve_after_stop(void **state)
{
    (void)state;
    rt_pool *p = rt_pool_new("stopping", 2, 4, NULL);
    assert_int_equal(rt_pool_start(p), 0);
    assert_false(rt_pool_stopped(p));
    rt_pool_stop(p);
    assert_true(rt_pool_stopped(p));
    record r;
    record_init(&r, p);
    assert_int_equal(rt_pool_submit(p, record_task, &r), ATRIUM_E_STOPPED);
    assert_int_equal(rt_pool_reserve(p), ATRIUM_E_STOPPED);
    rt_pool_join(p);
    rt_pool_free(p);
    assert_int_equal(r.runs, 0);
    record_destroy(&r);
}

static void test_pool_runs_queued_tasks_with_cancelled_after_stop(void **state)
{
    (void)state;
    rt_pool *p = rt_pool_new("drain", 1, 4, NULL);
    assert_int_equal(rt_pool_start(p), 0);
    gate g;
    gate_init(&g);
    record r;
    record_init(&r, p);
    assert_int_equal(rt_pool_submit(p, gate_task, &g), 0);
    gate_wait_entered(&g);
    for (int i = 0; i < 3; i++)
        assert_int_equal(rt_pool_submit(p, record_task, &r), 0);
    rt_pool_stop(p);
    gate_open(&g);
    rt_pool_join(p);
    assert_false(g.cancelled); /* it was running when the pool stopped: it finished */
    assert_int_equal(r.runs, 3);
    assert_int_equal(r.cancelled, 3);
    assert_int_equal(r.on_worker, 3);
    rt_pool_free(p);
    record_destroy(&r);
    gate_destroy(&g);
}

static void test_pool_reserved_slot_makes_submit_reserved_infallible(void **state)
{
    (void)state;
    rt_pool *p = rt_pool_new("handoff", 1, 1, NULL);
    assert_int_equal(rt_pool_start(p), 0);
    gate g;
    gate_init(&g);
    record r;
    record_init(&r, p);
    assert_int_equal(rt_pool_submit(p, gate_task, &g), 0);
    gate_wait_entered(&g);
    assert_int_equal(rt_pool_reserve(p), 0);
    /* The reservation holds the only queue slot against everyone else. */
    assert_int_equal(rt_pool_submit(p, record_task, &r), ATRIUM_E_LIMIT);
    assert_int_equal(rt_pool_reserve(p), ATRIUM_E_LIMIT);
    rt_pool_submit_reserved(p, record_task, &r);
    assert_int_equal(rt_pool_queued(p), 1);
    gate_open(&g);
    record_wait_runs(&r, 1);
    assert_int_equal(r.cancelled, 0);
    pool_finish(p);
    record_destroy(&r);
    gate_destroy(&g);
}

static void test_pool_reservation_taken_before_stop_still_runs_cancelled(void **state)
{
    (void)state;
    rt_pool *p = rt_pool_new("late", 2, 2, NULL);
    assert_int_equal(rt_pool_start(p), 0);
    record r;
    record_init(&r, p);
    assert_int_equal(rt_pool_reserve(p), 0);
    rt_pool_stop(p);
    rt_pool_submit_reserved(p, record_task, &r); /* after stop: still never fails */
    rt_pool_join(p);
    assert_int_equal(r.runs, 1);
    assert_int_equal(r.cancelled, 1);
    assert_int_equal(r.on_worker, 1);
    rt_pool_free(p);
    record_destroy(&r);
}

static void test_pool_unreserve_gives_the_queue_slot_back(void **state)
{
    (void)state;
    rt_pool *p = rt_pool_new("undo", 1, 1, NULL); /* not started: the queue only fills */
    record r;
    record_init(&r, p);
    assert_int_equal(rt_pool_reserve(p), 0);
    assert_int_equal(rt_pool_submit(p, record_task, &r), ATRIUM_E_LIMIT);
    rt_pool_unreserve(p);
    assert_int_equal(rt_pool_submit(p, record_task, &r), 0);
    pool_finish(p);
    assert_int_equal(r.runs, 1);
    record_destroy(&r);
}

static void test_pool_stopped_before_start_runs_leftovers_cancelled_on_the_caller(void **state)
{
    (void)state;
    rt_pool *p = rt_pool_new("never", 2, 4, NULL);
    record r;
    record_init(&r, p);
    assert_int_equal(rt_pool_submit(p, record_task, &r), 0);
    assert_int_equal(rt_pool_submit(p, record_task, &r), 0);
    assert_int_equal(rt_pool_reserve(p), 0);
    {
        RT_SCOPE(ATRIUM_SCOPE_REQUEST_ID, "caller");
        rt_pool_stop(p);
        assert_int_equal(r.runs, 2);
        assert_int_equal(r.cancelled, 2);
        rt_pool_submit_reserved(p, record_task, &r);
        assert_int_equal(r.runs, 3);
        assert_int_equal(r.cancelled, 3);
        assert_int_equal(r.saw_scope, 0); /* tasks never see the caller's scope */
        assert_string_equal(rt_scope_get(ATRIUM_SCOPE_REQUEST_ID), "caller");
    }
    assert_int_equal(rt_pool_start(p), ATRIUM_E_STATE);
    rt_pool_join(p);
    rt_pool_free(p);
    record_destroy(&r);
}

enum { SUBMITTERS = 4, TASKS_PER_SUBMITTER = 500 };

typedef struct counted {
    atomic_int runs[SUBMITTERS * TASKS_PER_SUBMITTER];
    atomic_int done, refused;
} counted;

typedef struct counted_arg {
    counted *c;
    int i;
} counted_arg;

static counted_arg counted_args[SUBMITTERS * TASKS_PER_SUBMITTER];
static rt_pool *counted_pool;

static void counted_task(void *arg, bool cancelled)
{
    (void)cancelled;
    counted_arg *a = arg;
    atomic_fetch_add(&a->c->runs[a->i], 1);
    atomic_fetch_add(&a->c->done, 1);
}

static void *submitter(void *arg)
{
    counted_arg *first = arg;
    for (int i = 0; i < TASKS_PER_SUBMITTER; i++) {
        if (rt_pool_submit(counted_pool, counted_task, first + i) != 0)
            atomic_fetch_add(&first->c->refused, 1);
    }
    return NULL;
}

static void test_pool_runs_every_task_exactly_once_under_concurrent_submitters(void **state)
{
    (void)state;
    static counted c;
    memset(&c, 0, sizeof(c));
    counted_pool = rt_pool_new("many", 2, SUBMITTERS * TASKS_PER_SUBMITTER, NULL);
    assert_int_equal(rt_pool_start(counted_pool), 0);
    pthread_t t[SUBMITTERS];
    for (int i = 0; i < SUBMITTERS * TASKS_PER_SUBMITTER; i++)
        counted_args[i] = (counted_arg){&c, i};
    for (int s = 0; s < SUBMITTERS; s++)
        pthread_create(&t[s], NULL, submitter, &counted_args[s * TASKS_PER_SUBMITTER]);
    for (int s = 0; s < SUBMITTERS; s++)
        pthread_join(t[s], NULL);
    pool_finish(counted_pool); /* stop + join: whatever was queued has run */
    assert_int_equal(atomic_load(&c.refused), 0);
    assert_int_equal(atomic_load(&c.done), SUBMITTERS * TASKS_PER_SUBMITTER);
    for (int i = 0; i < SUBMITTERS * TASKS_PER_SUBMITTER; i++)
        assert_int_equal(atomic_load(&c.runs[i]), 1);
}

static void test_pool_metrics_report_threads_queue_and_refusals(void **state)
{
    (void)state;
    rt_metrics *reg = rt_metrics_new();
    rt_pool *p = rt_pool_new("media", 3, 1, reg);
    record r;
    record_init(&r, p);
    assert_int_equal(rt_pool_submit(p, record_task, &r), 0);
    assert_int_equal(rt_pool_submit(p, record_task, &r), ATRIUM_E_LIMIT);
    char *text = rt_metrics_render(reg, NULL);
    /* Never started: no worker yet, three allowed. */
    assert_non_null(strstr(text, "\natrium_pool_threads{pool=\"media\"} 0\n"));
    assert_non_null(strstr(text, "\natrium_pool_threads_limit{pool=\"media\"} 3\n"));
    assert_non_null(strstr(text, "\natrium_pool_busy{pool=\"media\"} 0\n"));
    assert_non_null(strstr(text, "\natrium_pool_queued{pool=\"media\"} 1\n"));
    assert_non_null(strstr(text, "\natrium_pool_queue_limit{pool=\"media\"} 1\n"));
    assert_non_null(strstr(text, "\natrium_pool_refused_total{pool=\"media\"} 1\n"));
    free(text);
    pool_finish(p);
    record_destroy(&r);
    rt_metrics_free(reg);
}

/* The value of the pool's atrium_pool_threads gauge (workers started) in reg. */
static int started_threads(rt_metrics *reg, const char *pool)
{
    char *text = rt_metrics_render(reg, NULL);
    char key[96];
    snprintf(key, sizeof(key), "\natrium_pool_threads{pool=\"%s\"} ", pool);
    const char *at = strstr(text, key);
    int n = at ? atoi(at + strlen(key)) : -1;
    free(text);
    return n;
}

static void test_pool_starts_workers_as_tasks_arrive_never_past_its_limit(void **state)
{
    (void)state;
    rt_metrics *reg = rt_metrics_new();
    rt_pool *p = rt_pool_new("grow", 3, 16, reg);
    assert_int_equal(rt_pool_start(p), 0);
    assert_int_equal(started_threads(reg, "grow"), 0); /* idle: no thread held */
    gate g[4];
    for (int i = 0; i < 4; i++)
        gate_init(&g[i]);
    /* Each task that finds every worker busy starts one more... */
    for (int i = 0; i < 3; i++) {
        assert_int_equal(rt_pool_submit(p, gate_task, &g[i]), 0);
        gate_wait_entered(&g[i]);
        assert_int_equal(started_threads(reg, "grow"), i + 1);
    }
    /* ...up to the limit: the fourth waits in the queue for one of the three. */
    assert_int_equal(rt_pool_submit(p, gate_task, &g[3]), 0);
    assert_int_equal(rt_pool_queued(p), 1);
    assert_int_equal(started_threads(reg, "grow"), 3);
    gate_open(&g[0]);
    gate_wait_entered(&g[3]);
    for (int i = 1; i < 4; i++)
        gate_open(&g[i]);
    /* Kept once started, and never more than three. */
    record r;
    record_init(&r, p);
    submit_records_and_wait(p, &r, 10);
    assert_int_equal(started_threads(reg, "grow"), 3);
    pool_finish(p);
    for (int i = 0; i < 4; i++)
        gate_destroy(&g[i]);
    record_destroy(&r);
    rt_metrics_free(reg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_runs_submitted_tasks_on_its_own_workers),
        cmocka_unit_test(test_pool_submit_refuses_at_once_when_the_queue_is_full),
        cmocka_unit_test(test_pool_refuses_submit_and_reserve_after_stop),
        cmocka_unit_test(test_pool_runs_queued_tasks_with_cancelled_after_stop),
        cmocka_unit_test(test_pool_reserved_slot_makes_submit_reserved_infallible),
        cmocka_unit_test(test_pool_reservation_taken_before_stop_still_runs_cancelled),
        cmocka_unit_test(test_pool_unreserve_gives_the_queue_slot_back),
        cmocka_unit_test(test_pool_stopped_before_start_runs_leftovers_cancelled_on_the_caller),
        cmocka_unit_test(test_pool_runs_every_task_exactly_once_under_concurrent_submitters),
        cmocka_unit_test(test_pool_metrics_report_threads_queue_and_refusals),
        cmocka_unit_test(test_pool_starts_workers_as_tasks_arrive_never_past_its_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
