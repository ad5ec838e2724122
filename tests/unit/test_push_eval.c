/*
 * tests/unit/test_push_eval.c - the push rule evaluator (core/client/push/push_eval.c): glob
 * patterns and word boundaries, dotted keys with escapes, every condition kind, rule order
 * across kinds, disabled rules, the highlight tweak, the legacy mention rules, malformed
 * rules and the work bound; one rule set read once (a program) for many events. Rule sets
 * and events are written here; the server's default rules are exercised end to end by
 * tests/integration/test_push_counts.py.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/push/push_eval.h"

#define ALICE "@alice:example.org"
#define BOB "@bob:example.org"
#define ROOM "!room:example.org"

/* JSON written with ' for " (none of the test strings needs an apostrophe). */
static json_t *j(const char *text)
{
    char *copy = strdup(text);
    assert_non_null(copy);
    for (char *c = copy; *c; c++)
        if (*c == '\'') *c = '"';
    json_error_t err;
    json_t *v = json_loads(copy, JSON_DECODE_ANY, &err);
    if (!v) fail_msg("bad test JSON (%s): %s", err.text, copy);
    free(copy);
    return v;
}

/* An m.room.message from alice in ROOM with content (a JSON object text). */
static json_t *message(const char *content)
{
    json_t *ev = json_pack("{s:s, s:s, s:s, s:o}", "type", "m.room.message", "sender", ALICE,
                           "room_id", ROOM, "content", j(content));
    assert_non_null(ev);
    return ev;
}

/* An m.room.message from alice with content.body = body. */
static json_t *said(const char *body)
{
    json_t *ev = message("{'msgtype': 'm.text'}");
    json_object_set_new(json_object_get(ev, "content"), "body", json_string(body));
    return ev;
}

static const push_room PLAIN_ROOM = {.display_name = "Bob", .member_count = 3};

/* Evaluate rules (JSON text) against event (stolen); rule_id (may be NULL) gets the ID of
 * the deciding rule or "". */
static push_outcome eval_with(const char *rules, json_t *event, const push_room *room,
                              char rule_id[64])
{
    json_t *global = j(rules);
    push_outcome o = push_eval(global, event, room);
    if (rule_id) snprintf(rule_id, 64, "%s", o.rule_id ? o.rule_id : "");
    o.rule_id = NULL; /* points into global */
    json_decref(global);
    json_decref(event);
    return o;
}

/* Does the one condition (JSON text) match event (stolen) in room? */
static bool cond_in(const char *condition, json_t *event, const push_room *room)
{
    char rules[4096];
    snprintf(rules, sizeof(rules),
             "{'override': [{'rule_id': 'c', 'enabled': true, 'conditions': [%s],"
             " 'actions': ['notify']}]}", condition);
    return eval_with(rules, event, room, NULL).notify;
}

static bool cond(const char *condition, json_t *event)
{
    return cond_in(condition, event, &PLAIN_ROOM);
}

/* event_match on key with pattern (both plain text without quotes). */
static bool matches(const char *key, const char *pattern, json_t *event)
{
    json_t *c = json_pack("{s:s, s:s, s:s}", "kind", "event_match", "key", key, "pattern", pattern);
    char *text = json_dumps(c, JSON_COMPACT);
    bool m = cond(text, event);
    free(text);
    json_decref(c);
    return m;
}

/* ---- event_match: globs and word boundaries ------------------------------------------- */

static void test_event_match_globs_match_the_whole_value_case_insensitively(void **state)
{
    (void)state;
    assert_true(matches("type", "m.room.message", said("x")));
    assert_true(matches("type", "M.ROOM.Message", said("x")));
    assert_true(matches("type", "m.room.*", said("x")));
    assert_true(matches("type", "*", said("x")));
    assert_true(matches("type", "m.room.messag?", said("x")));
    assert_true(matches("type", "m.*.m*e", said("x")));
    assert_false(matches("type", "m.room", said("x")));
    assert_false(matches("type", "room.message", said("x")));
    assert_false(matches("type", "m.room.messa?", said("x")));
    assert_false(matches("type", "m.room.message?", said("x")));
    /* '?' is one character, not one byte; letters beyond ASCII fold too. */
    assert_true(matches("content.msgtype", "?", message("{'msgtype': '\xc3\xa9'}")));
    assert_false(matches("content.msgtype", "??", message("{'msgtype': '\xc3\xa9'}")));
    assert_true(matches("content.msgtype", "\xc3\x89t\xc3\x89",
                        message("{'msgtype': '\xc3\xa9T\xc3\xa9'}")));
    assert_true(matches("content.msgtype", "\xd0\x9c\xd0\x98\xd0\xa0", /* МИР */
                        message("{'msgtype': '\xd0\xbc\xd0\xb8\xd1\x80'}")));
    /* A value with a letter beyond ASCII never equals a pattern without one. */
    assert_false(matches("content.msgtype", "m.text", message("{'msgtype': 'm.t\xc3\xa9xt'}")));
    assert_false(matches("content.msgtype", "m.tex", message("{'msgtype': 'm.text'}")));
    /* An empty pattern matches only an empty value (the spec's tombstone state_key). */
    assert_true(matches("content.msgtype", "", message("{'msgtype': ''}")));
    assert_false(matches("content.msgtype", "", message("{'msgtype': 'x'}")));
}

