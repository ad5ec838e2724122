/*
 * core/client/push/push_send.h - the push sender (push_send.c): which events notify whom
 * (the push_notifications rows GET /notifications serves) and delivery of them to the push
 * gateways of http pushers. Its tables are the accounts module's migrations
 * (core/client/accounts/accounts.c); it is started and stopped by the rooms module
 * (core/client/rooms/crooms_module.c), after the rooms tables a pass reads exist.
 * Internal prefix: push_send_.
 */
#ifndef ATRIUM_CORE_PUSH_SEND_H
#define ATRIUM_CORE_PUSH_SEND_H

#include "core/store/db.h"
#include "core/store/lease.h"

typedef struct push_send_settings {
    db_pool *db;                    /* NULL: no sender (start returns 0) */
    lease_service *leases;          /* NULL: a lone process, always the sender */
    int64_t lease_ttl_ms;           /* server.lease_ttl_ms */
    rt_metrics *metrics;            /* atrium_push_in_flight{,_limit}, ..._pruned_total */
    int notifications_per_user_max; /* push.notifications_per_user_max; <= 0: 1000 */
} push_send_settings;

/* Start the sender thread on set->db. With leases, it decides and sends only while this
 * process holds the lease core.push_sender (ttl lease_ttl_ms). Nothing of set is kept but
 * the pointers (which must outlive the sender). 0 or ATRIUM_E_IO (logged). Start-up,
 * after the lease service started. */
int push_send_start(const push_send_settings *set);
/* Stop and join it; requests in flight end on the outbound client's thread later (their
 * answers are then forgotten and the rows sent again by the next run). */
void push_send_stop(void);
/* Something was committed that may notify: run a pass soon. Any thread; cheap. */
void push_send_kick(void);

#endif
