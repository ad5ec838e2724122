"""What clients read and what they are refused (the project's issue 25, items 9 and 10):
malformed input answered 400 with a Matrix error instead of being accepted or answered
404/405, and answers carrying the keys clients (and Synapse) expect - joined_members'
null profile fields, keys/query's device names, whois' user agents, the extra keys of a
join's body in the membership event, and a redaction held to its own room.

/search's paging and context are proven at length in test_search.py; a short check here
keeps the item's whole list in one place."""

import urllib.parse

from accounts import login as login_account
from harness import psql
from rooms_client import V3, SharedServerTest, quote


class ClientAnswersTest(SharedServerTest):
    USERS = ("alice", "bob", "root")

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        psql(f"UPDATE users SET is_admin = true WHERE user_id = '{cls.root.user_id}'",
             cls.srv.database)

    def assertRefused(self, answer, status, errcodes):
        got_status, body = answer
        errcodes = (errcodes,) if isinstance(errcodes, str) else errcodes
        self.assertEqual(got_status, status, body)
        self.assertIn((body or {}).get("errcode"), errcodes, body)
        self.assertIsInstance(body.get("error"), str, body)

    # -- item 9: input refused with 400 -------------------------------------------------

    def test_events_refuses_a_limit_that_is_no_non_negative_integer(self):
        for bad in ("ten", "-1", "1.5", "", "5x"):
            with self.subTest(limit=bad):
                self.assertRefused(self.alice.call(
                    "GET", f"{V3}/events?timeout=0&limit={urllib.parse.quote(bad)}"),
                    400, "M_INVALID_PARAM")
        answer = self.alice.ok("GET", f"{V3}/events?timeout=0&limit=5")
        self.assertIn("chunk", answer)
        # Past the cap is a page size, clamped like /initialSync's, not an error.
        self.alice.ok("GET", f"{V3}/events?timeout=0&limit=99999999999")

    def test_a_filter_with_fields_of_the_wrong_type_is_refused(self):
        path = f"{V3}/user/{quote(self.alice.user_id)}/filter"
        bad = [
            {"room": {"timeline": {"limit": "ten"}}},
            {"event_fields": "x"},
            {"presence": {"types": 5}},
            {"presence": {"limit": "3"}},
            {"presence": {"not_senders": [1]}},
            {"account_data": {"not_types": "m.x"}},
            {"account_data": []},
            {"room": {"include_leave": "yes"}},
            {"room": {"rooms": "!a:localhost"}},
            {"room": {"not_rooms": [5]}},
            {"room": {"state": {"include_redundant_members": 1}}},
            {"event_format": "json"},
        ]
        for f in bad:
            with self.subTest(filter=f):
                self.assertRefused(self.alice.call("POST", path, f), 400, "M_BAD_JSON")
        good = {"room": {"timeline": {"limit": 10}, "rooms": ["!a:localhost"], "include_leave": True,
                         "state": {"lazy_load_members": True, "include_redundant_members": False}},
                "presence": {"types": ["m.presence"], "limit": 3, "not_senders": []},
                "account_data": {"not_types": ["m.x"]}, "event_fields": ["content.body"],
                "com.example.unknown": {"kept": 1}}
        self.assertIn("filter_id", self.alice.ok("POST", path, good))

    def test_push_rule_paths_with_a_bad_scope_kind_or_attribute_are_400(self):
        pr = f"{V3}/pushrules"
        cases = [
            ("GET", "/global/badkind/x", None),
            ("GET", "/global/badkind/", None),
            ("GET", "/notglobal/", None),
            ("GET", "/notglobal/override/x", None),
            ("PUT", "/notglobal/override/x", {"actions": ["notify"]}),
            ("PUT", "/global/badkind/x", {"actions": ["notify"]}),
            ("DELETE", "/global/badkind/x", None),
            ("GET", "/global/override/.m.rule.master/badattr", None),
            ("PUT", "/global/override/.m.rule.master/badattr", {"badattr": True}),
            ("GET", "/global/badkind/.m.rule.master/enabled", None),
            ("PUT", "/notglobal/override/.m.rule.master/enabled", {"enabled": True}),
        ]
        for method, path, body in cases:
            with self.subTest(method=method, path=path):
                self.assertRefused(self.alice.call(method, pr + path, body), 400, "M_INVALID_PARAM")
        # The known attributes still answer.
        self.assertIn("enabled", self.alice.ok("GET", f"{pr}/global/override/.m.rule.master/enabled"))