static void test_event_match_only_matches_string_values(void **state)
{
    (void)state;
    assert_false(matches("content.n", "*", message("{'n': 5}")));
    assert_false(matches("content.n", "true", message("{'n': true}")));
    assert_false(matches("content.n", "*", message("{'n': null}")));
    assert_false(matches("content.n", "*", message("{'n': ['a']}")));
    assert_false(matches("content.n", "*", message("{'n': {'a': 'b'}}")));
    assert_false(matches("content.absent", "*", message("{}")));
    assert_false(matches("state_key", "*", said("not a state event")));
}

static void test_content_body_patterns_match_whole_words_anywhere(void **state)
{
    (void)state;
    assert_true(matches("content.body", "bob", said("hello bob!")));
    assert_true(matches("content.body", "bob", said("Bob")));
    assert_true(matches("content.body", "bob", said("BOB, are you there")));
    assert_true(matches("content.body", "bob", said("(bob)")));
    assert_false(matches("content.body", "bob", said("bobby")));
    assert_false(matches("content.body", "bob", said("a bobsled")));
    assert_false(matches("content.body", "bob", said("kabob")));
    assert_false(matches("content.body", "bob", said("bob_smith")));  /* '_' is a word char */
    assert_false(matches("content.body", "bob", said("bob2")));
    assert_true(matches("content.body", "bob", said("bob-smith")));   /* '-' is not */
    /* A boundary is any character outside [A-Za-z0-9_], also beyond ASCII. */
    assert_true(matches("content.body", "bob", said("\xe6\x97\xa5" "bob" "\xe6\x97\xa5")));
    /* Globs inside the word: the match still has to end at a boundary. */
    assert_true(matches("content.body", "bo*", said("hi bobby there")));
    assert_true(matches("content.body", "b?b", said("say bib")));
    assert_false(matches("content.body", "b?b", said("say bibs")));
    assert_true(matches("content.body", "*", said("anything")));
    /* Patterns that start or end with a non-word character. */
    assert_true(matches("content.body", "@room", said("hey @room.")));
    assert_true(matches("content.body", "@room", said("@room")));
    assert_false(matches("content.body", "@room", said("mail@room")));
    assert_false(matches("content.body", "@room", said("@roomy")));
    /* Other keys never search for words. */
    assert_false(matches("content.msgtype", "text", message("{'msgtype': 'm text'}")));
    /* A pattern's first letter inside words only, then at one's start; folded either way;
     * a first letter beyond ASCII. */
    assert_false(matches("content.body", "bob", said("kabob abba")));
    assert_true(matches("content.body", "bob", said("kabob bob")));
    assert_true(matches("content.body", "Bob", said("kabob BOB")));
    assert_true(matches("content.body", "\xc3\x89mile", said("bonjour \xc3\xa9mile")));
    assert_false(matches("content.body", "\xc3\x89mile", said("bonjour d\xc3\xa9mile")));
}

/* ---- dotted keys ---------------------------------------------------------------------- */

static void test_dotted_keys_walk_objects_and_honour_escapes(void **state)
{
    (void)state;
    const char *rel = "{'m.relates_to': {'rel_type': 'm.replace'}}";
    assert_true(matches("content.m\\.relates_to.rel_type", "m.replace", message(rel)));
    assert_false(matches("content.m.relates_to.rel_type", "m.replace", message(rel)));
    /* The unescaped path names nested objects, which exist here. */
    assert_true(matches("content.m.relates_to.rel_type", "x",
                        message("{'m': {'relates_to': {'rel_type': 'x'}}}")));
    /* "\\" is one backslash; a backslash before anything else is itself. */
    assert_true(matches("content.a\\\\b", "x", message("{'a\\\\b': 'x'}")));
    assert_true(matches("content.a\\b", "x", message("{'a\\\\b': 'x'}")));
    assert_true(matches("content.a\\\\.b", "x", message("{'a\\\\': {'b': 'x'}}")));
    /* Arrays are not indexed. */
    assert_false(matches("content.list.0", "x", message("{'list': ['x']}")));
    /* Top-level keys. */
    assert_true(matches("room_id", ROOM, said("x")));
    assert_true(matches("sender", "@alice:*", said("x")));
}

