/*
 * core/client/auth/auth_guest.c - what a guest may call: the one rule, auth_guest_allows,
 * applied by auth_request to every authenticated request of a guest (core and plugins
 * alike), so no endpoint has to remember it.
 *
 * The list is the spec's (Guest access, client behaviour): reading rooms (state, events,
 * messages, members, context, initialSync), syncing (/sync, /events, /initialSync), joining
 * and leaving, sending m.room.message events only, typing, receipts and read markers,
 * presence, the display name, devices, end-to-end keys and to-device messages, account
 * data, whoami and the TURN server; plus the media reads (download, thumbnail, config),
 * as Synapse allows. A template matches on the v3 and r0 prefixes alike. Anything else is
 * 403 M_GUEST_ACCESS_FORBIDDEN. What this file does not decide: which rooms a guest may
 * join (m.room.guest_access, crooms_membership.c) or how guests register (register.c).
 */
#include <string.h>

#include "core/client/auth/auth.h"

typedef struct guest_route {
    const char *method, *path; /* path after the client prefix, or a whole path ("/_matrix...") */
    const char *param, *value; /* when set: that path parameter must have that value */
} guest_route;

static const guest_route GUEST_ROUTES[] = {
    {"GET", "/rooms/{roomId}/state", NULL, NULL},
    {"GET", "/rooms/{roomId}/state/{eventType}", NULL, NULL},
    {"GET", "/rooms/{roomId}/state/{eventType}/", NULL, NULL},
    {"GET", "/rooms/{roomId}/state/{eventType}/{stateKey}", NULL, NULL},
    {"GET", "/rooms/{roomId}/event/{eventId}", NULL, NULL},
    {"GET", "/rooms/{roomId}/context/{eventId}", NULL, NULL},
    {"GET", "/rooms/{roomId}/messages", NULL, NULL},
    {"GET", "/rooms/{roomId}/members", NULL, NULL},
    {"GET", "/rooms/{roomId}/initialSync", NULL, NULL},
    {"GET", "/sync", NULL, NULL},
    {"GET", "/events", NULL, NULL},
    {"GET", "/initialSync", NULL, NULL},
    {"POST", "/rooms/{roomId}/join", NULL, NULL},
    {"POST", "/join/{roomIdOrAlias}", NULL, NULL},
    {"POST", "/rooms/{roomId}/leave", NULL, NULL},
    {"PUT", "/rooms/{roomId}/send/{eventType}/{txnId}", "eventType", "m.room.message"},
    {"PUT", "/rooms/{roomId}/typing/{userId}", NULL, NULL},
    {"POST", "/rooms/{roomId}/receipt/{receiptType}/{eventId}", NULL, NULL},
    {"POST", "/rooms/{roomId}/read_markers", NULL, NULL},
    {"GET", "/presence/{userId}/status", NULL, NULL},
    {"PUT", "/presence/{userId}/status", NULL, NULL},
    {"GET", "/profile/{userId}", NULL, NULL},
    {"GET", "/profile/{userId}/{field}", NULL, NULL},
    {"PUT", "/profile/{userId}/{field}", "field", "displayname"},
    {"GET", "/devices", NULL, NULL},
    {"GET", "/devices/{deviceId}", NULL, NULL},
    {"PUT", "/devices/{deviceId}", NULL, NULL},
    {"POST", "/keys/upload", NULL, NULL},
    {"POST", "/keys/query", NULL, NULL},
    {"POST", "/keys/claim", NULL, NULL},
    {"GET", "/keys/changes", NULL, NULL},
    {"PUT", "/sendToDevice/{eventType}/{txnId}", NULL, NULL},
    {"GET", "/user/{userId}/account_data/{type}", NULL, NULL},
    {"PUT", "/user/{userId}/account_data/{type}", NULL, NULL},
    {"GET", "/user/{userId}/rooms/{roomId}/account_data/{type}", NULL, NULL},
    {"PUT", "/user/{userId}/rooms/{roomId}/account_data/{type}", NULL, NULL},
    {"GET", "/account/whoami", NULL, NULL},
    {"GET", "/voip/turnServer", NULL, NULL},
    {"GET", "/_matrix/client/v1/media/config", NULL, NULL},
    {"GET", "/_matrix/client/v1/media/download/{serverName}/{mediaId}", NULL, NULL},
    {"GET", "/_matrix/client/v1/media/download/{serverName}/{mediaId}/{fileName}", NULL, NULL},
    {"GET", "/_matrix/client/v1/media/thumbnail/{serverName}/{mediaId}", NULL, NULL},
};

static const char *const CLIENT_PREFIXES[] = {"/_matrix/client/v3", "/_matrix/client/r0", NULL};

/* Is `tmpl` (a route template) the list's `path`, on a client prefix unless whole? */
static bool template_is(const char *tmpl, const char *path)
{
    if (strncmp(path, "/_matrix", 8) == 0) return strcmp(tmpl, path) == 0;
    for (size_t i = 0; CLIENT_PREFIXES[i]; i++) {
        size_t n = strlen(CLIENT_PREFIXES[i]);
        if (strncmp(tmpl, CLIENT_PREFIXES[i], n) == 0 && strcmp(tmpl + n, path) == 0) return true;
    }
    return false;
}

bool auth_guest_allows(atrium_req *r)
{
    if (!r->route || !r->route->route.path) return false;
    const char *method = strcmp(r->method, "HEAD") == 0 ? "GET" : r->method;
    for (size_t i = 0; i < sizeof(GUEST_ROUTES) / sizeof(GUEST_ROUTES[0]); i++) {
        const guest_route *g = &GUEST_ROUTES[i];
        if (strcmp(g->method, method) != 0 || !template_is(r->route->route.path, g->path))
            continue;
        if (!g->param) return true;
        const char *v = http_req_param(r, g->param);
        return v && strcmp(v, g->value) == 0;
    }
    return false;
}
