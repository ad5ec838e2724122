/*
 * tests/unit/test_fed_resolve_timing.c - server discovery over time against real servers
 * on loopback (tests/unit/fed_resolve_fixture.h): a .well-known answer cached for its
 * max-age, a failed or unreachable one not fetched again within its window, a recent
 * delegation kept while the .well-known server fails, DNS answers asked again after their
 * TTL, concurrent lookups of one name sharing one discovery, unanswered DNS ending at the
 * lookup deadline, and the bounds on discoveries in flight and on their waiters. The steps of discovery are in
 * test_fed_resolve.c.
 */
#include "fed_resolve_fixture.h"
#include "core/federation/transport/fed_resolve_internal.h"

/* ---- the tests ------------------------------------------------------------------------------- */

static void test_well_known_is_cached_for_its_max_age_then_fetched_again(void **state)
{
    (void)state;
    dns_add_a("short.test", "127.0.0.1", 300);
    wk_set("short.test", 200, "Cache-Control: max-age=1\r\n",
           "{\"m.server\": \"s1.test:1000\"}");
    dns_add_a("s1.test", "127.0.0.1", 300);
    dns_add_a("s2.test", "127.0.0.1", 300);
    result a = resolve("short.test");
    assert_int_equal(a.rc, 0);
    assert_int_equal(a.t.port, 1000);
    result b = resolve("short.test");
    assert_int_equal(b.t.port, 1000);
    assert_int_equal(wk_count("short.test"), 1);
    wk_set("short.test", 200, "Cache-Control: max-age=1\r\n",
           "{\"m.server\": \"s2.test:2000\"}");
    sleep_ms(1200);
    result c = resolve("short.test");
    assert_int_equal(c.rc, 0);
    assert_int_equal(c.t.port, 2000);
    assert_string_equal(c.t.tls_name, "s2.test");
    assert_int_equal(wk_count("short.test"), 2);
}

static void test_failed_well_known_is_not_fetched_again_within_its_window(void **state)
{
    (void)state;
    dns_add_a("err5.test", "127.0.0.1", 300);
    wk_set("err5.test", 500, NULL, "oops");
    dns_add_a("err4.test", "127.0.0.1", 300);
    wk_set("err4.test", 200, NULL, "{\"m.server\": 12}");
    for (int i = 0; i < 3; i++) {
        result a = resolve("err5.test");
        assert_target(&a, "default", "err5.test", 8448, "err5.test", "127.0.0.1");
        result b = resolve("err4.test");
        assert_target(&b, "default", "err4.test", 8448, "err4.test", "127.0.0.1");
    }
    assert_int_equal(wk_count("err5.test"), 1);
    assert_int_equal(wk_count("err4.test"), 1);
}

static void test_recent_delegation_is_kept_while_the_well_known_server_fails(void **state)
{
    (void)state;
    dns_add_a("stale.test", "127.0.0.1", 300);
    dns_add_a("stale-b.test", "127.0.0.23", 300);
    wk_set("stale.test", 200, "Cache-Control: max-age=1\r\n",
           "{\"m.server\": \"stale-b.test:5000\"}");
    result a = resolve("stale.test");
    assert_target(&a, "well-known", "stale-b.test", 5000, "stale-b.test:5000", "127.0.0.23");
    wk_set("stale.test", 503, NULL, "down");
    sleep_ms(1200);
    result b = resolve("stale.test");
    assert_int_equal(wk_count("stale.test"), 2); /* asked again after max-age... */
    /* ...failed, and the last delegation still decides */
    assert_target(&b, "well-known", "stale-b.test", 5000, "stale-b.test:5000", "127.0.0.23");
}

static void test_unreachable_well_known_is_not_fetched_again_within_its_window(void **state)
{
    (void)state;
    dns_add_a("dead.test", "127.0.0.2", 300);
    for (int i = 0; i < 3; i++) {
        result a = resolve("dead.test");
        assert_target(&a, "default", "dead.test", 8448, "dead.test", "127.0.0.2");
    }
    assert_int_equal(atomic_load(&dead.accepts), 1);
}

