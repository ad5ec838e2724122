/*
 * core/client/sync/ssync_reads.c - the timelines, bundled relations, required_state and
 * num_live of a sliding sync window, read for all its rooms at once: one query for the
 * timelines (each room's limit and visibility ranges passed as arrays, read with LATERAL),
 * one for required_state, one for num_live, instead of three or four per room
 * (docs/adr/0034-sliding-sync-reads-whole-window.md).
 *
 * Decisions owned here:
 *   - required_state: [type, state_key] pairs, '*' a wildcard for either, "$ME" the user's
 *     own state key, "$LAZY" (with m.room.member) the member events of the timeline's
 *     senders, sent with every timeline that has them (on an incremental result also
 *     those that did not change since the room was sent).
 *   - num_live: the timeline's events after the connection's previous position.
 * The rules it applies stay where they live: history visibility (rooms_vis_window_many,
 * core/rooms/rooms_vis.c), the timeline's (sync_rooms.c: current state shown where it falls,
 * ignored users, and the rule for a hidden state event inside the timeline's span, for
 * which such a room is read again with sync_room_timeline), bundles (crooms_bundle_add,
 * called only for the rooms whose timeline has an event with relations).
 * What it does not do: decide what a room's result holds (ssync_room.c).
 */
#include <stdlib.h>
#include <string.h>

#include "core/client/rooms/crooms_relations.h"
#include "core/client/sync/ssync.h"

#define LAZY "$LAZY"
#define ME "$ME"
#define WILD "*"

/* The timelines of $1 (rooms) with $2 (limit + 1 each); from $3 the visibility condition,
 * the timeline filter and the ignored users. The positions are picked first (newest first,
 * an index scan of the room backwards that stops at the limit), then rendered by primary
 * key (LIMIT 1, a no-op on the key, keeps the planner from joining the whole events table
 * to them at once). Per row: the event (EVENTS_SELECT's columns), the room's index, and
 * whether any relation points at the event.
 * Current state that history visibility hides is not read here: such an event inside the
 * picked span leaves the span not covered by what the user sees, and timelines_finish reads
 * that room again by sync_rooms.c's rule, which shows it where it falls
 * (docs/adr/0022-current-state-in-sync-timelines.md); one outside the span is older than
 * the timeline's start either way. Reading it here too (an OR in the scan) made every
 * room's scan a bitmap scan of its whole history. */
#define TIMELINES_SQL                                                                          \
    "SELECT x.*, q.k, EXISTS (SELECT 1 FROM event_relations rel WHERE rel.relates_to = x.c1)" \
    " FROM unnest($1::text[], $2::bigint[]) WITH ORDINALITY q(room, lim, k)"                  \
    " CROSS JOIN LATERAL (SELECT e.stream_pos AS pos FROM events e WHERE e.room_id = q.room"   \
    "  %s%s%s ORDER BY e.stream_pos DESC LIMIT q.lim) t"                                      \
    " CROSS JOIN LATERAL (" EVENTS_SELECT "WHERE e.stream_pos = t.pos LIMIT 1) AS x(c0, c1)"   \
    " ORDER BY q.k, x.c0 DESC"
enum { TL_VIS = 2, TL_FILTER = TL_VIS + ROOMS_VIS_MANY_PARAMS, TL_IGNORED = TL_FILTER + 4, TL_N };

/* Per request k of $1..$4 (room, after, every member, every type): the newest state event
 * per (type, state_key) with after < pos <= $5, of the types of $6/$7 (k, type) and the
 * members of $8/$9 (k, user) unless every one; events_state_between's rule, the filters
 * applied before picking the newest (they are on its key, so the answer is the same). */
static const char STATE_SQL[] =
    "SELECT x.*, q.k FROM unnest($1::text[], $2::bigint[], $3::boolean[], $4::boolean[])"
    " WITH ORDINALITY q(room, after, allm, allt, k)"
    " CROSS JOIN LATERAL (SELECT DISTINCT ON (s.type, s.state_key) s.stream_pos AS pos"
    "  FROM events s WHERE s.room_id = q.room AND s.state_key IS NOT NULL"
    "  AND s.stream_pos <= $5::bigint AND s.stream_pos > q.after"
    "  AND (q.allt OR s.type IN (SELECT t.v FROM unnest($6::bigint[], $7::text[]) t(k, v) WHERE t.k = q.k))"
    "  AND (q.allm OR s.type <> 'm.room.member' OR s.state_key IN"
    "   (SELECT m.v FROM unnest($8::bigint[], $9::text[]) m(k, v) WHERE m.k = q.k))"
    "  ORDER BY s.type, s.state_key, s.stream_pos DESC) st"
    " CROSS JOIN LATERAL (" EVENTS_SELECT "WHERE e.stream_pos = st.pos LIMIT 1) AS x(c0)"
    " ORDER BY q.k, x.c0";

