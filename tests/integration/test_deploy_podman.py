"""The deploy/ Compose files run for real (ctest label `deploy`): podman instead of a Docker
engine, no registry.

  1. Debian's podman, docker-compose and debootstrap (tests/lib/deps.sh,
     ATRIUM_DEPLOY_TEST_PACKAGES) are installed where missing; where they cannot be, or
     podman cannot run a container here, the test skips and says why.
  2. A Debian 12 base image is made with debootstrap from the mirror apt uses, once per
     machine: kept as localhost/atrium-test/debian:bookworm and as a tar under
     /var/cache/atrium-test/ (ATRIUM_DEPLOY_CACHE), remade after 30 days.
  3. The images are built from the project's Dockerfiles on it (deploy/Dockerfile,
     deploy/rgw/Dockerfile; tests/deploy/ stands in for postgres:15 and haproxy:2.6), at
     the lowest CPU priority; podman's layer cache reuses every step whose inputs did not
     change, and the Atrium build's ccache mount recompiles only changed files.
  4. docker-compose, on podman's Docker-compatible socket, brings up
     deploy/docker-compose.scale.yml with deploy/docker-compose.s3.yml (and
     tests/deploy/compose.podman.yml: the local images, podman's DNS, test settings):
     PostgreSQL, the S3 service, three Atrium replicas with storage: s3, haproxy.
  5. The matrix-js-sdk suite (tests/e2e/*.test.mjs, as test_e2e_jssdk.py runs it) runs
     through haproxy; a file uploaded through one replica downloads byte for byte through
     the two others (each with its own cache folder: read through from the bucket) and is
     in the bucket.
  6. Everything is torn down (containers, volumes, network, the podman service), also when
     a step fails; leftovers of a killed earlier run are removed before the start.
Why it is built this way: docs/adr/0033-deploy-tested-with-podman.md.
"""

import datetime
import fcntl
import hashlib
import hmac
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor

from common import wait_until
from harness import REPO_ROOT

CACHE_DIR = os.environ.get("ATRIUM_DEPLOY_CACHE", "/var/cache/atrium-test")
PREFIX = "localhost/atrium-test"
BASE_IMAGE = f"{PREFIX}/debian:bookworm"
BASE_MAX_AGE_S = 30 * 86400
PROJECT = "atrium-deploy-test"
# haproxy's published ports, on an address no other test uses.
LB_HOST, LB_PORT, LB_FED_PORT = "127.0.33.1", 18008, 18448
SUBNET, GATEWAY, LB_ADDRESS = "172.28.240.0/24", "172.28.240.1", "172.28.240.2"
REPLICAS = 3
S3_SECRET = "atrium-deploy-test-secret-not-for-production"
E2E_DIR = os.path.join(REPO_ROOT, "tests", "e2e")
COMPOSE_FILES = ["deploy/docker-compose.scale.yml", "deploy/docker-compose.s3.yml",
                 "tests/deploy/compose.podman.yml"]
# What each image is built from: (name, Dockerfile).
IMAGES = [("atrium:latest", "deploy/Dockerfile"), ("s3:latest", "deploy/rgw/Dockerfile"),
          ("postgres:15", "tests/deploy/postgres/Dockerfile"),
          ("haproxy:2.6", "tests/deploy/haproxy/Dockerfile")]
# The limits podman gives containers: rootful podman asks for 1,048,576 descriptors,
# more than a process here may have; and crun fails on this kernel's cgroup layout.
CONTAINERS_CONF = """[containers]
default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]
[engine]
runtime = "runc"
"""
# Like debian:12-slim: no documentation, manual pages or translations in the images.
DPKG_EXCLUDES = """path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
"""


def log(msg):
    print(f"[deploy] {time.strftime('%H:%M:%S')} {msg}", flush=True)


def run(args, timeout=600, check=True, env=None, input=None):
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env,
                          input=input)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args[:6])} ... exited with {proc.returncode}:\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


