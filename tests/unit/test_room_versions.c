/*
 * tests/unit/test_room_versions.c - what differs between room versions 1 to 11, as a
 * receiving server sees it: event IDs (the spec appendix's signed events, and vectors
 * computed independently of this code base with Python's json + hashlib: canonical JSON is
 * json.dumps(sort_keys=True, separators=(',', ':'), ensure_ascii=False), hashes and IDs
 * follow the spec's text), redaction per version, the format checks with every limit at
 * and one past its value, the servers whose signatures a version requires, and the
 * content hash check.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime/base64.h"
#include "core/federation/transport/fed_keys.h"
#include "core/rooms/canonical_json.h"
#include "core/rooms/events.h"

static json_t *parse(const char *text)
{
    json_error_t err;
    json_t *j = json_loads(text, 0, &err);
    if (!j) fail_msg("bad test JSON: %s", err.text);
    return j;
}

static const room_version *ver(int n)
{
    char id[12]; /* any int: -Wformat-truncation (the ASan build) sees no bound on n */
    snprintf(id, sizeof(id), "%d", n);
    const room_version *v = room_version_find(id);
    assert_non_null(v);
    return v;
}

/* ---- the spec appendix's "Event Signing" vectors ------------------------------------- */

/* Seed, server name and key ID of the appendix ("Signing details"). */
static const char SPEC_SEED_B64[] = "YJDBA9Xnr2sVqXD9Vj7XVUnmFZcZrlw8Md7kMW+3XA1";

static const char SPEC_MINIMAL[] =
    "{\"room_id\":\"!x:domain\",\"sender\":\"@a:domain\",\"origin\":\"domain\","
    "\"origin_server_ts\":1000000,\"signatures\":{},\"hashes\":{},\"type\":\"X\",\"content\":{},"
    "\"prev_events\":[],\"auth_events\":[],\"depth\":3,\"unsigned\":{\"age_ts\":1000000}}";
static const char SPEC_REDACTABLE[] =
    "{\"content\":{\"body\":\"Here is the message content\"},\"event_id\":\"$0:domain\","
    "\"origin\":\"domain\",\"origin_server_ts\":1000000,\"type\":\"m.room.message\","
    "\"room_id\":\"!r:domain\",\"sender\":\"@u:domain\",\"signatures\":{},\"unsigned\":"
    "{\"age_ts\":1000000}}";

/* Hash pdu, redact it under v, sign the redacted copy with the appendix's key: the
 * signature the appendix says a server emits, when v's redaction is the one it used. */
static char *sign_as_the_spec_does(const room_version *v, json_t *pdu)
{
    unsigned char seed[FED_SEED_BYTES];
    assert_int_equal(rt_b64_decode_exact(SPEC_SEED_B64, seed, sizeof(seed)), 0);
    fed_signing_key key;
    assert_int_equal(fed_signing_key_from_seed(seed, "1", &key), 0);
    assert_int_equal(event_add_content_hash(pdu), 0);
    json_t *red = event_redact(v, pdu);
    json_object_del(red, "unsigned");
    assert_int_equal(fed_sign_json(red, "domain", &key), 0);
    char *sig = strdup(json_string_value(
        json_object_get(json_object_get(json_object_get(red, "signatures"), "domain"), "ed25519:1")));
    json_decref(red);
    fed_signing_key_wipe(&key);
    return sig;
}

static void test_spec_appendix_events_hash_and_sign_as_the_appendix_says(void **state)
{
    (void)state;
    for (int n = 1; n <= 11; n++) {
        json_t *pdu = parse(SPEC_MINIMAL);
        char *sig = sign_as_the_spec_does(ver(n), pdu);
        assert_string_equal(json_string_value(json_object_get(json_object_get(pdu, "hashes"), "sha256")),
                            "5jM4wQpv6lnBo7CLIghJuHdW+s2CMBJPUOGOC89ncos");
        /* The appendix keeps the top-level origin, as versions 1-10 do; v11 drops it. */
        if (n <= 10)
            assert_string_equal(sig, "KxwGjPSDEtvnFgU00fwFz+l6d2pJM6XBIaMEn81SXPTRl16AqLAYqfIReFGZ"
                                     "lHi5KLjAWbOoMszkwsQma+lYAg");
        else
            assert_string_not_equal(sig, "KxwGjPSDEtvnFgU00fwFz+l6d2pJM6XBIaMEn81SXPTRl16AqLAYqfIR"
                                         "eFGZlHi5KLjAWbOoMszkwsQma+lYAg");
        free(sig);
        json_decref(pdu);

        pdu = parse(SPEC_REDACTABLE);
        sig = sign_as_the_spec_does(ver(n), pdu);
        assert_string_equal(json_string_value(json_object_get(json_object_get(pdu, "hashes"), "sha256")),
                            "onLKD1bGljeBWQhWZ1kaP9SorVmRQNdN5aM2JYU2n/g");
        if (n <= 10)
            assert_string_equal(sig, "Wm+VzmOUOz08Ds+0NTWb1d4CZrVsJSikkeRxh6aCcUwu6pNC78FunoD7KNWz"
                                     "qFn241eYHYMGCA5McEiVPdhzBA");
        assert_true(event_content_hash_ok(pdu));
        free(sig);
        json_decref(pdu);
    }
}

