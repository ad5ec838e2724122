/*
 * tests/unit/test_metrics.c - the registry renders exact Prometheus text: one HELP/TYPE per
 * name whatever the label sets, cumulative histogram buckets, _sum and _count; registration
 * is idempotent per name + labels; updates are exact under concurrency.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "core/runtime/runtime.h"

static void assert_renders(rt_metrics *reg, const char *expected)
{
    size_t len = 0;
    char *text = rt_metrics_render(reg, &len);
    assert_non_null(text);
    assert_string_equal(text, expected);
    assert_int_equal(len, strlen(expected));
    free(text);
}

static void test_metrics_render_a_counter_exactly(void **state)
{
    (void)state;
    rt_metrics *reg = rt_metrics_new();
    rt_metric *c = rt_metric_counter(reg, "atrium_requests_total", NULL, "Requests served.");
    rt_metric_add(c, 2);
    rt_metric_add(c, 1);
    assert_int_equal(rt_metric_value(c), 3);
    assert_renders(reg, "# HELP atrium_requests_total Requests served.\n"
                        "# TYPE atrium_requests_total counter\n"
                        "atrium_requests_total 3\n");
    rt_metrics_free(reg);
}

static void test_metrics_render_a_gauge_with_labels_under_one_help_and_type(void **state)
{
    (void)state;
    rt_metrics *reg = rt_metrics_new();
    rt_metric *media = rt_metric_gauge(reg, "atrium_pool_busy", "pool=\"media\"", "Busy.");
    rt_metric *sync = rt_metric_gauge(reg, "atrium_pool_busy", "pool=\"sync\"", "Busy.");
    rt_metric_set(media, 5);
    rt_metric_add(media, -3);
    rt_metric_set(sync, -1);
    assert_renders(reg, "# HELP atrium_pool_busy Busy.\n"
                        "# TYPE atrium_pool_busy gauge\n"
                        "atrium_pool_busy{pool=\"media\"} 2\n"
                        "atrium_pool_busy{pool=\"sync\"} -1\n");
    rt_metrics_free(reg);
}

static void test_metrics_render_a_histogram_with_cumulative_buckets_sum_and_count(void **state)
{
    (void)state;
    rt_metrics *reg = rt_metrics_new();
    const double bounds[] = {5, 10, 50.5};
    rt_metric *h = rt_metric_histogram(reg, "atrium_fetch_ms", "peer=\"a\"", "Fetch time.",
                                       bounds, 3);
    rt_metric_observe(h, 1);
    rt_metric_observe(h, 5); /* on a bound: counted in that bucket (le) */
    rt_metric_observe(h, 7.5);
    rt_metric_observe(h, 100);
    assert_int_equal(rt_metric_value(h), 4);
    assert_renders(reg, "# HELP atrium_fetch_ms Fetch time.\n"
                        "# TYPE atrium_fetch_ms histogram\n"
                        "atrium_fetch_ms_bucket{peer=\"a\",le=\"5\"} 2\n"
                        "atrium_fetch_ms_bucket{peer=\"a\",le=\"10\"} 3\n"
                        "atrium_fetch_ms_bucket{peer=\"a\",le=\"50.5\"} 3\n"
                        "atrium_fetch_ms_bucket{peer=\"a\",le=\"+Inf\"} 4\n"
                        "atrium_fetch_ms_sum{peer=\"a\"} 113.5\n"
                        "atrium_fetch_ms_count{peer=\"a\"} 4\n");
    rt_metrics_free(reg);
}

static void test_metrics_render_an_unlabelled_histogram(void **state)
{
    (void)state;
    rt_metrics *reg = rt_metrics_new();
    const double bounds[] = {0.25, 1000000};
    rt_metric *h = rt_metric_histogram(reg, "atrium_wait_ms", "", "Wait.", bounds, 2);
    rt_metric_observe(h, 0.125);
    assert_renders(reg, "# HELP atrium_wait_ms Wait.\n"
                        "# TYPE atrium_wait_ms histogram\n"
                        "atrium_wait_ms_bucket{le=\"0.25\"} 1\n"
                        "atrium_wait_ms_bucket{le=\"1e+06\"} 1\n"
                        "atrium_wait_ms_bucket{le=\"+Inf\"} 1\n"
                        "atrium_wait_ms_sum 0.125\n"
                        "atrium_wait_ms_count 1\n");
    rt_metrics_free(reg);
}

static void test_metrics_group_label_sets_registered_out_of_order_under_their_name(void **state)
{
    (void)state;
    rt_metrics *reg = rt_metrics_new();
    rt_metric_add(rt_metric_counter(reg, "a_total", "x=\"1\"", "A."), 1);
    rt_metric_set(rt_metric_gauge(reg, "b", NULL, "B."), 7);
    rt_metric_add(rt_metric_counter(reg, "a_total", "x=\"2\"", "A."), 2);
    assert_renders(reg, "# HELP a_total A.\n"
                        "# TYPE a_total counter\n"
                        "a_total{x=\"1\"} 1\n"
                        "a_total{x=\"2\"} 2\n"
                        "# HELP b B.\n"
                        "# TYPE b gauge\n"
                        "b 7\n");
    rt_metrics_free(reg);
}

