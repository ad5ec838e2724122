"""Server-side room key backup: /room_keys/version (no backup yet, create, read, update,
delete) and /room_keys/keys (store, read and delete for all rooms, a room or a session; the
better key wins; keys only go to the current version)."""

import unittest

from test_e2ee_keys import E2eeServerCase, register

VERSION = "/_matrix/client/v3/room_keys/version"
KEYS = "/_matrix/client/v3/room_keys/keys"
ALGORITHM = "m.megolm_backup.v1.curve25519-aes-sha2"


def key_data(index=0, forwards=0, verified=False, tag="x"):
    return {"first_message_index": index, "forwarded_count": forwards, "is_verified": verified,
            "session_data": {"ciphertext": tag, "ephemeral": "e", "mac": "m"}}


class BackupVersionTest(E2eeServerCase):
    def test_without_a_backup_the_current_version_is_not_found(self):
        acc = register(self.srv, "bv_empty")
        status, body = acc.json("GET", VERSION)
        self.assertEqual(status, 404)
        self.assertEqual(body, {"errcode": "M_NOT_FOUND", "error": "No current backup version"})
        for path in (f"{VERSION}/1", f"{VERSION}/notanumber"):
            status, body = acc.json("GET", path)
            self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"))
        status, body = acc.json("GET", f"{KEYS}?version=1")
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"))

    def test_a_created_version_becomes_current_and_keeps_its_auth_data(self):
        acc = register(self.srv, "bv_create")
        status, body = acc.json("POST", VERSION, {"algorithm": ALGORITHM, "auth_data": {"public_key": "pk1"}})
        self.assertEqual((status, body), (200, {"version": "1"}))
        status, body = acc.json("GET", VERSION)
        self.assertEqual(status, 200, body)
        self.assertEqual(body["version"], "1")
        self.assertEqual(body["algorithm"], ALGORITHM)
        self.assertEqual(body["auth_data"], {"public_key": "pk1"})
        self.assertEqual(body["count"], 0)
        self.assertIsInstance(body["etag"], str)
        self.assertEqual(acc.json("POST", VERSION, {"algorithm": ALGORITHM, "auth_data": {}})[1],
                         {"version": "2"})
        self.assertEqual(acc.json("GET", VERSION)[1]["version"], "2")
        self.assertEqual(acc.json("GET", f"{VERSION}/1")[1]["auth_data"], {"public_key": "pk1"})
        # Another user sees none of it.
        other = register(self.srv, "bv_other")
        self.assertEqual(other.json("GET", VERSION)[0], 404)
        self.assertEqual(other.json("GET", f"{VERSION}/1")[0], 404)

    def test_update_replaces_auth_data_but_not_the_algorithm(self):
        acc = register(self.srv, "bv_update")
        acc.json("POST", VERSION, {"algorithm": ALGORITHM, "auth_data": {"a": 1}})
        status, body = acc.json("PUT", f"{VERSION}/1", {"algorithm": ALGORITHM, "auth_data": {"a": 2}, "version": "1"})
        self.assertEqual((status, body), (200, {}))
        self.assertEqual(acc.json("GET", f"{VERSION}/1")[1]["auth_data"], {"a": 2})
        status, body = acc.json("PUT", f"{VERSION}/1", {"algorithm": "other", "auth_data": {}})
        self.assertEqual((status, body["errcode"]), (400, "M_INVALID_PARAM"))
        status, body = acc.json("PUT", f"{VERSION}/1", {"algorithm": ALGORITHM, "auth_data": {}, "version": "7"})
        self.assertEqual((status, body["errcode"]), (400, "M_INVALID_PARAM"))
        status, body = acc.json("PUT", f"{VERSION}/9", {"algorithm": ALGORITHM, "auth_data": {}})
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"))

    def test_deleting_a_version_forgets_it_and_its_keys_and_numbers_are_not_reused(self):
        acc = register(self.srv, "bv_delete")
        acc.json("POST", VERSION, {"algorithm": ALGORITHM, "auth_data": {}})
        acc.json("PUT", f"{KEYS}/!r:localhost/s1?version=1", key_data())
        self.assertEqual(acc.json("DELETE", f"{VERSION}/1"), (200, {}))
        self.assertEqual(acc.json("GET", VERSION)[0], 404)
        self.assertEqual(acc.json("GET", f"{KEYS}?version=1")[0], 404)
        self.assertEqual(acc.json("DELETE", f"{VERSION}/1")[0], 404)
        self.assertEqual(acc.json("POST", VERSION, {"algorithm": ALGORITHM, "auth_data": {}})[1],
                         {"version": "2"})

    def test_bad_version_bodies_are_refused(self):
        acc = register(self.srv, "bv_bad")
        for body in ({}, {"algorithm": 1, "auth_data": {}}, {"algorithm": ALGORITHM},
                     {"algorithm": ALGORITHM, "auth_data": "x"}):
            with self.subTest(body=body):
                status, answer = acc.json("POST", VERSION, body)
                self.assertEqual((status, answer["errcode"]), (400, "M_BAD_JSON"))
        status, _, data = self.srv.request("POST", VERSION, b"[1]", token=acc.token)
        self.assertEqual(status, 400)
        self.assertIn(b"M_NOT_JSON", data)
        self.assertEqual(self.srv.json("GET", VERSION)[0], 401)


