/*
 * tests/unit/test_history_visibility.c - the history visibility rule as ranges
 * (rooms_vis_compute in core/rooms/rooms_vis.c): each history_visibility value for a user
 * invited then joined, a change judged by the value before or after it, the leave clamp,
 * "shared" needing the user joined now, a user never joined, unknown values, the
 * ROOMS_VIS_MAX_RANGES cap (the oldest ranges go), a truncated history (the strictest
 * before it), and the SQL window (rooms_vis_window, rooms_vis_covers). The readers that
 * apply it are exercised end to end by tests/integration/test_history_visibility.py.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/rooms/crooms_api.h"

#define BOB "@bob:example.org"
#define NO_END INT64_MAX
#define STINTS 70 /* join/leave cycles: more ranges than ROOMS_VIS_MAX_RANGES */

typedef struct range {
    int64_t lo, hi;
} range;

static void assert_ranges(const rooms_vis *v, const range *want, int n)
{
    for (int i = 0; i < v->n && i < n; i++) {
        if (v->lo[i] != want[i].lo || v->hi[i] != want[i].hi)
            fail_msg("range %d is (%lld, %lld], want (%lld, %lld]", i, (long long)v->lo[i],
                     (long long)v->hi[i], (long long)want[i].lo, (long long)want[i].hi);
    }
    assert_int_equal(v->n, n);
}

static void compute(const rooms_vis_change *hv, int n_hv, const rooms_vis_change *mem,
                    int n_mem, rooms_vis *out)
{
    rooms_vis_history h = {.hv = hv, .n_hv = n_hv, .mem = mem, .n_mem = n_mem};
    rooms_vis_compute(&h, BOB, out);
}

/* The room set `value` at 5; bob was invited at 10 and joined at 20. */
static void invited_then_joined(rooms_hv value, rooms_vis *out)
{
    const rooms_vis_change hv[] = {{5, value}};
    const rooms_vis_change mem[] = {{10, ROOMS_MEM_INVITE}, {20, ROOMS_MEM_JOIN}};
    compute(hv, 1, mem, 2, out);
}

static void test_each_value_for_a_user_invited_then_joined(void **state)
{
    (void)state;
    rooms_vis v;
    /* Before 5 the room had no value: "shared", and bob is joined now. */
    invited_then_joined(ROOMS_HV_JOINED, &v);
    assert_ranges(&v, (range[]){{0, 5}, {20, NO_END}}, 2);
    assert_true(v.ever_joined);
    assert_true(v.upto == NO_END);
    assert_int_equal(v.floor, 0);
    assert_string_equal(v.user_id, BOB);
    invited_then_joined(ROOMS_HV_INVITED, &v);
    assert_ranges(&v, (range[]){{0, 5}, {10, NO_END}}, 2);
    invited_then_joined(ROOMS_HV_SHARED, &v);
    assert_ranges(&v, (range[]){{0, NO_END}}, 1);
    invited_then_joined(ROOMS_HV_WORLD_READABLE, &v);
    assert_ranges(&v, (range[]){{0, NO_END}}, 1);
}

static void test_a_change_shows_when_the_value_before_or_after_allows(void **state)
{
    (void)state;
    /* joined at 5 (before: shared), invited at 15 (neither lets a stranger see it),
     * shared at 25 (after: shared), joined at 35 (before: shared); bob invited at 45,
     * joined at 55. */
    const rooms_vis_change hv[] = {{5, ROOMS_HV_JOINED}, {15, ROOMS_HV_INVITED},
                                   {25, ROOMS_HV_SHARED}, {35, ROOMS_HV_JOINED}};
    const rooms_vis_change mem[] = {{45, ROOMS_MEM_INVITE}, {55, ROOMS_MEM_JOIN}};
    rooms_vis v;
    compute(hv, 4, mem, 2, &v);
    assert_ranges(&v, (range[]){{0, 5}, {24, 35}, {55, NO_END}}, 3);
}

static void test_a_leave_ends_what_a_user_sees_and_shared_needs_joined_now(void **state)
{
    (void)state;
    /* No history_visibility event: "shared". Invited 10, joined 20, left 30, invited 40:
     * not joined now, so only the joined stretch shows, up to and with the leave. */
    rooms_vis_change mem[] = {{10, ROOMS_MEM_INVITE}, {20, ROOMS_MEM_JOIN},
                              {30, ROOMS_MEM_NONE}, {40, ROOMS_MEM_INVITE},
                              {50, ROOMS_MEM_JOIN}};
    rooms_vis v;
    compute(NULL, 0, mem, 4, &v);
    assert_ranges(&v, (range[]){{20, 30}}, 1);
    assert_int_equal(v.upto, 30);
    assert_int_equal(v.floor, 9); /* his own invite at 10 stays visible */
    /* Joined again at 50: everything, with no end. */
    compute(NULL, 0, mem, 5, &v);
    assert_ranges(&v, (range[]){{0, NO_END}}, 1);
    assert_true(v.upto == NO_END);
}

