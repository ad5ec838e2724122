#!/usr/bin/env python3
"""Speed figures for /sync long-polls. Prints numbers, asserts nothing.

  1. Parked syncs: the server's threads and RSS with 0, 1,000 and 10,000 syncs waiting
     (each a raw connection long-polling with timeout=5 min). SYNC_BENCH_PARKED=100000 adds
     a step of that many (timeout 10 min, the server's cap), then wakes the 1,000 members of
     one room among them with one message (time from the send to each answer) while the
     others stay parked; it raises the descriptor limits of both processes (we must be root
     past the hard limit) and spreads the connections over several loopback source
     addresses (one address has 28,232 ephemeral ports), and says so.
  2. Wake-to-response latency: one client long-polls, another sends; the time from the
     send's answer to the sync's answer, over ROUNDS rounds (p50, p99); and the fan-out: the
     time from one send until each of FANOUT parked members of the room has its answer.
  3. Messages/s: 16 clients send concurrently into one room while 16 others sync in a loop.

    bench/sync_longpoll.py          (ATRIUM_BIN etc. as for the integration tests)
    SYNC_BENCH_PARKED_ONLY=1 bench/sync_longpoll.py     (the first figure alone)
    SYNC_BENCH_PARKED=100000 bench/sync_longpoll.py     (the first figure to 100,000, and
                                                         the fan-out among them, alone)
    SYNC_BENCH_HEAPS=1 ...      (each step also prints bench/heap_residency.py's figures)

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
BIG_PARK_TIMEOUT_MS = 600000  # core/http/suspend.c PARK_MAX_MS: setting up 100,000 takes minutes
SERVER_NOFILE = 20000
# 100,000 long-polls need about 205,000 descriptors on the server (README, LimitNOFILE):
# of what is left after its reserves, about half may hold a waiting request.
BIG_SERVER_NOFILE_PER_PARKED = 2.1
CLIENT_NOFILE_SLACK = 2000
PER_SOURCE_ADDRESS = 25000  # below the 28,232 ephemeral ports of one source address
SOURCE_NET = "127.0.28."  # client source addresses 127.0.28.1, .2, ... (no test uses them)
IP_BIND_ADDRESS_NO_PORT = 24  # linux/in.h: the port is picked at connect, per destination


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


def raw_sync(port, token, since, timeout_ms, source=None):
    if source is None:
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    else:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_IP, IP_BIND_ADDRESS_NO_PORT, 1)
        sock.bind((source, 0))
        sock.settimeout(30)
        sock.connect(("127.0.0.1", port))
    query = urllib.parse.urlencode({"since": since, "timeout": str(timeout_ms)})
    sock.sendall((f"GET /_matrix/client/v3/sync?{query} HTTP/1.1\r\nHost: bench\r\n"
                  f"Authorization: Bearer {token}\r\nConnection: close\r\n\r\n").encode())
    return sock


def cpu_seconds(pid):
    """User and system CPU time the process has used so far."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pg_cpu_seconds(database):
    """CPU time used so far by the PostgreSQL backends connected to database (the server's
    pool; a backend that exits meanwhile is not counted)."""
    from harness import psql
    total = 0.0
    for (pid,) in psql(f"SELECT pid FROM pg_stat_activity WHERE datname = '{database}'"
                       " AND pid <> pg_backend_pid()"):
        try:
            total += cpu_seconds(int(pid))
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


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


def source_address(i):
    """The loopback source address of the i-th parked long-poll of a big step."""
    return f"{SOURCE_NET}{1 + i // PER_SOURCE_ADDRESS}"


def versions_summary(lat):
    failed = sum(1 for v in lat if v == float("inf"))
    done = [v for v in lat if v != float("inf")]
    if not done:
        return "/versions never answered"
    return (f"/versions p50 {percentile(done, 50):.0f} ms, p99 {percentile(done, 99):.0f} ms, "
            f"max {max(done):.0f} ms{f', {failed} failed' if failed else ''} ({len(lat)} asked)")


def parked_figures(srv, people, since, steps=PARKED_STEPS, big=False):
    """Parks long-polls up to each step and prints the server's threads and RSS. Returns
    the open sockets (people[i]'s long-poll is socks[i]) when every step completed, else
    None (they are closed)."""
    print("== parked syncs: threads and RSS; /versions asked every 100 ms meanwhile")
    open_socks = []
    base_rss = None
    timeout_ms = BIG_PARK_TIMEOUT_MS if big else PARK_TIMEOUT_MS
    for target in steps:
        started = time.monotonic()
        stop, prober, lat = versions_prober(srv)
        try:
            while len(open_socks) < target:
                i = len(open_socks)
                open_socks.append(raw_sync(srv.port, people[i].token, since, timeout_ms,
                                           source_address(i) if big else None))
            ok = wait_parked(srv, target, timeout=900 if big else 300)  # the first figure starts from none
        except Exception as e:  # a figure that cannot be taken is printed, not raised
            ok = f"{type(e).__name__}: {e}"
        set_up = time.monotonic() - started
        time.sleep(1)
        stop.set()
        prober.join(70)
        threads, rss = proc_status(srv.pid)
        base_rss = rss if base_rss is None else base_rss
        if os.environ.get("SYNC_BENCH_HEAPS"):  # where that RSS is, by malloc chunk size
            subprocess.run([sys.executable, os.path.join(ROOT, "bench", "heap_residency.py"),
                            str(srv.pid)], check=False)
        per = f", {(rss - base_rss) * 1024 / target:.1f} KiB per parked" if target else ""
        print(f"  {target:6d} waiting: threads {threads:3d}, RSS {rss:5d} MiB{per}; "
              f"{versions_summary(lat)}{'' if ok is True else f' (not all parked: {ok})'} "
              f"(set up in {set_up:.1f} s, load average {os.getloadavg()[0]:.1f})", flush=True)
        if ok is not True:
            for s in open_socks:
                s.close()
            return None
    if big:  # /versions with everyone parked, no long-poll arriving
        stop, prober, lat = versions_prober(srv)
        time.sleep(20)
        stop.set()
        prober.join(70)
        print(f"  {len(open_socks)} parked, 20 s: {versions_summary(lat)}", flush=True)
    return open_socks


