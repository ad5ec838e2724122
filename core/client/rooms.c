/*
 * core/client/rooms.c - the rooms module: its tables (see rooms.h for the data model), its
 * start-up, and the helpers every room file shares: failures -> Matrix errors, database
 * calls, membership and visibility look-ups, path parameters and pagination tokens.
 *
 * The history visibility rule lives here alone (hv_allows, applied by rooms_vis_compute;
 * rooms.h states it): from the room's m.room.history_visibility changes and the user's
 * membership changes, both read with their stream positions in one query, it computes the
 * short list of position ranges the user may see, plus their own membership events.
 * Every reader of events (rooms_read.c, sync_rooms.c) restricts its SQL with
 * rooms_vis_window, so the rule is never re-implemented beside its twin. Readers answer
 * 403 to a user who was never joined (no peeking, even in world_readable rooms). State
 * (/state, /members, sync's state block) is current room state, not history: it does not
 * go through this rule.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/client/auth.h"
#include "core/client/rooms.h"
#include "core/client/rooms_relations.h"

/* Any 64-bit key not used by another advisory lock (db.c uses 7405418920188311). */

static const atrium_migration MIGRATIONS[] = {
    {1, "rooms_events_state",
     "CREATE TABLE rooms ("
     " room_id text PRIMARY KEY,"
     " room_version text NOT NULL,"
     " creator text NOT NULL,"
     " created_ts bigint NOT NULL,"
     " last_event_id text NOT NULL DEFAULT '',"
     " last_depth bigint NOT NULL DEFAULT 0);"
     "CREATE TABLE events ("
     " stream_pos bigint PRIMARY KEY,"
     " event_id text NOT NULL UNIQUE,"
     " room_id text NOT NULL REFERENCES rooms(room_id),"
     " type text NOT NULL,"
     " state_key text,"
     " sender text NOT NULL,"
     " origin_server_ts bigint NOT NULL,"
     " depth bigint NOT NULL,"
     " pdu text NOT NULL,"
     " replaces_state text,"
     " redacted_by text,"
     " txn_device text,"
     " txn_id text);"
     "CREATE INDEX events_room_pos ON events (room_id, stream_pos);"
     "CREATE INDEX events_room_state ON events (room_id, type, state_key, stream_pos)"
     " WHERE state_key IS NOT NULL;"
     "CREATE TABLE current_state ("
     " room_id text NOT NULL,"
     " type text NOT NULL,"
     " state_key text NOT NULL,"
     " event_id text NOT NULL,"
     " membership text,"
     " PRIMARY KEY (room_id, type, state_key));"
     "CREATE INDEX current_state_members ON current_state (state_key, room_id)"
     " WHERE type = 'm.room.member';"
     "CREATE TABLE memberships ("
     " stream_pos bigint PRIMARY KEY,"
     " room_id text NOT NULL,"
     " user_id text NOT NULL,"
     " membership text NOT NULL,"
     " event_id text NOT NULL,"
     " sender text NOT NULL,"
     " forgotten boolean NOT NULL DEFAULT false);"
     "CREATE INDEX memberships_user ON memberships (user_id, room_id, stream_pos);"
     "CREATE INDEX memberships_user_pos ON memberships (user_id, stream_pos);"
     "CREATE TABLE event_txns ("
     " user_id text NOT NULL,"
     " device_id text NOT NULL,"
     " txn_id text NOT NULL,"
     " event_id text NOT NULL,"
     " created_ts bigint NOT NULL,"
     " PRIMARY KEY (user_id, device_id, txn_id));"
     "CREATE TABLE receipts ("
     " room_id text NOT NULL,"
     " user_id text NOT NULL,"
     " receipt_type text NOT NULL,"
     " thread_id text NOT NULL DEFAULT '',"
     " event_id text NOT NULL,"
     " ts bigint NOT NULL,"
     " stream_pos bigint NOT NULL,"
     " PRIMARY KEY (room_id, user_id, receipt_type, thread_id));"
     "CREATE INDEX receipts_stream ON receipts (room_id, stream_pos);"
     "CREATE TABLE typing ("
     " room_id text NOT NULL,"
     " user_id text NOT NULL,"
     " expires_ts bigint NOT NULL,"
     " stream_pos bigint NOT NULL,"
     " PRIMARY KEY (room_id, user_id));"
     "CREATE INDEX typing_stream ON typing (room_id, stream_pos);"},
    {2, "rooms_event_relations",
     /* Relations by parent (rooms_bundle.c keeps it), filled from the events stored so far. */
     "CREATE TABLE event_relations ("
     " event_id text PRIMARY KEY,"
     " room_id text NOT NULL,"
     " relates_to text NOT NULL,"
     " rel_type text NOT NULL,"
     " sender text NOT NULL,"
     " type text NOT NULL,"
     " stream_pos bigint NOT NULL,"
     " aggregation_key text);"
     "CREATE INDEX event_relations_parent ON event_relations (relates_to, rel_type, stream_pos);"
     "CREATE INDEX event_relations_threads ON event_relations (room_id, relates_to, stream_pos)"
     " WHERE rel_type = 'm.thread';"
     "INSERT INTO event_relations SELECT e.event_id, e.room_id, x.r ->> 'event_id',"
     " x.r ->> 'rel_type', e.sender, e.type, e.stream_pos,"
     " CASE WHEN x.r ->> 'rel_type' = 'm.annotation' AND jsonb_typeof(x.r -> 'key') = 'string'"
     "  THEN x.r ->> 'key' END"
     " FROM events e, LATERAL (SELECT e.pdu::jsonb -> 'content' -> 'm.relates_to' AS r) x"
     " WHERE e.redacted_by IS NULL AND e.type <> 'm.room.redaction'"
     " AND jsonb_typeof(x.r -> 'rel_type') = 'string'"
     " AND jsonb_typeof(x.r -> 'event_id') = 'string'"
     " AND length(x.r ->> 'rel_type') BETWEEN 1 AND 255"
     " AND length(x.r ->> 'event_id') BETWEEN 1 AND 255;"},
    {3, "rooms_event_search",
     /* Full text search (rooms_search.c): the searchable text of an event - content.body of
      * m.room.message, content.name of m.room.name, content.topic of m.room.topic - as a
      * generated tsvector, NULL once redacted, with a GIN index. */
     "CREATE FUNCTION events_search_text(etype text, pdu text) RETURNS text"
     " LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$"
     " DECLARE k text; v json;"
     " BEGIN"
     "  k := CASE etype WHEN 'm.room.message' THEN 'body' WHEN 'm.room.name' THEN 'name'"
     "   WHEN 'm.room.topic' THEN 'topic' END;"
     "  IF k IS NULL OR strpos(pdu, '\\u0000') > 0 THEN RETURN NULL; END IF;"
     "  v := pdu::json -> 'content' -> k;"
     "  IF json_typeof(v) IS DISTINCT FROM 'string' THEN RETURN NULL; END IF;"
     "  RETURN v #>> '{}';"
     " END $$;"
     "ALTER TABLE events ADD COLUMN search_tsv tsvector GENERATED ALWAYS AS (CASE WHEN"
     " redacted_by IS NULL THEN to_tsvector('simple'::regconfig, events_search_text(type, pdu))"
     " END) STORED;"
     "CREATE INDEX events_search ON events USING gin (search_tsv) WHERE search_tsv IS NOT NULL;"},
};

