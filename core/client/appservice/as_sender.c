/*
 * core/client/appservice/as_sender.c - pushing events to application services (spec
 * v1.13, "Pushing events": PUT {url}/_matrix/app/v1/transactions/{txnId} with
 * "Authorization: Bearer <hs_token>").
 *
 * The backlog is the event stream itself. Each service has a cursor (appservice_state: the
 * stream position up to which every event was delivered or was of no interest to it) and
 * at most one pending transaction (appservice_txns: its txnId, the events' bodies as sent,
 * and the position it ends at). A pass builds the next transaction from the events after
 * the cursor (up to stream_upto(), so none committed late is skipped): at most
 * AS_TXN_MAX_EVENTS events of interest, in stream order, stored before the first byte is
 * sent. It is then sent, again and again with the same txnId and the same body, until the
 * service answers 2xx; only then, in one database transaction, is the row deleted and the
 * cursor moved to its end. So nothing is lost across a restart or while the service is
 * down, and a service sees each batch in order, one at a time. A failure (no answer within
 * appservice.request_timeout_ms, a refused connection, any non-2xx) is tried again after
 * appservice.retry_min_ms doubled per failure, up to appservice.retry_max_ms; a
 * transaction is never dropped. A new service starts at the stream's end: history is not
 * pushed. Each try's outcome is kept in appservice_state (last_success_ts, or
 * last_failure_ts and last_error: the admin listing's, as_admin.c) and its time in the
 * histogram atrium_appservice_transaction_seconds{service}.
 *
 * Events of interest to a service: sent by one of its users (its sender or its user
 * namespaces), a membership event about one of them, in a room whose ID matches its room
 * namespaces or whose canonical alias (or alt_aliases) matches its alias namespaces, or in
 * a room where one of its users is joined now.
 *
 * Threads: one sender thread ("as-sender") does every database step, holding a pooled
 * connection only for a pass, never while a service is awaited: requests go through the
 * server's one outbound client (fed_request_submit with a URL, as the push sender does,
 * core/client/push/push_send.c), whose callback only records the answer and wakes this
 * thread. The URL is the operator's, so the address blacklist does not apply to it.
 *
 * Several processes on one database: deciding and sending run only in the process holding
 * the lease core.appservice_sender (core/store/lease.h); another process's events reach it
 * through the wake-up notifications (core/client/sync/notifier.c kicks this sender) or at
 * the next AS_POLL_MS pass.
 *
 * Ephemeral events, for a service with receive_ephemeral (or MSC2409's
 * de.sorunome.msc2409.push_ephemeral): receipts and typing take positions from the same
 * stream, so a transaction also carries, as "ephemeral" (and MSC2409's
 * "de.sorunome.msc2409.ephemeral"), an m.receipt EDU for each receipt stored in its range
 * and an m.typing EDU (who types at build time) for each room whose typing changed there,
 * in rooms of interest or from its users, and an m.presence EDU for each user whose
 * presence changed there who is one of its users or joined to a room of interest; and, as
 * MSC2409's "de.sorunome.msc2409.to_device" (the name Synapse sends and the bridge
 * libraries read), each to-device message stored there for a device of one of its users
 * ({type, sender, content, to_user_id, to_device_id}). At most AS_TXN_MAX_EPHEMERAL of
 * each kind; the rest of the range's ephemeral data is dropped (ephemeral data is not worth
 * a backlog).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/accounts/accounts.h"
#include "core/client/appservice/appservice.h"
#include "core/client/presence/presence.h"
#include "core/config/config.h"
#include "core/federation/transport/fed_request.h"
#include "core/rooms/rooms.h"
#include "core/store/lease.h"

#define AS_POLL_MS 2000            /* a pass runs this often even when not kicked */
#define AS_DB_WAIT_MS 5000         /* the sender waits this long for a connection */
#define AS_DB_RETRY_MS 1000        /* a pass that failed on the database runs again */
#define AS_SCAN_BATCH 500          /* events looked at per service per pass */
#define AS_TXN_MAX_EVENTS 100      /* events in one transaction */
#define AS_TXN_MAX_EPHEMERAL 100   /* receipts (and rooms' typing) in one transaction */
#define AS_MAX_ANSWER_BYTES 65536  /* a service's answer */
#define AS_URL_BYTES 1024          /* a transaction's URL */
#define AS_LEASE "core.appservice_sender"

/* A service's request in flight. The sender fills it before submitting; the callback sets
 * answered, ok and status under mu. */
typedef struct as_flight {
    bool busy, answered, ok;
    int status;
    int64_t txn_id;
    int64_t sent_ms, answered_ms; /* monotonic: the latency histogram's observation */
    char error[160];
} as_flight;

