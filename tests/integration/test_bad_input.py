"""Bad input at the socket: framing a client gets wrong, bodies that will be refused, values
that are not text, numbers past int64 - each answered at once with a Matrix JSON error and
the right status, the body not read to its end, and the server still serving.

The cases are tables: every row is sent on a raw socket (so nothing in between repairs
it), its answer read with a deadline, and then /health must answer."""

import json
import socket
import ssl
import time
import unittest

from accounts import REGISTRATION_ON, register
from common import wait_until, with_testplug
from harness import Server, raw_connect
from test_federation import A_IP, FederationTestCase

PROMPT_S = 2.0  # "at once": well under any timeout the server has
ROOM = "%21room%3Alocalhost"  # a room ID that need not exist: the request is refused before


def read_answer(sock, deadline_s=PROMPT_S * 2):
    """(status, headers dict lower-cased, body bytes, seconds taken) of one response, read
    until its Content-Length or the end of the connection."""
    start = time.monotonic()
    sock.settimeout(deadline_s)
    data = b""
    while b"\r\n\r\n" not in data:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, socket.timeout) as e:
            raise AssertionError(f"no complete answer ({e!r}) after {data[:200]!r}") from None
        if not chunk:
            raise AssertionError(f"connection closed before an answer: {data[:200]!r}")
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    want = int(headers.get("content-length", "-1"))
    while want >= 0 and len(body) < want:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, socket.timeout):
            break
        if not chunk:
            break
        body += chunk
    return status, headers, body, time.monotonic() - start


HEAD = b"POST /_test/echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
GOOD_REQUEST = b"GET /_matrix/client/versions HTTP/1.1\r\nHost: x\r\n\r\n"
FED_GOOD_REQUEST = b"GET /_matrix/federation/v1/version HTTP/1.1\r\nHost: x\r\n\r\n"

