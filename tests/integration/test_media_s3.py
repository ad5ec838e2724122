"""The media plugin with plugins.media.storage: s3, against a real S3 server: a throwaway
one-node Ceph cluster with the RADOS Gateway on loopback (tests/lib/rgw.sh), one for the
whole file. docs/adr/0011-media-on-an-object-store.md says what is built so far: an upload is
stored in the bucket before it is acknowledged; an original missing from the local folder
is read through from the bucket on a store pool worker, then served as any other (ETag,
Range, 304); thumbnails render from originals read through the same way; the bucket is
checked at start and a wrong one refuses the start with one clear line; with the gateway
frozen (SIGSTOP) an upload gets 503 within s3_timeout_ms and leaves no row and no file,
while media in the local folder is served as ever.

With local_cache_max_bytes the local folder is a bounded cache: past the bound the least
recently used originals (older than 5 s, and found in the bucket) are evicted by a pass on
the plugin's cache pool down to 90 % of the bound, and read through again when asked for,
by six readers at once too; a download that had its file open when it was evicted
completes intact.

Two processes with different local folders (standing for two machines) share one database
and the bucket: what one uploads, the other downloads and thumbnails; a thumbnail one
renders goes to the bucket and the other reads it through; an admin delete removes the
objects, quarantine keeps them.

An original above s3_part_size_bytes goes as a multipart upload (the store's ETag says how
many parts); a multipart upload a crash left open is aborted by the orphan sweep; a part
size under S3's 5 MiB refuses the start. The media/1 conformance suite passes in s3 mode.

The Ceph packages are installed on first use (tests/lib/rgw.sh packages, apt-get); the
tests are skipped, saying why, only where they cannot be installed.
"""

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.parse

import harness
from common import wait_until
from media_support import (download_path, media_server, original_file, raw_get, register,
                           solid_png, thumbnail_path, upload)

HERE = os.path.dirname(os.path.abspath(__file__))
RGW = os.path.join(HERE, "..", "lib", "rgw.sh")
# A refused start exits this soon: one HEAD of the bucket, bounded by s3_timeout_ms.
REFUSED_START_S = 20
STORE_TIMEOUT_MS = 5000


def ceph_available():
    """None when radosgw can run here, else why not (after trying to install it)."""
    if shutil.which("radosgw"):
        return None
    run = subprocess.run(["bash", RGW, "packages"], capture_output=True, text=True, timeout=900)
    if run.returncode == 0 and shutil.which("radosgw"):
        return None
    tail = (run.stderr or run.stdout).strip().splitlines()[-1:] or ["no output"]
    return f"the Ceph packages (radosgw) cannot be installed here: {tail[0]}"


