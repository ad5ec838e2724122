"""Room federation: events other servers accept (signed, hashed, with the spec's auth and
prev events), the endpoints other servers read rooms with (/event, /state, /state_ids,
/backfill, /get_missing_events) under history visibility for servers and server ACLs, and
joining through the resident server (make_join / send_join, make_leave / send_leave).

A fake peer (federation_support.FakeKeyServer: it publishes its key, and the test signs
its requests and events with it) plays the other server where the test needs one that can
lie; two Atrium processes play both sides where the real thing can run.
"""

import json
import time
import uuid

from accounts import deactivate, quote, register
from federation_support import sign_json, verify_json
from rooms_client import Client, content_hash, redact, reference_event_id, stored_pdus
from harness import psql
from test_federation import A_IP, B_IP, FAKE_IP, FederationTestCase

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


def tag():
    """A suffix for the localparts of one test on a server its class shares."""
    return uuid.uuid4().hex[:8]


_PEER_NAMES = set()  # fresh_fake_peer's


def fresh_fake_peer(case):
    """case.fake_peer() under a server name (its port) no other test of the process had: a
    class's shared server keeps what it learnt of a peer (its key, a backoff), which must
    not meet a later test's new peer that happens to get the same port."""
    while True:
        peer = case.fake_peer()
        if peer.server_name not in _PEER_NAMES:
            _PEER_NAMES.add(peer.server_name)
            return peer
        peer.close()


class SharedServerCase(FederationTestCase):
    """One A for all the tests of a class (start_class_fed), each test with its own fake
    peer (a new server name), its own alice and its own rooms; none stops the server, and
    counters are read as deltas from the test's start (what a fresh server would count)."""

    def setUp(self):
        self.peer = fresh_fake_peer(self)
        self.a = self.start_class_fed(A_IP)
        self.metrics_at_start = self.a.metrics()
        self.alice = Client(self.a, register(self.a, f"alice{tag()}"))
        self.view = PeerView(self.a, self.peer)

    def counted(self, name, labels=None):
        """How much the metric (its samples with these labels) grew since setUp began."""
        def total(samples):
            return sum(value for sample, sample_labels, value in samples if sample == name and
                       all(sample_labels.get(k) == str(v) for k, v in (labels or {}).items()))
        return total(self.a.metrics()) - total(self.metrics_at_start)


class ServedEventsTest(SharedServerCase):

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

    def test_an_erased_users_events_are_served_redacted_to_other_servers(self):
        room = self.world_readable_room(preset="public_chat")
        account = register(self.a, f"mal{tag()}")
        mal = Client(self.a, account)
        mal.join(room)
        erased = mal.send(room, {"msgtype": "m.text", "body": "erase me"})
        kept = self.alice.send(room, {"msgtype": "m.text", "body": "stays"})
        self.assertEqual(deactivate(self.a, account, erase=True)[0], 200)
        key_id, public = a_key(self.a)

        # /event: the same event (same ID, A's signature verifies), its content gone; the
        # content hash is the original's, so a receiving server keeps it redacted.
        status, body = self.view.get(f"{FED}/v1/event/{quote(erased)}")
        self.assertEqual(status, 200, body)
        [pdu] = body["pdus"]
        self.assertEqual((pdu["content"], pdu["sender"]), ({}, mal.user_id))
        self.assertEqual(reference_event_id(pdu, "10"), erased)
        self.assertTrue(verify_json(redact(pdu, "10"), self.a.server_name, key_id, public))
        self.assertNotEqual(pdu["hashes"]["sha256"], content_hash(pdu))
        # /backfill and /get_missing_events alike; alice's message and mal's membership
        # (without its profile) go out as they must.
        status, body = self.view.get(f"{FED}/v1/backfill/{quote(room)}?v={quote(kept)}&limit=50")
        self.assertEqual(status, 200, body)
        served = {reference_event_id(p, "10"): p for p in body["pdus"]}
        self.assertEqual(served[erased]["content"], {})
        self.assertEqual(served[kept]["content"]["body"], "stays")
        joins = [p for p in served.values()
                 if p["type"] == "m.room.member" and p["state_key"] == mal.user_id]
        self.assertEqual([p["content"] for p in joins], [{"membership": "join"}])
        status, body = self.view.send("POST", f"{FED}/v1/get_missing_events/{quote(room)}",
                                      {"earliest_events": [], "latest_events": [kept],
                                       "limit": 10, "min_depth": 0})
        self.assertEqual(status, 200, body)
        missing = {reference_event_id(p, "10"): p for p in body["events"]}
        self.assertEqual(missing[erased]["content"], {})
        # Before the erasure nothing was hidden: alice's own view of the stored event.
        self.assertEqual(dict(stored_pdus(self.a, room))[erased]["content"]["body"], "erase me")

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


