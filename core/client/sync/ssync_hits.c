/*
 * core/client/sync/ssync_hits.c - a joined room's first result taken from the process's
 * store (ssync_cache.c) when nothing it was made from changed since, instead of reading it
 * again (docs/adr/0045-sliding-sync-keeps-first-results.md).
 *
 * Decisions owned here:
 *   - What is kept: the result of a joined room new to its connection (`initial`), for the
 *     user, device, timeline_limit and required_state pairs it was made for; without what
 *     the list row adds (membership, bump_stamp, is_dm, lists), which a hit takes from
 *     the run's own row.
 *   - When it is still right: at the same stamp, read for the window before anything of
 *     the room is read (so a stamp is never newer than what it stamps), with the list for
 *     a new connection's top rooms (ssync_lists.c, RECENT_SQL), else in one statement: the
 *     room's newest event up to the run's position and its oldest one (every event, state,
 *     redaction, relation, membership or backfill changes one of them; the member counts,
 *     names, heroes and visibility come from events), the user's newest receipt in the
 *     room (unread counts), the user's newest account data (push rules, the ignore list)
 *     and the newest erasure (what erased senders' events show).
 *   - What changes with time is set again on a hit: each event's unsigned.age, num_live
 *     (0: a hit is taken only on a first answer, or where the previous position is past
 *     the room's newest event), and a prev_batch made from the run's position (an empty
 *     timeline's).
 * What it does not do: keep results of rooms the connection sent already (incremental
 * results read only what changed, ssync.c's quiet rooms), or of invites and knocks.
 */
#include <stdlib.h>
#include <string.h>

#include "core/client/sync/ssync.h"

/* Per room of $1: its newest event up to $2 and oldest event, the newest receipt of $3 in
 * it, then $3's newest account data and the newest erasure (the same on every row). */
static const char STAMPS_SQL[] =
    "SELECT r.i, " SSYNC_ROOM_STAMP_SQL("r.id", "$2::bigint", "$3") ", " SSYNC_USER_STAMP_SQL("$3")
    " FROM unnest($1::text[]) WITH ORDINALITY AS r(id, i)";

/* The sorted, distinct [type, state_key] pairs as one string (the order and repeats of
 * a request's pairs do not change what they ask for), each part length-prefixed so no
 * two sets of pairs share a string. */
