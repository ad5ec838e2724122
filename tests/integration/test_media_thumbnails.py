"""Thumbnails: the configured sizes as WebP with the expected dimensions, never an upscale,
EXIF orientation, refusal of oversized and broken images (the original still downloads),
one render per key however many ask at once, and the fallback when a render cannot finish
in time.

Tests on the default settings share the module's one server (media_server(shared="module")):
each uploads images of its own and counts renders from the values before it.
"""

import json
import os
import time
import unittest

from common import AtriumTestCase, wait_until
from media_support import (animated_gif, download_path, jpeg_from_png, webp_frames, media_server, noise_png, png,
                           png_claiming, register, thumbnail_path, upload, vips_decode, webp_size,
                           with_exif_orientation, get_many)


def vm_hwm_kib(pid):
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM")


class ThumbnailTestCase(AtriumTestCase):
    def thumb(self, srv, token, media_id, w, h, method="scale", extra=""):
        return srv.request("GET", thumbnail_path(srv, media_id, w, h, method, extra), token=token)

    def renders(self, srv, result):
        return srv.metric("atrium_media_renders_total", {"result": result}) or 0

    def assert_error(self, response, status, errcode):
        got, headers, body = response
        self.assertEqual(got, status, body[:300])
        self.assertEqual(json.loads(body)["errcode"], errcode)
        self.assertEqual(headers.get("Cache-Control"), "no-store")


