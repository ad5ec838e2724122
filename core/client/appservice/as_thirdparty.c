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
 * them. The reverse look-ups (GET /thirdparty/user?userid=, /thirdparty/location?alias=,
 * no protocol) go to every service with a url that declares a protocol, all at once: each
 * answer that is a JSON array is appended (in file order), the others (errors, garbage,
 * silence past the deadline) are left out; 502 when none answered with an array.
 */
#include <stdatomic.h>
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

/* ---- the reverse look-ups: every bridge asked at once ---------------------------------- */

typedef struct rev_state rev_state;
typedef struct rev_one {
    rev_state *st;
    json_t *answer; /* a JSON array the service answered, or NULL */
} rev_one;

struct rev_state {
    atrium_req *r;
    atomic_int pending; /* the last callback wakes the request */
    size_t n;
    rev_one *one;
};

static void rev_done(void *arg, const fed_response *res)
{
    rev_one *o = arg;
    if (res->outcome == FED_HTTP_OK && res->status >= 200 && res->status < 300 && res->body) {
        json_t *j = json_loadb(res->body, res->body_len, 0, NULL);
        if (json_is_array(j)) o->answer = j;
        else json_decref(j);
    }
    if (atomic_fetch_sub(&o->st->pending, 1) == 1) susp_wake(o->st->r);
}

static int rev_answer(atrium_req *r, rev_state *st)
{
    json_t *out = json_array();
    bool any = false;
    for (size_t i = 0; i < st->n; i++) {
        if (!st->one[i].answer) continue;
        any = true;
        json_array_extend(out, st->one[i].answer);
        json_decref(st->one[i].answer);
        st->one[i].answer = NULL;
    }
    if (!any && st->n > 0) {
        json_decref(out);
        return http_respond_error(r, 502, "M_UNKNOWN", "No bridge answered the look-up");
    }
    return http_respond_json(r, 200, out);
}

/* When r is freed: the answers no response took (it ran out of time before they came). */
static void rev_free(void *arg)
{
    rev_state *st = arg;
    for (size_t i = 0; i < st->n; i++) json_decref(st->one[i].answer);
}

/* Does svc take reverse look-ups (a url and a protocol)? */
static bool reverse_bridge(const as_service *svc)
{
    return svc->url && svc->n_protocols > 0;
}

/* GET /thirdparty/{kind}?{key}=...: ask every bridge. */
static int reverse(atrium_req *r, const char *kind, const char *key)
{
    rev_state *st = r->core_state;
    if (st) {
        if (atomic_load(&st->pending) == 0) return rev_answer(r, st);
        /* the deadline or shutdown ran it: the callbacks still come, into request memory */
        return r->run_reason == ATRIUM_RUN_SHUTDOWN
                   ? http_respond_error(r, 503, "M_UNKNOWN", "The server is stopping")
                   : http_respond_error(r, 504, "M_UNKNOWN", "The bridges did not answer in time");
    }
    if (!auth_request(r)) return ATRIUM_DONE;
    const char *v = http_req_query(r, key);
    if (!v || !v[0])
        return http_respond_error(r, 400, "M_MISSING_PARAM", "The query parameter %s is missing",
                                  key);
    char enc[1024];
    if (!rt_uri_encode(v, enc, sizeof(enc)))
        return http_respond_error(r, 400, "M_INVALID_PARAM", "The look-up is too long");
    size_t n = 0;
    for (size_t i = 0; i < as_count(); i++) n += reverse_bridge(as_at(i));
    if (n == 0) return http_respond_json(r, 200, json_array());
    st = rt_arena_alloc(r->arena, sizeof(*st));
    rev_one *one = rt_arena_alloc(r->arena, n * sizeof(*one));
    if (!st || !one) return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    if (!as_outbound_hold(r)) return ATRIUM_DONE;
    *st = (rev_state){.r = r, .n = n, .one = one};
    atomic_init(&st->pending, (int)n + 1); /* + this thread's own, given up below */
    r->core_state = st;
    http_req_on_free(r, rev_free, st);
    int64_t deadline = rt_now_ms() + r->srv->cfg->appservice.request_timeout_ms;
    if (r->deadline_ms > 0 && r->deadline_ms < deadline) deadline = r->deadline_ms;
    if (susp_wait(r, deadline + 1000) < 0)
        return http_respond_error(r, 503, "M_UNKNOWN", "The server is stopping");
    size_t k = 0;
    for (size_t i = 0; i < as_count(); i++) {
        const as_service *svc = as_at(i);
        if (!reverse_bridge(svc)) continue;
        one[k] = (rev_one){.st = st};
        char url[AS_THIRDPARTY_URL_BYTES], auth[512];
        size_t ulen = strlen(svc->url);
        while (ulen > 0 && svc->url[ulen - 1] == '/') ulen--;
        int un = snprintf(url, sizeof(url), "%.*s/_matrix/app/v1/thirdparty/%s?%s=%s",
                          (int)ulen, svc->url, kind, key, enc);
        int m = snprintf(auth, sizeof(auth), "Authorization: Bearer %s", svc->hs_token);
        fed_request_opts o = {.method = "GET", .url = url, .url_allow_http = true,
                              .url_header = auth, .operator_destination = true,
                              .deadline_ms = deadline,
                              .max_body_bytes = AS_THIRDPARTY_MAX_ANSWER_BYTES,
                              .on_done = rev_done, .arg = &one[k]};
        bool ok = un > 0 && (size_t)un < sizeof(url) && m > 0 && (size_t)m < sizeof(auth);
        if (!ok || fed_request_submit(&o) < 0) /* left out, as a service that failed */
            atomic_fetch_sub(&st->pending, 1);
        k++;
    }
    if (atomic_fetch_sub(&st->pending, 1) == 1) susp_wake(r); /* every one done already */
    return ATRIUM_PARKED;
}

static int get_user_reverse(atrium_req *r) { return reverse(r, "user", "userid"); }
static int get_location_reverse(atrium_req *r) { return reverse(r, "location", "alias"); }

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
                     0) < 0 ||
        client_route(s, "GET", "/_matrix/client/v3/thirdparty/user", get_user_reverse, 0) < 0 ||
        client_route(s, "GET", "/_matrix/client/v3/thirdparty/location", get_location_reverse,
                     0) < 0)
        return -1;
    return 0;
}
