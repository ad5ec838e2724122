"""End-to-end encryption and ephemeral room news across two Atrium servers (A on
127.0.0.21, B on 127.0.0.22): keys/query and keys/claim for the other server's users
(answered by its /user/keys/query and /user/keys/claim), a server that does not answer
reported in `failures`, to-device messages both ways, device-list updates (applied in
order, a gap resynced through /user/devices, deletions), signing-key updates, and typing and
read receipts both ways.

The room the users share is a real federated room: alice creates it on A and bob joins it
through A (make_join/send_join), so each server's current state holds both members.

The tests on A and B as they come share one pair of servers (EdusAcrossServersTest: each
test registers users and makes rooms of its own); presence needs its own configuration.
"""

import itertools
import json
import time

import harness
from federation_support import free_port
from rooms_client import Client, quote
from test_e2ee_keys import (KEYS, cross_signing_key, device_keys, login, one_time_keys, register,
                            stream_token, sync, upload)
from test_federation import A_IP, B_IP, HUNG_IP, FederationTestCase
from test_federation_txn import wait_until

V3 = "/_matrix/client/v3"
_names = itertools.count(1)  # users of their own on the servers the tests share


class TwoServerTest(FederationTestCase):
    def setUp(self):
        self.a = self.start_class_fed(A_IP)
        self.b = self.start_class_fed(B_IP)
        n = next(_names)
        self.alice_name = f"alice{n}"
        self.alice = register(self.a, self.alice_name, display_name="alice's phone")
        self.bob = register(self.b, f"bob{n}", display_name="bob's laptop")

    def shared_room(self):
        """alice's public room on A, which bob of B joins through A."""
        room = Client(self.a, self.alice).create_room(preset="public_chat", name="shared")
        status, body = self.bob.json("POST", f"{V3}/join/{quote(room)}?server_name="
                                     f"{quote(self.a.server_name)}", {}, timeout=30)
        self.assertEqual((status, body), (200, {"room_id": room}))
        wait_until(lambda: self.member_of(self.a, room, self.bob.user_id), what="bob joined at A")
        return room

    @staticmethod
    def member_of(srv, room, user_id):
        return harness.psql("SELECT 1 FROM current_state WHERE room_id = '%s' AND type ="
                            " 'm.room.member' AND state_key = '%s' AND membership = 'join'"
                            % (room, user_id), database=srv.database)

    def b_rows(self, sql):
        return harness.psql(sql, database=self.b.database)


class KeysAcrossServers:
    def test_keys_query_and_claim_reach_the_users_of_the_other_server(self):
        keys = device_keys(self.alice)
        otks = one_time_keys(2, prefix="A")
        self.assertEqual(upload(self.alice, device_keys=keys, one_time_keys=otks)[0], 200)
        master = cross_signing_key(self.alice, "master", "alicemaster")
        status, body = self.alice.json("POST", f"{KEYS}/device_signing/upload",
                                       {"master_key": master})
        self.assertEqual(status, 200, body)

        status, body = self.bob.json("POST", f"{KEYS}/query",
                                     {"device_keys": {self.alice.user_id: []}})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["failures"], {})
        got = body["device_keys"][self.alice.user_id][self.alice.device_id]
        self.assertEqual(got["keys"], keys["keys"])
        self.assertEqual(got["unsigned"]["device_display_name"], "alice's phone")
        self.assertEqual(body["master_keys"][self.alice.user_id], master)

        claimed = []
        for _ in range(3):
            status, body = self.bob.json("POST", f"{KEYS}/claim", {"one_time_keys": {
                self.alice.user_id: {self.alice.device_id: "signed_curve25519"}}})
            self.assertEqual((status, body["failures"]), (200, {}), body)
            claimed.append(body["one_time_keys"].get(self.alice.user_id, {})
                           .get(self.alice.device_id))
        # Each one-time key is handed out once, then none is left (no fallback key).
        self.assertEqual(sorted(k for c in claimed[:2] for k in c), sorted(otks))
        self.assertIsNone(claimed[2])

    def test_a_server_that_does_not_answer_is_reported_in_failures(self):
        silent = f"{HUNG_IP}:{free_port(HUNG_IP)}"  # nothing listens there
        upload(self.alice, device_keys=device_keys(self.alice))
        status, body = self.bob.json("POST", f"{KEYS}/query", {"timeout": 3000, "device_keys": {
            self.alice.user_id: [], f"@nobody:{silent}": []}})
        self.assertEqual(status, 200, body)
        self.assertIn(self.alice.device_id, body["device_keys"][self.alice.user_id])
        self.assertEqual(list(body["failures"]), [silent])
        self.assertIn(body["failures"][silent]["status"], (503, 504))
        status, body = self.bob.json("POST", f"{KEYS}/claim", {"timeout": 3000, "one_time_keys": {
            f"@nobody:{silent}": {"DEV": "signed_curve25519"}}})
        self.assertEqual((status, list(body["failures"])), (200, [silent]), body)

    def test_the_federation_key_endpoints_answer_only_signed_requests(self):
        status, _, body = self.a.fed_request(
            "POST", "/_matrix/federation/v1/user/keys/query",
            body={"device_keys": {self.alice.user_id: []}})
        self.assertEqual((status, body["errcode"]), (401, "M_UNAUTHORIZED"))


