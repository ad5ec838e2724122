/*
 * core/client/rooms/crooms_read.c - reading rooms: GET /rooms/{roomId}/state[/{type}[/{key}]],
 * /event/{eventId}, /members, /joined_members, /messages, /context/{eventId}, and
 * GET /joined_rooms.
 *
 * Every reader first asks rooms_visibility what the caller may see (core/rooms/rooms_vis.c
 * owns the history visibility rule; a user who was never joined gets 403). Events (/event,
 * /messages, /context) are restricted to it with rooms_vis_window; an invisible event is
 * 404 M_NOT_FOUND, as if it did not exist. State (/state, /members) is the room's state
 * as of the user's leave, or now: state is not history. /messages and /context show the
 * room in its topological order (by depth, then stream position within a depth: the
 * spec's order for a room's history, and Synapse's), not in arrival order: an event that
 * arrived late (fetched as a missing event, or backfilled below the stream) still shows
 * where it belongs. Their tokens are places in that order ("t<depth>_<pos>"); they also
 * take /sync's stream positions ("s<N>": after event N), so a sync's prev_batch feeds
 * /messages directly. A page before what the user may see is empty, never an error.
 * It also answers GET /rooms/{roomId}/initialSync for a user not in the room
 * (crooms_peek_initial_sync), which core/client/sync/sync.c serves to members.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/auth/auth.h"
#include "core/client/rooms/crooms_api.h"
#include "core/client/rooms/crooms_relations.h"
#include "core/federation/rooms/fed_rooms.h"
#include "atrium/parse.h"

#define MESSAGES_DEFAULT_LIMIT 10
#define MESSAGES_MAX_LIMIT 1000
#define CONTEXT_DEFAULT_LIMIT 10
#define CONTEXT_MAX_LIMIT 100

/* The common start of a reader: authenticated user, room, then crooms_reader_open. true:
 * rd is ready (connection held). false: answered (nothing held). */
static bool open_reader(atrium_req *r, crooms_reader *rd)
{
    memset(rd, 0, sizeof(*rd));
    if (!(rd->user = auth_request(r)) || !(rd->room = crooms_param_room(r))) return false;
    return crooms_reader_open(r, rd);
}

static int db_failed(atrium_req *r, crooms_reader *rd, json_t *garbage)
{
    json_decref(garbage);
    return crooms_reader_close(r, rd, 503, NULL);
}

/* An integer query parameter in [1, max] (def when absent). false after answering 400. */
static bool query_limit(atrium_req *r, const char *name, int64_t def, int64_t max, int64_t *out)
{
    const char *v = http_req_query(r, name);
    *out = def;
    if (!v) return true;
    int64_t x;
    int rc = atrium_parse_int64(v, 0, max, &x); /* past max: clamped to max */
    if (rc == ATRIUM_E_INVAL || (rc == ATRIUM_E_LIMIT && x != max)) {
        http_respond_error(r, 400, "M_INVALID_PARAM", "'%s' must be a non-negative integer", name);
        return false;
    }
    *out = x;
    return true;
}

/* The event event_id of the room into out when the reader may see it: rows (0 or 1) or
 * ROOMS_E_DB. *at gets its place (may be NULL). */
static int fetch_one(atrium_req *r, crooms_reader *rd, const char *event_id, json_t *out, events_topo *at)
{
    const char *p[2 + ROOMS_VIS_PARAMS] = {event_id, rd->room}, *vis_sql;
    if (!rooms_vis_window(r->arena, &rd->vis, INT64_MIN, INT64_MAX, false, 3, &vis_sql, p + 2)) return 0;
    const char *sql = rt_arena_printf(r->arena, EVENTS_SELECT "WHERE e.event_id = $1"
                                                              " AND e.room_id = $2%s", vis_sql);
    return events_fetch_topo(rd->c, &rd->view, sql, 2 + ROOMS_VIS_PARAMS, p, out, at, NULL);
}

/* ---- state -------------------------------------------------------------------------- */

/* GET /_matrix/client/v3/rooms/{roomId}/state */
static int get_state_all(atrium_req *r)
{
    crooms_reader rd;
    if (!open_reader(r, &rd)) return ATRIUM_DONE;
    json_t *out = json_array();
    if (events_state_at(rd.c, &rd.view, rd.room, rd.vis.upto, NULL, NULL, out) < 0)
        return db_failed(r, &rd, out);
    return crooms_reader_close(r, &rd, 200, out);
}

