/*
 * core/cli/verify_media.c - `atrium verify-media --config FILE`: checks every uploaded
 * original against its recorded SHA-256 by running the media plugin's own checker
 * (atrium-media-verify, installed beside atrium) with the database and store of the
 * server's configuration. The core never links plugin code and keeps no copy of the
 * plugin's defaults: the store path's default comes from the settings table the plugin
 * declares (read from its descriptor, running none of its code), then it hands over to the
 * plugin's command.
 */
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "atrium/media.h"
#include "core/cli/cli.h"
#include "core/config/config.h"
#include "core/plugins/plugins.h"

#define VERIFY_BINARY "atrium-media-verify"
#define VERIFY_PLUGIN "media"
#define VERIFY_ERR_LEN 1024

extern char **environ;

int cli_verify_media(int argc, char **argv)
{
    const char *config = NULL;
    bool json = false;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--config") == 0 && i + 1 < argc) config = argv[++i];
        else if (strcmp(argv[i], "--json") == 0) json = true;
        else {
            fprintf(stderr, "usage: atrium verify-media --config FILE [--json]\n");
            return 2;
        }
    }
    if (!config) {
        fprintf(stderr, "usage: atrium verify-media --config FILE [--json]\n");
        return 2;
    }
    char err[VERIFY_ERR_LEN];
    cfg_node *root = cfg_load_file(config, err, sizeof(err));
    if (!root || cfg_apply_env(root, environ, err, sizeof(err)) < 0) {
        fprintf(stderr, "atrium: %s\n", err);
        cfg_free(root);
        return 2;
    }
    /* The plugin the server would load, and the store_path default it declares. */
    const char *plugin_dir = NULL, *plugin_path = NULL, *conninfo = NULL, *store = NULL;
    if (cfg_read_string(root, "plugin_dir", ATRIUM_DEFAULT_PLUGIN_DIR, &plugin_dir, err,
                        sizeof(err)) < 0 ||
        cfg_read_string(root, "plugins." VERIFY_PLUGIN ".path", NULL, &plugin_path, err,
                        sizeof(err)) < 0) {
        fprintf(stderr, "atrium: %s\n", err);
        cfg_free(root);
        return 2;
    }
    struct cfg_plugin_doc media;
    const struct cfg_setting *store_row = NULL;
    if (plugins_describe(plugin_dir, VERIFY_PLUGIN, plugin_path, &media) == 0)
        store_row = cfg_settings_find(media.rows, media.n_rows, ATRIUM_MEDIA_SETTING_STORE_PATH);
    const char *store_default = store_row ? store_row->def_string : NULL; /* static */
    plugins_describe_release(&media);
    if (!store_default) {
        fprintf(stderr, "atrium: cannot read the media plugin's settings (see above): set "
                        "plugin_dir or plugins.media.path to its media.so\n");
        cfg_free(root);
        return 2;
    }
    if (cfg_read_string(root, "database.conninfo", "", &conninfo, err, sizeof(err)) < 0 ||
        cfg_read_string(root, "plugins." VERIFY_PLUGIN ".store_path", store_default,
                        &store, err, sizeof(err)) < 0) {
        fprintf(stderr, "atrium: %s\n", err);
        cfg_free(root);
        return 2;
    }
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n < 0) {
        fprintf(stderr, "atrium: cannot find my own executable: %s\n", strerror(errno));
        cfg_free(root);
        return 2;
    }
    self[n] = '\0';
    char tool[PATH_MAX];
    snprintf(tool, sizeof(tool), "%s/%s", dirname(self), VERIFY_BINARY);
    char *args[] = {tool, "--conninfo", (char *)conninfo, "--store", (char *)store,
                    json ? "--json" : NULL, NULL};
    execv(tool, args);
    fprintf(stderr, "atrium: cannot run %s: %s (it is built with the media plugin)\n", tool,
            strerror(errno));
    cfg_free(root);
    return 2;
}
