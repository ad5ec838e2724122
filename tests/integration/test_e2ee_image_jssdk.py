"""The seed's story end to end: an encrypted image a federated user sent. Two Atrium
processes with the media plugin (A on 127.0.0.21, B on 127.0.0.22, TLS from the test CA);
tests/e2e/e2ee_image.fed.mjs drives a matrix-js-sdk client with Rust crypto on each
(matrix-js-sdk and @matrix-org/matrix-sdk-crypto-wasm pinned by tests/e2e/package-lock.json,
installed by tests/run.sh with npm ci): alice on A sends an encrypted m.image in an
encrypted room with bob on B, and bob's client decrypts it, downloads the file through B
(a remote fetch from A) and gets the original bytes back."""

import os
import subprocess
import unittest

import harness
from harness import REPO_ROOT
from media_support import png
from test_federation import A_IP, B_IP, FederationTestCase

E2E_DIR = os.path.join(REPO_ROOT, "tests", "e2e")


def run_story(case, a_url, b_url, image_dir, extra_env=None):
    """tests/e2e/e2ee_image.fed.mjs between a_url and b_url; fails the test with its output."""
    if not os.path.isdir(os.path.join(E2E_DIR, "node_modules", "@matrix-org",
                                      "matrix-sdk-crypto-wasm")):
        case.fail("tests/e2e/node_modules is missing: run tests/run.sh (it runs npm ci)")
    image = os.path.join(image_dir, "picture.png")
    with open(image, "wb") as f:
        f.write(png(64, 48))
    proc = subprocess.run(
        ["node", "--test", "--test-force-exit", "--test-reporter=spec", "e2ee_image.fed.mjs"],
        cwd=E2E_DIR, env={**os.environ, "ATRIUM_A_URL": a_url, "ATRIUM_B_URL": b_url,
                          "E2EE_IMAGE_PATH": image, **(extra_env or {})},
        capture_output=True, text=True, timeout=240)
    print(proc.stdout[-6000:])
    case.assertEqual(proc.returncode, 0,
                     f"node --test failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-3000:]}")


class EncryptedImageAcrossServersTest(FederationTestCase):
    def start_media_server(self, ip):
        srv = self.start_fed(ip, start=False)
        srv._settings = harness.deep_merge(srv._settings, {"plugins": {"media": {
            "enabled": True, "store_path": os.path.join(srv.dir, "media_store")}}})
        srv.write_config()
        srv.start()
        return srv

    def test_an_encrypted_image_from_a_user_of_a_is_decrypted_by_a_user_of_b(self):
        a = self.start_media_server(A_IP)
        b = self.start_media_server(B_IP)
        run_story(self, a.base, b.base, a.dir)
        # B fetched the file from A over federation media: one fetch, the ciphertext.
        self.assertEqual(b.metric("atrium_media_remote_fetches_total", {"outcome": "ok"}), 1)
        self.assertGreaterEqual(a.metric("atrium_media_federation_served_total"), 1)



import test_federation_synapse as synapse_support  # noqa: E402 (not its class: its own test would run here)

SYNAPSE_ATRIUM_IP = "127.0.0.54"


class EncryptedImageWithSynapseTest(synapse_support.SynapseInteropTest):
    """The same story with Synapse as B: bob's client talks to Synapse, which fetches the
    file from Atrium over federation media. Skipped, saying so, without the Synapse peer."""

    test_keys_and_signed_requests_both_ways = None  # SynapseInteropTest's own test runs there

    def test_an_encrypted_image_from_a_user_of_atrium_is_decrypted_by_a_user_of_synapse(self):
        a = self.start_fed(SYNAPSE_ATRIUM_IP, start=False)
        a._settings = harness.deep_merge(a._settings, {"plugins": {"media": {
            "enabled": True, "store_path": os.path.join(a.dir, "media_store")}}})
        a.write_config()
        syn = self.start_synapse([a.server_name])
        a.start()
        bob = synapse_support.peer("register", syn["dir"], "bob", "bob-password-1")
        run_story(self, a.base, syn["url"], a.dir, {"B_CREDS": bob})
        self.assertGreaterEqual(a.metric("atrium_media_federation_served_total"), 1)


if __name__ == "__main__":
    unittest.main()
