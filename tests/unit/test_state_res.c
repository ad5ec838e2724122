/*
 * tests/unit/test_state_res.c - state resolution v2 (room versions 2-11) and v1 (room
 * version 1) over DAGs built by hand from real PDUs (tests/unit/state_res_fixture.h): the
 * state map, the algorithm each room version chooses, the ban and demotion races,
 * concurrent joins, the tie-breaks of the reverse topological power ordering and of the
 * mainline ordering, a join rule change racing a join, unconflicted state passing
 * through, an event losing its auth, and rejected events. How a resolution fails (missing
 * and foreign events, the bounds, an auth cycle) is in test_state_res_failures.c.
 *
 * Every room starts from the same base (the fixture's base_room); forks are branches of
 * it. Each test derives its expected state by hand, step by step in its comment, from the
 * algorithm's definitions: the conflicted keys, each state's auth chain, the full
 * conflicted set, the power ordering, the iterative auth checks and the mainline ordering.
 */
#include "state_res_fixture.h"

/* ---- the state map ---------------------------------------------------------------------- */

static void test_state_map_sets_replaces_and_iterates_in_first_set_order(void **state)
{
    (void)state;
    state_map *m = state_map_new();
    char sk[32], id[32];
    for (int i = 0; i < 500; i++) {
        snprintf(sk, sizeof(sk), "@u%d:hs", i);
        snprintf(id, sizeof(id), "$e%d", i);
        assert_int_equal(state_map_set(m, "m.room.member", sk, id), 0);
    }
    assert_int_equal(state_map_set(m, "m.room.member", "@u7:hs", "$again"), 0);
    assert_int_equal(state_map_set(m, "m.room.member", "", "$empty-key"), 0);
    assert_int_equal(state_map_count(m), 501);
    assert_string_equal(state_map_get(m, "m.room.member", "@u7:hs"), "$again");
    assert_string_equal(state_map_get(m, "m.room.member", "@u499:hs"), "$e499");
    assert_string_equal(state_map_get(m, "m.room.member", ""), "$empty-key");
    assert_null(state_map_get(m, "m.room.membe", "r@u1:hs")); /* the pair, not the concatenation */
    assert_null(state_map_get(m, "m.room.topic", ""));
    const char *type, *key, *eid;
    assert_true(state_map_entry(m, 7, &type, &key, &eid));
    assert_string_equal(key, "@u7:hs");
    assert_string_equal(eid, "$again");
    assert_true(state_map_entry(m, 500, NULL, &key, NULL));
    assert_string_equal(key, "");
    assert_false(state_map_entry(m, 501, &type, &key, &eid));
    state_map *c = state_map_copy(m);
    state_map_free(m);
    assert_string_equal(state_map_get(c, "m.room.member", "@u7:hs"), "$again");
    assert_int_equal(state_map_count(c), 501);
    state_map_free(c);
}

static void test_room_versions_choose_their_algorithm(void **state)
{
    (void)state;
    assert_int_equal(state_res_algorithm_of(room_version_find("1")), STATE_RES_V1);
    /* Version 2 introduced state resolution v2; every later one up to 11 keeps it. */
    char id[12];
    for (int n = 2; n <= 11; n++) {
        snprintf(id, sizeof(id), "%d", n);
        assert_int_equal(state_res_algorithm_of(room_version_find(id)), STATE_RES_V2);
    }
    assert_int_equal(state_res_algorithm_of(NULL), STATE_RES_NONE);
    room_version v = {.id = "org.example.custom"}; /* no state_res: not one this module resolves */
    assert_int_equal(state_res_algorithm_of(&v), STATE_RES_NONE);
    const state_map *none[] = {NULL};
    state_res_request rq = {.version = &v, .states = none, .n_states = 0, .load = loader};
    state_map *out;
    state_res_report rep;
    assert_int_equal(state_res_resolve(&rq, &out, &rep), STATE_RES_E_VERSION);
    assert_null(out);
    assert_string_equal(state_res_outcome_name(STATE_RES_E_VERSION), "unsupported_version");
}

/* ---- v2: races -------------------------------------------------------------------------- */

