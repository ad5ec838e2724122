"""The user directory: POST /user_directory/search finds local users who share a room with
the searcher now or are joined to a public room, one whose current join rule is public or
whose current history visibility is world_readable (never deactivated users, never
invited-only or departed ones; the searcher themselves only through a public room, as
Synapse); a room's change of either rule shows in the next search; every word of the term must start a word of
the user's localpart or display name, case-insensitively, LIKE wildcards being plain
characters; a whole user ID finds that user; exact matches come first; `limit` (default 10,
at most 50) with `limited`; bad input gets the spec's 400s, no token a 401.

One server serves the whole class. The world it builds in setUpClass:
  alice + bob      a private room (bob is "Robert Builder")
  carol            her public room, with carol0 and carol1 (no display names) in it;
                   carol's display name is "Zoe Carol 50%_off"
  dave             in no room at all
  zed0 .. zed54    one more public room, for limits
Users beyond the four registered ones are inserted straight into the database (crowd) and
act through the API with their own tokens.
"""

import unittest

from harness import psql
from rooms_client import Client, SharedServerTest, V3, crowd, quote

SEARCH = f"{V3}/user_directory/search"
LIMIT_DEFAULT = 10
LIMIT_MAX = 50
TERM_MAX_BYTES = 256
ZEDS = LIMIT_MAX + 5  # more than the cap, so the cap shows


