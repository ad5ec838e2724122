"""A crash in the middle of media work: the server is killed with SIGKILL during a burst
of uploads and thumbnail renders, then restarted. No torn file may exist (every stored
thumbnail is a complete WebP, every original matches its SHA-256), no temporary file may
be left, and every upload that was acknowledged must download intact."""

import os
import threading
import unittest

from common import AtriumTestCase, wait_until
from media_support import (download_path, media_server, noise_png, register, sha256,
                           store_files, thumbnail_path, upload, vips_decode, webp_size)

SIZES = [(32, 32, "crop"), (96, 96, "crop"), (320, 240, "scale"), (640, 480, "scale"),
         (800, 600, "scale")]


class CrashTest(AtriumTestCase):
    def test_sigkill_during_uploads_and_renders_leaves_no_torn_file_and_loses_no_acknowledged_upload(self):
        srv = media_server(self)
        _, token = register(srv)
        _, admin = register(srv, admin=True)
        images = [upload(srv, token, noise_png(900, 700, seed=i), "image/png") for i in range(12)]
        acknowledged = {}
        lock = threading.Lock()
        stop = threading.Event()

        def uploader(k):
            n = 0
            while not stop.is_set():
                n += 1
                data = os.urandom(50_000 + (k * 7919 + n * 104729) % 1_500_000)
                try:
                    status, _, body = srv.request("POST", "/_matrix/media/v3/upload", body=data,
                                                  token=token, timeout=10)
                except OSError:
                    return
                if status == 200:
                    import json
                    media_id = json.loads(body)["content_uri"].rsplit("/", 1)[1]
                    with lock:
                        acknowledged[media_id] = sha256(data)

        def renderer(k):
            for i, media_id in enumerate(images * 2):
                if stop.is_set():
                    return
                w, h, method = SIZES[(i + k) % len(SIZES)]
                try:
                    srv.request("GET", thumbnail_path(srv, media_id, w, h, method), token=token, timeout=10)
                except OSError:
                    return

        threads = [threading.Thread(target=uploader, args=(k,), daemon=True) for k in range(4)]
        threads += [threading.Thread(target=renderer, args=(k,), daemon=True) for k in range(3)]
        for t in threads:
            t.start()
        wait_until(lambda: len(acknowledged) >= 15 and
                   (srv.metric("atrium_media_renders_total", {"result": "ok"}) or 0) >= 5,
                   timeout=60, what="uploads and renders under way")
        srv.kill()
        stop.set()
        for t in threads:
            t.join(30)
        with lock:
            acked = dict(acknowledged)
        # A leftover of the named-temp fallback, as a crash on another file system leaves.
        planted = os.path.join(srv.store, "local", images[0][0:2], images[0][2:4], ".tmp-planted")
        with open(planted, "wb") as f:
            f.write(b"half a file")

        srv.start()
        self.assertEqual([f for f in store_files(srv) if os.path.basename(f).startswith(".tmp-")], [],
                         "temp leftovers removed at start")
        thumbs = [f for f in store_files(srv) if f.startswith("thumbnails/")]
        self.assertGreaterEqual(len(thumbs), 5)
        for rel in thumbs:
            with open(os.path.join(srv.store, rel), "rb") as f:
                data = f.read()
            w, h = webp_size(data)  # raises on a torn file
            self.assertEqual(vips_decode(data)[:2], (w, h), rel)
        status, report = srv.json("POST", "/_atrium/admin/v1/media/verify", {}, token=admin, timeout=60)
        self.assertEqual(status, 200, report)
        self.assertEqual(report["problems"], 0, report["details"])
        self.assertGreaterEqual(report["checked"], len(acked) + len(images))
        for media_id, digest in acked.items():
            status, _, body = srv.request("GET", download_path(srv, media_id), token=token, timeout=30)
            self.assertEqual((status, sha256(body)), (200, digest), media_id)
        # The server works on: a new upload and a new render.
        fresh = upload(srv, token, noise_png(300, 300, seed=99), "image/png")
        status, _, body = srv.request("GET", thumbnail_path(srv, fresh, 96, 96, "crop"), token=token)
        self.assertEqual((status, webp_size(body)), (200, (96, 96)))


if __name__ == "__main__":
    unittest.main()
