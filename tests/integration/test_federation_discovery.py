"""Server discovery through the configuration (federation.dns_servers pointing at a DNS
server the test runs on loopback): SRV, a .well-known delegation (cached), an explicit
port, and a DNS answer that changes to a blacklisted address, refused at connect.

.well-known is always asked on port 443, so those tests bind 127.0.0.6x:443 and need root
(CI runs as root); without it they are skipped with a message saying so.

The tests that change no DNS answer under A's feet share one A and its DNS server (a
start costs about a CPU-second); each names servers of its own and reads only the
questions asked since it began.
"""

import os
import time
import unittest

from accounts import quote, register
from federation_support import FakeDNS, WellKnownServer
from test_federation import FederationTestCase

A_IP = "127.0.0.21"
NEEDS_ROOT = unittest.skipUnless(os.geteuid() == 0,
                                 "SKIPPED: binding port 443 for .well-known needs root")


class DiscoveryTest(FederationTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.class_dns = FakeDNS()  # the shared A's
        cls.addClassCleanup(cls.class_dns.close)

    def setUp(self):
        self.dns = self.class_dns
        self.dns.records = {}
        self.asked_from = len(self.dns.asked)

    def asked(self):
        """The questions asked of self.dns since the test began."""
        return self.dns.asked[self.asked_from:]

    def start_a(self):
        """The class's A, asking the class's DNS server."""
        return self.start_class_fed(A_IP, {"federation": {"dns_servers": [self.dns.address]}})

    def start_own_a(self, extra):
        """An A of the test's own, with a DNS server of its own."""
        self.dns = FakeDNS()
        self.addCleanup(self.dns.close)
        self.asked_from = 0
        return self.start_fed(A_IP, {"federation": {"dns_servers": [self.dns.address], **extra}})

    def profile(self, a, alice, user):
        return a.json("GET", f"/_matrix/client/v3/profile/{quote(user)}", token=alice.token)

    def test_srv_names_the_target_while_host_and_certificate_stay_the_server_name(self):
        b = self.start_fed("127.0.0.22", name="b.test", cert_name="b.test")
        self.dns.records = {
            ("b.test", "A"): ["127.0.0.69"],  # nothing listens on 443 there: no .well-known
            ("_matrix-fed._tcp.b.test", "SRV"): [(10, 5, b.fed_port, "bfed.test")],
            ("bfed.test", "A"): ["127.0.0.22"],
        }
        bob = register(b, "bob")
        a = self.start_a()
        alice = register(a, "alice_srv")
        status, body = self.profile(a, alice, bob.user_id)
        self.assertEqual((status, body), (200, {"displayname": "bob"}))
        self.assertIn(("_matrix-fed._tcp.b.test", "SRV"), self.asked())
        self.assertIn(("bfed.test", "A"), self.asked())

    def test_an_explicit_port_skips_srv_and_well_known(self):
        d = self.start_fed("127.0.0.24", name="d.test:{port}", cert_name="d.test")
        self.dns.records = {("d.test", "A"): ["127.0.0.24"]}
        dave = register(d, "dave")
        a = self.start_a()
        alice = register(a, "alice_port")
        status, body = self.profile(a, alice, dave.user_id)
        self.assertEqual((status, body), (200, {"displayname": "dave"}))
        self.assertIn(("d.test", "A"), self.asked())
        self.assertNotIn(("_matrix-fed._tcp.d.test", "SRV"), self.dns.asked)

    def test_a_dns_answer_that_changes_to_a_blacklisted_address_is_refused_at_connect(self):
        d = self.start_fed("127.0.0.24", name="d.test:{port}", cert_name="d.test")
        # Only 127.0.0.24 is allowed; the rest of 127.0.0.0/8 stays blacklisted.
        a = self.start_own_a({"ip_range_whitelist": ["127.0.0.24/32"]})
        self.dns.ttl = 1
        self.dns.records = {("d.test", "A"): ["127.0.0.24"]}
        dave = register(d, "dave")
        alice = register(a, "alice")
        self.assertEqual(self.profile(a, alice, dave.user_id)[0], 200)
        self.dns.records = {("d.test", "A"): ["127.0.0.25"]}
        # Past the 1 s TTL the name is asked again; restarting D closes the kept-alive
        # connection, so the next request must connect anew, to the new answer.
        d.stop()
        d.start()
        time.sleep(1.5)
        asked = self.dns.asked.count(("d.test", "A"))
        status, body = self.profile(a, alice, dave.user_id)
        self.assertGreater(self.dns.asked.count(("d.test", "A")), asked)
        self.assertEqual(status, 502, body)
        a.wait_for_log(r"127\.0\.0\.25")

    @NEEDS_ROOT
    def test_well_known_delegates_to_another_name_and_is_cached(self):
        c = self.start_fed("127.0.0.23", name="c.test", cert_name="cdeleg.test")
        wk = WellKnownServer(self.ca, "127.0.0.62", "c.test",
                             {"m.server": f"cdeleg.test:{c.fed_port}"})
        self.addCleanup(wk.close)
        self.dns.records = {("c.test", "A"): ["127.0.0.62"],
                            ("cdeleg.test", "A"): ["127.0.0.23"]}
        carol = register(c, "carol")
        a = self.start_a()
        alice = register(a, "alice_wk")
        status, body = self.profile(a, alice, carol.user_id)
        self.assertEqual((status, body), (200, {"displayname": "carol"}))
        status, _ = self.profile(a, alice, carol.user_id)
        self.assertEqual(status, 200)
        self.assertEqual(wk.requests, ["/.well-known/matrix/server"])  # cached the second time
        # A delegated name with a port is used as it is: no SRV for it.
        self.assertNotIn(("_matrix-fed._tcp.cdeleg.test", "SRV"), self.dns.asked)
        self.assertIn(("cdeleg.test", "A"), self.asked())


if __name__ == "__main__":
    unittest.main()
