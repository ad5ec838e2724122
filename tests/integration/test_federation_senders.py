"""The federation sender spread over processes (core/federation/transport/fed_outbound_groups.c,
docs/adr/0026-federation-sender-groups.md): three Atrium processes of one server
(cluster.test) on one PostgreSQL, sending to eight fake receivers on loopback that record
every transaction they get (federation_support.FakeReceivingPeer: the peers).

  - the destination groups (federation.sender_groups, 16) are shared out over the live
    processes, each holding at most its fair share, and a process that starts later is
    given its share by the others; each destination is sent to by the holder of its group
    only, and receives every PDU once, in order;
  - a process killed (SIGKILL) with a transaction in flight: its groups are taken within
    server.lease_ttl_ms by the others, the transaction is sent again under the same
    transaction ID, and every destination still receives every PDU once, in order.

Addresses: processes' federation listeners 127.0.7.1-3, peers 127.0.7.11-18.
"""

import json
import os
import shutil
import tempfile
import threading
import time
import unittest

import harness
from accounts import register
from common import wait_until
from federation_support import FakeReceivingPeer, sender_group
from rooms_client import Client
from test_federation import FederationTestCase

PROC_IPS = ("127.0.7.1", "127.0.7.2", "127.0.7.3")
PEER_IPS = tuple(f"127.0.7.{11 + i}" for i in range(8))
GROUPS = 16
LEASE_TTL_MS = 3000
TAKEOVER_SLACK_S = 2.0  # scheduling and polling on a loaded 2-core machine
SETTLE_S = 30  # groups shared out, messages delivered: conditions waited on, at most this


class HoldingReceiver(FakeReceivingPeer):
    """A FakeReceivingPeer that, once `hold_next` is set, records the next transaction and
    leaves it unanswered until `released` is set (its sender may die meanwhile)."""

    def __init__(self, ca, ip):
        self.hold_next = False
        self.held_txn = None
        self.released = threading.Event()
        super().__init__(ca, ip)

    def do_put(self, handler):
        with self.lock:
            hold = self.hold_next and handler.path.startswith(self.SEND)
            self.hold_next = self.hold_next and not hold
        if not hold:
            super().do_put(handler)
            return
        length = int(handler.headers.get("Content-Length") or 0)
        body = json.loads(handler.rfile.read(length) or b"{}")
        txn_id = handler.path[len(self.SEND):]
        with self.lock:
            self.transactions.append((txn_id, "cluster.test", body))
            self.held_txn = txn_id
        self.released.wait(60)
        try:
            self.reply(handler, 200, {"pdus": {}})
        except OSError:
            pass  # its sender is gone


