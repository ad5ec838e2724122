"""Accounts as a client sees them: registration with user-interactive auth, login, logout,
and the bad input each of those endpoints must refuse with the right Matrix error."""

import json
import unittest
import uuid

from accounts import REGISTRATION_ON, login, quote, register
from common import AtriumTestCase, start_module_server
from harness import psql

REGISTER = "/_matrix/client/v3/register"
LOGIN = "/_matrix/client/v3/login"
WHOAMI = "/_matrix/client/v3/account/whoami"


def unique(name):
    """A localpart no other test of the module's shared server registers."""
    return f"{name}_{uuid.uuid4().hex[:8]}"


class RegistrationTest(AtriumTestCase):
    """The tests share one server with LoginTest and LogoutTest (start_module_server): a
    name one test registers (alice, quiet, carol) is no other test's."""

    def setUp(self):
        self.srv = start_module_server(self, settings=REGISTRATION_ON)

    def test_register_without_auth_is_a_401_challenge_with_the_dummy_flow(self):
        status, body = self.srv.json("POST", REGISTER, {"username": "amy", "password": "pw"})
        self.assertEqual(status, 401)
        self.assertEqual(body["flows"], [{"stages": ["m.login.dummy"]}])
        self.assertEqual(body["params"], {})
        self.assertIsInstance(body["session"], str)
        self.assertNotIn("errcode", body)
        # An empty body (Element's first call) gets the same challenge, with a new session.
        status, again = self.srv.json("POST", REGISTER, {})
        self.assertEqual(status, 401)
        self.assertNotEqual(again["session"], body["session"])

    def test_dummy_auth_creates_the_user_with_a_working_token(self):
        alice = register(self.srv, "Alice", device_id="LAPTOP")
        self.assertEqual(alice.user_id, "@alice:localhost")
        self.assertEqual(alice.device_id, "LAPTOP")
        status, body = self.srv.json("GET", WHOAMI, token=alice.token)
        self.assertEqual(status, 200)
        self.assertEqual(body, {"user_id": "@alice:localhost", "device_id": "LAPTOP", "is_guest": False})

    def test_register_without_a_session_and_without_a_username_gets_a_random_user(self):
        status, body = self.srv.json("POST", REGISTER, {"password": "pw", "auth": {"type": "m.login.dummy"}},
                                     timeout=60)
        self.assertEqual(status, 200, body)
        self.assertRegex(body["user_id"], r"^@[a-z0-9]+:localhost$")
        self.assertTrue(body["device_id"])
        self.assertEqual(self.srv.json("GET", WHOAMI, token=body["access_token"])[0], 200)

    def test_a_session_the_server_never_issued_is_refused_with_a_fresh_challenge(self):
        status, body = self.srv.json("POST", REGISTER, {
            "username": "bob", "password": "pw", "auth": {"type": "m.login.dummy", "session": "made-up"}})
        self.assertEqual(status, 401)
        self.assertEqual(body["errcode"], "M_UNKNOWN")
        self.assertNotEqual(body["session"], "made-up")
        self.assertEqual(self.srv.json("GET", REGISTER + "/available?username=bob"),
                         (200, {"available": True}))

    def test_an_auth_type_other_than_dummy_is_refused(self):
        _, challenge = self.srv.json("POST", REGISTER, {})
        status, body = self.srv.json("POST", REGISTER, {
            "username": "bob", "password": "pw",
            "auth": {"type": "m.login.recaptcha", "session": challenge["session"]}})
        self.assertEqual((status, body["errcode"]), (401, "M_UNKNOWN"))
        self.assertEqual(body["session"], challenge["session"])

    def test_auth_with_only_the_session_repeats_the_challenge_without_an_error(self):
        _, challenge = self.srv.json("POST", REGISTER, {})
        status, body = self.srv.json("POST", REGISTER, {"auth": {"session": challenge["session"]}})
        self.assertEqual(status, 401)
        self.assertEqual(body, challenge)
        status, body = self.srv.json("POST", REGISTER, {"auth": {"type": 1, "session": challenge["session"]}})
        self.assertEqual((status, body["errcode"]), (400, "M_BAD_JSON"))

    def test_inhibit_login_creates_the_user_without_a_token(self):
        status, body = self.srv.json("POST", REGISTER, {
            "username": "quiet", "password": "pw", "inhibit_login": True,
            "auth": {"type": "m.login.dummy"}}, timeout=60)
        self.assertEqual(status, 200, body)
        self.assertEqual(body, {"user_id": "@quiet:localhost"})
        self.assertEqual(login(self.srv, "quiet", "pw").user_id, "@quiet:localhost")

    def test_a_taken_username_is_400_user_in_use_before_and_after_auth(self):
        register(self.srv, "carol")
        status, body = self.srv.json("POST", REGISTER, {"username": "carol", "password": "x"})
        self.assertEqual((status, body["errcode"]), (400, "M_USER_IN_USE"))
        status, body = self.srv.json("POST", REGISTER, {
            "username": "CAROL", "password": "x", "auth": {"type": "m.login.dummy"}})
        self.assertEqual((status, body["errcode"]), (400, "M_USER_IN_USE"))
        status, body = self.srv.json("GET", REGISTER + "/available?username=carol")
        self.assertEqual((status, body["errcode"]), (400, "M_USER_IN_USE"))

    def test_invalid_usernames_are_400_invalid_username(self):
        too_long = "a" * (255 - len("@:localhost") + 1)
        for name in ("has space", "ümlaut", "colon:x", "at@x", "", too_long):
            status, body = self.srv.json("POST", REGISTER, {"username": name, "password": "pw"})
            self.assertEqual((status, body.get("errcode")), (400, "M_INVALID_USERNAME"), name)
            status, body = self.srv.json("GET", REGISTER + "/available?username=" + quote(name))
            self.assertEqual((status, body.get("errcode")), (400, "M_INVALID_USERNAME"), name)
        fits = "a" * (255 - len("@:localhost"))
        self.assertEqual(self.srv.json("GET", REGISTER + "/available?username=" + fits)[0], 200)
        self.assertEqual(self.srv.json("GET", REGISTER + "/available?username=" + quote("a.b_c=d-e/f+g"))[0], 200)

    def test_guests_are_refused(self):
        status, body = self.srv.json("POST", REGISTER + "?kind=guest", {})
        self.assertEqual((status, body["errcode"]), (403, "M_GUEST_ACCESS_FORBIDDEN"))

    def test_bad_bodies_get_the_matching_error(self):
        status, body = self.srv.json("POST", REGISTER, "{oops", headers={"Content-Type": "application/json"})
        self.assertEqual((status, body["errcode"]), (400, "M_NOT_JSON"))
        status, body = self.srv.json("POST", REGISTER, {"username": 7})
        self.assertEqual((status, body["errcode"]), (400, "M_BAD_JSON"))
        status, body = self.srv.json("POST", REGISTER, {"username": "x", "auth": "dummy"})
        self.assertEqual((status, body["errcode"]), (400, "M_BAD_JSON"))
        status, body = self.srv.json("POST", REGISTER, {"username": "dave", "auth": {"type": "m.login.dummy"}})
        self.assertEqual((status, body["errcode"]), (400, "M_MISSING_PARAM"))
        status, body = self.srv.json("POST", REGISTER, {"username": "dave", "password": "p" * 100_000})
        self.assertEqual((status, body["errcode"]), (413, "M_TOO_LARGE"))
        status, body = self.srv.json("POST", REGISTER, {"username": "dave", "password": "p" * 600})
        self.assertEqual((status, body["errcode"]), (400, "M_INVALID_PARAM"))
        self.assertEqual(self.srv.json("GET", REGISTER + "/available")[1]["errcode"], "M_MISSING_PARAM")


