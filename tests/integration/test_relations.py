"""Relations between events (spec v1.11 "Relationships between events", "Threading", "Event
replacements"): /relations/{eventId}[/{relType}[/{eventType}]] and /threads, and the
bundled aggregations in unsigned."m.relations" of the events every reader serves
(/messages, /context, /event, /sync, /relations, /threads).

A thread shows its count, latest event and whether the viewer took part; an edit bundles
the whole newest valid replacement (same sender and type, with m.new_content); references
bundle their event IDs; annotations are not bundled (spec v1.7 on). A redacted relation
stops counting. Pagination walks every page without duplicates or gaps in both
directions; the limits are enforced; a user who was never in the room gets 403, an event
he may not see 404, and bad parameters 400.

One server and three users serve the whole class; each test makes its own rooms.
"""

import unittest
import urllib.parse

from rooms_client import SharedServerTest, V3, quote

V1 = "/_matrix/client/v1"
RELATIONS_MAX_LIMIT = 100        # core/client/rooms/crooms_relations.c
RELATIONS_DEFAULT_LIMIT = 5
REL_BUNDLE_MAX_REFERENCES = 50   # core/client/rooms/crooms_relations.h


def thread(root):
    return {"rel_type": "m.thread", "event_id": root, "is_falling_back": True,
            "m.in_reply_to": {"event_id": root}}


def ids(events):
    return [e["event_id"] for e in events]


def relations(event):
    return event.get("unsigned", {}).get("m.relations", {})


def without_age(value):
    """value without unsigned.age anywhere (it changes between two reads)."""
    if isinstance(value, dict):
        return {k: without_age(v) for k, v in value.items() if k != "age"}
    return value


