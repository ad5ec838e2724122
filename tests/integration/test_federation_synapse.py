"""Federation transport against a real Synapse (1.132, the reference homeserver): each
server fetches the other's key, directly and through the other acting as a notary, and a
signed request from each to the other is accepted (profile queries).

Synapse is a test peer, not part of Atrium: it comes from shared/peers/synapse/ beside the
repository (peer.sh). When that is absent the tests are skipped with a message saying so.
"""

import base64
import http.client
import itertools
import json
import os
import shutil
import sqlite3
import subprocess
import tempfile
import types
import unittest

import harness
from accounts import quote, register
from federation_support import TestCA, verify_json
from rooms_client import Client
from test_federation import FederationTestCase

# shared/ sits beside the repository (CI lays it there); ATRIUM_SYNAPSE_PEER_SH names
# another copy (a git worktree elsewhere, say).
PEER_SH = os.environ.get("ATRIUM_SYNAPSE_PEER_SH") or os.path.join(
    os.path.dirname(harness.REPO_ROOT), "shared", "peers", "synapse", "peer.sh")
SYNAPSE_IP, ATRIUM_IP = "127.0.0.51", "127.0.0.52"
INSTALL_TIMEOUT_S = 900
_PEER_USERS = itertools.count(1)  # SynapseCase.peer_user


def peer(*args, timeout=120):
    done = subprocess.run(["bash", PEER_SH, *args], capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"peer.sh {args[0]} exited with {done.returncode}: "
                             f"{done.stderr.strip()[-2000:]}")
    return done.stdout


def install_peer():
    """peer.sh install, once per process, and not at all when tests/run.sh installed the
    peer before the run (ATRIUM_SYNAPSE_PEER_INSTALLED=1): the check alone costs about
    2 CPU-seconds."""
    global _PEER_INSTALLED
    if not _PEER_INSTALLED and os.environ.get("ATRIUM_SYNAPSE_PEER_INSTALLED") != "1":
        peer("install", timeout=INSTALL_TIMEOUT_S)
    _PEER_INSTALLED = True


_PEER_INSTALLED = False

SKIP_MESSAGE = f"SKIPPED: no Synapse peer at {PEER_SH}; the Synapse interop tests did not run"


def write_signing_key(hs_dir):
    """A new ed25519 signing key in Synapse's key file format (algorithm, key version,
    unpadded base64 of the seed) in hs_dir, where peer.sh looks first: without one it
    makes it by running Synapse's own --generate-keys, a second Python start of Synapse's
    modules costing about 2 CPU-seconds per peer."""
    os.makedirs(hs_dir, exist_ok=True)
    seed = base64.b64encode(os.urandom(32)).decode().rstrip("=")
    version = "a_" + base64.b32encode(os.urandom(5)).decode()[:4].lower()
    with open(os.path.join(hs_dir, "signing.key"), "w", encoding="ascii") as f:
        f.write(f"ed25519 {version} {seed}\n")


