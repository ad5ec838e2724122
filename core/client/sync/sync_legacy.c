/*
 * core/client/sync/sync_legacy.c - the shapes of the deprecated sync APIs older clients and
 * bridges still use: GET /initialSync, GET /rooms/{roomId}/initialSync and GET /events,
 * each computed by the /sync machinery (sync.c runs them as modes of one handler: the same
 * window, filters, visibility and parking) and reshaped here.
 *
 * What each becomes: /initialSync a list of rooms, each with its membership, its newest
 * messages (chunk, start, end), its state as of the newest message (the state block with
 * the timeline's state events applied) and account data, plus presence and global account
 * data; the room form the same for one room (403 when the user is in no such room); /events
 * the window's timeline events of every joined room, each naming its room, and its presence
 * events, between start (the client's `from`) and end. Events of different rooms are
 * ordered by their origin_server_ts (the client format carries no stream position).
 */
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

/* One room of /sync's rooms.join or rooms.invite as an initialSync RoomInfo. */
static json_t *room_info(const char *room_id, const char *membership, json_t *room,
                         const char *end)
{
    json_t *info = json_pack("{s:s, s:s}", "room_id", room_id, "membership", membership);
    if (strcmp(membership, "invite") == 0) {
        json_object_set(info, "state", json_object_get(json_object_get(room, "invite_state"), "events"));
        return info;
    }
    json_t *timeline = json_object_get(room, "timeline");
    json_t *events = json_object_get(timeline, "events");
    json_object_set_new(info, "messages",
                        json_pack("{s:O, s:O, s:s}", "chunk", events, "start",
                                  json_object_get(timeline, "prev_batch"), "end", end));
    json_object_set_new(info, "state",
                        state_after(json_object_get(json_object_get(room, "state"), "events"), events));
    json_object_set(info, "account_data",
                    json_object_get(json_object_get(room, "account_data"), "events"));
    return info;
}

json_t *sync_legacy_initial(const json_t *resp)
{
    const char *end = json_string_value(json_object_get(resp, "next_batch"));
    json_t *rooms = json_array();
    static const char *const memberships[] = {"join", "invite"};
    for (int m = 0; m < 2; m++) {
        const char *room_id;
        json_t *room;
        json_object_foreach(json_object_get(json_object_get(resp, "rooms"), memberships[m]),
                            room_id, room)
            json_array_append_new(rooms, room_info(room_id, memberships[m], room, end));
    }
    return json_pack("{s:s, s:o, s:O, s:O}", "end", end, "rooms", rooms, "presence",
                     json_object_get(json_object_get(resp, "presence"), "events"), "account_data",
                     json_object_get(json_object_get(resp, "account_data"), "events"));
}

json_t *sync_legacy_room(const json_t *resp, const char *room_id)
{
    const char *end = json_string_value(json_object_get(resp, "next_batch"));
    json_t *rooms = json_object_get(resp, "rooms");
    json_t *room = json_object_get(json_object_get(rooms, "join"), room_id);
    const char *membership = "join";
    if (!room) {
        room = json_object_get(json_object_get(rooms, "invite"), room_id);
        membership = "invite";
    }
    if (!room) return NULL;
    json_t *info = room_info(room_id, membership, room, end);
    json_object_set(info, "presence", json_object_get(json_object_get(resp, "presence"), "events"));
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
    json_t *chunk = json_array();
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
    json_array_extend(chunk, json_object_get(json_object_get(resp, "presence"), "events"));
    return json_pack("{s:s, s:O, s:o}", "start", start, "end", json_object_get(resp, "next_batch"),
                     "chunk", chunk);
}
