/*
 * tests/unit/test_line.c - the admission line's contract: slots, a waiting line that is fair
 * across client keys, caps that refuse at once, and cancel.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "core/runtime/runtime.h"

static rt_line_waiter waiter(const char *key, int id)
{
    return (rt_line_waiter){.key = key, .ctx = (void *)(intptr_t)id};
}

static int id_of(const rt_line_waiter *w)
{
    return w ? (int)(intptr_t)w->ctx : -1;
}

/* Release the slot held by whoever was granted last; return the id of the next grantee. */
static int release_id(rt_line *l)
{
    return id_of(rt_line_release(l));
}

static void test_line_admits_at_once_while_slots_are_free(void **state)
{
    (void)state;
    rt_line *l = rt_line_new("delivery", 2, 10, 0, NULL);
    assert_non_null(l);
    rt_line_waiter a = waiter("1.2.3.4", 1), b = waiter("1.2.3.4", 2), c = waiter("5.6.7.8", 3);
    assert_int_equal(rt_line_enter(l, &a), RT_LINE_ADMITTED);
    assert_int_equal(rt_line_enter(l, &b), RT_LINE_ADMITTED);
    assert_int_equal(rt_line_enter(l, &c), RT_LINE_QUEUED);
    assert_int_equal(rt_line_in_use(l), 2);
    assert_int_equal(rt_line_waiting(l), 1);
    assert_int_equal(rt_line_slots(l), 2);
    assert_int_equal(release_id(l), 3);
    assert_null(rt_line_release(l));
    assert_null(rt_line_release(l));
    assert_int_equal(rt_line_in_use(l), 0);
    rt_line_free(l);
}

static void test_line_bounds_what_one_key_holds_and_serves_other_keys_from_free_slots(void **state)
{
    (void)state;
    rt_line *l = rt_line_new("delivery", 4, 10, 0, NULL);
    rt_line_limit_holding(l, 2);
    rt_line_waiter a1 = waiter("a", 1), a2 = waiter("a", 2), a3 = waiter("a", 3),
                   a4 = waiter("a", 4), b1 = waiter("b", 5);
    assert_int_equal(rt_line_enter(l, &a1), RT_LINE_ADMITTED);
    assert_int_equal(rt_line_enter(l, &a2), RT_LINE_ADMITTED);
    /* a holds its two: its next ones wait although two slots are free... */
    assert_int_equal(rt_line_enter(l, &a3), RT_LINE_QUEUED);
    assert_int_equal(rt_line_enter(l, &a4), RT_LINE_QUEUED);
    assert_int_equal(rt_line_in_use(l), 2);
    /* ...and another key takes a free slot at once. */
    assert_int_equal(rt_line_enter(l, &b1), RT_LINE_ADMITTED);
    /* b's release frees its slot (a is at its bound: nobody to pass it to). */
    assert_null(rt_line_release_for(l, "b"));
    assert_int_equal(rt_line_in_use(l), 2);
    /* a's release passes the slot to a's next waiter, in order. */
    assert_int_equal(id_of(rt_line_release_for(l, "a")), 3);
    assert_int_equal(id_of(rt_line_release_for(l, "a")), 4);
    assert_int_equal(rt_line_waiting(l), 0);
    assert_null(rt_line_release_for(l, "a"));
    assert_null(rt_line_release_for(l, "a"));
    assert_int_equal(rt_line_in_use(l), 0);
    rt_line_free(l);
}