static void test_dotted_keys_are_bounded_in_depth_and_length(void **state)
{
    (void)state;
    /* content + 15 levels = 16 components: allowed; one more is not. */
    char content[512] = "", key[512] = "content";
    for (int i = 0; i < 15; i++) strcat(content, "{'a': ");
    strcat(content, "'x'");
    for (int i = 0; i < 15; i++) strcat(content, "}");
    for (int i = 0; i < 15; i++) strcat(key, ".a");
    assert_true(matches(key, "x", message(content)));
    char deep[600] = "", deep_key[512] = "content";
    for (int i = 0; i < 16; i++) strcat(deep, "{'a': ");
    strcat(deep, "'x'");
    for (int i = 0; i < 16; i++) strcat(deep, "}");
    for (int i = 0; i < 16; i++) strcat(deep_key, ".a");
    assert_false(matches(deep_key, "x", message(deep)));
    /* A key longer than PUSH_MAX_KEY_BYTES never matches, even if the event has it. */
    char long_name[PUSH_MAX_KEY_BYTES + 2];
    memset(long_name, 'k', sizeof(long_name) - 1);
    long_name[sizeof(long_name) - 1] = '\0';
    json_t *long_ev = said("x");
    json_object_set_new(json_object_get(long_ev, "content"), long_name, json_string("v"));
    char long_key[PUSH_MAX_KEY_BYTES + 16];
    snprintf(long_key, sizeof(long_key), "content.%s", long_name);
    assert_false(matches(long_key, "v", long_ev));
}

/* ---- the other condition kinds -------------------------------------------------------- */

static void test_event_property_is_compares_exact_scalars(void **state)
{
    (void)state;
    const char *mentions_room = "{'m.mentions': {'room': true}}";
    assert_true(cond("{'kind': 'event_property_is', 'key': 'content.m\\\\.mentions.room',"
                     " 'value': true}", message(mentions_room)));
    assert_false(cond("{'kind': 'event_property_is', 'key': 'content.m\\\\.mentions.room',"
                      " 'value': false}", message(mentions_room)));
    assert_false(cond("{'kind': 'event_property_is', 'key': 'content.m\\\\.mentions.room',"
                      " 'value': 'true'}", message(mentions_room)));
    assert_false(cond("{'kind': 'event_property_is', 'key': 'content.m\\\\.mentions.room',"
                      " 'value': 1}", message(mentions_room)));
    assert_true(cond("{'kind': 'event_property_is', 'key': 'content.n', 'value': 7}",
                     message("{'n': 7}")));
    assert_false(cond("{'kind': 'event_property_is', 'key': 'content.n', 'value': 8}",
                      message("{'n': 7}")));
    assert_true(cond("{'kind': 'event_property_is', 'key': 'content.n', 'value': null}",
                     message("{'n': null}")));
    assert_false(cond("{'kind': 'event_property_is', 'key': 'content.n', 'value': null}",
                      message("{}")));
    /* Strings are exact: no globs, no case folding. */
    assert_true(cond("{'kind': 'event_property_is', 'key': 'content.msgtype', 'value': 'm.text'}",
                     said("x")));
    assert_false(cond("{'kind': 'event_property_is', 'key': 'content.msgtype', 'value': 'M.TEXT'}",
                      said("x")));
    assert_false(cond("{'kind': 'event_property_is', 'key': 'content.msgtype', 'value': 'm.*'}",
                      said("x")));
    /* Objects and arrays are not compared, on either side. */
    assert_false(cond("{'kind': 'event_property_is', 'key': 'content.o', 'value': {'a': 1}}",
                      message("{'o': {'a': 1}}")));
    assert_false(cond("{'kind': 'event_property_is', 'key': 'content.o', 'value': [1]}",
                      message("{'o': [1]}")));
    assert_false(cond("{'kind': 'event_property_is', 'key': 'content.o'}", message("{'o': 1}")));
}

