/*
 * core/client/e2ee/e2ee_query.c - reading other users' keys: POST /keys/query, GET /keys/changes,
 * and the device_lists of a sync (e2ee_sync_device_lists, called by e2ee_keys.c's section).
 *
 * keys/query answers from what is stored: each device's keys as uploaded plus
 * unsigned.device_display_name, each user's cross-signing keys, and the signatures uploaded
 * later through keys/signatures/upload merged in. Owns the visibility rule for those
 * signatures (visible_signature_sql): a user's signatures on their own keys are visible to
 * everyone; a signature on another user's keys (a user-signing signature) only to its
 * signer, as is the user-signing key itself. Users on other servers are asked of their
 * servers (e2ee_remote.c); e2ee_query_local answers both this server's clients and other
 * servers (/_matrix/federation/v1/user/keys/query, e2ee_federation.c).
 *
 * keys/changes and device_lists report, for a window of stream positions, the users whose
 * keys the client must fetch again (changed_sql: among those who hear of each other's key
 * changes, E2EE_SHARED_USERS_SQL) and the users it may stop tracking (left_sql). They read
 * the rooms module's current_state and memberships (its membership stream).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/auth/auth.h"
#include "core/client/e2ee/e2ee.h"
#include "core/client/rooms/crooms_api.h"
#include "core/client/sync/sync.h"

#define E2EE_QUERY_MAX_USERS 1000 /* users per keys/query request */

/* ---- keys/query ---------------------------------------------------------------------------- */

/* Add signatures[signer][signer_key] = sig to a key object. */
static void add_signature(json_t *key, const char *signer, const char *signer_key,
                          const char *sig)
{
    json_t *sigs = json_object_get(key, "signatures");
    if (!json_is_object(sigs)) {
        sigs = json_object();
        json_object_set_new(key, "signatures", sigs);
    }
    json_t *by = json_object_get(sigs, signer);
    if (!json_is_object(by)) {
        by = json_object();
        json_object_set_new(sigs, signer, by);
    }
    json_object_set_new(by, signer_key, json_string(sig));
}

/* Is `key` (a cross-signing key object) the key with this public key? */
static bool cs_key_is(const json_t *key, const char *public_key)
{
    const json_t *keys = json_object_get(key, "keys");
    char id[E2EE_MAX_ID_BYTES + 16];
    snprintf(id, sizeof(id), "ed25519:%s", public_key);
    return key && json_object_get(keys, id) != NULL;
}

/* The key object of user's keys that target_key_id names: a device ID, or the public key
 * of a cross-signing key. NULL when the answer holds no such key. */
static json_t *signature_target(json_t *resp, const char *user, const char *target_key_id)
{
    json_t *dev = json_object_get(json_object_get(json_object_get(resp, "device_keys"), user),
                                  target_key_id);
    if (dev) return dev;
    static const char *const sections[] = {"master_keys", "self_signing_keys",
                                           "user_signing_keys"};
    for (size_t i = 0; i < sizeof(sections) / sizeof(sections[0]); i++) {
        json_t *k = json_object_get(json_object_get(resp, sections[i]), user);
        if (k && cs_key_is(k, target_key_id)) return k;
    }
    return NULL;
}

/* The device keys of `users` (a JSON array text) into resp.device_keys; `wanted` maps each
 * user to the array of requested device IDs (empty: all). true, or false on a DB failure. */
