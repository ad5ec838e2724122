/*
 * core/client/rooms/crooms_search.c - server-side search: POST /_matrix/client/v3/search, the
 * room_events category (Element's room and all-rooms search in unencrypted rooms).
 *
 * Matching is PostgreSQL full text search with the 'simple' configuration (lower-cased
 * words, no stemming, no stop words) over the generated column events.search_tsv (rooms
 * migration 3: content.body of m.room.message, content.name of m.room.name, content.topic
 * of m.room.topic; NULL once the event is redacted), with a GIN index. The search term is
 * read as a web search (websearch_to_tsquery: "quoted phrases", or, -word) and every word
 * matches as a prefix, as Synapse does. Encrypted events carry no such field and never
 * match; redacted events leave the index when redacted_by is set.
 *
 * This file owns which events a search may return: only rooms the user is joined to now,
 * and in them only events the history visibility rule shows the user. The rule itself is
 * rooms.c's: each room's visible ranges come from rooms_vis_load, and the search query
 * joins the events against those (lo, hi] ranges, one row per range. The rule's other
 * clause (a user's own m.room.member events are always visible) cannot matter here, since
 * member events are never indexed; context events around a result go through
 * rooms_vis_window itself. Erasure (rooms.h) splits those ranges where the user was
 * joined: an erased user's messages match only there (rooms_erasure_sql).
 *
 * Work per request is bounded: a page holds at most SEARCH_MAX_LIMIT results, the term is
 * at most SEARCH_TERM_MAX_BYTES, at most SEARCH_MAX_ROOMS rooms are searched (those with
 * the newest matches), `count` stops at SEARCH_COUNT_MAX, and every statement runs under
 * statement_timeout (SEARCH_STATEMENT_TIMEOUT_MS; past it the answer is 503). next_batch
 * is a keyset, not an offset: "r<pos>" (order_by recent: results before stream position
 * pos) or "k<rank>_<pos>" (order_by rank: results after (rank, pos) in descending order),
 * so paging costs the same on page 100 as on page 1 and never repeats or skips a result
 * while the room grows. It does not do groupings (ignored) or other categories (ignored).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/auth/auth.h"
#include "core/client/rooms/crooms_api.h"
#include "core/client/rooms/crooms_relations.h"

#define SEARCH_MAX_BODY_BYTES (64 * 1024)
#define SEARCH_TERM_MAX_BYTES 512
#define SEARCH_DEFAULT_LIMIT 10          /* results per page without filter.limit */
#define SEARCH_MAX_LIMIT 50              /* results per page at most */
#define SEARCH_MAX_ROOMS 1000            /* rooms searched per request: newest matches first */
#define SEARCH_COUNT_MAX 1000            /* `count` counts matches up to here */
#define SEARCH_CONTEXT_DEFAULT_EVENTS 5  /* event_context before_limit / after_limit */
#define SEARCH_CONTEXT_MAX_EVENTS 20
#define SEARCH_STATEMENT_TIMEOUT_MS 5000 /* each statement of a search */
#define SEARCH_TOKEN_MAX_BYTES 64        /* next_batch */
#define SEARCH_E_TIMEOUT (-1)            /* run_* failures besides ROOMS_E_DB */

/* The keys a search may name and the one event type each is indexed for (the migration's
 * events_search_text in rooms.c indexes exactly these). */
static const struct {
    const char *key, *type;
} SEARCH_KEYS[] = {
    {"content.body", "m.room.message"},
    {"content.name", "m.room.name"},
    {"content.topic", "m.room.topic"},
};
#define SEARCH_N_KEYS (sizeof(SEARCH_KEYS) / sizeof(SEARCH_KEYS[0]))

/* The search term ($1) as a tsquery: the web-search form with every word a prefix; NULL
 * (matches nothing) when no word is left that an index can look up, e.g. only punctuation
 * or only -negated words (which would scan every event). */