static void test_v1_and_v2_event_ids_are_the_events_own(void **state)
{
    (void)state;
    json_t *pdu = parse(SPEC_REDACTABLE);
    char id[EVENT_ID_LEN];
    for (int n = 1; n <= 2; n++) {
        assert_int_equal(event_compute_id(ver(n), pdu, id), 0);
        assert_string_equal(id, "$0:domain");
        assert_int_equal(ver(n)->event_id_format, ROOM_EVENT_ID_OPAQUE);
    }
    /* A v1 event ID needs a local part and a server name. */
    const char *bad[] = {"0:domain", "$:domain", "$0", "$0:", "", "$a\nb:domain"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        json_object_set_new(pdu, "event_id", json_string(bad[i]));
        assert_int_equal(event_compute_id(ver(1), pdu, id), -1);
    }
    json_object_del(pdu, "event_id");
    assert_int_equal(event_compute_id(ver(2), pdu, id), -1);
    /* The longest ID the size limits allow fits the buffer. */
    char longest[EVENT_MAX_ID_BYTES + 2];
    memset(longest, 'a', sizeof(longest));
    memcpy(longest, "$x:", 3);
    longest[EVENT_MAX_ID_BYTES] = '\0';
    json_object_set_new(pdu, "event_id", json_string(longest));
    assert_int_equal(event_compute_id(ver(1), pdu, id), 0);
    assert_string_equal(id, longest);
    longest[EVENT_MAX_ID_BYTES] = 'a';
    longest[EVENT_MAX_ID_BYTES + 1] = '\0';
    json_object_set_new(pdu, "event_id", json_string(longest));
    assert_int_equal(event_compute_id(ver(1), pdu, id), -1);
    json_decref(pdu);
}

/* Python vectors (see the top of the file). */
static const char VEC_MSG[] =
    "{\"auth_events\":[\"$create\",\"$pl\",\"$alice\"],\"content\":{\"body\":\"vectors for v3 and "
    "v4\",\"msgtype\":\"m.text\"},\"depth\":12,\"origin\":\"example.org\",\"origin_server_ts\":"
    "1700000000123,\"prev_events\":[\"$prev\"],\"room_id\":\"!room:example.org\",\"sender\":"
    "\"@alice:example.org\",\"type\":\"m.room.message\"}";
static const char VEC_V1[] =
    "{\"auth_events\":[[\"$create:example.org\",{\"sha256\":\"abc\"}]],\"content\":{\"body\":"
    "\"v1\"},\"depth\":3,\"event_id\":\"$old1:example.org\",\"origin\":\"example.org\","
    "\"origin_server_ts\":1400000000000,\"prev_events\":[[\"$p:example.org\",{\"sha256\":"
    "\"def\"}]],\"room_id\":\"!room:example.org\",\"sender\":\"@alice:example.org\",\"type\":"
    "\"m.room.message\"}";

static void test_v1_events_this_server_writes_get_an_id_and_reference_pairs(void **state)
{
    (void)state;
    for (int n = 1; n <= 2; n++) {
        json_t *pdu = parse(VEC_MSG);
        char id[EVENT_ID_LEN];
        assert_int_equal(event_finalize(ver(n), pdu, id, NULL), EVENT_OK);
        assert_string_equal(json_string_value(json_object_get(pdu, "event_id")), id);
        assert_true(event_opaque_id_valid(id));
        assert_string_equal(event_id_domain(id), "example.org"); /* the sender's server */
        assert_int_equal(strlen(id), 1 + 18 + 1 + strlen("example.org"));
        char *refs = json_dumps(json_object_get(pdu, "prev_events"), JSON_COMPACT);
        assert_string_equal(refs, "[[\"$prev\",{}]]");
        free(refs);
        assert_int_equal(json_array_size(json_object_get(pdu, "auth_events")), 3);
        assert_true(event_content_hash_ok(pdu)); /* hashed after the ID was added */
        char why[EVENT_WHY_LEN];
        json_object_set_new(pdu, "signatures", json_object());
        assert_int_equal(event_check_format(ver(n), pdu, why), EVENT_FORMAT_BAD); /* "$prev" has no server */
        /* A second finalize keeps the ID. */
        char again[EVENT_ID_LEN];
        assert_int_equal(event_finalize(ver(n), pdu, again, NULL), EVENT_OK);
        assert_string_equal(again, id);
        json_decref(pdu);
    }
}

