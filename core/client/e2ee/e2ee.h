/*
 * core/client/e2ee/e2ee.h - end-to-end encryption plumbing: what the E2EE files share.
 *
 * The server only stores and routes keys and to-device messages; it never inspects
 * ciphertext and never verifies a client's signatures (clients do that; see the note in
 * e2ee_cross_signing.c). The files:
 *   e2ee.c                the module (routes, migrations owned by "e2ee") and the helpers
 *                         below: parameters, transactions, key-change positions, wake-ups
 *   e2ee_keys.c           keys/upload, keys/claim, and the e2ee sync section: the one-time
 *                         key counts, and the device lists (e2ee_sync_device_lists)
 *   e2ee_query.c          keys/query, keys/changes, and the device lists' queries
 *   e2ee_cross_signing.c  keys/device_signing/upload, keys/signatures/upload
 *   e2ee_backup.c         room_keys/version and room_keys/keys (server-side key backup)
 *   to_device.c           sendToDevice and the to_device sync section
 *
 * The decisions owned here: a change of a user's device or cross-signing keys takes one
 * stream position (stream_next(), see core/rooms/rooms.h) in device_lists_changes
 * (e2ee_record_key_change), and "who must hear about a user's key change" is the user and
 * everyone sharing a joined room with them (E2EE_SHARED_USERS_SQL, e2ee_wake_key_change).
 * Positions are taken last in a transaction: no row lock after a position (core/rooms/rooms.h).
 * Internal prefix: e2ee_.
 */
#ifndef ATRIUM_CORE_E2EE_H
#define ATRIUM_CORE_E2EE_H

#include <jansson.h>
#include <libpq-fe.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/http/http.h"

#define E2EE_MAX_ID_BYTES 255 /* user, device, key, room, session and transaction IDs */

/* ---- the module's parts (each registers its routes; 0 or -1, logged) -------------------- */
int e2ee_keys_init(http_server *s);
int e2ee_query_init(http_server *s);
int e2ee_cross_signing_init(http_server *s);
int e2ee_backup_init(http_server *s);
int to_device_init(http_server *s);

/* ---- requests ----------------------------------------------------------------------------- */

/* Requests are read with http_req_param, http_req_query and http_req_json (core/http/http.h). */
/* Is user_id on this server (ends in ":" + server_name)? */
bool e2ee_user_is_local(const atrium_req *r, const char *user_id);
/* The server-name part of a user ID ("" when it has none). */
const char *e2ee_user_domain(const char *user_id);
/* The first key of map (user ID -> anything) that is not a user ID whose server part is a
 * server name (core/rooms/rooms.h, rooms_user_id_ok), or NULL: such a name is refused with
 * 400 M_INVALID_PARAM before any server is asked or any back-off recorded. */
const char *e2ee_first_bad_user(const json_t *map);
/* Is s a usable identifier: non-empty, at most E2EE_MAX_ID_BYTES, no control characters. */
bool e2ee_id_ok(const char *s);
/* Is `map` {user ID: {device ID: value}} well formed and within `max_pairs` pairs? Every
 * device ID must pass e2ee_id_ok and every value value_ok. NULL, or a message for 400
 * M_BAD_JSON naming `what` (the field). */
const char *e2ee_check_device_map(const json_t *map, const char *what, size_t max_pairs,
                                  bool (*value_ok)(const json_t *value),
                                  const char *value_rule);

/* ---- database ----------------------------------------------------------------------------- */

/* A request's pooled connection: http_db_checkout / http_db_checkin (core/http/http.h). */
/* Run a parameterized statement; NULL (logged, result cleared) unless it returned `want`
 * (PGRES_TUPLES_OK or PGRES_COMMAND_OK). */
PGresult *e2ee_sql(PGconn *c, ExecStatusType want, const char *sql, int n,
                   const char *const *params) RT_MUST_CHECK;
/* A statement whose result is not needed, and BEGIN / COMMIT / ROLLBACK: db_exec,
 * db_begin, db_commit and db_rollback (core/store/db.h). */
/* [req] Answer 503 M_UNKNOWN for a failed database step (rolls back when in_txn). */
int e2ee_db_failed(atrium_req *r, PGconn *c, bool in_txn);
/* [req] A pooled connection inside a new transaction, or NULL after answering 503 (nothing
 * held). */
PGconn *e2ee_db_begin(atrium_req *r) RT_MUST_CHECK;

/* ---- key changes ------------------------------------------------------------------------- */

/* The users who hear of $1's key changes: $1 and every user joined to a room $1 is joined
 * to (current_state, owned by rooms). A SELECT of one text column named user_id, for
 * "IN (...)", CTEs and wake-ups. */
extern const char E2EE_SHARED_USERS_SQL[];
/* Record that user_id's device or cross-signing keys changed, at a fresh stream position,
 * inside the caller's transaction. 0 or ATRIUM_E_DB. */
int e2ee_record_key_change(PGconn *c, const char *user_id);
/* After the transaction that recorded a change committed: wake the parked syncs of
 * everyone who hears of user_id's key changes. Any thread with a connection. */
