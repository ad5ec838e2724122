#!/usr/bin/env python3
"""Simplified Sliding Sync (MSC4186) on a large account, Atrium and Synapse 1.132 side by
side in one run. Prints numbers, asserts nothing about speed.

The same account on each server, made through the client API: a user in BENCH_ROOMS rooms
(1,000 by default; a smaller number for a quicker run, the size used is printed), each with
10 members (the user and 9 others who join it) and 20 messages sent by its members in turn.
Figures, p50 and max (after WARMUP first responses of each server, not counted):
  - first: the first response of a new connection with one list windowed at [0, 19],
    timeline_limit 1 and required_state name, avatar, encryption and $LAZY members
    (BENCH_FIRST runs);
  - incremental: after one message in a room, the response to the connection's pos
    (timeout 0; BENCH_ROUNDS rounds);
  - wake: a request parked with its pos, woken by a message in a room of the window, from
    the send's answer to the sync's answer (BENCH_ROUNDS rounds). Atrium's request is known
    parked from its atrium_http_parked metric; Synapse's is given WAKE_SETTLE_S first.
The figures of the previous version of the code come from the same run with
BENCH_BASELINE_BIN (its executable, on a database of its own). Atrium keeps joined rooms'
first results and sends them again while nothing of theirs changed (sliding_sync.cache_mb,
docs/adr/0045-sliding-sync-keeps-first-results.md), so its first responses after the
warm-up are the kept ones; "Atrium, nothing kept" is the same executable with
sliding_sync.cache_mb: 0 (every room read, as after a change in each), measured beside it
unless BENCH_UNKEPT=0.
Synapse comes from shared/peers/synapse/ beside the repository (peer.sh; SQLite on tmpfs
where there is one, as Atrium's PostgreSQL runs without fsync; its rate limits lifted for
the bench's users, which are admins); BENCH_SYNAPSE=0 or no peer measures Atrium alone and
says so. Synapse makes the account far slower than Atrium (5 to 8 s a room on the loaded
2-core build machine, against under 1 s): all accounts are filled at the same time, before
any figure, and Atrium's push sender (which judges every event for every member, behind
the sends) is let catch up; then the servers take turns, round by round, so a change in the
machine's load falls on all of them alike.

    bench/sliding_sync.py      (ATRIUM_BIN etc. as for the integration tests;
                                BENCH_ROOMS, BENCH_FIRST, BENCH_ROUNDS, BENCH_SYNAPSE,
                                BENCH_ATRIUM=0 for Synapse alone;
                                BENCH_UNKEPT=0 without "Atrium, nothing kept";
                                BENCH_BASELINE_BIN: another atrium executable, e.g. of
                                the previous commit, measured as "Atrium baseline";
                                BENCH_SYNAPSE_DIR: where a filled Synapse is kept for
                                the next runs, or taken from: see kept_synapse;
                                BENCH_ATRIUM_DIR: the same for Atrium's database, see
                                kept_atrium)
"""

import concurrent.futures
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
sys.path.insert(0, os.path.join(ROOT, "bench"))

ROOMS = int(os.environ.get("BENCH_ROOMS", "1000"))
FIRST = int(os.environ.get("BENCH_FIRST", "20"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "30"))
WITH_SYNAPSE = os.environ.get("BENCH_SYNAPSE", "1") != "0"
WITH_ATRIUM = os.environ.get("BENCH_ATRIUM", "1") != "0"  # 0: Synapse alone (to fill a kept one)
BASELINE_BIN = os.environ.get("BENCH_BASELINE_BIN")  # another atrium measured beside
WITH_UNKEPT = os.environ.get("BENCH_UNKEPT", "1") != "0"  # also Atrium keeping no first results
SYNAPSE_DIR = os.environ.get("BENCH_SYNAPSE_DIR")  # a filled Synapse kept across runs
ATRIUM_DIR = os.environ.get("BENCH_ATRIUM_DIR")    # a filled Atrium database kept across runs
MEMBERS = 10           # per room, the user included
MESSAGES = 20          # per room
WINDOW = 20
FILL_WORKERS = 8       # rooms filled at once
# In each conn_id and transaction ID: a kept Synapse (BENCH_SYNAPSE_DIR) remembers those of
# the earlier runs, and would answer a send with an earlier run's event.
RUN = f"{int(time.time())}"
WARMUP = 3             # first responses of each server before the figures, not counted
WAKE_SETTLE_S = 0.3    # Synapse shows no parked count: time for its request to park
SYNAPSE_IP = "127.0.0.71"
PARK_TIMEOUT_MS = 30000
SS = "/_matrix/client/unstable/org.matrix.simplified_msc3575/sync"
BODY = {"lists": {"all": {"ranges": [[0, WINDOW - 1]], "timeline_limit": 1, "required_state": [
    ["m.room.name", ""], ["m.room.avatar", ""], ["m.room.encryption", ""], ["m.room.member", "$LAZY"]]}}}

