/*
 * tests/unit/test_events.c - events as data: canonical JSON (the spec's vectors, key order,
 * escaping, numbers), content hashes and event IDs against vectors derived by hand from
 * the spec's rules (computed independently with Python's json + hashlib, see the comment at
 * REF_MSG), and the redaction algorithm of room versions 10 and 11.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rooms/canonical_json.h"
#include "core/rooms/events.h"

static json_t *parse(const char *text)
{
    json_error_t err;
    json_t *j = json_loads(text, JSON_DECODE_ANY, &err);
    if (!j) fail_msg("bad test JSON: %s", err.text);
    return j;
}

static void assert_canonical(const char *in, const char *want)
{
    json_t *j = parse(in);
    size_t len;
    char *got = cjson_encode(j, &len);
    assert_non_null(got);
    assert_string_equal(got, want);
    assert_int_equal(len, strlen(want));
    free(got);
    json_decref(j);
}

/* ---- canonical JSON ------------------------------------------------------------------ */

static void test_canonical_json_matches_the_spec_vectors(void **state)
{
    (void)state;
    assert_canonical("{}", "{}");
    assert_canonical("{\"one\": 1, \"two\": \"Two\"}", "{\"one\":1,\"two\":\"Two\"}");
    assert_canonical("{\"b\": \"2\", \"a\": \"1\"}", "{\"a\":\"1\",\"b\":\"2\"}");
    assert_canonical(
        "{\"auth\":{\"success\":true,\"mxid\":\"@john.doe:example.com\",\"profile\":{\"display_"
        "name\":\"John Doe\",\"three_pids\":[{\"medium\":\"email\",\"address\":\"john.doe@"
        "example.org\"},{\"medium\":\"msisdn\",\"address\":\"123456789\"}]}}}",
        "{\"auth\":{\"mxid\":\"@john.doe:example.com\",\"profile\":{\"display_name\":\"John "
        "Doe\",\"three_pids\":[{\"address\":\"john.doe@example.org\",\"medium\":\"email\"},{"
        "\"address\":\"123456789\",\"medium\":\"msisdn\"}]},\"success\":true}}");
    assert_canonical("{\"a\": \"\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\"}",
                     "{\"a\":\"\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\"}");
    /* {"本": 2, "日": 1}: U+65E5 sorts before U+672C. */
    assert_canonical("{\"\xe6\x9c\xac\": 2, \"\xe6\x97\xa5\": 1}",
                     "{\"\xe6\x97\xa5\":1,\"\xe6\x9c\xac\":2}");
    assert_canonical("{\"a\": \"\\u65E5\"}", "{\"a\":\"\xe6\x97\xa5\"}");
    assert_canonical("{\"a\": null}", "{\"a\":null}");
    assert_canonical("{\"a\": -0, \"b\": 1e10}", "{\"a\":0,\"b\":10000000000}");
}

static void test_canonical_json_escapes_only_quote_backslash_and_controls(void **state)
{
    (void)state;
    /* Short escapes for \b \t \n \f \r; \u00xx in lower-case hex for the other controls;
     * '/', DEL and non-ASCII stay raw. */
    assert_canonical("[\"\\b\\t\\n\\f\\r\"]", "[\"\\b\\t\\n\\f\\r\"]");
    assert_canonical("[\"\\u000B\\u001F\\u0001\"]", "[\"\\u000b\\u001f\\u0001\"]");
    assert_canonical("[\"a/b\\\"c\\\\d\"]", "[\"a/b\\\"c\\\\d\"]");
    assert_canonical("[\"\\u007f\\u00e9\"]", "[\"\x7f\xc3\xa9\"]");
    /* A surrogate pair decodes to one 4-byte UTF-8 sequence. */
    assert_canonical("[\"\\ud83d\\ude00\"]", "[\"\xf0\x9f\x98\x80\"]");
}

static void test_canonical_json_sorts_nested_keys_and_keeps_array_order(void **state)
{
    (void)state;
    assert_canonical("{\"z\": [3, 1, {\"y\": 1, \"x\": 2}], \"a\": {\"c\": true, \"b\": false}}",
                     "{\"a\":{\"b\":false,\"c\":true},\"z\":[3,1,{\"x\":2,\"y\":1}]}");
    /* Byte order, not locale: upper case before lower case, shorter prefix first. */
    assert_canonical("{\"b\":1,\"B\":2,\"ba\":3,\"\":4}", "{\"\":4,\"B\":2,\"b\":1,\"ba\":3}");
}

