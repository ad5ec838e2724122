/*
 * core/store/lease.h - leases: a background job that must run once across every process
 * sharing one database (the federation sender, the typing reaper, a plugin's eviction)
 * runs only in the process holding its lease, and another process takes it over when the
 * holder dies. The design (a row per lease, one statement per renewal, no connection held)
 * is in lease.c. Internal prefix: lease_.
 */
#ifndef ATRIUM_CORE_LEASE_H
#define ATRIUM_CORE_LEASE_H

#include <stdbool.h>
#include <stdint.h>

#include "core/runtime/runtime.h"
#include "core/store/db.h"

/* Bounds of a lease's ttl (the host ABI's lease_create says the same), in ms. */
#define LEASE_MIN_TTL_MS INT64_C(1000)
#define LEASE_MAX_TTL_MS INT64_C(600000)
#define LEASE_NAME_MAX_BYTES 96 /* a whole name, with the plugin's scope */

typedef struct lease_service lease_service;
typedef struct lease lease;

/* A service taking and renewing leases as `holder` (the instance name; a random suffix is
 * added, so two processes given the same name still hold apart) on db. Creates nothing in
 * the database and starts no thread yet. NULL on allocation failure. Main thread. */
lease_service *lease_service_new(db_pool *db, const char *holder, rt_metrics *metrics);
/* Apply the lease table's migration (owner "leases") and start the lease thread. 0, or -1
 * after logging. Main thread, after db_pool_connect. */
int lease_service_start(lease_service *s);
/* A lease on `name` (1..LEASE_NAME_MAX_BYTES - 1 characters of [a-z0-9_.]; the caller
 * scopes it, "core.", "plugin.<name>.") with ttl_ms in [LEASE_MIN_TTL_MS,
 * LEASE_MAX_TTL_MS]. The lease thread tries to take it at once and then every ttl_ms / 4;
 * on_gain(arg) (optional) runs on the lease thread each time this process takes it (it
 * must not block: wake the job). The lease belongs to the service (freed with it). NULL
 * on a bad name or ttl, a name already created, or allocation failure. Any thread. */
lease *lease_create(lease_service *s, const char *name, int64_t ttl_ms,
                    void (*on_gain)(void *arg), void *arg);
/* lease_create's twin for a lease this process takes only when it chooses to (one of a
 * set of leases shared out between processes): created not wanted, so the lease thread
 * does not try it until lease_want(l, true). Same arguments and answers. Any thread. */
lease *lease_create_idle(lease_service *s, const char *name, int64_t ttl_ms,
                         void (*on_gain)(void *arg), void *arg);
/* Say whether this process wants l. true: the lease thread tries it at once and then as
 * lease_create says. false: lease_held(l) reads false from the moment this returns (the
 * caller's job must have stopped using it: a job that holds one still running keeps
 * running until it notices), and the lease thread gives the row up at once (one DELETE)
 * so another process may take it within a quarter of its ttl. Idempotent. Any thread. */
void lease_want(lease *l, bool want);
/* How many leases whose name starts with prefix are held by some process now, by the
 * database's clock: e.g. processes that announce themselves each with a lease of their
 * own. Rows under prefix expired more than LEASE_MAX_TTL_MS ago are deleted on the way (a
 * dead process's per-process lease would otherwise stay forever; an expired row means
 * nothing to the take statement). The count, or -1 after logging a database failure.
 * On the caller's connection c, outside a transaction. Any thread. */
int lease_count_live(PGconn *c, const char *prefix);
/* Does this process hold l now (and want it)? Never waits, never touches the database. A
 * NULL lease (no service: unit tests, a single process without one) counts as held. Any
 * thread. */
bool lease_held(const lease *l);
/* The lease's name, and the holder this process writes into its row ("" for NULL). */
const char *lease_name(const lease *l);
const char *lease_holder(const lease *l);
/* A fence: an SQL condition, true only while the row of the lease named by parameter
 * `name` ("$5") is this holder's (parameter `holder`, lease_holder) and unexpired by the
 * database's clock. A write guarded by it cannot land after another process took the
 * lease over, however long the writer stalled after it last checked lease_held. */
#define LEASE_FENCE_SQL(name, holder)                                                      \
    "EXISTS (SELECT 1 FROM core_leases WHERE name = " name "::text AND holder = " holder    \
    "::text AND expires_at > clock_timestamp())"
/* Stop the lease thread and give up every lease held (one DELETE each), so another
 * process takes them within a quarter of their ttl instead of a whole one. Call it after
 * the jobs they guard stopped. Idempotent. Main thread. */
void lease_service_stop(lease_service *s);
void lease_service_free(lease_service *s);

#endif
