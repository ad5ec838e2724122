/*
 * core/rooms/canonical_json.h - Matrix canonical JSON (the byte string that event IDs,
 * content hashes and signatures are computed over) and the unpadded base64 forms Matrix
 * uses.
 *
 * Canonical JSON is the shortest UTF-8 encoding with object keys sorted by code point at
 * every level, integers only in [-(2^53)+1, 2^53-1], and a fixed string-escaping rule (see
 * cjson_encode). Room versions 6 and later refuse events whose content cannot be encoded
 * so, which is why cjson_normalize exists: values that merely look like floats ("1e10",
 * "5.0") become integers, true fractions and out-of-range numbers are refused. Internal
 * prefix: cjson_.
 */
#ifndef ATRIUM_CORE_CANONICAL_JSON_H
#define ATRIUM_CORE_CANONICAL_JSON_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CJSON_MAX_SAFE_INT INT64_C(9007199254740991) /* 2^53 - 1 */
#define CJSON_MAX_DEPTH 64 /* nesting refused beyond this (no stack exhaustion) */
#define CJSON_SHA256_BYTES 32
#define CJSON_SHA256_B64_LEN 44 /* 43 characters of unpadded base64, plus NUL */

/* Make v encodable as canonical JSON in place: reals with an integral value in range become
 * integers (-0.0 becomes 0). Returns 0, or -1 with why (a sentence for the client) set when
 * v holds a fraction, a number out of the safe integer range, or nesting deeper than
 * CJSON_MAX_DEPTH. Any thread. */
int cjson_normalize(json_t *v, char *why, size_t why_len);

/* The canonical encoding of v: malloc'd, NUL-terminated, *len_out its length (may be NULL).
 * A real with an integral value in range is written as that integer (the room version
 * decides whether a real is allowed at all: event_check_format). NULL when v cannot be
 * encoded (a fraction, an integer out of range, nesting too deep) or on out-of-memory. The caller frees it. Any thread. */
char *cjson_encode(const json_t *v, size_t *len_out);

/* SHA-256 of the canonical encoding of v. 0, or -1 as for cjson_encode. */
int cjson_sha256(const json_t *v, unsigned char out[CJSON_SHA256_BYTES]);

/* Unpadded base64 of n bytes into out (out_len includes the NUL): the standard alphabet
 * (hashes, signatures) or the URL-safe one (event IDs). Returns out. */
char *cjson_b64(const unsigned char *bytes, size_t n, bool url_safe, char *out, size_t out_len);

#endif
