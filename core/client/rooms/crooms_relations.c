/*
 * core/client/rooms/crooms_relations.c - the relation endpoints (spec v1.11):
 *   GET /_matrix/client/v1/rooms/{roomId}/relations/{eventId}[/{relType}[/{eventType}]]
 *   GET /_matrix/client/v1/rooms/{roomId}/threads
 *
 * Both read the event_relations index (crooms_bundle.c fills it at write time) and answer
 * like the other readers: 403 to a user who was never joined, 404 for an unknown room or a
 * parent event the user may not see, and only events rooms_vis_window shows
 * (core/rooms/rooms_vis.c owns the history visibility rule). Pagination tokens are stream
 * positions ("s<N>", the tokens of /messages and /sync): backwards from `from` means
 * positions <= N, forwards positions > N. /relations orders by position; with recurse=true
 * it also follows relations of relations, up to RELATIONS_RECURSE_DEPTH levels
 * (recursion_depth in the answer). /threads orders threads by their newest visible thread
 * event, newest first; a token there is that position. Each page's events get their bundled
 * aggregations from crooms_bundle_add. Not here: what a bundle holds (crooms_bundle.c),
 * storing relations.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/auth/auth.h"
#include "core/client/rooms/crooms_relations.h"
#include "atrium/parse.h"

#define RELATIONS_DEFAULT_LIMIT 5
#define RELATIONS_MAX_LIMIT 100
#define RELATIONS_RECURSE_DEPTH 3 /* levels of relations followed with recurse=true */
#define THREADS_DEFAULT_LIMIT 5
#define THREADS_MAX_LIMIT 100

bool crooms_relations_limit(const char *text, int64_t def, int64_t max, int64_t *out)
{
    *out = def;
    if (!text) return true;
    int64_t x;
    int rc = atrium_parse_int64(text, 0, max, &x); /* past max: clamped to max */
    if (rc == ATRIUM_E_INVAL || text[0] == '-') return false;
    *out = x;
    if (*out < 1) *out = 1; /* an empty page would end the pagination */
    return true;
}

static int bad_param(atrium_req *r, const char *why)
{
    return http_respond_error(r, 400, "M_INVALID_PARAM", "%s", why);
}

static int db_failed(atrium_req *r, crooms_reader *rd, json_t *garbage)
{
    json_decref(garbage);
    return crooms_reader_close(r, rd, 503, NULL);
}

/* Render the first `keep` rows of res into array out. */
static void render_rows(const crooms_reader *rd, PGresult *res, int keep, json_t *out)
{
    for (int i = 0; i < keep; i++) {
        json_t *ev = events_render(&rd->view, res, i);
        if (ev) json_array_append_new(out, ev);
    }
}

/* Does the viewer see event_id of the room? 1 yes, 0 no (or unknown), ROOMS_E_DB. */
static int parent_visible(atrium_req *r, crooms_reader *rd, const char *event_id)
{
    const char *p[2 + ROOMS_VIS_PARAMS] = {event_id, rd->room}, *vis_sql;
    if (!rooms_vis_window(r->arena, &rd->vis, 0, INT64_MAX, false, 3, &vis_sql, p + 2)) return 0;
    const char *sql = rt_arena_printf(r->arena,
                                      "SELECT 1 FROM events e WHERE e.event_id = $1"
                                      " AND e.room_id = $2%s",
                                      vis_sql);
    PGresult *res = rooms_q(rd->c, sql, 2 + ROOMS_VIS_PARAMS, p, NULL);
    if (!res) return ROOMS_E_DB;
    int n = PQntuples(res);
    PQclear(res);
    return n > 0;
}

/* ---- /relations --------------------------------------------------------------------- */

/* $1 parent, $2 room, $3 depth, $4 rel_type or NULL, $5 event type or NULL, $6 limit + 1,
 * then the visibility window (which also bounds the positions). */
static const char RELATIONS_SQL[] =
    "WITH RECURSIVE tree (event_id, depth) AS ("
    " SELECT rel.event_id, 1 FROM event_relations rel"
    "  WHERE rel.relates_to = $1 AND rel.room_id = $2"
    " UNION ALL SELECT rel.event_id, t.depth + 1 FROM event_relations rel"
    "  JOIN tree t ON rel.relates_to = t.event_id WHERE t.depth < $3::int AND rel.room_id = $2) "
    EVENTS_SELECT "JOIN event_relations rel ON rel.event_id = e.event_id"
    " WHERE e.event_id IN (SELECT event_id FROM tree)"
    " AND ($4::text IS NULL OR rel.rel_type = $4) AND ($5::text IS NULL OR e.type = $5)%s"
    " ORDER BY e.stream_pos %s LIMIT $6";

