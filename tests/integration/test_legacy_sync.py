"""The deprecated sync APIs older clients and bridges still use: GET /initialSync (every
room with its newest messages, state, account data, and presence), GET
/rooms/{roomId}/initialSync (one room; for a room the user is not in, what anyone may read
of it while it is world_readable, else 403) and GET /events
(the events after `from`, parking until there are some), on the v3 and r0 prefixes."""

import time

from common import Background
from rooms_client import SharedServerTest, V3, quote

R0 = "/_matrix/client/r0"


class LegacySyncTest(SharedServerTest):
    USERS = ("amy", "bo", "cy")

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
