/*
 * core/client/reports/reports.c - the reports module (reports.h says what it keeps) and
 * its client endpoints: POST /_matrix/client/v3/rooms/{roomId}/report/{eventId} (reason,
 * score), /rooms/{roomId}/report (spec v1.13, MSC4151) and /users/{userId}/report (spec
 * v1.14), each answered {} once the report is stored.
 *
 * What may be reported, else 404 M_NOT_FOUND as the spec allows ("Reporting content"):
 * an event the reporter may see under history visibility (core/rooms/rooms_vis.c; the
 * spec's "joined" read as Synapse reads it: a member who left or was kicked may still
 * report what they saw); a room this server knows (the reporter need not be in it, as
 * the spec says); a user of this server who exists, or any user of another server (this
 * server cannot tell). Bad input is 400: a reason that is not a string (M_BAD_JSON),
 * longer than REPORTS_MAX_REASON_CHARS (M_INVALID_PARAM: refused, not cut), a score that
 * is not an integer in [-100, 0] (M_BAD_JSON). The reason is optional for an event, as
 * the spec has it, and required for rooms and users. Reports count against the message
 * rate limiter of the reporter (core/client/ratelimits.h). Not done: hiding whether an
 * event, room or user exists (the spec's optional 200 and random delay).
 */
#include <stdlib.h>
#include <string.h>

#include "core/client/auth/auth.h"
#include "core/client/accounts/accounts.h"
#include "core/client/ratelimits.h"
#include "core/client/reports/reports.h"
#include "core/client/rooms/crooms_api.h"

static const atrium_migration REPORTS_MIGRATIONS[] = {
    {1, "reports_table",
     "CREATE TABLE reports ("
     " id bigserial PRIMARY KEY,"
     " kind text NOT NULL CHECK (kind IN ('event', 'room', 'user')),"
     " received_ts bigint NOT NULL,"
     " reporter text NOT NULL,"
     " room_id text,"
     " event_id text,"
     " target_user_id text,"
     " reason text,"
     " score integer);"
     /* the admin API pages each kind by ID */
     "CREATE INDEX reports_kind_id ON reports (kind, id);"},
};

/* The number of Unicode code points of UTF-8 text s (jansson hands out valid UTF-8). */
static size_t utf8_chars(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        if (((unsigned char)*s & 0xC0) != 0x80) n++;
    return n;
}

/* The body's reason (NULL when absent and not required) and, when score is not NULL, its
 * score (*has_score false when absent). false after answering 400. */
static bool read_body(atrium_req *r, bool reason_required, const char **reason, int64_t *score,
                      bool *has_score)
{
    json_t *body = http_req_json(r);
    if (!body || !http_field_string(r, body, "reason", reason_required, 0, reason)) return false;
    if (*reason && utf8_chars(*reason) > REPORTS_MAX_REASON_CHARS) {
        http_respond_error(r, 400, "M_INVALID_PARAM", "'reason' is longer than %d characters",
                           REPORTS_MAX_REASON_CHARS);
        return false;
    }
    if (!score) return true;
    json_t *s = json_object_get(body, "score");
    *has_score = s != NULL && !json_is_null(s);
    if (!*has_score) return true;
    if (!json_is_integer(s) || json_integer_value(s) < REPORTS_SCORE_MIN ||
        json_integer_value(s) > REPORTS_SCORE_MAX) {
        http_respond_error(r, 400, "M_BAD_JSON", "'score' must be an integer from %d to %d",
                           REPORTS_SCORE_MIN, REPORTS_SCORE_MAX);
        return false;
    }
    *score = json_integer_value(s);
    return true;
}

/* Store one report on c (held by the caller, given back here) and answer {}, or 503. */
static int store(atrium_req *r, PGconn *c, const char *kind, const char *reporter,
                 const char *room_id, const char *event_id, const char *target,
                 const char *reason, const char *score)
{
    const char *p[8] = {kind, crooms_i64(r, rooms_wall_ms()), reporter, room_id, event_id,
                        target, reason, score};
    PGresult *res = rooms_q(c,
                            "INSERT INTO reports (kind, received_ts, reporter, room_id, event_id,"
                            " target_user_id, reason, score)"
                            " VALUES ($1, $2::bigint, $3, $4, $5, $6, $7, $8::integer)",
                            8, p, NULL);
    http_db_checkin(c);
    if (!res) return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    PQclear(res);
    return http_respond_json(r, 200, json_object());
}

