/*
 * core/federation/transport/fed_request.c - one outbound federation request, end to end: allowed?
 * backed off? where to? signed, sent through the one client, and its outcome recorded for
 * the destination's backoff.
 *
 * The steps run on whichever internal thread finished the previous one (the caller's for
 * the checks, the resolver's after discovery, the outbound client's I/O thread at the
 * end), so nothing here blocks and the caller's callback must be quick too. What counts as
 * a failure for backoff: no connection, a TLS failure, a timeout, discovery finding
 * nothing, or a 5xx answer; any other HTTP answer (a 404 included) proves the server is
 * there and resets it. A request refused by the address blacklist is not the peer's fault
 * and does not back it off.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/federation/transport/fed_internal.h"
#include "core/runtime/server_name.h"

typedef struct fed_req_state {
    fed_request_opts o;
    char *destination, *uri, *method;
    char *body; /* the canonical JSON sent */
    size_t body_len;
    char auth[FED_AUTH_HEADER_BYTES];
    char host_hdr[FED_RESOLVE_NAME_BYTES + 8];
    int64_t deadline_ms;
    bool plain_http; /* a URL request to an http:// URL (url_allow_http) */
    char *url_header; /* o->url_header, copied */
} fed_req_state;

static void state_free(fed_req_state *st)
{
    free(st->destination);
    free(st->uri);
    free(st->method);
    free(st->body);
    free(st->url_header);
    free(st);
}

/* Report and free: the one exit of every request. */
static void finish(fed_req_state *st, const fed_response *res)
{
    st->o.on_done(st->o.arg, res);
    state_free(st);
}

static void finish_error(fed_req_state *st, int outcome, const char *error)
{
    fed_response res = {.outcome = outcome, .error = error, .destination = st->destination};
    finish(st, &res);
}

bool fed_domain_allowed(const char *server_name)
{
    const struct core_federation *f = &fed_state()->cfg->federation;
    if (f->n_domain_whitelist == 0) return true;
    for (size_t i = 0; i < f->n_domain_whitelist; i++)
        if (strcmp(f->domain_whitelist[i], server_name) == 0) return true;
    return false;
}

static bool verify_tls_for(const char *destination)
{
    const struct core_federation *f = &fed_state()->cfg->federation;
    if (!f->verify_certificates) return false;
    for (size_t i = 0; i < f->n_certificate_verification_whitelist; i++)
        if (strcmp(f->certificate_verification_whitelist[i], destination) == 0) return false;
    return true;
}

static bool counts_as_failure(int outcome, int status)
{
    switch (outcome) {
    case FED_HTTP_OK: return status >= 500;
    case FED_HTTP_E_TIMEOUT:
    case FED_HTTP_E_CONNECT:
    case FED_HTTP_E_TLS:
    case FED_HTTP_E_PROTOCOL:
    case FED_REQ_E_RESOLVE: return true;
    default: return false;
    }
}

static void record_outcome(fed_req_state *st, int outcome, int status)
{
    fed_backoff *b = fed_state()->backoff;
    if (!b) return;
    if (counts_as_failure(outcome, status))
        fed_backoff_failure(b, st->destination);
    else if (outcome == FED_HTTP_OK)
        fed_backoff_success(b, st->destination);
}

/* The transfer calls back with our state as its argument; the caller's on_chunk gets its
 * own argument. */
static int http_chunk(void *arg, fed_http_handle *h, const char *data, size_t len)
{
    fed_req_state *st = arg;
    return st->o.on_chunk(st->o.arg, h, data, len);
}

static void http_done(void *arg, const fed_http_result *hr)
{
    fed_req_state *st = arg;
    record_outcome(st, hr->outcome, hr->status);
    fed_response res = {.outcome = hr->outcome, .status = hr->status, .body = hr->body,
                        .body_len = hr->body_len, .error = hr->error,
                        .destination = st->destination, .handle = hr->handle};
    json_t *j = NULL;
    char why[160];
    if (hr->outcome == FED_HTTP_OK && st->o.want_json && hr->body) {
        json_error_t jerr;
        j = json_loadb(hr->body, hr->body_len, JSON_REJECT_DUPLICATES, &jerr); /* fed_auth.c */
        if (j && st->o.v1_envelope && hr->status / 100 == 2) {
            json_t *inner = json_is_array(j) && json_array_size(j) == 2 &&
                                    json_is_integer(json_array_get(j, 0))
                                ? json_incref(json_array_get(j, 1))
                                : NULL;
            json_decref(j);
            j = inner;
        }
        if (!j || !json_is_object(j)) {
            snprintf(why, sizeof(why), "%s answered %d with a body that is not a JSON object",
                     st->destination, hr->status);
            res.outcome = FED_REQ_E_NOT_JSON;
            res.error = why;
        } else {
            res.json = j;
        }
    } else if (hr->outcome != FED_HTTP_OK) {
        /* A refused address is the operator's business (a blacklist, or an attack); the
         * rest is the peer's, and backoff keeps its repetitions few. */
        rt_log(hr->outcome == FED_HTTP_E_BLOCKED ? ATRIUM_LOG_WARN : ATRIUM_LOG_INFO,
               "federation", "%s %s%s: %s", st->method, st->destination, st->uri, hr->error);
    }
    finish(st, &res);
    if (j) json_decref(j);
}

