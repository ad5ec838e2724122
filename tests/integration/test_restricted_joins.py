"""Restricted joins on one server (room versions 8+): a user joined to a room the join rule
allows joins without an invite, and the join names a user of this server who may invite
(content.join_authorised_via_users_server, among the event's auth events); a user in none
of those rooms is refused; knock_restricted (v10+) lets members of an allowed room join
too; a room in which none of our users may invite answers M_UNABLE_TO_GRANT_JOIN.
"""

import json

from harness import psql
from rooms_client import SharedServerTest, quote

V3 = "/_matrix/client/v3"


class RestrictedJoinTest(SharedServerTest):
    USERS = ("alice", "bob", "carol")

    def restricted(self, allowed, rule="restricted", version="10", **extra):
        return self.alice.create_room(preset="private_chat", room_version=version, initial_state=[
            {"type": "m.room.join_rules", "content": {"join_rule": rule, "allow": [
                {"type": "m.room_membership", "room_id": allowed}]}}], **extra)

    def join(self, client, room):
        return client.call("POST", f"{V3}/rooms/{quote(room)}/join", {})

    def stored_join(self, room, user):
        [(pdu,)] = psql(f"SELECT pdu FROM events WHERE room_id = '{room}' AND type = 'm.room.member'"
                        f" AND state_key = '{user}' ORDER BY stream_pos DESC LIMIT 1",
                        database=self.srv.database)
        return json.loads(pdu)

    def test_a_member_of_an_allowed_room_joins_authorised_by_a_local_inviter(self):
        space = self.alice.create_room(preset="public_chat")
        room = self.restricted(space)
        self.bob.join(space)
        status, body = self.join(self.bob, room)
        self.assertEqual((status, body), (200, {"room_id": room}))
        pdu = self.stored_join(room, self.bob.user_id)
        self.assertEqual(pdu["content"]["join_authorised_via_users_server"], self.alice.user_id)
        alice_member = psql(f"SELECT event_id FROM current_state WHERE room_id = '{room}'"
                            f" AND type = 'm.room.member' AND state_key = '{self.alice.user_id}'",
                            database=self.srv.database)[0][0]
        self.assertIn(alice_member, pdu["auth_events"])

    def test_a_user_in_no_allowed_room_is_refused(self):
        space = self.alice.create_room(preset="public_chat")
        room = self.restricted(space)
        status, body = self.join(self.carol, room)
        self.assertEqual((status, body.get("errcode")), (403, "M_FORBIDDEN"), body)

    def test_an_invited_user_joins_without_an_authoriser(self):
        space = self.alice.create_room(preset="public_chat")
        room = self.restricted(space)
        self.alice.member_action(room, "invite", self.carol.user_id)
        self.assertEqual(self.join(self.carol, room)[0], 200)
        self.assertNotIn("join_authorised_via_users_server", self.stored_join(room, self.carol.user_id)["content"])
        self.carol.leave(room)

    def test_knock_restricted_lets_members_of_an_allowed_room_join(self):
        space = self.alice.create_room(preset="public_chat")
        room = self.restricted(space, rule="knock_restricted")
        self.bob.join(space)
        self.assertEqual(self.join(self.bob, room), (200, {"room_id": room}))
        self.assertEqual(self.join(self.carol, room)[1].get("errcode"), "M_FORBIDDEN")

    def test_restricted_needs_version_8_and_is_invite_only_before(self):
        space = self.alice.create_room(preset="public_chat")
        room = self.restricted(space, version="7")
        self.bob.join(space)
        status, body = self.join(self.bob, room)
        self.assertEqual((status, body.get("errcode")), (403, "M_FORBIDDEN"), body)

    def test_no_local_user_who_may_invite_is_unable_to_grant(self):
        space = self.alice.create_room(preset="public_chat")
        room = self.restricted(space, power_level_content_override={"invite": 101})
        self.bob.join(space)
        status, body = self.join(self.bob, room)
        self.assertEqual((status, body.get("errcode")), (400, "M_UNABLE_TO_GRANT_JOIN"), body)
