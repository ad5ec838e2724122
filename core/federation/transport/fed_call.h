/*
 * core/federation/transport/fed_call.h - federation requests and signature checks awaited on a
 * thread that may wait: a bounded pool's worker (the rooms' remote pool, the inbound
 * transaction pool), never a request-pool or federation-listener thread, which must park
 * instead (susp_wait, fed_request.h).
 *
 * Each call submits through the one outbound path (fed_request_submit, fed_verify) and
 * sleeps on a condition variable until the callback, which fed_request guarantees by the
 * request's deadline, so a call never outlives its deadline by more than the callback's
 * delivery.
 *
 * A pooled database connection is never pinned while another server is waited for (the
 * pool is what every request needs; a hung peer must not take it): a caller that holds
 * one names it in a fed_call_hold, and the call gives it back to the pool for as long as
 * it actually waits (a signature whose key is in memory does not wait) and borrows one
 * again after. What the caller read under it may have changed meanwhile (given_back says
 * so). Internal prefix: fed_call_.
 */
#ifndef ATRIUM_CORE_FED_CALL_H
#define ATRIUM_CORE_FED_CALL_H

#include <jansson.h>
#include <libpq-fe.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/federation/transport/fed_request.h"
#include "core/rooms/events.h"

#define FED_CALL_ERROR_BYTES 256

/* What a call got back. json is owned by the caller (json_decref), NULL unless the
 * answer was a JSON object. */
typedef struct fed_call_result {
    int outcome; /* FED_HTTP_OK or a negative fed_http / fed_request outcome */
    int status;  /* HTTP status when outcome == FED_HTTP_OK */
    json_t *json;
    char error[FED_CALL_ERROR_BYTES]; /* a sentence for logs, "" when fine */
} fed_call_result;

/* The pooled connection a caller holds across a call (NULL: it holds none).
 *   c           the caller's connection variable: *c is the connection (outside any
 *               transaction: a call asserts so before it gives it back), or NULL for
 *               none. When the call waits, *c goes back to the pool and is borrowed again
 *               after (DB_WAIT_CONFIGURED), maybe another connection; *c is NULL on return
 *               when none was free in time (logged): the call's result still stands, and
 *               the caller's next query fails as a database error ("retry").
 *   given_back  set to true when it was given back for a wait. */
typedef struct fed_call_hold {
    PGconn **c;
    bool given_back;
} fed_call_hold;

/* One request (o->on_done and o->arg are set here; want_json is forced on), waited for
 * with hold's connection given back meanwhile (hold may be NULL). true when it ran (see
 * out->outcome), false when it could not be submitted (out->error). Waiting threads only. */
bool fed_call(const fed_request_opts *o, fed_call_hold *hold, fed_call_result *out);
/* Is the answer 200 with a JSON object? */
bool fed_call_ok(const fed_call_result *res);
void fed_call_result_clear(fed_call_result *res);

/* Is obj signed by server_name with a key valid at valid_at_ms (the key fetched when
 * needed, with hold's connection given back while it is: hold may be NULL)? 0, or a
 * negative error with why. Waiting threads only. */
int fed_call_verify(const json_t *obj, const char *server_name, int64_t valid_at_ms,
                    fed_call_hold *hold, char why[FED_CALL_ERROR_BYTES]);

/* The signature checks an event needs under room version v: every server
 * event_required_signers names signed the redacted event, with a key valid at the event's
 * origin_server_ts from room version 5 on; keys are fetched with hold's connection given
 * back (hold may be NULL). 0, or a negative error with why naming the server. Waiting
 * threads only. */
int fed_call_verify_event(const room_version *v, const json_t *pdu, fed_call_hold *hold,
                          char why[FED_CALL_ERROR_BYTES]);

#endif
