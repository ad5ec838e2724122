/*
 * tests/unit/test_fed_resolve.c - the steps of server discovery against real servers on
 * loopback (tests/unit/fed_resolve_fixture.h: a DNS server, a .well-known server): IP
 * literals used as they are, invalid names refused, an explicit port, .well-known
 * delegation (to a port, an IP literal, a name then looked up by SRV or defaulting to
 * 8448), SRV records and their targets, the legacy SRV name, the 8448 default, the "."
 * target, unknown names, and .well-known redirects and their loop bound. What discovery
 * remembers and for how long, lookups at once and the deadline are in
 * test_fed_resolve_timing.c.
 */
#include "fed_resolve_fixture.h"

/* ---- the tests ------------------------------------------------------------------------------- */

static void test_ip_literal_is_used_as_is_without_any_lookup(void **state)
{
    (void)state;
    int dns_before = dns_total();
    result a = resolve("127.0.0.5:1234");
    assert_target(&a, "ip-literal", "127.0.0.5", 1234, "127.0.0.5:1234", "127.0.0.5");
    result b = resolve("[::1]");
    assert_target(&b, "ip-literal", "::1", 8448, "[::1]", "::1");
    assert_int_equal(dns_total(), dns_before);
}

static void test_invalid_server_name_is_refused(void **state)
{
    (void)state;
    result a = resolve("bad..name");
    assert_int_equal(a.rc, ATRIUM_E_INVAL);
    result b = resolve("host.test:99999");
    assert_int_equal(b.rc, ATRIUM_E_INVAL);
}

static void test_explicit_port_resolves_the_hostname_and_skips_well_known(void **state)
{
    (void)state;
    dns_add_a("ep.test", "127.0.0.9", 300);
    wk_set("ep.test", 200, NULL, "{\"m.server\": \"wrong.test:1\"}");
    result a = resolve("ep.test:8500");
    assert_target(&a, "explicit-port", "ep.test", 8500, "ep.test:8500", "127.0.0.9");
    assert_int_equal(wk_count("ep.test"), 0);
    assert_int_equal(dns_count("ep.test", T_A), 1);
}

static void test_well_known_with_delegated_port(void **state)
{
    (void)state;
    dns_add_a("dp.test", "127.0.0.1", 300);
    wk_set("dp.test", 200, NULL, "{\"m.server\": \"backend-dp.test:9000\"}");
    dns_add_a("backend-dp.test", "127.0.0.10", 300);
    result a = resolve("dp.test");
    assert_target(&a, "well-known", "backend-dp.test", 9000, "backend-dp.test:9000",
                  "127.0.0.10");
    assert_int_equal(wk_count("dp.test"), 1);
    /* no SRV look-up: the delegated port decides */
    assert_int_equal(dns_count("_matrix-fed._tcp.backend-dp.test", T_SRV), 0);
}

static void test_well_known_with_delegated_ip_literal(void **state)
{
    (void)state;
    dns_add_a("dip.test", "127.0.0.1", 300);
    wk_set("dip.test", 200, NULL, "{\"m.server\": \"127.0.0.14\"}");
    result a = resolve("dip.test");
    assert_target(&a, "well-known", "127.0.0.14", 8448, "127.0.0.14", "127.0.0.14");
}

static void test_delegated_name_goes_through_srv_without_another_well_known(void **state)
{
    (void)state;
    dns_add_a("dn.test", "127.0.0.1", 300);
    wk_set("dn.test", 200, NULL, "{\"m.server\": \"deleg-dn.test\"}");
    /* the delegated name has a .well-known of its own that must never be read */
    dns_add_a("deleg-dn.test", "127.0.0.1", 300);
    wk_set("deleg-dn.test", 200, NULL, "{\"m.server\": \"wrong.test:1\"}");
    dns_add_srv("_matrix-fed._tcp.deleg-dn.test", 10, 5, 7000, "tgt-dn.test", 300);
    dns_add_a("tgt-dn.test", "127.0.0.11", 300);
    result a = resolve("dn.test");
    assert_target(&a, "well-known+srv", "deleg-dn.test", 7000, "deleg-dn.test", "127.0.0.11");
    assert_int_equal(wk_count("dn.test"), 1);
    assert_int_equal(wk_count("deleg-dn.test"), 0);
}

static void test_delegated_name_without_srv_falls_back_to_8448(void **state)
{
    (void)state;
    dns_add_a("dn2.test", "127.0.0.1", 300);
    wk_set("dn2.test", 200, NULL, "{\"m.server\": \"deleg-dn2.test\"}");
    dns_add_a("deleg-dn2.test", "127.0.0.15", 300);
    result a = resolve("dn2.test");
    assert_target(&a, "well-known+default", "deleg-dn2.test", 8448, "deleg-dn2.test",
                  "127.0.0.15");
    assert_int_equal(dns_count("_matrix-fed._tcp.deleg-dn2.test", T_SRV), 1);
    assert_int_equal(dns_count("_matrix._tcp.deleg-dn2.test", T_SRV), 1);
}

static void test_srv_record_gives_target_and_port_host_stays_the_name(void **state)
{
    (void)state;
    dns_add_a("srv.test", "127.0.0.1", 300);
    wk_set("srv.test", 404, NULL, "{}");
    dns_add_srv("_matrix-fed._tcp.srv.test", 20, 0, 7002, "tgt-b.test", 300);
    dns_add_srv("_matrix-fed._tcp.srv.test", 10, 0, 7001, "tgt-a.test", 300);
    dns_add_a("tgt-a.test", "127.0.0.12", 300);
    dns_add_a("tgt-b.test", "127.0.0.16", 300);
    result a = resolve("srv.test");
    assert_target(&a, "srv", "srv.test", 7001, "srv.test", "127.0.0.12");
    assert_int_equal(wk_count("srv.test"), 1);
}

