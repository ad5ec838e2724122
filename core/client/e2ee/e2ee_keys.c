/*
 * core/client/e2ee/e2ee_keys.c - a device's own keys: POST /keys/upload (device keys, one-time
 * keys, fallback keys), POST /keys/claim, and the sync section that tells a device how many
 * one-time keys it has left (device_one_time_keys_count, device_unused_fallback_key_types).
 *
 * Owns the claim rule: one one-time key per (device, algorithm) per claim, taken by one
 * DELETE ... RETURNING whose row is picked FOR UPDATE SKIP LOCKED, so two concurrent claims
 * never get the same key and never wait on each other; when none is left, the device's
 * fallback key for that algorithm is handed out (again and again) and marked used. Keys
 * are stored as the client uploaded them; the server never reads the key material.
 * Device-key changes take a stream position (e2ee_record_key_change); one-time keys do not
 * (only the owning device cares, through the counts).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/auth/auth.h"
#include "core/client/client.h"
#include "core/client/e2ee/e2ee.h"
#include "core/client/sync/sync.h"

#define E2EE_UPLOAD_MAX_ONE_TIME_KEYS 1000 /* per keys/upload request */
#define E2EE_UPLOAD_MAX_FALLBACK_KEYS 16   /* per keys/upload request */
#define E2EE_CLAIM_MAX_DEVICES 1000        /* user-device pairs per keys/claim request */
/* Clients expect this algorithm's count even when it is zero (they top up on seeing 0). */
#define E2EE_DEFAULT_OTK_ALGORITHM "signed_curve25519"

/* ---- keys/upload -------------------------------------------------------------------------- */

/* Is `keys` (one_time_keys or fallback_keys) an object of "<alg>:<id>" -> object or
 * string, with at most `max` entries? NULL, or a message for the client. */
static const char *check_key_map(const json_t *keys, const char *field, size_t max,
                                 atrium_req *r)
{
    if (!json_is_object(keys)) return rt_arena_printf(r->arena, "%s must be an object", field);
    if (json_object_size(keys) > max)
        return rt_arena_printf(r->arena, "%s holds more than %zu keys", field, max);
    const char *key_id;
    json_t *v;
    json_object_foreach((json_t *)keys, key_id, v) {
        if (e2ee_key_algorithm_len(key_id) < 0 || !e2ee_id_ok(key_id))
            return rt_arena_printf(r->arena, "%s: key IDs must look like <algorithm>:<id>",
                                   field);
        if (!json_is_object(v) && !json_is_string(v))
            return rt_arena_printf(r->arena, "%s: each key must be an object or a string",
                                   field);
    }
    return NULL;
}

/* Store device_keys unless identical to what is stored; a change takes a stream position.
 * 1 changed, 0 unchanged, ATRIUM_E_DB. */
static int store_device_keys(PGconn *c, const char *user, const char *device,
                             const json_t *keys)
{
    const char *p[3] = {user, device, NULL};
    PGresult *res = e2ee_sql(c, PGRES_TUPLES_OK,
                             "SELECT key_json FROM e2ee_device_keys"
                             " WHERE user_id = $1 AND device_id = $2 FOR UPDATE",
                             2, p);
    if (!res) return ATRIUM_E_DB;
    bool same = false;
    if (PQntuples(res) == 1) {
        json_t *old = json_loads(PQgetvalue(res, 0, 0), 0, NULL);
        same = old && json_equal(old, keys);
        json_decref(old);
    }
    PQclear(res);
    if (same) return 0;
    char *text = json_dumps(keys, JSON_COMPACT);
    if (!text) return ATRIUM_E_NOMEM;
    p[2] = text;
    bool ok = db_exec(c,
                      "INSERT INTO e2ee_device_keys (user_id, device_id, key_json)"
                      " VALUES ($1, $2, $3)"
                      " ON CONFLICT (user_id, device_id)"
                      " DO UPDATE SET key_json = EXCLUDED.key_json",
                      3, p);
    free(text);
    if (!ok || e2ee_record_key_change(c, user) < 0) return ATRIUM_E_DB;
    return 1;
}

