/*
 * core/rooms/events_store.c - stored events back to clients: one renderer for every
 * endpoint that returns events (/sync, /messages, /context, /state, /members, ...).
 *
 * The client format comes from events.c; this file adds what only the database knows, in
 * `unsigned`: age, the transaction ID for the sender's own device, the content of the
 * state event this one replaced (prev_content, replaces_state, prev_sender), and the
 * redaction that redacted it (redacted_because). A redacted event is always served
 * redacted, with the algorithm of its room's version, and so is one that erasure hides
 * from the reader (rooms_erasure_hides: an erased sender, a reader not joined at it),
 * whether it is the event itself, the state it replaced (prev_content) or its redaction.
 * It also keeps the SQL of the readers' event filters, the client's (room_filter) and the
 * user's own ignore list (rooms_ignored_users: ignored users' message events leave
 * timelines, their state events stay). It does not decide who may see which events
 * (rooms_vis.c, core/client/sync/sync.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rooms/events_pdus.h"
#include "core/rooms/rooms.h"

/* Columns of EVENTS_SELECT. */
enum {
    COL_POS = 0, COL_ID, COL_PDU, COL_REDACTED_BY, COL_TXN_DEVICE, COL_TXN_ID, COL_VERSION,
    COL_PREV_PDU, COL_PREV_REDACTED_BY, COL_REDACTION_PDU, COL_REDACTION_ID, COL_REPLACES,
    COL_ERASED, COL_PREV_POS, COL_PREV_ERASED, COL_REDACTION_POS, COL_REDACTION_ERASED,
    COL_DEPTH, /* EVENTS_COL_DEPTH */
};

/* Does erasure hide the event `pdu` (its sender erased: the boolean column erased_col; at
 * the position in pos_col) from v's reader? */
static bool erased_for(const events_view *v, PGresult *res, int row, int erased_col,
                       int pos_col, const json_t *pdu)
{
    if (PQgetvalue(res, row, erased_col)[0] != 't') return false;
    return rooms_erasure_hides(v, true, json_string_value(json_object_get(pdu, "type")),
                               json_object_get(pdu, "state_key") != NULL,
                               atoll(PQgetvalue(res, row, pos_col)));
}

int64_t events_pos(PGresult *res, int row)
{
    return atoll(PQgetvalue(res, row, COL_POS));
}

/* A child of a shared PDU for a result: copied, never referenced (events_pdus.h); NULL
 * (nothing set) when absent. */
static json_t *copied(const json_t *v)
{
    return v ? json_deep_copy(v) : NULL;
}

static void add_prev_state(json_t *uns, const events_view *v, const room_version *ver,
                           PGresult *res, int row)
{
    events_pdus *pdus = events_pdus_global();
    json_t *prev = events_pdus_get(pdus, PQgetvalue(res, row, COL_REPLACES), PQgetvalue(res, row, COL_PREV_PDU));
    if (!prev) return;
    const char *type = json_string_value(json_object_get(prev, "type"));
    json_t *content = json_object_get(prev, "content");
    if (!PQgetisnull(res, row, COL_PREV_REDACTED_BY) ||
        erased_for(v, res, row, COL_PREV_ERASED, COL_PREV_POS, prev))
        json_object_set_new(uns, "prev_content", event_redact_content(ver, type, content));
    else if (content)
        json_object_set_new(uns, "prev_content", json_deep_copy(content));
    json_object_set_new(uns, "prev_sender", copied(json_object_get(prev, "sender")));
    json_object_set_new(uns, "replaces_state", json_string(PQgetvalue(res, row, COL_REPLACES)));
    events_pdus_put(pdus, prev);
}

/* The PDUs come from the process's shared parsed PDUs (events_pdus.h): read, and nothing
 * of them referenced by the result (event_client_format copies what it takes). */
