"""To-device messages: PUT /sendToDevice/{eventType}/{txnId} stores one message per
recipient device (idempotent per sender device and txnId, `*` for every device), /sync hands
them out in to_device.events until the device acknowledges them with a later since token,
and a parked /sync wakes when one arrives."""

import time
import unittest

from common import Background
from harness import psql
from test_e2ee_keys import E2eeServerCase, login, register, sync

SEND = "/_matrix/client/v3/sendToDevice"


class ToDeviceTest(E2eeServerCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.alice = register(cls.srv, "td_alice")
        cls.alice2 = login(cls.srv, "td_alice")
        cls.bob = register(cls.srv, "td_bob")
        cls.txn = 0

    def send(self, sender, messages, event_type="m.test", txn=None):
        if txn is None:
            ToDeviceTest.txn += 1
            txn = f"t{ToDeviceTest.txn}"
        return sender.json("PUT", f"{SEND}/{event_type}/{txn}", {"messages": messages})

    def drain(self, acc):
        """Sync until nothing is pending; returns the token after the last delivery."""
        token = sync(acc)["next_batch"]
        return sync(acc, since=token)["next_batch"]

    def pending(self, acc):
        rows = psql("SELECT count(*) FROM to_device_messages WHERE user_id = '%s' AND device_id = '%s'"
                    % (acc.user_id, acc.device_id), database=self.srv.database)
        return int(rows[0][0])

    def test_a_message_is_delivered_once_and_deleted_once_acknowledged(self):
        t0 = self.drain(self.alice)
        t0b = self.drain(self.alice2)
        status, body = self.send(self.bob, {self.alice.user_id: {self.alice.device_id: {"n": 1}}})
        self.assertEqual((status, body), (200, {}))
        first = sync(self.alice, since=t0)
        self.assertEqual(first["to_device"]["events"],
                         [{"sender": self.bob.user_id, "type": "m.test", "content": {"n": 1}}])
        self.assertEqual(self.pending(self.alice), 1)  # not acknowledged yet
        second = sync(self.alice, since=first["next_batch"])
        self.assertEqual(second["to_device"]["events"], [])
        self.assertEqual(self.pending(self.alice), 0)
        self.assertEqual(sync(self.alice2, since=t0b)["to_device"]["events"], [])

    def test_a_lost_response_is_delivered_again(self):
        t0 = self.drain(self.alice)
        self.send(self.bob, {self.alice.user_id: {self.alice.device_id: {"n": "again"}}})
        lost = sync(self.alice, since=t0)
        self.assertEqual(len(lost["to_device"]["events"]), 1)
        retry = sync(self.alice, since=t0)  # the client never saw `lost`
        self.assertEqual(retry["to_device"]["events"], lost["to_device"]["events"])
        self.assertEqual(sync(self.alice, since=retry["next_batch"])["to_device"]["events"], [])

    def test_the_wildcard_reaches_every_device_of_the_user(self):
        tokens = [self.drain(a) for a in (self.alice, self.alice2)]
        self.send(self.bob, {self.alice.user_id: {"*": {"to": "all"}}})
        for acc, token in zip((self.alice, self.alice2), tokens):
            events = sync(acc, since=token)["to_device"]["events"]
            self.assertEqual([e["content"] for e in events], [{"to": "all"}])

    def test_a_repeated_txn_id_from_the_same_device_stores_nothing_new(self):
        t0 = self.drain(self.alice)
        msg = {self.alice.user_id: {self.alice.device_id: {"once": True}}}
        self.assertEqual(self.send(self.bob, msg, txn="same")[0], 200)
        self.assertEqual(self.send(self.bob, msg, txn="same"), (200, {}))
        # Another event type, or another sending device, is another transaction.
        self.assertEqual(self.send(self.bob, msg, txn="same", event_type="m.other")[0], 200)
        self.assertEqual(self.send(self.alice2, msg, txn="same")[0], 200)
        events = sync(self.alice, since=t0)["to_device"]["events"]
        self.assertEqual([(e["sender"], e["type"]) for e in events],
                         [(self.bob.user_id, "m.test"), (self.bob.user_id, "m.other"),
                          (self.alice.user_id, "m.test")])

    def test_a_txn_id_is_forgotten_after_a_day(self):
        t0 = self.drain(self.alice)
        msg = {self.alice.user_id: {self.alice.device_id: {"day": 1}}}
        self.assertEqual(self.send(self.bob, msg, txn="daily")[0], 200)
        psql("UPDATE to_device_txns SET created_ts = created_ts - 86400001 WHERE txn_id = 'daily'",
             database=self.srv.database)
        self.assertEqual(self.send(self.bob, msg, txn="daily")[0], 200)
        self.assertEqual(len(sync(self.alice, since=t0)["to_device"]["events"]), 2)

    def test_concurrent_retries_of_one_txn_store_one_message(self):
        t0 = self.drain(self.alice)
        msg = {self.alice.user_id: {self.alice.device_id: {"race": 1}}}
        calls = [Background(self.send, self.bob, msg, "m.test", "racing") for _ in range(8)]
        self.assertEqual([c.result()[0] for c in calls], [200] * 8)
        self.assertEqual(len(sync(self.alice, since=t0)["to_device"]["events"]), 1)

    def test_unknown_users_devices_and_servers_are_dropped_without_error(self):
        status, body = self.send(self.bob, {
            "@ghost:localhost": {"DEV": {"x": 1}}, self.alice.user_id: {"NODEVICE": {"x": 1}},
            "@far:remote.example": {"DEV": {"x": 1}}})
        self.assertEqual((status, body), (200, {}))
        rows = psql("SELECT count(*) FROM to_device_messages WHERE device_id = 'NODEVICE'"
                    " OR user_id IN ('@ghost:localhost', '@far:remote.example')",
                    database=self.srv.database)
        self.assertEqual(rows[0][0], "0")

    def test_a_backlog_larger_than_one_response_drains_over_the_next_syncs(self):
        t0 = self.drain(self.alice)
        for i in range(150):
            self.assertEqual(self.send(self.bob, {self.alice.user_id: {self.alice.device_id: {"i": i}}})[0], 200)
        first = sync(self.alice, since=t0)
        self.assertEqual([e["content"]["i"] for e in first["to_device"]["events"]], list(range(100)))
        second = sync(self.alice, since=first["next_batch"])
        self.assertEqual([e["content"]["i"] for e in second["to_device"]["events"]], list(range(100, 150)))
        self.assertEqual(sync(self.alice, since=second["next_batch"])["to_device"]["events"], [])

    def test_a_parked_sync_wakes_when_a_message_arrives(self):
        t0 = self.drain(self.alice2)
        started = time.monotonic()
        waiting = Background(sync, self.alice2, t0, 20000, 30)
        time.sleep(0.5)
        self.assertFalse(waiting.done(), "the sync answered before anything was sent")
        self.send(self.bob, {self.alice2.user_id: {self.alice2.device_id: {"wake": "up"}}})
        body = waiting.result(timeout=15)
        self.assertLess(time.monotonic() - started, 10)
        self.assertEqual([e["content"] for e in body["to_device"]["events"]], [{"wake": "up"}])

    def test_bad_requests_are_refused(self):
        me = {self.alice.user_id: {self.alice.device_id: {}}}
        cases = [
            {},
            {"messages": []},
            {"messages": {self.alice.user_id: ["x"]}},
            {"messages": {self.alice.user_id: {self.alice.device_id: "text"}}},
            {"messages": {self.alice.user_id: {"D" * 256: {}}}},
            {"messages": {self.alice.user_id: {f"D{i}": {} for i in range(10001)}}},
        ]
        for i, body in enumerate(cases):
            with self.subTest(body=str(body)[:80]):
                status, answer = self.bob.json("PUT", f"{SEND}/m.test/bad{i}", body)
                self.assertEqual((status, answer["errcode"]), (400, "M_BAD_JSON"), answer)
        status, answer = self.bob.json("PUT", f"{SEND}/m.test/{'x' * 256}", {"messages": me})
        self.assertEqual((status, answer["errcode"]), (400, "M_INVALID_PARAM"))
        status, _, data = self.srv.request("PUT", f"{SEND}/m.test/badjson", b"{",
                                           token=self.bob.token)
        self.assertEqual(status, 400)
        self.assertIn(b"M_NOT_JSON", data)
        status, answer = self.srv.json("PUT", f"{SEND}/m.test/noauth", {"messages": me})
        self.assertEqual((status, answer["errcode"]), (401, "M_MISSING_TOKEN"))
        # 10000 entries is the limit, not over it (unknown devices: nothing stored).
        many = {self.alice.user_id: {f"D{i}": {} for i in range(10000)}}
        self.assertEqual(self.bob.json("PUT", f"{SEND}/m.test/many", {"messages": many})[0], 200)


if __name__ == "__main__":
    unittest.main()
