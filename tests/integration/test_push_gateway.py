"""Push gateway delivery: an http pusher's gateway (a fake one here, on a real TLS socket, or
plain HTTP as Sygnal is often reached) receives POST /_matrix/push/v1/notify for each event
the user's push rules make notify, with the event's fields and the user's unread count; a
5xx is retried after a back-off, an answer listing the pushkey in "rejected" removes the
pusher, and a restart does not lose a pending push; an http:// gateway on a blacklisted
address is never reached; at most PUSH_MAX_IN_FLIGHT (16) pushers have a request in flight
and the rest wait, losing nothing; a user's notifications are pruned to
push.notifications_per_user_max and still page; with two processes on one database, each
event is pushed once, by the holder of the push sender's lease, whichever process it was
sent through (core/client/push/push_send.c)."""

import json
import shutil
import tempfile
import threading
import time
import unittest
import uuid

import harness
from accounts import REGISTRATION_ON, register
from common import AtriumTestCase, wait_until
from harness import create_database, drop_database
from federation_support import FakeKeyServer, TestCA
from rooms_client import V3, Client

GATEWAY_IP = "127.0.0.71"
PROCESS_IPS = ("127.0.0.72", "127.0.0.73")  # two processes on one database
HTTP_GATEWAY_IP = "127.0.0.74"  # a plain-HTTP gateway, whitelisted
BLOCKED_GATEWAY_IP = "127.0.0.75"  # a plain-HTTP gateway left on the blacklist
NOTIFY = "/_matrix/push/v1/notify"
PUSH_MAX_IN_FLIGHT = 16  # core/client/push/push_send.c


class FakeGateway(FakeKeyServer):
    """A push gateway (over TLS with a CA, plain HTTP with ca None): records every notify
    body; answers with `answers` in turn (status, body), then 200 {"rejected": []}. While
    `held` it answers nothing (each request waits until release()); `waiting` counts the
    requests waiting so."""

    def __init__(self, ca, ip):
        self.notified = []
        self.answers = []
        self.lock = threading.Lock()
        self.released = threading.Event()
        self.released.set()
        self.waiting = 0
        super().__init__(ca, ip)

    @property
    def url(self):
        return f"{'https' if self.cert else 'http'}://{self.ip}:{self.port}{NOTIFY}"

    def hold(self):
        self.released.clear()

    def release(self):
        self.released.set()

    def do_post(self, handler):
        length = int(handler.headers.get("Content-Length") or 0)
        body = json.loads(handler.rfile.read(length) or b"{}")
        if handler.path != NOTIFY:
            handler.send_error(404)
            return
        with self.lock:
            self.notified.append(body)
            self.waiting += 1
        self.released.wait(60)
        with self.lock:
            self.waiting -= 1
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


class PushCase(AtriumTestCase):
    """A server whose outbound client may reach the test gateways, ann and bob in a room;
    helpers. Its subclasses hold the tests. A class's tests share one server
    (start_class_server), each with a gateway, an ann, a bob and a room of its own, except
    those named in OWN_SERVER: a restart, or a gauge that must see only the test's pushes."""

    OWN_SERVER = ()

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="atrium-push-ca-")
        cls.ca = TestCA(cls.tmp)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def settings(self):
        # Only the gateways' own addresses are whitelisted: the rest of loopback stays on
        # the blacklist. Connections are raised past PUSH_MAX_IN_FLIGHT so the sender's
        # bound, not the outbound client's per-host cap, is what a full test meets.
        allowed = [f"{GATEWAY_IP}/32", f"{HTTP_GATEWAY_IP}/32"]
        return harness.deep_merge(REGISTRATION_ON, {
            "federation": {"custom_ca_list": [self.ca.cert], "ip_range_whitelist": allowed,
                           "client": {"max_connections": 2 * PUSH_MAX_IN_FLIGHT,
                                      "max_connections_per_host": 2 * PUSH_MAX_IN_FLIGHT}}})

    def setUp(self):
        self.gw = FakeGateway(self.ca, GATEWAY_IP)
        self.addCleanup(self.gw.close)
        if self._testMethodName in self.OWN_SERVER:
            self.srv = self.start_server(settings=self.settings())
        else:
            self.srv = self.start_class_server(settings=self.settings())
        suffix = uuid.uuid4().hex[:8]
        self.ann = Client(self.srv, register(self.srv, f"ann{suffix}"))
        self.bob = Client(self.srv, register(self.srv, f"bob{suffix}"))
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

    def set_pusher(self, client, pushkey, gateway=None, **data):
        body = {"pushkey": pushkey, "kind": "http", "app_id": "org.example.app",
                "app_display_name": "Example", "device_display_name": "Phone", "lang": "en",
                "append": True, "data": dict({"url": (gateway or self.gw).url}, **data)}
        client.ok("POST", f"{V3}/pushers/set", body)

    def pushers(self, client):
        return client.ok("GET", f"{V3}/pushers")["pushers"]


