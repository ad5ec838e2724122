/*
 * core/client/sync/sync_counts.c - the counts of one room that /sync (sync_rooms.c) and
 * Simplified Sliding Sync (ssync_room.c) send: unread_notifications and the summary.
 *
 * Decisions owned here:
 *   - unread_notifications: the unread events (from others, after the user's newest read
 *     receipt or own event, at most SYNC_MAX_UNREAD_COUNT) judged by the user's push rules
 *     (push_eval.c): notification_count = those that notify, highlight_count = those that
 *     also highlight. The rules are read once per response (s->push_rules), the room's
 *     context (members, display name, power levels) once per room.
 *   - summary: m.heroes by the spec's rule and the joined and invited member counts.
 */
#include <stdlib.h>
#include <string.h>

#include "core/client/push/push_eval.h"
#include "core/client/push/push_rules.h"
#include "core/client/sync/sync_rooms.h"
#include "core/rooms/events_pdus.h"

/* The unread events of each room of $1 and, for the rooms that have some, what push rules
 * read about them, in one statement (two before; both run for every woken sync).
 *
 * The unread events (the rule of sync_rooms_unread): from others, up to upto ($3), after
 * the user's ($2) newest read receipt or own event, newest first, at most $4 a room; IDs
 * only, the PDUs come from the shared parsed ones (events_pdus.h) and the few missing
 * there from PDUS_SQL (a thousand woken members each had their 99 unread PDUs sent again).
 * A row 'u' each: the room's index in $1 (from 1), the event ID and position.
 *
 * The push context (push_eval.h) of each room with unread events, a row 'c' each: its
 * index, then (from column CTX_COL) the room version, the creator, the joined member count
 * (kept by rooms migration 10, core/rooms/rooms.c), the user's member event and its ID,
 * the current power levels, whether they were redacted, and their ID.
 *
 * Ordered: the 'c' rows first, then the 'u' rows by room index and newest first. */
#define CTX_COL 4
static const char UNREAD_SQL[] =
    "WITH u AS (SELECT r.i, u.event_id, u.stream_pos"
    " FROM unnest($1::text[]) WITH ORDINALITY AS r(id, i) CROSS JOIN LATERAL"
    " (SELECT e.stream_pos, e.event_id FROM events e WHERE e.room_id = r.id"
    "  AND e.stream_pos <= $3 AND e.sender <> $2 AND e.redacted_by IS NULL"
    "  AND e.stream_pos > greatest("
    "   coalesce((SELECT max(x.stream_pos) FROM receipts rc"
    "    JOIN events x ON x.event_id = rc.event_id WHERE rc.room_id = r.id"
    "    AND rc.user_id = $2"
    "    AND rc.receipt_type IN ('m.read', 'm.read.private')), 0),"
    "   coalesce((SELECT max(o.stream_pos) FROM events o"
    "    WHERE o.room_id = r.id AND o.sender = $2 AND o.stream_pos <= $3), 0))"
    "  ORDER BY e.stream_pos DESC LIMIT $4) u),"
    " r AS (SELECT DISTINCT i, ($1::text[])[i] AS id FROM u)"
    " SELECT 'c', r.i, NULL, NULL::bigint, rm.room_version, rm.creator, rm.joined_members,"
    " me.pdu, me.event_id, pl.pdu, pl.redacted_by IS NOT NULL, pl.event_id"
    " FROM r JOIN rooms rm ON rm.room_id = r.id"
    " LEFT JOIN LATERAL (SELECT e.pdu, e.event_id FROM current_state cs JOIN events e"
    "  ON e.event_id = cs.event_id WHERE cs.room_id = r.id"
    "  AND cs.type = 'm.room.member' AND cs.state_key = $2"
    "  AND e.redacted_by IS NULL) me ON true"
    " LEFT JOIN LATERAL (SELECT e.pdu, e.redacted_by, e.event_id"
    "  FROM current_state cs JOIN events e ON e.event_id = cs.event_id"
    "  WHERE cs.room_id = r.id AND cs.type = 'm.room.power_levels'"
    "  AND cs.state_key = '') pl ON true"
    " UNION ALL SELECT 'u', u.i, u.event_id, u.stream_pos, NULL, NULL, NULL, NULL, NULL,"
    " NULL, NULL, NULL FROM u"
    " ORDER BY 1, 2, 4 DESC";

