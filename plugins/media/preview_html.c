/*
 * plugins/media/preview_html.c - the pure half of URL previews: reading a page's
 * OpenGraph metadata out of its HTML, and the URL rules (which URLs are fetched, how a
 * relative og:image or redirect Location is resolved against the page).
 *
 * The reader is a scanner, not an HTML parser: it walks the bytes once, skips comments
 * and the contents of <script> and <style>, and looks only at <meta> tags (their
 * property or name, and content attributes) and the first <title>. That is all a
 * preview needs, and a scanner has no tree to blow up: it keeps at most
 * PREVIEW_OG_MAX_KEYS values of at most PREVIEW_FIELD_MAX_BYTES each, whatever the page
 * holds (the page itself is capped by url_preview_max_bytes before it gets here).
 * Values are decoded (character references), whitespace runs collapsed to one space and
 * trimmed, control characters dropped and bytes that are not UTF-8 replaced by U+FFFD
 * (or read as ISO-8859-1 when the page says so), so every value is a valid JSON string.
 *
 * What the answer holds: every og:* property the page declares (the first of each
 * name), og:image:width / og:image:height as integers when they are numbers; then, when
 * the page declares none, og:title from <title> and og:description from
 * <meta name="description">. It does not summarise body text into a description, and
 * knows no oEmbed.
 *
 * URLs: only absolute http and https URLs are previewed; a URL is normalised before it
 * is fetched or used as a cache key (scheme lower-cased, fragment cut, an empty path made
 * "/", bytes outside printable ASCII percent-encoded), and one naming user information
 * (user@host) is refused, as the host's outbound client refuses it. Dot segments are not
 * removed from a resolved path: the site sees what its page said.
 */
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "media.h"

#define UTF8_MAX_BYTES 4
#define REPLACEMENT_CHAR 0xFFFDu
#define ENTITY_MAX_CHARS 12 /* "&#x10FFFF;" and the named ones below */

/* ---- text: references, UTF-8, whitespace ---------------------------------------------- */

static size_t utf8_put(char *out, uint32_t cp)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* One UTF-8 sequence at s (n bytes left): its code point and length, or U+FFFD and 1. */
static uint32_t utf8_get(const unsigned char *s, size_t n, size_t *used)
{
    *used = 1;
    unsigned c = s[0];
    size_t len = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 0;
    if (len == 0 || len > n) return REPLACEMENT_CHAR;
    uint32_t cp = c & (0x3F >> (len - 1));
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return REPLACEMENT_CHAR;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < least[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return REPLACEMENT_CHAR;
    *used = len;
    return cp;
}

static const struct {
    const char *name;
    uint32_t cp;
} NAMED_REFS[] = {
    {"amp", '&'},     {"lt", '<'},       {"gt", '>'},       {"quot", '"'},     {"apos", '\''},
    {"nbsp", 0xA0},   {"ndash", 0x2013}, {"mdash", 0x2014}, {"hellip", 0x2026}, {"lsquo", 0x2018},
    {"rsquo", 0x2019}, {"ldquo", 0x201C}, {"rdquo", 0x201D}, {"copy", 0xA9},    {"reg", 0xAE},
};

/* A character reference at s ('&'): its code point and length, or 0 when it is none. */
static size_t reference(const char *s, size_t n, uint32_t *cp)
{
    size_t semi = 1;
    while (semi < n && semi <= ENTITY_MAX_CHARS && s[semi] != ';') semi++;
    if (semi >= n || s[semi] != ';' || semi < 2) return 0;
    if (s[1] == '#') {
        bool hex = semi > 2 && (s[2] == 'x' || s[2] == 'X');
        size_t i = hex ? 3 : 2;
        if (i >= semi) return 0;
        uint32_t v = 0;
        for (; i < semi; i++) {
            int d = hex ? (isxdigit((unsigned char)s[i]) ? (isdigit((unsigned char)s[i])
                                                               ? s[i] - '0'
                                                               : (tolower((unsigned char)s[i]) - 'a' + 10))
                                                         : -1)
                        : (isdigit((unsigned char)s[i]) ? s[i] - '0' : -1);
            if (d < 0) return 0;
            v = v * (hex ? 16 : 10) + (uint32_t)d;
            if (v > 0x10FFFF) v = 0x110000; /* stays out of range */
        }
        *cp = v == 0 || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF) ? REPLACEMENT_CHAR : v;
        return semi + 1;
    }
    for (size_t k = 0; k < sizeof(NAMED_REFS) / sizeof(NAMED_REFS[0]); k++)
        if (strlen(NAMED_REFS[k].name) == semi - 1 &&
            strncmp(s + 1, NAMED_REFS[k].name, semi - 1) == 0) {
            *cp = NAMED_REFS[k].cp;
            return semi + 1;
        }
    return 0;
}

