/*
 * core/federation/transport/fed_http.h - the one outbound HTTP client: one I/O thread owning one
 * libcurl multi handle, which every outbound request of the server goes through (signed
 * federation requests, key fetches, .well-known look-ups, later remote media and push).
 *
 * Why one thread and one multi handle: connections are a bounded resource like any other,
 * so they are counted in one place (a total cap and a per-host cap, so one slow peer can
 * never take every connection), kept alive and reused across callers, and no caller's
 * thread ever waits on a peer. Callers submit through a bounded queue and
 * curl_multi_wakeup; the I/O thread adds the transfer, drives it, and calls back.
 *
 * This layer knows nothing of Matrix: it does not sign (fed_request.c adds X-Matrix), it
 * does not resolve server names (fed_resolve.c does discovery and hands the addresses to
 * connect to), and it never follows redirects (a caller that wants one resolves the new
 * location itself, so the address check below applies to every hop).
 *
 * No SSRF: every socket the client opens is checked against the address blacklist and
 * whitelist (core/runtime/iprange.h) at connect time, on the address actually being connected to
 * (CURLOPT_OPENSOCKETFUNCTION), so a DNS answer that changed since it was checked cannot
 * bypass it. A refused address fails the request with FED_HTTP_E_BLOCKED.
 *
 * Internal prefix: fed_http_. Threads: fed_http_submit and fed_http_cancel from any
 * thread; callbacks on the I/O thread (quick, never blocking: no PostgreSQL, no waits).
 */
#ifndef ATRIUM_CORE_FED_HTTP_H
#define ATRIUM_CORE_FED_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/runtime/runtime.h"

typedef struct fed_http fed_http;               /* the client: one per process */
typedef struct fed_http_handle fed_http_handle; /* one submitted request */
typedef struct fed_http_result fed_http_result; /* how one request ended (below) */
typedef struct rt_iprange_list rt_iprange_list;

/* How a request ended (fed_http_result.outcome). */
enum fed_http_outcome {
    FED_HTTP_OK = 0,            /* an HTTP response arrived (any status) */
    FED_HTTP_E_TIMEOUT = -1,    /* the deadline passed (connecting, sending or reading) */
    FED_HTTP_E_CONNECT = -2,    /* no connection could be made (refused, unreachable) */
    FED_HTTP_E_TLS = -3,        /* TLS handshake or certificate verification failed */
    FED_HTTP_E_BLOCKED = -4,    /* the address is on the blacklist: never connected */
    FED_HTTP_E_TOO_LARGE = -5,  /* the body passed max_body_bytes (declared or while read) */
    FED_HTTP_E_PROTOCOL = -6,   /* a malformed HTTP answer, or the peer closed mid-body */
    FED_HTTP_E_CANCELLED = -7,  /* fed_http_cancel, an on_chunk refusal, or shutdown */
    FED_HTTP_E_INTERNAL = -8,   /* out of memory, a curl setup failure */
};

typedef struct fed_http_settings {
    /* <= 0 takes the default. The per-host cap counts connections per URL host and port
     * (curl's rule; HTTP/2 multiplexes many requests on one). */
    int max_connections;          /* CURLMOPT_MAX_TOTAL_CONNECTIONS (default 16) */
    int max_connections_per_host; /* CURLMOPT_MAX_HOST_CONNECTIONS (default 8) */
    int queue_depth;              /* submitted but not yet taken by the I/O thread (1024) */
    /* PEM files of the CAs trusted for TLS, instead of the system's; NULL/0 = system. */
    const char *const *ca_files;
    size_t n_ca_files;
    const rt_iprange_list *blacklist; /* refused at connect... */
    const rt_iprange_list *whitelist; /* ...unless listed here (may be NULL) */
} fed_http_settings;

