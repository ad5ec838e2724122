"""Room aliases and publishing through the directory plugin: PUT/GET/DELETE
/directory/room/{alias}, /rooms/{roomId}/aliases, createRoom with room_alias_name and
visibility "public", join by alias, m.room.canonical_alias checks, the listing kept fresh
as the room's state changes, and a server whose directory is disabled."""

import os
import unittest

from accounts import REGISTRATION_ON, register
from common import make_admin
from harness import Server, ServerError, psql, test_plugin_dir
from rooms_client import V3, Client, SharedServerTest, quote

PUBLIC_ROOMS = V3 + "/publicRooms"


def alias_path(alias):
    return f"{V3}/directory/room/{quote(alias)}"


def listed(srv):
    status, body = srv.json("GET", PUBLIC_ROOMS)
    assert status == 200, body
    return {r["room_id"]: r for r in body["chunk"]}


class AliasTest(SharedServerTest):
    USERS = ("ava", "bo", "cy")
    PLUGINS = {"directory": {"enabled": True}}

    def test_an_alias_round_trips_and_deleting_it_keeps_the_room(self):
        room = self.ava.create_room(name="Round trip")
        self.ava.ok("PUT", alias_path("#trip:localhost"), {"room_id": room})
        status, body = self.srv.json("GET", alias_path("#trip:localhost"))
        self.assertEqual((status, body), (200, {"room_id": room, "servers": ["localhost"]}))
        self.assertEqual(self.ava.ok("GET", f"{V3}/rooms/{quote(room)}/aliases"),
                         {"aliases": ["#trip:localhost"]})
        self.ava.ok("DELETE", alias_path("#trip:localhost"))
        status, body = self.srv.json("GET", alias_path("#trip:localhost"))
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"))
        self.assertEqual(self.ava.state(room, "m.room.name")["name"], "Round trip")
        self.assertEqual(self.ava.ok("GET", f"{V3}/rooms/{quote(room)}/aliases"), {"aliases": []})

    def test_bad_taken_foreign_and_unknown_aliases_get_their_errors(self):
        room = self.ava.create_room()
        for bad in ("trip:localhost", "#:localhost", "#nocolon", "#a b:localhost",
                    "#" + "x" * 260 + ":localhost"):
            status, body = self.ava.call("PUT", alias_path(bad), {"room_id": room})
            self.assertEqual((status, body["errcode"]), (400, "M_INVALID_PARAM"), bad)
        status, body = self.ava.call("PUT", alias_path("#x:elsewhere.example"), {"room_id": room})
        self.assertEqual((status, body["errcode"]), (400, "M_INVALID_PARAM"))
        self.ava.ok("PUT", alias_path("#taken:localhost"), {"room_id": room})
        status, body = self.ava.call("PUT", alias_path("#taken:localhost"), {"room_id": room})
        self.assertEqual((status, body["errcode"]), (409, "M_ROOM_IN_USE"))
        status, body = self.ava.call("PUT", alias_path("#ghost:localhost"),
                                     {"room_id": "!nothere:localhost"})
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"))
        # bo is not in the room: may neither name it nor delete its alias
        status, body = self.bo.call("PUT", alias_path("#bos:localhost"), {"room_id": room})
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"))
        status, body = self.bo.call("DELETE", alias_path("#taken:localhost"))
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"))
        status, body = self.bo.call("GET", f"{V3}/rooms/{quote(room)}/aliases")
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"))
        status, body = self.ava.call("DELETE", alias_path("#unknown:localhost"))
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"))
        status, body = self.srv.json("GET", alias_path("#unknown:localhost"))
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"))

    def test_a_room_admin_may_delete_an_alias_a_member_made_but_a_member_may_not(self):
        room = self.ava.create_room(preset="public_chat")
        self.bo.join(room)
        self.cy.join(room)
        self.bo.ok("PUT", alias_path("#bos-alias:localhost"), {"room_id": room})
        status, body = self.cy.call("DELETE", alias_path("#bos-alias:localhost"))
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"))
        self.ava.ok("DELETE", alias_path("#bos-alias:localhost"))  # power 100

    def test_create_room_with_an_alias_and_public_visibility_lists_it_and_join_by_alias_works(self):
        room = self.ava.create_room(room_alias_name="lobby", visibility="public", name="Lobby",
                                    topic="Say hi")
        status, body = self.srv.json("GET", alias_path("#lobby:localhost"))
        self.assertEqual((status, body["room_id"]), (200, room))
        self.assertEqual(self.ava.state(room, "m.room.canonical_alias"), {"alias": "#lobby:localhost"})
        entry = listed(self.srv)[room]
        self.assertEqual((entry["name"], entry["topic"], entry["canonical_alias"],
                          entry["num_joined_members"], entry["join_rule"],
                          entry["guest_can_join"], entry["world_readable"]),
                         ("Lobby", "Say hi", "#lobby:localhost", 1, "public", False, False))
        self.assertEqual(self.srv.json("GET", f"{V3}/directory/list/room/{quote(room)}")[1],
                         {"visibility": "public"})
        answer = self.bo.ok("POST", f"{V3}/join/{quote('#lobby:localhost')}")
        self.assertEqual(answer["room_id"], room)
        self.assertEqual(listed(self.srv)[room]["num_joined_members"], 2)  # fresh after a join
        self.ava.put_state(room, "m.room.name", {"name": "Big lobby"})
        self.assertEqual(listed(self.srv)[room]["name"], "Big lobby")
        status, body = self.bo.call("POST", f"{V3}/join/{quote('#nope:localhost')}")
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"))
        # Another server's alias is asked of that server; this one federates with nobody.
        status, body = self.bo.call("POST", f"{V3}/join/{quote('#far:elsewhere.example')}",
                                    timeout=30)
        self.assertEqual((status, body["errcode"]), (502, "M_UNKNOWN"), body)
        self.assertIn("elsewhere.example", body["error"])

    def test_create_room_with_a_taken_alias_creates_neither_room_nor_alias(self):
        self.ava.create_room(room_alias_name="once")
        before = psql("SELECT count(*) FROM rooms", database=self.srv.database)
        status, body = self.bo.call("POST", f"{V3}/createRoom",
                                    {"room_alias_name": "once", "name": "Second"})
        self.assertEqual((status, body["errcode"]), (400, "M_ROOM_IN_USE"))
        status, body = self.bo.call("POST", f"{V3}/createRoom", {"room_alias_name": "bad:name"})
        self.assertEqual((status, body["errcode"]), (400, "M_INVALID_PARAM"))
        after = psql("SELECT count(*) FROM rooms", database=self.srv.database)
        self.assertEqual(before, after)

    def test_publishing_needs_the_power_to_set_the_canonical_alias_and_unlisting_works(self):
        room = self.ava.create_room(preset="public_chat", name="Quiet")
        self.assertNotIn(room, listed(self.srv))
        self.bo.join(room)
        path = f"{V3}/directory/list/room/{quote(room)}"
        status, body = self.bo.call("PUT", path, {"visibility": "public"})
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"))
        self.ava.ok("PUT", path, {"visibility": "public"})
        self.assertEqual(listed(self.srv)[room]["num_joined_members"], 2)
        self.ava.ok("PUT", path, {"visibility": "private"})
        self.assertNotIn(room, listed(self.srv))
        self.assertEqual(self.srv.json("GET", path)[1], {"visibility": "private"})
        status, body = self.ava.call("PUT", path, {"visibility": "secret"})
        self.assertEqual((status, body["errcode"]), (400, "M_INVALID_PARAM"))
        status, body = self.srv.json("GET", f"{V3}/directory/list/room/{quote('!no:localhost')}")
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"))

    def test_a_canonical_alias_must_point_to_the_room(self):
        room = self.ava.create_room()
        other = self.ava.create_room()
        self.ava.ok("PUT", alias_path("#mine:localhost"), {"room_id": room})
        self.ava.ok("PUT", alias_path("#theirs:localhost"), {"room_id": other})
        path = f"{V3}/rooms/{quote(room)}/state/m.room.canonical_alias"
        self.ava.ok("PUT", path, {"alias": "#mine:localhost"})
        for content in ({"alias": "#theirs:localhost"}, {"alias": "#unset:localhost"},
                        {"alias": "#mine:localhost", "alt_aliases": ["#theirs:localhost"]}):
            status, body = self.ava.call("PUT", path, content)
            self.assertEqual((status, body["errcode"]), (400, "M_BAD_ALIAS"), content)
        status, body = self.ava.call("PUT", path, {"alias": "not-an-alias"})
        self.assertEqual((status, body["errcode"]), (400, "M_INVALID_PARAM"))
        self.ava.ok("PUT", path, {"alias": "#mine:localhost", "alt_aliases": []})
        self.ava.ok("PUT", path, {})


    def test_deleting_an_alias_takes_it_out_of_the_canonical_alias_event_as_the_deleter(self):
        room = self.ava.create_room(room_alias_name="canon", preset="public_chat",
                                    visibility="public", name="Canon")
        self.bo.join(room)
        for alias, who in (("#alt-one:localhost", self.ava), ("#alt-two:localhost", self.ava),
                           ("#bos-alt:localhost", self.bo)):
            who.ok("PUT", alias_path(alias), {"room_id": room})
        full = {"alias": "#canon:localhost",
                "alt_aliases": ["#alt-one:localhost", "#alt-two:localhost", "#bos-alt:localhost"]}
        self.ava.put_state(room, "m.room.canonical_alias", full)

        def canonical():
            state = self.ava.ok("GET", f"{V3}/rooms/{quote(room)}/state")
            [event] = [e for e in state if e["type"] == "m.room.canonical_alias"]
            return event["sender"], event["content"]

        self.ava.ok("DELETE", alias_path("#alt-one:localhost"))
        self.assertEqual(canonical(), (self.ava.user_id, {
            "alias": "#canon:localhost",
            "alt_aliases": ["#alt-two:localhost", "#bos-alt:localhost"]}))
        self.ava.ok("DELETE", alias_path("#canon:localhost"))
        self.assertEqual(canonical(), (self.ava.user_id, {
            "alt_aliases": ["#alt-two:localhost", "#bos-alt:localhost"]}))
        self.assertNotIn("canonical_alias", listed(self.srv)[room])  # the list follows
        # bo made #bos-alt and may delete it, but may not send the canonical alias event
        # (power 50 needed): the alias goes, the event stays, nothing is sent as anyone else.
        self.bo.ok("DELETE", alias_path("#bos-alt:localhost"))
        self.assertEqual(self.srv.json("GET", alias_path("#bos-alt:localhost"))[0], 404)
        self.assertEqual(canonical(), (self.ava.user_id, {
            "alt_aliases": ["#alt-two:localhost", "#bos-alt:localhost"]}))
        # Aliases the event names already are not checked again (only new ones are), so
        # the stale one does not block the next update; a new unknown one still does.
        path = f"{V3}/rooms/{quote(room)}/state/m.room.canonical_alias"
        self.ava.ok("PUT", path, {"alias": "#alt-two:localhost",
                                  "alt_aliases": ["#alt-two:localhost", "#bos-alt:localhost"]})
        status, body = self.ava.call("PUT", path, {"alt_aliases": ["#bos-alt:localhost",
                                                                   "#never:localhost"]})
        self.assertEqual((status, body["errcode"]), (400, "M_BAD_ALIAS"), body)
        # An alias the event does not name changes nothing; the room stays throughout.
        self.ava.ok("PUT", alias_path("#unnamed:localhost"), {"room_id": room})
        self.ava.ok("DELETE", alias_path("#unnamed:localhost"))
        self.ava.ok("DELETE", alias_path("#alt-two:localhost"))
        self.assertEqual(canonical(), (self.ava.user_id, {"alt_aliases": ["#bos-alt:localhost"]}))
        self.assertNotIn("canonical_alias", listed(self.srv)[room])
        self.assertEqual(self.bo.state(room, "m.room.name"), {"name": "Canon"})
        self.assertEqual(listed(self.srv)[room]["name"], "Canon")


