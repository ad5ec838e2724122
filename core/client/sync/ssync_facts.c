/*
 * core/client/sync/ssync_facts.c - what the results of a sliding sync's picked rooms read,
 * read once for all of them: each room's history visibility, name and avatar, member
 * counts, heroes and unread counts, with five queries whatever the window's size (instead
 * of about six per room, which is what made a 20-room first response slow).
 *
 * Decisions owned here: which connection reads what. Visibility on the run's own (the
 * timelines need it); the push rules, the unread events and the names on a second
 * connection, sent at once as a pipeline while the run's own reads timelines and
 * required_state, when the pool can spare one (db_acquire_spare), else on the run's own
 * after those reads (docs/adr/0044-sliding-sync-reads-on-two-connections.md). None of the
 * rules; they stay where they live (history visibility in core/rooms/rooms_vis.c, unread
 * counts in sync_counts.c, heroes by the rule of sync_room_summary, which this file's
 * query applies to every room at once). What it does not do: timelines and
 * required_state (ssync_reads.c).
 */
#include <stdlib.h>
#include <string.h>

#include "core/client/push/push_eval.h"
#include "core/client/push/push_rules.h"
#include "core/client/sync/ssync.h"
#include "core/store/db.h"

/* Per room of $1 (a row each, with its index from 1): the current m.room.name and
 * m.room.avatar (position and value), the joined and invited member counts (kept with the
 * room: rooms migration 10, core/rooms/rooms.c), and the heroes
 * (sync_room_summary's rule: the first SYNC_MAX_HEROES other joined or invited members by
 * the position of their membership, else those who left or were banned) with the display
 * name and avatar of their current member event; NULL for a named room. */
#define HEROES_SQL(memberships)                                                                \
    "(SELECT coalesce(json_agg(json_build_object('user_id', h.state_key, 'displayname', h.dn,"  \
    "  'avatar_url', h.av) ORDER BY h.pos), '[]')::text FROM"                                  \
    "  (SELECT cs.state_key, e.stream_pos AS pos, e.pdu::jsonb -> 'content' ->> 'displayname' AS dn," \
    "   e.pdu::jsonb -> 'content' ->> 'avatar_url' AS av FROM current_state cs"                \
    "   JOIN events e ON e.event_id = cs.event_id WHERE cs.room_id = r.id"                     \
    "   AND cs.type = 'm.room.member' AND cs.membership IN " memberships                       \
    "   AND cs.state_key <> $2 ORDER BY e.stream_pos LIMIT $3) h)"
#define NAMED_SQL(type, field)                                                                  \
    " LEFT JOIN LATERAL (SELECT e.stream_pos AS pos, e.pdu::jsonb -> 'content' ->> '" field "' AS val" \
    "  FROM current_state cs JOIN events e ON e.event_id = cs.event_id WHERE cs.room_id = r.id" \
    "  AND cs.type = '" type "' AND cs.state_key = '') "
static const char FACTS_SQL[] =
    "SELECT r.i, nm.pos, nm.val, av.pos, av.val,"
    " coalesce(rm.joined_members, 0), coalesce(rm.invited_members, 0),"
    /* Heroes only for a room without a name: no one reads them otherwise. */
    " CASE WHEN coalesce(nm.val, '') = '' THEN coalesce(nullif(" HEROES_SQL("('join', 'invite')") ", '[]'),"
    "  " HEROES_SQL("('leave', 'ban')") ") END"
    " FROM unnest($1::text[]) WITH ORDINALITY AS r(id, i)"
    " LEFT JOIN rooms rm ON rm.room_id = r.id"
    NAMED_SQL("m.room.name", "name") "nm ON true"
    NAMED_SQL("m.room.avatar", "url") "av ON true"
    " ORDER BY r.i";
#undef HEROES_SQL
#undef NAMED_SQL

/* One named field of a facts row: whether the room has such an event, its position
 * (backfilled history has positions <= 0) and its value (NULL when unset or empty), in r's
 * arena. */
static void named(atrium_req *r, PGresult *res, int row, int col, bool *has, int64_t *pos, const char **val)
{
    *has = !PQgetisnull(res, row, col);
    *pos = *has ? atoll(PQgetvalue(res, row, col)) : 0;
    *val = PQgetisnull(res, row, col + 1) || !PQgetvalue(res, row, col + 1)[0]
               ? NULL
               : rt_arena_strdup(r->arena, PQgetvalue(res, row, col + 1));
}

