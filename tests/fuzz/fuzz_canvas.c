/*
 * tests/fuzz/fuzz_canvas.c - libFuzzer target: the image entry point, the container
 * headers read before libvips sees a byte (plugins/media/canvas.c: the canvas a GIF, PNG,
 * WebP or JPEG declares). Built when that file exists.
 *
 * Checked: never a read past the buffer (ASan), and a zero-size canvas only as "unknown".
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "plugins/media/canvas.c"

const atrium_host *media_host;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size); /* libFuzzer's entry */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    memcpy(copy, data, size);
    uint32_t w = 0, h = 0;
    canvas_of_buffer(copy, size, &w, &h);
    if ((w == 0) != (h == 0)) abort();
    free(copy);
    return 0;
}