class AdminsOnlyPublishingTest(SharedServerTest):
    """plugins.directory.publish: admins. Server admins list rooms and delete anyone's
    alias through the client endpoints; nobody else lists rooms."""

    USERS = ("ed",)
    PLUGINS = {"directory": {"enabled": True, "publish": "admins"}}

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.root = Client(cls.srv, register(cls.srv, "root"))
        make_admin(cls.srv, cls.root.user_id)

    def test_only_server_admins_list_rooms_and_they_may_delete_any_alias(self):
        status, body = self.ed.call("POST", f"{V3}/createRoom",
                                    {"visibility": "public", "room_alias_name": "eds"})
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"))
        self.assertEqual(self.srv.json("GET", alias_path("#eds:localhost"))[0], 404)  # not made
        room = self.ed.create_room(room_alias_name="eds", name="Ed's")
        path = f"{V3}/directory/list/room/{quote(room)}"
        status, body = self.ed.call("PUT", path, {"visibility": "public"})
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"))
        self.root.ok("PUT", path, {"visibility": "public"})  # not even in the room
        self.assertEqual(listed(self.srv)[room]["name"], "Ed's")
        self.root.ok("DELETE", alias_path("#eds:localhost"))
        self.assertEqual(self.srv.json("GET", alias_path("#eds:localhost"))[0], 404)
        self.assertEqual(self.root.ok("POST", f"{V3}/createRoom", {"visibility": "public"})
                         .get("room_id") in listed(self.srv), True)

    def test_the_synapse_admin_room_api_shows_a_room_with_its_listing_to_admins_only(self):
        room = self.ed.create_room(room_alias_name="eds-admin", preset="public_chat",
                                   name="Ed's admin view", topic="Details",
                                   initial_state=[{"type": "m.room.encryption", "state_key": "",
                                                   "content": {"algorithm": "m.megolm.v1.aes-sha2"}}])
        path = f"/_synapse/admin/v1/rooms/{quote(room)}"
        status, body = self.ed.call("GET", path)
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"))
        details = self.root.ok("GET", path)
        self.assertEqual({k: details[k] for k in (
            "room_id", "name", "topic", "canonical_alias", "creator", "joined_members",
            "joined_local_members", "encryption", "federatable", "public", "join_rules",
            "guest_access", "history_visibility", "room_type", "forgotten", "avatar")}, {
            "room_id": room, "name": "Ed's admin view", "topic": "Details",
            "canonical_alias": "#eds-admin:localhost", "creator": self.ed.user_id,
            "joined_members": 1, "joined_local_members": 1,
            "encryption": "m.megolm.v1.aes-sha2", "federatable": True, "public": False,
            "join_rules": "public", "guest_access": "forbidden", "history_visibility": "shared",
            "room_type": None, "forgotten": False, "avatar": None})
        self.assertEqual(details["version"], "10")
        self.assertGreaterEqual(details["joined_local_devices"], 1)
        self.assertEqual(details["state_events"],
                         len(self.ed.ok("GET", f"{V3}/rooms/{quote(room)}/state")))
        # The admin lists it through the directory (as on Synapse): the details follow.
        self.root.ok("PUT", f"{V3}/directory/list/room/{quote(room)}", {"visibility": "public"})
        self.assertTrue(self.root.ok("GET", path)["public"])
        # Once its only member left and forgot it, it is forgotten.
        self.ed.leave(room)
        self.ed.ok("POST", f"{V3}/rooms/{quote(room)}/forget", {})
        details = self.root.ok("GET", path)
        self.assertEqual((details["joined_members"], details["forgotten"]), (0, True))
        status, body = self.root.call("GET", "/_synapse/admin/v1/rooms/" + quote("!nope:localhost"))
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"))

    def test_an_admin_shuts_a_room_down_its_users_leave_it_is_unlisted_and_its_aliases_go(self):
        room = self.ed.create_room(room_alias_name="doomed", preset="public_chat", name="Doomed")
        self.ed.ok("PUT", alias_path("#doomed-too:localhost"), {"room_id": room})
        self.root.ok("PUT", f"{V3}/directory/list/room/{quote(room)}", {"visibility": "public"})
        self.assertEqual(self.ed.member_action(room, "invite", self.root.user_id)[0], 200)
        path = f"/_synapse/admin/v1/rooms/{quote(room)}"
        status, body = self.ed.call("DELETE", path, {"purge": False})
        self.assertEqual((status, body["errcode"]), (403, "M_FORBIDDEN"))
        # What this server does not do is refused, not skipped: purging is Synapse's default.
        for refused in ({}, {"purge": True}, {"purge": False, "block": True},
                        {"purge": False, "new_room_user_id": self.root.user_id}):
            status, body = self.root.call("DELETE", path, refused)
            self.assertEqual((status, body["errcode"]), (400, "M_INVALID_PARAM"), refused)
        status, body = self.root.call("DELETE", path, {"purge": "no"})
        self.assertEqual((status, body["errcode"]), (400, "M_BAD_JSON"))
        self.assertEqual(self.root.ok("GET", path)["joined_members"], 1)  # nothing happened yet
        answer = self.root.ok("DELETE", path, {"purge": False})
        answer["local_aliases"].sort()
        self.assertEqual(answer, {"kicked_users": sorted([self.ed.user_id, self.root.user_id]),
                                  "failed_to_kick_users": [],
                                  "local_aliases": ["#doomed-too:localhost", "#doomed:localhost"],
                                  "new_room_id": None})
        # Each left with their own leave event (root declined the invite); the room stays.
        members = self.root.ok("GET", path)
        self.assertEqual((members["joined_members"], members["public"]), (0, False))
        [(sender, membership)] = psql(
            f"SELECT sender, membership FROM memberships WHERE room_id = '{room}' AND user_id = "
            f"'{self.ed.user_id}' ORDER BY stream_pos DESC LIMIT 1", database=self.srv.database)
        self.assertEqual((sender, membership), (self.ed.user_id, "leave"))
        self.assertNotIn(room, listed(self.srv))
        for alias in ("#doomed:localhost", "#doomed-too:localhost"):
            self.assertEqual(self.srv.json("GET", alias_path(alias))[0], 404, alias)
        status, body = self.root.call("DELETE", "/_synapse/admin/v1/rooms/" + quote("!no:localhost"),
                                      {"purge": False})
        self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"))

    def test_an_unknown_publication_rule_stops_start_up(self):
        srv = Server(plugins={"directory": {"enabled": True, "publish": "nobody"}}, start=False)
        try:
            with self.assertRaises(ServerError):
                srv.start(timeout=20)
            self.assertIn('plugins.directory.publish is "nobody"', srv.log_text())
        finally:
            srv.close()


