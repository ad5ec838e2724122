/*
 * core/plugins/host.c - struct atrium_host: the core's mechanisms as plugins see them.
 *
 * Each member is a thin adapter from the public types of include/atrium/host.h to the
 * core's internals (core/http, core/runtime, core/store); rules live in those modules,
 * not here. The one piece of state is the runtime pointer the table serves, set once
 * before any plugin loads.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "core/client/appservice/appservice.h"
#include "core/client/auth/auth.h"
#include "core/federation/transport/fed_request.h"
#include "core/federation/transport/federation.h"
#include "core/plugins/plugins.h"
#include "core/runtime/server_name.h"
#include "core/store/lease.h"
#include "core/store/notify.h"

#define HOST_ERR_LEN 512
#define RATELIMIT_MAX_KEYS 100000 /* client keys tracked per action */


struct atrium_line {
    rt_line *line;
    int64_t max_wait_ms;
};

/* ---- server, log, config ------------------------------------------------------------ */

static const char *h_server_name(void)
{
    return core_runtime_get()->cfg->server_name;
}

static void h_log(atrium_plugin *self, int level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    rt_vlog(level, self ? self->name : "plugin", fmt, ap);
    va_end(ap);
}

static int64_t h_now_ms(void)
{
    return rt_now_ms();
}

static int config_failed(atrium_plugin *self, const char *err)
{
    rt_log(ATRIUM_LOG_ERROR, self->name, "invalid configuration: %s", err);
    return ATRIUM_E_INVAL;
}

static int h_config_int(atrium_plugin *self, const atrium_config *cfg, const char *key,
                        int64_t def, int64_t min, int64_t max, int64_t *out)
{
    char err[HOST_ERR_LEN];
    if (cfg_read_int((const cfg_node *)cfg, key, def, min, max, out, err, sizeof(err)) < 0)
        return config_failed(self, err);
    return 0;
}

static int h_config_bool(atrium_plugin *self, const atrium_config *cfg, const char *key,
                         bool def, bool *out)
{
    char err[HOST_ERR_LEN];
    if (cfg_read_bool((const cfg_node *)cfg, key, def, out, err, sizeof(err)) < 0)
        return config_failed(self, err);
    return 0;
}

static int h_config_string(atrium_plugin *self, const atrium_config *cfg, const char *key,
                           const char *def, const char **out)
{
    char err[HOST_ERR_LEN];
    if (cfg_read_string((const cfg_node *)cfg, key, def, out, err, sizeof(err)) < 0)
        return config_failed(self, err);
    return 0;
}

static int h_config_load(atrium_plugin *self, const atrium_config *cfg, void *base)
{
    char err[HOST_ERR_LEN];
    if (!self->in_init) return ATRIUM_E_STATE;
    if (!base && self->n_settings) return ATRIUM_E_INVAL; /* no rows, no struct needed */
    if (plugin_settings_load(self, (const cfg_node *)cfg, base, err, sizeof(err)) < 0)
        return config_failed(self, err);
    return 0;
}

#define HOST_MAX_ALLOWED_KEYS 128

static int h_config_check_keys(atrium_plugin *self, const atrium_config *cfg,
                               const char *const *allowed)
{
    const char *all[HOST_MAX_ALLOWED_KEYS + 3];
    size_t n = 0;
    all[n++] = "enabled";
    all[n++] = "path";
    for (size_t i = 0; allowed && allowed[i] && n < HOST_MAX_ALLOWED_KEYS + 2; i++)
        all[n++] = allowed[i];
    all[n] = NULL;
    char err[HOST_ERR_LEN];
    if (cfg_check_keys((const cfg_node *)cfg, all, err, sizeof(err)) < 0)
        return config_failed(self, err);
    return 0;
}

static int require_init(atrium_plugin *self, const char *what)
{
    if (self && self->in_init) return 0;
    rt_log(ATRIUM_LOG_ERROR, self ? self->name : "plugin", "%s is only allowed during init", what);
    return ATRIUM_E_STATE;
}

#define ROUTE_KNOWN_FLAGS                                                                  \
    (ATRIUM_ROUTE_STREAM_BODY | ATRIUM_ROUTE_FEDERATION | ATRIUM_ROUTE_HEADERS_FIRST |      \
     ATRIUM_ROUTE_COMMITS)

