"""storage: s3, a download whose original is not in the local folder streams from the store
(plugins/media/s3_stream.c, docs/adr/0031-streaming-media-to-and-from-the-object-store.md):
the client has its first bytes while the store's GET is still under way, many clients of
one cold object cause one GET, a Range on a miss is a ranged GET that caches nothing, and a
store that dies mid-download cuts the client's body and caches nothing; one answering
garbage gets 503 (no-store) and caches nothing; one frozen under load gives every cold
download a 503 within s3_timeout_ms while /versions and cached media answer at once. Store requests go on
kept connections, at most s3_max_concurrent, and come right when the store closes them
(idle, restarted, or as a request goes out).

Against a real radosgw (tests/lib/rgw.sh, through test_media_s3's Gateway), seen through a
relay on loopback that passes every byte untouched until told to hold a GET's answer after
its first bytes (so the test knows the GET is still under way while the client reads) or
to cut it (the gateway gone mid-answer).
"""

import hashlib
import http.client
import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest

import harness
import test_media_s3 as s3t
from common import wait_until
from media_support import download_path, media_server, original_file, register, upload

PART = 5 << 20  # S3's smallest part: uploads above it stream in parts
HOLD_AFTER = 512 * 1024  # bytes of a held answer let through (well past the held tail)
OBJECT_BYTES = 3 * 1024 * 1024
TAIL_HOLD = 64 * 1024  # the last bytes held until the SHA-256 is checked (s3_stream.c)


