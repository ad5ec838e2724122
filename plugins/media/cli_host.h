/*
 * plugins/media/cli_host.h - the plugin's commands (atrium-media-verify,
 * atrium-media-migrate) run the plugin's code as programs of their own, without a server:
 * cli_host.c gives them the settings the core handed over and a host table for the shared
 * code (include/atrium/plugin.h, "Plugin commands").
 */
#ifndef MEDIA_CLI_HOST_H
#define MEDIA_CLI_HOST_H

#include <stdio.h>

#include "media.h"

/* Make m a plugin object for a command: zeroed, a host table for s3.c and store.c, the
 * settings' defaults from MEDIA_SETTINGS, then those of the JSON object read from
 * `settings` (the core's --settings-stdin; NULL: defaults only). 0, or ATRIUM_E_INVAL with
 * err set. Strings read live until cli_media_close. Also starts libcurl (the host's part,
 * include/atrium/host.h). */
int cli_media_open(media *m, FILE *settings, char *err, size_t errlen);
/* Free what cli_media_open and s3_client_init kept (after either failed too). */
void cli_media_close(media *m);
/* Connect to PostgreSQL: 0 and *out, or -1 after printing why (prefixed with program). */
int cli_media_connect(const char *conninfo, const char *program, PGconn **out);

#endif
