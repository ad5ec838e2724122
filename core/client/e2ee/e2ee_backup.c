/*
 * core/client/e2ee/e2ee_backup.c - server-side backup of room keys: /room_keys/version (create,
 * read the current one or one by number, update its auth_data, delete) and /room_keys/keys
 * (store, read and delete session keys, for all rooms, one room or one session).
 *
 * A user has at most one current backup: the highest version not deleted. Version numbers
 * are never reused. Keys may only be written to the current version (403
 * M_WRONG_ROOM_KEYS_VERSION otherwise, with current_version), read from any live one. A
 * stored session key is replaced only by a better one (e2ee_backup_should_replace); the
 * version's etag changes whenever its set of keys does, so clients know when to re-read.
 * The backup's content (auth_data, session_data) is opaque to the server.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/auth/auth.h"
#include "core/client/client.h"
#include "core/client/e2ee/e2ee.h"
#include "atrium/parse.h"

#define BACKUP_NOT_FOUND "Unknown backup version"
#define VERSION_TEXT_BYTES 24 /* a version number as a query parameter */

bool e2ee_backup_should_replace(bool old_verified, int64_t old_index, int64_t old_forwards,
                                bool new_verified, int64_t new_index, int64_t new_forwards)
{
    if (old_verified != new_verified) return new_verified;
    if (old_index != new_index) return new_index < old_index;
    return new_forwards < old_forwards;
}

static void version_text(int64_t version, char out[VERSION_TEXT_BYTES])
{
    snprintf(out, VERSION_TEXT_BYTES, "%lld", (long long)version);
}

/* A version number from the path or the query: decimal digits, in int64 range. */
static bool parse_version(const char *s, int64_t *out)
{
    return s && s[0] != '-' && atrium_parse_int64(s, 0, INT64_MAX, out) == 0;
}

/* Finish: commit and answer `body` (consumed), or answer 503. Releases c. */
static int finish(atrium_req *r, PGconn *c, json_t *body)
{
    if (!body || !db_commit(c)) {
        json_decref(body);
        e2ee_db_failed(r, c, true);
    } else {
        http_respond_json(r, 200, body);
    }
    http_db_checkin(c);
    return ATRIUM_DONE;
}

/* Answer an error and roll back. Releases c. */
static int fail(atrium_req *r, PGconn *c, int status, const char *errcode, const char *msg)
{
    db_rollback(c);
    http_db_checkin(c);
    return http_respond_error(r, status, errcode, "%s", msg);
}

/* The user's current version: 1 found (*version set), 0 none, ATRIUM_E_DB. */
static int current_version(PGconn *c, const char *user, int64_t *version)
{
    const char *p[1] = {user};
    PGresult *res = e2ee_sql(c, PGRES_TUPLES_OK,
                             "SELECT max(version) FROM e2ee_backup_versions"
                             " WHERE user_id = $1 AND NOT deleted",
                             1, p);
    if (!res) return ATRIUM_E_DB;
    int found = !PQgetisnull(res, 0, 0);
    if (found) *version = atoll(PQgetvalue(res, 0, 0));
    PQclear(res);
    return found;
}

/* Lock a live version row: 1 found, 0 not (or deleted), ATRIUM_E_DB. */
static int lock_version(PGconn *c, const char *user, int64_t version)
{
    char v[VERSION_TEXT_BYTES];
    version_text(version, v);
    const char *p[2] = {user, v};
    PGresult *res = e2ee_sql(c, PGRES_TUPLES_OK,
                             "SELECT 1 FROM e2ee_backup_versions"
                             " WHERE user_id = $1 AND version = $2::bigint AND NOT deleted"
                             " FOR UPDATE",
                             2, p);
    if (!res) return ATRIUM_E_DB;
    int found = PQntuples(res) == 1;
    PQclear(res);
    return found;
}

