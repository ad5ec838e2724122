#!/usr/bin/env python3
"""Latency figures while PostgreSQL is frozen. Prints numbers, asserts nothing.

p50/p99/max of GET /_matrix/client/versions and of an authenticated download of a 100 KB
original (read before, so the token is in the token cache and the file in the page cache)
under CLIENTS concurrent keep-alive clients, first with PostgreSQL running, then while it is
frozen (SIGSTOP of the postmaster and its children for FREEZE_S seconds), with the status
codes seen; then the time from SIGCONT until downloads answer 200 again.

    bench/db_frozen.py        (ATRIUM_BIN etc. as for the integration tests)

A download needs its media row from PostgreSQL, so while it is frozen the download's
figure is how fast it is refused (503 with Retry-After), not served. The cluster is always a
private one (tests/lib/pg.sh in a temporary directory): freezing the test run's shared
cluster would stall every other test. BENCH_CLIENTS, BENCH_PHASE_S and BENCH_FREEZE_S change
the load and the durations.
"""

import http.client
import os
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))

CLIENTS = int(os.environ.get("BENCH_CLIENTS", "8"))
PHASE_S = float(os.environ.get("BENCH_PHASE_S", "5"))
FREEZE_S = float(os.environ.get("BENCH_FREEZE_S", "10"))
FILE_BYTES = 100 * 1024


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))] if values else 0


def load(port, paths, token, seconds):
    """CLIENTS threads, each alternating over paths on one keep-alive connection, for
    `seconds`; returns {path: ([latency s], {status: count})}."""
    out = {p: ([], {}) for p in paths}
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def client(k):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        i = k
        while time.monotonic() < stop:
            path = paths[i % len(paths)]
            i += 1
            started = time.monotonic()
            try:
                conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
                resp = conn.getresponse()
                resp.read()
                status = resp.status
                if resp.getheader("Connection", "").lower() == "close":
                    conn.close()
            except (OSError, http.client.HTTPException):
                status = "error"
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            took = time.monotonic() - started
            with lock:
                out[path][0].append(took)
                out[path][1][status] = out[path][1].get(status, 0) + 1
        conn.close()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def report(title, figures, names):
    print(f"== {title}")
    for path, name in names.items():
        lat, statuses = figures[path]
        ms = [x * 1000 for x in lat]
        print(f"  {name:10s} n={len(ms):6d}  p50 {percentile(ms, 50):7.2f} ms  "
              f"p99 {percentile(ms, 99):7.2f} ms  max {max(ms) if ms else 0:7.1f} ms  "
              f"statuses {dict(sorted(statuses.items(), key=str))}")


def main():
    from harness import Server
    from media_support import download_path, register, upload
    from pg_private import PrivatePostgres

    with PrivatePostgres(tempfile.mkdtemp(prefix="atrium-bench-pg-")) as pg:
        conninfo = pg.conninfo("atrium_bench")
        os.environ.setdefault("ATRIUM_TEST_PG_CONNINFO", " ".join(
            p for p in conninfo.split() if not p.startswith("dbname=")))
        def settings(tmp):
            return {"database": {"conninfo": conninfo}, "registration": {"enabled": True},
                    "log": {"level": "warn"},
                    "plugins": {"media": {"enabled": True,
                                          "store_path": os.path.join(tmp, "media_store")}}}
        with Server(settings=settings, database="atrium_bench") as srv:
            _, token = register(srv)
            media_id = upload(srv, token, os.urandom(FILE_BYTES))
            names = {"/_matrix/client/versions": "/versions",
                     download_path(srv, media_id): "download"}
            for path in names:
                srv.request("GET", path, token=token)
            print(f"{CLIENTS} keep-alive clients, {PHASE_S:.0f} s unloaded phase, "
                  f"{FREEZE_S:.0f} s frozen, {os.cpu_count()} CPUs")
            report("PostgreSQL running", load(srv.port, list(names), token, PHASE_S), names)
            with pg.frozen():
                frozen = load(srv.port, list(names), token, FREEZE_S)
            thawed = time.monotonic()
            report("PostgreSQL frozen (SIGSTOP)", frozen, names)
            dl = download_path(srv, media_id)
            while srv.request("GET", dl, token=token)[0] != 200:
                time.sleep(0.02)
            print(f"== downloads served again {1000 * (time.monotonic() - thawed):.0f} ms after SIGCONT")


if __name__ == "__main__":
    main()
