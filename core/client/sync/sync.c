/*
 * core/client/sync/sync.c - GET /_matrix/client/v3/sync (see sync.h): parameters and filters,
 * the window of a run, global account data, the sections other modules add, and the
 * long-poll that parks.
 *
 * The long-poll rule lives in sync_get alone: a run computes the answer for (since, upto]
 * with one database connection held for its queries only; when nothing is new and the
 * client's timeout has not passed, the connection is released and the request parks on its
 * user's notifier event, holding no thread. A wake-up or the deadline runs the handler
 * again from the top; the deadline run answers whatever it finds (usually nothing) with a
 * next_batch at least as new as `since`. The wake-up counter read before the queries and
 * again right after parking closes the gap in which a wake-up could otherwise be lost. A
 * re-run is not counted again by the rate limiter (http_req_ratelimit's rule).
 * The deprecated /initialSync, /rooms/{roomId}/initialSync and /events are modes of the same
 * handler (sync_serve): the first two a sync from nothing with `limit` messages per room,
 * /events a sync from its `from` (or from now) that parks the same way; sync_legacy.c
 * gives each its shape. /events?room_id= reads that room only, and a user not joined to it
 * peeks (sync_peek.c, docs/adr/0020-legacy-sync-follows-synapse.md). What it does not do: assemble rooms (sync_rooms.c), render events
 * (events_store.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/auth/auth.h"
#include "core/client/presence/presence.h"
#include "core/client/ratelimits.h"
#include "core/client/sync/notifier.h"
#include "core/client/sync/ssync.h"
#include "core/client/sync/sync.h"
#include "core/client/sync/sync_legacy.h"
#include "core/client/sync/sync_rooms.h"
#include "core/rooms/rooms_tx.h"
#include "atrium/parse.h"

#define SYNC_MAX_TIMEOUT_MS (5 * 60 * 1000)
#define SYNC_RATE_MAX_KEYS 100000 /* users tracked by the sync limiter */
#define SECONDS_PER_MINUTE 60.0
#define SYNC_USER_ID_MAX 256

static sync_section_fn sections[SYNC_MAX_SECTIONS];
static const char *section_names[SYNC_MAX_SECTIONS];
static int n_sections;

int sync_add_section(const char *name, sync_section_fn fn)
{
    if (n_sections == SYNC_MAX_SECTIONS) {
        rt_log(ATRIUM_LOG_ERROR, "core", "too many sync sections (at most %d)", SYNC_MAX_SECTIONS);
        return ATRIUM_E_LIMIT;
    }
    section_names[n_sections] = name;
    sections[n_sections++] = fn;
    return 0;
}

int sync_sections_run(const char *name, PGconn *c, const char *user_id, const char *device_id,
                      int64_t since, int64_t upto, json_t *response)
{
    int news = 0;
    for (int i = 0; i < n_sections; i++) {
        if (strcmp(section_names[i], name) != 0) continue;
        int rc = sections[i](c, user_id, device_id, since, upto, response);
        if (rc < 0) return rc;
        if (rc > 0) news = 1;
    }
    return news;
}

/* The endpoints this handler serves: /sync, and the deprecated APIs computed the same way
 * and reshaped (sync_legacy.c). */
enum sync_mode { SYNC_MODE_SYNC = 0, SYNC_MODE_INITIAL, SYNC_MODE_ROOM_INITIAL, SYNC_MODE_EVENTS };

#define LEGACY_DEFAULT_LIMIT 10 /* initialSync's messages per room when no limit is given */

/* What survives the re-runs of one request. */
typedef struct sync_run_state {
    int64_t deadline_ms; /* monotonic; 0 = answer at once */
    int64_t since_now;   /* /events without `from`: the position of its first run, or 0 */
} sync_run_state;

/* ---- parameters --------------------------------------------------------------------- */

/* An EventFilter of the filter (filter_part[key]) into *out: NULL when absent, else the
 * object, its lists and limit checked. false with why. */
static bool event_filter(sync_ctx *s, const json_t *part, const char *key, const json_t **out,
                         char *why, size_t len)
{
    const json_t *f = json_object_get(part, key);
    room_filter checked;
    *out = NULL;
    if (!f || json_is_null(f)) return true;
    if (!rooms_filter_parse(s->r->arena, f, &checked, why, len)) return false;
    *out = f;
    return true;
}

