"""Remote media: Atrium serving its media to other servers as multipart/mixed, and
fetching other servers' media - one fetch per remote file, on the fetch pool, through the
fetch budget and its fair line, with exact codes.

Two Atrium servers federate over loopback TLS (federation_support.FederatedServer); where a
peer must misbehave or count what reaches it, a fake origin written here plays it: HTTPS
from the test CA, its key document served (Atrium's requests to it are signed; the fake
does not check them), and /_matrix/federation/v1/media/download answered as each test
says.
"""

import hashlib
import http.client
import http.server
import json
import os
import shutil
import ssl
import tempfile
import threading
import time
import unittest

import harness
from federation_support import FederatedServer, SigningKey, TestCA, canonical, free_port, sign_json, xmatrix
from media_support import get_many, png, register, upload, webp_size

A_IP, B_IP, ORIGIN_IP, ORIGIN2_IP = "127.0.0.21", "127.0.0.22", "127.0.0.33", "127.0.0.34"
BOUNDARY = "bNdRy7f3a9"


def sha(data):
    return hashlib.sha256(data).hexdigest()


def multipart(data, content_type="application/octet-stream", boundary=BOUNDARY, name=None):
    disp = f'inline; filename="{name}"' if name else "inline"
    return (f"--{boundary}\r\nContent-Type: application/json\r\n\r\n{{}}\r\n"
            f"--{boundary}\r\nContent-Type: {content_type}\r\nContent-Disposition: {disp}\r\n\r\n"
            ).encode() + data + f"\r\n--{boundary}--\r\n".encode()


