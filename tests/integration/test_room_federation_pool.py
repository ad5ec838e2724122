"""A server with two database connections (database.pool_size: 2) and peers that never
answer: whatever waits on another server (a join's send_join, an invite, the signing key
of a received event) pins none of the connections, so the server's other requests
(/joined_rooms, /sync) are served at once meanwhile, not after the pool's checkout wait
(database.checkout_timeout_ms, 2 s) as a 503. Two of each wait at once: as many as the
rooms' remote pool and the inbound transaction pool have threads, and as the pool has
connections. (Backfills waiting on a hung server: test_room_federation_partition.py,
BackfillPoolTest.)

The peers are federation_support's: HoldingPeer helps with make_join and then holds every
PUT unanswered until the test releases it; HungServer takes connections and never answers.
"""

import threading
import time

from accounts import quote, register
from federation_support import HoldingPeer, HungServer, SigningKey, sign_json
from rooms_client import Client, redact
from harness import psql
from test_federation import A_IP, FAKE_IP, HUNG_IP, FederationTestCase
from test_room_federation import FED, PeerView, complete_event

PROMPT_S = 1.0      # an answer "at once": well under the pool's 2 s checkout wait
MEANWHILE_S = 3.0   # how long the server is watched while the waits go on


class PoolOfTwoTest(FederationTestCase):
    def setUp(self):
        self.a = self.start_fed(A_IP, extra={"database": {"pool_size": 2}})
        self.alice = Client(self.a, register(self.a, "alice"))

    def in_background(self, calls):
        """Start each call on its own thread; (threads, answers: filled as they end)."""
        answers = []
        threads = [threading.Thread(target=lambda c=c: answers.append(c())) for c in calls]
        for t in threads:
            t.start()
        return threads, answers

    def wait_until(self, what, predicate, timeout=15):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.05)
        self.fail(f"timed out waiting for {what}")

    def assert_served_meanwhile(self):
        """For MEANWHILE_S, /joined_rooms and an initial /sync answer 200 at once, each
        time."""
        asks = {"joined_rooms": "/_matrix/client/v3/joined_rooms",
                "sync": "/_matrix/client/v3/sync?timeout=0"}
        deadline = time.monotonic() + MEANWHILE_S
        while time.monotonic() < deadline:
            for what, path in asks.items():
                started = time.monotonic()
                status, body = self.alice.call("GET", path)
                self.assertEqual(status, 200, (what, body))
                self.assertLess(time.monotonic() - started, PROMPT_S, what)

    def holding_peer(self):
        peer = HoldingPeer(self.ca, FAKE_IP)
        self.addCleanup(peer.close)
        return peer

    def test_joins_waiting_on_a_resident_that_never_answers_send_join_pin_no_connection(self):
        peer = self.holding_peer()
        rooms = [f"!held{i}:{peer.server_name}" for i in range(2)]
        threads, answers = self.in_background([
            lambda room=room: self.alice.call(
                "POST", f"/_matrix/client/v3/join/{quote(room)}?server_name={quote(peer.server_name)}",
                {}, timeout=60)
            for room in rooms])
        self.wait_until("both send_joins at the peer", lambda: peer.held == 2)
        self.assert_served_meanwhile()
        self.assertEqual(answers, [])  # both joins were still waiting for the peer
        peer.release()
        for t in threads:
            t.join(60)
        self.assertEqual([status for status, _ in answers], [403, 403], answers)
        self.assertEqual(self.alice.ok("GET", "/_matrix/client/v3/joined_rooms")["joined_rooms"], [])

    def test_invites_waiting_on_the_invitees_server_that_never_answers_pin_no_connection(self):
        peer = self.holding_peer()
        rooms = [self.alice.create_room(preset="private_chat") for _ in range(2)]
        invitee = f"@zoe:{peer.server_name}"
        threads, answers = self.in_background([
            lambda room=room: self.alice.call(
                "POST", f"/_matrix/client/v3/rooms/{quote(room)}/invite", {"user_id": invitee},
                timeout=60)
            for room in rooms])
        self.wait_until("both invites at the peer", lambda: peer.held == 2)
        self.assert_served_meanwhile()
        self.assertEqual(answers, [])
        peer.release()
        for t in threads:
            t.join(60)
        self.assertEqual([status for status, _ in answers], [403, 403], answers)
        for room in rooms:  # the refused invite is not in the room
            status, _ = self.alice.call("GET", f"/_matrix/client/v3/rooms/{quote(room)}/state/"
                                               f"m.room.member/{quote(invitee)}")
            self.assertEqual(status, 404)

    def test_pdus_waiting_for_the_key_of_a_server_that_never_answers_pin_no_connection(self):
        peer = self.fake_peer()
        hung = HungServer(HUNG_IP)
        self.addCleanup(hung.close)
        view = PeerView(self.a, peer)
        pat = f"@pat:{peer.server_name}"
        room = self.alice.create_room(preset="public_chat")
        _, made = view.get(f"{FED}/v1/make_join/{quote(room)}/{quote(pat)}?ver=10")
        join, join_id = complete_event(made["event"], peer.server_name, peer.key)
        status, _ = view.send("PUT", f"{FED}/v2/send_join/{quote(room)}/{quote(join_id)}", join)
        self.assertEqual(status, 200)

        def q(sql):
            return psql(sql, database=self.a.database)
        [(create,)] = q(f"SELECT event_id FROM current_state WHERE room_id = '{room}'"
                        " AND type = 'm.room.create'")
        [(pl,)] = q(f"SELECT event_id FROM current_state WHERE room_id = '{room}'"
                    " AND type = 'm.room.power_levels'")
        # Sent by pat's server, by a user of the hung server and signed by both: checking
        # it needs the hung server's key, which A asks for and never gets.
        hung_key = SigningKey("h1")
        pdus = []
        for i in range(2):
            ev, event_id = complete_event({"type": "m.room.message", "room_id": room,
                                           "sender": f"@mute:{hung.server_name}",
                                           "content": {"msgtype": "m.text", "body": f"m{i}"},
                                           "auth_events": [create, pl], "prev_events": [join_id],
                                           "depth": 100}, peer.server_name, peer.key)
            theirs = sign_json(redact(ev, "10"), hung.server_name, hung_key)["signatures"]
            ev["signatures"][hung.server_name] = theirs[hung.server_name]
            pdus.append((ev, event_id))

        def send(i):
            ev, _ = pdus[i]
            body = {"origin": peer.server_name, "origin_server_ts": int(time.time() * 1000),
                    "pdus": [ev]}
            return self.a.signed_request("PUT", f"{FED}/v1/send/hung{i}", peer.server_name,
                                         peer.key, body, timeout=60)
        threads, answers = self.in_background([lambda i=i: send(i) for i in range(2)])
        self.wait_until("A asking the hung server for its key", lambda: hung.accepted)
        time.sleep(0.5)  # the second transaction joins the same wait
        self.assert_served_meanwhile()
        self.assertEqual(answers, [])  # both transactions were still waiting for the key
        for t in threads:
            t.join(60)
        self.assertEqual(len(answers), 2)
        for status, _, body in answers:
            self.assertEqual(status, 200, body)
            [(event_id, result)] = body["pdus"].items()
            self.assertIn("error", result)  # not signed by a key A could have
            self.assertIn(event_id, [i for _, i in pdus])
            self.assertEqual(q(f"SELECT count(*) FROM events WHERE event_id = '{event_id}'"), [["0"]])
