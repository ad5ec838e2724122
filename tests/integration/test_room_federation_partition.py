"""Two Atrium processes sharing a room across a partition: one of them stopped while the
other's users talk (catch-up when it returns), the sender itself restarted with its
outbound queue not empty (nothing lost, nothing twice), history older than a join read
from the other server (backfill), and both sides changing the room's state while cut off
from each other (a fork both resolve the same way once healed).

Everything is observed through the client API of each server (/messages, /sync, /state):
what a user on either side would see.
"""

import json
import os
import signal
import threading
import time

from accounts import quote, register
from harness import psql
from rooms_client import Client
from test_room_federation import A_IP, B_IP, TwoServersCase


class PartitionCase(TwoServersCase):
    def all_bodies(self, client, room, page=50):
        """Every m.room.message body of the room, oldest first, paging /messages back to
        its start (as a client scrolling up does)."""
        bodies, since = [], ""
        for _ in range(100):
            body = client.ok("GET", f"/_matrix/client/v3/rooms/{quote(room)}/messages"
                                    f"?dir=b&limit={page}{since}", timeout=60)
            bodies += [e["content"].get("body") for e in body["chunk"]
                       if e["type"] == "m.room.message"]
            if not body["chunk"] or "end" not in body:
                break
            since = f"&from={quote(body['end'])}"
        return list(reversed(bodies))

    def current_state(self, client, room):
        """The room's current state as the client API gives it: (type, state_key) ->
        (event_id, content)."""
        events = client.ok("GET", f"/_matrix/client/v3/rooms/{quote(room)}/state")
        return {(e["type"], e["state_key"]): (e["event_id"], e["content"]) for e in events}

    def wait_same_state(self, room, timeout=30):
        self.wait_until("the same current state on both servers",
                        lambda: self.current_state(self.alice, room) ==
                        self.current_state(self.bob, room), timeout)

    def failed_sends(self, srv):
        return srv.metric("atrium_federation_outbound_transactions_total",
                          {"outcome": "failed"}) or 0


class CatchUpTest(PartitionCase):
    def test_a_server_stopped_while_100_events_are_sent_gets_them_all_after_its_restart(self):
        room = self.public_room_with_bob()
        self.wait_until("bob's join at A", lambda: self.membership(
            self.alice, room, self.bob.user_id) == "join")
        self.b.stop()
        said = [f"m{i}" for i in range(1, 101)]
        for body in said:
            self.alice.send(room, {"msgtype": "m.text", "body": body})
        self.alice.put_state(room, "m.room.topic", {"topic": "while B was away"})
        self.wait_until("a failed attempt to reach B", lambda: self.failed_sends(self.a) >= 1)
        self.b.start()
        # A sends the newest event when B is back; B fetches what lies before it.
        self.wait_until("the topic at B", lambda: self.bob.call(
            "GET", f"/_matrix/client/v3/rooms/{quote(room)}/state/m.room.topic")
            == (200, {"topic": "while B was away"}), timeout=60)
        self.assertEqual(self.all_bodies(self.bob, room), said)
        self.assertEqual(self.all_bodies(self.alice, room), said)
        self.wait_same_state(room)
        # Bob's next message reaches A after all of them.
        self.bob.send(room, {"msgtype": "m.text", "body": "back"})
        self.wait_until("bob's message at A", lambda: self.bodies(self.alice, room)[-1:] == ["back"])

    def test_a_sender_restarted_with_its_queue_not_empty_loses_nothing(self):
        room = self.public_room_with_bob()
        self.wait_until("bob's join at A", lambda: self.membership(
            self.alice, room, self.bob.user_id) == "join")
        self.b.stop()
        said = [f"q{i}" for i in range(1, 6)]
        for body in said[:3]:
            self.alice.send(room, {"msgtype": "m.text", "body": body})
        self.wait_until("a failed attempt to reach B", lambda: self.failed_sends(self.a) >= 1)
        self.assertEqual(self.a.stop(), 0)
        self.a.start()
        for body in said[3:]:
            self.alice.send(room, {"msgtype": "m.text", "body": body})
        self.b.start()
        self.wait_until("every message at B", lambda: self.bodies(self.bob, room)[-1:] == ["q5"],
                        timeout=60)
        self.assertEqual(self.all_bodies(self.bob, room), said)  # in order, each once
        self.wait_same_state(room)


