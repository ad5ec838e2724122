/*
 * core/client/push/pushers.h - a user's pushers (pushers.c): GET /pushers and POST
 * /pushers/set (delivery is push_send.c), and GET /notifications (notifications.c). The
 * routes are registered by the accounts module (core/client/accounts/accounts.c), whose
 * migrations hold the tables.
 * Internal prefix: pushers_.
 */
#ifndef ATRIUM_CORE_PUSHERS_H
#define ATRIUM_CORE_PUSHERS_H

#include "core/client/client.h"

/* Register GET /pushers and POST /pushers/set. 0 or -1 (logged). */
int pushers_routes(http_server *s);
/* Register GET /notifications (notifications.c). 0 or -1 (logged). */
int notifications_routes(http_server *s);

#endif