/* GET /_matrix/client/v1/rooms/{roomId}/relations/{eventId}[/{relType}[/{eventType}]]
 *     ?from=&to=&limit=&dir=&recurse= */
static int get_relations(atrium_req *r)
{
    crooms_reader rd = {0};
    if (!(rd.user = auth_request(r)) || !(rd.room = crooms_param_room(r))) return ATRIUM_DONE;
    const char *parent = http_req_param(r, "eventId"), *rel_type = http_req_param(r, "relType");
    const char *ev_type = http_req_param(r, "eventType"), *dir = http_req_query(r, "dir");
    const char *from = http_req_query(r, "from"), *to = http_req_query(r, "to");
    const char *recurse = http_req_query(r, "recurse");
    if (dir && strcmp(dir, "b") != 0 && strcmp(dir, "f") != 0)
        return bad_param(r, "'dir' must be \"b\" or \"f\"");
    bool back = !dir || dir[0] == 'b';
    int64_t from_pos = back ? INT64_MAX : 0, to_pos = back ? 0 : INT64_MAX, limit;
    if ((from && !crooms_parse_token(from, &from_pos)) || (to && !crooms_parse_token(to, &to_pos)))
        return bad_param(r, "Not a pagination token of this server");
    if (!crooms_relations_limit(http_req_query(r, "limit"), RELATIONS_DEFAULT_LIMIT,
                               RELATIONS_MAX_LIMIT, &limit))
        return bad_param(r, "'limit' must be a non-negative integer");
    if (recurse && strcmp(recurse, "true") != 0 && strcmp(recurse, "false") != 0)
        return bad_param(r, "'recurse' must be true or false");
    bool deep = recurse && recurse[0] == 't';
    if (!parent || !*parent || strlen(parent) > EVENT_MAX_ID_BYTES)
        return bad_param(r, "Not an event ID");
    if (!crooms_reader_open(r, &rd)) return ATRIUM_DONE;
    int seen = parent_visible(r, &rd, parent);
    if (seen < 0) return db_failed(r, &rd, NULL);
    if (seen == 0) {
        http_db_checkin(rd.c);
        return http_respond_error(r, 404, "M_NOT_FOUND", "Event not found");
    }
    /* Backwards: after `to`, up to `from`, newest first; forwards the other way round. */
    int64_t lo = back ? to_pos : from_pos, hi = back ? from_pos : to_pos;
    json_t *chunk = json_array();
    const char *p[6 + ROOMS_VIS_PARAMS] = {parent, rd.room,
                                           crooms_i64(r, deep ? RELATIONS_RECURSE_DEPTH : 1),
                                           rel_type, ev_type, crooms_i64(r, limit + 1)};
    const char *vis_sql;
    int64_t last = 0;
    bool more = false;
    if (rooms_vis_window(r->arena, &rd.vis, lo, hi, false, 7, &vis_sql, p + 6)) {
        const char *sql = rt_arena_printf(r->arena, RELATIONS_SQL, vis_sql, back ? "DESC" : "ASC");
        PGresult *res = rooms_q(rd.c, sql, 6 + ROOMS_VIS_PARAMS, p, NULL);
        if (!res) return db_failed(r, &rd, chunk);
        int rows = PQntuples(res), keep = rows > limit ? (int)limit : rows;
        more = rows > limit;
        render_rows(&rd, res, keep, chunk);
        if (keep > 0) last = events_pos(res, keep - 1);
        PQclear(res);
    }
    if (crooms_bundle_add(rd.c, r->arena, &rd.view, rd.room, &rd.vis, chunk) < 0)
        return db_failed(r, &rd, chunk);
    json_t *body = json_pack("{s:o}", "chunk", chunk);
    const char *next = crooms_token(r, back ? last - 1 : last);
    if (more) json_object_set_new(body, "next_batch", json_string(next));
    if (from) json_object_set_new(body, "prev_batch", json_string(from));
    if (deep) json_object_set_new(body, "recursion_depth", json_integer(RELATIONS_RECURSE_DEPTH));
    return crooms_reader_close(r, &rd, 200, body);
}

/* ---- /threads ----------------------------------------------------------------------- */

/* Thread roots by their newest visible thread event: $1 room, $2 newest position allowed,
 * $3 only threads the viewer took part in, $4 viewer, $5 limit + 1, then the visibility
 * condition twice (on the thread events, then on the root). */
static const char THREADS_SQL[] =
    "SELECT t.root, t.latest FROM (SELECT rel.relates_to AS root, max(e.stream_pos) AS latest"
    "  FROM event_relations rel JOIN events e ON e.event_id = rel.event_id"
    "  WHERE rel.room_id = $1 AND rel.rel_type = 'm.thread'%s GROUP BY rel.relates_to) t"
    " JOIN events e ON e.event_id = t.root"
    " WHERE e.room_id = $1 AND t.latest <= $2::bigint%s"
    " AND (NOT $3::boolean OR e.sender = $4 OR EXISTS (SELECT 1 FROM event_relations x"
    "  WHERE x.relates_to = t.root AND x.room_id = $1 AND x.rel_type = 'm.thread'"
    "  AND x.sender = $4))"
    " ORDER BY t.latest DESC LIMIT $5";

