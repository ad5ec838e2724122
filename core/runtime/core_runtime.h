/*
 * core/runtime/core_runtime.h - the runtime object: what the running process owns, in one
 * place (the role of Redis's struct redisServer and nginx's ngx_cycle_t). core/main.c
 * builds it in start-up order, binds it once before any module's init, and unbinds it
 * after the last thread that reads it has stopped; the client modules receive it in
 * init, start and stop (core/client/client.h), the loader and the host table serve
 * plugins from it (core/plugins/).
 *
 * Its members are written only by the main thread: during start-up, before the listener
 * opens, and during shutdown, where a member is cleared after what it points to has
 * stopped taking work. Reading them needs no lock. Code with no path to the object (a
 * handler deep in a call chain, a module's own thread) reads it with core_runtime_get.
 *
 * Not here yet: last-seen times (core/client/auth/auth_seen.c), the typing reaper
 * (core/client/rooms/crooms_typing.c) and /sync's sections (core/client/sync/sync.c) keep
 * file-level state behind their own functions. Internal prefix: core_runtime_.
 */
#ifndef ATRIUM_CORE_RUNTIME_OBJECT_H
#define ATRIUM_CORE_RUNTIME_OBJECT_H

#include <stddef.h>

#include "core/runtime/runtime.h"

struct atrium_plugin;
struct auth_cache;
struct cfg_node;
struct core_config;
struct db_pool;
struct http_server;
struct lease_service;
struct notifier;
struct notify_service;

/* The client API's rate limiters (core/client/ratelimits.c creates them). */
typedef struct core_limits {
    rt_ratelimit *registration, *login, *message; /* ratelimit.{register,login,message}.* */
    rt_ratelimit *sync;                           /* ratelimit.sync.* (core/client/sync/) */
} core_limits;

typedef struct core_runtime {
    const struct core_config *cfg;   /* the settings, checked */
    const struct cfg_node *root;     /* the configuration tree (plugins read their part) */
    rt_metrics *metrics;             /* every metric of the process */
    struct http_server *http;        /* the listener, its request pool, router, budgets */
    struct db_pool *db;              /* the PostgreSQL pool of the core and plugins */
    struct lease_service *leases;    /* once-only jobs' leases (core/store/lease.h) */
    struct notifier *notifier;       /* users' wake-up events (core/client/sync/notifier.h) */
    struct notify_service *notify;   /* LISTEN/NOTIFY between processes (core/store/notify.h) */
    rt_pool *auth_pool;              /* core.auth: Argon2id hashing and checks */
    struct auth_cache *auth_cache;   /* token -> user (core/client/auth/auth.h) */
    rt_pool *rooms_bulk_pool;        /* core.rooms_bulk: writes into many rooms at once */
    rt_pool *rooms_remote_pool;      /* core.rooms_remote: room requests waiting on peers */
    rt_pool *e2ee_resync_pool;       /* core.e2ee_resync: device-list resyncs (ADR-0024) */
    rt_pool *sync_woken_pool;        /* core.sync_woken: woken long-polls run here, not on
                                      * the request pool (core/client/sync/sync.h) */
    rt_budget *e2ee_resync_budget;   /* its slots, per server */
    core_limits limits;
    struct atrium_plugin **plugins;  /* loaded plugins, in load order */
    size_t n_plugins;
} core_runtime;

/* Bind rt as the process's runtime object (NULL unbinds). Main thread, at start-up before
 * any module's init, and at the end after every other thread stopped. */
void core_runtime_bind(core_runtime *rt);
/* The bound runtime object, or NULL when none is bound (unit tests, CLI subcommands).
 * Any thread. */
core_runtime *core_runtime_get(void);

#endif
