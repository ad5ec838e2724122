/*
 * core/federation/fed_routes.c - the first endpoints other servers call: the server's
 * implementation version, its signing keys (the key server), other servers' keys through
 * this server as a notary, and local users' profiles.
 *
 * The key routes need no signature (a server asks for keys precisely because it cannot
 * verify one yet); the profile query is an ATRIUM_ROUTE_FEDERATION route, so fed_auth.c
 * has verified the X-Matrix signature before it runs. The notary answers from the key
 * ring's cache and fetches on a miss, parked (susp_wait) while the origin answers.
 */
#include <stdio.h>
#include <string.h>

#include "core/federation/fed_internal.h"
#include "core/federation/fed_rooms.h"
#include "core/client/accounts/accounts.h"

#ifndef ATRIUM_VERSION
#define ATRIUM_VERSION "dev"
#endif


/* GET /_matrix/federation/v1/version */
static int get_version(atrium_req *r)
{
    return http_respond_json(r, 200, json_pack("{s:{s:s,s:s}}", "server", "name", "Atrium",
                                               "version", ATRIUM_VERSION));
}

json_t *fed_own_key_document(fed_module *m)
{
    return fed_server_key_document(m->server_name, &m->key, m->old_keys, m->n_old_keys,
                                   rt_wall_ms(), m->cfg->federation.key_valid_ms);
}

/* GET /_matrix/key/v2/server (and the deprecated .../server/{keyId}: the same document) */
static int get_server_keys(atrium_req *r)
{
    json_t *doc = fed_own_key_document(fed_state());
    if (!doc) return ATRIUM_E_NOMEM;
    return http_respond_json(r, 200, doc);
}

/* GET /_matrix/federation/v1/query/profile?user_id=...&field=... (signed) */
static int get_profile(atrium_req *r)
{
    fed_module *m = fed_state();
    const char *user = http_req_query(r, "user_id"), *field = http_req_query(r, "field");
    if (!user || !*user)
        return http_respond_error(r, 400, "M_MISSING_PARAM", "user_id is required");
    if (field && strcmp(field, "displayname") != 0 && strcmp(field, "avatar_url") != 0)
        return http_respond_error(r, 400, "M_INVALID_PARAM",
                                  "field must be displayname or avatar_url");
    const char *colon = strchr(user, ':');
    if (user[0] != '@' || !colon || strcmp(colon + 1, m->server_name) != 0)
        return http_respond_error(r, 400, "M_INVALID_PARAM", "%s is not a user of this server",
                                  user);
    json_t *body = acc_profile_load(r, user);
    if (!body) return ATRIUM_DONE;
    if (field) { /* only the field asked for */
        json_t *v = json_incref(json_object_get(body, field));
        json_object_clear(body);
        if (v) json_object_set_new(body, field, v);
    }
    return http_respond_json(r, 200, body);
}

int fed_routes_register(fed_module *m)
{
    static const atrium_route routes[] = {
        {.method = "GET", .path = "/_matrix/federation/v1/version", .handler = get_version},
        {.method = "GET", .path = "/_matrix/key/v2/server", .handler = get_server_keys},
        {.method = "GET", .path = "/_matrix/key/v2/server/{keyId}", .handler = get_server_keys},
        {.method = "GET", .path = "/_matrix/federation/v1/query/profile", .handler = get_profile,
         .flags = ATRIUM_ROUTE_FEDERATION},
    };
    char err[256];
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
        if (router_add(m->srv->router, &routes[i], "core", err, sizeof(err)) < 0) {
            rt_log(ATRIUM_LOG_ERROR, "federation", "%s", err);
            return -1;
        }
    }
    if (fed_keyquery_routes(m) < 0) return -1;
    return fed_rooms_routes(m); /* rooms as other servers read and join them (fed_rooms.h) */
}
