#!/usr/bin/env python3
"""Simplified Sliding Sync (MSC4186) on a large account. Prints numbers, asserts nothing.

One user in BENCH_ROOMS rooms (1,000 by default, made through createRoom, a message in
each). Figures:
  - the first response of a new connection with one list windowed at [0, 19],
    timeline_limit 1 and Element X's kind of required_state (name, avatar, encryption,
    create, power levels, $LAZY members): p50 and max over BENCH_FIRST runs;
  - wake latency: a request parked with its pos, woken by a message in a room of the
    window, from the send's answer to the sync's answer: p50, p99, max over BENCH_ROUNDS.
No Synapse comparison yet (it would need a Synapse beside it on the same machine).

    bench/sliding_sync.py      (ATRIUM_BIN etc. as for the integration tests)
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

ROOMS = int(os.environ.get("BENCH_ROOMS", "1000"))
FIRST = int(os.environ.get("BENCH_FIRST", "20"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "50"))
PARK_TIMEOUT_MS = 30000
SS = "/_matrix/client/unstable/org.matrix.simplified_msc3575/sync"
BODY = {"lists": {"all": {"ranges": [[0, 19]], "timeline_limit": 1, "required_state": [
    ["m.room.name", ""], ["m.room.avatar", ""], ["m.room.encryption", ""], ["m.room.create", ""],
    ["m.room.power_levels", ""], ["m.room.member", "$LAZY"]]}}}

from sync_longpoll import ensure_pg, parked, percentile, wait_parked  # noqa: E402


def ss(client, body, pos=None, timeout=None):
    q = []
    if pos:
        q.append(f"pos={pos}")
    if timeout is not None:
        q.append(f"timeout={timeout}")
    status, answer = client.srv.json("POST", SS + ("?" + "&".join(q) if q else ""), body,
                                     token=client.token, timeout=PARK_TIMEOUT_MS / 1000 + 10)
    assert status == 200, (status, answer)
    return answer


def first_figures(user):
    times = []
    for i in range(FIRST):
        t0 = time.monotonic()
        answer = ss(user, {"conn_id": f"first{i}", **BODY})
        times.append((time.monotonic() - t0) * 1000)
        assert len(answer["rooms"]) == 20 and answer["lists"]["all"]["count"] == ROOMS, answer["lists"]
    return times


def wake_figures(srv, user, writer, rooms):
    body = {"conn_id": "wake", **BODY}
    pos = ss(user, body)["pos"]
    latencies = []
    for i in range(ROUNDS):
        done = {}
        base = parked(srv)

        def poll():
            done["answer"] = ss(user, body, pos=pos, timeout=PARK_TIMEOUT_MS)
            done["at"] = time.monotonic()
        t = threading.Thread(target=poll)
        t.start()
        wait_parked(srv, base + 1, timeout=10)
        writer.send(rooms[-1], {"msgtype": "m.text", "body": f"w{i}"})
        sent = time.monotonic()
        t.join(PARK_TIMEOUT_MS / 1000 + 5)
        assert rooms[-1] in done["answer"]["rooms"], done["answer"]
        pos = done["answer"]["pos"]
        latencies.append((done["at"] - sent) * 1000)
    return latencies


def main():
    pg_work = ensure_pg()
    from accounts import REGISTRATION_ON, register
    from harness import Server, create_database, drop_database
    from rooms_client import Client
    db = create_database("atrium_bench")
    srv = Server(database=db, settings=REGISTRATION_ON, start=False)
    try:
        srv.start()
        user = Client(srv, register(srv, "big"))
        writer = Client(srv, register(srv, "writer"))
        t0 = time.monotonic()
        rooms = [user.create_room(name=f"room {i}") for i in range(ROOMS)]
        for r in rooms:
            user.send(r, {"msgtype": "m.text", "body": "hello"})
        user.member_action(rooms[-1], "invite", writer.user_id)
        writer.join(rooms[-1])
        print(f"== setup: {ROOMS} rooms in {time.monotonic() - t0:.0f} s")
        first = first_figures(user)
        print(f"== first response, {ROOMS} rooms, window [0, 19], timeline_limit 1 ({FIRST} runs): "
              f"p50 {percentile(first, 50):.1f} ms, max {max(first):.1f} ms")
        wake = wake_figures(srv, user, writer, rooms)
        print(f"== wake latency ({ROUNDS} rounds, from the send's answer): p50 {percentile(wake, 50):.1f} ms, "
              f"p99 {percentile(wake, 99):.1f} ms, max {max(wake):.1f} ms")
        print("== Synapse comparison: not measured yet")
    finally:
        srv.close()
        drop_database(db)
        if pg_work:
            subprocess.run(["bash", os.path.join(ROOT, "tests/lib/pg.sh"), "stop", pg_work], check=False)
            shutil.rmtree(pg_work, ignore_errors=True)


if __name__ == "__main__":
    main()
