"""/sync filters the spec's way: room.state (types, not_types, senders; '*' wildcards)
shapes the state block whether the filter is stored or inline, `types: []` and an unknown
type send no state, a non-boolean lazy_load_members is refused with 400 (stored or
inline), and event_format: federation names the room in every event."""

import json

from rooms_client import SharedServerTest, V3, quote


class SyncFilterTest(SharedServerTest):
    USERS = ("alice", "bob")

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.room = cls.alice.create_room(preset="public_chat", name="Filters", topic="t")
        cls.bob.join(cls.room)
        # More messages than the default timeline limit: the state comes as the state block.
        for i in range(12):
            cls.alice.send(cls.room, {"msgtype": "m.text", "body": f"filler {i}"})
        cls.alice.send(cls.room, {"msgtype": "m.text", "body": "hi"})

    def state_types(self, answer):
        return sorted({e["type"] for e in answer["rooms"]["join"][self.room]["state"]["events"]})

    def store(self, definition):
        return self.bob.ok("POST", f"{V3}/user/{quote(self.bob.user_id)}/filter",
                           definition)["filter_id"]

    def test_state_types_shape_the_state_block_stored_or_inline(self):
        everything = self.state_types(self.bob.sync())
        self.assertIn("m.room.name", everything)
        self.assertIn("m.room.member", everything)
        for definition, expected in (
                ({"room": {"state": {"types": []}}}, []),
                ({"room": {"state": {"types": ["org.example.unknown"]}}}, []),
                ({"room": {"state": {"types": ["m.room.name", "m.room.topic"]}}},
                 ["m.room.name", "m.room.topic"]),
                ({"room": {"state": {"types": ["m.room.*"], "not_types": ["m.room.member"]}}},
                 [t for t in everything if t.startswith("m.room.") and t != "m.room.member"]),
                ({"room": {"state": {"senders": [self.bob.user_id]}}}, ["m.room.member"])):
            for f in (self.store(definition), definition):
                answer = self.bob.sync(filter=f)
                self.assertEqual(self.state_types(answer), expected, (f, definition))
                self.assertIn("hi", [e["content"].get("body") for e in
                                     answer["rooms"]["join"][self.room]["timeline"]["events"]],
                              "the state filter leaves the timeline alone")

    def test_a_non_boolean_lazy_load_members_is_400(self):
        bad = {"room": {"state": {"lazy_load_members": "yes"}}}
        status, body = self.bob.call("POST", f"{V3}/user/{quote(self.bob.user_id)}/filter", bad)
        self.assertEqual((status, body["errcode"]), (400, "M_BAD_JSON"))
        status, body = self.bob.call("GET", f"{V3}/sync?filter={quote(json.dumps(bad))}")
        self.assertEqual((status, body["errcode"]), (400, "M_BAD_JSON"))
        status, body = self.bob.call("POST", f"{V3}/user/{quote(self.bob.user_id)}/filter",
                                     {"room": {"timeline": {"types": [1]}}})
        self.assertEqual((status, body["errcode"]), (400, "M_BAD_JSON"))

    def test_event_format_federation_names_the_room_in_every_event(self):
        for f in ({"event_format": "federation"}, self.store({"event_format": "federation"})):
            joined = self.bob.sync(filter=f)["rooms"]["join"][self.room]
            events = joined["state"]["events"] + joined["timeline"]["events"]
            self.assertTrue(events)
            self.assertEqual({e.get("room_id") for e in events}, {self.room}, f)
        joined = self.bob.sync()["rooms"]["join"][self.room]
        self.assertNotIn("room_id", joined["timeline"]["events"][0], "the client format omits it")
        status, body = self.bob.call("GET", f"{V3}/sync?filter=" +
                                     quote(json.dumps({"event_format": "pdu"})))
        self.assertEqual((status, body["errcode"]), (400, "M_BAD_JSON"))


LAZY = {"room": {"state": {"lazy_load_members": True}, "timeline": {"limit": 2}}}
LAZY_REDUNDANT = {"room": {"state": {"lazy_load_members": True, "include_redundant_members": True},
                           "timeline": {"limit": 2}}}


