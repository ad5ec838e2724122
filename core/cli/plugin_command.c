/*
 * core/cli/plugin_command.c - `atrium <plugin> <command> --config FILE [ARGS...]`: runs a
 * command a plugin ships as a program of its own (atrium-<plugin>-<command>, installed
 * beside atrium), handing it the server's database and the plugin's settings exactly as
 * the server would load them (include/atrium/plugin.h, "Plugin commands", ABI 1.7).
 *
 * Decisions owned here: the core reads the configuration (the file, then the environment's
 * overrides) and the plugin's settings through the table the plugin declares (read from
 * its descriptor, running none of its code): unknown keys and values out of range stop
 * the command with the same line the server would print. The settings travel as one JSON
 * object on the program's standard input, never on its command line, which every user of
 * the machine can read (/proc/<pid>/cmdline) and which would show the object store's
 * secret. The core links no plugin code and keeps no copy of any plugin's defaults.
 */
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "atrium/plugin.h"
#include "core/cli/cli.h"
#include "core/config/config.h"
#include "core/plugins/plugins.h"

#define COMMAND_ERR_LEN 1024
#define COMMAND_MAX_ARGS 32
#define COMMAND_NAME_MAX 64

extern char **environ;

/* [a-z0-9_-], 1..COMMAND_NAME_MAX: a plugin or command name that can be part of a
 * program's name and nothing else. */
static bool name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > COMMAND_NAME_MAX || s[0] == '-') return false;
    for (const char *p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_' || *p == '-'))
            return false;
    return true;
}

bool cli_is_plugin_command(int argc, char **argv)
{
    return argc > 2 && name_ok(argv[1]) && name_ok(argv[2]);
}

/* The settings of plugins.<name> as the server would read them, as a JSON object. NULL
 * with err set. */
static json_t *resolved_settings(const cfg_node *root, const char *name,
                                 const struct cfg_plugin_doc *doc, char *err, size_t errlen)
{
    static const char *const core_keys[] = {"enabled", "path", NULL};
    char path[COMMAND_NAME_MAX + 16];
    snprintf(path, sizeof(path), "plugins.%s", name);
    const cfg_node *sub = cfg_get(root, path);
    size_t size = 0;
    for (size_t i = 0; i < doc->n_rows; i++) /* the struct the rows describe, at least */
        if (doc->rows[i].offset + sizeof(int64_t) > size)
            size = doc->rows[i].offset + sizeof(int64_t);
    char *base = calloc(1, size ? size : 1);
    json_t *out = json_object();
    if (!base || !out) {
        snprintf(err, errlen, "out of memory");
        free(base);
        json_decref(out);
        return NULL;
    }
    if (cfg_settings_check_keys(sub, doc->rows, doc->n_rows, core_keys, err, errlen) < 0 ||
        cfg_settings_read(sub, doc->rows, doc->n_rows, base, err, errlen) < 0) {
        cfg_settings_release(doc->rows, doc->n_rows, base);
        free(base);
        json_decref(out);
        return NULL;
    }
    for (size_t i = 0; i < doc->n_rows; i++) {
        const struct cfg_setting *r = &doc->rows[i];
        if ((r->flags & CFG_F_KEEP) && cfg_is_absent(cfg_get(sub, r->path))) continue;
        const char *field = base + r->offset;
        json_t *v = NULL;
        switch (r->type) {
        case CFG_T_INT: v = json_integer(*(const int *)(const void *)field); break;
        case CFG_T_INT64: v = json_integer(*(const int64_t *)(const void *)field); break;
        case CFG_T_BOOL: v = json_boolean(*(const bool *)(const void *)field); break;
        case CFG_T_STRING: {
            const char *s = *(const char *const *)(const void *)field;
            v = json_string(s ? s : "");
            break;
        }
        default: break; /* plugins declare only the four types above (atrium_setting) */
        }
        if (v) json_object_set_new(out, r->path, v);
    }
    cfg_settings_release(doc->rows, doc->n_rows, base);
    free(base);
    return out;
}

/* The program atrium-<plugin>-<command> beside this executable, into out. */
static int program_path(const char *plugin, const char *command, char *out, size_t cap)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n < 0) {
        fprintf(stderr, "atrium: cannot find my own executable: %s\n", strerror(errno));
        return -1;
    }
    self[n] = '\0';
    int len = snprintf(out, cap, "%s/" ATRIUM_COMMAND_PREFIX "%s-%s", dirname(self), plugin,
                       command);
    return len < 0 || (size_t)len >= cap ? -1 : 0;
}