static const struct core_config *the_cfg;

/* ---- failures ----------------------------------------------------------------------- */

int rooms_set_err(rooms_err *e, int code, const char *fmt, ...)
{
    e->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->why, sizeof(e->why), fmt, ap);
    va_end(ap);
    return code;
}

int rooms_fail(atrium_req *r, const rooms_err *e)
{
    switch (e->code) {
    case ROOMS_E_FORBIDDEN: return http_respond_error(r, 403, "M_FORBIDDEN", "%s", e->why);
    case ROOMS_E_NOT_FOUND: return http_respond_error(r, 404, "M_NOT_FOUND", "%s", e->why);
    case ROOMS_E_TOO_LARGE: return http_respond_error(r, 413, "M_TOO_LARGE", "%s", e->why);
    case ROOMS_E_BAD_JSON: return http_respond_error(r, 400, "M_BAD_JSON", "%s", e->why);
    default: return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    }
}

/* ---- database ----------------------------------------------------------------------- */

PGresult *rooms_q(PGconn *c, const char *sql, int n, const char *const *params,
                  bool *unique_violation)
{
    if (unique_violation) *unique_violation = false;
    PGresult *res = PQexecParams(c, sql, n, NULL, params, NULL, NULL, 0);
    ExecStatusType st = PQresultStatus(res);
    if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK) return res;
    const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
    if (unique_violation && state && strcmp(state, "23505") == 0) {
        *unique_violation = true;
    } else {
        rt_log(ATRIUM_LOG_ERROR, "core", "rooms query failed: %s", PQresultErrorMessage(res));
    }
    PQclear(res);
    return NULL;
}

