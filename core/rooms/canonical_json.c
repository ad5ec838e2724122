/*
 * core/rooms/canonical_json.c - canonical JSON encoding and the base64 forms (see
 * canonical_json.h).
 *
 * The encoder is written here rather than taken from jansson's json_dumps because the spec
 * fixes details jansson does differently: control characters escape as \u00XX with
 * lower-case hex, and numbers that parse as reals ("1e10") must come out as integers. Keys
 * sort with strcmp: comparing UTF-8 bytes unsigned gives code-point order. This file does
 * not decide which events may carry which values (events.c does).
 */
#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rooms/canonical_json.h"

#define BUF_INITIAL_BYTES 256

typedef struct buf {
    char *p;
    size_t len, cap;
    bool failed;
} buf;

static void put(buf *b, const char *s, size_t n)
{
    if (b->failed) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : BUF_INITIAL_BYTES;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->failed = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void put_str(buf *b, const char *s) { put(b, s, strlen(s)); }

/* A real that canonical JSON can carry: integral and in the safe range. */
static bool real_as_int(double d, int64_t *out)
{
    if (!isfinite(d) || d != floor(d) || fabs(d) > (double)CJSON_MAX_SAFE_INT) return false;
    *out = (int64_t)d; /* -0.0 becomes 0 */
    return true;
}

static void put_string(buf *b, const char *s, size_t n)
{
    static const char HEX[] = "0123456789abcdef";
    put(b, "\"", 1);
    size_t run = 0; /* bytes copied verbatim in one go */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[7];
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\b') esc = "\\b";
        else if (c == '\t') esc = "\\t";
        else if (c == '\n') esc = "\\n";
        else if (c == '\f') esc = "\\f";
        else if (c == '\r') esc = "\\r";
        else if (c < 0x20) {
            snprintf(u, sizeof(u), "\\u00%c%c", HEX[c >> 4], HEX[c & 0xf]);
            esc = u;
        }
        if (!esc) {
            run++;
            continue;
        }
        put(b, s + i - run, run);
        run = 0;
        put_str(b, esc);
    }
    put(b, s + n - run, run);
    put(b, "\"", 1);
}

static int cmp_keys(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static bool encode(buf *b, const json_t *v, int depth)
{
    if (depth > CJSON_MAX_DEPTH) return false;
    char num[32];
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        size_t n = json_object_size(v);
        const char **keys = n ? malloc(n * sizeof(*keys)) : NULL;
        if (n && !keys) return false;
        size_t i = 0;
        const char *k;
        json_t *item;
        json_object_foreach((json_t *)v, k, item) keys[i++] = k;
        if (n) qsort(keys, n, sizeof(*keys), cmp_keys);
        put(b, "{", 1);
        bool ok = true;
        for (i = 0; i < n && ok; i++) {
            if (i) put(b, ",", 1);
            put_string(b, keys[i], strlen(keys[i]));
            put(b, ":", 1);
            ok = encode(b, json_object_get(v, keys[i]), depth + 1);
        }
        put(b, "}", 1);
        free(keys);
        return ok;
    }
    case JSON_ARRAY:
        put(b, "[", 1);
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) put(b, ",", 1);
            if (!encode(b, json_array_get(v, i), depth + 1)) return false;
        }
        put(b, "]", 1);
        return true;
    case JSON_STRING:
        put_string(b, json_string_value(v), json_string_length(v));
        return true;
    case JSON_INTEGER: {
        json_int_t x = json_integer_value(v);
        if (x > CJSON_MAX_SAFE_INT || x < -CJSON_MAX_SAFE_INT) return false;
        snprintf(num, sizeof(num), "%lld", (long long)x);
        put_str(b, num);
        return true;
    }
    case JSON_REAL: {
        int64_t x;
        if (!real_as_int(json_real_value(v), &x)) return false;
        snprintf(num, sizeof(num), "%lld", (long long)x);
        put_str(b, num);
        return true;
    }
    case JSON_TRUE: put_str(b, "true"); return true;
    case JSON_FALSE: put_str(b, "false"); return true;
    case JSON_NULL: put_str(b, "null"); return true;
    }
    return false;
}

char *cjson_encode(const json_t *v, size_t *len_out)
{
    buf b = {0};
    if (!v || !encode(&b, v, 0) || b.failed) {
        free(b.p);
        return NULL;
    }
    if (len_out) *len_out = b.len;
    return b.p;
}

static int normalize(json_t *v, int depth, char *why, size_t why_len)
{
    if (depth > CJSON_MAX_DEPTH) {
        snprintf(why, why_len, "JSON nested deeper than %d levels", CJSON_MAX_DEPTH);
        return -1;
    }
    if (json_is_object(v)) {
        const char *k;
        json_t *item;
        void *tmp;
        json_object_foreach_safe(v, tmp, k, item) {
            if (json_is_real(item)) {
                int64_t x;
                if (!real_as_int(json_real_value(item), &x)) {
                    snprintf(why, why_len, "\"%.64s\" is not an integer in the safe range", k);
                    return -1;
                }
                json_object_set_new(v, k, json_integer(x));
            } else if (normalize(item, depth + 1, why, why_len) < 0) {
                return -1;
            }
        }
    } else if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++) {
            json_t *item = json_array_get(v, i);
            if (json_is_real(item)) {
                int64_t x;
                if (!real_as_int(json_real_value(item), &x)) {
                    snprintf(why, why_len, "a list holds a number that is not an integer in "
                             "the safe range");
                    return -1;
                }
                json_array_set_new(v, i, json_integer(x));
            } else if (normalize(item, depth + 1, why, why_len) < 0) {
                return -1;
            }
        }
    } else if (json_is_integer(v)) {
        json_int_t x = json_integer_value(v);
        if (x > CJSON_MAX_SAFE_INT || x < -CJSON_MAX_SAFE_INT) {
            snprintf(why, why_len, "an integer is outside [-(2^53)+1, (2^53)-1]");
            return -1;
        }
    } else if (json_is_real(v)) {
        int64_t x;
        if (!real_as_int(json_real_value(v), &x)) {
            snprintf(why, why_len, "a number is not an integer in the safe range");
            return -1;
        }
        /* A bare top-level real cannot be replaced in place; encode() accepts it. */
    }
    return 0;
}

int cjson_normalize(json_t *v, char *why, size_t why_len)
{
    return normalize(v, 0, why, why_len);
}

int cjson_sha256(const json_t *v, unsigned char out[CJSON_SHA256_BYTES])
{
    size_t len;
    char *s = cjson_encode(v, &len);
    if (!s) return -1;
    crypto_hash_sha256(out, (const unsigned char *)s, len);
    free(s);
    return 0;
}

char *cjson_b64(const unsigned char *bytes, size_t n, bool url_safe, char *out, size_t out_len)
{
    sodium_bin2base64(out, out_len, bytes, n,
                      url_safe ? sodium_base64_VARIANT_URLSAFE_NO_PADDING
                               : sodium_base64_VARIANT_ORIGINAL_NO_PADDING);
    return out;
}