/* GET /_matrix/client/v3/rooms/{roomId}/state/{eventType}[/{stateKey}] */
static int get_state_one(atrium_req *r)
{
    const char *type = http_req_param(r, "eventType"), *key = http_req_param(r, "stateKey");
    if (!key) key = "";
    const char *format = http_req_query(r, "format");
    crooms_reader rd;
    if (!open_reader(r, &rd)) return ATRIUM_DONE;
    json_t *types = json_pack("[s]", type);
    const char *type_arr = rooms_pg_array(r->arena, types);
    json_decref(types);
    json_t *all = json_array();
    if (events_state_at(rd.c, &rd.view, rd.room, rd.vis.upto, NULL, type_arr, all) < 0)
        return db_failed(r, &rd, all);
    json_t *found = NULL;
    for (size_t i = 0; i < json_array_size(all); i++) {
        json_t *ev = json_array_get(all, i);
        if (strcmp(json_string_value(json_object_get(ev, "state_key")), key) == 0) found = ev;
    }
    if (!found) {
        json_decref(all);
        http_db_checkin(rd.c);
        return http_respond_error(r, 404, "M_NOT_FOUND", "No such state event");
    }
    json_t *answer = format && strcmp(format, "event") == 0 ? found : json_object_get(found, "content");
    json_incref(answer);
    json_decref(all);
    return crooms_reader_close(r, &rd, 200, answer);
}

/* GET /_matrix/client/v3/rooms/{roomId}/event/{eventId} */
static int get_event(atrium_req *r)
{
    const char *event_id = http_req_param(r, "eventId");
    crooms_reader rd;
    if (!open_reader(r, &rd)) return ATRIUM_DONE;
    json_t *out = json_array();
    int n = fetch_one(r, &rd, event_id, out, NULL);
    if (n < 0 || crooms_bundle_add(rd.c, r->arena, &rd.view, rd.room, &rd.vis, out) < 0)
        return db_failed(r, &rd, out);
    if (json_array_size(out) == 0) {
        json_decref(out);
        http_db_checkin(rd.c);
        return http_respond_error(r, 404, "M_NOT_FOUND", "Event not found");
    }
    json_t *ev = json_incref(json_array_get(out, 0));
    json_decref(out);
    return crooms_reader_close(r, &rd, 200, ev);
}

/* ---- members ------------------------------------------------------------------------ */

static bool in_list(const char *v, const char *list)
{
    return !list || strcmp(v, list) == 0;
}

/* GET /_matrix/client/v3/rooms/{roomId}/members?at=&membership=&not_membership= */
static int get_members(atrium_req *r)
{
    const char *at = http_req_query(r, "at"), *only = http_req_query(r, "membership");
    const char *not_m = http_req_query(r, "not_membership");
    int64_t at_pos = INT64_MAX;
    if (at && !crooms_parse_token(at, &at_pos))
        return http_respond_error(r, 400, "M_INVALID_PARAM", "'at' is not a token of this server");
    crooms_reader rd;
    if (!open_reader(r, &rd)) return ATRIUM_DONE;
    int64_t upto = at_pos < rd.vis.upto ? at_pos : rd.vis.upto;
    json_t *types = json_pack("[s]", "m.room.member");
    const char *type_arr = rooms_pg_array(r->arena, types);
    json_decref(types);
    json_t *all = json_array();
    if (events_state_at(rd.c, &rd.view, rd.room, upto, NULL, type_arr, all) < 0)
        return db_failed(r, &rd, all);
    json_t *chunk = json_array();
    for (size_t i = 0; i < json_array_size(all); i++) {
        json_t *ev = json_array_get(all, i);
        const char *m = json_string_value(json_object_get(json_object_get(ev, "content"), "membership"));
        if (!m || !in_list(m, only) || (not_m && strcmp(m, not_m) == 0)) continue;
        json_array_append(chunk, ev);
    }
    json_decref(all);
    return crooms_reader_close(r, &rd, 200, json_pack("{s:o}", "chunk", chunk));
}

