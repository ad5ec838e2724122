/*
 * core/store/notify.h - the notification service: processes sharing one PostgreSQL tell
 * each other what changed, through LISTEN/NOTIFY on one listening connection per process.
 *
 * What it carries is small: IDs and stream positions (a user to wake, a user whose tokens
 * changed), never the data itself, which stays in the tables. Publishing has two forms:
 * inside the writer's transaction (notify_publish_in, delivered by PostgreSQL when the
 * transaction commits and never if it rolls back: the cleanest "after commit"), or queued
 * (notify_publish_queued: the listening thread sends it within milliseconds, for callers
 * that have already committed and must not wait for a round trip).
 *
 * The listening connection is dedicated (not from the request pool), made by the service's
 * own thread, and reconnected with a doubling back-off (NOTIFY_RETRY_MIN_MS to
 * NOTIFY_RETRY_MAX_MS). While it is down, notify_live says 0: a cache kept fresh by
 * notifications must be bypassed then. When it comes back, every subscriber's callback is
 * called once with payload NULL ("you may have missed notifications": revalidate, wake
 * everything) before notify_live says 1 again. Its application_name is
 * "atrium-notify-<pid>", so an operator (or a test) finds it in pg_stat_activity.
 *
 * What it does not do: persist or replay notifications (PostgreSQL drops those sent while
 * nobody listens; the missed-notification callback is the answer), or order them across
 * channels. Internal prefix: notify_.
 */
#ifndef ATRIUM_CORE_NOTIFY_H
#define ATRIUM_CORE_NOTIFY_H

#include <libpq-fe.h>
#include <stdbool.h>

#include "core/runtime/runtime.h"

/* The longest payload, in bytes (PostgreSQL allows 8000; ours are IDs and positions). */
#define NOTIFY_MAX_PAYLOAD_BYTES 1000
/* The longest channel name: PostgreSQL's identifier limit (NAMEDATALEN - 1). */
#define NOTIFY_MAX_CHANNEL_BYTES 63
/* Subscriptions in one process (core and plugins together). */
#define NOTIFY_MAX_SUBSCRIPTIONS 64
/* Queued notifications not yet sent (what a lost connection's outage may pile up). */
#define NOTIFY_QUEUE_MAX_ENTRIES 20000

/* Flags of notify_subscribe. */
#define NOTIFY_SKIP_OWN 0x1u /* do not deliver what this process queued itself
                                (notify_publish_queued): for wake-ups it already did */

/* Flags of notify_publish_queued. */
#define NOTIFY_BATCH 0x1u /* payloads of this channel may be joined by '\n' into one
                             notification (each line then is one payload), and one queued
                             twice before it is sent is sent once */

typedef struct notify_service notify_service;

/* payload is the notification's text, or NULL after a reconnect (notifications may have
 * been missed). Runs on the service's thread: must not block (signal, wake, queue). */
typedef void (*notify_cb)(void *arg, const char *payload);

/* A service for the database at conninfo (a libpq connection string, copied), not yet
 * started; a statement of its own unanswered for unresponsive_ms (the operator's
 * database.unresponsive_ms) counts as a lost connection; metrics (may be NULL) receives its
 * metrics. NULL on out of memory. Main thread. */
notify_service *notify_new(const char *conninfo, int unresponsive_ms, rt_metrics *metrics);
/* Call cb(arg, payload) for every notification on `channel` (1..NOTIFY_MAX_CHANNEL_BYTES
 * bytes, used exactly as given: case and dots are kept). Before notify_start only (the
 * set is fixed when listening begins). 0, or -1 (logged): bad channel, too many, started,
 * out of memory. */
int notify_subscribe(notify_service *s, const char *channel, unsigned flags, notify_cb cb,
                     void *arg);
/* Start the listening thread (it connects, LISTENs every subscribed channel, and keeps
 * reconnecting until notify_stop). 0 or -1 (logged). Main thread. */
int notify_start(notify_service *s);
/* Stop and join the thread: no callback runs after it returns; queued notifications not
 * yet sent are dropped. Main thread; NULL and an unstarted service are fine. */
void notify_stop(notify_service *s);
/* Stop (if needed) and free. NULL is fine. */
void notify_free(notify_service *s);

/* 1 while the listening connection is up and listens on every subscribed channel, 0
 * otherwise (also NULL s). Any thread. */
bool notify_live(const notify_service *s);
/* The listening connection's application_name ("atrium-notify-<pid>"): how other
 * processes find this one in pg_stat_activity. "" for NULL s. Any thread. */
const char *notify_app_name(const notify_service *s);

/* Publish on conn (a connection the caller holds): inside a transaction the caller opened,
 * delivered when it commits; outside one, at once. 0, or -1 (bad channel or payload, or
 * the statement failed: logged; inside a transaction, the transaction is then aborted).
 * Any thread. */
int notify_publish_in(PGconn *conn, const char *channel, const char *payload);
/* Queue `payload` for `channel`, to be sent by the service's thread on its own connection
 * within milliseconds (for callers that already committed). Queued while the connection is
 * down, up to NOTIFY_QUEUE_MAX_ENTRIES; beyond that, or when not started, dropped and
 * counted (atrium_notify_dropped_total). 0, or -1 (bad arguments, dropped). Any thread. */
int notify_publish_queued(notify_service *s, const char *channel, const char *payload,
                          unsigned flags);

/* Is channel a name notify_subscribe and the publishers accept? */
bool notify_channel_ok(const char *channel);

/* The bound runtime object's service (core/runtime/core_runtime.h), or NULL. */
notify_service *notify_global(void);

#endif