/* Replace this process with the program, the settings on its standard input. A pipe holds
 * them: they are written whole before the exec (far below a pipe's 64 KiB). */
static int exec_with_settings(const char *program, char **args, const char *settings)
{
    int fds[2];
    if (pipe(fds) < 0) {
        fprintf(stderr, "atrium: pipe: %s\n", strerror(errno));
        return 2;
    }
    size_t len = strlen(settings), off = 0;
    while (off < len) {
        ssize_t w = write(fds[1], settings + off, len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            fprintf(stderr, "atrium: cannot hand the settings over: %s\n", strerror(errno));
            return 2;
        }
        off += (size_t)w;
    }
    close(fds[1]);
    if (dup2(fds[0], STDIN_FILENO) < 0) {
        fprintf(stderr, "atrium: dup2: %s\n", strerror(errno));
        return 2;
    }
    close(fds[0]);
    execv(program, args);
    fprintf(stderr, "atrium: cannot run %s: %s (it is built with the plugin)\n", program,
            strerror(errno));
    return 2;
}

int cli_plugin_command(const char *plugin, const char *command, int argc, char **argv)
{
    const char *config = NULL;
    char *args[COMMAND_MAX_ARGS + 6];
    int n_args = 0, rest[COMMAND_MAX_ARGS], n_rest = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--config") == 0 && i + 1 < argc) config = argv[++i];
        else if (n_rest < COMMAND_MAX_ARGS) rest[n_rest++] = i;
    }
    if (!config || !name_ok(plugin) || !name_ok(command)) {
        fprintf(stderr, "usage: atrium %s %s --config FILE [ARGS...]\n", plugin, command);
        return 2;
    }
    char err[COMMAND_ERR_LEN];
    cfg_node *root = cfg_load_file(config, err, sizeof(err));
    if (!root || cfg_apply_env(root, environ, err, sizeof(err)) < 0) {
        fprintf(stderr, "atrium: %s\n", err);
        cfg_free(root);
        return 2;
    }
    const char *plugin_dir = NULL, *plugin_path = NULL, *conninfo = NULL;
    char key[COMMAND_NAME_MAX + 16];
    snprintf(key, sizeof(key), "plugins.%s.path", plugin);
    if (cfg_read_string(root, "plugin_dir", ATRIUM_DEFAULT_PLUGIN_DIR, &plugin_dir, err,
                        sizeof(err)) < 0 ||
        cfg_read_string(root, key, NULL, &plugin_path, err, sizeof(err)) < 0 ||
        cfg_read_string(root, "database.conninfo", "", &conninfo, err, sizeof(err)) < 0) {
        fprintf(stderr, "atrium: %s\n", err);
        cfg_free(root);
        return 2;
    }
    struct cfg_plugin_doc doc;
    if (plugins_describe(plugin_dir, plugin, plugin_path, &doc) < 0) {
        fprintf(stderr, "atrium: cannot read the %s plugin's settings (see above): set "
                        "plugin_dir or plugins.%s.path\n", plugin, plugin);
        cfg_free(root);
        return 2;
    }
    json_t *settings = resolved_settings(root, plugin, &doc, err, sizeof(err));
    plugins_describe_release(&doc);
    char *text = settings ? json_dumps(settings, JSON_COMPACT) : NULL;
    json_decref(settings);
    char program[PATH_MAX];
    int rc = 2;
    if (!text) {
        fprintf(stderr, "atrium: %s\n", err[0] ? err : "out of memory");
    } else if (program_path(plugin, command, program, sizeof(program)) == 0) {
        args[n_args++] = program;
        args[n_args++] = ATRIUM_COMMAND_ARG_CONNINFO;
        args[n_args++] = (char *)conninfo;
        args[n_args++] = ATRIUM_COMMAND_ARG_SETTINGS;
        for (int i = 0; i < n_rest; i++) args[n_args++] = argv[rest[i]];
        args[n_args] = NULL;
        rc = exec_with_settings(program, args, text); /* returns only on failure */
    }
    free(text);
    cfg_free(root);
    return rc;
}
