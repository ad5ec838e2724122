"""Chaos: the server under load while its PostgreSQL is frozen or restarted.

Each test runs against a private cluster (pg_private.PrivatePostgres), never the run's
shared one; the faults are short (PostgreSQL frozen for the 10 s the issue names) so the
file stays well under a minute and a half. What must hold:

  - PostgreSQL frozen (SIGSTOP of the postmaster and its children, as a stalled disk or a
    partition looks): /health and /versions keep answering fast, requests that need the
    database fail within the bound with 503 and Retry-After (a download the media row cache
    still holds may be served instead, byte for byte), /health's body says the
    database is unavailable, the log says so once (not once per request), and everything
    recovers after SIGCONT without a restart of Atrium;
  - PostgreSQL restarted under a stream of uploads: every acknowledged upload is there
    afterwards, byte for byte, and uploads succeed again without a restart of Atrium;
  - one client opening many downloads and reading none holds only its share of the
    delivery slots, another client is served meanwhile, and a holder that reads nothing
    loses its slot after server.http.send_stall_timeout_s, not the idle timeout;
  - a gallery of 1,000 thumbnails at once, one connection each, under `ulimit -n 256`
    while /health is asked every 50 ms on the operational listener: every thumbnail is a
    valid image within 60 s (none refused: past the connection limit connections wait in
    the accept queue), and each /health answers within 200 ms.

The other chaos cases live beside the mechanisms they test: kill -9 during uploads and
renders in test_media_crash.py.
"""

import collections
import http.client
import json
import multiprocessing
import os
import socket
import statistics
import tempfile
import threading
import time
import unittest

from common import AtriumTestCase, wait_until
from media_support import (download_path, media_server, register, sha256,
                           solid_png, thumbnail_path, upload, webp_size)
from pg_private import PrivatePostgres

FREEZE_S = 10
# The bound on a request that needs the frozen database: the probe deadline
# (database.unresponsive_ms, 1000 by default), the 200 ms a connection may stay borrowed
# before the probe starts, the monitor's tick, and slack for a loaded machine (a download
# caught at the instant of the freeze took 3.06 s once on this 2-core machine).
DB_BOUND_S = 3.5
RESTART_READ_TRIES = 10  # reads of an acknowledged upload after the restart, 0.5 s apart
# Cheap requests while the outage is being detected may wait for a request thread held by
# the database (at most the bound); once it is detected they are served at once.
CHEAP_FAST_S = 0.3
DETECTED_AFTER_S = DB_BOUND_S


def _timed(fn, *args, **kwargs):
    started = time.monotonic()
    try:
        out = fn(*args, **kwargs)
    except OSError as e:
        out = e
    return started, time.monotonic() - started, out


class ChaosCase(AtriumTestCase):
    def private_pg(self):
        root = os.environ.get("ATRIUM_TEST_TMPDIR") or None
        if root:
            os.makedirs(root, exist_ok=True)
        pg = PrivatePostgres(tempfile.mkdtemp(prefix="chaos-pg-", dir=root))
        self.addCleanup(pg.close)  # runs after the server's close (LIFO): thawed first
        return pg

    def chaos_server(self, pg, media=None, **settings):
        conninfo = pg.conninfo("atrium_chaos")
        extra = {"database": {"conninfo": conninfo}, "server": {"http": {"request_threads": 4}}}
        for k, v in settings.items():
            extra.setdefault(k, {}).update(v)
        return media_server(self, media=media, settings=extra, database="atrium_chaos")


