"""Room federation between two real servers: two Atrium processes (A's users create rooms,
B's users join them, talk, leave, rejoin, are banned) and the same joins against a real
Synapse, both directions (skipped, saying so, when the Synapse peer is absent). Split from
test_room_federation.py, whose helpers (TwoServersCase) these build on, to keep each file
inside ctest's time budget under the sanitizers.
"""

import json
import re
import time
import uuid

from accounts import quote, register
from federation_support import verify_json
from rooms_client import Client, redact
from harness import psql
import test_federation_synapse
from test_room_federation import TwoServersCase

class TwoServersTest(TwoServersCase):
    """A's users create rooms, B's users join them. The tests share one A and one B (each
    test its own alice, bob and rooms; none stops a server): start_class_fed."""

    def setUp(self):
        self.start_shared_pair()

    def test_a_user_joins_a_room_on_another_server_and_sees_it_in_sync(self):
        room = self.alice.create_room(preset="public_chat", name="Lobby")
        self.alice.send(room, {"msgtype": "m.text", "body": "hello from A"})
        status, body = self.join(room)
        self.assertEqual((status, body), (200, {"room_id": room}))
        # B's sync: the room, its name, alice and bob joined, A's message.
        sync = self.bob.sync()
        joined = sync["rooms"]["join"][room]
        events = joined["state"]["events"] + joined["timeline"]["events"]
        self.assertIn("Lobby", [e["content"].get("name") for e in events if e["type"] == "m.room.name"])
        members = {e["state_key"]: e["content"]["membership"] for e in events
                   if e["type"] == "m.room.member"}
        self.assertEqual(members, {self.alice.user_id: "join", self.bob.user_id: "join"})
        # A has bob's join, delivered by B, signed by B.
        status, state = self.alice.call("GET", f"/_matrix/client/v3/rooms/{quote(room)}/members")
        self.assertIn(self.bob.user_id, {e["state_key"] for e in state["chunk"]
                                         if e["content"]["membership"] == "join"})
        [(event_id, origin)] = psql(
            f"SELECT event_id, origin FROM events WHERE room_id = '{room}' AND type = 'm.room.member'"
            f" AND state_key = '{self.bob.user_id}'", database=self.a.database)
        self.assertEqual(origin, self.b.server_name)
        status, _, doc = self.b.fed_request("GET", "/_matrix/key/v2/server")
        [(key_id, key)] = doc["verify_keys"].items()
        [(pdu,)] = psql(f"SELECT pdu FROM events WHERE event_id = '{event_id}'", database=self.a.database)
        self.assertTrue(verify_json(redact(json.loads(pdu), "10"), self.b.server_name, key_id, key["key"]))
        # Both servers agree on the room's current state.
        def state_ids(srv):
            return sorted(r[0] for r in psql(f"SELECT event_id FROM current_state WHERE room_id = '{room}'",
                                             database=srv.database))
        self.assertEqual(state_ids(self.a), state_ids(self.b))
        # B's next event in the room follows the join.
        status, body = self.bob.call("GET", f"/_matrix/client/v3/rooms/{quote(room)}/state/m.room.name")
        self.assertEqual((status, body), (200, {"name": "Lobby"}))

    def test_a_join_through_another_server_keeps_the_bodys_extra_keys(self):
        # POST /join/{roomIdOrAlias} puts the body's other keys in the membership event, as
        # for a local room (and as Synapse does); membership stays the server's.
        room = self.alice.create_room(preset="public_chat")
        body = {"reason": "saying hi", "org.example.flag": {"kept": True},
                "displayname": "Bob of B", "membership": "leave"}
        status, answer = self.bob.call(
            "POST", f"/_matrix/client/v3/join/{quote(room)}?server_name={quote(self.a.server_name)}",
            body, timeout=30)
        self.assertEqual((status, answer), (200, {"room_id": room}))
        content = self.alice.ok(
            "GET", f"/_matrix/client/v3/rooms/{quote(room)}/state/m.room.member/{quote(self.bob.user_id)}")
        self.assertEqual(content["membership"], "join")
        self.assertEqual(content["reason"], "saying hi")
        self.assertEqual(content["org.example.flag"], {"kept": True})
        self.assertEqual(content["displayname"], "Bob of B")
        # A per-room profile of the wrong type is refused, as for a local room.
        other = self.alice.create_room(preset="public_chat")
        status, answer = self.bob.call(
            "POST", f"/_matrix/client/v3/join/{quote(other)}?server_name={quote(self.a.server_name)}",
            {"displayname": 5}, timeout=30)
        self.assertEqual((status, answer.get("errcode")), (400, "M_BAD_JSON"))

    def test_a_restricted_room_is_joined_across_servers_through_the_residents_authoriser(self):
        # "Members of the space may join": bob of B is in the space, so A's make_join names
        # alice as the authoriser and A co-signs bob's join; carol of B, not in the space,
        # is refused.
        space = self.alice.create_room(preset="public_chat", creation_content={"type": "m.space"})
        room = self.alice.create_room(preset="private_chat", room_version="10", initial_state=[
            {"type": "m.room.join_rules", "content": {"join_rule": "restricted", "allow": [
                {"type": "m.room_membership", "room_id": space}]}}])
        self.assertEqual(self.join(space), (200, {"room_id": space}))
        self.assertEqual(self.join(room), (200, {"room_id": room}))
        [(pdu,)] = psql(f"SELECT pdu FROM events WHERE room_id = '{room}' AND type = 'm.room.member'"
                        f" AND state_key = '{self.bob.user_id}'", database=self.a.database)
        join = json.loads(pdu)
        self.assertEqual(join["content"]["join_authorised_via_users_server"], self.alice.user_id)
        self.assertEqual(set(join["signatures"]), {self.a.server_name, self.b.server_name})
        # B stored the co-signed copy too, and bob talks in the room.
        [(theirs,)] = psql(f"SELECT pdu FROM events WHERE room_id = '{room}' AND type = 'm.room.member'"
                           f" AND state_key = '{self.bob.user_id}'", database=self.b.database)
        self.assertEqual(set(json.loads(theirs)["signatures"]), {self.a.server_name, self.b.server_name})
        self.bob.send(room, {"msgtype": "m.text", "body": "in through the space"})
        carol = Client(self.b, register(self.b, f"carol{uuid.uuid4().hex[:8]}"))
        status, body = carol.call(
            "POST", f"/_matrix/client/v3/join/{quote(room)}?server_name={quote(self.a.server_name)}",
            {}, timeout=30)
        self.assertEqual(status, 403, body)
        self.assertEqual(body["errcode"], "M_FORBIDDEN")

    def test_joining_an_invite_only_room_is_refused_with_the_residents_answer(self):
        room = self.alice.create_room(preset="private_chat")
        status, body = self.join(room)
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"), body)
        self.assertEqual(psql(f"SELECT count(*) FROM rooms WHERE room_id = '{room}'",
                              database=self.b.database), [["0"]])

    def test_joining_through_a_server_that_is_not_there_fails_cleanly(self):
        status, body = self.bob.call("POST", f"/_matrix/client/v3/join/{quote('!nope:127.0.0.99:1')}",
                                     {}, timeout=60)
        self.assertIn(status, (502, 504), body)

    def invite(self, room, user_id):
        return self.alice.call("POST", f"/_matrix/client/v3/rooms/{quote(room)}/invite",
                               {"user_id": user_id}, timeout=30)

    def test_an_invite_crosses_servers_shows_in_sync_and_is_accepted(self):
        room = self.alice.create_room(preset="private_chat", name="Secret")
        self.assertEqual(self.invite(room, self.bob.user_id), (200, {}))
        # A stored the invite with B's signature beside its own.
        [(pdu,)] = psql(f"SELECT pdu FROM events WHERE room_id = '{room}' AND type = 'm.room.member'"
                        f" AND state_key = '{self.bob.user_id}'", database=self.a.database)
        self.assertEqual(set(json.loads(pdu)["signatures"]), {self.a.server_name, self.b.server_name})
        # B's sync shows the invite with the room's stripped state.
        sync = self.bob.sync()
        invite = sync["rooms"]["invite"][room]["invite_state"]["events"]
        self.assertIn("Secret", [e["content"].get("name") for e in invite])
        self.assertEqual(invite[-1]["content"]["membership"], "invite")
        self.assertEqual(invite[-1]["sender"], self.alice.user_id)
        # Accepting: a join through A (the room is invite only: the invite lets bob in).
        status, body = self.bob.call("POST", f"/_matrix/client/v3/rooms/{quote(room)}/join", {},
                                     timeout=30)
        self.assertEqual((status, body), (200, {"room_id": room}))
        sync = self.bob.sync(since=sync["next_batch"])
        self.assertIn(room, sync["rooms"]["join"])
        self.assertNotIn(room, sync["rooms"]["invite"])

    def test_a_declined_invite_leaves_through_the_inviting_server(self):
        room = self.alice.create_room(preset="private_chat")
        self.assertEqual(self.invite(room, self.bob.user_id)[0], 200)
        first = self.bob.sync()
        self.assertIn(room, first["rooms"]["invite"])
        self.assertEqual(self.bob.call("POST", f"/_matrix/client/v3/rooms/{quote(room)}/leave", {},
                                       timeout=30), (200, {}))
        members = self.alice.ok("GET", f"/_matrix/client/v3/rooms/{quote(room)}/members")["chunk"]
        self.assertEqual({e["state_key"]: e["content"]["membership"] for e in members}[self.bob.user_id],
                         "leave")
        later = self.bob.sync(since=first["next_batch"])
        self.assertNotIn(room, later["rooms"]["invite"])

    def test_create_room_invites_a_user_of_another_server_through_their_server(self):
        status, body = self.alice.call("POST", "/_matrix/client/v3/createRoom",
                                       {"preset": "trusted_private_chat", "is_direct": True,
                                        "name": "Direct", "invite": [self.bob.user_id]},
                                       timeout=30)
        self.assertEqual(status, 200, body)
        room = body["room_id"]
        # B signed the invite; bob sees it with the room's stripped state and accepts it.
        [(pdu,)] = psql(f"SELECT pdu FROM events WHERE room_id = '{room}' AND type = 'm.room.member'"
                        f" AND state_key = '{self.bob.user_id}'", database=self.a.database)
        invite = json.loads(pdu)
        self.assertEqual(set(invite["signatures"]), {self.a.server_name, self.b.server_name})
        self.assertEqual(invite["content"], {"membership": "invite", "is_direct": True})
        sync = self.bob.sync()
        stripped = sync["rooms"]["invite"][room]["invite_state"]["events"]
        self.assertIn("Direct", [e["content"].get("name") for e in stripped])
        self.assertEqual(self.bob.call("POST", f"/_matrix/client/v3/rooms/{quote(room)}/join", {},
                                       timeout=30), (200, {"room_id": room}))
        # The preset made the invitee an admin of the room, as for a local invitee.
        levels = self.alice.state(room, "m.room.power_levels")
        self.assertEqual(levels["users"][self.bob.user_id], 100)
        # A user the other server does not have: its refusal is the answer.
        status, body = self.alice.call("POST", "/_matrix/client/v3/createRoom",
                                       {"invite": [f"@nobody:{self.b.server_name}"]}, timeout=30)
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"), body)

    def test_inviting_a_user_the_other_server_does_not_have_is_its_404(self):
        room = self.alice.create_room(preset="private_chat")
        status, body = self.invite(room, f"@nobody:{self.b.server_name}")
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"), body)
        self.assertEqual(psql(f"SELECT count(*) FROM events WHERE room_id = '{room}'"
                              f" AND state_key = '@nobody:{self.b.server_name}'",
                              database=self.a.database), [["0"]])

    def test_both_users_talk_and_each_sees_the_others_messages_in_order(self):
        labels = {"outcome": "accepted", "check": ""}
        accepted = self.b.metric("atrium_rooms_inbound_pdus_total", labels) or 0
        room = self.public_room_with_bob()
        since = self.bob.sync()["next_batch"]
        said = []
        for i, (who, other) in enumerate([(self.alice, self.bob), (self.bob, self.alice)] * 2):
            body = f"{'ab'[i % 2]}{i // 2 + 1}"
            who.send(room, {"msgtype": "m.text", "body": body})
            said.append(body)
            self.wait_until(f"{body} at {other.user_id}", lambda: self.bodies(other, room) == said)
        self.assertEqual(self.bodies(self.alice, room), ["a1", "b1", "a2", "b2"])
        self.assertEqual(self.bodies(self.bob, room), ["a1", "b1", "a2", "b2"])
        # In bob's sync too, in order, with alice's as alice's.
        sync = self.bob.sync(since=since)
        timeline = sync["rooms"]["join"][room]["timeline"]["events"]
        msgs = [(e["sender"], e["content"]["body"]) for e in timeline if e["type"] == "m.room.message"]
        self.assertEqual(msgs, [(self.alice.user_id, "a1"), (self.bob.user_id, "b1"),
                                (self.alice.user_id, "a2"), (self.bob.user_id, "b2")])
        # B accepted alice's two messages (a delta: B serves the class's other tests too).
        self.assertGreaterEqual(self.b.metric("atrium_rooms_inbound_pdus_total", labels) - accepted, 2)

    def test_a_user_leaves_and_rejoins_and_a_ban_keeps_them_out(self):
        room = self.public_room_with_bob()
        self.bob.leave(room)
        self.wait_until("bob's leave at A", lambda: self.membership(self.alice, room, self.bob.user_id) == "leave")
        self.alice.send(room, {"msgtype": "m.text", "body": "while bob was away"})
        # Rejoining: B has nobody in the room, so through A again; it learns what it missed.
        self.assertEqual(self.join(room)[0], 200)
        self.assertEqual(self.membership(self.alice, room, self.bob.user_id), "join")
        self.bob.send(room, {"msgtype": "m.text", "body": "back"})
        self.wait_until("bob's message at A", lambda: "back" in self.bodies(self.alice, room))
        # A ban reaches B; bob can no longer send, and B's copy agrees.
        status, _ = self.alice.member_action(room, "ban", self.bob.user_id)
        self.assertEqual(status, 200)
        self.wait_until("the ban at B", lambda: self.membership(self.bob, room, self.bob.user_id) == "ban")
        status, body = self.bob.call("PUT", f"/_matrix/client/v3/rooms/{quote(room)}/send/m.room.message/t-banned",
                                     {"msgtype": "m.text", "body": "let me in"})
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"))
        self.assertNotIn("let me in", self.bodies(self.alice, room))

    def test_rooms_of_every_version_1_to_11_are_joined_and_talked_in_across_servers(self):
        for version in [str(n) for n in range(1, 12)]:
            with self.subTest(room_version=version):
                room = self.alice.create_room(preset="public_chat", room_version=version)
                self.alice.send(room, {"msgtype": "m.text", "body": f"a{version}"})
                self.assertEqual(self.join(room), (200, {"room_id": room}))
                self.bob.send(room, {"msgtype": "m.text", "body": f"b{version}"})
                self.wait_until(f"bob's message at A (v{version})",
                                lambda: self.bodies(self.alice, room) == [f"a{version}", f"b{version}"])
                self.alice.put_state(room, "m.room.topic", {"topic": f"t{version}"})
                self.wait_until(f"the topic at B (v{version})", lambda: self.bob.call(
                    "GET", f"/_matrix/client/v3/rooms/{quote(room)}/state/m.room.topic")
                    == (200, {"topic": f"t{version}"}))
                self.assertEqual(self.bodies(self.bob, room), [f"a{version}", f"b{version}"])
                def state_ids(srv):
                    return sorted(r[0] for r in psql(
                        f"SELECT event_id FROM current_state WHERE room_id = '{room}'", database=srv.database))
                self.assertEqual(state_ids(self.a), state_ids(self.b))
                # v1-2: the PDU each server stored as signed names its references as
                # [event ID, {"sha256": reference hash}] pairs; v3+ as plain IDs.
                [(pdu,)] = psql(f"SELECT pdu FROM events WHERE room_id = '{room}' AND type = 'm.room.member'"
                                f" AND state_key = '{self.bob.user_id}'", database=self.a.database)
                pdu = json.loads(pdu)
                refs = pdu["prev_events"] + pdu["auth_events"]
                if version in ("1", "2"):
                    self.assertTrue(pdu["event_id"].endswith(":" + self.b.server_name), pdu)
                    self.assertTrue(all(isinstance(r, list) and set(r[1]) == {"sha256"} for r in refs), pdu)
                else:
                    self.assertNotIn("event_id", pdu)
                    self.assertTrue(all(isinstance(r, str) for r in refs), pdu)
                # A leave through B, seen at A, then a rejoin and a message after it.
                self.assertEqual(self.bob.call("POST", f"/_matrix/client/v3/rooms/{quote(room)}/leave",
                                               {}, timeout=30), (200, {}))
                self.wait_until(f"bob's leave at A (v{version})",
                                lambda: self.membership(self.alice, room, self.bob.user_id) == "leave")
                self.assertEqual(self.join(room), (200, {"room_id": room}))
                self.bob.send(room, {"msgtype": "m.text", "body": f"back{version}"})
                self.wait_until(f"bob's message after his rejoin at A (v{version})",
                                lambda: self.bodies(self.alice, room)[-1:] == [f"back{version}"])
                self.assertEqual(self.membership(self.alice, room, self.bob.user_id), "join")

    def test_an_invite_to_a_version_1_or_2_room_crosses_servers_and_is_accepted(self):
        for version in ("1", "2"):
            with self.subTest(room_version=version):
                room = self.alice.create_room(preset="private_chat", room_version=version)
                self.assertEqual(self.invite(room, self.bob.user_id), (200, {}))
                self.assertIn(room, self.bob.sync()["rooms"]["invite"])
                self.assertEqual(self.bob.call("POST", f"/_matrix/client/v3/rooms/{quote(room)}/join", {},
                                               timeout=30), (200, {"room_id": room}))
                self.assertEqual(self.membership(self.alice, room, self.bob.user_id), "join")


