"""Integration-test harness: a real Atrium server against the test run's PostgreSQL.

ctest runs each integration test as ``python3 -m unittest -v <module>`` from
tests/integration (so ``import harness`` works), with this environment (tests/run.sh
provides the PostgreSQL part; outside ctest the build/ paths of this checkout are used):

    ATRIUM_BIN               the atrium executable under test (plain or ASan build)
    ATRIUM_PLUGIN_DIR        build/plugins (media.so, directory.so)
    ATRIUM_TEST_PLUGIN_DIR   build/tests/plugins (plugins built for tests)
    ATRIUM_TEST_PG_CONNINFO  libpq conninfo of the run's cluster, without dbname

A test starts a server, talks HTTP to it and lets the harness check the aftermath::

    from harness import Server, AtriumTestCase

    class VersionsTest(AtriumTestCase):
        def test_versions_lists_v1_11(self):
            srv = self.start_server(settings={"server": {"http": {"request_threads": 2}}})
            status, body = srv.json("GET", "/_matrix/client/versions")
            self.assertEqual(status, 200)

    # or, without AtriumTestCase:
    with Server(plugins={"media": {"enabled": False}}) as srv:
        status, headers, body = srv.request("GET", "/health")

Tests of one class that only need a server to talk to share one: self.start_class_server()
(each test with users of its own; see docs/adr/0007-tests-run-once-under-asan.md).

Each Server gets a fresh database (random name, dropped on close; under tests/run.sh a copy
of one holding the core's migrations, see migrated_template), a temporary directory
with its YAML config and log, and a free port on 127.0.0.1. Closing it stops the server
with SIGTERM and fails the test when the server did not exit with 0 (unless the test
stopped or killed it itself) or when its log holds a sanitizer report; on any failure the
log's tail is printed. Rate limiting is off unless a test's settings turn it on.

A server's temporary directory (config, log) is removed on close unless something failed;
it lives under $ATRIUM_TEST_TMPDIR (tests/run.sh: <build tree>/test-tmp, emptied at each
run) or the system's temporary directory. ATRIUM_TEST_KEEP=1 keeps every one.
"""

import ctypes
import fcntl
import http.client
import json as jsonlib
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import uuid

import pg_client

HEALTH_TIMEOUT_S = 30
HEALTH_POLL_S = 0.02  # a start takes 0.2-0.3 s: a coarser poll would add to each
STOP_TIMEOUT_S = 30
LOG_TAIL_LINES = 80
SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "runtime error:", "ERROR: LeakSanitizer",
                     "WARNING: ThreadSanitizer")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _env_path(name, fallback):
    value = os.environ.get(name)
    if value:
        return value
    return fallback


def atrium_bin():
    """The server under test: $ATRIUM_BIN, else build/core/atrium of this checkout."""
    path = _env_path("ATRIUM_BIN", os.path.join(REPO_ROOT, "build", "core", "atrium"))
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"atrium executable not found at {path}: build first, or set ATRIUM_BIN")
    return path


def plugin_dir():
    return _env_path("ATRIUM_PLUGIN_DIR", os.path.join(REPO_ROOT, "build", "plugins"))


def test_plugin_dir():
    return _env_path("ATRIUM_TEST_PLUGIN_DIR", os.path.join(REPO_ROOT, "build", "tests", "plugins"))


def pg_conninfo():
    """The test cluster's conninfo without dbname."""
    value = os.environ.get("ATRIUM_TEST_PG_CONNINFO")
    if not value:
        raise RuntimeError(
            "ATRIUM_TEST_PG_CONNINFO is not set: run the tests through tests/run.sh, or start a "
            "cluster (tests/lib/pg.sh start build/test-pg) and export "
            "ATRIUM_TEST_PG_CONNINFO=\"$(tests/lib/pg.sh conninfo build/test-pg)\"")
    return value


def conninfo_for(database):
    """The test cluster's conninfo for one database (a later dbname= wins in libpq)."""
    return f"{pg_conninfo()} dbname={database}"


def psql_bin():
    """The newest PostgreSQL's own psql (skips the pg_wrapper script), else psql on PATH."""
    candidates = []
    base = "/usr/lib/postgresql"
    if os.path.isdir(base):
        for version in os.listdir(base):
            path = os.path.join(base, version, "bin", "psql")
            if version.isdigit() and os.access(path, os.X_OK):
                candidates.append((int(version), path))
    if candidates:
        return max(candidates)[1]
    return shutil.which("psql") or "psql"


