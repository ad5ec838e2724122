/*
 * core/runtime/flight.c - single flight (the contract is flight.h; the decision
 * docs/adr/0029-single-flight.md).
 *
 * One mutex guards a table of flights keyed by rt_keytab (SipHash with a per-table key:
 * keys carry what clients chose, URLs and server names, so none can aim at one chain). A
 * flight is listed from its leader's join to its finish; its memory lives as long as a
 * reference does: the listing's, and one per join. The waiters hang on a doubly linked list
 * so one can leave in O(1) when its deadline passes. Finishing moves the whole list off the
 * flight under the lock and calls each done after it, so a done that joins again (a
 * request woken at once) cannot deadlock; a waiter's memory is not touched after its done
 * was called. The table itself counts the flights alive: its owner may let go first
 * (shutdown), and the last flight frees it. An early result (rt_flight_publish) moves the
 * waiters that asked for it off the list the same way; its value lives with the flight, so
 * a flight publishes at most once and a waiter may read the value as long as it holds its
 * reference.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime/flight.h"
#include "core/runtime/keytab.h"

struct rt_flight {
    rt_keyent ent; /* first: the table hands back &ent */
    rt_flights *t;
    int refs;     /* under t->mu */
    bool listed;  /* in the table: joins find it */
    bool ended;   /* finished: result and value are final */
    int result;
    void *value;
    void (*free_value)(void *);
    bool published;      /* the early result is out: RT_FLIGHT_EARLY joins take it */
    bool had_early;      /* rt_flight_publish was called (at most once) */
    int early_result;
    void *early_value;
    void (*free_early)(void *);
    rt_flight_waiter *head;
    char key[];
};

struct rt_flights {
    char *name;
    int max_keys, max_waiters;
    pthread_mutex_t mu;
    int refs; /* the owner's (until rt_flights_free) + one per flight alive */
    int n_flights;
    int n_waiters; /* linked, leaders not counted */
    rt_keytab keys;
    rt_metric *m_in_flight, *m_limit, *m_waiters, *m_refused, *m_shared, *m_left, *m_early;
};

rt_flights *rt_flights_new(const char *name, int max_keys, int max_waiters,
                           rt_metrics *metrics)
{
    RT_ASSERT(name != NULL, "%s", "rt_flights_new: NULL name");
    if (max_keys < 1 || max_waiters < 1) {
        rt_log(ATRIUM_LOG_ERROR, "core",
               "flights %s: at most %d keys and at most %d waiters must both be >= 1; fix the "
               "caller",
               name, max_keys, max_waiters);
        return NULL;
    }
    rt_flights *t = calloc(1, sizeof(*t));
    if (!t) return NULL;
    t->name = strdup(name);
    if (!t->name || rt_keytab_init(&t->keys, (size_t)max_keys) != 0) {
        free(t->name);
        free(t);
        return NULL;
    }
    pthread_mutex_init(&t->mu, NULL);
    t->max_keys = max_keys;
    t->max_waiters = max_waiters;
    t->refs = 1;
    char labels[RT_METRIC_LABELS_MAX_BYTES];
    if (rt_metric_label(labels, sizeof(labels), "flights", name) < 0) labels[0] = '\0';
    t->m_in_flight = rt_metric_gauge(metrics, "atrium_flights_in_flight", labels,
                                     "Keys whose one piece of work is under way now.");
    t->m_limit = rt_metric_gauge(metrics, "atrium_flights_limit", labels,
                                 "Keys that may be in flight at once.");
    t->m_waiters = rt_metric_gauge(metrics, "atrium_flights_waiters", labels,
                                   "Waiters on work another started, now.");
    t->m_refused = rt_metric_counter(metrics, "atrium_flights_refused_total", labels,
                                     "Joins refused: the keys or the waiters were at their limit.");
    t->m_shared = rt_metric_counter(metrics, "atrium_flights_shared_total", labels,
                                    "Joins that found the key's work under way and waited for it.");
    t->m_left = rt_metric_counter(metrics, "atrium_flights_left_total", labels,
                                  "Waiters that stopped waiting before the work ended.");
    t->m_early = rt_metric_counter(metrics, "atrium_flights_early_total", labels,
                                   "Waiters released with the work's early result.");
    rt_metric_set(t->m_limit, max_keys);
    rt_metric_set(t->m_in_flight, 0);
    rt_metric_set(t->m_waiters, 0);
    return t;
}

static void table_destroy(rt_flights *t)
{
    rt_keytab_destroy(&t->keys);
    pthread_mutex_destroy(&t->mu);
    free(t->name);
    free(t);
}

/* Drop one reference of the table; the caller holds t->mu, which is released here. */
static void table_unref_unlock(rt_flights *t)
{
    bool last = --t->refs == 0;
    pthread_mutex_unlock(&t->mu);
    if (last) table_destroy(t);
}

void rt_flights_free(rt_flights *t)
{
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    if (t->n_flights > 0)
        rt_log(ATRIUM_LOG_WARN, "core",
               "flights %s: let go with %d flight(s) still under way; freed when they end",
               t->name, t->n_flights);
    table_unref_unlock(t);
}

