"""The small account endpoints Element calls: room tags (stored as the m.tag room account
data event, so they reach /sync), pushers (stored and listed; delivery is test_push_gateway.py) and
the empty answers for third-party IDs, bridge protocols and the TURN server."""

import time
import unittest

from accounts import login
from common import Background
from rooms_client import V3, Client, SharedServerTest, quote

TAGS_PER_ROOM_MAX = 64        # core/client/accounts/tags.c
TAG_NAME_MAX_BYTES = 255
TAG_BODY_MAX_BYTES = 4096
PUSHERS_PER_USER_MAX = 64     # core/client/push/pushers.c
PUSHER_BODY_MAX_BYTES = 8192
NOTIFY_URL = "https://push.example.org/_matrix/push/v1/notify"


def pusher(pushkey, **extra):
    """A valid http pusher body; extra keys replace or add fields (None removes one)."""
    body = {"pushkey": pushkey, "kind": "http", "app_id": "org.example.app",
            "app_display_name": "Example",
            "device_display_name": "Phone", "lang": "en", "data": {"url": NOTIFY_URL}}
    for key, value in extra.items():
        if value is None:
            body.pop(key, None)
        else:
            body[key] = value
    return body


class TagsTest(SharedServerTest):
    USERS = ("ann", "bob")

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.room = cls.ann.create_room(name="Tagged")

    def tags_path(self, room=None, user=None, tag=None):
        path = f"{V3}/user/{quote(user or self.ann.user_id)}/rooms/{quote(room or self.room)}/tags"
        return path if tag is None else f"{path}/{quote(tag)}"

    def tags(self, room):
        return self.ann.ok("GET", self.tags_path(room))["tags"]

    def test_tags_are_put_read_replaced_and_deleted(self):
        room = "!roundtrip:localhost"
        self.assertEqual(self.tags(room), {})
        favourite = self.tags_path(room, tag="m.favourite")
        self.assertEqual(self.ann.call("PUT", favourite, {"order": 0.5}), (200, {}))
        self.assertEqual(self.ann.call("PUT", self.tags_path(room, tag="u.work"), {}), (200, {}))
        self.assertEqual(self.tags(room), {"m.favourite": {"order": 0.5}, "u.work": {}})
        # Setting a tag again replaces its value; keys besides order are kept; the bounds count.
        self.ann.ok("PUT", self.tags_path(room, tag="m.favourite"), {"order": 1, "x.note": "top"})
        self.ann.ok("PUT", self.tags_path(room, tag="m.lowpriority"), {"order": 0})
        self.assertEqual(self.tags(room), {"m.favourite": {"order": 1, "x.note": "top"},
                                           "u.work": {}, "m.lowpriority": {"order": 0}})
        self.assertEqual(self.ann.call("DELETE", self.tags_path(room, tag="u.work")), (200, {}))
        self.assertEqual(set(self.tags(room)), {"m.favourite", "m.lowpriority"})
        # Deleting a tag the room does not have is not an error.
        self.assertEqual(self.ann.call("DELETE", self.tags_path(room, tag="u.never")), (200, {}))
        # The tags are the room's m.tag account data.
        content = self.ann.ok("GET", f"{V3}/user/{quote(self.ann.user_id)}/rooms/{quote(room)}"
                                     "/account_data/m.tag")
        self.assertEqual(content, {"tags": {"m.favourite": {"order": 1, "x.note": "top"},
                                            "m.lowpriority": {"order": 0}}})

    def test_a_tag_change_reaches_incremental_sync_as_room_account_data(self):
        since = self.ann.sync()["next_batch"]
        self.ann.ok("PUT", self.tags_path(tag="m.favourite"), {"order": 0.25})
        answer = self.ann.sync(since=since)
        events = answer["rooms"]["join"][self.room]["account_data"]["events"]
        self.assertIn({"type": "m.tag", "content": {"tags": {"m.favourite": {"order": 0.25}}}},
                      events)
        since = answer["next_batch"]
        self.ann.ok("DELETE", self.tags_path(tag="m.favourite"))
        events = self.ann.sync(since=since)["rooms"]["join"][self.room]["account_data"]["events"]
        self.assertIn({"type": "m.tag", "content": {"tags": {}}}, events)

    def test_a_tag_change_wakes_a_waiting_sync(self):
        since = self.ann.sync()["next_batch"]
        waiting = Background(self.ann.sync, since=since, timeout_ms=20000)
        time.sleep(0.5)  # let the sync park first
        self.ann.ok("PUT", self.tags_path(tag="u.later"), {"order": 0.75})
        answer = waiting.result(timeout=30)
        self.assertLess(waiting.finished_at - waiting.started_at, 10)
        events = answer["rooms"]["join"][self.room]["account_data"]["events"]
        self.assertIn("u.later", events[-1]["content"]["tags"])
        self.ann.ok("DELETE", self.tags_path(tag="u.later"))

    def test_another_users_tags_are_forbidden_and_a_token_is_needed(self):
        self.ann.ok("PUT", self.tags_path(tag="u.mine"), {})
        for method, path, body in (("GET", self.tags_path(), None),
                                   ("PUT", self.tags_path(tag="u.evil"), {}),
                                   ("DELETE", self.tags_path(tag="u.mine"), None)):
            status, answer = self.bob.call(method, path, body)
            self.assertEqual((status, answer["errcode"]), (403, "M_FORBIDDEN"), method)
            status, answer = self.srv.json(method, path, body)
            self.assertEqual((status, answer["errcode"]), (401, "M_MISSING_TOKEN"), method)
        self.assertIn("u.mine", self.tags(self.room))
        self.assertNotIn("u.evil", self.tags(self.room))
        self.ann.ok("DELETE", self.tags_path(tag="u.mine"))

    def test_bad_tag_requests(self):
        room = "!bad:localhost"
        long_tag = "u." + "t" * (TAG_NAME_MAX_BYTES - 2)
        cases = [
            (self.tags_path(room, tag="u.a"), "{", 400, "M_NOT_JSON"),
            (self.tags_path(room, tag="u.a"), "[]", 400, "M_NOT_JSON"),
            (self.tags_path(room, tag="u.a"), {"order": "high"}, 400, "M_BAD_JSON"),
            (self.tags_path(room, tag="u.a"), {"order": None}, 400, "M_BAD_JSON"),
            (self.tags_path(room, tag="u.a"), {"order": 1.5}, 400, "M_INVALID_PARAM"),
            (self.tags_path(room, tag="u.a"), {"order": -0.1}, 400, "M_INVALID_PARAM"),
            (self.tags_path(room, tag=long_tag + "x"), {}, 400, "M_INVALID_PARAM"),
            (self.tags_path(room, tag="u.a").replace("u.a", "%FF"), {}, 400, "M_INVALID_PARAM"),
            (self.tags_path("not-a-room", tag="u.a"), {}, 400, "M_INVALID_PARAM"),
            (self.tags_path(room, tag="u.a"), {"x": "y" * TAG_BODY_MAX_BYTES}, 413, "M_TOO_LARGE"),
        ]
        for path, body, want_status, want_code in cases:
            status, answer = self.ann.srv.json("PUT", path, body, token=self.ann.token,
                                               headers={"Content-Type": "application/json"})
            self.assertEqual((status, answer["errcode"]), (want_status, want_code),
                             (path[-40:], body))
        self.assertEqual(self.tags(room), {})
        status, answer = self.ann.call("GET", self.tags_path("not-a-room"))
        self.assertEqual((status, answer["errcode"]), (400, "M_INVALID_PARAM"))
        # The longest allowed name is fine.
        self.ann.ok("PUT", self.tags_path(room, tag=long_tag), {"order": 0})
        self.assertEqual(self.tags(room), {long_tag: {"order": 0}})

    def test_a_room_holds_at_most_the_tag_cap(self):
        room = "!full:localhost"
        for i in range(TAGS_PER_ROOM_MAX):
            self.ann.ok("PUT", self.tags_path(room, tag=f"u.t{i}"), {})
        status, answer = self.ann.call("PUT", self.tags_path(room, tag="u.one_more"), {})
        self.assertEqual((status, answer["errcode"]), (400, "M_LIMIT_EXCEEDED"))
        # Changing a tag the room has is still allowed, and a freed place can be taken.
        self.ann.ok("PUT", self.tags_path(room, tag="u.t0"), {"order": 0.1})
        self.ann.ok("DELETE", self.tags_path(room, tag="u.t1"))
        self.ann.ok("PUT", self.tags_path(room, tag="u.one_more"), {})
        tags = self.tags(room)
        self.assertEqual(len(tags), TAGS_PER_ROOM_MAX)
        self.assertEqual(tags["u.t0"], {"order": 0.1})

    def test_direct_m_tag_account_data_stays_allowed_and_is_read_leniently(self):
        room = "!direct:localhost"
        base = f"{V3}/user/{quote(self.ann.user_id)}/rooms/{quote(room)}/account_data/m.tag"
        self.ann.ok("PUT", base, {"tags": {"u.direct": {"order": 0.3}}})
        self.assertEqual(self.tags(room), {"u.direct": {"order": 0.3}})
        self.ann.ok("PUT", base, {"tags": "nonsense", "other": 1})
        self.assertEqual(self.tags(room), {})
        self.ann.ok("PUT", self.tags_path(room, tag="u.fixed"), {})
        self.assertEqual(self.ann.ok("GET", base), {"tags": {"u.fixed": {}}, "other": 1})

    def test_concurrent_tag_puts_keep_every_tag(self):
        room = "!busy:localhost"
        workers = [Background(self.ann.ok, "PUT", self.tags_path(room, tag=f"u.c{i}"), {})
                   for i in range(12)]
        for w in workers:
            w.result()
        self.assertEqual(set(self.tags(room)), {f"u.c{i}" for i in range(12)})