def complete_event(template, server_name, key, version="10", **changes):
    """A template (make_join/make_leave) completed as the joining server does: origin and
    time set, content hash, signature over the redacted event; (event, event_id)."""
    ev = {k: v for k, v in template.items() if k not in ("event_id", "hashes", "signatures",
                                                         "unsigned")}
    ev["origin"] = server_name
    ev["origin_server_ts"] = int(time.time() * 1000)
    ev.update(changes)
    ev["hashes"] = {"sha256": content_hash(ev)}
    signed = sign_json(redact(ev, version), server_name, key)
    ev["signatures"] = signed["signatures"]
    return ev, reference_event_id(ev, version)


class ResidentJoinTest(SharedServerCase):
    """This server as the resident server of a room a fake peer's user joins and leaves."""

    def setUp(self):
        super().setUp()
        self.user = f"@pat:{self.peer.server_name}"

    def make(self, room, what="join", user=None, ver="&ver=10&ver=11"):
        user = user or self.user
        q = f"?{ver[1:]}" if what == "join" and ver else ""
        return self.view.get(f"{FED}/v1/make_{what}/{quote(room)}/{quote(user)}{q}")

    def send(self, room, ev, event_id, what="join"):
        return self.view.send("PUT", f"{FED}/v2/send_{what}/{quote(room)}/{quote(event_id)}", ev)

    def members(self, room):
        body = self.alice.ok("GET", f"/_matrix/client/v3/rooms/{quote(room)}/members")
        return {e["state_key"]: e["content"]["membership"] for e in body["chunk"]}

    def test_a_peer_joins_a_public_room_and_gets_the_full_state_then_leaves(self):
        room = self.alice.create_room(preset="public_chat", name="Lobby")
        self.alice.send(room, {"msgtype": "m.text", "body": "before"})
        status, made = self.make(room)
        self.assertEqual(status, 200, made)
        self.assertEqual(made["room_version"], "10")
        tmpl = made["event"]
        self.assertEqual((tmpl["type"], tmpl["state_key"], tmpl["sender"], tmpl["content"]),
                         ("m.room.member", self.user, self.user, {"membership": "join"}))
        ev, event_id = complete_event(tmpl, self.peer.server_name, self.peer.key,
                                      content={"membership": "join", "displayname": "Pat"})
        status, answer = self.send(room, ev, event_id)
        self.assertEqual(status, 200, answer)
        state_types = {(p["type"], p["state_key"]) for p in answer["state"]}
        self.assertIn(("m.room.create", ""), state_types)
        self.assertIn(("m.room.name", ""), state_types)
        self.assertIn(("m.room.member", self.alice.user_id), state_types)
        self.assertNotIn(("m.room.member", self.user), state_types)  # the state before it
        self.assertEqual(answer["servers_in_room"], [self.a.server_name])
        key_id, public = a_key(self.a)
        for p in answer["state"] + answer["auth_chain"]:
            self.assertTrue(verify_json(redact(p, "10"), self.a.server_name, key_id, public))
        # Stored on A, as the peer's, visible to A's clients with the peer's profile.
        self.assertEqual(self.members(room)[self.user], "join")
        [(origin,)] = psql(f"SELECT origin FROM events WHERE event_id = '{event_id}'",
                           database=self.a.database)
        self.assertEqual(origin, self.peer.server_name)
        sync = self.alice.sync()
        names = [e["content"].get("displayname") for e in
                 sync["rooms"]["join"][room]["timeline"]["events"] if e["type"] == "m.room.member"]
        self.assertIn("Pat", names)
        # The peer now sees the room's events (it is in the room).
        msg = self.alice.send(room, {"msgtype": "m.text", "body": "after"})
        self.assertEqual(self.view.get(f"{FED}/v1/event/{quote(msg)}")[0], 200)
        # A second send_join of the same event is answered again, stored once.
        self.assertEqual(self.send(room, ev, event_id)[0], 200)
        self.assertEqual(psql(f"SELECT count(*) FROM events WHERE event_id = '{event_id}'",
                              database=self.a.database), [["1"]])
        # Leaving: make_leave, send_leave.
        status, made = self.make(room, "leave")
        self.assertEqual(status, 200, made)
        self.assertEqual(made["event"]["prev_events"], [msg])
        ev, leave_id = complete_event(made["event"], self.peer.server_name, self.peer.key)
        self.assertEqual(self.send(room, ev, leave_id, "leave"), (200, {}))
        self.assertEqual(self.members(room)[self.user], "leave")

    def test_an_invite_only_room_refuses_the_join_at_make_join(self):
        room = self.alice.create_room(preset="private_chat")
        status, body = self.make(room)
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"))

    def test_make_join_names_the_rooms_version_when_the_peer_does_not_support_it(self):
        room = self.alice.create_room(preset="public_chat")
        status, body = self.make(room, ver="&ver=9")
        self.assertEqual((status, body["errcode"], body["room_version"]),
                         (400, "M_INCOMPATIBLE_ROOM_VERSION", "10"))

    def test_a_peer_cannot_join_for_a_user_of_another_server(self):
        room = self.alice.create_room(preset="public_chat")
        status, body = self.make(room, user="@mallory:elsewhere.example")
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"))

    def test_send_join_refuses_a_bad_signature_a_wrong_hash_and_a_wrong_id(self):
        room = self.alice.create_room(preset="public_chat")
        _, made = self.make(room)
        from federation_support import SigningKey
        impostor = SigningKey(self.peer.key.key_id.split(":")[1])
        ev, event_id = complete_event(made["event"], self.peer.server_name, impostor)
        status, body = self.send(room, ev, event_id)
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"), body)
        ev, event_id = complete_event(made["event"], self.peer.server_name, self.peer.key)
        tampered = dict(ev, content={"membership": "join", "displayname": "changed"})
        status, body = self.send(room, tampered, reference_event_id(tampered, "10"))
        self.assertEqual((status, body["errcode"]), (400, "M_BAD_JSON"), body)
        status, body = self.send(room, ev, "$not-its-id")
        self.assertEqual((status, body["errcode"]), (400, "M_BAD_JSON"), body)
        self.assertNotIn(self.user, self.members(room))
        # The good one still works.
        self.assertEqual(self.send(room, ev, event_id)[0], 200)