static void test_v3_ids_use_standard_base64_and_v4_on_url_safe(void **state)
{
    (void)state;
    char id[EVENT_ID_LEN];
    for (int n = 3; n <= 11; n++) {
        json_t *pdu = parse(VEC_MSG);
        assert_int_equal(event_finalize(ver(n), pdu, id, NULL), EVENT_OK);
        assert_string_equal(json_string_value(json_object_get(json_object_get(pdu, "hashes"), "sha256")),
                            "MyyJ30gOqs+Os9AvJ/riLA63AUExu+SjoHPxWcyDioo");
        const char *want = n == 3 ? "$h5QN1B93Y5IccZorpKVX6mNtGtKM88yNG4Dbw/1kjn4"
                         : n <= 10 ? "$h5QN1B93Y5IccZorpKVX6mNtGtKM88yNG4Dbw_1kjn4"
                                   : "$SOIQGXs06lSodTDho9WsjgbtUn183yRyrTglDKKq8yA";
        assert_string_equal(id, want);
        /* An event_id a peer added is no part of a v3+ reference hash. */
        json_object_set_new(pdu, "event_id", json_string("$whatever:example.org"));
        assert_int_equal(event_compute_id(ver(n), pdu, id), 0);
        assert_string_equal(id, want);
        json_decref(pdu);
    }
}

static void test_v1_reference_hash_covers_the_event_id(void **state)
{
    (void)state;
    json_t *pdu = parse(VEC_V1);
    assert_int_equal(event_add_content_hash(pdu), 0);
    assert_string_equal(json_string_value(json_object_get(json_object_get(pdu, "hashes"), "sha256")),
                        "9oHPUGsUXFo9BFfc2lnP2rQmYnaqqbQDGFH3S217oCw");
    char ref[CJSON_SHA256_B64_LEN];
    assert_int_equal(event_reference_hash(ver(1), pdu, ref), 0);
    assert_string_equal(ref, "ZmnIZj60O8NMk0gj77kzuvTCbundZU9elp1ODQ9+YDs");
    json_object_set_new(pdu, "event_id", json_string("$old2:example.org"));
    assert_int_equal(event_reference_hash(ver(1), pdu, ref), 0);
    assert_string_not_equal(ref, "ZmnIZj60O8NMk0gj77kzuvTCbundZU9elp1ODQ9+YDs");
    json_decref(pdu);
}

/* ---- references between events ---------------------------------------------------- */

static void test_references_read_as_plain_ids_whether_pairs_or_strings(void **state)
{
    (void)state;
    json_t *ref = json_string("$a");
    assert_string_equal(event_ref_id(ref), "$a");
    json_decref(ref);
    ref = parse("[\"$b:example.org\",{\"sha256\":\"x\"}]");
    assert_string_equal(event_ref_id(ref), "$b:example.org");
    json_decref(ref);
    const char *bad[] = {"1", "[]", "[1,{}]", "{\"id\":\"$c\"}", "null"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ref = json_loads(bad[i], JSON_DECODE_ANY, NULL);
        assert_null(event_ref_id(ref));
        json_decref(ref);
    }
    /* A v1 PDU's pairs and a v3 PDU's strings read alike; non-references are left out. */
    json_t *v1 = parse(VEC_V1), *v3 = parse(VEC_MSG);
    json_array_append_new(json_object_get(v1, "prev_events"), json_integer(7));
    json_t *got = event_ref_ids(v1, "prev_events");
    char *ids = json_dumps(got, JSON_COMPACT);
    assert_string_equal(ids, "[\"$p:example.org\"]");
    free(ids);
    json_decref(got);
    got = event_ref_ids(v3, "auth_events");
    ids = json_dumps(got, JSON_COMPACT);
    assert_string_equal(ids, "[\"$create\",\"$pl\",\"$alice\"]");
    free(ids);
    json_decref(got);
    got = event_ref_ids(v3, "no_such_key");
    assert_int_equal(json_array_size(got), 0);
    json_decref(got);
    json_decref(v1);
    json_decref(v3);
}

