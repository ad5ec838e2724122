/*
 * core/client/push/push_send.c - the push sender: one thread ("push-sender") that decides
 * which new events notify which local users, and delivers those notifications to the push
 * gateways of the users' http pushers (spec v1.11, "Push Gateway API": POST
 * /_matrix/push/v1/notify, as Sygnal serves it).
 *
 * Deciding. The sender follows the event stream with a cursor (push_cursor, one row): each
 * pass reads the events committed after it (up to stream_upto(), so no event is skipped by
 * a transaction that commits late), at most PUSH_SCAN_BATCH of them, and evaluates each
 * against the push rules (push_eval.h) of every local member of the room other than the
 * sender who is joined (and of the invitee of an invite). A notifying verdict is a row of
 * push_notifications (what GET /notifications lists) and, for each of the user's http
 * pushers, a row of push_queue. Rows and the cursor move in one transaction, so a crash
 * repeats a batch (the unique key makes that harmless) and never loses one. The cursor
 * starts at the stream's end when the table is made (accounts migration 7, or here if
 * the row is missing): history is never pushed.
 *
 * Delivering. Per pusher the oldest queued row is sent, one at a time, so a gateway sees
 * a user's notifications in order; up to PUSH_MAX_IN_FLIGHT pushers are in flight at
 * once. A request goes through the server's one outbound client (fed_request_submit with
 * a URL, http or https: unsigned, the address blacklist applied at connect, within
 * PUSH_REQUEST_TIMEOUT_MS and PUSH_MAX_ANSWER_BYTES; a gateway on a blacklisted address,
 * such as Sygnal on localhost, needs that address in federation.ip_range_whitelist); its
 * callback, on the outbound client's thread, only records the answer and wakes the
 * sender, which does the database work. A 2xx deletes the row, and a pushkey the gateway lists in
 * "rejected" deletes the pusher (the spec's rule); no answer, a 5xx or a 429 is retried
 * after PUSH_RETRY_MIN_MS doubled per attempt up to PUSH_RETRY_MAX_MS, and dropped after
 * PUSH_MAX_ATTEMPTS; any other answer drops the row (the gateway refuses it for good). A
 * pusher whose URL the outbound client cannot parse (pushers.c checks it when the pusher
 * is set) has its rows dropped with a warning.
 *
 * Pruning: a user keeps their newest push.notifications_per_user_max notifications. Their
 * number is kept beside the rows (push_notification_counts, moved in the same statement as
 * each insert), and once it passes the kept number by a tenth, decide deletes the older
 * rows in the same transaction (so under the lease, counted by
 * atrium_push_notifications_pruned_total); pushes still queued for them go too (the
 * gateway has not taken the newer ones either). The table thus holds at most 1.1 times
 * the kept number of rows per user, and the unread count below never counts more.
 *
 * Counts: notification.counts.unread is the user's notifications newer than their read
 * receipt in each room (as the badge of a phone's app shows). data.format
 * "event_id_only" sends only the IDs, counts and devices, as the spec describes.
 *
 * Several processes sharing one database: deciding and sending run only in the process
 * holding the lease core.push_sender (core/store/lease.h), so an event is pushed once. The
 * others only settle the answers of requests they sent before the lease moved. Another
 * process's events reach the holder as a sync wake-up (notifier.c kicks this sender for
 * them) or, at the latest, at the next PUSH_POLL_MS pass; when the holder dies another
 * process takes the lease within server.lease_ttl_ms and carries on from the cursor.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/accounts/accounts.h"
#include "core/client/push/push_eval.h"
#include "core/client/push/push_rules.h"
#include "core/client/push/push_send.h"
#include "core/federation/transport/fed_request.h"
#include "core/rooms/canonical_json.h"
#include "core/store/lease.h"

#define PUSH_POLL_MS 2000              /* a pass runs this often even when not kicked */
#define PUSH_DB_WAIT_MS 5000           /* the sender waits this long for a connection */
#define PUSH_DB_RETRY_MS 1000          /* a pass that failed on the database runs again */
#define PUSH_SCAN_BATCH 100            /* events decided per pass */
#define PUSH_MAX_RECIPIENTS 10000      /* local members evaluated per event; more are not */
#define PUSH_MAX_IN_FLIGHT 16          /* pushers with a request in flight */
#define PUSH_DELIVER_BATCH 64          /* queued rows looked at per pass */
#define PUSH_REQUEST_TIMEOUT_MS 15000  /* one notify request */
#define PUSH_RETRY_MIN_MS 1000         /* the first retry's delay; doubled per attempt */
#define PUSH_RETRY_MAX_MS (10 * 60 * 1000)
#define PUSH_MAX_ATTEMPTS 12           /* a row is dropped after this many failures */
#define PUSH_MAX_ANSWER_BYTES 65536    /* a gateway's answer */
#define PUSH_PUSHKEY_BYTES 513         /* pushers.c: PUSHER_PUSHKEY_MAX_BYTES + NUL */
#define PUSH_LEASE "core.push_sender"  /* the one process that decides and sends */
#define PUSH_KEEP_PER_USER_DEFAULT 1000 /* push.notifications_per_user_max's default */