SYNAPSE_ATRIUM_IP = "127.0.0.53"


class SynapseRoomsTest(test_federation_synapse.SynapseInteropTest):
    """The same joins against a real Synapse, both directions. Skipped, saying so, when the
    Synapse peer is absent (SynapseInteropTest's skip)."""

    test_keys_and_signed_requests_both_ways = None  # SynapseInteropTest's own test runs there

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.class_syn = cls.start_class_synapse()

    def setUp(self):
        # One Atrium as one Synapse for the class: each test its own alice, sam and rooms,
        # none stops a server or reads a counter.
        self.a = self.start_class_fed(SYNAPSE_ATRIUM_IP)
        self.syn = self.class_syn
        self.alice = Client(self.a, register(self.a, f"alice{uuid.uuid4().hex[:8]}"))
        self.sam = json.loads(__import__("test_federation_synapse").peer(
            "register", self.syn["dir"], self.peer_user("sam"), "sam-password-1"))

    def sam_call(self, method, path, body=None):
        return self.synapse_json(self.syn, method, path, token=self.sam["access_token"], body=body)

    def sam_bodies(self, room):
        status, body = self.sam_call("GET", f"/_matrix/client/v3/rooms/{quote(room)}/messages?dir=b&limit=50")
        return [e["content"].get("body") for e in reversed(body.get("chunk", []))
                if e["type"] == "m.room.message"] if status == 200 else []

    def alice_bodies(self, room):
        chunk = self.alice.ok("GET", f"/_matrix/client/v3/rooms/{quote(room)}/messages?dir=b&limit=50")["chunk"]
        return [e["content"].get("body") for e in reversed(chunk) if e["type"] == "m.room.message"]

    def wait_until(self, what, predicate, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if predicate():
                return
            time.sleep(0.2)
        self.fail(f"timed out waiting for {what}")

    def atrium_joins_a_synapse_room_and_both_talk(self, **create):
        status, body = self.sam_call("POST", "/_matrix/client/v3/createRoom",
                                     {"preset": "public_chat", "name": "At Synapse", **create})
        self.assertEqual(status, 200, body)
        room = body["room_id"]
        self.sam_call("PUT", f"/_matrix/client/v3/rooms/{quote(room)}/send/m.room.message/s1",
                      {"msgtype": "m.text", "body": "before alice"})
        status, body = self.alice.call("POST", f"/_matrix/client/v3/join/{quote(room)}"
                                       f"?server_name={quote(self.syn['name'])}", {}, timeout=60)
        self.assertEqual((status, body), (200, {"room_id": room}), body)
        sync = self.alice.sync()
        self.assertIn(room, sync["rooms"]["join"])
        self.alice.send(room, {"msgtype": "m.text", "body": "hello synapse"})
        self.wait_until("alice's message at Synapse", lambda: "hello synapse" in self.sam_bodies(room))
        self.sam_call("PUT", f"/_matrix/client/v3/rooms/{quote(room)}/send/m.room.message/s2",
                      {"msgtype": "m.text", "body": "hello atrium"})
        self.wait_until("sam's message at Atrium", lambda: "hello atrium" in self.alice_bodies(room))
        return room

    def test_atrium_joins_a_synapse_room_and_both_talk(self):
        self.atrium_joins_a_synapse_room_and_both_talk()

    def synapse_joins_an_atrium_room_and_both_talk(self, **create):
        room = self.alice.create_room(preset="public_chat", name="At Atrium", **create)
        self.alice.send(room, {"msgtype": "m.text", "body": "before sam"})
        status, body = self.sam_call("POST", f"/_matrix/client/v3/join/{quote(room)}"
                                     f"?server_name={quote(self.a.server_name)}", {})
        self.assertEqual(status, 200, body)
        members = self.alice.ok("GET", f"/_matrix/client/v3/rooms/{quote(room)}/members")["chunk"]
        self.assertIn(self.sam["user_id"], {e["state_key"] for e in members
                                            if e["content"]["membership"] == "join"})
        self.alice.send(room, {"msgtype": "m.text", "body": "hello synapse"})
        self.wait_until("alice's message at Synapse", lambda: "hello synapse" in self.sam_bodies(room))
        self.sam_call("PUT", f"/_matrix/client/v3/rooms/{quote(room)}/send/m.room.message/s3",
                      {"msgtype": "m.text", "body": "hello atrium"})
        self.wait_until("sam's message at Atrium", lambda: "hello atrium" in self.alice_bodies(room))
        return room

    def test_synapse_joins_an_atrium_room_and_both_talk(self):
        self.synapse_joins_an_atrium_room_and_both_talk()

    def test_rooms_of_versions_1_and_2_are_joined_and_talked_in_both_ways(self):
        for version in ("1", "2"):
            with self.subTest(room_version=version, resident="synapse"):
                room = self.atrium_joins_a_synapse_room_and_both_talk(room_version=version)
                # Synapse's events kept as Synapse signed them: its own IDs, pairs.
                [(pdu,)] = psql(f"SELECT pdu FROM events WHERE room_id = '{room}' AND type = 'm.room.message'"
                                f" AND sender = '{self.sam['user_id']}' ORDER BY stream_pos DESC LIMIT 1",
                                database=self.a.database)
                pdu = json.loads(pdu)
                self.assertTrue(pdu["event_id"].endswith(":" + self.syn["name"]), pdu)
                self.assertTrue(all(isinstance(r, list) for r in pdu["prev_events"]), pdu)
            with self.subTest(room_version=version, resident="atrium"):
                self.synapse_joins_an_atrium_room_and_both_talk(room_version=version)
            with self.subTest(room_version=version, invite="synapse to atrium"):
                status, body = self.sam_call("POST", "/_matrix/client/v3/createRoom",
                                             {"preset": "private_chat", "room_version": version,
                                              "invite": [self.alice.user_id]})
                self.assertEqual(status, 200, body)
                room = body["room_id"]
                self.wait_until("the invite at Atrium", lambda: room in self.alice.sync()["rooms"]["invite"])
                self.assertEqual(self.alice.call("POST", f"/_matrix/client/v3/rooms/{quote(room)}/join",
                                                 {}, timeout=60), (200, {"room_id": room}))
            with self.subTest(room_version=version, invite="atrium to synapse"):
                room = self.alice.create_room(preset="private_chat", room_version=version)
                self.assertEqual(self.alice.call("POST", f"/_matrix/client/v3/rooms/{quote(room)}/invite",
                                                 {"user_id": self.sam["user_id"]}, timeout=30), (200, {}))
                status, body = self.sam_call("POST", f"/_matrix/client/v3/rooms/{quote(room)}/join", {})
                self.assertEqual(status, 200, body)
                self.wait_until("sam's join at Atrium", lambda: self.sam["user_id"] in {
                    e["state_key"] for e in self.alice.ok(
                        "GET", f"/_matrix/client/v3/rooms/{quote(room)}/members")["chunk"]
                    if e["content"]["membership"] == "join"})

    # Restricted rooms with Synapse, both ways, and their refusals:
    # test_restricted_joins_synapse.py.

    def test_atrium_pages_back_through_a_synapse_rooms_history_it_joined_late(self):
        syd = json.loads(__import__("test_federation_synapse").peer(
            "register", self.syn["dir"], self.peer_user("syd"), "syd-password-1", "--admin"))
        token = syd["access_token"]
        status, body = self.synapse_json(
            self.syn, "POST", f"/_synapse/admin/v1/users/{quote(syd['user_id'])}/override_ratelimit",
            token=token, body={"messages_per_second": 0, "burst_count": 0})
        self.assertEqual(status, 200, body)
        status, body = self.synapse_json(self.syn, "POST", "/_matrix/client/v3/createRoom",
                                         token=token, body={"preset": "public_chat"})
        self.assertEqual(status, 200, body)
        room = body["room_id"]
        said = [f"s{i}" for i in range(1, 61)]
        for i, text in enumerate(said):
            status, body = self.synapse_json(
                self.syn, "PUT", f"/_matrix/client/v3/rooms/{quote(room)}/send/m.room.message/t{i}",
                token=token, body={"msgtype": "m.text", "body": text})
            self.assertEqual(status, 200, body)
        status, body = self.alice.call("POST", f"/_matrix/client/v3/join/{quote(room)}"
                                       f"?server_name={quote(self.syn['name'])}", {}, timeout=60)
        self.assertEqual((status, body), (200, {"room_id": room}), body)
        # Pages of 25 backwards: past the join, read from Synapse with /backfill.
        bodies, since = [], ""
        for _ in range(20):
            page = self.alice.ok("GET", f"/_matrix/client/v3/rooms/{quote(room)}/messages"
                                        f"?dir=b&limit=25{since}", timeout=60)
            bodies += [e["content"].get("body") for e in page["chunk"] if e["type"] == "m.room.message"]
            if "end" not in page:
                break
            since = f"&from={quote(page['end'])}"
        self.assertEqual(list(reversed(bodies)), said)
        self.a.wait_for_log(rf"backfill of {re.escape(room)} from {re.escape(self.syn['name'])}")
