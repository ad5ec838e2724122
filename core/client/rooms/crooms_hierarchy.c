/*
 * core/client/rooms/crooms_hierarchy.c - GET /_matrix/client/v1/rooms/{roomId}/hierarchy:
 * a space's tree, depth first, one page at a time.
 *
 * The walk starts at the root and takes children from each space's m.space.child state in
 * the spec's order (rooms_space_children, core/rooms/rooms_space.c), a child before its
 * next sibling; a room met twice (a loop, a room in two spaces) is shown once. A room the
 * user may not see (rooms_space_may_see) is left out with everything under it; the root
 * itself must be visible, else 403 (as for an unknown root no server can be asked about:
 * the spec's 403 "the room does not exist"). A child this server is not resident in is
 * asked of the servers in its `via` (crooms_hierarchy_remote.c, parked, cached briefly);
 * one that cannot be had is left out. A root this server is not in is asked of the servers
 * of docs/adr/0028-remote-hierarchy-root.md in turn (the request's via, server_name and
 * org.matrix.msc4235.via, checked against the grammar first, then the servers this server
 * knows for it); when none of them can show it, 404.
 *
 * Paging holds no state on the server: a `from` token names how many visible rooms the
 * earlier pages showed and a hash of what the walk depends on (root, user, suggested_only,
 * max_depth), and the next page walks again from the root, skipping them. A token that is
 * malformed, or that was made for another walk, is 400 M_INVALID_PARAM (the spec: from
 * cannot change suggested_only or max_depth). Rooms added to or removed from the tree
 * between pages can shift a page by that much; the walk is bounded
 * (HIERARCHY_MAX_VISITS rooms looked at per request), so a token past that ends the tree.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atrium/parse.h"
#include "core/client/auth/auth.h"
#include "core/client/rooms/crooms_api.h"
#include "core/client/rooms/crooms_hierarchy.h"
#include "core/rooms/rooms_space.h"

#define HIERARCHY_DEFAULT_LIMIT 50
#define HIERARCHY_MAX_LIMIT 50
#define HIERARCHY_MAX_DEPTH 10
#define HIERARCHY_MAX_VISITS 500 /* rooms looked at by one request, skipped ones included */
#define HIERARCHY_TOKEN_PREFIX "h1."
#define HIERARCHY_RETRY_AFTER_MS 1000

typedef struct hwalk {
    atrium_req *r;
    PGconn *c;
    const char *user, *root;
    bool suggested;
    int64_t max_depth, limit, skip;
    json_t *page; /* the rooms shown */
    int64_t seen; /* visible rooms met so far */
    bool more;
    int parked; /* > 0: the walk waits for another server (crooms_hierarchy_remote) */
} hwalk;

/* ---- tokens ------------------------------------------------------------------------- */

/* FNV-1a over what a walk depends on: a token is only good for the same walk. */
static uint32_t walk_hash(const hwalk *w)
{
    char depth[24];
    snprintf(depth, sizeof(depth), "%lld", (long long)w->max_depth);
    const char *parts[] = {w->root, w->user, w->suggested ? "s" : "a", depth};
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
        for (const unsigned char *p = (const unsigned char *)parts[i]; *p; p++)
            h = (h ^ *p) * 16777619u;
        h = (h ^ 0xff) * 16777619u; /* a separator no ID contains */
    }
    return h;
}

static const char *make_token(const hwalk *w, int64_t skip)
{
    return rt_arena_printf(w->r->arena, HIERARCHY_TOKEN_PREFIX "%lld.%08x", (long long)skip,
                           (unsigned)walk_hash(w));
}

/* The skip count of a token made for this walk; false when it is not one. */
static bool parse_token(const hwalk *w, const char *tok, int64_t *skip)
{
    size_t plen = strlen(HIERARCHY_TOKEN_PREFIX);
    if (strncmp(tok, HIERARCHY_TOKEN_PREFIX, plen) != 0) return false;
    const char *dot = strchr(tok + plen, '.');
    if (!dot || dot - (tok + plen) > 20) return false;
    char num[24];
    snprintf(num, sizeof(num), "%.*s", (int)(dot - (tok + plen)), tok + plen);
    char hash[16];
    snprintf(hash, sizeof(hash), "%08x", (unsigned)walk_hash(w));
    return atrium_parse_int64(num, 1, HIERARCHY_MAX_VISITS, skip) == 0 && strcmp(dot + 1, hash) == 0;
}