/* Per service: its flight and metrics (index = the registry's). */
typedef struct as_slot {
    as_flight flight;
    rt_metric *m_sent, *m_failed, *m_events, *m_backlog, *m_seconds;
} as_slot;

/* The one sender. Static: a callback that comes after stop still has its memory. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool inited, started, stopping, kicked;
    pthread_t thread;
    db_pool *db;
    lease *lease; /* NULL without a lease service: always held */
    int64_t retry_min_ms, retry_max_ms, timeout_ms;
    as_slot *slots;
    size_t n;
    rt_metric *m_in_flight;
} S = {.mu = PTHREAD_MUTEX_INITIALIZER};

void as_sender_kick(void)
{
    pthread_mutex_lock(&S.mu);
    if (S.inited) {
        S.kicked = true;
        pthread_cond_signal(&S.cv);
    }
    pthread_mutex_unlock(&S.mu);
}

bool as_sender_in_flight(size_t i)
{
    pthread_mutex_lock(&S.mu);
    bool busy = S.slots && i < S.n && S.slots[i].flight.busy;
    pthread_mutex_unlock(&S.mu);
    return busy;
}

static const char *i64(char *buf, size_t len, int64_t v)
{
    snprintf(buf, len, "%lld", (long long)v);
    return buf;
}

/* Under S.mu: the in-flight gauge follows the busy flights. */
static void flights_changed_locked(void)
{
    int busy = 0;
    for (size_t i = 0; i < S.n; i++) busy += S.slots[i].flight.busy;
    rt_metric_set(S.m_in_flight, busy);
}

/* ---- which events interest a service ------------------------------------------------- */

/* What a pass learned of one room for one service. */
typedef struct room_memo {
    char *room_id;
    bool interested;
} room_memo;

typedef struct room_memos {
    room_memo *v;
    size_t n, cap;
} room_memos;

static void memos_free(room_memos *m)
{
    for (size_t i = 0; i < m->n; i++) free(m->v[i].room_id);
    free(m->v);
}

/* Does the room interest svc by its ID, its canonical aliases or a joined member? -1 on a
 * database failure. */
static int room_interests(PGconn *c, const as_service *svc, const char *room_id)
{
    if (as_room_in(svc, room_id)) return 1;
    const char *p[1] = {room_id};
    PGresult *res = acc_q(c,
                          "SELECT cs.state_key FROM current_state cs WHERE cs.room_id = $1"
                          " AND cs.type = 'm.room.member' AND cs.membership = 'join'"
                          " UNION ALL SELECT a.alias FROM current_state cs"
                          " JOIN events e ON e.event_id = cs.event_id,"
                          " LATERAL (SELECT e.pdu::jsonb -> 'content' ->> 'alias' AS alias"
                          "  UNION ALL SELECT jsonb_array_elements_text(CASE WHEN"
                          "   jsonb_typeof(e.pdu::jsonb -> 'content' -> 'alt_aliases') = 'array'"
                          "   THEN e.pdu::jsonb -> 'content' -> 'alt_aliases'"
                          "   ELSE '[]'::jsonb END)) a"
                          " WHERE cs.room_id = $1 AND cs.type = 'm.room.canonical_alias'"
                          " AND cs.state_key = '' AND a.alias IS NOT NULL",
                          1, p);
    if (!res) return -1;
    int found = 0;
    for (int i = 0; !found && i < PQntuples(res); i++) {
        const char *v = PQgetvalue(res, i, 0);
        found = v[0] == '#' ? as_alias_in(svc, v) : as_user_in(svc, v);
    }
    PQclear(res);
    return found;
}

/* room_interests, asked once per room per pass. -1 on a database failure. */
static int room_interests_memo(PGconn *c, const as_service *svc, room_memos *m,
                               const char *room_id)
{
    for (size_t i = 0; i < m->n; i++)
        if (strcmp(m->v[i].room_id, room_id) == 0) return m->v[i].interested;
    int yes = room_interests(c, svc, room_id);
    if (yes < 0) return -1;
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 16;
        room_memo *v = realloc(m->v, cap * sizeof(*v));
        if (!v) return yes; /* not remembered: asked again */
        m->v = v;
        m->cap = cap;
    }
    char *id = strdup(room_id);
    if (id) m->v[m->n++] = (room_memo){.room_id = id, .interested = yes};
    return yes;
}

