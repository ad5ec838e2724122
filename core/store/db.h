/*
 * core/store/db.h - the PostgreSQL pool shared by the core and plugins, and migrations.
 *
 * One pool of libpq connections, opened as they are needed up to database.pool_size (one
 * at start; the monitor opens another when a checkout finds none idle, and keeps what it
 * opened). A connection belongs to one
 * thread between db_acquire and db_release; acquire waits at most the caller's timeout
 * (no request ever hangs on an exhausted pool). No caller ever waits on PostgreSQL without
 * a bound, whatever libpq call it makes on its connection: the pool's monitor thread
 * probes a server that keeps a borrowed connection waiting, and when the probe gets no
 * answer within database.unresponsive_ms the database is "unavailable": every borrowed
 * connection is cut under its caller (whose libpq call then fails at once), and every
 * acquisition fails at once (503 upstream) until a probe is answered again. Broken
 * connections (cut, or PostgreSQL restarted) are re-established by the monitor, never on
 * a request thread, so the pool heals without a restart of Atrium. Migrations are recorded per owner ("core", "media", ...) in
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

/* Defaults of the two limits db_pool_tune sets (database.unresponsive_ms and
 * database.statement_timeout_ms). */
#define DB_DEFAULT_UNRESPONSIVE_MS 1000
#define DB_DEFAULT_STATEMENT_TIMEOUT_MS 30000

/* Opens nothing yet. request_wait_ms is what DB_WAIT_CONFIGURED waits (> 0). */
db_pool *db_pool_new(const char *conninfo, int size, int64_t request_wait_ms,
                     rt_metrics *metrics);
/* Before db_pool_connect: how long a probe may go unanswered before the database counts as
 * unavailable (> 0), and PostgreSQL's statement_timeout for pooled connections (0 = none,
 * or whatever the conninfo's own options say). */
void db_pool_tune(db_pool *p, int unresponsive_ms, int statement_timeout_ms);
/* Before db_pool_connect: whether db_query prepares statements on the pool's connections
 * (database.prepared_statements; on by default). */
void db_pool_prepare(db_pool *p, bool enabled);
/* Whether the database answers, as the monitor last found (true before any probe and for
 * no pool). Any thread; never waits. */
bool db_available(const db_pool *p);
/* The wait DB_WAIT_CONFIGURED stands for (0 for no pool). Any thread. */
int64_t db_request_wait_ms(const db_pool *p);
/* Open the first pool connection, retrying for up to retry_s seconds when PostgreSQL is not
 * reachable yet, and the probe's, then start the monitor thread (which opens the others
 * as checkouts need them). 0, or -1 after logging what failed and
 * what to check. */
int db_pool_connect(db_pool *p, int retry_s);
/* Borrow a connection, waiting at most timeout_ms (DB_WAIT_CONFIGURED: the configured
 * request wait) for a free one (none idle: the monitor opens one more if the pool may
 * grow; the caller never connects itself). NULL on timeout, and at once while the database is
 * unavailable (db_available; logged once per outage by the monitor, not per call). The
 * connection may be cut under the caller when PostgreSQL stops answering: its libpq calls
 * then fail as on a lost connection (answer 503). Any thread. */
PGconn *db_acquire(db_pool *p, int64_t timeout_ms) RT_MUST_CHECK;
/* db_acquire for a background sender, sweeper or migration, which no client waits on: it
 * takes an idle connection, and makes the pool grow only after waiting
 * DB_GROW_GRACE_BACKGROUND_MS (a request, DB_GROW_GRACE_MS), so the senders that wake
 * together at start and the start's migrations share what is open instead of each
 * opening one more. */
PGconn *db_acquire_background(db_pool *p, int64_t timeout_ms) RT_MUST_CHECK;
/* A second connection for a caller that holds one and can do without another (sliding
 * sync's parallel reads, docs/adr/0044-sliding-sync-reads-on-two-connections.md): an
 * idle one, taken only while another stays idle or the pool may still open one (which it
 * is then asked to, for the next checkout). Never waits and never counts as a checkout
 * timeout; NULL when there is none to spare or the database is unavailable. */
PGconn *db_acquire_spare(db_pool *p) RT_MUST_CHECK;
void db_release(db_pool *p, PGconn *c);
void db_pool_free(db_pool *p);
/* The connection string for dedicated connections (LISTEN): the configured one with the
 * pool's defaults (connect_timeout, TCP keepalives, tcp_user_timeout, statement_timeout)
 * where it sets none; the configured one before db_pool_connect. */
const char *db_pool_conninfo(const db_pool *p);

/* Apply owner's pending migrations (versions ascending, each recorded). 0 or -1 (logged). */
int db_migrate(db_pool *p, const char *owner, const atrium_migration *list, size_t n) RT_MUST_CHECK;

/* Apply the core's own migrations (db_core.c: core_server_info, the stream positions),
 * before any module's or plugin's. 0 or -1 (logged). */
