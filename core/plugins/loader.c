/*
 * core/plugins/loader.c - finding, checking and running the lifecycle of plugins.
 *
 * A plugin is loaded only when its config says plugins.<name>.enabled: true (an explicit
 * allow-list, never "everything in a folder"). The handshake asks, in order: can it be
 * loaded (dlopen RTLD_NOW|RTLD_LOCAL, so unresolved symbols fail now and a plugin cannot
 * reach core symbols), is it an Atrium plugin (entry symbol, magic, size), is it built for
 * this contract (ABI major equal, minor not newer) and this platform (build signature),
 * is it the plugin the config named, does it bring the mandatory callback, and does no
 * other plugin provide the same interface; after init, a plugin providing media/1 must
 * have registered the routes include/atrium/media.h requires, and a failed init is logged
 * with its error's name. Every refusal is one line naming the file, what it wants, what
 * the server has and what to do, and stops start-up: a server silently missing its media
 * module is worse than one that does not start.
 * Plugins are never dlclose'd.
 */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atrium/media.h"
#include "core/plugins/plugins.h"

#define DESC_V1_SIZE (offsetof(atrium_plugin_desc, fini) + sizeof(void (*)(void *)))

static void refuse(const char *name, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void refuse(const char *name, const char *path, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    rt_log(ATRIUM_LOG_ERROR, "core", "plugin \"%s\" (%s): %s", name, path, msg);
}

static const char *plugin_path(core_runtime *rt, const cfg_node *pcfg, const char *name,
                               char *buf, size_t len)
{
    const char *path = NULL;
    char err[256];
    if (cfg_read_string(pcfg, "path", NULL, &path, err, sizeof(err)) == 0 && path && *path)
        return path;
    snprintf(buf, len, "%s/%s.so", rt->cfg->plugin_dir, name);
    return buf;
}

const atrium_plugin_desc *plugin_handshake(const char *name, const char *path, void **dl_out)
{
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        refuse(name, path, "cannot load: %s - check plugins.%s.path or plugin_dir", dlerror(),
               name);
        return NULL;
    }
    atrium_plugin_entry_fn entry;
    *(void **)&entry = dlsym(dl, ATRIUM_PLUGIN_ENTRY_SYMBOL);
    if (!entry) {
        refuse(name, path,
               "no %s() - not an Atrium plugin, or built without ATRIUM_PLUGIN(...)",
               ATRIUM_PLUGIN_ENTRY_SYMBOL);
        return NULL;
    }
    const atrium_plugin_desc *d = entry();
    if (!d || d->magic != ATRIUM_PLUGIN_MAGIC || d->size < DESC_V1_SIZE) {
        refuse(name, path, "bad descriptor (magic or size) - not an Atrium plugin descriptor");
        return NULL;
    }
    if (d->abi_major != ATRIUM_ABI_MAJOR) {
        refuse(name, path,
               "built for plugin ABI %u.x, this server provides %d.%d - use a build of the "
               "plugin for Atrium plugin ABI %d.x",
               d->abi_major, ATRIUM_ABI_MAJOR, ATRIUM_ABI_MINOR, ATRIUM_ABI_MAJOR);
        return NULL;
    }
    if (d->abi_minor > ATRIUM_ABI_MINOR) {
        refuse(name, path,
               "needs plugin ABI %u.%u, this server provides %d.%d - upgrade Atrium or use an "
               "older build of the plugin",
               d->abi_major, d->abi_minor, ATRIUM_ABI_MAJOR, ATRIUM_ABI_MINOR);
        return NULL;
    }
    if (!d->build_sig || strcmp(d->build_sig, ATRIUM_BUILD_SIG) != 0) {
        refuse(name, path,
               "build signature \"%s\" differs from the server's \"%s\" - rebuild the plugin "
               "for this platform",
               d->build_sig ? d->build_sig : "(none)", ATRIUM_BUILD_SIG);
        return NULL;
    }
    if (!d->name || strcmp(d->name, name) != 0) {
        refuse(name, path, "file declares name \"%s\"; configure it as plugins.%s instead",
               d->name ? d->name : "(none)", d->name ? d->name : "<name>");
        return NULL;
    }
    if (!d->init) {
        refuse(name, path, "descriptor has no init callback - the plugin is incomplete");
        return NULL;
    }
    *dl_out = dl;
    return d;
}

/* The routes a media/1 plugin must register (atrium/media.h), checked after its init:
 * a replacement missing one is refused at start-up rather than answering 404 later. */
static int contract_check(core_runtime *rt, const atrium_plugin *p)
{
    if (!p->desc->provides || strcmp(p->desc->provides, ATRIUM_MEDIA_IFACE) != 0) return 0;
    static const struct {
        const char *method, *path;
        int cls;
    } routes[] = {
#define CONTRACT_ROUTE_(name, method, path, cls) {method, path, cls},
        ATRIUM_MEDIA_ROUTES(CONTRACT_ROUTE_)
#undef CONTRACT_ROUTE_
    };
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
        if (routes[i].cls != ATRIUM_MEDIA_REQUIRED) continue;
        const char *owner = router_owner(rt->http->router, routes[i].method, routes[i].path);
        if (owner && strcmp(owner, p->name) == 0) continue;
        rt_log(ATRIUM_LOG_ERROR, "core",
               "plugin \"%s\" (%s) provides %s but does not serve %s %s, which that contract "
               "requires (include/atrium/media.h) - use a complete build of the plugin",
               p->name, p->path, ATRIUM_MEDIA_IFACE, routes[i].method, routes[i].path);
        return -1;
    }
    return 0;
}

