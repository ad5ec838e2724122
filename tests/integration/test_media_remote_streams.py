"""Remote media, continued (test_media_remote.py has the fake origin and the basics):
waiters that follow a remote file's bytes as they arrive, origins that misbehave (a slow
drip, an oversize chunked body, lying Content-Lengths, redirects, 429), clients that
leave, a copy evicted under its reader, and handoffs the fetch pool cannot run.
"""

import http.client
import json
import os
import subprocess
import threading
import time
import unittest

import harness
from media_support import get_many, register
from test_media_remote import A_IP, ORIGIN2_IP, RemoteMediaCase, sha


class TableLock:
    """A PostgreSQL session holding `LOCK TABLE <table> IN SHARE MODE` until release():
    readers go on, writers wait - so a fetch-pool worker storing a fetch blocks on it."""

    def __init__(self, database, table):
        self.proc = subprocess.Popen(
            [harness.psql_bin(), "-X", "-q", "-At", "-d", harness.conninfo_for(database)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.proc.stdin.write(f"BEGIN;\nLOCK TABLE {table} IN SHARE MODE;\n\\echo locked\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "locked"

    def release(self):
        if self.proc.poll() is None:
            self.proc.communicate("COMMIT;\n", timeout=30)


def follow(srv, path, token, timeout=60):
    """GET path on a fresh connection, reading the body as it comes: (status, headers,
    monotonic time of the first body byte or None, the body, whether it ended properly)."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        resp = conn.getresponse()
        first, chunks, complete = None, [], True
        try:
            while True:
                piece = resp.read1(1 << 16)
                if not piece:
                    break
                if first is None:
                    first = time.monotonic()
                chunks.append(piece)
        except http.client.IncompleteRead as e:
            chunks.append(e.partial)
            complete = False
        except (OSError, http.client.HTTPException):
            complete = False
        return resp.status, resp.headers, first, b"".join(chunks), complete
    finally:
        conn.close()


class StreamingToWaitersTest(RemoteMediaCase):
    """Waiters of a remote original follow its bytes as they arrive (respond_stream_wait).
    Its tests share one server (start_fed(shared=True), a deadline long enough for the
    20 MB drip), each with an origin of its own, counting from the values before it."""
    SLOW = {"remote_fetch_timeout_ms": 120000}

    def test_ten_waiters_of_a_slow_20_mb_file_get_bytes_before_it_lands_and_identical_bodies(self):
        o = self.origin()
        data = os.urandom(20 * 1024 * 1024)
        o.files["big"] = ("drip", data, 256 * 1024, 0.05, None)
        a = self.start_fed(A_IP, media=self.SLOW, shared=True)
        _, token = register(a)
        remote = {"flights": "media.remote"}
        streamed0 = self.count(a, "atrium_media_remote_streamed_total")
        early0 = self.count(a, "atrium_flights_early_total", remote)
        path = self.remote_path(o.server_name, "big", extra="?timeout_ms=60000")
        results = [None] * 10

        def get(i):
            results[i] = follow(a, path, token, timeout=120)
        threads = [threading.Thread(target=get, args=(i,)) for i in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(150)
        landed = o.finished["big"]
        for status, headers, first, body, complete in results:
            self.assertEqual(status, 200, body[:200])
            self.assertTrue(complete, "the body ended properly")
            self.assertIsNotNone(first)
            self.assertLess(first, landed, "the first bytes came while the fetch ran")
            self.assertEqual(headers.get("Transfer-Encoding"), "chunked")
            self.assertEqual(headers["Content-Type"], "application/octet-stream")
            self.assertEqual(len(body), len(data))
            self.assertEqual(sha(body), sha(data))
        self.assertEqual(o.media_hits("big"), 1)
        self.assertEqual(a.metric("atrium_media_remote_streamed_total") - streamed0, 10)
        # Each follower was handed the fetch's landing as its flight's early result.
        self.assertEqual(a.metric("atrium_flights_early_total", remote) - early0, 10)
        self.assertEqual(self.settled(a, "atrium_http_streams_waiting"), 0)
        self.assertEqual(self.settled(a, "atrium_media_fetch_budget_in_flight"), 0)
        self.assertEqual(a.metric("atrium_flights_in_flight", remote), 0)
        # Stored whole: the next request is a cache hit with its ETag, no second fetch.
        status, headers, again = a.request("GET", path, token=token, timeout=60)
        self.assertEqual((status, sha(again)), (200, sha(data)))
        self.assertEqual(headers["ETag"], f'"{sha(data)}"')
        self.assertEqual(o.media_hits("big"), 1)

    def test_a_fetch_cut_off_midway_truncates_every_follower_and_caches_nothing(self):
        o = self.origin()
        data = os.urandom(4 * 1024 * 1024)
        o.files["cut"] = ("drip", data, 128 * 1024, 0.05, 2 * 1024 * 1024)
        a = self.start_fed(A_IP, media=self.SLOW, shared=True)
        _, token = register(a)
        before = self.remote_files(a)
        path = self.remote_path(o.server_name, "cut")
        results = [None] * 4

        def get(i):
            results[i] = follow(a, path, token)
        threads = [threading.Thread(target=get, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        for status, headers, first, body, complete in results:
            self.assertEqual(status, 200)
            self.assertIsNotNone(first)
            self.assertFalse(complete, "a client can tell the body is truncated")
            self.assertLess(len(body), len(data))
            self.assertEqual(body, data[:len(body)])
        self.assertEqual(self.remote_files(a) - before, set())
        self.assertEqual(self.remote_rows(a, o.server_name), [["0"]])
        # Remembered as a failure of the origin: answered with its exact code now.
        self.assert_failure(a.request("GET", path, token=token, timeout=30), 502, "M_UNKNOWN")
        self.assertEqual(o.media_hits("cut"), 1)
        self.assertEqual(self.settled(a, "atrium_http_streams_waiting"), 0)

    def test_a_range_request_waits_for_the_whole_file_and_gets_its_range(self):
        o = self.origin()
        data = os.urandom(1024 * 1024)
        o.files["r"] = ("drip", data, 128 * 1024, 0.05, None)
        a = self.start_fed(A_IP, media=self.SLOW, shared=True)
        _, token = register(a)
        streamed0 = self.count(a, "atrium_media_remote_streamed_total")
        status, headers, body = a.request("GET", self.remote_path(o.server_name, "r"),
                                          headers={"Range": "bytes=100-199"}, token=token,
                                          timeout=60)
        self.assertEqual((status, body), (206, data[100:200]))
        self.assertEqual(self.count(a, "atrium_media_remote_streamed_total") - streamed0, 0)


class OriginsThatMisbehaveTest(RemoteMediaCase):
    """Its tests on the default settings share one server (start_fed(shared=True))."""

    def test_a_slow_drip_ends_at_the_deadline_with_504_and_gives_its_slots_back(self):
        o = self.origin()
        o.files["drip"] = ("drip", os.urandom(10000), 1, 1.0, None)  # one byte a second
        a = self.start_fed(A_IP, media={"remote_fetch_timeout_ms": 4000})
        _, token = register(a)
        started = time.monotonic()
        r = a.request("GET", self.remote_path(o.server_name, "drip", extra="?timeout_ms=2000"),
                      token=token, timeout=30)
        self.assert_failure(r, 504, "M_UNKNOWN")
        self.assertLess(time.monotonic() - started, 3.5)
        self.assertEqual(self.settled(a, "atrium_media_fetch_budget_in_flight"), 0)
        self.assertEqual(a.metric("atrium_media_delivering"), 0)
        # The transfer itself ends at remote_fetch_timeout_ms: nothing is left running.
        self.assertEqual(self.settled(a, "atrium_media_remote_fetches_running", timeout=6), 0)
        self.assertEqual(harness.psql("SELECT count(*) FROM media_remote", a.database), [["0"]])

    def test_an_oversize_chunked_body_gives_502_too_large_and_caches_nothing(self):
        o = self.origin()
        o.files["big"] = ("chunked", os.urandom(200000), "application/octet-stream")
        a = self.start_fed(A_IP, media={"max_upload_size": 50000})
        _, token = register(a)
        path = self.remote_path(o.server_name, "big")
        self.assert_failure(a.request("GET", path, token=token, timeout=30), 502, "M_TOO_LARGE")
        self.assertEqual(a.metric("atrium_media_remote_fetches_total", {"outcome": "too_large"}), 1)
        remote_files = [f for root, _, fs in os.walk(os.path.join(a.store, "remote")) for f in fs]
        self.assertEqual(remote_files, [])
        self.assertEqual(harness.psql("SELECT count(*) FROM media_remote", a.database), [["0"]])
        # Remembered: the same answer without asking the origin again.
        self.assert_failure(a.request("GET", path, token=token, timeout=30), 502, "M_TOO_LARGE")
        self.assertEqual(o.media_hits("big"), 1)
        # Within the limit, the same chunked answer is stored.
        o.files["small"] = ("chunked", os.urandom(40000), "application/octet-stream")
        status, _, body = a.request("GET", self.remote_path(o.server_name, "small"),
                                    token=token, timeout=30)
        self.assertEqual((status, sha(body)), (200, sha(o.files["small"][1])))

    def test_a_content_length_that_lies_either_way_gives_502_and_caches_nothing(self):
        o = self.origin()
        o.files["more"] = ("truncated", os.urandom(30000))   # promises more than it sends
        o.files["less"] = ("short_length", os.urandom(30000))  # sends more than it promised
        a = self.start_fed(A_IP, shared=True)
        _, token = register(a)
        before = self.remote_files(a)
        for name in ("more", "less"):
            self.assert_failure(a.request("GET", self.remote_path(o.server_name, name),
                                          token=token, timeout=30), 502, "M_UNKNOWN")
        self.assertEqual(self.remote_files(a) - before, set())
        self.assertEqual(self.remote_rows(a, o.server_name), [["0"]])

    def test_a_legacy_redirect_is_followed_once_and_one_to_a_blacklisted_address_refused(self):
        o = self.origin()
        cdn = self.origin(ORIGIN2_IP)
        data = os.urandom(30000)
        cdn.files["blob"] = ("raw", data, "image/png")
        o.files["moved"] = ("redirect", f"https://{cdn.server_name}/cdn/blob")
        o.files["evil"] = ("redirect", "https://10.255.255.1:8443/cdn/x")
        o.files["again"] = ("redirect", f"https://{o.server_name}/_matrix/media/v3/download/"
                                        f"{o.server_name}/again")
        a = self.start_fed(A_IP, shared=True)
        _, token = register(a)
        status, headers, body = a.request("GET", self.remote_path(o.server_name, "moved"),
                                          token=token, timeout=30)
        self.assertEqual((status, sha(body)), (200, sha(data)))
        self.assertEqual(headers["Content-Type"], "image/png")
        self.assertEqual(cdn.hits.get("/cdn/blob"), 1)
        self.assert_failure(a.request("GET", self.remote_path(o.server_name, "evil"), token=token,
                                      timeout=30), 502, "M_UNKNOWN")
        self.assertIn("10.255.255.1", a.log_text())
        # Once only: a redirect answering another redirect is a failure, not a loop.
        self.assert_failure(a.request("GET", self.remote_path(o.server_name, "again"),
                                      token=token, timeout=30), 502, "M_UNKNOWN")
        self.assertEqual(o.hits.get(f"/_matrix/media/v3/download/{o.server_name}/again"), 2)

    def test_stored_fetches_are_counted_by_the_answer_that_delivered_them(self):
        o = self.origin()
        cdn = self.origin(ORIGIN2_IP)
        cdn.files["blob"] = ("raw", b"from the cdn", "text/plain")
        o.files["fed"] = ("ok", b"federation bytes", "text/plain")
        o.files["old"] = ("unrecognized", b"legacy bytes", "text/plain")
        o.files["moved"] = ("redirect", f"https://{cdn.server_name}/cdn/blob")
        o.files["part"] = ("location", f"https://{cdn.server_name}/cdn/blob")
        a = self.start_fed(A_IP, shared=True)
        _, token = register(a)
        vias = ("federation", "legacy", "location")
        via0 = {k: self.count(a, "atrium_media_remote_fetched_total", {"via": k}) for k in vias}
        ok0 = self.count(a, "atrium_media_remote_fetches_total", {"outcome": "ok"})
        for name in ("fed", "old", "moved", "part"):
            self.assertEqual(a.request("GET", self.remote_path(o.server_name, name), token=token,
                                       timeout=30)[0], 200, name)
        via = {k: self.count(a, "atrium_media_remote_fetched_total", {"via": k}) - via0[k]
               for k in vias}
        self.assertEqual(via, {"federation": 1, "legacy": 1, "location": 2})
        self.assertEqual(a.metric("atrium_media_remote_fetches_total", {"outcome": "ok"}) - ok0, 4)


class ClientsAndCacheTest(RemoteMediaCase):
    def test_a_waiter_that_leaves_does_not_stop_the_fetch_others_wait_for_and_gauges_return_to_0(self):
        o = self.origin()
        data = os.urandom(30000)
        o.files["shared"] = ("ok", data, "application/octet-stream")
        o.delay_s = 1.0
        a = self.start_fed(A_IP)
        _, token = register(a)
        path = self.remote_path(o.server_name, "shared")
        socks = [harness.raw_connect(a.port) for _ in range(3)]
        for sock in socks:
            sock.sendall((f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}"
                          "\r\n\r\n").encode())
        stays = [None]
        t = threading.Thread(target=lambda: stays.__setitem__(
            0, a.request("GET", path, token=token, timeout=30)))
        t.start()
        time.sleep(0.5)  # all four joined the one fetch
        for sock in socks:
            sock.close()
        t.join(30)
        status, _, body = stays[0]
        self.assertEqual((status, sha(body)), (200, sha(data)))
        self.assertEqual(o.media_hits("shared"), 1)
        for gauge in ("atrium_media_fetch_budget_in_flight", "atrium_media_delivering",
                      "atrium_media_remote_fetches_running", "atrium_media_fetch_line_waiting",
                      "atrium_http_parked", "atrium_http_handed_off", "atrium_http_streams_waiting"):
            self.assertEqual(self.settled(a, gauge), 0, gauge)

    def test_a_copy_evicted_while_a_slow_client_reads_it_is_not_torn(self):
        o = self.origin()
        size = 8 * 1024 * 1024
        for name in ("e1", "e2", "e3"):
            o.files[name] = ("ok", os.urandom(size), "application/octet-stream")
        a = self.start_fed(A_IP, media={"remote_cache_max_bytes": 2 * size + size // 2})
        _, token = register(a)

        def get(name):
            status, _, body = a.request("GET", self.remote_path(o.server_name, name),
                                        token=token, timeout=60)
            self.assertEqual((status, sha(body)), (200, sha(o.files[name][1])))
        get("e1")
        # A slow reader of e1 (small window): most of the copy is still to be sent.
        sock = harness.raw_connect(a.port, rcvbuf=4096, timeout=30)
        sock.sendall((f"GET {self.remote_path(o.server_name, 'e1')} HTTP/1.1\r\nHost: x\r\n"
                      f"Authorization: Bearer {token}\r\nConnection: close\r\n\r\n").encode())
        status, _, first = harness.read_head(sock)
        self.assertEqual(status, 200)
        time.sleep(0.2)
        get("e2")
        get("e3")  # past the bound: e1, the least recently used, is evicted under the reader
        self.assertGreaterEqual(a.metric("atrium_media_remote_cache_evictions_total"), 1)
        rows = [r[0] for r in harness.psql("SELECT media_id FROM media_remote", a.database)]
        self.assertNotIn("e1", rows)
        chunks = [first]
        while True:
            piece = sock.recv(65536)
            if not piece:
                break
            chunks.append(piece)
        sock.close()
        self.assertEqual(sha(b"".join(chunks)), sha(o.files["e1"][1]), "the reader saw the whole copy")


class OriginRateLimitTest(RemoteMediaCase):
    def test_an_origin_answering_429_is_asked_again_and_the_client_never_sees_the_429(self):
        o = self.origin()
        o.files["soon"] = ("busy", 3, b"worth the wait")
        o.files["never"] = ("busy", 10 ** 6, b"never sent")
        a = self.start_fed(A_IP, media={"remote_fetch_timeout_ms": 2500})
        _, token = register(a)
        status, _, body = a.request("GET", self.remote_path(o.server_name, "soon"), token=token,
                                    timeout=30)
        self.assertEqual((status, body), (200, b"worth the wait"))
        self.assertEqual(o.media_hits("soon"), 4)
        self.assertEqual(a.metric("atrium_media_remote_fetch_retried_total"), 3)
        # One that stays busy past the fetch's deadline: 502, never 429, and not remembered.
        r = a.request("GET", self.remote_path(o.server_name, "never"), token=token, timeout=30)
        self.assert_failure(r, 502, "M_UNKNOWN")
        self.assertGreater(o.media_hits("never"), 3)
        asked = o.media_hits("never")
        r = a.request("GET", self.remote_path(o.server_name, "never", extra="?timeout_ms=300"),
                      token=token, timeout=30)
        self.assertNotEqual(r[0], 429)
        self.assertGreater(o.media_hits("never"), asked, "a busy origin is not negatively cached")


class FetchPoolHandoffTest(RemoteMediaCase):
    """A handoff queued on the fetch pool (its one worker held: storing another fetch waits
    on a table lock) whose client left, or that the server's stop overtakes, never fetches."""

    def start_held(self):
        o = self.origin()
        o.files["first"] = ("ok", os.urandom(5000), "application/octet-stream")
        o.files["second"] = ("ok", os.urandom(5000), "application/octet-stream")
        a = self.start_fed(A_IP, media={"media_fetch_threads": 1})
        _, token = register(a)
        lock = TableLock(a.database, "media_remote")
        self.addCleanup(lock.release)
        first = [None]

        def get_first():
            try:
                first[0] = a.request("GET", self.remote_path(o.server_name, "first"),
                                     token=token, timeout=60)
            except (OSError, http.client.HTTPException) as e:
                first[0] = (None, None, repr(e).encode())
        t = threading.Thread(target=get_first, daemon=True)
        t.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (
                o.media_hits("first") == 1 and
                a.metric("atrium_pool_busy", {"pool": "media.fetch"}) == 1):
            time.sleep(0.05)
        self.assertEqual(a.metric("atrium_pool_busy", {"pool": "media.fetch"}), 1,
                         "the one fetch worker is storing the first file")
        return o, a, token, lock, t, first

    def wait_queued(self, a):
        deadline = time.monotonic() + 10
        while (a.metric("atrium_pool_queued", {"pool": "media.fetch"}) != 1 and
               time.monotonic() < deadline):
            time.sleep(0.05)
        self.assertEqual(a.metric("atrium_pool_queued", {"pool": "media.fetch"}), 1)

    def test_a_handoff_whose_client_left_is_dropped_without_fetching(self):
        o, a, token, lock, t, first = self.start_held()
        sock = harness.raw_connect(a.port)
        sock.sendall((f"GET {self.remote_path(o.server_name, 'second')} HTTP/1.1\r\nHost: x\r\n"
                      f"Authorization: Bearer {token}\r\n\r\n").encode())
        self.wait_queued(a)
        sock.close()  # gone while its handoff waits for the worker
        lock.release()
        t.join(30)
        self.assertEqual(first[0][0], 200, first[0][2][:200])
        deadline = time.monotonic() + 10
        while (a.metric("atrium_http_handoff_client_gone_total") != 1 and
               time.monotonic() < deadline):
            time.sleep(0.05)
        self.assertEqual(a.metric("atrium_http_handoff_client_gone_total"), 1)
        self.assertEqual(o.media_hits("second"), 0, "checked before fetching")
        self.assertEqual(self.settled(a, "atrium_media_fetch_budget_in_flight"), 0)
        self.assertEqual(self.settled(a, "atrium_media_delivering"), 0)

    def test_a_handoff_the_stop_overtakes_answers_503_without_fetching(self):
        o, a, token, lock, t, first = self.start_held()
        second = [None]

        def get_second():
            second[0] = a.request("GET", self.remote_path(o.server_name, "second"),
                                  token=token, timeout=60)
        t2 = threading.Thread(target=get_second, daemon=True)
        t2.start()
        self.wait_queued(a)
        stopper = threading.Thread(target=a.stop, daemon=True)
        stopper.start()
        t2.join(30)
        status, headers, body = second[0]
        self.assertEqual(status, 503, body[:200])
        self.assertEqual(json.loads(body)["errcode"], "M_UNKNOWN")
        self.assertEqual(headers.get("Cache-Control"), "no-store")
        lock.release()  # the worker may finish now, and the server exit
        stopper.join(60)
        self.assertEqual(a.returncode, 0)
        self.assertEqual(o.media_hits("second"), 0, "never fetched")


class FetchTableFullTest(RemoteMediaCase):
    """The table of fetches under way (the host's single flight, media.remote) holds 4 per
    fetch budget slot (plugins/media/remote.c): held full by an origin that sends half of
    each file and then waits."""

    def test_a_full_fetch_table_refuses_a_new_miss_at_once_and_drains_when_the_origin_answers(self):
        o = self.origin()
        data = {name: os.urandom(2000) for name in [f"t{i}" for i in range(7)] + ["w", "x"]}
        for name, body in data.items():
            o.files[name] = ("slow", body, 30)  # the rest once o.release is set
        o.files["x"] = ("ok", data["x"], "application/octet-stream")
        o.files["c"] = ("ok", b"cached before", "text/plain")
        a = self.start_fed(A_IP, media={"media_fetch_max_in_flight": 2,
                                        "remote_fetch_max_per_origin": 8})
        _, token = register(a)
        remote = {"flights": "media.remote"}
        status, _, body = a.request("GET", self.remote_path(o.server_name, "c"), token=token,
                                    timeout=30)
        self.assertEqual((status, body), (200, b"cached before"))
        self.assertEqual(a.metric("atrium_flights_limit", remote), 8)
        # Seven fetches outlive their requests (answered 504 at their deadline), two
        # requests at a time (the budget's two slots).
        results = get_many(a, [self.remote_path(o.server_name, f"t{i}", extra="?timeout_ms=500")
                               for i in range(7)], token, 2)
        for r in results:
            self.assert_failure(r, 504, "M_UNKNOWN")
        self.assertEqual(self.settled(a, "atrium_media_fetch_budget_in_flight"), 0)
        self.assertEqual(a.metric("atrium_flights_in_flight", remote), 7)
        # The eighth is waited for, holding one slot: the table is full.
        waiting = {}

        def get(name):
            waiting[name] = a.request("GET", self.remote_path(o.server_name, name,
                                                              extra="?timeout_ms=30000"),
                                      token=token, timeout=60)
        threads = [threading.Thread(target=get, args=("w",), daemon=True)]
        threads[0].start()
        self.assertEqual(self.settled_metric(a, "atrium_flights_in_flight", remote, 8), 8)
        # One more file: refused at once (the second slot was free), never asked of the
        # origin, counted.
        t0 = time.monotonic()
        status, headers, body = a.request("GET", self.remote_path(o.server_name, "x"),
                                          token=token, timeout=30)
        self.assertLess(time.monotonic() - t0, 1.0)
        self.assert_failure((status, headers, body), 503, "M_UNKNOWN")
        self.assertIn("error", json.loads(body))
        self.assertEqual(headers.get("Retry-After"), "1")
        self.assertEqual(o.media_hits("x"), 0)
        self.assertEqual(a.metric("atrium_flights_refused_total", remote), 1)
        self.assertEqual(a.metric("atrium_flights_in_flight", remote), 8)
        # Meanwhile a cached copy and /versions are answered at once ...
        t0 = time.monotonic()
        status, _, body = a.request("GET", self.remote_path(o.server_name, "c"), token=token,
                                    timeout=5)
        self.assertEqual((status, body), (200, b"cached before"))
        self.assertEqual(a.json("GET", "/_matrix/client/versions")[0], 200)
        self.assertLess(time.monotonic() - t0, 1.0)
        # ... and a file whose fetch is under way is joined, not refused.
        threads.append(threading.Thread(target=get, args=("t0",), daemon=True))
        threads[1].start()
        self.assertEqual(self.settled_metric(a, "atrium_flights_waiters", remote, 1), 1)
        self.assertEqual(a.metric("atrium_flights_refused_total", remote), 1)
        # The origin answers: both waiters get their files, the table drains.
        o.release.set()
        for t in threads:
            t.join(30)
        for name in ("w", "t0"):
            status, _, body = waiting[name]
            self.assertEqual((status, sha(body)), (200, sha(data[name])), name)
        self.assertEqual(self.settled_metric(a, "atrium_flights_in_flight", remote, 0), 0)
        self.assertEqual(a.metric("atrium_flights_waiters", remote), 0)
        self.assertEqual(self.settled(a, "atrium_media_fetch_budget_in_flight"), 0)
        # The refusal was not remembered; the fetches that outlived their requests stored
        # their files.
        status, _, body = a.request("GET", self.remote_path(o.server_name, "x"), token=token,
                                    timeout=30)
        self.assertEqual((status, sha(body)), (200, sha(data["x"])))
        status, _, body = a.request("GET", self.remote_path(o.server_name, "t6"), token=token,
                                    timeout=30)
        self.assertEqual((status, sha(body)), (200, sha(data["t6"])))
        self.assertEqual(o.media_hits("t6"), 1)

    def settled_metric(self, srv, name, labels, want, timeout=5.0):
        """A metric's value once it reached `want`, or its last value after `timeout` s."""
        deadline = time.monotonic() + timeout
        value = srv.metric(name, labels)
        while value != want and time.monotonic() < deadline:
            time.sleep(0.05)
            value = srv.metric(name, labels)
        return value


if __name__ == "__main__":
    unittest.main()
