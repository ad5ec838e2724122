/*
 * tests/unit/test_budget.c - the budget's contract: a global cap and a per-client cap that
 * refuse at once (and say which), slots that come back on release, and a key table that
 * holds only clients with something in flight.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/runtime/runtime.h"

static void test_budget_refuses_over_the_global_cap_and_says_g(void **state)
{
    (void)state;
    rt_budget *b = rt_budget_new("outbound", 3, 10, NULL);
    assert_non_null(b);
    assert_int_equal(rt_budget_try_acquire(b, "@a:hs", NULL), 0);
    assert_int_equal(rt_budget_try_acquire(b, "@b:hs", NULL), 0);
    assert_int_equal(rt_budget_try_acquire(b, "@c:hs", NULL), 0);
    char which = 0;
    assert_int_equal(rt_budget_try_acquire(b, "@d:hs", &which), ATRIUM_E_LIMIT);
    assert_int_equal(which, 'g');
    assert_int_equal(rt_budget_in_use(b), 3);
    assert_int_equal(rt_budget_in_use_key(b, "@d:hs"), 0);
    rt_budget_release(b, "@a:hs");
    rt_budget_release(b, "@b:hs");
    rt_budget_release(b, "@c:hs");
    rt_budget_free(b);
}

static void test_budget_refuses_over_the_per_key_cap_and_says_k(void **state)
{
    (void)state;
    rt_budget *b = rt_budget_new("fetch", 10, 2, NULL);
    assert_int_equal(rt_budget_try_acquire(b, "@a:hs", NULL), 0);
    assert_int_equal(rt_budget_try_acquire(b, "@a:hs", NULL), 0);
    char which = 0;
    assert_int_equal(rt_budget_try_acquire(b, "@a:hs", &which), ATRIUM_E_LIMIT);
    assert_int_equal(which, 'k');
    /* Another client is not affected by the first one's cap. */
    assert_int_equal(rt_budget_try_acquire(b, "@b:hs", NULL), 0);
    assert_int_equal(rt_budget_in_use_key(b, "@a:hs"), 2);
    assert_int_equal(rt_budget_in_use(b), 3);
    rt_budget_release(b, "@a:hs");
    rt_budget_release(b, "@a:hs");
    rt_budget_release(b, "@b:hs");
    rt_budget_free(b);
}

static void test_budget_release_frees_a_slot_for_the_next_client(void **state)
{
    (void)state;
    rt_budget *b = rt_budget_new("one", 1, 1, NULL);
    assert_int_equal(rt_budget_try_acquire(b, "@a:hs", NULL), 0);
    char which = 0;
    assert_int_equal(rt_budget_try_acquire(b, "@b:hs", &which), ATRIUM_E_LIMIT);
    assert_int_equal(which, 'g');
    rt_budget_release(b, "@a:hs");
    assert_int_equal(rt_budget_try_acquire(b, "@b:hs", NULL), 0);
    rt_budget_release(b, "@b:hs");
    assert_int_equal(rt_budget_in_use(b), 0);
    rt_budget_free(b);
}

static void test_budget_keys_vanish_when_their_count_reaches_zero(void **state)
{
    (void)state;
    rt_budget *b = rt_budget_new("keys", 10, 5, NULL);
    assert_int_equal(rt_budget_try_acquire(b, "@a:hs", NULL), 0);
    assert_int_equal(rt_budget_try_acquire(b, "@a:hs", NULL), 0);
    assert_int_equal(rt_budget_try_acquire(b, "@b:hs", NULL), 0);
    assert_int_equal(rt_budget_keys(b), 2);
    rt_budget_release(b, "@a:hs");
    assert_int_equal(rt_budget_keys(b), 2);
    assert_int_equal(rt_budget_in_use_key(b, "@a:hs"), 1);
    rt_budget_release(b, "@a:hs");
    assert_int_equal(rt_budget_keys(b), 1);
    assert_int_equal(rt_budget_in_use_key(b, "@a:hs"), 0);
    rt_budget_release(b, "@b:hs");
    assert_int_equal(rt_budget_keys(b), 0);
    assert_int_equal(rt_budget_in_use(b), 0);
    rt_budget_free(b);
}

static void test_budget_refusals_leave_no_key_behind(void **state)
{
    (void)state;
    rt_budget *b = rt_budget_new("full", 1, 1, NULL);
    assert_int_equal(rt_budget_try_acquire(b, "@a:hs", NULL), 0);
    for (int i = 0; i < 100; i++) {
        char key[32];
        snprintf(key, sizeof(key), "@u%d:hs", i);
        assert_int_equal(rt_budget_try_acquire(b, key, NULL), ATRIUM_E_LIMIT);
    }
    assert_int_equal(rt_budget_keys(b), 1);
    rt_budget_release(b, "@a:hs");
    rt_budget_free(b);
}

