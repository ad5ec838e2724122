/*
 * core/client/rooms/crooms_module.c - the rooms module: its start-up (the tables are the room
 * model's, core/rooms/rooms.c), and the helpers every room endpoint shares: failures -> Matrix
 * errors, database connections, readers, path parameters and pagination tokens.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/auth/auth.h"
#include "core/client/push/push_send.h"
#include "core/client/rooms/crooms_api.h"
#include "core/client/rooms/crooms_hierarchy.h"
#include "core/client/rooms/crooms_relations.h"
#include "core/rooms/events_pdus.h"
#include "atrium/parse.h"

/* The settings, or NULL when no runtime object is bound (unit tests). */
static const struct core_config *settings(void)
{
    core_runtime *rt = core_runtime_get();
    return rt ? rt->cfg : NULL;
}

/* Failures as Matrix errors (rooms_fail) are the room model's: core/rooms/rooms_tx.c. */

/* ---- database ----------------------------------------------------------------------- */

const char *crooms_i64(atrium_req *r, int64_t x)
{
    return rt_arena_printf(r->arena, "%lld", (long long)x);
}

/* ---- readers ------------------------------------------------------------------------ */

bool crooms_reader_open(atrium_req *r, crooms_reader *rd)
{
    if (!(rd->c = http_db_checkout(r))) return false;
    rooms_err e = {0};
    if (rooms_visibility(rd->c, rd->room, rd->user, &rd->vis, &e) < 0) {
        http_db_checkin(rd->c);
        rooms_fail(r, &e);
        return false;
    }
    rd->view = (events_view){.user_id = rd->user, .device_id = r->device, .with_room_id = true,
                             .now_ms = rooms_wall_ms(), .reader = &rd->vis};
    return true;
}

int crooms_reader_close(atrium_req *r, crooms_reader *rd, int status, json_t *body)
{
    http_db_checkin(rd->c);
    if (!body) return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    return http_respond_json(r, status, body);
}

/* ---- requests ----------------------------------------------------------------------- */

bool crooms_filter_query(atrium_req *r, const char *name, room_filter *out)
{
    const char *text = http_req_query(r, name);
    json_t *f = NULL;
    if (text && *text) {
        f = json_loads(text, 0, NULL);
        if (!f) {
            http_respond_error(r, 400, "M_BAD_JSON", "'%s' is not JSON", name);
            return false;
        }
    }
    char why[128];
    bool ok = rooms_filter_parse(r->arena, f, out, why, sizeof(why));
    json_decref(f);
    if (!ok) http_respond_error(r, 400, "M_BAD_JSON", "%s", why);
    return ok;
}

const char *crooms_param_room(atrium_req *r)
{
    const char *room = http_req_param(r, "roomId");
    if (!rooms_room_id_ok(room)) {
        http_respond_error(r, 400, "M_INVALID_PARAM", "Not a room ID");
        return NULL;
    }
    return room;
}

const room_version *crooms_default_version(void)
{
    const struct core_config *cfg = settings();
    const room_version *v = room_version_find_creatable(cfg ? cfg->rooms.default_version : NULL);
    return v ? v : room_version_find_creatable(CROOMS_DEFAULT_VERSION);
}

bool crooms_parse_topo_token(const char *tok, int64_t *depth, int64_t *pos)
{
    const char *sep = tok && tok[0] == 't' ? strchr(tok + 1, '_') : NULL;
    char d[24];
    if (!sep || sep == tok + 1 || (size_t)(sep - tok - 1) >= sizeof(d)) return false;
    memcpy(d, tok + 1, (size_t)(sep - tok - 1));
    d[sep - tok - 1] = '\0';
    return atrium_parse_int64(d, INT64_MIN + 1, INT64_MAX, depth) == 0 &&
           atrium_parse_int64(sep + 1, INT64_MIN + 1, INT64_MAX, pos) == 0;
}

bool crooms_parse_token(const char *tok, int64_t *pos)
{
    int64_t depth;
    if (tok && tok[0] == 't') return crooms_parse_topo_token(tok, &depth, pos);
    if (!tok || (tok[0] != 's' && tok[0] != 'b') || tok[1] < '0' || tok[1] > '9') return false;
    int64_t v;
    if (atrium_parse_int64(tok + 1, 0, INT64_MAX, &v) != 0) return false;
    *pos = tok[0] == 'b' ? -v : v;
    return true;
}

const char *crooms_token(atrium_req *r, int64_t pos)
{
    if (pos < 0) return rt_arena_printf(r->arena, "b%lld", (long long)(pos == INT64_MIN ? INT64_MAX : -pos));
    return rt_arena_printf(r->arena, "s%lld", (long long)pos);
}

/* ---- the bulk pool ------------------------------------------------------------------ */

/* Writes into many rooms at once (a profile change, a deactivation) run here, one at a
 * time, so they hold neither a request-pool thread nor an auth thread. */
#define ROOMS_BULK_THREADS 1
#define ROOMS_BULK_QUEUE 32