class Gateway:
    """One rgw.sh cluster in a short temporary folder (its admin sockets live there)."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="rgw-", dir="/tmp")
        started = time.monotonic()
        run = subprocess.run(["bash", RGW, "start", self.dir], capture_output=True, text=True,
                             timeout=180)
        self.start_s = time.monotonic() - started
        if run.returncode != 0:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise AssertionError(f"rgw.sh start failed:\n{run.stderr}")
        self.env = dict(line.split("=", 1) for line in run.stdout.split() if "=" in line)

    def close(self):
        subprocess.run(["bash", RGW, "stop", self.dir], capture_output=True, timeout=60)
        shutil.rmtree(self.dir, ignore_errors=True)

    def media_settings(self, **over):
        conf = {"storage": "s3", "s3_endpoint": self.env["endpoint"],
                "s3_region": self.env["region"], "s3_bucket": self.env["bucket"],
                "s3_access_key_id": self.env["access_key"],
                "s3_secret_access_key": self.env["secret_key"], "s3_path_style": True,
                "s3_timeout_ms": STORE_TIMEOUT_MS}
        conf.update(over)
        return conf

    def curl(self, *args):
        """An independent S3 client: curl's own SigV4 signing."""
        return subprocess.run(
            ["curl", "-sS", "--max-time", "10", "--aws-sigv4", f"aws:amz:{self.env['region']}:s3",
             "--user", f"{self.env['access_key']}:{self.env['secret_key']}",
             "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD", *args],
            capture_output=True, timeout=20)

    def get_object(self, key):
        """(HTTP status, body) of a GET of key, straight from the gateway."""
        url = f"{self.env['endpoint']}/{self.env['bucket']}/{key}"
        run = self.curl("-w", "\n%{http_code}", url)
        body, _, status = run.stdout.rpartition(b"\n")
        return int(status), body

    def url(self, key="", query=""):
        return f"{self.env['endpoint']}/{self.env['bucket']}/{key}" + (f"?{query}" if query else "")

    def etag(self, key):
        """The object's ETag as the gateway gives it (a multipart object's ends in -<parts>),
        or None when there is no such object."""
        run = self.curl("-I", self.url(key))
        for line in run.stdout.decode("latin-1").splitlines():
            if line.lower().startswith("etag:"):
                return line.split(":", 1)[1].strip()
        return None

    def keys(self, prefix):
        """The keys under prefix (ListObjectsV2)."""
        run = self.curl(self.url(query=f"list-type=2&prefix={urllib.parse.quote(prefix, safe='')}"))
        return re.findall(r"<Key>([^<]*)</Key>", run.stdout.decode())

    def start_multipart(self, key):
        """A multipart upload begun and left (as a crash leaves one); its UploadId."""
        run = self.curl("-X", "POST", self.url(key, "uploads="))
        return re.search(r"<UploadId>([^<]*)</UploadId>", run.stdout.decode()).group(1)

    def multipart_uploads(self):
        """[(key, UploadId)] of the multipart uploads open in the bucket."""
        run = self.curl(self.url(query="uploads="))
        return re.findall(r"<Key>([^<]*)</Key><UploadId>([^<]*)</UploadId>", run.stdout.decode())


GATEWAY = None


def setUpModule():
    """One cluster for the whole file (its start is most of the file's time)."""
    global GATEWAY
    why = ceph_available()
    if why:
        raise unittest.SkipTest(why)
    GATEWAY = Gateway()
    print(f"\n[test_media_s3] gateway ready in {GATEWAY.start_s:.1f}s", flush=True)


def tearDownModule():
    if GATEWAY:
        GATEWAY.close()


class S3Case(harness.AtriumTestCase):
    @property
    def gateway(self):
        return GATEWAY

    def s3_server(self, **kwargs):
        media = self.gateway.media_settings(**kwargs.pop("media", {}))
        return media_server(self, media=media, **kwargs)


class RoundTripTest(S3Case):
    """Its tests share one server (media_server(shared=True)): each uploads media of its
    own and counts from the values before it."""

    def count(self, srv, name, labels=None):
        return srv.metric(name, labels) or 0

    def test_an_upload_is_in_the_bucket_and_a_download_reads_through_when_the_local_copy_is_gone(self):
        a = self.s3_server(shared=True)
        _, token = register(a)
        put_ok, get_ok = {"kind": "put", "outcome": "ok"}, {"kind": "get", "outcome": "ok"}
        before = {"put": self.count(a, "atrium_media_store_requests_total", put_ok),
                  "get": self.count(a, "atrium_media_store_requests_total", get_ok),
                  "misses": self.count(a, "atrium_media_store_cache_misses_total"),
                  "hits": self.count(a, "atrium_media_store_cache_hits_total")}
        data = os.urandom(200_000)
        media_id = upload(a, token, data, content_type="application/octet-stream")
        # Acknowledged means in the bucket, under the documented key.
        self.assertEqual(self.gateway.get_object(f"originals/{media_id}"), (200, data))
        self.assertEqual(a.metric("atrium_media_store_requests_total", put_ok) - before["put"], 1)

        # The local folder is a cache: with its copy gone the download reads through.
        os.unlink(original_file(a, media_id))
        status, headers, body = a.request("GET", download_path(a, media_id), token=token)
        self.assertEqual((status, body == data), (200, True))
        etag = headers["ETag"]
        self.assertEqual(a.metric("atrium_media_store_cache_misses_total") - before["misses"], 1)
        # The GET is counted when its transfer ends, which the streamed body's last byte can
        # reach the client before (s3.c counts after libcurl's completion): wait for it.
        wait_until(lambda: a.metric("atrium_media_store_requests_total", get_ok) - before["get"] >= 1,
                   timeout=10, what="the store's GET counted")
        self.assertEqual(a.metric("atrium_media_store_requests_total", get_ok) - before["get"], 1)
        # Cached: the local copy is named just after the last byte went (ADR-0031).
        wait_until(lambda: os.path.exists(original_file(a, media_id)), timeout=10,
                   what="the read-through cached")

        # Served as today: Range and 304 from the cached copy, no second GET.
        status, headers, body = a.request("GET", download_path(a, media_id), token=token,
                                          headers={"Range": "bytes=100-199"})
        self.assertEqual((status, body), (206, data[100:200]))
        self.assertEqual(headers["Content-Range"], f"bytes 100-199/{len(data)}")
        status, _, _ = a.request("GET", download_path(a, media_id), token=token,
                                 headers={"If-None-Match": etag})
        self.assertEqual(status, 304)
        self.assertEqual(a.metric("atrium_media_store_requests_total", get_ok) - before["get"], 1)
        # The 304 is answered from the row's hash before the file is looked at.
        self.assertEqual(a.metric("atrium_media_store_cache_hits_total") - before["hits"], 1)

    def test_a_row_whose_object_is_gone_is_404_and_logged(self):
        a = self.s3_server(shared=True)
        _, token = register(a)
        media_id = upload(a, token, b"soon gone")
        url = f"{self.gateway.env['endpoint']}/{self.gateway.env['bucket']}/originals/{media_id}"
        self.assertEqual(self.gateway.curl("-X", "DELETE", "-o", "/dev/null", url).returncode, 0)
        os.unlink(original_file(a, media_id))
        status, body = a.json("GET", download_path(a, media_id), token=token)
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"))
        a.wait_for_log(f"original {media_id} has a row but no object")


