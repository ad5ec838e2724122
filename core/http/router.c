/*
 * core/http/router.c - method + path templates -> handlers.
 *
 * Routes are registered during start-up only (the core's own and each plugin's, during
 * init) and never change while serving, so matching takes no lock. A template is split
 * into segments: literal text or a {name} parameter. The request path is split on "/"
 * while still percent-encoded and each segment decoded afterwards, so "%2F" inside a room
 * alias never creates a new segment. When several templates match, the one with more
 * literal segments wins (/rooms/{id}/members beats /rooms/{id}/{type}). The router
 * knows nothing of 404/405 answers: it reports "no match" and "wrong method".
 *
 * Matching runs on every request, so it looks only at the templates with as many segments
 * as the path (an index by segment count, kept in registration order) and compares a hash
 * of each literal segment before its text: a request costs one hash per path segment and
 * a few integer comparisons per candidate, not a string comparison per template.
 *
 * Legacy prefixes are one rule here, router_r0_twin: a route registered under
 * /_matrix/client/v3/ or /_matrix/media/v3/ is also served, by the same handler, under the
 * r0 prefix its endpoint had in spec r0.6.1 (clients such as matrix-nio still use it), unless
 * the endpoint is newer than r0 (R0_ABSENT). Whoever registers a v3 route, core or plugin,
 * gets the twin; nobody registers r0 paths by hand.
 */
#include <stdlib.h>
#include <string.h>

#include "core/http/http.h"

#define ROUTER_MAX_SEGMENTS 32
#define ROUTER_MAX_PATH_BYTES 512

/* Versioned prefixes whose endpoints r0.6.1 also had under r0. */
static const struct {
    const char *v3, *r0;
} R0_PREFIXES[] = {
    {"/_matrix/client/v3/", "/_matrix/client/r0/"},
    {"/_matrix/media/v3/", "/_matrix/media/r0/"},
};

/* v3 endpoints that did not exist in r0.6.1 (added in v1.1 and later), as registered. */
static const char *const R0_ABSENT[] = {
    "/_matrix/client/v3/keys/device_signing/upload", /* cross-signing, v1.1 */
    "/_matrix/client/v3/keys/signatures/upload",     /* cross-signing, v1.1 */
    "/_matrix/client/v3/knock/{roomIdOrAlias}",      /* v1.1 */
    "/_matrix/client/v3/rooms/{roomId}/knock",       /* v1.1 */
    "/_matrix/client/v3/refresh",                    /* v1.3 */
    "/_matrix/client/v3/login/get_token",            /* v1.7 */
    "/_matrix/media/v3/upload/{serverName}/{mediaId}", /* asynchronous upload, v1.7 */
};

struct router {
    route_entry *entries;
    size_t n, cap;
    /* by_segs[k]: indices into entries of the templates with k segments, oldest first */
    size_t *by_segs[ROUTER_MAX_SEGMENTS + 1];
    size_t n_by_segs[ROUTER_MAX_SEGMENTS + 1], cap_by_segs[ROUTER_MAX_SEGMENTS + 1];
};

/* The hash of one decoded segment; equal text gives equal hashes (the text still decides). */
static uint64_t seg_hash(const char *s)
{
    return rt_text_hash(s);
}

static void entry_free_parts(route_entry *e)
{
    for (size_t j = 0; j < e->n_segs; j++) {
        free((void *)e->segs[j]);
        free((void *)e->names[j]);
    }
    free(e->segs);
    free(e->names);
    free(e->seg_hash);
}

router *router_new(void)
{
    return calloc(1, sizeof(router));
}

void router_free(router *rt)
{
    if (!rt) return;
    for (size_t i = 0; i < rt->n; i++) {
        route_entry *e = &rt->entries[i];
        entry_free_parts(e);
        free((void *)e->owner);
        free((void *)e->path);
    }
    for (size_t k = 0; k <= ROUTER_MAX_SEGMENTS; k++) free(rt->by_segs[k]);
    free(rt->entries);
    free(rt);
}

