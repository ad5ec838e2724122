/*
 * core/client/sync/ssync_facts.c - what the results of a sliding sync's picked rooms read,
 * read once for all of them: each room's history visibility, name and avatar, member
 * counts, heroes and unread counts, with four queries whatever the window's size (instead
 * of about six per room, which is what made a 20-room first response slow).
 *
 * Decisions owned here: none of the rules; they stay where they live (history visibility
 * in core/rooms/rooms_vis.c, unread counts in sync_counts.c, heroes by the rule of
 * sync_room_summary, which this file's query applies to every room at once). What it does
 * not do: timelines and required_state, which stay per room (ssync_room.c).
 */
#include <stdlib.h>
#include <string.h>

#include "core/client/sync/ssync.h"

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

/* Names, avatars, counts and heroes into out (one query). */
static int names(sync_ctx *s, const json_t *ids, ssync_facts *out)
{
    const char *p[3] = {rooms_pg_array(s->r->arena, ids), s->user, crooms_i64(s->r, SYNC_MAX_HEROES)};
    PGresult *res = p[0] ? rooms_q(s->c, FACTS_SQL, 3, p, NULL) : NULL;
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

int ssync_facts_load(sync_ctx *s, const json_t *ids, ssync_facts *out)
{
    size_t n = json_array_size(ids);
    for (size_t i = 0; i < n; i++) out[i] = (ssync_facts){0};
    if (n == 0) return ROOMS_OK;
    json_int_t(*unread)[2] = malloc(n * sizeof(*unread));
    if (!unread) return ROOMS_E_DB;
    int rc = visibility(s, ids, out);
    if (rc == ROOMS_OK) rc = names(s, ids, out);
    if (rc == ROOMS_OK) rc = sync_rooms_unread(s, ids, unread);
    for (size_t i = 0; rc == ROOMS_OK && i < n; i++) {
        out[i].notification_count = unread[i][0];
        out[i].highlight_count = unread[i][1];
    }
    free(unread);
    return rc;
}

void ssync_facts_free(ssync_facts *f, size_t n)
{
    for (size_t i = 0; i < n; i++) json_decref(f[i].heroes);
}
