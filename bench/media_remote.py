#!/usr/bin/env python3
"""Remote media figures. Prints numbers beside a baseline measured in the same run;
asserts nothing.

  1. 100 concurrent downloads of one uncached remote file: requests that reached the
     origin, and wall time; baseline: the same 100 once the file is cached.
  2. 150 distinct remote images requested at once by one client: valid answers and wall
     time; baseline: the same 150 from the cache.
  3. p50/p99 of /versions and of a cached remote download (asked by another client, from
     another address) while a black-hole origin holds its per-origin cap of fetches (and
     more requests wait behind it); baseline: the same with none outstanding.
  4. Time to first byte of a 20 MiB remote file the origin sends slowly (STREAM_STEP bytes
     every STREAM_PAUSE_S), for 10 simultaneous waiters; beside the time the whole fetch
     takes (first request to the origin's last byte) and each waiter's last byte.

    bench/media_remote.py        (ATRIUM_BIN etc. as for the integration tests)

One Atrium on 127.0.0.21 and fake origins (tests/integration/test_media_remote.FakeOrigin:
HTTPS from a CA made for the run, a per-answer delay of DELAY_S) on 127.0.0.3x.
"""

import hashlib
import http.client
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import harness  # noqa: E402
from federation_support import FederatedServer, TestCA  # noqa: E402
from media_support import get_many, png, register  # noqa: E402
from sync_longpoll import ensure_pg  # noqa: E402
from test_media_remote import FakeOrigin  # noqa: E402
from test_media_remote_streams import follow  # noqa: E402

DELAY_S = 0.2
PROBES = 300
STREAM_BYTES = 20 * 1024 * 1024
STREAM_STEP = 256 * 1024
STREAM_PAUSE_S = 0.05
STREAM_WAITERS = 10


def start_atrium(ca):
    srv = FederatedServer(ca, "127.0.0.21", start=False)
    srv._settings = harness.deep_merge(srv._settings, {
        "registration": {"enabled": True},
        "plugins": {"media": {"enabled": True, "store_path": os.path.join(srv.dir, "media_store"),
                              "remote_fetch_timeout_ms": 60000}}})
    srv.write_config()
    srv.start()
    return srv


def timed_many(srv, paths, token):
    started = time.monotonic()
    results = get_many(srv, paths, token, len(paths), timeout=120)
    return results, time.monotonic() - started


def latencies(srv, path, token, n=PROBES, source="127.0.0.2"):
    """p50 and p99 (ms) of n GETs from another client address than the load's (each client
    address has its own share of the delivery line)."""
    out = []
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    for _ in range(n):
        t0 = time.monotonic()
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30,
                                          source_address=(source, 0))
        conn.request("GET", path, headers=headers)
        conn.getresponse().read()
        conn.close()
        out.append((time.monotonic() - t0) * 1000)
    out.sort()
    return statistics.median(out), out[int(len(out) * 0.99) - 1]


