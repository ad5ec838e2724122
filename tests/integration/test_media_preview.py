"""URL previews (plugins/media/preview.c): GET /_matrix/client/v1/media/preview_url and the
older /_matrix/media/v3 (and r0) path, off by default.

A fake site written here serves HTTPS from the test CA (or plain HTTP) on its own loopback
address and counts what it is asked; the server under
test trusts the CA (federation.custom_ca_list) and allows loopback past the address
blacklist (federation.ip_range_whitelist), except where a test wants the blacklist to bite.

Tests on the default settings share the module's one server (PreviewCase.shared_server),
each with users and sites of its own, counting from the values before it.
"""

import http.server
import json
import os
import shutil
import ssl
import tempfile
import threading
import time
import unittest
from urllib.parse import quote

import harness
from common import wait_until
from federation_support import TestCA, free_port
from media_support import media_server, png, register

SITE_IP = "127.0.0.51"
PLAIN_SITE_IP = "127.0.0.52"  # a plain-http site
PREVIEW = "/_matrix/client/v1/media/preview_url"
LEGACY = "/_matrix/media/v3/preview_url"
CAP_BYTES = 65536
TIMEOUT_MS = 1500


class FakeSite:
    """An HTTPS site (plain HTTP with tls=False). `pages[path]` is (status, content_type, body bytes, extra headers),
    ("hang",): the answer is held until the test ends, or ("gate", event, status,
    content_type, body, headers): answered once the test sets the event. `hits[path]` counts
    requests (the query is not part of the path)."""

    def __init__(self, ca, ip=SITE_IP, tls=True):
        self.ip = ip
        self.port = free_port(ip)
        self.base = f"{'https' if tls else 'http'}://{ip}:{self.port}"
        self.pages = {}
        self.hits = {}
        self.lock = threading.Lock()
        self.release = threading.Event()
        cert, key = ca.issue(f"site-{ip}", ip)
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                path = self.path.split("?", 1)[0]
                with outer.lock:
                    outer.hits[path] = outer.hits.get(path, 0) + 1
                spec = outer.pages.get(path, (404, "text/plain", b"no such page", {}))
                if spec[0] == "hang":
                    outer.release.wait(30)
                    return
                if spec[0] == "gate":
                    spec[1].wait(30)
                    spec = spec[2:]
                status, ctype, body, extra = spec
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(body)))
                    for k, v in extra.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
                    pass

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer((ip, self.port), Handler)
        self.httpd.daemon_threads = True
        if tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(cert, key)
            self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def page(self, path, body, ctype="text/html; charset=utf-8", status=200, headers=None):
        self.pages[path] = (status, ctype, body if isinstance(body, bytes) else body.encode(),
                            headers or {})

    def count(self, path):
        with self.lock:
            return self.hits.get(path, 0)

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


OG_PAGE = """<!DOCTYPE html>
<html><head>
<title>Not this title</title>
<!-- <meta property="og:title" content="commented out"> -->
<meta property="og:title" content="Atrium &amp; the &quot;preview&quot; test">
<meta property="og:description" content="  A page   with
  OpenGraph tags  ">
<meta property='og:site_name' content='Fake Site'>
<meta property="og:image" content="/img/pic.png">
<meta property="og:image:width" content="999">
<script>var s = '<meta property="og:type" content="script">';</script>
</head><body><p>Hello</p></body></html>
"""


_MODULE = {}  # the module's test CA and the base URLs its fake sites had


