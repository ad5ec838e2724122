/*
 * core/client/appservice/as_thirdparty.c - the third-party network endpoints of the client
 * API, answered by the application services that bridge each protocol (the ones whose
 * registration lists it under `protocols`).
 *
 * GET /thirdparty/protocols and /thirdparty/protocol/{protocol} ask every service with a
 * url about each protocol it declares (GET {url}/_matrix/app/v1/thirdparty/protocol/{p},
 * all at once): a protocol's description is the first answer's (in file order) with the
 * `instances` of every answer, each instance given `instance_id` "<service id>|<its
 * network_id>", as Synapse does: the value publicRooms' third_party_instance_id takes (the
 * directory plugin lists a service's rooms per network). An answer that is not a JSON
 * object with an `instances` array is left out; a protocol no bridge described (no url, or
 * none answered) is described by its name alone (empty field lists, no instances), which
 * is enough for a client to offer it; /protocol/{protocol} is then 502 when bridges with a
 * url were asked and none answered. Not cached: each call asks again.
 *
 * GET /thirdparty/user/{protocol} and /thirdparty/location/{protocol} are forwarded to the
 * first service (in file order) that declares the protocol and has a url: GET
 * {url}/_matrix/app/v1/thirdparty/...{query} with its hs_token, its JSON answer passed on;
 * a service that cannot be reached or answers no JSON is 502, no answer in time 504, its
 * own refusal (4xx) passed on. The reverse look-ups (GET /thirdparty/user?userid=,
 * /thirdparty/location?alias=, no protocol) go to every service with a url that declares
 * a protocol, all at once: each answer that is a JSON array is appended (in file order),
 * the others (errors, garbage, silence past the deadline) are left out; 502 when none
 * answered with an array.
 *
 * Every request waits parked (susp_wait) under the outbound budget (ADR-0079), as the ping
 * does (as_module.c), at most appservice.request_timeout_ms.
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
    if (!svc->url) return http_respond_json(r, 200, json_array());
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

/* ---- asking several bridges at once: the protocols and the reverse look-ups ------------ */

typedef struct fan_state fan_state;
typedef struct fan_one {
    fan_state *st;
    const as_service *svc;
    const char *protocol; /* the protocol asked about (the protocols' fan-out) */
    char *url;            /* in the request's arena */
    json_t *answer;       /* the JSON the service answered with 2xx, or NULL */
} fan_one;

struct fan_state {
    atrium_req *r;
    atomic_int pending; /* the last callback wakes the request */
    size_t n;
    fan_one *one;
};

static void fan_done(void *arg, const fed_response *res)
{
    fan_one *o = arg;
    if (res->outcome == FED_HTTP_OK && res->status >= 200 && res->status < 300 && res->body)
        o->answer = json_loadb(res->body, res->body_len, 0, NULL);
    if (atomic_fetch_sub(&o->st->pending, 1) == 1) susp_wake(o->st->r);
}

/* When r is freed: the answers no response took (it ran out of time before they came). */
static void fan_free(void *arg)
{
    fan_state *st = arg;
    for (size_t i = 0; i < st->n; i++) json_decref(st->one[i].answer);
}

/* A fan-out of n requests for r, their urls still to fill; NULL after answering 500. */
static fan_state *fan_new(atrium_req *r, size_t n)
{
    fan_state *st = rt_arena_alloc(r->arena, sizeof(*st));
    fan_one *one = rt_arena_alloc(r->arena, (n ? n : 1) * sizeof(*one));
    if (!st || !one) {
        http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
        return NULL;
    }
    memset(one, 0, (n ? n : 1) * sizeof(*one));
    *st = (fan_state){.r = r, .n = n, .one = one};
    for (size_t i = 0; i < n; i++) one[i].st = st;
    return st;
}

/* Send every request of st (each one's url, with its service's hs_token) and park; the
 * handler runs again when all answered or the deadline passed. */
