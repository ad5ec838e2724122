"""The deprecated sync APIs older clients and bridges still use: GET /initialSync (every
room with its newest messages, state, account data, and presence), GET
/rooms/{roomId}/initialSync (one room; for a room the user is not in, what anyone may read
of it while it is world_readable, else 403) and GET /events
(the events after `from`, parking until there are some), on the v3 and r0 prefixes. As
Synapse (docs/adr/0020-legacy-sync-follows-synapse.md): each room's `visibility` (listed in
the directory or not), the inviter of an invite, receipts, left rooms with archived=true and
a room initialSync of a left room up to the leave, and /events?room_id= for one room, which
a non-member may poll (and park on) while the room is world_readable."""

import time

from common import Background, wait_until
from rooms_client import SharedServerTest, V3, quote

R0 = "/_matrix/client/r0"


class LegacySyncTest(SharedServerTest):
    USERS = ("amy", "bo", "cy")
    PLUGINS = {"directory": {"enabled": True}}  # `visibility` reads the room directory

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.room = cls.amy.create_room(preset="public_chat", name="Old school")
        cls.bo.join(cls.room)
        for i in range(4):
            cls.amy.send(cls.room, {"msgtype": "m.text", "body": f"m{i}"})

    def bodies(self, events):
        return [e["content"].get("body") for e in events if e["type"] == "m.room.message"]

    def test_initial_sync_lists_rooms_with_messages_and_state(self):
        for prefix in (V3, R0):
            answer = self.bo.ok("GET", f"{prefix}/initialSync?limit=2")
            self.assertTrue(answer["end"].startswith("s"))
            (room,) = [r for r in answer["rooms"] if r["room_id"] == self.room]
            self.assertEqual(room["membership"], "join")
            self.assertEqual(self.bodies(room["messages"]["chunk"]), ["m2", "m3"])
            self.assertEqual({e["room_id"] for e in room["messages"]["chunk"]}, {self.room})
            self.assertIn("start", room["messages"])
            names = [e for e in room["state"] if e["type"] == "m.room.name"]
            self.assertEqual([e["content"]["name"] for e in names], ["Old school"])
            members = sorted(e["state_key"] for e in room["state"] if e["type"] == "m.room.member")
            self.assertEqual(members, sorted([self.amy.user_id, self.bo.user_id]))
            self.assertIsInstance(answer["presence"], list)
            self.assertIsInstance(answer["account_data"], list)

    def test_room_initial_sync_is_for_members_only(self):
        room = self.bo.ok("GET", f"{V3}/rooms/{quote(self.room)}/initialSync?limit=1")
        self.assertEqual((room["room_id"], room["membership"]), (self.room, "join"))
        self.assertEqual(self.bodies(room["messages"]["chunk"]), ["m3"])
        status, body = self.cy.call("GET", f"{V3}/rooms/{quote(self.room)}/initialSync")
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"))

    def test_room_initial_sync_of_a_world_readable_room_shows_a_non_member_its_open_part(self):
        room = self.amy.create_room(preset="private_chat", name="Reading room")
        hv = "m.room.history_visibility"
        self.amy.send(room, {"msgtype": "m.text", "body": "while shared"})
        self.amy.put_state(room, hv, {"history_visibility": "world_readable"})
        for body in ("open1", "open2", "open3"):
            self.amy.send(room, {"msgtype": "m.text", "body": body})
        path = f"{V3}/rooms/{quote(room)}/initialSync"
        peek = self.cy.ok("GET", f"{path}?limit=50")
        self.assertEqual(peek["room_id"], room)
        self.assertNotIn("membership", peek)
        # Only what came after the room became world_readable (and the change itself).
        self.assertEqual(self.bodies(peek["messages"]["chunk"]), ["open1", "open2", "open3"])
        self.assertIn(hv, [e["type"] for e in peek["messages"]["chunk"]])
        self.assertEqual({e["room_id"] for e in peek["messages"]["chunk"]}, {room})
        names = [e["content"]["name"] for e in peek["state"] if e["type"] == "m.room.name"]
        self.assertEqual(names, ["Reading room"])
        self.assertEqual((peek["presence"], peek["receipts"], peek["account_data"]), ([], [], []))
        # limit keeps the newest; `start` pages back from there with /messages.
        peek = self.cy.ok("GET", f"{path}?limit=2")
        self.assertEqual(self.bodies(peek["messages"]["chunk"]), ["open2", "open3"])
        older = self.cy.ok("GET", f"{V3}/rooms/{quote(room)}/messages?dir=b&limit=50"
                                  f"&from={peek['messages']['start']}")
        self.assertEqual(self.bodies(older["chunk"]), ["open1"])
        # Once the room is no longer world_readable, a non-member is refused again.
        self.amy.put_state(room, hv, {"history_visibility": "shared"})
        status, body = self.cy.call("GET", path)
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"))

    def test_events_returns_what_came_after_from_and_parks_until_something_does(self):
        room = self.amy.create_room(preset="public_chat")  # the other tests read self.room
        self.bo.join(room)
        start = self.bo.ok("GET", f"{V3}/initialSync?limit=0")["end"]
        self.amy.send(room, {"msgtype": "m.text", "body": "after"})
        answer = self.bo.ok("GET", f"{R0}/events?from={start}&timeout=0")
        self.assertEqual(answer["start"], start)
        self.assertEqual(self.bodies(answer["chunk"]), ["after"])
        self.assertEqual(answer["chunk"][0]["room_id"], room)
        waiting = Background(self.bo.ok, "GET",
                             f"{V3}/events?from={answer['end']}&timeout=20000", None, 30)
        time.sleep(0.5)
        self.assertFalse(waiting.done(), "nothing new yet: it waits")
        self.amy.send(room, {"msgtype": "m.text", "body": "woken"})
        woken = waiting.result(timeout=15)
        self.assertEqual(self.bodies(woken["chunk"]), ["woken"])

    def test_initial_sync_visibility_inviter_and_receipts(self):
        listed = self.amy.create_room(preset="public_chat", visibility="public")
        self.bo.join(listed)
        unlisted = self.amy.create_room(preset="private_chat")
        self.assertEqual(self.amy.member_action(unlisted, "invite", self.cy.user_id)[0], 200)
        event_id = self.amy.send(listed, {"msgtype": "m.text", "body": "read me"})
        self.bo.ok("POST", f"{V3}/rooms/{quote(listed)}/receipt/m.read/{quote(event_id)}", {})
        answer = self.amy.ok("GET", f"{V3}/initialSync?limit=1")
        rooms = {r["room_id"]: r for r in answer["rooms"]}
        self.assertEqual(rooms[listed]["visibility"], "public")
        self.assertEqual(rooms[unlisted]["visibility"], "private")
        reads = [r for r in answer["receipts"] if r["room_id"] == listed]
        self.assertEqual([r["type"] for r in reads], ["m.receipt"])
        self.assertIn(self.bo.user_id, reads[0]["content"][event_id]["m.read"])
        invited = {r["room_id"]: r for r in self.cy.ok("GET", f"{V3}/initialSync")["rooms"]}
        self.assertEqual((invited[unlisted]["membership"], invited[unlisted]["inviter"],
                          invited[unlisted]["visibility"]), ("invite", self.amy.user_id, "private"))
        one = self.amy.ok("GET", f"{V3}/rooms/{quote(listed)}/initialSync")
        self.assertEqual((one["membership"], one["visibility"]), ("join", "public"))
        self.assertIn(self.bo.user_id, one["receipts"][0]["content"][event_id]["m.read"])

    def test_archived_lists_left_rooms_and_a_left_room_reads_up_to_the_leave(self):
        room = self.amy.create_room(preset="public_chat")
        self.cy.join(room)
        self.amy.send(room, {"msgtype": "m.text", "body": "before leave"})
        self.cy.leave(room)
        self.amy.send(room, {"msgtype": "m.text", "body": "after leave"})
        plain = self.cy.ok("GET", f"{V3}/initialSync?limit=5")
        self.assertNotIn(room, [r["room_id"] for r in plain["rooms"]])
        for prefix in (V3, R0):
            archived = self.cy.ok("GET", f"{prefix}/initialSync?limit=5&archived=true")
            (left,) = [r for r in archived["rooms"] if r["room_id"] == room]
            self.assertEqual(left["membership"], "leave")
            self.assertEqual(self.bodies(left["messages"]["chunk"]), ["before leave"])
        one = self.cy.ok("GET", f"{V3}/rooms/{quote(room)}/initialSync?limit=5")
        self.assertEqual(one["membership"], "leave")
        self.assertEqual(self.bodies(one["messages"]["chunk"]), ["before leave"])
        status, body = self.cy.call("GET", f"{V3}/initialSync?archived=maybe")
        self.assertEqual((status, body["errcode"]), (400, "M_INVALID_PARAM"))

    def test_events_for_one_room_and_a_non_member_peeking_into_a_world_readable_one(self):
        room = self.amy.create_room(preset="public_chat")
        other = self.amy.create_room(preset="public_chat")
        self.bo.join(room)
        self.bo.join(other)
        path = f"{V3}/events?room_id={quote(room)}"
        before_open = self.bo.ok("GET", f"{path}&timeout=0")["end"]
        self.amy.send(room, {"msgtype": "m.text", "body": "members only"})
        self.amy.put_state(room, "m.room.history_visibility", {"history_visibility": "world_readable"})
        # A member asking for one room gets that room's events only.
        start = self.bo.ok("GET", f"{path}&timeout=0")["end"]
        self.amy.send(other, {"msgtype": "m.text", "body": "elsewhere"})
        self.amy.send(room, {"msgtype": "m.text", "body": "here"})
        got = self.bo.ok("GET", f"{path}&from={start}&timeout=0")
        self.assertEqual(self.bodies(got["chunk"]), ["here"])
        # cy was never in the room: it peeks, from now when no `from` is given.
        first = self.cy.ok("GET", f"{path}&timeout=0")
        self.assertEqual(first["chunk"], [])
        self.amy.send(room, {"msgtype": "m.text", "body": "peeked"})
        peek = self.cy.ok("GET", f"{R0}/events?room_id={quote(room)}&from={first['end']}&timeout=0")
        self.assertEqual(peek["start"], first["end"])
        self.assertEqual(self.bodies(peek["chunk"]), ["peeked"])
        self.assertEqual({e["room_id"] for e in peek["chunk"]}, {room})
        self.assertEqual({e["type"] for e in peek["chunk"]}, {"m.room.message"})
        # From before the room became world_readable: only what came after (the change on).
        since_then = self.cy.ok("GET", f"{path}&from={before_open}&timeout=0")["chunk"]
        self.assertEqual(self.bodies(since_then), ["here", "peeked"])
        self.assertEqual(since_then[0]["type"], "m.room.history_visibility")
        # Nothing new: the peek parks on the room until the next event.
        before = self.srv.metric("atrium_http_parked") or 0
        waiting = Background(self.cy.ok, "GET", f"{path}&from={peek['end']}&timeout=20000", None, 30)
        wait_until(lambda: (self.srv.metric("atrium_http_parked") or 0) > before or waiting.done(),
                   what="the peek parked")
        self.assertFalse(waiting.done(), "nothing new yet: it waits")
        self.amy.send(room, {"msgtype": "m.text", "body": "woken"})
        self.assertEqual(self.bodies(waiting.result(timeout=15)["chunk"]), ["woken"])
        # Not world_readable, unknown, malformed.
        for room_id, want in ((other, (403, "M_FORBIDDEN")), ("!nope:localhost", (404, "M_NOT_FOUND")),
                              ("not-a-room", (400, "M_INVALID_PARAM"))):
            status, body = self.cy.call("GET", f"{V3}/events?room_id={quote(room_id)}&timeout=0")
            self.assertEqual((status, body.get("errcode")), want, room_id)
