/*
 * core/plugins/plugins.h - loading plugins and the host table they call.
 *
 * The loader owns the handshake (docs/architecture.md, 'The plugin seam'):
 * dlopen(RTLD_NOW | RTLD_LOCAL), one entry
 * symbol, magic / size / ABI major-minor / build signature / name checks, one actionable
 * line per refusal, duplicate interfaces refused, and the lifecycle init -> migrations ->
 * start -> stop -> fini. host.c fills struct atrium_host from the core's mechanisms;
 * plugin_settings.c turns a descriptor's settings table into the configuration engine's rows.
 * Internal prefixes: plugins_, host_.
 */
#ifndef ATRIUM_CORE_PLUGINS_H
#define ATRIUM_CORE_PLUGINS_H

#include "atrium/host.h"
#include "core/config/config.h"
#include "core/http/http.h"
#include "core/runtime/core_runtime.h"
#include "core/runtime/iface.h"
#include "core/runtime/runtime.h"
#include "core/store/db.h"

#define PLUGIN_MAX_POOLS 8
#define PLUGIN_MAX_OWNED 64

/* Something the host created for a plugin in init and frees after its fini. */
typedef struct plugin_owned {
    void (*free)(void *obj);
    void *obj;
} plugin_owned;

struct atrium_plugin {
    char *name;
    char *path;
    const atrium_plugin_desc *desc;
    void *dl;
    void *state;
    const cfg_node *cfg;
    rt_pool *pools[PLUGIN_MAX_POOLS];
    size_t n_pools;
    plugin_owned owned[PLUGIN_MAX_OWNED];
    size_t n_owned;
    const atrium_migration *migrations;
    size_t n_migrations;
    /* its descriptor's table as the engine's rows (plugin_settings.c) */
    struct cfg_setting *settings;
    size_t n_settings;
    bool in_init, inited, started;
};

/* Record obj for freeing after the plugin's fini; false (and obj freed) when full. */
bool plugin_own(atrium_plugin *p, void (*free_fn)(void *), void *obj);

/* The host table, serving rt (the bound runtime object, core_runtime_get()). */
const atrium_host *host_table(core_runtime *rt);

/* The handshake (loader.c): dlopen path and check the descriptor against this server;
 * NULL after logging the refusal. *dl_out gets the handle (never closed). */
const atrium_plugin_desc *plugin_handshake(const char *name, const char *path, void **dl_out);

/* Settings tables (plugin_settings.c). Convert p->desc's table into p->settings; -1 with err
 * naming the malformed row. */
int plugin_settings_adopt(atrium_plugin *p, char *err, size_t len);
/* Check cfg's keys against p's rows (plus enabled and path) and read them into base. */
int plugin_settings_load(atrium_plugin *p, const cfg_node *cfg, void *base, char *err,
                         size_t len);
/* Open <plugin_dir>/<name>.so (or path when non-NULL), check its descriptor and give its
 * settings as rows in *out (rows stay valid until exit), running none of its code but its
 * entry function. 0, or -1 after logging why (out->rows is then NULL). Main thread. */
int plugins_describe(const char *plugin_dir, const char *name, const char *path,
                     struct cfg_plugin_doc *out);
/* Free the rows plugins_describe made (their strings stay: they are the plugin's). */
void plugins_describe_release(struct cfg_plugin_doc *doc);

/* The interface registry is core/runtime/iface.h (rt_iface_*). */

/* Load and init every enabled plugin (plugins.<name>.enabled). 0 or -1 (logged). */
int plugins_load_all(core_runtime *rt);
int plugins_migrate_all(core_runtime *rt);
int plugins_start_all(core_runtime *rt);
void plugins_stop_all(core_runtime *rt);
void plugins_fini_all(core_runtime *rt);

#endif