static void test_a_v1_reference_pair_carries_the_events_reference_hash(void **state)
{
    (void)state;
    json_t *pdu = parse(VEC_V1);
    assert_int_equal(event_add_content_hash(pdu), 0);
    json_object_set_new(pdu, "signatures",
                        json_pack("{s:{s:s}}", "example.org", "ed25519:1", "sig"));
    json_t *pair = event_ref_pair(ver(1), "$old1:example.org", pdu);
    char *text = json_dumps(pair, JSON_COMPACT);
    /* The hash test_v1_reference_hash_covers_the_event_id computes: signatures are not hashed. */
    assert_string_equal(text, "[\"$old1:example.org\",{\"sha256\":"
                              "\"ZmnIZj60O8NMk0gj77kzuvTCbundZU9elp1ODQ9+YDs\"}]");
    free(text);
    json_decref(pair);
    json_object_set_new(pdu, "depth", json_real(0.5)); /* kept by redaction, not canonical */
    assert_null(event_ref_pair(ver(1), "$old1:example.org", pdu));
    json_decref(pdu);
}

static void test_a_v1_event_this_server_creates_names_this_server(void **state)
{
    (void)state;
    json_t *pdu = parse(VEC_MSG);
    assert_int_equal(event_id_of_server(pdu, "atrium.example"), 0);
    const char *id = json_string_value(json_object_get(pdu, "event_id"));
    assert_true(event_opaque_id_valid(id));
    assert_string_equal(event_id_domain(id), "atrium.example");
    char kept[EVENT_ID_LEN];
    snprintf(kept, sizeof(kept), "%s", id);
    assert_int_equal(event_id_of_server(pdu, "other.example"), 0); /* an ID is kept */
    assert_string_equal(json_string_value(json_object_get(pdu, "event_id")), kept);
    json_object_del(pdu, "event_id");
    char longest[EVENT_MAX_ID_BYTES];
    memset(longest, 'a', sizeof(longest) - 1);
    longest[sizeof(longest) - 1] = '\0';
    assert_int_equal(event_id_of_server(pdu, longest), -1);
    assert_int_equal(event_id_of_server(pdu, ""), -1);
    assert_null(json_object_get(pdu, "event_id"));
    json_decref(pdu);
    /* Received: a v1-2 ID must name the server that sent the event; a v3+ ID is a hash. */
    assert_true(event_id_names_origin(ver(1), "$x:a.example", "a.example"));
    assert_false(event_id_names_origin(ver(2), "$x:a.example", "b.example"));
    assert_true(event_id_names_origin(ver(3), "$hash", "b.example"));
}

/* ---- the version table ------------------------------------------------------------- */

static void test_each_version_has_the_features_its_spec_page_adds(void **state)
{
    (void)state;
    for (int n = 1; n <= 11; n++) {
        const room_version *v = ver(n);
        assert_int_equal(v->state_res, n == 1 ? 1 : 2);
        assert_int_equal(v->event_id_format, n <= 2 ? ROOM_EVENT_ID_OPAQUE
                                           : n == 3 ? ROOM_EVENT_ID_HASH_B64
                                                    : ROOM_EVENT_ID_HASH_URLSAFE);
        assert_int_equal(v->redaction_auth_rule, n <= 2);
        assert_int_equal(v->aliases_auth_rule, n <= 5);
        assert_int_equal(v->key_validity_enforced, n >= 5);
        assert_int_equal(v->notifications_power_levels, n >= 6);
        assert_int_equal(v->strict_canonical_json, n >= 6);
        assert_int_equal(v->knock, n >= 7);
        assert_int_equal(v->restricted_join, n >= 8);
        assert_int_equal(v->knock_restricted, n >= 10);
        assert_int_equal(v->integer_power_levels, n >= 10);
        assert_int_equal(v->creator_is_sender, n >= 11);
        assert_int_equal(v->redacts_in_content, n >= 11);
        assert_int_equal(v->v11_redaction, n >= 11);
        assert_int_equal(v->redaction, n <= 5 ? ROOM_REDACT_V1 : n <= 7 ? ROOM_REDACT_V6
                                     : n == 8 ? ROOM_REDACT_V8 : n <= 10 ? ROOM_REDACT_V9
                                              : ROOM_REDACT_V11);
        assert_true(room_version_find_creatable(v->id) == (v->local_create ? v : NULL));
    }
    assert_non_null(room_version_find_creatable("1"));
    assert_non_null(room_version_find_creatable("11"));
    assert_null(room_version_find_creatable("12"));
}

/* ---- redaction per version ----------------------------------------------------------- */

static char *redacted(int n, const char *pdu_text)
{
    json_t *pdu = parse(pdu_text);
    json_t *red = event_redact(ver(n), pdu);
    char *s = cjson_encode(red, NULL);
    json_decref(red);
    json_decref(pdu);
    return s;
}

static void assert_redaction_in(int from, int to, const char *in, const char *want)
{
    for (int n = from; n <= to; n++) {
        char *got = redacted(n, in);
        if (strcmp(got, want) != 0) fail_msg("room version %d: got %s, want %s", n, got, want);
        free(got);
    }
}

