#!/usr/bin/env python3
"""The media/1 conformance suite: runs any media plugin in a real Atrium server against a
real PostgreSQL and checks what include/atrium/media.h promises.

    tests/conformance/media/conform.py PLUGIN.so [--name NAME] [--thumbnails yes|no]
                                       [--set KEY=VALUE ...] [--include DIR] [-v] [-k PATTERN]

NAME is the plugin's descriptor name (default: the file name without .so). --thumbnails
says which thumbnail behaviour the plugin declares: "yes" (a thumbnail of a PNG is an
image) or "no" (404 M_NOT_FOUND for every media). --set adds plugins.NAME settings (a
value is read as YAML: 12, true, text), for a plugin that needs them to behave as the
contract says (the stock plugin: remote_fetch_enabled=false, so another server's media is
404 here rather than fetched). --include names the folder holding atrium/media.h, whose
required routes are checked (default: $ATRIUM_INCLUDE_DIR, else the source tree's include/
when the suite runs from it, else /usr/local/include, /usr/include).

Self-contained: it needs only tests/conformance/ (this folder and conformance_harness.py
beside it), Python 3.9+, an atrium executable ($ATRIUM_BIN, else atrium on PATH) and a
PostgreSQL role that may create databases ($ATRIUM_TEST_PG_CONNINFO, a libpq conninfo
without dbname; tests/run.sh sets it). docs/plugins.md shows a plugin's CI running it.

What is checked (each test's name says it): the interface and the required routes;
uploads (SHA-256 round trip with Content-Length, chunked and empty bodies; streamed: bytes
on disk mid-body, flat memory; the limit exact, limit + 1 -> 413 both ways; no temporary
files after a 413, a 401 or a client that goes away; leftovers removed at start; a 401
before the body is sent); authentication of every endpoint; 404 with no-store; download
headers, HEAD, Range, ETag/304; the delivery bound (held to the last byte, freed on abort,
429 past the line, waiters admitted promptly, gauges back to 0, 503 to parked waiters at
shutdown, admission before authorization); the declared thumbnail behaviour; durability
across a restart; migrations applied once; metrics present and moving.
Exit status 0 when every check passed.
"""

import argparse
import hashlib
import json
import os
import re
import signal
import socket
import sys
import time
import unittest
from urllib.parse import quote

import struct
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/conformance/: the suites' own harness

from conformance_harness import (Background, ConformanceCase, deep_merge, raw_connect,  # noqa: E402
                                 read_head, register, sql)

OPTS = argparse.Namespace(plugin=None, name=None, thumbnails="yes", set=[], include=None)

LIMIT_BYTES = 4 * 1024 * 1024        # max_upload_size of the main server
STREAM_LIMIT_BYTES = 16 * 1024 * 1024  # of the delivery server (the streaming upload)
# Larger than the socket buffers can take (loopback autotunes the server's send buffer up
# to net.ipv4.tcp_wmem's maximum, 4 MiB by default): a slow reader blocks the response.
BIG_BYTES = 12 * 1024 * 1024
MEMORY_GROWTH_MAX_BYTES = 8 * 1024 * 1024  # a buffered 16 MiB body would pass this
CHUNK_BYTES = 64 * 1024
WAIT_S = 10


def yaml_value(text):
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if text in ("true", "false"):
        return text == "true"
    return text


def plugin_conf(tmp, **extra):
    conf = {"enabled": True, "path": OPTS.plugin, "store_path": os.path.join(tmp, "store")}
    for item in OPTS.set:
        key, _, value = item.partition("=")
        conf[key] = yaml_value(value)
    conf.update(extra)
    return conf


def start(case, media=None, settings=None):
    """A server with registration open and only the plugin under test loaded."""
    def build(tmp):
        out = {"registration": {"enabled": True},
               "plugins": {OPTS.name: plugin_conf(tmp, **(media or {}))}}
        return deep_merge(out, settings or {})
    srv = case.start_server(settings=build)
    srv.store = os.path.join(srv.dir, "store")
    return srv


