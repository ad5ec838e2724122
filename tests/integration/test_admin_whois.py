"""GET /admin/whois/{userId}: a server admin (or the user themself) learns a user's devices
and where each was last seen; anyone else gets 403, an unknown user 404."""

import urllib.parse

from accounts import REGISTRATION_ON, login, register
from common import make_admin
from harness import AtriumTestCase, psql

WHOIS = "/_matrix/client/v3/admin/whois/"


class AdminWhoisTest(AtriumTestCase):
    def setUp(self):
        self.srv = self.start_server(settings=REGISTRATION_ON)
        self.admin = register(self.srv, "root")
        make_admin(self.srv, self.admin.user_id)
        self.alice = register(self.srv, "alice", device_id="LAPTOP")
        login(self.srv, "alice", device_id="PHONE")
        psql("UPDATE devices SET last_seen_ts = 1700000000000, last_seen_ip = '10.1.2.3'"
             f" WHERE user_id = '{self.alice.user_id}' AND device_id = 'PHONE'", self.srv.database)
        self.bob = register(self.srv, "bob")

    def whois(self, who, token):
        return self.srv.json("GET", WHOIS + urllib.parse.quote(who, safe=""), token=token)

    def test_an_admin_sees_every_device_with_its_last_connection(self):
        status, body = self.whois(self.alice.user_id, self.admin.token)
        self.assertEqual(status, 200, body)
        self.assertEqual(body["user_id"], self.alice.user_id)
        self.assertEqual(sorted(body["devices"]), ["LAPTOP", "PHONE"])
        phone = body["devices"]["PHONE"]["sessions"]
        # No User-Agent in this test's requests: the key is there, null (as Synapse lists it).
        self.assertEqual(phone, [{"connections": [{"ip": "10.1.2.3", "last_seen": 1700000000000,
                                                   "user_agent": None}]}])
        # Served under the r0 prefix too (it was in r0.6.1).
        status, again = self.srv.json("GET", "/_matrix/client/r0/admin/whois/" +
                                      urllib.parse.quote(self.alice.user_id, safe=""),
                                      token=self.admin.token)
        self.assertEqual((status, sorted(again["devices"])), (200, ["LAPTOP", "PHONE"]))

    def test_a_user_may_ask_about_themself_but_not_about_others(self):
        status, body = self.whois(self.alice.user_id, self.alice.token)
        self.assertEqual((status, sorted(body["devices"])), (200, ["LAPTOP", "PHONE"]))
        status, body = self.whois(self.alice.user_id, self.bob.token)
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"))
        status, body = self.whois(self.alice.user_id, None)
        self.assertEqual((status, body["errcode"]), (401, "M_MISSING_TOKEN"))

    def test_unknown_and_malformed_users(self):
        status, body = self.whois("@nobody:localhost", self.admin.token)
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"))
        status, body = self.whois("nobody", self.admin.token)
        self.assertEqual((status, body["errcode"]), (400, "M_INVALID_PARAM"))