/* Row `row` of the scan (stream_pos, event_id, room_id, type, state_key, sender). */
static int event_interests(PGconn *c, const as_service *svc, room_memos *m, PGresult *ev,
                           int row)
{
    const char *type = PQgetvalue(ev, row, 3);
    if (as_user_in(svc, PQgetvalue(ev, row, 5))) return 1;
    if (strcmp(type, "m.room.member") == 0 && !PQgetisnull(ev, row, 4) &&
        as_user_in(svc, PQgetvalue(ev, row, 4)))
        return 1;
    return room_interests_memo(c, svc, m, PQgetvalue(ev, row, 2));
}

/* ---- building a transaction ----------------------------------------------------------- */

/* The client format of the events named in ids (a JSON array), in stream order, as the
 * service's sender reads them. NULL on a database failure. */
static json_t *render_events(PGconn *c, const as_service *svc, json_t *ids)
{
    char *text = json_dumps(ids, JSON_COMPACT);
    if (!text) return NULL;
    events_view v = {.user_id = svc->sender, .with_room_id = true, .now_ms = rooms_wall_ms(),
                     .reader_joined = true};
    const char *p[1] = {text};
    json_t *out = json_array();
    int n = events_fetch(c, &v,
                         EVENTS_SELECT " WHERE e.event_id IN"
                         " (SELECT jsonb_array_elements_text($1::jsonb)) ORDER BY e.stream_pos",
                         1, p, out, NULL, NULL);
    free(text);
    if (n < 0) {
        json_decref(out);
        return NULL;
    }
    return out;
}

/* Store the transaction of `events`, `ephemeral` and `to_device` (either NULL: none; ending
 * at upto) as svc's pending one, with the next
 * txnId, in one database transaction. false on a database failure. */
static bool store_txn(PGconn *c, const as_service *svc, json_t *events, json_t *ephemeral,
                      json_t *to_device, const char *upto)
{
    json_t *body = json_pack("{s:o}", "events", events);
    if (body && ephemeral) { /* the stable name, and MSC2409's that bridges still read */
        json_object_set(body, "ephemeral", ephemeral);
        json_object_set(body, "de.sorunome.msc2409.ephemeral", ephemeral);
    }
    if (body && to_device) json_object_set(body, "de.sorunome.msc2409.to_device", to_device);
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (!text) return false;
    char n[24];
    const char *p[4] = {svc->id, upto, text, i64(n, sizeof(n), (int64_t)json_array_size(events))};
    bool ok = db_begin(c) &&
              db_exec(c, "INSERT INTO appservice_txns (as_id, txn_id, upto_pos, body, n_events)"
                         " SELECT as_id, next_txn_id, $2::bigint, $3, $4::int FROM appservice_state"
                         " WHERE as_id = $1", 4, p) &&
              db_exec(c, "UPDATE appservice_state SET next_txn_id = next_txn_id + 1"
                         " WHERE as_id = $1", 1, p) &&
              db_commit(c);
    if (!ok) db_rollback(c);
    free(text);
    return ok;
}

/* The m.receipt EDUs of receipts stored in (after, upto] in rooms of interest, appended to
 * out (one EDU per receipt). false on a database failure. */
static bool receipts_between(PGconn *c, const as_service *svc, room_memos *m,
                             const char *after, const char *upto, json_t *out)
{
    char lim[24];
    const char *p[3] = {after, upto, i64(lim, sizeof(lim), AS_TXN_MAX_EPHEMERAL)};
    PGresult *res = acc_q(c, "SELECT room_id, user_id, receipt_type, thread_id, event_id, ts"
                             " FROM receipts WHERE stream_pos > $1 AND stream_pos <= $2"
                             " ORDER BY stream_pos LIMIT $3::int", 3, p);
    if (!res) return false;
    bool ok = true;
    for (int i = 0; ok && i < PQntuples(res); i++) {
        const char *room = PQgetvalue(res, i, 0), *thread = PQgetvalue(res, i, 3);
        int yes = as_user_in(svc, PQgetvalue(res, i, 1)) ? 1 : room_interests_memo(c, svc, m, room);
        if (yes < 0) ok = false;
        if (yes <= 0) continue;
        json_t *who = json_pack("{s:I}", "ts", (json_int_t)atoll(PQgetvalue(res, i, 5)));
        if (who && thread[0]) json_object_set_new(who, "thread_id", json_string(thread));
        json_t *edu = json_pack("{s:s, s:s, s:{s:{s:{s:o}}}}", "type", "m.receipt", "room_id",
                                room, "content", PQgetvalue(res, i, 4), PQgetvalue(res, i, 2),
                                PQgetvalue(res, i, 1), who);
        if (edu) json_array_append_new(out, edu);
    }
    PQclear(res);
    return ok;
}