static bool same_method(const char *a, const char *b)
{
    return strcmp(a, b) == 0;
}

static bool parse_template(route_entry *e, const char *path, char *err, size_t errlen)
{
    if (path[0] != '/') {
        snprintf(err, errlen, "route path \"%s\" must start with /", path);
        return false;
    }
    const char *p = path + 1;
    e->segs = calloc(ROUTER_MAX_SEGMENTS, sizeof(char *));
    e->names = calloc(ROUTER_MAX_SEGMENTS, sizeof(char *));
    e->seg_hash = calloc(ROUTER_MAX_SEGMENTS, sizeof(uint64_t));
    if (!e->segs || !e->names || !e->seg_hash) return false;
    for (;;) { /* split exactly as router_match splits: "/a/" is "a" and "" */
        const char *slash = strchr(p, '/');
        size_t len = slash ? (size_t)(slash - p) : strlen(p);
        if (e->n_segs == ROUTER_MAX_SEGMENTS) {
            snprintf(err, errlen, "route path \"%s\" has too many segments", path);
            return false;
        }
        if (len >= 2 && p[0] == '{' && p[len - 1] == '}') {
            e->names[e->n_segs] = strndup(p + 1, len - 2);
            e->segs[e->n_segs] = NULL;
        } else if (memchr(p, '{', len) || memchr(p, '}', len)) {
            snprintf(err, errlen, "route path \"%s\": a parameter must be a whole segment", path);
            return false;
        } else {
            e->segs[e->n_segs] = strndup(p, len);
            if (!e->segs[e->n_segs]) return false;
            e->seg_hash[e->n_segs] = seg_hash(e->segs[e->n_segs]);
            e->literals++;
        }
        e->n_segs++;
        if (!slash) break;
        p = slash + 1;
    }
    return true;
}

/* Two templates collide when every segment pair is equal literals or both parameters. */
static bool same_shape(const route_entry *a, const route_entry *b)
{
    if (a->n_segs != b->n_segs) return false;
    for (size_t i = 0; i < a->n_segs; i++) {
        if (!a->segs[i] != !b->segs[i]) return false;
        if (a->segs[i] && strcmp(a->segs[i], b->segs[i]) != 0) return false;
    }
    return true;
}

bool router_r0_twin(const char *path, char *out, size_t outlen)
{
    for (size_t i = 0; i < sizeof(R0_ABSENT) / sizeof(R0_ABSENT[0]); i++)
        if (strcmp(path, R0_ABSENT[i]) == 0) return false;
    for (size_t i = 0; i < sizeof(R0_PREFIXES) / sizeof(R0_PREFIXES[0]); i++) {
        size_t n = strlen(R0_PREFIXES[i].v3);
        if (strncmp(path, R0_PREFIXES[i].v3, n) != 0) continue;
        int len = snprintf(out, outlen, "%s%s", R0_PREFIXES[i].r0, path + n);
        return len > 0 && (size_t)len < outlen;
    }
    return false;
}

static int add_one(router *rt, const atrium_route *route, const char *owner, char *err,
                   size_t errlen);

int router_add(router *rt, const atrium_route *route, const char *owner, char *err,
               size_t errlen)
{
    int rc = add_one(rt, route, owner, err, errlen);
    char twin[ROUTER_MAX_PATH_BYTES];
    if (rc < 0 || !router_r0_twin(route->path, twin, sizeof(twin))) return rc;
    atrium_route legacy = *route;
    legacy.path = twin; /* copied by add_one into the entry's own path */
    return add_one(rt, &legacy, owner, err, errlen);
}

int http_routes_add(http_server *s, const atrium_route *routes, size_t n, const char *component)
{
    for (size_t i = 0; i < n; i++) {
        char err[256] = "";
        int rc = router_add(s->router, &routes[i], "core", err, sizeof(err));
        if (rc < 0) {
            rt_log(ATRIUM_LOG_ERROR, component, "%s",
                   err[0] ? err : "out of memory registering a route");
            return rc;
        }
    }
    return 0;
}

