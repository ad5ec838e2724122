/*
 * core/runtime/server_name.h - the one server-name grammar of the core: may this string,
 * taken from a request (a media path, a user ID, a room alias, a `server_name` or `via`
 * query parameter, an X-Matrix origin), name another server at all?
 *
 * Every name a client or another server chooses passes here before anything looks it up,
 * so a name that is not one (`..`, `a..b`, `localhost/../..`) is a 400 for the client at
 * once, never a discovery attempt, a destination back-off entry or a 502. The grammar is
 * the spec's (Appendices, "Server Name"): hostname, IPv4 or `[IPv6]`, with an optional
 * `:port`, 1-255 characters in all; a DNS name is read strictly, as Synapse does: labels
 * of 1-63 letters, digits and '-' joined by single dots (no empty label, no leading or
 * trailing dot), an IPv6 literal must be an address (inet_pton), and a port is 1-65535.
 * Discovery (core/federation/transport/fed_resolve_parse.c) splits names with this same
 * check, so what passes here is what discovery can look up. It says nothing about
 * whether the name resolves. Internal prefix: rt_server_name_. Any thread, no state.
 */
#ifndef ATRIUM_CORE_RT_SERVER_NAME_H
#define ATRIUM_CORE_RT_SERVER_NAME_H

#include <stdbool.h>

/* The longest server name, in characters (the spec's 255). */
#define RT_SERVER_NAME_MAX_CHARS 255

/* Does the NUL-terminated s follow the grammar above? False for NULL. */
bool rt_server_name_valid(const char *s);

/* Does the sigil ID id ("@alice:example.org", "#room:example.org:8448") have a non-empty
 * local part before its first ':' and a valid server name after it? The sigil itself is
 * not checked (the caller knows which it wants). False for NULL. */
bool rt_server_name_of_id_valid(const char *id);

#endif
