"""Several Atrium processes on one PostgreSQL, as behind a load balancer: a /sync parked on
one process wakes within WAKE_BUDGET_S of a write made through another (a message,
typing, a receipt, a to-device message, a device-list change, a key upload, account data,
presence, each asserted on its own; and the legacy /events poll); a typing notice runs
out on time when the process that took it was killed;
a token revoked through one process is refused by the other within a second, and a
logout through A is answered only once B dropped the token (a whoami through B straight
after is refused, every time), yet within about a second when a listening session that
never acknowledges is present; a
plugin's notification (ABI 1.3, through tests/plugins/testplug.c) published in one process
reaches the other, at commit when published inside a transaction; and with a
process's listening connection cut (pg_terminate_backend on it, found by its
application_name, with the database refusing new connections so it stays down), that
process serves no cached token, then comes back by itself and delivers what it missed.

The processes listen on distinct loopback addresses (127.0.0.31, .32), as distinct
machines would."""

import os
import subprocess
import time
import unittest

from accounts import REGISTRATION_ON, login, register
from common import Background, testplug, wait_until
from harness import Server, conninfo_for, create_database, drop_database, psql, psql_bin
from rooms_client import V3, Client, quote
from test_e2ee_keys import device_keys

WAKE_BUDGET_S = 0.100   # a parked sync answers this soon after the write's answer
WAKE_ATTEMPTS = 3       # fresh runs of a wake-up scenario, the best of which must meet it
REVOKE_BUDGET_S = 1.0   # a revocation through one process applies on the other this soon
LOGOUT_ROUNDS = 30      # logouts through A each followed at once by a whoami through B
REVOKE_WAIT_S = 1.0     # how long a logout waits for a process that never acknowledges
PARK_TIMEOUT_MS = 20000  # a parked sync's own timeout: far beyond every budget above
WHOAMI = f"{V3}/account/whoami"


class WakeChecks:
    """How a test times a wake-up (mixed into the test cases below)."""

    def woken_by(self, bg, write):
        """Run write() (through A) and wait for the parked sync: (its answer, the seconds
        from the write's answer to the sync's)."""
        write()
        written = time.monotonic()
        answer = bg.result(timeout=PARK_TIMEOUT_MS / 1000 + 10)
        return answer, bg.finished_at - written

    def assert_woken_by(self, bg, write, budget_s=WAKE_BUDGET_S):
        """woken_by, and the sync must answer within budget_s: its answer."""
        answer, latency = self.woken_by(bg, write)
        self.assertLess(latency, budget_s,
                        f"the sync on B answered {latency * 1000:.0f} ms after the write on A")
        return answer

    def assert_wakes_promptly(self, scenario):
        """scenario(tag) sets up its own users (named with tag), parks a sync on B, writes
        through A, checks the answer's content and returns the latency. It must be under
        WAKE_BUDGET_S; on this shared 2-core machine one run can lose a scheduling race
        (in-process wake-ups see the same spikes: bench/sync_crossprocess.py), so a fresh
        scenario is run up to WAKE_ATTEMPTS times and the best must be under it. A wake-up
        that does not cross processes answers after PARK_TIMEOUT_MS every time."""
        latencies = []
        for attempt in range(WAKE_ATTEMPTS):
            latencies.append(scenario(f"{attempt}"))
            if latencies[-1] < WAKE_BUDGET_S:
                return
        self.fail("the sync on B answered "
                  + ", ".join(f"{x * 1000:.0f} ms" for x in latencies) + " after the write on A")