class MultipartTest(S3Case):
    PART = 5 << 20  # S3's smallest part

    def test_an_upload_above_the_part_size_goes_in_parts_round_trips_and_leftovers_are_aborted(self):
        # What a crash leaves: a multipart upload begun and never completed nor aborted.
        leftover = self.gateway.start_multipart("originals/left-by-a-crash")
        # The sweep aborts uploads begun orphan_min_age_ms ago (its smallest, 10 s).
        a = self.s3_server(media={"s3_part_size_bytes": self.PART, "orphan_min_age_ms": 10000,
                                  "orphan_sweep_period_ms": 1000})
        _, token = register(a)
        data = os.urandom(12 << 20)  # three parts: 5 + 5 + 2 MiB
        media_id = upload(a, token, data, timeout=120)

        # In parts, and the store agrees: a multipart object's ETag ends in -<parts>.
        for kind, count in (("create", 1), ("part", 3), ("complete", 1), ("put", 0),
                            ("abort", 0)):
            self.assertEqual(a.metric("atrium_media_store_requests_total",
                                      {"kind": kind, "outcome": "ok"}), count, kind)
        self.assertRegex(self.gateway.etag(f"originals/{media_id}") or "", r'-3"$')
        status, body = self.gateway.get_object(f"originals/{media_id}")
        self.assertEqual((status, sha256(body)), (200, sha256(data)))
        # Streamed in parts as it arrived: never whole in the local folder; read through
        # byte for byte.
        self.assertFalse(os.path.exists(original_file(a, media_id)))
        status, headers, body = a.request("GET", download_path(a, media_id), token=token,
                                          timeout=120)
        self.assertEqual((status, sha256(body)), (200, sha256(data)))
        self.assertEqual(headers["ETag"], f'"{sha256(data)}"')

        # The leftover is aborted by the orphan sweep once old enough; ours left none open.
        wait_until(lambda: self.gateway.multipart_uploads() == [], timeout=40,
                   what="no multipart upload left open in the bucket")
        self.assertNotIn(leftover, [u for _, u in self.gateway.multipart_uploads()])
        self.assertEqual(a.metric("atrium_media_orphans_removed_total", {"kind": "multipart"}), 1)


