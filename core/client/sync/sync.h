/*
 * core/client/sync/sync.h - GET /_matrix/client/v3/sync, and the seam other modules use to add
 * their own sections (to_device, device_lists, device_one_time_keys_count, ...) to it.
 *
 * A sync answers "what changed for this user between two stream positions". Both ends are
 * positions of stream_seq (core/client/sync/notifier.h): `since` comes from the client's token
 * ("s<N>", 0 for an initial sync) and `upto` is read once at the start of the run, so every
 * section of one response describes the same window (since, upto]. next_batch is "s<upto>".
 * When nothing is new and the client asked for a timeout, the request parks on its user's
 * notifier event (no thread, no database connection held) and runs again from the top when
 * woken or when the timeout passes. Internal prefix: sync_.
 *
 * Writers of rows a sync reports: take the row's position with the SQL function
 * stream_next() (core migration 2) rather than nextval('stream_seq'), inside
 * the transaction that writes the row. stream_next() holds a shared advisory lock until
 * that transaction ends, and a sync reads `upto` with stream_upto(), which waits for those
 * locks; so `upto` never passes a position whose row is not yet committed, and no row is
 * skipped by a client whose next `since` is that upto. A plain nextval() works but leaves a
 * short window in which a row committed late can be missed.
 */
#ifndef ATRIUM_CORE_SYNC_H
#define ATRIUM_CORE_SYNC_H

#include <jansson.h>
#include <libpq-fe.h>
#include <stdint.h>

#define SYNC_MAX_SECTIONS 8 /* sections other modules may add */

/*
 * A section of a sync response, added by another module.
 *
 *   c          a database connection the sync holds for this run only; use it for your
 *              queries, do not release it, do not keep it.
 *   user_id    the syncing user; device_id its device (from the access token).
 *   since      the client's position (0 for an initial sync);
 *   upto       the position next_batch will carry: report rows with since < pos <= upto,
 *              never rows after upto (the next sync will report those).
 *   response   the response object under construction: add your top-level keys
 *              ("to_device", "device_lists", "device_one_time_keys_count", ...) to it.
 *
 * Return 1 when the section added something new that the client must see now (a to-device
 * message, a device-list change): a sync with a timeout then answers at once instead of
 * parking. Return 0 when it added only steady-state data (e.g. key counts) or nothing.
 * The filter's `presence` part is applied by sync.c to "presence".events after the
 * sections ran; when it leaves none, a 1 counts only if "to_device".events or
 * "device_lists" still hold something (a filtered-out change wakes nobody for good).
 * Return a negative atrium_err (ATRIUM_E_DB) on failure: the sync answers 503 and logs it.
 *
 * Called on the thread that runs the sync handler, for every sync response (initial and
 * incremental, also the empty answer after a timeout), possibly several times for one
 * request (each run of a parked request recomputes its answer), so it must not have side
 * effects that a repeat would double. Anything written for a user that a sync should
 * report must take its position from stream_seq and be followed, after commit, by
 * notifier_wake_user(user_id) so parked syncs wake.
 */
typedef int (*sync_section_fn)(PGconn *c, const char *user_id, const char *device_id,
                               int64_t since, int64_t upto, json_t *response);

/* Register a section under a name (Simplified Sliding Sync runs it as the extension of
 * that name: "to_device", "e2ee"). [init] only: call it from a client module's init()
 * (main thread, before the listener opens). Sections run in registration order. 0, or
 * ATRIUM_E_LIMIT past SYNC_MAX_SECTIONS (logged). */
int sync_add_section(const char *name, sync_section_fn fn);
/* Run the sections registered under `name` for the window (since, upto] into response:
 * 1 when one of them had news, 0, or a negative atrium_err. Any request thread. */
int sync_sections_run(const char *name, PGconn *c, const char *user_id, const char *device_id,
                      int64_t since, int64_t upto, json_t *response);

#define SYNC_PLAN_MODE_MAX 32 /* a plan_cache_mode value, kept for a run */
/* How a run's first statement sets generic plans for the run (/sync's upto_and_ignored,
 * sliding sync's upto_and_generic_plans and ssync_conn_load): it selects from SYNC_PLAN_MODE_FROM, whose gp.plan_mode is the setting before (a
 * subquery kept apart by OFFSET 0, so read first), and SYNC_PLAN_MODE_SET, which depends
 * on it and so runs after. */
#define SYNC_PLAN_MODE_FROM "(SELECT current_setting('plan_cache_mode') AS plan_mode OFFSET 0) gp"
#define SYNC_PLAN_MODE_SET "set_config('plan_cache_mode', 'force_generic_plan' || left(gp.plan_mode, 0), false)"
/* The newest position whose writers have all committed (stream_upto()), or -1. */
int64_t sync_stream_upto(PGconn *c);
/* Set back the connection's plan_cache_mode from before a run's generic plans
 * (docs/adr/0039-sync-runs-use-generic-plans.md; prev: the mode its first statement read)
 * before c goes back to the pool; then prev is "". Nothing when prev is "". */
void sync_plan_mode_restore(PGconn *c, char prev[SYNC_PLAN_MODE_MAX]);

/* A woken long-poll (/sync, /events, sliding sync) runs again on the pool core.sync_woken,
 * not on the request pool: a message wakes every parked member of its room at once, and
 * run on the request pool each woken run held a request thread through its statements,
 * so a cheap request (/versions) waited behind them (docs/adr/0042-woken-long-polls-
 * leave-the-request-pool.md). On a run woken by its event, returns ATRIUM_HANDED_OFF
 * when r went to the pool (the caller returns it); 0 to run here (any other run, no
 * pool, or its queue full: the run then stays on this thread, as before). */
struct atrium_req;
int sync_woken_handoff(struct atrium_req *r);

#endif