typedef struct state_wants {
    const json_t *pairs;
    bool lazy;        /* ["m.room.member", "$LAZY"] */
    bool all_types;   /* a ["*", ...] pair: no type restriction */
    bool all_members; /* every member event may be wanted */
    json_t *types;    /* the named types (when !all_types) */
    json_t *members;  /* the named member state keys (when !all_members) */
} state_wants;

static bool is(const json_t *v, const char *s)
{
    return json_is_string(v) && strcmp(json_string_value(v), s) == 0;
}

static void wants_init(sync_ctx *s, const json_t *pairs, state_wants *w)
{
    *w = (state_wants){.pairs = pairs, .types = json_array(), .members = json_array()};
    size_t i;
    const json_t *p;
    json_array_foreach(pairs, i, p)
    {
        const json_t *type = json_array_get(p, 0), *key = json_array_get(p, 1);
        bool member = is(type, "m.room.member") || is(type, WILD);
        if (is(type, WILD)) w->all_types = true;
        else json_array_append(w->types, (json_t *)type);
        if (is(type, "m.room.member") && is(key, LAZY)) w->lazy = true;
        else if (member && is(key, WILD)) w->all_members = true;
        else if (member && is(key, ME)) json_array_append_new(w->members, json_string(s->user));
        else if (member) json_array_append(w->members, (json_t *)key);
    }
}

static void wants_free(state_wants *w)
{
    json_decref(w->types);
    json_decref(w->members);
}

/* Does one pair of the request want this state event? lazy: the lazy members' IDs. */
static bool state_wanted(const sync_ctx *s, const state_wants *w, const json_t *ev, const json_t *lazy)
{
    const char *type = json_string_value(json_object_get(ev, "type"));
    const char *key = json_string_value(json_object_get(ev, "state_key"));
    if (!type || !key) return false;
    size_t i;
    const json_t *p;
    json_array_foreach(w->pairs, i, p)
    {
        const json_t *pt = json_array_get(p, 0), *pk = json_array_get(p, 1);
        if (!is(pt, WILD) && !is(pt, type)) continue;
        if (is(pk, WILD) || is(pk, key) || (is(pk, ME) && strcmp(key, s->user) == 0)) return true;
        if (is(pk, LAZY) && strcmp(type, "m.room.member") == 0) {
            size_t j;
            const json_t *u;
            json_array_foreach(lazy, j, u)
            {
                if (is(u, key)) return true;
            }
        }
    }
    return false;
}

/* The distinct senders of a timeline. */
static json_t *senders_of(const json_t *events)
{
    json_t *set = json_object(), *out = json_array();
    size_t i;
    const json_t *ev;
    json_array_foreach(events, i, ev)
    {
        const char *who = json_string_value(json_object_get(ev, "sender"));
        if (who && !json_object_get(set, who)) {
            json_object_set_new(set, who, json_true());
            json_array_append_new(out, json_string(who));
        }
    }
    json_decref(set);
    return out;
}

static void append_unique(json_t *out, json_t *events)
{
    size_t i, j;
    json_t *ev, *have;
    json_array_foreach(events, i, ev)
    {
        bool dup = false;
        json_array_foreach(out, j, have)
        {
            if (json_equal(json_object_get(have, "event_id"), json_object_get(ev, "event_id"))) dup = true;
        }
        if (!dup) json_array_append(out, ev);
    }
}

/* A PostgreSQL array literal of the values of a JSON array (numbers or strings). */
static const char *arr(sync_ctx *s, const json_t *a)
{
    return rooms_pg_array(s->r->arena, a);
}

/* ---- timelines ---------------------------------------------------------------------- */

/* The rows of TIMELINES_SQL into the member plans m[0..n) (rows grouped by room, newest
 * first); bundled[i]: some kept event of room i has relations. */
