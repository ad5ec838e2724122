/*
 * core/client/sync/ssync_room.c - one room's result in a sliding sync response: what it
 * reads (its plan, read for the whole window by ssync_reads.c; its facts, ssync_facts.c;
 * stripped state with /sync's reader) and what it holds.
 *
 * Decisions owned here:
 *   - A room is `initial` when the connection never sent it, or sent it before the user
 *     joined (an invite then accepted): it gets its current required_state and its newest
 *     timeline_limit events. Otherwise it is sent only when something changed after what
 *     the connection sent (sent_upto): new timeline events, required_state changes, a new
 *     membership, a new name or avatar; its timeline then holds the events after
 *     sent_upto (limited when there were more).
 *   - Invited and knocked rooms carry only their stripped state (invite_state), once per
 *     membership, with the name and avatar it holds. A room left or banned from has no
 *     member counts or heroes. Where results still differ from Synapse's, and why:
 *     docs/adr/0041-sliding-sync-differences-from-synapse.md.
 *   - A timeline_limit larger than the one the room was last sent with (the connection
 *     keeps it) sends the room at once with its newest timeline_limit events and
 *     unstable_expanded_timeline (Synapse's name for the MSC's expanded_timeline). Other
 *     required_state than the room was sent with (the connection keeps a key of it) sends
 *     the room at once with its whole current state for the new pairs.
 * What it does not do: pick rooms (ssync_lists.c), remember what was sent (ssync_conn.c),
 * read timelines and required_state (ssync_reads.c, which owns the required_state pairs).
 */
#include <stdlib.h>
#include <string.h>

#include "core/client/sync/ssync.h"

/* name and avatar (when set, and on an incremental result only when they changed after
 * `after`); for a room the user is joined to, the member counts and the heroes when the
 * room has no name (a room left holds what the user saw until the leave: today's counts
 * and members are no longer theirs to see, and Synapse sends neither). */
static void names(const ssync_facts *f, int64_t after, bool joined, json_t *room)
{
    if (f->has_name && (after == 0 || f->name_pos > after))
        json_object_set_new(room, "name", f->name ? json_string(f->name) : json_null());
    if (f->has_avatar && (after == 0 || f->avatar_pos > after))
        json_object_set_new(room, "avatar", f->avatar ? json_string(f->avatar) : json_null());
    if (!joined) return;
    json_object_set_new(room, "joined_count", json_integer(f->joined));
    json_object_set_new(room, "invited_count", json_integer(f->invited));
    if (!f->name && json_array_size(f->heroes) > 0) json_object_set(room, "heroes", f->heroes);
}

/* An invited or knocked room's name and avatar, from its stripped state (what the user
 * may see of it), and its unread counts, none before a join: as Synapse sends them. */
static void stripped_names(const json_t *stripped, json_t *room)
{
    size_t i;
    json_t *ev;
    json_array_foreach(stripped, i, ev)
    {
        const char *type = json_string_value(json_object_get(ev, "type"));
        const char *key = json_string_value(json_object_get(ev, "state_key"));
        if (!type || !key || *key) continue;
        const json_t *content = json_object_get(ev, "content");
        const char *field = strcmp(type, "m.room.name") == 0 ? "name" : strcmp(type, "m.room.avatar") == 0 ? "url" : NULL;
        const char *val = field ? json_string_value(json_object_get(content, field)) : NULL;
        if (val && *val) json_object_set_new(room, *field == 'n' ? "name" : "avatar", json_string(val));
    }
    json_object_set_new(room, "notification_count", json_integer(0));
    json_object_set_new(room, "highlight_count", json_integer(0));
}

/* A joined room, or one left or banned from after the connection saw it joined: its
 * plan's reads (ssync_reads.c) and facts. 1 changed since it was sent, 0 not. */
