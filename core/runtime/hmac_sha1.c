/*
 * core/runtime/hmac_sha1.c - SHA-1 and HMAC-SHA1 (see hmac_sha1.h). Written from the
 * standard: 80 rounds over 512-bit blocks, big-endian words, length-padded final block.
 */
#include <string.h>

#include "core/runtime/hmac_sha1.h"

static uint32_t rol(uint32_t x, int n)
{
    return (x << n) | (x >> (32 - n));
}

static void compress(uint32_t h[5], const unsigned char *block)
{
    uint32_t w[80];
    for (int t = 0; t < 16; t++)
        w[t] = (uint32_t)block[4 * t] << 24 | (uint32_t)block[4 * t + 1] << 16 |
               (uint32_t)block[4 * t + 2] << 8 | (uint32_t)block[4 * t + 3];
    for (int t = 16; t < 80; t++) w[t] = rol(w[t - 3] ^ w[t - 8] ^ w[t - 14] ^ w[t - 16], 1);
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
    for (int t = 0; t < 80; t++) {
        uint32_t f, k;
        if (t < 20) {
            f = (b & c) | (~b & d);
            k = 0x5A827999u;
        } else if (t < 40) {
            f = b ^ c ^ d;
            k = 0x6ED9EBA1u;
        } else if (t < 60) {
            f = (b & c) | (b & d) | (c & d);
            k = 0x8F1BBCDCu;
        } else {
            f = b ^ c ^ d;
            k = 0xCA62C1D6u;
        }
        uint32_t tmp = rol(a, 5) + f + e + k + w[t];
        e = d;
        d = c;
        c = rol(b, 30);
        b = a;
        a = tmp;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
}

void rt_sha1_init(rt_sha1_ctx *c)
{
    static const uint32_t initial[5] = {0x67452301u, 0xEFCDAB89u, 0x98BADCFEu, 0x10325476u,
                                        0xC3D2E1F0u};
    memcpy(c->h, initial, sizeof(initial));
    c->total_bytes = 0;
    c->used = 0;
}

void rt_sha1_update(rt_sha1_ctx *c, const void *data, size_t len)
{
    const unsigned char *p = data;
    c->total_bytes += len;
    while (len) {
        size_t take = RT_SHA1_BLOCK_BYTES - c->used;
        if (take > len) take = len;
        memcpy(c->block + c->used, p, take);
        c->used += take;
        p += take;
        len -= take;
        if (c->used == RT_SHA1_BLOCK_BYTES) {
            compress(c->h, c->block);
            c->used = 0;
        }
    }
}

void rt_sha1_final(rt_sha1_ctx *c, unsigned char out[RT_SHA1_DIGEST_BYTES])
{
    uint64_t bits = c->total_bytes * 8;
    static const unsigned char pad[RT_SHA1_BLOCK_BYTES] = {0x80};
    size_t pad_len = c->used < 56 ? 56 - c->used : 120 - c->used;
    rt_sha1_update(c, pad, pad_len);
    unsigned char len_be[8];
    for (int i = 0; i < 8; i++) len_be[i] = (unsigned char)(bits >> (56 - 8 * i));
    rt_sha1_update(c, len_be, sizeof(len_be));
    for (int i = 0; i < 5; i++) {
        out[4 * i] = (unsigned char)(c->h[i] >> 24);
        out[4 * i + 1] = (unsigned char)(c->h[i] >> 16);
        out[4 * i + 2] = (unsigned char)(c->h[i] >> 8);
        out[4 * i + 3] = (unsigned char)c->h[i];
    }
}

void rt_hmac_sha1(const void *key, size_t key_len, const void *msg, size_t msg_len,
               unsigned char out[RT_SHA1_DIGEST_BYTES])
{
    unsigned char k[RT_SHA1_BLOCK_BYTES] = {0};
    rt_sha1_ctx c;
    if (key_len > RT_SHA1_BLOCK_BYTES) {
        rt_sha1_init(&c);
        rt_sha1_update(&c, key, key_len);
        rt_sha1_final(&c, k);
    } else {
        memcpy(k, key, key_len);
    }
    unsigned char pad[RT_SHA1_BLOCK_BYTES], inner[RT_SHA1_DIGEST_BYTES];
    for (int i = 0; i < RT_SHA1_BLOCK_BYTES; i++) pad[i] = k[i] ^ 0x36;
    rt_sha1_init(&c);
    rt_sha1_update(&c, pad, sizeof(pad));
    rt_sha1_update(&c, msg, msg_len);
    rt_sha1_final(&c, inner);
    for (int i = 0; i < RT_SHA1_BLOCK_BYTES; i++) pad[i] = k[i] ^ 0x5c;
    rt_sha1_init(&c);
    rt_sha1_update(&c, pad, sizeof(pad));
    rt_sha1_update(&c, inner, sizeof(inner));
    rt_sha1_final(&c, out);
}
