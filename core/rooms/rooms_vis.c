/*
 * core/rooms/rooms_vis.c - history visibility: who may see which events of a room.
 *
 * The rule lives here alone (hv_allows, applied by rooms_vis_compute; rooms.h states it):
 * from the room's m.room.history_visibility changes and the user's membership changes,
 * both read with their stream positions in one query, it computes the short list of
 * position ranges the user may see, plus their own membership events. Every reader of
 * events (core/client/rooms/crooms_read.c, core/client/sync/sync_rooms.c) restricts its SQL
 * with rooms_vis_window, so the rule is never re-implemented beside its twin. Readers
 * answer 403 to a user who was never joined, unless the room is world_readable now
 * (rooms_visibility): then anyone reads what the rule shows a non-member.
 * State (/state, /members, sync's state block) is current room state, not history: it
 * does not go through this rule.
 * Erasure (rooms.h states it) lives here too, as it turns on the same history: whether the
 * reader was joined at an event (the joined ranges rooms_vis_compute keeps beside the
 * visible ones). Readers apply it when they render (events_render, core/rooms/events_store.c)
 * and search when it matches (rooms_erasure_sql).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rooms/rooms.h"

/* ---- history visibility ------------------------------------------------------------- */

rooms_hv rooms_hv_parse(const char *value)
{
    if (!value) return ROOMS_HV_JOINED;
    if (strcmp(value, "world_readable") == 0) return ROOMS_HV_WORLD_READABLE;
    if (strcmp(value, "shared") == 0) return ROOMS_HV_SHARED;
    if (strcmp(value, "invited") == 0) return ROOMS_HV_INVITED;
    return ROOMS_HV_JOINED; /* "joined", and anything unknown: the strictest */
}

rooms_mem rooms_mem_parse(const char *membership)
{
    if (membership && strcmp(membership, "join") == 0) return ROOMS_MEM_JOIN;
    if (membership && strcmp(membership, "invite") == 0) return ROOMS_MEM_INVITE;
    return ROOMS_MEM_NONE;
}

/* The rule, for an event that is not the user's own membership event: hv and mem as they
 * were before the event, joined_now the user's membership today. */
static bool hv_allows(rooms_hv hv, rooms_mem mem, bool joined_now)
{
    if (hv == ROOMS_HV_WORLD_READABLE || mem == ROOMS_MEM_JOIN) return true;
    if (hv == ROOMS_HV_SHARED) return joined_now;
    return hv == ROOMS_HV_INVITED && mem == ROOMS_MEM_INVITE;
}

/* Append (lo, hi] clipped to v->upto, merging with the newest range when they touch; past
 * ROOMS_VIS_MAX_RANGES the oldest range goes (hide rather than show). Ranges arrive in
 * ascending order. */
static void add_range(rooms_vis *v, int64_t lo, int64_t hi)
{
    if (hi > v->upto) hi = v->upto;
    if (lo >= hi) return;
    if (v->n > 0 && lo <= v->hi[v->n - 1]) {
        if (hi > v->hi[v->n - 1]) v->hi[v->n - 1] = hi;
        return;
    }
    if (v->n == ROOMS_VIS_MAX_RANGES) {
        memmove(v->lo, v->lo + 1, (ROOMS_VIS_MAX_RANGES - 1) * sizeof(v->lo[0]));
        memmove(v->hi, v->hi + 1, (ROOMS_VIS_MAX_RANGES - 1) * sizeof(v->hi[0]));
        v->n--;
        v->dropped++;
    }
    v->lo[v->n] = lo;
    v->hi[v->n] = hi;
    v->n++;
}

/* The joined ranges of a membership history: from each join (exclusive) to the change
 * after it (inclusive), or on. The changes are distinct in a row, so a join is followed by
 * something else; past ROOMS_VIS_MAX_RANGES the oldest go. */
static void joined_ranges(const rooms_vis_history *h, rooms_vis *v)
{
    for (int i = 0; i < h->n_mem; i++) {
        if (h->mem[i].value != ROOMS_MEM_JOIN || h->mem[i].pos <= 0) continue;
        if (v->n_joined == ROOMS_VIS_MAX_RANGES) {
            memmove(v->jlo, v->jlo + 1, (ROOMS_VIS_MAX_RANGES - 1) * sizeof(v->jlo[0]));
            memmove(v->jhi, v->jhi + 1, (ROOMS_VIS_MAX_RANGES - 1) * sizeof(v->jhi[0]));
            v->n_joined--;
        }
        v->jlo[v->n_joined] = h->mem[i].pos;
        v->jhi[v->n_joined] = i + 1 < h->n_mem ? h->mem[i + 1].pos : INT64_MAX;
        v->n_joined++;
    }
}