/* One pusher's request in flight. The sender fills it before submitting; the callback sets
 * answered, ok, retry and rejected under mu. */
typedef struct push_flight {
    bool busy, answered;
    int64_t queue_id;
    int attempts;
    char user_id[256], app_id[128], pushkey[PUSH_PUSHKEY_BYTES];
    bool ok, retry, rejected;
    int status;
} push_flight;

/* The one sender. Static: a callback that comes after stop still has its memory. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool inited, started, stopping, kicked;
    pthread_t thread;
    db_pool *db;
    lease *lease; /* NULL without a lease service: always held */
    int64_t keep_per_user; /* push.notifications_per_user_max */
    push_flight flights[PUSH_MAX_IN_FLIGHT];
    rt_metric *m_in_flight, *m_in_flight_limit, *m_pruned;
} S = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* Under S.mu: the in-flight gauge follows the busy flights. */
static void flights_changed_locked(void)
{
    int busy = 0;
    for (int i = 0; i < PUSH_MAX_IN_FLIGHT; i++) busy += S.flights[i].busy;
    rt_metric_set(S.m_in_flight, busy);
}

void push_send_kick(void)
{
    pthread_mutex_lock(&S.mu);
    if (S.inited) {
        S.kicked = true;
        pthread_cond_signal(&S.cv);
    }
    pthread_mutex_unlock(&S.mu);
}

static const char *i64(char *buf, size_t len, int64_t v)
{
    snprintf(buf, len, "%lld", (long long)v);
    return buf;
}

/* ---- deciding -------------------------------------------------------------------------- */

/* The room's facts the rule conditions read (member count, creator, power levels), parsed
 * into *holder (the caller decrefs). false on a database failure. */
static bool room_facts(PGconn *c, const char *room_id, push_room *pr, json_t **holder)
{
    *holder = json_array();
    const char *p[1] = {room_id};
    PGresult *res = acc_q(c,
                          "SELECT rm.creator, rm.joined_members,"
                          " (SELECT e.pdu FROM current_state cs JOIN events e"
                          "  ON e.event_id = cs.event_id WHERE cs.room_id = $1"
                          "  AND cs.type = 'm.room.power_levels' AND cs.state_key = ''"
                          "  AND e.redacted_by IS NULL)"
                          " FROM rooms rm WHERE rm.room_id = $1",
                          1, p);
    if (!res) return false;
    if (PQntuples(res) == 1) {
        json_t *facts = json_pack("{s:s}", "creator", PQgetvalue(res, 0, 0));
        if (facts && json_array_append_new(*holder, facts) == 0)
            pr->creator = json_string_value(json_object_get(facts, "creator"));
        pr->member_count = atoll(PQgetvalue(res, 0, 1));
        json_t *pl = PQgetisnull(res, 0, 2) ? NULL : json_loads(PQgetvalue(res, 0, 2), 0, NULL);
        if (pl && json_array_append_new(*holder, pl) == 0)
            pr->power_levels = json_object_get(pl, "content");
    }
    PQclear(res);
    return true;
}

/* The actions of the rule that decided (rule_id in global), or an empty array. */
static json_t *rule_actions(const json_t *global, const char *rule_id)
{
    const char *kind;
    json_t *rules;
    json_object_foreach((json_t *)global, kind, rules) {
        size_t i;
        json_t *rule;
        json_array_foreach(rules, i, rule) {
            const char *id = json_string_value(json_object_get(rule, "rule_id"));
            if (id && strcmp(id, rule_id) == 0) {
                json_t *a = json_object_get(rule, "actions");
                return json_is_array(a) ? json_incref(a) : json_array();
            }
        }
    }
    return json_array();
}