#define SEARCH_TSQUERY                                                                     \
    "(SELECT CASE WHEN w::text = '' OR querytree(w) = 'T' THEN NULL"                      \
    " ELSE to_tsquery('simple', regexp_replace(w::text, '''((?:[^'']|'''')*)''',"         \
    " '''\\1'':*', 'g')) END FROM websearch_to_tsquery('simple', $1) w)"

/* A parsed room_events request. */
typedef struct search_req {
    const char *term;
    const char *key_types; /* text[] literal: the event types of `keys` */
    room_filter f;
    const char *rooms, *not_rooms; /* text[] literals, NULL = no condition */
    int64_t limit;
    bool recent;                   /* order_by "recent" (else "rank") */
    bool context, profile, state;  /* event_context given, include_profile, include_state */
    int64_t before, after;         /* event_context limits */
    const char *after_rank;        /* next_batch: rank (NULL for recent) ... */
    const char *after_pos;         /* ... and position (NULL: first page) */
} search_req;

/* One search against one held connection. */
typedef struct search_run {
    atrium_req *r;
    PGconn *c;
    const search_req *q;
    events_view view;  /* reader NULL: view_of sets it per room */
    char **room_ids;   /* the rooms searched (arena) */
    rooms_vis *vis;    /* their visibility (malloc'd, n_rooms) */
    int n_rooms;
    const char *ranges; /* JSON [{r, l, h, i, j}]: room, visible (l, h], index into vis,
                         * whether the user was joined there (erasure) */
} search_run;

/* The view to render the events of searched room idx with: its reader's visibility, for
 * erasure. */
static events_view view_of(const search_run *s, int idx)
{
    events_view v = s->view;
    v.reader = &s->vis[idx];
    return v;
}

/* ---- the request -------------------------------------------------------------------- */

/* Answer 400 with errcode and msg; false, so a parser can return it. */
static bool refuse(atrium_req *r, const char *errcode, const char *msg)
{
    http_respond_error(r, 400, errcode, "%s", msg ? msg : "Bad request");
    return false;
}

/* out when it is not NULL; else answer 503 (out of memory) and false. */
static bool have(atrium_req *r, const void *out)
{
    if (!out) http_respond_error(r, 503, "M_UNKNOWN", "Out of memory; retry");
    return out != NULL;
}

/* `keys` into q->key_types. false after answering 400. */
static bool parse_keys(atrium_req *r, json_t *re, search_req *q)
{
    json_t *keys = json_object_get(re, "keys"), *types = json_array();
    if (keys && !json_is_null(keys) && !json_is_array(keys)) {
        json_decref(types);
        http_respond_error(r, 400, "M_BAD_JSON", "'keys' must be a list of strings");
        return false;
    }
    for (size_t i = 0; i < json_array_size(keys); i++) {
        const char *k = json_string_value(json_array_get(keys, i));
        size_t j = 0;
        while (k && j < SEARCH_N_KEYS && strcmp(SEARCH_KEYS[j].key, k) != 0) j++;
        if (!k || j == SEARCH_N_KEYS) {
            json_decref(types);
            return refuse(r, k ? "M_INVALID_PARAM" : "M_BAD_JSON",
                          "'keys' may hold only content.body, content.name and content.topic");
        }
        json_array_append_new(types, json_string(SEARCH_KEYS[j].type));
    }
    if (json_array_size(types) == 0) /* absent or empty: all three */
        for (size_t j = 0; j < SEARCH_N_KEYS; j++)
            json_array_append_new(types, json_string(SEARCH_KEYS[j].type));
    q->key_types = rooms_pg_array(r->arena, types);
    json_decref(types);
    return have(r, q->key_types);
}

/* filter[key], a list of room IDs, as a text[] literal (NULL when absent). */
static bool parse_room_list(atrium_req *r, json_t *filter, const char *key, const char **out)
{
    json_t *v = json_object_get(filter, key);
    *out = NULL;
    if (!v || json_is_null(v)) return true;
    bool ok = json_is_array(v);
    for (size_t i = 0; ok && i < json_array_size(v); i++)
        ok = json_is_string(json_array_get(v, i));
    if (!ok)
        return refuse(r, "M_BAD_JSON",
                      rt_arena_printf(r->arena, "'filter.%s' must be a list of room IDs", key));
    *out = rooms_pg_array(r->arena, v);
    return have(r, *out);
}