class RegistrationDisabledTest(AtriumTestCase):
    def test_registration_is_off_by_default_with_403_forbidden(self):
        srv = self.start_server()
        status, body = srv.json("POST", REGISTER, {"username": "eve", "password": "pw"})
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"))


class PasswordHashingTest(AtriumTestCase):
    def test_a_password_is_stored_as_argon2id_at_the_configured_cost_and_still_logs_in(self):
        settings = dict(REGISTRATION_ON, password_hashing={"memory_kib": 1024, "passes": 3})
        srv = self.start_server(settings=settings)
        alice = register(srv, "alice", "alice's secret")
        [[stored]] = psql("SELECT password_hash FROM users WHERE user_id = '@alice:localhost'",
                          database=srv.database)
        self.assertRegex(stored, r"^\$argon2id\$v=19\$m=1024,t=3,p=1\$")
        again = login(srv, "alice", "alice's secret")
        self.assertEqual(again.user_id, alice.user_id)
        status, body = srv.json("POST", LOGIN, {"type": "m.login.password", "password": "wrong",
                                                "identifier": {"type": "m.id.user", "user": "alice"}})
        self.assertEqual((status, body.get("errcode")), (403, "M_FORBIDDEN"))


class LoginTest(AtriumTestCase):
    """On the module's shared server: each test logs in as an alice of its own."""

    def setUp(self):
        self.srv = start_module_server(self, settings=REGISTRATION_ON)
        self.name = unique("alice")
        self.alice = register(self.srv, self.name, "alice's secret", device_id="FIRST")

    def test_get_login_lists_the_password_flow(self):
        self.assertEqual(self.srv.json("GET", LOGIN), (200, {"flows": [{"type": "m.login.password"}]}))

    def test_password_login_by_localpart_full_id_and_legacy_user_field(self):
        alice = f"@{self.name}:localhost"
        by_localpart = login(self.srv, self.name, "alice's secret")
        self.assertEqual(by_localpart.user_id, alice)
        self.assertNotEqual(by_localpart.device_id, "FIRST")
        by_id = login(self.srv, alice, "alice's secret", device_id="SECOND")
        self.assertEqual(by_id.device_id, "SECOND")
        status, body = self.srv.json("POST", LOGIN, {"type": "m.login.password", "user": self.name,
                                                     "password": "alice's secret"}, timeout=60)
        self.assertEqual(status, 200, body)
        self.assertEqual(body["home_server"], "localhost")
        for account in (by_localpart, by_id):
            self.assertEqual(self.srv.json("GET", WHOAMI, token=account.token)[1]["user_id"], alice)

    def test_wrong_password_and_unknown_user_get_the_same_403(self):
        answers = []
        for user, password in ((self.name, "wrong"), (unique("nobody"), "alice's secret"),
                               (f"@{self.name}:elsewhere.org", "alice's secret")):
            status, body = self.srv.json("POST", LOGIN, {
                "type": "m.login.password", "identifier": {"type": "m.id.user", "user": user},
                "password": password}, timeout=60)
            answers.append((status, body))
        self.assertEqual(answers[0], (403, {"errcode": "M_FORBIDDEN", "error": "Invalid username or password"}))
        self.assertEqual(answers[1], answers[0])
        self.assertEqual(answers[2], answers[0])

    def test_login_with_an_existing_device_id_revokes_that_devices_old_token(self):
        again = login(self.srv, self.name, "alice's secret", device_id="FIRST")
        self.assertEqual(again.device_id, "FIRST")
        status, body = self.srv.json("GET", WHOAMI, token=self.alice.token)
        self.assertEqual((status, body["errcode"]), (401, "M_UNKNOWN_TOKEN"))
        self.assertEqual(self.srv.json("GET", WHOAMI, token=again.token)[0], 200)

    def test_bad_login_bodies_get_the_matching_error(self):
        cases = [
            ("{", 400, "M_NOT_JSON"),
            ({"type": "m.login.password", "identifier": {"type": "m.id.user", "user": self.name}}, 400, "M_MISSING_PARAM"),
            ({"identifier": {"type": "m.id.user", "user": self.name}, "password": "x"}, 400, "M_MISSING_PARAM"),
            ({"type": "m.login.password", "password": "x"}, 400, "M_MISSING_PARAM"),
            ({"type": "m.login.token", "token": "x"}, 400, "M_UNKNOWN"),
            ({"type": "m.login.password", "identifier": {"type": "m.id.user", "user": 5}, "password": "x"}, 400, "M_BAD_JSON"),
            ({"type": "m.login.password", "identifier": self.name, "password": "x"}, 400, "M_BAD_JSON"),
            ({"type": "m.login.password", "identifier": {"type": "m.id.user", "user": self.name}, "password": True}, 400, "M_BAD_JSON"),
            ({"type": "m.login.password", "identifier": {"type": "m.id.thirdparty", "medium": "email",
                                                         "address": "a@b.c"}, "password": "x"}, 400, "M_UNKNOWN"),
            ({"type": "m.login.password", "medium": "email", "address": "a@b.c", "password": "x"}, 400, "M_UNKNOWN"),
            ({"type": "m.login.password", "user": self.name, "password": "x" * 70_000}, 413, "M_TOO_LARGE"),
        ]
        for body, want_status, want_code in cases:
            status, answer = self.srv.json("POST", LOGIN, body, headers={"Content-Type": "application/json"})
            self.assertEqual((status, answer["errcode"]), (want_status, want_code), body if len(str(body)) < 200 else "big")


