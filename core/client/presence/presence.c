/*
 * core/client/presence/presence.c - presence: GET and PUT /presence/{userId}/status, the
 * mark each /sync leaves (set_presence), and the presence section of /sync.
 *
 * Decisions owned here:
 *   - One row per user (presence table): the state the user or their client set, an
 *     optional status message, when they were last active, and the stream position of the
 *     last change others should hear of. Only such a change takes a position (and wakes
 *     the user's contacts); a sync that finds the user already in the state it would set
 *     just refreshes last_active_ts, at most once per PRESENCE_ACTIVE_REFRESH_MS, so a
 *     client polling /sync costs no stream traffic.
 *   - The state read is derived (effective_state): "online" with no activity for
 *     PRESENCE_IDLE_AFTER_MS reads as "unavailable", and for PRESENCE_OFFLINE_AFTER_MS as
 *     "offline" (a client that went away without saying so). Derived changes take no
 *     stream position: contacts learn them from GET /presence or last_active_ago, and the
 *     next real change.
 *   - Who sees whom: a user sees their own presence and that of everyone they share a
 *     joined room with (GET /presence of anyone else is 403). A sync carries the user's
 *     own presence, and a join brings the presence of those it made contacts in the sync
 *     that carries it, however old their last change (docs/adr/0020-legacy-sync-follows-synapse.md).
 *   - Bounded: a change wakes at most PRESENCE_MAX_WAKE_USERS contacts; a sync carries at
 *     most PRESENCE_MAX_SYNC_EVENTS presence events, newest first. An incremental sync
 *     reads only the changes of its window (an index on stream_pos), each checked
 *     against the user's rooms by index, so a user with many contacts costs what changed,
 *     not how many they know; an initial sync reads the contacts' rows by primary key.
 *   - presence.enabled: false stores nothing, answers every GET with "offline" and adds no
 *     presence to /sync; PUT is accepted and ignored (as Synapse does), and nothing
 *     crosses servers either way.
 *   - Across servers (m.presence EDUs): a change of a local user's state is queued for
 *     every other server with a user joined to one of the user's rooms (at most
 *     PRESENCE_MAX_SERVERS); another server's EDU counts only for its own users who are
 *     joined to a room here, and is stored in the same table (rows of remote users, at
 *     a stream position, their contacts woken), so /sync and GET /presence read them
 *     like a local user's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/accounts/accounts.h"
#include "core/client/client.h"
#include "core/client/presence/presence.h"
#include "core/client/sync/notifier.h"
#include "core/client/sync/sync.h"
#include "core/federation/transport/fed_txn.h"
#include "core/rooms/rooms.h"

#define PRESENCE_ACTIVE_REFRESH_MS (60 * 1000)      /* last_active_ts rewritten at most this often */
#define PRESENCE_CURRENTLY_ACTIVE_MS (2 * PRESENCE_ACTIVE_REFRESH_MS) /* "currently_active" */
#define PRESENCE_IDLE_AFTER_MS (5 * 60 * 1000)      /* online, inactive: reads unavailable */
#define PRESENCE_OFFLINE_AFTER_MS (30 * 60 * 1000)  /* online, inactive: reads offline */
#define PRESENCE_MAX_WAKE_USERS 10000               /* contacts woken by one change */
#define PRESENCE_MAX_SYNC_EVENTS 100                /* presence events in one sync */
#define PRESENCE_STATUS_MSG_MAX_BYTES 1024
#define PRESENCE_BODY_MAX_BYTES 4096
#define PRESENCE_MAX_SERVERS 1000     /* servers one change is sent to at most */
#define PRESENCE_MAX_EDU_PUSH 100     /* users of one inbound m.presence EDU read at most */
#define PRESENCE_EDU_DB_WAIT_MS 5000  /* the EDU handler waits this long for a connection */
#define I64_CHARS 24

