"""/sync: initial and incremental windows, limited timelines and prev_batch, invites and
leaves, filters (inline and stored, lazy loading), account data, ephemeral events,
transaction IDs, bad parameters, and the long-poll that parks: 200 clients wait with no
thread each, and one message wakes exactly the members of its room.
"""

import json
import select
import socket
import time
import unittest
import urllib.parse

from accounts import REGISTRATION_ON, register
from common import thread_count, wait_until
from harness import Server
from rooms_client import SharedServerTest, V3, Client, crowd, quote, timeline_bodies

CROWD = 200
CROWD_IN_ROOM = 50
LONG_POLL_MS = 30000


def raw_sync(port, token, since, timeout_ms):
    """A /sync long-poll sent on a raw socket (Connection: close), left unread."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    query = urllib.parse.urlencode({"since": since, "timeout": str(timeout_ms)})
    sock.sendall((f"GET {V3}/sync?{query} HTTP/1.1\r\nHost: localhost\r\n"
                  f"Authorization: Bearer {token}\r\nConnection: close\r\n\r\n").encode())
    return sock


def read_response(sock):
    """(status, parsed JSON body) of a Connection: close response."""
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head.lower():
        out, rest = b"", body
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line, 16)
            if size == 0:
                break
            out, rest = out + rest[:size], rest[size + 2:]
        body = out
    return status, json.loads(body)


class SyncTest(SharedServerTest):
    USERS = ("alice", "bob", "carol")

    def test_initial_then_incremental_sync_report_each_event_once(self):
        room = self.alice.create_room(preset="public_chat", name="Sync")
        self.bob.join(room)
        first = self.bob.sync()
        self.assertRegex(first["next_batch"], r"^s\d+$")
        joined = first["rooms"]["join"][room]
        self.assertEqual(joined["summary"]["m.joined_member_count"], 2)
        self.assertIn("unread_notifications", joined)
        for key in ("account_data", "presence", "to_device", "device_lists", "device_one_time_keys_count"):
            self.assertIn(key, first)
        seen_types = {e["type"] for e in joined["state"]["events"] + joined["timeline"]["events"]}
        self.assertTrue({"m.room.create", "m.room.power_levels", "m.room.name", "m.room.member"} <= seen_types)
        for e in joined["timeline"]["events"]:
            self.assertNotIn("room_id", e)
            self.assertIn("age", e["unsigned"])
        self.alice.send(room, {"msgtype": "m.text", "body": "one"})
        self.alice.send(room, {"msgtype": "m.text", "body": "two"})
        second = self.bob.sync(since=first["next_batch"])
        self.assertEqual(timeline_bodies(second, room), ["one", "two"])
        self.assertFalse(second["rooms"]["join"][room]["timeline"]["limited"])
        self.assertEqual(second["rooms"]["join"][room]["state"]["events"], [])
        self.assertGreater(int(second["next_batch"][1:]), int(first["next_batch"][1:]))
        third = self.bob.sync(since=second["next_batch"])
        self.assertNotIn(room, third["rooms"]["join"])  # nothing new in it
        self.assertEqual(third["next_batch"], second["next_batch"])

    def test_limited_timeline_gives_state_changes_and_a_prev_batch_that_fills_the_gap(self):
        room = self.alice.create_room(preset="public_chat")
        self.bob.join(room)
        since = self.bob.sync()["next_batch"]
        self.alice.put_state(room, "m.room.topic", {"topic": "early"})
        for i in range(8):
            self.alice.send(room, {"msgtype": "m.text", "body": f"m{i}"})
        answer = self.bob.sync(since=since, filter={"room": {"timeline": {"limit": 3}}})
        joined = answer["rooms"]["join"][room]
        self.assertTrue(joined["timeline"]["limited"])
        self.assertEqual(timeline_bodies(answer, room), ["m5", "m6", "m7"])
        self.assertEqual([(e["type"], e["content"]) for e in joined["state"]["events"]],
                         [("m.room.topic", {"topic": "early"})])
        gap = self.bob.messages(room, dir="b", limit="5", **{"from": joined["timeline"]["prev_batch"]})
        self.assertEqual([e["content"].get("body") for e in gap["chunk"]][:5], ["m4", "m3", "m2", "m1", "m0"])

    def test_invite_join_and_kick_move_the_room_between_sections(self):
        room = self.alice.create_room(name="Secret")
        since = self.carol.sync()["next_batch"]
        self.alice.member_action(room, "invite", self.carol.user_id)
        invited = self.carol.sync(since=since)
        stripped = invited["rooms"]["invite"][room]["invite_state"]["events"]
        self.assertIn(("m.room.name", {"name": "Secret"}), [(e["type"], e["content"]) for e in stripped])
        self.assertIn(("m.room.member", self.carol.user_id, "invite"),
                      [(e["type"], e["state_key"], e["content"].get("membership")) for e in stripped])
        for e in stripped:
            self.assertEqual(set(e), {"type", "state_key", "content", "sender"})
        self.carol.join(room)
        joined = self.carol.sync(since=invited["next_batch"])
        self.assertNotIn(room, joined["rooms"]["invite"])
        state = joined["rooms"]["join"][room]
        self.assertIn("m.room.create", [e["type"] for e in state["state"]["events"] + state["timeline"]["events"]])
        self.alice.send(room, {"msgtype": "m.text", "body": "before kick"})
        self.alice.member_action(room, "kick", self.carol.user_id)
        self.alice.send(room, {"msgtype": "m.text", "body": "after kick"})
        left = self.carol.sync(since=joined["next_batch"])
        self.assertNotIn(room, left["rooms"]["join"])
        timeline = left["rooms"]["leave"][room]["timeline"]["events"]
        self.assertEqual([e["content"].get("body") for e in timeline if e["type"] == "m.room.message"],
                         ["before kick"])
        self.assertEqual(timeline[-1]["content"]["membership"], "leave")
        later = self.carol.sync(since=left["next_batch"])
        self.assertNotIn(room, later["rooms"]["leave"])  # reported once

    def test_stored_and_inline_filters_with_lazy_loaded_members(self):
        room = self.alice.create_room(preset="public_chat")
        self.bob.join(room)
        self.carol.join(room)
        self.alice.send(room, {"msgtype": "m.text", "body": "from alice"})
        definition = {"room": {"state": {"lazy_load_members": True}, "timeline": {"limit": 1}}}
        filter_id = self.bob.ok("POST", f"{V3}/user/{quote(self.bob.user_id)}/filter", definition)["filter_id"]
        for f in (filter_id, definition):
            answer = self.bob.sync(filter=f)
            joined = answer["rooms"]["join"][room]
            self.assertEqual(timeline_bodies(answer, room), ["from alice"])
            members = sorted(e["state_key"] for e in joined["state"]["events"] if e["type"] == "m.room.member")
            self.assertEqual(members, sorted([self.alice.user_id, self.bob.user_id]))  # not carol
        full = self.bob.sync(filter={"room": {"timeline": {"limit": 1}}})["rooms"]["join"][room]
        self.assertIn(self.carol.user_id, [e["state_key"] for e in full["state"]["events"]
                                           if e["type"] == "m.room.member"])
        only = self.bob.sync(filter={"room": {"rooms": []}})
        self.assertEqual(only["rooms"]["join"], {})
        types = self.bob.sync(filter={"room": {"timeline": {"not_types": ["m.room.message"], "limit": 50}}})
        self.assertEqual(timeline_bodies(types, room), [])

    def test_account_data_receipts_typing_and_transaction_ids_reach_sync(self):
        room = self.alice.create_room(preset="public_chat")
        self.bob.join(room)
        since = self.bob.sync()["next_batch"]
        event = self.alice.send(room, {"msgtype": "m.text", "body": "hi"}, txn="sync-txn")
        self.bob.ok("PUT", f"{V3}/user/{quote(self.bob.user_id)}/account_data/org.example.g", {"a": 1})
        self.bob.ok("PUT", f"{V3}/user/{quote(self.bob.user_id)}/rooms/{quote(room)}/account_data/org.example.r",
                    {"b": 2})
        self.alice.ok("POST", f"{V3}/rooms/{quote(room)}/receipt/m.read/{quote(event)}", {})
        self.alice.ok("PUT", f"{V3}/rooms/{quote(room)}/typing/{quote(self.alice.user_id)}",
                      {"typing": True, "timeout": 30000})
        self.bob.ok("POST", f"{V3}/rooms/{quote(room)}/read_markers", {"m.fully_read": event})
        answer = self.bob.sync(since=since)
        self.assertIn({"type": "org.example.g", "content": {"a": 1}}, answer["account_data"]["events"])
        joined = answer["rooms"]["join"][room]
        room_data = {e["type"]: e["content"] for e in joined["account_data"]["events"]}
        self.assertEqual(room_data["org.example.r"], {"b": 2})
        self.assertEqual(room_data["m.fully_read"], {"event_id": event})
        ephemeral = {e["type"]: e["content"] for e in joined["ephemeral"]["events"]}
        self.assertIn(self.alice.user_id, ephemeral["m.receipt"][event]["m.read"])
        self.assertEqual(ephemeral["m.typing"], {"user_ids": [self.alice.user_id]})
        msg = [e for e in joined["timeline"]["events"] if e["event_id"] == event][0]
        self.assertNotIn("transaction_id", msg["unsigned"])  # not bob's
        mine = self.alice.sync(since=since)["rooms"]["join"][room]["timeline"]["events"]
        self.assertEqual([e["unsigned"].get("transaction_id") for e in mine if e["event_id"] == event],
                         ["sync-txn"])
        self.alice.ok("PUT", f"{V3}/rooms/{quote(room)}/typing/{quote(self.alice.user_id)}", {"typing": False})
        stopped = self.bob.sync(since=answer["next_batch"])["rooms"]["join"][room]["ephemeral"]["events"]
        self.assertIn({"type": "m.typing", "content": {"user_ids": []}}, stopped)

    def test_a_typing_notice_that_runs_out_wakes_a_parked_sync(self):
        room = self.alice.create_room(preset="public_chat")
        self.bob.join(room)
        self.alice.ok("PUT", f"{V3}/rooms/{quote(room)}/typing/{quote(self.alice.user_id)}",
                      {"typing": True, "timeout": 1000})
        typing_at = time.monotonic()
        since = self.bob.sync()["next_batch"]
        # Nothing else happens in the room: only the expiry can end this long-poll early.
        answer = self.bob.sync(since=since, timeout_ms=20000)
        woke_after = time.monotonic() - typing_at
        ephemeral = answer["rooms"]["join"][room]["ephemeral"]["events"]
        self.assertIn({"type": "m.typing", "content": {"user_ids": []}}, ephemeral)
        self.assertLess(woke_after, 10, "woken by the expiry, not by the sync's timeout")
        self.assertGreaterEqual(woke_after, 0.9, "not before the notice ran out")

    def test_bad_parameters_are_refused(self):
        for query, errcode in (("since=yesterday", "M_INVALID_PARAM"), ("timeout=-5", "M_INVALID_PARAM"),
                               ("timeout=soon", "M_INVALID_PARAM"), ("full_state=maybe", "M_INVALID_PARAM"),
                               ("filter=%7Bnope", "M_BAD_JSON"), ("filter=99999", "M_INVALID_PARAM"),
                               ("filter=abc", "M_INVALID_PARAM"),
                               ("filter=" + quote(json.dumps({"room": {"timeline": {"limit": "x"}}})),
                                "M_BAD_JSON")):
            status, body = self.bob.call("GET", f"{V3}/sync?{query}")
            self.assertEqual((status, body.get("errcode")), (400, errcode), query)
        status, body = self.srv.json("GET", f"{V3}/sync")
        self.assertEqual((status, body["errcode"]), (401, "M_MISSING_TOKEN"))

    def test_long_poll_wakes_on_a_message_and_times_out_with_nothing(self):
        room = self.alice.create_room(preset="public_chat")
        self.bob.join(room)
        since = self.bob.sync()["next_batch"]
        started = time.monotonic()
        empty = self.bob.sync(since=since, timeout_ms=700)
        waited = time.monotonic() - started
        self.assertGreaterEqual(waited, 0.6)
        self.assertEqual(empty["next_batch"], since)
        self.assertEqual(empty["rooms"]["join"], {})
        from common import Background
        poll = Background(self.bob.sync, since=since, timeout_ms=LONG_POLL_MS)
        wait_until(lambda: self.srv.metric("atrium_http_parked") == 1, what="the sync parked")
        sent_at = time.monotonic()
        self.alice.send(room, {"msgtype": "m.text", "body": "wake up"})
        answer = poll.result(timeout=10)
        self.assertLess(poll.finished_at - sent_at, 5)
        self.assertEqual(timeline_bodies(answer, room), ["wake up"])


class ParkedSyncTest(unittest.TestCase):
    def test_200_parked_syncs_hold_no_threads_and_a_message_wakes_only_its_room(self):
        with Server(settings=REGISTRATION_ON) as srv:
            alice = Client(srv, register(srv, "alice"))
            room = alice.create_room(preset="public_chat")
            people = crowd(srv, CROWD)
            members, others = people[:CROWD_IN_ROOM], people[CROWD_IN_ROOM:]
            for m in members:
                Client(srv, m).join(room)
            since = alice.sync()["next_batch"]
            threads_before = thread_count(srv.pid)
            socks = {raw_sync(srv.port, p.token, since, LONG_POLL_MS): p for p in people}
            try:
                wait_until(lambda: srv.metric("atrium_http_parked") == CROWD, timeout=30,
                           what=f"{CROWD} parked syncs")
                threads_parked = thread_count(srv.pid)
                self.assertLessEqual(threads_parked, threads_before,
                                     f"threads grew from {threads_before} to {threads_parked}")
                readable, _, _ = select.select(list(socks), [], [], 0.2)
                self.assertEqual(readable, [])  # nobody answered before the message
                alice.send(room, {"msgtype": "m.text", "body": "for members"})
                member_ids = {m.user_id for m in members}
                woken = {}
                deadline = time.monotonic() + 20
                while len(woken) < CROWD_IN_ROOM and time.monotonic() < deadline:
                    readable, _, _ = select.select([s for s in socks if s not in woken], [], [], 1)
                    for s in readable:
                        woken[s] = read_response(s)
                self.assertEqual({socks[s].user_id for s in woken}, member_ids)
                for status, body in woken.values():
                    self.assertEqual(status, 200)
                    self.assertEqual(timeline_bodies(body, room), ["for members"])
                readable, _, _ = select.select([s for s in socks if s not in woken], [], [], 1.0)
                self.assertEqual(readable, [])  # the others keep waiting
                self.assertEqual(srv.metric("atrium_http_parked"), len(others))
            finally:
                for s in socks:
                    s.close()


class SyncRateLimitTest(unittest.TestCase):
    def test_a_parked_sync_that_wakes_is_not_counted_again(self):
        settings = {**REGISTRATION_ON, "ratelimit": {
            "enabled": True, "sync": {"per_minute": 1, "burst": 3},
            "register": {"per_minute": 100, "burst": 100},
            "message": {"per_minute": 100000, "burst": 1000}}}
        with Server(settings=settings) as srv:
            alice = Client(srv, register(srv, "alice"))
            carol = Client(srv, register(srv, "carol"))
            room = alice.create_room(invite=[carol.user_id])
            since = carol.sync()["next_batch"]  # token 1 of 3
            from common import Background
            poll = Background(carol.sync, since=since, timeout_ms=3000)  # token 2 of 3
            wait_until(lambda: srv.metric("atrium_http_parked") == 1, what="the sync parked")
            # Each message wakes carol's parked sync (she is invited), which finds nothing
            # for her and parks again: ten runs of one request, more than the burst.
            for i in range(10):
                alice.send(room, {"body": f"m{i}"})
                time.sleep(0.05)
            answer = poll.result(timeout=10)
            self.assertEqual(answer["next_batch"][0], "s")
            self.assertEqual(answer["rooms"]["invite"], {})
            statuses = [carol.call("GET", f"{V3}/sync?since={since}")[0] for _ in range(2)]
            self.assertEqual(statuses, [200, 429])  # token 3, then refused


if __name__ == "__main__":
    unittest.main()