class FakeOrigin:
    """An origin server over TLS. `files[media_id]` says how to answer:
    ("ok", bytes, content_type) multipart; ("not_found",); ("garbage",); ("hang",);
    ("unrecognized", bytes, content_type): the federation endpoint is unknown (404
    M_UNRECOGNIZED), the legacy one serves the bytes; ("truncated", bytes): a Content-Length
    promising more than is sent; ("drip", bytes, step, pause_s, cut_at): the multipart
    answer written `step` bytes at a time with a pause between, cut off (connection closed
    before its Content-Length) after `cut_at` bytes unless None; ("chunked", bytes,
    content_type): the multipart answer in chunked transfer coding, no Content-Length;
    ("chunked_raw", body, piece): `body` as it is, in chunks of `piece` bytes;
    ("short_length", bytes): a Content-Length of half the body, the whole body written;
    ("redirect", url): the federation endpoint is unknown, the legacy one answers 302 to
    url; ("busy", n, bytes): 429 M_LIMIT_EXCEEDED (retry_after_ms 100) to the first n
    asks, then the file. `delay_s` delays every
    media answer. `hits` counts media requests by path; `finished[media_id]` is when the
    last byte of a drip was written (time.monotonic())."""

    def __init__(self, ca, ip):
        self.ip = ip
        self.port = free_port(ip)
        self.server_name = f"{ip}:{self.port}"
        self.key = SigningKey("fake1")
        self.files = {}
        self.delay_s = 0
        self.hits = {}
        self.finished = {}
        self.lock = threading.Lock()
        self.release = threading.Event()
        cert, keyfile = ca.issue(f"origin-{ip}", ip)
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def send(self, status, body, content_type="application/json", length=None):
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body) if length is None else length))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                path = self.path.split("?")[0]
                if path.startswith("/_matrix/key/v2/server"):
                    doc = {"server_name": outer.server_name,
                           "verify_keys": {outer.key.key_id: {"key": outer.key.public_b64}},
                           "old_verify_keys": {},
                           "valid_until_ts": int(time.time() * 1000) + 3600 * 1000}
                    return self.send(200, canonical(sign_json(doc, outer.server_name, outer.key)))
                with outer.lock:
                    outer.hits[path] = outer.hits.get(path, 0) + 1
                if outer.delay_s:
                    time.sleep(outer.delay_s)
                if path.startswith("/cdn/"):
                    spec = outer.files.get(path[len("/cdn/"):])
                    if not spec:
                        return self.send(404, b"{}")
                    return self.send(200, spec[1], spec[2])
                fed = "/_matrix/federation/v1/media/download/"
                legacy = f"/_matrix/media/v3/download/{outer.server_name}/"
                if path.startswith(fed):
                    media_id, is_fed = path[len(fed):], True
                elif path.startswith(legacy):
                    media_id, is_fed = path[len(legacy):], False
                else:
                    return self.send(404, b'{"errcode":"M_UNRECOGNIZED","error":"no"}')
                spec = outer.files.get(media_id, ("not_found",))
                kind = spec[0]
                if kind == "hang":
                    outer.release.wait(60)
                    return
                if kind == "not_found":
                    return self.send(404, b'{"errcode":"M_NOT_FOUND","error":"not here"}')
                if kind == "garbage":
                    return self.send(200, b"this is not a multipart body at all" * 10,
                                     f"multipart/mixed; boundary={BOUNDARY}")
                if kind == "truncated":
                    body = multipart(spec[1])
                    self.send(200, body[: len(body) // 2], f"multipart/mixed; boundary={BOUNDARY}",
                              length=len(body))
                    self.close_connection = True
                    return
                if kind == "slow":  # half the body, a pause of spec[2] s, the rest
                    body = multipart(spec[1])
                    self.send_response(200)
                    self.send_header("Content-Type", f"multipart/mixed; boundary={BOUNDARY}")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    outer.release.wait(spec[2])
                    try:
                        self.wfile.write(body[len(body) // 2:])
                    except OSError:
                        pass
                    return
                if kind == "drip":
                    _, data, step, pause, cut_at = spec
                    body = multipart(data)
                    self.send_response(200)
                    self.send_header("Content-Type", f"multipart/mixed; boundary={BOUNDARY}")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    end = len(body) if cut_at is None else cut_at
                    try:
                        for at in range(0, end, step):
                            self.wfile.write(body[at:min(at + step, end)])
                            self.wfile.flush()
                            time.sleep(pause)
                    except OSError:
                        pass
                    with outer.lock:
                        outer.finished[media_id] = time.monotonic()
                    self.close_connection = True
                    return
                if kind == "busy":
                    with outer.lock:
                        asked = outer.hits[path]
                    if asked <= spec[1]:
                        return self.send(429, b'{"errcode":"M_LIMIT_EXCEEDED","error":"slow down",'
                                              b'"retry_after_ms":100}')
                    return self.send(200, multipart(spec[2]), f"multipart/mixed; boundary={BOUNDARY}")
                if kind == "chunked":
                    body = multipart(spec[1], spec[2])
                    self.send_response(200)
                    self.send_header("Content-Type", f"multipart/mixed; boundary={BOUNDARY}")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    try:
                        for at in range(0, len(body), 16384):
                            piece = body[at:at + 16384]
                            self.wfile.write(b"%x\r\n" % len(piece) + piece + b"\r\n")
                        self.wfile.write(b"0\r\n\r\n")
                    except OSError:
                        pass
                    self.close_connection = True
                    return
                if kind == "chunked_raw":  # ("chunked_raw", body, piece): any body, chunked
                    self.send_response(200)
                    self.send_header("Content-Type", f"multipart/mixed; boundary={BOUNDARY}")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    try:
                        for at in range(0, len(spec[1]), spec[2]):
                            piece = spec[1][at:at + spec[2]]
                            self.wfile.write(b"%x\r\n" % len(piece) + piece + b"\r\n")
                        self.wfile.write(b"0\r\n\r\n")
                    except OSError:
                        pass
                    self.close_connection = True
                    return
                if kind == "short_length":
                    body = multipart(spec[1])
                    self.send(200, body, f"multipart/mixed; boundary={BOUNDARY}",
                              length=len(body) // 2)
                    self.close_connection = True
                    return
                if kind == "redirect":
                    if is_fed:
                        return self.send(404, b'{"errcode":"M_UNRECOGNIZED","error":"unknown"}')
                    self.send_response(302)
                    self.send_header("Location", spec[1])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if kind == "location":
                    body = (f"--{BOUNDARY}\r\nContent-Type: application/json\r\n\r\n{{}}\r\n"
                            f"--{BOUNDARY}\r\nLocation: {spec[1]}\r\n\r\n"
                            f"\r\n--{BOUNDARY}--\r\n").encode()
                    return self.send(200, body, f"multipart/mixed; boundary={BOUNDARY}")
                if kind == "unrecognized" and is_fed:
                    return self.send(404, b'{"errcode":"M_UNRECOGNIZED","error":"unknown"}')
                if not is_fed:
                    return self.send(200, spec[1], spec[2])
                return self.send(200, multipart(spec[1], spec[2], name="pic.png"),
                                 f"multipart/mixed; boundary={BOUNDARY}")

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer((ip, self.port), Handler)
        self.httpd.daemon_threads = True
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, keyfile)
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def media_hits(self, media_id):
        with self.lock:
            return sum(n for p, n in self.hits.items() if p.endswith("/" + media_id))

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


class RemoteMediaCase(harness.AtriumTestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="atrium-media-remote-")
        cls.ca = TestCA(cls.tmp)
        cls._class_feds, cls._origin_names = {}, set()  # see start_fed(shared=True), origin()

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def start_fed(self, ip, media=None, extra=None, shared=False):
        """A federating server on ip with the media plugin. shared=True: the one server on
        ip of the test's class, as AtriumTestCase.start_class_server (same rules; every
        shared call of a class on one ip passes the same settings)."""
        if shared:
            return self._class_fed(ip, media, extra)
        srv = self._new_fed(ip, media, extra)

        def close():
            srv._failed = srv._failed or self._test_failed()
            srv.close()
        self.addCleanup(close)
        srv.start()
        return srv

    def _test_failed(self):
        outcome = getattr(self, "_outcome", None)
        return outcome is not None and not getattr(outcome, "success", True)

    def _class_fed(self, ip, media, extra):
        cls = type(self)
        servers = cls._class_feds
        if ip in servers:
            srv, args = servers[ip]
            self.assertEqual(args, (media, extra), "a shared server's settings differ")
        else:
            srv = harness.start_shared(self._new_fed(ip, media, extra))
            servers[ip] = (srv, (media, extra))

            def close():
                del servers[ip]
                srv.close()
            cls.addClassCleanup(close)

        harness.mark_on_failure(self, srv)
        return srv

    def remote_files(self, srv):
        """Every file of the remote cache (shared servers: compare before and after)."""
        return {os.path.join(root, f) for root, _, fs in os.walk(os.path.join(srv.store, "remote"))
                for f in fs}

    def remote_rows(self, srv, origin):
        return harness.psql(f"SELECT count(*) FROM media_remote WHERE origin = '{origin}'",
                            srv.database)

    def count(self, srv, name, labels=None):
        """A counter's value, 0 while never counted (shared servers: before vs after)."""
        return srv.metric(name, labels) or 0

    def _new_fed(self, ip, media, extra):
        def settings(tmp):
            conf = {"enabled": True, "store_path": os.path.join(tmp, "media_store")}
            conf.update(media or {})
            return harness.deep_merge({"registration": {"enabled": True},
                                       "plugins": {"media": conf}}, extra or {})
        srv = FederatedServer(self.ca, ip, extra=None, start=False)
        srv._settings = harness.deep_merge(srv._settings, settings(srv.dir))
        srv.store = os.path.join(srv.dir, "media_store")
        srv.write_config()
        return srv

    def origin(self, ip=ORIGIN_IP):
        """A fake origin named (ip:port) as no other of the class (for shared servers)."""
        used = type(self)._origin_names
        o = FakeOrigin(self.ca, ip)
        while o.server_name in used:
            o.close()
            o = FakeOrigin(self.ca, ip)
        used.add(o.server_name)
        self.addCleanup(o.close)
        return o

    def remote_path(self, origin_name, media_id, thumb=None, extra=""):
        if thumb:
            w, h = thumb
            return (f"/_matrix/client/v1/media/thumbnail/{origin_name}/{media_id}"
                    f"?width={w}&height={h}&method=scale{extra}")
        return f"/_matrix/client/v1/media/download/{origin_name}/{media_id}{extra}"

    def settled(self, srv, name, want=0, timeout=3.0):
        """A gauge's value once it reached `want`, or its last value after `timeout` s."""
        deadline = time.monotonic() + timeout
        value = srv.metric(name)
        while value != want and time.monotonic() < deadline:
            time.sleep(0.05)
            value = srv.metric(name)
        return value

    def assert_failure(self, result, status, errcode):
        got_status, headers, body = result
        self.assertEqual(got_status, status, body[:300])
        self.assertEqual(json.loads(body)["errcode"], errcode, body)
        self.assertEqual(headers.get("Cache-Control"), "no-store")


class ServingOtherServersTest(RemoteMediaCase):
    def test_the_legacy_download_is_served_on_the_federation_listener_too(self):
        # Servers without the federation media endpoints fall back to the legacy path; on
        # the federation listener it is served as on the client one (legacy_media on).
        b = self.start_fed(B_IP, media={"legacy_media": True})
        _, token = register(b)
        data = b"legacy bytes " + os.urandom(2000)
        media_id = upload(b, token, data, "application/octet-stream")
        path = f"/_matrix/media/v3/download/{b.server_name}/{media_id}"
        status, _, body = b.fed_request("GET", path + "?allow_remote=false")
        self.assertEqual((status, body), (200, data))
        status, _, body = b.fed_request("GET", path + "/named.bin")
        self.assertEqual((status, body), (200, data))
        # Only that path: other client paths stay off the federation listener.
        status, _, body = b.fed_request("GET", f"/_matrix/media/v3/thumbnail/{b.server_name}/"
                                        f"{media_id}?width=32&height=32")
        self.assertEqual((status, body["errcode"]), (404, "M_UNRECOGNIZED"), body)

    def test_federation_download_is_multipart_with_metadata_then_the_bytes(self):
        b = self.start_fed(B_IP)
        _, token = register(b)
        data = os.urandom(300000)
        media_id = upload(b, token, data, "application/pdf", filename="doc.pdf")
        peer = SigningKey("p1")
        # Unsigned: refused by the core before the plugin runs.
        status, _, body = b.fed_request("GET", f"/_matrix/federation/v1/media/download/{media_id}")
        self.assertEqual(status, 401, body)
        # Signed by a server B cannot reach for keys: still refused (the signature is
        # checked against keys, not trusted) - so sign as A, a real server.
        a = self.start_fed(A_IP)
        del peer
        status, headers, raw = self._signed_get(a, b, f"/_matrix/federation/v1/media/download/{media_id}")
        self.assertEqual(status, 200, raw[:300])
        ctype = headers["Content-Type"]
        self.assertTrue(ctype.startswith("multipart/mixed; boundary="), ctype)
        boundary = ctype.split("boundary=", 1)[1]
        parts = raw.split(b"--" + boundary.encode())
        self.assertEqual(parts[0], b"")
        self.assertEqual(parts[-1], b"--\r\n")
        meta_head, meta = parts[1].split(b"\r\n\r\n", 1)
        self.assertIn(b"Content-Type: application/json", meta_head)
        self.assertEqual(json.loads(meta), {})
        file_head, file_body = parts[2].split(b"\r\n\r\n", 1)
        self.assertIn(b"Content-Type: application/pdf", file_head)
        self.assertIn(b'filename="doc.pdf"', file_head)
        self.assertEqual(sha(file_body[:-2]), sha(data))
        # Unknown media: 404 M_NOT_FOUND.
        status, _, raw = self._signed_get(a, b, "/_matrix/federation/v1/media/download/nope")
        self.assertEqual((status, json.loads(raw)["errcode"]), (404, "M_NOT_FOUND"))

    def _signed_get(self, a, b, path):
        """A GET to B's federation listener signed with A's key (read from A's key file)."""
        with open(os.path.join(a.dir, f"{a.server_name}.signing.key")) as f:
            _, version, seed = f.read().split()
        import base64
        key = SigningKey(version, base64.b64decode(seed + "=" * (-len(seed) % 4)))
        auth = xmatrix("GET", path, a.server_name, b.server_name, key)
        import http.client
        conn = http.client.HTTPSConnection(b.fed_ip, b.fed_port, timeout=15,
                                           context=self.ca.client_context())
        conn.request("GET", path, headers={"Authorization": auth})
        resp = conn.getresponse()
        raw = resp.read()
        conn.close()
        return resp.status, dict(resp.getheaders()), raw


class FetchingFromAtriumTest(RemoteMediaCase):
    """Its tests share a pair of servers (start_fed(shared=True)), counting from before."""
    def test_a_user_on_a_downloads_and_thumbnails_media_uploaded_on_b_then_from_the_cache(self):
        a = self.start_fed(A_IP, shared=True)
        b = self.start_fed(B_IP, shared=True)
        _, tb = register(b)
        _, ta = register(a)
        image = png(640, 480)
        media_id = upload(b, tb, image, "image/png", filename="pic.png")
        served0 = self.count(b, "atrium_media_federation_served_total")
        fetched0 = self.count(a, "atrium_media_remote_fetches_total", {"outcome": "ok"})
        status, headers, body = a.request("GET", self.remote_path(b.server_name, media_id),
                                          token=ta, timeout=30)
        self.assertEqual(status, 200, body[:300])
        self.assertEqual(sha(body), sha(image))
        self.assertEqual(headers["Content-Type"], "image/png")
        self.assertIn('filename="pic.png"', headers["Content-Disposition"])
        served = b.metric("atrium_media_federation_served_total")
        self.assertEqual(served - served0, 1)
        status, _, thumb = a.request("GET", self.remote_path(b.server_name, media_id, (96, 96)),
                                     token=ta, timeout=30)
        self.assertEqual(status, 200, thumb[:300])
        self.assertEqual(webp_size(thumb), (320, 240))  # the smallest scale size >= 96x96
        status, _, again = a.request("GET", self.remote_path(b.server_name, media_id), token=ta)
        self.assertEqual((status, sha(again)), (200, sha(image)))
        # The thumbnail and the second download came from A's cache: B served once.
        self.assertEqual(b.metric("atrium_media_federation_served_total") - served0, 1)
        self.assertEqual(a.metric("atrium_media_remote_fetches_total", {"outcome": "ok"}) - fetched0, 1)


    def test_a_remote_thumbnail_comes_from_the_origins_thumbnail_endpoint_first(self):
        a = self.start_fed(A_IP, shared=True)
        b = self.start_fed(B_IP, shared=True)
        _, tb = register(b)
        _, ta = register(a)
        image = png(800, 600)
        media_id = upload(b, tb, image, "image/png")
        served0 = self.count(b, "atrium_media_federation_served_total")
        renders0 = self.count(a, "atrium_media_renders_total", {"result": "ok"})
        status, _, thumb = a.request("GET", self.remote_path(b.server_name, media_id, (320, 240)),
                                     token=ta, timeout=30)
        self.assertEqual(status, 200, thumb[:300])
        status, _, own = b.request("GET", f"/_matrix/client/v1/media/thumbnail/{b.server_name}/"
                                   f"{media_id}?width=320&height=240&method=scale", token=tb)
        self.assertEqual(status, 200)
        self.assertEqual(sha(thumb), sha(own))  # B's own rendering, not A's
        self.assertEqual(webp_size(thumb), (320, 240))
        self.assertEqual(b.metric("atrium_media_federation_served_total") - served0, 1)
        self.assertEqual(self.count(a, "atrium_media_renders_total", {"result": "ok"}) - renders0, 0)
        # Again: from A's cache.
        status, _, again = a.request("GET", self.remote_path(b.server_name, media_id, (320, 240)),
                                     token=ta, timeout=30)
        self.assertEqual((status, sha(again)), (200, sha(own)))
        self.assertEqual(b.metric("atrium_media_federation_served_total") - served0, 1)


class FakeOriginTest(RemoteMediaCase):
    """Tests on the default settings share one server (start_fed(shared=True)), each with
    an origin of its own (own port, own name), counting from the values before it."""
    SHORT = {"upload_wait_default_ms": 3000}

    def test_one_hundred_concurrent_downloads_of_one_uncached_file_make_one_upstream_request(self):
        o = self.origin()
        data = os.urandom(200000)
        o.files["one"] = ("ok", data, "application/octet-stream")
        o.delay_s = 0.5
        a = self.start_fed(A_IP, shared=True)
        _, token = register(a)
        results = get_many(a, [self.remote_path(o.server_name, "one")] * 100, token, 100)
        self.assertEqual([r[0] for r in results], [200] * 100, [r[2][:200] for r in results if r[0] != 200][:3])
        self.assertTrue(all(sha(r[2]) == sha(data) for r in results))
        self.assertEqual(o.media_hits("one"), 1)
        self.assertEqual(self.settled(a, "atrium_media_fetch_budget_in_flight"), 0)

    def test_150_distinct_remote_images_from_one_client_all_load(self):
        o = self.origin()
        for i in range(150):
            o.files[f"img{i}"] = ("ok", png(8, 8 + i % 5), "image/png")
        o.delay_s = 0.05
        a = self.start_fed(A_IP, shared=True)
        _, token = register(a)
        paths = [self.remote_path(o.server_name, f"img{i}") for i in range(150)]
        results = get_many(a, paths, token, 150)
        bad = [(i, r[0], r[2][:120]) for i, r in enumerate(results) if r[0] != 200]
        self.assertEqual(bad, [])
        for i, r in enumerate(results):
            self.assertEqual(sha(r[2]), sha(o.files[f"img{i}"][1]))
        self.assertEqual(sum(o.media_hits(f"img{i}") for i in range(150)), 150)

    def test_with_no_line_requests_over_the_per_client_cap_get_429_at_once(self):
        o = self.origin()
        for i in range(12):
            o.files[f"f{i}"] = ("ok", b"x" * 1000, "text/plain")
        o.delay_s = 1.5
        a = self.start_fed(A_IP, media={"media_fetch_line_per_client": 0,
                                        "media_fetch_max_per_client": 2})
        _, token = register(a)
        started = time.monotonic()
        results = [None] * 6
        times = [None] * 6

        def get(i):
            results[i] = a.request("GET", self.remote_path(o.server_name, f"f{i}"), token=token,
                                   timeout=30)
            times[i] = time.monotonic() - started
        threads = [threading.Thread(target=get, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(40)
        statuses = sorted(r[0] for r in results)
        self.assertEqual(statuses, [200, 200, 429, 429, 429, 429], statuses)
        for i, r in enumerate(results):
            if r[0] == 429:
                body = json.loads(r[2])
                self.assertEqual(body["errcode"], "M_LIMIT_EXCEEDED")
                self.assertEqual(body["retry_after_ms"], 1000)
                self.assertEqual(r[1]["Retry-After"], "1")
                self.assertEqual(r[1]["Cache-Control"], "no-store")
                self.assertLess(times[i], 1.2, "a refusal must not wait for the fetches")

    def test_fifty_downloads_and_fifty_thumbnails_of_a_fresh_file_ask_each_resource_once(self):
        o = self.origin()
        image = png(640, 480)
        o.files["pic"] = ("ok", image, "image/png")
        o.delay_s = 0.5
        a = self.start_fed(A_IP, shared=True)
        _, token = register(a)
        renders0 = self.count(a, "atrium_media_renders_total", {"result": "ok"})
        paths = [self.remote_path(o.server_name, "pic", (96, 96) if i % 2 else None)
                 for i in range(100)]
        results = get_many(a, paths, token, 100)
        self.assertEqual([r[0] for r in results], [200] * 100,
                         [r[2][:200] for r in results if r[0] != 200][:3])
        self.assertTrue(all(sha(r[2]) == sha(image) for r in results[0::2]))
        self.assertTrue(all(webp_size(r[2]) == (320, 240) for r in results[1::2]))
        # The fake has no thumbnail endpoint: asked at most once (not at all when the
        # original landed first), and the original exactly once.
        with o.lock:
            hits = dict(o.hits)
        self.assertEqual(hits.get("/_matrix/federation/v1/media/download/pic"), 1, hits)
        self.assertLessEqual(hits.get("/_matrix/federation/v1/media/thumbnail/pic", 0), 1, hits)
        self.assertEqual(a.metric("atrium_media_renders_total", {"result": "ok"}) - renders0, 1)

    def test_over_the_per_client_cap_requests_wait_in_the_line_and_all_succeed(self):
        o = self.origin()
        for i in range(6):
            o.files[f"w{i}"] = ("ok", b"y" * 100 + bytes([i]), "text/plain")
        o.delay_s = 0.3
        a = self.start_fed(A_IP, media={"media_fetch_max_per_client": 2})
        _, token = register(a)
        results = get_many(a, [self.remote_path(o.server_name, f"w{i}") for i in range(6)], token, 6)
        self.assertEqual([r[0] for r in results], [200] * 6)
        self.assertEqual(a.metric("atrium_media_fetch_line_waits_total"), 4)
        self.assertEqual(self.settled(a, "atrium_media_fetch_budget_in_flight_client_max"), 0)
        self.assertEqual([r[2] for r in results], [o.files[f"w{i}"][1] for i in range(6)])

    def test_a_peer_that_never_answers_gives_504_by_the_deadline_and_the_server_stays_responsive(self):
        o = self.origin()
        o.files["black"] = ("hang",)
        other = self.origin(ORIGIN2_IP)
        other.files["fine"] = ("ok", b"another origin's bytes", "text/plain")
        a = self.start_fed(A_IP, media={"media_fetch_threads": 2})
        _, token = register(a)
        _, token2 = register(a)
        local = os.urandom(50000)
        local_id = upload(a, token, local, "application/octet-stream")
        local_path = f"/_matrix/client/v1/media/download/{a.server_name}/{local_id}"
        results = [None] * 16
        started = time.monotonic()

        path = self.remote_path(o.server_name, "black", extra="?timeout_ms=4000")

        def get(i):
            results[i] = a.request("GET", path, token=token, timeout=30)
        threads = [threading.Thread(target=get, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        # Meanwhile: /versions answers at once (no request-pool thread waits on the peer).
        t0 = time.monotonic()
        status, _ = a.json("GET", "/_matrix/client/versions")
        self.assertEqual(status, 200)
        self.assertLess(time.monotonic() - t0, 1.0)
        # ... and so do, for another user on another address, /sync, a local download and
        # another origin's media (the first client's own shares of the fetch budget and
        # of the delivery line are full of black-hole requests).
        def other_client(path):
            conn = http.client.HTTPConnection("127.0.0.1", a.port, timeout=5,
                                              source_address=("127.0.0.2", 0))
            try:
                conn.request("GET", path, headers={"Authorization": f"Bearer {token2}"})
                resp = conn.getresponse()
                return resp.status, resp.read()
            finally:
                conn.close()
        t0 = time.monotonic()
        self.assertEqual(other_client("/_matrix/client/v3/sync?timeout=0")[0], 200)
        status, body = other_client(local_path)
        self.assertEqual((status, sha(body)), (200, sha(local)))
        status, body = other_client(self.remote_path(other.server_name, "fine"))
        self.assertEqual((status, body), (200, b"another origin's bytes"))
        self.assertLess(time.monotonic() - t0, 2.0)
        self.assertEqual(sum(1 for r in results if r is not None), 0,
                         f"still waiting on the peer {time.monotonic() - started:.1f} s in")
        for t in threads:
            t.join(30)
        elapsed = time.monotonic() - started
        for r in results:
            self.assert_failure(r, 504, "M_UNKNOWN")
        self.assertLess(elapsed, 8.0)
        # Slots come back (released just after each answer's last byte); the fetch pool's
        # threads were never held.
        self.assertEqual(self.settled(a, "atrium_media_fetch_budget_in_flight"), 0)
        self.assertEqual(a.metric("atrium_pool_busy", {"pool": "media.fetch"}), 0)
        self.assertEqual(o.media_hits("black"), 1)

    def test_an_origin_answering_404_gives_404_and_is_not_asked_again_within_the_window(self):
        o = self.origin()
        a = self.start_fed(A_IP, shared=True)
        _, token = register(a)
        negative0 = self.count(a, "atrium_media_remote_negative_hits_total")
        r = a.request("GET", self.remote_path(o.server_name, "missing"), token=token, timeout=30)
        self.assert_failure(r, 404, "M_NOT_FOUND")
        r = a.request("GET", self.remote_path(o.server_name, "missing"), token=token, timeout=30)
        self.assert_failure(r, 404, "M_NOT_FOUND")
        self.assertEqual(o.media_hits("missing"), 1)
        self.assertEqual(a.metric("atrium_media_remote_negative_hits_total") - negative0, 1)

    def test_a_dead_origin_holds_at_most_its_per_origin_cap_while_others_are_served(self):
        dead = self.origin()
        for i in range(5):
            dead.files[f"d{i}"] = ("hang",)
        good = self.origin(ORIGIN2_IP)
        good.files["g"] = ("ok", b"good bytes", "text/plain")
        a = self.start_fed(A_IP, media={"remote_fetch_max_per_origin": 2,
                                        "remote_fetch_timeout_ms": 3000})
        _, token = register(a)
        results = [None] * 5

        def get(i):
            results[i] = a.request("GET", self.remote_path(dead.server_name, f"d{i}",
                                                           extra="?timeout_ms=1500"),
                                   token=token, timeout=30)
        threads = [threading.Thread(target=get, args=(i,)) for i in range(5)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        status, _, body = a.request("GET", self.remote_path(good.server_name, "g"), token=token,
                                    timeout=5)
        self.assertEqual((status, body), (200, b"good bytes"))
        for t in threads:
            t.join(30)
        for r in results:
            self.assert_failure(r, 504, "M_UNKNOWN")
        # Only the cap's worth reached the dead origin; the others were never started, even
        # after the running two timed out (nobody wanted them any more).
        time.sleep(3.5)
        self.assertEqual(sum(dead.media_hits(f"d{i}") for i in range(5)), 2)
        self.assertEqual(self.settled(a, "atrium_media_remote_fetches_running"), 0)
        self.assertEqual(self.settled(a, "atrium_media_fetch_budget_in_flight"), 0)

    def test_garbage_multipart_gives_502_and_leaves_nothing_in_the_cache(self):
        o = self.origin()
        o.files["junk"] = ("garbage",)
        o.files["cut"] = ("truncated", os.urandom(50000))
        a = self.start_fed(A_IP, shared=True)
        _, token = register(a)
        before = self.remote_files(a)
        self.assert_failure(a.request("GET", self.remote_path(o.server_name, "junk"), token=token,
                                      timeout=30), 502, "M_UNKNOWN")
        self.assert_failure(a.request("GET", self.remote_path(o.server_name, "cut"), token=token,
                                      timeout=30), 502, "M_UNKNOWN")
        self.assertEqual(self.remote_files(a) - before, set())  # no new file, no new row
        self.assertEqual(self.remote_rows(a, o.server_name), [["0"]])

    def test_an_oversize_file_gives_502_too_large(self):
        o = self.origin()
        o.files["big"] = ("ok", os.urandom(300000), "application/octet-stream")
        a = self.start_fed(A_IP, media={"max_upload_size": 100000})
        _, token = register(a)
        self.assert_failure(a.request("GET", self.remote_path(o.server_name, "big"), token=token,
                                      timeout=30), 502, "M_TOO_LARGE")

    def test_an_origin_without_federation_media_is_asked_on_the_legacy_endpoint(self):
        o = self.origin()
        data = os.urandom(5000)
        o.files["old"] = ("unrecognized", data, "application/octet-stream")
        a = self.start_fed(A_IP, shared=True)
        _, token = register(a)
        status, _, body = a.request("GET", self.remote_path(o.server_name, "old"), token=token,
                                    timeout=30)
        self.assertEqual((status, sha(body)), (200, sha(data)))
        self.assertEqual(o.hits.get(f"/_matrix/media/v3/download/{o.server_name}/old"), 1)

    def remote_bytes_on_disk(self, srv):
        return sum(os.path.getsize(os.path.join(root, f))
                   for root, _, fs in os.walk(os.path.join(srv.store, "remote")) for f in fs)

    def test_the_remote_cache_stays_in_its_bound_and_evicts_the_least_recently_used(self):
        o = self.origin()
        for name in ("e1", "e2", "e3"):
            o.files[name] = ("ok", os.urandom(100000), "application/octet-stream")
        a = self.start_fed(A_IP, media={"remote_cache_max_bytes": 250000})
        _, token = register(a)

        def get(name):
            status, _, body = a.request("GET", self.remote_path(o.server_name, name), token=token,
                                        timeout=30)
            self.assertEqual((status, sha(body)), (200, sha(o.files[name][1])))
        get("e1")
        get("e2")
        time.sleep(0.05)
        get("e1")  # e1 is now the more recently used
        get("e3")  # past the bound: e2 goes
        self.assertLessEqual(self.remote_bytes_on_disk(a), 250000)
        self.assertEqual(a.metric("atrium_media_remote_cache_evictions_total"), 1)
        self.assertEqual(a.metric("atrium_media_remote_cache_bytes"), 200000)
        get("e1")
        get("e3")
        self.assertEqual((o.media_hits("e1"), o.media_hits("e3")), (1, 1))
        get("e2")  # fetched again
        self.assertEqual(o.media_hits("e2"), 2)
        self.assertLessEqual(self.remote_bytes_on_disk(a), 250000)

    def test_the_admin_purge_removes_copies_last_accessed_before_the_time(self):
        o = self.origin()
        o.files["p1"] = ("ok", b"purge me", "text/plain")
        a = self.start_fed(A_IP)
        _, token = register(a)
        _, admin = register(a, admin=True)
        self.assertEqual(a.request("GET", self.remote_path(o.server_name, "p1"), token=token,
                                   timeout=30)[0], 200)
        status, body = a.json("POST", "/_synapse/admin/v1/purge_media_cache?before_ts=1",
                              {}, token=admin)
        self.assertEqual((status, body), (200, {"deleted": 0}))
        status, body = a.json("POST", "/_synapse/admin/v1/purge_media_cache?before_ts="
                              f"{int(time.time() * 1000) + 1000}", {}, token=admin)
        self.assertEqual((status, body), (200, {"deleted": 1}))
        self.assertEqual(self.remote_bytes_on_disk(a), 0)
        status, _ = a.json("POST", "/_synapse/admin/v1/purge_media_cache?before_ts=1", {},
                           token=token)
        self.assertEqual(status, 403)
        self.assertEqual(a.request("GET", self.remote_path(o.server_name, "p1"), token=token,
                                   timeout=30)[0], 200)
        self.assertEqual(o.media_hits("p1"), 2)

    def test_a_location_part_is_followed_once_and_a_blacklisted_one_is_refused(self):
        o = self.origin()
        cdn = self.origin(ORIGIN2_IP)
        data = os.urandom(70000)
        cdn.files["blob"] = ("raw", data, "image/png")
        o.files["moved"] = ("location", f"https://{cdn.server_name}/cdn/blob")
        o.files["evil"] = ("location", "https://10.255.255.1:8443/cdn/x")
        o.files["loop"] = ("location", f"https://{o.server_name}/_matrix/federation/v1/media/download/loop")
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
        # Followed once only: what the Location answers is the file, even when it is another
        # multipart answer naming a Location again.
        status, _, body = a.request("GET", self.remote_path(o.server_name, "loop"), token=token,
                                    timeout=30)
        self.assertEqual(status, 200)
        self.assertIn(b"Location: https://", body)
        self.assertEqual(o.media_hits("loop"), 2)

    def test_clients_that_leave_while_waiting_give_their_slots_back_by_the_deadline(self):
        o = self.origin()
        o.files["gone"] = ("hang",)
        a = self.start_fed(A_IP, shared=True)
        _, token = register(a)
        socks = [harness.raw_connect(a.port) for _ in range(5)]
        for sock in socks:
            sock.sendall((f"GET {self.remote_path(o.server_name, 'gone', extra='?timeout_ms=1500')}"
                          f" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n").encode())
        deadline = time.monotonic() + 5
        while a.metric("atrium_media_fetch_budget_in_flight") != 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(a.metric("atrium_media_fetch_budget_in_flight"), 5)
        for sock in socks:
            sock.close()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (a.metric("atrium_media_fetch_budget_in_flight") or
                                               a.metric("atrium_media_delivering")):
            time.sleep(0.1)
        self.assertEqual(self.settled(a, "atrium_media_fetch_budget_in_flight"), 0)
        self.assertEqual(a.metric("atrium_media_delivering"), 0)
        self.assertEqual(a.metric("atrium_media_fetch_line_waiting"), 0)
        self.assertEqual(o.media_hits("gone"), 1)
        status, _ = a.json("GET", "/_matrix/client/versions")
        self.assertEqual(status, 200)

    def test_after_kill_9_during_fetches_no_torn_copy_is_ever_served(self):
        o = self.origin()
        for i in range(3):
            o.files[f"k{i}"] = ("ok", os.urandom(80000), "application/octet-stream")
            o.files[f"s{i}"] = ("slow", os.urandom(400000), 30)
        a = self.start_fed(A_IP)
        _, token = register(a)
        names = [f"k{i}" for i in range(3)] + [f"s{i}" for i in range(3)]
        for name in names:
            threading.Thread(target=lambda n=name: self._quiet_get(a, o, n, token),
                             daemon=True).start()
        deadline = time.monotonic() + 10
        while (harness.psql("SELECT count(*) FROM media_remote", a.database) != [["3"]] and
               time.monotonic() < deadline):
            time.sleep(0.05)
        time.sleep(0.3)  # the slow ones are half-way
        a.kill()
        a.start()
        rows = harness.psql("SELECT media_id, file_name, sha256, size_bytes FROM media_remote"
                            " ORDER BY media_id", a.database)
        self.assertEqual([r[0] for r in rows], ["k0", "k1", "k2"])
        for media_id, file_name, digest, size in rows:
            with open(os.path.join(a.store, file_name), "rb") as f:
                content = f.read()
            self.assertEqual((sha(content), len(content)), (digest, int(size)))
            self.assertEqual(digest, sha(o.files[media_id][1]))
        on_disk = sorted(os.path.relpath(os.path.join(root, f), a.store)
                         for root, _, fs in os.walk(os.path.join(a.store, "remote")) for f in fs)
        self.assertEqual(on_disk, sorted(r[1] for r in rows))
        for i in range(3):
            status, _, body = a.request("GET", self.remote_path(o.server_name, f"k{i}"),
                                        token=token, timeout=30)
            self.assertEqual((status, sha(body)), (200, sha(o.files[f"k{i}"][1])))
            self.assertEqual(o.media_hits(f"k{i}"), 1)

    def _quiet_get(self, a, o, name, token):
        try:
            a.request("GET", self.remote_path(o.server_name, name), token=token, timeout=60)
        except (OSError, http.client.HTTPException):
            pass  # the server was killed under it

    def test_quarantined_remote_media_is_404_by_id_and_by_hash(self):
        o = self.origin()
        o.files["q1"] = ("ok", b"quarantine me", "text/plain")
        o.files["q2"] = ("ok", b"refused bytes", "text/plain")
        a = self.start_fed(A_IP, shared=True)
        _, token = register(a)
        _, admin = register(a, admin=True)
        path1, path2 = (self.remote_path(o.server_name, n) for n in ("q1", "q2"))
        self.assertEqual(a.request("GET", path1, token=token, timeout=30)[0], 200)
        status, _ = a.json("POST", f"/_synapse/admin/v1/media/quarantine/{o.server_name}/q1", {},
                           token=admin)
        self.assertEqual(status, 200)
        self.assert_failure(a.request("GET", path1, token=token), 404, "M_NOT_FOUND")
        # By hash, before the file was ever fetched: checked on the fetched bytes.
        status, _ = a.json("POST", "/_atrium/admin/v1/media/quarantine_hash/"
                           f"{sha(b'refused bytes')}", {}, token=admin)
        self.assertEqual(status, 200)
        self.assert_failure(a.request("GET", path2, token=token, timeout=30), 404, "M_NOT_FOUND")
        self.assertEqual(o.media_hits("q1"), 1)

    def test_allow_remote_false_and_blocked_origins_are_404_without_a_fetch(self):
        o = self.origin()
        o.files["x"] = ("ok", b"hello", "text/plain")
        a = self.start_fed(A_IP, media={"prevent_media_downloads_from": "evil.example, " + o.server_name})
        _, token = register(a)
        self.assert_failure(a.request("GET", self.remote_path(o.server_name, "x"), token=token),
                            404, "M_NOT_FOUND")
        o2 = self.origin(ORIGIN2_IP)
        o2.files["y"] = ("ok", b"hello", "text/plain")
        self.assert_failure(a.request("GET", self.remote_path(o2.server_name, "y",
                                                              extra="?allow_remote=false"),
                                      token=token), 404, "M_NOT_FOUND")
        self.assertEqual(o.media_hits("x") + o2.media_hits("y"), 0)
        status, _, body = a.request("GET", self.remote_path(o2.server_name, "y"), token=token,
                                    timeout=30)
        self.assertEqual((status, body), (200, b"hello"))


if __name__ == "__main__":
    unittest.main()