static bool query_device_keys(PGconn *c, const char *users, const json_t *wanted, json_t *resp)
{
    const char *p[1] = {users};
    PGresult *res = e2ee_sql(c, PGRES_TUPLES_OK,
                             "SELECT k.user_id, k.device_id, k.key_json, d.display_name"
                             " FROM e2ee_device_keys k JOIN devices d"
                             "  ON d.user_id = k.user_id AND d.device_id = k.device_id"
                             " WHERE k.user_id IN (SELECT json_array_elements_text($1::json))",
                             1, p);
    if (!res) return false;
    json_t *out = json_object_get(resp, "device_keys");
    for (int i = 0; i < PQntuples(res); i++) {
        const char *user = PQgetvalue(res, i, 0), *device = PQgetvalue(res, i, 1);
        const json_t *devices = json_object_get(wanted, user);
        if (json_array_size(devices) > 0) {
            bool asked = false;
            size_t j;
            json_t *d;
            json_array_foreach(devices, j, d) if (json_is_string(d) &&
                                                  strcmp(json_string_value(d), device) == 0)
                asked = true;
            if (!asked) continue;
        }
        json_t *key = json_loads(PQgetvalue(res, i, 2), 0, NULL);
        if (!key) continue; /* stored by this server from a parsed object: cannot happen */
        if (!PQgetisnull(res, i, 3)) {
            json_t *unsig = json_object_get(key, "unsigned");
            if (!json_is_object(unsig)) {
                unsig = json_object();
                json_object_set_new(key, "unsigned", unsig);
            }
            json_object_set_new(unsig, "device_display_name", json_string(PQgetvalue(res, i, 3)));
        }
        json_object_set_new(json_object_get(out, user), device, key);
    }
    PQclear(res);
    return true;
}

/* Cross-signing keys of `users` into resp; the user-signing key only for `me`. */
static bool query_cross_signing_keys(PGconn *c, const char *users, const char *me, json_t *resp)
{
    const char *p[1] = {users};
    PGresult *res = e2ee_sql(c, PGRES_TUPLES_OK,
                             "SELECT user_id, key_type, key_json FROM e2ee_cross_signing_keys"
                             " WHERE user_id IN (SELECT json_array_elements_text($1::json))",
                             1, p);
    if (!res) return false;
    for (int i = 0; i < PQntuples(res); i++) {
        const char *user = PQgetvalue(res, i, 0), *type = PQgetvalue(res, i, 1);
        if (strcmp(type, "user_signing") == 0 && strcmp(user, me) != 0) continue;
        json_t *key = json_loads(PQgetvalue(res, i, 2), 0, NULL);
        if (!key) continue;
        char section[32];
        snprintf(section, sizeof(section), "%s_keys", type);
        json_t *sec = json_object_get(resp, section);
        if (!sec) {
            json_decref(key);
            continue;
        }
        json_object_set_new(sec, user, key);
    }
    PQclear(res);
    return true;
}

/* The signatures uploaded on the keys of users $1 that $2 may see (the visibility rule). */
static const char visible_signature_sql[] =
    "SELECT target_user_id, target_key_id, signer_user_id, signer_key_id, signature"
    " FROM e2ee_signatures"
    " WHERE target_user_id IN (SELECT json_array_elements_text($1::json))"
    "  AND (signer_user_id = target_user_id OR signer_user_id = $2)";

static bool query_signatures(PGconn *c, const char *users, const char *me, json_t *resp)
{
    const char *p[2] = {users, me};
    PGresult *res = e2ee_sql(c, PGRES_TUPLES_OK, visible_signature_sql, 2, p);
    if (!res) return false;
    for (int i = 0; i < PQntuples(res); i++) {
        json_t *target = signature_target(resp, PQgetvalue(res, i, 0), PQgetvalue(res, i, 1));
        if (target)
            add_signature(target, PQgetvalue(res, i, 2), PQgetvalue(res, i, 3),
                          PQgetvalue(res, i, 4));
    }
    PQclear(res);
    return true;
}

/* Is `req` {user: [device, ...]} within the caps? NULL, or a message. */
static const char *check_query(const json_t *req)
{
    if (!json_is_object(req)) return "device_keys must be an object";
    if (json_object_size(req) > E2EE_QUERY_MAX_USERS) return "too many users in one query";
    const char *user;
    json_t *devices;
    json_object_foreach((json_t *)req, user, devices) {
        if (!json_is_array(devices))
            return "device_keys must map user IDs to arrays of device IDs";
        size_t i;
        json_t *d;
        json_array_foreach(devices, i, d) if (!json_is_string(d))
            return "device_keys must map user IDs to arrays of device IDs";
    }
    return NULL;
}

