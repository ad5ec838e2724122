"""The room directory across servers: a user on A resolves an alias of B and reads B's
public room list (GET and POST publicRooms?server=); remote look-ups under ADR-0079
(docs/adr/0079-outbound-budget.md) with a peer that never answers; the 30 s cache and
in-flight sharing, counted at a fake peer; a peer's refusal reaching the client as an
error; a user on A joining a room of B through B's alias.

SharedPairTest's tests share A and B (a start costs about a CPU-second): each has users,
aliases and a fake peer of its own, and reads A's counters as what they gained."""

import http.server
import json
import ssl
import threading
import time

from accounts import quote, register
from common import Background, wait_until
from federation_support import HungServer, free_port
from rooms_client import V3, Client
from test_federation import A_IP, B_IP, FederationTestCase

HUNG_IP, PEER_IP = "127.0.0.42", "127.0.0.32"
DIRECTORY = {"directory": {"enabled": True}}
# A behind a proxy on 127.0.0.1: X-Forwarded-For gives a look-up a client key of its own.
TRUSTED = {"server": {"http": {"trusted_proxies": ["127.0.0.1"]}}}


class CountingPeer:
    """A fake peer answering the directory's federation requests, counting them. It answers
    after `delay_s`; `alias_status` is what query/directory answers."""

    def __init__(self, ca, ip, delay_s=0.0, alias_status=200):
        self.port = free_port(ip)
        self.server_name = f"{ip}:{self.port}"
        self.requests = []
        self.delay_s = delay_s
        outer = self
        cert, key = ca.issue(f"peer-{ip}", ip)

        class Handler(http.server.BaseHTTPRequestHandler):
            def answer(self, status, doc):
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def handle_any(self, content):
                outer.requests.append((self.command, self.path, content))
                time.sleep(outer.delay_s)
                if self.path.startswith("/_matrix/federation/v1/publicRooms"):
                    self.answer(200, {"chunk": [{"room_id": "!far:peer", "name": "Far",
                                                 "num_joined_members": 3,
                                                 "world_readable": False,
                                                 "guest_can_join": False}],
                                      "total_room_count_estimate": 1})
                elif self.path.startswith("/_matrix/federation/v1/query/directory"):
                    if alias_status == 200:
                        self.answer(200, {"room_id": "!far:peer", "servers": ["peer"]})
                    else:
                        self.answer(alias_status, {"errcode": "M_FORBIDDEN", "error": "no"})
                else:
                    self.answer(404, {"errcode": "M_UNRECOGNIZED"})

            def do_GET(self):
                self.handle_any(None)

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                self.handle_any(json.loads(self.rfile.read(n)) if n else None)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer((ip, self.port), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def count(self, prefix):
        return sum(1 for _, path, _ in self.requests if path.startswith(prefix))

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def alias_path(alias):
    return f"{V3}/directory/room/{quote(alias)}"


class SharedPairTest(FederationTestCase):
    """A (TRUSTED) and B with the directory, shared by the class's tests."""

    def pair(self):
        return (self.start_class_fed(A_IP, TRUSTED, plugins=DIRECTORY),
                self.start_class_fed(B_IP, plugins=DIRECTORY))

    def counter(self, srv, name, labels=None):
        return srv.metric(name, labels) or 0

    def test_a_user_on_a_resolves_an_alias_of_b_and_reads_b_public_rooms(self):
        a, b = self.pair()
        # Each look-up from its own client key: a slot is given back only after the last
        # byte of its answer went out, so a client's next look-up may race it (ADR-0079).
        clients = iter(f"10.4.0.{i}" for i in range(1, 50))

        def look_up(path):
            return a.json("GET", path, headers={"X-Forwarded-For": next(clients)})

        bea = Client(b, register(b, "bea"))
        room = bea.create_room(room_alias_name="hub", visibility="public", name="Hub",
                               topic="B's hub")
        bea.create_room(room_alias_name="quiet", name="Unlisted")
        amy = Client(a, register(a, "amy"))
        alias = f"#hub:{b.server_name}"
        status, body = look_up(alias_path(alias))
        self.assertEqual((status, body["room_id"]), (200, room), body)
        self.assertEqual(body["servers"], [b.server_name])
        status, body = look_up(alias_path(f"#nothere:{b.server_name}"))
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"), body)

        status, body = look_up(f"{V3}/publicRooms?server={quote(b.server_name)}")
        self.assertEqual(status, 200, body)
        self.assertEqual([(r["room_id"], r["name"], r["canonical_alias"]) for r in body["chunk"]],
                         [(room, "Hub", alias)])
        status, body = amy.call("POST", f"{V3}/publicRooms?server={quote(b.server_name)}",
                                {"filter": {"generic_search_term": "nothing like it"}})
        self.assertEqual((status, body["chunk"]), (200, []), body)
        ann = Client(a, register(a, "ann"))  # another client key (see look_up)
        status, body = ann.call("POST", f"{V3}/publicRooms?server={quote(b.server_name)}",
                                {"filter": {"generic_search_term": "hub"}, "limit": 5})
        self.assertEqual([r["room_id"] for r in body["chunk"]], [room])
        # B's own federation routes need a signature.
        status, _, _ = b.fed_request("GET", "/_matrix/federation/v1/publicRooms")
        self.assertEqual(status, 401)

    def test_a_user_on_a_joins_through_an_alias_of_b_and_sees_what_is_said_on_b(self):
        a, b = self.pair()
        ok = {"outcome": "ok"}
        looked_up = self.counter(a, "atrium_directory_remote_lookups_total", ok)
        cache_hits = self.counter(a, "atrium_directory_remote_cache_hits_total")
        bea = Client(b, register(b, "bea2"))
        room = bea.create_room(room_alias_name="square", preset="public_chat", name="Square")
        amy = Client(a, register(a, "amy2"))
        alias = f"#square:{b.server_name}"
        # No server_name given: A asks B's directory, then joins through the servers it names.
        status, body = amy.call("POST", f"{V3}/join/{quote(alias)}", {}, timeout=30)
        self.assertEqual((status, body), (200, {"room_id": room}), body)
        self.assertEqual(self.counter(a, "atrium_directory_remote_lookups_total", ok),
                         looked_up + 1)
        # The wait for B's answer held no request-pool thread: it was parked, and the join
        # itself ran on the rooms module's remote pool.
        wait_until(lambda: a.metric("atrium_budget_in_use", {"budget": "outbound"}) == 0,
                   what="the look-up's slot returned with the request")
        self.assertEqual(a.metric("atrium_http_parked"), 0)
        members = bea.ok("GET", f"{V3}/rooms/{quote(room)}/members")["chunk"]
        self.assertEqual({e["state_key"]: e["content"]["membership"] for e in members},
                         {bea.user_id: "join", amy.user_id: "join"})
        bea.send(room, {"msgtype": "m.text", "body": "said on B"})

        def bodies():
            chunk = amy.ok("GET", f"{V3}/rooms/{quote(room)}/messages?dir=b&limit=20")["chunk"]
            return [e["content"].get("body") for e in chunk if e["type"] == "m.room.message"]

        wait_until(lambda: "said on B" in bodies(), what="B's message at A", timeout=20)
        # Joining again by the alias is answered from the cached look-up, and an alias B
        # does not have is B's 404, not a join.
        status, body = amy.call("POST", f"{V3}/join/{quote(alias)}", {}, timeout=30)
        self.assertEqual((status, body), (200, {"room_id": room}), body)
        self.assertEqual(self.counter(a, "atrium_directory_remote_cache_hits_total"),
                         cache_hits + 1)
        status, body = amy.call("POST", f"{V3}/join/{quote('#gone:' + b.server_name)}", {},
                                timeout=30)
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"), body)


    def test_a_canonical_alias_naming_an_alias_of_another_server_is_checked_with_that_server(self):
        a, b = self.pair()
        ok = {"outcome": "ok"}
        looked_up = self.counter(a, "atrium_directory_remote_lookups_total", ok)
        amy = Client(a, register(a, "amy3"))
        bea = Client(b, register(b, "bea3"))
        room = amy.create_room(room_alias_name="home", preset="public_chat")
        elsewhere = bea.create_room(room_alias_name="elsewhere")
        # bea joins amy's room through A, and gives it an alias on B.
        status, body = bea.call("POST", f"{V3}/join/{quote('#home:' + a.server_name)}", {},
                                timeout=30)
        self.assertEqual((status, body), (200, {"room_id": room}), body)
        bea.ok("PUT", alias_path(f"#visiting:{b.server_name}"), {"room_id": room})
        path = f"{V3}/rooms/{quote(room)}/state/m.room.canonical_alias"
        home = f"#home:{a.server_name}"
        # B's alias of this room is accepted; B's alias of another room is not; one B does
        # not have is B's 404.
        amy.ok("PUT", path, {"alias": home, "alt_aliases": [f"#visiting:{b.server_name}"]},
               timeout=30)
        status, body = amy.call("PUT", path, {"alias": home, "alt_aliases": [
            f"#visiting:{b.server_name}", f"#elsewhere:{b.server_name}"]}, timeout=30)
        self.assertEqual((status, body["errcode"]), (400, "M_BAD_ALIAS"), body)
        self.assertIn(f"#elsewhere:{b.server_name}", body["error"])
        status, body = amy.call("PUT", path, {"alias": f"#nothing:{b.server_name}"}, timeout=30)
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"), body)
        self.assertEqual(amy.state(room, "m.room.canonical_alias"),
                         {"alias": home, "alt_aliases": [f"#visiting:{b.server_name}"]})
        self.assertNotEqual(elsewhere, room)
        # Only new aliases are asked of B: #visiting once (the event names it after), then
        # #elsewhere; #nothing was B's refusal.
        self.assertEqual(self.counter(a, "atrium_directory_remote_lookups_total", ok),
                         looked_up + 2)

    def test_identical_look_ups_reach_the_peer_once_whether_concurrent_or_within_30_s(self):
        peer = CountingPeer(self.ca, PEER_IP, delay_s=1.0)
        self.addCleanup(peer.close)
        a, _ = self.pair()
        shared = self.counter(a, "atrium_directory_remote_shared_total")
        cache_hits = self.counter(a, "atrium_directory_remote_cache_hits_total")
        rooms = f"{V3}/publicRooms?server={quote(peer.server_name)}&limit=10"
        together = [Background(a.json, "GET", rooms, headers={"X-Forwarded-For": f"10.3.0.{i}"},
                               timeout=30) for i in (1, 2)]
        results = [t.result() for t in together]
        for status, body in results:
            self.assertEqual((status, body["chunk"][0]["room_id"]), (200, "!far:peer"), body)
        self.assertEqual(peer.count("/_matrix/federation/v1/publicRooms"), 1)
        self.assertEqual(self.counter(a, "atrium_directory_remote_shared_total"), shared + 1)
        status, body = a.json("GET", rooms, headers={"X-Forwarded-For": "10.3.0.3"})
        self.assertEqual(status, 200)
        self.assertEqual(peer.count("/_matrix/federation/v1/publicRooms"), 1)
        self.assertEqual(self.counter(a, "atrium_directory_remote_cache_hits_total"),
                         cache_hits + 1)
        # Another page is another look-up, asked with the peer's own token.
        status, body = a.json("GET", rooms + "&since=peer-token-2")
        self.assertEqual(status, 200)
        self.assertEqual(peer.count("/_matrix/federation/v1/publicRooms"), 2)
        self.assertIn("since=peer-token-2", peer.requests[-1][1])
        # POST with a filter is sent on as a POST with that filter.
        amy = Client(a, register(a, "amy_cache"))
        amy.ok("POST", f"{V3}/publicRooms?server={quote(peer.server_name)}",
               {"filter": {"generic_search_term": "far"}})
        self.assertEqual(peer.requests[-1][0], "POST")
        self.assertEqual(peer.requests[-1][2]["filter"], {"generic_search_term": "far"})

    def test_a_peer_refusing_the_look_up_is_an_error_for_the_client_not_an_empty_list(self):
        peer = CountingPeer(self.ca, PEER_IP, alias_status=403)
        self.addCleanup(peer.close)
        a, _ = self.pair()
        refused = {"outcome": "refused"}
        before = self.counter(a, "atrium_directory_remote_lookups_total", refused)
        status, body = a.json("GET", alias_path(f"#x:{peer.server_name}"))
        self.assertEqual(status, 502, body)
        self.assertIn("refused", body["error"])
        self.assertEqual(self.counter(a, "atrium_directory_remote_lookups_total", refused),
                         before + 1)


class OutboundBudgetTest(FederationTestCase):
    """ADR-0079: 4 request threads, so 2 remote look-ups at most, 1 per client."""

    def hung_peer(self):
        hung = HungServer(HUNG_IP)
        self.addCleanup(hung.close)
        return hung.server_name, hung.accepted

    def test_look_ups_on_a_hung_peer_park_take_the_budget_and_return_their_slots(self):
        name, accepted = self.hung_peer()
        a = self.start_fed(A_IP, {"server": {"http": {"request_threads": 4,
                                                      "trusted_proxies": ["127.0.0.1"]}}},
                           plugins={"directory": {"enabled": True, "remote_timeout_ms": 3000}})
        amy = Client(a, register(a, "amy"))

        def client(addr):
            return {"X-Forwarded-For": addr}

        rooms = f"{V3}/publicRooms?server={quote(name)}"

        def refused_at_once(addr, path, why):
            started = time.monotonic()
            status, headers, data = a.request("GET", path, headers=client(addr))
            self.assertLess(time.monotonic() - started, 1.0, why)
            body = json.loads(data)
            self.assertEqual((status, body["errcode"]), (429, "M_LIMIT_EXCEEDED"), why)
            self.assertIsInstance(body["retry_after_ms"], int)
            self.assertGreaterEqual(int(headers.get("Retry-After")), 1)

        first = Background(a.json, "GET", alias_path(f"#x:{name}"), headers=client("10.2.0.1"),
                           timeout=30)
        wait_until(lambda: a.metric("atrium_directory_remote_in_flight") == 1,
                   what="one look-up waiting on the hung peer")
        # One slot of two is free, but this client holds one already.
        refused_at_once("10.2.0.1", rooms + "&limit=4", "one per client key")
        second = Background(a.json, "GET", rooms, headers=client("10.2.0.2"), timeout=30)
        wait_until(lambda: a.metric("atrium_directory_remote_in_flight") == 2,
                   what="two look-ups waiting on the hung peer")
        self.assertEqual(a.metric("atrium_budget_in_use", {"budget": "outbound"}), 2)
        refused_at_once("10.2.0.3", rooms + "&limit=3", "half of 4 request threads in all")
        # Meanwhile everything that stays on this server answers at once, and the two
        # look-ups hold no request-pool thread: they are parked.
        for path in ("/_matrix/client/versions", f"{V3}/publicRooms", f"{V3}/sync?timeout=0"):
            started = time.monotonic()
            status, body = a.json("GET", path, token=amy.token)
            self.assertEqual(status, 200, (path, body))
            self.assertLess(time.monotonic() - started, 1.0, path)
        self.assertEqual(a.metric("atrium_http_parked"), 2)
        self.assertEqual(a.metric("atrium_http_handed_off"), 0)
        # Both end by the directory's deadline (3 s), well before the client's.
        for look_up in (first, second):
            status, body = look_up.result()
            self.assertEqual((status, body["errcode"]), (504, "M_UNKNOWN"), body)
        self.assertGreaterEqual(len(accepted), 1)
        wait_until(lambda: a.metric("atrium_budget_in_use", {"budget": "outbound"}) == 0,
                   what="slots returned")
        self.assertEqual(a.metric("atrium_directory_remote_lookups_total", {"outcome": "timeout"}), 2)
        self.assertEqual(a.metric("atrium_directory_remote_limited_total"), 2)
        status, headers, _ = a.request("GET", rooms, headers=client("10.2.0.5"))
        self.assertEqual(headers.get("Cache-Control"), "no-store")  # the failure is not kept

if __name__ == "__main__":
    import unittest
    unittest.main()