static void test_canonical_json_refuses_fractions_and_unsafe_integers(void **state)
{
    (void)state;
    const char *bad[] = {"{\"a\": 1.5}", "{\"a\": 9007199254740992}", "{\"a\": -9007199254740992}",
                         "[1e300]"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        json_t *j = parse(bad[i]);
        assert_null(cjson_encode(j, NULL));
        char why[128];
        assert_int_equal(cjson_normalize(j, why, sizeof(why)), -1);
        assert_true(strlen(why) > 0);
        json_decref(j);
    }
    assert_canonical("[9007199254740991, -9007199254740991]", "[9007199254740991,-9007199254740991]");
}

static void test_canonical_json_normalize_turns_integral_reals_into_integers(void **state)
{
    (void)state;
    json_t *j = parse("{\"a\": 5.0, \"b\": [2e3, {\"c\": -0.0}]}");
    char why[128];
    assert_int_equal(cjson_normalize(j, why, sizeof(why)), 0);
    assert_true(json_is_integer(json_object_get(j, "a")));
    assert_true(json_is_integer(json_array_get(json_object_get(j, "b"), 0)));
    char *s = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    assert_string_equal(s, "{\"a\":5,\"b\":[2000,{\"c\":0}]}");
    free(s);
    json_decref(j);
}

static void test_canonical_json_refuses_nesting_beyond_the_limit(void **state)
{
    (void)state;
    json_t *root = json_array(), *cur = root;
    for (int i = 0; i < CJSON_MAX_DEPTH + 2; i++) {
        json_t *next = json_array();
        json_array_append_new(cur, next);
        cur = next;
    }
    assert_null(cjson_encode(root, NULL));
    char why[128];
    assert_int_equal(cjson_normalize(root, why, sizeof(why)), -1);
    json_decref(root);
}

/* ---- hashes and event IDs ------------------------------------------------------------ */

/*
 * REF_MSG and REF_MEMBER: expected values computed independently of this code base with
 * Python's json.dumps(sort_keys=True, separators=(',', ':'), ensure_ascii=False) and
 * hashlib.sha256, following the spec's text: content hash over the event without
 * unsigned/signatures/hashes (standard unpadded base64); event ID = "$" + URL-safe
 * unpadded base64 of SHA-256 over the redacted event without signatures/unsigned.
 */
static const char REF_MSG[] =
    "{\"auth_events\":[\"$create\",\"$pl\",\"$member\"],\"content\":{\"body\":\"h\\u00e9llo "
    "\\u0001 \\\"q\\\" / \\u007f \\u65e5\",\"msgtype\":\"m.text\",\"n\":5},\"depth\":7,\"origin\":"
    "\"example.org\",\"origin_server_ts\":1700000000000,\"prev_events\":[\"$prev\"],\"room_id\":"
    "\"!room:example.org\",\"sender\":\"@alice:example.org\",\"type\":\"m.room.message\","
    "\"unsigned\":{\"age_ts\":1}}";
static const char REF_MEMBER[] =
    "{\"auth_events\":[\"$create\"],\"content\":{\"membership\":\"join\",\"displayname\":"
    "\"Alice\"},\"depth\":2,\"origin\":\"example.org\",\"origin_server_ts\":1700000000001,"
    "\"prev_events\":[\"$create\"],\"room_id\":\"!room:example.org\",\"sender\":"
    "\"@alice:example.org\",\"state_key\":\"@alice:example.org\",\"type\":\"m.room.member\"}";

