"""The media plugin's uploads and downloads: byte-for-byte round trips, the headers of
success and failure, media ID validation, tokens, HEAD, ranges and conditional requests,
the upload limit, asynchronous uploads, the legacy paths, and trust and safety (quarantine,
the admin API, verification of originals).

Tests on the default settings share the module's one server (media_server(shared="module")):
each uses users and media of its own and counts from the values before it; a test with
settings of its own, or one that measures the process or counts everything, has its own.
"""

import http.client
import json
import os
import subprocess
import time
import unittest
from urllib.parse import quote

from common import AtriumTestCase, Background, wait_until
from harness import Server, ServerError, atrium_bin, psql
from media_support import (download_path, logout, media_server, original_file, png, register,
                           sha256, store_files, thumbnail_path, upload)

CSP = ("sandbox; default-src 'none'; script-src 'none'; plugin-types application/pdf; "
       "style-src 'unsafe-inline'; object-src 'self';")


def vm_hwm_kib(pid):
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM")


class MediaTestCase(AtriumTestCase):
    def assert_error(self, response, status, errcode):
        got_status, headers, body = response
        self.assertEqual(got_status, status, body[:300])
        self.assertEqual(json.loads(body)["errcode"], errcode, body[:300])
        self.assertEqual(headers.get("Cache-Control"), "no-store", "failures are never cached")
        return json.loads(body)


class RoundTripTest(MediaTestCase):
    def test_upload_round_trips_byte_for_byte_with_its_sha256_as_etag(self):
        srv = media_server(self, shared="module")
        user, token = register(srv)
        uploads0 = srv.metric("atrium_media_uploads_total") or 0
        data = os.urandom(300_000)
        media_id = upload(srv, token, data, "application/x-test")
        self.assertEqual(len(media_id), 24)
        status, headers, body = srv.request("GET", download_path(srv, media_id), token=token)
        self.assertEqual(status, 200)
        self.assertEqual(body, data)
        self.assertEqual(sha256(body), sha256(data))
        self.assertEqual(headers.get("ETag"), f'"{sha256(data)}"')
        self.assertEqual(headers.get("Content-Type"), "application/x-test")
        with open(original_file(srv, media_id), "rb") as f:
            self.assertEqual(f.read(), data, "the original on disk is the upload")
        row = psql(f"SELECT user_id, sha256, size_bytes FROM media_local WHERE media_id = '{media_id}'",
                   srv.database)
        self.assertEqual(row, [[user, sha256(data), str(len(data))]])
        self.assertEqual(srv.metric("atrium_media_uploads_total") - uploads0, 1)

    def test_an_upload_streams_to_disk_instead_of_into_memory(self):
        size = 40 * 1024 * 1024
        srv = media_server(self, media={"max_upload_size": size})
        _, token = register(srv)
        before = vm_hwm_kib(srv.pid)
        data = os.urandom(size)
        media_id = upload(srv, token, data, timeout=120)
        grown_mib = (vm_hwm_kib(srv.pid) - before) / 1024
        # Held in memory, the upload alone would add 40 MiB. Under ASan the quarantine keeps
        # freed read buffers resident for a while, which added up to 16 MiB with four tests
        # side by side; 28 MiB leaves that room and still catches a buffered upload.
        self.assertLess(grown_mib, 28, f"peak memory grew {grown_mib:.0f} MiB for a 40 MiB upload")
        self.assertEqual(os.path.getsize(original_file(srv, media_id)), size)
        status, _, body = srv.request("GET", download_path(srv, media_id), token=token, timeout=60)
        self.assertEqual((status, sha256(body)), (200, sha256(data)))

    def test_an_empty_upload_is_stored_and_served(self):
        srv = media_server(self, shared="module")
        _, token = register(srv)
        media_id = upload(srv, token, b"", "text/plain")
        status, headers, body = srv.request("GET", download_path(srv, media_id), token=token)
        self.assertEqual((status, body), (200, b""))
        self.assertEqual(headers.get("Content-Length"), "0")


