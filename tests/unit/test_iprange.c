/*
 * tests/unit/test_iprange.c - the address rule of the outbound client: CIDR parsing
 * (and its refusals), IPv4 and IPv6 range boundaries, ::ffff: mapped addresses judged as
 * the IPv4 address they map, the default blacklist, and the whitelist exception.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>

#include "core/runtime/iprange.h"

static rt_iprange_list *parse(const char *const *cidrs, size_t n)
{
    char err[256] = "";
    rt_iprange_list *l = rt_iprange_parse(cidrs, n, err, sizeof(err));
    if (!l) fail_msg("parse failed: %s", err);
    return l;
}

static rt_iprange_list *parse_default(void)
{
    size_t n = 0;
    while (RT_IPRANGE_DEFAULT_BLACKLIST[n]) n++;
    return parse(RT_IPRANGE_DEFAULT_BLACKLIST, n);
}

static void refused(const char *entry, const char *err_part)
{
    const char *list[] = {"10.0.0.0/8", entry};
    char err[256] = "";
    rt_iprange_list *l = rt_iprange_parse(list, 2, err, sizeof(err));
    if (l) fail_msg("\"%s\" was accepted", entry);
    if (!strstr(err, err_part)) fail_msg("error for \"%s\" is \"%s\"", entry, err);
}

static void test_malformed_entries_are_refused_naming_the_entry(void **state)
{
    (void)state;
    refused("", "is not an IP range");
    refused("10.0.0", "\"10.0.0\" is not an IP range");
    refused("256.0.0.0/8", "256.0.0.0/8");
    refused("example.org", "example.org");
    refused("10.0.0.0/33", "at most /32");
    refused("::/129", "at most /128");
    refused("10.0.0.0/", "prefix length");
    refused("10.0.0.0/-1", "prefix length");
    refused("10.0.0.0/+8", "prefix length");
    refused("10.0.0.0/8 ", "prefix length");
    refused(" 10.0.0.0/8", "is not an IP range");
    refused("10.0.0.0/8/8", "prefix length");
    refused("fe80::1%eth0/64", "is not an IP range");
    refused("[::1]/128", "is not an IP range");
}

static void test_an_empty_list_contains_nothing(void **state)
{
    (void)state;
    rt_iprange_list *l = parse(NULL, 0);
    assert_false(rt_iprange_contains_str(l, "127.0.0.1"));
    assert_false(rt_iprange_contains_str(NULL, "127.0.0.1"));
    rt_iprange_free(l);
}

static void test_ipv4_boundaries(void **state)
{
    (void)state;
    const char *list[] = {"172.16.0.0/12", "192.0.2.7", "10.1.2.3/8"};
    rt_iprange_list *l = parse(list, 3);
    assert_false(rt_iprange_contains_str(l, "172.15.255.255"));
    assert_true(rt_iprange_contains_str(l, "172.16.0.0"));
    assert_true(rt_iprange_contains_str(l, "172.31.255.255"));
    assert_false(rt_iprange_contains_str(l, "172.32.0.0"));
    /* A bare address is a /32. */
    assert_true(rt_iprange_contains_str(l, "192.0.2.7"));
    assert_false(rt_iprange_contains_str(l, "192.0.2.6"));
    assert_false(rt_iprange_contains_str(l, "192.0.2.8"));
    /* Host bits past the prefix are ignored: 10.1.2.3/8 is 10.0.0.0/8. */
    assert_true(rt_iprange_contains_str(l, "10.0.0.0"));
    assert_true(rt_iprange_contains_str(l, "10.255.255.255"));
    assert_false(rt_iprange_contains_str(l, "11.0.0.0"));
    /* Not an address at all. */
    assert_false(rt_iprange_contains_str(l, "ten"));
    assert_false(rt_iprange_contains_str(l, NULL));
    rt_iprange_free(l);
}

static void test_prefix_zero_and_full_length(void **state)
{
    (void)state;
    const char *all4[] = {"0.0.0.0/0"};
    rt_iprange_list *l = parse(all4, 1);
    assert_true(rt_iprange_contains_str(l, "0.0.0.0"));
    assert_true(rt_iprange_contains_str(l, "255.255.255.255"));
    assert_false(rt_iprange_contains_str(l, "2001:4860::1")); /* v4 ranges hold no v6 */
    rt_iprange_free(l);
    const char *one6[] = {"2001:4860::8888/128"};
    l = parse(one6, 1);
    assert_true(rt_iprange_contains_str(l, "2001:4860::8888"));
    assert_false(rt_iprange_contains_str(l, "2001:4860::8889"));
    rt_iprange_free(l);
}

