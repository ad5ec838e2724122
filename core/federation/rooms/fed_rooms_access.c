/*
 * core/federation/rooms/fed_rooms_access.c - what a server may read of a room, and whether its
 * traffic is accepted: history visibility for servers and m.room.server_acl, each rule in
 * one function (fed_rooms.h states them), and the opening checks every room route shares.
 *
 * A server is judged by its users' memberships (memberships, by stream position) and the
 * room's m.room.history_visibility at the event, as the spec's "history visibility for
 * servers" has it. It deliberately does not filter per user: a server that may see an
 * event gets it whole, and filters for its own users.
 */
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/federation/rooms/fed_rooms.h"
#include "core/federation/rooms/fed_rooms_queue.h"
#include "core/federation/transport/fed_txn.h"
#include "core/rooms/rooms_tx.h"

void fed_rooms_host_of_server(const char *server_name, char *out, size_t len)
{
    snprintf(out, len, "%s", server_name ? server_name : "");
    if (out[0] == '[') { /* [v6]:port -> [v6] */
        char *close = strchr(out, ']');
        if (close) close[1] = '\0';
        return;
    }
    char *colon = strrchr(out, ':');
    if (colon) *colon = '\0';
}

/* Is host an IP literal (dotted IPv4 or a bracketed IPv6)? */
static bool ip_literal(const char *host)
{
    if (host[0] == '[') return true;
    int dots = 0;
    for (const char *p = host; *p; p++) {
        if (*p == '.') dots++;
        else if (*p < '0' || *p > '9') return false;
    }
    return dots == 3;
}

/* Does host match any glob of the list (strings only; others ignored)? The spec's globs
 * are '*' and '?' only: no bracket classes, so '[' and '\\' are matched literally. */
static bool any_glob(const json_t *list, const char *host)
{
    for (size_t i = 0; i < json_array_size(list); i++) {
        const char *g = json_string_value(json_array_get(list, i));
        if (!g) continue;
        char pat[512];
        size_t o = 0;
        for (const char *p = g; *p && o + 2 < sizeof(pat); p++) {
            if (*p == '[' || *p == ']' || *p == '\\') pat[o++] = '\\';
            pat[o++] = *p;
        }
        pat[o] = '\0';
        if (fnmatch(pat, host, 0) == 0) return true;
    }
    return false;
}

bool fed_rooms_acl_content_allows(const json_t *acl, const char *server_name)
{
    char host[512];
    fed_rooms_host_of_server(server_name, host, sizeof(host));
    json_t *lit = json_object_get(acl, "allow_ip_literals");
    if (ip_literal(host) && json_is_false(lit)) return false;
    if (any_glob(json_object_get(acl, "deny"), host)) return false;
    return any_glob(json_object_get(acl, "allow"), host);
}

int fed_rooms_acl_allows(PGconn *c, const char *room_id, const char *server_name)
{
    const char *p[1] = {room_id};
    PGresult *res = rooms_q(c,
                            "SELECT e.pdu FROM current_state cs JOIN events e ON e.event_id ="
                            " cs.event_id WHERE cs.room_id = $1 AND cs.type = 'm.room.server_acl'"
                            " AND cs.state_key = ''",
                            1, p, NULL);
    if (!res) return -1;
    int allowed = 1;
    if (PQntuples(res) == 1) {
        json_t *pdu = json_loads(PQgetvalue(res, 0, 0), 0, NULL);
        allowed = fed_rooms_acl_content_allows(json_object_get(pdu, "content"), server_name);
        json_decref(pdu);
    }
    PQclear(res);
    return allowed;
}

