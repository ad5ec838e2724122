"""End-to-end with a real client: tests/e2e/*.test.mjs (matrix-js-sdk 37.5.0, pinned by
tests/e2e/package-lock.json) run with node's test runner against a real server.
tests/run.sh installs the npm packages (npm ci) before ctest runs."""

import os
import subprocess
import unittest

from common import AtriumTestCase
from harness import REPO_ROOT

E2E_DIR = os.path.join(REPO_ROOT, "tests", "e2e")


class JsSdkTest(AtriumTestCase):
    def test_matrix_js_sdk_clients_register_talk_resume_and_log_out(self):
        if not os.path.isdir(os.path.join(E2E_DIR, "node_modules", "matrix-js-sdk")):
            self.fail("tests/e2e/node_modules is missing: run tests/run.sh (it runs npm ci)")
        srv = self.start_server(settings={"registration": {"enabled": True},
                                          "auth": {"login_via_existing_session": True}},
                                plugins={"directory": {"enabled": True}})
        tests = sorted(f for f in os.listdir(E2E_DIR) if f.endswith(".test.mjs"))
        proc = subprocess.run(["node", "--test", "--test-force-exit", "--test-reporter=spec", *tests], cwd=E2E_DIR,
                              env={**os.environ, "ATRIUM_URL": srv.base}, capture_output=True,
                              text=True, timeout=300)
        print(proc.stdout[-6000:])
        self.assertEqual(proc.returncode, 0, f"node --test failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-3000:]}")


if __name__ == "__main__":
    unittest.main()
