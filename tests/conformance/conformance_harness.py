"""The conformance suites' own harness: a real Atrium server against a real PostgreSQL,
with nothing from the rest of the source tree, so tests/conformance/ can be copied into a
plugin's own repository or CI and run there (docs/plugins.md, "Running the conformance
suite").

What it needs, all from the environment:

    ATRIUM_BIN               the atrium executable (else `atrium` on PATH)
    ATRIUM_TEST_PG_CONNINFO  libpq conninfo, without dbname, of a role that may create
                             databases (each server gets a fresh one, dropped after)
    ATRIUM_TEST_TMPDIR       where servers' folders go (else the system's temporary folder)
    ATRIUM_TEST_KEEP=1       keep every server's folder (config and log)

PostgreSQL is reached through libpq itself (ctypes; atrium needs libpq anyway), so no
psql and no Python package is needed: Python 3.9+ and its standard library only.
tests/integration/harness.py is the same idea for the integration tests, with more.
"""

import ctypes
import ctypes.util
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import uuid

HEALTH_TIMEOUT_S = 60  # a fresh database: the core's migrations run at the first start
STOP_TIMEOUT_S = 30
LOG_TAIL_LINES = 60
SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "runtime error:", "ERROR: LeakSanitizer",
                     "WARNING: ThreadSanitizer")


def atrium_bin():
    path = os.environ.get("ATRIUM_BIN") or shutil.which("atrium")
    if not path or not os.access(path, os.X_OK):
        raise RuntimeError("no atrium executable: set ATRIUM_BIN, or put atrium on PATH")
    return os.path.abspath(path)


def pg_conninfo():
    value = os.environ.get("ATRIUM_TEST_PG_CONNINFO")
    if not value:
        raise RuntimeError("ATRIUM_TEST_PG_CONNINFO is not set: the libpq conninfo (no dbname) "
                           "of a PostgreSQL role that may create databases, e.g. "
                           "'host=127.0.0.1 port=5432 user=postgres password=postgres'")
    return value


# ---- PostgreSQL through libpq ---------------------------------------------------------

_PGRES_COMMAND_OK, _PGRES_TUPLES_OK, _CONNECTION_OK = 1, 2, 0


def _libpq():
    name = ctypes.util.find_library("pq") or "libpq.so.5"
    lib = ctypes.CDLL(name)
    lib.PQconnectdb.restype = ctypes.c_void_p
    lib.PQconnectdb.argtypes = [ctypes.c_char_p]
    lib.PQstatus.argtypes = [ctypes.c_void_p]
    lib.PQerrorMessage.restype = ctypes.c_char_p
    lib.PQerrorMessage.argtypes = [ctypes.c_void_p]
    lib.PQexec.restype = ctypes.c_void_p
    lib.PQexec.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.PQresultStatus.argtypes = [ctypes.c_void_p]
    lib.PQntuples.argtypes = [ctypes.c_void_p]
    lib.PQnfields.argtypes = [ctypes.c_void_p]
    lib.PQgetvalue.restype = ctypes.c_char_p
    lib.PQgetvalue.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.PQclear.argtypes = [ctypes.c_void_p]
    lib.PQfinish.argtypes = [ctypes.c_void_p]
    return lib


_PQ = None


def sql(statement, database="postgres"):
    """Runs one statement on the cluster; returns its rows as lists of strings."""
    global _PQ
    if _PQ is None:
        _PQ = _libpq()
    conninfo = f"{pg_conninfo()} dbname={database} connect_timeout=10"
    conn = _PQ.PQconnectdb(conninfo.encode())
    try:
        if _PQ.PQstatus(conn) != _CONNECTION_OK:
            raise RuntimeError(f"cannot connect to PostgreSQL ({database}): "
                               f"{_PQ.PQerrorMessage(conn).decode(errors='replace').strip()}")
        res = _PQ.PQexec(conn, statement.encode())
        try:
            status = _PQ.PQresultStatus(res)
            if status not in (_PGRES_COMMAND_OK, _PGRES_TUPLES_OK):
                raise RuntimeError(f"{statement!r} failed: "
                                   f"{_PQ.PQerrorMessage(conn).decode(errors='replace').strip()}")
            return [[(_PQ.PQgetvalue(res, r, c) or b"").decode()
                     for c in range(_PQ.PQnfields(res))] for r in range(_PQ.PQntuples(res))]
        finally:
            _PQ.PQclear(res)
    finally:
        _PQ.PQfinish(conn)