_SQL = pg_client.Pool()
SQL_TIMEOUT_S = 60


def _sql_conninfo(database):
    return (f"{conninfo_for(database)} connect_timeout=10 application_name=atrium-tests "
            f"options='-c statement_timeout={SQL_TIMEOUT_S * 1000}'")


def psql(sql, database="postgres"):
    """Runs SQL on the test cluster (one database; the last statement's rows) and returns
    rows as lists of strings, as psql -At prints them. Through a connection this process
    keeps open to the database (tests/integration/pg_client.py), not a psql process."""
    try:
        return _SQL.run(_sql_conninfo(database), sql)
    except pg_client.SqlError as e:
        raise RuntimeError(f"SQL failed on {sql!r}: {e}") from None


def create_database(prefix="atrium_test", template=None):
    """Creates a database with a fresh random name and returns the name; a copy of the
    database `template` when given (else empty)."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    sql = f'CREATE DATABASE "{name}"'
    if template:
        # FILE_COPY (PostgreSQL 15+) copies the template's files where the default strategy
        # writes every page through the WAL: half the CPU for the create and the drop.
        sql += f' TEMPLATE "{template}"' + (" STRATEGY FILE_COPY" if _pg_version() >= 15 else "")
    psql(sql)
    return name


_PG_VERSION = []


def _pg_version():
    """The test cluster's major version (asked once per process)."""
    if not _PG_VERSION:
        _PG_VERSION.append(int(psql("SHOW server_version_num")[0][0]) // 10000)
    return _PG_VERSION[0]


_MADE_TEMPLATES = set()  # migrated_template's, known to exist


def migrated_template():
    """A database holding the schema of the core's migrations, made once per run and
    atrium executable under tests/run.sh ($ATRIUM_TEST_TMPDIR set; else None): a Server's own
    database is a copy of it, so each start does not apply the core's migrations again
    (most of a start-up). It is the database of an atrium without plugins after its
    first start and a clean stop (nothing else in it: no client ever reached it). Tests
    of the migrations themselves give their servers a create_database() of their own
    (test_startup.py); plugins' migrations still run at each server's start."""
    tmp_root = os.environ.get("ATRIUM_TEST_TMPDIR")
    if not tmp_root:
        return None
    binary = atrium_bin()
    st = os.stat(binary)
    # The prefix makes tests/run.sh drop it with the other leftovers at the next run.
    name = "atrium_test_tpl_" + uuid.uuid5(uuid.NAMESPACE_URL,
                                           f"{binary}:{st.st_mtime_ns}:{st.st_size}").hex[:12]
    if name in _MADE_TEMPLATES:
        return name
    os.makedirs(tmp_root, exist_ok=True)
    with open(os.path.join(tmp_root, ".migrated-template.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the tree's test processes make it once
        if psql(f"SELECT 1 FROM pg_database WHERE datname = '{name}'"):
            _MADE_TEMPLATES.add(name)
            return name
        made = create_database()
        try:
            with Server(database=made, plugins={}):
                pass  # started (migrations applied), then stopped with exit 0
            psql(f'ALTER DATABASE "{made}" RENAME TO "{name}"')  # complete, or absent
        except BaseException:
            drop_database(made)
            raise
    _MADE_TEMPLATES.add(name)
    return name


def drop_database(name):
    """Drops the database, disconnecting anyone still connected (a killed server's pool)."""
    _SQL.forget(_sql_conninfo(name))
    psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def free_port(host="127.0.0.1"):
    """A TCP port on host (127.0.0.1) that was free a moment ago."""
    return free_ports(host, 1)[0]


def free_ports(host="127.0.0.1", count=2):
    """count distinct TCP ports on host that were free a moment ago: each socket stays bound
    until all are chosen (two free_port calls in a row may name the same port)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def raw_connect(port, host="127.0.0.1", timeout=10, rcvbuf=None):
    """A connected TCP socket, for slow readers, half-sent requests and abrupt disconnects.

    rcvbuf shrinks the receive buffer (set before connecting, so the window stays small)
    to make a slow reader hold the server's response sooner.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(timeout)
    sock.connect((host, port))
    return sock


def read_head(sock, limit=65536):
    """Reads a raw socket until the end of the response headers; returns (status, header
    bytes, whatever body bytes came with them)."""
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


# ---------------------------------------------------------------------------------------
# YAML: the subset config files need (mappings, sequences, scalars), always unambiguous.

_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-/]*$")


def _yaml_scalar(value):
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        # A JSON string is a valid YAML double-quoted scalar.
        return jsonlib.dumps(value, ensure_ascii=False)
    raise TypeError(f"cannot write {type(value).__name__} to YAML: {value!r}")


def _yaml_key(key):
    key = str(key)
    return key if _PLAIN_KEY.match(key) and key not in ("true", "false", "null", "yes", "no") \
        else jsonlib.dumps(key, ensure_ascii=False)


def to_yaml(value, indent=0):
    """Serializes dicts, lists and scalars to block-style YAML."""
    pad = " " * indent
    lines = []
    if isinstance(value, dict):
        if not value:
            return pad + "{}\n"
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                lines.append(f"{pad}{_yaml_key(key)}:\n{to_yaml(item, indent + 2)}")
            else:
                empty = "{}" if isinstance(item, dict) else "[]" if isinstance(item, list) else None
                lines.append(f"{pad}{_yaml_key(key)}: {empty or _yaml_scalar(item)}\n")
        return "".join(lines)
    if isinstance(value, list):
        if not value:
            return pad + "[]\n"
        for item in value:
            if isinstance(item, (dict, list)) and item:
                nested = to_yaml(item, indent + 2)
                lines.append(f"{pad}- {nested[indent + 2:]}")
            else:
                empty = "{}" if isinstance(item, dict) else "[]" if isinstance(item, list) else None
                lines.append(f"{pad}- {empty or _yaml_scalar(item)}\n")
        return "".join(lines)
    return pad + _yaml_scalar(value) + "\n"


def deep_merge(base, extra):
    """base updated by extra, recursively for nested dicts; neither is modified."""
    out = dict(base)
    for key, value in (extra or {}).items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


# ---------------------------------------------------------------------------------------
# Prometheus text format.

_METRIC_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?$")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def _unescape_label(value):
    if "\\" not in value:
        return value
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def _parse_sample(line):
    match = _METRIC_LINE.match(line)
    if not match:
        raise ValueError(f"malformed metrics line: {line!r}")
    labels = {}
    body = match.group(3) or ""
    pos = 0
    while pos < len(body):
        label = _LABEL.match(body, pos)
        if not label:
            raise ValueError(f"malformed labels in metrics line: {line!r}")
        labels[label.group(1)] = _unescape_label(label.group(2))
        pos = label.end()
    return match.group(1), labels, float(match.group(4))


# Sample lines parsed before, by their text: most lines of a /metrics page are the same at
# the next poll (a test polls a metric dozens of times), and parsing each anew cost 0.8 ms
# of CPU per page. A malformed line is never kept: it raises at every parse.
_PARSED_LINES = {}
_PARSED_LINES_MAX = 20000


def parse_metrics(text):
    """[(name, {label: value}, float)] for each sample in a Prometheus text exposition."""
    samples = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        known = _PARSED_LINES.get(line)
        if known is None:
            if len(_PARSED_LINES) >= _PARSED_LINES_MAX:
                _PARSED_LINES.clear()
            known = _PARSED_LINES[line] = _parse_sample(line)
        name, labels, value = known
        samples.append((name, dict(labels), value))
    return samples


# ---------------------------------------------------------------------------------------


try:
    _LIBC = ctypes.CDLL(None, use_errno=True)
except OSError:
    _LIBC = None
_PR_SET_PDEATHSIG = 1


def _child_setup(nofile):
    """Runs in the server's process before exec. The server gets SIGKILL when the thread
    that started it ends (so a harness killed by a ctest timeout leaves no server behind:
    start servers from the test's main thread); nofile sets RLIMIT_NOFILE like `ulimit -n`."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if nofile is not None:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        limit = nofile if hard == resource.RLIM_INFINITY else min(nofile, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))


def _note_start():
    """Appends this test module's name to $ATRIUM_TEST_TMPDIR/server-starts.log, one line
    per server start: tests/run.sh counts them by module (a start and stop costs about a
    CPU-second under ASan, PostgreSQL's part included)."""
    tmp_root = os.environ.get("ATRIUM_TEST_TMPDIR")
    if not tmp_root:
        return
    module = os.path.basename(sys.argv[-1]) if sys.argv else "?"
    try:
        fd = os.open(os.path.join(tmp_root, "server-starts.log"),
                     os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{module}\n".encode())  # one write: whole lines from parallel tests
        finally:
            os.close(fd)
    except OSError:
        pass  # the count is a report, never a reason to fail a test


class ServerError(AssertionError):
    """The server did not start, did not stop as it should, or reported a sanitizer error."""


class Server:
    """One atrium process with its own database, config and log.

    server_name  the config's server_name (default "localhost")
    settings     dict merged over the harness's base config (server.http.port,
                 database.conninfo, plugin_dir, ratelimit.enabled: false,
                 presence.enabled: false, log.level), or a
                 callable taking the server's temporary directory and returning that dict
    plugins      dict written as the config's `plugins` mapping, e.g.
                 {"media": {"enabled": True}, "probe": {"path": ".../probe.so"}}
    env          extra environment for the server (ATRIUM__A__B=... overrides config keys)
    nofile       RLIMIT_NOFILE for the server (like `ulimit -n`)
    database     use this existing database (not dropped on close) instead of a fresh one;
                 two servers sharing one database model a multi-process deployment
    port         listen on this port instead of a free one
    host         the loopback address the client listener binds and requests go to
                 (default 127.0.0.1; processes of one deployment use 127.0.0.31, .32, ...)
    start        start in __enter__ (default); otherwise call start() yourself
    """

    def __init__(self, server_name="localhost", settings=None, plugins=None, env=None,
                 nofile=None, database=None, port=None, start=True, host="127.0.0.1"):
        self.server_name = server_name
        self.host = host
        self.env = dict(env or {})
        self.nofile = nofile
        self.auto_start = start
        self.proc = None
        self.returncode = None
        self.starts = 0
        self._stopped_by_test = False
        self._failed = False
        self._closed = False
        tmp_root = os.environ.get("ATRIUM_TEST_TMPDIR") or None
        if tmp_root:
            os.makedirs(tmp_root, exist_ok=True)
        self.dir = tempfile.mkdtemp(prefix="atrium-it-", dir=tmp_root)
        self.config_path = os.path.join(self.dir, "homeserver.yaml")
        self.log_path = os.path.join(self.dir, "server.log")
        self.owns_database = database is None
        try:
            self.database = database or create_database(template=migrated_template())
        except Exception:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        self.conninfo = conninfo_for(self.database)
        self.fixed_port = port is not None
        self.port = port or free_port(host)
        try:
            if callable(settings):
                settings = settings(self.dir)
            self._settings = settings or {}
            self._plugins = plugins
            self.write_config()
        except Exception:
            self._failed = True
            self.close(raise_errors=False)
            raise

    # -- config ---------------------------------------------------------------------------

    def config(self):
        """The config as a dict (what write_config writes)."""
        base = {
            "server_name": self.server_name,
            "server": {"http": {"bind_address": self.host, "port": self.port}},
            "database": {"conninfo": self.conninfo},
            "plugin_dir": plugin_dir(),
            "ratelimit": {"enabled": False},
            # Presence changes wake contacts' syncs; tests that count wake-ups turn it on.
            "presence": {"enabled": False},
            "log": {"level": os.environ.get("ATRIUM_TEST_LOG_LEVEL", "info")},
            # Argon2id at its least cost: at the default (64 MiB, 2 passes) every account
            # and every server start costs a second or two of CPU on a loaded 2-core
            # machine. test_accounts.PasswordHashingTest checks the setting is obeyed.
            "password_hashing": {"memory_kib": 8, "passes": 1},
        }
        if self._plugins is not None:
            base["plugins"] = self._plugins
        return deep_merge(base, self._settings)

    def write_config(self):
        with open(self.config_path, "w", encoding="utf-8") as f:
            f.write("# Written by tests/integration/harness.py\n")
            f.write(to_yaml(self.config()))

    @property
    def base(self):
        return f"http://{self.host}:{self.port}"

    # -- process --------------------------------------------------------------------------

    def __enter__(self):
        try:
            if self.auto_start:
                self.start()
        except BaseException:
            self._failed = True
            self.close()
            raise
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self._failed = True
        self.close(raise_errors=exc_type is None)
        return False

    def start(self, timeout=HEALTH_TIMEOUT_S):
        """Starts the server and waits for GET /health; raises ServerError with the log if
        the process exits first or /health does not answer within timeout seconds.
        A harness-picked port that something else took meanwhile is replaced, twice at most."""
        for attempt in range(3):
            try:
                return self._start_once(timeout)
            except ServerError:
                taken = "address already in use" in self.log_tail(5).lower()
                if self.fixed_port or self.running() or not taken or attempt == 2:
                    raise
                self.port = free_port(self.host)
                self.write_config()

    def _start_once(self, timeout):
        self.launch()
        self.wait_healthy(timeout)

    def launch(self):
        """Starts the process without waiting for /health (call wait_healthy next). Lets a
        test start several servers at the same moment from its main thread."""
        if self.running():
            raise ServerError("server already running")
        self.starts += 1
        _note_start()
        self._stopped_by_test = False
        self.returncode = None
        env = {**os.environ, **self.env}
        with open(self.log_path, "ab") as log:
            log.write(f"=== harness: start #{self.starts} on port {self.port} ===\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [atrium_bin(), "--config", self.config_path],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=self.dir, env=env, preexec_fn=lambda: _child_setup(self.nofile))

    def wait_healthy(self, timeout=HEALTH_TIMEOUT_S):
        deadline = time.monotonic() + timeout
        last_error = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.returncode = self.proc.returncode
                raise ServerError(
                    f"atrium exited with {self._describe(self.returncode)} before /health answered; "
                    f"log {self.log_path}:\n{self.log_tail()}")
            try:
                status, _, body = self.request("GET", "/health", timeout=2)
                if status == 200 and (jsonlib.loads(body or b"{}") or {}).get("status") == "ok":
                    return
                last_error = f"status {status}, body {body[:200]!r}"
            except (OSError, http.client.HTTPException, ValueError) as e:
                last_error = repr(e)
            time.sleep(HEALTH_POLL_S)
        self.kill()
        raise ServerError(f"/health did not answer 200 within {timeout}s (last: {last_error}); "
                          f"log {self.log_path}:\n{self.log_tail()}")

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    def stop(self, sig=signal.SIGTERM, timeout=STOP_TIMEOUT_S):
        """Sends sig and waits; returns the exit code (negative: killed by that signal).
        A server that does not exit within timeout is killed and ServerError raised."""
        self._stopped_by_test = True
        return self._stop(sig, timeout)

    def _stop(self, sig, timeout):
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                self.returncode = self.proc.returncode
                raise ServerError(f"atrium did not exit within {timeout}s of {signal.Signals(sig).name}; "
                                  f"killed it. Log tail:\n{self.log_tail()}")
        self.returncode = self.proc.returncode
        return self.returncode

    def kill(self):
        """SIGKILL, as a crash would; returns the exit code."""
        self._stopped_by_test = True
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.kill()
        self.returncode = self.proc.wait()
        return self.returncode

    @staticmethod
    def _describe(code):
        if code is not None and code < 0:
            return f"signal {signal.Signals(-code).name}"
        return f"code {code}"

    # -- log ------------------------------------------------------------------------------

    def log_text(self):
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def log_tail(self, lines=LOG_TAIL_LINES):
        return "\n".join(self.log_text().splitlines()[-lines:])

    def sanitizer_reports(self):
        """Log lines that carry a sanitizer report."""
        return [line for line in self.log_text().splitlines()
                if any(marker in line for marker in SANITIZER_MARKERS)]

    def wait_for_log(self, pattern, timeout=10):
        """Waits until the log matches the regular expression; returns the match."""
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        while True:
            match = regex.search(self.log_text())
            if match:
                return match
            if time.monotonic() >= deadline:
                raise AssertionError(f"log never matched {pattern!r} within {timeout}s; tail:\n{self.log_tail()}")
            time.sleep(0.05)

    # -- HTTP -----------------------------------------------------------------------------

    def request(self, method, path, body=None, headers=None, timeout=10, token=None):
        """One request on a fresh connection: (status, headers, body bytes). A dict or list
        body is sent as JSON; token adds `Authorization: Bearer <token>`. headers of the
        answer is an http.client.HTTPMessage (case-insensitive get, get_all)."""
        hdrs = dict(headers or {})
        if isinstance(body, (dict, list)):
            body = jsonlib.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        elif isinstance(body, str):
            body = body.encode()
        if token is not None:
            hdrs["Authorization"] = f"Bearer {token}"
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=hdrs)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, resp.headers, data
        finally:
            conn.close()

    def json(self, method, path, body=None, headers=None, timeout=10, token=None):
        """request() for JSON endpoints: (status, parsed body, or None for an empty body).
        A body that is not JSON raises AssertionError showing it."""
        status, _, data = self.request(method, path, body, headers, timeout, token)
        if not data:
            return status, None
        try:
            return status, jsonlib.loads(data)
        except ValueError:
            raise AssertionError(f"{method} {path} answered {status} with a body that is not JSON: "
                                 f"{data[:500]!r}") from None

    def metrics(self):
        """All samples of /metrics: [(name, labels, value)]."""
        status, _, data = self.request("GET", "/metrics")
        if status != 200:
            raise AssertionError(f"/metrics answered {status}: {data[:300]!r}")
        return parse_metrics(data.decode())

    def metric(self, name, labels=None):
        """The value of a metric: the sum of its samples whose labels include all of the
        given labels (one sample when the labels pick one series); None if none match."""
        wanted = labels or {}
        values = [value for sample_name, sample_labels, value in self.metrics()
                  if sample_name == name and all(sample_labels.get(k) == str(v) for k, v in wanted.items())]
        return sum(values) if values else None

    # -- teardown -------------------------------------------------------------------------

    def close(self, raise_errors=True):
        """Stops the server, drops its database, removes its directory; raises ServerError
        (when raise_errors) if the stop was not clean or the log holds a sanitizer report."""
        if self._closed:
            return
        self._closed = True
        problems = []
        try:
            if self.running():
                code = self._stop(signal.SIGTERM, STOP_TIMEOUT_S)
                if code != 0:
                    problems.append(f"atrium exited with {self._describe(code)} on SIGTERM (expected 0)")
            elif (self.proc is not None and not self._stopped_by_test and self.returncode is None):
                # It exited on its own during the test.
                problems.append(f"atrium exited by itself with {self._describe(self.proc.returncode)}")
        except ServerError as e:
            problems.append(str(e))
        reports = self.sanitizer_reports()
        if reports:
            problems.append("sanitizer report in the server log:\n  " + "\n  ".join(reports[:10]))
        if problems or self._failed:
            sys.stderr.write(f"\n----- atrium log tail ({self.log_path}) -----\n{self.log_tail()}\n"
                             f"----- end of atrium log -----\n")
        try:
            if self.owns_database:
                drop_database(self.database)
        finally:
            keep = os.environ.get("ATRIUM_TEST_KEEP") == "1" or problems or self._failed
            if keep:
                sys.stderr.write(f"kept {self.dir} (config and log)\n")
            else:
                shutil.rmtree(self.dir, ignore_errors=True)
        if problems and raise_errors:
            raise ServerError("; ".join(problems))


def start_shared(srv):
    """Starts srv, a server tests will share; a start that fails marks it failed (its log
    is kept), closes it and raises."""
    try:
        srv.start()
    except BaseException:
        srv._failed = True
        srv.close(raise_errors=False)
        raise
    return srv


def mark_on_failure(test, srv):
    """A shared server keeps its log when test fails (checked at the test's cleanup)."""
    def mark():
        outcome = getattr(test, "_outcome", None)  # unittest internals: did the test fail?
        if outcome is not None and not getattr(outcome, "success", True):
            srv._failed = True
    test.addCleanup(mark)


class AtriumTestCase(unittest.TestCase):
    """TestCase with start_server(): the server is closed (and checked) in cleanup."""

    def start_server(self, **kwargs):
        srv = Server(**kwargs)

        def close():
            outcome = getattr(self, "_outcome", None)  # unittest internals: did the test fail?
            if outcome is not None and not getattr(outcome, "success", True):
                srv._failed = True
            srv.close()

        self.addCleanup(close)
        try:
            if srv.auto_start:
                srv.start()
        except BaseException:
            srv._failed = True
            raise
        return srv

    def start_class_server(self, **kwargs):
        """A server that this class's tests share, on Server(**kwargs) of the first test
        that asks: stopped and checked (exit code, sanitizer reports) once the class's last
        test ran, where a problem fails the class; a failed test marks it, so its log is
        kept. A start and stop costs about a CPU-second under ASan: a class whose tests
        each use their own users and rooms, assert no absolute counter and stop no server
        needs one server, not one per test. Every call of a class must pass the same
        arguments."""
        cls = type(self)
        srv = cls.__dict__.get("_class_server")
        if srv is None:
            srv = cls._class_server = start_shared(Server(start=False, **kwargs))

            def close():
                del cls._class_server
                srv.close()
            cls.addClassCleanup(close)
        mark_on_failure(self, srv)
        return srv
