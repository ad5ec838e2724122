/*
 * core/client/e2ee/e2ee_federation.c - end-to-end encryption with users of other servers:
 * what this server answers other servers about its users' keys, and the EDUs other servers
 * send about theirs.
 *
 * Served (ATRIUM_ROUTE_FEDERATION, so the X-Matrix signature is checked first; local users
 * only): GET /_matrix/federation/v1/user/devices/{userId} (the devices with keys, the
 * user's device-list stream ID and cross-signing keys), POST .../user/keys/query and
 * .../user/keys/claim (the client endpoints' rules, e2ee_query_local and e2ee_claim_local,
 * as seen by another server: no user-signing key, only the user's own signatures).
 *
 * Received, on the inbound transaction pool (core/federation/transport/fed_txn.h), each EDU only
 * from the server of the user it is about (sender / user_id), and device-list news only
 * for users who share a room with a user of this server:
 *   m.direct_to_device    stored for the local recipients' devices (to_device_store)
 *   m.device_list_update  applied when its prev_id names the last stream ID applied, else
 *                         a resync through /user/devices (a gap: updates were missed), at
 *                         most one per user per E2EE_FED_RESYNC_INTERVAL_MS (resync_ts;
 *                         a burst of gapped updates costs the sender one call, not one
 *                         each: docs/adr/0023-device-list-resync-rate.md), run on the
 *                         pool E2EE_FED_RESYNC_POOL, at most E2EE_FED_RESYNC_PER_SERVER
 *                         per server at a time (more: counted "busy", the next gap asks
 *                         again), so a server that answers slowly or never delays no
 *                         transaction and no other server's news
 *                         (docs/adr/0024-device-list-resync-off-the-transaction.md);
 *                         either way the
 *                         user gets a device-list change at once, so local clients query the keys
 *                         again (keys/changes, sync device_lists), which asks the user's
 *                         server live (e2ee_remote.c): the stored list is never served.
 *                         At most E2EE_FED_MAX_REMOTE_DEVICES devices are kept per user.
 *   m.signing_key_update  the user's master and self-signing keys, and a change
 * Sending the local side's news is done where it happens: to-device in to_device.c, device
 * lists and signing keys by the triggers of the "e2ee" migration 2 (e2ee.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/client.h"
#include "core/client/e2ee/e2ee.h"
#include "core/client/sync/notifier.h"
#include "core/federation/transport/fed_call.h"
#include "core/federation/transport/fed_txn.h"
#include "core/runtime/uri.h"

#define E2EE_FED_DB_WAIT_MS 5000            /* EDU handlers: background work */
#define E2EE_FED_RESYNC_TIMEOUT_MS 10000    /* a /user/devices resync */
#define E2EE_FED_RESYNC_MAX_BYTES (1024 * 1024)
#define E2EE_FED_QUERY_MAX_USERS 1000       /* users per keys/query from a server */
#define E2EE_FED_CLAIM_MAX_DEVICES 1000     /* devices per keys/claim from a server */
#define E2EE_FED_URI_BYTES 1024
#define E2EE_FED_RESYNC_INTERVAL_MS 60000   /* one /user/devices resync per remote user */
#define E2EE_FED_MAX_REMOTE_DEVICES 1000    /* devices kept per remote user */

/* Resyncs run on a pool of their own, never on the inbound transaction's thread: a server
 * that answers /user/devices slowly or never holds at most E2EE_FED_RESYNC_PER_SERVER of
 * its slots, and the transaction that brought the gap is answered at once. */
#define E2EE_FED_RESYNC_POOL "core.e2ee_resync"
#define E2EE_FED_RESYNC_THREADS 4
#define E2EE_FED_RESYNC_QUEUE 64
#define E2EE_FED_RESYNC_PER_SERVER 1        /* resyncs queued or running per server */

enum resync_outcome {
    RESYNC_OK = 0, RESYNC_FAILED, RESYNC_RATE_LIMITED, RESYNC_BUSY, RESYNC__N
};
static const char *const RESYNC_OUTCOMES[RESYNC__N] = {"ok", "failed", "rate_limited", "busy"};
static rt_metric *resync_metrics[RESYNC__N]; /* atrium_e2ee_device_list_resyncs_total */

static const char *server_name(void)
{
    return core_runtime_get()->cfg->server_name;
}

