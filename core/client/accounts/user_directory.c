/*
 * core/client/accounts/user_directory.c - the user directory: POST /user_directory/search, which
 * Element's invite dialog and "Start chat" use to find people on this server.
 *
 * This file owns two decisions. Who may be found (Synapse's default, search_all_users
 * off): a local user who is not deactivated and who is joined now to a room the searcher
 * is joined to now, or to a public room: one whose current join rule is "public" or whose
 * current history visibility is "world_readable" (anyone may read it, members included).
 * Both are read from the current state at each search, so a change of either applies at
 * once: a member whose only such room turns invite-only and not world-readable drops out of
 * the next search. A room shared with the searcher counts only for the others in it: the
 * searcher finds themselves only while joined to a public room (as Synapse, whose shared-room
 * pairs never pair a user with themselves), so a user alone in private rooms is not listed
 * even to themselves. And what
 * matches: the term is split at whitespace into words, and every word must be, case
 * folded, the start of a word of the user's "@localpart" or display name. Words there are
 * delimited by whitespace and, for a term word without ASCII punctuation, by ASCII
 * punctuation too ("smi" finds "@alice.smith", "bob" finds "@bob", "o'b" finds
 * "Pat O'Brien", "'b" finds nobody). A term that is a whole user ID finds that user. LIKE
 * wildcards in the term are plain characters. Exact matches (the user ID, the localpart or
 * the display name equal to the term) come first, then the rest by display name (the
 * localpart when unset), then user ID. Case folding is the database's lower(): beyond
 * ASCII it follows the database's LC_CTYPE (none under the C locale).
 *
 * Both rules are one SQL statement over the accounts tables (users, profiles) and the rooms
 * module's current_state and events (see core/rooms/rooms.h), without tables or indexes of its own.
 * The word match reads users and profiles once, with LIKE only (no regular expressions); the
 * candidates are sorted, and then checked in that order for a shared or public room through index
 * probes (current_state_members, the keys of current_state and events) until limit + 1 are found,
 * never by listing every member of every public room. What this file does not do: search remote
 * users over federation, keep a directory table, or rate-limit searches beyond the server's general
 * limits.
 */
#include <string.h>

#include "core/client/accounts/accounts.h"

#define UDIR_TERM_MAX_BYTES 256 /* search_term */
#define UDIR_LIMIT_DEFAULT 10   /* results when the body gives no limit */
#define UDIR_LIMIT_MAX 50       /* a larger limit is lowered to this */

/* Besides whitespace, ASCII punctuation separates words: the four ranges below, which
 * is_separator and the bracket expression in SEARCH_SQL both spell. Other characters
 * (letters, digits, anything beyond ASCII) belong to words, whatever the database's
 * locale. */
static bool is_separator(char c)
{
    return (c >= '!' && c <= '/') || (c >= ':' && c <= '@') || (c >= '[' && c <= '`') ||
           (c >= '{' && c <= '~');
}

/* The search. $1 the searcher, $2 the whole term (trimmed), $3 and $4 the words with and
 * without separators, LIKE-escaped and joined by newlines, $5 how many rows at most.
 * Per user, `raw` is " @localpart display name", case folded; h1 (the first
 * regexp_replace) is raw with each run of whitespace one space, h2 (the second) with each
 * run of whitespace or separators one space. A
 * word with separators must start a word of h1, one without them a word of h2 (which for
 * such a word includes the first case); every word must first occur in raw at all, a
 * cheap test that spares most users the regular expressions. The candidates are sorted
 * first (one pass over users and profiles); then, in that order, each is checked for a
 * room shared with the searcher (for others) or a public room until enough are found, so a
 * broad term does not probe the rooms of every user it matches. OFFSET 0 keeps the room
 * check out of the sorted subquery, whose order the outer ORDER BY then reuses without
 * sorting again. */