/* The filter's parts into s: `room` (timeline, state, ephemeral, account_data, the room
 * lists) and the top-level `presence` and `account_data`. false with why. */
static bool apply_filter(sync_ctx *s, const json_t *filter, char *why, size_t len)
{
    json_t *room = json_object_get(filter, "room");
    if (room && !json_is_object(room)) {
        snprintf(why, len, "'room' must be an object");
        return false;
    }
    if (!event_filter(s, filter, "presence", &s->presence_filter, why, len) ||
        !event_filter(s, filter, "account_data", &s->account_data_filter, why, len) ||
        !event_filter(s, room, "ephemeral", &s->ephemeral_filter, why, len) ||
        !event_filter(s, room, "account_data", &s->room_account_data_filter, why, len))
        return false;
    json_t *tl = json_object_get(room, "timeline"), *state = json_object_get(room, "state");
    if (!rooms_filter_parse(s->r->arena, tl, &s->timeline, why, len)) return false;
    room_filter st;
    if (!rooms_filter_parse(s->r->arena, state, &st, why, len)) return false;
    s->lazy_members = st.lazy_load_members || s->timeline.lazy_load_members;
    s->state_filter = json_is_object(state) ? state : NULL;
    json_t *redundant = json_object_get(state, "include_redundant_members");
    if (redundant && !json_is_boolean(redundant)) {
        snprintf(why, len, "'include_redundant_members' must be true or false");
        return false;
    }
    s->redundant_members = json_is_true(redundant);
    json_t *format = json_object_get(filter, "event_format");
    if (format && (!json_is_string(format) ||
                   (strcmp(json_string_value(format), "client") != 0 &&
                    strcmp(json_string_value(format), "federation") != 0))) {
        snprintf(why, len, "'event_format' must be client or federation");
        return false;
    }
    /* The federation format names the room in every event. */
    s->view.with_room_id = format && strcmp(json_string_value(format), "federation") == 0;
    if (s->timeline.limit >= 0)
        s->timeline_limit = s->timeline.limit > SYNC_MAX_TIMELINE_LIMIT ? SYNC_MAX_TIMELINE_LIMIT
                                                                         : s->timeline.limit;
    json_t *inc = json_object_get(room, "include_leave");
    if (inc && !json_is_boolean(inc)) {
        snprintf(why, len, "'include_leave' must be true or false");
        return false;
    }
    s->include_leave = json_is_true(inc);
    json_t *only = json_object_get(room, "rooms"), *except = json_object_get(room, "not_rooms");
    if ((only && !json_is_array(only)) || (except && !json_is_array(except))) {
        snprintf(why, len, "'rooms' and 'not_rooms' must be lists");
        return false;
    }
    s->only_rooms = only;
    s->not_rooms = except;
    return true;
}

/* The filter parameter: inline JSON, or the ID of a filter the user stored. The parsed
 * filter is kept in *holder (json_decref it). false after answering. */
static bool load_filter(atrium_req *r, sync_ctx *s, json_t **holder)
{
    *holder = NULL;
    const char *f = http_req_query(r, "filter");
    if (!f || !*f) return true;
    if (f[0] == '{') {
        *holder = json_loads(f, 0, NULL);
        if (!json_is_object(*holder)) {
            json_decref(*holder);
            *holder = NULL;
            http_respond_error(r, 400, "M_BAD_JSON", "The filter is not a JSON object");
            return false;
        }
    } else {
        /* Filter IDs are what POST /filter handed out: non-negative int64s. */
        int64_t id;
        if (f[0] == '-' || atrium_parse_int64(f, 0, INT64_MAX, &id) != 0) {
            http_respond_error(r, 400, "M_INVALID_PARAM", "Unknown filter");
            return false;
        }
        const char *p[2] = {s->user, f};
        PGresult *res = rooms_q(s->c, "SELECT filter::text FROM filters WHERE user_id = $1 AND filter_id = $2",
                                2, p, NULL);
        if (!res) {
            http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
            return false;
        }
        if (PQntuples(res) == 1) *holder = json_loads(PQgetvalue(res, 0, 0), 0, NULL);
        PQclear(res);
        if (!*holder) {
            http_respond_error(r, 400, "M_INVALID_PARAM", "Unknown filter");
            return false;
        }
    }
    char why[128];
    if (!apply_filter(s, *holder, why, sizeof(why))) {
        json_decref(*holder);
        *holder = NULL;
        http_respond_error(r, 400, "M_BAD_JSON", "%s", why);
        return false;
    }
    return true;
}

