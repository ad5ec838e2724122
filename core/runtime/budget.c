/*
 * core/runtime/budget.c - in-flight counters with a global cap and a per-client cap.
 *
 * Owns the budget rule (and so the outbound budget, docs/adr/0079-outbound-budget.md, and the
 * media fetch budget to come, which are budgets with particular caps): a slot is taken at once
 * or refused at once, never waited for. The per-key table holds only keys with something in
 * flight; a key's record is freed when its count returns to 0, so the table is bounded by the
 * global cap whatever the number of clients. A per_key_cap of 0 means only the global cap
 * applies. Deliberately not here: waiting for a slot (that is the admission line) and holding
 * the slot until the response is sent (core/http's holds call rt_budget_release).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime/keytab.h"
#include "core/runtime/runtime.h"

typedef struct rt_budget_key {
    rt_keyent ent; /* first: the table hands back &ent */
    int count;
    char key[];
} rt_budget_key;

struct rt_budget {
    char *name;
    int global_cap, per_key_cap;
    pthread_mutex_t lock;
    int in_use;
    rt_keytab keys;
    rt_metric *m_in_use, *m_limit, *m_refused;
};

rt_budget *rt_budget_new(const char *name, int global_cap, int per_key_cap, rt_metrics *metrics)
{
    RT_ASSERT(name != NULL, "rt_budget_new: NULL name");
    if (global_cap < 1 || per_key_cap < 0) {
        rt_log(ATRIUM_LOG_ERROR, "core",
               "budget %s: global cap %d must be >= 1 and per-client cap %d >= 0; fix the "
               "configuration",
               name, global_cap, per_key_cap);
        return NULL;
    }
    rt_budget *b = calloc(1, sizeof(*b));
    if (b == NULL)
        return NULL;
    b->name = strdup(name);
    if (b->name == NULL || rt_keytab_init(&b->keys, (size_t)global_cap) != 0) {
        free(b->name);
        free(b);
        return NULL;
    }
    if (pthread_mutex_init(&b->lock, NULL) != 0) {
        rt_keytab_destroy(&b->keys);
        free(b->name);
        free(b);
        return NULL;
    }
    b->global_cap = global_cap;
    b->per_key_cap = per_key_cap;

    char labels[RT_METRIC_LABELS_MAX_BYTES];
    if (rt_metric_label(labels, sizeof(labels), "budget", name) < 0)
        labels[0] = '\0';
    b->m_in_use = rt_metric_gauge(metrics, "atrium_budget_in_use", labels,
                                  "Slots of the budget in flight now.");
    b->m_limit = rt_metric_gauge(metrics, "atrium_budget_limit", labels,
                                 "Global cap of the budget.");
    b->m_refused = rt_metric_counter(metrics, "atrium_budget_refused_total", labels,
                                     "Acquisitions refused by the global or per-client cap.");
    rt_metric_set(b->m_in_use, 0);
    rt_metric_set(b->m_limit, global_cap);
    return b;
}

static rt_budget_key *find_locked(rt_budget *b, const char *key, uint64_t hash)
{
    rt_keyent *e = rt_keytab_find(&b->keys, key, hash);
    return (rt_budget_key *)e; /* ent is the first member */
}

/* The budget rule: per-client cap first (it names the client that is over), then the
 * global cap. Caller holds b->lock. Returns 0 or the cap that refuses ('k' or 'g'). */
static char refusing_cap_locked(const rt_budget *b, const rt_budget_key *k)
{
    if (b->per_key_cap > 0 && k != NULL && k->count >= b->per_key_cap)
        return 'k';
    if (b->in_use >= b->global_cap)
        return 'g';
    return 0;
}

int rt_budget_try_acquire(rt_budget *b, const char *key, char *which)
{
    RT_ASSERT(key != NULL, "budget %s: NULL client key", b->name);
    uint64_t hash = rt_keytab_hash(&b->keys, key);
    int rc = 0;
    pthread_mutex_lock(&b->lock);
    rt_budget_key *k = find_locked(b, key, hash);
    char cap = refusing_cap_locked(b, k);
    if (cap != 0) {
        if (which != NULL)
            *which = cap;
        rt_metric_add(b->m_refused, 1);
        rc = ATRIUM_E_LIMIT;
        goto out;
    }
    if (k == NULL) {
        size_t len = strlen(key);
        k = calloc(1, sizeof(*k) + len + 1);
        if (k == NULL) {
            rc = ATRIUM_E_NOMEM;
            goto out;
        }
        memcpy(k->key, key, len + 1);
        k->ent.key = k->key;
        k->ent.hash = hash;
        rt_keytab_insert(&b->keys, &k->ent);
    }
    k->count++;
    b->in_use++;
    rt_metric_set(b->m_in_use, b->in_use);
out:
    pthread_mutex_unlock(&b->lock);
    return rc;
}

void rt_budget_release(rt_budget *b, const char *key)
{
    RT_ASSERT(key != NULL, "budget %s: NULL client key", b->name);
    uint64_t hash = rt_keytab_hash(&b->keys, key);
    pthread_mutex_lock(&b->lock);
    rt_budget_key *k = find_locked(b, key, hash);
    RT_ASSERT(k != NULL && k->count > 0, "budget %s: release by \"%s\", which holds no slot",
              b->name, key);
    k->count--;
    b->in_use--;
    if (k->count == 0) {
        rt_keytab_remove(&b->keys, &k->ent);
        free(k);
    }
    rt_metric_set(b->m_in_use, b->in_use);
    pthread_mutex_unlock(&b->lock);
}

int rt_budget_in_use(rt_budget *b)
{
    pthread_mutex_lock(&b->lock);
    int n = b->in_use;
    pthread_mutex_unlock(&b->lock);
    return n;
}

int rt_budget_in_use_key(rt_budget *b, const char *key)
{
    uint64_t hash = rt_keytab_hash(&b->keys, key);
    pthread_mutex_lock(&b->lock);
    rt_budget_key *k = find_locked(b, key, hash);
    int n = k != NULL ? k->count : 0;
    pthread_mutex_unlock(&b->lock);
    return n;
}

int rt_budget_keys(rt_budget *b)
{
    pthread_mutex_lock(&b->lock);
    int n = (int)b->keys.count;
    pthread_mutex_unlock(&b->lock);
    return n;
}

void rt_budget_free(rt_budget *b)
{
    if (b == NULL)
        return;
    if (b->in_use != 0)
        rt_log(ATRIUM_LOG_WARN, "core", "budget %s freed with %d slot(s) still in flight",
               b->name, b->in_use);
    rt_keyent *e;
    while ((e = rt_keytab_pop_any(&b->keys)) != NULL)
        free(e);
    rt_keytab_destroy(&b->keys);
    pthread_mutex_destroy(&b->lock);
    free(b->name);
    free(b);
}
