/*
 * core/client/sync/ssync.c - POST /_matrix/client/unstable/org.matrix.simplified_msc3575/sync,
 * Simplified Sliding Sync (MSC4186, in the shape Synapse serves and Element X sends).
 *
 * One run: read the request (ssync_request.c), load the connection's position
 * (ssync_conn.c), read `upto` once (stream_upto(), as /sync does, so every part of the
 * answer describes the window (previous position, upto]), order and filter the user's
 * rooms (ssync_lists.c), build the result of each picked room that is new to the
 * connection or changed since it was sent (ssync_room.c), then the extensions
 * (ssync_ext.c). An answer with news is stored as a new position before it is sent
 * (nothing acknowledged before durable); an answer with none keeps the client's pos.
 *
 * The long-poll is /sync's (sync.c): when a request with a pos finds nothing new and its
 * timeout has not passed, it releases its database connection and parks on its user's
 * notifier event (no thread held); a wake-up from any process (notifier.h) or the deadline
 * runs it again from the top. A wake-up for something outside the request (a room in no
 * list) finds nothing and parks again, so the request answers at its timeout. The wake
 * counter read before the queries and after parking closes the lost-wake-up gap.
 * What it does not do: presence, the lists' `ops`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/auth/auth.h"
#include "core/client/client.h"
#include "core/client/presence/presence.h"
#include "core/client/push/push_eval.h"
#include "core/client/ratelimits.h"
#include "core/client/sync/notifier.h"
#include "core/client/sync/ssync.h"
#include "core/client/sync/sync.h"
#include "core/config/config.h"

#define SSYNC_PATH "/_matrix/client/unstable/org.matrix.simplified_msc3575/sync"
#define SSYNC_FEATURE "org.matrix.simplified_msc3575"
#define SSYNC_USER_ID_MAX 256
#define SSYNC_TOKEN_MAX 24

typedef struct ssync_run_state {
    int64_t deadline_ms; /* monotonic; 0 = answer at once */
} ssync_run_state;

/* What one run computed. */
typedef struct ssync_answer {
    json_t *lists, *rooms, *extensions; /* the response's parts */
    json_t *sent;   /* the connection's room map after this answer */
    json_t *counts; /* {list: count} */
    bool has_new;
} ssync_answer;

static void answer_free(ssync_answer *a)
{
    json_decref(a->lists);
    json_decref(a->rooms);
    json_decref(a->extensions);
    json_decref(a->sent);
    json_decref(a->counts);
}

/* The rooms map carried forward: only rooms the lists may still hold (others were left
 * before the previous position and are of no further use). */
static json_t *carried_map(const json_t *prev_rooms, const ssync_rooms *rs)
{
    json_t *map = json_object();
    for (int i = 0; i < rs->n; i++) {
        json_t *sent = json_object_get(prev_rooms, rs->rows[i].room_id);
        if (sent) json_object_set(map, rs->rows[i].room_id, sent);
    }
    return map;
}

/* The picked rooms the connection already sent, as the same membership, with no event
 * after they were sent: nothing of theirs can have changed, so they are not read (one
 * query instead of a room's worth of reads each, which is what keeps a wake-up cheap on
 * a large account). {room_id: true} into *quiet. */
