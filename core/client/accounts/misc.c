/*
 * core/client/accounts/misc.c - the empty answers Element asks for at start-up, for
 * features this server does not offer: GET /account/3pid (no third-party IDs),
 * GET /voip/turnServer (no TURN server). GET /thirdparty/protocols is the application
 * services' (core/client/appservice/as_module.c).
 *
 * Each needs a valid access token (401 otherwise) and answers what Synapse answers when
 * the feature is not set up: {"threepids": []} and {}. For the TURN server the spec
 * lists username, password, uris and ttl, but clients read an empty object as "no TURN
 * server" and fall back to STUN or direct connections, which is the truth here. Adding,
 * binding or deleting third-party IDs and TURN credentials are not
 * here: those paths stay 404 M_UNRECOGNIZED.
 */
#include "core/client/accounts/accounts.h"

/* GET /_matrix/client/v3/account/3pid */
static int get_threepids(atrium_req *r)
{
    if (!auth_request(r)) return ATRIUM_DONE;
    return http_respond_json(r, 200, json_pack("{s:[]}", "threepids"));
}

/* GET /_matrix/client/v3/voip/turnServer */
static int get_empty_object(atrium_req *r)
{
    if (!auth_request(r)) return ATRIUM_DONE;
    return http_respond_json(r, 200, json_object());
}

int acc_misc_routes(http_server *s)
{
    if (client_route(s, "GET", "/_matrix/client/v3/account/3pid", get_threepids, 0) < 0 ||
        client_route(s, "GET", "/_matrix/client/v3/voip/turnServer", get_empty_object, 0) < 0)
        return -1;
    return 0;
}
