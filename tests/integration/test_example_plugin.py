"""What the example media plugin (examples/media-disk/) records beyond the media/1
contract, which the conformance suite cannot see: each row's SHA-256, computed with the
host's chunk-by-chunk helper as the body streams in, and a created_ts that is a date
(host wall_ms), not the monotonic clock (ABI 1.5; issue 26)."""

import hashlib
import os
import time

from common import AtriumTestCase
from harness import plugin_dir, psql
from media_support import register


def example_plugin():
    """build/examples/media_disk.so beside build/plugins (examples/CMakeLists.txt)."""
    return os.path.join(os.path.dirname(os.path.abspath(plugin_dir())), "examples",
                        "media_disk.so")


class ExamplePluginTest(AtriumTestCase):
    def test_an_upload_row_holds_the_contents_sha256_and_a_wall_clock_date(self):
        srv = self.start_server(
            plugins={"media_disk": {"enabled": True, "path": example_plugin(),
                                    "store_path": "store"}},
            settings={"registration": {"enabled": True}})
        _, token = register(srv)
        for data in (os.urandom(700 * 1024 + 11), b""):
            with self.subTest(size=len(data)):
                before_ms = time.time() * 1000
                status, _, body = srv.request("POST", "/_matrix/media/v3/upload", data,
                                              {"Content-Type": "application/octet-stream"},
                                              token=token, timeout=30)
                after_ms = time.time() * 1000
                self.assertEqual(status, 200, body)
                media_id = body.decode().split('"content_uri":"mxc://localhost/')[1][:24]
                rows = psql("SELECT sha256, created_ts, size_bytes FROM media_disk_files "
                            f"WHERE media_id = '{media_id}'", srv.database)
                self.assertEqual(len(rows), 1, rows)
                sha, created_ts, size = rows[0]
                self.assertEqual(sha, hashlib.sha256(data).hexdigest())
                self.assertEqual(int(size), len(data))
                self.assertTrue(before_ms - 1000 <= int(created_ts) <= after_ms + 1000,
                                f"created_ts {created_ts} is not a date within the upload")