static void test_a_user_never_joined_sees_only_what_invited_or_world_readable_allow(void **state)
{
    (void)state;
    const rooms_vis_change invited[] = {{5, ROOMS_HV_INVITED}};
    const rooms_vis_change world[] = {{5, ROOMS_HV_WORLD_READABLE}};
    const rooms_vis_change mem[] = {{10, ROOMS_MEM_INVITE}, {20, ROOMS_MEM_NONE}};
    rooms_vis v;
    compute(invited, 1, mem, 2, &v);
    assert_false(v.ever_joined);
    assert_ranges(&v, (range[]){{10, 20}}, 1);
    assert_int_equal(v.floor, 9);
    assert_true(v.upto == NO_END);
    compute(world, 1, mem, 2, &v);
    assert_ranges(&v, (range[]){{4, NO_END}}, 1); /* the change itself: after allows */
    compute(NULL, 0, NULL, 0, &v);
    assert_false(v.ever_joined);
    assert_int_equal(v.n, 0);
    assert_true(v.floor == NO_END);
}

static void test_values_parse_and_unknown_ones_are_the_strictest(void **state)
{
    (void)state;
    assert_int_equal(rooms_hv_parse("world_readable"), ROOMS_HV_WORLD_READABLE);
    assert_int_equal(rooms_hv_parse("shared"), ROOMS_HV_SHARED);
    assert_int_equal(rooms_hv_parse("invited"), ROOMS_HV_INVITED);
    assert_int_equal(rooms_hv_parse("joined"), ROOMS_HV_JOINED);
    assert_int_equal(rooms_hv_parse("Shared"), ROOMS_HV_JOINED);
    assert_int_equal(rooms_hv_parse(""), ROOMS_HV_JOINED);
    assert_int_equal(rooms_hv_parse(NULL), ROOMS_HV_JOINED);
    assert_int_equal(rooms_mem_parse("join"), ROOMS_MEM_JOIN);
    assert_int_equal(rooms_mem_parse("invite"), ROOMS_MEM_INVITE);
    assert_int_equal(rooms_mem_parse("knock"), ROOMS_MEM_NONE);
    assert_int_equal(rooms_mem_parse("ban"), ROOMS_MEM_NONE);
    assert_int_equal(rooms_mem_parse(NULL), ROOMS_MEM_NONE);
}

static void test_past_the_range_cap_the_oldest_ranges_are_hidden(void **state)
{
    (void)state;
    /* "joined" from 1; bob joins at 100i+10 and leaves at 100i+20, STINTS times, then
     * joins for good: (0,1], STINTS stints and the last join make STINTS + 2 ranges. */
    const rooms_vis_change hv[] = {{1, ROOMS_HV_JOINED}};
    rooms_vis_change mem[2 * STINTS + 1];
    for (int i = 0; i < STINTS; i++) {
        mem[2 * i] = (rooms_vis_change){100 * i + 10, ROOMS_MEM_JOIN};
        mem[2 * i + 1] = (rooms_vis_change){100 * i + 20, ROOMS_MEM_NONE};
    }
    mem[2 * STINTS] = (rooms_vis_change){100 * STINTS + 10, ROOMS_MEM_JOIN};
    rooms_vis v;
    compute(hv, 1, mem, 2 * STINTS + 1, &v);
    int dropped = STINTS + 2 - ROOMS_VIS_MAX_RANGES; /* (0,1] and the oldest stints */
    assert_int_equal(v.n, ROOMS_VIS_MAX_RANGES);
    assert_int_equal(v.dropped, dropped);
    assert_int_equal(v.lo[0], 100 * (dropped - 1) + 10);
    assert_int_equal(v.hi[0], 100 * (dropped - 1) + 20);
    assert_int_equal(v.lo[v.n - 1], 100 * STINTS + 10);
    assert_true(v.hi[v.n - 1] == NO_END);
    assert_int_equal(v.floor, 9); /* his own membership events stay visible */
}

static void test_a_truncated_history_starts_from_the_strictest_value(void **state)
{
    (void)state;
    const rooms_vis_change hv[] = {{50, ROOMS_HV_SHARED}};
    const rooms_vis_change mem[] = {{10, ROOMS_MEM_INVITE}, {20, ROOMS_MEM_JOIN}};
    rooms_vis_history h = {.hv = hv, .n_hv = 1, .mem = mem, .n_mem = 2};
    rooms_vis v;
    rooms_vis_compute(&h, BOB, &v);
    assert_ranges(&v, (range[]){{0, NO_END}}, 1);
    h.hv_truncated = true; /* older values unknown: "joined" until 50 */
    rooms_vis_compute(&h, BOB, &v);
    assert_ranges(&v, (range[]){{20, NO_END}}, 1);
    h.hv_truncated = false;
    h.mem_truncated = true; /* older memberships unknown: none; "shared" needs none */
    rooms_vis_compute(&h, BOB, &v);
    assert_ranges(&v, (range[]){{0, NO_END}}, 1);
}