void rooms_vis_compute(const rooms_vis_history *h, const char *user_id, rooms_vis *v)
{
    memset(v, 0, sizeof(*v));
    v->user_id = user_id;
    v->upto = INT64_MAX;
    int last_join = -1;
    for (int i = 0; i < h->n_mem; i++)
        if (h->mem[i].value == ROOMS_MEM_JOIN) last_join = i;
    v->ever_joined = last_join >= 0;
    bool joined_now = h->n_mem > 0 && h->mem[h->n_mem - 1].value == ROOMS_MEM_JOIN;
    for (int i = last_join + 1; last_join >= 0 && i < h->n_mem; i++) {
        if (h->mem[i].value != ROOMS_MEM_JOIN) {
            v->upto = h->mem[i].pos; /* the leave (or ban, ...) itself stays visible */
            break;
        }
    }
    /* Walk the changes in position order: between two changes the state is constant, and
     * an event at a change's position still sees the state before that change. */
    rooms_hv hv = h->hv_truncated ? ROOMS_HV_JOINED : ROOMS_HV_SHARED;
    rooms_mem mem = ROOMS_MEM_NONE;
    int64_t from = 0;
    int im = 0, ih = 0;
    while (im < h->n_mem || ih < h->n_hv) {
        bool take_hv = im == h->n_mem || (ih < h->n_hv && h->hv[ih].pos < h->mem[im].pos);
        int64_t at = take_hv ? h->hv[ih].pos : h->mem[im].pos;
        if (hv_allows(hv, mem, joined_now)) add_range(v, from, at);
        if (take_hv) {
            rooms_hv next = (rooms_hv)h->hv[ih++].value;
            if (hv_allows(next, mem, joined_now)) add_range(v, at - 1, at);
            hv = next;
        } else {
            mem = (rooms_mem)h->mem[im++].value;
        }
        if (at > from) from = at;
    }
    if (hv_allows(hv, mem, joined_now)) add_range(v, from, INT64_MAX);
    v->world_readable = hv == ROOMS_HV_WORLD_READABLE;
    v->floor = v->n > 0 ? v->lo[0] : INT64_MAX;
    if (h->n_mem > 0 && h->mem[0].pos - 1 < v->floor) v->floor = h->mem[0].pos - 1;
    /* Backfilled history (positions <= 0) predates every membership this server saw, and
     * the room's history_visibility then was the oldest value known here: the state this
     * server joined with, unless backfilled changes (positions <= 0) come first, which
     * the walk above cannot order against that older history, so they count as strictest. */
    rooms_hv back = h->hv_truncated || (h->n_hv > 0 && h->hv[0].pos <= 0)
                        ? ROOMS_HV_JOINED
                        : h->n_hv > 0 ? (rooms_hv)h->hv[0].value : ROOMS_HV_SHARED;
    v->backfilled = hv_allows(back, ROOMS_MEM_NONE, joined_now) && v->upto == INT64_MAX;
    if (v->backfilled) v->floor = INT64_MIN;
    joined_ranges(h, v);
}

bool rooms_vis_joined_at(const rooms_vis *v, int64_t pos)
{
    for (int i = 0; i < v->n_joined; i++)
        if (pos > v->jlo[i] && pos <= v->jhi[i]) return true;
    return false;
}

int rooms_vis_joined_pieces(const rooms_vis *v, int64_t lo, int64_t hi, int64_t *plo,
                            int64_t *phi, bool *pj, int max)
{
    int n = 0;
    for (int i = 0; i < v->n_joined && lo < hi && n < max; i++) {
        int64_t jl = v->jlo[i] > lo ? v->jlo[i] : lo, jh = v->jhi[i] < hi ? v->jhi[i] : hi;
        if (jl >= jh) continue; /* this joined range misses what is left of (lo, hi] */
        if (jl > lo) {
            plo[n] = lo, phi[n] = jl, pj[n++] = false;
            if (n == max) return n;
        }
        plo[n] = jl, phi[n] = jh, pj[n++] = true;
        lo = jh;
    }
    if (lo < hi && n < max) plo[n] = lo, phi[n] = hi, pj[n++] = false;
    return n;
}

/* ---- erasure -------------------------------------------------------------------------- */

