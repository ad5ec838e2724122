"""Spaces: GET /_matrix/client/v1/rooms/{roomId}/hierarchy on one server (the tree depth
first in the spec's order, suggested_only, max_depth, limit and paging tokens, rooms the
user may not see left out, the root's 403) and the federation's
GET /_matrix/federation/v1/hierarchy/{roomId} served to another server.

The class shares one server and one tree (built once in setUpClass):

    space "Root" (public space)
      +- sub "Sub" (public space, order "a")
      |    +- c "C" (public, suggested)
      |    +- d "D" (invite only: alice alone)
      |    +- e "E" (public space)
      |         +- f "F" (public)
      +- a "A" (public, suggested, order "b")
      +- w "W" (private but world_readable, no order, older)
      +- r "R" (restricted to members of A, no order, newer)
      +- gone (m.space.child without via: not a child)
"""

import shutil
import tempfile
import time
import unittest
import urllib.parse

from accounts import REGISTRATION_ON, register
from federation_support import FakeKeyServer, FederatedServer, TestCA
from test_federation import A_IP, FAKE_IP
from rooms_client import Client, SharedServerTest, quote

V1 = "/_matrix/client/v1"


def hierarchy(client, room, **params):
    query = urllib.parse.urlencode(params)
    return client.call("GET", f"{V1}/rooms/{quote(room)}/hierarchy" + (f"?{query}" if query else ""))