/* The RoomEventFilter: room lists, the type and sender lists, the page size. */
static bool parse_filter(atrium_req *r, json_t *re, search_req *q)
{
    json_t *filter = json_object_get(re, "filter");
    char why[128];
    if (!rooms_filter_parse(r->arena, filter, &q->f, why, sizeof(why)))
        return refuse(r, "M_BAD_JSON", rt_arena_printf(r->arena, "filter: %s", why));
    if (!parse_room_list(r, filter, "rooms", &q->rooms) ||
        !parse_room_list(r, filter, "not_rooms", &q->not_rooms))
        return false;
    if (q->f.limit == 0 || q->f.limit < -1)
        return refuse(r, "M_INVALID_PARAM", "'filter.limit' must be positive");
    q->limit = q->f.limit < 0 ? SEARCH_DEFAULT_LIMIT
                              : (q->f.limit > SEARCH_MAX_LIMIT ? SEARCH_MAX_LIMIT : q->f.limit);
    return true;
}

/* An event_context limit: an integer >= 0, capped. */
static bool parse_context_limit(atrium_req *r, json_t *ec, const char *key, int64_t *out)
{
    json_t *v = json_object_get(ec, key);
    *out = SEARCH_CONTEXT_DEFAULT_EVENTS;
    if (!v || json_is_null(v)) return true;
    if (!json_is_integer(v))
        return refuse(r, "M_BAD_JSON", rt_arena_printf(r->arena, "'%s' must be an integer", key));
    if (json_integer_value(v) < 0)
        return refuse(r, "M_INVALID_PARAM",
                      rt_arena_printf(r->arena, "'%s' must not be negative", key));
    *out = json_integer_value(v) > SEARCH_CONTEXT_MAX_EVENTS ? SEARCH_CONTEXT_MAX_EVENTS
                                                             : json_integer_value(v);
    return true;
}

static bool all_in(const char *s, const char *allowed)
{
    return strspn(s, allowed) == strlen(s);
}

/* next_batch, which must be a token of this order. false after answering 400. */
static bool parse_token(atrium_req *r, const char *tok, search_req *q)
{
    if (!tok) return true;
    bool ok = strlen(tok) <= SEARCH_TOKEN_MAX_BYTES && tok[0] == (q->recent ? 'r' : 'k');
    const char *pos = tok + 1;
    if (ok && !q->recent) { /* k<rank>_<pos> */
        const char *sep = strchr(tok, '_');
        char *end = NULL;
        double rank = sep && sep > tok + 1 ? strtod(tok + 1, &end) : NAN;
        ok = end == sep && isfinite(rank) && rank >= 0;
        if (ok) {
            char *rank_s = rt_arena_strndup(r->arena, tok + 1, (size_t)(sep - tok - 1));
            ok = rank_s && all_in(rank_s, "0123456789.e+-");
            q->after_rank = rt_arena_printf(r->arena, "%.9g", rank);
        }
        pos = sep ? sep + 1 : pos;
    }
    ok = ok && *pos >= '0' && *pos <= '9' && all_in(pos, "0123456789") && strlen(pos) <= 18;
    if (!ok)
        return refuse(r, "M_INVALID_PARAM", "'next_batch' is not a search token for this order_by");
    q->after_pos = pos;
    return true;
}

