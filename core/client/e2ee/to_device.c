/*
 * core/client/e2ee/to_device.c - to-device messages: PUT /sendToDevice/{eventType}/{txnId} and
 * the to_device section of /sync.
 *
 * A message is stored once per recipient device with a stream position (stream_next()),
 * and the recipient's parked syncs are woken after commit. Sending is idempotent per (sender
 * device, event type, txnId): the transaction row is inserted first, in the same database
 * transaction as the messages, so a retry (even a concurrent one) stores nothing twice.
 *
 * Owns the delivery rule (deliver_to_device): a sync hands out the device's pending
 * messages up to its `upto`, oldest first, at most TO_DEVICE_SYNC_LIMIT, and marks each
 * with that response's position (delivered_upto). A message is deleted only when the
 * device syncs with a since token at or past the position of a response that carried it:
 * the client has acknowledged it. So a lost response is delivered again, a message whose
 * position was taken before a concurrent sync read the stream is not skipped, and a backlog
 * larger than one response drains over the following syncs. Messages for users on other
 * servers go out as one m.direct_to_device EDU per server, queued in the same transaction;
 * those other servers send us are stored by e2ee_federation.c through to_device_store.
 * Messages for unknown devices are dropped, as the spec allows.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/auth/auth.h"
#include "core/client/client.h"
#include "core/client/e2ee/e2ee.h"
#include "core/client/sync/notifier.h"
#include "core/client/sync/sync.h"
#include "core/federation/transport/fed_txn.h"

#define TO_DEVICE_MAX_MESSAGES 10000 /* (user, device) entries per sendToDevice request */
#define TO_DEVICE_SYNC_LIMIT 100     /* messages per sync response */
/* How long a sender device's txnId is remembered: retries come within minutes. Older ones
 * are pruned when that device sends again, so the table stays bounded per device. */
#define TO_DEVICE_TXN_RETENTION_MS (24 * 60 * 60 * 1000)

static bool is_content(const json_t *v)
{
    return json_is_object(v);
}

bool to_device_store(PGconn *c, const char *sender, const char *type, const char *user,
                     const json_t *devices, json_t *woken)
{
    char *text = json_dumps(devices, JSON_COMPACT);
    if (!text) return false;
    const char *p[4] = {user, sender, type, text};
    PGresult *res = e2ee_sql(
        c, PGRES_COMMAND_OK,
        "INSERT INTO to_device_messages (user_id, device_id, stream_pos, sender, event_type,"
        " content)"
        " SELECT d.user_id, d.device_id, stream_next(), $2, $3, m.value::text"
        " FROM json_each($4::json) m"
        " JOIN devices d ON d.user_id = $1 AND (d.device_id = m.key OR m.key = '*')",
        4, p);
    free(text);
    if (!res) return false;
    if (atoll(PQcmdTuples(res)) > 0) json_object_set_new(woken, user, json_true());
    PQclear(res);
    return true;
}

static bool store_messages_local(PGconn *c, atrium_req *r, const char *type, const char *user,
                                 const json_t *devices, json_t *woken)
{
    return to_device_store(c, r->user, type, user, devices, woken);
}

/* PUT /_matrix/client/v3/sendToDevice/{eventType}/{txnId} */
static int put_send_to_device(atrium_req *r)
{
    if (!auth_request(r)) return ATRIUM_DONE;
    const char *type = http_req_param(r, "eventType"), *txn = http_req_param(r, "txnId");
    if (!type || !e2ee_id_ok(type))
        return http_respond_error(r, 400, "M_INVALID_PARAM", "The event type is empty or too long");
    if (!txn || !e2ee_id_ok(txn))
        return http_respond_error(r, 400, "M_INVALID_PARAM",
                                  "The transaction ID is empty or too long");
    json_t *body = http_req_json(r);
    if (!body) return ATRIUM_DONE;
    const json_t *messages = json_object_get(body, "messages");
    const char *msg = e2ee_check_device_map(messages, "messages", TO_DEVICE_MAX_MESSAGES,
                                            is_content, "a content object");
    if (msg) return http_respond_error(r, 400, "M_BAD_JSON", "%s", msg);

    PGconn *c = e2ee_db_begin(r);
    if (!c) return ATRIUM_DONE;
    char retention[24];
    snprintf(retention, sizeof(retention), "%d", TO_DEVICE_TXN_RETENTION_MS);
    const char *p[4] = {r->user, r->device, retention, NULL};
    bool ok = db_exec(c,
                      "DELETE FROM to_device_txns WHERE user_id = $1 AND device_id = $2"
                      " AND created_ts < (extract(epoch from now()) * 1000)::bigint"
                      "  - $3::bigint",
                      3, p);
    bool first = false;
    if (ok) {
        p[2] = type;
        p[3] = txn;
        PGresult *res = e2ee_sql(c, PGRES_COMMAND_OK,
                                 "INSERT INTO to_device_txns (user_id, device_id, event_type,"
                                 " txn_id, created_ts) VALUES ($1, $2, $3, $4,"
                                 " (extract(epoch from now()) * 1000)::bigint)"
                                 " ON CONFLICT DO NOTHING",
                                 4, p);
        ok = res != NULL;
        first = ok && atoll(PQcmdTuples(res)) == 1; /* else: a retry, already stored */
        PQclear(res);
    }
    json_t *woken = json_object(), *remote = json_object();
    const char *user;
    json_t *devices;
    if (first) {
        json_object_foreach((json_t *)messages, user, devices) {
            if (!e2ee_user_is_local(r, user)) {
                const char *server = e2ee_user_domain(user);
                if (!*server) continue;
                json_t *m = json_object_get(remote, server);
                if (!m) json_object_set_new(remote, server, m = json_object());
                json_object_set(m, user, devices);
                continue;
            }
            ok = store_messages_local(c, r, type, user, devices, woken);
            if (!ok) break;
        }
    }
    /* Users of other servers: one m.direct_to_device EDU per server, queued in this
     * transaction (the outbound queue delivers it, core/federation/transport/fed_txn.h). */
    const char *server;
    json_t *m;
    json_object_foreach(remote, server, m) {
        if (!ok) break;
        const char *message_id = rt_arena_printf(r->arena, "%s/%s/%s", r->device, type, txn);
        json_t *edu = json_pack("{s:s,s:s,s:s,s:O}", "sender", r->user, "type", type,
                                "message_id", message_id, "messages", m);
        ok = edu && fed_outbound_enqueue_edu(c, server, "m.direct_to_device", edu) == 0;
        json_decref(edu);
    }
    bool queued = json_object_size(remote) > 0;
    json_decref(remote);
    if (!ok || !db_commit(c)) {
        e2ee_db_failed(r, c, true);
    } else {
        json_t *unused;
        json_object_foreach(woken, user, unused) notifier_wake_user(user);
        if (queued) fed_outbound_kick();
        http_respond_json(r, 200, json_object());
    }
    json_decref(woken);
    http_db_checkin(c);
    return ATRIUM_DONE;
}