static void timeline_rows(sync_ctx *s, PGresult *res, ssync_plan **m, int n, bool *bundled)
{
    int rows = PQntuples(res), col_k = PQnfields(res) - 2;
    for (int start = 0; start < rows;) {
        int i = atoi(PQgetvalue(res, start, col_k)) - 1, end = start;
        while (end < rows && atoi(PQgetvalue(res, end, col_k)) - 1 == i) end++;
        if (i >= 0 && i < n) {
            ssync_plan *p = m[i];
            int keep = end - start;
            if (keep > p->limit) {
                p->t.limited = true; /* one more than the limit exists */
                keep = (int)p->limit;
            }
            s->view.reader = p->vis;
            for (int row = start + keep; row-- > start;) {
                json_t *ev = events_render(&s->view, res, row);
                if (ev) json_array_append_new(p->t.events, ev);
                if (PQgetvalue(res, row, col_k + 1)[0] == 't') bundled[i] = true;
            }
            if (keep > 0) p->t.first_pos = events_pos(res, start + keep - 1);
        }
        start = end;
    }
    s->view.reader = NULL;
}

/* After the window's query: bundles where there are relations, and the rooms whose
 * timeline spans a hidden state event read again by sync_rooms.c's rule. */
static int timelines_finish(sync_ctx *s, ssync_plan **m, int n, const bool *bundled)
{
    int rc = ROOMS_OK;
    for (int i = 0; rc >= 0 && i < n; i++) {
        ssync_plan *p = m[i];
        s->view.reader = p->vis;
        if (p->t.first_pos && !rooms_vis_covers(p->vis, p->t.first_pos, s->upto)) {
            json_decref(p->t.events);
            s->timeline_limit = p->limit;
            rc = sync_room_timeline(s, p->room_id, p->vis, p->tl_lo, s->upto, &p->t);
        } else if (bundled[i]) {
            rc = crooms_bundle_add(s->c, s->r->arena, &s->view, p->room_id, p->vis, p->t.events);
        }
    }
    s->view.reader = NULL;
    return rc;
}

static int timelines(sync_ctx *s, ssync_plan **m, int n)
{
    json_t *ids = json_array(), *lims = json_array();
    const rooms_vis **vis = calloc((size_t)n, sizeof(*vis));
    int64_t *lo = calloc((size_t)n, sizeof(*lo)), *hi = calloc((size_t)n, sizeof(*hi));
    bool *open = calloc((size_t)n, sizeof(*open)), *bundled = calloc((size_t)n, sizeof(*bundled));
    int rc = vis && lo && hi && open && bundled ? ROOMS_OK : ROOMS_E_DB;
    const char *p[TL_N] = {0}, *vis_sql = NULL;
    for (int i = 0; rc == ROOMS_OK && i < n; i++) {
        m[i]->t = (sync_timeline){json_array(), false, 0};
        vis[i] = m[i]->vis;
        lo[i] = m[i]->tl_lo;
        hi[i] = s->upto;
    }
    if (rc == ROOMS_OK && !rooms_vis_window_many(s->r->arena, vis, lo, hi, n, TL_VIS + 1, "q.k", open,
                                                 &vis_sql, p + TL_VIS))
        rc = ROOMS_E_DB;
    for (int i = 0; rc == ROOMS_OK && i < n; i++) {
        json_array_append_new(ids, json_string(m[i]->room_id));
        /* A window where nothing can be visible reads nothing (not even current state). */
        json_array_append_new(lims, json_string(crooms_i64(s->r, open[i] ? m[i]->limit + 1 : 0)));
    }
    if (rc == ROOMS_OK) {
        p[0] = arr(s, ids);
        p[1] = arr(s, lims);
        p[TL_FILTER] = s->timeline.types;
        p[TL_FILTER + 1] = s->timeline.not_types;
        p[TL_FILTER + 2] = s->timeline.senders;
        p[TL_FILTER + 3] = s->timeline.not_senders;
        p[TL_IGNORED] = s->timeline.ignored;
        const char *sql = rt_arena_printf(s->r->arena, TIMELINES_SQL, vis_sql,
                                          rooms_filter_sql(s->r->arena, TL_FILTER + 1),
                                          rooms_ignored_sql(s->r->arena, TL_IGNORED + 1));
        PGresult *res = sql ? rooms_q(s->c, sql, TL_N, p, NULL) : NULL;
        if (!res) rc = ROOMS_E_DB;
        else timeline_rows(s, res, m, n, bundled);
        PQclear(res);
    }
    if (rc == ROOMS_OK) rc = timelines_finish(s, m, n, bundled);
    json_decref(ids);
    json_decref(lims);
    free(vis);
    free(lo);
    free(hi);
    free(open);
    free(bundled);
    return rc;
}

/* ---- required_state ------------------------------------------------------------------- */

