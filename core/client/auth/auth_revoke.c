/*
 * core/client/auth/auth_revoke.c - a request that revoked access tokens answers only once
 * every live process sharing the database has dropped them from its token cache
 * (auth_cache.c), so a client told "logged out" finds the token refused by every process
 * behind the balancer, at once.
 *
 * The protocol, after the revoking transaction committed (the trigger's NOTIFY
 * atrium_auth has already gone out, and this process forgot the user synchronously):
 *   - the revoker registers a waiter under a revocation ID "<pid>.<seq>", parks the
 *     request (susp_wait: no request-pool thread waits), and in one statement on its held
 *     connection reads the live processes, the application_names "atrium-notify-<pid>"
 *     of the listening connections to this database in pg_stat_activity (its own
 *     excluded; other databases of the cluster are other deployments), and sends
 *     NOTIFY atrium_auth "<user> <revocation ID>";
 *   - every process, on that notification, forgets the user (auth_cache.c) and then
 *     queues NOTIFY atrium_auth_ack "<revocation ID> <its application_name>";
 *   - the revoker's waiter is woken once an ack came from every process it read, and the
 *     request answers. Acks that arrive before the list was read are kept and count.
 * Why this set is enough: a process whose listener is down is not in pg_stat_activity,
 * and while down its cache is bypassed (notify_live); one whose listener comes up after
 * the read emptied its cache when it did. The list is read in the same statement whose
 * commit sends the notification, so every process read was listening before it went out.
 * A process read whose listener is still subscribing, stopped, or slow, never acks in
 * time: past AUTH_REVOKE_WAIT_MS the request answers anyway, counted in
 * atrium_auth_revoke_unconfirmed_total and logged once per process. Shutdown answers too
 * (the revocation is committed: the answer is the truth for this process and the
 * database). Without a notification service, or with its own listener down (acks could
 * not be heard), the request answers at once, counted the same way if others listen.
 *
 * Payloads are IDs only. Waiters live in the request's arena, linked in one list under one
 * mutex; whoever unlinks a waiter (the ack that completes it, the handler that read the
 * list and found it complete, or the handler's re-run after the deadline) owns its one
 * susp_wake. Internal prefix: revoke_.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/client/auth/auth.h"
#include "core/http/http.h"
#include "core/store/db.h"
#include "core/store/notify.h"

#define AUTH_REVOKE_WAIT_MS 1000        /* a revocation waits this long for every ack */
#define REVOKE_MAX_PROCESSES 64         /* processes one revocation waits for */
#define REVOKE_NAME_BYTES 48            /* an application_name "atrium-notify-<pid>" */
#define REVOKE_ID_BYTES 48              /* "<pid>.<seq>" */
#define REVOKE_NOTIFY_CHANNEL "atrium_auth"
#define REVOKE_ACK_CHANNEL "atrium_auth_ack"
/* Tags r->core_state as a waiter. The handlers that revoke keep their handoff state in the
 * same slot before (login, devices, deactivate); each such state begins with a pointer,
 * which is never this odd value. */
#define REVOKE_MAGIC 0x7265766bu

typedef struct revoke_wait {
    unsigned magic;
    struct revoke_wait *next;
    atrium_req *r;
    bool linked;     /* in the list: its susp_wake is still owed */
    bool complete;   /* every expected process acked */
    bool known;      /* expected[] was read */
    char id[REVOKE_ID_BYTES];
    size_t n_expected, n_acked;
    char expected[REVOKE_MAX_PROCESSES][REVOKE_NAME_BYTES];
    char acked[REVOKE_MAX_PROCESSES][REVOKE_NAME_BYTES];
    int status;
    json_t *body; /* the answer, sent when the handler runs again */
} revoke_wait;

static pthread_mutex_t revoke_mu = PTHREAD_MUTEX_INITIALIZER;
static revoke_wait *revoke_head;
static atomic_ullong revoke_seq;
static atomic_bool revoke_warned;
static rt_metric *m_unconfirmed, *m_confirmed;

