/*
 * core/client/sync/ssync_lists.c - the rooms a sliding sync's lists and subscriptions pick:
 * the user's rooms in activity order, each list's filters, counts and windows.
 *
 * Decisions owned here:
 *   - Activity order is bump_stamp, newest first (room ID breaks ties): for a joined room
 *     the stream position of its newest event of a bump type (SSYNC_BUMP_TYPES_SQL,
 *     Synapse's list: create, message, encrypted, sticker, call invite, poll start,
 *     beacon info) up to the response's position; for other memberships the position of
 *     the membership. Each local user's newest membership per room is kept in
 *     sliding_sync_rooms (a trigger on memberships: migration 4 of ssync.c), each room's
 *     bump_stamp in sliding_sync_bumps (a trigger on events: migration 2), so a message
 *     writes one row whatever the room's size. A run reads the user's rows by index,
 *     joins each to its room's bump and sorts them; lists without filters keep only the
 *     top, as far as their ranges reach, and the count, plus the rooms the request's
 *     subscriptions and the connection's map name; lists with filters keep all. When one
 *     of the user's memberships moved after the answer's position, the rooms as of that
 *     position come from the memberships' history instead (a race with a write; rare).
 *   - The rooms lists hold: joined, invited (not by a user the user ignores: the
 *     m.ignored_user_list, as /sync's rooms.invite) and knocked ones, and those left or banned
 *     after the connection's previous position (so the client learns of it once). A
 *     forgotten room is never listed.
 *   - Filters: is_dm reads the m.direct account data; is_encrypted the current
 *     m.room.encryption; is_invite the membership; room_types / not_room_types the
 *     m.room.create `type` (null names rooms without one; not_room_types wins); spaces the
 *     current m.space.child events (with a non-empty `via`) of the named spaces the user
 *     is joined to, one level, never sub-spaces; tags / not_tags the m.tag account data
 *     (not_tags wins).
 *   - A room in several lists (or a list and a subscription) gets the largest
 *     timeline_limit and the union of their required_state.
 * What it does not do: build a room's result (ssync_room.c).
 */
#include <stdlib.h>
#include <string.h>

#include "core/client/sync/ssync.h"


/* Lists read the short way (RECENT_SQL), and those it sent on to the whole order. */
static rt_metric *m_short, *m_short_missed;

void ssync_lists_metrics(rt_metrics *metrics)
{
    m_short = rt_metric_counter(metrics, "atrium_sliding_sync_lists_total", "way=\"recent\"",
                                "Sliding sync list reads: newest rooms first (RECENT_SQL)");
    m_short_missed = rt_metric_counter(metrics, "atrium_sliding_sync_lists_total", "way=\"whole\"",
                                       "Sliding sync list reads the short way sent on to the whole order");
}

/* The account data the lists read (SSYNC_ACCOUNT_DATA_SQL's text, read with the run's
 * position): the ignore list into s->timeline.ignored, the rooms named in m.direct into
 * *dms ({room_id: true}) and the room tags into *tags ({room_id: {tag: {...}}}). */
static int account_data(sync_ctx *s, const char *text, json_t **dms, json_t **tags)
{
    *dms = json_object();
    *tags = json_object();
    s->timeline.ignored = NULL;
    json_t *all = text ? json_loads(text, 0, NULL) : NULL;
    if (!json_is_array(all)) {
        json_decref(all);
        return ROOMS_E_DB;
    }
    int rc = ROOMS_OK;
    size_t i;
    json_t *item;
    json_array_foreach(all, i, item)
    {
        const char *room = json_string_value(json_array_get(item, 0));
        const char *type = json_string_value(json_array_get(item, 1));
        const char *value = json_string_value(json_array_get(item, 2));
        if (!room || !type) continue;
        if (strcmp(type, "m.ignored_user_list") == 0) {
            if (value && !(s->timeline.ignored = rt_arena_strdup(s->r->arena, value)))
                rc = ROOMS_E_DB; /* out of memory: no reading without the list */
            continue;
        }
        json_t *content = value ? json_loads(value, 0, NULL) : NULL;
        if (strcmp(type, "m.tag") == 0) {
            if (content) json_object_set_new(*tags, room, content);
            continue;
        }
        const char *who;
        json_t *rooms;
        json_object_foreach(content, who, rooms)
        {
            size_t j;
            json_t *r;
            json_array_foreach(rooms, j, r)
            {
                if (json_is_string(r)) json_object_set_new(*dms, json_string_value(r), json_true());
            }
        }
        json_decref(content);
    }
    json_decref(all);
    return rc;
}