static void check_vector(const char *pdu_text, const char *version, const char *want_hash,
                         const char *want_id)
{
    json_t *pdu = parse(pdu_text);
    char id[EVENT_ID_LEN];
    size_t size = 0;
    assert_int_equal(event_finalize(room_version_find(version), pdu, id, &size), EVENT_OK);
    assert_string_equal(json_string_value(json_object_get(json_object_get(pdu, "hashes"), "sha256")),
                        want_hash);
    assert_string_equal(id, want_id);
    assert_true(size > 0);
    /* Signatures and unsigned data do not change the ID. */
    json_object_set_new(pdu, "signatures", json_pack("{s:{s:s}}", "example.org", "ed25519:a", "sig"));
    json_object_set_new(pdu, "unsigned", json_pack("{s:i}", "age", 5));
    char id2[EVENT_ID_LEN];
    assert_int_equal(event_compute_id(room_version_find(version), pdu, id2), 0);
    assert_string_equal(id2, want_id);
    json_decref(pdu);
}

static void test_event_ids_are_reference_hashes_of_the_redacted_event(void **state)
{
    (void)state;
    check_vector(REF_MSG, "10", "RayJAv58RpOe+tYZvKkHu8E2Ej6S8CXGzjecjI7SsKI",
                 "$xTPe2rcLIc8kCw9bqFQqAPhgJVXeBD7Yy7TZh8Lu64E");
    /* v11 drops `origin` in redaction, so the same event has another ID. */
    check_vector(REF_MSG, "11", "RayJAv58RpOe+tYZvKkHu8E2Ej6S8CXGzjecjI7SsKI",
                 "$GtGCEor861lszeyDJcP0ex2CJtEbIj1kA7AmuC-itfM");
    check_vector(REF_MEMBER, "10", "E26zI0dcDevtNX7Gws+bU13lj3ZtHUBLEEG67gNnEd8",
                 "$3za71h5PW82pK9Se4voUv5GDljAUh1EnqvOaN3zFgSU");
    check_vector(REF_MEMBER, "11", "E26zI0dcDevtNX7Gws+bU13lj3ZtHUBLEEG67gNnEd8",
                 "$rPz-Y1SNpdxzND6f-wSKc7LDnNUI4y7qkgFzkOJ_w9g");
}

static void test_event_id_survives_redaction_of_the_event(void **state)
{
    (void)state;
    const room_version *v = room_version_find("10");
    json_t *pdu = parse(REF_MSG);
    assert_int_equal(event_add_content_hash(pdu), 0);
    char before[EVENT_ID_LEN], after[EVENT_ID_LEN];
    assert_int_equal(event_compute_id(v, pdu, before), 0);
    json_t *red = event_redact(v, pdu);
    assert_int_equal(event_compute_id(v, red, after), 0);
    assert_string_equal(before, after);
    /* Changing redacted-away content changes the content hash but not the ID. */
    json_object_set_new(json_object_get(pdu, "content"), "body", json_string("other"));
    assert_int_equal(event_compute_id(v, pdu, after), 0);
    assert_string_equal(before, after);
    json_decref(red);
    json_decref(pdu);
}

static void test_event_finalize_refuses_events_over_64_kib(void **state)
{
    (void)state;
    json_t *pdu = parse(REF_MSG);
    char *big = malloc(EVENT_MAX_PDU_BYTES + 1);
    memset(big, 'x', EVENT_MAX_PDU_BYTES);
    big[EVENT_MAX_PDU_BYTES] = '\0';
    json_object_set_new(json_object_get(pdu, "content"), "body", json_string(big));
    free(big);
    char id[EVENT_ID_LEN];
    assert_int_equal(event_finalize(room_version_find("10"), pdu, id, NULL), EVENT_TOO_LARGE);
    json_object_set_new(json_object_get(pdu, "content"), "f", json_real(0.5));
    assert_int_equal(event_finalize(room_version_find("10"), pdu, id, NULL), EVENT_NOT_CANONICAL);
    json_decref(pdu);
}

/* ---- redaction ----------------------------------------------------------------------- */

static char *redacted_text(const char *version, const char *pdu_text)
{
    json_t *pdu = parse(pdu_text);
    json_t *red = event_redact(room_version_find(version), pdu);
    char *s = cjson_encode(red, NULL);
    json_decref(red);
    json_decref(pdu);
    return s;
}

static void assert_redacts_to(const char *version, const char *in, const char *want)
{
    char *got = redacted_text(version, in);
    assert_non_null(got);
    assert_string_equal(got, want);
    free(got);
}