static bool is_space_cp(uint32_t cp)
{
    return cp == ' ' || cp == '\t' || cp == '\n' || cp == '\r' || cp == '\f' || cp == 0xA0;
}

/* s[0..n) as a value: references decoded, whitespace collapsed and trimmed, controls
 * dropped, valid UTF-8 of at most PREVIEW_FIELD_MAX_BYTES. Caller frees; NULL on OOM. */
static char *decode_text(const char *s, size_t n, bool latin1)
{
    char *out = malloc(PREVIEW_FIELD_MAX_BYTES + 1);
    if (!out) return NULL;
    size_t o = 0, i = 0;
    bool pending_space = false;
    while (i < n) {
        uint32_t cp;
        size_t used;
        if (s[i] == '&' && (used = reference(s + i, n - i, &cp)) > 0) {
            i += used;
        } else if (latin1 || (unsigned char)s[i] < 0x80) {
            cp = (unsigned char)s[i++];
        } else {
            cp = utf8_get((const unsigned char *)s + i, n - i, &used);
            i += used;
        }
        if (is_space_cp(cp)) {
            pending_space = o > 0;
            continue;
        }
        if (cp < 0x20 || (cp >= 0x7F && cp < 0xA0)) continue;
        if (o + (pending_space ? 1 : 0) + UTF8_MAX_BYTES > PREVIEW_FIELD_MAX_BYTES) break;
        if (pending_space) out[o++] = ' ';
        pending_space = false;
        o += utf8_put(out + o, cp);
    }
    out[o] = '\0';
    return out;
}

/* ---- the scanner ------------------------------------------------------------------------ */

/* The first case-insensitive occurrence of needle in [p, end), or NULL. */
static const char *find_ci(const char *p, const char *end, const char *needle)
{
    size_t n = strlen(needle);
    for (; p + n <= end; p++)
        if (strncasecmp(p, needle, n) == 0) return p;
    return NULL;
}

/* The '>' that closes the tag whose attributes start at p (quotes respected), or NULL. */
static const char *tag_close(const char *p, const char *end)
{
    char quote = 0;
    for (; p < end; p++) {
        if (quote) {
            if (*p == quote) quote = 0;
        } else if (*p == '"' || *p == '\'') {
            quote = *p;
        } else if (*p == '>') {
            return p;
        }
    }
    return NULL;
}

typedef struct meta_attrs {
    const char *property, *name, *content;
    size_t property_len, name_len, content_len;
} meta_attrs;

static bool attr_is(const char *a, size_t n, const char *want)
{
    return strlen(want) == n && strncasecmp(a, want, n) == 0;
}