class HeadersTest(MediaTestCase):
    def test_success_headers_and_the_disposition_rules(self):
        srv = media_server(self, shared="module")
        _, token = register(srv)
        image = upload(srv, token, png(8, 8), "image/png", "cat photo.png")
        html = upload(srv, token, b"<script>alert(1)</script>", "text/html")
        quoted = upload(srv, token, b"x", "text/plain; charset=utf-8", 'say "hi"\\.txt')
        unicode_name = upload(srv, token, b"y", "application/pdf", "résumé 履歴書.pdf")
        cases = [
            (download_path(srv, image), "image/png", 'inline; filename="cat photo.png"'),
            (download_path(srv, image, "other.png"), "image/png", 'inline; filename="other.png"'),
            (download_path(srv, html), "text/html", "attachment"),
            (download_path(srv, quoted), "text/plain; charset=utf-8",
             'inline; filename="say \\"hi\\"\\\\.txt"'),
            (download_path(srv, unicode_name), "application/pdf",
             "attachment; filename*=utf-8''r%C3%A9sum%C3%A9%20%E5%B1%A5%E6%AD%B4%E6%9B%B8.pdf"),
        ]
        for path, content_type, disposition in cases:
            with self.subTest(path=path):
                status, headers, _ = srv.request("GET", path, token=token)
                self.assertEqual(status, 200)
                self.assertEqual(headers.get("Content-Type"), content_type)
                self.assertEqual(headers.get("Content-Disposition"), disposition)
                self.assertEqual(headers.get("Content-Security-Policy"), CSP)
                self.assertEqual(headers.get("Cross-Origin-Resource-Policy"), "cross-origin")
                self.assertEqual(headers.get("Cache-Control"), "private, max-age=86400")
                self.assertEqual(headers.get("Accept-Ranges"), "bytes")
                self.assertEqual(headers.get("X-Content-Type-Options"), "nosniff")
                self.assertIsNotNone(headers.get("ETag"))
                self.assertEqual(headers.get("Access-Control-Allow-Origin"), "*")

    def test_unknown_media_is_404_not_found_and_not_cached(self):
        srv = media_server(self, shared="module")
        _, token = register(srv)
        response = srv.request("GET", download_path(srv, "NoSuchMediaHere"), token=token)
        self.assert_error(response, 404, "M_NOT_FOUND")
        self.assertIsNone(response[1].get("ETag"))
        self.assertIsNone(response[1].get("Content-Disposition"))

    def test_head_answers_the_headers_without_a_body(self):
        srv = media_server(self, shared="module")
        _, token = register(srv)
        data = os.urandom(12345)
        media_id = upload(srv, token, data, "image/png")
        status, headers, body = srv.request("HEAD", download_path(srv, media_id), token=token)
        self.assertEqual((status, body), (200, b""))
        self.assertEqual(headers.get("Content-Length"), "12345")
        self.assertEqual(headers.get("ETag"), f'"{sha256(data)}"')
        self.assertEqual(headers.get("Content-Type"), "image/png")