/* The room_events object into q. false after answering 400. */
static bool parse_room_events(atrium_req *r, json_t *re, search_req *q)
{
    memset(q, 0, sizeof(*q));
    const char *order;
    json_t *ec;
    if (!http_field_string(r, re, "search_term", true, SEARCH_TERM_MAX_BYTES, &q->term) ||
        !http_field_string(r, re, "order_by", false, 0, &order) || !parse_keys(r, re, q) ||
        !parse_filter(r, re, q) || !http_field_object(r, re, "event_context", false, &ec) ||
        !http_field_bool(r, re, "include_state", false, &q->state))
        return false;
    if (order && strcmp(order, "rank") != 0 && strcmp(order, "recent") != 0)
        return refuse(r, "M_INVALID_PARAM", "'order_by' must be \"rank\" or \"recent\"");
    q->recent = order && strcmp(order, "recent") == 0;
    q->context = ec != NULL;
    if (ec && (!parse_context_limit(r, ec, "before_limit", &q->before) ||
               !parse_context_limit(r, ec, "after_limit", &q->after) ||
               !http_field_bool(r, ec, "include_profile", false, &q->profile)))
        return false;
    return parse_token(r, http_req_query(r, "next_batch"), q);
}

/* ---- the queries -------------------------------------------------------------------- */

/* One statement of the search; NULL with *fail set (SEARCH_E_TIMEOUT past the statement
 * timeout, else ROOMS_E_DB), logged. */
static PGresult *search_q(PGconn *c, const char *sql, int n, const char *const *p, int *fail)
{
    PGresult *res = db_query(c, sql, n, p);
    ExecStatusType st = PQresultStatus(res);
    if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK) return res;
    const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
    *fail = state && strcmp(state, "57014") == 0 ? SEARCH_E_TIMEOUT : ROOMS_E_DB;
    if (*fail == SEARCH_E_TIMEOUT)
        rt_log(ATRIUM_LOG_WARN, "core", "a search ran past %d ms and was cancelled; if common "
               "words time out often, look at the events_search index",
               SEARCH_STATEMENT_TIMEOUT_MS);
    else
        rt_log(ATRIUM_LOG_ERROR, "core", "search query failed: %s", PQresultErrorMessage(res));
    PQclear(res);
    return NULL;
}

/* A read-only transaction whose statements stop at the timeout; NOTICEs (a term with no
 * words) stay out of the log; ranks print exactly, so a rank token reads back the same. */
static int begin_bounded(PGconn *c)
{
    char sql[200];
    snprintf(sql, sizeof(sql),
             "BEGIN READ ONLY; SET LOCAL statement_timeout = %d;"
             " SET LOCAL client_min_messages = warning; SET LOCAL extra_float_digits = 1",
             SEARCH_STATEMENT_TIMEOUT_MS);
    PGresult *res = PQexec(c, sql);
    bool ok = PQresultStatus(res) == PGRES_COMMAND_OK;
    if (!ok)
        rt_log(ATRIUM_LOG_ERROR, "core", "search: BEGIN failed: %s", PQresultErrorMessage(res));
    PQclear(res);
    return ok ? ROOMS_OK : ROOMS_E_DB;
}

/* The rooms to search: joined now, allowed by filter.rooms / not_rooms, holding at least
 * one match (visible or not), newest match first; and each room's visibility. */
