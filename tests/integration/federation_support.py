"""Federation test support: a throwaway CA and certificates, Ed25519 through libsodium
(ctypes, the library Atrium itself links), canonical JSON, X-Matrix signing, two Atrium
servers that federate over loopback TLS, and a fake peer (a key server the test controls)
for the misbehaviour a real server would never show.

Server names are IP literals with a port (127.0.0.2x:PORT): discovery's first step, so no
DNS is involved; every address is on 127.0.0.0/8, which each server whitelists.
"""

import base64
import ctypes
import ctypes.util
import http.client
import http.server
import json
import os
import socket
import ssl
import subprocess
import threading
import time

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


# ---- certificates --------------------------------------------------------------------


class TestCA:
    """A CA made for one test run, and certificates with IP SANs signed by it."""

    def __init__(self, directory):
        self.dir = directory
        self.cert = os.path.join(directory, "ca.crt")
        self.key = os.path.join(directory, "ca.key")
        self._run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                  "/CN=Atrium test CA", "-keyout", self.key, "-out", self.cert,
                  "-addext", "basicConstraints=critical,CA:TRUE",
                  "-addext", "keyUsage=critical,keyCertSign")

    def _run(self, *args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    def issue(self, name, ip):
        """(cert, key) paths for a server certificate with IP SAN `ip`."""
        key = os.path.join(self.dir, f"{name}.key")
        csr = os.path.join(self.dir, f"{name}.csr")
        cert = os.path.join(self.dir, f"{name}.crt")
        ext = os.path.join(self.dir, f"{name}.ext")
        with open(ext, "w") as f:
            f.write(f"subjectAltName=IP:{ip}\nextendedKeyUsage=serverAuth,clientAuth\n")
        self._run("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={ip}", "-keyout", key,
                  "-out", csr)
        self._run("x509", "-req", "-in", csr, "-CA", self.cert, "-CAkey", self.key,
                  "-CAcreateserial", "-days", "2", "-out", cert, "-extfile", ext)
        return cert, key

    def client_context(self):
        ctx = ssl.create_default_context(cafile=self.cert)
        ctx.check_hostname = False  # IP literals: the SAN is checked by verify_mode below
        ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx


def free_port(host):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


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
    """An Atrium server with a federation listener on its own loopback address."""

    def __init__(self, ca, ip, extra=None, **kwargs):
        self.fed_ip = ip
        self.fed_port = free_port(ip)
        self.ca = ca
        self.tls_cert, self.tls_key = ca.issue(f"atrium-{ip}", ip)
        name = f"{ip}:{self.fed_port}"
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

    def signed_request(self, method, path, origin, key, content=None, destination=None):
        auth = xmatrix(method, path, origin, destination or self.server_name, key, content)
        return self.fed_request(method, path, {"Authorization": auth}, content)


class FakeKeyServer:
    """A fake peer: serves /_matrix/key/v2/server over TLS for its name and keys, counting
    requests. The test decides what it publishes (valid_until_ts, extra keys), so it can
    lie or expire in ways a real server would not."""

    def __init__(self, ca, ip):
        self.ip = ip
        self.port = free_port(ip)
        self.server_name = f"{ip}:{self.port}"
        self.key = SigningKey("fake1")
        self.valid_for_ms = 3600 * 1000
        self.requests = []
        cert, keyfile = ca.issue(f"fake-{ip}", ip)
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                outer.requests.append(self.path)
                if not self.path.startswith("/_matrix/key/v2/server"):
                    self.send_error(404)
                    return
                doc = {"server_name": outer.server_name,
                       "verify_keys": {outer.key.key_id: {"key": outer.key.public_b64}},
                       "old_verify_keys": {},
                       "valid_until_ts": int(time.time() * 1000) + outer.valid_for_ms}
                body = canonical(sign_json(doc, outer.server_name, outer.key))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer((ip, self.port), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, keyfile)
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