class BackfillRooms:
    """Alice on A joins a room of B's that already has a history: A has only the state and
    the join, and /messages backwards reads the rest from B (/backfill)."""

    def bobs_room(self, n, **extra):
        room = self.bob.create_room(preset="public_chat", **extra)
        said = [f"h{i}" for i in range(1, n + 1)]
        for body in said:
            self.bob.send(room, {"msgtype": "m.text", "body": body})
        return room, said

    def alice_joins(self, room):
        status, body = self.alice.call("POST", f"/_matrix/client/v3/join/{quote(room)}"
                                       f"?server_name={quote(self.b.server_name)}", {}, timeout=30)
        self.assertEqual((status, body), (200, {"room_id": room}))


class BackfillTest(BackfillRooms, PartitionCase):
    """BackfillRooms's tests that stop no server share one A and one B; counters are read as
    deltas from the test's start."""

    def setUp(self):
        self.start_shared_pair()

    def backfilled(self, outcome):
        return self.a.metric("atrium_rooms_backfilled_events_total", {"outcome": outcome}) or 0

    def test_paging_back_past_the_join_reads_the_rooms_history_from_the_other_server(self):
        refused_before, stored_before = self.backfilled("refused"), self.backfilled("stored")
        room, said = self.bobs_room(200)
        # One event B serves is altered after B signed it: A refuses it (its signature no
        # longer verifies) and never shows it.
        [(pdu_text,)] = psql(f"SELECT pdu FROM events WHERE room_id = '{room}'"
                             " AND pdu LIKE '%\"body\":\"h100\"%'", database=self.b.database)
        tampered = json.loads(pdu_text)
        tampered["origin_server_ts"] += 1
        psql(f"UPDATE events SET pdu = $${json.dumps(tampered, separators=(',', ':'), sort_keys=True)}$$"
             f" WHERE room_id = '{room}' AND pdu LIKE '%\"body\":\"h100\"%'", database=self.b.database)
        self.alice_joins(room)
        before = self.b.metric("atrium_federation_inbound_verified_total") or 0
        expected = [b for b in said if b != "h100"]
        self.assertEqual(self.all_bodies(self.alice, room), expected)
        self.assertGreater(self.b.metric("atrium_federation_inbound_verified_total"), before)
        self.a.wait_for_log(r"backfilled \S+ from \S+ refused")
        refused = self.backfilled("refused")
        self.assertGreaterEqual(refused - refused_before, 1)
        self.assertGreaterEqual(self.backfilled("stored") - stored_before, 199)
        # Read once, kept: paging again shows the same, and the event that did not pass is
        # not asked for again for a while (a dead end).
        self.assertEqual(self.all_bodies(self.alice, room), expected)
        self.assertEqual(self.backfilled("refused"), refused)
        self.assertEqual(psql(f"SELECT count(*) FROM events WHERE room_id = '{room}'"
                              " AND pdu LIKE '%\"body\":\"h1\"%' AND stream_pos <= 0",
                              database=self.a.database), [["1"]])
        # Nothing of it is news: alice's sync after the join shows none of it.
        sync = self.alice.sync()
        timeline = sync["rooms"]["join"][room]["timeline"]["events"]
        self.assertNotIn("h1", [e["content"].get("body") for e in timeline])

    def test_two_pages_back_at_once_both_read_the_history_and_store_each_event_once(self):
        # Both requests find the history missing and read the same events from B at the
        # same time; each round is a fresh room, so both backfill.
        for _ in range(3):
            room, said = self.bobs_room(60)
            self.alice_joins(room)
            pages = [None, None]

            def page_back(i):
                pages[i] = self.alice.call("GET", f"/_matrix/client/v3/rooms/{quote(room)}"
                                           "/messages?dir=b&limit=50", timeout=60)
            both = [threading.Thread(target=page_back, args=(i,)) for i in range(2)]
            for t in both:
                t.start()
            for t in both:
                t.join(60)
            self.assertEqual([page[0] for page in pages], [200, 200], pages)
            ids = [[e["event_id"] for e in page[1]["chunk"]] for page in pages]
            self.assertEqual(len(ids[0]), 50)
            self.assertEqual(ids[0], ids[1])
            self.assertEqual(self.all_bodies(self.alice, room), said)
            self.assertEqual(psql(f"SELECT count(*) FROM events WHERE room_id = '{room}'"
                                  " AND type = 'm.room.message'", database=self.a.database),
                             [[str(len(said))]])

    def test_history_the_user_may_not_see_is_neither_read_nor_shown(self):
        room, _ = self.bobs_room(5, initial_state=[{
            "type": "m.room.history_visibility", "state_key": "",
            "content": {"history_visibility": "joined"}}])
        self.alice_joins(room)
        self.assertEqual(self.all_bodies(self.alice, room), [])
        self.assertNotIn(f"backfill of {room}", self.a.log_text())
        self.bob.send(room, {"msgtype": "m.text", "body": "after alice"})
        self.wait_until("bob's message at A", lambda: self.all_bodies(self.alice, room) == ["after alice"])


