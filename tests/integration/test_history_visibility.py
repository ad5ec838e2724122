"""m.room.history_visibility decides which of a room's events a member may read, in every
reader: /messages, /context/{eventId}, /event/{eventId} and /sync timelines (joined and
left rooms). For each of the four values a newcomer (bob, invited then joined) sees
exactly what the value allows, his own membership events always, nothing after he
leaves, and an event he may not see is 404 as if it did not exist. A change of the value
applies from that change on; the change event itself shows when the value before or after
it allows it. State stays the room's current state, also when the events that set it are
hidden. A pagination token from before what bob may see gives an empty page, not an
error. A user who refused an invite sees only what the invite allowed. alice, joined
throughout, sees everything. Past ROOMS_VIS_MAX_CHANGES changes the older history is
hidden, never shown.
"""

import json
import unittest

from harness import psql
from rooms_client import SharedServerTest, V3, quote

HV = "m.room.history_visibility"
MEMBER = "m.room.member"
PAGE = "100"                                   # larger than any room here
BIG_TIMELINE = {"room": {"timeline": {"limit": 100}}}
WITH_LEAVE = {"room": {"timeline": {"limit": 100}, "include_leave": True}}
MAX_CHANGES = 1000                             # ROOMS_VIS_MAX_CHANGES in core/rooms/rooms.h
ALL = ["before-invite", "after-invite", "after-join"]

# What bob reads while joined, and after leaving (rule 4: "shared" history from before his
# join shows only while he is joined).
WHILE_JOINED = {
    "joined": ["after-join"],
    "invited": ["after-invite", "after-join"],
    "shared": ALL,
    "world_readable": ALL,
}
AFTER_LEAVING = {
    "joined": ["after-join"],
    "invited": ["after-invite", "after-join"],
    "shared": ["after-join"],
    "world_readable": ALL,
}


def bodies(events):
    return [e["content"].get("body") for e in events if e["type"] == "m.room.message"]


def own_memberships(events, user_id):
    return [e["content"]["membership"] for e in events
            if e["type"] == MEMBER and e.get("state_key") == user_id]


