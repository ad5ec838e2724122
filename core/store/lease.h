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
/* Does this process hold l now? Never waits, never touches the database. A NULL lease
 * (no service: unit tests, a single process without one) counts as held. Any thread. */
bool lease_held(const lease *l);
/* The lease's name. */
const char *lease_name(const lease *l);
/* Stop the lease thread and give up every lease held (one DELETE each), so another
 * process takes them within a quarter of their ttl instead of a whole one. Call it after
 * the jobs they guard stopped. Idempotent. Main thread. */
void lease_service_stop(lease_service *s);
void lease_service_free(lease_service *s);

#endif
