/*
 * tests/unit/test_notify.c - the notification service against the run's PostgreSQL
 * (ATRIUM_TEST_PG_CONNINFO, set by tests/run.sh; skipped without it): a notification
 * published inside a transaction arrives at commit and never after a rollback; queued
 * notifications are batched onto one line each and skipped by NOTIFY_SKIP_OWN
 * subscribers; a listening connection cut by PostgreSQL (pg_terminate_backend, found by
 * its application_name) comes back by itself, tells every subscriber it may have missed
 * notifications (payload NULL) before it says live again, and delivers again; and one
 * whose backend is frozen (SIGSTOP: the socket stays open) is found lost by the probe.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/store/notify.h"

#define WAIT_MS 5000       /* the longest any expected delivery may take here */
#define QUIET_MS 300       /* how long "nothing arrives" is watched */
#define RECORD_MAX 64
#define UNRESPONSIVE_MS 1000 /* the service's statement deadline here */

/* What one subscriber saw: payloads (NULL recorded as "(missed)") in order. */
typedef struct record {
    pthread_mutex_t mu;
    char *seen[RECORD_MAX];
    int n, n_missed;
    bool live_at_missed; /* notify_live when the NULL call came (must be false) */
    notify_service *svc;
} record;

static void on_note(void *arg, const char *payload)
{
    record *r = arg;
    pthread_mutex_lock(&r->mu);
    if (!payload) {
        r->n_missed++;
        if (notify_live(r->svc)) r->live_at_missed = true;
    } else if (r->n < RECORD_MAX) {
        r->seen[r->n++] = strdup(payload);
    }
    pthread_mutex_unlock(&r->mu);
}

static int count(record *r)
{
    pthread_mutex_lock(&r->mu);
    int n = r->n;
    pthread_mutex_unlock(&r->mu);
    return n;
}

static int missed(record *r)
{
    pthread_mutex_lock(&r->mu);
    int n = r->n_missed;
    pthread_mutex_unlock(&r->mu);
    return n;
}

/* Wait until r has at least n payloads; true if it did within WAIT_MS. */
static bool wait_count(record *r, int n)
{
    for (int64_t end = rt_now_ms() + WAIT_MS; rt_now_ms() < end; usleep(2000))
        if (count(r) >= n) return true;
    return count(r) >= n;
}

static bool wait_live(notify_service *s, bool want)
{
    for (int64_t end = rt_now_ms() + WAIT_MS; rt_now_ms() < end; usleep(1000))
        if (notify_live(s) == want) return true;
    return false;
}

static void record_init(record *r, notify_service *s)
{
    memset(r, 0, sizeof(*r));
    pthread_mutex_init(&r->mu, NULL);
    r->svc = s;
}

static void record_free(record *r)
{
    for (int i = 0; i < r->n; i++) free(r->seen[i]);
    pthread_mutex_destroy(&r->mu);
}

static char conninfo[1024], channel[64];

static int setup(void **state)
{
    (void)state;
    const char *base = getenv("ATRIUM_TEST_PG_CONNINFO");
    if (!base) return 0;
    snprintf(conninfo, sizeof(conninfo), "%s dbname=postgres", base);
    snprintf(channel, sizeof(channel), "test.notify.%ld", (long)getpid());
    return 0;
}

static PGconn *other_conn(void)
{
    PGconn *c = PQconnectdb(conninfo);
    if (PQstatus(c) != CONNECTION_OK) fail_msg("PostgreSQL: %s", PQerrorMessage(c));
    return c;
}

static void exec_ok(PGconn *c, const char *sql)
{
    PGresult *r = PQexec(c, sql);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
        fail_msg("%s: %s", sql, PQresultErrorMessage(r));
    PQclear(r);
}

#define SKIP_WITHOUT_PG()                                                                  \
    do {                                                                                   \
        if (!getenv("ATRIUM_TEST_PG_CONNINFO")) {                                          \
            printf("ATRIUM_TEST_PG_CONNINFO not set (tests/run.sh sets it): skipped\n");   \
            skip();                                                                        \
        }                                                                                  \
    } while (0)