class MultiProcessTest(WakeChecks, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.db = create_database()
        cls.a = Server(database=cls.db, settings=REGISTRATION_ON, plugins=testplug(),
                       start=False, host="127.0.0.31")
        cls.b = Server(database=cls.db, settings=REGISTRATION_ON, plugins=testplug(),
                       start=False, host="127.0.0.32")
        try:
            for s in (cls.a, cls.b):
                s.start()
        except BaseException:
            cls._close()
            raise

    @classmethod
    def _close(cls):
        try:
            psql(f'ALTER DATABASE "{cls.db}" WITH ALLOW_CONNECTIONS true')
        finally:
            for s in (cls.a, cls.b):
                s.close()
            drop_database(cls.db)

    @classmethod
    def tearDownClass(cls):
        cls._close()

    # -- helpers --------------------------------------------------------------------------

    def pair(self, name):
        """Two users in one room: the writer talks to A, the reader syncs on B."""
        writer = Client(self.a, register(self.a, f"{name}_w"))
        reader = Client(self.b, register(self.a, f"{name}_r"))
        room = writer.create_room(preset="public_chat")
        reader.join(room)
        return writer, reader, room

    def park_on_b(self, reader):
        """A /sync of reader parked on B (it found nothing new): (Background, since)."""
        since = reader.sync(timeout_ms=0)["next_batch"]
        parked_before = self.b.metric("atrium_http_parked") or 0
        bg = Background(reader.sync, since=since, timeout_ms=PARK_TIMEOUT_MS, http_timeout=60)
        wait_until(lambda: (self.b.metric("atrium_http_parked") or 0) > parked_before,
                   what="the sync parked on B")
        return bg, since

    # -- a parked sync on B wakes for a write through A, per kind --------------------------

    def test_a_message_sent_through_a_wakes_a_sync_parked_on_b(self):
        def scenario(tag):
            writer, reader, room = self.pair("msg" + tag)
            bg, _ = self.park_on_b(reader)
            answer, latency = self.woken_by(bg, lambda: writer.send(
                room, {"msgtype": "m.text", "body": "across"}))
            events = answer["rooms"]["join"][room]["timeline"]["events"]
            self.assertIn("across", [e["content"].get("body") for e in events])
            return latency
        self.assert_wakes_promptly(scenario)

    def test_typing_through_a_wakes_a_sync_parked_on_b(self):
        def scenario(tag):
            writer, reader, room = self.pair("typ" + tag)
            bg, _ = self.park_on_b(reader)
            answer, latency = self.woken_by(bg, lambda: writer.ok(
                "PUT", f"{V3}/rooms/{quote(room)}/typing/{quote(writer.user_id)}",
                {"typing": True, "timeout": 30000}))
            ephemeral = answer["rooms"]["join"][room]["ephemeral"]["events"]
            self.assertIn({"type": "m.typing", "content": {"user_ids": [writer.user_id]}},
                          ephemeral)
            return latency
        self.assert_wakes_promptly(scenario)

    def test_a_receipt_through_a_wakes_a_sync_parked_on_b(self):
        def scenario(tag):
            writer, reader, room = self.pair("rcp" + tag)
            event = writer.send(room, {"msgtype": "m.text", "body": "read me"})
            bg, _ = self.park_on_b(reader)
            answer, latency = self.woken_by(bg, lambda: writer.ok(
                "POST", f"{V3}/rooms/{quote(room)}/receipt/m.read/{quote(event)}", {}))
            receipts = [e for e in answer["rooms"]["join"][room]["ephemeral"]["events"]
                        if e["type"] == "m.receipt"]
            self.assertTrue(receipts, answer["rooms"]["join"][room])
            self.assertIn(writer.user_id, receipts[0]["content"][event]["m.read"])
            return latency
        self.assert_wakes_promptly(scenario)

    def test_a_to_device_message_through_a_wakes_a_sync_parked_on_b(self):
        def scenario(tag):
            writer, reader, _ = self.pair("tod" + tag)
            bg, _ = self.park_on_b(reader)
            answer, latency = self.woken_by(bg, lambda: writer.ok(
                "PUT", f"{V3}/sendToDevice/m.test/tod1",
                {"messages": {reader.user_id: {reader.device_id: {"hello": "across"}}}}))
            events = answer["to_device"]["events"]
            self.assertEqual([(e["type"], e["sender"], e["content"]) for e in events],
                             [("m.test", writer.user_id, {"hello": "across"})])
            return latency
        self.assert_wakes_promptly(scenario)

    def test_a_device_list_change_through_a_wakes_a_sync_parked_on_b(self):
        def scenario(tag):
            writer, reader, _ = self.pair("dev" + tag)
            bg, _ = self.park_on_b(reader)
            answer, latency = self.woken_by(bg, lambda: writer.ok(
                "PUT", f"{V3}/devices/{quote(writer.device_id)}", {"display_name": "renamed on A"}))
            self.assertIn(writer.user_id, answer["device_lists"]["changed"])
            return latency
        self.assert_wakes_promptly(scenario)

    def test_a_typing_notice_runs_out_on_b_when_the_process_that_took_it_died(self):
        c = Server(database=self.db, settings=REGISTRATION_ON, start=False, host="127.0.0.33")
        self.addCleanup(c.close)
        c.start()
        writer = Client(c, register(c, "typ_dies_w"))
        reader = Client(self.b, register(c, "typ_dies_r"))
        room = writer.create_room(preset="public_chat")
        reader.join(room)
        since = reader.sync(timeout_ms=0)["next_batch"]
        writer.ok("PUT", f"{V3}/rooms/{quote(room)}/typing/{quote(writer.user_id)}",
                  {"typing": True, "timeout": 1500})
        c.kill()  # before the notice runs out: only B's reaper is left to report it
        typers = None
        deadline = time.monotonic() + 10
        while typers != [] and time.monotonic() < deadline:
            answer = reader.sync(since=since, timeout_ms=PARK_TIMEOUT_MS, http_timeout=60)
            since = answer["next_batch"]
            for e in answer["rooms"]["join"].get(room, {}).get("ephemeral", {}).get("events", []):
                if e["type"] == "m.typing":
                    typers = e["content"]["user_ids"]
        self.assertEqual(typers, [], "B reported the dead process's typing notice running out")
        self.assertLess(time.monotonic(), deadline)

    # -- the plugin ABI ---------------------------------------------------------------------

    def seen_on(self, srv):
        status, body = srv.json("GET", "/_test/notify/seen")
        self.assertEqual(status, 200, body)
        return body

    def test_a_plugins_notification_published_on_a_reaches_b_and_a(self):
        self.assertEqual(self.seen_on(self.b)["live"], 1)
        self.assertGreaterEqual(self.seen_on(self.b)["missed"], 1, "told once when it came up")
        for tx in ("0", "1"):  # on a pooled connection, then inside a committed transaction
            payload = f"ping-{tx}"
            status, body = self.a.json("POST", f"/_test/notify?payload={payload}&tx={tx}")
            self.assertEqual(status, 200, body)
            for srv in (self.b, self.a):  # the publisher hears its own too
                wait_until(lambda: payload in self.seen_on(srv)["seen"], timeout=2,
                           what=f"{payload} heard")
        # A channel outside the contract, or a payload past the limit, is refused.
        for query in ("payload=x&channel=Bad-Name", "payload=" + "x" * 1001):
            status, body = self.a.json("POST", f"/_test/notify?{query}")
            self.assertEqual((status, body["errcode"]), (400, "M_INVALID_PARAM"), query)
            self.assertIn("ATRIUM_E_INVAL", body["error"])

    def test_a_key_upload_through_a_wakes_a_sync_parked_on_b(self):
        def scenario(tag):
            writer, reader, _ = self.pair("key" + tag)
            bg, _ = self.park_on_b(reader)
            answer, latency = self.woken_by(bg, lambda: writer.ok(
                "POST", f"{V3}/keys/upload", {"device_keys": device_keys(writer)}))
            self.assertIn(writer.user_id, answer["device_lists"]["changed"])
            return latency
        self.assert_wakes_promptly(scenario)

    def test_account_data_set_through_a_wakes_the_same_users_sync_parked_on_b(self):
        def scenario(tag):
            _, reader, _ = self.pair("acd" + tag)
            reader_on_a = Client(self.a, reader)  # the same account, another process
            bg, _ = self.park_on_b(reader)
            answer, latency = self.woken_by(bg, lambda: reader_on_a.ok(
                "PUT", f"{V3}/user/{quote(reader.user_id)}/account_data/org.example.mp", {"n": 1}))
            self.assertIn({"type": "org.example.mp", "content": {"n": 1}},
                          answer["account_data"]["events"])
            return latency
        self.assert_wakes_promptly(scenario)

    def test_a_message_through_a_wakes_a_legacy_events_poll_parked_on_b(self):
        def scenario(tag):
            writer, reader, room = self.pair("evt" + tag)
            start = reader.ok("GET", f"{V3}/events?timeout=0")["end"]
            parked_before = self.b.metric("atrium_http_parked") or 0
            bg = Background(reader.call, "GET",
                            f"{V3}/events?from={start}&timeout={PARK_TIMEOUT_MS}", None, 60)
            wait_until(lambda: (self.b.metric("atrium_http_parked") or 0) > parked_before,
                       what="the /events poll parked on B")
            (status, answer), latency = self.woken_by(bg, lambda: writer.send(
                room, {"msgtype": "m.text", "body": "legacy"}))
            self.assertEqual(status, 200, answer)
            self.assertIn("legacy", [e["content"].get("body") for e in answer["chunk"]])
            return latency
        self.assert_wakes_promptly(scenario)

    # -- caches ---------------------------------------------------------------------------

    def cached_on_b(self, acct):
        def cached():
            self.assertEqual(self.b.json("GET", WHOAMI, token=acct.token)[0], 200)
            hits = self.b.metric("atrium_auth_cache_hits_total")
            self.assertEqual(self.b.json("GET", WHOAMI, token=acct.token)[0], 200)
            return self.b.metric("atrium_auth_cache_hits_total") > hits
        wait_until(cached, what="the token served from B's cache")

    def test_a_token_revoked_through_a_is_refused_by_b_within_a_second(self):
        carol = register(self.a, "carol")
        self.cached_on_b(carol)
        self.assertEqual(self.a.json("POST", f"{V3}/logout", {}, token=carol.token)[0], 200)
        revoked = time.monotonic()
        wait_until(lambda: self.b.json("GET", WHOAMI, token=carol.token)[0] == 401,
                   timeout=5, interval=0.01, what="B refuses the revoked token")
        self.assertLess(time.monotonic() - revoked, REVOKE_BUDGET_S)

    def test_a_logout_through_a_is_answered_only_once_b_dropped_the_token(self):
        register(self.a, "lena")
        confirmed = self.a.metric("atrium_auth_revoke_confirmed_total") or 0
        stale = []
        for i in range(LOGOUT_ROUNDS):
            acct = login(self.a, "lena")
            self.assertEqual(self.b.json("GET", WHOAMI, token=acct.token)[0], 200)  # cached on B
            self.assertEqual(self.a.json("POST", f"{V3}/logout", {}, token=acct.token)[0], 200)
            status = self.b.json("GET", WHOAMI, token=acct.token)[0]
            if status != 401:
                stale.append((i, status))
        self.assertEqual(stale, [], "B answered a token already logged out through A")
        self.assertGreaterEqual(self.a.metric("atrium_auth_revoke_confirmed_total"),
                                confirmed + LOGOUT_ROUNDS)

    def test_a_logout_answers_within_the_bound_when_a_listener_never_acknowledges(self):
        mute = register(self.a, "mute")
        self.cached_on_b(mute)
        # A listening session named like a process's, which never acknowledges anything.
        fake = subprocess.Popen([psql_bin(), "-X", "-q", "-d", conninfo_for(self.db)],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                env={**os.environ, "PGAPPNAME": "atrium-notify-mute"},
                                text=True)
        try:
            fake.stdin.write("LISTEN atrium_auth;\n")
            fake.stdin.flush()
            wait_until(lambda: psql("SELECT count(*) FROM pg_stat_activity"
                                    " WHERE application_name = 'atrium-notify-mute'") == [["1"]],
                       what="the mute listening session")
            unconfirmed = self.a.metric("atrium_auth_revoke_unconfirmed_total") or 0
            started = time.monotonic()
            self.assertEqual(self.a.json("POST", f"{V3}/logout", {}, token=mute.token)[0], 200)
            took = time.monotonic() - started
            self.assertGreater(took, REVOKE_WAIT_S * 0.9, "the logout waited for the mute one")
            self.assertLess(took, REVOKE_WAIT_S + 1.0, "the logout answered within its bound")
            self.assertEqual(self.a.metric("atrium_auth_revoke_unconfirmed_total"),
                             unconfirmed + 1)
            # B acknowledged in time, so it refuses the token.
            self.assertEqual(self.b.json("GET", WHOAMI, token=mute.token)[0], 401)
        finally:
            fake.stdin.close()
            fake.wait(timeout=10)

    def test_with_its_listening_connection_cut_b_serves_nothing_stale_then_recovers(self):
        dora = register(self.a, "dora")
        self.cached_on_b(dora)
        writer, reader, room = self.pair("cut")
        bg, _ = self.park_on_b(reader)
        reconnects = self.b.metric("atrium_notify_reconnects_total")
        # Cut B's listening connection and keep it down: new connections to the database
        # are refused (the pools' open connections go on working).
        psql(f'ALTER DATABASE "{self.db}" WITH ALLOW_CONNECTIONS false')
        try:
            rows = psql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        f" WHERE application_name = 'atrium-notify-{self.b.pid}'")
            self.assertEqual(rows, [["t"]], "B's one listening connection, by its application_name")
            wait_until(lambda: self.b.metric("atrium_notify_listener_up") == 0,
                       what="B knows its listener is down")
            # B's cache is bypassed: a valid token is read from the database, not memory.
            hits = self.b.metric("atrium_auth_cache_hits_total")
            self.assertEqual(self.b.json("GET", WHOAMI, token=reader.token)[0], 200)
            self.assertEqual(self.b.metric("atrium_auth_cache_hits_total"), hits)
            # Revoked through A while B hears nothing: B must not answer from its cache.
            self.assertEqual(self.a.json("POST", f"{V3}/logout", {}, token=dora.token)[0], 200)
            status, body = self.b.json("GET", WHOAMI, token=dora.token)
            self.assertEqual((status, body["errcode"]), (401, "M_UNKNOWN_TOKEN"))
            # A message through A meanwhile: B's parked sync cannot hear of it yet.
            writer.send(room, {"msgtype": "m.text", "body": "while B was deaf"})
            time.sleep(0.5)
            self.assertFalse(bg.done(), "no wake-up reached B without its listener")
        finally:
            psql(f'ALTER DATABASE "{self.db}" WITH ALLOW_CONNECTIONS true')
        # B reconnects by itself and wakes every parked sync: the missed message arrives.
        answer = bg.result(timeout=15)
        bodies = [e["content"].get("body") for e in answer["rooms"]["join"][room]["timeline"]["events"]]
        self.assertIn("while B was deaf", bodies)
        wait_until(lambda: self.b.metric("atrium_notify_listener_up") == 1, what="B listens again")
        self.assertGreater(self.b.metric("atrium_notify_reconnects_total"), reconnects)
        # A plugin was told too, and says live again.
        self.assertGreaterEqual(self.seen_on(self.b)["missed"], 2)
        self.assertEqual(self.seen_on(self.b)["live"], 1)
        # Its cache is in use again, and wake-ups from A reach it again.
        erin = register(self.a, "erin_cut")
        self.cached_on_b(erin)
        bg, _ = self.park_on_b(reader)
        # (Woken at all, not timed: B's pool may still be healing from the cut.)
        self.assert_woken_by(bg, lambda: writer.send(room, {"msgtype": "m.text", "body": "back"}),
                             budget_s=REVOKE_BUDGET_S)