static int quiet_rooms(sync_ctx *s, const ssync_rooms *rs, const json_t *picked, const ssync_pos *prev,
                       json_t **quiet)
{
    *quiet = json_object();
    json_t *ids = json_array();
    char *since = rt_arena_alloc(s->r->arena, json_object_size(picked) * 21 + 3);
    if (!since) {
        json_decref(ids);
        return ROOMS_E_DB;
    }
    size_t used = 0;
    since[used++] = '{';
    const char *room_id;
    json_t *pick;
    json_object_foreach((json_t *)picked, room_id, pick)
    {
        const ssync_room_row *row = &rs->rows[json_integer_value(json_object_get(pick, "i"))];
        json_t *sent = json_object_get(prev->rooms, room_id);
        const char *sent_m = json_string_value(json_array_get(sent, 1));
        if (!sent_m || strcmp(sent_m, row->membership) != 0 || ssync_room_expanded(pick, sent) ||
            ssync_room_state_changed(pick, sent))
            continue;
        used += (size_t)sprintf(since + used, "%s%lld", json_array_size(ids) ? "," : "",
                                (long long)json_integer_value(json_array_get(sent, 0)));
        json_array_append_new(ids, json_string(room_id));
        json_object_set_new(*quiet, room_id, json_true());
    }
    since[used++] = '}';
    since[used] = '\0';
    if (json_array_size(ids) == 0) {
        json_decref(ids);
        return ROOMS_OK;
    }
    const char *p[3] = {rooms_pg_array(s->r->arena, ids), since, crooms_i64(s->r, s->upto)};
    json_decref(ids);
    PGresult *res = rooms_q(s->c,
                            "SELECT r.id FROM unnest($1::text[], $2::bigint[]) AS r(id, since)"
                            " WHERE EXISTS (SELECT 1 FROM events e WHERE e.room_id = r.id"
                            "  AND e.stream_pos > r.since AND e.stream_pos <= $3::bigint)",
                            3, p, NULL);
    if (!res) return ROOMS_E_DB;
    for (int i = 0; i < PQntuples(res); i++) json_object_del(*quiet, PQgetvalue(res, i, 0));
    PQclear(res);
    return ROOMS_OK;
}

/* The picked rooms' results, and the map updated for what they send. Joined rooms new to
 * the connection are taken kept where nothing of theirs changed (ssync_hits.c); what the
 * others read besides timelines and required_state is read for all of them at once
 * (ssync_facts.c). */
static int rooms_part(sync_ctx *s, const ssync_rooms *rs, const json_t *picked, const ssync_pos *prev,
                      ssync_answer *a)
{
    json_t *quiet;
    if (quiet_rooms(s, rs, picked, prev, &quiet) < 0) {
        json_decref(quiet);
        return ROOMS_E_DB;
    }
    json_t *ids = json_array();
    const char *room_id;
    json_t *pick;
    json_object_foreach((json_t *)picked, room_id, pick)
    {
        if (!json_object_get(quiet, room_id)) json_array_append_new(ids, json_string(room_id));
    }
    json_decref(quiet);
    ssync_hits hits;
    if (ssync_hits_take(s, rs, picked, prev, ids, a->rooms, a->sent, &hits) < 0) {
        ssync_hits_free(&hits);
        json_decref(ids);
        return ROOMS_E_DB;
    }
    size_t n = json_array_size(ids);
    ssync_facts *facts = calloc(n ? n : 1, sizeof(*facts));
    ssync_plan *plans = calloc(n ? n : 1, sizeof(*plans));
    ssync_facts_read fr = {0};
    int rc = facts && plans ? ssync_facts_start(s, ids, facts, &fr) : ROOMS_E_DB;
    for (size_t i = 0; rc >= 0 && i < n; i++) {
        room_id = json_string_value(json_array_get(ids, i));
        pick = json_object_get(picked, room_id);
        ssync_room_plan(&rs->rows[json_integer_value(json_object_get(pick, "i"))], &facts[i], pick,
                        json_object_get(prev->rooms, room_id), prev->stream_pos, &plans[i]);
    }
    if (rc >= 0) rc = ssync_reads_load(s, plans, n);
    int frc = ssync_facts_finish(s, ids, facts, &fr, rc >= 0);
    if (rc >= 0) rc = frc;
    for (size_t i = 0; rc >= 0 && i < n; i++) {
        room_id = json_string_value(json_array_get(ids, i));
        pick = json_object_get(picked, room_id);
        const ssync_room_row *row = &rs->rows[json_integer_value(json_object_get(pick, "i"))];
        const json_t *sent = json_object_get(prev->rooms, room_id);
        json_t *out;
        rc = ssync_room_result(s, row, &facts[i], pick, sent, &plans[i], &out);
        if (rc < 0 || !out) continue;
        ssync_hits_keep(&hits, room_id, out, &plans[i]);
        json_int_t limit = ssync_room_sent_limit(pick, sent, out);
        json_object_set_new(a->rooms, room_id, out);
        json_object_set_new(a->sent, room_id, json_pack("[I, s, I, O]", (json_int_t)s->upto, row->membership,
                                                        limit, json_object_get(pick, "rsk")));
    }
    if (facts) ssync_facts_free(facts, n);
    ssync_hits_free(&hits);
    ssync_plans_free(plans, n);
    free(plans);
    free(facts);
    json_decref(ids);
    return rc < 0 ? ROOMS_E_DB : ROOMS_OK;
}

