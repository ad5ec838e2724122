/*
 * core/federation/rooms/fed_rooms_serve.c - reading rooms over federation: GET /v1/event/{id},
 * /v1/state/{roomId}, /v1/state_ids/{roomId}, /v1/event_auth/{roomId}/{eventId},
 * /v1/backfill/{roomId},
 * /v1/timestamp_to_event/{roomId} and POST /v1/get_missing_events/{roomId}.
 *
 * Every route is ATRIUM_ROUTE_FEDERATION (fed_auth.c verified r->origin), opens with
 * fed_rooms_open (the room known, its server ACL allowing the origin) and serves only what
 * the origin may see (fed_rooms_server_may_see): an event it may not see is "not found"
 * for /event, a refusal (403) for the state of the room at it, and silently left out of
 * backfill and missing events. PDUs go out as stored, with their signatures (redacted when
 * they were, and when their sender was erased: served_pdu, the rule in rooms.h; the
 * receiving server finds the content hash off and keeps the redacted form). The room's
 * state and auth chains (/state, send_join's answer) go out as stored: servers build and
 * authorize the room with them (Synapse serves them so too; an erased user's membership
 * there is the leave their deactivation sent, which carries no profile). State "at" an event is the state before it, as the graph keeps it
 * (events_graph.h): the spec's Server-Server API ("GET /_matrix/federation/v1/state_ids/
 * {roomId}", "Retrieve the state of a room at a given event") does not say whether the
 * event itself is included; Synapse answers the state before it and, asking another
 * server, adds the event itself when computing the state after a prev event. This server
 * follows Synapse on both sides (fed_rooms_recv.c asks the same way). What this file does not do: answer for rooms this server
 * left (the same refusal as for unknown events).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/federation/rooms/fed_rooms.h"

/* The PDU as other servers are served it: redacted (v's algorithm) when its sender is
 * erased and erasure covers it (rooms_erasure_hides_from_servers), else as it is. Takes
 * pdu; NULL on out-of-memory. */
static json_t *served_pdu(const room_version *v, json_t *pdu, bool sender_erased)
{
    if (!pdu || !rooms_erasure_hides_from_servers(
                    sender_erased, json_string_value(json_object_get(pdu, "type")),
                    json_object_get(pdu, "state_key") != NULL))
        return pdu;
    json_t *red = event_redact(v, pdu);
    json_decref(pdu);
    return red;
}

/* GET /_matrix/federation/v1/event/{eventId} */
static int get_event(atrium_req *r)
{
    const char *event_id = http_req_param(r, "eventId");
    PGconn *c = db_acquire(db_global(), DB_WAIT_CONFIGURED);
    if (!c) return http_respond_error(r, 503, "M_UNKNOWN", "The database is busy; retry");
    char room[ROOMS_GRAPH_ID_BYTES] = "";
    rooms_graph_where w;
    bool failed;
    json_t *pdu = rooms_graph_load(c, event_id, room, &w, &failed);
    fed_rooms_close(c);
    if (failed) return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    if (!pdu || w == ROOMS_GRAPH_REJECTED) {
        json_decref(pdu);
        return http_respond_error(r, 404, "M_NOT_FOUND", "No such event");
    }
    /* Reopen through the room checks: ACL, then visibility at the event. */
    if (!(c = fed_rooms_open(r, room))) {
        json_decref(pdu);
        return ATRIUM_DONE;
    }
    int64_t pos = INT64_MAX;
    int in = w == ROOMS_GRAPH_STREAM ? fed_rooms_event_pos(c, room, event_id, &pos) : 0;
    int see = in < 0 ? -1 : fed_rooms_server_may_see(c, room, r->origin, pos);
    const char *sender = json_string_value(json_object_get(pdu, "sender"));
    int erased = see == 1 && sender ? rooms_user_erased(c, sender) : 0;
    bool failed_v = false;
    const room_version *v = erased == 1 ? rooms_version_of(c, room, &failed_v) : NULL;
    fed_rooms_close(c);
    if (see < 0 || erased < 0 || (erased == 1 && !v)) {
        json_decref(pdu);
        return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    }
    if (!see) {
        json_decref(pdu);
        return http_respond_error(r, 404, "M_NOT_FOUND", "No such event");
    }
    pdu = erased == 1 ? served_pdu(v, pdu, true) : pdu;
    if (!pdu) return http_respond_error(r, 503, "M_UNKNOWN", "Out of memory; retry");
    return fed_rooms_respond_pdus(r, json_pack("[o]", pdu));
}