from rooms_client import Client  # noqa: E402
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


def fill(people):
    """ROOMS rooms of people[0] with the others joined and MESSAGES messages each: the
    room IDs, in the order they were made."""
    from rooms_client import V3, quote
    user, others = people[0], people[1:]

    def one(i):
        room = user.create_room(name=f"room {i}", preset="public_chat")
        for o in others:
            o.join(room)
        for j in range(MESSAGES):
            people[j % MEMBERS].ok("PUT", f"{V3}/rooms/{quote(room)}/send/m.room.message/f{i}.{j}",
                                   {"msgtype": "m.text", "body": f"message {j} of room {i}"})
        return room
    with concurrent.futures.ThreadPoolExecutor(FILL_WORKERS) as pool:
        return list(pool.map(one, range(ROOMS)))


def first_round(t, i):
    answer = ss(t.user, {"conn_id": f"first{i}-{RUN}", **BODY})
    assert len(answer["rooms"]) == min(WINDOW, ROOMS) and answer["lists"]["all"]["count"] == ROOMS, answer["lists"]


class Target:
    """One server under measurement: its user, the writer (a member of `room`), and the
    connections' positions between rounds. srv: Atrium's harness.Server (parked requests
    are counted), or None (Synapse)."""

    def __init__(self, srv, people, rooms):
        self.srv, self.user, self.writer, self.room = srv, people[0], people[1], rooms[0]
        self.pos = {}

    def incremental_round(self, i):
        body = {"conn_id": f"incremental-{RUN}", **BODY}
        if "inc" not in self.pos:
            self.pos["inc"] = ss(self.user, body)["pos"]
        self.writer.send(self.room, {"msgtype": "m.text", "body": f"i{i}"}, txn=f"i{i}-{RUN}")
        t0 = time.monotonic()
        answer = ss(self.user, body, pos=self.pos["inc"])
        took = (time.monotonic() - t0) * 1000
        assert self.room in answer["rooms"], answer
        self.pos["inc"] = answer["pos"]
        return took

    def wake_round(self, i):
        body = {"conn_id": f"wake-{RUN}", **BODY}
        if "wake" not in self.pos:
            self.pos["wake"] = ss(self.user, body)["pos"]
        done = {}
        base = parked(self.srv) if self.srv else 0

        def poll():
            done["answer"] = ss(self.user, body, pos=self.pos["wake"], timeout=PARK_TIMEOUT_MS)
            done["at"] = time.monotonic()
        t = threading.Thread(target=poll)
        t.start()
        if self.srv:
            wait_parked(self.srv, base + 1, timeout=10)
        else:
            time.sleep(WAKE_SETTLE_S)
        self.writer.send(self.room, {"msgtype": "m.text", "body": f"w{i}"}, txn=f"w{i}-{RUN}")
        sent = time.monotonic()
        t.join(PARK_TIMEOUT_MS / 1000 + 5)
        assert self.room in done["answer"]["rooms"], done["answer"]
        self.pos["wake"] = done["answer"]["pos"]
        return (done["at"] - sent) * 1000


def timed_fill(name, people, out):
    t0 = time.monotonic()
    out[name] = fill(people)
    print(f"== {name}: {ROOMS} rooms x {MEMBERS} members x {MESSAGES} messages made in "
          f"{time.monotonic() - t0:.0f} s", flush=True)


def settle(name, srv, timeout_s=1800):
    """Until Atrium's push sender has judged every event of the fill (it follows the stream
    behind the sends; measuring before would time its catch-up too)."""
    from harness import psql
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        done = psql("SELECT (SELECT stream_pos FROM push_cursor) >= (SELECT max(stream_pos) FROM events)",
                    database=srv.database)
        if done and done[0][0] == "t":
            print(f"== {name}: push sender caught up {time.monotonic() - t0:.0f} s after the fill", flush=True)
            return
        time.sleep(1)
    print(f"== {name}: push sender still behind after {timeout_s} s; measuring anyway", flush=True)


