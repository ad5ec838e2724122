"""Simplified Sliding Sync (MSC4186) cross-checked against a real Synapse (1.132): each
scenario runs the same steps on Atrium and on Synapse, through the same client, and their
answers are compared field by field for what the MSC fixes: the rooms of each list and
their order, the lists' counts, required_state, timelines, membership counts, heroes and
the extensions' payloads.

The servers' own values (room, event and user IDs, server names, timestamps, pos and
prev_batch tokens) are mapped to comparable forms by Normaliser; bump_stamp is compared by
its order within an answer, not its value. Where the two differ on purpose, the difference
is written down in docs/adr/0041-sliding-sync-differences-from-synapse.md and accepted here
by name (documented()), one check each: a difference that goes away fails too.

Synapse is a test peer, not part of Atrium (test_federation_synapse.py says where it comes
from); without it these tests are skipped with a message saying so.
"""

import concurrent.futures
import hashlib
import hmac
import json
import os
import types
import unittest

import harness
from accounts import REGISTRATION_ON, register
from rooms_client import V3, Client, quote
from test_federation import FederatedServer
from test_federation_synapse import PEER_SH, SKIP_MESSAGE, SynapseCase

SYNAPSE_IP, ATRIUM_IP = "127.0.0.137", "127.0.0.138"
SS = "/_matrix/client/unstable/org.matrix.simplified_msc3575/sync"
ALL = [[0, 99]]
# The users of the scenarios: hana and bo act; viv_w and viv_inv watch lists of their own,
# viv the rooms of the other scenarios (room_subscriptions: each scenario its own rooms).
USERS = ("hana", "bo", "viv_w", "viv_inv", "viv")
DISPLAY_NAMES = {"hana": "Hana H."}
# Answer fields that are a server's own tokens or clocks: compared as present, not by value.
TOKENS = {"pos", "prev_batch", "next_batch", "origin_server_ts", "ts", "age"}


class Side:
    """One server's half of the scenarios: its users by name, its rooms and events by
    label, and the sliding sync requests of its users."""

    def __init__(self, name, srv, server_name, accounts):
        self.name, self.srv, self.server_name = name, srv, server_name
        self.accounts = accounts  # {localpart: account}, registered for the class
        self.labels = {}  # an ID of this server: the scenario's label

    def user(self, localpart):
        account = self.accounts[localpart]
        self.labels[account.user_id] = f"@{localpart}"
        return Client(self.srv, account)

    def label(self, label, value):
        self.labels[value] = label
        return value

    def room(self, label, creator, **body):
        return self.label(label, creator.create_room(room_version="10", **body))

    def send(self, label, client, room, text):
        return self.label(label, client.send(room, {"msgtype": "m.text", "body": text}))

    def ss(self, client, body, pos=None):
        path = SS + (f"?pos={quote(pos)}&timeout=0" if pos is not None else "")
        status, answer = client.call("POST", path, body, timeout=30)
        if status != 200:
            raise AssertionError(f"{self.name} sliding sync: {status} {answer}")
        return answer


class Normaliser:
    """A server's answer in a comparable form: IDs by label, tokens and clocks as '<token>',
    bump_stamp as its rank among the answer's rooms (0 the newest), required_state sorted
    (the MSC leaves its order open), events without their `unsigned` (the client-server
    event format, not sliding sync)."""

    def __init__(self, side):
        self.side = side

    def text(self, s):
        if s in self.side.labels:
            return self.side.labels[s]
        if s.startswith("$"):
            return "$event"
        return s.replace(self.side.server_name, "HS")

    def value(self, v, key=None):
        if key in TOKENS:
            return "<token>"
        if isinstance(v, dict):
            return {self.text(k): self.value(x, k) for k, x in v.items() if k != "unsigned"}
        if isinstance(v, list):
            return [self.value(x) for x in v]
        if isinstance(v, str):
            return self.text(v)
        return v

    def answer(self, answer):
        out = self.value(answer)
        rooms = out.get("rooms", {})
        stamps = sorted({r["bump_stamp"] for r in rooms.values() if "bump_stamp" in r}, reverse=True)
        for r in rooms.values():
            if "bump_stamp" in r:
                r["bump_stamp"] = stamps.index(r["bump_stamp"])
            for key in ("required_state", "invite_state"):
                if key in r:
                    r[key] = sorted(r[key], key=lambda e: (e["type"], e.get("state_key", "")))
        return out