/* The parsed PDUs a room's push context points into (shared, events_pdus.h), given back
 * once its events are judged, and the redacted power levels made for it. */
typedef struct push_room_held {
    json_t *member, *power_levels, *redacted;
} push_room_held;

/* The 'c' row `row` of an UNREAD_SQL result into *pr, pointing into what *held holds (the
 * caller gives it back with push_room_release). */
static void push_room_of(sync_ctx *s, PGresult *res, int row, push_room *pr, push_room_held *held)
{
    events_pdus *pdus = events_pdus_global();
    *pr = (push_room){0};
    *held = (push_room_held){0};
    pr->member_count = atoll(PQgetvalue(res, row, CTX_COL + 2));
    pr->creator = rt_arena_strdup(s->r->arena, PQgetvalue(res, row, CTX_COL + 1));
    if (!PQgetisnull(res, row, CTX_COL + 3))
        held->member = events_pdus_get(pdus, PQgetvalue(res, row, CTX_COL + 4),
                                       PQgetvalue(res, row, CTX_COL + 3));
    if (held->member) pr->display_name = event_content_str(held->member, "displayname");
    if (!PQgetisnull(res, row, CTX_COL + 5))
        held->power_levels = events_pdus_get(pdus, PQgetvalue(res, row, CTX_COL + 7),
                                             PQgetvalue(res, row, CTX_COL + 5));
    if (held->power_levels) {
        json_t *content = json_object_get(held->power_levels, "content");
        const room_version *ver = room_version_find(PQgetvalue(res, row, CTX_COL));
        if (PQgetvalue(res, row, CTX_COL + 6)[0] == 't' && ver)
            content = held->redacted = event_redact_content(ver, "m.room.power_levels", content);
        pr->power_levels = content;
    }
}

static void push_room_release(push_room_held *held)
{
    events_pdus *pdus = events_pdus_global();
    events_pdus_put(pdus, held->member);
    events_pdus_put(pdus, held->power_levels);
    json_decref(held->redacted);
}

/* An UNREAD_SQL result: its 'c' rows are [0, first), its 'u' rows [first, PQntuples). */
typedef struct unread_rows {
    PGresult *res;
    int first, n; /* the 'u' rows: n of them from first */
} unread_rows;

/* The PDUs of the events of $1 (IDs) with each one's index in $1 (from 1). */
static const char PDUS_SQL[] =
    "SELECT q.i, e.pdu FROM unnest($1::text[]) WITH ORDINALITY AS q(id, i)"
    " JOIN events e ON e.event_id = q.id";

/* The parsed PDU of each unread event (the k-th 'u' row) into pdus[k] (NULL for one that
 * does not parse: corrupt rows are logged where events are rendered), each a reference to
 * give back with events_pdus_put. ROOMS_OK or ROOMS_E_DB. */
static int unread_pdus(sync_ctx *s, const unread_rows *u, json_t **pdus)
{
    events_pdus *cache = events_pdus_global();
    json_t *missing = json_array();
    int *where = calloc((size_t)u->n + 1, sizeof(*where));
    int rc = missing && where ? ROOMS_OK : ROOMS_E_DB;
    for (int k = 0; rc == ROOMS_OK && k < u->n; k++) {
        const char *id = PQgetvalue(u->res, u->first + k, 2);
        if ((pdus[k] = events_pdus_peek(cache, id))) continue;
        where[json_array_size(missing)] = k;
        json_array_append_new(missing, json_string(id));
    }
    if (rc == ROOMS_OK && json_array_size(missing) > 0) {
        const char *p[1] = {rooms_pg_array(s->r->arena, missing)};
        PGresult *res = p[0] ? rooms_q(s->c, PDUS_SQL, 1, p, NULL) : NULL;
        if (!res) rc = ROOMS_E_DB;
        for (int row = 0; res && row < PQntuples(res); row++) {
            size_t k = (size_t)atoll(PQgetvalue(res, row, 0)) - 1;
            if (k >= json_array_size(missing) || pdus[where[k]]) continue;
            pdus[where[k]] = events_pdus_get(cache, json_string_value(json_array_get(missing, k)),
                                             PQgetvalue(res, row, 1));
        }
        PQclear(res);
    }
    json_decref(missing);
    free(where);
    return rc;
}

