/*
 * tests/fuzz/fuzz_media_headers.c - libFuzzer target: the media plugin's Range parser and
 * Content-Disposition builder (plugins/media/headers.c, its pure functions compiled in as
 * the unit tests do).
 *
 * The first 8 bytes are the file size, the rest splits at the first newline into a Range
 * header and a file name. Checked: a satisfiable range lies inside the file, and a
 * Content-Disposition is NUL-terminated within its buffer with no CR or LF in it (header
 * injection through a file name).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "plugins/media/headers.c"

const atrium_host *media_host; /* declared by media.h; unused by the pure functions */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size); /* libFuzzer's entry */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 8) return 0;
    uint64_t fsize;
    memcpy(&fsize, data, 8);
    fsize %= (uint64_t)1 << 40;
    char *rest = malloc(size - 8 + 1);
    if (!rest) return 0;
    memcpy(rest, data + 8, size - 8);
    rest[size - 8] = '\0';
    char *name = strchr(rest, '\n');
    if (name) *name++ = '\0';
    uint64_t start = 0, len = 0;
    int r = media_parse_range(rest, fsize, &start, &len);
    if (r == MEDIA_RANGE_OK && (len == 0 || start >= fsize || len > fsize - start)) abort();
    char out[512];
    if (media_content_disposition(out, sizeof(out), name && name[0] == 'i', name) >= 0) {
        if (!memchr(out, '\0', sizeof(out)) || strpbrk(out, "\r\n")) abort();
    }
    free(rest);
    return 0;
}
