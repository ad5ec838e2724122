"""Application services (spec v1.13, Application Service API; core/client/appservice/):
registration files listed under app_service_config_files are checked at start (a bad regex
or a shared token is one line naming the file and the key); the as_token acts as the
service's sender, or as a user of its namespaces with ?user_id= (403 outside them), and
as one of its devices with ?device_id= (400 for a device it does not have);
m.login.application_service registers and logs in namespace users without a password,
and an exclusive namespace is 400 M_EXCLUSIVE to everyone else; events of interest reach
the service as PUT /_matrix/app/v1/transactions/{txnId} with the hs_token, in order, one
transaction at a time, the same txnId on every retry, nothing lost across a restart, and a
service that never answers holds no request thread; two processes on one database send
each event once; the ping and the third-party endpoints (the reverse look-ups asked of
every bridge; the protocols' instances given their instance_id); the admin listing of
services and backlogs, and the transaction latency histogram; an unknown user or alias of
a namespace asked of its service (/_matrix/app/v1/users, /rooms) and looked up again, a
misbehaving service leaving it unknown at once; presence and to-device messages for a service with receive_ephemeral
only; the directory plugin's M_EXCLUSIVE and networks (ABI 1.6); services built on the npm
libraries matrix-appservice-bridge and matrix-bot-sdk (tests/e2e/appservice.as.mjs).

The service is a real HTTP server on loopback (FakeService), started by the test."""

import json
import os
import re
import subprocess
import threading
import time
import unittest
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import harness
from accounts import REGISTRATION_ON, Account, register
from common import make_admin
from rooms_client import V3, Client, quote

SERVER = "localhost"
TXN_PATH = re.compile(r"^/_matrix/app/v1/transactions/([^/?]+)$")
PING_PATH = "/_matrix/app/v1/ping"
QUERY_PREFIXES = ("/_matrix/app/v1/users/", "/_matrix/app/v1/rooms/")
LIBERA = {"network_id": "libera", "desc": "Libera.Chat", "fields": {"network": "libera"}}
# Short back-off, so retries within a test take tens of milliseconds (appservice.*).
FAST = {"appservice": {"retry_min_ms": 50, "retry_max_ms": 200, "request_timeout_ms": 1500}}


class FakeService:
    """An application service on 127.0.0.1: records every transaction it took (txnId, the
    Authorization header, the body) and every attempt; answers `status` (200 by default)
    and, while `hang` is set, answers nothing until it is cleared."""

    def __init__(self):
        self.lock = threading.Lock()
        self.attempts = []  # (txn_id, status answered)
        self.taken = {}     # txn_id -> body, in the order first taken
        self.order = []     # txn_ids in the order taken
        self.auth = []
        self.pings = []
        self.lookups = []
        self.status = 200
        self.hang = threading.Event()
        self.hung = 0
        # The user and alias queries: path -> (status, body bytes), or (None, _) to hang up.
        self.on_query = None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def body(self):
                n = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(n) or b"{}")

            def do_PUT(self):
                m = TXN_PATH.match(self.path)
                body = self.body()
                if not m:
                    return self.reply(404, {"errcode": "M_UNRECOGNIZED", "error": "no"})
                while outer.hang.is_set():
                    with outer.lock:
                        outer.hung += 1
                    outer.hang_released.wait(30)
                    with outer.lock:
                        outer.hung -= 1
                    return  # the connection closes unanswered
                with outer.lock:
                    status = outer.status
                    outer.attempts.append((m.group(1), status))
                    outer.auth.append(self.headers.get("Authorization"))
                    if status == 200 and m.group(1) not in outer.taken:
                        outer.taken[m.group(1)] = body
                        outer.order.append(m.group(1))
                self.reply(status, {} if status == 200 else {"errcode": "M_UNKNOWN"})

            def do_GET(self):
                with outer.lock:
                    outer.lookups.append((self.path, self.headers.get("Authorization")))
                if outer.on_query and self.path.startswith(QUERY_PREFIXES):
                    status, data = outer.on_query(urllib.parse.unquote(self.path))
                    if status is None:
                        return  # the connection closes unanswered
                    try:
                        self.send_response(status)
                        self.send_header("Content-Length", str(len(data)))
                        self.end_headers()
                        return self.wfile.write(data)
                    except BrokenPipeError:
                        return  # a slow answer the server stopped waiting for
                if self.path == "/_matrix/app/v1/thirdparty/protocol/irc":
                    return self.reply(200, {"user_fields": ["nick"], "location_fields": [],
                                            "icon": "mxc://x/irc", "field_types": {},
                                            "instances": [LIBERA, "not an instance"]})
                if self.path.startswith("/_matrix/app/v1/thirdparty/user/irc?"):
                    nick = urllib.parse.parse_qs(self.path.split("?", 1)[1])["nick"][0]
                    return self.reply(200, [{"userid": f"@bridge_{nick}:{SERVER}",
                                             "protocol": "irc", "fields": {"nick": nick}}])
                if self.path.startswith("/_matrix/app/v1/thirdparty/user?userid="):
                    user = urllib.parse.unquote(self.path.split("=", 1)[1])
                    return self.reply(200, [{"userid": user, "protocol": "irc",
                                             "fields": {"nick": user[1:].split(":")[0]}}])
                if self.path.startswith("/_matrix/app/v1/thirdparty/location?"):
                    return self.reply(200, {"not": "an array"})
                self.reply(404, {"errcode": "M_NOT_FOUND", "error": "no"})

            def do_POST(self):
                body = self.body()
                if self.path != PING_PATH:
                    return self.reply(404, {"errcode": "M_UNRECOGNIZED", "error": "no"})
                with outer.lock:
                    outer.pings.append((body, self.headers.get("Authorization")))
                self.reply(200, {})

        self.hang_released = threading.Event()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.hang.clear()
        self.hang_released.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def events(self):
        """Every event taken, in the order the transactions were taken."""
        with self.lock:
            return [e for t in self.order for e in self.taken[t]["events"]]

    def ephemeral(self, room):
        """Every ephemeral event of room taken, in order; each transaction's stable and
        MSC2409 lists must agree."""
        with self.lock:
            bodies = [self.taken[t] for t in self.order]
        out = []
        for b in bodies:
            assert b.get("ephemeral") == b.get("de.sorunome.msc2409.ephemeral"), b
            out += [e for e in b.get("ephemeral", []) if e.get("room_id") == room]
        return out

    def taken_key(self, key):
        """Every item of the transactions' `key` list taken, in order."""
        with self.lock:
            return [e for t in self.order for e in self.taken[t].get(key, [])]

    def bodies(self, room):
        return [e["content"].get("body") for e in self.events()
                if e["room_id"] == room and e["type"] == "m.room.message"]

    def wait_bodies(self, room, n, timeout=20):
        deadline = time.time() + timeout
        while time.time() < deadline:
            got = self.bodies(room)
            if len(got) >= n:
                return got
            time.sleep(0.05)
        return self.bodies(room)