/* An m.typing EDU (who types now) for each room of interest whose typing changed in
 * (after, upto], appended to out. false on a database failure. */
static bool typing_between(PGconn *c, const as_service *svc, room_memos *m, const char *after,
                           const char *upto, json_t *out)
{
    char lim[24], now[24];
    const char *p[4] = {after, upto, i64(lim, sizeof(lim), AS_TXN_MAX_EPHEMERAL),
                        i64(now, sizeof(now), rt_wall_ms())};
    PGresult *res = acc_q(c, "SELECT r.room_id, coalesce((SELECT json_agg(t.user_id ORDER BY"
                             " t.user_id) FROM typing t WHERE t.room_id = r.room_id"
                             " AND t.expires_ts > $4::bigint), '[]')::text FROM (SELECT DISTINCT"
                             " room_id FROM typing WHERE stream_pos > $1 AND stream_pos <= $2"
                             " LIMIT $3::int) r", 4, p);
    if (!res) return false;
    bool ok = true;
    for (int i = 0; ok && i < PQntuples(res); i++) {
        int yes = room_interests_memo(c, svc, m, PQgetvalue(res, i, 0));
        if (yes < 0) ok = false;
        if (yes <= 0) continue;
        json_t *ids = json_loads(PQgetvalue(res, i, 1), 0, NULL);
        json_t *edu = json_pack("{s:s, s:s, s:{s:o}}", "type", "m.typing", "room_id",
                                PQgetvalue(res, i, 0), "content", "user_ids",
                                ids ? ids : json_array());
        if (edu) json_array_append_new(out, edu);
    }
    PQclear(res);
    return ok;
}

/* An m.presence EDU for each user whose presence changed in (after, upto] who is one of
 * svc's users or is joined to a room of interest, appended to out. false on a database
 * failure. */
static bool presence_between(PGconn *c, const as_service *svc, room_memos *m,
                             const char *after, const char *upto, json_t *out)
{
    char lim[24];
    const char *p[3] = {after, upto, i64(lim, sizeof(lim), AS_TXN_MAX_EPHEMERAL)};
    PGresult *res = acc_q(c, "SELECT p.user_id, p.state, p.status_msg, p.last_active_ts,"
                             " coalesce((SELECT json_agg(cs.room_id) FROM current_state cs"
                             "  WHERE cs.type = 'm.room.member' AND cs.state_key = p.user_id"
                             "  AND cs.membership = 'join'), '[]')::text FROM presence p"
                             " WHERE p.stream_pos > $1 AND p.stream_pos <= $2"
                             " ORDER BY p.stream_pos LIMIT $3::int", 3, p);
    if (!res) return false;
    bool ok = true;
    int64_t now = rt_wall_ms();
    for (int i = 0; ok && i < PQntuples(res); i++) {
        const char *user = PQgetvalue(res, i, 0);
        int yes = as_user_in(svc, user);
        json_t *rooms = yes ? NULL : json_loads(PQgetvalue(res, i, 4), 0, NULL);
        for (size_t j = 0; yes == 0 && j < json_array_size(rooms); j++)
            yes = room_interests_memo(c, svc, m, json_string_value(json_array_get(rooms, j)));
        json_decref(rooms);
        if (yes < 0) ok = false;
        if (yes <= 0) continue;
        json_t *content = presence_content(PQgetvalue(res, i, 1),
                                           PQgetisnull(res, i, 2) ? NULL : PQgetvalue(res, i, 2),
                                           atoll(PQgetvalue(res, i, 3)), now);
        if (content) json_object_set_new(content, "user_id", json_string(user));
        json_t *edu = content ? json_pack("{s:s, s:s, s:o}", "type", "m.presence", "sender", user,
                                          "content", content)
                              : NULL;
        if (edu) json_array_append_new(out, edu);
    }
    PQclear(res);
    return ok;
}

/* The to-device messages stored in (after, upto] for the devices of svc's users, appended
 * to out as MSC2409 sends them ({type, sender, content, to_user_id, to_device_id}). false
 * on a database failure. */
