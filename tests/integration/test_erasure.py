"""Erasure (POST /account/deactivate with erase: true): the user's events are served redacted
to every reader who was not joined to the room at them - who joins later, or came back
after being away - while those who were joined then still see them whole; in /messages,
/sync (timeline and state), /event, /context, /search (a new reader cannot find the words)
and the unsigned prev_content of later state events; /notifications, which only members
at the event get, stays whole. What erasure covers: messages and the user's m.room.member
events (the profile they carried); the room's configuration they set (a topic) stays. A
user deactivated without erase hides nothing. The rule's edges (joined ranges, the cap)
are tests/unit/test_erasure.c; serving to other servers is in test_room_federation.py.

One server for the class: registration costs an Argon2id hash per user. Each test makes
its own room and its own users, and its own random words.
"""

import secrets
import time
import unittest

from accounts import deactivate, register
from rooms_client import SharedServerTest, V3, Client, quote

MEMBER = "m.room.member"
PUSH_WAIT_S = 10  # the push sender decides notifications after commit, on its own thread


def word():
    """A word no other test uses (letters only: one token for the search parser)."""
    return "w" + "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(10))


class ErasureTest(SharedServerTest):
    USERS = ("alice", "bob")

    # -- helpers ----------------------------------------------------------------------

    def newcomer(self, name):
        return Client(self.srv, register(self.srv, name + word()[:6]))

    def erased_sender(self, room, name, erase=True, displayname=None):
        """A user who joins room with a display name, says two things (the second mentions
        bob, so bob is notified), and is deactivated (with erase or not). Returns (user ID,
        [event IDs], [bodies])."""
        account = register(self.srv, name + word()[:6])
        who = Client(self.srv, account)
        who.ok("PUT", f"{V3}/profile/{quote(who.user_id)}/displayname",
               {"displayname": displayname or f"Secret {name}"})
        who.join(room)
        bodies = [f"first {word()}", f"bob: second {word()}"]
        ids = [who.send(room, {"msgtype": "m.text", "body": b}) for b in bodies]
        status, body = deactivate(self.srv, account, erase=erase)
        self.assertEqual(status, 200, body)
        return who.user_id, ids, bodies

    def event(self, who, room, event_id):
        return who.ok("GET", f"{V3}/rooms/{quote(room)}/event/{quote(event_id)}")

    def history(self, who, room):
        """Every event of the room the reader may see, by ID (/messages backwards)."""
        chunk = who.messages(room, dir="b", limit="1000")["chunk"]
        return {e["event_id"]: e for e in chunk}

    def search(self, who, term):
        body = {"search_categories": {"room_events": {"search_term": term}}}
        answer = who.ok("POST", f"{V3}/search", body)["search_categories"]["room_events"]
        return [r["result"]["event_id"] for r in answer["results"]]

    def sync_room(self, who, room):
        answer = who.sync(filter={"room": {"timeline": {"limit": 100}}})
        return answer["rooms"]["join"][room]

    def assertRedacted(self, event, what=""):
        self.assertEqual(event["content"], {}, f"{what}: {event}")

    def assertMemberRedacted(self, event, membership):
        self.assertEqual(event["content"], {"membership": membership}, event)

    # -- the rule ---------------------------------------------------------------------

    def test_a_reader_who_joins_later_gets_the_erased_users_events_redacted(self):
        room = self.alice.create_room(preset="public_chat")
        self.bob.join(room)
        mal, ids, bodies = self.erased_sender(room, "mal")
        alice_id = self.alice.send(room, {"msgtype": "m.text", "body": "after the erasure"})
        carol = self.newcomer("carol")
        carol.join(room)

        # /messages: the erased user's messages have no content; alice's are whole.
        seen = self.history(carol, room)
        for event_id in ids:
            self.assertRedacted(seen[event_id], "/messages")
            self.assertEqual(seen[event_id]["sender"], mal)
            self.assertEqual(seen[event_id]["type"], "m.room.message")
        self.assertEqual(seen[alice_id]["content"]["body"], "after the erasure")
        # Their membership events keep the membership, not the profile.
        members = [e for e in seen.values() if e["type"] == MEMBER and e["state_key"] == mal]
        self.assertEqual(sorted(e["content"]["membership"] for e in members), ["join", "leave"])
        for e in members:
            self.assertMemberRedacted(e, e["content"]["membership"])
            # ... and the leave's prev_content (the join's) shows no profile either.
            if "prev_content" in e.get("unsigned", {}):
                self.assertEqual(e["unsigned"]["prev_content"], {"membership": "join"}, e)
        # /event and /context.
        self.assertRedacted(self.event(carol, room, ids[0]), "/event")
        context = carol.ok("GET", f"{V3}/rooms/{quote(room)}/context/{quote(ids[0])}?limit=4")
        self.assertRedacted(context["event"], "/context event")
        after = {e["event_id"]: e for e in context["events_after"]}
        self.assertRedacted(after[ids[1]], "/context events_after")
        # /sync: timeline and state alike.
        joined = self.sync_room(carol, room)
        timeline = {e["event_id"]: e for e in joined["timeline"]["events"]}
        for event_id in ids:
            self.assertRedacted(timeline[event_id], "/sync timeline")
        for e in joined["state"]["events"] + joined["timeline"]["events"]:
            if e["type"] == MEMBER and e["state_key"] == mal:
                self.assertMemberRedacted(e, e["content"]["membership"])
        # /search: carol cannot find the erased words; bob, who was there, can.
        term = bodies[0].split()[1]
        self.assertEqual(self.search(carol, term), [])
        self.assertEqual(self.search(self.bob, term), [ids[0]])

    def test_readers_joined_at_the_events_still_see_them_whole(self):
        room = self.alice.create_room(preset="public_chat")
        self.bob.join(room)
        mal, ids, bodies = self.erased_sender(room, "mal")

        for reader in (self.alice, self.bob):
            seen = self.history(reader, room)
            self.assertEqual([seen[i]["content"]["body"] for i in ids], bodies)
            self.assertEqual(self.event(reader, room, ids[1])["content"]["body"], bodies[1])
            join = [e for e in seen.values() if e["type"] == MEMBER and e["state_key"] == mal
                    and e["content"]["membership"] == "join"]
            self.assertEqual(join[0]["content"]["displayname"], "Secret mal")
        timeline = {e["event_id"]: e for e in self.sync_room(self.bob, room)["timeline"]["events"]}
        self.assertEqual([timeline[i]["content"]["body"] for i in ids], bodies)
        # /notifications: bob was notified of the message naming him, and reads it whole.
        deadline = time.monotonic() + PUSH_WAIT_S
        while True:
            got = self.bob.ok("GET", f"{V3}/notifications")["notifications"]
            mine = [n["event"] for n in got if n["event"]["event_id"] == ids[1]]
            if mine or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self.assertEqual([e["content"]["body"] for e in mine], [bodies[1]])

    def test_a_reader_who_was_away_sees_whole_only_what_was_sent_while_joined(self):
        room = self.alice.create_room(preset="public_chat")
        dave = self.newcomer("dave")
        dave.join(room)
        account = register(self.srv, "mal" + word()[:6])
        mal = Client(self.srv, account)
        mal.join(room)
        while_joined = mal.send(room, {"msgtype": "m.text", "body": "dave hears this"})
        dave.leave(room)
        while_away = mal.send(room, {"msgtype": "m.text", "body": "dave missed this"})
        self.assertEqual(deactivate(self.srv, account, erase=True)[0], 200)
        dave.join(room)  # shared history: dave may read what he missed, but not its content

        seen = self.history(dave, room)
        self.assertEqual(seen[while_joined]["content"]["body"], "dave hears this")
        self.assertRedacted(seen[while_away], "sent while dave was away")
        self.assertEqual(self.event(dave, room, while_joined)["content"]["body"], "dave hears this")
        self.assertRedacted(self.event(dave, room, while_away), "/event, sent while away")

    def test_erasure_leaves_the_rooms_configuration_alone(self):
        room = self.alice.create_room(preset="public_chat")
        account = register(self.srv, "mal" + word()[:6])
        mal = Client(self.srv, account)
        mal.join(room)
        self.alice.ok("PUT", f"{V3}/rooms/{quote(room)}/state/m.room.power_levels/",
                      {**self.alice.state(room, "m.room.power_levels"),
                       "users": {self.alice.user_id: 100, mal.user_id: 50}})
        topic_id = mal.put_state(room, "m.room.topic", {"topic": "set by mal"})
        self.assertEqual(deactivate(self.srv, account, erase=True)[0], 200)
        carol = self.newcomer("carol")
        carol.join(room)

        self.assertEqual(carol.state(room, "m.room.topic"), {"topic": "set by mal"})
        self.assertEqual(self.event(carol, room, topic_id)["content"], {"topic": "set by mal"})
        joined = self.sync_room(carol, room)  # the topic is in the state or the timeline
        topics = [e["content"] for e in joined["state"]["events"] + joined["timeline"]["events"]
                  if e["type"] == "m.room.topic"]
        self.assertEqual(topics, [{"topic": "set by mal"}])

    def test_without_erase_nothing_is_hidden(self):
        room = self.alice.create_room(preset="public_chat")
        nora, ids, bodies = self.erased_sender(room, "nora", erase=False)
        carol = self.newcomer("carol")
        carol.join(room)

        seen = self.history(carol, room)
        self.assertEqual([seen[i]["content"]["body"] for i in ids], bodies)
        self.assertEqual(self.event(carol, room, ids[0])["content"]["body"], bodies[0])
        join = [e for e in seen.values() if e["type"] == MEMBER and e["state_key"] == nora
                and e["content"]["membership"] == "join"]
        self.assertEqual(join[0]["content"]["displayname"], "Secret nora")
        timeline = {e["event_id"]: e for e in self.sync_room(carol, room)["timeline"]["events"]}
        self.assertEqual([timeline[i]["content"]["body"] for i in ids], bodies)
        self.assertEqual(self.search(carol, bodies[0].split()[1]), [ids[0]])


if __name__ == "__main__":
    unittest.main()
