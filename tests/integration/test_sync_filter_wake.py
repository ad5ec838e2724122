"""A sync filter shapes every section and what wakes a long-poll: with matrix-nio's filter
(presence, account_data and room.ephemeral all `not_types: ["*"]`) /sync carries no
presence, account data or typing, and a parked incremental sync is not answered early,
empty, when another member's presence changes or they type; it still answers at once for
a message. Also through matrix-nio's own long-poll (AsyncClient.sync with sync_filter).

One server for the class; each test takes its own `since`."""

import asyncio
import json
import sys
import time

from accounts import REGISTRATION_ON, register
from common import Background, wait_until
from harness import Server
from rooms_client import V3, Client, quote
import unittest

NIO_FILTER = {"presence": {"not_types": ["*"]}, "account_data": {"not_types": ["*"]},
              "room": {"ephemeral": {"not_types": ["*"]}}}
POLL_MS = 3000
EARLY_S = 2.0  # an answer before this much of POLL_MS is an early one
PROMPT_S = 1.5


def status_path(user_id):
    return f"{V3}/presence/{quote(user_id)}/status"


class SyncFilterWakeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = Server(settings={**REGISTRATION_ON, "presence": {"enabled": True}})
        cls.srv.__enter__()
        try:
            cls.alice = Client(cls.srv, register(cls.srv, "alice"))
            cls.bob = Client(cls.srv, register(cls.srv, "bob"))
            cls.room = cls.alice.create_room(preset="public_chat")
            cls.bob.join(cls.room)
        except BaseException:
            cls.srv.__exit__(None, None, None)
            raise

    @classmethod
    def tearDownClass(cls):
        cls.srv.__exit__(None, None, None)

    def parked(self):
        return self.srv.metric("atrium_http_parked") or 0

    def bob_presence(self, state):
        self.bob.ok("PUT", status_path(self.bob.user_id), {"presence": state,
                                                           "status_msg": str(time.time())})

    def long_poll(self, filter, since):
        """A parked sync of alice's, started; returns it once the server holds it."""
        before = self.parked()
        poll = Background(self.alice.sync, since=since, timeout_ms=POLL_MS, filter=filter)
        wait_until(lambda: self.parked() > before or poll.done(), what="the sync parked")
        return poll

    def test_the_filter_keeps_presence_account_data_and_typing_out(self):
        self.bob_presence("online")
        self.alice.ok("PUT", f"{V3}/user/{quote(self.alice.user_id)}/account_data/org.example.a",
                      {"x": 1})
        self.bob.ok("PUT", f"{V3}/rooms/{quote(self.room)}/typing/{quote(self.bob.user_id)}",
                    {"typing": True, "timeout": 30000})
        plain = self.alice.sync()
        self.assertIn(self.bob.user_id, [e["sender"] for e in plain["presence"]["events"]])
        self.assertIn("org.example.a", [e["type"] for e in plain["account_data"]["events"]])
        self.assertIn("m.typing", [e["type"] for e in
                                   plain["rooms"]["join"][self.room]["ephemeral"]["events"]])
        for filter in (NIO_FILTER,
                       {"presence": {"types": []}, "account_data": {"types": []},
                        "room": {"ephemeral": {"types": []}}}):
            got = self.alice.sync(filter=filter)
            self.assertEqual(got["presence"]["events"], [], filter)
            self.assertEqual(got["account_data"]["events"], [], filter)
            joined = got["rooms"]["join"][self.room]
            self.assertEqual(joined["ephemeral"]["events"], [], filter)
            self.assertTrue(joined["timeline"]["events"], "the timeline is not filtered")
        # A filter that lets one type through keeps just that.
        got = self.alice.sync(filter={"presence": {"senders": [self.bob.user_id]},
                                      "account_data": {"types": ["org.example.*"]}})
        self.assertEqual({e["sender"] for e in got["presence"]["events"]}, {self.bob.user_id})
        self.assertEqual([e["type"] for e in got["account_data"]["events"]], ["org.example.a"])
        self.bob.ok("PUT", f"{V3}/rooms/{quote(self.room)}/typing/{quote(self.bob.user_id)}",
                    {"typing": False})

    def test_filtered_out_presence_and_typing_do_not_end_a_long_poll(self):
        since = self.alice.sync(filter=NIO_FILTER)["next_batch"]
        poll = self.long_poll(NIO_FILTER, since)
        self.bob_presence("unavailable")
        self.bob.ok("PUT", f"{V3}/rooms/{quote(self.room)}/typing/{quote(self.bob.user_id)}",
                    {"typing": True, "timeout": 30000})
        self.bob_presence("online")
        got = poll.result()
        took = poll.finished_at - poll.started_at
        self.assertGreater(took, EARLY_S, f"answered after {took:.2f} s: {json.dumps(got)[:300]}")
        self.assertEqual(got["presence"]["events"], [])
        self.assertEqual(got["rooms"]["join"].get(self.room, {}).get("ephemeral", {})
                         .get("events", []), [])
        # Without the filter the same change ends the poll at once (what the test relies on).
        since = self.alice.sync()["next_batch"]
        poll = self.long_poll(None, since)
        self.bob_presence("unavailable")
        got = poll.result()
        self.assertLess(poll.finished_at - poll.started_at, EARLY_S)
        self.assertIn(self.bob.user_id, [e["sender"] for e in got["presence"]["events"]])
        self.bob.ok("PUT", f"{V3}/rooms/{quote(self.room)}/typing/{quote(self.bob.user_id)}",
                    {"typing": False})

    def test_a_message_still_ends_a_filtered_long_poll_at_once(self):
        since = self.alice.sync(filter=NIO_FILTER)["next_batch"]
        poll = self.long_poll(NIO_FILTER, since)
        self.bob_presence("unavailable")  # wakes it; it parks again
        sent_at = time.monotonic()
        self.bob.send(self.room, {"msgtype": "m.text", "body": "wake up"})
        got = poll.result()
        self.assertLess(poll.finished_at - sent_at, PROMPT_S)
        bodies = [e["content"].get("body") for e in
                  got["rooms"]["join"][self.room]["timeline"]["events"]]
        self.assertIn("wake up", bodies)
        self.assertEqual(got["presence"]["events"], [])

    def test_matrix_nio_long_poll_with_its_filter(self):
        try:
            import nio
        except ImportError:
            sys.path.append("/usr/lib/python3/dist-packages")
            import nio

        async def flow():
            client = nio.AsyncClient(f"http://127.0.0.1:{self.srv.port}", self.alice.user_id)
            client.access_token, client.device_id = self.alice.token, self.alice.device_id
            client.user_id = self.alice.user_id
            try:
                first = await client.sync(timeout=0, sync_filter=NIO_FILTER)
                self.assertIsInstance(first, nio.SyncResponse, first)
                before = self.parked()
                task = asyncio.ensure_future(client.sync(timeout=POLL_MS, sync_filter=NIO_FILTER,
                                                         since=first.next_batch))
                start = time.monotonic()
                deadline = start + 10
                while self.parked() <= before and not task.done() and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                await asyncio.get_running_loop().run_in_executor(None, self.bob_presence,
                                                                 "unavailable")
                resp = await task
                took = time.monotonic() - start
                self.assertIsInstance(resp, nio.SyncResponse, resp)
                self.assertGreater(took, EARLY_S, f"nio's long-poll answered after {took:.2f} s")
                self.assertEqual(resp.presence_events, [])
            finally:
                await client.close()

        asyncio.run(asyncio.wait_for(flow(), timeout=60))


if __name__ == "__main__":
    unittest.main()