/*
 * A: Alice demotes Bob to 0 (pl2). B: Bob, still a moderator there, bans Carol.
 * Conflicted: power levels {pl1, pl2}, Carol {carol, ban}. Auth chains: A's events cite
 * create, alice, pl1, jr, bob (via the topic); B's ban also cites carol, so the auth
 * difference is {carol}. Full conflicted set {pl1, pl2, carol, ban}; power events pl1, pl2,
 * ban, and the ban's auth chain adds carol (all four are ordered by power).
 * Order: pl1 (cites nothing in the set); then pl2 (Alice, 100) before carol (Carol, 0);
 * then the ban. Checks from the unconflicted state: pl1 allowed (creator, no earlier power
 * levels), pl2 allowed (Alice 100 lowers Bob from 50), carol allowed (public room), the ban
 * refused (Bob is at 0 under pl2, ban needs 50). The demotion wins.
 */
static void test_v2_demotion_beats_the_demoted_moderators_concurrent_ban(void **state)
{
    (void)state;
    dag d;
    dag_init(&d, room_version_find("10"));
    branch base = base_room(&d), a = fork_of(&base), b = fork_of(&base);
    const char *pl2 = emit(&a, "pl2", "m.room.power_levels", "", ALICE, 2000,
                           "{\"users\":{\"@alice:hs\":100,\"@bob:hs\":0},\"state_default\":50,"
                           "\"ban\":50,\"kick\":50,\"redact\":50,\"events_default\":0}");
    emit(&b, "ban", "m.room.member", CAROL, BOB, 2001, "{\"membership\":\"ban\"}");
    state_res_report rep;
    state_map *out = resolve2(&a, &b, &rep);
    assert_at(out, "m.room.power_levels", "", pl2);
    assert_at(out, "m.room.member", CAROL, id_of(&d, "carol"));
    assert_at(out, "m.room.member", BOB, id_of(&d, "bob"));
    assert_at(out, "m.room.topic", "", id_of(&d, "topic"));
    assert_int_equal(rep.algorithm, STATE_RES_V2);
    assert_int_equal(rep.conflicted_keys, 2);
    assert_int_equal(rep.full_conflicted, 4);
    assert_int_equal(rep.power_sorted, 4);
    assert_int_equal(rep.auth_checks, 4);
    assert_int_equal(rep.auth_refused, 1);
    state_map_free(out);
    free_branches(&base, &a, &b);
    dag_free(&d);
}

/*
 * A: Alice bans Bob. B: Bob raises Carol to 50 (pl3), within his level.
 * Conflicted: power levels {pl1, pl3}, Bob {bob, ban}. Both states' auth chains are
 * {create, alice, pl1, jr, bob} (bob via the ban in A, via the topic and pl3 in B): no auth
 * difference. Full conflicted set {pl1, pl3, bob, ban}; power events pl1, pl3, ban, whose
 * auth chains add bob. Order: pl1; then bob (the only one whose auth events are placed);
 * then the ban (Alice, 100) before pl3 (Bob, 50). Checks: pl1, bob's join, the ban allowed;
 * pl3 refused, its sender now banned: it loses its auth. Bob's topic, unconflicted, stays
 * although Bob could no longer send it.
 */
static void test_v2_ban_beats_the_banned_moderators_concurrent_power_change(void **state)
{
    (void)state;
    dag d;
    dag_init(&d, room_version_find("10"));
    branch base = base_room(&d), a = fork_of(&base), b = fork_of(&base);
    const char *ban = emit(&a, "ban", "m.room.member", BOB, ALICE, 2000, "{\"membership\":\"ban\"}");
    emit(&b, "pl3", "m.room.power_levels", "", BOB, 1999,
         "{\"users\":{\"@alice:hs\":100,\"@bob:hs\":50,\"@carol:hs\":50},\"users_default\":0,"
         "\"events\":{},\"events_default\":0,\"state_default\":50,\"ban\":50,\"kick\":50,"
         "\"redact\":50,\"invite\":0}");
    state_res_report rep;
    state_map *out = resolve2(&a, &b, &rep);
    assert_at(out, "m.room.power_levels", "", id_of(&d, "pl1"));
    assert_at(out, "m.room.member", BOB, ban);
    assert_at(out, "m.room.topic", "", id_of(&d, "topic"));
    assert_int_equal(rep.full_conflicted, 4);
    assert_int_equal(rep.power_sorted, 4);
    assert_int_equal(rep.auth_checks, 4);
    assert_int_equal(rep.auth_refused, 1);
    state_map_free(out);
    free_branches(&base, &a, &b);
    dag_free(&d);
}

