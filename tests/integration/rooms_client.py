"""Helpers for the room and sync integration tests: a small client bound to one account, an
independent Python implementation of the spec's event hashing (canonical JSON, redaction,
content and reference hashes) to check the server's event IDs against, and a crowd of
users inserted straight into the database for tests that need hundreds of clients.

    from rooms_client import Client, crowd
    alice = Client(srv, register(srv, "alice"))
    room = alice.create_room(name="Lobby")
    event_id = alice.send(room, {"msgtype": "m.text", "body": "hi"})

The crowd bypasses registration on purpose: registering hundreds of accounts through the
API costs an Argon2id hash each (seconds under ASan); the rows it writes are the accounts
module's own tables (users, devices, access_tokens with SHA-256 token hashes), so the
server authenticates them like any other user.
"""

import base64
import hashlib
import itertools
import json
import secrets
import unittest
import urllib.parse

from accounts import REGISTRATION_ON, register
from harness import Server, psql

V3 = "/_matrix/client/v3"
_txn_counter = itertools.count(1)


class SharedServerTest(unittest.TestCase):
    """One server for a whole TestCase class, with one registered Client per name in USERS
    (as cls.<name>): registering costs an Argon2id hash each, so the class shares them."""

    USERS = ()
    PLUGINS = None  # the config's `plugins` mapping (harness.Server)

    @classmethod
    def setUpClass(cls):
        cls.srv = Server(settings=REGISTRATION_ON, plugins=cls.PLUGINS)
        cls.srv.__enter__()
        try:
            for name in cls.USERS:
                setattr(cls, name, Client(cls.srv, register(cls.srv, name)))
        except BaseException:
            cls.srv.__exit__(None, None, None)
            raise

    @classmethod
    def tearDownClass(cls):
        cls.srv.__exit__(None, None, None)


def quote(value):
    return urllib.parse.quote(value, safe="")


class Client:
    """One account's view of the server; every call asserts nothing unless told to."""

    def __init__(self, srv, account):
        self.srv = srv
        self.user_id = account.user_id
        self.token = account.token
        self.device_id = account.device_id

    def call(self, method, path, body=None, timeout=10):
        return self.srv.json(method, path, body, token=self.token, timeout=timeout)

    def ok(self, method, path, body=None, timeout=10):
        status, answer = self.call(method, path, body, timeout)
        if status != 200:
            raise AssertionError(f"{method} {path}: {status} {answer}")
        return answer

    def create_room(self, **body):
        return self.ok("POST", f"{V3}/createRoom", body)["room_id"]

    def send(self, room, content, event_type="m.room.message", txn=None):
        txn = txn or f"t{next(_txn_counter)}"
        return self.ok("PUT", f"{V3}/rooms/{quote(room)}/send/{event_type}/{txn}", content)["event_id"]

    def put_state(self, room, event_type, content, state_key=""):
        return self.ok("PUT", f"{V3}/rooms/{quote(room)}/state/{event_type}/{quote(state_key)}",
                       content)["event_id"]

    def state(self, room, event_type, state_key=""):
        return self.ok("GET", f"{V3}/rooms/{quote(room)}/state/{event_type}/{quote(state_key)}")

    def join(self, room):
        return self.ok("POST", f"{V3}/rooms/{quote(room)}/join", {})

    def leave(self, room):
        return self.ok("POST", f"{V3}/rooms/{quote(room)}/leave", {})

    def member_action(self, room, action, user_id, **extra):
        return self.call("POST", f"{V3}/rooms/{quote(room)}/{action}", {"user_id": user_id, **extra})

    def messages(self, room, **params):
        return self.ok("GET", f"{V3}/rooms/{quote(room)}/messages?{urllib.parse.urlencode(params)}")

    def sync(self, since=None, timeout_ms=None, filter=None, full_state=None, http_timeout=30):
        params = {}
        if since is not None:
            params["since"] = since
        if timeout_ms is not None:
            params["timeout"] = str(timeout_ms)
        if filter is not None:
            params["filter"] = filter if isinstance(filter, str) else json.dumps(filter)
        if full_state is not None:
            params["full_state"] = "true" if full_state else "false"
        return self.ok("GET", f"{V3}/sync?{urllib.parse.urlencode(params)}", timeout=http_timeout)


def timeline_bodies(sync_answer, room):
    """The `body` of each m.room.message of a room's timeline in a sync answer."""
    joined = sync_answer["rooms"]["join"].get(room, {})
    return [e["content"].get("body") for e in joined.get("timeline", {}).get("events", [])
            if e["type"] == "m.room.message"]


# ---------------------------------------------------------------------------------------
# The spec's hashing rules, written from the spec's text and independent of the server.

