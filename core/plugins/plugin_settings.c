/*
 * core/plugins/plugin_settings.c - a plugin's settings table (atrium_plugin_desc.settings,
 * ABI 1.1) turned into the configuration engine's rows, so a plugin's keys are read,
 * checked for unknown keys, generated and documented by the same code as the core's
 * (core/config/schema.c).
 *
 * The table is checked once, when the plugin is loaded or described: a malformed row (no
 * key, a dotted or duplicate key, a reserved key, an empty or inverted range, a default
 * outside it) refuses the plugin with one line naming the row, because the plugin's own
 * settings could not be trusted to read as documented. Describing a plugin
 * (plugins_describe) only opens it and reads its descriptor: none of its code runs besides
 * the entry function, so --generate-config and --print-config-table are safe to run on any
 * build. Internal prefixes: plugin_settings_, plugins_describe.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/plugins/plugins.h"

#define SETTINGS_ERR_LEN 512

/* Has the descriptor (built for ABI 1.1 or later) a settings table? */
static bool desc_has_settings(const atrium_plugin_desc *d)
{
    return d->size >= offsetof(atrium_plugin_desc, n_settings) + sizeof(d->n_settings);
}

/* One row's flaw in err, or "" when it is well formed. */
static void check_row(const atrium_setting *rows, size_t i, char *err, size_t len)
{
    const atrium_setting *r = &rows[i];
    err[0] = '\0';
    if (!r->key || !*r->key || strchr(r->key, '.'))
        snprintf(err, len, "row %zu has %s key", i, r->key && *r->key ? "a dotted" : "no");
    else if (strcmp(r->key, "enabled") == 0 || strcmp(r->key, "path") == 0)
        snprintf(err, len, "row %zu declares \"%s\", which the core reads itself", i, r->key);
    else if (!r->help || !*r->help)
        snprintf(err, len, "setting \"%s\" has no help text", r->key);
    else if (r->type < ATRIUM_SETTING_INT || r->type > ATRIUM_SETTING_STRING)
        snprintf(err, len, "setting \"%s\" has unknown type %d", r->key, r->type);
    else if (r->type == ATRIUM_SETTING_INT && (r->min < INT32_MIN || r->max > INT32_MAX))
        snprintf(err, len, "setting \"%s\" is an int but its range does not fit one", r->key);
    else if (r->type == ATRIUM_SETTING_BOOL && r->def != 0 && r->def != 1)
        snprintf(err, len, "setting \"%s\" is a bool with default %lld", r->key,
                 (long long)r->def);
    else if ((r->type == ATRIUM_SETTING_INT || r->type == ATRIUM_SETTING_INT64) &&
             (r->min > r->max || (!r->default_doc && (r->def < r->min || r->def > r->max))))
        snprintf(err, len, "setting \"%s\" has default %lld outside its range %lld..%lld",
                 r->key, (long long)r->def, (long long)r->min, (long long)r->max);
    for (size_t k = 0; !err[0] && k < i; k++)
        if (strcmp(rows[k].key, r->key) == 0)
            snprintf(err, len, "setting \"%s\" is declared twice", r->key);
}

/* The engine's rows for a descriptor's table (malloc'd; *n_out rows), NULL with err set. A
 * plugin without a table gets an empty one (non-NULL). */
static struct cfg_setting *convert(const atrium_plugin_desc *d, size_t *n_out, char *err,
                                   size_t len)
{
    size_t n = desc_has_settings(d) && d->settings ? d->n_settings : 0;
    struct cfg_setting *out = calloc(n ? n : 1, sizeof *out);
    *n_out = 0;
    if (!out) {
        snprintf(err, len, "out of memory");
        return NULL;
    }
    static const cfg_type types[] = {[ATRIUM_SETTING_INT] = CFG_T_INT,
                                     [ATRIUM_SETTING_INT64] = CFG_T_INT64,
                                     [ATRIUM_SETTING_BOOL] = CFG_T_BOOL,
                                     [ATRIUM_SETTING_STRING] = CFG_T_STRING};
    for (size_t i = 0; i < n; i++) {
        const atrium_setting *r = &d->settings[i];
        check_row(d->settings, i, err, len);
        if (err[0]) {
            free(out);
            return NULL;
        }
        out[i] = (struct cfg_setting){
            .path = r->key, .type = types[r->type], .offset = r->offset, .def = r->def,
            .min = r->type == ATRIUM_SETTING_BOOL ? 0 : r->min,
            .max = r->type == ATRIUM_SETTING_BOOL ? 1 : r->max, .def_string = r->def_string,
            .unit = r->unit, .help = r->help, .default_doc = r->default_doc,
            .flags = r->default_doc ? CFG_F_KEEP : 0};
    }
    *n_out = n;
    return out;
}

int plugin_settings_adopt(atrium_plugin *p, char *err, size_t len)
{
    p->settings = convert(p->desc, &p->n_settings, err, len);
    return p->settings ? 0 : -1;
}

int plugin_settings_load(atrium_plugin *p, const cfg_node *cfg, void *base, char *err,
                         size_t len)
{
    static const char *const core_keys[] = {"enabled", "path", NULL};
    if (cfg_settings_check_keys(cfg, p->settings, p->n_settings, core_keys, err, len) < 0)
        return -1;
    return cfg_settings_read(cfg, p->settings, p->n_settings, base, err, len);
}

int plugins_describe(const char *plugin_dir, const char *name, const char *path,
                     struct cfg_plugin_doc *out)
{
    char buf[1024], err[SETTINGS_ERR_LEN];
    if (!path) {
        snprintf(buf, sizeof(buf), "%s/%s.so", plugin_dir, name);
        path = buf;
    }
    out->name = name;
    out->rows = NULL;
    out->n_rows = 0;
    void *dl = NULL;
    const atrium_plugin_desc *d = plugin_handshake(name, path, &dl);
    if (!d) return -1;
    struct cfg_setting *rows = convert(d, &out->n_rows, err, sizeof(err));
    if (!rows) {
        rt_log(ATRIUM_LOG_ERROR, "core", "plugin \"%s\" (%s): its settings table: %s", name,
               path, err);
        return -1;
    }
    out->rows = rows; /* points into the plugin's static table: the plugin is never closed */
    return 0;
}

void plugins_describe_release(struct cfg_plugin_doc *doc)
{
    free((void *)doc->rows);
    doc->rows = NULL;
    doc->n_rows = 0;
}