/* Insert one-time keys; a key ID already stored with other content is refused (clients must
 * not reuse key IDs), the same content again is a harmless retry. 0, ATRIUM_E_DB, or
 * ATRIUM_E_EXISTS with *clash set to the first clashing key ID (arena). */
static int store_one_time_keys(atrium_req *r, PGconn *c, const json_t *keys,
                               const char **clash)
{
    char *text = json_dumps(keys, JSON_COMPACT);
    if (!text) return ATRIUM_E_NOMEM;
    const char *p[3] = {r->user, r->device, text};
    /* The final SELECT sees the table as it was before this statement's INSERT, so it
     * finds exactly the IDs that were stored already. */
    PGresult *res = e2ee_sql(
        c, PGRES_TUPLES_OK,
        "WITH new AS (SELECT split_part(key, ':', 1) AS alg,"
        "   substr(key, strpos(key, ':') + 1) AS kid, key AS full_id, value::text AS kj"
        "  FROM json_each($3::json)),"
        " ins AS (INSERT INTO e2ee_one_time_keys (user_id, device_id, algorithm, key_id, key_json)"
        "  SELECT $1, $2, alg, kid, kj FROM new ON CONFLICT DO NOTHING RETURNING 1)"
        " SELECT n.full_id FROM new n JOIN e2ee_one_time_keys o"
        "  ON o.user_id = $1 AND o.device_id = $2 AND o.algorithm = n.alg AND o.key_id = n.kid"
        " WHERE o.key_json <> n.kj LIMIT 1",
        3, p);
    free(text);
    if (!res) return ATRIUM_E_DB;
    int rc = 0;
    if (PQntuples(res) > 0) {
        *clash = rt_arena_strdup(r->arena, PQgetvalue(res, 0, 0));
        rc = ATRIUM_E_EXISTS;
    }
    PQclear(res);
    return rc;
}

/* Set the fallback key per algorithm. Re-uploading the current key keeps its used flag; a
 * new key starts unused. 0 or ATRIUM_E_DB. */
static int store_fallback_keys(atrium_req *r, PGconn *c, const json_t *keys)
{
    const char *key_id;
    json_t *v;
    json_object_foreach((json_t *)keys, key_id, v) {
        int alen = e2ee_key_algorithm_len(key_id);
        char *alg = rt_arena_strndup(r->arena, key_id, (size_t)alen);
        char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        if (!alg || !text) {
            free(text);
            return ATRIUM_E_NOMEM;
        }
        const char *p[5] = {r->user, r->device, alg, key_id + alen + 1, text};
        bool ok = db_exec(
            c,
            "INSERT INTO e2ee_fallback_keys (user_id, device_id, algorithm, key_id, key_json)"
            " VALUES ($1, $2, $3, $4, $5)"
            " ON CONFLICT (user_id, device_id, algorithm) DO UPDATE"
            " SET key_id = EXCLUDED.key_id, key_json = EXCLUDED.key_json,"
            " used = e2ee_fallback_keys.used AND e2ee_fallback_keys.key_id = EXCLUDED.key_id"
            "  AND e2ee_fallback_keys.key_json = EXCLUDED.key_json",
            5, p);
        free(text);
        if (!ok) return ATRIUM_E_DB;
    }
    return 0;
}

/* {algorithm: count} of a device's unclaimed one-time keys, with the default algorithm
 * always present. NULL on a database failure. */
static json_t *one_time_key_counts(PGconn *c, const char *user, const char *device)
{
    const char *p[2] = {user, device};
    PGresult *res = e2ee_sql(c, PGRES_TUPLES_OK,
                             "SELECT algorithm, count(*) FROM e2ee_one_time_keys"
                             " WHERE user_id = $1 AND device_id = $2 GROUP BY algorithm",
                             2, p);
    if (!res) return NULL;
    json_t *counts = json_object();
    json_object_set_new(counts, E2EE_DEFAULT_OTK_ALGORITHM, json_integer(0));
    for (int i = 0; i < PQntuples(res); i++)
        json_object_set_new(counts, PQgetvalue(res, i, 0),
                            json_integer(atoll(PQgetvalue(res, i, 1))));
    PQclear(res);
    return counts;
}