/* GET /_matrix/client/v3/rooms/{roomId}/joined_members */
static int get_joined_members(atrium_req *r)
{
    crooms_reader rd;
    if (!open_reader(r, &rd)) return ATRIUM_DONE;
    json_t *types = json_pack("[s]", "m.room.member");
    const char *type_arr = rooms_pg_array(r->arena, types);
    json_decref(types);
    json_t *all = json_array();
    if (events_state_at(rd.c, &rd.view, rd.room, rd.vis.upto, NULL, type_arr, all) < 0)
        return db_failed(r, &rd, all);
    json_t *joined = json_object();
    for (size_t i = 0; i < json_array_size(all); i++) {
        json_t *ev = json_array_get(all, i), *content = json_object_get(ev, "content");
        if (!in_list(json_string_value(json_object_get(content, "membership")), "join")) continue;
        /* Both keys always, null when unset: clients (and Synapse) read them so. */
        json_t *dn = json_object_get(content, "displayname"), *av = json_object_get(content, "avatar_url");
        json_t *who = json_pack("{s:o, s:o}",
                                "display_name", json_is_string(dn) ? json_incref(dn) : json_null(),
                                "avatar_url", json_is_string(av) ? json_incref(av) : json_null());
        json_object_set_new(joined, json_string_value(json_object_get(ev, "state_key")), who);
    }
    json_decref(all);
    return crooms_reader_close(r, &rd, 200, json_pack("{s:o}", "joined", joined));
}

/* GET /_matrix/client/v3/joined_rooms */
static int get_joined_rooms(atrium_req *r)
{
    const char *user = auth_request(r);
    if (!user) return ATRIUM_DONE;
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    json_t *rooms = json_array();
    int n = rooms_user_room_ids(c, user, false, -1, rooms);
    http_db_checkin(c);
    if (n < 0) {
        json_decref(rooms);
        return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    }
    return http_respond_json(r, 200, json_pack("{s:o}", "joined_rooms", rooms));
}

/* ---- timelines ---------------------------------------------------------------------- */

/* The member events (current state) of the senders of `events`, for lazy loading. */
static int lazy_members(crooms_reader *rd, int64_t upto, json_t *events, json_t *out)
{
    json_t *senders = json_array();
    for (size_t i = 0; i < json_array_size(events); i++) {
        json_t *s = json_object_get(json_array_get(events, i), "sender");
        bool seen = false;
        for (size_t j = 0; j < json_array_size(senders) && !seen; j++)
            seen = json_equal(json_array_get(senders, j), s);
        if (!seen && json_is_string(s)) json_array_append(senders, s);
    }
    json_t *types = json_pack("[s]", "m.room.member");
    rt_arena *a = rt_arena_new(256);
    int rc = a ? events_state_at(rd->c, &rd->view, rd->room, upto, senders, rooms_pg_array(a, types), out)
               : ROOMS_E_DB;
    rt_arena_free(a);
    json_decref(types);
    json_decref(senders);
    return rc;
}

/* ---- the topological order --------------------------------------------------------- */

/* One end of a page: a stream position ("s<N>"/"b<N>": crooms_parse_token, as /sync's
 * prev_batch gives it) or a place in the room's topological order, by depth then stream
 * position ("t<depth>_<pos>": the place just after that event). Either way a page runs
 * from after its low end up to and including its high end. */
typedef struct page_end {
    bool topo;
    events_topo at; /* at.pos alone for a stream position */
} page_end;

static const page_end STREAM_START = {false, {0, INT64_MIN}}, STREAM_END = {false, {0, INT64_MAX}};

static bool parse_page_end(const char *tok, page_end *out)
{
    *out = (page_end){tok[0] == 't', {0, 0}};
    return out->topo ? crooms_parse_topo_token(tok, &out->at.depth, &out->at.pos)
                     : crooms_parse_token(tok, &out->at.pos);
}

/* The token of the place just after the event at `at`. */
static const char *topo_token(atrium_req *r, events_topo at)
{
    return rt_arena_printf(r->arena, "t%lld_%lld", (long long)at.depth, (long long)at.pos);
}

/* The token of the place just before the event at `at`: a backward page resumes there. */
static const char *topo_token_before(atrium_req *r, events_topo at)
{
    return topo_token(r, (events_topo){at.depth, at.pos - 1});
}

/* The first `limit` events the reader may see after lo, up to and including hi, that pass
 * the filter, into out: newest first (back) or oldest first, in the room's topological
 * order (by depth, then stream position: what /messages and /context show, as the spec
 * says) or, with !topo, in stream order (arrival: /events). Rows or ROOMS_E_DB; *first /
 * *last get the places of the first and last row. */
