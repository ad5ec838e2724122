/*
 * core/cli/verify_media.c - `atrium verify-media --config FILE [--json]`: checks every
 * uploaded original against its recorded SHA-256 by running the media plugin's own checker
 * (atrium-media-verify, installed beside atrium) as the plugin command `atrium media
 * verify` (plugin_command.c): with the server's database and plugins.media's settings as
 * the server reads them, so it checks the local folder or, with storage: s3, the bucket.
 * The core never links plugin code and keeps no copy of the plugin's defaults.
 */
#include <stdio.h>
#include <string.h>

#include "atrium/media.h"
#include "core/cli/cli.h"

int cli_verify_media(int argc, char **argv)
{
    bool config = false;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--config") == 0 && i + 1 < argc) {
            config = true;
            i++;
        } else if (strcmp(argv[i], "--json") != 0) {
            config = false;
            break;
        }
    }
    if (!config) {
        fprintf(stderr, "usage: atrium verify-media --config FILE [--json]\n");
        return 2;
    }
    return cli_plugin_command("media", ATRIUM_MEDIA_COMMAND_VERIFY, argc, argv);
}
