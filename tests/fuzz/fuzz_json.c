/*
 * tests/fuzz/fuzz_json.c - libFuzzer target: the JSON body reader (jansson with the flags
 * http_req_json uses) and canonical JSON (core/rooms/canonical_json.c).
 *
 * Checked: a body that parses and normalizes encodes canonically, and the canonical form is
 * a fixed point: parsing it and encoding again gives the same bytes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/rooms/canonical_json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size); /* libFuzzer's entry */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_error_t err;
    json_t *v = json_loadb((const char *)data, size, 0, &err);
    if (!v) return 0;
    char why[256];
    if (cjson_normalize(v, why, sizeof(why)) == 0) {
        size_t len = 0;
        char *once = cjson_encode(v, &len);
        if (once) {
            json_t *again = json_loadb(once, len, 0, &err);
            if (!again) abort(); /* canonical JSON is JSON */
            size_t len2 = 0;
            char *twice = cjson_encode(again, &len2);
            if (!twice || len2 != len || memcmp(once, twice, len) != 0) abort();
            unsigned char h1[CJSON_SHA256_BYTES], h2[CJSON_SHA256_BYTES];
            if (cjson_sha256(v, h1) != 0 || cjson_sha256(again, h2) != 0 ||
                memcmp(h1, h2, sizeof(h1)) != 0)
                abort();
            free(twice);
            json_decref(again);
            free(once);
        }
    }
    json_decref(v);
    return 0;
}