/* POST /_matrix/client/v3/keys/upload */
static int post_keys_upload(atrium_req *r)
{
    if (!auth_request(r)) return ATRIUM_DONE;
    json_t *body = http_req_json(r);
    if (!body) return ATRIUM_DONE;
    const json_t *dk = json_object_get(body, "device_keys");
    const json_t *otk = json_object_get(body, "one_time_keys");
    const json_t *fbk = json_object_get(body, "fallback_keys");
    if (!fbk) fbk = json_object_get(body, "org.matrix.msc2732.fallback_keys");
    if (json_is_null(dk)) dk = NULL;
    if (json_is_null(otk)) otk = NULL;
    if (json_is_null(fbk)) fbk = NULL;
    if (dk) {
        const char *errcode;
        const char *msg = e2ee_check_device_keys(dk, r->user, r->device, &errcode);
        if (msg) return http_respond_error(r, 400, errcode, "%s", msg);
    }
    const char *msg = NULL;
    if (otk) msg = check_key_map(otk, "one_time_keys", E2EE_UPLOAD_MAX_ONE_TIME_KEYS, r);
    if (!msg && fbk) msg = check_key_map(fbk, "fallback_keys", E2EE_UPLOAD_MAX_FALLBACK_KEYS, r);
    if (msg) return http_respond_error(r, 400, "M_BAD_JSON", "%s", msg);

    PGconn *c = e2ee_db_begin(r);
    if (!c) return ATRIUM_DONE;
    int changed = 0;
    const char *clash = NULL;
    int rc = 0;
    /* Device keys last: their change takes a stream position, and no row lock may be
     * taken after that (rooms.h: the stream lock order). */
    if (otk) rc = store_one_time_keys(r, c, otk, &clash);
    if (rc >= 0 && fbk) rc = store_fallback_keys(r, c, fbk);
    if (rc >= 0 && dk) rc = changed = store_device_keys(c, r->user, r->device, dk);
    json_t *counts = rc >= 0 ? one_time_key_counts(c, r->user, r->device) : NULL;
    if (rc == ATRIUM_E_EXISTS) {
        db_rollback(c);
        http_respond_error(r, 400, "M_INVALID_PARAM",
                           "One-time key %s already exists with other content", clash);
    } else if (!counts || !db_commit(c)) {
        e2ee_db_failed(r, c, true);
    } else {
        if (changed > 0) e2ee_wake_key_change(c, r->user);
        http_respond_json(r, 200, json_pack("{s:O}", "one_time_key_counts", counts));
    }
    json_decref(counts);
    http_db_checkin(c);
    return ATRIUM_DONE;
}

/* ---- keys/claim --------------------------------------------------------------------------- */

/* Claim one key of `alg` from (user, device): an unclaimed one-time key, else the fallback
 * key (marked used). Adds "alg:id": key to `into`. 1 claimed, 0 nothing, ATRIUM_E_DB. */
int e2ee_claim_one(PGconn *c, const char *user, const char *device, const char *alg,
                   json_t *into)
{
    const char *p[3] = {user, device, alg};
    PGresult *res = e2ee_sql(
        c, PGRES_TUPLES_OK,
        "WITH otk AS ("
        "  DELETE FROM e2ee_one_time_keys"
        "  WHERE (user_id, device_id, algorithm, key_id) = ("
        "   SELECT user_id, device_id, algorithm, key_id FROM e2ee_one_time_keys"
        "   WHERE user_id = $1 AND device_id = $2 AND algorithm = $3"
        "   ORDER BY key_id LIMIT 1 FOR UPDATE SKIP LOCKED)"
        "  RETURNING key_id, key_json),"
        " fb AS ("
        "  UPDATE e2ee_fallback_keys SET used = true"
        "  WHERE user_id = $1 AND device_id = $2 AND algorithm = $3"
        "   AND NOT EXISTS (SELECT 1 FROM otk)"
        "  RETURNING key_id, key_json)"
        " SELECT key_id, key_json FROM otk UNION ALL SELECT key_id, key_json FROM fb",
        3, p);
    if (!res) return ATRIUM_E_DB;
    int got = 0;
    if (PQntuples(res) > 0) {
        json_t *key = json_loads(PQgetvalue(res, 0, 1), JSON_DECODE_ANY, NULL);
        if (key) {
            char id[2 * E2EE_MAX_ID_BYTES + 2];
            snprintf(id, sizeof(id), "%s:%s", alg, PQgetvalue(res, 0, 0));
            json_object_set_new(into, id, key);
            got = 1;
        }
    }
    PQclear(res);
    return got;
}

