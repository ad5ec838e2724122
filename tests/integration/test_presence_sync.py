"""Presence where clients look for it (issue 25, item 2): a user's own presence in /sync
and in the legacy /initialSync, also with no room shared with anyone; the presence of the
members of a room the user just joined, and the newcomer's presence for those members, in
the incremental sync that carries the join, however old the last change was (also through
matrix-nio's own AsyncClient.sync); a room initialSync carrying its joined members'
presence only; set_presence through nio changing what others read.

One server for the class (start_class_server); each test has users of its own, inserted
into the accounts tables (rooms_client.crowd) rather than registered."""

import asyncio
import sys

from accounts import REGISTRATION_ON
from harness import AtriumTestCase
from rooms_client import V3, Client, crowd, quote

PRESENCE_ON = {**REGISTRATION_ON, "presence": {"enabled": True}}


def status_path(user_id):
    return f"{V3}/presence/{quote(user_id)}/status"


def presence_of(answer):
    return {e["sender"]: e["content"] for e in answer["presence"]["events"]}


def import_nio():
    try:
        import nio
    except ImportError:
        sys.path.append("/usr/lib/python3/dist-packages")
        import nio
    return nio


class PresenceSyncTest(AtriumTestCase):
    def setUp(self):
        self.srv = self.start_class_server(settings=PRESENCE_ON)

    def users(self, *names):
        """Accounts of this test's own (inserted, not registered: no Argon2 hash each)."""
        tag = self._testMethodName[5:17].replace("_", "")
        return [Client(self.srv, m) for m in crowd(self.srv, len(names), prefix=f"{names[0]}{tag}")]

    def test_own_presence_in_sync_and_initial_sync_without_any_room(self):
        (solo,) = self.users("solo")
        solo.ok("PUT", status_path(solo.user_id), {"presence": "unavailable", "status_msg": "away"})
        got = presence_of(solo.ok("GET", f"{V3}/sync?set_presence=offline"))
        self.assertEqual((got[solo.user_id]["presence"], got[solo.user_id]["status_msg"]),
                         ("unavailable", "away"))
        # A sync without set_presence marks its user online, and says so in that very sync.
        first = solo.ok("GET", f"{V3}/sync?set_presence=offline")
        later = solo.ok("GET", f"{V3}/sync?since={first['next_batch']}&timeout=0")
        self.assertEqual(presence_of(later)[solo.user_id]["presence"], "online")
        legacy = solo.ok("GET", f"{V3}/initialSync?limit=1")
        (own,) = [e for e in legacy["presence"] if e["sender"] == solo.user_id]
        self.assertEqual((own["type"], own["content"]["user_id"], own["content"]["presence"]),
                         ("m.presence", solo.user_id, "online"))

    def test_a_join_brings_both_sides_presence_in_the_sync_that_carries_it(self):
        host, guest, other = self.users("host", "guest", "other")
        room = host.create_room(preset="public_chat")
        other.join(room)
        host.ok("PUT", status_path(host.user_id), {"presence": "online", "status_msg": "hosting"})
        other.ok("PUT", status_path(other.user_id), {"presence": "unavailable"})
        guest.ok("PUT", status_path(guest.user_id), {"presence": "online", "status_msg": "new"})
        # Both sides sync before the join: every change above is older than their `since`.
        g0 = guest.ok("GET", f"{V3}/sync?set_presence=offline")["next_batch"]
        h0 = host.ok("GET", f"{V3}/sync?set_presence=offline")["next_batch"]
        guest.join(room)
        g1 = guest.ok("GET", f"{V3}/sync?set_presence=offline&since={g0}&timeout=0")
        self.assertIn(room, g1["rooms"]["join"])
        seen = presence_of(g1)
        self.assertEqual(seen[host.user_id].get("status_msg"), "hosting")
        self.assertEqual(seen[other.user_id]["presence"], "unavailable")
        h1 = host.ok("GET", f"{V3}/sync?set_presence=offline&since={h0}&timeout=0")
        self.assertEqual(presence_of(h1)[guest.user_id].get("status_msg"), "new")
        # Once: the next sync with nothing new carries none of them again.
        h2 = host.ok("GET", f"{V3}/sync?set_presence=offline&since={h1['next_batch']}&timeout=0")
        self.assertNotIn(guest.user_id, presence_of(h2))
        # Someone who shares no room with the newcomer is not told.
        (stranger,) = self.users("stranger")
        s0 = stranger.ok("GET", f"{V3}/sync?set_presence=offline")["next_batch"]
        (late,) = self.users("late")  # prefixes differ: names do not collide
        late.ok("PUT", status_path(late.user_id), {"presence": "online"})
        late.join(room)
        s1 = stranger.ok("GET", f"{V3}/sync?set_presence=offline&since={s0}&timeout=0")
        self.assertNotIn(late.user_id, presence_of(s1))

    def test_room_initial_sync_carries_its_members_presence_only(self):
        amy, ben, cat = self.users("amy", "ben", "cat")
        room = amy.create_room(preset="public_chat")
        ben.join(room)
        elsewhere = amy.create_room(preset="public_chat")
        cat.join(elsewhere)  # amy sees cat's presence, but cat is not in `room`
        ben.ok("PUT", status_path(ben.user_id), {"presence": "online", "status_msg": "here"})
        cat.ok("PUT", status_path(cat.user_id), {"presence": "online"})
        got = amy.ok("GET", f"{V3}/rooms/{quote(room)}/initialSync")
        by_user = {e["content"]["user_id"]: e["content"] for e in got["presence"]}
        self.assertEqual(by_user[ben.user_id]["status_msg"], "here")
        self.assertNotIn(cat.user_id, by_user)
        self.assertTrue({e["type"] for e in got["presence"]} <= {"m.presence"})
        # The global initialSync carries both.
        senders = {e["sender"] for e in amy.ok("GET", f"{V3}/initialSync?limit=0")["presence"]}
        self.assertTrue({ben.user_id, cat.user_id} <= senders)

    def test_matrix_nio_sees_the_members_it_joins_and_sets_its_presence(self):
        nio = import_nio()
        host, newcomer = self.users("nhost", "newcomer")
        room = host.create_room(preset="public_chat")
        host.ok("PUT", status_path(host.user_id), {"presence": "online", "status_msg": "nio"})

        async def flow():
            client = nio.AsyncClient(f"http://127.0.0.1:{self.srv.port}", newcomer.user_id)
            client.access_token, client.device_id = newcomer.token, newcomer.device_id
            client.user_id = newcomer.user_id
            try:
                first = await client.sync(timeout=0, set_presence="unavailable")
                self.assertIsInstance(first, nio.SyncResponse, first)
                joined = await client.join(room)
                self.assertIsInstance(joined, nio.JoinResponse, joined)
                resp = await client.sync(timeout=5000, since=first.next_batch,
                                         set_presence="unavailable")
                self.assertIsInstance(resp, nio.SyncResponse, resp)
                return {e.user_id: e for e in resp.presence_events}
            finally:
                await client.close()

        seen = asyncio.run(asyncio.wait_for(flow(), timeout=60))
        self.assertEqual((seen[host.user_id].presence, seen[host.user_id].status_msg),
                         ("online", "nio"))
        # nio's set_presence is what others read.
        self.assertEqual(host.ok("GET", status_path(newcomer.user_id))["presence"], "unavailable")
