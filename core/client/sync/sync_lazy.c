/*
 * core/client/sync/sync_lazy.c - the record of member events lazy loading sent to each
 * device, so that an incremental sync leaves out those the device already has.
 *
 * The spec lets a lazy-loading client ask for no redundant member events
 * (include_redundant_members: false, the default): a member event goes to a device once,
 * not again with every message of its sender. The record is this process's memory only,
 * like Synapse's cache: keyed by user and device, then room, then member, holding the
 * event ID sent. It is a cache, never a source of truth: when it is lost (a restart, a
 * second process, the bound below) the server sends the member events again, which is
 * always correct; what it must never do is leave out an event the device lacks, so an
 * initial or full_state sync forgets the device and a room sent whole starts its record
 * again. Bounded: past LAZY_MAX_MEMBERS recorded members in all, the whole record is
 * dropped (syncs go back to redundant member events until it fills again).
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core/client/sync/sync_lazy.h"

#define LAZY_MAX_MEMBERS 200000 /* recorded (device, room, member) entries in all */
#define LAZY_KEY_MAX_BYTES 1024

/* The registry: {"user\x1fdevice": {room_id: {member: event_id}}} and its entry count,
 * under one lock. */
static struct {
    pthread_mutex_t mu;
    json_t *devices;
    size_t members;
} lazy_registry = {PTHREAD_MUTEX_INITIALIZER, NULL, 0};

static bool device_key(char *out, size_t len, const char *user_id, const char *device_id)
{
    int n = snprintf(out, len, "%s\x1f%s", user_id, device_id ? device_id : "");
    return n > 0 && (size_t)n < len;
}

static bool is_member_event(const json_t *ev)
{
    const char *type = json_string_value(json_object_get(ev, "type"));
    return type && strcmp(type, "m.room.member") == 0 &&
           json_is_string(json_object_get(ev, "state_key")) &&
           json_is_string(json_object_get(ev, "event_id"));
}

/* Under the lock: the room's record of a device, created when missing (NULL on OOM). */
static json_t *room_record(const char *key, const char *room_id)
{
    if (!lazy_registry.devices && !(lazy_registry.devices = json_object())) return NULL;
    json_t *rooms = json_object_get(lazy_registry.devices, key);
    if (!rooms) {
        rooms = json_object();
        if (!rooms || json_object_set_new(lazy_registry.devices, key, rooms) < 0) return NULL;
    }
    json_t *members = json_object_get(rooms, room_id);
    if (!members) {
        members = json_object();
        if (!members || json_object_set_new(rooms, room_id, members) < 0) return NULL;
    }
    return members;
}

static void count_forgotten(json_t *rooms)
{
    const char *room;
    json_t *members;
    json_object_foreach(rooms, room, members) lazy_registry.members -= json_object_size(members);
}

void sync_lazy_forget_device(const char *user_id, const char *device_id)
{
    char key[LAZY_KEY_MAX_BYTES];
    if (!device_key(key, sizeof(key), user_id, device_id)) return;
    pthread_mutex_lock(&lazy_registry.mu);
    json_t *rooms = json_object_get(lazy_registry.devices, key);
    if (rooms) {
        count_forgotten(rooms);
        json_object_del(lazy_registry.devices, key);
    }
    pthread_mutex_unlock(&lazy_registry.mu);
}

/* Under the lock: remember one member event as sent. */
static void record(json_t *members, const json_t *ev)
{
    const char *member = json_string_value(json_object_get(ev, "state_key"));
    if (!json_object_get(members, member)) lazy_registry.members++;
    json_object_set(members, member, json_object_get(ev, "event_id"));
}

void sync_lazy_filter_and_record(const char *user_id, const char *device_id, const char *room_id,
                                 bool room_full, json_t *state, const json_t *timeline)
{
    char key[LAZY_KEY_MAX_BYTES];
    if (!device_key(key, sizeof(key), user_id, device_id)) return;
    pthread_mutex_lock(&lazy_registry.mu);
    json_t *members = room_record(key, room_id);
    if (!members) goto out;
    if (room_full) {
        lazy_registry.members -= json_object_size(members);
        json_object_clear(members);
    } else {
        for (size_t i = json_array_size(state); i-- > 0;) {
            json_t *ev = json_array_get(state, i);
            if (!is_member_event(ev)) continue;
            json_t *sent =
                json_object_get(members, json_string_value(json_object_get(ev, "state_key")));
            if (sent && json_equal(sent, json_object_get(ev, "event_id")))
                json_array_remove(state, i);
        }
    }
    for (size_t i = 0; i < json_array_size(state); i++)
        if (is_member_event(json_array_get(state, i))) record(members, json_array_get(state, i));
    for (size_t i = 0; i < json_array_size(timeline); i++)
        if (is_member_event(json_array_get(timeline, i)))
            record(members, json_array_get(timeline, i));
    if (lazy_registry.members > LAZY_MAX_MEMBERS) { /* the bound: start again */
        json_object_clear(lazy_registry.devices);
        lazy_registry.members = 0;
    }
out:
    pthread_mutex_unlock(&lazy_registry.mu);
}
