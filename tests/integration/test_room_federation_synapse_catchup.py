"""Outages with a real Synapse (1.132) as the other server, both ways, seen through each
server's client API:

  * Synapse stopped while Atrium's users send 100 events: once it is back, its user sees
    all of them in order (Atrium sends only the newest, Synapse reads what lies before it
    from Atrium);
  * Atrium restarted while Synapse is down, its outbound queue not empty: every queued
    event reaches Synapse once, in order (test_room_federation_partition.py's CatchUpTest,
    B being Synapse);
  * Atrium stopped while Synapse's user sends 100 events: once Atrium is back, its user
    sees all of them in order (test_room_federation_synapse_catchup_atrium.py: a file of
    its own for the time these take).

Skipped, saying so, when the Synapse peer is absent.
"""

import os
import unittest

import test_room_federation_partition as partition
from test_federation_synapse import PEER_SH, SKIP_MESSAGE, SynapseAsB, SynapseCase


@unittest.skipUnless(os.path.exists(PEER_SH), SKIP_MESSAGE)
class SynapseCatchUpTest(SynapseAsB, partition.CatchUpTest, SynapseCase):
    """Alice on Atrium (A), bob on Synapse (B); CatchUpTest's two tests."""

    synapse_ip, atrium_ip = "127.0.0.57", "127.0.0.58"


if __name__ == "__main__":
    unittest.main()
