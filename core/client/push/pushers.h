/*
 * core/client/push/pushers.h - a user's pushers (pushers.c): GET /pushers and POST
 * /pushers/set, stored and listed (nothing is pushed yet). The routes are registered by
 * the accounts module (core/client/accounts/accounts.c), whose migrations hold the table.
 * Internal prefix: pushers_.
 */
#ifndef ATRIUM_CORE_PUSHERS_H
#define ATRIUM_CORE_PUSHERS_H

#include "core/client/client.h"

/* Register GET /pushers and POST /pushers/set. 0 or -1 (logged). */
int pushers_routes(http_server *s);

#endif