class ToDeviceAcrossServers:
    def test_to_device_messages_reach_the_other_servers_devices_both_ways(self):
        since = sync(self.bob)["next_batch"]
        content = {"algorithm": "m.olm.v1.curve25519-aes-sha2", "ciphertext": {"x": 1}}
        status, body = self.alice.json(
            "PUT", f"{V3}/sendToDevice/m.room.encrypted/t1",
            {"messages": {self.bob.user_id: {self.bob.device_id: content}}})
        self.assertEqual(status, 200, body)

        def arrived(acc, token):
            events = sync(acc, token, timeout_ms=1000)["to_device"]["events"]
            return events or None
        events = wait_until(lambda: arrived(self.bob, since), what="the message on B")
        self.assertEqual(events, [{"sender": self.alice.user_id, "type": "m.room.encrypted",
                                   "content": content}])

        since = sync(self.alice)["next_batch"]
        status, _ = self.bob.json("PUT", f"{V3}/sendToDevice/m.test/t2",
                                  {"messages": {self.alice.user_id: {"*": {"n": 2}}}})
        self.assertEqual(status, 200)
        events = wait_until(lambda: arrived(self.alice, since), what="the message on A")
        self.assertEqual(events, [{"sender": self.bob.user_id, "type": "m.test",
                                   "content": {"n": 2}}])


