"""Files in the media store that no row names (issue 27, item 3): an original whose upload
was killed between naming its file and committing its row, a thumbnail folder of deleted
media, a temporary file left by a crash. At start, and then every orphan_sweep_period_ms,
such files unchanged for orphan_min_age_ms are removed and counted
(atrium_media_orphans_removed_total{kind}); a younger file (an upload that may still be
running), every file a row names, and an upload whose body is still arriving stay."""

import hashlib
import json
import os
import time
import unittest

from common import AtriumTestCase, wait_until
from harness import psql, raw_connect, read_head
from media_support import (download_path, media_server, noise_png, original_file, register,
                           sha256, thumbnail_path, upload)

MIN_AGE_MS = 60_000      # longer than the test: a file planted fresh stays fresh
PERIOD_MS = 1000         # a sweep every second once started
OLD_S = 2 * 3600         # planted "old" files are two hours old
SLOW_CHUNKS = 4          # the slow upload's body arrives in this many pieces ...
SLOW_SWEEPS = 2          # ... across at least this many whole sweeps


def make_old(path):
    old = time.time() - OLD_S
    os.utime(path, (old, old))


def plant(path, data=b"bytes no row names", old=True):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    if old:
        make_old(path)
    return path


def fake_id(tag):
    return ("Orphan" + tag + hashlib.sha256(tag.encode()).hexdigest())[:24]


