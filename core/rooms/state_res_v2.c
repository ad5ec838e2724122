/*
 * core/rooms/state_res_v2.c - state resolution v2, the algorithm of room versions 2 to 11
 * (the spec's "State resolution" section of room version 2, unchanged up to version 11).
 *
 * The steps, each one function below:
 *   1. full_conflicted_set: the conflicted events plus the auth difference, the events in
 *      the auth chain of some states but not of all. Each state's full auth chain is one
 *      walk that sets that state's bit on every event it reaches (the states' own events
 *      are not in their chains unless something cites them), so an event is in the auth
 *      difference when some but not all bits are set. This loads every state's events and
 *      their whole auth chains, the part of a resolution that the max_events bound exists
 *      for.
 *   2. power_order: the power events of the full conflicted set, with the events of their
 *      auth chains that are also in it, sorted by the reverse topological power ordering:
 *      Kahn's algorithm over the auth DAG, taking among the events whose auth events are
 *      all placed the one whose sender has the greatest power level (as the event's own
 *      auth events give it), then the smallest origin_server_ts, then the smallest event ID.
 *   3. iterate: the iterative auth checks, from the unconflicted state, over that list.
 *   4. mainline_order: the other events of the full conflicted set, ordered by their
 *      position on the mainline of the power levels the partially resolved state holds
 *      (the chain of m.room.power_levels events each citing the previous one), events
 *      based on an earlier power-levels event first, then by origin_server_ts, then by
 *      event ID; then the iterative auth checks again, over them.
 *   5. the unconflicted state, laid over the result.
 *
 * In the iterative auth checks an event is checked against the state resolved so far; a
 * key the rules ask for that this state lacks is answered by the event's own auth event of
 * that key, unless that event was rejected.
 *
 * Where Synapse (which most of the network runs) reads the spec differently, this follows
 * Synapse, so a room's servers agree; each place says so:
 *   - m.room.create counts as a power event besides the spec's power levels, join rules
 *     and kicks or bans ("Power events" in room version 2's "State resolution");
 *   - the auth chain of a power event is walked only through events of the full
 *     conflicted set (step 1 of "Algorithm"), in building both the set sorted in step 2
 *     and the DAG it is sorted by;
 *   - an event this server rejected is never admitted by the iterative auth checks, where
 *     the spec's "Rejected events" would re-check it;
 *   - for the power ordering, the sender of an event citing no power levels counts 100
 *     only when the create event's content.creator names it, so never in room version 11,
 *     whose create event has no creator ("Reverse topological power ordering" reads the
 *     level "when looking at their auth_events", which the auth rules give the create
 *     event's sender in version 11). Only the room's first events cite no power levels.
 * Cycles (impossible with hash-derived event IDs, possible in a hostile DAG with the free
 * IDs of versions 1 and 2) fail the resolution rather than loop.
 */
#include <stdlib.h>
#include <string.h>

#include "core/rooms/room_auth.h"
#include "core/rooms/state_res_internal.h"

#define SR_MAINLINE_IN_WALK (-2)
#define SR_MAINLINE_NONE INT64_MAX /* the spec's infinity: no power levels on the mainline */

/* ---- a growable list of event positions ------------------------------------------------ */

typedef struct u32vec {
    uint32_t *v;
    size_t n, cap;
} u32vec;

static int push(sr_ctx *c, u32vec *s, uint32_t x)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        uint32_t *grown = realloc(s->v, cap * sizeof(*grown));
        if (!grown) return sr_fail(c, STATE_RES_E_NOMEM, NULL, "Out of memory");
        s->v = grown;
        s->cap = cap;
    }
    s->v[s->n++] = x;
    return STATE_RES_OK;
}

static bool is(const char *a, const char *b)
{
    return a && b && strcmp(a, b) == 0;
}

/* ---- step 1 ---------------------------------------------------------------------------- */

/* Load the events of state s, each checked to sit at its own key, and mark the events of
 * its full auth chain with bit s. */