static int h_route_add(atrium_plugin *self, const atrium_route *route)
{
    int rc = require_init(self, "route_add");
    if (rc < 0) return rc;
    if (route && (route->flags & ~ROUTE_KNOWN_FLAGS)) {
        rt_log(ATRIUM_LOG_ERROR, self->name,
               "route %s %s: unknown flags 0x%x (this server offers plugin ABI %d.%d)",
               route->method ? route->method : "?", route->path ? route->path : "?",
               route->flags & ~ROUTE_KNOWN_FLAGS, ATRIUM_ABI_MAJOR, ATRIUM_ABI_MINOR);
        return ATRIUM_E_INVAL;
    }
    if (route && (route->flags & ATRIUM_ROUTE_HEADERS_FIRST) &&
        (!(route->flags & ATRIUM_ROUTE_STREAM_BODY) || !route->body_chunk ||
         (route->flags & ATRIUM_ROUTE_FEDERATION))) {
        rt_log(ATRIUM_LOG_ERROR, self->name,
               "route %s %s: ATRIUM_ROUTE_HEADERS_FIRST needs ATRIUM_ROUTE_STREAM_BODY and a "
               "body_chunk, and is not for federation routes",
               route->method ? route->method : "?", route->path ? route->path : "?");
        return ATRIUM_E_INVAL;
    }
    char err[HOST_ERR_LEN];
    rc = router_add(core_runtime_get()->http->router, route, self->name, err, sizeof(err));
    if (rc < 0) rt_log(ATRIUM_LOG_ERROR, self->name, "%s", err);
    return rc;
}

static int h_db_migrations(atrium_plugin *self, const atrium_migration *list, size_t n)
{
    int rc = require_init(self, "db_migrations");
    if (rc < 0) return rc;
    self->migrations = list;
    self->n_migrations = n;
    return 0;
}

/* ---- request -------------------------------------------------------------------------- */

static const char *h_req_method(atrium_req *r) { return r->method; }
static const char *h_req_path(atrium_req *r) { return r->path; }
static const char *h_req_id(atrium_req *r) { return r->id; }
static void *h_req_route_arg(atrium_req *r) { return r->route ? r->route->route.arg : NULL; }
static int h_req_run_reason(atrium_req *r) { return r->run_reason; }
static void *h_req_state(atrium_req *r) { return r->plugin_state; }
static void h_req_set_state(atrium_req *r, void *state) { r->plugin_state = state; }
static const char *h_req_client_key(atrium_req *r) { return http_req_client_key(r); }
static const char *h_req_param(atrium_req *r, const char *name) { return http_req_param(r, name); }
static const char *h_req_query(atrium_req *r, const char *name) { return http_req_query(r, name); }
static const char *h_req_header(atrium_req *r, const char *name) { return http_req_header(r, name); }
static void *h_req_alloc(atrium_req *r, size_t size) { return rt_arena_alloc(r->arena, size); }
static char *h_req_strdup(atrium_req *r, const char *s) { return rt_arena_strdup(r->arena, s); }

static const char *h_req_body(atrium_req *r, size_t *len)
{
    /* A streamed body went to body_chunk: body_len counts it (for max_body_bytes), but
     * nothing is buffered, so the buffered body is empty, as host.h says. */
    if (len) *len = r->body ? r->body_len : 0;
    return r->body ? r->body : "";
}

static json_t *h_req_json(atrium_req *r) { return http_req_json(r); }

static const char *h_req_authenticate(atrium_req *r) { return auth_request(r); }
static const char *h_req_device(atrium_req *r) { return r->device; }
static int h_req_is_admin(atrium_req *r) { return auth_is_admin(r); }

static int h_req_hold(atrium_req *r, void (*release)(void *), void *arg)
{
    return http_req_add_hold(r, release, arg);
}

/* ---- responses ---------------------------------------------------------------------- */

static int h_respond_error(atrium_req *r, int status, const char *errcode, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return http_respond_error(r, status, errcode, "%s", msg);
}

/* ---- scopes, pools, handoff, parking -------------------------------------------------- */

static void *h_scope_get(int key) { return rt_scope_get(key); }

static atrium_pool *h_pool_create(atrium_plugin *self, const char *name, int threads,
                                  int queue_depth)
{
    if (require_init(self, "pool_create") < 0 || self->n_pools == PLUGIN_MAX_POOLS) return NULL;
    char full[128];
    snprintf(full, sizeof(full), "%s.%s", self->name, name);
    rt_pool *p = rt_pool_new(full, threads, queue_depth, core_runtime_get()->metrics);
    if (p) self->pools[self->n_pools++] = p;
    return (atrium_pool *)p;
}