class OrphanSweepTest(AtriumTestCase):
    def removed(self, srv, kind):
        return srv.metric("atrium_media_orphans_removed_total", {"kind": kind}) or 0

    def create(self, srv, token):
        status, body = srv.json("POST", "/_matrix/media/v1/create", {}, token=token)
        self.assertEqual(status, 200, body)
        return body["content_uri"].rsplit("/", 1)[1]

    def test_old_files_no_row_names_go_and_fresh_ones_rows_and_running_uploads_stay(self):
        srv = media_server(self, media={"orphan_min_age_ms": MIN_AGE_MS,
                                        "orphan_sweep_period_ms": PERIOD_MS})
        _, token = register(srv)
        kept = noise_png(200, 150, seed=7)
        kept_id = upload(srv, token, kept, "image/png")
        status, _, _ = srv.request("GET", thumbnail_path(srv, kept_id, 96, 96, "crop"), token=token)
        self.assertEqual(status, 200)
        thumbs_root = os.path.join(srv.store, "thumbnails")
        kept_thumbs = [os.path.join(r, f) for r, _, fs in os.walk(thumbs_root) for f in fs]
        self.assertTrue(kept_thumbs, "the render left its thumbnail on disk")
        srv.stop()

        # As a kill -9 leaves them: files no row names, some old, one fresh.
        old_original = plant(original_file(srv, fake_id("old")))
        fresh_original = plant(original_file(srv, fake_id("fresh")), old=False)
        dead_sha = hashlib.sha256(b"media deleted while rendering").hexdigest()
        old_thumb = plant(os.path.join(thumbs_root, dead_sha[0:2], dead_sha[2:4], dead_sha,
                                       "96x96-crop.webp"))
        make_old(os.path.dirname(old_thumb))
        # Files rows name stay however old they are.
        for path in [original_file(srv, kept_id)] + kept_thumbs:
            make_old(path)
        make_old(os.path.dirname(kept_thumbs[0]))

        srv.start()
        wait_until(lambda: self.removed(srv, "original") >= 1 and
                   self.removed(srv, "thumbnail") >= 1, timeout=20,
                   what="the start-up sweep removed the old orphans")
        self.assertFalse(os.path.exists(old_original))
        self.assertFalse(os.path.exists(os.path.dirname(old_thumb)), "its empty folder goes too")
        self.assertTrue(os.path.exists(fresh_original), "a fresh file may be a running upload")
        for path in [original_file(srv, kept_id)] + kept_thumbs:
            self.assertTrue(os.path.exists(path), path)

        # Later, under the lease: the periodic sweep finds what appears meanwhile.
        late_original = plant(original_file(srv, fake_id("late")))
        old_temp = plant(os.path.join(os.path.dirname(original_file(srv, kept_id)),
                                      ".tmp-killedupload"))
        fresh_temp = plant(os.path.join(srv.store, "local", ".tmp-maybe-running"), old=False)
        # A PUT killed after naming its file leaves it beside a reservation never uploaded:
        # once the reservation expired long ago the file goes; a live one's file stays.
        expired_id, live_id = self.create(srv, token), self.create(srv, token)
        expired_file = plant(original_file(srv, expired_id))
        live_file = plant(original_file(srv, live_id))
        psql(f"UPDATE media_local SET expires_ts = 1 WHERE media_id = '{expired_id}'", srv.database)
        wait_until(lambda: self.removed(srv, "original") >= 3 and self.removed(srv, "temp") >= 1,
                   timeout=20, what="the periodic sweep removed the late orphans")
        self.assertFalse(os.path.exists(late_original))
        self.assertFalse(os.path.exists(expired_file))
        self.assertTrue(os.path.exists(live_file))
        self.assertFalse(os.path.exists(old_temp))
        self.assertTrue(os.path.exists(fresh_temp))
        self.assertEqual(srv.metric("atrium_lease_held", {"lease": "plugin.media.store.orphans"}), 1,
                         "the periodic sweep runs under its lease")

        # An upload whose body arrives slowly, across several sweeps, is not touched.
        body = os.urandom(256 * 1024)
        piece = len(body) // SLOW_CHUNKS
        def sweeps():
            return srv.metric("atrium_media_orphan_sweeps_total") or 0
        sock = raw_connect(srv.port, timeout=30)
        self.addCleanup(sock.close)
        sock.sendall(b"POST /_matrix/media/v3/upload HTTP/1.1\r\nHost: x\r\n"
                     b"Authorization: Bearer " + token.encode() + b"\r\n"
                     b"Content-Type: application/octet-stream\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
        start_sweeps = sweeps()
        for i in range(SLOW_CHUNKS):
            sock.sendall(body[i * piece:(i + 1) * piece if i < SLOW_CHUNKS - 1 else len(body)])
            if i < SLOW_SWEEPS:  # the next piece only after another whole sweep ran
                wait_until(lambda: sweeps() >= start_sweeps + i + 2, timeout=10,
                           what="a sweep while the body arrives")
        self.assertGreaterEqual(sweeps() - start_sweeps, SLOW_SWEEPS)
        status, head, rest = read_head(sock)
        while len(rest) < int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0]):
            rest += sock.recv(65536)
        self.assertEqual(status, 200, rest)
        slow_id = json.loads(rest)["content_uri"].rsplit("/", 1)[1]
        status, _, got = srv.request("GET", download_path(srv, slow_id), token=token)
        self.assertEqual((status, sha256(got)), (200, sha256(body)))

        # The live reservation still takes its upload, over the file a killed PUT left.
        data = os.urandom(10_000)
        status, _, _ = srv.request("PUT", f"/_matrix/media/v3/upload/{srv.server_name}/{live_id}",
                                   body=data, token=token)
        self.assertEqual(status, 200)
        status, _, got = srv.request("GET", download_path(srv, live_id), token=token)
        self.assertEqual((status, sha256(got)), (200, sha256(data)))

        # Nothing a row names went, and the fresh orphan is still there after every sweep.
        status, _, got = srv.request("GET", download_path(srv, kept_id), token=token)
        self.assertEqual((status, sha256(got)), (200, sha256(kept)))
        self.assertTrue(os.path.exists(fresh_original))
        self.assertEqual(self.removed(srv, "original"), 3)
        self.assertEqual(self.removed(srv, "thumbnail"), 1)
        self.assertEqual(self.removed(srv, "temp"), 1)

    def test_old_remote_copies_no_row_names_go_and_named_ones_stay(self):
        srv = media_server(self, media={"orphan_min_age_ms": MIN_AGE_MS,
                                        "orphan_sweep_period_ms": PERIOD_MS})
        srv.stop()
        # A copy whose row went while this process was away (its store.gone missed), one a
        # row names (an original, and an origin's thumbnail), both old; one fresh.
        folder = os.path.join(srv.store, "remote", "example.org_8448", "ab", "cd")
        gone = plant(os.path.join(folder, "abcdefGone-0011223344556677"))
        named = plant(os.path.join(folder, "abcdefKept-8899aabbccddeeff"))
        thumb = plant(os.path.join(folder, "abcdefThumb-0123456789abcdef"))
        fresh = plant(os.path.join(folder, "abcdefFresh-fedcba9876543210"), old=False)
        rel = lambda path: os.path.relpath(path, srv.store)
        psql("INSERT INTO media_remote (origin, media_id, file_name, size_bytes, sha256,"
             " fetched_ts, last_access_ts) VALUES ('example.org:8448', 'abcdefKept',"
             f" '{rel(named)}', 18, 'x', 1, 1)", srv.database)
        psql("INSERT INTO media_remote_thumbnails (origin, media_id, width, height, method,"
             " animated, file_name, content_type, size_bytes, sha256, fetched_ts) VALUES"
             f" ('example.org:8448', 'abcdefThumb', 96, 96, 'crop', false, '{rel(thumb)}',"
             " 'image/png', 18, 'x', 1)", srv.database)
        srv.start()
        wait_until(lambda: self.removed(srv, "remote") >= 1, timeout=20,
                   what="the old unnamed remote copy removed")
        self.assertFalse(os.path.exists(gone))
        for path in (named, thumb, fresh):
            self.assertTrue(os.path.exists(path), path)
        self.assertEqual(self.removed(srv, "remote"), 1)


if __name__ == "__main__":
    unittest.main()
