/*
 * core/federation/transport/fed_resolve.h - server discovery: from a Matrix server name to where to
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
 * Internal prefix: fed_resolve_ (and fed_ for the pure helpers at the end).
 * fed_resolve_lookup from any thread; callbacks on the resolver's thread (quick, never
 * blocking), or on the caller's when no look-up is needed.
 */
#ifndef ATRIUM_CORE_FED_RESOLVE_H
#define ATRIUM_CORE_FED_RESOLVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/federation/transport/fed_http.h"
#include "core/runtime/runtime.h"

#define FED_RESOLVE_MAX_ADDRS 8
#define FED_RESOLVE_NAME_BYTES 256
#define FED_RESOLVE_DEFAULT_PORT 8448

typedef struct fed_resolver fed_resolver;

/* Where a request for a server name goes. Build the URL as
 * "https://<tls_name>:<port>/path" (bracket an IPv6 literal) and connect to addrs. */
typedef struct fed_target {
    char tls_name[FED_RESOLVE_NAME_BYTES];    /* URL host, SNI and certificate name */
    int port;
    char host_header[FED_RESOLVE_NAME_BYTES]; /* the Host header to send */
    char addrs[FED_RESOLVE_MAX_ADDRS][64];    /* IP literals to connect to, in order */
    int n_addrs;
    /* Which step of the algorithm decided (a static string): "ip-literal",
     * "explicit-port", "well-known" (the delegated name was an IP literal or had a port),
     * "well-known+srv", "well-known+srv-legacy", "well-known+default" (the delegated
     * name through SRV, the deprecated SRV or port 8448), "srv", "srv-legacy",
     * "default". */
    const char *step;
} fed_target;

typedef struct fed_resolve_settings {
    /* DNS servers "ip" or "ip:port" ("[v6]:port"), NULL/0 = the system's
     * /etc/resolv.conf: tests point this at a DNS server of their own on loopback. */
    const char *const *dns_servers;
    size_t n_dns_servers;
    int64_t lookup_timeout_ms;       /* a whole discovery (DNS + .well-known); 0 = 15 s */
    int64_t well_known_max_bytes;    /* a larger .well-known answer is an error; 0 = 50 KiB */
    bool verify_tls;                 /* for .well-known fetches */
    /* The shortest time a valid .well-known answer is kept whatever its headers say
     * (no-store, max-age=0 included), so a peer cannot make us fetch at every request;
     * 0 = 5 minutes, a negative value = no floor (tests). */
    int64_t well_known_min_cache_ms;
    /* Test knobs, never set in production: the .well-known fetch goes to
     * "<well_known_scheme>://<hostname>:<well_known_port>/.well-known/matrix/server"
     * instead of "https://<hostname>/..." on port 443 (NULL/0 = the spec's). Redirects may
     * then use that scheme too. */
    const char *well_known_scheme;
    int well_known_port;
    /* Bounds of the caches (entries); 0 = 4096 DNS answers, 1024 .well-known answers. */
    int dns_cache_entries;
    int well_known_cache_entries;
    /* Discoveries of different names running at once (the table of them is keyed by names
     * others choose); past it a look-up fails at once with ATRIUM_E_LIMIT. 0 = 1024. */
    int max_in_flight;
} fed_resolve_settings;

/* 0 = found (target filled), or a negative enum atrium_err with a sentence in `error`:
 * ATRIUM_E_NOTFOUND (the name does not resolve, or its SRV record says "no service"),
 * ATRIUM_E_TIMEOUT (lookup_timeout_ms passed), ATRIUM_E_INVAL (not a valid server name),
 * ATRIUM_E_IO (the DNS servers failed and nothing was cached), ATRIUM_E_STOPPED (the
 * resolver stopped first), ATRIUM_E_LIMIT (max_in_flight discoveries were running: not
 * the name's fault). `target` is valid only during the call. */
typedef void (*fed_resolve_cb)(void *arg, int rc, const fed_target *target,
                               const char *error);