class HotFileTest(MediaTestCase):
    """The fast path of a file downloaded again and again: corked responses on a kept-alive
    connection, and the open-file cache (plugins/media/fdcache.c)."""

    def test_kept_alive_downloads_follow_each_other_without_a_stall(self):
        srv = media_server(self, shared="module")
        _, token = register(srv)
        data = os.urandom(100_000)
        media_id = upload(srv, token, data)
        auth = {"Authorization": f"Bearer {token}"}
        conn = http.client.HTTPConnection(srv.host, srv.port, timeout=10)
        self.addCleanup(conn.close)
        started = time.monotonic()
        for i in range(30):
            # A corked response whose cork stayed on would hold its last partial packet
            # for 200 ms: 30 of them at least 6 s. HEAD and ranges between them must not
            # inherit anything from the response before.
            conn.request("GET", download_path(srv, media_id), headers=auth)
            resp = conn.getresponse()
            self.assertEqual((resp.status, resp.read()), (200, data), f"download {i}")
            self.assertEqual(resp.headers.get("Content-Length"), "100000")
            conn.request("HEAD", download_path(srv, media_id), headers=auth)
            resp = conn.getresponse()
            self.assertEqual((resp.status, resp.read()), (200, b""))
            conn.request("GET", download_path(srv, media_id), headers={**auth, "Range": "bytes=10-19"})
            resp = conn.getresponse()
            self.assertEqual((resp.status, resp.read()), (206, data[10:20]))
        self.assertLess(time.monotonic() - started, 3.0, "90 answers on one connection")

    def test_a_file_deleted_or_replaced_on_disk_is_never_served_from_an_open_descriptor(self):
        srv = media_server(self, shared="module")
        _, token = register(srv)
        first, second = os.urandom(5000), os.urandom(5000)
        media_id = upload(srv, token, first)
        path = original_file(srv, media_id)
        for _ in range(3):  # served, and its descriptor kept for the next request
            self.assertEqual(srv.request("GET", download_path(srv, media_id), token=token)[2], first)
        os.unlink(path)
        self.assert_error(srv.request("GET", download_path(srv, media_id), token=token), 404,
                          "M_NOT_FOUND")
        with open(path, "wb") as f:  # back under its name, other bytes
            f.write(second)
        self.assertEqual(srv.request("GET", download_path(srv, media_id), token=token)[2], second)
        with open(path + ".new", "wb") as f:
            f.write(first)
        os.replace(path + ".new", path)  # renamed over the file a descriptor may still hold
        self.assertEqual(srv.request("GET", download_path(srv, media_id), token=token)[2], first)


class RangeAndConditionalTest(MediaTestCase):
    def test_ranges_give_206_416_or_the_whole_body(self):
        srv = media_server(self, shared="module")
        _, token = register(srv)
        data = bytes(range(256)) * 40  # 10240 bytes
        media_id = upload(srv, token, data, "video/mp4")
        path = download_path(srv, media_id)
        etag = f'"{sha256(data)}"'
        cases = [  # Range, If-Range, status, body, Content-Range
            ("bytes=0-9", None, 206, data[:10], "bytes 0-9/10240"),
            ("bytes=10000-", None, 206, data[10000:], "bytes 10000-10239/10240"),
            ("bytes=-5", None, 206, data[-5:], "bytes 10235-10239/10240"),
            ("bytes=10200-99999", None, 206, data[10200:], "bytes 10200-10239/10240"),
            ("bytes=0-1,5-6", None, 200, data, None),  # several ranges: the whole body
            ("bytes=9-2", None, 200, data, None),      # invalid: ignored
            ("bytes=0-9", etag, 206, data[:10], "bytes 0-9/10240"),
            ("bytes=0-9", '"something-else"', 200, data, None),
        ]
        for rng, if_range, status, body, content_range in cases:
            with self.subTest(range=rng, if_range=if_range):
                headers = {"Range": rng}
                if if_range:
                    headers["If-Range"] = if_range
                got, hdrs, got_body = srv.request("GET", path, token=token, headers=headers)
                self.assertEqual(got, status)
                self.assertEqual(got_body, body)
                self.assertEqual(hdrs.get("Content-Range"), content_range)
        response = srv.request("GET", path, token=token, headers={"Range": "bytes=10240-"})
        self.assert_error(response, 416, "M_UNKNOWN")
        self.assertEqual(response[1].get("Content-Range"), "bytes */10240")

    def test_if_none_match_gives_304_only_to_an_authorized_request(self):
        srv = media_server(self, shared="module")
        _, token = register(srv)
        data = os.urandom(5000)
        media_id = upload(srv, token, data, "image/jpeg")
        path = download_path(srv, media_id)
        etag = f'"{sha256(data)}"'
        status, headers, body = srv.request("GET", path, token=token, headers={"If-None-Match": etag})
        self.assertEqual((status, body), (304, b""))
        self.assertEqual(headers.get("ETag"), etag)
        self.assertEqual(headers.get("Cache-Control"), "private, max-age=86400")
        status, _, _ = srv.request("GET", path, token=token, headers={"If-None-Match": f'W/{etag}, "x"'})
        self.assertEqual(status, 304, "weak comparison, lists")
        status, _, body = srv.request("GET", path, token=token, headers={"If-None-Match": '"other"'})
        self.assertEqual((status, body), (200, data))
        # Without a token the hash match is not confirmed: 401 before any 304.
        self.assert_error(srv.request("GET", path, headers={"If-None-Match": etag}), 401, "M_MISSING_TOKEN")


