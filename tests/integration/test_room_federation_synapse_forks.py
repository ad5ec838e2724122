"""Forks with a real Synapse (1.132) as the other server: the fork tests of
test_room_federation_partition.py (power levels against a topic and a name; a ban against
the demotion of its sender, both orders) with Synapse as the other server, in a room of
Atrium's (test_room_federation_synapse_room_forks.py: in a room of Synapse's). While the two cannot
reach each other (one of them stopped while the other's user acts, then the other way
round), each lets its user change the room's state; once both run again, both give the
same resolved state through their client APIs.

The partition is real: Synapse stopped with peer.sh (TERM) and started again on the same
database, Atrium stopped and started the same way. Each side then learns of the other's
return as it does in production: Atrium retries on its backoff schedule; Synapse retries
the transaction it holds (after 4 s, 16 s, then every minute) or, when it was restarted
itself, catches Atrium up from the last PDU it delivered there (it sends its newest event
in the room; Atrium fetches the rest with get_missing_events).

Skipped, saying so, when the Synapse peer is absent.
"""

import os
import unittest

import test_room_federation_partition as partition
from accounts import quote
from harness import psql
from test_federation_synapse import PEER_SH, SKIP_MESSAGE, SynapseAsB, SynapseCase


class BothSidesSeen:
    """ForkTest's checks, and what each side's user did while cut off reached the other
    server: neither resolved with half the fork unseen."""

    def room_with_bob_at_50(self):
        # The Synapse user speaks before the partition. Synapse catches a destination up
        # (its newest event per room, once the destination is reachable again) only from
        # the last PDU it delivered there: a server it never delivered a PDU to gets
        # nothing of what it missed until Synapse's next event in the room.
        room, pl = super().room_with_bob_at_50()
        self.synapse_user.send(room, {"msgtype": "m.text", "body": "before the partition"})
        self.wait_until("the Synapse user's message at Atrium",
                        lambda: "before the partition" in self.bodies(self.atrium_user, room))
        return room, pl

    def state_events(self, client, room):
        """The state events of the room's timeline as client's server shows it (newest
        first, up to 100: these rooms hold fewer)."""
        chunk = client.ok("GET", f"/_matrix/client/v3/rooms/{quote(room)}/messages"
                                 "?dir=b&limit=100", timeout=30)["chunk"]
        return [e for e in chunk if "state_key" in e]

    def held_at_atrium(self, event_ids):
        """The IDs of event_ids Atrium stored (in the room's stream, or kept aside as
        soft-failed, rejected or outlier)."""
        listed = ",".join(f"'{e}'" for e in event_ids)
        rows = psql(f"SELECT event_id FROM events WHERE event_id IN ({listed}) UNION"
                    f" SELECT event_id FROM event_outliers WHERE event_id IN ({listed})",
                    database=self.atrium.database)
        return {r[0] for r in rows}

    def assert_resolved(self, room, **expect):
        # Synapse holds a transaction to a server it cannot reach and retries it (after 4 s,
        # 16 s, then every minute, for about 8 minutes) before it counts that server as
        # down: what its user did while Atrium was away arrives at Atrium's next retry
        # after it is back (or, when Synapse itself was restarted, with its catch-up).
        theirs = [e["event_id"] for e in self.state_events(self.synapse_user, room)
                  if e["sender"] == self.synapse_user.user_id]
        # Polled each second (a psql each): Synapse's retries come seconds apart.
        self.wait_until("the Synapse user's events of the partition at Atrium",
                        lambda: self.held_at_atrium(theirs) == set(theirs), timeout=120,
                        interval=1)
        super().assert_resolved(room, **expect)
        ours = [e["event_id"] for e in self.state_events(self.atrium_user, room)
                if e["sender"] == self.atrium_user.user_id]
        self.assertEqual(self.synapse.held(ours), set(ours))


@unittest.skipUnless(os.path.exists(PEER_SH), SKIP_MESSAGE)
class SynapseForkTest(BothSidesSeen, SynapseAsB, partition.ForkTest, SynapseCase):
    """ForkTest's three tests in a room of Atrium's, B (bob, at 50) being Synapse."""

    synapse_ip, atrium_ip = "127.0.0.55", "127.0.0.56"


if __name__ == "__main__":
    unittest.main()