# ---- sockets, YAML, metrics -----------------------------------------------------------

def free_port(host="127.0.0.1"):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def raw_connect(port, host="127.0.0.1", timeout=10, rcvbuf=None):
    """A connected TCP socket; rcvbuf (set before connecting) makes a slow reader."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(timeout)
    sock.connect((host, port))
    return sock


def read_head(sock, limit=65536):
    """(status, header bytes, the body bytes that came with them)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            raise AssertionError(f"connection closed before headers: {data!r}")
        data += chunk
        if len(data) > limit:
            raise AssertionError("headers too long")
    head, rest = data.split(b"\r\n\r\n", 1)
    return int(head.split(b" ", 2)[1]), head, rest


def to_yaml(value, indent=0):
    """Block YAML of dicts and scalars (strings as JSON strings: always unambiguous)."""
    pad = " " * indent
    out = []
    for key, item in value.items():
        if isinstance(item, dict) and item:
            out.append(f"{pad}{key}:\n{to_yaml(item, indent + 2)}")
        elif isinstance(item, dict):
            out.append(f"{pad}{key}: {{}}\n")
        else:
            out.append(f"{pad}{key}: {json.dumps(item)}\n")
    return "".join(out)


def deep_merge(base, extra):
    out = dict(base)
    for key, value in (extra or {}).items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


_METRIC = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?')


def parse_metrics(text):
    samples = []
    for line in text.splitlines():
        match = _METRIC.match(line.strip())
        if not match or line.startswith("#"):
            continue
        labels = {k: re.sub(r"\\(.)", r"\1", v) for k, v in _LABEL.findall(match.group(2) or "")}
        samples.append((match.group(1), labels, float(match.group(3))))
    return samples


# ---- a server -------------------------------------------------------------------------