class PushGatewayTest(PushCase):
    OWN_SERVER = ("test_a_pending_push_survives_a_restart",
                  "test_at_most_16_pushers_are_in_flight_and_the_rest_wait_losing_nothing")

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

    def test_a_switched_off_pusher_is_pushed_nothing_until_switched_on(self):
        # MSC3881: the switch keeps the pusher (listed as off) and stops its pushes; what
        # notified while it was off is not pushed when it comes back on.
        self.gw.hold()  # the first push waits at the gateway, a second one queues behind it
        self.set_pusher(self.bob, "bob-key")
        self.ann.send(self.room, {"msgtype": "m.text", "body": "one"})
        self.assertEqual(len(self.gw.wait_for(1)), 1)
        self.ann.send(self.room, {"msgtype": "m.text", "body": "queued, then dropped"})
        self.wait_notifications(self.bob, 3)  # the invite, one, the queued one
        body = {"pushkey": "bob-key", "kind": "http", "app_id": "org.example.app",
                "app_display_name": "Example", "device_display_name": "Phone", "lang": "en",
                "append": True, "data": {"url": self.gw.url},
                "org.matrix.msc3881.enabled": False}
        self.bob.ok("POST", f"{V3}/pushers/set", body)
        self.gw.release()
        self.ann.send(self.room, {"msgtype": "m.text", "body": "while off"})
        self.wait_notifications(self.bob, 4)
        time.sleep(1.5)
        self.assertEqual([n["notification"]["content"]["body"] for n in self.gw.notified], ["one"])
        [p] = self.pushers(self.bob)
        self.assertIs(p["org.matrix.msc3881.enabled"], False)
        self.set_pusher(self.bob, "bob-key")  # on again
        event_id = self.ann.send(self.room, {"msgtype": "m.text", "body": "on again"})
        got = self.gw.wait_for(2)
        self.assertEqual([n["notification"].get("event_id") for n in got[1:]], [event_id])
        time.sleep(1.0)
        self.assertEqual(len(self.gw.notified), 2)

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

    def test_an_http_gateway_is_delivered_to_and_a_blacklisted_one_is_never_reached(self):
        plain = FakeGateway(None, HTTP_GATEWAY_IP)
        self.addCleanup(plain.close)
        blocked = FakeGateway(None, BLOCKED_GATEWAY_IP)
        self.addCleanup(blocked.close)
        self.assertTrue(plain.url.startswith("http://"))
        self.set_pusher(self.bob, "plain-key", gateway=plain)
        self.set_pusher(self.bob, "blocked-key", gateway=blocked)
        event_id = self.ann.send(self.room, {"msgtype": "m.text", "body": "in the clear"})
        got = plain.wait_for(1)
        self.assertEqual([b["notification"]["event_id"] for b in got], [event_id])
        self.assertEqual(got[0]["notification"]["devices"][0]["pushkey"], "plain-key")
        self.assertEqual(got[0]["notification"]["content"]["body"], "in the clear")
        wait_until(lambda: f"connecting to {BLOCKED_GATEWAY_IP} was refused"
                   in self.srv.log_text(), what="the blacklisted gateway refused at connect")
        self.assertEqual(blocked.requests, [])
        self.assertEqual(len(plain.notified), 1)

    def test_at_most_16_pushers_are_in_flight_and_the_rest_wait_losing_nothing(self):
        """The sender's flights held full by a gateway that does not answer: 16 requests
        reach it, the metric shows 16, the other pushers wait; once it answers every
        pusher gets the notification once."""
        keys = [f"key-{i:02d}" for i in range(PUSH_MAX_IN_FLIGHT + 4)]
        for key in keys:
            self.set_pusher(self.bob, key)
        self.assertEqual(self.srv.metric("atrium_push_in_flight_limit"), PUSH_MAX_IN_FLIGHT)
        self.gw.hold()
        self.addCleanup(self.gw.release)
        event_id = self.ann.send(self.room, {"msgtype": "m.text", "body": "to every phone"})
        wait_until(lambda: self.gw.waiting == PUSH_MAX_IN_FLIGHT,
                   what=f"{PUSH_MAX_IN_FLIGHT} requests waiting at the gateway")
        self.assertEqual(self.srv.metric("atrium_push_in_flight"), PUSH_MAX_IN_FLIGHT)
        time.sleep(1.5)  # past a poll: still no more than the bound
        self.assertEqual(self.gw.waiting, PUSH_MAX_IN_FLIGHT)
        self.assertEqual(len(self.gw.notified), PUSH_MAX_IN_FLIGHT)
        self.assertEqual(self.srv.metric("atrium_push_in_flight"), PUSH_MAX_IN_FLIGHT)
        # The client API is served meanwhile.
        self.assertEqual(len(self.pushers(self.bob)), len(keys))
        self.gw.release()
        got = self.gw.wait_for(len(keys))
        pushed = sorted(b["notification"]["devices"][0]["pushkey"] for b in got)
        self.assertEqual(pushed, keys)
        self.assertTrue(all(b["notification"]["event_id"] == event_id for b in got))
        wait_until(lambda: self.srv.metric("atrium_push_in_flight") == 0,
                   what="no request in flight")
        time.sleep(1.5)
        self.assertEqual(len(self.gw.notified), len(keys))  # each once