def sha(data):
    return hashlib.sha256(data).hexdigest()


def solid_png(width, height, index):
    """A PNG of one colour picked by index."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I",
                                                                        zlib.crc32(kind + data))
    colour = bytes([(index * 37) % 256, (index * 91 + 13) % 256, (index // 7 * 53 + 101) % 256])
    rows = (b"\x00" + colour * width) * height
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(rows))
            + chunk(b"IEND", b""))


def media_header():
    """The text of atrium/media.h: from --include, $ATRIUM_INCLUDE_DIR, the source tree
    this suite sits in, or the usual install folders."""
    tree = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(HERE))), "include")
    for folder in (OPTS.include, os.environ.get("ATRIUM_INCLUDE_DIR"), tree,
                   "/usr/local/include", "/usr/include"):
        path = os.path.join(folder or "", "atrium", "media.h")
        if folder and os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                return f.read()
    raise AssertionError("atrium/media.h not found: pass --include DIR (the folder holding "
                         "atrium/) or set ATRIUM_INCLUDE_DIR")


def line_labels():
    return {"line": f"{OPTS.name}.delivery"}


def wait_until(predicate, what, timeout=WAIT_S):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


# ---- HTTP on raw sockets: bodies sent as the test wants, answers read whatever happens ----

def raw_request(srv, method, path, headers=None, body=b"", chunked=False, token=None,
                send_body=True, timeout=30):
    """(status, {lower-case header: value}, body). The body is sent with Content-Length,
    or chunked; a server that answers early and closes is fine (the rest is dropped)."""
    sock = raw_connect(srv.port, timeout=timeout)
    try:
        lines = [f"{method} {path} HTTP/1.1", "Host: conformance"]
        if token:
            lines.append(f"Authorization: Bearer {token}")
        for k, v in (headers or {}).items():
            lines.append(f"{k}: {v}")
        lines.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(body)}")
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        if send_body:
            try:
                for i in range(0, len(body), CHUNK_BYTES):
                    part = body[i:i + CHUNK_BYTES]
                    sock.sendall(b"%x\r\n%s\r\n" % (len(part), part) if chunked else part)
                if chunked:
                    sock.sendall(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass  # answered before the whole body: read that answer
        try:
            return read_response(sock)
        except socket.timeout:
            raise AssertionError(f"{method} {path}: no answer within {timeout}s"
                                 + ("" if send_body else " while the body was not sent")) from None
    finally:
        sock.close()


def read_response(sock):
    status, head, rest = read_head(sock)
    headers = {}
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    want = int(headers.get("content-length", "0"))
    while len(rest) < want:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        rest += chunk
    return status, headers, rest


def upload(srv, token, data, content_type="application/octet-stream", filename=None,
           chunked=False):
    path = "/_matrix/media/v3/upload"
    if filename is not None:
        path += "?filename=" + quote(filename, safe="")
    status, _, body = raw_request(srv, "POST", path, {"Content-Type": content_type}, data,
                                  chunked=chunked, token=token)
    if status != 200:
        raise AssertionError(f"upload answered {status}: {body[:300]!r}")
    uri = json.loads(body)["content_uri"]
    prefix = f"mxc://{srv.server_name}/"
    assert uri.startswith(prefix), uri
    return uri[len(prefix):]


def download_path(srv, media_id, name=None):
    path = f"/_matrix/client/v1/media/download/{srv.server_name}/{media_id}"
    return f"{path}/{name}" if name else path


def thumbnail_path(srv, media_id):
    return (f"/_matrix/client/v1/media/thumbnail/{srv.server_name}/{media_id}"
            "?width=32&height=32&method=crop")


def store_files(srv):
    out = set()
    for root, _, files in os.walk(srv.store):
        for f in files:
            out.add(os.path.relpath(os.path.join(root, f), srv.store))
    return out


def open_store_files(srv, stored=()):
    """{fd: size} of the server's open descriptors on files under store_path (unnamed
    O_TMPFILE files included: their link still names the folder). Descriptors on files
    named in `stored` (paths relative to store_path, as store_files gives them: media
    stored and served before) are left out: a plugin may keep those open, as an open-file
    cache does. A refused or abandoned upload's file is never one of them."""
    store = os.path.realpath(srv.store)
    out = {}
    base = f"/proc/{srv.pid}/fd"
    for fd in os.listdir(base):
        try:
            target = os.readlink(f"{base}/{fd}")
            if target.startswith(store + "/") and \
                    os.path.relpath(target, store) not in stored:
                out[fd] = os.stat(f"{base}/{fd}").st_size
        except OSError:
            continue
    return out


