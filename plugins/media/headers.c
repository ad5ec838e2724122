/*
 * plugins/media/headers.c - the rules that decide what a media response says about
 * itself, and which identifiers may reach the store at all.
 *
 * Decisions owned here (docs/architecture.md, "Media: the plugin's rules", Headers and
 * Identifiers; the Matrix client-server API, Content repository, and RFC 9110, RFC 6266):
 *   - media IDs are whitelisted ([A-Za-z0-9_-], bounded), never blacklisted, so no path
 *     traversal or encoding trick can name a file outside the store;
 *   - Content-Disposition is `inline` only for the spec's allow-list, carries the upload's
 *     (or the path's) file name, quoted for ASCII and as RFC 6266/8187 filename* for
 *     anything else;
 *   - If-None-Match uses the weak comparison RFC 9110 prescribes for it;
 *   - Range: one byte range is honoured; multi-range or malformed headers are ignored
 *     (the whole body is served, as RFC 9110 allows); a range past the end is 416.
 * Everything here is a pure function of its arguments (tests/unit/test_media_rules.c),
 * and nothing here sets a response: delivery.c and download.c apply these rules.
 */
#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "media.h"

/* The spec's "Serving inline content" list: the contract's own (atrium/media.h). */
static const char *const INLINE_TYPES[] = {ATRIUM_MEDIA_INLINE_TYPES, NULL};

/* Static image types a thumbnail response may carry (the spec's thumbnail enum). */
static const char *const THUMBNAIL_TYPES[] = {"image/jpeg", "image/png", "image/gif", "image/webp",
                                              NULL};

bool media_id_valid(const char *id)
{
    size_t n = 0;
    for (const char *p = id; *p; p++, n++) {
        if (n >= MEDIA_ID_MAX_CHARS) return false;
        if (!isalnum((unsigned char)*p) && *p != '_' && *p != '-') return false;
    }
    return n > 0;
}

/* The media type without parameters or surrounding space, lowercased, into buf. */
static const char *base_type(const char *content_type, char *buf, size_t cap)
{
    size_t n = 0;
    const char *p = content_type ? content_type : "";
    while (*p == ' ' || *p == '\t') p++;
    for (; *p && *p != ';' && *p != ' ' && *p != '\t' && n + 1 < cap; p++)
        buf[n++] = (char)tolower((unsigned char)*p);
    buf[n] = '\0';
    return buf;
}

static bool type_in(const char *content_type, const char *const *list)
{
    char buf[MEDIA_TYPE_MAX_BYTES + 1];
    base_type(content_type, buf, sizeof(buf));
    for (size_t i = 0; list[i]; i++)
        if (strcmp(buf, list[i]) == 0) return true;
    return false;
}

bool media_type_inline(const char *content_type)
{
    return type_in(content_type, INLINE_TYPES);
}

bool media_type_thumbnail_safe(const char *content_type)
{
    return type_in(content_type, THUMBNAIL_TYPES);
}

bool media_type_acceptable(const char *content_type)
{
    size_t n = strlen(content_type);
    if (n == 0 || n > MEDIA_TYPE_MAX_BYTES || !strchr(content_type, '/')) return false;
    for (const char *p = content_type; *p; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e) return false;
    return true;
}

/* Length of the UTF-8 sequence at p (1-4), or 0 when it is not well-formed (overlong
 * forms, surrogates and code points past U+10FFFF are refused). */
static size_t utf8_seq(const unsigned char *p)
{
    if (p[0] < 0x80) return 1;
    if (p[0] >= 0xc2 && p[0] <= 0xdf) return (p[1] & 0xc0) == 0x80 ? 2 : 0;
    if (p[0] >= 0xe0 && p[0] <= 0xef) {
        if ((p[1] & 0xc0) != 0x80 || (p[2] & 0xc0) != 0x80) return 0;
        if (p[0] == 0xe0 && p[1] < 0xa0) return 0;  /* overlong */
        if (p[0] == 0xed && p[1] >= 0xa0) return 0; /* surrogate */
        return 3;
    }
    if (p[0] >= 0xf0 && p[0] <= 0xf4) {
        if ((p[1] & 0xc0) != 0x80 || (p[2] & 0xc0) != 0x80 || (p[3] & 0xc0) != 0x80) return 0;
        if (p[0] == 0xf0 && p[1] < 0x90) return 0;  /* overlong */
        if (p[0] == 0xf4 && p[1] >= 0x90) return 0; /* past U+10FFFF */
        return 4;
    }
    return 0;
}

bool media_name_acceptable(const char *name)
{
    size_t n = strlen(name);
    if (n > MEDIA_NAME_MAX_BYTES) return false;
    const unsigned char *p = (const unsigned char *)name;
    while (*p) {
        if (*p < 0x20 || *p == 0x7f) return false;
        size_t k = utf8_seq(p);
        if (k == 0) return false;
        p += k;
    }
    return true;
}

