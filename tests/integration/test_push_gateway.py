"""Push gateway delivery: an http pusher's gateway (a fake one here, on a real TLS socket)
receives POST /_matrix/push/v1/notify for each event the user's push rules make notify,
with the event's fields and the user's unread count; a 5xx is retried after a back-off,
an answer listing the pushkey in "rejected" removes the pusher, and a restart does not
lose a pending push; with two processes on one database, each event is pushed once, by
the holder of the push sender's lease, whichever process it was sent through
(core/client/push/push_send.c)."""

import json
import shutil
import tempfile
import threading
import time
import unittest

import harness
from accounts import REGISTRATION_ON, register
from common import wait_until
from harness import create_database, drop_database
from federation_support import FakeKeyServer, TestCA
from rooms_client import V3, Client

GATEWAY_IP = "127.0.0.71"
PROCESS_IPS = ("127.0.0.72", "127.0.0.73")  # two processes on one database
NOTIFY = "/_matrix/push/v1/notify"


class FakeGateway(FakeKeyServer):
    """A push gateway: records every notify body; answers with `answers` in turn (status,
    body), then 200 {"rejected": []}."""

    def __init__(self, ca, ip):
        self.notified = []
        self.answers = []
        self.lock = threading.Lock()
        super().__init__(ca, ip)

    @property
    def url(self):
        return f"https://{self.ip}:{self.port}{NOTIFY}"

    def do_post(self, handler):
        length = int(handler.headers.get("Content-Length") or 0)
        body = json.loads(handler.rfile.read(length) or b"{}")
        if handler.path != NOTIFY:
            handler.send_error(404)
            return
        with self.lock:
            self.notified.append(body)
            status, answer = self.answers.pop(0) if self.answers else (200, {"rejected": []})
        if answer is None:  # an empty body
            handler.send_response(status)
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        self.reply(handler, status, answer)

    def wait_for(self, n, timeout=15):
        deadline = time.time() + timeout
        while time.time() < deadline:
            with self.lock:
                if len(self.notified) >= n:
                    return list(self.notified)
            time.sleep(0.05)
        with self.lock:
            return list(self.notified)


class PushGatewayTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="atrium-push-ca-")
        cls.ca = TestCA(cls.tmp)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def settings(self):
        return harness.deep_merge(REGISTRATION_ON, {
            "federation": {"custom_ca_list": [self.ca.cert],
                           "ip_range_whitelist": ["127.0.0.0/8"]}})

    def setUp(self):
        self.gw = FakeGateway(self.ca, GATEWAY_IP)
        self.addCleanup(self.gw.close)
        self.srv = harness.Server(settings=self.settings())
        self.srv.__enter__()

        def close():
            outcome = getattr(self, "_outcome", None)
            if outcome is not None and not getattr(outcome, "success", True):
                self.srv._failed = True  # the server's log goes with the failure
            self.srv.close()

        self.addCleanup(close)
        self.ann = Client(self.srv, register(self.srv, "ann"))
        self.bob = Client(self.srv, register(self.srv, "bob"))
        self.room = self.ann.create_room(name="Pushed room", invite=[self.bob.user_id])
        self.bob.join(self.room)
        # The sender has decided the room's first events (the invite notified bob) before
        # a test sets a pusher: what a test sends is then what the gateway sees first.
        self.wait_notifications(self.bob, 1)

    def notifications(self, client, **params):
        query = "&".join(f"{k}={v}" for k, v in params.items())
        return client.ok("GET", f"{V3}/notifications" + (f"?{query}" if query else ""))

    def wait_notifications(self, client, n, timeout=10, **params):
        deadline = time.time() + timeout
        while True:
            got = self.notifications(client, **params)["notifications"]
            if len(got) >= n or time.time() > deadline:
                return got
            time.sleep(0.05)

    def set_pusher(self, client, pushkey, **data):
        body = {"pushkey": pushkey, "kind": "http", "app_id": "org.example.app",
                "app_display_name": "Example", "device_display_name": "Phone",
                "lang": "en", "data": dict({"url": self.gw.url}, **data)}
        client.ok("POST", f"{V3}/pushers/set", body)

    def pushers(self, client):
        return client.ok("GET", f"{V3}/pushers")["pushers"]

    def test_a_notifying_event_reaches_the_gateway_with_its_fields_and_counts(self):
        self.set_pusher(self.bob, "bob-key", extra="kept")
        event_id = self.ann.send(self.room, {"msgtype": "m.text", "body": "hello there"})
        got = self.gw.wait_for(1)
        self.assertEqual(len(got), 1, got)
        n = got[0]["notification"]
        self.assertEqual(n["event_id"], event_id)
        self.assertEqual(n["room_id"], self.room)
        self.assertEqual(n["type"], "m.room.message")
        self.assertEqual(n["sender"], self.ann.user_id)
        self.assertEqual(n["content"], {"msgtype": "m.text", "body": "hello there"})
        self.assertEqual(n["room_name"], "Pushed room")
        self.assertEqual(n["counts"], {"unread": 2})  # the invite, then this
        self.assertEqual(n["prio"], "low")
        [device] = n["devices"]
        self.assertEqual(device["app_id"], "org.example.app")
        self.assertEqual(device["pushkey"], "bob-key")
        self.assertEqual(device["data"], {"extra": "kept"})  # the url is not sent
        self.assertIsInstance(device["pushkey_ts"], int)
        # A second message counts two unread; ann's own messages never reach her pushers,
        # and a mention highlights.
        self.set_pusher(self.ann, "ann-key")
        self.ann.send(self.room, {"msgtype": "m.text", "body": "two",
                                  "m.mentions": {"user_ids": [self.bob.user_id]}})
        got = self.gw.wait_for(2)
        self.assertEqual(len(got), 2, got)
        n = got[1]["notification"]
        self.assertEqual(n["counts"], {"unread": 3})
        self.assertEqual(n["devices"][0]["pushkey"], "bob-key")
        self.assertEqual(n["prio"], "high")
        self.assertEqual(n["devices"][0]["tweaks"].get("highlight"), True)
        time.sleep(1.0)
        self.assertEqual(len(self.gw.notified), 2)

    def test_a_failing_gateway_is_retried_and_event_id_only_is_honoured(self):
        self.set_pusher(self.bob, "bob-key", format="event_id_only")
        self.gw.answers = [(500, {"error": "down"})]
        started = time.time()
        event_id = self.ann.send(self.room, {"msgtype": "m.text", "body": "retry me"})
        got = self.gw.wait_for(2)
        self.assertEqual(len(got), 2, got)
        self.assertGreater(time.time() - started, 0.9)  # after the first back-off
        for body in got:
            n = body["notification"]
            self.assertEqual(n["event_id"], event_id)
            self.assertNotIn("content", n)
            self.assertNotIn("sender", n)
        time.sleep(1.5)
        self.assertEqual(len(self.gw.notified), 2)  # delivered once it got its 200

    def test_a_2xx_without_a_json_body_is_a_delivery(self):
        self.set_pusher(self.bob, "bob-key")
        self.gw.answers = [(200, None)]
        self.ann.send(self.room, {"msgtype": "m.text", "body": "once"})
        self.assertEqual(len(self.gw.wait_for(1)), 1)
        time.sleep(2.0)  # past the first retry's back-off: none comes
        self.assertEqual(len(self.gw.notified), 1)
        self.assertEqual(len(self.pushers(self.bob)), 1)

    def test_a_rejected_pushkey_removes_the_pusher(self):
        self.set_pusher(self.bob, "stale-key")
        self.gw.answers = [(200, {"rejected": ["stale-key"]})]
        self.ann.send(self.room, {"msgtype": "m.text", "body": "to a stale phone"})
        self.assertEqual(len(self.gw.wait_for(1)), 1)
        deadline = time.time() + 10
        while self.pushers(self.bob) and time.time() < deadline:
            time.sleep(0.1)
        self.assertEqual(self.pushers(self.bob), [])
        self.ann.send(self.room, {"msgtype": "m.text", "body": "nobody hears this"})
        time.sleep(1.5)
        self.assertEqual(len(self.gw.notified), 1)

    def test_notifications_lists_what_notified_newest_first_with_paging(self):
        first = self.ann.send(self.room, {"msgtype": "m.text", "body": "one"})
        mention = self.ann.send(self.room, {"msgtype": "m.text", "body": "two",
                                            "m.mentions": {"user_ids": [self.bob.user_id]}})
        self.ann.send(self.room, {"msgtype": "m.text", "body": "three"}, txn=None)
        self.bob.send(self.room, {"msgtype": "m.text", "body": "bob's own"})
        got = self.wait_notifications(self.bob, 4)
        self.assertEqual(len(got), 4, got)  # the invite and ann's three; not bob's own
        self.assertEqual([g["event"]["content"].get("body") for g in got[:3]],
                         ["three", "two", "one"])
        self.assertEqual(got[3]["event"]["type"], "m.room.member")
        for g in got:
            self.assertEqual(g["room_id"], self.room)
            self.assertIn("notify", g["actions"])
            self.assertIsInstance(g["ts"], int)
            self.assertIs(g["read"], False)
        self.assertIn({"set_tweak": "highlight"}, got[1]["actions"])
        # Paging: limit and next_token walk the same list.
        page = self.notifications(self.bob, limit=2)
        self.assertEqual([g["event"]["event_id"] for g in page["notifications"]],
                         [g["event"]["event_id"] for g in got[:2]])
        rest = self.notifications(self.bob, limit=2, **{"from": page["next_token"]})
        self.assertEqual([g["event"]["event_id"] for g in rest["notifications"]],
                         [g["event"]["event_id"] for g in got[2:]])
        last = self.notifications(self.bob, limit=2, **{"from": rest["next_token"]})
        self.assertEqual(last["notifications"], [])
        self.assertNotIn("next_token", last)
        # only=highlight keeps the mention.
        high = self.notifications(self.bob, only="highlight")["notifications"]
        self.assertEqual([g["event"]["event_id"] for g in high], [mention])
        # A read receipt on the newest marks them read.
        self.bob.ok("POST", f"{V3}/rooms/{self.room}/receipt/m.read/{got[0]['event']['event_id']}",
                    {})
        self.assertTrue(all(g["read"] for g in self.notifications(self.bob)["notifications"]))
        self.assertNotIn(first, [g["event"]["event_id"] for g in high])
        self.assertEqual(self.bob.call("GET", f"{V3}/notifications?limit=x")[0], 400)

    def test_a_pending_push_survives_a_restart(self):
        self.set_pusher(self.bob, "bob-key")
        self.gw.stop()  # the gateway is away: the push waits in the queue
        event_id = self.ann.send(self.room, {"msgtype": "m.text", "body": "while away"})
        time.sleep(1.5)
        self.srv.stop()
        self.srv.start()
        self.gw.start()
        got = self.gw.wait_for(1, timeout=30)
        self.assertEqual([b["notification"]["event_id"] for b in got], [event_id])