class FakePeerTest(SharedServerCase):
    """A fake peer in a room of A (joined through make_join/send_join) sends PDUs in
    transactions: good ones, and each kind of bad one the spec names."""

    def setUp(self):
        super().setUp()
        self.user = f"@pat:{self.peer.server_name}"
        self.room = self.alice.create_room(preset="public_chat")
        _, made = self.view.get(f"{FED}/v1/make_join/{quote(self.room)}/{quote(self.user)}?ver=10")
        ev, event_id = complete_event(made["event"], self.peer.server_name, self.peer.key)
        status, _ = self.view.send("PUT", f"{FED}/v2/send_join/{quote(self.room)}/{quote(event_id)}", ev)
        self.assertEqual(status, 200)
        self.txn = 0

    def q(self, sql):
        return psql(sql, database=self.a.database)

    def event(self, content, event_type="m.room.message", state_key=None, key=None, prev=None,
              room=None, sender=None, member=None, more_auth=(), **changes):
        room = room or self.room
        sender = sender or self.user
        # One psql for what the event refers to: the power levels and the create event
        # (one each: a scalar subquery fails on two), the sender's member events, the
        # room's extremities, its depth.
        state = f"SELECT event_id FROM current_state WHERE room_id = '{room}' AND type ="
        [(pl, create, members, tips, depth)] = self.q(
            f"SELECT ({state} 'm.room.power_levels'), ({state} 'm.room.create'),"
            f" (SELECT string_agg(event_id, ' ') FROM ({state} 'm.room.member'"
            f" AND state_key = '{sender}') m),"
            f" (SELECT string_agg(event_id, ' ') FROM room_extremities WHERE room_id = '{room}'),"
            f" (SELECT max(depth) FROM events WHERE room_id = '{room}')")
        self.assertTrue(pl and create and depth, (pl, create, depth))
        member = [member] if member else members.split()
        prev = prev or tips.split()
        ev = {"type": event_type, "room_id": room, "sender": sender, "content": content,
              "auth_events": [create, pl] + member + list(more_auth),
              "prev_events": prev,
              "depth": int(depth) + 1}
        if state_key is not None:
            ev["state_key"] = state_key
        return complete_event(ev, self.peer.server_name, key or self.peer.key, **changes)

    def send_txn(self, *pdus):
        self.txn += 1
        body = {"origin": self.peer.server_name, "origin_server_ts": int(time.time() * 1000),
                "pdus": list(pdus)}
        status, answer = self.view.send("PUT", f"{FED}/v1/send/t{self.txn}", body)
        self.assertEqual(status, 200, answer)
        return answer["pdus"]

    def stored(self, event_id):
        rows = self.q(f"SELECT 'stream' FROM events WHERE event_id = '{event_id}'"
                      f" UNION ALL SELECT status FROM event_outliers WHERE event_id = '{event_id}'")
        return [r[0] for r in rows]

    def timeline(self):
        chunk = self.alice.ok("GET", f"/_matrix/client/v3/rooms/{quote(self.room)}/messages?dir=b&limit=50")["chunk"]
        return {e["event_id"]: e for e in chunk}

    def test_a_good_pdu_is_accepted_and_reaches_the_clients(self):
        ev, event_id = self.event({"msgtype": "m.text", "body": "hi from pat"})
        self.assertEqual(self.send_txn(ev), {event_id: {}})
        self.assertEqual(self.stored(event_id), ["stream"])
        self.assertEqual(self.timeline()[event_id]["content"]["body"], "hi from pat")
        # Replayed: the same answer, stored once.
        self.txn -= 1
        self.assertEqual(self.send_txn(ev), {event_id: {}})
        self.assertEqual(self.stored(event_id), ["stream"])

    def test_a_bad_signature_is_rejected_and_nothing_is_stored(self):
        from federation_support import SigningKey
        impostor = SigningKey(self.peer.key.key_id.split(":")[1])
        ev, event_id = self.event({"msgtype": "m.text", "body": "forged"}, key=impostor)
        labels = {"outcome": "rejected", "check": "signature"}
        self.assertIn("error", self.send_txn(ev)[event_id])
        self.assertEqual(self.stored(event_id), [])
        self.assertEqual(self.counted("atrium_rooms_inbound_pdus_total", labels), 1)

    def test_a_wrong_content_hash_is_stored_redacted(self):
        ev, event_id = self.event({"msgtype": "m.text", "body": "original"})
        ev["content"] = {"msgtype": "m.text", "body": "altered in transit"}  # hash and ID stay
        self.assertEqual(self.send_txn(ev), {event_id: {}})
        self.assertEqual(self.stored(event_id), ["stream"])
        self.assertEqual(self.timeline()[event_id]["content"], {})
        [(pdu,)] = self.q(f"SELECT pdu FROM events WHERE event_id = '{event_id}'")
        self.assertNotIn("altered", pdu)
        self.assertEqual(self.counted("atrium_rooms_inbound_pdus_redacted_total"), 1)

    def test_an_auth_failure_is_rejected_and_kept_out_of_state_and_timeline(self):
        [(before,)] = self.q(f"SELECT event_id FROM current_state WHERE room_id = '{self.room}'"
                             " AND type = 'm.room.power_levels'")
        ev, event_id = self.event({"users": {self.user: 100}}, "m.room.power_levels", "")
        # Processed (rejected is a verdict): {}, as Synapse answers (issue 30 item 4).
        self.assertEqual(self.send_txn(ev), {event_id: {}})
        self.assertEqual(self.stored(event_id), ["rejected"])
        self.assertNotIn(event_id, self.timeline())
        self.assertEqual(self.q(f"SELECT event_id FROM current_state WHERE room_id = '{self.room}'"
                                " AND type = 'm.room.power_levels'"), [[before]])
        # Never served to anyone, nor the state at it.
        status, _ = self.view.get(f"{FED}/v1/event/{quote(event_id)}")
        self.assertEqual(status, 404)
        for path in ("state", "state_ids"):
            status, body = self.view.get(f"{FED}/v1/{path}/{quote(self.room)}?event_id={quote(event_id)}")
            self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"), body)
        status, body = self.view.get(f"{FED}/v1/event_auth/{quote(self.room)}/{quote(event_id)}")
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"), body)
        # Sent again: the same verdict, nothing stored twice.
        self.assertEqual(self.send_txn(ev), {event_id: {}})
        self.assertEqual(self.stored(event_id), ["rejected"])

    def test_an_auth_event_the_origin_cannot_serve_now_leaves_the_pdu_undecided(self):
        # Pat's new member event (a display name) is never sent; a message names it among
        # its auth events. A asks the peer for it, which cannot answer yet (404).
        [(rules,)] = self.q(f"SELECT event_id FROM current_state WHERE room_id = '{self.room}'"
                            " AND type = 'm.room.join_rules'")
        member, member_id = self.event({"membership": "join", "displayname": "Pat"},
                                       "m.room.member", self.user, more_auth=[rules])
        ev, event_id = self.event({"msgtype": "m.text", "body": "as Pat"}, member=member_id)
        self.assertIn("error", self.send_txn(ev)[event_id])
        self.assertEqual(self.stored(event_id), [])  # not decided: not kept as rejected
        self.assertEqual(self.stored(member_id), [])
        # Once the peer serves it, the same PDU sent again is accepted.
        keys = self.peer.do_get

        def serve(handler):
            if handler.path == f"{FED}/v1/event/{quote(member_id)}":
                return self.peer.reply(handler, 200, {
                    "origin": self.peer.server_name, "pdus": [member],
                    "origin_server_ts": int(time.time() * 1000)})
            return keys(handler)
        self.peer.do_get = serve
        self.assertEqual(self.send_txn(ev), {event_id: {}})
        self.assertEqual(self.stored(event_id), ["stream"])
        self.assertEqual(self.stored(member_id), ["outlier"])
        self.assertEqual(self.timeline()[event_id]["content"]["body"], "as Pat")

    def test_an_event_for_a_room_the_peer_is_not_in_is_rejected(self):
        other = self.alice.create_room(preset="public_chat")
        ev, event_id = self.event({"msgtype": "m.text", "body": "intruder"}, room=other)
        labels = {"outcome": "rejected", "check": "origin"}
        self.assertIn("error", self.send_txn(ev)[event_id])
        self.assertEqual(self.stored(event_id), [])
        self.assertEqual(self.counted("atrium_rooms_inbound_pdus_total", labels), 1)

    def test_after_a_ban_the_peer_can_no_longer_send_into_the_room(self):
        [(old_tip,)] = self.q(f"SELECT event_id FROM room_extremities WHERE room_id = '{self.room}'")
        [(join,)] = self.q(f"SELECT event_id FROM current_state WHERE room_id = '{self.room}'"
                           f" AND state_key = '{self.user}'")
        self.assertEqual(self.alice.member_action(self.room, "ban", self.user)[0], 200)
        # On top of the ban: refused by the state before it.
        ev, event_id = self.event({"msgtype": "m.text", "body": "still here"})
        self.assertEqual(self.send_txn(ev), {event_id: {}})  # rejected: processed
        self.assertEqual(self.stored(event_id), ["rejected"])
        # Beside it (prev_events from before the ban): valid then, refused by the current
        # state: soft-failed, kept, not in the timeline.
        ev, event_id = self.event({"msgtype": "m.text", "body": "sneaky"}, prev=[old_tip], member=join)
        labels = {"outcome": "soft_failed", "check": ""}
        self.assertEqual(self.send_txn(ev), {event_id: {}})
        self.assertEqual(self.stored(event_id), ["soft_failed"])
        self.assertNotIn(event_id, self.timeline())
        self.assertEqual(self.counted("atrium_rooms_inbound_pdus_total", labels), 1)

    def test_concurrent_state_resolves_by_the_spec_not_by_arrival(self):
        pl = self.alice.state(self.room, "m.room.power_levels")
        pl["users"][self.user] = 50
        self.alice.put_state(self.room, "m.room.power_levels", pl)
        self.alice.put_state(self.room, "m.room.topic", {"topic": "old"})
        [(tip,)] = self.q(f"SELECT event_id FROM room_extremities WHERE room_id = '{self.room}'")
        mine = self.alice.put_state(self.room, "m.room.topic", {"topic": "A"})
        # pat's topic beside alice's (the same prev event), sent earlier by its clock: it
        # arrives last, but resolution v2 orders these two by origin_server_ts, so alice's,
        # the later, is applied last and stays.
        ev, theirs = self.event({"topic": "P"}, "m.room.topic", "", prev=[tip],
                                origin_server_ts=int(time.time() * 1000) - 60000)
        self.assertEqual(self.send_txn(ev), {theirs: {}})
        self.assertEqual(self.stored(theirs), ["stream"])
        self.assertEqual(self.alice.state(self.room, "m.room.topic"), {"topic": "A"})
        self.assertEqual(sorted(r[0] for r in self.q(
            f"SELECT event_id FROM room_extremities WHERE room_id = '{self.room}'")), sorted([mine, theirs]))
        self.assertGreaterEqual(self.counted("atrium_rooms_state_resolutions_total", {"outcome": "ok"}), 1)
        # The next event closes the fork: it names both.
        after = self.alice.send(self.room, {"msgtype": "m.text", "body": "merged"})
        [(pdu,)] = self.q(f"SELECT pdu FROM events WHERE event_id = '{after}'")
        self.assertEqual(sorted(json.loads(pdu)["prev_events"]), sorted([mine, theirs]))
        self.assertEqual(self.alice.state(self.room, "m.room.topic"), {"topic": "A"})

    def messages(self, direction, frm=None, limit=2):
        """One /messages page of the room's messages: (bodies, end token or None)."""
        types = quote(json.dumps({"types": ["m.room.message"]}))
        since = f"&from={quote(frm)}" if frm else ""
        page = self.alice.ok("GET", f"/_matrix/client/v3/rooms/{quote(self.room)}/messages"
                                    f"?dir={direction}&limit={limit}&filter={types}{since}")
        return [e["content"]["body"] for e in page["chunk"]], page.get("end")

    def all_pages(self, direction, frm=None, between=None):
        """Every page from frm on, its bodies in order; between(i) runs after page i."""
        bodies = []
        for i in range(20):
            got, frm = self.messages(direction, frm)
            bodies += got
            if between:
                between(i)
            if not frm:
                return bodies
        self.fail("paging did not end")

    def test_messages_follow_the_rooms_topological_order_not_arrival(self):
        # The peer's join J is the room's tip; alice's m1..m5 follow it. The peer's x
        # names J too (depth J+1, beside m1) but arrives after m5: /messages shows the
        # room by depth, then arrival within a depth (the spec's order, and Synapse's), so
        # x sits between m1 and m2, not after m5, as an event fetched late (a missing
        # event, a backfilled one) sits where it belongs in the history.
        [(join, depth)] = self.q(f"SELECT e.event_id, e.depth FROM room_extremities x JOIN events e"
                                 f" ON e.event_id = x.event_id WHERE x.room_id = '{self.room}'")
        for i in range(1, 6):
            self.alice.send(self.room, {"msgtype": "m.text", "body": f"m{i}"})
        ev, x = self.event({"msgtype": "m.text", "body": "x"}, prev=[join], depth=int(depth) + 1)
        self.assertEqual(self.send_txn(ev), {x: {}})
        self.assertEqual(self.stored(x), ["stream"])
        self.assertEqual(self.messages("b", limit=10)[0], ["m5", "m4", "m3", "m2", "x", "m1"])

        # Paged two at a time, each page resumes where the last ended: an event arriving
        # meanwhile deeper in the history (y, beside x) is met when paging reaches it; one
        # arriving after the first page's place (m6) is not in the backward pages.
        def arrivals(i):
            if i == 0:
                self.alice.send(self.room, {"msgtype": "m.text", "body": "m6"})
                ev, y = self.event({"msgtype": "m.text", "body": "y"}, prev=[join], depth=int(depth) + 1)
                self.assertEqual(self.send_txn(ev), {y: {}})
        self.assertEqual(self.all_pages("b", between=arrivals), ["m5", "m4", "m3", "m2", "y", "x", "m1"])
        self.assertEqual(self.all_pages("f"), ["m1", "x", "y", "m2", "m3", "m4", "m5", "m6"])

        # /context around x in the same order, and its tokens go on from its ends.
        types = quote(json.dumps({"types": ["m.room.message"]}))
        ctx = self.alice.ok("GET", f"/_matrix/client/v3/rooms/{quote(self.room)}/context/{quote(x)}"
                                   f"?limit=2&filter={types}")
        self.assertEqual([[e["content"]["body"] for e in ctx[k]] for k in ("events_before", "events_after")],
                         [["m1"], ["y"]])
        self.assertEqual(self.messages("f", ctx["end"], limit=1)[0], ["m2"])
        self.assertEqual(self.messages("b", ctx["start"], limit=5)[0], [])
        self.assertEqual(self.messages("b", ctx["end"], limit=3)[0], ["y", "x", "m1"])


