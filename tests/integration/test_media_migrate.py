"""`atrium media migrate --to s3|local` (plugins/media/migrate.c,
docs/adr/0027-moving-a-media-library-between-stores.md) against a real S3 server: the
RADOS Gateway of tests/lib/rgw.sh, as in test_media_s3.py.

A library uploaded with storage: local (originals, one above the part size so it goes as a
multipart upload, and rendered thumbnails) is migrated to the bucket with the server
running; an upload lands during the run; the run is killed (SIGKILL) after a few copies and
run again, which goes on without sending again what is there; every object read straight
from the gateway hashes to its row. Then the operator's procedure (plugins/media/README.md,
"Moving a library"): an upload after the run, the switch to storage: s3 and a restart, a
second run that copies just that upload, `atrium verify-media` on the bucket; a restart with
an empty local folder serves every original and thumbnail byte for byte, the thumbnails from
the bucket (none rendered again). And back: `--to local` with the s3 server running, then
storage: local serves everything from the folder.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import threading
import unittest

import harness
from harness import atrium_bin
from media_support import download_path, media_server, register, solid_png, thumbnail_path, upload
from test_media_s3 import Gateway, ceph_available

PART_BYTES = 5 * 1024 * 1024
SIZES = [(32, 32, "crop"), (96, 96, "scale")]
N_IMAGES = 12
MIGRATE_TIMEOUT_S = 300
SUMMARY = re.compile(r"^migrated to (s3|local): (\d+) originals \((\d+) copied, (\d+) already "
                     r"there\), (\d+) thumbnails \((\d+) copied, (\d+) already there\), "
                     r"(\d+) remote copies \((\d+) copied, (\d+) already there, (\d+) absent\), "
                     r"(\d+) bytes copied, (\d+) problem\(s\)$", re.M)

GATEWAY = None


def setUpModule():
    global GATEWAY
    why = ceph_available()
    if why:
        raise unittest.SkipTest(why)
    GATEWAY = Gateway()


def tearDownModule():
    if GATEWAY:
        GATEWAY.close()


def sha(data):
    return hashlib.sha256(data).hexdigest()


def local_thumbnails(store):
    """{<sha256>/<file>: bytes} of the thumbnail files in a local folder."""
    out = {}
    for root, _, files in os.walk(os.path.join(store, "thumbnails")):
        for f in files:
            if not f.startswith("."):
                with open(os.path.join(root, f), "rb") as fh:
                    out[f"{os.path.basename(root)}/{f}"] = fh.read()
    return out


class MigrateTest(harness.AtriumTestCase):
    def migrate(self, srv, to):
        """A whole run: (exit status, stdout, the summary's numbers)."""
        run = subprocess.run([atrium_bin(), "media", "migrate", "--config", srv.config_path,
                              "--to", to], capture_output=True, text=True,
                             timeout=MIGRATE_TIMEOUT_S, cwd=srv.dir)
        m = SUMMARY.search(run.stdout)
        self.assertIsNotNone(m, f"no summary:\n{run.stdout}\n{run.stderr}")
        if run.returncode not in (0, 1):
            print(run.stderr[-3000:], flush=True)
        nums = dict(zip(["originals", "copied", "present", "thumbs", "thumbs_copied",
                         "thumbs_present", "remote", "remote_copied", "remote_present",
                         "remote_absent", "bytes", "problems"], map(int, m.groups()[1:])))
        return run.returncode, run.stdout, nums

    def set_storage(self, srv, storage):
        srv.stop()
        srv._settings["plugins"]["media"]["storage"] = storage
        srv.write_config()

    def assert_serves_everything(self, srv, token, originals, thumbs):
        for media_id, data in originals.items():
            status, _, body = srv.request("GET", download_path(srv, media_id), token=token,
                                          timeout=60)
            self.assertEqual((status, sha(body)), (200, sha(data)), media_id)
        for (media_id, w, h, method), data in thumbs.items():
            status, _, body = srv.request("GET", thumbnail_path(srv, media_id, w, h, method),
                                          token=token)
            self.assertEqual((status, sha(body)), (200, sha(data)), (media_id, w, h, method))

    def test_a_library_moves_to_the_bucket_and_back_while_the_server_runs(self):
        gw = GATEWAY
        srv = media_server(self, media=gw.media_settings(
            storage="local", s3_part_size_bytes=PART_BYTES,
            thumbnail_sizes=", ".join(f"{w}x{h} {m}" for w, h, m in SIZES)))
        _, token = register(srv)
        originals, thumbs = {}, {}
        for i in range(N_IMAGES):
            data = solid_png(200, 150, i)
            media_id = upload(srv, token, data, content_type="image/png")
            originals[media_id] = data
            for w, h, method in SIZES:
                status, _, body = srv.request("GET", thumbnail_path(srv, media_id, w, h, method),
                                              token=token)
                self.assertEqual(status, 200)
                thumbs[(media_id, w, h, method)] = body
        big = os.urandom(2 * PART_BYTES + 12345)  # three parts
        big_id = upload(srv, token, big, timeout=60)
        originals[big_id] = big
        local_thumbs = local_thumbnails(srv.store)
        self.assertEqual(len(local_thumbs), N_IMAGES * len(SIZES))

        # A run killed after a few copies, with an upload landing while it runs.
        proc = subprocess.Popen([atrium_bin(), "media", "migrate", "--config", srv.config_path,
                                 "--to", "s3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, cwd=srv.dir)
        stderr = []
        threading.Thread(target=lambda: stderr.append(proc.stderr.read()), daemon=True).start()
        lines = []
        while sum(line.startswith("copied ") for line in lines) < 3:
            line = proc.stdout.readline()
            self.assertTrue(line, f"the run ended early: {lines} {stderr}")
            lines.append(line)
            if len(lines) == 1:
                during = os.urandom(300_000)
                originals[upload(srv, token, during)] = during
        proc.kill()
        self.assertEqual(proc.wait(timeout=30), -9)
        proc.stdout.close()
        first = set(gw.keys("originals/"))
        self.assertGreaterEqual(len(first), 3)
        self.assertLess(len(first), len(originals), "the run was killed before the end")

        # Run again: it goes on, sending nothing twice.
        rc, out, nums = self.migrate(srv, "s3")
        self.assertEqual(rc, 0, out)
        self.assertEqual(nums["originals"], len(originals))
        self.assertEqual(nums["present"], len(first))
        self.assertEqual(nums["copied"], len(originals) - len(first))
        self.assertEqual(nums["problems"], 0)
        self.assertEqual(nums["thumbs"], len(local_thumbs))
        for key in first:
            self.assertNotIn(f"copied original {key.split('/')[1]} ", out)
        # Every object, read straight from the gateway, is its original; the large one
        # went in parts.
        self.assertEqual(set(gw.keys("originals/")), {f"originals/{i}" for i in originals})
        for media_id, data in originals.items():
            status, body = gw.get_object(f"originals/{media_id}")
            self.assertEqual((status, sha(body)), (200, sha(data)), media_id)
        self.assertTrue(gw.etag(f"originals/{big_id}").strip('"').endswith("-3"))
        for name, data in local_thumbs.items():
            status, body = gw.get_object(f"thumbnails/{name}")
            self.assertEqual((status, sha(body)), (200, sha(data)), name)
        rc, out, nums = self.migrate(srv, "s3")
        self.assertEqual((rc, nums["copied"], nums["thumbs_copied"]), (0, 0, 0), out)

        # The procedure: an upload after the run, the switch, a second run that copies it.
        late = os.urandom(100_000)
        late_id = upload(srv, token, late)
        originals[late_id] = late
        self.set_storage(srv, "s3")
        srv.start()
        rc, out, nums = self.migrate(srv, "s3")
        self.assertEqual((rc, nums["copied"], nums["present"]), (0, 1, len(originals) - 1), out)
        self.assertIn(f"copied original {late_id} ", out)
        verify = subprocess.run([atrium_bin(), "verify-media", "--config", srv.config_path,
                                 "--json"], capture_output=True, text=True, timeout=120,
                                cwd=srv.dir)
        self.assertEqual(verify.returncode, 0, verify.stdout + verify.stderr)
        report = json.loads(verify.stdout)
        self.assertEqual((report["checked"], report["problems"]), (len(originals), 0))

        # With an empty local folder everything comes from the bucket, byte for byte.
        srv.stop()
        shutil.rmtree(srv.store)
        srv.start()
        self.assert_serves_everything(srv, token, originals, thumbs)
        self.assertEqual(srv.metric("atrium_media_store_thumbnails_total", {"source": "render"}), 0)
        self.assertEqual(srv.metric("atrium_media_store_thumbnails_total", {"source": "bucket"}),
                         len(thumbs))

        # And back, with the s3 server running: every original and thumbnail lands.
        rc, out, nums = self.migrate(srv, "local")
        self.assertEqual((rc, nums["problems"]), (0, 0), out)
        self.assertEqual(nums["copied"] + nums["present"], len(originals))
        self.assertEqual(nums["thumbs_copied"] + nums["thumbs_present"], len(local_thumbs))
        for media_id, data in originals.items():
            with open(os.path.join(srv.store, "local", media_id[0:2], media_id[2:4], media_id),
                      "rb") as f:
                self.assertEqual(sha(f.read()), sha(data), media_id)
        self.assertEqual(local_thumbnails(srv.store), local_thumbs)
        self.set_storage(srv, "local")
        srv.start()
        self.assert_serves_everything(srv, token, originals, thumbs)
        self.assertEqual(srv.metric("atrium_media_renders_total"), 0)


if __name__ == "__main__":
    unittest.main()