def turns(targets, i):
    """The targets in round i's order: each round starts one further along, so each server
    follows each other one as often (what a server still does after answering, Synapse's
    work after its response above all, falls on all of them alike, not on the next one)."""
    items = list(targets.items())
    k = i % len(items)
    return items[k:] + items[:k]


def measure(targets):
    """Every figure of every target, {name: {figure: [ms...]}}: the servers take turns
    round by round, so a change in the machine's load falls on all of them alike."""
    out = {name: {"first": [], "incremental": [], "wake": []} for name in targets}
    for i in range(WARMUP):  # not counted: a server started on a kept database is cold
        for t in targets.values():
            first_round(t, f"warm{i}")
    for i in range(FIRST):
        for name, t in turns(targets, i):
            t0 = time.monotonic()
            first_round(t, i)
            out[name]["first"].append((time.monotonic() - t0) * 1000)
    for i in range(ROUNDS):
        for name, t in turns(targets, i):
            out[name]["incremental"].append(t.incremental_round(i))
    for i in range(ROUNDS):
        for name, t in turns(targets, i):
            out[name]["wake"].append(t.wake_round(i))
    return out


def atrium_people(srv):
    from accounts import register
    from rooms_client import Client
    return [Client(srv, register(srv, "big" if i == 0 else f"member{i}")) for i in range(MEMBERS)]


def synapse_people(stack):
    """A Synapse started for the run (stopped by stack) and its accounts: admins without
    rate limits, as the fill sends far past Synapse's default message and join limits.
    (people, rooms): rooms is None when the accounts are still to be filled, else the rooms
    of a filled Synapse kept from an earlier run (BENCH_SYNAPSE_DIR)."""
    from test_federation_synapse import INSTALL_TIMEOUT_S, peer
    peer("install", timeout=INSTALL_TIMEOUT_S)
    if SYNAPSE_DIR:
        return kept_synapse(stack)
    # On tmpfs where there is one: Atrium's PostgreSQL runs without fsync (ATRIUM_PG_FAST).
    tmp = tempfile.mkdtemp(prefix="atrium-bench-synapse-", dir=tmpfs())
    stack.callback(shutil.rmtree, tmp, True)
    syn = launch_synapse(tmp, stack)
    return synapse_accounts(syn), None


def tmpfs():
    return "/dev/shm" if os.path.isdir("/dev/shm") else None


def launch_synapse(directory, stack):
    """A new Synapse whose files (database, certificates) are all under directory."""
    from federation_support import TestCA
    from test_federation_synapse import SynapseCase
    # (_launch_synapse makes its directory with tempfile, hence tempfile.tempdir.)
    saved, tempfile.tempdir = tempfile.tempdir, directory
    try:
        return SynapseCase._launch_synapse(TestCA(directory), None, SYNAPSE_IP, stack.callback)
    finally:
        tempfile.tempdir = saved


def synapse_accounts(syn):
    from rooms_client import Client
    people = []
    for i in range(MEMBERS):
        account = syn.register("big" if i == 0 else f"member{i}", f"bench-password-{i}", admin=True)
        syn.unlimit(account)
        people.append(Client(syn, account))
    return people


def kept_synapse(stack):
    """BENCH_SYNAPSE_DIR: a Synapse whose filled database outlives the run (filling 1,000
    rooms takes it 25 minutes or more). The first run with an empty directory makes and
    fills it and notes in state.json how to start it again (its start arguments, accounts
    and rooms); later runs with the same BENCH_ROOMS start it from there and skip its fill.
    Each run's rounds add their messages and connections to it (a few dozen messages in
    one room, a few connections: small beside the fill)."""
    import json
    from rooms_client import Client
    from test_federation_synapse import SynapsePeer, peer
    state_path = os.path.join(SYNAPSE_DIR, "state.json")
    if os.path.exists(state_path):
        with open(state_path, encoding="utf-8") as f:
            state = json.load(f)
        if state["rooms"] != ROOMS:
            sys.exit(f"{SYNAPSE_DIR} holds a Synapse filled with {state['rooms']} rooms, not {ROOMS}")
        syn = SynapsePeer(state["args"], **state["peer"])
        syn.start()
        stack.callback(peer, "stop", syn["dir"])
        people = [Client(syn, types.SimpleNamespace(**a)) for a in state["accounts"]]
        print(f"== Synapse 1.132: filled database kept in {SYNAPSE_DIR} (not filled again)", flush=True)
        return people, state["room_ids"]
    os.makedirs(SYNAPSE_DIR, exist_ok=True)
    syn = launch_synapse(SYNAPSE_DIR, contextlib.ExitStack())  # its directory is kept
    stack.callback(peer, "stop", syn["dir"])
    people = synapse_accounts(syn)
    syn.bench_state = {"rooms": ROOMS, "args": syn.start_args, "peer": dict(syn),
                       "accounts": [{"user_id": p.user_id, "token": p.token, "device_id": p.device_id}
                                    for p in people]}
    return people, None


