/*
 * core/federation/transport/fed_http_transfer.h - one outbound transfer of the outbound client,
 * internal to fed_http.c and fed_http_transfer.c (callers use fed_http.h).
 *
 * The split: fed_http.c owns the client (queue, I/O thread, caps, deadlines, metrics, the
 * one place a request ends); fed_http_transfer.c owns what one request is (its copy, its
 * libcurl easy handle and options, and the callbacks that enforce the body and header
 * caps and the address rule, and the reading of a curl error as an outcome). Everything
 * in a handle past the copied request belongs to the I/O thread.
 */
#ifndef ATRIUM_CORE_FED_HTTP_TRANSFER_H
#define ATRIUM_CORE_FED_HTTP_TRANSFER_H

#include <curl/curl.h>

#include "core/federation/transport/fed_http.h"
#include "core/runtime/iprange.h"

#define FED_HTTP_ERROR_BYTES 512
#define FED_HTTP_MAX_HEADER_BYTES (64 * 1024) /* of one response's header block */
#define FED_HTTP_MAX_CONNECT_ADDRS 16

/* What every connection of the client obeys; lives as long as the client. */
typedef struct fed_http_rules {
    const rt_iprange_list *blacklist, *whitelist;
    const struct curl_blob *ca_blob; /* NULL: the system's store */
} fed_http_rules;

typedef struct fed_http_hdr {
    char *name, *value;
} fed_http_hdr;

struct fed_http_handle {
    fed_http_handle *next, *prev; /* the client's submission queue, then its running list */

    /* The request, copied at submit. */
    char *method, *url, *host_key, *body, *content_type, *host_header;
    size_t body_len;
    char **headers;     /* NULL-terminated */
    char *resolve_line; /* "host:port:addr,addr" or NULL for an IP-literal URL */
    bool https;
    int64_t deadline_ms, max_body_bytes;
    bool verify_tls;
    bool operator_destination; /* fed_http_req's: no address blacklist */
    int (*on_chunk)(void *arg, fed_http_handle *h, const char *data, size_t len);
    void (*on_done)(void *arg, const fed_http_result *res);
    void *arg;

    bool cancel_req; /* under the client's lock */

    /* The I/O thread's. */
    const fed_http_rules *rules;
    CURL *easy;
    bool added; /* to the multi handle */
    struct curl_slist *header_list, *resolve_list;
    char errbuf[CURL_ERROR_SIZE];
    int status; /* of the response being read (reset by each status line) */
    fed_http_hdr *hdrs;
    size_t n_hdrs, cap_hdrs, header_bytes;
    char *buf; /* the buffered body */
    size_t len, cap;
    int64_t received; /* body bytes, buffered or streamed */
    bool too_large, chunk_refused, out_of_memory, blocked;
    char why[FED_HTTP_ERROR_BYTES]; /* what too_large/blocked refers to */
    rt_metric *host_gauge;
};

/* A validated copy of req, or NULL with *rc = ATRIUM_E_INVAL (malformed) or
 * ATRIUM_E_NOMEM. Any thread. */
fed_http_handle *fed_http_handle_new(const fed_http_req *req, int *rc);
void fed_http_handle_free(fed_http_handle *h); /* with its easy handle, if any */
/* Create and configure h's easy handle under `rules`. false when libcurl refused (the
 * caller ends the request E_INTERNAL). I/O thread. */
bool fed_http_transfer_setup(fed_http_handle *h, const fed_http_rules *rules);
/* How a transfer that curl finished with rc ended: an enum fed_http_outcome, and in msg
 * (n bytes) the sentence for fed_http_result.error. I/O thread. */
int fed_http_transfer_outcome(fed_http_handle *h, CURLcode rc, char *msg, size_t n);

#endif