static bool is_local(const char *user_id)
{
    return user_id && user_id[0] == '@' && strcmp(e2ee_user_domain(user_id), server_name()) == 0;
}

/* ---- serving other servers ---------------------------------------------------------------- */

/* GET /_matrix/federation/v1/user/devices/{userId} */
static int get_user_devices(atrium_req *r)
{
    const char *user = http_req_param(r, "userId");
    if (!is_local(user))
        return http_respond_error(r, 400, "M_INVALID_PARAM", "Not a user of this server");
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    const char *p[1] = {user};
    PGresult *sid = e2ee_sql(c, PGRES_TUPLES_OK,
                             "SELECT stream_id FROM e2ee_device_list_streams WHERE user_id = $1", 1,
                             p);
    PGresult *devs = sid ? e2ee_sql(c, PGRES_TUPLES_OK,
                                    "SELECT k.device_id, k.key_json, d.display_name"
                                    " FROM e2ee_device_keys k JOIN devices d"
                                    "  ON d.user_id = k.user_id AND d.device_id = k.device_id"
                                    " WHERE k.user_id = $1 ORDER BY k.device_id",
                                    1, p)
                         : NULL;
    PGresult *xs = devs ? e2ee_sql(c, PGRES_TUPLES_OK,
                                   "SELECT key_type, key_json FROM e2ee_cross_signing_keys"
                                   " WHERE user_id = $1 AND key_type IN ('master', 'self_signing')",
                                   1, p)
                        : NULL;
    http_db_checkin(c);
    if (!xs) {
        PQclear(sid);
        PQclear(devs);
        return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    }
    json_t *list = json_array();
    for (int i = 0; i < PQntuples(devs); i++) {
        json_t *keys = json_loads(PQgetvalue(devs, i, 1), 0, NULL);
        if (!keys) continue;
        json_t *d = json_pack("{s:s,s:o}", "device_id", PQgetvalue(devs, i, 0), "keys", keys);
        if (!PQgetisnull(devs, i, 2))
            json_object_set_new(d, "device_display_name", json_string(PQgetvalue(devs, i, 2)));
        json_array_append_new(list, d);
    }
    json_t *out = json_pack("{s:s,s:I,s:o}", "user_id", user, "stream_id",
                            (json_int_t)(PQntuples(sid) ? atoll(PQgetvalue(sid, 0, 0)) : 0),
                            "devices", list);
    for (int i = 0; i < PQntuples(xs); i++) {
        json_t *k = json_loads(PQgetvalue(xs, i, 1), 0, NULL);
        if (k)
            json_object_set_new(out, strcmp(PQgetvalue(xs, i, 0), "master") == 0
                                         ? "master_key"
                                         : "self_signing_key",
                                k);
    }
    PQclear(sid);
    PQclear(devs);
    PQclear(xs);
    return http_respond_json(r, 200, out);
}

/* POST /_matrix/federation/v1/user/keys/query {device_keys: {user: [device, ...]}} */
static int post_user_keys_query(atrium_req *r)
{
    json_t *body = http_req_json(r);
    if (!body) return ATRIUM_DONE;
    json_t *req = json_object_get(body, "device_keys");
    if (!json_is_object(req) || json_object_size(req) > E2EE_FED_QUERY_MAX_USERS)
        return http_respond_error(r, 400, "M_BAD_JSON",
                                  "device_keys must be an object of at most %d users",
                                  E2EE_FED_QUERY_MAX_USERS);
    const char *user;
    json_t *devices;
    json_object_foreach(req, user, devices) {
        if (!json_is_array(devices))
            return http_respond_error(r, 400, "M_BAD_JSON",
                                      "device_keys must map user IDs to arrays of device IDs");
    }
    json_t *resp = json_pack("{s:{}, s:{}, s:{}, s:{}}", "device_keys", "master_keys",
                             "self_signing_keys", "user_signing_keys");
    PGconn *c = http_db_checkout(r);
    if (!c) {
        json_decref(resp);
        return ATRIUM_DONE;
    }
    bool ok = e2ee_query_local(c, server_name(), req, NULL, resp);
    http_db_checkin(c);
    if (!ok) {
        json_decref(resp);
        return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    }
    json_object_del(resp, "user_signing_keys"); /* never another server's business */
    return http_respond_json(r, 200, resp);
}

