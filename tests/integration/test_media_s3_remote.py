"""Remote media on the object store (docs/adr/0032-remote-media-in-the-bucket.md): two
Atrium processes (A and B) share a server name, PostgreSQL and a bucket (a throwaway radosgw,
tests/lib/rgw.sh) but each has its own local folder, standing for two machines; a third
Atrium is the origin other servers' media comes from.

- A copy A fetches is in the bucket, under its row's file name, before its row says it is
  cached; with the origin stopped, B serves it byte for byte from the bucket (and the
  origin's thumbnail likewise).
- Quarantine through A stops B serving a copy (the objects stay); the purge of the remote
  cache through A removes the objects and B's local copies, and B no longer serves them; an
  admin delete of local media through A removes the objects and B's local copies.
- `atrium media migrate` moves cached remote copies too, checked against their rows.
- The orphan sweep deletes the bucket's objects that no row names once older than
  orphan_min_age_ms, and leaves a young one.
"""

import hashlib
import os
import re
import subprocess
import shutil
import tempfile
import time
import unittest

import harness
import test_media_remote as remote
import test_media_s3 as s3t
from common import wait_until
from federation_support import FederatedServer
from media_support import download_path, original_file, register, solid_png, upload

A_IP, B_IP, ORIGIN_IP = "127.0.0.91", "127.0.0.92", "127.0.0.93"
MIGRATE_TIMEOUT_S = 120

GATEWAY = None


def setUpModule():
    global GATEWAY
    why = s3t.ceph_available()
    if why:
        raise unittest.SkipTest(why)
    GATEWAY = s3t.Gateway()
    print(f"\n[test_media_s3_remote] gateway ready in {GATEWAY.start_s:.1f}s", flush=True)


def tearDownModule():
    if GATEWAY:
        GATEWAY.close()


def sha(data):
    return hashlib.sha256(data).hexdigest()


class RemoteBucketCase(remote.RemoteMediaCase):
    def start_pair(self, media=None, count=2):
        """A and B: one server name, database, signing key and bucket; two local folders
        (count=1: A alone)."""
        db = harness.create_database()
        self.addCleanup(harness.drop_database, db)
        shared = tempfile.mkdtemp(prefix="atrium-s3-remote-")
        self.addCleanup(shutil.rmtree, shared, True)
        servers = []
        for ip in (A_IP, B_IP)[:count]:
            name = servers[0].server_name if servers else None
            srv = FederatedServer(self.ca, ip, name=name, database=db, start=False)
            conf = {"enabled": True, "store_path": os.path.join(srv.dir, "media_store"),
                    **GATEWAY.media_settings(**(media or {}))}
            srv._settings = harness.deep_merge(srv._settings, {
                "registration": {"enabled": True}, "plugins": {"media": conf},
                "federation": {"signing_key_path": os.path.join(shared, "signing.key")}})
            srv.store = conf["store_path"]
            srv.write_config()

            def close(srv=srv):
                outcome = getattr(self, "_outcome", None)
                if outcome is not None and not getattr(outcome, "success", True):
                    srv._failed = True
                srv.close()
            self.addCleanup(close)
            srv.start()
            servers.append(srv)
        self.assertNotEqual(servers[0].store, servers[-1].store if count > 1 else None)
        return servers

    def row(self, srv, table, media_id):
        rows = harness.psql(f"SELECT file_name, sha256 FROM {table} WHERE media_id = '{media_id}'",
                            database=srv.database)
        self.assertEqual(len(rows), 1, rows)
        return rows[0]

    def remote_total(self, srv, event):
        return srv.metric("atrium_media_store_remote_total", {"event": event}) or 0