static void release_pdus(json_t **pdus, int n)
{
    events_pdus *cache = events_pdus_global();
    for (int i = 0; pdus && i < n; i++) events_pdus_put(cache, pdus[i]);
    free(pdus);
}

/* Count the unread events (pdus[from, to)) whose push actions notify, and those that also
 * highlight, with the room's push context pr. */
static void count_notifications(sync_ctx *s, const char *room_id, const push_room *pr, json_t *const *pdus,
                                int from, int to, json_int_t *counts)
{
    bool out_of_steps = false;
    for (int i = from; i < to; i++) {
        if (!pdus[i]) continue;
        push_outcome o = push_program_run(s->push_rules, pdus[i], pr);
        counts[0] += o.notify;
        counts[1] += o.highlight;
        out_of_steps = out_of_steps || o.out_of_steps;
    }
    if (out_of_steps)
        rt_log(ATRIUM_LOG_DEBUG, "core", "push rules of %s in %s: matching work ran out "
               "(PUSH_MAX_STEPS); some rules were not tried", s->user, room_id);
}

/* The room index (from 1) of the k-th unread event. */
static size_t unread_room(const unread_rows *u, int k)
{
    return (size_t)atoll(PQgetvalue(u->res, u->first + k, 1));
}

/* The counts of each room with unread events, judged with its push context (the 'c'
 * rows). Loads the user's rules once per response. */
static int judge_unread(sync_ctx *s, const json_t *ids, const unread_rows *u, json_int_t (*counts)[2])
{
    if (!s->push_rules) {
        bool db_ok;
        json_t *global = push_rules_for(s->r, s->c, &db_ok);
        s->push_rules = global ? push_program_new(global) : NULL;
        json_decref(global);
        if (!s->push_rules) return ROOMS_E_DB;
    }
    json_t **pdus = calloc((size_t)u->n + 1, sizeof(*pdus));
    if (!pdus || unread_pdus(s, u, pdus) != ROOMS_OK) {
        release_pdus(pdus, u->n);
        return ROOMS_E_DB;
    }
    for (int row = 0; row < u->first; row++) {
        size_t room = (size_t)atoll(PQgetvalue(u->res, row, 1));
        if (room < 1 || room > json_array_size(ids)) continue;
        push_room pr;
        push_room_held held;
        push_room_of(s, u->res, row, &pr, &held);
        int from = 0, to;
        while (from < u->n && unread_room(u, from) != room) from++;
        for (to = from; to < u->n && unread_room(u, to) == room;) to++;
        count_notifications(s, json_string_value(json_array_get(ids, room - 1)), &pr, pdus, from,
                            to, counts[room - 1]);
        push_room_release(&held);
    }
    release_pdus(pdus, u->n);
    return ROOMS_OK;
}

/* UNREAD_SQL's parameters for the rooms of ids, in s's arena (p[0] NULL: out of memory). */
static void unread_params(sync_ctx *s, const json_t *ids, const char *p[4])
{
    p[0] = rooms_pg_array(s->r->arena, ids);
    p[1] = s->user;
    p[2] = crooms_i64(s->r, s->upto);
    p[3] = crooms_i64(s->r, SYNC_MAX_UNREAD_COUNT);
}

bool sync_rooms_unread_send(sync_ctx *s, PGconn *c, const json_t *ids)
{
    const char *p[4];
    unread_params(s, ids, p);
    return p[0] && db_query_send(c, UNREAD_SQL, 4, p);
}