class RelationsTest(SharedServerTest):
    USERS = ("alice", "bob", "carol")

    # -- helpers ------------------------------------------------------------------------

    def public_room(self, *members):
        room = self.alice.create_room(preset="public_chat")
        for m in members:
            m.join(room)
        return room

    def say(self, who, room, body, relates_to=None, event_type="m.room.message"):
        content = {"msgtype": "m.text", "body": body}
        if relates_to:
            content["m.relates_to"] = relates_to
        return who.send(room, content, event_type=event_type)

    def react(self, who, room, target, key):
        return who.send(room, {"m.relates_to": {"rel_type": "m.annotation", "event_id": target,
                                                "key": key}}, event_type="m.reaction")

    def edit(self, who, room, target, body, new_content=True):
        content = {"msgtype": "m.text", "body": "* " + body,
                   "m.relates_to": {"rel_type": "m.replace", "event_id": target}}
        if new_content:
            content["m.new_content"] = {"msgtype": "m.text", "body": body}
        return who.send(room, content)

    def rel_call(self, who, room, event_id, *tail, **params):
        path = f"{V1}/rooms/{quote(room)}/relations/{quote(event_id)}"
        path += "".join("/" + quote(t) for t in tail)
        if params:
            path += "?" + urllib.parse.urlencode(params)
        return who.call("GET", path)

    def rel(self, who, room, event_id, *tail, **params):
        status, body = self.rel_call(who, room, event_id, *tail, **params)
        self.assertEqual(status, 200, body)
        return body

    def rel_ids(self, who, room, event_id, *tail, **params):
        return ids(self.rel(who, room, event_id, *tail, **params)["chunk"])

    def thread_ids(self, who, room, **params):
        return ids(self.threads(who, room, **params)["chunk"])

    def threads_call(self, who, room, **params):
        query = "?" + urllib.parse.urlencode(params) if params else ""
        return who.call("GET", f"{V1}/rooms/{quote(room)}/threads{query}")

    def threads(self, who, room, **params):
        status, body = self.threads_call(who, room, **params)
        self.assertEqual(status, 200, body)
        return body

    def event(self, who, room, event_id):
        return who.ok("GET", f"{V3}/rooms/{quote(room)}/event/{quote(event_id)}")

    def walk(self, fetch, **params):
        """Every page of a paginated endpoint from its start: (all events, pages)."""
        seen, pages, token = [], 0, None
        while True:
            extra = dict(params, **({"from": token} if token else {}))
            page = fetch(**extra)
            pages += 1
            seen += page["chunk"]
            token = page.get("next_batch")
            if not token:
                return seen, pages
            self.assertLess(pages, 50, "pagination does not end")

    def assertError(self, answer, status, errcode):
        got_status, body = answer
        self.assertEqual((got_status, (body or {}).get("errcode")), (status, errcode), body)
        self.assertIsInstance(body.get("error"), str)

    # -- threads ------------------------------------------------------------------------

    def test_threads_list_roots_with_count_latest_event_and_participation(self):
        room = self.public_room(self.bob, self.carol)
        root = self.say(self.alice, room, "root")
        replies = [self.say(self.alice, room, "r1", thread(root)),
                   self.say(self.bob, room, "r2", thread(root)),
                   self.say(self.alice, room, "r3", thread(root))]
        other = self.say(self.bob, room, "other root")
        other_reply = self.say(self.bob, room, "o1", thread(other))
        for who, participated in ((self.alice, True), (self.bob, True), (self.carol, False)):
            chunk = self.threads(who, room)["chunk"]
            self.assertEqual(ids(chunk), [other, root], who.user_id)  # newest activity first
            summary = relations(chunk[1])["m.thread"]
            self.assertEqual(summary["count"], 3)
            self.assertEqual(summary["latest_event"]["event_id"], replies[-1])
            self.assertEqual(summary["latest_event"]["content"]["body"], "r3")
            self.assertEqual(summary["current_user_participated"], participated, who.user_id)
            # The same bundle on the root wherever it is read.
            self.assertEqual(without_age(relations(self.event(who, room, root))["m.thread"]),
                             without_age(summary))
        # alice did not take part in bob's thread (neither root nor reply).
        self.assertFalse(relations(self.threads(self.alice, room)["chunk"][0])
                         ["m.thread"]["current_user_participated"])
        self.assertEqual(self.thread_ids(self.alice, room, include="participated"), [root])
        self.assertEqual(self.thread_ids(self.bob, room, include="participated"),
                         [other, root])
        self.assertEqual(self.threads(self.carol, room, include="participated")["chunk"], [])
        # A new reply moves its thread to the front.
        self.say(self.carol, room, "r4", thread(root))
        chunk = self.threads(self.carol, room)["chunk"]
        self.assertEqual(ids(chunk), [root, other])
        self.assertEqual(relations(chunk[0])["m.thread"]["count"], 4)
        self.assertTrue(relations(chunk[0])["m.thread"]["current_user_participated"])
        self.assertEqual(self.thread_ids(self.carol, room, include="participated"), [root])
        self.assertEqual(relations(chunk[1])["m.thread"]["latest_event"]["event_id"], other_reply)

    def test_threads_paginate_one_by_one_without_duplicates_or_gaps(self):
        room = self.public_room(self.bob)
        roots = [self.say(self.alice, room, f"root {i}") for i in range(4)]
        for root in roots:                   # activity order: root 0 oldest ... root 3 newest
            self.say(self.bob, room, "reply", thread(root))
        seen, pages = self.walk(lambda **p: self.threads(self.alice, room, **p), limit="1")
        self.assertEqual(ids(seen), roots[::-1])
        self.assertEqual(pages, 4)
        seen, _ = self.walk(lambda **p: self.threads(self.alice, room, **p), limit="3")
        self.assertEqual(ids(seen), roots[::-1])
        self.assertEqual(self.thread_ids(self.alice, room), roots[::-1])

    def test_latest_thread_event_carries_its_own_edit(self):
        room = self.public_room(self.bob)
        root = self.say(self.alice, room, "root")
        reply = self.say(self.bob, room, "tpyo", thread(root))
        fix = self.edit(self.bob, room, reply, "typo")
        latest = relations(self.threads(self.alice, room)["chunk"][0])["m.thread"]["latest_event"]
        self.assertEqual(latest["event_id"], reply)  # an edit is not a thread event
        self.assertEqual(relations(latest)["m.replace"]["event_id"], fix)

    # -- /relations ---------------------------------------------------------------------

    def test_relations_filter_by_type_and_event_type_in_both_directions(self):
        room = self.public_room(self.bob)
        root = self.say(self.alice, room, "root")
        r1 = self.say(self.alice, room, "r1", thread(root))
        reaction = self.react(self.bob, room, root, "👍")
        r2 = self.say(self.bob, room, "r2", thread(root))
        ref = self.say(self.bob, room, "see above", {"rel_type": "m.reference", "event_id": root})
        r3 = self.say(self.alice, room, "r3", thread(root))
        self.say(self.alice, room, "unrelated")
        everything = [r1, reaction, r2, ref, r3]
        answer = self.rel(self.alice, room, root, limit="10")
        self.assertEqual(ids(answer["chunk"]), everything[::-1])      # dir=b: newest first
        self.assertNotIn("next_batch", answer)
        self.assertNotIn("prev_batch", answer)
        self.assertNotIn("recursion_depth", answer)
        self.assertEqual(self.rel_ids(self.alice, room, root, dir="f", limit="10"), everything)
        self.assertEqual(self.rel_ids(self.alice, room, root, "m.thread"), [r3, r2, r1])
        self.assertEqual(self.rel_ids(self.alice, room, root, "m.thread", dir="f"),
                         [r1, r2, r3])
        self.assertEqual(self.rel_ids(self.alice, room, root, "m.thread", "m.room.message"),
                         [r3, r2, r1])
        self.assertEqual(self.rel(self.alice, room, root, "m.thread", "m.reaction")["chunk"], [])
        self.assertEqual(self.rel_ids(self.alice, room, root, "m.annotation", "m.reaction"),
                         [reaction])
        self.assertEqual(self.rel_ids(self.alice, room, root, "m.reference"), [ref])
        self.assertEqual(self.rel(self.alice, room, root, "m.replace")["chunk"], [])
        # The chunk holds the events themselves in the client format.
        event = self.rel(self.alice, room, root, "m.thread", limit="1")["chunk"][0]
        self.assertEqual((event["room_id"], event["sender"], event["content"]["body"]),
                         (room, self.alice.user_id, "r3"))
        # The default limit.
        answer = self.rel(self.alice, room, root)
        self.assertEqual(len(answer["chunk"]), RELATIONS_DEFAULT_LIMIT)
        self.assertNotIn("next_batch", answer)  # exactly five exist
        # Relations of an event without any, and of a relation itself.
        self.assertEqual(self.rel(self.alice, room, r1)["chunk"], [])

    def test_relations_paginate_one_by_one_in_both_directions(self):
        room = self.public_room(self.bob)
        root = self.say(self.alice, room, "root")
        children = []
        for i in range(5):
            who = self.alice if i % 2 else self.bob
            children.append(self.say(who, room, f"c{i}", thread(root)))
            self.say(self.alice, room, "noise")
        for direction, expected in (("b", children[::-1]), ("f", children)):
            seen, pages = self.walk(lambda **p: self.rel(self.alice, room, root, **p),
                                    limit="1", dir=direction)
            self.assertEqual(ids(seen), expected, direction)
            self.assertEqual(pages, 5)
            seen, _ = self.walk(lambda **p: self.rel(self.alice, room, root, "m.thread", **p),
                                limit="2", dir=direction)
            self.assertEqual(ids(seen), expected, direction)
        # prev_batch echoes `from`; `to` ends the page; a /messages token works as `from`.
        page = self.rel(self.alice, room, root, limit="2")
        follow = self.rel(self.alice, room, root, limit="2", **{"from": page["next_batch"]})
        self.assertEqual(follow["prev_batch"], page["next_batch"])
        self.assertEqual(ids(follow["chunk"]), children[2:0:-1])
        upto = self.rel(self.alice, room, root, dir="f", limit="1")["next_batch"]
        self.assertEqual(self.rel_ids(self.alice, room, root, limit="10", to=upto),
                         children[:0:-1])
        start = self.alice.messages(room, dir="b", limit="1")["start"]
        self.assertEqual(self.rel_ids(self.alice, room, root, limit="10", **{"from": start}),
                         children[::-1])

    def test_relations_limit_is_capped(self):
        room = self.public_room()
        root = self.say(self.alice, room, "root")
        for i in range(RELATIONS_MAX_LIMIT + 1):
            self.react(self.alice, room, root, f"k{i}")
        answer = self.rel(self.alice, room, root, limit="100000")
        self.assertEqual(len(answer["chunk"]), RELATIONS_MAX_LIMIT)
        rest = self.rel(self.alice, room, root, limit="100000", **{"from": answer["next_batch"]})
        self.assertEqual(len(rest["chunk"]), 1)
        self.assertNotIn("next_batch", rest)
        self.assertNotIn("m.annotation", relations(self.event(self.alice, room, root)))

    def test_recurse_follows_relations_of_relations(self):
        room = self.public_room(self.bob)
        root = self.say(self.alice, room, "root")
        reply = self.say(self.bob, room, "reply", thread(root))
        reaction = self.react(self.alice, room, reply, "+1")
        deeper = self.react(self.bob, room, reaction, "meta")
        self.assertEqual(self.rel_ids(self.alice, room, root), [reply])
        answer = self.rel(self.alice, room, root, recurse="true", dir="f")
        self.assertEqual(ids(answer["chunk"]), [reply, reaction, deeper])
        self.assertEqual(answer["recursion_depth"], 3)
        self.assertEqual(self.rel_ids(self.alice, room, root, "m.annotation", recurse="true"),
                         [deeper, reaction])
        self.assertEqual(self.rel_ids(self.alice, room, root, recurse="false"), [reply])

    # -- bundles ------------------------------------------------------------------------

    def test_edit_bundles_the_newest_valid_replacement_in_every_reader(self):
        room = self.public_room(self.bob)
        original = self.say(self.alice, room, "helo")
        self.edit(self.alice, room, original, "hello")
        newest = self.edit(self.alice, room, original, "hello!")
        self.edit(self.bob, room, original, "hijacked")               # another sender: invalid
        self.edit(self.alice, room, original, "bare", new_content=False)  # no m.new_content
        self.say(self.alice, room, "after")

        def check(event, where):
            self.assertEqual(event["event_id"], original, where)
            replace = relations(event)["m.replace"]
            self.assertEqual(replace["event_id"], newest, where)
            self.assertEqual(replace["sender"], self.alice.user_id, where)
            self.assertEqual(replace["content"]["m.new_content"]["body"], "hello!", where)
            self.assertEqual(event["content"]["body"], "helo", where)  # the original stays

        for who in (self.alice, self.bob):
            chunk = who.messages(room, dir="b", limit="50")["chunk"]
            check(next(e for e in chunk if e["event_id"] == original), "/messages")
            check(self.event(who, room, original), "/event")
            context = who.ok("GET", f"{V3}/rooms/{quote(room)}/context/{quote(original)}?limit=4")
            check(context["event"], "/context")
        # Bundles also ride on events of the other readers' pages around the original.
        before = self.say(self.alice, room, "question")
        ref = self.say(self.bob, room, "answer", {"rel_type": "m.reference", "event_id": before})
        context = self.alice.ok("GET", f"{V3}/rooms/{quote(room)}/context/{quote(ref)}?limit=4")
        self.assertEqual(relations(context["events_before"][0])["m.reference"],
                         {"chunk": [{"event_id": ref}]})

    def test_references_are_bundled_and_annotations_are_not(self):
        room = self.public_room(self.bob)
        target = self.say(self.alice, room, "target")
        refs = [self.say(self.bob, room, f"ref {i}", {"rel_type": "m.reference",
                                                      "event_id": target}) for i in range(2)]
        self.react(self.bob, room, target, "👍")
        bundle = relations(self.event(self.alice, room, target))
        self.assertEqual(bundle, {"m.reference": {"chunk": [{"event_id": r} for r in refs]}})
        plain = self.say(self.alice, room, "nothing relates to me")
        self.assertNotIn("m.relations", self.event(self.alice, room, plain).get("unsigned", {}))

    def test_a_second_identical_reaction_is_refused_until_the_first_is_redacted(self):
        room = self.public_room(self.bob)
        target = self.say(self.alice, room, "react to me")
        first = self.react(self.bob, room, target, "🎉")
        content = {"m.relates_to": {"rel_type": "m.annotation", "event_id": target, "key": "🎉"}}
        status, body = self.bob.call("PUT", f"{V3}/rooms/{quote(room)}/send/m.reaction/dup1",
                                     content)
        self.assertEqual((status, body["errcode"]), (400, "M_DUPLICATE_ANNOTATION"), body)
        self.react(self.alice, room, target, "🎉")  # another sender: fine
        self.react(self.bob, room, target, "👀")   # another key: fine
        self.bob.ok("PUT", f"{V3}/rooms/{quote(room)}/redact/{quote(first)}/undo1", {})
        status, body = self.bob.call("PUT", f"{V3}/rooms/{quote(room)}/send/m.reaction/dup2",
                                     content)
        self.assertEqual(status, 200, body)

    def test_reference_bundle_is_capped(self):
        room = self.public_room()
        target = self.say(self.alice, room, "target")
        refs = [self.say(self.alice, room, f"r{i}", {"rel_type": "m.reference", "event_id": target})
                for i in range(REL_BUNDLE_MAX_REFERENCES + 1)]
        chunk = relations(self.event(self.alice, room, target))["m.reference"]["chunk"]
        self.assertEqual([c["event_id"] for c in chunk], refs[:REL_BUNDLE_MAX_REFERENCES])

    def test_redacted_relations_stop_counting(self):
        room = self.public_room(self.bob)
        root = self.say(self.alice, room, "root")
        replies = [self.say(self.bob, room, f"r{i}", thread(root)) for i in range(3)]
        fix = self.edit(self.alice, room, root, "root (edited)")
        self.bob.ok("PUT", f"{V3}/rooms/{quote(room)}/redact/{quote(replies[2])}/x1", {})
        self.alice.ok("PUT", f"{V3}/rooms/{quote(room)}/redact/{quote(fix)}/x2", {})
        summary = relations(self.event(self.alice, room, root))
        self.assertNotIn("m.replace", summary)
        self.assertEqual(summary["m.thread"]["count"], 2)
        self.assertEqual(summary["m.thread"]["latest_event"]["event_id"], replies[1])
        self.assertEqual(self.rel_ids(self.alice, room, root, "m.thread"),
                         replies[1::-1])
        # A thread whose only reply is redacted is no thread any more.
        lone = self.say(self.alice, room, "lone root")
        reply = self.say(self.alice, room, "only", thread(lone))
        self.assertIn(lone, self.thread_ids(self.alice, room))
        self.alice.ok("PUT", f"{V3}/rooms/{quote(room)}/redact/{quote(reply)}/x3", {})
        self.assertNotIn(lone, self.thread_ids(self.alice, room))
        # A redacted original carries no edit.
        original = self.say(self.alice, room, "gone soon")
        self.edit(self.alice, room, original, "edited")
        self.alice.ok("PUT", f"{V3}/rooms/{quote(room)}/redact/{quote(original)}/x4", {})
        self.assertNotIn("m.replace", relations(self.event(self.alice, room, original)))

    def test_sync_timeline_events_carry_the_bundle(self):
        room = self.public_room(self.bob)
        since = self.alice.sync()["next_batch"]
        root = self.say(self.alice, room, "root")
        reply = self.say(self.bob, room, "reply", thread(root))
        fix = self.edit(self.alice, room, root, "root!")
        for answer in (self.alice.sync(since=since), self.alice.sync()):
            timeline = answer["rooms"]["join"][room]["timeline"]["events"]
            event = next(e for e in timeline if e["event_id"] == root)
            bundle = relations(event)
            self.assertEqual(bundle["m.thread"]["count"], 1)
            self.assertEqual(bundle["m.thread"]["latest_event"]["event_id"], reply)
            self.assertNotIn("room_id", bundle["m.thread"]["latest_event"])  # sync's format
            self.assertTrue(bundle["m.thread"]["current_user_participated"])  # alice's root
            self.assertEqual(bundle["m.replace"]["event_id"], fix)

    # -- who may read, and bad input ----------------------------------------------------

    def test_outsiders_get_403_and_what_cannot_be_seen_is_404(self):
        room = self.alice.create_room(preset="private_chat")
        root = self.say(self.alice, room, "secret root")
        self.say(self.alice, room, "secret reply", thread(root))
        self.assertError(self.rel_call(self.carol, room, root), 403, "M_FORBIDDEN")
        self.assertError(self.rel_call(self.carol, room, root, "m.thread"), 403, "M_FORBIDDEN")
        self.assertError(self.threads_call(self.carol, room), 403, "M_FORBIDDEN")
        self.assertError(self.rel_call(self.alice, "!nowhere:localhost", root), 404, "M_NOT_FOUND")
        self.assertError(self.threads_call(self.alice, "!nowhere:localhost"), 404, "M_NOT_FOUND")
        self.assertError(self.rel_call(self.alice, room, "$unknown"), 404, "M_NOT_FOUND")
        # bob joins a "joined"-visibility room after the threads began: what he may not see
        # neither lists nor counts.
        secret_reply = self.say(self.alice, room, "secret reply 2", thread(root))
        self.alice.put_state(room, "m.room.history_visibility", {"history_visibility": "joined"})
        hidden_reply = self.say(self.alice, room, "hidden reply", thread(root))
        hidden_root = self.say(self.alice, room, "before bob")
        self.say(self.alice, room, "before bob, reply", thread(hidden_root))
        self.assertEqual(self.alice.member_action(room, "invite", self.bob.user_id)[0], 200)
        self.bob.join(room)
        seen_reply = self.say(self.alice, room, "after bob", thread(hidden_root))
        visible_root = self.say(self.alice, room, "visible root")
        self.say(self.alice, room, "visible reply", thread(visible_root))
        self.assertError(self.rel_call(self.bob, room, hidden_root), 404, "M_NOT_FOUND")
        # root is "shared" history bob sees, hidden_root he may not see although he sees a
        # reply; root's last reply he may not see either, so it does not order his list.
        chunk = self.threads(self.bob, room)["chunk"]
        self.assertEqual(ids(chunk), [visible_root, root])
        summary = relations(chunk[1])["m.thread"]
        self.assertEqual((summary["count"], summary["latest_event"]["event_id"]), (2, secret_reply))
        self.assertEqual(self.rel_ids(self.bob, room, root)[0], secret_reply)
        chunk = self.threads(self.alice, room)["chunk"]
        self.assertEqual(ids(chunk), [visible_root, hidden_root, root])
        summary = relations(chunk[2])["m.thread"]
        self.assertEqual((summary["count"], summary["latest_event"]["event_id"]), (3, hidden_reply))
        self.assertEqual(self.rel_ids(self.alice, room, hidden_root)[0], seen_reply)

    def test_bad_parameters_are_400(self):
        room = self.public_room()
        root = self.say(self.alice, room, "root")
        for params in ({"limit": "ten"}, {"limit": "-1"}, {"limit": ""}, {"dir": "x"},
                       {"from": "nope"}, {"to": "s"}, {"from": "s-1"}, {"recurse": "maybe"}):
            self.assertError(self.rel_call(self.alice, room, root, **params), 400,
                             "M_INVALID_PARAM")
        for params in ({"limit": "1.5"}, {"include": "mine"}, {"from": "t12"}):
            self.assertError(self.threads_call(self.alice, room, **params), 400, "M_INVALID_PARAM")
        self.assertError(self.rel_call(self.alice, "not-a-room", root), 400, "M_INVALID_PARAM")
        self.assertError(self.threads_call(self.alice, "not-a-room"), 400, "M_INVALID_PARAM")
        self.assertError(self.srv.json("GET", f"{V1}/rooms/{quote(room)}/threads"), 401,
                         "M_MISSING_TOKEN")
        self.assertError(self.srv.json("GET", f"{V1}/rooms/{quote(room)}/relations/{quote(root)}"),
                         401, "M_MISSING_TOKEN")
        self.assertError(self.alice.call("POST", f"{V1}/rooms/{quote(room)}/threads", {}), 405,
                         "M_UNRECOGNIZED")


if __name__ == "__main__":
    unittest.main()
