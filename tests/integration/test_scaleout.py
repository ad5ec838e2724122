"""Several Atrium processes behind haproxy (cluster_support.py: deploy/haproxy.cfg on
127.0.0.40, processes on 127.0.0.41-43, one database, one media store):

  - requests through the balancer are spread over every process (no stickiness), each
    process names itself in its log and in /metrics;
  - the matrix-js-sdk end-to-end tests (tests/e2e, unchanged) pass through the balancer;
  - a process stopped with SIGTERM drains: requests through the balancer keep succeeding
    while it stops (its 503s are retried elsewhere, its health check fails);
  - the process running the once-only jobs is killed (SIGKILL): another takes their
    leases within server.lease_ttl_ms, and the typing reaper's job (a typing notice that
    runs out) is done by it; a plugin's lease (ABI 1.3 lease_create, lease_held, through
    tests/plugins/testplug.c) behaves the same;
  - an event sent through a process that does not hold the lease of the peer's sender
    group reaches the peer promptly: the kick travels to the holder's sender as a
    notification (not at its 5 s poll). How the groups are shared out and taken over:
    tests/integration/test_federation_senders.py.
"""

import os
import shutil
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.parse

import harness
from accounts import register
from cluster_support import Cluster
from common import testplug, wait_until
from federation_support import FakeReceivingPeer, sender_group
from harness import REPO_ROOT, Server
from media_support import png
from rooms_client import Client
from test_federation import FederationTestCase

E2E_DIR = os.path.join(REPO_ROOT, "tests", "e2e")
V3 = "/_matrix/client/v3"
LEASE_TTL_MS = 3000
SENDER_GROUPS = 16  # federation.sender_groups' default
TAKEOVER_SLACK_S = 1.5  # scheduling and polling on a loaded 2-core machine


class Endpoint:
    """The balancer seen as one server: Server's request helpers on its address."""

    def __init__(self, host, port):
        self.host, self.port = host, port

    request = Server.request
    json = Server.json


def q(value):
    return urllib.parse.quote(value, safe="")


def lease_holders(cluster, lease):
    return [s for s in cluster.servers
            if s.running() and s.metric("atrium_lease_held", {"lease": lease}) == 1]


def sender_groups_held(servers):
    """The federation sender's destination groups held by the running processes, in all."""
    return sum(s.metric("atrium_federation_outbound_groups_held") for s in servers if s.running())