static bool is_attr_char(unsigned char c)
{
    /* RFC 8187 attr-char: ALPHA / DIGIT / "!" / "#" / "$" / "&" / "+" / "-" / "." /
     * "^" / "_" / "`" / "|" / "~" */
    return isalnum(c) || (c && strchr("!#$&+-.^_`|~", c) != NULL);
}

int media_content_disposition(char *out, size_t cap, bool is_inline, const char *name)
{
    const char *kind = is_inline ? "inline" : "attachment";
    size_t n = (size_t)snprintf(out, cap, "%s", kind);
    if (n >= cap) return -1;
    if (!name || !*name) return 0;
    bool ascii = true;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        if (*p < 0x20 || *p > 0x7e) ascii = false;
    if (ascii) {
        const char *lead = "; filename=\"";
        if (n + strlen(lead) >= cap) return -1;
        memcpy(out + n, lead, strlen(lead));
        n += strlen(lead);
        for (const char *p = name; *p; p++) {
            if (*p == '"' || *p == '\\') {
                if (n + 2 >= cap) return -1;
                out[n++] = '\\';
            }
            if (n + 1 >= cap) return -1;
            out[n++] = *p;
        }
        if (n + 2 > cap) return -1;
        out[n++] = '"';
        out[n] = '\0';
        return 0;
    }
    static const char HEX[] = "0123456789ABCDEF";
    const char *lead = "; filename*=utf-8''";
    if (n + strlen(lead) >= cap) return -1;
    memcpy(out + n, lead, strlen(lead));
    n += strlen(lead);
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        if (is_attr_char(*p)) {
            if (n + 1 >= cap) return -1;
            out[n++] = (char)*p;
        } else {
            if (n + 3 >= cap) return -1;
            out[n++] = '%';
            out[n++] = HEX[*p >> 4];
            out[n++] = HEX[*p & 15];
        }
    }
    out[n] = '\0';
    return 0;
}

bool media_etag_matches(const char *if_none_match, const char *etag)
{
    if (!if_none_match || !etag) return false;
    size_t etag_len = strlen(etag);
    const char *p = if_none_match;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == ',') p++;
        if (!*p) return false;
        if (*p == '*') return true;
        if (p[0] == 'W' && p[1] == '/') p += 2; /* weak comparison: ignore the weak flag */
        const char *end = p;
        if (*p == '"') {
            const char *close = strchr(p + 1, '"');
            if (!close) return false;
            end = close + 1;
        } else {
            while (*end && *end != ',' && *end != ' ' && *end != '\t') end++;
        }
        if ((size_t)(end - p) == etag_len && memcmp(p, etag, etag_len) == 0) return true;
        p = end;
        while (*p && *p != ',') p++;
    }
}

/* Parse decimal digits [p, end) into *out; false when empty, not digits, or overflowing. */
static bool parse_u64(const char *p, const char *end, uint64_t *out)
{
    if (p == end) return false;
    uint64_t v = 0;
    for (; p < end; p++) {
        if (!isdigit((unsigned char)*p)) return false;
        unsigned d = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - d) / 10) return false;
        v = v * 10 + d;
    }
    *out = v;
    return true;
}

int media_parse_range(const char *range, uint64_t size, uint64_t *start, uint64_t *len)
{
    if (!range) return MEDIA_RANGE_NONE;
    while (*range == ' ') range++;
    if (strncasecmp(range, "bytes", 5) != 0) return MEDIA_RANGE_NONE;
    const char *p = range + 5;
    while (*p == ' ') p++;
    if (*p != '=') return MEDIA_RANGE_NONE;
    p++;
    if (strchr(p, ',')) return MEDIA_RANGE_NONE; /* several ranges: serve it whole */
    while (*p == ' ') p++;
    const char *end = p + strlen(p);
    while (end > p && end[-1] == ' ') end--;
    const char *dash = memchr(p, '-', (size_t)(end - p));
    if (!dash) return MEDIA_RANGE_NONE;
    uint64_t a = 0, b = 0;
    if (dash == p) { /* suffix: the last b bytes */
        if (!parse_u64(dash + 1, end, &b)) return MEDIA_RANGE_NONE;
        if (b == 0 || size == 0) return MEDIA_RANGE_UNSATISFIABLE;
        if (b > size) b = size;
        *start = size - b;
        *len = b;
        return MEDIA_RANGE_OK;
    }
    if (!parse_u64(p, dash, &a)) return MEDIA_RANGE_NONE;
    bool open_ended = dash + 1 == end;
    if (!open_ended) {
        if (!parse_u64(dash + 1, end, &b)) return MEDIA_RANGE_NONE;
        if (b < a) return MEDIA_RANGE_NONE; /* invalid: ignored */
    }
    if (a >= size) return MEDIA_RANGE_UNSATISFIABLE;
    uint64_t last = open_ended || b >= size ? size - 1 : b;
    *start = a;
    *len = last - a + 1;
    return MEDIA_RANGE_OK;
}
