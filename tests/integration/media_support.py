"""Shared set-up for the media tests: a server with the media plugin storing under its own
temporary folder, users and tokens, uploads, test images and WebP checks.

Images: PNG is written here (zlib); JPEG comes from libvips' `vips` command (Debian
package libvips-tools, installed by tests/lib/deps.sh), with an EXIF orientation segment
spliced in here when a test needs one. WebP answers are checked from their RIFF header
here and decoded fully by `vips` where a test needs pixels.
"""

import hashlib
import http.client
import json
import os
import shutil
import struct
import subprocess
import tempfile
import time
import unittest
import uuid
import zlib

from common import make_admin, module_server
from harness import Server, deep_merge, raw_connect

PASSWORD = "correct horse battery staple"


def media_server(case, media=None, settings=None, shared=False, **kwargs):
    """Starts a server (AtriumTestCase.start_server) with registration open and the media
    plugin storing in <server dir>/media_store; `media` adds plugins.media settings.
    shared=True: the one server of the test's class (AtriumTestCase.start_class_server),
    for tests that use their own users and media and count nothing from zero.
    shared="module": the one server on these settings of the test's module, for such tests
    in several classes (module_server)."""
    def build(tmp):
        conf = {"enabled": True, "store_path": os.path.join(tmp, "media_store")}
        conf.update(media or {})
        out = {"registration": {"enabled": True}, "plugins": {"media": conf}}
        return deep_merge(out, settings or {})
    if shared == "module":
        key = (type(case).__module__, repr(media), repr(settings), repr(sorted(kwargs.items())))
        srv = module_server(case, key, lambda: Server(start=False, settings=build, **kwargs))
    else:
        start = case.start_class_server if shared else case.start_server
        srv = start(settings=build, **kwargs)
    srv.store = os.path.join(srv.dir, "media_store")
    return srv


def register(srv, name=None, admin=False):
    """A new user through /register (m.login.dummy); returns (user_id, access_token)."""
    name = name or f"u{uuid.uuid4().hex[:10]}"
    body = {"username": name, "password": PASSWORD}
    status, first = srv.json("POST", "/_matrix/client/v3/register", body, timeout=30)
    if status != 401:
        raise AssertionError(f"/register without auth answered {status}: {first}")
    body["auth"] = {"type": "m.login.dummy", "session": first.get("session")}
    status, done = srv.json("POST", "/_matrix/client/v3/register", body, timeout=30)
    if status != 200:
        raise AssertionError(f"/register answered {status}: {done}")
    if admin:
        make_admin(srv, done["user_id"])
    return done["user_id"], done["access_token"]


def logout(srv, token):
    status, body = srv.json("POST", "/_matrix/client/v3/logout", {}, token=token)
    if status != 200:
        raise AssertionError(f"/logout answered {status}: {body}")


def upload(srv, token, data, content_type="application/octet-stream", filename=None, timeout=30):
    """POST /_matrix/media/v3/upload; returns the media ID (asserts 200)."""
    path = "/_matrix/media/v3/upload"
    if filename is not None:
        from urllib.parse import quote
        path += "?filename=" + quote(filename, safe="")
    status, headers, body = srv.request("POST", path, body=data, token=token, timeout=timeout,
                                        headers={"Content-Type": content_type})
    if status != 200:
        raise AssertionError(f"upload answered {status}: {body[:300]!r}")
    uri = json.loads(body)["content_uri"]
    prefix = f"mxc://{srv.server_name}/"
    assert uri.startswith(prefix), uri
    return uri[len(prefix):]


def download_path(srv, media_id, file_name=None):
    path = f"/_matrix/client/v1/media/download/{srv.server_name}/{media_id}"
    return path + "/" + file_name if file_name else path


def thumbnail_path(srv, media_id, width, height, method="scale", extra=""):
    return (f"/_matrix/client/v1/media/thumbnail/{srv.server_name}/{media_id}"
            f"?width={width}&height={height}&method={method}{extra}")


def original_file(srv, media_id):
    return os.path.join(srv.store, "local", media_id[0:2], media_id[2:4], media_id)


def store_files(srv):
    """Every file under the store, as paths relative to it."""
    out = []
    for root, _, files in os.walk(srv.store):
        for f in files:
            out.append(os.path.relpath(os.path.join(root, f), srv.store))
    return sorted(out)


def sha256(data):
    return hashlib.sha256(data).hexdigest()


# ---- images ------------------------------------------------------------------------------

