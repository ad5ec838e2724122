"""Driver of bench/media_gallery.sh: uploads distinct copies of a 12 MP photo, then asks for
one thumbnail of each at the same moment (one connection per request, as a gallery page
opening), and prints wall time, the server's CPU time per thumbnail, peak RSS and peak open
descriptors of the server.

Beside each gallery, in the same run, the decode floor: the same original files (read
from the store) decoded by `djpeg -scale 1/8` (libjpeg-turbo's own DCT scaling, the
least work any JPEG thumbnailer must do) to /dev/null, one worker per CPU: its wall time
and CPU time per image.

Copies differ by a JPEG comment segment after SOI, so each has its own SHA-256 (its own
render) while decoding exactly like the original. Python standard library only."""

import argparse
import http.client
import json
import os
import shutil
import struct
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor


def variant(photo, index):
    comment = f"atrium gallery copy {index}".encode()
    return photo[:2] + b"\xff\xfe" + struct.pack(">H", len(comment) + 2) + comment + photo[2:]


def request(port, method, path, token, body=None, headers=None, timeout=600):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        h = {"Authorization": f"Bearer {token}", **(headers or {})}
        conn.request(method, path, body=body, headers=h)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def parallel(n, threads, fn):
    results = [None] * n
    nxt = [0]
    lock = threading.Lock()

    def work():
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= n:
                return
            try:
                results[i] = fn(i)
            except OSError as e:
                results[i] = (None, repr(e).encode())
    ts = [threading.Thread(target=work, daemon=True) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return results


class Sampler:
    """Peak VmRSS and open descriptors of a process, sampled every 20 ms."""

    def __init__(self, pid):
        self.pid, self.rss_kib, self.fds = pid, 0, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop.is_set():
            try:
                with open(f"/proc/{self.pid}/status") as f:
                    for line in f:
                        if line.startswith("VmRSS:"):
                            self.rss_kib = max(self.rss_kib, int(line.split()[1]))
                self.fds = max(self.fds, len(os.listdir(f"/proc/{self.pid}/fd")))
            except OSError:
                pass
            time.sleep(0.02)

    def finish(self):
        self.stop.set()
        self.thread.join()


def cpu_seconds(pid):
    """User + system CPU time a process has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def original_path(store, media_id):
    """Where store.c keeps a local original (plugins/media/store.c, layout)."""
    a, b = (media_id + "____")[0:2], (media_id + "____")[2:4]
    return os.path.join(store, "local", a, b, media_id)


def decode_floor(paths, scale):
    """djpeg -scale over the files, one worker per CPU: (wall s, CPU s of the decoders)."""
    before = os.times()
    t0 = time.monotonic()

    def one(path):
        subprocess.run(["djpeg", "-scale", scale, "-outfile", os.devnull, path], check=True)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        list(pool.map(one, paths))
    wall = time.monotonic() - t0
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return wall, cpu


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("--server-name", required=True)
    ap.add_argument("--photo", required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--store", required=True)
    ap.add_argument("--counts", default="150,1000")
    ap.add_argument("--size", default="320x240")
    ap.add_argument("--method", default="scale")
    ap.add_argument("--floor-scale", default="1/8", help="djpeg -scale of the decode floor")
    args = ap.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    with open(args.photo, "rb") as f:
        photo = f.read()

    started = time.monotonic()

    def up(i):
        status, body = request(args.port, "POST", "/_matrix/media/v3/upload", args.token,
                               body=variant(photo, i), headers={"Content-Type": "image/jpeg"})
        if status != 200:
            raise SystemExit(f"upload {i} answered {status}: {body[:200]!r}")
        return json.loads(body)["content_uri"].rsplit("/", 1)[1]
    ids = parallel(max(counts), 8, up)
    print(f"uploaded {len(ids)} distinct 12 MP JPEGs ({len(photo)} bytes each) in "
          f"{time.monotonic() - started:.1f} s")
    w, h = args.size.split("x")
    print(f"{'gallery':>8} {'wall s':>7} {'CPU ms/th':>10} {'floor wall s':>13} "
          f"{'floor CPU ms':>13} {'x wall':>7} {'x CPU':>6} {'ok':>5} {'other':>6} "
          f"{'peak RSS MiB':>13} {'peak fds':>9}")
    for n in counts:
        shutil.rmtree(os.path.join(args.store, "thumbnails"), ignore_errors=True)
        sampler = Sampler(args.pid)
        cpu0 = cpu_seconds(args.pid)
        t0 = time.monotonic()
        results = parallel(n, n, lambda i: request(
            args.port, "GET",
            f"/_matrix/client/v1/media/thumbnail/{args.server_name}/{ids[i]}"
            f"?width={w}&height={h}&method={args.method}", args.token))
        wall = time.monotonic() - t0
        cpu = cpu_seconds(args.pid) - cpu0
        sampler.finish()
        floor_wall, floor_cpu = decode_floor([original_path(args.store, i) for i in ids[:n]],
                                             args.floor_scale)
        ok = sum(1 for s, b in results if s == 200 and b[:4] == b"RIFF" and b[8:12] == b"WEBP")
        others = {}
        for s, _ in results:
            if s != 200:
                others[s] = others.get(s, 0) + 1
        print(f"{n:>8} {wall:>7.2f} {cpu * 1000 / n:>10.1f} {floor_wall:>13.2f} "
              f"{floor_cpu * 1000 / n:>13.1f} {wall / floor_wall:>7.2f} {cpu / floor_cpu:>6.2f} "
              f"{ok:>5} {n - ok:>6} {sampler.rss_kib / 1024:>13.0f} {sampler.fds:>9}"
              + (f"   non-200: {others}" if others else ""), flush=True)


if __name__ == "__main__":
    main()