static void test_line_released_slot_skips_a_key_at_its_bound_for_the_next_key(void **state)
{
    (void)state;
    rt_line *l = rt_line_new("delivery", 2, 10, 0, NULL);
    rt_line_limit_holding(l, 1);
    rt_line_waiter a1 = waiter("a", 1), b1 = waiter("b", 2), a2 = waiter("a", 3),
                   b2 = waiter("b", 4), c1 = waiter("c", 5);
    assert_int_equal(rt_line_enter(l, &a1), RT_LINE_ADMITTED);
    assert_int_equal(rt_line_enter(l, &b1), RT_LINE_ADMITTED);
    assert_int_equal(rt_line_enter(l, &a2), RT_LINE_QUEUED); /* front of the ring */
    assert_int_equal(rt_line_enter(l, &b2), RT_LINE_QUEUED);
    assert_int_equal(rt_line_enter(l, &c1), RT_LINE_QUEUED);
    /* b releases: the ring's front key a still holds its one (at its bound), so the slot
     * passes over it to b's waiter; a keeps its turn. */
    assert_int_equal(id_of(rt_line_release_for(l, "b")), 4);
    /* a releases: a's own waiter is next in the fair order. */
    assert_int_equal(id_of(rt_line_release_for(l, "a")), 3);
    /* b releases again: a and b are done waiting, c is served. */
    assert_int_equal(id_of(rt_line_release_for(l, "b")), 5);
    assert_null(rt_line_release_for(l, "a"));
    assert_null(rt_line_release_for(l, "c"));
    assert_int_equal(rt_line_in_use(l), 0);
    rt_line_free(l);
}

static void test_line_passes_a_released_slot_straight_to_the_next_waiter(void **state)
{
    (void)state;
    rt_line *l = rt_line_new("delivery", 1, 10, 0, NULL);
    rt_line_waiter holder = waiter("h", 0), w = waiter("k", 1), late = waiter("x", 2);
    assert_int_equal(rt_line_enter(l, &holder), RT_LINE_ADMITTED);
    assert_int_equal(rt_line_enter(l, &w), RT_LINE_QUEUED);
    rt_line_waiter *granted = rt_line_release(l);
    assert_ptr_equal(granted, &w);
    assert_int_equal(rt_line_in_use(l), 1); /* the slot moved; it was never free */
    assert_int_equal(rt_line_waiting(l), 0);
    /* A newcomer cannot take the slot the waiter was given. */
    assert_int_equal(rt_line_enter(l, &late), RT_LINE_QUEUED);
    assert_ptr_equal(rt_line_release(l), &late);
    assert_null(rt_line_release(l));
    rt_line_free(l);
}

static void test_line_is_fair_one_waiter_of_b_is_served_right_after_100_of_a(void **state)
{
    (void)state;
    enum { A_WAITERS = 100 };
    rt_line *l = rt_line_new("delivery", 1, 1000, 0, NULL);
    rt_line_waiter holder = waiter("holder", 0);
    assert_int_equal(rt_line_enter(l, &holder), RT_LINE_ADMITTED);
    rt_line_waiter a[A_WAITERS];
    for (int i = 0; i < A_WAITERS; i++) {
        a[i] = waiter("client-a", i + 1);
        assert_int_equal(rt_line_enter(l, &a[i]), RT_LINE_QUEUED);
    }
    rt_line_waiter b = waiter("client-b", 1000);
    assert_int_equal(rt_line_enter(l, &b), RT_LINE_QUEUED);

    int b_granted_at = 0;
    int next_a = 1;
    for (int release = 1; release <= A_WAITERS + 1; release++) {
        int id = release_id(l);
        if (id == 1000) {
            b_granted_at = release;
        } else {
            assert_int_equal(id, next_a); /* A's own waiters stay in arrival order */
            next_a++;
        }
    }
    assert_int_not_equal(b_granted_at, 0);
    assert_in_range(b_granted_at, 1, 2); /* within one turn of A, not after 100 */
    assert_null(rt_line_release(l));
    rt_line_free(l);
}

static void test_line_alternates_between_keys_in_round_robin_order(void **state)
{
    (void)state;
    rt_line *l = rt_line_new("rr", 1, 100, 0, NULL);
    rt_line_waiter holder = waiter("holder", 0);
    assert_int_equal(rt_line_enter(l, &holder), RT_LINE_ADMITTED);
    rt_line_waiter w[9];
    const char *keys[3] = {"a", "b", "c"};
    /* Arrival: a1 a2 a3 b1 b2 b3 c1 c2 c3 (ids 11..13, 21..23, 31..33). */
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < 3; i++) {
            w[k * 3 + i] = waiter(keys[k], (k + 1) * 10 + i + 1);
            assert_int_equal(rt_line_enter(l, &w[k * 3 + i]), RT_LINE_QUEUED);
        }
    }
    const int expected[9] = {11, 21, 31, 12, 22, 32, 13, 23, 33};
    for (int i = 0; i < 9; i++)
        assert_int_equal(release_id(l), expected[i]);
    assert_null(rt_line_release(l));
    rt_line_free(l);
}