/* Build the whole answer for (prev, upto]. ROOMS_OK or ROOMS_E_DB. */
static int build_answer(sync_ctx *s, const ssync_request *q, const ssync_pos *prev, ssync_answer *a)
{
    *a = (ssync_answer){json_object(), json_object(), json_object(), NULL, json_object(), false};
    ssync_rooms rs;
    /* Timelines leave out what ignored users sent, as /sync's do (sync_rooms.c): the
     * list is read with the lists' account data (ssync_rooms_load). */
    /* A new connection's rooms are all new to it: their stamps come with the list. */
    bool want_stamps = !q->pos && ssync_cache_global();
    if (ssync_rooms_load(s, q, prev->stream_pos, prev->rooms, prev->account_data, want_stamps, &rs) < 0)
        return ROOMS_E_DB;
    json_t *picked = json_object();
    a->sent = carried_map(prev->rooms, &rs);
    int rc = ssync_lists_apply(s, q, &rs, a->counts, picked);
    ssync_subs_apply(q, &rs, picked);
    const char *room_id;
    json_t *pick;
    json_object_foreach(picked, room_id, pick)
    {
        json_object_set_new(pick, "rsk", json_string(ssync_required_state_key(s->r, json_object_get(pick, "rs"))));
    }
    if (rc >= 0) rc = rooms_part(s, &rs, picked, prev, a);
    push_program_free(s->push_rules);
    s->push_rules = NULL;
    if (rc >= 0) rc = ssync_extensions(s, q, picked, prev->stream_pos, a->extensions, &a->has_new);
    json_decref(picked);
    ssync_rooms_free(&rs);
    const char *list_name;
    json_t *count;
    json_object_foreach(a->counts, list_name, count)
    {
        json_object_set_new(a->lists, list_name, json_pack("{s:O}", "count", count));
    }
    if (json_object_size(a->rooms) > 0 || !prev->counts || !json_equal(a->counts, prev->counts))
        a->has_new = true;
    return rc;
}

/* Store the answer as the connection's next position (a new connection without pos).
 * 1 stored (token set), 0 the connection is gone, -1 database. */
static int store_answer(sync_ctx *s, const ssync_request *q, ssync_pos *prev, const ssync_answer *a,
                        char *token, size_t len)
{
    ssync_conn_new fresh = {s->user, s->device, q->conn_id};
    if (ssync_conn_save(s->c, q->pos ? NULL : &fresh, prev->conn_key, s->upto, a->sent, a->counts, prev->plan_mode,
                        token, len) < 0)
        return q->pos ? 0 : -1;
    return 1;
}

static int respond(atrium_req *r, const ssync_request *q, const char *token, ssync_answer *a)
{
    json_t *body = json_pack("{s:s, s:O, s:O, s:O}", "pos", token, "lists", a->lists, "rooms", a->rooms,
                             "extensions", a->extensions);
    if (q->txn_id) json_object_set(body, "txn_id", (json_t *)q->txn_id);
    answer_free(a);
    return http_respond_json(r, 200, body);
}

/* The first part of a run: parameters, and the state kept across its re-runs. NULL
 * after answering. */
static ssync_run_state *run_state(atrium_req *r, const ssync_request *q)
{
    if (!presence_sync_value_ok(http_req_query(r, "set_presence"))) {
        http_respond_error(r, 400, "M_INVALID_PARAM", "'set_presence' must be online, unavailable or offline");
        return NULL;
    }
    ssync_run_state *st = r->core_state;
    if (!st) {
        if (!(st = rt_arena_alloc(r->arena, sizeof(*st)))) {
            http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
            return NULL;
        }
        st->deadline_ms = q->pos && q->timeout_ms ? rt_now_ms() + q->timeout_ms : 0;
        r->core_state = st;
    }
    return st;
}