static void test_event_property_contains_looks_inside_arrays(void **state)
{
    (void)state;
    const char *m = "{'m.mentions': {'user_ids': ['@carol:example.org', '" BOB "', 3]}}";
    const char *key = "'key': 'content.m\\\\.mentions.user_ids'";
    char c[256];
    snprintf(c, sizeof(c), "{'kind': 'event_property_contains', %s, 'value': '" BOB "'}", key);
    assert_true(cond(c, message(m)));
    snprintf(c, sizeof(c), "{'kind': 'event_property_contains', %s, 'value': 3}", key);
    assert_true(cond(c, message(m)));
    snprintf(c, sizeof(c), "{'kind': 'event_property_contains', %s, 'value': '@bob:*'}", key);
    assert_false(cond(c, message(m)));
    snprintf(c, sizeof(c), "{'kind': 'event_property_contains', %s, 'value': ['" BOB "']}", key);
    assert_false(cond(c, message(m)));
    /* Not an array: no match, even when the value itself is equal. */
    snprintf(c, sizeof(c), "{'kind': 'event_property_contains', %s, 'value': '" BOB "'}", key);
    assert_false(cond(c, message("{'m.mentions': {'user_ids': '" BOB "'}}")));
    assert_false(cond(c, message("{}")));
}

static void test_contains_display_name_needs_the_whole_name_as_words(void **state)
{
    (void)state;
    const char *c = "{'kind': 'contains_display_name'}";
    push_room room = {.display_name = "Robert Tables", .member_count = 3};
    assert_true(cond_in(c, said("hi robert tables!"), &room));
    assert_true(cond_in(c, said("ROBERT TABLES"), &room));
    assert_false(cond_in(c, said("hi robert tablesx"), &room));
    assert_false(cond_in(c, said("hi robert"), &room));
    assert_false(cond_in(c, said("hi robert  tables"), &room));
    /* The name is literal text, not a pattern. */
    room.display_name = "B*";
    assert_true(cond_in(c, said("hey b* there"), &room));
    assert_false(cond_in(c, said("hey bob there"), &room));
    /* No name, an empty one: never, not even against an empty body. */
    room.display_name = "";
    assert_false(cond_in(c, said(""), &room));
    assert_false(cond_in(c, said("anything"), &room));
    room.display_name = NULL;
    assert_false(cond_in(c, said(""), &room));
    /* A body that is not a string. */
    room.display_name = "Bob";
    assert_false(cond_in(c, message("{'body': ['Bob']}"), &room));
}

static bool count_is(const char *is, int64_t members)
{
    push_room room = {.member_count = members};
    char c[128];
    snprintf(c, sizeof(c), "{'kind': 'room_member_count', 'is': '%s'}", is);
    return cond_in(c, said("x"), &room);
}

static void test_room_member_count_compares_with_each_operator(void **state)
{
    (void)state;
    assert_true(count_is("2", 2));
    assert_false(count_is("2", 3));
    assert_true(count_is("==2", 2));
    assert_false(count_is("==2", 1));
    assert_true(count_is("<3", 2));
    assert_false(count_is("<3", 3));
    assert_true(count_is(">3", 4));
    assert_false(count_is(">3", 3));
    assert_true(count_is("<=3", 3));
    assert_false(count_is("<=3", 4));
    assert_true(count_is(">=3", 3));
    assert_false(count_is(">=3", 2));
    /* Not a count: never matches. */
    const char *bad[] = {"", "=2", "2x", "x", ">=-1", "< 2", "==", "1234567890123456789012"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) assert_false(count_is(bad[i], 2));
    assert_false(cond("{'kind': 'room_member_count', 'is': 2}", said("x")));
    assert_false(cond("{'kind': 'room_member_count'}", said("x")));
}

static void test_sender_notification_permission_reads_power_levels(void **state)
{
    (void)state;
    const char *c = "{'kind': 'sender_notification_permission', 'key': 'room'}";
    json_t *pl = j("{'users': {'" ALICE "': 100, '@carol:example.org': 49}, 'users_default': 0}");
    push_room room = {.member_count = 3, .power_levels = pl};
    json_t *from_carol = said("x");
    json_object_set_new(from_carol, "sender", json_string("@carol:example.org"));
    assert_true(cond_in(c, said("x"), &room)); /* alice: 100 >= 50 */
    assert_false(cond_in(c, json_incref(from_carol), &room));
    /* The room lowers the level needed. */
    json_object_set_new(pl, "notifications", j("{'room': 49}"));
    assert_true(cond_in(c, json_incref(from_carol), &room));
    /* users_default applies to users not listed; a non-integer is ignored. */
    json_object_set_new(pl, "notifications", j("{'room': 'low'}"));
    json_t *from_dave = said("x");
    json_object_set_new(from_dave, "sender", json_string("@dave:example.org"));
    assert_false(cond_in(c, json_incref(from_dave), &room));
    json_object_set_new(pl, "users_default", json_integer(50));
    assert_true(cond_in(c, json_incref(from_dave), &room));
    /* Another key reads its own level. */
    json_object_set_new(pl, "notifications", j("{'room': 0, 'other': 101}"));
    assert_false(cond_in("{'kind': 'sender_notification_permission', 'key': 'other'}", said("x"),
                         &room));
    /* No power levels: the creator has 100, everyone else 0. */
    push_room bare = {.member_count = 3, .creator = ALICE};
    assert_true(cond_in(c, said("x"), &bare));
    assert_false(cond_in(c, json_incref(from_carol), &bare));
    assert_false(cond_in("{'kind': 'sender_notification_permission'}", said("x"), &room));
    json_decref(from_carol);
    json_decref(from_dave);
    json_decref(pl);
}

