/*
 * core/rooms/events_pdus.c - stored events' PDUs parsed once and shared by the requests
 * that read them (events_pdus.h says why).
 *
 * Decisions owned here:
 *   - Bounded by count and size: `slots` entries, each a PDU of at most max_text bytes of
 *     text (a longer one is parsed for its caller and not kept), so what is kept is at most
 *     slots x max_text bytes of text, parsed (8 MiB of text at the defaults; a message's PDU
 *     is about 1 KiB). Set-associative: a hash of the event ID picks a set of
 *     EVENTS_PDUS_WAYS slots, and a new event takes an empty one or the one used least
 *     recently (direct-mapped, two events sharing a slot took it from each other on every
 *     read: 37 of a sliding-sync first response's 280 reads missed with 261 events in
 *     2,048 slots). No expiry is needed: an event's PDU text never
 *     changes (a redaction sets redacted_by, and readers redact what they render from it).
 *   - Parsed PDUs are shared by reference and never changed: callers read them (push_eval
 *     and event_client_format take const, and the latter copies what it keeps) and give
 *     them back with events_pdus_put. Every change of a kept PDU's
 *     reference count is made under the cache's lock (jansson's json_incref/json_decref
 *     read the count without an atomic before changing it atomically, which
 *     ThreadSanitizer rightly reports between threads). Parsing happens outside the lock.
 *   - The process's cache lives as long as the process (never freed while requests may
 *     run; reachable, so not a leak).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/rooms/events_pdus.h"

#define EVENTS_PDUS_WAYS 4 /* slots per set */

typedef struct pdu_slot {
    char *event_id; /* NULL: empty */
    json_t *pdu;
    uint64_t used; /* the cache's clock when last read */
} pdu_slot;

struct events_pdus {
    pthread_mutex_t mu;
    pdu_slot *slots;
    size_t n_slots, n_sets, max_text;
    uint64_t clock;
    rt_metric *m_hits, *m_misses, *m_entries;
};

static events_pdus *g_pdus;

events_pdus *events_pdus_global(void) { return __atomic_load_n(&g_pdus, __ATOMIC_ACQUIRE); }

void events_pdus_set_global(events_pdus *p) { __atomic_store_n(&g_pdus, p, __ATOMIC_RELEASE); }

events_pdus *events_pdus_new(rt_metrics *metrics, size_t slots, size_t max_text)
{
    events_pdus *p = calloc(1, sizeof(*p));
    size_t sets = slots / EVENTS_PDUS_WAYS;
    if (!p || sets == 0 || !(p->slots = calloc(sets * EVENTS_PDUS_WAYS, sizeof(*p->slots)))) {
        free(p);
        return NULL;
    }
    pthread_mutex_init(&p->mu, NULL);
    p->n_sets = sets;
    p->n_slots = sets * EVENTS_PDUS_WAYS;
    p->max_text = max_text;
    p->m_hits = rt_metric_counter(metrics, "atrium_events_pdu_cache_hits_total", NULL,
                                  "Stored events read (rendered, judged for notification "
                                  "counts) from an already parsed PDU");
    p->m_misses = rt_metric_counter(metrics, "atrium_events_pdu_cache_misses_total", NULL,
                                    "Stored events read whose PDU was parsed (and kept when "
                                    "small enough)");
    p->m_entries = rt_metric_gauge(metrics, "atrium_events_pdu_cache_entries", NULL,
                                   "Parsed PDUs kept for all requests (at most "
                                   "EVENTS_PDUS_SLOTS)");
    return p;
}

void events_pdus_free(events_pdus *p)
{
    if (!p) return;
    for (size_t i = 0; i < p->n_slots; i++) {
        free(p->slots[i].event_id);
        json_decref(p->slots[i].pdu);
    }
    free(p->slots);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

/* The first slot of event_id's set. The runtime's unkeyed text hash although other
 * servers choose event IDs: IDs aimed at one set only evict each other within its
 * EVENTS_PDUS_WAYS slots (re-parses, never a chain to walk), so no keyed hash is needed. */
static pdu_slot *set_of(const events_pdus *p, const char *event_id)
{
    return &p->slots[(size_t)(rt_text_hash(event_id) % p->n_sets) * EVENTS_PDUS_WAYS];
}

/* The slot of the set holding event_id, or NULL. Under the lock. */
static pdu_slot *find(pdu_slot *set, const char *event_id)
{
    for (int w = 0; w < EVENTS_PDUS_WAYS; w++)
        if (set[w].event_id && strcmp(set[w].event_id, event_id) == 0) return &set[w];
    return NULL;
}

/* The slot a new event takes: an empty one, else the least recently read. Under the lock. */
static pdu_slot *victim(pdu_slot *set)
{
    pdu_slot *v = &set[0];
    for (int w = 0; w < EVENTS_PDUS_WAYS && v->event_id; w++)
        if (!set[w].event_id || set[w].used < v->used) v = &set[w];
    return v;
}

json_t *events_pdus_peek(events_pdus *p, const char *event_id)
{
    if (!p) return NULL;
    pdu_slot *set = set_of(p, event_id), *s;
    json_t *pdu = NULL;
    pthread_mutex_lock(&p->mu);
    if ((s = find(set, event_id))) {
        pdu = json_incref(s->pdu);
        s->used = ++p->clock;
    }
    pthread_mutex_unlock(&p->mu);
    if (pdu) rt_metric_add(p->m_hits, 1);
    return pdu;
}

json_t *events_pdus_get(events_pdus *p, const char *event_id, const char *text)
{
    if (!p) return json_loads(text, 0, NULL);
    json_t *pdu = events_pdus_peek(p, event_id);
    if (pdu) return pdu;
    rt_metric_add(p->m_misses, 1);
    pdu_slot *set = set_of(p, event_id), *s;
    /* Not yet shared: its count may change outside the lock until it is in a slot. */
    if (!(pdu = json_loads(text, 0, NULL)) || strlen(text) > p->max_text) return pdu;
    char *id = strdup(event_id);
    if (!id) return pdu;
    pthread_mutex_lock(&p->mu);
    char *old_id = NULL;
    if ((s = find(set, event_id))) { /* another request put it there meanwhile */
        old_id = id;
    } else {
        s = victim(set);
        old_id = s->event_id;
        json_decref(s->pdu); /* freed here if no request holds it */
        s->event_id = id;
        s->pdu = json_incref(pdu);
    }
    bool filled = !old_id;
    s->used = ++p->clock;
    pthread_mutex_unlock(&p->mu);
    if (filled) rt_metric_add(p->m_entries, 1);
    free(old_id);
    return pdu;
}

void events_pdus_put(events_pdus *p, json_t *pdu)
{
    if (!pdu) return;
    if (!p) {
        json_decref(pdu);
        return;
    }
    pthread_mutex_lock(&p->mu);
    json_decref(pdu);
    pthread_mutex_unlock(&p->mu);
}