class SynapsePeer(dict):
    """One Synapse started with peer.sh: its dir, name, url, ip, fed_port and client_port
    as keys (what the tests read), and the client API, registration, stop and start again
    (same DIR, ports and database: the same server back after an outage)."""

    def __init__(self, start_args, **fields):
        super().__init__(**fields)
        self.start_args = start_args

    @property
    def server_name(self):
        return self["name"]

    def start(self):
        peer("start", self["dir"], *self.start_args)

    def stop(self):
        peer("stop", self["dir"])

    def register(self, user, password, admin=False):
        """A new user (the shared-secret admin API): an Account-like object Client takes."""
        answer = json.loads(peer("register", self["dir"], user, password,
                                 *(["--admin"] if admin else [])))
        return types.SimpleNamespace(user_id=answer["user_id"], token=answer["access_token"],
                                     device_id=answer["device_id"], password=password)

    def json(self, method, path, body=None, headers=None, timeout=30, token=None):
        """Its client API, as harness.Server.json: (status, parsed body or None)."""
        conn = http.client.HTTPConnection(self["ip"], self["client_port"], timeout=timeout)
        hdrs = dict(headers or {})
        if token:
            hdrs["Authorization"] = f"Bearer {token}"
        data = None if body is None else json.dumps(body).encode()
        if data is not None:
            hdrs["Content-Type"] = "application/json"
        try:
            conn.request(method, path, body=data, headers=hdrs)
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        return resp.status, json.loads(raw) if raw else None

    def held(self, event_ids):
        """The IDs of event_ids Synapse stored, whatever became of them (accepted,
        soft-failed, rejected: its client API shows only the first), read from its
        database (SQLite, DIR/homeserver.db) as the tests read Atrium's."""
        db = sqlite3.connect(f"file:{os.path.join(self['dir'], 'homeserver.db')}?mode=ro",
                             uri=True, timeout=30)
        try:
            marks = ",".join("?" * len(event_ids))
            rows = db.execute(f"SELECT event_id FROM events WHERE event_id IN ({marks})",
                              list(event_ids)).fetchall()
        finally:
            db.close()
        return {r[0] for r in rows}

    def unlimit(self, admin):
        """Lifts Synapse's message rate limit (burst 10, then 0.2/s) for an admin user."""
        status, body = self.json("POST", f"/_synapse/admin/v1/users/{quote(admin.user_id)}"
                                 "/override_ratelimit", token=admin.token,
                                 body={"messages_per_second": 0, "burst_count": 0})
        assert status == 200, body


class SynapseCase(FederationTestCase):
    """Starting a Synapse peer beside Atrium, and talking to it (test_media_synapse.py
    uses it too). Skipped with SKIP_MESSAGE where the peer is absent (see the subclasses)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        install_peer()

    def start_synapse(self, whitelist, ip=SYNAPSE_IP):
        """A Synapse on ip (a free port each for federation and clients) federating with the
        server names in whitelist; stopped at the test's end. A SynapsePeer."""
        return self._launch_synapse(self.ca, whitelist, ip, self.addCleanup)

    @classmethod
    def start_class_synapse(cls, ip=SYNAPSE_IP):
        """A Synapse for all the tests of the class (from setUpClass), stopped after the
        last: a start costs seconds. It federates with any server name, as each test's
        Atrium is a new one (its own port) that no whitelist made before could name; the
        tests register users of their own on it (peer_user)."""
        return cls._launch_synapse(cls.ca, None, ip, cls.addClassCleanup)

    @staticmethod
    def _launch_synapse(ca, whitelist, ip, cleanup):
        d = tempfile.mkdtemp(prefix="synapse-peer-")
        cleanup(shutil.rmtree, d, True)
        cert, key = ca.issue(f"synapse-{ip}", ip)
        fed_port, client_port = harness.free_ports(ip, 2)
        name = f"{ip}:{fed_port}"
        args = ["--server-name", name, "--client-listen", f"{ip}:{client_port}",
                "--federation-listen", f"{ip}:{fed_port}", "--tls-cert", cert,
                "--tls-key", key, "--ca", ca.cert]
        if whitelist is not None:
            args += ["--federation-whitelist", *whitelist]
        hs = os.path.join(d, "hs")
        write_signing_key(hs)
        url = peer("start", hs, *args).strip()
        cleanup(peer, "stop", hs)
        return SynapsePeer(args, dir=hs, name=name, url=url, ip=ip,
                           fed_port=fed_port, client_port=client_port)

    def peer_user(self, name):
        """A localpart for a user on a class's Synapse: name and a number no other test of
        the process got (a Synapse that outlives a test keeps its users)."""
        return f"{name}-{next(_PEER_USERS)}"

    def synapse_json(self, syn, method, path, token=None, tls=False, body=None):
        if tls:
            conn = http.client.HTTPSConnection(syn["ip"], syn["fed_port"], timeout=30,
                                               context=self.ca.client_context())
        else:
            conn = http.client.HTTPConnection(syn["ip"], syn["client_port"], timeout=30)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        data = None if body is None else json.dumps(body).encode()
        if data is not None:
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        body = json.loads(resp.read() or b"null")
        conn.close()
        return resp.status, body


