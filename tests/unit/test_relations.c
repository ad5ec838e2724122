/*
 * tests/unit/test_relations.c - the pure parts of relations (core/client/rooms/crooms_bundle.c,
 * crooms_relations.c): which contents are relations (rooms_bundle_parse: m.relates_to with string
 * rel_type and event_id, the annotation key only for m.annotation, the ID length limit)
 * and the limit parameter of /relations and /threads (crooms_relations_limit: default, cap,
 * at least one, refusals). The indexing, bundles and endpoints are exercised end to end
 * by tests/integration/test_relations.py.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "core/client/rooms/crooms_relations.h"

static json_t *content(const char *text)
{
    json_error_t err;
    json_t *c = json_loads(text, 0, &err);
    if (!c) fail_msg("bad test JSON %s: %s", text, err.text);
    return c;
}

static void test_a_relation_needs_string_rel_type_and_event_id(void **state)
{
    (void)state;
    rooms_relation rel;
    json_t *c = content("{\"body\": \"x\", \"m.relates_to\": {\"rel_type\": \"m.thread\","
                        " \"event_id\": \"$root\", \"key\": \"ignored\"}}");
    assert_true(rooms_bundle_parse(c, &rel));
    assert_string_equal(rel.rel_type, "m.thread");
    assert_string_equal(rel.event_id, "$root");
    assert_null(rel.key); /* only annotations carry a key */
    json_decref(c);
    const char *not_relations[] = {
        "{}",
        "{\"m.relates_to\": \"$root\"}",
        "{\"m.relates_to\": {\"event_id\": \"$root\"}}",
        "{\"m.relates_to\": {\"rel_type\": \"m.thread\"}}",
        "{\"m.relates_to\": {\"rel_type\": 5, \"event_id\": \"$root\"}}",
        "{\"m.relates_to\": {\"rel_type\": \"m.thread\", \"event_id\": null}}",
        "{\"m.relates_to\": {\"rel_type\": \"\", \"event_id\": \"$root\"}}",
        "{\"m.relates_to\": {\"m.in_reply_to\": {\"event_id\": \"$root\"}}}",
    };
    for (size_t i = 0; i < sizeof(not_relations) / sizeof(not_relations[0]); i++) {
        c = content(not_relations[i]);
        if (rooms_bundle_parse(c, &rel)) fail_msg("%s parsed as a relation", not_relations[i]);
        assert_null(rel.rel_type);
        json_decref(c);
    }
    assert_false(rooms_bundle_parse(NULL, &rel));
}

static void test_an_annotation_carries_its_key_and_ids_are_bounded(void **state)
{
    (void)state;
    rooms_relation rel;
    json_t *c = content("{\"m.relates_to\": {\"rel_type\": \"m.annotation\","
                        " \"event_id\": \"$e\", \"key\": \"\\ud83d\\udc4d\"}}");
    assert_true(rooms_bundle_parse(c, &rel));
    assert_string_equal(rel.key, "\xf0\x9f\x91\x8d");
    json_decref(c);
    c = content("{\"m.relates_to\": {\"rel_type\": \"m.annotation\", \"event_id\": \"$e\"}}");
    assert_true(rooms_bundle_parse(c, &rel)); /* still a relation, without a key */
    assert_null(rel.key);
    json_decref(c);
    char id[EVENT_MAX_ID_BYTES + 2];
    memset(id, 'a', sizeof(id) - 1);
    id[sizeof(id) - 1] = '\0';
    c = json_pack("{s:{s:s, s:s}}", "m.relates_to", "rel_type", "m.reference", "event_id", id);
    assert_false(rooms_bundle_parse(c, &rel)); /* one byte over the limit */
    json_object_set_new(json_object_get(c, "m.relates_to"), "event_id", json_string(id + 1));
    assert_true(rooms_bundle_parse(c, &rel));
    json_decref(c);
}

static void test_the_limit_parameter(void **state)
{
    (void)state;
    int64_t v;
    assert_true(crooms_relations_limit(NULL, 5, 100, &v));
    assert_int_equal(v, 5);
    assert_true(crooms_relations_limit("7", 5, 100, &v));
    assert_int_equal(v, 7);
    assert_true(crooms_relations_limit("1000", 5, 100, &v));
    assert_int_equal(v, 100);
    assert_true(crooms_relations_limit("99999999999999999999999", 5, 100, &v));
    assert_int_equal(v, 100);
    assert_true(crooms_relations_limit("0", 5, 100, &v));
    assert_int_equal(v, 1);
    const char *bad[] = {"", "-1", "+3", "1.5", "ten", " 4", "4 "};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (crooms_relations_limit(bad[i], 5, 100, &v)) fail_msg("limit \"%s\" accepted", bad[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_relation_needs_string_rel_type_and_event_id),
        cmocka_unit_test(test_an_annotation_carries_its_key_and_ids_are_bounded),
        cmocka_unit_test(test_the_limit_parameter),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