static void test_redaction_keeps_the_v10_top_level_keys_and_drops_the_rest(void **state)
{
    (void)state;
    assert_redacts_to("10",
                      "{\"type\":\"m.room.message\",\"content\":{\"body\":\"x\"},\"origin\":\"a\","
                      "\"membership\":\"join\",\"prev_state\":[],\"unsigned\":{\"age\":1},"
                      "\"redacts\":\"$x\",\"age_ts\":5,\"extra\":1,\"sender\":\"@a:b\"}",
                      "{\"content\":{},\"membership\":\"join\",\"origin\":\"a\",\"prev_state\":[],"
                      "\"sender\":\"@a:b\",\"type\":\"m.room.message\"}");
    assert_redacts_to("11",
                      "{\"type\":\"m.room.message\",\"content\":{\"body\":\"x\"},\"origin\":\"a\","
                      "\"membership\":\"join\",\"prev_state\":[],\"sender\":\"@a:b\"}",
                      "{\"content\":{},\"sender\":\"@a:b\",\"type\":\"m.room.message\"}");
}

static void test_redaction_keeps_content_keys_per_event_type_and_version(void **state)
{
    (void)state;
    const char *pl = "{\"type\":\"m.room.power_levels\",\"content\":{\"ban\":50,\"invite\":0,"
                     "\"kick\":50,\"users\":{\"@a:b\":100},\"notifications\":{\"room\":50}}}";
    assert_redacts_to("10", pl, "{\"content\":{\"ban\":50,\"kick\":50,\"users\":{\"@a:b\":100}},"
                                "\"type\":\"m.room.power_levels\"}");
    assert_redacts_to("11", pl, "{\"content\":{\"ban\":50,\"invite\":0,\"kick\":50,\"users\":{"
                                "\"@a:b\":100}},\"type\":\"m.room.power_levels\"}");

    const char *create = "{\"type\":\"m.room.create\",\"content\":{\"creator\":\"@a:b\","
                         "\"room_version\":\"11\",\"m.federate\":false}}";
    assert_redacts_to("10", create, "{\"content\":{\"creator\":\"@a:b\"},\"type\":\"m.room.create\"}");
    assert_redacts_to("11", create, "{\"content\":{\"creator\":\"@a:b\",\"m.federate\":false,"
                                    "\"room_version\":\"11\"},\"type\":\"m.room.create\"}");

    const char *member = "{\"type\":\"m.room.member\",\"content\":{\"membership\":\"invite\","
                         "\"displayname\":\"A\",\"third_party_invite\":{\"display_name\":\"x\","
                         "\"signed\":{\"token\":\"t\"}}}}";
    assert_redacts_to("10", member, "{\"content\":{\"membership\":\"invite\"},\"type\":\"m.room.member\"}");
    assert_redacts_to("11", member, "{\"content\":{\"membership\":\"invite\",\"third_party_invite\":"
                                    "{\"signed\":{\"token\":\"t\"}}},\"type\":\"m.room.member\"}");

    const char *redaction = "{\"type\":\"m.room.redaction\",\"content\":{\"redacts\":\"$e\","
                            "\"reason\":\"spam\"}}";
    assert_redacts_to("10", redaction, "{\"content\":{},\"type\":\"m.room.redaction\"}");
    assert_redacts_to("11", redaction, "{\"content\":{\"redacts\":\"$e\"},\"type\":\"m.room.redaction\"}");

    assert_redacts_to("10", "{\"type\":\"m.room.join_rules\",\"content\":{\"join_rule\":\"public\","
                            "\"allow\":[],\"x\":1}}",
                      "{\"content\":{\"allow\":[],\"join_rule\":\"public\"},\"type\":\"m.room.join_rules\"}");
    assert_redacts_to("10", "{\"type\":\"m.room.history_visibility\",\"content\":{"
                            "\"history_visibility\":\"shared\",\"x\":1}}",
                      "{\"content\":{\"history_visibility\":\"shared\"},\"type\":"
                      "\"m.room.history_visibility\"}");
    assert_redacts_to("10", "{\"type\":\"m.room.name\",\"content\":{\"name\":\"n\"}}",
                      "{\"content\":{},\"type\":\"m.room.name\"}");
}

