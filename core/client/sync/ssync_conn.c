/*
 * core/client/sync/ssync_conn.c - the connection state of Simplified Sliding Sync in
 * PostgreSQL (docs/adr/0010-sliding-sync-connection-state.md).
 *
 * A connection is (user, device, conn_id); each response that says something new stores
 * a position: the stream position it was computed up to, what the connection has sent of
 * each room ({room_id: [sent_upto, membership]}) and the lists' counts. Its token (`pos`)
 * is the position's row number, meaningful only with the connection it belongs to. So any
 * process sharing the database answers the next request of a connection, and a restart
 * loses nothing.
 *
 * Bounds: a device keeps at most SSYNC_MAX_CONNECTIONS connections (the least recently
 * used go first; atrium_sliding_sync_connections_dropped_total counts them), one unused for
 * SSYNC_CONNECTION_IDLE_MS is dropped when its device starts another, and a connection
 * keeps at most SSYNC_MAX_POSITIONS positions: a request with pos P drops those before P
 * (the client has seen P); later ones stay, as a retried request may still use P. A pos
 * that is gone answers 400 M_UNKNOWN_POS (ssync.c), and the client starts again.
 * Connections go with their device (a foreign key).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/sync/ssync.h"
#include "atrium/parse.h"

#define SSYNC_MAX_CONNECTIONS 10 /* per device */
#define SSYNC_MAX_POSITIONS 8    /* per connection */
#define SSYNC_CONNECTION_IDLE_MS (7LL * 24 * 60 * 60 * 1000)

static rt_metric *m_dropped, *m_started;

void ssync_conn_metrics(rt_metrics *metrics)
{
    m_dropped = rt_metric_counter(metrics, "atrium_sliding_sync_connections_dropped_total", NULL,
                                  "Sliding sync connections dropped: past the per-device bound or unused");
    m_started = rt_metric_counter(metrics, "atrium_sliding_sync_connections_started_total", NULL,
                                  "Sliding sync connections started (requests without pos)");
}

void ssync_pos_clear(ssync_pos *p)
{
    json_decref(p->rooms);
    json_decref(p->counts);
    free(p->account_data);
    *p = (ssync_pos){0};
}

static const char *num(char *buf, size_t len, int64_t v)
{
    snprintf(buf, len, "%lld", (long long)v);
    return buf;
}

int ssync_conn_load(PGconn *c, const char *user, const char *device, const char *conn_id,
                    const char *pos, ssync_pos *out)
{
    *out = (ssync_pos){0};
    int64_t p;
    if (atrium_parse_int64(pos, 1, INT64_MAX, &p) != 0) return 0;
    char now[24], ps[24];
    const char *params[5] = {user, device, conn_id, num(ps, sizeof(ps), p),
                             num(now, sizeof(now), rooms_wall_ms())};
    /* One statement (one round trip): the connection's last use, the position, the
     * positions before it dropped (only when it is found), the stream's position now
     * (stream_upto(), read after the rest as ssync.c needs), and generic plans for the
     * run (only when it is found; ssync.c sets the mode back). */
    PGresult *res = rooms_q(c,
                            "WITH conn AS (UPDATE sliding_sync_connections SET last_used_ms = $5::bigint"
                            "  WHERE user_id = $1 AND device_id = $2 AND conn_id = $3 RETURNING conn_key),"
                            " found AS (SELECT p.conn_key, p.stream_pos, p.rooms::text, p.counts::text"
                            "  FROM sliding_sync_positions p JOIN conn ON conn.conn_key = p.conn_key"
                            "  WHERE p.pos = $4::bigint),"
                            " dropped AS (DELETE FROM sliding_sync_positions d USING found"
                            "  WHERE d.conn_key = found.conn_key AND d.pos < $4::bigint)"
                            " SELECT found.*, stream_upto(), gp.plan_mode, " SYNC_PLAN_MODE_SET ","
                            " " SSYNC_ACCOUNT_DATA_SQL("$1")
                            " FROM found CROSS JOIN " SYNC_PLAN_MODE_FROM,
                            5, params, NULL);
    if (!res) return -1;
    if (PQntuples(res) != 1) {
        PQclear(res);
        return 0;
    }
    out->pos = p;
    out->conn_key = atoll(PQgetvalue(res, 0, 0));
    out->stream_pos = atoll(PQgetvalue(res, 0, 1));
    out->rooms = json_loads(PQgetvalue(res, 0, 2), 0, NULL);
    out->counts = json_loads(PQgetvalue(res, 0, 3), 0, NULL);
    out->upto = atoll(PQgetvalue(res, 0, 4));
    snprintf(out->plan_mode, sizeof(out->plan_mode), "%s", PQgetvalue(res, 0, 5));
    out->account_data = strdup(PQgetvalue(res, 0, 7));
    PQclear(res);
    if (!json_is_object(out->rooms) || !json_is_object(out->counts) || !out->account_data) {
        char plan_mode[SYNC_PLAN_MODE_MAX];
        memcpy(plan_mode, out->plan_mode, sizeof(plan_mode)); /* still to be set back */
        ssync_pos_clear(out);
        memcpy(out->plan_mode, plan_mode, sizeof(plan_mode));
        return -1;
    }
    return 1;
}