class IdentifierAndTokenTest(MediaTestCase):
    def test_bad_media_ids_and_server_names_are_refused(self):
        srv = media_server(self, shared="module")
        _, token = register(srv)
        secret = os.path.join(srv.dir, "homeserver.yaml")
        bad_ids = ["..%2F..%2Fhomeserver.yaml", "a.b", "a%20b", "%2E%2E", "x" * 256, "caf%C3%A9",
                   "a%00b"]
        for media_id in bad_ids:
            for path in (f"/_matrix/client/v1/media/download/localhost/{media_id}",
                         f"/_matrix/client/v1/media/thumbnail/localhost/{media_id}?width=32&height=32"):
                with self.subTest(path=path):
                    status, _, body = srv.request("GET", path, token=token)
                    self.assertIn(status, (400, 404), body)
                    self.assertNotIn(b"server_name", body, "no file outside the store is served")
                    if status == 400:
                        self.assertEqual(json.loads(body)["errcode"], "M_INVALID_PARAM")
        self.assert_error(srv.request("GET", "/_matrix/client/v1/media/download/bad%20server/abc",
                                      token=token), 400, "M_INVALID_PARAM")
        self.assert_error(srv.request("GET", download_path(srv, "a.b"), token=token), 400, "M_INVALID_PARAM")
        self.assertTrue(os.path.exists(secret))
        # Media of another server is fetched (tests/integration/test_media_remote.py); an
        # origin that cannot be reached is 502, and allow_remote=false never asks it.
        self.assert_error(srv.request("GET", "/_matrix/client/v1/media/download/example.org/abc",
                                      token=token, timeout=30), 502, "M_UNKNOWN")
        self.assert_error(srv.request("GET", "/_matrix/client/v1/media/download/example.org/abc"
                                      "?allow_remote=false", token=token), 404, "M_NOT_FOUND")

    def test_missing_unknown_and_revoked_tokens_get_401(self):
        srv = media_server(self, shared="module")
        _, token = register(srv)
        files0 = store_files(srv)
        media_id = upload(srv, token, b"hello", "text/plain")
        paths = [download_path(srv, media_id), thumbnail_path(srv, media_id, 32, 32),
                 "/_matrix/client/v1/media/config"]
        for path in paths:
            with self.subTest(path=path):
                self.assert_error(srv.request("GET", path), 401, "M_MISSING_TOKEN")
                self.assert_error(srv.request("GET", path, token="not-a-token"), 401, "M_UNKNOWN_TOKEN")
        self.assert_error(srv.request("POST", "/_matrix/media/v3/upload", body=b"x"), 401, "M_MISSING_TOKEN")
        self.assert_error(srv.request("POST", "/_matrix/media/v1/create", body={}), 401, "M_MISSING_TOKEN")
        # The deprecated query-string token still works (spec v1.19).
        status, _, body = srv.request("GET", download_path(srv, media_id) + f"?access_token={token}")
        self.assertEqual((status, body), (200, b"hello"))
        logout(srv, token)
        self.assert_error(srv.request("GET", download_path(srv, media_id), token=token), 401, "M_UNKNOWN_TOKEN")
        self.assert_error(srv.request("POST", "/_matrix/media/v3/upload", body=b"x", token=token),
                          401, "M_UNKNOWN_TOKEN")
        self.assertEqual(sorted(set(store_files(srv)) - set(files0)),
                         [os.path.relpath(original_file(srv, media_id), srv.store)],
                         "refused uploads leave no file")

    def test_config_names_the_upload_limit_to_an_authenticated_client(self):
        srv = media_server(self, media={"max_upload_size": 1234567})
        _, token = register(srv)
        for path in ("/_matrix/client/v1/media/config", "/_matrix/media/v3/config"):
            self.assertEqual(srv.json("GET", path, token=token), (200, {"m.upload.size": 1234567}))