static int walk_auth_chain(sr_ctx *c, size_t s, u32vec *stack)
{
    const uint64_t bit = (uint64_t)1 << s;
    const char *type, *sk, *id;
    stack->n = 0;
    for (size_t i = 0; state_map_entry(c->req->states[s], i, &type, &sk, &id); i++) {
        uint32_t e;
        int rc = sr_load(c, id, &e);
        if (rc == STATE_RES_OK && (!is(c->ev[e].type, type) || !is(c->ev[e].state_key, sk)))
            rc = sr_fail(c, STATE_RES_E_BAD_EVENT, id, "Event %.80s is not the state event at "
                         "(%.64s, %.64s)", id, type, sk);
        if (rc == STATE_RES_OK) rc = sr_load_auth(c, e);
        for (uint32_t j = 0; rc == STATE_RES_OK && j < c->ev[e].n_auth; j++)
            rc = push(c, stack, c->ev[e].auth[j]);
        if (rc != STATE_RES_OK) return rc;
    }
    while (stack->n) {
        uint32_t x = stack->v[--stack->n];
        if (c->ev[x].chains & bit) continue;
        c->ev[x].chains |= bit;
        int rc = sr_load_auth(c, x);
        for (uint32_t j = 0; rc == STATE_RES_OK && j < c->ev[x].n_auth; j++)
            if (!(c->ev[c->ev[x].auth[j]].chains & bit)) rc = push(c, stack, c->ev[x].auth[j]);
        if (rc != STATE_RES_OK) return rc;
    }
    return STATE_RES_OK;
}

/* The full conflicted set into full, in load order. */
static int full_conflicted_set(sr_ctx *c, const sr_conflict *conflicts, size_t nc, u32vec *full)
{
    u32vec stack = {0};
    int rc = STATE_RES_OK;
    size_t ns = c->req->n_states;
    for (size_t s = 0; rc == STATE_RES_OK && s < ns; s++) rc = walk_auth_chain(c, s, &stack);
    free(stack.v);
    for (size_t k = 0; rc == STATE_RES_OK && k < nc; k++)
        for (size_t i = 0; rc == STATE_RES_OK && i < conflicts[k].n; i++) {
            uint32_t e;
            rc = sr_load(c, conflicts[k].ids[i], &e);
            if (rc == STATE_RES_OK) c->ev[e].conflicted = true;
        }
    if (rc != STATE_RES_OK) return rc;
    const uint64_t all = ns == 64 ? UINT64_MAX : ((uint64_t)1 << ns) - 1;
    for (size_t e = 0; e < c->n; e++) {
        sr_event *ev = &c->ev[e];
        ev->in_full = ev->conflicted || (ev->chains != 0 && ev->chains != all);
        if (ev->in_full && (rc = push(c, full, (uint32_t)e)) != STATE_RES_OK) return rc;
    }
    c->rep->full_conflicted = full->n;
    return STATE_RES_OK;
}

/* ---- step 2 ---------------------------------------------------------------------------- */

/* A power event: one that may take away someone's ability to act. Synapse counts the
 * create event too (see the top of this file). */
static bool is_power_event(const sr_event *e)
{
    if (!e->state_key) return false;
    if (e->state_key[0] == '\0' &&
        (is(e->type, "m.room.power_levels") || is(e->type, "m.room.join_rules") ||
         is(e->type, "m.room.create")))
        return true;
    if (!is(e->type, "m.room.member")) return false;
    const char *m = json_string_value(json_object_get(json_object_get(e->pdu, "content"),
                                                      "membership"));
    return (is(m, "leave") || is(m, "ban")) && !is(e->sender, e->state_key);
}

/* The sender's power level as the event's own auth events (power levels, create) give it.
 * Without power levels among them, Synapse's creator is content.creator (see the top of
 * this file). */
static int64_t sender_power(const sr_ctx *c, uint32_t e)
{
    uint32_t pl = sr_auth_event_at(c, e, "m.room.power_levels", "");
    uint32_t create = sr_auth_event_at(c, e, "m.room.create", "");
    const char *sender = c->ev[e].sender;
    if (pl == SR_NONE) {
        const json_t *content = create != SR_NONE ? json_object_get(c->ev[create].pdu, "content") : NULL;
        return is(json_string_value(json_object_get(content, "creator")), sender)
                   ? ROOM_AUTH_CREATOR_LEVEL_NO_PL : 0;
    }
    room_auth_state st = {
        .version = c->v,
        .create = create != SR_NONE ? c->ev[create].pdu : NULL,
        .power_levels = json_object_get(c->ev[pl].pdu, "content"),
    };
    return room_auth_user_level(&st, sender);
}

