/*
 * core/store/notify.c - the notification service (see notify.h): one thread, one dedicated
 * PostgreSQL connection that LISTENs on every subscribed channel, a queue of notifications
 * to send, and the reconnect loop.
 *
 * Decisions owned here:
 *   - One connection does both jobs. The thread that listens also sends what
 *     notify_publish_queued queued: one statement per drain (a JSON array unnested into
 *     pg_notify calls, so a burst of wake-ups costs one round trip), and payloads of a
 *     NOTIFY_BATCH channel joined by '\n' up to NOTIFY_MAX_PAYLOAD_BYTES. PostgreSQL then
 *     delivers them to every listener, this one included; NOTIFY_SKIP_OWN subscribers do
 *     not see those (their backend PID is ours).
 *   - The subscriber set is fixed at notify_start, so the thread reads it without a lock
 *     and LISTENs on all of it at each connect.
 *   - Coming up, in this order: LISTEN everything, call every callback with NULL (what was
 *     published while nobody listened is lost), then notify_live says 1. A cache that
 *     refuses to store while not live and forgets everything on NULL can therefore never
 *     keep an entry a missed notification should have removed. Going down: notify_live
 *     says 0 at once, before the thread sleeps.
 *   - Reconnects back off from NOTIFY_RETRY_MIN_MS, doubling to NOTIFY_RETRY_MAX_MS; a
 *     connection that comes up resets it.
 *   - A connection is lost when PostgreSQL closes it, and also when it stops answering:
 *     every statement the thread sends waits at most database.unresponsive_ms, and a
 *     connection silent for NOTIFY_PROBE_IDLE_MS is probed, so a frozen backend or a
 *     partition costs at most those two (then the NULL call), not TCP's minutes.
 * What it does not do: decide what a payload means (the subscribers do), or keep what it
 * could not send past NOTIFY_QUEUE_MAX_ENTRIES.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <jansson.h>

#include "core/runtime/core_runtime.h"
#include "core/store/notify.h"

#define NOTIFY_RETRY_MIN_MS 50       /* first wait after a lost or refused connection */
#define NOTIFY_RETRY_MAX_MS 5000     /* the back-off stops doubling here */
#define NOTIFY_POLL_MS 1000          /* the thread looks at its stop flag this often at least */
#define NOTIFY_PROBE_IDLE_MS 5000    /* a connection silent this long is probed (SELECT 1) */
#define NOTIFY_APP_NAME_BYTES 64

typedef struct notify_sub {
    char channel[NOTIFY_MAX_CHANNEL_BYTES + 1];
    unsigned flags;
    notify_cb cb;
    void *arg;
} notify_sub;

typedef struct queued {
    struct queued *next;
    unsigned flags;
    char *channel, *payload;
} queued;

struct notify_service {
    char *conninfo;
    int unresponsive_ms; /* a statement (a send, a probe) unanswered this long: connection lost */
    char app_name[NOTIFY_APP_NAME_BYTES];
    notify_sub subs[NOTIFY_MAX_SUBSCRIPTIONS];
    size_t n_subs; /* fixed once started */

    pthread_mutex_t mu; /* the queue */
    queued *head, *tail;
    size_t n_queued;

    atomic_bool live, stop, started;
    int wake_fd; /* eventfd: a queued notification or a stop */
    pthread_t thread;
    rt_metric *m_up, *m_received, *m_published, *m_reconnects, *m_dropped;
};

notify_service *notify_global(void)
{
    core_runtime *rt = core_runtime_get();
    return rt ? rt->notify : NULL;
}

bool notify_channel_ok(const char *channel)
{
    size_t n = channel ? strlen(channel) : 0;
    return n > 0 && n <= NOTIFY_MAX_CHANNEL_BYTES;
}

static bool payload_ok(const char *payload)
{
    return payload && strlen(payload) <= NOTIFY_MAX_PAYLOAD_BYTES;
}

