/*
 * tests/unit/test_e2ee.c - the pure rules of the E2EE plumbing: "<algorithm>:<id>" key IDs,
 * which device_keys and cross-signing keys a user may upload, which backed-up session key
 * wins, and which identifiers are acceptable.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "core/client/e2ee/e2ee.h"

static void test_key_ids_need_an_algorithm_and_an_id(void **state)
{
    (void)state;
    assert_int_equal(e2ee_key_algorithm_len("signed_curve25519:AAAAHg"), 17);
    assert_int_equal(e2ee_key_algorithm_len("a:b:c"), 1); /* the ID may hold colons */
    assert_int_equal(e2ee_key_algorithm_len("nocolon"), -1);
    assert_int_equal(e2ee_key_algorithm_len(":id"), -1);
    assert_int_equal(e2ee_key_algorithm_len("alg:"), -1);
}

static json_t *device_keys(const char *user, const char *device)
{
    return json_pack("{s:s, s:s, s:[s], s:{s:s}, s:{s:{s:s}}}", "user_id", user, "device_id",
                     device, "algorithms", "m.olm.v1.curve25519-aes-sha2", "keys",
                     "ed25519:DEV", "pub", "signatures", user, "ed25519:DEV", "sig");
}

static void test_device_keys_must_be_well_formed_and_the_callers_own(void **state)
{
    (void)state;
    const char *errcode;
    json_t *k = device_keys("@a:hs", "DEV");
    assert_null(e2ee_check_device_keys(k, "@a:hs", "DEV", &errcode));
    assert_non_null(e2ee_check_device_keys(k, "@b:hs", "DEV", &errcode));
    assert_string_equal(errcode, "M_INVALID_PARAM");
    assert_non_null(e2ee_check_device_keys(k, "@a:hs", "OTHER", &errcode));
    assert_string_equal(errcode, "M_INVALID_PARAM");

    json_object_set_new(k, "keys", json_pack("{s:s}", "nocolon", "pub"));
    assert_non_null(e2ee_check_device_keys(k, "@a:hs", "DEV", &errcode));
    assert_string_equal(errcode, "M_BAD_JSON");
    json_object_set_new(k, "keys", json_object());
    assert_non_null(e2ee_check_device_keys(k, "@a:hs", "DEV", &errcode));
    json_decref(k);

    k = device_keys("@a:hs", "DEV");
    json_object_set_new(k, "algorithms", json_pack("[i]", 1));
    assert_non_null(e2ee_check_device_keys(k, "@a:hs", "DEV", &errcode));
    assert_string_equal(errcode, "M_BAD_JSON");
    json_decref(k);

    k = device_keys("@a:hs", "DEV");
    json_object_del(k, "signatures");
    assert_non_null(e2ee_check_device_keys(k, "@a:hs", "DEV", &errcode));
    json_decref(k);

    json_t *not_object = json_string("keys");
    assert_non_null(e2ee_check_device_keys(not_object, "@a:hs", "DEV", &errcode));
    assert_string_equal(errcode, "M_BAD_JSON");
    json_decref(not_object);
}

static void test_cross_signing_keys_have_one_ed25519_key_their_usage_and_owner(void **state)
{
    (void)state;
    const char *pub = NULL;
    json_t *k = json_pack("{s:s, s:[s], s:{s:s}}", "user_id", "@a:hs", "usage", "master", "keys",
                          "ed25519:PUBKEY", "PUBKEY");
    assert_null(e2ee_check_cross_signing_key(k, "@a:hs", "master", &pub));
    assert_string_equal(pub, "PUBKEY");
    assert_non_null(e2ee_check_cross_signing_key(k, "@a:hs", "self_signing", &pub));
    assert_non_null(e2ee_check_cross_signing_key(k, "@b:hs", "master", &pub));

    json_object_set_new(k, "keys", json_pack("{s:s, s:s}", "ed25519:A", "A", "ed25519:B", "B"));
    assert_non_null(e2ee_check_cross_signing_key(k, "@a:hs", "master", &pub));
    json_object_set_new(k, "keys", json_pack("{s:s}", "curve25519:A", "A"));
    assert_non_null(e2ee_check_cross_signing_key(k, "@a:hs", "master", &pub));
    json_object_set_new(k, "keys", json_pack("{s:s}", "ed25519:A", "A"));
    json_object_set_new(k, "signatures", json_pack("{s:s}", "@a:hs", "flat"));
    assert_non_null(e2ee_check_cross_signing_key(k, "@a:hs", "master", &pub));
    json_object_set_new(k, "signatures", json_pack("{s:{s:s}}", "@a:hs", "ed25519:D", "sig"));
    assert_null(e2ee_check_cross_signing_key(k, "@a:hs", "master", &pub));
    json_decref(k);
}

static void test_a_better_backed_up_session_key_replaces_the_stored_one(void **state)
{
    (void)state;
    /* verified beats unverified, whatever the index */
    assert_true(e2ee_backup_should_replace(false, 0, 0, true, 10, 5));
    assert_false(e2ee_backup_should_replace(true, 10, 5, false, 0, 0));
    /* then the lower first message index */
    assert_true(e2ee_backup_should_replace(true, 5, 0, true, 3, 9));
    assert_false(e2ee_backup_should_replace(true, 3, 0, true, 5, 0));
    /* then the fewer forwards; an equal key is kept */
    assert_true(e2ee_backup_should_replace(false, 3, 2, false, 3, 1));
    assert_false(e2ee_backup_should_replace(false, 3, 1, false, 3, 1));
}

static void test_identifiers_are_bounded_and_printable(void **state)
{
    (void)state;
    char id[E2EE_MAX_ID_BYTES + 2];
    memset(id, 'a', sizeof(id));
    id[E2EE_MAX_ID_BYTES] = '\0';
    assert_true(e2ee_id_ok(id));
    id[E2EE_MAX_ID_BYTES] = 'a';
    id[E2EE_MAX_ID_BYTES + 1] = '\0';
    assert_false(e2ee_id_ok(id));
    assert_false(e2ee_id_ok(""));
    assert_false(e2ee_id_ok("a\nb"));
    assert_true(e2ee_id_ok("$event:hs"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_ids_need_an_algorithm_and_an_id),
        cmocka_unit_test(test_device_keys_must_be_well_formed_and_the_callers_own),
        cmocka_unit_test(test_cross_signing_keys_have_one_ed25519_key_their_usage_and_owner),
        cmocka_unit_test(test_a_better_backed_up_session_key_replaces_the_stored_one),
        cmocka_unit_test(test_identifiers_are_bounded_and_printable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