def registration(url, ident="bridge", as_token="as-secret", hs_token="hs-secret", **extra):
    reg = {
        "id": ident, "url": url, "as_token": as_token, "hs_token": hs_token,
        "sender_localpart": f"{ident}bot", "rate_limited": False,
        "namespaces": {"users": [{"exclusive": True, "regex": f"@{ident}_.*"}],
                       "aliases": [{"exclusive": True, "regex": f"#{ident}_.*"}],
                       "rooms": []},
        "protocols": ["irc"], "receive_ephemeral": True,
    }
    reg.update(extra)
    return reg


def settings_with(regs, extra=None):
    """Settings writing each registration (a dict, or YAML text) to a file of the server's
    directory and listing them under app_service_config_files."""

    def make(directory):
        paths = []
        for i, reg in enumerate(regs):
            path = os.path.join(directory, f"registration-{i}.yaml")
            with open(path, "w", encoding="utf-8") as f:
                f.write(reg if isinstance(reg, str) else json.dumps(reg))  # JSON is YAML
            paths.append(path)
        return harness.deep_merge(harness.deep_merge(REGISTRATION_ON, FAST),
                                  {"app_service_config_files": paths, **(extra or {})})

    return make


class ConfigErrorsTest(unittest.TestCase):
    def failing(self, regs):
        srv = harness.Server(start=False, settings=settings_with(regs))
        self.addCleanup(srv.close)
        with self.assertRaises(harness.ServerError):
            srv.start(timeout=30)
        return [line for line in srv.log_text().splitlines() if "registration-" in line]

    def test_a_bad_regex_is_one_line_naming_the_file_and_the_key(self):
        reg = registration(None)
        reg["namespaces"]["users"] = [{"exclusive": True, "regex": "@bridge_(.*"}]
        lines = self.failing([reg])
        self.assertEqual(len(lines), 1, lines)
        self.assertRegex(lines[0], r"registration-0\.yaml:\d+: namespaces\.users.*regex")
        self.assertIn("POSIX extended regular expression", lines[0])

    def test_two_services_sharing_a_token_are_refused(self):
        lines = self.failing([registration(None, "one", as_token="same"),
                              registration(None, "two", as_token="same", hs_token="other")])
        self.assertEqual(len(lines), 1, lines)
        self.assertRegex(lines[0], r"registration-1\.yaml:\d+: as_token: .*already uses")

    def test_a_missing_key_is_named(self):
        reg = registration(None)
        del reg["hs_token"]
        lines = self.failing([reg])
        self.assertEqual(len(lines), 1, lines)
        self.assertIn("registration-0.yaml", lines[0])
        self.assertIn("hs_token is missing", lines[0])


class AppserviceCase(unittest.TestCase):
    extra_settings = None

    @classmethod
    def setUpClass(cls):
        cls.svc = FakeService()
        cls.plain = FakeService()  # a service that did not ask for ephemeral data
        regs = [registration(cls.svc.url),
                registration(None, "quiet", as_token="quiet-as", hs_token="quiet-hs",
                             rate_limited=True, protocols=["xmpp"]),
                registration(cls.plain.url, "plain", as_token="plain-as", hs_token="plain-hs",
                             protocols=[], receive_ephemeral=False)] + cls.more_registrations()
        cls.srv = harness.Server(settings=settings_with(regs, cls.extra_settings),
                                 plugins={"directory": {"enabled": True}})
        try:
            cls.srv.__enter__()
        except BaseException:
            cls.svc.close()
            cls.plain.close()
            raise
        cls.bot = Client(cls.srv, Account(f"@bridgebot:{SERVER}", "as-secret", None, None))

    @classmethod
    def more_registrations(cls):
        return []

    @classmethod
    def tearDownClass(cls):
        cls.srv.close()
        cls.svc.close()
        cls.plain.close()

    def as_call(self, method, path, body=None, user_id=None, token="as-secret"):
        if user_id:
            path += ("&" if "?" in path else "?") + "user_id=" + quote(user_id)
        return self.srv.json(method, path, body, token=token)

    def as_register(self, localpart, token="as-secret", **extra):
        return self.srv.json("POST", f"{V3}/register",
                             {"type": "m.login.application_service", "username": localpart,
                              **extra}, token=token)