static const atrium_migration MIGRATIONS[] = {
    {1, "presence",
     "CREATE TABLE presence ("
     " user_id text PRIMARY KEY REFERENCES users(user_id),"
     " state text NOT NULL,"
     " status_msg text,"
     " last_active_ts bigint NOT NULL,"
     " stream_pos bigint NOT NULL);"
     "CREATE INDEX presence_stream ON presence (stream_pos);"},
    {2, "presence_remote_users",
     /* Rows of other servers' users too (m.presence EDUs): not in users. */
     "ALTER TABLE presence DROP CONSTRAINT IF EXISTS presence_user_id_fkey;"},
};

/* Joined members of the user's joined rooms (the user among them). $1 user, $2 limit. */
#define CONTACTS_SQL                                                                       \
    "SELECT DISTINCT b.state_key FROM current_state a JOIN current_state b"                \
    " ON b.room_id = a.room_id AND b.type = 'm.room.member' AND b.membership = 'join'"     \
    " WHERE a.type = 'm.room.member' AND a.state_key = $1 AND a.membership = 'join'"

static bool enabled(void)
{
    return core_runtime_get()->cfg->presence.enabled;
}

static bool state_ok(const char *s)
{
    return s && (strcmp(s, "online") == 0 || strcmp(s, "unavailable") == 0 ||
                 strcmp(s, "offline") == 0);
}

bool presence_sync_value_ok(const char *set_presence)
{
    return !set_presence || state_ok(set_presence);
}

/* The state others see: the one set, unless an "online" user has been inactive long. */
static const char *effective_state(const char *state, int64_t last_active_ts, int64_t now)
{
    if (strcmp(state, "online") != 0) return state;
    int64_t idle = now - last_active_ts;
    if (idle >= PRESENCE_OFFLINE_AFTER_MS) return "offline";
    if (idle >= PRESENCE_IDLE_AFTER_MS) return "unavailable";
    return "online";
}

json_t *presence_content(const char *state, const char *status_msg,
                                int64_t last_active_ts, int64_t now)
{
    const char *shown = effective_state(state, last_active_ts, now);
    int64_t ago = now > last_active_ts ? now - last_active_ts : 0;
    json_t *c = json_pack("{s:s, s:I, s:b}", "presence", shown, "last_active_ago",
                          (json_int_t)ago, "currently_active",
                          strcmp(shown, "online") == 0 && ago < PRESENCE_CURRENTLY_ACTIVE_MS);
    if (status_msg) json_object_set_new(c, "status_msg", json_string(status_msg));
    return c;
}

/* Wake the parked syncs of the user's contacts (after the change committed). */
static void wake_contacts(PGconn *c, const char *user_id)
{
    char limit_s[I64_CHARS];
    snprintf(limit_s, sizeof(limit_s), "%d", PRESENCE_MAX_WAKE_USERS);
    const char *p[2] = {user_id, limit_s};
    PGresult *res = rooms_q(c, CONTACTS_SQL " LIMIT $2", 2, p, NULL);
    if (!res) return; /* they learn it at their next sync */
    for (int i = 0; i < PQntuples(res); i++)
        if (strcmp(PQgetvalue(res, i, 0), user_id) != 0) notifier_wake_user(PQgetvalue(res, i, 0));
    PQclear(res);
}

static const char *own_server(void)
{
    return core_runtime_get()->cfg->server_name;
}

static bool is_local(const char *user_id)
{
    const char *colon = strchr(user_id, ':');
    return colon && strcmp(colon + 1, own_server()) == 0;
}

/* Queue the stored presence of local user user_id for the other servers sharing a room
 * with them (an m.presence EDU each). Best effort: a failure is logged. */
