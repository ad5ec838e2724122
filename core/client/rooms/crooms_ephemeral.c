/*
 * core/client/rooms/crooms_ephemeral.c - what members say about a room without events: receipts
 * (POST /rooms/{roomId}/receipt/{receiptType}/{eventId}), read markers
 * (POST /rooms/{roomId}/read_markers) and typing (PUT /rooms/{roomId}/typing/{userId}).
 *
 * Each is a row with a stream position (stream_next()) that /sync reports in the room's
 * `ephemeral` (receipts, typing) or `account_data` (m.fully_read) once it is newer than the
 * client's token; after the commit the room's members are woken (only the user for private
 * receipts and read markers). Public receipts and typing also go to the room's other
 * servers (crooms_edus.c). Only joined members may send them. Typing lasts at most
 * TYPING_MAX_TIMEOUT_MS; when it runs out, the typing reaper (crooms_typing.c) reports it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/auth/auth.h"
#include "core/client/rooms/crooms_api.h"
#include "core/client/sync/notifier.h"

#define TYPING_MAX_TIMEOUT_MS (2 * 60 * 1000)
#define TYPING_DEFAULT_TIMEOUT_MS 30000

/* The caller must be joined; the event (when given) must be one they may see. false after
 * answering; c stays held. */
static bool may_mark(atrium_req *r, PGconn *c, const char *room, const char *user, const char *event_id)
{
    char m[16];
    if (rooms_membership_at(c, room, user, INT64_MAX, m, NULL) < 0) {
        http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
        return false;
    }
    if (strcmp(m, "join") != 0) {
        bool failed;
        if (!rooms_version_of(c, room, &failed) && !failed)
            http_respond_error(r, 404, "M_NOT_FOUND", "Unknown room");
        else
            http_respond_error(r, 403, "M_FORBIDDEN", "You are not in this room");
        return false;
    }
    if (!event_id) return true;
    const char *p[2] = {event_id, room};
    PGresult *res = rooms_q(c, "SELECT 1 FROM events WHERE event_id = $1 AND room_id = $2", 2, p, NULL);
    if (!res) {
        http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
        return false;
    }
    int n = PQntuples(res);
    PQclear(res);
    if (n == 0) http_respond_error(r, 404, "M_NOT_FOUND", "No such event in this room");
    return n > 0;
}

static bool store_receipt(PGconn *c, const char *room, const char *user, const char *type,
                          const char *thread, const char *event_id, const char *ts)
{
    const char *p[6] = {room, user, type, thread, event_id, ts};
    return db_exec(c,
                   "INSERT INTO receipts (room_id, user_id, receipt_type, thread_id, event_id, ts,"
                   " stream_pos) VALUES ($1, $2, $3, $4, $5, $6, stream_next())"
                   " ON CONFLICT (room_id, user_id, receipt_type, thread_id) DO UPDATE"
                   " SET event_id = EXCLUDED.event_id, ts = EXCLUDED.ts,"
                   " stream_pos = EXCLUDED.stream_pos",
                   6, p);
}

/* m.fully_read is room account data (the accounts module's table and contract). */
static bool store_fully_read(PGconn *c, const char *room, const char *user, const char *event_id)
{
    json_t *content = json_pack("{s:s}", "event_id", event_id);
    char *text = json_dumps(content, JSON_COMPACT);
    json_decref(content);
    const char *p[3] = {user, room, text};
    bool ok = text && db_exec(c,
                              "INSERT INTO account_data (user_id, room_id, type, content, stream_pos)"
                              " VALUES ($1, $2, 'm.fully_read', $3::jsonb, stream_next())"
                              " ON CONFLICT (user_id, room_id, type) DO UPDATE"
                              " SET content = EXCLUDED.content, stream_pos = EXCLUDED.stream_pos",
                              3, p);
    free(text);
    return ok;
}

static bool is_receipt_type(const char *t)
{
    return strcmp(t, "m.read") == 0 || strcmp(t, "m.read.private") == 0;
}

/* POST /_matrix/client/v3/rooms/{roomId}/receipt/{receiptType}/{eventId} */
static int post_receipt(atrium_req *r)
{
    const char *user = auth_request(r);
    if (!user) return ATRIUM_DONE;
    const char *room = crooms_param_room(r);
    const char *type = http_req_param(r, "receiptType"), *event_id = http_req_param(r, "eventId");
    if (!room) return ATRIUM_DONE;
    if (!is_receipt_type(type) && strcmp(type, "m.fully_read") != 0)
        return http_respond_error(r, 400, "M_INVALID_PARAM", "Unknown receipt type");
    json_t *body = r->body_len ? http_req_json(r) : (r->json = json_object());
    const char *thread;
    if (!body || !http_field_string(r, body, "thread_id", false, EVENT_MAX_ID_BYTES, &thread)) return ATRIUM_DONE;
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    if (!may_mark(r, c, room, user, event_id)) {
        http_db_checkin(c);
        return ATRIUM_DONE;
    }
    bool ok = strcmp(type, "m.fully_read") == 0
                  ? store_fully_read(c, room, user, event_id)
                  : store_receipt(c, room, user, type, thread ? thread : "", event_id,
                                  crooms_i64(r, rooms_wall_ms()));
    if (ok) {
        if (strcmp(type, "m.read") == 0) notifier_wake_room(c, room);
        else notifier_wake_user(user);
        if (strcmp(type, "m.read") == 0) /* public: the room's other servers hear of it */
            crooms_edu_receipt(c, room, user, event_id, crooms_i64(r, rooms_wall_ms()),
                              thread ? thread : "");
    }
    http_db_checkin(c);
    if (!ok) return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    return http_respond_json(r, 200, json_object());
}