class SizesTest(ThumbnailTestCase):
    def test_every_configured_size_is_a_webp_of_the_expected_dimensions(self):
        srv = media_server(self, shared="module")
        _, token = register(srv)
        renders0 = self.renders(srv, "ok")
        media_id = upload(srv, token, png(1000, 800), "image/png")
        cases = [  # request, method -> dimensions of the configured size it gets
            ((32, 32), "crop", (32, 32)),
            ((96, 96), "crop", (96, 96)),
            ((320, 240), "scale", (300, 240)),
            ((640, 480), "scale", (600, 480)),
            ((800, 600), "scale", (750, 600)),
            ((50, 50), "crop", (96, 96)),      # the smallest crop at least as large
            ((100, 100), "scale", (300, 240)), # the smallest scale at least as large
            ((900, 700), "scale", (750, 600)),  # larger than any size: the largest
        ]
        for (w, h), method, expected in cases:
            with self.subTest(request=(w, h, method)):
                status, headers, body = self.thumb(srv, token, media_id, w, h, method)
                self.assertEqual(status, 200, body[:200])
                self.assertEqual(headers.get("Content-Type"), "image/webp")
                self.assertEqual(headers.get("Content-Disposition"), 'inline; filename="thumbnail.webp"')
                self.assertEqual(headers.get("Cache-Control"), "private, max-age=86400")
                self.assertEqual(headers.get("Cross-Origin-Resource-Policy"), "cross-origin")
                self.assertEqual(webp_size(body), expected)
                self.assertEqual(vips_decode(body)[:2], expected, "decodes fully")
        # Five sizes rendered, each once.
        self.assertEqual(self.renders(srv, "ok") - renders0, 5)
        status, headers, _ = self.thumb(srv, token, media_id, 32, 32, "crop")
        etag = headers.get("ETag")
        status, _, body = srv.request("GET", thumbnail_path(srv, media_id, 32, 32, "crop"), token=token,
                                      headers={"If-None-Match": etag})
        self.assertEqual((status, body), (304, b""))

    def test_an_original_smaller_than_asked_is_served_as_it_is(self):
        srv = media_server(self, shared="module")
        _, token = register(srv)
        small = png(64, 48)
        renders0 = self.renders(srv, "ok")
        media_id = upload(srv, token, small, "image/png")
        for w, h, method in ((64, 48, "scale"), (800, 600, "scale"), (96, 96, "crop")):
            with self.subTest(request=(w, h, method)):
                status, headers, body = self.thumb(srv, token, media_id, w, h, method)
                self.assertEqual((status, body), (200, small), "never upscaled")
                self.assertEqual(headers.get("Content-Type"), "image/png")
                self.assertEqual(headers.get("Content-Disposition"), 'inline; filename="thumbnail.png"')
        self.assertEqual(self.renders(srv, "ok") - renders0, 0)

    def test_an_exif_rotated_jpeg_gives_an_upright_thumbnail(self):
        srv = media_server(self, shared="module")
        _, token = register(srv)
        # Stored 400x200, left half red, right half blue; orientation 6 shows it rotated
        # 90 degrees clockwise: 200x400, red on top, blue below.
        stored = png(400, 200, lambda x, y: (255, 0, 0) if x < 200 else (0, 0, 255))
        jpeg = with_exif_orientation(jpeg_from_png(stored), 6)
        media_id = upload(srv, token, jpeg, "image/jpeg")
        status, _, body = self.thumb(srv, token, media_id, 320, 240)
        self.assertEqual(status, 200)
        w, h, pixels = vips_decode(body, points=[(60, 20), (60, 220)])
        self.assertEqual((w, h), (120, 240), "portrait: the rotation was applied")
        top, bottom = pixels[(60, 20)], pixels[(60, 220)]
        self.assertGreater(top[0], 200, f"top is red: {top}")
        self.assertLess(top[2], 60, f"top is red: {top}")
        self.assertGreater(bottom[2], 200, f"bottom is blue: {bottom}")
        self.assertLess(bottom[0], 60, f"bottom is blue: {bottom}")

    def test_a_large_exif_rotated_jpeg_gives_upright_thumbnails_of_every_size(self):
        # JPEGs are decoded at 1/2, 1/4 or 1/8 scale (render.c, jpeg_shrink_on_load), the
        # scale chosen from the size as shown: a 2400x1600 photo stored sideways must
        # still give exact, upright sizes. Stored quadrants: red | blue over green | white;
        # orientation 6 (turn 90 degrees clockwise) shows green | red over white | blue.
        red, blue, green, white = b"\xff\x00\x00", b"\x00\x00\xff", b"\x00\xff\x00", b"\xff\xff\xff"
        rows = (b"\x00" + red * 1200 + blue * 1200) * 800 + (b"\x00" + green * 1200 + white * 1200) * 800
        jpeg = with_exif_orientation(jpeg_from_png(png(2400, 1600, raw_rows=rows, level=1)), 6)
        srv = media_server(self, shared="module")
        _, token = register(srv)
        media_id = upload(srv, token, jpeg, "image/jpeg")
        expected_colours = {"top left": (0, 255, 0), "top right": (255, 0, 0),
                            "bottom left": (255, 255, 255), "bottom right": (0, 0, 255)}
        # Every size is checked; the pixels of one per DCT scale and method (each decode
        # of the answer costs a few `vips` processes).
        for (w, h), method, size, look in (((320, 240), "scale", (160, 240), True),
                                           ((640, 480), "scale", (320, 480), False),
                                           ((800, 600), "scale", (400, 600), True),
                                           ((96, 96), "crop", (96, 96), False),
                                           ((32, 32), "crop", (32, 32), True)):
            with self.subTest(request=(w, h, method)):
                status, headers, body = self.thumb(srv, token, media_id, w, h, method)
                self.assertEqual((status, headers.get("Content-Type")), (200, "image/webp"), body[:200])
                self.assertEqual(webp_size(body), size)
                if not look:
                    continue
                qx, qy = size[0] // 4, size[1] // 4
                points = {"top left": (qx, qy), "top right": (3 * qx, qy),
                          "bottom left": (qx, 3 * qy), "bottom right": (3 * qx, 3 * qy)}
                got_w, got_h, pixels = vips_decode(body, points=list(points.values()))
                self.assertEqual((got_w, got_h), size, "decodes fully")
                for where, point in points.items():
                    got = pixels[point]
                    for band, want in zip(got[:3], expected_colours[where]):
                        self.assertAlmostEqual(band, want, delta=60, msg=f"{where} at {point}: {got}")


    def test_animated_true_gives_every_frame_and_otherwise_the_first(self):
        srv = media_server(self, shared="module")
        _, token = register(srv)
        gif = animated_gif(400, 300, [(255, 0, 0), (0, 255, 0), (0, 0, 255)])
        media_id = upload(srv, token, gif, "image/gif")
        for method, size in (("scale", (320, 240)), ("crop", (96, 96))):
            with self.subTest(method=method):
                w, h = (100, 80) if method == "scale" else (96, 96)
                status, headers, body = self.thumb(srv, token, media_id, w, h, method, "&animated=true")
                self.assertEqual((status, headers.get("Content-Type")), (200, "image/webp"), body[:200])
                self.assertEqual(webp_frames(body), 3)
                self.assertEqual(webp_size(body), size)
                self.assertEqual(vips_decode(body)[:2], size)
                _, _, pixels = vips_decode(body, points=[(size[0] // 2, size[1] // 2)])
                self.assertGreater(pixels[(size[0] // 2, size[1] // 2)][0], 200, "frame 1 is red")
                for extra in ("&animated=false", ""):
                    status, _, still = self.thumb(srv, token, media_id, w, h, method, extra)
                    self.assertEqual(status, 200)
                    self.assertEqual((webp_frames(still), webp_size(still)), (1, size))
        # A small animation that fits the box is its own (animated) thumbnail.
        small = animated_gif(60, 40, [(255, 0, 0), (0, 0, 255)])
        small_id = upload(srv, token, small, "image/gif")
        status, headers, body = self.thumb(srv, token, small_id, 96, 96, "crop", "&animated=true")
        self.assertEqual((status, headers.get("Content-Type"), body), (200, "image/gif", small))
        status, headers, body = self.thumb(srv, token, small_id, 96, 96, "crop", "&animated=false")
        self.assertEqual((status, headers.get("Content-Type")), (200, "image/webp"), "never animated")
        self.assertEqual((webp_frames(body), webp_size(body)), (1, (60, 40)))
        # A still image asked for animation is simply its still thumbnail.
        still_id = upload(srv, token, png(300, 300), "image/png")
        status, _, body = self.thumb(srv, token, still_id, 96, 96, "crop", "&animated=true")
        self.assertEqual((status, webp_frames(body), webp_size(body)), (200, 1, (96, 96)))


class RefusalTest(ThumbnailTestCase):
    """The test measuring the process's peak memory has a server of its own (a peak an
    earlier test raised would hide its growth)."""

    def test_a_png_claiming_100000_by_100000_is_refused_quickly_with_bounded_memory(self):
        srv = media_server(self)
        _, token = register(srv)
        bomb = png_claiming(100000, 100000)
        media_id = upload(srv, token, bomb, "image/png")
        before = vm_hwm_kib(srv.pid)
        started = time.monotonic()
        for w, h in ((32, 32), (800, 600)):
            self.assert_error(self.thumb(srv, token, media_id, w, h), 413, "M_TOO_LARGE")
        self.assertLess(time.monotonic() - started, 2.0)
        self.assertLess((vm_hwm_kib(srv.pid) - before) / 1024, 32, "no pixel buffer was allocated")
        status, _, body = srv.request("GET", download_path(srv, media_id), token=token)
        self.assertEqual((status, body), (200, bomb), "the original still downloads")

    def test_truncated_and_non_image_files_give_400_while_the_original_downloads(self):
        srv = media_server(self, shared="module")
        _, token = register(srv)
        failed0, ok0 = self.renders(srv, "failed"), self.renders(srv, "ok")
        jpeg = jpeg_from_png(noise_png(300, 200))
        truncated = upload(srv, token, jpeg[: len(jpeg) // 2], "image/jpeg")
        text = upload(srv, token, b"just some text, not an image\n" * 20, "image/png")
        svg = upload(srv, token, b'<svg xmlns="http://www.w3.org/2000/svg" width="500" height="500"/>',
                     "image/svg+xml")
        for media_id in (truncated, text, svg):
            with self.subTest(media_id=media_id):
                for _ in range(3):
                    self.assert_error(self.thumb(srv, token, media_id, 96, 96, "crop"), 400, "M_UNKNOWN")
                status, _, body = srv.request("GET", download_path(srv, media_id), token=token)
                self.assertEqual(status, 200)
        self.assertEqual(self.renders(srv, "failed") - failed0, 1,
                         "the truncated file was decoded once, its failure remembered")
        self.assertEqual(self.renders(srv, "ok") - ok0, 0)

    def test_bad_thumbnail_parameters_are_400(self):
        srv = media_server(self, shared="module")
        _, token = register(srv)
        media_id = upload(srv, token, png(100, 100), "image/png")
        base = f"/_matrix/client/v1/media/thumbnail/localhost/{media_id}"
        for query, errcode in (("?width=32", "M_MISSING_PARAM"), ("?width=-1&height=32", "M_INVALID_PARAM"),
                               ("?width=abc&height=32", "M_INVALID_PARAM"),
                               ("?width=32&height=32&method=zoom", "M_INVALID_PARAM"),
                               ("?width=32&height=32&animated=maybe", "M_INVALID_PARAM")):
            with self.subTest(query=query):
                self.assert_error(srv.request("GET", base + query, token=token), 400, errcode)


class RenderOnceTest(ThumbnailTestCase):
    def test_simultaneous_requests_for_one_thumbnail_cause_one_render(self):
        srv = media_server(self, shared="module")
        _, token = register(srv)
        renders0 = self.renders(srv, "ok")
        coalesced0 = srv.metric("atrium_media_render_coalesced_total") or 0
        media_id = upload(srv, token, noise_png(2000, 1500), "image/png", timeout=60)
        paths = [thumbnail_path(srv, media_id, 640, 480)] * 24
        results = get_many(srv, paths, token, concurrency=24)
        bodies = {body for status, _, body in results}
        self.assertEqual([status for status, _, _ in results], [200] * 24)
        self.assertEqual(len(bodies), 1, "everyone got the same file")
        self.assertEqual(webp_size(bodies.pop()), (640, 480))
        self.assertEqual(self.renders(srv, "ok") - renders0, 1)
        self.assertGreater(srv.metric("atrium_media_render_coalesced_total") - coalesced0, 0,
                           "some requests waited for the render already under way")

    def test_a_render_not_done_in_time_gives_503_or_the_nearest_existing_size(self):
        srv = media_server(self, media={"render_wait_ms": 0, "render_threads": 1})
        _, token = register(srv)
        media_id = upload(srv, token, noise_png(3000, 2000), "image/png", timeout=60)
        # Nothing rendered yet and no waiting allowed: retry-friendly 503, never the original.
        response = self.thumb(srv, token, media_id, 800, 600)
        self.assert_error(response, 503, "M_UNKNOWN")
        self.assertEqual(response[1].get("Retry-After"), "1")
        wait_until(lambda: srv.metric("atrium_media_renders_total", {"result": "ok"}) == 1,
                   timeout=30, what="the render finished meanwhile")
        status, _, body = self.thumb(srv, token, media_id, 800, 600)
        self.assertEqual((status, webp_size(body)), (200, (800, 533)))
        # Another size, not rendered yet: the nearest one that exists.
        status, _, body = self.thumb(srv, token, media_id, 320, 240)
        self.assertEqual((status, webp_size(body)), (200, (800, 533)))
        self.assertEqual(srv.metric("atrium_media_thumbnail_fallback_total", {"kind": "nearest"}), 1)
        self.assertEqual(srv.metric("atrium_media_thumbnail_fallback_total", {"kind": "unavailable"}), 1)


if __name__ == "__main__":
    unittest.main()
