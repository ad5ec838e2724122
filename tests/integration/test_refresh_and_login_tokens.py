"""Refresh tokens and signing in from an existing session.

A client that sends refresh_token: true to /login or /register gets an access token that
expires after auth.refreshable_access_token_lifetime_ms and a refresh token; POST
/_matrix/client/v3/refresh trades it for a new pair, the old pair dying once the new one
is used (core/client/accounts/refresh.c). With auth.login_via_existing_session, POST
/_matrix/client/v1/login/get_token (after the password, through user-interactive auth)
gives a single-use m.login.token (core/client/accounts/login_token.c).
"""

import unittest

from accounts import DEFAULT_PASSWORD, register
from harness import Server, psql

V3 = "/_matrix/client/v3"
GET_TOKEN = "/_matrix/client/v1/login/get_token"
LIFETIME_MS = 120000
SETTINGS = {"registration": {"enabled": True},
            "auth": {"refreshable_access_token_lifetime_ms": LIFETIME_MS,
                     "login_via_existing_session": True, "login_token_lifetime_ms": 60000}}


def sha256_sql(token):
    return f"encode(sha256('{token}'::bytea), 'hex')"


class RefreshTokensTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = Server(settings=SETTINGS)
        cls.srv.__enter__()
        try:
            cls.alice = register(cls.srv, "alice")
        except BaseException:
            cls.srv.__exit__(None, None, None)
            raise

    @classmethod
    def tearDownClass(cls):
        cls.srv.__exit__(None, None, None)

    def login(self, **extra):
        body = {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": "alice"},
                "password": DEFAULT_PASSWORD, **extra}
        status, answer = self.srv.json("POST", V3 + "/login", body, timeout=60)
        self.assertEqual(status, 200, answer)
        return answer

    def whoami(self, token):
        return self.srv.json("GET", V3 + "/account/whoami", token=token)

    def refresh(self, refresh_token):
        return self.srv.json("POST", V3 + "/refresh", {"refresh_token": refresh_token})

    def test_login_without_the_flag_gets_no_refresh_token(self):
        answer = self.login()
        self.assertNotIn("refresh_token", answer)
        self.assertNotIn("expires_in_ms", answer)

    def test_login_with_the_flag_gets_a_refresh_token_and_the_configured_lifetime(self):
        answer = self.login(refresh_token=True)
        self.assertIsInstance(answer["refresh_token"], str)
        self.assertEqual(answer["expires_in_ms"], LIFETIME_MS)
        self.assertEqual(self.whoami(answer["access_token"])[0], 200)

    def test_register_with_the_flag_gets_a_refresh_token(self):
        body = {"username": "regrefresh", "password": "pw-regrefresh", "refresh_token": True}
        status, challenge = self.srv.json("POST", V3 + "/register", body)
        self.assertEqual(status, 401, challenge)
        body["auth"] = {"type": "m.login.dummy", "session": challenge["session"]}
        status, answer = self.srv.json("POST", V3 + "/register", body, timeout=60)
        self.assertEqual(status, 200, answer)
        self.assertEqual(answer["expires_in_ms"], LIFETIME_MS)
        status, pair = self.refresh(answer["refresh_token"])
        self.assertEqual(status, 200, pair)
        self.assertEqual(self.whoami(pair["access_token"])[1]["user_id"], answer["user_id"])

    def test_an_expired_access_token_is_a_soft_logout_and_refreshing_recovers(self):
        answer = self.login(refresh_token=True, device_id="EXPIRING")
        psql("UPDATE access_tokens SET expires_ts = 1 WHERE token_hash = "
             + sha256_sql(answer["access_token"]), database=self.srv.database)
        status, body = self.whoami(answer["access_token"])
        self.assertEqual((status, body["errcode"], body["soft_logout"]),
                         (401, "M_UNKNOWN_TOKEN", True), body)
        status, pair = self.refresh(answer["refresh_token"])
        self.assertEqual(status, 200, pair)
        self.assertEqual(pair["expires_in_ms"], LIFETIME_MS)
        self.assertNotEqual(pair["refresh_token"], answer["refresh_token"])
        status, me = self.whoami(pair["access_token"])
        self.assertEqual((status, me["device_id"]), (200, "EXPIRING"), me)

    def test_an_unknown_token_is_not_a_soft_logout(self):
        status, body = self.whoami("atr_no-such-token")
        self.assertEqual((status, body["errcode"], body["soft_logout"]),
                         (401, "M_UNKNOWN_TOKEN", False), body)

    def test_the_old_pair_dies_once_the_new_access_token_is_used(self):
        first = self.login(refresh_token=True)
        status, second = self.refresh(first["refresh_token"])
        self.assertEqual(status, 200, second)
        # Until the new pair is used, the old access token still works.
        self.assertEqual(self.whoami(first["access_token"])[0], 200)
        self.assertEqual(self.whoami(second["access_token"])[0], 200)
        status, body = self.whoami(first["access_token"])
        self.assertEqual((status, body["errcode"]), (401, "M_UNKNOWN_TOKEN"), body)
        status, body = self.refresh(first["refresh_token"])
        self.assertEqual((status, body["errcode"]), (401, "M_UNKNOWN_TOKEN"), body)
        self.assertEqual(self.whoami(second["access_token"])[0], 200)

    def test_a_refresh_token_is_single_use_once_its_successor_is_refreshed(self):
        first = self.login(refresh_token=True)
        second = self.refresh(first["refresh_token"])[1]
        status, third = self.refresh(second["refresh_token"])
        self.assertEqual(status, 200, third)
        status, body = self.refresh(first["refresh_token"])
        self.assertEqual((status, body["errcode"]), (401, "M_UNKNOWN_TOKEN"), body)
        self.assertEqual(self.whoami(first["access_token"])[0], 401)

    def test_a_lost_refresh_answer_can_be_retried(self):
        first = self.login(refresh_token=True)
        lost = self.refresh(first["refresh_token"])[1]
        status, retried = self.refresh(first["refresh_token"])
        self.assertEqual(status, 200, retried)
        self.assertEqual(self.whoami(retried["access_token"])[0], 200)
        self.assertEqual(self.whoami(lost["access_token"])[0], 401)
        self.assertEqual(self.refresh(lost["refresh_token"])[0], 401)

    def test_only_hashes_are_stored(self):
        answer = self.login(refresh_token=True)
        rows = psql("SELECT count(*) FROM refresh_tokens WHERE token_hash = "
                    + sha256_sql(answer["refresh_token"]), database=self.srv.database)
        self.assertEqual(rows, [["1"]])
        rows = psql(f"SELECT count(*) FROM refresh_tokens WHERE token_hash = "
                    f"'{answer['refresh_token']}'", database=self.srv.database)
        self.assertEqual(rows, [["0"]])

    def test_logging_out_ends_the_refresh_token(self):
        answer = self.login(refresh_token=True)
        status, _ = self.srv.json("POST", V3 + "/logout", {}, token=answer["access_token"])
        self.assertEqual(status, 200)
        status, body = self.refresh(answer["refresh_token"])
        self.assertEqual((status, body["errcode"]), (401, "M_UNKNOWN_TOKEN"), body)

    def test_a_refresh_without_a_token_is_refused(self):
        status, body = self.srv.json("POST", V3 + "/refresh", {})
        self.assertEqual((status, body["errcode"]), (400, "M_MISSING_PARAM"), body)
        status, body = self.refresh(12)
        self.assertEqual((status, body["errcode"]), (400, "M_BAD_JSON"), body)

    # ---- m.login.token ----------------------------------------------------------------

    def get_token(self, token, password=DEFAULT_PASSWORD):
        status, challenge = self.srv.json("POST", GET_TOKEN, {}, token=token)
        self.assertEqual(status, 401, challenge)
        self.assertEqual(challenge["flows"], [{"stages": ["m.login.password"]}])
        auth = {"type": "m.login.password", "session": challenge["session"], "password": password,
                "identifier": {"type": "m.id.user", "user": "alice"}}
        return self.srv.json("POST", GET_TOKEN, {"auth": auth}, token=token, timeout=60)

    def token_login(self, login_token, **extra):
        return self.srv.json("POST", V3 + "/login",
                             {"type": "m.login.token", "token": login_token, **extra})

    def test_login_flows_offer_tokens_from_an_existing_session(self):
        status, body = self.srv.json("GET", V3 + "/login")
        self.assertEqual(status, 200, body)
        self.assertIn({"type": "m.login.token", "get_login_token": True}, body["flows"])

    def test_capabilities_offer_get_login_token(self):
        status, body = self.srv.json("GET", V3 + "/capabilities", token=self.alice.token)
        self.assertEqual(status, 200, body)
        self.assertEqual(body["capabilities"]["m.get_login_token"], {"enabled": True})

    def test_a_login_token_signs_in_another_device_once(self):
        status, got = self.get_token(self.alice.token)
        self.assertEqual(status, 200, got)
        self.assertEqual(got["expires_in_ms"], 60000)
        status, session = self.token_login(got["login_token"], device_id="SECOND")
        self.assertEqual(status, 200, session)
        self.assertEqual((session["user_id"], session["device_id"]), (self.alice.user_id, "SECOND"))
        self.assertEqual(self.whoami(session["access_token"])[1]["device_id"], "SECOND")
        status, body = self.token_login(got["login_token"])
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"), body)

    def test_a_login_token_can_come_with_a_refresh_token(self):
        got = self.get_token(self.alice.token)[1]
        status, session = self.token_login(got["login_token"], refresh_token=True)
        self.assertEqual(status, 200, session)
        self.assertEqual(self.refresh(session["refresh_token"])[0], 200)

    def test_get_token_needs_the_right_password(self):
        status, body = self.get_token(self.alice.token, password="wrong")
        self.assertEqual((status, body["errcode"]), (401, "M_FORBIDDEN"), body)
        self.assertNotIn("login_token", body)

    def test_get_token_needs_an_access_token(self):
        status, body = self.srv.json("POST", GET_TOKEN, {})
        self.assertEqual((status, body["errcode"]), (401, "M_MISSING_TOKEN"), body)

    def test_an_expired_or_unknown_login_token_is_refused(self):
        got = self.get_token(self.alice.token)[1]
        psql("UPDATE login_tokens SET expires_ts = 1 WHERE token_hash = "
             + sha256_sql(got["login_token"]), database=self.srv.database)
        status, body = self.token_login(got["login_token"])
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"), body)
        status, body = self.token_login("no-such-token")
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"), body)


class LoginTokensOffTest(unittest.TestCase):
    """Without auth.login_via_existing_session (the default) nothing of it is offered."""

    def test_nothing_is_offered_by_default(self):
        with Server(settings={"registration": {"enabled": True}}) as srv:
            alice = register(srv, "alice")
            status, body = srv.json("GET", V3 + "/login")
            self.assertNotIn("m.login.token", [f["type"] for f in body["flows"]])
            status, body = srv.json("GET", V3 + "/capabilities", token=alice.token)
            self.assertEqual(body["capabilities"]["m.get_login_token"], {"enabled": False})
            status, body = srv.json("POST", GET_TOKEN, {}, token=alice.token)
            self.assertEqual((status, body["errcode"]), (404, "M_UNRECOGNIZED"), body)
            status, body = srv.json("POST", V3 + "/login", {"type": "m.login.token", "token": "x"})
            self.assertEqual((status, body["errcode"]), (400, "M_UNKNOWN"), body)


if __name__ == "__main__":
    unittest.main()
