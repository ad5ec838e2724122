"""Jumping to a date and reporting content.

GET /_matrix/client/v1/rooms/{roomId}/timestamp_to_event answers the event nearest to a
time in one direction among those the user may see (core/client/rooms/crooms_timestamp.c, the
rule in core/rooms/rooms_jump.c), and GET /_matrix/federation/v1/timestamp_to_event/{roomId}
the same to another server under its ACL and history visibility for servers
(core/federation/rooms/fed_rooms_serve.c): a fake peer signs its requests with its own key.

Reports of events, rooms and users (core/client/reports/reports.c) are stored in
PostgreSQL and read back by server admins through Synapse's admin API
(core/client/reports/reports_admin.c).
"""

import shutil
import tempfile
import time
import unittest

from accounts import REGISTRATION_ON, register
from common import make_admin
from federation_support import FakeKeyServer, FederatedServer, TestCA
from harness import psql
from rooms_client import V3, Client, SharedServerTest, quote
from test_federation import A_IP, FAKE_IP

V1 = "/_matrix/client/v1"
FED = "/_matrix/federation/v1"
ADMIN = "/_synapse/admin/v1"
JOINED_ONLY = {"type": "m.room.history_visibility", "state_key": "",
               "content": {"history_visibility": "joined"}}
WORLD_READABLE = {"type": "m.room.history_visibility", "state_key": "",
                  "content": {"history_visibility": "world_readable"}}


def text(body):
    return {"msgtype": "m.text", "body": body}


