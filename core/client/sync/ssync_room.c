/*
 * core/client/sync/ssync_room.c - one room's result in a sliding sync response, read with
 * /sync's readers (sync_rooms.h: timeline, summary, unread counts, stripped state).
 *
 * Decisions owned here:
 *   - A room is `initial` when the connection never sent it, or sent it before the user
 *     joined (an invite then accepted): it gets its current required_state and its newest
 *     timeline_limit events. Otherwise it is sent only when something changed after what
 *     the connection sent (sent_upto): new timeline events, required_state changes, a new
 *     membership, a new name or avatar; its timeline then holds the events after
 *     sent_upto (limited when there were more).
 *   - required_state: [type, state_key] pairs, '*' a wildcard for either, "$ME" the user's
 *     own state key, "$LAZY" (with m.room.member) the member events of the timeline's
 *     senders, sent with every timeline that has them.
 *   - Invited and knocked rooms carry only their stripped state (invite_state), once per
 *     membership.
 *   - num_live: the timeline's events after the connection's previous position.
 *   - A timeline_limit larger than the one the room was last sent with (the connection
 *     keeps it) sends the room at once with its newest timeline_limit events and
 *     unstable_expanded_timeline (Synapse's name for the MSC's expanded_timeline). Other
 *     required_state than the room was sent with (the connection keeps a key of it) sends
 *     the room at once with its whole current state for the new pairs.
 * What it does not do: pick rooms (ssync_lists.c), remember what was sent (ssync_conn.c).
 */
#include <stdlib.h>
#include <string.h>

#include "core/client/sync/ssync.h"

#define LAZY "$LAZY"
#define ME "$ME"
#define WILD "*"

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

/* required_state for the window (after, upto] (after 0: the current state), filtered. */
static int required_state(sync_ctx *s, const char *room_id, const json_t *pairs, int64_t after,
                          const json_t *timeline, json_t *out)
{
    if (json_array_size(pairs) == 0) return ROOMS_OK;
    state_wants w;
    wants_init(s, pairs, &w);
    json_t *lazy = w.lazy ? senders_of(timeline) : json_array();
    json_t *all = json_array();
    int rc = ROOMS_OK;
    if (w.all_types || json_array_size(w.types) > 0) {
        const char *types = w.all_types ? NULL : rooms_pg_array(s->r->arena, w.types);
        json_t *members = w.all_members ? NULL : json_deep_copy(w.members);
        if (members) json_array_extend(members, lazy);
        rc = events_state_between(s->c, &s->view, room_id, after, s->upto, members, types, all);
        json_decref(members);
    }
    if (rc >= 0 && after > 0 && json_array_size(lazy) > 0) {
        /* The timeline's senders whose member events did not change in the window. */
        json_t *more = json_array(), *types = json_pack("[s]", "m.room.member");
        rc = events_state_between(s->c, &s->view, room_id, 0, s->upto, lazy,
                                  rooms_pg_array(s->r->arena, types), more);
        append_unique(all, more);
        json_decref(more);
        json_decref(types);
    }
    size_t i;
    json_t *ev;
    json_array_foreach(all, i, ev)
    {
        if (state_wanted(s, &w, ev, lazy)) json_array_append(out, ev);
    }
    json_decref(all);
    json_decref(lazy);
    wants_free(&w);
    return rc < 0 ? ROOMS_E_DB : ROOMS_OK;
}

/* name and avatar (when set, and on an incremental result only when they changed after
 * `after`), the member counts, and the heroes when the room has no name. */
static void names(const ssync_facts *f, int64_t after, json_t *room)
{
    if (f->has_name && (after == 0 || f->name_pos > after))
        json_object_set_new(room, "name", f->name ? json_string(f->name) : json_null());
    if (f->has_avatar && (after == 0 || f->avatar_pos > after))
        json_object_set_new(room, "avatar", f->avatar ? json_string(f->avatar) : json_null());
    json_object_set_new(room, "joined_count", json_integer(f->joined));
    json_object_set_new(room, "invited_count", json_integer(f->invited));
    if (!f->name && json_array_size(f->heroes) > 0) json_object_set(room, "heroes", f->heroes);
}

/* How many of the timeline's events came after prev (0 on a connection's first answer). */
static int num_live(sync_ctx *s, const char *room_id, const sync_timeline *t, int64_t prev, json_t *room)
{
    json_int_t live = 0;
    if (prev > 0 && json_array_size(t->events) > 0) {
        int64_t lo = prev > t->first_pos - 1 ? prev : t->first_pos - 1;
        const char *p[3] = {room_id, rooms_i64(s->r, lo), rooms_i64(s->r, s->upto)};
        PGresult *res = rooms_q(s->c,
                                "SELECT count(*) FROM events WHERE room_id = $1 AND stream_pos > $2::bigint"
                                " AND stream_pos <= $3::bigint",
                                3, p, NULL);
        if (!res) return ROOMS_E_DB;
        live = atoll(PQgetvalue(res, 0, 0));
        PQclear(res);
        if (live > (json_int_t)json_array_size(t->events)) live = (json_int_t)json_array_size(t->events);
    }
    json_object_set_new(room, "num_live", json_integer(live));
    return ROOMS_OK;
}