class LogoutTest(AtriumTestCase):
    """On the module's shared server: each test logs out a frank of its own."""

    def setUp(self):
        self.srv = start_module_server(self, settings=REGISTRATION_ON)
        frank = unique("frank")
        self.phone = register(self.srv, frank, device_id="PHONE")
        self.laptop = login(self.srv, frank, self.phone.password, device_id="LAPTOP")

    def test_logout_stops_the_token_at_once_and_leaves_other_devices_working(self):
        self.assertEqual(self.srv.json("POST", "/_matrix/client/v3/logout", token=self.phone.token), (200, {}))
        status, body = self.srv.json("GET", WHOAMI, token=self.phone.token)
        self.assertEqual((status, body["errcode"]), (401, "M_UNKNOWN_TOKEN"))
        self.assertEqual(self.srv.json("GET", WHOAMI, token=self.laptop.token)[0], 200)
        # The device went with it.
        status, body = self.srv.json("GET", "/_matrix/client/v3/devices", token=self.laptop.token)
        if status == 200:
            self.assertEqual([d["device_id"] for d in body["devices"]], ["LAPTOP"])

    def test_logout_all_stops_every_token_of_the_user(self):
        other = register(self.srv, unique("grace"))
        self.assertEqual(self.srv.json("POST", "/_matrix/client/v3/logout/all", {}, token=self.laptop.token), (200, {}))
        for account in (self.phone, self.laptop):
            status, body = self.srv.json("GET", WHOAMI, token=account.token)
            self.assertEqual((status, body["errcode"]), (401, "M_UNKNOWN_TOKEN"))
        self.assertEqual(self.srv.json("GET", WHOAMI, token=other.token)[0], 200)

    def test_logout_needs_a_token(self):
        status, body = self.srv.json("POST", "/_matrix/client/v3/logout")
        self.assertEqual((status, body["errcode"]), (401, "M_MISSING_TOKEN"))


