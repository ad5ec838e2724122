"""End-to-end encryption and ephemeral room news across two Atrium servers (A on
127.0.0.21, B on 127.0.0.22): keys/query and keys/claim for the other server's users
(answered by its /user/keys/query and /user/keys/claim), a server that does not answer
reported in `failures`, to-device messages both ways, device-list updates (applied in
order, a gap resynced through /user/devices, deletions), signing-key updates, and typing and
read receipts both ways.

Test fixture, until the room model serves joins over federation: a room "shared" across
the servers is the room alice creates on A, with memberships written straight into
current_state and memberships on both sides (shared_room below). Device-list and
ephemeral news only need those two tables; B holds no events of the room, so these tests
read B's side through keys/changes and B's own tables rather than bob's /sync.
"""

import json
import time
import uuid

import harness
from federation_support import free_port
from rooms_client import Client, quote
from test_e2ee_keys import (KEYS, cross_signing_key, device_keys, login, one_time_keys, register,
                            stream_token, sync, upload)
from test_federation import A_IP, B_IP, HUNG_IP, FederationTestCase
from test_federation_txn import wait_until

V3 = "/_matrix/client/v3"


def join_fixture(srv, room, user_id):
    """Test fixture: user_id joined to room in srv's current_state and membership stream."""
    fake = "$fixture" + uuid.uuid4().hex
    harness.psql(
        "INSERT INTO current_state (room_id, type, state_key, event_id, membership)"
        f" VALUES ('{room}', 'm.room.member', '{user_id}', '{fake}', 'join')"
        " ON CONFLICT DO NOTHING;"
        "INSERT INTO memberships (stream_pos, room_id, user_id, membership, event_id, sender)"
        f" VALUES (nextval('stream_seq'), '{room}', '{user_id}', 'join', '{fake}', '{user_id}')",
        database=srv.database)


class TwoServerTest(FederationTestCase):
    def setUp(self):
        self.a = self.start_fed(A_IP)
        self.b = self.start_fed(B_IP)
        self.alice = register(self.a, "alice", display_name="alice's phone")
        self.bob = register(self.b, "bob", display_name="bob's laptop")

    def shared_room(self):
        """alice's room on A with bob of B joined, on both servers (the fixture above)."""
        room = Client(self.a, self.alice).create_room(name="shared")
        join_fixture(self.a, room, self.bob.user_id)
        join_fixture(self.b, room, self.alice.user_id)
        join_fixture(self.b, room, self.bob.user_id)
        return room

    def b_rows(self, sql):
        return harness.psql(sql, database=self.b.database)


class KeysAcrossServersTest(TwoServerTest):
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


class ToDeviceAcrossServersTest(TwoServerTest):
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


class DeviceListsAcrossServersTest(TwoServerTest):
    def changes(self, since):
        status, body = self.bob.json("GET", f"{KEYS}/changes?from={since}")
        self.assertEqual(status, 200, body)
        return body["changed"]

    def b_record(self):
        rows = self.b_rows("SELECT stream_id, devices FROM e2ee_remote_device_lists"
                           f" WHERE user_id = '{self.alice.user_id}'")
        return (int(rows[0][0]), json.loads(rows[0][1])) if rows else None

    def a_stream_id(self):
        rows = harness.psql("SELECT stream_id FROM e2ee_device_list_streams"
                            f" WHERE user_id = '{self.alice.user_id}'", database=self.a.database)
        return int(rows[0][0]) if rows else 0

    def test_device_changes_reach_a_server_sharing_a_room_in_order_and_a_gap_is_resynced(self):
        # Before they share a room, B hears nothing of alice's keys.
        upload(self.alice, device_keys=device_keys(self.alice))
        self.shared_room()
        since = stream_token(self.b)

        # A second device of alice: B learns of it (first news of alice: a resync).
        phone = login(self.a, "alice")
        self.assertEqual(upload(phone, device_keys=device_keys(phone))[0], 200)
        wait_until(lambda: self.alice.user_id in self.changes(since),
                   what="alice in bob's keys/changes")
        record = wait_until(self.b_record, what="B's record of alice's devices")
        self.assertEqual(record[0], self.a_stream_id())
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
        self.b_rows("UPDATE e2ee_remote_device_lists SET stream_id = 0, devices = '{}'")
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


class TypingAndReceiptsAcrossServersTest(TwoServerTest):
    def test_typing_and_read_receipts_cross_both_ways(self):
        room = self.shared_room()
        alice = Client(self.a, self.alice)
        event_id = alice.send(room, {"msgtype": "m.text", "body": "hello"})

        # A -> B: alice types and reads; B stores both for its users' syncs.
        status, _ = self.alice.json("PUT", f"{V3}/rooms/{quote(room)}/typing/"
                                    f"{quote(self.alice.user_id)}", {"typing": True, "timeout": 20000})
        self.assertEqual(status, 200)
        wait_until(lambda: self.b_rows(
            f"SELECT 1 FROM typing WHERE room_id = '{room}' AND user_id = '{self.alice.user_id}'"
            " AND expires_ts > 0"), what="alice typing at B")
        status, _ = self.alice.json("POST", f"{V3}/rooms/{quote(room)}/receipt/m.read/"
                                    f"{quote(event_id)}", {})
        self.assertEqual(status, 200)
        rows = wait_until(lambda: self.b_rows(
            f"SELECT event_id FROM receipts WHERE room_id = '{room}'"
            f" AND user_id = '{self.alice.user_id}' AND receipt_type = 'm.read'"),
            what="alice's receipt at B")
        self.assertEqual(rows, [[event_id]])

        # B -> A: bob types; alice's /sync on A shows him typing in the room.
        since = sync(self.alice)["next_batch"]
        status, body = self.bob.json("PUT", f"{V3}/rooms/{quote(room)}/typing/"
                                     f"{quote(self.bob.user_id)}", {"typing": True})
        self.assertEqual(status, 200, body)

        def bob_typing():
            answer = sync(self.alice, since, timeout_ms=1000)
            joined = answer["rooms"]["join"].get(room, {})
            for e in joined.get("ephemeral", {}).get("events", []):
                if e["type"] == "m.typing" and self.bob.user_id in e["content"]["user_ids"]:
                    return True
            return None
        wait_until(bob_typing, what="bob typing in alice's sync")

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


if __name__ == "__main__":
    import unittest
    unittest.main()
