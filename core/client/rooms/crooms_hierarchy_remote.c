/*
 * core/client/rooms/crooms_hierarchy_remote.c - the rooms of a space hierarchy that live on
 * other servers (crooms_hierarchy.h).
 *
 * When the walk meets a child this server is not resident in, it asks the first server of
 * the child's `via` (other than this one) for GET /_matrix/federation/v1/hierarchy/{roomId}.
 * The request waits parked (susp_wait), holding no request-pool thread but one slot of
 * the outbound budget (ADR-0079; 429 at once when there is none), and the federation
 * client's callback stores the answer in the cache and wakes it; the handler then walks
 * again from the root and finds the room cached. One server is asked per run and at most
 * CROOMS_HIERARCHY_MAX_FETCHES per request, each within the request's deadline; a child
 * still unknown after that is left out, as the spec leaves out what cannot be had.
 * A root this server is not in is asked the same way of a list of servers in turn, the
 * next after one that failed (crooms_hierarchy_remote_root, docs/adr/0028-remote-hierarchy-root.md).
 *
 * The cache (docs/adr/0012-hierarchy-cache.md) is one fixed table per process: an entry
 * per (room, suggested_only), the room's summary as the answer gave it, cleaned to the
 * fields a client is shown (children_state by the spec's rule, rooms_space_children_filter),
 * kept CROOMS_HIERARCHY_CACHE_MS, or CROOMS_HIERARCHY_FAILURE_CACHE_MS for a room that could
 * not be had (the server failed, refused, or named it inaccessible). A full table replaces
 * the entry that runs out first. The answer's `children` fill entries too (without their
 * children: a child that is a space is asked for itself when the walk gets there).
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core/client/rooms/crooms_hierarchy.h"
#include "core/federation/transport/fed_request.h"
#include "core/rooms/rooms_space.h"
#include "core/runtime/uri.h"

#define HIERARCHY_URI_BYTES 1024

typedef struct cache_entry {
    char room[ATRIUM_ROOM_ID_MAX_BYTES + 1];
    bool suggested, with_children, used;
    json_t *summary; /* NULL: the room could not be had */
    int64_t expires_ms;
} cache_entry;

/* The process's cache of other servers' answers: a named registry, under its mutex. */
static struct {
    pthread_mutex_t lock;
    cache_entry e[CROOMS_HIERARCHY_CACHE_ENTRIES];
    rt_metric *hit, *miss, *entries, *ok, *failed;
} hcache = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* One request's progress across its runs (r->core_state). */
typedef struct hier_state {
    bool started, done, gave_up, slot;
    int fetches;
    int root_asked; /* servers asked for the root so far (crooms_hierarchy_remote_root) */
    char room[ATRIUM_ROOM_ID_MAX_BYTES + 1];
    bool suggested;
    bool root; /* the room asked is the walk's root: its failure is not remembered */
} hier_state;

/* ---- the cache ------------------------------------------------------------------------ */

/* Under the lock: the live entry of (room, suggested), or NULL. */
static cache_entry *find(const char *room, bool suggested, int64_t now)
{
    for (int i = 0; i < CROOMS_HIERARCHY_CACHE_ENTRIES; i++) {
        cache_entry *e = &hcache.e[i];
        if (e->used && e->expires_ms > now && e->suggested == suggested && strcmp(e->room, room) == 0)
            return e;
    }
    return NULL;
}

/* Under the lock: store (room, suggested) -> summary (stolen; NULL: a failure). An entry
 * with children is not replaced by one without. */
static void store(const char *room, bool suggested, json_t *summary, bool with_children, int64_t now)
{
    cache_entry *slot = find(room, suggested, now);
    if (slot && slot->with_children && !with_children && slot->summary) {
        json_decref(summary);
        return;
    }
    for (int i = 0; !slot && i < CROOMS_HIERARCHY_CACHE_ENTRIES; i++)
        if (!hcache.e[i].used || hcache.e[i].expires_ms <= now) slot = &hcache.e[i];
    if (!slot) { /* full of live entries: replace the one that runs out first */
        slot = &hcache.e[0];
        for (int i = 1; i < CROOMS_HIERARCHY_CACHE_ENTRIES; i++)
            if (hcache.e[i].expires_ms < slot->expires_ms) slot = &hcache.e[i];
    }
    if (!slot->used) rt_metric_add(hcache.entries, 1);
    json_decref(slot->summary);
    snprintf(slot->room, sizeof(slot->room), "%s", room);
    slot->suggested = suggested;
    slot->with_children = with_children;
    slot->summary = summary;
    slot->used = true;
    slot->expires_ms = now + (summary ? CROOMS_HIERARCHY_CACHE_MS : CROOMS_HIERARCHY_FAILURE_CACHE_MS);
}

