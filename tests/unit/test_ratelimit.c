/*
 * tests/unit/test_ratelimit.c - token buckets per client key: burst, refusal with
 * retry_after_ms, refill over time, and a bounded key table. Time is injected: no sleeps.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime/runtime.h"

enum { T0_MS = 1000000 };

static void test_ratelimit_allows_burst_then_refuses_with_retry_after(void **state)
{
    (void)state;
    rt_ratelimit *rl = rt_ratelimit_new("login", 2.0, 5.0, 100, NULL);
    assert_non_null(rl);
    for (int i = 0; i < 5; i++)
        assert_int_equal(rt_ratelimit_check(rl, "@a:hs", T0_MS), 0);
    int64_t retry = rt_ratelimit_check(rl, "@a:hs", T0_MS);
    assert_in_range(retry, 1000 / 2 - 1, 1000 / 2 + 1); /* one token per 500 ms */
    rt_ratelimit_free(rl);
}

static void test_ratelimit_retry_after_shrinks_as_the_token_refills(void **state)
{
    (void)state;
    rt_ratelimit *rl = rt_ratelimit_new("msg", 0.5, 1.0, 100, NULL);
    assert_int_equal(rt_ratelimit_check(rl, "k", T0_MS), 0);
    assert_in_range(rt_ratelimit_check(rl, "k", T0_MS), 1999, 2001);
    assert_in_range(rt_ratelimit_check(rl, "k", T0_MS + 1500), 499, 501);
    assert_int_equal(rt_ratelimit_check(rl, "k", T0_MS + 2000), 0);
    rt_ratelimit_free(rl);
}

static void test_ratelimit_refills_over_time_up_to_burst(void **state)
{
    (void)state;
    rt_ratelimit *rl = rt_ratelimit_new("register", 2.0, 3.0, 100, NULL);
    for (int i = 0; i < 3; i++)
        assert_int_equal(rt_ratelimit_check(rl, "k", T0_MS), 0);
    assert_true(rt_ratelimit_check(rl, "k", T0_MS) > 0);
    /* 500 ms later one token is back, and only one. */
    assert_int_equal(rt_ratelimit_check(rl, "k", T0_MS + 500), 0);
    assert_true(rt_ratelimit_check(rl, "k", T0_MS + 500) > 0);
    /* A long pause refills to burst, never beyond. */
    int64_t later = T0_MS + 60000;
    for (int i = 0; i < 3; i++)
        assert_int_equal(rt_ratelimit_check(rl, "k", later), 0);
    assert_true(rt_ratelimit_check(rl, "k", later) > 0);
    rt_ratelimit_free(rl);
}

static void test_ratelimit_clock_going_backwards_adds_no_tokens(void **state)
{
    (void)state;
    rt_ratelimit *rl = rt_ratelimit_new("skew", 1.0, 1.0, 100, NULL);
    assert_int_equal(rt_ratelimit_check(rl, "k", T0_MS), 0);
    assert_true(rt_ratelimit_check(rl, "k", T0_MS - 5000) > 0);
    assert_true(rt_ratelimit_check(rl, "k", T0_MS + 500) > 0);
    assert_int_equal(rt_ratelimit_check(rl, "k", T0_MS + 1000), 0);
    rt_ratelimit_free(rl);
}

static void test_ratelimit_keys_have_independent_buckets(void **state)
{
    (void)state;
    rt_ratelimit *rl = rt_ratelimit_new("join", 1.0, 1.0, 100, NULL);
    assert_int_equal(rt_ratelimit_check(rl, "@a:hs", T0_MS), 0);
    assert_true(rt_ratelimit_check(rl, "@a:hs", T0_MS) > 0);
    assert_int_equal(rt_ratelimit_check(rl, "@b:hs", T0_MS), 0);
    assert_int_equal(rt_ratelimit_keys(rl), 2);
    rt_ratelimit_free(rl);
}

static void test_ratelimit_full_table_drops_a_refilled_bucket_to_admit_a_new_key(void **state)
{
    (void)state;
    rt_ratelimit *rl = rt_ratelimit_new("bounded", 1.0, 2.0, 2, NULL);
    assert_int_equal(rt_ratelimit_check(rl, "a", T0_MS), 0);       /* a full again at +1000 */
    assert_int_equal(rt_ratelimit_check(rl, "b", T0_MS + 400), 0); /* b full again at +1400 */
    /* Table full, nobody back to full: the newcomer is refused until a is. */
    int64_t retry = rt_ratelimit_check(rl, "c", T0_MS + 500);
    assert_int_equal(retry, 500);
    assert_int_equal(rt_ratelimit_keys(rl), 2);
    /* At +1000, a has refilled: it carries no state and makes room for c. */
    assert_int_equal(rt_ratelimit_check(rl, "c", T0_MS + 1000), 0);
    assert_int_equal(rt_ratelimit_keys(rl), 2);
    /* b kept its state: only one of its two tokens is back by +1000. */
    assert_int_equal(rt_ratelimit_check(rl, "b", T0_MS + 1000), 0);
    assert_true(rt_ratelimit_check(rl, "b", T0_MS + 1000) > 0);
    rt_ratelimit_free(rl);
}

