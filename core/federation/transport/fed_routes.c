/*
 * core/federation/transport/fed_routes.c - the first endpoints other servers call: the server's
 * implementation version, its signing keys (the key server), other servers' keys through
 * this server as a notary.
 *
 * The key routes need no signature (a server asks for keys precisely because it cannot
 * verify one yet). The notary answers from the key
 * ring's cache and fetches on a miss, parked (susp_wait) while the origin answers.
 */
#include <stdio.h>
#include <string.h>

#include "core/federation/transport/fed_internal.h"

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

int fed_routes_register(fed_module *m)
{
    static const atrium_route routes[] = {
        {.method = "GET", .path = "/_matrix/federation/v1/version", .handler = get_version},
        {.method = "GET", .path = "/_matrix/key/v2/server", .handler = get_server_keys},
        {.method = "GET", .path = "/_matrix/key/v2/server/{keyId}", .handler = get_server_keys},
    };
    if (HTTP_ROUTES_ADD(m->srv, routes, "federation") < 0) return -1;
    /* The room endpoints (core/federation/rooms/) and the profile query
     * (core/client/accounts/profile_remote.c) are registered by their own layers. */
    return fed_keyquery_routes(m);
}
