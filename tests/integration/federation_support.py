"""Federation test support: a throwaway CA and certificates, Ed25519 through libsodium
(ctypes, the library Atrium itself links), canonical JSON, X-Matrix signing, two Atrium
servers that federate over loopback TLS, and fake peers for the misbehaviour a real server
would never show: a key server the test controls, a receiver of transactions, a resident
that helps with a join and then hangs, and a server that never answers at all.

Server names are IP literals with a port (127.0.0.2x:PORT): discovery's first step, so no
DNS is involved; every address is on 127.0.0.0/8, which each server whitelists.
"""

import base64
import ctypes
import ctypes.util
import fcntl
import http.client
import http.server
import json
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
import urllib.parse

import harness

_sodium = ctypes.CDLL(ctypes.util.find_library("sodium") or "libsodium.so.23")
_sodium.sodium_init()


def b64(data):
    """Unpadded standard base64, as Matrix writes keys and signatures."""
    return base64.b64encode(data).decode().rstrip("=")


def unb64(text):
    return base64.b64decode(text + "=" * (-len(text) % 4))


def canonical(obj):
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode()


class SigningKey:
    """An Ed25519 key pair with a Matrix key ID."""

    def __init__(self, version="t1", seed=None):
        self.key_id = "ed25519:" + version
        self.seed = seed or os.urandom(32)
        self.pk = ctypes.create_string_buffer(32)
        self.sk = ctypes.create_string_buffer(64)
        _sodium.crypto_sign_seed_keypair(self.pk, self.sk, self.seed)

    @property
    def public_b64(self):
        return b64(self.pk.raw)

    def sign(self, data):
        sig = ctypes.create_string_buffer(64)
        _sodium.crypto_sign_detached(sig, None, data, ctypes.c_ulonglong(len(data)), self.sk)
        return sig.raw


def verify(public_b64, data, sig_b64):
    pk = unb64(public_b64)
    sig = unb64(sig_b64)
    return _sodium.crypto_sign_verify_detached(sig, data, ctypes.c_ulonglong(len(data)), pk) == 0


def sign_json(obj, server_name, key):
    """obj with signatures.<server_name>.<key id> added (signatures/unsigned not signed)."""
    bare = {k: v for k, v in obj.items() if k not in ("signatures", "unsigned")}
    sig = b64(key.sign(canonical(bare)))
    out = dict(obj)
    out.setdefault("signatures", {})
    out["signatures"] = dict(out["signatures"])
    out["signatures"].setdefault(server_name, {})[key.key_id] = sig
    return out


def verify_json(obj, server_name, key_id, public_b64):
    bare = {k: v for k, v in obj.items() if k not in ("signatures", "unsigned")}
    sig = obj.get("signatures", {}).get(server_name, {}).get(key_id)
    return sig is not None and verify(public_b64, canonical(bare), sig)


def xmatrix(method, uri, origin, destination, key, content=None):
    signed = {"method": method, "uri": uri, "origin": origin, "destination": destination}
    if content is not None:
        signed["content"] = content
    sig = b64(key.sign(canonical(signed)))
    return (f'X-Matrix origin="{origin}",destination="{destination}",'
            f'key="{key.key_id}",sig="{sig}"')


def sender_group(destination, groups=16):
    """The federation sender's group of a destination (fed_groups_of in
    core/federation/transport/fed_outbound_groups.c: FNV-1a, 32 bits, of the server name,
    modulo federation.sender_groups); its lease is core.federation.outbound.<group>."""
    h = 2166136261
    for byte in destination.encode():
        h = ((h ^ byte) * 16777619) & 0xFFFFFFFF
    return h % groups


# ---- certificates --------------------------------------------------------------------


# The keys of the CA and of every certificate: ECDSA P-256. An RSA-2048 key took 0.1-0.3 s
# of CPU to make (a run makes about 56), and a handshake with one cost an ASan-built atrium
# about 1.3 ms more of CPU (4.1 ms against 2.8).
EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256")


