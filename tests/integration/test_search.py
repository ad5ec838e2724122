"""Server-side search (POST /_matrix/client/v3/search, category room_events): full text
matching of message bodies, room names and topics, case-insensitive and by word prefix,
only in rooms the searcher is joined to now and only among the events history visibility
shows them; redacted and encrypted events never match. Filters (rooms, not_rooms,
senders, types, limit), both orders, keyset pagination through next_batch covering every
result exactly once, event_context with profiles, include_state, the limits (page size,
term length, count) and every bad input.

One server serves the class; each test makes its own rooms and searches for its own
random words, so tests never see each other's messages.
"""

import json
import secrets
import unittest

from harness import psql
from rooms_client import SharedServerTest, V3, quote

SEARCH = f"{V3}/search"
DEFAULT_LIMIT = 10          # SEARCH_DEFAULT_LIMIT in core/client/rooms/crooms_search.c
MAX_LIMIT = 50              # SEARCH_MAX_LIMIT
TERM_MAX_BYTES = 512        # SEARCH_TERM_MAX_BYTES
COUNT_MAX = 1000            # SEARCH_COUNT_MAX
CONTEXT_MAX = 20            # SEARCH_CONTEXT_MAX_EVENTS
MAX_ROOMS = 1000            # SEARCH_MAX_ROOMS


def word():
    """A word no other test uses (letters only: one token for the parser)."""
    return "w" + "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(10))


def room_events(term, **fields):
    return {"search_categories": {"room_events": {"search_term": term, **fields}}}


