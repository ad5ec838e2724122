/*
 * core/cli/verify_media.c - `atrium verify-media --config FILE`: checks every uploaded
 * original against its recorded SHA-256 by running the media plugin's own checker
 * (atrium-media-verify, installed beside atrium) with the database and store of the
 * server's configuration. The core never links plugin code: it only reads the two
 * settings and hands over to the plugin's command.
 */
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/cli/cli.h"
#include "core/config/config.h"

#define VERIFY_BINARY "atrium-media-verify"
#define VERIFY_DEFAULT_STORE "./media_store" /* the media plugin's default store_path */
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
    const char *conninfo = NULL, *store = NULL;
    if (cfg_read_string(root, "database.conninfo", "", &conninfo, err, sizeof(err)) < 0 ||
        cfg_read_string(root, "plugins.media.store_path", VERIFY_DEFAULT_STORE, &store, err,
                        sizeof(err)) < 0) {
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
