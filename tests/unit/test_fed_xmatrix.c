/*
 * tests/unit/test_fed_xmatrix.c - the X-Matrix Authorization header: what we send is what
 * an independent implementation computes, what we receive is checked against every way a
 * request can differ from what was signed, and the parser survives any malformed header.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <sodium.h>

#include "core/runtime/base64.h"
#include "core/federation/transport/fed_xmatrix.h"
#include "core/rooms/canonical_json.h"

#define ORIGIN "origin.example"
#define DEST "dest.example"
#define PROFILE_URI "/_matrix/federation/v1/query/profile?user_id=%40a%3Ab"
#define SEND_URI "/_matrix/federation/v1/send/1234"

/*
 * Known vectors, computed independently with Python 3 and PyNaCl 1.5 (Debian's
 * python3-nacl), not with this code:
 *
 *   import base64, json, nacl.signing
 *   cj = lambda o: json.dumps(o, sort_keys=True, separators=(',', ':'),
 *                             ensure_ascii=False).encode()
 *   k = nacl.signing.SigningKey(bytes(range(32)))
 *   req = {"method": "GET", "uri": PROFILE_URI, "origin": ORIGIN, "destination": DEST}
 *   base64.b64encode(k.sign(cj(req)).signature).decode().rstrip('=')
 *
 * and the same for the PUT with the content of send_content() below.
 */
#define GET_SIG_PYNACL                                                                     \
    "itOuD7zHueMcd504Smtl8COnHJQi/EG0RWMcizsVV0vloTpWgypc/Qj2WHgNxrpqZHQZKmBR+bVindx269BaAg"
#define PUT_SIG_PYNACL                                                                     \
    "DZNsM8DIDrBa19JyMJoNWOHZuQkw2nS4P+CAh+TjT53iUZOnnRjmFPoif2ZRjnMDrblnUZ+1+rBq15vkrUJ5Aw"

static fed_signing_key key;

static int setup(void **state)
{
    (void)state;
    unsigned char seed[FED_SEED_BYTES];
    for (int i = 0; i < FED_SEED_BYTES; i++) seed[i] = (unsigned char)i;
    return fed_signing_key_from_seed(seed, "a_test", &key);
}

static json_t *send_content(void)
{
    return json_pack("{s:[], s:[{s:s, s:{s:s, s:b}}]}", "pdus", "edus", "edu_type", "m.typing",
                     "content", "room_id", "!r:" ORIGIN, "typing", 1);
}

static void test_outbound_header_matches_an_independent_signer(void **state)
{
    (void)state;
    char h[FED_XMATRIX_HEADER_MAX_BYTES];
    assert_int_equal(fed_xmatrix_header("GET", PROFILE_URI, ORIGIN, DEST, NULL, &key, h,
                                        sizeof(h)), 0);
    assert_string_equal(h, "X-Matrix origin=\"" ORIGIN "\",destination=\"" DEST
                           "\",key=\"ed25519:a_test\",sig=\"" GET_SIG_PYNACL "\"");
    json_t *content = send_content();
    assert_int_equal(fed_xmatrix_header("PUT", SEND_URI, ORIGIN, DEST, content, &key, h,
                                        sizeof(h)), 0);
    assert_non_null(strstr(h, "sig=\"" PUT_SIG_PYNACL "\""));
    json_decref(content);
}

static void test_round_trip_verifies(void **state)
{
    (void)state;
    char h[FED_XMATRIX_HEADER_MAX_BYTES], why[256] = "";
    json_t *content = send_content();
    assert_int_equal(fed_xmatrix_header("PUT", SEND_URI, ORIGIN, DEST, content, &key, h,
                                        sizeof(h)), 0);
    fed_xmatrix x;
    assert_int_equal(fed_xmatrix_parse(h, &x, why, sizeof(why)), 0);
    assert_string_equal(x.origin, ORIGIN);
    assert_string_equal(x.destination, DEST);
    assert_string_equal(x.key, "ed25519:a_test");
    assert_string_equal(x.sig, PUT_SIG_PYNACL);
    assert_int_equal(fed_xmatrix_verify("PUT", SEND_URI, DEST, content, &x, key.public_key, why,
                                        sizeof(why)), 0);
    /* The same body parsed again (another object, keys in another order) still verifies. */
    json_t *reparsed = json_loads("{\"edus\":[{\"content\":{\"typing\":true,\"room_id\":\"!r:"
                                  ORIGIN "\"},\"edu_type\":\"m.typing\"}],\"pdus\":[]}", 0, NULL);
    assert_int_equal(fed_xmatrix_verify("PUT", SEND_URI, DEST, reparsed, &x, key.public_key, why,
                                        sizeof(why)), 0);
    json_decref(reparsed);
    json_decref(content);
}