/* since (/events: from), timeout, full_state (initialSync and /events: limit). false after
 * answering 400. */
static bool read_params(atrium_req *r, sync_ctx *s, int64_t *timeout_ms, int mode)
{
    const char *since = http_req_query(r, mode == SYNC_MODE_EVENTS ? "from" : "since");
    const char *timeout = http_req_query(r, "timeout");
    const char *full = http_req_query(r, "full_state");
    if (mode != SYNC_MODE_SYNC) {
        /* The legacy modes' `limit`: a non-negative integer (clamped), else 400, as Synapse
         * answers. /events checks it only: its chunk is every new event up to the sync
         * timeline bound, since a per-room limit would drop events behind its `end`. */
        const char *limit = http_req_query(r, "limit");
        int64_t n = LEGACY_DEFAULT_LIMIT;
        int rc = limit ? atrium_parse_int64(limit, 0, SYNC_MAX_TIMELINE_LIMIT, &n) : 0; /* clamped */
        if (rc == ATRIUM_E_INVAL || (rc == ATRIUM_E_LIMIT && n != SYNC_MAX_TIMELINE_LIMIT)) {
            http_respond_error(r, 400, "M_INVALID_PARAM", "'limit' must be a non-negative integer");
            return false;
        }
        if (mode != SYNC_MODE_EVENTS) {
            since = timeout = full = NULL; /* always from nothing, never waiting */
            s->timeline_limit = n;
        }
        /* Left rooms: /initialSync lists them when asked (archived=true); a room
         * initialSync answers a former member with the room up to the leave. */
        const char *archived = mode == SYNC_MODE_INITIAL ? http_req_query(r, "archived") : NULL;
        if (archived && strcmp(archived, "true") != 0 && strcmp(archived, "false") != 0) {
            http_respond_error(r, 400, "M_INVALID_PARAM", "'archived' must be true or false");
            return false;
        }
        s->include_leave = mode == SYNC_MODE_ROOM_INITIAL || (archived && strcmp(archived, "true") == 0);
    }
    if (since && (!crooms_parse_token(since, &s->since) || s->since < 0)) {
        http_respond_error(r, 400, "M_INVALID_PARAM", "'since' is not a token of this server");
        return false;
    }
    *timeout_ms = 0;
    if (timeout) {
        int64_t t;
        int rc = atrium_parse_int64(timeout, 0, SYNC_MAX_TIMEOUT_MS, &t); /* clamped */
        if (rc == ATRIUM_E_INVAL || (rc == ATRIUM_E_LIMIT && t != SYNC_MAX_TIMEOUT_MS)) {
            http_respond_error(r, 400, "M_INVALID_PARAM", "'timeout' must be a non-negative integer");
            return false;
        }
        *timeout_ms = t;
    }
    if (full && strcmp(full, "true") != 0 && strcmp(full, "false") != 0) {
        http_respond_error(r, 400, "M_INVALID_PARAM", "'full_state' must be true or false");
        return false;
    }
    s->full_state = full && strcmp(full, "true") == 0;
    if (!presence_sync_value_ok(http_req_query(r, "set_presence"))) {
        http_respond_error(r, 400, "M_INVALID_PARAM",
                           "'set_presence' must be online, unavailable or offline");
        return false;
    }
    return true;
}

/* ---- the response ------------------------------------------------------------------- */

/* The account data events of (since, upto], in the order they were written, in one
 * statement: the global ones into resp's account_data, the rooms' into
 * s->room_account_data ({room_id: [events]}, for sync_rooms). */
static int account_data(sync_ctx *s, json_t *resp, bool *has_new)
{
    const char *p[3] = {s->user, crooms_i64(s->r, s->since), crooms_i64(s->r, s->upto)};
    PGresult *res = rooms_q(s->c,
                            "SELECT room_id, type, content::text FROM account_data"
                            " WHERE user_id = $1 AND stream_pos > $2 AND stream_pos <= $3"
                            " ORDER BY stream_pos",
                            3, p, NULL);
    if (!res) return ROOMS_E_DB;
    json_t *events = json_array();
    s->room_account_data = json_object();
    for (int i = 0; i < PQntuples(res); i++) {
        const char *room = PQgetvalue(res, i, 0);
        json_t *content = json_loads(PQgetvalue(res, i, 2), 0, NULL);
        json_t *ev = json_pack("{s:s, s:o}", "type", PQgetvalue(res, i, 1), "content",
                               content ? content : json_object());
        json_t *list = room[0] ? json_object_get(s->room_account_data, room) : events;
        if (!list) json_object_set_new(s->room_account_data, room, list = json_array());
        json_array_append_new(list, ev);
    }
    PQclear(res);
    sync_filter_events(s->account_data_filter, events);
    if (json_array_size(events) > 0) *has_new = true;
    json_object_set_new(resp, "account_data", json_pack("{s:o}", "events", events));
    return ROOMS_OK;
}

