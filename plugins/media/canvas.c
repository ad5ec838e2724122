/*
 * plugins/media/canvas.c - the canvas an image file declares, read from its container's
 * header without any decoder.
 *
 * Decision owned here: the pixel limit (max_image_pixels) judges what a client would
 * decode, and browsers size their decode buffer by the container's declared canvas, not
 * by the frames inside: a GIF whose logical screen is 65535x65535 holding one 1x1 frame is
 * a 4-gigapixel image to a browser, although libvips reports the frame. So the canvas is
 * read here for the four formats the plugin decodes (GIF logical screen, PNG IHDR, WebP
 * VP8X canvas or its single VP8/VP8L frame, JPEG start of frame) and render_probe counts
 * the larger of it and what libvips says. A file too short or not one of these formats
 * declares nothing (0 x 0): libvips then decides alone.
 * What this file does not do: decide anything about the image (render.c, thumbnail.c).
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "media.h"

/* Bytes read from the start of the file: every header field below lies in them, except a
 * JPEG frame header after large metadata segments (then the file declares nothing). */
#define CANVAS_HEAD_BYTES (64 * 1024)

static uint32_t be16(const uint8_t *p) { return (uint32_t)p[0] << 8 | p[1]; }
static uint32_t le16(const uint8_t *p) { return (uint32_t)p[1] << 8 | p[0]; }
static uint32_t le24(const uint8_t *p) { return (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0]; }
static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* JPEG: the first start-of-frame marker's height and width, walking the segments. */
static bool jpeg_canvas(const uint8_t *b, size_t n, uint32_t *w, uint32_t *h)
{
    size_t i = 2;
    while (i + 4 <= n) {
        if (b[i] != 0xFF) return false;
        uint8_t marker = b[i + 1];
        if (marker == 0xFF) { /* fill byte */
            i++;
            continue;
        }
        if (marker == 0xD8 || (marker >= 0xD0 && marker <= 0xD7) || marker == 0x01) {
            i += 2; /* no length */
            continue;
        }
        uint32_t len = be16(b + i + 2);
        bool sof = marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 &&
                   marker != 0xCC;
        if (sof) {
            if (i + 9 > n) return false;
            *h = be16(b + i + 5);
            *w = be16(b + i + 7);
            return true;
        }
        if (marker == 0xDA || len < 2) return false; /* scan data before any frame */
        i += 2 + len;
    }
    return false;
}

void canvas_of_buffer(const uint8_t *b, size_t n, uint32_t *w, uint32_t *h)
{
    *w = *h = 0;
    if (n >= 10 && (memcmp(b, "GIF87a", 6) == 0 || memcmp(b, "GIF89a", 6) == 0)) {
        *w = le16(b + 6);
        *h = le16(b + 8);
    } else if (n >= 24 && memcmp(b, "\x89PNG\r\n\x1a\n", 8) == 0 && memcmp(b + 12, "IHDR", 4) == 0) {
        *w = be32(b + 16);
        *h = be32(b + 20);
    } else if (n >= 30 && memcmp(b, "RIFF", 4) == 0 && memcmp(b + 8, "WEBP", 4) == 0) {
        const uint8_t *c = b + 12;
        if (memcmp(c, "VP8X", 4) == 0) {
            *w = le24(c + 12) + 1;
            *h = le24(c + 15) + 1;
        } else if (memcmp(c, "VP8L", 4) == 0 && n >= 25 && c[8] == 0x2F) {
            uint32_t bits = (uint32_t)c[9] | (uint32_t)c[10] << 8 | (uint32_t)c[11] << 16 |
                            (uint32_t)c[12] << 24;
            *w = (bits & 0x3FFF) + 1;
            *h = ((bits >> 14) & 0x3FFF) + 1;
        } else if (memcmp(c, "VP8 ", 4) == 0 && c[11] == 0x9D && c[12] == 0x01 && c[13] == 0x2A) {
            *w = le16(c + 14) & 0x3FFF;
            *h = le16(c + 16) & 0x3FFF;
        }
    } else if (n >= 4 && b[0] == 0xFF && b[1] == 0xD8) {
        if (!jpeg_canvas(b, n, w, h)) *w = *h = 0;
    }
    if (*w == 0 || *h == 0) *w = *h = 0; /* a canvas without area declares nothing */
}

int canvas_of_file(const char *path, uint32_t *w, uint32_t *h)
{
    *w = *h = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ATRIUM_E_IO;
    uint8_t *buf = malloc(CANVAS_HEAD_BYTES);
    if (!buf) {
        close(fd);
        return ATRIUM_E_NOMEM;
    }
    size_t n = 0;
    int rc = 0;
    while (n < CANVAS_HEAD_BYTES) {
        ssize_t got = read(fd, buf + n, CANVAS_HEAD_BYTES - n);
        if (got < 0) {
            rc = ATRIUM_E_IO;
            break;
        }
        if (got == 0) break;
        n += (size_t)got;
    }
    close(fd);
    if (rc == 0) canvas_of_buffer(buf, n, w, h);
    free(buf);
    return rc;
}