/* The connection's previous position into prev. false after answering (400
 * M_UNKNOWN_POS, 503). */
static bool load_pos(atrium_req *r, sync_ctx *s, const ssync_request *q, ssync_pos *prev)
{
    *prev = (ssync_pos){0};
    if (!q->pos) return true;
    int rc = ssync_conn_load(s->c, s->user, s->device, q->conn_id, q->pos, prev);
    if (rc < 0) http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    else if (rc == 0) http_respond_error(r, 400, "M_UNKNOWN_POS", "Unknown or expired pos: start a new connection");
    return rc > 0;
}

/* The run's statements with generic plans (docs/adr/0034-sliding-sync-reads-whole-window.md,
 * "Generic plans"): the window queries take their rooms as arrays, so every custom plan
 * looks cheaper to PostgreSQL than the generic one (which assumes 100 rooms) and it never
 * stops planning them again: 6.5 ms to plan the timelines of one room on each wake-up,
 * against 0.3 ms to run them. Session-wide for this connection, so set back before it goes
 * back to the pool (a failure of either only costs the planning it would save). Neither
 * takes a round trip of its own on a run that stores an answer: the run's first statement
 * sets them (this one for a new connection, ssync_conn_load's with a pos) and the one that
 * stores the answer sets the connection's own mode back (ssync_conn_save); only a run that
 * stores nothing (it parks, answers with nothing new or fails) sets it back in checkin.
 * prev->plan_mode: the mode to set back. The first statement of a new connection also
 * reads the account data the lists need (prev->account_data, as ssync_conn_load does). */
static int64_t upto_and_generic_plans(sync_ctx *s, ssync_pos *prev)
{
    const char *p[1] = {s->user};
    PGresult *res = rooms_q(s->c,
                            "SELECT stream_upto(), gp.plan_mode, " SYNC_PLAN_MODE_SET ", "
                            SSYNC_ACCOUNT_DATA_SQL("$1") " FROM " SYNC_PLAN_MODE_FROM,
                            1, p, NULL);
    if (!res) return -1;
    int64_t upto = atoll(PQgetvalue(res, 0, 0));
    snprintf(prev->plan_mode, sizeof(prev->plan_mode), "%s", PQgetvalue(res, 0, 1));
    prev->account_data = strdup(PQgetvalue(res, 0, 3));
    PQclear(res);
    return prev->account_data ? upto : -1;
}

static void checkin(PGconn *c, ssync_pos *prev)
{
    sync_plan_mode_restore(c, prev->plan_mode);
    http_db_checkin(c);
}