static int load_rooms(search_run *s, int *fail)
{
    const search_req *q = s->q;
    const char *p[10] = {q->term, s->r->user, q->rooms, q->not_rooms, q->key_types,
                         q->f.types, q->f.not_types, q->f.senders, q->f.not_senders,
                         crooms_i64(s->r, SEARCH_MAX_ROOMS)};
    const char *sql = rt_arena_printf(
        s->r->arena,
        "SELECT e.room_id FROM events e WHERE e.search_tsv @@ " SEARCH_TSQUERY
        " AND e.redacted_by IS NULL AND e.type = ANY($5::text[])"
        " AND e.room_id IN (SELECT cs.room_id FROM current_state cs"
        "  WHERE cs.type = 'm.room.member' AND cs.state_key = $2 AND cs.membership = 'join'"
        "  AND ($3::text[] IS NULL OR cs.room_id = ANY($3::text[]))"
        "  AND ($4::text[] IS NULL OR cs.room_id <> ALL($4::text[])))%s"
        " GROUP BY e.room_id ORDER BY max(e.stream_pos) DESC LIMIT $10::bigint",
        rooms_filter_sql(s->r->arena, 6));
    PGresult *res = search_q(s->c, sql, 10, p, fail);
    if (!res) return *fail;
    int n = PQntuples(res);
    if (n == SEARCH_MAX_ROOMS)
        rt_log(ATRIUM_LOG_INFO, "core", "search by %s: matches in over %d rooms; the rooms with "
               "older matches were not searched", s->r->user, SEARCH_MAX_ROOMS);
    s->room_ids = rt_arena_alloc(s->r->arena, (size_t)(n > 0 ? n : 1) * sizeof(char *));
    s->vis = malloc((size_t)(n > 0 ? n : 1) * sizeof(rooms_vis));
    json_t *ranges = json_array();
    int rc = s->room_ids && s->vis && ranges ? ROOMS_OK : ROOMS_E_DB;
    for (int i = 0; rc == ROOMS_OK && i < n; i++) {
        s->room_ids[i] = rt_arena_strdup(s->r->arena, PQgetvalue(res, i, 0));
        rc = s->room_ids[i] ? rooms_vis_load(s->c, s->room_ids[i], s->r->user, &s->vis[i])
                            : ROOMS_E_DB;
        s->n_rooms = i + 1;
        for (int k = 0; rc == ROOMS_OK && k < s->vis[i].n; k++) {
            /* Each visible range in pieces, joined or not, so the match leaves out what
             * erasure hides (match_sql). */
            int64_t plo[2 * ROOMS_VIS_MAX_RANGES + 1], phi[2 * ROOMS_VIS_MAX_RANGES + 1];
            bool pj[2 * ROOMS_VIS_MAX_RANGES + 1];
            int np = rooms_vis_joined_pieces(&s->vis[i], s->vis[i].lo[k], s->vis[i].hi[k], plo,
                                             phi, pj, 2 * ROOMS_VIS_MAX_RANGES + 1);
            for (int m = 0; m < np; m++)
                json_array_append_new(ranges, json_pack("{s:s, s:I, s:I, s:i, s:b}", "r",
                                                        s->room_ids[i], "l", (json_int_t)plo[m],
                                                        "h", (json_int_t)phi[m], "i", i, "j",
                                                        pj[m]));
        }
    }
    PQclear(res);
    char *text = rc == ROOMS_OK ? json_dumps(ranges, JSON_COMPACT) : NULL;
    s->ranges = text ? rt_arena_strdup(s->r->arena, text) : NULL;
    free(text);
    json_decref(ranges);
    if (rc == ROOMS_OK && !s->ranges) rc = ROOMS_E_DB;
    *fail = rc;
    return rc;
}

/* The matches: events of the searched rooms inside their visible ranges, less what
 * erasure hides (an erased sender's events where the user was not joined: a new reader
 * cannot find them by their words). Parameters $1 term, $2 ranges, $3 key types, $4..$7
 * the filter's lists. */
static const char *match_sql(search_run *s)
{
    return rt_arena_printf(
        s->r->arena,
        " FROM json_to_recordset($2::json) AS v(r text, l bigint, h bigint, i int, j boolean)"
        " JOIN events e ON e.room_id = v.r AND e.stream_pos > v.l AND e.stream_pos <= v.h"
        " WHERE e.search_tsv @@ " SEARCH_TSQUERY
        " AND e.redacted_by IS NULL AND e.type = ANY($3::text[])%s%s",
        rooms_filter_sql(s->r->arena, 4), rooms_erasure_sql(s->r->arena, "v.j"));
}

/* How many events match, up to SEARCH_COUNT_MAX; or a failure. */
static int64_t count_matches(search_run *s, int *fail)
{
    const search_req *q = s->q;
    const char *p[8] = {q->term, s->ranges, q->key_types, q->f.types, q->f.not_types,
                        q->f.senders, q->f.not_senders, crooms_i64(s->r, SEARCH_COUNT_MAX)};
    const char *sql = rt_arena_printf(s->r->arena, "SELECT count(*) FROM (SELECT 1%s"
                                      " LIMIT $8::bigint) x", match_sql(s));
    PGresult *res = search_q(s->c, sql, 8, p, fail);
    if (!res) return *fail;
    int64_t n = atoll(PQgetvalue(res, 0, 0));
    PQclear(res);
    return n;
}

