/*
 * atrium/parse.h - the one way a number a client (or another server) sent is read, for the
 * core and plugins alike.
 *
 * strtol and its family accept leading blanks and a '+', stop silently at the first
 * non-digit, and clamp on overflow with only errno to say so; a caller that forgets one of
 * those checks hands "12abc" or "99999999999999999999" on to PostgreSQL, which then fails
 * the request as a database error. atrium_parse_int64 checks all of it in one place:
 * nothing but an optional '-' and decimal digits, no overflow, inside [min, max].
 *
 * Header-only (static inline): it is part of no host table, so using it needs no ABI
 * version, and a plugin built from include/atrium/ alone has it.
 */
#ifndef ATRIUM_PARSE_H
#define ATRIUM_PARSE_H

#include <stdint.h>

#include "atrium/abi.h"

/* Read s as a decimal integer in [min, max] into *out. Accepted: an optional '-' followed
 * by one or more ASCII digits, and nothing else (no blanks, no '+', no trailing bytes).
 * Returns 0 with *out set; ATRIUM_E_INVAL when s is NULL or not such a number (*out
 * untouched); ATRIUM_E_LIMIT when it is a number outside [min, max], including one past
 * the int64 range, with *out set to the nearer bound, so a caller that clamps (a page
 * size) can use it and a caller that refuses (an ID) answers 400. [any] thread. */
static inline int atrium_parse_int64(const char *s, int64_t min, int64_t max, int64_t *out)
{
    if (!s) return ATRIUM_E_INVAL;
    const char *p = s;
    int negative = *p == '-';
    if (negative) p++;
    if (*p < '0' || *p > '9') return ATRIUM_E_INVAL;
    /* Accumulate the magnitude as unsigned; past the int64 range it saturates. */
    const uint64_t limit = negative ? (uint64_t)INT64_MAX + 1u : (uint64_t)INT64_MAX;
    uint64_t mag = 0;
    int overflow = 0;
    for (; *p; p++) {
        if (*p < '0' || *p > '9') return ATRIUM_E_INVAL;
        unsigned d = (unsigned)(*p - '0');
        if (!overflow && (mag > (limit - d) / 10u)) overflow = 1;
        if (!overflow) mag = mag * 10u + d;
    }
    int64_t v;
    if (overflow) v = negative ? INT64_MIN : INT64_MAX;
    else if (negative) v = mag == (uint64_t)INT64_MAX + 1u ? INT64_MIN : -(int64_t)mag;
    else v = (int64_t)mag;
    if (overflow || v < min || v > max) {
        *out = (overflow ? negative : v < min) ? min : max;
        return ATRIUM_E_LIMIT;
    }
    *out = v;
    return 0;
}

#endif
