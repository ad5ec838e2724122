"""Forks with a real Synapse (1.132) as the other server, in a room of Synapse's: alice,
who created it, and carol on Synapse, bob (at power 50) on Atrium, which joined it; the
fork tests of test_room_federation_partition.py across a real partition (one server
stopped while the other's user acts, then the other way round), and the checks of
test_room_federation_synapse_forks.py (the same resolved state through both client
APIs, each side's partition events held by the other). A file of its own for the time
it takes.

Skipped, saying so, when the Synapse peer is absent.
"""

import os
import unittest

import test_room_federation_partition as partition
from test_federation_synapse import PEER_SH, SKIP_MESSAGE, SynapseAsA, SynapseCase
from test_room_federation_synapse_forks import BothSidesSeen


@unittest.skipUnless(os.path.exists(PEER_SH), SKIP_MESSAGE)
class SynapseRoomForkTest(BothSidesSeen, SynapseAsA, partition.ForkTest, SynapseCase):
    """ForkTest's three tests in a room of Synapse's."""

    synapse_ip, atrium_ip = "127.0.0.59", "127.0.0.60"


if __name__ == "__main__":
    unittest.main()
