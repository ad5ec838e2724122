/*
 * core/client/appservice/as_thirdparty.c - the third-party network endpoints of the client
 * API, answered by the application services that bridge each protocol:
 * GET /thirdparty/protocols (from the registrations' `protocols`), and
 * GET /thirdparty/protocol/{protocol}, /thirdparty/user/{protocol} and
 * /thirdparty/location/{protocol}, forwarded to the first service (in file order) that
 * declares the protocol and has a url: GET {url}/_matrix/app/v1/thirdparty/...{query} with
 * its hs_token, its JSON answer passed on.
 *
 * A forwarded look-up waits parked (susp_wait) under the outbound budget (ADR-0079), as the
 * ping does (as_module.c); a service that cannot be reached or answers no JSON is 502, no
 * answer in time 504, its own refusal (4xx) passed on. The protocol list is not forwarded:
 * it names the protocols with empty field lists, which is enough for a client to offer
 * them. The reverse look-ups (/thirdparty/user?userid=, /thirdparty/location?alias=) are
 * not served.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/accounts/accounts.h"
#include "core/client/appservice/appservice.h"
#include "core/client/client.h"
#include "core/federation/transport/fed_request.h"
#include "core/runtime/uri.h"

#define AS_THIRDPARTY_MAX_ANSWER_BYTES (256 * 1024)
#define AS_THIRDPARTY_URL_BYTES 2048

/* A description of a protocol from its name alone. */
static json_t *protocol_object(void)
{
    return json_pack("{s:[], s:[], s:s, s:{}, s:[]}", "user_fields", "location_fields",
                     "icon", "", "field_types", "instances");
}

static int get_protocols(atrium_req *r)
{
    if (!auth_request(r)) return ATRIUM_DONE;
    json_t *out = json_object();
    for (size_t i = 0; i < as_count(); i++) {
        const as_service *s = as_at(i);
        for (size_t j = 0; j < s->n_protocols; j++)
            if (!json_object_get(out, s->protocols[j]))
                json_object_set_new(out, s->protocols[j], protocol_object());
    }
    return http_respond_json(r, 200, out);
}

/* The service bridging protocol (the first with a url, else the first), or NULL. */
static const as_service *bridge_of(const char *protocol)
{
    const as_service *first = NULL;
    for (size_t i = 0; i < as_count(); i++) {
        const as_service *s = as_at(i);
        for (size_t j = 0; j < s->n_protocols; j++)
            if (strcmp(s->protocols[j], protocol) == 0) {
                if (s->url) return s;
                if (!first) first = s;
            }
    }
    return first;
}

typedef struct tp_answer {
    bool done;
    int outcome, status;
    char *body; /* in the request's arena */
    char error[256];
} tp_answer;

static void tp_done(void *arg, const fed_response *res)
{
    atrium_req *r = arg;
    tp_answer *a = r->core_state;
    a->outcome = res->outcome;
    a->status = res->status;
    snprintf(a->error, sizeof(a->error), "%s", res->error ? res->error : "");
    if (res->outcome == FED_HTTP_OK && res->body)
        a->body = rt_arena_strndup(r->arena, res->body, res->body_len);
    a->done = true;
    susp_wake(r);
}

static int tp_answer_now(atrium_req *r, tp_answer *a)
{
    if (a->outcome == FED_HTTP_E_TIMEOUT)
        return http_respond_error(r, 504, "M_UNKNOWN", "The bridge did not answer in time");
    json_t *j = a->outcome == FED_HTTP_OK && a->body ? json_loads(a->body, 0, NULL) : NULL;
    if (a->outcome != FED_HTTP_OK || !j) {
        json_decref(j);
        return http_respond_error(r, 502, "M_UNKNOWN", "The bridge could not be asked: %s",
                                  a->outcome != FED_HTTP_OK ? a->error : "no JSON answer");
    }
    if (a->status >= 200 && a->status < 300) return http_respond_json(r, 200, j);
    const char *code = json_string_value(json_object_get(j, "errcode"));
    const char *msg = json_string_value(json_object_get(j, "error"));
    int status = a->status >= 400 && a->status < 500 ? a->status : 502;
    int rc = http_respond_error(r, status, code ? code : "M_UNKNOWN", "%s",
                                msg ? msg : "The bridge refused");
    json_decref(j);
    return rc;
}