class PreviewCase(harness.AtriumTestCase):
    @classmethod
    def setUpClass(cls):
        """One CA for the module: its shared server trusts the sites of every class."""
        if not _MODULE:
            tmp = tempfile.mkdtemp(prefix="atrium-media-preview-")
            unittest.addModuleCleanup(shutil.rmtree, tmp, True)  # after the servers stop
            _MODULE.update(ca=TestCA(tmp), bases=set())
        cls.ca = _MODULE["ca"]

    def site(self, tls=True):
        """A fake site whose base URL no other test of the module had: the shared server's
        cached previews of one test's site are never another's."""
        s = FakeSite(self.ca, SITE_IP if tls else PLAIN_SITE_IP, tls)
        while s.base in _MODULE["bases"]:
            s.close()
            s = FakeSite(self.ca, SITE_IP if tls else PLAIN_SITE_IP, tls)
        _MODULE["bases"].add(s.base)
        self.addCleanup(s.close)
        return s

    def shared_server(self):
        """The module's one server (media_server(shared="module")) on the settings of
        server(), following 3 redirects: for tests with users and sites of their own that
        count from the values before them."""
        return self.server(media={"url_preview_max_redirects": 3}, shared="module")

    def count(self, srv, name, labels=None):
        return srv.metric(name, labels) or 0

    def server(self, enabled=True, whitelist=("127.0.0.0/8",), media=None, shared=False):
        conf = {"url_preview_max_bytes": CAP_BYTES, "url_preview_timeout_ms": TIMEOUT_MS,
                "url_preview_max_in_flight": 2, "url_preview_max_per_user": 2}
        if enabled:
            conf["url_preview_enabled"] = True
        conf.update(media or {})
        fed = {"custom_ca_list": [self.ca.cert], "ip_range_whitelist": list(whitelist),
               "client": {"request_timeout_ms": 5000}}
        return media_server(self, media=conf, settings={"federation": fed}, shared=shared)

    def preview(self, srv, token, url, ts=None, path=PREVIEW, timeout=20):
        q = f"{path}?url={quote(url, safe='')}" + (f"&ts={ts}" if ts is not None else "")
        status, headers, body = srv.request("GET", q, token=token, timeout=timeout)
        return status, json.loads(body) if body else None

    def assert_error(self, result, status, errcode):
        got, body = result
        self.assertEqual((got, body and body.get("errcode")), (status, errcode), body)