class Server:
    """One atrium process with a fresh database, its own folder (config, log) and port.
    settings: a dict, or a callable taking the folder and returning one, merged over the
    base config."""

    def __init__(self, settings=None, server_name="localhost"):
        self.server_name = server_name
        self.host = "127.0.0.1"
        self.proc = None
        self.failed = False
        tmp_root = os.environ.get("ATRIUM_TEST_TMPDIR") or None
        if tmp_root:
            os.makedirs(tmp_root, exist_ok=True)
        self.dir = tempfile.mkdtemp(prefix="atrium-conformance-", dir=tmp_root)
        self.log_path = os.path.join(self.dir, "server.log")
        self.config_path = os.path.join(self.dir, "homeserver.yaml")
        self.database = f"atrium_conformance_{uuid.uuid4().hex[:12]}"
        sql(f'CREATE DATABASE "{self.database}"')
        self.port = free_port()
        settings = settings(self.dir) if callable(settings) else (settings or {})
        base = {"server_name": server_name,
                "server": {"http": {"bind_address": self.host, "port": self.port}},
                "database": {"conninfo": f"{pg_conninfo()} dbname={self.database}"},
                "ratelimit": {"enabled": False}, "presence": {"enabled": False},
                "password_hashing": {"memory_kib": 8, "passes": 1}}
        with open(self.config_path, "w", encoding="utf-8") as f:
            f.write(to_yaml(deep_merge(base, settings)))

    def start(self, timeout=HEALTH_TIMEOUT_S):
        if self.running():
            raise AssertionError("server already running")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([atrium_bin(), "--config", self.config_path],
                                         stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, cwd=self.dir)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"atrium exited with {self.proc.returncode} before /health "
                                     f"answered; log {self.log_path}:\n{self.log_tail()}")
            try:
                if self.request("GET", "/health", timeout=2)[0] == 200:
                    return
            except (OSError, http.client.HTTPException):
                pass
            time.sleep(0.05)
        self.proc.kill()
        self.proc.wait()
        raise AssertionError(f"/health did not answer within {timeout}s:\n{self.log_tail()}")

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    def stop(self, sig=signal.SIGTERM, timeout=STOP_TIMEOUT_S):
        """Sends sig, waits, returns the exit code (0 is a clean stop)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"atrium did not exit within {timeout}s; killed it:\n"
                                     f"{self.log_tail()}") from None
        return self.proc.returncode

    def log_text(self):
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def log_tail(self, lines=LOG_TAIL_LINES):
        return "\n".join(self.log_text().splitlines()[-lines:])

    def request(self, method, path, body=None, headers=None, timeout=10, token=None):
        """(status, headers, body bytes) on a fresh connection; a dict body goes as JSON."""
        hdrs = dict(headers or {})
        if isinstance(body, dict):
            body = json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        if token is not None:
            hdrs["Authorization"] = f"Bearer {token}"
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=hdrs)
            resp = conn.getresponse()
            return resp.status, resp.headers, resp.read()
        finally:
            conn.close()

    def json(self, method, path, body=None, token=None, timeout=10):
        status, _, data = self.request(method, path, body, token=token, timeout=timeout)
        return status, (json.loads(data) if data else None)

    def metric(self, name, labels=None):
        """The sum of the samples of `name` whose labels include `labels`; None if none."""
        status, _, data = self.request("GET", "/metrics")
        if status != 200:
            raise AssertionError(f"/metrics answered {status}")
        want = {k: str(v) for k, v in (labels or {}).items()}
        values = [v for n, ls, v in parse_metrics(data.decode())
                  if n == name and all(ls.get(k) == x for k, x in want.items())]
        return sum(values) if values else None

    def close(self):
        """Stops the server (a stop that is not clean, or a sanitizer report in the log, is
        an error), drops its database, removes its folder unless something failed."""
        problems = []
        if self.running():
            code = self.stop()
            if code != 0:
                problems.append(f"atrium exited with {code} on SIGTERM (expected 0)")
        reports = [line for line in self.log_text().splitlines()
                   if any(marker in line for marker in SANITIZER_MARKERS)]
        if reports:
            problems.append("sanitizer report in the server log:\n  " + "\n  ".join(reports[:10]))
        try:
            sql(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
        finally:
            if problems or self.failed or os.environ.get("ATRIUM_TEST_KEEP") == "1":
                sys.stderr.write(f"kept {self.dir}; log tail:\n{self.log_tail()}\n")
            else:
                shutil.rmtree(self.dir, ignore_errors=True)
        if problems:
            raise AssertionError("; ".join(problems))


class ConformanceCase(unittest.TestCase):
    """start_server(settings=...) starts a Server, closed (and checked) in cleanup."""

    def start_server(self, settings=None):
        srv = Server(settings)

        def close():
            outcome = getattr(self, "_outcome", None)
            if outcome is not None and not getattr(outcome, "success", True):
                srv.failed = True
            srv.close()

        self.addCleanup(close)
        srv.start()
        return srv


# ---- clients --------------------------------------------------------------------------

def register(srv, name=None):
    """A new user through /register (m.login.dummy); (user_id, access_token)."""
    body = {"username": name or f"u{uuid.uuid4().hex[:10]}", "password": "conformance-pw-1"}
    status, first = srv.json("POST", "/_matrix/client/v3/register", body, timeout=30)
    if status != 401:
        raise AssertionError(f"/register without auth answered {status}: {first}")
    body["auth"] = {"type": "m.login.dummy", "session": first.get("session")}
    status, done = srv.json("POST", "/_matrix/client/v3/register", body, timeout=30)
    if status != 200:
        raise AssertionError(f"/register answered {status}: {done}")
    return done["user_id"], done["access_token"]


class Background:
    """fn(*args) in a thread; result() waits for it and returns or re-raises."""

    def __init__(self, fn, *args, **kwargs):
        self._value = self._error = None
        self._thread = threading.Thread(target=self._run, args=(fn, args, kwargs), daemon=True)
        self.started_at = time.monotonic()
        self.finished_at = None
        self._thread.start()

    def _run(self, fn, args, kwargs):
        try:
            self._value = fn(*args, **kwargs)
        except BaseException as e:  # handed to result()
            self._error = e
        finally:
            self.finished_at = time.monotonic()

    def done(self):
        return not self._thread.is_alive()

    def result(self, timeout=30):
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError(f"still running after {timeout}s")
        if self._error:
            raise self._error
        return self._value