static void share_change(PGconn *c, const char *user_id, int64_t now)
{
    const char *p[1] = {user_id};
    PGresult *row = rooms_q(c, "SELECT state, status_msg, last_active_ts FROM presence"
                               " WHERE user_id = $1", 1, p, NULL);
    if (!row || PQntuples(row) != 1) {
        PQclear(row);
        return;
    }
    json_t *item = presence_content(PQgetvalue(row, 0, 0),
                                    PQgetisnull(row, 0, 1) ? NULL : PQgetvalue(row, 0, 1),
                                    strtoll(PQgetvalue(row, 0, 2), NULL, 10), now);
    PQclear(row);
    json_object_set_new(item, "user_id", json_string(user_id));
    json_t *content = json_pack("{s:[o]}", "push", item);
    char limit_s[I64_CHARS];
    snprintf(limit_s, sizeof(limit_s), "%d", PRESENCE_MAX_SERVERS);
    const char *q[3] = {user_id, own_server(), limit_s};
    PGresult *res = rooms_q(c,
                            "SELECT DISTINCT substr(b.state_key, strpos(b.state_key, ':') + 1)"
                            " FROM current_state a JOIN current_state b ON b.room_id = a.room_id"
                            " AND b.type = 'm.room.member' AND b.membership = 'join'"
                            " WHERE a.type = 'm.room.member' AND a.state_key = $1"
                            " AND a.membership = 'join'"
                            " AND substr(b.state_key, strpos(b.state_key, ':') + 1) <> $2"
                            " LIMIT $3::bigint",
                            3, q, NULL);
    int queued = 0;
    for (int i = 0; res && i < PQntuples(res); i++)
        if (fed_outbound_enqueue_edu(c, PQgetvalue(res, i, 0), "m.presence", content) == 0) queued++;
    if (!res) rt_log(ATRIUM_LOG_WARN, "core", "presence of %s not sent to other servers: database", user_id);
    PQclear(res);
    json_decref(content);
    if (queued) fed_outbound_kick();
}

/* Store a state others should hear of: a new stream position (and, for a local user, an
 * m.presence EDU for the servers sharing a room with them). keep_msg leaves the status
 * message as it is. 0 or ATRIUM_E_DB. */
static int store_change(PGconn *c, const char *user_id, const char *state, const char *msg,
                        bool keep_msg, int64_t now)
{
    char now_s[I64_CHARS];
    snprintf(now_s, sizeof(now_s), "%lld", (long long)now);
    const char *p[5] = {user_id, state, msg, now_s, keep_msg ? "t" : "f"};
    PGresult *res = rooms_q(c,
                            "INSERT INTO presence (user_id, state, status_msg, last_active_ts,"
                            " stream_pos) VALUES ($1, $2, $3, $4::bigint, stream_next())"
                            " ON CONFLICT (user_id) DO UPDATE SET state = EXCLUDED.state,"
                            " status_msg = CASE WHEN $5::boolean THEN presence.status_msg"
                            "  ELSE EXCLUDED.status_msg END,"
                            " last_active_ts = EXCLUDED.last_active_ts,"
                            " stream_pos = EXCLUDED.stream_pos",
                            5, p, NULL);
    if (!res) return ATRIUM_E_DB;
    PQclear(res);
    wake_contacts(c, user_id);
    notifier_wake_user(user_id); /* the user's other devices */
    if (is_local(user_id)) share_change(c, user_id, now);
    return 0;
}

int presence_sync_mark(PGconn *c, const char *user_id, const char *set_presence)
{
    const char *want = set_presence ? set_presence : "online";
    if (!enabled() || strcmp(want, "offline") == 0) return 0;
    int64_t now = rooms_wall_ms();
    const char *p[1] = {user_id};
    PGresult *res = rooms_q(c, "SELECT state, last_active_ts FROM presence WHERE user_id = $1",
                            1, p, NULL);
    if (!res) return ATRIUM_E_DB;
    bool found = PQntuples(res) == 1;
    char shown[16] = "offline";
    int64_t last = 0;
    if (found) {
        last = strtoll(PQgetvalue(res, 0, 1), NULL, 10);
        snprintf(shown, sizeof(shown), "%s", effective_state(PQgetvalue(res, 0, 0), last, now));
    }
    PQclear(res);
    if (!found || strcmp(shown, want) != 0)
        return store_change(c, user_id, want, NULL, true, now);
    if (now - last < PRESENCE_ACTIVE_REFRESH_MS) return 0;
    char now_s[I64_CHARS];
    snprintf(now_s, sizeof(now_s), "%lld", (long long)now);
    const char *q[2] = {user_id, now_s};
    res = rooms_q(c, "UPDATE presence SET last_active_ts = $2::bigint WHERE user_id = $1", 2, q,
                  NULL);
    if (!res) return ATRIUM_E_DB;
    PQclear(res);
    return 0;
}