/* The heroes as a room result sends them: nulls left out. */
static json_t *heroes_of(const char *text)
{
    json_t *all = json_loads(text, 0, NULL), *out = json_array();
    size_t i;
    json_t *h;
    json_array_foreach(all, i, h)
    {
        json_t *hero = json_pack("{s:O}", "user_id", json_object_get(h, "user_id"));
        if (json_is_string(json_object_get(h, "displayname")))
            json_object_set(hero, "displayname", json_object_get(h, "displayname"));
        if (json_is_string(json_object_get(h, "avatar_url")))
            json_object_set(hero, "avatar_url", json_object_get(h, "avatar_url"));
        json_array_append_new(out, hero);
    }
    json_decref(all);
    return out;
}

/* Each room's history visibility into out[i].vis (one query). */
static int visibility(sync_ctx *s, const json_t *ids, ssync_facts *out)
{
    size_t n = json_array_size(ids);
    rooms_vis *vis = malloc(n * sizeof(*vis));
    if (!vis) return ROOMS_E_DB;
    int rc = rooms_vis_load_many(s->c, ids, s->user, vis);
    for (size_t i = 0; rc == ROOMS_OK && i < n; i++) out[i].vis = vis[i];
    free(vis);
    return rc;
}

/* FACTS_SQL's parameters for ids, in s's arena (p[0] NULL: out of memory). */
static void names_params(sync_ctx *s, const json_t *ids, const char *p[3])
{
    p[0] = rooms_pg_array(s->r->arena, ids);
    p[1] = s->user;
    p[2] = crooms_i64(s->r, SYNC_MAX_HEROES);
}

/* Names, avatars, counts and heroes into out, from FACTS_SQL's result (NULL: it failed;
 * consumed). */
static int names_take(sync_ctx *s, const json_t *ids, PGresult *res, ssync_facts *out)
{
    if (!res) return ROOMS_E_DB;
    for (int row = 0; row < PQntuples(res); row++) {
        size_t i = (size_t)atoll(PQgetvalue(res, row, 0)) - 1;
        if (i >= json_array_size(ids)) continue;
        ssync_facts *f = &out[i];
        named(s->r, res, row, 1, &f->has_name, &f->name_pos, &f->name);
        named(s->r, res, row, 3, &f->has_avatar, &f->avatar_pos, &f->avatar);
        f->joined = atoll(PQgetvalue(res, row, 5));
        f->invited = atoll(PQgetvalue(res, row, 6));
        f->heroes = PQgetisnull(res, row, 7) ? NULL : heroes_of(PQgetvalue(res, row, 7));
    }
    PQclear(res);
    return ROOMS_OK;
}

/* The unread counts into out: from UNREAD_SQL's result `res` taken from the second
 * connection (NULL: it failed; consumed), or with `serial`, read on s->c. */
static int unread_take(sync_ctx *s, const json_t *ids, bool serial, PGresult *res, ssync_facts *out)
{
    size_t n = json_array_size(ids);
    json_int_t(*unread)[2] = malloc(n * sizeof(*unread));
    int rc = !unread                ? ROOMS_E_DB
             : serial               ? sync_rooms_unread(s, ids, unread)
                                    : sync_rooms_unread_take(s, ids, res, unread);
    if (!unread) PQclear(res);
    for (size_t i = 0; rc == ROOMS_OK && i < n; i++) {
        out[i].notification_count = unread[i][0];
        out[i].highlight_count = unread[i][1];
    }
    free(unread);
    return rc;
}

/* Runs that read on a second connection, and those that found none to spare. */
static rt_metric *m_second, *m_second_missed;

void ssync_facts_metrics(rt_metrics *metrics)
{
    m_second = rt_metric_counter(metrics, "atrium_sliding_sync_second_connection_total", "got=\"yes\"",
                                 "Sliding sync runs that read unread counts and names on a second connection");
    m_second_missed = rt_metric_counter(metrics, "atrium_sliding_sync_second_connection_total", "got=\"no\"",
                                        "Sliding sync runs that found no connection to spare (read on one)");
}

