"""Federation transport: two Atrium processes on loopback with IP-literal server names and
TLS from a CA made for the test, each fetching the other's key and verifying the other's
signed requests; the refusals of the X-Matrix check, each named in the log; key rotation;
the certificate reloaded on SIGHUP; address blacklisting at connect; a peer that never
answers, and the rooms' remote pool held full by joins through one; and backoff that
survives a restart.

A fake key server (federation_support.FakeKeyServer) plays the peer where the test needs
one that misbehaves: expired keys, signatures by keys it never published.
"""

import itertools
import os
import re
import signal
import socket
import ssl
import tempfile
import threading
import time
import unittest
import shutil

import harness
from accounts import REGISTRATION_ON, quote, register
from common import Background, wait_until
from rooms_client import Client
from federation_support import (FakeKeyServer, FederatedServer, HungServer, SigningKey, TestCA,
                                sign_json, verify_json, xmatrix)

A_IP, B_IP, FAKE_IP, HUNG_IP = "127.0.0.21", "127.0.0.22", "127.0.0.31", "127.0.0.41"
PROFILE = "/_matrix/federation/v1/query/profile?user_id="
_names = itertools.count(1)  # users of their own on servers that tests share


class FederationTestCase(harness.AtriumTestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="atrium-fed-ca-")
        cls.ca = TestCA(cls.tmp)
        cls.class_servers = {}  # start_class_fed's, by address

    @classmethod
    def tearDownClass(cls):
        try:
            problems = []
            for srv in cls.class_servers.values():
                try:
                    srv.close()
                except harness.ServerError as e:
                    problems.append(str(e))
            if problems:  # an unclean exit or a sanitizer report fails the class
                raise harness.ServerError("; ".join(problems))
        finally:
            shutil.rmtree(cls.tmp, ignore_errors=True)

    def start_class_fed(self, ip, extra=None, **kwargs):
        """The server on ip that this class's tests share (start_fed's extra settings and
        FederatedServer's kwargs: every call of a class passes the same): started
        by the first test that asks, stopped and checked (exit code, sanitizer reports) in
        tearDownClass. A server start costs about a CPU-second under ASan; a class whose
        tests each make their own users and rooms, and stop no server, needs one, not one
        per test. A failed test marks it, so its log is kept."""
        servers = type(self).class_servers
        srv = servers.get(ip)
        if srv is None:
            srv = servers[ip] = harness.start_shared(FederatedServer(
                self.ca, ip, extra=harness.deep_merge(REGISTRATION_ON, extra or {}),
                start=False, **kwargs))
        harness.mark_on_failure(self, srv)
        return srv

    def start_fed(self, ip, extra=None, start=True, **kwargs):
        srv = FederatedServer(self.ca, ip, extra=harness.deep_merge(REGISTRATION_ON, extra or {}),
                              start=False, **kwargs)

        def close():
            outcome = getattr(self, "_outcome", None)
            if outcome is not None and not getattr(outcome, "success", True):
                srv._failed = True
            srv.close()

        self.addCleanup(close)
        if start:
            srv.start()
        return srv

    def fake_peer(self, ip=FAKE_IP):
        peer = FakeKeyServer(self.ca, ip)
        self.addCleanup(peer.close)
        return peer


