/*
 * core/federation/transport/fed_outbound_groups.h - which destinations this process's
 * federation sender sends to, when several processes share one database.
 *
 * Destinations are hashed into federation.sender_groups groups; a group is sent to only
 * by the process holding its lease (core.federation.outbound.<g>), and live processes
 * share the groups out, each taking at most its fair share. The design and its rules are
 * in fed_outbound_groups.c and docs/adr/0026-federation-sender-groups.md. Internal
 * prefix: fed_groups_. Every function but fed_groups_all_held runs on the sender thread.
 */
#ifndef ATRIUM_CORE_FED_OUTBOUND_GROUPS_H
#define ATRIUM_CORE_FED_OUTBOUND_GROUPS_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/runtime/runtime.h"
#include "core/store/lease.h"

#define FED_GROUPS_MAX 1024 /* federation.sender_groups at most (the setting's bound) */

typedef struct fed_groups fed_groups;

/* n_groups groups (1..FED_GROUPS_MAX), every one held until fed_groups_start gives them
 * leases. NULL on a bad count or allocation failure. */
fed_groups *fed_groups_new(int n_groups, rt_metrics *metrics);
/* Make the leases on s with ttl_ms: one per group, not wanted yet, and this process's
 * announcement (core.federation.senders.<random>), taken at once. wake(arg) runs on the
 * lease thread when a group's lease or the announcement comes to this process (it must
 * not block). s NULL (no lease service: one process): nothing is made, every group stays
 * held. 0, or ATRIUM_E_NOMEM after logging. Main thread, before the sender starts. */
int fed_groups_start(fed_groups *g, lease_service *s, int64_t ttl_ms, void (*wake)(void *arg),
                     void *arg);
/* The group of destination: a hash every process and version computes alike. */
int fed_groups_of(const fed_groups *g, const char *destination);
/* May this process start a transaction to a destination of group now: it holds the
 * group's lease and is not giving it up. Check it right before each submit. */
bool fed_groups_sendable(const fed_groups *g, int group);
/* The lease of group, NULL when there are no leases (then every group is held). */
lease *fed_groups_lease(const fed_groups *g, int group);
/* When fed_groups_balance is due: 0 now, else in that many ms; -1 not until something
 * happens (no leases, or this process's announcement is not held: taking it wakes the
 * sender). A sender with nothing else to do borrows no connection before it is due. */
int64_t fed_groups_balance_in(const fed_groups *g);
/* Share the groups out (every ttl / 4, and at once after this process announced itself):
 * count the live senders on c, give up what is over this process's share (once drained,
 * fed_groups_release_drained) and want the groups no one holds while under it. */
void fed_groups_balance(fed_groups *g, PGconn *c);
/* Count the groups held (the gauge, and fed_groups_all_held's answer); the count. */
int fed_groups_count_held(fed_groups *g);
/* Draining: clear the marks, mark each group with a transaction in flight, then give up
 * the groups being left that have none (lease_want false: another process may take them). */
void fed_groups_clear_busy(fed_groups *g);
void fed_groups_note_busy(fed_groups *g, int group);
void fed_groups_release_drained(fed_groups *g);
/* Does this process hold every group (as last counted)? Any thread: a kick goes to the
 * other processes' senders only when it does not. */
bool fed_groups_all_held(const fed_groups *g);
void fed_groups_free(fed_groups *g);

#endif