static void test_redaction_keeps_what_each_version_keeps(void **state)
{
    (void)state;
    const char *aliases = "{\"type\":\"m.room.aliases\",\"state_key\":\"hs\",\"content\":{"
                          "\"aliases\":[\"#a:hs\"],\"x\":1}}";
    assert_redaction_in(1, 5, aliases, "{\"content\":{\"aliases\":[\"#a:hs\"]},\"state_key\":\"hs\","
                                       "\"type\":\"m.room.aliases\"}");
    assert_redaction_in(6, 11, aliases, "{\"content\":{},\"state_key\":\"hs\",\"type\":\"m.room.aliases\"}");

    const char *jr = "{\"type\":\"m.room.join_rules\",\"content\":{\"join_rule\":\"restricted\","
                     "\"allow\":[{\"type\":\"m.room_membership\",\"room_id\":\"!s:hs\"}]}}";
    assert_redaction_in(1, 7, jr, "{\"content\":{\"join_rule\":\"restricted\"},\"type\":\"m.room.join_rules\"}");
    assert_redaction_in(8, 11, jr, "{\"content\":{\"allow\":[{\"room_id\":\"!s:hs\",\"type\":"
                                   "\"m.room_membership\"}],\"join_rule\":\"restricted\"},"
                                   "\"type\":\"m.room.join_rules\"}");

    const char *member = "{\"type\":\"m.room.member\",\"content\":{\"membership\":\"join\","
                         "\"join_authorised_via_users_server\":\"@a:hs\",\"displayname\":\"A\"}}";
    assert_redaction_in(1, 8, member, "{\"content\":{\"membership\":\"join\"},\"type\":\"m.room.member\"}");
    assert_redaction_in(9, 11, member, "{\"content\":{\"join_authorised_via_users_server\":\"@a:hs\","
                                       "\"membership\":\"join\"},\"type\":\"m.room.member\"}");

    const char *top = "{\"type\":\"m.room.message\",\"content\":{\"body\":\"x\"},\"origin\":\"hs\","
                      "\"membership\":\"join\",\"prev_state\":[],\"event_id\":\"$e:hs\"}";
    assert_redaction_in(1, 10, top, "{\"content\":{},\"event_id\":\"$e:hs\",\"membership\":\"join\","
                                    "\"origin\":\"hs\",\"prev_state\":[],\"type\":\"m.room.message\"}");
    assert_redaction_in(11, 11, top, "{\"content\":{},\"event_id\":\"$e:hs\",\"type\":\"m.room.message\"}");

    const char *pl = "{\"type\":\"m.room.power_levels\",\"content\":{\"invite\":0,\"ban\":50,"
                     "\"notifications\":{\"room\":50}}}";
    assert_redaction_in(1, 10, pl, "{\"content\":{\"ban\":50},\"type\":\"m.room.power_levels\"}");
    assert_redaction_in(11, 11, pl, "{\"content\":{\"ban\":50,\"invite\":0},\"type\":\"m.room.power_levels\"}");

    const char *create = "{\"type\":\"m.room.create\",\"content\":{\"creator\":\"@a:hs\","
                         "\"room_version\":\"5\"}}";
    assert_redaction_in(1, 10, create, "{\"content\":{\"creator\":\"@a:hs\"},\"type\":\"m.room.create\"}");
    assert_redaction_in(11, 11, create, "{\"content\":{\"creator\":\"@a:hs\",\"room_version\":\"5\"},"
                                        "\"type\":\"m.room.create\"}");

    const char *redaction = "{\"type\":\"m.room.redaction\",\"redacts\":\"$x:hs\",\"content\":{"
                            "\"redacts\":\"$x:hs\",\"reason\":\"r\"}}";
    assert_redaction_in(1, 10, redaction, "{\"content\":{},\"type\":\"m.room.redaction\"}");
    assert_redaction_in(11, 11, redaction, "{\"content\":{\"redacts\":\"$x:hs\"},\"type\":\"m.room.redaction\"}");
}

/* ---- format checks ------------------------------------------------------------------- */

/* A well-formed PDU of version n (v1-2 with an event_id and hash pairs). */
static json_t *good_pdu(int n)
{
    json_t *pdu = parse("{\"room_id\":\"!r:hs\",\"sender\":\"@a:hs\",\"type\":\"m.room.message\","
                        "\"content\":{\"body\":\"hi\"},\"origin_server_ts\":5,\"depth\":4,"
                        "\"hashes\":{\"sha256\":\"x\"},\"signatures\":{\"hs\":{\"ed25519:1\":\"s\"}},"
                        "\"unsigned\":{\"age\":1}}");
    json_t *prev = json_array(), *auth = json_array();
    if (n <= 2) {
        json_object_set_new(pdu, "event_id", json_string("$e1:hs"));
        json_array_append_new(prev, json_pack("[s,{s:s}]", "$p:hs", "sha256", "h"));
        json_array_append_new(auth, json_pack("[s,{s:s}]", "$c:hs", "sha256", "h"));
    } else {
        json_array_append_new(prev, json_string("$prev"));
        json_array_append_new(auth, json_string("$create"));
    }
    json_object_set_new(pdu, "prev_events", prev);
    json_object_set_new(pdu, "auth_events", auth);
    return pdu;
}