/*
 * A: Alice names the room. B: Bob changes his display name (bob2), then bans Carol.
 * Conflicted: name {name}, Bob {bob, bob2}, Carol {carol, ban}. Auth chains: A {create,
 * alice, pl1, jr, bob}; B also bob2 and carol (the ban cites both): auth difference {bob2,
 * carol}. Power events: the ban; its auth chain through the set adds bob2, carol and bob.
 * Order: bob (Bob 50) before carol (0); then bob2 (50) before carol; then the ban. All four
 * allowed: Bob is joined at 50 when he bans. Then the name (mainline position 0 under pl1)
 * is allowed. Carol is banned.
 */
static void test_v2_ban_by_a_moderator_whose_membership_also_changed_stands(void **state)
{
    (void)state;
    dag d;
    dag_init(&d, room_version_find("11"));
    branch base = base_room(&d), a = fork_of(&base), b = fork_of(&base);
    const char *name = emit(&a, "name", "m.room.name", "", ALICE, 2000, "{\"name\":\"Room\"}");
    const char *bob2 = emit(&b, "bob2", "m.room.member", BOB, BOB, 2000,
                            "{\"membership\":\"join\",\"displayname\":\"Bob\"}");
    const char *ban = emit(&b, "ban", "m.room.member", CAROL, BOB, 2001, "{\"membership\":\"ban\"}");
    state_res_report rep;
    state_map *out = resolve2(&a, &b, &rep);
    assert_at(out, "m.room.member", CAROL, ban);
    assert_at(out, "m.room.member", BOB, bob2);
    assert_at(out, "m.room.name", "", name);
    assert_int_equal(rep.full_conflicted, 5);
    assert_int_equal(rep.power_sorted, 4);
    assert_int_equal(rep.auth_checks, 5);
    assert_int_equal(rep.auth_refused, 0);
    state_map_free(out);
    free_branches(&base, &a, &b);
    dag_free(&d);
}

/*
 * A: Alice makes the room invite-only (jr2). B: Dave joins under the public rule.
 * Conflicted: join rules {jr, jr2}, Dave {dave} (absent from A: a conflict in v2). No auth
 * difference (both chains {create, alice, pl1, jr, bob}). Power events jr and jr2, both
 * Alice's at 100: jr (ts 1003) then jr2 (ts 2000), both allowed: the rule is invite. Then
 * dave's join (not a power event) is checked under it and refused: Dave was never invited.
 */
static void test_v2_join_rule_change_beats_a_concurrent_join(void **state)
{
    (void)state;
    dag d;
    dag_init(&d, room_version_find("10"));
    branch base = base_room(&d), a = fork_of(&base), b = fork_of(&base);
    const char *jr2 = emit(&a, "jr2", "m.room.join_rules", "", ALICE, 2000, "{\"join_rule\":\"invite\"}");
    join(&b, "dave", DAVE, 2000);
    state_res_report rep;
    state_map *out = resolve2(&a, &b, &rep);
    assert_at(out, "m.room.join_rules", "", jr2);
    assert_at(out, "m.room.member", DAVE, NULL);
    assert_int_equal(rep.full_conflicted, 3);
    assert_int_equal(rep.power_sorted, 2);
    assert_int_equal(rep.auth_refused, 1);
    state_map_free(out);
    free_branches(&base, &a, &b);
    dag_free(&d);
}

/*
 * A: Dave joins, then changes his display name at ts 2100 (dave_a). B: Erin joins, and
 * Dave joins with another display name at ts 2050 (dave_b). Conflicted: Dave {dave_a,
 * dave_b}, Erin {erin}. No power events: everything goes by mainline order, all at position
 * 0 (they cite pl1), so by timestamp; each is allowed (public room), so the later of Dave's
 * two (dave_a, ts 2100) is applied last and holds his key, and Erin is joined too.
 */