/* ---- endpoints ---------------------------------------------------------------------- */

/* Does `viewer` share a joined room with `user` (or is it them)? 1, 0 or ATRIUM_E_DB. */
static int may_see(PGconn *c, const char *viewer, const char *user)
{
    if (strcmp(viewer, user) == 0) return 1;
    const char *p[2] = {viewer, user};
    PGresult *res = rooms_q(c,
                            "SELECT 1 FROM current_state a JOIN current_state b"
                            " ON b.room_id = a.room_id AND b.type = 'm.room.member'"
                            " AND b.state_key = $2 AND b.membership = 'join'"
                            " WHERE a.type = 'm.room.member' AND a.state_key = $1"
                            " AND a.membership = 'join' LIMIT 1",
                            2, p, NULL);
    if (!res) return ATRIUM_E_DB;
    int n = PQntuples(res);
    PQclear(res);
    return n > 0;
}

/* GET /_matrix/client/v3/presence/{userId}/status */
static int get_status(atrium_req *r)
{
    if (!auth_request(r)) return ATRIUM_DONE;
    const char *user = http_req_param(r, "userId");
    if (!rooms_user_id_ok(user)) return http_respond_error(r, 400, "M_INVALID_PARAM", "Not a user ID");
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    int exists = is_local(user) ? acc_user_exists(c, user) : 1; /* another server's: if seen */
    int seen = exists == 1 ? may_see(c, r->user, user) : 0;
    PGresult *res = NULL;
    if (seen == 1 && enabled()) {
        const char *p[1] = {user};
        res = rooms_q(c, "SELECT state, status_msg, last_active_ts FROM presence"
                         " WHERE user_id = $1", 1, p, NULL);
    }
    http_db_checkin(c);
    if (exists < 0 || seen < 0 || (seen == 1 && enabled() && !res)) return acc_db_failed(r);
    if (exists == 0) return http_respond_error(r, 404, "M_NOT_FOUND", "Unknown user");
    if (!seen)
        return http_respond_error(r, 403, "M_FORBIDDEN",
                                  "You do not share a room with this user");
    json_t *body;
    if (res && PQntuples(res) == 1)
        body = presence_content(PQgetvalue(res, 0, 0),
                                PQgetisnull(res, 0, 1) ? NULL : PQgetvalue(res, 0, 1),
                                strtoll(PQgetvalue(res, 0, 2), NULL, 10), rooms_wall_ms());
    else
        body = json_pack("{s:s}", "presence", "offline");
    PQclear(res);
    return http_respond_json(r, 200, body);
}

/* PUT /_matrix/client/v3/presence/{userId}/status {presence, status_msg?} */
static int put_status(atrium_req *r)
{
    if (!auth_request(r)) return ATRIUM_DONE;
    if (strcmp(http_req_param(r, "userId"), r->user) != 0)
        return http_respond_error(r, 403, "M_FORBIDDEN", "You can only set your own presence");
    json_t *body = http_req_json(r);
    const char *state, *msg;
    if (!body || !http_field_string(r, body, "presence", true, 0, &state) ||
        !http_field_string(r, body, "status_msg", false, PRESENCE_STATUS_MSG_MAX_BYTES, &msg))
        return ATRIUM_DONE;
    if (!state_ok(state))
        return http_respond_error(r, 400, "M_INVALID_PARAM",
                                  "presence must be online, unavailable or offline");
    if (!enabled()) return http_respond_json(r, 200, json_object());
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    int rc = store_change(c, r->user, state, msg, false, rooms_wall_ms());
    http_db_checkin(c);
    if (rc < 0) return acc_db_failed(r);
    return http_respond_json(r, 200, json_object());
}

