/*
 * core/federation/rooms/fed_rooms_queue.h - the one place the room model hands events to the
 * outbound transaction queue (fed_txn.h): every event this server stores in a room's
 * stream, whoever created it, is queued for the room's other servers inside the
 * transaction that stored it, and the sender is kicked after the commit.
 * They are fed_outbound_enqueue_pdu and fed_outbound_kick (fed_outbound.c), named for
 * the room model's use so the rule "which events are queued" reads in one place:
 * core/rooms/rooms_tx.c's store() for events created here, send_join for the event it accepted.
 */
#ifndef ATRIUM_CORE_FED_ROOMS_QUEUE_H
#define ATRIUM_CORE_FED_ROOMS_QUEUE_H

#include <libpq-fe.h>

/* Queue event_id for every server joined to room_id but this one and except_server (may
 * be NULL), and for the server of a user whose knock or invite it ends (a kick, a
 * withdrawn invite) when that server is not in the room. Inside the caller's transaction,
 * before the event becomes current state. 0, or -1 (the caller rolls back). */
int fed_rooms_queue_pdu(PGconn *c, const char *room_id, const char *event_id,
                        const char *except_server);
/* After the commit that queued: wake the sender. Any thread, never blocks. */
void fed_rooms_kick(void);

#endif
