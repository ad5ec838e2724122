"""Remote media against a real Synapse (1.132): Synapse as the origin of media an Atrium
user downloads and thumbnails, Synapse as the client fetching Atrium's media over
federation, and the first view of a room of 150 images with Synapse as their origin
(Synapse's federation rate limiter must never reach the Atrium user as a 429).

Synapse is a test peer, not part of Atrium (test_federation_synapse.py says where it comes
from); without it these tests are skipped with a message saying so.
"""

import hashlib
import http.client
import json
import os
import re
import shutil
import struct
import tempfile
import unittest
import zlib

from accounts import register as register_account
from media_support import get_many, png, upload, webp_size
from test_federation_synapse import PEER_SH, SKIP_MESSAGE, SynapseCase, peer

ATRIUM_IP = "127.0.0.54"
IMAGES = 150


def sha(data):
    return hashlib.sha256(data).hexdigest()


def decoded_size(data):
    """(width, height) of a thumbnail (Synapse's PNG or JPEG, or Atrium's WebP), after
    checking it is a complete image: a PNG's pixel data is inflated and must hold every
    row; a JPEG must reach its end marker; a WebP's RIFF size must match. Raises
    AssertionError otherwise."""
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        at, idat, size, kind = 8, b"", None, None
        while at + 8 <= len(data):
            length, ctype = struct.unpack(">I4s", data[at:at + 8])
            chunk = data[at + 8:at + 8 + length]
            if ctype == b"IHDR":
                w, h, depth, colour = struct.unpack(">IIBB", chunk[:10])
                size, kind = (w, h), (depth, colour)
            elif ctype == b"IDAT":
                idat += chunk
            elif ctype == b"IEND":
                break
            at += 12 + length
        else:
            raise AssertionError("a PNG without its IEND chunk")
        channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[kind[1]]
        row = 1 + (size[0] * channels * kind[0] + 7) // 8
        if len(zlib.decompress(idat)) != row * size[1]:
            raise AssertionError("a PNG whose pixel data does not fill its rows")
        return size
    if data[:2] == b"\xff\xd8":
        if not data.rstrip(b"\x00").endswith(b"\xff\xd9"):
            raise AssertionError("a JPEG without its end marker")
        at = 2
        while at + 4 <= len(data):
            marker, length = data[at + 1], struct.unpack(">H", data[at + 2:at + 4])[0]
            if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                h, w = struct.unpack(">HH", data[at + 5:at + 9])
                return (w, h)
            at += 2 + length
        raise AssertionError("a JPEG without a frame header")
    if data[:4] == b"RIFF":
        return webp_size(data)  # Atrium's own rendering (from a cached original)
    raise AssertionError(f"neither PNG, JPEG nor WebP: {data[:16]!r}")