static int fan_send(atrium_req *r, fan_state *st)
{
    if (!as_outbound_hold(r)) return ATRIUM_DONE;
    atomic_init(&st->pending, (int)st->n + 1); /* + this thread's own, given up below */
    r->core_state = st;
    http_req_on_free(r, fan_free, st);
    int64_t deadline = rt_now_ms() + r->srv->cfg->appservice.request_timeout_ms;
    if (r->deadline_ms > 0 && r->deadline_ms < deadline) deadline = r->deadline_ms;
    if (susp_wait(r, deadline + 1000) < 0)
        return http_respond_error(r, 503, "M_UNKNOWN", "The server is stopping");
    for (size_t k = 0; k < st->n; k++) {
        fan_one *one = &st->one[k];
        char auth[512];
        int m = snprintf(auth, sizeof(auth), "Authorization: Bearer %s", one->svc->hs_token);
        fed_request_opts o = {.method = "GET", .url = one->url, .url_allow_http = true,
                              .url_header = auth, .operator_destination = true,
                              .deadline_ms = deadline,
                              .max_body_bytes = AS_THIRDPARTY_MAX_ANSWER_BYTES,
                              .on_done = fan_done, .arg = one};
        bool ok = one->url && m > 0 && (size_t)m < sizeof(auth);
        if (!ok || fed_request_submit(&o) < 0) /* left out, as a service that failed */
            atomic_fetch_sub(&st->pending, 1);
    }
    if (atomic_fetch_sub(&st->pending, 1) == 1) susp_wake(r); /* every one done already */
    return ATRIUM_PARKED;
}

/* The handler run again after fan_send: answer() when every bridge answered, else the
 * deadline (504) or the shutdown (503) ran it, and the callbacks still come into request
 * memory. */
static int fan_rerun(atrium_req *r, fan_state *st, int (*answer)(atrium_req *, fan_state *))
{
    if (atomic_load(&st->pending) == 0) return answer(r, st);
    return r->run_reason == ATRIUM_RUN_SHUTDOWN
               ? http_respond_error(r, 503, "M_UNKNOWN", "The server is stopping")
               : http_respond_error(r, 504, "M_UNKNOWN", "The bridges did not answer in time");
}

/* "{url}/_matrix/app/v1/thirdparty/{rest}" in r's arena, or NULL when too long. */
static char *service_url(atrium_req *r, const as_service *svc, const char *rest)
{
    size_t ulen = strlen(svc->url);
    while (ulen > 0 && svc->url[ulen - 1] == '/') ulen--;
    char *url = rt_arena_printf(r->arena, "%.*s/_matrix/app/v1/thirdparty/%s", (int)ulen,
                                svc->url, rest);
    return url && strlen(url) < AS_THIRDPARTY_URL_BYTES ? url : NULL;
}

/* ---- the reverse look-ups: every bridge with a protocol asked ------------------------- */

static int rev_answer(atrium_req *r, fan_state *st)
{
    json_t *out = json_array();
    bool any = false;
    for (size_t i = 0; i < st->n; i++) {
        if (!json_is_array(st->one[i].answer)) continue;
        any = true;
        json_array_extend(out, st->one[i].answer);
    }
    if (!any && st->n > 0) {
        json_decref(out);
        return http_respond_error(r, 502, "M_UNKNOWN", "No bridge answered the look-up");
    }
    return http_respond_json(r, 200, out);
}

/* Does svc take reverse look-ups (a url and a protocol)? */
static bool reverse_bridge(const as_service *svc)
{
    return svc->url && svc->n_protocols > 0;
}

/* GET /thirdparty/{kind}?{key}=...: ask every bridge. */
static int reverse(atrium_req *r, const char *kind, const char *key)
{
    if (r->core_state) return fan_rerun(r, r->core_state, rev_answer);
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
    fan_state *st = fan_new(r, n);
    if (!st) return ATRIUM_DONE;
    char *rest = rt_arena_printf(r->arena, "%s?%s=%s", kind, key, enc);
    size_t k = 0;
    for (size_t i = 0; i < as_count(); i++) {
        const as_service *svc = as_at(i);
        if (!reverse_bridge(svc)) continue;
        st->one[k].svc = svc;
        st->one[k++].url = rest ? service_url(r, svc, rest) : NULL;
    }
    return fan_send(r, st);
}

/* ---- the protocols: every bridge asked about each protocol it declares ----------------- */

/* The service's description of one->protocol, its instances given their instance_id
 * "<service id>|<network_id>" (the value publicRooms' third_party_instance_id takes); NULL
 * when it answered none (no JSON object with an instances array). */