/* ---- pruning ---------------------------------------------------------------------------- */

/* Does a user with n notification rows get pruned now? Past the kept number by a tenth
 * (at least one row), so the pruning walk over a user's newest rows runs once per tenth
 * of them rather than at every notification. */
static bool push_over_keep(int64_t n)
{
    int64_t keep = S.keep_per_user;
    return n > keep + keep / 10;
}

/* Delete user's notifications older than their newest keep_per_user (their queued pushes
 * go with them: ON DELETE CASCADE) and set their count to what is left; *pruned grows by
 * the rows deleted. Inside decide's transaction. false on a database failure. */
static bool prune_user(PGconn *c, const char *user, int64_t *pruned)
{
    char keep[24];
    const char *p[2] = {user, i64(keep, sizeof(keep), S.keep_per_user)};
    PGresult *res = acc_q(c,
                          "WITH cut AS (SELECT stream_pos FROM push_notifications"
                          "  WHERE user_id = $1 ORDER BY stream_pos DESC OFFSET $2::int LIMIT 1),"
                          " d AS (DELETE FROM push_notifications n USING cut"
                          "  WHERE n.user_id = $1 AND n.stream_pos <= cut.stream_pos RETURNING 1)"
                          " UPDATE push_notification_counts SET n ="
                          "  (SELECT count(*) FROM push_notifications WHERE user_id = $1)"
                          "  - (SELECT count(*) FROM d)"
                          " WHERE user_id = $1 RETURNING (SELECT count(*) FROM d)",
                          2, p);
    if (!res) return false;
    if (PQntuples(res) == 1) *pruned += atoll(PQgetvalue(res, 0, 0));
    PQclear(res);
    return true;
}

/* Keep the notifications of one event, notified [{user_id, highlight, actions}], for
 * every member at once (one statement, not one per member: a message to a 1,000-member
 * room made a thousand), queue them for each member's HTTP pushers and count them; a
 * member over its keep (push_over_keep) is pruned. false on a database failure. */
static bool keep_notifications(PGconn *c, const json_t *notified, const char *room_id,
                               const char *event_id, const char *pos, int64_t *pruned)
{
    char *rows = json_dumps(notified, JSON_COMPACT), ts[24];
    const char *q[5] = {rows, room_id, event_id, pos, i64(ts, sizeof(ts), rt_wall_ms())};
    PGresult *kept = rows ? acc_q(c,
        "WITH v AS (SELECT * FROM jsonb_to_recordset($1::jsonb)"
        "  AS v(user_id text, highlight boolean, actions jsonb)),"
        " n AS (INSERT INTO push_notifications (user_id, room_id, event_id, stream_pos,"
        "  highlight, actions, ts) SELECT v.user_id, $2, $3, $4, v.highlight, v.actions, $5"
        "  FROM v ON CONFLICT (user_id, event_id) DO NOTHING RETURNING id, user_id),"
        " q AS (INSERT INTO push_queue (notification_id, user_id, app_id, pushkey)"
        "  SELECT n.id, p.user_id, p.app_id, p.pushkey FROM n JOIN pushers p"
        "  ON p.user_id = n.user_id WHERE p.kind = 'http' AND p.enabled)"
        " INSERT INTO push_notification_counts (user_id, n) SELECT n.user_id, 1 FROM n"
        " ON CONFLICT (user_id) DO UPDATE SET n = push_notification_counts.n + 1"
        " RETURNING user_id, n",
        5, q) : NULL;
    free(rows);
    bool ok = kept != NULL;
    for (int i = 0; ok && i < PQntuples(kept); i++)
        if (push_over_keep(atoll(PQgetvalue(kept, i, 1))))
            ok = prune_user(c, PQgetvalue(kept, i, 0), pruned);
    PQclear(kept);
    return ok;
}

/* Decide one event for its room's local members; *pruned grows by the notifications
 * pruned to make room. false on a database failure. */
