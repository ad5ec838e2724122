/*
 * core/runtime/line.c - admission lines: slots plus a waiting line fair across clients.
 *
 * Owns the fairness rule of admission lines (docs/architecture.md): waiters are grouped by
 * client key, each key with its own FIFO, and the keys that have waiters form a ring. A
 * released slot goes to the head waiter of the key at the front of the ring, and that key moves
 * to the back. So a client with a hundred waiters and a client with one alternate: the second
 * is served within one turn of the first, whatever arrived before it. The slot passes directly
 * from the releaser to the waiter (in_use does not drop), so a newcomer can never overtake the
 * line. Caps: max_waiting in total (0 = no line: refuse at once when no slot is free) and
 * max_waiting_per_key (0 = only the total applies); over either, refuse at once. A line may
 * also bound holding (rt_line_limit_holding): a key holding max_holding_per_key slots waits
 * for its next one although slots are free, and a released slot skips the keys at their
 * cap, so one client can never take every slot and leave the others waiting.
 *
 * A waiter is an intrusive record the caller embeds; the line never calls out and never
 * sleeps, it only links and unlinks under its lock and hands the granted waiter back to the
 * releaser, who wakes it (core/http resumes the parked request). Deliberately not here:
 * deadlines (the caller cancels at its deadline and counts it with rt_line_count_timeout)
 * and the slot as a hold (core/http).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime/keytab.h"
#include "core/runtime/runtime.h"

/* Waiter state after a successful cancel: linked nowhere, holding nothing. */
#define RT_LINE_IDLE 0

struct rt_line_key {
    rt_keyent ent; /* first: the table hands back &ent */
    struct rt_line_key *ring_prev, *ring_next; /* NULL while the key has no waiters */
    rt_line_waiter *head, *tail; /* this key's waiters, in arrival order */
    int count;
    int holding; /* slots this key holds (counted only when holding is bounded) */
    char key[];
};
typedef struct rt_line_key rt_line_key;

struct rt_line {
    char *name;
    int slots, max_waiting, max_waiting_per_key;
    int max_holding_per_key; /* 0 = holding is not bounded per key (nor counted) */
    pthread_mutex_t lock;
    int in_use, waiting;
    rt_line_key *ring; /* the key served next; its ring_prev is served last */
    rt_keytab keys;    /* keys with waiters */
    rt_metric *m_slots, *m_in_use, *m_waiting, *m_refused, *m_timed_out;
};

rt_line *rt_line_new(const char *name, int slots, int max_waiting, int max_waiting_per_key,
                     rt_metrics *metrics)
{
    RT_ASSERT(name != NULL, "rt_line_new: NULL name");
    if (slots < 1 || max_waiting < 0 || max_waiting_per_key < 0) {
        rt_log(ATRIUM_LOG_ERROR, "core",
               "line %s: slots %d must be >= 1, waiting limits %d/%d >= 0; fix the "
               "configuration",
               name, slots, max_waiting, max_waiting_per_key);
        return NULL;
    }
    rt_line *l = calloc(1, sizeof(*l));
    if (l == NULL)
        return NULL;
    l->name = strdup(name);
    if (l->name == NULL || rt_keytab_init(&l->keys, (size_t)max_waiting + (size_t)slots) != 0) {
        free(l->name);
        free(l);
        return NULL;
    }
    if (pthread_mutex_init(&l->lock, NULL) != 0) {
        rt_keytab_destroy(&l->keys);
        free(l->name);
        free(l);
        return NULL;
    }
    l->slots = slots;
    l->max_waiting = max_waiting;
    l->max_waiting_per_key = max_waiting_per_key;

    char labels[RT_METRIC_LABELS_MAX_BYTES];
    if (rt_metric_label(labels, sizeof(labels), "line", name) < 0)
        labels[0] = '\0';
    l->m_slots = rt_metric_gauge(metrics, "atrium_line_slots", labels, "Slots of the line.");
    l->m_in_use = rt_metric_gauge(metrics, "atrium_line_in_use", labels,
                                  "Slots of the line held now.");
    l->m_waiting = rt_metric_gauge(metrics, "atrium_line_waiting", labels,
                                   "Requests waiting in the line now.");
    l->m_refused = rt_metric_counter(metrics, "atrium_line_refused_total", labels,
                                     "Requests refused because the line was full.");
    l->m_timed_out = rt_metric_counter(metrics, "atrium_line_timed_out_total", labels,
                                       "Requests that reached their deadline while waiting.");
    rt_metric_set(l->m_slots, slots);
    rt_metric_set(l->m_in_use, 0);
    rt_metric_set(l->m_waiting, 0);
    return l;
}

/* ---- the ring of keys with waiters (caller holds l->lock) ---------------------------- */

static void ring_append(rt_line *l, rt_line_key *k)
{
    if (l->ring == NULL) {
        k->ring_prev = k->ring_next = k;
        l->ring = k;
        return;
    }
    rt_line_key *last = l->ring->ring_prev;
    k->ring_prev = last;
    k->ring_next = l->ring;
    last->ring_next = k;
    l->ring->ring_prev = k;
}

