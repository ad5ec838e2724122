"""Spaces across servers: a space on one Atrium whose children live on another. The
client's GET /_matrix/client/v1/rooms/{roomId}/hierarchy on A asks B with the federation's
GET /v1/hierarchy/{roomId} (parked, under the outbound budget), shows what B lets it see,
keeps B's answer in its cache a while (atrium_rooms_hierarchy_*), and leaves out children
it cannot have (a server that is not there).

    A: space "Space" (alice)               B (bob)
         +- bp     ------------------------->  "B public" (public)
         +- bsub   ------------------------->  "B sub" (public space)
         |                                      +- bleaf "B leaf" (public)
         +- bpriv  ------------------------->  "B private" (invite only)
         +- nowhere (via a server that is not there)
         +- a_room "A room" (public, on A)

A root that A is not in (docs/adr/0028-remote-hierarchy-root.md) is asked of the request's
vias, the room's server, the inviter's: spaces on B that A has no member of.

    B: "B root" (public space)            "B invited" (invite only; alice invited)
         +- bp, +- a_room (on A),            +- bp
         +- bsub (+- bleaf), +- nowhere
"""

import shutil
import tempfile
import unittest
import urllib.parse

from accounts import REGISTRATION_ON, register
from common import Background, wait_until
from federation_support import FederatedServer, HungServer, TestCA
from rooms_client import Client, quote
from test_federation import A_IP, B_IP

HUNG_IP = "127.0.0.87"  # a peer that takes connections and never answers


class RemoteChildrenTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="atrium-spaces-fed-ca-")
        cls.ca = TestCA(cls.tmp)
        cls.servers = []
        try:
            cls.a = cls.start(A_IP)
            cls.b = cls.start(B_IP)
            cls.alice = Client(cls.a, register(cls.a, "alice"))
            cls.bob = Client(cls.b, register(cls.b, "bob"))
            space = {"type": "m.space"}
            bob, b_name = cls.bob, cls.b.server_name
            cls.bp = bob.create_room(preset="public_chat", name="B public", topic="on B")
            cls.bsub = bob.create_room(preset="public_chat", name="B sub", creation_content=space)
            cls.bleaf = bob.create_room(preset="public_chat", name="B leaf")
            cls.bpriv = bob.create_room(preset="private_chat", name="B private")
            bob.put_state(cls.bsub, "m.space.child", {"via": [b_name]}, state_key=cls.bleaf)
            alice = cls.alice
            cls.space = alice.create_room(preset="public_chat", name="Space", creation_content=space)
            cls.a_room = alice.create_room(preset="public_chat", name="A room")
            cls.nowhere = "!nowhere:127.0.0.99:1"
            for i, (room, via) in enumerate(((cls.bp, b_name), (cls.bsub, b_name), (cls.bpriv, b_name),
                                            (cls.nowhere, "127.0.0.99:1"),
                                            (cls.a_room, cls.a.server_name))):
                alice.put_state(cls.space, "m.space.child", {"via": [via], "order": str(i)},
                                state_key=room)
            cls.carol = Client(cls.a, register(cls.a, "carol"))
            cls.broot = cls.remote_space("B root", "public_chat", (
                (cls.bp, b_name), (cls.a_room, cls.a.server_name), (cls.bsub, b_name),
                (cls.nowhere, "127.0.0.99:1")))
            cls.binvited = cls.remote_space("B invited", "private_chat", ((cls.bp, b_name),))
            bob.member_action(cls.binvited, "invite", cls.alice.user_id)
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def remote_space(cls, name, preset, children):
        """A space of bob's on B with children [(room, via)] in that order."""
        room = cls.bob.create_room(preset=preset, name=name, creation_content={"type": "m.space"})
        for i, (child, via) in enumerate(children):
            cls.bob.put_state(room, "m.space.child", {"via": [via], "order": str(i)},
                              state_key=child)
        return room

    @classmethod
    def start(cls, ip):
        srv = FederatedServer(cls.ca, ip, extra=REGISTRATION_ON, start=False)
        cls.servers.append(srv)
        srv.start()
        return srv

    @classmethod
    def tearDownClass(cls):
        for srv in cls.servers:
            srv.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def hierarchy(self, root=None, client=None, **params):
        query = urllib.parse.urlencode(params, doseq=True)
        return (client or self.alice).call(
            "GET", f"/_matrix/client/v1/rooms/{quote(root or self.space)}/hierarchy"
            + (f"?{query}" if query else ""), timeout=60)

    def asked(self, outcome):
        return self.a.metric("atrium_rooms_hierarchy_remote_total", {"outcome": outcome})

    def test_a_root_on_another_server_is_asked_of_it_and_its_children_wherever_they_are(self):
        status, body = self.hierarchy(self.broot)
        self.assertEqual(status, 200, body)
        # B's root, B's rooms, A's own room (from A's state), B's subspace and its leaf; the
        # child on a server that is not there is left out.
        self.assertEqual([room["room_id"] for room in body["rooms"]],
                         [self.broot, self.bp, self.a_room, self.bsub, self.bleaf])
        root = body["rooms"][0]
        self.assertEqual((root["name"], root["room_type"], root["num_joined_members"]),
                         ("B root", "m.space", 1))
        self.assertEqual([k["state_key"] for k in root["children_state"]],
                         [self.bp, self.a_room, self.bsub, self.nowhere])
        self.assertEqual(body["rooms"][2]["name"], "A room")

    def test_pages_of_a_remote_root_come_from_the_cached_answer(self):
        self.assertEqual(self.hierarchy(self.broot)[0], 200)
        ok = self.asked("ok")
        seen, params = [], {"limit": 2}
        for _ in range(5):
            status, body = self.hierarchy(self.broot, **params)
            self.assertEqual(status, 200, body)
            seen += [room["room_id"] for room in body["rooms"]]
            if "next_batch" not in body:
                break
            params = {"limit": 2, "from": body["next_batch"]}
        self.assertEqual(seen, [self.broot, self.bp, self.a_room, self.bsub, self.bleaf])
        # max_depth and suggested_only hold for a remote root too.
        status, body = self.hierarchy(self.broot, max_depth=0)
        self.assertEqual((status, [r["room_id"] for r in body["rooms"]]), (200, [self.broot]))
        # Every page from the cache: B was not asked again.
        self.assertEqual(self.asked("ok"), ok)
        status, body = self.hierarchy(self.broot, limit=2, max_depth=1,
                                      **{"from": params["from"]})
        self.assertEqual((status, body.get("errcode")), (400, "M_INVALID_PARAM"), body)

    def test_vias_are_asked_in_turn_past_a_dead_one(self):
        root = self.remote_space("B vias", "public_chat", ((self.bp, self.b.server_name),))
        ok, failed = self.asked("ok"), self.asked("failed")
        status, body = self.hierarchy(root, **{"org.matrix.msc4235.via": ["127.0.0.99:1",
                                                                          self.b.server_name]})
        self.assertEqual(status, 200, body)
        self.assertEqual([room["room_id"] for room in body["rooms"]], [root, self.bp])
        # The dead via first (it failed), then B, which answered; bp came with B's answer.
        self.assertEqual((self.asked("ok") - ok, self.asked("failed") - failed), (1, 1))

    def test_at_most_four_servers_are_asked_for_a_root(self):
        root = self.remote_space("B far", "public_chat", ())
        dead = [f"127.0.0.99:{port}" for port in (11, 12, 13, 14)]
        failed = self.asked("failed")
        # Four dead vias use up the root's servers before B, the room's own, is reached.
        status, body = self.hierarchy(root, via=dead)
        self.assertEqual((status, body.get("errcode")), (404, "M_NOT_FOUND"), body)
        self.assertEqual(self.asked("failed") - failed, 4)
        # Three leave B its turn.
        status, body = self.hierarchy(root, via=dead[:3])
        self.assertEqual((status, [r["room_id"] for r in body.get("rooms", [])]), (200, [root]))

    def test_a_silent_via_parks_the_request_under_the_budget_until_it_gives_way(self):
        hung = HungServer(HUNG_IP)
        self.addCleanup(hung.close)
        root = self.remote_space("B slow", "public_chat", ())
        first = Background(self.hierarchy, root, via=[hung.server_name, self.b.server_name])
        wait_until(lambda: len(hung.accepted) == 1, what="A asking the silent via")
        # Parked on it: alice's one slot of the outbound budget is taken (429 at once), and
        # carol's hierarchy of a space A is in answers meanwhile.
        status, body = self.hierarchy(root)
        self.assertEqual((status, body.get("errcode")), (429, "M_LIMIT_EXCEEDED"), body)
        status, body = self.hierarchy(self.a_room, client=self.carol)
        self.assertEqual((status, [r["room_id"] for r in body["rooms"]]), (200, [self.a_room]))
        self.assertFalse(first.done())
        # The silent server hangs up: B, next in turn, answers the parked request.
        hung.close()
        status, body = first.result(timeout=60)
        self.assertEqual((status, [r["room_id"] for r in body["rooms"]]), (200, [root]), body)

    def test_a_via_that_is_not_a_server_name_is_refused_before_anything_is_asked(self):
        ok, failed = self.asked("ok"), self.asked("failed")
        for name in ("org.matrix.msc4235.via", "via", "server_name"):
            for bad in ("bad..name", "a/b", "x" * 300):
                status, body = self.hierarchy(self.broot, **{name: ["127.0.0.99:1", bad]})
                self.assertEqual((status, body.get("errcode")), (400, "M_INVALID_PARAM"),
                                 (name, bad, body))
        self.assertEqual((self.asked("ok"), self.asked("failed")), (ok, failed))

    def test_a_root_no_server_knows_is_404(self):
        unknown = "!nosuchspace:" + self.b.server_name
        status, body = self.hierarchy(unknown, via=[self.b.server_name])
        self.assertEqual((status, body.get("errcode")), (404, "M_NOT_FOUND"), body)
        status, body = self.hierarchy("!nosuchspace:127.0.0.99:1")
        self.assertEqual((status, body.get("errcode")), (404, "M_NOT_FOUND"), body)

    def test_a_space_the_user_was_invited_to_can_be_looked_into_before_joining(self):
        status, body = self.hierarchy(self.binvited)
        self.assertEqual(status, 200, body)
        self.assertEqual([room["room_id"] for room in body["rooms"]], [self.binvited, self.bp])
        self.assertEqual((body["rooms"][0]["name"], body["rooms"][0]["join_rule"]),
                         ("B invited", "invite"))
        # B shows it to A for alice's invite; carol, on A but not invited, may not see it.
        status, body = self.hierarchy(self.binvited, client=self.carol)
        self.assertEqual((status, body.get("errcode")), (403, "M_FORBIDDEN"), body)

    def test_children_on_another_server_are_asked_of_it_and_cached(self):
        status, body = self.hierarchy()
        self.assertEqual(status, 200, body)
        rooms = {room["room_id"]: room for room in body["rooms"]}
        # Depth first through B's subspace; B's private room and the unreachable one are
        # left out.
        self.assertEqual([room["room_id"] for room in body["rooms"]],
                         [self.space, self.bp, self.bsub, self.bleaf, self.a_room])
        self.assertEqual((rooms[self.bp]["name"], rooms[self.bp]["topic"],
                          rooms[self.bp]["num_joined_members"]), ("B public", "on B", 1))
        self.assertEqual(rooms[self.bsub]["room_type"], "m.space")
        self.assertEqual([k["state_key"] for k in rooms[self.bsub]["children_state"]], [self.bleaf])
        asked = self.a.metric("atrium_rooms_hierarchy_remote_total", {"outcome": "ok"})
        self.assertGreaterEqual(asked, 2)  # the public room's answer and the subspace's
        self.assertGreaterEqual(self.a.metric("atrium_rooms_hierarchy_remote_total", {"outcome": "failed"}), 1)
        self.assertGreaterEqual(self.a.metric("atrium_rooms_hierarchy_cache_entries"), 3)
        # Again: every room of B from the cache, nobody asked.
        status, again = self.hierarchy()
        self.assertEqual((status, again["rooms"]), (200, body["rooms"]))
        self.assertEqual(self.a.metric("atrium_rooms_hierarchy_remote_total", {"outcome": "ok"}), asked)

    def test_paging_reaches_the_remote_rooms_too(self):
        seen, params = [], {"limit": 2}
        for _ in range(5):
            status, body = self.hierarchy(**params)
            self.assertEqual(status, 200, body)
            seen += [room["room_id"] for room in body["rooms"]]
            if "next_batch" not in body:
                break
            params = {"limit": 2, "from": body["next_batch"]}
        self.assertEqual(seen, [self.space, self.bp, self.bsub, self.bleaf, self.a_room])