class PreviewContentTest(PreviewCase):
    def test_a_page_previews_its_opengraph_and_its_image_is_stored_as_local_media(self):
        site = self.site()
        image = png(20, 10)
        site.page("/article", OG_PAGE)
        site.page("/img/pic.png", image, "image/png")
        srv = self.shared_server()
        _, token = register(srv)
        status, og = self.preview(srv, token, site.base + "/article#section")
        self.assertEqual(status, 200, og)
        self.assertEqual(og["og:title"], 'Atrium & the "preview" test')
        self.assertEqual(og["og:description"], "A page with OpenGraph tags")
        self.assertEqual(og["og:site_name"], "Fake Site")
        self.assertNotIn("og:type", og)  # inside <script>: not a tag
        self.assertEqual(og["og:image:type"], "image/png")
        self.assertEqual(og["matrix:image:size"], len(image))
        # the stored image's header, not what the page claimed
        self.assertEqual((og["og:image:width"], og["og:image:height"]), (20, 10))
        prefix = f"mxc://{srv.server_name}/"
        self.assertTrue(og["og:image"].startswith(prefix), og["og:image"])
        media_id = og["og:image"][len(prefix):]
        status, headers, body = srv.request(
            "GET", f"/_matrix/client/v1/media/download/{srv.server_name}/{media_id}", token=token)
        self.assertEqual((status, body), (200, image))
        self.assertEqual(headers["Content-Type"], "image/png")
        self.assertEqual((site.count("/article"), site.count("/img/pic.png")), (1, 1))

    def test_a_repeat_within_the_ttl_is_answered_from_the_cache_without_asking_the_site(self):
        site = self.site()
        site.page("/article", OG_PAGE)
        site.page("/img/pic.png", png(8, 8), "image/png")
        srv = self.shared_server()
        _, token = register(srv)
        asked0 = self.count(srv, "atrium_media_url_preview_requests_total")
        cached0 = self.count(srv, "atrium_media_url_previews_total", {"result": "cached"})
        fetched0 = self.count(srv, "atrium_media_url_previews_total", {"result": "fetched"})
        first = self.preview(srv, token, site.base + "/article")
        self.assertEqual(first[0], 200, first[1])
        asked = srv.metric("atrium_media_url_preview_requests_total")
        self.assertEqual(asked - asked0, 2)  # the page and its image
        _, other = register(srv)
        again = self.preview(srv, other, site.base + "/article")
        self.assertEqual(again, first)
        self.assertEqual((site.count("/article"), site.count("/img/pic.png")), (1, 1))
        self.assertEqual(srv.metric("atrium_media_url_preview_requests_total"), asked)
        self.assertEqual(srv.metric("atrium_media_url_previews_total", {"result": "cached"}) - cached0, 1)
        self.assertEqual(srv.metric("atrium_media_url_previews_total", {"result": "fetched"}) - fetched0, 1)
        # a ts in another TTL window is another preview: the site is asked again
        old = self.preview(srv, token, site.base + "/article", ts=1000)
        self.assertEqual(old[0], 200)
        self.assertEqual(site.count("/article"), 2)

    def test_title_and_meta_description_stand_in_when_the_page_declares_no_opengraph(self):
        site = self.site()
        site.page("/plain", "<html><head><TITLE>\n  Plain  page &#8212; caf\xe9\n</TITLE>"
                  '<meta name="Description" content="Said by meta">'
                  '<meta property="og:image" content="ftp://elsewhere/x.png"></head></html>'
                  .encode("latin-1"), "text/html; charset=ISO-8859-1")
        srv = self.shared_server()
        _, token = register(srv)
        status, og = self.preview(srv, token, site.base + "/plain")
        self.assertEqual(status, 200, og)
        self.assertEqual(og, {"og:title": "Plain page \u2014 caf\u00e9", "og:description": "Said by meta"})

    def test_an_image_url_previews_as_itself_and_other_types_as_nothing(self):
        site = self.site()
        image = png(30, 40)
        site.page("/photo.png", image, "image/png")
        site.page("/data.json", b'{"a": 1}', "application/json")
        srv = self.shared_server()
        _, token = register(srv)
        status, og = self.preview(srv, token, site.base + "/photo.png")
        self.assertEqual(status, 200, og)
        self.assertEqual((og["og:image:width"], og["og:image:height"], og["matrix:image:size"]),
                         (30, 40, len(image)))
        media_id = og["og:image"].rsplit("/", 1)[1]
        got = srv.request("GET", f"/_matrix/client/v1/media/download/{srv.server_name}/{media_id}",
                          token=token)
        self.assertEqual((got[0], got[2]), (200, image))
        self.assertEqual(self.preview(srv, token, site.base + "/data.json"), (200, {}))

    def test_redirects_are_followed_up_to_the_bound_and_a_site_error_is_502(self):
        site = self.site()
        site.page("/moved", b"", status=302, headers={"Location": "/article"})
        site.page("/article", "<title>Arrived</title>")
        site.page("/loop", b"", status=301, headers={"Location": f"{site.base}/loop"})
        srv = self.shared_server()
        _, token = register(srv)
        self.assertEqual(self.preview(srv, token, site.base + "/moved"), (200, {"og:title": "Arrived"}))
        self.assert_error(self.preview(srv, token, site.base + "/loop"), 502, "M_UNKNOWN")
        self.assertEqual(site.count("/loop"), 4)  # the first ask and three redirects
        self.assert_error(self.preview(srv, token, site.base + "/nothing-here"), 502, "M_UNKNOWN")


