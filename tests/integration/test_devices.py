"""Devices and passwords: listing and renaming devices, deleting them with the password
(user-interactive auth), and changing the password."""

import unittest
import uuid

from accounts import REGISTRATION_ON, login, register
from common import AtriumTestCase

DEVICES = "/_matrix/client/v3/devices"
WHOAMI = "/_matrix/client/v3/account/whoami"
PASSWORD = "/_matrix/client/v3/account/password"


def password_auth(account, session=None, user=None, password=None):
    auth = {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": user or account.user_id},
            "password": password or account.password}
    if session:
        auth["session"] = session
    return auth


class DevicesTest(AtriumTestCase):
    """The tests share one server (start_class_server), each with a henry of its own."""

    def setUp(self):
        self.srv = self.start_class_server(settings=REGISTRATION_ON)
        self.henry = f"henry{uuid.uuid4().hex[:8]}"
        self.phone = register(self.srv, self.henry, device_id="PHONE", initial_device_display_name="Henry's phone")
        self.laptop = login(self.srv, self.henry, self.phone.password, device_id="LAPTOP")

    def test_devices_are_listed_read_and_renamed(self):
        status, body = self.srv.json("GET", DEVICES, token=self.phone.token)
        self.assertEqual(status, 200)
        devices = {d["device_id"]: d for d in body["devices"]}
        self.assertEqual(set(devices), {"PHONE", "LAPTOP"})
        self.assertEqual(devices["PHONE"]["display_name"], "Henry's phone")
        self.assertIsInstance(devices["LAPTOP"]["last_seen_ts"], int)
        self.assertEqual(self.srv.json("PUT", DEVICES + "/LAPTOP", {"display_name": "Work"}, token=self.phone.token),
                         (200, {}))
        status, body = self.srv.json("GET", DEVICES + "/LAPTOP", token=self.phone.token)
        self.assertEqual((status, body["display_name"]), (200, "Work"))
        status, body = self.srv.json("GET", DEVICES + "/NOPE", token=self.phone.token)
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"))
        status, body = self.srv.json("PUT", DEVICES + "/NOPE", {"display_name": "x"}, token=self.phone.token)
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"))
        status, body = self.srv.json("PUT", DEVICES + "/LAPTOP", {"display_name": 3}, token=self.phone.token)
        self.assertEqual((status, body["errcode"]), (400, "M_BAD_JSON"))
        status, body = self.srv.json("PUT", DEVICES + "/LAPTOP", "[", token=self.phone.token)
        self.assertEqual((status, body["errcode"]), (400, "M_NOT_JSON"))

    def test_another_users_devices_are_invisible(self):
        other = register(self.srv, f"ivy{uuid.uuid4().hex[:8]}")
        status, body = self.srv.json("GET", DEVICES + "/PHONE", token=other.token)
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"))
        self.assertEqual([d["device_id"] for d in self.srv.json("GET", DEVICES, token=other.token)[1]["devices"]],
                         [other.device_id])

    def test_deleting_a_device_needs_the_password_and_revokes_its_token(self):
        status, challenge = self.srv.json("DELETE", DEVICES + "/LAPTOP", token=self.phone.token)
        self.assertEqual(status, 401)
        self.assertEqual(challenge["flows"], [{"stages": ["m.login.password"]}])
        self.assertEqual(self.srv.json("GET", WHOAMI, token=self.laptop.token)[0], 200)
        # A wrong password: 401 again, same session, with an errcode.
        status, body = self.srv.json("DELETE", DEVICES + "/LAPTOP", {
            "auth": password_auth(self.phone, challenge["session"], password="wrong")}, token=self.phone.token,
            timeout=60)
        self.assertEqual((status, body["errcode"], body["session"]), (401, "M_FORBIDDEN", challenge["session"]))
        # Someone else's name in the identifier is refused too.
        status, body = self.srv.json("DELETE", DEVICES + "/LAPTOP", {
            "auth": password_auth(self.phone, challenge["session"], user="@ivy:localhost")}, token=self.phone.token)
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"))
        status, body = self.srv.json("DELETE", DEVICES + "/LAPTOP", {
            "auth": password_auth(self.phone, challenge["session"])}, token=self.phone.token, timeout=60)
        self.assertEqual((status, body), (200, {}))
        status, body = self.srv.json("GET", WHOAMI, token=self.laptop.token)
        self.assertEqual((status, body["errcode"]), (401, "M_UNKNOWN_TOKEN"))
        self.assertEqual([d["device_id"] for d in self.srv.json("GET", DEVICES, token=self.phone.token)[1]["devices"]],
                         ["PHONE"])

    def test_a_session_of_another_user_is_refused(self):
        other = register(self.srv, f"jack{uuid.uuid4().hex[:8]}")
        _, theirs = self.srv.json("DELETE", DEVICES + "/X", token=other.token)
        status, body = self.srv.json("DELETE", DEVICES + "/LAPTOP", {
            "auth": password_auth(self.phone, theirs["session"])}, token=self.phone.token)
        self.assertEqual((status, body["errcode"]), (401, "M_UNKNOWN"))
        self.assertNotEqual(body["session"], theirs["session"])
        self.assertEqual(self.srv.json("GET", WHOAMI, token=self.laptop.token)[0], 200)

    def test_a_session_is_bound_to_the_request_that_began_it(self):
        tablet = login(self.srv, self.henry, self.phone.password, device_id="TABLET")
        status, challenge = self.srv.json("DELETE", DEVICES + "/LAPTOP", token=self.phone.token)
        self.assertEqual(status, 401)
        # The session began deleting LAPTOP: it cannot delete TABLET.
        status, body = self.srv.json("DELETE", DEVICES + "/TABLET", {
            "auth": password_auth(self.phone, challenge["session"])}, token=self.phone.token, timeout=60)
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"))
        self.assertEqual(self.srv.json("GET", WHOAMI, token=tablet.token)[0], 200)

    def test_a_resubmission_with_only_auth_completes_the_first_request(self):
        tablet = login(self.srv, self.henry, self.phone.password, device_id="TABLET")
        status, challenge = self.srv.json("POST", "/_matrix/client/v3/delete_devices",
                                          {"devices": ["LAPTOP", "TABLET"]}, token=self.phone.token)
        self.assertEqual(status, 401)
        status, body = self.srv.json("POST", "/_matrix/client/v3/delete_devices", {
            "auth": password_auth(self.phone, challenge["session"])}, token=self.phone.token, timeout=60)
        self.assertEqual((status, body), (200, {}))
        for gone in (self.laptop, tablet):
            self.assertEqual(self.srv.json("GET", WHOAMI, token=gone.token)[0], 401)
        self.assertEqual(self.srv.json("GET", WHOAMI, token=self.phone.token)[0], 200)

    def test_delete_devices_removes_several_at_once(self):
        tablet = login(self.srv, self.henry, self.phone.password, device_id="TABLET")
        status, challenge = self.srv.json("POST", "/_matrix/client/v3/delete_devices",
                                          {"devices": ["LAPTOP", "TABLET"]}, token=self.phone.token)
        self.assertEqual(status, 401)
        status, body = self.srv.json("POST", "/_matrix/client/v3/delete_devices", {
            "devices": ["LAPTOP", "TABLET"], "auth": password_auth(self.phone, challenge["session"])},
            token=self.phone.token, timeout=60)
        self.assertEqual((status, body), (200, {}))
        for gone in (self.laptop, tablet):
            self.assertEqual(self.srv.json("GET", WHOAMI, token=gone.token)[0], 401)
        self.assertEqual(self.srv.json("GET", WHOAMI, token=self.phone.token)[0], 200)

    def test_delete_devices_bad_bodies(self):
        status, body = self.srv.json("POST", "/_matrix/client/v3/delete_devices", {}, token=self.phone.token)
        self.assertEqual((status, body["errcode"]), (400, "M_MISSING_PARAM"))
        status, body = self.srv.json("POST", "/_matrix/client/v3/delete_devices", {"devices": "LAPTOP"},
                                     token=self.phone.token)
        self.assertEqual((status, body["errcode"]), (400, "M_BAD_JSON"))
        status, body = self.srv.json("POST", "/_matrix/client/v3/delete_devices", {"devices": ["A", 1]},
                                     token=self.phone.token)
        self.assertEqual((status, body["errcode"]), (400, "M_BAD_JSON"))
        status, body = self.srv.json("POST", "/_matrix/client/v3/delete_devices",
                                     {"devices": ["x" * 100] * 1000}, token=self.phone.token)
        self.assertEqual((status, body["errcode"]), (413, "M_TOO_LARGE"))

    def test_password_change_logs_out_other_devices_by_default(self):
        status, challenge = self.srv.json("POST", PASSWORD, {"new_password": "new one"}, token=self.phone.token)
        self.assertEqual(status, 401)
        status, body = self.srv.json("POST", PASSWORD, {
            "new_password": "new one", "auth": password_auth(self.phone, challenge["session"])},
            token=self.phone.token, timeout=60)
        self.assertEqual((status, body), (200, {}))
        self.assertEqual(self.srv.json("GET", WHOAMI, token=self.phone.token)[0], 200)
        self.assertEqual(self.srv.json("GET", WHOAMI, token=self.laptop.token)[0], 401)
        status, body = self.srv.json("POST", "/_matrix/client/v3/login", {
            "type": "m.login.password", "user": self.henry, "password": self.phone.password}, timeout=60)
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"))
        self.assertEqual(login(self.srv, self.henry, "new one").user_id, f"@{self.henry}:localhost")

    def test_password_change_can_keep_other_devices(self):
        status, body = self.srv.json("POST", PASSWORD, {
            "new_password": "another", "logout_devices": False, "auth": password_auth(self.phone)},
            token=self.phone.token, timeout=60)
        self.assertEqual((status, body), (200, {}))
        self.assertEqual(self.srv.json("GET", WHOAMI, token=self.laptop.token)[0], 200)

    def test_password_change_bad_bodies(self):
        status, body = self.srv.json("POST", PASSWORD, {"auth": password_auth(self.phone)},
                                     token=self.phone.token)
        self.assertEqual((status, body["errcode"]), (400, "M_MISSING_PARAM"))
        status, body = self.srv.json("POST", PASSWORD, {"new_password": 1}, token=self.phone.token)
        self.assertEqual((status, body["errcode"]), (400, "M_BAD_JSON"))
        status, body = self.srv.json("POST", PASSWORD, {"new_password": "x", "logout_devices": "yes"},
                                     token=self.phone.token)
        self.assertEqual((status, body["errcode"]), (400, "M_BAD_JSON"))
        status, body = self.srv.json("POST", PASSWORD, {"new_password": "x"})
        self.assertEqual((status, body["errcode"]), (401, "M_MISSING_TOKEN"))


if __name__ == "__main__":
    unittest.main()