/* The rule of which rooms the lists hold, on a row `t` whose membership's position is
 * column `pos`: $3 the connection's previous position, $6 the ignored users. */
#define LISTED_SQL(t, pos)                                                                     \
    " NOT " t ".forgotten AND (" t ".membership IN ('join', 'knock')"                          \
    "  OR (" t ".membership = 'invite' AND (" t ".sender = ANY($6::text[])) IS NOT TRUE)"      \
    "  OR (" t ".membership IN ('leave', 'ban') AND $3::bigint > 0 AND " t "." pos " > $3::bigint)) "
/* A row's encryption ($4) and room type ($5), read only when a list filters on them; a
 * probe of the room's key each (a scalar subquery with LIMIT: PostgreSQL would turn an
 * EXISTS over many rows into one scan of every room's current state). */
#define FILTERED_SQL(t)                                                                        \
    " CASE WHEN $4::boolean THEN (SELECT true FROM current_state cs WHERE cs.room_id = " t ".room_id" \
    "  AND cs.type = 'm.room.encryption' AND cs.state_key = '' LIMIT 1) IS NOT NULL ELSE false END," \
    " CASE WHEN $5::boolean THEN (SELECT e.pdu::json -> 'content' ->> 'type' FROM current_state cs" \
    "  JOIN events e ON e.event_id = cs.event_id WHERE cs.room_id = " t ".room_id"             \
    "  AND cs.type = 'm.room.create' AND cs.state_key = '') END "

/* A row's bump_stamp as of upto ($2), the row `t` with its room's bump_stamp `bump` (NULL
 * when sliding_sync_bumps has no row for it): for a joined room the room's, unless an
 * event arrived after upto (then the newest event of a bump type up to upto, read only for
 * such a room); else the membership's position (column `pos`). */
#define BUMP_SQL(t, pos, bump)                                                                 \
    " CASE WHEN " t ".membership <> 'join' OR " bump " IS NULL THEN " t "." pos                 \
    "  WHEN " bump " <= $2::bigint THEN " bump                                                 \
    "  ELSE coalesce((SELECT e.stream_pos FROM events e WHERE e.room_id = " t ".room_id"        \
    "   AND e.stream_pos <= $2::bigint AND e.type IN " SSYNC_BUMP_TYPES_SQL                      \
    "   ORDER BY e.stream_pos DESC LIMIT 1), " t "." pos ") END "

/* From sliding_sync_rooms (migration 4 of ssync.c): the user's rows, read by its primary
 * key (user_id first), each with its room's bump from sliding_sync_bumps by a probe of its
 * key (a scalar subquery: as a join, the generic plan hashes the whole table, every room
 * of the server), so the cost follows the user's rooms, not the server's; then the
 * first $7 of the order (all when NULL; a top-N sort) and the rooms of $8 (subscriptions,
 * the connection's map) that the lists hold, with the count of the whole order ($8 empty,
 * as on a new connection without subscriptions: a one-time test, not a pass over every
 * row). No row is used when one of the user's memberships moved after upto ($2): its
 * state as of upto is in the history (HISTORY_SQL); `late` says so. Every row carries the count and `late`;
 * one row of NULLs when no room is listed. */
