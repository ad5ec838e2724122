"""What a media plugin needs most from the ABI, through tests/plugins/testplug.c: a
streamed body (ATRIUM_ROUTE_STREAM_BODY) with the headers-first call
(ATRIUM_ROUTE_HEADERS_FIRST), max_body_bytes on a streamed route, respond_file and
req_authenticate, a response that waits for its bytes (respond_stream_wait); holds never
released under a running handed-off handler; init errors
named; a media/1 plugin without the contract's routes refused (include/atrium/host.h,
include/atrium/media.h)."""

import hashlib
import http.client
import json
import os
import time

from common import AtriumTestCase, start_module_server, testplug, wait_until
from harness import Server, ServerError, raw_connect, read_head
from media_support import register

STREAM_MAX_BODY_BYTES = 1024 * 1024  # testplug.c
FILE_BYTES = 65536
FNV_OFFSET, FNV_PRIME = 1469598103934665603, 1099511628211
ATRIUM_E_STATE = -7


def fnv(data):
    x = FNV_OFFSET
    for b in data:
        x = ((x ^ b) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return f"{x:016x}"


def post_raw(srv, path, body=b"", chunked=False, token=None, send_body=True, timeout=15):
    """(status, head bytes, body bytes) of a POST sent as the test wants."""
    sock = raw_connect(srv.port, timeout=timeout)
    try:
        lines = [f"POST {path} HTTP/1.1", "Host: t"]
        if token:
            lines.append(f"Authorization: Bearer {token}")
        lines.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(body)}")
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        if send_body:
            try:
                step = 16384
                for i in range(0, len(body), step):
                    part = body[i:i + step]
                    sock.sendall(b"%x\r\n%s\r\n" % (len(part), part) if chunked else part)
                if chunked:
                    sock.sendall(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass
        status, head, rest = read_head(sock)
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        while len(rest) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
        return status, head, rest
    finally:
        sock.close()


class StreamTestCase(AtriumTestCase):
    def server(self, **settings):
        """A server of the test's own when it changes a setting; otherwise the module's
        shared one (start_module_server: the tests register their own users and count
        deltas; a start costs about a CPU-second under ASan)."""
        if settings:
            return self.start_server(plugins=testplug(),
                                     settings={"registration": {"enabled": True}, **settings})
        return start_module_server(self, plugins=testplug(),
                                   settings={"registration": {"enabled": True}})

    def own_server(self):
        """A server of the test's own, as server() would start it: for a test that stops it."""
        return self.start_server(plugins=testplug(), settings={"registration": {"enabled": True}})


class StreamedBodyTest(StreamTestCase):
    def test_a_streamed_body_arrives_whole_and_in_order_after_the_headers_first_call(self):
        srv = self.server()
        data = os.urandom(300 * 1024 + 5)
        for chunked in (False, True):
            with self.subTest(chunked=chunked):
                status, _, body = post_raw(srv, "/_test/stream", data, chunked=chunked)
                self.assertEqual(status, 200, body)
                got = json.loads(body)
                self.assertTrue(got["headers_first"])
                self.assertEqual((got["bytes"], got["fnv"]), (len(data), fnv(data)))
                self.assertGreater(got["chunks"], 1)
                self.assertEqual(got["buffered"], 0, "a streamed route buffers nothing")
                self.assertEqual(got["park_in_chunk"], ATRIUM_E_STATE,
                                 "body_chunk may not park: the request is not a handler's yet")
        wait_until(lambda: srv.metric("atrium_testplug_stream_holds") == 0, what="holds released")

    def test_the_hosts_sha256_of_a_streamed_body_and_its_wall_clock_are_right(self):
        # ABI 1.5: sha256_init/update/final over the body's chunks as they come, and
        # wall_ms a date (the Unix epoch), not the monotonic now_ms.
        srv = self.server()
        for data in (os.urandom(200 * 1024 + 3), b""):
            with self.subTest(size=len(data)):
                before_ms = time.time() * 1000
                status, _, body = post_raw(srv, "/_test/stream", data, chunked=True)
                after_ms = time.time() * 1000
                self.assertEqual(status, 200, body)
                got = json.loads(body)
                self.assertEqual(got["sha256"], hashlib.sha256(data).hexdigest())
                self.assertGreater(got["chunks"], 1 if data else -1)
                self.assertTrue(before_ms - 1000 <= got["wall_ms"] <= after_ms + 1000, got)

    def test_an_empty_body_never_reaches_body_chunk_with_data(self):
        srv = self.server()
        status, _, body = post_raw(srv, "/_test/stream", b"")
        self.assertEqual(status, 200, body)
        got = json.loads(body)
        self.assertEqual((got["headers_first"], got["bytes"], got["chunks"]), (True, 0, 0))

    def test_the_headers_first_call_answers_before_the_body_is_sent(self):
        srv = self.server()
        started = time.monotonic()
        status, head, body = post_raw(srv, "/_test/stream?auth=1", b"\0" * STREAM_MAX_BODY_BYTES,
                                      send_body=False, timeout=5)
        self.assertEqual(status, 401, body)
        self.assertEqual(json.loads(body)["errcode"], "M_MISSING_TOKEN")
        self.assertIn(b"no-store", head)
        status, _, body = post_raw(srv, "/_test/stream?refuse=1", b"\0" * 1000, send_body=False,
                                   timeout=5)
        self.assertEqual((status, json.loads(body)["errcode"]), (403, "M_FORBIDDEN"))
        self.assertLess(time.monotonic() - started, 5)
        _, token = register(srv)
        status, _, body = post_raw(srv, "/_test/stream?auth=1", b"abc", token=token)
        self.assertEqual((status, json.loads(body)["bytes"]), (200, 3))

    def test_max_body_bytes_applies_to_a_streamed_route_and_its_holds_are_released(self):
        srv = self.server()
        too_big = b"\1" * (STREAM_MAX_BODY_BYTES + 1)
        for chunked in (False, True):
            with self.subTest(chunked=chunked):
                status, _, body = post_raw(srv, "/_test/stream", too_big, chunked=chunked)
                self.assertEqual((status, json.loads(body)["errcode"]), (413, "M_TOO_LARGE"))
        status, _, body = post_raw(srv, "/_test/stream", too_big[:-1])
        self.assertEqual((status, json.loads(body)["bytes"]), (200, STREAM_MAX_BODY_BYTES))
        wait_until(lambda: srv.metric("atrium_testplug_stream_holds") == 0,
                   what="the hold of the upload the core refused released")


def tap_bytes(start, n):
    return bytes(ord("a") + (start + i) % 26 for i in range(n))


class WaitingStreamTest(StreamTestCase):
    """respond_stream_wait (1.3): a body that waits, suspended, for bytes being produced."""

    def open_tap(self, srv, query=""):
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=15)
        conn.request("GET", "/_test/tap" + query)
        return conn, conn.getresponse()

    def test_a_waiting_stream_holds_no_thread_and_sends_each_byte_once_it_is_fed(self):
        srv = self.server(server={"http": {"request_threads": 1}})
        conn, resp = self.open_tap(srv)
        self.assertEqual(resp.status, 200)
        self.assertEqual(resp.headers["Transfer-Encoding"], "chunked")
        wait_until(lambda: srv.metric("atrium_http_streams_waiting") == 1, what="the stream waits")
        # The one request thread is free meanwhile: other requests are answered.
        self.assertEqual(srv.json("GET", "/_matrix/client/versions")[0], 200)
        got = b""
        for step in (1000, 70000, 5):
            status, body = srv.json("POST", f"/_test/tap/feed?bytes={step}")
            self.assertEqual((status, body), (200, {"woken": 1}))
            want = len(got) + step
            while len(got) < want:
                got += resp.read1(65536)
            self.assertEqual(got, tap_bytes(0, want))
            wait_until(lambda: srv.metric("atrium_http_streams_waiting") == 1,
                       what="waiting again")
        srv.json("POST", "/_test/tap/end")
        self.assertEqual(resp.read(), b"")  # the last chunk: a complete body
        self.assertTrue(resp.isclosed() or resp.length in (None, 0))
        conn.close()
        self.assertEqual(srv.metric("atrium_http_streams_waiting"), 0)
        self.assertEqual(srv.metric("atrium_http_streams_cut_total"), 0)

    def test_a_stream_still_waiting_at_its_deadline_is_cut_short_of_its_size(self):
        srv = self.server()
        cut_before = srv.metric("atrium_http_streams_cut_total")
        srv.json("POST", "/_test/tap/feed?bytes=3000")
        started = time.monotonic()
        conn, resp = self.open_tap(srv, "?size=10000&deadline_ms=700")
        self.assertEqual((resp.status, resp.headers["Content-Length"]), (200, "10000"))
        with self.assertRaises(http.client.IncompleteRead) as cut:
            resp.read()
        self.assertEqual(cut.exception.partial, tap_bytes(0, 3000))
        self.assertLess(time.monotonic() - started, 5)
        conn.close()
        wait_until(lambda: srv.metric("atrium_http_streams_cut_total") - cut_before == 1,
                   what="counted")
        self.assertEqual(srv.metric("atrium_http_streams_waiting"), 0)
        # Chunked: cut without the last chunk.
        conn, resp = self.open_tap(srv, "?deadline_ms=500")
        with self.assertRaises(http.client.IncompleteRead):
            resp.read()
        conn.close()

    def test_shutdown_cuts_a_waiting_stream_and_the_server_exits_cleanly(self):
        srv = self.own_server()
        conn, resp = self.open_tap(srv)
        wait_until(lambda: srv.metric("atrium_http_streams_waiting") == 1, what="the stream waits")
        self.assertEqual(srv.stop(), 0)
        with self.assertRaises((http.client.IncompleteRead, OSError)):
            resp.read()
        conn.close()