static void test_v2_concurrent_joins_all_land_and_the_later_of_two_holds_the_key(void **state)
{
    (void)state;
    dag d;
    dag_init(&d, room_version_find("10"));
    branch base = base_room(&d), a = fork_of(&base), b = fork_of(&base);
    join(&a, "dave", DAVE, 2000);
    const char *dave_a = emit(&a, "dave_a", "m.room.member", DAVE, DAVE, 2100,
                              "{\"membership\":\"join\",\"displayname\":\"A\"}");
    const char *erin = join(&b, "erin", ERIN, 2000);
    emit(&b, "dave_b", "m.room.member", DAVE, DAVE, 2050,
         "{\"membership\":\"join\",\"displayname\":\"B\"}");
    state_res_report rep;
    state_map *out = resolve2(&a, &b, &rep);
    assert_at(out, "m.room.member", DAVE, dave_a);
    assert_at(out, "m.room.member", ERIN, erin);
    assert_int_equal(rep.power_sorted, 0);
    assert_int_equal(rep.auth_refused, 0);
    state_map_free(out);
    free_branches(&base, &a, &b);
    dag_free(&d);
}

/*
 * The auth events fill in what the partial state lacks. A: Alice makes the room
 * invite-only (jr2). B: Dave joins, then changes his display name (dave2). Conflicted: join
 * rules {jr, jr2}, Dave {dave2}; auth difference {dave} (cited by dave2, in B's chain
 * only). Power order jr, jr2: the rule is invite. Mainline order (both at position 0,
 * under pl1): dave (ts 2000), refused, Dave was not invited; then dave2 (ts 2001): the
 * state has no membership of Dave's, so the rules read the one among dave2's auth events,
 * dave's join, and a join over a join is allowed. Dave ends joined, by his second event.
 */
static void test_v2_auth_events_answer_for_keys_the_partial_state_lacks(void **state)
{
    (void)state;
    dag d;
    dag_init(&d, room_version_find("10"));
    branch base = base_room(&d), a = fork_of(&base), b = fork_of(&base);
    const char *jr2 = emit(&a, "jr2", "m.room.join_rules", "", ALICE, 2000, "{\"join_rule\":\"invite\"}");
    join(&b, "dave", DAVE, 2000);
    const char *dave2 = emit(&b, "dave2", "m.room.member", DAVE, DAVE, 2001,
                             "{\"membership\":\"join\",\"displayname\":\"D\"}");
    state_res_report rep;
    state_map *out = resolve2(&a, &b, &rep);
    assert_at(out, "m.room.join_rules", "", jr2);
    assert_at(out, "m.room.member", DAVE, dave2);
    assert_int_equal(rep.full_conflicted, 4);
    assert_int_equal(rep.auth_checks, 4);
    assert_int_equal(rep.auth_refused, 1);
    state_map_free(out);
    free_branches(&base, &a, &b);
    dag_free(&d);
}

/*
 * A: Alice bans Dave, who never joined. B: Dave joins. Conflicted: Dave {ban, dave} (no
 * auth difference: neither cites anything the other state's chain lacks). Power order:
 * the ban (Alice bans someone else), allowed. Then Dave's join is checked with the
 * partial state's membership of Dave, the ban, although the join's own auth events hold
 * no membership of his: refused. The same in room version 1 (the pass over Dave's key
 * takes either first and the other cannot displace a ban, or the ban displaces the join).
 */
static void test_a_ban_beats_a_concurrent_first_join_in_v2_and_v1(void **state)
{
    (void)state;
    const room_version *versions[] = {room_version_find("10"), v1()};
    for (size_t i = 0; i < 2; i++) {
        dag d;
        dag_init(&d, versions[i]);
        branch base = base_room(&d), a = fork_of(&base), b = fork_of(&base);
        const char *ban = emit(&a, "ban", "m.room.member", DAVE, ALICE, 2000, "{\"membership\":\"ban\"}");
        join(&b, "dave", DAVE, 2000);
        state_res_report rep;
        state_map *out = resolve2(&a, &b, &rep);
        assert_at(out, "m.room.member", DAVE, ban);
        if (i == 0) {
            assert_int_equal(rep.full_conflicted, 2);
            assert_int_equal(rep.power_sorted, 1);
            assert_int_equal(rep.auth_checks, 2);
            assert_int_equal(rep.auth_refused, 1);
        }
        state_map_free(out);
        free_branches(&base, &a, &b);
        dag_free(&d);
    }
}

