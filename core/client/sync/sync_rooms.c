/*
 * core/client/sync/sync_rooms.c - the `rooms` part of a /sync response: which rooms the user is
 * in, was invited to or left within the window (since, upto], and for each what the client
 * must learn (timeline, state, ephemeral events, room account data, counts).
 *
 * Decisions owned here:
 *   - A room is "newly joined" when the user's membership at `since` was not join (or on an
 *     initial or full_state sync): it gets its whole state before the timeline and the
 *     last `limit` events. Otherwise the timeline is the window's events, limited to the
 *     newest `limit` with limited=true and the state changes between since and the
 *     timeline's start.
 *   - A left room is reported once, in the sync whose window holds the leave, with the
 *     events up to the leave; initial syncs leave them out unless the filter asks. When
 *     the user was not joined at `since` but joined and left within the window, the room
 *     is new to the client: sent whole as at the leave, its timeline limited (Synapse
 *     does the same); without such a join (an invite refused or withdrawn) only the
 *     user's own membership events.
 *   - Timelines hold only what history visibility lets the user see (rooms_vis_window;
 *     the rule is rooms.c's), except state events that are still the room's current
 *     state: those are shown where they fall (fetch_window; Synapse does the same, and
 *     docs/adr/0022-current-state-in-sync-timelines.md says why). A timeline never spans
 *     a hidden, superseded state event: it then starts after the newest one (limited), so
 *     the state block before it carries what that event set and the client's room state
 *     stays current; state changes hidden in the window of an unlimited incremental
 *     timeline are sent as state too.
 *   - Erasure: while a room is read, s->view.reader is the user's visibility in it, so
 *     events_render serves an erased user's events redacted where the user was not joined
 *     (rooms_erasure_hides), in the timeline and in the state alike.
 *   - Invites carry stripped state (type, state_key, content, sender) of the room's
 *     descriptive events and the invite itself; knocks likewise (knock_state), with the
 *     knock itself, in rooms.knock while the knock is the user's newest membership.
 *   - The filter's room.state (types, not_types, senders, not_senders; '*' a wildcard in
 *     types) shapes every state block, whoever computed it (event_wanted): an empty
 *     `types` list sends no state at all.
 *   - Lazy loading: state carries only the member events of the timeline's senders (and,
 *     when the room is sent whole, the user's own), each sent to a device once unless the
 *     filter asks for redundant ones (sync_lazy.c keeps what each device was sent). A gap
 *     (a limited incremental timeline) is the exception: its state carries every change
 *     of the gap, member events included (joins and leaves of members who did not
 *     speak), as Synapse does, so the client's member list stays right.
 * What it does not do: parking, tokens, account data outside rooms (sync.c), a room's
 * unread counts and summary (sync_counts.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/auth/auth.h"
#include "core/client/push/push_eval.h"
#include "core/client/rooms/crooms_relations.h"
#include "core/client/sync/sync_lazy.h"
#include "core/client/sync/sync_rooms.h"

/* The events of invite_state, besides the invite itself and the inviter's member event. */
static const char *const STRIPPED_TYPES[] = {"m.room.create", "m.room.join_rules", "m.room.name",
                                             "m.room.avatar", "m.room.canonical_alias",
                                             "m.room.encryption", "m.room.topic",
                                             "m.room.member", NULL};

typedef struct membership_row {
    const char *room_id, *membership, *event_id, *sender;
    int64_t pos;
} membership_row;

static const char *i64s(sync_ctx *s, int64_t x)
{
    return crooms_i64(s->r, x);
}

static bool room_wanted(const sync_ctx *s, const char *room_id)
{
    json_t *id = json_string(room_id);
    bool ok = true;
    if (s->only_rooms) {
        ok = false;
        for (size_t i = 0; i < json_array_size(s->only_rooms); i++)
            if (json_equal(json_array_get(s->only_rooms, i), id)) ok = true;
    }
    for (size_t i = 0; s->not_rooms && i < json_array_size(s->not_rooms); i++)
        if (json_equal(json_array_get(s->not_rooms, i), id)) ok = false;
    json_decref(id);
    return ok;
}

static bool in_list(const json_t *list, const json_t *value)
{
    for (size_t i = 0; i < json_array_size(list); i++)
        if (json_equal(json_array_get(list, i), value)) return true;
    return false;
}