def synapse_register(syn, localpart):
    """An admin account on syn through its shared-secret registration (what peer.sh register
    does, without starting a process: that costs seconds a user here)."""
    with open(os.path.join(syn["dir"], "secrets.json"), encoding="utf-8") as f:
        secret = json.load(f)["registration_shared_secret"]
    path = "/_synapse/admin/v1/register"
    status, body = syn.json("GET", path)
    assert status == 200, body
    password = f"{localpart}-password-1"
    mac = hmac.new(secret.encode(), digestmod=hashlib.sha1)
    for part in (body["nonce"], localpart, password, "admin"):
        mac.update(part.encode() + (b"" if part == "admin" else b"\x00"))
    status, body = syn.json("POST", path, {"nonce": body["nonce"], "username": localpart,
                                           "password": password, "admin": True,
                                           "mac": mac.hexdigest()})
    assert status == 200, body
    return types.SimpleNamespace(user_id=body["user_id"], token=body["access_token"],
                                 device_id=body["device_id"], password=password)


def events_of(answer):
    """Every event of an answer's rooms (timeline, required_state, stripped state)."""
    for r in answer.get("rooms", {}).values():
        for key in ("timeline", "required_state", "invite_state"):
            yield from r.get(key, [])


class Documented:
    """The differences docs/adr/0041-sliding-sync-differences-from-synapse.md writes down,
    each checked to be what the ADR says (so one that changes fails) and then taken out of
    both answers; whatever else differs fails the comparison."""

    def __init__(self, case):
        self.case = case
        self.seen = set()  # the differences met, by name

    def apply(self, atrium, synapse):
        for name in ("ops", "atrium_fields", "unread", "counts", "push_rules", "lists", "power_levels"):
            getattr(self, name)(atrium, synapse)

    def ops(self, atrium, synapse):
        """Synapse still sends each list's `ops` (one SYNC of the window's room IDs), which
        MSC4186 dropped; the rooms Atrium sent for the list come in the same order."""
        for name, lst in synapse.get("lists", {}).items():
            [op] = lst.pop("ops")
            self.case.assertEqual(op["op"], "SYNC")
            self.seen.add("ops")
            rooms = atrium.get("rooms", {})
            sent = sorted((rid for rid, r in rooms.items() if name in r.get("lists", ())),
                          key=lambda rid: rooms[rid]["bump_stamp"])
            self.case.assertEqual(sent, [rid for rid in op["room_ids"] if rid in sent],
                                  f"list {name}: Atrium's order (bump_stamp) and Synapse's ops")

    def atrium_fields(self, atrium, synapse):
        """Atrium's own fields of a room: `membership`, `lists` and `is_dm`."""
        for rid, r in atrium.get("rooms", {}).items():
            self.case.assertIn(r.pop("membership"), ("join", "invite", "knock", "leave", "ban"))
            r.pop("lists", None)
            r.pop("is_dm", None)
            self.case.assertFalse({"membership", "lists", "is_dm"} & set(synapse["rooms"].get(rid, {})))
            self.seen.add("atrium_fields")

    def unread(self, atrium, synapse):
        """Synapse 1.132 sends notification_count and highlight_count as 0 always."""
        for rid, r in synapse.get("rooms", {}).items():
            for key in ("notification_count", "highlight_count"):
                if key in r and key in atrium["rooms"].get(rid, {}):
                    self.case.assertEqual(r[key], 0, f"{rid} {key}: Synapse counts now")
                    r[key] = atrium["rooms"][rid][key]
                    self.seen.add("unread")

    def counts(self, atrium, synapse):
        """An incremental result of a joined room: Atrium sends joined_count and
        invited_count each time, Synapse only when the room's membership changed."""
        for rid, r in atrium.get("rooms", {}).items():
            theirs = synapse["rooms"].get(rid, {})
            if "initial" not in r and "joined_count" in r and "joined_count" not in theirs:
                del r["joined_count"], r["invited_count"]
                self.seen.add("counts")

    def push_rules(self, atrium, synapse):
        """Synapse's account_data extension sends m.push_rules (its defaults included) in a
        connection's first answer, and an empty list for each room without account data."""
        mine, theirs = atrium.get("extensions", {}).get("account_data"), synapse.get(
            "extensions", {}).get("account_data")
        if not theirs or not mine:
            return
        if "m.push_rules" not in [e["type"] for e in mine["global"]]:
            before = len(theirs["global"])
            theirs["global"] = [e for e in theirs["global"] if e["type"] != "m.push_rules"]
            if len(theirs["global"]) < before:
                self.seen.add("push_rules")
        theirs["rooms"] = {rid: evs for rid, evs in theirs["rooms"].items() if evs}

    def lists(self, atrium, synapse):
        """Atrium sends `lists: {}` for a request without lists; Synapse leaves it out."""
        if "lists" not in synapse and atrium.get("lists") == {}:
            del atrium["lists"]
            self.seen.add("lists")

    def power_levels(self, atrium, synapse):
        """createRoom's default power levels (not sliding sync): Synapse adds `historical`,
        Atrium `notifications`."""
        for answer, key in ((atrium, "notifications"), (synapse, "historical")):
            for e in events_of(answer):
                if e["type"] == "m.room.power_levels":
                    e["content"].pop(key)
                    self.seen.add("power_levels")


