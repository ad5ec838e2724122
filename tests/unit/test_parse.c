/*
 * tests/unit/test_parse.c - atrium_parse_int64, the one reader of numbers clients send:
 * digits only, no trailing bytes, overflow and range reported, clamping bound handed back.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "atrium/parse.h"

static void test_plain_decimals_are_read(void **state)
{
    (void)state;
    int64_t v = -1;
    assert_int_equal(atrium_parse_int64("0", 0, 10, &v), 0);
    assert_int_equal(v, 0);
    assert_int_equal(atrium_parse_int64("42", 0, 100, &v), 0);
    assert_int_equal(v, 42);
    assert_int_equal(atrium_parse_int64("-7", -10, 10, &v), 0);
    assert_int_equal(v, -7);
    assert_int_equal(atrium_parse_int64("9223372036854775807", 0, INT64_MAX, &v), 0);
    assert_true(v == INT64_MAX);
    assert_int_equal(atrium_parse_int64("-9223372036854775808", INT64_MIN, 0, &v), 0);
    assert_true(v == INT64_MIN);
}

static void test_anything_but_digits_is_refused_and_leaves_out_alone(void **state)
{
    (void)state;
    static const char *const bad[] = {"", "-", "+1", " 1", "1 ", "12abc", "0x10", "1e3",
                                      "1.5", "--1", "١", "\t3"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int64_t v = 99;
        assert_int_equal(atrium_parse_int64(bad[i], INT64_MIN, INT64_MAX, &v), ATRIUM_E_INVAL);
        assert_int_equal(v, 99);
    }
    int64_t v = 99;
    assert_int_equal(atrium_parse_int64(NULL, 0, 1, &v), ATRIUM_E_INVAL);
}

static void test_overflow_and_range_are_reported_with_the_nearer_bound(void **state)
{
    (void)state;
    int64_t v = 0;
    assert_int_equal(atrium_parse_int64("99999999999999999999", 0, INT64_MAX, &v), ATRIUM_E_LIMIT);
    assert_true(v == INT64_MAX);
    assert_int_equal(atrium_parse_int64("9223372036854775808", 0, INT64_MAX, &v), ATRIUM_E_LIMIT);
    assert_true(v == INT64_MAX);
    assert_int_equal(atrium_parse_int64("-9223372036854775809", INT64_MIN, 0, &v), ATRIUM_E_LIMIT);
    assert_true(v == INT64_MIN);
    assert_int_equal(atrium_parse_int64("101", 0, 100, &v), ATRIUM_E_LIMIT);
    assert_int_equal(v, 100);
    assert_int_equal(atrium_parse_int64("-1", 0, 100, &v), ATRIUM_E_LIMIT);
    assert_int_equal(v, 0);
    assert_int_equal(atrium_parse_int64("0", 1, 100, &v), ATRIUM_E_LIMIT);
    assert_int_equal(v, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_decimals_are_read),
        cmocka_unit_test(test_anything_but_digits_is_refused_and_leaves_out_alone),
        cmocka_unit_test(test_overflow_and_range_are_reported_with_the_nearer_bound),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