int crooms_hierarchy_init(rt_metrics *m)
{
    hcache.hit = rt_metric_counter(m, "atrium_rooms_hierarchy_cache_total", "result=\"hit\"",
                                   "Space hierarchy look-ups of rooms on other servers, by cache result");
    hcache.miss = rt_metric_counter(m, "atrium_rooms_hierarchy_cache_total", "result=\"miss\"",
                                    "Space hierarchy look-ups of rooms on other servers, by cache result");
    hcache.entries = rt_metric_gauge(m, "atrium_rooms_hierarchy_cache_entries", "",
                                     "Rooms of other servers held in the space hierarchy cache");
    hcache.ok = rt_metric_counter(m, "atrium_rooms_hierarchy_remote_total", "outcome=\"ok\"",
                                  "Federation hierarchy requests made, by outcome");
    hcache.failed = rt_metric_counter(m, "atrium_rooms_hierarchy_remote_total", "outcome=\"failed\"",
                                      "Federation hierarchy requests made, by outcome");
    return hcache.hit && hcache.miss && hcache.entries && hcache.ok && hcache.failed ? 0 : -1;
}

void crooms_hierarchy_stop(void)
{
    pthread_mutex_lock(&hcache.lock);
    for (int i = 0; i < CROOMS_HIERARCHY_CACHE_ENTRIES; i++) {
        json_decref(hcache.e[i].summary);
        memset(&hcache.e[i], 0, sizeof(hcache.e[i]));
    }
    rt_metric_set(hcache.entries, 0);
    pthread_mutex_unlock(&hcache.lock);
}

/* ---- an answer, cleaned ----------------------------------------------------------------- */

/* The fields of a summary a client is shown, with their types checked; NULL when a
 * required one is missing or room_id is not want (NULL: any room ID). */
static json_t *clean_summary(const json_t *in, const char *want)
{
    const char *room = json_string_value(json_object_get(in, "room_id"));
    json_t *n = json_object_get(in, "num_joined_members");
    if (!room || !rooms_room_id_ok(room) || (want && strcmp(room, want) != 0) ||
        !json_is_integer(n) || !json_is_boolean(json_object_get(in, "world_readable")) ||
        !json_is_boolean(json_object_get(in, "guest_can_join")))
        return NULL;
    json_t *out = json_pack("{s:s, s:O, s:O, s:O}", "room_id", room, "num_joined_members", n,
                            "world_readable", json_object_get(in, "world_readable"),
                            "guest_can_join", json_object_get(in, "guest_can_join"));
    static const char *const STRINGS[] = {"name", "topic", "canonical_alias", "avatar_url",
                                          "join_rule", "room_type", "encryption", "room_version"};
    for (size_t i = 0; out && i < sizeof(STRINGS) / sizeof(STRINGS[0]); i++) {
        json_t *v = json_object_get(in, STRINGS[i]);
        if (json_is_string(v)) json_object_set(out, STRINGS[i], v);
    }
    if (out && !json_object_get(out, "join_rule")) /* the spec's default */
        json_object_set_new(out, "join_rule", json_string("public"));
    json_t *allowed = json_array();
    size_t i;
    json_t *a;
    json_array_foreach(json_object_get(in, "allowed_room_ids"), i, a) {
        if (json_array_size(allowed) < ROOMS_SPACE_MAX_ALLOWED && json_is_string(a) &&
            rooms_room_id_ok(json_string_value(a)))
            json_array_append(allowed, a);
    }
    if (out) json_object_set_new(out, "allowed_room_ids", allowed);
    else json_decref(allowed);
    return out;
}