class ActingAsServiceTest(AppserviceCase):
    # Rate limits on (the harness turns them off): 2 messages at once, then one a minute.
    extra_settings = {"ratelimit": {"enabled": True, "message": {"per_minute": 1, "burst": 2},
                                    "register": {"per_minute": 1000, "burst": 1000},
                                    "login": {"per_minute": 1000, "burst": 1000}}}

    def test_the_as_token_is_the_sender_user(self):
        status, who = self.as_call("GET", f"{V3}/account/whoami")
        self.assertEqual((status, who["user_id"]), (200, f"@bridgebot:{SERVER}"))

    def test_registration_with_the_as_token_needs_no_auth_and_masquerading_works(self):
        status, answer = self.as_register("bridge_alice")
        self.assertEqual(status, 200, answer)
        self.assertEqual(answer["user_id"], f"@bridge_alice:{SERVER}")
        status, who = self.as_call("GET", f"{V3}/account/whoami", user_id=answer["user_id"])
        self.assertEqual((status, who.get("user_id")), (200, answer["user_id"]))

    def test_masquerading_outside_the_namespace_is_forbidden(self):
        register(self.srv, "carol")
        for user in (f"@carol:{SERVER}", f"@bridge_nobody:{SERVER}", f"@quietbot:{SERVER}"):
            status, answer = self.as_call("GET", f"{V3}/account/whoami", user_id=user)
            self.assertEqual((status, answer.get("errcode")), (403, "M_FORBIDDEN"), user)

    def test_masquerading_as_a_device_the_user_has(self):
        alice = Client(self.srv, register(self.srv, "alice_devices"))
        bridged = self.as_register("bridge_devices")[1]
        user, device = bridged["user_id"], bridged["device_id"]
        alice.ok("PUT", f"{V3}/sendToDevice/m.test/dev1",
                 {"messages": {user: {device: {"for": "the device"}}}})
        for key in ("device_id", "org.matrix.msc3202.device_id"):  # stable, MSC3202's
            status, who = self.as_call("GET", f"{V3}/account/whoami?{key}={quote(device)}",
                                       user_id=user)
            self.assertEqual((status, who.get("device_id")), (200, device), key)
        # The device's own to-device messages, through the as_token.
        status, synced = self.as_call("GET", f"{V3}/sync?timeout=0&device_id={quote(device)}",
                                      user_id=user)
        self.assertEqual(status, 200, synced)
        self.assertEqual([e["content"] for e in synced["to_device"]["events"]],
                         [{"for": "the device"}])
        # A device the user does not have (the sender has none of its users' devices).
        bad = "ORG.MATRIX.MSC4326.M_UNKNOWN_DEVICE"
        for path, who in ((f"{V3}/account/whoami?device_id=NOPE", user),
                          (f"{V3}/account/whoami?device_id={quote(device)}", None)):
            status, answer = self.as_call("GET", path, user_id=who)
            self.assertEqual((status, answer.get("errcode")), (400, bad), path)
        status, who = self.as_call("GET", f"{V3}/account/whoami", user_id=user)
        self.assertEqual((status, who.get("device_id")), (200, "AS_bridge"))

    def test_a_service_registers_only_inside_its_namespace(self):
        status, answer = self.as_register("someone_else")
        self.assertEqual((status, answer.get("errcode")), (400, "M_EXCLUSIVE"))
        status, answer = self.as_register("bridge_x", token="quiet-as")
        self.assertEqual((status, answer.get("errcode")), (400, "M_EXCLUSIVE"))

    def test_the_application_service_type_needs_an_as_token(self):
        status, answer = self.srv.json("POST", f"{V3}/register",
                                       {"type": "m.login.application_service",
                                        "username": "bridge_y"})
        self.assertEqual((status, answer.get("errcode")), (401, "M_MISSING_TOKEN"))

    def test_an_exclusive_namespace_is_refused_to_everyone_else(self):
        body = {"username": "bridge_mallory", "password": "pw-pw-pw-pw"}
        status, answer = self.srv.json("POST", f"{V3}/register", body)
        self.assertEqual((status, answer.get("errcode")), (400, "M_EXCLUSIVE"))
        status, answer = self.srv.json("GET", f"{V3}/register/available?username=bridge_m")
        self.assertEqual((status, answer.get("errcode")), (400, "M_EXCLUSIVE"))
        alice = Client(self.srv, register(self.srv, "alice_alias"))
        status, answer = alice.call("POST", f"{V3}/createRoom", {"room_alias_name": "bridge_r"})
        self.assertEqual((status, answer.get("errcode")), (400, "M_EXCLUSIVE"))
        self.assertEqual(alice.call("POST", f"{V3}/createRoom",
                                    {"room_alias_name": "alice_r"})[0], 200)
        # The directory plugin asks the core (ABI 1.6, alias_exclusive).
        room = alice.create_room()
        status, answer = alice.call("PUT", f"{V3}/directory/room/{quote('#bridge_d:' + SERVER)}",
                                    {"room_id": room})
        self.assertEqual((status, answer.get("errcode")), (400, "M_EXCLUSIVE"))
        self.assertEqual(alice.call("PUT", f"{V3}/directory/room/{quote('#alice_d:' + SERVER)}",
                                    {"room_id": room})[0], 200)
        alice.ok("POST", f"{V3}/rooms/{quote(room)}/invite", {"user_id": self.bot.user_id})
        self.bot.ok("POST", f"{V3}/rooms/{quote(room)}/join", {})
        self.assertEqual(self.bot.call("PUT", f"{V3}/directory/room/{quote('#bridge_d:' + SERVER)}",
                                       {"room_id": room})[0], 200)

    def test_a_service_lists_rooms_for_its_networks(self):
        alice = Client(self.srv, register(self.srv, "alice_networks"))
        room = alice.create_room(name="irc channel")
        path = f"{V3}/directory/list/appservice/libera/{quote(room)}"
        status, answer = alice.call("PUT", path, {"visibility": "public"})
        self.assertEqual((status, answer.get("errcode")), (403, "M_FORBIDDEN"))
        self.assertEqual(self.as_call("PUT", path, {"visibility": "nope"})[0], 400)
        self.assertEqual(self.as_call("PUT", path, {"visibility": "public"})[0], 200)

        def listed(body):
            rooms = alice.ok("POST", f"{V3}/publicRooms", body)["chunk"]
            return room in [r["room_id"] for r in rooms]

        self.assertFalse(listed({}))
        instance = alice.ok("GET", f"{V3}/thirdparty/protocol/irc")["instances"][0]
        self.assertTrue(listed({"third_party_instance_id": instance["instance_id"]}))
        self.assertFalse(listed({"third_party_instance_id": "bridge|oftc"}))
        self.assertTrue(listed({"include_all_networks": True}))
        for bad in ({"third_party_instance_id": "nobar"}, {"include_all_networks": "yes"},
                    {"include_all_networks": True, "third_party_instance_id": "bridge|libera"}):
            self.assertEqual(alice.call("POST", f"{V3}/publicRooms", bad)[0], 400, bad)
        self.assertEqual(self.as_call("PUT", path, {"visibility": "private"})[0], 200)
        self.assertFalse(listed({"include_all_networks": True}))

    def test_application_service_login(self):
        flows = self.srv.json("GET", f"{V3}/login")[1]["flows"]
        self.assertIn({"type": "m.login.application_service"}, flows)
        self.assertEqual(self.as_register("bridge_login", inhibit_login=True)[0], 200)
        body = {"type": "m.login.application_service",
                "identifier": {"type": "m.id.user", "user": "bridge_login"}}
        status, answer = self.srv.json("POST", f"{V3}/login", body, token="as-secret")
        self.assertEqual(status, 200, answer)
        status, who = self.srv.json("GET", f"{V3}/account/whoami", token=answer["access_token"])
        self.assertEqual(who["user_id"], f"@bridge_login:{SERVER}")
        status, answer = self.srv.json("POST", f"{V3}/login", body)
        self.assertEqual((status, answer.get("errcode")), (401, "M_MISSING_TOKEN"))
        body["identifier"]["user"] = "carol_login"
        status, answer = self.srv.json("POST", f"{V3}/login", body, token="as-secret")
        self.assertEqual((status, answer.get("errcode")), (403, "M_FORBIDDEN"))

    def test_a_service_with_rate_limited_false_is_not_rate_limited(self):
        room = self.bot.create_room()
        for i in range(6):
            self.bot.send(room, {"msgtype": "m.text", "body": f"unlimited {i}"})
        dave = Client(self.srv, register(self.srv, "dave_limited"))
        room2 = dave.create_room()
        statuses = [dave.call("PUT", f"{V3}/rooms/{quote(room2)}/send/m.room.message/d{i}",
                              {"msgtype": "m.text", "body": "x"})[0] for i in range(4)]
        self.assertIn(429, statuses)

    def test_protocols_come_from_the_registrations(self):
        alice = Client(self.srv, register(self.srv, "alice_protocols"))
        protocols = alice.ok("GET", f"{V3}/thirdparty/protocols")
        self.assertEqual(sorted(protocols), ["irc", "xmpp"])
        # The bridge's description, asked with its hs_token: each instance gets its
        # instance_id "<service id>|<network_id>" (publicRooms' third_party_instance_id);
        # what is not an instance is left out.
        self.assertEqual(protocols["irc"]["icon"], "mxc://x/irc")
        self.assertEqual(protocols["irc"]["instances"],
                         [{**LIBERA, "instance_id": "bridge|libera"}])
        self.assertIn(("/_matrix/app/v1/thirdparty/protocol/irc", "Bearer hs-secret"),
                      self.svc.lookups)
        self.assertEqual(alice.ok("GET", f"{V3}/thirdparty/protocol/irc"), protocols["irc"])
        # Look-ups are the bridge's answers, the query passed on.
        users = alice.ok("GET", f"{V3}/thirdparty/user/irc?nick=bob&access_token={alice.token}")
        self.assertEqual(users, [{"userid": f"@bridge_bob:{SERVER}", "protocol": "irc",
                                  "fields": {"nick": "bob"}}])
        self.assertIn(("/_matrix/app/v1/thirdparty/user/irc?nick=bob", "Bearer hs-secret"),
                      self.svc.lookups)
        self.assertEqual(alice.call("GET", f"{V3}/thirdparty/location/irc")[0], 404)
        # Reverse look-ups (no protocol): every bridge asked, the arrays joined; a bridge
        # answering something else is left out (here the only one: 502).
        bob = f"@bridge_bob:{SERVER}"
        self.assertEqual(alice.ok("GET", f"{V3}/thirdparty/user?userid={quote(bob)}"),
                         [{"userid": bob, "protocol": "irc", "fields": {"nick": "bridge_bob"}}])
        status, answer = alice.call("GET", f"{V3}/thirdparty/location?alias=%23x:{SERVER}")
        self.assertEqual((status, answer.get("errcode")), (502, "M_UNKNOWN"))
        self.assertEqual(alice.call("GET", f"{V3}/thirdparty/user")[0], 400)
        # A bridge without a url: its protocol's description from the registration alone.
        self.assertEqual(alice.ok("GET", f"{V3}/thirdparty/protocol/xmpp")["instances"], [])
        self.assertEqual(alice.call("GET", f"{V3}/thirdparty/protocol/nope")[0], 404)

    def test_ping(self):
        status, answer = self.as_call("POST", "/_matrix/client/v1/appservice/bridge/ping",
                                      {"transaction_id": "ping-1"})
        self.assertEqual(status, 200, answer)
        self.assertIsInstance(answer["duration_ms"], int)
        self.assertIn(({"transaction_id": "ping-1"}, "Bearer hs-secret"), self.svc.pings)
        status, answer = self.as_call("POST", "/_matrix/client/v1/appservice/quiet/ping", {})
        self.assertEqual((status, answer.get("errcode")), (403, "M_FORBIDDEN"))
        status, answer = self.as_call("POST", "/_matrix/client/v1/appservice/quiet/ping", {},
                                      token="quiet-as")
        self.assertEqual((status, answer.get("errcode")), (400, "M_URL_NOT_SET"))