class TwoMachinesRemoteTest(RemoteBucketCase):
    def test_a_copy_fetched_through_a_is_served_by_b_from_the_bucket_with_the_origin_stopped(self):
        origin = self.start_fed(ORIGIN_IP)
        _, otoken = register(origin)
        data = os.urandom(300_000)
        image = solid_png(640, 480, 11)
        data_id = upload(origin, otoken, data)
        image_id = upload(origin, otoken, image, content_type="image/png")
        a, b = self.start_pair()
        _, token = register(a)

        status, _, body = a.request("GET", self.remote_path(origin.server_name, data_id),
                                    token=token, timeout=30)
        self.assertEqual((status, sha(body)), (200, sha(data)))
        # In the bucket under the row's file name (the key layout), stored before the row.
        file_name, row_sha = self.row(a, "media_remote", data_id)
        self.assertRegex(file_name, r"^remote/127\.0\.0\.93_\d+/../../" + data_id + r"-[0-9a-f]{16}$")
        self.assertEqual(row_sha, sha(data))
        self.assertEqual(GATEWAY.get_object(file_name), (200, data))
        self.assertEqual(self.remote_total(a, "stored"), 1)

        # The origin's thumbnail (A has not got the original): in the bucket too.
        status, headers, thumb = a.request(
            "GET", self.remote_path(origin.server_name, image_id, thumb=(96, 96)), token=token,
            timeout=30)
        self.assertEqual(status, 200, thumb[:200])
        thumb_name, _ = self.row(a, "media_remote_thumbnails", image_id)
        self.assertEqual(GATEWAY.get_object(thumb_name), (200, thumb))

        origin.stop()
        # B has neither copy and cannot reach the origin: both come from the bucket.
        status, headers, body = b.request("GET", self.remote_path(origin.server_name, data_id),
                                          token=token, timeout=30)
        self.assertEqual((status, sha(body)), (200, sha(data)))
        self.assertEqual(headers["ETag"], f'"{sha(data)}"')
        self.assertTrue(os.path.exists(os.path.join(b.store, file_name)))
        status, _, body = b.request(
            "GET", self.remote_path(origin.server_name, image_id, thumb=(96, 96)), token=token,
            timeout=30)
        self.assertEqual((status, body), (200, thumb))
        self.assertEqual(self.remote_total(b, "read_through"), 2)
        self.assertEqual(b.metric("atrium_media_remote_fetches_total", {"outcome": "ok"}) or 0, 0)
        # Range is served from the copy now in B's folder.
        status, _, body = b.request("GET", self.remote_path(origin.server_name, data_id),
                                    token=token, headers={"Range": "bytes=10-19"})
        self.assertEqual((status, body), (206, data[10:20]))


class DeletesReachBothTest(RemoteBucketCase):
    def test_quarantine_purge_and_delete_through_a_stop_b_serving_and_empty_the_bucket(self):
        origin = self.start_fed(ORIGIN_IP)
        _, otoken = register(origin)
        data = os.urandom(100_000)
        remote_id = upload(origin, otoken, data)
        a, b = self.start_pair()
        _, token = register(a)
        _, admin = register(a, admin=True)
        path = self.remote_path(origin.server_name, remote_id)
        for srv in (a, b):
            status, _, body = srv.request("GET", path, token=token, timeout=30)
            self.assertEqual((status, sha(body)), (200, sha(data)))
        file_name, _ = self.row(a, "media_remote", remote_id)
        self.assertTrue(os.path.exists(os.path.join(b.store, file_name)))
        local = os.urandom(50_000)
        local_id = upload(a, token, local)
        status, _, body = b.request("GET", download_path(b, local_id), token=token)
        self.assertEqual((status, body == local), (200, True))
        self.assertTrue(os.path.exists(original_file(b, local_id)))

        # Quarantine through A: B stops serving its local copy; the object stays.
        qpath = f"/_synapse/admin/v1/media/quarantine/{origin.server_name}/{remote_id}"
        self.assertEqual(a.request("POST", qpath, body={}, token=admin)[0], 200)
        status, body = b.json("GET", path, token=token)
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"))
        self.assertEqual(GATEWAY.get_object(file_name)[0], 200)
        self.assertEqual(a.request("POST", qpath.replace("/quarantine/", "/unquarantine/"),
                                   body={}, token=admin)[0], 200)
        self.assertEqual(b.request("GET", path, token=token)[0], 200)

        # The purge through A: the object and B's local copy go; B no longer serves it.
        origin.stop()
        before = int(time.time() * 1000) + 1000
        status, reply = a.json("POST", f"/_synapse/admin/v1/purge_media_cache?before_ts={before}",
                               {}, token=admin, timeout=30)
        self.assertEqual((status, reply), (200, {"deleted": 1}))
        self.assertEqual(GATEWAY.get_object(file_name)[0], 404)
        wait_until(lambda: not os.path.exists(os.path.join(b.store, file_name)), timeout=5,
                   what="B's local copy removed")
        self.assertNotEqual(b.request("GET", path, token=token, timeout=30)[0], 200)
        self.assertEqual(self.remote_total(a, "deleted"), 1)

        # An admin delete of local media through A: bucket and B's folder emptied of it.
        status, _, reply = a.request("DELETE", f"/_synapse/admin/v1/media/{a.server_name}/{local_id}",
                                     token=admin, timeout=30)
        self.assertEqual(status, 200, reply)
        self.assertEqual(GATEWAY.get_object(f"originals/{local_id}")[0], 404)
        wait_until(lambda: not os.path.exists(original_file(b, local_id)), timeout=5,
                   what="B's local original removed")
        self.assertEqual(b.request("GET", download_path(b, local_id), token=token)[0], 404)