static int h_pool_submit(atrium_pool *pool, void (*fn)(void *, bool), void *arg)
{
    return rt_pool_submit((rt_pool *)pool, fn, arg);
}

static void h_pool_stop(atrium_pool *pool) { rt_pool_stop((rt_pool *)pool); }

/* The waits a handler may start; a body_chunk callback may not (host.h, atrium_route). */
static int refuse_in_body_chunk(atrium_req *r, const char *what)
{
    if (!r->in_body_chunk) return 0;
    rt_log(ATRIUM_LOG_ERROR, "core", "[req %s] %s called from body_chunk: refused (%s)", r->id,
           what, atrium_err_name(ATRIUM_E_STATE));
    return ATRIUM_E_STATE;
}

static int h_handoff(atrium_req *r, atrium_pool *pool, const atrium_scope_value *vals, size_t n)
{
    int rc = refuse_in_body_chunk(r, "handoff");
    return rc < 0 ? rc : susp_handoff(r, (rt_pool *)pool, vals, n);
}

static atrium_event *h_event_create(atrium_plugin *self)
{
    if (require_init(self, "event_create") < 0) return NULL;
    return susp_event_new(core_runtime_get()->http);
}

static int h_park(atrium_req *r, atrium_event *ev, int64_t deadline_ms)
{
    int rc = refuse_in_body_chunk(r, "park");
    return rc < 0 ? rc : susp_park(r, ev, deadline_ms);
}

static int h_event_signal(atrium_event *ev) { return susp_event_signal(ev); }

/* ---- budgets, lines, outbound, rate limits -------------------------------------------- */

static atrium_budget *h_budget_create(atrium_plugin *self, const char *name, int global_cap,
                                      int per_key_cap)
{
    if (require_init(self, "budget_create") < 0) return NULL;
    char full[128];
    snprintf(full, sizeof(full), "%s.%s", self->name, name);
    rt_budget *b = rt_budget_new(full, global_cap, per_key_cap, core_runtime_get()->metrics);
    if (!b || !plugin_own(self, (void (*)(void *))rt_budget_free, b)) return NULL;
    return (atrium_budget *)b;
}

static int h_budget_try_acquire(atrium_budget *b, const char *key)
{
    return rt_budget_try_acquire((rt_budget *)b, key, NULL);
}

static void h_budget_release(atrium_budget *b, const char *key)
{
    rt_budget_release((rt_budget *)b, key);
}

typedef struct budget_hold {
    rt_budget *b;
    const char *key;
} budget_hold;

static void budget_hold_release(void *arg)
{
    budget_hold *h = arg;
    rt_budget_release(h->b, h->key);
}

/* until_answer: given back once the answer is queued (the outbound budget), not when the
 * request ends. */
static int acquire_as_hold(atrium_req *r, rt_budget *b, bool until_answer)
{
    const char *key = http_req_client_key(r);
    int rc = rt_budget_try_acquire(b, key, NULL);
    if (rc < 0) return rc;
    budget_hold *h = rt_arena_alloc(r->arena, sizeof(*h));
    if (!h) {
        rt_budget_release(b, key);
        return ATRIUM_E_NOMEM;
    }
    h->b = b;
    h->key = key;
    return until_answer ? http_req_add_answer_hold(r, budget_hold_release, h)
                        : http_req_add_hold(r, budget_hold_release, h);
}

static int h_budget_acquire_hold(atrium_req *r, atrium_budget *b)
{
    return acquire_as_hold(r, (rt_budget *)b, false);
}

static void line_free(void *obj)
{
    atrium_line *l = obj;
    rt_line_free(l->line);
    free(l);
}

/* The rule for every plugin's admission line: a client key holds at most
 * server.http.line_share_per_client_percent of its slots (rounded up, at least one); 0
 * (no bound) when that is every slot. */
static int line_holding_cap(int slots)
{
    const core_runtime *rt = core_runtime_get();
    int pct = rt && rt->cfg ? rt->cfg->http.line_share_per_client_percent : 100;
    int cap = (int)(((long)slots * pct + 99) / 100);
    if (cap < 1) cap = 1;
    return cap >= slots ? 0 : cap;
}