static void test_budget_with_per_key_cap_zero_applies_only_the_global_cap(void **state)
{
    (void)state;
    rt_budget *b = rt_budget_new("global-only", 3, 0, NULL);
    for (int i = 0; i < 3; i++)
        assert_int_equal(rt_budget_try_acquire(b, "@a:hs", NULL), 0);
    char which = 0;
    assert_int_equal(rt_budget_try_acquire(b, "@a:hs", &which), ATRIUM_E_LIMIT);
    assert_int_equal(which, 'g');
    for (int i = 0; i < 3; i++)
        rt_budget_release(b, "@a:hs");
    rt_budget_free(b);
}

static void test_budget_rejects_a_nonsensical_configuration(void **state)
{
    (void)state;
    assert_null(rt_budget_new("bad", 0, 1, NULL));
    assert_null(rt_budget_new("bad", 4, -1, NULL));
}

static void test_budget_metrics_report_in_use_limit_and_refusals(void **state)
{
    (void)state;
    rt_metrics *reg = rt_metrics_new();
    rt_budget *b = rt_budget_new("fetch", 2, 1, reg);
    assert_int_equal(rt_budget_try_acquire(b, "@a:hs", NULL), 0);
    assert_int_equal(rt_budget_try_acquire(b, "@a:hs", NULL), ATRIUM_E_LIMIT);
    char *text = rt_metrics_render(reg, NULL);
    assert_non_null(strstr(text, "\natrium_budget_in_use{budget=\"fetch\"} 1\n"));
    assert_non_null(strstr(text, "\natrium_budget_limit{budget=\"fetch\"} 2\n"));
    assert_non_null(strstr(text, "\natrium_budget_refused_total{budget=\"fetch\"} 1\n"));
    free(text);
    rt_budget_release(b, "@a:hs");
    rt_budget_free(b);
    rt_metrics_free(reg);
}

/* Runs fn in a child process with stderr silenced; true if the child died of SIGABRT. */
static bool aborts(void (*fn)(void))
{
    pid_t pid = fork();
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0)
            dup2(devnull, STDERR_FILENO);
        fn();
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
}

static void release_unheld_key(void)
{
    rt_budget *b = rt_budget_new("strict", 2, 2, NULL);
    rt_budget_release(b, "@nobody:hs");
}

static void test_budget_release_by_a_key_without_a_slot_aborts(void **state)
{
    (void)state;
    assert_true(aborts(release_unheld_key));
}

enum { WORKERS = 4, ROUNDS = 2000 };
static rt_budget *shared_budget;

static void *acquire_release_loop(void *arg)
{
    const char *key = arg;
    intptr_t failures = 0;
    for (int i = 0; i < ROUNDS; i++) {
        if (rt_budget_try_acquire(shared_budget, key, NULL) == 0)
            rt_budget_release(shared_budget, key);
        else
            failures++;
    }
    return (void *)failures;
}

static void test_budget_counts_stay_exact_under_concurrent_clients(void **state)
{
    (void)state;
    shared_budget = rt_budget_new("busy", WORKERS, 1, NULL);
    static const char *keys[WORKERS] = {"@a:hs", "@b:hs", "@c:hs", "@d:hs"};
    pthread_t t[WORKERS];
    for (int i = 0; i < WORKERS; i++)
        pthread_create(&t[i], NULL, acquire_release_loop, (void *)keys[i]);
    for (int i = 0; i < WORKERS; i++) {
        void *failures;
        pthread_join(t[i], &failures);
        assert_int_equal((intptr_t)failures, 0); /* each client alone under its own cap */
    }
    assert_int_equal(rt_budget_in_use(shared_budget), 0);
    assert_int_equal(rt_budget_keys(shared_budget), 0);
    rt_budget_free(shared_budget);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_budget_refuses_over_the_global_cap_and_says_g),
        cmocka_unit_test(test_budget_refuses_over_the_per_key_cap_and_says_k),
        cmocka_unit_test(test_budget_release_frees_a_slot_for_the_next_client),
        cmocka_unit_test(test_budget_keys_vanish_when_their_count_reaches_zero),
        cmocka_unit_test(test_budget_refusals_leave_no_key_behind),
        cmocka_unit_test(test_budget_with_per_key_cap_zero_applies_only_the_global_cap),
        cmocka_unit_test(test_budget_rejects_a_nonsensical_configuration),
        cmocka_unit_test(test_budget_metrics_report_in_use_limit_and_refusals),
        cmocka_unit_test(test_budget_release_by_a_key_without_a_slot_aborts),
        cmocka_unit_test(test_budget_counts_stay_exact_under_concurrent_clients),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
