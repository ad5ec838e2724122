/*
 * tests/unit/test_hmac_sha1.c - SHA-1 and HMAC-SHA1 against published test vectors
 * (FIPS 180 examples, RFC 2202), and the admin-registration MAC against a value computed
 * independently (Python's hmac module), so the server and `atrium register-user` agree
 * with every other client of the Synapse-shaped endpoint.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/client/accounts/admin_register.h"
#include "core/runtime/hmac_sha1.h"

static void hex(const unsigned char *d, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[d[i] >> 4];
        out[2 * i + 1] = digits[d[i] & 15];
    }
    out[2 * n] = '\0';
}

static void sha1_hex(const void *data, size_t len, char out[41])
{
    rt_sha1_ctx c;
    unsigned char d[RT_SHA1_DIGEST_BYTES];
    rt_sha1_init(&c);
    rt_sha1_update(&c, data, len);
    rt_sha1_final(&c, d);
    hex(d, sizeof(d), out);
}

static void test_sha1_matches_the_standard_examples(void **state)
{
    (void)state;
    char out[41];
    sha1_hex("abc", 3, out);
    assert_string_equal(out, "a9993e364706816aba3e25717850c26c9cd0d89d");
    sha1_hex("", 0, out);
    assert_string_equal(out, "da39a3ee5e6b4b0d3255bfef95601890afd80709");
    const char *two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    sha1_hex(two_blocks, strlen(two_blocks), out);
    assert_string_equal(out, "84983e441c3bd26ebaae4aa1f95129e5e54670f1");
}

static void test_sha1_of_a_million_bytes_fed_in_odd_pieces(void **state)
{
    (void)state;
    enum { TOTAL = 1000000, PIECE = 777 };
    char *a = malloc(TOTAL);
    assert_non_null(a);
    memset(a, 'a', TOTAL);
    rt_sha1_ctx c;
    rt_sha1_init(&c);
    for (size_t off = 0; off < TOTAL; off += PIECE)
        rt_sha1_update(&c, a + off, off + PIECE <= TOTAL ? PIECE : TOTAL - off);
    unsigned char d[RT_SHA1_DIGEST_BYTES];
    rt_sha1_final(&c, d);
    char out[41];
    hex(d, sizeof(d), out);
    assert_string_equal(out, "34aa973cd4c4daa4f61eeb2bdbad27316534016f");
    free(a);
}

static void test_hmac_sha1_matches_rfc_2202(void **state)
{
    (void)state;
    unsigned char key[20], mac[RT_SHA1_DIGEST_BYTES];
    char out[41];
    memset(key, 0x0b, sizeof(key));
    rt_hmac_sha1(key, sizeof(key), "Hi There", 8, mac);
    hex(mac, sizeof(mac), out);
    assert_string_equal(out, "b617318655057264e28bc0b6fb378c8ef146be00");
    const char *what = "what do ya want for nothing?";
    rt_hmac_sha1("Jefe", 4, what, strlen(what), mac);
    hex(mac, sizeof(mac), out);
    assert_string_equal(out, "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79");
}

static void test_hmac_sha1_hashes_a_key_longer_than_a_block(void **state)
{
    (void)state;
    char key[100];
    memset(key, 'k', sizeof(key));
    unsigned char mac[RT_SHA1_DIGEST_BYTES];
    char out[41];
    rt_hmac_sha1(key, sizeof(key), "msg", 3, mac);
    hex(mac, sizeof(mac), out);
    assert_string_equal(out, "a3f6e90d792b6ca5ed3bfc556a4aa73d62d7cae4");
}

static void test_admin_mac_is_over_nul_separated_fields_and_the_role(void **state)
{
    (void)state;
    char out[ADMIN_MAC_HEX_CHARS + 1], notadmin[ADMIN_MAC_HEX_CHARS + 1];
    admin_register_mac("secret", "abc123", "alice", "pw", true, out);
    assert_string_equal(out, "5a0a1218a9e986bf838bd6a0b382351bb64b90ab");
    admin_register_mac("secret", "abc123", "alice", "pw", false, notadmin);
    assert_string_not_equal(out, notadmin);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sha1_matches_the_standard_examples),
        cmocka_unit_test(test_sha1_of_a_million_bytes_fed_in_odd_pieces),
        cmocka_unit_test(test_hmac_sha1_matches_rfc_2202),
        cmocka_unit_test(test_hmac_sha1_hashes_a_key_longer_than_a_block),
        cmocka_unit_test(test_admin_mac_is_over_nul_separated_fields_and_the_role),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
