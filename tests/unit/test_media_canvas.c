/*
 * tests/unit/test_media_canvas.c - the canvas an image container declares
 * (plugins/media/canvas.c): a GIF's logical screen, a PNG's IHDR, a WebP's VP8X canvas or
 * single frame, a JPEG's start of frame; nothing for short, foreign or malformed headers.
 */
#include "plugins/media/canvas.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

const atrium_host *media_host; /* declared by media.h; unused by the pure file */

static void declared(const void *b, size_t n, uint32_t w, uint32_t h)
{
    uint32_t gw = 99, gh = 99;
    canvas_of_buffer(b, n, &gw, &gh);
    assert_int_equal(gw, w);
    assert_int_equal(gh, h);
}

static void test_gif_declares_its_logical_screen_not_its_frame(void **state)
{
    (void)state;
    static const uint8_t gif[] = "GIF89a\xff\xff\xff\xff\x80\x00\x00\x00\x00\x00\xff\xff\xff"
                                 "\x2c\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02\x44\x01\x00\x3b";
    declared(gif, sizeof(gif) - 1, 65535, 65535);
    declared("GIF87a\x10\x00\x20\x00", 10, 16, 32);
    declared("GIF89a\x10\x00", 8, 0, 0); /* cut short */
}

static void test_png_declares_its_ihdr(void **state)
{
    (void)state;
    static const uint8_t png[] = "\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR\x00\x01\x86\xa0\x00\x00\x00\x07";
    declared(png, sizeof(png) - 1, 100000, 7);
    static const uint8_t not_ihdr[] = "\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDX\x00\x01\x86\xa0\x00\x00\x00\x07";
    declared(not_ihdr, sizeof(not_ihdr) - 1, 0, 0);
}

static void test_webp_declares_the_vp8x_canvas_or_its_single_frame(void **state)
{
    (void)state;
    uint8_t b[40] = "RIFF\0\0\0\0WEBPVP8X";
    b[24] = 0xff, b[25] = 0xff, b[26] = 0x00; /* canvas width - 1 = 65535 */
    b[27] = 0x09, b[28] = 0x00, b[29] = 0x00; /* canvas height - 1 = 9 */
    declared(b, sizeof(b), 65536, 10);
    uint8_t l[40] = "RIFF\0\0\0\0WEBPVP8L";
    l[20] = 0x2f;
    uint32_t bits = (640 - 1) | (uint32_t)(480 - 1) << 14;
    l[21] = bits & 0xff, l[22] = (bits >> 8) & 0xff, l[23] = (bits >> 16) & 0xff, l[24] = bits >> 24;
    declared(l, sizeof(l), 640, 480);
    uint8_t v[40] = "RIFF\0\0\0\0WEBPVP8 ";
    v[23] = 0x9d, v[24] = 0x01, v[25] = 0x2a;
    v[26] = 320 & 0xff, v[27] = 320 >> 8, v[28] = 200 & 0xff, v[29] = 200 >> 8;
    declared(v, sizeof(v), 320, 200);
}

static void test_jpeg_declares_its_start_of_frame_after_other_segments(void **state)
{
    (void)state;
    static const uint8_t jpg[] = "\xff\xd8"
                                 "\xff\xe0\x00\x04\x00\x00"                 /* APP0, 2 bytes */
                                 "\xff\xc2\x00\x11\x08\x0b\xb8\x0f\xa0\x03"; /* SOF2 3000x4000 */
    declared(jpg, sizeof(jpg) - 1, 4000, 3000);
    static const uint8_t scan_first[] = "\xff\xd8\xff\xda\x00\x08\x01\x01\x00\x00\x3f\x00";
    declared(scan_first, sizeof(scan_first) - 1, 0, 0);
    static const uint8_t dht_only[] = "\xff\xd8\xff\xc4\x00\x04\x00\x00";
    declared(dht_only, sizeof(dht_only) - 1, 0, 0);
}

static void test_anything_else_declares_nothing(void **state)
{
    (void)state;
    declared("", 0, 0, 0);
    declared("hello, world", 12, 0, 0);
    declared("RIFF\0\0\0\0WAVE", 12, 0, 0);
    /* A canvas without area (found by fuzz_canvas): one dimension 0 declares nothing. */
    static const uint8_t zero_wide[] = "\xff\xd8"
                                       "\xff\xc0\x00\x11\x08\x1a\x0a\x00\x00\x03"; /* SOF0 0 x 6666 */
    declared(zero_wide, sizeof(zero_wide) - 1, 0, 0);
    declared("GIF89a\x00\x00\x10\x00", 10, 0, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gif_declares_its_logical_screen_not_its_frame),
        cmocka_unit_test(test_png_declares_its_ihdr),
        cmocka_unit_test(test_webp_declares_the_vp8x_canvas_or_its_single_frame),
        cmocka_unit_test(test_jpeg_declares_its_start_of_frame_after_other_segments),
        cmocka_unit_test(test_anything_else_declares_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
