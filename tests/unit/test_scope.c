/*
 * tests/unit/test_scope.c - thread-local scope frames (nesting, cleanup on every exit path,
 * per-thread chains) and rt_scope_wait, which releases the lock the scope publishes.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/runtime/runtime.h"

static void test_scope_lookup_is_null_when_nothing_is_published(void **state)
{
    (void)state;
    assert_null(rt_scope_current());
    assert_null(rt_scope_get(ATRIUM_SCOPE_USER));
    assert_false(rt_scope_has(ATRIUM_SCOPE_USER));
}

static void test_scope_inner_frame_shadows_outer_and_popping_restores_it(void **state)
{
    (void)state;
    {
        RT_SCOPE(ATRIUM_SCOPE_USER, "@outer:hs");
        RT_SCOPE(ATRIUM_SCOPE_CLIENT_KEY, "10.0.0.1");
        assert_string_equal(rt_scope_get(ATRIUM_SCOPE_USER), "@outer:hs");
        {
            RT_SCOPE(ATRIUM_SCOPE_USER, "@inner:hs");
            assert_string_equal(rt_scope_get(ATRIUM_SCOPE_USER), "@inner:hs");
            assert_string_equal(rt_scope_get(ATRIUM_SCOPE_CLIENT_KEY), "10.0.0.1");
        }
        assert_string_equal(rt_scope_get(ATRIUM_SCOPE_USER), "@outer:hs");
    }
    assert_false(rt_scope_has(ATRIUM_SCOPE_USER));
    assert_null(rt_scope_current());
}

static void test_scope_has_sees_a_published_null_value(void **state)
{
    (void)state;
    RT_SCOPE(ATRIUM_SCOPE_RATE_ADMITTED, (intptr_t)0);
    assert_true(rt_scope_has(ATRIUM_SCOPE_RATE_ADMITTED));
    assert_null(rt_scope_get(ATRIUM_SCOPE_RATE_ADMITTED));
}

static const char *publish_and_return_early(bool early)
{
    RT_SCOPE(ATRIUM_SCOPE_REQUEST_ID, "early");
    if (early)
        return rt_scope_get(ATRIUM_SCOPE_REQUEST_ID);
    RT_SCOPE(ATRIUM_SCOPE_USER, "@late:hs");
    return rt_scope_get(ATRIUM_SCOPE_USER);
}

static void test_scope_frames_are_popped_when_a_function_returns_early(void **state)
{
    (void)state;
    assert_string_equal(publish_and_return_early(true), "early");
    assert_null(rt_scope_current());
    assert_string_equal(publish_and_return_early(false), "@late:hs");
    assert_null(rt_scope_current());
}

static void test_scope_frames_are_popped_when_a_loop_breaks_or_continues(void **state)
{
    (void)state;
    for (int i = 0; i < 3; i++) {
        RT_SCOPE(ATRIUM_SCOPE_DEADLINE, (intptr_t)i);
        assert_int_equal((intptr_t)rt_scope_get(ATRIUM_SCOPE_DEADLINE), i);
        if (i == 0)
            continue;
        if (i == 1)
            break;
    }
    assert_null(rt_scope_current());
}

static void *read_user(void *arg)
{
    (void)arg;
    return rt_scope_get(ATRIUM_SCOPE_USER);
}

static void test_scope_chains_are_per_thread(void **state)
{
    (void)state;
    RT_SCOPE(ATRIUM_SCOPE_USER, "@main:hs");
    pthread_t t;
    void *seen = (void *)1;
    pthread_create(&t, NULL, read_user, NULL);
    pthread_join(t, &seen);
    assert_null(seen);
}

static void *adopt_chain(void *arg)
{
    rt_scope_set_current(arg);
    void *user = rt_scope_get(ATRIUM_SCOPE_USER);
    rt_scope_set_current(NULL);
    return user;
}

static void test_scope_set_current_republishes_a_chain_on_another_thread(void **state)
{
    (void)state;
    RT_SCOPE(ATRIUM_SCOPE_USER, "@handed:hs");
    pthread_t t;
    void *seen = NULL;
    pthread_create(&t, NULL, adopt_chain, rt_scope_current());
    pthread_join(t, &seen);
    assert_string_equal(seen, "@handed:hs");
}

/* ---- rt_scope_wait ------------------------------------------------------------------- */

typedef struct wait_case {
    pthread_mutex_t published; /* the lock the "request" holds (error-checking) */
    pthread_mutex_t m;
    pthread_cond_t cv;
    pthread_mutex_t sync_m;
    pthread_cond_t sync_cv;
    bool holding;     /* the waiter holds `published` */
    bool signalled;   /* guarded by m */
    int wait_rc;
    int unlock_published_rc, unlock_m_rc; /* 0 = the waiter held them again */
} wait_case;

static void wait_case_init(wait_case *c)
{
    memset(c, 0, sizeof(*c));
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ERRORCHECK);
    pthread_mutex_init(&c->published, &attr);
    pthread_mutex_init(&c->m, &attr);
    pthread_mutexattr_destroy(&attr);
    assert_int_equal(rt_cond_init(&c->cv), 0);
    pthread_mutex_init(&c->sync_m, NULL);
    pthread_cond_init(&c->sync_cv, NULL);
}

static void wait_case_destroy(wait_case *c)
{
    pthread_cond_destroy(&c->sync_cv);
    pthread_mutex_destroy(&c->sync_m);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->m);
    pthread_mutex_destroy(&c->published);
}