static bool is_algorithm(const json_t *v)
{
    return json_is_string(v) && e2ee_id_ok(json_string_value(v));
}

/* POST /_matrix/federation/v1/user/keys/claim {one_time_keys: {user: {device: alg}}} */
static int post_user_keys_claim(atrium_req *r)
{
    json_t *body = http_req_json(r);
    if (!body) return ATRIUM_DONE;
    const json_t *req = json_object_get(body, "one_time_keys");
    const char *msg = e2ee_check_device_map(req, "one_time_keys", E2EE_FED_CLAIM_MAX_DEVICES,
                                            is_algorithm, "an algorithm name");
    if (msg) return http_respond_error(r, 400, "M_BAD_JSON", "%s", msg);
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    json_t *keys = json_object();
    bool ok = e2ee_claim_local(c, server_name(), req, keys);
    http_db_checkin(c);
    if (!ok) {
        json_decref(keys);
        return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    }
    return http_respond_json(r, 200, json_pack("{s:o}", "one_time_keys", keys));
}

/* ---- EDUs from other servers -------------------------------------------------------------- */

/* Is the EDU's subject (a user ID) a user of the server that sent it? Logged when not. */
static bool from_its_server(const char *origin, const char *user_id, const char *edu)
{
    if (user_id && user_id[0] == '@' && strcmp(e2ee_user_domain(user_id), origin) == 0)
        return true;
    rt_log(ATRIUM_LOG_INFO, "e2ee", "%s from %s about %s ignored: not a user of that server",
           edu, origin, user_id ? user_id : "(none)");
    return false;
}

/* Does user_id share a joined room with a user of this server? 1, 0, -1 (database). */
static int shares_room_with_local(PGconn *c, const char *user_id)
{
    const char *p[1] = {user_id};
    PGresult *res = e2ee_sql(c, PGRES_TUPLES_OK,
                             "SELECT 1 FROM current_state m JOIN current_state o"
                             " ON o.room_id = m.room_id AND o.type = 'm.room.member'"
                             "  AND o.membership = 'join'"
                             " JOIN users u ON u.user_id = o.state_key"
                             " WHERE m.type = 'm.room.member' AND m.state_key = $1"
                             "  AND m.membership = 'join' LIMIT 1",
                             1, p);
    if (!res) return -1;
    int n = PQntuples(res) > 0;
    PQclear(res);
    return n;
}

static void on_direct_to_device(void *ctx, const char *origin, const json_t *content)
{
    (void)ctx;
    const char *sender = json_string_value(json_object_get(content, "sender"));
    const char *type = json_string_value(json_object_get(content, "type"));
    json_t *messages = json_object_get(content, "messages");
    if (!from_its_server(origin, sender, "m.direct_to_device")) return;
    if (!type || !e2ee_id_ok(type) || !json_is_object(messages)) return;
    PGconn *c = db_acquire(db_global(), E2EE_FED_DB_WAIT_MS);
    if (!c) {
        rt_log(ATRIUM_LOG_WARN, "e2ee", "to-device messages from %s lost: no database", origin);
        return;
    }
    json_t *woken = json_object();
    bool ok = db_begin(c);
    const char *user;
    json_t *devices;
    json_object_foreach(messages, user, devices) {
        if (!ok) break;
        if (!is_local(user) || !json_is_object(devices)) continue;
        ok = to_device_store(c, sender, type, user, devices, woken);
    }
    if (ok && db_commit(c)) {
        json_t *unused;
        json_object_foreach(woken, user, unused) notifier_wake_user(user);
    } else {
        db_rollback(c);
        rt_log(ATRIUM_LOG_WARN, "e2ee", "to-device messages from %s not stored", origin);
    }
    json_decref(woken);
    db_release(db_global(), c);
}

/* Ask user_id's server for the whole device list and store it. *cp (outside any
 * transaction) goes back to the pool while the server is waited for and is borrowed again
 * after: NULL when none was free (fed_call_hold). 0, or -1 (logged). */