static int format_of(int n, const json_t *pdu)
{
    char why[EVENT_WHY_LEN];
    int rc = event_check_format(ver(n), pdu, why);
    if (rc != EVENT_FORMAT_OK && !why[0]) fail_msg("refusal without a reason");
    return rc;
}

/* A string of len bytes: prefix, then 'a's, then suffix. */
static json_t *sized(const char *prefix, size_t len, const char *suffix)
{
    char *s = malloc(len + 1);
    memset(s, 'a', len);
    memcpy(s, prefix, strlen(prefix));
    memcpy(s + len - strlen(suffix), suffix, strlen(suffix));
    s[len] = '\0';
    json_t *j = json_string(s);
    free(s);
    return j;
}

static void test_format_accepts_a_good_pdu_of_each_version(void **state)
{
    (void)state;
    for (int n = 1; n <= 11; n++) {
        json_t *pdu = good_pdu(n);
        assert_int_equal(format_of(n, pdu), EVENT_FORMAT_OK);
        json_decref(pdu);
    }
    /* Reference shapes are per version: v1-2 pairs, v3+ strings. */
    json_t *v1 = good_pdu(1), *v3 = good_pdu(3);
    assert_int_equal(format_of(3, v1), EVENT_FORMAT_BAD);
    assert_int_equal(format_of(1, v3), EVENT_FORMAT_BAD);
    json_decref(v1);
    json_decref(v3);
}

static void test_format_requires_each_key_with_its_type(void **state)
{
    (void)state;
    const char *required[] = {"room_id", "sender", "type", "content", "origin_server_ts", "depth",
                              "hashes", "signatures", "prev_events", "auth_events"};
    for (int n = 1; n <= 11; n++) {
        for (size_t i = 0; i < sizeof(required) / sizeof(required[0]); i++) {
            json_t *pdu = good_pdu(n);
            json_object_del(pdu, required[i]);
            assert_int_equal(format_of(n, pdu), EVENT_FORMAT_BAD);
            json_object_set_new(pdu, required[i], json_true()); /* the wrong type */
            assert_int_equal(format_of(n, pdu), EVENT_FORMAT_BAD);
            json_decref(pdu);
        }
        json_t *pdu = good_pdu(n);
        json_object_del(pdu, "event_id");
        assert_int_equal(format_of(n, pdu), n <= 2 ? EVENT_FORMAT_BAD : EVENT_FORMAT_OK);
        json_decref(pdu);

        const char *wrong[][2] = {{"sender", "\"alice\""}, {"room_id", "\"@r:hs\""},
                                  {"state_key", "5"}, {"unsigned", "[]"},
                                  {"hashes", "{\"sha256\":5}"},
                                  {"signatures", "{\"hs\":{\"ed25519:1\":5}}"}, {"depth", "-1"}};
        for (size_t i = 0; i < sizeof(wrong) / sizeof(wrong[0]); i++) {
            pdu = good_pdu(n);
            json_object_set_new(pdu, wrong[i][0], json_loads(wrong[i][1], JSON_DECODE_ANY, NULL));
            assert_int_equal(format_of(n, pdu), EVENT_FORMAT_BAD);
            json_decref(pdu);
        }
        /* redacts: top level before v11, in content from v11. */
        pdu = good_pdu(n);
        json_object_set_new(pdu, "redacts", json_integer(1));
        assert_int_equal(format_of(n, pdu), n <= 10 ? EVENT_FORMAT_BAD : EVENT_FORMAT_OK);
        json_object_del(pdu, "redacts");
        json_object_set_new(json_object_get(pdu, "content"), "redacts", json_integer(1));
        assert_int_equal(format_of(n, pdu), n <= 10 ? EVENT_FORMAT_OK : EVENT_FORMAT_BAD);
        json_decref(pdu);
    }
}