class Relay:
    """A TCP relay to the gateway. hold(n): an answer (gateway to Atrium) passes n bytes,
    then waits until release(); cut(): every connection is closed at once; drop_reused():
    the next request that comes on a connection which already carried one is not passed on,
    its connection closed instead (a store closing a kept connection as a request goes out);
    garble(data): every answer is replaced by data, then its connection closed (a store
    answering garbage), until garble(None). Counts the connections it accepted (accepted)
    and the most open at once (most_open)."""

    def __init__(self, target_port):
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.limit = None
        self.released = threading.Event()
        self.held = threading.Event()  # an answer is being held now
        self.conns = []
        self.accepted = self.open = self.most_open = self.dropped = 0
        self.drop = False
        self.garbage = None
        threading.Thread(target=self._accept, daemon=True).start()

    def hold(self, n):
        self.released.clear()
        self.held.clear()
        self.limit = n

    def release(self):
        self.limit = None
        self.released.set()

    def cut(self):
        with self.lock:
            conns, self.conns = self.conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        self.release()

    def drop_reused(self):
        self.drop = True

    def garble(self, data):
        self.garbage = data

    def close(self):
        self.cut()
        self.listener.close()

    def _accept(self):
        while True:
            try:
                down, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.accepted += 1
            try:
                up = socket.create_connection(self.target, timeout=10)
            except OSError:
                down.close()
                continue
            with self.lock:
                self.conns += [down, up]
                self.open += 1
                self.most_open = max(self.most_open, self.open)
            conn = {"requests": 0, "answered": False, "ends": 2}
            for args in ((down, up, False, conn), (up, down, True, conn)):
                threading.Thread(target=self._pump, args=args, daemon=True).start()

    def _pump(self, src, dst, answers, conn):
        sent, request = 0, 0
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if not answers:  # a request, or more of one
                    if self.drop and conn["answered"]:
                        self.drop = False
                        self.dropped += 1
                        break
                    conn["requests"] += 1
                elif request != conn["requests"]:  # a new answer: hold() counts from here
                    request, sent = conn["requests"], 0
                    conn["answered"] = True
                if answers and self.garbage is not None:
                    dst.sendall(self.garbage)
                    break
                limit = self.limit if answers else None
                if limit is not None and sent + len(data) > limit:
                    take = max(0, limit - sent)
                    dst.sendall(data[:take])
                    sent += take
                    self.held.set()
                    self.released.wait(30)
                    data = data[take:]
                dst.sendall(data)
                sent += len(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        with self.lock:
            conn["ends"] -= 1
            if conn["ends"] == 0:
                self.open -= 1


GATEWAY = None


def setUpModule():
    global GATEWAY
    why = s3t.ceph_available()
    if why:
        raise unittest.SkipTest(why)
    GATEWAY = s3t.Gateway()
    print(f"\n[test_media_s3_stream] gateway ready in {GATEWAY.start_s:.1f}s", flush=True)


def tearDownModule():
    if GATEWAY:
        GATEWAY.close()


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def gateway_relay():
    return Relay(int(GATEWAY.env["endpoint"].rsplit(":", 1)[1]))


class StreamCase(harness.AtriumTestCase):
    SHARED = False  # one server (and relay) for the class's tests: they count in deltas
    MEDIA = {}  # more plugins.media settings

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        if cls.SHARED:
            cls.class_relay = gateway_relay()
            cls.addClassCleanup(cls.class_relay.close)

    def setUp(self):
        super().setUp()
        if self.SHARED:
            self.relay = self.class_relay
        else:
            self.relay = gateway_relay()
            self.addCleanup(self.relay.close)
        media = GATEWAY.media_settings(s3_endpoint=f"http://127.0.0.1:{self.relay.port}",
                                       s3_part_size_bytes=PART, orphan_min_age_ms=10000,
                                       orphan_sweep_period_ms=1000, **self.MEDIA)
        self.srv = media_server(self, media=media, shared=self.SHARED)
        _, self.token = register(self.srv)

    def count(self, name, labels=None):
        return self.srv.metric(name, labels) or 0

    def cold(self, size=OBJECT_BYTES):
        """An original in the bucket and not in the local folder: (media ID, its bytes)."""
        data = os.urandom(size)
        media_id = upload(self.srv, self.token, data)
        os.unlink(original_file(self.srv, media_id))
        return media_id, data

    def open_download(self, media_id, headers=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.srv.port, timeout=20)
        hdrs = {"Authorization": f"Bearer {self.token}"}
        hdrs.update(headers or {})
        conn.request("GET", download_path(self.srv, media_id), headers=hdrs)
        return conn, conn.getresponse()

    def gets(self, kind="get"):
        return self.srv.metric("atrium_media_store_requests_total",
                               {"kind": kind, "outcome": "ok"}) or 0

    def local_names(self, media_id):
        folder = os.path.dirname(original_file(self.srv, media_id))
        return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


class StreamTest(StreamCase):
    SHARED = True

    def test_the_first_bytes_reach_the_client_while_the_store_get_is_still_under_way(self):
        media_id, data = self.cold()
        gets, stored = self.gets(), self.count("atrium_media_store_stream_ends_total",
                                               {"outcome": "stored"})
        self.relay.hold(HOLD_AFTER)
        started = time.monotonic()
        conn, resp = self.open_download(media_id)
        self.assertEqual(resp.status, 200)
        # Headers as for a local file: the row's size and hash.
        self.assertEqual(int(resp.getheader("Content-Length")), len(data))
        self.assertEqual(resp.getheader("ETag"), f'"{sha256(data)}"')
        self.assertEqual(resp.getheader("Accept-Ranges"), "bytes")
        first = resp.read(256 * 1024)
        first_s = time.monotonic() - started
        self.assertEqual(first, data[:len(first)])
        # The store's answer is held: the GET has not ended, nothing is named yet.
        self.assertTrue(self.relay.held.is_set())
        self.assertEqual(self.gets(), gets)
        self.assertEqual(self.srv.metric("atrium_media_store_streams_running"), 1)
        self.assertFalse(os.path.exists(original_file(self.srv, media_id)))
        self.relay.release()
        rest = resp.read()
        conn.close()
        self.assertEqual(sha256(first + rest), sha256(data))
        print(f"\n[stream] first 256 KiB in {first_s * 1000:.0f} ms with the store held",
              flush=True)
        # Cached whole once checked; the next download is a hit, no second GET.
        wait_for = time.monotonic() + 10
        while self.gets() != gets + 1 and time.monotonic() < wait_for:
            time.sleep(0.05)
        self.assertEqual(self.gets(), gets + 1)
        # Named after the GET ended (and was counted): the clients do not wait for it.
        wait_until(lambda: os.path.exists(original_file(self.srv, media_id)), timeout=10,
                   what="the local copy named")
        status, _, body = self.srv.request("GET", download_path(self.srv, media_id),
                                           token=self.token)
        self.assertEqual((status, body == data), (200, True))
        self.assertEqual(self.gets(), gets + 1)
        self.assertEqual(self.count("atrium_media_store_stream_ends_total",
                                    {"outcome": "stored"}), stored + 1)

    def test_many_clients_of_one_cold_object_cause_one_store_get(self):
        media_id, data = self.cold()
        gets = self.gets()
        whole = self.count("atrium_media_store_streams_total", {"kind": "whole"})
        followers = self.count("atrium_media_store_stream_followers_total")
        self.relay.hold(HOLD_AFTER)
        clients = [self.open_download(media_id) for _ in range(8)]
        firsts = []
        for conn, resp in clients:
            self.assertEqual(resp.status, 200)
            firsts.append(resp.read(64 * 1024))
        self.relay.release()
        for (conn, resp), first in zip(clients, firsts):
            self.assertEqual(sha256(first + resp.read()), sha256(data))
            conn.close()
        # Counted when the store's stream ends, which may be just after the last byte.
        wait_until(lambda: self.gets() >= gets + 1, timeout=10, what="the GET counted")
        self.assertEqual(self.gets(), gets + 1)
        self.assertEqual(self.count("atrium_media_store_streams_total", {"kind": "whole"}),
                         whole + 1)
        self.assertEqual(self.count("atrium_media_store_stream_followers_total"), followers + 7)

    def test_a_range_on_a_miss_is_a_ranged_get_and_caches_nothing(self):
        media_id, data = self.cold()
        ranges, gets = self.gets("range"), self.gets()
        down = self.count("atrium_media_store_bytes_total", {"direction": "down"})
        conn, resp = self.open_download(media_id, {"Range": "bytes=1000-200999"})
        body = resp.read()
        conn.close()
        self.assertEqual((resp.status, body == data[1000:201000]), (206, True))
        self.assertEqual(resp.getheader("Content-Range"), f"bytes 1000-200999/{len(data)}")
        self.assertEqual(resp.getheader("ETag"), f'"{sha256(data)}"')
        self.assertEqual(self.gets("range"), ranges + 1)
        self.assertEqual(self.gets("get"), gets)
        self.assertEqual(self.count("atrium_media_store_bytes_total", {"direction": "down"}),
                         down + 200000)
        self.assertEqual(self.local_names(media_id), [], "a range is not cached")
        # A range past the end is 416 at once, asking the store nothing.
        conn, resp = self.open_download(media_id, {"Range": f"bytes={len(data)}-"})
        resp.read()
        conn.close()
        self.assertEqual(resp.status, 416)
        self.assertEqual(self.gets("range"), ranges + 1)

    def test_the_gateway_gone_mid_download_cuts_the_body_and_caches_nothing(self):
        media_id, data = self.cold()
        gets = self.gets()
        cut = self.count("atrium_media_store_stream_ends_total", {"outcome": "cut"})
        self.relay.hold(HOLD_AFTER)
        conn, resp = self.open_download(media_id)
        self.assertEqual(resp.status, 200)
        first = resp.read(128 * 1024)
        self.assertEqual(first, data[:len(first)])
        self.relay.cut()
        with self.assertRaises(http.client.IncompleteRead):
            resp.read()
        conn.close()
        wait_for = time.monotonic() + 10
        while (self.count("atrium_media_store_stream_ends_total", {"outcome": "cut"}) != cut + 1
               and time.monotonic() < wait_for):
            time.sleep(0.05)
        self.assertEqual(self.count("atrium_media_store_stream_ends_total", {"outcome": "cut"}),
                         cut + 1)
        self.assertEqual(self.local_names(media_id), [], "nothing cached, no temp file left")
        # The next download fetches again, whole.
        status, _, body = self.srv.request("GET", download_path(self.srv, media_id),
                                           token=self.token)
        self.assertEqual((status, body == data), (200, True))
        # The GET is counted and the copy named when the store's stream ends, which may be
        # just after the client has the last byte: the clients do not wait for either.
        wait_until(lambda: self.gets() >= gets + 1, timeout=10, what="the GET counted")
        self.assertEqual(self.gets(), gets + 1)
        wait_until(lambda: os.path.exists(original_file(self.srv, media_id)), timeout=10,
                   what="the local copy named")


    def test_an_object_that_is_not_the_rows_is_never_served_whole(self):
        # Its last byte changed in the bucket behind the row's back: the mismatch shows only
        # at the last byte, so the held tail must not go. A large one's body ends short by
        # at least the held 64 KiB; a small one (all of it held) is 503; nothing is named.
        cut = self.count("atrium_media_store_stream_ends_total", {"outcome": "cut"})
        for size in (OBJECT_BYTES, 1000):
            media_id, data = self.cold(size)
            other = data[:-1] + bytes([data[-1] ^ 1])
            with tempfile.NamedTemporaryFile() as f:
                f.write(other)
                f.flush()
                put = GATEWAY.curl("-f", "-T", f.name, GATEWAY.url(f"originals/{media_id}"))
            self.assertEqual(put.returncode, 0, put.stderr)
            conn, resp = self.open_download(media_id)
            # A large one is 200 and cut short once the fetch has released bytes; if the
            # whole object landed (and failed its check) before the request woke, nothing
            # was released and the answer is the store's 503 (s3_stream.c), never a body.
            if size > TAIL_HOLD and resp.status == 200:
                with self.assertRaises(http.client.IncompleteRead) as got:
                    resp.read()
                self.assertLessEqual(len(got.exception.partial), size - TAIL_HOLD)
                self.assertEqual(got.exception.partial, data[:len(got.exception.partial)])
            else:
                resp.read()
                self.assertEqual(resp.status, 503)
            conn.close()
            cut += 1
            wait_until(lambda: self.count("atrium_media_store_stream_ends_total",
                                          {"outcome": "cut"}) == cut,
                       timeout=10, what="the fetch ended as cut")
            self.assertEqual(self.local_names(media_id), [], "nothing named, no temp file left")


def restart_gateway():
    """radosgw stopped (its connections closed) and started again on the same port."""
    run_dir = os.path.join(GATEWAY.dir, "run")
    with open(os.path.join(run_dir, "client.rgw.a.pid"), encoding="utf-8") as f:
        pid = int(f.read())
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: not os.path.exists(f"/proc/{pid}"), timeout=20, what="radosgw stopped")
    subprocess.run(["radosgw", "-c", os.path.join(GATEWAY.dir, "ceph.conf"), "-n",
                    "client.rgw.a"], check=True, timeout=60)
    wait_until(lambda: GATEWAY.curl("-o", "/dev/null", GATEWAY.env["endpoint"]).returncode == 0,
               timeout=30, what="radosgw answering again")