static atrium_line *h_line_create(atrium_plugin *self, const char *name, int slots,
                                  int max_waiting, int max_waiting_per_key, int64_t max_wait_ms)
{
    if (require_init(self, "line_create") < 0) return NULL;
    char full[128];
    snprintf(full, sizeof(full), "%s.%s", self->name, name);
    atrium_line *l = calloc(1, sizeof(*l));
    if (!l) return NULL;
    l->line = rt_line_new(full, slots, max_waiting, max_waiting_per_key, core_runtime_get()->metrics);
    l->max_wait_ms = max_wait_ms;
    if (!l->line) {
        free(l);
        return NULL;
    }
    rt_line_limit_holding(l->line, line_holding_cap(slots));
    if (!plugin_own(self, line_free, l)) return NULL;
    return l;
}

static int h_line_admit(atrium_req *r, atrium_line *line)
{
    int rc = refuse_in_body_chunk(r, "line_admit");
    return rc < 0 ? rc : susp_line_admit(r, line->line, line->max_wait_ms);
}

static int h_outbound_acquire(atrium_req *r)
{
    return acquire_as_hold(r, core_runtime_get()->http->outbound, true);
}

static atrium_ratelimit *h_ratelimit_create(atrium_plugin *self, const char *action,
                                            double per_second, double burst)
{
    if (require_init(self, "ratelimit_create") < 0) return NULL;
    char full[128];
    snprintf(full, sizeof(full), "%s.%s", self->name, action);
    rt_ratelimit *rl = rt_ratelimit_new(full, per_second, burst, RATELIMIT_MAX_KEYS,
                                        core_runtime_get()->metrics);
    if (!rl || !plugin_own(self, (void (*)(void *))rt_ratelimit_free, rl)) return NULL;
    return (atrium_ratelimit *)rl;
}

static int64_t h_ratelimit_check(atrium_req *r, atrium_ratelimit *rl)
{
    return http_req_ratelimit(r, (rt_ratelimit *)rl);
}

/* ---- metrics, db ---------------------------------------------------------------------- */

static bool metric_name_ok(atrium_plugin *self, const char *name)
{
    char prefix[96];
    snprintf(prefix, sizeof(prefix), "atrium_%s_", self->name);
    for (char *p = prefix; *p; p++)
        if (*p == '-') *p = '_';
    if (strncmp(name, prefix, strlen(prefix)) == 0) return true;
    rt_log(ATRIUM_LOG_ERROR, self->name, "metric \"%s\" must start with \"%s\"", name, prefix);
    return false;
}

static atrium_metric *h_metric_counter(atrium_plugin *self, const char *name, const char *labels,
                                       const char *help)
{
    if (require_init(self, "metric_counter") < 0 || !metric_name_ok(self, name)) return NULL;
    return (atrium_metric *)rt_metric_counter(core_runtime_get()->metrics, name, labels, help);
}

static atrium_metric *h_metric_gauge(atrium_plugin *self, const char *name, const char *labels,
                                     const char *help)
{
    if (require_init(self, "metric_gauge") < 0 || !metric_name_ok(self, name)) return NULL;
    return (atrium_metric *)rt_metric_gauge(core_runtime_get()->metrics, name, labels, help);
}

static void h_metric_add(atrium_metric *m, int64_t d) { rt_metric_add((rt_metric *)m, d); }
static void h_metric_set(atrium_metric *m, int64_t v) { rt_metric_set((rt_metric *)m, v); }
static PGconn *h_db_acquire(int64_t timeout_ms)
{
    /* DB_WAIT_CONFIGURED is the core's own marker, not part of the ABI: a negative wait
     * from a plugin stays "do not wait". */
    return db_acquire(core_runtime_get()->db, timeout_ms < 0 ? 0 : timeout_ms);
}
static int64_t h_db_wait_ms(void) { return db_request_wait_ms(core_runtime_get()->db); }
static void h_db_release(PGconn *c) { db_release(core_runtime_get()->db, c); }

/* ---- federation (1.1) ------------------------------------------------------------------ */

static const char *h_req_origin(atrium_req *r) { return r->origin; }

/* A plugin's federation request: its callbacks, behind the core's fed_request_opts. */
typedef struct plugin_fed_req {
    int (*on_chunk)(void *arg, const atrium_fed_response *res, const char *data, size_t len);
    void (*on_done)(void *arg, const atrium_fed_response *res);
    void *arg;
} plugin_fed_req;

static int h_fed_chunk(void *arg, fed_http_handle *hd, const char *data, size_t len)
{
    plugin_fed_req *p = arg;
    atrium_fed_response res = {.outcome = ATRIUM_FED_OK, .status = fed_http_handle_status(hd),
                               .error = "", .internal = hd};
    return p->on_chunk(p->arg, &res, data, len);
}