static const char TOP_SQL[] =
    "WITH a AS MATERIALIZED (SELECT s.room_id, s.membership, s.event_id, s.sender, s.membership_pos,"
    "  s.forgotten," BUMP_SQL("s", "membership_pos", "s.room_bump") "AS bump"
    "  FROM (SELECT s.*, (SELECT b.bump_stamp FROM sliding_sync_bumps b WHERE b.room_id = s.room_id) AS room_bump"
    "   FROM sliding_sync_rooms s WHERE s.user_id = $1 OFFSET 0) s),"
    " u AS (SELECT count(*) FILTER (WHERE" LISTED_SQL("a", "membership_pos") ") AS n,"
    "  coalesce(bool_or(a.membership_pos > $2::bigint), false) AS late FROM a),"
    " top AS MATERIALIZED (SELECT a.* FROM a WHERE NOT (SELECT late FROM u) AND" LISTED_SQL("a", "membership_pos")
    "  ORDER BY a.bump DESC, a.room_id LIMIT $7::bigint),"
    " x AS (SELECT true AS ordered, top.* FROM top UNION ALL SELECT false, a.* FROM a"
    "  WHERE cardinality($8::text[]) > 0 AND a.room_id = ANY($8::text[]) AND NOT (SELECT late FROM u)"
    "  AND" LISTED_SQL("a", "membership_pos") "AND a.room_id NOT IN (SELECT room_id FROM top))"
    " SELECT x.room_id, x.membership, x.event_id, x.sender, x.membership_pos, x.bump,"
    FILTERED_SQL("x") ", u.n, u.late, x.ordered"
    " FROM u LEFT JOIN x ON true ORDER BY x.ordered DESC, x.bump DESC, x.room_id";

/* The same rooms as of upto from the memberships' history, every one in order (when
 * TOP_SQL says a membership moved after upto). */
static const char HISTORY_SQL[] =
    "WITH m AS (SELECT DISTINCT ON (room_id) room_id, membership, stream_pos, event_id, sender,"
    "  forgotten FROM memberships WHERE user_id = $1 AND stream_pos <= $2::bigint"
    "  ORDER BY room_id, stream_pos DESC)"
    " SELECT m.room_id, m.membership, m.event_id, m.sender, m.stream_pos,"
    BUMP_SQL("m", "stream_pos", "b.bump_stamp") "AS bump,"
    FILTERED_SQL("m")
    " FROM m LEFT JOIN sliding_sync_bumps b ON b.room_id = m.room_id"
    " WHERE" LISTED_SQL("m", "stream_pos")
    " ORDER BY bump DESC, m.room_id";
/* The short way to TOP_SQL's rows when no list filters (so the lists want the first $7 of
 * the order and the count): walk sliding_sync_bumps newest first (its index on
 * bump_stamp) and keep the rooms the user is joined to, until $7 of them; the count and
 * the IDs of the user's rooms of other memberships (ordered by their own position, read
 * again by key) come from one pass over the user's rows by the primary key (`room_id >
 * ''`, true of every room ID, makes that pass an index scan in the generic plan also
 * where a few users share the same rooms: without it PostgreSQL, which then expects a
 * tenth of the table, read all of it, 0.6 ms of the statement's 1.0 for 10 users in 1,000
 * rooms, and a second pass for the other memberships took 0.2 more). Exact when the walk
 * found min($7, joined) rooms none of which moved after upto ($2): every joined room has
 * a row in sliding_sync_bumps (ssync.c, migration 5), so a joined room the walk did not
 * reach is older than all it found. The walk stops after max(4 x $7, half the joined
 * rooms) rows of the server's; `ok` false (the walk fell short, a room moved after upto)
 * sends the caller to TOP_SQL; with `late` (a membership moved after upto) to
 * HISTORY_SQL, as TOP_SQL would. The rows, columns and order of TOP_SQL, and `ok` last;
 * $4 and $5 are false here (filters would need every row).
 * docs/adr/0043-sliding-sync-lists-newest-first.md */
