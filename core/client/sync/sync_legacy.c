/*
 * core/client/sync/sync_legacy.c - the shapes of the deprecated sync APIs older clients and
 * bridges still use: GET /initialSync, GET /rooms/{roomId}/initialSync and GET /events,
 * each computed by the /sync machinery (sync.c runs them as modes of one handler: the same
 * window, filters, visibility and parking) and reshaped here.
 *
 * What each becomes: /initialSync a list of rooms, each with its membership, visibility,
 * its newest messages (chunk, start, end), its state as of the newest message (the state
 * block with the timeline's state events applied) and account data (an invite: its
 * inviter and stripped state; left rooms when archived=true), plus presence, receipts and
 * global account data; the room form the same for one room, with its members' presence
 * and its receipts (a former member: up to the leave; someone never in it peeks,
 * crooms_peek_initial_sync); /events the window's timeline events of every joined room (or
 * of room_id's only), each naming its room, and its presence events, between start (the
 * client's `from`) and end. Events of different rooms are ordered by their
 * origin_server_ts (the client format carries no stream position). Where the spec is
 * loose, Synapse's shapes: docs/adr/0020-legacy-sync-follows-synapse.md.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/sync/sync_legacy.h"

/* The room's state as of its newest timeline event: the state block, then the timeline's
 * state events replacing the entries they update. A new array. */
static json_t *state_after(const json_t *state, const json_t *timeline)
{
    json_t *out = json_array();
    const json_t *lists[2] = {state, timeline};
    for (int l = 0; l < 2; l++) {
        for (size_t i = 0; i < json_array_size(lists[l]); i++) {
            json_t *ev = json_array_get(lists[l], i);
            const char *type = json_string_value(json_object_get(ev, "type"));
            const char *key = json_string_value(json_object_get(ev, "state_key"));
            if (!type || !key) continue;
            for (size_t j = 0; j < json_array_size(out); j++) {
                json_t *old = json_array_get(out, j);
                if (strcmp(json_string_value(json_object_get(old, "type")), type) == 0 &&
                    strcmp(json_string_value(json_object_get(old, "state_key")), key) == 0) {
                    json_array_remove(out, j);
                    break;
                }
            }
            json_array_append(out, ev);
        }
    }
    return out;
}

/* The events of `events` of type `type`, each a copy naming room_id when given, appended
 * to out. */
static void append_typed(json_t *out, const json_t *events, const char *type, const char *room_id)
{
    for (size_t i = 0; i < json_array_size(events); i++) {
        json_t *ev = json_array_get(events, i);
        const char *t = json_string_value(json_object_get(ev, "type"));
        if (!t || strcmp(t, type) != 0) continue;
        json_t *copy = json_copy(ev);
        if (room_id) json_object_set_new(copy, "room_id", json_string(room_id));
        json_array_append_new(out, copy);
    }
}

/* The m.member event of user in a list of (stripped) state events, or NULL. */
static json_t *member_event(const json_t *events, const char *user)
{
    for (size_t i = 0; i < json_array_size(events); i++) {
        json_t *ev = json_array_get(events, i);
        const char *type = json_string_value(json_object_get(ev, "type"));
        const char *key = json_string_value(json_object_get(ev, "state_key"));
        if (type && key && strcmp(type, "m.room.member") == 0 && strcmp(key, user) == 0) return ev;
    }
    return NULL;
}

/* The presence events of /sync in the legacy shape: each content also names its user
 * (content.user_id, as the r0 event stream did). only: when not NULL, the state whose
 * joined members' presence alone is kept. A new array. */
static json_t *legacy_presence(const json_t *resp, const json_t *only)
{
    json_t *out = json_array();
    json_t *events = json_object_get(json_object_get(resp, "presence"), "events");
    for (size_t i = 0; i < json_array_size(events); i++) {
        json_t *ev = json_array_get(events, i);
        const char *sender = json_string_value(json_object_get(ev, "sender"));
        if (!sender) continue;
        if (only) {
            json_t *m = member_event(only, sender);
            const char *mem = json_string_value(json_object_get(json_object_get(m, "content"), "membership"));
            if (!mem || strcmp(mem, "join") != 0) continue;
        }
        json_t *copy = json_deep_copy(ev);
        json_object_set_new(json_object_get(copy, "content"), "user_id", json_string(sender));
        json_array_append_new(out, copy);
    }
    return out;
}

/* One room of /sync's rooms.join, rooms.invite or rooms.leave as an initialSync RoomInfo:
 * its membership (a left room's from the user's member event: leave or ban), visibility
 * (public when listed in the room directory), for an invite the inviter and the stripped
 * state, else its messages, state and account data. */
