/*
 * core/client/rooms/crooms_typing.c - typing notices that run out: when a typer's timeout passes
 * without a new notice, the room's members learn it at that moment, as they would from
 * `typing: false`.
 *
 * The decision this file owns is how an expiry becomes news: one thread (the "typing
 * reaper") sleeps until the earliest expiry it knows of, then, in one statement, gives
 * every typing row whose time has passed a new stream position and marks it reported
 * (expires_ts 0, as `typing: false` does), and wakes each of those rooms. A /sync reports
 * a room's typers whenever a typing row of the room has a position in its window, so the
 * expiry reaches every parked and later sync like any other change. The earliest expiry
 * comes from PUT /typing in this process (crooms_typing_expires_at) and, after each
 * pass, from the table itself, so rows written before a restart are reaped too; and
 * from other processes sharing the database, whose PUT /typing publishes its expiry on
 * TYPING_CHANNEL (core/store/notify.h), so a notice whose writer died still runs out on
 * time. After the notification service reconnects, a pass runs at once. A pass that
 * cannot reach PostgreSQL is tried again TYPING_REAP_RETRY_MS later.
 *
 * Several processes sharing one database reap in one of them: the holder of the lease
 * core.typing_reaper (core/store/lease.h). Every reaper hears every expiry, but only the
 * holder's pass touches the table; the others' passes return at once, and when their
 * process takes the lease over (on_gain) a pass runs at once, so a dead holder's
 * expiries are reported by the next one within server.lease_ttl_ms. While the
 * notification service is down (expiries from other processes go unheard) the holder
 * also looks at the table every TYPING_REAP_POLL_MS. What this file does not do: store
 * typing notices or report them (crooms_ephemeral.c, sync_rooms.c).
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "core/client/sync/notifier.h"
#include "core/store/notify.h"
#include "core/client/rooms/crooms_api.h"
#include "core/config/config.h"
#include "core/runtime/core_runtime.h"
#include "core/store/lease.h"

#define TYPING_REAP_RETRY_MS 5000 /* after a pass that failed */
#define TYPING_REAP_DB_WAIT_MS 2000 /* background work: its own wait, not a request's */
#define TYPING_REAP_POLL_MS 2000 /* the holder's look at the table while notify is down */
#define TYPING_REAP_LEASE "core.typing_reaper"
#define TYPING_CHANNEL "atrium.typing" /* payload: an expiry, wall-clock ms */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER; /* CLOCK_REALTIME, like the expiries */
static pthread_t reaper;
static bool running, quit;
static int64_t next_ms; /* wall-clock ms of the earliest known expiry; 0 = none known */
static lease *reap_lease; /* NULL without a lease service (always held) */

/* Reap at wall_ms at the latest, in this process. */
static void expires_at_local(int64_t wall_ms)
{
    pthread_mutex_lock(&mu);
    if (next_ms == 0 || wall_ms < next_ms) {
        next_ms = wall_ms;
        pthread_cond_signal(&cond);
    }
    pthread_mutex_unlock(&mu);
}

void crooms_typing_expires_at(PGconn *c, int64_t wall_ms)
{
    expires_at_local(wall_ms);
    char v[24];
    snprintf(v, sizeof(v), "%lld", (long long)wall_ms);
    if (notify_publish_in(c, TYPING_CHANNEL, v) < 0)
        rt_log(ATRIUM_LOG_WARN, "core", "other processes were not told of a typing notice's "
               "expiry; their reapers find it at their next pass");
}

/* Another process's expiry, or NULL (notifications missed: a pass at once finds them). */
static void on_typing_notify(void *arg, const char *payload)
{
    (void)arg;
    int64_t at = payload ? atoll(payload) : 1;
    if (at > 0) expires_at_local(at);
}

/* One pass at now_ms: report every expired row and wake its room. The next expiry to wait
 * for (0: none), or a retry time after a failure. */
