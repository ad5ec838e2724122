/*
 * core/client/rooms/crooms_edus.c - typing notices and read receipts across servers: what
 * this server's users say is queued for the room's other servers (m.typing, m.receipt
 * through the outbound queue, core/federation/transport/fed_txn.h), and what other servers' users say
 * is stored like a local user's notice, so /sync reports it the same way.
 *
 * An inbound notice counts only from the server of the user it is about, for a room that
 * server is in (a member of it joined in current state), about a user joined to the room.
 * Only public receipts (m.read) cross servers; private ones never leave. A remote typing
 * notice carries no timeout, so it runs out after ROOMS_FED_TYPING_TIMEOUT_MS unless
 * renewed (servers renew while their user types), reaped like a local one
 * (crooms_typing.c). Not here: the client endpoints (crooms_ephemeral.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/rooms/crooms_api.h"
#include "core/client/sync/notifier.h"
#include "core/federation/transport/fed_txn.h"

#define ROOMS_FED_TYPING_TIMEOUT_MS 30000 /* a remote user's typing lasts this long */
#define ROOMS_FED_DB_WAIT_MS 5000          /* EDU handlers: background work */

/* ---- outbound ---------------------------------------------------------------------- */

void crooms_edu_typing(PGconn *c, const char *room_id, const char *user_id, bool typing)
{
    json_t *content = json_pack("{s:s,s:s,s:b}", "room_id", room_id, "user_id", user_id,
                                "typing", typing);
    if (content && fed_outbound_enqueue_room_edu(c, room_id, "m.typing", content) == 0)
        fed_outbound_kick();
    json_decref(content);
}

void crooms_edu_receipt(PGconn *c, const char *room_id, const char *user_id,
                       const char *event_id, const char *ts, const char *thread_id)
{
    json_t *data = json_pack("{s:I}", "ts", (json_int_t)atoll(ts));
    if (thread_id && *thread_id) json_object_set_new(data, "thread_id", json_string(thread_id));
    json_t *content = json_pack("{s:{s:{s:{s:[s],s:o}}}}", room_id, "m.read", user_id,
                                "event_ids", event_id, "data", data);
    if (content && fed_outbound_enqueue_room_edu(c, room_id, "m.receipt", content) == 0)
        fed_outbound_kick();
    json_decref(content);
}

/* ---- inbound ----------------------------------------------------------------------- */

/* May origin speak for user_id in room_id: its user, the server in the room, the user
 * joined? */
static bool may_speak(PGconn *c, const char *origin, const char *room_id, const char *user_id)
{
    const char *colon = user_id ? strchr(user_id, ':') : NULL;
    if (!room_id || !colon || user_id[0] != '@' || strcmp(colon + 1, origin) != 0) return false;
    if (fed_txn_server_in_room(c, room_id, origin) != 1) return false;
    char m[16];
    return rooms_membership_at(c, room_id, user_id, INT64_MAX, m, NULL) == 0 &&
           strcmp(m, "join") == 0;
}

static void on_typing(void *ctx, const char *origin, const json_t *content)
{
    (void)ctx;
    const char *room = json_string_value(json_object_get(content, "room_id"));
    const char *user = json_string_value(json_object_get(content, "user_id"));
    json_t *typing = json_object_get(content, "typing");
    if (!json_is_boolean(typing)) return;
    PGconn *c = db_acquire(db_global(), ROOMS_FED_DB_WAIT_MS);
    if (!c) return;
    if (!may_speak(c, origin, room, user)) {
        rt_log(ATRIUM_LOG_INFO, "core", "m.typing from %s ignored: not its user in the room",
               origin);
        db_release(db_global(), c);
        return;
    }
    int64_t expires = json_is_true(typing) ? rt_wall_ms() + ROOMS_FED_TYPING_TIMEOUT_MS : 0;
    char exp_s[24];
    snprintf(exp_s, sizeof(exp_s), "%lld", (long long)expires);
    const char *p[3] = {room, user, exp_s};
    bool ok = db_exec(c,
                      "INSERT INTO typing (room_id, user_id, expires_ts, stream_pos)"
                      " VALUES ($1, $2, $3, stream_next()) ON CONFLICT (room_id, user_id)"
                      " DO UPDATE SET expires_ts = EXCLUDED.expires_ts,"
                      " stream_pos = EXCLUDED.stream_pos",
                      3, p);
    if (ok) notifier_wake_room(c, room);
    if (ok && expires) crooms_typing_expires_at(c, expires);
    db_release(db_global(), c);
}

/* One room's receipts: {receipt type: {user: {event_ids, data}}}; true when one was stored. */
static bool store_room_receipts(PGconn *c, const char *origin, const char *room,
                                const json_t *types)
{
    json_t *by_user = json_object_get(types, "m.read"); /* the only public receipt type */
    if (!json_is_object(by_user)) return false;
    bool stored = false;
    const char *user;
    json_t *r;
    json_object_foreach(by_user, user, r) {
        json_t *ids = json_object_get(r, "event_ids");
        const char *event_id = json_string_value(json_array_get(ids, json_array_size(ids) - 1));
        json_t *data = json_object_get(r, "data");
        const char *thread = json_string_value(json_object_get(data, "thread_id"));
        json_t *ts = json_object_get(data, "ts");
        if (!event_id || strlen(event_id) > EVENT_MAX_ID_BYTES || !may_speak(c, origin, room, user))
            continue;
        char ts_s[24];
        snprintf(ts_s, sizeof(ts_s), "%lld",
                 (long long)(json_is_integer(ts) ? json_integer_value(ts) : rt_wall_ms()));
        const char *p[5] = {room, user, thread ? thread : "", event_id, ts_s};
        if (db_exec(c,
                    "INSERT INTO receipts (room_id, user_id, receipt_type, thread_id, event_id,"
                    " ts, stream_pos) VALUES ($1, $2, 'm.read', $3, $4, $5, stream_next())"
                    " ON CONFLICT (room_id, user_id, receipt_type, thread_id) DO UPDATE"
                    " SET event_id = EXCLUDED.event_id, ts = EXCLUDED.ts,"
                    " stream_pos = EXCLUDED.stream_pos",
                    5, p))
            stored = true;
    }
    return stored;
}

static void on_receipt(void *ctx, const char *origin, const json_t *content)
{
    (void)ctx;
    PGconn *c = db_acquire(db_global(), ROOMS_FED_DB_WAIT_MS);
    if (!c) return;
    const char *room;
    json_t *types;
    json_object_foreach((json_t *)content, room, types) {
        if (store_room_receipts(c, origin, room, types)) notifier_wake_room(c, room);
    }
    db_release(db_global(), c);
}

int crooms_edus_init(void)
{
    if (fed_txn_on_edu("m.typing", on_typing, NULL) < 0 ||
        fed_txn_on_edu("m.receipt", on_receipt, NULL) < 0) {
        rt_log(ATRIUM_LOG_ERROR, "core", "cannot register the typing and receipt EDU handlers");
        return -1;
    }
    return 0;
}