/* r's query string without access_token, for the service. */
static const char *forwarded_query(atrium_req *r)
{
    const char *q = r->raw_query ? r->raw_query : "";
    char *out = rt_arena_alloc(r->arena, strlen(q) + 2);
    if (!out) return NULL;
    size_t n = 0;
    while (*q) {
        const char *amp = strchr(q, '&');
        size_t len = amp ? (size_t)(amp - q) : strlen(q);
        bool token = strncmp(q, "access_token=", 13) == 0 ||
                     (len == 12 && strncmp(q, "access_token", 12) == 0);
        if (len > 0 && !token) {
            out[n] = n ? '&' : '?';
            n++;
            memcpy(out + n, q, len);
            n += len;
        }
        q += len + (amp ? 1 : 0);
    }
    out[n] = '\0';
    return out;
}

/* GET /thirdparty/{kind}/{protocol}: forward to the bridge. */
static int forward(atrium_req *r, const char *kind)
{
    tp_answer *a = r->core_state;
    if (a && a->done) return tp_answer_now(r, a);
    if (a)
        return r->run_reason == ATRIUM_RUN_SHUTDOWN
                   ? http_respond_error(r, 503, "M_UNKNOWN", "The server is stopping")
                   : http_respond_error(r, 504, "M_UNKNOWN", "The bridge did not answer in time");
    if (!auth_request(r)) return ATRIUM_DONE;
    const char *protocol = http_req_param(r, "protocol");
    const as_service *svc = bridge_of(protocol);
    if (!svc)
        return http_respond_error(r, 404, "M_NOT_FOUND", "No application service bridges %s",
                                  protocol);
    if (!svc->url) {
        if (strcmp(kind, "protocol") == 0) return http_respond_json(r, 200, protocol_object());
        return http_respond_json(r, 200, json_array());
    }
    char enc[512], url[AS_THIRDPARTY_URL_BYTES], auth[512];
    const char *query = forwarded_query(r);
    size_t ulen = strlen(svc->url);
    while (ulen > 0 && svc->url[ulen - 1] == '/') ulen--;
    int n = rt_uri_encode(protocol, enc, sizeof(enc))
                ? snprintf(url, sizeof(url), "%.*s/_matrix/app/v1/thirdparty/%s/%s%s", (int)ulen,
                           svc->url, kind, enc, query ? query : "")
                : -1;
    int m = snprintf(auth, sizeof(auth), "Authorization: Bearer %s", svc->hs_token);
    if (!query || n < 0 || (size_t)n >= sizeof(url) || m < 0 || (size_t)m >= sizeof(auth))
        return http_respond_error(r, 400, "M_INVALID_PARAM", "The look-up is too long");
    if (!(a = rt_arena_alloc(r->arena, sizeof(*a))))
        return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    memset(a, 0, sizeof(*a));
    if (!as_outbound_hold(r)) return ATRIUM_DONE;
    r->core_state = a;
    int64_t deadline = rt_now_ms() + r->srv->cfg->appservice.request_timeout_ms;
    if (r->deadline_ms > 0 && r->deadline_ms < deadline) deadline = r->deadline_ms;
    if (susp_wait(r, deadline + 1000) < 0)
        return http_respond_error(r, 503, "M_UNKNOWN", "The server is stopping");
    fed_request_opts o = {.method = "GET", .url = url, .url_allow_http = true,
                          .url_header = auth, .operator_destination = true,
                          .deadline_ms = deadline,
                          .max_body_bytes = AS_THIRDPARTY_MAX_ANSWER_BYTES, .on_done = tp_done,
                          .arg = r};
    int rc = fed_request_submit(&o);
    if (rc < 0) {
        a->outcome = FED_HTTP_E_INTERNAL;
        snprintf(a->error, sizeof(a->error), "the outbound client refused the request (%d)", rc);
        a->done = true;
        susp_wake(r);
    }
    return ATRIUM_PARKED;
}

static int get_protocol(atrium_req *r) { return forward(r, "protocol"); }
static int get_user(atrium_req *r) { return forward(r, "user"); }
static int get_location(atrium_req *r) { return forward(r, "location"); }

int as_thirdparty_routes(http_server *s)
{
    if (client_route(s, "GET", "/_matrix/client/v3/thirdparty/protocols", get_protocols, 0) < 0 ||
        client_route(s, "GET", "/_matrix/client/v3/thirdparty/protocol/{protocol}",
                     get_protocol, 0) < 0 ||
        client_route(s, "GET", "/_matrix/client/v3/thirdparty/user/{protocol}", get_user, 0) < 0 ||
        client_route(s, "GET", "/_matrix/client/v3/thirdparty/location/{protocol}", get_location,
                     0) < 0)
        return -1;
    return 0;
}
