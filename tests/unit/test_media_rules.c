/*
 * tests/unit/test_media_rules.c - the media plugin's pure rules: which media IDs reach the
 * store (server names are the core's grammar, asked through the host:
 * tests/unit/test_server_name.c), what Content-Disposition says, how If-None-Match and Range
 * are read, which configured thumbnail size a request gets, and SHA-256 itself.
 *
 * The plugin is a shared object built only from include/atrium/, so its pure files are
 * compiled into this test directly (they need nothing but libc and the public headers).
 */
#include "plugins/media/headers.c"
#include "plugins/media/sha256.c"
#include "plugins/media/sizes.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

const atrium_host *media_host; /* declared by media.h; unused by the pure files */

static void media_ids_are_whitelisted(void **state)
{
    (void)state;
    assert_true(media_id_valid("AbCdEf012_-"));
    assert_false(media_id_valid(""));
    assert_false(media_id_valid("../etc/passwd"));
    assert_false(media_id_valid("a.b"));
    assert_false(media_id_valid("a/b"));
    assert_false(media_id_valid("a b"));
    assert_false(media_id_valid("caf\xc3\xa9"));
    char long_id[MEDIA_ID_MAX_CHARS + 2];
    memset(long_id, 'a', sizeof(long_id) - 1);
    long_id[sizeof(long_id) - 1] = '\0';
    assert_false(media_id_valid(long_id));
    long_id[MEDIA_ID_MAX_CHARS] = '\0';
    assert_true(media_id_valid(long_id));
}

static void inline_only_for_the_safe_list(void **state)
{
    (void)state;
    assert_true(media_type_inline("image/png"));
    assert_true(media_type_inline("IMAGE/PNG"));
    assert_true(media_type_inline("text/plain; charset=utf-8"));
    assert_false(media_type_inline("text/html"));
    assert_false(media_type_inline("image/svg+xml"));
    assert_false(media_type_inline("application/javascript"));
    assert_false(media_type_inline(""));
    assert_true(media_type_thumbnail_safe("image/jpeg"));
    assert_false(media_type_thumbnail_safe("image/svg+xml"));
    assert_true(media_type_acceptable("image/png"));
    assert_false(media_type_acceptable("image/png\r\nX-Evil: 1"));
    assert_false(media_type_acceptable("noslash"));
}

static void file_names_must_be_clean_utf8(void **state)
{
    (void)state;
    assert_true(media_name_acceptable("r\xc3\xa9sum\xc3\xa9.pdf"));
    assert_true(media_name_acceptable("\xf0\x9f\x98\x80.png"));
    assert_false(media_name_acceptable("a\nb"));
    assert_false(media_name_acceptable("\xc0\xaf"));         /* overlong "/" */
    assert_false(media_name_acceptable("\xed\xa0\x80"));     /* a surrogate */
    assert_false(media_name_acceptable("\xf4\x90\x80\x80")); /* past U+10FFFF */
    assert_false(media_name_acceptable("\xe2\x82"));         /* cut short */
}

static void disposition_quotes_ascii_and_encodes_the_rest(void **state)
{
    (void)state;
    char out[256];
    assert_int_equal(media_content_disposition(out, sizeof(out), true, NULL), 0);
    assert_string_equal(out, "inline");
    assert_int_equal(media_content_disposition(out, sizeof(out), false, ""), 0);
    assert_string_equal(out, "attachment");
    assert_int_equal(media_content_disposition(out, sizeof(out), true, "a b.png"), 0);
    assert_string_equal(out, "inline; filename=\"a b.png\"");
    assert_int_equal(media_content_disposition(out, sizeof(out), true, "say \"hi\"\\"), 0);
    assert_string_equal(out, "inline; filename=\"say \\\"hi\\\"\\\\\"");
    assert_int_equal(media_content_disposition(out, sizeof(out), false, "\xc3\xa9 x.pdf"), 0);
    assert_string_equal(out, "attachment; filename*=utf-8''%C3%A9%20x.pdf");
    char small[12];
    assert_int_equal(media_content_disposition(small, sizeof(small), true, "long-name.png"), -1);
}

