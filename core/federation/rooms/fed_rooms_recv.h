/*
 * core/federation/rooms/fed_rooms_recv.h - what the two readers of other servers' events share:
 * fed_rooms_recv.c (PDUs of transactions, and the gaps before them) and
 * fed_rooms_backfill.c (history older than the stream). One event's journey in, with its
 * checks, lives in fed_rooms_recv.c; these are the pieces the backfill reuses, so each
 * check stays in one function. Prefix: fed_rooms_recv_ (the file that defines them).
 */
#ifndef ATRIUM_CORE_FED_ROOMS_RECV_H
#define ATRIUM_CORE_FED_ROOMS_RECV_H

#include <jansson.h>
#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>

#include "core/federation/transport/fed_call.h"
#include "core/federation/transport/fed_internal.h"
#include "core/rooms/events.h"

#define FED_ROOMS_RECV_URI_BYTES 2048 /* a request URI to another server */

/* What one event's processing carries. */
typedef struct pdu_job {
    const char *origin;       /* the server that delivered it, and that missing events are
                               * asked of */
    const char *room_id;
    const room_version *v;
    PGconn *c;                /* borrowed, outside any transaction; fed_rooms_recv_ask and
                               * fed_rooms_recv_verify give it back for their waits and
                               * borrow another (NULL when none was free): the caller
                               * releases rx->c, not what it put here */
    int nesting;
    int fetched;              /* /event requests made, against the receiver's bound */
    int64_t gap_deadline_ms;  /* rt_now_ms() past which a gap is no longer walked nor its
                               * events processed: the state from the origin bridges the
                               * rest (0: no bound) */
} pdu_job;

/* A request to rx->origin, waited for (this thread waits: never the request pool's); the
 * JSON answer (new) or NULL (logged). rx->c is back in the pool while it waits and is
 * borrowed again after (DB_WAIT_CONFIGURED): NULL, with a NULL answer, when none was
 * free. No transaction may be open on rx->c. */
json_t *fed_rooms_recv_ask(pdu_job *rx, const char *method, const char *uri, const json_t *body);
/* The signatures pdu needs under rx->v (fed_call_verify_event), with rx->c back in the pool
 * while a key is fetched and borrowed again after (NULL when none was free: check rx->c
 * before the result); *given_back (may be NULL) says whether it was, so what was read
 * under it before may have changed. 0, or a negative error with why. */
int fed_rooms_recv_verify(pdu_job *rx, const json_t *pdu, bool *given_back,
                    char why[FED_CALL_ERROR_BYTES]);
/* Keep pdu (id) as rejected, with why, so it is not fetched again and never served. 0 or
 * -1 database. */
int fed_rooms_recv_store_rejected(pdu_job *rx, const char *id, const json_t *pdu, const char *why);
/* Whether pdu's auth events can be checked against. */
typedef enum fed_rooms_recv_auth {
    FED_ROOMS_RECV_AUTH_READY = 0,   /* every one stored and not rejected: *auth holds them */
    FED_ROOMS_RECV_AUTH_REFUSED,     /* one is malformed, rejected here, or was fetched and failed
                                * its checks: pdu is to be rejected */
    FED_ROOMS_RECV_AUTH_UNAVAILABLE, /* one could not be had now (no answer from the origin, the
                                * fetch bound or depth reached, the database): nothing is
                                * decided, pdu is not to be kept as rejected for it */
} fed_rooms_recv_auth;
/* Are every auth event of pdu stored and not rejected, fetching missing ones with /event
 * while depth allows (each checked and kept as an outlier, or as rejected when it fails
 * the auth rules)? Their PDU map into *auth (new) when READY, else *auth is NULL. */
fed_rooms_recv_auth fed_rooms_recv_auth_events(pdu_job *rx, const json_t *pdu, int depth, json_t **auth);
/* Does pdu pass against auth, the PDU map fed_rooms_recv_auth_events gave for it: first the
 * spec's rule 2 on its own auth events (room_auth_check_auth_events: each of pdu's room,
 * no (type, state_key) twice, only those auth events selection picks, the create event
 * among them; a named event that is not a state event fails it too), then the auth rules
 * (room_auth_check_event). false with why (ROOM_AUTH_WHY_LEN). Pure. */
bool fed_rooms_recv_auth_passes(const room_version *v, const json_t *pdu, const json_t *auth,
                          char *why);
/* qsort comparator of PDUs (json_t *) by depth, ascending. */
int fed_rooms_recv_by_depth(const void *x, const void *y);

/* fed_rooms_backfill.c: its metrics (from fed_rooms_recv_init). 0. */
int fed_rooms_backfill_init(fed_module *m);

#endif