int db_core_migrate(db_pool *p) RT_MUST_CHECK;

/* ---- statements on a borrowed connection (db_exec.c) ------------------------------------ */

/* Run one statement with text parameters. True when PostgreSQL accepted it (a command, or
 * rows, which are dropped); false after logging PostgreSQL's message (as an error, origin
 * "core"). The caller answers the failure (503, or a failed job) and, in a transaction,
 * calls db_rollback. The calling thread must hold c (db_acquire). */
bool db_exec(PGconn *c, const char *sql, int nparams, const char *const *params) RT_MUST_CHECK;
/* db_exec, and the number of rows the statement touched in *affected when it succeeded. */
bool db_exec_rows(PGconn *c, const char *sql, int nparams, const char *const *params,
                  int64_t *affected) RT_MUST_CHECK;
/* db_exec without its log line: on failure PostgreSQL's message is copied to err (err_len
 * bytes), for a caller that writes one line about a whole sequence of statements. */
bool db_exec_quiet(PGconn *c, const char *sql, int nparams, const char *const *params,
                   char *err, size_t err_len) RT_MUST_CHECK;
/* Start and commit a transaction: db_exec of BEGIN and of COMMIT (logged on failure). A
 * failed COMMIT leaves nothing applied; the caller still calls db_rollback, which is
 * harmless there and makes every failed transaction end the same way. */
bool db_begin(PGconn *c) RT_MUST_CHECK;
bool db_commit(PGconn *c) RT_MUST_CHECK;
/* End the transaction on c without applying it. Never fails in a way the caller must
 * handle: the failure that led here was logged where it happened, and a ROLLBACK fails only
 * on a lost connection, which db_release hands to the pool's monitor. */
void db_rollback(PGconn *c);

/* ---- prepared statements (db_prepared.c) ----------------------------------------------- */

/* How many statements one connection keeps prepared; db_query runs any further distinct
 * statement unprepared (atrium_db_unprepared_total). The core has a few hundred. */
#define DB_PREPARED_MAX 512

/* The pool's metrics for its connections' caches: statements prepared now, over all
 * connections (gauge), and executions run unprepared because a cache was full (counter). */
typedef struct {
    rt_metric *statements, *unprepared;
    bool off; /* database.prepared_statements false: every statement runs unprepared */
} db_prepared_stats;

/* Run one statement with text parameters and text results, as PQexecParams(c, sql, n, NULL,
 * params, NULL, NULL, 0) would, returning the same PGresult (the caller clears it): but
 * the first run of sql on c prepares it (a named statement on c's session) and later runs
 * only execute it, so PostgreSQL plans it once per connection. When preparing fails (a bad
 * statement, an aborted transaction, a lost connection) or c's cache is full, the statement
 * runs unprepared, so an error reads exactly as PQexecParams's. For the core's queries, not
 * for DDL, LISTEN or one-off statements. The calling thread must hold c. */
PGresult *db_query(PGconn *c, const char *sql, int n, const char *const *params);
/* db_query in two halves, for a caller with work of its own to do while PostgreSQL runs
 * the statement (docs/adr/0044-sliding-sync-reads-on-two-connections.md): send it (false:
 * nothing was sent, c is free again), then, before any other use of c, take its result
 * (what db_query would have returned; NULL only when c broke). A caller that gives up
 * after sending still takes the result before giving c back. */
bool db_query_send(PGconn *c, const char *sql, int n, const char *const *params) RT_MUST_CHECK;
PGresult *db_query_result(PGconn *c);
/* Several statements sent at once (libpq's pipeline mode): begin, db_query_send each,
 * sync (sends them; false: c failed; called also when a send failed, for end waits for
 * the sync point), then db_query_result for each in order, and end (what was not taken
 * is dropped; c is back to one statement at a time, or broken for the pool to replace).
 * Between sync and end, PostgreSQL runs them one after the other in one implicit
 * transaction: a failed one makes the later ones fail (PGRES_PIPELINE_ABORTED) and undoes
 * the earlier ones' changes, a session setting included. A statement a pipeline sends
 * for the first time on c runs unprepared and is prepared at the end. */
#define DB_PIPELINE_LATER 8 /* new statements a pipeline prepares at its end; more wait for a later one */
bool db_pipeline_begin(PGconn *c) RT_MUST_CHECK;
bool db_pipeline_sync(PGconn *c) RT_MUST_CHECK;
void db_pipeline_end(PGconn *c);
/* Give c its cache of prepared statements, counted in stats (may be NULL; it must outlive
 * c). The pool calls it for each connection it opens; db_query attaches any other
 * connection the first time, without metrics. libpq's reset of c empties the cache and
 * PQfinish frees it. False when it could not (db_query then runs c's statements
 * unprepared). */
bool db_prepared_attach(PGconn *c, const db_prepared_stats *stats);
/* How many statements c holds prepared (0 for a connection never attached). For tests. */
int db_prepared_count(const PGconn *c);

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
