/*
 * core/client/sync/notifier.c - per-user wake-up events for parked long-polls (see notifier.h).
 *
 * A small open hash table from user ID to atrium_event, under one mutex. It only grows with
 * the number of distinct users that long-polled since start-up; each entry is a user ID
 * and an event (a few dozen bytes).
 */
#include <stdlib.h>
#include <string.h>

#include "core/client/sync/notifier.h"

#define NOTIFIER_INITIAL_BUCKETS 256

typedef struct user_event {
    char *user_id;
    struct atrium_event *ev;
    uint64_t wakes; /* under mu */
    struct user_event *next;
} user_event;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static user_event **buckets;
static size_t n_buckets, n_entries;

static size_t hash(const char *s)
{
    size_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static user_event *find_locked(const char *user_id)
{
    if (!buckets) return NULL;
    for (user_event *e = buckets[hash(user_id) % n_buckets]; e; e = e->next)
        if (strcmp(e->user_id, user_id) == 0) return e;
    return NULL;
}

static void grow_locked(void)
{
    size_t nb = n_buckets ? n_buckets * 2 : NOTIFIER_INITIAL_BUCKETS;
    user_event **nbk = calloc(nb, sizeof(*nbk));
    if (!nbk) return; /* keep the old table: slower, still correct */
    for (size_t i = 0; i < n_buckets; i++) {
        for (user_event *e = buckets[i], *next; e; e = next) {
            next = e->next;
            size_t b = hash(e->user_id) % nb;
            e->next = nbk[b];
            nbk[b] = e;
        }
    }
    free(buckets);
    buckets = nbk;
    n_buckets = nb;
}

struct atrium_event *notifier_event_for(http_server *s, const char *user_id)
{
    pthread_mutex_lock(&mu);
    user_event *e = find_locked(user_id);
    if (!e) {
        if (n_entries >= n_buckets) grow_locked();
        e = calloc(1, sizeof(*e));
        if (e) {
            e->user_id = strdup(user_id);
            e->ev = susp_event_new(s);
            if (!e->user_id || !e->ev || !buckets) {
                free(e->user_id);
                free(e); /* the event, if any, is freed with the server */
                e = NULL;
            } else {
                size_t b = hash(user_id) % n_buckets;
                e->next = buckets[b];
                buckets[b] = e;
                n_entries++;
            }
        }
    }
    struct atrium_event *ev = e ? e->ev : NULL;
    pthread_mutex_unlock(&mu);
    return ev;
}

void notifier_wake_user(const char *user_id)
{
    pthread_mutex_lock(&mu);
    user_event *e = find_locked(user_id);
    struct atrium_event *ev = e ? e->ev : NULL;
    if (e) e->wakes++;
    pthread_mutex_unlock(&mu);
    if (ev) susp_event_signal(ev);
}

uint64_t notifier_wake_count(const char *user_id)
{
    pthread_mutex_lock(&mu);
    user_event *e = find_locked(user_id);
    uint64_t n = e ? e->wakes : 0;
    pthread_mutex_unlock(&mu);
    return n;
}

void notifier_wake_room(PGconn *conn, const char *room_id)
{
    const char *params[1] = {room_id};
    PGresult *res = PQexecParams(conn,
                                 "SELECT state_key FROM current_state"
                                 " WHERE room_id = $1 AND type = 'm.room.member'"
                                 " AND membership IN ('join', 'invite')",
                                 1, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(res) == PGRES_TUPLES_OK)
        for (int i = 0; i < PQntuples(res); i++) notifier_wake_user(PQgetvalue(res, i, 0));
    else
        rt_log(ATRIUM_LOG_ERROR, "core", "waking room %s failed: %s", room_id,
               PQresultErrorMessage(res));
    PQclear(res);
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

void notifier_free(void)
{
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < n_buckets; i++) {
        for (user_event *e = buckets[i], *next; e; e = next) {
            next = e->next;
            free(e->user_id);
            free(e);
        }
    }
    free(buckets);
    buckets = NULL;
    n_buckets = n_entries = 0;
    pthread_mutex_unlock(&mu);
}
