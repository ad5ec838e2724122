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

#include "core/client/push/push_eval.h"
#include "core/client/push/push_rules.h"
#include "core/client/sync/sync_rooms.h"

/* What push rules read about a room (push_eval.h), in one query: the joined member count,
 * the user's display name from their member event, the current power levels (redacted
 * when their event was) and the creator. The JSON pr points into is owned by *holder. */
static int push_room_load(sync_ctx *s, const char *room_id, push_room *pr, json_t **holder)
{
    *pr = (push_room){0};
    *holder = json_array();
    const char *p[2] = {room_id, s->user};
    PGresult *res = rooms_q(s->c,
                            "SELECT rm.room_version, rm.creator,"
                            " (SELECT count(*) FROM current_state WHERE room_id = $1"
                            "  AND type = 'm.room.member' AND membership = 'join'),"
                            " (SELECT e.pdu FROM current_state cs JOIN events e"
                            "  ON e.event_id = cs.event_id WHERE cs.room_id = $1"
                            "  AND cs.type = 'm.room.member' AND cs.state_key = $2"
                            "  AND e.redacted_by IS NULL),"
                            " pl.pdu, pl.redacted_by IS NOT NULL"
                            " FROM rooms rm LEFT JOIN LATERAL (SELECT e.pdu, e.redacted_by"
                            "  FROM current_state cs JOIN events e ON e.event_id = cs.event_id"
                            "  WHERE cs.room_id = $1 AND cs.type = 'm.room.power_levels'"
                            "  AND cs.state_key = '') pl ON true WHERE rm.room_id = $1",
                            2, p, NULL);
    if (!res) return ROOMS_E_DB;
    if (PQntuples(res) == 1) {
        pr->member_count = atoll(PQgetvalue(res, 0, 2));
        pr->creator = rt_arena_strdup(s->r->arena, PQgetvalue(res, 0, 1));
        json_t *member = PQgetisnull(res, 0, 3) ? NULL : json_loads(PQgetvalue(res, 0, 3), 0, NULL);
        if (member && json_array_append_new(*holder, member) == 0)
            pr->display_name = event_content_str(member, "displayname");
        json_t *pl = PQgetisnull(res, 0, 4) ? NULL : json_loads(PQgetvalue(res, 0, 4), 0, NULL);
        if (pl && json_array_append_new(*holder, pl) == 0) {
            json_t *content = json_object_get(pl, "content");
            const room_version *ver = room_version_find(PQgetvalue(res, 0, 0));
            if (PQgetvalue(res, 0, 5)[0] == 't' && ver) {
                content = event_redact_content(ver, "m.room.power_levels", content);
                if (json_array_append_new(*holder, content) < 0) content = NULL;
            }
            pr->power_levels = content;
        }
    }
    PQclear(res);
    return ROOMS_OK;
}

/* Count the unread events (PDUs in column 0 of events) whose push actions notify, and
 * those that also highlight. Loads the user's rules once per sync response. */
static int count_notifications(sync_ctx *s, const char *room_id, PGresult *events,
                               json_int_t *notify, json_int_t *highlight)
{
    if (!s->push_rules) {
        bool db_ok;
        if (!(s->push_rules = push_rules_for(s->r, s->c, &db_ok))) return ROOMS_E_DB;
    }
    push_room pr;
    json_t *holder;
    int rc = push_room_load(s, room_id, &pr, &holder);
    bool out_of_steps = false;
    for (int i = 0; rc >= 0 && i < PQntuples(events); i++) {
        json_t *pdu = json_loads(PQgetvalue(events, i, 0), 0, NULL);
        if (!pdu) continue; /* corrupt rows are logged where events are rendered */
        push_outcome o = push_eval(s->push_rules, pdu, &pr);
        json_decref(pdu);
        *notify += o.notify;
        *highlight += o.highlight;
        out_of_steps = out_of_steps || o.out_of_steps;
    }
    json_decref(holder);
    if (out_of_steps)
        rt_log(ATRIUM_LOG_DEBUG, "core", "push rules of %s in %s: matching work ran out "
               "(PUSH_MAX_STEPS); some rules were not tried", s->user, room_id);
    return rc;
}

/* unread_notifications: of the events from others after the user's newest read receipt or
 * own event (at most SYNC_MAX_UNREAD_COUNT, newest first, redacted ones left out), those
 * the user's push rules make notify, and those that also highlight. */
int sync_room_unread(sync_ctx *s, const char *room_id, json_t *room)
{
    const char *p[4] = {room_id, s->user, rooms_i64(s->r, s->upto), rooms_i64(s->r, SYNC_MAX_UNREAD_COUNT)};
    PGresult *res = rooms_q(s->c,
                            "SELECT e.pdu FROM events e WHERE e.room_id = $1"
                            " AND e.stream_pos <= $3 AND e.sender <> $2 AND e.redacted_by IS NULL"
                            " AND e.stream_pos > greatest("
                            "  coalesce((SELECT max(x.stream_pos) FROM receipts rc"
                            "   JOIN events x ON x.event_id = rc.event_id WHERE rc.room_id = $1"
                            "   AND rc.user_id = $2"
                            "   AND rc.receipt_type IN ('m.read', 'm.read.private')), 0),"
                            "  coalesce((SELECT max(o.stream_pos) FROM events o"
                            "   WHERE o.room_id = $1 AND o.sender = $2 AND o.stream_pos <= $3), 0))"
                            " ORDER BY e.stream_pos DESC LIMIT $4",
                            4, p, NULL);
    if (!res) return ROOMS_E_DB;
    json_int_t notify = 0, highlight = 0;
    int rc = PQntuples(res) > 0 ? count_notifications(s, room_id, res, &notify, &highlight)
                                : ROOMS_OK;
    PQclear(res);
    if (rc < 0) return rc;
    json_object_set_new(room, "unread_notifications",
                        json_pack("{s:I, s:I}", "notification_count", notify, "highlight_count",
                                  highlight));
    return ROOMS_OK;
}

/* m.heroes and member counts; sent with a room's full state or when its members changed. */
int sync_room_summary(sync_ctx *s, const char *room_id, json_t *room)
{
    const char *p[3] = {room_id, s->user, rooms_i64(s->r, SYNC_MAX_HEROES)};
    /* Heroes (the spec's rule): the first SYNC_MAX_HEROES other members by the stream
     * order of their membership, joined or invited ones; when there are none, those who
     * left or were banned. */
#define HEROES_SQL(memberships)                                                            \
    "(SELECT coalesce(json_agg(h.state_key ORDER BY h.pos), '[]')::text FROM"               \
    "  (SELECT cs.state_key, e.stream_pos AS pos FROM current_state cs"                    \
    "   JOIN events e ON e.event_id = cs.event_id WHERE cs.room_id = $1"                  \
    "   AND cs.type = 'm.room.member' AND cs.membership IN " memberships                   \
    "   AND cs.state_key <> $2 ORDER BY e.stream_pos LIMIT $3) h)"
    PGresult *res = rooms_q(s->c,
                            "SELECT count(*) FILTER (WHERE membership = 'join'),"
                            " count(*) FILTER (WHERE membership = 'invite'),"
                            " " HEROES_SQL("('join', 'invite')") ","
                            " " HEROES_SQL("('leave', 'ban')")
                            " FROM current_state WHERE room_id = $1 AND type = 'm.room.member'"
                            " AND membership IN ('join', 'invite')",
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
