"""OpenID tokens for widgets and calls (core/client/accounts/openid.c).

POST /_matrix/client/v3/user/{userId}/openid/request_token mints a token for the
authenticated user themself; GET /_matrix/federation/v1/openid/userinfo on the federation
listener, with no X-Matrix signature, tells its holder whose it is while it has not expired.
"""

import shutil
import tempfile
import unittest
import urllib.parse

from accounts import REGISTRATION_ON, register
from federation_support import FederatedServer, TestCA
from harness import psql

A_IP = "127.0.0.21"
USERINFO = "/_matrix/federation/v1/openid/userinfo"


def request_token_path(user_id):
    return f"/_matrix/client/v3/user/{urllib.parse.quote(user_id, safe='')}/openid/request_token"


class OpenIdTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="atrium-openid-ca-")
        cls.ca = TestCA(cls.tmp)
        cls.srv = FederatedServer(cls.ca, A_IP, extra=REGISTRATION_ON, start=False)
        try:
            cls.srv.start()
            cls.alice = register(cls.srv, "alice")
            cls.bob = register(cls.srv, "bob")
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.srv.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def request_token(self, account, user_id=None):
        return self.srv.json("POST", request_token_path(user_id or account.user_id), {},
                             token=account.token)

    def userinfo(self, token):
        query = "" if token is None else "?" + urllib.parse.urlencode({"access_token": token})
        status, _, body = self.srv.fed_request("GET", USERINFO + query)
        return status, body

    def test_a_user_gets_a_token_for_themself(self):
        status, body = self.request_token(self.alice)
        self.assertEqual(status, 200, body)
        self.assertEqual(body["token_type"], "Bearer")
        self.assertEqual(body["matrix_server_name"], self.srv.server_name)
        self.assertEqual(body["expires_in"], 3600)
        self.assertIsInstance(body["access_token"], str)
        self.assertGreaterEqual(len(body["access_token"]), 32)
        self.assertNotEqual(body["access_token"], self.request_token(self.alice)[1]["access_token"])

    def test_a_token_for_another_user_is_forbidden(self):
        status, body = self.request_token(self.alice, self.bob.user_id)
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"), body)

    def test_a_token_needs_an_access_token(self):
        status, body = self.srv.json("POST", request_token_path(self.alice.user_id), {})
        self.assertEqual((status, body["errcode"]), (401, "M_MISSING_TOKEN"), body)

    def test_userinfo_names_the_tokens_user_without_a_signature(self):
        token = self.request_token(self.bob)[1]["access_token"]
        status, body = self.userinfo(token)
        self.assertEqual((status, body), (200, {"sub": self.bob.user_id}))

    def test_userinfo_refuses_an_unknown_token(self):
        status, body = self.userinfo("bogus-token")
        self.assertEqual((status, body["errcode"]), (401, "M_UNKNOWN_TOKEN"), body)

    def test_userinfo_without_a_token_is_a_missing_parameter(self):
        status, body = self.userinfo(None)
        self.assertEqual((status, body["errcode"]), (400, "M_MISSING_PARAM"), body)

    def test_userinfo_is_not_served_on_the_client_listener(self):
        token = self.request_token(self.alice)[1]["access_token"]
        status, _ = self.srv.json("GET", USERINFO + "?access_token=" + token)
        self.assertEqual(status, 404)

    def test_an_expired_token_is_refused_and_forgotten(self):
        token = self.request_token(self.alice)[1]["access_token"]
        self.assertEqual(self.userinfo(token)[0], 200)
        psql("UPDATE openid_tokens SET expires_ts = 1 WHERE token_hash ="
             f" encode(sha256('{token}'::bytea), 'hex')", database=self.srv.database)
        status, body = self.userinfo(token)
        self.assertEqual((status, body["errcode"]), (401, "M_UNKNOWN_TOKEN"), body)
        rows = psql("SELECT count(*) FROM openid_tokens WHERE token_hash ="
                    f" encode(sha256('{token}'::bytea), 'hex')", database=self.srv.database)
        self.assertEqual(rows, [["0"]])

    def test_a_user_keeps_only_the_newest_ten_tokens(self):
        carol = register(self.srv, "carol")
        tokens = [self.request_token(carol)[1]["access_token"] for _ in range(12)]
        rows = psql(f"SELECT count(*) FROM openid_tokens WHERE user_id = '{carol.user_id}'",
                    database=self.srv.database)
        self.assertEqual(rows, [["10"]])
        self.assertEqual(self.userinfo(tokens[0])[0], 401)
        self.assertEqual(self.userinfo(tokens[-1]), (200, {"sub": carol.user_id}))


if __name__ == "__main__":
    unittest.main()