class QueryChecks:
    """(Run in DeliveryTest's server.) GET /_matrix/app/v1/users/{userId} and /rooms/{alias}: asked when a client looks up
    an unknown user or alias of a namespace; the service makes it, and the server looks
    again. Whatever else the service answers, the caller gets 404 at once."""

    def answer(self, path):
        kind, ident = path[len("/_matrix/app/v1/"):].split("/", 1)
        local = ident[1:].split(":")[0]
        if local.endswith("_made") and kind == "users":
            self.assertEqual(self.as_register(local)[0], 200)
        elif local.endswith("_made"):
            self.bot.ok("POST", f"{V3}/createRoom", {"room_alias_name": local,
                                                     "preset": "public_chat"})
        elif local.endswith("_garbage"):
            return 200, b"{not json"
        elif local.endswith("_slow"):
            time.sleep(3)  # past appservice.request_timeout_ms
            return 200, b"{}"
        elif local.endswith("_hangup"):
            return None, b""
        else:
            return 404, b'{"errcode": "M_NOT_FOUND"}'
        return 200, b"{}"

    def setUp(self):
        self.svc.on_query = self.answer
        self.alice = Client(self.srv, register(self.srv, f"alice_q{int(time.time() * 1e6)}"))

    def test_an_unknown_namespace_user_is_asked_for_and_then_found(self):
        user = f"@bridge_u{int(time.time() * 1000)}_made:{SERVER}"
        self.assertEqual(self.alice.call("GET", f"{V3}/profile/{quote(user)}")[0], 200)
        self.assertIn((f"/_matrix/app/v1/users/{user}", "Bearer hs-secret"),
                      [(urllib.parse.unquote(p), a) for p, a in self.svc.lookups])
        room = self.alice.create_room()
        self.assertEqual(self.alice.call("POST", f"{V3}/rooms/{quote(room)}/invite",
                                         {"user_id": f"@bridge_i{int(time.time() * 1000)}_made:"
                                                     f"{SERVER}"})[0], 200)
        # Outside every namespace, or known already: nobody is asked.
        before = len(self.svc.lookups)
        self.assertEqual(self.alice.call("GET", f"{V3}/profile/@nobody:{SERVER}")[0], 404)
        self.assertEqual(self.alice.call("GET", f"{V3}/profile/{quote(user)}")[0], 200)
        self.assertEqual(len(self.svc.lookups), before)

    def test_joining_an_unknown_namespace_alias_creates_the_room(self):
        alias = f"#bridge_r{int(time.time() * 1000)}_made:{SERVER}"
        status, answer = self.alice.call("POST", f"{V3}/join/{quote(alias)}", {})
        self.assertEqual(status, 200, answer)
        self.assertTrue(answer["room_id"].startswith("!"))
        # The directory plugin's look-up asks too (ABI 1.6, alias_query).
        alias = f"#bridge_g{int(time.time() * 1000)}_made:{SERVER}"
        status, answer = self.alice.call("GET", f"{V3}/directory/room/{quote(alias)}")
        self.assertEqual(status, 200, answer)
        status, answer = self.alice.call("GET", f"{V3}/directory/room/#bridge_g_garbage:{SERVER}")
        self.assertEqual((status, answer.get("errcode")), (404, "M_NOT_FOUND"))

    def test_a_service_that_misbehaves_leaves_the_thing_unknown_at_once(self):
        for how in ("none", "garbage", "hangup"):
            status, answer = self.alice.call("GET", f"{V3}/profile/@bridge_x_{how}:{SERVER}")
            self.assertEqual((status, answer.get("errcode")), (404, "M_NOT_FOUND"), how)
            status, answer = self.alice.call("POST", f"{V3}/join/#bridge_x_{how}:{SERVER}", {})
            self.assertEqual((status, answer.get("errcode")), (404, "M_NOT_FOUND"), how)
        # A slow service: the request waits parked, /versions answers at once meanwhile.
        result = {}
        t = threading.Thread(target=lambda: result.update(
            a=self.alice.call("GET", f"{V3}/profile/@bridge_y_slow:{SERVER}")))
        started = time.monotonic()
        t.start()
        time.sleep(0.3)
        v0 = time.monotonic()
        self.assertEqual(self.srv.json("GET", "/_matrix/client/versions")[0], 200)
        self.assertLess(time.monotonic() - v0, 1.0)
        t.join(10)
        self.assertEqual(result["a"][0], 404)
        self.assertLess(time.monotonic() - started, 3.0)  # the 1.5 s deadline, not the 3 s


