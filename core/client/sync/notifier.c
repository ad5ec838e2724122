/*
 * core/client/sync/notifier.c - per-user wake-up events for parked long-polls (see notifier.h).
 *
 * A small open hash table from user ID to atrium_event, under one mutex. It only grows with
 * the number of distinct users that long-polled since start-up, and of world_readable
 * rooms peeked through /events (keyed by room ID, sync_peek.c); each entry is an ID and an
 * event (a few dozen bytes). The table is the runtime object's (rt->notifier,
 * made and freed by core/main.c); without one bound nothing is parked or woken.
 *
 * Across processes: every wake-up is also queued on the notification service
 * (core/store/notify.h) as the user ID on channel NOTIFIER_CHANNEL, batched (one user per
 * line, many per notification). Every other process sharing the database receives it on
 * its notification thread and signals its own entry for that user, if any: a sync parked
 * anywhere wakes within a round trip of the write (the publisher's own copy is skipped:
 * it already woke its users). When the listening connection comes back after a loss,
 * every user is woken: whatever was missed is found by the syncs themselves, which re-read
 * the tables from their token.
 */
#include <stdlib.h>
#include <string.h>

#include "core/client/appservice/appservice.h"
#include "core/client/push/push_send.h"
#include "core/client/sync/notifier.h"
#include "core/runtime/core_runtime.h"
#include "core/store/notify.h"

#define NOTIFIER_INITIAL_BUCKETS 256
#define NOTIFIER_CHANNEL "atrium.wake" /* payload: user IDs, one a line */

typedef struct user_event {
    char *user_id;
    struct atrium_event *ev;
    uint64_t wakes; /* under mu */
    struct user_event *next;
} user_event;

struct notifier {
    pthread_mutex_t mu;
    user_event **buckets;
    size_t n_buckets, n_entries;
};

notifier *notifier_new(void)
{
    notifier *n = calloc(1, sizeof(*n));
    if (n) pthread_mutex_init(&n->mu, NULL);
    return n;
}

/* The bound runtime object's table, or NULL. */
static notifier *the_notifier(void)
{
    core_runtime *rt = core_runtime_get();
    return rt ? rt->notifier : NULL;
}