static void test_format_limits_pass_at_the_limit_and_fail_one_past(void **state)
{
    (void)state;
    for (int n = 1; n <= 11; n++) {
        struct { const char *key, *prefix, *suffix; } ids[] = {
            {"type", "m", ""}, {"state_key", "", ""}, {"sender", "@", ":hs"},
            {"room_id", "!", ":hs"}, {"event_id", "$", ":hs"}};
        for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
            if (strcmp(ids[i].key, "event_id") == 0 && n > 2) continue;
            json_t *pdu = good_pdu(n);
            json_object_set_new(pdu, ids[i].key, sized(ids[i].prefix, EVENT_MAX_ID_BYTES, ids[i].suffix));
            assert_int_equal(format_of(n, pdu), EVENT_FORMAT_OK);
            json_object_set_new(pdu, ids[i].key, sized(ids[i].prefix, EVENT_MAX_ID_BYTES + 1, ids[i].suffix));
            assert_int_equal(format_of(n, pdu), EVENT_FORMAT_TOO_LARGE);
            json_decref(pdu);
        }
        struct { const char *key; size_t max; } refs[] = {{"prev_events", EVENT_MAX_PREV_EVENTS},
                                                         {"auth_events", EVENT_MAX_AUTH_EVENTS}};
        for (size_t i = 0; i < 2; i++) {
            json_t *pdu = good_pdu(n);
            json_t *arr = json_object_get(pdu, refs[i].key);
            json_t *one = json_deep_copy(json_array_get(arr, 0));
            while (json_array_size(arr) < refs[i].max) json_array_append(arr, one);
            assert_int_equal(format_of(n, pdu), EVENT_FORMAT_OK);
            json_array_append(arr, one);
            assert_int_equal(format_of(n, pdu), EVENT_FORMAT_TOO_LARGE);
            json_decref(one);
            json_decref(pdu);
        }
        /* The whole event: exactly EVENT_MAX_PDU_BYTES of canonical JSON passes. */
        json_t *pdu = good_pdu(n);
        size_t len;
        free(cjson_encode(pdu, &len));
        size_t body = strlen("hi") + (EVENT_MAX_PDU_BYTES - len);
        json_object_set_new(json_object_get(pdu, "content"), "body", sized("", body, ""));
        free(cjson_encode(pdu, &len));
        assert_int_equal(len, EVENT_MAX_PDU_BYTES);
        assert_int_equal(format_of(n, pdu), EVENT_FORMAT_OK);
        json_object_set_new(json_object_get(pdu, "content"), "body", sized("", body + 1, ""));
        assert_int_equal(format_of(n, pdu), EVENT_FORMAT_TOO_LARGE);
        json_decref(pdu);
        /* depth: 0 up to 2^53 - 1 (beyond it canonical JSON has no encoding). */
        pdu = good_pdu(n);
        json_object_set_new(pdu, "depth", json_integer(0));
        assert_int_equal(format_of(n, pdu), EVENT_FORMAT_OK);
        json_object_set_new(pdu, "depth", json_integer(EVENT_MAX_DEPTH_V6));
        assert_int_equal(format_of(n, pdu), EVENT_FORMAT_OK);
        json_object_set_new(pdu, "depth", json_integer(EVENT_MAX_DEPTH_V6 + 1));
        assert_int_equal(format_of(n, pdu), EVENT_FORMAT_NOT_CANONICAL);
        json_object_set_new(pdu, "depth", json_integer(-1));
        assert_int_equal(format_of(n, pdu), EVENT_FORMAT_BAD);
        json_object_set_new(pdu, "depth", json_integer(4));
        json_object_set_new(json_object_get(pdu, "content"), "f", json_real(0.5));
        assert_int_equal(format_of(n, pdu), EVENT_FORMAT_NOT_CANONICAL);
        /* An integral real ("2.0"): v6+ refuse any real, older versions encode it as 2. */
        json_object_set_new(json_object_get(pdu, "content"), "f", json_pack("[{s:f}]", "x", 2.0));
        assert_int_equal(format_of(n, pdu), n >= 6 ? EVENT_FORMAT_NOT_CANONICAL : EVENT_FORMAT_OK);
        json_decref(pdu);
    }
}

/* ---- required signers ---------------------------------------------------------------- */

static char *signers(int n, const char *pdu_text)
{
    json_t *pdu = parse(pdu_text);
    json_t *s = event_required_signers(ver(n), pdu);
    assert_non_null(s);
    char *out = json_dumps(s, JSON_COMPACT);
    json_decref(s);
    json_decref(pdu);
    return out;
}

static void assert_signers(int from, int to, const char *pdu_text, const char *want)
{
    for (int n = from; n <= to; n++) {
        char *got = signers(n, pdu_text);
        if (strcmp(got, want) != 0) fail_msg("room version %d: got %s, want %s", n, got, want);
        free(got);
    }
}

