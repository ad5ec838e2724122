/*
 * tests/unit/test_server_name.c - the core's server-name grammar (core/runtime/
 * server_name.h): what the spec's appendix allows, and the names that are not names
 * (`..`, empty labels, paths, bad ports) that must never reach discovery.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "core/runtime/server_name.h"

static void test_hostnames_addresses_and_ports_are_names(void **state)
{
    (void)state;
    const char *ok[] = {"example.org", "localhost", "localhost:8448", "1.2.3.4",
                        "1.2.3.4:1",   "[::1]",     "[::1]:8448",     "[1234:5678::abcd]",
                        "a-b.c-d.e",   "xn--bcher-kva.example", "matrix.org:65535"};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        if (!rt_server_name_valid(ok[i])) fail_msg("refused %s", ok[i]);
    }
}

static void test_dot_dot_empty_labels_and_paths_are_not_names(void **state)
{
    (void)state;
    const char *bad[] = {"",          "..",      ".",          "a..b",      ".example.org",
                         "example.org.", "localhost/../..", "a/b",  "bad server", "host:",
                         "host:123456", "host:65536", "host:8a", "[::1", "[]", "[::1]x",
                         "[::g]",       "host:80:80", "ex%2Fample", "caf\xc3\xa9.org", ":8448"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (rt_server_name_valid(bad[i])) fail_msg("accepted \"%s\"", bad[i]);
    }
    assert_false(rt_server_name_valid(NULL));
}

static void test_the_length_limit_is_255_characters(void **state)
{
    (void)state;
    char name[300];
    memset(name, 'a', sizeof(name));
    for (size_t i = 63; i < 255; i += 64) name[i] = '.';
    name[255] = '\0';
    assert_true(rt_server_name_valid(name));
    name[255] = 'a';
    name[256] = '\0';
    assert_false(rt_server_name_valid(name));
}

static void test_ids_are_checked_after_their_first_colon(void **state)
{
    (void)state;
    assert_true(rt_server_name_of_id_valid("@alice:example.org"));
    assert_true(rt_server_name_of_id_valid("#room:example.org:8448"));
    assert_true(rt_server_name_of_id_valid("@u:[::1]:8448"));
    assert_false(rt_server_name_of_id_valid("@u:localhost/../.."));
    assert_false(rt_server_name_of_id_valid("@u:.."));
    assert_false(rt_server_name_of_id_valid("@:example.org"));
    assert_false(rt_server_name_of_id_valid("@alice"));
    assert_false(rt_server_name_of_id_valid("@alice:"));
    assert_false(rt_server_name_of_id_valid(NULL));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hostnames_addresses_and_ports_are_names),
        cmocka_unit_test(test_dot_dot_empty_labels_and_paths_are_not_names),
        cmocka_unit_test(test_the_length_limit_is_255_characters),
        cmocka_unit_test(test_ids_are_checked_after_their_first_colon),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