class TestCA:
    """A CA made for one test run, and certificates with IP SANs signed by it.

    Under tests/run.sh ($ATRIUM_TEST_TMPDIR, emptied at each run) the CA and each
    certificate are made once per run in ATRIUM_TEST_TMPDIR/test-ca/DAY and shared by every
    test process of the tree (openssl's key generation is most of a federation test's
    start-up otherwise); without it each TestCA makes its own. Either way a TestCA hands
    out copies in its own directory: a test may overwrite its files (the certificate
    reload test does) without touching another's."""

    def __init__(self, directory):
        self.dir = directory
        run_dir = os.environ.get("ATRIUM_TEST_TMPDIR")
        # By UTC day as well: certificates last two days, a kept ATRIUM_TEST_TMPDIR longer.
        day = time.strftime("%Y%m%d", time.gmtime())
        self._cache = (os.path.join(run_dir, "test-ca", day) if run_dir
                       else os.path.join(directory, ".made"))
        os.makedirs(self._cache, exist_ok=True)
        with self._locked():
            made_cert = os.path.join(self._cache, "ca.crt")
            made_key = os.path.join(self._cache, "ca.key")
            if not os.path.exists(made_cert):
                self._run("req", "-x509", *EC_KEY, "-nodes", "-days", "2",
                          "-subj", "/CN=Atrium test CA", "-keyout", made_key + ".tmp",
                          "-out", made_cert + ".tmp",
                          "-addext", "basicConstraints=critical,CA:TRUE",
                          "-addext", "keyUsage=critical,keyCertSign")
                os.replace(made_key + ".tmp", made_key)
                os.replace(made_cert + ".tmp", made_cert)
        self._made_key = made_key
        self.cert = self._copy(made_cert, "ca.crt")
        self.key = self._copy(made_key, "ca.key")

    def _locked(self):
        """The cache's lock (flock: test processes of one ctest -j run share the cache)."""
        ca = self

        class Lock:
            def __enter__(self):
                self.f = open(os.path.join(ca._cache, ".lock"), "w")
                fcntl.flock(self.f, fcntl.LOCK_EX)

            def __exit__(self, *exc):
                self.f.close()  # releases the lock
                return False
        return Lock()

    def _copy(self, made, name):
        """made copied to this TestCA's directory as name (written aside, then renamed in)."""
        path = os.path.join(self.dir, name)
        shutil.copy(made, path + ".tmp")  # with its mode: keys stay 0600
        os.replace(path + ".tmp", path)
        return path

    def _run(self, *args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    def issue(self, name, ip=None, dns=None):
        """(cert, key) paths for a server certificate with IP SAN `ip` or DNS SAN `dns`:
        one per (name, SAN) and run, so issuing the same twice gives the same pair."""
        san = f"IP:{ip}" if ip else f"DNS:{dns}"
        made = os.path.join(self._cache, f"{name}--{ip or dns}")
        with self._locked():
            if not os.path.exists(made + ".crt"):
                with open(made + ".ext", "w") as f:
                    f.write(f"subjectAltName={san}\nextendedKeyUsage=serverAuth,clientAuth\n")
                self._run("req", *EC_KEY, "-nodes", "-subj", f"/CN={ip or dns}",
                          "-keyout", made + ".key", "-out", made + ".csr")
                self._run("x509", "-req", "-in", made + ".csr", "-CA",
                          os.path.join(self._cache, "ca.crt"), "-CAkey", self._made_key,
                          "-CAcreateserial", "-days", "2", "-out", made + ".crt.tmp",
                          "-extfile", made + ".ext")
                os.replace(made + ".crt.tmp", made + ".crt")
        return self._copy(made + ".crt", f"{name}.crt"), self._copy(made + ".key", f"{name}.key")

    def client_context(self):
        ctx = ssl.create_default_context(cafile=self.cert)
        ctx.check_hostname = False  # IP literals: the SAN is checked by verify_mode below
        ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx


free_port = harness.free_port


def federation_settings(ca, ip, port, cert, key, extra=None):
    """Settings for a server whose federation listener is ip:port with TLS."""
    settings = {
        "server": {"federation": {"bind_address": ip, "port": port,
                                  "tls_certificate_path": cert,
                                  "tls_private_key_path": key}},
        "federation": {"custom_ca_list": [ca.cert], "ip_range_whitelist": ["127.0.0.0/8"],
                       "client": {"request_timeout_ms": 5000},
                       "destination_min_retry_interval_ms": 500,
                       "destination_max_retry_interval_ms": 2000},
    }
    return harness.deep_merge(settings, extra or {})


class FederatedServer(harness.Server):
    """An Atrium server with a federation listener on its own loopback address. Its server
    name is "ip:port" unless `name` gives another ("{port}" in it becomes the port); its
    certificate is for the IP, or for `cert_name` (a DNS name) when given."""

    def __init__(self, ca, ip, extra=None, name=None, cert_name=None, **kwargs):
        self.fed_ip = ip
        self.fed_port = free_port(ip)
        self.ca = ca
        self.tls_cert, self.tls_key = (ca.issue(f"atrium-{cert_name}", dns=cert_name)
                                       if cert_name else ca.issue(f"atrium-{ip}", ip))
        name = name.format(port=self.fed_port) if name else f"{ip}:{self.fed_port}"
        super().__init__(server_name=name,
                         settings=federation_settings(ca, ip, self.fed_port, self.tls_cert,
                                                      self.tls_key, extra), **kwargs)

    def fed_request(self, method, path, headers=None, body=None, timeout=15):
        """A raw HTTPS request to the federation listener: (status, headers, json or bytes)."""
        conn = http.client.HTTPSConnection(self.fed_ip, self.fed_port, timeout=timeout,
                                           context=self.ca.client_context())
        data = None if body is None else (body if isinstance(body, bytes) else canonical(body))
        hdrs = dict(headers or {})
        if data is not None:
            hdrs.setdefault("Content-Type", "application/json")
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        raw = resp.read()
        conn.close()
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw
        return resp.status, dict(resp.getheaders()), parsed

    def signed_request(self, method, path, origin, key, content=None, destination=None,
                       timeout=15):
        auth = xmatrix(method, path, origin, destination or self.server_name, key, content)
        return self.fed_request(method, path, {"Authorization": auth}, content, timeout)


class FakeKeyServer:
    """A fake peer: serves /_matrix/key/v2/server over TLS for its name and keys, counting
    requests. The test decides what it publishes (valid_until_ts, extra keys), so it can
    lie or expire in ways a real server would not. stop() and start() take it off the
    network and bring it back on the same address (its server name stays). With ca None it
    serves plain HTTP (a push gateway reached over http)."""

    def __init__(self, ca, ip):
        self.ip = ip
        self.port = free_port(ip)
        self.server_name = f"{ip}:{self.port}"
        self.key = SigningKey("fake1")
        self.valid_for_ms = 3600 * 1000
        self.requests = []
        self.cert, self.keyfile = ca.issue(f"fake-{ip}", ip) if ca else (None, None)
        self.httpd = None
        self.start()

    def key_document(self):
        doc = {"server_name": self.server_name,
               "verify_keys": {self.key.key_id: {"key": self.key.public_b64}},
               "old_verify_keys": {},
               "valid_until_ts": int(time.time() * 1000) + self.valid_for_ms}
        return sign_json(doc, self.server_name, self.key)

    @staticmethod
    def reply(handler, status, obj):
        body = canonical(obj)
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def do_get(self, handler):
        if not handler.path.startswith("/_matrix/key/v2/server"):
            handler.send_error(404)
            return
        self.reply(handler, 200, self.key_document())

    def do_put(self, handler):
        handler.send_error(404)

    def do_post(self, handler):
        handler.send_error(404)

    def start(self):
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                outer.requests.append(self.path)
                outer.do_get(self)

            def do_PUT(self):
                outer.requests.append(self.path)
                outer.do_put(self)

            def do_POST(self):
                outer.requests.append(self.path)
                outer.do_post(self)

            def log_message(self, *args):
                pass

        http.server.ThreadingHTTPServer.allow_reuse_address = True
        self.httpd = http.server.ThreadingHTTPServer((self.ip, self.port), Handler)
        self.httpd.daemon_threads = True
        if self.cert:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(self.cert, self.keyfile)
            self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None

    def close(self):
        self.stop()


class FakeReceivingPeer(FakeKeyServer):
    """A fake peer that receives transactions: every PUT /_matrix/federation/v1/send/{txnId}
    is recorded in `transactions` as (txn_id, origin of its X-Matrix header, body), in
    arrival order, and answered 200 with an empty result per PDU (or `status` when the test
    sets it). A replayed transaction ID is recorded again, so a test can tell a retry of the
    same transaction from a second delivery of the same event."""

    SEND = "/_matrix/federation/v1/send/"

    def __init__(self, ca, ip):
        self.transactions = []
        self.status = 200
        self.lock = threading.Lock()
        super().__init__(ca, ip)

    def do_put(self, handler):
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        if not handler.path.startswith(self.SEND):
            handler.send_error(404)
            return
        auth = handler.headers.get("Authorization") or ""
        origin = auth.split('origin="', 1)[1].split('"', 1)[0] if 'origin="' in auth else None
        body = json.loads(raw or b"{}")
        with self.lock:
            self.transactions.append((handler.path[len(self.SEND):], origin, body))
        if self.status != 200:
            self.reply(handler, self.status, {"errcode": "M_UNKNOWN", "error": "test refusal"})
            return
        self.reply(handler, 200, {"pdus": {}})

    def delivered_pdus(self):
        """The PDUs received, first delivery of each transaction ID only, in order."""
        seen, out = set(), []
        with self.lock:
            for txn_id, _, body in self.transactions:
                if txn_id in seen:
                    continue
                seen.add(txn_id)
                out.extend(body.get("pdus", []))
        return out

    def delivered_edus(self):
        seen, out = set(), []
        with self.lock:
            for txn_id, _, body in self.transactions:
                if txn_id in seen:
                    continue
                seen.add(txn_id)
                out.extend(body.get("edus", []))
        return out


class HoldingPeer(FakeKeyServer):
    """A fake resident server that helps with a join and then hangs: it answers every
    make_join with a template of the user's join (for any room it is asked about) and holds
    every PUT (send_join, invite) unanswered until release(), which answers each 403
    M_FORBIDDEN. `held` counts the PUTs that were held."""

    MAKE_JOIN = "/_matrix/federation/v1/make_join/"

    def __init__(self, ca, ip):
        self.released = threading.Event()
        self.held = 0
        self.lock = threading.Lock()
        super().__init__(ca, ip)

    def do_get(self, handler):
        if not handler.path.startswith(self.MAKE_JOIN):
            super().do_get(handler)
            return
        room, user = (urllib.parse.unquote(p) for p in
                      handler.path[len(self.MAKE_JOIN):].split("?", 1)[0].split("/", 1))
        self.reply(handler, 200, {"room_version": "10", "event": {
            "type": "m.room.member", "room_id": room, "sender": user, "state_key": user,
            "content": {"membership": "join"}, "auth_events": [], "prev_events": [],
            "depth": 2, "origin_server_ts": int(time.time() * 1000)}})

    def do_put(self, handler):
        length = int(handler.headers.get("Content-Length") or 0)
        if length:
            handler.rfile.read(length)
        with self.lock:
            self.held += 1
        self.released.wait()
        self.reply(handler, 403, {"errcode": "M_FORBIDDEN", "error": "released by the test"})

    def release(self):
        self.released.set()

    def close(self):
        self.release()
        super().close()


class HungServer:
    """A server that is there and never answers: it takes TCP connections and sends not a
    byte (not even its side of TLS). server_name is its ip:port; `accepted` the
    connections taken so far."""

    def __init__(self, ip):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((ip, 0))
        self.sock.listen(64)
        self.server_name = f"{ip}:{self.sock.getsockname()[1]}"
        self.accepted = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)  # never answered

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        for conn in self.accepted:
            conn.close()