class SettingsTest(MediaTestCase):
    def start_expecting_failure(self, media):
        srv = Server(plugins={"media": {"enabled": True, **media}}, start=False)
        self.addCleanup(srv.close)
        with self.assertRaises(ServerError):
            srv.start(timeout=20)
        return srv.log_text()

    def test_unknown_or_malformed_media_settings_stop_start_up_with_the_reason(self):
        log = self.start_expecting_failure({"delivery_slot": 4})
        self.assertIn("plugins.media.delivery_slot", log)
        self.assertIn("delivery_slots", log, "a suggestion")
        log = self.start_expecting_failure({"thumbnail_sizes": "32x32 zoom"})
        self.assertIn('plugins.media.thumbnail_sizes: size 32x32 needs a method, "crop" or "scale"', log)
        log = self.start_expecting_failure({"delivery_slots": 0})
        self.assertIn("plugins.media.delivery_slots", log)


class UploadLimitTest(MediaTestCase):
    def test_an_upload_over_the_limit_is_413_and_leaves_no_file(self):
        srv = media_server(self, media={"max_upload_size": 100_000})
        _, token = register(srv)
        # Declared too large: refused before the body.
        response = srv.request("POST", "/_matrix/media/v3/upload", body=os.urandom(100_001), token=token)
        self.assert_error(response, 413, "M_TOO_LARGE")
        # Not declared (chunked): refused while streaming, the partial file gone with it.
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
        conn.putrequest("POST", "/_matrix/media/v3/upload")
        conn.putheader("Authorization", f"Bearer {token}")
        conn.putheader("Transfer-Encoding", "chunked")
        conn.endheaders()
        try:
            for _ in range(30):
                chunk = os.urandom(16_384)
                conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            conn.send(b"0\r\n\r\n")
        except OSError:
            pass  # the server may close once it has answered
        resp = conn.getresponse()
        body = resp.read()
        conn.close()
        self.assertEqual(resp.status, 413, body)
        self.assertEqual(json.loads(body)["errcode"], "M_TOO_LARGE")
        self.assertEqual(store_files(srv), [], "no partial file, named or not")
        self.assertEqual(psql("SELECT count(*) FROM media_local", srv.database), [["0"]])
        # Exactly at the limit is fine.
        media_id = upload(srv, token, os.urandom(100_000))
        self.assertEqual(os.path.getsize(original_file(srv, media_id)), 100_000)