/* A resolver, its thread not yet started. Copies the settings. Metrics:
 * atrium_federation_discovery_total{step}, atrium_federation_discovery_failed_total,
 * atrium_federation_discovery_cache_{hits,misses}_total{cache="dns"|"well_known"} and
 * the gauges atrium_federation_discovery_cached_names{cache} and
 * atrium_federation_discoveries_in_flight, the counter
 * atrium_federation_discoveries_refused_total (max_in_flight reached). NULL on failure
 * (logged: c-ares could not start, a bad dns_servers entry). `http` must outlive the resolver. */
fed_resolver *fed_resolve_new(const fed_resolve_settings *s, fed_http *http,
                              rt_metrics *metrics);
int fed_resolve_start(fed_resolver *r); /* start the resolver's thread: 0 or ATRIUM_E_IO */
/* Look server_name up; never blocks. 0: cb is called exactly once, on the resolver's
 * thread, or before this returns on the caller's thread when no look-up is needed (an IP
 * literal, an invalid name). A negative error (ATRIUM_E_STOPPED: not running or
 * stopping; ATRIUM_E_NOMEM): cb is never called. Concurrent look-ups of one name share
 * one discovery. */
int fed_resolve_lookup(fed_resolver *r, const char *server_name, fed_resolve_cb cb, void *arg);
/* Stop the thread: discoveries still running end with ATRIUM_E_STOPPED (their callbacks
 * run before this returns). Then stop the outbound client, then free both. */
void fed_resolve_stop(fed_resolver *r);
void fed_resolve_free(fed_resolver *r); /* after fed_resolve_stop and fed_http_stop */

/* ---- pure helpers (fed_resolve_parse.c), exposed for unit tests and fed_request.c ---- */

/* Split a server name into host and port (0 when absent); false when it is not a valid
 * server name (rt_server_name_valid, core/runtime/server_name.h: the one grammar). An
 * IPv6 host is written without its brackets. */
bool fed_server_name_split(const char *server_name, char *host, size_t host_len, int *port);
/* Is host (as fed_server_name_split writes it) an IPv4 or IPv6 literal? */
bool fed_host_is_ip_literal(const char *host);

/* How long a response may be cached according to its Cache-Control and Expires headers
 * (either may be NULL), in ms: no-store or no-cache give 0, max-age=N gives N s, else
 * Expires minus now_wall_ms (an invalid or past date gives 0); -1 when neither says
 * anything (the caller's default applies). */
int64_t fed_resolve_cache_period_ms(const char *cache_control, const char *expires,
                                    int64_t now_wall_ms);

/* Validate a /.well-known/matrix/server body: 0 with the delegated server name (m.server,
 * which must be a valid server name) copied to out, or -1 with the reason in err. */
int fed_well_known_parse(const char *body, size_t len, char *out, size_t out_len, char *err,
                         size_t errlen);

typedef struct fed_srv_record {
    char target[FED_RESOLVE_NAME_BYTES];
    int port, priority, weight;
} fed_srv_record;
/* Put SRV records in the order to try them (RFC 2782): ascending priority, and within a
 * priority a weighted random order; rnd gives the random numbers (NULL = always 0). */
void fed_srv_order(fed_srv_record *recs, size_t n, uint32_t (*rnd)(void *arg), void *rnd_arg);
/* The answer is the single record with target "." ("decidedly not available"). */
bool fed_srv_says_no_service(const fed_srv_record *recs, size_t n);

/* The smallest TTL in seconds of the answer records of `type` in a DNS message (RFC
 * 2181: a TTL with the top bit set counts as 0), or -1 when there is none or the message
 * is malformed. */
int64_t fed_dns_min_ttl(const unsigned char *msg, size_t len, int type);

typedef struct fed_url {
    char scheme[8]; /* "https" or "http" */
    char host[FED_RESOLVE_NAME_BYTES]; /* IPv6 without brackets */
    int port;
    char path[1024]; /* with the query, never a fragment */
} fed_url;
/* Resolve a redirect's Location against the URL it answered: an absolute http(s) URL or
 * an absolute path. 0, or -1 for anything else (relative paths, other schemes, userinfo,
 * an invalid host). */
int fed_url_resolve(const fed_url *base, const char *location, fed_url *out);

#endif
