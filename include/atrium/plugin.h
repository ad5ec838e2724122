/*
 * atrium/plugin.h - what a plugin exports: one entry symbol returning one descriptor.
 *
 * A plugin is a shared object with a single exported function, atrium_plugin_entry(),
 * which returns a pointer to a static descriptor. The descriptor's first fields are filled
 * by the ATRIUM_PLUGIN(...) macro at the plugin's compile time (magic, size, ABI version,
 * build signature), so the author writes only names and callbacks, and the host can tell
 * a plugin built for another contract or another platform from a compatible one before it
 * calls any of its code. The host never unloads a plugin while it runs.
 *
 * Lifecycle (all callbacks run on the server's main thread, one plugin at a time):
 *   init(host, self, cfg, &state)  before the server listens: validate the config subtree
 *                                  (unknown keys are errors), register routes, migrations,
 *                                  pools, budgets, lines, metrics. No DB access, no threads.
 *                                  Return 0, or a negative atrium_err after logging why
 *                                  with host->log: the server then refuses to start.
 *                                  After a failed init, fini is not called: free what
 *                                  init allocated before returning the error.
 *   start(state)                   after every plugin's init succeeded and migrations ran,
 *                                  before the listener opens: start work that needs the DB.
 *                                  Pools created in init are started by the host.
 *   stop(state)                    once new requests are refused (503) and parked requests
 *                                  answered, before the listener closes: refuse new work,
 *                                  finish what runs. The host
 *                                  then stops and joins the plugin's pools.
 *   fini(state)                    after every plugin stopped: free memory.
 * start, stop and fini may be NULL.
 */
#ifndef ATRIUM_PLUGIN_H
#define ATRIUM_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#include "atrium/abi.h"

typedef struct atrium_host atrium_host;
typedef struct atrium_plugin atrium_plugin; /* the host's handle for one loaded plugin */
typedef struct atrium_config atrium_config; /* a read-only config subtree (plugins.<name>) */

typedef struct atrium_plugin_desc {
    uint32_t magic;        /* ATRIUM_PLUGIN_MAGIC */
    uint32_t size;         /* sizeof(atrium_plugin_desc) when the plugin was built */
    uint16_t abi_major;    /* ATRIUM_ABI_MAJOR when built */
    uint16_t abi_minor;    /* the lowest host minor this plugin needs */
    const char *build_sig; /* ATRIUM_BUILD_SIG when built */
    const char *name;      /* must equal the config key: plugins.<name> */
    const char *version;   /* the plugin's own version, shown in logs */
    const char *provides;  /* the interface it implements ("media/1"), or NULL */
    int (*init)(const atrium_host *host, atrium_plugin *self, const atrium_config *cfg,
                void **state);
    int (*start)(void *state);
    void (*stop)(void *state);
    void (*fini)(void *state);
} atrium_plugin_desc;

/* The one symbol the host looks up. */
typedef const atrium_plugin_desc *(*atrium_plugin_entry_fn)(void);
#define ATRIUM_PLUGIN_ENTRY_SYMBOL "atrium_plugin_entry"

/* A plugin may target an older host minor (it then must test ATRIUM_HOST_HAS before using
 * newer host members). */
#ifndef ATRIUM_TARGET_ABI_MINOR
#define ATRIUM_TARGET_ABI_MINOR ATRIUM_ABI_MINOR
#endif

/* Define the entry symbol and the descriptor. Use once per plugin, at file scope:
 *   ATRIUM_PLUGIN(.name = "media", .version = "1.0.0", .provides = "media/1",
 *                 .init = media_init, .start = media_start, .stop = media_stop,
 *                 .fini = media_fini)
 */
#define ATRIUM_PLUGIN(...)                                                                  \
    ATRIUM_EXPORT const atrium_plugin_desc *atrium_plugin_entry(void);                      \
    const atrium_plugin_desc *atrium_plugin_entry(void)                                     \
    {                                                                                        \
        static const atrium_plugin_desc d = {.magic = ATRIUM_PLUGIN_MAGIC,                  \
                                             .size = sizeof(atrium_plugin_desc),            \
                                             .abi_major = ATRIUM_ABI_MAJOR,                 \
                                             .abi_minor = ATRIUM_TARGET_ABI_MINOR,          \
                                             .build_sig = ATRIUM_BUILD_SIG,                 \
                                             __VA_ARGS__};                                  \
        return &d;                                                                           \
    }

#endif