static const char RECENT_SQL[] =
    "WITH u AS MATERIALIZED (SELECT"
    "  count(*) FILTER (WHERE" LISTED_SQL("mine", "membership_pos") ") AS n,"
    "  count(*) FILTER (WHERE mine.membership = 'join' AND NOT mine.forgotten) AS nj,"
    "  coalesce(bool_or(mine.membership_pos > $2::bigint), false) AS late,"
    "  array_agg(mine.room_id) FILTER (WHERE mine.membership <> 'join' AND" LISTED_SQL("mine", "membership_pos") ")"
    "   AS others"
    "  FROM sliding_sync_rooms mine"
    "  WHERE mine.user_id = $1 AND mine.room_id > ''),"
    " j AS MATERIALIZED (SELECT s.room_id, s.membership, s.event_id, s.sender, s.membership_pos, s.forgotten,"
    "  r.bump_stamp AS bump FROM (SELECT b.room_id, b.bump_stamp FROM sliding_sync_bumps b"
    "   ORDER BY b.bump_stamp DESC LIMIT (SELECT greatest(4 * $7::bigint, u.nj / 2) FROM u)) r"
    "  JOIN sliding_sync_rooms s ON s.user_id = $1 AND s.room_id = r.room_id"
    "  WHERE s.membership = 'join' AND NOT s.forgotten ORDER BY r.bump_stamp DESC LIMIT $7::bigint),"
    " ok AS (SELECT NOT u.late AND (SELECT count(*) FROM j) = least($7::bigint, u.nj)"
    "  AND NOT EXISTS (SELECT 1 FROM j WHERE j.bump > $2::bigint) AS ok FROM u),"
    " top AS MATERIALIZED (SELECT c.* FROM (SELECT * FROM j UNION ALL SELECT mine.room_id, mine.membership,"
    "   mine.event_id, mine.sender, mine.membership_pos, mine.forgotten, mine.membership_pos"
    "   FROM sliding_sync_rooms mine WHERE mine.user_id = $1"
    "   AND mine.room_id = ANY(CAST((SELECT others FROM u) AS text[]))"
    "   AND mine.membership <> 'join' AND" LISTED_SQL("mine", "membership_pos") ") c"
    "  WHERE (SELECT ok FROM ok) ORDER BY c.bump DESC, c.room_id LIMIT $7::bigint),"
    " x AS (SELECT true AS ordered, top.* FROM top UNION ALL SELECT false, m.room_id, m.membership, m.event_id,"
    "  m.sender, m.membership_pos, m.forgotten," BUMP_SQL("m", "membership_pos", "m.room_bump")
    "  FROM (SELECT mine.*, (SELECT b.bump_stamp FROM sliding_sync_bumps b WHERE b.room_id = mine.room_id)"
    "   AS room_bump FROM sliding_sync_rooms mine WHERE mine.user_id = $1 AND (SELECT ok FROM ok)"
    "   AND cardinality($8::text[]) > 0 AND mine.room_id = ANY($8::text[]) OFFSET 0) m"
    "  WHERE" LISTED_SQL("m", "membership_pos") "AND m.room_id NOT IN (SELECT room_id FROM top))"
    " SELECT x.room_id, x.membership, x.event_id, x.sender, x.membership_pos, x.bump, $4::boolean AND false,"
    " CASE WHEN $5::boolean THEN NULL END::text, u.n, u.late, x.ordered, ok.ok"
    " , st.*, g.*"
    " FROM u CROSS JOIN ok LEFT JOIN x ON true"
    /* With $9, the stamps of the ordered rows (ssync_hits.c; nothing read otherwise). */
    " LEFT JOIN LATERAL (SELECT " SSYNC_ROOM_STAMP_SQL("x.room_id", "$2::bigint", "$1")
    "  WHERE $9::boolean AND x.ordered) st ON true"
    " LEFT JOIN (SELECT " SSYNC_USER_STAMP_SQL("$1") " WHERE $9::boolean) g ON true"
    " ORDER BY x.ordered DESC, x.bump DESC, x.room_id";
#undef LISTED_SQL
#undef FILTERED_SQL
#undef BUMP_SQL