static void *waiter_main(void *arg)
{
    wait_case *c = arg;
    pthread_mutex_lock(&c->published);
    RT_SCOPE(ATRIUM_SCOPE_LOCK, &c->published);
    pthread_mutex_lock(&c->sync_m);
    c->holding = true;
    pthread_cond_signal(&c->sync_cv);
    pthread_mutex_unlock(&c->sync_m);

    pthread_mutex_lock(&c->m);
    int64_t deadline = rt_now_ms() + 10000; /* a safety net only: the test signals */
    c->wait_rc = 0;
    while (!c->signalled && c->wait_rc == 0)
        c->wait_rc = rt_scope_wait(&c->cv, &c->m, deadline);
    c->unlock_m_rc = pthread_mutex_unlock(&c->m);
    c->unlock_published_rc = pthread_mutex_unlock(&c->published);
    return NULL;
}

static void test_scope_wait_releases_the_published_lock_while_it_waits(void **state)
{
    (void)state;
    wait_case c;
    wait_case_init(&c);
    pthread_t t;
    pthread_create(&t, NULL, waiter_main, &c);
    pthread_mutex_lock(&c.sync_m);
    while (!c.holding)
        pthread_cond_wait(&c.sync_cv, &c.sync_m);
    pthread_mutex_unlock(&c.sync_m);

    /* The waiter holds the published lock and will not let go of it until it is signalled,
     * unless rt_scope_wait releases it: only then can this thread take it. */
    struct timespec give_up;
    clock_gettime(CLOCK_REALTIME, &give_up);
    give_up.tv_sec += 5;
    assert_int_equal(pthread_mutex_timedlock(&c.published, &give_up), 0);
    pthread_mutex_lock(&c.m);
    c.signalled = true;
    pthread_cond_signal(&c.cv);
    pthread_mutex_unlock(&c.m);
    pthread_mutex_unlock(&c.published);

    pthread_join(t, NULL);
    assert_int_equal(c.wait_rc, 0);
    assert_int_equal(c.unlock_m_rc, 0);         /* m was held again on return */
    assert_int_equal(c.unlock_published_rc, 0); /* and so was the published lock */
    wait_case_destroy(&c);
}

static void test_scope_wait_times_out_at_the_deadline_holding_both_locks(void **state)
{
    (void)state;
    enum { WAIT_MS = 30 };
    wait_case c;
    wait_case_init(&c);
    pthread_mutex_lock(&c.published);
    {
        RT_SCOPE(ATRIUM_SCOPE_LOCK, &c.published);
        pthread_mutex_lock(&c.m);
        int64_t start = rt_now_ms();
        int rc = rt_scope_wait(&c.cv, &c.m, start + WAIT_MS);
        assert_int_equal(rc, ATRIUM_E_TIMEOUT);
        assert_true(rt_now_ms() - start >= WAIT_MS);
        assert_int_equal(pthread_mutex_unlock(&c.m), 0);
    }
    assert_int_equal(pthread_mutex_unlock(&c.published), 0);
    wait_case_destroy(&c);
}

static void test_scope_wait_with_a_past_deadline_times_out_at_once(void **state)
{
    (void)state;
    wait_case c;
    wait_case_init(&c);
    pthread_mutex_lock(&c.m);
    assert_int_equal(rt_scope_wait(&c.cv, &c.m, rt_now_ms() - 1000), ATRIUM_E_TIMEOUT);
    assert_int_equal(pthread_mutex_unlock(&c.m), 0);
    wait_case_destroy(&c);
}

static void *signal_after_lock(void *arg)
{
    wait_case *c = arg;
    pthread_mutex_lock(&c->m); /* possible only while the waiter waits */
    c->signalled = true;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->m);
    return NULL;
}

static void test_scope_wait_on_the_published_lock_itself_releases_it_once(void **state)
{
    (void)state;
    wait_case c;
    wait_case_init(&c);
    pthread_mutex_lock(&c.m);
    RT_SCOPE(ATRIUM_SCOPE_LOCK, &c.m);
    pthread_t t;
    pthread_create(&t, NULL, signal_after_lock, &c);
    int rc = 0;
    while (!c.signalled && rc == 0)
        rc = rt_scope_wait(&c.cv, &c.m, rt_now_ms() + 10000);
    assert_int_equal(rc, 0);
    assert_int_equal(pthread_mutex_unlock(&c.m), 0);
    pthread_join(t, NULL);
    wait_case_destroy(&c);
}

static void pop_outer_frame_first(void)
{
    rt_scope_frame outer, inner;
    rt_scope_push(&outer, ATRIUM_SCOPE_USER, "a");
    rt_scope_push(&inner, ATRIUM_SCOPE_USER, "b");
    rt_scope_pop(&outer);
}

static void test_scope_pop_of_a_frame_that_is_not_innermost_aborts(void **state)
{
    (void)state;
    pid_t pid = fork();
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0)
            dup2(devnull, STDERR_FILENO);
        pop_outer_frame_first();
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGABRT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scope_lookup_is_null_when_nothing_is_published),
        cmocka_unit_test(test_scope_inner_frame_shadows_outer_and_popping_restores_it),
        cmocka_unit_test(test_scope_has_sees_a_published_null_value),
        cmocka_unit_test(test_scope_frames_are_popped_when_a_function_returns_early),
        cmocka_unit_test(test_scope_frames_are_popped_when_a_loop_breaks_or_continues),
        cmocka_unit_test(test_scope_chains_are_per_thread),
        cmocka_unit_test(test_scope_set_current_republishes_a_chain_on_another_thread),
        cmocka_unit_test(test_scope_wait_releases_the_published_lock_while_it_waits),
        cmocka_unit_test(test_scope_wait_times_out_at_the_deadline_holding_both_locks),
        cmocka_unit_test(test_scope_wait_with_a_past_deadline_times_out_at_once),
        cmocka_unit_test(test_scope_wait_on_the_published_lock_itself_releases_it_once),
        cmocka_unit_test(test_scope_pop_of_a_frame_that_is_not_innermost_aborts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