static void test_each_difference_from_what_was_signed_is_refused(void **state)
{
    (void)state;
    char h[FED_XMATRIX_HEADER_MAX_BYTES], why[256];
    json_t *content = send_content();
    assert_int_equal(fed_xmatrix_header("PUT", SEND_URI, ORIGIN, DEST, content, &key, h,
                                        sizeof(h)), 0);
    fed_xmatrix x;
    assert_int_equal(fed_xmatrix_parse(h, &x, why, sizeof(why)), 0);

    /* A body altered after signing. */
    json_t *altered = send_content();
    json_array_append_new(json_object_get(altered, "pdus"), json_object());
    assert_int_equal(fed_xmatrix_verify("PUT", SEND_URI, DEST, altered, &x, key.public_key, why,
                                        sizeof(why)), FED_SIG_E_BAD);
    json_decref(altered);
    /* The body dropped. */
    assert_int_equal(fed_xmatrix_verify("PUT", SEND_URI, DEST, NULL, &x, key.public_key, why,
                                        sizeof(why)), FED_SIG_E_BAD);
    /* Another method, another uri (also: the decoded form of the same uri). */
    assert_int_equal(fed_xmatrix_verify("POST", SEND_URI, DEST, content, &x, key.public_key,
                                        why, sizeof(why)), FED_SIG_E_BAD);
    assert_int_equal(fed_xmatrix_verify("PUT", SEND_URI "5", DEST, content, &x, key.public_key,
                                        why, sizeof(why)), FED_SIG_E_BAD);
    /* Addressed to another server. */
    assert_int_equal(fed_xmatrix_verify("PUT", SEND_URI, "me.example", content, &x,
                                        key.public_key, why, sizeof(why)),
                     FED_XMATRIX_E_DESTINATION);
    assert_non_null(strstr(why, DEST));
    assert_non_null(strstr(why, "me.example"));
    /* A header without destination is checked as if it named us: signed for DEST, it does
     * not verify at me.example. */
    fed_xmatrix nodest = x;
    nodest.destination[0] = '\0';
    assert_int_equal(fed_xmatrix_verify("PUT", SEND_URI, DEST, content, &nodest, key.public_key,
                                        why, sizeof(why)), 0);
    assert_int_equal(fed_xmatrix_verify("PUT", SEND_URI, "me.example", content, &nodest,
                                        key.public_key, why, sizeof(why)), FED_SIG_E_BAD);
    /* Another origin claimed with the same signature. */
    fed_xmatrix forged = x;
    snprintf(forged.origin, sizeof(forged.origin), "evil.example");
    assert_int_equal(fed_xmatrix_verify("PUT", SEND_URI, DEST, content, &forged, key.public_key,
                                        why, sizeof(why)), FED_SIG_E_BAD);
    /* A signature by another key. */
    unsigned char other_pub[FED_PUBLIC_KEY_BYTES], other_sk[FED_SECRET_KEY_BYTES];
    crypto_sign_keypair(other_pub, other_sk);
    assert_int_equal(fed_xmatrix_verify("PUT", SEND_URI, DEST, content, &x, other_pub, why,
                                        sizeof(why)), FED_SIG_E_BAD);
    assert_string_equal(fed_xmatrix_reason(FED_SIG_E_BAD), "bad_signature");
    /* A signature that is not base64. */
    fed_xmatrix garbled = x;
    garbled.sig[3] = '*';
    assert_int_equal(fed_xmatrix_verify("PUT", SEND_URI, DEST, content, &garbled,
                                        key.public_key, why, sizeof(why)), FED_SIG_E_BASE64);
    /* A key of another algorithm. */
    fed_xmatrix rsa = x;
    snprintf(rsa.key, sizeof(rsa.key), "rsa:1");
    assert_int_equal(fed_xmatrix_verify("PUT", SEND_URI, DEST, content, &rsa, key.public_key,
                                        why, sizeof(why)), FED_SIG_E_ALGORITHM);
    json_decref(content);
}