def main():
    pg = ensure_pg()
    tmp = tempfile.mkdtemp(prefix="atrium-bench-media-remote-")
    closers = []
    try:
        ca = TestCA(tmp)
        origin = FakeOrigin(ca, "127.0.0.33")
        closers.append(origin.close)
        a = start_atrium(ca)
        closers.append(lambda: a.close(raise_errors=False))
        _, token = register(a)
        origin.delay_s = DELAY_S

        data = os.urandom(1 << 20)
        origin.files["one"] = ("ok", data, "application/octet-stream")
        path = f"/_matrix/client/v1/media/download/{origin.server_name}/one"
        cold, cold_s = timed_many(a, [path] * 100, token)
        warm, warm_s = timed_many(a, [path] * 100, token)
        ok = sum(1 for r in cold if r[0] == 200 and hashlib.sha256(r[2]).digest() ==
                 hashlib.sha256(data).digest())
        print(f"100 concurrent downloads of one 1 MiB remote file (origin answers after {DELAY_S} s):")
        print(f"  uncached: {ok}/100 valid, {origin.media_hits('one')} request(s) reached the "
              f"origin, {cold_s:.2f} s")
        print(f"  cached (baseline): {sum(1 for r in warm if r[0] == 200)}/100 valid, {warm_s:.2f} s")

        for i in range(150):
            origin.files[f"img{i}"] = ("ok", png(64, 48), "image/png")
        paths = [f"/_matrix/client/v1/media/download/{origin.server_name}/img{i}" for i in range(150)]
        cold, cold_s = timed_many(a, paths, token)
        warm, warm_s = timed_many(a, paths, token)
        print("150 distinct remote images at once, one client:")
        print(f"  uncached: {sum(1 for r in cold if r[0] == 200)}/150 valid, {cold_s:.2f} s")
        print(f"  cached (baseline): {sum(1 for r in warm if r[0] == 200)}/150 valid, {warm_s:.2f} s")

        big = os.urandom(STREAM_BYTES)
        origin.files["big"] = ("drip", big, STREAM_STEP, STREAM_PAUSE_S, None)
        origin.delay_s = 0
        big_path = f"/_matrix/client/v1/media/download/{origin.server_name}/big?timeout_ms=60000"
        followed = [None] * STREAM_WAITERS
        started = time.monotonic()

        def follow_one(i):
            followed[i] = follow(a, big_path, token, timeout=120) + (time.monotonic(),)
        threads = [threading.Thread(target=follow_one, args=(i,)) for i in range(STREAM_WAITERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        fetch_s = origin.finished["big"] - started
        digest = hashlib.sha256(big).digest()
        valid = sum(1 for f in followed if f and f[0] == 200 and f[4] and
                    hashlib.sha256(f[3]).digest() == digest)
        ttfb = sorted((f[2] - started) for f in followed if f and f[2] is not None)
        last = sorted((f[5] - started) for f in followed if f)
        print(f"{STREAM_WAITERS} simultaneous waiters of one 20 MiB remote file "
              f"({STREAM_STEP // 1024} KiB every {STREAM_PAUSE_S} s from the origin):")
        print(f"  {valid}/{STREAM_WAITERS} byte-identical, {origin.media_hits('big')} request(s) "
              f"reached the origin")
        print(f"  time to first byte: min {ttfb[0]:.2f} s, median {statistics.median(ttfb):.2f} s, "
              f"max {ttfb[-1]:.2f} s; the whole fetch (baseline): {fetch_s:.2f} s; "
              f"last byte at waiters: max {last[-1]:.2f} s")

        versions = "/_matrix/client/versions"
        cached = path
        quiet_v = latencies(a, versions, None)
        quiet_c = latencies(a, cached, token)  # the probes' client, another address
        hole = FakeOrigin(ca, "127.0.0.35")
        closers.insert(0, hole.close)
        for i in range(24):
            hole.files[f"h{i}"] = ("hang",)
        waiting = [threading.Thread(target=a.request, daemon=True,
                                    args=("GET", f"/_matrix/client/v1/media/download/"
                                          f"{hole.server_name}/h{i}?timeout_ms=60000"),
                                    kwargs={"token": token, "timeout": 120})
                   for i in range(24)]
        for t in waiting:
            t.start()
        time.sleep(1.0)
        running = a.metric("atrium_media_remote_fetches_running")
        busy_threads = a.metric("atrium_pool_busy", {"pool": "media.fetch"})
        _, token2 = register(a)  # another user on another address probes
        busy_v = latencies(a, versions, None)
        busy_c = latencies(a, cached, token2)
        print(f"black-hole origin: 24 requests, {running:.0f} fetches running (per-origin cap), "
              f"{busy_threads:.0f} fetch-pool threads busy:")
        print(f"  /versions          none (baseline) p50 {quiet_v[0]:.2f} ms p99 {quiet_v[1]:.2f} ms;"
              f" with black hole p50 {busy_v[0]:.2f} ms p99 {busy_v[1]:.2f} ms")
        print(f"  cached download    none (baseline) p50 {quiet_c[0]:.2f} ms p99 {quiet_c[1]:.2f} ms;"
              f" with black hole p50 {busy_c[0]:.2f} ms p99 {busy_c[1]:.2f} ms")
    finally:
        for close in closers:
            try:
                close()
            except Exception:  # a bench tears down whatever it can
                pass
        shutil.rmtree(tmp, ignore_errors=True)
        if pg:
            import subprocess
            subprocess.run(["bash", os.path.join(ROOT, "tests/lib/pg.sh"), "stop", pg])
            shutil.rmtree(pg, ignore_errors=True)


if __name__ == "__main__":
    main()