class DeliveryTest(QueryChecks, AppserviceCase):
    extra_settings = {"presence": {"enabled": True}}

    @classmethod
    def more_registrations(cls):
        """The services tests/e2e/appservice.as.mjs runs on these ports."""
        cls.mab_port, cls.sdk_port = harness.free_ports(count=2)
        return [registration(f"http://127.0.0.1:{port}", ident, as_token=f"{ident}-as",
                             hs_token=f"{ident}-hs", protocols=[], receive_ephemeral=ephemeral)
                for ident, port, ephemeral in (("mab", cls.mab_port, True),
                                               ("sdk", cls.sdk_port, False))]

    def test_services_built_on_the_npm_bridge_libraries(self):
        """matrix-appservice-bridge 11.2's Bridge and matrix-bot-sdk 0.8's Appservice
        (tests/e2e/appservice.as.mjs): a transaction taken, messages both ways with a
        matrix-js-sdk user, the bridge's self-ping, typing to the bridge that asked for
        ephemeral events and not to the appservice that did not, a room made by the bridge
        for an unknown alias a client joins, a user query answered by making the user."""
        e2e = os.path.join(harness.REPO_ROOT, "tests", "e2e")
        if not os.path.isdir(os.path.join(e2e, "node_modules", "matrix-appservice-bridge")):
            self.fail("tests/e2e/node_modules is missing: run tests/run.sh (it runs npm ci)")
        alice = register(self.srv, "alice_npm")
        proc = subprocess.run(
            ["node", "--test", "--test-force-exit", "--test-reporter=spec", "appservice.as.mjs"],
            cwd=e2e, capture_output=True, text=True, timeout=120,
            env={**os.environ, "ATRIUM_URL": self.srv.base, "ATRIUM_DOMAIN": SERVER,
                 "ALICE_TOKEN": alice.token, "ALICE_ID": alice.user_id,
                 "MAB_PORT": str(self.mab_port),
                 "SDK_PORT": str(self.sdk_port)})
        self.assertEqual(proc.returncode, 0,
                         f"node --test failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-3000:]}")

    def test_presence_and_to_device_reach_only_a_service_that_asked(self):
        alice = Client(self.srv, register(self.srv, "alice_eph"))
        bridged = self.as_register("bridge_eph")[1]
        plain = self.as_register("plain_eph", token="plain-as")[1]
        room = alice.create_room(invite=[bridged["user_id"], plain["user_id"]])
        for who, token in ((bridged, "as-secret"), (plain, "plain-as")):
            self.assertEqual(self.as_call("POST", f"{V3}/rooms/{quote(room)}/join", {},
                                          user_id=who["user_id"], token=token)[0], 200)
        messages = {who["user_id"]: {who["device_id"]: {"secret": who["user_id"]}}
                    for who in (bridged, plain)}
        alice.ok("PUT", f"{V3}/sendToDevice/m.test/eph1", {"messages": messages})
        alice.ok("PUT", f"{V3}/presence/{quote(alice.user_id)}/status",
                 {"presence": "online", "status_msg": "bridging"})
        alice.send(room, {"msgtype": "m.text", "body": "after"})
        self.assertEqual(self.svc.wait_bodies(room, 1), ["after"])
        self.assertEqual(self.plain.wait_bodies(room, 1), ["after"])
        to_device = self.svc.taken_key("de.sorunome.msc2409.to_device")
        self.assertEqual(to_device, [{"type": "m.test", "sender": alice.user_id,
                                      "content": {"secret": bridged["user_id"]},
                                      "to_user_id": bridged["user_id"],
                                      "to_device_id": bridged["device_id"]}])
        presence = [e for e in self.svc.taken_key("ephemeral") if e["type"] == "m.presence"
                    and e["sender"] == alice.user_id]
        self.assertEqual(presence[-1]["content"]["status_msg"], "bridging")
        self.assertEqual(presence[-1]["content"]["presence"], "online")
        self.assertEqual(self.plain.taken_key("de.sorunome.msc2409.to_device"), [])
        self.assertEqual(self.plain.taken_key("ephemeral"), [])

    def test_events_of_interest_arrive_in_order_with_the_hs_token(self):
        outsider = Client(self.srv, register(self.srv, "outsider"))
        private = outsider.create_room()
        outsider.send(private, {"msgtype": "m.text", "body": "not for the bridge"})
        room = self.bot.create_room()
        for i in range(5):
            self.bot.send(room, {"msgtype": "m.text", "body": f"m{i}"})
        self.assertEqual(self.svc.wait_bodies(room, 5), [f"m{i}" for i in range(5)])
        self.assertEqual(self.svc.bodies(private), [])
        self.assertEqual(set(self.svc.auth), {"Bearer hs-secret"})
        # A user joining the room of a namespace user makes that room's events of interest.
        status, answer = self.as_register("bridge_bob")
        self.assertEqual(status, 200, answer)
        room2 = outsider.create_room(invite=[answer["user_id"]])
        self.assertEqual(self.as_call("POST", f"{V3}/rooms/{quote(room2)}/join", {},
                                      user_id=answer["user_id"])[0], 200)
        outsider.send(room2, {"msgtype": "m.text", "body": "to the bridged user"})
        self.assertEqual(self.svc.wait_bodies(room2, 1), ["to the bridged user"])

    def test_receipts_and_typing_reach_a_service_with_receive_ephemeral(self):
        room = self.bot.create_room()
        event_id = self.bot.send(room, {"msgtype": "m.text", "body": "seen"})
        self.bot.ok("POST", f"{V3}/rooms/{quote(room)}/receipt/m.read/{quote(event_id)}", {})
        self.bot.ok("PUT", f"{V3}/rooms/{quote(room)}/typing/{quote(self.bot.user_id)}",
                    {"typing": True, "timeout": 30000})
        deadline = time.time() + 15
        while time.time() < deadline:
            types = {e["type"] for e in self.svc.ephemeral(room)}
            if {"m.receipt", "m.typing"} <= types:
                break
            time.sleep(0.05)
        eph = self.svc.ephemeral(room)
        receipts = [e["content"] for e in eph if e["type"] == "m.receipt"]
        self.assertIn(self.bot.user_id, receipts[0][event_id]["m.read"])
        typing = [e["content"]["user_ids"] for e in eph if e["type"] == "m.typing"]
        self.assertEqual(typing[-1], [self.bot.user_id])

    def test_a_failing_service_gets_everything_in_order_with_the_same_txn_id(self):
        room = self.bot.create_room()
        with self.svc.lock:
            self.svc.status = 500
            before = len(self.svc.attempts)
        for i in range(50):
            self.bot.send(room, {"msgtype": "m.text", "body": f"r{i}"})
        deadline = time.time() + 10  # a few failed tries of the same transaction
        while time.time() < deadline:
            with self.svc.lock:
                failed = [t for t, s in self.svc.attempts[before:] if s == 500]
            if len(failed) >= 3:
                break
            time.sleep(0.05)
        self.assertGreaterEqual(len(failed), 3)
        self.assertEqual(len(set(failed[:3])), 1, failed)  # the same txnId each time
        with self.svc.lock:
            self.svc.status = 200
        self.assertEqual(self.svc.wait_bodies(room, 50), [f"r{i}" for i in range(50)])
        with self.svc.lock:
            self.assertIn(failed[0], self.svc.taken)  # that txnId was then taken
            ids = [e["event_id"] for t in self.svc.order for e in self.svc.taken[t]["events"]]
        self.assertEqual(len(ids), len(set(ids)))  # nothing delivered twice
        self.assertLessEqual(max(len(self.svc.taken[t]["events"]) for t in self.svc.order), 100)

    def test_a_service_that_never_answers_holds_no_request_thread(self):
        room = self.bot.create_room()
        self.svc.hang_released.clear()
        self.svc.hang.set()
        try:
            self.bot.send(room, {"msgtype": "m.text", "body": "into the void"})
            deadline = time.time() + 10
            while time.time() < deadline and not (
                    self.svc.hung and self.srv.metric("atrium_appservice_in_flight") == 1):
                time.sleep(0.02)
            self.assertTrue(self.svc.hung)
            self.assertEqual(self.srv.metric("atrium_appservice_in_flight"), 1)
            for _ in range(20):
                t0 = time.monotonic()
                status, _, _ = self.srv.request("GET", "/_matrix/client/versions")
                self.assertEqual(status, 200)
                self.assertLess(time.monotonic() - t0, 1.0)
            self.bot.send(room, {"msgtype": "m.text", "body": "still answering"})
        finally:
            self.svc.hang.clear()
            self.svc.hang_released.set()
        self.assertEqual(self.svc.wait_bodies(room, 2), ["into the void", "still answering"])
        labels = {"service": "bridge", "outcome": "failed"}
        self.assertGreaterEqual(self.srv.metric("atrium_appservice_transactions_total", labels), 1)

    def test_the_admin_listing_shows_each_service_its_backlog_and_latency(self):
        root = register(self.srv, "root_as")
        make_admin(self.srv, root.user_id)
        path = "/_atrium/admin/v1/appservices"
        for token in (register(self.srv, "nobody_as").token, "as-secret"):
            status, answer = self.srv.json("GET", path, token=token)
            self.assertEqual((status, answer.get("errcode")), (403, "M_FORBIDDEN"))

        def listed():
            status, answer = self.srv.json("GET", path, token=root.token)
            self.assertEqual((status, answer["total"]), (200, 5), answer)
            return {s["id"]: s for s in answer["appservices"]}

        quiet = listed()["quiet"]
        self.assertEqual((quiet["url"], quiet["backlog"], quiet["sender"], quiet["protocols"]),
                         (None, None, f"@quietbot:{SERVER}", ["xmpp"]))
        self.assertEqual(quiet["namespaces"]["users"], [{"regex": "@quiet_.*", "exclusive": True}])
        latency = {"service": "bridge"}
        timed = self.srv.metric("atrium_appservice_transaction_seconds_count", latency) or 0
        room, t0 = self.bot.create_room(), int(time.time() * 1000) - 5
        with self.svc.lock:
            self.svc.status = 500
        try:
            self.bot.send(room, {"msgtype": "m.text", "body": "listed"})
            deadline = time.time() + 10
            while time.time() < deadline:
                bridge = listed()["bridge"]
                if (bridge["last_failure_ts"] or 0) >= t0 and bridge["pending_transaction"]:
                    break
                time.sleep(0.05)
            self.assertGreaterEqual(bridge["last_failure_ts"], t0, bridge)
            self.assertEqual(bridge["last_error"], "answered 500")
            pending = bridge["pending_transaction"]  # events, or ephemeral data only
            self.assertEqual(sorted(pending), ["attempts", "events", "next_try_ts", "txn_id"])
            self.assertIsInstance(pending["txn_id"], int)
            self.assertGreater(bridge["backlog"], 0)
            self.assertIsInstance(bridge["in_flight"], bool)
        finally:
            with self.svc.lock:
                self.svc.status = 200
        self.assertEqual(self.svc.wait_bodies(room, 1), ["listed"])
        deadline = time.time() + 10
        while time.time() < deadline and listed()["bridge"]["pending_transaction"]:
            time.sleep(0.05)
        bridge = listed()["bridge"]
        self.assertIsNone(bridge["pending_transaction"])
        self.assertGreaterEqual(bridge["last_success_ts"], bridge["last_failure_ts"])
        # The latency histogram saw the failure and the success.
        self.assertGreaterEqual(
            self.srv.metric("atrium_appservice_transaction_seconds_count", latency), timed + 2)

    def test_a_backlog_survives_a_restart(self):
        room = self.bot.create_room()
        with self.svc.lock:
            self.svc.status = 503
        for i in range(20):
            self.bot.send(room, {"msgtype": "m.text", "body": f"k{i}"})
        deadline = time.time() + 10
        while time.time() < deadline:
            with self.svc.lock:
                if any(s == 503 for _, s in self.svc.attempts):
                    break
            time.sleep(0.05)
        backlog = {"service": "bridge"}
        deadline = time.time() + 10
        while time.time() < deadline and not self.srv.metric("atrium_appservice_backlog", backlog):
            time.sleep(0.05)
        self.assertGreater(self.srv.metric("atrium_appservice_backlog", backlog), 0)
        self.srv.stop()
        self.assertEqual(self.svc.bodies(room), [])
        self.srv.start()
        for i in range(20, 25):
            self.bot.send(room, {"msgtype": "m.text", "body": f"k{i}"})
        with self.svc.lock:
            self.svc.status = 200
        self.assertEqual(self.svc.wait_bodies(room, 25), [f"k{i}" for i in range(25)])