static void test_no_header_or_another_scheme_is_missing(void **state)
{
    (void)state;
    fed_xmatrix x;
    char why[128];
    assert_int_equal(fed_xmatrix_parse(NULL, &x, why, sizeof(why)), FED_XMATRIX_E_MISSING);
    assert_int_equal(fed_xmatrix_parse("", &x, why, sizeof(why)), FED_XMATRIX_E_MISSING);
    assert_int_equal(fed_xmatrix_parse("Bearer syt_abc", &x, why, sizeof(why)),
                     FED_XMATRIX_E_MISSING);
    assert_int_equal(fed_xmatrix_parse("X-Matrixorigin=a", &x, why, sizeof(why)),
                     FED_XMATRIX_E_MISSING);
    assert_string_equal(fed_xmatrix_reason(FED_XMATRIX_E_MISSING), "missing");
}

static void test_parser_accepts_the_spec_grammar(void **state)
{
    (void)state;
    static const char *const ok[] = {
        /* the compatible form */
        "X-Matrix origin=\"o.example\",destination=\"d.example\",key=\"ed25519:k\",sig=\"c2ln\"",
        /* scheme and names case-insensitive, any order, several spaces after the scheme */
        "x-matrix   SIG=\"c2ln\",Key=\"ed25519:k\",DESTINATION=\"d.example\",Origin=\"o.example\"",
        /* bare tokens; a colon unquoted (compatibility); spaces and tabs around commas */
        "X-Matrix origin=o.example , destination=d.example\t,\tkey=ed25519:k ,sig=c2ln",
        /* escapes in quoted strings are undone */
        "X-Matrix origin=\"o.exa\\mple\",destination=\"d.example\",key=\"ed25519:\\k\",sig=\"c2ln\"",
        /* unknown parameters ignored, even twice; empty list elements; a trailing comma */
        "X-Matrix foo=\"bar\",,origin=\"o.example\",foo=1,destination=\"d.example\","
        "key=\"ed25519:k\",sig=\"c2ln\",",
        /* = around BWS */
        "X-Matrix origin = \"o.example\",destination= \"d.example\",key =\"ed25519:k\",sig=c2ln",
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        fed_xmatrix x;
        char why[256] = "";
        int rc = fed_xmatrix_parse(ok[i], &x, why, sizeof(why));
        if (rc != 0) fail_msg("case %zu refused: %s", i, why);
        assert_string_equal(x.origin, "o.example");
        assert_string_equal(x.destination, "d.example");
        assert_string_equal(x.key, "ed25519:k");
        assert_string_equal(x.sig, "c2ln");
    }
    /* destination is optional (servers before v1.3). */
    fed_xmatrix x;
    assert_int_equal(fed_xmatrix_parse("X-Matrix origin=o.example,key=ed25519:k,sig=c2ln", &x,
                                       NULL, 0), 0);
    assert_string_equal(x.destination, "");
    /* A base64 signature with / + and padding, unquoted. */
    assert_int_equal(fed_xmatrix_parse("X-Matrix origin=o,key=ed25519:k,sig=ab/+cd==", &x,
                                       NULL, 0), 0);
    assert_string_equal(x.sig, "ab/+cd==");
    /* A quoted value may contain commas and spaces. */
    assert_int_equal(fed_xmatrix_parse("X-Matrix origin=o,key=ed25519:k,sig=s,x=\"a, b=c\"", &x,
                                       NULL, 0), 0);
}