def rss_bytes(srv):
    with open(f"/proc/{srv.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_QUOTED = r'"(?:[^"\\\x00-\x1f\x7f]|\\[\x20-\x7e])*"'
_EXT_VALUE = r"[A-Za-z0-9-]+'[A-Za-z-]*'[A-Za-z0-9%!#$&+.^_`|~-]*"
_DISPOSITION = re.compile(rf"^(inline|attachment)(\s*;\s*(filename=({_TOKEN}|{_QUOTED})|"
                          rf"filename\*={_EXT_VALUE}))*$")


def disposition_well_formed(value):
    """RFC 6266: a disposition type, then filename= as a token or a quoted-string (quotes
    and backslashes escaped), or filename*= as an RFC 8187 ext-value; nothing else."""
    return bool(_DISPOSITION.match(value))


def reset_close(sock):
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()


def raw_get(srv, path, token, rcvbuf=None):
    sock = raw_connect(srv.port, rcvbuf=rcvbuf, timeout=30)
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: conformance\r\n{auth}\r\n".encode())
    return sock


class Case(ConformanceCase):
    def assert_error(self, answer, status, errcode):
        got_status, headers, body = answer
        self.assertEqual(got_status, status, body[:300])
        self.assertEqual(json.loads(body)["errcode"], errcode, body[:300])
        cache = headers.get("cache-control") or headers.get("Cache-Control")
        self.assertEqual(cache, "no-store", "every failure carries Cache-Control: no-store")

    def request(self, srv, method, path, token=None, headers=None):
        status, hdrs, body = srv.request(method, path, headers=headers, token=token)
        return status, {k.lower(): v for k, v in hdrs.items()}, body


# ---------------------------------------------------------------------------------------

class MainTest(Case):
    """One server (max_upload_size 4 MiB) for the checks that share it."""

    @classmethod
    def setUpClass(cls):
        cls.holder = Case("run")
        cls.srv = start(cls.holder, media={"max_upload_size": LIMIT_BYTES})
        _, cls.token = register(cls.srv)

    @classmethod
    def tearDownClass(cls):
        cls.holder.doCleanups()

    def test_the_plugin_provides_media_1_and_serves_every_required_route(self):
        self.assertRegex(self.srv.log_text(), rf'plugin "{OPTS.name}" .*provides media/1')
        header = media_header()
        required = re.findall(r'X\(\w+, "(\w+)", (ATRIUM_MEDIA_PATH_\w+), ATRIUM_MEDIA_REQUIRED\)',
                              header)
        self.assertGreaterEqual(len(required), 5, "media.h lists the required routes")
        paths = dict(re.findall(r'#define (ATRIUM_MEDIA_PATH_\w+)\s+(?:\\\s*)?"([^"]+)"', header))
        for method, macro in required:
            path = re.sub(r"\{serverName\}", self.srv.server_name, paths[macro])
            path = re.sub(r"\{\w+\}", "abc", path)
            with self.subTest(route=f"{method} {path}"):
                status, _, body = raw_request(self.srv, method, path, send_body=False)
                self.assertNotEqual(status, 404, f"{method} {path} is not served: {body[:200]!r}")
                self.assert_error((status, {"cache-control": "no-store"}, body), 401,
                                  "M_MISSING_TOKEN")

    def test_an_upload_round_trips_its_sha256_with_content_length_chunked_and_empty(self):
        for chunked in (False, True):
            for data in (os.urandom(300 * 1024 + 7), b""):
                with self.subTest(chunked=chunked, size=len(data)):
                    media_id = upload(self.srv, self.token, data, chunked=chunked)
                    status, headers, body = self.request(self.srv, "GET",
                                                         download_path(self.srv, media_id),
                                                         self.token)
                    self.assertEqual(status, 200)
                    self.assertEqual(sha(body), sha(data))
                    self.assertEqual(int(headers["content-length"]), len(data))

    def test_the_upload_limit_is_exact_and_one_byte_more_is_413_both_ways(self):
        before = store_files(self.srv)
        for chunked in (False, True):
            with self.subTest(chunked=chunked):
                exact = os.urandom(LIMIT_BYTES)
                media_id = upload(self.srv, self.token, exact, chunked=chunked)
                before.update(store_files(self.srv) - before)  # the one just stored
                status, _, body = self.request(self.srv, "GET", download_path(self.srv, media_id),
                                               self.token)
                self.assertEqual(sha(body), sha(exact))
                answer = raw_request(self.srv, "POST", "/_matrix/media/v3/upload",
                                     {"Content-Type": "application/octet-stream"},
                                     exact + b"x", chunked=chunked, token=self.token)
                self.assert_error(answer, 413, "M_TOO_LARGE")
        wait_until(lambda: not open_store_files(self.srv, before), "no open files after the 413s")
        self.assertEqual(store_files(self.srv), before, "a refused upload leaves nothing behind")

    def test_an_upload_to_a_store_that_cannot_be_written_is_503_and_served_again_after(self):
        # media.h: storage unavailable -> 503 M_UNKNOWN (507 only for a full disk), never
        # a 500. The store folder is replaced by a plain file for the upload (a read-only
        # folder would do for an unprivileged server, but root writes into one anyway).
        away = self.srv.store + ".away"
        os.rename(self.srv.store, away)
        try:
            with open(self.srv.store, "wb"):
                pass
            for chunked in (False, True):
                with self.subTest(chunked=chunked):
                    answer = raw_request(self.srv, "POST", "/_matrix/media/v3/upload",
                                         {"Content-Type": "text/plain"}, b"kept nowhere",
                                         chunked=chunked, token=self.token)
                    self.assert_error(answer, 503, "M_UNKNOWN")
        finally:
            os.unlink(self.srv.store)
            os.rename(away, self.srv.store)
        data = os.urandom(1000)
        media_id = upload(self.srv, self.token, data)
        status, _, body = self.request(self.srv, "GET", download_path(self.srv, media_id),
                                       self.token)
        self.assertEqual((status, sha(body)), (200, sha(data)), "the store serves again")

    def test_an_unauthenticated_upload_is_refused_before_its_body_is_sent(self):
        before = store_files(self.srv)
        for token in (None, "not-a-token"):
            with self.subTest(token=token):
                start_s = time.monotonic()
                answer = raw_request(self.srv, "POST", "/_matrix/media/v3/upload",
                                     {"Content-Type": "image/png"}, b"\0" * LIMIT_BYTES,
                                     token=token, send_body=False, timeout=WAIT_S)
                self.assert_error(answer, 401, "M_MISSING_TOKEN" if token is None
                                  else "M_UNKNOWN_TOKEN")
                self.assertLess(time.monotonic() - start_s, WAIT_S)
        self.assertEqual(store_files(self.srv), before)

    def test_a_client_that_goes_away_mid_upload_leaves_nothing(self):
        before = store_files(self.srv)
        sock = raw_connect(self.srv.port)
        sock.sendall((f"POST /_matrix/media/v3/upload HTTP/1.1\r\nHost: c\r\n"
                      f"Authorization: Bearer {self.token}\r\nContent-Type: image/png\r\n"
                      f"Content-Length: {LIMIT_BYTES}\r\n\r\n").encode())
        half = LIMIT_BYTES // 2
        sock.sendall(os.urandom(half))
        # Streamed, not buffered: the bytes sent are on disk before the body ends.
        wait_until(lambda: sum(open_store_files(self.srv, before).values()) >= half // 2,
                   "the first half of the body on disk mid-body")
        reset_close(sock)
        wait_until(lambda: not open_store_files(self.srv, before), "the upload's file closed")
        self.assertEqual(store_files(self.srv), before, "an abandoned upload leaves nothing")

    def test_every_endpoint_wants_a_valid_token_and_takes_access_token_in_the_query(self):
        media_id = upload(self.srv, self.token, b"hello")
        paths = [download_path(self.srv, media_id), download_path(self.srv, media_id, "a.txt"),
                 thumbnail_path(self.srv, media_id), "/_matrix/client/v1/media/config"]
        for path in paths:
            with self.subTest(path=path):
                self.assert_error(self.request(self.srv, "GET", path), 401, "M_MISSING_TOKEN")
                self.assert_error(self.request(self.srv, "GET", path, token="bogus"), 401,
                                  "M_UNKNOWN_TOKEN")
        status, _, body = self.request(self.srv, "GET",
                                       download_path(self.srv, media_id) + f"?access_token={self.token}")
        self.assertEqual((status, body), (200, b"hello"))
        status, _, body = self.request(self.srv, "GET", "/_matrix/client/v1/media/config"
                                       + f"?x=1&access_token={self.token}")
        self.assertEqual(status, 200)
        self.assertEqual(json.loads(body)["m.upload.size"], LIMIT_BYTES)

    def test_unknown_media_another_servers_media_and_traversal_ids_are_not_found(self):
        server = self.srv.server_name
        for path in (f"/_matrix/client/v1/media/download/{server}/NoSuchMediaHere",
                     "/_matrix/client/v1/media/download/other.invalid/abcdef",
                     f"/_matrix/client/v1/media/thumbnail/{server}/NoSuchMediaHere?width=32&height=32"):
            with self.subTest(path=path):
                self.assert_error(self.request(self.srv, "GET", path, self.token), 404,
                                  "M_NOT_FOUND")
        for bad in ("..%2F..%2Fhomeserver.yaml", "%2E%2E", "a%2Fb", "a%00b", "x" * 300):
            with self.subTest(media_id=bad):
                status, headers, body = self.request(
                    self.srv, "GET", f"/_matrix/client/v1/media/download/{server}/{bad}", self.token)
                self.assertIn(status, (400, 404), body[:200])
                # 404 M_UNRECOGNIZED: the core's router refused the path before the plugin.
                self.assertIn(json.loads(body)["errcode"],
                              ("M_NOT_FOUND", "M_INVALID_PARAM", "M_UNRECOGNIZED"))
                self.assertEqual(headers.get("cache-control"), "no-store")
                self.assertNotIn(b"conninfo", body)

    def test_a_download_says_what_it_is_safely_and_honours_head_range_and_etag(self):
        data = bytes(range(256)) * 40
        html = upload(self.srv, self.token, data, "text/html", filename='evil"<script>.html')
        path = download_path(self.srv, html)
        status, h, body = self.request(self.srv, "GET", path, self.token)
        self.assertEqual((status, body), (200, data))
        self.assertEqual(h["content-type"], "text/html")
        self.assertTrue(h["content-disposition"].startswith("attachment"),
                        "HTML is never served inline")
        self.assertTrue(disposition_well_formed(h["content-disposition"]),
                        f"the file name is quoted safely: {h['content-disposition']!r}")
        self.assertIn("sandbox", h["content-security-policy"])
        self.assertEqual(h["cross-origin-resource-policy"], "cross-origin")
        self.assertEqual(h["x-content-type-options"], "nosniff")
        self.assertNotIn("no-store", h["cache-control"])
        self.assertIn("max-age", h["cache-control"])
        etag = h["etag"]
        status, hh, body = self.request(self.srv, "HEAD", path, self.token)
        self.assertEqual((status, body), (200, b""))
        self.assertEqual(hh["etag"], etag)
        self.assertEqual(int(hh["content-length"]), len(data))
        status, hr, body = self.request(self.srv, "GET", path, self.token, {"Range": "bytes=10-19"})
        self.assertEqual((status, body), (206, data[10:20]))
        self.assertEqual(hr["content-range"], f"bytes 10-19/{len(data)}")
        status, _, _ = self.request(self.srv, "GET", path, self.token,
                                    {"Range": f"bytes={len(data)}-"})
        self.assertEqual(status, 416)
        status, _, body = self.request(self.srv, "GET", path, self.token, {"If-None-Match": etag})
        self.assertEqual((status, body), (304, b""))
        png = upload(self.srv, self.token, solid_png(64, 48, 3), "image/png", filename="p.png")
        status, h, _ = self.request(self.srv, "GET", download_path(self.srv, png, "x.png"),
                                    self.token)
        self.assertEqual(h["content-type"], "image/png")
        self.assertIn("x.png", h["content-disposition"], "the path's file name is used")

    def test_the_declared_thumbnail_behaviour(self):
        png = upload(self.srv, self.token, solid_png(200, 150, 3), "image/png")
        answer = self.request(self.srv, "GET", thumbnail_path(self.srv, png), self.token)
        if OPTS.thumbnails == "yes":
            status, headers, body = answer
            self.assertEqual(status, 200, body[:200])
            self.assertRegex(headers["content-type"], r"^image/(png|jpeg|webp|gif)")
            self.assertIn("sandbox", headers["content-security-policy"])
            self.assertGreater(len(body), 0)
        else:
            self.assert_error(answer, 404, "M_NOT_FOUND")

    def test_metrics_are_present_and_move(self):
        uploads = f"atrium_{OPTS.name}_uploads_total"
        downloads = f"atrium_{OPTS.name}_downloads_total"
        before_u, before_d = self.srv.metric(uploads), self.srv.metric(downloads)
        self.assertIsNotNone(before_u, uploads)
        self.assertIsNotNone(before_d, downloads)
        for gauge in ("atrium_line_slots", "atrium_line_in_use", "atrium_line_waiting"):
            self.assertIsNotNone(self.srv.metric(gauge, line_labels()), gauge)
        media_id = upload(self.srv, self.token, b"count me")
        self.request(self.srv, "GET", download_path(self.srv, media_id), self.token)
        self.assertEqual(self.srv.metric(uploads), before_u + 1)
        self.assertGreaterEqual(self.srv.metric(downloads), before_d + 1)


class DeliveryTest(Case):
    """One delivery slot, one waiting place: the bound is visible from outside."""

    @classmethod
    def setUpClass(cls):
        cls.holder = Case("run")
        cls.srv = start(cls.holder, media={"max_upload_size": STREAM_LIMIT_BYTES,
                                           "delivery_slots": 1, "delivery_queue": 1,
                                           "delivery_queue_per_client": 0,
                                           "delivery_wait_ms": 20000})
        _, cls.token = register(cls.srv)
        cls.big = upload(cls.srv, cls.token, os.urandom(BIG_BYTES))
        cls.small = upload(cls.srv, cls.token, b"small")

    @classmethod
    def tearDownClass(cls):
        cls.holder.doCleanups()

    def gauge(self, name):
        return self.srv.metric(name, line_labels())

    def hold_slot(self):
        sock = raw_get(self.srv, download_path(self.srv, self.big), self.token, rcvbuf=16384)
        self.addCleanup(sock.close)
        status, head, rest = read_head(sock)
        self.assertEqual(status, 200, head)
        wait_until(lambda: self.gauge("atrium_line_in_use") == 1, "the slot held")
        return sock, rest

    def assert_idle(self):
        wait_until(lambda: self.gauge("atrium_line_in_use") == 0 and
                   self.gauge("atrium_line_waiting") == 0, "the delivery gauges back to 0")

    def test_the_slot_is_held_to_the_last_byte_and_the_waiter_is_admitted_promptly(self):
        sock, got = self.hold_slot()
        waiter = Background(self.request, self.srv, "GET", download_path(self.srv, self.small),
                            self.token)
        wait_until(lambda: self.gauge("atrium_line_waiting") == 1, "the second request waits")
        status, headers, body = self.request(self.srv, "GET", download_path(self.srv, self.small),
                                             self.token)
        self.assert_error((status, headers, body), 429, "M_LIMIT_EXCEEDED")
        self.assertGreater(json.loads(body)["retry_after_ms"], 0)
        self.assertGreaterEqual(int(headers["retry-after"]), 1)
        time.sleep(0.3)
        self.assertEqual(self.gauge("atrium_line_in_use"), 1, "held while the body is unread")
        self.assertFalse(waiter.done())
        received = len(got)
        while received < BIG_BYTES:
            chunk = sock.recv(1 << 20)
            self.assertTrue(chunk, "the body is complete")
            received += len(chunk)
        done_at = time.monotonic()
        status, _, body = waiter.result(timeout=WAIT_S)
        self.assertEqual((status, body), (200, b"small"))
        self.assertLess(waiter.finished_at - done_at, 2.0, "the waiter is admitted promptly")
        self.assert_idle()

    def test_a_client_that_leaves_mid_body_frees_the_slot(self):
        sock, _ = self.hold_slot()
        reset_close(sock)
        self.assert_idle()
        status, _, body = self.request(self.srv, "GET", download_path(self.srv, self.small),
                                       self.token)
        self.assertEqual((status, body), (200, b"small"))

    def test_admission_comes_before_authorization(self):
        sock, _ = self.hold_slot()
        stranger = Background(self.request, self.srv, "GET", download_path(self.srv, self.small),
                              "bogus-token")
        wait_until(lambda: self.gauge("atrium_line_waiting") == 1, "a bad token waits its turn")
        self.assertFalse(stranger.done())
        reset_close(sock)
        self.assert_error(stranger.result(timeout=WAIT_S), 401, "M_UNKNOWN_TOKEN")
        self.assert_idle()

    def test_an_upload_is_streamed_to_disk_with_flat_memory(self):
        data = os.urandom(STREAM_LIMIT_BYTES)
        stored = store_files(self.srv)
        sock = raw_connect(self.srv.port)
        sock.sendall((f"POST /_matrix/media/v3/upload HTTP/1.1\r\nHost: c\r\n"
                      f"Authorization: Bearer {self.token}\r\n"
                      f"Content-Type: application/octet-stream\r\n"
                      f"Content-Length: {len(data)}\r\n\r\n").encode())
        baseline = peak = rss_bytes(self.srv)
        on_disk_mid_body = 0
        for i in range(0, len(data), CHUNK_BYTES):
            sock.sendall(data[i:i + CHUNK_BYTES])
            if i % (1 << 20) == 0:
                peak = max(peak, rss_bytes(self.srv))
            if i == len(data) // 2:
                on_disk_mid_body = wait_until(
                    lambda: sum(open_store_files(self.srv, stored).values()) >= len(data) // 4 or 0,
                    "half the body on disk mid-body")
        status, _, body = read_response(sock)
        sock.close()
        self.assertEqual(status, 200, body[:200])
        self.assertTrue(on_disk_mid_body)
        self.assertLess(peak - baseline, MEMORY_GROWTH_MAX_BYTES,
                        f"RSS grew {peak - baseline} bytes during a {len(data)}-byte upload")
        media_id = json.loads(body)["content_uri"].rsplit("/", 1)[1]
        status, _, got = self.request(self.srv, "GET", download_path(self.srv, media_id),
                                      self.token)
        self.assertEqual(sha(got), sha(data))


class LifecycleTest(Case):
    def test_media_survive_a_restart_leftovers_go_and_migrations_apply_once(self):
        srv = start(self, media={"max_upload_size": LIMIT_BYTES})
        _, token = register(srv)
        data = os.urandom(100 * 1024)
        media_id = upload(srv, token, data)
        leftover = os.path.join(srv.store, ".tmp-conformance-leftover")
        with open(leftover, "wb") as f:
            f.write(b"half an upload")
        srv.stop()
        srv.start()
        status, _, body = self.request(srv, "GET", download_path(srv, media_id), token)
        self.assertEqual((status, sha(body)), (200, sha(data)))
        self.assertFalse(os.path.exists(leftover), "leftovers are removed at start")
        rows = sql(f"SELECT version, count(*) FROM atrium_migrations WHERE owner = "
                    f"'{OPTS.name}' GROUP BY version", srv.database)
        self.assertTrue(rows, "the plugin's migrations are recorded")
        self.assertTrue(all(count == "1" for _, count in rows), rows)

    def test_a_parked_waiter_gets_503_at_shutdown(self):
        srv = start(self, media={"max_upload_size": STREAM_LIMIT_BYTES, "delivery_slots": 1,
                                 "delivery_queue": 4, "delivery_wait_ms": 20000},
                    settings={"server": {"shutdown_grace_ms": 1000}})
        _, token = register(srv)
        big = upload(srv, token, os.urandom(BIG_BYTES))
        sock = raw_get(srv, download_path(srv, big), token, rcvbuf=16384)
        self.addCleanup(sock.close)
        self.assertEqual(read_head(sock)[0], 200)
        waiter = Background(srv.request, "GET", download_path(srv, big), token=token, timeout=20)
        wait_until(lambda: srv.metric("atrium_line_waiting", line_labels()) == 1, "a waiter")
        stopper = Background(srv.stop, signal.SIGTERM)
        status, _, body = waiter.result(timeout=20)
        self.assertEqual(status, 503, body[:200])
        sock.close()
        self.assertEqual(stopper.result(timeout=40), 0, "a clean exit")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("plugin", help="the plugin's shared object")
    ap.add_argument("--name", help="its descriptor name (default: the file name without .so)")
    ap.add_argument("--thumbnails", choices=("yes", "no"), default="yes")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--include", help="the folder holding atrium/media.h")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("-k", dest="pattern", help="run only tests whose name contains this")
    args = ap.parse_args()
    OPTS.plugin = os.path.abspath(args.plugin)
    OPTS.name = args.name or os.path.basename(args.plugin).rsplit(".so", 1)[0]
    OPTS.thumbnails = args.thumbnails
    OPTS.set = args.set
    OPTS.include = args.include
    if os.environ.get("ATRIUM_BIN"):  # the server runs in its own folder: no relative path
        os.environ["ATRIUM_BIN"] = os.path.abspath(os.environ["ATRIUM_BIN"])
    if not os.path.exists(OPTS.plugin):
        sys.exit(f"conform.py: no such plugin file: {OPTS.plugin}")
    try:
        media_header()
        sql("SELECT 1")
    except (AssertionError, RuntimeError, OSError) as e:
        sys.exit(f"conform.py: {e}")
    loader = unittest.TestLoader()
    if args.pattern:
        loader.testNamePatterns = [f"*{args.pattern}*"]
    suite = unittest.TestSuite(loader.loadTestsFromTestCase(c)
                               for c in (MainTest, DeliveryTest, LifecycleTest))
    print(f"media/1 conformance: {OPTS.plugin} (plugins.{OPTS.name}, thumbnails: "
          f"{OPTS.thumbnails})", flush=True)
    result = unittest.TextTestRunner(verbosity=2 if args.verbose else 1).run(suite)
    sys.exit(0 if result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
