/*
 * core/client/reports/reports_admin.c - the event reports for server admins, in the shape
 * of Synapse's admin API so existing tools read them: GET /_synapse/admin/v1/event_reports
 * (?from= offset, ?limit=, ?dir= "b" newest first (the default) or "f", ?room_id= and
 * ?user_id= (the reporter) matching a part of the ID, as Synapse matches them) answers
 * {"event_reports", "total", "next_token" while more follow}, and
 * GET /_synapse/admin/v1/event_reports/{reportId} one report with its event's JSON.
 *
 * Each report carries what Synapse's does: id, received_ts, room_id, event_id, user_id
 * (the reporter), reason, score, sender (the reported event's, null when it is no longer
 * stored), and the room's current name and canonical_alias (null when unset). Only server
 * admins (auth_is_admin) may read them: 403 M_FORBIDDEN otherwise. Not served: room and
 * user reports (stored, not listed yet), and deleting a report.
 */
#include <stdlib.h>
#include <string.h>

#include "atrium/parse.h"
#include "core/client/auth/auth.h"
#include "core/client/reports/reports.h"
#include "core/client/rooms/crooms_api.h"

#define REPORTS_ADMIN_DEFAULT_LIMIT 100
#define REPORTS_ADMIN_MAX_LIMIT 1000 /* a larger limit is served as this one */

/* The columns of one event report, FROM reports r (the event e joined). */
#define REPORT_COLUMNS                                                                     \
    "SELECT r.id, r.received_ts, r.room_id, r.event_id, r.reporter, r.reason, r.score,"    \
    " e.sender, e.pdu,"                                                                     \
    " (SELECT ne.pdu::jsonb -> 'content' ->> 'name' FROM current_state cs"                 \
    "  JOIN events ne ON ne.event_id = cs.event_id WHERE cs.room_id = r.room_id"            \
    "  AND cs.type = 'm.room.name' AND cs.state_key = '' AND ne.redacted_by IS NULL),"      \
    " (SELECT ae.pdu::jsonb -> 'content' ->> 'alias' FROM current_state cs"                \
    "  JOIN events ae ON ae.event_id = cs.event_id WHERE cs.room_id = r.room_id"            \
    "  AND cs.type = 'm.room.canonical_alias' AND cs.state_key = ''"                       \
    "  AND ae.redacted_by IS NULL)"                                                         \
    " FROM reports r LEFT JOIN events e ON e.event_id = r.event_id"

/* true when the caller is a server admin; false after answering (401, 403, 503). */
static bool admin_only(atrium_req *r)
{
    if (!auth_request(r)) return false;
    int admin = auth_is_admin(r);
    if (admin < 0) http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    else if (!admin) http_respond_error(r, 403, "M_FORBIDDEN", "You are not a server admin");
    return admin == 1;
}

/* Column col of row i as a JSON string, or null when NULL. */
static json_t *text_or_null(const PGresult *res, int i, int col)
{
    return PQgetisnull(res, i, col) ? json_null() : json_string(PQgetvalue(res, i, col));
}

/* Row i of a REPORT_COLUMNS result as Synapse shapes a report (with_event: event_json). */
static json_t *report_json(const PGresult *res, int i, bool with_event)
{
    json_t *o = json_pack("{s:I, s:I, s:o, s:o, s:o, s:o, s:o, s:o, s:o}",
                          "id", (json_int_t)strtoll(PQgetvalue(res, i, 0), NULL, 10),
                          "received_ts", (json_int_t)strtoll(PQgetvalue(res, i, 1), NULL, 10),
                          "room_id", text_or_null(res, i, 2), "event_id", text_or_null(res, i, 3),
                          "user_id", text_or_null(res, i, 4), "reason", text_or_null(res, i, 5),
                          "sender", text_or_null(res, i, 7), "name", text_or_null(res, i, 9),
                          "canonical_alias", text_or_null(res, i, 10));
    if (!o) return NULL;
    json_object_set_new(o, "score", PQgetisnull(res, i, 6)
                                        ? json_null()
                                        : json_integer(strtoll(PQgetvalue(res, i, 6), NULL, 10)));
    if (with_event) {
        json_t *ev = PQgetisnull(res, i, 8) ? NULL : json_loads(PQgetvalue(res, i, 8), 0, NULL);
        json_object_set_new(o, "event_json", ev ? ev : json_null());
    }
    return o;
}