if __name__ == "__main__":
    unittest.main()


class TwoProcessPushTest(unittest.TestCase):
    """Two processes on one database: only the lease holder decides and sends, so an event
    sent through either reaches the gateway once."""

    def setUp(self):
        tmp = tempfile.mkdtemp(prefix="atrium-push-ca-")
        self.addCleanup(shutil.rmtree, tmp, True)
        ca = TestCA(tmp)
        self.gw = FakeGateway(ca, GATEWAY_IP)
        self.addCleanup(self.gw.close)
        db = create_database()
        self.addCleanup(drop_database, db)
        settings = harness.deep_merge(REGISTRATION_ON, {
            "federation": {"custom_ca_list": [ca.cert], "ip_range_whitelist": ["127.0.0.0/8"]}})
        self.servers = []
        for ip in PROCESS_IPS:
            srv = harness.Server(database=db, settings=settings, start=False, host=ip)
            self.addCleanup(srv.close)
            srv.start()
            self.servers.append(srv)

    def test_each_event_is_pushed_once_whichever_process_it_went_through(self):
        a, b = self.servers
        ann = register(a, "ann")
        ann_a, ann_b = Client(a, ann), Client(b, ann)
        bob = Client(b, register(b, "bob"))
        room = ann_a.create_room(name="Two processes", invite=[bob.user_id])
        bob.join(room)
        wait_until(lambda: len(self.holders()) == 1, what="one holder of core.push_sender")
        body = {"pushkey": "bob-key", "kind": "http", "app_id": "org.example.app",
                "app_display_name": "Example", "device_display_name": "Phone",
                "lang": "en", "data": {"url": self.gw.url}}
        bob.ok("POST", f"{V3}/pushers/set", body)
        sent = [ann_a.send(room, {"msgtype": "m.text", "body": "through a"}),
                ann_b.send(room, {"msgtype": "m.text", "body": "through b"})]
        got = self.gw.wait_for(2)
        time.sleep(2.5)  # past a poll in either process: a second sender would have sent
        pushed = [n["notification"]["event_id"] for n in self.gw.notified]
        self.assertEqual(sorted(pushed), sorted(sent), got)
        self.assertEqual(len(self.holders()), 1)

    def holders(self):
        return [s for s in self.servers
                if s.metric("atrium_lease_held", {"lease": "core.push_sender"}) == 1]