class SpaceHierarchyTest(SharedServerTest):
    USERS = ("alice", "bob")

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        alice, server = cls.alice, cls.srv.server_name
        space = {"type": "m.space"}

        def child(parent, room, **content):
            alice.put_state(parent, "m.space.child", {"via": [server], **content}, state_key=room)

        cls.root = alice.create_room(preset="public_chat", name="Root", topic="The top",
                                     creation_content=space)
        cls.sub = alice.create_room(preset="public_chat", name="Sub", creation_content=space)
        cls.a = alice.create_room(preset="public_chat", name="A")
        cls.c = alice.create_room(preset="public_chat", name="C")
        cls.d = alice.create_room(preset="private_chat", name="D")
        cls.e = alice.create_room(preset="public_chat", name="E", creation_content=space)
        cls.f = alice.create_room(preset="public_chat", name="F")
        cls.w = alice.create_room(preset="private_chat", name="W", initial_state=[
            {"type": "m.room.history_visibility", "content": {"history_visibility": "world_readable"}}])
        cls.r = alice.create_room(preset="private_chat", name="R", room_version="10", initial_state=[
            {"type": "m.room.join_rules", "content": {"join_rule": "restricted", "allow": [
                {"type": "m.room_membership", "room_id": cls.a}]}}])
        cls.private_space = alice.create_room(preset="private_chat", creation_content=space)
        # Children of the root: w before r by timestamp; sub ("a") and a ("b") by order.
        child(cls.root, cls.w)
        time.sleep(0.01)
        child(cls.root, cls.r, order="x" * 51)  # too long: not a valid order, so by timestamp
        child(cls.root, cls.a, order="b", suggested=True)
        child(cls.root, cls.sub, order="a")
        alice.put_state(cls.root, "m.space.child", {}, state_key="!gone:" + server)
        child(cls.sub, cls.c, suggested=True)
        child(cls.sub, cls.d)
        child(cls.sub, cls.e)
        child(cls.e, cls.f)
        child(cls.e, cls.root)  # a loop: the root is shown once

    def ids(self, body):
        return [room["room_id"] for room in body["rooms"]]

    def test_the_tree_is_walked_depth_first_in_the_specs_order(self):
        status, body = hierarchy(self.alice, self.root)
        self.assertEqual(status, 200, body)
        self.assertEqual(self.ids(body), [self.root, self.sub, self.c, self.d, self.e, self.f,
                                          self.a, self.w, self.r])
        self.assertNotIn("next_batch", body)

    def test_each_room_has_its_summary_and_a_space_its_children_state(self):
        status, body = hierarchy(self.alice, self.root)
        rooms = {room["room_id"]: room for room in body["rooms"]}
        root = rooms[self.root]
        self.assertEqual((root["name"], root["topic"], root["room_type"], root["join_rule"]),
                         ("Root", "The top", "m.space", "public"))
        self.assertEqual((root["num_joined_members"], root["world_readable"], root["guest_can_join"]),
                         (1, False, False))
        kids = root["children_state"]
        self.assertEqual([k["state_key"] for k in kids], [self.sub, self.a, self.w, self.r])
        for k in kids:
            self.assertEqual(set(k), {"type", "state_key", "content", "sender", "origin_server_ts"})
            self.assertEqual((k["type"], k["sender"]), ("m.space.child", self.alice.user_id))
        self.assertEqual(rooms[self.a]["children_state"], [])
        self.assertNotIn("room_type", rooms[self.a])
        self.assertTrue(rooms[self.w]["world_readable"])
        self.assertEqual((rooms[self.r]["join_rule"], rooms[self.r]["allowed_room_ids"],
                          rooms[self.r]["room_version"]), ("restricted", [self.a], "10"))

    def test_suggested_only_keeps_the_suggested_children(self):
        status, body = hierarchy(self.alice, self.root, suggested_only="true")
        self.assertEqual(status, 200, body)
        self.assertEqual(self.ids(body), [self.root, self.a])
        self.assertEqual([k["state_key"] for k in body["rooms"][0]["children_state"]], [self.a])

    def test_max_depth_stops_the_walk(self):
        self.assertEqual(self.ids(hierarchy(self.alice, self.root, max_depth=0)[1]), [self.root])
        self.assertEqual(self.ids(hierarchy(self.alice, self.root, max_depth=1)[1]),
                         [self.root, self.sub, self.a, self.w, self.r])
        self.assertEqual(self.ids(hierarchy(self.alice, self.root, max_depth=2)[1]),
                         [self.root, self.sub, self.c, self.d, self.e, self.a, self.w, self.r])

    def test_pages_follow_each_other_with_tokens(self):
        seen, params = [], {"limit": 2}
        for _ in range(10):
            status, body = hierarchy(self.alice, self.root, **params)
            self.assertEqual(status, 200, body)
            self.assertLessEqual(len(body["rooms"]), 2)
            seen += self.ids(body)
            if "next_batch" not in body:
                break
            params = {"limit": 2, "from": body["next_batch"]}
        self.assertEqual(seen, [self.root, self.sub, self.c, self.d, self.e, self.f, self.a,
                                self.w, self.r])

    def test_a_token_only_fits_its_own_walk(self):
        token = hierarchy(self.alice, self.root, limit=1)[1]["next_batch"]
        for params in ({"from": token, "max_depth": 1}, {"from": token, "suggested_only": "true"},
                       {"from": "nonsense"}, {"from": token + "0"}):
            status, body = hierarchy(self.alice, self.root, **params)
            self.assertEqual((status, body.get("errcode")), (400, "M_INVALID_PARAM"), params)
        status, body = hierarchy(self.alice, self.sub, **{"from": token})
        self.assertEqual(status, 400, body)
        status, body = hierarchy(self.bob, self.root, **{"from": token})
        self.assertEqual(status, 400, body)

    def test_bad_parameters_are_refused(self):
        for params in ({"limit": 0}, {"limit": "x"}, {"max_depth": -1}, {"suggested_only": "yes"}):
            status, body = hierarchy(self.alice, self.root, **params)
            self.assertEqual((status, body.get("errcode")), (400, "M_INVALID_PARAM"), params)

    def test_rooms_the_user_may_not_see_are_left_out(self):
        # bob is in no room: D (invite only) and R (restricted to A) are hidden.
        status, body = hierarchy(self.bob, self.root)
        self.assertEqual(status, 200, body)
        self.assertEqual(self.ids(body), [self.root, self.sub, self.c, self.e, self.f, self.a, self.w])

    def test_a_restricted_room_shows_to_members_of_an_allowed_room(self):
        carol = Client(self.srv, register(self.srv, "carol"))
        self.assertNotIn(self.r, self.ids(hierarchy(carol, self.root)[1]))
        carol.join(self.a)
        self.assertIn(self.r, self.ids(hierarchy(carol, self.root)[1]))

    def test_a_root_the_user_cannot_see_is_forbidden(self):
        for room in (self.private_space, "!unknown:" + self.srv.server_name):
            status, body = hierarchy(self.bob, room)
            self.assertEqual((status, body.get("errcode")), (403, "M_FORBIDDEN"), room)
        status, body = hierarchy(self.alice, self.private_space)
        self.assertEqual((status, self.ids(body)), (200, [self.private_space]))