static const char SEARCH_SQL[] =
    "WITH mine AS MATERIALIZED ("
    "  SELECT room_id FROM current_state"
    "   WHERE type = 'm.room.member' AND state_key = $1 AND membership = 'join')"
    " SELECT m.user_id, m.displayname, m.avatar_url FROM ("
    "  SELECT u.user_id, p.displayname, p.avatar_url,"
    "         (lower(u.user_id) = t.whole OR n.lp = t.whole"
    "          OR coalesce(lower(p.displayname) = t.whole, false)) AS exact,"
    "         coalesce(lower(p.displayname), n.lp) AS sort_key"
    "    FROM users u LEFT JOIN profiles p ON p.user_id = u.user_id"
    "   CROSS JOIN (SELECT lower($2) AS whole,"
    "     ARRAY(SELECT '%' || w || '%' FROM unnest(string_to_array(lower($3 || chr(10) || $4),"
    "           chr(10))) w WHERE w <> '') AS anywhere,"
    "     ARRAY(SELECT '% ' || w || '%' FROM unnest(string_to_array(lower($3), chr(10))) w)"
    "       AS with_sep,"
    "     ARRAY(SELECT '% ' || w || '%' FROM unnest(string_to_array(lower($4), chr(10))) w)"
    "       AS without_sep) t"
    "   CROSS JOIN LATERAL (SELECT substr(split_part(lower(u.user_id), ':', 1), 2) AS lp) n"
    "   CROSS JOIN LATERAL (SELECT ' @' || n.lp || ' ' || coalesce(lower(p.displayname), '')"
    "                        AS raw) h"
    "   WHERE NOT u.deactivated"
    "     AND (lower(u.user_id) = t.whole"
    "          OR (h.raw LIKE ALL (t.anywhere)"
    "              AND regexp_replace(h.raw, '[[:space:]]+', ' ', 'g') LIKE ALL (t.with_sep)"
    "              AND regexp_replace(h.raw, '[[:space:]!-/:-@[-`{-~]+', ' ', 'g')"
    "                  LIKE ALL (t.without_sep)))"
    "   ORDER BY exact DESC, sort_key, u.user_id OFFSET 0) m"
    "  WHERE EXISTS (SELECT 1 FROM current_state a"
    "   WHERE a.type = 'm.room.member' AND a.state_key = m.user_id AND a.membership = 'join'"
    "     AND ((m.user_id <> $1 AND a.room_id IN (SELECT room_id FROM mine))"
    "          OR EXISTS (SELECT 1 FROM current_state jr"
    "                      JOIN events e ON e.event_id = jr.event_id"
    "                     WHERE jr.room_id = a.room_id AND jr.type = 'm.room.join_rules'"
    "                       AND jr.state_key = ''"
    "                       AND (e.pdu::jsonb) -> 'content' ->> 'join_rule' = 'public')"
    "          OR EXISTS (SELECT 1 FROM current_state hv"
    "                      JOIN events e ON e.event_id = hv.event_id"
    "                     WHERE hv.room_id = a.room_id"
    "                       AND hv.type = 'm.room.history_visibility' AND hv.state_key = ''"
    "                       AND (e.pdu::jsonb) -> 'content' ->> 'history_visibility'"
    "                           = 'world_readable')))"
    "  ORDER BY m.exact DESC, m.sort_key, m.user_id"
    "  LIMIT $5::bigint";

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* The term's words: the term split at ASCII whitespace. */
typedef struct udir_terms {
    const char *whole;       /* the term without surrounding whitespace */
    const char *with_sep;    /* the words holding a separator, LIKE-escaped, */
    const char *without_sep; /* and the others; each list joined by newlines */
    bool empty;              /* no words at all */
} udir_terms;

/* Append word to the list at *w (a newline first unless the list is empty), with \, %
 * and _ escaped by a backslash (LIKE's default escape). */
static void add_word(char *list, char **w, const char *word, size_t len)
{
    if (*w > list) *(*w)++ = '\n';
    for (size_t i = 0; i < len; i++) {
        if (word[i] == '\\' || word[i] == '%' || word[i] == '_') *(*w)++ = '\\';
        *(*w)++ = word[i];
    }
    **w = '\0';
}

