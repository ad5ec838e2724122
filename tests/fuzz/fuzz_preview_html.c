/*
 * tests/fuzz/fuzz_preview_html.c - libFuzzer target: what a URL preview reads from a site
 * it does not trust (plugins/media/preview_html.c): the HTML scanner, and the URL rules
 * applied to the og:image and Location values it finds.
 *
 * Checked: never a read past the buffer (ASan); every value kept is a JSON string (valid
 * UTF-8) of at most PREVIEW_FIELD_MAX_BYTES, or an og:image:width/height integer; at most
 * PREVIEW_OG_MAX_KEYS keys (two more for the <title> and description stand-ins); a URL
 * that normalises is one the outbound client can be given (https or http, bounded, no
 * user information).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "plugins/media/preview_html.c"

const atrium_host *media_host;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size); /* libFuzzer's entry */

static void check_url(const char *base, const char *ref)
{
    char out[PREVIEW_URL_MAX];
    int rc = preview_url_join(base, ref, out, sizeof(out));
    if (rc < 0) return;
    size_t scheme = rc == PREVIEW_URL_PLAIN_HTTP ? 7 : 8;
    if (strncmp(out, scheme == 7 ? "http://" : "https://", scheme) != 0) abort();
    size_t auth = strcspn(out + scheme, "/?#");
    if (auth == 0 || memchr(out + scheme, '@', auth) || strchr(out, '#') ||
        strlen(out) >= PREVIEW_URL_MAX)
        abort();
    for (const char *p = out; *p; p++)
        if ((unsigned char)*p <= ' ' || (unsigned char)*p >= 0x7F) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *copy = malloc(size + 1); /* the host hands bodies NUL-terminated */
    if (!copy) return 0;
    memcpy(copy, data, size);
    copy[size] = '\0';
    json_t *og = preview_html_og(copy, size, size > 0 && (data[0] & 1));
    if (og) {
        if (json_object_size(og) > PREVIEW_OG_MAX_KEYS + 2) abort();
        const char *key;
        json_t *v;
        json_object_foreach(og, key, v) {
            if (json_is_integer(v)) {
                if (strcmp(key, "og:image:width") != 0 && strcmp(key, "og:image:height") != 0)
                    abort();
            } else if (!json_is_string(v) || json_string_length(v) > PREVIEW_FIELD_MAX_BYTES) {
                abort();
            }
        }
        char *text = json_dumps(og, JSON_COMPACT);
        if (!text) abort();
        free(text);
        const char *image = json_string_value(json_object_get(og, "og:image"));
        if (image) check_url("https://site.example/dir/page?x=1", image);
        json_decref(og);
    }
    check_url("https://site.example/dir/page?x=1", copy);
    free(copy);
    return 0;
}