/* The attributes of a tag, between its name and its '>'. */
static void read_attrs(const char *p, const char *end, meta_attrs *out)
{
    memset(out, 0, sizeof(*out));
    while (p < end) {
        while (p < end && (isspace((unsigned char)*p) || *p == '/')) p++;
        const char *an = p;
        while (p < end && !isspace((unsigned char)*p) && *p != '=' && *p != '/') p++;
        size_t an_len = (size_t)(p - an);
        if (an_len == 0) {
            if (p < end) p++; /* a stray '=' */
            continue;
        }
        while (p < end && isspace((unsigned char)*p)) p++;
        const char *v = NULL;
        size_t v_len = 0;
        if (p < end && *p == '=') {
            p++;
            while (p < end && isspace((unsigned char)*p)) p++;
            if (p < end && (*p == '"' || *p == '\'')) {
                char q = *p++;
                v = p;
                while (p < end && *p != q) p++;
                v_len = (size_t)(p - v);
                if (p < end) p++;
            } else {
                v = p;
                while (p < end && !isspace((unsigned char)*p)) p++;
                v_len = (size_t)(p - v);
            }
        }
        if (!v) continue;
        if (attr_is(an, an_len, "property") && !out->property) {
            out->property = v;
            out->property_len = v_len;
        } else if (attr_is(an, an_len, "name") && !out->name) {
            out->name = v;
            out->name_len = v_len;
        } else if (attr_is(an, an_len, "content") && !out->content) {
            out->content = v;
            out->content_len = v_len;
        }
    }
}

/* Keep og[key] = value (the first of each key, at most PREVIEW_OG_MAX_KEYS keys). */
static void og_keep(json_t *og, const char *key, const char *content, size_t len, bool latin1)
{
    if (json_object_get(og, key) || json_object_size(og) >= PREVIEW_OG_MAX_KEYS) return;
    char *v = decode_text(content, len, latin1);
    if (!v) return;
    json_t *val = NULL;
    if (strcmp(key, "og:image:width") == 0 || strcmp(key, "og:image:height") == 0) {
        char *endp;
        long long n = *v ? strtoll(v, &endp, 10) : -1;
        if (*v && !*endp && n > 0 && n <= INT32_MAX) val = json_integer(n);
    } else if (*v) {
        val = json_string(v);
    }
    if (val) json_object_set_new(og, key, val);
    free(v);
}

json_t *preview_html_og(const char *html, size_t len, bool latin1)
{
    json_t *og = json_object();
    if (!og) return NULL;
    char *title = NULL, *description = NULL;
    const char *p = html, *end = html + len;
    while (p < end && (p = memchr(p, '<', (size_t)(end - p)))) {
        p++;
        if (end - p >= 3 && memcmp(p, "!--", 3) == 0) {
            const char *q = find_ci(p + 3, end, "-->");
            if (!q) break;
            p = q + 3;
            continue;
        }
        const char *name = p;
        while (p < end && isalnum((unsigned char)*p)) p++;
        size_t name_len = (size_t)(p - name);
        if (name_len == 0) continue; /* "</x", "<!DOCTYPE", a stray '<' */
        const char *close = tag_close(p, end);
        if (!close) break;
        if (attr_is(name, name_len, "script") || attr_is(name, name_len, "style")) {
            const char *q = find_ci(close + 1, end, attr_is(name, name_len, "script") ? "</script"
                                                                                     : "</style");
            if (!q) break;
            p = q + 2;
            continue;
        }
        if (attr_is(name, name_len, "meta")) {
            meta_attrs a;
            read_attrs(p, close, &a);
            const char *key = a.property ? a.property : a.name;
            size_t key_len = a.property ? a.property_len : a.name_len;
            if (key && a.content && key_len > 3 && key_len < 64 && strncasecmp(key, "og:", 3) == 0) {
                char k[64];
                for (size_t i = 0; i < key_len; i++) k[i] = (char)tolower((unsigned char)key[i]);
                k[key_len] = '\0';
                og_keep(og, k, a.content, a.content_len, latin1);
            } else if (a.name && a.content && !description &&
                       attr_is(a.name, a.name_len, "description")) {
                description = decode_text(a.content, a.content_len, latin1);
            }
        } else if (attr_is(name, name_len, "title") && !title) {
            const char *q = find_ci(close + 1, end, "</title");
            if (!q) break;
            title = decode_text(close + 1, (size_t)(q - close - 1), latin1);
            p = q + 2;
            continue;
        }
        p = close + 1;
    }
    if (title && *title && !json_object_get(og, "og:title"))
        json_object_set_new(og, "og:title", json_string(title));
    if (description && *description && !json_object_get(og, "og:description"))
        json_object_set_new(og, "og:description", json_string(description));
    free(title);
    free(description);
    return og;
}

