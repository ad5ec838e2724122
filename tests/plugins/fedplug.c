/*
 * tests/plugins/fedplug.c - a plugin built only from include/atrium/ that uses the
 * federation members of the host table (1.1), as the media and directory plugins will:
 * a federation route that reads the verified origin, an outbound federation request
 * awaited parked (req_wait / req_wake) with a header of its answer read in the callback
 * (fed_response_header), and signing and verifying JSON as this server.
 * Driven by tests/integration/test_federation.py. Not shipped.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "atrium/host.h"

#define FEDPLUG_MAX_BODY_BYTES 65536

static const atrium_host *h;

/* What a parked request carries across its runs (req_state), written by the callback
 * before req_wake. */
typedef struct fedplug_wait {
    int done;
    int outcome, status;
    char body[FEDPLUG_MAX_BODY_BYTES];
    char error[256];
    char content_type[128]; /* the answer's Content-Type, "" when it had none */
    atrium_req *req;
} fedplug_wait;

/* GET /_matrix/federation/unstable/org.atrium.fedplug/whoami: who signed this request. */
static int get_whoami(atrium_req *req)
{
    return h->respond_json(req, 200, json_pack("{s:s?}", "origin", h->req_origin(req)));
}

static void version_done(void *arg, const atrium_fed_response *res)
{
    fedplug_wait *w = arg;
    w->outcome = res->outcome;
    w->status = res->status;
    snprintf(w->body, sizeof(w->body), "%.*s", (int)(res->body ? res->body_len : 0),
             res->body ? res->body : "");
    snprintf(w->error, sizeof(w->error), "%s", res->error ? res->error : "");
    const char *type = h->fed_response_header(res, "content-type"); /* any case matches */
    snprintf(w->content_type, sizeof(w->content_type), "%s", type ? type : "");
    w->done = 1;
    h->req_wake(w->req);
}

/* GET /_fedplug/version?server=NAME: that server's /_matrix/federation/v1/version, asked
 * through the core's outbound client while this request waits without a thread. */
static int get_version(atrium_req *req)
{
    fedplug_wait *w = h->req_state(req);
    if (w) {
        if (!w->done) return h->respond_error(req, 504, "M_UNKNOWN", "no answer in time");
        json_error_t jerr;
        json_t *body = json_loads(w->body, 0, &jerr);
        return h->respond_json(req, 200, json_pack("{s:i, s:i, s:o?, s:s, s:s}", "outcome",
                                                   w->outcome, "status", w->status, "body", body,
                                                   "error", w->error, "content_type",
                                                   w->content_type));
    }
    const char *server = h->req_query(req, "server");
    if (!server) return h->respond_error(req, 400, "M_MISSING_PARAM", "server is required");
    w = h->req_alloc(req, sizeof(*w));
    if (!w) return ATRIUM_E_NOMEM;
    w->req = req;
    h->req_set_state(req, w);
    int rc = h->req_wait(req, h->now_ms() + 10000);
    if (rc < 0) return h->respond_error(req, 503, "M_UNKNOWN", "stopping");
    atrium_fed_request q = {.size = sizeof(q), .method = "GET", .destination = server,
                            .uri = "/_matrix/federation/v1/version", .flags = ATRIUM_FED_JSON,
                            .on_done = version_done, .arg = w};
    if (h->fed_request(&q) < 0) {
        w->outcome = -8;
        w->done = 1;
        h->req_wake(req);
    }
    return ATRIUM_PARKED;
}

/* POST /_fedplug/sign: the body signed as this server. */
static int post_sign(atrium_req *req)
{
    json_t *body = h->req_json(req);
    if (!body) return ATRIUM_DONE;
    json_t *copy = json_deep_copy(body);
    if (h->fed_sign_json(copy) < 0) {
        json_decref(copy);
        return h->respond_error(req, 400, "M_BAD_JSON", "cannot be signed");
    }
    return h->respond_json(req, 200, copy);
}

static void verified(void *arg, int result, const char *why)
{
    fedplug_wait *w = arg;
    w->outcome = result;
    snprintf(w->error, sizeof(w->error), "%s", why ? why : "");
    w->done = 1;
    h->req_wake(w->req);
}

/* POST /_fedplug/verify?server=NAME: is the body signed by that server? */
static int post_verify(atrium_req *req)
{
    fedplug_wait *w = h->req_state(req);
    if (w) {
        if (!w->done) return h->respond_error(req, 504, "M_UNKNOWN", "no answer in time");
        return h->respond_json(req, 200, json_pack("{s:b, s:i, s:s}", "valid", w->outcome == 0,
                                                   "result", w->outcome, "why", w->error));
    }
    json_t *body = h->req_json(req);
    const char *server = h->req_query(req, "server");
    if (!body) return ATRIUM_DONE;
    if (!server) return h->respond_error(req, 400, "M_MISSING_PARAM", "server is required");
    w = h->req_alloc(req, sizeof(*w));
    if (!w) return ATRIUM_E_NOMEM;
    w->req = req;
    h->req_set_state(req, w);
    if (h->req_wait(req, h->now_ms() + 10000) < 0)
        return h->respond_error(req, 503, "M_UNKNOWN", "stopping");
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t now = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    if (h->fed_verify_json(body, server, now, verified, w) < 0) verified(w, -1, "refused");
    return ATRIUM_PARKED;
}

static int fp_init(const atrium_host *host, atrium_plugin *self, const atrium_config *cfg,
                   void **state)
{
    h = host;
    static const char *const keys[] = {NULL};
    if (host->config_check_keys(self, cfg, keys) < 0) return ATRIUM_E_INVAL;
    if (!ATRIUM_HOST_HAS(host, fed_verify_json)) return ATRIUM_E_STATE;
    const atrium_route routes[] = {
        {.method = "GET", .path = "/_matrix/federation/unstable/org.atrium.fedplug/whoami",
         .handler = get_whoami, .flags = ATRIUM_ROUTE_FEDERATION},
        {.method = "GET", .path = "/_fedplug/version", .handler = get_version},
        {.method = "POST", .path = "/_fedplug/sign", .handler = post_sign},
        {.method = "POST", .path = "/_fedplug/verify", .handler = post_verify},
    };
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < sizeof(routes) / sizeof(routes[0]); i++)
        rc = host->route_add(self, &routes[i]);
    *state = NULL;
    return rc;
}

ATRIUM_PLUGIN(.name = "fedplug", .version = "1.0.0", .init = fp_init)