static void test_a_notification_in_a_transaction_arrives_at_commit_never_after_rollback(void **st)
{
    (void)st;
    SKIP_WITHOUT_PG();
    rt_metrics *m = rt_metrics_new();
    notify_service *s = notify_new(conninfo, UNRESPONSIVE_MS, m);
    record r;
    record_init(&r, s);
    assert_int_equal(notify_subscribe(s, channel, 0, on_note, &r), 0);
    assert_int_equal(notify_start(s), 0);
    assert_true(wait_live(s, true));
    assert_int_equal(missed(&r), 1); /* the first connection too: nothing before it was heard */
    assert_false(r.live_at_missed);

    PGconn *c = other_conn();
    exec_ok(c, "BEGIN");
    assert_int_equal(notify_publish_in(c, channel, "rolled back"), 0);
    exec_ok(c, "ROLLBACK");
    exec_ok(c, "BEGIN");
    assert_int_equal(notify_publish_in(c, channel, "s42"), 0);
    usleep(QUIET_MS * 1000);
    assert_int_equal(count(&r), 0); /* not before the commit */
    exec_ok(c, "COMMIT");
    assert_true(wait_count(&r, 1));
    usleep(QUIET_MS * 1000);
    assert_int_equal(count(&r), 1); /* and the rolled-back one never */
    assert_string_equal(r.seen[0], "s42");
    PQfinish(c);

    /* A channel or payload the service would not carry is refused before PostgreSQL. */
    char big[NOTIFY_MAX_PAYLOAD_BYTES + 2];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    c = other_conn();
    assert_int_equal(notify_publish_in(c, channel, big), -1);
    assert_int_equal(notify_publish_in(c, "", "x"), -1);
    PQfinish(c);
    /* The set is fixed once started. */
    assert_int_equal(notify_subscribe(s, "late", 0, on_note, &r), -1);
    notify_free(s);
    record_free(&r);
    rt_metrics_free(m);
}

static void test_queued_notifications_are_batched_and_skipped_by_their_own_publisher(void **st)
{
    (void)st;
    SKIP_WITHOUT_PG();
    rt_metrics *m = rt_metrics_new();
    notify_service *s = notify_new(conninfo, UNRESPONSIVE_MS, m);
    record all, others;
    record_init(&all, s);
    record_init(&others, s);
    assert_int_equal(notify_subscribe(s, channel, 0, on_note, &all), 0);
    assert_int_equal(notify_subscribe(s, channel, NOTIFY_SKIP_OWN, on_note, &others), 0);
    assert_int_equal(notify_start(s), 0);
    assert_true(wait_live(s, true));

    /* Queued back to back: usually one drain, so one notification with a line per payload
     * and the repeat sent once. The thread may drain between two publishes; then every
     * line still arrives, in order, and a repeat that fell into a later drain is sent
     * again (dedup is per drain), so the exact text is asserted only for one drain. */
    static const char *const users[] = {"@a:x", "@b:x", "@a:x", "@c:x"};
    for (int i = 0; i < 4; i++)
        assert_int_equal(notify_publish_queued(s, channel, users[i], NOTIFY_BATCH), 0);
    for (int64_t end = rt_now_ms() + WAIT_MS; rt_now_ms() < end; usleep(2000)) {
        pthread_mutex_lock(&all.mu);
        size_t len = 0;
        for (int i = 0; i < all.n; i++) len += strlen(all.seen[i]) + 1;
        pthread_mutex_unlock(&all.mu);
        if (len >= strlen("@a:x\n@b:x\n@c:x") + 1) break;
    }
    usleep(QUIET_MS * 1000); /* a later drain's notification, if any, is in too */
    char joined[256] = "";
    for (int i = 0; i < all.n; i++) {
        if (i) strcat(joined, "\n");
        strcat(joined, all.seen[i]);
    }
    if (all.n == 1)
        assert_string_equal(joined, "@a:x\n@b:x\n@c:x");
    else
        assert_true(strcmp(joined, "@a:x\n@b:x\n@c:x") == 0 ||
                    strcmp(joined, "@a:x\n@b:x\n@a:x\n@c:x") == 0);
    /* The publisher's own copy is skipped by NOTIFY_SKIP_OWN; another process's is not. */
    PGconn *c = other_conn();
    assert_int_equal(notify_publish_in(c, channel, "from elsewhere"), 0);
    PQfinish(c);
    assert_true(wait_count(&others, 1));
    usleep(QUIET_MS * 1000);
    assert_int_equal(count(&others), 1);
    assert_string_equal(others.seen[0], "from elsewhere");
    assert_true(rt_metric_value(rt_metric_counter(m, "atrium_notify_published_total", NULL,
                                                  "")) >= 1);
    notify_free(s);
    /* Stopped: nothing is queued any more. */
    record_free(&all);
    record_free(&others);
    rt_metrics_free(m);
}