static int ssync_post(atrium_req *r)
{
    if (sync_woken_handoff(r) == ATRIUM_HANDED_OFF) return ATRIUM_HANDED_OFF;
    const char *user = auth_request(r);
    if (!user) return ATRIUM_DONE;
    if (ratelimit_refused(r, ratelimit_sync())) return ATRIUM_DONE; /* counted once per request */
    ssync_request q;
    if (!ssync_request_parse(r, &q)) return ATRIUM_DONE;
    ssync_run_state *st = run_state(r, &q);
    if (!st) return ATRIUM_DONE;
    if (r->run_reason == ATRIUM_RUN_SHUTDOWN && !q.pos) /* only a parked request has this reason */
        return http_respond_error(r, 503, "M_UNKNOWN", "The server is stopping; retry");
    if (r->run_reason == ATRIUM_RUN_SHUTDOWN) /* parked, with a pos: nothing new */
        return http_respond_json(r, 200, json_pack("{s:s, s:{}, s:{}, s:{}}", "pos", q.pos, "lists", "rooms",
                                                    "extensions"));
    struct atrium_event *ev = notifier_event_for(r->srv, user);
    uint64_t wakes_before = notifier_wake_count(user);
    sync_ctx s = {.r = r, .user = user, .device = r->device};
    s.view = (events_view){.user_id = user, .device_id = r->device, .now_ms = rooms_wall_ms()};
    char why[64];
    if (!rooms_filter_parse(r->arena, NULL, &s.timeline, why, sizeof(why)))
        return http_respond_error(r, 500, "M_UNKNOWN", "%s", why);
    if (!(s.c = http_db_checkout(r))) return ATRIUM_DONE;
    if (r->run_reason == ATRIUM_RUN_FIRST &&
        presence_sync_mark(s.c, user, http_req_query(r, "set_presence")) < 0)
        rt_log(ATRIUM_LOG_WARN, "core", "[req %s] could not record %s's presence", r->id, user);
    ssync_pos prev;
    if (!load_pos(r, &s, &q, &prev)) {
        checkin(s.c, &prev);
        return ATRIUM_DONE;
    }
    s.upto = q.pos ? prev.upto : upto_and_generic_plans(&s, &prev); /* with pos: read with it */
    if (s.upto < prev.stream_pos) s.upto = prev.stream_pos;
    ssync_answer a = {0};
    int rc = s.upto < 0 ? ROOMS_E_DB : build_answer(&s, &q, &prev, &a);
    bool may_wait = r->run_reason != ATRIUM_RUN_DEADLINE && st->deadline_ms > rt_now_ms();
    char token[SSYNC_TOKEN_MAX];
    snprintf(token, sizeof(token), "%lld", (long long)prev.pos); /* the client's, when nothing is new */
    if (rc >= 0 && !a.has_new && q.pos && may_wait && ev) {
        checkin(s.c, &prev);
        ssync_pos_clear(&prev);
        answer_free(&a);
        char who[SSYNC_USER_ID_MAX];
        snprintf(who, sizeof(who), "%s", user); /* r may be gone once parked */
        if (susp_park(r, ev, st->deadline_ms) == 0) {
            if (notifier_wake_count(who) != wakes_before) notifier_wake_local(who);
            return ATRIUM_PARKED;
        }
        return http_respond_error(r, 503, "M_UNKNOWN", "Could not wait; retry");
    }
    int stored = rc < 0 || (!a.has_new && q.pos) ? 1 : store_answer(&s, &q, &prev, &a, token, sizeof(token));
    checkin(s.c, &prev);
    ssync_pos_clear(&prev);
    if (rc < 0 || stored < 0) {
        answer_free(&a);
        return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    }
    if (stored == 0) {
        answer_free(&a);
        return http_respond_error(r, 400, "M_UNKNOWN_POS", "The connection was replaced or expired");
    }
    return respond(r, &q, token, &a);
}

/* The body of the trigger function keeping sliding_sync_rooms (migrations 4 and 5): a
 * local user's membership row replaces the older one of the same room. */
#define MEMBERSHIP_ROW_SQL                                                                     \
    " IF NOT EXISTS (SELECT 1 FROM users WHERE user_id = NEW.user_id) THEN RETURN NULL; END IF;" \
    " INSERT INTO sliding_sync_rooms AS r (user_id, room_id, membership, membership_pos, event_id, sender," \
    "  forgotten)"                                                                              \
    " VALUES (NEW.user_id, NEW.room_id, NEW.membership, NEW.stream_pos, NEW.event_id, NEW.sender, NEW.forgotten)" \
    " ON CONFLICT (user_id, room_id) DO UPDATE SET membership = EXCLUDED.membership,"            \
    "  membership_pos = EXCLUDED.membership_pos, event_id = EXCLUDED.event_id, sender = EXCLUDED.sender," \
    "  forgotten = EXCLUDED.forgotten"                                                          \
    "  WHERE r.membership_pos <= EXCLUDED.membership_pos;"

