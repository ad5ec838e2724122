/*
 * core/client/push/pushers.c - a user's pushers: GET /pushers lists them, POST /pushers/set
 * creates, updates or (kind null) deletes one.
 *
 * http pushers are delivered to by the push sender (push_send.c); email pushers are
 * stored and listed only. This file owns the rules of
 * pushers/set: which fields the spec requires and how long they may be, that an "http"
 * pusher's data.url is an http(s) URL whose path is /_matrix/push/v1/notify
 * (pusher_url_ok), that a pusher is keyed by (user, app_id, pushkey) so setting it again
 * updates it, that append: false (the default) removes every other user's pusher with the
 * same app_id and pushkey (the device changed hands), and that a user has at most
 * PUSHERS_PER_USER_MAX pushers (400 M_LIMIT_EXCEEDED beyond, as for push rules).
 *
 * MSC3881 (advertised as org.matrix.msc3881): pushers/set takes
 * `org.matrix.msc3881.enabled` (a boolean, true when absent) and GET /pushers lists it with
 * `org.matrix.msc3881.device_id`, the device the pusher belongs to, as Synapse names them. A
 * switched-off pusher is kept and listed but pushed nothing (push_send.c queues only for
 * enabled ones); switching it off drops what was queued for it, so switching it on again
 * pushes only what notifies from then on.
 *
 * Table (accounts migration 4): pushers (user_id, device_id, app_id, pushkey, kind,
 * app_display_name, device_display_name, profile_tag, lang, data jsonb, created_ts). A
 * pusher belongs to the device whose token set it; a foreign key on devices removes it
 * when that device is deleted or logged out, as Synapse does. Email pushers are stored
 * like http ones: this server has no third-party IDs to check the address against.
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/client/accounts/accounts.h"
#include "core/client/push/pushers.h"

#define PUSHERS_PER_USER_MAX 64
#define PUSHER_BODY_MAX_BYTES 8192      /* one pushers/set body */
#define PUSHER_PUSHKEY_MAX_BYTES 512    /* the spec's limit */
#define PUSHER_APP_ID_MAX_CHARS 64      /* the spec's limit */
#define PUSHER_PROFILE_TAG_MAX_CHARS 32 /* the spec's limit */
#define PUSHER_NAME_MAX_BYTES 256       /* app_display_name, device_display_name */
#define PUSHER_LANG_MAX_BYTES 64
#define PUSHER_URL_MAX_BYTES 2048
#define PUSHER_NOTIFY_PATH "/_matrix/push/v1/notify"
#define PUSHER_ENABLED_KEY "org.matrix.msc3881.enabled"
#define PUSHER_DEVICE_ID_KEY "org.matrix.msc3881.device_id"

/* One pushers/set request, its strings pointing into the body. */
typedef struct pusher_req {
    const char *pushkey, *app_id, *kind; /* kind NULL: delete */
    const char *app_display_name, *device_display_name, *profile_tag, *lang;
    json_t *data;
    bool append;
    bool enabled; /* MSC3881 */
} pusher_req;

/* Characters (code points) of a UTF-8 string: the spec counts app_id and profile_tag in
 * characters. */
static size_t utf8_chars(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        if (((unsigned char)*s & 0xC0) != 0x80) n++;
    return n;
}

/* Is url an http or https URL with a host and the push gateway's notify path (a query is
 * allowed, as gateways may use one)? No whitespace or control characters anywhere. */
static bool pusher_url_ok(const char *url)
{
    for (const char *c = url; *c; c++)
        if ((unsigned char)*c <= ' ' || *c == 0x7F) return false;
    const char *rest;
    if (strncasecmp(url, "https://", 8) == 0) rest = url + 8;
    else if (strncasecmp(url, "http://", 7) == 0) rest = url + 7;
    else return false;
    size_t host_len = strcspn(rest, "/?#");
    if (host_len == 0 || rest[host_len] != '/') return false;
    const char *path = rest + host_len;
    size_t path_len = strcspn(path, "?#");
    return path_len == strlen(PUSHER_NOTIFY_PATH) &&
           strncmp(path, PUSHER_NOTIFY_PATH, path_len) == 0;
}

/* A required string of at most max_chars characters (not bytes), non-empty. false after
 * answering. */
static bool chars_field(atrium_req *r, json_t *body, const char *key, bool required,
                        size_t max_chars, const char **out)
{
    if (!http_field_string(r, body, key, required, 0, out)) return false;
    if (*out && utf8_chars(*out) > max_chars) {
        http_respond_error(r, 400, "M_INVALID_PARAM", "'%s' is longer than %zu characters",
                           key, max_chars);
        return false;
    }
    return true;
}

/* The kind-specific part: data is an object; an http pusher's data.url is there and a
 * notify URL; data.format, when given, a string. false after answering. */