class BackupKeysTest(E2eeServerCase):
    def setUp(self):
        self.acc = register(self.srv, f"bk_{self._testMethodName}")
        status, body = self.acc.json("POST", VERSION, {"algorithm": ALGORITHM, "auth_data": {}})
        self.assertEqual(status, 200, body)
        self.version = body["version"]

    def put(self, path, body, version=None):
        return self.acc.json("PUT", f"{KEYS}{path}?version={version or self.version}", body)

    def get(self, path=""):
        return self.acc.json("GET", f"{KEYS}{path}?version={self.version}")

    def test_keys_stored_three_ways_are_read_back_three_ways(self):
        status, body = self.put("", {"rooms": {"!a:localhost": {"sessions": {"s1": key_data(tag="a1")}}}})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["count"], 1)
        self.assertEqual(self.put("/!a:localhost", {"sessions": {"s2": key_data(tag="a2")}})[1]["count"], 2)
        self.assertEqual(self.put("/!b:localhost/s3", key_data(tag="b3"))[1]["count"], 3)
        status, body = self.get()
        self.assertEqual(status, 200)
        self.assertEqual(body, {"rooms": {
            "!a:localhost": {"sessions": {"s1": key_data(tag="a1"), "s2": key_data(tag="a2")}},
            "!b:localhost": {"sessions": {"s3": key_data(tag="b3")}}}})
        self.assertEqual(self.get("/!b:localhost"), (200, {"sessions": {"s3": key_data(tag="b3")}}))
        self.assertEqual(self.get("/!a:localhost/s2"), (200, key_data(tag="a2")))
        self.assertEqual(self.get("/!empty:localhost"), (200, {"sessions": {}}))
        status, body = self.get("/!a:localhost/nosuch")
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"))
        self.assertEqual(self.acc.json("GET", VERSION)[1]["count"], 3)

    def test_only_a_better_key_replaces_a_stored_one_and_the_etag_follows_changes(self):
        etag0 = self.put("/!r:localhost/s", key_data(index=5, tag="first"))[1]["etag"]
        worse = self.put("/!r:localhost/s", key_data(index=9, tag="worse"))[1]
        self.assertEqual(worse["etag"], etag0)
        self.assertEqual(self.get("/!r:localhost/s")[1]["session_data"]["ciphertext"], "first")
        better = self.put("/!r:localhost/s", key_data(index=2, tag="better"))[1]
        self.assertNotEqual(better["etag"], etag0)
        self.assertEqual(self.get("/!r:localhost/s")[1]["session_data"]["ciphertext"], "better")
        self.put("/!r:localhost/s", key_data(index=7, verified=True, tag="verified"))
        self.assertEqual(self.get("/!r:localhost/s")[1]["session_data"]["ciphertext"], "verified")

    def test_keys_go_only_to_the_current_version(self):
        old = self.version
        current = self.acc.json("POST", VERSION, {"algorithm": ALGORITHM, "auth_data": {}})[1]["version"]
        status, body = self.put("/!r:localhost/s", key_data(), version=old)
        self.assertEqual(status, 403)
        self.assertEqual(body["errcode"], "M_WRONG_ROOM_KEYS_VERSION")
        self.assertEqual(body["current_version"], current)
        status, body = self.put("/!r:localhost/s", key_data(), version="99")
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"))

    def test_deleting_keys_by_session_room_or_all(self):
        self.put("", {"rooms": {"!a:localhost": {"sessions": {"s1": key_data(), "s2": key_data()}},
                                "!b:localhost": {"sessions": {"s3": key_data()}},
                                "!c:localhost": {"sessions": {"s4": key_data()}}}})
        path = f"{KEYS}/!a:localhost/s1?version={self.version}"
        self.assertEqual(self.acc.json("DELETE", path)[1]["count"], 3)
        self.assertEqual(self.acc.json("DELETE", f"{KEYS}/!b:localhost?version={self.version}")[1]["count"], 2)
        self.assertEqual(self.acc.json("DELETE", f"{KEYS}?version={self.version}")[1]["count"], 0)
        self.assertEqual(self.get(), (200, {"rooms": {}}))

    def test_bad_key_requests_are_refused(self):
        status, body = self.acc.json("GET", KEYS)
        self.assertEqual((status, body["errcode"]), (400, "M_MISSING_PARAM"))
        status, body = self.acc.json("PUT", f"{KEYS}/!r:localhost/s", key_data())
        self.assertEqual((status, body["errcode"]), (400, "M_MISSING_PARAM"))
        bad = [("", {"rooms": []}), ("", {"rooms": {"!r:localhost": {"sessions": {"s": {"first_message_index": "0"}}}}}),
               ("/!r:localhost", {"sessions": "x"}), ("/!r:localhost/s", {"session_data": {}}),
               ("/!r:localhost/s", dict(key_data(), is_verified="yes")),
               ("/!r:localhost/" + "s" * 256, key_data()),
               ("/!r:localhost", {"sessions": {"s" * 256: key_data()}})]
        for path, body in bad:
            with self.subTest(path=path, body=body):
                status, answer = self.put(path, body)
                self.assertEqual((status, answer["errcode"]), (400, "M_BAD_JSON"))
        self.assertEqual(self.get(), (200, {"rooms": {}}))


if __name__ == "__main__":
    unittest.main()
