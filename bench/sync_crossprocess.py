#!/usr/bin/env python3
"""Cross-process wake latency of /sync beside in-process wake latency, in the same run.
Prints numbers, asserts nothing.

Two Atrium processes (A on 127.0.0.31, B on 127.0.0.32) share one database. Over ROUNDS
rounds each: a sync long-polls on B (parked, then the send) while the message is sent
through A (cross-process: the wake-up travels as a PostgreSQL notification), and a sync
long-polls on A while the message is sent through A (in-process). The figure is the time
from the send's answer to the sync's answer (p50, p99, max), alternating the two kinds
round by round so both see the same machine load.

    bench/sync_crossprocess.py      (ATRIUM_BIN etc. as for the integration tests)

Uses the integration-test harness (a fresh database in ATRIUM_TEST_PG_CONNINFO's cluster;
without it, a private cluster is started in a temporary directory with tests/lib/pg.sh).
BENCH_ROUNDS changes the number of rounds.
"""

import os
import shutil
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
sys.path.insert(0, os.path.join(ROOT, "bench"))

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "200"))
PARK_TIMEOUT_MS = 30000

from sync_longpoll import ensure_pg, parked, percentile, wait_parked  # noqa: E402


def one_round(sync_srv, reader, writer, room, since, i):
    """Park reader's sync on sync_srv, send through writer; (latency ms, next since)."""
    from rooms_client import timeline_bodies
    done = {}
    base = parked(sync_srv)

    def poll():
        done["answer"] = reader.sync(since=since, timeout_ms=PARK_TIMEOUT_MS)
        done["at"] = time.monotonic()
    t = threading.Thread(target=poll)
    t.start()
    wait_parked(sync_srv, base + 1, timeout=10)
    writer.send(room, {"msgtype": "m.text", "body": f"r{i}"})
    sent = time.monotonic()
    t.join(PARK_TIMEOUT_MS / 1000 + 5)
    assert timeline_bodies(done["answer"], room) == [f"r{i}"], done["answer"]
    return (done["at"] - sent) * 1000, done["answer"]["next_batch"]


def main():
    pg_work = ensure_pg()
    from accounts import REGISTRATION_ON, register
    from harness import Server, create_database, drop_database
    from rooms_client import Client
    db = create_database("atrium_bench")
    a = Server(database=db, settings=REGISTRATION_ON, start=False, host="127.0.0.31")
    b = Server(database=db, settings=REGISTRATION_ON, start=False, host="127.0.0.32")
    try:
        a.start()
        b.start()
        writer = Client(a, register(a, "writer"))
        far = Client(b, register(a, "far"))     # syncs on B
        near = Client(a, register(a, "near"))   # syncs on A
        room = writer.create_room(preset="public_chat")
        far.join(room)
        near.join(room)
        far_since = far.sync()["next_batch"]
        near_since = near.sync()["next_batch"]
        cross, local = [], []
        for i in range(ROUNDS):
            ms, far_since = one_round(b, far, writer, room, far_since, 2 * i)
            near_since = near.sync(since=near_since, timeout_ms=0)["next_batch"]
            cross.append(ms)
            ms, near_since = one_round(a, near, writer, room, near_since, 2 * i + 1)
            far_since = far.sync(since=far_since, timeout_ms=0)["next_batch"]
            local.append(ms)
        print(f"== /sync wake latency, {ROUNDS} rounds each (from the send's answer on A)")
        for name, lat in (("in-process   (sync on A)", local), ("cross-process (sync on B)", cross)):
            print(f"  {name}: p50 {percentile(lat, 50):.1f} ms, p99 {percentile(lat, 99):.1f} ms, "
                  f"max {max(lat):.1f} ms")
        print(f"  notifications: A published {a.metric('atrium_notify_published_total'):.0f}, "
              f"B received {b.metric('atrium_notify_received_total'):.0f}")
    finally:
        for s in (a, b):
            s.close()
        drop_database(db)
        if pg_work:
            subprocess.run(["bash", os.path.join(ROOT, "tests/lib/pg.sh"), "stop", pg_work],
                           check=False)
            shutil.rmtree(pg_work, ignore_errors=True)


if __name__ == "__main__":
    main()