/* ---- waiters (t->mu held) ------------------------------------------------------------ */

static void link_locked(rt_flight *f, rt_flight_waiter *w)
{
    w->flight = f;
    w->prev = NULL;
    w->next = f->head;
    if (f->head) f->head->prev = w;
    f->head = w;
    w->linked = true;
    if (w->leads) return;
    f->t->n_waiters++;
    rt_metric_set(f->t->m_waiters, f->t->n_waiters);
}

static void unlink_locked(rt_flight *f, rt_flight_waiter *w)
{
    if (w->prev) w->prev->next = w->next;
    else f->head = w->next;
    if (w->next) w->next->prev = w->prev;
    w->linked = false;
    if (w->leads) return;
    f->t->n_waiters--;
    rt_metric_set(f->t->m_waiters, f->t->n_waiters);
}

/* ---- joining --------------------------------------------------------------------------- */

/* The bound: may one more leader (a new key) or one more waiter be admitted? */
static bool admits_locked(const rt_flights *t, bool new_key)
{
    return new_key ? t->n_flights < t->max_keys : t->n_waiters < t->max_waiters;
}

/* The decision of a join under the lock, f the key's flight or NULL: the role, or the
 * refusal (the arm not run yet). */
static int join_role_locked(const rt_flights *t, const rt_flight *f, unsigned flags)
{
    bool early = flags & (RT_FLIGHT_EARLY | RT_FLIGHT_EARLY_ONLY);
    if (f && f->published && early) return RT_FLIGHT_PUBLISHED;
    if (flags & RT_FLIGHT_EARLY_ONLY) return ATRIUM_E_NOTFOUND;
    if (!f && (flags & RT_FLIGHT_JOIN_ONLY)) return ATRIUM_E_NOTFOUND;
    if (!admits_locked(t, f == NULL)) return ATRIUM_E_LIMIT;
    return f ? RT_FLIGHT_JOINED : RT_FLIGHT_LEAD;
}

int rt_flight_join(rt_flights *t, const char *key, unsigned flags, rt_flight_waiter *w,
                   rt_flight **out)
{
    size_t len = key ? strnlen(key, RT_FLIGHT_KEY_MAX_BYTES) : 0;
    if (len == 0 || len == RT_FLIGHT_KEY_MAX_BYTES || !w || !w->done ||
        (flags & ~(RT_FLIGHT_JOIN_ONLY | RT_FLIGHT_EARLY | RT_FLIGHT_EARLY_ONLY)))
        return ATRIUM_E_INVAL;
    uint64_t hash = rt_keytab_hash(&t->keys, key);
    /* Allocated before the lock, used only when the key has no flight. */
    rt_flight *fresh = calloc(1, sizeof(*fresh) + len + 1);
    if (!fresh) return ATRIUM_E_NOMEM;
    pthread_mutex_lock(&t->mu);
    rt_flight *f = (rt_flight *)rt_keytab_find(&t->keys, key, hash);
    int rc = join_role_locked(t, f, flags);
    if (rc == ATRIUM_E_LIMIT) rt_metric_add(t->m_refused, 1);
    if (rc > 0 && rc != RT_FLIGHT_PUBLISHED && w->arm) {
        int armed = w->arm(w->arg);
        if (armed != 0) rc = armed;
    }
    if (rc < 0) {
        pthread_mutex_unlock(&t->mu);
        free(fresh);
        return rc;
    }
    if (!f) {
        f = fresh;
        fresh = NULL;
        memcpy(f->key, key, len + 1);
        f->ent.key = f->key;
        f->ent.hash = hash;
        f->t = t;
        f->refs = 1; /* the listing's, dropped at the finish */
        f->listed = true;
        rt_keytab_insert(&t->keys, &f->ent);
        t->n_flights++;
        t->refs++;
        rt_metric_set(t->m_in_flight, t->n_flights);
    } else {
        rt_metric_add(t->m_shared, 1);
    }
    f->refs++; /* the caller's */
    w->leads = rc == RT_FLIGHT_LEAD;
    w->early = (flags & (RT_FLIGHT_EARLY | RT_FLIGHT_EARLY_ONLY)) != 0;
    w->released_early = rc == RT_FLIGHT_PUBLISHED;
    if (rc == RT_FLIGHT_PUBLISHED) {
        w->flight = f;
        w->linked = false;
        rt_metric_add(t->m_early, 1);
    } else {
        link_locked(f, w);
    }
    pthread_mutex_unlock(&t->mu);
    free(fresh);
    *out = f;
    return rc;
}

bool rt_flight_leave(rt_flight_waiter *w)
{
    rt_flight *f = w->flight;
    pthread_mutex_lock(&f->t->mu);
    bool mine = w->linked;
    if (mine) {
        unlink_locked(f, w);
        rt_metric_add(f->t->m_left, 1);
    }
    pthread_mutex_unlock(&f->t->mu);
    return mine;
}

/* ---- the early result ------------------------------------------------------------------ */

