"""/sync's unread_notifications come from the user's push rules: the server-default rules
decide which unread events notify (plain messages, encrypted ones) and which do not (notices,
reactions, edits, membership), mentions highlight (display name, localpart, m.mentions,
@room from a member with enough power), the user's own rules change the verdict (a room
rule, a default rule switched off), a read receipt or the user's own event resets the
counts, and the count stops at its cap.

Every count is read with a real /sync limited to the room under test; each test makes its
own rooms, so the shared users carry nothing from one test to the next.
"""

import unittest

from rooms_client import V3, SharedServerTest, quote

UNREAD_CAP = 99  # SYNC_MAX_UNREAD_COUNT in core/client/sync/sync_rooms.h


def one_room_filter(room):
    return {"room": {"rooms": [room], "timeline": {"limit": 1}}}


class PushCountsTest(SharedServerTest):
    USERS = ("alice", "bob", "carol")

    # -- helpers ---------------------------------------------------------------------------

    def counts(self, who, room, since=None):
        """(notification_count, highlight_count) of room in who's sync."""
        answer = who.sync(since=since, filter=one_room_filter(room))
        joined = answer["rooms"]["join"]
        self.assertIn(room, joined, f"{room} missing from the sync of {who.user_id}")
        unread = joined[room]["unread_notifications"]
        return unread["notification_count"], unread["highlight_count"]

    def room_of_three(self):
        room = self.alice.create_room(preset="public_chat")
        self.bob.join(room)
        self.carol.join(room)
        return room

    def say(self, who, room, body, **extra):
        return who.send(room, {"msgtype": "m.text", "body": body, **extra})

    def put_rule(self, who, kind, rule_id, body):
        path = f"{V3}/pushrules/global/{kind}/{quote(rule_id)}"
        self.assertEqual(who.call("PUT", path, body), (200, {}))
        self.addCleanup(who.call, "DELETE", path)

    def set_displayname(self, who, name):
        path = f"{V3}/profile/{quote(who.user_id)}/displayname"
        status, body = who.call("GET", path)
        old = body.get("displayname", "") if status == 200 else ""
        self.assertEqual(who.call("PUT", path, {"displayname": name}), (200, {}))
        self.addCleanup(who.call, "PUT", path, {"displayname": old})

    # -- what notifies ---------------------------------------------------------------------

    def test_plain_and_encrypted_messages_count_notices_reactions_and_edits_do_not(self):
        room = self.room_of_three()
        # Carol's join came after Bob's: member events never count.
        self.assertEqual(self.counts(self.bob, room), (0, 0))
        since = self.bob.sync(filter=one_room_filter(room))["next_batch"]
        first = self.say(self.alice, room, "hello there")
        # An incremental sync carries the count with the new event.
        self.assertEqual(self.counts(self.bob, room, since=since), (1, 0))
        self.assertEqual(self.counts(self.bob, room), (1, 0))
        self.alice.send(room, {"msgtype": "m.notice", "body": "I am a bot"})
        self.alice.send(room, {"m.relates_to": {"rel_type": "m.annotation", "event_id": first,
                                                "key": "+1"}}, event_type="m.reaction")
        self.say(self.alice, room, "* hello there!", **{
            "m.new_content": {"msgtype": "m.text", "body": "hello there!"},
            "m.relates_to": {"rel_type": "m.replace", "event_id": first}})
        self.alice.put_state(room, "m.room.topic", {"topic": "no notification for this"})
        self.assertEqual(self.counts(self.bob, room), (1, 0))
        self.alice.send(room, {"algorithm": "m.megolm.v1.aes-sha2", "ciphertext": "AAAA",
                               "sender_key": "k", "session_id": "s", "device_id": "D"},
                        event_type="m.room.encrypted")
        self.assertEqual(self.counts(self.bob, room), (2, 0))
        judged = self.judged()
        self.assertEqual(self.counts(self.carol, room), (2, 0))
        # Carol's unread events went through the shared parsed PDUs (events_pdus.c).
        self.assertGreater(self.judged(), judged)

    def judged(self):
        """Unread events judged so far, from a parsed PDU kept or parsed anew."""
        return (self.srv.metric("atrium_events_pdu_cache_hits_total")
                + self.srv.metric("atrium_events_pdu_cache_misses_total"))

    def test_own_events_never_count_and_reset_the_count(self):
        room = self.room_of_three()
        for body in ("one", "two", "three"):
            self.say(self.alice, room, body)
            self.assertEqual(self.counts(self.alice, room), (0, 0))
        self.assertEqual(self.counts(self.bob, room), (3, 0))
        self.say(self.bob, room, "bob talks")
        self.assertEqual(self.counts(self.bob, room), (0, 0))
        self.assertEqual(self.counts(self.alice, room), (1, 0))
        self.say(self.alice, room, "alice answers")
        self.assertEqual(self.counts(self.alice, room), (0, 0))

    def test_read_receipts_on_the_newest_event_bring_counts_back_to_zero(self):
        room = self.room_of_three()
        events = [self.say(self.alice, room, f"message {i}") for i in range(3)]
        self.say(self.alice, room, "ping bob")
        self.assertEqual(self.counts(self.bob, room), (4, 1))
        receipt = f"{V3}/rooms/{quote(room)}/receipt"
        self.bob.ok("POST", f"{receipt}/m.read/{quote(events[1])}", {})
        self.assertEqual(self.counts(self.bob, room), (2, 1))
        newest = self.say(self.carol, room, "carol too")
        self.assertEqual(self.counts(self.bob, room), (3, 1))
        self.bob.ok("POST", f"{receipt}/m.read.private/{quote(newest)}", {})
        self.assertEqual(self.counts(self.bob, room), (0, 0))
        # Alice's receipts are hers alone.
        self.assertEqual(self.counts(self.alice, room), (1, 0))

    def test_redacted_events_stop_counting(self):
        room = self.room_of_three()
        self.say(self.alice, room, "keep me")
        gone = self.say(self.alice, room, "bob, delete me")
        self.assertEqual(self.counts(self.bob, room), (2, 1))
        self.alice.ok("PUT", f"{V3}/rooms/{quote(room)}/redact/{quote(gone)}/r1", {})
        self.assertEqual(self.counts(self.bob, room), (1, 0))

    # -- what highlights -------------------------------------------------------------------

    def test_mentions_by_name_localpart_m_mentions_and_room_highlight(self):
        room = self.room_of_three()
        self.set_displayname(self.bob, "Robert Tables")  # his own member event in the room
        self.assertEqual(self.counts(self.bob, room), (0, 0))
        steps = [
            # (sender, content, expected counts after it)
            (self.alice, {"body": "hey Robert Tables, look"}, (1, 1)),     # display name
            (self.alice, {"body": "robert tablespoon"}, (2, 1)),           # not a whole word
            (self.alice, {"body": "ping bob"}, (3, 2)),                    # localpart
            (self.alice, {"body": "bobsled"}, (4, 2)),
            (self.alice, {"body": "see this", "m.mentions": {"user_ids": [self.bob.user_id]}},
             (5, 3)),                                                      # is_user_mention
            # With m.mentions the legacy name rules are off: a plain notification.
            (self.alice, {"body": "Robert Tables", "m.mentions": {}}, (6, 3)),
            (self.alice, {"body": "@room please read"}, (7, 4)),           # creator: level 100
            (self.carol, {"body": "@room from carol"}, (8, 4)),            # level 0 < 50
            (self.alice, {"body": "all of you", "m.mentions": {"room": True}}, (9, 5)),
            (self.carol, {"body": "all", "m.mentions": {"room": True}}, (10, 5)),
        ]
        for sender, content, expected in steps:
            sender.send(room, {"msgtype": "m.text", **content})
            self.assertEqual(self.counts(self.bob, room), expected, content)
        # Alice, who sent most of it, has only Carol's last message since her own.
        self.assertEqual(self.counts(self.alice, room), (1, 0))

    def test_a_room_that_lowers_the_notification_level_lets_anyone_mention_it(self):
        room = self.room_of_three()
        levels = self.alice.state(room, "m.room.power_levels")
        self.assertNotIn(self.carol.user_id, levels.get("users", {}))
        levels["notifications"] = {"room": 0}
        self.alice.put_state(room, "m.room.power_levels", levels)
        self.say(self.carol, room, "@room from carol")
        self.say(self.carol, room, "hi", **{"m.mentions": {"room": True}})
        self.assertEqual(self.counts(self.bob, room), (2, 2))

    # -- the user's own rules --------------------------------------------------------------

    def test_a_room_rule_silences_its_room_but_not_mentions(self):
        quiet, empty, loud = self.room_of_three(), self.room_of_three(), self.room_of_three()
        self.put_rule(self.bob, "room", quiet, {"actions": ["dont_notify"]})
        self.put_rule(self.bob, "room", empty, {"actions": []})
        for room in (quiet, empty, loud):
            self.say(self.alice, room, "news")
        self.assertEqual(self.counts(self.bob, quiet), (0, 0))
        self.assertEqual(self.counts(self.bob, empty), (0, 0))
        self.assertEqual(self.counts(self.bob, loud), (1, 0))
        # Mention rules (override, content) come before room rules.
        self.say(self.alice, quiet, "bob, a word")
        self.assertEqual(self.counts(self.bob, quiet), (1, 1))
        # Only Bob's rules: Carol still counts everything.
        self.assertEqual(self.counts(self.carol, quiet), (2, 0))

    def test_each_member_of_a_room_gets_their_own_stored_rules(self):
        # The push sender reads every member's rules at once (push_rules_batch_read): each
        # member's verdict must come from their own rows, not a neighbour's.
        room = self.room_of_three()
        self.put_rule(self.bob, "room", room, {"actions": ["dont_notify"]})
        self.put_rule(self.carol, "room", room,
                      {"actions": ["notify", {"set_tweak": "highlight"}]})
        self.put_rule(self.carol, "sender", self.alice.user_id, {"actions": []})
        self.say(self.alice, room, "one")
        self.say(self.alice, room, "two")
        self.assertEqual(self.counts(self.bob, room), (0, 0))
        self.assertEqual(self.counts(self.carol, room), (2, 2))  # room rules before sender

    def test_a_sender_rule_silences_one_sender(self):
        room = self.room_of_three()
        self.put_rule(self.bob, "sender", self.carol.user_id, {"actions": []})
        self.say(self.carol, room, "from carol")
        self.say(self.alice, room, "from alice")
        self.assertEqual(self.counts(self.bob, room), (1, 0))

    def test_one_to_one_rooms_notify_when_the_message_rule_is_off(self):
        base = f"{V3}/pushrules/global/underride/.m.rule.message/enabled"
        self.assertEqual(self.bob.call("PUT", base, {"enabled": False}), (200, {}))
        self.addCleanup(self.bob.call, "PUT", base, {"enabled": True})
        pair = self.alice.create_room(preset="public_chat")
        self.bob.join(pair)
        group = self.room_of_three()
        self.say(self.alice, pair, "just us")
        self.say(self.alice, group, "everyone")
        # .m.rule.room_one_to_one (room_member_count == 2) still notifies; three members do not.
        self.assertEqual(self.counts(self.bob, pair), (1, 0))
        self.assertEqual(self.counts(self.bob, group), (0, 0))
        # Carol never turned .m.rule.message off.
        self.assertEqual(self.counts(self.carol, group), (1, 0))

    # -- the cap ---------------------------------------------------------------------------

    def test_the_count_stops_at_its_cap(self):
        room = self.room_of_three()
        for i in range(UNREAD_CAP + 1):
            self.say(self.alice, room, f"flood {i}")
        self.assertEqual(self.counts(self.bob, room), (UNREAD_CAP, 0))


if __name__ == "__main__":
    unittest.main()
