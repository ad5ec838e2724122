"""Knocking across servers, two Atrium processes: bob of B knocks on a room of alice's on A
(make_knock / send_knock through A), B's /sync shows the room under rooms.knock with the
stripped state A answered, and A's answer reaches B the way every room's does: alice's
invite (PUT /v2/invite) moves the room to B's invites and bob joins; alice's kick (a PDU
for bob's server, which is not in the room) moves it to B's leave; bob's leave withdraws
the knock through A (or, when A cannot take the leave, at B alone). Rooms that take no
knocks refuse them at A, and B keeps nothing.
A fake peer checks A's make_knock / send_knock answers where it must be able to lie.

The tests that stop no server share their servers (one pair; one A for the fake peer's):
each registers users of its own.
"""

import itertools

from accounts import quote, register
from harness import psql
from rooms_client import Client
from test_federation import A_IP, B_IP, FederationTestCase
from test_room_federation import FED, PeerView, TwoServersCase, complete_event

V3 = "/_matrix/client/v3"
_names = itertools.count(1)  # users of their own on the servers the tests share


class KnockAcrossServers:
    """The helpers of the knock tests across two Atrium processes (TwoServersCase's alice on
    A, bob on B)."""

    def knock_room(self, version="10", rule="knock"):
        return self.alice.create_room(
            room_version=version, name="Ask first",
            initial_state=[{"type": "m.room.join_rules", "content": {"join_rule": rule}}])

    def knock(self, room, reason=None):
        body = {"reason": reason} if reason else {}
        return self.bob.call("POST", f"{V3}/knock/{quote(room)}?server_name={quote(self.a.server_name)}",
                             body, timeout=30)

    def bob_sync_has(self, section, room):
        return room in self.bob.sync()["rooms"][section]


