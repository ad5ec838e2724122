/*
 * core/client/push/push_send.h - the push sender (push_send.c): which events notify whom
 * (the push_notifications rows GET /notifications serves) and delivery of them to the push
 * gateways of http pushers. Its tables are the accounts module's migrations
 * (core/client/accounts/accounts.c); it is started and stopped by the rooms module
 * (core/client/rooms/rooms.c), after the rooms tables a pass reads exist.
 * Internal prefix: push_send_.
 */
#ifndef ATRIUM_CORE_PUSH_SEND_H
#define ATRIUM_CORE_PUSH_SEND_H

#include "core/store/db.h"
#include "core/store/lease.h"

/* Start the sender thread on db. With leases (NULL: a lone process), it decides and sends
 * only while this process holds the lease core.push_sender (ttl lease_ttl_ms). 0 or
 * ATRIUM_E_IO (logged). Start-up, after the lease service started. */
int push_send_start(db_pool *db, lease_service *leases, int64_t lease_ttl_ms);
/* Stop and join it; requests in flight end on the outbound client's thread later (their
 * answers are then forgotten and the rows sent again by the next run). */
void push_send_stop(void);
/* Something was committed that may notify: run a pass soon. Any thread; cheap. */
void push_send_kick(void);

#endif
