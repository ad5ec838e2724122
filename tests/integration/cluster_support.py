"""Several Atrium processes of one deployment behind haproxy, on loopback.

A Cluster is what an operator runs with deploy/docker-compose.scale.yml, without Docker:
N atrium processes (127.0.0.41, .42, .43, one port for all, as replicas of one service
have) on one database and, with media, one media store directory, and haproxy on
127.0.0.40 started with deploy/haproxy.cfg itself. haproxy finds the processes as it
finds Compose replicas, through a DNS name ("atrium") that resolves to every process's
address: here a FakeDNS (federation_support.py) plays Docker's DNS. The only addition to
the deployed configuration is a stats socket, which the harness reads to wait until
haproxy sees every process up. Tests use it through Cluster(...) as a context manager or
AtriumTestCase.addCleanup(cluster.close).
"""

import csv
import io
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

from federation_support import FakeDNS
from harness import REPO_ROOT, Server, ServerError, create_database, deep_merge, drop_database

LB_IP = "127.0.0.40"
PROCESS_IPS = ["127.0.0.41", "127.0.0.42", "127.0.0.43"]
SERVICE = "atrium"
HAPROXY_CFG = os.path.join(REPO_ROOT, "deploy", "haproxy.cfg")
HAPROXY_SLOTS = 8
HAPROXY_MAXCONN = 2000  # within a test runner's descriptor limit
UP_TIMEOUT_S = 30
STOP_TIMEOUT_S = 10


def haproxy_bin():
    found = shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.path.exists("/usr/sbin/haproxy") else None)
    if not found:
        raise AssertionError("haproxy is not installed: run tests/run.sh (it installs the Debian "
                             "package haproxy, tests/lib/deps.sh)")
    return found


