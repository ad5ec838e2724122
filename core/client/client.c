/*
 * core/client/client.c - the list of the core's client-server modules and the helper they
 * use to register routes. Adding a module means adding it to CLIENT_MODULES, nothing else.
 */
#include "core/client/client.h"

extern const client_module ACCOUNTS_MODULE;
extern const client_module ROOMS_MODULE;
extern const client_module SYNC_MODULE;
extern const client_module E2EE_MODULE;
extern const client_module PRESENCE_MODULE;
extern const client_module APPSERVICE_MODULE;
extern const client_module REPORTS_MODULE;

const client_module *const CLIENT_MODULES[] = {
    &ACCOUNTS_MODULE,
    &ROOMS_MODULE, /* after accounts: reads profiles, writes account_data */
    &SYNC_MODULE,
    &E2EE_MODULE, /* after accounts: its tables reference users and devices */
    &PRESENCE_MODULE, /* after accounts and rooms: reads users and room members */
    &APPSERVICE_MODULE, /* after accounts and rooms: makes users, reads events */
    &REPORTS_MODULE,    /* after accounts and rooms: reads users, rooms and events */
    NULL,
};

int client_route(http_server *s, const char *method, const char *path, atrium_handler handler,
                 int64_t max_body_bytes)
{
    atrium_route r = {.method = method, .path = path, .handler = handler,
                      .max_body_bytes = max_body_bytes};
    return http_routes_add(s, &r, 1, "core");
}
