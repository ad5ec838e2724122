"""matrix-nio (Debian's python3-matrix-nio, 0.20: the Python SDK many bots and bridges use)
against a real server: it speaks only the r0 prefixes (/_matrix/client/r0/, and
/_matrix/media/r0/ for media), so this drives every step it takes through them: register,
login, room creation, sending, syncing, uploading and downloading. The SDK is installed by
tests/run.sh (ATRIUM_TEST_PACKAGES in tests/lib/deps.sh)."""

import asyncio
import io
import os
import sys
import uuid

from harness import AtriumTestCase
from media_support import media_server

# Debian's package lives in Debian's dist-packages, which an interpreter of the same
# version built elsewhere (pyenv) does not search by itself: look there after the rest.
DEBIAN_DIST_PACKAGES = "/usr/lib/python3/dist-packages"
try:
    import nio
except ImportError:
    if DEBIAN_DIST_PACKAGES not in sys.path:
        sys.path.append(DEBIAN_DIST_PACKAGES)
    try:
        import nio
    except ImportError as e:  # tests/run.sh installs it; say what is missing
        raise ImportError("matrix-nio is missing: apt-get install python3-matrix-nio") from e

PASSWORD = "correct horse battery staple"


class MatrixNioTest(AtriumTestCase):
    def setUp(self):
        self.srv = media_server(self, media={"legacy_media": True},
                                settings={"presence": {"enabled": True}})
        self.base = f"http://127.0.0.1:{self.srv.port}"

    def run_async(self, coro):
        return asyncio.run(asyncio.wait_for(coro, timeout=60))

    def test_versions_advertise_r0_and_r0_paths_are_served(self):
        status, body = self.srv.json("GET", "/_matrix/client/versions")
        self.assertEqual(status, 200)
        self.assertIn("r0.6.1", body["versions"])
        status, body = self.srv.json("GET", "/_matrix/client/r0/register/available?username=zed")
        self.assertEqual((status, body), (200, {"available": True}))
        status, body = self.srv.json("GET", "/_matrix/media/r0/config")
        self.assertEqual(status, 401, "the same handler as v3 (it asks for a token)")

    def test_register_login_create_send_sync_upload_download(self):
        async def flow():
            name = f"nio{uuid.uuid4().hex[:8]}"
            client = nio.AsyncClient(self.base, name)
            try:
                resp = await client.register(name, PASSWORD, "bot")
                self.assertIsInstance(resp, nio.RegisterResponse, resp)
                user_id = resp.user_id
                self.assertEqual(user_id, f"@{name}:{self.srv.server_name}")
            finally:
                await client.close()

            client = nio.AsyncClient(self.base, user_id)
            try:
                resp = await client.login(PASSWORD, device_name="second")
                self.assertIsInstance(resp, nio.LoginResponse, resp)

                resp = await client.room_create(name="nio room", topic="from nio")
                self.assertIsInstance(resp, nio.RoomCreateResponse, resp)
                room_id = resp.room_id

                resp = await client.room_send(room_id, "m.room.message",
                                              {"msgtype": "m.text", "body": "hello from nio"})
                self.assertIsInstance(resp, nio.RoomSendResponse, resp)
                sent_id = resp.event_id

                resp = await client.sync(timeout=0, full_state=True)
                self.assertIsInstance(resp, nio.SyncResponse, resp)
                self.assertIn(room_id, resp.rooms.join)
                bodies = [getattr(e, "body", None) for e in resp.rooms.join[room_id].timeline.events]
                self.assertIn("hello from nio", bodies)
                self.assertIn(sent_id, [e.event_id for e in resp.rooms.join[room_id].timeline.events])
                self.assertEqual(client.rooms[room_id].name, "nio room")

                data = os.urandom(50_000)
                resp, _ = await client.upload(io.BytesIO(data), "application/x-nio",
                                              filename="blob.bin", filesize=len(data))
                self.assertIsInstance(resp, nio.UploadResponse, resp)
                self.assertTrue(resp.content_uri.startswith(f"mxc://{self.srv.server_name}/"))

                resp = await client.download(resp.content_uri)
                self.assertIsInstance(resp, nio.DownloadResponse, resp)
                self.assertEqual(resp.body, data)
                self.assertEqual(resp.content_type, "application/x-nio")

                # A second sync from the first's token sees a new message only.
                resp = await client.sync(timeout=0)
                since = resp.next_batch
                await client.room_send(room_id, "m.room.message", {"msgtype": "m.text", "body": "2"})
                resp = await client.sync(timeout=5000, since=since)
                self.assertIsInstance(resp, nio.SyncResponse, resp)
                events = resp.rooms.join[room_id].timeline.events
                self.assertEqual([getattr(e, "body", None) for e in events], ["2"])
            finally:
                await client.close()

        self.run_async(flow())
