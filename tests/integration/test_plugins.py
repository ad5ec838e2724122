"""The plugin loader: the ABI handshake refuses with one actionable line, disabled plugins
leave their paths unrecognized while the rest serves, duplicates stop start-up, and plugin
settings are validated by the plugin."""

import os
import re
import unittest

from common import AtriumTestCase, testplug, with_testplug
from harness import REPO_ROOT, Server, ServerError, test_plugin_dir
from media_support import register


def abi_minor():
    """ATRIUM_ABI_MINOR as include/atrium/abi.h defines it."""
    with open(os.path.join(REPO_ROOT, "include", "atrium", "abi.h")) as f:
        return re.search(r"#define ATRIUM_ABI_MINOR (\d+)", f.read()).group(1)


class LoaderTest(AtriumTestCase):
    def start_expecting_failure(self, plugins):
        srv = Server(plugins=plugins, start=False)
        self.addCleanup(srv.close)
        with self.assertRaises(ServerError):
            srv.start(timeout=20)
        self.assertNotEqual(srv.returncode, 0)
        return srv.log_text()

    def test_plugin_built_for_another_abi_major_is_refused_with_the_exact_line(self):
        path = os.path.join(test_plugin_dir(), "badabi.so")
        log = self.start_expecting_failure({"badabi": {"enabled": True, "path": path}})
        self.assertIn(f'plugin "badabi" ({path}): built for plugin ABI 2.x, this server provides '
                      f'1.{abi_minor()} - use a build of the plugin for Atrium plugin ABI 1.x', log)

    def test_plugin_with_a_malformed_settings_table_is_refused_before_its_init(self):
        path = os.path.join(test_plugin_dir(), "badsettings.so")
        log = self.start_expecting_failure({"badsettings": {"enabled": True, "path": path}})
        self.assertIn(f'plugin "badsettings" ({path}): its settings table: setting "slots" has '
                      f'default 0 outside its range 1..8 - the plugin is broken; use a fixed '
                      f'build', log)
        self.assertNotIn("init failed", log)

    def test_disabled_plugin_paths_are_unrecognized_while_the_rest_serves(self):
        srv = self.start_server(plugins={"media": {"enabled": False}, "directory": {"enabled": True}})
        status, body = srv.json("GET", "/_matrix/client/v1/media/config")
        self.assertEqual(status, 404)
        self.assertEqual(body["errcode"], "M_UNRECOGNIZED")
        status, body = srv.json("GET", "/_matrix/client/versions")
        self.assertEqual(status, 200)
        self.assertIn("v1.11", body["versions"])
        self.assertEqual(srv.json("GET", "/_matrix/client/v3/publicRooms")[0], 200)

    def test_enabled_media_plugin_answers_its_config_from_its_settings(self):
        srv = self.start_server(plugins={"media": {"enabled": True, "max_upload_size": 1234567}},
                                settings={"registration": {"enabled": True}})
        _, token = register(srv)  # the media config needs an access token (spec v1.11)
        self.assertEqual(srv.json("GET", "/_matrix/client/v1/media/config", token=token),
                         (200, {"m.upload.size": 1234567}))

    def test_two_plugins_providing_one_interface_stop_start_up(self):
        plugins = {**testplug("testplug"), **testplug("testdupe")}
        log = self.start_expecting_failure(plugins)
        self.assertIn('plugins "testplug" and "testdupe" both provide "test/1" - disable one of them', log)

    def test_two_plugins_registering_one_route_stop_start_up(self):
        plugins = {**testplug("testplug"), **testplug("testroutes")}
        log = self.start_expecting_failure(plugins)
        self.assertIn('route GET /_test/handoff from "testroutes" is already registered by "testplug"', log)

    def test_unknown_plugin_setting_is_an_error_with_a_suggestion(self):
        log = self.start_expecting_failure(with_testplug(thread=3))
        self.assertIn("plugins.testplug.thread", log)
        self.assertIn("did you mean", log)
        self.assertIn("threads", log)

    def test_out_of_range_plugin_setting_names_the_range(self):
        log = self.start_expecting_failure(with_testplug(threads=0))
        self.assertIn("plugins.testplug.threads", log)

    def test_missing_plugin_file_is_refused_naming_the_file(self):
        path = os.path.join(test_plugin_dir(), "nothere.so")
        log = self.start_expecting_failure({"nothere": {"enabled": True, "path": path}})
        self.assertIn(f'plugin "nothere" ({path}): cannot load', log)

    def test_plugin_configured_under_another_name_is_refused(self):
        path = os.path.join(test_plugin_dir(), "testplug.so")
        log = self.start_expecting_failure({"other": {"enabled": True, "path": path}})
        self.assertIn('file declares name "testplug"; configure it as plugins.testplug instead', log)


if __name__ == "__main__":
    unittest.main()