def big_fanout_figures(srv, alice, room, member_socks):
    """One message into a room whose members each hold one of the parked long-polls: the
    time from the send to each member's answer, and how many others stayed parked."""
    print(f"== fan-out among the parked: one send, {len(member_socks)} parked members of the room")
    before = parked(srv)
    sel = selectors.DefaultSelector()
    for sock in member_socks:
        sel.register(sock, selectors.EVENT_READ)
    stop, prober, lat = versions_prober(srv)
    cpu_before, pg_before = cpu_seconds(srv.pid), pg_cpu_seconds(srv.database)
    start = time.monotonic()
    alice.send(room, {"msgtype": "m.text", "body": "fan-out"})
    send_ms = (time.monotonic() - start) * 1000
    times, answers, pending = [], {}, len(member_socks)
    while pending and time.monotonic() - start < 120:
        for key, _ in sel.select(timeout=1):
            data = key.fileobj.recv(65536)
            answers[key.fileobj] = answers.get(key.fileobj, b"") + data
            if not data:
                sel.unregister(key.fileobj)
                times.append((time.monotonic() - start) * 1000)
                pending -= 1
    cpu_ms = (cpu_seconds(srv.pid) - cpu_before) * 1000
    pg_ms = (pg_cpu_seconds(srv.database) - pg_before) * 1000
    time.sleep(2)
    stop.set()
    prober.join(70)
    after = parked(srv)
    with_message = sum(1 for a in answers.values() if a.startswith(b"HTTP/1.1 200") and b'"fan-out"' in a)
    if times:
        print(f"  answered {len(times)}/{len(member_socks)} ({with_message} with the message): "
              f"p50 {percentile(times, 50):.0f} ms, p99 {percentile(times, 99):.0f} ms, "
              f"last {max(times):.0f} ms (the send answered in {send_ms:.0f} ms; the server's CPU "
              f"meanwhile {cpu_ms:.0f} ms, {cpu_ms / len(times):.2f} ms per answer; PostgreSQL's "
              f"{pg_ms / len(times):.2f} ms per answer); parked {before} before, {after} after; "
              f"{versions_summary(lat)}; load average {os.getloadavg()[0]:.1f}", flush=True)
    else:
        print("  no member answered within 120 s")
    return after


def raise_nofile(n):
    """RLIMIT_NOFILE of this process to n, raising the hard limit too (root only past it).
    Returns what it was."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (n, max(n, hard)))
    return soft, hard


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


def big_run(srv, alice, people, big):
    """SYNC_BENCH_PARKED: the 1,000 members of one room join first; then every step parks
    (the members' long-polls among the first ones), then one message wakes the members."""
    from rooms_client import Client
    fanout_room = alice.create_room(preset="public_chat")
    for m in people[:FANOUT]:
        Client(srv, m).join(fanout_room)
    steps = tuple(n for n in PARKED_STEPS if n < big) + (big,)
    socks = parked_figures(srv, people, alice.sync()["next_batch"], steps, big=True)
    if socks is None:
        return
    threads, rss = proc_status(srv.pid)
    big_fanout_figures(srv, alice, fanout_room, socks[:FANOUT])
    print(f"  after the fan-out: threads {threads}, RSS {rss} MiB")
    for sock in socks[FANOUT:]:
        sock.close()


def main():
    big = int(os.environ.get("SYNC_BENCH_PARKED", "0"))
    server_nofile = max(SERVER_NOFILE, int(big * BIG_SERVER_NOFILE_PER_PARKED))
    client_nofile = max(SERVER_NOFILE, big + CLIENT_NOFILE_SLACK)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if big:  # the hard limit too, so the server (our child) may have its own raised
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (client_nofile, max(hard, server_nofile)))
        except (ValueError, OSError) as e:
            # Raising a hard limit needs CAP_SYS_RESOURCE (root alone is not enough in a
            # container that drops it): the step cannot be taken here.
            print(f"could not raise RLIMIT_NOFILE from {soft}/{hard} to {client_nofile}/"
                  f"{server_nofile} ({e}; raising the hard limit needs CAP_SYS_RESOURCE): "
                  f"{big} parked long-polls need about {server_nofile} descriptors on the server")
            sys.exit(2)
        print(f"raised RLIMIT_NOFILE: this process {soft}/{hard} -> {client_nofile}/"
              f"{max(hard, server_nofile)}, the server {server_nofile}; long-polls from "
              f"{source_address(0)} to {source_address(big - 1)} ({PER_SOURCE_ADDRESS} each)")
    else:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    pg_work = ensure_pg()
    from accounts import REGISTRATION_ON, register
    from harness import Server
    from rooms_client import Client, crowd
    try:
        settings = {**REGISTRATION_ON, "log": {"level": "warn"}}
        with Server(settings=settings, nofile=server_nofile) as srv:
            alice = Client(srv, register(srv, "alice"))
            bob = Client(srv, register(srv, "bob"))
            room = alice.create_room(preset="public_chat")
            bob.join(room)
            people = crowd(srv, max(PARKED_STEPS + (big,)))
            if big:
                big_run(srv, alice, people, big)
                return
            socks = parked_figures(srv, people, alice.sync()["next_batch"])
            for sock in socks or []:
                sock.close()
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
