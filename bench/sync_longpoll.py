#!/usr/bin/env python3
"""Speed figures for /sync long-polls. Prints numbers, asserts nothing.

  1. Parked syncs: the server's threads and RSS with 0, 1,000 and 10,000 syncs waiting
     (each a raw connection long-polling with timeout=5 min).
  2. Wake-to-response latency: one client long-polls, another sends; the time from the
     send's answer to the sync's answer, over ROUNDS rounds (p50, p99); and the fan-out: the
     time from one send until each of FANOUT parked members of the room has its answer.
  3. Messages/s: 16 clients send concurrently into one room while 16 others sync in a loop.

    bench/sync_longpoll.py          (ATRIUM_BIN etc. as for the integration tests)
    SYNC_BENCH_PARKED_ONLY=1 bench/sync_longpoll.py     (the first figure alone)

Uses the integration-test harness (a fresh database in ATRIUM_TEST_PG_CONNINFO's cluster;
without it, a private cluster is started in a temporary directory with tests/lib/pg.sh).
Users are inserted straight into the database (tests/integration/rooms_client.crowd).
"""

import json
import os
import resource
import selectors
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))

PARKED_STEPS = (0, 1000, 10000)
ROUNDS = 200
FANOUT = 1000
SENDERS = 16
SYNCERS = 16
SEND_SECONDS = 10
PARK_TIMEOUT_MS = 300000
SERVER_NOFILE = 20000


def ensure_pg():
    if os.environ.get("ATRIUM_TEST_PG_CONNINFO"):
        return None
    work = tempfile.mkdtemp(prefix="atrium-bench-pg-")
    os.chmod(work, 0o755)
    out = subprocess.run(["bash", os.path.join(ROOT, "tests/lib/pg.sh"), "start", work],
                         capture_output=True, text=True, check=True, env={**os.environ, "ATRIUM_PG_FAST": "1"})
    conninfo = out.stdout.strip().splitlines()[-1]
    os.environ["ATRIUM_TEST_PG_CONNINFO"] = " ".join(p for p in conninfo.split() if not p.startswith("dbname="))
    return work


def proc_status(pid):
    fields = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return int(fields["Threads"]), int(fields["VmRSS"].split()[0]) // 1024


def raw_sync(port, token, since, timeout_ms):
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    query = urllib.parse.urlencode({"since": since, "timeout": str(timeout_ms)})
    sock.sendall((f"GET /_matrix/client/v3/sync?{query} HTTP/1.1\r\nHost: bench\r\n"
                  f"Authorization: Bearer {token}\r\nConnection: close\r\n\r\n").encode())
    return sock


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def parked(srv):
    return int(srv.metric("atrium_http_parked") or 0)