/* The newest position whose writers have all committed (see core/rooms/rooms.h). */
int64_t sync_stream_upto(PGconn *c)
{
    PGresult *res = rooms_q(c, "SELECT stream_upto()", 0, NULL, NULL);
    if (!res) return -1;
    int64_t v = atoll(PQgetvalue(res, 0, 0));
    PQclear(res);
    return v;
}

/* sync_stream_upto, and generic plans for the rest of the run on s->c (plan_cache_mode
 * force_generic_plan, docs/adr/0039-sync-runs-use-generic-plans.md; prev gets the mode
 * before, for sync_plan_mode_restore), with the user's ignore list (rooms.h's rule) into
 * s->timeline.ignored in the same statement: once per run, so a change to the list shows
 * in the next sync. -1 when the database failed. */
static int64_t upto_and_ignored(sync_ctx *s, char prev[SYNC_PLAN_MODE_MAX])
{
    const char *p[1] = {s->user};
    PGresult *res = rooms_q(s->c,
                            "SELECT stream_upto(), gp.plan_mode, " SYNC_PLAN_MODE_SET ","
                            " (SELECT " ROOMS_IGNORED_USERS_SQL("a.content") " FROM account_data a"
                            "  WHERE a.user_id = $1 AND a.room_id = ''"
                            "  AND a.type = 'm.ignored_user_list')"
                            " FROM " SYNC_PLAN_MODE_FROM,
                            1, p, NULL);
    if (!res) return -1;
    int64_t upto = atoll(PQgetvalue(res, 0, 0));
    snprintf(prev, SYNC_PLAN_MODE_MAX, "%s", PQgetvalue(res, 0, 1));
    s->timeline.ignored = PQgetisnull(res, 0, 3) ? NULL : rt_arena_strdup(s->r->arena, PQgetvalue(res, 0, 3));
    bool oom = !PQgetisnull(res, 0, 3) && !s->timeline.ignored;
    PQclear(res);
    return oom ? -1 : upto; /* out of memory: no reading without the list */
}

void sync_plan_mode_restore(PGconn *c, char prev[SYNC_PLAN_MODE_MAX])
{
    if (!prev[0]) return;
    const char *p[1] = {prev};
    PQclear(rooms_q(c, "SELECT set_config('plan_cache_mode', $1, false)", 1, p, NULL));
    prev[0] = '\0';
}

/* After the presence filter emptied what the presence section reported: do the other
 * sections' parts still hold news (to-device messages, device list changes)? */
static bool sections_still_news(const json_t *resp)
{
    const json_t *lists = json_object_get(resp, "device_lists");
    return json_array_size(json_object_get(json_object_get(resp, "to_device"), "events")) > 0 ||
           json_array_size(json_object_get(lists, "changed")) > 0 ||
           json_array_size(json_object_get(lists, "left")) > 0;
}