/* Split term into out (strings in arena a). false on out of memory. */
static bool udir_term_words(rt_arena *a, const char *term, udir_terms *out)
{
    size_t len = strlen(term);
    /* A list holds each word escaped (2 bytes a byte at most) and a newline between. */
    char *with = rt_arena_alloc(a, 2 * len + 1), *without = rt_arena_alloc(a, 2 * len + 1);
    char *whole = rt_arena_alloc(a, len + 1);
    if (!with || !without || !whole) return false;
    char *ww = with, *wo = without;
    const char *start = term, *end = term + len;
    while (start < end && is_space(*start)) start++;
    while (end > start && is_space(end[-1])) end--;
    memcpy(whole, start, (size_t)(end - start));
    out->whole = whole;
    out->empty = start == end;
    for (const char *c = start; c < end;) {
        if (is_space(*c)) {
            c++;
            continue;
        }
        const char *word = c;
        bool sep = false;
        for (; c < end && !is_space(*c); c++) sep = sep || is_separator(*c);
        if (sep) add_word(with, &ww, word, (size_t)(c - word));
        else add_word(without, &wo, word, (size_t)(c - word));
    }
    out->with_sep = with;
    out->without_sep = without;
    return true;
}

/* Read body.limit: UDIR_LIMIT_DEFAULT when absent, at most UDIR_LIMIT_MAX. false after
 * answering 400 (M_BAD_JSON not an integer, M_INVALID_PARAM negative). */
static bool read_limit(atrium_req *r, json_t *body, int64_t *out)
{
    json_t *v = json_object_get(body, "limit");
    *out = UDIR_LIMIT_DEFAULT;
    if (!v || json_is_null(v)) return true;
    if (!json_is_integer(v)) {
        http_respond_error(r, 400, "M_BAD_JSON", "'limit' must be an integer");
        return false;
    }
    json_int_t n = json_integer_value(v);
    if (n < 0) {
        http_respond_error(r, 400, "M_INVALID_PARAM", "'limit' must not be negative");
        return false;
    }
    *out = n > UDIR_LIMIT_MAX ? UDIR_LIMIT_MAX : (int64_t)n;
    return true;
}

static json_t *empty_answer(void)
{
    return json_pack("{s:[], s:b}", "results", "limited", 0);
}

/* One row of SEARCH_SQL as {user_id, display_name?, avatar_url?}. */
static json_t *result_of(PGresult *res, int row)
{
    json_t *o = json_pack("{s:s}", "user_id", PQgetvalue(res, row, 0));
    if (o && !PQgetisnull(res, row, 1))
        json_object_set_new(o, "display_name", json_string(PQgetvalue(res, row, 1)));
    if (o && !PQgetisnull(res, row, 2))
        json_object_set_new(o, "avatar_url", json_string(PQgetvalue(res, row, 2)));
    return o;
}

/* POST /_matrix/client/v3/user_directory/search {"search_term", "limit"?} */
static int search(atrium_req *r)
{
    if (!auth_request(r)) return ATRIUM_DONE;
    json_t *body = http_req_json(r);
    const char *term;
    int64_t limit;
    if (!body || !http_field_string(r, body, "search_term", true, UDIR_TERM_MAX_BYTES, &term) ||
        !read_limit(r, body, &limit))
        return ATRIUM_DONE;
    udir_terms t;
    if (!udir_term_words(r->arena, term, &t))
        return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    if (t.empty) return http_respond_json(r, 200, empty_answer());
    /* One row past the limit tells whether there were more. */
    const char *rows = rt_arena_printf(r->arena, "%lld", (long long)(limit + 1));
    if (!rows) return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    const char *p[5] = {r->user, t.whole, t.with_sep, t.without_sep, rows};
    PGresult *res = acc_q(c, SEARCH_SQL, 5, p);
    http_db_checkin(c);
    if (!res) return acc_db_failed(r);
    int n = PQntuples(res);
    json_t *results = json_array();
    for (int i = 0; results && i < n && i < limit; i++)
        if (json_array_append_new(results, result_of(res, i)) < 0) {
            json_decref(results);
            results = NULL;
        }
    PQclear(res);
    json_t *answer = results ? json_pack("{s:o, s:b}", "results", results, "limited", n > limit)
                             : NULL;
    if (!answer) return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    return http_respond_json(r, 200, answer);
}

int acc_user_directory_routes(http_server *s)
{
    return client_route(s, "POST", "/_matrix/client/v3/user_directory/search", search,
                        ACC_MAX_BODY_BYTES);
}
