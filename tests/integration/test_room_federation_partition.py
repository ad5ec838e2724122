"""Two Atrium processes sharing a room across a partition: one of them stopped while the
other's users talk (catch-up when it returns), the sender itself restarted with its
outbound queue not empty (nothing lost, nothing twice), history older than a join read
from the other server (backfill), and both sides changing the room's state while cut off
from each other (a fork both resolve the same way once healed).

Everything is observed through the client API of each server (/messages, /sync, /state):
what a user on either side would see.
"""

import json
import time

from accounts import quote
from harness import psql
from test_room_federation import TwoServersCase


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


class BackfillTest(PartitionCase):
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

    def test_paging_back_past_the_join_reads_the_rooms_history_from_the_other_server(self):
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
        # Read once, kept: paging again asks B for nothing new and shows the same.
        self.assertEqual(self.all_bodies(self.alice, room), expected)
        self.assertEqual(psql(f"SELECT count(*) FROM events WHERE room_id = '{room}'"
                              " AND pdu LIKE '%\"body\":\"h1\"%' AND stream_pos <= 0",
                              database=self.a.database), [["1"]])
        # Nothing of it is news: alice's sync after the join shows none of it.
        sync = self.alice.sync()
        timeline = sync["rooms"]["join"][room]["timeline"]["events"]
        self.assertNotIn("h1", [e["content"].get("body") for e in timeline])

    def test_history_the_user_may_not_see_is_neither_read_nor_shown(self):
        room, _ = self.bobs_room(5, initial_state=[{
            "type": "m.room.history_visibility", "state_key": "",
            "content": {"history_visibility": "joined"}}])
        self.alice_joins(room)
        self.assertEqual(self.all_bodies(self.alice, room), [])
        self.assertNotIn(f"backfill of {room}", self.a.log_text())
        self.bob.send(room, {"msgtype": "m.text", "body": "after alice"})
        self.wait_until("bob's message at A", lambda: self.all_bodies(self.alice, room) == ["after alice"])


class ForkTest(PartitionCase):
    def test_state_changed_on_both_sides_of_a_partition_resolves_the_same_on_both(self):
        room = self.public_room_with_bob()
        pl = self.alice.state(room, "m.room.power_levels")
        pl["users"][self.bob.user_id] = 50
        self.alice.put_state(room, "m.room.power_levels", pl)
        self.wait_until("bob's power at B", lambda: self.bob.state(
            room, "m.room.power_levels")["users"].get(self.bob.user_id) == 50)
        # Cut off: A takes bob's power away and sets a topic while B is down...
        self.b.stop()
        pl["users"][self.bob.user_id] = 0
        self.alice.put_state(room, "m.room.power_levels", pl)
        self.alice.put_state(room, "m.room.topic", {"topic": "from A"})
        # ... and B, while A is down, lets bob (still at 50 there) set a topic and a name.
        self.a.stop()
        self.b.start()
        self.bob.put_state(room, "m.room.topic", {"topic": "from B"})
        self.bob.put_state(room, "m.room.name", {"name": "named at B"})
        self.a.start()
        # Healed: each gets the other's events and resolves the fork. The power levels
        # change is applied first; bob's changes, made with power he no longer has in the
        # resolved state, do not hold. Both servers agree.
        self.wait_same_state(room, timeout=60)
        for client in (self.alice, self.bob):
            state = self.current_state(client, room)
            self.assertEqual(state[("m.room.topic", "")][1], {"topic": "from A"})
            self.assertEqual(state[("m.room.name", "")][1], {"name": "Talk"})
            self.assertEqual(state[("m.room.power_levels", "")][1]["users"].get(self.bob.user_id), 0)


if __name__ == "__main__":
    import unittest
    unittest.main()
