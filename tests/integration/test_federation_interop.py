"""Federation interop (issue 30): the v1 forms of send_join, send_leave and invite and
GET /v1/event_auth as Atrium serves them to another server (played by a fake peer that
signs its own events), and Atrium as the asking server falling back to the v1 forms when
a peer does not know the v2 ones (V1OnlyPeer: a resident of its own room, built and signed
here, that answers 404 M_UNRECOGNIZED to every v2 membership route), and a make_join
refused by every via answered with the refusal itself, not a 502.

Each class's tests share its Atrium (a start costs about a CPU-second): each test has a
fake peer of its own (a name, a key, rooms) and users of its own.
"""

import itertools
import json
import time
import urllib.parse

from accounts import register
from federation_support import FakeKeyServer, sign_json, xmatrix
from rooms_client import Client, content_hash, redact, reference_event_id
from test_federation import A_IP, B_IP, FAKE_IP, FederationTestCase

VERSION = "10"
_names = itertools.count(1)  # users of their own on the servers the tests share


def quote(s):
    return urllib.parse.quote(s, safe="")


def seal(event, server_name, key):
    """event hashed, signed by server_name and given its ID: (event_id, event)."""
    ev = dict(event)
    ev.setdefault("origin", server_name)
    ev.setdefault("origin_server_ts", int(time.time() * 1000))
    ev["hashes"] = {"sha256": content_hash(ev)}
    ev["signatures"] = sign_json(redact(ev, VERSION), server_name, key)["signatures"]
    return reference_event_id(ev, VERSION), ev


class V1OnlyPeer(FakeKeyServer):
    """A server that only speaks the v1 membership routes: a room of its own (create, its
    creator's join, power levels, a public join rule), make_join/make_leave templates on
    it, v1 send_join/send_leave/invite answered in the v1 envelope, every v2 form 404
    M_UNRECOGNIZED. make_join of `closed_room` is refused 403 M_FORBIDDEN."""

    def __init__(self, ca, ip):
        super().__init__(ca, ip)
        self.creator = f"@creator:{self.server_name}"
        self.room = f"!v1room:{self.server_name}"
        self.closed_room = "!closed:127.0.0.99:1"
        self.events = {}  # event_id -> event
        prev = []
        state = []
        for depth, (typ, content) in enumerate([
                ("m.room.create", {"creator": self.creator, "room_version": VERSION}),
                ("m.room.member", {"membership": "join"}),
                ("m.room.power_levels", {"users": {self.creator: 100}}),
                ("m.room.join_rules", {"join_rule": "public"})], start=1):
            sk = self.creator if typ == "m.room.member" else ""
            eid, ev = seal({"type": typ, "state_key": sk, "content": content, "room_id": self.room,
                            "sender": self.creator, "depth": depth, "prev_events": prev,
                            "auth_events": list(state[:3]) if typ != "m.room.create" else []},
                           self.server_name, self.key)
            self.events[eid] = ev
            state.append(eid)
            prev = [eid]
        self.state = state
        self.sent = []  # (path, body) of every PUT
        self.invites = {}  # user_id -> the invite event's ID

    def do_get(self, handler):
        path = handler.path.split("?")[0]
        parts = path.split("/")
        if path.startswith("/_matrix/federation/v1/make_"):
            kind, room, user = parts[4][len("make_"):], urllib.parse.unquote(parts[5]), \
                urllib.parse.unquote(parts[6])
            if room == self.closed_room:
                self.reply(handler, 403, {"errcode": "M_FORBIDDEN", "error": "closed here"})
                return
            create, member, pl, jr = self.state
            self.reply(handler, 200, {"room_version": VERSION, "event": {
                "type": "m.room.member", "state_key": user, "sender": user, "room_id": room,
                "content": {"membership": kind}, "depth": 5, "prev_events": [jr],
                "auth_events": [create, pl] + ([jr] if kind == "join" else [])
                + ([self.invites[user]] if user in self.invites else []),
                "origin_server_ts": int(time.time() * 1000)}})
            return
        super().do_get(handler)

    def do_put(self, handler):
        body = json.loads(handler.rfile.read(int(handler.headers["Content-Length"])))
        path = handler.path
        self.sent.append((path, body))
        if path.startswith("/_matrix/federation/v1/send/"):
            self.reply(handler, 200, {"pdus": {}})
        elif path.startswith(("/_matrix/federation/v2/send_join/", "/_matrix/federation/v2/send_leave/",
                              "/_matrix/federation/v2/invite/")):
            self.reply(handler, 404, {"errcode": "M_UNRECOGNIZED", "error": "Unrecognized request"})
        elif path.startswith("/_matrix/federation/v1/send_join/"):
            state = [self.events[e] for e in self.state]
            self.reply(handler, 200, [200, {"origin": self.server_name, "state": state,
                                            "auth_chain": state, "event": body}])
        elif path.startswith("/_matrix/federation/v1/send_leave/"):
            self.reply(handler, 200, [200, {}])
        elif path.startswith("/_matrix/federation/v1/invite/"):
            signed = dict(body)
            signed["signatures"] = dict(body["signatures"])
            signed["signatures"].update(
                sign_json(redact(body, VERSION), self.server_name, self.key)["signatures"])
            self.reply(handler, 200, [200, {"event": signed}])
        else:
            handler.send_error(404)

    def invite(self, server, user_id):
        """Invite user_id (of the Atrium `server`) to the room with v2 (Atrium's route):
        (status, body)."""
        eid, ev = seal({"type": "m.room.member", "state_key": user_id, "sender": self.creator,
                        "room_id": self.room, "content": {"membership": "invite"}, "depth": 5,
                        "prev_events": [self.state[-1]], "auth_events": self.state[:3]},
                       self.server_name, self.key)
        self.invites[user_id] = eid
        uri = f"/_matrix/federation/v2/invite/{quote(self.room)}/{quote(eid)}"
        body = {"event": ev, "room_version": VERSION, "invite_room_state": [
            {"type": "m.room.join_rules", "state_key": "", "sender": self.creator,
             "content": {"join_rule": "invite"}}]}
        status, _, answer = server.signed_request("PUT", uri, self.server_name, self.key, body)
        return status, answer


