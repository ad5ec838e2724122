/*
 * tests/unit/test_fed_resolve_parse.c - the pure rules of server discovery: the server
 * name grammar, the cache period of a .well-known answer, the validation of its body, the
 * order of SRV records, the TTL of a DNS answer and the resolution of a redirect.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "core/federation/transport/fed_resolve.h"

static bool split(const char *name, char *host, int *port)
{
    return fed_server_name_split(name, host, FED_RESOLVE_NAME_BYTES, port);
}

static void test_server_name_split_accepts_the_spec_grammar(void **state)
{
    (void)state;
    char host[FED_RESOLVE_NAME_BYTES];
    int port;
    assert_true(split("matrix.org", host, &port));
    assert_string_equal(host, "matrix.org");
    assert_int_equal(port, 0);
    assert_true(split("matrix.org:8448", host, &port));
    assert_string_equal(host, "matrix.org");
    assert_int_equal(port, 8448);
    assert_true(split("1.2.3.4:1", host, &port));
    assert_string_equal(host, "1.2.3.4");
    assert_int_equal(port, 1);
    assert_true(split("[::1]:8448", host, &port));
    assert_string_equal(host, "::1");
    assert_int_equal(port, 8448);
    assert_true(split("[1234:5678::abcd]", host, &port));
    assert_string_equal(host, "1234:5678::abcd");
    assert_int_equal(port, 0);
    assert_true(split("localhost:65535", host, &port));
    assert_int_equal(port, 65535);
    assert_true(split("a-b.c-d.example", host, &port));
}

static void test_server_name_split_refuses_bad_ports_and_hosts(void **state)
{
    (void)state;
    char host[FED_RESOLVE_NAME_BYTES];
    int port;
    const char *bad[] = {
        "",         "example.org:",     "example.org:0",  "example.org:65536",
        "x:123456", "example.org:8a",   "example.org:-1", "example.org:+80",
        "a..b",     ".example.org",     "example.org.",   "exa_mple.org",
        "ex ample", "[::1",             "[::1]x",         "[]:80",
        "[not-v6]", "::1",              "[::1]:0",        "host:80:81",
        "ä.org",    "example.org/path", "@example.org",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (split(bad[i], host, &port))
            fail_msg("\"%s\" was accepted as a server name", bad[i]);
    }
    char long_label[80];
    memset(long_label, 'a', 64);
    strcpy(long_label + 64, ".org");
    assert_false(split(long_label, host, &port));
}

static void test_ip_literal_is_told_from_a_hostname(void **state)
{
    (void)state;
    assert_true(fed_host_is_ip_literal("127.0.0.1"));
    assert_true(fed_host_is_ip_literal("::1"));
    assert_false(fed_host_is_ip_literal("1.2.3.4.example"));
    assert_false(fed_host_is_ip_literal("example.org"));
}

static void test_cache_period_follows_cache_control_then_expires(void **state)
{
    (void)state;
    const int64_t now = 784111777000LL; /* Sun, 06 Nov 1994 08:49:37 GMT */
    assert_int_equal(fed_resolve_cache_period_ms("max-age=3600", NULL, now), 3600000);
    assert_int_equal(fed_resolve_cache_period_ms("public, MAX-AGE=\"60\"", NULL, now), 60000);
    assert_int_equal(fed_resolve_cache_period_ms("max-age=0", NULL, now), 0);
    assert_int_equal(fed_resolve_cache_period_ms("no-store", NULL, now), 0);
    assert_int_equal(fed_resolve_cache_period_ms("max-age=600, no-cache", NULL, now), 0);
    /* max-age wins over Expires */
    assert_int_equal(
        fed_resolve_cache_period_ms("max-age=10", "Sun, 06 Nov 1994 09:49:37 GMT", now), 10000);
    assert_int_equal(fed_resolve_cache_period_ms(NULL, "Sun, 06 Nov 1994 09:49:37 GMT", now),
                     3600000);
    /* a malformed max-age is ignored, so Expires decides */
    assert_int_equal(
        fed_resolve_cache_period_ms("max-age=soon", "Sun, 06 Nov 1994 08:50:37 GMT", now),
        60000);
    /* a past or invalid Expires: expired already */
    assert_int_equal(fed_resolve_cache_period_ms(NULL, "Sun, 06 Nov 1994 07:00:00 GMT", now), 0);
    assert_int_equal(fed_resolve_cache_period_ms(NULL, "0", now), 0);
    /* nothing said: the caller's default */
    assert_int_equal(fed_resolve_cache_period_ms(NULL, NULL, now), -1);
    assert_int_equal(fed_resolve_cache_period_ms("public", NULL, now), -1);
    assert_int_equal(fed_resolve_cache_period_ms("max-age=-5", NULL, now), -1);
}

