/*
 * tests/unit/test_room_auth.c - the authorization rules of room versions 10 and 11:
 * membership transitions, the sender's membership, event and state levels, user-named
 * state keys, power-level changes, and redaction rights.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "core/rooms/room_auth.h"

#define ALICE "@alice:hs" /* creator, level 100 */
#define BOB "@bob:hs"     /* moderator, level 50 */
#define CAROL "@carol:hs" /* plain member */
#define DAVE "@dave:hs"   /* outsider */

typedef struct fixture {
    json_t *create, *pl, *jr;
    room_auth_state st;
} fixture;

static json_t *parse(const char *text)
{
    json_error_t err;
    json_t *j = json_loads(text, 0, &err);
    if (!j) fail_msg("bad test JSON: %s", err.text);
    return j;
}

static void setup_room(fixture *f, const char *version, const char *join_rule)
{
    memset(f, 0, sizeof(*f));
    f->create = json_pack("{s:s, s:s, s:{s:s, s:s}}", "type", "m.room.create", "sender", ALICE,
                          "content", "creator", ALICE, "room_version", version);
    f->pl = parse("{\"users\":{\"@alice:hs\":100,\"@bob:hs\":50},\"users_default\":0,"
                  "\"events\":{\"m.room.name\":50,\"m.room.power_levels\":100},"
                  "\"events_default\":0,\"state_default\":50,\"ban\":50,\"kick\":50,"
                  "\"redact\":50,\"invite\":0}");
    f->jr = json_pack("{s:s}", "join_rule", join_rule);
    f->st.version = room_version_find(version);
    f->st.create = f->create;
    f->st.power_levels = f->pl;
    f->st.join_rules = f->jr;
}

static void teardown_room(fixture *f)
{
    json_decref(f->create);
    json_decref(f->pl);
    json_decref(f->jr);
}

static bool member(fixture *f, const char *sender, const char *target, const char *membership,
                   const char *sender_m, const char *target_m)
{
    f->st.sender_membership = sender_m;
    f->st.target_membership = target_m;
    json_t *content = json_pack("{s:s}", "membership", membership);
    char why[ROOM_AUTH_WHY_LEN];
    bool ok = room_auth_allows(&f->st, "m.room.member", target, sender, content, why);
    if (!ok) assert_true(strlen(why) > 0);
    json_decref(content);
    return ok;
}

static bool send(fixture *f, const char *sender, const char *sender_m, const char *type,
                 const char *state_key, const char *content_text)
{
    f->st.sender_membership = sender_m;
    json_t *content = parse(content_text);
    char why[ROOM_AUTH_WHY_LEN];
    bool ok = room_auth_allows(&f->st, type, state_key, sender, content, why);
    json_decref(content);
    return ok;
}

static void test_creator_joins_the_room_that_holds_only_its_create_event(void **state)
{
    (void)state;
    fixture f;
    setup_room(&f, "10", "invite");
    f.st.power_levels = NULL;
    f.st.join_rules = NULL;
    f.st.only_create = true;
    assert_true(member(&f, ALICE, ALICE, "join", NULL, NULL));
    assert_false(member(&f, DAVE, DAVE, "join", NULL, NULL));
    f.st.only_create = false;
    assert_false(member(&f, ALICE, ALICE, "join", NULL, NULL)); /* no join rule yet */
    teardown_room(&f);
}

static void test_join_rules_public_and_invite(void **state)
{
    (void)state;
    fixture f;
    setup_room(&f, "10", "public");
    assert_true(member(&f, DAVE, DAVE, "join", NULL, NULL));
    assert_false(member(&f, DAVE, DAVE, "join", NULL, "ban"));
    assert_false(member(&f, ALICE, DAVE, "join", "join", NULL)); /* nobody joins someone else */
    teardown_room(&f);
    setup_room(&f, "10", "invite");
    assert_false(member(&f, DAVE, DAVE, "join", NULL, NULL));
    assert_false(member(&f, DAVE, DAVE, "join", NULL, "leave"));
    assert_true(member(&f, DAVE, DAVE, "join", NULL, "invite"));
    assert_true(member(&f, CAROL, CAROL, "join", "join", "join")); /* profile change */
    teardown_room(&f);
}

