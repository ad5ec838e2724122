#!/usr/bin/env python3
"""Federation transactions per second to 30 destinations with 1, 2 and 3 Atrium processes
of one server on one database (the sender spread over processes: ADR-0026,
docs/adr/0026-federation-sender-groups.md). Prints numbers, asserts nothing; the
1-process figure, measured in the same run, is the baseline.

For each process count N: a fresh database, N processes of bench.test (federation
listeners 127.0.8.101-103, one signing key, server.lease_ttl_ms 3000), the 16 sender
groups shared out over them; one room with a user of each of 30 fake receivers joined (a
fixture row each); CLIENTS client threads sending m.room.message events as fast as their
answers come, through the N processes in turn, for SECONDS. The receivers (127.0.8.1-30,
TLS, HTTP/1.1 keep-alive, Python threads in this process) answer every transaction 200
at once and count it. Figures: transactions per second received during the window, PDUs
per second, PDUs per transaction (a sender that falls behind sends bigger ones), and
how long the backlog took to drain after the window.

    bench/federation_senders.py      (ATRIUM_BIN etc. as for the integration tests)
"""

import http.server
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import harness  # noqa: E402
from accounts import REGISTRATION_ON, register  # noqa: E402
from federation_support import FederatedServer, TestCA, free_port  # noqa: E402
from rooms_client import Client  # noqa: E402
from sync_longpoll import ensure_pg  # noqa: E402

SECONDS = float(os.environ.get("BENCH_SECONDS", "10"))
CLIENTS = int(os.environ.get("BENCH_CLIENTS", "6"))
DESTINATIONS = 30
PROCESS_COUNTS = (1, 2, 3)
PROC_IPS = ("127.0.8.101", "127.0.8.102", "127.0.8.103")
RECEIVER_IPS = tuple(f"127.0.8.{1 + i}" for i in range(DESTINATIONS))
GROUPS = 16
DRAIN_LIMIT_S = 120

NOTE = ("On this 2-core machine the processes, PostgreSQL, the clients and the receivers\n"
        "share two cores (and other jobs may run beside): read the ratios, not the absolutes.\n"
        "PDUs/txn well above 1: the senders fell behind the offered load and batched (each\n"
        "message is queued to all 30 destinations); near 1: they kept up with it.")