bool rooms_exec(PGconn *c, const char *sql, int n, const char *const *params)
{
    PGresult *res = rooms_q(c, sql, n, params, NULL);
    PQclear(res);
    return res != NULL;
}

PGconn *rooms_db(atrium_req *r)
{
    PGconn *c = db_acquire(db_global(), ROOMS_DB_WAIT_MS);
    if (!c) http_respond_error(r, 503, "M_UNKNOWN", "The database is busy; retry");
    return c;
}

void rooms_db_release(PGconn *c)
{
    db_release(db_global(), c);
}

const char *rooms_i64(atrium_req *r, int64_t x)
{
    return rt_arena_printf(r->arena, "%lld", (long long)x);
}

int64_t rooms_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- membership and visibility ------------------------------------------------------ */

int rooms_membership_at(PGconn *c, const char *room_id, const char *user_id, int64_t upto,
                        char out[16], int64_t *pos_out)
{
    char upto_s[24];
    snprintf(upto_s, sizeof(upto_s), "%lld", (long long)upto);
    const char *p[3] = {user_id, room_id, upto_s};
    PGresult *res = rooms_q(c,
                            "SELECT membership, stream_pos FROM memberships"
                            " WHERE user_id = $1 AND room_id = $2 AND stream_pos <= $3"
                            " ORDER BY stream_pos DESC LIMIT 1",
                            3, p, NULL);
    if (!res) return ROOMS_E_DB;
    out[0] = '\0';
    if (pos_out) *pos_out = 0;
    if (PQntuples(res) == 1) {
        snprintf(out, 16, "%s", PQgetvalue(res, 0, 0));
        if (pos_out) *pos_out = atoll(PQgetvalue(res, 0, 1));
    }
    PQclear(res);
    return ROOMS_OK;
}

int rooms_user_room_ids(PGconn *c, const char *user_id, bool with_invites, int64_t limit,
                        json_t *out)
{
    char limit_s[24];
    snprintf(limit_s, sizeof(limit_s), "%lld", (long long)limit);
    const char *p[3] = {user_id, limit < 0 ? NULL : limit_s, with_invites ? "t" : "f"};
    PGresult *res = rooms_q(c,
                            "SELECT room_id FROM current_state WHERE type = 'm.room.member'"
                            " AND state_key = $1 AND (membership = 'join'"
                            " OR ($3::boolean AND membership = 'invite'))"
                            " ORDER BY room_id LIMIT $2::bigint",
                            3, p, NULL);
    if (!res) return ROOMS_E_DB;
    int n = PQntuples(res);
    for (int i = 0; i < n; i++) json_array_append_new(out, json_string(PQgetvalue(res, i, 0)));
    PQclear(res);
    return n;
}

const room_version *rooms_version_of(PGconn *c, const char *room_id, bool *db_failed)
{
    const char *p[1] = {room_id};
    *db_failed = false;
    PGresult *res = rooms_q(c, "SELECT room_version FROM rooms WHERE room_id = $1", 1, p, NULL);
    if (!res) {
        *db_failed = true;
        return NULL;
    }
    const room_version *v = PQntuples(res) == 1 ? room_version_find(PQgetvalue(res, 0, 0)) : NULL;
    PQclear(res);
    return v;
}

/* ---- history visibility ------------------------------------------------------------- */

