"""End-to-end media with a real client: tests/e2e/media.e2e.mjs (matrix-js-sdk, pinned by
tests/e2e/package-lock.json) uploads with uploadContent and fetches the authenticated
download and thumbnail URLs the SDK builds, against a server with the media plugin."""

import os
import subprocess
import tempfile
import unittest

from common import AtriumTestCase
from harness import REPO_ROOT
from media_support import media_server, png

E2E_DIR = os.path.join(REPO_ROOT, "tests", "e2e")


class MediaJsSdkTest(AtriumTestCase):
    def test_matrix_js_sdk_uploads_and_fetches_media_through_authenticated_urls(self):
        if not os.path.isdir(os.path.join(E2E_DIR, "node_modules", "matrix-js-sdk")):
            self.fail("tests/e2e/node_modules is missing: run tests/run.sh (it runs npm ci)")
        srv = media_server(self)
        with tempfile.NamedTemporaryFile(suffix=".png") as image:
            image.write(png(400, 300))
            image.flush()
            proc = subprocess.run(
                ["node", "--test", "--test-force-exit", "--test-reporter=spec", "media.e2e.mjs"],
                cwd=E2E_DIR, env={**os.environ, "ATRIUM_URL": srv.base, "MEDIA_E2E_PNG": image.name},
                capture_output=True, text=True, timeout=120)
        print(proc.stdout[-4000:])
        self.assertEqual(proc.returncode, 0, f"node --test failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-3000:]}")


if __name__ == "__main__":
    unittest.main()
