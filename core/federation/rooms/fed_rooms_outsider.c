/*
 * core/federation/rooms/fed_rooms_outsider.c - a received PDU for a room this server is not in
 * that ends one of our users' knocks or invites: the resident server's kick rejecting the
 * knock (or withdrawing the invite), which it sends to us although we are in no part of
 * the room (fed_rooms_queue_pdu queues it so).
 *
 * Such a room has no state here to check the event against: only the knock or invite our
 * user has (an outlier, its membership a row of memberships: core/client/rooms/
 * crooms_knock.c, fed_rooms_invite.c) and the room version kept with it. So the checks are
 * those that need no state: an m.room.member leave or ban of that user, sent by a user of
 * the origin server and not by our user (whose own leaves go out through make_leave), in
 * the format of the room's version, signed as the version requires, its content hash
 * intact; and it must name our user's knock or invite among its auth events, so it is a
 * reply to that membership and not a replay of an older one. It is then kept the way the
 * knock was, an outlier and the user's newest membership, which moves the room from
 * /sync's knock (or invite) section to leave.
 *
 * Synapse (1.132) as the resident sends its events only to the servers in the room before
 * them, so a knock it rejects is not heard of here: the room stays in the user's knocks
 * until they knock again or leave.
 *
 * Everything else for a room we are not in is fed_rooms_recv.c's to refuse.
 */
#include <stdio.h>
#include <string.h>

#include "core/rooms/rooms_tx.h"
#include "core/federation/transport/fed_call.h"
#include "core/federation/rooms/fed_rooms.h"

/* The user's newest membership in room_id when it is a knock or invite of a room this
 * server is not in: its event ID and the room version kept with it. 1 found, 0, -1. */
static int outstanding(PGconn *c, const char *room_id, const char *user, char *event_id,
                       size_t id_len, const room_version **v)
{
    const char *p[2] = {room_id, user};
    PGresult *res = rooms_q(c,
                            "SELECT m.event_id, coalesce(k.room_version, i.room_version)"
                            " FROM (SELECT event_id, membership FROM memberships"
                            "  WHERE room_id = $1 AND user_id = $2"
                            "  ORDER BY stream_pos DESC LIMIT 1) m"
                            " LEFT JOIN remote_knocks k ON k.event_id = m.event_id"
                            " LEFT JOIN remote_invites i ON i.event_id = m.event_id"
                            " WHERE m.membership IN ('knock', 'invite')"
                            " AND coalesce(k.room_version, i.room_version) IS NOT NULL",
                            2, p, NULL);
    if (!res) return -1;
    int found = PQntuples(res) == 1;
    if (found) {
        snprintf(event_id, id_len, "%s", PQgetvalue(res, 0, 0));
        *v = room_version_find(PQgetvalue(res, 0, 1));
        if (!*v) found = 0;
    }
    PQclear(res);
    return found;
}

static bool names_auth_event(const json_t *pdu, const char *event_id)
{
    json_t *auth = json_object_get(pdu, "auth_events");
    for (size_t i = 0; i < json_array_size(auth); i++) {
        const char *id = event_ref_id(json_array_get(auth, i));
        if (id && strcmp(id, event_id) == 0) return true;
    }
    return false;
}

static int refuse(char err[FED_PDU_ERR_LEN], const char *origin, const char *room_id,
                  const char *why)
{
    snprintf(err, FED_PDU_ERR_LEN, "%s", why);
    rt_log(ATRIUM_LOG_INFO, "federation", "a PDU from %s for %s (a room this server is not in) "
           "rejected: %s", origin, room_id, why);
    return FED_PDU_REJECTED;
}

int fed_rooms_outsider_pdu(PGconn **cp, const char *origin, const json_t *pdu,
                           char err[FED_PDU_ERR_LEN])
{
    PGconn *c = *cp;
    const char *room_id = json_string_value(json_object_get(pdu, "room_id"));
    const char *type = json_string_value(json_object_get(pdu, "type"));
    const char *sender = json_string_value(json_object_get(pdu, "sender"));
    const char *target = event_state_key(pdu);
    const char *membership = event_content_str(pdu, "membership");
    const char *own = fed_state()->server_name;
    if (!room_id || !type || strcmp(type, "m.room.member") != 0 || !sender || !target ||
        !membership || (strcmp(membership, "leave") != 0 && strcmp(membership, "ban") != 0) ||
        strcmp(room_auth_domain(target), own) != 0)
        return FED_ROOMS_NOT_OUTSIDER;
    int in = fed_rooms_server_joined(c, room_id, own);
    if (in < 0) return FED_PDU_RETRY;
    if (in) return FED_ROOMS_NOT_OUTSIDER;
    char knock_id[ROOMS_GRAPH_ID_BYTES];
    const room_version *v = NULL;
    int has = outstanding(c, room_id, target, knock_id, sizeof(knock_id), &v);
    if (has < 0) return FED_PDU_RETRY;
    if (!has) return FED_ROOMS_NOT_OUTSIDER;
    if (strcmp(sender, target) == 0 || strcmp(room_auth_domain(sender), origin) != 0)
        return refuse(err, origin, room_id, "Only a user of the sending server may end this "
                      "user's knock or invite");
    char why[FED_CALL_ERROR_BYTES];
    if (event_check_format(v, pdu, why) != EVENT_FORMAT_OK) return refuse(err, origin, room_id, why);
    if (!names_auth_event(pdu, knock_id))
        return refuse(err, origin, room_id, "The event does not answer this user's knock or invite");
    if (!event_content_hash_ok(pdu)) return refuse(err, origin, room_id, "The content hash does not match");
    fed_call_hold hold = {.c = cp}; /* *cp goes back to the pool while a key is fetched */
    if (fed_call_verify_event(v, pdu, &hold, why) < 0) return refuse(err, origin, room_id, why);
    if (!(c = *cp)) {
        snprintf(err, FED_PDU_ERR_LEN, "The database is busy; retry");
        return FED_PDU_RETRY;
    }
    char id[EVENT_ID_LEN];
    if (event_compute_id(v, pdu, id) < 0) return refuse(err, origin, room_id, "Not canonical JSON");
    const char *p[5] = {id, room_id, target, membership, sender};
    bool ok = db_begin(c) &&
              rooms_graph_store_outlier(c, room_id, id, pdu, "outlier", NULL, origin) == 0 &&
              db_exec(c,
                      "INSERT INTO memberships (stream_pos, room_id, user_id, membership,"
                      " event_id, sender) SELECT stream_next(), $2, $3, $4, $1, $5"
                      " WHERE NOT EXISTS (SELECT 1 FROM memberships WHERE event_id = $1)",
                      5, p) &&
              db_commit(c);
    if (!ok) {
        db_rollback(c);
        snprintf(err, FED_PDU_ERR_LEN, "The database failed; retry");
        return FED_PDU_RETRY;
    }
    rooms_tx_wake_user(target);
    rt_log(ATRIUM_LOG_INFO, "federation", "%s ended %s's knock or invite on %s (%s)", sender, target,
           room_id, id);
    return FED_PDU_ACCEPTED;
}