static void test_line_refuses_past_max_waiting_and_leaves_the_waiter_untouched(void **state)
{
    (void)state;
    rt_line *l = rt_line_new("short", 1, 2, 0, NULL);
    rt_line_waiter holder = waiter("h", 0), w1 = waiter("a", 1), w2 = waiter("b", 2),
                   w3 = waiter("c", 3);
    assert_int_equal(rt_line_enter(l, &holder), RT_LINE_ADMITTED);
    assert_int_equal(rt_line_enter(l, &w1), RT_LINE_QUEUED);
    assert_int_equal(rt_line_enter(l, &w2), RT_LINE_QUEUED);
    rt_line_waiter before = w3;
    assert_int_equal(rt_line_enter(l, &w3), ATRIUM_E_LIMIT);
    assert_memory_equal(&w3, &before, sizeof(w3));
    assert_int_equal(rt_line_waiting(l), 2);
    assert_int_equal(release_id(l), 1);
    assert_int_equal(rt_line_enter(l, &w3), RT_LINE_QUEUED); /* room again */
    assert_int_equal(release_id(l), 2);
    assert_int_equal(release_id(l), 3);
    assert_null(rt_line_release(l));
    rt_line_free(l);
}

static void test_line_refuses_past_max_waiting_per_key_but_queues_other_keys(void **state)
{
    (void)state;
    rt_line *l = rt_line_new("per-key", 1, 10, 2, NULL);
    rt_line_waiter holder = waiter("h", 0), a1 = waiter("a", 1), a2 = waiter("a", 2),
                   a3 = waiter("a", 3), b1 = waiter("b", 4);
    assert_int_equal(rt_line_enter(l, &holder), RT_LINE_ADMITTED);
    assert_int_equal(rt_line_enter(l, &a1), RT_LINE_QUEUED);
    assert_int_equal(rt_line_enter(l, &a2), RT_LINE_QUEUED);
    assert_int_equal(rt_line_enter(l, &a3), ATRIUM_E_LIMIT);
    assert_int_equal(rt_line_enter(l, &b1), RT_LINE_QUEUED);
    assert_int_equal(rt_line_waiting(l), 3);
    assert_int_equal(release_id(l), 1);
    assert_int_equal(rt_line_enter(l, &a3), RT_LINE_QUEUED); /* a is under its cap again */
    assert_int_equal(release_id(l), 4);
    assert_int_equal(release_id(l), 2);
    assert_int_equal(release_id(l), 3);
    assert_null(rt_line_release(l));
    rt_line_free(l);
}

static void test_line_with_max_waiting_zero_refuses_at_once_when_no_slot_is_free(void **state)
{
    (void)state;
    rt_line *l = rt_line_new("no-wait", 1, 0, 0, NULL);
    rt_line_waiter a = waiter("a", 1), b = waiter("b", 2);
    assert_int_equal(rt_line_enter(l, &a), RT_LINE_ADMITTED);
    assert_int_equal(rt_line_enter(l, &b), ATRIUM_E_LIMIT);
    assert_int_equal(rt_line_waiting(l), 0);
    assert_null(rt_line_release(l));
    assert_int_equal(rt_line_enter(l, &b), RT_LINE_ADMITTED);
    assert_null(rt_line_release(l));
    rt_line_free(l);
}