@unittest.skipUnless(os.path.exists(PEER_SH), SKIP_MESSAGE)
class MediaWithSynapseTest(SynapseCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.class_syn = cls.start_class_synapse()

    def start_pair(self, media=None):
        store = tempfile.mkdtemp(prefix="atrium-media-synapse-")
        self.addCleanup(shutil.rmtree, store, True)
        conf = {"enabled": True, "store_path": store, **(media or {})}
        a = self.start_fed(ATRIUM_IP, extra={"plugins": {"media": conf}})
        syn = self.class_syn
        sam = json.loads(peer("register", syn["dir"], self.peer_user("sam"), "sam-password-1"))
        return a, syn, sam

    def synapse_upload(self, syn, token, data, content_type, filename):
        conn = http.client.HTTPConnection(syn["ip"], syn["client_port"], timeout=30)
        conn.request("POST", f"/_matrix/media/v3/upload?filename={filename}", body=data,
                     headers={"Authorization": f"Bearer {token}", "Content-Type": content_type})
        resp = conn.getresponse()
        body = json.loads(resp.read())
        conn.close()
        self.assertEqual(resp.status, 200, body)
        return body["content_uri"].rsplit("/", 1)[1]

    def synapse_get(self, syn, path, token):
        conn = http.client.HTTPConnection(syn["ip"], syn["client_port"], timeout=60)
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        return resp.status, resp.headers, data

    def synapse_served(self, syn, media_id):
        """Requests for media_id Synapse's federation listener has processed (its access
        log lines)."""
        with open(os.path.join(syn["dir"], "homeserver.log"), errors="replace") as f:
            text = f.read()
        return len(re.findall(r"GET /_matrix/federation/v1/media/(?:download|thumbnail)/"
                              + re.escape(media_id), text))

    def test_an_atrium_user_downloads_and_thumbnails_media_uploaded_on_synapse(self):
        a, syn, sam = self.start_pair()
        alice = register_account(a, "alice")
        image = png(640, 480)
        media_id = self.synapse_upload(syn, sam["access_token"], image, "image/png", "pic.png")
        path = f"/_matrix/client/v1/media/download/{syn['name']}/{media_id}"

        def thumbnail(w, h, method):
            status, headers, thumb = a.request(
                "GET", f"/_matrix/client/v1/media/thumbnail/{syn['name']}/{media_id}"
                f"?width={w}&height={h}&method={method}", token=alice.token, timeout=60)
            self.assertEqual(status, 200, thumb[:300])
            return headers["Content-Type"], thumb
        # First the thumbnail, while the original is not cached: Synapse's own rendering.
        ctype, thumb = thumbnail(320, 240, "scale")
        self.assertIn(ctype, ("image/png", "image/jpeg"))
        self.assertEqual(decoded_size(thumb), (320, 240))
        status, headers, body = a.request("GET", path, token=alice.token, timeout=60)
        self.assertEqual(status, 200, body[:300])
        self.assertEqual(sha(body), sha(image))
        self.assertEqual(headers["Content-Type"], "image/png")
        self.assertIn("pic.png", headers["Content-Disposition"])
        # With the original cached, another size is rendered here from it.
        ctype, thumb = thumbnail(96, 96, "crop")
        self.assertEqual(ctype, "image/webp")
        self.assertEqual(decoded_size(thumb), (96, 96))
        # Again, from Atrium's cache: Synapse is not asked again.
        asked = self.synapse_served(syn, media_id)
        status, _, again = a.request("GET", path, token=alice.token, timeout=60)
        self.assertEqual((status, sha(again)), (200, sha(image)))
        self.assertEqual(self.synapse_served(syn, media_id), asked)
        # Two resources, each fetched once: Synapse's thumbnail and the original.
        self.assertEqual(asked, 2)
        self.assertEqual(a.metric("atrium_media_remote_fetched_total", {"via": "federation"}), 2)

    def test_a_synapse_user_downloads_media_uploaded_on_atrium(self):
        a, syn, sam = self.start_pair()
        alice = register_account(a, "alice")
        data = os.urandom(300000)
        media_id = upload(a, alice.token, data, "application/pdf", filename="report.pdf")
        status, headers, body = self.synapse_get(
            syn, f"/_matrix/client/v1/media/download/{a.server_name}/{media_id}",
            sam["access_token"])
        self.assertEqual(status, 200, body[:300])
        self.assertEqual(sha(body), sha(data))
        self.assertEqual(headers["Content-Type"], "application/pdf")
        # Synapse asked Atrium's authenticated federation endpoint (multipart/mixed).
        self.assertEqual(a.metric("atrium_media_federation_served_total"), 1)

    def test_150_images_uploaded_on_synapse_all_load_at_once_for_one_atrium_client(self):
        # Should Synapse's federation rate limiter refuse some with 429, Atrium asks again
        # (test_media_remote.OriginRateLimitTest proves that against a fake origin).
        self.first_view_of_150(None)

    def first_view_of_150(self, media):
        """The 150 images of a room, uploaded on Synapse, asked at once by one Atrium
        client: all 150 load, byte-identical. Returns the fetches retried after a 429."""
        a, syn, sam = self.start_pair(media)
        alice = register_account(a, "alice")
        images = [png(8, 8 + i % 7, pixel=lambda x, y, i=i: (i, x, y)) for i in range(IMAGES)]
        ids = [self.synapse_upload(syn, sam["access_token"], img, "image/png", f"i{i}.png")
               for i, img in enumerate(images)]
        paths = [f"/_matrix/client/v1/media/download/{syn['name']}/{m}" for m in ids]
        results = get_many(a, paths, alice.token, IMAGES, timeout=60)
        bad = [(i, r[0], r[2][:120]) for i, r in enumerate(results) if r[0] != 200]
        self.assertEqual(bad, [], f"retried after a 429: "
                         f"{a.metric('atrium_media_remote_fetch_retried_total')}")
        for i, r in enumerate(results):
            self.assertEqual(sha(r[2]), sha(images[i]))
        self.assertEqual(a.metric("atrium_media_remote_fetches_total", {"outcome": "ok"}), IMAGES)
        return a.metric("atrium_media_remote_fetch_retried_total")


if __name__ == "__main__":
    unittest.main()