static void test_room_versions_1_to_11_are_known(void **state)
{
    (void)state;
    char id[12]; /* any int */
    for (int n = 1; n <= 11; n++) {
        snprintf(id, sizeof(id), "%d", n);
        assert_non_null(room_version_find(id));
        assert_int_equal(room_version_find(id)->number, n);
        assert_string_equal(ROOM_VERSIONS_SUPPORTED[n - 1], id);
    }
    assert_null(ROOM_VERSIONS_SUPPORTED[11]);
    assert_null(room_version_find("12"));
    assert_null(room_version_find("0"));
    assert_null(room_version_find("01"));
    assert_null(room_version_find(NULL));
    assert_false(room_version_find("10")->creator_is_sender);
    assert_true(room_version_find("11")->creator_is_sender);
}

static void test_client_format_redacts_content_and_copies_redacts_to_the_top(void **state)
{
    (void)state;
    const room_version *v = room_version_find("11");
    json_t *pdu = parse("{\"type\":\"m.room.redaction\",\"content\":{\"redacts\":\"$e\",\"reason\":"
                        "\"r\"},\"sender\":\"@a:b\",\"room_id\":\"!r:b\",\"origin_server_ts\":5,"
                        "\"depth\":3,\"auth_events\":[],\"prev_events\":[],\"hashes\":{}}");
    json_t *ev = event_client_format(v, pdu, "$id", false, true);
    char *s = cjson_encode(ev, NULL);
    assert_string_equal(s, "{\"content\":{\"reason\":\"r\",\"redacts\":\"$e\"},\"event_id\":\"$id\","
                           "\"origin_server_ts\":5,\"redacts\":\"$e\",\"room_id\":\"!r:b\",\"sender\":"
                           "\"@a:b\",\"type\":\"m.room.redaction\"}");
    free(s);
    json_decref(ev);
    ev = event_client_format(v, pdu, "$id", true, false);
    s = cjson_encode(ev, NULL);
    assert_string_equal(s, "{\"content\":{\"redacts\":\"$e\"},\"event_id\":\"$id\",\"origin_server_ts\":"
                           "5,\"redacts\":\"$e\",\"sender\":\"@a:b\",\"type\":\"m.room.redaction\"}");
    free(s);
    json_decref(ev);
    json_decref(pdu);
    /* Before v11 the PDU carries redacts at the top; clients get it in content too. */
    pdu = parse("{\"type\":\"m.room.redaction\",\"redacts\":\"$e\",\"content\":{\"reason\":\"r\"},"
                "\"sender\":\"@a:b\",\"origin_server_ts\":5}");
    ev = event_client_format(room_version_find("10"), pdu, "$id", false, false);
    s = cjson_encode(ev, NULL);
    assert_string_equal(s, "{\"content\":{\"reason\":\"r\",\"redacts\":\"$e\"},\"event_id\":\"$id\","
                           "\"origin_server_ts\":5,\"redacts\":\"$e\",\"sender\":\"@a:b\",\"type\":"
                           "\"m.room.redaction\"}");
    free(s);
    json_decref(ev);
    json_decref(pdu);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_canonical_json_matches_the_spec_vectors),
        cmocka_unit_test(test_canonical_json_escapes_only_quote_backslash_and_controls),
        cmocka_unit_test(test_canonical_json_sorts_nested_keys_and_keeps_array_order),
        cmocka_unit_test(test_canonical_json_refuses_fractions_and_unsafe_integers),
        cmocka_unit_test(test_canonical_json_normalize_turns_integral_reals_into_integers),
        cmocka_unit_test(test_canonical_json_refuses_nesting_beyond_the_limit),
        cmocka_unit_test(test_event_ids_are_reference_hashes_of_the_redacted_event),
        cmocka_unit_test(test_event_id_survives_redaction_of_the_event),
        cmocka_unit_test(test_event_finalize_refuses_events_over_64_kib),
        cmocka_unit_test(test_redaction_keeps_the_v10_top_level_keys_and_drops_the_rest),
        cmocka_unit_test(test_redaction_keeps_content_keys_per_event_type_and_version),
        cmocka_unit_test(test_room_versions_1_to_11_are_known),
        cmocka_unit_test(test_client_format_redacts_content_and_copies_redacts_to_the_top),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