static int resync(PGconn **cp, const char *origin, const char *user_id)
{
    char enc[E2EE_FED_URI_BYTES / 2], uri[E2EE_FED_URI_BYTES];
    if (!rt_uri_encode(user_id, enc, sizeof(enc))) {
        rt_log(ATRIUM_LOG_WARN, "e2ee", "device list of %s not fetched from %s: the user ID is "
               "too long to send", user_id, origin);
        return -1;
    }
    snprintf(uri, sizeof(uri), "/_matrix/federation/v1/user/devices/%s", enc);
    fed_request_opts o = {.method = "GET", .destination = origin, .uri = uri,
                          .deadline_ms = rt_now_ms() + E2EE_FED_RESYNC_TIMEOUT_MS,
                          .max_body_bytes = E2EE_FED_RESYNC_MAX_BYTES};
    fed_call_result res;
    bool ran = fed_call(&o, &(fed_call_hold){.c = cp}, &res);
    PGconn *c = *cp;
    json_t *j = res.json;
    const char *answered_for = json_string_value(json_object_get(j, "user_id"));
    json_t *list = json_object_get(j, "devices");
    json_t *sid = json_object_get(j, "stream_id");
    if (!c) {
        fed_call_result_clear(&res);
        return -1; /* logged by fed_call */
    }
    if (!ran || !fed_call_ok(&res) || !answered_for || strcmp(answered_for, user_id) != 0 ||
        !json_is_array(list) || !json_is_integer(sid)) {
        rt_log(ATRIUM_LOG_INFO, "e2ee", "device list of %s not resynced from %s: %s (%d)",
               user_id, origin, res.error[0] ? res.error : "an unusable answer", res.status);
        fed_call_result_clear(&res);
        return -1;
    }
    json_t *devices = json_object();
    size_t i;
    json_t *d;
    json_array_foreach(list, i, d) {
        const char *id = json_string_value(json_object_get(d, "device_id"));
        if (!id || !e2ee_id_ok(id)) continue;
        if (json_object_size(devices) >= E2EE_FED_MAX_REMOTE_DEVICES) {
            rt_log(ATRIUM_LOG_WARN, "e2ee", "device list of %s from %s has %zu devices; only "
                   "the first %d are kept", user_id, origin, json_array_size(list),
                   E2EE_FED_MAX_REMOTE_DEVICES);
            break;
        }
        json_t *entry = json_deep_copy(d);
        json_object_del(entry, "device_id");
        json_object_set_new(devices, id, entry);
    }
    char *text = json_dumps(devices, JSON_COMPACT);
    char *mk = json_object_get(j, "master_key") ? json_dumps(json_object_get(j, "master_key"),
                                                              JSON_COMPACT)
                                                : NULL;
    char *sk = json_object_get(j, "self_signing_key")
                   ? json_dumps(json_object_get(j, "self_signing_key"), JSON_COMPACT)
                   : NULL;
    char sid_s[24], now[24];
    snprintf(sid_s, sizeof(sid_s), "%lld", (long long)json_integer_value(sid));
    snprintf(now, sizeof(now), "%lld", (long long)rt_wall_ms());
    const char *p[6] = {user_id, sid_s, text, mk, sk, now};
    bool ok = text && db_exec(c,
                              "INSERT INTO e2ee_remote_device_lists (user_id, stream_id,"
                              " devices, master_key, self_signing_key, updated_ts)"
                              " VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (user_id) DO UPDATE"
                              " SET stream_id = $2, devices = $3, master_key = $4,"
                              " self_signing_key = $5, updated_ts = $6",
                              6, p);
    free(text);
    free(mk);
    free(sk);
    json_decref(devices);
    fed_call_result_clear(&res);
    return ok ? 0 : -1;
}

/* May user_id's list be resynced now: no resync of it in the last
 * E2EE_FED_RESYNC_INTERVAL_MS? Claims the slot (resync_ts = now; a row for a user not yet
 * known, stream ID -1 and no devices, so the first update after it resyncs or applies) in
 * one statement, so two threads cannot both win it. c is outside any transaction. */
static bool resync_slot_claim(PGconn *c, const char *user_id)
{
    char now[24], since[24];
    int64_t t = rt_wall_ms();
    snprintf(now, sizeof(now), "%lld", (long long)t);
    snprintf(since, sizeof(since), "%lld", (long long)(t - E2EE_FED_RESYNC_INTERVAL_MS));
    const char *p[3] = {user_id, now, since};
    PGresult *res = e2ee_sql(c, PGRES_TUPLES_OK,
                             "INSERT INTO e2ee_remote_device_lists AS l (user_id, stream_id,"
                             " updated_ts, resync_ts) VALUES ($1, -1, $2, $2)"
                             " ON CONFLICT (user_id) DO UPDATE SET resync_ts = $2"
                             " WHERE l.resync_ts IS NULL OR l.resync_ts <= $3 RETURNING 1",
                             3, p);
    bool won = res && PQntuples(res) == 1;
    PQclear(res);
    return won;
}

