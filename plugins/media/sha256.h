/*
 * plugins/media/sha256.h - SHA-256 (FIPS 180-4), incremental, for the content hash of
 * originals.
 *
 * The media plugin may link only libc, jansson, libpq and its image libraries, so it
 * carries this small hash itself. The hash is computed as the upload streams in (never
 * from a buffered copy), recorded with the row, used as the ETag and the thumbnail key,
 * and re-checked by the verifier. Not for secrets: no constant-time claims are made.
 */
#ifndef MEDIA_SHA256_H
#define MEDIA_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define SHA256_DIGEST_BYTES 32
#define SHA256_HEX_CHARS 64

typedef struct sha256_ctx {
    uint32_t state[8];
    uint64_t total_bytes;
    uint8_t block[64];
    size_t block_len;
} sha256_ctx;

void sha256_init(sha256_ctx *c);
void sha256_update(sha256_ctx *c, const void *data, size_t len);
/* Finish and write the digest; c must be re-initialised before another use. */
void sha256_final(sha256_ctx *c, uint8_t out[SHA256_DIGEST_BYTES]);
/* Finish and write the lowercase hex digest plus a NUL (65 bytes). */
void sha256_final_hex(sha256_ctx *c, char out[SHA256_HEX_CHARS + 1]);

#endif