/* The roots named by the first `keep` rows of `threads`, rendered, in that order. */
static int render_roots(atrium_req *r, crooms_reader *rd, PGresult *threads, int keep, json_t *out)
{
    json_t *ids = json_array();
    for (int i = 0; i < keep; i++)
        json_array_append_new(ids, json_string(PQgetvalue(threads, i, 0)));
    const char *p[1] = {rooms_pg_array(r->arena, ids)};
    json_decref(ids);
    if (!p[0]) return ROOMS_E_DB;
    PGresult *res = rooms_q(rd->c, EVENTS_SELECT "WHERE e.event_id = ANY($1::text[])", 1, p, NULL);
    if (!res) return ROOMS_E_DB;
    json_t *by_id = json_object();
    for (int i = 0; i < PQntuples(res); i++) {
        json_t *ev = events_render(&rd->view, res, i);
        if (ev) json_object_set_new(by_id, json_string_value(json_object_get(ev, "event_id")), ev);
    }
    PQclear(res);
    for (int i = 0; i < keep; i++) {
        json_t *ev = json_object_get(by_id, PQgetvalue(threads, i, 0));
        if (ev) json_array_append(out, ev);
    }
    json_decref(by_id);
    return ROOMS_OK;
}

/* GET /_matrix/client/v1/rooms/{roomId}/threads?include=&from=&limit= */
static int get_threads(atrium_req *r)
{
    crooms_reader rd = {0};
    if (!(rd.user = auth_request(r)) || !(rd.room = crooms_param_room(r))) return ATRIUM_DONE;
    const char *include = http_req_query(r, "include"), *from = http_req_query(r, "from");
    if (include && strcmp(include, "all") != 0 && strcmp(include, "participated") != 0)
        return bad_param(r, "'include' must be \"all\" or \"participated\"");
    int64_t from_pos = INT64_MAX, limit;
    if (from && !crooms_parse_token(from, &from_pos))
        return bad_param(r, "Not a pagination token of this server");
    if (!crooms_relations_limit(http_req_query(r, "limit"), THREADS_DEFAULT_LIMIT,
                               THREADS_MAX_LIMIT, &limit))
        return bad_param(r, "'limit' must be a non-negative integer");
    if (!crooms_reader_open(r, &rd)) return ATRIUM_DONE;
    bool participated = include && include[0] == 'p';
    const char *p[5 + ROOMS_VIS_PARAMS] = {rd.room, crooms_i64(r, from_pos),
                                           participated ? "true" : "false", rd.user,
                                           crooms_i64(r, limit + 1)};
    const char *vis_sql;
    json_t *chunk = json_array();
    int64_t last = 0;
    bool more = false;
    if (rooms_vis_window(r->arena, &rd.vis, 0, INT64_MAX, false, 6, &vis_sql, p + 5)) {
        const char *sql = rt_arena_printf(r->arena, THREADS_SQL, vis_sql, vis_sql);
        PGresult *res = rooms_q(rd.c, sql, 5 + ROOMS_VIS_PARAMS, p, NULL);
        if (!res) return db_failed(r, &rd, chunk);
        int rows = PQntuples(res), keep = rows > limit ? (int)limit : rows;
        more = rows > limit;
        if (keep > 0) last = atoll(PQgetvalue(res, keep - 1, 1));
        int rc = render_roots(r, &rd, res, keep, chunk);
        PQclear(res);
        if (rc < 0) return db_failed(r, &rd, chunk);
    }
    if (crooms_bundle_add(rd.c, r->arena, &rd.view, rd.room, &rd.vis, chunk) < 0)
        return db_failed(r, &rd, chunk);
    json_t *body = json_pack("{s:o}", "chunk", chunk);
    if (more) json_object_set_new(body, "next_batch", json_string(crooms_token(r, last - 1)));
    return crooms_reader_close(r, &rd, 200, body);
}

int crooms_relations_routes(http_server *s)
{
#define GET_(p, h) HTTP_ROUTE("GET", "/_matrix/client/v1/rooms/{roomId}" p, h, 0)
    static const atrium_route routes[] = {
        GET_("/relations/{eventId}", get_relations),
        GET_("/relations/{eventId}/{relType}", get_relations),
        GET_("/relations/{eventId}/{relType}/{eventType}", get_relations),
        GET_("/threads", get_threads),
    };
#undef GET_
    return HTTP_ROUTES_ADD(s, routes, "core");
}
