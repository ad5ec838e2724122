"""The core's layers hold: every #include under core/, plugins/ and include/ points down
the dependency graph written once, in the "Layers" section of docs/architecture.md (its
table is what this test reads), a plugin includes nothing of the repository but
include/atrium/ and its own folder, and include/atrium/ includes only itself.

No tracked file is over MAX_LINES (900) lines either: a text file that long is split along a
seam (tests/unit/test_fed_http.c and test_fed_http_refusals.c, sharing
tests/unit/fed_http_fixture.h), not left to grow. package-lock.json, node_modules/ and
binary files are not counted.

No two C source files (`.c`) under core/ and plugins/ share a name, so a file's name alone
finds it (a plugin's internal header may share the name of the public header it
implements, as plugins/media/media.h and include/atrium/media.h do).

A failure names the file and line of each include that breaks a rule, and each file over
the length bound. No server is started; this reads source files (and git ls-files) only."""

import os
import re
import shutil
import subprocess
import unittest

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ARCHITECTURE = os.path.join(REPO_ROOT, "docs", "architecture.md")
SOURCE_ROOTS = ("core", "plugins", "include")
PUBLIC = "include/atrium/"
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
CODE = re.compile(r"`([^`]+)`")
MAX_LINES = 900
NOT_COUNTED = ("package-lock.json", "node_modules")  # generated, not written by hand


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def layers_table(text):
    """The rows of the table under "## Layers": [(layer, [folders], [may include])], lowest
    first, as the document lists them."""
    section = re.search(r"^## Layers\n(.*?)(?=^## )", text, re.S | re.M)
    if not section:
        raise AssertionError("docs/architecture.md has no \"## Layers\" section")
    rows = []
    for line in section.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 3 or cells[0] in ("layer", "") \
                or set(cells[0]) <= set("-: "):
            continue
        allowed = [] if cells[2] in ("", "-", "nothing") else \
            [a.strip() for a in cells[2].split(",")]
        rows.append((cells[0], CODE.findall(cells[1]), allowed))
    return rows


def source_files():
    for top in SOURCE_ROOTS:
        for d, _, names in os.walk(os.path.join(REPO_ROOT, top)):
            for name in sorted(names):
                if name.endswith((".c", ".h")):
                    yield os.path.relpath(os.path.join(d, name), REPO_ROOT)


def resolve(src, name):
    """The repository file an include names, as the build finds it (the including file's
    folder, then the include paths: the repository root and include/), or None for a
    system header."""
    for base in (os.path.dirname(src), "", "include"):
        path = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(os.path.join(REPO_ROOT, path)):
            return path
    return None


def includes(path):
    """(line number, included repository file) of each #include of path."""
    for n, line in enumerate(read(os.path.join(REPO_ROOT, path)).splitlines(), 1):
        m = INCLUDE.match(line)
        if m:
            target = resolve(path, m.group(2))
            if target:
                yield n, target


class Layers:
    def __init__(self, rows):
        self.rows = rows
        self.allowed = {name: set(may) for name, _, may in rows}
        self.folders = [(f, name) for name, folders, _ in rows for f in folders]

    def of(self, path):
        """The layer of a core/ or include/ file: the row whose folder (or file) is the
        longest prefix of path. None when no row claims it."""
        best = None
        for folder, name in self.folders:
            if path == folder or (folder.endswith("/") and path.startswith(folder)):
                if not best or len(folder) > len(best[0]):
                    best = (folder, name)
        return best[1] if best else None

    def reachable(self, name):
        seen, todo = set(), list(self.allowed.get(name, ()))
        while todo:
            n = todo.pop()
            if n not in seen:
                seen.add(n)
                todo.extend(self.allowed.get(n, ()))
        return seen


def violations(layers):
    """Every include that breaks a rule, as "file:line: why" lines."""
    out = []
    for src in source_files():
        if src.startswith("plugins/"):
            own = "/".join(src.split("/")[:2]) + "/"
            for n, target in includes(src):
                if not (target.startswith(PUBLIC) or target.startswith(own)):
                    out.append(f"{src}:{n}: a plugin includes {target}; plugins include only "
                               f"{PUBLIC} and their own folder ({own})")
            continue
        layer = layers.of(src)
        if layer is None:
            out.append(f"{src}:1: no row of the Layers table (docs/architecture.md) claims "
                       f"this file's folder")
            continue
        for n, target in includes(src):
            if target.startswith("plugins/"):
                out.append(f"{src}:{n}: {layer} includes a plugin's header {target}")
                continue
            to = layers.of(target)
            if to != layer and to not in layers.allowed[layer]:
                out.append(f"{src}:{n}: {layer} includes {target} ({to}); the Layers table "
                           f"of docs/architecture.md lets {layer} include only: "
                           f"{', '.join(sorted(layers.allowed[layer])) or 'itself'}")
    return out