/* On the outbound client's thread: keep what the server said, or the failure. */
static void fetched(void *arg, const fed_response *res)
{
    atrium_req *r = arg;
    hier_state *st = r->core_state;
    int64_t now = rt_now_ms();
    json_t *room = NULL;
    if (res->outcome == FED_HTTP_OK && res->status == 200 && res->json)
        room = clean_summary(json_object_get(res->json, "room"), st->room);
    pthread_mutex_lock(&hcache.lock);
    if (room) {
        json_t *kids = rooms_space_children_filter(
            json_object_get(json_object_get(res->json, "room"), "children_state"), st->suggested);
        json_object_set_new(room, "children_state", kids ? kids : json_array());
        size_t i;
        json_t *c;
        json_array_foreach(json_object_get(res->json, "children"), i, c) {
            json_t *s = clean_summary(c, NULL);
            if (s && strcmp(json_string_value(json_object_get(s, "room_id")), st->room) != 0)
                store(json_string_value(json_object_get(s, "room_id")), st->suggested, s, false, now);
            else json_decref(s);
        }
        json_array_foreach(json_object_get(res->json, "inaccessible_children"), i, c) {
            if (json_is_string(c) && rooms_room_id_ok(json_string_value(c)) &&
                strcmp(json_string_value(c), st->room) != 0)
                store(json_string_value(c), st->suggested, NULL, false, now);
        }
    } else {
        rt_log(ATRIUM_LOG_INFO, "rooms", "hierarchy of %s from %s: %s (status %d)", st->room,
               res->destination ? res->destination : "?", res->error ? res->error : "unusable answer",
               res->status);
    }
    /* A root that one server could not show may be had from the next (ADR-0028): only
     * its success is kept. */
    if (room || !st->root) store(st->room, st->suggested, room, true, now);
    pthread_mutex_unlock(&hcache.lock);
    rt_metric_add(room ? hcache.ok : hcache.failed, 1);
    st->done = true;
    susp_wake(r);
}

/* ---- asking ------------------------------------------------------------------------- */

/* The request's outbound-budget slot, a hold: given back once the answer is queued. */
typedef struct slot_hold {
    rt_budget *b;
    const char *key;
} slot_hold;

static void slot_release(void *arg)
{
    slot_hold *h = arg;
    rt_budget_release(h->b, h->key);
}

/* Take r's slot (once per request). 0, or ATRIUM_E_LIMIT (full), or another failure. */
static int take_slot(atrium_req *r)
{
    slot_hold *h = rt_arena_alloc(r->arena, sizeof(*h));
    if (!h) return ATRIUM_E_NOMEM;
    h->b = r->srv->outbound;
    h->key = http_req_client_key(r);
    int rc = rt_budget_try_acquire(h->b, h->key, NULL);
    if (rc < 0) return rc;
    return http_req_add_answer_hold(r, slot_release, h);
}

void crooms_hierarchy_run_begin(atrium_req *r)
{
    hier_state *st = r->core_state;
    if (!st || !st->started) return;
    if (st->done) st->started = false; /* answered: the next may be asked */
    else st->gave_up = true;           /* the deadline or shutdown woke us first */
}

/* A cached entry for a walk: 1 (*entry set), 0 a remembered failure (unless
 * skip_failures: then -1), -1 not cached. */
static int cached(const char *room_id, bool suggested, bool skip_failures, json_t **entry)
{
    int rc = -1;
    pthread_mutex_lock(&hcache.lock);
    cache_entry *e = find(room_id, suggested, rt_now_ms());
    const char *type = e && e->summary ? json_string_value(json_object_get(e->summary, "room_type")) : NULL;
    bool space = type && strcmp(type, "m.space") == 0;
    if (e && !e->summary) rc = skip_failures ? -1 : 0;
    else if (e && (e->with_children || !space)) {
        *entry = json_deep_copy(e->summary);
        if (*entry && !json_object_get(*entry, "children_state"))
            json_object_set_new(*entry, "children_state", json_array());
        rc = *entry ? 1 : 0;
    }
    pthread_mutex_unlock(&hcache.lock);
    rt_metric_add(rc < 0 ? hcache.miss : hcache.hit, 1);
    return rc;
}

/* The first server of vias that is not this one, or NULL. */
static const char *pick_via(const json_t *vias)
{
    size_t i;
    json_t *v;
    json_array_foreach(vias, i, v) {
        const char *s = json_string_value(v);
        if (s && *s && strcmp(s, rooms_server_name()) != 0) return s;
    }
    return NULL;
}

static hier_state *state_of(atrium_req *r)
{
    if (!r->core_state) {
        hier_state *st = rt_arena_alloc(r->arena, sizeof(*st));
        if (st) memset(st, 0, sizeof(*st));
        r->core_state = st;
    }
    return r->core_state;
}

/* Ask via for room_id's hierarchy, parked until it answers or deadline_ms (this request's
 * deadline or sooner). 0 asked (*parked set), -1 not asked (no slot, the deadline, an ID too
 * long), -2 the outbound budget is full. */
