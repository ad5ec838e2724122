/*
 * core/federation/rooms/fed_rooms.h - rooms as other servers see them: the rules that decide
 * what a server may read of a room (history visibility for servers) and whether its
 * traffic is accepted at all (m.room.server_acl), and the routes built on them:
 * fed_rooms_serve.c (event, state, state_ids, backfill, get_missing_events,
 * timestamp_to_event) and
 * fed_rooms_hierarchy.c (a space and its children for another server),
 * fed_rooms_join.c (make_join/send_join, make_leave/send_leave, make_knock/send_knock as
 * the resident server),
 * fed_rooms_invite.c (invites of our users by other servers), fed_rooms_recv.c
 * (PDUs received in transactions) and fed_rooms_outsider.c (the end of our users' knocks
 * and invites on rooms this server is not in).
 *
 * The room model itself (tables, the graph, auth rules) is core/rooms/; these files only
 * read it and answer. Internal prefix: fed_rooms_.
 */
#ifndef ATRIUM_CORE_FED_ROOMS_H
#define ATRIUM_CORE_FED_ROOMS_H

#include <jansson.h>
#include <libpq-fe.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/federation/transport/fed_internal.h"
#include "core/federation/transport/fed_txn.h"
#include "core/rooms/events_graph.h"
#include "core/rooms/rooms.h"

#define FED_ROOMS_BACKFILL_MAX 100      /* events one /backfill answers at most */
#define FED_ROOMS_MISSING_DEFAULT 10    /* get_missing_events without a limit */
#define FED_ROOMS_MISSING_MAX 50        /* get_missing_events: the largest limit honoured */
#define FED_ROOMS_MISSING_VISIT_MAX 500 /* events walked to answer one get_missing_events */
#define FED_ROOMS_JUMP_SCAN_MAX 100     /* timestamp_to_event: candidates checked for visibility */

/* The server part of an ID without a port, for ACLs ("@a:h.org:8448" -> "h.org"). */
void fed_rooms_host_of_server(const char *server_name, char *out, size_t len);

/* Does the room's m.room.server_acl (current state) allow server_name? Without an ACL
 * every server is allowed. The spec's rule: an IP literal is denied unless
 * allow_ip_literals (default true); then any deny glob match denies; then an allow glob
 * match allows; anything else is denied. Globs: '*' any run, '?' one character. 1 allowed,
 * 0 denied, -1 database. */
int fed_rooms_acl_allows(PGconn *c, const char *room_id, const char *server_name);
/* The glob rule alone (pure, for the unit test): acl is the event content. */
bool fed_rooms_acl_content_allows(const json_t *acl, const char *server_name);

/* May server see an event at stream position pos (INT64_MAX: "now", for outliers)?
 * History visibility for servers: world_readable; or one of its users was joined at pos;
 * or "shared" and one is joined now; or "invited" and one was invited at pos. 1 yes, 0
 * no, -1 database. */
int fed_rooms_server_may_see(PGconn *c, const char *room_id, const char *server, int64_t pos);

/* Is one of server's users joined to room_id now? 1, 0, -1 database. */
int fed_rooms_server_joined(PGconn *c, const char *room_id, const char *server);
/* Has one of server's users any membership (join, invite, leave, ban, knock) in room_id's
 * current state? 1, 0, -1 database. */
int fed_rooms_server_involved(PGconn *c, const char *room_id, const char *server);

/* [req] The shared checks of every room route: a connection (503 when none), the room
 * known here (404), its ACL allowing r->origin (403). Returns the connection, or NULL
 * after answering. */
PGconn *fed_rooms_open(atrium_req *r, const char *room_id);
void fed_rooms_close(PGconn *c);

/* Is event_id an event of room_id's stream? 1 with *pos its position (<= 0 for history
 * backfilled from other servers), 0 not in the stream, -1 database. pos may be NULL. */
int fed_rooms_event_pos(PGconn *c, const char *room_id, const char *event_id, int64_t *pos);
/* The events just beyond what this server has of room_id's history (prev events of
 * stored events that are neither stored nor rejected, nor dead ends of an earlier
 * backfill still resting), the deepest first, at most max, into *out (a new array of
 * IDs). Their count, or -1 database. */
int fed_rooms_backward_extremities(PGconn *c, const char *room_id, int max, json_t **out);
/* fed_rooms_recv.c: read up to limit events of room_id's history older than what is
 * stored from a server in the room (/backfill at the backward extremities, the room's
 * creating server first), check each as a received PDU is checked (format, ID,
 * signatures, content hash, the auth rules against its auth events, fetched when
 * missing) and store those that pass at positions below the stream
 * (ROOMS_PDU_BACKFILLED), those that fail as rejected. Waits for the peers (each request
 * with its deadline): call it off the request pool. *c is borrowed, outside any
 * transaction; it goes back to the pool while a peer is waited for, and *c is then the
 * connection borrowed again after (DB_WAIT_CONFIGURED), the caller's to release (NULL,
 * with -1, when none was free in time). The count stored, or -1 (database; logged). */
int fed_rooms_backfill(PGconn **c, const char *room_id, int limit);

/* Route registration: every route of these files (fed_rooms_access.c calls the others'),
 * fed_rooms_serve.c's, fed_rooms_join.c's. 0 or -1 (logged). */
/* Register the room endpoints and the room model's hooks (the PDU handler, the write
 * path's outbound queue): main.c, after federation_init, before federation_start. 0 or
 * -1; 0 and nothing done when there is no federation module. */
int fed_rooms_init(void);
int fed_rooms_routes(fed_module *m);
int fed_rooms_serve_routes(fed_module *m);
/* fed_rooms_hierarchy.c: GET /_matrix/federation/v1/hierarchy/{roomId} (spaces). */
int fed_rooms_hierarchy_routes(fed_module *m);
int fed_rooms_join_routes(fed_module *m);
int fed_rooms_invite_routes(fed_module *m); /* fed_rooms_invite.c: PUT /v2/invite */
/* fed_rooms_recv.c: register the handler of received PDUs and its metrics. 0. */
int fed_rooms_recv_init(fed_module *m);
/* fed_rooms_outsider.c: a received PDU that ends one of our users' knocks or invites on a
 * room this server is not in (the resident's kick): checked as far as no room state is
 * needed (format, the knock or invite among its auth events, content hash, signatures)
 * and kept as an outlier and the user's newest membership. A FED_PDU_* outcome, or
 * FED_ROOMS_NOT_OUTSIDER when pdu is no such event (fed_rooms_recv.c's then). Waits
 * for key look-ups: inbound pool threads only. *c is borrowed, outside any transaction;
 * it goes back to the pool while a key is fetched and is borrowed again after, maybe
 * another connection, NULL when none was free (then FED_PDU_RETRY): the caller releases
 * *c, not what it passed. */
#define FED_ROOMS_NOT_OUTSIDER (-1)
int fed_rooms_outsider_pdu(PGconn **c, const char *origin, const json_t *pdu,
                           char err[FED_PDU_ERR_LEN]);
/* [req] The fed_rooms routes' common answer envelope: {"origin", "origin_server_ts",
 * "pdus": pdus (stolen)}. */
int fed_rooms_respond_pdus(atrium_req *r, json_t *pdus);

#endif