def tracked_files():
    """The files git tracks, relative to the repository root. None when there is no git or
    no .git (a source tarball): the caller skips. safe.directory: a clone owned by another
    user (a CI container) is still listed."""
    if not shutil.which("git") or not os.path.exists(os.path.join(REPO_ROOT, ".git")):
        return None
    out = subprocess.run(["git", "-c", f"safe.directory={REPO_ROOT}", "ls-files", "-z"],
                         cwd=REPO_ROOT, capture_output=True)
    if out.returncode != 0:
        raise AssertionError(f"git ls-files exited with {out.returncode}: "
                             f"{out.stderr.decode('utf-8', 'replace').strip()}")
    return [p for p in out.stdout.decode("utf-8", "surrogateescape").split("\0") if p]


def line_count(path):
    """The newline count of a tracked text file; None for what is not counted: a binary file
    (not UTF-8, or with a NUL byte), a symbolic link, a file missing from the work tree."""
    full = os.path.join(REPO_ROOT, path)
    if os.path.islink(full) or not os.path.isfile(full):
        return None
    with open(full, "rb") as f:
        data = f.read()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if b"\0" in data else data.count(b"\n")


def too_long(paths):
    """Every counted file over MAX_LINES lines, as "file: N lines" lines."""
    out = []
    for path in sorted(paths):
        if any(part in NOT_COUNTED for part in path.split("/")):
            continue
        n = line_count(path)
        if n is not None and n > MAX_LINES:
            out.append(f"{path}: {n} lines")
    return out


class LayersTest(unittest.TestCase):
    def setUp(self):
        self.layers = Layers(layers_table(read(ARCHITECTURE)))

    def test_the_table_names_existing_folders_and_layers(self):
        names = {name for name, _, _ in self.layers.rows}
        self.assertIn("public ABI", names)
        for name, folders, may in self.layers.rows:
            for folder in folders:
                with self.subTest(layer=name, folder=folder):
                    self.assertTrue(os.path.exists(os.path.join(REPO_ROOT, folder)),
                                    f"{folder} does not exist")
            for other in may:
                with self.subTest(layer=name, may_include=other):
                    self.assertIn(other, names, f"{other} is not a layer of the table")

    def test_the_allowed_graph_has_no_cycle(self):
        for name, _, _ in self.layers.rows:
            with self.subTest(layer=name):
                self.assertNotIn(name, self.layers.reachable(name),
                                 f"{name} may include, through others, itself")

    def test_the_public_abi_includes_only_itself(self):
        self.assertEqual(self.layers.allowed["public ABI"], set())
        self.assertEqual(self.layers.of(PUBLIC + "abi.h"), "public ABI")

    def test_every_include_points_down_the_layers(self):
        found = violations(self.layers)
        self.assertEqual(found, [], "includes against the layers:\n" + "\n".join(found))


class FileLengthTest(unittest.TestCase):
    def test_no_tracked_file_is_over_the_line_bound(self):
        paths = tracked_files()
        if paths is None:
            self.skipTest("git or the repository's .git is not available: the tracked files "
                          "cannot be listed (a clone has both)")
        self.assertGreater(len(paths), 0, "git ls-files listed nothing")
        found = too_long(paths)
        self.assertEqual(found, [], f"files over {MAX_LINES} lines (split each along a seam, "
                         f"as tests/unit/test_fed_http.c was):\n" + "\n".join(found))


class FileNameTest(unittest.TestCase):
    def test_no_two_source_files_share_a_name(self):
        seen = {}
        for top in ("core", "plugins"):
            for dirpath, dirnames, filenames in os.walk(os.path.join(REPO_ROOT, top)):
                dirnames[:] = [d for d in dirnames if d != "node_modules"]
                for name in filenames:
                    if name.endswith(".c"):
                        rel = os.path.relpath(os.path.join(dirpath, name), REPO_ROOT)
                        seen.setdefault(name, []).append(rel)
        self.assertGreater(len(seen), 50, "found too few source files to check")
        shared = [f"{name}: {', '.join(sorted(paths))}" for name, paths in sorted(seen.items())
                  if len(paths) > 1]
        self.assertEqual(shared, [], "source files sharing a name (rename one after what it "
                         "does):\n" + "\n".join(shared))


if __name__ == "__main__":
    unittest.main()
