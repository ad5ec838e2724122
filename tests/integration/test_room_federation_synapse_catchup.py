"""Outages with a real Synapse (1.132) as the other server, both ways, seen through each
server's client API:

  * Synapse stopped while Atrium's users send 100 events: once it is back, its user sees
    all of them in order (Atrium sends the newest, Synapse fetches the rest);
  * Atrium restarted while Synapse is down, its outbound queue not empty: every queued
    event reaches Synapse once, in order (test_room_federation_partition.py's CatchUpTest,
    B being Synapse);
  * Atrium stopped while Synapse's user sends 100 events: once Atrium is back, its user
    sees all of them in order.

Skipped, saying so, when the Synapse peer is absent.
"""

import os
import unittest

import test_room_federation_partition as partition
from test_federation_synapse import PEER_SH, SKIP_MESSAGE, SynapseAsB, SynapseCase


@unittest.skipUnless(os.path.exists(PEER_SH), SKIP_MESSAGE)
class SynapseCatchUpTest(SynapseAsB, partition.CatchUpTest, SynapseCase):
    """Alice on Atrium (A), bob on Synapse (B); CatchUpTest's two tests, and the reverse
    outage."""

    synapse_ip, atrium_ip = "127.0.0.57", "127.0.0.58"

    def test_atrium_stopped_while_100_events_are_sent_at_synapse_gets_them_all_after_its_restart(self):
        room = self.public_room_with_bob()
        self.wait_until("bob's join at A", lambda: self.membership(
            self.alice, room, self.bob.user_id) == "join")
        self.assertEqual(self.a.stop(), 0)
        said = [f"s{i}" for i in range(1, 101)]
        for body in said:
            self.bob.send(room, {"msgtype": "m.text", "body": body})
        self.a.start()
        # Synapse holds its transaction to A and retries it (after 4 s, 16 s, then every
        # minute, for about 8 minutes, before it counts A as down): the first retry after
        # A is back delivers, and the rest of Synapse's queue follows.
        self.wait_until("the last message at A",
                        lambda: self.bodies(self.alice, room)[-1:] == ["s100"], timeout=120)
        self.assertEqual(self.all_bodies(self.alice, room), said)
        self.assertEqual(self.all_bodies(self.bob, room), said)
        self.wait_same_state(room)
        # Alice's next message reaches Synapse after all of them.
        self.alice.send(room, {"msgtype": "m.text", "body": "back"})
        self.wait_until("alice's message at B", lambda: self.bodies(self.bob, room)[-1:] == ["back"])


if __name__ == "__main__":
    unittest.main()
