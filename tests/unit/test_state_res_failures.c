/*
 * tests/unit/test_state_res_failures.c - how state resolution fails: cleanly, naming the
 * event at fault where there is one, over DAGs built by hand from real PDUs
 * (tests/unit/state_res_fixture.h): an event the loader does not have, an event of another
 * room, an auth chain deeper than the bound on events walked, more states than the bound,
 * and (room version 2's free event IDs) an auth cycle. The answers of resolutions that
 * succeed are in test_state_res.c.
 */
#include "state_res_fixture.h"

/* ---- failures ------------------------------------------------------------------------- */

static void test_a_missing_event_is_reported_by_id(void **state)
{
    (void)state;
    dag d;
    dag_init(&d, room_version_find("10"));
    branch base = base_room(&d), a = fork_of(&base), b = fork_of(&base);
    emit(&a, "pl2", "m.room.power_levels", "", ALICE, 2000, "{\"users\":{\"@alice:hs\":100}}");
    emit(&b, "ban", "m.room.member", CAROL, BOB, 2001, "{\"membership\":\"ban\"}");
    d.hide = id_of(&d, "carol"); /* cited by the ban, so walked */
    const state_map *states[] = {a.state, b.state};
    state_map *out;
    state_res_report rep;
    assert_int_equal(resolve_states(&d, states, 2, 0, &out, &rep), STATE_RES_E_MISSING);
    assert_null(out);
    assert_string_equal(rep.event_id, id_of(&d, "carol"));
    assert_true(strlen(rep.why) > 0);
    free_branches(&base, &a, &b);
    dag_free(&d);
}

static void test_an_event_of_another_room_is_refused(void **state)
{
    (void)state;
    dag d;
    dag_init(&d, room_version_find("10"));
    branch base = base_room(&d), a = fork_of(&base), b = fork_of(&base);
    const char *dave = join(&a, "dave", DAVE, 2000);
    join(&b, "erin", ERIN, 2000);
    json_object_set_new(find_id(&d, dave)->pdu, "room_id", json_string("!other:hs"));
    const state_map *states[] = {a.state, b.state};
    state_map *out;
    state_res_report rep;
    assert_int_equal(resolve_states(&d, states, 2, 0, &out, &rep), STATE_RES_E_BAD_EVENT);
    assert_string_equal(rep.event_id, dave);
    free_branches(&base, &a, &b);
    dag_free(&d);
}

/*
 * A: Alice names the room. B: Bob changes his display name DEEP_CHAIN_EVENTS times, each
 * citing the one before. B's auth chain holds the whole chain but its last link, so the
 * resolution must load base + name + the chain: more than a bound of 100 events, which
 * fails cleanly; with the default bound it resolves. Then: no power events; by mainline
 * order (all at position 0, under pl1) the chain in timestamp order, the name last; all
 * allowed, so Bob's key holds the chain's last event.
 */
static void test_a_deep_auth_chain_over_the_bound_fails_cleanly(void **state)
{
    (void)state;
    dag d;
    dag_init(&d, room_version_find("10"));
    branch base = base_room(&d), a = fork_of(&base), b = fork_of(&base);
    const char *name = emit(&a, "name", "m.room.name", "", ALICE, 9000000, "{\"name\":\"Room\"}");
    const char *last = NULL;
    for (int i = 0; i < DEEP_CHAIN_EVENTS; i++) {
        char n[32], content[96];
        snprintf(n, sizeof(n), "bob%d", i);
        snprintf(content, sizeof(content), "{\"membership\":\"join\",\"displayname\":\"Bob %d\"}", i);
        last = emit(&b, n, "m.room.member", BOB, BOB, 2000 + i, content);
    }
    const state_map *states[] = {a.state, b.state};
    state_map *out;
    state_res_report rep;
    assert_int_equal(resolve_states(&d, states, 2, 100, &out, &rep), STATE_RES_E_TOO_LARGE);
    assert_null(out);
    assert_int_equal(rep.events_loaded, 100);
    assert_string_equal(state_res_outcome_name(STATE_RES_E_TOO_LARGE), "too_large");
    d.loads = 0;
    assert_int_equal(resolve_states(&d, states, 2, 0, &out, &rep), STATE_RES_OK);
    assert_at(out, "m.room.member", BOB, last);
    assert_at(out, "m.room.name", "", name);
    assert_int_equal(rep.events_loaded, 8 + DEEP_CHAIN_EVENTS);
    assert_int_equal(d.loads, rep.events_loaded); /* each event asked for once */
    /* The name, Bob's base join and the whole chain. */
    assert_int_equal(rep.full_conflicted, 2 + DEEP_CHAIN_EVENTS);
    assert_int_equal(rep.auth_refused, 0);
    state_map_free(out);
    free_branches(&base, &a, &b);
    dag_free(&d);
}

static void test_more_states_than_the_bound_fail(void **state)
{
    (void)state;
    dag d;
    dag_init(&d, room_version_find("10"));
    branch base = base_room(&d);
    const state_map *states[STATE_RES_MAX_STATES + 1];
    for (size_t i = 0; i <= STATE_RES_MAX_STATES; i++) states[i] = base.state;
    state_map *out;
    state_res_report rep;
    assert_int_equal(resolve_states(&d, states, STATE_RES_MAX_STATES + 1, 0, &out, &rep),
                     STATE_RES_E_TOO_LARGE);
    assert_int_equal(resolve_states(&d, states, STATE_RES_MAX_STATES, 0, &out, &rep), STATE_RES_OK);
    assert_int_equal(state_map_count(out), 7);
    state_map_free(out);
    state_map_free(base.state);
    dag_free(&d);
}

/*
 * Room version 2's free event IDs let a hostile server send two power-levels events each
 * citing the other as an auth event. Both are in the full conflicted set and both are power
 * events, so the power ordering meets the cycle: a clean failure naming one of them, not a
 * loop. (The same DAG with a hash-derived ID cannot exist.)
 */
static void test_v2_an_auth_cycle_fails_cleanly(void **state)
{
    (void)state;
    dag d;
    dag_init(&d, v2());
    branch base = base_room(&d), a = fork_of(&base), b = fork_of(&base);
    const char *x = emit(&a, "x", "m.room.power_levels", "", ALICE, 2000, PL1_CONTENT);
    const char *y = emit(&b, "y", "m.room.power_levels", "", ALICE, 2001,
                         "{\"users\":{\"@alice:hs\":100}}");
    json_array_append_new(json_object_get(find_id(&d, x)->pdu, "auth_events"),
                          json_pack("[s,{s:s}]", y, "sha256", "AAAA"));
    json_array_append_new(json_object_get(find_id(&d, y)->pdu, "auth_events"),
                          json_pack("[s,{s:s}]", x, "sha256", "AAAA"));
    const state_map *states[] = {a.state, b.state};
    state_map *out;
    state_res_report rep;
    assert_int_equal(resolve_states(&d, states, 2, 0, &out, &rep), STATE_RES_E_BAD_EVENT);
    assert_null(out);
    assert_true(strcmp(rep.event_id, x) == 0 || strcmp(rep.event_id, y) == 0);
    assert_non_null(strstr(rep.why, "cycle"));
    free_branches(&base, &a, &b);
    dag_free(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_missing_event_is_reported_by_id),
        cmocka_unit_test(test_an_event_of_another_room_is_refused),
        cmocka_unit_test(test_a_deep_auth_chain_over_the_bound_fails_cleanly),
        cmocka_unit_test(test_more_states_than_the_bound_fail),
        cmocka_unit_test(test_v2_an_auth_cycle_fails_cleanly),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