/* The senders of a timeline (plus the user when the room is sent whole, so the client
 * knows it is in it): whose member events lazy loading sends. A sender whose member event
 * comes earlier in the timeline than their first event is left out: the client learns it
 * from the timeline (Synapse does the same). */
static json_t *lazy_member_list(sync_ctx *s, const json_t *timeline, bool full)
{
    json_t *users = json_array(), *in_timeline = json_array();
    if (full) json_array_append_new(users, json_string(s->user));
    for (size_t i = 0; i < json_array_size(timeline); i++) {
        const json_t *ev = json_array_get(timeline, i);
        json_t *sender = json_object_get(ev, "sender");
        if (json_is_string(sender) && !in_list(users, sender) && !in_list(in_timeline, sender))
            json_array_append(users, sender);
        const char *type = json_string_value(json_object_get(ev, "type"));
        json_t *key = json_object_get(ev, "state_key");
        if (type && strcmp(type, "m.room.member") == 0 && json_is_string(key))
            json_array_append(in_timeline, key);
    }
    json_decref(in_timeline);
    return users;
}

/* ---- timeline and state ------------------------------------------------------------- */

typedef struct timeline {
    json_t *events;  /* ascending */
    bool limited;
    int64_t first_pos; /* position of the first event, 0 if none */
} timeline;

/* An SQL condition on events e of room $1: e is the room's current state for its key. */
#define CURRENT_STATE_SQL                                                                  \
    "EXISTS (SELECT 1 FROM current_state cs WHERE cs.room_id = $1 AND cs.type = e.type"   \
    " AND cs.state_key = e.state_key AND cs.event_id = e.event_id)"

/* The newest `limit` events with lo < pos <= hi that the user may see (vis), ascending.
 * A state event that is still the room's current state is shown even where history
 * visibility hides it (as Synapse does): the client learns the room as it is from the
 * timeline, and a timeline never starts after current state it would then lack. Where vis
 * shows the whole window there is no such event, and the scan is the room's index read
 * backwards up to the limit (the OR would make it a bitmap scan of the whole window).
 * Bundled relations are read only when the query says a kept event has some. */
static int fetch_window(sync_ctx *s, const char *room_id, const rooms_vis *vis, int64_t lo,
                        int64_t hi, timeline *t)
{
    t->events = json_array();
    t->limited = false;
    t->first_pos = 0;
    enum { VIS = 6, IGNORED = VIS + ROOMS_VIS_PARAMS, LO, HI, N_PARAMS };
    const char *p[N_PARAMS] = {room_id, i64s(s, s->timeline_limit + 1),
                               s->timeline.types, s->timeline.not_types,
                               s->timeline.senders, s->timeline.not_senders};
    p[LO] = i64s(s, lo);
    p[HI] = i64s(s, hi);
    p[IGNORED] = s->timeline.ignored;
    const char *vis_sql;
    if (!rooms_vis_window(s->r->arena, vis, lo, hi, false, VIS + 1, &vis_sql, p + VIS))
        return ROOMS_OK;
    bool all_seen = rooms_vis_covers(vis, lo, hi);
    const char *hidden_current = all_seen ? ""
                                          : rt_arena_printf(s->r->arena,
                                                            " OR (e.stream_pos > $%d AND e.stream_pos <= $%d"
                                                            " AND e.state_key IS NOT NULL AND " CURRENT_STATE_SQL ")",
                                                            LO + 1, HI + 1);
    const char *sql = hidden_current
                          ? rt_arena_printf(s->r->arena,
                                            "SELECT x.*, EXISTS (SELECT 1 FROM event_relations rel"
                                            " WHERE rel.relates_to = x.c1) FROM (" EVENTS_SELECT
                                            "WHERE e.room_id = $1 AND (true%s%s)%s%s"
                                            " ORDER BY e.stream_pos DESC LIMIT $2) AS x(c0, c1) ORDER BY x.c0 DESC",
                                            vis_sql, hidden_current, rooms_filter_sql(s->r->arena, 3),
                                            rooms_ignored_sql(s->r->arena, IGNORED + 1))
                          : NULL;
    int n_params = all_seen ? LO : N_PARAMS; /* $LO and $HI only in the OR */
    PGresult *res = sql ? rooms_q(s->c, sql, n_params, p, NULL) : NULL;
    if (!res) {
        json_decref(t->events);
        t->events = NULL;
        return ROOMS_E_DB;
    }
    int keep = PQntuples(res);
    if (keep > s->timeline_limit) {
        t->limited = true; /* one more than the limit exists */
        keep = (int)s->timeline_limit;
    }
    bool related = false; /* some kept event has relations: only then are bundles read */
    for (int i = keep; i-- > 0;) {
        json_t *ev = events_render(&s->view, res, i);
        if (ev) json_array_append_new(t->events, ev);
        related = related || PQgetvalue(res, i, PQnfields(res) - 1)[0] == 't';
    }
    if (keep > 0) t->first_pos = events_pos(res, keep - 1);
    PQclear(res);
    if (related && crooms_bundle_add(s->c, s->r->arena, &s->view, room_id, vis, t->events) < 0) {
        json_decref(t->events);
        t->events = NULL;
        return ROOMS_E_DB;
    }
    return ROOMS_OK;
}

