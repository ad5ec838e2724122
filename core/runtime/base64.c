/*
 * core/runtime/base64.c - the tolerant-about-form, strict-about-content base64
 * decoder (see base64.h for which forms are accepted and why).
 *
 * Trailing bits that a canonical encoder would have left zero are not checked: Python's
 * decoder (and so Synapse) ignores them, and what is decoded here is compared as bytes
 * (keys) or verified (signatures), never compared as strings.
 */
#include <string.h>

#include "core/runtime/base64.h"

/* Longer strings are refused by rt_b64_decode_exact unread: the longest thing it decodes
 * is a 64-byte signature (88 characters padded). */
#define RT_B64_EXACT_MAX_CHARS 128

/* The 6-bit value of c in either alphabet, or -1. */
static int sextet(unsigned char c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
}

long rt_b64_decode(const char *in, size_t in_len, unsigned char *out, size_t out_cap)
{
    /* Padding: only at the end, and only to complete the last group of four. */
    size_t data = in_len;
    while (data > 0 && in[data - 1] == '=') data--;
    size_t pad = in_len - data;
    if (pad > 2) return -1;
    if (pad > 0 && (in_len % 4 != 0 || data % 4 < 2 || 4 - data % 4 != pad)) return -1;
    if (data % 4 == 1) return -1; /* no byte count encodes to 4k+1 characters */

    size_t n = 0;
    unsigned acc = 0;
    int bits = 0;
    for (size_t i = 0; i < data; i++) {
        int v = sextet((unsigned char)in[i]);
        if (v < 0) return -1;
        acc = (acc << 6) | (unsigned)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (n >= out_cap) return -1;
            out[n++] = (unsigned char)(acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }
    return (long)n;
}

int rt_b64_decode_exact(const char *in, unsigned char *out, size_t want)
{
    unsigned char tmp[RT_B64_DECODED_MAX(RT_B64_EXACT_MAX_CHARS)];
    size_t len = strnlen(in, RT_B64_EXACT_MAX_CHARS + 1);
    if (len > RT_B64_EXACT_MAX_CHARS || want > sizeof(tmp)) return -1;
    long n = rt_b64_decode(in, len, tmp, sizeof(tmp));
    if (n < 0 || (size_t)n != want) return -1;
    memcpy(out, tmp, want);
    return 0;
}
