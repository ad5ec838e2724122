/*
 * core/store/db.h - the PostgreSQL pool shared by the core and plugins, and migrations.
 *
 * One fixed pool of libpq connections (database.pool_size). A connection belongs to one
 * thread between db_acquire and db_release; acquire waits at most the caller's timeout
 * (no request ever hangs on an exhausted pool). A connection found broken (PostgreSQL
 * restarted) is reset before it is handed out again, so the pool heals without a restart
 * of Atrium. Migrations are recorded per owner ("core", "media", ...) in
 * atrium_migrations and applied in one transaction per owner, serialized across
 * processes by an advisory lock. Internal prefix: db_.
 */
#ifndef ATRIUM_CORE_DB_H
#define ATRIUM_CORE_DB_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "atrium/host.h"
#include "core/runtime/runtime.h"

typedef struct db_pool db_pool;

/* db_acquire's timeout for a request path: the pool's configured wait
 * (database.checkout_timeout_ms), one setting for every such acquisition. Background work
 * that may wait longer, or a path that must not wait at all, passes its own. */
#define DB_WAIT_CONFIGURED INT64_C(-1)

/* Opens nothing yet. request_wait_ms is what DB_WAIT_CONFIGURED waits (> 0). */
db_pool *db_pool_new(const char *conninfo, int size, int64_t request_wait_ms,
                     rt_metrics *metrics);
/* The wait DB_WAIT_CONFIGURED stands for (0 for no pool). Any thread. */
int64_t db_request_wait_ms(const db_pool *p);
/* Open every connection, retrying for up to retry_s seconds when PostgreSQL is not
 * reachable yet. 0, or -1 after logging what failed and what to check. */
int db_pool_connect(db_pool *p, int retry_s);
/* Borrow a connection, waiting at most timeout_ms (DB_WAIT_CONFIGURED: the configured
 * request wait). NULL on timeout, or when the
 * connection could not be re-established (logged). Any thread. */
PGconn *db_acquire(db_pool *p, int64_t timeout_ms);
void db_release(db_pool *p, PGconn *c);
void db_pool_free(db_pool *p);
/* The connection string the pool was made with (for dedicated connections: LISTEN). */
const char *db_pool_conninfo(const db_pool *p);

/* Apply owner's pending migrations (versions ascending, each recorded). 0 or -1 (logged). */
int db_migrate(db_pool *p, const char *owner, const atrium_migration *list, size_t n);

/* Apply the core's own migrations (db_core.c: core_server_info, the stream positions),
 * before any module's or plugin's. 0 or -1 (logged). */
int db_core_migrate(db_pool *p);

/* ---- what every user of the database shares ------------------------------------------ */

/* A request path's wait for a pooled connection is DB_WAIT_CONFIGURED (above). How long
 * start-up waits for a connection to apply an owner's migrations. */
#define DB_MIGRATE_WAIT_MS 30000

/* The advisory-lock keys the core takes, as SQL text, all here so no two collide. The
 * bigint form: */
#define DB_LOCK_MIGRATIONS "7405418920188311" /* db_migrate: one migrating process at a time */
#define DB_LOCK_STREAM "7405418920188312"     /* stream_next (shared), stream_upto (exclusive) */
/* Key classes of the two-int form pg_advisory_xact_lock(class, key), a key space apart
 * from the bigint one: */
#define DB_LOCK_CLASS_PUSHERS "7405" /* pushers/set, per hash of (app_id, pushkey) */

/* The runtime object's pool (core/runtime/core_runtime.h), the one the core and the host
 * table's db_acquire use; NULL when no runtime object is bound. Any thread. */
db_pool *db_global(void);

#endif