class DirectoryDisabledTest(unittest.TestCase):
    def test_the_server_runs_without_the_directory_and_alias_parts_say_so(self):
        with Server(settings=REGISTRATION_ON) as srv:
            user = Client(srv, register(srv, "dee"))
            status, body = user.call("POST", f"{V3}/createRoom", {"room_alias_name": "x"})
            self.assertEqual((status, body["errcode"]), (400, "M_UNRECOGNIZED"))
            self.assertIn("directory", body["error"])
            room = user.create_room(visibility="public", name="Still works")
            for method, path in (("GET", alias_path("#x:localhost")),
                                 ("PUT", alias_path("#x:localhost")),
                                 ("GET", PUBLIC_ROOMS),
                                 ("GET", f"{V3}/directory/list/room/{quote(room)}")):
                status, body = user.call(method, path, {"room_id": room} if method == "PUT" else None)
                self.assertEqual((status, body["errcode"]), (404, "M_UNRECOGNIZED"), path)
            for alias in ("#x:localhost", "#x:elsewhere.example"):
                status, body = user.call("POST", f"{V3}/join/{quote(alias)}")
                self.assertEqual((status, body["errcode"]), (400, "M_UNRECOGNIZED"), alias)
            make_admin(srv, user.user_id)
            details = user.ok("GET", f"/_synapse/admin/v1/rooms/{quote(room)}")
            self.assertEqual((details["name"], details["public"]), ("Still works", False))
            status, body = user.call("PUT", f"{V3}/rooms/{quote(room)}/state/m.room.canonical_alias",
                                     {"alias": "#x:localhost"})
            self.assertEqual((status, body["errcode"]), (400, "M_BAD_ALIAS"))
            self.assertEqual(user.state(room, "m.room.name")["name"], "Still works")