json_t *events_render(const events_view *v, PGresult *res, int row)
{
    const char *event_id = PQgetvalue(res, row, COL_ID);
    const room_version *ver = room_version_find(PQgetvalue(res, row, COL_VERSION));
    events_pdus *pdus = events_pdus_global();
    json_t *pdu = events_pdus_get(pdus, event_id, PQgetvalue(res, row, COL_PDU));
    if (!pdu || !ver) {
        rt_log(ATRIUM_LOG_ERROR, "core", "stored event %s cannot be read", event_id);
        events_pdus_put(pdus, pdu);
        return NULL;
    }
    bool redacted = !PQgetisnull(res, row, COL_REDACTED_BY);
    bool erased = !redacted && erased_for(v, res, row, COL_ERASED, COL_POS, pdu);
    json_t *out = event_client_format(ver, pdu, event_id, redacted || erased, v->with_room_id);
    json_t *uns = json_object();
    int64_t ts = json_integer_value(json_object_get(pdu, "origin_server_ts"));
    json_object_set_new(uns, "age", json_integer(v->now_ms > ts ? v->now_ms - ts : 0));
    const char *sender = json_string_value(json_object_get(pdu, "sender"));
    if (!PQgetisnull(res, row, COL_TXN_ID) && v->device_id && v->user_id && sender &&
        strcmp(sender, v->user_id) == 0 &&
        strcmp(PQgetvalue(res, row, COL_TXN_DEVICE), v->device_id) == 0)
        json_object_set_new(uns, "transaction_id", json_string(PQgetvalue(res, row, COL_TXN_ID)));
    if (!PQgetisnull(res, row, COL_PREV_PDU)) add_prev_state(uns, v, ver, res, row);
    if (redacted && !PQgetisnull(res, row, COL_REDACTION_PDU)) {
        const char *rid = PQgetvalue(res, row, COL_REDACTION_ID);
        json_t *rpdu = events_pdus_get(pdus, rid, PQgetvalue(res, row, COL_REDACTION_PDU));
        bool r_erased = rpdu && erased_for(v, res, row, COL_REDACTION_ERASED, COL_REDACTION_POS, rpdu);
        if (rpdu)
            json_object_set_new(uns, "redacted_because",
                                event_client_format(ver, rpdu, rid, r_erased, v->with_room_id));
        events_pdus_put(pdus, rpdu);
    }
    json_object_set_new(out, "unsigned", uns);
    events_pdus_put(pdus, pdu);
    return out;
}

int events_fetch(PGconn *c, const events_view *v, const char *sql, int n,
                 const char *const *params, json_t *out, int64_t *first_pos, int64_t *last_pos)
{
    events_topo first, last;
    int rows = events_fetch_topo(c, v, sql, n, params, out, &first, &last);
    if (rows > 0 && first_pos) *first_pos = first.pos;
    if (rows > 0 && last_pos) *last_pos = last.pos;
    return rows;
}

int events_fetch_topo(PGconn *c, const events_view *v, const char *sql, int n,
                      const char *const *params, json_t *out, events_topo *first, events_topo *last)
{
    PGresult *res = rooms_q(c, sql, n, params, NULL);
    if (!res) return ROOMS_E_DB;
    int rows = PQntuples(res);
    for (int i = 0; i < rows; i++) {
        json_t *ev = events_render(v, res, i);
        if (ev) json_array_append_new(out, ev);
    }
    if (rows > 0) {
        if (first) *first = (events_topo){atoll(PQgetvalue(res, 0, COL_DEPTH)), events_pos(res, 0)};
        if (last)
            *last = (events_topo){atoll(PQgetvalue(res, rows - 1, COL_DEPTH)), events_pos(res, rows - 1)};
    }
    PQclear(res);
    return rows;
}