static void test_invite_needs_a_joined_sender_with_the_invite_level(void **state)
{
    (void)state;
    fixture f;
    setup_room(&f, "10", "invite");
    assert_true(member(&f, CAROL, DAVE, "invite", "join", NULL));
    assert_false(member(&f, CAROL, DAVE, "invite", "leave", NULL));
    assert_false(member(&f, CAROL, BOB, "invite", "join", "join"));
    assert_false(member(&f, CAROL, DAVE, "invite", "join", "ban"));
    json_object_set_new(f.pl, "invite", json_integer(50));
    assert_false(member(&f, CAROL, DAVE, "invite", "join", NULL));
    assert_true(member(&f, BOB, DAVE, "invite", "join", NULL));
    teardown_room(&f);
}

static void test_leave_kick_ban_and_unban_follow_levels(void **state)
{
    (void)state;
    fixture f;
    setup_room(&f, "10", "invite");
    /* Leaving oneself: from join or invite (rejecting), not from nothing. */
    assert_true(member(&f, CAROL, CAROL, "leave", "join", "join"));
    assert_true(member(&f, DAVE, DAVE, "leave", "invite", "invite"));
    assert_false(member(&f, DAVE, DAVE, "leave", NULL, NULL));
    /* Kick: kick level and above the target. */
    assert_true(member(&f, BOB, CAROL, "leave", "join", "join"));
    assert_false(member(&f, CAROL, BOB, "leave", "join", "join"));
    assert_false(member(&f, BOB, ALICE, "leave", "join", "join"));
    assert_false(member(&f, BOB, CAROL, "leave", "leave", "join")); /* kicker not in room */
    /* Ban: ban level and above the target. */
    assert_true(member(&f, BOB, CAROL, "ban", "join", "join"));
    assert_true(member(&f, BOB, DAVE, "ban", "join", NULL));
    assert_false(member(&f, CAROL, DAVE, "ban", "join", NULL));
    assert_false(member(&f, BOB, ALICE, "ban", "join", "join"));
    /* Unban (leave over ban): ban level needed. */
    assert_true(member(&f, BOB, DAVE, "leave", "join", "ban"));
    assert_false(member(&f, CAROL, DAVE, "leave", "join", "ban"));
    /* A banned user cannot leave by themselves into a rejoinable state. */
    assert_false(member(&f, DAVE, DAVE, "leave", "ban", "ban"));
    teardown_room(&f);
}

static void test_membership_events_need_a_user_state_key_and_a_known_membership(void **state)
{
    (void)state;
    fixture f;
    setup_room(&f, "10", "public");
    assert_false(member(&f, DAVE, "not-a-user", "join", NULL, NULL));
    assert_false(member(&f, DAVE, DAVE, "dance", NULL, NULL));
    assert_false(member(&f, DAVE, DAVE, "knock", NULL, NULL)); /* join rule is not knock */
    teardown_room(&f);
    setup_room(&f, "10", "knock");
    assert_true(member(&f, DAVE, DAVE, "knock", NULL, NULL));
    teardown_room(&f);
}

static void test_events_need_a_joined_sender_and_the_type_level(void **state)
{
    (void)state;
    fixture f;
    setup_room(&f, "10", "invite");
    assert_true(send(&f, CAROL, "join", "m.room.message", NULL, "{\"body\":\"hi\"}"));
    assert_false(send(&f, DAVE, NULL, "m.room.message", NULL, "{\"body\":\"hi\"}"));
    assert_false(send(&f, CAROL, "invite", "m.room.message", NULL, "{\"body\":\"hi\"}"));
    /* State: state_default 50, m.room.name 50, power levels 100. */
    assert_false(send(&f, CAROL, "join", "m.room.topic", "", "{\"topic\":\"t\"}"));
    assert_true(send(&f, BOB, "join", "m.room.topic", "", "{\"topic\":\"t\"}"));
    assert_true(send(&f, BOB, "join", "m.room.name", "", "{\"name\":\"n\"}"));
    json_object_set_new(f.pl, "events_default", json_integer(10));
    assert_false(send(&f, CAROL, "join", "m.room.message", NULL, "{\"body\":\"hi\"}"));
    teardown_room(&f);
}

