/*
 * core/federation/transport/fed_resolve_parse.c - the pure parts of server discovery: the server
 * name grammar, the cache period a .well-known answer asks for, the body of that answer,
 * the order in which SRV records are tried, the TTL of a DNS answer and the Location of a
 * redirect.
 *
 * Nothing here does I/O, takes a lock or keeps state, so each rule is unit tested alone
 * (tests/unit/test_fed_resolve_parse.c) and fed_resolve.c only sequences them. What is
 * deliberately not here: what a cache period is clamped to, and how long a failure is
 * remembered (that is policy, fed_resolve.c).
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <jansson.h>

#include "core/federation/transport/fed_resolve.h"
#include "core/runtime/server_name.h"
#include "atrium/parse.h"

#define FED_MS_PER_S 1000
#define FED_DNS_HEADER_BYTES 12
#define FED_DNS_RR_FIXED_BYTES 10 /* type, class, ttl, rdlength */
#define FED_DNS_MAX_POINTER_HOPS 64

bool fed_server_name_split(const char *server_name, char *host, size_t host_len, int *port)
{
    if (!server_name || !host || host_len == 0 || !port)
        return false;
    host[0] = '\0';
    *port = 0;
    if (!rt_server_name_valid(server_name)) /* the one grammar: core/runtime/server_name.h */
        return false;
    const char *s = server_name, *host_start = s, *host_end, *rest;
    if (s[0] == '[') {
        host_start = s + 1;
        host_end = strchr(s, ']');
        rest = host_end + 1;
    } else {
        rest = host_end = s + strcspn(s, ":");
    }
    if (*rest == ':')
        *port = atoi(rest + 1); /* 1-65535 digits: checked above */
    size_t n = (size_t)(host_end - host_start);
    if (n >= host_len)
        return false;
    memcpy(host, host_start, n);
    host[n] = '\0';
    return true;
}

bool fed_host_is_ip_literal(const char *host)
{
    unsigned char bin[sizeof(struct in6_addr)];
    return host && (inet_pton(AF_INET, host, bin) == 1 || inet_pton(AF_INET6, host, bin) == 1);
}

/* ---- cache period of a .well-known answer ---------------------------------------------------- */

/* Does directive `name` ("max-age") appear in a Cache-Control list (case-insensitive)?
 * Its value, unquoted, goes to val ("" when it has none); val may be NULL. */
static bool cc_directive(const char *cc, const char *name, char *val, size_t val_len)
{
    size_t nlen = strlen(name);
    const char *p = cc;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        const char *tok = p;
        while (*p && *p != ',' && *p != '=' && *p != ' ' && *p != '\t')
            p++;
        size_t tlen = (size_t)(p - tok);
        while (*p == ' ' || *p == '\t')
            p++;
        const char *v = NULL;
        size_t vlen = 0;
        if (*p == '=') {
            p++;
            while (*p == ' ' || *p == '\t')
                p++;
            if (*p == '"') {
                v = ++p;
                while (*p && *p != '"')
                    p++;
                vlen = (size_t)(p - v);
                if (*p == '"')
                    p++;
            } else {
                v = p;
                while (*p && *p != ',' && *p != ' ' && *p != '\t')
                    p++;
                vlen = (size_t)(p - v);
            }
        }
        while (*p && *p != ',')
            p++;
        if (tlen == nlen && strncasecmp(tok, name, nlen) == 0) {
            if (val && val_len > 0) {
                size_t n = vlen < val_len - 1 ? vlen : val_len - 1;
                if (v)
                    memcpy(val, v, n);
                val[v ? n : 0] = '\0';
            }
            return true;
        }
    }
    return false;
}

