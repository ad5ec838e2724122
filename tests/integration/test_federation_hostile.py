"""A hostile federation peer (issue 27 item 4): what a malicious or broken server sends,
each request correctly signed by a key the peer publishes, and what Atrium does with it.

One Atrium server (with the media plugin) for the whole class; per test a fake peer
(federation_support.FakeKeyServer, answering what the test says) whose user pat joined a
room of alice's through make_join/send_join, so the peer really is in a room here. Each
test checks the right answer or a clean refusal, what is stored, the time it took, and
that meanwhile another user's /sync (bob, who has nothing to do with the peer) stays fast.
Each prints one line of figures (peer sent, Atrium answered, how long) for the report.

The cases: transactions over the PDU and EDU limits; a 3,000-event gap; a device-list
flood; oversized multipart media; EDUs about users or rooms the peer does not own;
/backfill answers that lie about the room; PDUs and bodies that are not canonical JSON
(integers past 2^53, reals, deep nesting, duplicate keys, invalid UTF-8, NULs); send_join
answers with another room's state, oversized, or with events that fail rule 2.
"""

import json
import os
import threading
import time
import urllib.parse

import harness
from accounts import register
from federation_support import FakeKeyServer, FederatedServer, canonical, xmatrix
from harness import psql
from rooms_client import Client, quote
from test_e2ee_keys import KEYS, stream_token
from test_federation import FederationTestCase
from test_media_remote import BOUNDARY, FakeOrigin
from test_federation_txn import wait_until
from test_room_federation import PeerView, complete_event

HOSTILE_IP, PEER_IP, ORIGIN_IP, PEER2_IP = "127.0.0.27", "127.0.0.37", "127.0.0.38", "127.0.0.39"
FED = "/_matrix/federation"
V3 = "/_matrix/client/v3"
# bob's /sync (timeout=0) while the peer misbehaves, at most. A /sync waiting on the peer
# would wait for an outbound timeout (10 s and more); what stays under this is CPU: under
# ASan, beside three other tests on 2 CPUs, reading the 65 MiB send_join answer held bob's
# /sync 2.15-2.17 s in two runs on 2026-12-06 (0.05-1.07 s alone), so 2 s was too tight.
SYNC_FAST_S = 4.0


def figures(case, **values):
    print(f"\nFIGURES {case}: " + ", ".join(f"{k}={v}" for k, v in values.items()), flush=True)


class SyncWatch:
    """bob's /sync?timeout=0 in a loop on a thread while `with` lasts; .worst is the slowest
    answer (seconds), .count how many came, .bad any answer that was not 200."""

    def __init__(self, srv, account):
        self.srv, self.account = srv, account
        self.worst, self.count, self.bad = 0.0, 0, []
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            t0 = time.monotonic()
            status, body = self.srv.json("GET", f"{V3}/sync?timeout=0", token=self.account.token,
                                         timeout=30)
            self.worst = max(self.worst, time.monotonic() - t0)
            self.count += 1
            if status != 200:
                self.bad.append((status, body))
            self.stop.wait(0.05)

    def __enter__(self):
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(30)