/* {etag, count} of a version (after bumping the etag when `bump`). NULL on a DB failure. */
static json_t *etag_and_count(PGconn *c, const char *user, int64_t version, bool bump)
{
    char v[VERSION_TEXT_BYTES];
    version_text(version, v);
    const char *p[3] = {user, v, bump ? "1" : "0"};
    PGresult *res = e2ee_sql(
        c, PGRES_TUPLES_OK,
        "WITH b AS (UPDATE e2ee_backup_versions SET etag = etag + $3::int"
        "  WHERE user_id = $1 AND version = $2::bigint RETURNING etag)"
        " SELECT (SELECT etag FROM b),"
        "  (SELECT count(*) FROM e2ee_backup_keys WHERE user_id = $1 AND version = $2::bigint)",
        3, p);
    if (!res) return NULL;
    json_t *out = json_pack("{s:s, s:I}", "etag", PQgetvalue(res, 0, 0), "count",
                            (json_int_t)atoll(PQgetvalue(res, 0, 1)));
    PQclear(res);
    return out;
}

/* ---- /room_keys/version --------------------------------------------------------------------- */

/* The version's description, or NULL with *found 0 when it is unknown (or deleted). */
static json_t *version_info(PGconn *c, const char *user, int64_t version, int *found)
{
    char v[VERSION_TEXT_BYTES];
    version_text(version, v);
    const char *p[2] = {user, v};
    PGresult *res = e2ee_sql(c, PGRES_TUPLES_OK,
                             "SELECT algorithm, auth_data, etag,"
                             " (SELECT count(*) FROM e2ee_backup_keys k"
                             "  WHERE k.user_id = $1 AND k.version = $2::bigint)"
                             " FROM e2ee_backup_versions"
                             " WHERE user_id = $1 AND version = $2::bigint AND NOT deleted",
                             2, p);
    *found = 0;
    if (!res) {
        *found = ATRIUM_E_DB;
        return NULL;
    }
    json_t *out = NULL;
    if (PQntuples(res) == 1) {
        *found = 1;
        out = json_pack("{s:s, s:o, s:s, s:I, s:s}", "algorithm", PQgetvalue(res, 0, 0),
                        "auth_data", json_loads(PQgetvalue(res, 0, 1), 0, NULL), "etag",
                        PQgetvalue(res, 0, 2), "count", (json_int_t)atoll(PQgetvalue(res, 0, 3)),
                        "version", v);
    }
    PQclear(res);
    return out;
}

/* GET /room_keys/version and /room_keys/version/{version} */
static int get_version(atrium_req *r)
{
    if (!auth_request(r)) return ATRIUM_DONE;
    const char *vs = http_req_param(r, "version");
    int64_t version = 0;
    if (vs && !parse_version(vs, &version))
        return http_respond_error(r, 404, "M_NOT_FOUND", BACKUP_NOT_FOUND);
    PGconn *c = e2ee_db_begin(r);
    if (!c) return ATRIUM_DONE;
    int found = vs ? 1 : current_version(c, r->user, &version);
    if (found < 0) return finish(r, c, NULL);
    if (found == 0) return fail(r, c, 404, "M_NOT_FOUND", "No current backup version");
    json_t *info = version_info(c, r->user, version, &found);
    if (found < 0) return finish(r, c, NULL);
    if (found == 0) return fail(r, c, 404, "M_NOT_FOUND", BACKUP_NOT_FOUND);
    return finish(r, c, info);
}

/* Are body's algorithm (a string) and auth_data (an object) fine? NULL, or a message. */
static const char *check_version_body(const json_t *body)
{
    if (!json_is_string(json_object_get(body, "algorithm")) ||
        !e2ee_id_ok(json_string_value(json_object_get(body, "algorithm"))))
        return "algorithm must be a string";
    if (!json_is_object(json_object_get(body, "auth_data")))
        return "auth_data must be an object";
    return NULL;
}

/* POST /room_keys/version: a new current version. */
static int post_version(atrium_req *r)
{
    if (!auth_request(r)) return ATRIUM_DONE;
    json_t *body = http_req_json(r);
    if (!body) return ATRIUM_DONE;
    const char *msg = check_version_body(body);
    if (msg) return http_respond_error(r, 400, "M_BAD_JSON", "%s", msg);
    char *auth_data = json_dumps(json_object_get(body, "auth_data"), JSON_COMPACT);
    if (!auth_data) return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    PGconn *c = e2ee_db_begin(r);
    if (!c) {
        free(auth_data);
        return ATRIUM_DONE;
    }
    const char *p[3] = {r->user, json_string_value(json_object_get(body, "algorithm")), auth_data};
    /* The users row lock serializes a user's creations, so two never take one number. */
    PGresult *res = NULL;
    if (db_exec(c, "SELECT FROM users WHERE user_id = $1 FOR UPDATE", 1, p))
        res = e2ee_sql(c, PGRES_TUPLES_OK,
                       "INSERT INTO e2ee_backup_versions (user_id, version, algorithm, auth_data)"
                       " SELECT $1, coalesce(max(version), 0) + 1, $2, $3"
                       "  FROM e2ee_backup_versions WHERE user_id = $1"
                       " RETURNING version",
                       3, p);
    free(auth_data);
    if (!res) return finish(r, c, NULL);
    json_t *out = json_pack("{s:s}", "version", PQgetvalue(res, 0, 0));
    PQclear(res);
    return finish(r, c, out);
}

