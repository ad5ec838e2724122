"""Rooms and events through the client-server API: createRoom and its presets, membership
(join, leave, invite, kick, ban, unban, forget), send with transaction IDs, state, redaction,
the readers (/state, /event, /members, /joined_members, /joined_rooms, /messages, /context),
receipts, read markers and typing, the auth rules' 403s, and bad input of every kind.
Event IDs are checked against an independent Python computation of the reference hash.

One server and four registered users serve the whole class (registration hashes a password
per user); each test makes its own rooms.
"""

import json
import unittest
import urllib.parse

from accounts import REGISTRATION_ON, login, register
from common import Background
from harness import Server
from rooms_client import (SharedServerTest, V3, Client, content_hash, quote,
                          reference_event_id, reference_hash, stored_pdus)

ALL_ROOM_VERSIONS = [str(n) for n in range(1, 12)]  # every stable version this server creates

EVENT_MAX_PDU_BYTES = 65536


class RoomsTest(SharedServerTest):
    USERS = ("alice", "bob", "carol", "dave")

    def room_path(self, room, rest=""):
        return f"{V3}/rooms/{quote(room)}{rest}"

    def assertError(self, answer, status, errcode):
        got_status, body = answer
        self.assertEqual((got_status, (body or {}).get("errcode")), (status, errcode), body)
        self.assertIsInstance(body.get("error"), str)

    def public_room(self, *members):
        room = self.alice.create_room(preset="public_chat")
        for m in members:
            m.join(room)
        return room

    # -- createRoom ---------------------------------------------------------------------

    def test_create_room_writes_the_spec_order_and_the_private_preset(self):
        room = self.alice.create_room(
            name="Lobby", topic="Talk", invite=[self.bob.user_id], is_direct=True,
            initial_state=[{"type": "m.room.avatar", "content": {"url": "mxc://x/y"}},
                           {"type": "org.example.custom", "state_key": "k", "content": {"v": 1}}])
        chunk = self.alice.messages(room, dir="f", limit="50")["chunk"]
        order = [(e["type"], e.get("state_key")) for e in chunk]
        self.assertEqual(order, [
            ("m.room.create", ""), ("m.room.member", self.alice.user_id), ("m.room.power_levels", ""),
            ("m.room.join_rules", ""), ("m.room.history_visibility", ""), ("m.room.guest_access", ""),
            ("m.room.avatar", ""), ("org.example.custom", "k"), ("m.room.name", ""),
            ("m.room.topic", ""), ("m.room.member", self.bob.user_id)])
        self.assertEqual(self.alice.state(room, "m.room.join_rules"), {"join_rule": "invite"})
        self.assertEqual(self.alice.state(room, "m.room.history_visibility"),
                         {"history_visibility": "shared"})
        self.assertEqual(self.alice.state(room, "m.room.guest_access"), {"guest_access": "can_join"})
        pl = self.alice.state(room, "m.room.power_levels")
        self.assertEqual(pl["users"], {self.alice.user_id: 100})
        self.assertEqual((pl["invite"], pl["kick"], pl["ban"], pl["state_default"]), (0, 50, 50, 50))
        invite = self.alice.state(room, "m.room.member", self.bob.user_id)
        self.assertEqual((invite["membership"], invite["is_direct"]), ("invite", True))
        create = self.alice.state(room, "m.room.create")
        self.assertEqual(create, {"creator": self.alice.user_id, "room_version": "10"})

    def test_create_room_presets_overrides_and_versions(self):
        room = self.alice.create_room(preset="public_chat")
        self.assertEqual(self.alice.state(room, "m.room.join_rules"), {"join_rule": "public"})
        self.assertEqual(self.alice.state(room, "m.room.guest_access"), {"guest_access": "forbidden"})
        room = self.alice.create_room(visibility="public")  # preset follows visibility
        self.assertEqual(self.alice.state(room, "m.room.join_rules"), {"join_rule": "public"})
        room = self.alice.create_room(preset="trusted_private_chat", invite=[self.bob.user_id])
        self.assertEqual(self.alice.state(room, "m.room.power_levels")["users"],
                         {self.alice.user_id: 100, self.bob.user_id: 100})
        room = self.alice.create_room(power_level_content_override={"events_default": 20, "kick": 75})
        pl = self.alice.state(room, "m.room.power_levels")
        self.assertEqual((pl["events_default"], pl["kick"], pl["ban"]), (20, 75, 50))
        room = self.alice.create_room(room_version="11", creation_content={"m.federate": False})
        self.assertEqual(self.alice.state(room, "m.room.create"),
                         {"room_version": "11", "m.federate": False})

    def test_create_room_refuses_bad_input(self):
        post = lambda body, **kw: self.alice.call("POST", f"{V3}/createRoom", body, **kw)
        self.assertError(self.srv.json("POST", f"{V3}/createRoom", "{not json",
                                       token=self.alice.token), 400, "M_NOT_JSON")
        self.assertError(post([1, 2]), 400, "M_NOT_JSON")
        self.assertError(post({"name": 5}), 400, "M_BAD_JSON")
        self.assertError(post({"invite": "@bob:localhost"}), 400, "M_BAD_JSON")
        self.assertError(post({"invite": ["bob"]}), 400, "M_INVALID_PARAM")
        self.assertError(post({"initial_state": [{"type": "x"}]}), 400, "M_BAD_JSON")
        self.assertError(post({"preset": "party"}), 400, "M_INVALID_PARAM")
        self.assertError(post({"visibility": "secret"}), 400, "M_INVALID_PARAM")
        self.assertError(post({"room_version": "12"}), 400, "M_UNSUPPORTED_ROOM_VERSION")
        self.assertError(post({"room_version": 10}), 400, "M_BAD_JSON")
        # This server runs without the directory plugin: aliases are refused as such.
        self.assertError(post({"room_alias_name": "lobby"}), 400, "M_UNRECOGNIZED")
        self.assertError(post({"creation_content": {"x": 1.5}}), 400, "M_BAD_JSON")
        self.assertError(post({"invite": ["@nobody:localhost"]}), 404, "M_NOT_FOUND")
        self.assertError(post({"initial_state": [{"type": "m.room.member", "state_key": "@x:localhost",
                                                   "content": {"membership": "join"}}]}),
                         400, "M_INVALID_ROOM_STATE")
        self.assertError(self.srv.json("POST", f"{V3}/createRoom", {}), 401, "M_MISSING_TOKEN")

    # -- membership ---------------------------------------------------------------------

    def test_invite_only_room_needs_an_invite_and_join_is_idempotent(self):
        room = self.alice.create_room()
        self.assertError(self.bob.call("POST", self.room_path(room, "/join"), {}), 403, "M_FORBIDDEN")
        self.assertEqual(self.alice.member_action(room, "invite", self.bob.user_id)[0], 200)
        self.assertEqual(self.bob.join(room), {"room_id": room})
        count = len(self.alice.messages(room, dir="f", limit="100")["chunk"])
        self.assertEqual(self.bob.join(room), {"room_id": room})  # already joined: no new event
        self.assertEqual(len(self.alice.messages(room, dir="f", limit="100")["chunk"]), count)
        self.assertEqual(self.bob.state(room, "m.room.member", self.bob.user_id)["membership"], "join")
        self.assertError(self.bob.call("POST", self.room_path(room, "/forget"), {}), 400, "M_UNKNOWN")
        self.assertEqual(self.bob.leave(room), {})
        self.assertError(self.bob.call("POST", self.room_path(room, "/leave"), {}), 403, "M_FORBIDDEN")
        self.assertEqual(self.bob.ok("POST", self.room_path(room, "/forget"), {}), {})
        self.assertError(self.carol.call("POST", self.room_path(room, "/forget"), {}), 404, "M_NOT_FOUND")

    def test_join_by_id_paths_and_unknown_rooms(self):
        room = self.alice.create_room(preset="public_chat")
        self.assertEqual(self.bob.ok("POST", f"{V3}/join/{quote(room)}", {}), {"room_id": room})
        self.assertEqual(self.carol.ok("POST", f"{V3}/join/{quote(room)}?via=localhost"), {"room_id": room})
        self.assertError(self.dave.call("POST", f"{V3}/join/{quote('#lobby:localhost')}", {}),
                         400, "M_UNRECOGNIZED")  # no directory plugin here
        self.assertError(self.dave.call("POST", f"{V3}/join/{quote('!nope:localhost')}", {}),
                         404, "M_NOT_FOUND")
        self.assertError(self.dave.call("POST", f"{V3}/rooms/notaroom/join", {}), 400, "M_INVALID_PARAM")
        self.assertError(self.dave.call("POST", f"{V3}/rooms/{quote(room)}/join", "[1]"), 400, "M_NOT_JSON")

    def test_kick_ban_and_unban_follow_power_levels(self):
        room = self.public_room(self.bob, self.carol)
        self.assertError(self.carol.member_action(room, "kick", self.bob.user_id), 403, "M_FORBIDDEN")
        self.assertEqual(self.alice.member_action(room, "kick", self.bob.user_id, reason="bye")[0], 200)
        kicked = self.alice.state(room, "m.room.member", self.bob.user_id)
        self.assertEqual((kicked["membership"], kicked["reason"]), ("leave", "bye"))
        self.assertError(self.alice.member_action(room, "kick", self.bob.user_id), 403, "M_FORBIDDEN")
        self.assertError(self.carol.member_action(room, "ban", self.dave.user_id), 403, "M_FORBIDDEN")
        self.assertEqual(self.alice.member_action(room, "ban", self.dave.user_id)[0], 200)
        self.assertError(self.dave.call("POST", self.room_path(room, "/join"), {}), 403, "M_FORBIDDEN")
        self.assertError(self.carol.member_action(room, "unban", self.dave.user_id), 403, "M_FORBIDDEN")
        self.assertError(self.alice.member_action(room, "unban", self.bob.user_id), 403, "M_FORBIDDEN")
        self.assertEqual(self.alice.member_action(room, "unban", self.dave.user_id)[0], 200)
        self.assertEqual(self.dave.join(room), {"room_id": room})
        # A moderator cannot act on the room's admin.
        self.alice.put_state(room, "m.room.power_levels",
                             {**self.alice.state(room, "m.room.power_levels"),
                              "users": {self.alice.user_id: 100, self.carol.user_id: 50}})
        self.assertError(self.carol.member_action(room, "kick", self.alice.user_id), 403, "M_FORBIDDEN")
        self.assertEqual(self.carol.member_action(room, "kick", self.dave.user_id)[0], 200)
        self.assertError(self.alice.member_action(room, "invite", "@ghost:localhost"), 404, "M_NOT_FOUND")
        # A user of another server is invited through it: one that cannot be reached is 502.
        self.assertError(self.alice.member_action(room, "invite", "@x:elsewhere.example"), 502, "M_UNKNOWN")
        self.assertError(self.alice.member_action(room, "invite", "not-a-user"), 400, "M_INVALID_PARAM")
        self.assertError(self.alice.call("POST", self.room_path(room, "/invite"), {}), 400, "M_MISSING_PARAM")
        self.assertError(self.alice.call("POST", self.room_path(room, "/ban"), {"user_id": 7}), 400, "M_BAD_JSON")

    # -- send -----------------------------------------------------------------------------

    def test_send_is_idempotent_per_device_and_transaction_id(self):
        room = self.public_room(self.bob)
        path = self.room_path(room, "/send/m.room.message/same-txn")
        first = self.alice.ok("PUT", path, {"body": "one"})["event_id"]
        again = self.alice.ok("PUT", path, {"body": "one"})["event_id"]
        self.assertEqual(first, again)
        other_device = Client(self.srv, login(self.srv, "alice", device_id="PHONE"))
        third = other_device.ok("PUT", path, {"body": "one"})["event_id"]
        self.assertNotEqual(first, third)
        by_bob = self.bob.ok("PUT", path, {"body": "one"})["event_id"]
        self.assertNotIn(by_bob, (first, third))
        bodies = [e["content"].get("body") for e in self.alice.messages(room, dir="b", limit="5")["chunk"]
                  if e["type"] == "m.room.message"]
        self.assertEqual(bodies, ["one", "one", "one"])  # three events, not four
        # The transaction ID is echoed to the sending device only.
        mine = self.alice.ok("GET", self.room_path(room, f"/event/{quote(first)}"))
        self.assertEqual(mine["unsigned"].get("transaction_id"), "same-txn")
        theirs = self.bob.ok("GET", self.room_path(room, f"/event/{quote(first)}"))
        self.assertNotIn("transaction_id", theirs["unsigned"])

    def test_concurrent_sends_with_one_transaction_id_store_one_event(self):
        room = self.alice.create_room()
        path = self.room_path(room, "/send/m.room.message/race")
        calls = [Background(self.alice.call, "PUT", path, {"body": "race"}) for _ in range(8)]
        answers = [c.result() for c in calls]
        self.assertEqual({status for status, _ in answers}, {200})
        self.assertEqual(len({body["event_id"] for _, body in answers}), 1)
        bodies = [e["content"].get("body") for e in self.alice.messages(room, dir="b", limit="20")["chunk"]]
        self.assertEqual(bodies.count("race"), 1)

    def test_send_refuses_outsiders_unknown_rooms_bad_bodies_and_oversized_events(self):
        room = self.alice.create_room()
        send = self.room_path(room, "/send/m.room.message/")
        self.assertError(self.bob.call("PUT", send + "x1", {"body": "hi"}), 403, "M_FORBIDDEN")
        self.assertError(self.alice.call("PUT", self.room_path("!unknown:localhost", "/send/m.room.message/x"),
                                         {"body": "hi"}), 404, "M_NOT_FOUND")
        self.assertError(self.alice.call("PUT", f"{V3}/rooms/nope/send/m.room.message/x", {}), 400,
                         "M_INVALID_PARAM")
        self.assertError(self.srv.json("PUT", send + "x2", "{bad", token=self.alice.token), 400, "M_NOT_JSON")
        self.assertError(self.alice.call("PUT", send + "x3", ["list"]), 400, "M_NOT_JSON")
        self.assertError(self.alice.call("PUT", send + "x4", {"n": 0.5}), 400, "M_BAD_JSON")
        self.assertError(self.alice.call("PUT", send + "x5", {"n": 2 ** 60}), 400, "M_BAD_JSON")
        self.assertError(self.alice.call("PUT", send + "x6", {"body": "x" * (EVENT_MAX_PDU_BYTES + 10)}),
                         413, "M_TOO_LARGE")
        # A body under the request limit whose event (with hashes, IDs...) is over 64 KiB.
        self.assertError(self.alice.call("PUT", send + "x7", {"body": "x" * (EVENT_MAX_PDU_BYTES - 200)}),
                         413, "M_TOO_LARGE")
        self.assertError(self.alice.call("PUT", send + "t" * 300, {"body": "long txn"}), 400, "M_INVALID_PARAM")
        self.assertError(self.srv.json("PUT", send + "x8", {"body": "hi"}), 401, "M_MISSING_TOKEN")
        # Insufficient power: raise events_default above a member's level.
        pub = self.public_room(self.bob)
        self.alice.put_state(pub, "m.room.power_levels",
                             {**self.alice.state(pub, "m.room.power_levels"), "events_default": 10})
        self.assertError(self.bob.call("PUT", self.room_path(pub, "/send/m.room.message/p1"), {"body": "x"}),
                         403, "M_FORBIDDEN")
        self.assertEqual(self.alice.call("PUT", self.room_path(pub, "/send/m.room.message/p1"),
                                         {"body": "x"})[0], 200)

    # -- state ----------------------------------------------------------------------------

    def test_state_put_and_get_with_levels_and_user_keys(self):
        room = self.public_room(self.bob)
        first = self.alice.put_state(room, "m.room.name", {"name": "One"})
        self.assertEqual(self.alice.put_state(room, "m.room.name", {"name": "One"}), first)  # no change
        second = self.alice.put_state(room, "m.room.name", {"name": "Two"})
        self.assertNotEqual(first, second)
        self.assertEqual(self.bob.state(room, "m.room.name"), {"name": "Two"})
        whole = self.bob.ok("GET", self.room_path(room, "/state/m.room.name/?format=event"))
        self.assertEqual((whole["event_id"], whole["room_id"], whole["unsigned"]["prev_content"]),
                         (second, room, {"name": "One"}))
        self.assertEqual(self.bob.ok("GET", self.room_path(room, "/state/m.room.name")), {"name": "Two"})
        self.assertError(self.bob.call("GET", self.room_path(room, "/state/m.room.topic/")), 404, "M_NOT_FOUND")
        self.assertError(self.bob.call("PUT", self.room_path(room, "/state/m.room.topic/"), {"topic": "t"}),
                         403, "M_FORBIDDEN")
        self.assertError(self.alice.call("PUT", self.room_path(room, f"/state/org.x/{quote(self.bob.user_id)}"),
                                         {}), 403, "M_FORBIDDEN")
        self.assertEqual(self.bob.call("PUT", self.room_path(room, f"/state/org.x/{quote(self.bob.user_id)}"),
                                       {})[0], 403)  # state_default 50 > bob's 0
        pl = self.alice.state(room, "m.room.power_levels")
        self.assertError(self.bob.call("PUT", self.room_path(room, "/state/m.room.power_levels/"),
                                       {**pl, "users": {**pl["users"], self.bob.user_id: 100}}),
                         403, "M_FORBIDDEN")
        self.assertError(self.alice.call("PUT", self.room_path(room, "/state/m.room.power_levels/"),
                                         {**pl, "ban": "50"}), 403, "M_FORBIDDEN")
        everything = self.bob.ok("GET", self.room_path(room, "/state"))
        self.assertIn(("m.room.name", second), [(e["type"], e["event_id"]) for e in everything])
        self.assertEqual(len({(e["type"], e["state_key"]) for e in everything}), len(everything))
        self.assertError(self.carol.call("GET", self.room_path(room, "/state")), 403, "M_FORBIDDEN")
        self.assertError(self.carol.call("GET", self.room_path("!nope:localhost", "/state")), 404, "M_NOT_FOUND")

    def test_left_member_sees_state_as_of_leaving(self):
        room = self.public_room(self.bob)
        self.alice.put_state(room, "m.room.topic", {"topic": "before"})
        self.bob.leave(room)
        self.alice.put_state(room, "m.room.topic", {"topic": "after"})
        self.alice.send(room, {"body": "after bob left"})
        self.assertEqual(self.bob.state(room, "m.room.topic"), {"topic": "before"})
        bodies = [e["content"].get("body") for e in self.bob.messages(room, dir="b", limit="50")["chunk"]]
        self.assertNotIn("after bob left", bodies)

    # -- redaction ------------------------------------------------------------------------

    def test_redaction_rights_and_redacted_events(self):
        room = self.public_room(self.bob)
        target = self.alice.send(room, {"msgtype": "m.text", "body": "secret"})
        mine = self.bob.send(room, {"msgtype": "m.text", "body": "oops"})
        self.assertError(self.bob.call("PUT", self.room_path(room, f"/redact/{quote(target)}/r1"), {}),
                         403, "M_FORBIDDEN")
        own = self.bob.ok("PUT", self.room_path(room, f"/redact/{quote(mine)}/r2"), {"reason": "typo"})
        self.assertEqual(self.bob.ok("PUT", self.room_path(room, f"/redact/{quote(mine)}/r2"), {}), own)
        by_admin = self.alice.ok("PUT", self.room_path(room, f"/redact/{quote(target)}/r3"), {})["event_id"]
        seen = self.bob.ok("GET", self.room_path(room, f"/event/{quote(target)}"))
        self.assertEqual(seen["content"], {})
        self.assertEqual(seen["unsigned"]["redacted_because"]["event_id"], by_admin)
        redaction = self.bob.ok("GET", self.room_path(room, f"/event/{quote(own['event_id'])}"))
        self.assertEqual((redaction["type"], redaction["redacts"], redaction["content"]["reason"]),
                         ("m.room.redaction", mine, "typo"))
        self.assertError(self.alice.call("PUT", self.room_path(room, "/redact/$nothing/r4"), {}),
                         404, "M_NOT_FOUND")
        self.assertError(self.alice.call("PUT", self.room_path(room, "/redact/nothing/r5"), {}),
                         400, "M_INVALID_PARAM")
        # A redacted state event keeps only what the algorithm keeps.
        self.alice.put_state(room, "m.room.join_rules", {"join_rule": "public", "extra": 1})
        jr = self.alice.ok("GET", self.room_path(room, "/state/m.room.join_rules/?format=event"))
        self.alice.ok("PUT", self.room_path(room, f"/redact/{quote(jr['event_id'])}/r6"), {})
        self.assertEqual(self.alice.state(room, "m.room.join_rules"), {"join_rule": "public"})

    def test_room_version_11_redactions_carry_redacts_in_content(self):
        room = self.alice.create_room(room_version="11")
        target = self.alice.send(room, {"body": "x"})
        rid = self.alice.ok("PUT", self.room_path(room, f"/redact/{quote(target)}/v11"), {})["event_id"]
        pdus = dict(stored_pdus(self.srv, room))
        self.assertEqual(pdus[rid]["content"]["redacts"], target)
        self.assertNotIn("redacts", pdus[rid])
        self.assertNotIn("origin", pdus[rid])
        seen = self.alice.ok("GET", self.room_path(room, f"/event/{quote(rid)}"))
        self.assertEqual(seen["redacts"], target)  # copied to the top for clients

    # -- event IDs ------------------------------------------------------------------------

    def test_event_ids_are_reference_hashes_and_events_chain(self):
        for version in ALL_ROOM_VERSIONS:
            room = self.alice.create_room(room_version=version, name="Hashes")
            self.alice.send(room, {"msgtype": "m.text", "body": "h\u00e9llo \u0001 \"q\" /"})
            events = stored_pdus(self.srv, room)
            self.assertGreaterEqual(len(events), 8)
            ids = [event_id for event_id, _ in events]
            # v1-2 reference other events as [event ID, hashes] pairs, v3+ by ID alone.
            refs = (lambda refs: [r[0] for r in refs]) if int(version) <= 2 else (lambda refs: refs)
            for i, (event_id, pdu) in enumerate(events):
                self.assertEqual(pdu["hashes"]["sha256"], content_hash(pdu), (version, pdu["type"]))
                self.assertEqual(event_id, reference_event_id(pdu, version), (version, pdu["type"]))
                self.assertEqual(pdu["depth"], i + 1)
                self.assertEqual(refs(pdu["prev_events"]), ids[i - 1:i] if i else [])
                self.assertEqual(pdu["room_id"], room)
                self.assertTrue(set(refs(pdu["auth_events"])) <= set(ids[:i]))
                if i > 0:
                    self.assertIn(ids[0], refs(pdu["auth_events"]))  # the create event
                if int(version) <= 2:
                    self.assertRegex(event_id, r"^\$[A-Za-z]{18}:localhost$")
                    # Each pair carries the referenced event's reference hash.
                    by_id = dict(events)
                    for ref in pdu["prev_events"] + pdu["auth_events"]:
                        self.assertEqual(ref[1], {"sha256": reference_hash(by_id[ref[0]], version)})
                else:
                    self.assertNotIn("event_id", pdu)
            message = events[-1][1]
            self.assertEqual(len(message["auth_events"]), 3)  # create, power levels, sender's join
            create = self.alice.state(room, "m.room.create")
            self.assertEqual(create["room_version"], version)
            self.assertEqual("creator" in create, int(version) <= 10)

    def test_rooms_of_every_version_serve_read_and_redact_their_events(self):
        for version in ALL_ROOM_VERSIONS:
            room = self.alice.create_room(room_version=version, preset="public_chat")
            self.bob.join(room)
            target = self.bob.send(room, {"msgtype": "m.text", "body": f"v{version}"})
            # v3 IDs may hold "/" and "+": clients escape them in paths.
            seen = self.alice.ok("GET", self.room_path(room, f"/event/{quote(target)}"))
            self.assertEqual((seen["event_id"], seen["content"]["body"]), (target, f"v{version}"))
            rid = self.alice.ok("PUT", self.room_path(room, f"/redact/{quote(target)}/every-version-r{version}"),
                                {})["event_id"]
            pdus = dict(stored_pdus(self.srv, room))
            self.assertEqual(pdus[rid].get("redacts") if int(version) <= 10
                             else pdus[rid]["content"]["redacts"], target)
            self.assertEqual(self.bob.ok("GET", self.room_path(room, f"/event/{quote(target)}"))
                             ["content"], {})
            # Clients find redacts at the top and in content, whatever the version.
            seen = self.bob.ok("GET", self.room_path(room, f"/event/{quote(rid)}"))
            self.assertEqual((seen["redacts"], seen["content"]["redacts"]), (target, target))
            # Join rules keep "allow" through a redaction from v8 on.
            self.alice.put_state(room, "m.room.join_rules", {"join_rule": "public", "allow": []})
            jr = self.alice.ok("GET", self.room_path(room, "/state/m.room.join_rules/?format=event"))
            self.alice.ok("PUT", self.room_path(room, f"/redact/{quote(jr['event_id'])}/every-version-j{version}"), {})
            self.assertEqual(self.alice.state(room, "m.room.join_rules"),
                             {"join_rule": "public", **({"allow": []} if int(version) >= 8 else {})})

    # -- upgrades ---------------------------------------------------------------------------

    def test_upgrade_replaces_an_old_version_room_and_closes_it(self):
        old = self.alice.create_room(room_version="1", preset="public_chat", name="Old", topic="T")
        self.bob.join(old)
        self.alice.put_state(old, "m.room.encryption", {"algorithm": "m.megolm.v1.aes-sha2"})
        old_pl = self.alice.state(old, "m.room.power_levels")
        last = stored_pdus(self.srv, old)[-1][0]
        up = lambda who, body, room=old: who.call("POST", self.room_path(room, "/upgrade"), body)
        self.assertError(up(self.alice, {"new_version": "12"}), 400, "M_UNSUPPORTED_ROOM_VERSION")
        self.assertError(up(self.alice, {}), 400, "M_MISSING_PARAM")
        self.assertError(up(self.bob, {"new_version": "11"}), 403, "M_FORBIDDEN")  # level 0
        self.assertError(up(self.alice, {"new_version": "11"}, "!nope:localhost"), 404, "M_NOT_FOUND")

        status, body = up(self.alice, {"new_version": "11"})
        self.assertEqual(status, 200, body)
        new = body["replacement_room"]
        self.assertEqual(self.alice.state(new, "m.room.create"),
                         {"room_version": "11", "predecessor": {"room_id": old, "event_id": last}})
        for event_type in ("m.room.name", "m.room.topic", "m.room.join_rules", "m.room.encryption",
                           "m.room.history_visibility", "m.room.guest_access"):
            self.assertEqual(self.alice.state(new, event_type), self.alice.state(old, event_type)
                             if event_type != "m.room.join_rules" else {"join_rule": "public"},
                             event_type)
        self.assertEqual(self.alice.state(new, "m.room.power_levels"), old_pl)
        members = self.alice.ok("GET", self.room_path(new, "/joined_members"))["joined"]
        self.assertEqual(list(members), [self.alice.user_id])  # memberships stay behind
        self.bob.join(new)

        # The old room: a tombstone pointing at the new one, ordinary members silenced.
        self.assertEqual(self.alice.state(old, "m.room.tombstone"),
                         {"body": "This room has been replaced", "replacement_room": new})
        pl = self.alice.state(old, "m.room.power_levels")
        self.assertEqual((pl["events_default"], pl["invite"]), (50, 50))
        self.assertError(self.bob.call("PUT", self.room_path(old, "/send/m.room.message/up1"),
                                       {"body": "x"}), 403, "M_FORBIDDEN")

    def test_upgrade_by_a_moderator_copies_state_beyond_their_level(self):
        old = self.alice.create_room(room_version="9", preset="public_chat", name="Mods")
        self.bob.join(old)
        # Bob (50) may tombstone, but name and power levels need 100.
        pl = self.alice.state(old, "m.room.power_levels")
        pl["users"][self.bob.user_id] = 50
        pl["events"].update({"m.room.tombstone": 50, "m.room.name": 100, "m.room.power_levels": 100})
        self.alice.put_state(old, "m.room.power_levels", pl)
        status, body = self.bob.call("POST", self.room_path(old, "/upgrade"), {"new_version": "10"})
        self.assertEqual(status, 200, body)
        new = body["replacement_room"]
        self.assertEqual(self.bob.state(new, "m.room.name"), {"name": "Mods"})
        self.assertEqual(self.bob.state(new, "m.room.power_levels"), pl)  # Bob back at 50
        self.assertEqual(self.bob.state(new, "m.room.create"),
                         {"room_version": "10", "creator": self.bob.user_id,
                          "predecessor": {"room_id": old,
                                          "event_id": stored_pdus(self.srv, old)[-2][0]}})
        # Bob could not change the old room's power levels: the tombstone is there anyway.
        self.assertEqual(self.bob.state(old, "m.room.tombstone")["replacement_room"], new)
        self.assertEqual(self.alice.state(old, "m.room.power_levels"), pl)

    # -- readers ----------------------------------------------------------------------------

    def test_messages_paginate_both_ways_with_filters(self):
        room = self.public_room(self.bob)
        for i in range(25):
            (self.alice if i % 2 else self.bob).send(room, {"msgtype": "m.text", "body": f"m{i}"})
        page = self.bob.messages(room, dir="b", limit="10")
        self.assertEqual([e["content"]["body"] for e in page["chunk"]], [f"m{i}" for i in range(24, 14, -1)])
        seen, token = [], None
        while True:
            params = {"dir": "b", "limit": "7"}
            if token:
                params["from"] = token
            page = self.bob.messages(room, **params)
            seen += [e["content"].get("body") for e in page["chunk"] if e["type"] == "m.room.message"]
            if "end" not in page:
                break
            token = page["end"]
        self.assertEqual(seen, [f"m{i}" for i in range(24, -1, -1)])
        forward = self.bob.messages(room, dir="f", limit="1000",
                                    filter=json.dumps({"types": ["m.room.message"]}))
        self.assertEqual([e["content"]["body"] for e in forward["chunk"]], [f"m{i}" for i in range(25)])
        self.assertNotIn("end", forward)
        no_msgs = self.bob.messages(room, dir="f", filter=json.dumps({"not_types": ["m.room.*"], "limit": 50}))
        self.assertEqual(no_msgs["chunk"], [])
        by_alice = self.bob.messages(room, dir="b", limit="100",
                                     filter=json.dumps({"senders": [self.alice.user_id],
                                                        "types": ["m.room.message"]}))
        self.assertEqual(len(by_alice["chunk"]), 12)
        lazy = self.bob.messages(room, dir="b", limit="3", filter=json.dumps({"lazy_load_members": True}))
        self.assertEqual(sorted(e["state_key"] for e in lazy["state"]),
                         sorted([self.alice.user_id, self.bob.user_id]))
        # From a token, forward: exactly what came after it.
        mid = self.bob.messages(room, dir="b", limit="5")["end"]
        after = self.bob.messages(room, dir="f", **{"from": mid})
        self.assertEqual([e["content"]["body"] for e in after["chunk"]], [f"m{i}" for i in range(20, 25)])
        for bad in ({"dir": "x"}, {"dir": "b", "from": "garbage"}, {"dir": "b", "limit": "-1"},
                    {"dir": "b", "filter": "{nope"}, {"dir": "b", "filter": json.dumps({"types": "x"})}):
            status, body = self.bob.call("GET", self.room_path(room, "/messages?" + urllib.parse.urlencode(bad)))
            self.assertEqual(status, 400, (bad, body))
        self.assertError(self.carol.call("GET", self.room_path(room, "/messages?dir=b")), 403, "M_FORBIDDEN")

    def test_context_members_joined_members_and_joined_rooms(self):
        room = self.public_room(self.bob)
        ids = [self.alice.send(room, {"msgtype": "m.text", "body": f"c{i}"}) for i in range(9)]
        ctx = self.bob.ok("GET", self.room_path(room, f"/context/{quote(ids[4])}?limit=4"))
        self.assertEqual(ctx["event"]["event_id"], ids[4])
        self.assertEqual([e["event_id"] for e in ctx["events_before"]], [ids[3], ids[2]])
        self.assertEqual([e["event_id"] for e in ctx["events_after"]], [ids[5], ids[6]])
        self.assertIn("m.room.create", [e["type"] for e in ctx["state"]])
        more = self.bob.messages(room, dir="f", **{"from": ctx["end"]})
        self.assertEqual([e["event_id"] for e in more["chunk"]], ids[7:])
        self.assertError(self.bob.call("GET", self.room_path(room, "/context/$missing")), 404, "M_NOT_FOUND")
        self.alice.member_action(room, "invite", self.carol.user_id)
        members = self.bob.ok("GET", self.room_path(room, "/members"))["chunk"]
        self.assertEqual({e["state_key"]: e["content"]["membership"] for e in members},
                         {self.alice.user_id: "join", self.bob.user_id: "join", self.carol.user_id: "invite"})
        only = self.bob.ok("GET", self.room_path(room, "/members?membership=invite"))["chunk"]
        self.assertEqual([e["state_key"] for e in only], [self.carol.user_id])
        joined = self.bob.ok("GET", self.room_path(room, "/joined_members"))["joined"]
        self.assertEqual(joined, {self.alice.user_id: {"display_name": "alice", "avatar_url": None},
                                  self.bob.user_id: {"display_name": "bob", "avatar_url": None}})
        self.assertIn(room, self.bob.ok("GET", f"{V3}/joined_rooms")["joined_rooms"])
        self.assertNotIn(room, self.carol.ok("GET", f"{V3}/joined_rooms")["joined_rooms"])
        self.assertError(self.carol.call("GET", self.room_path(room, "/members")), 403, "M_FORBIDDEN")

    # -- receipts, read markers, typing -------------------------------------------------------

    def test_receipts_read_markers_and_typing_refusals(self):
        room = self.public_room(self.bob)
        event = self.alice.send(room, {"body": "read me"})
        ok = self.bob.call("POST", self.room_path(room, f"/receipt/m.read/{quote(event)}"), {})
        self.assertEqual(ok, (200, {}))
        self.assertEqual(self.bob.call("POST", self.room_path(room, "/read_markers"),
                                       {"m.fully_read": event, "m.read": event})[0], 200)
        self.assertError(self.bob.call("POST", self.room_path(room, f"/receipt/m.bogus/{quote(event)}"), {}),
                         400, "M_INVALID_PARAM")
        self.assertError(self.bob.call("POST", self.room_path(room, "/receipt/m.read/$nope"), {}),
                         404, "M_NOT_FOUND")
        self.assertError(self.carol.call("POST", self.room_path(room, f"/receipt/m.read/{quote(event)}"), {}),
                         403, "M_FORBIDDEN")
        self.assertError(self.bob.call("POST", self.room_path(room, "/read_markers"), {"m.read": 5}),
                         400, "M_BAD_JSON")
        typing = self.room_path(room, f"/typing/{quote(self.bob.user_id)}")
        self.assertEqual(self.bob.call("PUT", typing, {"typing": True, "timeout": 5000}), (200, {}))
        self.assertError(self.bob.call("PUT", typing, {"typing": "yes"}), 400, "M_BAD_JSON")
        self.assertError(self.bob.call("PUT", typing, {"typing": True, "timeout": "5s"}), 400, "M_BAD_JSON")
        self.assertError(self.alice.call("PUT", typing, {"typing": True}), 403, "M_FORBIDDEN")
        self.assertError(self.carol.call("PUT", self.room_path(room, f"/typing/{quote(self.carol.user_id)}"),
                                         {"typing": True}), 403, "M_FORBIDDEN")


