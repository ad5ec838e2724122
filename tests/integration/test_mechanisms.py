"""The core's mechanisms, driven through the test plugin (built only from include/atrium/):
handoff, parking, holds, admission lines, the outbound budget, deadlines, rate limits,
PostgreSQL, and shutdown with requests still waiting."""

import http.client
import json
import socket
import time
import unittest

from common import (AtriumTestCase, Background, start_module_server, thread_count, wait_until,
                    with_testplug)
from harness import raw_connect, read_head


def shared_server(test):
    """The one server of this module's tests that need the test plugin as it comes (rate
    limits off, as the harness has them), stop no server and count deltas: a start costs
    about a CPU-second under ASan, more under TSan."""
    return start_module_server(test, plugins=with_testplug(),
                               settings={"ratelimit": {"enabled": False}})


class PeerThatNeverAnswers:
    """A TCP listener on loopback that accepts and stays silent until told to answer."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted = []
        self._bg = Background(self._accept_loop)

    def _accept_loop(self):
        self.sock.settimeout(0.2)
        while self.sock.fileno() != -1:
            try:
                conn, _ = self.sock.accept()
                self.accepted.append(conn)
            except socket.timeout:
                continue
            except OSError:
                return

    def answer_all(self):
        for c in self.accepted:
            try:
                c.sendall(b"x")
            except OSError:
                pass

    def close(self):
        for c in self.accepted:
            c.close()
        self.sock.close()


class HandoffTest(AtriumTestCase):
    def test_route_hands_off_to_its_pool_which_answers_with_the_scope_values(self):
        srv = shared_server(self)
        runs = srv.metric("atrium_testplug_pool_runs_total") or 0
        status, body = srv.json("GET", "/_test/handoff")
        self.assertEqual(status, 200, body)
        self.assertTrue(body["ran_on_pool"])
        self.assertEqual(body["fetch_mode"], 2)  # ATRIUM_FETCH_ADMITTED, published by the handoff
        self.assertEqual(srv.metric("atrium_testplug_pool_runs_total") - runs, 1)
        self.assertEqual(srv.metric("atrium_http_handed_off"), 0)
        # Workers start as tasks arrive (ADR-0036): this one at least, never past the two.
        self.assertEqual(srv.metric("atrium_pool_threads_limit", {"pool": "testplug.work"}), 2)
        self.assertIn(srv.metric("atrium_pool_threads", {"pool": "testplug.work"}), (1, 2))

    def test_handoff_after_the_pool_stopped_answers_503_without_running(self):
        srv = self.start_server(plugins=with_testplug())
        status, _ = srv.json("POST", "/_test/pool/stop")
        self.assertEqual(status, 200)
        status, headers, data = srv.request("GET", "/_test/handoff")
        self.assertEqual(status, 503, data)
        self.assertIn(b'"errcode"', data)
        self.assertEqual(headers.get("Cache-Control"), "no-store")
        self.assertEqual(srv.metric("atrium_testplug_pool_runs_total"), 0)

    def test_handoff_past_its_deadline_answers_504_and_frees_the_worker(self):
        srv = self.start_server(plugins=with_testplug(threads=1),
                                settings={"server": {"http": {"handoff_deadline_ms": 400}}})
        started = time.monotonic()
        status, body = srv.json("GET", "/_test/handoff?sleep_ms=2000")
        elapsed = time.monotonic() - started
        self.assertEqual(status, 504, body)
        self.assertLess(elapsed, 1.8, "the core must answer at the deadline, not when the worker ends")
        self.assertEqual(srv.metric("atrium_http_handoff_expired_total"), 1)
        # The worker finishes later; its late answer is dropped and the pool serves again.
        srv.wait_for_log(r"answered after its deadline; dropped", timeout=5)
        status, body = srv.json("GET", "/_test/handoff")
        self.assertEqual(status, 200, body)

    def test_handoff_whose_client_left_before_a_worker_was_free_is_dropped(self):
        srv = self.start_server(plugins=with_testplug(threads=1))
        busy = Background(srv.json, "GET", "/_test/handoff?sleep_ms=1500")
        wait_until(lambda: srv.metric("atrium_pool_busy", {"pool": "testplug.work"}) == 1,
                   what="the only worker busy")
        s = raw_connect(srv.port)
        s.sendall(b"GET /_test/handoff HTTP/1.1\r\nHost: x\r\n\r\n")
        wait_until(lambda: srv.metric("atrium_pool_queued", {"pool": "testplug.work"}) == 1,
                   what="the second request queued")
        s.close()  # the client leaves while its request waits in the queue
        self.assertEqual(busy.result()[0], 200)
        wait_until(lambda: srv.metric("atrium_http_handoff_client_gone_total") == 1,
                   what="the dropped handoff counted")
        self.assertEqual(srv.metric("atrium_testplug_pool_runs_total"), 1, "only the first ran")
        self.assertEqual(srv.metric("atrium_http_handed_off"), 0)


class ParkTest(AtriumTestCase):
    def test_parked_request_is_resumed_by_another_request(self):
        srv = shared_server(self)
        parked = Background(srv.json, "GET", "/_test/park?timeout_ms=20000", timeout=30)
        wait_until(lambda: srv.metric("atrium_http_parked") == 1, what="one parked request")
        status, body = srv.json("POST", "/_test/ring")
        self.assertEqual((status, body), (200, {"woken": 1}))
        self.assertEqual(parked.result(), (200, {"woken_by": "event"}))
        self.assertEqual(srv.metric("atrium_http_parked"), 0)

    def test_parked_requests_hold_no_thread(self):
        srv = self.start_server(plugins=with_testplug(),
                                settings={"server": {"http": {"request_threads": 2}}})
        before = thread_count(srv.pid)
        parked = [Background(srv.json, "GET", "/_test/park?timeout_ms=20000", timeout=30)
                  for _ in range(60)]
        wait_until(lambda: srv.metric("atrium_http_parked") == 60, what="60 parked requests")
        self.assertEqual(thread_count(srv.pid), before, "parking must not add threads")
        # Two request threads, sixty parked requests: the server still answers at once.
        status, _, _ = srv.request("GET", "/health", timeout=2)
        self.assertEqual(status, 200)
        self.assertEqual(srv.json("POST", "/_test/ring")[1], {"woken": 60})
        for p in parked:
            self.assertEqual(p.result(), (200, {"woken_by": "event"}))

    def test_park_deadline_runs_the_handler_again(self):
        srv = shared_server(self)
        started = time.monotonic()
        self.assertEqual(srv.json("GET", "/_test/park?timeout_ms=300"), (200, {"woken_by": "deadline"}))
        self.assertLess(time.monotonic() - started, 2.0)
        self.assertEqual(srv.metric("atrium_http_parked"), 0)

    def test_shutdown_answers_every_parked_request(self):
        srv = self.start_server(plugins=with_testplug())
        parked = [Background(srv.request, "GET", "/_test/park?timeout_ms=60000", timeout=30)
                  for _ in range(5)]
        # A worker busy for 4 s: its request is answered at once, the exit waits for it.
        waiting_in_pool = Background(srv.request, "GET", "/_test/handoff?sleep_ms=4000", timeout=30)
        wait_until(lambda: srv.metric("atrium_http_parked") == 5, what="5 parked")
        wait_until(lambda: srv.metric("atrium_http_handed_off") == 1, what="1 handed off")
        started = time.monotonic()
        self.assertEqual(srv.stop(), 0)
        self.assertLess(time.monotonic() - started, 10)
        for p in parked + [waiting_in_pool]:
            status, headers, data = p.result()
            self.assertEqual(status, 503, data)
            self.assertIsNotNone(headers.get("Retry-After"))
            self.assertLess(p.finished_at - started, 2.0, "answered as the stop began")

    def test_new_requests_during_the_drain_get_503_while_a_running_one_finishes(self):
        srv = self.start_server(plugins=with_testplug())
        keep_alive = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        keep_alive.request("GET", "/_matrix/client/versions")
        self.assertEqual(keep_alive.getresponse().read()[:1], b"{")
        # A body the client reads slowly keeps the drain open.
        size = 16 * 1024 * 1024
        slow = raw_connect(srv.port, rcvbuf=16384)
        slow.sendall(f"GET /_test/slow?bytes={size} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        status, _, rest = read_head(slow)
        self.assertEqual(status, 200)
        stopping = Background(srv.stop)
        srv.wait_for_log("stopping")
        for label, ask in (("new connection", lambda: srv.request("GET", "/_matrix/client/versions")),
                           ("kept-alive connection", lambda: self._ask(keep_alive))):
            status, headers, data = ask()
            self.assertEqual(status, 503, label)
            self.assertEqual(json.loads(data)["errcode"], "M_UNKNOWN", label)
            self.assertIsNotNone(headers.get("Retry-After"), label)
            self.assertEqual(headers.get("Connection", "").lower(), "close", label)
        self.assertFalse(stopping.done(), "the running request holds the exit")
        received = len(rest)
        while received < size:
            chunk = slow.recv(1 << 20)
            self.assertTrue(chunk, "the running body was cut off")
            received += len(chunk)
        slow.close()
        self.assertEqual(stopping.result(), 0)

    @staticmethod
    def _ask(conn):
        conn.request("GET", "/_matrix/client/versions")
        resp = conn.getresponse()
        return resp.status, resp.headers, resp.read()


class HoldTest(AtriumTestCase):
    BIG = 16 * 1024 * 1024

    def test_hold_is_released_after_the_last_byte_of_a_slow_read(self):
        srv = shared_server(self)
        s = raw_connect(srv.port, rcvbuf=16384)
        s.sendall(f"GET /_test/slow?bytes={self.BIG} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        status, _, rest = read_head(s)
        self.assertEqual(status, 200)
        received = len(rest)
        time.sleep(0.3)  # the server has sent what the socket buffers take, not more
        self.assertEqual(srv.metric("atrium_testplug_holds"), 1, "held while the body is unsent")
        self.assertGreaterEqual(srv.metric("atrium_http_holds"), 1)
        while received < self.BIG:
            chunk = s.recv(1 << 20)
            self.assertTrue(chunk, "connection closed early")
            received += len(chunk)
        s.close()
        wait_until(lambda: srv.metric("atrium_testplug_holds") == 0, what="hold released")
        self.assertEqual(srv.metric("atrium_http_holds"), 0)

    def test_hold_is_released_when_the_client_disconnects_mid_body(self):
        srv = shared_server(self)
        s = raw_connect(srv.port, rcvbuf=16384)
        s.sendall(f"GET /_test/slow?bytes={self.BIG} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        read_head(s)
        wait_until(lambda: srv.metric("atrium_testplug_holds") == 1, what="hold taken")
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()  # reset, mid-body
        wait_until(lambda: srv.metric("atrium_testplug_holds") == 0, what="hold released")
        self.assertEqual(srv.metric("atrium_http_holds"), 0)

    def test_line_slot_is_held_through_the_body_and_passes_to_the_waiter(self):
        srv = self.start_server(plugins=with_testplug(line_slots=1, line_waiting=1))
        line = {"line": "testplug.line"}
        first = raw_connect(srv.port, rcvbuf=16384)
        first.sendall(f"GET /_test/line?bytes={self.BIG} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        self.assertEqual(read_head(first)[0], 200)
        second = Background(srv.request, "GET", "/_test/line?bytes=10", timeout=30)
        wait_until(lambda: srv.metric("atrium_line_waiting", line) == 1, what="second waits")
        # Requests that are not in the line pass meanwhile.
        self.assertEqual(srv.request("GET", "/health", timeout=2)[0], 200)
        self.assertEqual(srv.json("GET", "/_matrix/client/versions")[0], 200)
        # The line is full: the next one is refused at once, retry-friendly.
        status, headers, data = srv.request("GET", "/_test/line?bytes=10", timeout=5)
        self.assertEqual(status, 429, data)
        self.assertIn(b"M_LIMIT_EXCEEDED", data)
        self.assertIn(b"retry_after_ms", data)
        self.assertEqual(headers.get("Retry-After"), "1")
        self.assertEqual(headers.get("Cache-Control"), "no-store")
        self.assertFalse(second.done(), "the waiter must not enter while the slot is held")
        first.close()  # the first client goes away mid-body
        status, _, data = second.result()
        self.assertEqual((status, data), (200, b"abcdefghij"))
        wait_until(lambda: srv.metric("atrium_line_in_use", line) == 0, what="slot returned")
        self.assertEqual(srv.metric("atrium_line_waiting", line), 0)

    def test_line_waiter_past_its_wait_deadline_gets_429(self):
        srv = self.start_server(plugins=with_testplug(line_slots=1, line_waiting=2, line_wait_ms=300))
        first = raw_connect(srv.port, rcvbuf=16384)
        first.sendall(f"GET /_test/line?bytes={self.BIG} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        read_head(first)
        status, headers, data = srv.request("GET", "/_test/line?bytes=10", timeout=5)
        self.assertEqual(status, 429, data)
        self.assertEqual(headers.get("Cache-Control"), "no-store")
        self.assertEqual(srv.metric("atrium_line_timed_out_total", {"line": "testplug.line"}), 1)
        first.close()


class OutboundBudgetTest(AtriumTestCase):
    """ADR-0079 (docs/adr/0079-outbound-budget.md): with 4 request threads, at most 2
    requests may wait on other servers, and at most 1 per client key; over either cap the answer is 429 at once.
    The tests share one server (start_class_server), each with client addresses of its own."""

    def server(self):
        return self.start_class_server(plugins=with_testplug(), settings={
            "server": {"http": {"request_threads": 4, "trusted_proxies": ["127.0.0.1"]}}})

    def test_third_outbound_request_and_second_from_one_client_are_refused_at_once(self):
        srv = self.server()
        peer = PeerThatNeverAnswers()
        self.addCleanup(peer.close)
        path = f"/_test/outbound?port={peer.port}"

        def from_client(addr):
            return {"X-Forwarded-For": addr}

        # One after the other: libmicrohttpd pins a connection to the thread that accepted
        # it, and a thread may accept a burst of connections before it blocks.
        a = Background(srv.json, "GET", path, headers=from_client("10.1.0.1"), timeout=30)
        wait_until(lambda: len(peer.accepted) == 1, what="one request waiting on the peer")
        b = Background(srv.json, "GET", path, headers=from_client("10.1.0.2"), timeout=30)
        wait_until(lambda: len(peer.accepted) == 2, what="two requests waiting on the peer")
        self.assertEqual(srv.metric("atrium_budget_in_use", {"budget": "outbound"}), 2)

        for addr, why in (("10.1.0.3", "global cap (half of 4 threads)"),
                          ("10.1.0.1", "per-client cap (one each)")):
            started = time.monotonic()
            status, body = srv.json("GET", path, headers=from_client(addr))
            self.assertEqual(status, 429, f"{why}: {body}")
            self.assertEqual(body["errcode"], "M_LIMIT_EXCEEDED")
            self.assertGreater(body["retry_after_ms"], 0)
            self.assertLess(time.monotonic() - started, 1.0, f"{why}: refused at once, not queued")
        # Half the pool stays free for requests that never leave this server.
        self.assertEqual(srv.request("GET", "/health", timeout=2)[0], 200)
        peer.answer_all()
        self.assertEqual(a.result(), (200, {"peer": "answered"}))
        self.assertEqual(b.result(), (200, {"peer": "answered"}))
        wait_until(lambda: srv.metric("atrium_budget_in_use", {"budget": "outbound"}) == 0,
                   what="outbound slots returned")

    def test_a_slot_goes_back_when_the_answer_is_queued_not_after_its_last_byte(self):
        # A client asking one thing after the other must never meet its own last slot: the
        # last byte reaches it before libmicrohttpd's completed callback runs (a flake in
        # test_appservice.py once: protocols, then protocol/irc, 429).
        srv = self.server()
        peer = PeerThatNeverAnswers()
        self.addCleanup(peer.close)
        in_use = lambda: srv.metric("atrium_budget_in_use", {"budget": "outbound"})  # noqa: E731
        s = raw_connect(srv.port, rcvbuf=16384)
        self.addCleanup(s.close)
        s.sendall(f"GET /_test/outbound?port={peer.port}&bytes={HoldTest.BIG} HTTP/1.1\r\n"
                  "Host: x\r\nX-Forwarded-For: 10.2.0.1\r\n\r\n".encode())
        wait_until(lambda: len(peer.accepted) == 1, what="the request waiting on the peer")
        self.assertEqual(in_use(), 1)
        peer.answer_all()
        status, _, rest = read_head(s)
        self.assertEqual(status, 200)
        # The client has read nothing of the body: most of it is unsent, the slot is back.
        wait_until(lambda: in_use() == 0, what="the slot back while the body is unsent")
        second = Background(srv.json, "GET", f"/_test/outbound?port={peer.port}",
                            headers={"X-Forwarded-For": "10.2.0.1"}, timeout=30)
        wait_until(lambda: len(peer.accepted) == 2, what="the same client's next request waiting")
        peer.answer_all()
        self.assertEqual(second.result(), (200, {"peer": "answered"}))
        received = len(rest)
        while received < HoldTest.BIG:
            chunk = s.recv(1 << 20)
            self.assertTrue(chunk, "the first body was cut off")
            received += len(chunk)


class RateLimitTest(AtriumTestCase):
    def test_a_request_run_twice_is_counted_once_and_the_refusal_says_when_to_retry(self):
        srv = self.start_server(plugins=with_testplug(), settings={"ratelimit": {"enabled": True}})
        # Burst 2: two requests that each run their handler twice (once on the pool) pass.
        self.assertEqual(srv.json("GET", "/_test/limited?via_pool=1"), (200, {"allowed": True}))
        self.assertEqual(srv.json("GET", "/_test/limited?via_pool=1"), (200, {"allowed": True}))
        status, headers, data = srv.request("GET", "/_test/limited")
        self.assertEqual(status, 429, data)
        self.assertIn(b'"retry_after_ms"', data)
        self.assertGreaterEqual(int(headers.get("Retry-After")), 1)

    def test_rate_limits_can_be_switched_off(self):
        srv = shared_server(self)  # {"ratelimit": {"enabled": False}}
        for _ in range(5):
            self.assertEqual(srv.json("GET", "/_test/limited")[0], 200)


if __name__ == "__main__":
    unittest.main()