/* ---- sync --------------------------------------------------------------------------- */

/* presence.events of a sync: the user's own presence and their contacts' - on an initial
 * sync every such row; on an incremental one the changes of (since, upto], plus the
 * current presence of whoever the window's joins made a contact (the members of a room
 * the user joined, a user who joined one of the user's rooms: Synapse does the same, so a
 * client learns a newcomer's presence in the sync that carries the join) - newest first,
 * at most PRESENCE_MAX_SYNC_EVENTS. 1 when an incremental sync has some. */
static int sync_presence(PGconn *c, const char *user_id, const char *device_id, int64_t since,
                         int64_t upto, json_t *response)
{
    (void)device_id;
    if (!enabled()) return 0;
    char since_s[I64_CHARS], upto_s[I64_CHARS], limit_s[I64_CHARS], wake_s[I64_CHARS];
    snprintf(since_s, sizeof(since_s), "%lld", (long long)since);
    snprintf(upto_s, sizeof(upto_s), "%lld", (long long)upto);
    snprintf(limit_s, sizeof(limit_s), "%d", PRESENCE_MAX_SYNC_EVENTS);
    snprintf(wake_s, sizeof(wake_s), "%d", PRESENCE_MAX_WAKE_USERS);
    const char *p[5] = {user_id, since_s, upto_s, limit_s, wake_s};
    /* Initial: the user and the contacts (primary key look-ups). Incremental: the window's
     * changes (stream index), each checked against the user's rooms, and the window's joins
     * (memberships by user and by room, both indexed on position). */
    const char *sql =
        since == 0
            ? "SELECT p.user_id, p.state, p.status_msg, p.last_active_ts FROM presence p"
              " WHERE (p.user_id = $1 OR p.user_id IN (" CONTACTS_SQL " LIMIT $5::bigint))"
              " AND p.stream_pos > $2::bigint AND p.stream_pos <= $3::bigint"
              " ORDER BY p.stream_pos DESC LIMIT $4::bigint"
            : "SELECT p.user_id, p.state, p.status_msg, p.last_active_ts, p.stream_pos"
              " FROM presence p WHERE p.stream_pos > $2::bigint AND p.stream_pos <= $3::bigint"
              " AND (p.user_id = $1 OR EXISTS (SELECT 1 FROM current_state a"
              "  JOIN current_state b ON b.room_id = a.room_id AND b.type = 'm.room.member'"
              "  AND b.state_key = p.user_id AND b.membership = 'join'"
              "  WHERE a.type = 'm.room.member' AND a.state_key = $1 AND a.membership = 'join'))"
              " UNION SELECT p.user_id, p.state, p.status_msg, p.last_active_ts, p.stream_pos"
              " FROM presence p WHERE p.stream_pos <= $3::bigint AND p.user_id <> $1"
              " AND p.user_id IN ("
              "  SELECT b.state_key FROM memberships m JOIN current_state b"
              "  ON b.room_id = m.room_id AND b.type = 'm.room.member' AND b.membership = 'join'"
              "  WHERE m.user_id = $1 AND m.membership = 'join'"
              "  AND m.stream_pos > $2::bigint AND m.stream_pos <= $3::bigint"
              "  UNION SELECT m.user_id FROM current_state a JOIN memberships m"
              "  ON m.room_id = a.room_id AND m.membership = 'join'"
              "  AND m.stream_pos > $2::bigint AND m.stream_pos <= $3::bigint"
              "  WHERE a.type = 'm.room.member' AND a.state_key = $1 AND a.membership = 'join')"
              " ORDER BY 5 DESC LIMIT $4::bigint";
    PGresult *res = rooms_q(c, sql, since == 0 ? 5 : 4, p, NULL); /* every $N used */
    if (!res) return ATRIUM_E_DB;
    int64_t now = rooms_wall_ms();
    json_t *events = json_array();
    for (int i = 0; i < PQntuples(res); i++)
        json_array_append_new(
            events, json_pack("{s:s, s:s, s:o}", "type", "m.presence", "sender",
                              PQgetvalue(res, i, 0), "content",
                              presence_content(PQgetvalue(res, i, 1),
                                               PQgetisnull(res, i, 2) ? NULL : PQgetvalue(res, i, 2),
                                               strtoll(PQgetvalue(res, i, 3), NULL, 10), now)));
    PQclear(res);
    int news = since > 0 && json_array_size(events) > 0;
    json_object_set_new(response, "presence", json_pack("{s:o}", "events", events));
    return news;
}