static void test_unknown_condition_kinds_never_match(void **state)
{
    (void)state;
    assert_false(cond("{'kind': 'org.example.always'}", said("x")));
    assert_false(cond("{'kind': 'event_match', 'key': 'type'}", said("x")));
    assert_false(cond("{'kind': 'event_match', 'pattern': '*'}", said("x")));
    assert_false(cond("{'key': 'type', 'pattern': '*'}", said("x")));
    assert_false(cond("{'kind': 5}", said("x")));
    assert_false(cond("'event_match'", said("x")));
    assert_false(cond("[]", said("x")));
}

/* ---- rules ---------------------------------------------------------------------------- */

static void test_rule_kinds_are_tried_in_spec_order_and_the_first_match_wins(void **state)
{
    (void)state;
    /* Every kind has a rule matching the event: override decides. */
    const char *all =
        "{'underride': [{'rule_id': 'u', 'enabled': true, 'conditions': [],"
        "   'actions': ['notify']}],"
        " 'sender': [{'rule_id': '" ALICE "', 'enabled': true, 'actions': []}],"
        " 'room': [{'rule_id': '" ROOM "', 'enabled': true, 'actions': ['notify']}],"
        " 'content': [{'rule_id': 'k', 'enabled': true, 'pattern': 'hello', 'actions': []}],"
        " 'override': [{'rule_id': 'o1', 'enabled': true, 'conditions': ["
        "   {'kind': 'event_match', 'key': 'type', 'pattern': 'm.other'}], 'actions': []},"
        "  {'rule_id': 'o2', 'enabled': true, 'conditions': ["
        "   {'kind': 'event_match', 'key': 'type', 'pattern': 'm.room.*'}],"
        "   'actions': ['notify']},"
        "  {'rule_id': 'o3', 'enabled': true, 'actions': []}]}";
    char id[64];
    push_outcome o = eval_with(all, said("hello"), &PLAIN_ROOM, id);
    assert_string_equal(id, "o2");
    assert_true(o.notify);
    /* Without overrides: content, then room, then sender, then underride. */
    const char *no_override =
        "{'override': [],"
        " 'content': [{'rule_id': 'k', 'enabled': true, 'pattern': 'hello', 'actions': []}],"
        " 'room': [{'rule_id': '" ROOM "', 'enabled': true, 'actions': ['notify']}],"
        " 'sender': [{'rule_id': '" ALICE "', 'enabled': true, 'actions': []}],"
        " 'underride': [{'rule_id': 'u', 'enabled': true, 'actions': ['notify']}]}";
    o = eval_with(no_override, said("hello"), &PLAIN_ROOM, id);
    assert_string_equal(id, "k");
    assert_false(o.notify);
    o = eval_with(no_override, said("goodbye"), &PLAIN_ROOM, id);
    assert_string_equal(id, ROOM);
    assert_true(o.notify);
    json_t *elsewhere = said("goodbye");
    json_object_set_new(elsewhere, "room_id", json_string("!other:example.org"));
    o = eval_with(no_override, elsewhere, &PLAIN_ROOM, id);
    assert_string_equal(id, ALICE);
    assert_false(o.notify);
    json_t *stranger = said("goodbye");
    json_object_set_new(stranger, "room_id", json_string("!other:example.org"));
    json_object_set_new(stranger, "sender", json_string(BOB));
    o = eval_with(no_override, stranger, &PLAIN_ROOM, id);
    assert_string_equal(id, "u");
    assert_true(o.notify);
    /* Nothing matches: no notification, no rule. */
    o = eval_with("{'underride': [{'rule_id': 'u', 'enabled': true, 'conditions': ["
                  "{'kind': 'event_match', 'key': 'type', 'pattern': 'm.call.*'}],"
                  " 'actions': ['notify']}]}", said("x"), &PLAIN_ROOM, id);
    assert_string_equal(id, "");
    assert_false(o.notify);
}

