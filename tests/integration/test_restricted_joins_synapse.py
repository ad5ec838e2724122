"""Restricted joins between Atrium and a real Synapse (1.132), both ways: a room of version
10 whose join rule lets the members of a space in ("restricted", and "knock_restricted").

- The room on Synapse: an Atrium user in the space joins through Synapse (its make_join
  names a Synapse user as the authoriser, its send_join co-signs); one who is not is
  refused with Synapse's 403 M_FORBIDDEN, before Atrium is in the room and after (then
  Atrium refuses by itself); a second member of the space at Atrium then joins authorised
  by Atrium's own user, and Synapse takes that join. A room whose allowed space Synapse is
  not in answers M_UNABLE_TO_AUTHORISE_JOIN, one in which no Synapse user may invite
  M_UNABLE_TO_GRANT_JOIN (the spec's errors for make_join, passed on to the client).
- The room on Atrium: the same with the roles swapped (Atrium's make_join names its user,
  its send_join co-signs, a Synapse member of no allowed room gets Atrium's 403; once
  Synapse is in the room it authorises a second Synapse user itself and Atrium takes that
  join); a room where no Atrium user may invite answers M_UNABLE_TO_GRANT_JOIN, which
  Synapse treats as "try another server" and, with none left, tells its client 502.
- knock_restricted, both ways: a user of the other server in no allowed room is refused
  the join and knocks; one in the space joins without knocking.

One Synapse and one Atrium serve every test (each test makes its own rooms and Atrium
users; three Synapse users are shared): a server start is most of the file's time.
Synapse is a test peer, not part of Atrium (test_federation_synapse.py says where it comes
from); without it these tests are skipped with a message saying so.
"""

import concurrent.futures
import json
import os
import threading
import unittest
import uuid

import harness
from accounts import REGISTRATION_ON, quote, register
from common import wait_until
from harness import psql
from rooms_client import Client
from federation_support import FederatedServer
from test_federation_synapse import PEER_SH, SKIP_MESSAGE, SynapseCase

SYNAPSE_IP, ATRIUM_IP = "127.0.0.147", "127.0.0.148"
V3 = "/_matrix/client/v3"
SPACE = {"type": "m.space"}
WAIT_S = 30


def join_rules(space, rule="restricted"):
    return [{"type": "m.room.join_rules", "state_key": "", "content": {"join_rule": rule, "allow": [
        {"type": "m.room_membership", "room_id": space}]}}]