class RoomDefaultsTest(unittest.TestCase):
    def test_default_room_version_comes_from_config_and_sends_are_rate_limited(self):
        settings = {**REGISTRATION_ON, "rooms": {"default_version": "11"},
                    "ratelimit": {"enabled": True, "message": {"per_minute": 1, "burst": 3},
                                  "register": {"per_minute": 100, "burst": 100}}}
        with Server(settings=settings) as srv:
            alice = Client(srv, register(srv, "alice"))
            room = alice.create_room()  # takes one token
            self.assertEqual(alice.state(room, "m.room.create"), {"room_version": "11"})
            alice.send(room, {"body": "1"}, txn="a")
            alice.send(room, {"body": "2"}, txn="b")
            status, body = alice.call("PUT", f"{V3}/rooms/{quote(room)}/send/m.room.message/c", {"body": "3"})
            self.assertEqual((status, body["errcode"]), (429, "M_LIMIT_EXCEEDED"))
            self.assertGreater(body["retry_after_ms"], 0)
            # A retry of a send that succeeded is answered from its transaction, not limited.
            self.assertEqual(alice.call("PUT", f"{V3}/rooms/{quote(room)}/send/m.room.message/a",
                                        {"body": "1"})[0], 200)

    def test_an_unsupported_default_room_version_stops_start_up(self):
        srv = Server(settings={"rooms": {"default_version": "12"}}, start=False)
        try:
            with self.assertRaises(Exception):
                srv.start(timeout=15)
            self.assertIn("rooms.default_version", srv.log_text())
        finally:
            srv.close(raise_errors=False)


if __name__ == "__main__":
    unittest.main()