/* ---- other servers' users ------------------------------------------------------------ */

/* One user of an inbound m.presence EDU: origin's own user, joined to a room here, with a
 * valid state. true when stored. */
static bool store_remote(PGconn *c, const char *origin, const json_t *item, int64_t now)
{
    const char *user = json_string_value(json_object_get(item, "user_id"));
    const char *state = json_string_value(json_object_get(item, "presence"));
    const char *msg = json_string_value(json_object_get(item, "status_msg"));
    json_t *ago = json_object_get(item, "last_active_ago");
    const char *colon = user ? strchr(user, ':') : NULL;
    if (!colon || !rooms_user_id_ok(user) || strcmp(colon + 1, origin) != 0 || !state_ok(state) ||
        (msg && strlen(msg) > PRESENCE_STATUS_MSG_MAX_BYTES))
        return false;
    const char *p[1] = {user};
    PGresult *res = rooms_q(c, "SELECT 1 FROM current_state WHERE type = 'm.room.member'"
                               " AND state_key = $1 AND membership = 'join' LIMIT 1", 1, p, NULL);
    bool known = res && PQntuples(res) == 1;
    PQclear(res);
    if (!known) return false;
    int64_t last = now - (json_is_integer(ago) && json_integer_value(ago) > 0 ? json_integer_value(ago) : 0);
    return store_change(c, user, state, msg, false, last) == 0;
}

static void on_presence(void *ctx, const char *origin, const json_t *content)
{
    (void)ctx;
    if (!enabled()) return;
    json_t *push = json_object_get(content, "push");
    if (!json_is_array(push)) return;
    PGconn *c = db_acquire(db_global(), PRESENCE_EDU_DB_WAIT_MS);
    if (!c) return;
    int64_t now = rooms_wall_ms();
    size_t ignored = 0;
    for (size_t i = 0; i < json_array_size(push) && i < PRESENCE_MAX_EDU_PUSH; i++)
        if (!store_remote(c, origin, json_array_get(push, i), now)) ignored++;
    db_release(db_global(), c);
    if (ignored)
        rt_log(ATRIUM_LOG_INFO, "core", "m.presence from %s: %zu user(s) ignored (not its users "
               "joined to a room here, or not a valid state)", origin, ignored);
}

static int presence_init(core_runtime *rt)
{
    http_server *s = rt->http;
    if (client_route(s, "GET", "/_matrix/client/v3/presence/{userId}/status", get_status, 0) < 0 ||
        client_route(s, "PUT", "/_matrix/client/v3/presence/{userId}/status", put_status,
                     PRESENCE_BODY_MAX_BYTES) < 0)
        return -1;
    if (fed_txn_on_edu("m.presence", on_presence, NULL) < 0) {
        rt_log(ATRIUM_LOG_ERROR, "core", "cannot register the m.presence EDU handler");
        return -1;
    }
    return sync_add_section("presence", sync_presence) < 0 ? -1 : 0;
}

const client_module PRESENCE_MODULE = {
    .owner = "presence",
    .migrations = MIGRATIONS,
    .n_migrations = sizeof(MIGRATIONS) / sizeof(MIGRATIONS[0]),
    .init = presence_init,
};