notify_service *notify_new(const char *conninfo, int unresponsive_ms, rt_metrics *metrics)
{
    notify_service *s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    s->unresponsive_ms = unresponsive_ms > 0 ? unresponsive_ms : 1;
    s->conninfo = strdup(conninfo);
    s->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!s->conninfo || s->wake_fd < 0) {
        if (s->wake_fd >= 0) close(s->wake_fd);
        free(s->conninfo);
        free(s);
        return NULL;
    }
    snprintf(s->app_name, sizeof(s->app_name), "atrium-notify-%ld", (long)getpid());
    pthread_mutex_init(&s->mu, NULL);
    s->m_up = rt_metric_gauge(metrics, "atrium_notify_listener_up", NULL,
                              "1 while this process's listening connection to PostgreSQL is up");
    s->m_received = rt_metric_counter(metrics, "atrium_notify_received_total", NULL,
                                      "Notifications received from PostgreSQL (LISTEN)");
    s->m_published = rt_metric_counter(metrics, "atrium_notify_published_total", NULL,
                                       "Notifications this process published (NOTIFY)");
    s->m_reconnects = rt_metric_counter(metrics, "atrium_notify_reconnects_total", NULL,
                                        "Times the listening connection came back after a loss");
    s->m_dropped = rt_metric_counter(metrics, "atrium_notify_dropped_total", NULL,
                                     "Queued notifications dropped (queue full, or stopping)");
    return s;
}

int notify_subscribe(notify_service *s, const char *channel, unsigned flags, notify_cb cb,
                     void *arg)
{
    if (!s || !cb || !notify_channel_ok(channel)) {
        rt_log(ATRIUM_LOG_ERROR, "core", "notify: cannot subscribe to channel \"%s\" (1 to %d "
               "bytes)", channel ? channel : "(null)", NOTIFY_MAX_CHANNEL_BYTES);
        return -1;
    }
    if (atomic_load(&s->started)) {
        rt_log(ATRIUM_LOG_ERROR, "core", "notify: subscription to \"%s\" after start", channel);
        return -1;
    }
    if (s->n_subs >= NOTIFY_MAX_SUBSCRIPTIONS) {
        rt_log(ATRIUM_LOG_ERROR, "core", "notify: too many subscriptions (max %d)",
               NOTIFY_MAX_SUBSCRIPTIONS);
        return -1;
    }
    notify_sub *sub = &s->subs[s->n_subs++];
    snprintf(sub->channel, sizeof(sub->channel), "%s", channel);
    sub->flags = flags;
    sub->cb = cb;
    sub->arg = arg;
    return 0;
}

bool notify_live(const notify_service *s) { return s && atomic_load(&s->live); }

const char *notify_app_name(const notify_service *s) { return s ? s->app_name : ""; }