static void test_disabled_rules_are_skipped(void **state)
{
    (void)state;
    const char *rules =
        "{'override': [{'rule_id': '.m.rule.master', 'enabled': false, 'conditions': [],"
        "   'actions': []},"
        "  {'rule_id': 'off', 'enabled': false, 'conditions': [], 'actions': []},"
        "  {'rule_id': 'odd', 'enabled': 'yes', 'conditions': [], 'actions': []}],"
        " 'underride': [{'rule_id': 'u', 'enabled': true, 'conditions': [],"
        "   'actions': ['notify']}]}";
    char id[64];
    push_outcome o = eval_with(rules, said("x"), &PLAIN_ROOM, id);
    assert_string_equal(id, "u");
    assert_true(o.notify);
    /* The master rule switched on silences everything. */
    const char *master_on =
        "{'override': [{'rule_id': '.m.rule.master', 'enabled': true, 'conditions': [],"
        "   'actions': []}],"
        " 'underride': [{'rule_id': 'u', 'enabled': true, 'actions': ['notify']}]}";
    o = eval_with(master_on, said("x"), &PLAIN_ROOM, id);
    assert_string_equal(id, ".m.rule.master");
    assert_false(o.notify);
}

static bool highlights(const char *actions, bool *notify)
{
    char rules[512];
    snprintf(rules, sizeof(rules),
             "{'override': [{'rule_id': 'h', 'enabled': true, 'conditions': [], 'actions': %s}]}",
             actions);
    push_outcome o = eval_with(rules, said("x"), &PLAIN_ROOM, NULL);
    *notify = o.notify;
    return o.highlight;
}

static void test_highlight_tweak_needs_true_or_no_value_and_a_notification(void **state)
{
    (void)state;
    bool notify;
    assert_true(highlights("['notify', {'set_tweak': 'highlight'}]", &notify));
    assert_true(notify);
    assert_true(highlights("['notify', {'set_tweak': 'highlight', 'value': true}]", &notify));
    assert_false(highlights("['notify', {'set_tweak': 'highlight', 'value': false}]", &notify));
    assert_true(notify);
    assert_false(highlights("['notify', {'set_tweak': 'highlight', 'value': 'yes'}]", &notify));
    assert_false(highlights("['notify', {'set_tweak': 'sound', 'value': 'default'}]", &notify));
    assert_true(notify);
    /* A highlight without notify is not counted at all. */
    assert_false(highlights("[{'set_tweak': 'highlight'}]", &notify));
    assert_false(notify);
    assert_false(highlights("['dont_notify', {'set_tweak': 'highlight'}]", &notify));
    assert_false(notify);
    assert_false(highlights("['coalesce']", &notify));
    assert_false(notify);
    assert_false(highlights("[]", &notify));
    assert_false(notify);
}

static void test_legacy_mention_rules_are_skipped_when_the_event_has_m_mentions(void **state)
{
    (void)state;
    const char *rules =
        "{'override': [{'rule_id': '.m.rule.contains_display_name', 'enabled': true,"
        "   'conditions': [{'kind': 'contains_display_name'}],"
        "   'actions': ['notify', {'set_tweak': 'highlight'}]}],"
        " 'content': [{'rule_id': '.m.rule.contains_user_name', 'enabled': true,"
        "   'pattern': 'bob', 'actions': ['notify', {'set_tweak': 'highlight'}]}],"
        " 'underride': [{'rule_id': 'u', 'enabled': true, 'actions': ['notify']}]}";
    char id[64];
    push_outcome o = eval_with(rules, said("hi bob"), &PLAIN_ROOM, id);
    assert_string_equal(id, ".m.rule.contains_display_name");
    assert_true(o.highlight);
    push_room other_name = {.display_name = "Robert", .member_count = 3};
    o = eval_with(rules, said("hi bob"), &other_name, id);
    assert_string_equal(id, ".m.rule.contains_user_name");
    assert_true(o.highlight);
    o = eval_with(rules, message("{'body': 'hi bob', 'm.mentions': {}}"), &PLAIN_ROOM, id);
    assert_string_equal(id, "u");
    assert_false(o.highlight);
    assert_true(o.notify);
}

