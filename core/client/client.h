/*
 * core/client/client.h - the client-server API the core serves itself (accounts, rooms,
 * sync, ...), as modules that register routes and migrations like plugins do.
 *
 * Each module has one init function called at start-up before the listener opens; it
 * registers its routes on the core's router (owner "core") and its SQL migrations under
 * its own owner name ("accounts", "rooms", ...), so modules never collide on migration
 * numbers. Modules are handed the runtime object (core/runtime/core_runtime.h) and keep
 * what they create in it, not in file-level globals; they reach the database through
 * db_global() and the request through the core's internal request API
 * (core/http/http.h). Internal prefix: client_.
 */
#ifndef ATRIUM_CORE_CLIENT_H
#define ATRIUM_CORE_CLIENT_H

#include "core/http/http.h"
#include "core/runtime/core_runtime.h"
#include "core/store/db.h"

typedef struct client_module {
    const char *owner; /* migration owner */
    const atrium_migration *migrations;
    size_t n_migrations;
    /* Register routes on rt->http (and create what the module runs into rt). 0 or -1
     * (logged). */
    int (*init)(core_runtime *rt);
    int (*start)(core_runtime *rt); /* may be NULL: after migrations, before listening */
    void (*stop)(core_runtime *rt); /* may be NULL: after plugins stopped, before the
                                     * listener closes */
} client_module;

/* Every module, in start-up order; NULL-terminated. */
extern const client_module *const CLIENT_MODULES[];

/* A route of the core: router_add with owner "core", logging the refusal. */
int client_route(http_server *s, const char *method, const char *path, atrium_handler handler,
                 int64_t max_body_bytes);

#endif
