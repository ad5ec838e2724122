/*
 * core/rooms/rooms_tx.c - the one write path of room events: a transaction that locks
 * the room's row, reads the state the auth rules need, authorizes the event, builds its
 * PDU (auth_events, prev_events, depth, hashes, event ID), and stores it with everything
 * that follows from it (current state, membership history, a redaction's target, the
 * sender's transaction ID), then wakes whoever should see it after the commit.
 *
 * Every endpoint that writes an event (createRoom, membership, send, state, redact) goes
 * through rooms_tx_append, so the rules are applied in one place. Lock order inside a
 * transaction: the room's row first, then the stream lock (stream_next()); nothing takes a
 * row lock after taking a stream position, which keeps /sync's stream_upto() free of
 * deadlocks. Not here: HTTP (the endpoint files), reading events back (events_store.c),
 * and what the layers above do with a stored event (signing, other servers, wake-ups, the
 * room directory): each is a hook they register (rooms_tx.h), called from one place here.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rooms/canonical_json.h"
#include "core/rooms/rooms_tx.h"

static bool is(const char *a, const char *b)
{
    return a && b && strcmp(a, b) == 0;
}

/* ---- hooks -------------------------------------------------------------------------- */

/* Set during start-up, before any request (rooms_tx.h); read without a lock after. */
static struct {
    rooms_tx_sign_fn sign;
    rooms_tx_queue_fn queue;
    rooms_tx_kick_fn kick;
    rooms_tx_listing_fn listing_changed;
    rooms_tx_wake_room_fn wake_room;
    rooms_tx_wake_user_fn wake_user;
} hooks;

void rooms_tx_set_signer(rooms_tx_sign_fn sign)
{
    hooks.sign = sign;
}

void rooms_tx_set_outbound(rooms_tx_queue_fn queue, rooms_tx_kick_fn kick)
{
    hooks.queue = queue;
    hooks.kick = kick;
}

void rooms_tx_set_listing_hook(rooms_tx_listing_fn changed)
{
    hooks.listing_changed = changed;
}

void rooms_tx_set_wake(rooms_tx_wake_room_fn room, rooms_tx_wake_user_fn user)
{
    hooks.wake_room = room;
    hooks.wake_user = user;
}

void rooms_tx_wake_user(const char *user_id)
{
    if (hooks.wake_user) hooks.wake_user(user_id);
}

/* ---- failures as Matrix errors ------------------------------------------------------ */

int rooms_fail(atrium_req *r, const rooms_err *e)
{
    switch (e->code) {
    case ROOMS_E_FORBIDDEN: return http_respond_error(r, 403, "M_FORBIDDEN", "%s", e->why);
    case ROOMS_E_NOT_FOUND: return http_respond_error(r, 404, "M_NOT_FOUND", "%s", e->why);
    case ROOMS_E_TOO_LARGE: return http_respond_error(r, 413, "M_TOO_LARGE", "%s", e->why);
    case ROOMS_E_BAD_JSON: return http_respond_error(r, 400, "M_BAD_JSON", "%s", e->why);
    case ROOMS_E_NO_DIRECTORY:
        return http_respond_error(r, 400, "M_UNRECOGNIZED",
                                  "Room aliases need the room directory, which this server has "
                                  "disabled (plugins.directory.enabled)");
    case ROOMS_E_BAD_ALIAS: return http_respond_error(r, 400, "M_BAD_ALIAS", "%s", e->why);
    case ROOMS_E_ALIAS_IN_USE: return http_respond_error(r, 400, "M_ROOM_IN_USE", "%s", e->why);
    case ROOMS_E_INVALID: return http_respond_error(r, 400, "M_INVALID_PARAM", "%s", e->why);
    case ROOMS_E_UNABLE_TO_AUTHORISE:
        return http_respond_error(r, 400, "M_UNABLE_TO_AUTHORISE_JOIN", "%s", e->why);
    case ROOMS_E_UNABLE_TO_GRANT:
        return http_respond_error(r, 400, "M_UNABLE_TO_GRANT_JOIN", "%s", e->why);
    default: return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    }
}

bool rooms_listing_type(const char *type)
{
    static const char *const TYPES[] = {
        "m.room.member", "m.room.create", "m.room.name", "m.room.topic", "m.room.avatar",
        "m.room.canonical_alias", "m.room.join_rules", "m.room.guest_access",
        "m.room.history_visibility",
    };
    for (size_t i = 0; i < sizeof(TYPES) / sizeof(TYPES[0]); i++)
        if (strcmp(type, TYPES[i]) == 0) return true;
    return false;
}