/* How many rows of the order the lists need: the end of their furthest range, or -1 for
 * every row (a list filters, or has no ranges, so its count or window needs them all). */
static int64_t rows_needed(const ssync_request *q)
{
    int64_t need = 0;
    for (size_t i = 0; i < q->n_lists; i++) {
        const ssync_list *l = &q->lists[i];
        const ssync_filters *f = &l->f;
        if (l->n_ranges < 0 || f->is_dm >= 0 || f->is_encrypted >= 0 || f->is_invite >= 0 || f->room_types ||
            f->not_room_types || f->spaces || f->tags || f->not_tags)
            return -1;
        for (int r = 0; r < l->n_ranges; r++)
            if (l->ranges[r][1] + 1 > need) need = l->ranges[r][1] + 1;
    }
    return need;
}

/* The rooms the request or the connection names: its subscriptions and sent's rooms. */
static json_t *named_rooms(const ssync_request *q, const json_t *sent)
{
    json_t *ids = json_array();
    for (size_t i = 0; i < q->n_subs; i++) json_array_append_new(ids, json_string(q->subs[i].room_id));
    const char *room_id;
    json_t *v;
    json_object_foreach((json_t *)sent, room_id, v) json_array_append_new(ids, json_string(room_id));
    return ids;
}

#define STAMP_COL 12 /* RECENT_SQL's first stamp column */
/* The rows of RECENT_SQL, TOP_SQL or HISTORY_SQL (their first eight columns, and
 * RECENT_SQL's stamps) into out. */
static int rows_of(PGresult *res, json_t *dms, ssync_rooms *out)
{
    out->res = res;
    out->n = PQntuples(res);
    if (out->n == 1 && PQgetisnull(res, 0, 0)) out->n = 0; /* TOP_SQL's row of no room */
    out->n_ordered = out->n;
    out->rows = calloc((size_t)out->n + 1, sizeof(ssync_room_row));
    if (!out->rows) return ROOMS_E_DB;
    for (int i = 0; i < out->n; i++) {
        ssync_room_row *row = &out->rows[i];
        row->room_id = PQgetvalue(res, i, 0);
        row->membership = PQgetvalue(res, i, 1);
        row->event_id = PQgetvalue(res, i, 2);
        row->sender = PQgetvalue(res, i, 3);
        row->membership_pos = atoll(PQgetvalue(res, i, 4));
        row->bump_stamp = atoll(PQgetvalue(res, i, 5));
        row->encrypted = PQgetvalue(res, i, 6)[0] == 't';
        row->room_type = PQgetisnull(res, i, 7) ? NULL : PQgetvalue(res, i, 7);
        row->is_dm = json_object_get(dms, row->room_id) != NULL;
        row->tags = json_object_get(out->tags, row->room_id);
        /* RECENT_SQL's stamps (columns 12 to 16), when it read them for this row. */
        row->stamped = PQnfields(res) >= STAMP_COL + 5 && !PQgetisnull(res, i, STAMP_COL) &&
                       !PQgetisnull(res, i, STAMP_COL + 3);
        if (row->stamped) {
            int64_t v[5]; /* ssync_stamp's five, in their order */
            for (int k = 0; k < 5; k++) v[k] = atoll(PQgetvalue(res, i, STAMP_COL + k));
            row->stamp = (ssync_stamp){v[0], v[1], v[2], v[3], v[4]};
        }
    }
    return ROOMS_OK;
}