class SearchTest(SharedServerTest):
    USERS = ("alice", "bob", "carol", "dave")

    # -- helpers ----------------------------------------------------------------------

    def search(self, who, term, next_batch=None, **fields):
        path = SEARCH + (f"?next_batch={quote(next_batch)}" if next_batch else "")
        return who.ok("POST", path, room_events(term, **fields))["search_categories"]["room_events"]

    def bodies(self, who, term, **fields):
        results = self.search(who, term, **fields)["results"]
        return [r["result"]["content"].get("body") for r in results]

    def say(self, who, room, body):
        return who.send(room, {"msgtype": "m.text", "body": body})

    def assertError(self, answer, status, errcode):
        got_status, body = answer
        self.assertEqual((got_status, (body or {}).get("errcode")), (status, errcode), body)
        self.assertIsInstance(body.get("error"), str)

    def all_pages(self, who, term, **fields):
        """Every result id, page by page; asserts the last page has no next_batch."""
        ids, token, pages = [], None, 0
        while True:
            answer = self.search(who, term, next_batch=token, **fields)
            ids += [r["result"]["event_id"] for r in answer["results"]]
            pages += 1
            token = answer.get("next_batch")
            if token is None:
                return ids, pages
            self.assertLess(pages, 100, "pagination does not end")

    # -- matching ---------------------------------------------------------------------

    def test_results_carry_bundled_aggregations_like_other_readers(self):
        w = word()
        room = self.alice.create_room(preset="private_chat")
        original = self.say(self.alice, room, f"first draft {w}")
        edit = self.alice.send(room, {"msgtype": "m.text", "body": "* fixed",
                                      "m.new_content": {"msgtype": "m.text", "body": "fixed"},
                                      "m.relates_to": {"rel_type": "m.replace",
                                                       "event_id": original}})
        results = self.search(self.alice, w)["results"]
        self.assertEqual([r["result"]["event_id"] for r in results], [original])
        bundle = results[0]["result"]["unsigned"]["m.relations"]
        self.assertEqual(bundle["m.replace"]["event_id"], edit)


    def test_finds_words_in_bodies_of_every_joined_room_case_insensitively_and_by_prefix(self):
        w = word()
        one = self.alice.create_room(preset="private_chat")
        two = self.alice.create_room(preset="private_chat")
        first = self.say(self.alice, one, f"The {w.upper()} is ripe")
        second = self.say(self.alice, two, f"another {w}, in room two")
        self.say(self.alice, one, "nothing to see")
        self.alice.send(one, {"algorithm": "m.megolm.v1.aes-sha2", "ciphertext": w,
                              "body": w}, event_type="m.room.encrypted")
        self.alice.send(one, {"body": w}, event_type="org.example.custom")

        answer = self.search(self.alice, w.capitalize())
        found = {r["result"]["event_id"]: r["result"] for r in answer["results"]}
        self.assertEqual(set(found), {first, second})
        self.assertEqual(found[first]["room_id"], one)
        self.assertEqual(found[second]["room_id"], two)
        self.assertEqual(found[first]["type"], "m.room.message")
        self.assertEqual(answer["count"], 2)
        self.assertEqual(answer["highlights"], [w])
        self.assertNotIn("next_batch", answer)
        for r in answer["results"]:
            self.assertIsInstance(r["rank"], float)
            self.assertGreater(r["rank"], 0)
            self.assertNotIn("context", r)
        # A word's beginning finds it; another word does not; two words must both match.
        self.assertEqual(len(self.bodies(self.alice, w[:7])), 2)
        self.assertEqual(self.bodies(self.alice, w + "x"), [])
        self.assertEqual(self.bodies(self.alice, f"{w} ripe"), [f"The {w.upper()} is ripe"])
        self.assertEqual(self.bodies(self.alice, f"{w} -ripe"), [f"another {w}, in room two"])

    def test_a_term_without_searchable_words_finds_nothing(self):
        w = word()
        room = self.alice.create_room(preset="private_chat")
        self.say(self.alice, room, f"{w} !!!")
        for term in ("", "!!! ...", f"-{w}", '""'):
            answer = self.search(self.alice, term)
            self.assertEqual((answer["results"], answer["count"], answer["highlights"]),
                             ([], 0, []), term)

    def test_name_and_topic_keys_find_the_state_events(self):
        w = word()
        room = self.alice.create_room(preset="private_chat", name=f"{w} club", topic=f"all {w}s")
        body_id = self.say(self.alice, room, f"{w} in a message")

        def types(**fields):
            results = self.search(self.alice, w, **fields)["results"]
            return sorted(r["result"]["type"] for r in results)

        self.assertEqual(types(), ["m.room.message", "m.room.name", "m.room.topic"])
        self.assertEqual(types(keys=["content.name"]), ["m.room.name"])
        self.assertEqual(types(keys=["content.topic"]), ["m.room.topic"])
        self.assertEqual(types(keys=["content.body", "content.topic"]),
                         ["m.room.message", "m.room.topic"])
        named = self.search(self.alice, w, keys=["content.name"])["results"][0]["result"]
        self.assertEqual((named["content"], named["state_key"]), ({"name": f"{w} club"}, ""))
        results = self.search(self.alice, w, keys=["content.body"])["results"]
        ids = [r["result"]["event_id"] for r in results]
        self.assertEqual(ids, [body_id])

    def test_redacted_events_no_longer_match(self):
        w = word()
        room = self.alice.create_room(preset="private_chat")
        gone = self.say(self.alice, room, f"secret {w}")
        kept = self.say(self.alice, room, f"public {w}")
        self.assertEqual(len(self.bodies(self.alice, w)), 2)
        self.alice.ok("PUT", f"{V3}/rooms/{quote(room)}/redact/{quote(gone)}/r1", {})
        answer = self.search(self.alice, w)
        self.assertEqual([r["result"]["event_id"] for r in answer["results"]], [kept])
        self.assertEqual(answer["count"], 1)
        self.assertEqual(self.bodies(self.alice, f"secret {w}"), [])
        # Nor does the redacted text stay in the index.
        rows = psql("SELECT search_tsv IS NULL FROM events WHERE event_id = "
                    f"'{gone}'", database=self.srv.database)
        self.assertEqual(rows, [["t"]])

    # -- whose rooms, which events ------------------------------------------------------

    def test_only_rooms_joined_now_are_searched(self):
        w = word()
        room = self.alice.create_room(preset="public_chat")
        self.bob.join(room)
        self.say(self.alice, room, f"hello {w}")
        self.assertEqual(self.bodies(self.bob, w), [f"hello {w}"])
        self.assertEqual(self.bodies(self.carol, w), [])  # never joined (a public room)
        self.bob.leave(room)
        self.assertEqual(self.bodies(self.bob, w), [])
        self.assertEqual(self.search(self.bob, w)["count"], 0)
        # Invited is not joined either.
        self.alice.member_action(room, "invite", self.carol.user_id)
        self.assertEqual(self.bodies(self.carol, w), [])
        self.assertEqual(self.bodies(self.alice, w), [f"hello {w}"])

    def test_joined_history_visibility_hides_messages_from_before_the_join(self):
        w = word()
        room = self.alice.create_room(preset="private_chat")
        self.alice.put_state(room, "m.room.history_visibility", {"history_visibility": "joined"})
        self.say(self.alice, room, f"{w} before")
        self.alice.member_action(room, "invite", self.bob.user_id)
        self.say(self.alice, room, f"{w} while invited")
        self.bob.join(room)
        after = self.say(self.alice, room, f"{w} after")
        self.assertEqual(self.bodies(self.bob, w), [f"{w} after"])
        self.assertEqual(self.search(self.bob, w)["count"], 1)
        self.assertEqual(sorted(self.bodies(self.alice, w)),
                         sorted([f"{w} before", f"{w} while invited", f"{w} after"]))
        # The context around bob's result hides the same events.
        ctx = self.search(self.bob, w, event_context={"before_limit": 10})["results"][0]
        self.assertEqual(ctx["result"]["event_id"], after)
        before = ctx["context"]["events_before"]
        self.assertEqual([e["content"].get("body") for e in before
                          if e["type"] == "m.room.message"], [])
        self.assertEqual([e["content"]["membership"] for e in before
                          if e.get("state_key") == self.bob.user_id], ["join", "invite"])

    # -- filters and order ------------------------------------------------------------

    def test_filter_rooms_not_rooms_senders_and_types(self):
        w = word()
        one = self.alice.create_room(preset="public_chat")
        two = self.alice.create_room(preset="public_chat")
        self.bob.join(one)
        self.say(self.alice, one, f"{w} alice one")
        self.say(self.bob, one, f"{w} bob one")
        self.say(self.alice, two, f"{w} alice two")

        def found(**f):
            return sorted(self.bodies(self.alice, w, filter=f))

        self.assertEqual(found(rooms=[one]), [f"{w} alice one", f"{w} bob one"])
        self.assertEqual(found(not_rooms=[one]), [f"{w} alice two"])
        self.assertEqual(found(rooms=[one, two], not_rooms=[two]),
                         [f"{w} alice one", f"{w} bob one"])
        self.assertEqual(found(rooms=["!unknown:localhost"]), [])
        self.assertEqual(found(senders=[self.bob.user_id]), [f"{w} bob one"])
        self.assertEqual(found(not_senders=[self.bob.user_id]),
                         [f"{w} alice one", f"{w} alice two"])
        self.assertEqual(found(types=["m.room.name"]), [])
        self.assertEqual(len(found(types=["m.room.*"])), 3)
        self.assertEqual(found(not_types=["m.room.message"]), [])
        # A room filter naming a room bob is not in finds nothing of it.
        self.assertEqual(self.bodies(self.bob, w, filter={"rooms": [two]}), [])

    def test_order_by_rank_puts_the_best_match_first_and_recent_the_newest(self):
        w = word()
        room = self.alice.create_room(preset="private_chat")
        best = self.say(self.alice, room, f"{w} {w} {w} {w}")
        middle = self.say(self.alice, room, f"{w} and more words besides")
        newest = self.say(self.alice, room, f"one {w}")
        ranked = self.search(self.alice, w)["results"]
        self.assertEqual(ranked[0]["result"]["event_id"], best)
        ranks = [r["rank"] for r in ranked]
        self.assertEqual(ranks, sorted(ranks, reverse=True))
        self.assertGreater(ranks[0], ranks[-1])
        recent = self.search(self.alice, w, order_by="recent")["results"]
        self.assertEqual([r["result"]["event_id"] for r in recent], [newest, middle, best])

    def test_pagination_covers_every_result_exactly_once_in_both_orders(self):
        w = word()
        room = self.alice.create_room(preset="private_chat")
        ids = [self.say(self.alice, room, f"{w} " * (1 + i % 3) + f"number {i}") for i in range(7)]
        for order in ("rank", "recent"):
            got, pages = self.all_pages(self.alice, w, order_by=order, filter={"limit": 3})
            self.assertEqual(pages, 3, order)
            self.assertEqual(len(got), 7, order)
            self.assertEqual(set(got), set(ids), order)
            one_page = self.search(self.alice, w, order_by=order, filter={"limit": 7})["results"]
            full = [r["result"]["event_id"] for r in one_page]
            self.assertEqual(got, full, order)  # pages in the same order as one big page
        # A message sent while paging recent results does not shift the later pages.
        first = self.search(self.alice, w, order_by="recent", filter={"limit": 3})
        self.say(self.alice, room, f"{w} late")
        rest, _ = self.all_pages(self.alice, w, order_by="recent", filter={"limit": 3})
        later = self.search(self.alice, w, next_batch=first["next_batch"], order_by="recent",
                            filter={"limit": 10})
        self.assertEqual([r["result"]["event_id"] for r in later["results"]], ids[3::-1])
        self.assertEqual(len(rest), 8)
        # A token of one order is refused for the other.
        ranked = self.search(self.alice, w, filter={"limit": 3})
        status = self.alice.call("POST", f"{SEARCH}?next_batch={quote(ranked['next_batch'])}",
                                 room_events(w, order_by="recent"))
        self.assertError(status, 400, "M_INVALID_PARAM")

    def test_page_size_defaults_to_10_caps_at_50_and_count_stops_at_1000(self):
        w = word()
        room = self.alice.create_room(preset="private_chat")
        # COUNT_MAX + 5 matching messages, written straight into the events table: sending
        # them one by one would take far longer. The generated column indexes them.
        psql("INSERT INTO events (stream_pos, event_id, room_id, type, sender,"
             " origin_server_ts, depth, pdu)"
             " SELECT stream_next(), '$search' || g || '_' || md5(random()::text), r.room_id,"
             f" 'm.room.message', '{self.alice.user_id}', 0, r.last_depth + g,"
             " json_build_object('type', 'm.room.message', 'sender',"
             f" '{self.alice.user_id}', 'room_id', r.room_id, 'origin_server_ts', 0,"
             " 'depth', r.last_depth + g, 'content', json_build_object('msgtype', 'm.text',"
             f" 'body', '{w} number ' || g))::text"
             f" FROM rooms r, generate_series(1, {COUNT_MAX + 5}) g WHERE r.room_id = '{room}'"
             " ORDER BY g", database=self.srv.database)
        answer = self.search(self.alice, w)
        self.assertEqual(len(answer["results"]), DEFAULT_LIMIT)
        self.assertEqual(answer["count"], COUNT_MAX)
        self.assertIn("next_batch", answer)
        self.assertEqual(len(self.search(self.alice, w, filter={"limit": 1000})["results"]),
                         MAX_LIMIT)
        self.assertEqual(len(self.search(self.alice, w, filter={"limit": MAX_LIMIT})["results"]),
                         MAX_LIMIT)
        newest = self.search(self.alice, w, order_by="recent", filter={"limit": 2})["results"]
        self.assertEqual([r["result"]["content"]["body"] for r in newest],
                         [f"{w} number {COUNT_MAX + 5}", f"{w} number {COUNT_MAX + 4}"])

    def test_past_1000_rooms_with_matches_the_rooms_with_the_oldest_matches_are_skipped(self):
        w = word()
        # MAX_ROOMS + 1 rooms dave is joined to, each with one match, written straight into
        # the rooms tables (creating them through the API would take far longer). Room 1
        # holds the oldest match.
        dave, prefix = self.dave.user_id, f"!{w}"
        psql("INSERT INTO rooms (room_id, room_version, creator, created_ts)"
             f" SELECT '{prefix}' || g || ':localhost', '10', '{dave}', 0"
             f" FROM generate_series(1, {MAX_ROOMS + 1}) g;"
             "INSERT INTO memberships (stream_pos, room_id, user_id, membership, event_id, sender)"
             f" SELECT stream_next(), '{prefix}' || g || ':localhost', '{dave}', 'join',"
             f" '$m{w}' || g, '{dave}' FROM generate_series(1, {MAX_ROOMS + 1}) g ORDER BY g;"
             "INSERT INTO current_state (room_id, type, state_key, event_id, membership)"
             f" SELECT '{prefix}' || g || ':localhost', 'm.room.member', '{dave}', '$m{w}' || g,"
             f" 'join' FROM generate_series(1, {MAX_ROOMS + 1}) g;"
             "INSERT INTO events (stream_pos, event_id, room_id, type, sender, origin_server_ts,"
             " depth, pdu)"
             f" SELECT stream_next(), '$e{w}' || g, '{prefix}' || g || ':localhost',"
             f" 'm.room.message', '{dave}', 0, 1, json_build_object('type', 'm.room.message',"
             f" 'sender', '{dave}', 'room_id', '{prefix}' || g || ':localhost',"
             " 'origin_server_ts', 0, 'depth', 1,"
             " 'content', json_build_object('msgtype', 'm.text', 'body',"
             f" '{w}' || CASE WHEN g = 1 THEN ' oldest' ELSE '' END))::text"
             f" FROM generate_series(1, {MAX_ROOMS + 1}) g ORDER BY g",
             database=self.srv.database)
        answer = self.search(self.dave, w, order_by="recent", filter={"limit": MAX_LIMIT})
        self.assertEqual(answer["count"], MAX_ROOMS)
        self.assertEqual(answer["results"][0]["result"]["room_id"],
                         f"{prefix}{MAX_ROOMS + 1}:localhost")
        # Every result older than room 2's match: room 1's would be the only one, but room 1
        # was not searched (the token names a stream position: "r<pos>", results before it).
        pos = psql(f"SELECT stream_pos FROM events WHERE event_id = '$e{w}2'",
                   database=self.srv.database)[0][0]
        older = self.search(self.dave, w, next_batch=f"r{pos}", order_by="recent")
        self.assertEqual((older["results"], older["count"]), ([], MAX_ROOMS))
        self.srv.wait_for_log("older matches were not searched", timeout=5)
        # Narrowed to that room by the filter, it is searched.
        self.assertEqual(self.bodies(self.dave, w, filter={"rooms": [f"{prefix}1:localhost"]}),
                         [f"{w} oldest"])

    # -- context and state --------------------------------------------------------------

    def test_event_context_gives_the_events_around_each_result_with_profiles(self):
        w = word()
        room = self.alice.create_room(preset="public_chat")
        self.bob.join(room)
        self.bob.ok("PUT", f"{V3}/profile/{quote(self.bob.user_id)}/displayname",
                    {"displayname": "Bob B"})
        names = ["b3", "b2", "b1"]
        for n in names:  # b1 comes just before the hit
            self.say(self.bob, room, n)
        hit = self.say(self.alice, room, f"the {w}")
        for n in ("a1", "a2", "a3"):
            self.say(self.bob, room, n)
        r = self.search(self.alice, w, event_context={"before_limit": 2, "after_limit": 1,
                                                      "include_profile": True})["results"][0]
        self.assertEqual(r["result"]["event_id"], hit)
        ctx = r["context"]
        self.assertEqual([e["content"]["body"] for e in ctx["events_before"]], ["b1", "b2"])
        self.assertEqual([e["content"]["body"] for e in ctx["events_after"]], ["a1"])
        self.assertEqual(ctx["profile_info"][self.bob.user_id], {"displayname": "Bob B"})
        self.assertEqual(ctx["profile_info"][self.alice.user_id], {"displayname": "alice"})
        # start/end are /messages tokens around the context.
        back = self.alice.messages(room, dir="b", limit="1", **{"from": ctx["start"]})["chunk"]
        self.assertEqual(back[0]["content"]["body"], "b3")
        fwd = self.alice.messages(room, dir="f", limit="1", **{"from": ctx["end"]})["chunk"]
        self.assertEqual(fwd[0]["content"]["body"], "a2")
        # Defaults: five each side, no profiles; a limit over the cap is capped; zero is none.
        r = self.search(self.alice, w, event_context={})["results"][0]["context"]
        self.assertEqual((len(r["events_before"]), len(r["events_after"])), (5, 3))
        self.assertNotIn("profile_info", r)
        r = self.search(self.alice, w, event_context={"before_limit": 1000, "after_limit": 0})
        ctx = r["results"][0]["context"]
        self.assertLessEqual(len(ctx["events_before"]), CONTEXT_MAX)
        self.assertGreater(len(ctx["events_before"]), 5)
        self.assertEqual(ctx["events_after"], [])

    def test_include_state_gives_the_current_state_of_each_result_room(self):
        w = word()
        one = self.alice.create_room(preset="private_chat", name="First")
        two = self.alice.create_room(preset="private_chat", name="Second")
        self.say(self.alice, one, w)
        self.say(self.alice, two, w)
        answer = self.search(self.alice, w, include_state=True)
        self.assertEqual(set(answer["state"]), {one, two})
        names = {room: [e["content"]["name"] for e in events if e["type"] == "m.room.name"]
                 for room, events in answer["state"].items()}
        self.assertEqual(names, {one: ["First"], two: ["Second"]})
        self.assertNotIn("state", self.search(self.alice, w))

    # -- the request --------------------------------------------------------------------

    def test_other_categories_are_ignored(self):
        self.assertEqual(self.alice.ok("POST", SEARCH, {"search_categories": {}}),
                         {"search_categories": {}})
        self.assertEqual(self.alice.ok("POST", SEARCH, {"search_categories": {"other": {}}}),
                         {"search_categories": {}})
        w = word()
        room = self.alice.create_room(preset="private_chat")
        self.say(self.alice, room, w)
        answer = self.alice.ok("POST", SEARCH, {"search_categories": {
            "room_events": {"search_term": w, "groupings": {"group_by": [{"key": "room_id"}]}},
            "other": {"x": 1}}})
        self.assertEqual(list(answer["search_categories"]), ["room_events"])
        self.assertEqual(len(answer["search_categories"]["room_events"]["results"]), 1)

    def test_a_term_of_512_bytes_is_searched_and_513_refused(self):
        self.assertEqual(self.search(self.alice, "é" * (TERM_MAX_BYTES // 2))["results"], [])
        self.assertError(self.alice.call("POST", SEARCH, room_events("a" * (TERM_MAX_BYTES + 1))),
                         400, "M_INVALID_PARAM")

    def test_bad_inputs_are_refused_with_matrix_errors(self):
        call = self.alice.call
        status, _, raw = self.srv.request("POST", SEARCH, b"not json", token=self.alice.token)
        self.assertEqual((status, json.loads(raw)["errcode"]), (400, "M_NOT_JSON"))
        self.assertError(call("POST", SEARCH, []), 400, "M_NOT_JSON")
        self.assertError(call("POST", SEARCH, {}), 400, "M_MISSING_PARAM")
        self.assertError(call("POST", SEARCH, {"search_categories": []}), 400, "M_BAD_JSON")
        self.assertError(call("POST", SEARCH, {"search_categories": {"room_events": 1}}),
                         400, "M_BAD_JSON")
        self.assertError(call("POST", SEARCH, {"search_categories": {"room_events": {}}}),
                         400, "M_MISSING_PARAM")
        bad = [
            ({"search_term": 5}, "M_BAD_JSON"),
            ({"search_term": None}, "M_BAD_JSON"),
            ({"search_term": "x", "order_by": "newest"}, "M_INVALID_PARAM"),
            ({"search_term": "x", "order_by": 1}, "M_BAD_JSON"),
            ({"search_term": "x", "keys": "content.body"}, "M_BAD_JSON"),
            ({"search_term": "x", "keys": ["content.sender"]}, "M_INVALID_PARAM"),
            ({"search_term": "x", "keys": [1]}, "M_BAD_JSON"),
            ({"search_term": "x", "filter": []}, "M_BAD_JSON"),
            ({"search_term": "x", "filter": {"rooms": "!a:b"}}, "M_BAD_JSON"),
            ({"search_term": "x", "filter": {"not_rooms": [1]}}, "M_BAD_JSON"),
            ({"search_term": "x", "filter": {"senders": [1]}}, "M_BAD_JSON"),
            ({"search_term": "x", "filter": {"limit": "5"}}, "M_BAD_JSON"),
            ({"search_term": "x", "filter": {"limit": 0}}, "M_INVALID_PARAM"),
            ({"search_term": "x", "filter": {"limit": -3}}, "M_INVALID_PARAM"),
            ({"search_term": "x", "event_context": []}, "M_BAD_JSON"),
            ({"search_term": "x", "event_context": {"before_limit": -1}}, "M_INVALID_PARAM"),
            ({"search_term": "x", "event_context": {"after_limit": "2"}}, "M_BAD_JSON"),
            ({"search_term": "x", "event_context": {"include_profile": "yes"}}, "M_BAD_JSON"),
            ({"search_term": "x", "include_state": 1}, "M_BAD_JSON"),
        ]
        for fields, errcode in bad:
            self.assertError(call("POST", SEARCH, {"search_categories": {"room_events": fields}}),
                             400, errcode)
        for token in ("garbage", "r", "rx1", "r-1", "r1x", "k1", "k_5", "knan_5", "kinf_5",
                      "k-1_5", "k0.5_", "k0.5_x", "r" + "9" * 70, "k0x1p3_5",
                      "r99999999999999999999", "k 0.5_5"):
            order = "recent" if token[0] == "r" else "rank"
            self.assertError(call("POST", f"{SEARCH}?next_batch={quote(token)}",
                                  room_events("x", order_by=order)), 400, "M_INVALID_PARAM")
        # A well-formed token past every result is just an empty page.
        answer = self.search(self.alice, "x", next_batch="r1", order_by="recent")
        self.assertEqual((answer["results"], "next_batch" in answer), ([], False))

    def test_search_needs_an_access_token(self):
        self.assertError(self.srv.json("POST", SEARCH, room_events("x")), 401, "M_MISSING_TOKEN")
        self.assertError(self.srv.json("POST", SEARCH, room_events("x"), token="nope"),
                         401, "M_UNKNOWN_TOKEN")
        status, body = self.srv.json("GET", SEARCH, token=self.alice.token)
        self.assertEqual(status, 405, body)


if __name__ == "__main__":
    unittest.main()