int crooms_to_bulk_pool(atrium_req *r)
{
    rt_pool *bulk_pool = core_runtime_get()->rooms_bulk_pool;
    int rc = bulk_pool ? susp_handoff(r, bulk_pool, NULL, 0) : ATRIUM_E_STOPPED;
    if (rc == 0) return ATRIUM_HANDED_OFF;
    if (rc == ATRIUM_E_LIMIT)
        http_respond_limited(r, 1000, "Too many room-wide changes in progress; retry");
    else
        http_respond_error(r, 503, "M_UNKNOWN", "The server is stopping");
    return ATRIUM_DONE;
}

int crooms_to_remote_pool(atrium_req *r)
{
    rt_pool *pool = core_runtime_get()->rooms_remote_pool;
    int rc = pool ? susp_handoff(r, pool, NULL, 0) : ATRIUM_E_STOPPED;
    if (rc == 0) return ATRIUM_HANDED_OFF;
    if (rc == ATRIUM_E_LIMIT)
        http_respond_limited(r, 1000, "Too many requests to other servers in progress; retry");
    else
        http_respond_error(r, 503, "M_UNKNOWN", "The server is stopping");
    return ATRIUM_DONE;
}

static int rooms_start(core_runtime *rt)
{
    if (rt_pool_start(rt->rooms_bulk_pool) < 0 || rt_pool_start(rt->rooms_remote_pool) < 0) {
        rt_log(ATRIUM_LOG_ERROR, "core", "cannot start the rooms pools' threads");
        return -1;
    }
    /* The push sender reads events and members: it starts once the rooms tables exist. */
    push_send_settings push = {.db = rt->db, .leases = rt->leases,
                               .lease_ttl_ms = rt->cfg->lease_ttl_ms, .metrics = rt->metrics,
                               .notifications_per_user_max =
                                   rt->cfg->push.notifications_per_user_max};
    if (push_send_start(&push) < 0) return -1;
    return crooms_typing_start();
}

static void rooms_stop(core_runtime *rt)
{
    push_send_stop();
    crooms_typing_stop();
    crooms_hierarchy_stop();
    if (rt->rooms_remote_pool) {
        rt_pool_stop(rt->rooms_remote_pool); /* queued handoffs are answered 503 */
        rt_pool_join(rt->rooms_remote_pool);
        rt_pool_free(rt->rooms_remote_pool);
        rt->rooms_remote_pool = NULL;
    }
    rt_pool *bulk_pool = rt->rooms_bulk_pool;
    if (!bulk_pool) return;
    rt_pool_stop(bulk_pool); /* queued handoffs are answered 503 */
    rt_pool_join(bulk_pool);
    rt_pool_free(bulk_pool);
    rt->rooms_bulk_pool = NULL;
}

/* ---- the module --------------------------------------------------------------------- */

static int rooms_init(core_runtime *rt)
{
    http_server *s = rt->http;
    rt->rooms_bulk_pool = rt_pool_new("core.rooms_bulk", ROOMS_BULK_THREADS, ROOMS_BULK_QUEUE,
                                      rt->metrics);
    if (!rt->rooms_bulk_pool) return -1;
    rt->rooms_remote_pool = rt_pool_new("core.rooms_remote", CROOMS_REMOTE_THREADS,
                                        CROOMS_REMOTE_QUEUE, rt->metrics);
    if (!rt->rooms_remote_pool) return -1;
    /* Stored events' parsed PDUs, shared by every request that renders or judges events
     * (core/rooms/events_pdus.h): made before any route can serve one. */
    if (!events_pdus_global()) {
        events_pdus *pdus = events_pdus_new(rt->metrics, EVENTS_PDUS_SLOTS, EVENTS_PDUS_MAX_TEXT);
        if (!pdus) return -1;
        events_pdus_set_global(pdus);
    }
    if (!room_version_find_creatable(rt->cfg->rooms.default_version)) {
        rt_log(ATRIUM_LOG_ERROR, "core", "rooms.default_version \"%.16s\" is not a room version "
               "this server creates: set it to one of \"1\" to \"11\"", rt->cfg->rooms.default_version);
        return -1;
    }
    if (crooms_create_routes(s) < 0 || crooms_membership_routes(s) < 0 || crooms_send_routes(s) < 0 ||
        crooms_read_routes(s) < 0 || crooms_ephemeral_routes(s) < 0 || crooms_relations_routes(s) < 0 ||
        crooms_knock_routes(s) < 0)
        return -1;
    if (crooms_search_routes(s) < 0 || crooms_upgrade_routes(s) < 0 || crooms_admin_routes(s) < 0 ||
        crooms_hierarchy_routes(s) < 0 || crooms_jump_routes(s) < 0 ||
        crooms_hierarchy_init(rt->metrics) < 0 ||
        crooms_iface_provide() < 0 ||
        crooms_edus_init() < 0)
        return -1;
    return 0;
}

const client_module ROOMS_MODULE = {
    .owner = "rooms",
    .migrations = ROOMS_MIGRATIONS,
    .n_migrations = ROOMS_N_MIGRATIONS,
    .init = rooms_init,
    .start = rooms_start,
    .stop = rooms_stop,
};