class RateLimitTest(AtriumTestCase):
    def setUp(self):
        slow = {"per_minute": 1, "burst": 2}
        self.srv = self.start_server(settings={**REGISTRATION_ON, "ratelimit": {
            "enabled": True, "register": slow, "login": slow}})

    def assert_limited(self, method, path, body):
        status, headers, data = self.srv.request(method, path, body)
        self.assertEqual(status, 429, data)
        answer = json.loads(data)
        self.assertEqual(answer["errcode"], "M_LIMIT_EXCEEDED")
        self.assertGreater(answer["retry_after_ms"], 1000)
        self.assertGreaterEqual(int(headers["Retry-After"]), answer["retry_after_ms"] // 1000)

    def test_registration_over_the_rate_is_429_with_retry_after(self):
        # The challenge and the registration (which runs again on the auth pool) cost one
        # token each: the handoff's second run is not counted again.
        register(self.srv, "rita")
        self.assert_limited("POST", REGISTER, {"username": "sam", "password": "pw"})
        self.assert_limited("GET", REGISTER + "/available?username=sam", None)

    def test_login_over_the_rate_is_429_and_a_handed_off_login_counts_once(self):
        # Registration has its own bucket; the two logins use up the login burst exactly.
        register(self.srv, "tom", device_id="ONE")
        login(self.srv, "tom")
        status, body = self.srv.json("POST", LOGIN, {"type": "m.login.password", "user": "tom",
                                                     "password": "wrong"}, timeout=60)
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"))
        self.assert_limited("POST", LOGIN, {"type": "m.login.password", "user": "tom", "password": "x"})


if __name__ == "__main__":
    unittest.main()