static void test_well_known_body_needs_a_valid_m_server(void **state)
{
    (void)state;
    char out[FED_RESOLVE_NAME_BYTES], err[256];
    const char *ok = "{\"m.server\": \"matrix.example.org:443\", \"other\": 1}";
    assert_int_equal(fed_well_known_parse(ok, strlen(ok), out, sizeof out, err, sizeof err), 0);
    assert_string_equal(out, "matrix.example.org:443");
    const char *v6 = "{\"m.server\": \"[2001:db8::1]\"}";
    assert_int_equal(fed_well_known_parse(v6, strlen(v6), out, sizeof out, err, sizeof err), 0);
    assert_string_equal(out, "[2001:db8::1]");
    const char *bad[] = {
        "",  "not json", "[\"m.server\"]", "{}", "{\"m.server\": 42}",
        "{\"m.server\": \"\"}", "{\"m.server\": \"bad host\"}",
        "{\"m.server\": \"example.org:99999\"}", "{\"m.server\": \"https://example.org\"}",
        "{\"m.server\": \"a.org\", \"m.server\": \"b.org\"}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        if (fed_well_known_parse(bad[i], strlen(bad[i]), out, sizeof out, err, sizeof err) == 0)
            fail_msg("accepted %s", bad[i]);
        assert_true(err[0] != '\0');
    }
}

static uint32_t seq_rnd(void *arg)
{
    uint32_t **p = arg;
    return *(*p)++;
}

static fed_srv_record rec(const char *t, int prio, int weight)
{
    fed_srv_record r;
    memset(&r, 0, sizeof r);
    snprintf(r.target, sizeof r.target, "%s", t);
    r.priority = prio;
    r.weight = weight;
    r.port = 8448;
    return r;
}

static void test_srv_order_is_priority_then_weighted(void **state)
{
    (void)state;
    fed_srv_record r[4] = {rec("c", 20, 0), rec("a1", 10, 10), rec("a2", 10, 90),
                           rec("b", 15, 5)};
    /* random 50 of [0,100]: a1's running sum 10 < 50, a2's 100 >= 50: a2 first */
    uint32_t draws[] = {50, 0, 0, 0}, *p = draws;
    fed_srv_order(r, 4, seq_rnd, &p);
    assert_string_equal(r[0].target, "a2");
    assert_string_equal(r[1].target, "a1");
    assert_string_equal(r[2].target, "b");
    assert_string_equal(r[3].target, "c");
    /* random 5: a1 (running sum 10 >= 5) first */
    fed_srv_record s[2] = {rec("a1", 10, 10), rec("a2", 10, 90)};
    uint32_t draws2[] = {5, 0}, *p2 = draws2;
    fed_srv_order(s, 2, seq_rnd, &p2);
    assert_string_equal(s[0].target, "a1");
    /* a zero-weight record goes first only when the draw is 0 */
    fed_srv_record z[2] = {rec("heavy", 1, 100), rec("zero", 1, 0)};
    uint32_t d3[] = {1}, *p3 = d3;
    fed_srv_order(z, 2, seq_rnd, &p3);
    assert_string_equal(z[0].target, "heavy");
    fed_srv_record z2[2] = {rec("heavy", 1, 100), rec("zero", 1, 0)};
    uint32_t d4[] = {0}, *p4 = d4;
    fed_srv_order(z2, 2, seq_rnd, &p4);
    assert_string_equal(z2[0].target, "zero");
}

static void test_srv_dot_target_alone_means_no_service(void **state)
{
    (void)state;
    fed_srv_record dot = rec(".", 0, 0), empty = rec("", 0, 0), host = rec("h.example", 0, 0);
    assert_true(fed_srv_says_no_service(&dot, 1));
    assert_true(fed_srv_says_no_service(&empty, 1));
    assert_false(fed_srv_says_no_service(&host, 1));
    fed_srv_record two[2] = {dot, host};
    assert_false(fed_srv_says_no_service(two, 2));
}

/* A hand-encoded answer: question _matrix-fed._tcp.x SRV, answers SRV ttl 300 and 60 and
 * an A record with ttl 5 (not counted for SRV). */
static size_t put_name(unsigned char *p, const char *const *labels)
{
    size_t n = 0;
    for (; *labels; labels++) {
        size_t l = strlen(*labels);
        p[n++] = (unsigned char)l;
        memcpy(p + n, *labels, l);
        n += l;
    }
    p[n++] = 0;
    return n;
}

