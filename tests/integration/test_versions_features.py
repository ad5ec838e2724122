"""/versions advertises in unstable_features exactly the features this server serves that
Element Web looks for, and each advertised flag is exercised here against its feature:
cross-signing keys, private read receipts, threads (relations, bundles, thread
receipts), the threads list, relations `dir`, publicRooms `room_types`, simplified sliding
sync, pushers' `enabled` switch (its effect on delivery: test_push_gateway.py).

One server (directory plugin on) for the class."""

import unittest

from common import wait_until
from rooms_client import SharedServerTest, V3, quote

V1 = "/_matrix/client/v1"
ADVERTISED = {"org.matrix.msc3916.stable", "org.matrix.e2e_cross_signing",
              "org.matrix.msc2285.stable", "org.matrix.msc3440.stable", "org.matrix.msc3856",
              "org.matrix.msc3715", "org.matrix.msc3827.stable", "org.matrix.simplified_msc3575",
              "org.matrix.msc3881"}


def thread(root):
    return {"rel_type": "m.thread", "event_id": root, "is_falling_back": True,
            "m.in_reply_to": {"event_id": root}}


class VersionsFeaturesTest(SharedServerTest):
    USERS = ("alice", "bob")
    PLUGINS = {"directory": {"enabled": True}}

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        status, body = cls.srv.json("GET", "/_matrix/client/versions")
        assert status == 200, body
        cls.features = body["unstable_features"]
        cls.room = cls.alice.create_room(preset="public_chat")
        cls.bob.join(cls.room)

    def say(self, who, body, relates_to=None):
        content = {"msgtype": "m.text", "body": body}
        if relates_to:
            content["m.relates_to"] = relates_to
        return who.send(self.room, content)

    def test_exactly_the_served_features_are_advertised(self):
        self.assertEqual({k for k, v in self.features.items() if v}, ADVERTISED)

    def test_msc3881_pushers_carry_their_enabled_switch_and_device(self):
        self.assertTrue(self.features["org.matrix.msc3881"])
        enabled, device = "org.matrix.msc3881.enabled", "org.matrix.msc3881.device_id"
        body = {"pushkey": "alice-phone", "kind": "http", "app_id": "org.example.app",
                "app_display_name": "Example", "device_display_name": "Phone", "lang": "en",
                "data": {"url": "https://push.example.org/_matrix/push/v1/notify"}}
        self.alice.ok("POST", f"{V3}/pushers/set", dict(body, **{enabled: False}))
        [p] = self.alice.ok("GET", f"{V3}/pushers")["pushers"]
        self.assertIs(p[enabled], False)
        self.assertEqual(p[device], self.alice.device_id)
        self.alice.ok("POST", f"{V3}/pushers/set", body)  # absent: switched on again
        [p] = self.alice.ok("GET", f"{V3}/pushers")["pushers"]
        self.assertIs(p[enabled], True)
        status, err = self.alice.call("POST", f"{V3}/pushers/set", dict(body, **{enabled: "no"}))
        self.assertEqual((status, err["errcode"]), (400, "M_BAD_JSON"))
        self.alice.ok("POST", f"{V3}/pushers/set", dict(body, kind=None))
        self.assertEqual(self.alice.ok("GET", f"{V3}/pushers")["pushers"], [])

    def test_e2e_cross_signing_keys_upload_and_query(self):
        self.assertTrue(self.features["org.matrix.e2e_cross_signing"])
        uid = self.alice.user_id
        master = {"user_id": uid, "usage": ["master"], "keys": {"ed25519:m1": "m1"}}
        self_signing = {"user_id": uid, "usage": ["self_signing"], "keys": {"ed25519:s1": "s1"},
                        "signatures": {uid: {"ed25519:m1": "sig"}}}
        self.assertEqual(self.alice.ok("POST", f"{V3}/keys/device_signing/upload",
                                       {"master_key": master, "self_signing_key": self_signing}), {})
        got = self.bob.ok("POST", f"{V3}/keys/query", {"device_keys": {uid: []}})
        self.assertEqual(got["master_keys"][uid], master)
        self.assertEqual(got["self_signing_keys"][uid], self_signing)

    def test_msc2285_private_read_receipts_are_seen_only_by_their_owner(self):
        self.assertTrue(self.features["org.matrix.msc2285.stable"])
        event = self.say(self.alice, "read me privately")
        self.bob.ok("POST", f"{V3}/rooms/{quote(self.room)}/receipt/m.read.private/{quote(event)}", {})

        def receipt_types(who):
            types = set()
            for e in who.sync()["rooms"]["join"][self.room]["ephemeral"]["events"]:
                if e["type"] == "m.receipt" and event in e["content"]:
                    types |= {t for t, users in e["content"][event].items()
                              if self.bob.user_id in users}
            return types

        self.assertEqual(receipt_types(self.bob), {"m.read.private"})
        self.assertEqual(receipt_types(self.alice), set())

    def test_msc3440_threads_bundle_on_the_root_and_take_thread_receipts(self):
        self.assertTrue(self.features["org.matrix.msc3440.stable"])
        root = self.say(self.alice, "thread root")
        reply = self.say(self.bob, "in the thread", thread(root))
        got = self.alice.ok("GET", f"{V3}/rooms/{quote(self.room)}/event/{quote(root)}")
        summary = got["unsigned"]["m.relations"]["m.thread"]
        self.assertEqual((summary["count"], summary["latest_event"]["event_id"]), (1, reply))
        self.alice.ok("POST", f"{V3}/rooms/{quote(self.room)}/receipt/m.read/{quote(reply)}",
                      {"thread_id": root})

    def test_msc3856_threads_list(self):
        self.assertTrue(self.features["org.matrix.msc3856"])
        root = self.say(self.alice, "listed root")
        self.say(self.bob, "listed reply", thread(root))
        chunk = self.alice.ok("GET", f"{V1}/rooms/{quote(self.room)}/threads")["chunk"]
        self.assertIn(root, [e["event_id"] for e in chunk])

    def test_msc3715_relations_in_both_directions(self):
        self.assertTrue(self.features["org.matrix.msc3715"])
        root = self.say(self.alice, "dir root")
        replies = [self.say(self.bob, f"dir {i}", thread(root)) for i in range(3)]
        path = f"{V1}/rooms/{quote(self.room)}/relations/{quote(root)}"
        forward = self.alice.ok("GET", f"{path}?dir=f")["chunk"]
        backward = self.alice.ok("GET", f"{path}?dir=b")["chunk"]
        self.assertEqual([e["event_id"] for e in forward], replies)
        self.assertEqual([e["event_id"] for e in backward], replies[::-1])

    def test_msc3827_public_rooms_filter_by_room_type(self):
        self.assertTrue(self.features["org.matrix.msc3827.stable"])
        space = self.alice.create_room(preset="public_chat", visibility="public",
                                       creation_content={"type": "m.space"}, name="A space")
        plain = self.alice.create_room(preset="public_chat", visibility="public", name="Plain")

        def listed(types):
            body = self.alice.ok("POST", f"{V3}/publicRooms", {"filter": {"room_types": types}})
            return {r["room_id"] for r in body["chunk"]}

        wait_until(lambda: plain in listed([None]) and space in listed(["m.space"]),
                   what="both rooms in the directory")
        self.assertIn(space, listed(["m.space"]))
        self.assertNotIn(plain, listed(["m.space"]))
        self.assertIn(plain, listed([None]))
        self.assertNotIn(space, listed([None]))

    def test_simplified_msc3575_sliding_sync_lists_the_room(self):
        self.assertTrue(self.features["org.matrix.simplified_msc3575"])
        body = self.alice.ok("POST", "/_matrix/client/unstable/org.matrix.simplified_msc3575/sync",
                             {"lists": {"all": {"ranges": [[0, 99]], "timeline_limit": 1}}})
        self.assertTrue(body["pos"])
        self.assertIn(self.room, body["rooms"])
        self.assertGreaterEqual(body["lists"]["all"]["count"], 1)


if __name__ == "__main__":
    unittest.main()
