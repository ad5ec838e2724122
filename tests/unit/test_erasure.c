/*
 * tests/unit/test_erasure.c - erasure as a rule on ranges (core/rooms/rooms_vis.c): where a
 * user was joined (the joined ranges rooms_vis_compute keeps: from a join, exclusive, to
 * the change that ended it, inclusive), which events erasure covers (not state, and
 * m.room.member), whom it hides them from (a reader not joined at the event, a reader
 * with no visibility at all, never a reader joined throughout), what other servers get,
 * the split of a range into joined and not joined pieces that search matches with, and
 * the ROOMS_VIS_MAX_RANGES cap (the oldest joins go: more is hidden, never less). The
 * readers that apply it are exercised end to end by tests/integration/test_erasure.py.
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
#define CYCLES 70 /* join/leave cycles: more than ROOMS_VIS_MAX_RANGES */

static void compute(const rooms_vis_change *mem, int n_mem, rooms_vis *out)
{
    rooms_vis_history h = {.mem = mem, .n_mem = n_mem};
    rooms_vis_compute(&h, BOB, out);
}

/* Bob was invited at 10, joined at 20, left at 30, joined again at 40 (still joined). */
static void invited_joined_left_rejoined(rooms_vis *out)
{
    const rooms_vis_change mem[] = {{10, ROOMS_MEM_INVITE}, {20, ROOMS_MEM_JOIN},
                                    {30, ROOMS_MEM_NONE}, {40, ROOMS_MEM_JOIN}};
    compute(mem, 4, out);
}

static void test_a_user_is_joined_after_each_join_up_to_the_change_that_ends_it(void **state)
{
    (void)state;
    rooms_vis v;
    invited_joined_left_rejoined(&v);
    assert_int_equal(v.n_joined, 2);
    assert_true(v.jlo[0] == 20 && v.jhi[0] == 30);
    assert_true(v.jlo[1] == 40 && v.jhi[1] == INT64_MAX);
    /* The join itself saw the invite before it; the leave saw the join. */
    assert_false(rooms_vis_joined_at(&v, 10));
    assert_false(rooms_vis_joined_at(&v, 20));
    assert_true(rooms_vis_joined_at(&v, 21));
    assert_true(rooms_vis_joined_at(&v, 30));
    assert_false(rooms_vis_joined_at(&v, 31));
    assert_false(rooms_vis_joined_at(&v, 40));
    assert_true(rooms_vis_joined_at(&v, 41));
    assert_true(rooms_vis_joined_at(&v, INT64_MAX));
    /* Backfilled history (positions <= 0) is older than every join seen here. */
    assert_false(rooms_vis_joined_at(&v, 0));
    assert_false(rooms_vis_joined_at(&v, -5));
    /* A user never joined was joined nowhere. */
    compute((rooms_vis_change[]){{10, ROOMS_MEM_INVITE}}, 1, &v);
    assert_int_equal(v.n_joined, 0);
    assert_false(rooms_vis_joined_at(&v, 11));
}

static void test_erasure_covers_messages_and_member_events_not_room_configuration(void **state)
{
    (void)state;
    assert_true(rooms_erasure_covers("m.room.message", false));
    assert_true(rooms_erasure_covers("m.reaction", false));
    assert_true(rooms_erasure_covers("m.room.member", true));
    assert_false(rooms_erasure_covers("m.room.encryption", true));
    assert_false(rooms_erasure_covers("m.room.power_levels", true));
    assert_false(rooms_erasure_covers("m.room.topic", true));
    assert_true(rooms_erasure_covers(NULL, false)); /* no type: hide rather than show */
    assert_true(rooms_erasure_hides_from_servers(true, "m.room.message", false));
    assert_true(rooms_erasure_hides_from_servers(true, "m.room.member", true));
    assert_false(rooms_erasure_hides_from_servers(true, "m.room.name", true));
    assert_false(rooms_erasure_hides_from_servers(false, "m.room.message", false));
}