int sync_rooms_unread_take(sync_ctx *s, const json_t *ids, PGresult *res, json_int_t (*counts)[2])
{
    memset(counts, 0, json_array_size(ids) * sizeof(*counts));
    if (!res) return ROOMS_E_DB;
    unread_rows u = {res, 0, 0};
    while (u.first < PQntuples(res) && PQgetvalue(res, u.first, 0)[0] == 'c') u.first++;
    u.n = PQntuples(res) - u.first;
    int rc = u.n > 0 ? judge_unread(s, ids, &u, counts) : ROOMS_OK;
    PQclear(res);
    return rc;
}

/* unread_notifications: of the events from others after the user's newest read receipt or
 * own event (at most SYNC_MAX_UNREAD_COUNT, newest first, redacted ones left out), those
 * the user's push rules make notify, and those that also highlight. One query for all the
 * rooms of ids (and one for the rules, once per response, when there is something to
 * judge). */
int sync_rooms_unread(sync_ctx *s, const json_t *ids, json_int_t (*counts)[2])
{
    const char *p[4];
    unread_params(s, ids, p);
    return sync_rooms_unread_take(s, ids, p[0] ? rooms_q(s->c, UNREAD_SQL, 4, p, NULL) : NULL, counts);
}

int sync_room_unread(sync_ctx *s, const char *room_id, json_t *room)
{
    json_t *ids = json_pack("[s]", room_id);
    json_int_t counts[1][2];
    int rc = ids ? sync_rooms_unread(s, ids, counts) : ROOMS_E_DB;
    json_decref(ids);
    if (rc < 0) return rc;
    json_object_set_new(room, "unread_notifications",
                        json_pack("{s:I, s:I}", "notification_count", counts[0][0], "highlight_count",
                                  counts[0][1]));
    return ROOMS_OK;
}

/* m.heroes and member counts; sent with a room's full state or when its members changed. */
int sync_room_summary(sync_ctx *s, const char *room_id, json_t *room)
{
    const char *p[3] = {room_id, s->user, crooms_i64(s->r, SYNC_MAX_HEROES)};
    /* Heroes (the spec's rule): the first SYNC_MAX_HEROES other members by the stream
     * order of their membership, joined or invited ones; when there are none, those who
     * left or were banned. */
#define HEROES_SQL(memberships)                                                            \
    "(SELECT coalesce(json_agg(h.state_key ORDER BY h.pos), '[]')::text FROM"               \
    "  (SELECT cs.state_key, e.stream_pos AS pos FROM current_state cs"                    \
    "   JOIN events e ON e.event_id = cs.event_id WHERE cs.room_id = $1"                  \
    "   AND cs.type = 'm.room.member' AND cs.membership IN " memberships                   \
    "   AND cs.state_key <> $2 ORDER BY e.stream_pos LIMIT $3) h)"
    /* The counts kept with the room (rooms migration 10, core/rooms/rooms.c). */
    PGresult *res = rooms_q(s->c,
                            "SELECT coalesce(rm.joined_members, 0), coalesce(rm.invited_members, 0),"
                            " " HEROES_SQL("('join', 'invite')") ","
                            " " HEROES_SQL("('leave', 'ban')")
                            " FROM (SELECT 1) one LEFT JOIN rooms rm ON rm.room_id = $1",
                            3, p, NULL);
#undef HEROES_SQL
    if (!res) return ROOMS_E_DB;
    json_t *heroes = json_loads(PQgetvalue(res, 0, 2), 0, NULL);
    if (json_array_size(heroes) == 0) {
        json_decref(heroes);
        heroes = json_loads(PQgetvalue(res, 0, 3), 0, NULL);
    }
    json_object_set_new(room, "summary",
                        json_pack("{s:o, s:I, s:I}", "m.heroes", heroes ? heroes : json_array(),
                                  "m.joined_member_count", (json_int_t)atoll(PQgetvalue(res, 0, 0)),
                                  "m.invited_member_count", (json_int_t)atoll(PQgetvalue(res, 0, 1))));
    PQclear(res);
    return ROOMS_OK;
}
