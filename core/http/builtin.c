/*
 * core/http/builtin.c - the core's own endpoints: /health, the client versions, the
 * .well-known files (client discovery, server delegation, support contacts: from the
 * config, 404 M_NOT_FOUND when unset), and /metrics. They register through the same router as plugins.
 *
 * None of these touch the database or wait on anything: /health answers as long as the
 * request pool runs, which is what a load balancer should learn from it; its body also
 * says whether PostgreSQL answers ("database": "ok" or "unavailable", as the pool's
 * monitor last found it: core/store/db.h), without asking it.
 */
#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>

#include "atrium/directory.h"
#include "core/http/http.h"
#include "core/runtime/iface.h"
#include "core/store/db.h"

/* The spec versions advertised to clients (v1.11 brings authenticated media). */
static const char *const SPEC_VERSIONS[] = {"r0.6.1", "v1.1", "v1.2", "v1.3", "v1.4", "v1.5",
                                            "v1.6", "v1.7", "v1.8", "v1.9", "v1.10", "v1.11",
                                            "v1.12", NULL};

/* The unstable features advertised, each one this server serves (clients such as Element
 * Web decide from them whether to use it; tests/integration/test_versions_features.py
 * exercises each). */
static const char *const UNSTABLE_FEATURES[] = {
    "org.matrix.msc3916.stable", /* authenticated media (plugins/media) */
    "org.matrix.e2e_cross_signing", /* keys/device_signing/upload, keys/signatures/upload */
    "org.matrix.msc2285.stable", /* private read receipts, m.read.private */
    "org.matrix.msc3440.stable", /* threads: m.thread relations, thread receipts, bundles */
    "org.matrix.msc3856",        /* GET /_matrix/client/v1/rooms/{roomId}/threads */
    "org.matrix.msc3715",        /* /relations?dir= */
    "org.matrix.msc3881",        /* pushers' enabled switch (core/client/push/pushers.c) */
    NULL};

/* Features a plugin serves: advertised only while a plugin provides the interface, so a
 * server with the directory plugin switched off does not promise publicRooms' filter. */
static const struct {
    const char *feature, *iface;
    uint32_t iface_size;
} PLUGIN_FEATURES[] = {
    /* publicRooms filter.room_types (plugins/directory/listing.c) */
    {"org.matrix.msc3827.stable", ATRIUM_DIRECTORY_IFACE, ATRIUM_DIRECTORY_V0_SIZE},
};

static int get_health(atrium_req *r)
{
    const char *db = db_available(db_global()) ? "ok" : "unavailable";
    return http_respond_json(r, 200, json_pack("{s:s, s:s}", "status", "ok", "database", db));
}

/* Unstable features the client modules serve (http_unstable_feature_add), beside the
 * ones in UNSTABLE_FEATURES. Filled at start-up only, read by any request thread after. */
#define MAX_UNSTABLE_FEATURES 16
static const char *unstable_features[MAX_UNSTABLE_FEATURES];
static size_t n_unstable_features;

int http_unstable_feature_add(const char *name)
{
    for (size_t i = 0; i < n_unstable_features; i++)
        if (strcmp(unstable_features[i], name) == 0) return 0; /* a second server in one process */
    if (n_unstable_features == MAX_UNSTABLE_FEATURES) {
        rt_log(ATRIUM_LOG_ERROR, "core", "too many unstable features (at most %d)", MAX_UNSTABLE_FEATURES);
        return -1;
    }
    unstable_features[n_unstable_features++] = name;
    return 0;
}

static int get_versions(atrium_req *r)
{
    json_t *versions = json_array();
    for (size_t i = 0; SPEC_VERSIONS[i]; i++) json_array_append_new(versions, json_string(SPEC_VERSIONS[i]));
    json_t *features = json_object();
    for (size_t i = 0; UNSTABLE_FEATURES[i]; i++)
        json_object_set_new(features, UNSTABLE_FEATURES[i], json_true());
    for (size_t i = 0; i < n_unstable_features; i++)
        json_object_set_new(features, unstable_features[i], json_true());
    for (size_t i = 0; i < sizeof(PLUGIN_FEATURES) / sizeof(PLUGIN_FEATURES[0]); i++)
        if (rt_iface_get(PLUGIN_FEATURES[i].iface, PLUGIN_FEATURES[i].iface_size))
            json_object_set_new(features, PLUGIN_FEATURES[i].feature, json_true());
    json_t *body = json_pack("{s:o, s:o}", "versions", versions, "unstable_features", features);
    return http_respond_json(r, 200, body);
}

