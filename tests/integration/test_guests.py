"""Guest access (registration.guest_access, off by default): POST /register?kind=guest
makes a passwordless account with a token at once; a guest may use only the endpoints the
spec opens to guests (403 M_GUEST_ACCESS_FORBIDDEN elsewhere), may send only m.room.message
events, and joins only rooms whose m.room.guest_access is can_join."""

from accounts import REGISTRATION_ON, register
from harness import AtriumTestCase
from rooms_client import V3, Client, quote

GUESTS_ON = {"registration": {"enabled": True, "guest_access": True}}


def register_guest(srv, prefix=V3):
    status, body = srv.json("POST", f"{prefix}/register?kind=guest",
                            {"initial_device_display_name": "guest phone"})
    if status != 200:
        raise AssertionError(f"guest registration: {status} {body}")
    return body


class GuestsOffTest(AtriumTestCase):
    def test_guest_registration_is_refused_by_default(self):
        srv = self.start_server(settings=REGISTRATION_ON)
        status, body = srv.json("POST", f"{V3}/register?kind=guest", {})
        self.assertEqual((status, body["errcode"]), (403, "M_GUEST_ACCESS_FORBIDDEN"))


class GuestsTest(AtriumTestCase):
    def setUp(self):
        self.srv = self.start_server(settings=GUESTS_ON)
        self.host = Client(self.srv, register(self.srv, "host"))
        answer = register_guest(self.srv)
        self.guest_id, self.token = answer["user_id"], answer["access_token"]
        self.assertIn("device_id", answer)

    def call(self, method, path, body=None):
        return self.srv.json(method, path, body, token=self.token)

    def test_a_guest_is_a_guest_and_reaches_only_the_guest_endpoints(self):
        status, me = self.call("GET", f"{V3}/account/whoami")
        self.assertEqual((status, me["user_id"], me["is_guest"]), (200, self.guest_id, True))
        self.assertEqual(self.call("GET", f"{V3}/sync?timeout=0")[0], 200)
        self.assertEqual(self.call("GET", "/_matrix/client/r0/sync?timeout=0")[0], 200)
        self.assertEqual(self.call("PUT", f"{V3}/profile/{quote(self.guest_id)}/displayname",
                                   {"displayname": "Visitor"})[0], 200)
        for method, path, body in (
                ("POST", f"{V3}/createRoom", {}),
                ("GET", f"{V3}/pushrules/", None),
                ("PUT", f"{V3}/profile/{quote(self.guest_id)}/avatar_url", {"avatar_url": "mxc://x/y"}),
                ("POST", f"{V3}/user_directory/search", {"search_term": "host"}),
                ("POST", "/_matrix/client/r0/createRoom", {})):
            status, answer = self.call(method, path, body)
            self.assertEqual((status, answer.get("errcode")), (403, "M_GUEST_ACCESS_FORBIDDEN"), path)
        # A guest has no password: it cannot log in again.
        status, _ = self.srv.json("POST", f"{V3}/login", {
            "type": "m.login.password", "identifier": {"type": "m.id.user", "user": self.guest_id},
            "password": ""})
        self.assertIn(status, (400, 403))

    def test_a_guest_joins_only_rooms_open_to_guests_and_sends_only_messages(self):
        closed = self.host.create_room(preset="public_chat")
        status, body = self.call("POST", f"{V3}/rooms/{quote(closed)}/join", {})
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"))
        room = self.host.create_room(preset="public_chat")
        self.host.put_state(room, "m.room.guest_access", {"guest_access": "can_join"})
        self.assertEqual(self.call("POST", f"{V3}/join/{quote(room)}", {})[0], 200)
        status, sent = self.call("PUT", f"{V3}/rooms/{quote(room)}/send/m.room.message/g1",
                                 {"msgtype": "m.text", "body": "hello from a guest"})
        self.assertEqual(status, 200, sent)
        status, body = self.call("PUT", f"{V3}/rooms/{quote(room)}/send/m.reaction/g2", {})
        self.assertEqual((status, body["errcode"]), (403, "M_GUEST_ACCESS_FORBIDDEN"))
        status, body = self.call("PUT", f"{V3}/rooms/{quote(room)}/state/m.room.topic/", {"topic": "x"})
        self.assertEqual((status, body["errcode"]), (403, "M_GUEST_ACCESS_FORBIDDEN"))
        chunk = self.call("GET", f"{V3}/rooms/{quote(room)}/messages?dir=b&limit=5")[1]["chunk"]
        self.assertIn("hello from a guest", [e["content"].get("body") for e in chunk])
        self.assertEqual(self.call("POST", f"{V3}/rooms/{quote(room)}/leave", {})[0], 200)