/* Three forks, one join each: three states in, every join allowed (public room, nothing
 * conflicting but the three new keys), all three members out. */
static void test_v2_three_states_resolve_at_once(void **state)
{
    (void)state;
    dag d;
    dag_init(&d, room_version_find("10"));
    branch base = base_room(&d), a = fork_of(&base), b = fork_of(&base), c = fork_of(&base);
    const char *dave = join(&a, "dave", DAVE, 2000);
    const char *erin = join(&b, "erin", ERIN, 2000);
    const char *frank = join(&c, "frank", "@frank:hs", 2000);
    const state_map *states[] = {a.state, b.state, c.state};
    state_map *out;
    state_res_report rep;
    assert_int_equal(resolve_states(&d, states, 3, 0, &out, &rep), STATE_RES_OK);
    assert_at(out, "m.room.member", DAVE, dave);
    assert_at(out, "m.room.member", ERIN, erin);
    assert_at(out, "m.room.member", "@frank:hs", frank);
    assert_int_equal(state_map_count(out), 10);
    assert_int_equal(rep.conflicted_keys, 3);
    state_map_free(out);
    free_branches(&base, &a, &b);
    state_map_free(c.state);
    dag_free(&d);
}

/* ---- v2: tie-breaks --------------------------------------------------------------------- */

/*
 * Two join-rule changes, neither citing anything of the other's: the full conflicted set
 * is just {x, y} (jr is in neither state but in both auth chains). Both are allowed
 * whatever the order, so the one ordered last holds the key: the order is visible in the
 * result. Returns the resolved join rules' event ID.
 */
static const char *race_join_rules(dag *d, const char *sender_x, int64_t ts_x,
                                   const char *sender_y, int64_t ts_y, const char **idx,
                                   const char **idy, state_map **out)
{
    branch base = base_room(d), a = fork_of(&base), b = fork_of(&base);
    *idx = emit(&a, "x", "m.room.join_rules", "", sender_x, ts_x, "{\"join_rule\":\"invite\"}");
    *idy = emit(&b, "y", "m.room.join_rules", "", sender_y, ts_y, "{\"join_rule\":\"knock\"}");
    state_res_report rep;
    *out = resolve2(&a, &b, &rep);
    assert_int_equal(rep.full_conflicted, 2);
    assert_int_equal(rep.power_sorted, 2);
    assert_int_equal(rep.auth_refused, 0);
    free_branches(&base, &a, &b);
    return state_map_get(*out, "m.room.join_rules", "");
}

static void test_v2_power_order_puts_the_more_powerful_sender_first(void **state)
{
    (void)state;
    dag d;
    dag_init(&d, room_version_find("10"));
    const char *x, *y;
    state_map *out;
    /* x: Alice (100) at ts 3000; y: Bob (50) at ts 2000. Power first: x, then y, so y
     * holds the key although it is older. */
    const char *got = race_join_rules(&d, ALICE, 3000, BOB, 2000, &x, &y, &out);
    assert_string_equal(got, y);
    state_map_free(out);
    dag_free(&d);
}

static void test_v2_power_order_breaks_equal_power_by_timestamp(void **state)
{
    (void)state;
    dag d;
    dag_init(&d, room_version_find("10"));
    const char *x, *y;
    state_map *out;
    /* Both Alice's: y (ts 2000) before x (ts 3000): x holds the key. */
    const char *got = race_join_rules(&d, ALICE, 3000, ALICE, 2000, &x, &y, &out);
    assert_string_equal(got, x);
    state_map_free(out);
    dag_free(&d);
}

static void test_v2_power_order_breaks_equal_timestamps_by_event_id(void **state)
{
    (void)state;
    dag d;
    dag_init(&d, room_version_find("10"));
    const char *x, *y;
    state_map *out;
    /* Both Alice's at ts 3000: the smaller event ID first, the greater holds the key. */
    const char *got = race_join_rules(&d, ALICE, 3000, ALICE, 3000, &x, &y, &out);
    assert_string_equal(got, strcmp(x, y) < 0 ? y : x);
    state_map_free(out);
    dag_free(&d);
}

