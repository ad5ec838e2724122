/*
 * core/rooms/state_map.c - the (type, state key) -> event ID map and its index (see
 * state_map.h).
 *
 * The index is open addressing with linear probing over a power-of-two slot array, kept
 * at most half full, each slot holding the pair's hash, the caller's number and one
 * allocation with both strings. The pair's hash combines two keyed SipHash values (one per
 * string, under different keys), so no buffer joins the strings for a lookup. The map is
 * an index from key to entry number plus an array of entries in insertion order.
 */
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "core/rooms/state_map.h"

#define STATE_INDEX_FIRST_CAP 16

struct state_index_slot {
    uint64_t hash;
    uint32_t value;
    bool used;
    char *pair; /* "a\0b\0", owned */
    size_t a_len;
};

void state_index_init(state_index *ix)
{
    memset(ix, 0, sizeof(*ix));
    if (sodium_init() < 0) abort(); /* libsodium cannot run: nothing here can be safe */
    randombytes_buf(ix->key_a, sizeof(ix->key_a));
    randombytes_buf(ix->key_b, sizeof(ix->key_b));
}

void state_index_destroy(state_index *ix)
{
    for (size_t i = 0; i < ix->cap; i++) free(ix->slots[i].pair);
    free(ix->slots);
    ix->slots = NULL;
    ix->cap = ix->count = 0;
}

static uint64_t siphash(const char *s, const unsigned char key[16])
{
    unsigned char out[crypto_shorthash_BYTES];
    crypto_shorthash(out, (const unsigned char *)s, strlen(s), key);
    uint64_t h;
    memcpy(&h, out, sizeof(h));
    return h;
}

static uint64_t pair_hash(const state_index *ix, const char *a, const char *b)
{
    uint64_t hb = siphash(b, ix->key_b);
    return siphash(a, ix->key_a) ^ ((hb << 1) | (hb >> 63));
}

static bool slot_is(const state_index_slot *s, uint64_t h, const char *a, const char *b)
{
    return s->hash == h && strcmp(s->pair, a) == 0 && strcmp(s->pair + s->a_len + 1, b) == 0;
}

/* The slot holding (a, b), or the empty slot where it would go. cap > 0. */
static state_index_slot *probe(const state_index *ix, uint64_t h, const char *a, const char *b)
{
    size_t mask = ix->cap - 1;
    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
        state_index_slot *s = &ix->slots[i];
        if (!s->used || slot_is(s, h, a, b)) return s;
    }
}

bool state_index_find(const state_index *ix, const char *a, const char *b, uint32_t *value)
{
    if (ix->cap == 0) return false;
    const state_index_slot *s = probe(ix, pair_hash(ix, a, b), a, b);
    if (!s->used) return false;
    if (value) *value = s->value;
    return true;
}

static int grow(state_index *ix)
{
    size_t cap = ix->cap ? ix->cap * 2 : STATE_INDEX_FIRST_CAP;
    state_index_slot *slots = calloc(cap, sizeof(*slots));
    if (!slots) return -1;
    state_index_slot *old = ix->slots;
    size_t old_cap = ix->cap;
    ix->slots = slots;
    ix->cap = cap;
    for (size_t i = 0; i < old_cap; i++) {
        if (!old[i].used) continue;
        size_t j = (size_t)old[i].hash & (cap - 1);
        while (slots[j].used) j = (j + 1) & (cap - 1);
        slots[j] = old[i];
    }
    free(old);
    return 0;
}

int state_index_add(state_index *ix, const char *a, const char *b, uint32_t value,
                    const char **a_copy, const char **b_copy)
{
    if (ix->count >= STATE_INDEX_MAX_ENTRIES) return -1;
    if ((ix->count + 1) * 2 > ix->cap && grow(ix) != 0) return -1;
    size_t la = strlen(a), lb = strlen(b);
    char *pair = malloc(la + lb + 2);
    if (!pair) return -1;
    memcpy(pair, a, la + 1);
    memcpy(pair + la + 1, b, lb + 1);
    uint64_t h = pair_hash(ix, a, b);
    state_index_slot *s = probe(ix, h, a, b);
    *s = (state_index_slot){.hash = h, .value = value, .used = true, .pair = pair, .a_len = la};
    ix->count++;
    if (a_copy) *a_copy = pair;
    if (b_copy) *b_copy = pair + la + 1;
    return 0;
}

/* ---- the map ------------------------------------------------------------------------ */

typedef struct state_entry {
    const char *type, *state_key; /* owned by the index */
    char *event_id;
} state_entry;

struct state_map {
    state_index index; /* (type, state_key) -> entry number */
    state_entry *entries;
    size_t count, cap;
};

state_map *state_map_new(void)
{
    state_map *m = calloc(1, sizeof(*m));
    if (m) state_index_init(&m->index);
    return m;
}

void state_map_free(state_map *m)
{
    if (!m) return;
    for (size_t i = 0; i < m->count; i++) free(m->entries[i].event_id);
    free(m->entries);
    state_index_destroy(&m->index);
    free(m);
}

state_map *state_map_copy(const state_map *m)
{
    state_map *c = state_map_new();
    for (size_t i = 0; c && i < m->count; i++) {
        const state_entry *e = &m->entries[i];
        if (state_map_set(c, e->type, e->state_key, e->event_id) != 0) {
            state_map_free(c);
            c = NULL;
        }
    }
    return c;
}

int state_map_set(state_map *m, const char *type, const char *state_key, const char *event_id)
{
    char *id = strdup(event_id);
    if (!id) return -1;
    uint32_t at;
    if (state_index_find(&m->index, type, state_key, &at)) {
        free(m->entries[at].event_id);
        m->entries[at].event_id = id;
        return 0;
    }
    if (m->count == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : STATE_INDEX_FIRST_CAP;
        state_entry *grown = realloc(m->entries, cap * sizeof(*grown));
        if (!grown) goto fail;
        m->entries = grown;
        m->cap = cap;
    }
    state_entry *e = &m->entries[m->count];
    if (state_index_add(&m->index, type, state_key, (uint32_t)m->count, &e->type,
                        &e->state_key) != 0)
        goto fail;
    e->event_id = id;
    m->count++;
    return 0;
fail:
    free(id);
    return -1;
}

const char *state_map_get(const state_map *m, const char *type, const char *state_key)
{
    uint32_t at;
    if (!type || !state_key || !state_index_find(&m->index, type, state_key, &at)) return NULL;
    return m->entries[at].event_id;
}

size_t state_map_count(const state_map *m)
{
    return m->count;
}

bool state_map_entry(const state_map *m, size_t i, const char **type, const char **state_key,
                     const char **event_id)
{
    if (i >= m->count) return false;
    if (type) *type = m->entries[i].type;
    if (state_key) *state_key = m->entries[i].state_key;
    if (event_id) *event_id = m->entries[i].event_id;
    return true;
}
