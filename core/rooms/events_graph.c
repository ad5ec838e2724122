/*
 * core/rooms/events_graph.c - the event graph beside the stream (events_graph.h says what
 * each table means): edges, forward extremities, outliers, state snapshots and auth
 * chains, as SQL over migration 4's tables.
 *
 * It decides nothing about whether an event is acceptable (room_auth.c, the inbound path)
 * or who may read it (the federation endpoints): it only records and answers graph
 * questions, inside whatever transaction the caller holds.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rooms/events_graph.h"
#include "core/rooms/rooms.h"

int rooms_graph_tips_load(PGconn *c, const char *room_id, rooms_graph_tips *out)
{
    memset(out, 0, sizeof(*out));
    char lim[16];
    snprintf(lim, sizeof(lim), "%d", ROOMS_GRAPH_MAX_PREV_EVENTS);
    const char *p[2] = {room_id, lim};
    PGresult *res = rooms_q(c,
                            "SELECT x.event_id, e.depth FROM room_extremities x"
                            " JOIN events e ON e.event_id = x.event_id WHERE x.room_id = $1"
                            " ORDER BY e.depth DESC, e.stream_pos DESC LIMIT $2::int",
                            2, p, NULL);
    if (!res) return -1;
    for (int i = 0; i < PQntuples(res); i++) {
        snprintf(out->ids[out->n], ROOMS_GRAPH_ID_BYTES, "%s", PQgetvalue(res, i, 0));
        int64_t d = atoll(PQgetvalue(res, i, 1));
        if (d > out->max_depth) out->max_depth = d;
        out->n++;
    }
    PQclear(res);
    return 0;
}

/* The event IDs pdu[key] references (event_ref_ids) as a PostgreSQL text[] literal in a,
 * or NULL (out-of-memory). */
static const char *id_array(rt_arena *a, const json_t *pdu, const char *key)
{
    json_t *ids = event_ref_ids(pdu, key);
    const char *lit = ids ? rooms_pg_array(a, ids) : NULL;
    json_decref(ids);
    return lit;
}

/* pdu[key]'s string entries as v1-2 pairs, each with its stored event's reference hash. */
static int refs_as_pairs(PGconn *c, const room_version *v, json_t *pdu, const char *key)
{
    json_t *arr = json_object_get(pdu, key);
    for (size_t i = 0; i < json_array_size(arr); i++) {
        const char *id = json_string_value(json_array_get(arr, i));
        if (!id) continue;
        rooms_graph_where w;
        bool failed = false;
        json_t *target = rooms_graph_load(c, id, NULL, &w, &failed);
        json_t *pair = target ? event_ref_pair(v, id, target) : NULL;
        json_decref(target);
        if (failed || !pair) {
            if (!failed)
                rt_log(ATRIUM_LOG_ERROR, "rooms", "event %s, referenced by a new event, is not "
                       "stored or not canonical", id);
            json_decref(pair);
            return -1;
        }
        json_array_set_new(arr, i, pair);
    }
    return 0;
}

int rooms_graph_refs_as_pairs(PGconn *c, const room_version *v, json_t *pdu)
{
    if (v->event_id_format != ROOM_EVENT_ID_OPAQUE) return 0;
    if (refs_as_pairs(c, v, pdu, "prev_events") < 0) return -1;
    return refs_as_pairs(c, v, pdu, "auth_events");
}

int rooms_graph_record_edges(PGconn *c, const char *room_id, const char *event_id,
                             const json_t *pdu)
{
    rt_arena *a = rt_arena_new(1024);
    if (!a) return -1;
    const char *prev = id_array(a, pdu, "prev_events"), *auth = id_array(a, pdu, "auth_events");
    int rc = -1;
    if (prev && auth) {
        const char *p[4] = {event_id, room_id, prev, auth};
        rc = db_exec(c,
                     "WITH pe AS (INSERT INTO event_edges (event_id, prev_id, room_id)"
                     " SELECT $1, unnest($3::text[]), $2 ON CONFLICT DO NOTHING)"
                     " INSERT INTO event_auth_edges (event_id, auth_id)"
                     " SELECT $1, unnest($4::text[]) ON CONFLICT DO NOTHING",
                     4, p)
                 ? 0
                 : -1;
    }
    rt_arena_free(a);
    return rc;
}

