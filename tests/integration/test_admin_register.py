"""Shared-secret admin registration (the Synapse-shaped /_synapse/admin/v1/register) and the
`atrium register-user` command that speaks it."""

import hashlib
import hmac
import subprocess
import unittest

from accounts import login
from common import AtriumTestCase
from harness import atrium_bin

ADMIN_REGISTER = "/_synapse/admin/v1/register"
SECRET = "s3cret shared with the operator"


def mac(nonce, username, password, admin, secret=SECRET):
    message = b"\x00".join([nonce.encode(), username.encode(), password.encode(),
                            b"admin" if admin else b"notadmin"])
    return hmac.new(secret.encode(), message, hashlib.sha1).hexdigest()


class AdminRegisterTest(AtriumTestCase):
    """The tests share one server (start_class_server): each registers names of its own
    (root, once, mallory, dup, operator) and takes nonces of its own."""

    def setUp(self):
        # Open registration stays off: admin registration does not depend on it.
        self.srv = self.start_class_server(settings={"registration": {"shared_secret": SECRET}})

    def nonce(self):
        status, body = self.srv.json("GET", ADMIN_REGISTER)
        self.assertEqual(status, 200)
        return body["nonce"]

    def test_a_correct_mac_creates_an_admin_who_can_log_in(self):
        nonce = self.nonce()
        status, body = self.srv.json("POST", ADMIN_REGISTER, {
            "nonce": nonce, "username": "root", "password": "pw", "admin": True,
            "mac": mac(nonce, "root", "pw", True)}, timeout=60)
        self.assertEqual(status, 200, body)
        self.assertEqual(body["user_id"], "@root:localhost")
        self.assertEqual(body["home_server"], "localhost")
        status, me = self.srv.json("GET", "/_matrix/client/v3/account/whoami", token=body["access_token"])
        self.assertEqual((status, me["user_id"]), (200, "@root:localhost"))
        self.assertEqual(login(self.srv, "root", "pw").user_id, "@root:localhost")

    def test_a_nonce_works_once(self):
        nonce = self.nonce()
        request = {"nonce": nonce, "username": "once", "password": "pw", "mac": mac(nonce, "once", "pw", False)}
        self.assertEqual(self.srv.json("POST", ADMIN_REGISTER, request, timeout=60)[0], 200)
        request["username"], request["mac"] = "twice", mac(nonce, "twice", "pw", False)
        status, body = self.srv.json("POST", ADMIN_REGISTER, request)
        self.assertEqual((status, body["errcode"]), (400, "M_UNKNOWN"))

    def test_a_wrong_mac_is_refused_and_burns_the_nonce(self):
        nonce = self.nonce()
        bad = {"nonce": nonce, "username": "mallory", "password": "pw", "admin": True,
               "mac": mac(nonce, "mallory", "pw", False)}  # signed as notadmin, asks for admin
        status, body = self.srv.json("POST", ADMIN_REGISTER, bad)
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"))
        status, body = self.srv.json("POST", ADMIN_REGISTER, {**bad, "admin": False})
        self.assertEqual((status, body["errcode"]), (400, "M_UNKNOWN"))
        nonce = self.nonce()
        status, body = self.srv.json("POST", ADMIN_REGISTER, {
            "nonce": nonce, "username": "mallory", "password": "pw",
            "mac": mac(nonce, "mallory", "pw", False, secret="guessed")})
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"))

    def test_an_unknown_nonce_is_refused(self):
        status, body = self.srv.json("POST", ADMIN_REGISTER, {
            "nonce": "abc", "username": "x", "password": "pw", "mac": mac("abc", "x", "pw", False)})
        self.assertEqual((status, body["errcode"]), (400, "M_UNKNOWN"))

    def test_bad_bodies_and_taken_or_invalid_names(self):
        status, body = self.srv.json("POST", ADMIN_REGISTER, "nope", headers={"Content-Type": "application/json"})
        self.assertEqual((status, body["errcode"]), (400, "M_NOT_JSON"))
        status, body = self.srv.json("POST", ADMIN_REGISTER, {"nonce": "n", "username": "x", "password": "pw"})
        self.assertEqual((status, body["errcode"]), (400, "M_MISSING_PARAM"))
        status, body = self.srv.json("POST", ADMIN_REGISTER, {"nonce": "n", "username": "x", "password": "pw",
                                                              "mac": "m", "admin": "yes"})
        self.assertEqual((status, body["errcode"]), (400, "M_BAD_JSON"))
        nonce = self.nonce()
        status, body = self.srv.json("POST", ADMIN_REGISTER, {
            "nonce": nonce, "username": "bad name", "password": "pw", "mac": mac(nonce, "bad name", "pw", False)})
        self.assertEqual((status, body["errcode"]), (400, "M_INVALID_USERNAME"))
        for expect in (200, 400):
            nonce = self.nonce()
            status, body = self.srv.json("POST", ADMIN_REGISTER, {
                "nonce": nonce, "username": "dup", "password": "pw", "mac": mac(nonce, "dup", "pw", False)},
                timeout=60)
            self.assertEqual(status, expect, body)
        self.assertEqual(body["errcode"], "M_USER_IN_USE")

    def test_cli_registers_a_user_against_the_running_server(self):
        proc = subprocess.run([atrium_bin(), "register-user", "--config", self.srv.config_path,
                               "--user", "operator", "--password", "op pw", "--admin"],
                              capture_output=True, text=True, timeout=60)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stdout.strip(), "@operator:localhost")
        self.assertEqual(login(self.srv, "operator", "op pw").user_id, "@operator:localhost")
        # Again: the server's refusal is printed and the exit code is not 0.
        proc = subprocess.run([atrium_bin(), "register-user", "--config", self.srv.config_path,
                               "--url", self.srv.base, "--user", "operator"],
                              input="op pw\n", capture_output=True, text=True, timeout=60)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("M_USER_IN_USE", proc.stderr)

    def test_cli_usage_errors_exit_2(self):
        proc = subprocess.run([atrium_bin(), "register-user", "--user", "x"], capture_output=True, text=True,
                              timeout=30)
        self.assertEqual(proc.returncode, 2)
        self.assertIn("usage", proc.stderr)


class AdminRegisterOffTest(AtriumTestCase):
    def test_without_a_shared_secret_the_endpoint_is_404_and_the_cli_says_why(self):
        srv = self.start_server(settings={"registration": {"enabled": True}})
        for method, body in (("GET", None), ("POST", {"nonce": "n"})):
            status, answer = srv.json(method, ADMIN_REGISTER, body)
            self.assertEqual((status, answer["errcode"]), (404, "M_UNRECOGNIZED"), method)
        proc = subprocess.run([atrium_bin(), "register-user", "--config", srv.config_path, "--user", "x",
                               "--password", "y"], capture_output=True, text=True, timeout=30)
        self.assertEqual(proc.returncode, 1)
        self.assertIn("shared_secret", proc.stderr)


if __name__ == "__main__":
    unittest.main()