class Skip(Exception):
    """Podman cannot be installed or run here."""


class Podman:
    """podman with this test's containers.conf; its Docker-compatible service on a socket."""

    def __init__(self, workdir):
        self.workdir = workdir
        conf = os.path.join(workdir, "containers.conf")
        nofile = min(20000, _hard_limit("-Hn"))
        nproc = min(32768, _hard_limit("-Hu"))
        with open(conf, "w", encoding="utf-8") as f:
            f.write(CONTAINERS_CONF.format(nofile=nofile, nproc=nproc))
        self.env = {**os.environ, "CONTAINERS_CONF": conf}
        self.socket = os.path.join(workdir, "podman.sock")
        self.service = None

    def __call__(self, *args, timeout=600, check=True, input=None):
        return run(["podman", *args], timeout=timeout, check=check, env=self.env, input=input)

    def start_service(self):
        self.service_log = open(os.path.join(self.workdir, "podman-service.log"), "w",
                                encoding="utf-8")
        # At the lowest priority: so is every container it starts (they are its children).
        self.service = subprocess.Popen(
            ["nice", "-n", "19", "podman", "system", "service", "--time=0",
             f"unix://{self.socket}"], env=self.env, stdout=subprocess.DEVNULL,
            stderr=self.service_log)
        deadline = time.monotonic() + 30
        while not os.path.exists(self.socket):
            if self.service.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("podman system service did not start: " +
                                     _tail(os.path.join(self.workdir, "podman-service.log")))
            time.sleep(0.1)

    def stop_service(self):
        if self.service is not None and self.service.poll() is None:
            self.service.terminate()
            try:
                self.service.wait(10)
            except subprocess.TimeoutExpired:
                self.service.kill()
                self.service.wait()
        if self.service is not None:
            self.service_log.close()


def _hard_limit(flag):
    out = run(["bash", "-c", f"ulimit {flag}"]).stdout.strip()
    return 1 << 30 if out == "unlimited" else int(out)


def _tail(path, n=3000):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return ""


def install_packages():
    """tests/lib/deps.sh's ATRIUM_DEPLOY_TEST_PACKAGES, where missing; Skip if impossible."""
    script = ('. tests/lib/deps.sh && atrium_need_packages "${ATRIUM_DEPLOY_TEST_PACKAGES[@]}"')
    proc = subprocess.run(["bash", "-c", script], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=900)
    if proc.returncode != 0:
        raise Skip("podman, docker-compose or debootstrap could not be installed: " +
                   proc.stderr.strip()[-500:])


def apt_sources():
    """The host's apt sources (file name -> text) and the Debian mirror they name."""
    files, mirror = {}, None
    candidates = ["/etc/apt/sources.list"] + sorted(
        os.path.join("/etc/apt/sources.list.d", n) for n in os.listdir("/etc/apt/sources.list.d")
        if n.endswith((".list", ".sources")))
    for path in candidates:
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as f:
            text = f.read()
        files[path] = text
        for line in text.splitlines():
            words = line.split()
            if mirror is None and words and words[0] in ("URIs:", "deb") and len(words) > 1:
                url = words[1] if words[0] == "URIs:" else next(
                    (w for w in words[1:] if "://" in w), None)
                if url and "security" not in url:
                    mirror = url
    return files, mirror or "http://deb.debian.org/debian"


def slim(rootfs):
    """Drops from a fresh debootstrap what DPKG_EXCLUDES keeps out of later installs, and
    apt's lists and downloads (the images' own `apt-get update` fetches fresh lists)."""
    keep = ("copyright", "locale.alias")
    for sub in ("var/lib/apt/lists", "var/cache/apt", "usr/share/doc", "usr/share/man",
                "usr/share/info", "usr/share/locale"):
        for root, _, files in os.walk(os.path.join(rootfs, sub)):
            for name in files:
                if name not in keep:
                    os.remove(os.path.join(root, name))


