/*
 * core/runtime/iprange.c - CIDR lists and the connect-time address rule (see
 * rt_iprange_range.h for the contract).
 *
 * A list is a flat array of (family, prefix length, network bytes): the lists are short
 * (tens of entries) and asked once per socket the outbound client opens, so a linear scan
 * beats any tree. Host bits past the prefix are cleared at parse time ("10.1.2.3/8" is
 * 10.0.0.0/8), as operators write ranges both ways.
 *
 * One normalisation decides every IPv4/IPv6 question: an address is judged as IPv4 when
 * it is IPv4 or an IPv4-mapped IPv6 address (::ffff:a.b.c.d, which the kernel connects to
 * as a.b.c.d). An IPv4 address is then also matched against the IPv6 ranges in its mapped
 * form, so an entry such as ::ffff:10.0.0.0/104 (or ::/0) covers the IPv4 addresses it
 * spells. Deliberately not here: host names (the client never connects to a name), ports.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime/iprange.h"

#define RT_IPRANGE_V4_BITS 32
#define RT_IPRANGE_V6_BITS 128
#define RT_IPRANGE_ENTRY_MAX_BYTES 64 /* longest "address/prefix" text accepted */
#define RT_IPRANGE_MAX_ENTRIES 4096   /* a longer list is a configuration mistake */

/* Beyond what the header lists by name: benchmarking (198.18/15), documentation
 * (192.0.2/24, 198.51.100/24, 203.0.113/24, 2001:db8::/32), IETF protocol assignments
 * (192.0.0/24), the deprecated 6to4 relay anycast (192.88.99/24), reserved (240/4), and
 * the IPv6 ranges that embed or translate an IPv4 address, any IPv4 address: NAT64
 * (64:ff9b::/96, local-use 64:ff9b:1::/48), IPv4-compatible (::/96), IPv4-translated
 * (::ffff:0:0:0/96), 6to4 (2002::/16) and Teredo (2001::/32); plus discard-only
 * (100::/64) and the deprecated site-local (fec0::/10). */
const char *const RT_IPRANGE_DEFAULT_BLACKLIST[] = {
    "127.0.0.0/8",     "10.0.0.0/8",       "172.16.0.0/12",    "192.168.0.0/16",
    "100.64.0.0/10",   "169.254.0.0/16",   "0.0.0.0/8",        "192.0.0.0/24",
    "192.0.2.0/24",    "192.88.99.0/24",   "198.18.0.0/15",    "198.51.100.0/24",
    "203.0.113.0/24",  "224.0.0.0/4",      "240.0.0.0/4",      "255.255.255.255/32",
    "::1/128",         "::/128",           "::/96",            "::ffff:0:0:0/96",
    "64:ff9b::/96",    "64:ff9b:1::/48",   "100::/64",         "2001::/32",
    "2001:db8::/32",   "2002::/16",        "fc00::/7",         "fe80::/10",
    "fec0::/10",       "ff00::/8",         NULL,
};

typedef struct rt_iprange_range {
    int family;        /* AF_INET or AF_INET6 */
    int prefix;        /* bits */
    uint8_t net[16];   /* network bytes (4 used for AF_INET), host bits cleared */
} rt_iprange_range;

struct rt_iprange_list {
    size_t n;
    rt_iprange_range r[];
};

/* Clear every bit of addr past `prefix` (addr has `bytes` bytes). */
static void mask_bits(uint8_t *addr, size_t bytes, int prefix)
{
    for (size_t i = 0; i < bytes; i++) {
        int keep = prefix - (int)i * 8;
        if (keep >= 8) continue;
        addr[i] &= keep <= 0 ? 0 : (uint8_t)(0xff << (8 - keep));
    }
}

static bool prefix_matches(const uint8_t *net, const uint8_t *addr, int prefix)
{
    int full = prefix / 8, rest = prefix % 8;
    if (memcmp(net, addr, (size_t)full) != 0) return false;
    if (rest == 0) return true;
    uint8_t mask = (uint8_t)(0xff << (8 - rest));
    return (net[full] & mask) == (addr[full] & mask);
}