/* Does rd's user see event_id of rd's room (visibility open on rd)? 1, 0, ROOMS_E_DB. */
static int event_visible(atrium_req *r, crooms_reader *rd, const char *event_id)
{
    const char *p[2 + ROOMS_VIS_PARAMS] = {event_id, rd->room}, *vis_sql;
    if (!rooms_vis_window(r->arena, &rd->vis, INT64_MIN, INT64_MAX, false, 3, &vis_sql, p + 2))
        return 0;
    const char *sql = rt_arena_printf(r->arena, "SELECT 1 FROM events e WHERE e.event_id = $1"
                                                " AND e.room_id = $2%s", vis_sql);
    PGresult *res = sql ? rooms_q(rd->c, sql, 2 + ROOMS_VIS_PARAMS, p, NULL) : NULL;
    if (!res) return ROOMS_E_DB;
    int n = PQntuples(res);
    PQclear(res);
    return n > 0;
}

/* POST /_matrix/client/v3/rooms/{roomId}/report/{eventId} {reason?, score?} */
static int post_report_event(atrium_req *r)
{
    crooms_reader rd = {0};
    if (!(rd.user = auth_request(r)) || !(rd.room = crooms_param_room(r))) return ATRIUM_DONE;
    const char *event_id = http_req_param(r, "eventId"), *reason = NULL;
    int64_t score = 0;
    bool has_score = false;
    if (!read_body(r, false, &reason, &score, &has_score)) return ATRIUM_DONE;
    if (ratelimit_refused(r, ratelimit_message())) return ATRIUM_DONE;
    if (!(rd.c = http_db_checkout(r))) return ATRIUM_DONE;
    rooms_err e = {0};
    int see = rooms_visibility(rd.c, rd.room, rd.user, &rd.vis, &e);
    if (see == ROOMS_OK) see = event_visible(r, &rd, event_id);
    if (see == ROOMS_E_DB) return crooms_reader_close(r, &rd, 503, NULL);
    if (see != 1) { /* unknown room, never a member, unknown or hidden event: alike */
        http_db_checkin(rd.c);
        return http_respond_error(r, 404, "M_NOT_FOUND",
                                  "The event was not found or you may not see it");
    }
    return store(r, rd.c, "event", rd.user, rd.room, event_id, NULL, reason,
                 has_score ? crooms_i64(r, score) : NULL);
}

/* POST /_matrix/client/v3/rooms/{roomId}/report {reason} */
static int post_report_room(atrium_req *r)
{
    const char *user = auth_request(r), *room = user ? crooms_param_room(r) : NULL, *reason;
    if (!room || !read_body(r, true, &reason, NULL, NULL)) return ATRIUM_DONE;
    if (ratelimit_refused(r, ratelimit_message())) return ATRIUM_DONE;
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    const char *p[1] = {room};
    PGresult *res = rooms_q(c, "SELECT 1 FROM rooms WHERE room_id = $1", 1, p, NULL);
    int known = res ? PQntuples(res) > 0 : -1;
    PQclear(res);
    if (known != 1) {
        http_db_checkin(c);
        return known < 0 ? http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry")
                         : http_respond_error(r, 404, "M_NOT_FOUND", "The room was not found");
    }
    return store(r, c, "room", user, room, NULL, NULL, reason, NULL);
}

/* POST /_matrix/client/v3/users/{userId}/report {reason} */
static int post_report_user(atrium_req *r)
{
    const char *user = auth_request(r), *target = http_req_param(r, "userId"), *reason;
    if (!user) return ATRIUM_DONE;
    if (!rooms_user_id_ok(target))
        return http_respond_error(r, 400, "M_INVALID_PARAM", "Not a user ID");
    if (!read_body(r, true, &reason, NULL, NULL)) return ATRIUM_DONE;
    if (ratelimit_refused(r, ratelimit_message())) return ATRIUM_DONE;
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    /* Another server's user: this server cannot tell whether they exist. */
    int known = strcmp(room_auth_domain(target), rooms_server_name()) != 0
                    ? 1
                    : acc_user_exists(c, target);
    if (known != 1) {
        http_db_checkin(c);
        return known < 0 ? http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry")
                         : http_respond_error(r, 404, "M_NOT_FOUND", "The user was not found");
    }
    return store(r, c, "user", user, NULL, NULL, target, reason, NULL);
}

static int reports_init(core_runtime *rt)
{
    http_server *s = rt->http;
    if (client_route(s, "POST", "/_matrix/client/v3/rooms/{roomId}/report/{eventId}",
                     post_report_event, REPORTS_MAX_BODY_BYTES) < 0 ||
        client_route(s, "POST", "/_matrix/client/v3/rooms/{roomId}/report", post_report_room,
                     REPORTS_MAX_BODY_BYTES) < 0 ||
        client_route(s, "POST", "/_matrix/client/v3/users/{userId}/report", post_report_user,
                     REPORTS_MAX_BODY_BYTES) < 0)
        return -1;
    return reports_admin_routes(s);
}

const client_module REPORTS_MODULE = {
    .owner = "reports",
    .migrations = REPORTS_MIGRATIONS,
    .n_migrations = sizeof(REPORTS_MIGRATIONS) / sizeof(REPORTS_MIGRATIONS[0]),
    .init = reports_init,
};