def ensure_base_image(podman):
    """localhost/atrium-test/debian:bookworm from the cache, or made with debootstrap."""
    sources, mirror = apt_sources()
    key = hashlib.sha256(json.dumps([mirror, sources, DPKG_EXCLUDES]).encode()).hexdigest()[:16]
    tar = os.path.join(CACHE_DIR, f"debian-bookworm-minbase-{key}.tar")
    have = podman("image", "inspect", "--format", '{{index .Labels "atrium.base.key"}}',
                  BASE_IMAGE, check=False)
    fresh = os.path.exists(tar) and time.time() - os.path.getmtime(tar) < BASE_MAX_AGE_S
    if have.returncode == 0 and have.stdout.strip() == key and fresh:
        return "reused"
    made = "imported from the cache"
    if not fresh:
        made = "made with debootstrap"
        for old in os.listdir(CACHE_DIR):
            if old.startswith("debian-bookworm-minbase-"):
                os.remove(os.path.join(CACHE_DIR, old))
        rootfs = os.path.join(CACHE_DIR, "rootfs.tmp")
        shutil.rmtree(rootfs, ignore_errors=True)
        run(["debootstrap", "--variant=minbase", "bookworm", rootfs, mirror], timeout=900)
        for path, text in sources.items():
            with open(rootfs + path, "w", encoding="utf-8") as f:
                f.write(text)
        with open(os.path.join(rootfs, "etc/dpkg/dpkg.cfg.d/atrium-slim"), "w",
                  encoding="utf-8") as f:
            f.write(DPKG_EXCLUDES)
        slim(rootfs)
        run(["tar", "-C", rootfs, "--numeric-owner", "-cf", tar + ".part", "."], timeout=300)
        os.replace(tar + ".part", tar)
        shutil.rmtree(rootfs, ignore_errors=True)
    podman("import", "--change", f"LABEL atrium.base.key={key}", "--change", 'CMD ["bash"]',
           tar, BASE_IMAGE, timeout=300)
    return made


def build_images(podman):
    """Builds the four images at the lowest CPU priority, side by side; returns each
    build's seconds."""
    def build(item):
        name, dockerfile = item
        t0 = time.monotonic()
        proc = run(["nice", "-n", "19", "podman", "build", "--format", "docker", "--layers",
                    "--jobs=2", "--pull=never", "--build-arg", f"BASE_IMAGE={BASE_IMAGE}",
                    "-f", dockerfile,
                    "-t", f"{PREFIX}/{name}", REPO_ROOT], env=podman.env, timeout=1800,
                   check=False)
        if proc.returncode != 0:
            raise AssertionError(f"building {name} from {dockerfile} failed:\n"
                                 f"{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}")
        return name, round(time.monotonic() - t0, 1)
    with ThreadPoolExecutor(len(IMAGES)) as pool:
        times = dict(pool.map(build, IMAGES))
    # Steps of earlier builds that nothing uses any more (the sources changed since):
    # dropped after a day, so the layer cache stays bounded.
    podman("image", "prune", "-f", "--filter", "until=24h", check=False)
    return times