class AsyncUploadTest(MediaTestCase):
    def test_create_then_put_wakes_a_waiting_download(self):
        srv = media_server(self, shared="module")
        _, token = register(srv)
        status, created = srv.json("POST", "/_matrix/media/v1/create", {}, token=token)
        self.assertEqual(status, 200, created)
        media_id = created["content_uri"].rsplit("/", 1)[1]
        self.assertGreater(created["unused_expires_at"], time.time() * 1000 + 23 * 3600 * 1000)
        # Not uploaded yet: a short wait ends in 504, retry-friendly.
        started = time.monotonic()
        self.assert_error(srv.request("GET", download_path(srv, media_id) + "?timeout_ms=300", token=token),
                          504, "M_NOT_YET_UPLOADED")
        self.assertLess(time.monotonic() - started, 3)
        self.assert_error(srv.request("GET", thumbnail_path(srv, media_id, 32, 32, extra="&timeout_ms=0"),
                                      token=token), 504, "M_NOT_YET_UPLOADED")
        # A longer wait is answered as soon as the PUT lands, holding no thread meanwhile.
        waiting = Background(srv.request, "GET", download_path(srv, media_id) + "?timeout_ms=15000",
                             token=token, timeout=30)
        wait_until(lambda: srv.metric("atrium_http_parked") == 1, what="download parked")
        data = os.urandom(4096)
        status, headers, body = srv.request("PUT", f"/_matrix/media/v3/upload/localhost/{media_id}?filename=a.bin",
                                            body=data, token=token, headers={"Content-Type": "image/png"})
        self.assertEqual((status, json.loads(body)), (200, {}))
        landed = time.monotonic()
        status, headers, body = waiting.result()
        self.assertEqual((status, body), (200, data))
        self.assertLess(waiting.finished_at - landed, 1.5, "woken by the upload, not by polling")
        self.assertEqual(headers.get("Content-Disposition"), 'inline; filename="a.bin"')

    def test_waiting_for_uploads_may_take_at_most_half_the_delivery_slots(self):
        # One client takes both slots here: no per-client share of the line.
        srv = media_server(self, media={"delivery_slots": 2},
                           settings={"server": {"http": {"line_share_per_client_percent": 100}}})
        _, token = register(srv)
        ready = upload(srv, token, b"already here", "text/plain")
        status, created = srv.json("POST", "/_matrix/media/v1/create", {}, token=token)
        media_id = created["content_uri"].rsplit("/", 1)[1]
        path = download_path(srv, media_id) + "?timeout_ms=20000"
        first = Background(srv.request, "GET", path, token=token, timeout=30)
        wait_until(lambda: srv.metric("atrium_media_upload_waiters") == 1, what="one waits")
        started = time.monotonic()
        self.assert_error(srv.request("GET", path, token=token), 504, "M_NOT_YET_UPLOADED")
        self.assertLess(time.monotonic() - started, 2, "answered early, not after timeout_ms")
        self.assertEqual(srv.request("GET", download_path(srv, ready), token=token)[2], b"already here",
                         "the other slot still delivers")
        self.assertEqual(srv.request("PUT", f"/_matrix/media/v3/upload/localhost/{media_id}", body=b"late",
                                     token=token)[0], 200)
        self.assertEqual(first.result()[:3:2], (200, b"late"))
        wait_until(lambda: srv.metric("atrium_media_upload_waiters") == 0, what="the waiter counted out")

    def test_put_rules_overwrite_owner_unknown_and_the_pending_cap(self):
        srv = media_server(self, media={"max_pending_uploads": 2})
        _, token = register(srv)
        _, other = register(srv)
        ids = []
        for _ in range(2):
            status, created = srv.json("POST", "/_matrix/media/v1/create", {}, token=token)
            self.assertEqual(status, 200)
            ids.append(created["content_uri"].rsplit("/", 1)[1])
        status, body = srv.json("POST", "/_matrix/media/v1/create", {}, token=token)
        self.assertEqual((status, body["errcode"]), (429, "M_LIMIT_EXCEEDED"), "pending cap")
        put = f"/_matrix/media/v3/upload/localhost/{ids[0]}"
        self.assert_error(srv.request("PUT", put, body=b"mine", token=other), 403, "M_FORBIDDEN")
        self.assertEqual(srv.request("PUT", put, body=b"first", token=token)[0], 200)
        self.assert_error(srv.request("PUT", put, body=b"second", token=token), 409, "M_CANNOT_OVERWRITE_MEDIA")
        self.assertEqual(srv.request("GET", download_path(srv, ids[0]), token=token)[2], b"first")
        self.assert_error(srv.request("PUT", "/_matrix/media/v3/upload/localhost/NeverCreated",
                                      body=b"x", token=token), 404, "M_NOT_FOUND")
        psql(f"UPDATE media_local SET expires_ts = 1 WHERE media_id = '{ids[1]}'", srv.database)
        self.assert_error(srv.request("PUT", f"/_matrix/media/v3/upload/localhost/{ids[1]}",
                                      body=b"late", token=token), 404, "M_NOT_FOUND")
        self.assertEqual(srv.json("POST", "/_matrix/media/v1/create", {}, token=token)[0], 200,
                         "an upload and an expiry free the cap")