class ServedV1Forms:
    """Atrium A as the resident: a fake peer joins, reads the auth chain, leaves and is
    invited through the v1 forms."""

    def fed(self, method, path, body=None):
        status, _, answer = self.a.signed_request(method, path, self.peer.server_name,
                                                  self.peer.key, body)
        return status, answer

    def member(self, room, membership):
        """make_<membership> at A, completed and signed as the peer: (event_id, event)."""
        ver = "?ver=" + VERSION if membership == "join" else ""
        status, made = self.fed("GET", f"/_matrix/federation/v1/make_{membership}/{quote(room)}/"
                                f"{quote(self.user)}{ver}")
        self.assertEqual(status, 200, made)
        tmpl = made["event"]
        for k in ("event_id", "hashes", "signatures", "unsigned"):
            tmpl.pop(k, None)
        tmpl["origin"] = self.peer.server_name
        return seal(tmpl, self.peer.server_name, self.peer.key)

    def test_v1_send_join_event_auth_and_v1_send_leave(self):
        room = self.alice.create_room(preset="public_chat", name="Served")
        eid, join = self.member(room, "join")
        status, answer = self.fed("PUT", f"/_matrix/federation/v1/send_join/{quote(room)}/{quote(eid)}",
                                  join)
        self.assertEqual(status, 200, answer)
        self.assertEqual(answer[0], 200)
        types = {e["type"] for e in answer[1]["state"]}
        self.assertTrue({"m.room.create", "m.room.name", "m.room.member"} <= types, types)
        self.assertTrue(answer[1]["auth_chain"])
        members = self.alice.ok("GET", f"/_matrix/client/v3/rooms/{quote(room)}/members")["chunk"]
        self.assertIn(self.user, {m["state_key"] for m in members
                                  if m["content"]["membership"] == "join"})
        # event_auth of the join: exactly its auth chain (create, power levels, join rule,
        # alice's join), as PDUs.
        status, auth = self.fed("GET", f"/_matrix/federation/v1/event_auth/{quote(room)}/{quote(eid)}")
        self.assertEqual(status, 200, auth)
        got = {reference_event_id(e, VERSION) for e in auth["auth_chain"]}
        self.assertTrue(set(join["auth_events"]) <= got, (join["auth_events"], got))
        self.assertNotIn(eid, got)
        self.assertEqual({e["type"] for e in auth["auth_chain"]},
                         {"m.room.create", "m.room.member", "m.room.power_levels",
                          "m.room.join_rules"})
        # An event A does not have, and one of another room: 404.
        status, body = self.fed("GET", f"/_matrix/federation/v1/event_auth/{quote(room)}/"
                                f"{quote('$nope')}")
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"), body)
        # v1 send_leave: [200, {}], and the peer's user has left.
        lid, leave = self.member(room, "leave")
        status, answer = self.fed("PUT", f"/_matrix/federation/v1/send_leave/{quote(room)}/{quote(lid)}",
                                  leave)
        self.assertEqual((status, answer), (200, [200, {}]))
        members = self.alice.ok("GET", f"/_matrix/client/v3/rooms/{quote(room)}/members")["chunk"]
        self.assertEqual({m["state_key"]: m["content"]["membership"] for m in members}[self.user],
                         "leave")

    def test_event_auth_is_refused_to_a_server_not_in_the_room(self):
        room = self.alice.create_room(preset="private_chat")
        [create] = [e for e in self.alice.ok("GET", f"/_matrix/client/v3/rooms/{quote(room)}/state")
                    if e["type"] == "m.room.create"]
        status, body = self.fed("GET", f"/_matrix/federation/v1/event_auth/{quote(room)}/"
                                f"{quote(create['event_id'])}")
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"), body)

    def test_v1_invite_is_signed_and_answered_in_the_v1_envelope(self):
        bob = Client(self.a, register(self.a, f"bob{next(_names)}"))
        room = f"!elsewhere:{self.peer.server_name}"
        stripped = [{"type": "m.room.create", "state_key": "", "sender": self.user,
                     "content": {"room_version": VERSION}},
                    {"type": "m.room.name", "state_key": "", "sender": self.user,
                     "content": {"name": "Over there"}}]
        eid, ev = seal({"type": "m.room.member", "state_key": bob.user_id, "sender": self.user,
                        "room_id": room, "content": {"membership": "invite"}, "depth": 3,
                        "prev_events": ["$a"], "auth_events": ["$a"]},
                       self.peer.server_name, self.peer.key)
        ev["unsigned"] = {"invite_room_state": stripped}
        status, answer = self.fed("PUT", f"/_matrix/federation/v1/invite/{quote(room)}/{quote(eid)}", ev)
        self.assertEqual(status, 200, answer)
        self.assertEqual(answer[0], 200)
        self.assertEqual(set(answer[1]["event"]["signatures"]),
                         {self.peer.server_name, self.a.server_name})
        invite = bob.sync()["rooms"]["invite"][room]["invite_state"]["events"]
        self.assertIn("Over there", [e["content"].get("name") for e in invite])
        # A room of a version this server does not have, named by its stripped create.
        stripped[0]["content"] = {"room_version": "99"}
        old = f"!old:{self.peer.server_name}"
        eid2, ev2 = seal({"type": "m.room.member", "state_key": bob.user_id, "sender": self.user,
                          "room_id": old, "content": {"membership": "invite"}, "depth": 3,
                          "prev_events": ["$a"], "auth_events": ["$a"]},
                         self.peer.server_name, self.peer.key)
        ev2["unsigned"] = {"invite_room_state": stripped}
        status, body = self.fed("PUT", f"/_matrix/federation/v1/invite/{quote(old)}/"
                                f"{quote(eid2)}", ev2)
        self.assertEqual((status, body["errcode"], body.get("room_version")),
                         (400, "M_INCOMPATIBLE_ROOM_VERSION", "99"), body)