class Compose:
    """docker-compose on podman's socket, for this test's project and files."""

    def __init__(self, podman):
        self.podman = podman
        self.env = {**podman.env, "DOCKER_HOST": f"unix://{podman.socket}",
                    "COMPOSE_PROJECT_NAME": PROJECT,
                    "ATRIUM_SERVER_NAME": "localhost", "ATRIUM_DB_PASSWORD": "deploy-test-pw",
                    "ATRIUM_S3_SECRET_KEY": S3_SECRET,
                    "ATRIUM_HTTP_PUBLISH": f"{LB_HOST}:{LB_PORT}",
                    "ATRIUM_FED_PUBLISH": f"{LB_HOST}:{LB_FED_PORT}",
                    "ATRIUM_NET_SUBNET": SUBNET, "ATRIUM_LB_ADDRESS": LB_ADDRESS,
                    "ATRIUM_TEST_LB_DNS": f"{GATEWAY}:53",
                    "ATRIUM_S3_MEMORY_BYTES": str(256 << 20)}
        # Debian's docker-compose (1.29) predates the top-level `name:` of Compose v2: it
        # reads copies without that line, the project named by COMPOSE_PROJECT_NAME, and
        # relative paths resolved from deploy/ as for the files themselves.
        self.files = ["--project-directory", os.path.join(REPO_ROOT, "deploy")]
        for i, name in enumerate(COMPOSE_FILES):
            with open(os.path.join(REPO_ROOT, name), encoding="utf-8") as f:
                lines = [ln for ln in f if not ln.startswith("name:")]
            copy = os.path.join(podman.workdir, f"{i}-{os.path.basename(name)}")
            with open(copy, "w", encoding="utf-8") as f:
                f.writelines(lines)
            self.files += ["-f", copy]

    def __call__(self, *args, timeout=600, check=True):
        return run(["docker-compose", *self.files, *args], timeout=timeout, check=check,
                   env=self.env)

    def containers(self, service=None):
        """{name: id} of the project's containers (of one service)."""
        filters = ["--filter", f"label=com.docker.compose.project={PROJECT}"]
        if service:
            filters += ["--filter", f"label=com.docker.compose.service={service}"]
        out = self.podman("ps", "-a", *filters, "--format", "{{.Names}} {{.ID}}").stdout
        return dict(line.split() for line in out.splitlines() if line.strip())

    def ip(self, container):
        return self.podman("inspect", "--format",
                           "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                           container).stdout.strip()

    def down(self):
        """Removes everything of the project, whatever state an earlier run left it in."""
        self("down", "--volumes", "--remove-orphans", "--timeout", "15", check=False)
        ids = list(self.containers().values())
        if ids:
            self.podman("rm", "-f", "-v", *ids, check=False)
        for kind in ("volume", "network"):
            out = self.podman(kind, "ls", "--filter", f"label=com.docker.compose.project={PROJECT}",
                              "--format", "{{.Name}}", check=False).stdout.split()
            if out:
                self.podman(kind, "rm", "-f", *out, check=False)

    def logs(self):
        return self("logs", "--no-color", "--tail", "40", check=False).stdout[-12000:]


class HealthRunner(threading.Thread):
    """Runs the containers' health checks: podman schedules them with systemd timers, and
    there is no systemd here, so without this every container stays "starting" and
    `depends_on: condition: service_healthy` waits for ever."""

    def __init__(self, compose):
        super().__init__(daemon=True)
        self.compose = compose
        self.stopping = threading.Event()

    def run(self):
        while not self.stopping.wait(1.0):
            try:
                out = self.compose.podman(
                    "ps", "--filter", f"label=com.docker.compose.project={PROJECT}",
                    "--format", "{{.ID}} {{.Status}}").stdout.splitlines()
                for line in out:
                    if "(starting)" in line or "(unhealthy)" in line:
                        self.compose.podman("healthcheck", "run", line.split()[0],
                                            check=False, timeout=30)
            except (AssertionError, subprocess.SubprocessError):
                pass

    def stop(self):
        self.stopping.set()
        if self.is_alive():
            self.join(40)


def http(method, url, body=None, token=None, headers=None, timeout=30):
    req = urllib.request.Request(url, data=body, method=method, headers=dict(headers or {}))
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, OSError) as e:
        return 0, str(e).encode()


def register(base):
    """A new account (m.login.dummy, after the first 401 names the session); its token."""
    body = {"username": f"deploy{uuid.uuid4().hex[:10]}", "password": "pw-deploy-secret"}
    url, headers = f"{base}/_matrix/client/v3/register", {"Content-Type": "application/json"}
    status, out = http("POST", url, json.dumps(body).encode(), headers=headers)
    if status != 401:
        raise AssertionError(f"/register without auth through {base} answered {status}: "
                             f"{out[:300]!r}")
    body["auth"] = {"type": "m.login.dummy", "session": json.loads(out).get("session")}
    status, out = http("POST", url, json.dumps(body).encode(), headers=headers)
    if status != 200:
        raise AssertionError(f"/register through {base} answered {status}: {out[:300]!r}")
    return json.loads(out)["access_token"]