# (what, bytes, status): framing a client can get wrong in a request head.
FRAMING_CASES = [
    ("Content-Length of 2^63", HEAD + b"Content-Length: 9223372036854775808\r\n\r\n{}", 413),
    ("Content-Length of 2^64-1", HEAD + b"Content-Length: 18446744073709551615\r\n\r\n", 413),
    # RFC 9112 6.3: chunked not the final coding is 400; an unknown coding before
    # chunked is one this server does not implement, 501.
    ("Transfer-Encoding: gzip", HEAD + b"Transfer-Encoding: gzip\r\n\r\nabc", 400),
    ("Transfer-Encoding: chunked, identity",
     HEAD + b"Transfer-Encoding: chunked, identity\r\n\r\n5\r\nhello\r\n", 400),
    ("Transfer-Encoding: gzip, chunked",
     HEAD + b"Transfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n", 501),
    ("Transfer-Encoding: chunked twice, over two lines",
     HEAD + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    ("Content-Length: abc", HEAD + b"Content-Length: abc\r\n\r\n{}", 400),
    ("Content-Length: -1", HEAD + b"Content-Length: -1\r\n\r\n{}", 400),
    ("Content-Length: +2", HEAD + b"Content-Length: +2\r\n\r\n{}", 400),
    ("two Content-Lengths that disagree",
     HEAD + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}", 400),
    ("Content-Length and Transfer-Encoding",
     HEAD + b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n{}", 400),
    ("Content-Length of 30 digits", HEAD + b"Content-Length: " + b"9" * 30 + b"\r\n\r\n", 413),
    ("HTTP/2.0", b"GET /_matrix/client/versions HTTP/2.0\r\nHost: x\r\n\r\n", 505),
    ("HTTP/1.1 with garbage", b"GET /_matrix/client/versions HTTP/1.1x\r\nHost: x\r\n\r\n", 400),
    ("no version", b"GET /_matrix/client/versions\r\nHost: x\r\n\r\n", 400),
    ("a header without a colon", b"GET /health HTTP/1.1\r\nHost x\r\n\r\n", 400),
    ("headers past 16 KiB", b"GET /health HTTP/1.1\r\nX-Big: " + b"a" * 40000 + b"\r\n\r\n", 431),
    ("200 header lines",
     b"GET /health HTTP/1.1\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(200)) + b"\r\n", 431),
    ("300 query parameters",
     b"GET /_matrix/client/versions?" + b"&".join(b"p%d" % i for i in range(300)) +
     b" HTTP/1.1\r\nHost: x\r\n\r\n", 400),
]

# Only the gate sees the raw head: libmicrohttpd accepts an obsolete folded header line
# (RFC 9112 5.2 lets a server join it to the line before), so on later requests of a
# connection and on the federation listener it is served.
FIRST_REQUEST_CASES = [
    ("a folded header line", b"GET /health HTTP/1.1\r\nHost: x\r\n  folded\r\n\r\n", 400),
]



def body_framing_cases(request_line, extension_kib):
    """(what, bytes, status): framing a client can get wrong in a chunked body, which only
    libmicrohttpd reads, sent to request_line (a route that reads its body). A chunk
    extension is refused when its line does not fit the connection's buffer (skipped, as
    RFC 9112 7.1.1 allows, when it does: over TLS libmicrohttpd reads a record of at most
    16 KiB at a time and 10 KiB fit, so the federation listener's case is longer)."""
    chunked = request_line + b"\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    return [
        (f"a chunk extension of {extension_kib} KiB",
         chunked + b"5;ext=" + b"e" * (extension_kib * 1024) + b"\r\nhello\r\n0\r\n\r\n", 400),
        ("a chunk size that is not hexadecimal", chunked + b"zz\r\nhello\r\n0\r\n\r\n", 400),
        ("a chunk size past 2^64", chunked + b"1" + b"0" * 20 + b"\r\nhello\r\n", 413),
        ("a chunk without its CR LF", chunked + b"5\r\nhelloXX0\r\n\r\n", 400),
    ]


BODY_FRAMING_CASES = body_framing_cases(b"POST /_test/echo HTTP/1.1", 10)
FED_BODY_FRAMING_CASES = body_framing_cases(b"PUT /_matrix/federation/v1/send/t1 HTTP/1.1", 64)


def check_matrix_error(tc, answer, status, what, errcode=None):
    """The answer (as read_answer returns it) is a Matrix JSON error with that status,
    given within PROMPT_S."""
    got_status, headers, body, took = answer
    tc.assertEqual(got_status, status, f"{what}: {body[:300]!r}")
    tc.assertIn("application/json", headers.get("content-type", ""), f"{what}: {body[:300]!r}")
    try:
        err = json.loads(body)
    except ValueError:
        tc.fail(f"{what}: answer is not JSON: {body[:300]!r}")
    tc.assertRegex(err.get("errcode", ""), r"^M_[A-Z_]+$", what)
    if errcode:
        tc.assertEqual(err["errcode"], errcode, what)
    tc.assertLess(took, PROMPT_S, f"{what}: answered after {took:.2f}s")


class BadInputTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = Server(settings=REGISTRATION_ON, plugins=with_testplug())
        cls.srv.__enter__()
        try:
            cls.token = register(cls.srv, "mallory").token
        except BaseException:
            cls.srv.__exit__(None, None, None)
            raise

    @classmethod
    def tearDownClass(cls):
        cls.srv.__exit__(None, None, None)

    def send_raw(self, data, then=None):
        """Sends data on a new connection (then calls then(sock), if given) and returns the
        answer as read_answer does."""
        sock = raw_connect(self.srv.port)
        try:
            sock.sendall(data)
            if then:
                then(sock)
            return read_answer(sock)
        finally:
            sock.close()

    def assert_matrix_error(self, answer, status, what, errcode=None):
        check_matrix_error(self, answer, status, what, errcode)
        self.assert_alive(what)

    def assert_alive(self, what):
        status, _ = self.srv.json("GET", "/health", timeout=5)
        self.assertEqual(status, 200, f"server not healthy after {what}")

    # -- framing -----------------------------------------------------------------------

    def test_framing_errors_get_matrix_errors_at_once(self):
        for what, data, status in FRAMING_CASES + BODY_FRAMING_CASES + FIRST_REQUEST_CASES:
            with self.subTest(what):
                self.assert_matrix_error(self.send_raw(data), status, what)

    def test_framing_errors_after_the_first_request_of_a_kept_alive_connection_too(self):
        # Only the first request of a connection passes the gate; the later ones are
        # judged by the same rules after libmicrohttpd parsed them, and what it refuses
        # itself is still a Matrix error (core/http/mhd_answers.c).
        for what, data, status in FRAMING_CASES + BODY_FRAMING_CASES:
            with self.subTest(what):
                self.assert_matrix_error(self.send_kept_alive(data), status, what)

    def send_kept_alive(self, data, port=None, wrap=None):
        """Sends a good request, reads its 200, then sends data on the same connection and
        returns its answer as read_answer does."""
        sock = raw_connect(port or self.srv.port)
        if wrap:
            sock = wrap(sock)
        try:
            sock.sendall(GOOD_REQUEST)
            status, _, body, _ = read_answer(sock)
            self.assertEqual(status, 200, body[:200])
            sock.sendall(data)
            return read_answer(sock)
        finally:
            sock.close()

    def test_thousands_of_query_parameters_are_answered(self):
        query = "&".join(f"p{i}=v" for i in range(5000))
        answer = self.send_raw(f"GET /_matrix/client/versions?{query} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        self.assert_matrix_error(answer, 414, "5000 query parameters (a 40 KB request line)")
        query = "&".join(f"p{i}" for i in range(2000))  # an 11 KB request line
        answer = self.send_raw(f"GET /_matrix/client/versions?{query} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        self.assert_matrix_error(answer, 400, "2000 query parameters", "M_INVALID_PARAM")
        query = "&".join(f"p{i}=v" for i in range(200))  # many, but within the limit
        status, _, _, took = self.send_raw(f"GET /_matrix/client/versions?{query} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        self.assertEqual(status, 200)
        # On a later request of a kept-alive connection libmicrohttpd parses the request
        # line itself: one longer than the connection's memory for its head is answered
        # 414 as the gate does, and one that fits with thousands of parameters fills that
        # memory as they are parsed, which it reports as headers too large (431; it used
        # to hang there; core/http/mhd_answers.c). A few hundred fit, and the gate's
        # limit refuses them (400, in FRAMING_CASES).
        for n, fmt, status in ((5000, "p{}=v", 414), (2000, "p{}", 431)):
            query = "&".join(fmt.format(i) for i in range(n))
            answer = self.send_kept_alive(f"GET /_matrix/client/versions?{query} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            self.assert_matrix_error(answer, status, f"{n} query parameters on a later request")

    def test_a_head_at_the_limit_is_served_and_one_byte_more_is_431(self):
        # 16 KiB of head (core/http/http.h, HTTP_MAX_HEAD_BYTES), counted from the request
        # line to the blank line. libmicrohttpd's memory per connection is sized to hold
        # it (server.c), on a kept-alive connection's later requests too.
        def head(total):  # the most header lines the limit allows, one of them long
            start = (b"GET /_matrix/client/versions HTTP/1.1\r\nHost: x\r\n" +
                     b"".join(b"X-%d: v\r\n" % i for i in range(97)) + b"X-Big: ")
            return start + b"a" * (total - len(start) - 4) + b"\r\n\r\n"
        limit = 16 * 1024
        self.assertEqual(len(head(limit)), limit)
        status, _, body, _ = self.send_raw(head(limit))
        self.assertEqual(status, 200, body[:200])
        self.assert_matrix_error(self.send_raw(head(limit + 1)), 431, "one byte past the limit")
        status, _, body, _ = self.send_kept_alive(head(limit))
        self.assertEqual(status, 200, body[:200])
        self.assert_matrix_error(self.send_kept_alive(head(limit + 1024)), 431,
                                 "past the limit on a later request")

    def test_keep_alive_requests_after_the_first_are_still_served(self):
        sock = raw_connect(self.srv.port)
        try:
            for _ in range(3):
                sock.sendall(b"GET /_matrix/client/versions HTTP/1.1\r\nHost: x\r\n\r\n")
                status, headers, body, _ = read_answer(sock)
                self.assertEqual(status, 200)
        finally:
            sock.close()

    # -- refusals known before the body ---------------------------------------------------

    def test_unknown_paths_and_wrong_methods_do_not_wait_for_a_huge_body(self):
        cases = [
            ("unknown path", b"POST /_matrix/client/v3/nothing/here", 404),
            ("wrong method", b"PUT /_matrix/client/versions", 405),
            ("not UTF-8 in a path parameter",
             b"PUT /_matrix/client/v3/rooms/" + ROOM.encode() + b"/send/m.room.message/%FF", 400),
        ]
        for what, line, status in cases:
            with self.subTest(what):
                data = (line + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000000\r\n"
                        b"Content-Type: application/json\r\n\r\n{")
                self.assert_matrix_error(self.send_raw(data), status, what)

    def test_a_chunked_json_body_past_the_limit_is_refused_without_reading_the_rest(self):
        mib = b"x" * (1024 * 1024)
        sent = {"bytes": 0}

        def keep_sending(sock):
            # Up to 64 MiB more: the answer must come long before that, and the server
            # closes the connection instead of reading on.
            try:
                for _ in range(64):
                    sock.sendall(b"%x\r\n" % len(mib) + mib + b"\r\n")
                    sent["bytes"] += len(mib)
            except OSError:
                pass

        data = (b"POST /_matrix/client/v3/user/%40mallory%3Alocalhost/filter HTTP/1.1\r\nHost: x\r\n"
                b"Authorization: Bearer " + self.token.encode() + b"\r\n"
                b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        answer = self.send_raw(data, keep_sending)
        self.assert_matrix_error(answer, 413, "chunked JSON past 1 MiB", "M_TOO_LARGE")
        self.assertLess(sent["bytes"], 64 * len(mib), "the server read the whole body")

    def test_a_chunked_upload_without_or_with_a_bad_token_is_refused_at_once(self):
        for what, auth, status in (("no token", b"", 401), ("bad token", b"Authorization: Bearer nope\r\n", 401)):
            with self.subTest(what):
                sent = {"bytes": 0}
                chunk = b"y" * (256 * 1024)

                def keep_sending(sock):
                    try:
                        for _ in range(256):  # 64 MiB at most
                            sock.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
                            sent["bytes"] += len(chunk)
                    except OSError:
                        pass

                data = (b"POST /_matrix/media/v3/upload HTTP/1.1\r\nHost: x\r\n" + auth +
                        b"Content-Type: image/png\r\nTransfer-Encoding: chunked\r\n\r\n")
                self.assert_matrix_error(self.send_raw(data, keep_sending), status, what)
                self.assertLess(sent["bytes"], 256 * len(chunk), f"{what}: the whole body was read")

    # -- values that are not text, numbers past int64 ----------------------------------------

    def test_path_and_query_values_that_are_not_utf8_are_400_on_every_route_family(self):
        bad = "%FF"
        cases = [
            ("PUT", f"/_matrix/client/v3/rooms/{ROOM}/send/m.room.message/{bad}", {"body": "x"}),
            ("PUT", f"/_matrix/client/v3/rooms/{ROOM}/state/m.room.topic/{bad}", {"topic": "x"}),
            ("GET", f"/_matrix/client/v3/rooms/{bad}/state", None),
            ("GET", f"/_matrix/client/v3/profile/%40a%3Alocalhost{bad}", None),
            ("PUT", f"/_matrix/client/v3/profile/%40mallory%3Alocalhost/displayname{bad}x", None),
            ("GET", f"/_matrix/client/v3/rooms/{ROOM}/messages?from={bad}", None),
            ("PUT", f"/_matrix/client/v3/sendToDevice/m.test/{bad}", {"messages": {}}),
            ("PUT", f"/_matrix/client/v3/user/%40mallory%3Alocalhost/account_data/{bad}", {}),
            ("POST", f"/_matrix/client/v3/rooms/{ROOM}/receipt/m.read/{bad}", {}),
            ("GET", f"/_matrix/client/v3/rooms/{ROOM}/context/{bad}", None),
            ("GET", f"/_matrix/client/v3/sync?since={bad}", None),
            ("GET", f"/_matrix/client/v3/directory/room/%23a{bad}%3Alocalhost", None),
            ("GET", f"/_matrix/client/v1/media/download/localhost/{bad}", None),
        ]
        for method, path, body in cases:
            with self.subTest(f"{method} {path}"):
                data = json.dumps(body).encode() if body is not None else b""
                req = (f"{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {self.token}\r\n"
                       f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n").encode() + data
                answer = self.send_raw(req)
                if answer[0] == 404 and "displayname" in path:
                    # a literal segment that is not text matches no route: 404 is the answer
                    self.assert_matrix_error(answer, 404, path)
                    continue
                self.assert_matrix_error(answer, 400, path, "M_INVALID_PARAM")

    def test_numbers_past_int64_are_400_never_a_database_error(self):
        huge = "99999999999999999999"
        cases = [
            f"/_matrix/client/v3/sync?filter={huge}",
            f"/_matrix/client/v3/sync?timeout={huge}x",
            f"/_matrix/client/v3/sync?since=s{huge}",
            f"/_matrix/client/v3/rooms/{ROOM}/messages?dir=b&limit=1x",
            f"/_matrix/client/v3/room_keys/version/{huge}",
            f"/_matrix/client/v3/publicRooms?limit=-1",
            f"/_matrix/client/v1/media/thumbnail/localhost/abc?width={huge}&height=1",
        ]
        for path in cases:
            with self.subTest(path):
                status, body = self.srv.json("GET", path, token=self.token)
                self.assertIn(status, (400, 404), f"{path}: {status} {body}")
                self.assertIn(body["errcode"], ("M_INVALID_PARAM", "M_NOT_FOUND", "M_BAD_JSON",
                                                "M_UNKNOWN"), path)
        status, body = self.srv.json("GET", f"/_matrix/client/v3/sync?filter={huge}", token=self.token)
        self.assertEqual((status, body["errcode"]), (400, "M_INVALID_PARAM"))
        self.assert_alive("numbers past int64")

    def test_a_filter_with_a_limit_that_is_not_a_number_is_refused_when_stored(self):
        path = "/_matrix/client/v3/user/%40mallory%3Alocalhost/filter"
        status, body = self.srv.json("POST", path, {"room": {"timeline": {"limit": "x"}}},
                                     token=self.token)
        self.assertEqual((status, body["errcode"]), (400, "M_BAD_JSON"), body)
        status, body = self.srv.json("POST", path, {"room": {"timeline": {"limit": 5}}},
                                     token=self.token)
        self.assertEqual(status, 200, body)

    # -- malformed bodies to every route family ----------------------------------------------

    def test_malformed_json_bodies_are_400_on_every_route_family(self):
        posts = [
            ("POST", "/_matrix/client/v3/login"),
            ("POST", "/_matrix/client/v3/register"),
            ("POST", "/_matrix/client/v3/createRoom"),
            ("PUT", f"/_matrix/client/v3/rooms/{ROOM}/send/m.room.message/t1"),
            ("PUT", f"/_matrix/client/v3/rooms/{ROOM}/state/m.room.topic/"),
            ("POST", "/_matrix/client/v3/user/%40mallory%3Alocalhost/filter"),
            ("PUT", "/_matrix/client/v3/user/%40mallory%3Alocalhost/account_data/m.x"),
            ("PUT", "/_matrix/client/v3/profile/%40mallory%3Alocalhost/displayname"),
            ("PUT", "/_matrix/client/v3/sendToDevice/m.test/t1"),
            ("POST", "/_matrix/client/v3/keys/upload"),
            ("POST", "/_matrix/client/v3/keys/query"),
            ("POST", "/_matrix/client/v3/search"),
            ("POST", "/_matrix/client/v3/publicRooms"),
            ("POST", "/_matrix/client/v3/user_directory/search"),
        ]
        bodies = [b"{not json", b"[1,2,3]", b"\"a string\"", b"{\"a\": \"\xff\xfe\"}", b"{\"a\":" * 5000]
        for method, path in posts:
            for body in bodies:
                with self.subTest(f"{method} {path} {body[:12]!r}"):
                    req = (f"{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {self.token}\r\n"
                           f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
                    status, headers, data, took = self.send_raw(req)
                    self.assertGreaterEqual(status, 400, f"{path}: {data[:200]!r}")
                    self.assertLess(status, 500, f"{path}: {data[:200]!r}")
                    self.assertIn(json.loads(data)["errcode"], ("M_NOT_JSON", "M_BAD_JSON", "M_FORBIDDEN",
                                                                "M_MISSING_PARAM", "M_INVALID_PARAM",
                                                                "M_UNKNOWN", "M_TOO_LARGE"), path)
                    self.assertLess(took, PROMPT_S)
        self.assert_alive("malformed bodies")


class FederationListenerBadInputTest(FederationTestCase):
    """The federation listener has no gate and speaks TLS: its framing answers come from
    the same rules after libmicrohttpd parsed the head (server.c) and, for what it refuses
    itself, through its TLS session (core/http/mhd_answers.c)."""

    def test_framing_errors_on_the_federation_listener_get_matrix_errors_at_once(self):
        srv = self.start_fed(A_IP)
        ctx = self.ca.client_context()

        def connect():
            return ctx.wrap_socket(raw_connect(srv.fed_port, host=srv.fed_ip))

        def send_all(sock, data):
            # The server answers a refusal as soon as it sees it and stops reading: the
            # rest of a long request may meet a closed connection. The answer was sent
            # before the close and is still read.
            try:
                sock.sendall(data)
            except (ssl.SSLError, OSError):
                pass

        def first(data):
            sock = connect()
            try:
                send_all(sock, data)
                return read_answer(sock)
            finally:
                sock.close()

        def later(data):
            sock = connect()
            try:
                sock.sendall(FED_GOOD_REQUEST)
                status, _, body, _ = read_answer(sock)
                self.assertEqual(status, 200, body[:200])
                send_all(sock, data)
                return read_answer(sock)
            finally:
                sock.close()

        for what, data, status in FRAMING_CASES + FED_BODY_FRAMING_CASES:
            for when, send in (("first", first), ("later", later)):
                with self.subTest(f"{what}, {when} request"):
                    check_matrix_error(self, send(data), status, f"{what}, {when} request")
        # A chunked body past the route's limit (16 MiB), refused mid-body: the answer is
        # written through the TLS session too, and the rest is not read.
        sock = connect()
        sent = 0
        try:
            sock.sendall(b"PUT /_matrix/federation/v1/send/t1 HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
            try:
                for _ in range(64):
                    sock.sendall(b"100000\r\n" + b"x" * 0x100000 + b"\r\n")
                    sent += 1
            except OSError:
                pass
            answer = read_answer(sock)
        finally:
            sock.close()
        check_matrix_error(self, answer, 413, "a chunked body past the limit", "M_TOO_LARGE")
        self.assertLess(sent, 64, "the whole body was read")
        status, _, body = srv.fed_request("GET", "/_matrix/federation/v1/version")
        self.assertEqual(status, 200, body)


class SlowHeadersTest(unittest.TestCase):
    """Slow header senders and a small connection limit: the header deadline closes the
    slow ones, and cheap requests are answered throughout."""

    HEADER_TIMEOUT_MS = 1500
    MAX_CONNECTIONS = 48

    @classmethod
    def setUpClass(cls):
        cls.srv = Server(settings={"server": {"http": {
            "header_timeout_ms": cls.HEADER_TIMEOUT_MS, "max_connections": cls.MAX_CONNECTIONS}}},
            plugins=with_testplug())
        cls.srv.__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.srv.__exit__(None, None, None)

    def timed_health(self):
        start = time.monotonic()
        status, _ = self.srv.json("GET", "/_matrix/client/versions", timeout=5)
        return status, time.monotonic() - start

    def test_a_connection_without_complete_headers_gets_408_at_the_deadline(self):
        sock = raw_connect(self.srv.port)
        try:
            sock.sendall(b"GET /_matrix/client/versions HTTP/1.1\r\nHost: x\r\n")
            start = time.monotonic()
            status, headers, body, _ = read_answer(sock, deadline_s=self.HEADER_TIMEOUT_MS / 1000 + 3)
            waited = time.monotonic() - start
        finally:
            sock.close()
        self.assertEqual(status, 408)
        self.assertEqual(json.loads(body)["errcode"], "M_UNKNOWN")
        self.assertGreater(waited, self.HEADER_TIMEOUT_MS / 1000 * 0.5)
        self.assertLess(waited, self.HEADER_TIMEOUT_MS / 1000 + 2)

    def test_many_slow_header_senders_do_not_keep_cheap_requests_out(self):
        # Three times the connection limit, each sending a header byte now and then.
        slow = []
        try:
            for _ in range(3 * self.MAX_CONNECTIONS):
                try:
                    s = raw_connect(self.srv.port, timeout=5)
                    s.sendall(b"GET /_matrix/client/versions HTTP/1.1\r\nX-Slow: ")
                    slow.append(s)
                except OSError:
                    pass
            worst = 0.0
            for _ in range(10):
                for s in slow:
                    try:
                        s.send(b"a")
                    except OSError:
                        pass
                status, took = self.timed_health()
                self.assertEqual(status, 200)
                worst = max(worst, took)
                time.sleep(0.1)
            self.assertLess(worst, 1.0, f"/versions took {worst:.2f}s among slow senders")
        finally:
            for s in slow:
                s.close()

    def test_parked_waiters_never_take_the_last_connections(self):
        # More requests that park (the test plugin's /_test/park waits for a ring) than
        # there are connections: they take what waiters may have (the 36 served
        # connections of 48 less the reserve of 4), the rest wait in the gate with their
        # headers read, and /versions, /health and whoami still get the reserved
        # connections at once. (Past the gate's room - 12 here - newcomers wait in the
        # kernel's accept queue; see test_chaos.py's gallery.)
        wait_until(lambda: self.srv.metric("atrium_http_connections_awaiting_headers") == 0,
                   what="no connection of an earlier test left in the gate")
        parked = []
        try:
            for _ in range(40):
                s = raw_connect(self.srv.port)
                s.sendall(b"GET /_test/park?timeout_ms=20000 HTTP/1.1\r\nHost: x\r\n\r\n")
                parked.append(s)
            limit = self.srv.metric("atrium_http_max_connections")
            wait_until(lambda: self.srv.metric("atrium_http_parked") >= limit / 2, what="parked")
            time.sleep(0.3)
            self.assertLess(self.srv.metric("atrium_http_parked"), limit, "no reserve kept")
            for path in ("/_matrix/client/versions", "/health", "/_matrix/client/v3/account/whoami"):
                start = time.monotonic()
                status, _ = self.srv.json("GET", path, timeout=5)
                self.assertIn(status, (200, 401), path)
                self.assertLess(time.monotonic() - start, 1.0, path)
            # A request that is not cheap waits for room like the parked ones.
            with self.assertRaises(OSError):
                self.srv.json("POST", "/_test/ring", timeout=1)
        finally:
            for s in parked:
                s.close()


if __name__ == "__main__":
    unittest.main()