json_t *events_load_pdu(PGconn *c, const char *event_id, const char *room_id,
                        const room_version **ver_out, bool *redacted_out)
{
    const char *p[2] = {event_id, room_id};
    PGresult *res = rooms_q(c,
                            "SELECT e.pdu, rm.room_version, e.redacted_by IS NOT NULL FROM events e"
                            " JOIN rooms rm ON rm.room_id = e.room_id"
                            " WHERE e.event_id = $1 AND e.room_id = $2",
                            2, p, NULL);
    if (!res) return NULL;
    json_t *pdu = NULL;
    if (PQntuples(res) == 1) {
        pdu = json_loads(PQgetvalue(res, 0, 0), 0, NULL);
        if (ver_out) *ver_out = room_version_find(PQgetvalue(res, 0, 1));
        if (redacted_out) *redacted_out = PQgetvalue(res, 0, 2)[0] == 't';
    }
    PQclear(res);
    return pdu;
}

const char *rooms_pg_array(rt_arena *a, const json_t *strings)
{
    size_t cap = 3;
    for (size_t i = 0; i < json_array_size(strings); i++)
        cap += 2 * json_string_length(json_array_get(strings, i)) + 3;
    char *out = rt_arena_alloc(a, cap);
    if (!out) return NULL;
    char *w = out;
    *w++ = '{';
    for (size_t i = 0; i < json_array_size(strings); i++) {
        const char *s = json_string_value(json_array_get(strings, i));
        if (!s) continue;
        if (w > out + 1) *w++ = ',';
        *w++ = '"';
        for (; *s; s++) {
            if (*s == '"' || *s == '\\') *w++ = '\\';
            *w++ = *s;
        }
        *w++ = '"';
    }
    *w++ = '}';
    *w = '\0';
    return out;
}

int events_state_at(PGconn *c, const events_view *v, const char *room_id, int64_t upto,
                    const json_t *members, const char *types, json_t *out)
{
    return events_state_between(c, v, room_id, 0, upto, members, types, out);
}

int events_state_between(PGconn *c, const events_view *v, const char *room_id, int64_t after,
                         int64_t upto, const json_t *members, const char *types, json_t *out)
{
    char upto_s[24], after_s[24];
    snprintf(upto_s, sizeof(upto_s), "%lld", (long long)upto);
    snprintf(after_s, sizeof(after_s), "%lld", (long long)after);
    rt_arena *a = rt_arena_new(1024);
    if (!a) return ROOMS_E_DB;
    const char *member_arr = members ? rooms_pg_array(a, members) : NULL;
    const char *p[5] = {room_id, upto_s, member_arr, types, after_s};
    /* Current state from current_state; an older one (or the changes in a window) from the
     * newest state event per key. */
    const char *sql =
        upto == INT64_MAX && after <= 0
            ? EVENTS_SELECT "WHERE e.event_id IN (SELECT cs.event_id FROM current_state cs"
                            " WHERE cs.room_id = $1 AND $2::bigint > $5::bigint"
                            " AND ($3::text[] IS NULL OR cs.type <> 'm.room.member'"
                            "  OR cs.state_key = ANY($3::text[]))"
                            " AND ($4::text[] IS NULL OR cs.type = ANY($4::text[])))"
                            " ORDER BY e.stream_pos"
            : EVENTS_SELECT "WHERE e.stream_pos IN (SELECT DISTINCT ON (s.type, s.state_key)"
                            " s.stream_pos FROM events s WHERE s.room_id = $1"
                            " AND s.state_key IS NOT NULL AND s.stream_pos <= $2"
                            " AND s.stream_pos > $5"
                            " ORDER BY s.type, s.state_key, s.stream_pos DESC)"
                            " AND ($3::text[] IS NULL OR e.type <> 'm.room.member'"
                            "  OR e.state_key = ANY($3::text[]))"
                            " AND ($4::text[] IS NULL OR e.type = ANY($4::text[]))"
                            " ORDER BY e.stream_pos";
    int rows = events_fetch(c, v, sql, 5, p, out, NULL, NULL);
    rt_arena_free(a);
    return rows;
}

/* ---- event filters ------------------------------------------------------------------ */

