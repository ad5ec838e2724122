"""The media plugin across several Atrium processes that share one PostgreSQL and one media
store, as behind a load balancer (docs/architecture.md, "More than one process"): an
asynchronous upload through one process answers a download waiting on another; a new
thumbnail asked of three processes at once is rendered once; an uncached remote file
asked of two processes at once is fetched once, the other reading the copy from the
shared store; a quarantine made through one process applies on the others at once.

The processes share a server name, a database, a signing key and a media store; each has
its own federation listener on 127.0.0.51-53 (its client listener on 127.0.0.1, as the
harness talks to it). Where a peer must count the requests reaching it, the fake origin
of test_media_remote.py plays it, on 127.0.0.54.
"""

import hashlib
import json
import os
import shutil
import tempfile
import threading
import time

import harness
import test_media_remote as remote
from common import Background, wait_until
from federation_support import FederatedServer
from media_support import download_path, register, solid_png, thumbnail_path, upload, webp_size

PROCESS_IPS = ("127.0.0.51", "127.0.0.52", "127.0.0.53")
ORIGIN_IP = "127.0.0.54"
# A download parked on one process is answered this soon after the upload lands on
# another (the re-check without notifications comes every two seconds).
UPLOAD_WAKE_S = 0.5
# Without notifications (b's listener cut) a parked download re-reads its row every 2 s.
UPLOAD_RECHECK_S = 2.0
QUARANTINE_REACH_S = 1.0
EVICT_LEASE = "plugin.media.remote_cache.evict"


def sha(data):
    return hashlib.sha256(data).hexdigest()


class MultiProcessCase(remote.RemoteMediaCase):
    def start_cluster(self, count, media=None, shared=False):
        """`count` processes on one new database and one media store, started one after
        the other (the first writes the signing key the others read). shared=True: the one
        cluster of the test's class, stopped and checked once its last test ran (the rules
        of AtriumTestCase.start_class_server: own users, media and origins, no absolute
        counter, no server stopped; same arguments in every call of a class)."""
        if not shared:
            return self._new_cluster(count, media, self.addCleanup, self._close_marked)
        cls = type(self)
        if "_class_cluster" not in cls.__dict__:
            servers = self._new_cluster(count, media, cls.addClassCleanup, lambda srv: srv.close)
            cls._class_cluster = (servers, (count, media))
        servers, args = cls._class_cluster
        self.assertEqual(args, (count, media), "a shared cluster's arguments differ")

        def mark():
            outcome = getattr(self, "_outcome", None)
            if outcome is not None and not getattr(outcome, "success", True):
                for srv in servers:
                    srv._failed = True
        self.addCleanup(mark)
        return list(servers)

    def _close_marked(self, srv):
        def close():
            outcome = getattr(self, "_outcome", None)
            if outcome is not None and not getattr(outcome, "success", True):
                srv._failed = True
            srv.close()
        return close

    def _new_cluster(self, count, media, add_cleanup, closer):
        db = harness.create_database()
        add_cleanup(harness.drop_database, db)
        tmp_root = os.environ.get("ATRIUM_TEST_TMPDIR") or None
        if tmp_root:
            os.makedirs(tmp_root, exist_ok=True)
        shared = tempfile.mkdtemp(prefix="atrium-media-multi-", dir=tmp_root)
        add_cleanup(shutil.rmtree, shared, True)
        store = os.path.join(shared, "media_store")
        conf = {"enabled": True, "store_path": store}
        conf.update(media or {})
        extra = {"registration": {"enabled": True}, "plugins": {"media": conf},
                 "federation": {"signing_key_path": os.path.join(shared, "signing.key")}}
        servers = []
        for ip in PROCESS_IPS[:count]:
            name = servers[0].server_name if servers else None
            srv = FederatedServer(self.ca, ip, name=name, database=db, start=False)
            srv._settings = harness.deep_merge(srv._settings, extra)
            srv.store = store
            srv.write_config()
            add_cleanup(closer(srv))
            srv.start()
            servers.append(srv)
        return servers

    def total(self, servers, name, labels=None):
        return sum(srv.metric(name, labels) or 0 for srv in servers)


