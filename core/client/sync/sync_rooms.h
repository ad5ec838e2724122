/*
 * core/client/sync/sync_rooms.h - what sync.c (the endpoint: parameters, filter, parking,
 * sections), sync_rooms.c (the `rooms` part of a response) and sync_counts.c (a room's
 * unread counts and summary) share: the window of one
 * sync run and the filter that shapes it. Internal prefix: sync_.
 */
#ifndef ATRIUM_CORE_SYNC_ROOMS_H
#define ATRIUM_CORE_SYNC_ROOMS_H

#include "core/client/rooms/crooms_api.h"

#define SYNC_DEFAULT_TIMELINE_LIMIT 10
#define SYNC_MAX_TIMELINE_LIMIT 500
#define SYNC_MAX_UNREAD_COUNT 99  /* unread events read for unread_notifications, newest first */
#define SYNC_MAX_HEROES 5

typedef struct sync_ctx {
    atrium_req *r;
    PGconn *c;
    const char *user, *device;
    int64_t since; /* 0: initial sync */
    int64_t upto;  /* next_batch */
    bool full_state;
    room_filter timeline; /* room.timeline; .ignored: the user's ignore list (message
                           * events of these users are left out of timelines, invites
                           * from them out of rooms.invite) */
    int64_t timeline_limit;
    bool lazy_members;    /* room.state.lazy_load_members (or room.timeline's) */
    bool redundant_members; /* room.state.include_redundant_members: resend member events */
    const json_t *state_filter; /* room.state (types, senders...), or NULL; owned by sync.c */
    bool include_leave;   /* room.include_leave */
    const json_t *only_rooms, *not_rooms; /* room.rooms / room.not_rooms, or NULL */
    /* The EventFilters of the other sections, or NULL (checked by rooms_filter_parse;
     * owned by sync.c): presence, account_data, room.ephemeral, room.account_data. */
    const json_t *presence_filter, *account_data_filter;
    const json_t *ephemeral_filter, *room_account_data_filter;
    events_view view;     /* room_id left out */
    struct push_program *push_rules; /* the user's rule set, read once for all the events
                           * it judges (push_eval.h): loaded by the first room with unread
                           * events, released when sync_rooms returns (NULL before) */
    json_t *room_account_data; /* the window's per-room account data events by room ID,
                                * read with the global ones (sync.c); owned by sync.c */
} sync_ctx;

/* Fill rooms.join / rooms.invite / rooms.leave of `rooms` for the window (since, upto].
 * *has_new is set when any room has something to report. ROOMS_OK or ROOMS_E_DB.
 * s->push_rules is NULL again when it returns. */
int sync_rooms(sync_ctx *s, json_t *rooms, bool *has_new);

/* The readers of one room that Simplified Sliding Sync (ssync_room.c) shares with /sync.
 * Each reads with s's connection, window and view; ROOMS_OK or ROOMS_E_DB. */
typedef struct sync_timeline {
    json_t *events;     /* ascending; owned by the caller (NULL after a failure) */
    bool limited;
    int64_t first_pos;  /* position of the first event, 0 if none */
} sync_timeline;
/* The newest s->timeline_limit events of lo < pos <= hi that vis lets the user see, with
 * /sync's rule for hidden state (sync_rooms.c, fetch_timeline). */
int sync_room_timeline(sync_ctx *s, const char *room_id, const rooms_vis *vis, int64_t lo,
                       int64_t hi, sync_timeline *t);
/* The m.receipt and m.typing events of (s->since, s->upto] (initial: every receipt, the
 * current typers) appended to out. */
int sync_room_ephemeral(sync_ctx *s, const char *room_id, bool initial, json_t *out);
/* unread_notifications {notification_count, highlight_count} into room (sync_counts.c).
 * The caller releases s->push_rules when done with the response. */
int sync_room_unread(sync_ctx *s, const char *room_id, json_t *room);
/* The same counts for each room of the array ids (strings), with two queries whatever
 * their number: counts[i] = {notification_count, highlight_count} of ids[i]. */
int sync_rooms_unread(sync_ctx *s, const json_t *ids, json_int_t (*counts)[2]);
/* sync_rooms_unread in two halves, its statement run on another connection c than s->c
 * (ssync_facts.c): send it (false: nothing sent), then take its result (db_query_result
 * of c; NULL when c failed) into counts. Consumes res. */
bool sync_rooms_unread_send(sync_ctx *s, PGconn *c, const json_t *ids) RT_MUST_CHECK;
int sync_rooms_unread_take(sync_ctx *s, const json_t *ids, PGresult *res, json_int_t (*counts)[2]);
/* summary {m.heroes, m.joined_member_count, m.invited_member_count} into room
 * (sync_counts.c). */
int sync_room_summary(sync_ctx *s, const char *room_id, json_t *room);
/* The stripped state of an invite (knock false) or knock: out[room_id] =
 * {"invite_state"|"knock_state": {"events": [...]}}. */
int sync_room_stripped(sync_ctx *s, bool knock, const char *room_id, const char *membership,
                       const char *event_id, const char *sender, int64_t pos, json_t *out);

/* Keep in the array `events` only what the EventFilter f (NULL = everything) lets
 * through - in `types` when given, not in `not_types` (both with the spec's '*'), sent by
 * one of `senders` when given, not by one of `not_senders` (an event without a sender,
 * like m.typing or account data, counts as sent by nobody) - and at most its `limit`
 * (oldest first). Returns how many events it removed. */
size_t sync_filter_events(const json_t *f, json_t *events);

#endif