static bool pusher_data_ok(atrium_req *r, pusher_req *p, json_t *body)
{
    if (!http_field_object(r, body, "data", true, &p->data)) return false;
    const char *format, *url;
    if (!http_field_string(r, p->data, "format", false, 0, &format)) return false;
    if (strcmp(p->kind, "http") != 0) return true;
    if (!http_field_string(r, p->data, "url", true, PUSHER_URL_MAX_BYTES, &url)) return false;
    if (!pusher_url_ok(url)) {
        http_respond_error(r, 400, "M_INVALID_PARAM", "'url' must be an http(s) URL with the "
                           "path " PUSHER_NOTIFY_PATH);
        return false;
    }
    return true;
}

/* MSC3881's switch: a boolean when present, true when absent. false after answering. */
static bool pusher_enabled(atrium_req *r, pusher_req *p, json_t *body)
{
    json_t *v = json_object_get(body, PUSHER_ENABLED_KEY);
    p->enabled = true;
    if (!v) return true;
    if (!json_is_boolean(v)) {
        http_respond_error(r, 400, "M_BAD_JSON", "'" PUSHER_ENABLED_KEY "' must be a boolean");
        return false;
    }
    p->enabled = json_is_true(v);
    return true;
}

/* Read and check a pushers/set body into p. false after answering. */
static bool read_pusher(atrium_req *r, json_t *body, pusher_req *p)
{
    *p = (pusher_req){0};
    if (!http_field_string(r, body, "pushkey", true, PUSHER_PUSHKEY_MAX_BYTES, &p->pushkey) ||
        !chars_field(r, body, "app_id", true, PUSHER_APP_ID_MAX_CHARS, &p->app_id))
        return false;
    if (!p->pushkey[0] || !p->app_id[0]) {
        http_respond_error(r, 400, "M_INVALID_PARAM", "'pushkey' and 'app_id' must not be empty");
        return false;
    }
    json_t *kind = json_object_get(body, "kind");
    if (!kind) {
        http_respond_error(r, 400, "M_MISSING_PARAM", "Missing 'kind' (null deletes)");
        return false;
    }
    if (json_is_null(kind)) return true; /* a deletion needs nothing else */
    if (!http_field_string(r, body, "kind", true, 0, &p->kind)) return false;
    if (strcmp(p->kind, "http") != 0 && strcmp(p->kind, "email") != 0) {
        http_respond_error(r, 400, "M_INVALID_PARAM", "'kind' must be http, email or null");
        return false;
    }
    return http_field_string(r, body, "app_display_name", true, PUSHER_NAME_MAX_BYTES,
                      &p->app_display_name) &&
           http_field_string(r, body, "device_display_name", true, PUSHER_NAME_MAX_BYTES,
                      &p->device_display_name) &&
           chars_field(r, body, "profile_tag", false, PUSHER_PROFILE_TAG_MAX_CHARS,
                       &p->profile_tag) &&
           http_field_string(r, body, "lang", true, PUSHER_LANG_MAX_BYTES, &p->lang) &&
           http_field_bool(r, body, "append", false, &p->append) && pusher_enabled(r, p, body) &&
           pusher_data_ok(r, p, body);
}

typedef enum { PUSHER_SET_OK, PUSHER_SET_FULL, PUSHER_SET_DB } pusher_set_result;

/* Inside an open transaction: store (or, kind NULL, delete) r->user's pusher p, keeping
 * the cap and the append rule. */
static pusher_set_result set_in_tx(PGconn *c, atrium_req *r, const pusher_req *p,
                                   const char *data_text)
{
    const char *key[3] = {r->user, p->app_id, p->pushkey};
    const char *const *app_key = key + 1; /* (app_id, pushkey) */
    if (!p->kind)
        return db_exec(c, "DELETE FROM pushers WHERE user_id = $1 AND app_id = $2"
                          " AND pushkey = $3", 3, key)
                   ? PUSHER_SET_OK
                   : PUSHER_SET_DB;
    /* The user's row queues their own calls (the cap); the advisory lock queues calls of
     * any user for this (app_id, pushkey) (the append rule). Always in this order. */
    if (!db_exec(c, "SELECT FROM users WHERE user_id = $1 FOR NO KEY UPDATE", 1, key) ||
        !db_exec(c, "SELECT pg_advisory_xact_lock(" DB_LOCK_CLASS_PUSHERS ","
                    " hashtext($1 || chr(10) || $2))", 2, app_key))
        return PUSHER_SET_DB;
    PGresult *res = acc_q(c, "SELECT count(*) FILTER (WHERE NOT (app_id = $2 AND pushkey = $3))"
                             " FROM pushers WHERE user_id = $1", 3, key);
    if (!res) return PUSHER_SET_DB;
    long others = strtol(PQgetvalue(res, 0, 0), NULL, 10);
    PQclear(res);
    if (others >= PUSHERS_PER_USER_MAX) return PUSHER_SET_FULL;
    if (!p->append && !db_exec(c, "DELETE FROM pushers WHERE app_id = $2 AND pushkey = $3"
                                  " AND user_id <> $1", 3, key))
        return PUSHER_SET_DB;
    /* A pusher switched off loses what was queued for it (MSC3881: it is pushed only what
     * notifies while it is on). */
    if (!p->enabled && !db_exec(c, "DELETE FROM push_queue WHERE user_id = $1 AND app_id = $2"
                                   " AND pushkey = $3", 3, key))
        return PUSHER_SET_DB;
    const char *v[11] = {r->user, p->app_id, p->pushkey, r->device, p->kind,
                         p->app_display_name, p->device_display_name, p->profile_tag, p->lang,
                         data_text, p->enabled ? "t" : "f"};
    return db_exec(c, "INSERT INTO pushers (user_id, app_id, pushkey, device_id, kind,"
                      " app_display_name, device_display_name, profile_tag, lang, data,"
                      " enabled, created_ts) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9,"
                      " $10::jsonb, $11, (extract(epoch from now()) * 1000)::bigint)"
                      " ON CONFLICT (user_id, app_id, pushkey) DO UPDATE SET"
                      " device_id = $4, kind = $5, app_display_name = $6,"
                      " device_display_name = $7, profile_tag = $8, lang = $9, data = $10::jsonb,"
                      " enabled = $11",
                   11, v)
               ? PUSHER_SET_OK
               : PUSHER_SET_DB;
}

