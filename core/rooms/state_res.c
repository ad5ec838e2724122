/*
 * core/rooms/state_res.c - the entry point of state resolution and what both algorithms
 * share (see state_res.h for the contract, state_res_internal.h for the pieces).
 *
 * One call owns one context: a table of the events loaded so far (each asked of the
 * caller's loader once, kept as the PDU plus the few fields the algorithms read), the
 * report, and the bound on how many events may be loaded. Everything the call allocates
 * hangs off that context and is released in one place at the end, so a failure anywhere
 * (a missing event, the bound, a malformed PDU) unwinds the same way. The bound is checked
 * in sr_load, the single door through which events enter: whatever the algorithms walk,
 * they cannot hold more than max_events events.
 *
 * Splitting the input into unconflicted and conflicted keys is shared: the two algorithms
 * differ only in whether a key some states lack is a conflict (v2: yes; v1: no, a conflict
 * is two different event IDs). So is the one authorization check, sr_allowed: a getter over
 * a state that room_auth_check_event reads, with the two variants the algorithms need.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/rooms/room_auth.h"
#include "core/rooms/state_res_internal.h"
#include "core/runtime/runtime.h"

enum state_res_algorithm state_res_algorithm_of(const room_version *v)
{
    if (!v) return STATE_RES_NONE;
    if (v->state_res == 1) return STATE_RES_V1;
    if (v->state_res == 2) return STATE_RES_V2;
    return STATE_RES_NONE;
}

const char *state_res_outcome_name(int outcome)
{
    switch (outcome) {
    case STATE_RES_OK: return "ok";
    case STATE_RES_E_NOMEM: return "nomem";
    case STATE_RES_E_MISSING: return "missing_event";
    case STATE_RES_E_TOO_LARGE: return "too_large";
    case STATE_RES_E_BAD_EVENT: return "bad_event";
    case STATE_RES_E_VERSION: return "unsupported_version";
    default: return "unknown";
    }
}

int sr_fail(sr_ctx *c, int rc, const char *event_id, const char *fmt, ...)
{
    if (c->rep->why[0]) return rc; /* the first failure is the one to report */
    snprintf(c->rep->event_id, sizeof(c->rep->event_id), "%s", event_id ? event_id : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->rep->why, sizeof(c->rep->why), fmt, ap);
    va_end(ap);
    return rc;
}

/* ---- the event table ------------------------------------------------------------------ */

static int add_event(sr_ctx *c, const char *event_id, json_t *pdu, bool rejected, uint32_t *at)
{
    const char *type = json_string_value(json_object_get(pdu, "type"));
    const char *sender = json_string_value(json_object_get(pdu, "sender"));
    json_t *sk = json_object_get(pdu, "state_key");
    if (!json_is_object(pdu) || !type || !sender || (sk && !json_is_string(sk)))
        return sr_fail(c, STATE_RES_E_BAD_EVENT, event_id, "Event %.80s is malformed", event_id);
    const char *room = json_string_value(json_object_get(pdu, "room_id"));
    if (c->req->room_id && (!room || strcmp(room, c->req->room_id) != 0))
        return sr_fail(c, STATE_RES_E_BAD_EVENT, event_id, "Event %.80s is not in room %.80s",
                       event_id, c->req->room_id);
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 64;
        sr_event *grown = realloc(c->ev, cap * sizeof(*grown));
        if (!grown) return sr_fail(c, STATE_RES_E_NOMEM, NULL, "Out of memory");
        c->ev = grown;
        c->cap = cap;
    }
    sr_event *e = &c->ev[c->n];
    memset(e, 0, sizeof(*e));
    if (state_index_add(&c->ids, event_id, "", (uint32_t)c->n, &e->id, NULL) != 0)
        return sr_fail(c, STATE_RES_E_NOMEM, NULL, "Out of memory");
    e->pdu = pdu;
    e->type = type;
    e->sender = sender;
    e->state_key = json_string_value(sk);
    json_t *ts = json_object_get(pdu, "origin_server_ts"), *depth = json_object_get(pdu, "depth");
    e->ts = json_is_integer(ts) ? json_integer_value(ts) : 0;
    e->depth = json_is_integer(depth) ? json_integer_value(depth) : 0;
    e->rejected = rejected;
    e->mainline = SR_MAINLINE_UNKNOWN;
    *at = (uint32_t)c->n++;
    return STATE_RES_OK;
}

