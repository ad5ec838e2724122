/*
 * core/client/rooms/crooms_bundle.c - relations at write time and bundled aggregations at read
 * time.
 *
 * Write time (the room model's write path, core/rooms/rooms_tx.c): rooms_bundle_index records a
 * relation (its parent, rel_type, sender, type, stream position, annotation key) in
 * event_relations and deletes the row of a relation that a redaction removes, so the
 * readers never parse event JSON to find relations and a redacted relation stops counting.
 *
 * Read time: crooms_bundle_add owns which aggregations the server bundles into
 * unsigned."m.relations" (spec v1.11): m.thread (latest event, count, whether the viewer
 * took part), m.replace (the whole most recent valid replacement: same sender and type as
 * the original, neither a state event, the original not itself a replacement nor redacted,
 * m.new_content an object; newest by origin_server_ts, then by event ID) and m.reference
 * (the related event IDs). Annotations are not bundled: the spec dropped that in v1.7.
 * A page of events costs one aggregation query and one query rendering the events the
 * aggregations carry, whatever its size; the latest event of a thread gets its own
 * bundle with one more such pair (nesting stops there). Only relation events the viewer
 * may see (rooms_vis_window) take part. It does not decide who may read the page itself
 * (the readers do) nor answer HTTP.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/rooms/crooms_relations.h"

#define BUNDLE_MAX_NESTING 1 /* latest_event of a thread gets a bundle; its own do not */

/* ---- bundled aggregations ----------------------------------------------------------- */

/* One row per aggregation: kind ('t' thread, 'r' replacement, 'f' reference), parent,
 * the position of the event it carries (thread: the latest), the thread's count and
 * whether the viewer sent a thread event, and a reference's event ID. $1 parent IDs,
 * $2 room, $3 viewer, $4 REL_BUNDLE_MAX_REFERENCES, $5.. the visibility condition (three
 * times, on the relation event e). */
static const char BUNDLE_SQL[] =
    "WITH th AS (SELECT rel.relates_to AS parent, count(*) AS n, max(e.stream_pos) AS pos,"
    "  bool_or(rel.sender = $3) AS mine"
    "  FROM event_relations rel JOIN events e ON e.event_id = rel.event_id"
    "  WHERE rel.relates_to = ANY($1::text[]) AND rel.room_id = $2"
    "  AND rel.rel_type = 'm.thread'%s GROUP BY rel.relates_to),"
    " rp AS (SELECT DISTINCT ON (rel.relates_to) rel.relates_to AS parent, e.stream_pos AS pos"
    "  FROM event_relations rel JOIN events e ON e.event_id = rel.event_id"
    "  JOIN events o ON o.event_id = rel.relates_to"
    "  WHERE rel.relates_to = ANY($1::text[]) AND rel.room_id = $2"
    "  AND rel.rel_type = 'm.replace' AND e.sender = o.sender AND e.type = o.type"
    "  AND e.state_key IS NULL AND o.state_key IS NULL AND o.redacted_by IS NULL"
    "  AND jsonb_typeof(e.pdu::jsonb -> 'content' -> 'm.new_content') = 'object'"
    "  AND NOT EXISTS (SELECT 1 FROM event_relations x WHERE x.event_id = o.event_id"
    "   AND x.rel_type = 'm.replace')%s"
    "  ORDER BY rel.relates_to, e.origin_server_ts DESC, e.event_id DESC),"
    " rf AS (SELECT parent, id, pos FROM (SELECT rel.relates_to AS parent,"
    "   rel.event_id AS id, rel.stream_pos AS pos, row_number() OVER"
    "   (PARTITION BY rel.relates_to ORDER BY rel.stream_pos) AS k"
    "  FROM event_relations rel JOIN events e ON e.event_id = rel.event_id"
    "  WHERE rel.relates_to = ANY($1::text[]) AND rel.room_id = $2"
    "  AND rel.rel_type = 'm.reference'%s) x WHERE k <= $4::bigint)"
    " SELECT 't', parent, pos, n, mine, NULL FROM th"
    " UNION ALL SELECT 'r', parent, pos, 0, false, NULL FROM rp"
    " UNION ALL SELECT 'f', parent, pos, 0, false, id FROM rf ORDER BY 1, 2, 3";

enum { B_KIND = 0, B_PARENT, B_POS, B_COUNT, B_MINE, B_ID };

/* The m.relations object of event `parent` in bundles (created on first use). */
static json_t *relations_of(json_t *bundles, const char *parent)
{
    json_t *rel = json_object_get(bundles, parent);
    if (!rel) {
        rel = json_object();
        json_object_set_new(bundles, parent, rel);
    }
    return rel;
}

/* Render the events at the positions of array `positions` (decimal strings) into
 * `by_pos` {pos: event}. ROOMS_OK or ROOMS_E_DB. */
static int render_positions(PGconn *c, rt_arena *a, const events_view *v, json_t *positions,
                            json_t *by_pos)
{
    if (json_array_size(positions) == 0) return ROOMS_OK;
    const char *p[1] = {rooms_pg_array(a, positions)};
    if (!p[0]) return ROOMS_E_DB;
    PGresult *res = rooms_q(c, EVENTS_SELECT "WHERE e.stream_pos = ANY($1::bigint[])", 1, p, NULL);
    if (!res) return ROOMS_E_DB;
    for (int i = 0; i < PQntuples(res); i++) {
        json_t *ev = events_render(v, res, i);
        if (ev) json_object_set_new(by_pos, PQgetvalue(res, i, EVENTS_COL_POS), ev);
    }
    PQclear(res);
    return ROOMS_OK;
}