/* One page of matches after the token, in the request's order, one more than the page
 * size (to know whether another page exists): rows (stream_pos, rank, room index). */
static PGresult *page_matches(search_run *s, int *fail)
{
    const search_req *q = s->q;
    const char *p[10] = {q->term, s->ranges, q->key_types, q->f.types, q->f.not_types,
                         q->f.senders, q->f.not_senders, crooms_i64(s->r, q->limit + 1),
                         q->recent ? q->after_pos : q->after_rank, q->after_pos};
    const char *after =
        q->recent ? " AND ($9::bigint IS NULL OR e.stream_pos < $9::bigint)"
                  : " AND ($9::real IS NULL OR (ts_rank(e.search_tsv, " SEARCH_TSQUERY "),"
                    " e.stream_pos) < ($9::real, $10::bigint))";
    const char *sql = rt_arena_printf(
        s->r->arena,
        "SELECT e.stream_pos, ts_rank(e.search_tsv, " SEARCH_TSQUERY ") AS rank, v.i%s%s"
        " ORDER BY %s LIMIT $8::bigint",
        match_sql(s), after, q->recent ? "e.stream_pos DESC" : "rank DESC, e.stream_pos DESC");
    return search_q(s->c, sql, q->recent ? 9 : 10, p, fail);
}

/* The profile of every sender of events (their m.room.member content at upto), for
 * include_profile: {user_id: {displayname, avatar_url}}. */
static json_t *profiles(search_run *s, int idx, int64_t upto, json_t *events)
{
    const char *room = s->room_ids[idx];
    events_view view = view_of(s, idx);
    json_t *senders = json_array(), *members = json_array(), *out = json_object();
    for (size_t i = 0; i < json_array_size(events); i++) {
        json_t *who = json_object_get(json_array_get(events, i), "sender");
        bool seen = false;
        for (size_t j = 0; j < json_array_size(senders) && !seen; j++)
            seen = json_equal(json_array_get(senders, j), who);
        if (!seen && json_is_string(who)) json_array_append(senders, who);
    }
    json_t *type = json_pack("[s]", "m.room.member");
    const char *types = rooms_pg_array(s->r->arena, type);
    json_decref(type);
    int rc = types ? events_state_at(s->c, &view, room, upto, senders, types, members)
                   : ROOMS_E_DB;
    for (size_t i = 0; rc >= 0 && i < json_array_size(members); i++) {
        json_t *ev = json_array_get(members, i), *content = json_object_get(ev, "content");
        json_t *profile = json_object();
        json_t *dn = json_object_get(content, "displayname");
        json_t *av = json_object_get(content, "avatar_url");
        if (json_is_string(dn)) json_object_set(profile, "displayname", dn);
        if (json_is_string(av)) json_object_set(profile, "avatar_url", av);
        json_object_set_new(out, json_string_value(json_object_get(ev, "state_key")), profile);
    }
    json_decref(senders);
    json_decref(members);
    if (rc < 0) {
        json_decref(out);
        return NULL;
    }
    return out;
}

/* Up to limit events the user may see in the room before (back) or after a position. */
static int context_side(search_run *s, int idx, int64_t pos, int64_t limit, bool back,
                        json_t *out, int64_t *last)
{
    if (limit == 0) return 0;
    const char *p[2 + ROOMS_VIS_PARAMS] = {s->room_ids[idx], crooms_i64(s->r, limit)}, *vis;
    int64_t lo = back ? 0 : pos, hi = back ? pos - 1 : INT64_MAX;
    if (!rooms_vis_window(s->r->arena, &s->vis[idx], lo, hi, false, 3, &vis, p + 2)) return 0;
    const char *sql = rt_arena_printf(s->r->arena, EVENTS_SELECT "WHERE e.room_id = $1%s"
                                      " ORDER BY e.stream_pos %s LIMIT $2::bigint",
                                      vis, back ? "DESC" : "ASC");
    int64_t first;
    events_view view = view_of(s, idx);
    return events_fetch(s->c, &view, sql, 2 + ROOMS_VIS_PARAMS, p, out, &first, last);
}