static int window_page(atrium_req *r, crooms_reader *rd, const room_filter *f, page_end lo, page_end hi,
                       int64_t limit, bool back, bool topo, json_t *out, events_topo *first,
                       events_topo *last)
{
    enum { TOPO = 6, VIS = TOPO + 4, N_PARAMS = VIS + ROOMS_VIS_PARAMS + 1, IGNORED = N_PARAMS - 1 };
    const char *p[N_PARAMS] = {rd->room, crooms_i64(r, limit), f->types,
                               f->not_types, f->senders, f->not_senders};
    /* The topological ends (a stream end leaves its side open here: it bounds the
     * visibility window instead). */
    p[TOPO] = crooms_i64(r, lo.topo ? lo.at.depth : INT64_MIN);
    p[TOPO + 1] = crooms_i64(r, lo.topo ? lo.at.pos : INT64_MIN);
    p[TOPO + 2] = crooms_i64(r, hi.topo ? hi.at.depth : INT64_MAX);
    p[TOPO + 3] = crooms_i64(r, hi.topo ? hi.at.pos : INT64_MAX);
    p[IGNORED] = f->ignored;
    const char *vis_sql;
    if (!rooms_vis_window(r->arena, &rd->vis, lo.topo ? INT64_MIN : lo.at.pos,
                          hi.topo ? INT64_MAX : hi.at.pos, false, VIS + 1, &vis_sql, p + VIS))
        return 0;
    const char *dir = back ? "DESC" : "ASC";
    const char *sql = rt_arena_printf(
        r->arena,
        EVENTS_SELECT "WHERE e.room_id = $1 AND (e.depth, e.stream_pos) > ($7::bigint, $8::bigint)"
                      " AND (e.depth, e.stream_pos) <= ($9::bigint, $10::bigint)%s%s%s"
                      " ORDER BY %s%s%s e.stream_pos %s LIMIT $2",
        vis_sql, rooms_filter_sql(r->arena, 3), rooms_ignored_sql(r->arena, IGNORED + 1),
        topo ? "e.depth " : "", topo ? dir : "", topo ? "," : "", dir);
    return events_fetch_topo(rd->c, &rd->view, sql, N_PARAMS, p, out, first, last);
}

/* Does the room's history go on beyond what is stored here (backward extremities)? 1, 0,
 * -1 database. */
static int backfill_wanted(crooms_reader *rd)
{
    json_t *ids = NULL;
    int n = fed_rooms_backward_extremities(rd->c, rd->room, 1, &ids);
    json_decref(ids);
    return n < 0 ? -1 : n > 0;
}

/* GET /_matrix/client/v3/rooms/{roomId}/messages?dir=&from=&to=&limit=&filter=
 * Backwards, when the page comes up short and the room's history goes on beyond what is
 * stored here (a room joined over federation starts at the join), the request is handed
 * to the remote pool, which reads up to a page of older events from the room's other
 * servers (fed_rooms_backfill) before it pages: no request-pool thread waits on a peer,
 * and each page asks at most once. Message events of users the reader ignores are left
 * out (window_page, with the list read once per run). */