def port_free_on_all(ips):
    """A TCP port free on every address of ips a moment ago (replicas share one port)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind((ips[0], 0))
            port = s.getsockname()[1]
        ok = True
        for ip in ips[1:]:
            with socket.socket() as s:
                try:
                    s.bind((ip, port))
                except OSError:
                    ok = False
                    break
        if ok:
            return port
    raise AssertionError(f"no port free on all of {ips}")


class Balancer:
    """haproxy with deploy/haproxy.cfg on ip, following `SERVICE` through dns."""

    def __init__(self, dns, backend_port, check_port, ip=LB_IP):
        self.ip = ip
        with socket.socket() as s:
            s.bind((ip, 0))
            self.port = s.getsockname()[1]
        with socket.socket() as s:
            s.bind((ip, 0))
            self.fed_port = s.getsockname()[1]
        self.dir = tempfile.mkdtemp(prefix="atrium-lb-", dir=os.environ.get("ATRIUM_TEST_TMPDIR") or None)
        self.log_path = os.path.join(self.dir, "haproxy.log")
        self.stats_path = os.path.join(self.dir, "stats.sock")
        extra = os.path.join(self.dir, "test-stats.cfg")
        with open(extra, "w", encoding="utf-8") as f:
            f.write(f"global\n    stats socket {self.stats_path} level admin\n")
        env = {**os.environ,
               "ATRIUM_LB_BIND": f"{ip}:{self.port}",
               "ATRIUM_LB_FED_BIND": f"{ip}:{self.fed_port}",
               "ATRIUM_LB_SERVICE": SERVICE,
               "ATRIUM_LB_PORT": str(backend_port),
               "ATRIUM_LB_FED_PORT": str(backend_port),  # no federation in these tests
               "ATRIUM_LB_CHECK_PORT": str(check_port),
               "ATRIUM_LB_DNS": dns.address,
               "ATRIUM_LB_SLOTS": str(HAPROXY_SLOTS),
               "ATRIUM_LB_MAXCONN": str(HAPROXY_MAXCONN)}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([haproxy_bin(), "-db", "-f", HAPROXY_CFG, "-f", extra],
                                         stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, env=env)

    @property
    def base(self):
        return f"http://{self.ip}:{self.port}"

    def log_text(self):
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def servers(self):
        """{address: status} of the client backend's filled slots ("UP", "DOWN", ...)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(self.stats_path)
            s.sendall(b"show servers state atrium\n")
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        # "show servers state": a version line, a header line "# be_id be_name srv_id
        # srv_name srv_addr srv_op_state ...", then one line per slot.
        lines = data.decode().splitlines()
        header = next((ln[2:].split() for ln in lines if ln.startswith("# be_id")), None)
        if header is None:
            return {}
        out = {}
        for row in csv.reader(io.StringIO("\n".join(ln for ln in lines[2:] if ln and not ln.startswith("#"))),
                              delimiter=" "):
            rec = dict(zip(header, row))
            addr = rec.get("srv_addr", "")
            if addr and addr != "-" and addr != "0.0.0.0":
                # srv_op_state: 0 stopped, 1 starting, 2 running (up), 3 stopping.
                out[addr] = "UP" if rec.get("srv_op_state") == "2" else "DOWN"
        return out

    def wait_up(self, addresses, timeout=UP_TIMEOUT_S):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"haproxy exited with {self.proc.returncode}:\n{self.log_text()[-3000:]}")
            try:
                last = self.servers()
            except OSError as e:
                last = repr(e)
            if isinstance(last, dict) and all(last.get(a) == "UP" for a in addresses):
                return
            time.sleep(0.1)
        raise ServerError(f"haproxy did not see {addresses} up within {timeout}s (last {last!r}); "
                          f"log:\n{self.log_text()[-3000:]}")

    def close(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if os.environ.get("ATRIUM_TEST_KEEP") != "1":
            shutil.rmtree(self.dir, ignore_errors=True)


class Cluster:
    """n Atrium processes on one database (and one media store with media=True) behind
    haproxy. settings and plugins apply to every process; each also gets its own
    server.instance_name ("atrium-1", ...) and trusts the balancer's X-Forwarded-For."""

    def __init__(self, n=3, settings=None, plugins=None, media=False):
        if not 1 <= n <= len(PROCESS_IPS):
            raise ValueError(f"1..{len(PROCESS_IPS)} processes")
        self.database = create_database()
        self.servers, self.lb, self.dns = [], None, None
        self.media_store = None
        try:
            self.ips = PROCESS_IPS[:n]
            self.port = port_free_on_all(self.ips)
            self.ops_port = port_free_on_all(self.ips)  # server.ops: the balancer's checks
            while self.ops_port == self.port:
                self.ops_port = port_free_on_all(self.ips)
            plugins = dict(plugins or {})
            if media:
                self.media_store = tempfile.mkdtemp(prefix="atrium-shared-media-",
                                                    dir=os.environ.get("ATRIUM_TEST_TMPDIR") or None)
                plugins["media"] = {"enabled": True, "store_path": self.media_store,
                                    **plugins.get("media", {})}
            for i, ip in enumerate(self.ips):
                own = {"server": {"instance_name": f"atrium-{i + 1}",
                                  "http": {"trusted_proxies": ["127.0.0.1", LB_IP]},
                                  "ops": {"enabled": True, "bind_address": ip,
                                          "port": self.ops_port}}}
                self.servers.append(Server(database=self.database, host=ip, port=self.port,
                                           settings=deep_merge(own, settings or {}),
                                           plugins=plugins or None, start=False))
            for srv in self.servers:  # all at once, as replicas start
                srv.launch()
            for srv in self.servers:
                srv.wait_healthy()
            self.dns = FakeDNS(ip="127.0.0.53", ttl=1)
            self.dns.records[(SERVICE, "A")] = list(self.ips)
            self.lb = Balancer(self.dns, self.port, self.ops_port)
            self.lb.wait_up(self.ips)
        except BaseException:
            self.close(raise_errors=False)
            raise

    @property
    def base(self):
        return self.lb.base

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close(raise_errors=exc_type is None)
        return False

    def close(self, raise_errors=True):
        if self.lb:
            self.lb.close()
            self.lb = None
        problems = []
        for srv in self.servers:
            try:
                srv.close(raise_errors=True)
            except ServerError as e:
                problems.append(str(e))
        self.servers = []
        if self.dns:
            self.dns.close()
            self.dns = None
        if self.database:
            drop_database(self.database)
            self.database = None
        if self.media_store:
            shutil.rmtree(self.media_store, ignore_errors=True)
            self.media_store = None
        if problems and raise_errors:
            raise ServerError("; ".join(problems))