rooms_hv rooms_hv_parse(const char *value)
{
    if (!value) return ROOMS_HV_JOINED;
    if (strcmp(value, "world_readable") == 0) return ROOMS_HV_WORLD_READABLE;
    if (strcmp(value, "shared") == 0) return ROOMS_HV_SHARED;
    if (strcmp(value, "invited") == 0) return ROOMS_HV_INVITED;
    return ROOMS_HV_JOINED; /* "joined", and anything unknown: the strictest */
}

rooms_mem rooms_mem_parse(const char *membership)
{
    if (membership && strcmp(membership, "join") == 0) return ROOMS_MEM_JOIN;
    if (membership && strcmp(membership, "invite") == 0) return ROOMS_MEM_INVITE;
    return ROOMS_MEM_NONE;
}

/* The rule, for an event that is not the user's own membership event: hv and mem as they
 * were before the event, joined_now the user's membership today. */
static bool hv_allows(rooms_hv hv, rooms_mem mem, bool joined_now)
{
    if (hv == ROOMS_HV_WORLD_READABLE || mem == ROOMS_MEM_JOIN) return true;
    if (hv == ROOMS_HV_SHARED) return joined_now;
    return hv == ROOMS_HV_INVITED && mem == ROOMS_MEM_INVITE;
}

/* Append (lo, hi] clipped to v->upto, merging with the newest range when they touch; past
 * ROOMS_VIS_MAX_RANGES the oldest range goes (hide rather than show). Ranges arrive in
 * ascending order. */
static void add_range(rooms_vis *v, int64_t lo, int64_t hi)
{
    if (hi > v->upto) hi = v->upto;
    if (lo >= hi) return;
    if (v->n > 0 && lo <= v->hi[v->n - 1]) {
        if (hi > v->hi[v->n - 1]) v->hi[v->n - 1] = hi;
        return;
    }
    if (v->n == ROOMS_VIS_MAX_RANGES) {
        memmove(v->lo, v->lo + 1, (ROOMS_VIS_MAX_RANGES - 1) * sizeof(v->lo[0]));
        memmove(v->hi, v->hi + 1, (ROOMS_VIS_MAX_RANGES - 1) * sizeof(v->hi[0]));
        v->n--;
        v->dropped++;
    }
    v->lo[v->n] = lo;
    v->hi[v->n] = hi;
    v->n++;
}

void rooms_vis_compute(const rooms_vis_history *h, const char *user_id, rooms_vis *v)
{
    memset(v, 0, sizeof(*v));
    v->user_id = user_id;
    v->upto = INT64_MAX;
    int last_join = -1;
    for (int i = 0; i < h->n_mem; i++)
        if (h->mem[i].value == ROOMS_MEM_JOIN) last_join = i;
    v->ever_joined = last_join >= 0;
    bool joined_now = h->n_mem > 0 && h->mem[h->n_mem - 1].value == ROOMS_MEM_JOIN;
    for (int i = last_join + 1; last_join >= 0 && i < h->n_mem; i++) {
        if (h->mem[i].value != ROOMS_MEM_JOIN) {
            v->upto = h->mem[i].pos; /* the leave (or ban, ...) itself stays visible */
            break;
        }
    }
    /* Walk the changes in position order: between two changes the state is constant, and
     * an event at a change's position still sees the state before that change. */
    rooms_hv hv = h->hv_truncated ? ROOMS_HV_JOINED : ROOMS_HV_SHARED;
    rooms_mem mem = ROOMS_MEM_NONE;
    int64_t from = 0;
    int im = 0, ih = 0;
    while (im < h->n_mem || ih < h->n_hv) {
        bool take_hv = im == h->n_mem || (ih < h->n_hv && h->hv[ih].pos < h->mem[im].pos);
        int64_t at = take_hv ? h->hv[ih].pos : h->mem[im].pos;
        if (hv_allows(hv, mem, joined_now)) add_range(v, from, at);
        if (take_hv) {
            rooms_hv next = (rooms_hv)h->hv[ih++].value;
            if (hv_allows(next, mem, joined_now)) add_range(v, at - 1, at);
            hv = next;
        } else {
            mem = (rooms_mem)h->mem[im++].value;
        }
        if (at > from) from = at;
    }
    if (hv_allows(hv, mem, joined_now)) add_range(v, from, INT64_MAX);
    v->floor = v->n > 0 ? v->lo[0] : INT64_MAX;
    if (h->n_mem > 0 && h->mem[0].pos - 1 < v->floor) v->floor = h->mem[0].pos - 1;
}