/*
 * A: Bob sets the topic at ts 5000 (topic_a, citing pl1). B: Alice gives Carol 10 (pl2),
 * then Bob sets the topic at ts 3000 (topic_b, citing pl2). Conflicted: power levels {pl1,
 * pl2}, topic {topic_a, topic_b}; auth difference {pl2} (only B's chain has it). Power
 * order pl1, pl2, both allowed: pl2 is the resolved power levels, mainline [pl2, pl1].
 * topic_a sits at position 1 (its power levels pl1), topic_b at 0: topic_a comes first
 * despite its later timestamp, both are allowed, topic_b holds the key.
 */
static void test_v2_mainline_position_orders_before_timestamp(void **state)
{
    (void)state;
    dag d;
    dag_init(&d, room_version_find("10"));
    branch base = base_room(&d), a = fork_of(&base), b = fork_of(&base);
    emit(&a, "topic_a", "m.room.topic", "", BOB, 5000, "{\"topic\":\"A\"}");
    const char *pl2 = emit(&b, "pl2", "m.room.power_levels", "", ALICE, 2000,
                           "{\"users\":{\"@alice:hs\":100,\"@bob:hs\":50,\"@carol:hs\":10},"
                           "\"state_default\":50,\"ban\":50,\"kick\":50,\"redact\":50}");
    const char *topic_b = emit(&b, "topic_b", "m.room.topic", "", BOB, 3000, "{\"topic\":\"B\"}");
    state_res_report rep;
    state_map *out = resolve2(&a, &b, &rep);
    assert_at(out, "m.room.power_levels", "", pl2);
    assert_at(out, "m.room.topic", "", topic_b);
    assert_int_equal(rep.full_conflicted, 4);
    assert_int_equal(rep.power_sorted, 2);
    assert_int_equal(rep.auth_checks, 4);
    state_map_free(out);
    free_branches(&base, &a, &b);
    dag_free(&d);
}

/* ---- v2: what passes through, what is left out ---------------------------------------- */

/*
 * A: Alice demotes Bob (pl2). B: Dave joins. Bob's topic is in both states: unconflicted,
 * it is in the result as it is, though under pl2 Bob could not set it, and it is never
 * checked (it is in no auth chain, so not in the auth difference).
 */
static void test_v2_unconflicted_state_passes_through_unchecked(void **state)
{
    (void)state;
    dag d;
    dag_init(&d, room_version_find("10"));
    branch base = base_room(&d), a = fork_of(&base), b = fork_of(&base);
    const char *pl2 = emit(&a, "pl2", "m.room.power_levels", "", ALICE, 2000,
                           "{\"users\":{\"@alice:hs\":100},\"state_default\":50}");
    const char *dave = join(&b, "dave", DAVE, 2000);
    state_res_report rep;
    state_map *out = resolve2(&a, &b, &rep);
    assert_at(out, "m.room.power_levels", "", pl2);
    assert_at(out, "m.room.member", DAVE, dave);
    assert_at(out, "m.room.topic", "", id_of(&d, "topic"));
    assert_at(out, "m.room.member", BOB, id_of(&d, "bob"));
    assert_int_equal(state_map_count(out), 8);
    /* Conflicted pl1, pl2 and dave: three checks, none of them the topic. */
    assert_int_equal(rep.auth_checks, 3);
    state_map_free(out);
    free_branches(&base, &a, &b);
    dag_free(&d);
}

/* Concurrent joins as above, but this server rejected Erin's join: it stays out. */
static void test_v2_rejected_events_are_not_admitted(void **state)
{
    (void)state;
    dag d;
    dag_init(&d, room_version_find("10"));
    branch base = base_room(&d), a = fork_of(&base), b = fork_of(&base);
    const char *dave = join(&a, "dave", DAVE, 2000);
    join(&b, "erin", ERIN, 2000);
    find_id(&d, id_of(&d, "erin"))->rejected = true;
    state_res_report rep;
    state_map *out = resolve2(&a, &b, &rep);
    assert_at(out, "m.room.member", DAVE, dave);
    assert_at(out, "m.room.member", ERIN, NULL);
    state_map_free(out);
    free_branches(&base, &a, &b);
    dag_free(&d);
}