def s3_get(endpoint, bucket, key):
    """GET of one object, signed with AWS Signature V4 (the test's own, stdlib only)."""
    host = endpoint.split("://", 1)[1]
    now = datetime.datetime.now(datetime.timezone.utc)
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    payload = hashlib.sha256(b"").hexdigest()
    path = f"/{bucket}/{key}"
    canonical = (f"GET\n{path}\n\nhost:{host}\nx-amz-content-sha256:{payload}\n"
                 f"x-amz-date:{amz_date}\n\nhost;x-amz-content-sha256;x-amz-date\n{payload}")
    scope = f"{day}/us-east-1/s3/aws4_request"
    to_sign = (f"AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n"
               f"{hashlib.sha256(canonical.encode()).hexdigest()}")
    k = ("AWS4" + S3_SECRET).encode()
    for part in (day, "us-east-1", "s3", "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
    auth = (f"AWS4-HMAC-SHA256 Credential=atrium/{scope}, "
            f"SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature={signature}")
    return http("GET", f"{endpoint}{path}", headers={
        "x-amz-date": amz_date, "x-amz-content-sha256": payload, "Authorization": auth})


def wait_for(what, predicate, timeout, interval=0.5):
    return wait_until(predicate, timeout=timeout, interval=interval, what=what)


class DeployPodmanTest(unittest.TestCase):
    def skip(self, why):
        print(f"SKIPPED: {why}", flush=True)
        self.skipTest(why)

    def test_scaled_out_compose_with_s3_serves_the_js_sdk_and_shares_media(self):
        if not os.path.isdir(os.path.join(E2E_DIR, "node_modules", "matrix-js-sdk")):
            self.fail("tests/e2e/node_modules is missing: run tests/run.sh (it runs npm ci)")
        t0 = time.monotonic()
        try:
            install_packages()
        except Skip as e:
            self.skip(f"the deploy test did not run: {e}")
        os.makedirs(CACHE_DIR, exist_ok=True)
        # One run at a time per machine: the project name, ports and subnet are fixed.
        lock = open(os.path.join(CACHE_DIR, "lock"), "w", encoding="utf-8")
        self.addCleanup(lock.close)
        fcntl.flock(lock, fcntl.LOCK_EX)
        work = tempfile.mkdtemp(prefix="atrium-deploy-")
        self.addCleanup(shutil.rmtree, work, True)
        podman = Podman(work)
        phases = {"packages": time.monotonic() - t0}

        t = time.monotonic()
        base = ensure_base_image(podman)
        phases["base image"] = time.monotonic() - t
        smoke = podman("run", "--rm", "--network", "none", BASE_IMAGE, "true", check=False)
        if smoke.returncode != 0:
            self.skip("podman cannot run a container on this machine: " +
                      smoke.stderr.strip()[-500:])
        t = time.monotonic()
        builds = build_images(podman)
        phases["images"] = time.monotonic() - t
        log(f"base image {base}; builds (s): {builds}")

        podman.start_service()
        self.addCleanup(podman.stop_service)
        compose = Compose(podman)
        compose.down()
        self.addCleanup(self.tear_down, compose, phases)
        health = HealthRunner(compose)
        health.start()
        self.addCleanup(health.stop)
        try:
            self.bring_up(compose, phases)
            health.stop()  # nothing waits on a health state any more
            self.run_js_sdk(phases)
            self.upload_through_one_download_through_others(compose, phases)
        except BaseException:
            print(compose.logs(), flush=True)
            raise
        log("phases (s): " + ", ".join(f"{k} {v:.1f}" for k, v in phases.items()))

    def tear_down(self, compose, phases):
        t = time.monotonic()
        compose.down()
        phases["down"] = time.monotonic() - t
        log(f"down in {phases['down']:.1f}s")

    def bring_up(self, compose, phases):
        t = time.monotonic()
        up = compose("up", "-d", "--no-build", "--scale", f"atrium={REPLICAS}", timeout=600,
                     check=False)
        self.assertEqual(up.returncode, 0, f"docker-compose up failed:\n{up.stderr[-4000:]}")
        replicas = compose.containers("atrium")
        self.assertEqual(len(replicas), REPLICAS, replicas)
        for name in replicas:
            ip = compose.ip(name)
            wait_for(f"{name} answering /health", lambda: http(
                "GET", f"http://{ip}:8009/health", timeout=5)[0] == 200, 120)
        lb = f"http://{LB_HOST}:{LB_PORT}"
        wait_for("haproxy answering /versions", lambda: http(
            "GET", f"{lb}/_matrix/client/versions", timeout=5)[0] == 200, 60)
        # Replicas starting at once on one volume (one config, one signing key) start once.
        for name in replicas:
            restarts = compose.podman("inspect", "--format", "{{.RestartCount}}", name)
            self.assertEqual(restarts.stdout.strip(), "0", f"{name} had to be restarted")
        phases["up"] = time.monotonic() - t
        log(f"up in {phases['up']:.1f}s: {sorted(replicas)} behind haproxy at {lb}")

    def run_js_sdk(self, phases):
        t = time.monotonic()
        tests = sorted(f for f in os.listdir(E2E_DIR) if f.endswith(".test.mjs"))
        proc = subprocess.run(["node", "--test", "--test-force-exit", "--test-reporter=spec",
                               *tests],
                              cwd=E2E_DIR, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "ATRIUM_URL": f"http://{LB_HOST}:{LB_PORT}"})
        print(proc.stdout[-3000:])
        self.assertEqual(proc.returncode, 0, f"node --test through haproxy failed:\n"
                         f"{proc.stdout[-4000:]}\n{proc.stderr[-3000:]}")
        phases["js-sdk"] = time.monotonic() - t

    def upload_through_one_download_through_others(self, compose, phases):
        t = time.monotonic()
        replicas = sorted(compose.containers("atrium"))
        bases = [f"http://{compose.ip(name)}:8008" for name in replicas]
        token = register(f"http://{LB_HOST}:{LB_PORT}")
        # Above the 8 MiB part size: a multipart upload to the bucket.
        data = os.urandom(9 << 20)
        status, body = http("POST", f"{bases[0]}/_matrix/media/v3/upload", data, token,
                            {"Content-Type": "application/octet-stream"}, timeout=120)
        self.assertEqual(status, 200, body[:300])
        media_id = json.loads(body)["content_uri"].removeprefix("mxc://localhost/")
        cached = f"/var/cache/atrium/media/local/{media_id[0:2]}/{media_id[2:4]}/{media_id}"
        for name, base in zip(replicas[1:], bases[1:]):
            # Each replica's cache folder is its own: this one must read the bucket.
            probe = compose.podman("exec", name, "test", "-e", cached, check=False)
            self.assertNotEqual(probe.returncode, 0, f"{name} has the file before asking")
            status, got = http("GET", f"{base}/_matrix/client/v1/media/download/localhost/"
                               f"{media_id}", token=token, timeout=120)
            self.assertEqual(status, 200, got[:300])
            self.assertEqual(len(got), len(data), name)
            self.assertTrue(got == data, f"{name} served other bytes")
        s3 = next(iter(compose.containers("s3")))
        status, stored = s3_get(f"http://{compose.ip(s3)}:8000", "atrium-media",
                                f"originals/{media_id}")
        self.assertEqual(status, 200, stored[:300])
        self.assertTrue(stored == data, "the bucket holds other bytes")
        phases["media"] = time.monotonic() - t


if __name__ == "__main__":
    unittest.main()
