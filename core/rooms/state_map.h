/*
 * core/rooms/state_map.h - a room state as data: a map from (event type, state key) to the
 * event ID that holds that key, and the string-pair index it is built on.
 *
 * State resolution (state_res.h) takes its input states and returns its result in this
 * form; a caller builds one from SQL rows (one state_map_set per row) and reads the result
 * back by lookup or by walking its entries. Keys come from other servers' events, so the
 * index hashes with SipHash under a random key per map: nobody can aim many keys at one
 * slot. Entries are never removed; setting a key that is present replaces its event ID in
 * place, so an entry's position (its index for state_map_entry) never changes. Not
 * thread-safe: a map belongs to one thread at a time. Internal prefixes: state_map_,
 * state_index_.
 */
#ifndef ATRIUM_CORE_STATE_MAP_H
#define ATRIUM_CORE_STATE_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Entries a map or index holds at most (its slot numbers are 32-bit). */
#define STATE_INDEX_MAX_ENTRIES ((size_t)1 << 30)

/* ---- the index: (a, b) string pairs to a caller's number ----------------------------- */

typedef struct state_index_slot state_index_slot;

typedef struct state_index {
    state_index_slot *slots;
    size_t cap;   /* slot count, a power of two (0 before the first insert) */
    size_t count; /* pairs held */
    unsigned char key_a[16], key_b[16]; /* SipHash keys of the two strings */
} state_index;

/* An empty index (allocates nothing yet). */
void state_index_init(state_index *ix);
/* Free the slots and the key copies the index owns. */
void state_index_destroy(state_index *ix);
/* The number stored for (a, b): true and *value, or false when absent. */
bool state_index_find(const state_index *ix, const char *a, const char *b, uint32_t *value);
/* Add (a, b) -> value; the pair must be absent. The index keeps its own copies of a and b;
 * *a_copy / *b_copy (either may be NULL) get them, valid until state_index_destroy.
 * 0, or -1 on out-of-memory or when STATE_INDEX_MAX_ENTRIES are held. */
int state_index_add(state_index *ix, const char *a, const char *b, uint32_t value,
                    const char **a_copy, const char **b_copy);

/* ---- the state map -------------------------------------------------------------------- */

typedef struct state_map state_map;

/* An empty map, or NULL on out-of-memory. Free with state_map_free. */
state_map *state_map_new(void);
/* Free m and every string it holds. NULL is a no-op. */
void state_map_free(state_map *m);
/* A new map with m's entries, in m's order; NULL on out-of-memory. */
state_map *state_map_copy(const state_map *m);
/* Set (type, state_key) to event_id (all three copied), replacing the event ID when the key
 * is present. 0, or -1 on out-of-memory or when the map is full. */
int state_map_set(state_map *m, const char *type, const char *state_key, const char *event_id);
/* The event ID at (type, state_key), or NULL. Borrowed: valid until that key is set again
 * or the map is freed. */
const char *state_map_get(const state_map *m, const char *type, const char *state_key);
/* How many keys m holds. */
size_t state_map_count(const state_map *m);
/* Entry i (0 <= i < state_map_count), in the order keys were first set: true and the three
 * strings (borrowed, as for state_map_get; any pointer may be NULL), or false when i is out
 * of range. */
bool state_map_entry(const state_map *m, size_t i, const char **type, const char **state_key,
                     const char **event_id);

#endif