@unittest.skipUnless(os.path.exists(PEER_SH), SKIP_MESSAGE)
class SynapseRestrictedJoinTest(SynapseCase):
    @classmethod
    def setUpClass(cls):
        """Synapse and Atrium start at once (a Synapse start is mostly Python importing
        its modules, an Atrium start under ASan mostly a database made and migrated), then
        the Synapse users every test shares: sam, an admin who makes Synapse's rooms and
        joins Atrium's, sue and syd (a registration costs Synapse a password hash)."""
        super().setUpClass()
        cleanups, box = [], {}

        def launch():
            try:
                box["syn"] = cls._launch_synapse(cls.ca, None, SYNAPSE_IP,
                                                 lambda *c: cleanups.append(c))
            except BaseException as e:  # raised again below, in the test's thread
                box["error"] = e
        starting = threading.Thread(target=launch)
        starting.start()
        try:
            cls.class_servers[ATRIUM_IP] = harness.start_shared(FederatedServer(
                cls.ca, ATRIUM_IP, extra=REGISTRATION_ON, start=False))
        finally:
            starting.join()
            for c in cleanups:
                cls.addClassCleanup(*c)
        if "error" in box:
            raise box["error"]
        cls.syn = box["syn"]
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            cls.sam, cls.sue, cls.syd = pool.map(
                lambda n: Client(cls.syn, cls.syn.register(f"{n}-{uuid.uuid4().hex[:8]}",
                                                           f"{n}-password-1", admin=n == "sam")),
                ("sam", "sue", "syd"))
        cls.syn.unlimit(cls.sam)

    def setUp(self):
        self.a = self.start_class_fed(ATRIUM_IP)  # setUpClass's

    def atrium_user(self, name):
        return Client(self.a, register(self.a, self.peer_user(name)))

    def join(self, client, room, via):
        return client.call("POST", f"{V3}/join/{quote(room)}?server_name={quote(via)}", {},
                           timeout=60)

    def restricted_room(self, owner, space, rule="restricted", **extra):
        return owner.create_room(preset="private_chat", room_version="10",
                                 initial_state=join_rules(space, rule), **extra)

    def atrium_join(self, room, user_id):
        """The join event Atrium stored for user_id in room (the newest), or None."""
        rows = psql(f"SELECT pdu FROM events WHERE room_id = '{room}' AND type = 'm.room.member'"
                    f" AND state_key = '{user_id}' ORDER BY stream_pos DESC LIMIT 1",
                    database=self.a.database)
        pdu = json.loads(rows[0][0]) if rows else None
        return pdu if pdu and pdu["content"]["membership"] == "join" else None

    def membership(self, client, room, user_id):
        status, body = client.call("GET", f"{V3}/rooms/{quote(room)}/state/m.room.member/"
                                   f"{quote(user_id)}")
        return body if status == 200 else None

    def assert_refused(self, answer, status, errcode):
        self.assertEqual((answer[0], answer[1].get("errcode")), (status, errcode), answer[1])

    def test_a_synapse_room_restricted_to_a_synapse_space(self):
        sam = self.sam
        alice, bob, carol = (self.atrium_user(n) for n in ("alice", "bob", "carol"))
        space = sam.create_room(preset="public_chat", creation_content=SPACE)
        room = self.restricted_room(sam, space)
        via = self.syn.server_name

        # Not in the space, and Atrium not in the room: Synapse's make_join refuses.
        self.assert_refused(self.join(carol, room, via), 403, "M_FORBIDDEN")
        self.assertEqual(psql(f"SELECT count(*) FROM rooms WHERE room_id = '{room}'",
                              database=self.a.database), [["0"]])

        # In the space: Synapse names sam as the authoriser and co-signs the join.
        self.assertEqual(self.join(alice, space, via), (200, {"room_id": space}))
        self.assertEqual(self.join(alice, room, via), (200, {"room_id": room}))
        join = self.atrium_join(room, alice.user_id)
        self.assertEqual(join["content"]["join_authorised_via_users_server"], sam.user_id)
        self.assertEqual(set(join["signatures"]), {self.a.server_name, self.syn.server_name})
        theirs = self.membership(sam, room, alice.user_id)
        self.assertEqual((theirs["membership"], theirs["join_authorised_via_users_server"]),
                         ("join", sam.user_id))

        # Atrium is in the room now and refuses carol itself, as Synapse did.
        self.assert_refused(self.join(carol, room, via), 403, "M_FORBIDDEN")
        # bob joins the space, then the room authorised by alice (Atrium's user, who may
        # invite: invite is 0 in Synapse's private_chat), and Synapse takes that join.
        self.assertEqual(self.join(bob, space, via), (200, {"room_id": space}))
        self.assertEqual(self.join(bob, room, via), (200, {"room_id": room}))
        self.assertEqual(self.atrium_join(room, bob.user_id)["content"]
                         ["join_authorised_via_users_server"], alice.user_id)
        theirs = wait_until(lambda: self.membership(sam, room, bob.user_id), timeout=WAIT_S,
                            what="bob's join at Synapse")
        self.assertEqual((theirs["membership"], theirs["join_authorised_via_users_server"]),
                         ("join", alice.user_id))
        bob.send(room, {"msgtype": "m.text", "body": "in through alice"})
        wait_until(lambda: "in through alice" in [
            e["content"].get("body") for e in sam.ok(
                "GET", f"{V3}/rooms/{quote(room)}/messages?dir=b&limit=5")["chunk"]],
            timeout=WAIT_S, what="bob's message at Synapse")

    def test_a_synapse_room_no_synapse_user_can_vouch_for(self):
        sam, alice = self.sam, self.atrium_user("alice")
        via = self.syn.server_name
        # The allowed space is Atrium's and Synapse is not in it: Synapse cannot tell.
        ours = alice.create_room(preset="public_chat", creation_content=SPACE)
        room = self.restricted_room(sam, ours)
        self.assert_refused(self.join(alice, room, via), 400, "M_UNABLE_TO_AUTHORISE_JOIN")
        # A space alice is in, but no one at Synapse may invite.
        space = sam.create_room(preset="public_chat", creation_content=SPACE)
        self.assertEqual(self.join(alice, space, via), (200, {"room_id": space}))
        room = self.restricted_room(sam, space, power_level_content_override={"invite": 101})
        self.assert_refused(self.join(alice, room, via), 400, "M_UNABLE_TO_GRANT_JOIN")
        self.assertIsNone(self.atrium_join(room, alice.user_id))

    def test_an_atrium_room_restricted_to_an_atrium_space(self):
        alice = self.atrium_user("alice")
        sam, sue, syd = self.sam, self.sue, self.syd
        space = alice.create_room(preset="public_chat", creation_content=SPACE)
        room = self.restricted_room(alice, space)
        via = self.a.server_name

        # Not in the space, and Synapse not in the room: Atrium's make_join refuses.
        self.assert_refused(self.join(syd, room, via), 403, "M_FORBIDDEN")

        # In the space: Atrium names alice as the authoriser and co-signs the join.
        self.assertEqual(self.join(sam, space, via), (200, {"room_id": space}))
        self.assertEqual(self.join(sam, room, via), (200, {"room_id": room}))
        join = self.atrium_join(room, sam.user_id)
        self.assertEqual(join["content"]["join_authorised_via_users_server"], alice.user_id)
        self.assertEqual(set(join["signatures"]), {self.a.server_name, self.syn.server_name})
        theirs = self.membership(sam, room, sam.user_id)
        self.assertEqual(theirs["join_authorised_via_users_server"], alice.user_id)

        # Synapse is in the room now and refuses syd itself; sue, in the space, joins
        # authorised by sam (invite is 0 in Atrium's private_chat), and Atrium takes it.
        self.assert_refused(self.join(syd, room, via), 403, "M_FORBIDDEN")
        self.assertEqual(self.join(sue, space, via), (200, {"room_id": space}))
        self.assertEqual(self.join(sue, room, via), (200, {"room_id": room}))
        join = wait_until(lambda: self.atrium_join(room, sue.user_id), timeout=WAIT_S,
                          what="sue's join at Atrium")
        self.assertEqual(join["content"]["join_authorised_via_users_server"], sam.user_id)
        self.assertEqual(self.membership(alice, room, sue.user_id)["membership"], "join")
        self.assertIsNone(self.atrium_join(room, syd.user_id))

    def test_an_atrium_room_no_atrium_user_can_vouch_for(self):
        alice, sue = self.atrium_user("alice"), self.sue
        via = self.a.server_name
        space = alice.create_room(preset="public_chat", creation_content=SPACE)
        self.assertEqual(self.join(sue, space, via), (200, {"room_id": space}))
        room = self.restricted_room(alice, space, power_level_content_override={"invite": 101})
        # Atrium's make_join answers 400 M_UNABLE_TO_GRANT_JOIN. Synapse tries another server
        # on a 400 only with that errcode or M_UNABLE_TO_AUTHORISE_JOIN (else it passes the
        # refusal on), logging the status alone, and having none left answers its client 502.
        log_path = os.path.join(self.syn["dir"], "homeserver.log")
        before = os.path.getsize(log_path)
        status, body = self.join(sue, room, via)
        self.assertEqual(status, 502, body)
        with open(log_path, encoding="utf8") as log:
            log.seek(before)
            logged = log.read()
        self.assertIn(f"Failed to make_join via {via}: 400", logged)
        self.assertIsNone(self.atrium_join(room, sue.user_id))

    def test_knock_restricted_lets_space_members_of_synapse_join_an_atrium_room(self):
        alice, sue, syd = self.atrium_user("alice"), self.sue, self.syd
        space = alice.create_room(preset="public_chat", creation_content=SPACE)
        room = self.restricted_room(alice, space, rule="knock_restricted")
        via = self.a.server_name
        # syd, in no allowed room, may not join (Atrium's make_join refuses) but may knock.
        self.assert_refused(self.join(syd, room, via), 403, "M_FORBIDDEN")
        status, body = syd.call("POST", f"{V3}/knock/{quote(room)}?server_name={quote(via)}",
                                {"reason": "let me in"})
        self.assertEqual((status, body), (200, {"room_id": room}))
        self.assertEqual(self.membership(alice, room, syd.user_id)["membership"], "knock")
        # sue, in the space, joins authorised by alice without knocking.
        self.assertEqual(self.join(sue, space, via), (200, {"room_id": space}))
        self.assertEqual(self.join(sue, room, via), (200, {"room_id": room}))
        self.assertEqual(self.atrium_join(room, sue.user_id)["content"]
                         ["join_authorised_via_users_server"], alice.user_id)

    def test_knock_restricted_lets_space_members_of_atrium_join_a_synapse_room(self):
        sam = self.sam
        alice, carol = (self.atrium_user(n) for n in ("alice", "carol"))
        space = sam.create_room(preset="public_chat", creation_content=SPACE)
        room = self.restricted_room(sam, space, rule="knock_restricted")
        via = self.syn.server_name
        # carol, in no allowed room, may not join (Synapse's make_join refuses) but may knock.
        self.assert_refused(self.join(carol, room, via), 403, "M_FORBIDDEN")
        status, body = carol.call("POST", f"{V3}/knock/{quote(room)}?server_name={quote(via)}",
                                  {"reason": "let me in"}, timeout=60)
        self.assertEqual((status, body), (200, {"room_id": room}))
        self.assertEqual(self.membership(sam, room, carol.user_id)["membership"], "knock")
        # alice, in the space, joins authorised by sam without knocking.
        self.assertEqual(self.join(alice, space, via), (200, {"room_id": space}))
        self.assertEqual(self.join(alice, room, via), (200, {"room_id": room}))
        self.assertEqual(self.atrium_join(room, alice.user_id)["content"]
                         ["join_authorised_via_users_server"], sam.user_id)
        self.assertEqual(self.membership(sam, room, alice.user_id)["membership"], "join")


if __name__ == "__main__":
    unittest.main()
