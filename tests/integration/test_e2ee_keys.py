"""E2EE key plumbing: keys/upload, keys/query, keys/claim (also concurrent claims),
keys/changes, and cross-signing (device_signing/upload with its password rule,
signatures/upload). The server only stores and routes: key material in these tests is
arbitrary text.

The helpers at the top (register, login, device_keys, one_time_keys, sync) are imported by
the other test_e2ee_*.py files; importing functions does not import this file's tests.
"""

import threading
import time
import unittest

from common import Background
from harness import Server, psql

SERVER = "localhost"
PASSWORD = "correct horse battery staple"
KEYS = "/_matrix/client/v3/keys"
SETTINGS = {"registration": {"enabled": True}}


# ---- helpers shared by the test_e2ee_* files -----------------------------------------------

class Account:
    """One logged-in device of a user."""

    def __init__(self, srv, user_id, token, device_id):
        self.srv, self.user_id, self.token, self.device_id = srv, user_id, token, device_id

    def json(self, method, path, body=None, **kwargs):
        return self.srv.json(method, path, body, token=self.token, **kwargs)


def register(srv, name, display_name=None):
    body = {"username": name, "password": PASSWORD, "auth": {"type": "m.login.dummy"}}
    if display_name:
        body["initial_device_display_name"] = display_name
    status, answer = srv.json("POST", "/_matrix/client/v3/register", body)
    if status != 200:
        raise AssertionError(f"register {name}: {status} {answer}")
    return Account(srv, answer["user_id"], answer["access_token"], answer["device_id"])


def login(srv, name):
    status, answer = srv.json("POST", "/_matrix/client/v3/login", {
        "type": "m.login.password", "identifier": {"type": "m.id.user", "user": name},
        "password": PASSWORD})
    if status != 200:
        raise AssertionError(f"login {name}: {status} {answer}")
    return Account(srv, answer["user_id"], answer["access_token"], answer["device_id"])


def device_keys(acc, tag="v1"):
    """A device_keys object for acc's device (the server never reads the key material)."""
    dev = acc.device_id
    return {"user_id": acc.user_id, "device_id": dev,
            "algorithms": ["m.olm.v1.curve25519-aes-sha2", "m.megolm.v1.aes-sha2"],
            "keys": {f"curve25519:{dev}": f"curve-{dev}-{tag}", f"ed25519:{dev}": f"ed-{dev}-{tag}"},
            "signatures": {acc.user_id: {f"ed25519:{dev}": f"sig-{dev}-{tag}"}}}


def one_time_keys(n, prefix="K", algorithm="signed_curve25519"):
    return {f"{algorithm}:{prefix}{i:04d}": {"key": f"otk-{prefix}{i}", "signatures": {}}
            for i in range(n)}


def upload(acc, **body):
    return acc.json("POST", f"{KEYS}/upload", body)


def sync(acc, since=None, timeout_ms=0, http_timeout=10):
    path = f"/_matrix/client/v3/sync?timeout={timeout_ms}"
    if since:
        path += f"&since={since}"
    status, body = acc.json("GET", path, timeout=http_timeout)
    if status != 200:
        raise AssertionError(f"sync: {status} {body}")
    return body


def stream_token(srv):
    """A sync token for "now", read from the stream sequence."""
    rows = psql("SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM stream_seq",
                database=srv.database)
    return f"s{rows[0][0]}"


def cross_signing_key(acc, usage, public, signed_by=None):
    key = {"user_id": acc.user_id, "usage": [usage], "keys": {f"ed25519:{public}": public}}
    if signed_by:
        key["signatures"] = {acc.user_id: {f"ed25519:{signed_by}": f"sig-by-{signed_by}"}}
    return key


class E2eeServerCase(unittest.TestCase):
    """One server for the whole class (started from the main thread, closed at the end)."""

    @classmethod
    def setUpClass(cls):
        cls.srv = Server(settings=SETTINGS)
        cls.srv.__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.srv.__exit__(None, None, None)


# ---- keys/upload ------------------------------------------------------------------------------