int sr_load(sr_ctx *c, const char *event_id, uint32_t *at)
{
    if (state_index_find(&c->ids, event_id, "", at)) return STATE_RES_OK;
    if (strlen(event_id) > EVENT_MAX_ID_BYTES)
        return sr_fail(c, STATE_RES_E_BAD_EVENT, NULL, "An event ID is longer than %d bytes",
                       EVENT_MAX_ID_BYTES);
    if (c->n >= c->max_events)
        return sr_fail(c, STATE_RES_E_TOO_LARGE, event_id,
                       "The states and their auth chains hold more than %zu events",
                       c->max_events);
    bool rejected = false;
    json_t *pdu = c->req->load(c->req->load_ctx, event_id, &rejected);
    c->rep->events_loaded++;
    if (!pdu)
        return sr_fail(c, STATE_RES_E_MISSING, event_id, "Event %.80s is not available", event_id);
    int rc = add_event(c, event_id, pdu, rejected, at);
    if (rc != STATE_RES_OK) json_decref(pdu);
    return rc;
}

int sr_load_auth(sr_ctx *c, uint32_t e)
{
    if (c->ev[e].auth_done) return STATE_RES_OK;
    const json_t *arr = json_object_get(c->ev[e].pdu, "auth_events");
    if (arr && !json_is_array(arr))
        return sr_fail(c, STATE_RES_E_BAD_EVENT, c->ev[e].id, "Event %.80s has malformed "
                       "auth_events", c->ev[e].id);
    size_t k = json_array_size(arr);
    uint32_t *list = k ? malloc(k * sizeof(*list)) : NULL;
    if (k && !list) return sr_fail(c, STATE_RES_E_NOMEM, NULL, "Out of memory");
    uint32_t mark = ++c->mark, m = 0;
    for (size_t i = 0; i < k; i++) {
        const char *id = event_ref_id(json_array_get(arr, i));
        uint32_t a;
        int rc = id ? sr_load(c, id, &a)
                    : sr_fail(c, STATE_RES_E_BAD_EVENT, c->ev[e].id, "Event %.80s has "
                              "malformed auth_events", c->ev[e].id);
        if (rc != STATE_RES_OK) {
            free(list);
            return rc;
        }
        if (c->ev[a].mark == mark) continue; /* listed twice */
        c->ev[a].mark = mark;
        list[m++] = a;
    }
    c->ev[e].auth = list;
    c->ev[e].n_auth = m;
    c->ev[e].auth_done = true;
    return STATE_RES_OK;
}

uint32_t sr_auth_event_at(const sr_ctx *c, uint32_t e, const char *type, const char *state_key)
{
    const sr_event *ev = &c->ev[e];
    for (uint32_t i = 0; i < ev->n_auth; i++) {
        const sr_event *a = &c->ev[ev->auth[i]];
        if (a->state_key && strcmp(a->type, type) == 0 && strcmp(a->state_key, state_key) == 0)
            return ev->auth[i];
    }
    return SR_NONE;
}

/* ---- unconflicted and conflicted ------------------------------------------------------ */

void sr_conflicts_free(sr_conflict *conflicts, size_t n)
{
    for (size_t i = 0; i < n; i++) free(conflicts[i].ids);
    free(conflicts);
}

/* Every key of every state, each with its event ID in each state (NULL where absent). */
typedef struct key_table {
    state_index index; /* (type, state_key) -> key number */
    const char **type, **state_key; /* borrowed from the states */
    const char **ids;  /* n_keys x n_states */
    size_t n_keys, cap;
} key_table;