/* The delivery rule (see the file comment): acknowledge what `since` covers, then hand out
 * and mark the next batch. The messages as sync events, or NULL on a DB failure. */
static json_t *deliver_to_device(PGconn *c, const char *user, const char *device, int64_t since,
                                 int64_t upto)
{
    char since_s[24], upto_s[24], limit_s[24];
    snprintf(since_s, sizeof(since_s), "%lld", (long long)since);
    snprintf(upto_s, sizeof(upto_s), "%lld", (long long)upto);
    snprintf(limit_s, sizeof(limit_s), "%d", TO_DEVICE_SYNC_LIMIT);
    /* One statement: the rows `since` acknowledges are deleted (not on an initial sync) and
     * the batch is taken from the others (a statement's parts share one snapshot, so the
     * batch names the deleted rows' complement itself). */
    const char *p[5] = {user, device, limit_s, upto_s, since_s};
    PGresult *res = e2ee_sql(c, PGRES_TUPLES_OK,
                             "WITH acked AS (DELETE FROM to_device_messages"
                             "  WHERE user_id = $1 AND device_id = $2 AND $5::bigint > 0"
                             "  AND delivered_upto <= $5::bigint),"
                             " batch AS (SELECT stream_pos FROM to_device_messages"
                             "  WHERE user_id = $1 AND device_id = $2"
                             "  AND stream_pos <= $4::bigint"
                             "  AND ($5::bigint = 0 OR coalesce(delivered_upto > $5::bigint, true))"
                             "  ORDER BY stream_pos LIMIT $3::int),"
                             " marked AS (UPDATE to_device_messages m"
                             "  SET delivered_upto = $4::bigint"
                             "  FROM batch WHERE m.user_id = $1 AND m.device_id = $2"
                             "  AND m.stream_pos = batch.stream_pos"
                             "  RETURNING m.stream_pos, m.sender, m.event_type, m.content)"
                             " SELECT sender, event_type, content FROM marked"
                             " ORDER BY stream_pos",
                             5, p);
    if (!res) return NULL;
    json_t *events = json_array();
    for (int i = 0; i < PQntuples(res); i++) {
        json_t *content = json_loads(PQgetvalue(res, i, 2), 0, NULL);
        if (!content) continue; /* stored from a parsed object: cannot happen */
        json_array_append_new(events, json_pack("{s:s, s:s, s:o}", "sender", PQgetvalue(res, i, 0),
                                                "type", PQgetvalue(res, i, 1), "content",
                                                content));
    }
    PQclear(res);
    return events;
}

/* The to_device section: 1 when messages are handed out (the sync answers now). */
static int sync_to_device(PGconn *c, const char *user_id, const char *device_id, int64_t since,
                          int64_t upto, json_t *response)
{
    json_t *events = device_id ? deliver_to_device(c, user_id, device_id, since, upto)
                               : json_array();
    if (!events) return ATRIUM_E_DB;
    int news = json_array_size(events) > 0;
    json_object_set_new(response, "to_device", json_pack("{s:o}", "events", events));
    return news;
}

int to_device_init(http_server *s)
{
    if (client_route(s, "PUT", "/_matrix/client/v3/sendToDevice/{eventType}/{txnId}",
                     put_send_to_device, 0) < 0)
        return -1;
    return sync_add_section("to_device", sync_to_device) < 0 ? -1 : 0;
}