static void test_ipv6_boundaries(void **state)
{
    (void)state;
    const char *list[] = {"fc00::/7", "fe80::/10", "2001:db8:abcd:12::/63"};
    rt_iprange_list *l = parse(list, 3);
    assert_false(rt_iprange_contains_str(l, "fbff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"));
    assert_true(rt_iprange_contains_str(l, "fc00::"));
    assert_true(rt_iprange_contains_str(l, "fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"));
    assert_false(rt_iprange_contains_str(l, "fe00::"));
    assert_true(rt_iprange_contains_str(l, "fe80::1"));
    assert_true(rt_iprange_contains_str(l, "febf:ffff::1"));
    assert_false(rt_iprange_contains_str(l, "fec0::1"));
    /* A prefix that ends inside a byte (/63). */
    assert_true(rt_iprange_contains_str(l, "2001:db8:abcd:12::1"));
    assert_true(rt_iprange_contains_str(l, "2001:db8:abcd:13:ffff::1"));
    assert_false(rt_iprange_contains_str(l, "2001:db8:abcd:11:ffff::1"));
    assert_false(rt_iprange_contains_str(l, "2001:db8:abcd:14::"));
    /* IPv6 ranges hold no plain IPv4 address that does not map into them. */
    assert_false(rt_iprange_contains_str(l, "10.0.0.1"));
    rt_iprange_free(l);
}

static void test_mapped_addresses_are_judged_as_ipv4(void **state)
{
    (void)state;
    const char *list[] = {"127.0.0.0/8", "192.168.0.0/16"};
    rt_iprange_list *l = parse(list, 2);
    assert_true(rt_iprange_contains_str(l, "::ffff:127.0.0.1"));
    assert_true(rt_iprange_contains_str(l, "::ffff:7f00:1"));
    assert_true(rt_iprange_contains_str(l, "::ffff:192.168.10.10"));
    assert_false(rt_iprange_contains_str(l, "::ffff:8.8.8.8"));
    /* Only the ::ffff: form maps; 127.0.0.1 embedded elsewhere is another address. */
    assert_false(rt_iprange_contains_str(l, "::ffff:0:7f00:1"));
    assert_false(rt_iprange_contains_str(l, "2002:7f00:1::"));

    /* The same through a sockaddr_in6, as the client's connect check sees it. */
    struct sockaddr_in6 in6 = {.sin6_family = AF_INET6};
    inet_pton(AF_INET6, "::ffff:10.0.0.1", &in6.sin6_addr);
    const char *ten[] = {"10.0.0.0/8"};
    rt_iprange_list *t = parse(ten, 1);
    assert_true(rt_iprange_contains(t, (const struct sockaddr *)&in6));
    rt_iprange_free(t);

    /* A mapped IPv6 range covers the IPv4 addresses it spells. */
    const char *mapped[] = {"::ffff:10.0.0.0/104"};
    rt_iprange_list *m = parse(mapped, 1);
    assert_true(rt_iprange_contains_str(m, "10.9.8.7"));
    assert_true(rt_iprange_contains_str(m, "::ffff:10.9.8.7"));
    assert_false(rt_iprange_contains_str(m, "11.0.0.1"));
    rt_iprange_free(m);
    rt_iprange_free(l);
}