/* An integer query parameter in [0, max] (def when absent; past max: max). false after
 * answering 400 M_INVALID_PARAM. */
static bool query_count(atrium_req *r, const char *name, int64_t def, int64_t max, int64_t *out)
{
    const char *v = http_req_query(r, name);
    *out = def;
    if (!v) return true;
    int rc = atrium_parse_int64(v, 0, max, out);
    if (rc == 0 || (rc == ATRIUM_E_LIMIT && *out == max)) return true;
    http_respond_error(r, 400, "M_INVALID_PARAM", "'%s' must be a non-negative integer", name);
    return false;
}

/* GET /_synapse/admin/v1/event_reports?from=&limit=&dir=&room_id=&user_id= */
static int get_reports(atrium_req *r)
{
    if (!admin_only(r)) return ATRIUM_DONE;
    int64_t from, limit;
    const char *dir = http_req_query(r, "dir");
    if (!query_count(r, "from", 0, INT64_MAX, &from) ||
        !query_count(r, "limit", REPORTS_ADMIN_DEFAULT_LIMIT, REPORTS_ADMIN_MAX_LIMIT, &limit))
        return ATRIUM_DONE;
    if (dir && strcmp(dir, "b") != 0 && strcmp(dir, "f") != 0)
        return http_respond_error(r, 400, "M_INVALID_PARAM", "'dir' must be \"b\" or \"f\"");
    bool forward = dir && dir[0] == 'f';
    const char *p[4] = {http_req_query(r, "room_id"), http_req_query(r, "user_id"),
                        crooms_i64(r, from), crooms_i64(r, limit)};
    const char *where = " WHERE r.kind = 'event'"
                        " AND ($1::text IS NULL OR strpos(r.room_id, $1) > 0)"
                        " AND ($2::text IS NULL OR strpos(r.reporter, $2) > 0)";
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    PGresult *count = rooms_q(c, rt_arena_printf(r->arena, "SELECT count(*) FROM reports r%s",
                                                 where),
                              2, p, NULL);
    PGresult *res = !count ? NULL
                           : rooms_q(c, rt_arena_printf(r->arena, REPORT_COLUMNS "%s ORDER BY"
                                                                  " r.id %s OFFSET $3::bigint"
                                                                  " LIMIT $4::bigint",
                                                        where, forward ? "ASC" : "DESC"),
                                     4, p, NULL);
    http_db_checkin(c);
    if (!res) {
        PQclear(count);
        return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    }
    int64_t total = strtoll(PQgetvalue(count, 0, 0), NULL, 10);
    PQclear(count);
    json_t *list = json_array();
    for (int i = 0; i < PQntuples(res); i++)
        json_array_append_new(list, report_json(res, i, false));
    json_t *body = json_pack("{s:o, s:I}", "event_reports", list, "total", (json_int_t)total);
    int64_t next = from + PQntuples(res);
    if (PQntuples(res) > 0 && next < total)
        json_object_set_new(body, "next_token", json_integer(next));
    PQclear(res);
    return http_respond_json(r, 200, body);
}

/* GET /_synapse/admin/v1/event_reports/{reportId} */
static int get_report(atrium_req *r)
{
    if (!admin_only(r)) return ATRIUM_DONE;
    int64_t id;
    if (atrium_parse_int64(http_req_param(r, "reportId"), 1, INT64_MAX, &id) != 0)
        return http_respond_error(r, 400, "M_INVALID_PARAM",
                                  "The report ID must be a positive integer");
    const char *p[1] = {crooms_i64(r, id)};
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    PGresult *res = rooms_q(c, REPORT_COLUMNS " WHERE r.kind = 'event' AND r.id = $1::bigint", 1,
                            p, NULL);
    http_db_checkin(c);
    if (!res) return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    if (PQntuples(res) == 0) {
        PQclear(res);
        return http_respond_error(r, 404, "M_NOT_FOUND", "No such event report");
    }
    json_t *body = report_json(res, 0, true);
    PQclear(res);
    return body ? http_respond_json(r, 200, body)
                : http_respond_error(r, 503, "M_UNKNOWN", "Out of memory; retry");
}

int reports_admin_routes(http_server *s)
{
    return client_route(s, "GET", "/_synapse/admin/v1/event_reports", get_reports, 0) < 0 ||
                   client_route(s, "GET", "/_synapse/admin/v1/event_reports/{reportId}",
                                get_report, 0) < 0
               ? -1
               : 0;
}
