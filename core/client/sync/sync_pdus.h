/*
 * core/client/sync/sync_pdus.h - parsed PDUs shared by the requests that judge the same
 * unread events (sync_counts.c): one message into a room of a thousand members wakes a
 * thousand syncs, each judging the room's unread events by its user's push rules; without
 * this each parsed the same PDUs again (docs/performance.md, "The wake fan-out").
 * Internal prefix: sync_pdus_.
 */
#ifndef ATRIUM_CORE_SYNC_PDUS_H
#define ATRIUM_CORE_SYNC_PDUS_H

#include <jansson.h>
#include <stddef.h>

#include "core/runtime/runtime.h"

#define SYNC_PDUS_SLOTS 1024     /* PDUs kept at most */
#define SYNC_PDUS_MAX_TEXT 8192  /* bytes of JSON text: a longer PDU is parsed, not kept */

typedef struct sync_pdus sync_pdus;

/* A cache of `slots` PDUs of at most max_text bytes of text each, counted in metrics
 * (atrium_sync_pdu_cache_hits_total, _misses_total, atrium_sync_pdu_cache_entries). NULL on
 * OOM. */
sync_pdus *sync_pdus_new(rt_metrics *metrics, size_t slots, size_t max_text);
void sync_pdus_free(sync_pdus *p);

/* The parsed PDU of event_id, whose stored JSON is text (an event's PDU never changes
 * once stored: a redaction only marks it): a reference the caller reads but never changes
 * (other threads may hold it too) and gives back with sync_pdus_put, never json_decref.
 * NULL when text does not parse. p NULL: parsed and not kept. */
json_t *sync_pdus_get(sync_pdus *p, const char *event_id, const char *text);
void sync_pdus_put(sync_pdus *p, json_t *pdu);

/* The process's cache (sync_init makes it; NULL before: then nothing is kept). */
sync_pdus *sync_pdus_global(void);
void sync_pdus_set_global(sync_pdus *p);

#endif