static bool decide_event(PGconn *c, PGresult *ev, int row, int64_t *pruned)
{
    const char *pos = PQgetvalue(ev, row, 0), *event_id = PQgetvalue(ev, row, 1);
    const char *room_id = PQgetvalue(ev, row, 2), *sender = PQgetvalue(ev, row, 3);
    json_t *pdu = json_loads(PQgetvalue(ev, row, 4), 0, NULL);
    if (!pdu) return true; /* corrupt rows are logged where events are rendered */
    char lim[24];
    const char *p[4] = {room_id, sender, event_id, i64(lim, sizeof(lim), PUSH_MAX_RECIPIENTS)};
    PGresult *who = acc_q(c,
                          "SELECT cs.state_key, m.pdu::jsonb -> 'content' ->> 'displayname'"
                          " FROM current_state cs JOIN users u ON u.user_id = cs.state_key"
                          " JOIN events m ON m.event_id = cs.event_id"
                          " WHERE cs.room_id = $1 AND cs.type = 'm.room.member'"
                          " AND cs.state_key <> $2 AND (cs.membership = 'join'"
                          "  OR (cs.membership = 'invite' AND cs.event_id = $3))"
                          " ORDER BY cs.state_key LIMIT $4::int",
                          4, p);
    push_room pr = {0};
    json_t *holder = NULL;
    bool ok = who && (PQntuples(who) == 0 || room_facts(c, room_id, &pr, &holder));
    /* every member's push rules in two statements, not two per member */
    push_rules_batch *rules = ok && PQntuples(who) > 0 ? push_rules_batch_read(c, who) : NULL;
    if (ok && PQntuples(who) > 0 && !rules) ok = false;
    json_t *notified = json_array(); /* [{user_id, highlight, actions}] */
    if (!notified) ok = false;
    for (int i = 0; ok && i < PQntuples(who); i++) {
        const char *user = PQgetvalue(who, i, 0);
        json_t *global = push_rules_batch_for(rules, user);
        if (!global) {
            ok = false;
            break;
        }
        pr.display_name = PQgetisnull(who, i, 1) ? NULL : PQgetvalue(who, i, 1);
        push_outcome o = push_eval(global, pdu, &pr);
        if (o.notify) {
            json_t *actions = rule_actions(global, o.rule_id);
            ok = json_array_append_new(notified, json_pack("{s:s, s:b, s:o}", "user_id", user,
                                                           "highlight", o.highlight, "actions",
                                                           actions ? actions : json_array())) == 0;
        }
        json_decref(global);
    }
    if (ok && json_array_size(notified) > 0)
        ok = keep_notifications(c, notified, room_id, event_id, pos, pruned);
    json_decref(notified);
    push_rules_batch_free(rules);
    PQclear(who);
    json_decref(holder);
    json_decref(pdu);
    return ok;
}

/* Decide the events after the cursor. *more when a full batch was read. false on a
 * database failure (nothing of the batch is kept). */
static bool decide(PGconn *c, bool *more)
{
    *more = false;
    PGresult *res = acc_q(c, "SELECT stream_upto()", 0, NULL);
    if (!res) return false;
    char upto[24];
    snprintf(upto, sizeof(upto), "%s", PQgetvalue(res, 0, 0));
    PQclear(res);
    const char *p0[1] = {upto};
    if (!db_exec(c, "INSERT INTO push_cursor (id, stream_pos) VALUES (1, $1)"
                    " ON CONFLICT (id) DO NOTHING", 1, p0) ||
        !db_begin(c))
        return false;
    char lim[24];
    const char *p[2] = {upto, i64(lim, sizeof(lim), PUSH_SCAN_BATCH)};
    PGresult *ev = acc_q(c,
                         "SELECT e.stream_pos, e.event_id, e.room_id, e.sender, e.pdu"
                         /* The cursor as a scalar subquery: its value bounds the index
                          * scan of events (a join would read every event up to $1 and
                          * filter them, a scan of the whole table on every batch). */
                         " FROM events e WHERE e.stream_pos > (SELECT pc.stream_pos FROM push_cursor pc"
                         "  WHERE pc.id = 1) AND e.stream_pos <= $1"
                         " AND e.redacted_by IS NULL ORDER BY e.stream_pos LIMIT $2::int",
                         2, p);
    bool ok = ev != NULL;
    int n = ev ? PQntuples(ev) : 0;
    int64_t pruned = 0;
    for (int i = 0; ok && i < n; i++) ok = decide_event(c, ev, i, &pruned);
    if (ok && n > 0) {
        /* A full batch ends at its last event; a short one at upto (nothing between). */
        const char *q[1] = {n == PUSH_SCAN_BATCH ? PQgetvalue(ev, n - 1, 0) : upto};
        ok = db_exec(c, "UPDATE push_cursor SET stream_pos = $1 WHERE id = 1", 1, q);
    } else if (ok) {
        ok = db_exec(c, "UPDATE push_cursor SET stream_pos = greatest(stream_pos, $1)"
                        " WHERE id = 1", 1, p0);
    }
    *more = ok && n == PUSH_SCAN_BATCH;
    PQclear(ev);
    ok = ok && db_commit(c);
    if (!ok) db_rollback(c);
    if (ok) rt_metric_add(S.m_pruned, pruned);
    return ok;
}