static void test_metrics_registering_the_same_name_and_labels_returns_the_same_metric(void **state)
{
    (void)state;
    rt_metrics *reg = rt_metrics_new();
    rt_metric *a = rt_metric_counter(reg, "x_total", "k=\"v\"", "X.");
    assert_non_null(a);
    assert_ptr_equal(rt_metric_counter(reg, "x_total", "k=\"v\"", "X."), a);
    assert_ptr_not_equal(rt_metric_counter(reg, "x_total", "k=\"w\"", "X."), a);
    /* One name, one type. */
    assert_null(rt_metric_gauge(reg, "x_total", "k=\"v\"", "X."));
    assert_null(rt_metric_gauge(reg, "x_total", "k=\"other\"", "X."));
    const double b1[] = {1, 2}, b2[] = {1, 3};
    rt_metric *h = rt_metric_histogram(reg, "h_ms", NULL, "H.", b1, 2);
    assert_ptr_equal(rt_metric_histogram(reg, "h_ms", NULL, "H.", b1, 2), h);
    assert_null(rt_metric_histogram(reg, "h_ms", NULL, "H.", b2, 2)); /* other buckets */
    rt_metrics_free(reg);
}

static void test_metrics_null_registry_means_no_metrics_and_updates_are_no_ops(void **state)
{
    (void)state;
    rt_metric *c = rt_metric_counter(NULL, "x_total", NULL, "X.");
    assert_null(c);
    rt_metric_add(c, 1);
    rt_metric_set(c, 1);
    rt_metric_observe(c, 1.0);
    assert_int_equal(rt_metric_value(c), 0);
}

static void test_metrics_help_text_escapes_backslash_and_newline(void **state)
{
    (void)state;
    rt_metrics *reg = rt_metrics_new();
    rt_metric_counter(reg, "e_total", NULL, "two\nlines \\ here");
    assert_renders(reg, "# HELP e_total two\\nlines \\\\ here\n"
                        "# TYPE e_total counter\n"
                        "e_total 0\n");
    rt_metrics_free(reg);
}

static void test_metric_label_escapes_the_value_and_refuses_what_does_not_fit(void **state)
{
    (void)state;
    char buf[64];
    int n = rt_metric_label(buf, sizeof(buf), "pool", "a\"b\\c\nd");
    assert_string_equal(buf, "pool=\"a\\\"b\\\\c\\nd\"");
    assert_int_equal(n, (int)strlen(buf));
    char tiny[8];
    assert_int_equal(rt_metric_label(tiny, sizeof(tiny), "pool", "media"), ATRIUM_E_LIMIT);
    assert_string_equal(tiny, "");
    char exact[13]; /* pool="media" + NUL */
    assert_int_equal(rt_metric_label(exact, sizeof(exact), "pool", "media"), 12);
}

static void test_metrics_empty_registry_renders_nothing(void **state)
{
    (void)state;
    rt_metrics *reg = rt_metrics_new();
    assert_renders(reg, "");
    rt_metrics_free(reg);
}

enum { THREADS = 4, UPDATES = 10000 };
static rt_metric *shared_counter, *shared_hist;

static void *update_loop(void *arg)
{
    (void)arg;
    for (int i = 0; i < UPDATES; i++) {
        rt_metric_add(shared_counter, 1);
        rt_metric_observe(shared_hist, 0.5);
    }
    return NULL;
}

static void test_metrics_updates_are_exact_under_concurrent_threads(void **state)
{
    (void)state;
    rt_metrics *reg = rt_metrics_new();
    const double bounds[] = {1};
    shared_counter = rt_metric_counter(reg, "c_total", NULL, "C.");
    shared_hist = rt_metric_histogram(reg, "h_ms", NULL, "H.", bounds, 1);
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, update_loop, NULL);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(rt_metric_value(shared_counter), THREADS * UPDATES);
    assert_int_equal(rt_metric_value(shared_hist), THREADS * UPDATES);
    char *text = rt_metrics_render(reg, NULL);
    assert_non_null(strstr(text, "\nh_ms_sum 20000\n")); /* 0.5 is exact in binary */
    free(text);
    rt_metrics_free(reg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_metrics_render_a_counter_exactly),
        cmocka_unit_test(test_metrics_render_a_gauge_with_labels_under_one_help_and_type),
        cmocka_unit_test(test_metrics_render_a_histogram_with_cumulative_buckets_sum_and_count),
        cmocka_unit_test(test_metrics_render_an_unlabelled_histogram),
        cmocka_unit_test(test_metrics_group_label_sets_registered_out_of_order_under_their_name),
        cmocka_unit_test(test_metrics_registering_the_same_name_and_labels_returns_the_same_metric),
        cmocka_unit_test(test_metrics_null_registry_means_no_metrics_and_updates_are_no_ops),
        cmocka_unit_test(test_metrics_help_text_escapes_backslash_and_newline),
        cmocka_unit_test(test_metric_label_escapes_the_value_and_refuses_what_does_not_fit),
        cmocka_unit_test(test_metrics_empty_registry_renders_nothing),
        cmocka_unit_test(test_metrics_updates_are_exact_under_concurrent_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