void e2ee_wake_key_change(PGconn *c, const char *user_id);
/* Whether (from, to] holds no key change and no membership change of anyone (then no
 * user's device lists changed in it): a boolean SQL expression of the parameters numbered
 * from and to (string literals, e.g. "1", "2"). */
#define E2EE_WINDOW_QUIET_SQL(from, to)                                                   \
    "(NOT EXISTS (SELECT 1 FROM device_lists_changes WHERE stream_pos > $" from "::bigint" \
    " AND stream_pos <= $" to "::bigint) AND NOT EXISTS (SELECT 1 FROM memberships"        \
    " WHERE stream_pos > $" from "::bigint AND stream_pos <= $" to "::bigint))"
/* The device_lists {changed, left} of an incremental sync (since > 0) into response; quiet:
 * E2EE_WINDOW_QUIET_SQL's answer for (since, upto], read by the caller (both empty then).
 * 1 when there is something to report, 0, or ATRIUM_E_DB. */
int e2ee_sync_device_lists(PGconn *c, const char *user_id, int64_t since, int64_t upto,
                           bool quiet, json_t *response);

/* ---- pure helpers (unit tested) ---------------------------------------------------------- */

/* Length of the algorithm part of "<algorithm>:<key id>", or -1 when either part is empty
 * or there is no colon. */
int e2ee_key_algorithm_len(const char *key_id);
/* Is `keys` a device_keys object uploadable by (user_id, device_id)? NULL when it is, else
 * a message for the client; *errcode gets "M_BAD_JSON" (shape) or "M_INVALID_PARAM"
 * (another user's or device's keys). */
const char *e2ee_check_device_keys(const json_t *keys, const char *user_id,
                                   const char *device_id, const char **errcode);
/* Is `key` a cross-signing key of user_id with `usage` (e.g. "master")? NULL when it is,
 * else a message; *public_key gets the key's one ed25519 public key (borrowed from key). */
const char *e2ee_check_cross_signing_key(const json_t *key, const char *user_id,
                                         const char *usage, const char **public_key);

/* ---- across servers (e2ee_remote.c, e2ee_federation.c) ------------------------------------ */

/* [req] Ask each server of `bodies` ({server: JSON body}) POST uri at once and park r until
 * all answered or the timeout (a JSON integer of ms, or NULL: 10 s) passed; the handler then
 * runs again and calls e2ee_fanout_finish. 0 (return ATRIUM_PARKED), ATRIUM_E_NOMEM, or
 * ATRIUM_E_STOPPED (answer 503). The fan-out lives in r->core_state. */
typedef struct e2ee_fanout e2ee_fanout;
int e2ee_fanout_start(atrium_req *r, const char *uri, json_t *bodies, const json_t *timeout);
/* [req] Has this request a fan-out (the run after e2ee_fanout_start)? */
bool e2ee_fanout_pending(atrium_req *r);
/* [req] The servers' 200 answers into answers {server: body} and a failures entry
 * {server: {status, message}} for each of the others; later answers are dropped. */
void e2ee_fanout_finish(atrium_req *r, json_t *answers, json_t *failures);
/* keys/query of server_name's users in req ({user: [device, ...]}) into resp (sections
 * device_keys, master_keys, self_signing_keys, user_signing_keys present). me: the asking
 * local user (its user-signing key and signatures are visible to it), NULL for another
 * server. false on a database failure. */
bool e2ee_query_local(PGconn *c, const char *server_name, const json_t *req, const char *me,
                      json_t *resp);
/* Claim one key of alg from (user, device) into `into`: 1 claimed, 0 none, ATRIUM_E_DB. */
int e2ee_claim_one(PGconn *c, const char *user, const char *device, const char *alg,
                   json_t *into);
/* keys/claim of server_name's users in req ({user: {device: alg}}) into keys. */
bool e2ee_claim_local(PGconn *c, const char *server_name, const json_t *req, json_t *keys);
/* Store to-device messages of sender for one local user's devices ({device or "*":
 * content}) in one statement; adds user to `woken` when something was stored. false on a
 * database failure. */
bool to_device_store(PGconn *c, const char *sender, const char *type, const char *user,
                     const json_t *devices, json_t *woken);
/* Register the federation routes (user/devices, user/keys/query, user/keys/claim) and the
 * EDU handlers (m.direct_to_device, m.device_list_update, m.signing_key_update). */
int e2ee_federation_init(http_server *s);
/* Start and stop the device-list resync pool (core.e2ee_resync). start: 0 or -1; stop:
 * after the inbound transaction pool stopped, frees the pool and its budget. */
int e2ee_federation_start(void);
void e2ee_federation_stop(void);

/* The backup replacement rule: does a backed-up session key with (verified,
 * first_message_index, forwarded_count) = new_* replace the stored old_* one? A verified key
 * beats an unverified one; then the lower first message index (it decrypts more); then the
 * fewer forwards. */
bool e2ee_backup_should_replace(bool old_verified, int64_t old_index, int64_t old_forwards,
                                bool new_verified, int64_t new_index, int64_t new_forwards);

#endif
