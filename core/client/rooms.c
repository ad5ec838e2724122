/*
 * core/client/rooms.c - the rooms module: its tables (see rooms.h for the data model), its
 * start-up, and the helpers every room file shares: failures -> Matrix errors, database
 * calls, membership and visibility look-ups, path parameters and pagination tokens.
 *
 * The visibility rule lives here alone (rooms_visible_upto): a user sees a room's events
 * while joined, and up to the moment they left after having been joined; a user who was
 * never joined sees nothing. history_visibility values beyond "shared" are not applied yet.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/client/auth.h"
#include "core/client/rooms.h"

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

int rooms_joined_ids(PGconn *c, const char *user_id, int64_t limit, json_t *out)
{
    char limit_s[24];
    snprintf(limit_s, sizeof(limit_s), "%lld", (long long)limit);
    const char *p[2] = {user_id, limit < 0 ? NULL : limit_s};
    PGresult *res = rooms_q(c,
                            "SELECT room_id FROM current_state WHERE type = 'm.room.member'"
                            " AND state_key = $1 AND membership = 'join' ORDER BY room_id"
                            " LIMIT $2::bigint",
                            2, p, NULL);
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

int rooms_visible_upto(PGconn *c, const char *room_id, const char *user_id, int64_t *upto,
                       rooms_err *e)
{
    bool failed;
    if (!rooms_version_of(c, room_id, &failed))
        return failed ? rooms_set_err(e, ROOMS_E_DB, "database")
                      : rooms_set_err(e, ROOMS_E_NOT_FOUND, "Unknown room");
    const char *p[2] = {user_id, room_id};
    /* The last join, and the first membership change after it. */
    PGresult *res = rooms_q(c,
                            "WITH j AS (SELECT max(stream_pos) AS pos FROM memberships"
                            "  WHERE user_id = $1 AND room_id = $2 AND membership = 'join')"
                            " SELECT j.pos, (SELECT min(m.stream_pos) FROM memberships m"
                            "  WHERE m.user_id = $1 AND m.room_id = $2 AND m.membership <> 'join'"
                            "  AND m.stream_pos > j.pos) FROM j",
                            2, p, NULL);
    if (!res) return rooms_set_err(e, ROOMS_E_DB, "database");
    int rc = ROOMS_OK;
    if (PQgetisnull(res, 0, 0))
        rc = rooms_set_err(e, ROOMS_E_FORBIDDEN, "You are not a member of this room");
    else
        *upto = PQgetisnull(res, 0, 1) ? INT64_MAX : atoll(PQgetvalue(res, 0, 1));
    PQclear(res);
    return rc;
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

/* ---- the module --------------------------------------------------------------------- */

static int rooms_init(http_server *s, rt_metrics *metrics)
{
    (void)metrics;
    the_cfg = s->cfg;
    if (!room_version_find(the_cfg->rooms.default_version)) {
        rt_log(ATRIUM_LOG_ERROR, "core", "rooms.default_version \"%.16s\" is not a room version "
               "this server supports: set it to \"10\" or \"11\"", the_cfg->rooms.default_version);
        return -1;
    }
    if (rooms_create_routes(s) < 0 || rooms_membership_routes(s) < 0 || rooms_send_routes(s) < 0 ||
        rooms_read_routes(s) < 0 || rooms_ephemeral_routes(s) < 0)
        return -1;
    return 0;
}

const client_module ROOMS_MODULE = {
    .owner = "rooms",
    .migrations = MIGRATIONS,
    .n_migrations = sizeof(MIGRATIONS) / sizeof(MIGRATIONS[0]),
    .init = rooms_init,
};