/* The position of the newest state event with lo < pos <= hi that vis hides (and that
 * is not current state, which fetch_window shows), or 0. */
static int newest_hidden_state(sync_ctx *s, const char *room_id, const rooms_vis *vis,
                               int64_t lo, int64_t hi, int64_t *pos)
{
    *pos = 0;
    const char *p[1 + ROOMS_VIS_PARAMS] = {room_id}, *vis_sql;
    if (!rooms_vis_window(s->r->arena, vis, lo, hi, true, 2, &vis_sql, p + 1)) return ROOMS_OK;
    const char *sql = rt_arena_printf(s->r->arena,
                                      "SELECT max(e.stream_pos) FROM events e WHERE e.room_id = $1"
                                      " AND e.state_key IS NOT NULL AND NOT " CURRENT_STATE_SQL
                                      "%s", vis_sql);
    PGresult *res = rooms_q(s->c, sql, 1 + ROOMS_VIS_PARAMS, p, NULL);
    if (!res) return ROOMS_E_DB;
    if (!PQgetisnull(res, 0, 0)) *pos = atoll(PQgetvalue(res, 0, 0));
    PQclear(res);
    return ROOMS_OK;
}

/* The timeline of the window lo < pos <= hi: its newest `limit` visible events (t->events
 * is NULL after a failure). A client
 * applies the state block, then the timeline's state events; a state event hidden inside
 * the timeline's span would leave it with stale state, so the timeline then starts after
 * the newest such event (limited: what it skipped is a /messages away) and the state
 * block, the state before the timeline, carries what that event set. */
static int fetch_timeline(sync_ctx *s, const char *room_id, const rooms_vis *vis, int64_t lo,
                          int64_t hi, timeline *t)
{
    int rc = fetch_window(s, room_id, vis, lo, hi, t);
    if (rc < 0 || !t->first_pos || rooms_vis_covers(vis, t->first_pos, hi)) return rc;
    int64_t hidden;
    rc = newest_hidden_state(s, room_id, vis, t->first_pos, hi, &hidden);
    if (rc >= 0 && !hidden) return ROOMS_OK;
    json_decref(t->events);
    t->events = NULL;
    if (rc < 0) return rc;
    rc = fetch_window(s, room_id, vis, hidden, hi, t);
    t->limited = true;
    return rc;
}

/* The spec's filter pattern: '*' matches any run of characters, everything else itself. */
static bool glob_match(const char *pat, const char *str)
{
    const char *star = NULL, *resume = NULL;
    while (*str) {
        if (*pat == '*') {
            star = pat++;
            resume = str;
        } else if (*pat == *str) {
            pat++;
            str++;
        } else if (star) {
            pat = star + 1;
            str = ++resume;
        } else {
            return false;
        }
    }
    while (*pat == '*') pat++;
    return *pat == '\0';
}

/* Is `value` matched by any string of the list (exactly, or as a pattern)? */
static bool listed(const json_t *list, const char *value, bool patterns)
{
    size_t i;
    const json_t *item;
    json_array_foreach(list, i, item)
    {
        const char *v = json_string_value(item);
        if (v && (patterns ? glob_match(v, value) : strcmp(v, value) == 0)) return true;
    }
    return false;
}

/* An EventFilter's rule for one event: in `types` (when given), not in `not_types`, sent
 * by one of `senders` (when given), not by one of `not_senders`; an event without a sender
 * (typing, receipts, account data) is sent by nobody. The filter's lists were checked by
 * rooms_filter_parse. */
