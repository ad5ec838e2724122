#!/usr/bin/env python3
"""Speed figures for application services (core/client/appservice/). Prints numbers,
asserts nothing beyond the order of what arrived.

  1. Latency: the service's sender sends one message at a time; the time from the send to
     the service having it (p50, p99, max over ROUNDS).
  2. Throughput: BURST messages sent one after another; when the last one reached the
     service, events per second delivered, and in how many transactions.
  3. Backlog: BURST messages sent while the service answers 500; the time from its
     recovery until all of them arrived.
  Baseline, measured in the same run: the same sends by a user of a second server with no
  service registered (the send's own round trip, p50/p99, and BURST sends' events per
  second), so what the service path adds shows beside what a send costs anyway.

    bench/appservice.py          (ATRIUM_BIN etc. as for the integration tests)

Uses the integration-test harness (a fresh database in ATRIUM_TEST_PG_CONNINFO's cluster;
without it, a private cluster is started in a temporary directory with tests/lib/pg.sh) and
the test's fake service (tests/integration/test_appservice.py).
"""

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))

ROUNDS = 50
BURST = 300


def ensure_pg():
    """A private cluster when the environment names none; its directory, or None."""
    if os.environ.get("ATRIUM_TEST_PG_CONNINFO"):
        return None
    work = tempfile.mkdtemp(prefix="atrium-bench-pg-")
    os.chmod(work, 0o755)
    out = subprocess.run(["bash", os.path.join(ROOT, "tests/lib/pg.sh"), "start", work],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "ATRIUM_PG_FAST": "1"})
    conninfo = out.stdout.strip().splitlines()[-1]
    os.environ["ATRIUM_TEST_PG_CONNINFO"] = " ".join(
        p for p in conninfo.split() if not p.startswith("dbname="))
    return work


def text(i, prefix):
    return {"msgtype": "m.text", "body": f"{prefix}{i}"}


def pct(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def baseline(client):
    """The same sends with no service registered: their own round trip and rate."""
    room = client.create_room()
    lat = []
    for i in range(ROUNDS):
        t0 = time.monotonic()
        client.send(room, text(i, "l"))
        lat.append((time.monotonic() - t0) * 1000)
    t0 = time.monotonic()
    for i in range(BURST):
        client.send(room, text(i, "b"))
    took = time.monotonic() - t0
    print(f"baseline, no service: a send's round trip p50 {statistics.median(lat):.1f} ms, "
          f"p99 {pct(lat, 99):.1f} ms; {BURST} sends at {BURST / took:.0f} events/s")


def run(srv, svc, bot):
    room = bot.create_room()
    lat = []
    for i in range(ROUNDS):
        t0 = time.monotonic()
        bot.send(room, text(i, "l"))
        while len(svc.bodies(room)) < i + 1:
            time.sleep(0.001)
        lat.append((time.monotonic() - t0) * 1000)
    print(f"send to delivery, one message at a time: p50 {statistics.median(lat):.1f} ms, "
          f"p99 {pct(lat, 99):.1f} ms, max {max(lat):.1f} ms")
    room = bot.create_room()
    before = len(svc.order)
    t0 = time.monotonic()
    for i in range(BURST):
        bot.send(room, text(i, "b"))
    sent = time.monotonic() - t0
    got = svc.wait_bodies(room, BURST, timeout=120)
    done = time.monotonic() - t0
    assert got == [f"b{i}" for i in range(BURST)]
    print(f"{BURST} messages: sent in {sent:.2f} s, the last delivered {done:.2f} s after the "
          f"first send ({BURST / done:.0f} events/s delivered), in "
          f"{len(svc.order) - before} transactions")
    with svc.lock:
        svc.status = 500
    room = bot.create_room()
    for i in range(BURST):
        bot.send(room, text(i, "c"))
    before = len(svc.order)
    t0 = time.monotonic()
    with svc.lock:
        svc.status = 200
    got = svc.wait_bodies(room, BURST, timeout=120)
    assert got == [f"c{i}" for i in range(BURST)]
    print(f"a {BURST}-message backlog: delivered {time.monotonic() - t0:.2f} s after the "
          f"service recovered, in {len(svc.order) - before} transactions")


def main():
    pg_work = ensure_pg()
    import harness
    from accounts import REGISTRATION_ON, Account, register
    from rooms_client import Client
    from test_appservice import FakeService, registration, settings_with
    svc = FakeService()
    try:
        with harness.Server(settings=REGISTRATION_ON) as plain:
            baseline(Client(plain, register(plain, "bench")))
        with harness.Server(settings=settings_with([registration(svc.url)])) as srv:
            run(srv, svc, Client(srv, Account("@bridgebot:localhost", "as-secret", None, None)))
    finally:
        svc.close()
        if pg_work:
            subprocess.run(["bash", os.path.join(ROOT, "tests/lib/pg.sh"), "stop", pg_work])
            shutil.rmtree(pg_work, ignore_errors=True)


if __name__ == "__main__":
    main()