/* Call done for each waiter of a list already off the flight (no lock held). */
static void call_done(rt_flight_waiter *w)
{
    while (w) {
        rt_flight_waiter *next = w->next; /* w may be gone once its done returns */
        w->done(w->arg);
        w = next;
    }
}

bool rt_flight_publish(rt_flight *f, int result, void *value, void (*free_value)(void *))
{
    rt_flights *t = f->t;
    pthread_mutex_lock(&t->mu);
    RT_ASSERT(f->listed && !f->ended, "flights %s: \"%s\" published after its finish", t->name,
              f->key);
    if (f->had_early) {
        pthread_mutex_unlock(&t->mu);
        return false;
    }
    f->had_early = f->published = true;
    f->early_result = result;
    f->early_value = value;
    f->free_early = free_value;
    rt_flight_waiter *released = NULL;
    for (rt_flight_waiter *w = f->head, *next; w; w = next) {
        next = w->next;
        if (!w->early) continue;
        unlink_locked(f, w);
        w->released_early = true;
        w->next = released;
        released = w;
        rt_metric_add(t->m_early, 1);
    }
    pthread_mutex_unlock(&t->mu);
    call_done(released);
    return true;
}

void rt_flight_unpublish(rt_flight *f)
{
    pthread_mutex_lock(&f->t->mu);
    f->published = false;
    pthread_mutex_unlock(&f->t->mu);
}

int rt_flight_waiter_result(rt_flight_waiter *w, int *result, void **value)
{
    rt_flight *f = w->flight;
    pthread_mutex_lock(&f->t->mu);
    bool early = w->released_early;
    RT_ASSERT(early || f->ended, "flights %s: \"%s\": a result read before it was handed over",
              f->t->name, f->key);
    if (result) *result = early ? f->early_result : f->result;
    if (value) *value = early ? f->early_value : f->value;
    pthread_mutex_unlock(&f->t->mu);
    return early ? RT_FLIGHT_RESULT_EARLY : RT_FLIGHT_RESULT_END;
}

/* ---- the end --------------------------------------------------------------------------- */

void rt_flight_finish(rt_flight *f, int result, void *value, void (*free_value)(void *))
{
    rt_flights *t = f->t;
    pthread_mutex_lock(&t->mu);
    RT_ASSERT(f->listed && !f->ended, "flights %s: \"%s\" finished twice", t->name, f->key);
    rt_keytab_remove(&t->keys, &f->ent);
    f->listed = false;
    f->ended = true;
    f->published = false;
    f->result = result;
    f->value = value;
    f->free_value = free_value;
    t->n_flights--;
    rt_metric_set(t->m_in_flight, t->n_flights);
    rt_flight_waiter *w = f->head;
    f->head = NULL;
    for (rt_flight_waiter *x = w; x; x = x->next) {
        x->linked = false;
        if (!x->leads) t->n_waiters--;
    }
    rt_metric_set(t->m_waiters, t->n_waiters);
    pthread_mutex_unlock(&t->mu);
    call_done(w);
    rt_flight_unref(f); /* the listing's */
}

bool rt_flight_ended(rt_flight *f, int *result, void **value)
{
    pthread_mutex_lock(&f->t->mu);
    bool ended = f->ended;
    if (ended && result) *result = f->result;
    if (ended && value) *value = f->value;
    pthread_mutex_unlock(&f->t->mu);
    return ended;
}

int rt_flight_wanted(rt_flight *f)
{
    int64_t now = rt_now_ms();
    int n = 0;
    pthread_mutex_lock(&f->t->mu);
    for (const rt_flight_waiter *w = f->head; w; w = w->next)
        if (w->deadline_ms == 0 || w->deadline_ms > now) n++;
    pthread_mutex_unlock(&f->t->mu);
    return n;
}

const char *rt_flight_key(const rt_flight *f)
{
    return f->key;
}

void rt_flight_ref(rt_flight *f)
{
    pthread_mutex_lock(&f->t->mu);
    f->refs++;
    pthread_mutex_unlock(&f->t->mu);
}

void rt_flight_unref(rt_flight *f)
{
    if (!f) return;
    rt_flights *t = f->t;
    pthread_mutex_lock(&t->mu);
    if (--f->refs > 0) {
        pthread_mutex_unlock(&t->mu);
        return;
    }
    RT_ASSERT(!f->listed, "flights %s: \"%s\" lost its last reference while listed", t->name,
              f->key);
    table_unref_unlock(t);
    if (f->free_value && f->value) f->free_value(f->value);
    if (f->free_early && f->early_value) f->free_early(f->early_value);
    free(f);
}

int rt_flights_in_flight(rt_flights *t)
{
    pthread_mutex_lock(&t->mu);
    int n = t->n_flights;
    pthread_mutex_unlock(&t->mu);
    return n;
}

int rt_flights_waiting(rt_flights *t)
{
    pthread_mutex_lock(&t->mu);
    int n = t->n_waiters;
    pthread_mutex_unlock(&t->mu);
    return n;
}
