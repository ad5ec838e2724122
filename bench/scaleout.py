#!/usr/bin/env python3
"""Messages per second through haproxy with 1, 2 and 3 Atrium processes, each figure beside
the direct-to-one-process figure measured in the same cluster, right after it. Prints
numbers, asserts nothing.

For each process count N: a cluster (tests/integration/cluster_support.py: deploy/haproxy.cfg
on 127.0.0.40, processes on 127.0.0.41-43, one database), BENCH_CLIENTS users in one room,
each sending m.room.message events as fast as its answers come back (PUT .../send/... on
one keep-alive connection per user) for BENCH_SECONDS through the balancer and as long
straight to the first process, in halves ordered balancer, direct, direct, balancer. The
client is Python threads on the same machine.

    bench/scaleout.py      (ATRIUM_BIN etc. as for the integration tests)

Uses the integration-test harness (a fresh database in ATRIUM_TEST_PG_CONNINFO's cluster;
without it, a private cluster is started with tests/lib/pg.sh). Needs haproxy
(tests/lib/deps.sh installs it).
"""

import http.client
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
sys.path.insert(0, os.path.join(ROOT, "bench"))

SECONDS = float(os.environ.get("BENCH_SECONDS", "10"))
CLIENTS = int(os.environ.get("BENCH_CLIENTS", "8"))
PROCESS_COUNTS = (1, 2, 3)

from sync_longpoll import ensure_pg  # noqa: E402

NOTE = ("On this 2-core machine the processes, PostgreSQL, haproxy and the client share two\n"
        "cores: more processes cannot add capacity here, so the figures show the balancer's\n"
        "overhead and the cost of more processes on one database, not scaling.")


def send_for(host, port, accounts, room, seconds):
    """Every account sends as fast as it is answered for `seconds`: messages/s, failures."""
    counts, failures = [0] * len(accounts), [0] * len(accounts)
    stop_at = time.monotonic() + seconds
    path_room = urllib.parse.quote(room, safe="")

    def run(i, acct):
        conn = http.client.HTTPConnection(host, port, timeout=30)
        n = 0
        while time.monotonic() < stop_at:
            n += 1
            body = json.dumps({"msgtype": "m.text", "body": f"bench {i} {n}"}).encode()
            try:
                conn.request("PUT", f"/_matrix/client/v3/rooms/{path_room}/send/m.room.message/"
                             f"b{time.monotonic_ns()}.{i}.{n}", body=body,
                             headers={"Authorization": f"Bearer {acct.token}",
                                      "Content-Type": "application/json"})
                resp = conn.getresponse()
                resp.read()
                if resp.status == 200:
                    counts[i] += 1
                else:
                    failures[i] += 1
                if resp.getheader("Connection", "").lower() == "close":
                    conn.close()
                    conn = http.client.HTTPConnection(host, port, timeout=30)
            except (OSError, http.client.HTTPException):
                failures[i] += 1
                conn.close()
                conn = http.client.HTTPConnection(host, port, timeout=30)
        conn.close()

    started = time.monotonic()
    threads = [threading.Thread(target=run, args=(i, a)) for i, a in enumerate(accounts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.monotonic() - started), sum(failures)


def measure(n):
    from accounts import register
    from cluster_support import Cluster
    from rooms_client import Client
    with Cluster(n=n, settings={"registration": {"enabled": True}}) as c:
        first = c.servers[0]
        accounts = [register(first, f"bench{i}") for i in range(CLIENTS)]
        owner = Client(first, accounts[0])
        room = owner.create_room(preset="public_chat")
        for acct in accounts[1:]:
            Client(first, acct).join(room)
        send_for(c.lb.ip, c.lb.port, accounts, room, 1.0)  # warm-up: connections, caches
        # A, B, B, A halves: a drift over the run (the room's history grows) hits both alike.
        half = SECONDS / 2
        runs = {"lb": [], "direct": []}
        for kind in ("lb", "direct", "direct", "lb"):
            host, port = (c.lb.ip, c.lb.port) if kind == "lb" else (first.host, first.port)
            runs[kind].append(send_for(host, port, accounts, room, half))
        lb = sum(r[0] for r in runs["lb"]) / 2
        lb_failed = sum(r[1] for r in runs["lb"])
        direct = sum(r[0] for r in runs["direct"]) / 2
        direct_failed = sum(r[1] for r in runs["direct"])
        per_process = [s.metric("atrium_http_requests_total") for s in c.servers]
        return lb, lb_failed, direct, direct_failed, per_process


def main():
    pg_work = ensure_pg()
    try:
        print(f"== messages per second, {CLIENTS} senders, {SECONDS:.0f} s each "
              f"(one room; through haproxy, then straight to process 1)")
        print(NOTE)
        print(f"  {'processes':>9}  {'via haproxy':>12}  {'direct to one':>13}  {'ratio':>6}  "
              f"requests served per process")
        for n in PROCESS_COUNTS:
            lb, lb_failed, direct, direct_failed, per_process = measure(n)
            failed = f"  ({lb_failed} + {direct_failed} failed)" if lb_failed or direct_failed else ""
            print(f"  {n:>9}  {lb:>10.0f}/s  {direct:>11.0f}/s  {lb / direct:>6.2f}  "
                  f"{', '.join(f'{v:.0f}' for v in per_process)}{failed}")
    finally:
        if pg_work:
            subprocess.run(["bash", os.path.join(ROOT, "tests/lib/pg.sh"), "stop", pg_work],
                           check=False)
            shutil.rmtree(pg_work, ignore_errors=True)


if __name__ == "__main__":
    main()