static bool to_device_between(PGconn *c, const as_service *svc, const char *after,
                              const char *upto, json_t *out)
{
    char lim[24];
    const char *p[3] = {after, upto, i64(lim, sizeof(lim), AS_TXN_MAX_EPHEMERAL)};
    PGresult *res = acc_q(c, "SELECT user_id, device_id, sender, event_type, content"
                             " FROM to_device_messages WHERE stream_pos > $1"
                             " AND stream_pos <= $2 ORDER BY stream_pos LIMIT $3::int", 3, p);
    if (!res) return false;
    for (int i = 0; i < PQntuples(res); i++) {
        if (!as_user_in(svc, PQgetvalue(res, i, 0))) continue;
        json_t *content = json_loads(PQgetvalue(res, i, 4), 0, NULL);
        json_t *msg = json_pack("{s:s, s:s, s:o, s:s, s:s}", "type", PQgetvalue(res, i, 3),
                                "sender", PQgetvalue(res, i, 2), "content",
                                content ? content : json_object(), "to_user_id",
                                PQgetvalue(res, i, 0), "to_device_id", PQgetvalue(res, i, 1));
        if (msg) json_array_append_new(out, msg);
    }
    PQclear(res);
    return true;
}

/* The cursor of svc (made at the stream's end if missing), and the newest safe position.
 * false on a database failure. */
static bool cursor_of(PGconn *c, const as_service *svc, char *cursor, char *upto, size_t len)
{
    PGresult *res = acc_q(c, "SELECT stream_upto()", 0, NULL);
    if (!res) return false;
    snprintf(upto, len, "%s", PQgetvalue(res, 0, 0));
    PQclear(res);
    const char *p[2] = {svc->id, upto};
    if (!db_exec(c, "INSERT INTO appservice_state (as_id, stream_pos) VALUES ($1, $2)"
                    " ON CONFLICT (as_id) DO NOTHING", 2, p))
        return false;
    res = acc_q(c, "SELECT stream_pos FROM appservice_state WHERE as_id = $1", 1, p);
    if (!res) return false;
    bool ok = PQntuples(res) == 1;
    if (ok) snprintf(cursor, len, "%s", PQgetvalue(res, 0, 0));
    PQclear(res);
    return ok;
}

/* Look at the events after svc's cursor: store the next transaction when some interest it,
 * else move the cursor past them. *more: there are more events to look at now. false on a
 * database failure. */
static bool build(PGconn *c, size_t idx, const as_service *svc, bool *more)
{
    char cursor[24], upto[24], lim[24];
    *more = false;
    if (!cursor_of(c, svc, cursor, upto, sizeof(cursor))) return false;
    rt_metric_set(S.slots[idx].m_backlog, atoll(upto) - atoll(cursor));
    const char *p[3] = {cursor, upto, i64(lim, sizeof(lim), AS_SCAN_BATCH)};
    PGresult *ev = acc_q(c,
                         "SELECT stream_pos, event_id, room_id, type, state_key, sender"
                         " FROM events WHERE stream_pos > $1 AND stream_pos <= $2"
                         " ORDER BY stream_pos LIMIT $3::int",
                         3, p);
    if (!ev) return false;
    int n = PQntuples(ev);
    room_memos memos = {0};
    json_t *ids = json_array();
    const char *end = n == AS_SCAN_BATCH ? PQgetvalue(ev, n - 1, 0) : upto;
    bool ok = ids != NULL;
    for (int i = 0; ok && i < n; i++) {
        int yes = event_interests(c, svc, &memos, ev, i);
        if (yes < 0) ok = false;
        else if (yes) json_array_append_new(ids, json_string(PQgetvalue(ev, i, 1)));
        if (json_array_size(ids) == AS_TXN_MAX_EVENTS) {
            end = PQgetvalue(ev, i, 0);
            break;
        }
    }
    json_t *eph = ok && svc->receive_ephemeral ? json_array() : NULL;
    json_t *tod = eph ? json_array() : NULL;
    if (eph)
        ok = tod && receipts_between(c, svc, &memos, cursor, end, eph) &&
             typing_between(c, svc, &memos, cursor, end, eph) &&
             presence_between(c, svc, &memos, cursor, end, eph) &&
             to_device_between(c, svc, cursor, end, tod);
    memos_free(&memos);
    if (ok && (json_array_size(ids) > 0 || json_array_size(eph) > 0 ||
               json_array_size(tod) > 0)) {
        json_t *events = json_array_size(ids) ? render_events(c, svc, ids) : json_array();
        ok = events && store_txn(c, svc, events, json_array_size(eph) ? eph : NULL,
                                 json_array_size(tod) ? tod : NULL, end);
    } else if (ok) {
        const char *q[2] = {svc->id, end};
        ok = db_exec(c, "UPDATE appservice_state SET stream_pos = greatest(stream_pos,"
                        " $2::bigint) WHERE as_id = $1", 2, q);
        *more = ok && n == AS_SCAN_BATCH;
    }
    json_decref(ids);
    json_decref(eph);
    json_decref(tod);
    PQclear(ev);
    return ok;
}

/* ---- sending ---------------------------------------------------------------------------- */

