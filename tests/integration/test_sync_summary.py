"""The room summary of /sync: m.heroes are the first five other members in the stream
order of their membership (not by name), joined or invited ones; when none are left, those
who left or were banned; never the syncing user."""

from rooms_client import SharedServerTest


class SyncSummaryTest(SharedServerTest):
    USERS = ("alice", "zed", "bob", "carol")

    def summary(self, who, room):
        return who.sync()["rooms"]["join"][room]["summary"]

    def test_heroes_follow_membership_order_then_fall_back_to_those_who_left(self):
        room = self.alice.create_room(preset="public_chat")
        self.zed.join(room)
        self.bob.join(room)
        self.alice.member_action(room, "invite", self.carol.user_id)
        got = self.summary(self.alice, room)
        self.assertEqual(got["m.heroes"], [self.zed.user_id, self.bob.user_id, self.carol.user_id])
        self.assertEqual((got["m.joined_member_count"], got["m.invited_member_count"]), (3, 1))
        self.assertEqual(self.summary(self.bob, room)["m.heroes"],
                         [self.alice.user_id, self.zed.user_id, self.carol.user_id])
        # Everyone else gone: the ones who left, in the order they left.
        self.bob.leave(room)
        self.zed.leave(room)
        self.alice.member_action(room, "kick", self.carol.user_id)
        got = self.summary(self.alice, room)
        self.assertEqual(got["m.heroes"], [self.bob.user_id, self.zed.user_id, self.carol.user_id])
        self.assertEqual((got["m.joined_member_count"], got["m.invited_member_count"]), (1, 0))
