/*
 * tests/unit/test_iface.c - the interface registry's contract (core/runtime/iface.c): an
 * interface is found by its name when its provider's struct is at least as large as the
 * caller needs, a second provider of one name is refused, and a struct too small to hold
 * its own header is refused.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "core/plugins/plugins.h"

typedef struct demo_v1 {
    uint32_t size, version;
    int (*answer)(void);
} demo_v1;

typedef struct demo_v1_1 { /* the same interface at a newer minor: one member appended */
    uint32_t size, version;
    int (*answer)(void);
    int (*other)(void);
} demo_v1_1;

static int forty_two(void) { return 42; }

static void test_an_interface_is_found_by_name_when_it_is_large_enough(void **state)
{
    (void)state;
    rt_iface_reset();
    static const demo_v1 demo = {.size = sizeof(demo_v1), .version = 0, .answer = forty_two};
    assert_int_equal(rt_iface_add("demo-plugin", "demo/1", &demo), 0);
    const demo_v1 *got = rt_iface_get("demo/1", sizeof(demo_v1));
    assert_ptr_equal(got, &demo);
    assert_int_equal(got->answer(), 42);
    /* A caller needing the newer minor's member gets nothing from an older provider. */
    assert_null(rt_iface_get("demo/1", sizeof(demo_v1_1)));
    assert_null(rt_iface_get("demo/2", 8));
    assert_null(rt_iface_get(NULL, 8));
}

static void test_a_second_provider_and_a_headerless_struct_are_refused(void **state)
{
    (void)state;
    rt_iface_reset();
    static const demo_v1 one = {.size = sizeof(demo_v1), .answer = forty_two};
    static const demo_v1 two = {.size = sizeof(demo_v1), .answer = forty_two};
    static const uint32_t tiny = 4;
    assert_int_equal(rt_iface_add("a", "demo/1", &one), 0);
    assert_int_equal(rt_iface_add("b", "demo/1", &two), ATRIUM_E_EXISTS);
    assert_ptr_equal(rt_iface_get("demo/1", 8), &one);
    assert_int_equal(rt_iface_add("c", "tiny/1", &tiny), ATRIUM_E_INVAL);
    assert_null(rt_iface_get("tiny/1", 0));
    rt_iface_reset();
    assert_null(rt_iface_get("demo/1", 8));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_an_interface_is_found_by_name_when_it_is_large_enough),
        cmocka_unit_test(test_a_second_provider_and_a_headerless_struct_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