/* One query: per kind ('h' history_visibility of the room, 'm' the user's membership), the
 * newest ROOMS_VIS_MAX_CHANGES + 1 changes (rows whose value differs from the previous
 * one), in ascending position order. */
static const char VIS_HISTORY_SQL[] =
    "SELECT k, pos, val FROM ("
    " (SELECT 'm' AS k, pos, val FROM (SELECT stream_pos AS pos, membership AS val,"
    "   lag(membership) OVER (ORDER BY stream_pos) AS prev FROM memberships"
    "   WHERE user_id = $1 AND room_id = $2) m"
    "  WHERE prev IS DISTINCT FROM val ORDER BY pos DESC LIMIT $3)"
    " UNION ALL"
    " (SELECT 'h', pos, val FROM (SELECT pos, val, lag(val) OVER (ORDER BY pos) AS prev"
    "   FROM (SELECT e.stream_pos AS pos,"
    "     coalesce(e.pdu::json -> 'content' ->> 'history_visibility', '') AS val"
    "     FROM events e WHERE e.room_id = $2 AND e.type = 'm.room.history_visibility'"
    "     AND e.state_key = '') x) h"
    "  WHERE prev IS DISTINCT FROM val ORDER BY pos DESC LIMIT $3)) c ORDER BY k, pos";

int rooms_vis_load(PGconn *c, const char *room_id, const char *user_id, rooms_vis *out)
{
    char limit_s[24];
    snprintf(limit_s, sizeof(limit_s), "%d", ROOMS_VIS_MAX_CHANGES + 1);
    const char *p[3] = {user_id, room_id, limit_s};
    PGresult *res = rooms_q(c, VIS_HISTORY_SQL, 3, p, NULL);
    if (!res) return ROOMS_E_DB;
    int rows = PQntuples(res);
    rooms_vis_change *all = malloc((size_t)(rows > 0 ? rows : 1) * sizeof(*all));
    if (!all) {
        PQclear(res);
        return ROOMS_E_DB;
    }
    int n_h = 0;
    for (int i = 0; i < rows; i++) {
        bool is_hv = PQgetvalue(res, i, 0)[0] == 'h';
        all[i].pos = atoll(PQgetvalue(res, i, 1));
        all[i].value = is_hv ? (int)rooms_hv_parse(PQgetvalue(res, i, 2))
                             : (int)rooms_mem_parse(PQgetvalue(res, i, 2));
        n_h += is_hv;
    }
    PQclear(res);
    /* Ordered by kind: 'h' rows first, then 'm'. One row past the limit means older
     * changes exist: drop it (the oldest) and say so. */
    rooms_vis_history h = {.hv = all, .n_hv = n_h, .mem = all + n_h, .n_mem = rows - n_h};
    if (h.n_hv > ROOMS_VIS_MAX_CHANGES) {
        h.hv++;
        h.n_hv--;
        h.hv_truncated = true;
    }
    if (h.n_mem > ROOMS_VIS_MAX_CHANGES) {
        h.mem++;
        h.n_mem--;
        h.mem_truncated = true;
    }
    rooms_vis_compute(&h, user_id, out);
    free(all);
    if (h.hv_truncated || h.mem_truncated || out->dropped > 0)
        rt_log(ATRIUM_LOG_WARN, "core", "history visibility of %s in %s: over %d changes or %d "
               "ranges; older history is hidden from this user", user_id, room_id,
               ROOMS_VIS_MAX_CHANGES, ROOMS_VIS_MAX_RANGES);
    return ROOMS_OK;
}