/* The state before ?event_id= and its auth chain, as IDs, for /state and /state_ids. true
 * with *state and *chain set, or false after answering. */
static bool state_ids_at(atrium_req *r, json_t **state, json_t **chain)
{
    const char *room_id = http_req_param(r, "roomId"), *event_id = http_req_query(r, "event_id");
    *state = *chain = NULL;
    if (!event_id || !*event_id) {
        http_respond_error(r, 400, "M_MISSING_PARAM", "event_id is required");
        return false;
    }
    PGconn *c = fed_rooms_open(r, room_id);
    if (!c) return false;
    int64_t pos = INT64_MAX;
    int in = fed_rooms_event_pos(c, room_id, event_id, &pos);
    int see = in < 0 ? -1 : fed_rooms_server_may_see(c, room_id, r->origin, pos);
    int found = see == 1 ? rooms_graph_state_before(c, room_id, event_id, state) : see;
    int ch = found == 1 ? rooms_graph_auth_chain(c, *state, chain) : 0;
    fed_rooms_close(c);
    if (found < 0 || ch < 0) {
        http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    } else if (see == 0) {
        http_respond_error(r, 403, "M_FORBIDDEN", "Your server may not see the room at that event");
    } else if (found == 0) {
        http_respond_error(r, 404, "M_NOT_FOUND", "No state is known at that event");
    } else {
        return true;
    }
    json_decref(*state);
    json_decref(*chain);
    *state = *chain = NULL;
    return false;
}

/* GET /_matrix/federation/v1/state_ids/{roomId}?event_id= */
static int get_state_ids(atrium_req *r)
{
    json_t *state, *chain;
    if (!state_ids_at(r, &state, &chain)) return ATRIUM_DONE;
    return http_respond_json(r, 200, json_pack("{s:o, s:o}", "auth_chain_ids", chain, "pdu_ids",
                                               state));
}

/* GET /_matrix/federation/v1/event_auth/{roomId}/{eventId}: the event's auth chain, as
 * PDUs, under the checks of /state_ids (the room's ACL, the origin may see the room at the
 * event). An event not in the room's stream (unknown, an outlier, rejected) is not found. */
static int get_event_auth(atrium_req *r)
{
    const char *room_id = http_req_param(r, "roomId"), *event_id = http_req_param(r, "eventId");
    PGconn *c = fed_rooms_open(r, room_id);
    if (!c) return ATRIUM_DONE;
    int64_t pos = INT64_MAX;
    int in = fed_rooms_event_pos(c, room_id, event_id, &pos);
    int see = in == 1 ? fed_rooms_server_may_see(c, room_id, r->origin, pos) : in;
    json_t *roots = json_pack("[s]", event_id), *chain = NULL, *pdus = NULL;
    int rc = see == 1 ? rooms_graph_auth_chain(c, roots, &chain) : 0;
    if (rc == 0 && see == 1) rc = rooms_graph_load_many(c, chain, &pdus);
    fed_rooms_close(c);
    json_decref(roots);
    json_decref(chain);
    if (see < 0 || rc < 0) {
        json_decref(pdus);
        return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    }
    if (in == 0) return http_respond_error(r, 404, "M_NOT_FOUND", "No such event in the room");
    if (see == 0)
        return http_respond_error(r, 403, "M_FORBIDDEN", "Your server may not see the room at "
                                  "that event");
    return http_respond_json(r, 200, json_pack("{s:o}", "auth_chain", pdus));
}