class ScaleOutTest(unittest.TestCase):
    def start_cluster(self, **kwargs):
        cluster = Cluster(**kwargs)
        self.addCleanup(cluster.close)
        return cluster

    def assert_requests_spread_and_each_process_names_itself(self, c):
        lb = Endpoint(c.lb.ip, c.lb.port)
        before = [s.metric("atrium_http_requests_total") for s in c.servers]
        for _ in range(30):
            status, body = lb.json("GET", "/_matrix/client/versions")
            self.assertEqual(status, 200)
            self.assertIn("versions", body)
        after = [s.metric("atrium_http_requests_total") for s in c.servers]
        served = [a - b for a, b in zip(after, before)]
        # roundrobin: every process served its share (health checks add a few of their own)
        self.assertTrue(all(n >= 8 for n in served), f"requests per process: {served}")
        for i, srv in enumerate(c.servers):
            name = f"atrium-{i + 1}"
            self.assertEqual(srv.metric("atrium_instance_info", {"instance": name}), 1)
            self.assertRegex(srv.log_text(), rf"Z {name} INFO  core ready")

    def test_matrix_js_sdk_end_to_end_tests_pass_through_the_balancer(self):
        if not os.path.isdir(os.path.join(E2E_DIR, "node_modules", "matrix-js-sdk")):
            self.fail("tests/e2e/node_modules is missing: run tests/run.sh (it runs npm ci)")
        # tokens.test.mjs signs a second device in with a login token: off by default
        c = self.start_cluster(n=3, settings={"registration": {"enabled": True},
                                              "auth": {"login_via_existing_session": True}},
                               plugins={"directory": {"enabled": True}}, media=True)
        tests = sorted(f for f in os.listdir(E2E_DIR) if f.endswith(".test.mjs"))
        with tempfile.NamedTemporaryFile(suffix=".png") as image:
            image.write(png(400, 300))
            image.flush()
            proc = subprocess.run(
                ["node", "--test", "--test-force-exit", "--test-reporter=spec", *tests,
                 "media.e2e.mjs"],
                cwd=E2E_DIR, env={**os.environ, "ATRIUM_URL": c.base, "MEDIA_E2E_PNG": image.name},
                capture_output=True, text=True, timeout=420)
        print(proc.stdout[-8000:])
        served = [s.metric("atrium_http_requests_total") for s in c.servers]
        self.assertEqual(proc.returncode, 0,
                         f"node --test through haproxy failed (requests per process {served}):\n"
                         f"{proc.stdout[-5000:]}\n{proc.stderr[-3000:]}")
        self.assertTrue(all(n > 20 for n in served), f"requests per process: {served}")

    def test_requests_are_spread_and_a_process_stopping_with_sigterm_is_drained(self):
        # One cluster for both (three starts each): the spread first, then the stop.
        c = self.start_cluster(n=3)
        self.assert_requests_spread_and_each_process_names_itself(c)
        lb = Endpoint(c.lb.ip, c.lb.port)
        statuses, stop = [], threading.Event()

        def load():
            while not stop.is_set():
                statuses.append(lb.json("GET", "/_matrix/client/versions")[0])

        workers = [threading.Thread(target=load, daemon=True) for _ in range(4)]
        for w in workers:
            w.start()
        wait_until(lambda: len(statuses) >= 50, what="load flowing through the balancer")
        stopping = c.servers[1]
        self.assertEqual(stopping.stop(), 0)
        n_at_stop = len(statuses)
        wait_until(lambda: len(statuses) >= n_at_stop + 100, timeout=20,
                   what="load after the stop")
        stop.set()
        for w in workers:
            w.join(10)
        failed = [s for s in statuses if s != 200]
        self.assertEqual(failed, [], f"{len(failed)} of {len(statuses)} requests failed")
        wait_until(lambda: c.lb.servers().get(stopping.host) == "DOWN", timeout=10,
                   what="haproxy marks the stopped process down")

    def test_killed_lease_holders_jobs_and_a_plugins_lease_are_taken_over_within_the_lease(self):
        # One cluster for both (three starts each): the core's once-only jobs' holder is
        # killed first, then, of the two left, the holder of the plugin's lease.
        c = self.start_cluster(n=3, settings={"registration": {"enabled": True},
                                              "server": {"lease_ttl_ms": LEASE_TTL_MS}},
                               plugins=testplug(lease_ttl_ms=LEASE_TTL_MS))
        holder = wait_until(lambda: lease_holders(c, "core.typing_reaper"), timeout=10,
                            what="a typing reaper lease holder")
        self.assertEqual(len(holder), 1, "one process holds the lease")
        holder = holder[0]
        wait_until(lambda: sender_groups_held(c.servers) == SENDER_GROUPS, timeout=10,
                   what="every federation sender group held")
        survivor = next(s for s in c.servers if s is not holder)

        alice = register(survivor, "alice")
        _, created = survivor.json("POST", f"{V3}/createRoom", {}, token=alice.token)
        room = created["room_id"]
        # A typing notice set through the holder, running out after it is gone.
        status, _ = holder.json("PUT", f"{V3}/rooms/{q(room)}/typing/{q(alice.user_id)}",
                                {"typing": True, "timeout": 2000}, token=alice.token)
        self.assertEqual(status, 200)
        _, first = survivor.json("GET", f"{V3}/sync?timeout=0", token=alice.token)
        typing = [e for e in first["rooms"]["join"][room]["ephemeral"]["events"]
                  if e["type"] == "m.typing"]
        self.assertEqual(typing[0]["content"]["user_ids"], [alice.user_id])

        killed_at = time.monotonic()
        holder.kill()
        took_over = wait_until(lambda: lease_holders(c, "core.typing_reaper"),
                               timeout=LEASE_TTL_MS / 1000 + 5, interval=0.05,
                               what="another process holding core.typing_reaper")
        took = time.monotonic() - killed_at
        self.assertLessEqual(took, LEASE_TTL_MS / 1000 + TAKEOVER_SLACK_S,
                             f"taken over {took:.2f} s after the kill")
        self.assertEqual(len(took_over), 1)
        self.assertRegex(took_over[0].log_text(), r"lease core\.typing_reaper taken")
        # Every once-only job has a live holder again, and so has every sender group (the
        # killed process held some).
        wait_until(lambda: sender_groups_held(c.servers) == SENDER_GROUPS,
                   timeout=LEASE_TTL_MS / 1000 + TAKEOVER_SLACK_S,
                   what="every federation sender group held by a live process")

        # The job's effect: the notice that ran out is reported by the new holder.
        since = [first["next_batch"]]

        def stopped_typing():
            _, body = survivor.json("GET", f"{V3}/sync?timeout=0&since={q(since[0])}",
                                    token=alice.token)
            since[0] = body["next_batch"]
            events = body.get("rooms", {}).get("join", {}).get(room, {}).get("ephemeral", {}).get("events", [])
            return any(e["type"] == "m.typing" and e["content"]["user_ids"] == [] for e in events)

        wait_until(stopped_typing, timeout=LEASE_TTL_MS / 1000 + 5, interval=0.1,
                   what="the typing notice reported as run out")
        self.assertLessEqual(time.monotonic() - killed_at, LEASE_TTL_MS / 1000 + 2 + TAKEOVER_SLACK_S)
        self.assert_a_plugins_lease_is_held_by_one_process_and_moves_when_it_dies(c)

    def assert_a_plugins_lease_is_held_by_one_process_and_moves_when_it_dies(self, c):
        def holders():
            out = []
            for s in c.servers:
                if s.running():
                    status, body = s.json("GET", "/_test/lease")
                    self.assertEqual(status, 200)
                    self.assertEqual(body["instance"], f"atrium-{c.servers.index(s) + 1}")
                    if body["held"] == 1:
                        out.append(s)
            return out

        first = wait_until(holders, timeout=10, what="a holder of the plugin's lease")
        self.assertEqual(len(first), 1)
        self.assertEqual(first[0].metric("atrium_lease_held", {"lease": "plugin.testplug.test.job"}), 1)
        killed_at = time.monotonic()
        first[0].kill()
        second = wait_until(holders, timeout=LEASE_TTL_MS / 1000 + 5, interval=0.05,
                            what="another holder of the plugin's lease")
        took = time.monotonic() - killed_at
        self.assertEqual(len(second), 1)
        self.assertIsNot(second[0], first[0])
        self.assertLessEqual(took, LEASE_TTL_MS / 1000 + TAKEOVER_SLACK_S,
                             f"taken over {took:.2f} s after the kill")