static int get_wellknown_client(atrium_req *r)
{
    const char *base = r->srv->cfg->public_baseurl;
    if (!base || !*base)
        return http_respond_error(r, 404, "M_NOT_FOUND", "No client discovery is configured");
    return http_respond_json(r, 200, json_pack("{s:{s:s}}", "m.homeserver", "base_url", base));
}

/* GET /.well-known/matrix/server: the delegation other servers follow (well_known.server).
 * Unset is 404 M_NOT_FOUND, as Synapse answers, so discovery goes on to SRV and port 8448. */
static int get_wellknown_server(atrium_req *r)
{
    const char *server = r->srv->cfg->well_known.server;
    if (!server || !*server)
        return http_respond_error(r, 404, "M_NOT_FOUND", "No server delegation is configured");
    return http_respond_json(r, 200, json_pack("{s:s}", "m.server", server));
}

/* GET /.well-known/matrix/support (spec v1.10): the administrator's contact and a support
 * page (well_known.support_*); 404 M_NOT_FOUND when none is configured. */
static int get_wellknown_support(atrium_req *r)
{
    const struct core_config *cfg = r->srv->cfg;
    const char *id = cfg->well_known.admin_matrix_id, *email = cfg->well_known.admin_email;
    const char *page = cfg->well_known.support_page;
    bool has_id = id && *id, has_email = email && *email, has_page = page && *page;
    if (!has_id && !has_email && !has_page)
        return http_respond_error(r, 404, "M_NOT_FOUND", "No support information is configured");
    json_t *body = json_object();
    if (has_id || has_email) {
        json_t *contact = json_pack("{s:s}", "role", "m.role.admin");
        if (has_id) json_object_set_new(contact, "matrix_id", json_string(id));
        if (has_email) json_object_set_new(contact, "email_address", json_string(email));
        json_object_set_new(body, "contacts", json_pack("[o]", contact));
    }
    if (has_page) json_object_set_new(body, "support_page", json_string(page));
    return http_respond_json(r, 200, body);
}

static int get_metrics(atrium_req *r)
{
    const struct core_config *cfg = r->srv->cfg;
    /* The direct peer must be allowed; a forwarded address does not count. */
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    char peer[64] = "";
    if (ci && ci->client_addr) {
        const struct sockaddr *sa = ci->client_addr;
        if (sa->sa_family == AF_INET)
            inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, peer, sizeof(peer));
        else if (sa->sa_family == AF_INET6)
            inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, peer, sizeof(peer));
    }
    if (!cfg->metrics.enabled ||
        !http_addr_in_list(peer, cfg->metrics.allowed_addresses, cfg->metrics.n_allowed_addresses))
        return http_respond_error(r, 404, "M_UNRECOGNIZED", "Unrecognized request");
    size_t len = 0;
    char *text = rt_metrics_render(r->srv->metrics, &len);
    if (!text) return ATRIUM_E_NOMEM;
    int rc = http_respond_buffer(r, 200, "text/plain; version=0.0.4", text, len);
    free(text);
    return rc;
}

int http_builtin_routes(http_server *s)
{
    static const atrium_route routes[] = {
        {.method = "GET", .path = "/health", .handler = get_health},
        {.method = "GET", .path = "/_matrix/client/versions", .handler = get_versions},
        {.method = "GET", .path = "/.well-known/matrix/client", .handler = get_wellknown_client},
        {.method = "GET", .path = "/.well-known/matrix/server", .handler = get_wellknown_server},
        {.method = "GET", .path = "/.well-known/matrix/support", .handler = get_wellknown_support},
        {.method = "GET", .path = "/metrics", .handler = get_metrics},
    };
    if (HTTP_ROUTES_ADD(s, routes, "core") < 0) return -1;
    return 0;
}