static bool event_wanted(const json_t *f, const json_t *ev)
{
    if (!f) return true;
    const char *type = json_string_value(json_object_get(ev, "type"));
    const char *sender = json_string_value(json_object_get(ev, "sender"));
    const json_t *types = json_object_get(f, "types"), *senders = json_object_get(f, "senders");
    if (!type) return false;
    if (!sender) sender = "";
    if (types && !listed(types, type, true)) return false;
    if (listed(json_object_get(f, "not_types"), type, true)) return false;
    if (senders && !listed(senders, sender, false)) return false;
    return !listed(json_object_get(f, "not_senders"), sender, false);
}

/* Keep in `state` only what the filter's room.state wants. */
static void filter_state(const sync_ctx *s, json_t *state)
{
    if (!s->state_filter) return;
    for (size_t i = json_array_size(state); i-- > 0;)
        if (!event_wanted(s->state_filter, json_array_get(state, i)))
            json_array_remove(state, i);
}

size_t sync_filter_events(const json_t *f, json_t *events)
{
    if (!f || !json_is_array(events)) return 0;
    size_t before = json_array_size(events);
    for (size_t i = before; i-- > 0;)
        if (!event_wanted(f, json_array_get(events, i))) json_array_remove(events, i);
    json_t *limit = json_object_get(f, "limit");
    if (json_is_integer(limit) && json_integer_value(limit) >= 0)
        while (json_array_size(events) > (size_t)json_integer_value(limit))
            json_array_remove(events, json_array_size(events) - 1);
    return before - json_array_size(events);
}

/* State before the timeline: the whole state (full) or the window's changes (also when
 * the timeline is not limited but history visibility hid events of the window: gappy). */
static int timeline_state(sync_ctx *s, const char *room_id, const timeline *t, bool full,
                          bool gappy, int64_t upto, json_t *out)
{
    int64_t before = t->first_pos ? t->first_pos - 1 : upto;
    json_t *members = s->lazy_members ? lazy_member_list(s, t->events, full) : NULL;
    int rc;
    if (full)
        rc = events_state_between(s->c, &s->view, room_id, 0, before, members, NULL, out);
    else if (t->limited || gappy) /* every change of the gap, member events too */
        rc = events_state_between(s->c, &s->view, room_id, s->since, before, NULL, NULL, out);
    else
        rc = ROOMS_OK;
    if (rc >= 0 && !full && s->lazy_members && json_array_size(members) > 0) {
        /* Lazy loading: members of the senders as of the timeline's start, even when the
         * client may know them (sync_lazy.c then leaves out what this device has). */
        json_t *types = json_pack("[s]", "m.room.member");
        json_t *extra = json_array();
        rc = events_state_between(s->c, &s->view, room_id, 0, before, members,
                                  rooms_pg_array(s->r->arena, types), extra);
        for (size_t i = 0; i < json_array_size(extra); i++) {
            json_t *ev = json_array_get(extra, i);
            bool dup = false;
            for (size_t j = 0; j < json_array_size(out) && !dup; j++)
                dup = json_equal(json_object_get(json_array_get(out, j), "event_id"),
                                 json_object_get(ev, "event_id"));
            if (!dup) json_array_append(out, ev);
        }
        json_decref(extra);
        json_decref(types);
    }
    json_decref(members);
    filter_state(s, out);
    if (rc >= 0 && s->lazy_members && !s->redundant_members)
        sync_lazy_filter_and_record(s->user, s->device, room_id, full, out, t->events);
    return rc < 0 ? rc : ROOMS_OK;
}

/* ---- ephemeral, account data, counts ------------------------------------------------ */