class AsyncUploadAcrossProcessesTest(MultiProcessCase):
    def test_downloads_parked_on_b_are_answered_when_the_upload_lands_through_a(self):
        a, b = self.start_cluster(2)
        _, token = register(a)
        ids = []
        for _ in range(3):
            status, created = a.json("POST", "/_matrix/media/v1/create", {}, token=token)
            self.assertEqual(status, 200, created)
            ids.append(created["content_uri"].rsplit("/", 1)[1])
        waiting = [Background(b.request, "GET", download_path(b, media_id) + "?timeout_ms=20000",
                              token=token, timeout=30) for media_id in ids]
        wait_until(lambda: b.metric("atrium_media_upload_waiters") == 3, what="three downloads parked on b")
        # Uploads land a while apart, so a periodic re-check cannot answer all three in time.
        for i, media_id in enumerate(ids):
            time.sleep(0.7)
            data = f"bytes of upload {i}".encode() * 100
            status, _, body = a.request("PUT", f"/_matrix/media/v3/upload/{a.server_name}/{media_id}",
                                        body=data, token=token,
                                        headers={"Content-Type": "application/octet-stream"})
            self.assertEqual((status, json.loads(body)), (200, {}))
            landed = time.monotonic()
            status, _, got = waiting[i].result()
            self.assertEqual((status, got), (200, data))
            self.assertLess(waiting[i].finished_at - landed, UPLOAD_WAKE_S,
                            f"download {i} on b woken by the upload through a, not by a re-check")
        self.assertEqual(b.metric("atrium_media_not_yet_uploaded_total"), 0)

    def test_with_bs_listener_cut_a_download_is_answered_by_its_re_check_and_a_quarantine_applies(self):
        a, b = self.start_cluster(2)
        _, token = register(a, admin=True)
        status, created = a.json("POST", "/_matrix/media/v1/create", {}, token=token)
        media_id = created["content_uri"].rsplit("/", 1)[1]
        # Keep b deaf: its listening connection cut, new connections refused (the pools'
        # open connections go on working).
        harness.psql(f'ALTER DATABASE "{a.database}" WITH ALLOW_CONNECTIONS false')
        try:
            rows = harness.psql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                                f" WHERE application_name = 'atrium-notify-{b.pid}'")
            self.assertEqual(rows, [["t"]])
            wait_until(lambda: b.metric("atrium_notify_listener_up") == 0, what="b knows it is deaf")
            waiting = Background(b.request, "GET", download_path(b, media_id) + "?timeout_ms=20000",
                                 token=token, timeout=30)
            wait_until(lambda: b.metric("atrium_media_upload_waiters") == 1, what="download parked on b")
            data = b"landed while b was deaf" * 50
            status, _, _ = a.request("PUT", f"/_matrix/media/v3/upload/{a.server_name}/{media_id}",
                                     body=data, token=token,
                                     headers={"Content-Type": "application/octet-stream"})
            self.assertEqual(status, 200)
            landed = time.monotonic()
            status, _, got = waiting.result()
            self.assertEqual((status, got), (200, data))
            self.assertLess(waiting.finished_at - landed, UPLOAD_RECHECK_S + 0.5,
                            "re-checked at the short interval while notifications are missed")
            # Quarantined through a while b hears nothing: b serves nothing stale.
            status, _, body = a.request("POST", f"/_synapse/admin/v1/media/quarantine/{a.server_name}/{media_id}",
                                        body={}, token=token)
            self.assertEqual(status, 200, body)
            self.assertEqual(b.request("GET", download_path(b, media_id), token=token)[0], 404)
            self.assertEqual(b.metric("atrium_notify_listener_up"), 0, "answered while still deaf")
        finally:
            harness.psql(f'ALTER DATABASE "{a.database}" WITH ALLOW_CONNECTIONS true')


