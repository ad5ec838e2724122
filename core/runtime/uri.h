/*
 * core/runtime/uri.h - the one percent-encoder of the core: a Matrix ID or token placed
 * in a path segment or query value of a URI we send to another server.
 *
 * It sits in the runtime because federation transport (the profile and key queries, the
 * joins a client asks for) and federation rooms (fetching missing events, state, backfill)
 * both build such URIs, and the rule for a value that does not fit must be one rule: the
 * request is not sent. A truncated ID would ask the other server about a different event
 * or user, so there is no truncating mode. Decoding stays with the router
 * (http_percent_decode). Internal prefix: rt_uri_. Any thread, no state.
 */
#ifndef ATRIUM_CORE_RT_URI_H
#define ATRIUM_CORE_RT_URI_H

#include <stdbool.h>
#include <stddef.h>

/* The most bytes percent-encoding `n` bytes can produce, not counting the NUL. */
#define RT_URI_ENCODED_MAX(n) ((n) * 3)

/* Percent-encode the NUL-terminated s into out (cap bytes, NUL included), keeping the RFC
 * 3986 unreserved characters (A-Z a-z 0-9 - . _ ~) and writing every other byte as %XX
 * (upper-case hex). True when the whole encoding and its NUL fit; false when it does not
 * (or cap is 0), and then out holds the empty string (when cap > 0), never a prefix. */
__attribute__((warn_unused_result)) bool rt_uri_encode(const char *s, char *out, size_t cap);

#endif