class FaultyStoreTest(StreamCase):
    """A store answering garbage, and one frozen under load (answers held, as a SIGSTOPped
    gateway holds them): clear errors within s3_timeout_ms, nothing cached, and what does not
    need the store answered at once meanwhile."""
    SHARED = True
    MEDIA = {"s3_timeout_ms": 3000}

    def test_a_store_answering_garbage_gets_a_clear_error_caches_nothing_and_heals(self):
        media_id, data = self.cold(256 * 1024)
        self.relay.garble(b"this is not an HTTP answer\r\n\r\n")
        try:
            status, headers, body = self.srv.request("GET", download_path(self.srv, media_id),
                                                     token=self.token)
        finally:
            self.relay.garble(None)
        self.assertEqual(status, 503, body)
        self.assertIn(b"errcode", body)
        self.assertIn("no-store", headers.get("Cache-Control", ""))
        self.assertEqual(self.local_names(media_id), [], "nothing cached, no temp file left")
        status, _, body = self.srv.request("GET", download_path(self.srv, media_id),
                                           token=self.token)
        self.assertEqual((status, body == data), (200, True))

    def test_a_frozen_store_under_load_gives_bounded_503s_while_cached_media_is_served(self):
        cached = os.urandom(64 * 1024)
        cached_id = upload(self.srv, self.token, cached)  # its local copy stays
        colds = [self.cold(128 * 1024)[0] for _ in range(6)]
        self.relay.hold(0)  # every store answer held: the store frozen
        self.addCleanup(self.relay.release)
        results = {}

        def fetch(media_id):
            started = time.monotonic()
            status, headers, body = self.srv.request("GET", download_path(self.srv, media_id),
                                                     token=self.token, timeout=60)
            results[media_id] = (status, headers.get("Cache-Control", ""), body,
                                 time.monotonic() - started)
        threads = [threading.Thread(target=fetch, args=(m,)) for m in colds]
        for t in threads:
            t.start()
        self.assertTrue(self.relay.held.wait(10), "no store request reached the store")
        # Meanwhile: /versions and a cached download, at once.
        started = time.monotonic()
        status, _, _ = self.srv.request("GET", "/_matrix/client/versions")
        versions_s = time.monotonic() - started
        started = time.monotonic()
        c_status, _, c_body = self.srv.request("GET", download_path(self.srv, cached_id),
                                               token=self.token)
        cached_s = time.monotonic() - started
        for t in threads:
            t.join(60)
        self.assertEqual(status, 200)
        self.assertLess(versions_s, 2.0)
        self.assertEqual((c_status, c_body == cached), (200, True))
        self.assertLess(cached_s, 2.0)
        bound = self.MEDIA["s3_timeout_ms"] / 1000 + 8  # the deadline, and ASan's slowness
        for media_id in colds:
            status, cache_control, body, took = results[media_id]
            self.assertEqual(status, 503, body)
            self.assertIn(b"errcode", body)
            self.assertIn("no-store", cache_control)
            self.assertLess(took, bound)
            self.assertEqual(self.local_names(media_id), [])