bool e2ee_query_local(PGconn *c, const char *server_name, const json_t *req, const char *me,
                      json_t *resp)
{
    json_t *local = json_array();
    const char *user;
    json_t *devices;
    json_object_foreach((json_t *)req, user, devices) {
        if (user[0] != '@' || strcmp(e2ee_user_domain(user), server_name) != 0) continue;
        json_array_append_new(local, json_string(user));
        json_object_set_new(json_object_get(resp, "device_keys"), user, json_object());
    }
    char *users = json_dumps(local, JSON_COMPACT);
    json_decref(local);
    if (!users) return false;
    bool ok = query_device_keys(c, users, req, resp) &&
              query_cross_signing_keys(c, users, me ? me : "", resp) &&
              query_signatures(c, users, me ? me : "", resp);
    free(users);
    return ok;
}

/* Put what each server answered about its own users into resp (the sections a server may
 * answer with; a user of another server in its answer is ignored). */
static void merge_remote(json_t *resp, const json_t *answers)
{
    static const char *const sections[] = {"device_keys", "master_keys", "self_signing_keys"};
    const char *server;
    json_t *answer;
    json_object_foreach((json_t *)answers, server, answer) {
        for (size_t i = 0; i < sizeof(sections) / sizeof(sections[0]); i++) {
            json_t *sec = json_object_get(answer, sections[i]);
            if (!json_is_object(sec)) continue;
            const char *user;
            json_t *v;
            json_object_foreach(sec, user, v) {
                if (json_is_object(v) && strcmp(e2ee_user_domain(user), server) == 0)
                    json_object_set(json_object_get(resp, sections[i]), user, v);
            }
        }
    }
}

/* POST /_matrix/client/v3/keys/query: local users from the database, users of other
 * servers from their servers at once, parked until all answered or the timeout passed
 * (e2ee_remote.c); failures per server that did not answer. */
static int post_keys_query(atrium_req *r)
{
    if (!auth_request(r)) return ATRIUM_DONE;
    json_t *body = http_req_json(r);
    if (!body) return ATRIUM_DONE;
    const json_t *req = json_object_get(body, "device_keys");
    const char *msg = check_query(req);
    if (msg) return http_respond_error(r, 400, "M_BAD_JSON", "%s", msg);
    const char *bad = e2ee_first_bad_user(req);
    if (bad) return http_respond_error(r, 400, "M_INVALID_PARAM", "Not a user ID: %.300s", bad);
    json_t *timeout = json_object_get(body, "timeout");
    if (timeout && !json_is_integer(timeout))
        return http_respond_error(r, 400, "M_BAD_JSON", "timeout must be an integer");

    json_t *resp = json_pack("{s:{}, s:{}, s:{}, s:{}, s:{}}", "device_keys", "failures",
                             "master_keys", "self_signing_keys", "user_signing_keys");
    if (!e2ee_fanout_pending(r)) {
        /* First run: ask the other servers, one body per server. */
        json_t *bodies = json_object();
        const char *user;
        json_t *devices;
        json_object_foreach((json_t *)req, user, devices) {
            if (e2ee_user_is_local(r, user)) continue;
            const char *server = e2ee_user_domain(user);
            if (!*server) continue;
            json_t *b = json_object_get(bodies, server);
            if (!b) json_object_set_new(bodies, server, b = json_pack("{s:{}}", "device_keys"));
            json_object_set(json_object_get(b, "device_keys"), user, devices);
        }
        int rc = json_object_size(bodies) == 0
                     ? 1
                     : e2ee_fanout_start(r, "/_matrix/federation/v1/user/keys/query", bodies,
                                         timeout);
        json_decref(bodies);
        if (rc == 0) {
            json_decref(resp);
            return ATRIUM_PARKED;
        }
        if (rc < 0) {
            json_decref(resp);
            return http_respond_error(r, 503, "M_UNKNOWN", "The server is stopping");
        }
    } else {
        json_t *answers = json_object();
        e2ee_fanout_finish(r, answers, json_object_get(resp, "failures"));
        merge_remote(resp, answers);
        json_decref(answers);
    }
    PGconn *c = http_db_checkout(r);
    if (!c) {
        json_decref(resp);
        return ATRIUM_DONE;
    }
    bool ok = e2ee_query_local(c, r->srv->cfg->server_name, req, r->user, resp);
    http_db_checkin(c);
    if (!ok) {
        json_decref(resp);
        return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    }
    return http_respond_json(r, 200, resp);
}