/* A new connection's first position: the connection started (migration 3 of the sync
 * module, ssync.c: the one of that name replaced, the device's connections past the bound
 * or unused too long dropped), then the position, in one statement; $5..$10 as
 * sliding_sync_start takes them. Both statements set plan_cache_mode back to the value
 * passed (unless '') once the position is stored. */
static const char SAVE_NEW_SQL[] =
    "WITH st AS (SELECT * FROM sliding_sync_start($5, $6, $7, $8::bigint, $9::bigint, $10::bigint)),"
    " ins AS (INSERT INTO sliding_sync_positions (conn_key, stream_pos, rooms, counts)"
    "  SELECT st.new_key, $1::bigint, $2::jsonb, $3::jsonb FROM st RETURNING pos)"
    " SELECT ins.pos, st.dropped, CASE WHEN $4 <> '' THEN set_config('plan_cache_mode', $4, false) END"
    " FROM ins CROSS JOIN st";

/* The next position of a connection, and the newest SSYNC_MAX_POSITIONS ($6) kept (the new
 * one and the SSYNC_MAX_POSITIONS - 1 newest before it, which the statement's snapshot
 * sees); the rest cannot be the client's latest. */
static const char SAVE_SQL[] =
    "WITH ins AS (INSERT INTO sliding_sync_positions (conn_key, stream_pos, rooms, counts)"
    "  SELECT conn_key, $2::bigint, $3::jsonb, $4::jsonb FROM sliding_sync_connections"
    "  WHERE conn_key = $1::bigint RETURNING pos),"
    " trimmed AS (DELETE FROM sliding_sync_positions WHERE conn_key = $1::bigint"
    "  AND EXISTS (SELECT 1 FROM ins) AND pos IN (SELECT pos FROM sliding_sync_positions"
    "  WHERE conn_key = $1::bigint ORDER BY pos DESC OFFSET $6::bigint - 1))"
    " SELECT pos, 0, CASE WHEN $5 <> '' THEN set_config('plan_cache_mode', $5, false) END FROM ins";

int ssync_conn_save(PGconn *c, const ssync_conn_new *fresh, int64_t conn_key, int64_t stream_pos,
                    const json_t *rooms, const json_t *counts, char plan_mode[SYNC_PLAN_MODE_MAX],
                    char *token, size_t len)
{
    char *rooms_text = json_dumps(rooms, JSON_COMPACT), *counts_text = json_dumps(counts, JSON_COMPACT);
    char key[24], sp[24], max[24], now[24], idle[24], conns[24];
    const char *p[6] = {num(key, sizeof(key), conn_key), num(sp, sizeof(sp), stream_pos), rooms_text,
                         counts_text, plan_mode, num(max, sizeof(max), SSYNC_MAX_POSITIONS)};
    const char *pn[10] = {p[1], rooms_text, counts_text, plan_mode};
    if (fresh) {
        pn[4] = fresh->user;
        pn[5] = fresh->device;
        pn[6] = fresh->conn_id;
        pn[7] = num(now, sizeof(now), rooms_wall_ms());
        pn[8] = num(idle, sizeof(idle), rooms_wall_ms() - SSYNC_CONNECTION_IDLE_MS);
        pn[9] = num(conns, sizeof(conns), SSYNC_MAX_CONNECTIONS);
    }
    PGresult *res = NULL;
    if (rooms_text && counts_text)
        res = fresh ? rooms_q(c, SAVE_NEW_SQL, 10, pn, NULL) : rooms_q(c, SAVE_SQL, 6, p, NULL);
    free(rooms_text);
    free(counts_text);
    if (!res) return -1;
    int found = PQntuples(res);
    if (found == 1) {
        snprintf(token, len, "%s", PQgetvalue(res, 0, 0));
        plan_mode[0] = '\0'; /* set back by the statement */
        if (fresh) {
            rt_metric_add(m_started, 1);
            rt_metric_add(m_dropped, atoll(PQgetvalue(res, 0, 1)));
        }
    }
    PQclear(res);
    return found == 1 ? 0 : -1;
}
