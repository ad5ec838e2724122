"""Registration tokens and what a registration's UIA session remembers.

With registration.requires_token, POST /register asks for m.login.registration_token then
m.login.dummy; tokens are made, listed, changed and deleted by server admins through
Synapse's admin API, and GET /_matrix/client/v1/register/m.login.registration_token/validity
tells a client whether one is usable (core/client/accounts/registration_tokens.c). A UIA
session remembers its first request's parameters, the password's hash among them, lists
its completed stages in every 401, and a retry of a finished registration answers the same
user again (core/client/accounts/register.c, uia.c).
"""

import time
import unittest
import urllib.parse

from accounts import REGISTRATION_ON
from common import make_admin
from harness import Server, psql

V3 = "/_matrix/client/v3"
VALIDITY = "/_matrix/client/v1/register/m.login.registration_token/validity"
ADMIN = "/_synapse/admin/v1/registration_tokens"
TOKEN_FLOW = [{"stages": ["m.login.registration_token", "m.login.dummy"]}]


def register_with_token(srv, username, token, password="pw-secret"):
    """The whole token flow; returns the final (status, body)."""
    body = {"username": username, "password": password}
    status, challenge = srv.json("POST", V3 + "/register", body, timeout=60)
    assert status == 401, (status, challenge)
    session = challenge["session"]
    status, step = srv.json("POST", V3 + "/register", {
        **body, "auth": {"type": "m.login.registration_token", "token": token, "session": session}})
    if status != 401 or step.get("completed") != ["m.login.registration_token"]:
        return status, step
    return srv.json("POST", V3 + "/register", {
        **body, "auth": {"type": "m.login.dummy", "session": session}}, timeout=60)


class RegistrationTokensTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = Server(settings={"registration": {"enabled": True, "requires_token": True}})
        cls.srv.__enter__()
        try:
            psql("INSERT INTO registration_tokens (token) VALUES ('bootstrap')",
                 database=cls.srv.database)
            status, body = register_with_token(cls.srv, "root", "bootstrap")
            assert status == 200, (status, body)
            cls.root = body["access_token"]
            make_admin(cls.srv, body["user_id"])
        except BaseException:
            cls.srv.__exit__(None, None, None)
            raise

    @classmethod
    def tearDownClass(cls):
        cls.srv.__exit__(None, None, None)

    def admin(self, method, path="", body=None, token=None):
        return self.srv.json(method, ADMIN + path, body, token=token or self.root)

    def new_token(self, **body):
        status, made = self.admin("POST", "/new", body)
        self.assertEqual(status, 200, made)
        return made

    def valid(self, token):
        status, body = self.srv.json("GET", VALIDITY + "?" + urllib.parse.urlencode({"token": token}))
        self.assertEqual(status, 200, body)
        return body["valid"]

    def test_registration_without_a_token_is_challenged_for_one(self):
        status, body = self.srv.json("POST", V3 + "/register", {"username": "nobody", "password": "x"})
        self.assertEqual(status, 401, body)
        self.assertEqual(body["flows"], TOKEN_FLOW)
        self.assertEqual(body["completed"], [])
        status, body = self.srv.json("POST", V3 + "/register", {
            "username": "nobody", "password": "x",
            "auth": {"type": "m.login.dummy", "session": body["session"]}})
        self.assertEqual(status, 401, body)
        self.assertEqual(body["completed"], ["m.login.dummy"])
        self.assertEqual(psql("SELECT count(*) FROM users WHERE user_id LIKE '@nobody:%'",
                              database=self.srv.database), [["0"]])

    def test_an_invalid_token_fails_the_stage(self):
        status, body = register_with_token(self.srv, "wrongtoken", "no-such-token")
        self.assertEqual((status, body["errcode"]), (401, "M_UNAUTHORIZED"), body)
        self.assertEqual(body["completed"], [])
        # The session lives on: a valid token completes the stage in it.
        made = self.new_token()
        status, body = self.srv.json("POST", V3 + "/register", {
            "username": "wrongtoken", "password": "pw-secret",
            "auth": {"type": "m.login.registration_token", "token": made["token"],
                     "session": body["session"]}})
        self.assertEqual((status, body["completed"]), (401, ["m.login.registration_token"]), body)

    def test_a_token_with_one_use_registers_one_user(self):
        made = self.new_token(uses_allowed=1)
        self.assertEqual(len(made["token"]), 16)
        self.assertEqual((made["uses_allowed"], made["pending"], made["completed"],
                          made["expiry_time"]), (1, 0, 0, None))
        self.assertTrue(self.valid(made["token"]))
        status, body = register_with_token(self.srv, "firstuse", made["token"])
        self.assertEqual(status, 200, body)
        self.assertEqual(body["user_id"].split(":")[0], "@firstuse")
        status, got = self.admin("GET", "/" + made["token"])
        self.assertEqual((status, got["pending"], got["completed"]), (200, 0, 1), got)
        self.assertFalse(self.valid(made["token"]))
        status, body = register_with_token(self.srv, "seconduse", made["token"])
        self.assertEqual((status, body["errcode"]), (401, "M_UNAUTHORIZED"), body)

    def test_the_admin_api_creates_lists_updates_and_deletes(self):
        expiry = int(time.time() * 1000) + 3600000
        made = self.new_token(token="named-token_1.~", uses_allowed=5, expiry_time=expiry)
        self.assertEqual(made, {"token": "named-token_1.~", "uses_allowed": 5, "pending": 0,
                                "completed": 0, "expiry_time": expiry})
        self.assertEqual(len(self.new_token(length=40)["token"]), 40)
        status, body = self.admin("POST", "/new", {"token": "named-token_1.~"})
        self.assertEqual((status, body["errcode"]), (400, "M_INVALID_PARAM"), body)
        status, listed = self.admin("GET")
        self.assertEqual(status, 200, listed)
        self.assertIn(made, listed["registration_tokens"])
        status, changed = self.admin("PUT", "/named-token_1.~", {"uses_allowed": None})
        self.assertEqual((status, changed["uses_allowed"], changed["expiry_time"]),
                         (200, None, expiry), changed)
        status, changed = self.admin("PUT", "/named-token_1.~", {"expiry_time": None})
        self.assertEqual((status, changed["expiry_time"]), (200, None), changed)
        self.assertEqual(self.admin("DELETE", "/named-token_1.~"), (200, {}))
        status, body = self.admin("GET", "/named-token_1.~")
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"), body)
        status, body = self.admin("DELETE", "/named-token_1.~")
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"), body)

    def test_an_expired_token_is_invalid_and_listed_as_such(self):
        made = self.new_token(token="soon-gone")
        psql("UPDATE registration_tokens SET expiry_time = 1 WHERE token = 'soon-gone'",
             database=self.srv.database)
        self.assertFalse(self.valid("soon-gone"))
        listed = self.admin("GET", "?valid=false")[1]["registration_tokens"]
        self.assertIn("soon-gone", [t["token"] for t in listed])
        listed = self.admin("GET", "?valid=true")[1]["registration_tokens"]
        self.assertNotIn("soon-gone", [t["token"] for t in listed])
        self.assertEqual(made["token"], "soon-gone")

    def test_bad_admin_input_is_refused(self):
        for body in ({"uses_allowed": -1}, {"uses_allowed": "3"}, {"length": 0},
                     {"length": 65}, {"token": "has space"},
                     {"expiry_time": int(time.time() * 1000) - 60000}):
            status, answer = self.admin("POST", "/new", body)
            self.assertEqual((status, answer["errcode"]), (400, "M_INVALID_PARAM"), (body, answer))
        status, answer = self.admin("PUT", "/missing", {"uses_allowed": 1})
        self.assertEqual((status, answer["errcode"]), (404, "M_NOT_FOUND"), answer)

    def test_only_admins_reach_the_admin_api(self):
        made = self.new_token()
        status, user = register_with_token(self.srv, "plainuser", made["token"])
        self.assertEqual(status, 200, user)
        status, body = self.admin("GET", token=user["access_token"])
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"), body)
        status, body = self.srv.json("GET", ADMIN)
        self.assertEqual((status, body["errcode"]), (401, "M_MISSING_TOKEN"), body)

    def test_validity_needs_a_token(self):
        status, body = self.srv.json("GET", VALIDITY)
        self.assertEqual((status, body["errcode"]), (400, "M_MISSING_PARAM"), body)
        self.assertFalse(self.valid("unknown-token"))


