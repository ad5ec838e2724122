#!/usr/bin/env python3
"""The latency of sending a message into a room with many local members, and into a room of
two, Atrium beside other executables in the same run. Prints numbers, asserts nothing
about speed.

What it watches: the writes a message makes inside its sending transaction (triggers on
events) must not grow with the room's members (ADR-0038: sliding sync reads each member's
rooms in activity order without a per-member copy of the room's bump_stamp). Besides the
latency it prints how many rows of sliding_sync_rooms all the sends updated (from
pg_stat_user_tables; "-" where the executable has no such table).

One database is filled through the client API by the first executable named (the
baseline when there is one: the oldest migrations), then copied for each executable, which
migrates its copy at its start: BENCH_MEMBERS local users (put in the accounts tables
directly, rooms_client.crowd) join one public room; a second room has two members. Then
the servers take turns, BENCH_SENDS rounds: each sends one message into the big room and
one into the small one, timed from the request to the answer (the PUT's whole round trip),
and waits until its push sender, which judges every message for every member behind the
sends, has caught up, so the next send does not share the CPU with it.

    bench/room_send.py       (ATRIUM_BIN etc. as for the integration tests;
                              BENCH_MEMBERS (1000), BENCH_SENDS (40);
                              BENCH_BASELINE_BIN: another atrium executable, e.g. of the
                              previous commit, measured as "Atrium baseline";
                              BENCH_OTHER_BINS: more, as NAME=PATH[,NAME=PATH...])
"""

import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
sys.path.insert(0, os.path.join(ROOT, "bench"))

MEMBERS = int(os.environ.get("BENCH_MEMBERS", "1000"))
SENDS = int(os.environ.get("BENCH_SENDS", "40"))
BASELINE_BIN = os.environ.get("BENCH_BASELINE_BIN")
OTHER_BINS = [kv.split("=", 1) for kv in os.environ.get("BENCH_OTHER_BINS", "").split(",") if kv]
WARMUP = 3          # sends of each server before the figures, not counted
STATS_SETTLE_S = 1.5  # a backend reports its table counts within a second of going idle

from sliding_sync import settle, start_atrium  # noqa: E402
from sync_longpoll import ensure_pg, percentile  # noqa: E402


def executables():
    """[(name, path or None for ATRIUM_BIN)], the one that fills first."""
    bins = [("Atrium baseline", BASELINE_BIN)] if BASELINE_BIN else []
    bins += [(name, path) for name, path in OTHER_BINS]
    return bins + [("Atrium", None)]


def fill(srv):
    """The two rooms on srv, made through the client API: (owner's account, big room,
    small room)."""
    from accounts import register
    from rooms_client import Client, crowd
    account = register(srv, "owner")
    owner = Client(srv, account)
    big = owner.create_room(preset="public_chat", name="big")
    small = owner.create_room(preset="public_chat", name="small")
    people = crowd(srv, MEMBERS - 1)
    for m in people:
        Client(srv, m).join(big)
    Client(srv, people[0]).join(small)
    return account, big, small


def copy_of(database):
    """A copy of the stopped server's database, after closing the connection that
    tests/integration/harness.py's psql keeps to it (settle's)."""
    import harness
    harness._SQL.forget(harness._sql_conninfo(database))
    return harness.create_database("atrium_bench_send", template=database)


def rows_updated(srv):
    from harness import psql
    got = psql("SELECT coalesce(sum(n_tup_upd), -1) FROM pg_stat_user_tables WHERE relname = 'sliding_sync_rooms'",
               database=srv.database)
    return int(got[0][0])


def main():
    pg_work = ensure_pg()
    from harness import drop_database
    from rooms_client import Client
    servers, template = {}, None
    try:
        bins = executables()
        first = start_atrium(bins[0][1])
        t0 = time.monotonic()
        account, big, small = fill(first)
        print(f"== filled by {bins[0][0]}: {MEMBERS} members in one room in {time.monotonic() - t0:.0f} s",
              flush=True)
        settle(bins[0][0], first)
        first.stop()
        template = copy_of(first.database)
        first.close()
        drop_database(first.database)
        for name, path in bins:
            servers[name] = start_atrium(path, template)
        clients = {name: Client(srv, account) for name, srv in servers.items()}
        ms = {name: {"big": [], "small": []} for name in servers}
        upd = {name: rows_updated(srv) for name, srv in servers.items()}
        for i in range(-WARMUP, SENDS):
            for name, c in clients.items():
                for room, key in ((big, "big"), (small, "small")):
                    t = time.monotonic()
                    c.send(room, {"msgtype": "m.text", "body": f"{key} {i}"}, txn=f"{key}{i}")
                    if i >= 0:
                        ms[name][key].append((time.monotonic() - t) * 1000)
                settle_quietly(servers[name])
        time.sleep(STATS_SETTLE_S)
        print(f"\n== A message's send, {MEMBERS} local members vs 2; ms, p50 / p90 / max "
              f"({SENDS} rounds, servers in turn)")
        print(f"  {'':<24}{'big room':>24}{'room of two':>24}   rows of sliding_sync_rooms updated")
        for name, srv in servers.items():
            after = rows_updated(srv)
            rows = "-" if after < 0 else f"{after - upd[name]} by {2 * (SENDS + WARMUP)} messages"
            cells = "".join(f"{percentile(ms[name][k], 50):8.2f} /{percentile(ms[name][k], 90):6.2f} /"
                            f"{max(ms[name][k]):7.2f}" for k in ("big", "small"))
            print(f"  {name:<24}{cells}   {rows}")
    finally:
        for srv in servers.values():
            srv.close()
            drop_database(srv.database)
        if template:
            drop_database(template)
        if pg_work:
            subprocess.run(["bash", os.path.join(ROOT, "tests/lib/pg.sh"), "stop", pg_work])
            shutil.rmtree(pg_work, ignore_errors=True)


def settle_quietly(srv, timeout_s=60):
    """Until srv's push sender has judged every event (as settle, without a word)."""
    from harness import psql
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        done = psql("SELECT (SELECT stream_pos FROM push_cursor) >= (SELECT max(stream_pos) FROM events)",
                    database=srv.database)
        if done and done[0][0] == "t":
            return
        time.sleep(0.05)


if __name__ == "__main__":
    main()