static void poke(notify_service *s)
{
    uint64_t one = 1;
    if (write(s->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        rt_log(ATRIUM_LOG_WARN, "core", "notify: cannot wake the listening thread: %s",
               strerror(errno));
}

int notify_publish_in(PGconn *conn, const char *channel, const char *payload)
{
    if (!conn || !notify_channel_ok(channel) || !payload_ok(payload)) return -1;
    const char *p[2] = {channel, payload};
    PGresult *res = PQexecParams(conn, "SELECT pg_notify($1, $2)", 2, NULL, p, NULL, NULL, 0);
    bool ok = PQresultStatus(res) == PGRES_TUPLES_OK;
    if (!ok)
        rt_log(ATRIUM_LOG_ERROR, "core", "notify: publishing on %s failed: %s", channel,
               PQresultErrorMessage(res));
    PQclear(res);
    notify_service *s = notify_global();
    if (ok && s) rt_metric_add(s->m_published, 1);
    return ok ? 0 : -1;
}

int notify_publish_queued(notify_service *s, const char *channel, const char *payload,
                          unsigned flags)
{
    if (!s || !notify_channel_ok(channel) || !payload_ok(payload)) return -1;
    queued *q = NULL;
    pthread_mutex_lock(&s->mu);
    bool room = atomic_load(&s->started) && !atomic_load(&s->stop) &&
                s->n_queued < NOTIFY_QUEUE_MAX_ENTRIES;
    if (room && (q = calloc(1, sizeof(*q))) != NULL) {
        q->flags = flags;
        q->channel = strdup(channel);
        q->payload = strdup(payload);
        if (!q->channel || !q->payload) {
            free(q->channel);
            free(q->payload);
            free(q);
            q = NULL;
        } else {
            if (s->tail) s->tail->next = q;
            else s->head = q;
            s->tail = q;
            s->n_queued++;
        }
    }
    pthread_mutex_unlock(&s->mu);
    if (!q) {
        rt_metric_add(s->m_dropped, 1);
        rt_log(ATRIUM_LOG_WARN, "core", "notify: a notification on %s was dropped (queue of %d "
               "full or stopped): other processes learn of it at their next poll or timeout",
               channel, NOTIFY_QUEUE_MAX_ENTRIES);
        return -1;
    }
    poke(s);
    return 0;
}

static void free_list(queued *q)
{
    while (q) {
        queued *next = q->next;
        free(q->channel);
        free(q->payload);
        free(q);
        q = next;
    }
}

/* ---- the thread ------------------------------------------------------------------------ */

/* Has this NOTIFY_BATCH (channel, payload) been taken into this drain already? Marks it. */
static bool batch_seen(json_t *seen, const queued *q)
{
    char key[NOTIFY_MAX_CHANNEL_BYTES + NOTIFY_MAX_PAYLOAD_BYTES + 8];
    snprintf(key, sizeof(key), "%zu:%s%s", strlen(q->channel), q->channel, q->payload);
    if (json_object_get(seen, key)) return true;
    json_object_set_new(seen, key, json_true());
    return false;
}

/* A JSON array of [channel, payload] pairs for one drain: NOTIFY_BATCH payloads of the
 * same channel joined by '\n', each once (a burst of writes wakes a user once). NULL on
 * OOM. */
static json_t *drain_json(const queued *list)
{
    json_t *arr = json_array(), *seen = json_object();
    char buf[NOTIFY_MAX_PAYLOAD_BYTES + 1];
    const queued *open = NULL; /* the batch being filled in buf */
    size_t used = 0;
    if (!seen) {
        json_decref(arr);
        return NULL;
    }
    for (const queued *q = list; arr && q; q = q->next) {
        size_t n = strlen(q->payload);
        if ((q->flags & NOTIFY_BATCH) && batch_seen(seen, q)) continue;
        if (open && (q->flags & NOTIFY_BATCH) && strcmp(open->channel, q->channel) == 0 &&
            used + 1 + n <= NOTIFY_MAX_PAYLOAD_BYTES) {
            buf[used++] = '\n';
            memcpy(buf + used, q->payload, n + 1);
            used += n;
            continue;
        }
        if (open) json_array_append_new(arr, json_pack("[ss]", open->channel, buf));
        open = NULL;
        if (q->flags & NOTIFY_BATCH) {
            open = q;
            memcpy(buf, q->payload, n + 1);
            used = n;
        } else {
            json_array_append_new(arr, json_pack("[ss]", q->channel, q->payload));
        }
    }
    if (arr && open) json_array_append_new(arr, json_pack("[ss]", open->channel, buf));
    json_decref(seen);
    return arr;
}

/* Run sql on c and wait at most s->unresponsive_ms for its result, so a PostgreSQL that
 * stops answering (a partition, a frozen backend) is noticed that soon rather than when
 * TCP gives up. Notifications arriving meanwhile stay queued in libpq for dispatch. The
 * result (the caller clears it), or NULL when c failed or did not answer in time (then c
 * must be dropped: a statement is still in flight on it). */
static PGresult *exec_bounded(notify_service *s, PGconn *c, const char *sql, int n,
                              const char *const *params)
{
    if (!PQsendQueryParams(c, sql, n, NULL, params, NULL, NULL, 0)) return NULL;
    int64_t deadline = rt_now_ms() + s->unresponsive_ms;
    while (PQisBusy(c)) {
        int64_t left = deadline - rt_now_ms();
        if (left <= 0) return NULL;
        struct pollfd p = {.fd = PQsocket(c), .events = POLLIN};
        int r = poll(&p, 1, (int)left);
        if (r < 0 && errno != EINTR) return NULL;
        if (r > 0 && !PQconsumeInput(c)) return NULL;
    }
    PGresult *res = PQgetResult(c), *extra;
    while ((extra = PQgetResult(c)) != NULL) PQclear(extra); /* ready for the next one */
    return res;
}

/* Send everything queued on c. false when c failed (what was taken goes back to the front
 * of the queue, as far as it fits). */
static bool flush_queue(notify_service *s, PGconn *c)
{
    pthread_mutex_lock(&s->mu);
    queued *list = s->head;
    size_t n = s->n_queued;
    s->head = s->tail = NULL;
    s->n_queued = 0;
    pthread_mutex_unlock(&s->mu);
    if (!list) return true;

    json_t *arr = drain_json(list);
    char *text = arr ? json_dumps(arr, JSON_COMPACT) : NULL;
    size_t n_notes = arr ? json_array_size(arr) : 0;
    json_decref(arr);
    bool ok = false, broken = false;
    if (text) {
        const char *p[1] = {text};
        PGresult *res = exec_bounded(s, c,
                                     "SELECT count(pg_notify(e->>0, e->>1))"
                                     " FROM json_array_elements($1::json) e",
                                     1, p);
        ok = PQresultStatus(res) == PGRES_TUPLES_OK;
        broken = !res || PQstatus(c) != CONNECTION_OK;
        if (!ok)
            rt_log(ATRIUM_LOG_WARN, "core", "notify: sending %zu notifications failed: %s",
                   n_notes, res ? PQresultErrorMessage(res) : "no answer in time");
        PQclear(res);
        free(text);
    }
    if (ok) {
        rt_metric_add(s->m_published, (int64_t)n_notes);
        free_list(list);
        return true;
    }
    /* A broken connection: back to the front, ahead of what was queued meanwhile, if it
     * still fits, for the next connection. A statement that failed on a healthy connection
     * (out of memory) would fail again: dropped. */
    pthread_mutex_lock(&s->mu);
    if (broken && s->n_queued + n <= NOTIFY_QUEUE_MAX_ENTRIES) {
        queued *last = list;
        while (last->next) last = last->next;
        last->next = s->head;
        if (!s->head) s->tail = last;
        s->head = list;
        s->n_queued += n;
        list = NULL;
    }
    pthread_mutex_unlock(&s->mu);
    if (list) {
        rt_metric_add(s->m_dropped, (int64_t)n);
        free_list(list);
    }
    return !broken;
}

/* Connect and LISTEN on every channel; NULL on failure (logged once per outage by the
 * caller's rate-limited log). */
static PGconn *listen_connect(notify_service *s)
{
    const char *const keys[] = {"dbname", "application_name", NULL};
    const char *const vals[] = {s->conninfo, s->app_name, NULL};
    PGconn *c = PQconnectdbParams(keys, vals, 1);
    if (!c || PQstatus(c) != CONNECTION_OK) {
        rt_log(ATRIUM_LOG_WARN, "core", "notify: cannot connect the listening connection: %s",
               c ? PQerrorMessage(c) : "out of memory");
        if (c) PQfinish(c);
        return NULL;
    }
    bool ok = true;
    for (size_t i = 0; ok && i < s->n_subs; i++) {
        char *id = PQescapeIdentifier(c, s->subs[i].channel, strlen(s->subs[i].channel));
        char sql[2 * NOTIFY_MAX_CHANNEL_BYTES + 16];
        if (!id) {
            ok = false;
            break;
        }
        snprintf(sql, sizeof(sql), "LISTEN %s", id);
        PQfreemem(id);
        PGresult *res = PQexec(c, sql);
        ok = PQresultStatus(res) == PGRES_COMMAND_OK;
        if (!ok)
            rt_log(ATRIUM_LOG_WARN, "core", "notify: LISTEN %s failed: %s", s->subs[i].channel,
                   PQresultErrorMessage(res));
        PQclear(res);
    }
    if (!ok) {
        PQfinish(c);
        return NULL;
    }
    return c;
}

/* Wait until deadline_ms or a stop; queued notifications do not cut the wait short. */
static void backoff_wait(notify_service *s, int64_t deadline_ms)
{
    for (int64_t now = rt_now_ms(); now < deadline_ms && !atomic_load(&s->stop);
         now = rt_now_ms()) {
        struct pollfd p = {.fd = s->wake_fd, .events = POLLIN};
        int wait = (int)(deadline_ms - now);
        if (poll(&p, 1, wait) > 0) {
            uint64_t v;
            if (read(s->wake_fd, &v, sizeof(v)) < 0 && errno != EAGAIN) break;
            if (!atomic_load(&s->stop)) {
                /* A publisher poked us: sleep a little instead of spinning on it. */
                struct timespec ts = {0, 1000000L};
                nanosleep(&ts, NULL);
            }
        }
    }
}

static void dispatch(notify_service *s, PGconn *c, int own_pid)
{
    PGnotify *note;
    while ((note = PQnotifies(c)) != NULL) {
        rt_metric_add(s->m_received, 1);
        for (size_t i = 0; i < s->n_subs; i++) {
            const notify_sub *sub = &s->subs[i];
            if (strcmp(sub->channel, note->relname) != 0) continue;
            if ((sub->flags & NOTIFY_SKIP_OWN) && note->be_pid == own_pid) continue;
            sub->cb(sub->arg, note->extra);
        }
        PQfreemem(note);
    }
}

static void went_down(notify_service *s, PGconn **c, const char *why)
{
    atomic_store(&s->live, false);
    rt_metric_set(s->m_up, 0);
    char reason[256];
    snprintf(reason, sizeof(reason), "%s", why && *why ? why : "connection closed");
    for (size_t n = strlen(reason); n && (reason[n - 1] == '\n' || reason[n - 1] == ' ');)
        reason[--n] = '\0';
    rt_log(ATRIUM_LOG_WARN, "core", "notify: listening connection lost (%s); caches that "
           "depend on it are bypassed until it is back", reason);
    PQfinish(*c);
    *c = NULL;
}

static void *listen_main(void *arg)
{
    notify_service *s = arg;
    PGconn *c = NULL;
    int own_pid = 0, retry_ms = NOTIFY_RETRY_MIN_MS;
    int64_t heard_ms = 0; /* when c last showed it is alive (connected, data, an answer) */
    bool ever = false;
    while (!atomic_load(&s->stop)) {
        if (!c) {
            if (!(c = listen_connect(s))) {
                backoff_wait(s, rt_now_ms() + retry_ms);
                retry_ms = retry_ms * 2 > NOTIFY_RETRY_MAX_MS ? NOTIFY_RETRY_MAX_MS : retry_ms * 2;
                continue;
            }
            own_pid = PQbackendPID(c);
            retry_ms = NOTIFY_RETRY_MIN_MS;
            /* Listening now: tell everyone what they may have missed, then go live. */
            for (size_t i = 0; i < s->n_subs; i++) s->subs[i].cb(s->subs[i].arg, NULL);
            if (ever) {
                rt_metric_add(s->m_reconnects, 1);
                rt_log(ATRIUM_LOG_INFO, "core", "notify: listening again; subscribers told "
                       "to revalidate");
            }
            ever = true;
            heard_ms = rt_now_ms();
            atomic_store(&s->live, true);
            rt_metric_set(s->m_up, 1);
        }
        if (!flush_queue(s, c)) {
            went_down(s, &c, PQerrorMessage(c));
            continue;
        }
        if (rt_now_ms() - heard_ms >= NOTIFY_PROBE_IDLE_MS) {
            /* Silence is not proof of life: a frozen or partitioned server says nothing. */
            PGresult *res = exec_bounded(s, c, "SELECT 1", 0, NULL);
            bool answered = res != NULL, alive = PQresultStatus(res) == PGRES_TUPLES_OK;
            PQclear(res);
            if (!alive) {
                went_down(s, &c, answered ? PQerrorMessage(c) : "no answer to a probe in time");
                continue;
            }
            heard_ms = rt_now_ms();
        }
        dispatch(s, c, own_pid); /* what arrived while a statement ran */
        struct pollfd p[2] = {{.fd = PQsocket(c), .events = POLLIN},
                              {.fd = s->wake_fd, .events = POLLIN}};
        int64_t until_probe = heard_ms + NOTIFY_PROBE_IDLE_MS - rt_now_ms();
        int wait_ms = until_probe < NOTIFY_POLL_MS ? (int)(until_probe > 0 ? until_probe : 0)
                                                   : NOTIFY_POLL_MS;
        int n = poll(p, 2, wait_ms);
        if (n > 0 && (p[1].revents & POLLIN)) {
            uint64_t v;
            if (read(s->wake_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
                rt_log(ATRIUM_LOG_WARN, "core", "notify: eventfd read: %s", strerror(errno));
        }
        if (n > 0 && p[0].revents) {
            if (!PQconsumeInput(c)) {
                went_down(s, &c, PQerrorMessage(c));
                continue;
            }
            heard_ms = rt_now_ms();
        }
        dispatch(s, c, own_pid);
        if (PQstatus(c) != CONNECTION_OK) went_down(s, &c, "connection closed");
    }
    atomic_store(&s->live, false);
    rt_metric_set(s->m_up, 0);
    if (c) PQfinish(c);
    return NULL;
}

int notify_start(notify_service *s)
{
    atomic_store(&s->stop, false);
    atomic_store(&s->started, true);
    if (pthread_create(&s->thread, NULL, listen_main, s) != 0) {
        atomic_store(&s->started, false);
        rt_log(ATRIUM_LOG_ERROR, "core", "cannot start the notification thread");
        return -1;
    }
    return 0;
}

void notify_stop(notify_service *s)
{
    if (!s || !atomic_load(&s->started)) return;
    pthread_mutex_lock(&s->mu);
    atomic_store(&s->stop, true); /* under mu: no publisher queues after this */
    pthread_mutex_unlock(&s->mu);
    poke(s);
    pthread_join(s->thread, NULL);
    atomic_store(&s->started, false);
    pthread_mutex_lock(&s->mu);
    rt_metric_add(s->m_dropped, (int64_t)s->n_queued);
    free_list(s->head);
    s->head = s->tail = NULL;
    s->n_queued = 0;
    pthread_mutex_unlock(&s->mu);
}

void notify_free(notify_service *s)
{
    if (!s) return;
    notify_stop(s);
    pthread_mutex_destroy(&s->mu);
    close(s->wake_fd);
    free(s->conninfo);
    free(s);
}