/* PUT /room_keys/version/{version}: replace auth_data (the algorithm may not change). */
static int put_version(atrium_req *r)
{
    if (!auth_request(r)) return ATRIUM_DONE;
    json_t *body = http_req_json(r);
    if (!body) return ATRIUM_DONE;
    int64_t version;
    if (!parse_version(http_req_param(r, "version"), &version))
        return http_respond_error(r, 404, "M_NOT_FOUND", BACKUP_NOT_FOUND);
    const char *msg = check_version_body(body);
    if (msg) return http_respond_error(r, 400, "M_BAD_JSON", "%s", msg);
    const json_t *bv = json_object_get(body, "version");
    const char *path_version = http_req_param(r, "version");
    if (bv && !(json_is_string(bv) && strcmp(json_string_value(bv), path_version) == 0))
        return http_respond_error(r, 400, "M_INVALID_PARAM",
                                  "version in the body does not match the path");
    PGconn *c = e2ee_db_begin(r);
    if (!c) return ATRIUM_DONE;
    int found;
    json_t *info = version_info(c, r->user, version, &found);
    if (found < 0) return finish(r, c, NULL);
    if (found == 0) return fail(r, c, 404, "M_NOT_FOUND", BACKUP_NOT_FOUND);
    bool same_alg = strcmp(json_string_value(json_object_get(info, "algorithm")),
                           json_string_value(json_object_get(body, "algorithm"))) == 0;
    json_decref(info);
    if (!same_alg) return fail(r, c, 400, "M_INVALID_PARAM", "The algorithm cannot change");
    char *auth_data = json_dumps(json_object_get(body, "auth_data"), JSON_COMPACT);
    char v[VERSION_TEXT_BYTES];
    version_text(version, v);
    const char *p[3] = {r->user, v, auth_data};
    bool ok = auth_data && db_exec(c,
                                   "UPDATE e2ee_backup_versions SET auth_data = $3"
                                   " WHERE user_id = $1 AND version = $2::bigint",
                                   3, p);
    free(auth_data);
    return finish(r, c, ok ? json_object() : NULL);
}

/* DELETE /room_keys/version/{version}: the version and its keys go. */
static int delete_version(atrium_req *r)
{
    if (!auth_request(r)) return ATRIUM_DONE;
    int64_t version;
    if (!parse_version(http_req_param(r, "version"), &version))
        return http_respond_error(r, 404, "M_NOT_FOUND", BACKUP_NOT_FOUND);
    PGconn *c = e2ee_db_begin(r);
    if (!c) return ATRIUM_DONE;
    int found = lock_version(c, r->user, version);
    if (found < 0) return finish(r, c, NULL);
    if (found == 0) return fail(r, c, 404, "M_NOT_FOUND", BACKUP_NOT_FOUND);
    char v[VERSION_TEXT_BYTES];
    version_text(version, v);
    const char *p[2] = {r->user, v};
    bool ok = db_exec(c,
                      "DELETE FROM e2ee_backup_keys"
                      " WHERE user_id = $1 AND version = $2::bigint",
                      2, p) &&
              db_exec(c,
                      "UPDATE e2ee_backup_versions SET deleted = true"
                      " WHERE user_id = $1 AND version = $2::bigint",
                      2, p);
    return finish(r, c, ok ? json_object() : NULL);
}

/* ---- /room_keys/keys ------------------------------------------------------------------------ */

/* Is v a KeyBackupData object? */
static bool key_data_ok(const json_t *v)
{
    return json_is_object(v) && json_is_integer(json_object_get(v, "first_message_index")) &&
           json_is_integer(json_object_get(v, "forwarded_count")) &&
           json_is_boolean(json_object_get(v, "is_verified")) &&
           json_is_object(json_object_get(v, "session_data"));
}