static int ephemeral(sync_ctx *s, const char *room_id, bool initial, json_t *out)
{
    /* One statement: the window's receipts (rows 'r'), then the room's typing rows ('t'):
     * whether each still types, and whether it changed in the window. */
    const char *p[5] = {room_id, i64s(s, initial ? 0 : s->since), i64s(s, s->upto), s->user,
                        i64s(s, rooms_wall_ms())};
    PGresult *res = rooms_q(s->c,
                            "SELECT 'r', event_id, receipt_type, user_id, ts, thread_id,"
                            " NULL::boolean, NULL::boolean FROM receipts"
                            " WHERE room_id = $1 AND stream_pos > $2 AND stream_pos <= $3"
                            " AND (receipt_type <> 'm.read.private' OR user_id = $4)"
                            " UNION ALL SELECT 't', NULL, NULL, user_id, NULL, NULL,"
                            " expires_ts > $5::bigint, stream_pos > $2::bigint"
                            " AND stream_pos <= $3::bigint FROM typing WHERE room_id = $1",
                            5, p, NULL);
    if (!res) return ROOMS_E_DB;
    json_t *content = json_object(), *typers = json_array();
    bool changed = false;
    for (int i = 0; i < PQntuples(res); i++) {
        const char *user = PQgetvalue(res, i, 3);
        if (PQgetvalue(res, i, 0)[0] == 't') {
            if (PQgetvalue(res, i, 6)[0] == 't') json_array_append_new(typers, json_string(user));
            if (PQgetvalue(res, i, 7)[0] == 't') changed = true;
            continue;
        }
        const char *ev = PQgetvalue(res, i, 1), *type = PQgetvalue(res, i, 2);
        json_t *by_ev = json_object_get(content, ev);
        if (!by_ev) json_object_set_new(content, ev, by_ev = json_object());
        json_t *by_type = json_object_get(by_ev, type);
        if (!by_type) json_object_set_new(by_ev, type, by_type = json_object());
        json_t *rec = json_pack("{s:I}", "ts", (json_int_t)atoll(PQgetvalue(res, i, 4)));
        if (PQgetvalue(res, i, 5)[0])
            json_object_set_new(rec, "thread_id", json_string(PQgetvalue(res, i, 5)));
        json_object_set_new(by_type, user, rec);
    }
    PQclear(res);
    if (json_object_size(content) > 0)
        json_array_append_new(out, json_pack("{s:s, s:o}", "type", "m.receipt", "content", content));
    else
        json_decref(content);
    /* Typing: the current typers, sent when the set changed in the window (or on an initial
     * sync when someone types). */
    if ((initial && json_array_size(typers) > 0) || (!initial && changed))
        json_array_append_new(out, json_pack("{s:s, s:{s:o}}", "type", "m.typing", "content",
                                             "user_ids", typers));
    else
        json_decref(typers);
    return ROOMS_OK;
}

static bool has_member_event(const json_t *events)
{
    for (size_t i = 0; i < json_array_size(events); i++)
        if (strcmp(json_string_value(json_object_get(json_array_get(events, i), "type")),
                   "m.room.member") == 0)
            return true;
    return false;
}

/* ---- joined, invited, left ---------------------------------------------------------- */

/* Was the user joined at `since`? */
static int joined_at_since(sync_ctx *s, const char *room_id, bool *joined)
{
    char m[16];
    *joined = false;
    if (s->since == 0) return ROOMS_OK;
    int rc = rooms_membership_at(s->c, room_id, s->user, s->since, m, NULL);
    *joined = strcmp(m, "join") == 0;
    return rc;
}

/* Did the user's membership in the room change within (since, upto] to "join" (*joined)
 * and to anything else (*other)? */
static int window_memberships(sync_ctx *s, const char *room_id, int64_t upto, bool *joined,
                              bool *other)
{
    *joined = *other = false;
    const char *p[4] = {room_id, s->user, i64s(s, s->since), i64s(s, upto)};
    PGresult *res = rooms_q(s->c,
                            "SELECT coalesce(bool_or(membership = 'join'), false),"
                            " coalesce(bool_or(membership <> 'join'), false) FROM memberships"
                            " WHERE room_id = $1 AND user_id = $2 AND stream_pos > $3"
                            " AND stream_pos <= $4",
                            4, p, NULL);
    if (!res) return ROOMS_E_DB;
    *joined = PQgetvalue(res, 0, 0)[0] == 't';
    *other = PQgetvalue(res, 0, 1)[0] == 't';
    PQclear(res);
    return ROOMS_OK;
}

