/*
 * core/client/rooms/crooms_send.c - sending events: PUT /rooms/{roomId}/send/{eventType}/{txnId},
 * PUT /rooms/{roomId}/state/{eventType}[/{stateKey}] and
 * PUT /rooms/{roomId}/redact/{eventId}/{txnId}.
 *
 * Owns send idempotency: a (user, device, txnId) seen before answers with the event it
 * created, without writing, rate limiting or re-checking anything (a retry of a request
 * that succeeded must succeed). Redactions keep their transaction IDs in their own
 * namespace ("redact|<txnId>"). Setting a state event to the content it already has
 * writes nothing and answers with the existing event, as Synapse does. A second annotation
 * (reaction) with the same key from the same sender to the same event is refused with 400
 * M_DUPLICATE_ANNOTATION, as the spec says; redacting the first allows it again. An
 * m.room.canonical_alias state event must name aliases that point to the room
 * (crooms_check_canonical_alias, 400 M_BAD_ALIAS; other servers' new aliases are asked of
 * them, the request parked meanwhile: crooms_check_remote_canonical). Everything
 * else - auth rules, size limits, canonical JSON - is the write path's (core/rooms/rooms_tx.c).
 */
#include <stdio.h>
#include <string.h>

#include "core/client/auth/auth.h"
#include "core/client/ratelimits.h"
#include "core/client/rooms/crooms_api.h"
#include "core/client/rooms/crooms_relations.h"
#include "core/rooms/canonical_json.h"

/* The request body as event content: a JSON object canonical JSON can carry. */
static json_t *content_body(atrium_req *r)
{
    json_t *body = http_req_json(r);
    if (!body) return NULL;
    char why[ROOM_AUTH_WHY_LEN];
    if (cjson_normalize(body, why, sizeof(why)) < 0) {
        http_respond_error(r, 400, "M_BAD_JSON", "%s", why);
        return NULL;
    }
    return body;
}

/* Answer from an earlier request with the same transaction ID: 1 = answered, 0 = new. */
static int replay_txn(atrium_req *r, const char *user, const char *key)
{
    PGconn *c = http_db_checkout(r);
    if (!c) return 1;
    char id[EVENT_ID_LEN];
    int found = crooms_txn_lookup(c, user, r->device, key, id);
    http_db_checkin(c);
    if (found < 0) {
        http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
        return 1;
    }
    if (found) http_respond_json(r, 200, json_pack("{s:s}", "event_id", id));
    return found;
}

static bool txn_ok(atrium_req *r, const char *txn)
{
    if (txn && strlen(txn) <= CROOMS_MAX_TXN_ID_BYTES) return true;
    http_respond_error(r, 400, "M_INVALID_PARAM", "The transaction ID is limited to %d bytes",
                       CROOMS_MAX_TXN_ID_BYTES);
    return false;
}

/* Has user already annotated what content annotates with the same key and event type
 * (the relations index forgets redacted ones)? 1 = answered 400, 0 = no (or not an
 * annotation), -1 = answered 503. Checked before the write, outside the room lock: two
 * identical reactions at the same instant may both pass, which costs nothing but a
 * duplicate reaction. */
static int duplicate_annotation(atrium_req *r, const char *room, const char *user,
                                const char *type, const json_t *content)
{
    rooms_relation rel;
    if (!rooms_bundle_parse(content, &rel) || !rel.key || strcmp(rel.rel_type, "m.annotation") != 0)
        return 0;
    PGconn *c = http_db_checkout(r);
    if (!c) return -1;
    const char *p[5] = {rel.event_id, user, type, rel.key, room};
    PGresult *res = rooms_q(c,
                            "SELECT 1 FROM event_relations WHERE relates_to = $1"
                            " AND rel_type = 'm.annotation' AND sender = $2 AND type = $3"
                            " AND aggregation_key = $4 AND room_id = $5 LIMIT 1",
                            5, p, NULL);
    http_db_checkin(c);
    if (!res) {
        http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
        return -1;
    }
    int dup = PQntuples(res) > 0;
    PQclear(res);
    if (dup)
        http_respond_error(r, 400, "M_DUPLICATE_ANNOTATION",
                           "You already annotated that event with this key");
    return dup;
}

/* PUT /_matrix/client/v3/rooms/{roomId}/send/{eventType}/{txnId} */
static int put_send(atrium_req *r)
{
    const char *user = auth_request(r);
    if (!user) return ATRIUM_DONE;
    const char *room = crooms_param_room(r);
    const char *type = http_req_param(r, "eventType"), *txn = http_req_param(r, "txnId");
    if (!room || !txn_ok(r, txn)) return ATRIUM_DONE;
    if (replay_txn(r, user, txn)) return ATRIUM_DONE;
    json_t *content = content_body(r);
    if (!content) return ATRIUM_DONE;
    if (ratelimit_refused(r, ratelimit_message())) return ATRIUM_DONE;
    if (duplicate_annotation(r, room, user, type, content) != 0) return ATRIUM_DONE;
    room_new_event ev = {.sender = user, .type = type, .content = content,
                         .txn_device = r->device, .txn_id = txn};
    return crooms_write_one(r, room, &ev, NULL);
}

/* The current state event (type, state_key) when its content equals content: its ID into
 * id_out and true. */