static void test_dns_answer_is_asked_again_after_its_ttl(void **state)
{
    (void)state;
    dns_add_a("ttl.test", "127.0.0.20", 1);
    result a = resolve("ttl.test:8600");
    assert_target(&a, "explicit-port", "ttl.test", 8600, "ttl.test:8600", "127.0.0.20");
    result b = resolve("ttl.test:8600");
    assert_string_equal(b.t.addrs[0], "127.0.0.20");
    assert_int_equal(dns_count("ttl.test", T_A), 1);
    dns_set_a("ttl.test", "127.0.0.21");
    sleep_ms(1200);
    result c = resolve("ttl.test:8600");
    assert_target(&c, "explicit-port", "ttl.test", 8600, "ttl.test:8600", "127.0.0.21");
    assert_int_equal(dns_count("ttl.test", T_A), 2);
}

static void test_concurrent_lookups_of_one_name_share_one_discovery(void **state)
{
    (void)state;
    dns_add_a("slow.test", "127.0.0.1", 300);
    wk_set("slow.test", 200, NULL, "{\"m.server\": \"slow-b.test:4000\"}");
    wk_set_delay("slow.test", 300);
    dns_add_a("slow-b.test", "127.0.0.19", 300);
    /* The second joins the first's flight (core/runtime/flight.c). */
    rt_metric *shared = rt_metric_counter(g.metrics, "atrium_flights_shared_total",
                                          "flights=\"federation_discovery\"", NULL);
    int64_t shared_before = rt_metric_value(shared);
    result a, b;
    result_init(&a);
    result_init(&b);
    assert_int_equal(fed_resolve_lookup(g.r, "slow.test", on_resolved, &a), 0);
    assert_int_equal(fed_resolve_lookup(g.r, "slow.test", on_resolved, &b), 0);
    result_wait(&a);
    result_wait(&b);
    assert_target(&a, "well-known", "slow-b.test", 4000, "slow-b.test:4000", "127.0.0.19");
    assert_target(&b, "well-known", "slow-b.test", 4000, "slow-b.test:4000", "127.0.0.19");
    assert_int_equal(wk_count("slow.test"), 1);
    assert_int_equal(rt_metric_value(shared) - shared_before, 1);
}

static void test_unanswered_dns_ends_at_the_lookup_deadline(void **state)
{
    (void)state;
    pthread_mutex_lock(&dns.mu);
    snprintf(dns.blackhole, sizeof dns.blackhole, "blackhole.test");
    pthread_mutex_unlock(&dns.mu);
    int64_t t0 = rt_now_ms();
    result a = resolve("blackhole.test:1");
    int64_t took = rt_now_ms() - t0;
    assert_int_equal(a.rc, ATRIUM_E_TIMEOUT);
    assert_in_range(took, LOOKUP_TIMEOUT_MS - 100, LOOKUP_TIMEOUT_MS + 2000);
    /* other names are served meanwhile and after */
    dns_add_a("after.test", "127.0.0.22", 300);
    result b = resolve("after.test:1");
    assert_int_equal(b.rc, 0);
}

/* The table of running discoveries is keyed by names others choose: at most max_in_flight
 * names at once, shown by a gauge; one more fails at once (ATRIUM_E_LIMIT, counted), and
 * the table empties as they end. A resolver of its own, so the cap is small. */