static void h_fed_done(void *arg, const fed_response *fr)
{
    plugin_fed_req *p = arg;
    /* The outcome numbers of fed_http.h and fed_request.h are the ABI's. */
    atrium_fed_response res = {.outcome = fr->outcome, .status = fr->status, .json = fr->json,
                               .body = fr->body, .body_len = fr->body_len,
                               .error = fr->error ? fr->error : "",
                               .destination = fr->destination, .internal = fr->handle};
    p->on_done(p->arg, &res);
    free(p);
}

static int h_fed_request(const atrium_fed_request *q)
{
    if (!q || q->size < offsetof(atrium_fed_request, arg) + sizeof(q->arg) || !q->on_done)
        return ATRIUM_E_INVAL;
    const char *url = ATRIUM_FED_REQUEST_HAS(q, url) ? q->url : NULL;
    if (url && (!q->method || strcmp(q->method, "GET") != 0 || q->body))
        return ATRIUM_E_INVAL; /* the ABI's URL request is a GET (include/atrium/host.h) */
    plugin_fed_req *p = malloc(sizeof(*p));
    if (!p) return ATRIUM_E_NOMEM;
    *p = (plugin_fed_req){.on_chunk = q->on_chunk, .on_done = q->on_done, .arg = q->arg};
    fed_request_opts o = {.method = q->method, .destination = q->destination, .uri = q->uri,
                          .body = q->body, .deadline_ms = q->deadline_ms,
                          .max_body_bytes = q->max_body_bytes,
                          .unsigned_request = (q->flags & ATRIUM_FED_UNSIGNED) != 0,
                          .ignore_backoff = (q->flags & ATRIUM_FED_IGNORE_BACKOFF) != 0,
                          .want_json = (q->flags & ATRIUM_FED_JSON) != 0,
                          .on_chunk = q->on_chunk ? h_fed_chunk : NULL,
                          .on_done = h_fed_done, .arg = p, .url = url,
                          .url_allow_http = url && (q->flags & ATRIUM_FED_ALLOW_HTTP) != 0};
    int rc = fed_request_submit(&o);
    if (rc < 0) free(p);
    return rc;
}

static const char *h_fed_response_header(const atrium_fed_response *res, const char *name)
{
    return res && res->internal ? fed_http_handle_header(res->internal, name) : NULL;
}

static int h_req_wait(atrium_req *r, int64_t deadline_ms)
{
    int rc = refuse_in_body_chunk(r, "req_wait");
    return rc < 0 ? rc : susp_wait(r, deadline_ms);
}
static void h_req_wake(atrium_req *r) { susp_wake(r); }
static int h_fed_sign_json(json_t *obj) { return federation_sign_json(obj); }

static int h_iface_provide(atrium_plugin *self, const char *name, const void *iface)
{
    int rc = require_init(self, "iface_provide");
    if (rc < 0) return rc;
    if (!name || !self->desc->provides || strcmp(name, self->desc->provides) != 0) {
        rt_log(ATRIUM_LOG_ERROR, self->name, "iface_provide(\"%s\"): a plugin provides only the "
               "interface its descriptor names in .provides (\"%s\")", name ? name : "(null)",
               self->desc->provides ? self->desc->provides : "none");
        return ATRIUM_E_INVAL;
    }
    return rt_iface_add(self->name, self->desc->provides, iface);
}

/* ---- several processes (1.3) -------------------------------------------------------- */

static const char *h_instance_name(void) { return rt_log_instance_name(); }

#define HOST_LEASE_NAME_MAX 40 /* the plugin's part of a lease name (host.h) */

static atrium_lease *h_lease_create(atrium_plugin *self, const char *name, int64_t ttl_ms)
{
    if (require_init(self, "lease_create") < 0) return NULL;
    core_runtime *rt = core_runtime_get();
    size_t n = name ? strlen(name) : 0;
    char full[LEASE_NAME_MAX_BYTES];
    if (!rt || !rt->leases || n == 0 || n > HOST_LEASE_NAME_MAX ||
        snprintf(full, sizeof(full), "plugin.%s.%s", self->name, name) >= (int)sizeof(full)) {
        rt_log(ATRIUM_LOG_ERROR, self->name, "lease_create(\"%s\"): %s", name ? name : "(null)",
               rt && rt->leases ? "a name is 1-40 characters of [a-z0-9_.]"
                                : "this process has no lease service");
        return NULL;
    }
    lease *l = lease_create(rt->leases, full, ttl_ms, NULL, NULL);
    if (!l)
        rt_log(ATRIUM_LOG_ERROR, self->name, "lease_create(\"%s\", %lld ms): a name is 1-40 "
               "characters of [a-z0-9_.], created once; a ttl is 1 s to 10 min", name,
               (long long)ttl_ms);
    return (atrium_lease *)l;
}

