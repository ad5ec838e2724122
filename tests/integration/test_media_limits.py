"""Upload limits of the media plugin: the per-user upload rate is a configured token bucket
whose default takes a 150-image album sent 8 at a time without a refusal, and an optional
byte quota per user per sliding window (upload_quota_bytes, off by default) refuses with
400 M_RESOURCE_LIMIT_EXCEEDED an upload that would pass it, before its bytes are stored."""

import json
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor

from harness import AtriumTestCase, raw_connect, read_head
from media_support import media_server, register, store_files, upload

ALBUM_IMAGES = 150
ALBUM_CONCURRENCY = 8
RATE_ON = {"ratelimit": {"enabled": True}}


def try_upload(srv, token, data):
    status, _, body = srv.request("POST", "/_matrix/media/v3/upload", body=data, token=token,
                                  headers={"Content-Type": "image/jpeg"}, timeout=60)
    return status, json.loads(body)


class UploadRateTest(AtriumTestCase):
    def test_a_150_image_album_sent_8_at_a_time_is_never_refused_by_default(self):
        srv = media_server(self, settings=RATE_ON)
        _, token = register(srv)
        images = [os.urandom(2000 + i) for i in range(ALBUM_IMAGES)]
        with ThreadPoolExecutor(ALBUM_CONCURRENCY) as pool:
            results = list(pool.map(lambda d: try_upload(srv, token, d), images))
        refused = [r for r in results if r[0] != 200]
        self.assertEqual(refused, [], f"{len(refused)} of {ALBUM_IMAGES} refused")
        self.assertEqual(srv.metric("atrium_media_uploads_total"), ALBUM_IMAGES)

    def test_the_upload_bucket_is_configured_per_user(self):
        srv = media_server(self, settings=RATE_ON, media={
            "ratelimit_upload_per_minute": 1, "ratelimit_upload_burst": 3})
        _, alice = register(srv)
        _, bob = register(srv)
        for _ in range(3):
            self.assertEqual(try_upload(srv, alice, b"x")[0], 200)
        status, body = try_upload(srv, alice, b"x")
        self.assertEqual((status, body["errcode"]), (429, "M_LIMIT_EXCEEDED"))
        self.assertGreater(body["retry_after_ms"], 1000)
        self.assertEqual(try_upload(srv, bob, b"x")[0], 200, "another user has a bucket of his own")


class UploadQuotaTest(AtriumTestCase):
    def test_without_a_quota_a_user_uploads_as_much_as_he_likes(self):
        srv = media_server(self)
        _, token = register(srv)
        for _ in range(4):
            self.assertEqual(try_upload(srv, token, os.urandom(1_000_000))[0], 200)

    def test_an_upload_that_would_pass_the_quota_is_refused_and_leaves_nothing(self):
        srv = media_server(self, media={"upload_quota_bytes": 100_000,
                                        "upload_quota_window_ms": 3000})
        _, alice = register(srv)
        _, bob = register(srv)
        self.assertEqual(try_upload(srv, alice, os.urandom(60_000))[0], 200)
        files = store_files(srv)
        status, body = try_upload(srv, alice, os.urandom(60_000))
        self.assertEqual((status, body["errcode"]), (400, "M_RESOURCE_LIMIT_EXCEEDED"))
        # Without a Content-Length the chunk that passes the quota ends it.
        sock = raw_connect(srv.port)
        try:
            chunk = os.urandom(30_000)
            sock.sendall(b"POST /_matrix/media/v3/upload HTTP/1.1\r\nHost: x\r\n"
                         b"Authorization: Bearer " + alice.encode() + b"\r\n"
                         b"Content-Type: image/png\r\nTransfer-Encoding: chunked\r\n\r\n"
                         + (b"%x\r\n" % len(chunk) + chunk + b"\r\n") * 2 + b"0\r\n\r\n")
            status, _, rest = read_head(sock)
        except (ConnectionResetError, BrokenPipeError, socket.timeout) as e:
            self.fail(f"no answer to the chunked upload: {e}")
        finally:
            sock.close()
        self.assertEqual(status, 400)
        self.assertEqual(store_files(srv), files, "a refused upload leaves nothing behind")
        self.assertEqual(try_upload(srv, alice, os.urandom(30_000))[0], 200, "still under it")
        self.assertEqual(try_upload(srv, bob, os.urandom(90_000))[0], 200, "a quota per user")
        # The window slides: once the first upload is older than it, there is room again.
        time.sleep(3.2)
        self.assertEqual(try_upload(srv, alice, os.urandom(90_000))[0], 200)