typedef struct resync_job {
    char *origin, *user;
} resync_job;

static void resync_job_free(resync_job *j)
{
    rt_budget_release(core_runtime_get()->e2ee_resync_budget, j->origin);
    free(j->origin);
    free(j->user);
    free(j);
}

static void resync_task(void *arg, bool cancelled)
{
    resync_job *j = arg;
    PGconn *c = cancelled ? NULL : db_acquire(db_global(), E2EE_FED_DB_WAIT_MS);
    if (!cancelled) {
        int rc = c ? resync(&c, j->origin, j->user) : -1;
        rt_metric_add(resync_metrics[rc == 0 ? RESYNC_OK : RESYNC_FAILED], 1);
    }
    if (c) db_release(db_global(), c);
    resync_job_free(j);
}

/* A resync of user_id from origin, on the resync pool, when the user's interval allows
 * (resync_slot_claim) and origin has no other one queued or running (else counted busy:
 * the next gap after it tries again). c is outside any transaction. */
static void resync_later(PGconn *c, const char *origin, const char *user_id)
{
    core_runtime *rt = core_runtime_get();
    if (!rt->e2ee_resync_pool || rt_budget_try_acquire(rt->e2ee_resync_budget, origin, NULL) != 0) {
        rt_metric_add(resync_metrics[RESYNC_BUSY], 1);
        return;
    }
    resync_job *j = calloc(1, sizeof(*j));
    if (j) {
        j->origin = strdup(origin);
        j->user = strdup(user_id);
    }
    if (!j || !j->origin || !j->user) {
        if (j) {
            free(j->origin);
            free(j->user);
            free(j);
        }
        rt_budget_release(rt->e2ee_resync_budget, origin);
        rt_metric_add(resync_metrics[RESYNC_FAILED], 1);
        return;
    }
    if (!resync_slot_claim(c, user_id)) {
        rt_metric_add(resync_metrics[RESYNC_RATE_LIMITED], 1);
        resync_job_free(j);
    } else if (rt_pool_submit(rt->e2ee_resync_pool, resync_task, j) != 0) {
        /* The budget's cap is the pool's threads and queue: only a stopping server. */
        rt_metric_add(resync_metrics[RESYNC_FAILED], 1);
        resync_job_free(j);
    }
}

/* prev_id names `known` (the last stream ID applied)? An empty or absent prev_id is a
 * first update, fine only when nothing is known yet. */
static bool follows(const json_t *prev_id, int64_t known, bool have)
{
    if (!have) return false; /* nothing known: a resync fetches the whole list */
    size_t i;
    json_t *v;
    json_array_foreach(prev_id, i, v) if (json_is_integer(v) && json_integer_value(v) == known)
        return true;
    return json_array_size(prev_id) == 0;
}