static bool is_algorithm(const json_t *v)
{
    return json_is_string(v) && e2ee_id_ok(json_string_value(v));
}

/* Claim the keys of `req` ({user: {device: algorithm}}) of this server's users into keys
 * ({user: {device: {key_id: key}}}). false on a database failure. */
bool e2ee_claim_local(PGconn *c, const char *server_name, const json_t *req, json_t *keys)
{
    const char *user;
    json_t *devices;
    json_object_foreach((json_t *)req, user, devices) {
        if (user[0] != '@' || strcmp(e2ee_user_domain(user), server_name) != 0) continue;
        json_t *per_user = json_object();
        const char *device;
        json_t *alg;
        bool ok = true;
        json_object_foreach(devices, device, alg) {
            if (!json_is_string(alg)) continue;
            json_t *per_device = json_object();
            int got = e2ee_claim_one(c, user, device, json_string_value(alg), per_device);
            if (got < 0) ok = false;
            if (got > 0) json_object_set(per_user, device, per_device);
            json_decref(per_device);
            if (!ok) break;
        }
        if (json_object_size(per_user)) json_object_set(keys, user, per_user);
        json_decref(per_user);
        if (!ok) return false;
    }
    return true;
}

/* POST /_matrix/client/v3/keys/claim: keys of local users claimed here, of other servers'
 * users claimed from their servers at once, parked (e2ee_remote.c). */
static int post_keys_claim(atrium_req *r)
{
    if (!auth_request(r)) return ATRIUM_DONE;
    json_t *body = http_req_json(r);
    if (!body) return ATRIUM_DONE;
    const json_t *req = json_object_get(body, "one_time_keys");
    const char *msg = e2ee_check_device_map(req, "one_time_keys", E2EE_CLAIM_MAX_DEVICES,
                                            is_algorithm, "an algorithm name");
    if (msg) return http_respond_error(r, 400, "M_BAD_JSON", "%s", msg);
    const char *bad = e2ee_first_bad_user(req);
    if (bad) return http_respond_error(r, 400, "M_INVALID_PARAM", "Not a user ID: %.300s", bad);
    json_t *timeout = json_object_get(body, "timeout");
    if (timeout && !json_is_integer(timeout))
        return http_respond_error(r, 400, "M_BAD_JSON", "timeout must be an integer");

    json_t *keys = json_object(), *failures = json_object();
    if (!e2ee_fanout_pending(r)) {
        json_t *bodies = json_object();
        const char *user;
        json_t *devices;
        json_object_foreach((json_t *)req, user, devices) {
            if (e2ee_user_is_local(r, user) || !*e2ee_user_domain(user)) continue;
            const char *server = e2ee_user_domain(user);
            json_t *b = json_object_get(bodies, server);
            if (!b) json_object_set_new(bodies, server, b = json_pack("{s:{}}", "one_time_keys"));
            json_object_set(json_object_get(b, "one_time_keys"), user, devices);
        }
        int rc = json_object_size(bodies) == 0
                     ? 1
                     : e2ee_fanout_start(r, "/_matrix/federation/v1/user/keys/claim", bodies,
                                         timeout);
        json_decref(bodies);
        if (rc <= 0) {
            json_decref(keys);
            json_decref(failures);
            return rc == 0 ? ATRIUM_PARKED
                           : http_respond_error(r, 503, "M_UNKNOWN", "The server is stopping");
        }
    } else {
        json_t *answers = json_object();
        e2ee_fanout_finish(r, answers, failures);
        const char *server;
        json_t *answer;
        json_object_foreach(answers, server, answer) {
            const char *user;
            json_t *v;
            json_object_foreach(json_object_get(answer, "one_time_keys"), user, v) {
                if (json_is_object(v) && strcmp(e2ee_user_domain(user), server) == 0)
                    json_object_set(keys, user, v);
            }
        }
        json_decref(answers);
    }
    PGconn *c = http_db_checkout(r);
    if (!c) {
        json_decref(keys);
        json_decref(failures);
        return ATRIUM_DONE;
    }
    bool ok = e2ee_claim_local(c, r->srv->cfg->server_name, req, keys);
    if (ok)
        http_respond_json(r, 200, json_pack("{s:o, s:o}", "one_time_keys", keys, "failures",
                                            failures));
    else {
        json_decref(keys);
        json_decref(failures);
        e2ee_db_failed(r, c, false);
    }
    http_db_checkin(c);
    return ATRIUM_DONE;
}