/* POST /_matrix/client/v3/pushers/set */
static int post_pusher_set(atrium_req *r)
{
    if (!auth_request(r)) return ATRIUM_DONE;
    json_t *body = http_req_json(r);
    pusher_req p;
    if (!body || !read_pusher(r, body, &p)) return ATRIUM_DONE;
    char *data_text = p.data ? json_dumps(p.data, JSON_COMPACT) : NULL;
    if (p.data && !data_text) return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    PGconn *c = http_db_checkout(r);
    if (!c) {
        free(data_text);
        return ATRIUM_DONE;
    }
    pusher_set_result rc = PUSHER_SET_DB;
    if (db_begin(c)) {
        rc = set_in_tx(c, r, &p, data_text);
        if (rc == PUSHER_SET_OK && !db_commit(c)) rc = PUSHER_SET_DB;
        if (rc != PUSHER_SET_OK) db_rollback(c);
    }
    http_db_checkin(c);
    free(data_text);
    if (rc == PUSHER_SET_FULL)
        return http_respond_error(r, 400, "M_LIMIT_EXCEEDED",
                                  "At most %d pushers per user; remove one first",
                                  PUSHERS_PER_USER_MAX);
    if (rc != PUSHER_SET_OK) return acc_db_failed(r);
    return http_respond_json(r, 200, json_object());
}

/* One row of the listing query as the spec's Pusher object. */
static json_t *pusher_json(PGresult *res, int row)
{
    json_t *data = json_loads(PQgetvalue(res, row, 7), 0, NULL);
    json_t *p = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:o}", "pushkey",
                          PQgetvalue(res, row, 0), "kind", PQgetvalue(res, row, 1), "app_id",
                          PQgetvalue(res, row, 2), "app_display_name", PQgetvalue(res, row, 3),
                          "device_display_name", PQgetvalue(res, row, 4), "lang",
                          PQgetvalue(res, row, 6), "data", data ? data : json_object());
    if (p && !PQgetisnull(res, row, 5))
        json_object_set_new(p, "profile_tag", json_string(PQgetvalue(res, row, 5)));
    if (p) {
        json_object_set_new(p, PUSHER_ENABLED_KEY, json_boolean(PQgetvalue(res, row, 8)[0] == 't'));
        json_object_set_new(p, PUSHER_DEVICE_ID_KEY,
                            PQgetisnull(res, row, 9) ? json_null()
                                                     : json_string(PQgetvalue(res, row, 9)));
    }
    return p;
}

/* GET /_matrix/client/v3/pushers */
static int get_pushers(atrium_req *r)
{
    if (!auth_request(r)) return ATRIUM_DONE;
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    const char *p[1] = {r->user};
    PGresult *res = acc_q(c, "SELECT pushkey, kind, app_id, app_display_name,"
                             " device_display_name, profile_tag, lang, data::text,"
                             " enabled, device_id"
                             " FROM pushers WHERE user_id = $1"
                             " ORDER BY created_ts, app_id, pushkey",
                          1, p);
    http_db_checkin(c);
    if (!res) return acc_db_failed(r);
    json_t *list = json_array();
    for (int i = 0; list && i < PQntuples(res); i++)
        if (json_array_append_new(list, pusher_json(res, i)) < 0) {
            json_decref(list);
            list = NULL;
        }
    PQclear(res);
    json_t *body = list ? json_pack("{s:o}", "pushers", list) : NULL;
    if (!body) return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    return http_respond_json(r, 200, body);
}

int pushers_routes(http_server *s)
{
    if (client_route(s, "GET", "/_matrix/client/v3/pushers", get_pushers, 0) < 0 ||
        client_route(s, "POST", "/_matrix/client/v3/pushers/set", post_pusher_set,
                     PUSHER_BODY_MAX_BYTES) < 0 ||
        notifications_routes(s) < 0)
        return -1;
    return 0;
}