class JumpToDateTest(unittest.TestCase):
    """One federated Atrium with alice, bob and carol, and a fake peer with no users."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="atrium-jump-ca-")
        cls.ca = TestCA(cls.tmp)
        cls.peer = FakeKeyServer(cls.ca, FAKE_IP)
        cls.a = FederatedServer(cls.ca, A_IP, extra=REGISTRATION_ON, start=False)
        try:
            cls.a.start()
            cls.alice, cls.bob, cls.carol = (Client(cls.a, register(cls.a, n))
                                             for n in ("alice", "bob", "carol"))
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.a.close()
        cls.peer.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def jump(self, who, room, query):
        return who.call("GET", f"{V1}/rooms/{quote(room)}/timestamp_to_event{query}")

    def fed_jump(self, room, query):
        status, _, body = self.a.signed_request(
            "GET", f"{FED}/timestamp_to_event/{quote(room)}{query}", self.peer.server_name,
            self.peer.key)
        return status, body

    def sent_at(self, who, room, event_id):
        return who.ok("GET", f"{V3}/rooms/{quote(room)}/event/{quote(event_id)}")["origin_server_ts"]

    def three_messages(self, room):
        """Three messages with distinct timestamps: [(event_id, ts)], oldest first."""
        out = []
        for i in range(3):
            if out:
                time.sleep(0.01)
            event_id = self.alice.send(room, text(f"m{i}"))
            out.append((event_id, self.sent_at(self.alice, room, event_id)))
        self.assertLess(out[0][1], out[1][1])
        self.assertLess(out[1][1], out[2][1])
        return out

    def test_the_nearest_event_in_each_direction_is_answered_with_its_timestamp(self):
        room = self.alice.create_room(preset="public_chat")
        (m0, t0), (m1, t1), (m2, t2) = self.three_messages(room)
        cases = [(t1, "f", m1, t1), (t1, "b", m1, t1), (t1 + 1, "f", m2, t2),
                 (t1 - 1, "b", m0, t0), (t2 + 1, "b", m2, t2)]
        for ts, direction, want, want_ts in cases:
            status, body = self.jump(self.alice, room, f"?ts={ts}&dir={direction}")
            self.assertEqual(status, 200, (ts, direction, body))
            self.assertEqual(body, {"event_id": want, "origin_server_ts": want_ts}, (ts, direction))
        # Nothing after the last message; before the room was created, nothing either.
        status, body = self.jump(self.alice, room, f"?ts={t2 + 1}&dir=f")
        self.assertEqual((status, body.get("errcode")), (404, "M_NOT_FOUND"))
        status, body = self.jump(self.alice, room, "?ts=0&dir=b")
        self.assertEqual((status, body.get("errcode")), (404, "M_NOT_FOUND"))

    def test_events_the_user_may_not_see_are_skipped(self):
        room = self.alice.create_room(preset="public_chat", initial_state=[JOINED_ONLY])
        before = self.alice.send(room, text("before bob"))
        t_before = self.sent_at(self.alice, room, before)
        time.sleep(0.01)
        self.bob.join(room)
        status, body = self.jump(self.alice, room, f"?ts={t_before}&dir=b")
        self.assertEqual((status, body.get("event_id")), (200, before))
        # bob was not joined when it was sent: backwards he gets the newest event before it
        # he may see, the m.room.history_visibility event itself (under the "shared" before
        # it, which shows it to a member of today), and forwards his own join.
        hv = self.alice.ok("GET", f"{V3}/rooms/{quote(room)}/state/m.room.history_visibility?format=event")
        status, body = self.jump(self.bob, room, f"?ts={t_before}&dir=b")
        self.assertEqual((status, body.get("event_id")), (200, hv["event_id"]), body)
        status, body = self.jump(self.bob, room, f"?ts={t_before}&dir=f")
        self.assertEqual(status, 200, body)
        join = self.bob.ok("GET", f"{V3}/rooms/{quote(room)}/state/m.room.member/{quote(self.bob.user_id)}?format=event")
        self.assertEqual(body["event_id"], join["event_id"])

    def test_a_room_the_user_was_never_in_is_forbidden(self):
        room = self.alice.create_room(preset="private_chat")
        self.alice.send(room, text("secret"))
        status, body = self.jump(self.carol, room, f"?ts={int(time.time() * 1000)}&dir=b")
        self.assertEqual((status, body.get("errcode")), (403, "M_FORBIDDEN"), body)

    def test_a_missing_or_malformed_ts_or_dir_is_an_invalid_parameter(self):
        room = self.alice.create_room(preset="public_chat")
        for query in ("", "?dir=f", "?ts=1000", "?ts=abc&dir=f", "?ts=-5&dir=b",
                      "?ts=1000&dir=x", "?ts=1000&dir=forward"):
            status, body = self.jump(self.alice, room, query)
            self.assertEqual((status, body.get("errcode")), (400, "M_INVALID_PARAM"), query)
            status, body = self.fed_jump(room, query)
            self.assertEqual((status, body.get("errcode")), (400, "M_INVALID_PARAM"), query)

    def test_another_server_is_answered_what_it_may_see(self):
        readable = self.alice.create_room(preset="public_chat", initial_state=[WORLD_READABLE])
        (m0, t0), (m1, t1), _ = self.three_messages(readable)
        status, body = self.fed_jump(readable, f"?ts={t1 - 1}&dir=b")
        self.assertEqual((status, body), (200, {"event_id": m0, "origin_server_ts": t0}))
        status, body = self.fed_jump(readable, f"?ts={t1}&dir=f")
        self.assertEqual((status, body), (200, {"event_id": m1, "origin_server_ts": t1}))
        # A room none of the peer's users is in, shown to members only: nothing to see.
        hidden = self.alice.create_room(preset="public_chat", initial_state=[JOINED_ONLY])
        msg = self.alice.send(hidden, text("members only"))
        status, body = self.fed_jump(hidden, f"?ts={self.sent_at(self.alice, hidden, msg)}&dir=b")
        self.assertEqual((status, body.get("errcode")), (404, "M_NOT_FOUND"), body)
        # A room unknown here.
        status, body = self.fed_jump("!nowhere:" + self.a.server_name, "?ts=1&dir=f")
        self.assertEqual((status, body.get("errcode")), (404, "M_NOT_FOUND"), body)

    def test_another_server_the_rooms_acl_denies_is_refused(self):
        room = self.alice.create_room(preset="public_chat", initial_state=[WORLD_READABLE])
        msg = self.alice.send(room, text("hi"))
        ts = self.sent_at(self.alice, room, msg)
        self.assertEqual(self.fed_jump(room, f"?ts={ts}&dir=b")[0], 200)
        # The peer's name is an IP literal.
        self.alice.put_state(room, "m.room.server_acl", {"allow": ["*"], "allow_ip_literals": False})
        status, body = self.fed_jump(room, f"?ts={ts}&dir=b")
        self.assertEqual((status, body.get("errcode")), (403, "M_FORBIDDEN"), body)

    def test_an_unsigned_federation_request_is_refused(self):
        room = self.alice.create_room(preset="public_chat", initial_state=[WORLD_READABLE])
        status, _, body = self.a.fed_request("GET", f"{FED}/timestamp_to_event/{quote(room)}?ts=1&dir=f")
        self.assertEqual(status, 401, body)


class ReportTest(SharedServerTest):
    USERS = ("alice", "bob", "carol", "root")

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        make_admin(cls.srv, cls.root.user_id)

    def room_with_bob(self, name="Reported", **extra):
        room = self.alice.create_room(preset="public_chat", name=name, **extra)
        self.bob.join(room)
        return room

    def report_event(self, who, room, event_id, body):
        return who.call("POST", f"{V3}/rooms/{quote(room)}/report/{quote(event_id)}", body)

    def reports(self, query=""):
        return self.root.ok("GET", f"{ADMIN}/event_reports{query}")

    def test_an_event_report_is_stored_and_shown_to_admins(self):
        room = self.room_with_bob(name="Spam corner")
        msg = self.alice.send(room, text("buy now"))
        status, body = self.report_event(self.bob, room, msg, {"reason": "spam", "score": -100})
        self.assertEqual((status, body), (200, {}))
        listing = self.reports(f"?room_id={quote(room)}")
        self.assertEqual(listing["total"], 1)
        self.assertNotIn("next_token", listing)
        [report] = listing["event_reports"]
        want = {"room_id": room, "event_id": msg, "user_id": self.bob.user_id, "reason": "spam",
                "score": -100, "sender": self.alice.user_id, "name": "Spam corner",
                "canonical_alias": None}
        self.assertEqual({k: report.get(k) for k in want}, want)
        self.assertLessEqual(abs(report["received_ts"] - time.time() * 1000), 60000)
        detail = self.root.ok("GET", f"{ADMIN}/event_reports/{report['id']}")
        self.assertEqual((detail["event_json"]["content"], detail["event_json"]["sender"]),
                         (text("buy now"), self.alice.user_id))
        self.assertEqual(detail["event_id"], msg)
        # Durable: a row of PostgreSQL.
        rows = psql(f"SELECT kind, reporter, reason FROM reports WHERE id = {report['id']}",
                    self.srv.database)
        self.assertEqual(rows, [["event", self.bob.user_id, "spam"]])

    def test_the_reason_and_score_are_optional_for_an_event(self):
        room = self.room_with_bob()
        msg = self.alice.send(room, text("meh"))
        self.assertEqual(self.report_event(self.bob, room, msg, {}), (200, {}))
        [report] = self.reports(f"?room_id={quote(room)}")["event_reports"]
        self.assertEqual((report["reason"], report["score"]), (None, None))

    def test_an_event_the_reporter_may_not_see_is_not_found(self):
        private = self.alice.create_room(preset="private_chat")
        secret = self.alice.send(private, text("secret"))
        members_only = self.alice.create_room(preset="public_chat", initial_state=[JOINED_ONLY])
        before = self.alice.send(members_only, text("before bob"))
        self.bob.join(members_only)
        after = self.alice.send(members_only, text("after bob"))
        for who, room, event_id in ((self.carol, private, secret),
                                    (self.bob, members_only, before),
                                    (self.bob, members_only, "$nosuchevent"),
                                    (self.bob, "!nowhere:" + self.srv.server_name, after)):
            status, body = self.report_event(who, room, event_id, {"reason": "x"})
            self.assertEqual((status, body.get("errcode")), (404, "M_NOT_FOUND"), event_id)
        self.assertEqual(self.report_event(self.bob, members_only, after, {"reason": "x"}),
                         (200, {}))
        self.assertEqual(self.reports(f"?room_id={quote(private)}")["total"], 0)
        self.assertEqual([r["event_id"] for r in
                          self.reports(f"?room_id={quote(members_only)}")["event_reports"]],
                         [after])

    def test_bad_input_is_refused(self):
        room = self.room_with_bob()
        msg = self.alice.send(room, text("x"))
        cases = [({"reason": 5}, "M_BAD_JSON"), ({"reason": "x", "score": "low"}, "M_BAD_JSON"),
                 ({"reason": "x", "score": 5}, "M_BAD_JSON"),
                 ({"reason": "x", "score": -101}, "M_BAD_JSON"),
                 ({"reason": "x", "score": -1.5}, "M_BAD_JSON"),
                 ({"reason": "a" * 1001}, "M_INVALID_PARAM")]
        for body, errcode in cases:
            status, answer = self.report_event(self.bob, room, msg, body)
            self.assertEqual((status, answer.get("errcode")), (400, errcode), body)
        # The bound counts characters, not bytes: 1000 two-byte characters pass.
        self.assertEqual(self.report_event(self.bob, room, msg, {"reason": "é" * 1000}), (200, {}))
        status, answer = self.bob.call("POST", f"{V3}/rooms/{quote(room)}/report", {"reason": ["x"]})
        self.assertEqual((status, answer.get("errcode")), (400, "M_BAD_JSON"))
        status, answer = self.bob.call("POST", f"{V3}/rooms/{quote(room)}/report", {})
        self.assertEqual(status, 400, answer)
        status, answer = self.bob.call("POST", f"{V3}/users/{quote('nobody')}/report", {"reason": "x"})
        self.assertEqual((status, answer.get("errcode")), (400, "M_INVALID_PARAM"))
        self.assertEqual([r["reason"] for r in self.reports(f"?room_id={quote(room)}")["event_reports"]],
                         ["é" * 1000])

    def test_rooms_and_users_are_reported_whether_or_not_the_reporter_is_in_them(self):
        room = self.alice.create_room(preset="private_chat")
        self.assertEqual(self.carol.call("POST", f"{V3}/rooms/{quote(room)}/report",
                                         {"reason": "illegal"}), (200, {}))
        self.assertEqual(self.carol.call("POST", f"{V3}/users/{quote(self.alice.user_id)}/report",
                                         {"reason": "harassment"}), (200, {}))
        self.assertEqual(self.carol.call("POST", f"{V3}/users/{quote('@someone:elsewhere.example')}/report",
                                         {"reason": ""}), (200, {}))
        for path in (f"rooms/{quote('!nowhere:' + self.srv.server_name)}/report",
                     f"users/{quote('@nobody:' + self.srv.server_name)}/report"):
            status, body = self.carol.call("POST", f"{V3}/{path}", {"reason": "x"})
            self.assertEqual((status, body.get("errcode")), (404, "M_NOT_FOUND"), path)
        rows = psql("SELECT kind, coalesce(room_id, target_user_id), reason FROM reports"
                    f" WHERE reporter = '{self.carol.user_id}' ORDER BY id", self.srv.database)
        self.assertEqual(rows, [["room", room, "illegal"], ["user", self.alice.user_id, "harassment"],
                                ["user", "@someone:elsewhere.example", ""]])
        # The event reports list holds event reports only.
        self.assertEqual(self.reports(f"?room_id={quote(room)}")["total"], 0)

    def test_the_admin_list_pages_orders_and_filters(self):
        room = self.room_with_bob(name="Paged")
        msgs = [self.alice.send(room, text(f"p{i}")) for i in range(3)]
        for m in msgs:
            self.assertEqual(self.report_event(self.bob, room, m, {"reason": m}), (200, {}))
        self.assertEqual(self.report_event(self.alice, room, msgs[0], {"reason": "mine"}), (200, {}))
        q = f"?room_id={quote(room)}"
        page = self.reports(q + "&limit=2")
        self.assertEqual((page["total"], page["next_token"]), (4, 2))
        rest = self.reports(q + f"&limit=2&from={page['next_token']}")
        self.assertNotIn("next_token", rest)
        newest_first = [r["id"] for r in page["event_reports"] + rest["event_reports"]]
        self.assertEqual(newest_first, sorted(newest_first, reverse=True))
        self.assertEqual([r["id"] for r in self.reports(q + "&dir=f")["event_reports"]],
                         sorted(newest_first))
        by_bob = self.reports(q + f"&user_id={quote(self.bob.user_id)}")
        self.assertEqual(sorted(r["event_id"] for r in by_bob["event_reports"]), sorted(msgs))
        for query in ("?dir=x", "?limit=-1", "?from=abc"):
            status, body = self.root.call("GET", f"{ADMIN}/event_reports{query}")
            self.assertEqual((status, body.get("errcode")), (400, "M_INVALID_PARAM"), query)
        status, body = self.root.call("GET", f"{ADMIN}/event_reports/abc")
        self.assertEqual((status, body.get("errcode")), (400, "M_INVALID_PARAM"))
        status, body = self.root.call("GET", f"{ADMIN}/event_reports/999999999")
        self.assertEqual((status, body.get("errcode")), (404, "M_NOT_FOUND"))

    def test_only_server_admins_read_reports(self):
        for path in (f"{ADMIN}/event_reports", f"{ADMIN}/event_reports/1"):
            status, body = self.bob.call("GET", path)
            self.assertEqual((status, body.get("errcode")), (403, "M_FORBIDDEN"), path)
            status, body = self.srv.json("GET", path)
            self.assertEqual(status, 401, path)


if __name__ == "__main__":
    unittest.main()