class FallbackToV1Test(FederationTestCase):
    """Atrium B (and A) asking a peer that only knows the v1 membership routes."""

    def setUp(self):
        self.peer = V1OnlyPeer(self.ca, FAKE_IP)
        self.addCleanup(self.peer.close)
        self.b = self.start_class_fed(B_IP)
        self.bob = Client(self.b, register(self.b, f"bob{next(_names)}"))

    def puts(self, prefix):
        return [p.split("/")[3] for p, _ in self.peer.sent if p.startswith(prefix)]

    def test_a_join_falls_back_to_v1_send_join(self):
        status, body = self.bob.call("POST", f"/_matrix/client/v3/join/{quote(self.peer.room)}"
                                     f"?server_name={quote(self.peer.server_name)}", {}, timeout=30)
        self.assertEqual((status, body), (200, {"room_id": self.peer.room}))
        self.assertEqual(self.puts("/_matrix/federation/v2/send_join/") +
                         self.puts("/_matrix/federation/v1/send_join/"), ["v2", "v1"])
        sync = self.bob.sync()
        self.assertIn(self.peer.room, sync["rooms"]["join"])

    def test_declining_an_invite_falls_back_to_v1_send_leave(self):
        status, answer = self.peer.invite(self.b, self.bob.user_id)
        self.assertEqual(status, 200, answer)
        self.assertIn(self.peer.room, self.bob.sync()["rooms"]["invite"])
        status, body = self.bob.call("POST", f"/_matrix/client/v3/rooms/{quote(self.peer.room)}/leave",
                                     {}, timeout=30)
        self.assertEqual((status, body), (200, {}))
        self.assertEqual(self.puts("/_matrix/federation/v2/send_leave/") +
                         self.puts("/_matrix/federation/v1/send_leave/"), ["v2", "v1"])
        self.assertNotIn(self.peer.room, self.bob.sync()["rooms"]["invite"])

    def test_an_invite_falls_back_to_v1_invite(self):
        room = self.bob.create_room(preset="private_chat", name="Ask")
        user = f"@guest:{self.peer.server_name}"
        status, body = self.bob.call("POST", f"/_matrix/client/v3/rooms/{quote(room)}/invite",
                                     {"user_id": user}, timeout=30)
        self.assertEqual((status, body), (200, {}))
        [(_, v1)] = [(p, b) for p, b in self.peer.sent if p.startswith("/_matrix/federation/v1/invite/")]
        self.assertEqual(v1["state_key"], user)  # the event itself, not the v2 wrapper
        self.assertIn("Ask", [e["content"].get("name") for e in v1["unsigned"]["invite_room_state"]])
        members = self.bob.ok("GET", f"/_matrix/client/v3/rooms/{quote(room)}/members")["chunk"]
        self.assertEqual({m["state_key"]: m["content"]["membership"] for m in members}[user], "invite")

    def test_a_make_join_refused_everywhere_is_answered_with_the_refusal(self):
        # The peer refuses (403); the room's own server (tried after it) is not there.
        room = self.peer.closed_room
        status, body = self.bob.call("POST", f"/_matrix/client/v3/join/{quote(room)}"
                                     f"?server_name={quote(self.peer.server_name)}", {}, timeout=60)
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"), body)
        self.assertIn("closed here", body["error"])