/* An IMF-fixdate ("Sun, 06 Nov 1994 08:49:37 GMT") as wall-clock ms, or -1. */
static int64_t http_date_ms(const char *s)
{
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    const char *end = strptime(s, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    if (!end || *end != '\0')
        return -1;
    time_t t = timegm(&tm);
    if (t == (time_t)-1)
        return -1;
    return (int64_t)t * FED_MS_PER_S;
}

int64_t fed_resolve_cache_period_ms(const char *cache_control, const char *expires,
                                    int64_t now_wall_ms)
{
    if (cache_control && *cache_control) {
        if (cc_directive(cache_control, "no-store", NULL, 0) ||
            cc_directive(cache_control, "no-cache", NULL, 0))
            return 0;
        char v[32];
        if (cc_directive(cache_control, "max-age", v, sizeof v)) {
            int64_t secs;
            int rc = atrium_parse_int64(v, 0, INT64_MAX / FED_MS_PER_S, &secs);
            if (v[0] != '-' && rc != ATRIUM_E_INVAL)
                return rc == ATRIUM_E_LIMIT ? INT64_MAX : secs * FED_MS_PER_S;
            /* A malformed max-age is ignored; Expires may still speak. */
        }
    }
    if (expires && *expires) {
        int64_t at = http_date_ms(expires);
        if (at < 0)
            return 0; /* an invalid Expires means "already expired" (RFC 9111) */
        return at > now_wall_ms ? at - now_wall_ms : 0;
    }
    return -1;
}

/* ---- the .well-known body -------------------------------------------------------------------- */

int fed_well_known_parse(const char *body, size_t len, char *out, size_t out_len, char *err,
                         size_t errlen)
{
    json_error_t jerr;
    json_t *doc = json_loadb(body ? body : "", body ? len : 0, JSON_REJECT_DUPLICATES, &jerr);
    if (!doc) {
        snprintf(err, errlen, "the body is not JSON (%s)", jerr.text);
        return -1;
    }
    int rc = -1;
    json_t *ms = json_object_get(doc, "m.server");
    char host[FED_RESOLVE_NAME_BYTES];
    int port;
    if (!json_is_object(doc)) {
        snprintf(err, errlen, "the body is not a JSON object");
    } else if (!json_is_string(ms)) {
        snprintf(err, errlen, "m.server is missing or not a string");
    } else if (!fed_server_name_split(json_string_value(ms), host, sizeof host, &port)) {
        snprintf(err, errlen, "m.server is not a valid server name");
    } else if (strlen(json_string_value(ms)) >= out_len) {
        snprintf(err, errlen, "m.server is too long");
    } else {
        snprintf(out, out_len, "%s", json_string_value(ms));
        rc = 0;
    }
    json_decref(doc);
    return rc;
}

/* ---- SRV order ------------------------------------------------------------------------------- */

static int srv_cmp_priority(const void *a, const void *b)
{
    const fed_srv_record *x = a, *y = b;
    return (x->priority > y->priority) - (x->priority < y->priority);
}

void fed_srv_order(fed_srv_record *recs, size_t n, uint32_t (*rnd)(void *arg), void *rnd_arg)
{
    if (n < 2)
        return;
    /* qsort is not stable; a stable insertion sort keeps equal priorities in answer order,
     * which the weighted pick below then reorders on purpose. n is small (a DNS answer). */
    for (size_t i = 1; i < n; i++) {
        fed_srv_record cur = recs[i];
        size_t j = i;
        while (j > 0 && srv_cmp_priority(&recs[j - 1], &cur) > 0) {
            recs[j] = recs[j - 1];
            j--;
        }
        recs[j] = cur;
    }
    /* RFC 2782 within each priority: repeatedly pick a record with probability
     * proportional to its weight (zero-weight records first in the running sum, so they
     * are picked only when the random number is 0 or nothing else remains). */
    size_t start = 0;
    while (start < n) {
        size_t end = start + 1;
        while (end < n && recs[end].priority == recs[start].priority)
            end++;
        /* zero weights to the front of the group, stable */
        for (size_t i = start + 1; i < end; i++) {
            if (recs[i].weight != 0)
                continue;
            fed_srv_record cur = recs[i];
            size_t j = i;
            while (j > start && recs[j - 1].weight != 0) {
                recs[j] = recs[j - 1];
                j--;
            }
            recs[j] = cur;
        }
        for (size_t pos = start; pos + 1 < end; pos++) {
            uint64_t sum = 0;
            for (size_t i = pos; i < end; i++)
                sum += (uint64_t)recs[i].weight;
            uint64_t pick = rnd ? (uint64_t)rnd(rnd_arg) % (sum + 1) : 0;
            uint64_t running = 0;
            size_t chosen = pos;
            for (size_t i = pos; i < end; i++) {
                running += (uint64_t)recs[i].weight;
                if (running >= pick) {
                    chosen = i;
                    break;
                }
            }
            fed_srv_record tmp = recs[chosen];
            memmove(&recs[pos + 1], &recs[pos], (chosen - pos) * sizeof *recs);
            recs[pos] = tmp;
        }
        start = end;
    }
}

bool fed_srv_says_no_service(const fed_srv_record *recs, size_t n)
{
    return n == 1 && (recs[0].target[0] == '\0' || strcmp(recs[0].target, ".") == 0);
}

/* ---- DNS answer TTL -------------------------------------------------------------------------- */

/* Skip a (possibly compressed) name at *off; false when malformed. */
static bool dns_skip_name(const unsigned char *msg, size_t len, size_t *off)
{
    size_t p = *off;
    for (int hops = 0; hops < FED_DNS_MAX_POINTER_HOPS; hops++) {
        if (p >= len)
            return false;
        unsigned char l = msg[p];
        if (l == 0) {
            *off = p + 1;
            return true;
        }
        if ((l & 0xC0) == 0xC0) {
            if (p + 1 >= len)
                return false;
            *off = p + 2; /* a pointer ends the name in this record */
            return true;
        }
        if (l & 0xC0)
            return false;
        p += 1u + l;
    }
    return false;
}

static unsigned dns_u16(const unsigned char *p)
{
    return ((unsigned)p[0] << 8) | p[1];
}

int64_t fed_dns_min_ttl(const unsigned char *msg, size_t len, int type)
{
    if (!msg || len < FED_DNS_HEADER_BYTES)
        return -1;
    unsigned qd = dns_u16(msg + 4), an = dns_u16(msg + 6);
    size_t off = FED_DNS_HEADER_BYTES;
    for (unsigned i = 0; i < qd; i++) {
        if (!dns_skip_name(msg, len, &off) || off + 4 > len)
            return -1;
        off += 4;
    }
    int64_t min = -1;
    for (unsigned i = 0; i < an; i++) {
        if (!dns_skip_name(msg, len, &off) || off + FED_DNS_RR_FIXED_BYTES > len)
            return -1;
        unsigned rtype = dns_u16(msg + off);
        uint32_t ttl = ((uint32_t)msg[off + 4] << 24) | ((uint32_t)msg[off + 5] << 16) |
                       ((uint32_t)msg[off + 6] << 8) | msg[off + 7];
        unsigned rdlen = dns_u16(msg + off + 8);
        off += FED_DNS_RR_FIXED_BYTES;
        if (off + rdlen > len)
            return -1;
        off += rdlen;
        if ((int)rtype != type)
            continue;
        /* RFC 2181: a TTL with the top bit set is treated as zero. */
        int64_t t = (ttl & 0x80000000u) ? 0 : (int64_t)ttl;
        if (min < 0 || t < min)
            min = t;
    }
    return min;
}

/* ---- redirect Location ----------------------------------------------------------------------- */

int fed_url_resolve(const fed_url *base, const char *location, fed_url *out)
{
    if (!location || !*location)
        return -1;
    if (location[0] == '/' && location[1] != '/') {
        *out = *base;
        if (strlen(location) >= sizeof out->path)
            return -1;
        snprintf(out->path, sizeof out->path, "%s", location);
        return 0;
    }
    const char *p;
    if (strncasecmp(location, "https://", 8) == 0) {
        snprintf(out->scheme, sizeof out->scheme, "https");
        out->port = 443;
        p = location + 8;
    } else if (strncasecmp(location, "http://", 7) == 0) {
        snprintf(out->scheme, sizeof out->scheme, "http");
        out->port = 80;
        p = location + 7;
    } else {
        return -1; /* relative paths without '/', other schemes: refused */
    }
    const char *slash = strpbrk(p, "/?#");
    size_t auth_len = slash ? (size_t)(slash - p) : strlen(p);
    char authority[FED_RESOLVE_NAME_BYTES + 8];
    if (auth_len == 0 || auth_len >= sizeof authority || memchr(p, '@', auth_len))
        return -1;
    memcpy(authority, p, auth_len);
    authority[auth_len] = '\0';
    int port = 0;
    if (!fed_server_name_split(authority, out->host, sizeof out->host, &port))
        return -1;
    if (port)
        out->port = port;
    const char *path = slash ? slash : "/";
    if (*path == '#')
        path = "/";
    if (strlen(path) >= sizeof out->path)
        return -1;
    snprintf(out->path, sizeof out->path, "%s%s", *path == '?' ? "/" : "", path);
    char *hash = strchr(out->path, '#'); /* a fragment is never sent */
    if (hash)
        *hash = '\0';
    return 0;
}