/* ---- URLs ------------------------------------------------------------------------------- */

int preview_url_normalize(const char *url, char *out, size_t cap)
{
    bool plain = strncasecmp(url, "http://", 7) == 0;
    if (!plain && strncasecmp(url, "https://", 8) != 0) return -1;
    size_t scheme_len = plain ? 7 : 8;
    const char *auth = url + scheme_len;
    size_t auth_len = strcspn(auth, "/?#");
    if (auth_len == 0 || memchr(auth, '@', auth_len)) return -1;
    for (size_t i = 0; i < auth_len; i++)
        if ((unsigned char)auth[i] <= ' ' || (unsigned char)auth[i] >= 0x7F) return -1;
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    int n = snprintf(out, cap, "%s%.*s", plain ? "http://" : "https://", (int)auth_len, auth);
    if (n < 0 || (size_t)n >= cap) return -1;
    o = (size_t)n;
    for (size_t i = 0; i < auth_len; i++) out[scheme_len + i] = (char)tolower((unsigned char)out[scheme_len + i]);
    const char *rest = auth + auth_len;
    if (*rest != '/') {
        if (o + 1 >= cap) return -1;
        out[o++] = '/';
    }
    for (; *rest && *rest != '#'; rest++) {
        unsigned char c = (unsigned char)*rest;
        if (c <= ' ' || c >= 0x7F) {
            if (o + 3 >= cap) return -1;
            out[o++] = '%';
            out[o++] = hex[c >> 4];
            out[o++] = hex[c & 15];
        } else {
            if (o + 1 >= cap) return -1;
            out[o++] = (char)c;
        }
    }
    out[o] = '\0';
    return plain ? PREVIEW_URL_PLAIN_HTTP : 0;
}

/* Does ref start with a scheme ("x:" before any '/', '?' or '#')? */
static bool has_scheme(const char *ref)
{
    size_t n = strcspn(ref, ":/?#");
    if (ref[n] != ':' || n == 0 || !isalpha((unsigned char)ref[0])) return false;
    for (size_t i = 1; i < n; i++)
        if (!isalnum((unsigned char)ref[i]) && ref[i] != '+' && ref[i] != '-' && ref[i] != '.')
            return false;
    return true;
}

int preview_url_join(const char *base, const char *ref, char *out, size_t cap)
{
    if (!ref || !*ref) return -1;
    if (has_scheme(ref)) return preview_url_normalize(ref, out, cap);
    const char *auth = strstr(base, "://");
    if (!auth) return -1;
    auth += 3;
    size_t scheme_end = (size_t)(auth - base);        /* "https://" */
    size_t auth_end = scheme_end + strcspn(auth, "/?#"); /* end of the host[:port] */
    size_t path_end = auth_end + strcspn(base + auth_end, "?#");
    char joined[PREVIEW_URL_MAX * 2];
    int n;
    if (ref[0] == '/' && ref[1] == '/')
        n = snprintf(joined, sizeof(joined), "%.*s%s", (int)(scheme_end - 2), base, ref);
    else if (ref[0] == '/')
        n = snprintf(joined, sizeof(joined), "%.*s%s", (int)auth_end, base, ref);
    else if (ref[0] == '?')
        n = snprintf(joined, sizeof(joined), "%.*s%s", (int)path_end, base, ref);
    else if (ref[0] == '#')
        n = snprintf(joined, sizeof(joined), "%.*s", (int)path_end, base);
    else {
        size_t dir_end = path_end;
        while (dir_end > auth_end && base[dir_end - 1] != '/') dir_end--;
        if (dir_end == auth_end)
            n = snprintf(joined, sizeof(joined), "%.*s/%s", (int)auth_end, base, ref);
        else
            n = snprintf(joined, sizeof(joined), "%.*s%s", (int)dir_end, base, ref);
    }
    if (n < 0 || (size_t)n >= sizeof(joined)) return -1;
    return preview_url_normalize(joined, out, cap);
}
