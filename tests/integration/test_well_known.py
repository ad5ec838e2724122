"""/.well-known/matrix/server and /.well-known/matrix/support come from the config
(well_known.*): unset, each is 404 M_NOT_FOUND, as Synapse answers; set, the delegation
and the administrator's contact and support page, as the spec shapes them. Both are
answered by the client listener without a token."""

import unittest

from harness import Server


class WellKnownUnsetTest(unittest.TestCase):
    def test_unset_server_and_support_are_404(self):
        with Server() as srv:
            for path in ("/.well-known/matrix/server", "/.well-known/matrix/support"):
                status, body = srv.json("GET", path)
                self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"), path)


class WellKnownSetTest(unittest.TestCase):
    def test_server_delegation_and_support_contacts_are_served(self):
        settings = {"well_known": {"server": "matrix.example.org:443",
                                   "support_page": "https://example.org/help",
                                   "support_admin_matrix_id": "@admin:example.org",
                                   "support_admin_email": "admin@example.org"}}
        with Server(settings=settings) as srv:
            self.assertEqual(srv.json("GET", "/.well-known/matrix/server"),
                             (200, {"m.server": "matrix.example.org:443"}))
            self.assertEqual(srv.json("GET", "/.well-known/matrix/support"),
                             (200, {"contacts": [{"matrix_id": "@admin:example.org",
                                                  "email_address": "admin@example.org",
                                                  "role": "m.role.admin"}],
                                    "support_page": "https://example.org/help"}))

    def test_a_support_page_alone_is_enough(self):
        with Server(settings={"well_known": {"support_page": "https://example.org/help"}}) as srv:
            self.assertEqual(srv.json("GET", "/.well-known/matrix/support"),
                             (200, {"support_page": "https://example.org/help"}))
            status, body = srv.json("GET", "/.well-known/matrix/server")
            self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"))


if __name__ == "__main__":
    unittest.main()