static void resolved(void *arg, int rc, const fed_target *t, const char *error)
{
    fed_req_state *st = arg;
    if (rc < 0) {
        /* Only the name's own failures back it off: not a full table of discoveries, a
         * stopping resolver or our memory. */
        if (rc != ATRIUM_E_LIMIT && rc != ATRIUM_E_STOPPED && rc != ATRIUM_E_NOMEM)
            record_outcome(st, FED_REQ_E_RESOLVE, 0);
        char why[320];
        snprintf(why, sizeof(why), "cannot find %s: %s", st->destination, error ? error : "");
        finish_error(st, FED_REQ_E_RESOLVE, why);
        return;
    }
    char url[FED_RESOLVE_NAME_BYTES + 64 + 4096];
    bool v6 = strchr(t->tls_name, ':') != NULL;
    int n = snprintf(url, sizeof(url), "%s://%s%s%s:%d%s", st->plain_http ? "http" : "https",
                     v6 ? "[" : "", t->tls_name, v6 ? "]" : "", t->port, st->uri);
    if (n < 0 || (size_t)n >= sizeof(url)) {
        finish_error(st, FED_HTTP_E_INTERNAL, "the request URI is too long");
        return;
    }
    const char *addrs[FED_RESOLVE_MAX_ADDRS + 1];
    int na = 0;
    for (int i = 0; i < t->n_addrs && i < FED_RESOLVE_MAX_ADDRS; i++) addrs[na++] = t->addrs[i];
    addrs[na] = NULL;
    const char *headers[3];
    int nh = 0;
    if (st->auth[0]) headers[nh++] = st->auth;
    if (st->url_header) headers[nh++] = st->url_header;
    headers[nh] = NULL;
    fed_http_req hq = {
        .method = st->method,
        .url = url,
        .connect_addrs = na ? addrs : NULL,
        .host_header = t->host_header,
        .headers = headers,
        .body = st->body,
        .body_len = st->body_len,
        .content_type = st->body ? "application/json" : NULL,
        .deadline_ms = st->deadline_ms,
        .max_body_bytes = st->o.max_body_bytes > 0 ? st->o.max_body_bytes
                                                   : FED_REQUEST_DEFAULT_MAX_BODY_BYTES,
        .verify_tls = verify_tls_for(st->destination),
        .operator_destination = st->o.operator_destination,
        .host_key = st->destination,
        .on_chunk = st->o.on_chunk ? http_chunk : NULL,
        .on_done = http_done,
        .arg = st,
    };
    int src = fed_http_submit(fed_state()->http, &hq, NULL);
    if (src < 0)
        finish_error(st, src == ATRIUM_E_LIMIT ? FED_HTTP_E_INTERNAL : FED_HTTP_E_CANCELLED,
                     src == ATRIUM_E_LIMIT ? "the outbound queue is full" : "stopping");
}

static int fed_request_submit_to(const fed_request_opts *o, bool server, bool plain_http);

/* A URL request (o->url): the host[:port] to discover and the path to ask; *plain_http
 * when it is an http:// URL, which only allow_http accepts. */
static int url_target(const char *url, bool allow_http, char *dest, size_t dest_cap,
                      char *path, size_t path_cap, bool *plain_http)
{
    fed_url base = {.scheme = "https", .host = "invalid", .port = 443, .path = "/"}, u;
    bool https = strncasecmp(url, "https://", 8) == 0; /* as fed_url_resolve reads it */
    bool http = allow_http && strncasecmp(url, "http://", 7) == 0;
    if (!(https || http) || fed_url_resolve(&base, url, &u) < 0) return -1;
    if (strcmp(u.scheme, https ? "https" : "http") != 0) return -1;
    *plain_http = http;
    bool v6 = strchr(u.host, ':') != NULL;
    int n = snprintf(dest, dest_cap, "%s%s%s:%d", v6 ? "[" : "", u.host, v6 ? "]" : "",
                     u.port > 0 ? u.port : https ? 443 : 80);
    if (n < 0 || (size_t)n >= dest_cap) return -1;
    n = snprintf(path, path_cap, "%s", u.path[0] ? u.path : "/");
    return n < 0 || (size_t)n >= path_cap ? -1 : 0;
}

