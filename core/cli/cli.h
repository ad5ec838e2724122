/*
 * core/cli/cli.h - subcommands of the atrium executable that are not the server: small
 * clients of a running server, run from an operator's shell. Each reads the server's config
 * for what it needs and talks HTTP to the server; none opens the database itself, so they
 * act through the same checks as any client. Internal prefix: cli_.
 */
#ifndef ATRIUM_CORE_CLI_H
#define ATRIUM_CORE_CLI_H

/* atrium register-user --config FILE --user NAME [--password PW] [--admin] [--url URL]
 * argv holds the arguments after "register-user". Prints the new user ID on stdout and
 * returns 0; on failure prints the reason (the server's errcode and error when it answered)
 * on stderr and returns 1 (2 for bad usage). Without --password, the password is read from
 * the first line of standard input. */
int cli_register_user(int argc, char **argv);

#endif