/* A room the user is joined to, read with vis (s->view.reader, set by joined_room). */
static int joined_room_read(sync_ctx *s, const char *room_id, const rooms_vis *vis,
                            bool was_joined, json_t *acct, json_t *join, bool *has_new)
{
    bool full = s->since == 0 || s->full_state || !was_joined;
    int64_t from = full ? 0 : s->since;
    timeline t;
    if (fetch_timeline(s, room_id, vis, from, s->upto, &t) < 0) return ROOMS_E_DB;
    json_t *state = json_array(), *eph = json_array();
    bool gappy = !rooms_vis_covers(vis, from, s->upto);
    int rc = timeline_state(s, room_id, &t, full, gappy, s->upto, state);
    if (rc >= 0) rc = ephemeral(s, room_id, s->since == 0, eph);
    sync_filter_events(s->ephemeral_filter, eph); /* so what it drops is no news either */
    json_t *acct_events = json_object_get(acct, room_id);
    sync_filter_events(s->room_account_data_filter, acct_events);
    bool news = full || json_array_size(t.events) > 0 || json_array_size(state) > 0 ||
                json_array_size(eph) > 0 || json_array_size(acct_events) > 0;
    if (rc < 0 || !news) {
        json_decref(t.events);
        json_decref(state);
        json_decref(eph);
        return rc < 0 ? rc : ROOMS_OK;
    }
    const char *prev = crooms_token(s->r, t.first_pos ? t.first_pos - 1 : s->upto);
    json_t *room = json_pack("{s:{s:o}, s:{s:o, s:b, s:s}, s:{s:o}, s:{s:o}}", "state", "events", state,
                             "timeline", "events", t.events, "limited", t.limited, "prev_batch", prev,
                             "ephemeral", "events", eph, "account_data", "events",
                             acct_events ? json_incref(acct_events) : json_array());
    rc = sync_room_unread(s, room_id, room);
    if (rc >= 0 && (full || has_member_event(t.events) || has_member_event(state)))
        rc = sync_room_summary(s, room_id, room);
    json_object_set_new(join, room_id, room);
    *has_new = true;
    return rc < 0 ? rc : ROOMS_OK;
}

/* A room whose newest membership as of upto (at pos) is a join: when that join is at or
 * before since, it was the membership at since too (no query; every joined room of every
 * incremental sync asked it). */
static int joined_room(sync_ctx *s, const char *room_id, int64_t pos, json_t *acct, json_t *join,
                       bool *has_new)
{
    bool was_joined = s->since > 0 && pos <= s->since;
    rooms_vis vis;
    if ((!was_joined && joined_at_since(s, room_id, &was_joined) < 0) ||
        rooms_vis_load(s->c, room_id, s->user, &vis) < 0)
        return ROOMS_E_DB;
    s->view.reader = &vis; /* this room's reader, for erasure, while it is read */
    int rc = joined_room_read(s, room_id, &vis, was_joined, acct, join, has_new);
    s->view.reader = NULL;
    return rc;
}

/* What an invite or a knock is shown with: its section's key for the stripped state, and
 * where a room this server is not in keeps the state the other server gave. */
typedef struct stripped_kind {
    const char *key;      /* "invite_state", "knock_state" */
    const char *kept_sql; /* the kept stripped state of a membership event ($1) */
} stripped_kind;

static const stripped_kind INVITED = {
    "invite_state", "SELECT invite_state FROM remote_invites WHERE event_id = $1"};
static const stripped_kind KNOCKED = {
    "knock_state", "SELECT knock_state FROM remote_knocks WHERE event_id = $1"};

/* An invite to (a knock on) a room this server is not in: the stripped state the other
 * server sent (fed_rooms_invite.c, crooms_knock.c keep it, the membership event last). 1
 * found (set in out), 0, or -1. */
static int remote_stripped(sync_ctx *s, const stripped_kind *k, const membership_row *m,
                           json_t *out)
{
    const char *p[1] = {m->event_id};
    PGresult *res = rooms_q(s->c, k->kept_sql, 1, p, NULL);
    if (!res) return ROOMS_E_DB;
    json_t *state = PQntuples(res) == 1 ? json_loads(PQgetvalue(res, 0, 0), 0, NULL) : NULL;
    PQclear(res);
    if (!json_is_array(state)) {
        json_decref(state);
        return 0;
    }
    json_object_set_new(out, m->room_id, json_pack("{s:{s:o}}", k->key, "events", state));
    return 1;
}

/* An invited or knocked room: its stripped state as of the membership (the user's and
 * the membership event's sender's member events among it) into out. */