static void test_states_that_agree_resolve_to_themselves_without_walking_auth(void **state)
{
    (void)state;
    dag d;
    dag_init(&d, room_version_find("10"));
    branch base = base_room(&d), a = fork_of(&base);
    emit(&a, "msg", "m.room.message", NULL, BOB, 2000, "{\"body\":\"hi\"}");
    state_res_report rep;
    state_map *out = resolve2(&base, &a, &rep);
    assert_int_equal(state_map_count(out), 7);
    assert_at(out, "m.room.power_levels", "", id_of(&d, "pl1"));
    assert_int_equal(rep.conflicted_keys, 0);
    assert_int_equal(rep.events_loaded, 0);
    state_map_free(out);
    state_map_free(base.state);
    state_map_free(a.state);
    dag_free(&d);
}

/* ---- v1 --------------------------------------------------------------------------------- */

/*
 * The race of test_v2_ban_beats_the_banned_moderators_concurrent_power_change, in room
 * version 1. Conflicted: power levels {pl1 (depth 3), pl3 (depth 8)}, Bob {bob (depth 5),
 * ban (depth 8)}. Power levels pass: pl1 first, then pl3 checked in R, where Bob's
 * membership (conflicted) is absent: refused, pl1 stays. Members pass: bob first, then the
 * ban, allowed under pl1 with Bob joined: banned. The same answer as v2.
 */
static void test_v1_ban_beats_the_banned_moderators_power_change_as_in_v2(void **state)
{
    (void)state;
    dag d;
    dag_init(&d, v1());
    branch base = base_room(&d), a = fork_of(&base), b = fork_of(&base);
    const char *ban = emit(&a, "ban", "m.room.member", BOB, ALICE, 2000, "{\"membership\":\"ban\"}");
    emit(&b, "pl3", "m.room.power_levels", "", BOB, 1999,
         "{\"users\":{\"@alice:hs\":100,\"@bob:hs\":50,\"@carol:hs\":50},\"state_default\":50,"
         "\"ban\":50,\"kick\":50,\"redact\":50}");
    state_res_report rep;
    state_map *out = resolve2(&a, &b, &rep);
    assert_int_equal(rep.algorithm, STATE_RES_V1);
    assert_at(out, "m.room.power_levels", "", id_of(&d, "pl1"));
    assert_at(out, "m.room.member", BOB, ban);
    assert_int_equal(rep.auth_checks, 2);
    assert_int_equal(rep.auth_refused, 1);
    state_map_free(out);
    free_branches(&base, &a, &b);
    dag_free(&d);
}

/*
 * The race of test_v2_ban_by_a_moderator_whose_membership_also_changed_stands, in room
 * version 1: v1 differs. The name is in A only: one event ID, so unconflicted in v1.
 * Members pass, each key against R before the pass: Bob {bob (depth 5), bob2 (depth 8)}:
 * bob2 allowed; Carol {carol (depth 6), ban (depth 9)}: the ban is checked in R, where
 * Bob's membership, still conflicted, is absent: refused. Carol stays joined.
 */
static void test_v1_loses_the_ban_of_a_moderator_whose_membership_also_changed(void **state)
{
    (void)state;
    dag d;
    dag_init(&d, v1());
    branch base = base_room(&d), a = fork_of(&base), b = fork_of(&base);
    const char *name = emit(&a, "name", "m.room.name", "", ALICE, 2000, "{\"name\":\"Room\"}");
    const char *bob2 = emit(&b, "bob2", "m.room.member", BOB, BOB, 2000,
                            "{\"membership\":\"join\",\"displayname\":\"Bob\"}");
    emit(&b, "ban", "m.room.member", CAROL, BOB, 2001, "{\"membership\":\"ban\"}");
    state_res_report rep;
    state_map *out = resolve2(&a, &b, &rep);
    assert_at(out, "m.room.member", CAROL, id_of(&d, "carol"));
    assert_at(out, "m.room.member", BOB, bob2);
    assert_at(out, "m.room.name", "", name);
    assert_int_equal(rep.conflicted_keys, 2);
    state_map_free(out);
    free_branches(&base, &a, &b);
    dag_free(&d);
}

