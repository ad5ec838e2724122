/*
 * core/client/sync/ssync_cache.c - the process's kept first results of joined rooms (the
 * store; what is kept and when it is still right: ssync_hits.c).
 *
 * Decisions owned here:
 *   - Bounded by bytes (sliding_sync.cache_mb): the budget is split into sets of about
 *     SSYNC_CACHE_SET_BYTES, each of SSYNC_CACHE_WAYS slots; a hash of the key picks the
 *     set, and a new entry pushes out the set's least recently read ones until it fits in
 *     the set's share (an entry larger than a share is not kept). What is counted is the
 *     key's and the text's bytes; the slots themselves are a fixed array made at start.
 *     Set-associative, so no chain grows: keys name users and rooms others choose, and
 *     keys aimed at one set only push each other out of it (the runtime's unkeyed hash is
 *     enough, as for events_pdus.c).
 *   - Kept as text: a hit copies the text out under the lock and parses it outside, so no
 *     JSON value is shared between threads, and the bytes counted are the bytes held.
 *   - An entry is right only at its stamp: a lookup with another stamp removes it.
 *   - The process's store lives as long as the process (made once by ssync_init; reachable,
 *     so not a leak).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/sync/ssync.h"

typedef struct cache_slot {
    char *key; /* NULL: empty; key and text in one allocation */
    const char *text;
    size_t bytes;
    ssync_stamp stamp;
    uint64_t used; /* the store's clock when last read or written */
} cache_slot;

struct ssync_cache {
    pthread_mutex_t mu;
    cache_slot *slots;
    size_t n_sets, set_bytes, bytes, entries;
    uint64_t clock;
    rt_metric *m_hits, *m_misses, *m_bytes, *m_entries, *m_evicted;
};

static ssync_cache *g_cache;

ssync_cache *ssync_cache_global(void) { return __atomic_load_n(&g_cache, __ATOMIC_ACQUIRE); }

void ssync_cache_set_global(ssync_cache *c) { __atomic_store_n(&g_cache, c, __ATOMIC_RELEASE); }

ssync_cache *ssync_cache_new(rt_metrics *metrics, size_t budget)
{
    if (budget < SSYNC_CACHE_SET_BYTES) return NULL;
    ssync_cache *c = calloc(1, sizeof(*c));
    size_t sets = budget / SSYNC_CACHE_SET_BYTES;
    if (!c || !(c->slots = calloc(sets * SSYNC_CACHE_WAYS, sizeof(*c->slots)))) {
        free(c);
        return NULL;
    }
    pthread_mutex_init(&c->mu, NULL);
    c->n_sets = sets;
    c->set_bytes = budget / sets;
    c->m_hits = rt_metric_counter(metrics, "atrium_sliding_sync_cache_hits_total", NULL,
                                  "Joined rooms of a sliding-sync answer sent as kept from an "
                                  "earlier answer (nothing of theirs changed since)");
    c->m_misses = rt_metric_counter(metrics, "atrium_sliding_sync_cache_misses_total", NULL,
                                    "Joined rooms a sliding-sync answer could have taken kept "
                                    "but read (none kept, or kept before a change)");
    c->m_evicted = rt_metric_counter(metrics, "atrium_sliding_sync_cache_evicted_total", NULL,
                                     "Kept room results pushed out to make room (the bound: "
                                     "sliding_sync.cache_mb)");
    c->m_bytes = rt_metric_gauge(metrics, "atrium_sliding_sync_cache_bytes", NULL,
                                 "Bytes of kept room results (keys and JSON text), at most "
                                 "sliding_sync.cache_mb");
    c->m_entries = rt_metric_gauge(metrics, "atrium_sliding_sync_cache_entries", NULL,
                                   "Kept room results");
    return c;
}

void ssync_cache_free(ssync_cache *c)
{
    if (!c) return;
    for (size_t i = 0; i < c->n_sets * SSYNC_CACHE_WAYS; i++) free(c->slots[i].key);
    free(c->slots);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static cache_slot *set_of(const ssync_cache *c, const char *key)
{
    return &c->slots[(size_t)(rt_text_hash(key) % c->n_sets) * SSYNC_CACHE_WAYS];
}

/* Empty a slot. Under the lock. */
static void drop(ssync_cache *c, cache_slot *s)
{
    c->bytes -= s->bytes;
    c->entries--;
    free(s->key);
    *s = (cache_slot){0};
}

static void publish(ssync_cache *c)
{
    rt_metric_set(c->m_bytes, (int64_t)c->bytes);
    rt_metric_set(c->m_entries, (int64_t)c->entries);
}

char *ssync_cache_get(ssync_cache *c, const char *key, const ssync_stamp *stamp)
{
    if (!c) return NULL;
    cache_slot *set = set_of(c, key);
    char *out = NULL;
    pthread_mutex_lock(&c->mu);
    for (int w = 0; w < SSYNC_CACHE_WAYS; w++) {
        cache_slot *s = &set[w];
        if (!s->key || strcmp(s->key, key) != 0) continue;
        if (memcmp(&s->stamp, stamp, sizeof(*stamp)) != 0) {
            drop(c, s); /* written before a change: never right again */
            publish(c);
        } else if ((out = strdup(s->text))) {
            s->used = ++c->clock;
        }
        break;
    }
    pthread_mutex_unlock(&c->mu);
    rt_metric_add(out ? c->m_hits : c->m_misses, 1);
    return out;
}

void ssync_cache_put(ssync_cache *c, const char *key, const ssync_stamp *stamp, const char *text)
{
    if (!c) return;
    size_t klen = strlen(key) + 1, tlen = strlen(text) + 1, bytes = klen + tlen;
    if (bytes > c->set_bytes) return;
    char *mem = malloc(bytes);
    if (!mem) return;
    memcpy(mem, key, klen);
    memcpy(mem + klen, text, tlen);
    cache_slot *set = set_of(c, key);
    int evicted = 0;
    pthread_mutex_lock(&c->mu);
    size_t used = 0;
    for (int w = 0; w < SSYNC_CACHE_WAYS; w++) {
        if (set[w].key && strcmp(set[w].key, key) == 0) drop(c, &set[w]); /* replaced */
        used += set[w].bytes;
    }
    cache_slot *free_slot = NULL;
    for (;;) {
        cache_slot *oldest = NULL;
        free_slot = NULL;
        for (int w = 0; w < SSYNC_CACHE_WAYS; w++) {
            if (!set[w].key) free_slot = free_slot ? free_slot : &set[w];
            else if (!oldest || set[w].used < oldest->used) oldest = &set[w];
        }
        if (free_slot && used + bytes <= c->set_bytes) break;
        used -= oldest->bytes; /* a set over its share or full has a kept entry */
        drop(c, oldest);
        evicted++;
    }
    *free_slot = (cache_slot){mem, mem + klen, bytes, *stamp, ++c->clock};
    c->bytes += bytes;
    c->entries++;
    publish(c);
    pthread_mutex_unlock(&c->mu);
    rt_metric_add(c->m_evicted, evicted);
}

size_t ssync_cache_bytes(ssync_cache *c)
{
    if (!c) return 0;
    pthread_mutex_lock(&c->mu);
    size_t b = c->bytes;
    pthread_mutex_unlock(&c->mu);
    return b;
}