/* Build the whole answer for (since, upto]. NULL on database failure. */
static json_t *build_response(sync_ctx *s, bool *has_new)
{
    *has_new = false;
    json_t *resp = json_object(), *rooms = json_object();
    json_object_set_new(resp, "rooms", rooms);
    bool failed = account_data(s, resp, has_new) < 0 || sync_rooms(s, rooms, has_new) < 0;
    json_decref(s->room_account_data);
    s->room_account_data = NULL;
    if (failed) {
        json_decref(resp);
        return NULL;
    }
    bool section_news = false;
    for (int i = 0; i < n_sections; i++) {
        int rc = sections[i](s->c, s->user, s->device, s->since, s->upto, resp);
        if (rc < 0) {
            rt_log(ATRIUM_LOG_ERROR, "core", "a sync section failed (%d)", rc);
            json_decref(resp);
            return NULL;
        }
        if (rc > 0) section_news = true;
    }
    /* The presence filter, and the rule it brings to waking: news the filter dropped are
     * no news, so a woken long-poll that finds only those parks again. */
    json_t *presence = json_object_get(json_object_get(resp, "presence"), "events");
    if (sync_filter_events(s->presence_filter, presence) > 0 && json_array_size(presence) == 0)
        section_news = sections_still_news(resp);
    if (section_news) *has_new = true;
    /* Keys every client expects, when no section filled them. */
    if (!json_object_get(resp, "to_device"))
        json_object_set_new(resp, "to_device", json_pack("{s:[]}", "events"));
    if (!json_object_get(resp, "device_lists"))
        json_object_set_new(resp, "device_lists", json_pack("{s:[], s:[]}", "changed", "left"));
    if (!json_object_get(resp, "device_one_time_keys_count"))
        json_object_set_new(resp, "device_one_time_keys_count", json_object());
    if (!json_object_get(resp, "presence"))
        json_object_set_new(resp, "presence", json_pack("{s:[]}", "events"));
    json_object_set_new(resp, "next_batch", json_string(crooms_token(s->r, s->upto)));
    return resp;
}

/* {room_id: true} for the rooms of resp listed in the room directory (none when no
 * directory is enabled): initialSync's `visibility`. NULL on database failure. */
static json_t *listed_rooms(PGconn *c, const json_t *resp)
{
    json_t *out = json_object();
    const atrium_directory *dir = crooms_directory();
    if (!dir || !ATRIUM_DIRECTORY_HAS(dir, room_listed)) return out;
    static const char *const kinds[] = {"join", "invite", "leave"};
    for (int k = 0; k < 3; k++) {
        const char *room_id;
        json_t *room;
        json_object_foreach(json_object_get(json_object_get(resp, "rooms"), kinds[k]), room_id, room)
        {
            int rc = dir->room_listed(c, room_id);
            if (rc < 0) {
                json_decref(out);
                return NULL;
            }
            if (rc == 1) json_object_set_new(out, room_id, json_true());
        }
    }
    return out;
}

/* The answer of a mode other than /sync, built from the sync response (consumed). A room
 * initialSync for a room the user is not in is a peek (crooms_peek_initial_sync: 403
 * unless the room is world_readable). listed: listed_rooms (consumed; NULL for /events). */
static int respond_legacy(atrium_req *r, int mode, json_t *resp, const sync_ctx *s, json_t *listed)
{
    int64_t since = s->since;
    legacy_view v = {.user = s->user, .listed = listed};
    json_t *out;
    if (mode == SYNC_MODE_INITIAL) {
        out = sync_legacy_initial(resp, &v);
    } else if (mode == SYNC_MODE_EVENTS) {
        out = sync_legacy_events(resp, crooms_token(r, since));
    } else {
        out = sync_legacy_room(resp, http_req_param(r, "roomId"), &v);
        if (!out) {
            json_decref(resp);
            json_decref(listed);
            return crooms_peek_initial_sync(r, s->user, s->upto, s->timeline_limit);
        }
    }
    json_decref(resp);
    json_decref(listed);
    if (!out) return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    return http_respond_json(r, 200, out);
}

/* Is s->user joined to room_id now? 1, 0, or ROOMS_E_DB. */
static int joined_to(sync_ctx *s, const char *room_id)
{
    const char *p[2] = {room_id, s->user};
    PGresult *res = rooms_q(s->c, "SELECT 1 FROM current_state WHERE room_id = $1"
                                  " AND type = 'm.room.member' AND state_key = $2"
                                  " AND membership = 'join'", 2, p, NULL);
    if (!res) return ROOMS_E_DB;
    int n = PQntuples(res);
    PQclear(res);
    return n > 0;
}

/* GET /_matrix/client/v3/sync, and the deprecated /initialSync,
 * /rooms/{roomId}/initialSync and /events (mode). */