static void on_device_list_update(void *ctx, const char *origin, const json_t *content)
{
    (void)ctx;
    const char *user = json_string_value(json_object_get(content, "user_id"));
    const char *device = json_string_value(json_object_get(content, "device_id"));
    json_t *sid = json_object_get(content, "stream_id");
    if (!from_its_server(origin, user, "m.device_list_update")) return;
    if (!device || !e2ee_id_ok(device) || !json_is_integer(sid)) return;
    PGconn *c = db_acquire(db_global(), E2EE_FED_DB_WAIT_MS);
    if (!c) {
        rt_log(ATRIUM_LOG_WARN, "e2ee", "device list update of %s lost: no database", user);
        return;
    }
    int shared = shares_room_with_local(c, user);
    if (shared <= 0) {
        db_release(db_global(), c);
        return; /* nobody here tracks them (or the database failed: logged) */
    }
    const char *p[2] = {user, NULL};
    bool ok = db_begin(c);
    PGresult *res = ok ? e2ee_sql(c, PGRES_TUPLES_OK,
                                  "SELECT stream_id, devices, resync_ts"
                                  " FROM e2ee_remote_device_lists WHERE user_id = $1 FOR UPDATE",
                                  1, p)
                       : NULL;
    if (!res) {
        if (ok) db_rollback(c);
        db_release(db_global(), c);
        return;
    }
    bool have = PQntuples(res) == 1;
    int64_t known = have ? atoll(PQgetvalue(res, 0, 0)) : 0;
    json_t *devices = have ? json_loads(PQgetvalue(res, 0, 1), 0, NULL) : NULL;
    /* Resynced within the interval: a gap now is only counted, in this transaction (the
     * cheap path a burst takes; resync_slot_claim decides the rest). */
    bool recent = have && !PQgetisnull(res, 0, 2) &&
                  atoll(PQgetvalue(res, 0, 2)) > rt_wall_ms() - E2EE_FED_RESYNC_INTERVAL_MS;
    PQclear(res);
    int64_t stream_id = json_integer_value(sid);
    bool changed = true;
    if (have && stream_id <= known) {
        changed = false; /* seen already */
    } else if (follows(json_object_get(content, "prev_id"), known, have) &&
               json_is_object(devices)) {
        if (json_is_true(json_object_get(content, "deleted"))) {
            json_object_del(devices, device);
        } else if (!json_object_get(devices, device) &&
                   json_object_size(devices) >= E2EE_FED_MAX_REMOTE_DEVICES) {
            rt_log(ATRIUM_LOG_WARN, "e2ee", "device %s of %s not kept: a remote user has at "
                   "most %d devices here", device, user, E2EE_FED_MAX_REMOTE_DEVICES);
        } else {
            json_t *entry = json_object();
            json_t *keys = json_object_get(content, "keys");
            json_t *name = json_object_get(content, "device_display_name");
            if (json_is_object(keys)) json_object_set(entry, "keys", keys);
            if (json_is_string(name)) json_object_set(entry, "device_display_name", name);
            json_object_set_new(devices, device, entry);
        }
        char *text = json_dumps(devices, JSON_COMPACT);
        char sid_s[24], now[24];
        snprintf(sid_s, sizeof(sid_s), "%lld", (long long)stream_id);
        snprintf(now, sizeof(now), "%lld", (long long)rt_wall_ms());
        const char *q[4] = {user, sid_s, text, now};
        ok = text && db_exec(c,
                             "UPDATE e2ee_remote_device_lists SET stream_id = $2,"
                             " devices = $3, updated_ts = $4 WHERE user_id = $1",
                             4, q);
        free(text);
    } else if (recent) {
        rt_metric_add(resync_metrics[RESYNC_RATE_LIMITED], 1);
    } else {
        /* A gap (or nothing known): the whole list, asked on the resync pool; the change
         * is recorded now either way (clients re-query, live). */
        db_rollback(c);
        resync_later(c, origin, user);
        ok = db_begin(c);
    }
    json_decref(devices);
    if (ok && changed) ok = e2ee_record_key_change(c, user) == 0;
    if (ok && db_commit(c)) {
        if (changed) e2ee_wake_key_change(c, user);
    } else {
        db_rollback(c);
        rt_log(ATRIUM_LOG_WARN, "e2ee", "device list update of %s not stored", user);
    }
    db_release(db_global(), c);
}

static void on_signing_key_update(void *ctx, const char *origin, const json_t *content)
{
    (void)ctx;
    const char *user = json_string_value(json_object_get(content, "user_id"));
    if (!from_its_server(origin, user, "m.signing_key_update")) return;
    json_t *mk = json_object_get(content, "master_key");
    json_t *sk = json_object_get(content, "self_signing_key");
    if ((mk && !json_is_object(mk)) || (sk && !json_is_object(sk)) || (!mk && !sk)) return;
    PGconn *c = db_acquire(db_global(), E2EE_FED_DB_WAIT_MS);
    if (!c) return;
    if (shares_room_with_local(c, user) <= 0) {
        db_release(db_global(), c);
        return;
    }
    char *mk_s = mk ? json_dumps(mk, JSON_COMPACT) : NULL;
    char *sk_s = sk ? json_dumps(sk, JSON_COMPACT) : NULL;
    char now[24];
    snprintf(now, sizeof(now), "%lld", (long long)rt_wall_ms());
    const char *p[4] = {user, mk_s, sk_s, now};
    bool ok = db_begin(c) &&
              db_exec(c,
                      "INSERT INTO e2ee_remote_device_lists (user_id, stream_id, master_key,"
                      " self_signing_key, updated_ts) VALUES ($1, 0, $2, $3, $4)"
                      " ON CONFLICT (user_id) DO UPDATE SET"
                      " master_key = COALESCE($2, e2ee_remote_device_lists.master_key),"
                      " self_signing_key ="
                      "  COALESCE($3, e2ee_remote_device_lists.self_signing_key),"
                      " updated_ts = $4",
                      4, p) &&
              e2ee_record_key_change(c, user) == 0 && db_commit(c);
    free(mk_s);
    free(sk_s);
    if (ok)
        e2ee_wake_key_change(c, user);
    else
        db_rollback(c);
    db_release(db_global(), c);
}