int rooms_visibility(PGconn *c, const char *room_id, const char *user_id, rooms_vis *out,
                     rooms_err *e)
{
    bool failed;
    if (!rooms_version_of(c, room_id, &failed))
        return failed ? rooms_set_err(e, ROOMS_E_DB, "database")
                      : rooms_set_err(e, ROOMS_E_NOT_FOUND, "Unknown room");
    if (rooms_vis_load(c, room_id, user_id, out) < 0)
        return rooms_set_err(e, ROOMS_E_DB, "database");
    if (!out->ever_joined)
        return rooms_set_err(e, ROOMS_E_FORBIDDEN, "You are not a member of this room");
    return ROOMS_OK;
}

bool rooms_reader_open(atrium_req *r, rooms_reader *rd)
{
    if (!(rd->c = rooms_db(r))) return false;
    rooms_err e = {0};
    if (rooms_visibility(rd->c, rd->room, rd->user, &rd->vis, &e) < 0) {
        rooms_db_release(rd->c);
        rooms_fail(r, &e);
        return false;
    }
    rd->view = (events_view){.user_id = rd->user, .device_id = r->device, .with_room_id = true,
                             .now_ms = rooms_wall_ms()};
    return true;
}

int rooms_reader_close(atrium_req *r, rooms_reader *rd, int status, json_t *body)
{
    rooms_db_release(rd->c);
    if (!body) return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    return http_respond_json(r, status, body);
}

/* A PostgreSQL bigint[] literal of n positions. */
static const char *pos_array(rt_arena *a, const int64_t *pos, int n)
{
    size_t cap = 3 + (size_t)n * 21, used = 0;
    char *out = rt_arena_alloc(a, cap);
    if (!out) return NULL;
    out[used++] = '{';
    for (int i = 0; i < n; i++)
        used += (size_t)snprintf(out + used, cap - used, "%s%lld", i ? "," : "", (long long)pos[i]);
    snprintf(out + used, cap - used, "}");
    return out;
}

bool rooms_vis_window(rt_arena *a, const rooms_vis *v, int64_t lo, int64_t hi, bool hidden,
                      int n, const char **sql, const char **p)
{
    if (!hidden) { /* the visible part of the window: a narrower index range to scan */
        if (lo < v->floor) lo = v->floor;
        if (hi > v->upto) hi = v->upto;
    }
    if (lo >= hi) return false;
    p[0] = rt_arena_printf(a, "%lld", (long long)lo);
    p[1] = rt_arena_printf(a, "%lld", (long long)hi);
    p[2] = rt_arena_printf(a, "%lld", (long long)v->floor);
    p[3] = rt_arena_printf(a, "%lld", (long long)v->upto);
    p[4] = pos_array(a, v->lo, v->n);
    p[5] = pos_array(a, v->hi, v->n);
    p[6] = v->user_id;
    *sql = rt_arena_printf(a,
                           " AND e.stream_pos > $%d AND e.stream_pos <= $%d AND %s("
                           "e.stream_pos > $%d AND e.stream_pos <= $%d"
                           " AND (EXISTS (SELECT 1 FROM unnest($%d::bigint[], $%d::bigint[])"
                           "  r(lo, hi) WHERE e.stream_pos > r.lo AND e.stream_pos <= r.hi)"
                           "  OR (e.type = 'm.room.member' AND e.state_key = $%d)))",
                           n, n + 1, hidden ? "NOT " : "", n + 2, n + 3, n + 4, n + 5, n + 6);
    return p[0] && p[1] && p[2] && p[3] && p[4] && p[5] && *sql;
}

bool rooms_vis_covers(const rooms_vis *v, int64_t lo, int64_t hi)
{
    if (lo >= hi) return true;
    for (int i = 0; i < v->n; i++)
        if (v->lo[i] <= lo && v->hi[i] >= hi) return true;
    return false;
}

/* ---- requests ----------------------------------------------------------------------- */

const char *rooms_param(atrium_req *r, const char *name)
{
    for (size_t i = 0; i < r->n_params; i++)
        if (strcmp(r->param_names[i], name) == 0) return r->param_values[i];
    return NULL;
}

/* "<sigil>localpart:server" within the spec's length limit. */
static bool sigil_id_ok(const char *id, char sigil)
{
    if (!id || id[0] != sigil || strlen(id) > EVENT_MAX_ID_BYTES) return false;
    const char *colon = strchr(id, ':');
    return colon && colon > id + 1 && colon[1] != '\0';
}

