/*
 * tests/unit/test_uri.c - the core's percent-encoder (core/runtime/uri.h): what it keeps,
 * what it escapes, and that a value that does not fit leaves an empty string and says so,
 * at the exact boundary (the encoding and its NUL just fit; one byte less does not).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "core/runtime/uri.h"

static void test_unreserved_characters_are_kept(void **state)
{
    (void)state;
    char out[128];
    const char *s = "AZaz09-._~";
    assert_true(rt_uri_encode(s, out, sizeof(out)));
    assert_string_equal(out, s);
}

static void test_matrix_ids_are_escaped_in_upper_case_hex(void **state)
{
    (void)state;
    char out[128];
    assert_true(rt_uri_encode("!room:example.org", out, sizeof(out)));
    assert_string_equal(out, "%21room%3Aexample.org");
    assert_true(rt_uri_encode("$ev/+= \xc3\xa9", out, sizeof(out)));
    assert_string_equal(out, "%24ev%2F%2B%3D%20%C3%A9");
}

static void test_the_empty_string_encodes_to_itself(void **state)
{
    (void)state;
    char out[1] = {'x'};
    assert_true(rt_uri_encode("", out, sizeof(out)));
    assert_string_equal(out, "");
}

static void test_an_exact_fit_succeeds(void **state)
{
    (void)state;
    char out[16];
    /* "@a:b" -> "%40a%3Ab": 8 bytes and the NUL. */
    memset(out, 'x', sizeof(out));
    assert_true(rt_uri_encode("@a:b", out, 9));
    assert_string_equal(out, "%40a%3Ab");
    /* ending on a kept character: "ab" in 3 bytes */
    assert_true(rt_uri_encode("ab", out, 3));
    assert_string_equal(out, "ab");
}

static void test_one_byte_short_fails_with_an_empty_string(void **state)
{
    (void)state;
    char out[16];
    memset(out, 'x', sizeof(out));
    assert_false(rt_uri_encode("@a:b", out, 8));
    assert_string_equal(out, "");
    memset(out, 'x', sizeof(out));
    assert_false(rt_uri_encode("ab", out, 2));
    assert_string_equal(out, "");
    /* an escape that would be cut in the middle is not written in part */
    memset(out, 'x', sizeof(out));
    assert_false(rt_uri_encode("a:", out, 4));
    assert_string_equal(out, "");
}

static void test_no_room_at_all_fails_without_writing(void **state)
{
    (void)state;
    char out[1] = {'x'};
    assert_false(rt_uri_encode("a", out, 0));
    assert_int_equal(out[0], 'x');
    assert_false(rt_uri_encode("a", out, 1));
    assert_string_equal(out, "");
}

static void test_the_bound_macro_covers_every_byte_escaped(void **state)
{
    (void)state;
    const char *s = "::::";
    char out[RT_URI_ENCODED_MAX(4) + 1];
    assert_true(rt_uri_encode(s, out, sizeof(out)));
    assert_string_equal(out, "%3A%3A%3A%3A");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unreserved_characters_are_kept),
        cmocka_unit_test(test_matrix_ids_are_escaped_in_upper_case_hex),
        cmocka_unit_test(test_the_empty_string_encodes_to_itself),
        cmocka_unit_test(test_an_exact_fit_succeeds),
        cmocka_unit_test(test_one_byte_short_fails_with_an_empty_string),
        cmocka_unit_test(test_no_room_at_all_fails_without_writing),
        cmocka_unit_test(test_the_bound_macro_covers_every_byte_escaped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