static int ask(atrium_req *r, hier_state *st, const char *room_id, const char *via,
               bool suggested, bool root, int64_t deadline_ms, int *parked)
{
    if (strlen(room_id) > ATRIUM_ROOM_ID_MAX_BYTES) return -1;
    if (!st->slot) {
        int taken = take_slot(r);
        if (taken == ATRIUM_E_LIMIT) return -2;
        if (taken < 0) return -1;
        st->slot = true;
    }
    char enc[HIERARCHY_URI_BYTES / 2], uri[HIERARCHY_URI_BYTES];
    if (!rt_uri_encode(room_id, enc, sizeof(enc))) return -1;
    snprintf(uri, sizeof(uri), "/_matrix/federation/v1/hierarchy/%s?suggested_only=%s", enc,
             suggested ? "true" : "false");
    snprintf(st->room, sizeof(st->room), "%s", room_id);
    st->suggested = suggested;
    st->root = root;
    if (susp_wait(r, r->deadline_ms) < 0) {
        st->gave_up = true;
        return -1;
    }
    st->started = true;
    st->done = false;
    st->fetches++;
    *parked = 1;
    fed_request_opts o = {.method = "GET", .destination = via, .uri = uri, .want_json = true,
                          .max_body_bytes = CROOMS_HIERARCHY_MAX_ANSWER_BYTES,
                          .deadline_ms = deadline_ms, .on_done = fetched, .arg = r};
    if (fed_request_submit(&o) < 0) {
        fed_response res = {.outcome = FED_HTTP_E_INTERNAL, .error = "the outbound client refused",
                            .destination = via};
        fetched(r, &res);
    }
    return 0;
}

int crooms_hierarchy_remote(atrium_req *r, const char *room_id, const json_t *vias,
                           bool suggested, json_t **entry, int *parked)
{
    *entry = NULL;
    int rc = cached(room_id, suggested, false, entry);
    if (rc >= 0) return rc;
    hier_state *st = state_of(r);
    const char *via = pick_via(vias);
    if (*parked || !st || st->gave_up || st->started || st->fetches >= CROOMS_HIERARCHY_MAX_FETCHES ||
        !via)
        return 0;
    return ask(r, st, room_id, via, suggested, false, r->deadline_ms, parked) == -2 ? -2 : 0;
}

/* The n-th server of servers (from 0) that is neither this one nor named before it, or
 * NULL; *count: how many such there are in all. */
static const char *nth_candidate(const json_t *servers, int n, int *count)
{
    const char *pick = NULL;
    *count = 0;
    for (size_t i = 0; i < json_array_size(servers); i++) {
        const char *s = json_string_value(json_array_get(servers, i));
        bool repeat = !s || !*s || strcmp(s, rooms_server_name()) == 0;
        for (size_t j = 0; !repeat && j < i; j++)
            repeat = json_equal(json_array_get(servers, j), json_array_get(servers, i));
        if (repeat) continue;
        if (*count == n) pick = s;
        (*count)++;
    }
    return pick;
}

int crooms_hierarchy_remote_root(atrium_req *r, const char *room_id, const json_t *servers,
                                bool suggested, json_t **entry, int *parked)
{
    *entry = NULL;
    if (cached(room_id, suggested, true, entry) == 1) return 1;
    hier_state *st = state_of(r);
    int count = 0;
    const char *via = nth_candidate(servers, st ? st->root_asked : 0, &count);
    if (count == 0) return -4;
    if (!st || st->gave_up || st->started || st->root_asked >= CROOMS_HIERARCHY_MAX_ROOT_SERVERS ||
        st->fetches >= CROOMS_HIERARCHY_MAX_FETCHES || !via)
        return -3;
    /* Each server gets an even share of the time left, so a silent first one leaves the
     * others theirs (a refused connection fails at once and gives its share on). */
    int left = count - st->root_asked;
    if (left > CROOMS_HIERARCHY_MAX_ROOT_SERVERS - st->root_asked)
        left = CROOMS_HIERARCHY_MAX_ROOT_SERVERS - st->root_asked;
    int64_t now = rt_now_ms(), deadline = r->deadline_ms;
    if (deadline > now) deadline = now + (deadline - now) / left;
    st->root_asked++;
    int rc = ask(r, st, room_id, via, suggested, true, deadline, parked);
    return rc == -2 ? -2 : rc < 0 ? -3 : 0;
}