static int stripped_room(sync_ctx *s, const stripped_kind *k, const membership_row *m,
                         json_t *out, bool *has_new)
{
    int remote = remote_stripped(s, k, m, out);
    if (remote != 0) {
        if (remote > 0) *has_new = true;
        return remote < 0 ? remote : ROOMS_OK;
    }
    json_t *types = json_array();
    for (size_t i = 0; STRIPPED_TYPES[i]; i++) json_array_append_new(types, json_string(STRIPPED_TYPES[i]));
    json_t *members = json_pack("[s, s]", s->user, m->sender);
    json_t *full = json_array();
    int rc = events_state_between(s->c, &s->view, m->room_id, 0, m->pos, members,
                                  rooms_pg_array(s->r->arena, types), full);
    json_decref(types);
    json_decref(members);
    if (rc < 0) {
        json_decref(full);
        return rc;
    }
    json_t *stripped = json_array();
    for (size_t i = 0; i < json_array_size(full); i++) {
        json_t *ev = json_array_get(full, i);
        json_array_append_new(stripped, json_pack("{s:O, s:O, s:O, s:O}", "type", json_object_get(ev, "type"),
                                                  "state_key", json_object_get(ev, "state_key"),
                                                  "content", json_object_get(ev, "content"),
                                                  "sender", json_object_get(ev, "sender")));
    }
    json_decref(full);
    json_object_set_new(out, m->room_id, json_pack("{s:{s:o}}", k->key, "events", stripped));
    *has_new = true;
    return ROOMS_OK;
}

static int left_room(sync_ctx *s, const membership_row *m, json_t *leave, bool *has_new)
{
    bool was_joined, joined_since = false, other;
    if (joined_at_since(s, m->room_id, &was_joined) < 0 ||
        (!was_joined && s->since > 0 &&
         window_memberships(s, m->room_id, m->pos, &joined_since, &other) < 0))
        return ROOMS_E_DB;
    timeline t = {0};
    json_t *state = json_array();
    int rc;
    if (was_joined || s->since == 0 || joined_since) {
        /* Joined and left within the window: the room is new to the client, sent whole
         * as it was at the leave (the state before a limited timeline). */
        bool full = s->since == 0 || joined_since;
        rooms_vis vis;
        rc = rooms_vis_load(s->c, m->room_id, s->user, &vis);
        s->view.reader = &vis; /* this room's reader, for erasure, while it is read */
        if (rc >= 0) rc = fetch_timeline(s, m->room_id, &vis, full ? 0 : s->since, m->pos, &t);
        if (rc >= 0 && joined_since) t.limited = true;
        if (rc >= 0)
            rc = timeline_state(s, m->room_id, &t, full,
                                !rooms_vis_covers(&vis, s->since, m->pos), m->pos, state);
        s->view.reader = NULL;
    } else {
        /* Not joined at since (an invite withdrawn or refused, or a join and leave within
         * the window): only the user's own membership events of the window. */
        t.events = json_array();
        const char *p[4] = {m->room_id, i64s(s, s->since), i64s(s, m->pos), s->user};
        rc = events_fetch(s->c, &s->view,
                          EVENTS_SELECT "WHERE e.room_id = $1 AND e.stream_pos > $2 AND e.stream_pos <= $3"
                                        " AND e.type = 'm.room.member' AND e.state_key = $4"
                                        " ORDER BY e.stream_pos",
                          4, p, t.events, &t.first_pos, NULL);
    }
    if (rc < 0) {
        json_decref(t.events);
        json_decref(state);
        return rc;
    }
    const char *prev = crooms_token(s->r, t.first_pos ? t.first_pos - 1 : m->pos);
    json_object_set_new(leave, m->room_id,
                        json_pack("{s:{s:o}, s:{s:o, s:b, s:s}, s:{s:[]}}", "state", "events", state,
                                  "timeline", "events", t.events, "limited", t.limited, "prev_batch",
                                  prev, "account_data", "events"));
    *has_new = true;
    return ROOMS_OK;
}