# ---- a DNS server for discovery tests ---------------------------------------------------

TYPE_A, TYPE_SRV = 1, 33


def _name_wire(name):
    out = b""
    for label in name.rstrip(".").split("."):
        out += bytes([len(label)]) + label.encode()
    return out + b"\0"


class FakeDNS:
    """A UDP DNS server on loopback answering A and SRV questions from `records`:
    {("b.test", "A"): ["127.0.0.22"], ("_matrix-fed._tcp.b.test", "SRV"): [(prio, weight,
    port, target)]}; anything else gets NXDOMAIN. Counts the questions it was asked."""

    def __init__(self, ip="127.0.0.53", ttl=300):
        self.records = {}
        self.ttl = ttl
        self.asked = []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((ip, 0))
        self.sock.settimeout(0.2)
        self.address = f"{ip}:{self.sock.getsockname()[1]}"
        self._stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self._stop:
            try:
                data, peer = self.sock.recvfrom(4096)
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                self.sock.sendto(self._answer(data), peer)
            except Exception:  # a malformed question: no answer
                pass

    def _answer(self, q):
        qid, flags = q[0:2], int.from_bytes(q[2:4], "big")
        pos, labels = 12, []
        while q[pos]:
            labels.append(q[pos + 1:pos + 1 + q[pos]].decode())
            pos += 1 + q[pos]
        qname = ".".join(labels).lower()
        qtype = int.from_bytes(q[pos + 1:pos + 3], "big")
        question = q[12:pos + 5]
        kind = {TYPE_A: "A", TYPE_SRV: "SRV"}.get(qtype, "?")
        self.asked.append((qname, kind))
        answers = self.records.get((qname, kind), [])
        rd = flags & 0x0100
        rcode = 0 if answers or (qname, "A") in self.records or (qname, "SRV") in self.records else 3
        body = b""
        for a in answers:
            if kind == "A":
                rdata = socket.inet_aton(a)
            else:
                prio, weight, port, target = a
                rdata = (prio.to_bytes(2, "big") + weight.to_bytes(2, "big") +
                         port.to_bytes(2, "big") + _name_wire(target))
            body += (b"\xc0\x0c" + qtype.to_bytes(2, "big") + b"\x00\x01" +
                     self.ttl.to_bytes(4, "big") + len(rdata).to_bytes(2, "big") + rdata)
        header = (qid + (0x8000 | 0x0400 | rd | 0x0080 | rcode).to_bytes(2, "big") +
                  b"\x00\x01" + len(answers).to_bytes(2, "big") + b"\x00\x00\x00\x00")
        return header + question + body

    def close(self):
        self._stop = True
        self.sock.close()


class WellKnownServer:
    """HTTPS on ip:443 serving /.well-known/matrix/server with the body the test sets."""

    def __init__(self, ca, ip, name, body):
        self.body = body
        self.requests = []
        cert, keyfile = ca.issue(f"wk-{name}", dns=name)
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                outer.requests.append(self.path)
                data = json.dumps(outer.body).encode()
                self.send_response(200 if self.path == "/.well-known/matrix/server" else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer((ip, 443), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, keyfile)
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