/* ---- delivering ------------------------------------------------------------------------ */

static void answered(void *arg, const fed_response *res)
{
    push_flight *f = arg;
    /* A 2xx is a delivery even when its body is not the JSON object the spec describes. */
    bool answered_2xx = res->outcome == FED_HTTP_OK || res->outcome == FED_REQ_E_NOT_JSON;
    bool ok = answered_2xx && res->status >= 200 && res->status < 300;
    bool retry = !answered_2xx || res->status >= 500 || res->status == 429;
    bool rejected = false;
    pthread_mutex_lock(&S.mu);
    if (ok && res->json) {
        size_t i;
        json_t *k;
        json_array_foreach(json_object_get(res->json, "rejected"), i, k)
            if (json_is_string(k) && strcmp(json_string_value(k), f->pushkey) == 0)
                rejected = true;
    }
    if (!ok)
        rt_log(ATRIUM_LOG_INFO, "core", "push to a gateway of %s: %s", f->user_id,
               answered_2xx ? "refused" : res->error ? res->error : "failed");
    f->ok = ok;
    f->retry = !ok && retry;
    f->rejected = rejected;
    f->status = res->status;
    f->answered = true;
    S.kicked = true;
    pthread_cond_signal(&S.cv);
    pthread_mutex_unlock(&S.mu);
}

/* Record the answers that came (the database work of the callbacks). false on a database
 * failure (the flight stays answered and is settled next pass). */
static bool settle(PGconn *c)
{
    bool all = true;
    for (int i = 0; i < PUSH_MAX_IN_FLIGHT; i++) {
        push_flight *f = &S.flights[i];
        pthread_mutex_lock(&S.mu);
        bool done = f->busy && f->answered;
        pthread_mutex_unlock(&S.mu);
        if (!done) continue;
        char id[24], next[24];
        i64(id, sizeof(id), f->queue_id);
        bool ok;
        if (f->ok || !f->retry || f->attempts + 1 >= PUSH_MAX_ATTEMPTS) {
            if (!f->ok)
                rt_log(ATRIUM_LOG_WARN, "core", "a push notification for %s (%s) was dropped: "
                       "the gateway answered %d%s", f->user_id, f->app_id, f->status,
                       f->retry ? " after every retry" : "");
            const char *p[1] = {id};
            ok = db_exec(c, "DELETE FROM push_queue WHERE id = $1", 1, p);
            if (ok && f->rejected) {
                const char *q[3] = {f->user_id, f->app_id, f->pushkey};
                rt_log(ATRIUM_LOG_INFO, "core", "the push gateway rejected a pushkey of %s "
                       "(%s): the pusher is removed", f->user_id, f->app_id);
                ok = db_exec(c, "DELETE FROM pushers WHERE user_id = $1 AND app_id = $2"
                                " AND pushkey = $3", 3, q);
            }
        } else {
            int64_t delay = PUSH_RETRY_MIN_MS;
            for (int a = 0; a < f->attempts && delay < PUSH_RETRY_MAX_MS; a++) delay *= 2;
            if (delay > PUSH_RETRY_MAX_MS) delay = PUSH_RETRY_MAX_MS;
            const char *p[2] = {id, i64(next, sizeof(next), rt_wall_ms() + delay)};
            ok = db_exec(c, "UPDATE push_queue SET attempts = attempts + 1, next_try_ts = $2"
                            " WHERE id = $1", 2, p);
        }
        if (!ok) {
            all = false;
            continue;
        }
        pthread_mutex_lock(&S.mu);
        f->busy = f->answered = false;
        flights_changed_locked();
        pthread_mutex_unlock(&S.mu);
    }
    return all;
}

