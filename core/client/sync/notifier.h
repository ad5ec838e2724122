/*
 * core/client/sync/notifier.h - waking the long-polls (/sync) of users when something for them
 * is written: an event in one of their rooms, a to-device message, account data, a key
 * change.
 *
 * The stream model: every row of every per-user stream (events, to-device messages,
 * account data, receipts, device-list changes, ...) takes its position from ONE PostgreSQL
 * sequence, stream_seq, through the SQL function stream_next() inside the writing
 * transaction; readers bound a sync with stream_upto(), which never passes an uncommitted
 * position (both in core migration 2). A sync token is that position ("s<N>"), so
 * "what happened after token N" is "rows with position > N" in each stream table, and a
 * position means the same in every process sharing the database
 * (docs/adr/0003-stream-positions-from-one-sequence.md).
 *
 * Wake-ups: a parked /sync parks on its user's event (notifier_event_for); a writer calls
 * notifier_wake_user / notifier_wake_room after its transaction committed. Wake-ups reach
 * every process sharing the database: each is also published through the notification
 * service (core/store/notify.h), and each process wakes its own parked syncs of that user
 * (notifier.c). Internal prefix: notifier_.
 */
#ifndef ATRIUM_CORE_NOTIFIER_H
#define ATRIUM_CORE_NOTIFIER_H

#include <libpq-fe.h>
#include <stdint.h>

#include "core/http/http.h"

/* The table of users' wake-up events: the runtime object's (rt->notifier). */
typedef struct notifier notifier;
/* An empty table, or NULL on out of memory. Start-up. */
notifier *notifier_new(void);
struct notify_service;
/* Hear wake-ups made by other processes through s (before s starts). 0 or -1 (logged).
 * Start-up (the sync module's init). */
int notifier_listen(notifier *n, struct notify_service *s);
/* Free n (NULL is fine); the events themselves go with the HTTP server. After every thread
 * that could wake or park stopped. */
void notifier_free(notifier *n);

/* The functions below use the bound runtime object's table (core/runtime/core_runtime.h);
 * without one, nothing parks (NULL event) and wake-ups do nothing. */

/* The event a user's parked syncs wait on (created on first use; lives until shutdown).
 * NULL on out-of-memory. Any thread. */
struct atrium_event *notifier_event_for(http_server *s, const char *user_id);
/* Wake every parked request of user_id, in this process and (through the notification
 * service) in every other process sharing the database. Any thread; cheap when nobody
 * waits (the cross-process part is queued, not sent by the caller). */
void notifier_wake_user(const char *user_id);
/* Wake user_id's parked requests in this process only (a long-poll re-signalling itself,
 * or a wake-up that came from another process). Any thread. */
void notifier_wake_local(const char *user_id);
/* How many wake-ups user_id has had (counted once notifier_event_for created its entry).
 * A long-poll reads it before looking for news and again right after parking: a change
 * means a wake-up fell between the two, and it signals the event itself so the news is
 * not left waiting for the timeout. Any thread. */
uint64_t notifier_wake_count(const char *user_id);
/* Wake every user whose membership in room_id is join or invite (reads the room's
 * members with conn, a connection the caller holds), and the room's own entry, the key
 * room_id, on which peekers of a world_readable room park (sync_peek.c). */
void notifier_wake_room(PGconn *conn, const char *room_id);
/* The newest stream position (max of stream_seq handed out so far), or -1 on error. */
int64_t notifier_stream_position(PGconn *conn);

#endif
