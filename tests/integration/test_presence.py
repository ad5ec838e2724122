"""Presence: PUT and GET /presence/{userId}/status, a sync marking its user online
(set_presence), presence in /sync for those who share a room (and a parked sync woken by a
contact's change), and presence.enabled: false storing and showing nothing."""

import subprocess
import time

from accounts import REGISTRATION_ON, register
from common import Background
from harness import AtriumTestCase, atrium_bin
from rooms_client import V3, Client, quote

PRESENCE_ON = {**REGISTRATION_ON, "presence": {"enabled": True}}


def status_path(user_id):
    return f"{V3}/presence/{quote(user_id)}/status"


def presence_events(answer):
    return {e["sender"]: e["content"] for e in answer["presence"]["events"]}


class PresenceTest(AtriumTestCase):
    def setUp(self):
        self.srv = self.start_server(settings=PRESENCE_ON)
        self.alice = Client(self.srv, register(self.srv, "alice"))
        self.bob = Client(self.srv, register(self.srv, "bob"))
        self.carol = Client(self.srv, register(self.srv, "carol"))
        self.room = self.alice.create_room(preset="public_chat")
        self.bob.join(self.room)

    def test_put_then_get_status_for_oneself_and_room_mates(self):
        self.assertEqual(self.alice.ok("PUT", status_path(self.alice.user_id),
                                       {"presence": "unavailable", "status_msg": "lunch"}), {})
        for who in (self.alice, self.bob):
            got = who.ok("GET", status_path(self.alice.user_id))
            self.assertEqual((got["presence"], got["status_msg"]), ("unavailable", "lunch"))
            self.assertLess(got["last_active_ago"], 60_000)
            self.assertFalse(got["currently_active"])
        status, body = self.carol.call("GET", status_path(self.alice.user_id))
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"), "no shared room")
        status, body = self.bob.call("PUT", status_path(self.alice.user_id), {"presence": "online"})
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"))
        for bad in ({}, {"presence": "asleep"}, {"presence": 1}):
            status, body = self.alice.call("PUT", status_path(self.alice.user_id), bad)
            self.assertEqual(status, 400, bad)
        status, body = self.alice.call("GET", status_path("@nobody:localhost"))
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"))
        # Never set: offline.
        self.assertEqual(self.alice.ok("GET", status_path(self.bob.user_id))["presence"], "offline")

    def test_a_sync_marks_its_user_online_unless_told_otherwise(self):
        self.bob.ok("GET", f"{V3}/sync?set_presence=offline&timeout=0")
        self.assertEqual(self.alice.ok("GET", status_path(self.bob.user_id))["presence"], "offline")
        self.bob.ok("GET", f"{V3}/sync?timeout=0")
        got = self.alice.ok("GET", status_path(self.bob.user_id))
        self.assertEqual((got["presence"], got["currently_active"]), ("online", True))
        self.bob.ok("GET", f"{V3}/sync?set_presence=unavailable&timeout=0")
        self.assertEqual(self.alice.ok("GET", status_path(self.bob.user_id))["presence"], "unavailable")
        status, body = self.bob.call("GET", f"{V3}/sync?set_presence=dancing")
        self.assertEqual((status, body["errcode"]), (400, "M_INVALID_PARAM"))

    def test_sync_carries_room_mates_presence_and_a_change_wakes_a_parked_sync(self):
        self.alice.ok("PUT", status_path(self.alice.user_id), {"presence": "online", "status_msg": "hi"})
        self.carol.ok("PUT", status_path(self.carol.user_id), {"presence": "online"})
        first = self.bob.ok("GET", f"{V3}/sync?set_presence=offline")
        seen = presence_events(first)
        self.assertEqual(seen[self.alice.user_id]["presence"], "online")
        self.assertEqual(seen[self.alice.user_id]["status_msg"], "hi")
        self.assertNotIn(self.carol.user_id, seen, "carol shares no room with bob")
        since = first["next_batch"]
        waiting = Background(self.bob.ok, "GET",
                             f"{V3}/sync?set_presence=offline&timeout=20000&since={since}", None, 30)
        time.sleep(0.5)
        started = time.monotonic()
        self.alice.ok("PUT", status_path(self.alice.user_id), {"presence": "unavailable"})
        answer = waiting.result(timeout=30)
        self.assertLess(time.monotonic() - started, 10, "the change woke the parked sync")
        self.assertEqual(presence_events(answer)[self.alice.user_id]["presence"], "unavailable")
        # Nothing changed since: the next incremental sync carries no presence.
        again = self.bob.ok("GET", f"{V3}/sync?set_presence=offline&timeout=0&since={answer['next_batch']}")
        self.assertEqual(again["presence"]["events"], [])


class PresenceOffTest(AtriumTestCase):
    def test_with_presence_off_nothing_is_stored_or_shown(self):
        srv = self.start_server(settings={**REGISTRATION_ON, "presence": {"enabled": False}})
        alice = Client(srv, register(srv, "alice"))
        bob = Client(srv, register(srv, "bob"))
        room = alice.create_room(preset="public_chat")
        bob.join(room)
        self.assertEqual(alice.ok("PUT", status_path(alice.user_id), {"presence": "online"}), {})
        self.assertEqual(bob.ok("GET", status_path(alice.user_id)), {"presence": "offline"})
        alice.ok("GET", f"{V3}/sync?timeout=0")
        self.assertEqual(bob.ok("GET", f"{V3}/sync")["presence"]["events"], [])

    def test_presence_is_on_by_default(self):
        # The harness turns it off for other tests; the server's own default is on.
        table = subprocess.run([atrium_bin(), "--print-config-table"], capture_output=True,
                               text=True, timeout=60, check=True).stdout
        row = [line for line in table.splitlines() if line.startswith("| `presence.enabled`")]
        self.assertEqual(len(row), 1, table[-500:])
        self.assertIn("| `true` |", row[0])
