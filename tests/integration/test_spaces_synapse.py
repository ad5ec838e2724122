"""A space on a real Synapse (1.132), looked into through Atrium: an Atrium user asks
Atrium's GET /_matrix/client/v1/rooms/{roomId}/hierarchy for a space Atrium is not in, and
Atrium asks Synapse's GET /_matrix/federation/v1/hierarchy/{roomId}
(docs/adr/0028-remote-hierarchy-root.md): a public space whose children live on Synapse
and on Atrium, and a private space the Atrium user was invited to and has not joined
(Synapse shows it to a server with a user invited, and Atrium to the invited user).

Synapse is a test peer, not part of Atrium (test_federation_synapse.py says where it comes
from); without it these tests are skipped with a message saying so.
"""

import os
import unittest
import urllib.parse

from accounts import quote, register
from rooms_client import Client
from test_federation_synapse import PEER_SH, SKIP_MESSAGE, SynapseCase

SYNAPSE_IP, ATRIUM_IP = "127.0.0.85", "127.0.0.86"
SPACE = {"type": "m.space"}


@unittest.skipUnless(os.path.exists(PEER_SH), SKIP_MESSAGE)
class SynapseSpaceHierarchyTest(SynapseCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.syn = cls.start_class_synapse(SYNAPSE_IP)

    def setUp(self):
        self.a = self.start_class_fed(ATRIUM_IP)
        self.alice = Client(self.a, register(self.a, self.peer_user("alice")))
        account = self.syn.register(self.peer_user("sam"), "sam-password-1", admin=True)
        self.syn.unlimit(account)
        self.sam = Client(self.syn, account)

    def synapse_space(self, preset, name, children):
        """A space of sam's on Synapse with children [(room, via)] in that order."""
        space = self.sam.create_room(preset=preset, name=name, creation_content=SPACE)
        for i, (child, via) in enumerate(children):
            self.sam.put_state(space, "m.space.child", {"via": [via], "order": str(i)},
                               state_key=child)
        return space

    def hierarchy(self, root, client, **params):
        query = urllib.parse.urlencode(params, doseq=True)
        return client.call("GET", f"/_matrix/client/v1/rooms/{quote(root)}/hierarchy"
                           + (f"?{query}" if query else ""), timeout=60)

    def test_a_synapse_space_is_shown_through_atrium_with_children_on_both(self):
        syn_room = self.sam.create_room(preset="public_chat", name="Synapse room")
        atrium_room = self.alice.create_room(preset="public_chat", name="Atrium room")
        space = self.synapse_space("public_chat", "Synapse space",
                                   ((syn_room, self.syn.server_name),
                                    (atrium_room, self.a.server_name)))
        status, body = self.hierarchy(space, self.alice,
                                      **{"org.matrix.msc4235.via": self.syn.server_name})
        self.assertEqual(status, 200, body)
        self.assertEqual([room["room_id"] for room in body["rooms"]],
                         [space, syn_room, atrium_room])
        root, child, ours = body["rooms"]
        self.assertEqual((root["name"], root["room_type"], root["join_rule"]),
                         ("Synapse space", "m.space", "public"))
        self.assertEqual([k["state_key"] for k in root["children_state"]], [syn_room, atrium_room])
        self.assertEqual((child["name"], child["num_joined_members"]), ("Synapse room", 1))
        self.assertEqual(ours["name"], "Atrium room")
        # Paged, from Atrium's cache of Synapse's answer.
        status, page = self.hierarchy(space, self.alice, limit=1)
        self.assertEqual((status, [r["room_id"] for r in page["rooms"]]), (200, [space]), page)
        status, page = self.hierarchy(space, self.alice, limit=2, **{"from": page["next_batch"]})
        self.assertEqual((status, [r["room_id"] for r in page["rooms"]]),
                         (200, [syn_room, atrium_room]), page)

    def test_a_synapse_space_the_user_was_invited_to_is_shown_before_joining(self):
        syn_room = self.sam.create_room(preset="public_chat", name="Synapse room")
        space = self.synapse_space("private_chat", "Invited space",
                                   ((syn_room, self.syn.server_name),))
        # Without a via: the room's server is asked.
        status, body = self.hierarchy(space, self.alice)
        self.assertEqual((status, body.get("errcode")), (404, "M_NOT_FOUND"), body)
        status, body = self.sam.call("POST", f"/_matrix/client/v3/rooms/{quote(space)}/invite",
                                     {"user_id": self.alice.user_id}, timeout=60)
        self.assertEqual(status, 200, body)
        status, body = self.hierarchy(space, self.alice)
        self.assertEqual(status, 200, body)
        self.assertEqual([room["room_id"] for room in body["rooms"]], [space, syn_room])
        self.assertEqual((body["rooms"][0]["name"], body["rooms"][0]["join_rule"]),
                         ("Invited space", "invite"))