class FileAndAuthTest(StreamTestCase):
    def test_respond_file_sends_the_asked_part_of_an_open_file(self):
        srv = self.server()
        whole = bytes(i % 251 for i in range(FILE_BYTES))
        status, headers, body = srv.request("GET", "/_test/file")
        self.assertEqual((status, hashlib.sha256(body).hexdigest()),
                         (200, hashlib.sha256(whole).hexdigest()))
        self.assertEqual(int(headers["Content-Length"]), FILE_BYTES)
        status, _, body = srv.request("GET", "/_test/file?offset=1000&len=500")
        self.assertEqual((status, body), (200, whole[1000:1500]))
        status, headers, body = srv.request("HEAD", "/_test/file?offset=10&len=20")
        self.assertEqual((status, body, headers["Content-Length"]), (200, b"", "20"))

    def test_req_authenticate_names_the_caller_or_answers_401(self):
        srv = self.server()
        user, token = register(srv)
        status, body = srv.json("GET", "/_test/whoami")
        self.assertEqual((status, body["errcode"]), (401, "M_MISSING_TOKEN"))
        status, body = srv.json("GET", "/_test/whoami", token="nope")
        self.assertEqual((status, body["errcode"]), (401, "M_UNKNOWN_TOKEN"))
        for kwargs in ({"token": token}, {}):
            path = "/_test/whoami" + ("" if kwargs else f"?access_token={token}")
            status, body = srv.json("GET", path, **kwargs)
            self.assertEqual(status, 200, body)
            self.assertEqual((body["user_id"], body["client_key"], body["admin"]),
                             (user, user, False))
            self.assertTrue(body["device_id"])