/* ---- keys/changes and device_lists -------------------------------------------------------- */

/* Users ($1's shared users, E2EE_SHARED_USERS_SQL) to report as changed in ($2, $3]: their
 * keys changed, or they began to share a room with $1 (a join by them or by $1 in the
 * window, in a room both are joined to now: $1 has never seen their keys there). */
static const char changed_sql[] =
    "WITH shared AS (%s)"
    " SELECT s.user_id FROM shared s"
    " WHERE EXISTS (SELECT 1 FROM device_lists_changes d WHERE d.user_id = s.user_id"
    "   AND d.stream_pos > $2::bigint AND d.stream_pos <= $3::bigint)"
    "  OR (s.user_id <> $1 AND EXISTS (SELECT 1 FROM memberships m"
    "   JOIN current_state me ON me.room_id = m.room_id AND me.type = 'm.room.member'"
    "    AND me.state_key = $1 AND me.membership = 'join'"
    "   JOIN current_state o ON o.room_id = m.room_id AND o.type = 'm.room.member'"
    "    AND o.state_key = s.user_id AND o.membership = 'join'"
    "   WHERE m.stream_pos > $2::bigint AND m.stream_pos <= $3::bigint"
    "    AND m.membership = 'join' AND m.user_id IN (s.user_id, $1)))"
    " ORDER BY s.user_id";

/* Users to report as left in ($2, $3]: they left (or were banned from) a room $1 is joined
 * to, or $1 left a room they are in, and they share no room with $1 any more. */
static const char left_sql[] =
    "WITH shared AS (%s),"
    " cand AS ("
    "  SELECT m.user_id FROM memberships m"
    "  JOIN current_state me ON me.room_id = m.room_id AND me.type = 'm.room.member'"
    "   AND me.state_key = $1 AND me.membership = 'join'"
    "  WHERE m.stream_pos > $2::bigint AND m.stream_pos <= $3::bigint"
    "   AND m.membership IN ('leave', 'ban')"
    "  UNION"
    "  SELECT o.state_key FROM memberships mine"
    "  JOIN current_state o ON o.room_id = mine.room_id AND o.type = 'm.room.member'"
    "   AND o.membership = 'join'"
    "  WHERE mine.user_id = $1 AND mine.stream_pos > $2::bigint"
    "   AND mine.stream_pos <= $3::bigint AND mine.membership IN ('leave', 'ban'))"
    " SELECT DISTINCT user_id FROM cand"
    " WHERE user_id <> $1 AND user_id NOT IN (SELECT user_id FROM shared)"
    " ORDER BY user_id";

/* Run one of the queries above for (user, from, to): a JSON array of user IDs, or NULL on
 * a DB failure. */
static json_t *user_list(PGconn *c, const char *sql_template, const char *user, int64_t from,
                         int64_t to)
{
    char from_s[24], to_s[24];
    snprintf(from_s, sizeof(from_s), "%lld", (long long)from);
    snprintf(to_s, sizeof(to_s), "%lld", (long long)to);
    const char *p[3] = {user, from_s, to_s};
    char sql[4096];
    const char *hole = strstr(sql_template, "%s"); /* where the shared-users query goes */
    snprintf(sql, sizeof(sql), "%.*s%s%s", (int)(hole - sql_template), sql_template,
             E2EE_SHARED_USERS_SQL, hole + 2);
    PGresult *res = e2ee_sql(c, PGRES_TUPLES_OK, sql, 3, p);
    if (!res) return NULL;
    json_t *out = json_array();
    for (int i = 0; i < PQntuples(res); i++)
        json_array_append_new(out, json_string(PQgetvalue(res, i, 0)));
    PQclear(res);
    return out;
}