const atrium_migration SSYNC_MIGRATIONS[SSYNC_N_MIGRATIONS] = {
    {1, "sliding_sync_connections",
     /* docs/adr/0010-sliding-sync-connection-state.md */
     "CREATE TABLE sliding_sync_connections ("
     " conn_key bigserial PRIMARY KEY,"
     " user_id text NOT NULL,"
     " device_id text NOT NULL,"
     " conn_id text NOT NULL,"
     " last_used_ms bigint NOT NULL,"
     " UNIQUE (user_id, device_id, conn_id),"
     " FOREIGN KEY (user_id, device_id) REFERENCES devices (user_id, device_id) ON DELETE CASCADE);"
     "CREATE TABLE sliding_sync_positions ("
     " pos bigserial PRIMARY KEY,"
     " conn_key bigint NOT NULL REFERENCES sliding_sync_connections ON DELETE CASCADE,"
     " stream_pos bigint NOT NULL,"
     " rooms jsonb NOT NULL,"
     " counts jsonb NOT NULL);"
     "CREATE INDEX sliding_sync_positions_conn ON sliding_sync_positions (conn_key, pos);"},
    {2, "sliding_sync_bumps",
     /* Each room's bump_stamp kept as events arrive (ssync_lists.c orders by it): the
      * newest position of an event of a bump type (SSYNC_BUMP_TYPES_SQL). Sends into a
      * room are already serialized by its rooms row (rooms_tx.c), so the upsert adds no
      * waiting. */
     "CREATE TABLE sliding_sync_bumps (room_id text PRIMARY KEY, bump_stamp bigint NOT NULL);"
     "CREATE FUNCTION sliding_sync_bump() RETURNS trigger LANGUAGE plpgsql AS $f$ BEGIN"
     " INSERT INTO sliding_sync_bumps (room_id, bump_stamp) VALUES (NEW.room_id, NEW.stream_pos)"
     " ON CONFLICT (room_id) DO UPDATE SET bump_stamp = EXCLUDED.bump_stamp"
     "  WHERE sliding_sync_bumps.bump_stamp < EXCLUDED.bump_stamp;"
     " RETURN NULL; END $f$;"
     "CREATE TRIGGER sliding_sync_bump AFTER INSERT ON events FOR EACH ROW"
     " WHEN (NEW.type IN " SSYNC_BUMP_TYPES_SQL ") EXECUTE FUNCTION sliding_sync_bump();"
     "INSERT INTO sliding_sync_bumps (room_id, bump_stamp) SELECT room_id, max(stream_pos) FROM events"
     " WHERE type IN " SSYNC_BUMP_TYPES_SQL " GROUP BY room_id;"},
    {3, "sliding_sync_start",
     /* A connection started in one round trip (ssync_conn.c, ssync_conn_start): the one of
      * that name replaced (its positions go with it), then the device's connections past
      * max_conns (least recently used first) or unused since idle_before dropped. */
     "CREATE FUNCTION sliding_sync_start(u text, d text, cid text, now_ms bigint, idle_before bigint,"
     " max_conns bigint, OUT new_key bigint, OUT dropped bigint) LANGUAGE plpgsql AS $f$ BEGIN"
     " DELETE FROM sliding_sync_connections WHERE user_id = u AND device_id = d AND conn_id = cid;"
     " INSERT INTO sliding_sync_connections (user_id, device_id, conn_id, last_used_ms)"
     "  VALUES (u, d, cid, now_ms) RETURNING conn_key INTO new_key;"
     " DELETE FROM sliding_sync_connections WHERE conn_key IN ("
     "  SELECT conn_key FROM sliding_sync_connections WHERE user_id = u AND device_id = d"
     "  ORDER BY last_used_ms DESC, conn_key DESC OFFSET max_conns)"
     "  OR (user_id = u AND device_id = d AND last_used_ms < idle_before);"
     " GET DIAGNOSTICS dropped = ROW_COUNT; END $f$;"},
    {4, "sliding_sync_rooms",
     /* Each local user's newest membership per room (users with a row in users;
      * memberships holds remote members too), one row per (user, room): the lists read
      * the user's rows by the primary key and join each to its room's bump_stamp in
      * sliding_sync_bumps (ssync_lists.c, TOP_SQL), instead of reading every membership
      * of the history, which a generic plan did by walking the whole table
      * (docs/adr/0038-sliding-sync-rooms-in-activity-order.md). Kept by a trigger on
      * memberships only (a newer row replaces the older; `forgotten` follows): a
      * message writes nothing here, so a send stays one upsert of sliding_sync_bumps
      * whatever the number of members. */
     "CREATE TABLE sliding_sync_rooms ("
     " user_id text NOT NULL,"
     " room_id text NOT NULL,"
     " membership text NOT NULL,"
     " membership_pos bigint NOT NULL,"
     " event_id text NOT NULL,"
     " sender text NOT NULL,"
     " forgotten boolean NOT NULL,"
     " PRIMARY KEY (user_id, room_id));"
     "CREATE FUNCTION sliding_sync_membership() RETURNS trigger LANGUAGE plpgsql AS $f$ BEGIN"
     MEMBERSHIP_ROW_SQL
     " RETURN NULL; END $f$;"
     "CREATE TRIGGER sliding_sync_membership AFTER INSERT OR UPDATE OF forgotten ON memberships"
     " FOR EACH ROW EXECUTE FUNCTION sliding_sync_membership();"
     "INSERT INTO sliding_sync_rooms SELECT m.user_id, m.room_id, m.membership, m.stream_pos, m.event_id,"
     " m.sender, m.forgotten"
     " FROM (SELECT DISTINCT ON (user_id, room_id) * FROM memberships ORDER BY user_id, room_id, stream_pos DESC) m"
     " JOIN users u ON u.user_id = m.user_id;"},
    {5, "sliding_sync_recent_first",
     /* The lists' short way (ssync_lists.c, RECENT_SQL): a user's newest rooms found by
      * walking sliding_sync_bumps newest first, which needs the index on bump_stamp and
      * a row there for every room a local user is joined to (a room joined over
      * federation may have no event of a bump type stored: its row starts at the first
      * local join, the bump such a joiner had anyway). Every run also reads all of the
      * user's rows for the count, and one user's rows lie spread over the table in the
      * order the memberships came: with the columns the lists read in the primary key,
      * an index-only scan reads them from the key's pages (the table changes only with
      * memberships, so a vacuum leaves its pages all-visible).
      * docs/adr/0043-sliding-sync-lists-newest-first.md */
     "CREATE INDEX sliding_sync_bumps_stamp ON sliding_sync_bumps (bump_stamp);"
     "ALTER TABLE sliding_sync_rooms DROP CONSTRAINT sliding_sync_rooms_pkey,"
     " ADD PRIMARY KEY (user_id, room_id)"
     "  INCLUDE (membership, membership_pos, event_id, sender, forgotten);"
     "CREATE OR REPLACE FUNCTION sliding_sync_membership() RETURNS trigger LANGUAGE plpgsql AS $f$ BEGIN"
     MEMBERSHIP_ROW_SQL
     " IF NEW.membership = 'join' THEN INSERT INTO sliding_sync_bumps (room_id, bump_stamp)"
     "  VALUES (NEW.room_id, NEW.stream_pos) ON CONFLICT (room_id) DO NOTHING; END IF;"
     " RETURN NULL; END $f$;"
     "INSERT INTO sliding_sync_bumps (room_id, bump_stamp) SELECT room_id, min(membership_pos)"
     " FROM sliding_sync_rooms WHERE membership = 'join' GROUP BY room_id ON CONFLICT (room_id) DO NOTHING;"},
};

int ssync_init(core_runtime *rt)
{
    ssync_conn_metrics(rt->metrics);
    ssync_lists_metrics(rt->metrics);
    ssync_facts_metrics(rt->metrics);
    /* sliding_sync.cache_mb: the process's kept first results (ssync_cache.c), made once. */
    size_t budget = (size_t)rt->cfg->sliding_sync.cache_mb * 1024 * 1024;
    if (budget > 0 && !ssync_cache_global()) {
        ssync_cache *cache = ssync_cache_new(rt->metrics, budget);
        if (!cache) return -1;
        ssync_cache_set_global(cache);
    }
    if (client_route(rt->http, "POST", SSYNC_PATH, ssync_post, 0) < 0) return -1;
    return http_unstable_feature_add(SSYNC_FEATURE);
}
