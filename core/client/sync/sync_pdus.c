/*
 * core/client/sync/sync_pdus.c - parsed PDUs shared by the requests that judge the same
 * unread events (sync_pdus.h says why).
 *
 * Decisions owned here:
 *   - Bounded by count and size: `slots` entries, each a PDU of at most max_text bytes of
 *     text (a longer one is parsed for its caller and not kept), so what is kept is at most
 *     slots x max_text bytes of text, parsed (8 MiB of text at the defaults; a message's PDU
 *     is about 1 KiB). Direct-mapped by a hash of the event ID: a new event takes its
 *     slot from whatever was there. No expiry is needed: an event's PDU text never
 *     changes (a redaction sets redacted_by, and the counts leave redacted events out).
 *   - Parsed PDUs are shared by reference and never changed: callers judge them (push_eval
 *     takes const) and give them back with sync_pdus_put. Every change of a kept PDU's
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

#include "core/client/sync/sync_pdus.h"

typedef struct pdu_slot {
    char *event_id; /* NULL: empty */
    json_t *pdu;
} pdu_slot;

struct sync_pdus {
    pthread_mutex_t mu;
    pdu_slot *slots;
    size_t n_slots, max_text;
    rt_metric *m_hits, *m_misses, *m_entries;
};

static sync_pdus *g_pdus;

sync_pdus *sync_pdus_global(void) { return __atomic_load_n(&g_pdus, __ATOMIC_ACQUIRE); }

void sync_pdus_set_global(sync_pdus *p) { __atomic_store_n(&g_pdus, p, __ATOMIC_RELEASE); }

sync_pdus *sync_pdus_new(rt_metrics *metrics, size_t slots, size_t max_text)
{
    sync_pdus *p = calloc(1, sizeof(*p));
    if (!p || slots == 0 || !(p->slots = calloc(slots, sizeof(*p->slots)))) {
        free(p);
        return NULL;
    }
    pthread_mutex_init(&p->mu, NULL);
    p->n_slots = slots;
    p->max_text = max_text;
    p->m_hits = rt_metric_counter(metrics, "atrium_sync_pdu_cache_hits_total", NULL,
                                  "Unread events judged for notification counts from an "
                                  "already parsed PDU");
    p->m_misses = rt_metric_counter(metrics, "atrium_sync_pdu_cache_misses_total", NULL,
                                    "Unread events whose PDU was parsed for notification counts");
    p->m_entries = rt_metric_gauge(metrics, "atrium_sync_pdu_cache_entries", NULL,
                                   "Parsed PDUs kept for notification counts (at most "
                                   "SYNC_PDUS_SLOTS)");
    return p;
}

void sync_pdus_free(sync_pdus *p)
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

/* FNV-1a of the event ID. */
static size_t slot_of(const sync_pdus *p, const char *event_id)
{
    uint64_t h = 14695981039346656037ULL;
    for (const unsigned char *c = (const unsigned char *)event_id; *c; c++) {
        h ^= *c;
        h *= 1099511628211ULL;
    }
    return (size_t)(h % p->n_slots);
}

json_t *sync_pdus_get(sync_pdus *p, const char *event_id, const char *text)
{
    if (!p) return json_loads(text, 0, NULL);
    pdu_slot *s = &p->slots[slot_of(p, event_id)];
    json_t *pdu = NULL;
    pthread_mutex_lock(&p->mu);
    if (s->event_id && strcmp(s->event_id, event_id) == 0) pdu = json_incref(s->pdu);
    pthread_mutex_unlock(&p->mu);
    rt_metric_add(pdu ? p->m_hits : p->m_misses, 1);
    if (pdu) return pdu;
    /* Not yet shared: its count may change outside the lock until it is in a slot. */
    if (!(pdu = json_loads(text, 0, NULL)) || strlen(text) > p->max_text) return pdu;
    char *id = strdup(event_id);
    if (!id) return pdu;
    pthread_mutex_lock(&p->mu);
    bool filled = !s->event_id;
    char *old_id = s->event_id;
    json_decref(s->pdu); /* freed here if no request holds it */
    s->event_id = id;
    s->pdu = json_incref(pdu);
    pthread_mutex_unlock(&p->mu);
    if (filled) rt_metric_add(p->m_entries, 1);
    free(old_id);
    return pdu;
}

void sync_pdus_put(sync_pdus *p, json_t *pdu)
{
    if (!p) {
        json_decref(pdu);
        return;
    }
    pthread_mutex_lock(&p->mu);
    json_decref(pdu);
    pthread_mutex_unlock(&p->mu);
}
