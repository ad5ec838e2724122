/*
 * core/federation/fed_resolve.h - server discovery: from a Matrix server name to where to
 * connect, what to send as Host, and which name the certificate must carry, following the
 * server-server API's discovery algorithm (IP literal; explicit port; /.well-known/matrix/
 * server, with redirects and its own cache; SRV _matrix-fed._tcp, then the deprecated
 * _matrix._tcp; then port 8448).
 *
 * DNS goes through c-ares on the resolver's own thread (never getaddrinfo: a blocking
 * look-up would stall whoever waits behind it); .well-known is fetched through the one
 * outbound client (fed_http.h), so its connections are bounded and address-checked like
 * every other. Results are cached: DNS answers per their TTL, .well-known per its
 * Cache-Control/Expires (default 24 h, at most 48 h; failures for a shorter time), so a
 * busy destination costs no look-up per request.
 *
 * Internal prefix: fed_resolve_. fed_resolve_lookup from any thread; callbacks on the
 * resolver's thread or the outbound client's I/O thread (quick, never blocking).
 */
#ifndef ATRIUM_CORE_FED_RESOLVE_H
#define ATRIUM_CORE_FED_RESOLVE_H

#include <stddef.h>
#include <stdint.h>

#include "core/federation/fed_http.h"
#include "core/runtime/runtime.h"

#define FED_RESOLVE_MAX_ADDRS 8
#define FED_RESOLVE_NAME_BYTES 256

typedef struct fed_resolver fed_resolver;

/* Where a request for a server name goes. Build the URL as
 * "https://<tls_name>:<port>/path" (bracket an IPv6 literal) and connect to addrs. */
typedef struct fed_target {
    char tls_name[FED_RESOLVE_NAME_BYTES];    /* URL host, SNI and certificate name */
    int port;
    char host_header[FED_RESOLVE_NAME_BYTES]; /* the Host header to send */
    char addrs[FED_RESOLVE_MAX_ADDRS][64];    /* IP literals to connect to, in order */
    int n_addrs;
    const char *step; /* which step of the algorithm decided ("ip-literal", "explicit-port",
                         "well-known", "well-known+srv", "srv", "srv-legacy", "default") */
} fed_target;

typedef struct fed_resolve_settings {
    /* DNS servers "ip" or "ip:port" (NULL/0 = the system's /etc/resolv.conf): tests point
     * this at a DNS server of their own on loopback. */
    const char *const *dns_servers;
    size_t n_dns_servers;
    int64_t lookup_timeout_ms;       /* a whole discovery (DNS + .well-known) */
    int64_t well_known_max_bytes;    /* a larger .well-known answer is an error */
    bool verify_tls;                 /* for .well-known fetches */
} fed_resolve_settings;

/* 0 = found (target filled), or a negative enum atrium_err (ATRIUM_E_NOTFOUND: the name
 * does not resolve; ATRIUM_E_TIMEOUT; ATRIUM_E_INVAL: not a valid server name) with a
 * sentence in `error`. */
typedef void (*fed_resolve_cb)(void *arg, int rc, const fed_target *target,
                               const char *error);

fed_resolver *fed_resolve_new(const fed_resolve_settings *s, fed_http *http,
                              rt_metrics *metrics);
int fed_resolve_start(fed_resolver *r);
/* Look server_name up; never blocks. 0: cb is called exactly once (possibly before this
 * returns). A negative error: cb is never called. */
int fed_resolve_lookup(fed_resolver *r, const char *server_name, fed_resolve_cb cb, void *arg);
void fed_resolve_stop(fed_resolver *r);
void fed_resolve_free(fed_resolver *r);

/* Pure helpers, exposed for unit tests and for fed_request.c. */
/* Split a server name into host and port (0 when absent); false when it is not a valid
 * server name (the spec's grammar: hostname, IPv4 literal or [IPv6] literal, optional
 * :port 1-65535). */
bool fed_server_name_split(const char *server_name, char *host, size_t host_len, int *port);

#endif