/* The tweaks of a rule's actions ({"set_tweak": k, "value": v}; highlight without a value
 * is true). */
static json_t *tweaks_of(const json_t *actions)
{
    json_t *t = json_object();
    size_t i;
    json_t *a;
    json_array_foreach(actions, i, a) {
        const char *k = json_string_value(json_object_get(a, "set_tweak"));
        if (!k) continue;
        json_t *v = json_object_get(a, "value");
        json_object_set_new(t, k, v ? json_incref(v) : json_true());
    }
    return t;
}

/* The notify body for queue row `row` of res (columns as in deliver's SELECT). */
static json_t *notify_body(PGresult *res, int row, json_t *data)
{
    json_t *actions = json_loads(PQgetvalue(res, row, 8), 0, NULL);
    json_t *dev_data = json_deep_copy(data);
    json_object_del(dev_data, "url");
    json_t *device = json_pack("{s:s, s:s, s:I, s:o, s:o}", "app_id", PQgetvalue(res, row, 3),
                               "pushkey", PQgetvalue(res, row, 4), "pushkey_ts",
                               (json_int_t)(atoll(PQgetvalue(res, row, 5)) / 1000), "data",
                               dev_data ? dev_data : json_object(), "tweaks",
                               tweaks_of(actions));
    json_decref(actions);
    bool highlight = PQgetvalue(res, row, 7)[0] == 't';
    json_t *n = json_pack("{s:s, s:s, s:s, s:{s:I}, s:[o]}", "event_id", PQgetvalue(res, row, 9),
                          "room_id", PQgetvalue(res, row, 10), "prio", highlight ? "high" : "low",
                          "counts", "unread", (json_int_t)atoll(PQgetvalue(res, row, 11)),
                          "devices", device);
    const char *format = json_string_value(json_object_get(data, "format"));
    json_t *pdu = PQgetisnull(res, row, 12) ? NULL : json_loads(PQgetvalue(res, row, 12), 0, NULL);
    if (n && pdu && !(format && strcmp(format, "event_id_only") == 0)) {
        json_t *content = json_object_get(pdu, "content");
        const char *type = json_string_value(json_object_get(pdu, "type"));
        const char *sender = json_string_value(json_object_get(pdu, "sender"));
        if (type) json_object_set_new(n, "type", json_string(type));
        if (sender) json_object_set_new(n, "sender", json_string(sender));
        if (content) json_object_set(n, "content", content);
        if (!PQgetisnull(res, row, 13))
            json_object_set_new(n, "sender_display_name", json_string(PQgetvalue(res, row, 13)));
        if (!PQgetisnull(res, row, 14))
            json_object_set_new(n, "room_name", json_string(PQgetvalue(res, row, 14)));
        const char *sk = json_string_value(json_object_get(pdu, "state_key"));
        if (type && strcmp(type, "m.room.member") == 0 && sk) {
            const char *mship = json_string_value(json_object_get(content, "membership"));
            if (mship) json_object_set_new(n, "membership", json_string(mship));
            json_object_set_new(n, "user_is_target",
                                json_boolean(strcmp(sk, PQgetvalue(res, row, 2)) == 0));
        }
    }
    json_decref(pdu);
    return n ? json_pack("{s:o}", "notification", n) : NULL;
}

/* A free flight slot, or NULL. Is queue_id already in flight (*busy)? */
static push_flight *free_flight(int64_t queue_id, bool *busy)
{
    push_flight *free_slot = NULL;
    *busy = false;
    pthread_mutex_lock(&S.mu);
    for (int i = 0; i < PUSH_MAX_IN_FLIGHT; i++) {
        if (S.flights[i].busy && S.flights[i].queue_id == queue_id) *busy = true;
        if (!S.flights[i].busy && !free_slot) free_slot = &S.flights[i];
    }
    pthread_mutex_unlock(&S.mu);
    return free_slot;
}

/* Send the oldest due row of each pusher not already in flight. Returns the milliseconds
 * until a row waiting for its retry is due (PUSH_POLL_MS when none); -1 on a database
 * failure. */