bool rooms_user_id_ok(const char *id)
{
    return sigil_id_ok(id, '@');
}

bool rooms_room_id_ok(const char *id)
{
    return sigil_id_ok(id, '!');
}

const char *rooms_param_room(atrium_req *r)
{
    const char *room = rooms_param(r, "roomId");
    if (!sigil_id_ok(room, '!')) {
        http_respond_error(r, 400, "M_INVALID_PARAM", "Not a room ID");
        return NULL;
    }
    return room;
}

const char *rooms_server_name(void)
{
    return the_cfg ? the_cfg->server_name : "localhost";
}

const room_version *rooms_default_version(void)
{
    const room_version *v = room_version_find(the_cfg ? the_cfg->rooms.default_version : NULL);
    return v ? v : room_version_find(ROOMS_DEFAULT_VERSION);
}

bool rooms_parse_token(const char *tok, int64_t *pos)
{
    if (!tok || tok[0] != 's' || tok[1] < '0' || tok[1] > '9') return false;
    char *end;
    long long v = strtoll(tok + 1, &end, 10);
    if (*end != '\0' || v < 0) return false;
    *pos = v;
    return true;
}

const char *rooms_token(atrium_req *r, int64_t pos)
{
    return rt_arena_printf(r->arena, "s%lld", (long long)(pos < 0 ? 0 : pos));
}

/* ---- the bulk pool ------------------------------------------------------------------ */

/* Writes into many rooms at once (a profile change, a deactivation) run here, one at a
 * time, so they hold neither a request-pool thread nor an auth thread. */
#define ROOMS_BULK_THREADS 1
#define ROOMS_BULK_QUEUE 32

static rt_pool *bulk_pool;

int rooms_to_bulk_pool(atrium_req *r)
{
    int rc = bulk_pool ? susp_handoff(r, bulk_pool, NULL, 0) : ATRIUM_E_STOPPED;
    if (rc == 0) return ATRIUM_HANDED_OFF;
    if (rc == ATRIUM_E_LIMIT)
        http_respond_limited(r, 1000, "Too many room-wide changes in progress; retry");
    else
        http_respond_error(r, 503, "M_UNKNOWN", "The server is stopping");
    return ATRIUM_DONE;
}

static int rooms_start(void)
{
    if (rt_pool_start(bulk_pool) < 0) {
        rt_log(ATRIUM_LOG_ERROR, "core", "cannot start the rooms.bulk pool's thread");
        return -1;
    }
    return rooms_typing_start();
}

static void rooms_stop(void)
{
    rooms_typing_stop();
    if (!bulk_pool) return;
    rt_pool_stop(bulk_pool); /* queued handoffs are answered 503 */
    rt_pool_join(bulk_pool);
    rt_pool_free(bulk_pool);
    bulk_pool = NULL;
}

/* ---- the module --------------------------------------------------------------------- */

static int rooms_init(http_server *s, rt_metrics *metrics)
{
    the_cfg = s->cfg;
    bulk_pool = rt_pool_new("core.rooms_bulk", ROOMS_BULK_THREADS, ROOMS_BULK_QUEUE, metrics);
    if (!bulk_pool) return -1;
    if (!room_version_find(the_cfg->rooms.default_version)) {
        rt_log(ATRIUM_LOG_ERROR, "core", "rooms.default_version \"%.16s\" is not a room version "
               "this server supports: set it to \"10\" or \"11\"", the_cfg->rooms.default_version);
        return -1;
    }
    if (rooms_create_routes(s) < 0 || rooms_membership_routes(s) < 0 || rooms_send_routes(s) < 0 ||
        rooms_read_routes(s) < 0 || rooms_ephemeral_routes(s) < 0 || rooms_relations_routes(s) < 0)
        return -1;
    if (rooms_search_routes(s) < 0) return -1;
    return 0;
}

const client_module ROOMS_MODULE = {
    .owner = "rooms",
    .migrations = MIGRATIONS,
    .n_migrations = sizeof(MIGRATIONS) / sizeof(MIGRATIONS[0]),
    .init = rooms_init,
    .start = rooms_start,
    .stop = rooms_stop,
};