class KeysUploadTest(E2eeServerCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.alice = register(cls.srv, "up_alice", display_name="Alice's laptop")
        cls.bob = register(cls.srv, "up_bob")

    def test_upload_stores_device_keys_that_query_returns_with_the_display_name(self):
        keys = device_keys(self.alice)
        status, body = upload(self.alice, device_keys=keys)
        self.assertEqual(status, 200, body)
        status, body = self.bob.json("POST", f"{KEYS}/query", {"device_keys": {self.alice.user_id: []}})
        self.assertEqual(status, 200, body)
        got = body["device_keys"][self.alice.user_id][self.alice.device_id]
        self.assertEqual(got["keys"], keys["keys"])
        self.assertEqual(got["signatures"], keys["signatures"])
        self.assertEqual(got["unsigned"]["device_display_name"], "Alice's laptop")
        self.assertEqual(body["failures"], {})

    def test_upload_answers_one_time_key_counts_per_algorithm(self):
        acc = login(self.srv, "up_alice")
        status, body = upload(acc)
        self.assertEqual((status, body), (200, {"one_time_key_counts": {"signed_curve25519": 0}}))
        keys = one_time_keys(3)
        keys.update(one_time_keys(2, algorithm="curve25519"))
        status, body = upload(acc, one_time_keys=keys)
        self.assertEqual(status, 200, body)
        self.assertEqual(body["one_time_key_counts"], {"signed_curve25519": 3, "curve25519": 2})
        status, body = upload(acc, one_time_keys=one_time_keys(2, prefix="L"))
        self.assertEqual(body["one_time_key_counts"]["signed_curve25519"], 5)

    def test_reuploading_a_one_time_key_is_harmless_but_new_content_under_its_id_is_refused(self):
        acc = login(self.srv, "up_alice")
        keys = one_time_keys(2)
        self.assertEqual(upload(acc, one_time_keys=keys)[1]["one_time_key_counts"]["signed_curve25519"], 2)
        self.assertEqual(upload(acc, one_time_keys=keys)[1]["one_time_key_counts"]["signed_curve25519"], 2)
        clash = {"signed_curve25519:K0000": {"key": "something else"},
                 "signed_curve25519:NEW": {"key": "new"}}
        status, body = upload(acc, one_time_keys=clash)
        self.assertEqual((status, body["errcode"]), (400, "M_INVALID_PARAM"))
        # Nothing of the refused upload was stored.
        self.assertEqual(upload(acc)[1]["one_time_key_counts"]["signed_curve25519"], 2)

    def test_device_keys_of_another_user_or_device_are_refused(self):
        other_user = device_keys(self.alice)
        other_user["user_id"] = self.bob.user_id
        status, body = upload(self.alice, device_keys=other_user)
        self.assertEqual((status, body["errcode"]), (400, "M_INVALID_PARAM"))
        other_device = device_keys(self.alice)
        other_device["device_id"] = "NOTMYDEVICE"
        status, body = upload(self.alice, device_keys=other_device)
        self.assertEqual((status, body["errcode"]), (400, "M_INVALID_PARAM"))
        status, body = upload(self.bob, device_keys=device_keys(self.alice))
        self.assertEqual((status, body["errcode"]), (400, "M_INVALID_PARAM"))

    def test_malformed_json_and_wrong_types_are_refused(self):
        status, _, data = self.srv.request("POST", f"{KEYS}/upload", b"{not json",
                                           token=self.bob.token)
        self.assertEqual(status, 400)
        self.assertIn(b"M_NOT_JSON", data)
        bad_keys = dict(device_keys(self.bob), keys="not an object")
        cases = [
            {"device_keys": ["a list"]},
            {"device_keys": bad_keys},
            {"device_keys": dict(device_keys(self.bob), algorithms="m.olm")},
            {"device_keys": dict(device_keys(self.bob), signatures={"@x:y": "flat"})},
            {"one_time_keys": ["a list"]},
            {"one_time_keys": {"no-colon": {"key": "k"}}},
            {"one_time_keys": {"signed_curve25519:A": 42}},
            {"fallback_keys": "text"},
        ]
        for body in cases:
            with self.subTest(body=body):
                status, answer = upload(self.bob, **body)
                self.assertEqual((status, answer["errcode"]), (400, "M_BAD_JSON"), answer)

    def test_too_many_keys_in_one_upload_are_refused(self):
        acc = login(self.srv, "up_bob")
        status, body = upload(acc, one_time_keys=one_time_keys(1001))
        self.assertEqual((status, body["errcode"]), (400, "M_BAD_JSON"))
        self.assertEqual(upload(acc)[1]["one_time_key_counts"]["signed_curve25519"], 0)
        self.assertEqual(upload(acc, one_time_keys=one_time_keys(1000))[0], 200)
        fallbacks = {f"alg{i}:F": {"key": "f"} for i in range(17)}
        status, body = upload(acc, fallback_keys=fallbacks)
        self.assertEqual((status, body["errcode"]), (400, "M_BAD_JSON"))

    def test_keys_endpoints_need_an_access_token(self):
        for path in ("upload", "query", "claim", "device_signing/upload", "signatures/upload"):
            with self.subTest(path=path):
                status, body = self.srv.json("POST", f"{KEYS}/{path}", {})
                self.assertEqual((status, body["errcode"]), (401, "M_MISSING_TOKEN"))
        status, body = self.srv.json("GET", f"{KEYS}/changes?from=s0&to=s1")
        self.assertEqual(status, 401)


# ---- keys/query -------------------------------------------------------------------------------

class KeysQueryTest(E2eeServerCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.carol = register(cls.srv, "q_carol")
        cls.carol2 = login(cls.srv, "q_carol")
        cls.dave = register(cls.srv, "q_dave")
        for acc in (cls.carol, cls.carol2):
            assert upload(acc, device_keys=device_keys(acc))[0] == 200

    def test_query_returns_every_device_with_keys_or_only_the_listed_ones(self):
        status, body = self.dave.json("POST", f"{KEYS}/query", {"device_keys": {self.carol.user_id: []}})
        self.assertEqual(status, 200, body)
        self.assertEqual(set(body["device_keys"][self.carol.user_id]),
                         {self.carol.device_id, self.carol2.device_id})
        status, body = self.dave.json("POST", f"{KEYS}/query",
                                      {"device_keys": {self.carol.user_id: [self.carol2.device_id]}})
        self.assertEqual(set(body["device_keys"][self.carol.user_id]), {self.carol2.device_id})

    def test_unknown_local_users_get_an_empty_map_and_remote_servers_a_failure(self):
        status, body = self.dave.json("POST", f"{KEYS}/query", {"device_keys": {
            "@nobody:localhost": [], "@someone:remote.example": [], self.dave.user_id: []}})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["device_keys"]["@nobody:localhost"], {})
        self.assertEqual(body["device_keys"][self.dave.user_id], {})  # no keys uploaded
        self.assertIn("remote.example", body["failures"])
        self.assertNotIn("@someone:remote.example", body["device_keys"])

    def test_bad_queries_are_refused(self):
        cases = [{}, {"device_keys": []}, {"device_keys": {self.carol.user_id: "all"}},
                 {"device_keys": {self.carol.user_id: [1]}},
                 {"device_keys": {}, "timeout": "soon"},
                 {"device_keys": {f"@u{i}:localhost": [] for i in range(1001)}}]
        for body in cases:
            with self.subTest(body=str(body)[:80]):
                status, answer = self.dave.json("POST", f"{KEYS}/query", body)
                self.assertEqual((status, answer["errcode"]), (400, "M_BAD_JSON"), answer)
        status, answer = self.dave.json("POST", f"{KEYS}/query",
                                        {"device_keys": {f"@u{i}:localhost": [] for i in range(1000)}})
        self.assertEqual(status, 200)

    def test_a_deleted_device_disappears_from_queries_and_counts_as_a_change(self):
        temp = login(self.srv, "q_carol")
        self.assertEqual(upload(temp, device_keys=device_keys(temp))[0], 200)
        before = stream_token(self.srv)
        self.assertEqual(temp.json("POST", "/_matrix/client/v3/logout", {})[0], 200)
        status, body = self.dave.json("POST", f"{KEYS}/query", {"device_keys": {self.carol.user_id: []}})
        self.assertNotIn(temp.device_id, body["device_keys"][self.carol.user_id])
        status, body = self.carol.json("GET", f"{KEYS}/changes?from={before}&to={stream_token(self.srv)}")
        self.assertEqual(status, 200, body)
        self.assertIn(self.carol.user_id, body["changed"])


# ---- keys/claim -------------------------------------------------------------------------------

class KeysClaimTest(E2eeServerCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.erin = register(cls.srv, "c_erin")
        cls.frank = register(cls.srv, "c_frank")

    def claim(self, acc, target, algorithm="signed_curve25519"):
        return self.frank.json("POST", f"{KEYS}/claim", {
            "one_time_keys": {target.user_id: {target.device_id: algorithm}}})

    def fallback_used(self, acc):
        rows = psql("SELECT used FROM e2ee_fallback_keys WHERE user_id = '%s' AND device_id = '%s'"
                    % (acc.user_id, acc.device_id), database=self.srv.database)
        return rows[0][0] == "t"

    def test_claims_take_each_key_once_then_the_fallback_key_which_is_marked_used(self):
        acc = login(self.srv, "c_erin")
        upload(acc, one_time_keys=one_time_keys(2),
               fallback_keys={"signed_curve25519:FB1": {"key": "fb", "fallback": True}})
        got = []
        for _ in range(4):
            status, body = self.claim(self.frank, acc)
            self.assertEqual(status, 200, body)
            got.append(list(body["one_time_keys"][acc.user_id][acc.device_id]))
        self.assertEqual(got, [["signed_curve25519:K0000"], ["signed_curve25519:K0001"],
                               ["signed_curve25519:FB1"], ["signed_curve25519:FB1"]])
        self.assertTrue(self.fallback_used(acc))
        self.assertEqual(upload(acc)[1]["one_time_key_counts"]["signed_curve25519"], 0)
        # A new fallback key starts unused; the same one again keeps its flag.
        upload(acc, fallback_keys={"signed_curve25519:FB1": {"key": "fb", "fallback": True}})
        self.assertTrue(self.fallback_used(acc))
        upload(acc, fallback_keys={"signed_curve25519:FB2": {"key": "fb2", "fallback": True}})
        self.assertFalse(self.fallback_used(acc))

    def test_concurrent_claims_never_hand_out_one_key_twice(self):
        acc = login(self.srv, "c_erin")
        upload(acc, one_time_keys=one_time_keys(10),
               fallback_keys={"signed_curve25519:FALLBACK": {"key": "fb", "fallback": True}})
        results, errors = [], []
        start = threading.Barrier(20)

        def claim_once():
            try:
                start.wait(timeout=10)
                status, body = self.claim(self.frank, acc)
                results.append((status, body))
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=claim_once) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        self.assertEqual(errors, [])
        self.assertEqual([s for s, _ in results], [200] * 20)
        ids = [k for _, b in results for k in b["one_time_keys"][acc.user_id][acc.device_id]]
        self.assertEqual(len(ids), 20)
        one_time = [k for k in ids if k != "signed_curve25519:FALLBACK"]
        self.assertEqual(len(one_time), 10)
        self.assertEqual(len(set(one_time)), 10)
        self.assertEqual(ids.count("signed_curve25519:FALLBACK"), 10)

    def test_claiming_from_unknown_users_devices_or_servers_returns_nothing_not_an_error(self):
        status, body = self.frank.json("POST", f"{KEYS}/claim", {"one_time_keys": {
            "@ghost:localhost": {"DEV": "signed_curve25519"},
            self.erin.user_id: {"NODEVICE": "signed_curve25519"},
            "@far:elsewhere.example": {"DEV": "signed_curve25519"}}})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["one_time_keys"], {})
        self.assertIn("elsewhere.example", body["failures"])
        # A device without keys of that algorithm: nothing either.
        status, body = self.claim(self.frank, self.erin, algorithm="curve25519")
        self.assertEqual((status, body["one_time_keys"]), (200, {}))

    def test_bad_claims_are_refused(self):
        cases = [{}, {"one_time_keys": []}, {"one_time_keys": {self.erin.user_id: ["DEV"]}},
                 {"one_time_keys": {self.erin.user_id: {"DEV": 1}}},
                 {"one_time_keys": {self.erin.user_id: {"": "signed_curve25519"}}},
                 {"one_time_keys": {self.erin.user_id: {"D" * 256: "signed_curve25519"}}},
                 {"one_time_keys": {f"@u{i}:localhost": {"D": "a"} for i in range(1001)}}]
        for body in cases:
            with self.subTest(body=str(body)[:80]):
                status, answer = self.frank.json("POST", f"{KEYS}/claim", body)
                self.assertEqual((status, answer["errcode"]), (400, "M_BAD_JSON"), answer)
        status, _, data = self.srv.request("POST", f"{KEYS}/claim", b"[]", token=self.frank.token)
        self.assertEqual(status, 400)
        self.assertIn(b"M_NOT_JSON", data)


    def test_sync_reports_one_time_key_counts_and_unused_fallback_key_types(self):
        acc = login(self.srv, "c_erin")
        body = sync(acc)
        self.assertEqual(body["device_one_time_keys_count"], {"signed_curve25519": 0})
        self.assertEqual(body["device_unused_fallback_key_types"], [])
        upload(acc, one_time_keys=one_time_keys(2),
               fallback_keys={"signed_curve25519:FB": {"key": "fb", "fallback": True}})
        body = sync(acc)
        self.assertEqual(body["device_one_time_keys_count"], {"signed_curve25519": 2})
        self.assertEqual(body["device_unused_fallback_key_types"], ["signed_curve25519"])
        for _ in range(3):
            self.claim(self.frank, acc)
        body = sync(acc, since=body["next_batch"])
        self.assertEqual(body["device_one_time_keys_count"], {"signed_curve25519": 0})
        self.assertEqual(body["device_unused_fallback_key_types"], [])