static int sync_serve(atrium_req *r, int mode)
{
    if (sync_woken_handoff(r) == ATRIUM_HANDED_OFF) return ATRIUM_HANDED_OFF;
    const char *user = auth_request(r);
    if (!user) return ATRIUM_DONE;
    if (ratelimit_refused(r, ratelimit_sync())) return ATRIUM_DONE; /* counted once per request */
    sync_ctx s = {.r = r, .user = user, .device = r->device, .timeline_limit = SYNC_DEFAULT_TIMELINE_LIMIT};
    /* The legacy APIs name the room in every event. */
    s.view = (events_view){.user_id = user, .device_id = r->device, .now_ms = rooms_wall_ms(),
                           .with_room_id = mode != SYNC_MODE_SYNC};
    int64_t timeout_ms;
    if (!read_params(r, &s, &timeout_ms, mode)) return ATRIUM_DONE;
    if (r->run_reason == ATRIUM_RUN_SHUTDOWN) {
        /* The server is stopping: a parked sync answers "nothing new" at its own token
         * without touching the database, so thousands of them drain quickly. */
        return http_respond_json(r, 200, json_pack("{s:s, s:{s:{}, s:{}, s:{}, s:{}}}", "next_batch",
                                                    crooms_token(r, s.since), "rooms", "join", "invite",
                                                    "leave", "knock"));
    }
    sync_run_state *st = r->core_state;
    if (!st) {
        if (!(st = rt_arena_alloc(r->arena, sizeof(*st)))) return ATRIUM_E_NOMEM;
        st->deadline_ms = timeout_ms ? rt_now_ms() + timeout_ms : 0;
        r->core_state = st;
    }
    if (mode == SYNC_MODE_EVENTS && !http_req_query(r, "from")) {
        /* No `from`: events from now on (the first run's position, kept for re-runs). */
        if (!st->since_now) {
            PGconn *c = http_db_checkout(r);
            if (!c) return ATRIUM_DONE;
            st->since_now = sync_stream_upto(c);
            http_db_checkin(c);
            if (st->since_now < 0)
                return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
        }
        s.since = st->since_now;
    }
    /* The user's event exists from here on, so every later wake-up is counted. */
    struct atrium_event *ev = notifier_event_for(r->srv, user);
    uint64_t wakes_before = notifier_wake_count(user);

    if (!(s.c = http_db_checkout(r))) return ATRIUM_DONE;
    json_t *filter_holder = NULL, *only_room = NULL;
    const char *room_param = mode == SYNC_MODE_ROOM_INITIAL ? http_req_param(r, "roomId")
                             : mode == SYNC_MODE_EVENTS     ? http_req_query(r, "room_id")
                                                            : NULL;
    if (mode != SYNC_MODE_SYNC) {
        if (room_param) {
            only_room = json_pack("[s]", room_param);
            s.only_rooms = only_room;
        }
        if (mode == SYNC_MODE_EVENTS && room_param) {
            /* /events?room_id=: that room's events only; a user not joined to it peeks. */
            int joined = joined_to(&s, room_param);
            if (joined != 1) {
                http_db_checkin(s.c);
                json_decref(only_room);
                if (joined < 0) return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
                return sync_events_peek(r, user, room_param, s.since, st->deadline_ms);
            }
        }
    } else if (!load_filter(r, &s, &filter_holder)) {
        http_db_checkin(s.c);
        return ATRIUM_DONE;
    }
    /* The mark the sync leaves on the user's presence: once per request, before `upto` is
     * read so a change is in this very window. */
    if (r->run_reason == ATRIUM_RUN_FIRST &&
        presence_sync_mark(s.c, user, http_req_query(r, "set_presence")) < 0)
        rt_log(ATRIUM_LOG_WARN, "core", "[req %s] could not record %s's presence", r->id, user);
    /* Generic plans for the rest of the run (sync.h), set back before the connection goes. */
    char plan_mode[SYNC_PLAN_MODE_MAX] = "";
    s.upto = upto_and_ignored(&s, plan_mode);
    if (s.since > s.upto) s.since = s.upto; /* a token from a newer database: start there */
    bool has_new = false;
    json_t *resp = s.upto < 0 ? NULL : build_response(&s, &has_new);
    json_t *listed = NULL;
    if (resp && (mode == SYNC_MODE_INITIAL || mode == SYNC_MODE_ROOM_INITIAL) &&
        !(listed = listed_rooms(s.c, resp))) {
        json_decref(resp);
        resp = NULL;
    }
    sync_plan_mode_restore(s.c, plan_mode);
    http_db_checkin(s.c);
    json_decref(filter_holder);
    json_decref(only_room);
    if (!resp) return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");

    bool may_wait = r->run_reason != ATRIUM_RUN_DEADLINE && r->run_reason != ATRIUM_RUN_SHUTDOWN &&
                    st->deadline_ms > rt_now_ms();
    if (!has_new && s.since > 0 && may_wait && ev) {
        char who[SYNC_USER_ID_MAX];
        snprintf(who, sizeof(who), "%s", user); /* r may be gone once parked */
        if (susp_park(r, ev, st->deadline_ms) == 0) {
            json_decref(resp);
            json_decref(listed);
            if (notifier_wake_count(who) != wakes_before) notifier_wake_local(who);
            return ATRIUM_PARKED;
        }
    }
    if (mode != SYNC_MODE_SYNC) return respond_legacy(r, mode, resp, &s, listed);
    return http_respond_json(r, 200, resp);
}

