"""The HTTP core seen from a client: Matrix errors for unknown paths and methods, CORS on
every answer, body limits, JSON errors, path and query decoding, discovery and /metrics."""

import socket
import unittest

from common import AtriumTestCase, with_testplug


class HttpTest(AtriumTestCase):
    """Requests that change nothing on the server: the tests share one (start_class_server)."""

    def setUp(self):
        self.srv = self.start_class_server(plugins=with_testplug())

    def test_versions_advertise_v1_11_and_stable_authenticated_media(self):
        status, body = self.srv.json("GET", "/_matrix/client/versions")
        self.assertEqual(status, 200)
        self.assertIn("v1.11", body["versions"])
        self.assertTrue(body["unstable_features"]["org.matrix.msc3916.stable"])

    def test_unknown_path_is_404_unrecognized_and_wrong_method_is_405(self):
        status, body = self.srv.json("GET", "/_matrix/client/v3/nothing/here")
        self.assertEqual((status, body["errcode"]), (404, "M_UNRECOGNIZED"))
        status, body = self.srv.json("DELETE", "/_matrix/client/versions")
        self.assertEqual((status, body["errcode"]), (405, "M_UNRECOGNIZED"))

    def test_every_answer_carries_cors_and_preflight_succeeds(self):
        status, headers, _ = self.srv.request("OPTIONS", "/_matrix/client/v3/login", headers={
            "Origin": "https://app.example", "Access-Control-Request-Method": "POST"})
        self.assertEqual(status, 200)
        self.assertEqual(headers.get("Access-Control-Allow-Origin"), "*")
        self.assertIn("POST", headers.get("Access-Control-Allow-Methods"))
        self.assertIn("Authorization", headers.get("Access-Control-Allow-Headers"))
        for path in ("/_matrix/client/versions", "/nope"):
            _, headers, _ = self.srv.request("GET", path)
            self.assertEqual(headers.get("Access-Control-Allow-Origin"), "*", path)

    def test_body_over_the_route_limit_is_413_too_large(self):
        status, body = self.srv.json("POST", "/_test/echo", body={"x": "y" * 5000})
        self.assertEqual((status, body["errcode"]), (413, "M_TOO_LARGE"))

    def test_body_over_the_limit_without_content_length_is_413_too_large(self):
        s = socket.create_connection(("127.0.0.1", self.srv.port), timeout=10)
        chunk = b"a" * 3000
        s.sendall(b"POST /_test/echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                  + b"%x\r\n" % len(chunk) + chunk + b"\r\n" + b"%x\r\n" % len(chunk) + chunk
                  + b"\r\n0\r\n\r\n")
        data = b""
        while b"\r\n\r\n" not in data:
            data += s.recv(4096)
        s.close()
        self.assertTrue(data.startswith(b"HTTP/1.1 413"), data[:100])

    def test_malformed_json_is_400_not_json_and_good_json_passes(self):
        status, body = self.srv.json("POST", "/_test/echo", body="{not json",
                                     headers={"Content-Type": "application/json"})
        self.assertEqual((status, body["errcode"]), (400, "M_NOT_JSON"))
        self.assertEqual(self.srv.json("POST", "/_test/echo", body={"a": [1, 2]}), (200, {"a": [1, 2]}))

    def test_path_parameters_and_query_values_are_percent_decoded(self):
        status, body = self.srv.json("GET", "/_test/param/%21room%3Aexample.org%2Fx?q=a%20b%26c")
        self.assertEqual(status, 200)
        self.assertEqual(body, {"value": "!room:example.org/x", "q": "a b&c"})

    def test_head_answers_headers_without_a_body(self):
        status, headers, data = self.srv.request("HEAD", "/health")
        self.assertEqual(status, 200)
        self.assertEqual(data, b"")
        self.assertEqual(headers.get("Content-Type"), "application/json")

    def test_client_discovery_is_404_unless_a_public_base_url_is_set(self):
        status, body = self.srv.json("GET", "/.well-known/matrix/client")
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"))

    def test_metrics_count_responses_by_class(self):
        self.srv.request("GET", "/nope")
        text = self.srv.request("GET", "/metrics")[2].decode()
        self.assertIn("# TYPE atrium_http_responses_total counter", text)
        self.assertGreaterEqual(self.srv.metric("atrium_http_responses_total", {"class": "4xx"}), 1)


class DiscoveryAndMetricsAccessTest(AtriumTestCase):
    def test_client_discovery_names_the_public_base_url(self):
        srv = self.start_server(settings={"public_baseurl": "https://matrix.example.org"})
        self.assertEqual(srv.json("GET", "/.well-known/matrix/client"),
                         (200, {"m.homeserver": {"base_url": "https://matrix.example.org"}}))

    def test_metrics_answer_only_to_allowed_addresses(self):
        srv = self.start_server(settings={"server": {"metrics": {"allowed_addresses": ["10.9.9.9"]}}})
        status, _, _ = srv.request("GET", "/metrics")
        self.assertEqual(status, 404)


if __name__ == "__main__":
    unittest.main()
