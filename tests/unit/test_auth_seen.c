/*
 * tests/unit/test_auth_seen.c - the rule that decides when a device's last-seen time is
 * written (auth_seen_due): once per AUTH_SEEN_REFRESH_MS however many requests, from a
 * cached token as well as from a database look-up, never because nothing is known, and
 * again AUTH_SEEN_RETRY_MS after a write that failed. The clock is passed in: no sleeps.
 * Each test uses its own user, so the shared table carries nothing between tests.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <sodium.h>

#include "core/client/auth/auth.h"

#define T0_MS INT64_C(1767225600000) /* 2026-01-01, a realistic wall clock */
#define LONG_AGO_MS INT64_C(1000000000000)

static int setup(void **state)
{
    (void)state;
    if (sodium_init() < 0) return -1;
    rt_metrics *m = rt_metrics_new();
    *state = m;
    return m && auth_seen_init(m) == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    rt_metrics_free(*state);
    return 0;
}

static void test_an_old_stored_time_is_due_and_then_not_again_within_the_interval(void **state)
{
    (void)state;
    const char *u = "@ann:hs", *d = "PHONE";
    assert_true(auth_seen_due(u, d, LONG_AGO_MS, T0_MS));
    /* Cached-token requests and database look-ups that still read the old value. */
    assert_false(auth_seen_due(u, d, AUTH_SEEN_UNKNOWN, T0_MS + 1));
    assert_false(auth_seen_due(u, d, LONG_AGO_MS, T0_MS + 1000));
    assert_false(auth_seen_due(u, d, AUTH_SEEN_UNKNOWN, T0_MS + AUTH_SEEN_REFRESH_MS - 1));
}

static void test_a_cached_token_refreshes_once_the_interval_has_passed(void **state)
{
    (void)state;
    const char *u = "@bob:hs", *d = "LAPTOP";
    assert_true(auth_seen_due(u, d, LONG_AGO_MS, T0_MS));
    assert_true(auth_seen_due(u, d, AUTH_SEEN_UNKNOWN, T0_MS + AUTH_SEEN_REFRESH_MS));
    assert_false(auth_seen_due(u, d, AUTH_SEEN_UNKNOWN, T0_MS + AUTH_SEEN_REFRESH_MS + 1));
}

static void test_a_device_nothing_is_known_about_is_left_alone(void **state)
{
    (void)state;
    assert_false(auth_seen_due("@cat:hs", "TABLET", AUTH_SEEN_UNKNOWN, T0_MS));
    assert_false(auth_seen_due("@cat:hs", "TABLET", AUTH_SEEN_UNKNOWN, T0_MS * 2));
}

static void test_a_never_seen_device_is_due(void **state)
{
    (void)state;
    assert_true(auth_seen_due("@dan:hs", "NEW", 0, T0_MS)); /* a NULL column */
}

static void test_a_recent_stored_time_counts_as_written(void **state)
{
    (void)state;
    const char *u = "@eve:hs", *d = "PHONE";
    /* Another process (or a login) wrote a minute ago. */
    int64_t other = T0_MS - 60 * 1000;
    assert_false(auth_seen_due(u, d, other, T0_MS));
    assert_false(auth_seen_due(u, d, AUTH_SEEN_UNKNOWN, other + AUTH_SEEN_REFRESH_MS - 1));
    assert_true(auth_seen_due(u, d, AUTH_SEEN_UNKNOWN, other + AUTH_SEEN_REFRESH_MS));
}

static void test_a_failed_write_is_due_again_after_the_retry_delay(void **state)
{
    (void)state;
    const char *u = "@fay:hs", *d = "PHONE";
    assert_true(auth_seen_due(u, d, LONG_AGO_MS, T0_MS));
    auth_seen_retry_later(u, d, T0_MS);
    assert_false(auth_seen_due(u, d, AUTH_SEEN_UNKNOWN, T0_MS + AUTH_SEEN_RETRY_MS - 1));
    assert_true(auth_seen_due(u, d, AUTH_SEEN_UNKNOWN, T0_MS + AUTH_SEEN_RETRY_MS));
    assert_false(auth_seen_due(u, d, AUTH_SEEN_UNKNOWN, T0_MS + AUTH_SEEN_RETRY_MS + 1));
}

static void test_devices_are_told_apart_even_when_their_ids_run_together(void **state)
{
    (void)state;
    assert_true(auth_seen_due("@gus:hs", "AB", LONG_AGO_MS, T0_MS));
    /* "@gus:hsA" + "B" is another device: nothing is known about it. */
    assert_false(auth_seen_due("@gus:hsA", "B", AUTH_SEEN_UNKNOWN, T0_MS + AUTH_SEEN_REFRESH_MS));
    assert_true(auth_seen_due("@gus:hs", "OTHER", LONG_AGO_MS, T0_MS));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_an_old_stored_time_is_due_and_then_not_again_within_the_interval),
        cmocka_unit_test(test_a_cached_token_refreshes_once_the_interval_has_passed),
        cmocka_unit_test(test_a_device_nothing_is_known_about_is_left_alone),
        cmocka_unit_test(test_a_never_seen_device_is_due),
        cmocka_unit_test(test_a_recent_stored_time_counts_as_written),
        cmocka_unit_test(test_a_failed_write_is_due_again_after_the_retry_delay),
        cmocka_unit_test(test_devices_are_told_apart_even_when_their_ids_run_together),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