class PreviewBoundsTest(PreviewCase):
    def test_a_page_over_the_size_cap_is_502_too_large(self):
        site = self.site()
        site.page("/huge", "<title>big</title>" + "x" * (CAP_BYTES * 3))
        srv = self.shared_server()
        _, token = register(srv)
        self.assert_error(self.preview(srv, token, site.base + "/huge"), 502, "M_TOO_LARGE")

    def test_an_image_over_the_size_cap_is_left_out_and_the_page_still_previews(self):
        site = self.site()
        site.page("/article", '<title>T</title><meta property="og:image" content="big.png">')
        site.page("/big.png", os.urandom(CAP_BYTES * 2), "image/png")
        srv = self.shared_server()
        _, token = register(srv)
        self.assertEqual(self.preview(srv, token, site.base + "/article"), (200, {"og:title": "T"}))
        self.assertEqual(site.count("/big.png"), 1)

    def test_a_site_that_never_answers_is_504_by_the_deadline_and_a_full_budget_is_429(self):
        site = self.site()
        site.pages["/slow"] = ("hang",)
        site.page("/fast", "<title>Fast</title>")
        srv = self.server(media={"url_preview_max_in_flight": 3, "url_preview_max_per_user": 2})
        _, alice = register(srv)
        _, bob = register(srv)
        _, carol = register(srv)
        results = []

        def slow(token, i):
            t0 = time.monotonic()
            results.append((self.preview(srv, token, f"{site.base}/slow?{i}"), time.monotonic() - t0))

        def hold(token, i, want):
            t = threading.Thread(target=slow, args=(token, i))
            t.start()
            deadline = time.monotonic() + 5
            while srv.metric("atrium_budget_in_use", {"budget": "media.url_preview"}) != want:
                self.assertLess(time.monotonic(), deadline, f"the budget never reached {want}")
                time.sleep(0.02)
            return t

        threads = [hold(alice, 1, 1), hold(alice, 2, 2)]
        # alice holds her share: her third is refused at once, bob is served meanwhile
        t0 = time.monotonic()
        self.assert_error(self.preview(srv, alice, f"{site.base}/slow?3"), 429, "M_LIMIT_EXCEEDED")
        self.assertLess(time.monotonic() - t0, 1.0)
        self.assertEqual(self.preview(srv, bob, site.base + "/fast"), (200, {"og:title": "Fast"}))
        # bob's slow one fills the budget: anyone's next is refused at once
        threads.append(hold(bob, 4, 3))
        t0 = time.monotonic()
        self.assert_error(self.preview(srv, carol, site.base + "/fast?again"), 429, "M_LIMIT_EXCEEDED")
        self.assertLess(time.monotonic() - t0, 1.0)
        self.assertEqual(srv.metric("atrium_media_url_previews_total", {"result": "refused"}), 2)
        # no request thread waits on the site: the server answers everything else
        self.assertEqual(srv.request("GET", "/health")[0], 200)
        for t in threads:
            t.join(20)
        self.assertEqual(len(results), 3)
        for result, took in results:
            self.assert_error(result, 504, "M_UNKNOWN")
            self.assertLess(took, TIMEOUT_MS / 1000 + 3)
        self.assertEqual(srv.metric("atrium_budget_in_use", {"budget": "media.url_preview"}), 0)
        # the budget is whole again
        self.assertEqual(self.preview(srv, carol, site.base + "/fast?later"), (200, {"og:title": "Fast"}))