class SynapseAsB:
    """setUp for the two-server tests of test_room_federation*.py with Synapse in B's
    place: alice on Atrium (self.a, on atrium_ip), bob on Synapse (self.b, on synapse_ip:
    a SynapsePeer, so stop() and start() as an Atrium server has them), bob an admin
    without Synapse's message rate limit. self.atrium and self.synapse name the servers,
    self.atrium_user and self.synapse_user their users, whichever side each is on."""

    atrium_ip = synapse_ip = None  # each test class its own addresses

    def setUp(self):
        self.atrium = self.a = self.start_fed(self.atrium_ip, start=False)
        self.synapse = self.b = self.start_synapse([self.a.server_name], ip=self.synapse_ip)
        self.a.start()
        self.atrium_user = self.alice = Client(self.a, register(self.a, "alice"))
        self.synapse_user = self.bob = self.synapse_admin("bob")

    def synapse_admin(self, name):
        """A client of a new admin account on Synapse, exempt from its message rate limit."""
        account = self.synapse.register(name, f"{name}-password-1", admin=True)
        self.synapse.unlimit(account)
        return Client(self.synapse, account)

    def new_user(self, srv, name):
        if srv is self.synapse:
            return Client(srv, srv.register(name, f"{name}-password-1"))
        return Client(srv, register(srv, name))


class SynapseAsA(SynapseAsB):
    """SynapseAsB the other way round: alice (an admin) on Synapse (self.a), bob on
    Atrium (self.b): the rooms alice creates live on Synapse and Atrium joins them."""

    def setUp(self):
        self.atrium = self.b = self.start_fed(self.atrium_ip, start=False)
        self.synapse = self.a = self.start_synapse([self.b.server_name], ip=self.synapse_ip)
        self.b.start()
        self.atrium_user = self.bob = Client(self.b, register(self.b, "bob"))
        self.synapse_user = self.alice = self.synapse_admin("alice")


@unittest.skipUnless(os.path.exists(PEER_SH), SKIP_MESSAGE)
class SynapseInteropTest(SynapseCase):
    def test_keys_and_signed_requests_both_ways(self):
        a = self.start_fed(ATRIUM_IP, start=False)
        syn = self.start_synapse([a.server_name])
        a.start()
        alice = register(a, "alice")
        sam = json.loads(peer("register", syn["dir"], "sam", "sam-password-1"))

        # Synapse as a notary for Atrium: asked for Atrium's key by ID (Synapse fetches on a
        # cache miss only for named keys), it fetches it from Atrium itself.
        _, _, own = a.fed_request("GET", "/_matrix/key/v2/server")
        [(key_id, key)] = own["verify_keys"].items()
        status, body = self.synapse_json(syn, "POST", "/_matrix/key/v2/query", tls=True,
                                         body={"server_keys": {a.server_name: {key_id: {}}}})
        self.assertEqual(status, 200, body)
        [doc] = [d for d in body["server_keys"] if d["server_name"] == a.server_name]
        self.assertTrue(verify_json(doc, a.server_name, key_id, key["key"]))
        self.assertIn(syn["name"], doc["signatures"])

        # Atrium as a notary for Synapse.
        status, _, body = a.fed_request("GET", f"/_matrix/key/v2/query/{syn['name']}")
        self.assertEqual(status, 200, body)
        [sdoc] = [d for d in body["server_keys"] if d["server_name"] == syn["name"]]
        self.assertIn(a.server_name, sdoc["signatures"])
        [(skey_id, skey)] = sdoc["verify_keys"].items()
        self.assertTrue(verify_json(sdoc, syn["name"], skey_id, skey["key"]))

        # Atrium's signed request is accepted by Synapse...
        status, body = a.json("GET", f"/_matrix/client/v3/profile/{quote(sam['user_id'])}",
                              token=alice.token)
        self.assertEqual((status, body.get("displayname")), (200, "sam"), body)
        # ...and Synapse's by Atrium.
        status, body = self.synapse_json(syn, "GET",
                                         f"/_matrix/client/v3/profile/{quote(alice.user_id)}",
                                         token=sam["access_token"])
        self.assertEqual((status, body.get("displayname")), (200, "alice"), body)
        self.assertGreaterEqual(a.metric("atrium_federation_inbound_verified_total"), 1)


if __name__ == "__main__":
    unittest.main()