/*
 * The race of test_v2_join_rule_change_beats_a_concurrent_join, in room version 1: Dave's
 * key is in B only, so unconflicted: his join is in the result unchecked, next to the
 * invite-only rule (jr at depth 4, then jr2 at depth 8, allowed).
 */
static void test_v1_keeps_a_join_that_raced_a_join_rule_change(void **state)
{
    (void)state;
    dag d;
    dag_init(&d, v1());
    branch base = base_room(&d), a = fork_of(&base), b = fork_of(&base);
    const char *jr2 = emit(&a, "jr2", "m.room.join_rules", "", ALICE, 2000, "{\"join_rule\":\"invite\"}");
    const char *dave = join(&b, "dave", DAVE, 2000);
    state_res_report rep;
    state_map *out = resolve2(&a, &b, &rep);
    assert_at(out, "m.room.join_rules", "", jr2);
    assert_at(out, "m.room.member", DAVE, dave);
    assert_int_equal(rep.conflicted_keys, 1);
    state_map_free(out);
    free_branches(&base, &a, &b);
    dag_free(&d);
}

/*
 * Other keys in v1: the event of greatest depth that the rules allow. A: Bob sets the topic
 * (depth 8). B: Alice names the room, then sets the topic (depth 9). Carol's topic is not
 * possible (state_default 50), so both are allowed and the deeper one, Alice's, wins,
 * whatever the timestamps say (Bob's is later).
 */
static void test_v1_other_keys_take_the_deepest_allowed_event(void **state)
{
    (void)state;
    dag d;
    dag_init(&d, v1());
    branch base = base_room(&d), a = fork_of(&base), b = fork_of(&base);
    emit(&a, "topic_a", "m.room.topic", "", BOB, 9000, "{\"topic\":\"A\"}");
    emit(&b, "name", "m.room.name", "", ALICE, 2000, "{\"name\":\"Room\"}");
    const char *topic_b = emit(&b, "topic_b", "m.room.topic", "", ALICE, 2001, "{\"topic\":\"B\"}");
    state_res_report rep;
    state_map *out = resolve2(&a, &b, &rep);
    assert_at(out, "m.room.topic", "", topic_b);
    state_map_free(out);
    free_branches(&base, &a, &b);
    dag_free(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_state_map_sets_replaces_and_iterates_in_first_set_order),
        cmocka_unit_test(test_room_versions_choose_their_algorithm),
        cmocka_unit_test(test_v2_demotion_beats_the_demoted_moderators_concurrent_ban),
        cmocka_unit_test(test_v2_ban_beats_the_banned_moderators_concurrent_power_change),
        cmocka_unit_test(test_v2_ban_by_a_moderator_whose_membership_also_changed_stands),
        cmocka_unit_test(test_v2_join_rule_change_beats_a_concurrent_join),
        cmocka_unit_test(test_v2_concurrent_joins_all_land_and_the_later_of_two_holds_the_key),
        cmocka_unit_test(test_v2_auth_events_answer_for_keys_the_partial_state_lacks),
        cmocka_unit_test(test_a_ban_beats_a_concurrent_first_join_in_v2_and_v1),
        cmocka_unit_test(test_v2_three_states_resolve_at_once),
        cmocka_unit_test(test_v2_power_order_puts_the_more_powerful_sender_first),
        cmocka_unit_test(test_v2_power_order_breaks_equal_power_by_timestamp),
        cmocka_unit_test(test_v2_power_order_breaks_equal_timestamps_by_event_id),
        cmocka_unit_test(test_v2_mainline_position_orders_before_timestamp),
        cmocka_unit_test(test_v2_unconflicted_state_passes_through_unchecked),
        cmocka_unit_test(test_v2_rejected_events_are_not_admitted),
        cmocka_unit_test(test_states_that_agree_resolve_to_themselves_without_walking_auth),
        cmocka_unit_test(test_v1_ban_beats_the_banned_moderators_power_change_as_in_v2),
        cmocka_unit_test(test_v1_loses_the_ban_of_a_moderator_whose_membership_also_changed),
        cmocka_unit_test(test_v1_keeps_a_join_that_raced_a_join_rule_change),
        cmocka_unit_test(test_v1_other_keys_take_the_deepest_allowed_event),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