static void test_malformed_rule_sets_never_match_and_never_crash(void **state)
{
    (void)state;
    const char *sets[] = {
        "[]",
        "'global'",
        "{'override': {'rule_id': 'x'}}",
        "{'override': ['rule', 5, null, []]}",
        "{'override': [{'rule_id': 'x', 'enabled': true, 'conditions': {},"
        "  'actions': ['notify']}]}",
        "{'override': [{'rule_id': 'x', 'enabled': true, 'conditions': [5],"
        "  'actions': ['notify']}]}",
        "{'content': [{'rule_id': 'x', 'enabled': true, 'actions': ['notify']}]}",
        "{'content': [{'rule_id': 'x', 'enabled': true, 'pattern': 7, 'actions': ['notify']}]}",
        "{'room': [{'enabled': true, 'actions': ['notify']}]}",
        "{'sender': [{'rule_id': 5, 'enabled': true, 'actions': ['notify']}]}",
        "{'underride': [{'rule_id': 'x', 'enabled': true, 'conditions': [], 'actions': 'notify'}]}",
        "{'underride': [{'rule_id': 'x', 'enabled': true, 'conditions': [],"
        "  'actions': [5, null, {'set_tweak': 5}, {}, ['notify']]}]}",
    };
    for (size_t i = 0; i < sizeof(sets) / sizeof(sets[0]); i++) {
        push_outcome o = eval_with(sets[i], said("x"), &PLAIN_ROOM, NULL);
        assert_false(o.notify);
        assert_false(o.highlight);
    }
    /* A rule with no rule_id still decides; odd events and a missing room are survived. */
    push_outcome o = eval_with("{'underride': [{'enabled': true, 'actions': ['notify']}]}",
                               said("x"), &PLAIN_ROOM, NULL);
    assert_true(o.notify);
    json_t *rules = j("{'underride': [{'rule_id': 'u', 'conditions': ["
                      "{'kind': 'event_match', 'key': 'content.body', 'pattern': '*'},"
                      "{'kind': 'sender_notification_permission', 'key': 'room'},"
                      "{'kind': 'contains_display_name'}], 'actions': ['notify']}]}");
    json_t *odd[] = {j("[]"), j("'event'"), j("{'content': 'body'}"), j("{'sender': 5}")};
    for (size_t i = 0; i < sizeof(odd) / sizeof(odd[0]); i++) {
        assert_false(push_eval(rules, odd[i], &PLAIN_ROOM).notify);
        json_decref(odd[i]);
    }
    json_t *ev = said("x");
    assert_false(push_eval(rules, ev, NULL).notify);
    assert_false(push_eval(NULL, ev, &PLAIN_ROOM).notify);
    assert_false(push_eval(rules, NULL, &PLAIN_ROOM).notify);
    json_decref(ev);
    json_decref(rules);
}

static void test_patterns_over_the_length_limit_never_match(void **state)
{
    (void)state;
    char pattern[PUSH_MAX_PATTERN_BYTES + 2];
    memset(pattern, 'a', sizeof(pattern) - 1);
    pattern[sizeof(pattern) - 1] = '\0';
    assert_false(matches("content.body", pattern, said(pattern)));
    pattern[PUSH_MAX_PATTERN_BYTES] = '\0'; /* exactly at the limit: fine */
    assert_true(matches("content.body", pattern, said(pattern)));
    push_room room = {.display_name = pattern, .member_count = 3};
    assert_true(cond_in("{'kind': 'contains_display_name'}", said(pattern), &room));
}

static void test_pathological_patterns_stop_at_the_work_bound(void **state)
{
    (void)state;
    /* 200 stars between 'a's against 60000 'a's and no 'b': an exponential matcher would
     * never finish; this one stops at PUSH_MAX_STEPS and reports it. */
    char pattern[PUSH_MAX_PATTERN_BYTES];
    size_t n = 0;
    for (int i = 0; i < 200; i++) {
        pattern[n++] = 'a';
        pattern[n++] = '*';
    }
    pattern[n++] = 'b';
    pattern[n] = '\0';
    size_t body_len = 60000;
    char *body = malloc(body_len + 1);
    assert_non_null(body);
    memset(body, 'a', body_len);
    body[body_len] = '\0';
    json_t *c = json_pack("{s:s, s:s, s:s}", "kind", "event_match", "key", "content.body",
                          "pattern", pattern);
    json_t *rules = json_pack("{s:[{s:s, s:b, s:[O], s:[s]}]}", "override", "rule_id", "slow",
                              "enabled", 1, "conditions", c, "actions", "notify");
    json_t *ev = said(body);
    push_outcome o = push_eval(rules, ev, &PLAIN_ROOM);
    assert_false(o.notify);
    assert_true(o.out_of_steps);
    /* A plain message against the same kind of rule does not run out. */
    json_t *short_ev = said("hello");
    o = push_eval(rules, short_ev, &PLAIN_ROOM);
    assert_false(o.out_of_steps);
    json_decref(short_ev);
    json_decref(ev);
    json_decref(rules);
    json_decref(c);
    free(body);
}