class KnockFederationTest(KnockAcrossServers, TwoServersCase):
    """One pair of servers for the class (a start costs about a CPU-second)."""

    def setUp(self):
        self.a = self.start_class_fed(A_IP)
        self.b = self.start_class_fed(B_IP)
        n = next(_names)
        self.alice = Client(self.a, register(self.a, f"alice{n}"))
        self.bob = Client(self.b, register(self.b, f"bob{n}"))

    def test_a_knock_crosses_servers_then_an_invite_lets_the_knocker_join(self):
        room = self.knock_room()
        status, body = self.knock(room, reason="Hello?")
        self.assertEqual((status, body), (200, {"room_id": room}))
        # A stored bob's knock, signed by B, as the room's current state.
        self.assertEqual(self.membership(self.alice, room, self.bob.user_id), "knock")
        [(origin,)] = psql(f"SELECT origin FROM events WHERE room_id = '{room}' AND type = 'm.room.member'"
                           f" AND state_key = '{self.bob.user_id}'", database=self.a.database)
        self.assertEqual(origin, self.b.server_name)
        # B's sync: rooms.knock with A's stripped state and the knock last.
        knocked = self.bob.sync()["rooms"]["knock"][room]["knock_state"]["events"]
        self.assertIn({"name": "Ask first"}, [e["content"] for e in knocked if e["type"] == "m.room.name"])
        self.assertIn({"join_rule": "knock"},
                      [e["content"] for e in knocked if e["type"] == "m.room.join_rules"])
        last = knocked[-1]
        self.assertEqual((last["type"], last["state_key"], last["content"]["membership"],
                          last["content"]["reason"]), ("m.room.member", self.bob.user_id, "knock", "Hello?"))
        # alice accepts with an invite: B's sync moves the room from knock to invite.
        since = self.bob.sync()["next_batch"]
        status, body = self.alice.call("POST", f"{V3}/rooms/{quote(room)}/invite",
                                       {"user_id": self.bob.user_id}, timeout=30)
        self.assertEqual((status, body), (200, {}))
        moved = self.bob.sync(since=since)
        self.assertIn(room, moved["rooms"]["invite"])
        self.assertNotIn(room, moved["rooms"]["knock"])
        # bob joins through A.
        self.assertEqual(self.join(room)[0], 200)
        self.assertEqual(self.membership(self.alice, room, self.bob.user_id), "join")
        self.assertIn(room, self.bob.sync()["rooms"]["join"])
        self.assertNotIn(room, self.bob.sync()["rooms"]["knock"])

    def test_a_kick_at_the_resident_rejects_the_knock_at_the_knockers_server(self):
        room = self.knock_room()
        self.assertEqual(self.knock(room)[0], 200)
        since = self.bob.sync()["next_batch"]
        status, body = self.alice.call("POST", f"{V3}/rooms/{quote(room)}/kick",
                                       {"user_id": self.bob.user_id, "reason": "No"}, timeout=30)
        self.assertEqual(status, 200, body)
        self.assertEqual(self.membership(self.alice, room, self.bob.user_id), "leave")
        # The kick reaches B although B is not in the room.
        self.wait_until("B to learn of the rejection", lambda: not self.bob_sync_has("knock", room))
        self.assertIn(room, self.bob.sync(since=since)["rooms"]["leave"])
        [(membership, sender)] = psql(
            f"SELECT membership, sender FROM memberships WHERE room_id = '{room}'"
            f" AND user_id = '{self.bob.user_id}' ORDER BY stream_pos DESC LIMIT 1",
            database=self.b.database)
        self.assertEqual((membership, sender), ("leave", self.alice.user_id))
        # bob may knock again (a leave ends a knock).
        self.assertEqual(self.knock(room)[0], 200)
        self.wait_until("B's knock again", lambda: self.bob_sync_has("knock", room))

    def test_the_knocker_withdraws_the_knock_by_leaving_through_the_resident(self):
        room = self.knock_room()
        self.assertEqual(self.knock(room)[0], 200)
        status, body = self.bob.call("POST", f"{V3}/rooms/{quote(room)}/leave", {}, timeout=30)
        self.assertEqual((status, body), (200, {}))
        self.assertEqual(self.membership(self.alice, room, self.bob.user_id), "leave")
        self.assertFalse(self.bob_sync_has("knock", room))

    def test_rooms_that_take_no_knocks_refuse_them_at_the_resident(self):
        for version, rule in (("10", "invite"), ("10", "public"), ("6", "knock")):
            room = self.knock_room(version=version, rule=rule)
            status, body = self.knock(room)
            self.assertEqual((status, body.get("errcode")), (403, "M_FORBIDDEN"), (version, rule, body))
            self.assertIsNone(self.membership(self.alice, room, self.bob.user_id))
            self.assertEqual(psql(f"SELECT count(*) FROM memberships WHERE room_id = '{room}'",
                                  database=self.b.database), [["0"]])
            self.assertFalse(self.bob_sync_has("knock", room))


class KnockResidentDownTest(KnockAcrossServers, TwoServersCase):
    """A test that stops A: servers of its own."""

    def test_a_knock_is_withdrawn_here_when_the_resident_cannot_take_the_leave(self):
        room = self.knock_room()
        self.assertEqual(self.knock(room)[0], 200)
        self.a.stop()
        status, body = self.bob.call("POST", f"{V3}/rooms/{quote(room)}/leave", {}, timeout=60)
        self.assertEqual((status, body), (200, {}))
        self.assertFalse(self.bob_sync_has("knock", room))
        [(membership, sender)] = psql(
            f"SELECT membership, sender FROM memberships WHERE room_id = '{room}'"
            f" AND user_id = '{self.bob.user_id}' ORDER BY stream_pos DESC LIMIT 1",
            database=self.b.database)
        self.assertEqual((membership, sender), ("leave", self.bob.user_id))
        # Nothing left to withdraw.
        status, body = self.bob.call("POST", f"{V3}/rooms/{quote(room)}/leave", {}, timeout=60)
        self.assertNotEqual(status, 200, body)