class ThumbnailAcrossProcessesTest(MultiProcessCase):
    def test_fifty_requests_for_a_new_thumbnail_over_three_processes_render_it_once(self):
        servers = self.start_cluster(3)
        _, token = register(servers[0])
        # Large enough that its render takes a while: the requests overlap it.
        image = solid_png(4000, 3000, 7)
        media_id = upload(servers[0], token, image, "image/png")
        path = thumbnail_path(servers[0], media_id, 320, 240)
        results = [None] * 50
        start = threading.Barrier(50)

        def ask(i):
            start.wait()
            results[i] = servers[i % 3].request("GET", path, token=token, timeout=60)
        threads = [threading.Thread(target=ask, args=(i,), daemon=True) for i in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        statuses = [r[0] if r else None for r in results]
        self.assertEqual(statuses, [200] * 50, [r[2][:200] for r in results if r and r[0] != 200][:3])
        self.assertEqual(len({sha(r[2]) for r in results}), 1, "every process serves the same file")
        self.assertEqual(webp_size(results[0][2]), (320, 240))
        self.assertEqual(self.total(servers, "atrium_media_renders_total", {"result": "ok"}), 1,
                         [srv.metric("atrium_media_renders_total", {"result": "ok"}) for srv in servers])
        self.assertEqual(self.total(servers, "atrium_media_renders_total", {"result": "failed"}), 0)


class RemoteFetchAcrossProcessesTest(MultiProcessCase):
    """Its tests share one cluster (start_cluster(shared=True)), each with an origin of
    its own."""

    def test_one_uncached_remote_file_asked_of_two_processes_at_once_is_fetched_once(self):
        o = self.origin(ORIGIN_IP)
        data = os.urandom(300000)
        o.files["shared1"] = ("ok", data, "application/octet-stream")
        o.delay_s = 0.5  # the first fetch is still running when the other process asks
        a, b = self.start_cluster(2, shared=True)
        _, token = register(a)
        ok = {"outcome": "ok"}
        fetched0 = [self.count(srv, "atrium_media_remote_fetches_total", ok) for srv in (a, b)]
        path = self.remote_path(o.server_name, "shared1")
        results = [None] * 10
        start = threading.Barrier(10)

        def ask(i):
            start.wait()
            results[i] = (a, b)[i % 2].request("GET", path, token=token, timeout=30)
        threads = [threading.Thread(target=ask, args=(i,), daemon=True) for i in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual([r[0] if r else None for r in results], [200] * 10,
                         [r[2][:200] for r in results if r and r[0] != 200][:3])
        self.assertEqual({sha(r[2]) for r in results}, {sha(data)})
        self.assertEqual(o.media_hits("shared1"), 1, o.hits)
        fetched = [self.count(srv, "atrium_media_remote_fetches_total", ok) - before
                   for srv, before in zip((a, b), fetched0)]
        self.assertEqual(sorted(fetched), [0, 1], "one process fetched, the other read its copy")
        # Later requests, on either process, come from the shared cache.
        for srv in (a, b):
            status, _, body = srv.request("GET", path, token=token)
            self.assertEqual((status, sha(body)), (200, sha(data)))
        self.assertEqual(o.media_hits("shared1"), 1)

    def test_a_missing_remote_file_is_asked_of_the_origin_once_for_both_processes(self):
        o = self.origin(ORIGIN_IP)
        o.delay_s = 0.5
        a, b = self.start_cluster(2, shared=True)
        _, token = register(a)
        path = self.remote_path(o.server_name, "absent1")
        first = Background(a.request, "GET", path, token=token, timeout=30)
        time.sleep(0.2)  # a's fetch is under way
        self.assert_failure(b.request("GET", path, token=token, timeout=30), 404, "M_NOT_FOUND")
        self.assert_failure(first.result(), 404, "M_NOT_FOUND")
        self.assertEqual(o.media_hits("absent1"), 1, "b learnt the 404 from a's claim")


class DeadClaimantTest(MultiProcessCase):
    """A process that claimed a render or a fetch and died leaves its claim row behind:
    the others wait for it no longer than its expiry, then do the work themselves. Its
    tests share one cluster (start_cluster(shared=True)), claiming keys of their own."""

    def dead_claim(self, srv, key, lapse_ms):
        harness.psql("INSERT INTO media_claims (claim_key, owner, expires_ts) VALUES"
                     f" ('{key}', 'dead.1.000000',"
                     f" (extract(epoch FROM clock_timestamp()) * 1000)::bigint + {lapse_ms})",
                     srv.database)

    def test_a_render_claimed_by_a_dead_process_is_taken_over_when_its_claim_lapses(self):
        a, b = self.start_cluster(2, shared=True)
        _, token = register(a)
        renders0 = self.total((a, b), "atrium_media_renders_total", {"result": "ok"})
        image = solid_png(800, 600, 3)
        media_id = upload(a, token, image, "image/png")
        self.dead_claim(a, f"render:{sha(image)}/320x240-scale", 2000)
        started = time.monotonic()
        status, _, body = b.request("GET", thumbnail_path(b, media_id, 320, 240), token=token, timeout=30)
        waited = time.monotonic() - started
        self.assertEqual(status, 200, body[:300])
        self.assertEqual(webp_size(body), (320, 240))
        self.assertGreater(waited, 1.5, "it waited for the other claimant first")
        self.assertLess(waited, 6.0)
        self.assertEqual(self.total((a, b), "atrium_media_renders_total", {"result": "ok"}) - renders0, 1)

    def test_a_fetch_claimed_by_a_dead_process_is_taken_over_when_its_claim_lapses(self):
        o = self.origin(ORIGIN_IP)
        data = os.urandom(50000)
        o.files["orphan1"] = ("ok", data, "application/octet-stream")
        a, b = self.start_cluster(2, shared=True)
        _, token = register(a)
        self.dead_claim(a, f"fetch:{o.server_name}/orphan1", 2000)
        started = time.monotonic()
        status, _, body = b.request("GET", self.remote_path(o.server_name, "orphan1"), token=token, timeout=30)
        waited = time.monotonic() - started
        self.assertEqual((status, sha(body)), (200, sha(data)))
        self.assertGreater(waited, 1.5, "it waited for the other claimant first")
        self.assertLess(waited, 8.0)
        self.assertEqual(o.media_hits("orphan1"), 1)


class EvictionAcrossProcessesTest(MultiProcessCase):
    def test_remote_cache_eviction_runs_in_the_lease_holder_alone_and_bounds_the_shared_cache(self):
        o = self.origin(ORIGIN_IP)
        size, bound = 100000, 350000
        files = {f"ev{i}": os.urandom(size) for i in range(8)}
        for media_id, data in files.items():
            o.files[media_id] = ("ok", data, "application/octet-stream")
        a, b = self.start_cluster(2, media={"remote_cache_max_bytes": bound})
        holders = wait_until(lambda: [s for s in (a, b) if s.metric("atrium_lease_held", {"lease": EVICT_LEASE}) == 1],
                             what="one process holds the eviction lease")
        self.assertEqual(len(holders), 1)
        holder = holders[0]
        other = b if holder is a else a
        _, token = register(a)
        # Most copies are stored by the process that may not evict: on its own count it is
        # far past the bound, yet only the holder removes anything.
        for i, media_id in enumerate(files):
            srv = holder if i % 4 == 3 else other
            status, _, body = srv.request("GET", self.remote_path(o.server_name, media_id), token=token, timeout=30)
            self.assertEqual((status, sha(body)), (200, sha(files[media_id])))

        def cached_bytes():
            return int(harness.psql("SELECT coalesce(sum(size_bytes), 0) FROM media_remote", a.database)[0][0])
        wait_until(lambda: cached_bytes() <= bound, what="the shared remote cache back within its bound")
        self.assertEqual(other.metric("atrium_media_remote_cache_evictions_total"), 0)
        self.assertGreaterEqual(holder.metric("atrium_media_remote_cache_evictions_total"), 5)
        # The newest copy survived: least recently used first.
        status, _, body = other.request("GET", self.remote_path(o.server_name, "ev7"), token=token)
        self.assertEqual((status, sha(body)), (200, sha(files["ev7"])))
        self.assertEqual(o.media_hits("ev7"), 1)


class QuarantineAcrossProcessesTest(MultiProcessCase):
    def test_a_quarantine_through_a_applies_on_b_and_c_within_a_second(self):
        servers = self.start_cluster(3)
        a = servers[0]
        _, admin = register(a, admin=True)
        data = os.urandom(5000)
        media_id = upload(a, admin, data)
        for srv in servers:  # served everywhere first
            status, _, body = srv.request("GET", download_path(srv, media_id), token=admin)
            self.assertEqual((status, body), (200, data))
        status, _, body = a.request("POST", f"/_synapse/admin/v1/media/quarantine/{a.server_name}/{media_id}",
                                    body={}, token=admin)
        self.assertEqual(status, 200, body)
        quarantined = time.monotonic()
        for srv in servers[1:]:
            wait_until(lambda srv=srv: srv.request("GET", download_path(srv, media_id), token=admin)[0] == 404,
                       timeout=5, what="the other process refuses the quarantined media")
            self.assertLess(time.monotonic() - quarantined, QUARANTINE_REACH_S)


class RowCacheAcrossProcessesTest(MultiProcessCase):
    """Each process keeps the local media rows it served (rowcache.c); a quarantine by ID or
    by hash, or a deletion, through one process drops them there at once and in the
    others within a second (their notifications on the "row" channel). Its tests share
    one cluster (start_cluster(shared=True)), each with media of its own."""

    def hits(self, srv):
        return srv.metric("atrium_media_row_cache_total", {"result": "hit"}) or 0

    def misses(self, srv):
        return srv.metric("atrium_media_row_cache_total", {"result": "miss"}) or 0

    def cached_everywhere(self, servers, token, media_id, data):
        """Download from each process until one is served from its row cache (the first
        read fills it, once the process's notifications are live), then once more: a hit."""
        for srv in servers:
            def served_from_cache(srv=srv):
                before = self.hits(srv)
                status, _, body = srv.request("GET", download_path(srv, media_id), token=token)
                self.assertEqual((status, body), (200, data))
                return self.hits(srv) == before + 1
            wait_until(served_from_cache, timeout=5, what="each process serves from its row cache")

    def assert_refused_everywhere(self, a, b, token, media_id, changed):
        b_misses = self.misses(b)
        status, _, _ = a.request("GET", download_path(a, media_id), token=token)
        self.assertEqual(status, 404, "refused at once by the process that made the change")

        # Refused after reading the row again: b's entry was dropped. (After a deletion b
        # may answer 404 from its entry for a moment, the file being gone already.)
        def refused_after_a_fresh_read():
            status = b.request("GET", download_path(b, media_id), token=token)[0]
            return status == 404 and self.misses(b) > b_misses
        wait_until(refused_after_a_fresh_read, timeout=5,
                   what="b refuses the media it had in its row cache, read again")
        self.assertLess(time.monotonic() - changed, QUARANTINE_REACH_S)

    def test_a_quarantine_by_id_through_a_drops_the_cached_row_on_b(self):
        a, b = self.start_cluster(2, shared=True)
        _, admin = register(a, admin=True)
        data = os.urandom(5000)
        media_id = upload(a, admin, data)
        self.cached_everywhere((a, b), admin, media_id, data)
        status, _, body = a.request("POST", f"/_synapse/admin/v1/media/quarantine/{a.server_name}/{media_id}",
                                    body={}, token=admin)
        self.assertEqual(status, 200, body)
        self.assert_refused_everywhere(a, b, admin, media_id, time.monotonic())
        # Released: served again (a refused row is never cached, so nothing stale remains).
        status, _, body = a.request("POST", f"/_synapse/admin/v1/media/unquarantine/{a.server_name}/{media_id}",
                                    body={}, token=admin)
        self.assertEqual(status, 200, body)
        for srv in (a, b):
            status, _, body = srv.request("GET", download_path(srv, media_id), token=admin)
            self.assertEqual((status, body), (200, data))

    def test_a_quarantine_by_hash_through_a_drops_the_cached_row_on_b(self):
        a, b = self.start_cluster(2, shared=True)
        _, admin = register(a, admin=True)
        data = os.urandom(5000)
        media_id = upload(a, admin, data)
        self.cached_everywhere((a, b), admin, media_id, data)
        status, _, body = a.request("POST", f"/_atrium/admin/v1/media/quarantine_hash/{sha(data)}",
                                    body={}, token=admin)
        self.assertEqual(status, 200, body)
        self.assert_refused_everywhere(a, b, admin, media_id, time.monotonic())

    def test_a_deletion_through_a_drops_the_cached_row_on_b(self):
        a, b = self.start_cluster(2, shared=True)
        _, admin = register(a, admin=True)
        data = os.urandom(5000)
        media_id = upload(a, admin, data)
        self.cached_everywhere((a, b), admin, media_id, data)
        status, _, body = a.request("DELETE", f"/_synapse/admin/v1/media/{a.server_name}/{media_id}",
                                    token=admin)
        self.assertEqual(status, 200, body)
        self.assert_refused_everywhere(a, b, admin, media_id, time.monotonic())


if __name__ == "__main__":
    import unittest
    unittest.main()
