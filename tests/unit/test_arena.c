/*
 * tests/unit/test_arena.c - the request arena: aligned, zeroed, non-overlapping memory,
 * string helpers, allocations larger than a chunk, and freeing everything at once.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "core/runtime/runtime.h"

enum { ALIGN = 16, SMALL_CHUNK = 256 };

static void test_arena_allocations_are_16_byte_aligned_and_zeroed(void **state)
{
    (void)state;
    rt_arena *a = rt_arena_new(SMALL_CHUNK);
    assert_non_null(a);
    for (size_t size = 0; size < 300; size += 7) {
        unsigned char *p = rt_arena_alloc(a, size);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % ALIGN, 0);
        for (size_t i = 0; i < size; i++)
            assert_int_equal(p[i], 0);
        memset(p, 0xAB, size); /* dirty it: the next allocation must still be zeroed */
    }
    rt_arena_free(a);
}

static void test_arena_allocations_never_overlap(void **state)
{
    (void)state;
    enum { N = 200 };
    rt_arena *a = rt_arena_new(SMALL_CHUNK);
    unsigned char *ptrs[N];
    size_t sizes[N];
    for (int i = 0; i < N; i++) {
        sizes[i] = (size_t)(i * 13 % 97) + 1;
        ptrs[i] = rt_arena_alloc(a, sizes[i]);
        memset(ptrs[i], i, sizes[i]);
    }
    for (int i = 0; i < N; i++) {
        for (size_t j = 0; j < sizes[i]; j++)
            assert_int_equal(ptrs[i][j], (unsigned char)i);
    }
    rt_arena_free(a);
}

static void test_arena_zero_sized_allocations_are_distinct(void **state)
{
    (void)state;
    rt_arena *a = rt_arena_new(0); /* 0 = the default chunk size */
    void *p = rt_arena_alloc(a, 0), *q = rt_arena_alloc(a, 0);
    assert_non_null(p);
    assert_non_null(q);
    assert_ptr_not_equal(p, q);
    rt_arena_free(a);
}

static void test_arena_serves_allocations_larger_than_a_chunk(void **state)
{
    (void)state;
    rt_arena *a = rt_arena_new(SMALL_CHUNK);
    char *small = rt_arena_strdup(a, "before");
    size_t big_size = 10 * SMALL_CHUNK + 3;
    unsigned char *big = rt_arena_alloc(a, big_size);
    assert_non_null(big);
    assert_int_equal((uintptr_t)big % ALIGN, 0);
    memset(big, 0x5A, big_size);
    char *after = rt_arena_strdup(a, "after");
    assert_string_equal(small, "before");
    assert_string_equal(after, "after");
    assert_int_equal(big[big_size - 1], 0x5A);
    rt_arena_free(a);
}

static void test_arena_refuses_an_impossible_size(void **state)
{
    (void)state;
    rt_arena *a = rt_arena_new(SMALL_CHUNK);
    assert_null(rt_arena_alloc(a, SIZE_MAX));
    assert_null(rt_arena_alloc(a, SIZE_MAX - 8));
    assert_non_null(rt_arena_alloc(a, 1)); /* and keeps working */
    rt_arena_free(a);
}

static void test_arena_strdup_and_strndup_copy_and_terminate(void **state)
{
    (void)state;
    rt_arena *a = rt_arena_new(SMALL_CHUNK);
    const char *src = "!room:example.org";
    char *d = rt_arena_strdup(a, src);
    assert_string_equal(d, src);
    assert_ptr_not_equal(d, src);
    assert_string_equal(rt_arena_strndup(a, src, 5), "!room");
    assert_string_equal(rt_arena_strndup(a, "ab", 10), "ab"); /* n past the end */
    assert_string_equal(rt_arena_strdup(a, ""), "");
    rt_arena_free(a);
}

static void test_arena_printf_formats_into_the_arena(void **state)
{
    (void)state;
    rt_arena *a = rt_arena_new(SMALL_CHUNK);
    assert_string_equal(rt_arena_printf(a, "%s:%d", "matrix.org", 8448), "matrix.org:8448");
    char long_arg[3 * SMALL_CHUNK];
    memset(long_arg, 'x', sizeof(long_arg) - 1);
    long_arg[sizeof(long_arg) - 1] = '\0';
    char *s = rt_arena_printf(a, "<%s>", long_arg);
    assert_int_equal(strlen(s), strlen(long_arg) + 2);
    assert_int_equal(s[0], '<');
    assert_int_equal(s[strlen(s) - 1], '>');
    rt_arena_free(a);
}

static void test_arena_used_counts_bytes_handed_out(void **state)
{
    (void)state;
    rt_arena *a = rt_arena_new(SMALL_CHUNK);
    assert_int_equal(rt_arena_used(a), 0);
    assert_non_null(rt_arena_alloc(a, 1));
    assert_int_equal(rt_arena_used(a), ALIGN);
    assert_non_null(rt_arena_alloc(a, ALIGN + 1));
    assert_int_equal(rt_arena_used(a), 3 * ALIGN);
    assert_non_null(rt_arena_alloc(a, 4 * SMALL_CHUNK));
    assert_int_equal(rt_arena_used(a), 3 * ALIGN + 4 * SMALL_CHUNK);
    rt_arena_free(a);
    rt_arena_free(NULL); /* like free(3) */
}

/* A reset arena counts from zero again and hands out zeroed memory from the chunk it
 * kept (request.c reuses arenas so). */
static void test_arena_reset_reuses_one_chunk_and_zeroes_again(void **state)
{
    (void)state;
    rt_arena *a = rt_arena_new(1024);
    assert_non_null(a);
    unsigned char *first = rt_arena_alloc(a, 100);
    assert_non_null(first);
    memset(first, 0xAB, 100);
    for (int i = 0; i < 20; i++) assert_non_null(rt_arena_alloc(a, 300)); /* more chunks */
    assert_non_null(rt_arena_alloc(a, 5000)); /* an oversize one */
    rt_arena_reset(a);
    assert_true(rt_arena_usable(a));
    assert_int_equal(rt_arena_used(a), 0);
    unsigned char *again = rt_arena_alloc(a, 100);
    assert_non_null(again);
    for (int i = 0; i < 100; i++) assert_int_equal(again[i], 0);
    assert_int_equal(rt_arena_used(a), 112);
    rt_arena_free(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arena_allocations_are_16_byte_aligned_and_zeroed),
        cmocka_unit_test(test_arena_allocations_never_overlap),
        cmocka_unit_test(test_arena_zero_sized_allocations_are_distinct),
        cmocka_unit_test(test_arena_serves_allocations_larger_than_a_chunk),
        cmocka_unit_test(test_arena_refuses_an_impossible_size),
        cmocka_unit_test(test_arena_strdup_and_strndup_copy_and_terminate),
        cmocka_unit_test(test_arena_printf_formats_into_the_arena),
        cmocka_unit_test(test_arena_used_counts_bytes_handed_out),
        cmocka_unit_test(test_arena_reset_reuses_one_chunk_and_zeroes_again),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
