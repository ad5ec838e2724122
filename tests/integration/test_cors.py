"""CORS headers appear exactly once on every answer, whoever built it: a handler's success,
the router's 404 and 405, a handler's error, 401, 413 before the body, 429, the media
plugin's answers, and a deadline's 504 built while the handler still ran elsewhere. A
browser refuses a response whose Access-Control-Allow-Origin appears twice, so every
failure would become a network error for a web client."""

import os
import re

from common import AtriumTestCase, testplug
from harness import read_head, raw_connect
from media_support import download_path, register, upload

CORS_HEADERS = ("Access-Control-Allow-Origin", "Access-Control-Allow-Methods",
                "Access-Control-Allow-Headers", "Access-Control-Expose-Headers")


class CorsOnceTest(AtriumTestCase):
    def setUp(self):
        plugins = {"media": {"enabled": True, "store_path": None}}
        plugins.update(testplug(threads=1))

        def settings(tmp):
            plugins["media"]["store_path"] = os.path.join(tmp, "media_store")
            return {"registration": {"enabled": True}, "plugins": plugins,
                    "ratelimit": {"enabled": True},
                    "server": {"http": {"handoff_deadline_ms": 400}}}
        self.srv = self.start_server(settings=settings)

    def assert_cors_once(self, kind, response, status=None):
        got, headers, body = response
        if status is not None:
            self.assertEqual(got, status, f"{kind}: {body[:200]!r}")
        for name in CORS_HEADERS:
            values = headers.get_all(name) or []
            self.assertEqual(len(values), 1, f"{kind} ({got}): {name} appears {values}")
        self.assertEqual(headers.get("Access-Control-Allow-Origin"), "*", kind)

    def test_each_cors_header_appears_once_on_every_kind_of_answer(self):
        srv = self.srv
        self.assert_cors_once("success", srv.request("GET", "/_matrix/client/versions"), 200)
        self.assert_cors_once("preflight", srv.request("OPTIONS", "/_matrix/client/v3/login", headers={
            "Origin": "https://app.example", "Access-Control-Request-Method": "POST"}), 200)
        self.assert_cors_once("router 404", srv.request("GET", "/_matrix/client/v3/nothing"), 404)
        self.assert_cors_once("router 405", srv.request("DELETE", "/_matrix/client/versions"), 405)
        self.assert_cors_once("handler error", srv.request(
            "POST", "/_test/echo", body="{not json", headers={"Content-Type": "application/json"}), 400)
        self.assert_cors_once("413 before the body", srv.request(
            "POST", "/_test/echo", body={"x": "y" * 5000}), 413)
        self.assert_cors_once("401", srv.request("GET", "/_matrix/client/v3/account/whoami"), 401)
        self.assert_cors_once("401 bad token", srv.request(
            "GET", "/_matrix/client/v3/account/whoami", token="nope"), 401)
        for _ in range(2):
            srv.request("GET", "/_test/limited")
        self.assert_cors_once("429", srv.request("GET", "/_test/limited"), 429)
        self.assert_cors_once("504 at the deadline", srv.request(
            "GET", "/_test/handoff?sleep_ms=1500"), 504)

        _, token = register(srv)
        media_id = upload(srv, token, os.urandom(2000))
        self.assert_cors_once("media download", srv.request(
            "GET", download_path(srv, media_id), token=token), 200)
        self.assert_cors_once("media 404", srv.request(
            "GET", download_path(srv, "nosuchmediaidxxxxxxxxxxx"), token=token), 404)
        self.assert_cors_once("media 400", srv.request(
            "GET", download_path(srv, "bad%20id"), token=token), 400)
        self.assert_cors_once("media upload refused", srv.request(
            "POST", "/_matrix/media/v3/upload", body=b"x", headers={"Content-Type": "text/plain"}), 401)

    def test_libmicrohttpds_own_errors_carry_cors_once(self):
        # What libmicrohttpd refuses by itself - here a Content-Length that is no number on
        # the second request of a connection, which the gate does not see - is answered
        # with a Matrix error of ours (core/http/mhd_answers.c), CORS headers included.
        sock = raw_connect(self.srv.port)
        try:
            sock.sendall(b"GET /_matrix/client/versions HTTP/1.1\r\nHost: x\r\n\r\n")
            status, head, body = read_head(sock)
            self.assertEqual(status, 200)
            want = int(re.search(rb"(?i)\r\ncontent-length: *(\d+)", head).group(1))
            while len(body) < want:  # the rest of the first answer
                body += sock.recv(65536)
            sock.sendall(b"POST /_test/echo HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}")
            data = b""
            sock.settimeout(5)
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        finally:
            sock.close()
        self.assertTrue(data.startswith(b"HTTP/1.1 400 "), data[:300])
        self.assertEqual(data.count(b"HTTP/1.1 "), 1, "one answer, one header block")
        self.assertEqual(data.lower().count(b"access-control-allow-origin: *"), 1, data[:600])
        self.assertIn(b'"errcode":"M_UNKNOWN"', data)