/* ---- transactions ------------------------------------------------------------------- */

int rooms_tx_begin(room_tx *tx, PGconn *c, rt_arena *arena, const char *room_id, rooms_err *e)
{
    memset(tx, 0, sizeof(*tx));
    tx->c = c;
    tx->arena = arena;
    tx->room_id = room_id;
    if (!db_begin(c)) return rooms_set_err(e, ROOMS_E_DB, "database");
    const char *p[1] = {room_id};
    PGresult *res = rooms_q(c,
                            "SELECT room_version, last_event_id, last_depth FROM rooms"
                            " WHERE room_id = $1 FOR UPDATE",
                            1, p, NULL);
    if (!res) {
        rooms_tx_rollback(tx);
        return rooms_set_err(e, ROOMS_E_DB, "database");
    }
    if (PQntuples(res) != 1) {
        PQclear(res);
        rooms_tx_rollback(tx);
        return rooms_set_err(e, ROOMS_E_NOT_FOUND, "Unknown room");
    }
    tx->ver = room_version_find(PQgetvalue(res, 0, 0));
    snprintf(tx->last_event_id, sizeof(tx->last_event_id), "%s", PQgetvalue(res, 0, 1));
    PQclear(res);
    if (rooms_graph_tips_load(c, room_id, &tx->tips) < 0) {
        rooms_tx_rollback(tx);
        return rooms_set_err(e, ROOMS_E_DB, "database");
    }
    tx->depth = tx->tips.max_depth;
    if (!tx->ver) {
        rooms_tx_rollback(tx);
        return rooms_set_err(e, ROOMS_E_FORBIDDEN, "The room's version is not supported");
    }
    return ROOMS_OK;
}

int rooms_tx_begin_new(room_tx *tx, PGconn *c, rt_arena *arena, const char *room_id,
                       const room_version *ver, const char *creator, rooms_err *e)
{
    memset(tx, 0, sizeof(*tx));
    tx->c = c;
    tx->arena = arena;
    tx->room_id = room_id;
    tx->ver = ver;
    char ts[24];
    snprintf(ts, sizeof(ts), "%lld", (long long)rooms_wall_ms());
    const char *p[4] = {room_id, ver->id, creator, ts};
    if (!db_begin(c)) return rooms_set_err(e, ROOMS_E_DB, "database");
    if (!db_exec(c,
                 "INSERT INTO rooms (room_id, room_version, creator, created_ts)"
                 " VALUES ($1, $2, $3, $4)",
                 4, p)) {
        rooms_tx_rollback(tx);
        return rooms_set_err(e, ROOMS_E_DB, "database");
    }
    return ROOMS_OK;
}

void rooms_tx_rollback(room_tx *tx)
{
    db_rollback(tx->c);
}

int rooms_tx_commit(room_tx *tx, rooms_err *e)
{
    if (tx->listing_changed && hooks.listing_changed &&
        hooks.listing_changed(tx->c, tx->room_id) < 0) {
        rooms_tx_rollback(tx);
        return rooms_set_err(e, ROOMS_E_DB, "database");
    }
    if (!db_commit(tx->c)) {
        rooms_tx_rollback(tx);
        return rooms_set_err(e, ROOMS_E_DB, "database");
    }
    if (hooks.kick) hooks.kick();
    if (hooks.wake_room) hooks.wake_room(tx->c, tx->room_id);
    for (int i = 0; hooks.wake_user && i < tx->n_wake; i++) hooks.wake_user(tx->wake_users[i]);
    return ROOMS_OK;
}

/* ---- relations at write time --------------------------------------------------------- */

static const char *relates_str(const json_t *rel, const char *key)
{
    const char *s = json_string_value(json_object_get(rel, key));
    return s && *s && strlen(s) <= EVENT_MAX_ID_BYTES ? s : NULL;
}

bool rooms_bundle_parse(const json_t *content, rooms_relation *out)
{
    memset(out, 0, sizeof(*out));
    const json_t *rel = json_object_get(content, "m.relates_to");
    if (!json_is_object(rel)) return false;
    out->rel_type = relates_str(rel, "rel_type");
    out->event_id = relates_str(rel, "event_id");
    if (!out->rel_type || !out->event_id) {
        memset(out, 0, sizeof(*out));
        return false;
    }
    if (strcmp(out->rel_type, REL_ANNOTATION) == 0)
        out->key = json_string_value(json_object_get(rel, "key"));
    return true;
}