class DeviceListsAcrossServers:
    def changes(self, since):
        status, body = self.bob.json("GET", f"{KEYS}/changes?from={since}")
        self.assertEqual(status, 200, body)
        return body["changed"]

    def b_record(self):
        rows = self.b_rows("SELECT stream_id, devices FROM e2ee_remote_device_lists"
                           f" WHERE user_id = '{self.alice.user_id}'")
        return (int(rows[0][0]), json.loads(rows[0][1] or "null")) if rows else None

    def a_stream_id(self):
        rows = harness.psql("SELECT stream_id FROM e2ee_device_list_streams"
                            f" WHERE user_id = '{self.alice.user_id}'", database=self.a.database)
        return int(rows[0][0]) if rows else 0

    def test_device_changes_reach_a_server_sharing_a_room_in_order_and_a_gap_is_resynced(self):
        # Before they share a room, B hears nothing of alice's keys.
        upload(self.alice, device_keys=device_keys(self.alice))
        since = stream_token(self.b)
        self.shared_room()
        # Sharing a room is news of its own: bob's client must fetch alice's keys.
        self.assertIn(self.alice.user_id, self.changes(since))
        since = stream_token(self.b)

        # A second device of alice: B learns of it (first news of alice: a resync).
        phone = login(self.a, self.alice_name)
        self.assertEqual(upload(phone, device_keys=device_keys(phone))[0], 200)
        wait_until(lambda: self.alice.user_id in self.changes(since),
                   what="alice in bob's keys/changes")
        # The resync runs after the change is told (ADR-0024): wait for its record.
        record = wait_until(lambda: (r := self.b_record()) and r[0] == self.a_stream_id() and r,
                            what="B's record of alice's devices")
        self.assertEqual(set(record[1]), {self.alice.device_id, phone.device_id})

        # An update that follows the last one is applied (no resync needed).
        since = stream_token(self.b)
        self.assertEqual(upload(phone, device_keys=device_keys(phone, tag="v2"))[0], 200)
        wait_until(lambda: self.alice.user_id in self.changes(since), what="the key change")
        record = wait_until(lambda: (r := self.b_record()) and r[0] == self.a_stream_id() and r,
                            what="the update applied")
        self.assertEqual(record[1][phone.device_id]["keys"], device_keys(phone, tag="v2"))

        # A gap: B's record is made stale; the next update cannot follow it, so B asks A for
        # the whole list, which still has both devices (an update applied to the stale
        # record would hold only one).
        # resync_ts cleared too: B resyncs a user at most once a minute (ADR-0023), and the
        # first news of alice above was one.
        self.b_rows("UPDATE e2ee_remote_device_lists SET stream_id = 0, devices = '{}',"
                    f" resync_ts = NULL WHERE user_id = '{self.alice.user_id}'")
        self.assertEqual(upload(phone, device_keys=device_keys(phone, tag="v3"))[0], 200)
        record = wait_until(lambda: (r := self.b_record()) and r[0] == self.a_stream_id() and r,
                            what="the resync")
        self.assertEqual(set(record[1]), {self.alice.device_id, phone.device_id})

        # Deleting the device is news too.
        status, body = phone.json("POST", f"{V3}/logout")
        self.assertEqual(status, 200, body)
        record = wait_until(lambda: (r := self.b_record()) and phone.device_id not in r[1] and r,
                            what="the deletion at B")
        self.assertEqual(set(record[1]), {self.alice.device_id})

        # And bob's query of alice, answered by A, agrees.
        status, body = self.bob.json("POST", f"{KEYS}/query",
                                     {"device_keys": {self.alice.user_id: []}})
        self.assertEqual(set(body["device_keys"][self.alice.user_id]), {self.alice.device_id})

    def test_a_signing_key_update_reaches_a_server_sharing_a_room(self):
        self.shared_room()
        since = stream_token(self.b)
        master = cross_signing_key(self.alice, "master", "alicemaster2")
        status, body = self.alice.json("POST", f"{KEYS}/device_signing/upload",
                                       {"master_key": master})
        self.assertEqual(status, 200, body)
        wait_until(lambda: self.alice.user_id in self.changes(since), what="the key change")
        rows = wait_until(lambda: self.b_rows(
            "SELECT master_key FROM e2ee_remote_device_lists"
            f" WHERE user_id = '{self.alice.user_id}' AND master_key IS NOT NULL"),
            what="the master key at B")
        self.assertEqual(json.loads(rows[0][0]), master)