int ssync_rooms_load(sync_ctx *s, const ssync_request *q, int64_t prev, const json_t *sent,
                     const char *account_data_text, bool want_stamps, ssync_rooms *out)
{
    *out = (ssync_rooms){.total = -1};
    json_t *dms;
    if (account_data(s, account_data_text, &dms, &out->tags) < 0) {
        json_decref(dms);
        json_decref(out->tags);
        out->tags = NULL;
        return ROOMS_E_DB;
    }
    /* The encryption and the room type are read only when a list filters on them. */
    bool need_enc = false, need_type = false;
    for (size_t i = 0; i < q->n_lists; i++) {
        need_enc = need_enc || q->lists[i].f.is_encrypted >= 0;
        need_type = need_type || q->lists[i].f.room_types || q->lists[i].f.not_room_types;
    }
    int64_t need = rows_needed(q);
    json_t *named = need >= 0 ? named_rooms(q, sent) : json_array();
    const char *p[9] = {s->user, crooms_i64(s->r, s->upto), crooms_i64(s->r, prev), need_enc ? "t" : "f",
                        need_type ? "t" : "f", s->timeline.ignored, need >= 0 ? crooms_i64(s->r, need) : NULL,
                        rooms_pg_array(s->r->arena, named), want_stamps ? "t" : "f"};
    json_decref(named);
    PGresult *res = NULL;
    bool whole = need < 0;
    if (p[7] && !whole) { /* a failure here is the run's, as for TOP_SQL: no second try */
        res = rooms_q(s->c, RECENT_SQL, 9, p, NULL);
        bool told = res && PQntuples(res) > 0 && PQgetvalue(res, 0, 11)[0] == 't';
        bool moved = res && PQntuples(res) > 0 && PQgetvalue(res, 0, 9)[0] == 't';
        rt_metric_add(told ? m_short : m_short_missed, res ? 1 : 0);
        whole = res && !told && !moved; /* a membership that moved: the history, below */
        if (whole) PQclear(res); /* the short way could not tell: the whole order */
    }
    if (whole && p[7]) res = rooms_q(s->c, TOP_SQL, 8, p, NULL);
    bool late = res && PQntuples(res) > 0 && PQgetvalue(res, 0, 9)[0] == 't';
    if (res && late) {
        PQclear(res);
        res = rooms_q(s->c, HISTORY_SQL, 6, p, NULL);
    }
    int rc = res ? rows_of(res, dms, out) : ROOMS_E_DB;
    if (rc == ROOMS_OK && !late && need >= 0) {
        out->total = out->n ? atoll(PQgetvalue(res, 0, 8)) : 0;
        while (out->n_ordered > 0 && PQgetvalue(res, out->n_ordered - 1, 10)[0] != 't') out->n_ordered--;
    }
    json_decref(dms);
    if (rc < 0) {
        if (!out->res) PQclear(res);
        ssync_rooms_free(out);
    }
    return rc;
}

void ssync_rooms_free(ssync_rooms *rs)
{
    PQclear(rs->res);
    free(rs->rows);
    json_decref(rs->tags);
    *rs = (ssync_rooms){0};
}

/* The children of the spaces the user is joined to among `spaces`, as {room_id: true}. */
static int space_children(sync_ctx *s, const json_t *spaces, json_t **out)
{
    *out = json_object();
    const char *p[2] = {rooms_pg_array(s->r->arena, spaces), s->user};
    PGresult *res = rooms_q(s->c,
                            "SELECT DISTINCT cs.state_key FROM current_state cs"
                            " JOIN events e ON e.event_id = cs.event_id"
                            " WHERE cs.room_id = ANY($1::text[]) AND cs.type = 'm.space.child'"
                            " AND jsonb_typeof(e.pdu::jsonb -> 'content' -> 'via') = 'array'"
                            " AND e.pdu::jsonb -> 'content' -> 'via' <> '[]'::jsonb"
                            " AND EXISTS (SELECT 1 FROM current_state mm WHERE mm.room_id = cs.room_id"
                            "  AND mm.type = 'm.room.member' AND mm.state_key = $2 AND mm.membership = 'join')",
                            2, p, NULL);
    if (!res) return ROOMS_E_DB;
    for (int i = 0; i < PQntuples(res); i++) json_object_set_new(*out, PQgetvalue(res, i, 0), json_true());
    PQclear(res);
    return ROOMS_OK;
}

/* Does a room type (NULL: none) appear in a room_types list (null: none)? */
static bool type_listed(const json_t *list, const char *type)
{
    size_t i;
    const json_t *t;
    json_array_foreach(list, i, t)
    {
        if (json_is_null(t) ? type == NULL : (type && strcmp(json_string_value(t), type) == 0)) return true;
    }
    return false;
}

