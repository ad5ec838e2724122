"""Room federation: events other servers accept (signed, hashed, with the spec's auth and
prev events), the endpoints other servers read rooms with (/event, /state, /state_ids,
/backfill, /get_missing_events) under history visibility for servers and server ACLs, and
joining through the resident server (make_join / send_join, make_leave / send_leave).

A fake peer (federation_support.FakeKeyServer: it publishes its key, and the test signs
its requests and events with it) plays the other server where the test needs one that can
lie; two Atrium processes play both sides where the real thing can run.
"""

import hashlib
import json
import time

from accounts import quote, register
from federation_support import canonical, sign_json, verify_json
from rooms_client import (Client, content_hash, redact, reference_event_id, stored_pdus,
                          unpadded_b64)
from harness import psql
from test_federation import A_IP, FAKE_IP, FederationTestCase

FED = "/_matrix/federation"


def a_key(srv):
    status, _, doc = srv.fed_request("GET", "/_matrix/key/v2/server")
    assert status == 200, doc
    [(key_id, key)] = doc["verify_keys"].items()
    return key_id, key["key"]


class PeerView:
    """The fake peer's signed requests to one Atrium server."""

    def __init__(self, srv, peer):
        self.srv, self.peer = srv, peer

    def get(self, path):
        status, _, body = self.srv.signed_request("GET", path, self.peer.server_name, self.peer.key)
        return status, body

    def send(self, method, path, content):
        status, _, body = self.srv.signed_request(method, path, self.peer.server_name,
                                                  self.peer.key, content)
        return status, body