static void test_line_cancel_of_a_waiting_waiter_unlinks_it(void **state)
{
    (void)state;
    rt_line *l = rt_line_new("cancel", 1, 10, 0, NULL);
    rt_line_waiter holder = waiter("h", 0), a1 = waiter("a", 1), a2 = waiter("a", 2),
                   a3 = waiter("a", 3), a4 = waiter("a", 4);
    assert_int_equal(rt_line_enter(l, &holder), RT_LINE_ADMITTED);
    assert_int_equal(rt_line_enter(l, &a1), RT_LINE_QUEUED);
    assert_int_equal(rt_line_enter(l, &a2), RT_LINE_QUEUED);
    assert_int_equal(rt_line_enter(l, &a3), RT_LINE_QUEUED);
    assert_true(rt_line_cancel(l, &a2)); /* from the middle */
    assert_true(rt_line_cancel(l, &a3)); /* from the tail */
    assert_int_equal(rt_line_waiting(l), 1);
    assert_int_equal(rt_line_enter(l, &a4), RT_LINE_QUEUED); /* the tail was fixed up */
    assert_int_equal(release_id(l), 1);
    assert_int_equal(release_id(l), 4);
    assert_null(rt_line_release(l));
    assert_int_equal(rt_line_in_use(l), 0);
    rt_line_free(l);
}

static void test_line_cancel_of_a_keys_only_waiter_takes_the_key_out_of_turn(void **state)
{
    (void)state;
    rt_line *l = rt_line_new("cancel-key", 1, 10, 0, NULL);
    rt_line_waiter holder = waiter("h", 0), a = waiter("a", 1), b = waiter("b", 2),
                   c = waiter("c", 3), b2 = waiter("b", 4);
    assert_int_equal(rt_line_enter(l, &holder), RT_LINE_ADMITTED);
    assert_int_equal(rt_line_enter(l, &a), RT_LINE_QUEUED);
    assert_int_equal(rt_line_enter(l, &b), RT_LINE_QUEUED);
    assert_int_equal(rt_line_enter(l, &c), RT_LINE_QUEUED);
    assert_true(rt_line_cancel(l, &b));
    assert_int_equal(rt_line_enter(l, &b2), RT_LINE_QUEUED); /* b rejoins at the back */
    assert_int_equal(release_id(l), 1);
    assert_int_equal(release_id(l), 3);
    assert_int_equal(release_id(l), 4);
    assert_null(rt_line_release(l));
    rt_line_free(l);
}

static void test_line_cancel_of_a_granted_waiter_returns_false_and_keeps_the_slot(void **state)
{
    (void)state;
    rt_line *l = rt_line_new("race", 1, 10, 0, NULL);
    rt_line_waiter holder = waiter("h", 0), w = waiter("a", 1);
    assert_int_equal(rt_line_enter(l, &holder), RT_LINE_ADMITTED);
    assert_int_equal(rt_line_enter(l, &w), RT_LINE_QUEUED);
    assert_ptr_equal(rt_line_release(l), &w);
    assert_false(rt_line_cancel(l, &w)); /* its deadline fired after the grant */
    assert_int_equal(rt_line_in_use(l), 1);
    assert_false(rt_line_cancel(l, &holder)); /* admitted at once: also holds a slot */
    assert_null(rt_line_release(l));
    assert_int_equal(rt_line_in_use(l), 0);
    rt_line_free(l);
}

static void test_line_metrics_report_slots_use_waiting_refusals_and_timeouts(void **state)
{
    (void)state;
    rt_metrics *reg = rt_metrics_new();
    rt_line *l = rt_line_new("media", 1, 1, 0, reg);
    rt_line_waiter a = waiter("a", 1), b = waiter("b", 2), c = waiter("c", 3);
    assert_int_equal(rt_line_enter(l, &a), RT_LINE_ADMITTED);
    assert_int_equal(rt_line_enter(l, &b), RT_LINE_QUEUED);
    assert_int_equal(rt_line_enter(l, &c), ATRIUM_E_LIMIT);
    char *text = rt_metrics_render(reg, NULL);
    assert_non_null(strstr(text, "\natrium_line_slots{line=\"media\"} 1\n"));
    assert_non_null(strstr(text, "\natrium_line_in_use{line=\"media\"} 1\n"));
    assert_non_null(strstr(text, "\natrium_line_waiting{line=\"media\"} 1\n"));
    assert_non_null(strstr(text, "\natrium_line_refused_total{line=\"media\"} 1\n"));
    free(text);
    assert_true(rt_line_cancel(l, &b));
    rt_line_count_timeout(l);
    text = rt_metrics_render(reg, NULL);
    assert_non_null(strstr(text, "\natrium_line_waiting{line=\"media\"} 0\n"));
    assert_non_null(strstr(text, "\natrium_line_timed_out_total{line=\"media\"} 1\n"));
    free(text);
    assert_null(rt_line_release(l));
    rt_line_free(l);
    rt_metrics_free(reg);
}

