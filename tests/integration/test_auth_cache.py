"""The token cache: repeated requests with one token read PostgreSQL once, and a revoked
token is refused at once in the process that revoked it and, through PostgreSQL's NOTIFY,
promptly in another process sharing the database."""

import http.client
import json
import time
import unittest

from accounts import REGISTRATION_ON, login, register
from common import AtriumTestCase, wait_until
from harness import Server, create_database, drop_database, psql

WHOAMI = "/_matrix/client/v3/account/whoami"


class TokenCacheTest(AtriumTestCase):
    """The tests that neither cut the server's connections nor need a second process share
    one server (start_class_server): each with users of its own, and "cached" meaning a
    hit counted since the test began."""

    def shared(self):
        return self.start_class_server(settings=REGISTRATION_ON)

    @staticmethod
    def _login_or_none(srv, user):
        try:
            return login(srv, user)
        except AssertionError:  # 503 while the pool heals from the cut connections
            return None

    def test_a_token_is_read_from_the_database_once_then_served_from_the_cache(self):
        srv = self.shared()
        alice = register(srv, "alice")
        hits_before = srv.metric("atrium_auth_cache_hits_total")

        def served_from_cache():  # true once the listener is connected and alice is cached
            srv.json("GET", WHOAMI, token=alice.token)
            return srv.metric("atrium_auth_cache_hits_total") > hits_before

        wait_until(served_from_cache, what="the cache in use")
        hits = srv.metric("atrium_auth_cache_hits_total")
        misses = srv.metric("atrium_auth_cache_misses_total")
        for _ in range(5):
            self.assertEqual(srv.json("GET", WHOAMI, token=alice.token)[1]["user_id"], alice.user_id)
        self.assertEqual(srv.metric("atrium_auth_cache_hits_total"), hits + 5)
        self.assertEqual(srv.metric("atrium_auth_cache_misses_total"), misses)

    def test_tokens_taking_turns_on_one_kept_alive_connection_each_name_their_own_user(self):
        # One connection is served by one request thread, which remembers the hash of the
        # last token it saw (core/client/auth/auth.c): every token must still be its own.
        srv = self.shared()
        alice, bob = register(srv, "ann"), register(srv, "ben")
        conn = http.client.HTTPConnection(srv.host, srv.port, timeout=10)
        self.addCleanup(conn.close)

        def whoami(token):
            conn.request("GET", WHOAMI, headers={"Authorization": f"Bearer {token}"})
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read())

        for acct in (alice, alice, bob, alice, bob, bob):
            status, body = whoami(acct.token)
            self.assertEqual((status, body.get("user_id"), body.get("device_id")),
                             (200, acct.user_id, acct.device_id))
        for bogus in (alice.token + "x", alice.token[:-1], "syt_not_a_token"):
            status, body = whoami(bogus)
            self.assertEqual((status, body.get("errcode")), (401, "M_UNKNOWN_TOKEN"), bogus)
            self.assertEqual(whoami(alice.token)[1].get("user_id"), alice.user_id)

    def test_logout_refuses_a_cached_token_at_once_in_the_same_process(self):
        srv = self.shared()
        register(srv, "bob")
        phone, laptop = login(srv, "bob", device_id="PHONE"), login(srv, "bob", device_id="LAPTOP")
        for acct in (phone, laptop):  # both cached now
            self.assertEqual(srv.json("GET", WHOAMI, token=acct.token)[0], 200)
            self.assertEqual(srv.json("GET", WHOAMI, token=acct.token)[0], 200)
        self.assertEqual(srv.json("POST", "/_matrix/client/v3/logout/all", {}, token=phone.token)[0], 200)
        for acct in (phone, laptop):
            status, body = srv.json("GET", WHOAMI, token=acct.token)
            self.assertEqual((status, body["errcode"]), (401, "M_UNKNOWN_TOKEN"))

    def test_a_token_revoked_by_another_process_is_refused_promptly(self):
        db = create_database()
        self.addCleanup(drop_database, db)
        a = Server(database=db, settings=REGISTRATION_ON, start=False)
        b = Server(database=db, settings=REGISTRATION_ON, start=False)
        for s in (a, b):
            self.addCleanup(s.close)
            s.start()
        carol = register(a, "carol")

        def cached_in_b():
            self.assertEqual(b.json("GET", WHOAMI, token=carol.token)[0], 200)
            return b.metric("atrium_auth_cache_hits_total") > 0

        wait_until(cached_in_b, what="carol's token cached in b")
        self.assertEqual(a.json("POST", "/_matrix/client/v3/logout", {}, token=carol.token)[0], 200)
        started = time.monotonic()
        wait_until(lambda: b.json("GET", WHOAMI, token=carol.token)[0] == 401, timeout=5,
                   what="b refuses the revoked token")
        self.assertLess(time.monotonic() - started, 2.0, "NOTIFY reaches the other process promptly")

    def test_a_revocation_written_straight_into_the_database_also_reaches_the_cache(self):
        srv = self.shared()
        dave = register(srv, "dave")
        hits_before = srv.metric("atrium_auth_cache_hits_total")

        def cached():
            self.assertEqual(srv.json("GET", WHOAMI, token=dave.token)[0], 200)
            return srv.metric("atrium_auth_cache_hits_total") > hits_before

        wait_until(cached, what="dave's token cached")
        psql(f"UPDATE users SET deactivated = true WHERE user_id = '{dave.user_id}'", database=srv.database)
        wait_until(lambda: srv.json("GET", WHOAMI, token=dave.token)[0] == 401, timeout=5,
                   what="a deactivated user's cached token refused")

    def test_a_revocation_made_while_the_listener_was_cut_off_is_still_honoured(self):
        srv = self.start_server(settings=REGISTRATION_ON)
        erin = register(srv, "erin")

        def cached():
            self.assertEqual(srv.json("GET", WHOAMI, token=erin.token)[0], 200)
            return srv.metric("atrium_auth_cache_hits_total") > 0

        wait_until(cached, what="erin's token cached")
        # Cut every connection of the server (the listener's too), and revoke while the
        # notification has nobody to reach: the cache must not answer from memory.
        psql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
             f"WHERE datname = '{srv.database}' AND pid <> pg_backend_pid()")
        psql(f"DELETE FROM access_tokens WHERE user_id = '{erin.user_id}'", database=srv.database)
        wait_until(lambda: srv.json("GET", WHOAMI, token=erin.token)[0] == 401, timeout=10,
                   what="the token revoked while the listener was away refused")
        # And the cache works again once the listener is back.
        fresh = wait_until(lambda: self._login_or_none(srv, "erin"), what="login after the cut")

        def cached_again():  # a 503 from a pooled connection cut above may come first
            status = srv.json("GET", WHOAMI, token=fresh.token)[0]
            return status == 200 and srv.metric("atrium_auth_cache_hits_total") > 1

        wait_until(cached_again, what="cache back in use")


if __name__ == "__main__":
    unittest.main()
