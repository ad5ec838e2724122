/*
 * core/runtime/hmac_sha1.h - SHA-1 and HMAC-SHA1 (FIPS 180-4, RFC 2104), for the two
 * places that need them: the MAC of Synapse-style shared-secret admin registration, which
 * tools already speak, and the tie-break of room version 1's state resolution, which the
 * spec defines by SHA-1 (core/rooms/state_res_v1.c). libsodium has no SHA-1, and nothing
 * else here should use it: it is not a choice for new designs. Pure functions; any thread. Internal prefix: rt_sha1_, rt_hmac_sha1.
 */
#ifndef ATRIUM_CORE_RT_HMAC_SHA1_H
#define ATRIUM_CORE_RT_HMAC_SHA1_H

#include <stddef.h>
#include <stdint.h>

#define RT_SHA1_DIGEST_BYTES 20
#define RT_SHA1_BLOCK_BYTES 64

typedef struct rt_sha1_ctx {
    uint32_t h[5];
    uint64_t total_bytes;
    unsigned char block[RT_SHA1_BLOCK_BYTES];
    size_t used; /* bytes waiting in block */
} rt_sha1_ctx;

void rt_sha1_init(rt_sha1_ctx *c);
void rt_sha1_update(rt_sha1_ctx *c, const void *data, size_t len);
void rt_sha1_final(rt_sha1_ctx *c, unsigned char out[RT_SHA1_DIGEST_BYTES]);

/* HMAC-SHA1 of msg under key (any length). */
void rt_hmac_sha1(const void *key, size_t key_len, const void *msg, size_t msg_len,
               unsigned char out[RT_SHA1_DIGEST_BYTES]);

#endif