/* ---- parameters ----------------------------------------------------------------------- */

/* [req] The query parameters into w. false after answering 400. */
static bool read_params(atrium_req *r, hwalk *w)
{
    const char *s = http_req_query(r, "suggested_only"), *l = http_req_query(r, "limit");
    const char *d = http_req_query(r, "max_depth"), *from = http_req_query(r, "from");
    if (s && strcmp(s, "true") != 0 && strcmp(s, "false") != 0) {
        http_respond_error(r, 400, "M_INVALID_PARAM", "suggested_only must be true or false");
        return false;
    }
    w->suggested = s && strcmp(s, "true") == 0;
    w->limit = HIERARCHY_DEFAULT_LIMIT;
    int rc = l ? atrium_parse_int64(l, 1, HIERARCHY_MAX_LIMIT, &w->limit) : 0;
    if (rc == ATRIUM_E_INVAL || (rc == ATRIUM_E_LIMIT && w->limit != HIERARCHY_MAX_LIMIT)) {
        http_respond_error(r, 400, "M_INVALID_PARAM", "limit must be an integer above 0");
        return false;
    }
    w->max_depth = HIERARCHY_MAX_DEPTH;
    rc = d ? atrium_parse_int64(d, 0, HIERARCHY_MAX_DEPTH, &w->max_depth) : 0;
    if (rc == ATRIUM_E_INVAL || (rc == ATRIUM_E_LIMIT && w->max_depth != HIERARCHY_MAX_DEPTH)) {
        http_respond_error(r, 400, "M_INVALID_PARAM", "max_depth must be a non-negative integer");
        return false;
    }
    if (from && !parse_token(w, from, &w->skip)) {
        http_respond_error(r, 400, "M_INVALID_PARAM",
                           "from is not a token of this hierarchy (it keeps suggested_only and "
                           "max_depth)");
        return false;
    }
    return true;
}

/* ---- the walk ----------------------------------------------------------------------- */

/* The chunk of a room for w's user (a new object, with children_state) in *entry: 1 shown,
 * 0 left out (unknown, hidden, or still being asked of another server: w->parked), -1
 * database, -2 the outbound budget is full, -3 a root this server is not in that no server
 * asked could show. */
static int room_entry(hwalk *w, const char *room_id, const json_t *vias, json_t **entry)
{
    *entry = NULL;
    json_t *s = NULL;
    int res = rooms_space_resident(w->c, room_id);
    if (res < 0) return -1;
    if (res == 0 && strcmp(room_id, w->root) == 0) {
        json_t *servers = crooms_remote_vias(w->r, w->c, room_id, true);
        int rc = crooms_hierarchy_remote_root(w->r, room_id, servers, w->suggested, &s, &w->parked);
        json_decref(servers);
        if (rc <= 0) return rc == -4 ? 0 : rc;
    } else if (res == 0) {
        if (!vias) return 0;
        int rc = crooms_hierarchy_remote(w->r, room_id, vias, w->suggested, &s, &w->parked);
        if (rc <= 0) return rc;
    } else {
        int rc = rooms_summary(w->c, room_id, true, &s);
        if (rc == ATRIUM_E_NOTFOUND) return 0;
        if (rc < 0) return -1;
        json_t *kids = NULL;
        const char *type = json_string_value(json_object_get(s, "room_type"));
        if (type && strcmp(type, "m.space") == 0) {
            if (rooms_space_children(w->c, room_id, w->suggested, &kids) < 0) {
                json_decref(s);
                return -1;
            }
        }
        json_object_set_new(s, "children_state", kids ? kids : json_array());
    }
    int may = rooms_space_may_see(w->c, s, w->user, NULL);
    if (may <= 0) {
        json_decref(s);
        return may;
    }
    *entry = s;
    return 1;
}

/* Push the children of entry (a space at depth) onto the stack, last first, so the first
 * child is walked next. */