/* The `context` of a result: the events around it, their pagination tokens, profiles. */
static json_t *context_of(search_run *s, int idx, int64_t pos, json_t *result)
{
    json_t *before = json_array(), *after = json_array();
    int64_t b_last = pos, a_last = pos;
    int nb = context_side(s, idx, pos, s->q->before, true, before, &b_last);
    int na = nb < 0 ? nb : context_side(s, idx, pos, s->q->after, false, after, &a_last);
    json_t *ctx = json_pack("{s:o, s:o, s:s, s:s}", "events_before", before, "events_after",
                            after, "start", crooms_token(s->r, nb > 0 ? b_last - 1 : pos - 1),
                            "end", crooms_token(s->r, a_last));
    if (na < 0 || !ctx) {
        json_decref(ctx);
        return NULL;
    }
    if (s->q->profile) {
        json_t *all = json_array();
        json_array_append(all, result);
        json_array_extend(all, before);
        json_array_extend(all, after);
        json_t *info = profiles(s, idx, a_last, all);
        json_decref(all);
        if (!info) {
            json_decref(ctx);
            return NULL;
        }
        json_object_set_new(ctx, "profile_info", info);
    }
    return ctx;
}

/* The events of a page's positions, rendered, in the page's order into results
 * [{rank, result, context?}]; `state` per room when asked. */
static int render_page(search_run *s, PGresult *page, int rows, json_t *results, json_t *state)
{
    json_t *positions = json_array();
    for (int i = 0; i < rows; i++)
        json_array_append_new(positions, json_string(PQgetvalue(page, i, 0)));
    const char *p[1] = {rooms_pg_array(s->r->arena, positions)};
    json_decref(positions);
    PGresult *res = p[0] ? rooms_q(s->c, EVENTS_SELECT "WHERE e.stream_pos = ANY($1::bigint[])",
                                   1, p, NULL)
                         : NULL;
    if (!res) return ROOMS_E_DB;
    int rc = ROOMS_OK;
    for (int i = 0; rc == ROOMS_OK && i < rows; i++) {
        int64_t pos = atoll(PQgetvalue(page, i, 0));
        int idx = atoi(PQgetvalue(page, i, 2));
        events_view view = view_of(s, idx);
        json_t *ev = NULL;
        for (int j = 0; !ev && j < PQntuples(res); j++)
            if (events_pos(res, j) == pos) ev = events_render(&view, res, j);
        if (!ev) continue; /* a corrupt row (logged) */
        json_t *one = json_pack("[O]", ev); /* bundled aggregations, as other readers */
        if (!one || crooms_bundle_add(s->c, s->r->arena, &view, s->room_ids[idx], &s->vis[idx],
                                     one) < 0)
            rc = ROOMS_E_DB;
        json_decref(one);
        json_t *item = json_pack("{s:f, s:o}", "rank", strtod(PQgetvalue(page, i, 1), NULL),
                                 "result", ev);
        json_t *ctx = s->q->context ? context_of(s, idx, pos, ev) : NULL;
        if (s->q->context && !ctx) rc = ROOMS_E_DB;
        if (ctx) json_object_set_new(item, "context", ctx);
        json_array_append_new(results, item);
        const char *room = s->room_ids[idx];
        if (rc == ROOMS_OK && state && !json_object_get(state, room)) {
            json_t *events = json_array();
            json_object_set_new(state, room, events);
            if (events_state_at(s->c, &view, room, INT64_MAX, NULL, NULL, events) < 0)
                rc = ROOMS_E_DB;
        }
    }
    PQclear(res);
    return rc;
}