class PresenceAcrossServersTest(TwoServerTest):
    """presence.enabled on A (the harness turns it off by default), and on B unless the test
    says otherwise: m.presence EDUs. A is the class's; B is each test's own (its setting)."""

    PRESENCE_ON = {"presence": {"enabled": True}}

    def setUp(self):
        self.a = self.start_class_fed(A_IP, self.PRESENCE_ON)
        self.alice = register(self.a, f"alice{next(_names)}", display_name="alice's phone")

    def start_b(self, presence):
        self.b = self.start_fed(B_IP, {"presence": {"enabled": presence}})
        self.bob = register(self.b, "bob", display_name="bob's laptop")

    @staticmethod
    def presence_of(viewer, user_id):
        status, body = viewer.json("GET", f"{V3}/presence/{quote(user_id)}/status")
        return body if status == 200 else None

    @staticmethod
    def synced_presence(acc, since, user_id):
        answer = sync(acc, since, timeout_ms=1000)
        return [e["content"] for e in answer.get("presence", {}).get("events", [])
                if e["sender"] == user_id]

    def test_presence_changes_cross_both_ways(self):
        self.start_b(presence=True)
        room = self.shared_room()
        since_b = sync(self.bob)["next_batch"]
        status, _ = self.alice.json("PUT", f"{V3}/presence/{quote(self.alice.user_id)}/status",
                                    {"presence": "online", "status_msg": "at A"})
        self.assertEqual(status, 200)
        seen = wait_until(lambda: (self.presence_of(self.bob, self.alice.user_id) or {})
                          .get("status_msg") == "at A" and self.presence_of(self.bob, self.alice.user_id),
                          what="alice's presence at B")
        self.assertEqual(seen["presence"], "online")
        [content] = wait_until(lambda: self.synced_presence(self.bob, since_b, self.alice.user_id),
                               what="alice's presence in bob's sync")
        self.assertEqual((content["presence"], content["status_msg"]), ("online", "at A"))
        # B -> A.
        status, _ = self.bob.json("PUT", f"{V3}/presence/{quote(self.bob.user_id)}/status",
                                  {"presence": "unavailable"})
        self.assertEqual(status, 200)
        wait_until(lambda: (self.presence_of(self.alice, self.bob.user_id) or {})
                   .get("presence") == "unavailable", what="bob's presence at A")
        # Someone who shares no room with alice's user learns nothing of it.
        carol = register(self.b, "carol")
        status, body = carol.json("GET", f"{V3}/presence/{quote(self.alice.user_id)}/status")
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"))
        self.assertTrue(room)

    def test_a_server_with_presence_off_stores_nothing_it_is_sent(self):
        self.start_b(presence=False)
        self.shared_room()
        wait_until(lambda: harness.psql("SELECT count(*) FROM federation_outbound WHERE"
                                        f" destination = '{self.b.server_name}'",
                                        database=self.a.database) == [["0"]],
                   what="A's queue to B to empty")
        handled = lambda: self.b.metric("atrium_federation_inbound_edus_total",  # noqa: E731
                                        {"outcome": "handled"}) or 0
        before = handled()
        self.alice.json("PUT", f"{V3}/presence/{quote(self.alice.user_id)}/status",
                        {"presence": "online", "status_msg": "anyone?"})
        wait_until(lambda: handled() > before, what="alice's m.presence at B")
        self.assertEqual(self.b_rows("SELECT count(*) FROM presence"), [["0"]])
        self.assertEqual(self.presence_of(self.bob, self.alice.user_id), {"presence": "offline"})