int fed_rooms_server_may_see(PGconn *c, const char *room_id, const char *server, int64_t pos)
{
    char pos_s[24];
    snprintf(pos_s, sizeof(pos_s), "%lld", (long long)pos);
    const char *p[3] = {room_id, pos_s, server};
    PGresult *res = rooms_q(
        c,
        "SELECT (SELECT h.pdu FROM events h WHERE h.room_id = $1"
        "  AND h.type = 'm.room.history_visibility' AND h.state_key = ''"
        "  AND h.stream_pos <= $2::bigint ORDER BY h.stream_pos DESC LIMIT 1),"
        " coalesce(bool_or(m.membership = 'join'), false),"
        " coalesce(bool_or(m.membership = 'invite'), false),"
        " EXISTS (SELECT 1 FROM current_state cs WHERE cs.room_id = $1"
        "  AND cs.type = 'm.room.member' AND cs.membership = 'join'"
        "  AND substr(cs.state_key, strpos(cs.state_key, ':') + 1) = $3)"
        " FROM (SELECT DISTINCT ON (user_id) membership FROM memberships"
        "  WHERE room_id = $1 AND stream_pos <= $2::bigint"
        "  AND substr(user_id, strpos(user_id, ':') + 1) = $3"
        "  ORDER BY user_id, stream_pos DESC) m",
        3, p, NULL);
    if (!res) return -1;
    json_t *hv_pdu = PQgetisnull(res, 0, 0) ? NULL : json_loads(PQgetvalue(res, 0, 0), 0, NULL);
    rooms_hv hv = hv_pdu ? rooms_hv_parse(event_content_str(hv_pdu, "history_visibility"))
                         : ROOMS_HV_SHARED;
    json_decref(hv_pdu);
    bool joined_at = PQgetvalue(res, 0, 1)[0] == 't', invited_at = PQgetvalue(res, 0, 2)[0] == 't';
    bool joined_now = PQgetvalue(res, 0, 3)[0] == 't';
    PQclear(res);
    if (hv == ROOMS_HV_WORLD_READABLE || joined_at) return 1;
    if (hv == ROOMS_HV_SHARED && joined_now) return 1;
    if (hv == ROOMS_HV_INVITED && invited_at) return 1;
    return 0;
}

int fed_rooms_server_joined(PGconn *c, const char *room_id, const char *server)
{
    const char *p[2] = {room_id, server};
    PGresult *res = rooms_q(c,
                            "SELECT 1 FROM current_state WHERE room_id = $1"
                            " AND type = 'm.room.member' AND membership = 'join'"
                            " AND substr(state_key, strpos(state_key, ':') + 1) = $2 LIMIT 1",
                            2, p, NULL);
    if (!res) return -1;
    int n = PQntuples(res);
    PQclear(res);
    return n > 0;
}

int fed_rooms_server_involved(PGconn *c, const char *room_id, const char *server)
{
    const char *p[2] = {room_id, server};
    PGresult *res = rooms_q(c,
                            "SELECT 1 FROM current_state WHERE room_id = $1"
                            " AND type = 'm.room.member'"
                            " AND substr(state_key, strpos(state_key, ':') + 1) = $2 LIMIT 1",
                            2, p, NULL);
    if (!res) return -1;
    int n = PQntuples(res);
    PQclear(res);
    return n > 0;
}

int fed_rooms_event_pos(PGconn *c, const char *room_id, const char *event_id, int64_t *pos)
{
    const char *p[2] = {event_id, room_id};
    PGresult *res = rooms_q(c, "SELECT stream_pos FROM events WHERE event_id = $1 AND room_id = $2",
                            2, p, NULL);
    if (!res) return -1;
    int found = PQntuples(res) == 1;
    if (found && pos) *pos = atoll(PQgetvalue(res, 0, 0));
    PQclear(res);
    return found;
}

int fed_rooms_backward_extremities(PGconn *c, const char *room_id, int max, json_t **out)
{
    char max_s[24], now_s[24];
    snprintf(max_s, sizeof(max_s), "%d", max);
    snprintf(now_s, sizeof(now_s), "%lld", (long long)rt_wall_ms());
    const char *p[3] = {room_id, max_s, now_s};
    PGresult *res = rooms_q(c,
                            "SELECT g.prev_id FROM event_edges g"
                            " JOIN events e ON e.event_id = g.event_id"
                            " WHERE g.room_id = $1"
                            " AND NOT EXISTS (SELECT 1 FROM events x WHERE x.event_id = g.prev_id)"
                            " AND NOT EXISTS (SELECT 1 FROM event_outliers o"
                            "  WHERE o.event_id = g.prev_id AND o.status = 'rejected')"
                            " AND NOT EXISTS (SELECT 1 FROM backfill_dead_ends d"
                            "  WHERE d.event_id = g.prev_id AND d.until_ts > $3::bigint)"
                            " GROUP BY g.prev_id ORDER BY max(e.depth) DESC LIMIT $2::int",
                            3, p, NULL);
    if (!res) return -1;
    *out = json_array();
    for (int i = 0; i < PQntuples(res); i++) json_array_append_new(*out, json_string(PQgetvalue(res, i, 0)));
    int n = PQntuples(res);
    PQclear(res);
    return n;
}

