"""A private PostgreSQL cluster for tests that restart or freeze it.

The test run's cluster (tests/run.sh) is shared by every test running at the same time, so
a test that stops, restarts or freezes PostgreSQL gets a cluster of its own, made by
tests/lib/pg.sh in a directory under the test's temporary folder:

    with PrivatePostgres(tmpdir) as pg:
        conninfo = pg.conninfo("atrium")      # the database is created on first ask
        with pg.frozen():                     # SIGSTOP of the postmaster and its children
            ...                               # SIGCONT on leaving, whatever happened
        pg.restart()                          # fast shutdown, then start on the same port

The cluster is stopped (and its folder removed) on close; a frozen cluster is always
resumed first, even when the test failed, so no stopped process outlives a test.
"""

import contextlib
import os
import shutil
import signal
import subprocess

from harness import REPO_ROOT

PG_SH = os.path.join(REPO_ROOT, "tests", "lib", "pg.sh")
PG_SH_TIMEOUT_S = 120


def _run(*args):
    proc = subprocess.run([PG_SH, *args], capture_output=True, text=True,
                          timeout=PG_SH_TIMEOUT_S, env={**os.environ, "ATRIUM_PG_FAST": "1"})
    if proc.returncode != 0:
        raise RuntimeError(f"pg.sh {' '.join(args)} failed ({proc.returncode}): "
                           f"{proc.stderr.strip()[-2000:]}")
    return proc.stdout.strip()


class PrivatePostgres:
    def __init__(self, directory):
        self.dir = directory
        self._frozen = []
        _run("start", self.dir)
        self.data_dir = _run("datadir", self.dir).splitlines()[-1]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def conninfo(self, database):
        _run("createdb", self.dir, database)
        return _run("conninfo", self.dir, database).splitlines()[-1]

    def postmaster_pid(self):
        with open(os.path.join(self.data_dir, "postmaster.pid"), encoding="ascii") as f:
            return int(f.readline())

    @staticmethod
    def children(root):
        """Every process the postmaster `root` started."""
        out = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[1]) == root:
                out.append(int(entry))
        return out

    def freeze(self):
        """SIGSTOP the postmaster first (so it starts nothing new), then its children.

        The children are listed only once the postmaster is stopped: a backend it forked
        between a listing and its own stop would otherwise go on serving its connection
        (a pool connection opened at that instant), and the "frozen" server would answer."""
        root = self.postmaster_pid()
        os.kill(root, signal.SIGSTOP)
        self._frozen.append(root)
        for pid in self.children(root):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
                self._frozen.append(pid)

    def thaw(self):
        for pid in reversed(self._frozen):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self._frozen = []

    @contextlib.contextmanager
    def frozen(self):
        try:
            self.freeze()
            yield
        finally:
            self.thaw()

    def restart(self):
        _run("stop", self.dir)
        _run("start", self.dir)

    def stop(self):
        _run("stop", self.dir)

    def start(self):
        _run("start", self.dir)

    def close(self):
        self.thaw()
        try:
            _run("stop", self.dir)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