static int h_lease_held(atrium_lease *l) { return l && lease_held((const lease *)l) ? 1 : 0; }


#define PLUGIN_CHANNEL_MAX 40 /* the ABI's channel names: 1-40 characters of [a-z0-9_.] */

/* The PostgreSQL channel of a plugin's `channel`: "<plugin>:<channel>", or, when that
 * passes PostgreSQL's identifier limit, "#<hash of the plugin name>:<channel>". Channels
 * cannot hold ':' and the core's own have none, so two plugins, or a plugin and the core,
 * never share one. false (logged) on a bad name. */
static bool plugin_channel(atrium_plugin *self, const char *channel, char *out, size_t len)
{
    size_t n = channel ? strlen(channel) : 0;
    bool ok = n > 0 && n <= PLUGIN_CHANNEL_MAX;
    for (size_t i = 0; ok && i < n; i++) {
        char ch = channel[i];
        ok = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '.';
    }
    if (!ok) {
        rt_log(ATRIUM_LOG_ERROR, self->name, "notification channel \"%s\" must be 1 to %d "
               "characters of a-z, 0-9, _ and .", channel ? channel : "(null)",
               PLUGIN_CHANNEL_MAX);
        return false;
    }
    int w = snprintf(out, len, "%s:%s", self->name, channel);
    if (w < 0 || (size_t)w >= len || !notify_channel_ok(out)) {
        uint32_t h = 2166136261u; /* FNV-1a of the plugin's name */
        for (const char *c = self->name; *c; c++) h = (h ^ (unsigned char)*c) * 16777619u;
        snprintf(out, len, "#%08x:%s", (unsigned)h, channel);
    }
    return true;
}

static int h_notify_subscribe(atrium_plugin *self, const char *channel,
                              void (*cb)(void *arg, const char *payload), void *arg)
{
    int rc = require_init(self, "notify_subscribe");
    if (rc < 0) return rc;
    char pg[NOTIFY_MAX_CHANNEL_BYTES + 1];
    if (!cb || !plugin_channel(self, channel, pg, sizeof(pg))) return ATRIUM_E_INVAL;
    notify_service *s = core_runtime_get()->notify;
    if (!s) return ATRIUM_E_STATE;
    /* The plugin's init runs before the service starts (core/main.c), so this cannot fail
     * for "started"; a full table is the one refusal left. */
    return notify_subscribe(s, pg, 0, cb, arg) < 0 ? ATRIUM_E_LIMIT : 0;
}

static int h_notify_publish(atrium_plugin *self, PGconn *conn, const char *channel,
                            const char *payload)
{
    char pg[NOTIFY_MAX_CHANNEL_BYTES + 1];
    if (!self || !plugin_channel(self, channel, pg, sizeof(pg))) return ATRIUM_E_INVAL;
    if (!payload || strlen(payload) > ATRIUM_NOTIFY_MAX_PAYLOAD) {
        rt_log(ATRIUM_LOG_ERROR, self->name, "notify_publish on \"%s\": the payload must be "
               "text of at most %d bytes", channel, ATRIUM_NOTIFY_MAX_PAYLOAD);
        return ATRIUM_E_INVAL;
    }
    if (conn) return notify_publish_in(conn, pg, payload) < 0 ? ATRIUM_E_DB : 0;
    core_runtime *rt = core_runtime_get();
    PGconn *c = db_acquire(rt->db, db_request_wait_ms(rt->db));
    if (!c) return ATRIUM_E_DB;
    int rc = notify_publish_in(c, pg, payload) < 0 ? ATRIUM_E_DB : 0;
    db_release(rt->db, c);
    return rc;
}

static int h_notify_live(void) { return notify_live(core_runtime_get()->notify) ? 1 : 0; }

static int h_server_name_valid(const char *name)
{
    return rt_server_name_valid(name) ? 1 : 0;
}