static void test_state_keys_naming_a_user_belong_to_that_user(void **state)
{
    (void)state;
    fixture f;
    setup_room(&f, "10", "invite");
    json_object_set_new(f.pl, "state_default", json_integer(0));
    assert_true(send(&f, CAROL, "join", "org.example.s", CAROL, "{}"));
    assert_false(send(&f, CAROL, "join", "org.example.s", BOB, "{}"));
    assert_false(send(&f, ALICE, "join", "org.example.s", BOB, "{}"));
    teardown_room(&f);
}

/* A power-levels content: users as given, Bob-editable levels otherwise; `kick` and the
 * m.room.name level vary. */
static const char *pl_content(char *buf, size_t len, const char *users, int kick, int name_level)
{
    snprintf(buf, len,
             "{\"users\":%s,\"users_default\":0,\"events\":{\"m.room.name\":%d,"
             "\"m.room.power_levels\":50},\"events_default\":0,\"state_default\":50,\"ban\":50,"
             "\"kick\":%d,\"redact\":50,\"invite\":0}",
             users, name_level, kick);
    return buf;
}

static void test_power_level_changes_stay_within_the_senders_level(void **state)
{
    (void)state;
    fixture f;
    setup_room(&f, "10", "invite");
    json_object_set_new(json_object_get(f.pl, "events"), "m.room.power_levels", json_integer(50));
    char b[1024];
    const char *pl = "m.room.power_levels";
    /* Bob (50) may raise Carol to 50, not to 51, and may not touch Alice (100). */
    assert_true(send(&f, BOB, "join", pl, "", pl_content(b, sizeof(b), "{\"@alice:hs\":100,\"@bob:hs\":50,\"@carol:hs\":50}", 50, 50)));
    assert_false(send(&f, BOB, "join", pl, "", pl_content(b, sizeof(b), "{\"@alice:hs\":100,\"@bob:hs\":50,\"@carol:hs\":51}", 50, 50)));
    assert_false(send(&f, BOB, "join", pl, "", pl_content(b, sizeof(b), "{\"@alice:hs\":40,\"@bob:hs\":50}", 50, 50)));
    assert_false(send(&f, BOB, "join", pl, "", pl_content(b, sizeof(b), "{\"@bob:hs\":50}", 50, 50)));
    /* Bob may not raise himself, but may demote himself. */
    assert_false(send(&f, BOB, "join", pl, "", pl_content(b, sizeof(b), "{\"@alice:hs\":100,\"@bob:hs\":60}", 50, 50)));
    assert_true(send(&f, BOB, "join", pl, "", pl_content(b, sizeof(b), "{\"@alice:hs\":100,\"@bob:hs\":10}", 50, 50)));
    /* Top-level and per-event levels: the new value may not exceed Bob's... */
    assert_false(send(&f, BOB, "join", pl, "", pl_content(b, sizeof(b), "{\"@alice:hs\":100,\"@bob:hs\":50}", 60, 50)));
    assert_false(send(&f, BOB, "join", pl, "", pl_content(b, sizeof(b), "{\"@alice:hs\":100,\"@bob:hs\":50}", 50, 60)));
    assert_true(send(&f, BOB, "join", pl, "", pl_content(b, sizeof(b), "{\"@alice:hs\":100,\"@bob:hs\":50}", 40, 40)));
    /* ...nor may the old one. */
    json_object_set_new(f.pl, "kick", json_integer(70));
    assert_false(send(&f, BOB, "join", pl, "", pl_content(b, sizeof(b), "{\"@alice:hs\":100,\"@bob:hs\":50}", 50, 50)));
    json_object_set_new(f.pl, "kick", json_integer(50));
    /* Another user at Bob's own level cannot be changed by Bob. */
    json_object_set_new(json_object_get(f.pl, "users"), CAROL, json_integer(50));
    assert_false(send(&f, BOB, "join", pl, "", pl_content(b, sizeof(b), "{\"@alice:hs\":100,\"@bob:hs\":50,\"@carol:hs\":0}", 50, 50)));
    /* v10: levels must be integers, users keys user IDs. */
    assert_false(send(&f, ALICE, "join", pl, "", "{\"users\":{\"@alice:hs\":100},\"ban\":\"50\"}"));
    assert_false(send(&f, ALICE, "join", pl, "", "{\"users\":{\"@alice:hs\":\"100\"}}"));
    /* The local write path refuses new string levels in older versions too (which accept
     * them from other servers: test_room_auth_versions.c). */
    f.st.version = room_version_find("5");
    assert_false(send(&f, ALICE, "join", pl, "", "{\"users\":{\"@alice:hs\":100},\"ban\":\"50\"}"));
    assert_false(send(&f, ALICE, "join", pl, "", "{\"users\":{\"@alice:hs\":\"100\"}}"));
    assert_true(send(&f, ALICE, "join", pl, "", "{\"users\":{\"@alice:hs\":100},\"ban\":50}"));
    f.st.version = room_version_find("10");
    assert_false(send(&f, ALICE, "join", pl, "", "{\"users\":{\"alice\":100}}"));
    /* Carol (0) lacks the level m.room.power_levels needs (50). */
    json_object_set_new(json_object_get(f.pl, "users"), CAROL, json_integer(0));
    assert_false(send(&f, CAROL, "join", pl, "", pl_content(b, sizeof(b), "{\"@alice:hs\":100,\"@bob:hs\":50,\"@carol:hs\":0}", 50, 50)));
    teardown_room(&f);
}