/* revoke_mu held. */
static void unlink_locked(revoke_wait *w)
{
    for (revoke_wait **p = &revoke_head; *p; p = &(*p)->next)
        if (*p == w) {
            *p = w->next;
            break;
        }
    w->linked = false;
}

/* revoke_mu held: has every expected process acked? */
static bool all_acked_locked(const revoke_wait *w)
{
    if (!w->known) return false;
    for (size_t i = 0; i < w->n_expected; i++) {
        bool seen = false;
        for (size_t j = 0; j < w->n_acked && !seen; j++)
            seen = strcmp(w->expected[i], w->acked[j]) == 0;
        if (!seen) return false;
    }
    return true;
}

/* The ack channel's callback (the service's thread): "<revocation ID> <process>". */
static void on_ack(void *arg, const char *payload)
{
    (void)arg;
    if (!payload) return; /* a reconnect: a waiter whose acks were missed runs out */
    const char *sp = strchr(payload, ' ');
    if (!sp || (size_t)(sp - payload) >= REVOKE_ID_BYTES || strlen(sp + 1) >= REVOKE_NAME_BYTES)
        return;
    atrium_req *wake = NULL;
    pthread_mutex_lock(&revoke_mu);
    for (revoke_wait *w = revoke_head; w; w = w->next) {
        if (strncmp(w->id, payload, (size_t)(sp - payload)) != 0 ||
            w->id[sp - payload] != '\0')
            continue;
        if (w->n_acked < REVOKE_MAX_PROCESSES) snprintf(w->acked[w->n_acked++],
                                                        REVOKE_NAME_BYTES, "%s", sp + 1);
        if (all_acked_locked(w)) {
            w->complete = true;
            wake = w->r;
            unlink_locked(w);
        }
        break;
    }
    pthread_mutex_unlock(&revoke_mu);
    if (wake) susp_wake(wake);
}

int auth_revoke_listen(notify_service *s, rt_metrics *metrics)
{
    m_unconfirmed = rt_metric_counter(
        metrics, "atrium_auth_revoke_unconfirmed_total", NULL,
        "Token revocations answered without every live process's acknowledgement");
    m_confirmed = rt_metric_counter(
        metrics, "atrium_auth_revoke_confirmed_total", NULL,
        "Token revocations answered once every live process dropped the tokens");
    return notify_subscribe(s, REVOKE_ACK_CHANNEL, 0, on_ack, NULL);
}

void auth_revoke_ack(const char *revocation_id)
{
    notify_service *s = notify_global();
    char payload[REVOKE_ID_BYTES + REVOKE_NAME_BYTES + 2];
    if (!s || strlen(revocation_id) >= REVOKE_ID_BYTES) return;
    snprintf(payload, sizeof(payload), "%s %s", revocation_id, notify_app_name(s));
    notify_publish_queued(s, REVOKE_ACK_CHANNEL, payload, 0);
}

/* Answer w's stored response, counting whether it was confirmed everywhere. */
static int answer(atrium_req *r, revoke_wait *w, bool confirmed)
{
    rt_metric_add(confirmed ? m_confirmed : m_unconfirmed, 1);
    if (!confirmed && !atomic_exchange(&revoke_warned, true))
        rt_log(ATRIUM_LOG_WARN, "core",
               "a token revocation was answered before every process sharing the database "
               "acknowledged it within %d ms (a process stopped or slow): such a process "
               "may accept the token a little longer (counted in "
               "atrium_auth_revoke_unconfirmed_total; logged once)", AUTH_REVOKE_WAIT_MS);
    json_t *body = w->body;
    w->body = NULL;
    return http_respond_json(r, w->status, body);
}