int rooms_graph_advance(PGconn *c, const char *room_id, const char *event_id,
                        const json_t *pdu)
{
    rt_arena *a = rt_arena_new(1024);
    if (!a) return -1;
    const char *prev = id_array(a, pdu, "prev_events");
    int rc = -1;
    if (prev) {
        const char *p[3] = {room_id, event_id, prev};
        rc = db_exec(c,
                     "WITH gone AS (DELETE FROM room_extremities WHERE room_id = $1"
                     " AND event_id = ANY($3::text[]))"
                     " INSERT INTO room_extremities (room_id, event_id)"
                     " SELECT $1, $2 WHERE NOT EXISTS (SELECT 1 FROM event_edges g"
                     "  JOIN events e ON e.event_id = g.event_id WHERE g.prev_id = $2)"
                     " ON CONFLICT DO NOTHING",
                     3, p)
                 ? 0
                 : -1;
    }
    rt_arena_free(a);
    return rc;
}

int rooms_graph_set_state_before(PGconn *c, const char *room_id, const char *event_id,
                                 const json_t *state_ids)
{
    rt_arena *a = rt_arena_new(4096);
    if (!a) return -1;
    const char *ids = rooms_pg_array(a, state_ids);
    int rc = -1;
    if (ids) {
        /* The digest of the sorted set names the snapshot; the same set is shared. */
        const char *p[3] = {room_id, ids, event_id};
        rc = db_exec(c,
                     "WITH s AS (SELECT array_agg(x ORDER BY x) AS ids FROM"
                     "  unnest($2::text[]) x),"
                     " d AS (SELECT md5(array_to_string(coalesce(s.ids, '{}'), ',')) AS digest,"
                     "  coalesce(s.ids, '{}') AS ids FROM s),"
                     " ins AS (INSERT INTO state_snapshots (room_id, digest, event_ids)"
                     "  SELECT $1, d.digest, d.ids FROM d ON CONFLICT (room_id, digest)"
                     "  DO NOTHING RETURNING snapshot_id),"
                     " sid AS (SELECT snapshot_id FROM ins UNION ALL SELECT ss.snapshot_id"
                     "  FROM state_snapshots ss, d WHERE ss.room_id = $1 AND ss.digest ="
                     "  d.digest)"
                     " INSERT INTO event_state_before (event_id, snapshot_id)"
                     " SELECT $3, snapshot_id FROM sid LIMIT 1"
                     " ON CONFLICT (event_id) DO UPDATE SET snapshot_id = EXCLUDED.snapshot_id",
                     3, p)
                 ? 0
                 : -1;
    }
    rt_arena_free(a);
    return rc;
}

int rooms_graph_state_before(PGconn *c, const char *room_id, const char *event_id,
                             json_t **out)
{
    *out = NULL;
    const char *p[2] = {event_id, room_id};
    PGresult *res = rooms_q(c,
                            "SELECT unnest(ss.event_ids) FROM event_state_before b"
                            " JOIN state_snapshots ss ON ss.snapshot_id = b.snapshot_id"
                            " WHERE b.event_id = $1 AND ss.room_id = $2",
                            2, p, NULL);
    if (!res) return -1;
    bool snap = PQntuples(res) > 0;
    if (!snap) {
        /* No snapshot: the line, for an event of the stream. An empty snapshot (the create
         * event's) and no snapshot read the same, and both mean "the line" here. */
        PQclear(res);
        res = rooms_q(c,
                      "SELECT s.event_id FROM (SELECT DISTINCT ON (s.type, s.state_key)"
                      " s.event_id FROM events s, events me WHERE me.event_id = $1"
                      " AND me.room_id = $2 AND s.room_id = $2 AND s.state_key IS NOT NULL"
                      " AND s.stream_pos < me.stream_pos"
                      " ORDER BY s.type, s.state_key, s.stream_pos DESC) s"
                      " UNION ALL SELECT NULL FROM events me WHERE me.event_id = $1"
                      " AND me.room_id = $2",
                      2, p, NULL);
        if (!res) return -1;
        if (PQntuples(res) == 0) {
            PQclear(res);
            return 0;
        }
    }
    json_t *arr = json_array();
    for (int i = 0; i < PQntuples(res) && json_array_size(arr) < ROOMS_GRAPH_MAX_STATE; i++)
        if (!PQgetisnull(res, i, 0)) json_array_append_new(arr, json_string(PQgetvalue(res, i, 0)));
    PQclear(res);
    *out = arr;
    return 1;
}