class ServedEventsTest(FederationTestCase):
    def setUp(self):
        self.peer = self.fake_peer()
        self.a = self.start_fed(A_IP)
        self.alice = Client(self.a, register(self.a, "alice"))
        self.view = PeerView(self.a, self.peer)

    def world_readable_room(self, **extra):
        return self.alice.create_room(initial_state=[{
            "type": "m.room.history_visibility", "state_key": "",
            "content": {"history_visibility": "world_readable"}}], **extra)

    def test_events_are_signed_hashed_and_carry_the_specs_auth_and_prev_events(self):
        room = self.world_readable_room()
        first = self.alice.send(room, {"msgtype": "m.text", "body": "one"})
        second = self.alice.send(room, {"msgtype": "m.text", "body": "two"})
        key_id, public = a_key(self.a)
        events = dict(stored_pdus(self.a, room))
        ids_by_type = {(p["type"], p.get("state_key")): i for i, p in events.items()}
        status, body = self.view.get(f"{FED}/v1/event/{quote(second)}")
        self.assertEqual(status, 200, body)
        self.assertEqual(body["origin"], self.a.server_name)
        [pdu] = body["pdus"]
        # The ID is the reference hash; the content hash is right; A's signature is over
        # the redacted event and verifies with the key A publishes.
        self.assertEqual(reference_event_id(pdu, "10"), second)
        self.assertEqual(pdu["hashes"]["sha256"], content_hash(pdu))
        self.assertTrue(verify_json(redact(pdu, "10"), self.a.server_name, key_id, public))
        # Every stored event is signed so.
        for event_id, stored in events.items():
            self.assertTrue(verify_json(redact(stored, "10"), self.a.server_name, key_id, public),
                            event_id)
        # prev_events: the event before; depth one more; auth events: create, power
        # levels, the sender's membership.
        self.assertEqual(pdu["prev_events"], [first])
        self.assertEqual(pdu["depth"], events[first]["depth"] + 1)
        self.assertEqual(sorted(pdu["auth_events"]), sorted([
            ids_by_type[("m.room.create", "")], ids_by_type[("m.room.power_levels", "")],
            ids_by_type[("m.room.member", self.alice.user_id)]]))
        # A membership event also names the join rules (join) and the target's member event.
        join = events[ids_by_type[("m.room.member", self.alice.user_id)]]
        self.assertIn(ids_by_type[("m.room.create", "")], join["auth_events"])

    def test_state_and_state_ids_answer_the_state_before_an_event_with_its_auth_chain(self):
        room = self.world_readable_room(name="Lobby")
        msg = self.alice.send(room, {"msgtype": "m.text", "body": "hi"})
        topic = self.alice.put_state(room, "m.room.topic", {"topic": "t"})
        state_types = {p["type"] for _, p in stored_pdus(self.a, room) if "state_key" in p}
        status, ids = self.view.get(f"{FED}/v1/state_ids/{quote(room)}?event_id={quote(msg)}")
        self.assertEqual(status, 200, ids)
        status, full = self.view.get(f"{FED}/v1/state/{quote(room)}?event_id={quote(msg)}")
        self.assertEqual(status, 200, full)
        got = {p["type"] for p in full["pdus"]}
        self.assertEqual(got, state_types - {"m.room.topic"})  # before the message: no topic
        self.assertEqual(sorted(ids["pdu_ids"]),
                         sorted(reference_event_id(p, "10") for p in full["pdus"]))
        self.assertNotIn(topic, ids["pdu_ids"])
        # The auth chain holds the create event (every other event's auth root), and no
        # event of the state needs anything outside state + chain.
        known = set(ids["pdu_ids"]) | set(ids["auth_chain_ids"])
        for p in full["pdus"] + full["auth_chain"]:
            self.assertTrue(set(p["auth_events"]) <= known, p)
        status, after = self.view.get(f"{FED}/v1/state_ids/{quote(room)}?event_id={quote(topic)}")
        self.assertNotIn(topic, after["pdu_ids"])
        status, later = self.view.get(
            f"{FED}/v1/state_ids/{quote(room)}?event_id={quote(self.alice.send(room, {'body': 'x', 'msgtype': 'm.text'}))}")
        self.assertIn(topic, later["pdu_ids"])

    def test_backfill_and_missing_events_walk_back_from_the_given_events(self):
        room = self.world_readable_room()
        sent = [self.alice.send(room, {"msgtype": "m.text", "body": f"m{i}"}) for i in range(5)]
        status, body = self.view.get(f"{FED}/v1/backfill/{quote(room)}?v={quote(sent[3])}&limit=3")
        self.assertEqual(status, 200, body)
        self.assertEqual([reference_event_id(p, "10") for p in body["pdus"]],
                         [sent[3], sent[2], sent[1]])
        status, body = self.view.send("POST", f"{FED}/v1/get_missing_events/{quote(room)}",
                                      {"earliest_events": [sent[0]], "latest_events": [sent[4]],
                                       "limit": 10, "min_depth": 0})
        self.assertEqual(status, 200, body)
        self.assertEqual([reference_event_id(p, "10") for p in body["events"]],
                         [sent[1], sent[2], sent[3]])

    def test_a_server_with_no_member_sees_nothing_of_a_room_that_is_not_world_readable(self):
        room = self.alice.create_room()
        msg = self.alice.send(room, {"msgtype": "m.text", "body": "secret"})
        status, body = self.view.get(f"{FED}/v1/event/{quote(msg)}")
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"))
        status, body = self.view.get(f"{FED}/v1/state_ids/{quote(room)}?event_id={quote(msg)}")
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"))
        status, body = self.view.get(f"{FED}/v1/backfill/{quote(room)}?v={quote(msg)}&limit=10")
        self.assertEqual((status, body["pdus"]), (200, []))
        status, body = self.view.get(f"{FED}/v1/event/{quote('$nope')}")
        self.assertEqual(status, 404)

    def test_a_server_denied_by_the_rooms_acl_is_refused_whatever_the_visibility(self):
        room = self.world_readable_room()
        msg = self.alice.send(room, {"msgtype": "m.text", "body": "hi"})
        self.assertEqual(self.view.get(f"{FED}/v1/event/{quote(msg)}")[0], 200)
        self.alice.put_state(room, "m.room.server_acl",
                             {"allow": ["*"], "deny": [FAKE_IP], "allow_ip_literals": True})
        status, body = self.view.get(f"{FED}/v1/event/{quote(msg)}")
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"))
        status, body = self.view.get(f"{FED}/v1/state_ids/{quote(room)}?event_id={quote(msg)}")
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"))
        self.a.wait_for_log("refused by the server ACL")