/* Give back the second connection, out of pipeline mode. */
static void second_release(ssync_facts_read *fr)
{
    if (!fr->c2) return;
    db_pipeline_end(fr->c2);
    db_release(db_global(), fr->c2);
    fr->c2 = NULL;
}

/* The second connection's pipeline: generic plans for its statements (as s->c has them,
 * ssync.c "Generic plans"), the user's push rules, the unread events, the names, and the
 * connection's own plan_cache_mode again (the pipeline's implicit transaction undoes the
 * first setting instead when a statement fails). */
static const char GENERIC_SQL[] = "SELECT set_config('plan_cache_mode', 'force_generic_plan', false)";
static const char OWN_MODE_SQL[] = "RESET plan_cache_mode";

/* A second connection for the run, running the pipeline; none when the pool has none to
 * spare (never waited for: the run then reads on s->c alone) or it failed to send. */
static void second_start(sync_ctx *s, const json_t *ids, ssync_facts_read *fr)
{
    fr->c2 = db_acquire_spare(db_global());
    rt_metric_add(fr->c2 ? m_second : m_second_missed, 1);
    if (!fr->c2) return;
    const char *p[3];
    names_params(s, ids, p);
    if (!p[0] || !db_pipeline_begin(fr->c2)) {
        db_release(db_global(), fr->c2);
        fr->c2 = NULL;
        return;
    }
    bool sent = db_query_send(fr->c2, GENERIC_SQL, 0, NULL) && push_rules_send(fr->c2, s->user) &&
                sync_rooms_unread_send(s, fr->c2, ids) && db_query_send(fr->c2, FACTS_SQL, 3, p) &&
                db_query_send(fr->c2, OWN_MODE_SQL, 0, NULL);
    /* Synced even when a send failed: the pipeline's end waits for its sync point. */
    if (!db_pipeline_sync(fr->c2) || !sent) second_release(fr);
}

int ssync_facts_start(sync_ctx *s, const json_t *ids, ssync_facts *out, ssync_facts_read *fr)
{
    *fr = (ssync_facts_read){0};
    size_t n = json_array_size(ids);
    for (size_t i = 0; i < n; i++) out[i] = (ssync_facts){0};
    if (n == 0) return ROOMS_OK;
    second_start(s, ids, fr);
    return visibility(s, ids, out);
}

/* The pipeline's results, in its order. */
static int second_take(sync_ctx *s, const json_t *ids, ssync_facts *out, ssync_facts_read *fr)
{
    PQclear(rooms_q_taken(db_query_result(fr->c2))); /* generic plans */
    bool rules_ok;
    json_t *rules = push_rules_take(s->r, rooms_q_taken(db_query_result(fr->c2)), &rules_ok);
    if (rules && !s->push_rules) s->push_rules = push_program_new(rules); /* judge_unread's */
    json_decref(rules);
    PGresult *unread = rooms_q_taken(db_query_result(fr->c2));
    PGresult *names = rooms_q_taken(db_query_result(fr->c2));
    PGresult *own = rooms_q_taken(db_query_result(fr->c2));
    second_release(fr);
    bool ok = rules_ok && own && s->push_rules;
    PQclear(own);
    if (!ok) {
        PQclear(unread);
        PQclear(names);
        return ROOMS_E_DB;
    }
    int rc = unread_take(s, ids, false, unread, out);
    if (rc == ROOMS_OK) return names_take(s, ids, names, out);
    PQclear(names);
    return rc;
}

int ssync_facts_finish(sync_ctx *s, const json_t *ids, ssync_facts *out, ssync_facts_read *fr, bool ok)
{
    if (json_array_size(ids) == 0 || !ok) {
        second_release(fr);
        return ROOMS_OK;
    }
    if (fr->c2) return second_take(s, ids, out, fr);
    /* One connection: one statement after the other. */
    const char *p[3];
    names_params(s, ids, p);
    int rc = names_take(s, ids, p[0] ? rooms_q(s->c, FACTS_SQL, 3, p, NULL) : NULL, out);
    return rc == ROOMS_OK ? unread_take(s, ids, true, NULL, out) : rc;
}

void ssync_facts_free(ssync_facts *f, size_t n)
{
    for (size_t i = 0; i < n; i++) json_decref(f[i].heroes);
}