static void if_none_match_uses_the_weak_comparison(void **state)
{
    (void)state;
    const char *etag = "\"abc\"";
    assert_true(media_etag_matches("\"abc\"", etag));
    assert_true(media_etag_matches("W/\"abc\"", etag));
    assert_true(media_etag_matches("\"x\", \"abc\"", etag));
    assert_true(media_etag_matches("*", etag));
    assert_false(media_etag_matches("\"abcd\"", etag));
    assert_false(media_etag_matches("", etag));
    assert_false(media_etag_matches(NULL, etag));
    assert_false(media_etag_matches("\"ab", etag));
}

static void ranges_are_single_satisfiable_or_ignored(void **state)
{
    (void)state;
    uint64_t s = 0, n = 0;
    assert_int_equal(media_parse_range(NULL, 100, &s, &n), MEDIA_RANGE_NONE);
    assert_int_equal(media_parse_range("bytes=0-9", 100, &s, &n), MEDIA_RANGE_OK);
    assert_true(s == 0 && n == 10);
    assert_int_equal(media_parse_range("bytes=90-", 100, &s, &n), MEDIA_RANGE_OK);
    assert_true(s == 90 && n == 10);
    assert_int_equal(media_parse_range("bytes=-30", 100, &s, &n), MEDIA_RANGE_OK);
    assert_true(s == 70 && n == 30);
    assert_int_equal(media_parse_range("bytes=-300", 100, &s, &n), MEDIA_RANGE_OK);
    assert_true(s == 0 && n == 100);
    assert_int_equal(media_parse_range("bytes=50-5000", 100, &s, &n), MEDIA_RANGE_OK);
    assert_true(s == 50 && n == 50);
    assert_int_equal(media_parse_range("bytes=100-", 100, &s, &n), MEDIA_RANGE_UNSATISFIABLE);
    assert_int_equal(media_parse_range("bytes=-0", 100, &s, &n), MEDIA_RANGE_UNSATISFIABLE);
    assert_int_equal(media_parse_range("bytes=0-", 0, &s, &n), MEDIA_RANGE_UNSATISFIABLE);
    assert_int_equal(media_parse_range("bytes=0-1,3-4", 100, &s, &n), MEDIA_RANGE_NONE);
    assert_int_equal(media_parse_range("bytes=9-2", 100, &s, &n), MEDIA_RANGE_NONE);
    assert_int_equal(media_parse_range("items=0-9", 100, &s, &n), MEDIA_RANGE_NONE);
    assert_int_equal(media_parse_range("bytes=a-9", 100, &s, &n), MEDIA_RANGE_NONE);
    assert_int_equal(media_parse_range("bytes=99999999999999999999-", 100, &s, &n),
                     MEDIA_RANGE_NONE);
}