static int get_messages(atrium_req *r)
{
    const char *dir = http_req_query(r, "dir"), *from = http_req_query(r, "from");
    const char *to = http_req_query(r, "to");
    if (!dir || (strcmp(dir, "b") != 0 && strcmp(dir, "f") != 0))
        return http_respond_error(r, 400, "M_INVALID_PARAM", "'dir' must be \"b\" or \"f\"");
    bool back = dir[0] == 'b';
    page_end from_end = back ? STREAM_END : STREAM_START, to_end = back ? STREAM_START : STREAM_END;
    int64_t limit;
    if ((from && !parse_page_end(from, &from_end)) || (to && !parse_page_end(to, &to_end)))
        return http_respond_error(r, 400, "M_INVALID_PARAM", "Not a pagination token of this server");
    room_filter f;
    if (!query_limit(r, "limit", MESSAGES_DEFAULT_LIMIT, MESSAGES_MAX_LIMIT, &limit) ||
        !crooms_filter_query(r, "filter", &f))
        return ATRIUM_DONE;
    if (f.limit >= 0 && !http_req_query(r, "limit"))
        limit = f.limit > MESSAGES_MAX_LIMIT ? MESSAGES_MAX_LIMIT : f.limit;
    crooms_reader rd;
    if (!open_reader(r, &rd)) return ATRIUM_DONE;
    /* Back: after `to`, up to `from`, newest first. Forward: after `from`, up to `to`,
     * oldest first. Both in the room's topological order, only what the user may see. */
    page_end lo = back ? to_end : from_end, hi = back ? from_end : to_end;
    bool may_backfill = back && !to && rd.vis.backfilled;
    if (may_backfill && r->run_reason == ATRIUM_RUN_HANDOFF &&
        fed_rooms_backfill(&rd.c, rd.room, (int)limit) < 0)
        return db_failed(r, &rd, NULL);
    if (rooms_ignored_users(rd.c, r->arena, rd.user, &f.ignored) < 0) return db_failed(r, &rd, NULL);
    json_t *chunk = json_array();
    events_topo first = {0, 0}, last = {0, 0};
    int n = window_page(r, &rd, &f, lo, hi, limit, back, true, chunk, &first, &last);
    if (n >= 0 && n < limit && may_backfill && r->run_reason != ATRIUM_RUN_HANDOFF) {
        int wanted = backfill_wanted(&rd);
        if (wanted < 0) return db_failed(r, &rd, chunk);
        if (wanted) { /* history ran out here: read more from the room's other servers */
            json_decref(chunk);
            http_db_checkin(rd.c);
            return crooms_to_remote_pool(r);
        }
    }
    if (n < 0 || crooms_bundle_add(rd.c, r->arena, &rd.view, rd.room, &rd.vis, chunk) < 0)
        return db_failed(r, &rd, chunk);
    /* Without `from`, a backward page starts at its newest event, a forward one at the
     * room's start (below any backfilled history). `end` is the place just past the
     * page's last event: the next page resumes there, whatever arrived meanwhile (an
     * event that arrives later deeper in the history is met when paging reaches it). */
    const char *start = from ? from
                        : back ? (n > 0 ? topo_token(r, first) : crooms_token(r, 0))
                               : crooms_token(r, lo.at.pos);
    json_t *body = json_pack("{s:o, s:s}", "chunk", chunk, "start", start);
    if (n > 0 && n == limit) {
        const char *end = back ? topo_token_before(r, last) : topo_token(r, last);
        json_object_set_new(body, "end", json_string(end));
    }
    if (f.lazy_load_members && n > 0) {
        json_t *state = json_array();
        if (lazy_members(&rd, rd.vis.upto, chunk, state) < 0) return db_failed(r, &rd, body);
        json_object_set_new(body, "state", state);
    }
    return crooms_reader_close(r, &rd, 200, body);
}

/* GET /_matrix/client/v3/rooms/{roomId}/context/{eventId}?limit=&filter= */
static int get_context(atrium_req *r)
{
    const char *event_id = http_req_param(r, "eventId");
    int64_t limit;
    room_filter f;
    if (!query_limit(r, "limit", CONTEXT_DEFAULT_LIMIT, CONTEXT_MAX_LIMIT, &limit) ||
        !crooms_filter_query(r, "filter", &f))
        return ATRIUM_DONE;
    crooms_reader rd;
    if (!open_reader(r, &rd)) return ATRIUM_DONE;
    json_t *one = json_array();
    events_topo at = {0, 0};
    int n = fetch_one(r, &rd, event_id, one, &at);
    if (n < 0) return db_failed(r, &rd, one);
    if (n == 0) {
        json_decref(one);
        http_db_checkin(rd.c);
        return http_respond_error(r, 404, "M_NOT_FOUND", "Event not found");
    }
    if (rooms_ignored_users(rd.c, r->arena, rd.user, &f.ignored) < 0) return db_failed(r, &rd, one);
    int64_t before_n = limit / 2, after_n = limit - before_n;
    json_t *before = json_array(), *after = json_array();
    /* Around the event in the room's topological order, as /messages pages it. */
    events_topo b_last = at, a_last = at, dummy;
    page_end before_it = {true, {at.depth, at.pos - 1}}, after_it = {true, at};
    int nb = window_page(r, &rd, &f, STREAM_START, before_it, before_n, true, true, before, &dummy,
                         &b_last);
    int na = nb < 0 ? nb
                    : window_page(r, &rd, &f, after_it, STREAM_END, after_n, false, true, after,
                                  &dummy, &a_last);
    json_t *body = json_pack("{s:O, s:o, s:o, s:s, s:s}", "event", json_array_get(one, 0),
                             "events_before", before, "events_after", after, "start",
                             topo_token_before(r, b_last), "end", topo_token(r, a_last));
    json_array_extend(one, before); /* one page for the bundles: the objects are shared */
    json_array_extend(one, after);
    if (na >= 0 && crooms_bundle_add(rd.c, r->arena, &rd.view, rd.room, &rd.vis, one) < 0) na = -1;
    json_decref(one);
    if (na < 0) return db_failed(r, &rd, body);
    json_t *state = json_array();
    int rc;
    if (f.lazy_load_members) {
        json_t *all = json_array();
        json_array_append(all, json_object_get(body, "event"));
        json_array_extend(all, before);
        json_array_extend(all, after);
        rc = lazy_members(&rd, a_last.pos, all, state);
        json_decref(all);
    } else {
        rc = events_state_at(rd.c, &rd.view, rd.room, a_last.pos, NULL, NULL, state);
    }
    json_object_set_new(body, "state", state);
    if (rc < 0) return db_failed(r, &rd, body);
    return crooms_reader_close(r, &rd, 200, body);
}