class Receiver:
    """A peer that answers every PUT .../send/{txnId} 200 at once and counts it."""

    def __init__(self, ca, ip):
        self.ip, self.port = ip, free_port(ip)
        self.server_name = f"{ip}:{self.port}"
        self.txns = self.pdus = 0
        self.lock = threading.Lock()
        cert, key = ca.issue(f"bench-recv-{ip}", ip)
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: the sender's connections are reused

            def do_PUT(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with outer.lock:
                    outer.txns += 1
                    outer.pdus += len(body.get("pdus", []))
                data = b'{"pdus":{}}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer((ip, self.port), Handler)
        self.httpd.daemon_threads = True
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def counts(self):
        with self.lock:
            return self.txns, self.pdus

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def totals(receivers):
    txns = pdus = 0
    for r in receivers:
        t, p = r.counts()
        txns, pdus = txns + t, pdus + p
    return txns, pdus


def wait_for(cond, limit_s, what):
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


def measure(ca, n, receivers, tmp):
    db = harness.create_database()
    procs = []
    try:
        extra = harness.deep_merge(REGISTRATION_ON, {
            "federation": {"signing_key_path": os.path.join(tmp, f"bench{n}.signing.key"),
                           "sender_groups": GROUPS},
            "server": {"lease_ttl_ms": 3000}})
        procs = [FederatedServer(ca, ip, extra=extra, name="bench.test", database=db)
                 for ip in PROC_IPS[:n]]
        for p in procs:
            p.start()
        share = -(-GROUPS // n)
        wait_for(lambda: all(share - 2 <= p.metric("atrium_federation_outbound_groups_held")
                             <= share for p in procs)
                 and sum(p.metric("atrium_federation_outbound_groups_held") for p in procs)
                 == GROUPS, 60, "the sender groups shared out")
        accounts = [register(procs[0], f"bench{i}") for i in range(CLIENTS)]
        owner = Client(procs[0], accounts[0])
        room = owner.create_room(preset="public_chat")
        for acct in accounts[1:]:
            Client(procs[0], acct).join(room)
        values = ", ".join(f"('{room}', 'm.room.member', '@r:{r.server_name}', '$fixture{i}',"
                           " 'join')" for i, r in enumerate(receivers))
        harness.psql("INSERT INTO current_state (room_id, type, state_key, event_id,"
                     f" membership) VALUES {values}", database=db)

        sent = [0] * CLIENTS
        stop = time.monotonic() + SECONDS

        def loop(i):
            client = Client(procs[i % n], accounts[i])
            k = 0
            while time.monotonic() < stop:
                status, _ = client.call("PUT", f"/_matrix/client/v3/rooms/{urllib.parse.quote(room)}/send/"
                                        f"m.room.message/b{n}-{i}-{k}",
                                        {"msgtype": "m.text", "body": f"{i} {k}"}, timeout=30)
                k += 1
                sent[i] += status == 200

        txns0, pdus0 = totals(receivers)
        started = time.monotonic()
        threads = [threading.Thread(target=loop, args=(i,)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        window = time.monotonic() - started
        txns1, pdus1 = totals(receivers)
        expected = sum(sent) * DESTINATIONS
        ended = time.monotonic()
        wait_for(lambda: harness.psql("SELECT count(*) FROM federation_outbound",
                                      database=db)[0][0] == "0", DRAIN_LIMIT_S, "the drain")
        drain = time.monotonic() - ended
        txns2, pdus2 = totals(receivers)
        per_proc = [p.metric("atrium_federation_outbound_transactions_total",
                             {"outcome": "sent"}) for p in procs]
        return {"txn_s": (txns1 - txns0) / window, "pdu_s": (pdus1 - pdus0) / window,
                "per_txn": (pdus2 - pdus0) / max(1, txns2 - txns0), "drain": drain,
                "msgs_s": sum(sent) / window, "delivered": pdus2 - pdus0,
                "expected": expected, "per_proc": per_proc}
    finally:
        for p in procs:
            p.close(raise_errors=False)
        harness.drop_database(db)


def main():
    pg = ensure_pg()
    tmp = tempfile.mkdtemp(prefix="atrium-bench-senders-")
    receivers = []
    try:
        ca = TestCA(tmp)
        receivers = [Receiver(ca, ip) for ip in RECEIVER_IPS]
        print(f"== federation transactions to {DESTINATIONS} destinations, {CLIENTS} clients "
              f"sending for {SECONDS:.0f} s; baseline: 1 process, same run")
        print(NOTE)
        print(f"  {'processes':>9}  {'txn/s':>7}  {'vs 1':>5}  {'PDUs/s':>7}  {'PDUs/txn':>8}  "
              f"{'msgs/s':>6}  {'drain':>6}  delivered/expected  sent per process")
        base = None
        for n in PROCESS_COUNTS:
            r = measure(ca, n, receivers, tmp)
            base = base or r["txn_s"]
            print(f"  {n:>9}  {r['txn_s']:>7.0f}  {r['txn_s'] / base:>5.2f}  {r['pdu_s']:>7.0f}  "
                  f"{r['per_txn']:>8.2f}  {r['msgs_s']:>6.0f}  {r['drain']:>5.1f}s  "
                  f"{r['delivered']}/{r['expected']}  "
                  f"{', '.join(f'{v:.0f}' for v in r['per_proc'])}")
    finally:
        for r in receivers:
            r.close()
        shutil.rmtree(tmp, ignore_errors=True)
        if pg:
            subprocess.run(["bash", os.path.join(ROOT, "tests/lib/pg.sh"), "stop", pg],
                           check=False)
            shutil.rmtree(pg, ignore_errors=True)


if __name__ == "__main__":
    main()
