/*
 * core/rooms/state_res.h - state resolution: given the states of a room after each of an
 * event's prev_events, the one state before the event.
 *
 * Two algorithms, chosen by room version as the spec's "Room Versions" sections say:
 * version 1 uses the original algorithm (state_res_v1.c), versions 2 to 11 state resolution
 * v2 (state_res_v2.c). Both are pure functions of their input: the states (state_map.h),
 * the events they name and those events' auth chains, which this module asks the caller
 * for one event at a time through a loader callback. It keeps no global state, so any
 * number of threads may resolve at once, each with its own request. The authorization
 * rules it applies are room_auth_check_event's (room_auth.h); it never decides on its own
 * who may send what. Internal prefix: state_res_.
 *
 * What it does not do: fetch missing events from other servers (a missing event is a
 * failure that names it, so the caller can fetch it and call again), cache results,
 * persist anything, or export metrics (each call fills a report the caller turns into
 * counters and a histogram).
 *
 * Example (the caller's side):
 *
 *     const state_map *states[] = {after_a, after_b};     // from SQL rows, state_map_set
 *     state_res_request rq = {.version = v, .room_id = room_id, .states = states,
 *                             .n_states = 2, .load = load_pdu, .load_ctx = db};
 *     state_map *resolved;
 *     state_res_report rep;
 *     int rc = state_res_resolve(&rq, &resolved, &rep);
 *     metric_observe(rep.elapsed_us); count(state_res_outcome_name(rc));
 *     if (rc == STATE_RES_E_MISSING) fetch(rep.event_id) and call again;
 */
#ifndef ATRIUM_CORE_STATE_RES_H
#define ATRIUM_CORE_STATE_RES_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/rooms/events.h"
#include "core/rooms/state_map.h"

/* Distinct events one resolution may load (the states' events and, for v2, their whole
 * auth chains), unless the request names another bound: what a hostile DAG can make one
 * resolution hold in memory and walk. */
#define STATE_RES_MAX_EVENTS_DEFAULT 100000
/* States one resolution takes at most (an event has at most 20 prev_events). */
#define STATE_RES_MAX_STATES 64
#define STATE_RES_WHY_LEN 200

/* The algorithm a room version resolves state with (its state_res, events.h). */
enum state_res_algorithm {
    STATE_RES_NONE = 0, /* a version this module does not resolve (none, or a later one) */
    STATE_RES_V1 = 1,
    STATE_RES_V2 = 2,
};
enum state_res_algorithm state_res_algorithm_of(const room_version *v);

/* Load event_id's PDU (federation format) for the resolution: a NEW reference, which the
 * resolution releases with json_decref before state_res_resolve returns; NULL when the
 * event is not available, which fails the resolution with STATE_RES_E_MISSING. Set
 * *rejected (false on entry) when this server rejected the event: a rejected event is
 * never used as an auth event, nor admitted into the resolved state. Called on the
 * resolving thread only, at most once per event ID per resolution, never after
 * state_res_resolve returned. */
typedef json_t *(*state_res_load_fn)(void *ctx, const char *event_id, bool *rejected);

typedef struct state_res_request {
    const room_version *version;    /* the room's version (room_version_find) */
    const char *room_id;            /* every event must be in this room; NULL: not checked */
    const state_map *const *states; /* the states to resolve, borrowed */
    size_t n_states;                /* 0..STATE_RES_MAX_STATES (0 resolves to an empty state) */
    state_res_load_fn load;
    void *load_ctx;
    size_t max_events;              /* 0 = STATE_RES_MAX_EVENTS_DEFAULT */
} state_res_request;

/* How a resolution ended. */
enum state_res_outcome {
    STATE_RES_OK = 0,
    STATE_RES_E_NOMEM = -1,     /* out of memory */
    STATE_RES_E_MISSING = -2,   /* the loader had no event report.event_id */
    STATE_RES_E_TOO_LARGE = -3, /* more than max_events events, or too many states */
    STATE_RES_E_BAD_EVENT = -4, /* report.event_id is malformed, of another room, in the
                                 * wrong state key, or its auth events form a cycle */
    STATE_RES_E_VERSION = -5,   /* no algorithm for the request's room version */
};
/* A short name of an outcome for a metrics label ("ok", "missing_event", "too_large",
 * "bad_event", "unsupported_version", "nomem"). */
const char *state_res_outcome_name(int outcome);

/* What one resolution did, filled on success and on failure alike. */
typedef struct state_res_report {
    enum state_res_algorithm algorithm;
    uint64_t elapsed_us;     /* wall time of the call (monotonic clock) */
    size_t events_loaded;    /* distinct events the loader was asked for */
    size_t conflicted_keys;  /* keys the states disagree on */
    size_t full_conflicted;  /* v2: conflicted events plus the auth difference */
    size_t power_sorted;     /* v2: events ordered by reverse topological power ordering */
    size_t auth_checks;      /* events put through the authorization rules */
    size_t auth_refused;     /* of those, refused (left out of the state) */
    char event_id[EVENT_MAX_ID_BYTES + 1]; /* on failure: the event at fault, or "" */
    char why[STATE_RES_WHY_LEN];           /* on failure: a sentence for the log */
} state_res_report;

/* Resolve req->states into *out, a new map the caller frees with state_map_free.
 * STATE_RES_OK, or a negative state_res_outcome with *out NULL and report->why (and, where
 * one event is at fault, report->event_id) saying what failed. Any thread; the request's
 * states must not change during the call. A NULL req, out or report, or states without a
 * state array or a loader, is a bug in the caller: one log line, then abort. */
int state_res_resolve(const state_res_request *req, state_map **out, state_res_report *report);

#endif