class HistoryVisibilityTest(SharedServerTest):
    USERS = ("alice", "bob", "carol")

    # -- helpers ----------------------------------------------------------------------

    def path(self, room, tail):
        return f"{V3}/rooms/{quote(room)}{tail}"

    def scenario(self, value):
        """alice's room with history_visibility `value`: before-invite, bob invited,
        after-invite, bob joins, after-join. Returns (room, {body: event_id})."""
        room = self.alice.create_room(preset="private_chat")
        self.alice.put_state(room, HV, {"history_visibility": value})
        ids = {"before-invite": self.say(room, "before-invite")}
        self.assertEqual(self.alice.member_action(room, "invite", self.bob.user_id)[0], 200)
        ids["after-invite"] = self.say(room, "after-invite")
        self.bob.join(room)
        ids["after-join"] = self.say(room, "after-join")
        return room, ids

    def say(self, room, body):
        return self.alice.send(room, {"msgtype": "m.text", "body": body})

    def all_messages(self, who, room, **params):
        return who.messages(room, dir="b", limit=PAGE, **params)["chunk"][::-1]

    def assert_hidden(self, who, room, event_id):
        for tail in (f"/event/{quote(event_id)}", f"/context/{quote(event_id)}"):
            status, body = who.call("GET", self.path(room, tail))
            self.assertEqual((status, body.get("errcode")), (404, "M_NOT_FOUND"), (tail, body))

    def assert_shown(self, who, room, event_id, body):
        seen = who.ok("GET", self.path(room, f"/event/{quote(event_id)}"))
        self.assertEqual(seen["content"]["body"], body)
        ctx = who.ok("GET", self.path(room, f"/context/{quote(event_id)}"))
        self.assertEqual(ctx["event"]["content"]["body"], body)

    def check_value(self, value):
        room, ids = self.scenario(value)
        expected = WHILE_JOINED[value]

        # /messages, backwards from the end.
        events = self.all_messages(self.bob, room)
        self.assertEqual(bodies(events), expected)
        self.assertEqual(own_memberships(events, self.bob.user_id), ["invite", "join"])

        # The initial /sync timeline; the state (current, not history) still says `value`.
        answer = self.bob.sync(filter=BIG_TIMELINE)
        joined = answer["rooms"]["join"][room]
        timeline = joined["timeline"]["events"]
        self.assertEqual(bodies(timeline), expected)
        self.assertEqual(own_memberships(timeline, self.bob.user_id), ["invite", "join"])
        hv_state = [e["content"] for e in joined["state"]["events"] + timeline if e["type"] == HV]
        self.assertEqual(hv_state[-1], {"history_visibility": value})

        # /event and /context of each message; /context's neighbours are filtered too.
        for body in ALL:
            if body in expected:
                self.assert_shown(self.bob, room, ids[body], body)
            else:
                self.assert_hidden(self.bob, room, ids[body])
        ctx = self.bob.ok("GET", self.path(room, f"/context/{quote(ids['after-join'])}?limit=60"))
        self.assertEqual(bodies(ctx["events_before"][::-1]), expected[:-1])

        # bob leaves; what alice says next never reaches him, by any reader.
        since = answer["next_batch"]
        self.bob.leave(room)
        ids["after-leave"] = self.say(room, "after-leave")
        after = AFTER_LEAVING[value]
        self.assertEqual(bodies(self.all_messages(self.bob, room)), after)
        self.assert_hidden(self.bob, room, ids["after-leave"])
        left = self.bob.sync(since=since, filter=BIG_TIMELINE)["rooms"]["leave"][room]
        self.assertEqual(own_memberships(left["timeline"]["events"], self.bob.user_id), ["leave"])
        self.assertEqual(bodies(left["timeline"]["events"]), [])
        initial = self.bob.sync(filter=WITH_LEAVE)["rooms"]["leave"][room]
        self.assertEqual(bodies(initial["timeline"]["events"]), after)

        # alice, joined throughout, reads everything.
        self.assertEqual(bodies(self.all_messages(self.alice, room)), ALL + ["after-leave"])
        self.assertEqual(bodies(self.alice.sync(filter=BIG_TIMELINE)["rooms"]["join"][room]
                                ["timeline"]["events"]), ALL + ["after-leave"])
        self.assert_shown(self.alice, room, ids["before-invite"], "before-invite")

    # -- the four values ----------------------------------------------------------------

    def test_joined_shows_a_newcomer_only_what_came_after_his_join(self):
        self.check_value("joined")

    def test_invited_shows_a_newcomer_what_came_after_his_invite(self):
        self.check_value("invited")

    def test_shared_shows_a_member_everything_but_not_once_he_left(self):
        self.check_value("shared")

    def test_world_readable_shows_everything_up_to_the_leave(self):
        self.check_value("world_readable")

    # -- changes, gaps, tokens -----------------------------------------------------------

    def test_a_change_applies_from_that_event_on_and_shows_when_before_or_after_allows(self):
        room = self.alice.create_room(preset="private_chat")  # starts "shared"
        changes = (("joined", "j1"), ("invited", "i1"), ("shared", "s1"), ("joined", "j2"))
        for value, body in changes:
            self.alice.put_state(room, HV, {"history_visibility": value})
            self.say(room, body)
        self.alice.member_action(room, "invite", self.bob.user_id)
        self.say(room, "i2")
        self.bob.join(room)
        self.say(room, "after-join")

        def view(events):
            return [e["content"]["history_visibility"] if e["type"] == HV else e["content"]["body"]
                    for e in events if e["type"] in (HV, "m.room.message")]

        # joined -> invited is hidden from bob: neither value lets a stranger see it.
        self.assertEqual(view(self.all_messages(self.bob, room)),
                         ["shared", "joined", "shared", "s1", "joined", "after-join"])
        # The sync timeline starts after that hidden state change (its value is state, not
        # history: the state block says "invited"); the rest is a /messages away.
        joined = self.bob.sync(filter=BIG_TIMELINE)["rooms"]["join"][room]
        self.assertTrue(joined["timeline"]["limited"])
        self.assertEqual(view(joined["timeline"]["events"]),
                         ["shared", "s1", "joined", "after-join"])
        self.assertEqual([e["content"] for e in joined["state"]["events"] if e["type"] == HV],
                         [{"history_visibility": "invited"}])
        earlier = self.bob.messages(room, dir="b", limit=PAGE,
                                    **{"from": joined["timeline"]["prev_batch"]})
        self.assertEqual(view(earlier["chunk"][::-1]), ["shared", "joined"])
        self.assertEqual(view(self.all_messages(self.alice, room)),
                         ["shared", "joined", "j1", "invited", "i1", "shared", "s1", "joined", "j2",
                          "i2", "after-join"])

    def test_current_state_set_by_hidden_events_reaches_sync_in_the_timeline(self):
        room = self.alice.create_room(preset="private_chat", name="Old name")
        self.alice.put_state(room, HV, {"history_visibility": "joined"})
        self.alice.member_action(room, "invite", self.bob.user_id)
        self.alice.put_state(room, "m.room.name", {"name": "Set while bob was invited"})
        self.bob.join(room)
        self.say(room, "first")
        answer = self.bob.sync(filter=BIG_TIMELINE)
        joined = answer["rooms"]["join"][room]
        # The hidden rename is the room's current name: it comes in the timeline (as
        # Synapse sends current state), after any older name, so a client applying state
        # then timeline ends with the current name.
        names = [e["content"]["name"] for e in joined["state"]["events"] + joined["timeline"]["events"]
                 if e["type"] == "m.room.name"]
        self.assertEqual(names[-1], "Set while bob was invited")
        self.assertIn("Set while bob was invited",
                      [e["content"].get("name") for e in joined["timeline"]["events"]])
        self.assertEqual(own_memberships(joined["timeline"]["events"], self.bob.user_id),
                         ["invite", "join"])
        self.assertEqual(bodies(joined["timeline"]["events"]), ["first"])
        names = [e["content"]["name"] for e in self.all_messages(self.bob, room)
                 if e["type"] == "m.room.name"]
        self.assertEqual(names, ["Old name"])  # history: the rename itself stays hidden

        # bob leaves and comes back: the away part stays hidden, in /messages and in the
        # incremental sync, whose timeline still brings the topic set meanwhile (current
        # state).
        since = answer["next_batch"]
        self.bob.leave(room)
        self.say(room, "while away")
        self.alice.put_state(room, "m.room.topic", {"topic": "Set while bob was away"})
        self.alice.member_action(room, "invite", self.bob.user_id)
        self.bob.join(room)
        self.say(room, "back")
        again = self.bob.sync(since=since, filter=BIG_TIMELINE)["rooms"]["join"][room]
        self.assertEqual(bodies(again["timeline"]["events"]), ["back"])
        self.assertEqual(own_memberships(again["timeline"]["events"], self.bob.user_id),
                         ["leave", "invite", "join"])
        topics = [e["content"] for e in again["timeline"]["events"] if e["type"] == "m.room.topic"]
        self.assertEqual(topics, [{"topic": "Set while bob was away"}])
        self.assertEqual(bodies(self.all_messages(self.bob, room)), ["first", "back"])

    def test_tokens_from_before_the_visible_history_give_empty_pages(self):
        room, _ = self.scenario("joined")
        answer = self.bob.sync(filter={"room": {"timeline": {"limit": 2}}})
        joined = answer["rooms"]["join"][room]
        self.assertTrue(joined["timeline"]["limited"])
        self.assertEqual(own_memberships(joined["timeline"]["events"], self.bob.user_id), ["join"])
        self.assertEqual(bodies(joined["timeline"]["events"]), ["after-join"])
        page = self.bob.messages(room, dir="b", limit="10",
                                 **{"from": joined["timeline"]["prev_batch"]})
        self.assertEqual(own_memberships(page["chunk"], self.bob.user_id), ["invite"])
        self.assertEqual(bodies(page["chunk"]), [])
        self.assertNotIn("end", page)
        first = self.bob.messages(room, dir="b", limit="10", **{"from": "s1"})
        self.assertEqual((first["chunk"], "end" in first), ([], False))
        forward = self.bob.messages(room, dir="f", limit="10", **{"from": "s0"})
        self.assertEqual(bodies(forward["chunk"]), ["after-join"])
        self.assertEqual(own_memberships(forward["chunk"], self.bob.user_id), ["invite", "join"])
        # A stranger gets 403 unless the room is world_readable.
        shared, shared_ids = self.scenario("shared")
        seen = shared_ids["before-invite"]
        for tail in ("/messages?dir=b", f"/event/{quote(seen)}", f"/context/{quote(seen)}",
                     "/state", "/state/m.room.create/"):
            status, body = self.carol.call("GET", self.path(shared, tail))
            self.assertEqual((status, body.get("errcode")), (403, "M_FORBIDDEN"), tail)

    def test_a_world_readable_room_is_readable_by_non_members(self):
        room, ids = self.scenario("world_readable")
        self.alice.put_state(room, "m.room.topic", {"topic": "open to all"})
        stranger = self.carol
        chunk = stranger.messages(room, dir="b", limit="50")["chunk"]
        self.assertEqual(bodies(chunk[::-1]), ["before-invite", "after-invite", "after-join"])
        seen = stranger.ok("GET", self.path(room, f"/event/{quote(ids['before-invite'])}"))
        self.assertEqual(seen["content"]["body"], "before-invite")
        state = stranger.ok("GET", self.path(room, "/state"))
        self.assertIn(("m.room.topic", ""), [(e["type"], e["state_key"]) for e in state])
        topic = stranger.ok("GET", self.path(room, "/state/m.room.topic/"))
        self.assertEqual(topic, {"topic": "open to all"})
        # Once it is no longer world_readable, the stranger is shut out again.
        self.alice.put_state(room, HV, {"history_visibility": "shared"})
        status, body = stranger.call("GET", self.path(room, "/messages?dir=b"))
        self.assertEqual((status, body.get("errcode")), (403, "M_FORBIDDEN"))

    def test_a_refused_invite_shows_only_what_the_invite_allowed(self):
        for value, expected in (("shared", []), ("invited", ["while-invited"])):
            room = self.alice.create_room(preset="private_chat")
            self.alice.put_state(room, HV, {"history_visibility": value})
            self.say(room, "before")
            self.alice.member_action(room, "invite", self.carol.user_id)
            self.say(room, "while-invited")
            self.carol.leave(room)  # refuses
            self.say(room, "after")
            left = self.carol.sync(filter=WITH_LEAVE)["rooms"]["leave"][room]["timeline"]["events"]
            self.assertEqual(bodies(left), expected, value)
            self.assertEqual(own_memberships(left, self.carol.user_id), ["invite", "leave"])
            status, body = self.carol.call("GET", self.path(room, "/messages?dir=b"))
            self.assertEqual((status, body.get("errcode")), (403, "M_FORBIDDEN"))

    def test_past_the_change_limit_older_history_is_hidden_not_shown(self):
        room = self.alice.create_room(preset="private_chat")  # one change: "shared"
        self.say(room, "old")
        self.alice.member_action(room, "invite", self.bob.user_id)
        self.bob.join(room)
        only_messages = {"filter": json.dumps({"types": ["m.room.message"]})}

        def add_changes(n):
            """n more history_visibility changes ("joined", "shared", ...) written straight
            into the events table: sending them one by one would take far longer."""
            psql("INSERT INTO events (stream_pos, event_id, room_id, type, state_key, sender,"
                 " origin_server_ts, depth, pdu)"
                 " SELECT stream_next(), '$hvfill' || g || '_' || md5(random()::text), r.room_id,"
                 f" '{HV}', '', '{self.alice.user_id}', 0, r.last_depth + g,"
                 " json_build_object('type', 'm.room.history_visibility', 'state_key', '',"
                 f" 'sender', '{self.alice.user_id}', 'room_id', r.room_id,"
                 " 'origin_server_ts', 0, 'depth', r.last_depth + g, 'content',"
                 " json_build_object('history_visibility',"
                 "  CASE WHEN g % 2 = 1 THEN 'joined' ELSE 'shared' END))::text"
                 f" FROM rooms r, generate_series(1, {n}) g WHERE r.room_id = '{room}'"
                 " ORDER BY g", database=self.srv.database)

        add_changes(MAX_CHANGES - 1)  # with the preset's "shared": exactly the limit
        self.assertEqual(bodies(self.all_messages(self.bob, room, **only_messages)), ["old"])
        add_changes(2)  # "joined" again (no change), then "shared": one change over
        self.assertEqual(bodies(self.all_messages(self.bob, room, **only_messages)), [])
        self.assertEqual(bodies(self.all_messages(self.alice, room, **only_messages)), ["old"])
        self.srv.wait_for_log("older history is hidden", timeout=5)


if __name__ == "__main__":
    unittest.main()