static void push_children(json_t *stack, const json_t *entry, int64_t depth)
{
    const json_t *kids = json_object_get(entry, "children_state");
    for (size_t i = json_array_size(kids); i-- > 0;) {
        const json_t *k = json_array_get(kids, i);
        json_array_append_new(stack, json_pack("{s:O, s:O, s:I}", "room_id",
                                               json_object_get(k, "state_key"), "via",
                                               json_object_get(json_object_get(k, "content"), "via"),
                                               "depth", (json_int_t)depth + 1));
    }
}

/* Walk from the root. 0 done (w->page, w->more; or w->parked), 1 the root cannot be seen,
 * 2 the outbound budget is full, 3 no server could show the root, -1 database. */
static int walk(hwalk *w)
{
    json_t *stack = json_pack("[{s:s, s:I}]", "room_id", w->root, "depth", (json_int_t)0);
    json_t *visited = json_object();
    int rc = 0;
    for (int visits = 0; json_array_size(stack) > 0 && visits < HIERARCHY_MAX_VISITS; visits++) {
        json_t *top = json_incref(json_array_get(stack, json_array_size(stack) - 1));
        json_array_remove(stack, json_array_size(stack) - 1);
        const char *room = json_string_value(json_object_get(top, "room_id"));
        int64_t depth = json_integer_value(json_object_get(top, "depth"));
        json_t *entry = NULL;
        int shown = json_object_get(visited, room) ? 0 : 1;
        if (shown) {
            json_object_set_new(visited, room, json_true());
            shown = room_entry(w, room, json_object_get(top, "via"), &entry);
        }
        json_decref(top);
        if (w->parked) break; /* the page waits for another server's answer */
        if (shown < 0 || (shown == 0 && depth == 0)) {
            rc = shown == -2 ? 2 : shown == -3 ? 3 : shown < 0 ? -1 : 1;
            break;
        }
        if (!shown) continue;
        if (w->seen >= w->skip + w->limit) { /* one room past the page: there is more */
            w->more = true;
            json_decref(entry);
            break;
        }
        if (depth < w->max_depth) push_children(stack, entry, depth);
        if (w->seen++ >= w->skip) json_array_append(w->page, entry);
        json_decref(entry);
    }
    json_decref(stack);
    json_decref(visited);
    return rc;
}

/* GET /_matrix/client/v1/rooms/{roomId}/hierarchy */
static int get_hierarchy(atrium_req *r)
{
    hwalk w = {.r = r};
    if (!(w.user = auth_request(r)) || !(w.root = crooms_param_room(r))) return ATRIUM_DONE;
    if (!read_params(r, &w) || !crooms_vias_ok(r, true)) return ATRIUM_DONE;
    if (r->run_reason == ATRIUM_RUN_SHUTDOWN)
        return http_respond_error(r, 503, "M_UNKNOWN", "The server is stopping");
    crooms_hierarchy_run_begin(r);
    if (!(w.c = http_db_checkout(r))) return ATRIUM_DONE;
    w.page = json_array();
    int rc = walk(&w);
    http_db_checkin(w.c);
    if (rc == 0 && w.parked > 0) { /* another server is being asked: run again when it answered */
        json_decref(w.page);
        return ATRIUM_PARKED;
    }
    if (rc < 0) {
        json_decref(w.page);
        return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    }
    if (rc == 2) {
        json_decref(w.page);
        return http_respond_limited(r, HIERARCHY_RETRY_AFTER_MS,
                                    "Too many requests waiting on other servers; retry");
    }
    if (rc == 1) {
        json_decref(w.page);
        return http_respond_error(r, 403, "M_FORBIDDEN",
                                  "You may not see this room, or it is unknown here");
    }
    if (rc == 3) {
        json_decref(w.page);
        return http_respond_error(r, 404, "M_NOT_FOUND",
                                  "No server asked could show this room; name one that is "
                                  "in it with via");
    }
    json_t *body = json_pack("{s:o}", "rooms", w.page);
    if (w.more) json_object_set_new(body, "next_batch", json_string(make_token(&w, w.seen)));
    return http_respond_json(r, 200, body);
}

int crooms_hierarchy_routes(http_server *s)
{
    static const atrium_route routes[] = {
        HTTP_ROUTE("GET", "/_matrix/client/v1/rooms/{roomId}/hierarchy", get_hierarchy, 0),
    };
    return HTTP_ROUTES_ADD(s, routes, "core");
}
