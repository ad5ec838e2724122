"""Per-user settings: profile, capabilities, push rules, filters and account data."""

import unittest
import uuid

from accounts import REGISTRATION_ON, quote, register
from common import AtriumTestCase, start_module_server

V3 = "/_matrix/client/v3"


def unique(name):
    """name with a suffix of its own: the tests share servers."""
    return f"{name}{uuid.uuid4().hex[:8]}"


class ProfileTest(AtriumTestCase):
    """The tests share one server with PushRulesTest and FiltersTest (start_module_server),
    each with a kim and lee of its own."""

    def setUp(self):
        self.srv = start_module_server(self, settings=REGISTRATION_ON)
        self.kim_name = unique("kim")
        self.kim = register(self.srv, self.kim_name)
        self.lee = register(self.srv, unique("lee"))
        self.path = f"{V3}/profile/{quote(self.kim.user_id)}"

    def test_a_new_user_has_the_localpart_as_display_name_and_no_avatar(self):
        self.assertEqual(self.srv.json("GET", self.path), (200, {"displayname": self.kim_name}))
        status, body = self.srv.json("GET", self.path + "/avatar_url")
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"))

    def test_the_user_sets_display_name_and_avatar(self):
        self.assertEqual(self.srv.json("PUT", self.path + "/displayname", {"displayname": "Kim K."},
                                       token=self.kim.token), (200, {}))
        self.assertEqual(self.srv.json("PUT", self.path + "/avatar_url", {"avatar_url": "mxc://localhost/abc"},
                                       token=self.kim.token), (200, {}))
        self.assertEqual(self.srv.json("GET", self.path + "/displayname"), (200, {"displayname": "Kim K."}))
        self.assertEqual(self.srv.json("GET", self.path),
                         (200, {"displayname": "Kim K.", "avatar_url": "mxc://localhost/abc"}))

    def test_nobody_else_may_set_it(self):
        status, body = self.srv.json("PUT", self.path + "/displayname", {"displayname": "hacked"},
                                     token=self.lee.token)
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"))
        status, body = self.srv.json("PUT", self.path + "/displayname", {"displayname": "x"})
        self.assertEqual((status, body["errcode"]), (401, "M_MISSING_TOKEN"))
        self.assertEqual(self.srv.json("GET", self.path + "/displayname"), (200, {"displayname": self.kim_name}))

    def test_unknown_users_are_404(self):
        for path in (f"{V3}/profile/{quote('@ghost:localhost')}", f"{V3}/profile/{quote('@ghost:localhost')}/displayname"):
            status, body = self.srv.json("GET", path)
            self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"), path)

    def test_a_user_of_a_server_that_cannot_be_reached_is_502(self):
        # Asked over federation (test_federation.py covers servers that answer); .invalid
        # never resolves, so the answer comes at once.
        status, body = self.srv.json("GET", f"{V3}/profile/{quote('@kim:elsewhere.invalid')}")
        self.assertEqual((status, body["errcode"]), (502, "M_UNKNOWN"))

    def test_bad_profile_bodies(self):
        cases = [("{", 400, "M_NOT_JSON"), ({}, 400, "M_MISSING_PARAM"), ({"displayname": 5}, 400, "M_BAD_JSON"),
                 ({"displayname": "x" * 300}, 400, "M_INVALID_PARAM"),
                 ({"displayname": "x" * 70000}, 413, "M_TOO_LARGE")]
        for body, want_status, want_code in cases:
            status, answer = self.srv.json("PUT", self.path + "/displayname", body, token=self.kim.token,
                                           headers={"Content-Type": "application/json"})
            self.assertEqual((status, answer["errcode"]), (want_status, want_code))
        status, answer = self.srv.json("PUT", self.path + "/avatar_url", {"avatar_url": "https://x/y.png"},
                                       token=self.kim.token)
        self.assertEqual((status, answer["errcode"]), (400, "M_INVALID_PARAM"))

    def test_capabilities(self):
        status, body = self.srv.json("GET", V3 + "/capabilities", token=self.kim.token)
        self.assertEqual(status, 200)
        caps = body["capabilities"]
        self.assertEqual(caps["m.change_password"], {"enabled": True})
        self.assertEqual(caps["m.room_versions"]["default"], "10")
        self.assertEqual(caps["m.room_versions"]["available"],
                         {str(n): "stable" for n in range(1, 12)})  # every version it creates
        self.assertEqual(caps["m.set_displayname"], {"enabled": True})
        self.assertEqual(caps["m.set_avatar_url"], {"enabled": True})
        self.assertEqual(caps["m.3pid_changes"], {"enabled": False})
        self.assertEqual(self.srv.json("GET", V3 + "/capabilities")[0], 401)

    def test_versions_promises_no_plugin_feature_of_a_plugin_switched_off(self):
        # The directory plugin is off here: publicRooms is not served, so its room-type
        # filter (MSC3827) is not advertised (with the plugin on: test_versions_features).
        status, body = self.srv.json("GET", "/_matrix/client/versions")
        self.assertEqual(status, 200)
        self.assertNotIn("org.matrix.msc3827.stable", body["unstable_features"])
        self.assertEqual(self.srv.json("GET", V3 + "/publicRooms")[0], 404)
        self.assertTrue(body["unstable_features"]["org.matrix.msc3881"])