static int add_one(router *rt, const atrium_route *route, const char *owner, char *err,
                   size_t errlen)
{
    if (!route || !route->method || !route->path || !route->handler) {
        snprintf(err, errlen, "route from \"%s\" lacks a method, path or handler", owner);
        return ATRIUM_E_INVAL;
    }
    route_entry e = {.route = *route};
    if (!parse_template(&e, route->path, err, errlen)) {
        entry_free_parts(&e);
        return ATRIUM_E_INVAL;
    }
    for (size_t i = 0; i < rt->n; i++) {
        if (same_method(rt->entries[i].route.method, route->method) &&
            same_shape(&rt->entries[i], &e)) {
            snprintf(err, errlen, "route %s %s from \"%s\" is already registered by \"%s\" (%s)",
                     route->method, route->path, owner, rt->entries[i].owner,
                     rt->entries[i].route.path);
            entry_free_parts(&e);
            return ATRIUM_E_EXISTS;
        }
    }
    size_t k = e.n_segs;
    if (rt->n == rt->cap || rt->n_by_segs[k] == rt->cap_by_segs[k]) {
        bool ok = true;
        if (rt->n == rt->cap) {
            size_t cap = rt->cap ? rt->cap * 2 : 32;
            route_entry *n = realloc(rt->entries, cap * sizeof(*n));
            if (n) {
                rt->entries = n;
                rt->cap = cap;
            }
            ok = n != NULL;
        }
        if (ok && rt->n_by_segs[k] == rt->cap_by_segs[k]) {
            size_t cap = rt->cap_by_segs[k] ? rt->cap_by_segs[k] * 2 : 16;
            size_t *n = realloc(rt->by_segs[k], cap * sizeof(*n));
            if (n) {
                rt->by_segs[k] = n;
                rt->cap_by_segs[k] = cap;
            }
            ok = n != NULL;
        }
        if (!ok) {
            entry_free_parts(&e);
            return ATRIUM_E_NOMEM;
        }
    }
    e.owner = strdup(owner);
    e.path = strdup(route->path);
    if (!e.owner || !e.path) {
        free((void *)e.owner);
        free((void *)e.path);
        entry_free_parts(&e);
        return ATRIUM_E_NOMEM;
    }
    e.route.path = e.path;
    rt->by_segs[k][rt->n_by_segs[k]++] = rt->n;
    rt->entries[rt->n++] = e;
    return 0;
}