class PreviewCoalescingTest(PreviewCase):
    """Requests for the same URL and ts bucket while its fetch is under way wait for it:
    the site is asked once, whatever the number of requests."""

    def concurrently(self, srv, tokens, url, ts):
        results = [None] * len(tokens)

        def one(i):
            results[i] = self.preview(srv, tokens[i], url, ts=ts)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(tokens))]
        for t in threads:
            t.start()
        return threads, results

    def wait_metric(self, srv, name, labels, want):
        wait_until(lambda: srv.metric(name, labels) == want, timeout=5, interval=0.02,
                   what=f"{name}{labels} == {want}")

    def test_simultaneous_requests_for_one_url_make_one_fetch_and_get_the_same_answer(self):
        site = self.site()
        gate = threading.Event()
        self.addCleanup(gate.set)
        site.pages["/gated"] = ("gate", gate, 200, "text/html",
                                b'<title>Once</title><meta property="og:image" content="/p.png">',
                                {})
        site.page("/p.png", png(12, 6), "image/png")
        srv = self.shared_server()
        _, alice = register(srv)
        coalesced0 = self.count(srv, "atrium_media_url_previews_total", {"result": "coalesced"})
        fetched0 = self.count(srv, "atrium_media_url_previews_total", {"result": "fetched"})
        _, bob = register(srv)
        _, carol = register(srv)
        # alice's share of the fetch budget is 2: waiting requests do not count against it
        tokens = [alice, alice, alice, bob, carol, bob]
        threads, results = self.concurrently(srv, tokens, site.base + "/gated", 5000)
        self.wait_metric(srv, "atrium_media_url_previews_total", {"result": "coalesced"},
                         coalesced0 + len(tokens) - 1)
        self.assertEqual(srv.metric("atrium_flights_waiters", {"flights": "media.url_preview"}),
                         len(tokens) - 1)
        # the waiters can all be counted before the one fetch has reached the site
        wait_until(lambda: site.count("/gated") >= 1, timeout=5, interval=0.02,
                   what="the fetch reaching the site")
        self.assertEqual(site.count("/gated"), 1)
        gate.set()
        for t in threads:
            t.join(20)
        self.assertEqual(results[0][0], 200, results[0][1])
        self.assertEqual(results[0][1]["og:title"], "Once")
        self.assertTrue(results[0][1]["og:image"].startswith("mxc://"), results[0][1])
        self.assertEqual(results, [results[0]] * len(tokens))
        self.assertEqual((site.count("/gated"), site.count("/p.png")), (1, 1))
        self.assertEqual(srv.metric("atrium_media_url_previews_total", {"result": "fetched"}) - fetched0, 1)
        self.assertEqual(srv.metric("atrium_flights_waiters", {"flights": "media.url_preview"}), 0)
        # an error is shared the same way (and not cached: a later request asks again)
        gate2 = threading.Event()
        self.addCleanup(gate2.set)
        site.pages["/failing"] = ("gate", gate2, 410, "text/plain", b"gone", {})
        threads, results = self.concurrently(srv, [alice, bob, carol], site.base + "/failing", 5000)
        self.wait_metric(srv, "atrium_media_url_previews_total", {"result": "coalesced"},
                         coalesced0 + len(tokens) - 1 + 2)
        gate2.set()
        for t in threads:
            t.join(20)
        for result in results:
            self.assert_error(result, 502, "M_UNKNOWN")
        self.assertEqual(results, [results[0]] * 3)
        self.assertEqual(site.count("/failing"), 1)
        self.assert_error(self.preview(srv, alice, site.base + "/failing", ts=5000), 502, "M_UNKNOWN")
        self.assertEqual(site.count("/failing"), 2)

    def test_waiting_requests_are_bounded_and_get_504_with_the_fetch_past_its_deadline(self):
        site = self.site()
        site.pages["/slow"] = ("hang",)
        srv = self.server(media={"url_preview_max_waiting": 2})
        _, alice = register(srv)
        _, bob = register(srv)
        t0 = time.monotonic()
        threads, results = self.concurrently(srv, [alice], site.base + "/slow", 7000)
        self.wait_metric(srv, "atrium_budget_in_use", {"budget": "media.url_preview"}, 1)
        more, waited = self.concurrently(srv, [bob, bob], site.base + "/slow", 7000)
        self.wait_metric(srv, "atrium_flights_waiters", {"flights": "media.url_preview"}, 2)
        # the waiting line is full: the next is refused at once
        t1 = time.monotonic()
        self.assert_error(self.preview(srv, alice, site.base + "/slow", ts=7000), 429,
                          "M_LIMIT_EXCEEDED")
        self.assertLess(time.monotonic() - t1, 1.0)
        for t in threads + more:
            t.join(20)
        for result in results + waited:
            self.assert_error(result, 504, "M_UNKNOWN")
        self.assertLess(time.monotonic() - t0, TIMEOUT_MS / 1000 + 3)
        self.assertEqual(site.count("/slow"), 1)
        self.assertEqual(srv.metric("atrium_media_url_previews_total", {"result": "coalesced"}), 2)
        self.assertEqual(srv.metric("atrium_flights_waiters", {"flights": "media.url_preview"}), 0)