@unittest.skipUnless(os.path.exists(PEER_SH), SKIP_MESSAGE)
class SlidingSyncAgainstSynapseTest(SynapseCase):
    """One Synapse and one Atrium for the class; each scenario makes users of its own."""

    maxDiff = None

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        try:
            # Atrium starts, and its users register, while Synapse starts (seconds). Atrium
            # from this thread: the harness ties a server's life to the thread starting it.
            with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
                synapse = pool.submit(cls.start_class_synapse, SYNAPSE_IP)
                try:
                    atrium_accounts = cls.start_atrium()
                finally:
                    cls.syn = synapse.result()
            cls.accounts = {"atrium": atrium_accounts, "synapse": cls.on_each_user(cls.synapse_user)}
        except BaseException:
            cls.tearDownClass()  # stops the Atrium started (Synapse: its class cleanup)
            raise

    @classmethod
    def start_atrium(cls):
        """The class's Atrium (start_class_fed finds it) and its USERS."""
        a = cls.class_servers[ATRIUM_IP] = harness.start_shared(FederatedServer(
            cls.ca, ATRIUM_IP, extra=REGISTRATION_ON, start=False))
        return cls.on_each_user(lambda lp: cls.named(a, register(a, lp), lp))

    @classmethod
    def synapse_user(cls, localpart):
        """An admin without Synapse's rate limits (its defaults would pace the scenarios)."""
        account = synapse_register(cls.syn, localpart)
        cls.syn.unlimit(account)
        return cls.named(cls.syn, account, localpart)

    @staticmethod
    def named(srv, account, localpart):
        if localpart in DISPLAY_NAMES:
            Client(srv, account).ok("PUT", f"{V3}/profile/{quote(account.user_id)}/displayname",
                                    {"displayname": DISPLAY_NAMES[localpart]})
        return account

    @staticmethod
    def on_each_user(make):
        """make(localpart) for each of USERS at once (a registration costs about a second
        on Synapse, an Argon2id hash on Atrium): {localpart: account}."""
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(USERS)) as pool:
            jobs = {lp: pool.submit(make, lp) for lp in USERS}
            return {lp: job.result() for lp, job in jobs.items()}

    def setUp(self):
        self.a = self.start_class_fed(ATRIUM_IP)
        self.sides = [Side("atrium", self.a, self.a.server_name, self.accounts["atrium"]),
                      Side("synapse", self.syn, self.syn.server_name, self.accounts["synapse"])]

    def run_both(self, scenario):
        """scenario(side) on both servers at once: the two lists of (step, answer),
        normalised."""
        def one(side):
            norm = Normaliser(side)
            return [(step, norm.answer(a)) for step, a in scenario(side)]
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            return [job.result() for job in [pool.submit(one, side) for side in self.sides]]

    def compare(self, scenario):
        """The two servers' answers to scenario, equal once the documented differences are
        taken out; Atrium's answers (normalised), and the names of those differences met."""
        atrium, synapse = self.run_both(scenario)
        documented = Documented(self)
        self.assertEqual([s for s, _ in atrium], [s for s, _ in synapse])
        for (step, a), (_, s) in zip(atrium, synapse):
            with self.subTest(step=step):
                documented.apply(a, s)
                self.assertEqual(a, s, f"{step}: Atrium's answer (first) and Synapse's differ")
        return dict(atrium), documented.seen

    # -- scenarios ------------------------------------------------------------------------

    def test_a_window_of_rooms_in_activity_order_then_one_message(self):
        def scenario(side):
            hana, viv = side.user("hana"), side.user("viv_w")
            rooms = []
            for i in range(5):
                room = side.room(f"!r{i}", hana, name=f"r{i}", invite=[viv.user_id])
                viv.join(room)
                rooms.append(room)
            for i in (3, 1, 4):  # activity order now: r4, r1, r3, r2, r0
                side.send(f"m{i}", hana, rooms[i], f"hello r{i}")
            body = {"conn_id": "w", "lists": {"window": {
                "ranges": [[0, 2]], "timeline_limit": 2,
                "required_state": [["m.room.name", ""], ["m.room.member", "$LAZY"]]}}}
            first = side.ss(viv, body)
            yield "first", first
            side.send("late", hana, rooms[0], "r0 wakes up")  # r0 enters the window at the top
            yield "after one message", side.ss(viv, body, pos=first["pos"])
        got, seen = self.compare(scenario)
        self.assertEqual(list(got["first"]["rooms"]), ["!r4", "!r1", "!r3"])
        self.assertEqual(list(got["after one message"]["rooms"]), ["!r0"])
        self.assertLessEqual({"ops", "atrium_fields", "unread"}, seen)

    def test_required_state_keys_wildcards_and_lazy_members(self):
        def scenario(side):
            hana, bo, viv = side.user("hana"), side.user("bo"), side.user("viv")
            room = side.room("!state", hana, name="State", topic="t1",
                             invite=[bo.user_id, viv.user_id])
            bo.join(room)
            viv.join(room)
            side.send("from bo", bo, room, "from bo")

            def sub(conn, required_state, limit=1):
                return {"conn_id": conn, "room_subscriptions": {
                    room: {"timeline_limit": limit, "required_state": required_state}}}
            yield "keys", side.ss(viv, sub("k", [["m.room.name", ""], ["m.room.topic", ""],
                                                  ["m.room.member", bo.user_id]]))
            yield "all", side.ss(viv, sub("all", [["*", "*"]]))
            yield "members", side.ss(viv, sub("mem", [["m.room.member", "*"]]))
            yield "me", side.ss(viv, sub("me", [["m.room.member", "$ME"], ["m.room.create", "*"]]))
            lazy = sub("lazy", [["m.room.member", "$LAZY"]], limit=2)
            first = side.ss(viv, lazy)
            yield "lazy", first
            side.send("from hana", hana, room, "from hana")  # a new sender: her member event
            yield "lazy after a message", side.ss(viv, lazy, pos=first["pos"])
        got, seen = self.compare(scenario)
        lazy = got["lazy after a message"]["rooms"]["!state"]["required_state"]
        self.assertEqual([e["state_key"] for e in lazy], ["@hana"])
        self.assertLessEqual({"lists", "power_levels"}, seen)

    def test_an_invite_moves_to_the_joined_list_then_a_leave(self):
        def scenario(side):
            hana, viv = side.user("hana"), side.user("viv_inv")
            side.room("!mine", viv, name="Mine")
            room = side.room("!invite", hana, name="Invite me", topic="come in")
            hana.member_action(room, "invite", viv.user_id)
            body = {"conn_id": "inv", "lists": {
                "invites": {"ranges": ALL, "timeline_limit": 3, "required_state": [["*", "*"]],
                            "filters": {"is_invite": True}},
                "rooms": {"ranges": ALL, "timeline_limit": 3, "required_state": [["m.room.name", ""]],
                          "filters": {"is_invite": False}}}}
            first = side.ss(viv, body)
            yield "invited", first
            viv.join(room)
            joined = side.ss(viv, body, pos=first["pos"])
            yield "joined", joined
            viv.leave(room)
            left = side.ss(viv, body, pos=joined["pos"])
            yield "left", left
            yield "after the leave", side.ss(viv, body, pos=left["pos"])
        got, seen = self.compare(scenario)
        self.assertEqual(got["invited"]["rooms"]["!invite"]["name"], "Invite me")
        self.assertNotIn("joined_count", got["left"]["rooms"]["!invite"])

    def test_an_unnamed_room_has_heroes_and_member_counts(self):
        def scenario(side):
            hana, viv, cy = side.user("hana"), side.user("viv"), side.user("bo")
            room = side.room("!dm", hana, invite=[viv.user_id], is_direct=True)
            viv.join(room)
            hana.member_action(room, "invite", cy.user_id)
            side.send("hi", hana, room, "hello there")
            side.send("look", hana, room, "viv: look")
            yield "first", side.ss(viv, {"conn_id": "h", "room_subscriptions": {room: {
                "timeline_limit": 1, "required_state": []}}})
        got, seen = self.compare(scenario)
        dm = got["first"]["rooms"]["!dm"]
        self.assertEqual((dm["joined_count"], dm["invited_count"]), (2, 1))
        self.assertEqual([h["user_id"] for h in dm["heroes"]], ["@hana", "@bo"])
        # Atrium's own unread counts (Synapse's are 0): both messages notify in a room of
        # two, the one naming viv highlights.
        self.assertEqual((dm["notification_count"], dm["highlight_count"]), (2, 1))
        self.assertIn("unread", seen)

    def test_extensions_to_device_account_data_typing_and_receipts(self):
        def scenario(side):
            hana, viv = side.user("hana"), side.user("viv")
            room = side.room("!x", hana, name="X", invite=[viv.user_id])
            viv.join(room)
            body = {"conn_id": "x", "room_subscriptions": {room: {"timeline_limit": 1,
                                                                  "required_state": []}},
                    "extensions": {"to_device": {"enabled": True},
                                   "account_data": {"enabled": True},
                                   "typing": {"enabled": True}, "receipts": {"enabled": True}}}
            first = side.ss(viv, body)
            yield "first", first
            event = side.send("read me", hana, room, "read me")
            hana.ok("PUT", f"{V3}/sendToDevice/m.test/td-{side.name}",
                    {"messages": {viv.user_id: {viv.device_id: {"n": 1}}}})
            viv.ok("PUT", f"{V3}/user/{quote(viv.user_id)}/account_data/org.example.g", {"g": 1})
            viv.ok("PUT", f"{V3}/user/{quote(viv.user_id)}/rooms/{quote(room)}/account_data/org.example.r",
                   {"r": 1})
            viv.ok("POST", f"{V3}/rooms/{quote(room)}/receipt/m.read/{quote(event)}", {})
            hana.ok("PUT", f"{V3}/rooms/{quote(room)}/typing/{quote(hana.user_id)}",
                    {"typing": True, "timeout": 30000})
            body["extensions"]["to_device"]["since"] = first["extensions"]["to_device"]["next_batch"]
            nxt = side.ss(viv, body, pos=first["pos"])
            yield "after each", nxt
            hana.ok("PUT", f"{V3}/rooms/{quote(room)}/typing/{quote(hana.user_id)}", {"typing": False})
            body["extensions"]["to_device"]["since"] = nxt["extensions"]["to_device"]["next_batch"]
            yield "typing stopped", side.ss(viv, body, pos=nxt["pos"])
        got, seen = self.compare(scenario)
        ext = got["after each"]["extensions"]
        self.assertEqual(ext["to_device"]["events"], [{"sender": "@hana", "type": "m.test",
                                                       "content": {"n": 1}}])
        self.assertEqual(ext["typing"]["rooms"]["!x"]["content"]["user_ids"], ["@hana"])
        self.assertLessEqual({"push_rules", "counts"}, seen)


if __name__ == "__main__":
    unittest.main()