static void test_srv_target_without_address_gives_way_to_the_next(void **state)
{
    (void)state;
    dns_add_a("srv2.test", "127.0.0.1", 300);
    dns_add_srv("_matrix-fed._tcp.srv2.test", 10, 0, 7001, "gone-srv2.test", 300);
    dns_add_srv("_matrix-fed._tcp.srv2.test", 20, 0, 7004, "tgt-srv2.test", 300);
    dns_add_a("tgt-srv2.test", "127.0.0.17", 300);
    result a = resolve("srv2.test");
    assert_target(&a, "srv", "srv2.test", 7004, "srv2.test", "127.0.0.17");
}

static void test_legacy_srv_is_asked_after_matrix_fed(void **state)
{
    (void)state;
    dns_add_a("legacy.test", "127.0.0.1", 300);
    dns_add_srv("_matrix._tcp.legacy.test", 10, 0, 7003, "tgt-l.test", 300);
    dns_add_a("tgt-l.test", "127.0.0.18", 300);
    result a = resolve("legacy.test");
    assert_target(&a, "srv-legacy", "legacy.test", 7003, "legacy.test", "127.0.0.18");
    assert_int_equal(dns_count("_matrix-fed._tcp.legacy.test", T_SRV), 1);
    assert_int_equal(dns_count("_matrix._tcp.legacy.test", T_SRV), 1);
}

static void test_no_well_known_no_srv_falls_back_to_8448(void **state)
{
    (void)state;
    dns_add_a("plain.test", "127.0.0.1", 300);
    result a = resolve("plain.test");
    assert_target(&a, "default", "plain.test", 8448, "plain.test", "127.0.0.1");
    char *text = rt_metrics_render(g.metrics, NULL);
    assert_non_null(strstr(text, "atrium_federation_discovery_total{step=\"default\"}"));
    free(text);
}

static void test_srv_dot_target_means_no_service(void **state)
{
    (void)state;
    dns_add_a("nosvc.test", "127.0.0.1", 300);
    dns_add_srv("_matrix-fed._tcp.nosvc.test", 0, 0, 0, ".", 300);
    result a = resolve("nosvc.test");
    assert_int_equal(a.rc, ATRIUM_E_NOTFOUND);
}

static void test_unknown_name_is_not_found(void **state)
{
    (void)state;
    result a = resolve("nowhere.test");
    assert_int_equal(a.rc, ATRIUM_E_NOTFOUND);
}

static void test_well_known_redirect_is_followed_and_resolved_again(void **state)
{
    (void)state;
    char loc[256];
    snprintf(loc, sizeof loc,
             "Location: http://redir-b.test:%d/.well-known/matrix/server\r\n", web.port);
    dns_add_a("redir.test", "127.0.0.1", 300);
    wk_set("redir.test", 302, loc, "");
    dns_add_a("redir-b.test", "127.0.0.1", 300);
    wk_set("redir-b.test", 200, NULL, "{\"m.server\": \"final-r.test:9100\"}");
    dns_add_a("final-r.test", "127.0.0.13", 300);
    result a = resolve("redir.test");
    assert_target(&a, "well-known", "final-r.test", 9100, "final-r.test:9100", "127.0.0.13");
    assert_int_equal(wk_count("redir.test"), 1);
    assert_int_equal(wk_count("redir-b.test"), 1);
    assert_int_equal(dns_count("redir-b.test", T_A), 1);
}

static void test_redirect_loop_stops_after_five_hops(void **state)
{
    (void)state;
    dns_add_a("loop.test", "127.0.0.1", 300);
    wk_set("loop.test", 301, "Location: /.well-known/matrix/server\r\n", "");
    result a = resolve("loop.test");
    /* the well-known counts as invalid: discovery goes on without it */
    assert_target(&a, "default", "loop.test", 8448, "loop.test", "127.0.0.1");
    assert_int_equal(wk_count("loop.test"), 6); /* the first fetch and five redirects */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ip_literal_is_used_as_is_without_any_lookup),
        cmocka_unit_test(test_invalid_server_name_is_refused),
        cmocka_unit_test(test_explicit_port_resolves_the_hostname_and_skips_well_known),
        cmocka_unit_test(test_well_known_with_delegated_port),
        cmocka_unit_test(test_well_known_with_delegated_ip_literal),
        cmocka_unit_test(test_delegated_name_goes_through_srv_without_another_well_known),
        cmocka_unit_test(test_delegated_name_without_srv_falls_back_to_8448),
        cmocka_unit_test(test_srv_record_gives_target_and_port_host_stays_the_name),
        cmocka_unit_test(test_srv_target_without_address_gives_way_to_the_next),
        cmocka_unit_test(test_legacy_srv_is_asked_after_matrix_fed),
        cmocka_unit_test(test_no_well_known_no_srv_falls_back_to_8448),
        cmocka_unit_test(test_srv_dot_target_means_no_service),
        cmocka_unit_test(test_unknown_name_is_not_found),
        cmocka_unit_test(test_well_known_redirect_is_followed_and_resolved_again),
        cmocka_unit_test(test_redirect_loop_stops_after_five_hops),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