/* One entry of a list: "addr" or "addr/prefix". false with err set when malformed. */
static bool parse_one(const char *text, rt_iprange_range *out, char *err, size_t errlen)
{
    size_t len = strlen(text);
    if (len == 0 || len >= RT_IPRANGE_ENTRY_MAX_BYTES) {
        snprintf(err, errlen, "\"%.*s\" is not an IP range (expected e.g. 10.0.0.0/8 or fc00::/7)",
                 RT_IPRANGE_ENTRY_MAX_BYTES, text);
        return false;
    }
    char addr[RT_IPRANGE_ENTRY_MAX_BYTES];
    memcpy(addr, text, len + 1);
    char *slash = strchr(addr, '/');
    int prefix = -1;
    if (slash) {
        *slash = '\0';
        const char *p = slash + 1;
        /* Digits only, at most three, no sign, no spaces: strtol would accept too much. */
        size_t nd = strspn(p, "0123456789");
        if (nd == 0 || nd > 3 || p[nd] != '\0') {
            snprintf(err, errlen, "\"%s\": the prefix length after '/' must be a number", text);
            return false;
        }
        prefix = atoi(p);
    }
    memset(out, 0, sizeof(*out));
    if (inet_pton(AF_INET, addr, out->net) == 1) {
        out->family = AF_INET;
        if (prefix < 0) prefix = RT_IPRANGE_V4_BITS;
        if (prefix > RT_IPRANGE_V4_BITS) {
            snprintf(err, errlen, "\"%s\": an IPv4 prefix is at most /%d", text,
                     RT_IPRANGE_V4_BITS);
            return false;
        }
    } else if (inet_pton(AF_INET6, addr, out->net) == 1) {
        out->family = AF_INET6;
        if (prefix < 0) prefix = RT_IPRANGE_V6_BITS;
        if (prefix > RT_IPRANGE_V6_BITS) {
            snprintf(err, errlen, "\"%s\": an IPv6 prefix is at most /%d", text,
                     RT_IPRANGE_V6_BITS);
            return false;
        }
    } else {
        snprintf(err, errlen, "\"%s\" is not an IP range (expected e.g. 10.0.0.0/8 or fc00::/7)",
                 text);
        return false;
    }
    out->prefix = prefix;
    mask_bits(out->net, out->family == AF_INET ? 4 : 16, prefix);
    return true;
}

rt_iprange_list *rt_iprange_parse(const char *const *cidrs, size_t n, char *err,
                                    size_t errlen)
{
    if (n > RT_IPRANGE_MAX_ENTRIES) {
        snprintf(err, errlen, "%zu IP ranges: at most %d are accepted", n,
                 RT_IPRANGE_MAX_ENTRIES);
        return NULL;
    }
    rt_iprange_list *l = calloc(1, sizeof(*l) + n * sizeof(rt_iprange_range));
    if (!l) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        if (!cidrs[i] || !parse_one(cidrs[i], &l->r[i], err, errlen)) {
            if (!cidrs[i]) snprintf(err, errlen, "IP range %zu is missing", i);
            free(l);
            return NULL;
        }
    }
    l->n = n;
    return l;
}

void rt_iprange_free(rt_iprange_list *l)
{
    free(l);
}

/* The normalisation of the file's essay: an IPv4 or IPv4-mapped address becomes v4 (4
 * bytes) and v4mapped (its ::ffff: form); any other IPv6 address stays v6. false for a
 * family that is not IP. */
typedef struct norm_addr {
    bool is_v4;
    uint8_t v4[4];
    uint8_t v6[16]; /* for is_v4: the mapped form */
} norm_addr;

static bool normalise(const struct sockaddr *sa, norm_addr *out)
{
    memset(out, 0, sizeof(*out));
    if (!sa) return false;
    /* Read through memcpy: the caller's object is a sockaddr_in, _in6 or _storage, and
     * reading it as another struct type would break the aliasing rules (and does at -O2). */
    const char *raw = (const char *)sa;
    sa_family_t family;
    memcpy(&family, raw + offsetof(struct sockaddr, sa_family), sizeof(family));
    if (family == AF_INET) {
        memcpy(out->v4, raw + offsetof(struct sockaddr_in, sin_addr), 4);
    } else if (family == AF_INET6) {
        struct in6_addr a6;
        memcpy(&a6, raw + offsetof(struct sockaddr_in6, sin6_addr), sizeof(a6));
        memcpy(out->v6, &a6, 16);
        if (!IN6_IS_ADDR_V4MAPPED(&a6)) return true;
        memcpy(out->v4, out->v6 + 12, 4);
    } else {
        return false;
    }
    out->is_v4 = true;
    memset(out->v6, 0, 10);
    out->v6[10] = out->v6[11] = 0xff;
    memcpy(out->v6 + 12, out->v4, 4);
    return true;
}

static bool list_contains(const rt_iprange_list *l, const norm_addr *a)
{
    if (!l) return false;
    for (size_t i = 0; i < l->n; i++) {
        const rt_iprange_range *r = &l->r[i];
        if (r->family == AF_INET ? a->is_v4 && prefix_matches(r->net, a->v4, r->prefix)
                                 : prefix_matches(r->net, a->v6, r->prefix))
            return true;
    }
    return false;
}

bool rt_iprange_contains(const rt_iprange_list *l, const struct sockaddr *sa)
{
    norm_addr a;
    return normalise(sa, &a) && list_contains(l, &a);
}

bool rt_iprange_contains_str(const rt_iprange_list *l, const char *ip)
{
    union {
        struct sockaddr sa;
        struct sockaddr_in in;
        struct sockaddr_in6 in6;
    } u;
    memset(&u, 0, sizeof(u));
    if (ip && inet_pton(AF_INET, ip, &u.in.sin_addr) == 1) u.in.sin_family = AF_INET;
    else if (ip && inet_pton(AF_INET6, ip, &u.in6.sin6_addr) == 1) u.in6.sin6_family = AF_INET6;
    else return false;
    return rt_iprange_contains(l, &u.sa);
}

/* A socket of any family other than IP is refused: the client has no business with it. */
bool rt_iprange_allowed(const rt_iprange_list *black, const rt_iprange_list *white,
                         const struct sockaddr *sa)
{
    norm_addr a;
    if (!normalise(sa, &a)) return false;
    return !list_contains(black, &a) || list_contains(white, &a);
}