static void answered(void *arg, const fed_response *res)
{
    as_flight *f = arg;
    bool got = res->outcome == FED_HTTP_OK || res->outcome == FED_REQ_E_NOT_JSON;
    pthread_mutex_lock(&S.mu);
    f->ok = got && res->status >= 200 && res->status < 300;
    f->status = got ? res->status : 0;
    snprintf(f->error, sizeof(f->error), "%s", got ? "" : res->error ? res->error : "failed");
    f->answered_ms = rt_now_ms();
    f->answered = true;
    S.kicked = true;
    pthread_cond_signal(&S.cv);
    pthread_mutex_unlock(&S.mu);
}

/* The wait before try number attempts + 1 of a transaction. */
static int64_t retry_delay_ms(int attempts)
{
    int64_t delay = S.retry_min_ms;
    for (int a = 0; a < attempts && delay < S.retry_max_ms; a++) delay *= 2;
    return delay > S.retry_max_ms ? S.retry_max_ms : delay;
}

/* Record one service's answer: delivered (the transaction goes, the cursor moves past it)
 * or not (tried again later). false on a database failure (settled next pass). */
static bool settle_one(PGconn *c, size_t idx)
{
    as_slot *slot = &S.slots[idx];
    as_flight *f = &slot->flight;
    const as_service *svc = as_at(idx);
    char txn[24], next[24], now[24];
    const char *p[3] = {svc->id, i64(txn, sizeof(txn), f->txn_id), NULL};
    const char *t[3] = {svc->id, i64(now, sizeof(now), rt_wall_ms()), f->error};
    bool ok;
    if (f->ok) {
        PGresult *res = NULL;
        ok = db_begin(c) &&
             (res = acc_q(c, "DELETE FROM appservice_txns WHERE as_id = $1 AND txn_id = $2"
                             " RETURNING upto_pos, n_events", 2, p)) != NULL;
        if (ok && PQntuples(res) == 1) {
            const char *q[2] = {svc->id, PQgetvalue(res, 0, 0)};
            ok = db_exec(c, "UPDATE appservice_state SET stream_pos = greatest(stream_pos,"
                            " $2::bigint) WHERE as_id = $1", 2, q);
            if (ok) rt_metric_add(slot->m_events, atoll(PQgetvalue(res, 0, 1)));
        }
        PQclear(res);
        ok = ok && db_exec(c, "UPDATE appservice_state SET last_success_ts = $2::bigint"
                              " WHERE as_id = $1", 2, t) &&
             db_commit(c);
        if (!ok) db_rollback(c);
        if (ok) rt_metric_add(slot->m_sent, 1);
    } else {
        rt_log(ATRIUM_LOG_INFO, "core", "application service %s did not take transaction "
               "%lld: %s%s", svc->id, (long long)f->txn_id, f->error[0] ? f->error : "answered ",
               f->error[0] ? "" : i64(next, sizeof(next), f->status));
        if (!f->error[0]) snprintf(f->error, sizeof(f->error), "answered %d", f->status);
        PGresult *res = db_exec(c, "UPDATE appservice_state SET last_failure_ts = $2::bigint,"
                                   " last_error = $3 WHERE as_id = $1", 3, t)
                            ? acc_q(c, "SELECT attempts FROM appservice_txns WHERE as_id = $1"
                                       " AND txn_id = $2::bigint", 2, p)
                            : NULL;
        ok = res != NULL;
        if (ok && PQntuples(res) == 1) {
            int64_t due = rt_wall_ms() + retry_delay_ms(atoi(PQgetvalue(res, 0, 0)));
            p[2] = i64(next, sizeof(next), due);
            ok = db_exec(c, "UPDATE appservice_txns SET attempts = attempts + 1,"
                            " next_try_ts = $3 WHERE as_id = $1 AND txn_id = $2", 3, p);
        }
        PQclear(res);
        if (ok) rt_metric_add(slot->m_failed, 1);
    }
    return ok;
}

/* Settle every answered flight. false when one could not be recorded. */
static bool settle(PGconn *c)
{
    bool all = true;
    for (size_t i = 0; i < S.n; i++) {
        as_flight *f = &S.slots[i].flight;
        pthread_mutex_lock(&S.mu);
        bool done = f->busy && f->answered;
        pthread_mutex_unlock(&S.mu);
        if (!done) continue;
        if (!settle_one(c, i)) {
            all = false;
            continue;
        }
        rt_metric_observe(S.slots[i].m_seconds, (double)(f->answered_ms - f->sent_ms) / 1000.0);
        pthread_mutex_lock(&S.mu);
        f->busy = f->answered = false;
        flights_changed_locked();
        pthread_mutex_unlock(&S.mu);
    }
    return all;
}

