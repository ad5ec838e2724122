/*
 * core/federation/transport/fed_txn.h - federation transactions both ways: the seam between the
 * transport of PDUs and EDUs (this module) and what they mean (the room model for PDUs,
 * the client modules for EDUs).
 *
 * Outbound: whatever must reach other servers is queued in PostgreSQL inside the
 * transaction that stored it, so nothing committed is lost across a restart and nothing
 * rolled back is sent. A sender (one I/O path, no request thread) drains each destination's
 * queue into transactions of at most FED_TXN_MAX_PDUS PDUs and FED_TXN_MAX_EDUS EDUs, one
 * transaction in flight per destination, with the transport's backoff between failures.
 *
 * Inbound: PUT /_matrix/federation/v1/send/{txnId} hands the transaction to a bounded
 * pool; each PDU goes, in order, to the handler the room model registered, each EDU to the
 * handler registered for its type. The answer is per PDU, as the spec's transaction
 * response has it. Internal prefix: fed_txn_, fed_outbound_.
 */
#ifndef ATRIUM_CORE_FED_TXN_H
#define ATRIUM_CORE_FED_TXN_H

#include <jansson.h>
#include <libpq-fe.h>
#include <stdbool.h>

#define FED_TXN_MAX_PDUS 50  /* per transaction, both ways (the spec's limit) */
#define FED_TXN_MAX_EDUS 100 /* per transaction, both ways */
#define FED_PDU_ERR_LEN 256

/* ---- outbound ------------------------------------------------------------------------ */

/* Queue event_id (already stored in events) for every server with a joined member in the
 * room's current state, except this server and except_server (may be NULL: e.g. the
 * server whose send_join delivered it). Runs inside the caller's open transaction on c.
 * 0, or -1 on a database failure (the caller rolls back). */
int fed_outbound_enqueue_pdu(PGconn *c, const char *room_id, const char *event_id,
                             const char *except_server);
/* Queue event_id for one destination (not this server, nor one the domain whitelist
 * excludes: then nothing, 0), inside the caller's open transaction. 0 or -1. */
int fed_outbound_enqueue_pdu_to(PGconn *c, const char *destination, const char *room_id,
                                const char *event_id);
/* Queue one EDU for one destination, inside the caller's open transaction. 0 or -1. */
int fed_outbound_enqueue_edu(PGconn *c, const char *destination, const char *edu_type,
                             const json_t *content);
/* Queue one EDU for every server with a joined member in room_id's current state except
 * this one (typing, receipts), inside the caller's transaction. 0 or -1. */
int fed_outbound_enqueue_room_edu(PGconn *c, const char *room_id, const char *edu_type,
                                  const json_t *content);
/* After the commit that queued something: wake the sender. Any thread, never blocks. */
void fed_outbound_kick(void);
/* Is server_name in room_id: has it a member joined in current state? 1 yes, 0 no, -1 on a
 * database failure. For EDU handlers: an EDU about a room counts only from a server in it. */
int fed_txn_server_in_room(PGconn *c, const char *room_id, const char *server_name);

/* ---- inbound ------------------------------------------------------------------------- */

enum fed_pdu_outcome {
    FED_PDU_ACCEPTED = 0,
    FED_PDU_SOFT_FAILED = 1, /* stored, not part of the room's current state or timeline */
    FED_PDU_REJECTED = 2,    /* err says which check failed; reported in the answer */
    FED_PDU_RETRY = 3,       /* transient (the database, or an event it needs that could not
                              * be fetched now): not kept; reported as an error for it */
    FED_PDU_REJECTED_KEPT = 4, /* refused by the auth rules and kept as rejected: processed,
                                * so answered {} as Synapse does (a rejected event is never
                                * served nor current state); counted as rejected */
};

/* Process one PDU of a transaction from origin (its signature on the request verified).
 * Runs on the inbound pool's thread: it may use the database and make federation requests
 * and wait for them (with deadlines), never on a request thread. pdu is borrowed. */
typedef int (*fed_pdu_handler_fn)(void *ctx, const char *origin, const json_t *pdu,
                                  char err[FED_PDU_ERR_LEN]);
/* Set the PDU handler (the room model does, once, at start). Without one, PDUs are
 * answered with an error and not stored. */
void fed_txn_set_pdu_handler(fed_pdu_handler_fn fn, void *ctx);

/* Handle one EDU of a transaction (same thread rules as PDUs). */
typedef void (*fed_edu_handler_fn)(void *ctx, const char *origin, const json_t *content);
/* Register the handler of one EDU type ("m.typing", ...). 0, or -1 when the type already
 * has one or the table is full. */
int fed_txn_on_edu(const char *edu_type, fed_edu_handler_fn fn, void *ctx);

#endif