# ---- keys/changes -------------------------------------------------------------------------------

class KeysChangesTest(E2eeServerCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.gina = register(cls.srv, "ch_gina")
        cls.hank = register(cls.srv, "ch_hank")

    def changes(self, acc, since, to=None):
        path = f"{KEYS}/changes?from={since}"
        if to:
            path += f"&to={to}"
        status, body = acc.json("GET", path)
        self.assertEqual(status, 200, body)
        return body

    def test_changes_report_own_new_device_keys_only_inside_the_window(self):
        before = stream_token(self.srv)
        second = login(self.srv, "ch_gina")
        upload(second, device_keys=device_keys(second))
        after = stream_token(self.srv)
        self.assertEqual(self.changes(self.gina, before, after), {"changed": [self.gina.user_id], "left": []})
        self.assertEqual(self.changes(self.gina, after, stream_token(self.srv))["changed"], [])
        # Same keys again: no change recorded. New keys: a change.
        upload(second, device_keys=device_keys(second))
        self.assertEqual(self.changes(self.gina, after)["changed"], [])
        upload(second, device_keys=device_keys(second, tag="v2"))
        self.assertEqual(self.changes(self.gina, after)["changed"], [self.gina.user_id])

    def test_changes_of_users_sharing_no_room_are_not_reported(self):
        before = stream_token(self.srv)
        upload(self.hank, device_keys=device_keys(self.hank))
        self.assertNotIn(self.hank.user_id, self.changes(self.gina, before)["changed"])
        self.assertIn(self.hank.user_id, self.changes(self.hank, before)["changed"])

    def test_bad_tokens_are_refused(self):
        status, body = self.gina.json("GET", f"{KEYS}/changes")
        self.assertEqual((status, body["errcode"]), (400, "M_MISSING_PARAM"))
        for query in ("from=yesterday", "from=s1&to=x", "from=s-1", "from=s1x"):
            with self.subTest(query=query):
                status, body = self.gina.json("GET", f"{KEYS}/changes?{query}")
                self.assertEqual((status, body["errcode"]), (400, "M_INVALID_PARAM"))


class SharedRoomChangesTest(E2eeServerCase):
    """Who hears of whose key changes: users sharing a joined room (and oneself)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.olga = register(cls.srv, "sr_olga")
        cls.pete = register(cls.srv, "sr_pete")
        cls.quinn = register(cls.srv, "sr_quinn")

    def changes(self, acc, since):
        status, body = acc.json("GET", f"{KEYS}/changes?from={since}&to={stream_token(self.srv)}")
        self.assertEqual(status, 200, body)
        return body

    def test_a_key_change_wakes_a_room_mates_parked_sync_with_device_lists(self):
        rita, sam = register(self.srv, "sr_rita"), register(self.srv, "sr_sam")
        status, body = rita.json("POST", "/_matrix/client/v3/createRoom", {"preset": "public_chat"})
        self.assertEqual(status, 200, body)
        self.assertEqual(sam.json("POST", f"/_matrix/client/v3/rooms/{body['room_id']}/join", {})[0], 200)
        token = sync(rita)["next_batch"]
        self.assertEqual(sync(rita, since=token)["device_lists"], {"changed": [], "left": []})
        started = time.monotonic()
        waiting = Background(sync, rita, token, 20000, 30)
        time.sleep(0.5)
        self.assertFalse(waiting.done(), "the sync answered before anything changed")
        upload(sam, device_keys=device_keys(sam, tag="wake"))
        body = waiting.result(timeout=15)
        self.assertLess(time.monotonic() - started, 10)
        self.assertEqual(body["device_lists"]["changed"], [sam.user_id])

    def test_room_mates_hear_of_joins_key_changes_and_departures(self):
        olga, pete, quinn = self.olga, self.pete, self.quinn
        t0 = stream_token(self.srv)
        status, body = olga.json("POST", "/_matrix/client/v3/createRoom", {"preset": "public_chat"})
        self.assertEqual(status, 200, body)
        room = body["room_id"]
        self.assertEqual(pete.json("POST", f"/_matrix/client/v3/rooms/{room}/join", {})[0], 200)
        # Sharing a room begins: each must fetch the other's keys.
        self.assertEqual(self.changes(olga, t0), {"changed": [pete.user_id], "left": []})
        self.assertEqual(self.changes(pete, t0), {"changed": [olga.user_id], "left": []})

        t1 = stream_token(self.srv)
        upload(pete, device_keys=device_keys(pete, tag="room"))
        upload(quinn, device_keys=device_keys(quinn, tag="room"))
        self.assertEqual(self.changes(olga, t1), {"changed": [pete.user_id], "left": []})

        t2 = stream_token(self.srv)
        self.assertEqual(pete.json("POST", f"/_matrix/client/v3/rooms/{room}/leave", {})[0], 200)
        self.assertEqual(self.changes(olga, t2), {"changed": [], "left": [pete.user_id]})
        self.assertEqual(self.changes(pete, t2), {"changed": [], "left": [olga.user_id]})
        t3 = stream_token(self.srv)
        upload(pete, device_keys=device_keys(pete, tag="gone"))
        self.assertEqual(self.changes(olga, t3), {"changed": [], "left": []})


# ---- cross-signing -------------------------------------------------------------------------------

class CrossSigningTest(E2eeServerCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.ivy = register(cls.srv, "x_ivy")
        cls.jack = register(cls.srv, "x_jack")
        cls.kim = register(cls.srv, "x_kim")
        for acc in (cls.ivy, cls.jack, cls.kim):
            assert upload(acc, device_keys=device_keys(acc))[0] == 200

    def upload_cs(self, acc, **body):
        return acc.json("POST", f"{KEYS}/device_signing/upload", body)

    def full_set(self, acc, tag):
        master = f"{tag}master"
        return {"master_key": cross_signing_key(acc, "master", master),
                "self_signing_key": cross_signing_key(acc, "self_signing", f"{tag}self", signed_by=master),
                "user_signing_key": cross_signing_key(acc, "user_signing", f"{tag}user", signed_by=master)}

    def query(self, acc, *users):
        status, body = acc.json("POST", f"{KEYS}/query", {"device_keys": {u.user_id: [] for u in users}})
        self.assertEqual(status, 200, body)
        return body

    def test_first_upload_needs_no_password_and_query_shows_the_keys(self):
        keys = self.full_set(self.jack, "j1")
        status, body = self.upload_cs(self.jack, **keys)
        self.assertEqual((status, body), (200, {}))
        seen_by_other = self.query(self.kim, self.jack)
        self.assertEqual(seen_by_other["master_keys"][self.jack.user_id], keys["master_key"])
        self.assertEqual(seen_by_other["self_signing_keys"][self.jack.user_id], keys["self_signing_key"])
        self.assertNotIn(self.jack.user_id, seen_by_other["user_signing_keys"])
        seen_by_self = self.query(self.jack, self.jack)
        self.assertEqual(seen_by_self["user_signing_keys"][self.jack.user_id], keys["user_signing_key"])

    def test_replacing_keys_needs_the_password_but_a_retry_of_the_same_keys_does_not(self):
        acc = register(self.srv, "x_lee")
        first = self.full_set(acc, "l1")
        self.assertEqual(self.upload_cs(acc, **first)[0], 200)
        self.assertEqual(self.upload_cs(acc, **first), (200, {}))
        second = self.full_set(acc, "l2")
        status, body = self.upload_cs(acc, **second)
        self.assertEqual(status, 401, body)
        self.assertEqual(body["flows"], [{"stages": ["m.login.password"]}])
        session = body["session"]
        wrong = {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": "x_lee"},
                 "password": "wrong", "session": session}
        status, body = self.upload_cs(acc, auth=wrong, **second)
        self.assertEqual((status, body.get("errcode")), (401, "M_FORBIDDEN"))
        self.assertEqual(self.query(acc, acc)["master_keys"][acc.user_id], first["master_key"])
        right = dict(wrong, password=PASSWORD)
        status, body = self.upload_cs(acc, auth=right, **second)
        self.assertEqual((status, body), (200, {}))
        self.assertEqual(self.query(acc, acc)["master_keys"][acc.user_id], second["master_key"])

    def test_bad_cross_signing_uploads_are_refused(self):
        acc = register(self.srv, "x_max")
        status, body = self.upload_cs(acc, self_signing_key=cross_signing_key(acc, "self_signing", "s"))
        self.assertEqual((status, body["errcode"]), (400, "M_INVALID_PARAM"))
        cases = [
            {},
            {"master_key": "text"},
            {"master_key": cross_signing_key(acc, "self_signing", "m")},
            {"master_key": cross_signing_key(self.kim, "master", "m")},
            {"master_key": dict(cross_signing_key(acc, "master", "m"), keys={"ed25519:a": "a", "ed25519:b": "b"})},
            {"master_key": dict(cross_signing_key(acc, "master", "m"), keys={"curve25519:a": "a"})},
        ]
        for body in cases:
            with self.subTest(body=str(body)[:80]):
                status, answer = self.upload_cs(acc, **body)
                self.assertEqual((status, answer["errcode"]), (400, "M_BAD_JSON"), answer)
        status, _, data = self.srv.request("POST", f"{KEYS}/device_signing/upload", b"nope",
                                           token=acc.token)
        self.assertEqual(status, 400)

    def test_signatures_upload_attaches_signatures_with_the_right_visibility(self):
        ivy, jack, kim = self.ivy, self.jack, self.kim
        ivy_keys = self.full_set(ivy, "i1")
        self.assertEqual(self.upload_cs(ivy, **ivy_keys)[0], 200)
        if not self.query(jack, jack)["master_keys"].get(jack.user_id):
            self.assertEqual(self.upload_cs(jack, **self.full_set(jack, "j1"))[0], 200)
        jack_master = self.query(ivy, jack)["master_keys"][jack.user_id]
        jack_master_pub = next(iter(jack_master["keys"].values()))
        own_device = device_keys(ivy)
        own_device["signatures"] = {ivy.user_id: {"ed25519:i1self": "self-sig"}}
        own_master = dict(ivy_keys["master_key"], signatures={
            ivy.user_id: {f"ed25519:{ivy.device_id}": "device-sig"}})
        their_master = dict(jack_master, signatures={ivy.user_id: {"ed25519:i1user": "user-sig"}})
        status, body = ivy.json("POST", f"{KEYS}/signatures/upload", {
            ivy.user_id: {ivy.device_id: own_device, "i1master": own_master},
            jack.user_id: {jack_master_pub: their_master}})
        self.assertEqual((status, body), (200, {"failures": {}}))

        seen_by_kim = self.query(kim, ivy, jack)
        dev_sigs = seen_by_kim["device_keys"][ivy.user_id][ivy.device_id]["signatures"][ivy.user_id]
        self.assertEqual(dev_sigs["ed25519:i1self"], "self-sig")
        master_sigs = seen_by_kim["master_keys"][ivy.user_id]["signatures"][ivy.user_id]
        self.assertEqual(master_sigs[f"ed25519:{ivy.device_id}"], "device-sig")
        self.assertNotIn(ivy.user_id, seen_by_kim["master_keys"][jack.user_id].get("signatures", {}))
        seen_by_ivy = self.query(ivy, jack)
        self.assertEqual(seen_by_ivy["master_keys"][jack.user_id]["signatures"][ivy.user_id],
                         {"ed25519:i1user": "user-sig"})

    def test_signatures_with_wrong_keys_or_targets_are_reported_as_failures(self):
        ivy, kim = self.ivy, self.kim
        if not self.query(ivy, ivy)["master_keys"].get(ivy.user_id):
            self.assertEqual(self.upload_cs(ivy, **self.full_set(ivy, "i1"))[0], 200)
        wrong_signer = device_keys(ivy)
        wrong_signer["signatures"] = {ivy.user_id: {"ed25519:notmyselfsigningkey": "x"}}
        changed_keys = device_keys(ivy, tag="forged")
        changed_keys["signatures"] = {ivy.user_id: {"ed25519:i1self": "x"}}
        no_sig = device_keys(ivy)
        no_sig["signatures"] = {}
        status, body = ivy.json("POST", f"{KEYS}/signatures/upload", {
            ivy.user_id: {ivy.device_id: wrong_signer, "NOSUCHDEVICE": changed_keys},
            kim.user_id: {"notkimsmaster": {"keys": {}, "signatures": {ivy.user_id: {"ed25519:i1user": "x"}}}},
            "@x:remote.example": {"K": {"signatures": {ivy.user_id: {"ed25519:i1user": "x"}}}}})
        self.assertEqual(status, 200, body)
        failures = body["failures"]
        self.assertEqual(failures[ivy.user_id][ivy.device_id]["errcode"], "M_INVALID_SIGNATURE")
        self.assertEqual(failures[ivy.user_id]["NOSUCHDEVICE"]["errcode"], "M_NOT_FOUND")
        self.assertEqual(failures[kim.user_id]["notkimsmaster"]["errcode"], "M_NOT_FOUND")
        self.assertIn("@x:remote.example", failures)
        status, body = ivy.json("POST", f"{KEYS}/signatures/upload", {ivy.user_id: {ivy.device_id: changed_keys}})
        self.assertEqual(body["failures"][ivy.user_id][ivy.device_id]["errcode"], "M_INVALID_SIGNATURE")
        status, body = ivy.json("POST", f"{KEYS}/signatures/upload", {ivy.user_id: {ivy.device_id: no_sig}})
        self.assertEqual(body["failures"][ivy.user_id][ivy.device_id]["errcode"], "M_INVALID_SIGNATURE")
        for bad in ({ivy.user_id: "x"}, {ivy.user_id: {"D": "x"}}):
            status, body = ivy.json("POST", f"{KEYS}/signatures/upload", bad)
            self.assertEqual((status, body["errcode"]), (400, "M_BAD_JSON"))

    def test_at_most_1000_keys_are_signed_in_one_upload(self):
        kim = self.kim
        signed = {"signatures": {kim.user_id: {"ed25519:x": "s"}}}
        status, body = kim.json("POST", f"{KEYS}/signatures/upload",
                                {kim.user_id: {f"D{i}": signed for i in range(1001)}})
        self.assertEqual((status, body["errcode"]), (400, "M_BAD_JSON"))
        status, body = kim.json("POST", f"{KEYS}/signatures/upload",
                                {kim.user_id: {f"D{i}": signed for i in range(1000)}})
        self.assertEqual(status, 200, body)
        self.assertEqual(len(body["failures"][kim.user_id]), 1000)  # no such devices


if __name__ == "__main__":
    unittest.main()