static int collect_keys(sr_ctx *c, key_table *t)
{
    size_t ns = c->req->n_states;
    for (size_t s = 0; s < ns; s++) {
        const state_map *m = c->req->states[s];
        const char *type, *sk, *id;
        for (size_t i = 0; state_map_entry(m, i, &type, &sk, &id); i++) {
            uint32_t k;
            if (!state_index_find(&t->index, type, sk, &k)) {
                if (t->n_keys == t->cap) {
                    size_t cap = t->cap ? t->cap * 2 : 64;
                    const char **ty = realloc(t->type, cap * sizeof(*ty));
                    if (ty) t->type = ty;
                    const char **sks = realloc(t->state_key, cap * sizeof(*sks));
                    if (sks) t->state_key = sks;
                    const char **ids = realloc(t->ids, cap * ns * sizeof(*ids));
                    if (ids) t->ids = ids;
                    if (!ty || !sks || !ids) return sr_fail(c, STATE_RES_E_NOMEM, NULL, "Out of memory");
                    t->cap = cap;
                }
                k = (uint32_t)t->n_keys;
                if (state_index_add(&t->index, type, sk, k, NULL, NULL) != 0)
                    return sr_fail(c, STATE_RES_E_NOMEM, NULL, "Out of memory");
                t->type[k] = type;
                t->state_key[k] = sk;
                memset(&t->ids[(size_t)k * ns], 0, ns * sizeof(*t->ids));
                t->n_keys++;
            }
            t->ids[(size_t)k * ns + s] = id;
        }
    }
    return STATE_RES_OK;
}

/* The distinct non-NULL IDs of one key into out (room for n); their count. *absent: some
 * state lacks the key. */
static size_t distinct_ids(const char *const *ids, size_t n, const char **out, bool *absent)
{
    size_t d = 0;
    *absent = false;
    for (size_t s = 0; s < n; s++) {
        if (!ids[s]) {
            *absent = true;
            continue;
        }
        size_t j = 0;
        while (j < d && strcmp(out[j], ids[s]) != 0) j++;
        if (j == d) out[d++] = ids[s];
    }
    return d;
}

int sr_separate(sr_ctx *c, bool missing_is_conflict, state_map **unconflicted,
                sr_conflict **conflicts, size_t *n_conflicts)
{
    size_t ns = c->req->n_states;
    key_table t = {0};
    state_index_init(&t.index);
    state_map *u = state_map_new();
    sr_conflict *conf = NULL;
    size_t nc = 0;
    int rc = u ? collect_keys(c, &t) : sr_fail(c, STATE_RES_E_NOMEM, NULL, "Out of memory");
    if (rc == STATE_RES_OK && t.n_keys) {
        conf = calloc(t.n_keys, sizeof(*conf));
        if (!conf) rc = sr_fail(c, STATE_RES_E_NOMEM, NULL, "Out of memory");
    }
    for (size_t k = 0; rc == STATE_RES_OK && k < t.n_keys; k++) {
        const char **d = malloc(ns * sizeof(*d));
        if (!d) {
            rc = sr_fail(c, STATE_RES_E_NOMEM, NULL, "Out of memory");
            break;
        }
        bool absent;
        size_t n = distinct_ids(&t.ids[k * ns], ns, d, &absent);
        if (n == 1 && !(absent && missing_is_conflict)) {
            if (state_map_set(u, t.type[k], t.state_key[k], d[0]) != 0)
                rc = sr_fail(c, STATE_RES_E_NOMEM, NULL, "Out of memory");
            free(d);
            continue;
        }
        conf[nc++] = (sr_conflict){.type = t.type[k], .state_key = t.state_key[k], .ids = d, .n = n};
    }
    state_index_destroy(&t.index);
    free(t.type);
    free(t.state_key);
    free(t.ids);
    if (rc != STATE_RES_OK) {
        state_map_free(u);
        sr_conflicts_free(conf, nc);
        return rc;
    }
    c->rep->conflicted_keys = nc;
    *unconflicted = u;
    *conflicts = conf;
    *n_conflicts = nc;
    return STATE_RES_OK;
}

/* ---- one authorization check ----------------------------------------------------------- */

typedef struct sr_getter {
    sr_ctx *c;
    uint32_t e;
    const state_map *r;
    bool auth_fallback;
    const char *over_type, *over_state_key;
    uint32_t over_event;
    int rc; /* a load failure inside the getter */
} sr_getter;