const char *rooms_filter_sql(rt_arena *a, int n)
{
    return rt_arena_printf(a,
                           " AND ($%d::text[] IS NULL OR e.type LIKE ANY($%d::text[]))"
                           " AND ($%d::text[] IS NULL OR NOT (e.type LIKE ANY($%d::text[])))"
                           " AND ($%d::text[] IS NULL OR e.sender = ANY($%d::text[]))"
                           " AND ($%d::text[] IS NULL OR NOT (e.sender = ANY($%d::text[])))",
                           n, n, n + 1, n + 1, n + 2, n + 2, n + 3, n + 3);
}

/* A list of strings from f[key] as a text[] literal; types become LIKE patterns. */
static bool filter_list(rt_arena *a, const json_t *f, const char *key, bool patterns,
                        const char **out, char *why, size_t len)
{
    *out = NULL;
    json_t *v = json_object_get(f, key);
    if (!v || json_is_null(v)) return true;
    if (!json_is_array(v)) {
        snprintf(why, len, "'%s' must be a list of strings", key);
        return false;
    }
    json_t *conv = json_array();
    for (size_t i = 0; i < json_array_size(v); i++) {
        const char *s = json_string_value(json_array_get(v, i));
        if (!s) {
            json_decref(conv);
            snprintf(why, len, "'%s' must be a list of strings", key);
            return false;
        }
        if (!patterns) {
            json_array_append_new(conv, json_string(s));
            continue;
        }
        size_t n = strlen(s);
        char *pat = rt_arena_alloc(a, 2 * n + 1), *w = pat;
        if (!pat) break;
        for (; *s; s++) {
            if (*s == '*') {
                *w++ = '%';
                continue;
            }
            if (*s == '%' || *s == '_' || *s == '\\') *w++ = '\\';
            *w++ = *s;
        }
        *w = '\0';
        json_array_append_new(conv, json_string(pat));
    }
    *out = rooms_pg_array(a, conv);
    json_decref(conv);
    return true;
}

bool rooms_filter_parse(rt_arena *a, const json_t *f, room_filter *out, char *why, size_t len)
{
    memset(out, 0, sizeof(*out));
    out->limit = -1;
    if (!f || json_is_null(f)) return true;
    if (!json_is_object(f)) {
        snprintf(why, len, "A filter must be a JSON object");
        return false;
    }
    json_t *limit = json_object_get(f, "limit"), *lazy = json_object_get(f, "lazy_load_members");
    if (limit && !json_is_integer(limit)) {
        snprintf(why, len, "'limit' must be an integer");
        return false;
    }
    if (limit) out->limit = json_integer_value(limit);
    if (lazy && !json_is_boolean(lazy)) {
        snprintf(why, len, "'lazy_load_members' must be true or false");
        return false;
    }
    out->lazy_load_members = json_is_true(lazy);
    return filter_list(a, f, "types", true, &out->types, why, len) &&
           filter_list(a, f, "not_types", true, &out->not_types, why, len) &&
           filter_list(a, f, "senders", false, &out->senders, why, len) &&
           filter_list(a, f, "not_senders", false, &out->not_senders, why, len);
}

/* ---- ignored users ------------------------------------------------------------------ */

int rooms_ignored_users(PGconn *c, rt_arena *a, const char *user_id, const char **out)
{
    *out = NULL;
    const char *p[1] = {user_id};
    PGresult *res = rooms_q(c,
                            "SELECT " ROOMS_IGNORED_USERS_SQL("content") " FROM account_data"
                            " WHERE user_id = $1 AND room_id = '' AND type = 'm.ignored_user_list'",
                            1, p, NULL);
    if (!res) return ROOMS_E_DB;
    int rc = ROOMS_OK;
    if (PQntuples(res) == 1 && !PQgetisnull(res, 0, 0) && !(*out = rt_arena_strdup(a, PQgetvalue(res, 0, 0))))
        rc = ROOMS_E_DB; /* out of memory: no reading without the list */
    PQclear(res);
    return rc;
}

const char *rooms_ignored_sql(rt_arena *a, int n)
{
    return rt_arena_printf(a,
                           " AND ($%d::text[] IS NULL OR e.state_key IS NOT NULL"
                           " OR NOT (e.sender = ANY($%d::text[])))",
                           n, n);
}