class CapabilitiesConfigTest(AtriumTestCase):
    def test_the_default_room_version_follows_the_config(self):
        srv = self.start_server(settings={**REGISTRATION_ON, "rooms": {"default_version": "11"}})
        user = register(srv, "rho")
        status, body = srv.json("GET", V3 + "/capabilities", token=user.token)
        self.assertEqual((status, body["capabilities"]["m.room_versions"]["default"]), (200, "11"))


class PushRulesTest(AtriumTestCase):
    """The tests share one server with ProfileTest and FiltersTest (start_module_server),
    each with a mia of its own."""

    def setUp(self):
        self.srv = start_module_server(self, settings=REGISTRATION_ON)
        self.mia_name = unique("mia")
        self.mia = register(self.srv, self.mia_name)

    def rules(self):
        status, body = self.srv.json("GET", V3 + "/pushrules/", token=self.mia.token)
        self.assertEqual(status, 200)
        return body["global"]

    def ids(self, kind):
        return [r["rule_id"] for r in self.rules()[kind]]

    def test_the_default_set_is_the_specs_with_the_users_names(self):
        rules = self.rules()
        self.assertEqual(set(rules), {"override", "content", "room", "sender", "underride"})
        self.assertEqual([r["rule_id"] for r in rules["override"]], [
            ".m.rule.master", ".m.rule.suppress_notices", ".m.rule.invite_for_me", ".m.rule.member_event",
            ".m.rule.is_user_mention", ".m.rule.contains_display_name", ".m.rule.is_room_mention",
            ".m.rule.roomnotif", ".m.rule.tombstone", ".m.rule.reaction", ".m.rule.room.server_acl",
            ".m.rule.suppress_edits"])
        master = rules["override"][0]
        self.assertEqual((master["enabled"], master["default"], master["actions"]), (False, True, []))
        invite = rules["override"][2]
        self.assertIn({"kind": "event_match", "key": "state_key", "pattern": f"@{self.mia_name}:localhost"}, invite["conditions"])
        mention = rules["override"][4]
        self.assertEqual(mention["conditions"], [{"kind": "event_property_contains",
                                                  "key": "content.m\\.mentions.user_ids", "value": f"@{self.mia_name}:localhost"}])
        self.assertEqual(rules["content"], [{
            "rule_id": ".m.rule.contains_user_name", "default": True, "enabled": True, "pattern": self.mia_name,
            "actions": ["notify", {"set_tweak": "sound", "value": "default"}, {"set_tweak": "highlight"}]}])
        self.assertEqual([r["rule_id"] for r in rules["underride"]], [
            ".m.rule.call", ".m.rule.encrypted_room_one_to_one", ".m.rule.room_one_to_one", ".m.rule.message",
            ".m.rule.encrypted"])
        # The same without the trailing slash, and the global set alone.
        self.assertEqual(self.srv.json("GET", V3 + "/pushrules", token=self.mia.token)[1]["global"], rules)
        self.assertEqual(self.srv.json("GET", V3 + "/pushrules/global/", token=self.mia.token)[1], rules)

    def test_default_rules_can_be_disabled_and_their_actions_changed(self):
        base = V3 + "/pushrules/global/override/.m.rule.master"
        self.assertEqual(self.srv.json("PUT", base + "/enabled", {"enabled": True}, token=self.mia.token), (200, {}))
        self.assertEqual(self.srv.json("GET", base + "/enabled", token=self.mia.token), (200, {"enabled": True}))
        self.assertEqual(self.srv.json("PUT", V3 + "/pushrules/global/underride/.m.rule.message/actions",
                                       {"actions": ["dont_notify"]}, token=self.mia.token), (200, {}))
        self.assertEqual(self.srv.json("GET", V3 + "/pushrules/global/underride/.m.rule.message/actions",
                                       token=self.mia.token), (200, {"actions": ["dont_notify"]}))
        self.assertTrue(self.rules()["override"][0]["enabled"])
        status, body = self.srv.json("DELETE", base, token=self.mia.token)
        self.assertEqual((status, body["errcode"]), (400, "M_INVALID_PARAM"))
        # The change reached account data, for /sync.
        status, body = self.srv.json("GET", f"{V3}/user/{quote(self.mia.user_id)}/account_data/m.push_rules",
                                     token=self.mia.token)
        self.assertEqual(status, 200)
        self.assertTrue(body["global"]["override"][0]["enabled"])

    def test_user_rules_are_stored_ordered_and_deleted(self):
        put = lambda kind, rule_id, body, query="": self.srv.json(  # noqa: E731
            "PUT", f"{V3}/pushrules/global/{kind}/{rule_id}{query}", body, token=self.mia.token)
        self.assertEqual(put("content", "cats", {"pattern": "cat*", "actions": ["notify"]}), (200, {}))
        self.assertEqual(put("override", "a", {"actions": [], "conditions": [
            {"kind": "event_match", "key": "type", "pattern": "x.a"}]}), (200, {}))
        self.assertEqual(put("override", "b", {"actions": []}), (200, {}))          # highest: first
        self.assertEqual(put("override", "c", {"actions": []}, "?after=b"), (200, {}))
        self.assertEqual(put("override", "d", {"actions": []}, "?before=a"), (200, {}))
        self.assertEqual(self.ids("override")[:5], [".m.rule.master", "b", "c", "d", "a"])
        self.assertEqual(self.ids("override")[5], ".m.rule.suppress_notices")
        self.assertEqual(self.ids("content"), ["cats", ".m.rule.contains_user_name"])
        status, rule = self.srv.json("GET", V3 + "/pushrules/global/override/a", token=self.mia.token)
        self.assertEqual(rule, {"rule_id": "a", "default": False, "enabled": True, "actions": [],
                                "conditions": [{"kind": "event_match", "key": "type", "pattern": "x.a"}]})
        self.assertEqual(self.srv.json("PUT", V3 + "/pushrules/global/override/a/enabled", {"enabled": False},
                                       token=self.mia.token), (200, {}))
        self.assertFalse(self.srv.json("GET", V3 + "/pushrules/global/override/a", token=self.mia.token)[1]["enabled"])
        self.assertEqual(self.srv.json("DELETE", V3 + "/pushrules/global/override/a", token=self.mia.token), (200, {}))
        status, body = self.srv.json("GET", V3 + "/pushrules/global/override/a", token=self.mia.token)
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"))
        status, body = self.srv.json("DELETE", V3 + "/pushrules/global/override/a", token=self.mia.token)
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"))

    def test_bad_push_rule_requests(self):
        cases = [
            ("PUT", "/pushrules/global/override/x", {}, 400, "M_MISSING_PARAM"),
            ("PUT", "/pushrules/global/override/x", {"actions": "notify"}, 400, "M_BAD_JSON"),
            ("PUT", "/pushrules/global/override/x", {"actions": [], "conditions": [1]}, 400, "M_BAD_JSON"),
            ("PUT", "/pushrules/global/content/x", {"actions": []}, 400, "M_MISSING_PARAM"),
            ("PUT", "/pushrules/global/override/.mine", {"actions": []}, 400, "M_INVALID_PARAM"),
            ("PUT", "/pushrules/global/nonsense/x", {"actions": []}, 400, "M_INVALID_PARAM"),
            ("PUT", "/pushrules/global/override/x?before=missing", {"actions": []}, 404, "M_NOT_FOUND"),
            ("PUT", "/pushrules/global/override/x", "{", 400, "M_NOT_JSON"),
            ("PUT", "/pushrules/global/override/.m.rule.nope/enabled", {"enabled": True}, 404, "M_NOT_FOUND"),
            ("PUT", "/pushrules/global/override/.m.rule.master/enabled", {"enabled": "yes"}, 400, "M_BAD_JSON"),
            ("PUT", "/pushrules/global/override/.m.rule.master/enabled", {}, 400, "M_MISSING_PARAM"),
            ("PUT", "/pushrules/global/override/x", {"actions": ["x" * 70000]}, 413, "M_TOO_LARGE"),
            ("GET", "/pushrules/global/override/none", None, 404, "M_NOT_FOUND"),
            # Malformed rule paths are 400, as the spec lists (404 is for a missing rule).
            ("PUT", "/pushrules/device/override/x", {"actions": []}, 400, "M_INVALID_PARAM"),
            ("GET", "/pushrules/device/override/x", None, 400, "M_INVALID_PARAM"),
            ("DELETE", "/pushrules/nope/override/x", None, 400, "M_INVALID_PARAM"),
            ("GET", "/pushrules/nope/", None, 400, "M_INVALID_PARAM"),
            ("PUT", "/pushrules//override/x", {"actions": []}, 400, "M_INVALID_PARAM"),
            ("PUT", "/pushrules/global//x", {"actions": []}, 400, "M_INVALID_PARAM"),
            ("PUT", "/pushrules/global/override/", {"actions": []}, 400, "M_INVALID_PARAM"),
            ("PUT", "/pushrules/global/override", {"actions": []}, 400, "M_INVALID_PARAM"),
            ("DELETE", "/pushrules/global/override/", None, 400, "M_INVALID_PARAM"),
            ("GET", "/pushrules/global/nonsense/x", None, 400, "M_INVALID_PARAM"),
            # Actions must be ones the spec defines.
            ("PUT", "/pushrules/global/room/!r:localhost", {"actions": ["wiggle"]}, 400, "M_BAD_JSON"),
            ("PUT", "/pushrules/global/override/.m.rule.master/actions", {"actions": ["nope"]},
             400, "M_BAD_JSON"),
            ("PUT", "/pushrules/global/room/!r:localhost", {"actions": [{"value": 1}]}, 400, "M_BAD_JSON"),
        ]
        for method, path, body, want_status, want_code in cases:
            status, answer = self.srv.json(method, V3 + path, body, token=self.mia.token,
                                           headers={"Content-Type": "application/json"})
            self.assertEqual((status, answer["errcode"]), (want_status, want_code), path)
        self.assertEqual(self.srv.json("GET", V3 + "/pushrules/")[0], 401)
        # The deprecated no-op actions are still accepted from older clients.
        self.assertEqual(self.srv.json("PUT", V3 + "/pushrules/global/room/!r:localhost",
                                       {"actions": ["dont_notify"]}, token=self.mia.token), (200, {}))


