"""Uploads against the clock: a slow but steady body is not refused for the time its bytes
take (the handoff deadline counts from the end of the body), a client that stops sending
is cut by the idle-body timeout, and a deadline that passes while uploads are stored never
contradicts the store: every upload is either acknowledged and stored, or refused and
absent."""

import json
import os
import threading
import time
import unittest

from common import AtriumTestCase
from harness import deep_merge, psql, raw_connect, read_head
from media_support import download_path, media_server, register, sha256, store_files

UPLOAD = "/_matrix/media/v3/upload"


def send_slowly(sock, head, body, chunks, pause_s):
    sock.sendall(head)
    step = (len(body) + chunks - 1) // chunks
    for i in range(0, len(body), step):
        sock.sendall(body[i:i + step])
        time.sleep(pause_s)


def restart_with(srv, settings):
    """Restart srv with settings merged in (a user registered first: registration hands off
    to a pool and would not fit in the tiny deadlines these tests set)."""
    srv.stop()
    srv._settings = deep_merge(srv._settings, settings)
    srv.write_config()
    srv.start()


def originals(srv):
    return [f for f in store_files(srv) if f.startswith("local/")]


class UploadDeadlineTest(AtriumTestCase):
    def test_a_slow_steady_upload_outlasting_the_deadline_succeeds(self):
        srv = media_server(self)
        _, token = register(srv)
        restart_with(srv, {"server": {"http": {"handoff_deadline_ms": 500,
                                               "body_idle_timeout_s": 2}}})
        body = os.urandom(96_000)
        head = (f"POST {UPLOAD} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n"
                f"Connection: close\r\n\r\n").encode()
        sock = raw_connect(srv.port, timeout=20)
        started = time.monotonic()
        send_slowly(sock, head, body, chunks=24, pause_s=0.1)  # 2.4 s: five deadlines
        status, _, rest = read_head(sock)
        self.assertGreater(time.monotonic() - started, 2.0)
        while True:
            more = sock.recv(65536)
            if not more:
                break
            rest += more
        sock.close()
        self.assertEqual(status, 200, rest[:300])
        media_id = json.loads(rest)["content_uri"].rsplit("/", 1)[1]
        status, _, data = srv.request("GET", download_path(srv, media_id), token=token)
        self.assertEqual((status, sha256(data)), (200, sha256(body)))

    def test_an_upload_that_stops_sending_is_cut_by_the_idle_body_timeout_and_leaves_nothing(self):
        srv = media_server(self, settings={"server": {"http": {
            "body_idle_timeout_s": 1, "connection_timeout_s": 60}}})
        _, token = register(srv)
        rows_before = psql("SELECT count(*) FROM media_local", srv.database)[0][0]
        head = (f"POST {UPLOAD} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                f"Content-Type: application/octet-stream\r\nContent-Length: 100000\r\n\r\n").encode()
        sock = raw_connect(srv.port, timeout=20)
        sock.sendall(head + os.urandom(40_000))  # then nothing more
        started = time.monotonic()
        try:
            data = sock.recv(65536)
            while data and b"\r\n\r\n" not in data:  # an answer is allowed; then the close
                data += sock.recv(65536)
            while sock.recv(65536):
                pass
        except ConnectionResetError:
            pass
        took = time.monotonic() - started
        sock.close()
        self.assertLess(took, 8, "cut by the idle-body timeout, long before the connection timeout")
        self.assertGreater(took, 0.5)
        self.assertEqual(psql("SELECT count(*) FROM media_local", srv.database)[0][0], rows_before)
        self.assertEqual(originals(srv), [])
        self.assertEqual(srv.request("GET", "/health")[0], 200)

    def test_with_a_tiny_deadline_every_stored_upload_was_acknowledged_and_no_other_is_left(self):
        srv = media_server(self, media={"io_threads": 2})
        _, token = register(srv)
        restart_with(srv, {"server": {"http": {"handoff_deadline_ms": 100}}})
        acknowledged, refused, lock = {}, {}, threading.Lock()

        def uploader(k):
            for n in range(12):
                data = os.urandom(20_000 + (k * 7919 + n * 104729) % 400_000)
                try:
                    status, _, body = srv.request("POST", UPLOAD, body=data, token=token, timeout=30,
                                                  headers={"Content-Type": "application/octet-stream"})
                except OSError as e:
                    status, body = repr(e), b""
                with lock:
                    if status == 200:
                        acknowledged[json.loads(body)["content_uri"].rsplit("/", 1)[1]] = sha256(data)
                    else:
                        refused[status] = refused.get(status, 0) + 1

        threads = [threading.Thread(target=uploader, args=(k,), daemon=True) for k in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        self.assertTrue(set(refused) <= {504, 429}, refused)
        self.assertGreater(len(acknowledged), 0)
        rows = {r[0] for r in psql("SELECT media_id FROM media_local", srv.database)}
        self.assertEqual(rows, set(acknowledged), f"refused: {refused}")
        self.assertEqual(sorted(os.path.basename(f) for f in originals(srv)), sorted(acknowledged))
        for media_id, digest in list(acknowledged.items())[:20]:
            status, _, data = srv.request("GET", download_path(srv, media_id), token=token)
            self.assertEqual((status, sha256(data)), (200, digest))
        if os.environ.get("ATRIUM_CHAOS_REPORT"):
            print(f"\nacknowledged {len(acknowledged)}, refused {refused}, rows {len(rows)}")


if __name__ == "__main__":
    unittest.main()