class BackfillOutageTest(BackfillRooms, PartitionCase):
    """Backfill with B down: a pair of its own (the test stops B)."""

    def test_with_the_other_server_down_paging_back_answers_with_what_is_here(self):
        room, said = self.bobs_room(5)
        self.alice_joins(room)
        self.b.stop()
        started = time.monotonic()
        self.assertEqual(self.all_bodies(self.alice, room), [])
        self.assertLess(time.monotonic() - started, 30)
        self.assertEqual(self.a.request("GET", "/health")[0], 200)
        self.b.start()
        self.wait_until("the history once B is back",
                        lambda: self.all_bodies(self.alice, room) == said, timeout=60)


class BackfillPoolTest(PartitionCase):
    """A with two database connections: backfills waiting on a hung B pin none of them."""

    def setUp(self):
        self.a = self.start_fed(A_IP, extra={"database": {"pool_size": 2}})
        self.b = self.start_fed(B_IP)
        self.alice = Client(self.a, register(self.a, "alice"))
        self.bob = Client(self.b, register(self.b, "bob"))

    def test_backfills_waiting_on_a_hung_server_leave_the_database_to_other_requests(self):
        rooms = [BackfillRooms.bobs_room(self, 5)[0] for _ in range(2)]
        for room in rooms:
            BackfillRooms.alice_joins(self, room)
        here = self.alice.create_room(preset="private_chat")
        self.alice.send(here, {"msgtype": "m.text", "body": "here"})
        os.kill(self.b.proc.pid, signal.SIGSTOP)  # B takes connections, never answers
        self.addCleanup(lambda: self.b.running() and os.kill(self.b.proc.pid, signal.SIGCONT))
        pages = []

        def page_back(room):
            pages.append(self.alice.call("GET", f"/_matrix/client/v3/rooms/{quote(room)}"
                                         "/messages?dir=b&limit=50", timeout=60))
        # As many backfills as the rooms' remote pool has threads, and connections.
        waiting = [threading.Thread(target=page_back, args=(room,)) for room in rooms]
        for t in waiting:
            t.start()
        time.sleep(1)  # both on the remote pool, waiting for B
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            self.assertEqual(self.bodies(self.alice, here), ["here"])
            self.assertEqual(self.alice.call("GET", "/_matrix/client/v3/joined_rooms")[0], 200)
        self.assertEqual(pages, [])  # they were still waiting for B meanwhile
        os.kill(self.b.proc.pid, signal.SIGCONT)
        for t in waiting:
            t.join(60)
        self.assertEqual([status for status, _ in pages], [200, 200], pages)