class KeyServerTest(FederationTestCase):
    """Keys across restarts: servers of their own."""

    def test_the_same_key_comes_back_after_a_restart(self):
        a = self.start_fed(A_IP)
        _, _, before = a.fed_request("GET", "/_matrix/key/v2/server")
        a.stop()
        a.start()
        _, _, after = a.fed_request("GET", "/_matrix/key/v2/server")
        self.assertEqual(before["verify_keys"], after["verify_keys"])

    def test_a_rotated_key_is_published_as_old_and_still_verifies_what_it_signed(self):
        a = self.start_fed(A_IP)
        _, _, first = a.fed_request("GET", "/_matrix/key/v2/server")
        [(old_id, old)] = first["verify_keys"].items()
        a.stop()
        os.rename(os.path.join(a.dir, f"{a.server_name}.signing.key"),
                  os.path.join(a.dir, "old.key"))
        a._settings = harness.deep_merge(a._settings, {"federation": {"old_signing_keys": {
            old_id: {"key": old["key"], "expired_ts": int(time.time() * 1000)}}}})
        a.write_config()
        a.start()
        _, _, second = a.fed_request("GET", "/_matrix/key/v2/server")
        self.assertNotIn(old_id, second["verify_keys"])
        self.assertEqual(second["old_verify_keys"][old_id]["key"], old["key"])
        # What the old key signed (the first document) still verifies with the published
        # old key; B, asked as a notary, serves A's new document with both signatures.
        self.assertTrue(verify_json(first, a.server_name, old_id,
                                    second["old_verify_keys"][old_id]["key"]))
        b = self.start_fed(B_IP)
        status, _, notary = b.fed_request("GET", f"/_matrix/key/v2/query/{a.server_name}")
        self.assertEqual(status, 200, notary)
        [doc] = [d for d in notary["server_keys"] if d["server_name"] == a.server_name]
        self.assertIn(old_id, doc["old_verify_keys"])
        [(new_id, new)] = second["verify_keys"].items()
        self.assertTrue(verify_json(doc, a.server_name, new_id, new["key"]))
        _, _, bdoc = b.fed_request("GET", "/_matrix/key/v2/server")
        [(b_id, b_key)] = bdoc["verify_keys"].items()
        self.assertTrue(verify_json(doc, b.server_name, b_id, b_key["key"]))


def harness_b64decode(text):
    import base64
    return base64.b64decode(text + "=" * (-len(text) % 4))


class KeyDocument:
    def test_key_document_is_signed_by_its_own_key_and_served_only_on_the_federation_port(self):
        a = self.start_class_fed(A_IP)
        status, _, doc = a.fed_request("GET", "/_matrix/key/v2/server")
        self.assertEqual(status, 200, doc)
        self.assertEqual(doc["server_name"], a.server_name)
        [(key_id, key)] = doc["verify_keys"].items()
        self.assertTrue(key_id.startswith("ed25519:a_"), key_id)
        self.assertTrue(verify_json(doc, a.server_name, key_id, key["key"]))
        week_ms = 7 * 24 * 3600 * 1000
        self.assertAlmostEqual(doc["valid_until_ts"], time.time() * 1000 + week_ms, delta=60000)
        self.assertEqual(doc["old_verify_keys"], {})
        # The key file, in Synapse's format, beside the config.
        with open(os.path.join(a.dir, f"{a.server_name}.signing.key")) as f:
            algo, version, seed = f.read().split()
        self.assertEqual((algo, "ed25519:" + version), ("ed25519", key_id))
        self.assertEqual(SigningKey(version, harness_b64decode(seed)).public_b64, key["key"])
        # Listeners serve their own paths only.
        status, _, body = a.request("GET", "/_matrix/key/v2/server")
        self.assertEqual((status, harness.jsonlib.loads(body)["errcode"]), (404, "M_UNRECOGNIZED"))
        status, _, body = a.fed_request("GET", "/_matrix/client/versions")
        self.assertEqual((status, body["errcode"]), (404, "M_UNRECOGNIZED"))
        status, _, body = a.fed_request("GET", "/_matrix/federation/v1/version")
        self.assertEqual((status, body["server"]["name"]), (200, "Atrium"))


