"""Account helpers for integration tests: start a server with registration open, register
users and log them in through the real endpoints (the UIA dance included).

    from accounts import REGISTRATION_ON, register, login

    srv = self.start_server(settings=REGISTRATION_ON)
    alice = register(srv, "alice")          # Account(user_id, token, device_id, password)
    again = login(srv, "alice", alice.password, device_id="PHONE")
    status, body = deactivate(srv, alice, erase=True)

Argon2id hashing costs some tens of milliseconds per account (more under ASan): register
the few users a test needs, not hundreds.
"""

import collections
import urllib.parse

REGISTRATION_ON = {"registration": {"enabled": True}}
DEFAULT_PASSWORD = "correct horse battery staple"

Account = collections.namedtuple("Account", "user_id token device_id password")


def register(srv, username, password=DEFAULT_PASSWORD, device_id=None, **extra):
    """Registers username (401 challenge, then m.login.dummy) and returns an Account;
    raises AssertionError with the server's answer when either step goes wrong."""
    body = {"username": username, "password": password, **extra}
    if device_id is not None:
        body["device_id"] = device_id
    status, challenge = srv.json("POST", "/_matrix/client/v3/register", body)
    if status != 401 or "session" not in (challenge or {}):
        raise AssertionError(f"register {username}: expected the 401 challenge, got {status} {challenge}")
    body["auth"] = {"type": "m.login.dummy", "session": challenge["session"]}
    status, answer = srv.json("POST", "/_matrix/client/v3/register", body, timeout=60)
    if status != 200:
        raise AssertionError(f"register {username}: {status} {answer}")
    return Account(answer["user_id"], answer.get("access_token"), answer.get("device_id"), password)


def login(srv, user, password=DEFAULT_PASSWORD, device_id=None):
    """Password login with an m.id.user identifier; returns an Account."""
    body = {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": user},
            "password": password}
    if device_id is not None:
        body["device_id"] = device_id
    status, answer = srv.json("POST", "/_matrix/client/v3/login", body, timeout=60)
    if status != 200:
        raise AssertionError(f"login {user}: {status} {answer}")
    return Account(answer["user_id"], answer["access_token"], answer["device_id"], password)


def deactivate(srv, account, **body):
    """POST /account/deactivate through its UIA: the 401 challenge, then the account's
    password with the session. Returns (status, body) of the second step."""
    path = "/_matrix/client/v3/account/deactivate"
    status, challenge = srv.json("POST", path, body, token=account.token)
    if status != 401 or "session" not in (challenge or {}):
        raise AssertionError(f"deactivate {account.user_id}: expected the 401 challenge, got "
                             f"{status} {challenge}")
    body["auth"] = {"type": "m.login.password", "session": challenge["session"],
                    "identifier": {"type": "m.id.user", "user": account.user_id},
                    "password": account.password}
    return srv.json("POST", path, body, token=account.token, timeout=60)


def quote(value):
    """A path segment: user IDs, room IDs and types percent-encoded."""
    return urllib.parse.quote(value, safe="")