static void ring_remove(rt_line *l, rt_line_key *k)
{
    if (k->ring_next == k) {
        l->ring = NULL;
    } else {
        k->ring_prev->ring_next = k->ring_next;
        k->ring_next->ring_prev = k->ring_prev;
        if (l->ring == k)
            l->ring = k->ring_next;
    }
    k->ring_prev = k->ring_next = NULL;
}

/* A key whose last waiter left: out of the ring; and, holding nothing either, out of the
 * table and freed. */
static void key_drop(rt_line *l, rt_line_key *k)
{
    RT_ASSERT(k->count == 0 && k->head == NULL, "line %s: dropping key \"%s\" with waiters",
              l->name, k->key);
    if (k->ring_next != NULL)
        ring_remove(l, k);
    if (k->holding > 0)
        return;
    rt_keytab_remove(&l->keys, &k->ent);
    free(k);
}

/* The record of key, created (linked in the table, not in the ring) when absent; NULL on
 * OOM. Caller holds l->lock. */
static rt_line_key *key_get(rt_line *l, const char *key, uint64_t hash)
{
    rt_line_key *k = (rt_line_key *)rt_keytab_find(&l->keys, key, hash);
    if (k != NULL)
        return k;
    size_t len = strlen(key);
    k = calloc(1, sizeof(*k) + len + 1);
    if (k == NULL)
        return NULL;
    memcpy(k->key, key, len + 1);
    k->ent.key = k->key;
    k->ent.hash = hash;
    rt_keytab_insert(&l->keys, &k->ent);
    return k;
}

/* The per-key holding rule: may key k take one more slot? Caller holds l->lock. */
static bool may_hold_locked(const rt_line *l, const rt_line_key *k)
{
    return l->max_holding_per_key == 0 || k == NULL || k->holding < l->max_holding_per_key;
}

void rt_line_limit_holding(rt_line *l, int max_holding_per_key)
{
    pthread_mutex_lock(&l->lock);
    RT_ASSERT(l->in_use == 0, "line %s: holding limited while in use", l->name);
    l->max_holding_per_key = max_holding_per_key > 0 ? max_holding_per_key : 0;
    pthread_mutex_unlock(&l->lock);
}

static void publish_locked(rt_line *l)
{
    rt_metric_set(l->m_in_use, l->in_use);
    rt_metric_set(l->m_waiting, l->waiting);
}

/* ---- entering, releasing, cancelling ------------------------------------------------- */

/* The line's admission rule for a newcomer that found no free slot: may it wait?
 * Caller holds l->lock; k is the newcomer's key record, NULL when the key has no waiters. */
static bool may_wait_locked(const rt_line *l, const rt_line_key *k)
{
    if (l->waiting >= l->max_waiting)
        return false;
    if (l->max_waiting_per_key > 0 && k != NULL && k->count >= l->max_waiting_per_key)
        return false;
    return true;
}

int rt_line_enter(rt_line *l, rt_line_waiter *w)
{
    RT_ASSERT(w != NULL && w->key != NULL, "line %s: waiter without a client key", l->name);
    int rc;
    pthread_mutex_lock(&l->lock);
    RT_ASSERT(w->state != RT_LINE_QUEUED, "line %s: waiter %p entered twice", l->name,
              (void *)w);
    uint64_t hash = rt_keytab_hash(&l->keys, w->key);
    rt_line_key *k = (rt_line_key *)rt_keytab_find(&l->keys, w->key, hash);
    if (l->in_use < l->slots && may_hold_locked(l, k)) {
        /* Slots pass straight to waiters on release, so a free slot means no waiter that
         * may hold one. */
        RT_ASSERT(l->waiting == 0 || l->max_holding_per_key > 0,
                  "line %s: %d free slot(s) but %d waiting", l->name, l->slots - l->in_use,
                  l->waiting);
        if (l->max_holding_per_key > 0) {
            if ((k = key_get(l, w->key, hash)) == NULL) {
                rt_log(ATRIUM_LOG_ERROR, "core", "line %s: out of memory, refusing", l->name);
                rc = ATRIUM_E_LIMIT;
                goto out;
            }
            k->holding++;
        }
        l->in_use++;
        w->state = RT_LINE_ADMITTED;
        rc = RT_LINE_ADMITTED;
        goto out;
    }
    if (!may_wait_locked(l, k)) {
        rc = ATRIUM_E_LIMIT;
        goto out;
    }
    if (k == NULL && (k = key_get(l, w->key, hash)) == NULL) {
        rt_log(ATRIUM_LOG_ERROR, "core", "line %s: out of memory, refusing a waiter", l->name);
        rc = ATRIUM_E_LIMIT; /* refused like a full line: w untouched */
        goto out;
    }
    if (k->ring_next == NULL)
        ring_append(l, k);
    w->next = NULL;
    w->lkey = k;
    if (k->tail != NULL)
        k->tail->next = w;
    else
        k->head = w;
    k->tail = w;
    k->count++;
    l->waiting++;
    w->state = RT_LINE_QUEUED;
    rc = RT_LINE_QUEUED;
out:
    if (rc == ATRIUM_E_LIMIT)
        rt_metric_add(l->m_refused, 1);
    publish_locked(l);
    pthread_mutex_unlock(&l->lock);
    return rc;
}