class SignedRequests:
    def test_each_server_verifies_the_others_signed_profile_query(self):
        a = self.start_class_fed(A_IP)
        b = self.start_class_fed(B_IP)
        verified = [srv.metric("atrium_federation_inbound_verified_total") or 0 for srv in (a, b)]
        n = next(_names)
        alice = register(a, f"alice{n}")
        bob = register(b, f"bob{n}")
        status, body = b.json("GET", f"/_matrix/client/v3/profile/{quote(alice.user_id)}",
                              token=bob.token)
        self.assertEqual((status, body), (200, {"displayname": f"alice{n}"}))
        status, body = a.json("GET", f"/_matrix/client/v3/profile/{quote(bob.user_id)}/displayname",
                              token=alice.token)
        self.assertEqual((status, body), (200, {"displayname": f"bob{n}"}))
        status, body = a.json("GET", f"/_matrix/client/v3/profile/{quote('@nobody:' + b.server_name)}",
                              token=alice.token)
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"))
        # Each verified the other's signature (after fetching the other's key, or with the
        # key an earlier test of the class made it fetch).
        self.assertGreaterEqual(a.metric("atrium_federation_inbound_verified_total"), verified[0] + 1)
        self.assertGreaterEqual(b.metric("atrium_federation_inbound_verified_total"), verified[1] + 1)


class Refusals:
    """Signed requests of a fake peer (one per test: a name, a key and a key cache entry
    of its own) to A, and the refusals of the X-Matrix check, each named in A's log after
    the test began."""

    def setUp(self):
        self.peer = self.fake_peer()
        self.a = self.start_class_fed(A_IP)
        self.alice_name = f"alice{next(_names)}"
        register(self.a, self.alice_name)
        self.uri = PROFILE + quote(f"@{self.alice_name}:" + self.a.server_name)
        self.log_from = len(self.a.log_text())

    def log_since_setup(self):
        return self.a.log_text()[self.log_from:]

    def signed(self, uri=None, key=None, origin=None, destination=None, method="GET",
               content=None, sent_content=None):
        uri = uri or self.uri
        auth = xmatrix(method, uri, origin or self.peer.server_name,
                       destination or self.a.server_name, key or self.peer.key, content)
        return self.a.fed_request(method, uri, {"Authorization": auth},
                                  sent_content if sent_content is not None else content)

    def assert_refused(self, answer, check, status=401, errcode="M_UNAUTHORIZED"):
        got_status, _, body = answer
        self.assertEqual((got_status, body["errcode"]), (status, errcode), body)
        wait_until(lambda: re.search(rf"refused \(check {check}\)", self.log_since_setup()),
                   what=f"the refusal (check {check}) in A's log")

    def test_a_correctly_signed_request_is_answered(self):
        status, _, body = self.signed()
        self.assertEqual((status, body), (200, {"displayname": self.alice_name}))
        self.assertEqual(self.peer.requests.count("/_matrix/key/v2/server"), 1)
        self.signed()  # the key is cached now
        self.assertEqual(self.peer.requests.count("/_matrix/key/v2/server"), 1)

    def test_no_header(self):
        self.assert_refused(self.a.fed_request("GET", self.uri), "missing")

    def test_a_bad_signature(self):
        impostor = SigningKey(self.peer.key.key_id.split(":")[1])  # same ID, other key
        self.assert_refused(self.signed(key=impostor), "bad_signature")

    def test_a_key_the_origin_never_published(self):
        self.assert_refused(self.signed(key=SigningKey("nope")), "unknown_key")

    def test_a_key_past_its_validity(self):
        self.peer.valid_for_ms = -3600 * 1000
        answer = self.signed()
        self.assertEqual(answer[0], 401, answer)
        self.assertRegex(self.log_since_setup(), r"refused \(check (expired_key|unknown_key)\)")

    def test_a_wrong_destination(self):
        self.assert_refused(self.signed(destination="127.0.0.99:8448"), "destination")

    def test_a_body_altered_after_signing(self):
        uri = "/_matrix/federation/v1/no_such_thing"
        ok = self.signed(uri=uri, method="POST", content={"a": 1})
        self.assertEqual((ok[0], ok[2]["errcode"]), (404, "M_UNRECOGNIZED"))
        self.assert_refused(self.signed(uri=uri, method="POST", content={"a": 1},
                                        sent_content={"a": 2}), "bad_signature")

    def test_an_unsigned_probe_of_an_unknown_path_learns_nothing(self):
        self.assert_refused(self.a.fed_request("GET", "/_matrix/federation/v1/secret"), "missing")


