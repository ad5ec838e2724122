"""The directory plugin's public room list: GET and POST /publicRooms, paging with
since/next_batch/prev_batch, the search term and room types, and bad input.

The test writes the plugin's own table directly (rooms that do not exist, listed as an
operator might), to test the list's paging and filters apart from publishing, which
test_directory_aliases.py covers."""

import unittest

from harness import psql
from rooms_client import SharedServerTest

PUBLIC_ROOMS = "/_matrix/client/v3/publicRooms"

# (room_id, name, topic, members, room_type)
ROOMS = [
    ("!big:localhost", "Cheese lovers", "All about 100% cheddar", 50, None),
    ("!mid:localhost", "Bread", "Sourdough_and rye", 20, None),
    ("!space:localhost", "Food space", None, 10, "m.space"),
    ("!small:localhost", None, "quiet", 5, None),
    ("!tiny:localhost", "Tea", None, 1, None),
]


def sql_text(value):
    return "NULL" if value is None else "'" + value.replace("'", "''") + "'"


class DirectoryTest(SharedServerTest):
    USERS = ("dora",)
    PLUGINS = {"directory": {"enabled": True}}

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        rows = ", ".join(
            f"({sql_text(r)}, {sql_text(n)}, {sql_text(t)}, {m}, {sql_text(k)},"
            f" {'true' if r == '!big:localhost' else 'false'})"
            for r, n, t, m, k in ROOMS)
        psql("INSERT INTO directory_public_rooms (room_id, name, topic, num_joined_members,"
             f" room_type, world_readable) VALUES {rows}", database=cls.srv.database)
        cls.token = cls.dora.token

    def post(self, body, query="", token=True):
        return self.srv.json("POST", PUBLIC_ROOMS + query, body, token=self.token if token else None)

    def test_get_lists_rooms_by_size_with_only_the_fields_that_are_set(self):
        status, body = self.srv.json("GET", PUBLIC_ROOMS)
        self.assertEqual(status, 200, body)
        self.assertEqual([r["room_id"] for r in body["chunk"]], [r[0] for r in ROOMS])
        self.assertEqual(body["total_room_count_estimate"], len(ROOMS))
        self.assertNotIn("next_batch", body)
        self.assertNotIn("prev_batch", body)
        big, _, space, small, _ = body["chunk"]
        self.assertEqual((big["name"], big["num_joined_members"], big["world_readable"],
                          big["guest_can_join"], big["join_rule"]),
                         ("Cheese lovers", 50, True, False, "public"))
        self.assertEqual(space["room_type"], "m.space")
        self.assertNotIn("room_type", big)
        self.assertNotIn("name", small)
        self.assertNotIn("avatar_url", small)

    def test_pages_follow_next_batch_forward_and_prev_batch_back(self):
        seen, since, pages = [], None, 0
        while True:
            query = "?limit=2" + (f"&since={since}" if since else "")
            status, body = self.srv.json("GET", PUBLIC_ROOMS + query)
            self.assertEqual(status, 200, body)
            pages += 1
            self.assertEqual("prev_batch" in body, since is not None)
            seen += [r["room_id"] for r in body["chunk"]]
            since = body.get("next_batch")
            if since is None:
                break
        self.assertEqual((pages, seen), (3, [r[0] for r in ROOMS]))
        status, last = self.srv.json("GET", PUBLIC_ROOMS + "?limit=2&since=o4")
        status, back = self.srv.json("GET", PUBLIC_ROOMS + "?limit=2&since=" + last["prev_batch"])
        self.assertEqual([r["room_id"] for r in back["chunk"]], [ROOMS[2][0], ROOMS[3][0]])
        status, body = self.post({"limit": 2, "since": "o2"})
        self.assertEqual(status, 200, body)
        self.assertEqual([r["room_id"] for r in body["chunk"]], [ROOMS[2][0], ROOMS[3][0]])
        self.assertEqual((body["next_batch"], body["prev_batch"]), ("o4", "o0"))

    def test_post_searches_name_topic_and_alias_without_wildcards(self):
        def found(term):
            status, body = self.post({"filter": {"generic_search_term": term}})
            self.assertEqual(status, 200, body)
            return [r["room_id"] for r in body["chunk"]], body["total_room_count_estimate"]

        self.assertEqual(found("CHEESE"), (["!big:localhost"], 1))
        self.assertEqual(found("sourdough"), (["!mid:localhost"], 1))
        self.assertEqual(found("100%"), (["!big:localhost"], 1))  # % is a character, not "any"
        self.assertEqual(found("b_ead"), ([], 0))  # _ is a character, not "any one"
        self.assertEqual(found("gh_and"), (["!mid:localhost"], 1))
        self.assertEqual(found(""), ([r[0] for r in ROOMS], len(ROOMS)))

    def test_post_filters_room_types_with_null_for_rooms_without_one(self):
        def found(types):
            status, body = self.post({"filter": {"room_types": types}})
            self.assertEqual(status, 200, body)
            return [r["room_id"] for r in body["chunk"]]

        self.assertEqual(found(["m.space"]), ["!space:localhost"])
        self.assertEqual(found([None]), [r[0] for r in ROOMS if r[4] is None])
        self.assertEqual(found([None, "m.space"]), [r[0] for r in ROOMS])
        self.assertEqual(found([]), [])

    def test_post_needs_a_token_and_get_does_not(self):
        status, body = self.post({}, token=False)
        self.assertEqual((status, body["errcode"]), (401, "M_MISSING_TOKEN"))
        self.assertEqual(self.srv.json("GET", PUBLIC_ROOMS)[0], 200)

    def test_bad_input_gets_the_matching_error(self):
        get_cases = [("?limit=-1", "M_INVALID_PARAM"), ("?limit=ten", "M_INVALID_PARAM"),
                     ("?since=p5", "M_INVALID_PARAM"), ("?since=o99999999999", "M_INVALID_PARAM")]
        for query, code in get_cases:
            status, body = self.srv.json("GET", PUBLIC_ROOMS + query)
            self.assertEqual((status, body["errcode"]), (400, code), query)
        post_cases = [
            ("{", "M_NOT_JSON"),
            ({"limit": "2"}, "M_BAD_JSON"),
            ({"limit": -3}, "M_BAD_JSON"),
            ({"since": 4}, "M_BAD_JSON"),
            ({"since": "x"}, "M_INVALID_PARAM"),
            ({"filter": []}, "M_BAD_JSON"),
            ({"filter": {"generic_search_term": 7}}, "M_BAD_JSON"),
            ({"filter": {"generic_search_term": "x" * 300}}, "M_BAD_JSON"),
            ({"filter": {"room_types": "m.space"}}, "M_BAD_JSON"),
            ({"filter": {"room_types": [1]}}, "M_BAD_JSON"),
            ({"filter": {"room_types": [None] * 17}}, "M_BAD_JSON"),
            ({"third_party_instance_id": "irc"}, "M_INVALID_PARAM"),
        ]
        for body, code in post_cases:
            status, answer = self.post(body)
            self.assertEqual((status, answer["errcode"]), (400, code), body)
        # This server has no federation listener: another server's list is a 502, not []
        status, answer = self.post({}, query="?server=elsewhere.example")
        self.assertIn((status, answer["errcode"]), ((502, "M_UNKNOWN"), (504, "M_UNKNOWN")))

    def test_a_large_limit_is_capped_and_zero_gives_an_empty_last_page(self):
        status, body = self.srv.json("GET", PUBLIC_ROOMS + "?limit=100000")
        self.assertEqual((status, len(body["chunk"])), (200, len(ROOMS)))
        status, body = self.post({"limit": 0})
        self.assertEqual((status, body["chunk"], body["total_room_count_estimate"]),
                         (200, [], len(ROOMS)))
        self.assertNotIn("next_batch", body)  # following it would never end


if __name__ == "__main__":
    unittest.main()