static int member_room(sync_ctx *s, const ssync_facts *f, const ssync_plan *p, bool joined, json_t *room)
{
    int64_t after = p->initial ? 0 : p->sent_upto;
    const sync_timeline *t = &p->t;
    if (p->expand) json_object_set_new(room, "unstable_expanded_timeline", json_true());
    names(f, after, joined, room);
    json_object_set_new(room, "num_live", json_integer(p->num_live));
    json_object_set_new(room, "notification_count", json_integer(f->notification_count));
    json_object_set_new(room, "highlight_count", json_integer(f->highlight_count));
    bool changed = p->expand || json_array_size(t->events) > 0 || json_array_size(p->state) > 0 ||
                   json_object_get(room, "name") || json_object_get(room, "avatar");
    json_object_set_new(room, "timeline", t->events ? json_incref(t->events) : json_array());
    if (json_array_size(p->state) > 0) json_object_set(room, "required_state", p->state); /* none: left out */
    json_object_set_new(room, "limited", json_boolean(t->limited));
    json_object_set_new(room, "prev_batch", json_string(crooms_token(s->r, t->first_pos ? t->first_pos - 1 : s->upto)));
    return changed ? 1 : 0;
}

void ssync_room_plan(const ssync_room_row *row, const ssync_facts *facts, const json_t *pick,
                     const json_t *sent, int64_t prev, ssync_plan *out)
{
    *out = (ssync_plan){.room_id = row->room_id, .vis = &facts->vis, .prev = prev};
    const char *sent_m = json_string_value(json_array_get(sent, 1));
    bool invited = strcmp(row->membership, "invite") == 0, knocked = strcmp(row->membership, "knock") == 0;
    out->member = !invited && !knocked &&
                  (strcmp(row->membership, "join") == 0 || (sent_m && strcmp(sent_m, "join") == 0));
    if (!out->member) return;
    out->initial = !sent_m || strcmp(sent_m, "join") != 0;
    out->expand = !out->initial && ssync_room_expanded(pick, sent);
    /* Other required_state than the room was sent with: its whole current state again. */
    out->new_state = !out->initial && ssync_room_state_changed(pick, sent);
    out->sent_upto = json_integer_value(json_array_get(sent, 0));
    int64_t after = out->initial ? 0 : out->sent_upto;
    /* An expanded timeline: the newest timeline_limit events, sent before or not. */
    out->tl_lo = out->expand ? 0 : after;
    out->limit = json_integer_value(json_object_get(pick, "tl"));
    out->pairs = json_object_get(pick, "rs");
    out->state_after = out->new_state ? 0 : after;
}

/* FNV-1a of a string, continuing from h. */
static uint64_t fnv(uint64_t h, const char *str)
{
    for (; *str; str++) h = (h ^ (unsigned char)*str) * 1099511628211ULL;
    return (h ^ 0xff) * 1099511628211ULL; /* a separator, so ("ab","c") differs from ("a","bc") */
}

static int by_value(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

const char *ssync_required_state_key(atrium_req *r, const json_t *pairs)
{
    size_t n = json_array_size(pairs);
    uint64_t *each = rt_arena_alloc(r->arena, (n ? n : 1) * sizeof(*each)), sum = 0;
    if (!each) return NULL;
    for (size_t i = 0; i < n; i++) {
        const json_t *p = json_array_get(pairs, i);
        each[i] = fnv(fnv(14695981039346656037ULL, json_string_value(json_array_get(p, 0))),
                      json_string_value(json_array_get(p, 1)));
    }
    /* The same pair from two lists counts once: sorted, so repeats sit together (lists'
     * pairs together can be thousands; comparing each with every other was quadratic). */
    qsort(each, n, sizeof(*each), by_value);
    for (size_t i = 0; i < n; i++)
        if (i == 0 || each[i] != each[i - 1]) sum += each[i];
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
                      const json_t *pick, const json_t *sent, const ssync_plan *plan, json_t **out)
{
    *out = NULL;
    const char *sent_m = json_string_value(json_array_get(sent, 1));
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
        stripped_names(st, room);
        json_decref(holder);
        json_object_set_new(room, "initial", json_true());
    } else if (plan->member) {
        if (plan->initial) json_object_set_new(room, "initial", json_true());
        if (member_room(s, facts, plan, strcmp(row->membership, "join") == 0, room) > 0) send = true;
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