class OnePairTest(KeyDocument, SignedRequests, Refusals, FederationTestCase):
    """The tests above on one pair of servers, A and B (a start costs about a CPU-second):
    each makes users of its own and stops no server."""


class WhitelistTest(FederationTestCase):
    def test_an_origin_outside_the_domain_whitelist_is_forbidden(self):
        peer = self.fake_peer()
        a = self.start_fed(A_IP, {"federation": {"domain_whitelist": ["127.0.0.99:8448"]}})
        uri = PROFILE + quote("@alice:" + a.server_name)
        auth = xmatrix("GET", uri, peer.server_name, a.server_name, peer.key)
        status, _, body = a.fed_request("GET", uri, {"Authorization": auth})
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"))
        a.wait_for_log(r"refused \(check not_allowed\)")
        self.assertEqual(peer.requests, [])  # its key was never even fetched


class OutboundTest(FederationTestCase):
    def test_a_blacklisted_address_is_refused_at_connect(self):
        b = self.start_fed(B_IP)
        register(b, "bob")
        # A keeps the default blacklist (loopback included): no whitelist.
        a = self.start_fed(A_IP, {"federation": {"ip_range_whitelist": []}})
        alice = register(a, "alice")
        before = b.metric("atrium_http_requests_total")
        status, body = a.json("GET", f"/_matrix/client/v3/profile/{quote('@bob:' + b.server_name)}",
                              token=alice.token)
        self.assertEqual(status, 502, body)
        # B saw nothing but the metrics request that reads this.
        self.assertEqual(b.metric("atrium_http_requests_total"), before + 1)

    def test_a_peer_that_never_answers_ends_at_the_deadline_and_is_then_backed_off(self):
        hung = HungServer(HUNG_IP)
        self.addCleanup(hung.close)
        name, accepted = hung.server_name, hung.accepted
        a = self.start_fed(A_IP, {"federation": {
            "client": {"request_timeout_ms": 1500},
            "destination_min_retry_interval_ms": 60000}})
        alice = register(a, "alice")
        path = f"/_matrix/client/v3/profile/{quote('@x:' + name)}"
        results = []

        def ask():
            results.append(a.json("GET", path, token=alice.token, timeout=20))

        t = threading.Thread(target=ask)
        started = time.monotonic()
        t.start()
        time.sleep(0.3)
        # Meanwhile the server answers everything else at once.
        for _ in range(5):
            t0 = time.monotonic()
            status, _ = a.json("GET", "/_matrix/client/versions")
            self.assertEqual(status, 200)
            self.assertLess(time.monotonic() - t0, 1.0)
        t.join()
        elapsed = time.monotonic() - started
        self.assertIn(results[0][0], (502, 504), results)
        self.assertLess(elapsed, 6.0)
        self.assertGreaterEqual(len(accepted), 1)
        # Backed off now: the next request fails at once without a connection.
        n = len(accepted)
        t0 = time.monotonic()
        status, _ = a.json("GET", path, token=alice.token)
        self.assertEqual(status, 502)
        self.assertLess(time.monotonic() - t0, 1.0)
        # ...and across a restart (the backoff is in PostgreSQL).
        a.stop()
        a.start()
        status, _ = a.json("GET", path, token=alice.token)
        self.assertEqual(status, 502)
        time.sleep(0.2)
        self.assertEqual(len(accepted), n)


    def test_a_signed_request_from_a_server_in_backoff_ends_its_backoff(self):
        peer = self.fake_peer()
        a = self.start_fed(A_IP, {"federation": {"destination_min_retry_interval_ms": 60000}})
        alice = register(a, "alice")
        profile = f"/_matrix/client/v3/profile/{quote('@x:' + peer.server_name)}"
        ask_a = f"/_matrix/federation/v1/query/profile?user_id={quote(alice.user_id)}"
        # A knows the peer's key (a first signed request), then fails to reach it.
        self.assertEqual(a.signed_request("GET", ask_a, peer.server_name, peer.key)[0], 200)
        peer.stop()
        self.assertEqual(a.json("GET", profile, token=alice.token)[0], 502)
        self.assertEqual(a.metric("atrium_federation_backoff_destinations"), 1)
        peer.start()
        n = len(peer.requests)
        self.assertEqual(a.json("GET", profile, token=alice.token)[0], 502)  # backed off
        self.assertEqual(len(peer.requests), n)
        # The peer's signed request says it is up: the backoff ends at once.
        self.assertEqual(a.signed_request("GET", ask_a, peer.server_name, peer.key)[0], 200)
        a.wait_for_log(rf"{re.escape(peer.server_name)} sent a signed request: its backoff is cleared")
        self.assertEqual(a.metric("atrium_federation_backoff_destinations"), 0)
        a.json("GET", profile, token=alice.token)  # reaches the peer now
        self.assertTrue(any(p.startswith("/_matrix/federation/v1/query/profile")
                            for p in peer.requests[n:]), peer.requests[n:])


