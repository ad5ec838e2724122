"""Knocking on a room of this server (POST /knock/{roomIdOrAlias}): the knock is a member
event the room's members see, the knocker's /sync lists the room under rooms.knock with
its stripped state (knock_state), an invite accepts the knock and a kick rejects it, the
knocker withdraws it by leaving; rooms that take no knocks (their join rule, their room
version before 7) and knockers the auth rules refuse (banned, already joined) get 403.

One server and three registered users serve the whole class; each test makes its own room.
"""

import unittest

from rooms_client import SharedServerTest, V3, quote


def knock_path(target, **query):
    q = "&".join(f"{k}={quote(v)}" for k, v in query.items())
    return f"{V3}/knock/{quote(target)}" + (f"?{q}" if q else "")


class KnockTest(SharedServerTest):
    USERS = ("alice", "bob", "carol")

    def knock_room(self, version="10", rule="knock", **extra):
        """A room of alice's that takes knocks (a name and a topic for the stripped state)."""
        return self.alice.create_room(
            room_version=version, name="Knock knock", topic="Who is there",
            initial_state=[{"type": "m.room.join_rules", "content": {"join_rule": rule}}], **extra)

    def knock(self, who, target, body=None, **query):
        return who.call("POST", knock_path(target, **query), {} if body is None else body)

    def member(self, room, user_id):
        return self.alice.state(room, "m.room.member", user_id)

    def assertForbidden(self, answer):
        status, body = answer
        self.assertEqual((status, (body or {}).get("errcode")), (403, "M_FORBIDDEN"), body)

    def test_a_knock_is_seen_by_the_room_and_in_the_knockers_sync_then_an_invite_lets_them_join(self):
        room = self.knock_room()
        since = self.bob.sync()["next_batch"]
        status, body = self.knock(self.bob, room, {"reason": "Let me in"})
        self.assertEqual((status, body), (200, {"room_id": room}))
        member = self.member(room, self.bob.user_id)
        self.assertEqual((member["membership"], member["reason"]), ("knock", "Let me in"))
        # The room's members see the knock in their timeline.
        alice_sync = self.alice.sync()
        timeline = alice_sync["rooms"]["join"][room]["timeline"]["events"]
        self.assertIn(("m.room.member", self.bob.user_id, "knock"),
                      [(e["type"], e.get("state_key"), e["content"].get("membership")) for e in timeline])
        # The knocker's sync, incremental and initial: rooms.knock with the stripped state.
        for answer in (self.bob.sync(since=since), self.bob.sync()):
            self.assertNotIn(room, answer["rooms"]["join"])
            knocked = answer["rooms"]["knock"][room]["knock_state"]["events"]
            by_type = {(e["type"], e["state_key"]): e for e in knocked}
            self.assertEqual(by_type[("m.room.join_rules", "")]["content"], {"join_rule": "knock"})
            self.assertEqual(by_type[("m.room.name", "")]["content"], {"name": "Knock knock"})
            self.assertEqual(by_type[("m.room.create", "")]["content"]["room_version"], "10")
            mine = by_type[("m.room.member", self.bob.user_id)]
            self.assertEqual((mine["content"]["membership"], mine["sender"]), ("knock", self.bob.user_id))
            for e in knocked:
                self.assertEqual(set(e), {"type", "state_key", "sender", "content"})
        # A knock may follow a knock (only ban, invite and join refuse one).
        self.assertEqual(self.knock(self.bob, room)[0], 200)
        # The bare join is refused until someone accepts.
        self.assertForbidden(self.bob.call("POST", f"{V3}/rooms/{quote(room)}/join", {}))
        since = self.bob.sync()["next_batch"]
        self.assertEqual(self.alice.member_action(room, "invite", self.bob.user_id)[0], 200)
        moved = self.bob.sync(since=since)
        self.assertIn(room, moved["rooms"]["invite"])
        self.assertNotIn(room, moved["rooms"]["knock"])
        self.bob.join(room)
        self.assertEqual(self.member(room, self.bob.user_id)["membership"], "join")
        self.assertNotIn(room, self.bob.sync()["rooms"]["knock"])
        # Joined: a knock is refused (the auth rules).
        self.assertForbidden(self.knock(self.bob, room))

    def test_a_kick_rejects_a_knock_and_a_leave_withdraws_one(self):
        room = self.knock_room()
        self.assertEqual(self.knock(self.bob, room)[0], 200)
        since = self.bob.sync()["next_batch"]
        status, body = self.alice.member_action(room, "kick", self.bob.user_id, reason="Not today")
        self.assertEqual(status, 200, body)
        self.assertEqual(self.member(room, self.bob.user_id)["membership"], "leave")
        rejected = self.bob.sync(since=since)
        self.assertIn(room, rejected["rooms"]["leave"])
        self.assertNotIn(room, rejected["rooms"]["knock"])
        self.assertNotIn(room, self.bob.sync()["rooms"]["knock"])
        # A knock again, withdrawn by the knocker (a standing knock is not forgotten).
        self.assertEqual(self.knock(self.carol, room)[0], 200)
        status, body = self.carol.call("POST", f"{V3}/rooms/{quote(room)}/forget", {})
        self.assertEqual(status, 400, body)
        self.carol.leave(room)
        self.assertEqual(self.member(room, self.carol.user_id)["membership"], "leave")
        self.assertNotIn(room, self.carol.sync()["rooms"]["knock"])
        # Banned: no knock.
        self.assertEqual(self.alice.member_action(room, "ban", self.carol.user_id)[0], 200)
        self.assertForbidden(self.knock(self.carol, room))

    def test_rooms_that_take_no_knocks_refuse_them(self):
        for rule in ("invite", "public"):
            room = self.knock_room(rule=rule)
            self.assertForbidden(self.knock(self.bob, room))
            self.assertEqual(self.member(room, self.alice.user_id)["membership"], "join")
            status, _ = self.alice.call(
                "GET", f"{V3}/rooms/{quote(room)}/state/m.room.member/{quote(self.bob.user_id)}")
            self.assertEqual(status, 404)
        # Room version 6 has no knocks, whatever its join rule says.
        self.assertForbidden(self.knock(self.bob, self.knock_room(version="6")))
        # knock_restricted exists from version 10.
        room = self.knock_room(version="10", rule="knock_restricted")
        self.assertEqual(self.knock(self.bob, room)[0], 200)
        self.assertForbidden(self.knock(self.carol, self.knock_room(version="9", rule="knock_restricted")))
        self.assertEqual(self.knock(self.carol, self.knock_room(version="7"))[0], 200)

    def test_bad_targets_are_refused(self):
        self.assertEqual(self.knock(self.bob, "not-a-room")[0], 400)
        status, body = self.knock(self.bob, f"!nosuchroom:{self.srv.server_name}")
        self.assertEqual((status, body.get("errcode")), (404, "M_NOT_FOUND"), body)
        status, body = self.bob.call("POST", knock_path("!x:localhost"), {"reason": 7})
        self.assertEqual(status, 400, body)

    def test_unauthenticated_knock_is_refused(self):
        room = self.knock_room()
        status, body = self.srv.json("POST", knock_path(room), {})
        self.assertEqual((status, body.get("errcode")), (401, "M_MISSING_TOKEN"), body)


if __name__ == "__main__":
    unittest.main()
