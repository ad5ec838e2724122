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
"""

import shutil
import tempfile
import unittest
import urllib.parse

from accounts import REGISTRATION_ON, register
from federation_support import FederatedServer, TestCA
from rooms_client import Client, quote
from test_federation import A_IP, B_IP


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
        except BaseException:
            cls.tearDownClass()
            raise

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

    def hierarchy(self, **params):
        query = urllib.parse.urlencode(params)
        return self.alice.call("GET", f"/_matrix/client/v1/rooms/{quote(self.space)}/hierarchy"
                               + (f"?{query}" if query else ""), timeout=60)

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