static void sizes_parse_and_choose_the_smallest_large_enough(void **state)
{
    (void)state;
    media_size sizes[MEDIA_MAX_SIZES];
    char err[128];
    int n = media_sizes_parse(MEDIA_DEFAULT_SIZES, sizes, MEDIA_MAX_SIZES, err, sizeof(err));
    assert_int_equal(n, 5);
    assert_true(sizes[0].width == 32 && sizes[0].height == 32 && sizes[0].crop);
    assert_true(sizes[4].width == 800 && sizes[4].height == 600 && !sizes[4].crop);
    const media_size *s = media_size_choose(sizes, 5, 50, 50, true);
    assert_true(s->width == 96 && s->crop);
    s = media_size_choose(sizes, 5, 100, 100, false);
    assert_true(s->width == 320 && !s->crop);
    s = media_size_choose(sizes, 5, 3000, 3000, false);
    assert_true(s->width == 800);
    s = media_size_choose(sizes, 5, 200, 200, true); /* no crop large enough: the largest crop */
    assert_true(s->width == 96 && s->crop);
    s = media_size_choose(sizes, 2, 10, 10, false); /* only crop sizes configured */
    assert_true(s->width == 32 && s->crop);
    assert_int_equal(media_sizes_parse("", sizes, MEDIA_MAX_SIZES, err, sizeof(err)), -1);
    assert_int_equal(media_sizes_parse("32x32", sizes, MEDIA_MAX_SIZES, err, sizeof(err)), -1);
    assert_int_equal(media_sizes_parse("0x32 crop", sizes, MEDIA_MAX_SIZES, err, sizeof(err)), -1);
    assert_int_equal(media_sizes_parse("32x32 zoom", sizes, MEDIA_MAX_SIZES, err, sizeof(err)), -1);
    assert_int_equal(media_sizes_parse("32x32 cropped", sizes, MEDIA_MAX_SIZES, err, sizeof(err)),
                     -1);
    assert_true(media_fits_within(64, 48, 64, 48));
    assert_false(media_fits_within(65, 48, 64, 48));
    assert_false(media_fits_within(0, 0, 64, 48));
}

static void hex_of(const char *data, size_t len, size_t split, char out[65])
{
    sha256_ctx c;
    sha256_init(&c);
    for (size_t off = 0; off < len; off += split)
        sha256_update(&c, data + off, len - off < split ? len - off : split);
    sha256_final_hex(&c, out);
}

static void sha256_matches_the_fips_vectors_however_split(void **state)
{
    (void)state;
    char hex[65];
    hex_of("", 0, 1, hex);
    assert_string_equal(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    hex_of("abc", 3, 1, hex);
    assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    for (size_t split = 1; split <= 64; split *= 3) {
        hex_of(two, strlen(two), split, hex);
        assert_string_equal(hex,
                            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    }
    static char million[1000000];
    memset(million, 'a', sizeof(million));
    hex_of(million, sizeof(million), 4093, hex);
    assert_string_equal(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

/* Both block functions (the CPU's SHA extensions where it has them, the portable rounds)
 * give the same digests: the vectors through the portable one, then random inputs of many
 * lengths through both. */
static void sha256_is_the_same_through_either_block_function(void **state)
{
    (void)state;
    atomic_store(&chosen_blocks, blocks_portable);
    char hex[65];
    hex_of("abc", 3, 1, hex);
    assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    atomic_store(&chosen_blocks, (blocks_fn)NULL);
#ifdef SHA256_HAVE_SHANI
    if (!cpu_has_shani()) {
        print_message("no SHA extensions on this CPU: only the portable rounds checked\n");
        return;
    }
    static uint8_t data[64 * 40];
    uint32_t x = 2463534242u;
    for (size_t i = 0; i < sizeof(data); i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        data[i] = (uint8_t)x;
    }
    for (size_t n = 0; n <= 40; n++) {
        uint32_t a[8], b[8];
        for (int i = 0; i < 8; i++) a[i] = b[i] = x * (uint32_t)(i + 1) + (uint32_t)n;
        blocks_portable(a, data, n);
        blocks_shani(b, data, n);
        assert_memory_equal(a, b, sizeof(a));
    }
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(media_ids_are_whitelisted),
        cmocka_unit_test(inline_only_for_the_safe_list),
        cmocka_unit_test(file_names_must_be_clean_utf8),
        cmocka_unit_test(disposition_quotes_ascii_and_encodes_the_rest),
        cmocka_unit_test(if_none_match_uses_the_weak_comparison),
        cmocka_unit_test(ranges_are_single_satisfiable_or_ignored),
        cmocka_unit_test(sizes_parse_and_choose_the_smallest_large_enough),
        cmocka_unit_test(sha256_matches_the_fips_vectors_however_split),
        cmocka_unit_test(sha256_is_the_same_through_either_block_function),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