/* ---- the part ----------------------------------------------------------------------------- */

int e2ee_federation_init(http_server *s)
{
    static const atrium_route routes[] = {
        {.method = "GET", .path = "/_matrix/federation/v1/user/devices/{userId}",
         .handler = get_user_devices, .flags = ATRIUM_ROUTE_FEDERATION},
        {.method = "POST", .path = "/_matrix/federation/v1/user/keys/query",
         .handler = post_user_keys_query, .flags = ATRIUM_ROUTE_FEDERATION},
        {.method = "POST", .path = "/_matrix/federation/v1/user/keys/claim",
         .handler = post_user_keys_claim, .flags = ATRIUM_ROUTE_FEDERATION},
    };
    if (HTTP_ROUTES_ADD(s, routes, "e2ee") < 0) return -1;
    for (int i = 0; i < RESYNC__N; i++) {
        char label[RT_METRIC_LABELS_MAX_BYTES];
        rt_metric_label(label, sizeof(label), "outcome", RESYNC_OUTCOMES[i]);
        resync_metrics[i] = rt_metric_counter(
            core_runtime_get()->metrics, "atrium_e2ee_device_list_resyncs_total", label,
            "Whole device lists asked of a remote user's server after a gap in its updates, "
            "by outcome (rate_limited: one was asked in the last minute; busy: one of the "
            "same server's is queued or running)");
    }
    core_runtime *rt = core_runtime_get();
    rt->e2ee_resync_pool = rt_pool_new(E2EE_FED_RESYNC_POOL, E2EE_FED_RESYNC_THREADS,
                                       E2EE_FED_RESYNC_QUEUE, rt->metrics);
    rt->e2ee_resync_budget = rt_budget_new(E2EE_FED_RESYNC_POOL,
                                           E2EE_FED_RESYNC_THREADS + E2EE_FED_RESYNC_QUEUE,
                                           E2EE_FED_RESYNC_PER_SERVER, rt->metrics);
    if (!rt->e2ee_resync_pool || !rt->e2ee_resync_budget) return -1;
    if (fed_txn_on_edu("m.direct_to_device", on_direct_to_device, NULL) < 0 ||
        fed_txn_on_edu("m.device_list_update", on_device_list_update, NULL) < 0 ||
        fed_txn_on_edu("m.signing_key_update", on_signing_key_update, NULL) < 0) {
        rt_log(ATRIUM_LOG_ERROR, "e2ee", "cannot register the E2EE EDU handlers");
        return -1;
    }
    return 0;
}

int e2ee_federation_start(void)
{
    if (rt_pool_start(core_runtime_get()->e2ee_resync_pool) < 0) {
        rt_log(ATRIUM_LOG_ERROR, "e2ee", "cannot start the device-list resync pool's threads");
        return -1;
    }
    return 0;
}

/* After the inbound transaction pool stopped (core/main.c: federation_stop_inbound), so
 * no EDU handler submits any more. */
void e2ee_federation_stop(void)
{
    core_runtime *rt = core_runtime_get();
    if (rt->e2ee_resync_pool) {
        rt_pool_stop(rt->e2ee_resync_pool); /* queued resyncs are dropped: the next gap asks */
        rt_pool_join(rt->e2ee_resync_pool);
        rt_pool_free(rt->e2ee_resync_pool);
        rt->e2ee_resync_pool = NULL;
    }
    if (rt->e2ee_resync_budget) rt_budget_free(rt->e2ee_resync_budget);
    rt->e2ee_resync_budget = NULL;
}