def wait_parked(srv, n, timeout=300):
    """Until at least n requests are parked (n counts from 0, stale ones included)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if parked(srv) >= n:
            return True
        time.sleep(0.05)
    return False


def versions_prober(srv):
    """Asks /versions every 100 ms on a fresh connection until stopped; (stop, latencies)."""
    stop, lat = threading.Event(), []

    def probe():
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                status, _, _ = srv.request("GET", "/_matrix/client/versions", timeout=60)
            except OSError:
                status = None
            lat.append((time.monotonic() - t0) * 1000 if status == 200 else float("inf"))
            time.sleep(0.1)
    t = threading.Thread(target=probe, daemon=True)
    t.start()
    return stop, t, lat


def parked_figures(srv, people, since):
    print("== parked syncs: threads and RSS; /versions asked every 100 ms meanwhile")
    open_socks = []
    base_rss = None
    for target in PARKED_STEPS:
        started = time.monotonic()
        stop, prober, lat = versions_prober(srv)
        try:
            while len(open_socks) < target:
                p = people[len(open_socks)]
                open_socks.append(raw_sync(srv.port, p.token, since, PARK_TIMEOUT_MS))
            ok = wait_parked(srv, target)  # the first figure starts from none
        except Exception as e:  # a figure that cannot be taken is printed, not raised
            ok = f"{type(e).__name__}: {e}"
        time.sleep(1)
        stop.set()
        prober.join(70)
        threads, rss = proc_status(srv.pid)
        base_rss = rss if base_rss is None else base_rss
        per = f", {(rss - base_rss) * 1024 / target:.1f} KiB per parked" if target else ""
        failed = sum(1 for v in lat if v == float("inf"))
        done = [v for v in lat if v != float("inf")]
        vers = (f"/versions p50 {percentile(done, 50):.0f} ms, max {max(done):.0f} ms"
                if done else "/versions never answered")
        print(f"  {target:6d} waiting: threads {threads:3d}, RSS {rss:5d} MiB{per}; {vers}"
              f"{f', {failed} failed' if failed else ''} ({len(lat)} asked)"
              f"{'' if ok is True else f' (not all parked: {ok})'} "
              f"(set up in {time.monotonic() - started:.1f} s)")
        if ok is not True:
            break
    for s in open_socks:
        s.close()


def latency_figures(srv, alice, bob, room):
    from rooms_client import timeline_bodies
    print(f"== wake-to-response latency, one long-poller, {ROUNDS} rounds")
    since = bob.sync()["next_batch"]
    base = parked(srv)
    lat = []
    for i in range(ROUNDS):
        done = {}

        def poll(since=since):
            done["answer"] = bob.sync(since=since, timeout_ms=30000)
            done["at"] = time.monotonic()
        t = threading.Thread(target=poll)
        t.start()
        wait_parked(srv, base + 1, timeout=10)
        alice.send(room, {"msgtype": "m.text", "body": f"r{i}"})
        sent = time.monotonic()
        t.join(30)
        lat.append((done["at"] - sent) * 1000)
        since = done["answer"]["next_batch"]
        assert timeline_bodies(done["answer"], room) == [f"r{i}"]
    print(f"  p50 {percentile(lat, 50):.1f} ms, p99 {percentile(lat, 99):.1f} ms (from the send's answer)")


def fanout_figures(srv, alice, members, room):
    from rooms_client import Client
    print(f"== fan-out: one send, {FANOUT} parked members of the room")
    for m in members:
        Client(srv, m).join(room)
    since = alice.sync()["next_batch"]
    time.sleep(2)  # stale long-polls of these users (from the first figure) have answered
    base = parked(srv)
    sel = selectors.DefaultSelector()
    for m in members:
        sel.register(raw_sync(srv.port, m.token, since, PARK_TIMEOUT_MS), selectors.EVENT_READ)
    wait_parked(srv, base + FANOUT)
    start = time.monotonic()
    alice.send(room, {"msgtype": "m.text", "body": "fan-out"})
    times, pending = [], FANOUT
    while pending and time.monotonic() - start < 60:
        for key, _ in sel.select(timeout=1):
            data = key.fileobj.recv(65536)
            if not data:
                sel.unregister(key.fileobj)
                key.fileobj.close()
                times.append((time.monotonic() - start) * 1000)
                pending -= 1
    print(f"  answered {len(times)}/{FANOUT}: p50 {percentile(times, 50):.0f} ms, "
          f"p99 {percentile(times, 99):.0f} ms, last {max(times):.0f} ms")


def throughput_figures(srv, senders, syncers, room):
    from rooms_client import Client
    print(f"== messages/s: {SENDERS} senders with {SYNCERS} clients syncing")
    clients = [Client(srv, p) for p in senders + syncers]
    for c in clients:
        c.join(room)
    stop = threading.Event()
    sent = [0] * SENDERS
    synced = [0] * SYNCERS

    def send_loop(i):
        c = clients[i]
        n = 0
        while not stop.is_set():
            c.send(room, {"msgtype": "m.text", "body": f"{i}-{n}"}, txn=f"b{i}-{n}")
            n += 1
            sent[i] = n

    def sync_loop(i):
        c = clients[SENDERS + i]
        since = c.sync()["next_batch"]
        while not stop.is_set():
            answer = c.sync(since=since, timeout_ms=5000,
                            filter={"room": {"timeline": {"limit": 50}}})
            since = answer["next_batch"]
            synced[i] += 1

    threads = [threading.Thread(target=send_loop, args=(i,)) for i in range(SENDERS)]
    threads += [threading.Thread(target=sync_loop, args=(i,)) for i in range(SYNCERS)]
    for t in threads:
        t.start()
    time.sleep(SEND_SECONDS)
    stop.set()
    for t in threads:
        t.join(60)
    print(f"  {sum(sent) / SEND_SECONDS:.0f} messages/s ({sum(sent)} in {SEND_SECONDS} s); "
          f"{sum(synced) / SEND_SECONDS:.0f} syncs/s answered meanwhile")


def main():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    pg_work = ensure_pg()
    from accounts import REGISTRATION_ON, register
    from harness import Server
    from rooms_client import Client, crowd
    try:
        settings = {**REGISTRATION_ON, "log": {"level": "warn"}}
        with Server(settings=settings, nofile=SERVER_NOFILE) as srv:
            alice = Client(srv, register(srv, "alice"))
            bob = Client(srv, register(srv, "bob"))
            room = alice.create_room(preset="public_chat")
            bob.join(room)
            people = crowd(srv, max(PARKED_STEPS))
            parked_figures(srv, people, alice.sync()["next_batch"])
            if os.environ.get("SYNC_BENCH_PARKED_ONLY"):
                return
            latency_figures(srv, alice, bob, room)
            fanout_room = alice.create_room(preset="public_chat")
            fanout_figures(srv, alice, people[:FANOUT], fanout_room)
            busy_room = alice.create_room(preset="public_chat")
            throughput_figures(srv, people[FANOUT:FANOUT + SENDERS],
                               people[FANOUT + SENDERS:FANOUT + SENDERS + SYNCERS], busy_room)
    finally:
        if pg_work:
            subprocess.run(["bash", os.path.join(ROOT, "tests/lib/pg.sh"), "stop", pg_work])
            shutil.rmtree(pg_work, ignore_errors=True)


if __name__ == "__main__":
    main()