static int64_t deliver(PGconn *c)
{
    /* Most passes find the queue empty: asking that first costs a fraction of planning the
     * batch's query below (about 5 ms of PostgreSQL's CPU, every PUSH_POLL_MS). */
    PGresult *res = acc_q(c, "SELECT EXISTS (SELECT 1 FROM push_queue)", 0, NULL);
    if (!res) return -1;
    bool queued = PQgetvalue(res, 0, 0)[0] == 't';
    PQclear(res);
    if (!queued) return PUSH_POLL_MS;
    char lim[24];
    const char *p[1] = {i64(lim, sizeof(lim), PUSH_DELIVER_BATCH)};
    res = acc_q(c,
        "SELECT q.id, q.attempts, p.user_id, p.app_id, p.pushkey, p.created_ts, p.data::text,"
        " n.highlight, n.actions::text, n.event_id, n.room_id,"
        " (SELECT count(*) FROM push_notifications u WHERE u.user_id = p.user_id"
        "  AND u.stream_pos > coalesce((SELECT max(x.stream_pos) FROM receipts rc"
        "   JOIN events x ON x.event_id = rc.event_id WHERE rc.room_id = u.room_id"
        "   AND rc.user_id = u.user_id AND rc.receipt_type IN ('m.read', 'm.read.private')), 0)),"
        " e.pdu,"
        " (SELECT sm.pdu::jsonb -> 'content' ->> 'displayname' FROM current_state cs"
        "  JOIN events sm ON sm.event_id = cs.event_id WHERE cs.room_id = n.room_id"
        "  AND cs.type = 'm.room.member' AND cs.state_key = e.sender),"
        " (SELECT rn.pdu::jsonb -> 'content' ->> 'name' FROM current_state cs"
        "  JOIN events rn ON rn.event_id = cs.event_id WHERE cs.room_id = n.room_id"
        "  AND cs.type = 'm.room.name' AND cs.state_key = '' AND rn.redacted_by IS NULL),"
        " q.next_try_ts"
        " FROM push_queue q JOIN pushers p USING (user_id, app_id, pushkey)"
        " JOIN push_notifications n ON n.id = q.notification_id"
        " LEFT JOIN events e ON e.event_id = n.event_id"
        " WHERE q.id = (SELECT min(q2.id) FROM push_queue q2 WHERE q2.user_id = q.user_id"
        "  AND q2.app_id = q.app_id AND q2.pushkey = q.pushkey)"
        " ORDER BY q.next_try_ts, q.id LIMIT $1::int",
        1, p);
    if (!res) return -1;
    int64_t wait = PUSH_POLL_MS, wall = rt_wall_ms();
    for (int i = 0; i < PQntuples(res); i++) {
        int64_t due = atoll(PQgetvalue(res, i, 15));
        if (due > wall) {
            if (due - wall < wait) wait = due - wall;
            continue;
        }
        int64_t qid = atoll(PQgetvalue(res, i, 0));
        bool busy;
        push_flight *f = free_flight(qid, &busy);
        if (busy) continue;
        if (!f) break;
        json_t *data = json_loads(PQgetvalue(res, i, 6), 0, NULL);
        const char *url = json_string_value(json_object_get(data, "url"));
        json_t *body = url ? notify_body(res, i, data) : NULL;
        memset(f, 0, sizeof(*f));
        f->queue_id = qid;
        f->attempts = atoi(PQgetvalue(res, i, 1));
        snprintf(f->user_id, sizeof(f->user_id), "%s", PQgetvalue(res, i, 2));
        snprintf(f->app_id, sizeof(f->app_id), "%s", PQgetvalue(res, i, 3));
        snprintf(f->pushkey, sizeof(f->pushkey), "%s", PQgetvalue(res, i, 4));
        fed_request_opts o = {.method = "POST", .url = url, .url_allow_http = true,
                              .body = body, .want_json = true,
                              .deadline_ms = rt_now_ms() + PUSH_REQUEST_TIMEOUT_MS,
                              .max_body_bytes = PUSH_MAX_ANSWER_BYTES,
                              .on_done = answered, .arg = f};
        pthread_mutex_lock(&S.mu);
        f->busy = true;
        flights_changed_locked();
        pthread_mutex_unlock(&S.mu);
        int rc = body ? fed_request_submit(&o) : ATRIUM_E_INVAL;
        json_decref(body);
        json_decref(data);
        if (rc == ATRIUM_E_INVAL) { /* a URL the outbound client cannot reach: dropped */
            rt_log(ATRIUM_LOG_WARN, "core", "a push notification for %s (%s) was dropped: "
                   "the pusher's URL is not an http(s) URL the server can reach",
                   f->user_id, f->app_id);
            const char *q[1] = {PQgetvalue(res, i, 0)};
            /* Best effort (logged): a row left behind is dropped again on its next try. */
            RT_IGNORE(db_exec(c, "DELETE FROM push_queue WHERE id = $1", 1, q));
        }
        if (rc < 0) {
            pthread_mutex_lock(&S.mu);
            f->busy = false;
            flights_changed_locked();
            pthread_mutex_unlock(&S.mu);
            if (rc != ATRIUM_E_INVAL && wait > PUSH_DB_RETRY_MS) wait = PUSH_DB_RETRY_MS;
        }
    }
    PQclear(res);
    return wait;
}