def canonical_json(value):
    """Sorted keys, no whitespace, UTF-8, integers only (Python's json escapes controls as
    \\u00xx lower-case, which is the spec's rule)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def unpadded_b64(data, url_safe=False):
    encoded = base64.urlsafe_b64encode(data) if url_safe else base64.b64encode(data)
    return encoded.decode().rstrip("=")


_TOP_V1 = {"event_id", "type", "room_id", "sender", "state_key", "content", "hashes", "signatures",
           "depth", "prev_events", "prev_state", "auth_events", "origin", "origin_server_ts",
           "membership"}
_TOP_V11 = {"event_id", "type", "room_id", "sender", "state_key", "content", "hashes", "signatures",
            "depth", "prev_events", "auth_events", "origin_server_ts"}


def _keep_content(v):
    """Content keys the redaction algorithm of room version v (an int) keeps, per type; None
    means the whole content (the spec's "Redactions" of each room version page)."""
    pl = {"ban", "events", "events_default", "kick", "redact", "state_default", "users",
          "users_default"}
    rules = {
        "m.room.member": {"membership"} | ({"join_authorised_via_users_server"} if v >= 9 else set()),
        "m.room.create": None if v >= 11 else {"creator"},
        "m.room.join_rules": {"join_rule"} | ({"allow"} if v >= 8 else set()),
        "m.room.power_levels": pl | ({"invite"} if v >= 11 else set()),
        "m.room.history_visibility": {"history_visibility"},
    }
    if v <= 5:
        rules["m.room.aliases"] = {"aliases"}
    if v >= 11:
        rules["m.room.redaction"] = {"redacts"}
    return rules


def redact(pdu, version):
    v = int(version)
    out = {k: val for k, val in pdu.items() if k in (_TOP_V11 if v >= 11 else _TOP_V1)}
    rules = _keep_content(v)
    content = pdu.get("content", {})
    if pdu["type"] in rules and rules[pdu["type"]] is None:
        out["content"] = dict(content)
    else:
        keep = rules.get(pdu["type"], set())
        out["content"] = {k: val for k, val in content.items() if k in keep}
    return out


def content_hash(pdu):
    stripped = {k: v for k, v in pdu.items() if k not in ("unsigned", "signatures", "hashes")}
    return unpadded_b64(hashlib.sha256(canonical_json(stripped)).digest())


def reference_event_id(pdu, version):
    """The event ID of pdu: v1-2 its own event_id; v3 "$" + standard base64 of the reference
    hash; v4+ the URL-safe alphabet."""
    if int(version) <= 2:
        return pdu["event_id"]
    red = redact(pdu, version)
    red.pop("signatures", None)
    red.pop("unsigned", None)
    red.pop("event_id", None)
    digest = hashlib.sha256(canonical_json(red)).digest()
    return "$" + unpadded_b64(digest, url_safe=int(version) >= 4)


def reference_hash(pdu, version):
    """The reference hash of pdu, standard unpadded base64: what a v1-2 reference to it
    carries as {"sha256": ...} (a v1-2 event's own event_id is hashed with it)."""
    red = redact(pdu, version)
    red.pop("signatures", None)
    red.pop("unsigned", None)
    if int(version) > 2:
        red.pop("event_id", None)
    return unpadded_b64(hashlib.sha256(canonical_json(red)).digest())


def stored_pdus(srv, room):
    """(event_id, pdu) of every event of a room, in stream order, read from the database."""
    rows = psql(f"SELECT event_id, pdu FROM events WHERE room_id = '{room}' ORDER BY stream_pos",
                database=srv.database)
    return [(event_id, json.loads(pdu)) for event_id, pdu in rows]


# ---------------------------------------------------------------------------------------

class CrowdMember:
    def __init__(self, user_id, token, device_id):
        self.user_id, self.token, self.device_id = user_id, token, device_id


CROWD_BATCH = 400  # users per statement (a few hundred KiB of SQL at most)


def crowd(srv, n, prefix="crowd"):
    """n users with one device and token each, inserted into the accounts tables a batch
    per statement. Returns CrowdMember objects (usable with Client)."""
    members = []
    for start in range(0, n, CROWD_BATCH):
        members += _crowd_batch(srv, start, min(n, start + CROWD_BATCH), prefix)
    return members


def _crowd_batch(srv, first, end, prefix):
    members = []
    values_users, values_devices, values_tokens = [], [], []
    for i in range(first, end):
        user_id = f"@{prefix}{i}:{srv.server_name}"
        token = "atr_" + secrets.token_urlsafe(32)
        device = f"DEV{i}"
        members.append(CrowdMember(user_id, token, device))
        digest = hashlib.sha256(token.encode()).hexdigest()
        values_users.append(f"('{user_id}', 0)")
        values_devices.append(f"('{user_id}', '{device}')")
        values_tokens.append(f"('{digest}', '{user_id}', '{device}', 0)")
    psql("INSERT INTO users (user_id, created_ts) VALUES " + ",".join(values_users) + ";"
         "INSERT INTO devices (user_id, device_id) VALUES " + ",".join(values_devices) + ";"
         "INSERT INTO access_tokens (token_hash, user_id, device_id, created_ts) VALUES "
         + ",".join(values_tokens), database=srv.database)
    return members
