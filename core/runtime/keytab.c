/*
 * core/runtime/keytab.c - the client-key hash table (see keytab.h).
 *
 * Owns one decision: how client keys are hashed. SipHash-2-4 keyed per table from
 * getrandom(2) keeps chains short even when clients pick their keys to collide. The table
 * is sized once (a power of two up to RT_KEYTAB_MAX_BUCKETS) from the bound its user
 * enforces - a budget's global cap, a line's waiting limit, a rate limiter's max_keys -
 * so it never rehashes under a lock. It does not allocate records or copy keys. Also the
 * runtime's unkeyed text hash (rt_text_hash), for keys no client picks.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "core/runtime/keytab.h"
#include "core/runtime/runtime.h"

#define RT_KEYTAB_MIN_BUCKETS 16
#define RT_KEYTAB_MAX_BUCKETS (1u << 18)

int rt_keytab_init(rt_keytab *t, size_t expected)
{
    size_t n = RT_KEYTAB_MIN_BUCKETS;
    while (n < expected && n < RT_KEYTAB_MAX_BUCKETS)
        n <<= 1;
    memset(t, 0, sizeof(*t));
    t->buckets = calloc(n, sizeof(rt_keyent *));
    if (t->buckets == NULL)
        return ATRIUM_E_NOMEM;
    t->mask = n - 1;
    uint64_t seed[2];
    if (getrandom(seed, sizeof(seed), 0) != (ssize_t)sizeof(seed)) {
        /* No entropy yet (very early boot): a weaker key still spreads ordinary keys. */
        seed[0] = (uint64_t)(uintptr_t)t ^ (uint64_t)rt_wall_ms();
        seed[1] = (uint64_t)rt_now_ms() * 0x9e3779b97f4a7c15ull;
    }
    t->k0 = seed[0];
    t->k1 = seed[1];
    return 0;
}

void rt_keytab_destroy(rt_keytab *t)
{
    RT_ASSERT(t->count == 0, "key table destroyed with %zu entries linked", t->count);
    free(t->buckets);
    t->buckets = NULL;
}

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                                        \
    do {                                                                                \
        v0 += v1; v1 = ROTL(v1, 13); v1 ^= v0; v0 = ROTL(v0, 32);                       \
        v2 += v3; v3 = ROTL(v3, 16); v3 ^= v2;                                          \
        v0 += v3; v3 = ROTL(v3, 21); v3 ^= v0;                                          \
        v2 += v1; v1 = ROTL(v1, 17); v1 ^= v2; v2 = ROTL(v2, 32);                       \
    } while (0)

static uint64_t load_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* SipHash-2-4 of the key's bytes (the reference algorithm). */
uint64_t rt_keytab_hash(const rt_keytab *t, const char *key)
{
    const unsigned char *in = (const unsigned char *)key;
    size_t len = strlen(key);
    uint64_t v0 = 0x736f6d6570736575ull ^ t->k0, v1 = 0x646f72616e646f6dull ^ t->k1;
    uint64_t v2 = 0x6c7967656e657261ull ^ t->k0, v3 = 0x7465646279746573ull ^ t->k1;
    const unsigned char *end = in + (len & ~(size_t)7);
    for (; in != end; in += 8) {
        uint64_t m = load_le64(in);
        v3 ^= m;
        SIPROUND;
        SIPROUND;
        v0 ^= m;
    }
    uint64_t b = (uint64_t)len << 56;
    for (size_t i = 0; i < (len & 7); i++)
        b |= (uint64_t)in[i] << (8 * i);
    v3 ^= b;
    SIPROUND;
    SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

rt_keyent *rt_keytab_find(const rt_keytab *t, const char *key, uint64_t hash)
{
    for (rt_keyent *e = t->buckets[hash & t->mask]; e != NULL; e = e->chain) {
        if (e->hash == hash && strcmp(e->key, key) == 0)
            return e;
    }
    return NULL;
}

void rt_keytab_insert(rt_keytab *t, rt_keyent *e)
{
    rt_keyent **slot = &t->buckets[e->hash & t->mask];
    e->chain = *slot;
    *slot = e;
    t->count++;
}

void rt_keytab_remove(rt_keytab *t, rt_keyent *e)
{
    rt_keyent **pp = &t->buckets[e->hash & t->mask];
    while (*pp != NULL && *pp != e)
        pp = &(*pp)->chain;
    RT_ASSERT(*pp == e, "key table: removing unlinked key \"%s\"", e->key);
    *pp = e->chain;
    e->chain = NULL;
    t->count--;
}

rt_keyent *rt_keytab_pop_any(rt_keytab *t)
{
    if (t->count == 0)
        return NULL;
    for (size_t i = 0; i <= t->mask; i++) {
        if (t->buckets[i] != NULL) {
            rt_keyent *e = t->buckets[i];
            rt_keytab_remove(t, e);
            return e;
        }
    }
    return NULL;
}

uint64_t rt_text_hash(const char *s)
{
    uint64_t h = UINT64_C(1469598103934665603); /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        h = (h ^ *p) * UINT64_C(1099511628211);
    return h;
}
