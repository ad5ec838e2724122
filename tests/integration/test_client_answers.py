"""What clients read and what they are refused (the project's issue 25, items 9 and 10):
malformed input answered 400 with a Matrix error instead of being accepted or answered
404/405, and answers carrying the keys clients (and Synapse) expect - joined_members'
null profile fields, keys/query's device names, whois' user agents, the extra keys of a
join's body in the membership event, and a redaction held to its own room.

/search's paging and context are proven at length in test_search.py; a short check here
keeps the item's whole list in one place."""

import urllib.parse

from accounts import login as login_account
from common import make_admin
from harness import psql
from rooms_client import V3, SharedServerTest, quote


class ClientAnswersTest(SharedServerTest):
    USERS = ("alice", "bob", "root")

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        make_admin(cls.srv, cls.root.user_id)

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

    # -- item 10: answers clients read ------------------------------------------------

    def test_joined_members_always_carry_display_name_and_avatar_url(self):
        room = self.alice.create_room(preset="public_chat")
        self.bob.join(room)
        self.bob.ok("PUT", f"{V3}/profile/{quote(self.bob.user_id)}/avatar_url",
                    {"avatar_url": "mxc://localhost/bob"})
        # A member event with neither field: alice rewrites her own.
        self.alice.put_state(room, "m.room.member", {"membership": "join"}, self.alice.user_id)
        joined = self.alice.ok("GET", f"{V3}/rooms/{quote(room)}/joined_members")["joined"]
        self.assertEqual(joined[self.alice.user_id], {"display_name": None, "avatar_url": None})
        self.assertEqual(joined[self.bob.user_id],
                         {"display_name": "bob", "avatar_url": "mxc://localhost/bob"})

    def test_keys_query_names_own_and_other_devices(self):
        self.bob.ok("PUT", f"{V3}/devices/{quote(self.bob.device_id)}",
                    {"display_name": "Bob's phone"})
        dev = self.bob.device_id
        keys = {"user_id": self.bob.user_id, "device_id": dev,
                "algorithms": ["m.olm.v1.curve25519-aes-sha2"],
                "keys": {f"curve25519:{dev}": "c", f"ed25519:{dev}": "e"},
                "signatures": {self.bob.user_id: {f"ed25519:{dev}": "s"}}}
        self.bob.ok("POST", f"{V3}/keys/upload", {"device_keys": keys})
        for who in (self.alice, self.bob):
            with self.subTest(asker=who.user_id):
                got = who.ok("POST", f"{V3}/keys/query",
                             {"device_keys": {self.bob.user_id: []}})["device_keys"]
                self.assertEqual(got[self.bob.user_id][dev]["unsigned"],
                                 {"device_display_name": "Bob's phone"})

    def test_search_pages_with_next_batch_and_gives_context(self):
        room = self.alice.create_room(preset="public_chat")
        ids = [self.alice.send(room, {"msgtype": "m.text", "body": f"zebracorn {i}"})
               for i in range(3)]
        body = {"search_categories": {"room_events": {
            "search_term": "zebracorn", "order_by": "recent", "filter": {"limit": 2},
            "event_context": {"before_limit": 1, "after_limit": 1, "include_profile": True}}}}
        first = self.alice.ok("POST", f"{V3}/search", body)["search_categories"]["room_events"]
        self.assertEqual([r["result"]["event_id"] for r in first["results"]], ids[:0:-1])
        ctx = first["results"][1]["context"]
        self.assertEqual([e["event_id"] for e in ctx["events_before"]], [ids[0]])
        self.assertEqual([e["event_id"] for e in ctx["events_after"]], [ids[2]])
        self.assertIsInstance(ctx["start"], str)
        self.assertIsInstance(ctx["end"], str)
        self.assertIn(self.alice.user_id, ctx["profile_info"])
        nxt = f"{V3}/search?next_batch={quote(first['next_batch'])}"
        second = self.alice.ok("POST", nxt, body)["search_categories"]["room_events"]
        self.assertEqual([r["result"]["event_id"] for r in second["results"]], [ids[0]])
        self.assertNotIn("next_batch", second)

    def test_whois_records_the_user_agent_of_login_and_later_requests(self):
        status, answer = self.srv.json(
            "POST", f"{V3}/login",
            {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": "bob"},
             "password": "correct horse battery staple", "device_id": "UA_LOGIN"},
            headers={"User-Agent": "Element/1.11 (login)"})
        self.assertEqual(status, 200, answer)
        seen = self.root.ok("GET", f"{V3}/admin/whois/{quote(self.bob.user_id)}")["devices"]
        conn = seen["UA_LOGIN"]["sessions"][0]["connections"][0]
        self.assertEqual(conn["user_agent"], "Element/1.11 (login)")
        # A later request past the refresh interval records its own agent.
        psql("UPDATE devices SET last_seen_ts = 1 WHERE device_id = 'UA_LOGIN'", self.srv.database)
        self.srv.json("GET", f"{V3}/account/whoami", token=answer["access_token"],
                      headers={"User-Agent": "Element/1.12"})
        seen = self.root.ok("GET", f"{V3}/admin/whois/{quote(self.bob.user_id)}")["devices"]
        conn = seen["UA_LOGIN"]["sessions"][0]["connections"][0]
        self.assertEqual(sorted(conn), ["ip", "last_seen", "user_agent"], conn)
        self.assertEqual(conn["user_agent"], "Element/1.12")
        self.assertGreater(conn["last_seen"], 1)
        self.assertIsInstance(conn["ip"], str)
        # A device whose requests named no agent lists the key as null.
        plain = login_account(self.srv, "bob", device_id="UA_NONE")
        seen = self.root.ok("GET", f"{V3}/admin/whois/{quote(self.bob.user_id)}")["devices"]
        self.assertIsNone(seen[plain.device_id]["sessions"][0]["connections"][0]["user_agent"])

    def test_join_by_id_or_alias_keeps_the_extra_keys_of_the_body(self):
        room = self.alice.create_room(preset="public_chat")
        body = {"reason": "saying hi", "com.example.extra": {"a": [1, 2]},
                "membership": "leave", "displayname": "Bobby"}
        self.bob.ok("POST", f"{V3}/join/{quote(room)}", body)
        content = self.alice.state(room, "m.room.member", self.bob.user_id)
        self.assertEqual(content, {"membership": "join", "reason": "saying hi",
                                   "com.example.extra": {"a": [1, 2]}, "displayname": "Bobby"})

    def test_join_through_rooms_join_keeps_the_reason_as_synapse_does(self):
        room = self.alice.create_room(preset="public_chat")
        self.bob.ok("POST", f"{V3}/rooms/{quote(room)}/join",
                    {"reason": "hello", "com.example.extra": 1})
        content = self.alice.state(room, "m.room.member", self.bob.user_id)
        self.assertEqual((content["membership"], content["reason"]), ("join", "hello"))
        self.assertNotIn("com.example.extra", content)

    def test_a_redaction_naming_an_event_of_another_room_is_400(self):
        here = self.alice.create_room()
        there = self.alice.create_room()
        target = self.alice.send(there, {"msgtype": "m.text", "body": "stay"})
        self.assertRefused(self.alice.call(
            "PUT", f"{V3}/rooms/{quote(here)}/redact/{quote(target)}/redact-other-room", {}),
            400, "M_INVALID_PARAM")
        event = self.alice.ok("GET", f"{V3}/rooms/{quote(there)}/event/{quote(target)}")
        self.assertEqual(event["content"]["body"], "stay")
        # The same redaction in its own room is accepted.
        self.alice.ok("PUT", f"{V3}/rooms/{quote(there)}/redact/{quote(target)}/redact-own-room", {})