typedef struct fed_http_req {
    const char *method; /* "GET", "POST", "PUT", "DELETE"; anything else is E_INVAL */
    /* Absolute URL, "https://host:port/path?query". The URL's host is the TLS SNI name and
     * the name the certificate must match; for an IP literal host the IP. */
    const char *url;
    /* IP literals to connect to for the URL's host and port, in order of preference
     * (NULL-terminated; at least one unless the URL's host is an IP literal). The client
     * never resolves names itself. */
    const char *const *connect_addrs; /* ignored for an IP-literal URL */
    const char *host_header;       /* Host header to send; NULL = the URL's host[:port] */
    /* Extra "Name: value" lines, NULL-terminated, or NULL; "Name:" removes one curl would
     * send. No CR or LF anywhere in a header, host_header or content_type (E_INVAL). */
    const char *const *headers;
    const char *body;              /* copied at submit; NULL = no body */
    size_t body_len;
    const char *content_type;      /* of the body (e.g. "application/json"), or NULL */
    int64_t deadline_ms;           /* monotonic (rt_now_ms), > 0; the request fails then */
    int64_t max_body_bytes;        /* the response body is cut off (E_TOO_LARGE) past this;
                                      >= 0 */
    bool verify_tls;               /* false only for development destinations (logged) */
    /* The address blacklist does not apply: a destination the operator configured (an
     * application service's URL), never one a user or another server named. */
    bool operator_destination;
    /* Per-host accounting key for the per-host cap and metrics (the destination server
     * name); NULL = the URL's host. Copied. */
    const char *host_key;
    /* Optional streaming: called for each chunk of the response body as it arrives, after
     * the status and headers are known (fed_http_handle_status/header work inside it).
     * Return 0 to go on, non-zero to abort (the request then ends E_CANCELLED). With
     * on_chunk set the result holds no body. */
    int (*on_chunk)(void *arg, fed_http_handle *h, const char *data, size_t len);
    /* Called exactly once when the request ends, whatever the outcome, if and only if
     * fed_http_submit returned 0. The result and everything it points to is valid only
     * during the call. */
    void (*on_done)(void *arg, const fed_http_result *res);
    void *arg;
} fed_http_req;

typedef struct fed_http_result {
    int outcome;              /* enum fed_http_outcome */
    int status;               /* HTTP status when outcome == FED_HTTP_OK, else 0 */
    /* The buffered body (NUL-terminated; "" when empty) when outcome == FED_HTTP_OK and
     * on_chunk is not set; else NULL. */
    const char *body;
    size_t body_len;
    const char *error;        /* a sentence for logs when outcome != OK, else "" */
    const char *connected_ip; /* the address the response came from, or "" */
    fed_http_handle *handle;  /* for fed_http_handle_header */
} fed_http_result;

/* The client, its I/O thread not yet started. Copies what it needs from `s` (the lists
 * must outlive the client). Metrics: atrium_federation_outbound_{requests_total{outcome},
 * in_flight,queued,refused_total} and atrium_federation_outbound_host_in_flight{host}.
 * NULL on failure (logged). */
fed_http *fed_http_new(const fed_http_settings *s, rt_metrics *metrics);
int fed_http_start(fed_http *c); /* start the I/O thread: 0 or ATRIUM_E_IO */
/* Submit a request; never blocks. 0: on_done will be called exactly once (possibly before
 * this returns, on another thread). ATRIUM_E_LIMIT: the queue is full; ATRIUM_E_STOPPED:
 * the client is stopping; ATRIUM_E_INVAL: a malformed request; ATRIUM_E_NOMEM. On an
 * error on_done is never called. `*out` (may be NULL) gets a handle valid until on_done returns. */
int fed_http_submit(fed_http *c, const fed_http_req *req, fed_http_handle **out);
/* Ask for the request to end now with E_CANCELLED (on_done is still called once). Safe
 * to call with a handle whose request already ended only before on_done returned. */
void fed_http_cancel(fed_http *c, fed_http_handle *h);
/* Inside on_chunk or on_done: the response status and a response header (case-
 * insensitive; the last one when repeated), or NULL. */
int fed_http_handle_status(fed_http_handle *h);
const char *fed_http_handle_header(fed_http_handle *h, const char *name);
/* Stop: refuse new submissions, end every request with E_CANCELLED, join the thread.
 * Never from a callback. Without fed_http_start, queued requests end on this thread. */
void fed_http_stop(fed_http *c);
void fed_http_free(fed_http *c); /* stops first if need be */

#endif