class TwoProcessesTest(unittest.TestCase):
    """Two processes on one database: only the holder of core.appservice_sender builds and
    sends, so an event sent through either reaches the service once, in order."""

    def test_each_event_is_sent_once_whichever_process_it_went_through(self):
        svc = FakeService()
        self.addCleanup(svc.close)
        db = harness.create_database(template=harness.migrated_template())
        self.addCleanup(harness.drop_database, db)
        servers = []
        for ip in ("127.0.0.81", "127.0.0.82"):
            srv = harness.Server(database=db, settings=settings_with([registration(svc.url)]),
                                 start=False, host=ip)
            self.addCleanup(srv.close)
            srv.start()
            servers.append(srv)
        a, b = (Client(s, Account(f"@bridgebot:{SERVER}", "as-secret", None, None))
                for s in servers)
        room = a.create_room()
        for i in range(10):
            (a if i % 2 == 0 else b).send(room, {"msgtype": "m.text", "body": f"p{i}"})
        self.assertEqual(svc.wait_bodies(room, 10), [f"p{i}" for i in range(10)])
        time.sleep(2.5)  # past a poll in either process: a second sender would have sent
        self.assertEqual(svc.bodies(room), [f"p{i}" for i in range(10)])
        held = [s.metric("atrium_lease_held", {"lease": "core.appservice_sender"})
                for s in servers]
        self.assertEqual(sorted(held), [0, 1])


if __name__ == "__main__":
    unittest.main()