/* Submit svc's pending transaction (txn_id, body text). false when the outbound client
 * refused it (tried again next pass). */
static bool submit(size_t idx, const as_service *svc, int64_t txn_id, const char *text)
{
    as_flight *f = &S.slots[idx].flight;
    char url[AS_URL_BYTES], auth[512];
    size_t ulen = strlen(svc->url);
    while (ulen > 0 && svc->url[ulen - 1] == '/') ulen--;
    int n = snprintf(url, sizeof(url), "%.*s/_matrix/app/v1/transactions/%lld", (int)ulen,
                     svc->url, (long long)txn_id);
    int m = snprintf(auth, sizeof(auth), "Authorization: Bearer %s", svc->hs_token);
    json_t *body = json_loads(text, 0, NULL);
    if (n < 0 || (size_t)n >= sizeof(url) || m < 0 || (size_t)m >= sizeof(auth) || !body) {
        json_decref(body);
        rt_log(ATRIUM_LOG_ERROR, "core", "application service %s: its url or hs_token is too "
               "long, or its transaction %lld cannot be read", svc->id, (long long)txn_id);
        return false;
    }
    pthread_mutex_lock(&S.mu);
    memset(f, 0, sizeof(*f));
    f->busy = true;
    f->txn_id = txn_id;
    f->sent_ms = rt_now_ms();
    flights_changed_locked();
    pthread_mutex_unlock(&S.mu);
    fed_request_opts o = {.method = "PUT", .url = url, .url_allow_http = true,
                          .url_header = auth, .operator_destination = true, .body = body,
                          .deadline_ms = rt_now_ms() + S.timeout_ms,
                          .max_body_bytes = AS_MAX_ANSWER_BYTES, .on_done = answered, .arg = f};
    int rc = fed_request_submit(&o);
    json_decref(body);
    if (rc < 0) {
        pthread_mutex_lock(&S.mu);
        f->busy = false;
        flights_changed_locked();
        pthread_mutex_unlock(&S.mu);
        return false;
    }
    return true;
}

/* One service's turn: build its next transaction if none is pending, send it when due.
 * The milliseconds until it needs a pass again, or -1 on a database failure. */
static int64_t serve(PGconn *c, size_t idx)
{
    const as_service *svc = as_at(idx);
    pthread_mutex_lock(&S.mu);
    bool busy = S.slots[idx].flight.busy;
    pthread_mutex_unlock(&S.mu);
    if (busy) return AS_POLL_MS; /* its answer kicks the sender */
    const char *p[1] = {svc->id};
    for (int round = 0; round < 2; round++) {
        PGresult *res = acc_q(c, "SELECT t.txn_id, t.body, t.next_try_ts,"
                                 " (SELECT last_value FROM stream_seq) - s.stream_pos"
                                 " FROM appservice_txns t JOIN appservice_state s USING (as_id)"
                                 " WHERE t.as_id = $1", 1, p);
        if (!res) return -1;
        if (PQntuples(res) == 1) {
            rt_metric_set(S.slots[idx].m_backlog, atoll(PQgetvalue(res, 0, 3)));
            int64_t due = atoll(PQgetvalue(res, 0, 2)) - rt_wall_ms();
            bool sent = due <= 0 && submit(idx, svc, atoll(PQgetvalue(res, 0, 0)),
                                           PQgetvalue(res, 0, 1));
            PQclear(res);
            if (due > 0) return due < AS_POLL_MS ? due : AS_POLL_MS;
            return sent ? AS_POLL_MS : AS_DB_RETRY_MS;
        }
        PQclear(res);
        if (round > 0) break;
        bool more;
        if (!build(c, idx, svc, &more)) return -1;
        if (more) return 0;
    }
    return AS_POLL_MS;
}

/* One pass over every service with a url. The milliseconds until the next. */
static int64_t pass(void)
{
    PGconn *c = db_acquire_background(S.db, AS_DB_WAIT_MS);
    if (!c) return AS_DB_RETRY_MS;
    bool settled = settle(c);
    int64_t wait = settled ? AS_POLL_MS : AS_DB_RETRY_MS;
    for (size_t i = 0; lease_held(S.lease) && i < S.n; i++) {
        if (!as_at(i)->url) continue;
        int64_t w = serve(c, i);
        if (w < 0) w = AS_DB_RETRY_MS;
        if (w < wait) wait = w;
    }
    db_release(S.db, c);
    return wait;
}

static void *sender_main(void *arg)
{
    (void)arg;
    int64_t wait = 0;
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
    as_sender_kick();
}