/* The request's version (?version=): parsed, or answered (400 missing, 404 malformed). */
static bool request_version(atrium_req *r, int64_t *version)
{
    const char *vs = http_req_query(r, "version");
    if (!vs) {
        http_respond_error(r, 400, "M_MISSING_PARAM", "The version query parameter is required");
        return false;
    }
    if (!parse_version(vs, version)) {
        http_respond_error(r, 404, "M_NOT_FOUND", BACKUP_NOT_FOUND);
        return false;
    }
    return true;
}

/* Store one session key unless the stored one is better. 1 stored, 0 kept, ATRIUM_E_DB. */
static int put_one(PGconn *c, const char *user, const char *v, const char *room,
                   const char *session, const json_t *data)
{
    const char *p[8] = {user, v, room, session};
    PGresult *res = e2ee_sql(c, PGRES_TUPLES_OK,
                             "SELECT is_verified, first_message_index, forwarded_count"
                             " FROM e2ee_backup_keys WHERE user_id = $1 AND version = $2::bigint"
                             " AND room_id = $3 AND session_id = $4 FOR UPDATE",
                             4, p);
    if (!res) return ATRIUM_E_DB;
    bool nv = json_is_true(json_object_get(data, "is_verified"));
    int64_t ni = json_integer_value(json_object_get(data, "first_message_index"));
    int64_t nf = json_integer_value(json_object_get(data, "forwarded_count"));
    bool replace = PQntuples(res) == 0 ||
                   e2ee_backup_should_replace(PQgetvalue(res, 0, 0)[0] == 't',
                                              atoll(PQgetvalue(res, 0, 1)),
                                              atoll(PQgetvalue(res, 0, 2)), nv, ni, nf);
    PQclear(res);
    if (!replace) return 0;
    char *text = json_dumps(data, JSON_COMPACT);
    char is[VERSION_TEXT_BYTES], fs[VERSION_TEXT_BYTES];
    version_text(ni, is); /* any int64 as text */
    version_text(nf, fs);
    p[4] = is;
    p[5] = fs;
    p[6] = nv ? "true" : "false";
    p[7] = text;
    bool ok = text && db_exec(c,
                              "INSERT INTO e2ee_backup_keys (user_id, version, room_id,"
                              " session_id, first_message_index, forwarded_count, is_verified,"
                              " key_json) VALUES ($1, $2::bigint, $3, $4, $5::bigint,"
                              " $6::bigint, $7::boolean, $8)"
                              " ON CONFLICT (user_id, version, room_id, session_id) DO UPDATE"
                              " SET first_message_index = EXCLUDED.first_message_index,"
                              " forwarded_count = EXCLUDED.forwarded_count,"
                              " is_verified = EXCLUDED.is_verified, key_json = EXCLUDED.key_json",
                              8, p);
    free(text);
    return ok ? 1 : ATRIUM_E_DB;
}

/* Check a {session_id: KeyBackupData} map. */
static bool sessions_ok(const json_t *sessions)
{
    if (!json_is_object(sessions)) return false;
    const char *sid;
    json_t *data;
    json_object_foreach((json_t *)sessions, sid, data) if (!e2ee_id_ok(sid) || !key_data_ok(data))
        return false;
    return true;
}

/* The body of a keys PUT normalized to {room_id: {session_id: data}} (new; NULL when the
 * body does not have the shape of its path). */
static json_t *normalize_put(json_t *body, const char *room, const char *session)
{
    if (session) {
        if (!key_data_ok(body) || !e2ee_id_ok(session) || !e2ee_id_ok(room)) return NULL;
        return json_pack("{s:{s:O}}", room, session, body);
    }
    if (room) {
        json_t *sessions = json_object_get(body, "sessions");
        if (!e2ee_id_ok(room) || !sessions_ok(sessions)) return NULL;
        return json_pack("{s:O}", room, sessions);
    }
    json_t *rooms = json_object_get(body, "rooms");
    if (!json_is_object(rooms)) return NULL;
    const char *rid;
    json_t *rv;
    json_object_foreach(rooms, rid, rv) if (!e2ee_id_ok(rid) ||
                                            !sessions_ok(json_object_get(rv, "sessions")))
        return NULL;
    json_t *out = json_object();
    json_object_foreach(rooms, rid, rv) json_object_set(out, rid, json_object_get(rv, "sessions"));
    return out;
}

