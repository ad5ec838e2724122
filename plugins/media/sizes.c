/*
 * plugins/media/sizes.c - which thumbnail a request gets.
 *
 * Decision owned here (the Matrix client-server API, Content repository, "Thumbnails";
 * docs/architecture.md, "Media: the plugin's rules"): thumbnails come only in
 * the configured sizes (plugins.media.thumbnail_sizes, default the spec's five), so the
 * number of renders per original is bounded whatever clients ask. A request gets the
 * smallest configured size of its method that is at least as large on both sides; when
 * it asks for more than any configured size, the largest. The renderer never upscales,
 * and an original that already fits inside the request is served as it is (thumbnail.c
 * asks media_fits_within). Pure functions (tests/unit/test_media_rules.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "media.h"

static const char *skip_space(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == ',') p++;
    return p;
}

int media_sizes_parse(const char *text, media_size *out, size_t cap, char *err, size_t errlen)
{
    size_t n = 0;
    const char *p = skip_space(text);
    while (*p) {
        char *end;
        long w = strtol(p, &end, 10);
        if (end == p || (*end != 'x' && *end != 'X')) {
            snprintf(err, errlen, "expected WIDTHxHEIGHT METHOD at \"%.20s\"", p);
            return -1;
        }
        p = end + 1;
        long hgt = strtol(p, &end, 10);
        if (end == p) {
            snprintf(err, errlen, "expected a height at \"%.20s\"", p);
            return -1;
        }
        if (w < 1 || hgt < 1 || w > MEDIA_THUMB_MAX_SIDE || hgt > MEDIA_THUMB_MAX_SIDE) {
            snprintf(err, errlen, "size %ldx%ld is outside 1..%d", w, hgt, MEDIA_THUMB_MAX_SIDE);
            return -1;
        }
        p = end;
        while (*p == ' ' || *p == '\t') p++;
        bool crop;
        if (strncmp(p, "crop", 4) == 0) {
            crop = true;
            p += 4;
        } else if (strncmp(p, "scale", 5) == 0) {
            crop = false;
            p += 5;
        } else {
            snprintf(err, errlen, "size %ldx%ld needs a method, \"crop\" or \"scale\"", w, hgt);
            return -1;
        }
        if (*p && *p != ',' && *p != ' ' && *p != '\t') {
            snprintf(err, errlen, "unexpected \"%.20s\" after a method", p);
            return -1;
        }
        if (n == cap) {
            snprintf(err, errlen, "more than %zu sizes", cap);
            return -1;
        }
        out[n++] = (media_size){.width = (int)w, .height = (int)hgt, .crop = crop};
        p = skip_space(p);
    }
    if (n == 0) {
        snprintf(err, errlen, "no sizes given");
        return -1;
    }
    return (int)n;
}

static const media_size *choose_among(const media_size *sizes, size_t n, int w, int h, bool crop,
                                      bool any_method)
{
    const media_size *smallest_enough = NULL, *largest = NULL;
    for (size_t i = 0; i < n; i++) {
        const media_size *s = &sizes[i];
        if (!any_method && s->crop != crop) continue;
        long area = (long)s->width * s->height;
        if (s->width >= w && s->height >= h &&
            (!smallest_enough || area < (long)smallest_enough->width * smallest_enough->height))
            smallest_enough = s;
        if (!largest || area > (long)largest->width * largest->height) largest = s;
    }
    return smallest_enough ? smallest_enough : largest;
}

const media_size *media_size_choose(const media_size *sizes, size_t n, int w, int h, bool crop)
{
    const media_size *s = choose_among(sizes, n, w, h, crop, false);
    return s ? s : choose_among(sizes, n, w, h, crop, true);
}

bool media_fits_within(int ow, int oh, int w, int h)
{
    return ow > 0 && oh > 0 && ow <= w && oh <= h;
}
