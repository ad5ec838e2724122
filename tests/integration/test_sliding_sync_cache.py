"""Simplified Sliding Sync's kept first results (core/client/sync/ssync_hits.c,
docs/adr/0045-sliding-sync-keeps-first-results.md): a joined room's first result is sent
again from the process's store while nothing it was made from changed, equal to a result
read afresh (but for each event's age, which is set again); and everything a result is made
from changes it: a message, a redaction, a name, the user's read receipt, the ignore list,
push rules, other required_state or timeline_limit. (A store shared by two processes is not
a thing: each keeps its own, and a write through one process is seen by the other's:
test_sliding_sync.py, SlidingSyncTwoProcessesTest.)"""

import time

from accounts import deactivate, register
from rooms_client import V3, Client, SharedServerTest, quote
from test_sliding_sync import bodies, one_list, ss, window_facts

HITS = "atrium_sliding_sync_cache_hits_total"
MISSES = "atrium_sliding_sync_cache_misses_total"
STATE = [["m.room.name", ""], ["m.room.avatar", ""], ["m.room.encryption", ""], ["m.room.member", "$LAZY"]]


def without_ages(answer):
    """The answer's rooms with each event's unsigned.age left out."""
    rooms = {}
    for room_id, room in answer["rooms"].items():
        room = dict(room)
        for part in ("timeline", "required_state"):
            if part in room:
                room[part] = [{**e, "unsigned": {k: v for k, v in e.get("unsigned", {}).items() if k != "age"}}
                              for e in room[part]]
        rooms[room_id] = room
    return rooms


