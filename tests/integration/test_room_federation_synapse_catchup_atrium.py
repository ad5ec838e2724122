"""An outage of Atrium with a real Synapse (1.132) as the other server: Atrium stopped
while Synapse's user sends 100 events; once Atrium is back, its user sees all of them in
order through /messages, and Synapse's user sees Atrium's next message after them. The
reverse of test_room_federation_synapse_catchup.py's first test.

Skipped, saying so, when the Synapse peer is absent.
"""

import os
import unittest

import test_room_federation_partition as partition
from test_federation_synapse import PEER_SH, SKIP_MESSAGE, SynapseAsB, SynapseCase


@unittest.skipUnless(os.path.exists(PEER_SH), SKIP_MESSAGE)
class SynapseSendsWhileAtriumIsDownTest(SynapseAsB, partition.PartitionCase, SynapseCase):
    """Alice on Atrium (A), bob on Synapse (B)."""

    synapse_ip, atrium_ip = "127.0.0.63", "127.0.0.64"

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
