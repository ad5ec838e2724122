"""Delivery held to the last byte (docs/adr/0002-delivery-held-to-the-last-byte.md): the
slot is taken before authorization and held until the body's last byte or the client's
departure; JSON endpoints never wait; a full line answers 429; a gallery of 150 (and of 300
under `ulimit -n 256`) arrives whole; a storm of abandoned downloads gives every slot and
hold back."""

import json
import os
import select
import socket
import time
import unittest

from common import AtriumTestCase, Background, wait_until
from harness import read_head
from media_support import (download_path, get_many, logout, media_server, noise_png, raw_get,
                           register, solid_png, thumbnail_path, upload, webp_size)

LINE = {"line": "media.delivery"}
BIG_SIDE = 2400  # a 2400x2400 noise PNG (~17 MB) is its own thumbnail at full size


def reset_close(sock):
    """Close with a reset, as a client that vanishes mid-body."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()


class DeliveryTestCase(AtriumTestCase):
    def hold_a_slot(self, srv, token, media_id):
        """A thumbnail whose client reads slowly: returns its socket once the headers came."""
        sock = raw_get(srv, thumbnail_path(srv, media_id, BIG_SIDE, BIG_SIDE), token=token, rcvbuf=16384)
        self.addCleanup(sock.close)
        status, head, _ = read_head(sock)
        self.assertEqual(status, 200, head)
        return sock

    def assert_success_headers(self, headers):
        self.assertEqual(headers.get("Cache-Control"), "private, max-age=86400")
        self.assertEqual(headers.get("Cross-Origin-Resource-Policy"), "cross-origin")
        self.assertTrue(headers.get("Content-Security-Policy", "").startswith("sandbox;"))
        self.assertIsNotNone(headers.get("ETag"))
        self.assertTrue(headers.get("Content-Disposition", "").startswith("inline"))


class SlotHeldThroughTheBodyTest(DeliveryTestCase):
    def test_a_slow_thumbnail_body_holds_the_one_slot_until_its_client_leaves(self):
        srv = media_server(self, media={"delivery_slots": 1, "delivery_queue": 1})
        _, token = register(srv)
        big = upload(srv, token, noise_png(BIG_SIDE, BIG_SIDE), "image/png", timeout=120)
        small = upload(srv, token, solid_png(300, 300, 1), "image/png")
        slow = self.hold_a_slot(srv, token, big)
        second = Background(srv.request, "GET", thumbnail_path(srv, small, 96, 96, "crop"),
                            token=token, timeout=30)
        wait_until(lambda: srv.metric("atrium_line_waiting", LINE) == 1, what="the second waits")
        # What is not media content passes meanwhile.
        self.assertEqual(srv.request("GET", "/health", timeout=2)[0], 200)
        self.assertEqual(srv.json("GET", "/_matrix/client/v1/media/config", token=token, timeout=2)[0], 200)
        self.assertEqual(srv.json("GET", "/_matrix/client/versions", timeout=2)[0], 200)
        # Past the line: refused at once, retry-friendly.
        status, headers, body = srv.request("GET", download_path(srv, small), token=token, timeout=5)
        self.assertEqual(status, 429, body)
        self.assertEqual(json.loads(body)["errcode"], "M_LIMIT_EXCEEDED")
        self.assertEqual(json.loads(body)["retry_after_ms"], 1000)
        self.assertEqual(headers.get("Retry-After"), "1")
        self.assertEqual(headers.get("Cache-Control"), "no-store")
        time.sleep(0.5)
        self.assertFalse(second.done(), "the waiter must not enter while the body is unsent")
        self.assertEqual(srv.metric("atrium_media_delivering"), 1)
        self.assertEqual(srv.metric("atrium_line_in_use", LINE), 1)
        reset_close(slow)  # the first client goes away mid-body
        status, headers, body = second.result()
        self.assertEqual(status, 200, body[:200])
        self.assertEqual(webp_size(body), (96, 96))
        wait_until(lambda: srv.metric("atrium_media_delivering") == 0, what="slot given back")
        self.assertEqual(srv.metric("atrium_line_in_use", LINE), 0)
        self.assertEqual(srv.metric("atrium_line_waiting", LINE), 0)


class AuthorizationAfterAdmissionTest(DeliveryTestCase):
    def test_thirty_thumbnails_through_two_slots_are_authorized_at_most_two_at_a_time(self):
        srv = media_server(self, media={"delivery_slots": 2})
        _, token = register(srv)
        ids = [upload(srv, token, solid_png(100 + i, 100, i), "image/png") for i in range(30)]
        results = get_many(srv, [thumbnail_path(srv, m, 96, 96, "crop") for m in ids], token, concurrency=30)
        for status, headers, body in results:
            self.assertEqual(status, 200, body[:200])
            self.assertEqual(headers.get("Content-Type"), "image/webp")
            self.assert_success_headers(headers)
            self.assertEqual(webp_size(body), (96, 96))
        self.assertEqual(srv.metric("atrium_media_authorizations_total"), 30, "every request checked")
        peak = srv.metric("atrium_media_authorizing_peak")
        self.assertGreaterEqual(peak, 1)
        self.assertLessEqual(peak, 2, "never more authorizations at once than slots")
        self.assertEqual(srv.metric("atrium_media_delivering"), 0)

    def test_a_token_revoked_while_its_request_waits_is_refused_when_admitted(self):
        srv = media_server(self, media={"delivery_slots": 1})
        _, token = register(srv)
        _, other = register(srv)
        big = upload(srv, token, noise_png(BIG_SIDE, BIG_SIDE), "image/png", timeout=120)
        small = upload(srv, token, b"small", "text/plain")
        slow = self.hold_a_slot(srv, token, big)
        waiting = Background(srv.request, "GET", download_path(srv, small), token=other, timeout=30)
        wait_until(lambda: srv.metric("atrium_line_waiting", LINE) == 1, what="it waits")
        self.assertEqual(srv.metric("atrium_media_authorizations_total"), 1, "not authorized while waiting")
        logout(srv, other)
        reset_close(slow)
        status, headers, body = waiting.result()
        self.assertEqual(status, 401, body)
        self.assertEqual(json.loads(body)["errcode"], "M_UNKNOWN_TOKEN")
        self.assertIn("no-store", headers.get_all("Cache-Control"))


class GalleryTest(DeliveryTestCase):
    def upload_gallery(self, srv, token, n):
        return [upload(srv, token, solid_png(100 + i % 50, 100 + i // 50, i), "image/png") for i in range(n)]

    def assert_all_valid(self, results, expected_sizes):
        for (status, headers, body), size in zip(results, expected_sizes):
            self.assertEqual(status, 200, body[:200])
            self.assertEqual(webp_size(body), size)
            self.assert_success_headers(headers)

    def test_a_gallery_of_150_thumbnails_requested_at_once_arrives_whole(self):
        srv = media_server(self)
        _, token = register(srv)
        ids = self.upload_gallery(srv, token, 150)
        results = get_many(srv, [thumbnail_path(srv, m, 96, 96, "crop") for m in ids], token, concurrency=150)
        self.assert_all_valid(results, [(96, 96)] * 150)
        self.assertEqual(srv.metric("atrium_media_renders_total", {"result": "ok"}), 150)

    def test_300_thumbnails_at_once_under_ulimit_256_all_arrive_without_descriptor_errors(self):
        srv = media_server(self, nofile=256)
        _, token = register(srv)
        ids = self.upload_gallery(srv, token, 150)
        paths = [thumbnail_path(srv, m, 96, 96, "crop") for m in ids] + \
                [thumbnail_path(srv, m, 32, 32, "crop") for m in ids]
        # Past the connection limit a request is refused with 503 + Retry-After rather than
        # left in the kernel's backlog (core/http/gate.c); the client comes back.
        busy = []
        results = get_many(srv, paths, token, concurrency=300, timeout=90, busy=busy)
        self.assert_all_valid(results, [(96, 96)] * 150 + [(32, 32)] * 150)
        for status, _, body in busy:
            self.assertEqual(json.loads(body)["errcode"], "M_UNKNOWN", body[:200])
        self.assertEqual(srv.metric("atrium_media_renders_total", {"result": "ok"}), 300)
        log = srv.log_text()
        for needle in ("Too many open files", "EMFILE", "media query failed", "database is busy",
                       "out of file descriptors"):
            self.assertNotIn(needle, log)
        self.assertEqual([line for line in log.splitlines() if " ERROR " in line], [])


class DisconnectStormTest(DeliveryTestCase):
    def test_200_downloads_abandoned_mid_body_give_every_slot_and_hold_back(self):
        # One client takes every slot here: no per-client share of the line.
        srv = media_server(self, settings={"server": {"http": {"line_share_per_client_percent": 100}}})
        _, token = register(srv)
        media_id = upload(srv, token, os.urandom(4 << 20), "video/mp4", timeout=60)
        # Served once first: the open-file cache then holds the file's descriptor (it keeps
        # it while the file is hot), which the storm must not add to.
        status, _, body = srv.request("GET", download_path(srv, media_id), token=token, timeout=30)
        self.assertEqual((status, len(body)), (200, 4 << 20))
        # The database pool may open connections during the storm (it grows as requests
        # need them) and keeps them: two descriptors each (libpq's socket and the pool's
        # duplicate to cut it), which are not the deliveries' and are left out.
        def fds():
            while True:  # a count the pool did not grow during
                pool = srv.metric("atrium_db_connections")
                n = len(os.listdir(f"/proc/{srv.pid}/fd"))
                if srv.metric("atrium_db_connections") == pool:
                    return n - 2 * int(pool)

        fds_before = fds()
        socks = [raw_get(srv, download_path(srv, media_id), token=token, rcvbuf=16384) for _ in range(200)]
        self.addCleanup(lambda: [s.close() for s in socks])
        wait_until(lambda: srv.metric("atrium_media_delivering") == 64, what="every slot taken")
        wait_until(lambda: srv.metric("atrium_line_waiting", LINE) == 136, what="the rest waiting")
        poller = select.poll()
        for s in socks:
            poller.register(s, select.POLLIN)
        receiving = lambda: len(poller.poll(0))  # noqa: E731
        wait_until(lambda: receiving() == 64, what="the admitted 64 mid-body")
        time.sleep(0.2)
        self.assertEqual(receiving(), 64, "the waiting ones were sent nothing")
        for s in socks:
            reset_close(s)
        wait_until(lambda: srv.metric("atrium_media_delivering") == 0, timeout=30, what="slots back")
        wait_until(lambda: srv.metric("atrium_line_waiting", LINE) == 0, timeout=30, what="line empty")
        self.assertEqual(srv.metric("atrium_line_in_use", LINE), 0)
        wait_until(lambda: srv.metric("atrium_http_holds") == 0, what="holds released")
        wait_until(lambda: fds() <= fds_before,
                   what="descriptors back to where they were")
        status, _, body = srv.request("GET", download_path(srv, media_id), token=token, timeout=30)
        self.assertEqual((status, len(body)), (200, 4 << 20))


if __name__ == "__main__":
    unittest.main()