class SlidingSyncCacheTest(SharedServerTest):
    USERS = ("alice", "bob", "carol", "dora", "erin")

    def counts(self):
        return (self.srv.metric(HITS) or 0, self.srv.metric(MISSES) or 0)

    def first(self, client, conn_id, body):
        """A first response on a new connection, with the hits and misses it counted."""
        before = self.counts()
        answer = ss(client, {"conn_id": conn_id, **body})
        after = self.counts()
        return answer, (after[0] - before[0], after[1] - before[1])

    def rooms_of(self, reader, n, prefix):
        """n rooms reader is joined to, each with a message from bob and one from dora."""
        rooms = []
        for i in range(n):
            room = self.bob.create_room(name=f"{prefix} {i}", invite=[reader.user_id, self.dora.user_id])
            reader.join(room)
            self.dora.join(room)
            self.bob.send(room, {"msgtype": "m.text", "body": f"bob {i}"})
            self.dora.send(room, {"msgtype": "m.text", "body": f"dora {i}"})
            rooms.append(room)
        return rooms

    def test_a_kept_result_is_the_result_read_afresh_with_its_ages_set_again(self):
        rooms = self.rooms_of(self.alice, 3, "Kept")
        body = one_list(timeline_limit=2, required_state=STATE)
        fresh, (hits, misses) = self.first(self.alice, "kept-1", body)
        self.assertEqual((hits, misses), (0, 3))
        time.sleep(0.05)
        kept, (hits, misses) = self.first(self.alice, "kept-2", body)
        self.assertEqual((hits, misses), (3, 0))
        self.assertEqual(set(kept["rooms"]), set(rooms))
        self.assertEqual(without_ages(kept), without_ages(fresh))
        self.assertEqual(kept["lists"], fresh["lists"])
        for room in rooms:
            self.assertIs(kept["rooms"][room]["initial"], True)
            self.assertEqual(kept["rooms"][room]["num_live"], 0)
            self.assertEqual(bodies(kept["rooms"][room]), bodies(fresh["rooms"][room]))
            for new, old in zip(kept["rooms"][room]["timeline"], fresh["rooms"][room]["timeline"]):
                self.assertGreaterEqual(new["unsigned"]["age"], old["unsigned"]["age"] + 50)
        # The kept connection goes on like any other: nothing new, then a message.
        self.assertEqual(ss(self.alice, {"conn_id": "kept-2", **body}, pos=kept["pos"], timeout=0)["rooms"], {})
        self.bob.send(rooms[0], {"msgtype": "m.text", "body": "after"})
        later = ss(self.alice, {"conn_id": "kept-2", **body}, pos=kept["pos"], timeout=0)
        self.assertEqual(list(later["rooms"]), [rooms[0]])
        self.assertEqual(bodies(later["rooms"][rooms[0]]), ["after"])
        self.assertNotIn("initial", later["rooms"][rooms[0]])

    def test_each_thing_a_result_is_made_of_changes_it(self):
        rooms = self.rooms_of(self.carol, 6, "Change")
        body = one_list(timeline_limit=2, required_state=STATE)
        before, (_, misses) = self.first(self.carol, "chg-0", body)
        self.assertEqual(misses, 6)
        for room in rooms:
            self.assertEqual(before["rooms"][room]["notification_count"], 2)
        self.bob.send(rooms[0], {"msgtype": "m.text", "body": "new"})
        self.bob.put_state(rooms[2], "m.room.name", {"name": "Renamed"})
        newest = self.carol.messages(rooms[3], dir="b", limit=1)["chunk"][0]["event_id"]
        self.carol.ok("POST", f"{V3}/rooms/{quote(rooms[3])}/receipt/m.read/{quote(newest)}", {})
        after, (hits, misses) = self.first(self.carol, "chg-1", body)
        self.assertEqual((hits, misses), (3, 3))  # rooms 1, 4 and 5 kept
        got = after["rooms"]
        self.assertEqual(bodies(got[rooms[0]]), ["dora 0", "new"])
        self.assertEqual(got[rooms[0]]["notification_count"], 3)
        self.assertEqual(got[rooms[2]]["name"], "Renamed")
        self.assertEqual(got[rooms[3]]["notification_count"], 0)
        # A redaction (bob's own, of his message in room 1).
        own = self.bob.messages(rooms[1], dir="b", limit=2)["chunk"]
        bobs = [e for e in own if e["sender"] == self.bob.user_id and e["type"] == "m.room.message"][0]
        self.bob.ok("PUT", f"{V3}/rooms/{quote(rooms[1])}/redact/{quote(bobs['event_id'])}/r2", {})
        redacted, (hits, misses) = self.first(self.carol, "chg-2", body)
        self.assertEqual((hits, misses), (5, 1))
        self.assertIn("m.room.redaction", [e["type"] for e in redacted["rooms"][rooms[1]]["timeline"]])
        self.assertNotEqual(without_ages(redacted)[rooms[1]], without_ages(after)[rooms[1]])
        # The ignore list (account data): every room read again, dora's messages gone.
        self.carol.ok("PUT", f"{V3}/user/{quote(self.carol.user_id)}/account_data/m.ignored_user_list",
                      {"ignored_users": {self.dora.user_id: {}}})
        ignoring, (hits, misses) = self.first(self.carol, "chg-3", body)
        self.assertEqual((hits, misses), (0, 6))
        for room in rooms:
            senders = [e["sender"] for e in ignoring["rooms"][room]["timeline"] if e["type"] == "m.room.message"]
            self.assertIn(self.bob.user_id, senders)
            self.assertNotIn(self.dora.user_id, senders)
        # Push rules: the master rule silences every room.
        self.carol.ok("PUT", f"{V3}/pushrules/global/override/.m.rule.master/enabled", {"enabled": True})
        silent, (hits, misses) = self.first(self.carol, "chg-4", body)
        self.assertEqual((hits, misses), (0, 6))
        self.assertEqual({silent["rooms"][r]["notification_count"] for r in rooms}, {0})
        # Another timeline_limit or required_state is another result.
        wider, (hits, misses) = self.first(self.carol, "chg-5", one_list(timeline_limit=3, required_state=STATE))
        self.assertEqual(hits, 0)
        self.assertEqual(len(wider["rooms"][rooms[5]]["timeline"]), 3)
        other, (hits, misses) = self.first(self.carol, "chg-6", one_list(timeline_limit=2, required_state=[["*", "*"]]))
        self.assertEqual(hits, 0)
        self.assertIn("m.room.create", {e["type"] for e in other["rooms"][rooms[5]]["required_state"]})
        again, (hits, misses) = self.first(self.carol, "chg-7", one_list(timeline_limit=2, required_state=[["*", "*"]]))
        self.assertEqual((hits, misses), (6, 0))
        self.assertEqual(window_facts(again), window_facts(other))

    def test_only_joined_rooms_new_to_the_connection_are_taken_kept(self):
        room = self.alice.create_room(name="Invited", invite=[self.erin.user_id])
        self.alice.send(room, {"msgtype": "m.text", "body": "hello"})
        body = one_list(timeline_limit=1)
        invited, (hits, misses) = self.first(self.erin, "inv-1", body)
        self.assertIn("invite_state", invited["rooms"][room])
        self.assertEqual((hits, misses), (0, 0))
        invited2, (hits, _) = self.first(self.erin, "inv-2", body)
        self.assertEqual(hits, 0)
        self.assertIn("invite_state", invited2["rooms"][room])

    def test_an_erasure_of_a_user_who_left_changes_what_a_later_reader_is_sent(self):
        room = self.alice.create_room(name="Erased", preset="public_chat")
        account = register(self.srv, "cache_erased")
        gone = Client(self.srv, account)
        gone.join(room)
        said = gone.send(room, {"msgtype": "m.text", "body": "soon erased"})
        gone.leave(room)  # so the deactivation writes nothing in the room
        reader = Client(self.srv, register(self.srv, "cache_reader"))
        reader.join(room)  # after the message: erasure hides it from this reader
        body = one_list(timeline_limit=5)
        self.first(reader, "er-1", body)
        shown, (hits, _) = self.first(reader, "er-2", body)
        self.assertEqual(hits, 1)
        event = {e["event_id"]: e for e in shown["rooms"][room]["timeline"]}[said]
        self.assertEqual(event["content"]["body"], "soon erased")
        status, answer = deactivate(self.srv, account, erase=True)
        self.assertEqual(status, 200, answer)
        erased, (hits, misses) = self.first(reader, "er-3", body)
        self.assertEqual((hits, misses), (0, 1))
        self.assertEqual({e["event_id"]: e for e in erased["rooms"][room]["timeline"]}[said]["content"], {})

    def test_a_range_moving_over_rooms_takes_those_with_nothing_after_the_position(self):
        who = Client(self.srv, register(self.srv, "cache_ranges"))
        a, b, c = [self.bob.create_room(name=f"Range {x}", invite=[who.user_id]) for x in "abc"]
        for room in (a, b, c):
            who.join(room)
            self.bob.send(room, {"msgtype": "m.text", "body": "before"})
        wide = one_list(ranges=[[0, 2]], timeline_limit=2, required_state=STATE)
        first = ss(who, {"conn_id": "rng", **one_list(ranges=[[0, 0]], timeline_limit=2, required_state=STATE)})
        self.assertEqual(list(first["rooms"]), [c])
        self.bob.send(b, {"msgtype": "m.text", "body": "after"})
        # Kept now: b's kept result is right as of now, but the connection's position is
        # before its newest event, which num_live must count.
        self.first(who, "rng-warm", wide)
        before = self.counts()
        moved = ss(who, {"conn_id": "rng", **wide}, pos=first["pos"], timeout=0)
        self.assertEqual(self.counts()[0] - before[0], 1)  # a: nothing after the position
        self.assertEqual(set(moved["rooms"]), {a, b})
        self.assertIs(moved["rooms"][a]["initial"], True)
        self.assertEqual(moved["rooms"][a]["num_live"], 0)
        self.assertEqual(bodies(moved["rooms"][a]), ["before"])
        self.assertIs(moved["rooms"][b]["initial"], True)  # read: an event after the position
        self.assertEqual(moved["rooms"][b]["num_live"], 1)
        self.assertEqual(bodies(moved["rooms"][b]), ["before", "after"])

    def test_a_list_with_filters_reads_its_stamps_apart_and_keeps_as_well(self):
        # Filters read the whole order (not the short way, which brings the stamps along):
        # the stamps come from a statement of their own.
        who = Client(self.srv, register(self.srv, "cache_filters"))
        rooms = [self.bob.create_room(name=f"Filtered {i}", invite=[who.user_id]) for i in range(2)]
        for room in rooms:
            who.join(room)
            self.bob.send(room, {"msgtype": "m.text", "body": "unread"})
        body = one_list(timeline_limit=1, required_state=STATE, filters={"is_encrypted": False})
        fresh, (hits, misses) = self.first(who, "flt-1", body)
        self.assertEqual((hits, misses), (0, 2))
        kept, (hits, misses) = self.first(who, "flt-2", body)
        self.assertEqual((hits, misses), (2, 0))
        self.assertEqual(without_ages(kept), without_ages(fresh))
        newest = who.messages(rooms[0], dir="b", limit=1)["chunk"][0]["event_id"]
        who.ok("POST", f"{V3}/rooms/{quote(rooms[0])}/receipt/m.read/{quote(newest)}", {})
        read, (hits, misses) = self.first(who, "flt-3", body)
        self.assertEqual((hits, misses), (1, 1))
        self.assertEqual(read["rooms"][rooms[0]]["notification_count"], 0)
        self.assertEqual(read["rooms"][rooms[1]]["notification_count"], 1)
