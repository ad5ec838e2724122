"""Devices' last_seen_ts and last_seen_ip follow use, not only login: the first request a
device makes once its stored time is AUTH_SEEN_REFRESH_MS (5 minutes) old writes the time
and the client's address, further requests within the interval write nothing, a device
not used keeps its old values, and neither a locked row nor a failing write holds up or
fails the request.

The tests never wait out the interval: they age a device by writing an old time straight
into PostgreSQL before its first authenticated request, and prove "no second write" by
overwriting the refreshed row with a marker that must survive."""

import subprocess
import time
import unittest

from accounts import REGISTRATION_ON, login, register
from harness import Server, psql_bin, conninfo_for, deep_merge, psql

DEVICES = "/_matrix/client/v3/devices"
WHOAMI = "/_matrix/client/v3/account/whoami"
LONG_AGO_MS = 1_000_000_000_000  # 2001: far older than any refresh interval
OLD_IP = "192.0.2.1"
CLOCK_SLACK_MS = 2000  # the server and the test read the same clock; this covers the request
WRITES = "atrium_device_seen_writes_total"
FAILURES = "atrium_device_seen_failures_total"
PROMPT_S = 2.0  # a request the refresh must not hold up answers well within this


def now_ms():
    return int(time.time() * 1000)


class DeviceLastSeenTest(unittest.TestCase):
    """One server for the class (each test uses its own user); the loopback peer is a
    trusted proxy, so X-Forwarded-For is honoured and a request without it is 127.0.0.1."""

    @classmethod
    def setUpClass(cls):
        settings = deep_merge(REGISTRATION_ON,
                              {"server": {"http": {"trusted_proxies": ["127.0.0.1"]}}})
        cls.srv = Server(settings=settings)
        cls.srv.__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.srv.__exit__(None, None, None)

    def stored(self, account):
        """(last_seen_ts, last_seen_ip) of the account's device, read from PostgreSQL."""
        rows = psql(f"SELECT last_seen_ts, last_seen_ip FROM devices WHERE user_id = "
                    f"'{account.user_id}' AND device_id = '{account.device_id}'",
                    database=self.srv.database)
        self.assertEqual(len(rows), 1, rows)
        return int(rows[0][0]), rows[0][1]

    def set_stored(self, account, ts, ip):
        psql(f"UPDATE devices SET last_seen_ts = {ts}, last_seen_ip = '{ip}' WHERE user_id = "
             f"'{account.user_id}' AND device_id = '{account.device_id}'",
             database=self.srv.database)

    def assertRecent(self, ts, before, after):
        self.assertGreaterEqual(ts, before - CLOCK_SLACK_MS)
        self.assertLessEqual(ts, after + CLOCK_SLACK_MS)

    def whoami(self, account, headers=None):
        status, body = self.srv.json("GET", WHOAMI, token=account.token, headers=headers)
        self.assertEqual((status, body.get("user_id")), (200, account.user_id), body)

    def test_a_used_device_shows_a_fresh_last_seen_and_address_an_idle_one_keeps_its_own(self):
        phone = register(self.srv, "ann", device_id="PHONE")
        laptop = login(self.srv, "ann", device_id="LAPTOP")
        for device in (phone, laptop):
            self.set_stored(device, LONG_AGO_MS, OLD_IP)
        before = now_ms()
        # The listing that the refresh is triggered by already shows it.
        status, body = self.srv.json("GET", DEVICES, token=phone.token)
        after = now_ms()
        self.assertEqual(status, 200, body)
        listed = {d["device_id"]: d for d in body["devices"]}
        self.assertRecent(listed["PHONE"]["last_seen_ts"], before, after)
        self.assertEqual(listed["PHONE"]["last_seen_ip"], "127.0.0.1")
        self.assertEqual((listed["LAPTOP"]["last_seen_ts"], listed["LAPTOP"]["last_seen_ip"]),
                         (LONG_AGO_MS, OLD_IP))
        status, one = self.srv.json("GET", DEVICES + "/PHONE", token=phone.token)
        self.assertEqual(status, 200, one)
        self.assertEqual((one["last_seen_ts"], one["last_seen_ip"]),
                         (listed["PHONE"]["last_seen_ts"], "127.0.0.1"))
        # Stored, not only reported; the idle device's row untouched.
        self.assertEqual(self.stored(phone), (listed["PHONE"]["last_seen_ts"], "127.0.0.1"))
        self.assertEqual(self.stored(laptop), (LONG_AGO_MS, OLD_IP))

    def test_requests_within_the_interval_do_not_write_again(self):
        phone = register(self.srv, "bea", device_id="PHONE")
        self.set_stored(phone, LONG_AGO_MS, OLD_IP)
        writes = self.srv.metric(WRITES)
        self.whoami(phone)
        self.assertEqual(self.srv.metric(WRITES), writes + 1)
        self.assertRecent(self.stored(phone)[0], now_ms() - 60_000, now_ms())
        # Age the row again behind the server's back: only a second write would undo it.
        marker = (1234, "198.51.100.77")
        self.set_stored(phone, *marker)
        for _ in range(5):  # the token comes from the cache
            self.whoami(phone)
        # A login forgets the user's cached tokens: the next request reads the token, and
        # the marker with it, from PostgreSQL; what this process wrote last still counts.
        misses = self.srv.metric("atrium_auth_cache_misses_total")
        login(self.srv, "bea", device_id="TABLET")
        self.whoami(phone)
        self.assertGreater(self.srv.metric("atrium_auth_cache_misses_total"), misses)
        self.assertEqual(self.stored(phone), marker)
        self.assertEqual(self.srv.metric(WRITES), writes + 1)

    def test_the_address_behind_a_trusted_proxy_is_recorded(self):
        phone = register(self.srv, "cal", device_id="PHONE")
        self.set_stored(phone, LONG_AGO_MS, OLD_IP)
        before = now_ms()
        self.whoami(phone, headers={"X-Forwarded-For": "203.0.113.9, 127.0.0.1"})
        ts, ip = self.stored(phone)
        self.assertRecent(ts, before, now_ms())
        self.assertEqual(ip, "203.0.113.9")

    def test_a_device_row_locked_elsewhere_does_not_hold_up_the_request(self):
        phone = register(self.srv, "dee", device_id="PHONE")
        self.set_stored(phone, LONG_AGO_MS, OLD_IP)
        holder = subprocess.Popen(  # a session of its own, holding the row until told
            [psql_bin(), "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1",
             "-d", conninfo_for(self.srv.database)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            holder.stdin.write(f"BEGIN;\nSELECT 'locked' FROM devices WHERE user_id = "
                               f"'{phone.user_id}' AND device_id = 'PHONE' FOR UPDATE;\n")
            holder.stdin.flush()
            self.assertEqual(holder.stdout.readline().strip(), "locked")
            writes, failures = self.srv.metric(WRITES), self.srv.metric(FAILURES)
            started = time.monotonic()
            status, body = self.srv.json("GET", WHOAMI, token=phone.token, timeout=5)
            self.assertEqual(status, 200, body)
            self.assertLess(time.monotonic() - started, PROMPT_S)
            self.assertEqual((self.srv.metric(WRITES), self.srv.metric(FAILURES)),
                             (writes, failures))
        finally:
            holder.communicate("ROLLBACK;\n", timeout=30)
        self.assertEqual(self.stored(phone), (LONG_AGO_MS, OLD_IP))

    def test_a_failed_write_does_not_fail_the_request(self):
        phone = register(self.srv, "eli", device_id="PHONE")
        self.set_stored(phone, LONG_AGO_MS, OLD_IP)
        db = self.srv.database
        psql("CREATE FUNCTION refuse_seen() RETURNS trigger LANGUAGE plpgsql AS "
             "$$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$", database=db)
        psql(f"CREATE TRIGGER refuse_seen BEFORE UPDATE ON devices FOR EACH ROW "
             f"WHEN (NEW.user_id = '{phone.user_id}') EXECUTE FUNCTION refuse_seen()", database=db)
        self.addCleanup(psql, "DROP FUNCTION refuse_seen() CASCADE", database=db)
        failures = self.srv.metric(FAILURES)
        self.whoami(phone)
        self.assertEqual(self.srv.metric(FAILURES), failures + 1)
        self.srv.wait_for_log(r"could not refresh the last-seen time of device PHONE of "
                              + phone.user_id.replace(".", r"\.") + r".*refused by the test")
        self.assertEqual(self.stored(phone), (LONG_AGO_MS, OLD_IP))
        # The next try waits for the retry delay: the request after it does not write.
        self.whoami(phone)
        self.assertEqual(self.srv.metric(FAILURES), failures + 1)


if __name__ == "__main__":
    unittest.main()