static size_t hash(const char *s)
{
    size_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static user_event *find_locked(notifier *n, const char *user_id)
{
    if (!n->buckets) return NULL;
    for (user_event *e = n->buckets[hash(user_id) % n->n_buckets]; e; e = e->next)
        if (strcmp(e->user_id, user_id) == 0) return e;
    return NULL;
}

static void grow_locked(notifier *n)
{
    size_t nb = n->n_buckets ? n->n_buckets * 2 : NOTIFIER_INITIAL_BUCKETS;
    user_event **nbk = calloc(nb, sizeof(*nbk));
    if (!nbk) return; /* keep the old table: slower, still correct */
    for (size_t i = 0; i < n->n_buckets; i++) {
        for (user_event *e = n->buckets[i], *next; e; e = next) {
            next = e->next;
            size_t b = hash(e->user_id) % nb;
            e->next = nbk[b];
            nbk[b] = e;
        }
    }
    free(n->buckets);
    n->buckets = nbk;
    n->n_buckets = nb;
}

struct atrium_event *notifier_event_for(http_server *s, const char *user_id)
{
    notifier *n = the_notifier();
    if (!n) return NULL;
    pthread_mutex_lock(&n->mu);
    user_event *e = find_locked(n, user_id);
    if (!e) {
        if (n->n_entries >= n->n_buckets) grow_locked(n);
        e = calloc(1, sizeof(*e));
        if (e) {
            e->user_id = strdup(user_id);
            e->ev = susp_event_new(s);
            if (!e->user_id || !e->ev || !n->buckets) {
                free(e->user_id);
                free(e); /* the event, if any, is freed with the server */
                e = NULL;
            } else {
                size_t b = hash(user_id) % n->n_buckets;
                e->next = n->buckets[b];
                n->buckets[b] = e;
                n->n_entries++;
            }
        }
    }
    struct atrium_event *ev = e ? e->ev : NULL;
    pthread_mutex_unlock(&n->mu);
    return ev;
}

void notifier_wake_local(const char *user_id)
{
    notifier *n = the_notifier();
    if (!n) return;
    pthread_mutex_lock(&n->mu);
    user_event *e = find_locked(n, user_id);
    struct atrium_event *ev = e ? e->ev : NULL;
    if (e) e->wakes++;
    pthread_mutex_unlock(&n->mu);
    if (ev) susp_event_signal(ev);
}

void notifier_wake_user(const char *user_id)
{
    notifier_wake_local(user_id);
    notify_service *s = notify_global();
    if (s) notify_publish_queued(s, NOTIFIER_CHANNEL, user_id, NOTIFY_BATCH);
}

/* Wake every user with an entry (after a reconnect of the notification service). */
static void wake_all_local(notifier *n)
{
    pthread_mutex_lock(&n->mu);
    size_t total = n->n_entries;
    struct atrium_event **evs = total ? calloc(total, sizeof(*evs)) : NULL;
    size_t k = 0;
    for (size_t i = 0; i < n->n_buckets; i++)
        for (user_event *e = n->buckets[i]; e; e = e->next) {
            e->wakes++;
            if (evs && k < total) evs[k++] = e->ev;
        }
    pthread_mutex_unlock(&n->mu);
    if (total && !evs)
        rt_log(ATRIUM_LOG_WARN, "core", "out of memory waking every sync; they answer at "
               "their timeout");
    for (size_t i = 0; i < k; i++) susp_event_signal(evs[i]);
    free(evs);
}

/* The notification service's callback: user IDs woken in another process, one a line, or
 * NULL (listening (re)started: wake everyone, the syncs re-read from their tokens). */
static void on_wake_notify(void *arg, const char *payload)
{
    notifier *n = arg;
    if (!payload) {
        wake_all_local(n);
        return;
    }
    push_send_kick(); /* another process's event may notify: the lease holder decides */
    as_sender_kick(); /* ... or interest an application service */
    char user[NOTIFY_MAX_PAYLOAD_BYTES + 1];
    for (const char *p = payload; *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        if (len > 0 && len < sizeof(user)) {
            memcpy(user, p, len);
            user[len] = '\0';
            notifier_wake_local(user);
        }
        p += len + (nl ? 1 : 0);
    }
}

int notifier_listen(notifier *n, notify_service *s)
{
    return notify_subscribe(s, NOTIFIER_CHANNEL, NOTIFY_SKIP_OWN, on_wake_notify, n);
}

uint64_t notifier_wake_count(const char *user_id)
{
    notifier *n = the_notifier();
    if (!n) return 0;
    pthread_mutex_lock(&n->mu);
    user_event *e = find_locked(n, user_id);
    uint64_t wakes = e ? e->wakes : 0;
    pthread_mutex_unlock(&n->mu);
    return wakes;
}

void notifier_wake_room(PGconn *conn, const char *room_id)
{
    push_send_kick(); /* the event may notify someone's phone (push_send.c) */
    as_sender_kick(); /* or interest an application service (as_sender.c) */
    const char *params[1] = {room_id};
    PGresult *res = db_query(conn,
                             "SELECT state_key FROM current_state"
                             " WHERE room_id = $1 AND type = 'm.room.member'"
                             " AND membership IN ('join', 'invite')",
                             1, params);
    if (PQresultStatus(res) == PGRES_TUPLES_OK)
        for (int i = 0; i < PQntuples(res); i++) notifier_wake_user(PQgetvalue(res, i, 0));
    else
        rt_log(ATRIUM_LOG_ERROR, "core", "waking room %s failed: %s", room_id,
               PQresultErrorMessage(res));
    PQclear(res);
    /* Peekers of the room (GET /events?room_id= by a non-member, sync_peek.c) park on the
     * room's own entry: room IDs and user IDs never collide ('!' against '@'). */
    notifier_wake_user(room_id);
}

int64_t notifier_stream_position(PGconn *conn)
{
    PGresult *res = PQexec(conn, "SELECT last_value, is_called FROM stream_seq");
    int64_t pos = -1;
    if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
        pos = PQgetvalue(res, 0, 1)[0] == 't' ? atoll(PQgetvalue(res, 0, 0)) : 0;
    PQclear(res);
    return pos;
}

void notifier_free(notifier *n)
{
    if (!n) return;
    for (size_t i = 0; i < n->n_buckets; i++) {
        for (user_event *e = n->buckets[i], *next; e; e = next) {
            next = e->next;
            free(e->user_id);
            free(e);
        }
    }
    free(n->buckets);
    pthread_mutex_destroy(&n->mu);
    free(n);
}