class PushPruneTest(PushCase):
    """A user's notifications are pruned to push.notifications_per_user_max (KEEP here),
    newest kept, counted by a metric; GET /notifications pages over what is kept."""

    KEEP = 5

    def settings(self):
        return harness.deep_merge(super().settings(),
                                  {"push": {"notifications_per_user_max": self.KEEP}})

    def test_the_table_stays_bounded_newest_kept_and_paging_still_works(self):
        sent = [self.ann.send(self.room, {"msgtype": "m.text", "body": f"m{i}"})
                for i in range(12)]
        wait_until(lambda: self.notifications(self.bob, limit=1)["notifications"]
                   and self.notifications(self.bob, limit=1)["notifications"][0]["event"]
                   ["event_id"] == sent[-1], what="the last message decided")
        got = self.notifications(self.bob, limit=50)
        self.assertEqual([g["event"]["event_id"] for g in got["notifications"]],
                         sent[::-1][:self.KEEP])
        self.assertNotIn("next_token", got)
        # 13 notified bob (the invite and 12 messages): all but the newest KEEP are gone,
        # from the table itself, and the count kept beside it agrees.
        self.assertEqual(self.srv.metric("atrium_push_notifications_pruned_total"),
                         13 - self.KEEP)
        self.assertEqual(harness.psql(
            "SELECT (SELECT count(*) FROM push_notifications WHERE user_id = u),"
            " (SELECT n FROM push_notification_counts WHERE user_id = u)"
            f" FROM (SELECT '{self.bob.user_id}'::text AS u) x", database=self.srv.database),
            [[str(self.KEEP), str(self.KEEP)]])
        # Paging walks the kept ones.
        walked, token = [], None
        while True:
            params = {"limit": 2}
            if token:
                params["from"] = token
            page = self.notifications(self.bob, **params)
            walked += [g["event"]["event_id"] for g in page["notifications"]]
            token = page.get("next_token")
            if not token:
                break
        self.assertEqual(walked, sent[::-1][:self.KEEP])
        # A pusher's unread count counts only what is kept.
        self.set_pusher(self.bob, "bob-key")
        self.ann.send(self.room, {"msgtype": "m.text", "body": "one more"})
        [body] = self.gw.wait_for(1)
        self.assertEqual(body["notification"]["counts"], {"unread": self.KEEP})


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
        # The holder has decided the invite (it notified bob) before the pusher is set, so
        # the gateway sees only what is sent below.
        wait_until(lambda: bob.ok("GET", f"{V3}/notifications")["notifications"],
                   what="the invite decided")
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


if __name__ == "__main__":
    unittest.main()