class FrozenPostgresTest(ChaosCase):
    def test_frozen_postgres_leaves_cheap_endpoints_fast_and_fails_the_rest_within_the_bound(self):
        pg = self.private_pg()
        srv = self.chaos_server(pg)
        _, token = register(srv)
        data = os.urandom(20_000)
        media_id = upload(srv, token, data)
        path = download_path(srv, media_id)
        self.assertEqual(srv.request("GET", path, token=token)[0], 200)

        cheap, needing, downloads, lock = [], [], [], threading.Lock()
        stop = threading.Event()

        def cheap_loop(route):
            while not stop.is_set():
                started, took, out = _timed(srv.request, "GET", route, timeout=20)
                with lock:
                    cheap.append((started, took, out))
                time.sleep(0.02)

        def needing_loop():  # every answer needs a query (no cache holds joined rooms)
            while not stop.is_set():
                started, took, out = _timed(srv.request, "GET", "/_matrix/client/v3/joined_rooms",
                                            token=token, timeout=20)
                with lock:
                    needing.append((started, took, out))

        def download_loop():  # the media row cache may serve it a while, else 503
            while not stop.is_set():
                started, took, out = _timed(srv.request, "GET", path, token=token, timeout=20)
                with lock:
                    downloads.append((started, took, out))

        threads = [threading.Thread(target=cheap_loop, args=(r,), daemon=True)
                   for r in ("/health", "/_matrix/client/versions")]
        threads += [threading.Thread(target=needing_loop, daemon=True) for _ in range(4)]
        threads += [threading.Thread(target=download_loop, daemon=True) for _ in range(2)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        health_during = None
        with pg.frozen():
            frozen_at = time.monotonic()
            time.sleep(FREEZE_S - 1)
            health_during = srv.json("GET", "/health", timeout=5)
            time.sleep(1)
        thawed_at = time.monotonic()
        # Everything recovers without a restart.
        wait_until(lambda: srv.request("GET", path, token=token, timeout=5)[0] == 200,
                   timeout=15, what="downloads served again after SIGCONT")
        wait_until(lambda: srv.json("GET", "/health")[1].get("database") == "ok",
                   timeout=10, what="/health says the database is back")
        stop.set()
        for t in threads:
            t.join(30)

        if os.environ.get("ATRIUM_CHAOS_REPORT"):  # every request slower than 0.5 s
            for name, rows in (("cheap", cheap), ("database", needing), ("download", downloads)):
                for s, t, o in rows:
                    if t > 0.5:
                        what = o[0] if isinstance(o, tuple) else type(o).__name__
                        print(f"slow {name} request at {s - frozen_at:+.3f} s: {t:.3f} s, {what}")
            print(f"thawed at {thawed_at - frozen_at:+.3f} s")
        self.assertEqual(health_during, (200, {"status": "ok", "database": "unavailable"}))
        for started, took, out in cheap:
            self.assertNotIsInstance(out, Exception, "a cheap request failed")
            self.assertEqual(out[0], 200)
            if frozen_at + DETECTED_AFTER_S <= started <= thawed_at:
                self.assertLess(took, CHEAP_FAST_S, "a cheap request was slow once the outage was known")
            self.assertLess(took, DB_BOUND_S, "a cheap request waited longer than the bound")
        during = [(s, t, o) for s, t, o in needing if frozen_at + 0.2 <= s <= thawed_at - DB_BOUND_S]
        self.assertGreater(len(during), 10, "database requests were made during the freeze")
        for started, took, out in during:
            self.assertNotIsInstance(out, Exception, "a database request got no answer")
            status, headers, body = out
            self.assertEqual(status, 503, body[:200])
            self.assertEqual(json.loads(body)["errcode"], "M_UNKNOWN")
            self.assertGreaterEqual(int(headers["Retry-After"]), 1)
            self.assertLess(took, DB_BOUND_S, "a database request waited past the bound")
        for started, took, out in downloads:
            self.assertNotIsInstance(out, Exception, "a download got no answer")
            status, headers, body = out
            if status == 200:
                self.assertEqual(body, data, "a download served from the row cache is intact")
            else:
                self.assertEqual((status, json.loads(body)["errcode"]), (503, "M_UNKNOWN"))
            self.assertLess(took, DB_BOUND_S, "a download waited past the bound")
        cheap_during = [t for s, t, _ in cheap if frozen_at <= s <= thawed_at]
        if os.environ.get("ATRIUM_CHAOS_REPORT"):
            print(f"\nfrozen {FREEZE_S}s: {len(cheap_during)} cheap requests, max "
                  f"{max(cheap_during):.3f}s median {statistics.median(cheap_during):.4f}s; "
                  f"{len(during)} database requests, max {max(t for _, t, _ in during):.3f}s")
        self.assertLess(statistics.median(cheap_during), 0.1)
        log = srv.log_text()
        self.assertEqual(log.count("PostgreSQL unavailable"), 1, "one line per outage")
        self.assertEqual(log.count("PostgreSQL answers again"), 1)
        self.assertGreaterEqual(srv.metric("atrium_db_refused_total"), len(during) // 2)


class RestartedPostgresTest(ChaosCase):
    def test_postgres_restart_under_uploads_loses_nothing_acknowledged_and_heals_without_a_restart(self):
        pg = self.private_pg()
        srv = self.chaos_server(pg)
        _, token = register(srv)
        acknowledged, refused, lock = {}, [], threading.Lock()
        stop = threading.Event()

        def uploader(k):
            n = 0
            while not stop.is_set():
                n += 1
                data = os.urandom(10_000 + (k * 7919 + n * 104729) % 200_000)
                try:
                    status, _, body = srv.request("POST", "/_matrix/media/v3/upload", body=data,
                                                  token=token, timeout=20)
                except OSError as e:
                    with lock:
                        refused.append(repr(e))
                    continue
                with lock:
                    if status == 200:
                        acknowledged[json.loads(body)["content_uri"].rsplit("/", 1)[1]] = sha256(data)
                    else:
                        refused.append(status)

        threads = [threading.Thread(target=uploader, args=(k,), daemon=True) for k in range(4)]
        for t in threads:
            t.start()
        wait_until(lambda: len(acknowledged) >= 10, timeout=30, what="uploads under way")
        pg.restart()
        with lock:
            before = len(acknowledged)
        wait_until(lambda: len(acknowledged) >= before + 10, timeout=30,
                   what="uploads acknowledged again after the restart, without restarting Atrium")
        stop.set()
        for t in threads:
            t.join(30)
        for status in refused:
            self.assertIn(status, (503,), "a refused upload is a clean 503")
        with lock:
            acked = dict(acknowledged)
        for media_id, digest in acked.items():
            # A 503 is a clean refusal (the database monitor may still doubt the restarted
            # cluster on a loaded machine), not a loss: asked again, the file must be there.
            for _ in range(RESTART_READ_TRIES):
                status, _, body = srv.request("GET", download_path(srv, media_id), token=token,
                                              timeout=20)
                if status != 503:
                    break
                time.sleep(0.5)
            self.assertEqual(status, 200, (media_id, body[:300]))
            self.assertEqual(sha256(body), digest, media_id)
        self.assertTrue(srv.running())


class SlotHolderTest(AtriumTestCase):
    """One client opens many downloads and reads none of them, another client downloads."""

    def test_a_client_holding_slots_without_reading_neither_starves_another_nor_keeps_them(self):
        srv = media_server(self, media={"delivery_slots": 16}, settings={"server": {"http": {
            "send_stall_timeout_s": 2, "connection_timeout_s": 60}}})
        _, token = register(srv)
        data = os.urandom(4 << 20)
        media_id = upload(srv, token, data, timeout=60)
        path = download_path(srv, media_id)
        hogs = []
        for _ in range(16):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
            sock.settimeout(30)
            sock.connect(("127.0.0.1", srv.port))
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n".encode())
            hogs.append(sock)
        self.addCleanup(lambda: [h.close() for h in hogs])
        # The hog holds its share of the line (25 % of 16), the rest of its requests wait.
        wait_until(lambda: srv.metric("atrium_media_delivering") == 4, what="the hog's share held")
        wait_until(lambda: srv.metric("atrium_line_waiting", {"line": "media.delivery"}) == 12,
                   what="the hog's other requests waiting")
        # Another client (another address) is served at once meanwhile.
        other = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        other.settimeout(30)
        other.bind(("127.0.0.2", 0))
        other.connect(("127.0.0.1", srv.port))
        started = time.monotonic()
        other.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                      f"Connection: close\r\n\r\n".encode())
        got = b""
        while True:
            chunk = other.recv(1 << 20)
            if not chunk:
                break
            got += chunk
        other.close()
        self.assertLess(time.monotonic() - started, 5, "the other client was not made to wait")
        head, body = got.split(b"\r\n\r\n", 1)
        self.assertTrue(head.startswith(b"HTTP/1.1 200"), head[:200])
        self.assertEqual(sha256(body), sha256(data))
        # A holder that reads nothing loses its slot after send_stall_timeout_s (2 s), long
        # before the 60 s idle timeout: its waiting requests move up.
        wait_until(lambda: srv.metric("atrium_line_waiting", {"line": "media.delivery"}) <= 8,
                   timeout=8, what="stalled holders cut and their slots passed on")
        self.assertTrue(srv.running())


def probe_health(port, stop, first, out):
    """GET /health every 50 ms on a fresh connection until stop is set; then puts the list
    of (started, seconds taken, status or the error's repr) on out. A process's target."""
    probes = []
    while not stop.is_set():
        started = time.monotonic()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            conn.request("GET", "/health")
            resp = conn.getresponse()
            resp.read()
            status = resp.status
        except (OSError, http.client.HTTPException) as e:
            status = repr(e)
        finally:
            conn.close()
        probes.append((started, time.monotonic() - started, status))
        first.set()
        time.sleep(0.05)
    out.put(probes)


STORM_REQUESTS = 1000
STORM_BOUND_S = 60  # every thumbnail of the storm answered within this long
STORM_CLIENT_NOFILE = 4096  # the storm's own process: 1,000 sockets at once
STORM_SIZES = ((32, 32), (96, 96))


def _http_body(head, rest):
    """The body of an HTTP/1.1 answer read to its end (Connection: close), chunked or not."""
    if b"transfer-encoding: chunked" not in head.lower():
        return rest
    body = b""
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        body, rest = body + rest[:size], rest[size + 2:]
    return body


def thumbnail_storm(port, token, requests, out):
    """A process's target: one connection per (path, width, height), all opened at once
    (each one's GET sent at once too), each answer read to its end. Puts on out a list of
    (seconds from the storm's start, status, verdict): verdict is "ok" for a WebP of the
    asked size, else what was wrong. The process raises its own descriptor limit, so the
    test's process keeps its own."""
    import asyncio
    import resource
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = STORM_CLIENT_NOFILE if hard == resource.RLIM_INFINITY else min(STORM_CLIENT_NOFILE, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))

    async def one(started, path, size):
        writer = None
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write((f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                          "Connection: close\r\n\r\n").encode())
            await writer.drain()
            data = await reader.read()
        except OSError as e:
            return time.monotonic() - started, None, repr(e)
        finally:
            if writer:
                writer.close()
        took = time.monotonic() - started
        head, _, rest = data.partition(b"\r\n\r\n")
        try:
            status = int(head.split(b" ", 2)[1])
        except (IndexError, ValueError):
            return took, None, f"no HTTP answer: {data[:80]!r}"
        if status != 200:
            return took, status, rest[:200].decode("utf-8", "replace")
        try:
            got = webp_size(_http_body(head, rest))
        except (AssertionError, ValueError) as e:
            return took, status, str(e)
        return took, status, "ok" if got == size else f"a {got} image for {size}"

    async def storm():
        started = time.monotonic()
        tasks = [asyncio.wait_for(one(started, path, size), STORM_BOUND_S + 30)
                 for path, size in requests]
        results = await asyncio.gather(*tasks, return_exceptions=True)
        return [r if isinstance(r, tuple) else (time.monotonic() - started, None, repr(r))
                for r in results]

    out.put(asyncio.run(storm()))


