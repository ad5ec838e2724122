"""The deploy/ files for several processes, checked without a Docker engine:

  - deploy/haproxy.cfg is valid for haproxy with the Compose defaults (haproxy -c), and
    test_scaleout.py runs the same file;
  - deploy/docker-compose.scale.yml scales: the atrium service publishes no host port,
    haproxy does, mounts deploy/haproxy.cfg and finds the replicas by the service's
    name; replicas get longer to stop than the server's own grace, and are health-checked
    on /health;
  - deploy/atrium@.service passes systemd-analyze verify (as an instance, pointed at the
    build's binary) and keeps every hardening line of deploy/atrium.service.
"""

import ipaddress
import os
import re
import shutil
import subprocess
import tempfile
import unittest

from harness import REPO_ROOT, atrium_bin

DEPLOY = os.path.join(REPO_ROOT, "deploy")
SHUTDOWN_GRACE_DEFAULT_S = 10  # server.shutdown_grace_ms's default


def read(name):
    with open(os.path.join(DEPLOY, name), encoding="utf-8") as f:
        return f.read()


def block(text, key, indent):
    """The lines of the YAML mapping `key:` at `indent` spaces (a subset of YAML: what
    Compose files look like), without comments."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln == " " * indent + key + ":")
    out = []
    for ln in lines[start + 1:]:
        if ln.strip() and not ln.strip().startswith("#") and len(ln) - len(ln.lstrip()) <= indent:
            break
        if ln.strip() and not ln.strip().startswith("#"):
            out.append(ln)
    return out


def seconds(value):
    m = re.fullmatch(r"(\d+)(s|m)", value.strip())
    return int(m.group(1)) * (60 if m.group(2) == "m" else 1)


class DeployScaleOutTest(unittest.TestCase):
    def test_haproxy_cfg_is_valid_with_the_compose_defaults(self):
        haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
        if not os.path.exists(haproxy):
            self.fail("haproxy is not installed: run tests/run.sh (tests/lib/deps.sh installs it)")
        env = {k: v for k, v in os.environ.items() if not k.startswith("ATRIUM_LB_")}
        proc = subprocess.run([haproxy, "-c", "-f", os.path.join(DEPLOY, "haproxy.cfg")],
                              env=env, capture_output=True, text=True, timeout=30)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        cfg = read("haproxy.cfg")
        self.assertIn("option httpchk GET /health", cfg)
        self.assertEqual(cfg.count('check port "${ATRIUM_LB_CHECK_PORT-8009}"'), 2,
                         "both backends check the operational listener")
        self.assertRegex(cfg, r"server-template atrium .*\$\{ATRIUM_LB_SERVICE-atrium\}")
        self.assertNotRegex(cfg, r"\n\s*(cookie|stick)\b", "no stickiness")

    def test_the_scaled_compose_file_publishes_only_haproxys_ports(self):
        text = read("docker-compose.scale.yml")
        services = block(text, "services", 0)
        self.assertTrue(services)
        atrium = "\n".join(block(text, "atrium", 2))
        haproxy = "\n".join(block(text, "haproxy", 2))
        self.assertNotIn("ports:", atrium, "a fixed host port stops a second replica")
        self.assertNotIn("container_name", atrium, "a fixed name stops a second replica")
        self.assertIn("8008", atrium)
        # /health on the operational listener: client connections past the limit wait in
        # the accept queue, and a check behind them would take a busy replica for a dead one
        self.assertRegex(atrium, r'"http://127\.0\.0\.1:8009/health"')
        self.assertRegex(atrium, r'ATRIUM__SERVER__OPS__ENABLED:\s*"true"')
        self.assertRegex(atrium, r'ATRIUM__SERVER__OPS__BIND_ADDRESS:\s*"0\.0\.0\.0"')
        grace = re.search(r"stop_grace_period:\s*(\S+)", atrium)
        self.assertIsNotNone(grace)
        self.assertGreater(seconds(grace.group(1)), SHUTDOWN_GRACE_DEFAULT_S,
                           "Compose must wait longer than the server drains")
        self.assertIn("atrium-data:/data", atrium, "replicas share one data volume (media store)")
        self.assertIn("ports:", haproxy)
        # loopback by default; ATRIUM_HTTP_PUBLISH moves it (test_deploy_podman.py does)
        self.assertIn('"${ATRIUM_HTTP_PUBLISH:-127.0.0.1:8008}:8008"', haproxy)
        self.assertIn("./haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro", haproxy)
        self.assertIn("ATRIUM_LB_SERVICE: atrium", haproxy)
        # The replicas trust exactly haproxy's fixed address.
        lb = re.search(r"ipv4_address:\s*\$\{ATRIUM_LB_ADDRESS:-([0-9.]+)\}", haproxy)
        self.assertIsNotNone(lb)
        self.assertIn(f"TRUSTED_PROXIES: \"[${{ATRIUM_LB_ADDRESS:-{lb.group(1)}}}]\"", atrium)
        # Containers started before haproxy take addresses from a range without its own.
        pool = re.search(r"ip_range:\s*\$\{ATRIUM_NET_IP_RANGE:-([0-9.]+/[0-9]+)\}", text)
        self.assertIsNotNone(pool)
        self.assertNotIn(ipaddress.ip_address(lb.group(1)), ipaddress.ip_network(pool.group(1)))

    def test_the_systemd_template_verifies_and_keeps_the_single_units_hardening(self):
        template = read("atrium@.service")
        single = read("atrium.service")
        service = single[single.index("[Service]"):single.index("[Install]")]
        for line in service.splitlines():
            line = line.strip()
            if line and not line.startswith("#") and not line.startswith("ExecStart="):
                self.assertIn(line, template.splitlines(), f"atrium@.service lacks {line!r}")
        self.assertIn("Environment=ATRIUM__SERVER__INSTANCE_NAME=%H-%i", template)
        self.assertIn("EnvironmentFile=/etc/atrium/atrium@%i.env", template)
        analyze = shutil.which("systemd-analyze")
        if not analyze:
            self.skipTest("systemd-analyze is not installed: the unit's syntax is not checked")
        with tempfile.TemporaryDirectory() as d:
            unit = (template.replace("/usr/local/bin/atrium", atrium_bin())
                    .replace("/etc/atrium/atrium@%i.env", os.path.join(d, "atrium@%i.env")))
            with open(os.path.join(d, "atrium@.service"), "w", encoding="utf-8") as f:
                f.write(unit)
            with open(os.path.join(d, "atrium@2.env"), "w", encoding="utf-8") as f:
                f.write("ATRIUM__SERVER__HTTP__PORT=8082\n")
            proc = subprocess.run([analyze, "verify", os.path.join(d, "atrium@2.service")],
                                  cwd=d, capture_output=True, text=True, timeout=60)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertEqual((proc.stdout + proc.stderr).strip(), "",
                         "systemd-analyze verify reported something")


if __name__ == "__main__":
    unittest.main()