class MigrateRemoteTest(RemoteBucketCase):
    SUMMARY = re.compile(r"(\d+) remote copies \((\d+) copied, (\d+) already there, (\d+) absent\)")

    def migrate(self, srv, to):
        run = subprocess.run([harness.atrium_bin(), "media", "migrate", "--config",
                              srv.config_path, "--to", to], capture_output=True, text=True,
                             timeout=MIGRATE_TIMEOUT_S, cwd=srv.dir)
        m = self.SUMMARY.search(run.stdout)
        self.assertIsNotNone(m, f"no summary:\n{run.stdout}\n{run.stderr}")
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        return tuple(map(int, m.groups()))

    def test_migrate_moves_cached_remote_copies_both_ways_checked_against_their_rows(self):
        origin = self.start_fed(ORIGIN_IP)
        _, otoken = register(origin)
        data = os.urandom(80_000)
        remote_id = upload(origin, otoken, data)
        a, b = self.start_pair()
        _, token = register(a)
        self.assertEqual(a.request("GET", self.remote_path(origin.server_name, remote_id),
                                   token=token, timeout=30)[0], 200)
        file_name, _ = self.row(a, "media_remote", remote_id)
        # A copy cached before remote copies were in the bucket: only in A's folder.
        url = GATEWAY.url(file_name)
        self.assertEqual(GATEWAY.curl("-X", "DELETE", "-o", "/dev/null", url).returncode, 0)
        self.assertEqual(GATEWAY.get_object(file_name)[0], 404)
        self.assertEqual(self.migrate(a, "s3"), (1, 1, 0, 0))
        self.assertEqual(GATEWAY.get_object(file_name), (200, data))
        self.assertEqual(self.migrate(a, "s3"), (1, 0, 1, 0))  # resumable: already there
        # Back: B's folder gets it from the bucket, hashed against the row.
        self.assertFalse(os.path.exists(os.path.join(b.store, file_name)))
        self.assertEqual(self.migrate(b, "local"), (1, 1, 0, 0))
        with open(os.path.join(b.store, file_name), "rb") as f:
            self.assertEqual(f.read(), data)


class BucketOrphansTest(RemoteBucketCase):
    def put(self, key, body=b"left behind"):
        with tempfile.NamedTemporaryFile() as f:
            f.write(body)
            f.flush()
            run = GATEWAY.curl("-X", "PUT", "--data-binary", f"@{f.name}", "-o", "/dev/null",
                               "-w", "%{http_code}", GATEWAY.url(key))
        self.assertEqual(run.stdout, b"200", run.stderr)

    def test_objects_no_row_names_are_deleted_once_old_enough_and_young_ones_stay(self):
        orphans = ["originals/orphanedByACrash",
                   f"thumbnails/{'ab' * 32}/96x96-crop.webp",
                   "remote/example.org_8448/ab/cd/abcdef-0011223344556677"]
        put_at = time.monotonic()
        for key in orphans:
            self.put(key)
        a, = self.start_pair(media={"orphan_min_age_ms": 10000, "orphan_sweep_period_ms": 1000},
                             count=1)
        _, token = register(a)
        kept = upload(a, token, b"a row names me")
        wait_until(lambda: all(GATEWAY.get_object(k)[0] == 404 for k in orphans), timeout=40,
                   what="the orphaned objects deleted")
        self.assertGreaterEqual(time.monotonic() - put_at, 10, "deleted before orphan_min_age_ms")
        self.assertGreaterEqual(a.metric("atrium_media_orphans_removed_total",
                                         {"kind": "object"}), len(orphans))
        self.assertEqual(GATEWAY.get_object(f"originals/{kept}"), (200, b"a row names me"))
        # A young object no row names (as an upload's, just before its row) stays.
        self.put("originals/youngAndUnnamed")
        sweeps = a.metric("atrium_media_orphan_sweeps_total")
        wait_until(lambda: a.metric("atrium_media_orphan_sweeps_total") >= sweeps + 2, timeout=20,
                   what="two more sweeps")
        self.assertEqual(GATEWAY.get_object("originals/youngAndUnnamed")[0], 200)


if __name__ == "__main__":
    unittest.main()
