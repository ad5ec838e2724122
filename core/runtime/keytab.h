/*
 * core/runtime/keytab.h - the client-key hash table shared by budget, line and rate limiter.
 *
 * Internal to core/runtime (not part of runtime.h). An intrusive chained table: the caller
 * embeds an rt_keyent in its own record, owns the record and the key string, and links it
 * in and out; the table owns only its bucket array. Keys are client keys, which clients
 * choose (user IDs, addresses), so the hash is SipHash-2-4 with a per-table random key: no
 * one can aim many keys at one chain. Not thread-safe: each user holds its own lock. The
 * bucket array is sized once from the bound its user enforces (the table never grows).
 */
#ifndef ATRIUM_CORE_RUNTIME_KEYTAB_H
#define ATRIUM_CORE_RUNTIME_KEYTAB_H

#include <stddef.h>
#include <stdint.h>

typedef struct rt_keyent {
    struct rt_keyent *chain;
    uint64_t hash;
    const char *key; /* owned by the record that embeds this entry */
} rt_keyent;

typedef struct rt_keytab {
    rt_keyent **buckets;
    size_t mask; /* bucket count - 1 */
    size_t count;
    uint64_t k0, k1; /* SipHash key */
} rt_keytab;

/* Size the table for about `expected` keys. 0, or ATRIUM_E_NOMEM. */
int rt_keytab_init(rt_keytab *t, size_t expected);
/* Free the bucket array; the caller has unlinked and freed its records. */
void rt_keytab_destroy(rt_keytab *t);
uint64_t rt_keytab_hash(const rt_keytab *t, const char *key);
/* The entry for key (hash from rt_keytab_hash), or NULL. */
rt_keyent *rt_keytab_find(const rt_keytab *t, const char *key, uint64_t hash);
/* Link e (e->key and e->hash set; key not present). */
void rt_keytab_insert(rt_keytab *t, rt_keyent *e);
/* Unlink e, which must be linked. */
void rt_keytab_remove(rt_keytab *t, rt_keyent *e);
/* Unlink and return any entry, NULL when empty: for freeing everything. */
rt_keyent *rt_keytab_pop_any(rt_keytab *t);

#endif