/* A metric of service svc: name{service="<id>"[,outcome="<outcome>"]}. */
static rt_metric *service_metric(rt_metrics *reg, bool counter, const char *name,
                                 const as_service *svc, const char *outcome, const char *help)
{
    char labels[RT_METRIC_LABELS_MAX_BYTES], out[64] = "";
    if (rt_metric_label(labels, sizeof(labels) - sizeof(out), "service", svc->id) < 0)
        return NULL;
    if (outcome) {
        rt_metric_label(out + 1, sizeof(out) - 1, "outcome", outcome);
        out[0] = ',';
        strcat(labels, out);
    }
    return counter ? rt_metric_counter(reg, name, labels, help)
                   : rt_metric_gauge(reg, name, labels, help);
}

/* The transaction latency histogram's buckets, seconds (request_timeout_ms is 30 s by
 * default: the last bucket). */
static const double LATENCY_BUCKETS[] = {0.005, 0.02, 0.1, 0.5, 2, 10, 30};
#define N_LATENCY_BUCKETS (sizeof(LATENCY_BUCKETS) / sizeof(LATENCY_BUCKETS[0]))

static void register_metrics(rt_metrics *reg)
{
    S.m_in_flight = rt_metric_gauge(reg, "atrium_appservice_in_flight", NULL,
                                    "Application services with a transaction in flight");
    for (size_t i = 0; i < S.n; i++) {
        const as_service *svc = as_at(i);
        as_slot *s = &S.slots[i];
        const char *txns = "Transactions sent to an application service, by outcome";
        s->m_sent = service_metric(reg, true, "atrium_appservice_transactions_total", svc,
                                   "sent", txns);
        s->m_failed = service_metric(reg, true, "atrium_appservice_transactions_total", svc,
                                     "failed", txns);
        s->m_events = service_metric(reg, true, "atrium_appservice_events_sent_total", svc,
                                     NULL, "Events an application service took");
        s->m_backlog = service_metric(reg, false, "atrium_appservice_backlog", svc, NULL,
                                      "Stream positions past the service's cursor (events "
                                      "not yet delivered or looked at)");
        char labels[RT_METRIC_LABELS_MAX_BYTES];
        if (rt_metric_label(labels, sizeof(labels), "service", svc->id) >= 0)
            s->m_seconds = rt_metric_histogram(reg, "atrium_appservice_transaction_seconds",
                                               labels, "Time from sending a transaction to "
                                               "the service's answer or the failure",
                                               LATENCY_BUCKETS, N_LATENCY_BUCKETS);
    }
}

int as_sender_start(core_runtime *rt)
{
    bool any = false;
    for (size_t i = 0; i < as_count(); i++) any = any || as_at(i)->url;
    if (!rt->db || !any) return 0;
    S.n = as_count();
    S.slots = calloc(S.n, sizeof(*S.slots));
    if (!S.slots) return ATRIUM_E_IO;
    S.retry_min_ms = rt->cfg->appservice.retry_min_ms;
    S.retry_max_ms = rt->cfg->appservice.retry_max_ms;
    S.timeout_ms = rt->cfg->appservice.request_timeout_ms;
    if (S.retry_max_ms < S.retry_min_ms) S.retry_max_ms = S.retry_min_ms;
    if (rt->metrics) register_metrics(rt->metrics);
    if (rt->leases && !S.lease) {
        S.lease = lease_create(rt->leases, AS_LEASE, rt->cfg->lease_ttl_ms, lease_gained, NULL);
        if (!S.lease) {
            rt_log(ATRIUM_LOG_ERROR, "core", "cannot create the lease %s", AS_LEASE);
            return ATRIUM_E_IO;
        }
    }
    pthread_mutex_lock(&S.mu);
    if (!S.inited) {
        rt_cond_init(&S.cv);
        S.inited = true;
    }
    S.db = rt->db;
    S.stopping = false;
    pthread_mutex_unlock(&S.mu);
    if (pthread_create(&S.thread, NULL, sender_main, NULL) != 0) {
        rt_log(ATRIUM_LOG_ERROR, "core", "cannot start the application service sender thread");
        return ATRIUM_E_IO;
    }
    S.started = true;
    return 0;
}

void as_sender_stop(void)
{
    pthread_mutex_lock(&S.mu);
    S.stopping = true;
    if (S.inited) pthread_cond_signal(&S.cv);
    pthread_mutex_unlock(&S.mu);
    if (S.started) pthread_join(S.thread, NULL);
    S.started = false;
    /* S.slots stays: a callback of a request still in flight writes into it. */
}