/* Whether (from, to] holds no key change and no membership change of anyone: then both
 * queries above find nothing, and two index range probes replace them (the common case of
 * an incremental sync). 1 quiet, 0 not, -1 on a DB failure. */
static int window_quiet(PGconn *c, int64_t from, int64_t to)
{
    char from_s[24], to_s[24];
    snprintf(from_s, sizeof(from_s), "%lld", (long long)from);
    snprintf(to_s, sizeof(to_s), "%lld", (long long)to);
    const char *p[2] = {from_s, to_s};
    PGresult *res = e2ee_sql(c, PGRES_TUPLES_OK, "SELECT " E2EE_WINDOW_QUIET_SQL("1", "2"), 2, p);
    if (!res) return -1;
    int quiet = PQgetvalue(res, 0, 0)[0] == 't';
    PQclear(res);
    return quiet;
}

/* {changed, left} for user between two positions, or NULL on a DB failure. quiet:
 * window_quiet's answer when the caller has it, else -1. */
static json_t *device_list_changes(PGconn *c, const char *user, int64_t from, int64_t to,
                                   int quiet)
{
    if (quiet < 0) quiet = window_quiet(c, from, to);
    if (quiet < 0) return NULL;
    if (quiet) return json_pack("{s:[], s:[]}", "changed", "left");
    json_t *changed = user_list(c, changed_sql, user, from, to);
    json_t *left = changed ? user_list(c, left_sql, user, from, to) : NULL;
    if (!left) {
        json_decref(changed);
        return NULL;
    }
    return json_pack("{s:o, s:o}", "changed", changed, "left", left);
}

/* GET /_matrix/client/v3/keys/changes?from=&to= (to defaults to now) */
static int get_keys_changes(atrium_req *r)
{
    if (!auth_request(r)) return ATRIUM_DONE;
    const char *from_s = http_req_query(r, "from"), *to_s = http_req_query(r, "to");
    if (!from_s) return http_respond_error(r, 400, "M_MISSING_PARAM", "from is required");
    int64_t from, to = INT64_MAX;
    if (!crooms_parse_token(from_s, &from))
        return http_respond_error(r, 400, "M_INVALID_PARAM", "from is not a sync token");
    if (to_s && !crooms_parse_token(to_s, &to))
        return http_respond_error(r, 400, "M_INVALID_PARAM", "to is not a sync token");
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    json_t *out = device_list_changes(c, r->user, from, to, -1);
    http_db_checkin(c);
    if (!out) return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    return http_respond_json(r, 200, out);
}

/* device_lists {changed, left} of an incremental sync; an initial sync reports none (the
 * client queries every user it tracks anyway). */
int e2ee_sync_device_lists(PGconn *c, const char *user_id, int64_t since, int64_t upto,
                           bool quiet, json_t *response)
{
    json_t *lists = since > 0 ? device_list_changes(c, user_id, since, upto, quiet)
                              : json_pack("{s:[], s:[]}", "changed", "left");
    if (!lists) return ATRIUM_E_DB;
    int news = json_array_size(json_object_get(lists, "changed")) > 0 ||
               json_array_size(json_object_get(lists, "left")) > 0;
    json_object_set_new(response, "device_lists", lists);
    return news;
}

int e2ee_query_init(http_server *s)
{
    if (client_route(s, "POST", "/_matrix/client/v3/keys/query", post_keys_query, 0) < 0 ||
        client_route(s, "GET", "/_matrix/client/v3/keys/changes", get_keys_changes, 0) < 0)
        return -1;
    return 0;
}