/* The words a client should highlight: the term's searchable words (not -negated ones). */
static json_t *highlights(search_run *s, int *fail)
{
    const char *p[1] = {s->q->term};
    PGresult *res = search_q(s->c,
                             "SELECT x FROM websearch_to_tsquery('simple', $1) w, unnest(CASE"
                             " WHEN w::text = '' OR querytree(w) = 'T' THEN '{}'::text[] ELSE"
                             " tsvector_to_array(to_tsvector('simple', querytree(w))) END) x",
                             1, p, fail);
    if (!res) return NULL;
    json_t *out = json_array();
    for (int i = 0; i < PQntuples(res); i++)
        json_array_append_new(out, json_string(PQgetvalue(res, i, 0)));
    PQclear(res);
    return out;
}

/* The whole room_events answer into *out; ROOMS_OK, ROOMS_E_DB or SEARCH_E_TIMEOUT. */
static int run_search(search_run *s, json_t **out)
{
    int fail = ROOMS_OK;
    json_t *words = highlights(s, &fail);
    if (!words || load_rooms(s, &fail) < 0) {
        json_decref(words);
        return fail;
    }
    json_t *body = json_pack("{s:o, s:[], s:I}", "highlights", words, "results", "count",
                             (json_int_t)0);
    if (s->n_rooms == 0) {
        *out = body;
        return ROOMS_OK;
    }
    int64_t count = count_matches(s, &fail);
    PGresult *page = count < 0 ? NULL : page_matches(s, &fail);
    if (!page) {
        json_decref(body);
        return fail;
    }
    int rows = PQntuples(page);
    bool more = rows > s->q->limit;
    if (more) rows = (int)s->q->limit;
    json_t *state = s->q->state ? json_object() : NULL;
    int rc = render_page(s, page, rows, json_object_get(body, "results"), state);
    json_object_set_new(body, "count", json_integer(count));
    if (state) json_object_set_new(body, "state", state);
    if (more) {
        const char *pos = PQgetvalue(page, rows - 1, 0), *rank = PQgetvalue(page, rows - 1, 1);
        json_object_set_new(body, "next_batch",
                            json_string(s->q->recent ? rt_arena_printf(s->r->arena, "r%s", pos)
                                                     : rt_arena_printf(s->r->arena, "k%s_%s",
                                                                       rank, pos)));
    }
    PQclear(page);
    if (rc < 0) {
        json_decref(body);
        return rc;
    }
    *out = body;
    return ROOMS_OK;
}

/* POST /_matrix/client/v3/search?next_batch= */
static int post_search(atrium_req *r)
{
    const char *user = auth_request(r);
    if (!user) return ATRIUM_DONE;
    json_t *body = http_req_json(r), *cats, *re;
    if (!body || !http_field_object(r, body, "search_categories", true, &cats) ||
        !http_field_object(r, cats, "room_events", false, &re))
        return ATRIUM_DONE;
    if (!re) return http_respond_json(r, 200, json_pack("{s:{}}", "search_categories"));
    search_req q;
    if (!parse_room_events(r, re, &q)) return ATRIUM_DONE;
    search_run s = {.r = r, .q = &q,
                    .view = {.user_id = user, .device_id = r->device, .with_room_id = true,
                             .now_ms = rooms_wall_ms()}};
    if (!(s.c = http_db_checkout(r))) return ATRIUM_DONE;
    json_t *answer = NULL;
    int rc = begin_bounded(s.c);
    if (rc == ROOMS_OK) rc = run_search(&s, &answer);
    /* The transaction only read: a failed COMMIT changes nothing the answer says. */
    if (rc == ROOMS_OK) RT_IGNORE(db_commit(s.c));
    else db_rollback(s.c);
    http_db_checkin(s.c);
    free(s.vis);
    if (rc == SEARCH_E_TIMEOUT)
        return http_respond_error(r, 503, "M_UNKNOWN",
                                  "The search took too long; try more specific words");
    if (rc < 0 || !answer)
        return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    return http_respond_json(r, 200, json_pack("{s:{s:o}}", "search_categories", "room_events",
                                               answer));
}

int crooms_search_routes(http_server *s)
{
    return client_route(s, "POST", "/_matrix/client/v3/search", post_search,
                        SEARCH_MAX_BODY_BYTES);
}
