/*
 * core/federation/transport/fed_resolve_cache.c - the resolver's bounded caches: a key table for
 * look-up and a list in insertion order, so a full cache drops its oldest entry in O(1).
 *
 * Expired entries are kept until they are replaced or evicted: a stale DNS answer serves
 * when the DNS servers fail, and an expired .well-known entry remembers how many fetches
 * in a row failed. Used only on the resolver's thread, hence no lock. What is cached for
 * how long is the caller's business (fed_resolve_steps.c).
 */
#include <stdlib.h>
#include <string.h>

#include "core/federation/transport/fed_resolve_internal.h"

int fed_resolve_cache_init(fed_resolve_cache *c, size_t cap, rt_metrics *m, const char *label)
{
    memset(c, 0, sizeof *c);
    c->cap = cap;
    char l[RT_METRIC_LABELS_MAX_BYTES];
    rt_metric_label(l, sizeof l, "cache", label);
    c->m_hits = rt_metric_counter(m, "atrium_federation_discovery_cache_hits_total", l,
                                  "Discovery answers taken from a cache");
    c->m_misses = rt_metric_counter(m, "atrium_federation_discovery_cache_misses_total", l,
                                    "Discovery answers not cached (or expired)");
    c->m_size = rt_metric_gauge(m, "atrium_federation_discovery_cached_names", l,
                                "Names held in a discovery cache");
    return rt_keytab_init(&c->tab, cap);
}

static void cache_unlink(fed_resolve_cache *c, fed_resolve_cache_ent *e)
{
    if (e->older)
        e->older->newer = e->newer;
    else
        c->oldest = e->newer;
    if (e->newer)
        e->newer->older = e->older;
    else
        c->newest = e->older;
    e->older = e->newer = NULL;
}

static void cache_link_newest(fed_resolve_cache *c, fed_resolve_cache_ent *e)
{
    e->older = c->newest;
    e->newer = NULL;
    if (c->newest)
        c->newest->newer = e;
    else
        c->oldest = e;
    c->newest = e;
}

static void cache_drop(fed_resolve_cache *c, fed_resolve_cache_ent *e)
{
    rt_keytab_remove(&c->tab, &e->ent);
    cache_unlink(c, e);
    free(e->val);
    free(e);
    c->n--;
}

fed_resolve_cache_ent *fed_resolve_cache_find(fed_resolve_cache *c, const char *key)
{
    rt_keyent *k = rt_keytab_find(&c->tab, key, rt_keytab_hash(&c->tab, key));
    return (fed_resolve_cache_ent *)k;
}

void *fed_resolve_cache_get(fed_resolve_cache *c, const char *key, int64_t now)
{
    fed_resolve_cache_ent *e = fed_resolve_cache_find(c, key);
    if (e && now < e->expires_ms) {
        rt_metric_add(c->m_hits, 1);
        return e->val;
    }
    rt_metric_add(c->m_misses, 1);
    return NULL;
}

void fed_resolve_cache_put(fed_resolve_cache *c, const char *key, void *val, int64_t expires_ms)
{
    fed_resolve_cache_ent *e = fed_resolve_cache_find(c, key);
    if (e) {
        free(e->val);
        e->val = val;
        e->expires_ms = expires_ms;
        cache_unlink(c, e);
        cache_link_newest(c, e);
        return;
    }
    size_t klen = strlen(key);
    e = calloc(1, sizeof *e + klen + 1);
    if (!e) {
        free(val);
        return; /* not cached: the next look-up asks again */
    }
    if (c->n >= c->cap)
        cache_drop(c, c->oldest);
    memcpy(e->key, key, klen + 1);
    e->ent.key = e->key;
    e->ent.hash = rt_keytab_hash(&c->tab, e->key);
    e->val = val;
    e->expires_ms = expires_ms;
    rt_keytab_insert(&c->tab, &e->ent);
    cache_link_newest(c, e);
    c->n++;
    rt_metric_set(c->m_size, (int64_t)c->n);
}

void fed_resolve_cache_destroy(fed_resolve_cache *c)
{
    while (c->oldest)
        cache_drop(c, c->oldest);
    rt_keytab_destroy(&c->tab);
}