class PreviewPlainHttpTest(PreviewCase):
    def test_a_plain_http_site_previews_with_its_image_fetched_over_http_too(self):
        site = self.site(tls=False)
        image = png(16, 9)
        site.page("/article", OG_PAGE)
        site.page("/img/pic.png", image, "image/png")
        srv = self.shared_server()
        _, token = register(srv)
        status, og = self.preview(srv, token, site.base + "/article")
        self.assertEqual(status, 200, og)
        self.assertEqual(og["og:title"], 'Atrium & the "preview" test')
        self.assertEqual((og["og:image:width"], og["og:image:height"], og["matrix:image:size"]),
                         (16, 9, len(image)))
        self.assertEqual((site.count("/article"), site.count("/img/pic.png")), (1, 1))

    def test_a_redirect_from_https_to_http_is_followed(self):
        site = self.site()
        plain = self.site(tls=False)
        site.page("/moved", b"", status=301, headers={"Location": plain.base + "/landing"})
        plain.page("/landing", "<title>Over plain http</title>")
        srv = self.shared_server()
        _, token = register(srv)
        self.assertEqual(self.preview(srv, token, site.base + "/moved"),
                         (200, {"og:title": "Over plain http"}))
        self.assertEqual((site.count("/moved"), plain.count("/landing")), (1, 1))

    def test_an_http_url_to_a_blacklisted_address_is_refused_with_403_and_never_reached(self):
        plain = self.site(tls=False)
        plain.page("/article", OG_PAGE)
        # PLAIN_SITE_IP stays blacklisted (a module server: see test_a_redirect_to_a_...)
        srv = self.server(whitelist=(f"{SITE_IP}/32",), shared="module")
        _, token = register(srv)
        self.assert_error(self.preview(srv, token, plain.base + "/article"), 403, "M_UNKNOWN")
        self.assertEqual(plain.count("/article"), 0)


class PreviewRefusalTest(PreviewCase):
    def test_bad_input_is_refused_at_once_without_a_fetch(self):
        site = self.site()
        srv = self.shared_server()
        _, token = register(srv)
        asked0 = self.count(srv, "atrium_media_url_preview_requests_total")
        status, body = srv.json("GET", PREVIEW, token=token)
        self.assertEqual((status, body["errcode"]), (400, "M_MISSING_PARAM"))
        for url in ("ftp://example.org/x", "not a url", "https:///nohost", "javascript:alert(1)",
                    f"https://user@{SITE_IP}:{site.port}/", f"http://user@{SITE_IP}:{site.port}/"):
            self.assert_error(self.preview(srv, token, url), 400, "M_INVALID_PARAM")
        self.assert_error(self.preview(srv, token, site.base + "/", ts="soon"), 400, "M_INVALID_PARAM")
        status, body = srv.json("GET", f"{PREVIEW}?url={quote(site.base)}")
        self.assertEqual((status, body["errcode"]), (401, "M_MISSING_TOKEN"))
        self.assertEqual(site.hits, {})
        self.assertEqual(self.count(srv, "atrium_media_url_preview_requests_total") - asked0, 0)

    def test_a_blacklisted_address_is_refused_with_403_and_never_reached(self):
        site = self.site()
        site.page("/article", OG_PAGE)
        srv = self.server(whitelist=())  # loopback is in the default blacklist
        _, token = register(srv)
        self.assert_error(self.preview(srv, token, site.base + "/article"), 403, "M_UNKNOWN")
        self.assertEqual(site.count("/article"), 0)

    def test_a_redirect_to_a_blacklisted_address_is_refused_at_connect(self):
        site = self.site()
        site.page("/go", b"", status=302, headers={"Location": "https://10.255.255.1:8443/x"})
        srv = self.server(whitelist=(f"{SITE_IP}/32",), shared="module")
        _, token = register(srv)
        self.assert_error(self.preview(srv, token, site.base + "/go"), 403, "M_UNKNOWN")
        self.assertEqual(site.count("/go"), 1)
        self.assertIn("10.255.255.1", srv.log_text())

    def test_previews_are_off_by_default_and_then_unrecognized_on_every_path(self):
        site = self.site()
        site.page("/article", OG_PAGE)
        srv = self.server(enabled=False)
        _, token = register(srv)
        for path in (PREVIEW, LEGACY, "/_matrix/media/r0/preview_url"):
            self.assert_error(self.preview(srv, token, site.base + "/article", path=path),
                              404, "M_UNRECOGNIZED")
        self.assertEqual(site.hits, {})

    def test_the_legacy_v3_and_r0_paths_preview_too_when_enabled(self):
        site = self.site()
        site.page("/t", "<title>Legacy</title>")
        srv = self.shared_server()
        _, token = register(srv)
        for path in (LEGACY, "/_matrix/media/r0/preview_url"):
            self.assertEqual(self.preview(srv, token, site.base + "/t", path=path),
                             (200, {"og:title": "Legacy"}))


if __name__ == "__main__":
    unittest.main()