class LazyMembersTest(SharedServerTest):
    USERS = ("ann", "ben", "cat", "dan")

    def members(self, answer, room):
        joined = answer["rooms"]["join"].get(room, {})
        return sorted(e["state_key"] for e in joined.get("state", {}).get("events", [])
                      if e["type"] == "m.room.member")

    def test_each_member_event_goes_to_a_device_once_unless_redundant_ones_are_asked_for(self):
        room = self.ann.create_room(preset="public_chat")
        for who in (self.ben, self.cat, self.dan):
            who.join(room)
        for i in range(3):
            self.cat.send(room, {"msgtype": "m.text", "body": f"cat {i}"})
        first = self.ben.sync(filter=LAZY)
        # The senders of the timeline and ben himself, not ann or dan.
        self.assertEqual(self.members(first, room), sorted([self.ben.user_id, self.cat.user_id]))
        # cat again and dan for the first time (a gap, so a state block): only dan's member
        # event is new to this device.
        for i in range(3):
            self.cat.send(room, {"msgtype": "m.text", "body": f"cat again {i}"})
        self.dan.send(room, {"msgtype": "m.text", "body": "dan"})
        second = self.ben.sync(since=first["next_batch"], filter=LAZY)
        self.assertTrue(second["rooms"]["join"][room]["timeline"]["limited"])
        self.assertEqual(self.members(second, room), [self.dan.user_id])
        # The same window asked with include_redundant_members: both again.
        again = self.ben.sync(since=first["next_batch"], filter=LAZY_REDUNDANT)
        self.assertEqual(self.members(again, room), sorted([self.cat.user_id, self.dan.user_id]))
        # An initial sync starts the device again from nothing.
        fresh = self.ben.sync(filter=LAZY)
        self.assertEqual(self.members(fresh, room),
                         sorted([self.ben.user_id, self.cat.user_id, self.dan.user_id]))
        status, body = self.ben.call("GET", f"{V3}/sync?filter=" + quote(json.dumps(
            {"room": {"state": {"lazy_load_members": True, "include_redundant_members": 1}}})))
        self.assertEqual((status, body["errcode"]), (400, "M_BAD_JSON"))

    def state_of(self, answer, room, section="join"):
        return answer["rooms"][section].get(room, {}).get("state", {}).get("events", [])

    def memberships(self, answer, room):
        return {e["state_key"]: e["content"]["membership"] for e in self.state_of(answer, room)
                if e["type"] == "m.room.member"}

    def test_an_incremental_sync_sends_only_the_members_of_the_timelines_senders(self):
        room = self.ann.create_room(preset="public_chat", name="senders")
        for who in (self.ben, self.cat):
            who.join(room)
        for i in range(3):
            self.ben.send(room, {"msgtype": "m.text", "body": f"ben {i}"})
        first = self.ann.sync(filter=LAZY)
        self.assertEqual(self.members(first, room), sorted([self.ann.user_id, self.ben.user_id]))
        self.cat.send(room, {"msgtype": "m.text", "body": "cat"})
        second = self.ann.sync(since=first["next_batch"], filter=LAZY)
        self.assertFalse(second["rooms"]["join"][room]["timeline"]["limited"])
        self.assertEqual([(e["type"], e["state_key"]) for e in self.state_of(second, room)],
                         [("m.room.member", self.cat.user_id)])
        third = self.ann.sync(since=second["next_batch"], filter=LAZY)
        self.assertNotIn(room, third["rooms"]["join"], "nothing new, no state again")

    def test_a_gapped_incremental_sync_sends_every_state_change_of_the_gap(self):
        room = self.ann.create_room(preset="public_chat", name="gaps")
        for who in (self.ben, self.cat):
            who.join(room)
        for i in range(3):
            self.ben.send(room, {"msgtype": "m.text", "body": f"ben {i}"})
        first = self.ann.sync(filter=LAZY)
        self.assertEqual(self.members(first, room), sorted([self.ann.user_id, self.ben.user_id]))
        # The gap: dan joins (and says nothing), the topic changes; cat speaks after.
        self.dan.join(room)
        self.ann.put_state(room, "m.room.topic", {"topic": "in the gap"})
        for i in range(3):
            self.cat.send(room, {"msgtype": "m.text", "body": f"cat {i}"})
        second = self.ann.sync(since=first["next_batch"], filter=LAZY)
        self.assertTrue(second["rooms"]["join"][room]["timeline"]["limited"])
        self.assertEqual(self.memberships(second, room),
                         {self.cat.user_id: "join", self.dan.user_id: "join"},
                         "the speaker, and the member who joined in the gap")
        self.assertIn("m.room.topic", [e["type"] for e in self.state_of(second, room)])
        # An old leave in the next gap: dan's, though dan never speaks; cat's member event
        # was sent already.
        self.dan.leave(room)
        for i in range(3):
            self.cat.send(room, {"msgtype": "m.text", "body": f"cat again {i}"})
        third = self.ann.sync(since=second["next_batch"], filter=LAZY)
        self.assertTrue(third["rooms"]["join"][room]["timeline"]["limited"])
        self.assertEqual(self.memberships(third, room), {self.dan.user_id: "leave"})

    def test_joining_and_leaving_in_one_batch_sends_the_room_whole(self):
        room = self.ann.create_room(preset="private_chat", name="in and out")
        self.ann.put_state(room, "org.example.state", {"my_key": 1})
        self.ann.member_action(room, "invite", self.ben.user_id)
        only_state = {"room": {"timeline": {"types": []}, "include_leave": True,
                               "state": {"types": ["org.example.state"]}}}
        first = self.ben.sync(filter=only_state)
        self.assertIn(room, first["rooms"]["invite"])
        self.ben.join(room)
        self.ann.send(room, {"msgtype": "m.text", "body": "while ben is in"})
        self.ben.leave(room)
        second = self.ben.sync(since=first["next_batch"], filter=only_state)
        left = second["rooms"]["leave"][room]
        self.assertEqual([(e["type"], e["content"]) for e in left["state"]["events"]],
                         [("org.example.state", {"my_key": 1})])
        self.assertEqual(left["timeline"]["events"], [])
        # Unfiltered: the timeline ends with the leave, is limited (the room is new to the
        # client), and its state is the room's before the timeline.
        plain = self.ben.sync(since=first["next_batch"], filter={"room": {"timeline": {"limit": 2}}})
        left = plain["rooms"]["leave"][room]
        self.assertTrue(left["timeline"]["limited"])
        self.assertEqual([e["type"] for e in left["timeline"]["events"]],
                         ["m.room.message", "m.room.member"])
        state = {(e["type"], e["state_key"]) for e in left["state"]["events"]}
        self.assertIn(("m.room.create", ""), state)
        self.assertIn(("org.example.state", ""), state)
        self.assertIn(("m.room.member", self.ben.user_id), state, "ben's join, before the timeline")

    def test_a_state_types_filter_shapes_state_and_timeline_alike(self):
        room = self.ann.create_room(preset="private_chat")
        split = {"room": {"timeline": {"types": ["org.example.kept"]},
                          "state": {"types": ["org.example.kept"]}}}
        self.ann.put_state(room, "org.example.kept", {"my_key": 1}, state_key="changes")
        self.ann.put_state(room, "org.example.kept", {"my_key": 1}, state_key="stays")
        first = self.ann.sync(filter=split)
        joined = first["rooms"]["join"][room]
        self.assertEqual(joined["state"]["events"], [], "what the timeline holds is not state")
        self.assertEqual([e["state_key"] for e in joined["timeline"]["events"]], ["changes", "stays"])
        self.ann.put_state(room, "org.example.kept", {"my_key": 2}, state_key="changes")
        self.ann.send(room, {"msgtype": "m.text", "body": "filtered out"})
        answer = self.ann.sync(since=first["next_batch"], filter=split)
        second = answer["rooms"]["join"][room]
        self.assertEqual(second["state"]["events"], [])
        self.assertEqual([(e["state_key"], e["content"]["my_key"])
                          for e in second["timeline"]["events"]], [("changes", 2)])
        # A member's new display name is neither: no room at all.
        self.ann.put_state(room, "m.room.member", {"membership": "join", "displayname": "Ann"},
                           state_key=self.ann.user_id)
        third = self.ann.sync(since=answer["next_batch"], filter=split)
        self.assertNotIn(room, third["rooms"]["join"])

    def test_current_state_hidden_by_private_history_comes_in_the_timeline(self):
        room = self.ann.create_room(preset="public_chat")
        self.ben.join(room)
        self.ann.put_state(room, "m.room.history_visibility", {"history_visibility": "joined"})
        self.ann.member_action(room, "invite", self.cat.user_id)
        first = self.ben.sync(filter={"room": {"timeline": {"limit": 10}}})
        self.ben.leave(room)
        self.cat.join(room)
        for i in range(3):  # hidden from ben too, but not current state
            self.ann.send(room, {"msgtype": "m.text", "body": f"while ben is out {i}"})
        self.ben.join(room)
        second = self.ben.sync(since=first["next_batch"], filter={"room": {"timeline": {"limit": 10}}})
        timeline = second["rooms"]["join"][room]["timeline"]["events"]
        self.assertIn((self.cat.user_id, "join"),
                      [(e.get("state_key"), e["content"].get("membership")) for e in timeline
                       if e["type"] == "m.room.member"])
        self.assertNotIn("while ben is out 0", [e["content"].get("body") for e in timeline])