class GalleryUnderLowDescriptorLimitTest(AtriumTestCase):
    """A gallery of 1,000 thumbnails at once, one connection each, under `ulimit -n 256`
    (far past the connection limit the descriptors allow), while /health is asked every
    50 ms. Past the limit the connections wait in the kernel's accept queue, costing the
    server no descriptor, and are served as slots free: none is refused (Element does not
    retry an image). /health is asked where a load balancer asks it, on the operational
    listener (server.ops), whose connections are its own
    (docs/adr/0025-queue-past-the-connection-limit.md)."""

    def test_a_thousand_thumbnails_under_ulimit_256_all_arrive_and_health_stays_fast(self):
        srv = media_server(self, nofile=256, settings={"server": {"ops": {"enabled": True,
                                                                         "port": 0}}})
        ops_port = int(srv.wait_for_log(r"operational endpoints on http://[^ ]+:(\d+)").group(1))
        # The operational listener serves /health and /metrics, nothing else.
        for path, status in (("/health", 200), ("/metrics", 200),
                             ("/_matrix/client/versions", 404)):
            conn = http.client.HTTPConnection("127.0.0.1", ops_port, timeout=10)
            conn.request("GET", path)
            self.assertEqual(conn.getresponse().status, status, path)
            conn.close()
        _, token = register(srv)
        ids = [upload(srv, token, solid_png(100 + i % 50, 100 + i // 50, i), "image/png")
               for i in range(125)]
        requests = []  # each image in each size, four times over
        for i in range(STORM_REQUESTS):
            size = STORM_SIZES[(i // len(ids)) % len(STORM_SIZES)]
            requests.append((thumbnail_path(srv, ids[i % len(ids)], *size, "crop"), size))
        # Both the prober and the storm are processes of their own: the prober's timings
        # would otherwise include waiting for this one's GIL, and the storm needs more
        # descriptors than this process may have.
        ctx = multiprocessing.get_context("spawn")
        stop, first, probes_out = ctx.Event(), ctx.Event(), ctx.Queue()
        prober = ctx.Process(target=probe_health, args=(ops_port, stop, first, probes_out),
                             daemon=True)
        prober.start()
        self.addCleanup(prober.kill)
        self.assertTrue(first.wait(30), "the first /health probe")
        storm_out = ctx.Queue()
        stormer = ctx.Process(target=thumbnail_storm,
                              args=(srv.port, token, requests, storm_out), daemon=True)
        storm_started = time.monotonic()
        stormer.start()
        self.addCleanup(stormer.kill)
        try:
            results = storm_out.get(timeout=STORM_BOUND_S + 60)
        finally:
            storm_ended = time.monotonic()
            stop.set()
        probes = probes_out.get(timeout=30)
        prober.join(15)
        stormer.join(15)
        limit = srv.metric("atrium_http_max_connections")
        if os.environ.get("ATRIUM_CHAOS_REPORT"):
            print(f"\ngallery: {len(results)} thumbnails, slowest {max(r[0] for r in results):.2f}s,"
                  f" over {int(limit)} connections; /health {len(probes)} probes, max "
                  f"{max(t for _, t, _ in probes):.3f}s")
        self.assertEqual(len(results), STORM_REQUESTS)
        wrong = [(round(took, 2), status, verdict) for took, status, verdict in results
                 if verdict != "ok" or took > STORM_BOUND_S]
        by_status = collections.Counter(status for _, status, _ in wrong)
        self.assertEqual(wrong[:10], [], f"{len(wrong)} of {STORM_REQUESTS} thumbnails were "
                         f"not a valid image within {STORM_BOUND_S} s (by status: {by_status})")
        # The storm is far past the limit: most of it waited, and the probes ran meanwhile.
        self.assertLess(limit, STORM_REQUESTS / 4)
        during = [p for p in probes if storm_started <= p[0] <= storm_ended]
        self.assertGreaterEqual(len(during), 3)
        slow = [(round(t, 3), s) for _, t, s in probes if t >= 0.2 or s != 200]
        self.assertEqual(slow, [], "every /health answered 200 within 200 ms")
        self.assertTrue(srv.running())


if __name__ == "__main__":
    unittest.main()