const char *router_owner(const router *rt, const char *method, const char *path)
{
    route_entry probe = {0};
    char err[128];
    const char *owner = NULL;
    if (parse_template(&probe, path, err, sizeof(err))) {
        for (size_t i = 0; i < rt->n && !owner; i++)
            if (same_method(rt->entries[i].route.method, method) &&
                same_shape(&rt->entries[i], &probe))
                owner = rt->entries[i].owner;
    }
    entry_free_parts(&probe);
    return owner;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

bool http_percent_decode(char *s)
{
    char *w = s;
    for (const char *r = s; *r; r++) {
        if (*r == '%') {
            int hi = hexval(r[1]), lo = hi >= 0 ? hexval(r[2]) : -1;
            if (hi < 0 || lo < 0) return false;
            char c = (char)(hi * 16 + lo);
            if (c == '\0') return false;
            *w++ = c;
            r += 2;
        } else {
            *w++ = *r;
        }
    }
    *w = '\0';
    return true;
}

bool http_utf8_valid(const char *str)
{
    const unsigned char *s = (const unsigned char *)str;
    while (*s) {
        unsigned c = *s;
        if (c < 0x80) {
            s++;
            continue;
        }
        size_t len;
        unsigned cp, min;
        if (c >= 0xC2 && c <= 0xDF) len = 2, cp = c & 0x1F, min = 0x80;
        else if (c >= 0xE0 && c <= 0xEF) len = 3, cp = c & 0x0F, min = 0x800;
        else if (c >= 0xF0 && c <= 0xF4) len = 4, cp = c & 0x07, min = 0x10000;
        else return false; /* a continuation byte first, C0/C1 (overlong) or F5..FF */
        for (size_t i = 1; i < len; i++) {
            if ((s[i] & 0xC0) != 0x80) return false; /* also stops at the NUL */
            cp = (cp << 6) | (s[i] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        s += len;
    }
    return true;
}

bool http_decode_text(char *s)
{
    return http_percent_decode(s) && http_utf8_valid(s);
}

const route_entry *router_match(const router *rt, const char *method, const char *raw_path,
                                rt_arena *arena, const char ***names, const char ***values,
                                size_t *n, bool *wrong_method, const char **invalid)
{
    *wrong_method = false;
    *invalid = NULL;
    *n = 0;
    if (raw_path[0] != '/') return NULL;
    const char *raw_segs[ROUTER_MAX_SEGMENTS];
    size_t raw_lens[ROUTER_MAX_SEGMENTS];
    size_t n_raw = 0;
    const char *p = raw_path + 1;
    for (;;) {
        const char *slash = strchr(p, '/');
        size_t len = slash ? (size_t)(slash - p) : strlen(p);
        if (n_raw == ROUTER_MAX_SEGMENTS) return NULL;
        raw_segs[n_raw] = p;
        raw_lens[n_raw++] = len;
        if (!slash) break;
        p = slash + 1;
    }
    /* Decode each segment once. One that is not text matches no literal (every literal
     * is text) but does fill a parameter, so the route is found and the request refused
     * with 400 rather than 404. */
    char *seg[ROUTER_MAX_SEGMENTS];
    bool text[ROUTER_MAX_SEGMENTS];
    uint64_t hash[ROUTER_MAX_SEGMENTS];
    for (size_t i = 0; i < n_raw; i++) {
        seg[i] = rt_arena_strndup(arena, raw_segs[i], raw_lens[i]);
        if (!seg[i]) return NULL;
        text[i] = http_decode_text(seg[i]);
        hash[i] = text[i] ? seg_hash(seg[i]) : 0;
    }
    bool is_head = strcmp(method, "HEAD") == 0;
    const route_entry *best = NULL;
    for (size_t i = 0; i < rt->n_by_segs[n_raw]; i++) {
        const route_entry *e = &rt->entries[rt->by_segs[n_raw][i]];
        /* By the segments' hashes first, last segment first (routes of one length share
         * their prefix, /_matrix/client/v3/..., and differ towards the end), and the
         * literals' text only for a route whose hashes all match. */
        bool ok = true;
        for (size_t j = n_raw; j-- > 0 && ok;) {
            if (e->segs[j]) ok = text[j] && e->seg_hash[j] == hash[j];
            else ok = !text[j] || seg[j][0] != '\0';
        }
        for (size_t j = 0; j < n_raw && ok; j++)
            if (e->segs[j]) ok = strcmp(e->segs[j], seg[j]) == 0;
        if (!ok) continue;
        bool method_ok = strcmp(e->route.method, method) == 0 ||
                         (is_head && strcmp(e->route.method, "GET") == 0);
        if (!method_ok) {
            *wrong_method = true;
            continue;
        }
        if (!best || e->literals > best->literals) best = e;
    }
    if (!best) return NULL;
    *wrong_method = false;
    size_t np = best->n_segs - (size_t)best->literals;
    const char **nm = rt_arena_alloc(arena, (np + 1) * sizeof(char *));
    const char **vl = rt_arena_alloc(arena, (np + 1) * sizeof(char *));
    if (!nm || !vl) return NULL;
    size_t k = 0;
    for (size_t j = 0; j < best->n_segs; j++) {
        if (best->segs[j]) continue;
        nm[k] = best->names[j];
        if (!text[j] && !*invalid) *invalid = best->names[j];
        vl[k++] = seg[j];
    }
    *names = nm;
    *values = vl;
    *n = k;
    return best;
}