/* One pass: settle, decide, deliver. The milliseconds until the next. */
static int64_t pass(void)
{
    PGconn *c = db_acquire_background(S.db, PUSH_DB_WAIT_MS);
    if (!c) return PUSH_DB_RETRY_MS;
    if (!lease_held(S.lease)) { /* another process sends: only settle what this one sent */
        bool settled = settle(c);
        db_release(S.db, c);
        return settled ? PUSH_POLL_MS : PUSH_DB_RETRY_MS;
    }
    bool more = false;
    bool ok = settle(c) && decide(c, &more);
    int64_t wait = ok ? deliver(c) : -1;
    db_release(S.db, c);
    if (wait < 0) return PUSH_DB_RETRY_MS;
    return more ? 0 : wait;
}

static void *sender_main(void *arg)
{
    (void)arg;
    int64_t wait = 0; /* started by the rooms module: every table a pass reads exists */
    pthread_mutex_lock(&S.mu);
    while (!S.stopping) {
        if (!S.kicked && wait > 0) rt_scope_wait(&S.cv, &S.mu, rt_now_ms() + wait);
        if (S.stopping) break;
        S.kicked = false;
        pthread_mutex_unlock(&S.mu);
        wait = pass();
        pthread_mutex_lock(&S.mu);
    }
    pthread_mutex_unlock(&S.mu);
    return NULL;
}

/* The lease came to this process (on the lease thread): run a pass at once. */
static void lease_gained(void *arg)
{
    (void)arg;
    push_send_kick();
}

int push_send_start(const push_send_settings *set)
{
    db_pool *db = set->db;
    if (!db) return 0;
    if (set->metrics && !S.m_in_flight) {
        S.m_in_flight = rt_metric_gauge(set->metrics, "atrium_push_in_flight", NULL,
                                        "Pushers with a notify request in flight");
        S.m_in_flight_limit = rt_metric_gauge(set->metrics, "atrium_push_in_flight_limit", NULL,
                                              "Pushers with a request in flight at most");
        S.m_pruned = rt_metric_counter(set->metrics, "atrium_push_notifications_pruned_total",
                                       NULL, "Notifications deleted past "
                                       "push.notifications_per_user_max");
        rt_metric_set(S.m_in_flight_limit, PUSH_MAX_IN_FLIGHT);
    }
    S.keep_per_user = set->notifications_per_user_max > 0 ? set->notifications_per_user_max
                                                          : PUSH_KEEP_PER_USER_DEFAULT;
    if (set->leases && !S.lease) {
        S.lease = lease_create(set->leases, PUSH_LEASE, set->lease_ttl_ms, lease_gained, NULL);
        if (!S.lease) {
            rt_log(ATRIUM_LOG_ERROR, "core", "cannot create the lease %s", PUSH_LEASE);
            return ATRIUM_E_IO;
        }
    }
    pthread_mutex_lock(&S.mu);
    if (!S.inited) {
        rt_cond_init(&S.cv);
        S.inited = true;
    }
    S.db = db;
    S.stopping = false;
    pthread_mutex_unlock(&S.mu);
    if (pthread_create(&S.thread, NULL, sender_main, NULL) != 0) {
        rt_log(ATRIUM_LOG_ERROR, "core", "cannot start the push sender thread");
        return ATRIUM_E_IO;
    }
    S.started = true;
    return 0;
}

void push_send_stop(void)
{
    pthread_mutex_lock(&S.mu);
    S.stopping = true;
    if (S.inited) pthread_cond_signal(&S.cv);
    pthread_mutex_unlock(&S.mu);
    if (S.started) pthread_join(S.thread, NULL);
    S.started = false;
}