static void test_parser_refuses_each_malformed_header_with_a_reason(void **state)
{
    (void)state;
    char big[FED_XMATRIX_HEADER_MAX_BYTES + 64];
    snprintf(big, sizeof(big), "X-Matrix origin=o,key=ed25519:k,sig=s,pad=\"%0*d\"",
             FED_XMATRIX_HEADER_MAX_BYTES, 0);
    char long_origin[FED_SERVER_NAME_MAX_BYTES + 64];
    snprintf(long_origin, sizeof(long_origin), "X-Matrix origin=%0*d,key=ed25519:k,sig=s",
             FED_SERVER_NAME_MAX_BYTES, 0);
    char long_sig[256];
    snprintf(long_sig, sizeof(long_sig), "X-Matrix origin=o,key=ed25519:k,sig=\"%0*d\"",
             FED_XMATRIX_SIG_MAX_BYTES, 0);
    const struct {
        const char *h, *reason;
    } bad[] = {
        {"X-Matrix", "no parameters"},
        {"X-Matrix ", "no \"origin\""},
        {"X-Matrix key=ed25519:k,sig=s", "no \"origin\""},
        {"X-Matrix origin=o,sig=s", "no \"key\""},
        {"X-Matrix origin=o,key=ed25519:k", "no \"sig\""},
        {"X-Matrix origin=o,origin=p,key=ed25519:k,sig=s", "twice"},
        {"X-Matrix origin=o,ORIGIN=o,key=ed25519:k,sig=s", "twice"},
        {"X-Matrix origin=o,key=ed25519:k,sig=s,sig=s", "twice"},
        {"X-Matrix origin=\"o,key=ed25519:k,sig=s", "unterminated"},
        {"X-Matrix origin=\"o\\", "unterminated"},
        {"X-Matrix origin=\"o\"x,key=ed25519:k,sig=s", "unexpected character"},
        {"X-Matrix origin=o p,key=ed25519:k,sig=s", "unexpected character"},
        {"X-Matrix origin,key=ed25519:k,sig=s", "no value"},
        {"X-Matrix origin=,key=ed25519:k,sig=s", "empty"},
        {"X-Matrix origin=\"\",key=ed25519:k,sig=s", "empty"},
        {"X-Matrix =o,key=ed25519:k,sig=s", "unexpected character"},
        {"X-Matrix origin=\"o\x01\",key=ed25519:k,sig=s", "control character"},
        {"X-Matrix origin=\"o\\\x7f\",key=ed25519:k,sig=s", "control character"},
        {"X-Matrix origin=o;key=ed25519:k,sig=s", "unexpected character"},
        {"X-Matrix origin=o,key=ed25519:k,sig=s,\"x\"=1", "unexpected character"},
        {"X-Matrix origin=o\r\n,key=ed25519:k,sig=s", "unexpected character"},
        {long_origin, "longer than"},
        {long_sig, "longer than"},
        {big, "longer than"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        fed_xmatrix x;
        char why[256] = "";
        int rc = fed_xmatrix_parse(bad[i].h, &x, why, sizeof(why));
        if (rc != FED_XMATRIX_E_MALFORMED || !strstr(why, bad[i].reason))
            fail_msg("case %zu: rc %d, \"%s\" (wanted \"%s\")", i, rc, why, bad[i].reason);
        static const fed_xmatrix zero;
        assert_memory_equal(&x, &zero, sizeof(x));
    }
}

/* Random mutations of a good header: the parser never reads or writes out of bounds
 * (ASan would say), and whatever it accepts is NUL-terminated within each field and has
 * the three required values. */
static void test_parser_survives_random_mutations(void **state)
{
    (void)state;
    static const char good[] =
        "X-Matrix origin=\"o.example:8448\",destination=\"d.example\",key=\"ed25519:k\","
        "sig=\"itOuD7zHueMcd504Smtl8COnHJQi/EG0RWMcizsVV0vloTpWgypc\"";
    static const char alphabet[] = "\"\\,= \t:aZ\x01\x7f\xff";
    uint32_t rng = 12345;
    int accepted = 0;
    for (int round = 0; round < 20000; round++) {
        char h[sizeof(good) + 8];
        memcpy(h, good, sizeof(good));
        size_t len = sizeof(good) - 1;
        int edits = 1 + (int)(rng % 4);
        for (int e = 0; e < edits; e++) {
            rng = rng * 1103515245u + 12345u;
            size_t at = (rng >> 8) % len;
            rng = rng * 1103515245u + 12345u;
            h[at] = alphabet[(rng >> 8) % (sizeof(alphabet) - 1)];
        }
        rng = rng * 1103515245u + 12345u;
        if ((rng >> 8) % 5 == 0) h[(rng >> 12) % len] = '\0'; /* truncate */
        fed_xmatrix x;
        if (fed_xmatrix_parse(h, &x, NULL, 0) == 0) {
            accepted++;
            assert_true(strlen(x.origin) > 0 && strlen(x.origin) < sizeof(x.origin));
            assert_true(strlen(x.key) > 0 && strlen(x.key) < sizeof(x.key));
            assert_true(strlen(x.sig) > 0 && strlen(x.sig) < sizeof(x.sig));
        }
    }
    /* Some mutations land in values and stay well-formed: both outcomes were exercised. */
    assert_true(accepted > 0 && accepted < 20000);
}

static void test_header_refuses_unsendable_names_and_small_buffers(void **state)
{
    (void)state;
    char h[FED_XMATRIX_HEADER_MAX_BYTES];
    assert_int_equal(fed_xmatrix_header("GET", "/x", "o\"rigin", DEST, NULL, &key, h, sizeof(h)),
                     ATRIUM_E_INVAL);
    assert_int_equal(fed_xmatrix_header("GET", "/x", ORIGIN, "d\\est", NULL, &key, h, sizeof(h)),
                     ATRIUM_E_INVAL);
    json_t *f = json_pack("{s:f}", "x", 0.5);
    assert_int_equal(fed_xmatrix_header("PUT", "/x", ORIGIN, DEST, f, &key, h, sizeof(h)),
                     ATRIUM_E_INVAL);
    json_decref(f);
    char small[64];
    assert_int_equal(fed_xmatrix_header("GET", "/x", ORIGIN, DEST, NULL, &key, small,
                                        sizeof(small)), ATRIUM_E_LIMIT);
    assert_string_equal(small, "");
}

/* fed_xmatrix_verify_raw: the body's bytes as sent, for bodies this server cannot encode
 * canonically (a real, an integer past 2^53) but the sender signed as sent. */
static void test_raw_body_verifies_what_was_sent_and_nothing_else(void **state)
{
    (void)state;
    char h[FED_XMATRIX_HEADER_MAX_BYTES], why[256] = "";
    json_t *content = send_content();
    assert_int_equal(fed_xmatrix_header("PUT", SEND_URI, ORIGIN, DEST, content, &key, h,
                                        sizeof(h)), 0);
    json_decref(content);
    fed_xmatrix x;
    assert_int_equal(fed_xmatrix_parse(h, &x, why, sizeof(why)), 0);
    const char *sent = "{\"edus\":[{\"content\":{\"room_id\":\"!r:" ORIGIN "\",\"typing\":true},"
                       "\"edu_type\":\"m.typing\"}],\"pdus\":[]}";
    assert_int_equal(fed_xmatrix_verify_raw("PUT", SEND_URI, DEST, sent, strlen(sent), &x,
                                            key.public_key, why, sizeof(why)), 0);
    assert_int_equal(fed_xmatrix_verify_raw("PUT", SEND_URI, DEST, sent, strlen(sent) - 1, &x,
                                            key.public_key, why, sizeof(why)), FED_SIG_E_BAD);
    assert_int_equal(fed_xmatrix_verify_raw("POST", SEND_URI, DEST, sent, strlen(sent), &x,
                                            key.public_key, why, sizeof(why)), FED_SIG_E_BAD);
    assert_int_equal(fed_xmatrix_verify_raw("PUT", SEND_URI, "me.example", sent, strlen(sent),
                                            &x, key.public_key, why, sizeof(why)),
                     FED_XMATRIX_E_DESTINATION);
    /* A real as its sender wrote it ("2.0"), signed over those bytes: re-encoded here it
     * would read "2" and fail; as sent it verifies. */
    const char *body = "{\"pdus\":[{\"n\":2.0}]}";
    char signed_bytes[512];
    int n = snprintf(signed_bytes, sizeof(signed_bytes),
                     "{\"content\":%s,\"destination\":\"" DEST "\",\"method\":\"PUT\","
                     "\"origin\":\"" ORIGIN "\",\"uri\":\"" SEND_URI "\"}", body);
    unsigned char sig[FED_SIGNATURE_BYTES];
    crypto_sign_detached(sig, NULL, (const unsigned char *)signed_bytes, (size_t)n, key.secret_key);
    cjson_b64(sig, sizeof(sig), false, x.sig, sizeof(x.sig));
    json_t *parsed = json_loads(body, 0, NULL);
    assert_int_equal(fed_xmatrix_verify("PUT", SEND_URI, DEST, parsed, &x, key.public_key, why,
                                        sizeof(why)), FED_SIG_E_BAD);
    assert_int_equal(fed_xmatrix_verify_raw("PUT", SEND_URI, DEST, body, strlen(body), &x,
                                            key.public_key, why, sizeof(why)), 0);
    json_decref(parsed);
}

int main(void)
{
    if (sodium_init() < 0) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_outbound_header_matches_an_independent_signer),
        cmocka_unit_test(test_round_trip_verifies),
        cmocka_unit_test(test_each_difference_from_what_was_signed_is_refused),
        cmocka_unit_test(test_raw_body_verifies_what_was_sent_and_nothing_else),
        cmocka_unit_test(test_no_header_or_another_scheme_is_missing),
        cmocka_unit_test(test_parser_accepts_the_spec_grammar),
        cmocka_unit_test(test_parser_refuses_each_malformed_header_with_a_reason),
        cmocka_unit_test(test_parser_survives_random_mutations),
        cmocka_unit_test(test_header_refuses_unsendable_names_and_small_buffers),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