/* One state read: of plan `plan`, the main one or (lazy) the timeline's senders' member
 * events whether or not they changed in the window. */
typedef struct state_req {
    int plan;
    bool lazy;
} state_req;

/* The arrays of STATE_SQL's parameters, one request at a time. */
typedef struct state_params {
    json_t *rooms, *after, *allm, *allt, *tk, *tv, *mk, *mv;
} state_params;

static void req_add(sync_ctx *s, state_params *sp, const char *room, int64_t after, const json_t *members,
                    const json_t *types)
{
    json_int_t k = (json_int_t)json_array_size(sp->rooms) + 1;
    json_array_append_new(sp->rooms, json_string(room));
    json_array_append_new(sp->after, json_string(crooms_i64(s->r, after)));
    json_array_append_new(sp->allm, json_string(members ? "f" : "t"));
    json_array_append_new(sp->allt, json_string(types ? "f" : "t"));
    size_t i;
    const json_t *v;
    json_array_foreach(types, i, v)
    {
        json_array_append_new(sp->tk, json_string(crooms_i64(s->r, k)));
        json_array_append(sp->tv, (json_t *)v);
    }
    json_array_foreach(members, i, v)
    {
        json_array_append_new(sp->mk, json_string(crooms_i64(s->r, k)));
        json_array_append(sp->mv, (json_t *)v);
    }
}

/* The requests of every plan into sp and reqs; lazy[i]: plan i's timeline senders. */
static int state_requests(sync_ctx *s, ssync_plan **m, int n, state_wants *w, json_t **lazy, state_params *sp,
                          state_req *reqs)
{
    int nr = 0;
    json_t *member_type = json_pack("[s]", "m.room.member");
    for (int i = 0; i < n; i++) {
        wants_init(s, m[i]->pairs, &w[i]);
        lazy[i] = w[i].lazy ? senders_of(m[i]->t.events) : json_array();
        if (json_array_size(m[i]->pairs) == 0) continue;
        if (w[i].all_types || json_array_size(w[i].types) > 0) {
            json_t *members = w[i].all_members ? NULL : json_deep_copy(w[i].members);
            if (members) json_array_extend(members, lazy[i]);
            req_add(s, sp, m[i]->room_id, m[i]->state_after, members, w[i].all_types ? NULL : w[i].types);
            json_decref(members);
            reqs[nr++] = (state_req){i, false};
        }
        if (m[i]->state_after > 0 && json_array_size(lazy[i]) > 0) {
            req_add(s, sp, m[i]->room_id, 0, lazy[i], member_type);
            reqs[nr++] = (state_req){i, true};
        }
    }
    json_decref(member_type);
    return nr;
}

/* The rows of STATE_SQL: each request's events into all[plan] (a lazy request's only when
 * not there already). */
static void state_rows(sync_ctx *s, PGresult *res, ssync_plan **m, const state_req *reqs, int nr, json_t **all)
{
    int rows = PQntuples(res), col_k = PQnfields(res) - 1;
    for (int start = 0; start < rows;) {
        int k = atoi(PQgetvalue(res, start, col_k)) - 1, end = start;
        while (end < rows && atoi(PQgetvalue(res, end, col_k)) - 1 == k) end++;
        if (k >= 0 && k < nr) {
            int i = reqs[k].plan;
            json_t *got = json_array();
            s->view.reader = m[i]->vis;
            for (int row = start; row < end; row++) {
                json_t *ev = events_render(&s->view, res, row);
                if (ev) json_array_append_new(got, ev);
            }
            if (reqs[k].lazy) append_unique(all[i], got);
            else json_array_extend(all[i], got);
            json_decref(got);
        }
        start = end;
    }
    s->view.reader = NULL;
}

