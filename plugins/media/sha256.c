/*
 * plugins/media/sha256.c - SHA-256 as FIPS 180-4 specifies it: 64-byte blocks, eight
 * 32-bit working variables, 64 rounds, big-endian length padding.
 *
 * Written for streaming: sha256_update takes any split of the input (the upload's body
 * chunks), so the hash of an original is known the moment its last byte is written.
 *
 * Two ways to compress blocks, chosen once per process: the x86 SHA extensions where the
 * CPU has them (about 1.5 GB/s), else the portable rounds below (about 100 MB/s on the same
 * machine). The hash sits on the path of every byte of a cold download from the object
 * store (s3_stream.c hashes as the GET lands) and of every upload: at the portable speed
 * a 5 MB original cost ~50 ms of one CPU, more than the store took to send it
 * (docs/adr/0031-streaming-media-to-and-from-the-object-store.md).
 */
#include "sha256.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define SHA256_HAVE_SHANI 1
#endif

static const uint32_t K[64] = {
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u,
    0xab1c5ed5u, 0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu,
    0x9bdc06a7u, 0xc19bf174u, 0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu,
    0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau, 0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u,
    0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u, 0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu,
    0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u, 0xa2bfe8a1u, 0xa81a664bu,
    0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u, 0x19a4c116u,
    0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
    0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u,
    0xc67178f2u,
};

static inline uint32_t rotr(uint32_t x, unsigned n)
{
    return (x >> n) | (x << (32 - n));
}

/* One block, the portable way. */
static void compress(uint32_t st[8], const uint8_t *p)
{
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | (uint32_t)p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = st[0], b = st[1], c = st[2], d = st[3];
    uint32_t e = st[4], f = st[5], g = st[6], h = st[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 =
            h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
        uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    st[0] += a;
    st[1] += b;
    st[2] += c;
    st[3] += d;
    st[4] += e;
    st[5] += f;
    st[6] += g;
    st[7] += h;
}

static void blocks_portable(uint32_t st[8], const uint8_t *p, size_t n)
{
    for (; n; n--, p += 64) compress(st, p);
}

#ifdef SHA256_HAVE_SHANI
/* n blocks with the SHA extensions. The instructions keep the eight working variables as
 * two vectors, {A,B,E,F} and {C,D,G,H} (A in the highest lane), do two rounds per
 * SHA256RNDS2 (the next two W+K in the low lanes of its third operand) and extend the
 * message four words at a time (SHA256MSG1: W[t-16] + s0(W[t-15]); then + W[t-7]; then
 * SHA256MSG2 adds s1(W[t-2]), the last two of which it computes itself). */
__attribute__((target("sha,sse4.1,ssse3"))) static void blocks_shani(uint32_t st[8],
                                                                     const uint8_t *p, size_t n)
{
    const __m128i be32 = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
    __m128i abcd = _mm_loadu_si128((const __m128i *)&st[0]); /* lanes 0..3: A B C D */
    __m128i efgh = _mm_loadu_si128((const __m128i *)&st[4]);
    __m128i abef = _mm_shuffle_epi32(_mm_unpacklo_epi64(abcd, efgh), 0x1B); /* F E B A */
    __m128i cdgh = _mm_shuffle_epi32(_mm_unpackhi_epi64(abcd, efgh), 0x1B); /* H G D C */
    for (; n; n--, p += 64) {
        const __m128i abef_in = abef, cdgh_in = cdgh;
        __m128i w[4]; /* w[g % 4]: W[4g .. 4g+3], a ring over the 16 groups of 4 rounds */
        for (int i = 0; i < 4; i++)
            w[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * i)), be32);
#pragma GCC unroll 16
        for (int g = 0; g < 16; g++) {
            if (g >= 4) { /* w[g%4] holds group g-4; the others g-3, g-2, g-1 */
                __m128i x = _mm_sha256msg1_epu32(w[g & 3], w[(g + 1) & 3]);
                x = _mm_add_epi32(x, _mm_alignr_epi8(w[(g + 3) & 3], w[(g + 2) & 3], 4));
                w[g & 3] = _mm_sha256msg2_epu32(x, w[(g + 3) & 3]);
            }
            __m128i wk = _mm_add_epi32(w[g & 3], _mm_loadu_si128((const __m128i *)&K[4 * g]));
            __m128i next = _mm_sha256rnds2_epu32(cdgh, abef, wk);
            cdgh = abef; /* two rounds on, the old A B E F are C D G H */
            abef = next;
            next = _mm_sha256rnds2_epu32(cdgh, abef, _mm_shuffle_epi32(wk, 0x0E));
            cdgh = abef;
            abef = next;
        }
        abef = _mm_add_epi32(abef, abef_in);
        cdgh = _mm_add_epi32(cdgh, cdgh_in);
    }
    abef = _mm_shuffle_epi32(abef, 0x1B); /* A B E F */
    cdgh = _mm_shuffle_epi32(cdgh, 0x1B); /* C D G H */
    _mm_storeu_si128((__m128i *)&st[0], _mm_unpacklo_epi64(abef, cdgh));
    _mm_storeu_si128((__m128i *)&st[4], _mm_unpackhi_epi64(abef, cdgh));
}

