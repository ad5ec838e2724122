/*
 * core/rooms/events_pdus.h - stored events' PDUs parsed once and shared by every request
 * that reads them: the renderer of stored events (events_store.c) and the unread counts'
 * push rules (core/client/sync/sync_counts.c). One message into a room of a thousand
 * members wakes a thousand syncs, each rendering the message and judging the room's
 * unread events; without this each parsed the same PDUs again (docs/performance.md, "The
 * wake fan-out"). Internal prefix: events_pdus_.
 */
#ifndef ATRIUM_CORE_EVENTS_PDUS_H
#define ATRIUM_CORE_EVENTS_PDUS_H

#include <jansson.h>
#include <stddef.h>

#include "core/runtime/runtime.h"

#define EVENTS_PDUS_SLOTS 2048     /* PDUs kept at most */
#define EVENTS_PDUS_MAX_TEXT 4096  /* bytes of JSON text: a longer PDU is parsed, not kept */

typedef struct events_pdus events_pdus;

/* A cache of `slots` PDUs (rounded down to a multiple of 4, its sets' size; NULL below 4)
 * of at most max_text bytes of text each, counted in metrics
 * (atrium_events_pdu_cache_hits_total, _misses_total, atrium_events_pdu_cache_entries). NULL on
 * OOM. */
events_pdus *events_pdus_new(rt_metrics *metrics, size_t slots, size_t max_text);
void events_pdus_free(events_pdus *p);

/* The parsed PDU of event_id, whose stored JSON is text (an event's PDU never changes
 * once stored: a redaction only marks it): a reference the caller reads but never changes
 * (other threads may hold it too) and gives back with events_pdus_put, never json_decref.
 * NULL when text does not parse. p NULL: parsed and not kept. */
json_t *events_pdus_get(events_pdus *p, const char *event_id, const char *text);
void events_pdus_put(events_pdus *p, json_t *pdu);
/* The kept parsed PDU of event_id (a hit, given back with events_pdus_put), or NULL when
 * none is kept (not counted as a miss: the caller reads the text and calls
 * events_pdus_get, which counts it). */
json_t *events_pdus_peek(events_pdus *p, const char *event_id);

/* The process's cache (the rooms module's init makes it, core/client/rooms/crooms_module.c;
 * NULL before: then nothing is kept). */
events_pdus *events_pdus_global(void);
void events_pdus_set_global(events_pdus *p);

#endif
