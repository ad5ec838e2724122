"""Start-up: configuration errors name the key and line, environment overrides apply,
an unreachable database is a clear bounded failure, and two processes starting together
on one database apply each migration once."""

import time
import unittest

from common import AtriumTestCase, testplug
from harness import Server, ServerError, create_database, drop_database, free_port, psql


class StartupTest(AtriumTestCase):
    def failing(self, **kwargs):
        srv = Server(start=False, **kwargs)
        self.addCleanup(srv.close)
        with self.assertRaises(ServerError):
            srv.start(timeout=30)
        self.assertNotEqual(srv.returncode, 0)
        return srv

    def test_a_wrong_type_names_the_key_and_the_file_line(self):
        srv = self.failing(settings={"server": {"http": {"request_threads": "many"}}})
        log = srv.log_text()
        self.assertIn("server.http.request_threads", log)
        self.assertRegex(log, r"homeserver\.yaml:\d+")

    def test_an_unknown_core_key_is_an_error(self):
        srv = self.failing(settings={"server": {"htp": {"port": 1}}})
        self.assertIn("server.htp", srv.log_text())

    def test_environment_overrides_the_file(self):
        port = free_port()
        srv = self.start_server(port=port, settings={"server": {"http": {"port": 1}}},
                                env={"ATRIUM__SERVER__HTTP__PORT": str(port)})
        self.assertEqual(srv.request("GET", "/health")[0], 200)

    def test_unreachable_database_fails_start_up_clearly_after_the_retry_window(self):
        dead = f"host=127.0.0.1 port={free_port()} user=nobody dbname=none connect_timeout=1"
        started = time.monotonic()
        srv = self.failing(settings={"database": {"conninfo": dead, "connect_retry_s": 2}})
        self.assertLess(time.monotonic() - started, 20)
        self.assertIn("cannot connect to PostgreSQL after 2 s", srv.log_text())

    def test_two_processes_starting_together_apply_each_migration_once(self):
        db = create_database()
        self.addCleanup(drop_database, db)
        servers = [Server(database=db, plugins=testplug(), start=False) for _ in range(2)]
        for s in servers:
            self.addCleanup(s.close)
        for s in servers:
            s.launch()  # both processes race for the migrations
        for s in servers:
            s.wait_healthy()
        for s in servers:
            self.assertEqual(s.json("GET", "/_test/db"), (200, {"items": 3}))
        rows = [r[0] for r in psql("SELECT owner || ':' || version FROM atrium_migrations",
                                   database=db)]
        self.assertEqual(len(rows), len(set(rows)), "each migration recorded once")
        for expected in ("core:1", "core:2", "testplug:1", "testplug:2"):
            self.assertIn(expected, rows)


if __name__ == "__main__":
    unittest.main()
