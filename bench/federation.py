#!/usr/bin/env python3
"""Federation transport figures. Prints numbers beside a baseline measured in the same run;
asserts nothing.

  1. Signed requests per second from one Atrium to another: clients of A ask for a profile
     of a user on B (A signs, B verifies and answers), CLIENTS at a time for SECONDS;
     baseline: the same clients asking A for a profile of its own user (no federation).
  2. p50/p99 of a client endpoint (/versions) while BLACKHOLE outbound requests to a peer
     that accepts connections and never answers are outstanding; baseline: the same with
     none outstanding. The figure should not move: those requests wait on the outbound
     client, holding no request-pool thread.

    bench/federation.py        (ATRIUM_BIN etc. as for the integration tests)

Two servers on 127.0.0.21 and 127.0.0.22 with TLS from a CA made for the run (the
integration tests' federation_support), a fresh database each.
"""

import os
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import harness  # noqa: E402
from accounts import REGISTRATION_ON, quote, register  # noqa: E402
from federation_support import FederatedServer, TestCA  # noqa: E402
from sync_longpoll import ensure_pg  # noqa: E402

CLIENTS = 16
SECONDS = 10
BLACKHOLE = 16
PROBES = 400


def rate(srv, path, token, clients=CLIENTS, seconds=SECONDS):
    """Requests per second of GET path from `clients` threads for `seconds`."""
    stop = time.monotonic() + seconds
    counts, errors = [0] * clients, [0] * clients

    def loop(i):
        while time.monotonic() < stop:
            status, _ = srv.json("GET", path, token=token, timeout=30)
            if status == 200:
                counts[i] += 1
            else:
                errors[i] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(clients)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.monotonic() - started), sum(errors)


def latencies(srv, n=PROBES):
    out = []
    for _ in range(n):
        t0 = time.monotonic()
        srv.json("GET", "/_matrix/client/versions")
        out.append((time.monotonic() - t0) * 1000)
    out.sort()
    return statistics.median(out), out[int(len(out) * 0.99) - 1]


def main():
    pg = ensure_pg()
    tmp = tempfile.mkdtemp(prefix="atrium-bench-fed-")
    servers = []
    try:
        ca = TestCA(tmp)
        a = FederatedServer(ca, "127.0.0.21", extra={**REGISTRATION_ON,
                                                     "federation": {"client": {"request_timeout_ms": 60000}}})
        b = FederatedServer(ca, "127.0.0.22", extra=REGISTRATION_ON)
        servers = [a, b]
        for s in servers:
            s.start()
        alice, bob = register(a, "alice"), register(b, "bob")
        local = f"/_matrix/client/v3/profile/{quote(alice.user_id)}"
        remote = f"/_matrix/client/v3/profile/{quote(bob.user_id)}"
        a.json("GET", remote, token=alice.token)  # B's key fetched, connection open

        base_rps, base_err = rate(a, local, alice.token)
        fed_rps, fed_err = rate(a, remote, alice.token)
        print(f"profile look-ups, {CLIENTS} clients, {SECONDS} s:")
        print(f"  local user (baseline):   {base_rps:8.0f} requests/s ({base_err} errors)")
        print(f"  user on B (signed, verified by B): {fed_rps:8.0f} requests/s ({fed_err} errors)")

        quiet = latencies(a)
        hole = socket.socket()
        hole.bind(("127.0.0.41", 0))
        hole.listen(BLACKHOLE * 2)
        name = f"127.0.0.41:{hole.getsockname()[1]}"
        waiting = [threading.Thread(target=a.json, args=("GET", f"/_matrix/client/v3/profile/"
                                                         f"{quote('@x' + str(i) + ':' + name)}"),
                                    kwargs={"token": alice.token, "timeout": 120}, daemon=True)
                   for i in range(BLACKHOLE)]
        for t in waiting:
            t.start()
        time.sleep(1.0)
        loaded = latencies(a)
        parked = a.metric("atrium_http_parked")
        print(f"/versions with {BLACKHOLE} requests to a black-hole peer outstanding ({parked:.0f} parked):")
        print(f"  none outstanding (baseline): p50 {quiet[0]:.2f} ms, p99 {quiet[1]:.2f} ms")
        print(f"  {BLACKHOLE} outstanding:              p50 {loaded[0]:.2f} ms, p99 {loaded[1]:.2f} ms")
        hole.close()
    finally:
        for s in servers:
            s.close(raise_errors=False)
        shutil.rmtree(tmp, ignore_errors=True)
        if pg:
            import subprocess
            subprocess.run(["bash", os.path.join(ROOT, "tests/lib/pg.sh"), "stop", pg])
            shutil.rmtree(pg, ignore_errors=True)


if __name__ == "__main__":
    main()