class LegacyPathsTest(MediaTestCase):
    def test_legacy_paths_are_frozen_unless_switched_on(self):
        srv = media_server(self, shared="module")
        _, token = register(srv)
        media_id = upload(srv, token, b"old media", "text/plain")
        self.assert_error(srv.request("GET", f"/_matrix/media/v3/download/localhost/{media_id}"),
                          404, "M_NOT_FOUND")
        self.assert_error(srv.request("GET", f"/_matrix/media/v3/thumbnail/localhost/{media_id}?width=8&height=8"),
                          404, "M_NOT_FOUND")

    def test_legacy_paths_serve_media_from_before_the_freeze_without_a_token(self):
        freeze = int(time.time() * 1000) + 3600 * 1000
        srv = media_server(self, media={"legacy_media": True, "legacy_freeze_ts": freeze})
        _, token = register(srv)
        old = upload(srv, token, png(40, 30), "image/png", "old.png")
        new = upload(srv, token, b"new media", "text/plain")
        psql(f"UPDATE media_local SET created_ts = {freeze} WHERE media_id = '{new}'", srv.database)
        status, headers, body = srv.request("GET", f"/_matrix/media/v3/download/localhost/{old}")
        self.assertEqual((status, body), (200, png(40, 30)))
        self.assertEqual(headers.get("Content-Disposition"), 'inline; filename="old.png"')
        status, headers, _ = srv.request("GET", f"/_matrix/media/v3/thumbnail/localhost/{old}?width=32&height=32&method=crop")
        self.assertEqual((status, headers.get("Content-Type")), (200, "image/webp"))
        self.assert_error(srv.request("GET", f"/_matrix/media/v3/download/localhost/{new}"), 404, "M_NOT_FOUND")
        status, _, body = srv.request("GET", download_path(srv, new), token=token)
        self.assertEqual((status, body), (200, b"new media"), "the authenticated path serves it")


