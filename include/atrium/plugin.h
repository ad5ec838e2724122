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
 *                                  Pools created in init are started by the host. Return 0
 *                                  (any value >= 0 is success), or a negative atrium_err
 *                                  after logging why: start-up stops (the server exits
 *                                  with status 1); this plugin's stop is not called but
 *                                  its pools are stopped and its fini runs, and plugins
 *                                  started before it are stopped.
 *   stop(state)                    once new requests are refused (503) and parked requests
 *                                  answered, before the listener closes: refuse new work,
 *                                  finish what runs. The host
 *                                  then stops and joins the plugin's pools.
 *   fini(state)                    after every plugin stopped: free memory.
 * start, stop and fini may be NULL. Paths in a plugin's settings are handed over as
 * written: a relative one is relative to the server's working directory (the host does
 * not resolve it; resolve it in init if the plugin wants another base). A failing init
 * is logged by the core with the error's name (atrium_err_name) after the plugin's own
 * lines.
 */
#ifndef ATRIUM_PLUGIN_H
#define ATRIUM_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#include "atrium/abi.h"

typedef struct atrium_host atrium_host;
typedef struct atrium_plugin atrium_plugin; /* the host's handle for one loaded plugin */
typedef struct atrium_config atrium_config; /* a read-only config subtree (plugins.<name>) */

/* One setting of the plugin (ABI 1.1): a key of plugins.<name>, declared once in the
 * descriptor's `settings` table. From these rows the host reads the plugin's settings
 * (host->config_load), refuses unknown keys, writes the keys with their defaults and help
 * into `atrium --generate-config`, and prints them as a Markdown table
 * (`atrium --print-config-table <name>`). The host reads the table without running plugin
 * code, so it must be static data. This layout is frozen within ABI major 1. */
enum atrium_setting_type {
    ATRIUM_SETTING_INT = 1,    /* an int field; min and max must fit an int */
    ATRIUM_SETTING_INT64 = 2,  /* an int64_t field */
    ATRIUM_SETTING_BOOL = 3,   /* a bool field; def is 0 or 1 */
    ATRIUM_SETTING_STRING = 4, /* a const char * field; the string belongs to the host and
                                  lives until the server exits */
};

typedef struct atrium_setting {
    const char *key;        /* the key below plugins.<name>, without dots ("delivery_slots") */
    int type;               /* enum atrium_setting_type */
    size_t offset;          /* offsetof(the plugin's settings struct, its field) */
    int64_t def, min, max;  /* INT, INT64, BOOL: the default and the inclusive range */
    const char *def_string; /* STRING: the default */
    const char *unit;       /* for the documentation: "ms", "bytes", "threads", or NULL */
    const char *help;       /* what it does, in a sentence or two, for operators */
    /* Non-NULL when the default is computed when the plugin starts (e.g. "CPU cores"): the
     * text documents it, and an absent key leaves the field as the plugin set it before
     * calling config_load. */
    const char *default_doc;
} atrium_setting;

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
    /* ABI 1.1, appended: the plugin's settings (see atrium_setting), or NULL and 0 for a
     * plugin without settings of its own or one that reads them key by key. */
    const atrium_setting *settings;
    size_t n_settings;
} atrium_plugin_desc;

/* ---- plugin commands (ABI 1.7) -------------------------------------------------------
 * A plugin may ship commands for operators as programs of its own, installed beside the
 * atrium executable and named ATRIUM_COMMAND_PREFIX "<plugin>-<command>". The operator runs
 *     atrium <plugin> <command> --config FILE [ARGS...]
 * and the core, having read FILE (and the environment's overrides) as the server would,
 * replaces itself with
 *     atrium-<plugin>-<command> --conninfo <database.conninfo> --settings-stdin [ARGS...]
 * whose standard input holds plugins.<plugin>'s settings as one JSON object, then EOF: a
 * member per row of the descriptor's settings table, defaults filled in, ranges and
 * unknown keys checked (a bad value stops the command before the program runs, with the
 * line the server would print); INT and INT64 as integers, BOOL as true or false, STRING
 * as strings; a row with a default_doc the config leaves unset is absent. Settings travel
 * on stdin, never on the command line, which any user of the machine can read. No host
 * table exists in the program: it runs the plugin's code as a program of its own (the
 * server may be running meanwhile, on the same database and files). Its exit status is
 * the command's: 0 done, 1 done and problems listed, 2 could not run (stderr says why).
 * Plugin and command names are [a-z0-9_-]. */
#define ATRIUM_COMMAND_PREFIX "atrium-"
#define ATRIUM_COMMAND_ARG_CONNINFO "--conninfo"
#define ATRIUM_COMMAND_ARG_SETTINGS "--settings-stdin"

/* The one symbol the host looks up. */
typedef const atrium_plugin_desc *(*atrium_plugin_entry_fn)(void);
#define ATRIUM_PLUGIN_ENTRY_SYMBOL "atrium_plugin_entry"

/* The contract a plugin targets, written into its descriptor by ATRIUM_PLUGIN(...).
 * Define them before including any atrium/ header (or with -D) to target something else:
 *   ATRIUM_TARGET_ABI_MINOR  an older minor, so the plugin also loads on older hosts of
 *                            the major; it then must test ATRIUM_HOST_HAS before using
 *                            newer host members (and use no newer route flags);
 *   ATRIUM_TARGET_ABI_MAJOR  another major: only useful to test a loader's refusal
 *                            (tests/plugins/badabi.c), since these headers describe
 *                            major ATRIUM_ABI_MAJOR alone.
 * A minor newer than these headers offer is a compile error. */
#ifndef ATRIUM_TARGET_ABI_MAJOR
#define ATRIUM_TARGET_ABI_MAJOR ATRIUM_ABI_MAJOR
#endif
#ifndef ATRIUM_TARGET_ABI_MINOR
#define ATRIUM_TARGET_ABI_MINOR ATRIUM_ABI_MINOR
#endif
#if ATRIUM_TARGET_ABI_MAJOR == ATRIUM_ABI_MAJOR && ATRIUM_TARGET_ABI_MINOR > ATRIUM_ABI_MINOR
#error "ATRIUM_TARGET_ABI_MINOR is newer than these headers: update include/atrium/"
#endif

/* Define the entry symbol and the descriptor. Use once per plugin, at file scope:
 *   ATRIUM_PLUGIN(.name = "media", .version = "1.0.0", .provides = "media/1",
 *                 .init = media_init, .start = media_start, .stop = media_stop,
 *                 .fini = media_fini, .settings = MEDIA_SETTINGS,
 *                 .n_settings = MEDIA_N_SETTINGS)
 */
#define ATRIUM_PLUGIN(...)                                                                  \
    ATRIUM_EXPORT const atrium_plugin_desc *atrium_plugin_entry(void);                      \
    const atrium_plugin_desc *atrium_plugin_entry(void)                                     \
    {                                                                                        \
        static const atrium_plugin_desc d = {.magic = ATRIUM_PLUGIN_MAGIC,                  \
                                             .size = sizeof(atrium_plugin_desc),            \
                                             .abi_major = ATRIUM_TARGET_ABI_MAJOR,          \
                                             .abi_minor = ATRIUM_TARGET_ABI_MINOR,          \
                                             .build_sig = ATRIUM_BUILD_SIG,                 \
                                             __VA_ARGS__};                                  \
        return &d;                                                                           \
    }

#endif
