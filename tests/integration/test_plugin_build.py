"""The one compile line of a plugin (issue 26): examples/media-disk/build.sh holds it,
docs/plugins.md and README.md give it word for word, and it builds the example outside
this tree from include/atrium/ alone, under strict C17 (no -D_GNU_SOURCE from our build).
The result loads: the server prints its settings table from the descriptor."""

import os
import shutil
import subprocess
import tempfile
import unittest

from harness import atrium_bin

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD_SH = os.path.join(REPO_ROOT, "examples", "media-disk", "build.sh")


def compile_line():
    with open(BUILD_SH, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.startswith("cc ")]
    if len(lines) != 1:
        raise AssertionError(f"{BUILD_SH} must hold exactly one cc line, has {len(lines)}")
    return lines[0]


def read(rel):
    with open(os.path.join(REPO_ROOT, rel), encoding="utf-8") as f:
        return f.read()


class PluginBuildTest(unittest.TestCase):
    def test_the_guide_and_the_readme_give_the_examples_compile_line_word_for_word(self):
        line = compile_line()
        self.assertIn("-std=c17", line.split())
        self.assertNotIn("_GNU_SOURCE", line)
        for doc in ("docs/plugins.md", "README.md"):
            with self.subTest(doc=doc):
                self.assertIn(line, read(doc).splitlines(),
                              f"{doc} must give the compile line of {BUILD_SH} on a line alone")

    def test_the_example_is_built_in_tree_by_that_line_and_nothing_else(self):
        cmake = read("examples/CMakeLists.txt")
        self.assertIn("examples/media-disk/build.sh", cmake)
        self.assertNotIn("add_library", cmake, "a CMake target would inherit the tree's flags")

    def test_the_compile_line_builds_the_example_outside_the_tree_from_the_public_headers(self):
        with tempfile.TemporaryDirectory(prefix="atrium-plugin-build-") as tmp:
            shutil.copytree(os.path.join(REPO_ROOT, "include", "atrium"),
                            os.path.join(tmp, "include", "atrium"))
            os.makedirs(os.path.join(tmp, "examples", "media-disk"))
            shutil.copy(os.path.join(REPO_ROOT, "examples", "media-disk", "media_disk.c"),
                        os.path.join(tmp, "examples", "media-disk"))
            env = {k: v for k, v in os.environ.items()
                   if k not in ("CFLAGS", "CPPFLAGS", "C_INCLUDE_PATH", "CPATH")}
            run = subprocess.run(["sh", "-c", compile_line()], cwd=tmp, env=env,
                                 capture_output=True, text=True, timeout=120)
            self.assertEqual(run.returncode, 0, run.stderr)
            self.assertEqual(run.stderr, "", "the line compiles without a warning")
            so = os.path.join(tmp, "media_disk.so")
            symbols = subprocess.run(["nm", "-D", "--defined-only", so], capture_output=True,
                                     text=True, check=True).stdout.split()
            exported = {s for i, s in enumerate(symbols) if i and symbols[i - 1] == "T"}
            self.assertEqual(exported, {"atrium_plugin_entry"},
                             "hidden visibility: only the entry symbol is exported")
            table = subprocess.run([atrium_bin(), "--print-config-table", "media_disk",
                                    "--plugin-dir", tmp], capture_output=True, text=True,
                                   timeout=60)
            self.assertEqual(table.returncode, 0, table.stderr)
            self.assertIn("store_path", table.stdout)
            self.assertIn("delivery_wait_ms", table.stdout)


if __name__ == "__main__":
    unittest.main()
