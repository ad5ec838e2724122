/*
 * core/client/rooms/crooms_hierarchy.h - what the client's space hierarchy
 * (crooms_hierarchy.c) asks of other servers (crooms_hierarchy_remote.c): the summary and
 * children of a room this server is not in, from GET /_matrix/federation/v1/hierarchy of a
 * server its parent's m.space.child names (for the root: the servers of ADR-0028), parked, under the outbound budget
 * (docs/adr/0079-outbound-budget.md), and kept a short while in a bounded cache
 * (docs/adr/0012-hierarchy-cache.md). Internal prefix: rooms_hierarchy_.
 */
#ifndef ATRIUM_CORE_CLIENT_ROOMS_CROOMS_HIERARCHY_H
#define ATRIUM_CORE_CLIENT_ROOMS_CROOMS_HIERARCHY_H

#include <jansson.h>
#include <stdbool.h>

#include "core/client/rooms/crooms_api.h"

#define CROOMS_HIERARCHY_CACHE_ENTRIES 256     /* rooms remembered, across all requests */
#define CROOMS_HIERARCHY_CACHE_MS 60000        /* how long an answer is reused */
#define CROOMS_HIERARCHY_FAILURE_CACHE_MS 15000 /* how long a failure or refusal is */
#define CROOMS_HIERARCHY_MAX_FETCHES 8          /* servers asked by one client request */
#define CROOMS_HIERARCHY_MAX_ROOT_SERVERS 4     /* of them, for a root this server is not in */
#define CROOMS_HIERARCHY_MAX_ANSWER_BYTES (512 * 1024)

/* Register the cache's metrics (atrium_rooms_hierarchy_cache_total{result},
 * atrium_rooms_hierarchy_cache_entries, atrium_rooms_hierarchy_remote_total{outcome}).
 * Module init; 0 or -1. */
int crooms_hierarchy_init(rt_metrics *metrics);
/* Forget every cached answer (module stop). */
void crooms_hierarchy_stop(void);

/* [req] The entry of room_id (not held here) for a walk: its summary with children_state
 * (a new object, filtered by suggested) from the cache, 1. Otherwise 0: left out (a
 * failure or refusal remembered, no server to ask, this request's fetches used up or cut
 * by its deadline), or being asked now: then *parked is set and the caller returns
 * ATRIUM_PARKED once its walk stops (one server asked per run; the handler runs again
 * when it answered, and finds it cached). -2: the outbound budget is full (answer 429).
 * vias: the JSON array of the m.space.child's servers; the first that is not this server
 * is asked. */
int crooms_hierarchy_remote(atrium_req *r, const char *room_id, const json_t *vias,
                           bool suggested, json_t **entry, int *parked);
/* [req] The entry of the walk's root room_id when this server is not in it (ADR-0028):
 * from the cache (only an answer: a failure remembered for it as a child does not count),
 * else asked of servers (a JSON array in the order to try; this server and repeats are
 * skipped), one per run of the handler, the next after one that failed or refused, at most
 * CROOMS_HIERARCHY_MAX_ROOT_SERVERS of them, each with an even share of the request's time
 * left. 1 (*entry: a new object with children_state), 0 being asked (*parked set: return
 * ATRIUM_PARKED), -2 the outbound budget is full, -3 servers were asked and none could
 * show it (or the request's time ran out), -4 there is no server to ask. */
int crooms_hierarchy_remote_root(atrium_req *r, const char *room_id, const json_t *servers,
                                bool suggested, json_t **entry, int *parked);
/* [req] At the top of each run of the handler: note whether the server asked in the run
 * before answered (else the request's deadline or shutdown woke it: nothing more is asked). */
void crooms_hierarchy_run_begin(atrium_req *r);

#endif