static void test_discoveries_in_flight_are_bounded(void **state)
{
    (void)state;
    pthread_mutex_lock(&dns.mu);
    snprintf(dns.blackhole, sizeof dns.blackhole, "blackhole.test");
    pthread_mutex_unlock(&dns.mu);
    rt_metrics *m = rt_metrics_new();
    const char *servers[] = {g.dns_server};
    fed_resolve_settings rs = {.dns_servers = servers, .n_dns_servers = 1,
                               .lookup_timeout_ms = 500, .max_in_flight = 2};
    fed_resolver *r = fed_resolve_new(&rs, g.http, m);
    assert_non_null(r);
    assert_int_equal(fed_resolve_start(r), 0);
    rt_metric *running = rt_metric_gauge(m, "atrium_federation_discoveries_in_flight", "", NULL);
    rt_metric *refused =
        rt_metric_counter(m, "atrium_federation_discoveries_refused_total", "", NULL);
    result a, b, c;
    result_init(&a);
    result_init(&b);
    result_init(&c);
    assert_int_equal(fed_resolve_lookup(r, "a.blackhole.test:1", on_resolved, &a), 0);
    assert_int_equal(fed_resolve_lookup(r, "b.blackhole.test:1", on_resolved, &b), 0);
    assert_int_equal(fed_resolve_lookup(r, "c.blackhole.test:1", on_resolved, &c), 0);
    result_wait(&c);
    assert_int_equal(c.rc, ATRIUM_E_LIMIT);
    assert_int_equal(rt_metric_value(running), 2);
    assert_int_equal(rt_metric_value(refused), 1);
    result_wait(&a);
    result_wait(&b);
    assert_int_equal(a.rc, ATRIUM_E_TIMEOUT);
    assert_int_equal(b.rc, ATRIUM_E_TIMEOUT);
    assert_int_equal(rt_metric_value(running), 0);
    fed_resolve_stop(r);
    fed_resolve_free(r);
    rt_metrics_free(m);
}

/* Lookups of a name whose discovery runs wait for it, at most
 * FED_RESOLVE_WAITERS_PER_DISCOVERY per discovery allowed (the flights' waiter bound,
 * shown by its gauge); one more fails at once (ATRIUM_E_LIMIT, counted), and the waiters
 * all get the discovery's own end. */
static void test_waiters_for_discoveries_are_bounded(void **state)
{
    (void)state;
    pthread_mutex_lock(&dns.mu);
    snprintf(dns.blackhole, sizeof dns.blackhole, "blackhole.test");
    pthread_mutex_unlock(&dns.mu);
    rt_metrics *m = rt_metrics_new();
    const char *servers[] = {g.dns_server};
    fed_resolve_settings rs = {.dns_servers = servers, .n_dns_servers = 1,
                               .lookup_timeout_ms = 500, .max_in_flight = 1};
    fed_resolver *r = fed_resolve_new(&rs, g.http, m);
    assert_non_null(r);
    assert_int_equal(fed_resolve_start(r), 0);
    const char *labels = "flights=\"" FED_RESOLVE_FLIGHTS_NAME "\"";
    rt_metric *waiting = rt_metric_gauge(m, "atrium_flights_waiters", labels, NULL);
    rt_metric *refused = rt_metric_counter(m, "atrium_flights_refused_total", labels, NULL);
    enum { WAITERS = FED_RESOLVE_WAITERS_PER_DISCOVERY };
    static result res[WAITERS + 2]; /* the leader, its waiters, one too many */
    for (int i = 0; i < WAITERS + 2; i++) {
        result_init(&res[i]);
        assert_int_equal(fed_resolve_lookup(r, "w.blackhole.test:1", on_resolved, &res[i]), 0);
    }
    result_wait(&res[WAITERS + 1]);
    assert_int_equal(res[WAITERS + 1].rc, ATRIUM_E_LIMIT);
    assert_int_equal(rt_metric_value(waiting), WAITERS);
    assert_int_equal(rt_metric_value(refused), 1);
    for (int i = 0; i <= WAITERS; i++) {
        result_wait(&res[i]);
        assert_int_equal(res[i].rc, ATRIUM_E_TIMEOUT);
    }
    assert_int_equal(rt_metric_value(waiting), 0);
    fed_resolve_stop(r);
    fed_resolve_free(r);
    rt_metrics_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_discoveries_in_flight_are_bounded),
        cmocka_unit_test(test_waiters_for_discoveries_are_bounded),
        cmocka_unit_test(test_well_known_is_cached_for_its_max_age_then_fetched_again),
        cmocka_unit_test(test_failed_well_known_is_not_fetched_again_within_its_window),
        cmocka_unit_test(test_recent_delegation_is_kept_while_the_well_known_server_fails),
        cmocka_unit_test(test_unreachable_well_known_is_not_fetched_again_within_its_window),
        cmocka_unit_test(test_dns_answer_is_asked_again_after_its_ttl),
        cmocka_unit_test(test_concurrent_lookups_of_one_name_share_one_discovery),
        cmocka_unit_test(test_unanswered_dns_ends_at_the_lookup_deadline),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