static size_t put_rr(unsigned char *p, int type, uint32_t ttl, const unsigned char *rd,
                     size_t rdlen)
{
    size_t n = 0;
    p[n++] = 0xC0; /* pointer to the question name */
    p[n++] = 12;
    p[n++] = 0;
    p[n++] = (unsigned char)type;
    p[n++] = 0;
    p[n++] = 1;
    p[n++] = (unsigned char)(ttl >> 24);
    p[n++] = (unsigned char)(ttl >> 16);
    p[n++] = (unsigned char)(ttl >> 8);
    p[n++] = (unsigned char)ttl;
    p[n++] = (unsigned char)(rdlen >> 8);
    p[n++] = (unsigned char)rdlen;
    memcpy(p + n, rd, rdlen);
    return n + rdlen;
}

static void test_dns_min_ttl_reads_the_answer_records(void **state)
{
    (void)state;
    unsigned char m[512] = {0x12, 0x34, 0x81, 0x80, 0, 1, 0, 3, 0, 0, 0, 0};
    size_t n = 12;
    const char *q[] = {"_matrix-fed", "_tcp", "x", NULL};
    n += put_name(m + n, q);
    m[n++] = 0;
    m[n++] = 33;
    m[n++] = 0;
    m[n++] = 1;
    unsigned char srv_rd[] = {0, 10, 0, 5, 0x20, 0xF8, 1, 'h', 0};
    n += put_rr(m + n, 33, 300, srv_rd, sizeof srv_rd);
    n += put_rr(m + n, 33, 60, srv_rd, sizeof srv_rd);
    unsigned char a_rd[] = {127, 0, 0, 1};
    n += put_rr(m + n, 1, 5, a_rd, sizeof a_rd);
    assert_int_equal(fed_dns_min_ttl(m, n, 33), 60);
    assert_int_equal(fed_dns_min_ttl(m, n, 1), 5);
    assert_int_equal(fed_dns_min_ttl(m, n, 28), -1);
    /* truncated: malformed */
    assert_int_equal(fed_dns_min_ttl(m, n - 3, 1), -1);
    assert_int_equal(fed_dns_min_ttl(m, 8, 33), -1);
}

static void test_redirect_location_resolves_absolute_and_path(void **state)
{
    (void)state;
    fed_url base = {.scheme = "https", .host = "example.org", .port = 443,
                    .path = "/.well-known/matrix/server"};
    fed_url out;
    assert_int_equal(fed_url_resolve(&base, "/elsewhere?x=1", &out), 0);
    assert_string_equal(out.host, "example.org");
    assert_int_equal(out.port, 443);
    assert_string_equal(out.path, "/elsewhere?x=1");
    assert_int_equal(fed_url_resolve(&base, "https://other.example:8443/wk#frag", &out), 0);
    assert_string_equal(out.scheme, "https");
    assert_string_equal(out.host, "other.example");
    assert_int_equal(out.port, 8443);
    assert_string_equal(out.path, "/wk");
    assert_int_equal(fed_url_resolve(&base, "http://[::1]", &out), 0);
    assert_string_equal(out.scheme, "http");
    assert_string_equal(out.host, "::1");
    assert_int_equal(out.port, 80);
    assert_string_equal(out.path, "/");
    assert_true(fed_url_resolve(&base, "ftp://example.org/", &out) < 0);
    assert_true(fed_url_resolve(&base, "relative/path", &out) < 0);
    assert_true(fed_url_resolve(&base, "https://user@example.org/", &out) < 0);
    assert_true(fed_url_resolve(&base, "//example.org/x", &out) < 0);
    assert_true(fed_url_resolve(&base, "https://bad host/", &out) < 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_server_name_split_accepts_the_spec_grammar),
        cmocka_unit_test(test_server_name_split_refuses_bad_ports_and_hosts),
        cmocka_unit_test(test_ip_literal_is_told_from_a_hostname),
        cmocka_unit_test(test_cache_period_follows_cache_control_then_expires),
        cmocka_unit_test(test_well_known_body_needs_a_valid_m_server),
        cmocka_unit_test(test_srv_order_is_priority_then_weighted),
        cmocka_unit_test(test_srv_dot_target_alone_means_no_service),
        cmocka_unit_test(test_dns_min_ttl_reads_the_answer_records),
        cmocka_unit_test(test_redirect_location_resolves_absolute_and_path),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
