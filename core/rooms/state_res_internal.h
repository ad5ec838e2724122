/*
 * core/rooms/state_res_internal.h - what state_res.c shares with the two algorithms
 * (state_res_v1.c, state_res_v2.c): one resolution's context, its table of loaded events,
 * the split of the input states into unconflicted and conflicted keys, and one
 * authorization check of an event against a state. Internal to core/rooms; prefix sr_.
 */
#ifndef ATRIUM_CORE_STATE_RES_INTERNAL_H
#define ATRIUM_CORE_STATE_RES_INTERNAL_H

#include "core/rooms/state_res.h"

#define SR_NONE UINT32_MAX
#define SR_MAINLINE_UNKNOWN (-1) /* sr_event.mainline before the mainline step reached it */

/* One loaded event. Strings are borrowed from pdu (or, for id, the context's index). */
typedef struct sr_event {
    const char *id;
    json_t *pdu; /* owned reference */
    const char *type, *sender;
    const char *state_key; /* NULL: not a state event */
    int64_t ts, depth;
    uint32_t *auth; /* loaded auth events, without repeats; valid once auth_done */
    uint32_t n_auth;
    bool auth_done, rejected;
    bool conflicted; /* a value of a conflicted key */
    bool in_full;    /* v2: in the full conflicted set */
    bool in_power;   /* v2: ordered by the reverse topological power ordering */
    uint64_t chains; /* v2: bit i set when in the auth chain of state i */
    int64_t mainline; /* v2: scratch of the mainline ordering */
    uint32_t mark;    /* scratch of sr_load_auth: the list that last took it */
} sr_event;

typedef struct sr_ctx {
    const state_res_request *req;
    const room_version *v;
    state_res_report *rep;
    state_index ids; /* event ID -> position in ev */
    sr_event *ev;
    size_t n, cap, max_events;
    uint32_t mark; /* the last auth list number handed out */
} sr_ctx;

/* A key the states disagree on, and its distinct event IDs (borrowed from the states). */
typedef struct sr_conflict {
    const char *type, *state_key;
    const char **ids;
    size_t n;
} sr_conflict;

/* Record a failure in the report and return rc. */
int sr_fail(sr_ctx *c, int rc, const char *event_id, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The position of event_id in c->ev, loading it on first use. STATE_RES_OK, or a failure
 * (missing, too many events, malformed, other room). */
int sr_load(sr_ctx *c, const char *event_id, uint32_t *at);
/* Load e's auth events (once). STATE_RES_OK or a failure. */
int sr_load_auth(sr_ctx *c, uint32_t e);
/* The first of e's auth events (e's auth loaded) at (type, state_key), or SR_NONE. */
uint32_t sr_auth_event_at(const sr_ctx *c, uint32_t e, const char *type, const char *state_key);

/* Split the request's states: keys every state holds with one event ID (v2), or that only
 * one event ID holds in whichever states have the key (v1), go to *unconflicted; the rest
 * to *conflicts (freed with sr_conflicts_free). STATE_RES_OK or a failure. */
int sr_separate(sr_ctx *c, bool missing_is_conflict, state_map **unconflicted,
                sr_conflict **conflicts, size_t *n_conflicts);
void sr_conflicts_free(sr_conflict *conflicts, size_t n);

/* Does the authorization allow event e in state r? r answers first; where r has no event
 * at a key the rules ask for, e's own (unrejected) auth events answer when
 * auth_fallback (v2's iterative auth checks), nothing otherwise (v1). (over_type,
 * over_state_key) -> over_event, when over_type is not NULL, stands in front of r at that
 * one key (v1's event-by-event pass over one key). Counts the check in the report.
 * STATE_RES_OK with *allowed, or a failure (an event r names cannot be loaded). */
int sr_allowed(sr_ctx *c, uint32_t e, const state_map *r, bool auth_fallback,
               const char *over_type, const char *over_state_key, uint32_t over_event,
               bool *allowed);

/* The algorithms: resolve from the split states into *out. */
int sr_resolve_v1(sr_ctx *c, const state_map *unconflicted, const sr_conflict *conflicts,
                  size_t n_conflicts, state_map **out);
int sr_resolve_v2(sr_ctx *c, const state_map *unconflicted, const sr_conflict *conflicts,
                  size_t n_conflicts, state_map **out);

#endif