static int load_one(core_runtime *rt, const atrium_host *host, const cfg_node *pcfg,
                    const char *name)
{
    char buf[1024];
    const char *path = plugin_path(rt, pcfg, name, buf, sizeof(buf));
    void *dl = NULL;
    const atrium_plugin_desc *d = plugin_handshake(name, path, &dl);
    if (!d) return -1;
    for (size_t i = 0; i < rt->n_plugins; i++) {
        const atrium_plugin_desc *o = rt->plugins[i]->desc;
        if (d->provides && o->provides && strcmp(d->provides, o->provides) == 0) {
            rt_log(ATRIUM_LOG_ERROR, "core",
                   "plugins \"%s\" and \"%s\" both provide \"%s\" - disable one of them",
                   rt->plugins[i]->name, name, d->provides);
            return -1;
        }
    }
    atrium_plugin *p = calloc(1, sizeof(*p));
    struct atrium_plugin **grown =
        realloc(rt->plugins, (rt->n_plugins + 1) * sizeof(*rt->plugins));
    if (!p || !grown) {
        free(p);
        return -1;
    }
    rt->plugins = grown;
    p->name = strdup(name);
    p->path = strdup(path);
    p->desc = d;
    p->dl = dl;
    p->cfg = pcfg;
    rt->plugins[rt->n_plugins++] = p;
    char err[512];
    if (plugin_settings_adopt(p, err, sizeof(err)) < 0) {
        refuse(name, path, "its settings table: %s - the plugin is broken; use a fixed build",
               err);
        return -1;
    }
    p->in_init = true;
    int rc = d->init(host, p, (const atrium_config *)pcfg, &p->state);
    p->in_init = false;
    p->inited = rc >= 0; /* fini only follows an init that succeeded */
    if (rc < 0) {
        rt_log(ATRIUM_LOG_ERROR, "core",
               "plugin \"%s\" (%s): init failed: %s - see the lines above; fix plugins.%s or "
               "disable it",
               name, path, atrium_err_name(rc), name);
        return -1;
    }
    if (contract_check(rt, p) < 0) return -1;
    rt_log(ATRIUM_LOG_INFO, "core", "plugin \"%s\" %s loaded from %s%s%s", name,
           d->version ? d->version : "", path, d->provides ? ", provides " : "",
           d->provides ? d->provides : "");
    return 0;
}

bool plugin_own(atrium_plugin *p, void (*free_fn)(void *), void *obj)
{
    if (p->n_owned == PLUGIN_MAX_OWNED) {
        rt_log(ATRIUM_LOG_ERROR, p->name, "too many budgets, lines and rate limiters (max %d)",
               PLUGIN_MAX_OWNED);
        free_fn(obj);
        return false;
    }
    p->owned[p->n_owned++] = (plugin_owned){.free = free_fn, .obj = obj};
    return true;
}

int plugins_load_all(core_runtime *rt)
{
    const atrium_host *host = host_table(rt);
    const cfg_node *plugins = cfg_get(rt->root, "plugins");
    if (!plugins) return 0;
    for (const cfg_node *pc = plugins->first_child; pc; pc = pc->next) {
        bool enabled = false;
        char err[256];
        if (cfg_read_bool(pc, "enabled", false, &enabled, err, sizeof(err)) < 0) {
            rt_log(ATRIUM_LOG_ERROR, "core", "%s", err);
            return -1;
        }
        if (!enabled) {
            rt_log(ATRIUM_LOG_INFO, "core", "plugin \"%s\" is disabled; its paths answer 404",
                   pc->key);
            continue;
        }
        if (load_one(rt, host, pc, pc->key) < 0) return -1;
    }
    return 0;
}

int plugins_migrate_all(core_runtime *rt)
{
    for (size_t i = 0; i < rt->n_plugins; i++) {
        atrium_plugin *p = rt->plugins[i];
        if (p->n_migrations && db_migrate(rt->db, p->name, p->migrations, p->n_migrations) < 0)
            return -1;
    }
    return 0;
}

int plugins_start_all(core_runtime *rt)
{
    for (size_t i = 0; i < rt->n_plugins; i++) {
        atrium_plugin *p = rt->plugins[i];
        for (size_t k = 0; k < p->n_pools; k++) {
            if (rt_pool_start(p->pools[k]) < 0) {
                rt_log(ATRIUM_LOG_ERROR, "core", "plugin \"%s\": cannot start pool %s", p->name,
                       rt_pool_name(p->pools[k]));
                return -1;
            }
        }
        if (p->desc->start && p->desc->start(p->state) < 0) {
            rt_log(ATRIUM_LOG_ERROR, "core", "plugin \"%s\": start failed - see the lines above",
                   p->name);
            return -1;
        }
        p->started = true;
    }
    return 0;
}

void plugins_stop_all(core_runtime *rt)
{
    for (size_t i = rt->n_plugins; i-- > 0;) {
        atrium_plugin *p = rt->plugins[i];
        if (p->started && p->desc->stop) p->desc->stop(p->state);
        for (size_t k = 0; k < p->n_pools; k++) rt_pool_stop(p->pools[k]);
        for (size_t k = 0; k < p->n_pools; k++) rt_pool_join(p->pools[k]);
        p->started = false;
    }
}

void plugins_fini_all(core_runtime *rt)
{
    for (size_t i = rt->n_plugins; i-- > 0;) {
        atrium_plugin *p = rt->plugins[i];
        if (p->inited && p->desc->fini) p->desc->fini(p->state);
        for (size_t k = 0; k < p->n_pools; k++) rt_pool_free(p->pools[k]);
        for (size_t k = p->n_owned; k-- > 0;) p->owned[k].free(p->owned[k].obj);
        free(p->settings);
        free(p->name);
        free(p->path);
        free(p);
    }
    free(rt->plugins);
    rt->plugins = NULL;
    rt->n_plugins = 0;
}