static void test_ratelimit_key_table_never_exceeds_max_keys(void **state)
{
    (void)state;
    enum { MAX_KEYS = 10, CLIENTS = 1000 };
    rt_ratelimit *rl = rt_ratelimit_new("flood", 1.0, 5.0, MAX_KEYS, NULL);
    int allowed = 0;
    for (int i = 0; i < CLIENTS; i++) {
        char key[32];
        snprintf(key, sizeof(key), "10.0.%d.%d", i / 256, i % 256);
        if (rt_ratelimit_check(rl, key, T0_MS) == 0)
            allowed++;
        assert_true(rt_ratelimit_keys(rl) <= MAX_KEYS);
    }
    assert_int_equal(allowed, MAX_KEYS);
    /* Once their buckets are full again, new clients get in. */
    assert_int_equal(rt_ratelimit_check(rl, "10.9.9.9", T0_MS + 1000), 0);
    assert_int_equal(rt_ratelimit_keys(rl), MAX_KEYS);
    rt_ratelimit_free(rl);
}

static void test_ratelimit_rejects_a_nonsensical_configuration(void **state)
{
    (void)state;
    assert_null(rt_ratelimit_new("bad", 0.0, 1.0, 10, NULL));
    assert_null(rt_ratelimit_new("bad", 1.0, 0.5, 10, NULL));
    assert_null(rt_ratelimit_new("bad", 1.0, 1.0, 0, NULL));
}

static void test_ratelimit_metrics_report_refusals_and_keys(void **state)
{
    (void)state;
    rt_metrics *reg = rt_metrics_new();
    rt_ratelimit *rl = rt_ratelimit_new("login", 1.0, 1.0, 10, reg);
    assert_int_equal(rt_ratelimit_check(rl, "a", T0_MS), 0);
    assert_int_equal(rt_ratelimit_check(rl, "b", T0_MS), 0);
    assert_true(rt_ratelimit_check(rl, "a", T0_MS) > 0);
    char *text = rt_metrics_render(reg, NULL);
    assert_non_null(strstr(text, "\natrium_ratelimit_refused_total{action=\"login\"} 1\n"));
    assert_non_null(strstr(text, "\natrium_ratelimit_keys{action=\"login\"} 2\n"));
    free(text);
    rt_ratelimit_free(rl);
    rt_metrics_free(reg);
}

enum { THREADS = 4, CHECKS = 1000 };
static rt_ratelimit *shared_rl;

static void *checker(void *arg)
{
    intptr_t allowed = 0;
    for (int i = 0; i < CHECKS; i++) {
        char key[16];
        snprintf(key, sizeof(key), "k%d", i % 20);
        if (rt_ratelimit_check(shared_rl, key, T0_MS) == 0)
            allowed++;
    }
    (void)arg;
    return (void *)allowed;
}

static void test_ratelimit_hands_out_exactly_burst_tokens_under_concurrent_checks(void **state)
{
    (void)state;
    shared_rl = rt_ratelimit_new("race", 1.0, 3.0, 100, NULL);
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, checker, NULL);
    intptr_t allowed = 0;
    for (int i = 0; i < THREADS; i++) {
        void *n;
        pthread_join(t[i], &n);
        allowed += (intptr_t)n;
    }
    assert_int_equal(allowed, 20 * 3); /* 20 keys, burst 3 each, time stands still */
    rt_ratelimit_free(shared_rl);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ratelimit_allows_burst_then_refuses_with_retry_after),
        cmocka_unit_test(test_ratelimit_retry_after_shrinks_as_the_token_refills),
        cmocka_unit_test(test_ratelimit_refills_over_time_up_to_burst),
        cmocka_unit_test(test_ratelimit_clock_going_backwards_adds_no_tokens),
        cmocka_unit_test(test_ratelimit_keys_have_independent_buckets),
        cmocka_unit_test(test_ratelimit_full_table_drops_a_refilled_bucket_to_admit_a_new_key),
        cmocka_unit_test(test_ratelimit_key_table_never_exceeds_max_keys),
        cmocka_unit_test(test_ratelimit_rejects_a_nonsensical_configuration),
        cmocka_unit_test(test_ratelimit_metrics_report_refusals_and_keys),
        cmocka_unit_test(test_ratelimit_hands_out_exactly_burst_tokens_under_concurrent_checks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