/* PUT /room_keys/keys[/{roomId}[/{sessionId}]]?version= */
static int put_keys(atrium_req *r)
{
    if (!auth_request(r)) return ATRIUM_DONE;
    json_t *body = http_req_json(r);
    if (!body) return ATRIUM_DONE;
    int64_t version;
    if (!request_version(r, &version)) return ATRIUM_DONE;
    json_t *keys = normalize_put(body, http_req_param(r, "roomId"), http_req_param(r, "sessionId"));
    if (!keys)
        return http_respond_error(r, 400, "M_BAD_JSON",
                                  "The body is not session key backup data for this path");
    PGconn *c = e2ee_db_begin(r);
    if (!c) {
        json_decref(keys);
        return ATRIUM_DONE;
    }
    int64_t current = -1;
    int found = lock_version(c, r->user, version);
    int has_current = found > 0 ? current_version(c, r->user, &current) : found;
    if (found < 0 || has_current < 0) {
        json_decref(keys);
        return finish(r, c, NULL);
    }
    if (found == 0) {
        json_decref(keys);
        return fail(r, c, 404, "M_NOT_FOUND", BACKUP_NOT_FOUND);
    }
    if (current != version) {
        json_decref(keys);
        db_rollback(c);
        http_db_checkin(c);
        char cv[VERSION_TEXT_BYTES];
        version_text(current, cv);
        json_t *err = json_pack("{s:s, s:s, s:s}", "errcode", "M_WRONG_ROOM_KEYS_VERSION",
                                "error", "This is not the current backup version",
                                "current_version", cv);
        return http_respond_json(r, 403, err);
    }
    char v[VERSION_TEXT_BYTES];
    version_text(version, v);
    int changed = 0, rc = 0;
    const char *room;
    json_t *sessions;
    json_object_foreach(keys, room, sessions) {
        const char *session;
        json_t *data;
        json_object_foreach(sessions, session, data) {
            rc = put_one(c, r->user, v, room, session, data);
            if (rc < 0) break;
            changed += rc;
        }
        if (rc < 0) break;
    }
    json_decref(keys);
    if (rc < 0) return finish(r, c, NULL);
    return finish(r, c, etag_and_count(c, r->user, version, changed > 0));
}

/* The stored keys of a version (one room / one session when given) as
 * {room_id: {session_id: data}}; NULL on a DB failure. */
static json_t *read_keys(PGconn *c, const char *user, const char *v, const char *room,
                         const char *session)
{
    const char *p[4] = {user, v, room ? room : "", session ? session : ""};
    PGresult *res = e2ee_sql(c, PGRES_TUPLES_OK,
                             "SELECT room_id, session_id, key_json FROM e2ee_backup_keys"
                             " WHERE user_id = $1 AND version = $2::bigint"
                             " AND ($3 = '' OR room_id = $3) AND ($4 = '' OR session_id = $4)"
                             " ORDER BY room_id, session_id",
                             4, p);
    if (!res) return NULL;
    json_t *out = json_object();
    for (int i = 0; i < PQntuples(res); i++) {
        const char *rid = PQgetvalue(res, i, 0);
        json_t *per_room = json_object_get(out, rid);
        if (!per_room) {
            per_room = json_object();
            json_object_set_new(out, rid, per_room);
        }
        json_t *data = json_loads(PQgetvalue(res, i, 2), 0, NULL);
        if (data) json_object_set_new(per_room, PQgetvalue(res, i, 1), data);
    }
    PQclear(res);
    return out;
}

/* The start of reading or deleting keys: authenticate, read ?version=, begin, and lock
 * that version (404 when it does not exist). The connection in a transaction, with the
 * version in *version and as text in v; or NULL with the response set. */
static PGconn *open_keys_version(atrium_req *r, int64_t *version, char v[VERSION_TEXT_BYTES])
{
    if (!auth_request(r) || !request_version(r, version)) return NULL;
    PGconn *c = e2ee_db_begin(r);
    if (!c) return NULL;
    int found = lock_version(c, r->user, *version);
    if (found <= 0) {
        if (found < 0) finish(r, c, NULL);
        else fail(r, c, 404, "M_NOT_FOUND", BACKUP_NOT_FOUND);
        return NULL;
    }
    version_text(*version, v);
    return c;
}