static json_t *room_info(const legacy_view *v, const char *room_id, const char *membership,
                         json_t *room, const char *end)
{
    json_t *info = json_pack("{s:s, s:s, s:s}", "room_id", room_id, "membership", membership,
                             "visibility", json_object_get(v->listed, room_id) ? "public" : "private");
    if (strcmp(membership, "invite") == 0) {
        json_t *stripped = json_object_get(json_object_get(room, "invite_state"), "events");
        json_object_set(info, "state", stripped);
        json_t *sender = json_object_get(member_event(stripped, v->user), "sender");
        if (json_is_string(sender)) json_object_set(info, "inviter", sender);
        return info;
    }
    json_t *timeline = json_object_get(room, "timeline");
    json_t *events = json_object_get(timeline, "events");
    json_object_set_new(info, "messages",
                        json_pack("{s:O, s:O, s:s}", "chunk", events, "start",
                                  json_object_get(timeline, "prev_batch"), "end", end));
    json_t *state = state_after(json_object_get(json_object_get(room, "state"), "events"), events);
    if (strcmp(membership, "leave") == 0) {
        json_t *own = json_object_get(json_object_get(member_event(state, v->user), "content"), "membership");
        if (json_is_string(own)) json_object_set(info, "membership", own);
    }
    json_object_set_new(info, "state", state);
    json_object_set(info, "account_data",
                    json_object_get(json_object_get(room, "account_data"), "events"));
    return info;
}

json_t *sync_legacy_initial(const json_t *resp, const legacy_view *v)
{
    const char *end = json_string_value(json_object_get(resp, "next_batch"));
    json_t *rooms = json_array(), *receipts = json_array();
    static const char *const memberships[] = {"join", "invite", "leave"};
    for (int m = 0; m < 3; m++) {
        const char *room_id;
        json_t *room;
        json_object_foreach(json_object_get(json_object_get(resp, "rooms"), memberships[m]),
                            room_id, room)
        {
            json_array_append_new(rooms, room_info(v, room_id, memberships[m], room, end));
            if (m == 0)
                append_typed(receipts, json_object_get(json_object_get(room, "ephemeral"), "events"),
                             "m.receipt", room_id);
        }
    }
    return json_pack("{s:s, s:o, s:o, s:O, s:o}", "end", end, "rooms", rooms, "presence",
                     legacy_presence(resp, NULL), "account_data",
                     json_object_get(json_object_get(resp, "account_data"), "events"), "receipts",
                     receipts);
}

json_t *sync_legacy_room(const json_t *resp, const char *room_id, const legacy_view *v)
{
    const char *end = json_string_value(json_object_get(resp, "next_batch"));
    json_t *rooms = json_object_get(resp, "rooms");
    static const char *const memberships[] = {"join", "invite", "leave"};
    json_t *room = NULL;
    int m = 0;
    for (; m < 3 && !room; m++) room = json_object_get(json_object_get(rooms, memberships[m]), room_id);
    if (!room) return NULL;
    json_t *info = room_info(v, room_id, memberships[m - 1], room, end);
    bool joined = m - 1 == 0;
    json_t *receipts = json_array();
    if (joined)
        append_typed(receipts, json_object_get(json_object_get(room, "ephemeral"), "events"),
                     "m.receipt", room_id);
    json_object_set_new(info, "receipts", receipts);
    json_object_set_new(info, "presence", joined ? legacy_presence(resp, json_object_get(info, "state"))
                                                 : json_array());
    return info;
}

static int by_ts(const void *a, const void *b)
{
    json_int_t x = json_integer_value(json_object_get(*(json_t *const *)a, "origin_server_ts"));
    json_int_t y = json_integer_value(json_object_get(*(json_t *const *)b, "origin_server_ts"));
    return (x > y) - (x < y);
}

json_t *sync_legacy_events(const json_t *resp, const char *start)
{
    json_t *chunk = json_array(), *presence;
    const char *room_id;
    json_t *room;
    json_object_foreach(json_object_get(json_object_get(resp, "rooms"), "join"), room_id, room)
    {
        json_t *events = json_object_get(json_object_get(room, "timeline"), "events");
        for (size_t i = 0; i < json_array_size(events); i++)
            json_array_append(chunk, json_array_get(events, i));
    }
    size_t n = json_array_size(chunk);
    json_t **sorted = n ? malloc(n * sizeof(*sorted)) : NULL;
    if (sorted) {
        for (size_t i = 0; i < n; i++) sorted[i] = json_incref(json_array_get(chunk, i));
        qsort(sorted, n, sizeof(*sorted), by_ts);
        json_array_clear(chunk);
        for (size_t i = 0; i < n; i++) json_array_append_new(chunk, sorted[i]);
        free(sorted);
    }
    json_array_extend(chunk, presence = legacy_presence(resp, NULL));
    json_decref(presence);
    return json_pack("{s:s, s:O, s:o}", "start", start, "end", json_object_get(resp, "next_batch"),
                     "chunk", chunk);
}