class ReplacementDirectoryTest(unittest.TestCase):
    """A directory built only from include/atrium/ (tests/plugins/altdir.c) provides
    directory/1: the core creates and resolves aliases through it."""

    def test_the_core_uses_whichever_plugin_provides_the_directory_interface(self):
        path = os.path.join(test_plugin_dir(), "altdir.so")
        with Server(settings=REGISTRATION_ON,
                    plugins={"altdir": {"enabled": True, "path": path}}) as srv:
            ann = Client(srv, register(srv, "ann"))
            ben = Client(srv, register(srv, "ben"))
            room = ann.create_room(room_alias_name="alt", visibility="public", preset="public_chat")
            self.assertEqual(ann.state(room, "m.room.canonical_alias"), {"alias": "#alt:localhost"})
            self.assertEqual(ben.ok("POST", f"{V3}/join/{quote('#alt:localhost')}")["room_id"], room)
            status, body = ben.call("POST", f"{V3}/createRoom", {"room_alias_name": "alt"})
            self.assertEqual((status, body["errcode"]), (400, "M_ROOM_IN_USE"))
            calls = srv.json("GET", "/_altdir/calls")[1]
            self.assertEqual((calls["alias_create"], calls["alias_resolve"], calls["room_publish"]),
                             (2, 1, 1))
            self.assertGreaterEqual(calls["room_changed"], 2)  # creation, then ben's join
            # The plugin serves no alias routes: the core has none of its own.
            status, body = srv.json("GET", alias_path("#alt:localhost"))
            self.assertEqual((status, body["errcode"]), (404, "M_UNRECOGNIZED"))
            # It provides version 0 of directory/1, without remote look-ups: a join by
            # another server's alias says so.
            status, body = ben.call("POST", f"{V3}/join/{quote('#far:elsewhere.example')}")
            self.assertEqual((status, body["errcode"]), (404, "M_NOT_FOUND"))
            self.assertIn("does not ask other servers", body["error"])

    def test_two_plugins_providing_directory_1_stop_start_up(self):
        path = os.path.join(test_plugin_dir(), "altdir.so")
        srv = Server(plugins={"altdir": {"enabled": True, "path": path},
                              "directory": {"enabled": True}}, start=False)
        try:
            with self.assertRaises(ServerError):
                srv.start(timeout=20)
            self.assertIn('both provide "directory/1"', srv.log_text())
        finally:
            srv.close()


if __name__ == "__main__":
    unittest.main()