static int64_t h_wall_ms(void) { return rt_wall_ms(); }

/* The plugin's atrium_sha256 holds libsodium's state: the public struct is sized and
 * aligned for it (checked here, pinned in tests/unit/test_abi.c). */
_Static_assert(sizeof(crypto_hash_sha256_state) <= sizeof(atrium_sha256) &&
                   _Alignof(crypto_hash_sha256_state) <= _Alignof(atrium_sha256),
               "atrium_sha256 holds crypto_hash_sha256_state");

static int h_sha256_init(atrium_sha256 *ctx)
{
    if (!ctx) return ATRIUM_E_INVAL;
    crypto_hash_sha256_init((crypto_hash_sha256_state *)(void *)ctx);
    return 0;
}

static int h_sha256_update(atrium_sha256 *ctx, const void *data, size_t len)
{
    if (!ctx || (!data && len)) return ATRIUM_E_INVAL;
    if (len) crypto_hash_sha256_update((crypto_hash_sha256_state *)(void *)ctx, data, len);
    return 0;
}

static int h_sha256_final(atrium_sha256 *ctx, unsigned char out[ATRIUM_SHA256_BYTES])
{
    if (!ctx || !out) return ATRIUM_E_INVAL;
    crypto_hash_sha256_final((crypto_hash_sha256_state *)(void *)ctx, out);
    crypto_hash_sha256_init((crypto_hash_sha256_state *)(void *)ctx);
    return 0;
}

static int h_respond_stream_wait(atrium_req *r, int status, const char *content_type,
                                 int64_t size, atrium_stream_read read, void *arg,
                                 void (*free_arg)(void *), atrium_event *ev, int64_t deadline_ms)
{
    return http_respond_stream_wait(r, status, content_type, size, read, arg, free_arg,
                                    (struct atrium_event *)ev, deadline_ms);
}

static const char *h_req_appservice(atrium_req *r)
{
    const as_service *svc = as_of_request(r);
    return svc ? svc->id : NULL;
}

static int h_alias_exclusive(atrium_req *r, const char *alias)
{
    return alias && as_alias_exclusive_elsewhere(alias, as_of_request(r)) ? 1 : 0;
}

/* ---- single flight (1.8): core/runtime/flight.c, parked by core/http/suspend.c ------------ */

static atrium_flights *h_flights_create(atrium_plugin *self, const char *name, int max_keys,
                                        int max_waiters)
{
    if (require_init(self, "flights_create") < 0) return NULL;
    char full[128];
    snprintf(full, sizeof(full), "%s.%s", self->name, name);
    rt_flights *t = rt_flights_new(full, max_keys, max_waiters, core_runtime_get()->metrics);
    if (!t || !plugin_own(self, (void (*)(void *))rt_flights_free, t)) return NULL;
    return (atrium_flights *)t;
}

static int h_flight_join(atrium_req *r, atrium_flights *t, const char *key, int64_t deadline_ms,
                         unsigned flags, atrium_flight **out)
{
    _Static_assert(ATRIUM_FLIGHT_JOIN_ONLY == RT_FLIGHT_JOIN_ONLY &&
                       ATRIUM_FLIGHT_EARLY == RT_FLIGHT_EARLY &&
                       ATRIUM_FLIGHT_EARLY_ONLY == RT_FLIGHT_EARLY_ONLY &&
                       (int)ATRIUM_FLIGHT_PUBLISHED == (int)RT_FLIGHT_PUBLISHED &&
                       ATRIUM_FLIGHT_RESULT_EARLY == (int)RT_FLIGHT_RESULT_EARLY,
                   "one flag, two names");
    int rc = refuse_in_body_chunk(r, "flight_join");
    if (rc < 0) return rc;
    rt_flight *f = NULL;
    rc = susp_flight_join(r, (rt_flights *)t, key, deadline_ms, flags, &f);
    if (rc >= 0) *out = (atrium_flight *)f;
    return rc;
}

static void h_flight_finish(atrium_flight *f, int result, void *value, void (*free_value)(void *))
{
    rt_flight_finish((rt_flight *)f, result, value, free_value);
}

static int h_flight_result(atrium_req *r, atrium_flight *f, int *result, void **value)
{
    return susp_flight_result(r, (rt_flight *)f, result, value);
}

static int h_flight_wanted(atrium_flight *f) { return rt_flight_wanted((rt_flight *)f); }

