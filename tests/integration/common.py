"""Shared set-up for the integration tests: a server with the test plugin loaded, and small
helpers for concurrent requests and polling metrics."""

import os
import threading
import time
import unittest

from harness import AtriumTestCase, Server, mark_on_failure, start_shared, test_plugin_dir  # noqa: F401  (re-exported)


def testplug(name="testplug", **settings):
    """plugins entry loading one of the test plugins from build/tests/plugins."""
    return {name: {"enabled": True, "path": os.path.join(test_plugin_dir(), f"{name}.so"), **settings}}


def with_testplug(**settings):
    plugins = {"media": {"enabled": True}, "directory": {"enabled": True}}
    plugins.update(testplug(**settings))
    return plugins


_module_servers = {}


def start_module_server(test, **kwargs):
    """A server that every test of test's module asking with the same Server(**kwargs)
    shares, across classes (start_class_server shares within one class): see
    module_server."""
    key = (type(test).__module__, repr(sorted(kwargs.items())))
    return module_server(test, key, lambda: Server(start=False, **kwargs))


def module_server(test, key, make):
    """The server of test's module under `key` (make() builds it, unstarted): started by
    the first test that asks, stopped and checked (exit code, sanitizer reports) when the
    module's tests are done (unittest.addModuleCleanup), where a problem fails the module;
    a failed test marks it, so its log is kept. For tests that each use their own users
    and rooms, assert no absolute counter (a delta from the same server is fine) and stop
    no server."""
    srv = _module_servers.get(key)
    if srv is None:
        srv = _module_servers[key] = start_shared(make())

        def close():
            del _module_servers[key]
            srv.close()
        unittest.addModuleCleanup(close)
    mark_on_failure(test, srv)
    return srv


class Background:
    """Runs fn(*args) in a thread; .result() waits for it and returns or re-raises."""

    def __init__(self, fn, *args, **kwargs):
        self._value = None
        self._error = None
        self._thread = threading.Thread(target=self._run, args=(fn, args, kwargs), daemon=True)
        self.started_at = time.monotonic()
        self.finished_at = None
        self._thread.start()

    def _run(self, fn, args, kwargs):
        try:
            self._value = fn(*args, **kwargs)
        except BaseException as e:  # handed to result()
            self._error = e
        finally:
            self.finished_at = time.monotonic()

    def done(self):
        return not self._thread.is_alive()

    def result(self, timeout=30):
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError(f"background request still running after {timeout}s")
        if self._error:
            raise self._error
        return self._value


WAIT_FIRST_INTERVAL_S = 0.05
WAIT_MAX_INTERVAL_S = 0.25
WAIT_STEADY_S = 1.0


def wait_until(predicate, timeout=10, interval=None, what="condition"):
    """Polls predicate() until it returns a truthy value; returns it or fails. The last poll
    is at the deadline. With no interval, polls are 50 ms apart for the first second (what
    a test timing something that fast sees), then the pause grows by half each time up to
    WAIT_MAX_INTERVAL_S: a poll is often a request to an ASan-built server, or a psql
    process and a database session, and at a fixed 50 ms a long wait kept a CPU busy. A
    given interval is kept throughout."""
    started = time.monotonic()
    deadline = started + timeout
    pause = WAIT_FIRST_INTERVAL_S if interval is None else interval
    while True:
        last = predicate()
        if last:
            return last
        now = time.monotonic()
        if now >= deadline:
            break
        time.sleep(min(pause, deadline - now))
        if interval is None and now - started >= WAIT_STEADY_S:
            pause = min(pause * 1.5, WAIT_MAX_INTERVAL_S)
    raise AssertionError(f"{what} not reached within {timeout}s (last value {last!r})")


def thread_count(pid):
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError("no Threads line")


def make_admin(srv, user_id):
    """Makes user_id a server admin as an operator does, in the database, and waits until
    srv has forgotten what it cached about the user's tokens: the change reaches a running
    server through a PostgreSQL notification (core/client/auth/auth_cache.c), a moment
    after the UPDATE commits, not with it."""
    from harness import psql
    # A notification sent before the server listens is lost (it empties its cache when it
    # starts listening, uncounted): wait for its listener first.
    wait_until(lambda: srv.metric("atrium_notify_listener_up") == 1, timeout=30,
               what=f"{srv.server_name} listening for notifications")
    before = srv.metric("atrium_auth_cache_forgets_total")
    psql(f"UPDATE users SET is_admin = true WHERE user_id = '{user_id}'", srv.database)
    if before is not None:  # else no cache: nothing to wait for
        wait_until(lambda: srv.metric("atrium_auth_cache_forgets_total") > before, timeout=30,
                   what=f"{srv.server_name} forgetting its cache of {user_id}")