class ConnectionReuseTest(StreamCase):
    """Requests to the store go on kept connections (plugins/media/s3.c, handle_take): at
    most s3_max_concurrent of them, and a connection the store closed is never used for an
    answer."""

    MEDIA = {"s3_max_concurrent": 2}
    SIZE = 1 << 20

    def download_whole(self, media_id, data):
        status, _, body = self.srv.request("GET", download_path(self.srv, media_id),
                                           token=self.token, timeout=30)
        self.assertEqual((status, sha256(body)), (200, sha256(data)), media_id)

    def counted_as_accepted(self):
        """The counter equals the connections the relay took, once the requests on them
        are over: it is added to when a request ends (s3.c), and the orphan sweep's
        listing may be on a new connection at the moment the relay is read."""
        wait_until(lambda: self.count("atrium_media_store_connections_total")
                   == self.relay.accepted, timeout=10,
                   what="atrium_media_store_connections_total == connections the relay took")

    def test_downloads_one_after_another_reuse_connections_and_come_whole_when_they_close(self):
        objects = [self.cold(self.SIZE) for _ in range(10)]
        for media_id, data in objects[:4]:
            self.download_whole(media_id, data)
        # 4 uploads, 4 GETs and the start's HEAD: never more connections than handles.
        self.assertLessEqual(self.relay.accepted, 2)
        self.counted_as_accepted()
        # The store closes every kept connection (an idle timeout), then restarts.
        self.relay.cut()
        self.download_whole(*objects[4])
        restart_gateway()
        self.download_whole(*objects[5])
        # It closes the kept connection just as a GET goes out on it: sent again on a new
        # one (a GET may be sent twice).
        for media_id, data in objects[6:8]:
            self.relay.drop_reused()
            self.download_whole(media_id, data)
        self.assertEqual(self.relay.dropped, 2)
        # The same for a PUT: its body is sent again whole.
        self.relay.drop_reused()
        data = os.urandom(self.SIZE)
        media_id = upload(self.srv, self.token, data)
        self.assertEqual(self.relay.dropped, 3)
        status, body = GATEWAY.get_object(f"originals/{media_id}")
        self.assertEqual((status, sha256(body)), (200, sha256(data)))
        for media_id, data in objects[8:]:
            self.download_whole(media_id, data)
        # Every connection counted (those the relay took while the gateway was down too).
        self.counted_as_accepted()
        self.assertEqual(self.count("atrium_media_store_requests_total",
                                    {"kind": "get", "outcome": "failed"}), 0)

    def test_concurrent_misses_past_the_bound_keep_at_most_s3_max_concurrent_connections(self):
        objects = [self.cold(self.SIZE) for _ in range(6)]
        errors = []

        def fetch(media_id, data):
            try:
                self.download_whole(media_id, data)
            except AssertionError as e:
                errors.append(e)
        threads = [threading.Thread(target=fetch, args=o) for o in objects]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual(errors, [])
        self.assertLessEqual(self.relay.most_open, 2)
        # The kept handles (full: both slots' handles), each with its connection still open
        # (the orphan sweep's listing may hold one a moment).
        wait_until(lambda: (self.count("atrium_media_store_handles_idle"), self.relay.open)
                   == (2, 2), timeout=10, what="two handles kept, their connections open")


