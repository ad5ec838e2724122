"""The room summary of /sync: m.heroes are the first five other members in the stream
order of their membership (not by name), joined or invited ones; when none are left, those
who left or were banned; never the syncing user."""

from harness import psql
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

    def test_member_counts_follow_every_kind_of_membership_change(self):
        """The counts are kept with the room (rooms migration 10): each change moves them
        once, a profile change (join to join) not at all, and they always equal what the
        room's current state holds."""
        room = self.alice.create_room(preset="public_chat")
        steps = [
            (lambda: self.zed.join(room), (2, 0)),
            (lambda: self.zed.put_state(room, "m.room.member",
                                        {"membership": "join", "displayname": "Zed Z"},
                                        self.zed.user_id), (2, 0)),
            (lambda: self.alice.member_action(room, "invite", self.carol.user_id), (2, 1)),
            (lambda: self.alice.member_action(room, "invite", self.bob.user_id), (2, 2)),
            (lambda: self.carol.join(room), (3, 1)),
            (lambda: self.alice.member_action(room, "ban", self.bob.user_id), (3, 0)),
            (lambda: self.alice.member_action(room, "kick", self.zed.user_id), (2, 0)),
            (lambda: self.alice.member_action(room, "unban", self.bob.user_id), (2, 0)),
            (lambda: self.bob.join(room), (3, 0)),
            (lambda: self.carol.leave(room), (2, 0)),
        ]
        for i, (step, want) in enumerate(steps):
            step()
            got = self.summary(self.alice, room)
            self.assertEqual((got["m.joined_member_count"], got["m.invited_member_count"]), want,
                             f"after step {i}")
            [[kept_j, kept_i, count_j, count_i]] = psql(
                "SELECT r.joined_members, r.invited_members,"
                " count(*) FILTER (WHERE cs.membership = 'join'),"
                " count(*) FILTER (WHERE cs.membership = 'invite') FROM rooms r"
                " JOIN current_state cs ON cs.room_id = r.room_id AND cs.type = 'm.room.member'"
                f" WHERE r.room_id = '{room}' GROUP BY r.room_id", database=self.srv.database)
            self.assertEqual((int(kept_j), int(kept_i)), want, f"after step {i}")
            self.assertEqual((kept_j, kept_i), (count_j, count_i), f"after step {i}")