/* The order of the reverse topological power ordering: x before y. */
typedef struct power_key {
    int64_t power, ts;
    const char *id;
} power_key;

static bool power_before(const power_key *x, const power_key *y)
{
    if (x->power != y->power) return x->power > y->power;
    if (x->ts != y->ts) return x->ts < y->ts;
    return strcmp(x->id, y->id) < 0;
}

/* A binary heap of node numbers, smallest by power_before on top. */
typedef struct heap {
    uint32_t *v;
    size_t n;
    const power_key *keys;
} heap;

static void heap_push(heap *h, uint32_t x)
{
    size_t i = h->n++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!power_before(&h->keys[x], &h->keys[h->v[up]])) break;
        h->v[i] = h->v[up];
        i = up;
    }
    h->v[i] = x;
}

static uint32_t heap_pop(heap *h)
{
    uint32_t top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const power_key *km = &h->keys[last];
        if (l < h->n && power_before(&h->keys[h->v[l]], km)) m = l;
        if (r < h->n && power_before(&h->keys[h->v[r]], m == i ? km : &h->keys[h->v[m]])) m = r;
        if (m == i) break;
        h->v[i] = h->v[m];
        i = m;
    }
    if (h->n) h->v[i] = last;
    return top;
}

/* The power events of the full conflicted set and the events of the set their auth chains
 * reach through it (Synapse's reading, see the top of this file), flagged in_power, into
 * nodes. */
static int power_set(sr_ctx *c, const u32vec *full, u32vec *nodes)
{
    u32vec stack = {0};
    int rc = STATE_RES_OK;
    for (size_t i = 0; rc == STATE_RES_OK && i < full->n; i++)
        if (is_power_event(&c->ev[full->v[i]])) rc = push(c, &stack, full->v[i]);
    while (rc == STATE_RES_OK && stack.n) {
        uint32_t x = stack.v[--stack.n];
        if (c->ev[x].in_power) continue;
        c->ev[x].in_power = true;
        rc = push(c, nodes, x);
        if (rc == STATE_RES_OK) rc = sr_load_auth(c, x);
        for (uint32_t j = 0; rc == STATE_RES_OK && j < c->ev[x].n_auth; j++) {
            const sr_event *a = &c->ev[c->ev[x].auth[j]];
            if (a->in_full && !a->in_power) rc = push(c, &stack, c->ev[x].auth[j]);
        }
    }
    free(stack.v);
    return rc;
}