class FiltersTest(AtriumTestCase):
    """The tests share one server with ProfileTest and PushRulesTest (start_module_server),
    each with a ned and oli of its own."""

    def setUp(self):
        self.srv = start_module_server(self, settings=REGISTRATION_ON)
        self.ned = register(self.srv, unique("ned"))
        self.oli = register(self.srv, unique("oli"))
        self.base = f"{V3}/user/{quote(self.ned.user_id)}/filter"

    def test_a_filter_comes_back_as_stored_and_the_same_filter_gets_the_same_id(self):
        flt = {"room": {"state": {"lazy_load_members": True}, "timeline": {"limit": 20}},
               "event_fields": ["type", "content.body"], "presence": {"not_types": ["*"]}}
        status, body = self.srv.json("POST", self.base, flt, token=self.ned.token)
        self.assertEqual(status, 200)
        filter_id = body["filter_id"]
        self.assertIsInstance(filter_id, str)
        self.assertFalse(filter_id.startswith("{"))
        self.assertEqual(self.srv.json("GET", f"{self.base}/{filter_id}", token=self.ned.token), (200, flt))
        self.assertEqual(self.srv.json("POST", self.base, flt, token=self.ned.token)[1]["filter_id"], filter_id)
        other = self.srv.json("POST", self.base, {"room": {"timeline": {"limit": 5}}}, token=self.ned.token)[1]
        self.assertNotEqual(other["filter_id"], filter_id)

    def test_unknown_filters_are_404_and_other_users_403(self):
        for fid in ("12345", "abc", "{}"):
            status, body = self.srv.json("GET", f"{self.base}/{quote(fid)}", token=self.ned.token)
            self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"), fid)
        filter_id = self.srv.json("POST", self.base, {}, token=self.ned.token)[1]["filter_id"]
        status, body = self.srv.json("GET", f"{self.base}/{filter_id}", token=self.oli.token)
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"))
        status, body = self.srv.json("POST", self.base, {}, token=self.oli.token)
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"))

    def test_bad_filters(self):
        for body, want_status, want_code in (("[1]", 400, "M_NOT_JSON"), ({"room": []}, 400, "M_BAD_JSON"),
                                              ({"event_fields": [1]}, 400, "M_BAD_JSON"),
                                              ({"event_format": "xml"}, 400, "M_BAD_JSON"),
                                              ({"room": {"x": "y" * 70000}}, 413, "M_TOO_LARGE")):
            status, answer = self.srv.json("POST", self.base, body, token=self.ned.token,
                                           headers={"Content-Type": "application/json"})
            self.assertEqual((status, answer["errcode"]), (want_status, want_code))