bool rooms_erasure_covers(const char *type, bool is_state)
{
    return !is_state || (type && strcmp(type, "m.room.member") == 0);
}

bool rooms_erasure_hides(const events_view *v, bool sender_erased, const char *type,
                         bool is_state, int64_t pos)
{
    if (!sender_erased || v->reader_joined || !rooms_erasure_covers(type, is_state)) return false;
    return !v->reader || !rooms_vis_joined_at(v->reader, pos);
}

bool rooms_erasure_hides_from_servers(bool sender_erased, const char *type, bool is_state)
{
    return sender_erased && rooms_erasure_covers(type, is_state);
}

int rooms_user_erased(PGconn *c, const char *user_id)
{
    const char *p[1] = {user_id};
    PGresult *res = rooms_q(c, "SELECT 1 FROM erased_users WHERE user_id = $1", 1, p, NULL);
    if (!res) return ROOMS_E_DB;
    int n = PQntuples(res);
    PQclear(res);
    return n > 0;
}

const char *rooms_erasure_sql(rt_arena *a, const char *joined)
{
    /* The twin of rooms_erasure_hides and rooms_erasure_covers, in SQL. */
    return rt_arena_printf(a,
                           " AND ((%s) OR (e.state_key IS NOT NULL AND e.type <> 'm.room.member')"
                           " OR NOT EXISTS (SELECT 1 FROM erased_users x WHERE x.user_id = e.sender))",
                           joined);
}

/* One query: per room of $2 and kind ('h' history_visibility of the room, 'm' the user's
 * membership), the newest ROOMS_VIS_MAX_CHANGES + 1 changes (rows whose value differs from
 * the previous one), ordered by room, kind and ascending position. */
static const char VIS_HISTORY_SQL[] =
    "SELECT room_id, k, pos, val FROM ("
    " SELECT room_id, 'm' AS k, pos, val, row_number() OVER (PARTITION BY room_id ORDER BY pos DESC) AS n"
    "  FROM (SELECT room_id, stream_pos AS pos, membership AS val,"
    "   lag(membership) OVER (PARTITION BY room_id ORDER BY stream_pos) AS prev FROM memberships"
    "   WHERE user_id = $1 AND room_id = ANY($2::text[])) m WHERE prev IS DISTINCT FROM val"
    " UNION ALL"
    " SELECT room_id, 'h', pos, val, row_number() OVER (PARTITION BY room_id ORDER BY pos DESC)"
    "  FROM (SELECT room_id, pos, val, lag(val) OVER (PARTITION BY room_id ORDER BY pos) AS prev"
    "   FROM (SELECT e.room_id, e.stream_pos AS pos,"
    "     coalesce(e.pdu::json -> 'content' ->> 'history_visibility', '') AS val"
    "     FROM events e WHERE e.room_id = ANY($2::text[]) AND e.type = 'm.room.history_visibility'"
    "     AND e.state_key = '') x) h WHERE prev IS DISTINCT FROM val) c"
    " WHERE n <= $3 ORDER BY room_id, k, pos";

/* The history of rows [from, to) of a VIS_HISTORY_SQL result (one room's), computed. */
static int vis_from_rows(PGresult *res, int from, int to, const char *room_id, const char *user_id,
                         rooms_vis *out)
{
    int rows = to - from;
    rooms_vis_change *all = malloc((size_t)(rows > 0 ? rows : 1) * sizeof(*all));
    if (!all) return ROOMS_E_DB;
    int n_h = 0;
    for (int i = 0; i < rows; i++) {
        bool is_hv = PQgetvalue(res, from + i, 1)[0] == 'h';
        all[i].pos = atoll(PQgetvalue(res, from + i, 2));
        all[i].value = is_hv ? (int)rooms_hv_parse(PQgetvalue(res, from + i, 3))
                             : (int)rooms_mem_parse(PQgetvalue(res, from + i, 3));
        n_h += is_hv;
    }
    /* Ordered by kind: 'h' rows first, then 'm'. One row past the limit means older
     * changes exist: drop it (the oldest) and say so. */
    rooms_vis_history h = {.hv = all, .n_hv = n_h, .mem = all + n_h, .n_mem = rows - n_h};
    if (h.n_hv > ROOMS_VIS_MAX_CHANGES) {
        h.hv++;
        h.n_hv--;
        h.hv_truncated = true;
    }
    if (h.n_mem > ROOMS_VIS_MAX_CHANGES) {
        h.mem++;
        h.n_mem--;
        h.mem_truncated = true;
    }
    rooms_vis_compute(&h, user_id, out);
    free(all);
    if (h.hv_truncated || h.mem_truncated || out->dropped > 0)
        rt_log(ATRIUM_LOG_WARN, "core", "history visibility of %s in %s: over %d changes or %d "
               "ranges; older history is hidden from this user", user_id, room_id,
               ROOMS_VIS_MAX_CHANGES, ROOMS_VIS_MAX_RANGES);
    return ROOMS_OK;
}

