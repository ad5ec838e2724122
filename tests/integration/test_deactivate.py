"""Account deactivation (POST /account/deactivate with the password through user-interactive
auth): the account leaves every room it is joined to or invited to (room-mates see the leave
events), its tokens die at once, it can never log in again, its name stays taken (open and
shared-secret registration), erase: true clears its profile, and nobody else is affected.
"""

import hashlib
import hmac
import unittest

from accounts import REGISTRATION_ON, login, register
from harness import Server, psql
from rooms_client import V3, Client, quote

DEACTIVATE = f"{V3}/account/deactivate"
WHOAMI = f"{V3}/account/whoami"
ADMIN_REGISTER = "/_synapse/admin/v1/register"
SECRET = "deactivation test secret"
MEMBER = "m.room.member"
DEACTIVATE_ROOMS_MAX = 1000    # DEACTIVATE_ROOMS_MAX in core/client/accounts/deactivate.c
ID_SERVER_MAX_BYTES = 255      # DEACTIVATE_ID_SERVER_MAX_BYTES there
PASSWORD_TIMEOUT_S = 60        # Argon2id under ASan


def password_auth(account, session=None, password=None, user=None):
    auth = {"type": "m.login.password",
            "identifier": {"type": "m.id.user", "user": user or account.user_id},
            "password": password or account.password}
    if session:
        auth["session"] = session
    return auth