/* GET /room_keys/keys[/{roomId}[/{sessionId}]]?version= */
static int get_keys(atrium_req *r)
{
    const char *room = http_req_param(r, "roomId"), *session = http_req_param(r, "sessionId");
    int64_t version;
    char v[VERSION_TEXT_BYTES];
    PGconn *c = open_keys_version(r, &version, v);
    if (!c) return ATRIUM_DONE;
    json_t *keys = read_keys(c, r->user, v, room, session);
    if (!keys) return finish(r, c, NULL);
    json_t *out;
    if (session) {
        out = json_incref(json_object_get(json_object_get(keys, room), session));
        if (!out) {
            json_decref(keys);
            return fail(r, c, 404, "M_NOT_FOUND", "No room key backed up for this session");
        }
    } else if (room) {
        json_t *sessions = json_object_get(keys, room);
        out = sessions ? json_pack("{s:O}", "sessions", sessions) : json_pack("{s:{}}", "sessions");
    } else {
        out = json_object();
        json_t *rooms = json_object();
        const char *rid;
        json_t *sessions;
        json_object_foreach(keys, rid, sessions)
            json_object_set_new(rooms, rid, json_pack("{s:O}", "sessions", sessions));
        json_object_set_new(out, "rooms", rooms);
    }
    json_decref(keys);
    return finish(r, c, out);
}

/* DELETE /room_keys/keys[/{roomId}[/{sessionId}]]?version= */
static int delete_keys(atrium_req *r)
{
    const char *room = http_req_param(r, "roomId"), *session = http_req_param(r, "sessionId");
    int64_t version;
    char v[VERSION_TEXT_BYTES];
    PGconn *c = open_keys_version(r, &version, v);
    if (!c) return ATRIUM_DONE;
    const char *p[4] = {r->user, v, room ? room : "", session ? session : ""};
    PGresult *res = e2ee_sql(c, PGRES_COMMAND_OK,
                             "DELETE FROM e2ee_backup_keys"
                             " WHERE user_id = $1 AND version = $2::bigint"
                             " AND ($3 = '' OR room_id = $3) AND ($4 = '' OR session_id = $4)",
                             4, p);
    if (!res) return finish(r, c, NULL);
    bool changed = atoll(PQcmdTuples(res)) > 0;
    PQclear(res);
    return finish(r, c, etag_and_count(c, r->user, version, changed));
}

int e2ee_backup_init(http_server *s)
{
#define VERSION_ "/_matrix/client/v3/room_keys/version"
#define KEYS_ "/_matrix/client/v3/room_keys/keys"
    static const atrium_route routes[] = {
        HTTP_ROUTE("GET", VERSION_, get_version, 0),
        HTTP_ROUTE("POST", VERSION_, post_version, 0),
        HTTP_ROUTE("GET", VERSION_ "/{version}", get_version, 0),
        HTTP_ROUTE("PUT", VERSION_ "/{version}", put_version, 0),
        HTTP_ROUTE("DELETE", VERSION_ "/{version}", delete_version, 0),
        HTTP_ROUTE("PUT", KEYS_, put_keys, 0),
        HTTP_ROUTE("GET", KEYS_, get_keys, 0),
        HTTP_ROUTE("DELETE", KEYS_, delete_keys, 0),
        HTTP_ROUTE("PUT", KEYS_ "/{roomId}", put_keys, 0),
        HTTP_ROUTE("GET", KEYS_ "/{roomId}", get_keys, 0),
        HTTP_ROUTE("DELETE", KEYS_ "/{roomId}", delete_keys, 0),
        HTTP_ROUTE("PUT", KEYS_ "/{roomId}/{sessionId}", put_keys, 0),
        HTTP_ROUTE("GET", KEYS_ "/{roomId}/{sessionId}", get_keys, 0),
        HTTP_ROUTE("DELETE", KEYS_ "/{roomId}/{sessionId}", delete_keys, 0),
    };
#undef KEYS_
#undef VERSION_
    return HTTP_ROUTES_ADD(s, routes, "core");
}