/* POST /_matrix/client/v3/rooms/{roomId}/read_markers */
static int post_read_markers(atrium_req *r)
{
    const char *user = auth_request(r);
    if (!user) return ATRIUM_DONE;
    const char *room = crooms_param_room(r);
    json_t *body = room ? http_req_json(r) : NULL;
    if (!body) return ATRIUM_DONE;
    const char *fully, *read, *priv;
    if (!http_field_string(r, body, "m.fully_read", false, EVENT_MAX_ID_BYTES, &fully) ||
        !http_field_string(r, body, "m.read", false, EVENT_MAX_ID_BYTES, &read) ||
        !http_field_string(r, body, "m.read.private", false, EVENT_MAX_ID_BYTES, &priv))
        return ATRIUM_DONE;
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    int out = ATRIUM_DONE; /* may_mark answered */
    const char *ids[3] = {fully, read, priv};
    for (int i = 0; i < 3; i++)
        if (ids[i] && !may_mark(r, c, room, user, ids[i])) goto out;
    if (!fully && !read && !priv && !may_mark(r, c, room, user, NULL)) goto out;
    const char *ts = crooms_i64(r, rooms_wall_ms());
    bool ok = db_begin(c);
    if (ok && fully) ok = store_fully_read(c, room, user, fully);
    if (ok && read) ok = store_receipt(c, room, user, "m.read", "", read, ts);
    if (ok && priv) ok = store_receipt(c, room, user, "m.read.private", "", priv, ts);
    ok = ok && db_commit(c);
    if (!ok) db_rollback(c);
    if (ok && read) notifier_wake_room(c, room);
    else if (ok) notifier_wake_user(user);
    if (ok && read) crooms_edu_receipt(c, room, user, read, ts, "");
    out = ok ? http_respond_json(r, 200, json_object())
             : http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
out:
    http_db_checkin(c);
    return out;
}

/* PUT /_matrix/client/v3/rooms/{roomId}/typing/{userId} */
static int put_typing(atrium_req *r)
{
    const char *user = auth_request(r);
    if (!user) return ATRIUM_DONE;
    const char *room = crooms_param_room(r), *who = http_req_param(r, "userId");
    json_t *body = room ? http_req_json(r) : NULL;
    if (!body) return ATRIUM_DONE;
    if (strcmp(who, user) != 0)
        return http_respond_error(r, 403, "M_FORBIDDEN", "You can only set your own typing state");
    json_t *typing = json_object_get(body, "typing"), *timeout = json_object_get(body, "timeout");
    if (!json_is_boolean(typing))
        return http_respond_error(r, 400, "M_BAD_JSON", "'typing' must be true or false");
    if (timeout && !json_is_integer(timeout))
        return http_respond_error(r, 400, "M_BAD_JSON", "'timeout' must be an integer (milliseconds)");
    int64_t ms = timeout ? json_integer_value(timeout) : TYPING_DEFAULT_TIMEOUT_MS;
    if (ms < 0) ms = 0;
    if (ms > TYPING_MAX_TIMEOUT_MS) ms = TYPING_MAX_TIMEOUT_MS;
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    if (!may_mark(r, c, room, user, NULL)) {
        http_db_checkin(c);
        return ATRIUM_DONE;
    }
    const char *p[3] = {room, user, crooms_i64(r, json_is_true(typing) ? rooms_wall_ms() + ms : 0)};
    bool ok = db_exec(c,
                      "INSERT INTO typing (room_id, user_id, expires_ts, stream_pos)"
                      " VALUES ($1, $2, $3, stream_next()) ON CONFLICT (room_id, user_id)"
                      " DO UPDATE SET expires_ts = EXCLUDED.expires_ts, stream_pos = EXCLUDED.stream_pos",
                      3, p);
    if (ok) notifier_wake_room(c, room);
    if (ok) crooms_edu_typing(c, room, user, json_is_true(typing));
    if (ok && json_is_true(typing)) crooms_typing_expires_at(c, atoll(p[2]));
    http_db_checkin(c);
    if (!ok) return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    return http_respond_json(r, 200, json_object());
}

int crooms_ephemeral_routes(http_server *s)
{
    if (client_route(s, "POST", "/_matrix/client/v3/rooms/{roomId}/receipt/{receiptType}/{eventId}",
                     post_receipt, CROOMS_MAX_BODY_BYTES) < 0 ||
        client_route(s, "POST", "/_matrix/client/v3/rooms/{roomId}/read_markers", post_read_markers,
                     CROOMS_MAX_BODY_BYTES) < 0 ||
        client_route(s, "PUT", "/_matrix/client/v3/rooms/{roomId}/typing/{userId}", put_typing,
                     CROOMS_MAX_BODY_BYTES) < 0)
        return -1;
    return 0;
}