class MultiProcessPresenceTest(WakeChecks, unittest.TestCase):
    """Presence is off in the harness's base config (its changes wake contacts' syncs, which
    the tests above would see as early answers): two processes of its own, with it on."""

    @classmethod
    def setUpClass(cls):
        cls.db = create_database()
        on = {**REGISTRATION_ON, "presence": {"enabled": True}}
        cls.a = Server(database=cls.db, settings=on, start=False, host="127.0.0.31")
        cls.b = Server(database=cls.db, settings=on, start=False, host="127.0.0.32")
        try:
            for s in (cls.a, cls.b):
                s.start()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        for s in (cls.a, cls.b):
            s.close()
        drop_database(cls.db)

    def test_a_presence_change_through_a_wakes_a_contacts_sync_parked_on_b(self):
        def scenario(tag):
            writer = Client(self.a, register(self.a, f"pres{tag}_w"))
            reader = Client(self.b, register(self.a, f"pres{tag}_r"))
            room = writer.create_room(preset="public_chat")
            reader.join(room)
            since = reader.sync(timeout_ms=0)["next_batch"]
            since = reader.sync(since=since, timeout_ms=0)["next_batch"]  # past its own marks
            parked_before = self.b.metric("atrium_http_parked") or 0
            bg = Background(reader.sync, since=since, timeout_ms=PARK_TIMEOUT_MS, http_timeout=60)
            wait_until(lambda: (self.b.metric("atrium_http_parked") or 0) > parked_before,
                       what="the sync parked on B")
            answer, latency = self.woken_by(bg, lambda: writer.ok(
                "PUT", f"{V3}/presence/{quote(writer.user_id)}/status",
                {"presence": "unavailable", "status_msg": "across"}))
            got = {e["sender"]: e["content"] for e in answer["presence"]["events"]}
            self.assertEqual(got.get(writer.user_id, {}).get("status_msg"), "across",
                             answer["presence"])
            return latency
        self.assert_wakes_promptly(scenario)

if __name__ == "__main__":
    unittest.main()