/* GET /_matrix/federation/v1/state/{roomId}?event_id= */
static int get_state(atrium_req *r)
{
    json_t *state, *chain;
    if (!state_ids_at(r, &state, &chain)) return ATRIUM_DONE;
    PGconn *c = db_acquire(db_global(), DB_WAIT_CONFIGURED);
    json_t *pdus = NULL, *auth = NULL;
    bool f1 = !c || rooms_graph_load_many(c, state, &pdus) < 0;
    bool f2 = !c || rooms_graph_load_many(c, chain, &auth) < 0;
    fed_rooms_close(c);
    json_decref(state);
    json_decref(chain);
    if (f1 || f2) {
        json_decref(pdus);
        json_decref(auth);
        return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    }
    return http_respond_json(r, 200, json_pack("{s:o, s:o}", "auth_chain", auth, "pdus", pdus));
}

/* Append pdu at stream position pos to out, as served (served_pdu), when origin may see
 * it. -1 database. */
static int add_if_visible(PGconn *c, const char *room_id, const char *origin, int64_t pos,
                          const room_version *v, const char *text, bool sender_erased,
                          json_t *out)
{
    int see = fed_rooms_server_may_see(c, room_id, origin, pos);
    if (see != 1) return see;
    json_t *pdu = served_pdu(v, json_loads(text, 0, NULL), sender_erased);
    if (pdu) json_array_append_new(out, pdu);
    return 1;
}

/* GET /_matrix/federation/v1/backfill/{roomId}?v=<id>[&v=...]&limit=<n>: the events from
 * the newest of the v events backwards along the stream (this server's order of the
 * graph: every ancestor comes before its descendants), the v events included. */
static int get_backfill(atrium_req *r)
{
    const char *room_id = http_req_param(r, "roomId"), *lim_s = http_req_query(r, "limit");
    long limit = lim_s ? strtol(lim_s, NULL, 10) : 0;
    if (limit <= 0) return http_respond_error(r, 400, "M_INVALID_PARAM", "limit must be positive");
    if (limit > FED_ROOMS_BACKFILL_MAX) limit = FED_ROOMS_BACKFILL_MAX;
    json_t *vs = json_array();
    for (size_t i = 0; i < r->n_args; i++)
        if (strcmp(r->args[i].name, "v") == 0 && r->args[i].value)
            json_array_append_new(vs, json_string(r->args[i].value));
    if (json_array_size(vs) == 0) {
        json_decref(vs);
        return http_respond_error(r, 400, "M_MISSING_PARAM", "v (an event ID) is required");
    }
    PGconn *c = fed_rooms_open(r, room_id);
    if (!c) {
        json_decref(vs);
        return ATRIUM_DONE;
    }
    rt_arena *a = r->arena;
    char lim[24];
    snprintf(lim, sizeof(lim), "%ld", limit);
    const char *p[3] = {room_id, rooms_pg_array(a, vs), lim};
    json_decref(vs);
    bool failed_v = false;
    const room_version *v = rooms_version_of(c, room_id, &failed_v);
    PGresult *res = !v ? NULL
                       : rooms_q(c,
                                 "SELECT e.stream_pos, CASE WHEN e.redacted_by IS NULL THEN e.pdu END,"
                                 " e.event_id, EXISTS (SELECT 1 FROM erased_users x"
                                 "  WHERE x.user_id = e.sender)"
                                 " FROM events e WHERE e.room_id = $1 AND e.stream_pos <="
                                 " (SELECT max(stream_pos) FROM events WHERE room_id = $1"
                                 "  AND event_id = ANY($2::text[]))"
                                 " ORDER BY e.stream_pos DESC LIMIT $3::int",
                                 3, p, NULL);
    json_t *out = json_array();
    int rc = res ? 0 : -1;
    for (int i = 0; res && i < PQntuples(res) && rc >= 0; i++) {
        if (PQgetisnull(res, i, 1)) { /* redacted: serve the redacted form */
            rooms_graph_where w;
            bool failed;
            json_t *pdu = rooms_graph_load(c, PQgetvalue(res, i, 2), NULL, &w, &failed);
            int see = fed_rooms_server_may_see(c, room_id, r->origin, atoll(PQgetvalue(res, i, 0)));
            if (failed || see < 0) rc = -1;
            else if (pdu && see) json_array_append(out, pdu);
            json_decref(pdu);
            continue;
        }
        rc = add_if_visible(c, room_id, r->origin, atoll(PQgetvalue(res, i, 0)), v,
                            PQgetvalue(res, i, 1), PQgetvalue(res, i, 3)[0] == 't', out);
    }
    PQclear(res);
    fed_rooms_close(c);
    if (rc < 0) {
        json_decref(out);
        return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    }
    return fed_rooms_respond_pdus(r, out);
}