static bool cpu_has_shani(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    bool ssse3 = c & (1u << 9), sse41 = c & (1u << 19);
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    return ssse3 && sse41 && (b & (1u << 29));
}
#endif

typedef void (*blocks_fn)(uint32_t st[8], const uint8_t *p, size_t n);

/* The block function of this CPU, found on first use (a race only finds it twice). */
static _Atomic(blocks_fn) chosen_blocks;

static blocks_fn blocks_of_this_cpu(void)
{
    blocks_fn f = atomic_load_explicit(&chosen_blocks, memory_order_relaxed);
    if (f) return f;
    f = blocks_portable;
#ifdef SHA256_HAVE_SHANI
    if (cpu_has_shani()) f = blocks_shani;
#endif
    atomic_store_explicit(&chosen_blocks, f, memory_order_relaxed);
    return f;
}

void sha256_init(sha256_ctx *c)
{
    static const uint32_t IV[8] = {0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au,
                                   0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u};
    memcpy(c->state, IV, sizeof(IV));
    c->total_bytes = 0;
    c->block_len = 0;
}

void sha256_update(sha256_ctx *c, const void *data, size_t len)
{
    const uint8_t *p = data;
    blocks_fn blocks = blocks_of_this_cpu();
    c->total_bytes += len;
    if (c->block_len) {
        size_t take = 64 - c->block_len < len ? 64 - c->block_len : len;
        memcpy(c->block + c->block_len, p, take);
        c->block_len += take;
        p += take;
        len -= take;
        if (c->block_len < 64) return;
        blocks(c->state, c->block, 1);
        c->block_len = 0;
    }
    blocks(c->state, p, len / 64);
    p += len / 64 * 64;
    len %= 64;
    memcpy(c->block, p, len);
    c->block_len = len;
}

void sha256_final(sha256_ctx *c, uint8_t out[SHA256_DIGEST_BYTES])
{
    uint64_t bits = c->total_bytes * 8;
    c->block[c->block_len++] = 0x80;
    if (c->block_len > 56) {
        memset(c->block + c->block_len, 0, 64 - c->block_len);
        blocks_of_this_cpu()(c->state, c->block, 1);
        c->block_len = 0;
    }
    memset(c->block + c->block_len, 0, 56 - c->block_len);
    for (int i = 0; i < 8; i++) c->block[56 + i] = (uint8_t)(bits >> (56 - 8 * i));
    blocks_of_this_cpu()(c->state, c->block, 1);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(c->state[i] >> 24);
        out[4 * i + 1] = (uint8_t)(c->state[i] >> 16);
        out[4 * i + 2] = (uint8_t)(c->state[i] >> 8);
        out[4 * i + 3] = (uint8_t)c->state[i];
    }
}

void sha256_final_hex(sha256_ctx *c, char out[SHA256_HEX_CHARS + 1])
{
    static const char HEX[] = "0123456789abcdef";
    uint8_t d[SHA256_DIGEST_BYTES];
    sha256_final(c, d);
    for (int i = 0; i < SHA256_DIGEST_BYTES; i++) {
        out[2 * i] = HEX[d[i] >> 4];
        out[2 * i + 1] = HEX[d[i] & 15];
    }
    out[SHA256_HEX_CHARS] = '\0';
}
