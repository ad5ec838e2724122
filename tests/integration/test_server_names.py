"""Server names taken from a request are checked against the spec's grammar at once: a
name that is not one (`..`, `a..b`, `localhost/../..`) in a media path, a user ID, a room
ID or alias, or a `server_name`/`via` query parameter is a 400 for the client, answered
before any discovery, never a 502 and never an entry in the destination back-off.

One server for the class (media and directory plugins on); every request here is refused
before it changes anything."""

import os
import tempfile
import time

from accounts import REGISTRATION_ON, register
from harness import Server
from rooms_client import V3, Client, quote
import unittest

PROMPT_S = 2.0  # "at once": well under any federation timeout
MEDIA = "/_matrix/client/v1/media"
BAD_NAMES = ["..", "a..b", ".example.org", "example.org.", "host:99999", "[zz]"]


class ServerNamesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="atrium-names-")
        cls.srv = Server(settings=REGISTRATION_ON, plugins={
            "media": {"enabled": True, "store_path": os.path.join(cls.tmp, "media_store")},
            "directory": {"enabled": True}})
        cls.srv.__enter__()
        try:
            cls.alice = Client(cls.srv, register(cls.srv, "alice"))
        except BaseException:
            cls.srv.__exit__(None, None, None)
            raise

    @classmethod
    def tearDownClass(cls):
        cls.srv.__exit__(None, None, None)

    def refused(self, method, path, body=None, errcode="M_INVALID_PARAM"):
        start = time.monotonic()
        status, answer = self.alice.call(method, path, body)
        took = time.monotonic() - start
        self.assertEqual((status, (answer or {}).get("errcode")), (400, errcode),
                         f"{method} {path}: {answer}")
        self.assertLess(took, PROMPT_S, f"{method} {path} took {took:.2f} s")
        return answer

    def federation_marks(self):
        """What a discovery or a recorded failure would move."""
        return (self.srv.metric("atrium_federation_backoff_destinations"),
                self.srv.metric("atrium_federation_discovery_failed_total"),
                self.srv.metric("atrium_federation_discovery_total"))

    def setUp(self):
        self.marks = self.federation_marks()

    def assert_no_backoff(self):
        self.assertEqual(self.federation_marks(), self.marks,
                         "a name that is not one was looked up or backed off")

    def test_media_paths_with_a_name_that_is_not_one_are_400(self):
        for name in BAD_NAMES + ["a%2Fb"]:
            server = quote(name) if "%" not in name else name
            self.refused("GET", f"{MEDIA}/download/{server}/abcdef")
            self.refused("GET", f"{MEDIA}/download/{server}/abcdef/file.png")
            self.refused("GET", f"{MEDIA}/thumbnail/{server}/abcdef?width=32&height=32")
        # Unquoted, as a client that builds paths by concatenation sends it.
        self.refused("GET", f"{MEDIA}/download/../abcdef")
        self.refused("GET", f"{MEDIA}/thumbnail/../abcdef?width=32&height=32")
        self.refused("GET", f"{MEDIA}/download/a..b/abcdef")
        self.assert_no_backoff()

    def test_profile_of_a_user_on_a_name_that_is_not_one_is_400(self):
        self.refused("GET", f"{V3}/profile/@u:localhost%2F..%2F..")
        for name in BAD_NAMES:
            self.refused("GET", f"{V3}/profile/{quote('@u:' + name)}")
            self.refused("GET", f"{V3}/profile/{quote('@u:' + name)}/displayname")
        self.assert_no_backoff()

    def test_aliases_room_ids_and_vias_with_a_name_that_is_not_one_are_400(self):
        for name in BAD_NAMES:
            self.refused("GET", f"{V3}/directory/room/{quote('#room:' + name)}")
            self.refused("POST", f"{V3}/join/{quote('#room:' + name)}", {})
            self.refused("POST", f"{V3}/join/{quote('!room:' + name)}", {})
            self.refused("POST", f"{V3}/knock/{quote('!room:' + name)}", {})
            self.refused("POST", f"{V3}/join/{quote('!room:example.org')}?server_name={quote(name)}", {})
            self.refused("POST", f"{V3}/join/{quote('!room:example.org')}?via={quote(name)}", {})
            self.refused("GET", f"{V3}/publicRooms?server={quote(name)}")
        self.assert_no_backoff()

    def test_device_keys_of_users_on_a_name_that_is_not_one_are_400(self):
        # A client asks other servers for keys and one-time keys by user ID: a name that is
        # not one is refused before any server is asked, like every other way a name enters.
        for name in BAD_NAMES + ["localhost/../.."]:
            user = "@u:" + name
            self.refused("POST", f"{V3}/keys/query", {"device_keys": {user: []}})
            self.refused("POST", f"{V3}/keys/claim",
                         {"one_time_keys": {user: {"DEV": "signed_curve25519"}}})
        self.refused("POST", f"{V3}/keys/query",
                     {"device_keys": {self.alice.user_id: [], "no-sigil:localhost": []}})
        self.assert_no_backoff()

    def test_good_names_still_reach_the_federation_path(self):
        # A well-formed name is asked (here a closed port: it fails as a peer's failure, at
        # once), so the check refuses only names that are not names.
        status, answer = self.alice.call("GET", f"{V3}/profile/{quote('@u:127.0.0.1:1')}")
        self.assertNotEqual(status, 400, answer)
        self.assertNotEqual(self.federation_marks()[2], self.marks[2], "it was looked up")


if __name__ == "__main__":
    unittest.main()