static int64_t reap(int64_t now_ms)
{
    if (!lease_held(reap_lease)) return 0; /* another process reaps; on_gain wakes this one */
    PGconn *c = db_acquire_background(db_global(), TYPING_REAP_DB_WAIT_MS);
    if (!c) return now_ms + TYPING_REAP_RETRY_MS;
    char now_s[24];
    snprintf(now_s, sizeof(now_s), "%lld", (long long)now_ms);
    const char *p[1] = {now_s};
    PGresult *res = rooms_q(c,
                            "WITH gone AS (UPDATE typing SET expires_ts = 0,"
                            " stream_pos = stream_next() WHERE expires_ts > 0"
                            " AND expires_ts <= $1::bigint RETURNING room_id)"
                            " SELECT DISTINCT room_id FROM gone",
                            1, p, NULL);
    if (res) {
        for (int i = 0; i < PQntuples(res); i++) notifier_wake_room(c, PQgetvalue(res, i, 0));
        PQclear(res);
        res = rooms_q(c, "SELECT coalesce(min(expires_ts), 0) FROM typing WHERE expires_ts > 0",
                      0, NULL, NULL);
    }
    int64_t next = res ? atoll(PQgetvalue(res, 0, 0)) : now_ms + TYPING_REAP_RETRY_MS;
    if (reap_lease && !notify_live(notify_global()) &&
        (next == 0 || next > now_ms + TYPING_REAP_POLL_MS))
        next = now_ms + TYPING_REAP_POLL_MS; /* other processes' expiries go unheard */
    if (!res)
        rt_log(ATRIUM_LOG_WARN, "core", "typing notices that ran out could not be reported; "
               "trying again in %d s", TYPING_REAP_RETRY_MS / 1000);
    PQclear(res);
    db_release(db_global(), c);
    return next;
}

static void *reaper_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&mu);
    while (!quit) {
        int64_t now = rt_wall_ms();
        if (next_ms == 0) {
            pthread_cond_wait(&cond, &mu);
            continue;
        }
        if (now < next_ms) {
            struct timespec until = {.tv_sec = next_ms / 1000,
                                     .tv_nsec = (long)(next_ms % 1000) * 1000000L};
            pthread_cond_timedwait(&cond, &mu, &until);
            continue;
        }
        next_ms = 0;
        pthread_mutex_unlock(&mu);
        int64_t later = reap(now);
        pthread_mutex_lock(&mu);
        if (later > 0 && (next_ms == 0 || later < next_ms)) next_ms = later;
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

/* This process took the reaper's lease (on the lease thread): a pass at once. */
static void typing_lease_gained(void *arg)
{
    (void)arg;
    expires_at_local(1);
}

int crooms_typing_start(void)
{
    core_runtime *rt = core_runtime_get();
    if (rt && rt->leases && !reap_lease &&
        !(reap_lease = lease_create(rt->leases, TYPING_REAP_LEASE, rt->cfg->lease_ttl_ms,
                                    typing_lease_gained, NULL))) {
        rt_log(ATRIUM_LOG_ERROR, "core", "cannot create the lease %s", TYPING_REAP_LEASE);
        return -1;
    }
    notify_service *ns = notify_global();
    if (ns && notify_subscribe(ns, TYPING_CHANNEL, 0, on_typing_notify, NULL) < 0)
        return -1;
    pthread_mutex_lock(&mu);
    quit = false;
    next_ms = 1; /* a first pass at once: rows left by an earlier run or another process */
    pthread_mutex_unlock(&mu);
    if (pthread_create(&reaper, NULL, reaper_main, NULL) != 0) {
        rt_log(ATRIUM_LOG_ERROR, "core", "cannot start the typing reaper thread");
        return -1;
    }
    running = true;
    return 0;
}

void crooms_typing_stop(void)
{
    if (!running) return;
    pthread_mutex_lock(&mu);
    quit = true;
    pthread_cond_signal(&cond);
    pthread_mutex_unlock(&mu);
    pthread_join(reaper, NULL);
    running = false;
    reap_lease = NULL; /* the service frees it; a next start (tests) creates its own */
}