class TrustAndSafetyTest(MediaTestCase):
    """The verification counts every original of its server: it has a server of its own."""

    def test_quarantine_by_id_and_by_hash_is_404_for_everyone(self):
        srv = media_server(self, shared="module")
        admin_id, admin = register(srv, admin=True)
        user_id, token = register(srv)
        refused0 = srv.metric("atrium_media_refused_quarantined_total") or 0
        data = png(50, 50)
        media_id = upload(srv, token, data, "image/png")
        twin = upload(srv, token, data, "image/png")  # the same bytes under another ID
        base = f"/_synapse/admin/v1/media"
        self.assert_error(srv.request("POST", f"{base}/quarantine/localhost/{media_id}", body={}, token=token),
                          403, "M_FORBIDDEN")
        self.assertEqual(srv.json("POST", f"{base}/quarantine/localhost/{media_id}", {}, token=admin), (200, {}))
        for path in (download_path(srv, media_id), thumbnail_path(srv, media_id, 32, 32)):
            self.assert_error(srv.request("GET", path, token=token), 404, "M_NOT_FOUND")
        self.assertEqual(srv.request("GET", download_path(srv, twin), token=token)[0], 200, "by ID only")
        status, info = srv.json("GET", f"{base}/localhost/{media_id}", token=admin)
        self.assertEqual(status, 200)
        self.assertEqual(info["media_info"]["quarantined_by"], admin_id)
        self.assertEqual(info["media_info"]["sha256"], sha256(data))
        self.assertEqual(srv.json("POST", f"{base}/unquarantine/localhost/{media_id}", {}, token=admin), (200, {}))
        self.assertEqual(srv.request("GET", download_path(srv, media_id), token=token)[2], data)
        # By content: every ID with these bytes.
        self.assertEqual(srv.json("POST", f"/_atrium/admin/v1/media/quarantine_hash/{sha256(data)}", {},
                                  token=admin), (200, {}))
        for mid in (media_id, twin):
            self.assert_error(srv.request("GET", download_path(srv, mid), token=token), 404, "M_NOT_FOUND")
        self.assertEqual(srv.metric("atrium_media_refused_quarantined_total") - refused0, 4)
        self.assertEqual(srv.json("POST", f"/_atrium/admin/v1/media/unquarantine_hash/{sha256(data)}", {},
                                  token=admin), (200, {}))
        self.assertEqual(srv.request("GET", download_path(srv, twin), token=token)[0], 200)

    def test_admin_lists_and_deletes_a_users_media(self):
        srv = media_server(self, shared="module")
        _, admin = register(srv, admin=True)
        user_id, token = register(srv)
        ids = [upload(srv, token, f"file {i}".encode(), "text/plain", f"f{i}.txt") for i in range(3)]
        status, page = srv.json("GET", f"/_synapse/admin/v1/users/{quote(user_id)}/media?limit=2", token=admin)
        self.assertEqual(status, 200, page)
        self.assertEqual(page["total"], 3)
        self.assertEqual(page["next_token"], 2)
        self.assertEqual([m["media_id"] for m in page["media"]], [ids[2], ids[1]], "newest first")
        self.assertEqual(page["media"][0]["upload_name"], "f2.txt")
        self.assertEqual(page["media"][0]["media_length"], 6)
        status, rest = srv.json("GET", f"/_synapse/admin/v1/users/{quote(user_id)}/media?from=2", token=admin)
        self.assertEqual([m["media_id"] for m in rest["media"]], [ids[0]])
        self.assertNotIn("next_token", rest)
        status, deleted = srv.json("DELETE", f"/_synapse/admin/v1/media/localhost/{ids[0]}", token=admin)
        self.assertEqual((status, deleted), (200, {"deleted_media": [ids[0]], "total": 1}))
        self.assertFalse(os.path.exists(original_file(srv, ids[0])))
        self.assert_error(srv.request("GET", download_path(srv, ids[0]), token=token), 404, "M_NOT_FOUND")
        self.assert_error(srv.request("DELETE", f"/_synapse/admin/v1/media/localhost/{ids[0]}", token=admin),
                          404, "M_NOT_FOUND")

    def test_verification_reports_an_original_that_no_longer_matches_its_hash(self):
        srv = media_server(self)
        _, admin = register(srv, admin=True)
        _, token = register(srv)
        good = upload(srv, token, b"good bytes")
        bad = upload(srv, token, b"bytes that will rot")
        gone = upload(srv, token, b"bytes that will vanish")
        status, report = srv.json("POST", "/_atrium/admin/v1/media/verify", {}, token=admin)
        self.assertEqual((status, report["checked"], report["problems"]), (200, 3, 0))
        with open(original_file(srv, bad), "r+b") as f:
            f.write(b"B")  # same size, other bytes
        os.unlink(original_file(srv, gone))
        status, report = srv.json("POST", "/_atrium/admin/v1/media/verify", {}, token=admin)
        self.assertEqual((status, report["checked"], report["problems"]), (200, 3, 2))
        problems = {d["media_id"]: d["problem"] for d in report["details"]}
        self.assertEqual(problems, {bad: "sha256", gone: "missing"})
        self.assertNotIn(good, problems)
        # The command-line check says the same, with a failing exit status.
        cli = os.path.join(os.path.dirname(atrium_bin()), "atrium-media-verify")
        out = subprocess.run([cli, "--conninfo", srv.conninfo, "--store", srv.store, "--json"],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 1, out.stderr)
        cli_report = json.loads(out.stdout)
        self.assertEqual({d["media_id"]: d["problem"] for d in cli_report["details"]}, problems)
        # And so does the subcommand that reads both settings from the server's config.
        out = subprocess.run([atrium_bin(), "verify-media", "--config", srv.config_path, "--json"],
                             capture_output=True, text=True, timeout=60, cwd=srv.dir)
        self.assertEqual(out.returncode, 1, out.stderr)
        self.assertEqual({d["media_id"]: d["problem"] for d in json.loads(out.stdout)["details"]},
                         problems)


if __name__ == "__main__":
    unittest.main()