rt_line_waiter *rt_line_release(rt_line *l)
{
    RT_ASSERT(l->max_holding_per_key == 0, "line %s: release without the holder's key",
              l->name);
    return rt_line_release_for(l, NULL);
}

rt_line_waiter *rt_line_release_for(rt_line *l, const char *holder)
{
    rt_line_waiter *w = NULL;
    pthread_mutex_lock(&l->lock);
    RT_ASSERT(l->in_use > 0, "line %s: release with no slot in use", l->name);
    if (l->max_holding_per_key > 0) {
        RT_ASSERT(holder != NULL, "line %s: release without the holder's key", l->name);
        rt_line_key *h =
            (rt_line_key *)rt_keytab_find(&l->keys, holder, rt_keytab_hash(&l->keys, holder));
        RT_ASSERT(h != NULL && h->holding > 0, "line %s: \"%s\" releases a slot it does not hold",
                  l->name, holder);
        h->holding--;
        if (h->holding == 0 && h->count == 0)
            key_drop(l, h);
    }
    /* Fair order: the head waiter of the front key that may hold one more; it goes to the
     * back. Keys at their holding cap are passed over (they keep their turn). */
    rt_line_key *k = l->ring;
    while (k != NULL && !may_hold_locked(l, k)) {
        k = k->ring_next;
        if (k == l->ring)
            k = NULL; /* every waiting key is at its cap */
    }
    if (k == NULL) {
        l->in_use--;
        goto out;
    }
    if (k != l->ring) { /* served out of turn: to the back, the front keeps its place */
        ring_remove(l, k);
        ring_append(l, k);
    }
    if (l->max_holding_per_key > 0)
        k->holding++;
    w = k->head;
    k->head = w->next;
    if (k->head == NULL)
        k->tail = NULL;
    k->count--;
    l->waiting--;
    w->next = NULL;
    w->lkey = NULL;
    w->state = RT_LINE_ADMITTED; /* the slot passes to w: in_use is unchanged */
    if (k->count == 0)
        key_drop(l, k);
    else if (l->ring == k)
        l->ring = k->ring_next;
out:
    publish_locked(l);
    pthread_mutex_unlock(&l->lock);
    return w;
}

bool rt_line_cancel(rt_line *l, rt_line_waiter *w)
{
    pthread_mutex_lock(&l->lock);
    RT_ASSERT(w->state == RT_LINE_QUEUED || w->state == RT_LINE_ADMITTED,
              "line %s: cancel of waiter %p that never entered (state %d)", l->name, (void *)w,
              w->state);
    if (w->state == RT_LINE_ADMITTED) {
        pthread_mutex_unlock(&l->lock);
        return false; /* granted before the cancel: the caller owns the slot */
    }
    rt_line_key *k = w->lkey;
    rt_line_waiter **pp = &k->head;
    rt_line_waiter *prev = NULL;
    while (*pp != NULL && *pp != w) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    RT_ASSERT(*pp == w, "line %s: queued waiter %p missing from key \"%s\"", l->name,
              (void *)w, k->key);
    *pp = w->next;
    if (k->tail == w)
        k->tail = prev;
    k->count--;
    l->waiting--;
    w->next = NULL;
    w->lkey = NULL;
    w->state = RT_LINE_IDLE;
    if (k->count == 0)
        key_drop(l, k);
    publish_locked(l);
    pthread_mutex_unlock(&l->lock);
    return true;
}

void rt_line_count_timeout(rt_line *l)
{
    rt_metric_add(l->m_timed_out, 1);
}

int rt_line_in_use(rt_line *l)
{
    pthread_mutex_lock(&l->lock);
    int n = l->in_use;
    pthread_mutex_unlock(&l->lock);
    return n;
}

int rt_line_waiting(rt_line *l)
{
    pthread_mutex_lock(&l->lock);
    int n = l->waiting;
    pthread_mutex_unlock(&l->lock);
    return n;
}

int rt_line_slots(const rt_line *l)
{
    return l->slots;
}

void rt_line_free(rt_line *l)
{
    if (l == NULL)
        return;
    RT_ASSERT(l->waiting == 0, "line %s freed with %d waiter(s) linked", l->name, l->waiting);
    rt_keyent *e;
    while ((e = rt_keytab_pop_any(&l->keys)) != NULL)
        free(e); /* keys still counted as holding (the record begins with its entry) */
    rt_keytab_destroy(&l->keys);
    pthread_mutex_destroy(&l->lock);
    free(l->name);
    free(l);
}