static void test_without_power_levels_the_creator_has_100_and_state_needs_0(void **state)
{
    (void)state;
    fixture f;
    setup_room(&f, "11", "public");
    f.st.power_levels = NULL;
    /* v11: the creator is the create event's sender. */
    json_object_del(json_object_get(f.create, "content"), "creator");
    assert_string_equal(room_auth_creator(&f.st), ALICE);
    assert_int_equal(room_auth_user_level(&f.st, ALICE), 100);
    assert_int_equal(room_auth_user_level(&f.st, CAROL), 0);
    assert_int_equal(room_auth_event_level(&f.st, "m.room.topic", true), 0);
    assert_true(send(&f, CAROL, "join", "m.room.topic", "", "{\"topic\":\"t\"}"));
    assert_true(send(&f, ALICE, "join", "m.room.power_levels", "",
                     "{\"users\":{\"@alice:hs\":100}}"));
    teardown_room(&f);
}

static void test_a_second_create_event_or_none_at_all_is_refused(void **state)
{
    (void)state;
    fixture f;
    setup_room(&f, "10", "public");
    assert_false(send(&f, ALICE, "join", "m.room.create", "", "{\"creator\":\"@alice:hs\"}"));
    f.st.create = NULL;
    assert_true(send(&f, ALICE, NULL, "m.room.create", "", "{\"creator\":\"@alice:hs\",\"room_version\":\"10\"}"));
    assert_false(send(&f, ALICE, NULL, "m.room.create", "", "{\"creator\":\"@alice:hs\",\"room_version\":\"99\"}"));
    assert_false(send(&f, ALICE, NULL, "m.room.create", "", "{}")); /* v10 needs creator */
    assert_false(send(&f, ALICE, "join", "m.room.message", NULL, "{}"));
    teardown_room(&f);
}

static void test_redaction_of_others_events_needs_the_redact_level(void **state)
{
    (void)state;
    fixture f;
    setup_room(&f, "10", "public");
    assert_true(room_auth_may_redact(&f.st, CAROL, CAROL));
    assert_false(room_auth_may_redact(&f.st, CAROL, BOB));
    assert_true(room_auth_may_redact(&f.st, BOB, CAROL));
    teardown_room(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_creator_joins_the_room_that_holds_only_its_create_event),
        cmocka_unit_test(test_join_rules_public_and_invite),
        cmocka_unit_test(test_invite_needs_a_joined_sender_with_the_invite_level),
        cmocka_unit_test(test_leave_kick_ban_and_unban_follow_levels),
        cmocka_unit_test(test_membership_events_need_a_user_state_key_and_a_known_membership),
        cmocka_unit_test(test_events_need_a_joined_sender_and_the_type_level),
        cmocka_unit_test(test_state_keys_naming_a_user_belong_to_that_user),
        cmocka_unit_test(test_power_level_changes_stay_within_the_senders_level),
        cmocka_unit_test(test_without_power_levels_the_creator_has_100_and_state_needs_0),
        cmocka_unit_test(test_a_second_create_event_or_none_at_all_is_refused),
        cmocka_unit_test(test_redaction_of_others_events_needs_the_redact_level),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
