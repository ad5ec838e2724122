"""The plugin example in README.md builds from include/atrium/ alone and works as the README
says: a newcomer's first plugin must not rot."""

import os
import re
import subprocess
import tempfile
import unittest

from common import AtriumTestCase
from harness import REPO_ROOT


class ReadmePluginTest(AtriumTestCase):
    def test_the_readme_example_plugin_builds_loads_and_answers(self):
        with open(os.path.join(REPO_ROOT, "README.md"), encoding="utf-8") as f:
            readme = f.read()
        code = re.search(r"```c\n(.*?)```", readme, re.S).group(1)
        workdir = tempfile.mkdtemp(prefix="atrium-readme-")
        src, so = os.path.join(workdir, "example.c"), os.path.join(workdir, "example.so")
        with open(src, "w", encoding="utf-8") as f:
            f.write(code)
        flags = subprocess.run(["pkg-config", "--cflags", "jansson", "libpq"], check=True,
                               capture_output=True, text=True).stdout.split()
        subprocess.run(["cc", "-std=c17", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
                        "-fvisibility=hidden", "-I", os.path.join(REPO_ROOT, "include"), *flags,
                        src, "-o", so], check=True)
        srv = self.start_server(plugins={"example": {"enabled": True, "path": so}})
        self.assertEqual(srv.json("GET", "/_example/hello/world"), (200, {"hello": "127.0.0.1"}))


if __name__ == "__main__":
    unittest.main()