static void test_required_signers_per_version(void **state)
{
    (void)state;
    const char *msg = "{\"sender\":\"@a:one\",\"event_id\":\"$e:two\",\"type\":\"m.room.message\","
                      "\"content\":{}}";
    assert_signers(1, 2, msg, "[\"one\",\"two\"]");
    assert_signers(3, 11, msg, "[\"one\"]");
    const char *same = "{\"sender\":\"@a:one\",\"event_id\":\"$e:one\",\"type\":\"m.room.message\","
                       "\"content\":{}}";
    assert_signers(1, 11, same, "[\"one\"]");

    const char *join = "{\"sender\":\"@a:one\",\"type\":\"m.room.member\",\"state_key\":\"@a:one\","
                       "\"content\":{\"membership\":\"join\",\"join_authorised_via_users_server\":"
                       "\"@b:three\"}}";
    assert_signers(3, 7, join, "[\"one\"]");
    assert_signers(8, 11, join, "[\"one\",\"three\"]");
    const char *leave = "{\"sender\":\"@a:one\",\"type\":\"m.room.member\",\"state_key\":\"@a:one\","
                        "\"content\":{\"membership\":\"leave\",\"join_authorised_via_users_server\":"
                        "\"@b:three\"}}";
    assert_signers(3, 7, leave, "[\"one\"]");
    assert_signers(8, 11, leave, "[\"one\",\"three\"]"); /* auth rule 4.2: any membership */

    const char *tpi = "{\"sender\":\"@a:one\",\"event_id\":\"$e:two\",\"type\":\"m.room.member\","
                      "\"state_key\":\"@c:four\",\"content\":{\"membership\":\"invite\","
                      "\"third_party_invite\":{\"signed\":{}}}}";
    assert_signers(1, 2, tpi, "[\"two\"]");
    assert_signers(3, 11, tpi, "[]");
    const char *tpi_same = "{\"sender\":\"@a:one\",\"event_id\":\"$e:one\",\"type\":"
                           "\"m.room.member\",\"state_key\":\"@c:four\",\"content\":{"
                           "\"membership\":\"invite\",\"third_party_invite\":{\"signed\":{}}}}";
    assert_signers(1, 2, tpi_same, "[\"one\"]");
    assert_signers(3, 11, tpi_same, "[]");
}

/* ---- the content hash ---------------------------------------------------------------- */

static void test_content_hash_check_detects_changed_content(void **state)
{
    (void)state;
    json_t *pdu = parse(VEC_MSG);
    assert_false(event_content_hash_ok(pdu)); /* no hashes yet */
    assert_int_equal(event_add_content_hash(pdu), 0);
    assert_true(event_content_hash_ok(pdu));
    /* unsigned and signatures are not covered. */
    json_object_set_new(pdu, "unsigned", json_pack("{s:i}", "age", 9));
    json_object_set_new(pdu, "signatures", json_pack("{s:{s:s}}", "hs", "ed25519:1", "x"));
    assert_true(event_content_hash_ok(pdu));
    /* Padded and URL-safe spellings of the same hash are the same hash. */
    json_object_set_new(pdu, "hashes", json_pack("{s:s}", "sha256",
                                                 "MyyJ30gOqs-Os9AvJ_riLA63AUExu-SjoHPxWcyDioo="));
    assert_true(event_content_hash_ok(pdu));
    json_object_set_new(json_object_get(pdu, "content"), "body", json_string("changed"));
    assert_false(event_content_hash_ok(pdu));
    json_object_set_new(pdu, "hashes", json_pack("{s:s}", "sha256", "not base64!"));
    assert_false(event_content_hash_ok(pdu));
    json_decref(pdu);
}

int main(void)
{
    if (sodium_init() < 0) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spec_appendix_events_hash_and_sign_as_the_appendix_says),
        cmocka_unit_test(test_v1_and_v2_event_ids_are_the_events_own),
        cmocka_unit_test(test_v1_events_this_server_writes_get_an_id_and_reference_pairs),
        cmocka_unit_test(test_v3_ids_use_standard_base64_and_v4_on_url_safe),
        cmocka_unit_test(test_v1_reference_hash_covers_the_event_id),
        cmocka_unit_test(test_references_read_as_plain_ids_whether_pairs_or_strings),
        cmocka_unit_test(test_a_v1_reference_pair_carries_the_events_reference_hash),
        cmocka_unit_test(test_a_v1_event_this_server_creates_names_this_server),
        cmocka_unit_test(test_each_version_has_the_features_its_spec_page_adds),
        cmocka_unit_test(test_redaction_keeps_what_each_version_keeps),
        cmocka_unit_test(test_format_accepts_a_good_pdu_of_each_version),
        cmocka_unit_test(test_format_requires_each_key_with_its_type),
        cmocka_unit_test(test_format_limits_pass_at_the_limit_and_fail_one_past),
        cmocka_unit_test(test_required_signers_per_version),
        cmocka_unit_test(test_content_hash_check_detects_changed_content),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