/* A joined room, or one left or banned from after the connection saw it joined. */
static int member_room(sync_ctx *s, const ssync_room_row *row, const ssync_facts *f, const json_t *pick,
                       bool initial, bool expand, bool new_state, int64_t sent_upto, int64_t prev, json_t *room)
{
    s->view.reader = &f->vis;
    s->timeline_limit = json_integer_value(json_object_get(pick, "tl"));
    int64_t after = initial ? 0 : sent_upto;
    sync_timeline t;
    /* An expanded timeline: the newest timeline_limit events, sent before or not. */
    int rc = sync_room_timeline(s, row->room_id, &f->vis, expand ? 0 : after, s->upto, &t);
    if (expand) json_object_set_new(room, "unstable_expanded_timeline", json_true());
    json_t *state = json_array();
    /* Other required_state than the room was sent with: its whole current state again. */
    if (rc >= 0)
        rc = required_state(s, row->room_id, json_object_get(pick, "rs"), new_state ? 0 : after, t.events, state);
    names(f, after, room);
    if (rc >= 0) rc = num_live(s, row->room_id, &t, prev, room);
    s->view.reader = NULL;
    json_object_set_new(room, "notification_count", json_integer(f->notification_count));
    json_object_set_new(room, "highlight_count", json_integer(f->highlight_count));
    bool changed = expand || json_array_size(t.events) > 0 || json_array_size(state) > 0 ||
                   json_object_get(room, "name") || json_object_get(room, "avatar");
    json_object_set_new(room, "timeline", t.events ? t.events : json_array());
    json_object_set_new(room, "required_state", state);
    json_object_set_new(room, "limited", json_boolean(t.limited));
    json_object_set_new(room, "prev_batch", json_string(rooms_token(s->r, t.first_pos ? t.first_pos - 1 : s->upto)));
    if (rc < 0) return rc;
    return changed ? 1 : 0;
}

/* FNV-1a of a string, continuing from h. */
static uint64_t fnv(uint64_t h, const char *str)
{
    for (; *str; str++) h = (h ^ (unsigned char)*str) * 1099511628211ULL;
    return (h ^ 0xff) * 1099511628211ULL; /* a separator, so ("ab","c") differs from ("a","bc") */
}

const char *ssync_required_state_key(atrium_req *r, const json_t *pairs)
{
    uint64_t sum = 0;
    size_t i, j;
    const json_t *p, *q;
    json_array_foreach(pairs, i, p)
    {
        bool seen = false; /* the same pair from two lists counts once */
        json_array_foreach(pairs, j, q)
        {
            if (j >= i) break;
            if (json_equal(p, q)) seen = true;
        }
        if (!seen)
            sum += fnv(fnv(14695981039346656037ULL, json_string_value(json_array_get(p, 0))),
                       json_string_value(json_array_get(p, 1)));
    }
    return rt_arena_printf(r->arena, "%016llx", (unsigned long long)sum);
}

bool ssync_room_expanded(const json_t *pick, const json_t *sent)
{
    return json_integer_value(json_object_get(pick, "tl")) > json_integer_value(json_array_get(sent, 2));
}

bool ssync_room_state_changed(const json_t *pick, const json_t *sent)
{
    const char *now = json_string_value(json_object_get(pick, "rsk"));
    const char *before = json_string_value(json_array_get(sent, 3));
    return now && (!before || strcmp(now, before) != 0);
}

int64_t ssync_room_sent_limit(const json_t *pick, const json_t *sent, const json_t *result)
{
    int64_t now = json_integer_value(json_object_get(pick, "tl"));
    int64_t before = json_integer_value(json_array_get(sent, 2));
    if (json_is_true(json_object_get(result, "limited")) || json_is_true(json_object_get(result, "initial")))
        return now; /* what the client holds without a gap starts at this timeline */
    return before > now ? before : now;
}

int ssync_room_result(sync_ctx *s, const ssync_room_row *row, const ssync_facts *facts,
                      const json_t *pick, const json_t *sent, int64_t prev, json_t **out)
{
    *out = NULL;
    const char *sent_m = json_string_value(json_array_get(sent, 1));
    int64_t sent_upto = json_integer_value(json_array_get(sent, 0));
    bool new_membership = !sent_m || strcmp(sent_m, row->membership) != 0;
    bool invited = strcmp(row->membership, "invite") == 0, knocked = strcmp(row->membership, "knock") == 0;
    json_t *room = json_pack("{s:s, s:I}", "membership", row->membership, "bump_stamp",
                             (json_int_t)row->bump_stamp);
    if (row->is_dm) json_object_set_new(room, "is_dm", json_true());
    int rc = ROOMS_OK;
    bool send = new_membership;
    if (invited || knocked) {
        json_t *holder = json_object();
        if (new_membership)
            rc = sync_room_stripped(s, knocked, row->room_id, row->membership, row->event_id, row->sender,
                                    row->membership_pos, holder);
        json_t *st = json_object_get(json_object_get(json_object_get(holder, row->room_id),
                                                     knocked ? "knock_state" : "invite_state"),
                                     "events");
        json_object_set_new(room, knocked ? "knock_state" : "invite_state", st ? json_incref(st) : json_array());
        json_decref(holder);
        json_object_set_new(room, "initial", json_true());
    } else if (strcmp(row->membership, "join") == 0 || (sent_m && strcmp(sent_m, "join") == 0)) {
        bool initial = !sent_m || strcmp(sent_m, "join") != 0;
        if (initial) json_object_set_new(room, "initial", json_true());
        rc = member_room(s, row, facts, pick, initial, !initial && ssync_room_expanded(pick, sent),
                         !initial && ssync_room_state_changed(pick, sent), sent_upto, prev, room);
        send = send || rc > 0;
    }
    if (rc < 0 || !send) {
        json_decref(room);
        return rc < 0 ? ROOMS_E_DB : ROOMS_OK;
    }
    json_t *lists = json_object_get(pick, "lists");
    if (json_array_size(lists) > 0) json_object_set(room, "lists", lists);
    *out = room;
    return ROOMS_OK;
}