/* Is id in the JSON array of strings arr? */
static bool in_ids(const json_t *arr, const char *id)
{
    for (size_t i = 0; i < json_array_size(arr); i++)
        if (strcmp(json_string_value(json_array_get(arr, i)) ?: "", id) == 0) return true;
    return false;
}

/* POST /_matrix/federation/v1/get_missing_events/{roomId}
 * {"earliest_events": [...], "latest_events": [...], "limit": n, "min_depth": d}: walk
 * back from latest_events along prev edges, breadth first, never past earliest_events or
 * below min_depth, and answer the events found (latest_events themselves excluded),
 * oldest first. */
static int post_missing(atrium_req *r)
{
    const char *room_id = http_req_param(r, "roomId");
    json_t *body = http_req_json(r);
    if (!body) return ATRIUM_DONE;
    json_t *earliest = json_object_get(body, "earliest_events"),
           *latest = json_object_get(body, "latest_events");
    json_int_t limit = json_integer_value(json_object_get(body, "limit")),
               min_depth = json_integer_value(json_object_get(body, "min_depth"));
    if (!json_is_array(latest) || (earliest && !json_is_array(earliest)))
        return http_respond_error(r, 400, "M_BAD_JSON", "latest_events and earliest_events must be lists");
    if (limit <= 0) limit = FED_ROOMS_MISSING_DEFAULT;
    if (limit > FED_ROOMS_MISSING_MAX) limit = FED_ROOMS_MISSING_MAX;
    PGconn *c = fed_rooms_open(r, room_id);
    if (!c) return ATRIUM_DONE;
    bool failed_v = false;
    const room_version *ver = rooms_version_of(c, room_id, &failed_v);
    json_t *queue = json_array(), *seen = json_array(), *found = json_array();
    for (size_t i = 0; i < json_array_size(latest); i++) {
        json_t *v = json_array_get(latest, i);
        if (json_is_string(v)) {
            json_array_append(queue, v);
            json_array_append(seen, v);
        }
    }
    int rc = ver ? 0 : -1;
    size_t visited = 0;
    while (json_array_size(queue) > 0 && (json_int_t)json_array_size(found) < limit &&
           visited < FED_ROOMS_MISSING_VISIT_MAX && rc >= 0) {
        const char *id = json_string_value(json_array_get(queue, 0));
        const char *p[2] = {id, room_id};
        PGresult *res = rooms_q(c,
                                "SELECT g.prev_id, e.stream_pos, e.depth, EXISTS (SELECT 1"
                                "  FROM erased_users x WHERE x.user_id = e.sender)"
                                " FROM event_edges g"
                                " JOIN events e ON e.event_id = g.prev_id AND e.room_id = $2"
                                " WHERE g.event_id = $1",
                                2, p, NULL);
        visited++;
        if (!res) {
            rc = -1;
            break;
        }
        for (int i = 0; i < PQntuples(res) && (json_int_t)json_array_size(found) < limit; i++) {
            const char *prev = PQgetvalue(res, i, 0);
            if (in_ids(seen, prev) || in_ids(earliest, prev)) continue;
            json_array_append_new(seen, json_string(prev));
            if (atoll(PQgetvalue(res, i, 2)) < min_depth) continue;
            int see = fed_rooms_server_may_see(c, room_id, r->origin, atoll(PQgetvalue(res, i, 1)));
            if (see < 0) {
                rc = -1;
                break;
            }
            json_array_append_new(queue, json_string(prev));
            if (!see) continue;
            rooms_graph_where w;
            bool failed;
            json_t *pdu = rooms_graph_load(c, prev, NULL, &w, &failed);
            pdu = served_pdu(ver, pdu, PQgetvalue(res, i, 3)[0] == 't');
            if (failed) rc = -1;
            else if (pdu) json_array_insert_new(found, 0, pdu);
        }
        PQclear(res);
        json_array_remove(queue, 0);
    }
    fed_rooms_close(c);
    json_decref(queue);
    json_decref(seen);
    if (rc < 0) {
        json_decref(found);
        return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    }
    /* Oldest first: by depth (insertion at the front already reverses the walk). */
    return http_respond_json(r, 200, json_pack("{s:o}", "events", found));
}