int rooms_vis_load_many(PGconn *c, const json_t *room_ids, const char *user_id, rooms_vis *out)
{
    char limit_s[24];
    snprintf(limit_s, sizeof(limit_s), "%d", ROOMS_VIS_MAX_CHANGES + 1);
    rt_arena *a = rt_arena_new(1024);
    if (!a) return ROOMS_E_DB;
    const char *p[3] = {user_id, rooms_pg_array(a, room_ids), limit_s};
    PGresult *res = p[1] ? rooms_q(c, VIS_HISTORY_SQL, 3, p, NULL) : NULL;
    rt_arena_free(a);
    if (!res) return ROOMS_E_DB;
    int rows = PQntuples(res), at = 0, rc = ROOMS_OK;
    for (size_t i = 0; i < json_array_size(room_ids) && rc == ROOMS_OK; i++) {
        const char *room_id = json_string_value(json_array_get(room_ids, i));
        /* Rows come by room ID: find this room's run (rooms without rows have none). */
        int from = 0;
        while (from < rows && strcmp(PQgetvalue(res, from, 0), room_id) != 0) from++;
        for (at = from; at < rows && strcmp(PQgetvalue(res, at, 0), room_id) == 0;) at++;
        rc = vis_from_rows(res, from, at, room_id, user_id, &out[i]);
    }
    PQclear(res);
    return rc;
}

int rooms_vis_load(PGconn *c, const char *room_id, const char *user_id, rooms_vis *out)
{
    json_t *ids = json_pack("[s]", room_id);
    int rc = ids ? rooms_vis_load_many(c, ids, user_id, out) : ROOMS_E_DB;
    json_decref(ids);
    return rc;
}

int rooms_visibility(PGconn *c, const char *room_id, const char *user_id, rooms_vis *out,
                     rooms_err *e)
{
    bool failed;
    if (!rooms_version_of(c, room_id, &failed))
        return failed ? rooms_set_err(e, ROOMS_E_DB, "database")
                      : rooms_set_err(e, ROOMS_E_NOT_FOUND, "Unknown room");
    if (rooms_vis_load(c, room_id, user_id, out) < 0)
        return rooms_set_err(e, ROOMS_E_DB, "database");
    if (!out->ever_joined && !out->world_readable)
        return rooms_set_err(e, ROOMS_E_FORBIDDEN, "You are not a member of this room");
    return ROOMS_OK;
}

/* A PostgreSQL bigint[] literal of n positions. */
static const char *pos_array(rt_arena *a, const int64_t *pos, int n)
{
    size_t cap = 3 + (size_t)n * 21, used = 0;
    char *out = rt_arena_alloc(a, cap);
    if (!out) return NULL;
    out[used++] = '{';
    for (int i = 0; i < n; i++)
        used += (size_t)snprintf(out + used, cap - used, "%s%lld", i ? "," : "", (long long)pos[i]);
    snprintf(out + used, cap - used, "}");
    return out;
}