static json_t *protocol_answer(fan_one *one)
{
    json_t *a = one->answer;
    json_t *instances = json_object_get(a, "instances");
    if (!json_is_object(a) || !json_is_array(instances)) return NULL;
    json_t *kept = json_array();
    size_t i;
    json_t *inst;
    json_array_foreach(instances, i, inst) {
        const char *network = json_string_value(json_object_get(inst, "network_id"));
        if (!json_is_object(inst)) continue; /* not an instance: left out */
        if (network) {
            char *id = rt_arena_printf(one->st->r->arena, "%s|%s", one->svc->id, network);
            if (id) json_object_set_new(inst, "instance_id", json_string(id));
        }
        json_array_append(kept, inst);
    }
    json_object_set_new(a, "instances", kept);
    return a;
}

/* Every protocol's description (only: that one's), each the first bridge's answer with the
 * instances of all of them, in file order; a protocol no bridge answered for is described
 * by its name alone. */
static json_t *protocols_merged(fan_state *st, const char *only, bool *answered)
{
    json_t *out = json_object();
    *answered = false;
    for (size_t k = 0; k < st->n; k++) {
        json_t *a = protocol_answer(&st->one[k]);
        if (!a) continue;
        *answered = true;
        json_t *have = json_object_get(out, st->one[k].protocol);
        if (have) json_array_extend(json_object_get(have, "instances"),
                                    json_object_get(a, "instances"));
        else json_object_set(out, st->one[k].protocol, a);
    }
    for (size_t i = 0; i < as_count(); i++) {
        const as_service *s = as_at(i);
        for (size_t j = 0; j < s->n_protocols; j++)
            if ((!only || strcmp(only, s->protocols[j]) == 0) &&
                !json_object_get(out, s->protocols[j]))
                json_object_set_new(out, s->protocols[j], protocol_object());
    }
    return out;
}

static int protocols_answer(atrium_req *r, fan_state *st)
{
    bool answered;
    return http_respond_json(r, 200, protocols_merged(st, NULL, &answered));
}

static int protocol_answer_one(atrium_req *r, fan_state *st)
{
    bool answered;
    const char *protocol = http_req_param(r, "protocol");
    json_t *all = protocols_merged(st, protocol, &answered);
    if (!answered && st->n > 0) {
        json_decref(all);
        return http_respond_error(r, 502, "M_UNKNOWN", "No bridge of %s answered", protocol);
    }
    json_t *one = json_incref(json_object_get(all, protocol));
    json_decref(all);
    return http_respond_json(r, 200, one);
}

/* GET /thirdparty/protocols (only NULL) or /thirdparty/protocol/{only}. */
static int protocols(atrium_req *r, const char *only)
{
    if (!auth_request(r)) return ATRIUM_DONE;
    size_t n = 0;
    bool declared = false;
    for (size_t i = 0; i < as_count(); i++) {
        const as_service *s = as_at(i);
        for (size_t j = 0; j < s->n_protocols; j++) {
            bool match = !only || strcmp(only, s->protocols[j]) == 0;
            declared = declared || match;
            n += match && s->url;
        }
    }
    if (only && !declared)
        return http_respond_error(r, 404, "M_NOT_FOUND", "No application service bridges %s",
                                  only);
    fan_state *st = fan_new(r, n);
    if (!st) return ATRIUM_DONE;
    size_t k = 0;
    for (size_t i = 0; i < as_count(); i++) {
        const as_service *s = as_at(i);
        for (size_t j = 0; s->url && j < s->n_protocols; j++) {
            if (only && strcmp(only, s->protocols[j]) != 0) continue;
            char enc[512];
            char *rest = rt_uri_encode(s->protocols[j], enc, sizeof(enc))
                             ? rt_arena_printf(r->arena, "protocol/%s", enc)
                             : NULL;
            st->one[k] = (fan_one){.st = st, .svc = s, .protocol = s->protocols[j],
                                   .url = rest ? service_url(r, s, rest) : NULL};
            k++;
        }
    }
    if (n == 0) return only ? protocol_answer_one(r, st) : protocols_answer(r, st);
    return fan_send(r, st);
}

static int get_protocols(atrium_req *r)
{
    if (r->core_state) return fan_rerun(r, r->core_state, protocols_answer);
    return protocols(r, NULL);
}

static int get_protocol(atrium_req *r)
{
    if (r->core_state) return fan_rerun(r, r->core_state, protocol_answer_one);
    return protocols(r, http_req_param(r, "protocol"));
}

static int get_user_reverse(atrium_req *r) { return reverse(r, "user", "userid"); }
static int get_location_reverse(atrium_req *r) { return reverse(r, "location", "alias"); }

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