static void test_a_cut_listening_connection_comes_back_and_says_what_may_be_missed(void **st)
{
    (void)st;
    SKIP_WITHOUT_PG();
    rt_metrics *m = rt_metrics_new();
    notify_service *s = notify_new(conninfo, UNRESPONSIVE_MS, m);
    record r;
    record_init(&r, s);
    assert_int_equal(notify_subscribe(s, channel, 0, on_note, &r), 0);
    assert_int_equal(notify_start(s), 0);
    assert_true(wait_live(s, true));
    assert_int_equal(missed(&r), 1);

    PGconn *c = other_conn();
    char sql[256];
    /* Exactly one listening connection per process (the earlier tests' services closed
     * theirs; their backends may take a moment to leave pg_stat_activity). */
    snprintf(sql, sizeof(sql), "SELECT count(*) FROM pg_stat_activity"
             " WHERE application_name = 'atrium-notify-%ld'", (long)getpid());
    long listeners = -1;
    for (int64_t end = rt_now_ms() + WAIT_MS; rt_now_ms() < end && listeners != 1; usleep(10000)) {
        PGresult *res = PQexec(c, sql);
        assert_int_equal(PQresultStatus(res), PGRES_TUPLES_OK);
        listeners = atol(PQgetvalue(res, 0, 0));
        PQclear(res);
    }
    assert_int_equal(listeners, 1);
    snprintf(sql, sizeof(sql),
             "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
             " WHERE application_name = 'atrium-notify-%ld'", (long)getpid());
    PGresult *res = PQexec(c, sql);
    assert_int_equal(PQresultStatus(res), PGRES_TUPLES_OK);
    assert_int_equal(PQntuples(res), 1);
    PQclear(res);

    /* It comes back by itself, says "you may have missed some" first, then is live. */
    rt_metric *reconnects = rt_metric_counter(m, "atrium_notify_reconnects_total", NULL, "");
    for (int64_t end = rt_now_ms() + WAIT_MS; rt_now_ms() < end; usleep(1000))
        if (rt_metric_value(reconnects) == 1 && notify_live(s)) break;
    assert_int_equal(rt_metric_value(reconnects), 1);
    assert_true(notify_live(s));
    assert_int_equal(missed(&r), 2);
    assert_false(r.live_at_missed);
    rt_metric *up = rt_metric_gauge(m, "atrium_notify_listener_up", NULL, "");
    assert_int_equal(rt_metric_value(up), 1);

    /* And it delivers again. */
    assert_int_equal(notify_publish_in(c, channel, "after"), 0);
    assert_true(wait_count(&r, 1));
    assert_string_equal(r.seen[0], "after");
    PQfinish(c);
    notify_stop(s);
    assert_false(notify_live(s));
    assert_int_equal(notify_publish_queued(s, channel, "late", 0), -1);
    notify_free(s);
    record_free(&r);
    rt_metrics_free(m);
}

/* The pid of this process's listening backend, or 0. */
static long listener_backend_pid(PGconn *c)
{
    char sql[256];
    snprintf(sql, sizeof(sql), "SELECT pid FROM pg_stat_activity"
             " WHERE application_name = 'atrium-notify-%ld'", (long)getpid());
    PGresult *res = PQexec(c, sql);
    long pid = PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1
                   ? atol(PQgetvalue(res, 0, 0)) : 0;
    PQclear(res);
    return pid;
}

static void test_a_listening_backend_that_stops_answering_counts_as_lost(void **st)
{
    (void)st;
    SKIP_WITHOUT_PG();
    rt_metrics *m = rt_metrics_new();
    notify_service *s = notify_new(conninfo, UNRESPONSIVE_MS, m);
    record r;
    record_init(&r, s);
    assert_int_equal(notify_subscribe(s, channel, 0, on_note, &r), 0);
    assert_int_equal(notify_start(s), 0);
    assert_true(wait_live(s, true));
    PGconn *c = other_conn();
    long pid = 0;
    for (int64_t end = rt_now_ms() + WAIT_MS; rt_now_ms() < end && !pid; usleep(10000))
        pid = listener_backend_pid(c);
    assert_true(pid > 0);
    /* Frozen, not closed: the socket stays open and TCP sees nothing wrong. */
    if (kill((pid_t)pid, SIGSTOP) != 0) {
        printf("cannot stop PostgreSQL's backend %ld (%s): skipped\n", pid, strerror(errno));
        PQfinish(c);
        notify_free(s);
        record_free(&r);
        rt_metrics_free(m);
        skip();
    }
    rt_metric *reconnects = rt_metric_counter(m, "atrium_notify_reconnects_total", NULL, "");
    int64_t frozen = rt_now_ms();
    /* Lost within the probe's idle time and its deadline, then back on a new backend. */
    int64_t budget = 5000 + UNRESPONSIVE_MS + WAIT_MS;
    while (rt_now_ms() - frozen < budget && rt_metric_value(reconnects) < 1) usleep(10000);
    kill((pid_t)pid, SIGCONT);
    assert_int_equal(rt_metric_value(reconnects), 1);
    assert_true(wait_live(s, true));
    assert_int_equal(missed(&r), 2);
    assert_int_equal(notify_publish_in(c, channel, "after the freeze"), 0);
    assert_true(wait_count(&r, 1));
    assert_string_equal(r.seen[0], "after the freeze");
    PQfinish(c);
    notify_free(s);
    record_free(&r);
    rt_metrics_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_notification_in_a_transaction_arrives_at_commit_never_after_rollback),
        cmocka_unit_test(test_queued_notifications_are_batched_and_skipped_by_their_own_publisher),
        cmocka_unit_test(test_a_cut_listening_connection_comes_back_and_says_what_may_be_missed),
        cmocka_unit_test(test_a_listening_backend_that_stops_answering_counts_as_lost),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