static bool same_state(PGconn *c, const char *room, const char *type, const char *key,
                       const json_t *content, char id_out[EVENT_ID_LEN])
{
    const char *p[3] = {room, type, key};
    PGresult *res = rooms_q(c,
                            "SELECT e.event_id, e.pdu FROM current_state cs"
                            " JOIN events e ON e.event_id = cs.event_id"
                            " WHERE cs.room_id = $1 AND cs.type = $2 AND cs.state_key = $3"
                            " AND e.redacted_by IS NULL",
                            3, p, NULL);
    bool same = false;
    if (res && PQntuples(res) == 1) {
        json_t *pdu = json_loads(PQgetvalue(res, 0, 1), 0, NULL);
        same = pdu && json_equal(json_object_get(pdu, "content"), (json_t *)content);
        if (same) snprintf(id_out, EVENT_ID_LEN, "%s", PQgetvalue(res, 0, 0));
        json_decref(pdu);
    }
    PQclear(res);
    return same;
}

/* The checks an m.room.canonical_alias event gets before it is written: its aliases point
 * at the room, here and on their servers. true to go on; false with *out what the handler
 * returns (ATRIUM_DONE after answering, or ATRIUM_PARKED). c stays the caller's. */
static bool canonical_alias_ok(atrium_req *r, PGconn *c, const char *room, const char *type,
                               const char *key, json_t *content, int *out)
{
    if (strcmp(type, "m.room.canonical_alias") != 0 || key[0] != '\0') return true;
    rooms_err e = {0};
    if (crooms_check_canonical_alias(c, room, content, &e) != ROOMS_OK) {
        *out = rooms_fail(r, &e);
        return false;
    }
    return crooms_check_remote_canonical(r, c, room, content, out);
}

/* PUT /_matrix/client/v3/rooms/{roomId}/state/{eventType}[/{stateKey}] */
static int put_state(atrium_req *r)
{
    const char *user = auth_request(r);
    if (!user) return ATRIUM_DONE;
    const char *room = crooms_param_room(r);
    const char *type = http_req_param(r, "eventType"), *key = http_req_param(r, "stateKey");
    if (!room) return ATRIUM_DONE;
    if (!key) key = "";
    json_t *content = content_body(r);
    if (!content) return ATRIUM_DONE;
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    int out = ATRIUM_DONE;
    bool go = canonical_alias_ok(r, c, room, type, key, content, &out);
    char id[EVENT_ID_LEN];
    bool same = go && same_state(c, room, type, key, content, id);
    http_db_checkin(c);
    if (!go) return out;
    if (same) {
        /* Still only for members who may send it: a non-member learns nothing. */
        char m[16];
        PGconn *c2 = http_db_checkout(r);
        if (!c2) return ATRIUM_DONE;
        int rc = rooms_membership_at(c2, room, user, INT64_MAX, m, NULL);
        http_db_checkin(c2);
        if (rc == ROOMS_OK && strcmp(m, "join") == 0)
            return http_respond_json(r, 200, json_pack("{s:s}", "event_id", id));
    }
    if (ratelimit_refused(r, ratelimit_message())) return ATRIUM_DONE;
    room_new_event ev = {.sender = user, .type = type, .state_key = key, .content = content};
    return crooms_write_one(r, room, &ev, NULL);
}

/* PUT /_matrix/client/v3/rooms/{roomId}/redact/{eventId}/{txnId} */
static int put_redact(atrium_req *r)
{
    const char *user = auth_request(r);
    if (!user) return ATRIUM_DONE;
    const char *room = crooms_param_room(r);
    const char *target = http_req_param(r, "eventId"), *txn = http_req_param(r, "txnId");
    if (!room || !txn_ok(r, txn)) return ATRIUM_DONE;
    if (target[0] != '$' || strlen(target) > EVENT_MAX_ID_BYTES)
        return http_respond_error(r, 400, "M_INVALID_PARAM", "Not an event ID");
    const char *key = rt_arena_printf(r->arena, "redact|%s", txn);
    if (replay_txn(r, user, key)) return ATRIUM_DONE;
    json_t *body = r->body_len ? http_req_json(r) : (r->json = json_object());
    if (!body) return ATRIUM_DONE;
    const char *reason;
    if (!http_field_string(r, body, "reason", false, CROOMS_MAX_REASON_BYTES, &reason)) return ATRIUM_DONE;
    if (ratelimit_refused(r, ratelimit_message())) return ATRIUM_DONE;
    json_t *content = reason ? json_pack("{s:s}", "reason", reason) : json_object();
    room_new_event ev = {.sender = user, .type = "m.room.redaction", .content = content,
                         .redacts = target, .txn_device = r->device, .txn_id = txn, .txn_key = key};
    int out = crooms_write_one(r, room, &ev, NULL);
    json_decref(content);
    return out;
}

int crooms_send_routes(http_server *s)
{
    if (client_route(s, "PUT", "/_matrix/client/v3/rooms/{roomId}/send/{eventType}/{txnId}",
                     put_send, CROOMS_MAX_BODY_BYTES) < 0 ||
        client_route(s, "PUT", "/_matrix/client/v3/rooms/{roomId}/state/{eventType}/{stateKey}",
                     put_state, CROOMS_MAX_BODY_BYTES) < 0 ||
        client_route(s, "PUT", "/_matrix/client/v3/rooms/{roomId}/state/{eventType}", put_state,
                     CROOMS_MAX_BODY_BYTES) < 0 ||
        client_route(s, "PUT", "/_matrix/client/v3/rooms/{roomId}/state/{eventType}/", put_state,
                     CROOMS_MAX_BODY_BYTES) < 0 ||
        client_route(s, "PUT", "/_matrix/client/v3/rooms/{roomId}/redact/{eventId}/{txnId}",
                     put_redact, CROOMS_MAX_BODY_BYTES) < 0)
        return -1;
    return 0;
}