class FrozenStoreTest(S3Case):
    def test_with_the_gateway_frozen_an_upload_gets_503_and_leaves_nothing_and_cached_media_is_served(self):
        a = self.s3_server(media={"s3_timeout_ms": 1000})
        _, token = register(a)
        cached = upload(a, token, b"uploaded while the store answered")
        with open(os.path.join(self.gateway.dir, "run", "client.rgw.a.pid"), encoding="utf-8") as f:
            rgw_pid = int(f.read())
        os.kill(rgw_pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            status, headers, body = a.request("POST", "/_matrix/media/v3/upload", body=b"lost?",
                                              token=token, timeout=20,
                                              headers={"Content-Type": "text/plain"})
            self.assertEqual(status, 503, body)
            self.assertLess(time.monotonic() - started, 5)
            self.assertEqual(headers["Cache-Control"], "no-store")
            # Nothing half-kept: no row, no local file beside the cached one.
            rows = harness.psql("SELECT count(*) FROM media_local", database=a.database)
            self.assertEqual(rows, [["1"]])
            local = [f for _, _, files in os.walk(os.path.join(a.store, "local")) for f in files]
            self.assertEqual(local, [cached])
            # What the local folder holds is served as ever.
            status, _, body = a.request("GET", download_path(a, cached), token=token)
            self.assertEqual((status, body), (200, b"uploaded while the store answered"))
            self.assertEqual(a.metric("atrium_media_store_requests_total",
                                      {"kind": "put", "outcome": "failed"}), 1)
        finally:
            os.kill(rgw_pid, signal.SIGCONT)


class TwoMachinesTest(S3Case):
    def test_what_one_process_uploads_the_other_downloads_and_thumbnails_from_the_bucket(self):
        secret_file = os.path.join(tempfile.mkdtemp(prefix="atrium-s3-secret-"), "secret")
        self.addCleanup(shutil.rmtree, os.path.dirname(secret_file), True)
        with open(secret_file, "w", encoding="utf-8") as f:
            f.write(self.gateway.env["secret_key"] + "\n")
        a = self.s3_server()
        # b: its own local folder (its own server directory), the secret from a file.
        b = self.s3_server(database=a.database, media={
            "s3_secret_access_key": "", "s3_secret_access_key_file": secret_file})
        self.assertNotEqual(a.store, b.store)
        _, token = register(a)
        image = solid_png(640, 480, 7)
        media_id = upload(a, token, image, content_type="image/png")

        status, headers, body = b.request("GET", download_path(b, media_id), token=token)
        self.assertEqual((status, body == image), (200, True))
        self.assertEqual(headers["Content-Type"], "image/png")
        self.assertEqual(b.metric("atrium_media_store_cache_misses_total"), 1)

        # A thumbnail through b of an original b has not got: read through, then rendered.
        os.unlink(original_file(b, media_id))
        status, headers, body = b.request("GET", thumbnail_path(b, media_id, 96, 96), token=token,
                                          timeout=30)
        self.assertEqual(status, 200, body[:200])
        self.assertEqual(headers["Content-Type"], "image/webp")
        self.assertEqual(body[:4] + body[8:12], b"RIFFWEBP")
        self.assertEqual(b.metric("atrium_media_store_requests_total",
                                  {"kind": "get", "outcome": "ok"}), 2)
        self.assertNotIn(self.gateway.env["secret_key"], b.log_text())

        # The thumbnail went to the bucket under its documented key, and a reads it through
        # instead of rendering it again: the same bytes.
        sha = sha256(image)
        thumb_key = f"thumbnails/{sha}/320x240-scale.webp"
        self.assertEqual(self.gateway.keys(f"thumbnails/{sha}/"), [thumb_key])
        self.assertEqual(b.metric("atrium_media_store_thumbnails_total", {"source": "render"}), 1)
        status, _, from_a = a.request("GET", thumbnail_path(a, media_id, 96, 96), token=token,
                                      timeout=30)
        self.assertEqual((status, from_a), (200, body))
        self.assertEqual(a.metric("atrium_media_store_thumbnails_total", {"source": "bucket"}), 1)
        self.assertEqual(a.metric("atrium_media_renders_total", {"result": "ok"}), 0)

        # Quarantine leaves the objects; an admin's delete removes the original and its
        # thumbnails from the bucket.
        _, admin = register(a, admin=True)
        admin_path = f"/_synapse/admin/v1/media/{a.server_name}/{media_id}"
        status, _, reply = a.request("POST", f"/_synapse/admin/v1/media/quarantine/"
                                     f"{a.server_name}/{media_id}", body={}, token=admin)
        self.assertEqual(status, 200, reply)
        self.assertEqual(self.gateway.keys(f"originals/{media_id}"), [f"originals/{media_id}"])
        self.assertEqual(self.gateway.keys(f"thumbnails/{sha}/"), [thumb_key])
        status, _, reply = a.request("DELETE", admin_path, token=admin, timeout=30)
        self.assertEqual(status, 200, reply)
        self.assertEqual(self.gateway.keys(f"originals/{media_id}"), [])
        self.assertEqual(self.gateway.keys(f"thumbnails/{sha}/"), [])
        self.assertEqual(a.metric("atrium_media_store_requests_total",
                                  {"kind": "delete", "outcome": "ok"}), 2)
        self.assertEqual(b.request("GET", download_path(b, media_id), token=token)[0], 404)


def sha256(data):
    return hashlib.sha256(data).hexdigest()


class LocalCacheBoundTest(S3Case):
    """plugins.media.local_cache_max_bytes (s3_cache.c): the rule is that a settled folder
    holds at most the bound (a pass brings it to 90 % of it); files used in the last 5 s
    are never evicted, so it may stand above the bound until they are older."""

    def local_bytes(self, srv):
        """{media ID: size} of the originals in srv's local folder."""
        out = {}
        for root, _, files in os.walk(os.path.join(srv.store, "local")):
            for name in files:
                if not name.startswith("."):
                    try:
                        out[name] = os.path.getsize(os.path.join(root, name))
                    except FileNotFoundError:
                        pass
        return out

    def settled_under(self, srv, bound):
        """Waits until the folder holds at most bound bytes and the cache bytes gauge says
        what it holds; returns the folder's {media ID: size}."""
        wait_until(lambda: sum(self.local_bytes(srv).values()) <= bound, timeout=60,
                   what="the local folder under local_cache_max_bytes")
        wait_until(lambda: srv.metric("atrium_media_store_cache_bytes")
                   == sum(self.local_bytes(srv).values()), timeout=20,
                   what="the cache bytes gauge equal to the folder")
        return self.local_bytes(srv)

    def test_past_the_bound_the_least_recently_used_go_and_read_through_again_intact(self):
        bound = 1_000_000
        a = self.s3_server(media={"local_cache_max_bytes": bound})
        _, token = register(a)
        started = time.monotonic()
        blobs = {}
        order = []
        for _ in range(6):  # 1.8 MB into a 1 MB bound
            data = os.urandom(300_000)
            media_id = upload(a, token, data)
            blobs[media_id] = data
            order.append(media_id)
        # The first upload is used again (a download) before anything is old enough to go.
        time.sleep(1.5)
        status, _, body = a.request("GET", download_path(a, order[0]), token=token)
        self.assertEqual((status, body == blobs[order[0]]), (200, True))
        touched_in_time = time.monotonic() - started < 4.5

        kept = self.settled_under(a, bound)
        self.assertLessEqual(sum(kept.values()), bound * 9 // 10)
        evicted = [media_id for media_id in order if media_id not in kept]
        if touched_in_time:
            # Nothing was 5 s old before the download: exactly the three least recently
            # used go, the download having kept the first one.
            self.assertEqual(evicted, order[1:4], kept)
            wait_until(lambda: a.metric("atrium_media_store_cache_evictions_total") == 3,
                       what="three evictions counted")
            self.assertEqual(a.metric("atrium_media_store_cache_evicted_bytes_total"),
                             900_000)
        else:
            # A slow machine: the first upload may have aged out and been read through by
            # the download, which puts the folder over the bound once more.
            self.assertGreaterEqual(len(evicted), 3, kept)
            wait_until(lambda: a.metric("atrium_media_store_cache_evictions_total")
                       >= len(evicted), what="the evictions counted")
        # Evicted means from the folder only: the bucket keeps every one.
        for media_id in evicted:
            self.assertEqual(self.gateway.get_object(f"originals/{media_id}"),
                             (200, blobs[media_id]))

        # Each evicted original reads through again, byte for byte, and is cached again.
        misses = a.metric("atrium_media_store_cache_misses_total")
        # Counted before the read-throughs: the folder is over the bound as soon as their
        # copies are named, and the sweep may run before the loop below ends.
        evictions = a.metric("atrium_media_store_cache_evictions_total")
        for media_id in evicted:
            status, headers, body = a.request("GET", download_path(a, media_id), token=token)
            self.assertEqual((status, sha256(body)), (200, sha256(blobs[media_id])))
            self.assertEqual(headers["ETag"], f'"{sha256(blobs[media_id])}"')
            # The local copy is named just after the last byte went (ADR-0031).
            wait_until(lambda: os.path.exists(original_file(a, media_id)), timeout=10,
                       what="the read-through copy named in the local folder")
        self.assertEqual(a.metric("atrium_media_store_cache_misses_total"),
                         misses + len(evicted))
        # Over the bound again with what was read through: it settles again.
        self.settled_under(a, bound)
        wait_until(lambda: a.metric("atrium_media_store_cache_evictions_total") > evictions,
                   what="evictions after the read-throughs")
        self.assertEqual(a.metric("atrium_media_store_cache_local_only"), 0)

    def test_a_full_cache_under_concurrent_readers_serves_every_byte_and_settles_again(self):
        bound = 1_000_000
        a = self.s3_server(media={"local_cache_max_bytes": bound})
        _, token = register(a)
        blobs = {}
        for _ in range(8):  # 2.4 MB into a 1 MB bound
            data = os.urandom(300_000)
            blobs[upload(a, token, data)] = data
        ids = list(blobs)
        kept = self.settled_under(a, bound)
        evicted = [media_id for media_id in ids if media_id not in kept]
        self.assertGreaterEqual(len(evicted), 5, kept)
        misses = a.metric("atrium_media_store_cache_misses_total")
        evictions = a.metric("atrium_media_store_cache_evictions_total")
        # Six readers, each through every original twice in its own order: the evicted ones
        # read through while the others are served from the full folder.
        errors = []

        def reader(k):
            for media_id in (ids[k:] + ids[:k]) * 2:
                status, _, body = a.request("GET", download_path(a, media_id), token=token,
                                            timeout=60)
                if status != 200 or body != blobs[media_id]:
                    errors.append((media_id, status, len(body)))
        readers = [threading.Thread(target=reader, args=(k,)) for k in range(6)]
        for t in readers:
            t.start()
        for t in readers:
            t.join(120)
        self.assertEqual(errors, [])
        # Every evicted original was read through; most downloads came from the folder (an
        # original read through may age out and go again while the readers run on a slow
        # machine: 19 read-throughs of 96 downloads seen at load 8).
        read_through = a.metric("atrium_media_store_cache_misses_total") - misses
        self.assertGreaterEqual(read_through, len(evicted))
        self.assertLess(read_through, 6 * 2 * len(ids) // 2)
        self.settled_under(a, bound)
        wait_until(lambda: a.metric("atrium_media_store_cache_evictions_total") > evictions,
                   what="evictions after the read-throughs")

    def test_a_download_started_before_its_file_is_evicted_completes_intact(self):
        # The reader stalls while the file ages (5 s): more than the default send stall.
        # One part (s3_part_size_bytes above its size): the upload lands in the local folder.
        a = self.s3_server(media={"local_cache_max_bytes": 4_000_000, "s3_timeout_ms": 60000,
                                  "s3_part_size_bytes": 32 << 20},
                           settings={"server": {"http": {"send_stall_timeout_s": 60}}})
        _, token = register(a)
        data = os.urandom(24 << 20)  # far more than the socket buffers hold
        media_id = upload(a, token, data, timeout=120)
        sock = raw_get(a, download_path(a, media_id), token=token, rcvbuf=16384)
        self.addCleanup(sock.close)
        sock.settimeout(60)
        status, head, first = harness.read_head(sock)
        self.assertEqual(status, 200, head)
        # Alone over the bound, it goes once it was not used for 5 s (while being read).
        wait_until(lambda: not os.path.exists(original_file(a, media_id)), timeout=60,
                   what="the file evicted under its reader")
        wait_until(lambda: a.metric("atrium_media_store_cache_evictions_total") == 1,
                   what="the eviction counted")
        chunks = [first]
        received = len(first)
        while received < len(data):
            piece = sock.recv(1 << 20)
            if not piece:
                break
            chunks.append(piece)
            received += len(piece)
        self.assertEqual(sha256(b"".join(chunks)), sha256(data))

        # The next download reads it through again (no descriptor of the evicted file).
        misses = a.metric("atrium_media_store_cache_misses_total")
        status, _, body = a.request("GET", download_path(a, media_id), token=token, timeout=120)
        self.assertEqual((status, sha256(body)), (200, sha256(data)))
        self.assertEqual(a.metric("atrium_media_store_cache_misses_total"), misses + 1)


class RefusedStartTest(S3Case):
    def refused(self, **media):
        srv = harness.Server(settings=lambda tmp: {"plugins": {"media": {
            "enabled": True, "store_path": os.path.join(tmp, "media_store"),
            **self.gateway.media_settings(**media)}}}, start=False)
        self.addCleanup(srv.close, False)
        started = time.monotonic()
        srv.launch()
        code = srv.proc.wait(timeout=REFUSED_START_S + 10)
        srv.returncode = code
        self.assertLess(time.monotonic() - started, REFUSED_START_S)
        self.assertNotEqual(code, 0)
        lines = [line for line in srv.log_text().splitlines() if "object store: bucket" in line]
        self.assertEqual(len(lines), 1, srv.log_tail())
        self.assertNotIn(self.gateway.env["secret_key"], srv.log_text())
        return lines[0]

    def test_bad_credentials_refuse_the_start_with_one_clear_line(self):
        line = self.refused(s3_secret_access_key="not-the-secret")
        self.assertIn("the credentials were refused", line)
        self.assertNotIn("not-the-secret", line)

    def test_a_part_size_under_s3s_5_mib_refuses_the_start_with_one_line(self):
        srv = harness.Server(settings=lambda tmp: {"plugins": {"media": {
            "enabled": True, "store_path": os.path.join(tmp, "media_store"),
            **self.gateway.media_settings(s3_part_size_bytes=1 << 20)}}}, start=False)
        self.addCleanup(srv.close, False)
        srv.launch()
        srv.returncode = srv.proc.wait(timeout=REFUSED_START_S + 10)
        self.assertNotEqual(srv.returncode, 0)
        lines = [line for line in srv.log_text().splitlines() if "s3_part_size_bytes" in line]
        self.assertEqual(len(lines), 1, srv.log_tail())
        self.assertIn("at least 5242880 (5 MiB)", lines[0])

    def test_a_missing_bucket_refuses_the_start(self):
        self.assertIn("no such bucket", self.refused(s3_bucket="no-such-bucket"))

    def test_an_unreachable_store_refuses_the_start(self):
        port = harness.free_port()
        self.assertIn("unreachable", self.refused(s3_endpoint=f"http://127.0.0.1:{port}"))


class ConformanceTest(S3Case):
    """The media/1 conformance suite (tests/conformance/media/conform.py, run for the local
    folder by ctest as conformance.media_stock) with the stock plugin in s3 mode, against
    this file's gateway."""

    def test_the_media_conformance_suite_passes_with_the_stock_plugin_in_s3_mode(self):
        conform = os.path.join(HERE, "..", "conformance", "media", "conform.py")
        before = set(self.gateway.keys("originals/"))
        args = [sys.executable, conform, os.path.join(harness.plugin_dir(), "media.so"),
                "--thumbnails", "yes", "--set", "remote_fetch_enabled=false"]
        for key, value in self.gateway.media_settings().items():
            args += ["--set", f"{key}={str(value).lower() if isinstance(value, bool) else value}"]
        run = subprocess.run(args, capture_output=True, text=True, timeout=600,
                             env=dict(os.environ, ATRIUM_BIN=harness.atrium_bin()))
        self.assertEqual(run.returncode, 0, run.stderr[-6000:])
        self.assertRegex(run.stderr, r"Ran [1-9]\d* tests")
        # Its uploads went to the bucket: s3 mode, not the local folder.
        self.assertTrue(set(self.gateway.keys("originals/")) - before,
                        "no new object under originals/ in the bucket")


if __name__ == "__main__":
    unittest.main()