PGconn *fed_rooms_open(atrium_req *r, const char *room_id)
{
    if (!room_id || !rooms_room_id_ok(room_id)) {
        http_respond_error(r, 400, "M_INVALID_PARAM", "Not a room ID");
        return NULL;
    }
    PGconn *c = http_db_checkout(r);
    if (!c) return NULL;
    bool failed = false;
    const room_version *v = rooms_version_of(c, room_id, &failed);
    int acl = v ? fed_rooms_acl_allows(c, room_id, r->origin) : 0;
    if (failed || acl < 0) {
        http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    } else if (!v) {
        http_respond_error(r, 404, "M_NOT_FOUND", "This server does not know the room");
    } else if (!acl) {
        rt_log(ATRIUM_LOG_INFO, "federation", "%s refused by the server ACL of %s", r->origin,
               room_id);
        http_respond_error(r, 403, "M_FORBIDDEN", "Server ACLs of the room deny your server");
    } else {
        return c;
    }
    http_db_checkin(c);
    return NULL;
}

void fed_rooms_close(PGconn *c)
{
    http_db_checkin(c);
}

int fed_rooms_respond_pdus(atrium_req *r, json_t *pdus)
{
    fed_module *m = fed_state();
    return http_respond_json(r, 200, json_pack("{s:s, s:I, s:o}", "origin", m->server_name,
                                               "origin_server_ts", (json_int_t)rt_wall_ms(),
                                               "pdus", pdus));
}

static int queue_own_pdu(PGconn *c, const char *room_id, const char *event_id);

int fed_rooms_init(void)
{
    fed_module *m = fed_state();
    return m ? fed_rooms_routes(m) : 0;
}

int fed_rooms_routes(fed_module *m)
{
    if (fed_rooms_serve_routes(m) < 0 || fed_rooms_join_routes(m) < 0 ||
        fed_rooms_hierarchy_routes(m) < 0)
        return -1;
    if (fed_rooms_invite_routes(m) < 0) return -1;
    rooms_tx_set_outbound(queue_own_pdu, fed_rooms_kick);
    return fed_rooms_recv_init(m);
}

/* ---- the outbound queue (fed_rooms_queue.h) ------------------------------------------ */

/* The server of a user whose knock or invite event_id ends (a kick rejecting a knock, an
 * invite withdrawn), when that server is not in the room: it would otherwise never learn
 * that its user's knock or invite is over. Read while the ended membership is still the
 * current state (the queue runs before the event becomes it: core/rooms/rooms_tx.c). into out
 * ("" when none); 0 or -1. */
static int ended_outsider(PGconn *c, const char *room_id, const char *event_id, char *out,
                          size_t len)
{
    out[0] = '\0';
    const char *p[2] = {room_id, event_id};
    PGresult *res = db_query(
        c,
        "SELECT substr(e.state_key, strpos(e.state_key, ':') + 1) FROM events e"
        " JOIN current_state cs ON cs.room_id = e.room_id AND cs.type = 'm.room.member'"
        " AND cs.state_key = e.state_key"
        " WHERE e.room_id = $1 AND e.event_id = $2 AND e.type = 'm.room.member'"
        " AND e.sender <> e.state_key AND cs.membership IN ('knock', 'invite')"
        " AND (e.pdu::jsonb) -> 'content' ->> 'membership' IN ('leave', 'ban')",
        2, p);
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        rt_log(ATRIUM_LOG_ERROR, "federation", "outbound queue: %s", PQerrorMessage(c));
        PQclear(res);
        return -1;
    }
    if (PQntuples(res) == 1) snprintf(out, len, "%s", PQgetvalue(res, 0, 0));
    PQclear(res);
    if (!out[0]) return 0;
    int in = fed_rooms_server_joined(c, room_id, out);
    if (in < 0) return -1;
    if (in) out[0] = '\0';
    return 0;
}

int fed_rooms_queue_pdu(PGconn *c, const char *room_id, const char *event_id,
                        const char *except_server)
{
    if (fed_outbound_enqueue_pdu(c, room_id, event_id, except_server) < 0) return -1;
    char outsider[ROOMS_GRAPH_ID_BYTES];
    if (ended_outsider(c, room_id, event_id, outsider, sizeof(outsider)) < 0) return -1;
    if (!outsider[0] || (except_server && strcmp(outsider, except_server) == 0)) return 0;
    return fed_outbound_enqueue_pdu_to(c, outsider, room_id, event_id);
}

void fed_rooms_kick(void)
{
    fed_outbound_kick();
}

/* The write path's outbound hook (rooms_tx.h): an event created here goes to every other
 * server of the room. */
static int queue_own_pdu(PGconn *c, const char *room_id, const char *event_id)
{
    return fed_rooms_queue_pdu(c, room_id, event_id, NULL);
}