class ResidentKnockTest(FederationTestCase):
    """A as the resident server of a room a fake peer's user knocks on (one A for the
    class; a fake peer, with a name of its own, per test)."""

    def setUp(self):
        self.peer = self.fake_peer()
        self.a = self.start_class_fed(A_IP)
        self.alice = Client(self.a, register(self.a, f"alice{next(_names)}"))
        self.view = PeerView(self.a, self.peer)
        self.user = f"@pat:{self.peer.server_name}"

    def knock_room(self, **extra):
        return self.alice.create_room(
            name="Ask first", topic="Knock", initial_state=[
                {"type": "m.room.join_rules", "content": {"join_rule": "knock"}}], **extra)

    def make(self, room, user=None, ver="ver=10&ver=11"):
        return self.view.get(f"{FED}/v1/make_knock/{quote(room)}/{quote(user or self.user)}?{ver}")

    def test_make_knock_and_send_knock_answer_a_template_and_the_stripped_state(self):
        room = self.knock_room()
        status, made = self.make(room)
        self.assertEqual(status, 200, made)
        tmpl = made["event"]
        self.assertEqual((made["room_version"], tmpl["type"], tmpl["state_key"], tmpl["content"]),
                         ("10", "m.room.member", self.user, {"membership": "knock"}))
        ev, event_id = complete_event(tmpl, self.peer.server_name, self.peer.key)
        status, answer = self.view.send("PUT", f"{FED}/v1/send_knock/{quote(room)}/{quote(event_id)}", ev)
        self.assertEqual(status, 200, answer)
        by_type = {e["type"]: e for e in answer["knock_room_state"]}
        self.assertEqual(by_type["m.room.join_rules"]["content"], {"join_rule": "knock"})
        self.assertEqual(by_type["m.room.name"]["content"], {"name": "Ask first"})
        self.assertEqual(by_type["m.room.create"]["sender"], self.alice.user_id)
        for e in answer["knock_room_state"]:
            self.assertEqual(set(e), {"type", "state_key", "sender", "content"})
        body = self.alice.state(room, "m.room.member", self.user)
        self.assertEqual(body["membership"], "knock")

    def test_make_knock_names_the_version_refuses_other_servers_users_and_old_versions(self):
        room = self.knock_room()
        status, body = self.make(room, ver="ver=9")
        self.assertEqual((status, body.get("errcode"), body.get("room_version")),
                         (400, "M_INCOMPATIBLE_ROOM_VERSION", "10"), body)
        status, body = self.make(room, user="@mallory:elsewhere.example")
        self.assertEqual((status, body.get("errcode")), (403, "M_FORBIDDEN"), body)
        old = self.alice.create_room(room_version="6", initial_state=[
            {"type": "m.room.join_rules", "content": {"join_rule": "knock"}}])
        status, body = self.make(old, ver="ver=6")
        self.assertEqual((status, body.get("errcode")), (403, "M_FORBIDDEN"), body)
        invite_only = self.alice.create_room(preset="private_chat")
        status, body = self.make(invite_only)
        self.assertEqual((status, body.get("errcode")), (403, "M_FORBIDDEN"), body)

    def test_send_knock_refuses_another_membership_and_an_acl_denied_server(self):
        room = self.knock_room()
        _, made = self.make(room)
        ev, event_id = complete_event(made["event"], self.peer.server_name, self.peer.key,
                                      content={"membership": "join"})
        status, body = self.view.send("PUT", f"{FED}/v1/send_knock/{quote(room)}/{quote(event_id)}", ev)
        self.assertEqual((status, body.get("errcode")), (400, "M_BAD_JSON"), body)
        self.alice.put_state(room, "m.room.server_acl", {"allow": [self.a.server_name]})
        status, body = self.make(room)
        self.assertEqual((status, body.get("errcode")), (403, "M_FORBIDDEN"), body)