/* Threads that enter, park on their own condition variable until granted, hold the slot,
 * release it and wake whoever the line handed it to: the way core/http uses the line. */
enum { CLIENTS = 4, VISITS = 300 };

typedef struct parked {
    rt_line_waiter w;
    pthread_mutex_t m;
    pthread_cond_t cv;
    bool granted;
} parked;

static rt_line *shared_line;

static void wake(rt_line_waiter *w)
{
    parked *p = w->ctx;
    pthread_mutex_lock(&p->m);
    p->granted = true;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->m);
}

static void *visitor(void *arg)
{
    const char *key = arg;
    intptr_t refused = 0;
    for (int i = 0; i < VISITS; i++) {
        parked p = {.w = {.key = key}};
        p.w.ctx = &p;
        pthread_mutex_init(&p.m, NULL);
        pthread_cond_init(&p.cv, NULL);
        int rc = rt_line_enter(shared_line, &p.w);
        if (rc == RT_LINE_QUEUED) {
            pthread_mutex_lock(&p.m);
            while (!p.granted)
                pthread_cond_wait(&p.cv, &p.m);
            pthread_mutex_unlock(&p.m);
        } else if (rc != RT_LINE_ADMITTED) {
            refused++;
        }
        if (rc != ATRIUM_E_LIMIT) {
            rt_line_waiter *next = rt_line_release(shared_line);
            if (next != NULL)
                wake(next);
        }
        pthread_cond_destroy(&p.cv);
        pthread_mutex_destroy(&p.m);
    }
    return (void *)refused;
}

static void test_line_hands_every_slot_on_under_concurrent_clients(void **state)
{
    (void)state;
    shared_line = rt_line_new("busy", 1, CLIENTS, 0, NULL);
    static const char *keys[CLIENTS] = {"a", "b", "a", "c"};
    pthread_t t[CLIENTS];
    for (int i = 0; i < CLIENTS; i++)
        pthread_create(&t[i], NULL, visitor, (void *)keys[i]);
    for (int i = 0; i < CLIENTS; i++) {
        void *refused;
        pthread_join(t[i], &refused);
        assert_int_equal((intptr_t)refused, 0);
    }
    assert_int_equal(rt_line_in_use(shared_line), 0);
    assert_int_equal(rt_line_waiting(shared_line), 0);
    rt_line_free(shared_line);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_line_admits_at_once_while_slots_are_free),
        cmocka_unit_test(test_line_passes_a_released_slot_straight_to_the_next_waiter),
        cmocka_unit_test(test_line_is_fair_one_waiter_of_b_is_served_right_after_100_of_a),
        cmocka_unit_test(test_line_alternates_between_keys_in_round_robin_order),
        cmocka_unit_test(test_line_refuses_past_max_waiting_and_leaves_the_waiter_untouched),
        cmocka_unit_test(test_line_refuses_past_max_waiting_per_key_but_queues_other_keys),
        cmocka_unit_test(test_line_with_max_waiting_zero_refuses_at_once_when_no_slot_is_free),
        cmocka_unit_test(test_line_cancel_of_a_waiting_waiter_unlinks_it),
        cmocka_unit_test(test_line_cancel_of_a_keys_only_waiter_takes_the_key_out_of_turn),
        cmocka_unit_test(test_line_cancel_of_a_granted_waiter_returns_false_and_keeps_the_slot),
        cmocka_unit_test(test_line_metrics_report_slots_use_waiting_refusals_and_timeouts),
        cmocka_unit_test(test_line_hands_every_slot_on_under_concurrent_clients),
        cmocka_unit_test(test_line_bounds_what_one_key_holds_and_serves_other_keys_from_free_slots),
        cmocka_unit_test(test_line_released_slot_skips_a_key_at_its_bound_for_the_next_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