class TypingAndReceiptsAcrossServers:
    def test_typing_and_read_receipts_cross_both_ways(self):
        room = self.shared_room()
        # The receipts are for an event both servers hold: the room's name, part of the
        # state bob's join brought to B.
        status, state = self.alice.json("GET", f"{V3}/rooms/{quote(room)}/state")
        self.assertEqual(status, 200, state)
        [event_id] = [e["event_id"] for e in state if e["type"] == "m.room.name"]

        def ephemeral(acc, since, kind):
            answer = sync(acc, since, timeout_ms=1000)
            joined = answer["rooms"]["join"].get(room, {})
            return [e["content"] for e in joined.get("ephemeral", {}).get("events", [])
                    if e["type"] == kind]

        # A -> B: alice types and reads; bob's /sync on B shows both.
        since_b = sync(self.bob)["next_batch"]
        status, _ = self.alice.json("PUT", f"{V3}/rooms/{quote(room)}/typing/"
                                    f"{quote(self.alice.user_id)}", {"typing": True, "timeout": 20000})
        self.assertEqual(status, 200)
        wait_until(lambda: any(self.alice.user_id in c["user_ids"]
                               for c in ephemeral(self.bob, since_b, "m.typing")),
                   what="alice typing in bob's sync")
        status, _ = self.alice.json("POST", f"{V3}/rooms/{quote(room)}/receipt/m.read/"
                                    f"{quote(event_id)}", {})
        self.assertEqual(status, 200)
        receipts = wait_until(lambda: ephemeral(self.bob, since_b, "m.receipt"),
                              what="alice's receipt in bob's sync")
        self.assertIn(self.alice.user_id, receipts[0][event_id]["m.read"])

        # B -> A: bob types and reads; alice's /sync on A shows both.
        since_a = sync(self.alice)["next_batch"]
        status, body = self.bob.json("PUT", f"{V3}/rooms/{quote(room)}/typing/"
                                     f"{quote(self.bob.user_id)}", {"typing": True})
        self.assertEqual(status, 200, body)
        wait_until(lambda: any(self.bob.user_id in c["user_ids"]
                               for c in ephemeral(self.alice, since_a, "m.typing")),
                   what="bob typing in alice's sync")
        status, body = self.bob.json("POST", f"{V3}/rooms/{quote(room)}/receipt/m.read/"
                                     f"{quote(event_id)}", {})
        self.assertEqual(status, 200, body)
        receipts = wait_until(lambda: [r for r in ephemeral(self.alice, since_a, "m.receipt")
                                       if self.bob.user_id in r.get(event_id, {}).get("m.read", {})],
                              what="bob's receipt in alice's sync")
        self.assertTrue(receipts)
        # Typing stops: bob's notice is withdrawn at A too.
        since_a = sync(self.alice)["next_batch"]
        self.bob.json("PUT", f"{V3}/rooms/{quote(room)}/typing/{quote(self.bob.user_id)}",
                      {"typing": False})
        wait_until(lambda: any(self.bob.user_id not in c["user_ids"]
                               for c in ephemeral(self.alice, since_a, "m.typing")),
                   what="bob no longer typing in alice's sync")

    def test_a_server_cannot_speak_for_another_servers_user(self):
        room = self.shared_room()
        # B sends a receipt naming alice (a user of A): A must not store it.
        content = {room: {"m.read": {self.alice.user_id: {"event_ids": ["$forged"],
                                                           "data": {"ts": 1}}}}}
        harness.psql("INSERT INTO federation_outbound (destination, kind, edu_type, content,"
                     f" queued_ts) VALUES ('{self.a.server_name}', 1, 'm.receipt',"
                     f" '{json.dumps(content)}', 0)", database=self.b.database)
        # And a genuine one of bob's, queued behind it, shows the transaction was processed.
        genuine = {room: {"m.read": {self.bob.user_id: {"event_ids": ["$real"],
                                                         "data": {"ts": 2}}}}}
        harness.psql("INSERT INTO federation_outbound (destination, kind, edu_type, content,"
                     f" queued_ts) VALUES ('{self.a.server_name}', 1, 'm.receipt',"
                     f" '{json.dumps(genuine)}', 0)", database=self.b.database)
        self.bob.json("PUT", f"{V3}/rooms/{quote(room)}/typing/{quote(self.bob.user_id)}",
                      {"typing": False})  # kicks B's sender
        wait_until(lambda: harness.psql(
            f"SELECT 1 FROM receipts WHERE event_id = '$real'", database=self.a.database),
            what="bob's receipt at A")
        self.assertEqual(harness.psql("SELECT 1 FROM receipts WHERE event_id = '$forged'",
                                      database=self.a.database), [])


class EdusAcrossServersTest(KeysAcrossServers, ToDeviceAcrossServers, DeviceListsAcrossServers,
                            TypingAndReceiptsAcrossServers, TwoServerTest):
    """The tests above on one pair of servers (a start costs about a CPU-second)."""


if __name__ == "__main__":
    import unittest
    unittest.main()