class FederationHierarchyServedTest(unittest.TestCase):
    """GET /_matrix/federation/v1/hierarchy/{roomId} asked by a fake peer (its requests
    signed with its own key) of one Atrium server; the peer has no users anywhere."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="atrium-spaces-ca-")
        cls.ca = TestCA(cls.tmp)
        cls.peer = FakeKeyServer(cls.ca, FAKE_IP)
        cls.a = FederatedServer(cls.ca, A_IP, extra=REGISTRATION_ON, start=False)
        try:
            cls.a.start()
            cls.alice = Client(cls.a, register(cls.a, "alice"))
            alice, server = cls.alice, cls.a.server_name
            space = {"type": "m.space"}
            cls.space = alice.create_room(preset="public_chat", name="Space", creation_content=space)
            cls.public = alice.create_room(preset="public_chat", name="P")
            cls.private = alice.create_room(preset="private_chat", name="Q")
            cls.readable = alice.create_room(preset="private_chat", name="W", initial_state=[
                {"type": "m.room.history_visibility", "content": {"history_visibility": "world_readable"}}])
            cls.restricted = alice.create_room(preset="private_chat", room_version="10", initial_state=[
                {"type": "m.room.join_rules", "content": {"join_rule": "restricted", "allow": [
                    {"type": "m.room_membership", "room_id": cls.public}]}}])
            cls.hidden_space = alice.create_room(preset="private_chat", creation_content=space)
            for i, room in enumerate((cls.public, cls.private, cls.readable, cls.restricted,
                                      "!elsewhere:example.org")):
                alice.put_state(cls.space, "m.space.child",
                                {"via": [server], "order": str(i), "suggested": room == cls.public},
                                state_key=room)
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.a.close()
        cls.peer.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def ask(self, room, query=""):
        status, _, body = self.a.signed_request("GET", f"/_matrix/federation/v1/hierarchy/{quote(room)}{query}",
                                                self.peer.server_name, self.peer.key)
        return status, body

    def test_a_space_answers_its_room_the_children_the_peer_may_see_and_the_others(self):
        status, body = self.ask(self.space)
        self.assertEqual(status, 200, body)
        self.assertEqual(body["room"]["room_id"], self.space)
        self.assertEqual(body["room"]["room_type"], "m.space")
        self.assertEqual([k["state_key"] for k in body["room"]["children_state"]],
                         [self.public, self.private, self.readable, self.restricted,
                          "!elsewhere:example.org"])
        self.assertEqual([c["room_id"] for c in body["children"]], [self.public, self.readable])
        self.assertEqual(body["children"][0]["name"], "P")
        self.assertNotIn("children_state", body["children"][0])
        # Q is invite only, R restricted to a room the peer has no user in; the room this
        # server does not hold is not its to judge.
        self.assertEqual(body["inaccessible_children"], [self.private, self.restricted])

    def test_suggested_only_keeps_the_suggested_children(self):
        status, body = self.ask(self.space, "?suggested_only=true")
        self.assertEqual(status, 200, body)
        self.assertEqual([k["state_key"] for k in body["room"]["children_state"]], [self.public])
        self.assertEqual(([c["room_id"] for c in body["children"]], body["inaccessible_children"]),
                         ([self.public], []))

    def test_rooms_the_peer_cannot_see_or_this_server_does_not_know_are_not_found(self):
        for room in (self.hidden_space, "!unknown:" + self.a.server_name):
            status, body = self.ask(room)
            self.assertEqual((status, body.get("errcode")), (404, "M_NOT_FOUND"), room)
        status, body = self.ask(self.space, "?suggested_only=maybe")
        self.assertEqual((status, body.get("errcode")), (400, "M_INVALID_PARAM"))

    def test_an_unsigned_request_is_refused(self):
        status, _, body = self.a.fed_request("GET", f"/_matrix/federation/v1/hierarchy/{quote(self.space)}")
        self.assertEqual(status, 401, body)