int fed_request_submit(const fed_request_opts *o)
{
    fed_module *m = fed_state();
    if (!m || !m->http || !m->resolver) return ATRIUM_E_STOPPED;
    if (o && o->url) {
        char dest[FED_RESOLVE_NAME_BYTES + 16], path[1024];
        bool get = o->method && strcmp(o->method, "GET") == 0 && !o->body;
        bool post = o->method && strcmp(o->method, "POST") == 0 && o->body;
        bool put = o->method && strcmp(o->method, "PUT") == 0 && o->body && o->url_header;
        bool plain_http = false;
        if (!(get || post || put) || url_target(o->url, o->url_allow_http, dest, sizeof(dest), path,
                                         sizeof(path), &plain_http) < 0)
            return ATRIUM_E_INVAL;
        fed_request_opts copy = *o;
        copy.url = NULL;
        copy.destination = dest;
        copy.uri = path;
        copy.unsigned_request = true;
        copy.ignore_backoff = true;
        return fed_request_submit_to(&copy, false, plain_http);
    }
    return fed_request_submit_to(o, true, false);
}

/* Submit to a server (checked: not this server, in the whitelist) or to a URL's host
 * (over http when plain_http). */
static int fed_request_submit_to(const fed_request_opts *o, bool server, bool plain_http)
{
    fed_module *m = fed_state();
    if (!o || !o->method || !o->destination || !o->uri || o->uri[0] != '/' || !o->on_done)
        return ATRIUM_E_INVAL;
    fed_req_state *st = calloc(1, sizeof(*st));
    if (!st) return ATRIUM_E_NOMEM;
    st->o = *o;
    st->plain_http = plain_http;
    st->destination = strdup(o->destination);
    st->uri = strdup(o->uri);
    st->method = strdup(o->method);
    st->url_header = o->url_header && !server ? strdup(o->url_header) : NULL;
    if (!st->destination || !st->uri || !st->method ||
        (o->url_header && !server && !st->url_header)) {
        state_free(st);
        return ATRIUM_E_NOMEM;
    }
    st->deadline_ms = o->deadline_ms > 0 ? o->deadline_ms
                                         : rt_now_ms() + m->cfg->federation.request_timeout_ms;
    if (o->body) {
        st->body = cjson_encode(o->body, &st->body_len);
        if (!st->body) {
            state_free(st);
            return ATRIUM_E_INVAL;
        }
    }
    if (server && !rt_server_name_valid(o->destination)) {
        /* The endpoints refuse such names with a 400 first; this keeps any path that does
         * not from a discovery and a backoff entry for a name that is not one. */
        finish_error(st, FED_REQ_E_NOT_ALLOWED, "the destination is not a server name");
        return 0;
    }
    if (server &&
        (strcmp(o->destination, m->server_name) == 0 || !fed_domain_allowed(o->destination))) {
        finish_error(st, FED_REQ_E_NOT_ALLOWED,
                     "the destination is this server or not in federation.domain_whitelist");
        return 0;
    }
    if (!o->ignore_backoff && m->backoff) {
        int64_t wait = fed_backoff_retry_in_ms(m->backoff, o->destination, rt_wall_ms());
        if (wait > 0) {
            char why[160];
            snprintf(why, sizeof(why), "%s failed recently; next try in %lld s",
                     o->destination, (long long)((wait + 999) / 1000));
            finish_error(st, FED_REQ_E_BACKOFF, why);
            return 0;
        }
    }
    if (!o->unsigned_request &&
        fed_xmatrix_header(o->method, o->uri, m->server_name, o->destination, o->body,
                           &m->key, st->auth + 15, sizeof(st->auth) - 15) < 0) {
        state_free(st);
        return ATRIUM_E_INVAL;
    }
    if (!o->unsigned_request) memcpy(st->auth, "Authorization: ", 15);
    int rc = fed_resolve_lookup(m->resolver, o->destination, resolved, st);
    if (rc < 0) {
        state_free(st);
        return rc;
    }
    return 0;
}

