/*
 * core/cli/cli.h - subcommands of the atrium executable that are not the server: small
 * clients of a running server, run from an operator's shell. Each reads the server's config
 * for what it needs; register-user talks HTTP to the server, so it acts through the same
 * checks as any client; verify-media hands over to the media plugin's own checker. Internal prefix: cli_.
 */
#ifndef ATRIUM_CORE_CLI_H
#define ATRIUM_CORE_CLI_H

/* atrium register-user --config FILE --user NAME [--password PW] [--admin] [--url URL]
 * argv holds the arguments after "register-user". Prints the new user ID on stdout and
 * returns 0; on failure prints the reason (the server's errcode and error when it answered)
 * on stderr and returns 1 (2 for bad usage). Without --password, the password is read from
 * the first line of standard input. */
int cli_register_user(int argc, char **argv);

/* atrium verify-media --config FILE [--json]: runs the media plugin's checker
 * (atrium-media-verify beside this executable) on the configured database and
 * plugins.media.store_path (relative paths are relative to the current directory, as
 * for the server). Returns its exit status: 0 all originals match, 1 mismatches (listed
 * on stdout), 2 the check could not run. */
int cli_verify_media(int argc, char **argv);

#endif