/* GET /_matrix/federation/v1/timestamp_to_event/{roomId}?ts=&dir= (spec v1.6): the event
 * nearest to ts in direction dir (the rule: core/rooms/rooms_jump.c) among those the
 * origin may see, {"event_id", "origin_server_ts"}; 404 M_NOT_FOUND when none. Server
 * visibility is a check per event (fed_rooms_server_may_see), so the nearest
 * FED_ROOMS_JUMP_SCAN_MAX candidates are looked at, nearest first: past them the answer
 * is 404, as if none was visible. Synapse checks only the ACL here; this server also
 * holds the origin to what it may see, as /event does. */
static int get_timestamp_to_event(atrium_req *r)
{
    const char *room_id = http_req_param(r, "roomId");
    int64_t ts;
    bool forward;
    if (!rooms_jump_parse(http_req_query(r, "ts"), http_req_query(r, "dir"), &ts, &forward))
        return http_respond_error(r, 400, "M_INVALID_PARAM",
                                  "'ts' must be a timestamp in ms and 'dir' \"f\" or \"b\"");
    PGconn *c = fed_rooms_open(r, room_id);
    if (!c) return ATRIUM_DONE;
    PGresult *res = rooms_jump_candidates(c, r->arena, room_id, ts, forward, NULL, 0, NULL,
                                          FED_ROOMS_JUMP_SCAN_MAX);
    int found = res ? -1 : -2; /* the row answered; -1 none; -2 database */
    for (int i = 0; res && i < PQntuples(res) && found == -1; i++) {
        int see = fed_rooms_server_may_see(c, room_id, r->origin,
                                           strtoll(PQgetvalue(res, i, 2), NULL, 10));
        if (see < 0) found = -2;
        else if (see) found = i;
    }
    fed_rooms_close(c);
    if (found == -2) {
        PQclear(res);
        return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    }
    if (found < 0) {
        PQclear(res);
        return http_respond_error(r, 404, "M_NOT_FOUND", "No event your server may see %s that time",
                                  forward ? "at or after" : "at or before");
    }
    json_t *body = json_pack("{s:s, s:I}", "event_id", PQgetvalue(res, found, 0),
                             "origin_server_ts",
                             (json_int_t)strtoll(PQgetvalue(res, found, 1), NULL, 10));
    PQclear(res);
    return http_respond_json(r, 200, body);
}

int fed_rooms_serve_routes(fed_module *m)
{
    static const atrium_route routes[] = {
        {.method = "GET", .path = "/_matrix/federation/v1/event/{eventId}", .handler = get_event,
         .flags = ATRIUM_ROUTE_FEDERATION},
        {.method = "GET", .path = "/_matrix/federation/v1/state/{roomId}", .handler = get_state,
         .flags = ATRIUM_ROUTE_FEDERATION},
        {.method = "GET", .path = "/_matrix/federation/v1/state_ids/{roomId}",
         .handler = get_state_ids, .flags = ATRIUM_ROUTE_FEDERATION},
        {.method = "GET", .path = "/_matrix/federation/v1/event_auth/{roomId}/{eventId}",
         .handler = get_event_auth, .flags = ATRIUM_ROUTE_FEDERATION},
        {.method = "GET", .path = "/_matrix/federation/v1/backfill/{roomId}",
         .handler = get_backfill, .flags = ATRIUM_ROUTE_FEDERATION},
        {.method = "POST", .path = "/_matrix/federation/v1/get_missing_events/{roomId}",
         .handler = post_missing, .flags = ATRIUM_ROUTE_FEDERATION},
        {.method = "GET", .path = "/_matrix/federation/v1/timestamp_to_event/{roomId}",
         .handler = get_timestamp_to_event, .flags = ATRIUM_ROUTE_FEDERATION},
    };
    if (HTTP_ROUTES_ADD(m->srv, routes, "federation") < 0) return -1;
    return 0;
}