FEDPLUG = {"fedplug": {"enabled": True,
                       "path": os.path.join(harness.test_plugin_dir(), "fedplug.so")}}


class PluginAbiTest(FederationTestCase):
    """The federation members of the host table, used by a plugin built from include/ (a
    pair of servers with the plugin, shared by the class's tests)."""

    def test_a_plugin_asks_another_server_parked_and_signs_and_verifies_json(self):
        a = self.start_class_fed(A_IP, plugins=FEDPLUG)
        b = self.start_class_fed(B_IP, plugins=FEDPLUG)
        status, body = a.json("GET", f"/_fedplug/version?server={quote(b.server_name)}")
        self.assertEqual(status, 200, body)
        self.assertEqual((body["outcome"], body["status"]), (0, 200), body)
        self.assertEqual(body["body"]["server"]["name"], "Atrium")
        # read in on_done with fed_response_header, by a name in another case than sent
        self.assertEqual(body["content_type"], "application/json", body)
        self.assertEqual(a.metric("atrium_http_parked"), 0)

        status, signed = a.json("POST", "/_fedplug/sign", {"hello": "world", "n": 1})
        self.assertEqual(status, 200, signed)
        _, _, doc = a.fed_request("GET", "/_matrix/key/v2/server")
        [(key_id, key)] = doc["verify_keys"].items()
        self.assertTrue(verify_json(signed, a.server_name, key_id, key["key"]))

        status, answer = b.json("POST", f"/_fedplug/verify?server={quote(a.server_name)}", signed)
        self.assertEqual((status, answer["valid"]), (200, True), answer)
        tampered = dict(signed, n=2)
        status, answer = b.json("POST", f"/_fedplug/verify?server={quote(a.server_name)}", tampered)
        self.assertEqual((status, answer["valid"]), (200, False), answer)

    def test_a_plugin_federation_route_sees_the_verified_origin(self):
        peer = self.fake_peer()
        a = self.start_class_fed(A_IP, plugins=FEDPLUG)
        uri = "/_matrix/federation/unstable/org.atrium.fedplug/whoami"
        status, _, body = a.signed_request("GET", uri, peer.server_name, peer.key)
        self.assertEqual((status, body), (200, {"origin": peer.server_name}))
        status, _, body = a.fed_request("GET", uri)
        self.assertEqual(status, 401)