bool rooms_vis_window(rt_arena *a, const rooms_vis *v, int64_t lo, int64_t hi, bool hidden,
                      int n, const char **sql, const char **p)
{
    if (!hidden) { /* the visible part of the window: a narrower index range to scan */
        if (lo < v->floor) lo = v->floor;
        if (hi > v->upto) hi = v->upto;
    }
    if (lo >= hi) return false;
    p[0] = rt_arena_printf(a, "%lld", (long long)lo);
    p[1] = rt_arena_printf(a, "%lld", (long long)hi);
    p[2] = rt_arena_printf(a, "%lld", (long long)v->floor);
    p[3] = rt_arena_printf(a, "%lld", (long long)v->upto);
    /* The backfilled region, (INT64_MIN, 0], as one more range when visible. */
    int64_t lo_all[ROOMS_VIS_MAX_RANGES + 1], hi_all[ROOMS_VIS_MAX_RANGES + 1];
    int n_all = 0;
    if (v->backfilled) {
        lo_all[n_all] = INT64_MIN;
        hi_all[n_all++] = 0;
    }
    for (int i = 0; i < v->n; i++) {
        lo_all[n_all] = v->lo[i];
        hi_all[n_all++] = v->hi[i];
    }
    p[4] = pos_array(a, lo_all, n_all);
    p[5] = pos_array(a, hi_all, n_all);
    p[6] = v->user_id;
    *sql = rt_arena_printf(a,
                           " AND e.stream_pos > $%d AND e.stream_pos <= $%d AND %s("
                           "e.stream_pos > $%d AND e.stream_pos <= $%d"
                           " AND (EXISTS (SELECT 1 FROM unnest($%d::bigint[], $%d::bigint[])"
                           "  r(lo, hi) WHERE e.stream_pos > r.lo AND e.stream_pos <= r.hi)"
                           "  OR (e.type = 'm.room.member' AND e.state_key = $%d)))",
                           n, n + 1, hidden ? "NOT " : "", n + 2, n + 3, n + 4, n + 5, n + 6);
    return p[0] && p[1] && p[2] && p[3] && p[4] && p[5] && *sql;
}

/* The twin of rooms_vis_window (not hidden) for several rooms at once (one query over a
 * window of rooms): the same rule, with each room's values in arrays indexed by k. */
bool rooms_vis_window_many(rt_arena *a, const rooms_vis *const *v, const int64_t *lo, const int64_t *hi,
                           int n, int pn, const char *k, bool *open, const char **sql, const char **p)
{
    int64_t *w = rt_arena_alloc(a, (size_t)(n ? n : 1) * 4 * sizeof(int64_t));
    int cap = n * (ROOMS_VIS_MAX_RANGES + 1) + 1, n_r = 0;
    int64_t *rk = rt_arena_alloc(a, (size_t)cap * 3 * sizeof(int64_t));
    if (!w || !rk) return false;
    int64_t *rlo = rk + cap, *rhi = rlo + cap;
    for (int i = 0; i < n; i++) {
        int64_t l = lo[i] < v[i]->floor ? v[i]->floor : lo[i], h = hi[i] > v[i]->upto ? v[i]->upto : hi[i];
        open[i] = l < h;
        w[i] = open[i] ? l : 0;
        w[n + i] = open[i] ? h : 0;
        w[2 * n + i] = v[i]->floor;
        w[3 * n + i] = v[i]->upto;
        if (open[i] && v[i]->backfilled) { /* the backfilled region, (INT64_MIN, 0] */
            rk[n_r] = i + 1;
            rlo[n_r] = INT64_MIN;
            rhi[n_r++] = 0;
        }
        for (int j = 0; open[i] && j < v[i]->n; j++) {
            rk[n_r] = i + 1;
            rlo[n_r] = v[i]->lo[j];
            rhi[n_r++] = v[i]->hi[j];
        }
    }
    for (int j = 0; j < 4; j++) p[j] = pos_array(a, w + (size_t)j * (size_t)n, n);
    p[4] = pos_array(a, rk, n_r);
    p[5] = pos_array(a, rlo, n_r);
    p[6] = pos_array(a, rhi, n_r);
    p[7] = n ? v[0]->user_id : "";
    *sql = rt_arena_printf(a,
                           " AND e.stream_pos > ($%d::bigint[])[%s] AND e.stream_pos <= ($%d::bigint[])[%s]"
                           " AND (e.stream_pos > ($%d::bigint[])[%s] AND e.stream_pos <= ($%d::bigint[])[%s]"
                           " AND (EXISTS (SELECT 1 FROM unnest($%d::bigint[], $%d::bigint[], $%d::bigint[])"
                           "  r(k, lo, hi) WHERE r.k = %s AND e.stream_pos > r.lo AND e.stream_pos <= r.hi)"
                           "  OR (e.type = 'm.room.member' AND e.state_key = $%d)))",
                           pn, k, pn + 1, k, pn + 2, k, pn + 3, k, pn + 4, pn + 5, pn + 6, k, pn + 7);
    return p[0] && p[1] && p[2] && p[3] && p[4] && p[5] && p[6] && *sql;
}

bool rooms_vis_covers(const rooms_vis *v, int64_t lo, int64_t hi)
{
    if (lo >= hi) return true;
    for (int i = 0; i < v->n; i++)
        if (v->lo[i] <= lo && v->hi[i] >= hi) return true;
    return false;
}