class FederationSendersTest(FederationTestCase):
    def start_cluster(self, n, start=None):
        """Peers, and n processes of cluster.test on one database (the first `start` of
        them started; all by default)."""
        self.peers = [HoldingReceiver(self.ca, ip) for ip in PEER_IPS]
        for p in self.peers:
            self.addCleanup(p.close)
        self.db = harness.create_database()
        self.addCleanup(harness.drop_database, self.db)
        shared = tempfile.mkdtemp(prefix="atrium-senders-key-")
        self.addCleanup(shutil.rmtree, shared, True)
        extra = {"federation": {"signing_key_path": os.path.join(shared, "cluster.signing.key"),
                                "sender_groups": GROUPS},
                 "server": {"lease_ttl_ms": LEASE_TTL_MS}}
        self.procs = [self.start_fed(ip, extra=extra, name="cluster.test", database=self.db,
                                     start=False) for ip in PROC_IPS[:n]]
        for p in self.procs[:start if start is not None else n]:
            p.start()

    def join_peers(self, via):
        """A room of alice's (on via) with a user of every peer joined (a fixture row, as if
        a federated join had landed)."""
        self.account = register(via, "alice")
        alice = Client(via, self.account)
        room = alice.create_room(name="senders")
        values = ", ".join(f"('{room}', 'm.room.member', '@bob:{p.server_name}', '$fixture{i}',"
                           " 'join')" for i, p in enumerate(self.peers))
        harness.psql("INSERT INTO current_state (room_id, type, state_key, event_id, membership)"
                     f" VALUES {values}", database=self.db)
        return alice, room

    def held(self, running):
        return [p.metric("atrium_federation_outbound_groups_held") for p in running]

    def wait_shared_out(self, running):
        """Every group held, each process at most its share and at least one less."""
        share = -(-GROUPS // len(running))

        def shared_out():
            held = self.held(running)
            return sum(held) == GROUPS and all(share - 2 <= h <= share for h in held) and held
        return wait_until(shared_out, timeout=SETTLE_S, interval=0.1,
                          what=f"{GROUPS} groups shared out over {len(running)} processes")

    def holder_of(self, running, destination):
        lease = f"core.federation.outbound.{sender_group(destination, GROUPS)}"
        holders = [p for p in running if p.metric("atrium_lease_held", {"lease": lease}) == 1]
        self.assertEqual(len(holders), 1, f"{lease} held by one process")
        return holders[0]

    def wait_delivered(self, bodies):
        """Every peer received exactly `bodies`, in order (a transaction ID's first
        delivery counted: a receiver ignores a replay), and no event twice."""
        def bodies_at(peer):
            return [p["content"]["body"] for p in peer.delivered_pdus()
                    if p.get("type") == "m.room.message"]

        def all_there():
            return all(len(bodies_at(p)) >= len(bodies) for p in self.peers)
        wait_until(all_there, timeout=SETTLE_S, interval=0.05, what="every message at every peer")
        for peer in self.peers:
            self.assertEqual(bodies_at(peer), bodies, f"what {peer.server_name} received")
            self.assertEqual({o for _, o, _ in peer.transactions}, {"cluster.test"})

    def sent(self, proc):
        return proc.metric("atrium_federation_outbound_transactions_total",
                           {"outcome": "sent"}) or 0

    def test_groups_are_shared_out_over_live_processes_and_each_destination_gets_every_pdu_once(self):
        self.start_cluster(3, start=2)
        first_two = self.procs[:2]
        self.assertEqual(self.wait_shared_out(first_two), [8, 8])
        for p in first_two:
            self.assertEqual(p.metric("atrium_federation_outbound_senders"), 2)
        alice, room = self.join_peers(self.procs[0])
        bodies = [f"two processes {i}" for i in range(6)]
        for b in bodies:
            alice.send(room, {"msgtype": "m.text", "body": b})
        self.wait_delivered(bodies)

        # A third process starts: the two give up what is over their share, it takes it.
        self.procs[2].start()
        held = self.wait_shared_out(self.procs)
        self.assertTrue(all(h <= 6 for h in held), held)
        self.assertRegex(self.procs[0].log_text() + self.procs[1].log_text(),
                         r"lease core\.federation\.outbound\.\d+ given up for another process")
        before = [self.sent(p) for p in self.procs]
        more = [f"three processes {i}" for i in range(6)]
        for i, b in enumerate(more):  # through each process in turn
            Client(self.procs[i % 3], self.account).send(room, {"msgtype": "m.text", "body": b})
        self.wait_delivered(bodies + more)
        # Each destination was sent to by its group's holder only.
        holders = {id(self.holder_of(self.procs, p.server_name)) for p in self.peers}
        senders = {id(p) for p, b in zip(self.procs, before) if self.sent(p) > b}
        self.assertEqual(senders, holders, "the processes that sent are the groups' holders")

    def test_a_sender_killed_mid_transaction_is_taken_over_and_its_transaction_resent_under_its_id(self):
        self.start_cluster(3)
        self.wait_shared_out(self.procs)
        held_peer = self.peers[0]
        victim = self.holder_of(self.procs, held_peer.server_name)
        survivors = [p for p in self.procs if p is not victim]
        alice, room = self.join_peers(survivors[0])
        bodies = [f"before {i}" for i in range(4)]
        for b in bodies:
            alice.send(room, {"msgtype": "m.text", "body": b})
        self.wait_delivered(bodies)

        # The victim's next transaction to held_peer stays unanswered; then it dies.
        held_peer.hold_next = True
        alice.send(room, {"msgtype": "m.text", "body": "in flight"})
        wait_until(lambda: held_peer.held_txn, timeout=SETTLE_S, interval=0.02,
                   what="a transaction held at the peer")
        held_txn = held_peer.held_txn
        killed_at = time.monotonic()
        victim.kill()
        held_peer.released.set()
        after = [f"after {i}" for i in range(4)]
        for b in after:
            alice.send(room, {"msgtype": "m.text", "body": b})

        # The victim's groups are taken by the survivors within the lease's ttl.
        wait_until(lambda: sum(self.held(survivors)) == GROUPS,
                   timeout=LEASE_TTL_MS / 1000 + 10, interval=0.05,
                   what="every group held by a survivor")
        took = time.monotonic() - killed_at
        self.assertLessEqual(took, LEASE_TTL_MS / 1000 + TAKEOVER_SLACK_S,
                             f"taken over {took:.2f} s after the kill")
        # Taking every free group it wants in one round, a survivor may hold more than its
        # share for a moment; it gives the extra back.
        self.wait_shared_out(survivors)
        self.wait_delivered(bodies + ["in flight"] + after)
        # The held transaction was sent again by a survivor under the same ID and with the
        # same PDUs (a receiver that had processed it answers from its record).
        copies = [body for txn, _, body in held_peer.transactions if txn == held_txn]
        self.assertGreaterEqual(len(copies), 2, "the held transaction was sent again")
        self.assertTrue(all(c["pdus"] == copies[0]["pdus"] for c in copies))
        self.assertIn("in flight", [p["content"].get("body") for p in copies[0]["pdus"]])


if __name__ == "__main__":
    unittest.main()