BODY_LIMIT = 16384  # server.http.max_json_body_bytes for account data, small to test cheaply


class AccountDataTest(AtriumTestCase):
    """The tests share one server (start_class_server), each with a pat and quinn of its own."""

    def setUp(self):
        self.srv = self.start_class_server(settings={
            **REGISTRATION_ON, "server": {"http": {"max_json_body_bytes": BODY_LIMIT}}})
        self.pat = register(self.srv, unique("pat"))
        self.quinn = register(self.srv, unique("quinn"))
        self.base = f"{V3}/user/{quote(self.pat.user_id)}"

    def stream_positions(self):
        from harness import psql
        return {(row[0], row[1]): int(row[2]) for row in psql(
            f"SELECT room_id, type, stream_pos FROM account_data WHERE user_id = '{self.pat.user_id}'",
            database=self.srv.database)}

    def test_global_and_room_account_data_round_trip_with_growing_stream_positions(self):
        room = quote("!room:localhost")
        self.assertEqual(self.srv.json("PUT", f"{self.base}/account_data/m.direct", {"@a:b": ["!r:b"]},
                                       token=self.pat.token), (200, {}))
        self.assertEqual(self.srv.json("PUT", f"{self.base}/rooms/{room}/account_data/m.tag",
                                       {"tags": {"u.work": {}}}, token=self.pat.token), (200, {}))
        self.assertEqual(self.srv.json("GET", f"{self.base}/account_data/m.direct", token=self.pat.token),
                         (200, {"@a:b": ["!r:b"]}))
        self.assertEqual(self.srv.json("GET", f"{self.base}/rooms/{room}/account_data/m.tag", token=self.pat.token),
                         (200, {"tags": {"u.work": {}}}))
        # Global and room data of the same type are apart.
        status, body = self.srv.json("GET", f"{self.base}/account_data/m.tag", token=self.pat.token)
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"))
        first = self.stream_positions()
        self.assertLess(first[("", "m.direct")], first[("!room:localhost", "m.tag")])
        self.srv.json("PUT", f"{self.base}/account_data/m.direct", {}, token=self.pat.token)
        again = self.stream_positions()
        self.assertGreater(again[("", "m.direct")], first[("!room:localhost", "m.tag")])
        self.assertEqual(self.srv.json("GET", f"{self.base}/account_data/m.direct", token=self.pat.token), (200, {}))

    def test_other_users_and_server_managed_types_are_refused(self):
        status, body = self.srv.json("GET", f"{self.base}/account_data/m.direct", token=self.quinn.token)
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"))
        status, body = self.srv.json("PUT", f"{self.base}/account_data/x.y", {}, token=self.quinn.token)
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"))
        for path in ("/account_data/m.push_rules", f"/rooms/{quote('!r:localhost')}/account_data/m.fully_read"):
            status, body = self.srv.json("PUT", self.base + path, {}, token=self.pat.token)
            self.assertEqual((status, body["errcode"]), (405, "M_BAD_JSON"), path)

    def test_bad_account_data_requests(self):
        status, body = self.srv.json("PUT", f"{self.base}/account_data/x.y", "[]", token=self.pat.token,
                                     headers={"Content-Type": "application/json"})
        self.assertEqual((status, body["errcode"]), (400, "M_NOT_JSON"))
        status, body = self.srv.json("PUT", f"{self.base}/rooms/not-a-room/account_data/x.y", {}, token=self.pat.token)
        self.assertEqual((status, body["errcode"]), (400, "M_INVALID_PARAM"))
        status, body = self.srv.json("PUT", f"{self.base}/account_data/{'t' * 300}", {}, token=self.pat.token)
        self.assertEqual((status, body["errcode"]), (400, "M_INVALID_PARAM"))
        status, body = self.srv.json("PUT", f"{self.base}/account_data/x.y", {"v": "x" * BODY_LIMIT},
                                     token=self.pat.token)
        self.assertEqual((status, body["errcode"]), (413, "M_TOO_LARGE"))
        status, body = self.srv.json("GET", f"{self.base}/account_data/x.y")
        self.assertEqual((status, body["errcode"]), (401, "M_MISSING_TOKEN"))


if __name__ == "__main__":
    unittest.main()