static void test_erasure_hides_from_readers_not_joined_at_the_event(void **state)
{
    (void)state;
    rooms_vis v;
    invited_joined_left_rejoined(&v);
    events_view view = {.user_id = BOB, .reader = &v};
    /* Joined at 25 and at 50: shown. Away at 35, invited at 15: hidden. */
    assert_false(rooms_erasure_hides(&view, true, "m.room.message", false, 25));
    assert_false(rooms_erasure_hides(&view, true, "m.room.message", false, 50));
    assert_true(rooms_erasure_hides(&view, true, "m.room.message", false, 35));
    assert_true(rooms_erasure_hides(&view, true, "m.room.member", true, 15));
    /* Not erased, or not covered: nothing hidden. */
    assert_false(rooms_erasure_hides(&view, false, "m.room.message", false, 35));
    assert_false(rooms_erasure_hides(&view, true, "m.room.topic", true, 35));
    /* No visibility known: a reader never joined. Joined throughout: nothing hidden. */
    events_view stranger = {.user_id = BOB};
    assert_true(rooms_erasure_hides(&stranger, true, "m.room.message", false, 25));
    events_view notified = {.user_id = BOB, .reader_joined = true};
    assert_false(rooms_erasure_hides(&notified, true, "m.room.message", false, 35));
}

static void test_a_range_splits_into_joined_and_not_joined_pieces(void **state)
{
    (void)state;
    rooms_vis v;
    invited_joined_left_rejoined(&v);
    int64_t lo[2 * ROOMS_VIS_MAX_RANGES + 1], hi[2 * ROOMS_VIS_MAX_RANGES + 1];
    bool j[2 * ROOMS_VIS_MAX_RANGES + 1];
    int n = rooms_vis_joined_pieces(&v, 0, 100, lo, hi, j, 2 * ROOMS_VIS_MAX_RANGES + 1);
    const struct {
        int64_t lo, hi;
        bool joined;
    } want[] = {{0, 20, false}, {20, 30, true}, {30, 40, false}, {40, 100, true}};
    assert_int_equal(n, 4);
    for (int i = 0; i < n; i++) {
        if (lo[i] != want[i].lo || hi[i] != want[i].hi || j[i] != want[i].joined)
            fail_msg("piece %d is (%lld, %lld] %d, want (%lld, %lld] %d", i, (long long)lo[i],
                     (long long)hi[i], j[i], (long long)want[i].lo, (long long)want[i].hi,
                     want[i].joined);
    }
    /* Inside one joined range: one piece. Between two: one piece, not joined. */
    n = rooms_vis_joined_pieces(&v, 22, 28, lo, hi, j, 3);
    assert_true(n == 1 && lo[0] == 22 && hi[0] == 28 && j[0]);
    n = rooms_vis_joined_pieces(&v, 31, 39, lo, hi, j, 3);
    assert_true(n == 1 && lo[0] == 31 && hi[0] == 39 && !j[0]);
    /* Too few slots: the pieces stop short, in order. */
    n = rooms_vis_joined_pieces(&v, 0, 100, lo, hi, j, 2);
    assert_true(n == 2 && hi[1] == 30 && j[1]);
    /* An empty range has no pieces. */
    assert_int_equal(rooms_vis_joined_pieces(&v, 50, 50, lo, hi, j, 3), 0);
}

static void test_past_the_range_cap_the_oldest_joins_count_as_not_joined(void **state)
{
    (void)state;
    rooms_vis_change mem[2 * CYCLES];
    for (int i = 0; i < CYCLES; i++) {
        mem[2 * i] = (rooms_vis_change){10 * i + 1, ROOMS_MEM_JOIN};
        mem[2 * i + 1] = (rooms_vis_change){10 * i + 5, ROOMS_MEM_NONE};
    }
    rooms_vis v;
    compute(mem, 2 * CYCLES, &v);
    assert_int_equal(v.n_joined, ROOMS_VIS_MAX_RANGES);
    int first_kept = CYCLES - ROOMS_VIS_MAX_RANGES;
    assert_false(rooms_vis_joined_at(&v, 3));                  /* the first join: gone */
    assert_false(rooms_vis_joined_at(&v, 10 * (first_kept - 1) + 3));
    assert_true(rooms_vis_joined_at(&v, 10 * first_kept + 3)); /* the oldest kept */
    assert_true(rooms_vis_joined_at(&v, 10 * (CYCLES - 1) + 5));
    assert_false(rooms_vis_joined_at(&v, 10 * (CYCLES - 1) + 6));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_user_is_joined_after_each_join_up_to_the_change_that_ends_it),
        cmocka_unit_test(test_erasure_covers_messages_and_member_events_not_room_configuration),
        cmocka_unit_test(test_erasure_hides_from_readers_not_joined_at_the_event),
        cmocka_unit_test(test_a_range_splits_into_joined_and_not_joined_pieces),
        cmocka_unit_test(test_past_the_range_cap_the_oldest_joins_count_as_not_joined),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
