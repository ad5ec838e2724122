"""Ignoring users (the spec's m.ignored_user_list account data): the message events of the
users a user ignores are left out of that user's timelines - /sync, initial and
incremental, /messages and the deprecated /initialSync - while their state events are still
delivered; invites they send are left out of rooms.invite (and of sliding sync's lists); removing a user from the list
brings their new messages back on the next sync. Other users still see everything.

One server and three registered users serve the whole class; each test sets alice's list
itself and makes its own rooms.
"""

import unittest

from rooms_client import SharedServerTest, V3, quote, timeline_bodies

WIDE = {"room": {"timeline": {"limit": 50}}}
SLIDING = "/_matrix/client/unstable/org.matrix.simplified_msc3575/sync"


class IgnoredUsersTest(SharedServerTest):
    USERS = ("alice", "bob", "carol")

    def ignore(self, *clients):
        self.alice.ok("PUT", f"{V3}/user/{quote(self.alice.user_id)}/account_data/m.ignored_user_list",
                      {"ignored_users": {c.user_id: {} for c in clients}})

    def shared_room(self):
        """A public room of carol's that alice and bob joined; bob may set its topic."""
        room = self.carol.create_room(
            preset="public_chat",
            power_level_content_override={"users": {self.carol.user_id: 100, self.bob.user_id: 50}})
        self.alice.join(room)
        self.bob.join(room)
        return room

    def say(self, who, room, body):
        who.send(room, {"msgtype": "m.text", "body": body})

    def message_bodies(self, who, room):
        chunk = who.messages(room, dir="b", limit="50")["chunk"]
        return [e["content"].get("body") for e in chunk if e["type"] == "m.room.message"]

    def test_an_ignored_users_messages_are_left_out_of_timelines_but_not_for_others(self):
        self.ignore(self.bob)
        room = self.shared_room()
        self.say(self.bob, room, "bob one")
        self.say(self.carol, room, "carol one")

        initial = self.alice.sync(filter=WIDE)
        self.assertEqual(timeline_bodies(initial, room), ["carol one"])
        self.assertEqual(timeline_bodies(self.carol.sync(filter=WIDE), room), ["bob one", "carol one"])

        self.say(self.bob, room, "bob two")
        self.say(self.carol, room, "carol two")
        later = self.alice.sync(since=initial["next_batch"], filter=WIDE)
        self.assertEqual(timeline_bodies(later, room), ["carol two"])

        self.assertEqual(self.message_bodies(self.alice, room), ["carol two", "carol one"])
        self.assertEqual(self.message_bodies(self.carol, room),
                         ["carol two", "bob two", "carol one", "bob one"])

        legacy = self.alice.ok("GET", f"{V3}/initialSync?limit=50")
        mine = [r for r in legacy["rooms"] if r["room_id"] == room]
        self.assertEqual(len(mine), 1)
        self.assertEqual([e["content"].get("body") for e in mine[0]["messages"]["chunk"]
                          if e["type"] == "m.room.message"], ["carol one", "carol two"])

    def test_an_ignored_users_state_events_are_still_delivered(self):
        self.ignore(self.bob)
        room = self.shared_room()
        before = self.alice.sync(filter=WIDE)
        self.bob.put_state(room, "m.room.topic", {"topic": "set by bob"})
        self.say(self.carol, room, "after the topic")

        later = self.alice.sync(since=before["next_batch"], filter=WIDE)
        events = later["rooms"]["join"][room]["timeline"]["events"]
        topics = [(e["sender"], e["content"].get("topic")) for e in events if e["type"] == "m.room.topic"]
        self.assertEqual(topics, [(self.bob.user_id, "set by bob")])

        # A timeline too short for the topic carries it in the state block.
        short = self.alice.sync(filter={"room": {"timeline": {"limit": 1}}})
        state = short["rooms"]["join"][room]["state"]["events"]
        topics = [(e["sender"], e["content"].get("topic")) for e in state if e["type"] == "m.room.topic"]
        self.assertEqual(topics, [(self.bob.user_id, "set by bob")])

    def test_invites_from_an_ignored_user_are_left_out_of_sync(self):
        self.ignore(self.bob)
        before = self.alice.sync(filter=WIDE)
        from_bob = self.bob.create_room(preset="private_chat", invite=[self.alice.user_id])
        from_carol = self.carol.create_room(preset="private_chat", invite=[self.alice.user_id])

        later = self.alice.sync(since=before["next_batch"], filter=WIDE)
        self.assertIn(from_carol, later["rooms"]["invite"])
        self.assertNotIn(from_bob, later["rooms"]["invite"])

        initial = self.alice.sync(filter=WIDE)
        self.assertIn(from_carol, initial["rooms"]["invite"])
        self.assertNotIn(from_bob, initial["rooms"]["invite"])

    def test_unignoring_a_user_brings_their_new_messages_back(self):
        self.ignore(self.bob)
        room = self.shared_room()
        self.say(self.bob, room, "while ignored")
        before = self.alice.sync(filter=WIDE)
        self.assertEqual(timeline_bodies(before, room), [])

        self.ignore()
        self.say(self.bob, room, "after unignoring")
        later = self.alice.sync(since=before["next_batch"], filter=WIDE)
        self.assertEqual(timeline_bodies(later, room), ["after unignoring"])
        self.assertIn("while ignored", self.message_bodies(self.alice, room))

    def test_sliding_sync_leaves_out_an_ignored_users_messages_and_invites(self):
        self.ignore(self.bob)
        room = self.shared_room()
        self.say(self.bob, room, "bob says")
        self.say(self.carol, room, "carol says")
        from_bob = self.bob.create_room(preset="private_chat", invite=[self.alice.user_id])
        from_carol = self.carol.create_room(preset="private_chat", invite=[self.alice.user_id])

        body = {"lists": {"all": {"ranges": [[0, 99]], "timeline_limit": 50, "required_state": []}}}
        answer = self.alice.ok("POST", SLIDING, body)
        rooms = answer["rooms"]
        self.assertEqual([e["content"].get("body") for e in rooms[room]["timeline"]
                          if e["type"] == "m.room.message"], ["carol says"])
        self.assertIn(from_carol, rooms)
        self.assertNotIn(from_bob, rooms)


if __name__ == "__main__":
    unittest.main()