static void test_the_window_narrows_to_what_can_be_visible(void **state)
{
    (void)state;
    const rooms_vis_change hv[] = {{5, ROOMS_HV_JOINED}};
    const rooms_vis_change mem[] = {{10, ROOMS_MEM_INVITE}, {20, ROOMS_MEM_JOIN},
                                    {30, ROOMS_MEM_NONE}};
    rooms_vis v;
    compute(hv, 1, mem, 3, &v);
    assert_ranges(&v, (range[]){{20, 30}}, 1);
    rt_arena *a = rt_arena_new(1024);
    assert_non_null(a);
    const char *sql, *p[ROOMS_VIS_PARAMS];
    assert_true(rooms_vis_window(a, &v, 0, NO_END, false, 3, &sql, p));
    assert_string_equal(p[0], "9");  /* from the floor: his invite at 10 */
    assert_string_equal(p[1], "30"); /* to the leave */
    assert_string_equal(p[4], "{20}");
    assert_string_equal(p[5], "{30}");
    assert_string_equal(p[6], BOB);
    assert_non_null(strstr(sql, "e.stream_pos > $3 AND e.stream_pos <= $4 AND ("));
    assert_non_null(strstr(sql, "$9"));
    assert_null(strstr(sql, "$10"));
    /* After the leave nothing can be visible; hidden there is everything. */
    assert_false(rooms_vis_window(a, &v, 30, 100, false, 3, &sql, p));
    assert_true(rooms_vis_window(a, &v, 30, 100, true, 3, &sql, p));
    assert_non_null(strstr(sql, "AND NOT ("));
    assert_false(rooms_vis_window(a, &v, 40, 40, true, 3, &sql, p));
    assert_true(rooms_vis_covers(&v, 20, 30));
    assert_true(rooms_vis_covers(&v, 25, 25));
    assert_false(rooms_vis_covers(&v, 19, 30));
    assert_false(rooms_vis_covers(&v, 20, 31));
    rt_arena_free(a);
}

static void test_backfilled_history_shows_under_the_oldest_value_known(void **state)
{
    (void)state;
    rooms_vis v;
    /* A room joined over federation: its state (shared) at 5, bob's join at 20; history
     * read from other servers sits at positions <= 0. */
    const rooms_vis_change shared[] = {{5, ROOMS_HV_SHARED}};
    const rooms_vis_change joined_hv[] = {{5, ROOMS_HV_JOINED}};
    const rooms_vis_change world[] = {{5, ROOMS_HV_WORLD_READABLE}};
    const rooms_vis_change joined[] = {{20, ROOMS_MEM_JOIN}};
    const rooms_vis_change left[] = {{20, ROOMS_MEM_JOIN}, {30, ROOMS_MEM_NONE}};
    compute(shared, 1, joined, 1, &v);
    assert_true(v.backfilled);
    assert_true(v.floor == INT64_MIN);
    compute(joined_hv, 1, joined, 1, &v); /* "joined": bob was in none of it */
    assert_false(v.backfilled);
    compute(shared, 1, left, 2, &v);      /* shared needs joined now */
    assert_false(v.backfilled);
    compute(world, 1, NULL, 0, &v);
    assert_true(v.backfilled);
    /* A backfilled change (at <= 0) comes before history it cannot be ordered against:
     * the strictest value for that region. */
    const rooms_vis_change old_change[] = {{-3, ROOMS_HV_SHARED}, {5, ROOMS_HV_SHARED}};
    compute(old_change, 2, joined, 1, &v);
    assert_false(v.backfilled);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_value_for_a_user_invited_then_joined),
        cmocka_unit_test(test_a_change_shows_when_the_value_before_or_after_allows),
        cmocka_unit_test(test_a_leave_ends_what_a_user_sees_and_shared_needs_joined_now),
        cmocka_unit_test(test_a_user_never_joined_sees_only_what_invited_or_world_readable_allow),
        cmocka_unit_test(test_values_parse_and_unknown_ones_are_the_strictest),
        cmocka_unit_test(test_past_the_range_cap_the_oldest_ranges_are_hidden),
        cmocka_unit_test(test_a_truncated_history_starts_from_the_strictest_value),
        cmocka_unit_test(test_the_window_narrows_to_what_can_be_visible),
        cmocka_unit_test(test_backfilled_history_shows_under_the_oldest_value_known),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