class PushersTest(SharedServerTest):
    USERS = ("cat", "dan", "eve")

    def pushers(self, who):
        return who.ok("GET", f"{V3}/pushers")["pushers"]

    def keys(self, who):
        return sorted((p["app_id"], p["pushkey"]) for p in self.pushers(who))

    def set(self, who, body):
        return who.call("POST", f"{V3}/pushers/set", body)

    def test_a_pusher_is_set_listed_updated_and_deleted(self):
        self.assertEqual(self.pushers(self.cat), [])
        body = pusher("cat-key", profile_tag="tag1", append=False,
                      data={"url": NOTIFY_URL, "format": "event_id_only", "x.extra": [1]})
        self.assertEqual(self.set(self.cat, body), (200, {}))
        self.assertEqual(self.pushers(self.cat), [{
            "pushkey": "cat-key", "kind": "http", "app_id": "org.example.app",
            "app_display_name": "Example", "device_display_name": "Phone", "profile_tag": "tag1",
            "lang": "en", "data": {"url": NOTIFY_URL, "format": "event_id_only", "x.extra": [1]},
            # MSC3881 (advertised): the switch, on when not given, and the pusher's device.
            "org.matrix.msc3881.enabled": True, "org.matrix.msc3881.device_id": self.cat.device_id}])
        # Setting it again updates the one pusher.
        again = pusher("cat-key", lang="de", device_display_name="Tablet")
        self.assertEqual(self.set(self.cat, again), (200, {}))
        listed = self.pushers(self.cat)
        self.assertEqual(len(listed), 1)
        self.assertEqual((listed[0]["lang"], listed[0]["device_display_name"]), ("de", "Tablet"))
        self.assertNotIn("profile_tag", listed[0])
        # An email pusher and a second app.
        email = pusher("cat@example.org", app_id="m.email", kind="email", data={})
        self.assertEqual(self.set(self.cat, email), (200, {}))
        self.assertEqual(self.keys(self.cat),
                         [("m.email", "cat@example.org"), ("org.example.app", "cat-key")])
        # kind null deletes; the other fields are then not needed; deleting again is fine.
        for _ in range(2):
            self.assertEqual(self.set(self.cat, {"pushkey": "cat-key", "app_id": "org.example.app",
                                                 "kind": None}), (200, {}))
        self.assertEqual(self.keys(self.cat), [("m.email", "cat@example.org")])
        self.set(self.cat, {"pushkey": "cat@example.org", "app_id": "m.email", "kind": None})
        self.assertEqual(self.pushers(self.cat), [])

    def test_append_false_takes_the_pushkey_from_other_users_and_append_true_shares_it(self):
        shared = pusher("shared-key", app_id="org.example.shared")
        self.assertEqual(self.set(self.cat, shared), (200, {}))
        # dan's append: true leaves cat's pusher alone.
        self.assertEqual(self.set(self.dan, dict(shared, append=True)), (200, {}))
        self.assertIn(("org.example.shared", "shared-key"), self.keys(self.cat))
        self.assertIn(("org.example.shared", "shared-key"), self.keys(self.dan))
        # The same pushkey of another app is another pusher, untouched by what follows.
        self.set(self.cat, pusher("shared-key", app_id="org.example.other"))
        # dan's append: false (the default) removes cat's, never dan's own.
        self.assertEqual(self.set(self.dan, shared), (200, {}))
        self.assertNotIn(("org.example.shared", "shared-key"), self.keys(self.cat))
        self.assertIn(("org.example.other", "shared-key"), self.keys(self.cat))
        self.assertIn(("org.example.shared", "shared-key"), self.keys(self.dan))
        for who, app in ((self.cat, "org.example.other"), (self.dan, "org.example.shared")):
            self.set(who, {"pushkey": "shared-key", "app_id": app, "kind": None})

    def test_a_user_has_at_most_the_pusher_cap(self):
        for i in range(PUSHERS_PER_USER_MAX):
            self.assertEqual(self.set(self.eve, pusher(f"eve-{i}")), (200, {}))
        status, answer = self.set(self.eve, pusher("eve-one-more"))
        self.assertEqual((status, answer["errcode"]), (400, "M_LIMIT_EXCEEDED"))
        # Updating an existing pusher at the cap still works; a freed place can be taken.
        self.assertEqual(self.set(self.eve, pusher("eve-0", lang="fr")), (200, {}))
        self.set(self.eve, {"pushkey": "eve-1", "app_id": "org.example.app", "kind": None})
        self.assertEqual(self.set(self.eve, pusher("eve-one-more")), (200, {}))
        self.assertEqual(len(self.pushers(self.eve)), PUSHERS_PER_USER_MAX)

    def test_pushers_go_with_their_device(self):
        phone = Client(self.srv, login(self.srv, "dan", device_id="DANPHONE"))
        self.assertEqual(self.set(phone, pusher("dan-phone-key")), (200, {}))
        self.assertIn(("org.example.app", "dan-phone-key"), self.keys(self.dan))
        self.assertEqual(phone.call("POST", f"{V3}/logout", {}), (200, {}))
        self.assertNotIn(("org.example.app", "dan-phone-key"), self.keys(self.dan))

    def test_bad_pusher_requests(self):
        bad_urls = ["ftp://push.example.org/_matrix/push/v1/notify",
                    "https:///_matrix/push/v1/notify",
                    "https://push.example.org/_matrix/push/v1/notify2", "https://push.example.org",
                    "https://push.example.org/notify", "push.example.org/_matrix/push/v1/notify",
                    "https://push.example.org/_matrix/push/v1/notify x", ""]
        cases = [("{", 400, "M_NOT_JSON"), ("[1]", 400, "M_NOT_JSON")]
        cases += [(pusher("k", data={"url": url}), 400, "M_INVALID_PARAM") for url in bad_urls]
        cases += [
            (pusher("k", data={"url": 5}), 400, "M_BAD_JSON"),
            (pusher("k", data={}), 400, "M_MISSING_PARAM"),
            (pusher("k", data={"url": NOTIFY_URL, "format": 1}), 400, "M_BAD_JSON"),
            (pusher("k", data="x"), 400, "M_BAD_JSON"),
            (pusher("k", data="https://x/_matrix/push/v1/notify"), 400, "M_BAD_JSON"),
            (pusher("k", data={"url": "https://x/" + "p" * 2100 + "/_matrix/push/v1/notify"}),
             400, "M_INVALID_PARAM"),
            (pusher("k", kind="sms"), 400, "M_INVALID_PARAM"),
            (pusher("k", kind=7), 400, "M_BAD_JSON"),
            (pusher("k", kind=None), 400, "M_MISSING_PARAM"),  # None removes the key here
            ({k: v for k, v in pusher("k").items() if k != "pushkey"}, 400, "M_MISSING_PARAM"),
            (pusher(None), 400, "M_BAD_JSON"),
            (pusher(""), 400, "M_INVALID_PARAM"),
            (pusher("k", app_id=None), 400, "M_MISSING_PARAM"),
            (pusher("k", app_id=""), 400, "M_INVALID_PARAM"),
            (pusher("p" * 513), 400, "M_INVALID_PARAM"),
            (pusher("k", app_id="a" * 65), 400, "M_INVALID_PARAM"),
            (pusher("k", app_id="é" * 65), 400, "M_INVALID_PARAM"),
            (pusher("k", profile_tag="t" * 33), 400, "M_INVALID_PARAM"),
            (pusher("k", app_display_name=None), 400, "M_MISSING_PARAM"),
            (pusher("k", device_display_name=None), 400, "M_MISSING_PARAM"),
            (pusher("k", lang=None), 400, "M_MISSING_PARAM"),
            (pusher("k", data=None), 400, "M_MISSING_PARAM"),
            (pusher("k", app_display_name="n" * 257), 400, "M_INVALID_PARAM"),
            (pusher("k", device_display_name="n" * 257), 400, "M_INVALID_PARAM"),
            (pusher("k", lang="l" * 65), 400, "M_INVALID_PARAM"),
            (pusher("k", lang=3), 400, "M_BAD_JSON"),
            (pusher("k", append="yes"), 400, "M_BAD_JSON"),
            (pusher("k", data={"url": NOTIFY_URL, "x": "y" * PUSHER_BODY_MAX_BYTES}),
             413, "M_TOO_LARGE"),
        ]
        for body, want_status, want_code in cases:
            status, answer = self.srv.json("POST", f"{V3}/pushers/set", body, token=self.cat.token,
                                           headers={"Content-Type": "application/json"})
            self.assertEqual((status, answer["errcode"]), (want_status, want_code), str(body)[:160])
        self.assertEqual(self.pushers(self.cat), [])
        # The limits themselves are allowed: 512-byte pushkey, 64-character app_id (2 bytes
        # each), 32-character profile_tag; plain http and a query on the URL are fine.
        good = pusher("p" * 512, app_id="é" * 64, profile_tag="t" * 32,
                      data={"url": "http://127.0.0.1:8080/_matrix/push/v1/notify?k=v"})
        self.assertEqual(self.set(self.cat, good), (200, {}))
        self.assertEqual(self.keys(self.cat), [("é" * 64, "p" * 512)])
        self.set(self.cat, {"pushkey": "p" * 512, "app_id": "é" * 64, "kind": None})

    def test_pushers_need_a_token(self):
        status, answer = self.srv.json("GET", f"{V3}/pushers")
        self.assertEqual((status, answer["errcode"]), (401, "M_MISSING_TOKEN"))
        status, answer = self.srv.json("POST", f"{V3}/pushers/set", pusher("k"))
        self.assertEqual((status, answer["errcode"]), (401, "M_MISSING_TOKEN"))
        status, answer = self.srv.json("GET", f"{V3}/pushers", token="not-a-token")
        self.assertEqual((status, answer["errcode"]), (401, "M_UNKNOWN_TOKEN"))


class HarmlessAnswersTest(SharedServerTest):
    USERS = ("fay",)

    def test_element_start_up_answers(self):
        for path, want in (("/account/3pid", {"threepids": []}), ("/thirdparty/protocols", {}),
                           ("/voip/turnServer", {})):
            self.assertEqual(self.fay.call("GET", V3 + path), (200, want), path)
            status, answer = self.srv.json("GET", V3 + path)
            self.assertEqual((status, answer["errcode"]), (401, "M_MISSING_TOKEN"), path)
            status, answer = self.srv.json("GET", V3 + path, token="not-a-token")
            self.assertEqual((status, answer["errcode"]), (401, "M_UNKNOWN_TOKEN"), path)


if __name__ == "__main__":
    unittest.main()