static void test_default_blacklist_covers_private_and_special_ranges(void **state)
{
    (void)state;
    rt_iprange_list *b = parse_default();
    const char *blocked[] = {
        "127.0.0.1",      "127.255.255.254", "10.0.0.1",        "172.16.5.4",
        "172.31.255.255", "192.168.1.1",     "100.64.0.1",      "100.127.255.255",
        "169.254.169.254", "0.0.0.0",        "0.1.2.3",         "192.0.0.8",
        "192.0.2.1",      "198.18.0.1",      "198.19.255.255",  "198.51.100.1",
        "203.0.113.9",    "224.0.0.1",       "239.255.255.255", "240.0.0.1",
        "255.255.255.255", "::1",            "::",              "fe80::1",
        "fc00::1",        "fd12:3456::1",    "ff02::1",         "2001:db8::1",
        "64:ff9b::808:808", "64:ff9b::7f00:1", "::ffff:127.0.0.1", "::ffff:169.254.169.254",
        "::ffff:10.1.1.1", "::127.0.0.1",    "2002:7f00:1::1",  "2001:0:4136:e378::1",
    };
    for (size_t i = 0; i < sizeof(blocked) / sizeof(blocked[0]); i++)
        if (!rt_iprange_contains_str(b, blocked[i])) fail_msg("%s is not blocked", blocked[i]);
    const char *open[] = {
        "8.8.8.8",      "1.1.1.1",          "172.15.0.1",   "172.32.0.1",
        "100.63.255.255", "100.128.0.0",    "192.169.0.1",  "198.20.0.1",
        "223.255.255.255", "2001:4860:4860::8888", "2a00:1450:4001::1", "::ffff:8.8.8.8",
    };
    for (size_t i = 0; i < sizeof(open) / sizeof(open[0]); i++)
        if (rt_iprange_contains_str(b, open[i])) fail_msg("%s is blocked", open[i]);
    rt_iprange_free(b);
}

static void test_allowed_applies_the_whitelist_over_the_blacklist(void **state)
{
    (void)state;
    rt_iprange_list *b = parse_default();
    const char *w[] = {"127.0.0.0/8"};
    rt_iprange_list *white = parse(w, 1);

    struct sockaddr_in lo = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &lo.sin_addr);
    struct sockaddr_in priv = {.sin_family = AF_INET};
    inet_pton(AF_INET, "10.0.0.1", &priv.sin_addr);
    struct sockaddr_in pub = {.sin_family = AF_INET};
    inet_pton(AF_INET, "8.8.8.8", &pub.sin_addr);
    struct sockaddr_in6 lo_mapped = {.sin6_family = AF_INET6};
    inet_pton(AF_INET6, "::ffff:127.0.0.1", &lo_mapped.sin6_addr);
    struct sockaddr_in6 lo6 = {.sin6_family = AF_INET6};
    inet_pton(AF_INET6, "::1", &lo6.sin6_addr);

    const struct sockaddr *slo = (const struct sockaddr *)&lo;
    const struct sockaddr *spriv = (const struct sockaddr *)&priv;
    const struct sockaddr *spub = (const struct sockaddr *)&pub;
    const struct sockaddr *smap = (const struct sockaddr *)&lo_mapped;
    const struct sockaddr *slo6 = (const struct sockaddr *)&lo6;

    /* No whitelist: the blacklist decides. */
    assert_false(rt_iprange_allowed(b, NULL, slo));
    assert_false(rt_iprange_allowed(b, NULL, smap));
    assert_false(rt_iprange_allowed(b, NULL, spriv));
    assert_true(rt_iprange_allowed(b, NULL, spub));
    /* The whitelist reopens exactly its ranges (and their mapped forms). */
    assert_true(rt_iprange_allowed(b, white, slo));
    assert_true(rt_iprange_allowed(b, white, smap));
    assert_false(rt_iprange_allowed(b, white, spriv));
    assert_false(rt_iprange_allowed(b, white, slo6));
    assert_true(rt_iprange_allowed(b, white, spub));
    /* No blacklist at all: everything IP is allowed; a non-IP address never is. */
    assert_true(rt_iprange_allowed(NULL, NULL, slo));
    struct sockaddr unix_sa = {.sa_family = AF_UNIX};
    assert_false(rt_iprange_allowed(NULL, NULL, &unix_sa));
    assert_false(rt_iprange_allowed(b, white, NULL));
    rt_iprange_free(white);
    rt_iprange_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_malformed_entries_are_refused_naming_the_entry),
        cmocka_unit_test(test_an_empty_list_contains_nothing),
        cmocka_unit_test(test_ipv4_boundaries),
        cmocka_unit_test(test_prefix_zero_and_full_length),
        cmocka_unit_test(test_ipv6_boundaries),
        cmocka_unit_test(test_mapped_addresses_are_judged_as_ipv4),
        cmocka_unit_test(test_default_blacklist_covers_private_and_special_ranges),
        cmocka_unit_test(test_allowed_applies_the_whitelist_over_the_blacklist),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