static int h_flight_publish(atrium_flight *f, int result, void *value, void (*free_value)(void *))
{
    return rt_flight_publish((rt_flight *)f, result, value, free_value) ? 0 : ATRIUM_E_STATE;
}

static void h_flight_unpublish(atrium_flight *f) { rt_flight_unpublish((rt_flight *)f); }

static const atrium_host HOST = {
    .size = sizeof(atrium_host),
    .abi_major = ATRIUM_ABI_MAJOR,
    .abi_minor = ATRIUM_ABI_MINOR,
    .server_name = h_server_name,
    .log = h_log,
    .now_ms = h_now_ms,
    .config_int = h_config_int,
    .config_bool = h_config_bool,
    .config_string = h_config_string,
    .config_check_keys = h_config_check_keys,
    .route_add = h_route_add,
    .db_migrations = h_db_migrations,
    .req_method = h_req_method,
    .req_path = h_req_path,
    .req_param = h_req_param,
    .req_query = h_req_query,
    .req_header = h_req_header,
    .req_body = h_req_body,
    .req_json = h_req_json,
    .req_client_key = h_req_client_key,
    .req_id = h_req_id,
    .req_route_arg = h_req_route_arg,
    .req_run_reason = h_req_run_reason,
    .req_alloc = h_req_alloc,
    .req_strdup = h_req_strdup,
    .req_state = h_req_state,
    .req_set_state = h_req_set_state,
    .req_hold = h_req_hold,
    .req_authenticate = h_req_authenticate,
    .req_device = h_req_device,
    .req_is_admin = h_req_is_admin,
    .respond_header = http_respond_header,
    .respond_json = http_respond_json,
    .respond_buffer = http_respond_buffer,
    .respond_file = http_respond_file,
    .respond_stream = http_respond_stream,
    .respond_error = h_respond_error,
    .respond_limited = http_respond_limited,
    .scope_get = h_scope_get,
    .scope_wait = rt_scope_wait,
    .cond_init = rt_cond_init,
    .pool_create = h_pool_create,
    .pool_submit = h_pool_submit,
    .pool_stop = h_pool_stop,
    .handoff = h_handoff,
    .event_create = h_event_create,
    .park = h_park,
    .event_signal = h_event_signal,
    .budget_create = h_budget_create,
    .budget_try_acquire = h_budget_try_acquire,
    .budget_release = h_budget_release,
    .budget_acquire_hold = h_budget_acquire_hold,
    .line_create = h_line_create,
    .line_admit = h_line_admit,
    .outbound_acquire = h_outbound_acquire,
    .ratelimit_create = h_ratelimit_create,
    .ratelimit_check = h_ratelimit_check,
    .metric_counter = h_metric_counter,
    .metric_gauge = h_metric_gauge,
    .metric_add = h_metric_add,
    .metric_set = h_metric_set,
    .db_acquire = h_db_acquire,
    .db_release = h_db_release,
    .config_load = h_config_load,
    .db_wait_ms = h_db_wait_ms,
    .req_origin = h_req_origin,
    .fed_request = h_fed_request,
    .fed_response_header = h_fed_response_header,
    .req_wait = h_req_wait,
    .req_wake = h_req_wake,
    .fed_sign_json = h_fed_sign_json,
    .fed_verify_json = federation_verify_json,
    .iface_provide = h_iface_provide,
    .iface_get = rt_iface_get,
    .instance_name = h_instance_name,
    .notify_subscribe = h_notify_subscribe,
    .notify_publish = h_notify_publish,
    .notify_live = h_notify_live,
    .lease_create = h_lease_create,
    .lease_held = h_lease_held,
    .respond_stream_wait = h_respond_stream_wait,
    .server_name_valid = h_server_name_valid,
    .wall_ms = h_wall_ms,
    .sha256_init = h_sha256_init,
    .sha256_update = h_sha256_update,
    .sha256_final = h_sha256_final,
    .req_appservice = h_req_appservice,
    .alias_exclusive = h_alias_exclusive,
    .alias_query = as_query_alias,
    .flights_create = h_flights_create,
    .flight_join = h_flight_join,
    .flight_finish = h_flight_finish,
    .flight_result = h_flight_result,
    .flight_wanted = h_flight_wanted,
    .flight_publish = h_flight_publish,
    .flight_unpublish = h_flight_unpublish,
};

const atrium_host *host_table(core_runtime *rt)
{
    RT_ASSERT(rt == core_runtime_get(), "%s", "the host table serves the bound runtime object");
    return &HOST;
}