class DeactivateTest(unittest.TestCase):
    """One server for the class (registration costs an Argon2id hash per user); every test
    deactivates its own fresh user, with bob as the room-mate who watches."""

    @classmethod
    def setUpClass(cls):
        settings = {"registration": {**REGISTRATION_ON["registration"], "shared_secret": SECRET}}
        cls.srv = Server(settings=settings)
        cls.srv.__enter__()
        try:
            cls.bob = Client(cls.srv, register(cls.srv, "bob"))
        except BaseException:
            cls.srv.__exit__(None, None, None)
            raise

    @classmethod
    def tearDownClass(cls):
        cls.srv.__exit__(None, None, None)

    # -- helpers ----------------------------------------------------------------------

    def deactivate(self, account, token=None, **body):
        """The whole UIA dance: the 401 challenge, then the password with its session."""
        token = token or account.token
        status, challenge = self.srv.json("POST", DEACTIVATE, body, token=token)
        self.assertEqual(status, 401, challenge)
        self.assertEqual(challenge["flows"], [{"stages": ["m.login.password"]}])
        body["auth"] = password_auth(account, challenge["session"])
        return self.srv.json("POST", DEACTIVATE, body, token=token, timeout=PASSWORD_TIMEOUT_S)

    def assertError(self, answer, status, errcode):
        got_status, body = answer
        self.assertEqual((got_status, (body or {}).get("errcode")), (status, errcode), body)

    def timeline(self, answer, room, section="join"):
        return answer["rooms"][section].get(room, {}).get("timeline", {}).get("events", [])

    def memberships_of(self, events, user_id):
        return [e["content"]["membership"] for e in events
                if e["type"] == MEMBER and e.get("state_key") == user_id]

    def db(self, sql):
        return psql(sql, database=self.srv.database)

    # -- what deactivation does -------------------------------------------------------

    def test_the_user_leaves_joined_and_invited_rooms_and_room_mates_see_it(self):
        dana = register(self.srv, "dana")
        joined = self.bob.create_room(preset="public_chat", name="Joined")
        Client(self.srv, dana).join(joined)
        invited = self.bob.create_room(preset="private_chat", name="Invited")
        self.assertEqual(self.bob.member_action(invited, "invite", dana.user_id)[0], 200)
        since = self.bob.sync()["next_batch"]

        self.assertEqual(self.deactivate(dana), (200, {"id_server_unbind_result": "no-support"}))

        answer = self.bob.sync(since=since)
        for room in (joined, invited):
            events = self.timeline(answer, room)
            self.assertEqual(self.memberships_of(events, dana.user_id), ["leave"], events)
            leave = [e for e in events if e.get("state_key") == dana.user_id][0]
            self.assertEqual(leave["sender"], dana.user_id)
            self.assertEqual(self.bob.state(room, MEMBER, dana.user_id)["membership"], "leave")
        members = self.bob.ok("GET", f"{V3}/rooms/{quote(joined)}/joined_members")["joined"]
        self.assertEqual(set(members), {self.bob.user_id})
        # Bob goes on as before; without erase, dana's profile stays.
        self.bob.send(joined, {"msgtype": "m.text", "body": "still here"})
        self.assertEqual(self.srv.json("GET", WHOAMI, token=self.bob.token)[0], 200)
        self.assertEqual(self.srv.json("GET", f"{V3}/profile/{quote(dana.user_id)}"),
                         (200, {"displayname": "dana"}))
        self.assertIn(f"deactivated {dana.user_id}: left 2 rooms, 0 failed", self.srv.log_text())
        # Nobody can invite the account back.
        answer = self.bob.member_action(joined, "invite", dana.user_id)
        self.assertError(answer, 403, "M_FORBIDDEN")
        self.assertIn("deactivated", answer[1]["error"])

    def test_every_token_dies_at_once_and_login_is_refused(self):
        phone = register(self.srv, "erin", device_id="PHONE")
        laptop = login(self.srv, "erin", phone.password, device_id="LAPTOP")
        for token in (phone.token, laptop.token):  # both tokens are in the token cache now
            self.assertEqual(self.srv.json("GET", WHOAMI, token=token)[0], 200)

        self.assertEqual(self.deactivate(phone)[0], 200)

        for token in (phone.token, laptop.token):
            self.assertError(self.srv.json("GET", WHOAMI, token=token), 401, "M_UNKNOWN_TOKEN")
        # A second deactivation with the old token: the token is gone.
        again = self.srv.json("POST", DEACTIVATE, {"auth": password_auth(phone)}, token=phone.token)
        self.assertError(again, 401, "M_UNKNOWN_TOKEN")
        for password in (phone.password, "any other password"):
            body = {"type": "m.login.password", "password": password,
                    "identifier": {"type": "m.id.user", "user": "erin"}}
            answer = self.srv.json("POST", f"{V3}/login", body, timeout=PASSWORD_TIMEOUT_S)
            self.assertError(answer, 403, "M_USER_DEACTIVATED")
        self.assertEqual(self.db(f"SELECT deactivated, password_hash IS NULL FROM users"
                                 f" WHERE user_id = '{phone.user_id}'"), [["t", "t"]])
        devices = self.db(f"SELECT count(*) FROM devices WHERE user_id = '{phone.user_id}'")
        self.assertEqual(devices, [["0"]])

    def test_the_name_stays_taken(self):
        gus = register(self.srv, "gus")
        self.assertEqual(self.deactivate(gus)[0], 200)

        available = self.srv.json("GET", f"{V3}/register/available?username=gus")
        self.assertError(available, 400, "M_USER_IN_USE")
        body = {"username": "gus", "password": "a new password"}
        status, answer = self.srv.json("POST", f"{V3}/register", body)
        if status == 401:  # the name is checked before or after the dummy stage
            body["auth"] = {"type": "m.login.dummy", "session": answer["session"]}
            status, answer = self.srv.json("POST", f"{V3}/register", body,
                                           timeout=PASSWORD_TIMEOUT_S)
        self.assertEqual((status, answer.get("errcode")), (400, "M_USER_IN_USE"), answer)
        status, answer = self.srv.json("GET", ADMIN_REGISTER)
        self.assertEqual(status, 200, answer)
        nonce = answer["nonce"]
        message = b"\x00".join([nonce.encode(), b"gus", b"pw", b"notadmin"])
        mac = hmac.new(SECRET.encode(), message, hashlib.sha1).hexdigest()
        request = {"nonce": nonce, "username": "gus", "password": "pw", "mac": mac}
        answer = self.srv.json("POST", ADMIN_REGISTER, request, timeout=PASSWORD_TIMEOUT_S)
        self.assertError(answer, 400, "M_USER_IN_USE")

    def test_erase_clears_the_profile_and_the_directory_forgets_the_user(self):
        hal = register(self.srv, "hal")
        profile = f"{V3}/profile/{quote(hal.user_id)}"
        for field, value in (("displayname", "Hal Nine"), ("avatar_url", "mxc://localhost/hal")):
            self.assertEqual(self.srv.json("PUT", f"{profile}/{field}", {field: value},
                                           token=hal.token), (200, {}))
        room = self.bob.create_room(preset="public_chat")
        Client(self.srv, hal).join(room)
        search = {"search_term": "Hal Nine"}
        found = self.bob.ok("POST", f"{V3}/user_directory/search", search)["results"]
        self.assertEqual([r["user_id"] for r in found], [hal.user_id])

        self.assertEqual(self.deactivate(hal, erase=True, id_server="id.example.org")[0], 200)

        self.assertEqual(self.srv.json("GET", profile), (200, {}))
        self.assertError(self.srv.json("GET", profile + "/displayname"), 404, "M_NOT_FOUND")
        self.assertEqual(self.bob.ok("POST", f"{V3}/user_directory/search", search)["results"], [])
        self.assertEqual(self.bob.ok("POST", f"{V3}/user_directory/search",
                                     {"search_term": hal.user_id})["results"], [])

    # -- what is refused --------------------------------------------------------------

    def test_bad_requests_are_refused_and_leave_the_account_alone(self):
        ivy = register(self.srv, "ivy")
        status, challenge = self.srv.json("POST", DEACTIVATE, {}, token=ivy.token)
        self.assertEqual(status, 401)
        self.assertNotIn("errcode", challenge)
        session = challenge["session"]
        status, empty = self.srv.json("POST", DEACTIVATE, token=ivy.token)  # no body at all
        self.assertEqual((status, empty["flows"]), (401, [{"stages": ["m.login.password"]}]))
        # A wrong password: 401 again, same session, with M_FORBIDDEN.
        wrong = {"auth": password_auth(ivy, session, password="wrong")}
        status, body = self.srv.json("POST", DEACTIVATE, wrong, token=ivy.token,
                                     timeout=PASSWORD_TIMEOUT_S)
        self.assertEqual((status, body["errcode"], body["session"]), (401, "M_FORBIDDEN", session))
        # Authenticating as somebody else.
        as_bob = {"auth": password_auth(ivy, session, user=self.bob.user_id)}
        status, body = self.srv.json("POST", DEACTIVATE, as_bob, token=ivy.token)
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"))
        # A session issued for another operation (a password change).
        status, other = self.srv.json("POST", f"{V3}/account/password", {"new_password": "x"},
                                      token=ivy.token)
        self.assertEqual(status, 401)
        foreign = {"auth": password_auth(ivy, other["session"])}
        status, body = self.srv.json("POST", DEACTIVATE, foreign, token=ivy.token)
        self.assertEqual((status, body["errcode"]), (401, "M_UNKNOWN"))
        # Another stage type.
        dummy = {"auth": {"type": "m.login.dummy", "session": session}}
        status, body = self.srv.json("POST", DEACTIVATE, dummy, token=ivy.token)
        self.assertEqual((status, body["errcode"]), (401, "M_UNKNOWN"))
        cases = [
            ({"auth": {"type": "m.login.password", "session": session}}, 400, "M_MISSING_PARAM"),
            ({"auth": password_auth(ivy, session), "erase": "yes"}, 400, "M_BAD_JSON"),
            ({"auth": password_auth(ivy, session), "id_server": 5}, 400, "M_BAD_JSON"),
            ({"auth": password_auth(ivy, session), "id_server": "x" * (ID_SERVER_MAX_BYTES + 1)},
             400, "M_INVALID_PARAM"),
            ({"auth": "password"}, 400, "M_BAD_JSON"),
            ({"auth": {**password_auth(ivy, session), "password": 7}}, 400, "M_BAD_JSON"),
            ("{", 400, "M_NOT_JSON"),
            ("[]", 400, "M_NOT_JSON"),
        ]
        for body, want_status, want_code in cases:
            with self.subTest(body=body):
                self.assertError(self.srv.json("POST", DEACTIVATE, body, token=ivy.token,
                                               headers={"Content-Type": "application/json"}),
                                 want_status, want_code)
        self.assertError(self.srv.json("POST", DEACTIVATE, {"auth": password_auth(ivy)}),
                         401, "M_MISSING_TOKEN")
        self.assertError(self.srv.json("GET", DEACTIVATE, token=ivy.token),
                         405, "M_UNRECOGNIZED")
        self.assertError(self.srv.json("POST", DEACTIVATE, {"pad": "x" * 70000}, token=ivy.token),
                         413, "M_TOO_LARGE")
        # Nothing happened to the account.
        self.assertEqual(self.srv.json("GET", WHOAMI, token=ivy.token)[0], 200)
        self.assertEqual(login(self.srv, "ivy", ivy.password).user_id, ivy.user_id)

    # -- the limit --------------------------------------------------------------------

    def test_at_most_the_cap_of_rooms_is_left(self):
        """Rooms past DEACTIVATE_ROOMS_MAX keep the membership: the user is put in more rooms
        than that straight in the database (rooms that do not exist, so each leave fails fast
        and is counted as failed) and exactly the cap's worth are tried."""
        jo = register(self.srv, "jo")
        extra = 5
        rows = ",".join(f"('!cap{i:05d}:localhost', '{MEMBER}', '{jo.user_id}', '$cap{i}', 'join')"
                        for i in range(DEACTIVATE_ROOMS_MAX + extra))
        self.db("INSERT INTO current_state (room_id, type, state_key, event_id, membership)"
                " VALUES " + rows)
        try:
            self.assertEqual(self.deactivate(jo)[0], 200)
            log = self.srv.log_text()
            self.assertIn(f"{jo.user_id} was deactivated; it is in more than "
                          f"{DEACTIVATE_ROOMS_MAX} rooms", log)
            self.assertIn(f"deactivated {jo.user_id}: left 0 rooms, {DEACTIVATE_ROOMS_MAX} failed",
                          log)
            tried = log.count(f"deactivating {jo.user_id}: it stays in room")
            self.assertEqual(tried, DEACTIVATE_ROOMS_MAX)
        finally:
            self.db(f"DELETE FROM current_state WHERE state_key = '{jo.user_id}'"
                    " AND room_id LIKE '!cap%'")
        self.assertError(self.srv.json("GET", WHOAMI, token=jo.token), 401, "M_UNKNOWN_TOKEN")


if __name__ == "__main__":
    unittest.main()
