"""A profile change reaches the user's rooms: after PUT /profile/{userId}/displayname or
/avatar_url, every room the user is joined to gets a new m.room.member state event with the
new values (rooms where the user is only invited get none), a value set again writes
nothing, an empty value removes the key, and a room that refuses the update does not fail
the profile change.
"""

import re
import subprocess
import unittest

from common import Background, wait_until
from harness import conninfo_for, psql_bin
from rooms_client import SharedServerTest, V3, quote

MEMBER = "m.room.member"
LONG_NAME = "N" * 200          # well within the profile's 256 bytes
EVENT_LIMIT_BYTES = 65536      # the spec's limit on a whole event
PROBE_PAD_BYTES = 65400        # a body under the limit whose event is over it
PAD_MARGIN_BYTES = 100         # how far under the limit the padded member event stays
BULK_QUEUE = 32                # ROOMS_BULK_QUEUE in core/client/rooms/crooms_module.c (one thread)
BULK = {"pool": "core.rooms_bulk"}


class ProfileRoomsTest(SharedServerTest):
    USERS = ("alice", "bob", "carol")

    # -- helpers ----------------------------------------------------------------------

    def set_profile(self, who, field, value):
        self.assertEqual(who.call("PUT", self.profile_path(who, field), {field: value}), (200, {}))

    def profile_path(self, who, field):
        return f"{V3}/profile/{quote(who.user_id)}/{field}"

    def shared_rooms(self):
        """Two rooms alice and bob are joined to, and one where alice is only invited."""
        joined = []
        for name in ("One", "Two"):
            room = self.alice.create_room(preset="public_chat", name=name)
            self.bob.join(room)
            joined.append(room)
        invited = self.bob.create_room(preset="private_chat", name="Invite only")
        self.assertEqual(self.bob.member_action(invited, "invite", self.alice.user_id)[0], 200)
        return joined, invited

    def member_event_ids(self, viewer, room, user):
        """IDs of every m.room.member event about user in room, oldest first."""
        chunk = viewer.messages(room, dir="b", limit="1000")["chunk"]
        return [e["event_id"] for e in reversed(chunk)
                if e["type"] == MEMBER and e["state_key"] == user]

    def synced_member_events(self, answer, room, user):
        timeline = answer["rooms"]["join"].get(room, {}).get("timeline", {}).get("events", [])
        return [e for e in timeline if e["type"] == MEMBER and e.get("state_key") == user]

    def joined_member(self, viewer, room, user):
        return viewer.ok("GET", f"{V3}/rooms/{quote(room)}/joined_members")["joined"][user]

    # -- tests ------------------------------------------------------------------------

    def test_a_new_displayname_reaches_every_joined_room_and_no_invited_one(self):
        joined, invited = self.shared_rooms()
        invite_before = self.member_event_ids(self.bob, invited, self.alice.user_id)
        since = self.bob.sync()["next_batch"]

        self.set_profile(self.alice, "displayname", "Alice Liddell")

        answer = self.bob.sync(since=since)
        for room in joined:
            events = self.synced_member_events(answer, room, self.alice.user_id)
            self.assertEqual(len(events), 1, events)
            self.assertEqual(events[0]["content"]["membership"], "join")
            self.assertEqual(events[0]["content"]["displayname"], "Alice Liddell")
            self.assertNotEqual(events[0]["unsigned"]["prev_content"].get("displayname"),
                                "Alice Liddell")
            state = self.bob.state(room, MEMBER, self.alice.user_id)
            self.assertEqual((state["membership"], state["displayname"]),
                             ("join", "Alice Liddell"))
            member = self.joined_member(self.bob, room, self.alice.user_id)
            self.assertEqual(member["display_name"], "Alice Liddell")
        alice = self.alice.user_id
        self.assertEqual(self.synced_member_events(answer, invited, alice), [])
        self.assertEqual(self.member_event_ids(self.bob, invited, alice), invite_before)
        self.assertEqual(self.bob.state(invited, MEMBER, alice)["membership"], "invite")

    def test_a_new_avatar_keeps_the_displayname_and_an_empty_one_removes_the_key(self):
        joined, _ = self.shared_rooms()
        self.set_profile(self.alice, "displayname", "Alice A.")
        since = self.bob.sync()["next_batch"]

        self.set_profile(self.alice, "avatar_url", "mxc://localhost/rabbit")

        answer = self.bob.sync(since=since)
        for room in joined:
            events = self.synced_member_events(answer, room, self.alice.user_id)
            self.assertEqual([e["content"] for e in events],
                             [{"membership": "join", "displayname": "Alice A.",
                               "avatar_url": "mxc://localhost/rabbit"}])
            self.assertEqual(self.joined_member(self.bob, room, self.alice.user_id),
                             {"display_name": "Alice A.", "avatar_url": "mxc://localhost/rabbit"})

        self.set_profile(self.alice, "avatar_url", "")

        for room in joined:
            self.assertEqual(self.bob.state(room, MEMBER, self.alice.user_id),
                             {"membership": "join", "displayname": "Alice A."})
            self.assertEqual(self.joined_member(self.bob, room, self.alice.user_id),
                             {"display_name": "Alice A.", "avatar_url": None})
        status, body = self.alice.call("GET", self.profile_path(self.alice, "avatar_url"))
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"))

    def test_an_empty_displayname_removes_it_from_the_member_event(self):
        joined, _ = self.shared_rooms()
        self.set_profile(self.alice, "displayname", "Temporary")
        since = self.bob.sync()["next_batch"]

        self.set_profile(self.alice, "displayname", "")

        answer = self.bob.sync(since=since)
        for room in joined:
            events = self.synced_member_events(answer, room, self.alice.user_id)
            self.assertEqual(len(events), 1, events)
            self.assertNotIn("displayname", events[0]["content"])
            self.assertEqual(events[0]["content"]["membership"], "join")
            self.assertNotIn("displayname", self.bob.state(room, MEMBER, self.alice.user_id))
            member = self.joined_member(self.bob, room, self.alice.user_id)
            self.assertIsNone(member["display_name"])  # the key stays, null
        status, body = self.alice.call("GET", self.profile_path(self.alice, "displayname"))
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"))
        self.set_profile(self.alice, "displayname", "alice")  # back to the registration's name

    def test_setting_the_same_value_again_writes_no_event(self):
        joined, _ = self.shared_rooms()
        self.set_profile(self.alice, "displayname", "Twice")
        alice = self.alice.user_id
        before = {room: self.member_event_ids(self.bob, room, alice) for room in joined}
        since = self.bob.sync()["next_batch"]

        self.set_profile(self.alice, "displayname", "Twice")

        answer = self.bob.sync(since=since)
        for room in joined:
            self.assertEqual(self.synced_member_events(answer, room, alice), [])
            self.assertEqual(self.member_event_ids(self.bob, room, alice), before[room])

    def test_a_refused_profile_change_writes_no_member_event(self):
        joined, _ = self.shared_rooms()
        alice = self.alice.user_id
        before = {room: self.member_event_ids(self.bob, room, alice) for room in joined}
        status, body = self.alice.call("PUT", self.profile_path(self.alice, "avatar_url"),
                                       {"avatar_url": "https://example.org/a.png"})
        self.assertEqual((status, body["errcode"]), (400, "M_INVALID_PARAM"))
        status, body = self.alice.call("PUT", self.profile_path(self.alice, "displayname"),
                                       {"displayname": None})
        self.assertEqual((status, body["errcode"]), (400, "M_BAD_JSON"))
        for room in joined:
            self.assertEqual(self.member_event_ids(self.bob, room, alice), before[room])

    def test_a_room_that_refuses_the_update_fails_neither_the_change_nor_the_other_rooms(self):
        fine = self.carol.create_room(preset="public_chat", name="Fine")
        full = self.carol.create_room(preset="public_chat", name="Full")
        # Carol's member event in `full` is padded to just under the event size limit, so
        # the longer display name would push it over: that room must refuse the update.
        path = f"{V3}/rooms/{quote(full)}/state/{MEMBER}/{quote(self.carol.user_id)}"
        probe = {"membership": "join", "displayname": "carol", "pad": "x" * PROBE_PAD_BYTES}
        status, body = self.carol.call("PUT", path, probe)
        self.assertEqual((status, body.get("errcode")), (413, "M_TOO_LARGE"), body)
        size = int(re.search(r"The event is (\d+) bytes", body["error"]).group(1))
        pad = PROBE_PAD_BYTES - (size - EVENT_LIMIT_BYTES) - PAD_MARGIN_BYTES
        padded = {**probe, "pad": "x" * pad}
        padded_id = self.carol.put_state(full, MEMBER, padded, state_key=self.carol.user_id)

        self.set_profile(self.carol, "displayname", LONG_NAME)

        self.assertEqual(self.carol.state(fine, MEMBER, self.carol.user_id),
                         {"membership": "join", "displayname": LONG_NAME})
        self.assertEqual(self.carol.state(full, MEMBER, self.carol.user_id), padded)
        self.assertEqual(self.member_event_ids(self.carol, full, self.carol.user_id)[-1],
                         padded_id)
        self.assertEqual(self.carol.ok("GET", self.profile_path(self.carol, "displayname")),
                         {"displayname": LONG_NAME})
        self.assertIn(f"room {full} keeps the old member event", self.srv.log_text())
        self.carol.leave(full)  # later profile changes of carol need not meet this room again


    def test_changes_run_on_the_bulk_pool_whose_full_queue_refuses_at_once(self):
        """The bulk pool held full: one change stuck on a row lock, BULK_QUEUE waiting; the
        next is refused with 429 while the request pool keeps serving."""
        holder = subprocess.Popen(  # a session of its own, holding carol's profile row
            [psql_bin(), "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1",
             "-d", conninfo_for(self.srv.database)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        waiting = []
        try:
            holder.stdin.write(f"BEGIN;\nSELECT 'locked' FROM profiles WHERE user_id = "
                               f"'{self.carol.user_id}' FOR UPDATE;\n")
            holder.stdin.flush()
            self.assertEqual(holder.stdout.readline().strip(), "locked")
            path = self.profile_path(self.carol, "displayname")
            waiting = [Background(self.carol.call, "PUT", path, {"displayname": f"Carol {i}"},
                                  timeout=60) for i in range(BULK_QUEUE + 1)]
            wait_until(lambda: self.srv.metric("atrium_pool_busy", BULK) == 1
                       and self.srv.metric("atrium_pool_queued", BULK) == BULK_QUEUE,
                       what="one change running and the queue full")
            refused = self.srv.metric("atrium_pool_refused_total", BULK)
            status, body = self.carol.call("PUT", path, {"displayname": "one too many"})
            self.assertEqual((status, body["errcode"]), (429, "M_LIMIT_EXCEEDED"), body)
            self.assertGreater(body["retry_after_ms"], 0)
            self.assertEqual(self.srv.metric("atrium_pool_refused_total", BULK), refused + 1)
            self.assertEqual(self.srv.json("GET", "/_matrix/client/versions")[0], 200)
        finally:
            holder.communicate("ROLLBACK;\n", timeout=30)
        self.assertEqual([w.result(60) for w in waiting], [(200, {})] * (BULK_QUEUE + 1))
        wait_until(lambda: self.srv.metric("atrium_pool_queued", BULK) == 0, what="queue empty")


if __name__ == "__main__":
    unittest.main()