/* ---- peeking ------------------------------------------------------------------------ */

int crooms_peek_initial_sync(atrium_req *r, const char *user, int64_t upto, int64_t limit)
{
    crooms_reader rd = {.user = user};
    if (!(rd.room = crooms_param_room(r)) || !crooms_reader_open(r, &rd)) return ATRIUM_DONE;
    if (!rd.vis.world_readable) {
        http_db_checkin(rd.c);
        return http_respond_error(r, 403, "M_FORBIDDEN", "You are not a member of this room");
    }
    room_filter f; /* none, but the reader's ignore list, as in every timeline */
    char why[128];
    if (!rooms_filter_parse(r->arena, NULL, &f, why, sizeof(why)) ||
        rooms_ignored_users(rd.c, r->arena, rd.user, &f.ignored) < 0)
        return db_failed(r, &rd, NULL);
    json_t *newest_first = json_array(), *chunk = json_array(), *state = json_array();
    events_topo first = {0, 0}, last = {0, 0};
    page_end until = {false, {0, upto}};
    int n = !newest_first || !chunk || !state ? -1
            : limit > 0 ? window_page(r, &rd, &f, STREAM_START, until, limit, true, true, newest_first,
                                      &first, &last)
                        : 0;
    for (size_t i = json_array_size(newest_first); n > 0 && i > 0; i--)
        json_array_append(chunk, json_array_get(newest_first, i - 1));
    json_decref(newest_first);
    if (n < 0 || events_state_at(rd.c, &rd.view, rd.room, rd.vis.upto, NULL, NULL, state) < 0) {
        json_decref(chunk);
        return db_failed(r, &rd, state);
    }
    /* `start` pages back with /messages from the oldest event shown; `end` is the stream
     * position the answer was read at. */
    const char *end = crooms_token(r, upto);
    json_t *body = json_pack("{s:s, s:{s:o, s:s, s:s}, s:o, s:[], s:[], s:[]}", "room_id", rd.room,
                             "messages", "chunk", chunk, "start",
                             n > 0 ? topo_token_before(r, last) : end, "end", end, "state", state,
                             "presence", "receipts", "account_data");
    if (!body) {
        http_db_checkin(rd.c);
        return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    }
    return crooms_reader_close(r, &rd, 200, body);
}

int crooms_reader_events(atrium_req *r, crooms_reader *rd, int64_t lo, int64_t hi, int64_t limit,
                        json_t *out, int64_t *last)
{
    room_filter f; /* none, but the reader's ignore list, as in every timeline */
    char why[128];
    *last = 0;
    if (!rooms_filter_parse(r->arena, NULL, &f, why, sizeof(why)) ||
        rooms_ignored_users(rd->c, r->arena, rd->user, &f.ignored) < 0)
        return ROOMS_E_DB;
    events_topo first, end = {0, 0};
    page_end after = {false, {0, lo}}, until = {false, {0, hi}};
    int n = limit > 0 ? window_page(r, rd, &f, after, until, limit, false, false, out, &first, &end) : 0;
    *last = end.pos;
    return n;
}

int crooms_read_routes(http_server *s)
{
#define GET_(p, h) HTTP_ROUTE("GET", "/_matrix/client/v3" p, h, 0)
    static const atrium_route routes[] = {
        GET_("/rooms/{roomId}/state", get_state_all),
        GET_("/rooms/{roomId}/state/{eventType}", get_state_one),
        GET_("/rooms/{roomId}/state/{eventType}/", get_state_one),
        GET_("/rooms/{roomId}/state/{eventType}/{stateKey}", get_state_one),
        GET_("/rooms/{roomId}/event/{eventId}", get_event),
        GET_("/rooms/{roomId}/members", get_members),
        GET_("/rooms/{roomId}/joined_members", get_joined_members),
        GET_("/rooms/{roomId}/messages", get_messages),
        GET_("/rooms/{roomId}/context/{eventId}", get_context),
        GET_("/joined_rooms", get_joined_rooms),
    };
#undef GET_
    return HTTP_ROUTES_ADD(s, routes, "core");
}