static const json_t *state_get(void *ctx, const char *type, const char *state_key)
{
    sr_getter *g = ctx;
    sr_ctx *c = g->c;
    if (g->over_type && strcmp(type, g->over_type) == 0 && strcmp(state_key, g->over_state_key) == 0)
        return c->ev[g->over_event].pdu;
    const char *id = state_map_get(g->r, type, state_key);
    if (id) {
        uint32_t at;
        int rc = sr_load(c, id, &at);
        if (rc != STATE_RES_OK) {
            if (g->rc == STATE_RES_OK) g->rc = rc;
            return NULL;
        }
        if (!c->ev[at].rejected) return c->ev[at].pdu;
    }
    if (!g->auth_fallback) return NULL;
    uint32_t a = sr_auth_event_at(c, g->e, type, state_key);
    return a != SR_NONE && !c->ev[a].rejected ? c->ev[a].pdu : NULL;
}

int sr_allowed(sr_ctx *c, uint32_t e, const state_map *r, bool auth_fallback,
               const char *over_type, const char *over_state_key, uint32_t over_event,
               bool *allowed)
{
    if (auth_fallback) {
        int rc = sr_load_auth(c, e);
        if (rc != STATE_RES_OK) return rc;
    }
    sr_getter g = {.c = c, .e = e, .r = r, .auth_fallback = auth_fallback,
                   .over_type = over_type, .over_state_key = over_state_key,
                   .over_event = over_event};
    char why[ROOM_AUTH_WHY_LEN];
    *allowed = room_auth_check_event(c->v, c->ev[e].pdu, state_get, &g, why);
    if (g.rc != STATE_RES_OK) return g.rc;
    c->rep->auth_checks++;
    if (!*allowed) c->rep->auth_refused++;
    return STATE_RES_OK;
}

/* ---- the entry point ------------------------------------------------------------------- */

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static int resolve(sr_ctx *c, state_map **out)
{
    const state_res_request *req = c->req;
    c->rep->algorithm = state_res_algorithm_of(req->version);
    if (c->rep->algorithm == STATE_RES_NONE)
        return sr_fail(c, STATE_RES_E_VERSION, NULL, "No state resolution for room version %.32s",
                       req->version && req->version->id ? req->version->id : "(none)");
    if (req->n_states > STATE_RES_MAX_STATES)
        return sr_fail(c, STATE_RES_E_TOO_LARGE, NULL, "%zu states to resolve, more than %d",
                       req->n_states, STATE_RES_MAX_STATES);
    if (req->n_states == 0) {
        *out = state_map_new();
        return *out ? STATE_RES_OK : sr_fail(c, STATE_RES_E_NOMEM, NULL, "Out of memory");
    }
    bool v2 = c->rep->algorithm == STATE_RES_V2;
    state_map *unconflicted;
    sr_conflict *conflicts;
    size_t nc;
    int rc = sr_separate(c, v2, &unconflicted, &conflicts, &nc);
    if (rc != STATE_RES_OK) return rc;
    if (nc == 0) { /* nothing to resolve: no conflict, and (v2) so no auth difference */
        *out = unconflicted;
        sr_conflicts_free(conflicts, nc);
        return STATE_RES_OK;
    }
    rc = v2 ? sr_resolve_v2(c, unconflicted, conflicts, nc, out)
            : sr_resolve_v1(c, unconflicted, conflicts, nc, out);
    state_map_free(unconflicted);
    sr_conflicts_free(conflicts, nc);
    return rc;
}

int state_res_resolve(const state_res_request *req, state_map **out, state_res_report *report)
{
    RT_ASSERT(req && out && report, "state_res_resolve needs a request, an out and a report");
    RT_ASSERT(req->n_states == 0 || (req->states && req->load),
              "state_res_resolve: %zu states but no state array or no loader", req->n_states);
    uint64_t t0 = now_us();
    memset(report, 0, sizeof(*report));
    *out = NULL;
    sr_ctx c = {.req = req, .v = req->version, .rep = report,
                .max_events = req->max_events ? req->max_events : STATE_RES_MAX_EVENTS_DEFAULT};
    if (c.max_events > STATE_INDEX_MAX_ENTRIES) c.max_events = STATE_INDEX_MAX_ENTRIES;
    state_index_init(&c.ids);
    int rc = resolve(&c, out);
    if (rc != STATE_RES_OK) {
        state_map_free(*out);
        *out = NULL;
    }
    for (size_t i = 0; i < c.n; i++) {
        json_decref(c.ev[i].pdu);
        free(c.ev[i].auth);
    }
    free(c.ev);
    state_index_destroy(&c.ids);
    report->elapsed_us = now_us() - t0;
    return rc;
}