FED_IPS = ("127.0.0.44", "127.0.0.45")  # the two processes' federation listeners
PEER_IP = "127.0.0.46"
PROMPT_DELIVERY_S = 1.5  # well under the sender's 5 s poll


class CrossProcessSenderTest(FederationTestCase):
    def test_an_event_sent_through_a_process_without_the_peers_sender_group_reaches_it_promptly(self):
        peer = FakeReceivingPeer(self.ca, PEER_IP)
        self.addCleanup(peer.close)
        db = harness.create_database()
        self.addCleanup(harness.drop_database, db)
        shared = tempfile.mkdtemp(prefix="atrium-shared-key-")
        self.addCleanup(shutil.rmtree, shared, True)
        extra = {"federation": {"signing_key_path": os.path.join(shared, "cluster.signing.key")},
                 "server": {"lease_ttl_ms": LEASE_TTL_MS}}
        procs = [self.start_fed(ip, extra=extra, name="cluster.test", database=db, start=False)
                 for ip in FED_IPS]
        for p in procs:
            p.start()
        lease = f"core.federation.outbound.{sender_group(peer.server_name)}"
        # Shared out: each of the two holds 8 groups, the peer's in one of them.
        wait_until(lambda: [p.metric("atrium_federation_outbound_groups_held") for p in procs]
                   == [SENDER_GROUPS // 2] * 2, timeout=20, interval=0.1,
                   what="the sender groups shared out over the two processes")
        holder = wait_until(lambda: lease_holders_of(procs, lease),
                            timeout=10, what=f"a holder of {lease}")[0]
        other = next(p for p in procs if p is not holder)
        alice = Client(other, register(other, "alice"))
        room = alice.create_room(name="shared")
        # Fixture: a user of the peer joined, as if a federated join had landed.
        harness.psql("INSERT INTO current_state (room_id, type, state_key, event_id, membership)"
                     f" VALUES ('{room}', 'm.room.member', '@bob:{peer.server_name}',"
                     " '$fixture1', 'join')", database=db)
        for i in range(3):
            body = f"through the other process {i}"
            sent = time.monotonic()
            alice.send(room, {"msgtype": "m.text", "body": body})
            wait_until(lambda: body in [p.get("content", {}).get("body") for p in peer.delivered_pdus()],
                       timeout=10, interval=0.02, what=f"message {i} at the peer")
            took = time.monotonic() - sent
            self.assertLess(took, PROMPT_DELIVERY_S, f"message {i} took {took:.2f} s")
        self.assertEqual({origin for _, origin, _ in peer.transactions}, {"cluster.test"})
        # The peer holds the PDUs before the holder has read its answer and counted it.
        wait_until(lambda: holder.metric("atrium_federation_outbound_transactions_total",
                                         {"outcome": "sent"}) >= 3,
                   timeout=10, interval=0.02, what="three sent transactions counted by the holder")
        self.assertEqual(other.metric("atrium_federation_outbound_transactions_total",
                                      {"outcome": "sent"}), 0,
                         "only the holder of the peer's group sends to it")


def lease_holders_of(servers, lease):
    return [s for s in servers if s.running() and s.metric("atrium_lease_held", {"lease": lease}) == 1]


if __name__ == "__main__":
    unittest.main()