class TwoServersCase(FederationTestCase):
    """Two Atrium processes, alice on A and bob on B, and the helpers their tests share
    (this file's and test_room_federation_partition.py's)."""

    def setUp(self):
        self.a = self.start_fed(A_IP)
        self.b = self.start_fed(B_IP)
        self.alice = Client(self.a, register(self.a, "alice"))
        self.bob = Client(self.b, register(self.b, "bob"))

    def start_shared_pair(self):
        """setUp for a class whose tests share one A and one B (start_class_fed): each test
        its own alice, bob (tagged localparts) and rooms, none stops a server, and counters
        are read as deltas."""
        self.a = self.start_class_fed(A_IP)
        self.b = self.start_class_fed(B_IP)
        suffix = tag()
        self.alice = Client(self.a, register(self.a, f"alice{suffix}"))
        self.bob = Client(self.b, register(self.b, f"bob{suffix}"))

    def join(self, room, via=None):
        via = via or self.a.server_name
        return self.bob.call("POST", f"/_matrix/client/v3/join/{quote(room)}?server_name={quote(via)}",
                             {}, timeout=30)

    def bodies(self, client, room):
        chunk = client.ok("GET", f"/_matrix/client/v3/rooms/{quote(room)}/messages?dir=b&limit=50")["chunk"]
        return [e["content"].get("body") for e in reversed(chunk) if e["type"] == "m.room.message"]

    def wait_until(self, what, predicate, timeout=20, interval=0.1):
        """Polls predicate every interval seconds: a longer one where each poll costs a
        process (psql) and what is awaited comes on a retry schedule of seconds."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if predicate():
                return
            time.sleep(interval)
        self.fail(f"timed out waiting for {what}")

    def public_room_with_bob(self):
        room = self.alice.create_room(preset="public_chat", name="Talk")
        self.assertEqual(self.join(room)[0], 200)
        return room

    def membership(self, client, room, user_id):
        status, body = client.call("GET", f"/_matrix/client/v3/rooms/{quote(room)}/state/m.room.member/{quote(user_id)}")
        return body.get("membership") if status == 200 else None