int rooms_graph_auth_chain(PGconn *c, const json_t *ids, json_t **out)
{
    *out = NULL;
    rt_arena *a = rt_arena_new(4096);
    if (!a) return -1;
    const char *lit = rooms_pg_array(a, ids);
    char lim[16];
    snprintf(lim, sizeof(lim), "%d", ROOMS_GRAPH_MAX_AUTH_CHAIN);
    const char *p[2] = {lit, lim};
    PGresult *res = lit ? rooms_q(c,
                                  "WITH RECURSIVE chain(id) AS ("
                                  " SELECT auth_id FROM event_auth_edges WHERE event_id = ANY($1::text[])"
                                  " UNION SELECT a.auth_id FROM event_auth_edges a"
                                  " JOIN chain ON a.event_id = chain.id)"
                                  " SELECT id FROM chain LIMIT $2::int",
                                  2, p, NULL)
                        : NULL;
    rt_arena_free(a);
    if (!res) return -1;
    json_t *arr = json_array();
    for (int i = 0; i < PQntuples(res); i++) json_array_append_new(arr, json_string(PQgetvalue(res, i, 0)));
    PQclear(res);
    *out = arr;
    return 0;
}

json_t *rooms_graph_load(PGconn *c, const char *event_id, char *room_id_out,
                         rooms_graph_where *where_out, bool *db_failed)
{
    *where_out = ROOMS_GRAPH_ABSENT;
    *db_failed = false;
    const char *p[1] = {event_id};
    PGresult *res = rooms_q(c,
                            "SELECT e.pdu, e.room_id, 'stream', e.redacted_by IS NOT NULL,"
                            " rm.room_version FROM events e JOIN rooms rm ON rm.room_id = e.room_id"
                            " WHERE e.event_id = $1"
                            " UNION ALL SELECT o.pdu, o.room_id, o.status, false, NULL"
                            " FROM event_outliers o WHERE o.event_id = $1 LIMIT 1",
                            1, p, NULL);
    if (!res) {
        *db_failed = true;
        return NULL;
    }
    json_t *pdu = NULL;
    if (PQntuples(res) == 1) {
        pdu = json_loads(PQgetvalue(res, 0, 0), 0, NULL);
        const char *w = PQgetvalue(res, 0, 2);
        *where_out = strcmp(w, "stream") == 0        ? ROOMS_GRAPH_STREAM
                     : strcmp(w, "outlier") == 0     ? ROOMS_GRAPH_OUTLIER
                     : strcmp(w, "soft_failed") == 0 ? ROOMS_GRAPH_SOFT_FAILED
                                                     : ROOMS_GRAPH_REJECTED;
        if (room_id_out) snprintf(room_id_out, ROOMS_GRAPH_ID_BYTES, "%s", PQgetvalue(res, 0, 1));
        const room_version *v = room_version_find(PQgetvalue(res, 0, 4));
        if (pdu && v && PQgetvalue(res, 0, 3)[0] == 't') {
            json_t *red = event_redact(v, pdu);
            json_decref(pdu);
            pdu = red;
        }
        if (!pdu) *where_out = ROOMS_GRAPH_ABSENT;
    }
    PQclear(res);
    return pdu;
}

int rooms_graph_store_outlier(PGconn *c, const char *room_id, const char *event_id,
                              const json_t *pdu, const char *status, const char *why,
                              const char *origin)
{
    char *text = json_dumps(pdu, JSON_COMPACT | JSON_SORT_KEYS);
    if (!text) return -1;
    char depth[24], now[24];
    snprintf(depth, sizeof(depth), "%lld", (long long)json_integer_value(json_object_get(pdu, "depth")));
    snprintf(now, sizeof(now), "%lld", (long long)rooms_wall_ms());
    const char *p[8] = {event_id, room_id, status, why, origin, depth, text, now};
    bool ok = db_exec(c,
                      "INSERT INTO event_outliers (event_id, room_id, status, reason, origin,"
                      " depth, pdu, received_ts) SELECT $1, $2, $3, $4, $5, $6, $7, $8"
                      " WHERE NOT EXISTS (SELECT 1 FROM events WHERE event_id = $1)"
                      " ON CONFLICT (event_id) DO NOTHING",
                      8, p);
    free(text);
    if (!ok) return -1;
    return rooms_graph_record_edges(c, room_id, event_id, pdu);
}

int rooms_graph_load_many(PGconn *c, const json_t *ids, json_t **out)
{
    *out = json_array();
    for (size_t i = 0; i < json_array_size(ids); i++) {
        rooms_graph_where w;
        bool failed;
        json_t *pdu = rooms_graph_load(c, json_string_value(json_array_get(ids, i)), NULL, &w,
                                       &failed);
        if (failed) {
            json_decref(*out);
            *out = NULL;
            return -1;
        }
        if (pdu && w != ROOMS_GRAPH_REJECTED) json_array_append(*out, pdu);
        json_decref(pdu);
    }
    return 0;
}
