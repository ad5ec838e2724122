"""Knocking between Atrium and a real Synapse (1.132), both ways: an Atrium user knocks on
a Synapse room (version 10, join rule knock), Synapse's admin sees the knock and invites,
and the Atrium user, whose /sync moved the room from knock to invite, joins; a Synapse
user knocks on an Atrium room, Atrium's admin sees the knock and invites, and the Synapse
user joins.

A kick at Synapse rejecting an Atrium user's knock never reaches Atrium: Synapse 1.132
sends its events only to the servers in the room before them (Atrium, as the resident, also
sends such a kick to the knocker's server: test_knock_federation.py). The knock then stays
at Atrium until the user leaves, which Synapse refuses and Atrium does by itself.

Synapse is a test peer, not part of Atrium (test_federation_synapse.py says where it comes
from); without it these tests are skipped with a message saying so.
"""

import json
import os
import time
import unittest

from accounts import quote, register
from rooms_client import Client
from test_federation_synapse import ATRIUM_IP, PEER_SH, SKIP_MESSAGE, SynapseCase, peer

V3 = "/_matrix/client/v3"
KNOCK_RULES = [{"type": "m.room.join_rules", "state_key": "", "content": {"join_rule": "knock"}}]
WAIT_S = 30


@unittest.skipUnless(os.path.exists(PEER_SH), SKIP_MESSAGE)
class SynapseKnockTest(SynapseCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.class_syn = cls.start_class_synapse()

    def setUp(self):
        self.a = self.start_fed(ATRIUM_IP)
        self.syn = self.class_syn
        self.alice = Client(self.a, register(self.a, "alice"))
        self.sam = json.loads(peer("register", self.syn["dir"], self.peer_user("sam"),
                                   "sam-password-1", "--admin"))

    def sam_call(self, method, path, body=None):
        return self.synapse_json(self.syn, method, path, token=self.sam["access_token"], body=body)

    def wait_for(self, what, probe):
        deadline = time.time() + WAIT_S
        while time.time() < deadline:
            got = probe()
            if got:
                return got
            time.sleep(0.25)
        self.fail(f"timed out waiting for {what}")

    def test_an_atrium_user_knocks_on_a_synapse_room_is_invited_and_joins(self):
        status, body = self.sam_call("POST", f"{V3}/createRoom",
                                     {"room_version": "10", "name": "Synapse lobby",
                                      "initial_state": KNOCK_RULES})
        self.assertEqual(status, 200, body)
        room = body["room_id"]
        status, body = self.alice.call(
            "POST", f"{V3}/knock/{quote(room)}?server_name={quote(self.syn['name'])}",
            {"reason": "from Atrium"}, timeout=60)
        self.assertEqual((status, body), (200, {"room_id": room}))
        knocked = self.alice.sync()["rooms"]["knock"][room]["knock_state"]["events"]
        self.assertIn({"name": "Synapse lobby"},
                      [e["content"] for e in knocked if e["type"] == "m.room.name"])
        self.assertEqual((knocked[-1]["state_key"], knocked[-1]["content"]["membership"]),
                         (self.alice.user_id, "knock"))

        # Synapse stored the knock as the room's state.
        path = f"{V3}/rooms/{quote(room)}/state/m.room.member/{quote(self.alice.user_id)}"
        status, member = self.sam_call("GET", path)
        self.assertEqual((status, member.get("membership"), member.get("reason")),
                         (200, "knock", "from Atrium"), member)

        # Synapse's admin accepts with an invite; Atrium's sync moves the room to invite.
        since = self.alice.sync()["next_batch"]
        status, body = self.sam_call("POST", f"{V3}/rooms/{quote(room)}/invite",
                                     {"user_id": self.alice.user_id})
        self.assertEqual(status, 200, body)
        moved = self.wait_for("the invite at Atrium",
                              lambda: (lambda s: s if room in s["rooms"]["invite"] else None)(
                                  self.alice.sync(since=since)))
        self.assertNotIn(room, moved["rooms"]["knock"])
        status, body = self.alice.call(
            "POST", f"{V3}/join/{quote(room)}?server_name={quote(self.syn['name'])}", {}, timeout=60)
        self.assertEqual((status, body), (200, {"room_id": room}))
        status, member = self.sam_call("GET", path)
        self.assertEqual((status, member.get("membership")), (200, "join"), member)

    def test_a_knock_synapse_rejected_is_withdrawn_at_atrium_by_leaving(self):
        status, body = self.sam_call("POST", f"{V3}/createRoom",
                                     {"room_version": "10", "initial_state": KNOCK_RULES})
        self.assertEqual(status, 200, body)
        room = body["room_id"]
        status, body = self.alice.call(
            "POST", f"{V3}/knock/{quote(room)}?server_name={quote(self.syn['name'])}", {}, timeout=60)
        self.assertEqual(status, 200, body)
        status, body = self.sam_call("POST", f"{V3}/rooms/{quote(room)}/kick",
                                     {"user_id": self.alice.user_id, "reason": "no"})
        self.assertEqual(status, 200, body)
        # Synapse tells only the servers in the room: the knock still shows at Atrium, and
        # Synapse refuses the leave, so Atrium withdraws the knock by itself.
        status, body = self.alice.call("POST", f"{V3}/rooms/{quote(room)}/leave", {}, timeout=60)
        self.assertEqual((status, body), (200, {}))
        self.assertNotIn(room, self.alice.sync()["rooms"]["knock"])
        # A new knock is taken again.
        status, body = self.alice.call(
            "POST", f"{V3}/knock/{quote(room)}?server_name={quote(self.syn['name'])}", {}, timeout=60)
        self.assertEqual(status, 200, body)
        self.assertIn(room, self.alice.sync()["rooms"]["knock"])

    def test_a_synapse_user_knocks_on_an_atrium_room_is_invited_and_joins(self):
        room = self.alice.create_room(room_version="10", name="Atrium lobby",
                                      initial_state=KNOCK_RULES)
        status, body = self.sam_call(
            "POST", f"{V3}/knock/{quote(room)}?server_name={quote(self.a.server_name)}",
            {"reason": "from Synapse"})
        self.assertEqual((status, body), (200, {"room_id": room}), body)
        member = self.alice.state(room, "m.room.member", self.sam["user_id"])
        self.assertEqual((member["membership"], member.get("reason")), ("knock", "from Synapse"))

        # Synapse's sync shows the room under knock with the stripped state Atrium answered.
        status, sync = self.sam_call("GET", f"{V3}/sync")
        self.assertEqual(status, 200, sync)
        knocked = sync["rooms"]["knock"][room]["knock_state"]["events"]
        self.assertIn({"name": "Atrium lobby"},
                      [e["content"] for e in knocked if e["type"] == "m.room.name"])

        # Atrium's admin accepts; Synapse's user sees the invite and joins. (Synapse keeps a
        # sync answer for a while for the same request: each poll is incremental.)
        status, body = self.alice.call("POST", f"{V3}/rooms/{quote(room)}/invite",
                                       {"user_id": self.sam["user_id"]}, timeout=60)
        self.assertEqual((status, body), (200, {}))
        since = [sync["next_batch"]]

        def invited():
            status, sync = self.sam_call("GET", f"{V3}/sync?timeout=1000&since={quote(since[0])}")
            self.assertEqual(status, 200, sync)
            since[0] = sync["next_batch"]
            return room in sync.get("rooms", {}).get("invite", {})  # Synapse leaves empty sections out
        self.wait_for("the invite at Synapse", invited)
        status, body = self.sam_call(
            "POST", f"{V3}/join/{quote(room)}?server_name={quote(self.a.server_name)}", {})
        self.assertEqual(status, 200, body)
        self.assertEqual(self.alice.state(room, "m.room.member", self.sam["user_id"])["membership"],
                         "join")


if __name__ == "__main__":
    unittest.main()