class UiaSessionTest(unittest.TestCase):
    """Open registration (m.login.dummy): what a session remembers."""

    @classmethod
    def setUpClass(cls):
        cls.srv = Server(settings=REGISTRATION_ON)
        cls.srv.__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.srv.__exit__(None, None, None)

    def register(self, body):
        return self.srv.json("POST", V3 + "/register", body, timeout=60)

    def login(self, user, password):
        return self.srv.json("POST", V3 + "/login", {
            "type": "m.login.password", "identifier": {"type": "m.id.user", "user": user},
            "password": password}, timeout=60)

    def test_parameters_sent_once_are_remembered(self):
        status, challenge = self.register({"username": "once", "password": "pw-once",
                                           "inhibit_login": True})
        self.assertEqual(status, 401, challenge)
        self.assertEqual(challenge["completed"], [])
        status, body = self.register({"auth": {"type": "m.login.dummy",
                                               "session": challenge["session"]}})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["user_id"].split(":")[0], "@once")
        self.assertNotIn("access_token", body)  # inhibit_login was remembered
        self.assertEqual(self.login("once", "pw-once")[0], 200)

    def test_the_password_is_kept_only_as_a_hash(self):
        status, challenge = self.register({"username": "hashed", "password": "pw-hashed-secret"})
        self.assertEqual(status, 401, challenge)
        rows = psql("SELECT params::text, password_hash FROM uia_sessions WHERE session_id = "
                    f"'{challenge['session']}'", database=self.srv.database)
        self.assertNotIn("pw-hashed-secret", rows[0][0])
        self.assertTrue(rows[0][1].startswith("$argon2id$"), rows)

    def test_a_retry_of_a_finished_registration_answers_the_same_user(self):
        body = {"username": "retried", "password": "pw-retried"}
        status, challenge = self.register(body)
        body["auth"] = {"type": "m.login.dummy", "session": challenge["session"]}
        status, first = self.register(body)
        self.assertEqual(status, 200, first)
        status, again = self.register(body)
        self.assertEqual(status, 200, again)
        self.assertEqual(again["user_id"], first["user_id"])
        status, me = self.srv.json("GET", V3 + "/account/whoami", token=again["access_token"])
        self.assertEqual((status, me["user_id"]), (200, first["user_id"]), me)
        # Without the session, the name is taken.
        status, taken = self.register({"username": "retried", "password": "x"})
        self.assertEqual((status, taken["errcode"]), (400, "M_USER_IN_USE"), taken)

    def test_a_session_alone_tells_where_it_stands(self):
        status, challenge = self.register({})
        status, body = self.register({"auth": {"session": challenge["session"]}})
        self.assertEqual(status, 401, body)
        self.assertEqual((body["session"], body["completed"]), (challenge["session"], []))


if __name__ == "__main__":
    unittest.main()
