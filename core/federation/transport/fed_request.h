/*
 * core/federation/transport/fed_request.h - one federation request to another server, end to end:
 * the domain whitelist, the destination's backoff, discovery (fed_resolve.h), the X-Matrix
 * signature, the one outbound client (fed_http.h), and the backoff bookkeeping of the
 * outcome. Everything that calls another Matrix server goes through fed_request_submit.
 *
 * It never blocks its caller: the callback comes later on an internal thread (the
 * resolver's or the outbound client's), where it must be quick. A request handler that
 * needs the answer parks (susp_wait) and is woken from the callback.
 *
 * Internal prefix: fed_request_.
 */
#ifndef ATRIUM_CORE_FED_REQUEST_H
#define ATRIUM_CORE_FED_REQUEST_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/federation/transport/fed_http.h"

/* Outcomes beyond enum fed_http_outcome (fed_response.outcome). */
enum fed_request_outcome {
    FED_REQ_E_BACKOFF = -20,     /* the destination failed recently: not contacted */
    FED_REQ_E_NOT_ALLOWED = -21, /* not in federation.domain_whitelist, or ourselves */
    FED_REQ_E_RESOLVE = -22,     /* discovery found nowhere to connect */
    FED_REQ_E_NOT_JSON = -23,    /* want_json: the body is not a JSON object */
    FED_REQ_E_URI_TOO_LONG = -24, /* an ID did not fit in the request URI: not sent */
};

typedef struct fed_response {
    int outcome;         /* FED_HTTP_OK or a negative fed_http / fed_request outcome */
    int status;          /* HTTP status when outcome == FED_HTTP_OK */
    const json_t *json;  /* the body parsed, when the request asked for JSON and got it */
    const char *body;    /* the raw body (NULL when streamed) */
    size_t body_len;
    const char *error;   /* a sentence for logs when outcome != OK */
    const char *destination;
    fed_http_handle *handle; /* for fed_http_handle_header, during the callback only */
} fed_response;

typedef struct fed_request_opts {
    const char *method;      /* "GET", "PUT", "POST" */
    const char *destination; /* a server name */
    const char *uri;         /* path and query, encoded as sent: "/_matrix/federation/v1/..." */
    const json_t *body;      /* JSON content (copied and signed), or NULL */
    int64_t deadline_ms;     /* monotonic; 0 = now + federation.client.request_timeout_ms */
    int64_t max_body_bytes;  /* 0 = FED_REQUEST_DEFAULT_MAX_BODY_BYTES */
    bool unsigned_request;   /* no X-Matrix (key fetches: /_matrix/key/v2/server) */
    bool ignore_backoff;     /* a user's explicit action: contact it even while backed off */
    bool want_json;          /* parse the body as a JSON object (outcome NOT_JSON if not) */
    bool v1_envelope;        /* want_json: a 2xx body is the v1 form's [status, object] and
                              * res->json is its object (outcome NOT_JSON if it is not) */
    int (*on_chunk)(void *arg, fed_http_handle *h, const char *data, size_t len);
    void (*on_done)(void *arg, const fed_response *res); /* exactly once iff submit == 0 */
    void *arg;
    /* Instead of destination + uri: an absolute https URL (a Location another server gave,
     * or a push gateway's notify URL), fetched with GET and no body or POSTed a JSON body,
     * unsigned, without backoff or the domain whitelist; its host[:port] (443 by
     * default) is discovered like a server name with an explicit port, so it resolves
     * A/AAAA only, and the address blacklist applies at connect as always. */
    const char *url;
    /* With url: an http:// URL is accepted too (port 80 by default), sent in the clear,
     * under the same blacklist, deadline and size bound. Set by the push sender (Sygnal is
     * often reached over http on an internal address) and for a plugin's URL request with
     * ATRIUM_FED_ALLOW_HTTP (the media plugin's URL previews); federation is always https. */
    bool url_allow_http;
    /* With url: PUT with a JSON body is accepted too, and this is one more header line
     * ("Authorization: Bearer ..."; no CR or LF), or NULL. The application service sender
     * (core/client/appservice/as_sender.c) sets both. */
    const char *url_header;
    /* With url: the operator configured it (an application service), so the address
     * blacklist does not apply (fed_http_req.operator_destination). */
    bool operator_destination;
} fed_request_opts;

#define FED_REQUEST_DEFAULT_MAX_BODY_BYTES (16 * 1024 * 1024)

/* Submit; never blocks. 0: on_done is called exactly once, possibly before this returns.
 * A negative atrium_err (ATRIUM_E_LIMIT, _STOPPED, _INVAL, _NOMEM): on_done is never
 * called. Any thread, once federation is started (federation.h). */
int fed_request_submit(const fed_request_opts *o);

/* Is origin allowed by federation.domain_whitelist (empty = every server)? Any thread. */
bool fed_domain_allowed(const char *server_name);

#endif