class HostilePeerTest(FederationTestCase):
    def server(self):
        """The class's server: registration and the media plugin on; stopped and checked
        in tearDownClass (FederationTestCase)."""
        servers = type(self).class_servers
        if HOSTILE_IP not in servers:
            srv = FederatedServer(self.ca, HOSTILE_IP, start=False)
            srv._settings = harness.deep_merge(srv._settings, {
                "registration": {"enabled": True},
                "plugins": {"media": {"enabled": True,
                                      "store_path": os.path.join(srv.dir, "media_store")}}})
            srv.write_config()
            servers[HOSTILE_IP] = harness.start_shared(srv)
        srv = servers[HOSTILE_IP]
        harness.mark_on_failure(self, srv)  # a failed test keeps the server's log
        return srv

    def setUp(self):
        self.a = self.server()
        self.peer = FakeKeyServer(self.ca, PEER_IP)
        self.addCleanup(self.peer.close)
        self.view = PeerView(self.a, self.peer)
        self.alice = Client(self.a, register(self.a, f"alice{self.id()[-6:]}{time.monotonic_ns()}"))
        self.bob = register(self.a, f"bob{time.monotonic_ns()}")
        self.user = f"@pat:{self.peer.server_name}"
        self.room = self.alice.create_room(preset="public_chat")
        self.join(self.room, self.user)
        self.txn = 0
        # bob's baseline: the slowest of five /sync calls before anything hostile happens.
        with SyncWatch(self.a, self.bob) as w:
            while w.count < 5:
                time.sleep(0.02)
        self.sync_baseline = w.worst

    def join(self, room, user, peer=None):
        """user (of peer, the test's peer unless given) joins room through make_join and
        send_join; the join's event ID."""
        peer = peer or self.peer
        view = PeerView(self.a, peer)
        _, made = view.get(f"{FED}/v1/make_join/{quote(room)}/{quote(user)}?ver=10")
        ev, event_id = complete_event(made["event"], peer.server_name, peer.key)
        status, _ = view.send("PUT", f"{FED}/v2/send_join/{quote(room)}/{quote(event_id)}", ev)
        self.assertEqual(status, 200)
        return event_id

    def q(self, sql):
        return psql(sql, database=self.a.database)

    def send(self, body, txn=None):
        self.txn += 1
        body = {"origin": self.peer.server_name, "origin_server_ts": int(time.time() * 1000),
                **body}
        t0 = time.monotonic()
        # A generous client timeout: under ASan on a loaded machine the flood's 100 EDUs
        # take seconds; what is asserted is what Atrium did and bob's /sync meanwhile.
        status, _, answer = self.a.signed_request("PUT", f"{FED}/v1/send/h{txn or self.txn}",
                                                  self.peer.server_name, self.peer.key, body,
                                                  timeout=120)
        return status, answer, time.monotonic() - t0

    def message(self, body, prev, depth, auth=None, content=None, room=None):
        """pat's message on prev (signed, hashed): (event, event_id). auth: the auth
        events, read from the room's current state unless given (a long chain reads them
        once); content replaces the text body, room the room ID (a lie)."""
        ev = {"type": "m.room.message", "room_id": room or self.room, "sender": self.user,
              "content": content or {"msgtype": "m.text", "body": body},
              "auth_events": auth or self.auth_events(), "prev_events": prev, "depth": depth}
        return complete_event(ev, self.peer.server_name, self.peer.key)

    def tip(self):
        """(the room's forward extremity, the room's greatest depth)."""
        tip = self.q(f"SELECT event_id FROM room_extremities WHERE room_id = '{self.room}'")[0][0]
        [(depth,)] = self.q(f"SELECT max(depth) FROM events WHERE room_id = '{self.room}'")
        return tip, int(depth)

    def send_raw(self, raw, signed):
        """A transaction whose body is the bytes raw, its X-Matrix signature over `signed`
        (what raw means where a parser can read it): (status, answer, seconds)."""
        self.txn += 1
        path = f"{FED}/v1/send/raw{self.txn}"
        auth = xmatrix("PUT", path, self.peer.server_name, self.a.server_name, self.peer.key,
                       signed)
        t0 = time.monotonic()
        status, _, answer = self.a.fed_request("PUT", path, {"Authorization": auth}, raw,
                                               timeout=60)
        return status, answer, time.monotonic() - t0

    def auth_events(self):
        rows = dict(self.q(f"SELECT type || '|' || state_key, event_id FROM current_state"
                           f" WHERE room_id = '{self.room}'"))
        return [rows["m.room.create|"], rows["m.room.power_levels|"],
                rows[f"m.room.member|{self.user}"]]

    def events_in_room(self):
        return int(self.q(f"SELECT count(*) FROM events WHERE room_id = '{self.room}'")[0][0])

    def assert_sync_stayed_fast(self, watch):
        self.assertEqual(watch.bad, [])
        self.assertGreater(watch.count, 0)
        self.assertLess(watch.worst, SYNC_FAST_S, f"bob's /sync took {watch.worst:.2f} s")

    def test_a_transaction_over_the_pdu_or_edu_limit_is_refused_at_once(self):
        tip = self.q(f"SELECT event_id FROM room_extremities WHERE room_id = '{self.room}'")[0][0]
        [(depth,)] = self.q(f"SELECT max(depth) FROM events WHERE room_id = '{self.room}'")
        auth = self.auth_events()
        pdus = [self.message(f"m{i}", [tip], int(depth) + 1, auth)[0] for i in range(51)]
        edu = {"edu_type": "m.typing", "content": {"room_id": self.room, "user_id": self.user,
                                                    "typing": True}}
        events_before = self.events_in_room()
        with SyncWatch(self.a, self.bob) as w:
            status, answer, took = self.send({"pdus": pdus})
            self.assertEqual((status, answer["errcode"]), (400, "M_BAD_JSON"), answer)
            status2, answer2, took2 = self.send({"pdus": [], "edus": [edu] * 101})
            self.assertEqual((status2, answer2["errcode"]), (400, "M_BAD_JSON"), answer2)
            # At the EDU limit, with one of the PDUs: accepted. (Fifty PDUs at once are
            # test_federation_txn's; each costs a full receive, seconds under ASan.)
            status3, answer3, took3 = self.send({"pdus": pdus[:1], "edus": [edu] * 100})
            self.assertEqual(status3, 200, answer3)
        self.assertLess(max(took, took2), 1.0)
        [(stored,)] = self.q("SELECT count(*) FROM events WHERE event_id IN ("
                             + ",".join(f"'{e}'" for e in answer3["pdus"]) + ")")
        self.assertEqual((int(stored), len(answer3["pdus"])), (1, 1))
        # Nothing of the refused transactions is kept: only the one accepted PDU is new.
        self.assertEqual(self.events_in_room() - events_before, 1)
        self.assert_sync_stayed_fast(w)
        figures("over_limits", sent="51 PDUs | 101 EDUs | 1 PDU + 100 EDUs", answered=f"{status} | {status2} | {status3}",
                seconds=f"{took:.3f} | {took2:.3f} | {took3:.3f}",
                bob_sync_worst=f"{w.worst:.3f}", bob_sync_baseline=f"{self.sync_baseline:.3f}")

    def test_a_gap_of_3000_missing_events_is_bridged_by_state_ids_in_bounded_time(self):
        tip = self.q(f"SELECT event_id FROM room_extremities WHERE room_id = '{self.room}'")[0][0]
        [(depth,)] = self.q(f"SELECT max(depth) FROM events WHERE room_id = '{self.room}'")
        state = [r[0] for r in self.q(f"SELECT event_id FROM current_state WHERE room_id = '{self.room}'")]
        chain, ids, prev, auth = [], [], [tip], self.auth_events()
        for i in range(3001):
            ev, eid = self.message(f"gap {i}", prev, int(depth) + 1 + i, auth)
            chain.append(ev)
            ids.append(eid)
            prev = [eid]
        by_id = dict(zip(ids, chain))
        index = {eid: i for i, eid in enumerate(ids)}
        asked = {"missing": 0, "state_ids": 0, "event": 0}
        keys = self.peer.do_get

        def get(handler):
            if handler.path.startswith(f"{FED}/v1/state_ids/"):
                asked["state_ids"] += 1
                return self.peer.reply(handler, 200, {"pdu_ids": state, "auth_chain_ids": state})
            if handler.path.startswith(f"{FED}/v1/event/"):
                asked["event"] += 1
                eid = urllib.parse.unquote(handler.path.rsplit("/", 1)[1])
                if eid in by_id:
                    return self.peer.reply(handler, 200, {"origin": self.peer.server_name,
                                                          "origin_server_ts": 0, "pdus": [by_id[eid]]})
                return self.peer.reply(handler, 404, {"errcode": "M_NOT_FOUND", "error": "no"})
            return keys(handler)

        def post(handler):
            if not handler.path.startswith(f"{FED}/v1/get_missing_events/"):
                return handler.send_error(404)
            asked["missing"] += 1
            body = json.loads(handler.rfile.read(int(handler.headers["Content-Length"])))
            # An honest walk back from latest_events, `limit` events at most.
            out, at = [], min(index.get(e, 0) for e in body["latest_events"]) - 1
            while at >= 0 and len(out) < body.get("limit", 10):
                out.append(chain[at])
                at -= 1
            return self.peer.reply(handler, 200, {"events": out})
        self.peer.do_get, self.peer.do_post = get, post

        events_before = self.events_in_room()
        with SyncWatch(self.a, self.bob) as w:
            status, answer, took = self.send({"pdus": [chain[-1]]})
        self.assertEqual(status, 200, answer)
        self.assertEqual(answer["pdus"], {ids[-1]: {}})
        [(where,)] = self.q(f"SELECT count(*) FROM events WHERE event_id = '{ids[-1]}'")
        self.assertEqual(int(where), 1)
        kept = self.events_in_room() - events_before
        # The walk is bounded (RECV_GAP_MAX_EVENTS, RECV_GAP_MAX_ROUNDS); the rest of the gap
        # is bridged by the state at the oldest collected event.
        self.assertLessEqual(asked["missing"], 60)
        self.assertGreaterEqual(asked["state_ids"], 1)
        self.assertLessEqual(kept, 502)
        # RECV_GAP_BUDGET_MS (30 s) bounds the walk and its processing; /state_ids and the
        # PDU itself come after: within the 60 s handoff deadline (no 504).
        self.assertLess(took, 55)
        self.assert_sync_stayed_fast(w)
        # The room still works for alice: her message lands after the peer's.
        self.alice.send(self.room, {"msgtype": "m.text", "body": "after the gap"})
        figures("gap_3000", sent="1 PDU over 3000 unknown events",
                answered=f"200 accepted; {asked['missing']} get_missing_events, "
                         f"{asked['state_ids']} state_ids, {asked['event']} event; {kept} kept",
                seconds=f"{took:.2f}", bob_sync_worst=f"{w.worst:.3f}",
                bob_sync_baseline=f"{self.sync_baseline:.3f}")

    def test_300_device_list_updates_for_one_user_cost_one_resync(self):
        calls = []
        keys = self.peer.do_get
        devices = [{"device_id": f"D{i:05d}", "keys": {"user_id": self.user, "device_id": f"D{i:05d}"}}
                   for i in range(1500)]

        def get(handler):
            if handler.path.startswith(f"{FED}/v1/user/devices/"):
                calls.append(time.monotonic())
                return self.peer.reply(handler, 200, {"user_id": self.user, "stream_id": 1,
                                                      "devices": devices})
            return keys(handler)
        self.peer.do_get = get
        before = {o: self.a.metric("atrium_e2ee_device_list_resyncs_total", {"outcome": o}) or 0
                  for o in ("ok", "failed", "rate_limited")}
        # Every update names a prev_id that was never sent: each is a gap.
        updates = [{"edu_type": "m.device_list_update",
                    "content": {"user_id": self.user, "device_id": f"N{i}", "stream_id": 10 + i,
                                "prev_id": [100000 + i], "keys": {}}} for i in range(300)]
        since = stream_token(self.a)
        t0 = time.monotonic()
        with SyncWatch(self.a, self.bob) as w:
            answers = [self.send({"pdus": [], "edus": updates[k:k + 100]}) for k in (0, 100, 200)]
        took = time.monotonic() - t0
        self.assertEqual([a[0] for a in answers], [200, 200, 200])
        # The resync runs on its own pool (ADR-0024), after the transaction's answer.
        wait_until(lambda: (self.a.metric("atrium_e2ee_device_list_resyncs_total",
                                          {"outcome": "ok"}) or 0) > before["ok"],
                   what="the resync")
        after = {o: self.a.metric("atrium_e2ee_device_list_resyncs_total", {"outcome": o}) or 0
                 for o in before}
        delta = {o: after[o] - before[o] for o in before}
        # One /user/devices for the burst; a second only when the burst outlasted the
        # interval (a loaded machine under ASan), and never within 60 s of the first.
        allowed = 1 + int(took // 60)
        self.assertTrue(1 <= len(calls) <= allowed, f"{len(calls)} resyncs in {took:.1f} s")
        self.assertTrue(all(b - a >= 59 for a, b in zip(calls, calls[1:])), calls)
        self.assertEqual((delta["ok"] + delta["failed"], delta["rate_limited"]),
                         (len(calls), 300 - len(calls)), delta)
        self.assertGreaterEqual(delta["ok"], 1, delta)
        [(stored, resync_ts)] = self.q("SELECT devices, resync_ts FROM e2ee_remote_device_lists"
                                       f" WHERE user_id = '{self.user}'")
        self.assertEqual(len(json.loads(stored)), 1000)  # 1,500 announced, 1,000 kept
        self.assertIsNotNone(resync_ts)
        self.assert_sync_stayed_fast(w)
        # alice's client still hears that pat's devices changed (and asks pat's server).
        status, body = self.alice.call("GET", f"{KEYS}/changes?from={since}")
        self.assertEqual(status, 200, body)
        self.assertIn(self.user, body["changed"])
        figures("device_list_flood", sent="300 gapped m.device_list_update for one user, "
                "1500 devices on /user/devices",
                answered=f"3x200; {len(calls)} resync(s), {delta['rate_limited']} rate-limited, "
                         f"{len(json.loads(stored))} devices kept",
                seconds=f"{took:.2f} (" + " + ".join(f"{a[2]:.2f}" for a in answers) + ")", bob_sync_worst=f"{w.worst:.3f}",
                bob_sync_baseline=f"{self.sync_baseline:.3f}")

    def test_multipart_with_oversized_preamble_or_headers_is_refused_with_502(self):
        origin = FakeOrigin(self.ca, ORIGIN_IP)
        self.addCleanup(origin.close)
        json_part = f"--{BOUNDARY}\r\nContent-Type: application/json\r\n\r\n{{}}\r\n".encode()
        cases = {
            "preamble": b"P" * (1024 * 1024) + b"\r\n" + json_part,
            "headers": json_part + f"--{BOUNDARY}\r\n".encode()
                       + b"X-Padding: " + b"h" * (256 * 1024) + b"\r\n\r\nDATA\r\n"
                       + f"--{BOUNDARY}--\r\n".encode(),
        }
        results = {}
        with SyncWatch(self.a, self.bob) as w:
            for name, body in cases.items():
                origin.files[name] = ("chunked_raw", body, 1000)
                t0 = time.monotonic()
                status, body = self.a.json(
                    "GET", f"/_matrix/client/v1/media/download/{origin.server_name}/{name}",
                    token=self.alice.token, timeout=30)
                results[name] = (status, body.get("errcode"), time.monotonic() - t0)
        for name, (status, errcode, took) in results.items():
            self.assertEqual((status, errcode), (502, "M_UNKNOWN"), name)
            self.assertLess(took, 10, name)
        stored = self.q("SELECT count(*) FROM media_remote WHERE origin = '%s'" % origin.server_name)
        self.assertEqual(int(stored[0][0]), 0)
        self.assert_sync_stayed_fast(w)
        figures("multipart", sent="1 MiB preamble | 256 KiB part header, chunked by 1000 B",
                answered=" | ".join(f"{s} {e}" for s, e, _ in results.values()),
                seconds=" | ".join(f"{t:.2f}" for *_, t in results.values()),
                bob_sync_worst=f"{w.worst:.3f}", bob_sync_baseline=f"{self.sync_baseline:.3f}")

    # ---- missing history (issue 30 item 5) -------------------------------------------

    def state_ids(self):
        return [r[0] for r in self.q(f"SELECT event_id FROM current_state WHERE room_id = '{self.room}'")]

    def serve(self, events, missing=(), state=None):
        """The peer serves `events` (id -> event) on /event, `missing` on get_missing_events
        and, when state is given, that state on /state_ids (404 otherwise); returns the
        event IDs /state_ids was asked at, in order."""
        asked, keys = [], self.peer.do_get

        def get(handler):
            if handler.path.startswith(f"{FED}/v1/state_ids/"):
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(handler.path).query)
                asked.append(query.get("event_id", [""])[0])
                if state is None:
                    return self.peer.reply(handler, 404, {"errcode": "M_NOT_FOUND", "error": "no"})
                return self.peer.reply(handler, 200, {"pdu_ids": state, "auth_chain_ids": state})
            if handler.path.startswith(f"{FED}/v1/event/"):
                eid = urllib.parse.unquote(handler.path.rsplit("/", 1)[1])
                if eid in events:
                    return self.peer.reply(handler, 200, {"origin": self.peer.server_name,
                                                          "origin_server_ts": 0, "pdus": [events[eid]]})
                return self.peer.reply(handler, 404, {"errcode": "M_NOT_FOUND", "error": "no"})
            return keys(handler)

        def post(handler):
            if not handler.path.startswith(f"{FED}/v1/get_missing_events/"):
                return handler.send_error(404)
            handler.rfile.read(int(handler.headers["Content-Length"]))
            return self.peer.reply(handler, 200, {"events": list(missing)})
        self.peer.do_get, self.peer.do_post = get, post
        return asked

    def stored_as(self, event_id):
        return [r[0] for r in self.q(f"SELECT 'stream' FROM events WHERE event_id = '{event_id}'"
                                     f" UNION ALL SELECT status FROM event_outliers"
                                     f" WHERE event_id = '{event_id}'")]

    def test_a_gap_get_missing_events_leaves_open_takes_the_state_at_the_missing_prev_event(self):
        # X (pat's new display name, a state event) is never sent and get_missing_events
        # does not give it; E, on top of it, is. The state before E is the state at X
        # (/state_ids at X: the peer answers for nothing else, as Sytest's does) plus X.
        t0 = time.monotonic()
        tip = self.q(f"SELECT event_id FROM room_extremities WHERE room_id = '{self.room}'")[0][0]
        [(depth,)] = self.q(f"SELECT max(depth) FROM events WHERE room_id = '{self.room}'")
        rows = dict(self.q(f"SELECT type || '|' || state_key, event_id FROM current_state"
                           f" WHERE room_id = '{self.room}'"))
        x, x_id = complete_event(
            {"type": "m.room.member", "state_key": self.user, "room_id": self.room,
             "sender": self.user, "content": {"membership": "join", "displayname": "Pat Two"},
             "auth_events": [rows["m.room.create|"], rows["m.room.power_levels|"],
                             rows["m.room.join_rules|"], rows[f"m.room.member|{self.user}"]],
             "prev_events": [tip], "depth": int(depth) + 1}, self.peer.server_name, self.peer.key)
        e, e_id = self.message("after the gap", [x_id], int(depth) + 2,
                               [rows["m.room.create|"], rows["m.room.power_levels|"], x_id])
        asked = self.serve({x_id: x}, state=self.state_ids())
        status, answer, took = self.send({"pdus": [e]})
        self.assertEqual((status, answer["pdus"]), (200, {e_id: {}}), answer)
        self.assertEqual(asked, [x_id])  # at the missing prev event, not at E
        self.assertEqual(self.stored_as(e_id), ["stream"])
        status, body = self.alice.call("GET", f"{V3}/rooms/{quote(self.room)}/event/{quote(e_id)}")
        self.assertEqual((status, body.get("content", {}).get("body")), (200, "after the gap"), body)
        # The state E was authorised against holds X (what Atrium now serves as the state
        # before E).
        status, body = self.view.get(f"{FED}/v1/state_ids/{quote(self.room)}?event_id={quote(e_id)}")
        self.assertEqual(status, 200, body)
        self.assertIn(x_id, body["pdu_ids"])
        figures("gap_state_at_prev", sent="1 PDU on 1 missing state event",
                answered=f"accepted; /state_ids at {asked}", seconds=f"{took:.2f}",
                total=f"{time.monotonic() - t0:.2f}")

    def test_an_outlier_whose_auth_events_sit_in_another_room_is_rejected(self):
        # As Sytest's: quinn (of the peer) joined another room of alice's (J1). In this room
        # Q is quinn's join naming J1 as an auth event, R quinn's message on Q, S pat's
        # message on R. S is sent; get_missing_events gives R; Q is fetched for R's auth.
        quinn = f"@quinn:{self.peer.server_name}"
        other = self.alice.create_room(preset="public_chat")
        j1 = self.join(other, quinn)
        tip = self.q(f"SELECT event_id FROM room_extremities WHERE room_id = '{self.room}'")[0][0]
        [(depth,)] = self.q(f"SELECT max(depth) FROM events WHERE room_id = '{self.room}'")
        rows = dict(self.q(f"SELECT type || '|' || state_key, event_id FROM current_state"
                           f" WHERE room_id = '{self.room}'"))
        create, pl = rows["m.room.create|"], rows["m.room.power_levels|"]
        q, q_id = complete_event(
            {"type": "m.room.member", "state_key": quinn, "room_id": self.room, "sender": quinn,
             "content": {"membership": "join"},
             "auth_events": [create, pl, rows["m.room.join_rules|"], j1],
             "prev_events": [tip], "depth": int(depth) + 1}, self.peer.server_name, self.peer.key)
        r, r_id = complete_event(
            {"type": "m.room.message", "room_id": self.room, "sender": quinn,
             "content": {"msgtype": "m.text", "body": "event R"}, "auth_events": [create, pl, q_id],
             "prev_events": [q_id], "depth": int(depth) + 2}, self.peer.server_name, self.peer.key)
        s_ev, s_id = self.message("event S", [r_id], int(depth) + 3,
                                  [create, pl, rows[f"m.room.member|{self.user}"]])
        asked = self.serve({q_id: q, r_id: r}, missing=[r])
        status, answer, took = self.send({"pdus": [s_ev]})
        self.assertEqual((status, answer["pdus"]), (200, {s_id: {}}), answer)
        self.assertEqual(self.stored_as(q_id), ["rejected"])
        self.assertEqual(self.stored_as(r_id), ["rejected"])
        # S is legit: the state before it is the state before the rejected R and Q, known
        # here, so nothing is asked of /state_ids.
        self.assertEqual(self.stored_as(s_id), ["stream"])
        self.assertEqual(asked, [])
        self.assertEqual(self.q(f"SELECT 1 FROM current_state WHERE room_id = '{self.room}'"
                                f" AND state_key = '{quinn}'"), [])
        figures("auth_in_other_room", sent="S on R on Q (Q's auth event in another room)",
                answered="Q, R rejected; S accepted", seconds=f"{took:.2f}")

    # ---- device lists from other servers (issue 30 item 6) ---------------------------

    def test_a_device_list_origin_that_never_answers_delays_nobody(self):
        hang, hung = threading.Event(), []
        self.addCleanup(hang.set)
        keys = self.peer.do_get

        def get(handler):
            if handler.path.startswith(f"{FED}/v1/user/devices/"):
                hung.append(handler.path)
                hang.wait(30)  # never, as far as the test goes
                return handler.send_error(503)
            return keys(handler)
        self.peer.do_get = get
        peer2 = FakeKeyServer(self.ca, PEER2_IP)
        self.addCleanup(peer2.close)
        rui, pat2 = f"@rui:{peer2.server_name}", f"@pat2:{self.peer.server_name}"
        keys2 = peer2.do_get

        def get2(handler):
            if handler.path.startswith(f"{FED}/v1/user/devices/"):
                return peer2.reply(handler, 200, {"user_id": rui, "stream_id": 7, "devices": [
                    {"device_id": "RUI1", "keys": {"user_id": rui, "device_id": "RUI1"}}]})
            return keys2(handler)
        peer2.do_get = get2
        self.join(self.room, rui, peer2)
        self.join(self.room, pat2)

        def update(user, device, sid):  # a gap: prev_id names nothing applied here
            return {"edu_type": "m.device_list_update",
                    "content": {"user_id": user, "device_id": device, "stream_id": sid,
                                "prev_id": [sid - 1], "keys": {}}}

        def resyncs(outcome):
            return self.a.metric("atrium_e2ee_device_list_resyncs_total", {"outcome": outcome}) or 0
        busy0, ok0 = resyncs("busy"), resyncs("ok")
        since = stream_token(self.a)
        t0 = time.monotonic()
        # pat's resync hangs and holds the peer's one resync slot: pat2's is busy.
        status, _, took = self.send({"pdus": [], "edus": [update(self.user, "P1", 5),
                                                          update(pat2, "P2", 5)]})
        self.assertEqual(status, 200)
        body = {"origin": peer2.server_name, "origin_server_ts": int(time.time() * 1000),
                "pdus": [], "edus": [update(rui, "RUI1", 7)]}
        t1 = time.monotonic()
        status2, _, _ = self.a.signed_request("PUT", f"{FED}/v1/send/r1", peer2.server_name,
                                              peer2.key, body, timeout=30)
        took2 = time.monotonic() - t1
        self.assertEqual(status2, 200)
        # Neither transaction waited for a resync (one used to take the 10 s timeout).
        self.assertLess(max(took, took2), 3.0)

        def changed():
            status, body = self.alice.call("GET", f"{KEYS}/changes?from={since}")
            return status == 200 and {self.user, pat2, rui} <= set(body["changed"])
        wait_until(changed, timeout=5, what="pat, pat2 and rui in alice's keys/changes")
        seen = time.monotonic() - t0
        # rui's server answered: its list is stored, though pat's server still hangs.
        wait_until(lambda: self.q(f"SELECT stream_id FROM e2ee_remote_device_lists"
                                  f" WHERE user_id = '{rui}'") in ([["7"]], [("7",)]),
                   timeout=10, what="rui's list resynced")
        self.assertEqual(len(hung), 1)
        self.assertGreaterEqual(resyncs("busy") - busy0, 1)
        self.assertGreaterEqual(resyncs("ok") - ok0, 1)
        self.assertEqual(self.a.metric("atrium_budget_in_use", {"budget": "core.e2ee_resync"}), 1)
        hang.set()
        figures("device_list_hung_origin", sent="gapped updates from a server that never "
                "answers /user/devices, then from another", answered=f"200 in {took:.2f} s | "
                f"200 in {took2:.2f} s", seconds=f"all three in keys/changes after {seen:.2f}")

    def test_edus_about_users_or_rooms_the_peer_does_not_own_are_dropped(self):
        other = "@carol:127.0.0.99:1"  # a user of a server that is not the origin
        eve = f"@eve:{self.peer.server_name}"  # the origin's, but in no room here
        alice = self.alice.user_id
        room2 = self.alice.create_room(preset="private_chat")  # no member of the peer's
        tip, _ = self.tip()

        def typing(room, user):
            return {"edu_type": "m.typing", "content": {"room_id": room, "user_id": user,
                                                        "typing": True}}

        def read(room, user):
            return {room: {"m.read": {user: {"event_ids": [tip], "data": {"ts": 1}}}}}

        def to_device(sender, target, device):
            return {"edu_type": "m.direct_to_device", "content": {
                "sender": sender, "type": "m.room_key_request", "message_id": sender,
                "messages": {target: {device: {"from": sender}}}}}
        keys = {"user_id": alice, "usage": ["master"], "keys": {"ed25519:X": "X"}}
        hostile = [
            typing(self.room, other), typing(self.room, alice), typing(self.room, eve),
            typing(room2, self.user),
            {"edu_type": "m.receipt", "content": {**read(self.room, other),
                                                  **read(room2, self.user)}},
            {"edu_type": "m.receipt", "content": read(self.room, alice)},
            {"edu_type": "m.presence", "content": {"push": [
                {"user_id": alice, "presence": "offline", "status_msg": "hijacked",
                 "last_active_ago": 0},
                {"user_id": other, "presence": "online", "last_active_ago": 0},
                {"user_id": eve, "presence": "online", "last_active_ago": 0}]}},
            *({"edu_type": "m.device_list_update",
               "content": {"user_id": u, "device_id": "EVIL", "stream_id": 7, "prev_id": [],
                           "keys": {}}} for u in (alice, other, eve)),
            {"edu_type": "m.signing_key_update",
             "content": {"user_id": alice, "master_key": keys}},
            to_device(alice, self.bob.user_id, self.bob.device_id),
            to_device(other, alice, self.alice.device_id),
        ]
        # What the peer may say: its own user's typing in its room, its user's to-device.
        honest = [typing(self.room, self.user), to_device(self.user, alice, self.alice.device_id)]
        users = "'" + "','".join((alice, other, eve)) + "'"
        presence_before = self.q(f"SELECT user_id, state, status_msg FROM presence"
                                 f" WHERE user_id IN ({users}) ORDER BY user_id")
        changes_before = self.q(f"SELECT count(*) FROM device_lists_changes WHERE user_id IN ({users})")
        with SyncWatch(self.a, self.bob) as w:
            status, answer, took = self.send({"pdus": [], "edus": hostile + honest})
        self.assertEqual((status, answer), (200, {"pdus": {}}))
        rooms = f"'{self.room}','{room2}'"
        self.assertEqual(self.q(f"SELECT room_id, user_id FROM typing WHERE room_id IN ({rooms})"),
                         [[self.room, self.user]])
        self.assertEqual(self.q(f"SELECT room_id, user_id FROM receipts WHERE room_id IN ({rooms})"), [])
        self.assertEqual(self.q(f"SELECT user_id, state, status_msg FROM presence"
                                f" WHERE user_id IN ({users}) ORDER BY user_id"), presence_before)
        self.assertEqual(self.q(f"SELECT user_id FROM e2ee_remote_device_lists WHERE user_id IN ({users})"), [])
        self.assertEqual(self.q(f"SELECT count(*) FROM device_lists_changes WHERE user_id IN ({users})"),
                         changes_before)
        self.assertEqual(self.q(f"SELECT count(*) FROM e2ee_cross_signing_keys WHERE user_id = '{alice}'"),
                         [["0"]])
        self.assertEqual(self.q(f"SELECT user_id, sender FROM to_device_messages"
                                f" WHERE user_id IN ('{alice}', '{self.bob.user_id}')"),
                         [[alice, self.user]])
        # alice's client sees exactly the honest part: pat typing in the shared room, pat's
        # to-device message; nothing in room2.
        body = self.alice.ok("GET", f"{V3}/sync?timeout=0")
        joined = body["rooms"]["join"]
        typing_now = [e["content"]["user_ids"] for e in joined[self.room]["ephemeral"]["events"]
                      if e["type"] == "m.typing"]
        self.assertEqual(typing_now, [[self.user]])
        self.assertEqual([e["type"] for e in joined.get(room2, {}).get("ephemeral", {}).get("events", [])], [])
        self.assertEqual([e["sender"] for e in body.get("to_device", {}).get("events", [])], [self.user])
        self.assertNotIn(alice, [e.get("sender") for e in body.get("presence", {}).get("events", [])
                                 if e["content"].get("status_msg") == "hijacked"])
        self.assert_sync_stayed_fast(w)
        figures("edus_not_owned", sent=f"{len(hostile)} EDUs for others' users or a room without "
                f"the peer (typing, receipts, presence, device lists, signing keys, to-device) "
                f"+ {len(honest)} honest", answered=f"{status}; only the {len(honest)} honest applied",
                seconds=f"{took:.3f}", bob_sync_worst=f"{w.worst:.3f}",
                bob_sync_baseline=f"{self.sync_baseline:.3f}")

    def test_backfill_answers_that_lie_about_the_room_are_stored_nowhere(self):
        room2 = self.alice.create_room(preset="private_chat")
        tip, depth = self.tip()
        auth = self.auth_events()
        state = [r[0] for r in self.q(f"SELECT event_id FROM current_state WHERE room_id = '{self.room}'")]
        auth2 = [r[0] for r in self.q(f"SELECT event_id FROM current_state WHERE room_id = '{room2}'"
                                      " AND type IN ('m.room.create', 'm.room.power_levels')")]
        # x is missing here: pat's next event names it, so the room gets a backward
        # extremity and alice's /messages asks the peer for /backfill.
        x, x_id = self.message("the missing one", [tip], depth + 1, auth)
        after, after_id = self.message("after the gap", [x_id], depth + 2, auth)
        liars = {
            "of another room here": self.message("other room", [tip], depth + 1, auth2, room=room2),
            "of a room nowhere": self.message("nowhere", [tip], depth + 1, auth,
                                              room=f"!nowhere:{self.peer.server_name}"),
            "auth events of another room": self.message("cross", [tip], depth + 1,
                                                        auth2 + [auth[2]]),
        }
        asked = []
        keys = self.peer.do_get

        def get(handler):
            if handler.path.startswith(f"{FED}/v1/state_ids/"):
                return self.peer.reply(handler, 200, {"pdu_ids": state, "auth_chain_ids": state})
            if handler.path.startswith(f"{FED}/v1/backfill/"):
                asked.append(handler.path)
                return self.peer.reply(handler, 200, {
                    "origin": self.peer.server_name, "origin_server_ts": 0,
                    "pdus": [ev for ev, _ in liars.values()] + [x]})
            if handler.path.startswith(f"{FED}/v1/event/"):
                # The state at the missing x is asked for with /state_ids at x, and x itself
                # with /event (fed_rooms_recv.c), as Synapse does.
                if urllib.parse.unquote(handler.path.rsplit("/", 1)[1]) == x_id:
                    return self.peer.reply(handler, 200, {"origin": self.peer.server_name,
                                                          "origin_server_ts": 0, "pdus": [x]})
                return self.peer.reply(handler, 404, {"errcode": "M_NOT_FOUND", "error": "no"})
            return keys(handler)

        def post(handler):
            if not handler.path.startswith(f"{FED}/v1/get_missing_events/"):
                return handler.send_error(404)
            return self.peer.reply(handler, 200, {"events": []})
        self.peer.do_get, self.peer.do_post = get, post
        status, answer, _ = self.send({"pdus": [after]})
        self.assertEqual((status, answer["pdus"]), (200, {after_id: {}}))
        room2_before = self.q(f"SELECT count(*) FROM events WHERE room_id = '{room2}'")
        refused0 = self.a.metric("atrium_rooms_backfilled_events_total", {"outcome": "refused"}) or 0
        rejected0 = self.a.metric("atrium_rooms_backfilled_events_total", {"outcome": "rejected"}) or 0
        with SyncWatch(self.a, self.bob) as w:
            t0 = time.monotonic()
            status, page = self.alice.call("GET", f"{V3}/rooms/{quote(self.room)}/messages"
                                                  "?dir=b&limit=50", timeout=60)
            took = time.monotonic() - t0
        self.assertEqual(status, 200, page)
        self.assertEqual(len(asked), 1, asked)
        got = [e["event_id"] for e in page["chunk"]]
        self.assertIn(x_id, got)  # the honest part of the answer is stored and served
        liar_ids = "'" + "','".join(eid for _, eid in liars.values()) + "'"
        self.assertFalse(set(got) & {eid for _, eid in liars.values()})
        self.assertEqual(self.q(f"SELECT count(*) FROM events WHERE event_id IN ({liar_ids})"), [["0"]])
        # Only the one that claims this room and fails the auth rules is kept, as rejected.
        self.assertEqual(self.q(f"SELECT event_id, room_id, status FROM event_outliers"
                                f" WHERE event_id IN ({liar_ids})"),
                         [[liars["auth events of another room"][1], self.room, "rejected"]])
        self.assertEqual(self.q(f"SELECT count(*) FROM events WHERE room_id = '{room2}'"), room2_before)
        refused = self.a.metric("atrium_rooms_backfilled_events_total", {"outcome": "refused"}) - refused0
        rejected = self.a.metric("atrium_rooms_backfilled_events_total", {"outcome": "rejected"}) - rejected0
        self.assertEqual((refused, rejected), (2, 1))
        self.assert_sync_stayed_fast(w)
        figures("backfill_lies", sent="/backfill: 1 honest event + 1 of another room here, 1 of "
                "a room nowhere, 1 with auth events of another room",
                answered=f"/messages {status}; honest stored, {refused:g} refused, {rejected:g} "
                         "rejected (kept as rejected), 0 stored in either room",
                seconds=f"{took:.2f}", bob_sync_worst=f"{w.worst:.3f}",
                bob_sync_baseline=f"{self.sync_baseline:.3f}")

    def test_pdus_that_are_not_canonical_json_are_refused(self):
        tip, depth = self.tip()
        auth = self.auth_events()
        nested = 1
        for _ in range(70):  # canonical JSON here: 64 levels at most (CJSON_MAX_DEPTH)
            nested = [nested]
        cases = {"2^53": {"n": 2 ** 53}, "-2^53": {"n": -(2 ** 53)}, "1.5": {"n": 1.5},
                 "2.0": {"n": 2.0}, "70 deep": {"n": nested}}
        pdus = {name: self.message(None, [tip], depth + 1, auth, content=content)
                for name, content in cases.items()}
        big_depth = self.message("deep", [tip], 2 ** 53, auth)  # its ID cannot be computed
        good, good_id = self.message("fine", [tip], depth + 1, auth)
        events_before = self.events_in_room()
        with SyncWatch(self.a, self.bob) as w:
            status, answer, took = self.send(
                {"pdus": [ev for ev, _ in pdus.values()] + [big_depth[0], good]})
            self.assertEqual(status, 200, answer)
            # Whole bodies a parser must refuse (or would read two ways): 400 M_NOT_JSON,
            # before anything is looked at. The PDU is pat's good message, spoiled in text.
            ev, ev_id = self.message("dup", [tip], depth + 1, auth)
            body = {"origin": self.peer.server_name, "origin_server_ts": 1, "pdus": [ev]}
            text = canonical(body)
            spoil = {
                "duplicate key": b'"body":"x","body":"dup"',  # signed as the last one
                "invalid UTF-8": b'"body":"\xff\xfe"',
                "NUL": b'"body":"a\\u0000b"',
                "lone surrogate": b'"body":"\\ud800"',
                "integer past 64 bits": b'"body":"dup","n":18446744073709551616',
                "NaN": b'"body":"dup","n":NaN',
                "3000 deep": b'"body":"dup","n":' + b"[" * 3000 + b"]" * 3000,
            }
            refused = {}
            for name, what in spoil.items():
                self.assertIn(b'"body":"dup"', text)
                refused[name] = self.send_raw(text.replace(b'"body":"dup"', what), body)
        for name, (code, body, secs) in refused.items():
            errcode = body.get("errcode") if isinstance(body, dict) else body
            self.assertEqual((name, code, errcode), (name, 400, "M_NOT_JSON"))
            self.assertLess(secs, 2.0, name)
        for name, (_, eid) in pdus.items():
            self.assertIn("error", answer["pdus"].get(eid, {}), name)
        self.assertNotEqual(answer["pdus"].get(big_depth[1]), {})  # an error, or no entry
        self.assertEqual(answer["pdus"][good_id], {})
        ids = [eid for _, eid in pdus.values()] + [big_depth[1], ev_id]
        self.assertEqual(self.q("SELECT count(*) FROM events WHERE event_id IN ('"
                                + "','".join(ids) + "')"), [["0"]])
        self.assertEqual(self.q("SELECT count(*) FROM event_outliers WHERE event_id IN ('"
                                + "','".join(ids) + "')"), [["0"]])
        self.assertEqual(self.events_in_room() - events_before, 1)  # the good one
        self.assert_sync_stayed_fast(w)
        figures("canonical_json", sent=f"1 transaction of {len(pdus) + 2} PDUs ("
                + ", ".join(cases) + ", depth 2^53, 1 good) | bodies: " + ", ".join(spoil),
                answered=f"{status}, an error for each bad PDU, the good one {{}} | "
                         + ", ".join(f"{r[0]}" for r in refused.values()),
                seconds=f"{took:.3f} | " + ", ".join(f"{r[2]:.3f}" for r in refused.values()),
                bob_sync_worst=f"{w.worst:.3f}", bob_sync_baseline=f"{self.sync_baseline:.3f}")

    def test_send_join_answers_with_bad_state_fail_the_join_cleanly(self):
        """alice joins rooms that only the peer is in; its send_join answers lie."""
        peer, pat = self.peer.server_name, self.user

        def ev(room, kind, state_key, content, auth, prev, depth, sender=pat):
            return complete_event({"type": kind, "room_id": room, "sender": sender,
                                   "state_key": state_key, "content": content,
                                   "auth_events": auth, "prev_events": prev, "depth": depth},
                                  peer, self.peer.key)

        def world(room):
            """The room's state as the peer made it: [(event, id)] create, pat, PL, JR."""
            c = ev(room, "m.room.create", "", {"creator": pat, "room_version": "10"}, [], [], 1)
            j = ev(room, "m.room.member", pat, {"membership": "join"}, [c[1]], [c[1]], 2)
            p = ev(room, "m.room.power_levels", "", {"users": {pat: 100}}, [c[1], j[1]], [j[1]], 3)
            r = ev(room, "m.room.join_rules", "", {"join_rule": "public"}, [c[1], j[1], p[1]],
                   [p[1]], 4)
            return [c, j, p, r]
        rooms = {name: f"!{name}{time.monotonic_ns()}:{peer}"
                 for name in ("foreign", "oversized", "mixed")}
        worlds = {name: world(room) for name, room in rooms.items()}
        other = world(f"!other{time.monotonic_ns()}:{peer}")
        # In "mixed" the state is honest plus events of another room and a topic whose auth
        # events name one that auth events selection does not pick (the join rules): the
        # join holds, the lies are stored nowhere.
        intruder = ev(rooms["mixed"], "m.room.topic", "", {"topic": "forged"},
                      [e for _, e in worlds["mixed"]], [worlds["mixed"][3][1]], 5)
        answers = {
            "foreign": [other[0]] + worlds["foreign"][1:],  # another room's create event
            "oversized": worlds["oversized"] + [ev(rooms["oversized"], "m.room.topic", "",
                                                   {"topic": "t" * (65 * 1024 * 1024)},
                                                   [worlds["oversized"][0][1]], [], 5)],
            "mixed": worlds["mixed"] + other[1:] + [intruder],
        }
        # Serialised now, not while bob's /sync is being timed: making the 65 MiB answer
        # holds this process's GIL for a second or more on a loaded machine, which the
        # watch (a thread of this process) would count as the server's delay.
        bodies = {name: canonical({"origin": peer, "state": [e for e, _ in answers[name]],
                                   "auth_chain": []}) for name in rooms}
        keys = self.peer.do_get

        def get(handler):
            path = urllib.parse.unquote(handler.path.split("?")[0])
            for name, room in rooms.items():
                if path.startswith(f"{FED}/v1/make_join/{room}/"):
                    user = path.rsplit("/", 1)[1]
                    tail = worlds[name][3][1]
                    return self.peer.reply(handler, 200, {"room_version": "10", "event": {
                        "type": "m.room.member", "room_id": room, "sender": user,
                        "state_key": user, "content": {"membership": "join"},
                        "auth_events": [worlds[name][0][1], worlds[name][2][1], tail],
                        "prev_events": [tail], "depth": 5, "origin": peer,
                        "origin_server_ts": int(time.time() * 1000)}})
            return keys(handler)

        def put(handler):
            handler.rfile.read(int(handler.headers.get("Content-Length", 0)))
            path = urllib.parse.unquote(handler.path.split("?")[0])
            for name, room in rooms.items():
                if path.startswith(f"{FED}/v2/send_join/{room}/"):
                    try:
                        handler.send_response(200)
                        handler.send_header("Content-Type", "application/json")
                        handler.send_header("Content-Length", str(len(bodies[name])))
                        handler.end_headers()
                        return handler.wfile.write(bodies[name])
                    except OSError:  # the oversized answer: Atrium stops reading
                        return None
            return handler.send_error(404)
        self.peer.do_get, self.peer.do_put = get, put
        results = {}
        with SyncWatch(self.a, self.bob) as w:
            for name, room in rooms.items():
                t0 = time.monotonic()
                status, body = self.alice.call("POST", f"{V3}/join/{quote(room)}?server_name={peer}",
                                               {}, timeout=120)
                results[name] = (status, body.get("errcode"), time.monotonic() - t0)
        self.assertEqual(results["foreign"][:2], (403, "M_FORBIDDEN"), results)
        self.assertEqual(results["oversized"][:2], (502, "M_UNKNOWN"), results)
        self.assertEqual(results["mixed"][:2], (200, None), results)
        for name in ("foreign", "oversized"):  # nothing half-stored
            room = rooms[name]
            for table in ("rooms", "events", "event_outliers", "current_state"):
                self.assertEqual(self.q(f"SELECT count(*) FROM {table} WHERE room_id = '{room}'"),
                                 [["0"]], (name, table))
        lies = [eid for _, eid in other] + [intruder[1]]
        for table in ("events", "event_outliers"):
            self.assertEqual(self.q(f"SELECT count(*) FROM {table} WHERE event_id IN ('"
                                    + "','".join(lies) + "')"), [["0"]], table)
        state = self.q(f"SELECT type, state_key FROM current_state WHERE room_id = '{rooms['mixed']}'")
        self.assertEqual(sorted(tuple(r) for r in state), sorted([
            ("m.room.create", ""), ("m.room.member", pat), ("m.room.member", self.alice.user_id),
            ("m.room.power_levels", ""), ("m.room.join_rules", "")]))
        self.assert_sync_stayed_fast(w)
        figures("send_join", sent="state with another room's create | 65 MiB state | honest "
                "state + another room's events + a topic with an auth event not selected",
                answered=" | ".join(f"{s} {e or ''}".strip() for s, e, _ in results.values()),
                seconds=" | ".join(f"{t:.2f}" for *_, t in results.values()),
                bob_sync_worst=f"{w.worst:.3f}", bob_sync_baseline=f"{self.sync_baseline:.3f}")
