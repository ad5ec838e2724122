"""Federation transport against a real Synapse (1.132, the reference homeserver): each
server fetches the other's key, directly and through the other acting as a notary, and a
signed request from each to the other is accepted (profile queries).

Synapse is a test peer, not part of Atrium: it comes from shared/peers/synapse/ beside the
repository (peer.sh). When that is absent the tests are skipped with a message saying so.
"""

import json
import os
import shutil
import subprocess
import tempfile
import unittest

import harness
from accounts import quote, register
from federation_support import TestCA, free_port, verify_json
from test_federation import FederationTestCase

# shared/ sits beside the repository (CI lays it there); ATRIUM_SYNAPSE_PEER_SH names
# another copy (a git worktree elsewhere, say).
PEER_SH = os.environ.get("ATRIUM_SYNAPSE_PEER_SH") or os.path.join(
    os.path.dirname(harness.REPO_ROOT), "shared", "peers", "synapse", "peer.sh")
SYNAPSE_IP, ATRIUM_IP = "127.0.0.51", "127.0.0.52"
INSTALL_TIMEOUT_S = 900


def peer(*args, timeout=120):
    return subprocess.run(["bash", PEER_SH, *args], check=True, capture_output=True, text=True,
                          timeout=timeout).stdout


SKIP_MESSAGE = f"SKIPPED: no Synapse peer at {PEER_SH}; the Synapse interop tests did not run"


class SynapseCase(FederationTestCase):
    """Starting a Synapse peer beside Atrium, and talking to it (test_media_synapse.py
    uses it too). Skipped with SKIP_MESSAGE where the peer is absent (see the subclasses)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        peer("install", timeout=INSTALL_TIMEOUT_S)

    def start_synapse(self, whitelist):
        d = tempfile.mkdtemp(prefix="synapse-peer-")
        self.addCleanup(shutil.rmtree, d, True)
        cert, key = self.ca.issue("synapse", SYNAPSE_IP)
        fed_port, client_port = free_port(SYNAPSE_IP), free_port(SYNAPSE_IP)
        name = f"{SYNAPSE_IP}:{fed_port}"
        url = peer("start", os.path.join(d, "hs"), "--server-name", name,
                   "--client-listen", f"{SYNAPSE_IP}:{client_port}",
                   "--federation-listen", f"{SYNAPSE_IP}:{fed_port}", "--tls-cert", cert,
                   "--tls-key", key, "--ca", self.ca.cert, "--federation-whitelist",
                   *whitelist).strip()
        self.addCleanup(peer, "stop", os.path.join(d, "hs"))
        return {"dir": os.path.join(d, "hs"), "name": name, "url": url, "ip": SYNAPSE_IP,
                "fed_port": fed_port, "client_port": client_port}

    def synapse_json(self, syn, method, path, token=None, tls=False, body=None):
        import http.client
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