static int required_states(sync_ctx *s, ssync_plan **m, int n)
{
    state_wants *w = calloc((size_t)n, sizeof(*w));
    json_t **lazy = calloc((size_t)n, sizeof(*lazy)), **all = calloc((size_t)n, sizeof(*all));
    state_req *reqs = calloc((size_t)n * 2, sizeof(*reqs));
    state_params sp = {json_array(), json_array(), json_array(), json_array(),
                       json_array(), json_array(), json_array(), json_array()};
    int rc = w && lazy && all && reqs ? ROOMS_OK : ROOMS_E_DB;
    int nr = rc == ROOMS_OK ? state_requests(s, m, n, w, lazy, &sp, reqs) : 0;
    for (int i = 0; rc == ROOMS_OK && i < n; i++) all[i] = json_array();
    if (rc == ROOMS_OK && nr > 0) {
        const char *p[9] = {arr(s, sp.rooms), arr(s, sp.after), arr(s, sp.allm), arr(s, sp.allt),
                            crooms_i64(s->r, s->upto), arr(s, sp.tk), arr(s, sp.tv), arr(s, sp.mk),
                            arr(s, sp.mv)};
        PGresult *res = rooms_q(s->c, STATE_SQL, 9, p, NULL);
        if (!res) rc = ROOMS_E_DB;
        else state_rows(s, res, m, reqs, nr, all);
        PQclear(res);
    }
    for (int i = 0; rc == ROOMS_OK && i < n; i++) {
        m[i]->state = json_array();
        size_t j;
        json_t *ev;
        json_array_foreach(all[i], j, ev)
        {
            if (state_wanted(s, &w[i], ev, lazy[i])) json_array_append(m[i]->state, ev);
        }
    }
    for (int i = 0; w && lazy && all && i < n; i++) {
        wants_free(&w[i]);
        json_decref(lazy[i]);
        json_decref(all[i]);
    }
    json_t *arrays[] = {sp.rooms, sp.after, sp.allm, sp.allt, sp.tk, sp.tv, sp.mk, sp.mv};
    for (size_t i = 0; i < sizeof(arrays) / sizeof(arrays[0]); i++) json_decref(arrays[i]);
    free(w);
    free(lazy);
    free(all);
    free(reqs);
    return rc;
}

/* ---- num_live ------------------------------------------------------------------------- */

/* How many of each timeline's events came after the previous position: the events of
 * (max(prev, first - 1), upto], at most the timeline's length (0 on a first answer). */
static int num_live(sync_ctx *s, ssync_plan **m, int n)
{
    json_t *ids = json_array(), *lo = json_array(), *which = json_array();
    for (int i = 0; i < n; i++) {
        m[i]->num_live = 0;
        if (m[i]->prev <= 0 || json_array_size(m[i]->t.events) == 0) continue;
        int64_t from = m[i]->prev > m[i]->t.first_pos - 1 ? m[i]->prev : m[i]->t.first_pos - 1;
        json_array_append_new(ids, json_string(m[i]->room_id));
        json_array_append_new(lo, json_string(crooms_i64(s->r, from)));
        json_array_append_new(which, json_integer(i));
    }
    int rc = ROOMS_OK;
    if (json_array_size(ids) > 0) {
        const char *p[3] = {arr(s, ids), arr(s, lo), crooms_i64(s->r, s->upto)};
        PGresult *res = rooms_q(s->c,
                                "SELECT q.k, (SELECT count(*) FROM events e WHERE e.room_id = q.room"
                                " AND e.stream_pos > q.lo AND e.stream_pos <= $3::bigint)"
                                " FROM unnest($1::text[], $2::bigint[]) WITH ORDINALITY q(room, lo, k)",
                                3, p, NULL);
        if (!res) rc = ROOMS_E_DB;
        for (int row = 0; res && row < PQntuples(res); row++) {
            size_t k = (size_t)atoll(PQgetvalue(res, row, 0)) - 1;
            if (k >= json_array_size(which)) continue;
            ssync_plan *plan = m[json_integer_value(json_array_get(which, k))];
            json_int_t live = atoll(PQgetvalue(res, row, 1)), len = (json_int_t)json_array_size(plan->t.events);
            plan->num_live = live > len ? len : live;
        }
        PQclear(res);
    }
    json_decref(ids);
    json_decref(lo);
    json_decref(which);
    return rc;
}

int ssync_reads_load(sync_ctx *s, ssync_plan *plans, size_t n)
{
    ssync_plan **m = calloc(n ? n : 1, sizeof(*m));
    if (!m) return ROOMS_E_DB;
    int nm = 0;
    for (size_t i = 0; i < n; i++)
        if (plans[i].member) m[nm++] = &plans[i];
    int rc = ROOMS_OK;
    if (nm > 0) rc = timelines(s, m, nm);
    if (rc == ROOMS_OK && nm > 0) rc = required_states(s, m, nm);
    if (rc == ROOMS_OK && nm > 0) rc = num_live(s, m, nm);
    free(m);
    return rc;
}

void ssync_plans_free(ssync_plan *plans, size_t n)
{
    for (size_t i = 0; plans && i < n; i++) {
        json_decref(plans[i].t.events);
        json_decref(plans[i].state);
    }
}
