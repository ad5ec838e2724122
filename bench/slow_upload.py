#!/usr/bin/env python3
"""Throughput of a slow but steady upload. Prints numbers, asserts nothing.

One client uploads BENCH_SLOW_UPLOAD_MB megabytes (default 5; the figure the issue names
is 50) to POST /_matrix/media/v3/upload at BENCH_SLOW_UPLOAD_KBIT kbit/s (default 1000,
1 Mbit/s), paced in 100 ms steps, against a server whose server.http.handoff_deadline_ms
is BENCH_DEADLINE_MS (default 10000), so the body takes several deadlines to arrive. It
prints the answer's status, the achieved rate, the time from the last byte to the answer,
and whether the stored bytes match.

    bench/slow_upload.py        (ATRIUM_BIN etc. as for the integration tests)

At the defaults the upload takes about 42 s; BENCH_SLOW_UPLOAD_MB=50 takes about 7 minutes.
Uses the integration-test harness (a fresh database in ATRIUM_TEST_PG_CONNINFO's cluster;
without it, a private cluster in a temporary directory).
"""

import hashlib
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))

MB = float(os.environ.get("BENCH_SLOW_UPLOAD_MB", "5"))
KBIT = float(os.environ.get("BENCH_SLOW_UPLOAD_KBIT", "1000"))
DEADLINE_MS = int(os.environ.get("BENCH_DEADLINE_MS", "10000"))
STEP_S = 0.1


def main():
    from harness import Server, raw_connect, read_head
    from media_support import download_path, register

    pg = None
    if not os.environ.get("ATRIUM_TEST_PG_CONNINFO"):
        from pg_private import PrivatePostgres
        pg = PrivatePostgres(tempfile.mkdtemp(prefix="atrium-bench-pg-"))
        ci = pg.conninfo("postgres")
        os.environ["ATRIUM_TEST_PG_CONNINFO"] = " ".join(
            p for p in ci.split() if not p.startswith("dbname="))
    try:
        def settings(tmp):
            return {"registration": {"enabled": True}, "log": {"level": "warn"},
                    "server": {"http": {"handoff_deadline_ms": DEADLINE_MS}},
                    "plugins": {"media": {"enabled": True,
                                          "store_path": os.path.join(tmp, "media_store")}}}
        with Server(settings=settings) as srv:
            _, token = register(srv)
            body = os.urandom(int(MB * 1024 * 1024))
            per_step = max(1, int(KBIT * 1000 / 8 * STEP_S))
            print(f"{len(body)} bytes at {KBIT:.0f} kbit/s ({per_step} bytes per {STEP_S * 1000:.0f} ms), "
                  f"handoff deadline {DEADLINE_MS} ms")
            sock = raw_connect(srv.port, timeout=60)
            sock.sendall((f"POST /_matrix/media/v3/upload HTTP/1.1\r\nHost: bench\r\n"
                          f"Authorization: Bearer {token}\r\nContent-Type: application/octet-stream\r\n"
                          f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode())
            started = time.monotonic()
            for i in range(0, len(body), per_step):
                sock.sendall(body[i:i + per_step])
                next_at = started + (i // per_step + 1) * STEP_S
                time.sleep(max(0.0, next_at - time.monotonic()))
            sent_at = time.monotonic()
            status, _, rest = read_head(sock)
            answered_at = time.monotonic()
            while True:
                more = sock.recv(65536)
                if not more:
                    break
                rest += more
            sock.close()
            took = sent_at - started
            print(f"status {status} after {answered_at - started:.1f} s; body sent in {took:.1f} s "
                  f"({len(body) * 8 / took / 1000:.0f} kbit/s); answer {1000 * (answered_at - sent_at):.0f} ms "
                  f"after the last byte")
            if status == 200:
                media_id = json.loads(rest)["content_uri"].rsplit("/", 1)[1]
                got = srv.request("GET", download_path(srv, media_id), token=token, timeout=60)[2]
                same = hashlib.sha256(got).digest() == hashlib.sha256(body).digest()
                print(f"stored bytes {'match' if same else 'DIFFER'}")
            else:
                print(f"answer: {rest[:300]!r}")
    finally:
        if pg:
            pg.close()


if __name__ == "__main__":
    main()
