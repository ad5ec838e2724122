/*
 * core/cli/cli.h - subcommands of the atrium executable that are not the server: small
 * clients of a running server, run from an operator's shell. Each reads the server's config
 * for what it needs; register-user talks HTTP to the server, so it acts through the same
 * checks as any client; verify-media and the plugin commands (`atrium media migrate`) hand
 * over to a program the plugin ships, with its settings as the server reads them. Internal prefix: cli_.
 */
#ifndef ATRIUM_CORE_CLI_H
#define ATRIUM_CORE_CLI_H

#include <stdbool.h>

/* atrium register-user --config FILE --user NAME [--password PW] [--admin] [--url URL]
 * argv holds the arguments after "register-user". Prints the new user ID on stdout and
 * returns 0; on failure prints the reason (the server's errcode and error when it answered)
 * on stderr and returns 1 (2 for bad usage). Without --password, the password is read from
 * the first line of standard input. */
int cli_register_user(int argc, char **argv);

/* atrium verify-media --config FILE [--json]: runs the media plugin's checker
 * (`atrium media verify`: atrium-media-verify beside this executable) on the configured
 * database and store: plugins.media.store_path, or the bucket with storage: s3 (relative
 * paths are relative to the current directory, as for the server). Returns its exit
 * status: 0 all originals match, 1 mismatches (listed on stdout), 2 the check could not
 * run. */
int cli_verify_media(int argc, char **argv);

/* Does argv (the whole command line) name a plugin command, `atrium <plugin> <command>`
 * (two names of [a-z0-9_-], not options)? */
bool cli_is_plugin_command(int argc, char **argv);
/* atrium <plugin> <command> --config FILE [ARGS...]: replaces this process with the
 * plugin's program atrium-<plugin>-<command> beside this executable, given --conninfo
 * <database.conninfo> --settings-stdin ARGS and plugins.<plugin>'s settings as JSON on its
 * standard input (include/atrium/plugin.h, "Plugin commands"). Returns only when it could
 * not: 2, after printing why (a bad config or setting, no such program). */
int cli_plugin_command(const char *plugin, const char *command, int argc, char **argv);

#endif