/* ---- sync section -------------------------------------------------------------------------- */

/* The e2ee sync section. device_one_time_keys_count and device_unused_fallback_key_types
 * are steady-state data that never wake a sync by themselves; the device lists
 * (e2ee_query.c) may. One statement (every woken sync runs it): rows 'o' (algorithm, count
 * of unclaimed one-time keys), 'f' (an unused fallback key's algorithm) and, on an
 * incremental sync, 'q' (whether the window is quiet for device lists), in that order. */
static int sync_e2ee(PGconn *c, const char *user_id, const char *device_id, int64_t since,
                     int64_t upto, json_t *response)
{
    char since_s[24], upto_s[24];
    snprintf(since_s, sizeof(since_s), "%lld", (long long)since);
    snprintf(upto_s, sizeof(upto_s), "%lld", (long long)upto);
    const char *p[4] = {user_id, device_id, since_s, upto_s};
    PGresult *res = e2ee_sql(c, PGRES_TUPLES_OK,
                             "SELECT 'o', algorithm, count(*) FROM e2ee_one_time_keys"
                             " WHERE user_id = $1 AND device_id = $2 GROUP BY algorithm"
                             " UNION ALL SELECT 'f', algorithm, 0 FROM e2ee_fallback_keys"
                             " WHERE user_id = $1 AND device_id = $2 AND NOT used"
                             " UNION ALL SELECT 'q', '', " E2EE_WINDOW_QUIET_SQL("3", "4") "::int"
                             " WHERE $3::bigint > 0"
                             " ORDER BY 1, 2",
                             4, p);
    if (!res) return ATRIUM_E_DB;
    json_t *counts = json_object(), *types = json_array();
    json_object_set_new(counts, E2EE_DEFAULT_OTK_ALGORITHM, json_integer(0));
    bool quiet = false;
    for (int i = 0; i < PQntuples(res); i++) {
        char kind = PQgetvalue(res, i, 0)[0];
        if (kind == 'o')
            json_object_set_new(counts, PQgetvalue(res, i, 1), json_integer(atoll(PQgetvalue(res, i, 2))));
        else if (kind == 'f')
            json_array_append_new(types, json_string(PQgetvalue(res, i, 1)));
        else
            quiet = atoll(PQgetvalue(res, i, 2)) == 1;
    }
    PQclear(res);
    json_object_set_new(response, "device_one_time_keys_count", counts);
    json_object_set_new(response, "device_unused_fallback_key_types", types);
    return e2ee_sync_device_lists(c, user_id, since, upto, quiet, response);
}

int e2ee_keys_init(http_server *s)
{
    if (client_route(s, "POST", "/_matrix/client/v3/keys/upload", post_keys_upload, 0) < 0 ||
        client_route(s, "POST", "/_matrix/client/v3/keys/claim", post_keys_claim, 0) < 0)
        return -1;
    return sync_add_section("e2ee", sync_e2ee) < 0 ? -1 : 0;
}