class ForkTest(PartitionCase):
    """While the servers cannot reach each other, each lets its user change the room's
    state; healed, both resolve the fork the same way. "Cut off" is one server down while
    the other's user acts, then the other way round (first says which side acts first)."""

    def new_user(self, srv, name):
        """A client of a new account on srv (a subclass may put another server there)."""
        return Client(srv, register(srv, name))

    def room_with_bob_at_50(self):
        room = self.public_room_with_bob()
        self.carol = self.new_user(self.a, "carol")
        self.carol.join(room)
        pl = self.alice.state(room, "m.room.power_levels")
        pl["users"][self.bob.user_id] = 50
        self.alice.put_state(room, "m.room.power_levels", pl)
        self.wait_until("bob's power and carol at B", lambda: self.bob.state(
            room, "m.room.power_levels")["users"].get(self.bob.user_id) == 50 and
            self.membership(self.bob, room, self.carol.user_id) == "join")
        return room, pl

    def partition(self, first, on_a, on_b):
        sides = [("A", self.b, on_a), ("B", self.a, on_b)]
        if first == "B":
            sides.reverse()
        (_, down1, act1), (_, down2, act2) = sides
        down1.stop()
        act1()
        down2.stop()
        down1.start()
        act2()
        down2.start()

    def demote_bob(self, room, pl):
        pl = dict(pl, users=dict(pl["users"], **{self.bob.user_id: 0}))
        self.alice.put_state(room, "m.room.power_levels", pl)

    def assert_resolved(self, room, **expect):
        self.wait_same_state(room, timeout=60)
        for client in (self.alice, self.bob):
            state = self.current_state(client, room)
            self.assertEqual(state[("m.room.power_levels", "")][1]["users"].get(self.bob.user_id), 0)
            for event_type, content in expect.items():
                self.assertEqual(state[(event_type, "")][1], content, (client.user_id, event_type))

    def test_state_changed_on_both_sides_of_a_partition_resolves_the_same_on_both(self):
        room, pl = self.room_with_bob_at_50()
        # A takes bob's power away and sets a topic; B lets bob (still at 50 there) set a
        # topic and a name. The power levels change is applied first; bob's changes, made
        # with power he no longer has in the resolved state, do not hold.
        def on_a():
            self.demote_bob(room, pl)
            self.alice.put_state(room, "m.room.topic", {"topic": "from A"})

        def on_b():
            self.bob.put_state(room, "m.room.topic", {"topic": "from B"})
            self.bob.put_state(room, "m.room.name", {"name": "named at B"})
        self.partition("A", on_a, on_b)
        self.assert_resolved(room, **{"m.room.topic": {"topic": "from A"},
                                      "m.room.name": {"name": "Talk"}})

    def ban_against_demotion(self, first):
        room, pl = self.room_with_bob_at_50()
        def on_b():  # bob, still at 50 at B, bans carol there
            self.assertEqual(self.bob.member_action(room, "ban", self.carol.user_id)[0], 200)
            self.assertEqual(self.membership(self.bob, room, self.carol.user_id), "ban")
        self.partition(first, lambda: self.demote_bob(room, pl), on_b)
        self.assert_resolved(room)
        for client in (self.alice, self.bob):
            self.assertEqual(self.membership(client, room, self.carol.user_id), "join")

    def test_a_ban_against_a_demotion_of_its_sender_loses_when_the_ban_comes_first(self):
        self.ban_against_demotion("B")

    def test_a_ban_against_a_demotion_of_its_sender_loses_when_the_demotion_comes_first(self):
        self.ban_against_demotion("A")

if __name__ == "__main__":
    import unittest
    unittest.main()