bool rooms_bundle_index(PGconn *c, const char *pos, const char *event_id, const char *room_id,
                        const room_new_event *ev)
{
    if (ev->redacts) { /* a redaction is never a relation itself; it ends the one it hits */
        const char *p[2] = {ev->redacts, room_id};
        return db_exec(c, "DELETE FROM event_relations WHERE event_id = $1 AND room_id = $2",
                       2, p);
    }
    rooms_relation rel;
    if (!rooms_bundle_parse(ev->content, &rel)) return true;
    const char *p[8] = {event_id, room_id, rel.event_id, rel.rel_type, ev->sender, ev->type,
                        pos, rel.key};
    return db_exec(c,
                   "INSERT INTO event_relations (event_id, room_id, relates_to, rel_type,"
                   " sender, type, stream_pos, aggregation_key)"
                   " VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                   8, p);
}

/* ---- the auth state ----------------------------------------------------------------- */

int rooms_load_auth(PGconn *c, const char *room_id, const room_version *ver,
                    const char *sender, const char *target, room_auth_load *out)
{
    memset(out, 0, sizeof(*out));
    out->st.version = ver;
    out->holder = json_object();
    if (!out->holder) return ROOMS_E_DB;
    const char *p[3] = {room_id, sender, target ? target : sender};
    PGresult *res = rooms_q(c,
                            "SELECT cs.type, cs.state_key, cs.event_id, e.pdu, e.redacted_by"
                            " IS NOT NULL, cs.membership"
                            " FROM current_state cs JOIN events e ON e.event_id = cs.event_id"
                            " WHERE cs.room_id = $1 AND ((cs.state_key = '' AND cs.type IN"
                            " ('m.room.create', 'm.room.power_levels', 'm.room.join_rules'))"
                            " OR (cs.type = 'm.room.member' AND cs.state_key IN ($2, $3)))",
                            3, p, NULL);
    if (!res) return ROOMS_E_DB;
    for (int i = 0; i < PQntuples(res); i++) {
        const char *type = PQgetvalue(res, i, 0), *sk = PQgetvalue(res, i, 1);
        json_t *pdu = json_loads(PQgetvalue(res, i, 3), 0, NULL);
        if (!pdu) {
            rt_log(ATRIUM_LOG_ERROR, "core", "event %s of %s is not JSON", PQgetvalue(res, i, 2), room_id);
            continue;
        }
        if (PQgetvalue(res, i, 4)[0] == 't') {
            json_t *red = event_redact(ver, pdu);
            json_decref(pdu);
            pdu = red;
        }
        char key[EVENT_MAX_ID_BYTES * 2 + 8];
        snprintf(key, sizeof(key), "%s|%s", type, sk);
        json_object_set_new(out->holder, key, pdu);
        snprintf(key, sizeof(key), "id|%s|%s", type, sk);
        json_object_set_new(out->holder, key, json_string(PQgetvalue(res, i, 2)));
        const char *id = json_string_value(json_object_get(out->holder, key));
        json_t *content = json_object_get(pdu, "content");
        if (strcmp(type, "m.room.create") == 0) {
            out->st.create = pdu;
            out->create_id = id;
        } else if (strcmp(type, "m.room.power_levels") == 0) {
            out->st.power_levels = content;
            out->pl_id = id;
        } else if (strcmp(type, "m.room.join_rules") == 0) {
            out->st.join_rules = content;
            out->jr_id = id;
        } else {
            /* m.room.member of the sender and/or the target */
            const char *membership = json_string_value(json_object_get(content, "membership"));
            if (strcmp(sk, sender) == 0) {
                out->st.sender_membership = membership;
                out->sender_member_id = id;
            }
            if (target && strcmp(sk, target) == 0) {
                out->st.target_membership = membership;
                out->target_member_id = id;
            }
        }
    }
    PQclear(res);
    return ROOMS_OK;
}

/* The state the auth rules read of a restricted join (v8+): the member event of the user
 * content.join_authorised_via_users_server names, kept in a->holder, reached through
 * a->st.get, and among the join's auth events (the spec's auth events selection). */
static const json_t *holder_get(void *holder, const char *type, const char *state_key)
{
    char key[EVENT_MAX_ID_BYTES * 2 + 8];
    snprintf(key, sizeof(key), "%s|%s", type, state_key);
    return json_object_get(holder, key);
}

static int load_authoriser(PGconn *c, const char *room_id, const room_new_event *ev,
                           room_auth_load *a)
{
    const char *via = json_string_value(json_object_get(ev->content, "join_authorised_via_users_server"));
    if (!a->st.version->restricted_join || strcmp(ev->type, "m.room.member") != 0 || !via ||
        strlen(via) > EVENT_MAX_ID_BYTES)
        return ROOMS_OK;
    a->st.get = holder_get;
    a->st.get_ctx = a->holder;
    const char *p[2] = {room_id, via};
    PGresult *res = rooms_q(c,
                            "SELECT cs.event_id, e.pdu, e.redacted_by IS NOT NULL"
                            " FROM current_state cs JOIN events e ON e.event_id = cs.event_id"
                            " WHERE cs.room_id = $1 AND cs.type = 'm.room.member'"
                            " AND cs.state_key = $2",
                            2, p, NULL);
    if (!res) return ROOMS_E_DB;
    json_t *pdu = PQntuples(res) ? json_loads(PQgetvalue(res, 0, 1), 0, NULL) : NULL;
    if (pdu && PQgetvalue(res, 0, 2)[0] == 't') {
        json_t *red = event_redact(a->st.version, pdu);
        json_decref(pdu);
        pdu = red;
    }
    if (pdu) {
        char key[EVENT_MAX_ID_BYTES * 2 + 8];
        snprintf(key, sizeof(key), "m.room.member|%s", via);
        json_object_set_new(a->holder, key, pdu);
        snprintf(key, sizeof(key), "id|m.room.member|%s", via);
        json_object_set_new(a->holder, key, json_string(PQgetvalue(res, 0, 0)));
        a->authoriser_member_id = json_string_value(json_object_get(a->holder, key));
    }
    PQclear(res);
    return ROOMS_OK;
}

/* ---- building and storing an event -------------------------------------------------- */

static void add_auth_id(json_t *arr, const char *id)
{
    if (!id) return;
    for (size_t i = 0; i < json_array_size(arr); i++)
        if (strcmp(json_string_value(json_array_get(arr, i)), id) == 0) return;
    json_array_append_new(arr, json_string(id));
}

/* The spec's auth events selection for an event of this type/membership. */
static json_t *select_auth_events(const room_auth_load *a, const room_new_event *ev)
{
    json_t *arr = json_array();
    if (strcmp(ev->type, "m.room.create") == 0) return arr;
    add_auth_id(arr, a->create_id);
    add_auth_id(arr, a->pl_id);
    add_auth_id(arr, a->sender_member_id);
    if (strcmp(ev->type, "m.room.member") == 0) {
        add_auth_id(arr, a->target_member_id);
        add_auth_id(arr, a->authoriser_member_id);
        const char *m = json_string_value(json_object_get(ev->content, "membership"));
        if (is(m, "join") || is(m, "invite") || is(m, "knock")) add_auth_id(arr, a->jr_id);
    }
    return arr;
}

static json_t *build_pdu(room_tx *tx, const room_auth_load *a, const room_new_event *ev)
{
    json_t *content = ev->content;
    if (ev->redacts && tx->ver->redacts_in_content) {
        content = json_deep_copy(ev->content);
        json_object_set_new(content, "redacts", json_string(ev->redacts));
    } else {
        json_incref(content);
    }
    json_t *prev = json_array();
    for (int i = 0; i < tx->tips.n; i++) json_array_append_new(prev, json_string(tx->tips.ids[i]));
    json_t *pdu = json_pack("{s:o, s:o, s:I, s:I, s:o, s:s, s:s, s:s}",
                            "auth_events", select_auth_events(a, ev), "content", content,
                            "depth", (json_int_t)(tx->depth + 1), "origin_server_ts",
                            (json_int_t)rooms_wall_ms(), "prev_events", prev, "room_id",
                            tx->room_id, "sender", ev->sender, "type", ev->type);
    if (!pdu) return NULL;
    if (ev->state_key) json_object_set_new(pdu, "state_key", json_string(ev->state_key));
    if (!tx->ver->v11_redaction) json_object_set_new(pdu, "origin", json_string(rooms_server_name()));
    if (ev->redacts && !tx->ver->redacts_in_content)
        json_object_set_new(pdu, "redacts", json_string(ev->redacts));
    return pdu;
}

int rooms_event_seal(const room_version *v, json_t *pdu, char id_out[EVENT_ID_LEN], rooms_err *e)
{
    json_object_del(pdu, "signatures");
    json_object_del(pdu, "unsigned");
    size_t len = 0;
    /* v1-2: the ID names this server, whoever's template the event was built from. */
    if (v->event_id_format == ROOM_EVENT_ID_OPAQUE &&
        event_id_of_server(pdu, rooms_server_name()) < 0)
        return rooms_set_err(e, ROOMS_E_BAD_JSON, "No event ID fits this server's name");
    int fin = event_finalize(v, pdu, id_out, &len); /* hash, ID (v1-2: picked), size */
    if (fin == EVENT_NOT_CANONICAL)
        return rooms_set_err(e, ROOMS_E_BAD_JSON, "The event holds values canonical JSON cannot carry");
    /* The spec signs the redacted event, so a signature survives redaction. The limit is
     * checked on the signed event: that is what other servers receive. */
    json_t *red = event_redact(v, pdu);
    if (!red) return rooms_set_err(e, ROOMS_E_DB, "out of memory");
    int rc = hooks.sign ? hooks.sign(red) : ATRIUM_E_STOPPED;
    if (rc == 0) json_object_set(pdu, "signatures", json_object_get(red, "signatures"));
    json_decref(red);
    if (rc < 0 && rc != ATRIUM_E_STOPPED)
        return rooms_set_err(e, ROOMS_E_BAD_JSON, "The event could not be signed");
    char *text = cjson_encode(pdu, &len);
    if (!text) return rooms_set_err(e, ROOMS_E_BAD_JSON, "The event holds values canonical JSON cannot carry");
    free(text);
    if (len > EVENT_MAX_PDU_BYTES || fin == EVENT_TOO_LARGE)
        return rooms_set_err(e, ROOMS_E_TOO_LARGE, "The event is %zu bytes; the limit is %d", len,
                             EVENT_MAX_PDU_BYTES);
    return ROOMS_OK;
}

/* A redaction's target must be an event of this room the sender may redact: an event of
 * another room is a malformed request (400, as Synapse answers), one this server does not
 * have 404. */
static int check_redaction(room_tx *tx, const room_auth_load *a, const room_new_event *ev,
                           rooms_err *e)
{
    const char *p[1] = {ev->redacts};
    PGresult *res = rooms_q(tx->c, "SELECT sender, room_id FROM events WHERE event_id = $1", 1, p,
                            NULL);
    if (!res) return rooms_set_err(e, ROOMS_E_DB, "database");
    int rc = ROOMS_OK;
    if (PQntuples(res) != 1)
        rc = rooms_set_err(e, ROOMS_E_NOT_FOUND, "No such event in this room");
    else if (strcmp(PQgetvalue(res, 0, 1), tx->room_id) != 0)
        rc = rooms_set_err(e, ROOMS_E_INVALID, "The event to redact belongs to another room");
    else if (!room_auth_may_redact(&a->st, ev->sender, PQgetvalue(res, 0, 0)))
        rc = rooms_set_err(e, ROOMS_E_FORBIDDEN, "You do not have permission to redact this event");
    PQclear(res);
    return rc;
}

/* The state event this one replaces, into out ("" when none). */
static int replaced_state(room_tx *tx, const room_new_event *ev, char out[ROOMS_GRAPH_ID_BYTES])
{
    out[0] = '\0';
    if (!ev->state_key) return ROOMS_OK;
    const char *p[3] = {tx->room_id, ev->type, ev->state_key};
    PGresult *res = rooms_q(tx->c,
                            "SELECT event_id FROM current_state"
                            " WHERE room_id = $1 AND type = $2 AND state_key = $3",
                            3, p, NULL);
    if (!res) return ROOMS_E_DB;
    if (PQntuples(res) == 1) snprintf(out, ROOMS_GRAPH_ID_BYTES, "%s", PQgetvalue(res, 0, 0));
    PQclear(res);
    return ROOMS_OK;
}

/* Store pdu (an event of the stream, created here or by origin: NULL for here) with
 * everything that follows from it. */
static int store(room_tx *tx, const room_new_event *ev, json_t *pdu, const char *event_id,
                 const char *origin, unsigned flags, rooms_err *e)
{
    bool backfilled = flags & ROOMS_PDU_BACKFILLED;
    char replaces[ROOMS_GRAPH_ID_BYTES] = "";
    if (!backfilled && replaced_state(tx, ev, replaces) < 0)
        return rooms_set_err(e, ROOMS_E_DB, "database");
    PGresult *res = rooms_q(tx->c, backfilled ? "SELECT -nextval('rooms_backfill_seq')"
                                              : "SELECT stream_next()", 0, NULL, NULL);
    if (!res) return rooms_set_err(e, ROOMS_E_DB, "database");
    char pos[24], depth[24], ts[24];
    snprintf(pos, sizeof(pos), "%s", PQgetvalue(res, 0, 0));
    PQclear(res);
    snprintf(depth, sizeof(depth), "%lld", (long long)json_integer_value(json_object_get(pdu, "depth")));
    snprintf(ts, sizeof(ts), "%lld", (long long)json_integer_value(json_object_get(pdu, "origin_server_ts")));
    char *text = json_dumps(pdu, JSON_COMPACT | JSON_SORT_KEYS);
    if (!text) return rooms_set_err(e, ROOMS_E_DB, "out of memory");
    const char *membership = strcmp(ev->type, "m.room.member") == 0
                                 ? json_string_value(json_object_get(ev->content, "membership"))
                                 : NULL;
    const char *p[13] = {pos, event_id, tx->room_id, ev->type, ev->state_key, ev->sender, ts,
                         depth, text, replaces[0] ? replaces : NULL, ev->txn_device, ev->txn_id,
                         origin};
    bool ok = db_exec(tx->c,
                      "INSERT INTO events (stream_pos, event_id, room_id, type, state_key,"
                      " sender, origin_server_ts, depth, pdu, replaces_state, txn_device, txn_id,"
                      " origin) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
                      13, p);
    free(text);
    /* relations, redactions */
    /* Our own events go to the room's other servers (theirs came from them): those in the
     * room before the event, so a kicked or banned user's server learns of it too. */
    if (ok && !origin && !(flags & (ROOMS_PDU_HISTORICAL | ROOMS_PDU_NO_QUEUE | ROOMS_PDU_BACKFILLED)))
        ok = !hooks.queue || hooks.queue(tx->c, tx->room_id, event_id) == 0;
    if (ok) ok = rooms_bundle_index(tx->c, pos, event_id, tx->room_id, ev);
    if (ok && ev->state_key && !backfilled) {
        const char *q[5] = {tx->room_id, ev->type, ev->state_key, event_id, membership};
        ok = db_exec(tx->c,
                     "INSERT INTO current_state (room_id, type, state_key, event_id, membership)"
                     " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (room_id, type, state_key)"
                     " DO UPDATE SET event_id = EXCLUDED.event_id, membership = EXCLUDED.membership",
                     5, q);
    }
    if (ok && membership && !backfilled) {
        const char *q[6] = {pos, tx->room_id, ev->state_key, membership, event_id, ev->sender};
        ok = db_exec(tx->c,
                     "INSERT INTO memberships (stream_pos, room_id, user_id, membership, event_id,"
                     " sender) VALUES ($1, $2, $3, $4, $5, $6)",
                     6, q);
    }
    if (ok && ev->redacts) {
        const char *q[2] = {event_id, ev->redacts};
        ok = db_exec(tx->c,
                     "UPDATE events SET redacted_by = $1 WHERE event_id = $2 AND redacted_by IS NULL",
                     2, q);
    }
    if (ok && !backfilled) {
        const char *q[3] = {tx->room_id, event_id, depth};
        ok = db_exec(tx->c, "UPDATE rooms SET last_event_id = $2, last_depth ="
                     " GREATEST(last_depth, $3::bigint) WHERE room_id = $1",
                     3, q);
    }
    /* The graph: its edges, and it is the one forward extremity now (it names them all). */
    if (ok) ok = rooms_graph_record_edges(tx->c, tx->room_id, event_id, pdu) == 0;
    if (ok && !(flags & (ROOMS_PDU_HISTORICAL | ROOMS_PDU_BACKFILLED)))
        ok = rooms_graph_advance(tx->c, tx->room_id, event_id, pdu) == 0;

    if (!ok) return rooms_set_err(e, ROOMS_E_DB, "database");
    if (ev->txn_id) {
        char now[24];
        snprintf(now, sizeof(now), "%lld", (long long)rooms_wall_ms());
        const char *q[5] = {ev->sender, ev->txn_device, ev->txn_key ? ev->txn_key : ev->txn_id,
                            event_id, now};
        bool dup = false;
        PGresult *r2 = rooms_q(tx->c,
                               "INSERT INTO event_txns (user_id, device_id, txn_id, event_id, created_ts)"
                               " VALUES ($1, $2, $3, $4, $5)",
                               5, q, &dup);
        if (!r2) return rooms_set_err(e, dup ? ROOMS_E_TXN_RACE : ROOMS_E_DB, "transaction");
        PQclear(r2);
    }
    return ROOMS_OK;
}

/* The event IDs of the room's current state, a new array into *out. 0 or -1. */
static int current_state_ids(room_tx *tx, json_t **out)
{
    const char *p[1] = {tx->room_id};
    PGresult *res = rooms_q(tx->c, "SELECT event_id FROM current_state WHERE room_id = $1", 1, p,
                            NULL);
    if (!res) return -1;
    *out = json_array();
    for (int i = 0; i < PQntuples(res); i++) json_array_append_new(*out, json_string(PQgetvalue(res, i, 0)));
    PQclear(res);
    return 0;
}

int rooms_tx_append(room_tx *tx, const room_new_event *ev, char id_out[EVENT_ID_LEN],
                    rooms_err *e)
{
    if (strlen(ev->type) > EVENT_MAX_ID_BYTES || (ev->state_key && strlen(ev->state_key) > EVENT_MAX_ID_BYTES))
        return rooms_set_err(e, ROOMS_E_BAD_JSON, "Event types and state keys are limited to %d bytes",
                             EVENT_MAX_ID_BYTES);
    const char *target = strcmp(ev->type, "m.room.member") == 0 ? ev->state_key : NULL;
    room_auth_load a;
    if (rooms_load_auth(tx->c, tx->room_id, tx->ver, ev->sender, target, &a) < 0 ||
        load_authoriser(tx->c, tx->room_id, ev, &a) < 0) {
        json_decref(a.holder);
        return rooms_set_err(e, ROOMS_E_DB, "database");
    }
    a.st.only_create = tx->depth == 1 && a.st.create != NULL;
    int rc = ROOMS_OK;
    char why[ROOM_AUTH_WHY_LEN];
    json_t *pdu = NULL;
    if (!room_auth_allows(&a.st, ev->type, ev->state_key, ev->sender, ev->content, why))
        rc = rooms_set_err(e, ROOMS_E_FORBIDDEN, "%s", why);
    if (rc == ROOMS_OK && ev->redacts) rc = check_redaction(tx, &a, ev, e);
    if (rc == ROOMS_OK && !(pdu = build_pdu(tx, &a, ev))) rc = rooms_set_err(e, ROOMS_E_DB, "out of memory");
    if (rc == ROOMS_OK && rooms_graph_refs_as_pairs(tx->c, tx->ver, pdu) < 0)
        rc = rooms_set_err(e, ROOMS_E_DB, "database");
    if (rc == ROOMS_OK) rc = rooms_event_seal(tx->ver, pdu, id_out, e);
    /* After a fork the line is not the state this event was authorized against (the
     * current state, which state resolution may have set): record it. */
    json_t *before = NULL;
    if (rc == ROOMS_OK && tx->tips.n > 1 && current_state_ids(tx, &before) < 0)
        rc = rooms_set_err(e, ROOMS_E_DB, "database");
    if (rc == ROOMS_OK) rc = store(tx, ev, pdu, id_out, NULL, 0, e);
    if (rc == ROOMS_OK && before &&
        rooms_graph_set_state_before(tx->c, tx->room_id, id_out, before) < 0)
        rc = rooms_set_err(e, ROOMS_E_DB, "database");
    json_decref(before);
    json_decref(pdu);
    json_decref(a.holder);
    if (rc != ROOMS_OK) return rc;
    snprintf(tx->last_event_id, sizeof(tx->last_event_id), "%s", id_out);
    tx->depth++;
    snprintf(tx->tips.ids[0], ROOMS_GRAPH_ID_BYTES, "%s", id_out);
    tx->tips.n = 1;
    tx->tips.max_depth = tx->depth;
    if (ev->state_key && rooms_listing_type(ev->type)) tx->listing_changed = true;
    if (target && tx->n_wake < (int)(sizeof(tx->wake_users) / sizeof(tx->wake_users[0])))
        tx->wake_users[tx->n_wake++] = rt_arena_strdup(tx->arena, target);
    return ROOMS_OK;
}

/* ---- templates and events of other servers ---------------------------------------- */

int rooms_tx_template(room_tx *tx, const room_new_event *ev, json_t **pdu_out, rooms_err *e)
{
    *pdu_out = NULL;
    const char *target = strcmp(ev->type, "m.room.member") == 0 ? ev->state_key : NULL;
    room_auth_load a;
    if (rooms_load_auth(tx->c, tx->room_id, tx->ver, ev->sender, target, &a) < 0 ||
        load_authoriser(tx->c, tx->room_id, ev, &a) < 0) {
        json_decref(a.holder);
        return rooms_set_err(e, ROOMS_E_DB, "database");
    }
    a.st.only_create = tx->depth == 1 && a.st.create != NULL;
    a.st.cosigner = rooms_server_name(); /* send_join adds its signature (fed_rooms_join.c) */
    char why[ROOM_AUTH_WHY_LEN];
    int rc = ROOMS_OK;
    if (!room_auth_allows(&a.st, ev->type, ev->state_key, ev->sender, ev->content, why))
        rc = rooms_set_err(e, ROOMS_E_FORBIDDEN, "%s", why);
    if (rc == ROOMS_OK && !(*pdu_out = build_pdu(tx, &a, ev)))
        rc = rooms_set_err(e, ROOMS_E_DB, "out of memory");
    if (rc == ROOMS_OK && rooms_graph_refs_as_pairs(tx->c, tx->ver, *pdu_out) < 0)
        rc = rooms_set_err(e, ROOMS_E_DB, "database");
    json_decref(a.holder);
    return rc;
}

/* May the redaction pdu (by sender) take effect on its target? The target's sender on the
 * same server, or the redact level in the current state (room versions 3+ decide this
 * when the redaction is applied, not when it is authorized). */
static bool redaction_applies(room_tx *tx, const char *sender, const char *target)
{
    const char *p[2] = {target, tx->room_id};
    PGresult *res = rooms_q(tx->c, "SELECT sender FROM events WHERE event_id = $1 AND room_id = $2",
                            2, p, NULL);
    if (!res) return false;
    bool ok = false;
    if (PQntuples(res) == 1) {
        const char *orig = PQgetvalue(res, 0, 0);
        ok = strcmp(room_auth_domain(orig), room_auth_domain(sender)) == 0;
        if (!ok) {
            room_auth_load a;
            if (rooms_load_auth(tx->c, tx->room_id, tx->ver, sender, NULL, &a) == ROOMS_OK)
                ok = room_auth_may_redact(&a.st, sender, orig);
            json_decref(a.holder);
        }
    }
    PQclear(res);
    return ok;
}

int rooms_tx_append_pdu(room_tx *tx, json_t *pdu, const char *event_id, const char *origin,
                        const json_t *state_before, unsigned flags, rooms_err *e)
{
    const char *type = json_string_value(json_object_get(pdu, "type"));
    const char *sender = json_string_value(json_object_get(pdu, "sender"));
    json_t *content = json_object_get(pdu, "content");
    if (!type || !sender || !json_is_object(content))
        return rooms_set_err(e, ROOMS_E_BAD_JSON, "The event lacks a type, sender or content");
    const char *redacts = json_string_value(json_object_get(pdu, "redacts"));
    if (!redacts) redacts = json_string_value(json_object_get(content, "redacts"));
    if (strcmp(type, "m.room.redaction") != 0) redacts = NULL;
    if (redacts && !redaction_applies(tx, sender, redacts)) redacts = NULL;
    room_new_event ev = {.sender = sender, .type = type, .state_key = event_state_key(pdu),
                         .content = content, .redacts = redacts};
    int rc = store(tx, &ev, pdu, event_id, origin, flags, e);
    if (rc == ROOMS_OK && state_before &&
        rooms_graph_set_state_before(tx->c, tx->room_id, event_id, state_before) < 0)
        rc = rooms_set_err(e, ROOMS_E_DB, "database");
    if (rc == ROOMS_OK && rooms_graph_tips_load(tx->c, tx->room_id, &tx->tips) < 0)
        rc = rooms_set_err(e, ROOMS_E_DB, "database");
    if (rc != ROOMS_OK) return rc;
    tx->depth = tx->tips.max_depth;
    snprintf(tx->last_event_id, sizeof(tx->last_event_id), "%s", event_id);
    if (ev.state_key && rooms_listing_type(type)) tx->listing_changed = true;
    if (ev.state_key && strcmp(type, "m.room.member") == 0 &&
        tx->n_wake < (int)(sizeof(tx->wake_users) / sizeof(tx->wake_users[0])))
        tx->wake_users[tx->n_wake++] = rt_arena_strdup(tx->arena, ev.state_key);
    return ROOMS_OK;
}