class UserDirectoryTest(SharedServerTest):
    USERS = ("alice", "bob", "carol", "dave")

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        try:
            cls.build_world()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def build_world(cls):
        srv = cls.srv
        cls.private = cls.alice.create_room(preset="private_chat", invite=[cls.bob.user_id])
        cls.bob.join(cls.private)
        cls.set_name(cls.bob, "Robert Builder")
        cls.set_name(cls.carol, "Zoe Carol 50%_off")
        cls.public = cls.carol.create_room(preset="public_chat")
        cls.carols = [Client(srv, m) for m in crowd(srv, 2, prefix="carol")]
        for member in cls.carols:
            member.join(cls.public)
        cls.zeds = [Client(srv, m) for m in crowd(srv, ZEDS, prefix="zed")]
        cls.zed_room = cls.zeds[0].create_room(preset="public_chat")
        for member in cls.zeds[1:]:
            member.join(cls.zed_room)

    @classmethod
    def set_name(cls, who, name):
        who.ok("PUT", f"{V3}/profile/{quote(who.user_id)}/displayname", {"displayname": name})

    # -- helpers ----------------------------------------------------------------------

    def search(self, who, term, **extra):
        return who.ok("POST", SEARCH, {"search_term": term, **extra})

    def found(self, who, term, **extra):
        return [r["user_id"] for r in self.search(who, term, **extra)["results"]]

    def uid(self, localpart):
        return f"@{localpart}:{self.srv.server_name}"

    def assertError(self, answer, status, errcode):
        got_status, body = answer
        self.assertEqual((got_status, (body or {}).get("errcode")), (status, errcode), body)
        self.assertIsInstance(body.get("error"), str)

    # -- who may be found -------------------------------------------------------------

    def test_a_user_sharing_a_private_room_is_found_by_a_localpart_prefix(self):
        answer = self.search(self.alice, "bo")
        self.assertEqual(answer, {"results": [{"user_id": self.bob.user_id,
                                               "display_name": "Robert Builder"}],
                                  "limited": False})

    def test_a_member_of_a_public_room_is_found_without_sharing_it(self):
        self.assertEqual(self.found(self.alice, "carol"),
                         [self.carol.user_id, self.uid("carol0"), self.uid("carol1")])
        # dave is in no room at all and still finds public-room members, but not bob,
        # whose only room is private.
        self.assertIn(self.carol.user_id, self.found(self.dave, "car"))
        self.assertEqual(self.found(self.dave, "bo"), [])

    def test_a_user_sharing_nothing_and_in_no_public_room_is_not_found(self):
        self.assertEqual(self.found(self.alice, "dave"), [])
        self.assertEqual(self.found(self.alice, self.dave.user_id), [])

    def test_the_searcher_finds_themselves_only_through_a_public_room(self):
        # alice's only room is private (shared with bob): it lists bob to her, not herself.
        self.assertEqual(self.found(self.alice, "alice"), [])
        self.assertEqual(self.found(self.alice, self.alice.user_id), [])
        self.assertEqual(self.found(self.bob, "bob"), [])
        self.assertEqual(self.found(self.carol, self.carol.user_id), [self.carol.user_id])
        self.assertEqual(self.found(self.dave, "dave"), [])

    def test_an_invited_user_is_not_found_until_joined_and_not_after_leaving(self):
        (guest,) = [Client(self.srv, m) for m in crowd(self.srv, 1, prefix="guest")]
        room = self.alice.create_room(preset="private_chat", invite=[guest.user_id])
        self.assertEqual(self.found(self.alice, "guest"), [])
        guest.join(room)
        self.assertEqual(self.found(self.alice, "guest"), [guest.user_id])
        guest.leave(room)
        self.assertEqual(self.found(self.alice, "guest"), [])

    # -- a room's join rule and history visibility, as they are now ----------------------

    def private_pair(self, prefix):
        """host and member joined to a new invite-only room of host's, whose history
        visibility is shared; neither is in any other room."""
        host, member = [Client(self.srv, m) for m in crowd(self.srv, 2, prefix=prefix)]
        room = host.create_room(preset="private_chat", invite=[member.user_id],
                                room_version="10")  # a version with knocking
        member.join(room)
        return host, member, room

    def finders(self, host, member):
        """Who finds member by their user ID: dave (sharing nothing with them), member
        themselves, and host (sharing the room)."""
        return {name: self.found(who, member.user_id) == [member.user_id]
                for name, who in (("outsider", self.dave), ("themselves", member),
                                  ("roommate", host))}

    LISTED = {"outsider": True, "themselves": True, "roommate": True}
    UNLISTED = {"outsider": False, "themselves": False, "roommate": True}

    def test_members_are_listed_while_their_room_is_public_and_no_longer_after(self):
        host, member, room = self.private_pair("jrule")
        self.assertEqual(self.finders(host, member), self.UNLISTED)
        host.put_state(room, "m.room.join_rules", {"join_rule": "public"})
        self.assertEqual(self.finders(host, member), self.LISTED)
        host.put_state(room, "m.room.join_rules", {"join_rule": "invite"})
        self.assertEqual(self.finders(host, member), self.UNLISTED)
        host.put_state(room, "m.room.join_rules", {"join_rule": "knock"})
        self.assertEqual(self.finders(host, member), self.UNLISTED)

    def test_members_are_listed_while_their_room_is_world_readable_and_no_longer_after(self):
        host, member, room = self.private_pair("hvis")
        hv = "m.room.history_visibility"
        host.put_state(room, hv, {"history_visibility": "world_readable"})
        self.assertEqual(self.finders(host, member), self.LISTED)
        host.put_state(room, hv, {"history_visibility": "shared"})
        self.assertEqual(self.finders(host, member), self.UNLISTED)

    def test_members_stay_listed_while_an_invite_only_room_is_still_world_readable(self):
        host, member, room = self.private_pair("stay")
        hv = "m.room.history_visibility"
        host.put_state(room, "m.room.join_rules", {"join_rule": "public"})
        host.put_state(room, hv, {"history_visibility": "world_readable"})
        self.assertEqual(self.finders(host, member), self.LISTED)
        host.put_state(room, "m.room.join_rules", {"join_rule": "invite"})
        self.assertEqual(self.finders(host, member), self.LISTED)
        host.put_state(room, hv, {"history_visibility": "joined"})
        self.assertEqual(self.finders(host, member), self.UNLISTED)

    def test_members_stay_listed_while_another_of_their_rooms_is_public(self):
        host, member, room = self.private_pair("other")
        lobby = host.create_room(preset="public_chat")
        member.join(lobby)
        host.put_state(room, "m.room.join_rules", {"join_rule": "public"})
        host.put_state(room, "m.room.join_rules", {"join_rule": "invite"})
        self.assertEqual(self.finders(host, member), self.LISTED)
        host.put_state(lobby, "m.room.join_rules", {"join_rule": "invite"})
        self.assertEqual(self.finders(host, member), self.UNLISTED)

    def test_a_deactivated_user_is_not_found(self):
        (erin,) = [Client(self.srv, m) for m in crowd(self.srv, 1, prefix="erin")]
        erin.join(self.public)
        self.assertEqual(self.found(self.alice, "erin"), [erin.user_id])
        psql(f"UPDATE users SET deactivated = true WHERE user_id = '{erin.user_id}'",
             database=self.srv.database)
        self.assertEqual(self.found(self.alice, "erin"), [])
        self.assertEqual(self.found(self.alice, erin.user_id), [])

    # -- what matches -----------------------------------------------------------------

    def test_display_name_words_match_by_prefix_and_case_insensitively(self):
        for term in ("build", "Rob", "ROBERT", "  builder  "):
            with self.subTest(term=term):
                self.assertEqual(self.found(self.alice, term), [self.bob.user_id])
        self.assertEqual(self.found(self.alice, "uilder"), [], "not the middle of a word")
        self.assertEqual(self.found(self.alice, "obert"), [])

    def test_every_word_of_a_multi_word_term_must_match(self):
        self.assertEqual(self.found(self.alice, "rob build"), [self.bob.user_id])
        self.assertEqual(self.found(self.alice, "builder\trobert"), [self.bob.user_id])
        self.assertEqual(self.found(self.alice, "bob builder"), [self.bob.user_id],
                         "a word of the localpart and one of the display name")
        self.assertEqual(self.found(self.alice, "rob zzz"), [])

    def test_a_word_also_starts_after_punctuation(self):
        self.assertEqual(self.found(self.alice, "off"), [self.carol.user_id])
        self.assertEqual(self.found(self.alice, "50%_o"), [self.carol.user_id])

    def test_like_wildcards_in_the_term_are_plain_characters(self):
        # As wildcards each of these would match almost everyone, or "50%_off".
        for term in ("%", "_", "_ob", "%ob", "5%", "50_", "\\", "zo%"):
            with self.subTest(term=term):
                self.assertEqual(self.found(self.alice, term), [])
        self.assertEqual(self.found(self.alice, "50%"), [self.carol.user_id])

    def test_a_whole_user_id_finds_that_user_and_a_leading_at_is_allowed(self):
        self.assertEqual(self.found(self.alice, self.bob.user_id), [self.bob.user_id])
        self.assertEqual(self.found(self.alice, self.bob.user_id.upper()), [self.bob.user_id])
        self.assertEqual(self.found(self.alice, "@bo"), [self.bob.user_id])
        self.assertEqual(self.found(self.alice, f"@bob:{self.srv.server_name}x"), [])

    def test_exact_matches_come_first_then_display_name_or_user_id_order(self):
        # carol's display name ("zoe ...") sorts after carol0 and carol1; her localpart is
        # exactly the term, so she comes first.
        self.assertEqual(self.found(self.alice, "carol"),
                         [self.carol.user_id, self.uid("carol0"), self.uid("carol1")])
        self.assertEqual(self.found(self.alice, "carol0"), [self.uid("carol0")])
        self.assertEqual(self.found(self.alice, "zoe carol 50%_off"), [self.carol.user_id])
        self.assertEqual(self.found(self.alice, "car"),
                         [self.uid("carol0"), self.uid("carol1"), self.carol.user_id])

    def test_users_without_a_display_name_are_listed_with_their_user_id_only(self):
        results = self.search(self.alice, "carol0")["results"]
        self.assertEqual(results, [{"user_id": self.uid("carol0")}])

    def test_an_avatar_is_included_when_set(self):
        (ava,) = [Client(self.srv, m) for m in crowd(self.srv, 1, prefix="ava")]
        ava.join(self.public)
        ava.ok("PUT", f"{V3}/profile/{quote(ava.user_id)}/avatar_url",
               {"avatar_url": "mxc://localhost/abc"})
        self.assertEqual(self.search(self.alice, "ava")["results"],
                         [{"user_id": ava.user_id, "avatar_url": "mxc://localhost/abc"}])

    def test_an_empty_or_blank_term_finds_nobody(self):
        for term in ("", "   ", "\t\n"):
            with self.subTest(term=term):
                self.assertEqual(self.search(self.alice, term), {"results": [], "limited": False})

    # -- limits -----------------------------------------------------------------------

    def test_limit_defaults_to_ten_and_limited_says_more_matched(self):
        answer = self.search(self.alice, "zed")
        self.assertEqual(len(answer["results"]), LIMIT_DEFAULT)
        self.assertTrue(answer["limited"])
        localparts = [r["user_id"][1:].split(":")[0] for r in answer["results"]]
        self.assertEqual(localparts, sorted(f"zed{i}" for i in range(ZEDS))[:LIMIT_DEFAULT],
                         "by localpart when no display names are set")

    def test_limit_is_honoured_and_capped(self):
        answer = self.search(self.alice, "zed", limit=3)
        self.assertEqual((len(answer["results"]), answer["limited"]), (3, True))
        answer = self.search(self.alice, "zed", limit=1000)
        self.assertEqual((len(answer["results"]), answer["limited"]), (LIMIT_MAX, True))
        answer = self.search(self.alice, "zed1", limit=LIMIT_MAX)  # zed1, zed10 .. zed19
        self.assertEqual((len(answer["results"]), answer["limited"]), (11, False))
        answer = self.search(self.alice, "zed1", limit=11)
        self.assertEqual((len(answer["results"]), answer["limited"]), (11, False))
        answer = self.search(self.alice, "zed1", limit=10)
        self.assertEqual((len(answer["results"]), answer["limited"]), (10, True))
        self.assertEqual(self.search(self.alice, "zed", limit=0), {"results": [], "limited": True})
        self.assertEqual(self.search(self.alice, "nobody", limit=0),
                         {"results": [], "limited": False})

    def test_a_term_of_the_maximum_length_is_accepted(self):
        term = "b" + "o" * (TERM_MAX_BYTES - 1)
        self.assertEqual(self.search(self.alice, term), {"results": [], "limited": False})
        self.assertEqual(self.found(self.alice, "b" + " o" * (TERM_MAX_BYTES // 2 - 1)), [])

    # -- bad input --------------------------------------------------------------------

    def test_bad_input_gets_the_spec_errors(self):
        call = self.alice.call
        self.assertError(call("POST", SEARCH, {}), 400, "M_MISSING_PARAM")
        self.assertError(call("POST", SEARCH, {"search_term": None}), 400, "M_BAD_JSON")
        self.assertError(call("POST", SEARCH, {"search_term": 5}), 400, "M_BAD_JSON")
        self.assertError(call("POST", SEARCH, {"search_term": ["bo"]}), 400, "M_BAD_JSON")
        self.assertError(call("POST", SEARCH, {"search_term": "b" * (TERM_MAX_BYTES + 1)}),
                         400, "M_INVALID_PARAM")
        self.assertError(call("POST", SEARCH, {"search_term": "é" * (TERM_MAX_BYTES // 2 + 1)}),
                         400, "M_INVALID_PARAM")
        for limit in ("10", 1.5, True, {}):
            with self.subTest(limit=limit):
                self.assertError(call("POST", SEARCH, {"search_term": "bo", "limit": limit}),
                                 400, "M_BAD_JSON")
        self.assertError(call("POST", SEARCH, {"search_term": "bo", "limit": -1}),
                         400, "M_INVALID_PARAM")
        self.assertError(self.srv.json("POST", SEARCH, "not json", token=self.alice.token),
                         400, "M_NOT_JSON")
        self.assertError(self.srv.json("POST", SEARCH, "[1]", token=self.alice.token),
                         400, "M_NOT_JSON")
        self.assertError(call("GET", SEARCH), 405, "M_UNRECOGNIZED")

    def test_a_search_needs_a_valid_access_token(self):
        self.assertError(self.srv.json("POST", SEARCH, {"search_term": "bo"}),
                         401, "M_MISSING_TOKEN")
        self.assertError(self.srv.json("POST", SEARCH, {"search_term": "bo"}, token="nope"),
                         401, "M_UNKNOWN_TOKEN")


if __name__ == "__main__":
    unittest.main()
