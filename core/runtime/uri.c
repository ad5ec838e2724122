/*
 * core/runtime/uri.c - percent-encoding for URIs to other servers (contract in
 * core/runtime/uri.h).
 *
 * The output is checked before each write, so a value that does not fit is noticed at the
 * byte that would pass the end and the buffer is cleared: a caller that forgot the answer
 * would send an empty segment (which the other server refuses) rather than a prefix of
 * the ID (which names something else).
 */
#include "core/runtime/uri.h"

static bool unreserved(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '.' || c == '_' || c == '~';
}

bool rt_uri_encode(const char *s, char *out, size_t cap)
{
    static const char hex[] = "0123456789ABCDEF";
    if (cap == 0) return false;
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        size_t need = unreserved(*p) ? 1 : 3;
        if (cap - o <= need) { /* this byte's encoding and the NUL must both fit */
            out[0] = '\0';
            return false;
        }
        if (need == 1) {
            out[o++] = (char)*p;
        } else {
            out[o++] = '%';
            out[o++] = hex[*p >> 4];
            out[o++] = hex[*p & 15];
        }
    }
    out[o] = '\0';
    return true;
}