def _chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(width, height, pixel=None, alpha=False, level=6, raw_rows=None):
    """A PNG; pixel(x, y) -> (r, g, b[, a]) (default: a gradient). raw_rows: bytes of the
    filtered scanlines, for large noise images (pixel is then ignored)."""
    channels = 4 if alpha else 3
    if raw_rows is None and pixel is None:
        raw_rows = _gradient_rows(width, height, channels)
    if raw_rows is None:
        rows = bytearray()
        for y in range(height):
            rows.append(0)
            for x in range(width):
                rows.extend(pixel(x, y)[:channels])
        raw_rows = bytes(rows)
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 6 if alpha else 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) +
            _chunk(b"IDAT", zlib.compress(raw_rows, level)) + _chunk(b"IEND", b""))


def _gradient_rows(width, height, channels):
    """png's default picture, filtered scanlines: red grows along x, green along y, blue
    128, alpha 255 (written a channel at a time: a call per pixel cost 0.4 s of CPU for a
    1000x800 image)."""
    row = bytearray(width * channels)
    row[0::channels] = bytes(x * 255 // max(width - 1, 1) for x in range(width))
    row[2::channels] = b"\x80" * width
    if channels == 4:
        row[3::channels] = b"\xff" * width
    rows = bytearray()
    for y in range(height):
        row[1::channels] = bytes([y * 255 // max(height - 1, 1)]) * width
        rows.append(0)
        rows.extend(row)
    return bytes(rows)


def solid_png(width, height, index):
    """A PNG of one colour picked by index (distinct bytes for distinct indexes), quickly."""
    colour = bytes([(index * 37) % 256, (index * 91 + 13) % 256, (index // 7 * 53 + 101) % 256])
    return png(width, height, raw_rows=(b"\x00" + colour * width) * height)


def noise_png(width, height, seed=0):
    """A PNG of random pixels (incompressible: its size is about width*height*3 bytes)."""
    rng = hashlib.sha256(str(seed).encode()).digest()
    rows = bytearray()
    row_len = width * 3
    block = b""
    counter = 0
    for _ in range(height):
        while len(block) < row_len:
            block += hashlib.sha256(rng + counter.to_bytes(8, "big")).digest() * 16
            counter += 1
        rows.append(0)
        rows.extend(block[:row_len])
        block = block[row_len:]
    return png(width, height, raw_rows=bytes(rows), level=0)


def png_claiming(width, height):
    """A PNG whose header claims width x height but whose data is a few bytes."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) +
            _chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + _chunk(b"IEND", b""))


def vips_bin():
    path = shutil.which("vips")
    if not path:
        raise AssertionError("the `vips` command is missing: install libvips-tools (tests/lib/deps.sh)")
    return path


def jpeg_from_png(png_bytes, quality=90):
    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "in.png"), os.path.join(d, "out.jpg")
        with open(src, "wb") as f:
            f.write(png_bytes)
        subprocess.run([vips_bin(), "copy", src, f"{dst}[Q={quality},strip]"], check=True,
                       capture_output=True, timeout=60)
        with open(dst, "rb") as f:
            return f.read()


def animated_gif(width, height, colours):
    """An animated GIF: one frame of each (r, g, b) colour, through libvips' gifsave."""
    with tempfile.TemporaryDirectory() as d:
        strip = None
        for i, colour in enumerate(colours):
            frame = os.path.join(d, f"f{i}.png")
            with open(frame, "wb") as f:
                f.write(png(width, height, raw_rows=(b"\x00" + bytes(colour) * width) * height))
            if strip is None:
                strip = frame
            else:
                joined = os.path.join(d, f"s{i}.v")
                subprocess.run([vips_bin(), "join", strip, frame, joined, "vertical"], check=True,
                               capture_output=True, timeout=60)
                strip = joined
        out = os.path.join(d, "anim.gif")
        subprocess.run([vips_bin(), "copy", strip, f"{out}[page_height={height}]"], check=True,
                       capture_output=True, timeout=60)
        with open(out, "rb") as f:
            return f.read()


def webp_frames(data):
    """How many frames a WebP holds (ANMF chunks; 1 for a still)."""
    if data[12:16] != b"VP8X":
        return 1
    count, pos = 0, 12
    while pos + 8 <= len(data):
        kind, size = data[pos:pos + 4], struct.unpack("<I", data[pos + 4:pos + 8])[0]
        if kind == b"ANMF":
            count += 1
        pos += 8 + size + (size & 1)
    return max(count, 1)


def with_exif_orientation(jpeg, orientation):
    """The JPEG with an APP1 Exif segment holding only the Orientation tag, after SOI."""
    assert jpeg[:2] == b"\xff\xd8", "not a JPEG"
    # TIFF header (big-endian), one IFD with one entry: tag 0x0112 SHORT count 1.
    tiff = b"MM\x00\x2a" + struct.pack(">I", 8) + struct.pack(">H", 1) + \
        struct.pack(">HHIHH", 0x0112, 3, 1, orientation, 0) + struct.pack(">I", 0)
    payload = b"Exif\x00\x00" + tiff
    app1 = b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload
    return jpeg[:2] + app1 + jpeg[2:]


def webp_size(data):
    """(width, height) from a WebP's header; raises AssertionError when it is not a
    complete WebP file (RIFF size must match the bytes)."""
    if len(data) < 30 or data[:4] != b"RIFF" or data[8:12] != b"WEBP":
        raise AssertionError(f"not a WebP: {data[:16]!r}")
    riff_size = struct.unpack("<I", data[4:8])[0]
    if riff_size + 8 != len(data):
        raise AssertionError(f"torn WebP: RIFF says {riff_size + 8} bytes, file has {len(data)}")
    kind = data[12:16]
    if kind == b"VP8 ":
        w, h = struct.unpack("<HH", data[26:30])
        return w & 0x3FFF, h & 0x3FFF
    if kind == b"VP8L":
        bits = struct.unpack("<I", data[21:25])[0]
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if kind == b"VP8X":
        w = int.from_bytes(data[24:27], "little") + 1
        h = int.from_bytes(data[27:30], "little") + 1
        return w, h
    raise AssertionError(f"unknown WebP chunk {kind!r}")


def vips_decode(data, points=(), suffix=".webp"):
    """Decodes the image fully with libvips; returns (width, height, {(x, y): bands}).

    One `vips copy` to libvips' own format (a 64-byte header, then the pixels
    uncompressed) decodes every pixel, and the header and the pixels are read here: one
    process, where asking the size and each point separately started one per question."""
    with tempfile.TemporaryDirectory() as d:
        path, raw = os.path.join(d, "img" + suffix), os.path.join(d, "img.v")
        with open(path, "wb") as f:
            f.write(data)
        out = subprocess.run([vips_bin(), "copy", path, raw], capture_output=True, text=True,
                             timeout=60)
        if out.returncode != 0:
            raise AssertionError(f"libvips cannot decode it: {out.stderr.strip()}")
        with open(raw, "rb") as f:
            pixels = f.read()
    magic = pixels[:4]
    if magic not in (b"\xb6\xa6\xf2\x08", b"\x08\xf2\xa6\xb6"):
        raise AssertionError(f"not a libvips image: {magic!r}")
    order = "<" if magic == b"\xb6\xa6\xf2\x08" else ">"
    width, height, bands, _bits, band_format = struct.unpack(order + "5i", pixels[4:24])
    if band_format != 0:  # VIPS_FORMAT_UCHAR: every format the server writes
        raise AssertionError(f"unexpected band format {band_format}")
    values = {}
    for x, y in points:
        at = 64 + (y * width + x) * bands
        values[(x, y)] = tuple(float(v) for v in pixels[at:at + bands])
    return width, height, values


def raw_get(srv, path, token=None, headers=None, rcvbuf=None):
    """A GET on a raw socket: returns the connected socket after sending the request."""
    sock = raw_connect(srv.port, rcvbuf=rcvbuf, timeout=30)
    lines = [f"GET {path} HTTP/1.1", "Host: x"]
    if token:
        lines.append(f"Authorization: Bearer {token}")
    for k, v in (headers or {}).items():
        lines.append(f"{k}: {v}")
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    return sock


def get_many(srv, paths, token, concurrency, timeout=60, busy=None):
    """GETs every path with `concurrency` client threads (a fresh connection each);
    returns [(status, headers, body)] in order.

    busy: a list to act as a client that honours "the server is busy": a 503 with a
    Retry-After header is appended there as (status, headers, body) and the request is
    sent again after Retry-After seconds (with jitter, so refused clients do not return
    all at once); None: a 503 is a result like any other."""
    import random
    import threading
    results = [None] * len(paths)
    next_index = [0]
    lock = threading.Lock()

    def get(path):
        while True:
            out = srv.request("GET", path, token=token, timeout=timeout)
            if busy is None or out[0] != 503 or out[1].get("Retry-After") is None:
                return out
            with lock:
                busy.append(out)
            time.sleep(float(out[1]["Retry-After"]) * random.uniform(0.5, 1.5))

    def worker():
        while True:
            with lock:
                i = next_index[0]
                next_index[0] += 1
            if i >= len(paths):
                return
            try:
                results[i] = get(paths[i])
            except (OSError, http.client.HTTPException) as e:
                results[i] = (None, None, repr(e).encode())
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 30)
    return results
