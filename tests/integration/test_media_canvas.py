"""Image bombs by the declared canvas: browsers size their decode by the container's canvas
(a GIF's logical screen, a WebP's VP8X canvas), not by the frames inside, so the pixel
limit judges the declared canvas too, and an original whose canvas exceeds it is never
passed through as its own thumbnail."""

import json
import struct
import unittest

from common import AtriumTestCase
from media_support import download_path, media_server, png, register, thumbnail_path, upload

# The smallest GIF image: a 2-colour global table and one 1x1 frame (LZW: clear, 0, end).
_GIF_TAIL = (b"\x00\x00\x00\xff\xff\xff"          # global colour table (2 entries)
             b"\x2c\x00\x00\x00\x00\x01\x00\x01\x00\x00"  # image descriptor: 1x1 at 0,0
             b"\x02\x02\x44\x01\x00"              # LZW minimum code size 2, one sub-block
             b"\x3b")                             # trailer


def gif_with_screen(width, height):
    return b"GIF89a" + struct.pack("<HH", width, height) + b"\x80\x00\x00" + _GIF_TAIL


class DeclaredCanvasTest(AtriumTestCase):
    def assert_refused(self, response):
        status, headers, body = response
        self.assertEqual(status, 413, body[:300])
        self.assertEqual(json.loads(body)["errcode"], "M_TOO_LARGE")
        self.assertEqual(headers.get("Cache-Control"), "no-store")

    def test_a_gif_declaring_a_65535_square_screen_around_a_1x1_frame_is_never_its_own_thumbnail(self):
        srv = media_server(self)
        _, token = register(srv)
        bomb = gif_with_screen(65535, 65535)
        media_id = upload(srv, token, bomb, "image/gif")
        for w, h, method in ((32, 32, "crop"), (96, 96, "scale"), (800, 600, "scale")):
            with self.subTest(size=(w, h, method)):
                self.assert_refused(srv.request("GET", thumbnail_path(srv, media_id, w, h, method),
                                                token=token))
        # The original itself is still downloadable (as an attachment decision is not ours).
        status, _, body = srv.request("GET", download_path(srv, media_id), token=token)
        self.assertEqual((status, body), (200, bomb))

    def test_a_gif_whose_screen_is_within_the_limit_is_still_served(self):
        srv = media_server(self)
        _, token = register(srv)
        small = gif_with_screen(1, 1)
        media_id = upload(srv, token, small, "image/gif")
        status, headers, body = srv.request("GET", thumbnail_path(srv, media_id, 32, 32, "crop"),
                                            token=token)
        self.assertEqual(status, 200, body[:300])
        self.assertEqual(body, small, "a 1x1 GIF is its own thumbnail")
        # A PNG is judged as before: its IHDR is its canvas.
        png_id = upload(srv, token, png(50, 40), "image/png")
        status, _, _ = srv.request("GET", thumbnail_path(srv, png_id, 32, 32, "scale"), token=token)
        self.assertEqual(status, 200)


if __name__ == "__main__":
    unittest.main()