/* Read the live processes and send the revocation, in one statement: 0 or -1. */
static int read_and_send(PGconn *c, revoke_wait *w, const char *user_id, const char *self)
{
    char payload[NOTIFY_MAX_PAYLOAD_BYTES];
    if ((size_t)snprintf(payload, sizeof(payload), "%s %s", user_id, w->id) >= sizeof(payload))
        return -1;
    const char *p[3] = {REVOKE_NOTIFY_CHANNEL, payload, self};
    PGresult *res = PQexecParams(
        c,
        "SELECT pg_notify($1, $2)::text, (SELECT string_agg(DISTINCT application_name, ' ')"
        " FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name LIKE 'atrium-notify-%'"
        " AND application_name <> $3)",
        3, NULL, p, NULL, NULL, 0);
    int rc = res && PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1 ? 0 : -1;
    if (rc < 0) {
        rt_log(ATRIUM_LOG_WARN, "core", "token revocation: could not tell other processes: %s",
               PQerrorMessage(c));
        PQclear(res);
        return -1;
    }
    char names[REVOKE_MAX_PROCESSES * REVOKE_NAME_BYTES];
    snprintf(names, sizeof(names), "%s", PQgetisnull(res, 0, 1) ? "" : PQgetvalue(res, 0, 1));
    PQclear(res);
    pthread_mutex_lock(&revoke_mu);
    char *save = NULL;
    for (char *t = strtok_r(names, " ", &save); t && w->n_expected < REVOKE_MAX_PROCESSES;
         t = strtok_r(NULL, " ", &save))
        snprintf(w->expected[w->n_expected++], REVOKE_NAME_BYTES, "%s", t);
    w->known = true;
    pthread_mutex_unlock(&revoke_mu);
    return 0;
}

int auth_revoke_answer(atrium_req *r, PGconn *c, const char *user_id, int status,
                       json_t *body)
{
    notify_service *s = notify_global();
    if (!s) return http_respond_json(r, status, body); /* one process, nothing to tell */
    revoke_wait *w = rt_arena_alloc(r->arena, sizeof(*w));
    if (!w) {
        json_decref(body);
        return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    }
    memset(w, 0, sizeof(*w));
    *w = (revoke_wait){.magic = REVOKE_MAGIC, .r = r, .status = status, .body = body};
    snprintf(w->id, sizeof(w->id), "%ld.%llu", (long)getpid(),
             (unsigned long long)atomic_fetch_add(&revoke_seq, 1));
    if (!notify_live(s) || susp_wait(r, rt_now_ms() + AUTH_REVOKE_WAIT_MS) < 0)
        return answer(r, w, false); /* acks could not be heard, or stopping */
    r->core_state = w;
    pthread_mutex_lock(&revoke_mu);
    w->next = revoke_head;
    revoke_head = w;
    w->linked = true;
    pthread_mutex_unlock(&revoke_mu);
    int rc = read_and_send(c, w, user_id, notify_app_name(s));
    bool wake = false;
    pthread_mutex_lock(&revoke_mu);
    if (w->linked && (rc < 0 || all_acked_locked(w))) {
        w->complete = rc == 0;
        unlink_locked(w);
        wake = true;
    }
    pthread_mutex_unlock(&revoke_mu);
    if (wake) susp_wake(r); /* runs the handler again at once */
    return ATRIUM_PARKED;
}

bool auth_revoke_rerun(atrium_req *r, int *rc)
{
    revoke_wait *w = r->core_state;
    if (!w || w->magic != REVOKE_MAGIC) return false;
    r->core_state = NULL;
    pthread_mutex_lock(&revoke_mu);
    bool owed = w->linked; /* the deadline or shutdown ran it again: no ack will wake it */
    if (owed) unlink_locked(w);
    bool complete = w->complete;
    pthread_mutex_unlock(&revoke_mu);
    if (owed) susp_wake(r); /* gives back susp_wait's reference; resumes nothing now */
    *rc = answer(r, w, complete);
    return true;
}