/* ---- one rule set read once, many events ------------------------------------------- */

static void test_a_program_judges_each_event_as_push_eval_does_and_holds_its_rules(void **state)
{
    (void)state;
    const char *rules =
        "{'override': [{'rule_id': 'notice', 'conditions': [{'kind': 'event_match',"
        "  'key': 'content.msgtype', 'pattern': 'm.notice'}], 'actions': []},"
        " {'rule_id': 'mention', 'conditions': [{'kind': 'contains_display_name'}],"
        "  'actions': ['notify', {'set_tweak': 'highlight'}]}],"
        " 'content': [{'rule_id': 'word', 'pattern': 'cake', 'actions': ['notify']}],"
        " 'underride': [{'rule_id': 'one_to_one', 'conditions': [{'kind': 'room_member_count',"
        "  'is': '2'}], 'actions': ['notify', {'set_tweak': 'highlight', 'value': false}]},"
        " {'rule_id': 'rest', 'conditions': [{'kind': 'event_match', 'key': 'type',"
        "  'pattern': 'm.room.*'}], 'actions': ['dont_notify']}]}";
    json_t *global = j(rules);
    push_program *p = push_program_new(global);
    assert_non_null(p);
    json_t *events[] = {said("hello Bob"), said("cake!"), said("plain"),
                        message("{'msgtype': 'm.notice', 'body': 'Bob'}"), said("cakes")};
    push_room two = {.display_name = "Bob", .member_count = 2};
    const char *want[][2] = {{"mention", "notify highlight"}, {"word", "notify"},
                             {"one_to_one", "notify"}, {"notice", ""}, {"one_to_one", "notify"}};
    for (size_t i = 0; i < sizeof(events) / sizeof(*events); i++) {
        push_outcome a = push_program_run(p, events[i], &two), b = push_eval(global, events[i], &two);
        assert_string_equal(a.rule_id, want[i][0]);
        assert_int_equal(a.notify, strstr(want[i][1], "notify") != NULL);
        assert_int_equal(a.highlight, strstr(want[i][1], "highlight") != NULL);
        assert_string_equal(a.rule_id, b.rule_id);
        assert_int_equal(a.notify, b.notify);
        assert_int_equal(a.highlight, b.highlight);
    }
    /* The program holds the rule set: the caller's reference may go first. */
    json_decref(global);
    push_outcome o = push_program_run(p, events[2], &PLAIN_ROOM);
    assert_string_equal(o.rule_id, "rest");
    assert_false(o.notify);
    for (size_t i = 0; i < sizeof(events) / sizeof(*events); i++) json_decref(events[i]);
    push_program_free(p);
    /* No program (out of memory) matches nothing. */
    json_t *ev = said("cake");
    o = push_program_run(NULL, ev, &PLAIN_ROOM);
    assert_null(o.rule_id);
    assert_false(o.notify);
    json_decref(ev);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_event_match_globs_match_the_whole_value_case_insensitively),
        cmocka_unit_test(test_event_match_only_matches_string_values),
        cmocka_unit_test(test_content_body_patterns_match_whole_words_anywhere),
        cmocka_unit_test(test_dotted_keys_walk_objects_and_honour_escapes),
        cmocka_unit_test(test_dotted_keys_are_bounded_in_depth_and_length),
        cmocka_unit_test(test_event_property_is_compares_exact_scalars),
        cmocka_unit_test(test_event_property_contains_looks_inside_arrays),
        cmocka_unit_test(test_contains_display_name_needs_the_whole_name_as_words),
        cmocka_unit_test(test_room_member_count_compares_with_each_operator),
        cmocka_unit_test(test_sender_notification_permission_reads_power_levels),
        cmocka_unit_test(test_unknown_condition_kinds_never_match),
        cmocka_unit_test(test_rule_kinds_are_tried_in_spec_order_and_the_first_match_wins),
        cmocka_unit_test(test_disabled_rules_are_skipped),
        cmocka_unit_test(test_highlight_tweak_needs_true_or_no_value_and_a_notification),
        cmocka_unit_test(test_legacy_mention_rules_are_skipped_when_the_event_has_m_mentions),
        cmocka_unit_test(test_malformed_rule_sets_never_match_and_never_crash),
        cmocka_unit_test(test_patterns_over_the_length_limit_never_match),
        cmocka_unit_test(test_pathological_patterns_stop_at_the_work_bound),
        cmocka_unit_test(test_a_program_judges_each_event_as_push_eval_does_and_holds_its_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