class HoldLifetimeTest(StreamTestCase):
    def test_a_hold_is_not_released_while_its_handed_off_handler_still_runs(self):
        srv = self.server(server={"http": {"handoff_deadline_ms": 200}})
        status, _, _ = srv.request("GET", "/_test/handoff_hold?sleep_ms=900")
        self.assertEqual(status, 504, "the deadline answered first")
        self.assertEqual(srv.metric("atrium_testplug_holds"), 1,
                         "the hold waits for the handler that still runs")
        wait_until(lambda: srv.metric("atrium_testplug_holds") == 0, what="released after it")
        self.assertEqual(srv.metric("atrium_testplug_released_under_handler_total"), 0)


class LoaderNamesTest(AtriumTestCase):
    def start_expecting_failure(self, plugins):
        srv = Server(plugins=plugins, start=False)
        self.addCleanup(srv.close)
        with self.assertRaises(ServerError):
            srv.start(timeout=20)
        return srv.log_text()

    def test_an_init_error_is_logged_with_its_name(self):
        log = self.start_expecting_failure({**testplug("testplug"), **testplug("testroutes")})
        self.assertIn('plugin "testroutes"', log)
        self.assertIn("init failed: ATRIUM_E_EXISTS (already registered)", log)

    def test_a_media_plugin_without_the_required_routes_is_refused(self):
        log = self.start_expecting_failure(testplug("testmedia"))
        self.assertIn('provides media/1 but does not serve GET /_matrix/client/v1/media/config, '
                      'which that contract requires', log)