/* Sort nodes (in_power events) into order by the reverse topological power ordering. */
static int power_order(sr_ctx *c, const u32vec *nodes, u32vec *order)
{
    size_t n = nodes->n;
    if (n == 0) return STATE_RES_OK;
    uint32_t *local = malloc(c->n * sizeof(*local));     /* event -> node number */
    uint32_t *outdeg = calloc(n, sizeof(*outdeg));       /* auth events not yet placed */
    size_t *first = calloc(n + 1, sizeof(*first));       /* cited-by lists, CSR */
    power_key *keys = malloc(n * sizeof(*keys));
    uint32_t *heapv = malloc(n * sizeof(*heapv));
    uint32_t *cited_by = NULL;
    int rc = STATE_RES_OK;
    if (!local || !outdeg || !first || !keys || !heapv) {
        rc = sr_fail(c, STATE_RES_E_NOMEM, NULL, "Out of memory");
        goto done;
    }
    for (size_t e = 0; e < c->n; e++) local[e] = SR_NONE;
    for (size_t i = 0; i < n; i++) local[nodes->v[i]] = (uint32_t)i;
    size_t edges = 0;
    for (size_t i = 0; i < n; i++) {
        const sr_event *x = &c->ev[nodes->v[i]];
        keys[i] = (power_key){.power = sender_power(c, nodes->v[i]), .ts = x->ts, .id = x->id};
        for (uint32_t j = 0; j < x->n_auth; j++) {
            uint32_t a = local[x->auth[j]];
            if (a == SR_NONE) continue;
            outdeg[i]++;
            first[a + 1]++;
            edges++;
        }
    }
    for (size_t i = 0; i < n; i++) first[i + 1] += first[i];
    cited_by = malloc((edges ? edges : 1) * sizeof(*cited_by));
    size_t *fill = calloc(n, sizeof(*fill));
    if (!cited_by || !fill) {
        free(fill);
        rc = sr_fail(c, STATE_RES_E_NOMEM, NULL, "Out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        const sr_event *x = &c->ev[nodes->v[i]];
        for (uint32_t j = 0; j < x->n_auth; j++) {
            uint32_t a = local[x->auth[j]];
            if (a != SR_NONE) cited_by[first[a] + fill[a]++] = (uint32_t)i;
        }
    }
    free(fill);
    heap h = {.v = heapv, .keys = keys};
    for (size_t i = 0; i < n; i++)
        if (outdeg[i] == 0) heap_push(&h, (uint32_t)i);
    while (rc == STATE_RES_OK && h.n) {
        uint32_t x = heap_pop(&h);
        rc = push(c, order, nodes->v[x]);
        for (size_t k = first[x]; k < first[x + 1]; k++)
            if (--outdeg[cited_by[k]] == 0) heap_push(&h, cited_by[k]);
    }
    if (rc == STATE_RES_OK && order->n < n) {
        uint32_t stuck = 0;
        while (outdeg[stuck] == 0) stuck++;
        rc = sr_fail(c, STATE_RES_E_BAD_EVENT, c->ev[nodes->v[stuck]].id,
                     "The auth events of %.80s form a cycle", c->ev[nodes->v[stuck]].id);
    }
    c->rep->power_sorted = order->n;
done:
    free(local);
    free(outdeg);
    free(first);
    free(keys);
    free(heapv);
    free(cited_by);
    return rc;
}

/* ---- steps 3 and 4 --------------------------------------------------------------------- */

/* The iterative auth checks: each state event of list, in order, into r when the rules
 * allow it in r (with the event's own auth events for keys r lacks). */
static int iterate(sr_ctx *c, state_map *r, const u32vec *list)
{
    for (size_t i = 0; i < list->n; i++) {
        uint32_t e = list->v[i];
        /* Synapse keeps rejected events out (see the top of this file). */
        if (!c->ev[e].state_key || c->ev[e].rejected) continue;
        bool ok;
        int rc = sr_allowed(c, e, r, true, NULL, NULL, 0, &ok);
        if (rc != STATE_RES_OK) return rc;
        const sr_event *ev = &c->ev[e];
        if (ok && state_map_set(r, ev->type, ev->state_key, ev->id) != 0)
            return sr_fail(c, STATE_RES_E_NOMEM, NULL, "Out of memory");
    }
    return STATE_RES_OK;
}

static uint32_t pl_auth_event(sr_ctx *c, uint32_t e, int *rc)
{
    *rc = sr_load_auth(c, e);
    return *rc == STATE_RES_OK ? sr_auth_event_at(c, e, "m.room.power_levels", "") : SR_NONE;
}

/* Number the mainline of the power levels at r: 0 for r's, 1 for the one it cites, ... */
static int number_mainline(sr_ctx *c, const state_map *r)
{
    const char *pl_id = state_map_get(r, "m.room.power_levels", "");
    if (!pl_id) return STATE_RES_OK;
    uint32_t p;
    int rc = sr_load(c, pl_id, &p);
    for (int64_t i = 0; rc == STATE_RES_OK && p != SR_NONE; i++) {
        if (c->ev[p].mainline != SR_MAINLINE_UNKNOWN)
            return sr_fail(c, STATE_RES_E_BAD_EVENT, c->ev[p].id, "The power levels of %.80s "
                           "form a cycle", c->ev[p].id);
        c->ev[p].mainline = i;
        p = pl_auth_event(c, p, &rc);
    }
    return rc;
}

/* The first mainline number on the chain of power levels from q (q itself, the one it
 * cites, ...), or SR_MAINLINE_NONE: memoized on every event of the walk. */
static int mainline_from(sr_ctx *c, uint32_t q, u32vec *path, int64_t *pos)
{
    int rc = STATE_RES_OK;
    path->n = 0;
    while (q != SR_NONE && c->ev[q].mainline == SR_MAINLINE_UNKNOWN) {
        c->ev[q].mainline = SR_MAINLINE_IN_WALK;
        if ((rc = push(c, path, q)) != STATE_RES_OK) return rc;
        q = pl_auth_event(c, q, &rc);
        if (rc != STATE_RES_OK) return rc;
    }
    if (q != SR_NONE && c->ev[q].mainline == SR_MAINLINE_IN_WALK)
        return sr_fail(c, STATE_RES_E_BAD_EVENT, c->ev[q].id, "The power levels of %.80s form "
                       "a cycle", c->ev[q].id);
    *pos = q == SR_NONE ? SR_MAINLINE_NONE : c->ev[q].mainline;
    for (size_t i = 0; i < path->n; i++) c->ev[path->v[i]].mainline = *pos;
    return STATE_RES_OK;
}

typedef struct mainline_key {
    int64_t pos, ts;
    const char *id;
    uint32_t e;
} mainline_key;

/* x before y: based on an earlier power-levels event (greater position), then older, then
 * the smaller ID. */
static int mainline_cmp(const void *a, const void *b)
{
    const mainline_key *x = a, *y = b;
    if (x->pos != y->pos) return x->pos > y->pos ? -1 : 1;
    if (x->ts != y->ts) return x->ts < y->ts ? -1 : 1;
    return strcmp(x->id, y->id);
}

/* The events of full not in the power order, into list by the mainline ordering of the
 * power levels at r. */
static int mainline_order(sr_ctx *c, const state_map *r, const u32vec *full, u32vec *list)
{
    int rc = number_mainline(c, r);
    size_t n = 0;
    mainline_key *keys = rc == STATE_RES_OK ? malloc((full->n ? full->n : 1) * sizeof(*keys)) : NULL;
    if (rc == STATE_RES_OK && !keys) rc = sr_fail(c, STATE_RES_E_NOMEM, NULL, "Out of memory");
    u32vec path = {0};
    for (size_t i = 0; rc == STATE_RES_OK && i < full->n; i++) {
        uint32_t e = full->v[i];
        if (c->ev[e].in_power) continue;
        int64_t pos = SR_MAINLINE_NONE;
        uint32_t q = pl_auth_event(c, e, &rc); /* e itself does not count, only what it cites */
        if (rc == STATE_RES_OK && q != SR_NONE) rc = mainline_from(c, q, &path, &pos);
        if (rc == STATE_RES_OK)
            keys[n++] = (mainline_key){.pos = pos, .ts = c->ev[e].ts, .id = c->ev[e].id, .e = e};
    }
    free(path.v);
    if (rc == STATE_RES_OK) {
        qsort(keys, n, sizeof(*keys), mainline_cmp);
        for (size_t i = 0; rc == STATE_RES_OK && i < n; i++) rc = push(c, list, keys[i].e);
    }
    free(keys);
    return rc;
}

/* ---- the algorithm --------------------------------------------------------------------- */

int sr_resolve_v2(sr_ctx *c, const state_map *unconflicted, const sr_conflict *conflicts,
                  size_t n_conflicts, state_map **out)
{
    u32vec full = {0}, nodes = {0}, order = {0}, rest = {0};
    state_map *r = NULL;
    int rc = full_conflicted_set(c, conflicts, n_conflicts, &full);
    if (rc == STATE_RES_OK) rc = power_set(c, &full, &nodes);
    if (rc == STATE_RES_OK) rc = power_order(c, &nodes, &order);
    if (rc == STATE_RES_OK && !(r = state_map_copy(unconflicted)))
        rc = sr_fail(c, STATE_RES_E_NOMEM, NULL, "Out of memory");
    if (rc == STATE_RES_OK) rc = iterate(c, r, &order);
    if (rc == STATE_RES_OK) rc = mainline_order(c, r, &full, &rest);
    if (rc == STATE_RES_OK) rc = iterate(c, r, &rest);
    const char *type, *sk, *id;
    for (size_t i = 0; rc == STATE_RES_OK && state_map_entry(unconflicted, i, &type, &sk, &id); i++)
        if (state_map_set(r, type, sk, id) != 0) rc = sr_fail(c, STATE_RES_E_NOMEM, NULL, "Out of memory");
    free(full.v);
    free(nodes.v);
    free(order.v);
    free(rest.v);
    if (rc != STATE_RES_OK) {
        state_map_free(r);
        return rc;
    }
    *out = r;
    return STATE_RES_OK;
}