class UploadStreamTest(StreamCase):
    def begin_upload(self, data, sent):
        """A raw POST upload of data whose first `sent` bytes are sent now; the socket."""
        sock = harness.raw_connect(self.srv.port, timeout=60)
        head = ("POST /_matrix/media/v3/upload HTTP/1.1\r\nHost: x\r\n"
                f"Authorization: Bearer {self.token}\r\n"
                "Content-Type: application/octet-stream\r\n"
                f"Content-Length: {len(data)}\r\n\r\n")
        sock.sendall(head.encode() + data[:sent])
        return sock

    def parts_of(self, key, upload_id):
        run = GATEWAY.curl(GATEWAY.url(key, f"uploadId={upload_id}"))
        return len(re.findall(r"<PartNumber>", run.stdout.decode()))

    def open_upload(self):
        """(key, UploadId) of the one multipart upload open, once there is one."""
        wait_until(lambda: len(GATEWAY.multipart_uploads()) == 1, timeout=30,
                   what="a multipart upload open in the bucket")
        return GATEWAY.multipart_uploads()[0]

    def test_an_upload_above_the_part_size_goes_in_parts_while_its_body_arrives(self):
        data = os.urandom(2 * PART + 1000)  # three parts: 5 + 5 MiB + 1000 bytes
        sock = self.begin_upload(data, 2 * PART + 10)
        key, upload_id = self.open_upload()
        # The first two parts are in the bucket while the body has not ended; no object yet.
        wait_until(lambda: self.parts_of(key, upload_id) == 2, timeout=30,
                   what="two parts sent before the body ended")
        self.assertEqual(GATEWAY.get_object(key)[0], 404, "an object before the body ended")
        sock.sendall(data[2 * PART + 10:])
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
        sock.close()
        self.assertTrue(answer.startswith(b"HTTP/1.1 200"), answer[:200])
        media_id = re.search(rb'"content_uri":"mxc://[^/]+/([^"]+)"', answer).group(1).decode()
        self.assertEqual(key, f"originals/{media_id}")
        self.assertRegex(GATEWAY.etag(key) or "", r'-3"$')
        status, body = GATEWAY.get_object(key)
        self.assertEqual((status, sha256(body)), (200, sha256(data)))
        self.assertEqual(GATEWAY.multipart_uploads(), [])
        self.assertFalse(os.path.exists(original_file(self.srv, media_id)),
                         "never whole on the local disk")
        for kind, count in (("create", 1), ("part", 3), ("complete", 1), ("put", 0),
                            ("abort", 0)):
            self.assertEqual(self.srv.metric("atrium_media_store_requests_total",
                                             {"kind": kind, "outcome": "ok"}), count, kind)
        self.assertEqual(self.count("atrium_media_store_upload_streams_total",
                                    {"outcome": "completed"}), 1)
        self.assertEqual(self.count("atrium_media_store_upload_parts_waiting"), 0)
        # It downloads whole (streamed from the store) with its row's hash.
        status, headers, body = self.srv.request("GET", download_path(self.srv, media_id),
                                                 token=self.token, timeout=60)
        self.assertEqual((status, sha256(body)), (200, sha256(data)))
        self.assertEqual(headers["ETag"], f'"{sha256(data)}"')

    def test_a_client_gone_mid_upload_aborts_its_multipart_upload(self):
        data = os.urandom(2 * PART + 1000)
        sock = self.begin_upload(data, PART + 10)
        key, upload_id = self.open_upload()
        sock.close()
        wait_until(lambda: GATEWAY.multipart_uploads() == [], timeout=30,
                   what="the abandoned multipart upload aborted")
        self.assertEqual(GATEWAY.get_object(key)[0], 404)
        self.assertEqual(self.srv.metric("atrium_media_store_requests_total",
                                         {"kind": "abort", "outcome": "ok"}), 1)
        self.assertEqual(self.count("atrium_media_store_upload_streams_total",
                                    {"outcome": "aborted"}), 1)
        self.assertEqual(self.count("atrium_media_store_upload_parts_waiting"), 0)

    def test_killed_mid_upload_no_torn_object_and_the_sweep_aborts_its_parts(self):
        data = os.urandom(2 * PART + 1000)
        sock = self.begin_upload(data, PART + 10)
        key, upload_id = self.open_upload()
        wait_until(lambda: self.parts_of(key, upload_id) == 1, timeout=30,
                   what="a part sent")
        self.srv.kill()
        sock.close()
        self.srv.start()
        self.assertEqual(GATEWAY.get_object(key)[0], 404, "no torn object")
        # Aborted by the sweep once older than orphan_min_age_ms (10 s).
        wait_until(lambda: GATEWAY.multipart_uploads() == [], timeout=40,
                   what="no multipart upload left open")
        self.assertEqual(self.srv.metric("atrium_media_orphans_removed_total",
                                         {"kind": "multipart"}), 1)


if __name__ == "__main__":
    unittest.main()