static int by_text(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static const char *pairs_key(atrium_req *r, const json_t *pairs)
{
    size_t n = json_array_size(pairs), len = 1;
    const char **each = rt_arena_alloc(r->arena, (n ? n : 1) * sizeof(*each));
    if (!each) return NULL;
    for (size_t i = 0; i < n; i++) {
        const json_t *p = json_array_get(pairs, i);
        const char *type = json_string_value(json_array_get(p, 0)), *key = json_string_value(json_array_get(p, 1));
        each[i] = type && key ? rt_arena_printf(r->arena, "%zu:%s%zu:%s", strlen(type), type, strlen(key), key) : NULL;
        if (!each[i]) return NULL;
        len += strlen(each[i]) + 1;
    }
    qsort(each, n, sizeof(*each), by_text); /* lists' pairs together can be thousands */
    char *out = rt_arena_alloc(r->arena, len), *at = out;
    if (!out) return NULL;
    for (size_t i = 0; i < n; i++) {
        if (i > 0 && strcmp(each[i], each[i - 1]) == 0) continue;
        size_t l = strlen(each[i]);
        memcpy(at, each[i], l);
        at += l;
        *at++ = ';';
    }
    *at = '\0';
    return out;
}

/* May this picked room be taken kept: joined, and new to the connection? */
static bool eligible(const ssync_room_row *row, const json_t *sent)
{
    const char *sent_m = json_string_value(json_array_get(sent, 1));
    return strcmp(row->membership, "join") == 0 && (!sent_m || strcmp(sent_m, "join") != 0);
}

static const ssync_room_row *row_of(const ssync_rooms *rs, const json_t *pick)
{
    return &rs->rows[json_integer_value(json_object_get(pick, "i"))];
}

/* Each event's age as events_render sets it, for now_ms. */
static void set_ages(json_t *events, int64_t now_ms)
{
    size_t i;
    json_t *ev;
    json_array_foreach(events, i, ev)
    {
        json_t *uns = json_object_get(ev, "unsigned");
        int64_t ts = json_integer_value(json_object_get(ev, "origin_server_ts"));
        if (json_is_object(uns)) json_object_set_new(uns, "age", json_integer(now_ms > ts ? now_ms - ts : 0));
    }
}

/* A kept result made whole for this run (ssync_room_result's shape for a joined room). */
static json_t *hit_result(sync_ctx *s, const ssync_room_row *row, const json_t *pick, json_t *room)
{
    json_object_set_new(room, "membership", json_string(row->membership));
    json_object_set_new(room, "bump_stamp", json_integer(row->bump_stamp));
    if (row->is_dm) json_object_set_new(room, "is_dm", json_true());
    json_object_set_new(room, "num_live", json_integer(0));
    if (!json_object_get(room, "prev_batch"))
        json_object_set_new(room, "prev_batch", json_string(crooms_token(s->r, s->upto)));
    set_ages(json_object_get(room, "timeline"), s->view.now_ms);
    set_ages(json_object_get(room, "required_state"), s->view.now_ms);
    json_t *lists = json_object_get(pick, "lists");
    if (json_array_size(lists) > 0) json_object_set(room, "lists", lists);
    return room;
}

/* The stamps of h's rooms not stamped with the list (one statement, none when all were).
 * ROOMS_OK or ROOMS_E_DB. */
static int read_stamps(sync_ctx *s, ssync_hits *h)
{
    json_t *ids = json_array(), *which = json_array();
    for (size_t i = 0; i < h->n; i++)
        if (!h->stamped[i]) {
            json_array_append_new(ids, json_string(h->room_id[i]));
            json_array_append_new(which, json_integer((json_int_t)i));
        }
    if (json_array_size(ids) == 0) {
        json_decref(ids);
        json_decref(which);
        return ROOMS_OK;
    }
    const char *p[3] = {rooms_pg_array(s->r->arena, ids), crooms_i64(s->r, s->upto), s->user};
    json_decref(ids);
    PGresult *res = rooms_q(s->c, STAMPS_SQL, 3, p, NULL);
    for (int row = 0; res && row < PQntuples(res); row++) {
        size_t k = (size_t)atoll(PQgetvalue(res, row, 0)) - 1, i;
        if (k >= json_array_size(which) || (i = (size_t)json_integer_value(json_array_get(which, k))) >= h->n)
            continue;
        h->stamp[i] = (ssync_stamp){atoll(PQgetvalue(res, row, 1)), atoll(PQgetvalue(res, row, 2)),
                                    atoll(PQgetvalue(res, row, 3)), atoll(PQgetvalue(res, row, 4)),
                                    atoll(PQgetvalue(res, row, 5))};
        h->stamped[i] = true;
    }
    json_decref(which);
    if (!res) return ROOMS_E_DB;
    PQclear(res);
    return ROOMS_OK;
}

int ssync_hits_take(sync_ctx *s, const ssync_rooms *rs, const json_t *picked, const ssync_pos *prev, json_t *ids,
                    json_t *rooms, json_t *sent, ssync_hits *h)
{
    *h = (ssync_hits){0};
    ssync_cache *cache = ssync_cache_global();
    size_t n = json_array_size(ids);
    if (!cache || n == 0) return ROOMS_OK;
    atrium_req *r = s->r;
    h->room_id = rt_arena_alloc(r->arena, n * sizeof(*h->room_id));
    h->key = rt_arena_alloc(r->arena, n * sizeof(*h->key));
    h->stamp = rt_arena_alloc(r->arena, n * sizeof(*h->stamp));
    h->stamped = rt_arena_alloc(r->arena, n * sizeof(*h->stamped));
    if (!h->room_id || !h->key || !h->stamp || !h->stamped) return ROOMS_E_DB;
    for (size_t i = 0; i < n; i++) {
        const char *room_id = json_string_value(json_array_get(ids, i));
        const json_t *pick = json_object_get(picked, room_id);
        if (!eligible(row_of(rs, pick), json_object_get(prev->rooms, room_id))) continue;
        const char *pk = pairs_key(r, json_object_get(pick, "rs"));
        const char *device = s->device ? s->device : "";
        const char *key = pk ? rt_arena_printf(r->arena, "%zu:%s%zu:%s%zu:%s%lld;%s", strlen(s->user), s->user,
                                               strlen(device), device, strlen(room_id), room_id,
                                               (long long)json_integer_value(json_object_get(pick, "tl")), pk)
                             : NULL;
        const char *id = rt_arena_strdup(r->arena, room_id); /* ids drops the hits' strings */
        if (!key || !id) return ROOMS_E_DB;
        const ssync_room_row *row = row_of(rs, pick);
        h->stamped[h->n] = row->stamped; /* read with the list (a new connection's top rooms) */
        if (row->stamped) h->stamp[h->n] = row->stamp;
        h->room_id[h->n] = id;
        h->key[h->n++] = key;
    }
    if (h->n == 0) return ROOMS_OK;
    if (read_stamps(s, h) < 0) return ROOMS_E_DB;
    json_t *taken = json_object();
    for (size_t i = 0; i < h->n; i++) {
        if (!h->stamped[i]) continue;
        if (prev->stream_pos > 0 && prev->stream_pos < h->stamp[i].room_max) continue; /* num_live */
        char *text = ssync_cache_get(cache, h->key[i], &h->stamp[i]);
        json_t *room = text ? json_loads(text, JSON_ALLOW_NUL, NULL) : NULL;
        free(text);
        if (!json_is_object(room)) {
            json_decref(room);
            continue;
        }
        const json_t *pick = json_object_get(picked, h->room_id[i]);
        json_object_set_new(rooms, h->room_id[i], hit_result(s, row_of(rs, pick), pick, room));
        json_object_set_new(sent, h->room_id[i],
                            json_pack("[I, s, I, O]", (json_int_t)s->upto, "join",
                                      (json_int_t)json_integer_value(json_object_get(pick, "tl")),
                                      json_object_get(pick, "rsk")));
        h->stamped[i] = false; /* taken: nothing to keep */
        json_object_set_new(taken, h->room_id[i], json_true());
    }
    /* The rooms taken leave ids, and those to keep are found by ID (a window can hold
     * thousands of rooms: one pass each, no search per room). */
    h->to_keep = json_object();
    json_t *left = json_array();
    for (size_t i = 0; i < h->n; i++)
        if (h->stamped[i]) json_object_set_new(h->to_keep, h->room_id[i], json_integer((json_int_t)i));
    for (size_t j = 0; j < json_array_size(ids); j++) {
        json_t *id = json_array_get(ids, j);
        if (!json_object_get(taken, json_string_value(id))) json_array_append(left, id);
    }
    json_array_clear(ids);
    json_array_extend(ids, left);
    json_decref(left);
    json_decref(taken);
    return ROOMS_OK;
}

void ssync_hits_free(ssync_hits *h)
{
    json_decref(h->to_keep);
    h->to_keep = NULL;
}

void ssync_hits_keep(const ssync_hits *h, const char *room_id, const json_t *result, const ssync_plan *plan)
{
    ssync_cache *cache = ssync_cache_global();
    const json_t *at = cache ? json_object_get(h->to_keep, room_id) : NULL;
    if (!at) return;
    size_t i = (size_t)json_integer_value(at);
    json_t *kept = json_object();
    json_object_update(kept, (json_t *)result);
    const char *row_fields[] = {"membership", "bump_stamp", "is_dm", "lists", "num_live"};
    for (size_t f = 0; f < sizeof(row_fields) / sizeof(row_fields[0]); f++) json_object_del(kept, row_fields[f]);
    if (!plan->t.first_pos) json_object_del(kept, "prev_batch"); /* the run's position */
    char *text = json_dumps(kept, JSON_COMPACT);
    if (text) ssync_cache_put(cache, h->key[i], &h->stamp[i], text);
    free(text);
    json_decref(kept);
}