def save_kept_synapse(people, rooms):
    """After the fill of a kept Synapse: state.json, which later runs start it from."""
    import json
    state = dict(people[0].srv.bench_state, room_ids=rooms)
    with open(os.path.join(SYNAPSE_DIR, "state.json.tmp"), "w", encoding="utf-8") as f:
        json.dump(state, f)
    os.replace(os.path.join(SYNAPSE_DIR, "state.json.tmp"), os.path.join(SYNAPSE_DIR, "state.json"))


def synapse_present():
    from test_federation_synapse import PEER_SH
    return os.path.exists(PEER_SH), PEER_SH


def report(results):
    cols = list(results)
    print(f"\n== Simplified Sliding Sync, {ROOMS} rooms ({MEMBERS} members, {MESSAGES} messages each), "
          f"window {WINDOW}, timeline_limit 1; ms, p50 / max")
    print(f"  {'':34}" + "".join(f"{c:>22}" for c in cols))
    rows = (("first", f"first response ({FIRST} runs)"), ("incremental", f"incremental ({ROUNDS} rounds)"),
            ("wake", f"wake from the send ({ROUNDS} rounds)"))
    for key, label in rows:
        cells = "".join(f"{percentile(results[c][key], 50):>12.1f} / {max(results[c][key]):>7.1f}" for c in cols)
        print(f"  {label:34}{cells}")
    if "Synapse 1.132" not in results:
        return
    s = results["Synapse 1.132"]
    for name in (n for n in cols if n != "Synapse 1.132"):
        a = results[name]
        print(f"  Synapse p50 / {name} p50: " + ", ".join(
            f"{k} {percentile(s[k], 50) / percentile(a[k], 50):.1f}x" for k, _ in rows))


def kept_atrium():
    """BENCH_ATRIUM_DIR: an Atrium database filled by an earlier run, which every Atrium of
    this run starts on a copy of (its accounts and rooms in state.json), or None. The run
    that finds no state.json there fills Atrium's account as usual, lets its push sender
    catch up, keeps a copy of the database, writes state.json and stops without measuring.
    The database stays in the PostgreSQL of ATRIUM_TEST_PG_CONNINFO, which must outlive the
    run. The kept database is at the migrations of the executable that filled it; each
    executable of a later run migrates its own copy at its start (fill with the oldest)."""
    if not ATRIUM_DIR:
        return None
    if not os.environ.get("ATRIUM_TEST_PG_CONNINFO"):
        sys.exit("BENCH_ATRIUM_DIR needs ATRIUM_TEST_PG_CONNINFO: a PostgreSQL that outlives the run")
    path = os.path.join(ATRIUM_DIR, "state.json")
    if not os.path.exists(path):
        return None
    import json
    with open(path, encoding="utf-8") as f:
        state = json.load(f)
    if state["rooms"] != ROOMS:
        sys.exit(f"{ATRIUM_DIR} holds an Atrium database filled with {state['rooms']} rooms, not {ROOMS}")
    return state


def keep_atrium(srv, people, rooms):
    """After the fill of srv (its push sender caught up): a copy of its database, and
    ATRIUM_DIR/state.json naming it (see kept_atrium)."""
    import json
    import harness
    from harness import create_database
    srv.stop()
    # The bench's own kept connection (harness.psql) would block the copy.
    harness._SQL.forget(harness._sql_conninfo(srv.database))
    kept = create_database("atrium_bench_kept", template=srv.database)
    os.makedirs(ATRIUM_DIR, exist_ok=True)
    state = {"rooms": ROOMS, "database": kept, "room_ids": rooms,
             "accounts": [{"user_id": p.user_id, "token": p.token, "device_id": p.device_id} for p in people]}
    with open(os.path.join(ATRIUM_DIR, "state.json.tmp"), "w", encoding="utf-8") as f:
        json.dump(state, f)
    os.replace(os.path.join(ATRIUM_DIR, "state.json.tmp"), os.path.join(ATRIUM_DIR, "state.json"))
    print(f"== Atrium: database kept as {kept} (state in {ATRIUM_DIR}); run again to measure", flush=True)


