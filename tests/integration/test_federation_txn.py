"""Federation transactions both ways: PUT /_matrix/federation/v1/send/{txnId} as Atrium
receives it (the spec's size limits, the body's origin against the signer, a replay
answered from the record without being processed again, an unsigned request refused) and
the persisted outbound queue as Atrium sends it to a fake receiving peer (events delivered
in order; a destination that was down, with an Atrium restart in between, gets every
queued event once; a long backlog collapsed to the newest event when the peer returns).

Until the room model serves joins over federation, a room shared with the peer is made
with a test fixture: a join of a remote user written straight into current_state (the
outbound queue reads the room's servers from there).
"""

import json
import subprocess
import time
import uuid

import harness
from accounts import register
from common import Background
from federation_support import FakeReceivingPeer, xmatrix
from rooms_client import Client
from test_federation import A_IP, FAKE_IP, FederationTestCase

SEND = "/_matrix/federation/v1/send/"
INBOUND = {"pool": "core.federation_inbound"}
INBOUND_THREADS, INBOUND_QUEUE = 2, 64  # core/federation/transport/fed_inbound.c


def wait_until(predicate, timeout=30, what="the condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


class InboundTransactionTest(FederationTestCase):
    """One A for the class (a start costs about a CPU-second); a fake peer per test, whose
    name (a port of its own) makes its transaction IDs and event IDs its own. Counters are
    read as what they gained since the test began."""

    def setUp(self):
        self.peer = self.fake_peer()
        self.a = self.start_class_fed(A_IP)
        self.counted_before = {"pdus": self.a.metric("atrium_federation_inbound_pdus_total") or 0}

    def counted(self, name, labels=None):
        """What the counter gained since the test's first read of it (setUp's, for PDUs)."""
        key = (name, tuple(sorted((labels or {}).items())))
        value = self.a.metric(name, labels) or 0
        return value - self.counted_before.setdefault(key, value)

    def send(self, txn_id, pdus=(), edus=(), origin=None, signer=None, timeout=15):
        body = {"origin": origin or self.peer.server_name, "origin_server_ts": 1,
                "pdus": list(pdus), "edus": list(edus)}
        uri = SEND + txn_id
        auth = xmatrix("PUT", uri, signer or self.peer.server_name, self.a.server_name,
                       self.peer.key, body)
        return self.a.fed_request("PUT", uri, {"Authorization": auth}, body, timeout=timeout)

    def pdu(self, n):
        return {"event_id": f"$test{n}:{self.peer.server_name}", "room_id": "!nowhere:x",
                "type": "m.room.message", "sender": f"@p:{self.peer.server_name}",
                "content": {"body": str(n)}, "origin_server_ts": 1, "depth": n}

    def pdus_counted(self):
        """Inbound PDUs counted since setUp."""
        value = self.a.metric("atrium_federation_inbound_pdus_total") or 0
        return value - self.counted_before.get("pdus", value)

    def test_more_than_50_pdus_or_100_edus_is_refused_with_400(self):
        refused = {"outcome": "refused"}
        self.counted("atrium_federation_inbound_transactions_total", refused)
        status, _, body = self.send("big-pdus", pdus=[self.pdu(i) for i in range(51)])
        self.assertEqual((status, body["errcode"]), (400, "M_BAD_JSON"), body)
        edu = {"edu_type": "m.test.unknown", "content": {}}
        status, _, body = self.send("big-edus", edus=[edu] * 101)
        self.assertEqual((status, body["errcode"]), (400, "M_BAD_JSON"), body)
        self.assertEqual(self.pdus_counted(), 0)  # nothing of either was processed
        # Exactly at the limits, the transaction is taken.
        status, _, body = self.send("at-limits", pdus=[self.pdu(i) for i in range(50)],
                                    edus=[edu] * 100)
        self.assertEqual(status, 200, body)
        self.assertEqual(len(body["pdus"]), 50)
        self.assertEqual(self.counted("atrium_federation_inbound_transactions_total", refused), 2)

    def test_an_origin_in_the_body_other_than_the_signer_is_refused(self):
        status, _, body = self.send("spoof", pdus=[self.pdu(1)], origin="elsewhere.example")
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"), body)
        self.assertEqual(self.pdus_counted(), 0)

    def test_a_replay_gets_the_stored_answer_and_is_processed_once(self):
        replayed, ignored = {"outcome": "replayed"}, {"outcome": "ignored"}
        self.counted("atrium_federation_inbound_transactions_total", replayed)
        self.counted("atrium_federation_inbound_edus_total", ignored)
        pdus = [self.pdu(1), self.pdu(2)]
        edus = [{"edu_type": "m.test.unknown", "content": {"x": 1}}]
        status, _, first = self.send("once", pdus=pdus, edus=edus)
        self.assertEqual(status, 200, first)
        self.assertEqual(set(first["pdus"]), {p["event_id"] for p in pdus})
        self.assertEqual(self.pdus_counted(), 2)
        status, _, again = self.send("once", pdus=pdus, edus=edus)
        self.assertEqual((status, again), (200, first))
        self.assertEqual(self.pdus_counted(), 2)  # not handed to the room model again
        self.assertEqual(self.counted("atrium_federation_inbound_transactions_total", replayed), 1)
        self.assertEqual(self.counted("atrium_federation_inbound_edus_total", ignored),
                         1)  # an unknown type
        # Another transaction ID with the same PDUs is a new transaction.
        status, _, other = self.send("twice", pdus=pdus)
        self.assertEqual(status, 200, other)
        self.assertEqual(self.pdus_counted(), 4)

    def test_the_inbound_pool_held_full_refuses_the_next_transaction_at_once_with_429(self):
        """Two transactions stuck on the database (their record table locked by another
        session) and INBOUND_QUEUE waiting: the next is answered 429 M_LIMIT_EXCEEDED at
        once, the metrics show the pool full, the listener still serves; once the lock goes,
        every waiting transaction is processed."""
        status, _, body = self.send("warm-up", pdus=[self.pdu(0)])  # the peer's key cached
        self.assertEqual(status, 200, body)
        holder = subprocess.Popen(
            [harness.psql_bin(), "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1",
             "-d", harness.conninfo_for(self.a.database)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        waiting = []
        try:
            holder.stdin.write("BEGIN;\nLOCK TABLE federation_inbound_txns IN ACCESS EXCLUSIVE "
                               "MODE;\nSELECT 'locked';\n")
            holder.stdin.flush()
            self.assertEqual(holder.stdout.readline().strip(), "locked")
            held = INBOUND_THREADS + INBOUND_QUEUE
            waiting = [Background(self.send, f"held-{i}", [self.pdu(i + 1)], timeout=90)
                       for i in range(held)]
            wait_until(lambda: self.a.metric("atrium_pool_busy", INBOUND) == INBOUND_THREADS
                       and self.a.metric("atrium_pool_queued", INBOUND) == INBOUND_QUEUE,
                       what="the inbound pool's threads busy and its queue full")
            self.assertEqual(self.a.metric("atrium_pool_queue_limit", INBOUND), INBOUND_QUEUE)
            refused = self.a.metric("atrium_pool_refused_total", INBOUND) or 0
            started = time.monotonic()
            status, headers, body = self.send("one-too-many", [self.pdu(999)])
            self.assertLess(time.monotonic() - started, 2.0)  # at once, not after a wait
            self.assertEqual((status, body["errcode"]), (429, "M_LIMIT_EXCEEDED"), body)
            self.assertGreater(body["retry_after_ms"], 0)
            self.assertEqual(self.a.metric("atrium_pool_refused_total", INBOUND), refused + 1)
            self.assertEqual(self.a.fed_request("GET", "/_matrix/key/v2/server")[0], 200)
            self.assertTrue(all(not w.done() for w in waiting))
        finally:
            holder.communicate("ROLLBACK;\n", timeout=30)
        results = [w.result(60) for w in waiting]
        self.assertEqual([r[0] for r in results], [200] * len(waiting),
                         [r for r in results if r[0] != 200][:3])
        wait_until(lambda: self.a.metric("atrium_pool_queued", INBOUND) == 0,
                   what="the queue empty")
        # The refused one was never taken: a retry of it now is processed.
        status, _, body = self.send("one-too-many", [self.pdu(999)])
        self.assertEqual(status, 200, body)

    def test_an_unsigned_transaction_is_refused_with_401(self):
        body = {"origin": self.peer.server_name, "origin_server_ts": 1, "pdus": [self.pdu(1)]}
        status, _, answer = self.a.fed_request("PUT", SEND + "unsigned", None, body)
        self.assertEqual((status, answer["errcode"]), (401, "M_UNAUTHORIZED"), answer)
        self.assertEqual(self.pdus_counted(), 0)


class OutboundQueueTest(FederationTestCase):
    """Atrium A sends into a room it shares (by the fixture) with a fake receiving peer."""

    def setUp(self):
        self.peer = FakeReceivingPeer(self.ca, FAKE_IP)
        self.addCleanup(self.peer.close)
        self.a = self.start_fed(A_IP)
        self.alice = Client(self.a, register(self.a, "alice"))
        self.room = self.alice.create_room(name="shared")
        self.remote_join(f"@bob:{self.peer.server_name}")

    def remote_join(self, user_id):
        """Test fixture: user_id (of the peer) joined, as if a federated join had landed."""
        fake_event = "$fixture" + uuid.uuid4().hex
        harness.psql("INSERT INTO current_state (room_id, type, state_key, event_id, membership)"
                     f" VALUES ('{self.room}', 'm.room.member', '{user_id}', '{fake_event}',"
                     " 'join')", database=self.a.database)

    def say(self, *bodies):
        for body in bodies:
            self.alice.send(self.room, {"msgtype": "m.text", "body": body})

    def delivered_bodies(self):
        return [p.get("content", {}).get("body") for p in self.peer.delivered_pdus()
                if p.get("type") == "m.room.message"]

    def queued_rows(self):
        return int(harness.psql("SELECT count(*) FROM federation_outbound",
                                database=self.a.database)[0][0])

    def depth_gauge(self):
        return self.a.metric("atrium_federation_outbound_queue_depth",
                             {"destination": self.peer.server_name})

    def test_queued_events_are_delivered_in_order_in_signed_transactions(self):
        bodies = [f"m{i}" for i in range(1, 6)]
        self.say(*bodies)
        wait_until(lambda: len(self.delivered_bodies()) >= 5, what="five messages at the peer")
        self.assertEqual(self.delivered_bodies(), bodies)
        for txn_id, origin, body in self.peer.transactions:
            self.assertEqual(origin, self.a.server_name)
            self.assertEqual(body["origin"], self.a.server_name)
            self.assertLessEqual(len(body["pdus"]), 50)
            self.assertIsInstance(body["origin_server_ts"], int)
        wait_until(lambda: self.queued_rows() == 0, what="the queue to empty")
        wait_until(lambda: self.depth_gauge() == 0, what="the depth gauge back to 0")
        self.assertGreaterEqual(self.a.metric("atrium_federation_outbound_transactions_total",
                                              {"outcome": "sent"}), 1)

    def test_a_down_destination_gets_every_event_once_after_it_returns_across_a_restart(self):
        self.peer.stop()
        self.say("m1", "m2", "m3")
        wait_until(lambda: (self.a.metric("atrium_federation_outbound_transactions_total",
                                          {"outcome": "failed"}) or 0) >= 1,
                   what="a failed attempt")
        self.assertEqual(self.queued_rows(), 3)
        self.assertEqual(self.a.stop(), 0)  # a clean stop with a destination still queued
        self.a.start()
        self.say("m4", "m5")
        self.assertEqual(self.queued_rows(), 5)
        self.peer.start()
        wait_until(lambda: len(self.delivered_bodies()) >= 5, what="every message at the peer")
        wait_until(lambda: self.queued_rows() == 0, what="the queue to empty")
        self.assertEqual(self.delivered_bodies(), ["m1", "m2", "m3", "m4", "m5"])
        # No event went out under two transaction IDs (a retry reuses its transaction's ID).
        where = {}
        for txn_id, _, body in self.peer.transactions:
            for pdu in body["pdus"]:
                key = pdu["content"].get("body")
                where.setdefault(key, set()).add(txn_id)
        self.assertTrue(all(len(ids) == 1 for ids in where.values()), where)

    def test_a_long_backlog_is_collapsed_to_the_newest_event_when_the_peer_returns(self):
        self.peer.stop()
        self.say("first")
        wait_until(lambda: (self.a.metric("atrium_federation_outbound_transactions_total",
                                          {"outcome": "failed"}) or 0) >= 1,
                   what="a failed attempt")
        backlog = [f"b{i}" for i in range(1, 61)]
        self.say(*backlog)
        # EDUs queued long ago meanwhile: a typing notice (stale: not sent) and another
        # (kept: EDUs are never collapsed).
        for edu_type in ("m.typing", "m.test.keep"):
            harness.psql("INSERT INTO federation_outbound (destination, kind, edu_type, content,"
                         f" queued_ts) VALUES ('{self.peer.server_name}', 1, '{edu_type}',"
                         " '{\"old\": true}', 1)", database=self.a.database)
        wait_until(lambda: self.a.metric("atrium_federation_outbound_catchup_destinations") == 1,
                   what="the destination in catch-up")
        self.peer.start()
        wait_until(lambda: "b60" in self.delivered_bodies(), what="the newest event at the peer")
        wait_until(lambda: self.queued_rows() == 0, what="the queue to empty")
        delivered = self.delivered_bodies()
        skipped = self.a.metric("atrium_federation_outbound_catchup_skipped_pdus_total")
        self.assertGreaterEqual(skipped, 10)
        self.assertEqual(len(delivered) + skipped, 61)
        self.assertEqual(delivered[-1], "b60")
        self.assertEqual([e["edu_type"] for e in self.peer.delivered_edus()], ["m.test.keep"])
        self.assertEqual(delivered, sorted(delivered, key=lambda b: -1 if b == "first"
                                           else int(b[1:])))
        # Once the backlog is gone the destination is up to date again: no collapse.
        self.say("after")
        wait_until(lambda: "after" in self.delivered_bodies(), what="a later event")
        wait_until(lambda: self.a.metric("atrium_federation_outbound_catchup_destinations") == 0,
                   what="catch-up to end")


if __name__ == "__main__":
    import unittest
    unittest.main()