int sync_rooms(sync_ctx *s, json_t *rooms, bool *has_new)
{
    json_t *join = json_object(), *invite = json_object(), *leave = json_object();
    json_object_set_new(rooms, "join", join);
    json_object_set_new(rooms, "invite", invite);
    json_object_set_new(rooms, "leave", leave);
    json_t *knock = json_object();
    json_object_set_new(rooms, "knock", knock);
    /* A device syncing from nothing has no member events: forget what it was sent. */
    if (s->lazy_members && (s->since == 0 || s->full_state))
        sync_lazy_forget_device(s->user, s->device);
    json_t *acct = s->room_account_data ? json_incref(s->room_account_data) : json_object();
    /* Every room's newest membership of the user as of upto, and for an incremental sync
     * ($4) whether a joined room had events, receipts or typing in the window (the others
     * are skipped unless they have account data; initial and full syncs read every room). */
    bool incremental = s->since > 0 && !s->full_state;
    const char *p[5] = {s->user, i64s(s, s->upto), s->timeline.ignored, incremental ? "t" : "f",
                        i64s(s, s->since)};
#define IN_WINDOW(table) "EXISTS (SELECT 1 FROM " table " x WHERE x.room_id = m.room_id" \
                         " AND x.stream_pos > $5 AND x.stream_pos <= $2)"
    PGresult *res = rooms_q(s->c,
                            "SELECT m.*, NOT $4::boolean OR (m.membership = 'join' AND"
                            " (" IN_WINDOW("events") " OR " IN_WINDOW("receipts") " OR "
                            IN_WINDOW("typing") ")) FROM"
                            " (SELECT DISTINCT ON (room_id) room_id, membership, stream_pos, event_id,"
                            " sender, forgotten, (sender = ANY($3::text[])) IS TRUE"
                            " FROM memberships WHERE user_id = $1 AND stream_pos <= $2"
                            " ORDER BY room_id, stream_pos DESC) m",
                            5, p, NULL);
#undef IN_WINDOW
    if (!res) {
        json_decref(acct);
        return ROOMS_E_DB;
    }
    int rc = ROOMS_OK;
    for (int i = 0; i < PQntuples(res) && rc >= 0; i++) {
        membership_row m = {PQgetvalue(res, i, 0), PQgetvalue(res, i, 1), PQgetvalue(res, i, 3),
                            PQgetvalue(res, i, 4), atoll(PQgetvalue(res, i, 2))};
        bool forgotten = PQgetvalue(res, i, 5)[0] == 't';
        if (forgotten || !room_wanted(s, m.room_id)) continue;
        bool in_window = m.pos > s->since;
        if (strcmp(m.membership, "join") == 0) {
            if (PQgetvalue(res, i, 7)[0] == 't' || json_object_get(acct, m.room_id))
                rc = joined_room(s, m.room_id, m.pos, acct, join, has_new);
        }
        /* An invite from a user it ignores is not shown (the spec; Synapse drops it too). */
        else if (strcmp(m.membership, "invite") == 0 && (in_window || s->since == 0) &&
                 PQgetvalue(res, i, 6)[0] != 't')
            rc = stripped_room(s, &INVITED, &m, invite, has_new);
        else if (strcmp(m.membership, "knock") == 0 && (in_window || s->since == 0))
            rc = stripped_room(s, &KNOCKED, &m, knock, has_new);
        else if ((strcmp(m.membership, "leave") == 0 || strcmp(m.membership, "ban") == 0) &&
                 ((s->since > 0 && in_window) || (s->since == 0 && s->include_leave)))
            rc = left_room(s, &m, leave, has_new);
    }
    PQclear(res);
    json_decref(acct);
    push_program_free(s->push_rules);
    s->push_rules = NULL;
    return rc;
}

/* ---- the readers Simplified Sliding Sync shares (sync_rooms.h) ----------------------- */

int sync_room_timeline(sync_ctx *s, const char *room_id, const rooms_vis *vis, int64_t lo,
                       int64_t hi, sync_timeline *t)
{
    timeline tl = {0};
    int rc = fetch_timeline(s, room_id, vis, lo, hi, &tl);
    *t = (sync_timeline){tl.events, tl.limited, tl.first_pos};
    return rc;
}

int sync_room_ephemeral(sync_ctx *s, const char *room_id, bool initial, json_t *out)
{
    return ephemeral(s, room_id, initial, out);
}

int sync_room_stripped(sync_ctx *s, bool knock, const char *room_id, const char *membership,
                       const char *event_id, const char *sender, int64_t pos, json_t *out)
{
    membership_row m = {room_id, membership, event_id, sender, pos};
    bool has_new = false;
    return stripped_room(s, knock ? &KNOCKED : &INVITED, &m, out, &has_new);
}