def start_atrium(binary, template=None, settings=None):
    """An Atrium on a database of its own (binary: another executable than ATRIUM_BIN's;
    template: a kept database it starts on a copy of; settings: more of its config)."""
    from accounts import REGISTRATION_ON
    from harness import Server, create_database
    srv = Server(database=create_database("atrium_bench", template=template),
                 settings={**REGISTRATION_ON, **(settings or {})}, start=False)
    saved = os.environ.get("ATRIUM_BIN")
    if binary:
        os.environ["ATRIUM_BIN"] = binary
    try:
        srv.start()
    finally:
        if binary and saved is None:
            del os.environ["ATRIUM_BIN"]
        elif binary:
            os.environ["ATRIUM_BIN"] = saved
    return srv


def main():
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # cleanup runs on TERM too
    pg_work = ensure_pg()
    from harness import drop_database
    servers, people, rooms = {}, {}, {}
    try:
        with contextlib.ExitStack() as stack:
            kept = kept_atrium()
            template = kept["database"] if kept else None
            if WITH_ATRIUM:
                servers["Atrium"] = start_atrium(None, template)
            if WITH_ATRIUM and WITH_UNKEPT and (kept or not ATRIUM_DIR):
                servers["Atrium, nothing kept"] = start_atrium(None, template, {"sliding_sync": {"cache_mb": 0}})
            if BASELINE_BIN:
                servers["Atrium baseline"] = start_atrium(BASELINE_BIN, template)
            for name, srv in servers.items():
                if kept:
                    people[name] = [Client(srv, types.SimpleNamespace(**a)) for a in kept["accounts"]]
                    rooms[name] = kept["room_ids"]
                else:
                    people[name] = atrium_people(srv)
            if kept:
                print(f"== Atrium: on copies of the kept database {template} (not filled again)", flush=True)
            present, peer_sh = synapse_present()
            if not WITH_SYNAPSE:
                print("== Synapse: not measured (BENCH_SYNAPSE=0)")
            elif not present:
                print(f"== Synapse: not measured (no peer at {peer_sh})")
            else:
                people["Synapse 1.132"], kept_rooms = synapse_people(stack)
                if kept_rooms:
                    rooms["Synapse 1.132"] = kept_rooms
            # Every account is filled at once (set-up only); then the figures, the servers
            # taking turns (the others idle meanwhile).
            fills = [threading.Thread(target=timed_fill, args=(name, p, rooms))
                     for name, p in people.items() if name not in rooms]
            for t in fills:
                t.start()
            for t in fills:
                t.join()
            if SYNAPSE_DIR and "Synapse 1.132" in people and hasattr(people["Synapse 1.132"][0].srv, "bench_state"):
                save_kept_synapse(people["Synapse 1.132"], rooms["Synapse 1.132"])
            for name, srv in servers.items():
                settle(name, srv)
            if ATRIUM_DIR and not kept and servers:
                name = next(iter(servers))
                keep_atrium(servers[name], people[name], rooms[name])
                return
            targets = {name: Target(servers.get(name), people[name], rooms[name]) for name in people}
            results = measure(targets)
            for name, srv in servers.items():  # what the kept first results held and did
                kept_bytes = srv.metric("atrium_sliding_sync_cache_bytes")
                if kept_bytes is not None:
                    print(f"== {name}: {srv.metric('atrium_sliding_sync_cache_entries'):.0f} room results kept, "
                          f"{kept_bytes / 1024:.1f} KiB; hits {srv.metric('atrium_sliding_sync_cache_hits_total'):.0f},"
                          f" misses {srv.metric('atrium_sliding_sync_cache_misses_total'):.0f}", flush=True)
        report(results)
    finally:
        for srv in servers.values():
            srv.close()
            drop_database(srv.database)
        if pg_work:
            subprocess.run(["bash", os.path.join(ROOT, "tests/lib/pg.sh"), "stop", pg_work], check=False)
            shutil.rmtree(pg_work, ignore_errors=True)


if __name__ == "__main__":
    main()