class BadInputAndNotary:
    """Bad input from a server is 400 (signature problems stay 401); the key notary
    refetches a key whose cached validity ends before what the asker needs."""

    def test_an_origin_that_is_not_a_server_name_or_a_body_not_json_is_400(self):
        auth = xmatrix("GET", self.uri, "example.com:notaport", self.a.server_name, self.peer.key)
        status, _, body = self.a.fed_request("GET", self.uri, {"Authorization": auth})
        self.assertEqual((status, body["errcode"]), (400, "M_UNAUTHORIZED"), body)
        put = "/_matrix/federation/v1/send/t1"
        auth = xmatrix("PUT", put, self.peer.server_name, self.a.server_name, self.peer.key)
        status, _, body = self.a.fed_request("PUT", put, {"Authorization": auth}, b"{not json")
        self.assertEqual((status, body["errcode"]), (400, "M_NOT_JSON"), body)
        auth = xmatrix("PUT", put, self.peer.server_name, self.a.server_name, self.peer.key, [1])
        status, _, body = self.a.fed_request("PUT", put, {"Authorization": auth}, b"[1]")
        self.assertEqual((status, body["errcode"]), (400, "M_BAD_JSON"), body)
        # A signature over other content is still 401.
        auth = xmatrix("PUT", put, self.peer.server_name, self.a.server_name, self.peer.key,
                       {"pdus": []})
        status, _, body = self.a.fed_request("PUT", put, {"Authorization": auth},
                                             {"pdus": [], "edus": []})
        self.assertEqual((status, body["errcode"]), (401, "M_UNAUTHORIZED"), body)

    def test_the_notary_refetches_a_key_cached_for_less_than_asked(self):
        def query(minimum):
            crit = {} if minimum is None else {"minimum_valid_until_ts": minimum}
            status, _, body = self.a.fed_request("POST", "/_matrix/key/v2/query", body={
                "server_keys": {self.peer.server_name: {self.peer.key.key_id: crit}}})
            self.assertEqual(status, 200, body)
            [doc] = [d for d in body["server_keys"] if d["server_name"] == self.peer.server_name]
            return doc

        fetches = lambda: self.peer.requests.count("/_matrix/key/v2/server")
        first = query(None)
        self.assertEqual(fetches(), 1)
        query(first["valid_until_ts"] - 1000)  # within what is cached: no fetch
        self.assertEqual(fetches(), 1)
        self.peer.valid_for_ms = 3 * 3600 * 1000
        time.sleep(1.1)  # a notary asks one origin again at most once a second
        later = query(first["valid_until_ts"] + 3600 * 1000)
        self.assertEqual(fetches(), 2)
        self.assertGreater(later["valid_until_ts"], first["valid_until_ts"] + 3600 * 1000)


class ServedByATest(ServedV1Forms, BadInputAndNotary, FederationTestCase):
    """The tests of A as the server asked, on one A; a fake peer per test."""

    def setUp(self):
        self.peer = self.fake_peer()
        self.a = self.start_class_fed(A_IP)
        self.alice = Client(self.a, register(self.a, f"alice{next(_names)}"))
        self.user = f"@pat:{self.peer.server_name}"
        self.uri = "/_matrix/federation/v1/query/profile?user_id=" + quote("@x:" + self.a.server_name)