class CertificateReloadTest(FederationTestCase):
    def peer_cert(self, srv):
        ctx = self.ca.client_context()
        with socket.create_connection((srv.fed_ip, srv.fed_port), timeout=5) as raw:
            with ctx.wrap_socket(raw) as tls:
                return tls.getpeercert(binary_form=True)

    def test_sighup_reloads_the_certificate_for_new_connections(self):
        a = self.start_fed(A_IP)
        first = self.peer_cert(a)
        cert, key = self.ca.issue("renewed", A_IP)
        shutil.copy(cert, a.tls_cert)
        shutil.copy(key, a.tls_key)
        self.assertEqual(self.peer_cert(a), first)  # nothing changes without the signal
        os.kill(a.pid, signal.SIGHUP)
        a.wait_for_log("reloaded the certificate")
        with open(cert, "rb") as f:
            renewed = ssl.PEM_cert_to_DER_cert(f.read().decode())
        self.assertNotEqual(renewed, first)  # a certificate of its own (TestCA caches by name)
        self.assertEqual(self.peer_cert(a), renewed)
        status, _ = a.json("GET", "/_matrix/client/versions")
        self.assertEqual(status, 200)


REMOTE = {"pool": "core.rooms_remote"}
REMOTE_THREADS, REMOTE_QUEUE = 2, 16  # core/client/rooms/crooms_api.h
SILENT_PEER_IP = "127.0.0.47"


class RemotePoolTest(FederationTestCase):
    """The remote pool (core.rooms_remote) held full by joins through a peer that accepts
    connections and never answers."""

    def silent_peer(self):
        """A server name whose listener takes connections and says nothing."""
        hung = HungServer(SILENT_PEER_IP)
        self.addCleanup(hung.close)
        return hung.server_name, hung.accepted, hung.close

    def test_joins_waiting_on_a_silent_peer_fill_the_pool_and_the_next_is_refused_at_once(self):
        """Two joins wait on the peer, REMOTE_QUEUE wait for a thread; the next join is
        answered 429 at once while local requests are served; when the peer goes away
        every waiting join is answered."""
        a = self.start_fed(A_IP, {"federation": {"client": {"request_timeout_ms": 30000}}})
        alice = Client(a, register(a, "alice"))
        name, accepted, close = self.silent_peer()

        def join(i, timeout=90):
            room = f"!r{i}:{name}"
            return alice.call("POST", f"/_matrix/client/v3/join/{quote(room)}"
                                      f"?server_name={quote(name)}", {}, timeout=timeout)

        held = REMOTE_THREADS + REMOTE_QUEUE
        waiting = [Background(join, i) for i in range(held)]
        wait_until(lambda: a.metric("atrium_pool_busy", REMOTE) == REMOTE_THREADS
                   and a.metric("atrium_pool_queued", REMOTE) == REMOTE_QUEUE,
                   timeout=20, what="the remote pool's threads busy and its queue full")
        # (The second waits behind the first's connection: the outbound client waits to
        # learn whether it can share it, HTTP/2.)
        wait_until(lambda: accepted, what="the peer holding a join")
        self.assertEqual(a.metric("atrium_pool_queue_limit", REMOTE), REMOTE_QUEUE)
        refused = a.metric("atrium_pool_refused_total", REMOTE) or 0
        started = time.monotonic()
        status, body = join(held, timeout=10)
        self.assertLess(time.monotonic() - started, 2.0)  # at once, not queued
        self.assertEqual((status, body.get("errcode")), (429, "M_LIMIT_EXCEEDED"), body)
        self.assertGreater(body["retry_after_ms"], 0)
        self.assertEqual(a.metric("atrium_pool_refused_total", REMOTE), refused + 1)
        # Requests that stay on this server are served meanwhile, the database included.
        room = alice.create_room(name="Local while the peer is silent")
        alice.send(room, {"msgtype": "m.text", "body": "still here"})
        self.assertEqual(alice.call("GET", "/_matrix/client/v3/joined_rooms")[0], 200)
        self.assertTrue(all(not w.done() for w in waiting))
        close()  # the peer goes away: every join ends, none hangs
        results = [w.result(90) for w in waiting]
        self.assertTrue(all(status >= 400 for status, _ in results), results[:3])
        wait_until(lambda: a.metric("atrium_pool_queued", REMOTE) == 0
                   and a.metric("atrium_pool_busy", REMOTE) == 0, what="the pool idle")


if __name__ == "__main__":
    unittest.main()