/* Does the room carry one of the tags of the list? */
static bool tagged(const json_t *list, const json_t *tags)
{
    size_t i;
    const json_t *t;
    json_array_foreach(list, i, t)
    {
        if (json_object_get(tags, json_string_value(t))) return true;
    }
    return false;
}

/* The rule of a list's filters for one room. children: the spaces' children, or NULL. */
static bool filters_match(const ssync_filters *f, const ssync_room_row *row, const json_t *children)
{
    bool invited = strcmp(row->membership, "invite") == 0;
    if (f->is_dm >= 0 && row->is_dm != (f->is_dm == 1)) return false;
    if (f->is_encrypted >= 0 && row->encrypted != (f->is_encrypted == 1)) return false;
    if (f->is_invite >= 0 && invited != (f->is_invite == 1)) return false;
    if (f->room_types && !type_listed(f->room_types, row->room_type)) return false;
    if (f->not_room_types && type_listed(f->not_room_types, row->room_type)) return false;
    if (children && !json_object_get(children, row->room_id)) return false;
    if (f->not_tags && tagged(f->not_tags, row->tags)) return false; /* wins over tags */
    if (f->tags && !tagged(f->tags, row->tags)) return false;
    return true;
}

static bool in_ranges(const ssync_list *l, int64_t index)
{
    if (l->n_ranges < 0) return true;
    for (int i = 0; i < l->n_ranges; i++)
        if (index >= l->ranges[i][0] && index <= l->ranges[i][1]) return true;
    return false;
}

/* Merge a config into a room's pick (created with row index i when absent). */
static json_t *pick_merge(json_t *picked, const char *room_id, int i, const ssync_config *cfg)
{
    json_t *pk = json_object_get(picked, room_id);
    if (!pk) {
        pk = json_pack("{s:i, s:I, s:[], s:[]}", "i", i, "tl", (json_int_t)cfg->timeline_limit, "rs", "lists");
        json_object_set_new(picked, room_id, pk);
    } else if (json_integer_value(json_object_get(pk, "tl")) < cfg->timeline_limit) {
        json_object_set_new(pk, "tl", json_integer(cfg->timeline_limit));
    }
    if (cfg->required_state) json_array_extend(json_object_get(pk, "rs"), (json_t *)cfg->required_state);
    return pk;
}

int ssync_lists_apply(sync_ctx *s, const ssync_request *q, const ssync_rooms *rs,
                      json_t *counts, json_t *picked)
{
    for (size_t li = 0; li < q->n_lists; li++) {
        const ssync_list *l = &q->lists[li];
        json_t *children = NULL;
        if (l->f.spaces && space_children(s, l->f.spaces, &children) < 0) return ROOMS_E_DB;
        int64_t count = 0;
        for (int i = 0; i < rs->n_ordered; i++) {
            if (!filters_match(&l->f, &rs->rows[i], children)) continue;
            if (in_ranges(l, count)) {
                json_t *pk = pick_merge(picked, rs->rows[i].room_id, i, &l->cfg);
                json_array_append_new(json_object_get(pk, "lists"), json_string(l->name));
            }
            count++;
        }
        if (rs->total >= 0) count = rs->total; /* only the top of the order was read */
        json_decref(children);
        json_object_set_new(counts, l->name, json_integer(count));
    }
    return ROOMS_OK;
}

void ssync_subs_apply(const ssync_request *q, const ssync_rooms *rs, json_t *picked)
{
    for (size_t si = 0; si < q->n_subs; si++) {
        for (int i = 0; i < rs->n; i++) {
            if (strcmp(rs->rows[i].room_id, q->subs[si].room_id) != 0) continue;
            json_t *pk = pick_merge(picked, rs->rows[i].room_id, i, &q->subs[si].cfg);
            json_object_set_new(pk, "sub", json_true());
            break;
        }
    }
}