int sync_woken_handoff(atrium_req *r)
{
    core_runtime *rt = core_runtime_get();
    rt_pool *pool = rt ? rt->sync_woken_pool : NULL;
    if (r->run_reason != ATRIUM_RUN_WOKEN || !pool) return 0;
    /* The handoff's deadline counts from now: the request's own was set when it arrived,
     * and a long-poll may have been parked for longer than that. */
    int64_t deadline = r->deadline_ms;
    r->deadline_ms = rt_now_ms() + rt->cfg->http.handoff_deadline_ms;
    if (susp_handoff(r, pool, NULL, 0) == 0) return ATRIUM_HANDED_OFF;
    r->deadline_ms = deadline;
    return 0;
}

static int sync_get(atrium_req *r) { return sync_serve(r, SYNC_MODE_SYNC); }
static int initial_sync_get(atrium_req *r) { return sync_serve(r, SYNC_MODE_INITIAL); }
static int room_initial_sync_get(atrium_req *r) { return sync_serve(r, SYNC_MODE_ROOM_INITIAL); }
static int events_get(atrium_req *r) { return sync_serve(r, SYNC_MODE_EVENTS); }

static int sync_start(core_runtime *rt)
{
    if (rt_pool_start(rt->sync_woken_pool) < 0) {
        rt_log(ATRIUM_LOG_ERROR, "core", "cannot start the pool of woken long-polls");
        return -1;
    }
    return 0;
}

static void sync_stop(core_runtime *rt)
{
    if (!rt->sync_woken_pool) return;
    rt_pool_stop(rt->sync_woken_pool); /* queued ones are answered 503 (suspend.c) */
    rt_pool_join(rt->sync_woken_pool);
    rt_pool_free(rt->sync_woken_pool);
    rt->sync_woken_pool = NULL;
}

static int sync_init(core_runtime *rt)
{
    /* server.http.woken_threads, _queue: two threads keep both CPUs of a small machine
     * busy with the runs and their backends; the queue holds a fan-out's woken runs. */
    rt->sync_woken_pool = rt_pool_new("core.sync_woken", rt->cfg->http.woken_threads,
                                      rt->cfg->http.woken_queue, rt->metrics);
    if (!rt->sync_woken_pool) return -1;
    /* ratelimit.sync.*: a re-run of a parked sync is not counted again. */
    const struct core_rate *rate = &rt->cfg->ratelimit.sync;
    rt->limits.sync = rt_ratelimit_new("sync", rate->per_minute / SECONDS_PER_MINUTE,
                                       rate->burst, SYNC_RATE_MAX_KEYS, rt->metrics);
    if (!rt->limits.sync) return -1;
    /* Wake-ups made by other processes sharing the database. */
    if (notifier_listen(rt->notifier, rt->notify) < 0) return -1;
    /* Wake-ups made by this process's room writes (core/rooms/rooms_tx.h). */
    rooms_tx_set_wake(notifier_wake_room, notifier_wake_user);
    if (client_route(rt->http, "GET", "/_matrix/client/v3/sync", sync_get, 0) < 0 ||
        client_route(rt->http, "GET", "/_matrix/client/v3/initialSync", initial_sync_get, 0) < 0 ||
        client_route(rt->http, "GET", "/_matrix/client/v3/rooms/{roomId}/initialSync",
                     room_initial_sync_get, 0) < 0 ||
        client_route(rt->http, "GET", "/_matrix/client/v3/events", events_get, 0) < 0)
        return -1;
    return ssync_init(rt); /* Simplified Sliding Sync, beside /sync (ssync.c) */
}

const client_module SYNC_MODULE = {
    .owner = "sync",
    .migrations = SSYNC_MIGRATIONS, /* sliding sync's connection state */
    .n_migrations = SSYNC_N_MIGRATIONS,
    .init = sync_init, /* the limiter is freed with the others (ratelimits_free) */
    .start = sync_start,
    .stop = sync_stop,
};