static int bundle(PGconn *c, rt_arena *a, const events_view *v, const char *room_id,
                  const rooms_vis *vis, json_t *events, int nesting);

/* The aggregation rows of res into bundles {parent: m.relations}, with the carried events
 * rendered (and, below BUNDLE_MAX_NESTING, a thread's latest event bundled in turn). */
static int fill_bundles(PGconn *c, rt_arena *a, const events_view *v, const char *room_id,
                        const rooms_vis *vis, PGresult *res, json_t *parents, json_t *bundles,
                        int nesting)
{
    json_t *positions = json_array(), *by_pos = json_object(), *latest = json_array();
    int rows = PQntuples(res);
    for (int i = 0; i < rows; i++)
        if (PQgetvalue(res, i, B_KIND)[0] != 'f')
            json_array_append_new(positions, json_string(PQgetvalue(res, i, B_POS)));
    int rc = render_positions(c, a, v, positions, by_pos);
    for (int i = 0; i < rows && rc == ROOMS_OK; i++) {
        const char kind = PQgetvalue(res, i, B_KIND)[0], *parent = PQgetvalue(res, i, B_PARENT);
        json_t *rel = relations_of(bundles, parent);
        json_t *carried = json_object_get(by_pos, PQgetvalue(res, i, B_POS));
        if (kind == 'f') {
            json_t *refs = json_object_get(rel, REL_REFERENCE);
            if (!refs) {
                refs = json_pack("{s:[]}", "chunk");
                json_object_set_new(rel, REL_REFERENCE, refs);
            }
            json_array_append_new(json_object_get(refs, "chunk"),
                                  json_pack("{s:s}", "event_id", PQgetvalue(res, i, B_ID)));
        } else if (kind == 'r' && carried) {
            json_object_set(rel, REL_REPLACE, carried);
        } else if (kind == 't' && carried) {
            const char *root_sender = json_string_value(
                json_object_get(json_object_get(parents, parent), "sender"));
            bool mine = PQgetvalue(res, i, B_MINE)[0] == 't' ||
                        (root_sender && v->user_id && strcmp(root_sender, v->user_id) == 0);
            json_object_set_new(rel, REL_THREAD,
                                json_pack("{s:O, s:I, s:b}", "latest_event", carried, "count",
                                          (json_int_t)atoll(PQgetvalue(res, i, B_COUNT)),
                                          "current_user_participated", mine));
            json_array_append(latest, carried);
        }
    }
    if (rc == ROOMS_OK && nesting < BUNDLE_MAX_NESTING && json_array_size(latest) > 0)
        rc = bundle(c, a, v, room_id, vis, latest, nesting + 1);
    json_decref(latest);
    json_decref(by_pos);
    json_decref(positions);
    return rc;
}

static int bundle(PGconn *c, rt_arena *a, const events_view *v, const char *room_id,
                  const rooms_vis *vis, json_t *events, int nesting)
{
    json_t *ids = json_array(), *parents = json_object();
    for (size_t i = 0; i < json_array_size(events); i++) {
        json_t *ev = json_array_get(events, i);
        const char *id = json_string_value(json_object_get(ev, "event_id"));
        if (!id || json_object_get(parents, id)) continue;
        json_array_append_new(ids, json_string(id));
        json_object_set(parents, id, ev);
    }
    const char *p[4 + ROOMS_VIS_PARAMS] = {rooms_pg_array(a, ids), room_id, v->user_id,
                                           rt_arena_printf(a, "%d", REL_BUNDLE_MAX_REFERENCES)};
    const char *vis_sql = NULL;
    json_decref(ids);
    int rc = ROOMS_OK;
    if (json_object_size(parents) == 0 || !p[0] || !p[3] ||
        !rooms_vis_window(a, vis, 0, INT64_MAX, false, 5, &vis_sql, p + 4)) {
        json_decref(parents);
        return ROOMS_OK; /* nothing to bundle, or no relation event can be visible */
    }
    const char *sql = rt_arena_printf(a, BUNDLE_SQL, vis_sql, vis_sql, vis_sql);
    PGresult *res = sql ? rooms_q(c, sql, 4 + ROOMS_VIS_PARAMS, p, NULL) : NULL;
    json_t *bundles = json_object();
    rc = res ? fill_bundles(c, a, v, room_id, vis, res, parents, bundles, nesting) : ROOMS_E_DB;
    PQclear(res);
    const char *id;
    json_t *rel;
    json_object_foreach(bundles, id, rel) {
        json_t *ev = json_object_get(parents, id);
        if (!ev || json_object_size(rel) == 0) continue;
        json_t *uns = json_object_get(ev, "unsigned");
        if (!uns) {
            uns = json_object();
            json_object_set_new(ev, "unsigned", uns);
        }
        json_object_set(uns, "m.relations", rel);
    }
    json_decref(bundles);
    json_decref(parents);
    return rc;
}

int crooms_bundle_add(PGconn *c, rt_arena *a, const events_view *v, const char *room_id,
                     const rooms_vis *vis, json_t *events)
{
    return bundle(c, a, v, room_id, vis, events, 0);
}
