/*
 * tests/unit/test_room_auth_versions.c - the authorization rules where room versions 1 to
 * 11 differ, checked as a receiving server checks a PDU (room_auth_check_event against a
 * state): the create event, m.room.aliases (v1-5), knock (v7+), restricted joins (v8+),
 * knock_restricted (v10+), string and float power levels (before v10 and v6), the
 * notifications map (v6+), the redaction rule (v1-2), v11's implicit creator, third-party
 * invites with a real ed25519 signature, and rule 2 on the event's own auth events.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rooms/canonical_json.h"
#include "core/rooms/room_auth.h"

#define ALICE "@alice:hs" /* creator, level 100 */
#define BOB "@bob:hs"     /* moderator, level 50 */
#define CAROL "@carol:hs" /* plain member, level 0 */
#define DAVE "@dave:other" /* outsider of another server */
#define MAX_STATE 16

typedef struct room {
    int version;
    json_t *ev[MAX_STATE];
    size_t n;
} room;

static json_t *parse(const char *text)
{
    json_error_t err;
    json_t *j = json_loads(text, 0, &err);
    if (!j) fail_msg("bad test JSON: %s (%s)", err.text, text);
    return j;
}

static const room_version *ver(int n)
{
    char id[12]; /* any int */
    snprintf(id, sizeof(id), "%d", n);
    return room_version_find(id);
}

/* A PDU of the room; content is JSON text; state_key NULL for a message. */
static json_t *pdu(const room *r, const char *type, const char *state_key, const char *sender,
                   const char *content)
{
    json_t *p = json_pack("{s:s, s:s, s:s, s:o, s:i, s:i}", "room_id", "!r:hs", "type", type,
                          "sender", sender, "content", parse(content), "depth", 5,
                          "origin_server_ts", 1);
    if (state_key) json_object_set_new(p, "state_key", json_string(state_key));
    json_object_set_new(p, "prev_events", r->version <= 2 ? json_pack("[[s,{}]]", "$prev:hs")
                                                          : json_pack("[s]", "$prev"));
    json_object_set_new(p, "auth_events", json_array());
    if (r->version <= 2) json_object_set_new(p, "event_id", json_string("$new:hs"));
    return p;
}

/* Set state: replaces the event at the same (type, state_key). Takes the reference. */
static void put(room *r, json_t *ev)
{
    const char *t = json_string_value(json_object_get(ev, "type"));
    const char *k = json_string_value(json_object_get(ev, "state_key"));
    for (size_t i = 0; i < r->n; i++)
        if (strcmp(json_string_value(json_object_get(r->ev[i], "type")), t) == 0 &&
            strcmp(json_string_value(json_object_get(r->ev[i], "state_key")), k) == 0) {
            json_decref(r->ev[i]);
            r->ev[i] = ev;
            return;
        }
    assert_true(r->n < MAX_STATE);
    r->ev[r->n++] = ev;
}

static void member(room *r, const char *user, const char *membership)
{
    char content[64];
    snprintf(content, sizeof(content), "{\"membership\":\"%s\"}", membership);
    put(r, pdu(r, "m.room.member", user, user, content));
}

static void join_rule(room *r, const char *rule)
{
    char content[64];
    snprintf(content, sizeof(content), "{\"join_rule\":\"%s\"}", rule);
    put(r, pdu(r, "m.room.join_rules", "", ALICE, content));
}

/* A room of version n: Alice created it (content.creator before v11), Alice 100, Bob 50,
 * Alice, Bob and Carol joined, join rule as given. */
static void setup(room *r, int n, const char *rule)
{
    memset(r, 0, sizeof(*r));
    r->version = n;
    char create[96];
    if (n >= 11) snprintf(create, sizeof(create), "{\"room_version\":\"%d\"}", n);
    else snprintf(create, sizeof(create), "{\"creator\":\"%s\",\"room_version\":\"%d\"}", ALICE, n);
    json_t *c = pdu(r, "m.room.create", "", ALICE, create);
    json_object_set_new(c, "prev_events", json_array());
    if (n <= 2) json_object_set_new(c, "event_id", json_string("$create:hs"));
    put(r, c);
    put(r, pdu(r, "m.room.power_levels", "", ALICE,
               "{\"users\":{\"@alice:hs\":100,\"@bob:hs\":50},\"users_default\":0,\"events\":{},"
               "\"events_default\":0,\"state_default\":50,\"ban\":50,\"kick\":50,\"redact\":50,"
               "\"invite\":0,\"notifications\":{\"room\":50}}"));
    join_rule(r, rule);
    member(r, ALICE, "join");
    member(r, BOB, "join");
    member(r, CAROL, "join");
}

static void teardown(room *r)
{
    for (size_t i = 0; i < r->n; i++) json_decref(r->ev[i]);
}

static bool check(room *r, json_t *ev)
{
    room_auth_list list = {.events = (const json_t *const *)r->ev, .n = r->n};
    char why[ROOM_AUTH_WHY_LEN];
    bool ok = room_auth_check_event(ver(r->version), ev, room_auth_list_get, &list, why);
    if (!ok && !why[0]) fail_msg("refusal without a reason");
    json_decref(ev);
    return ok;
}

/* Does the rule hold in exactly the versions from..to (and no other of 1-11)? */
#define FOR_EACH_VERSION(n) for (int n = 1; n <= 11; n++)

/* ---- m.room.create ------------------------------------------------------------------ */

static void test_create_event_rules(void **state)
{
    (void)state;
    FOR_EACH_VERSION(n) {
        room r = {.version = n};
        json_t *c = pdu(&r, "m.room.create", "", ALICE, "{\"creator\":\"@alice:hs\"}");
        json_object_set_new(c, "prev_events", json_array());
        assert_true(check(&r, json_incref(c)));
        json_object_set_new(c, "room_id", json_string("!r:elsewhere"));
        assert_false(check(&r, json_incref(c)));              /* room ID of another server */
        json_object_set_new(c, "room_id", json_string("!r:hs"));
        json_object_set_new(c, "prev_events", json_pack("[s]", "$x"));
        assert_false(check(&r, json_incref(c)));              /* prev_events */
        json_object_set_new(c, "prev_events", json_array());
        json_object_set_new(json_object_get(c, "content"), "room_version", json_string("99"));
        assert_false(check(&r, json_incref(c)));              /* unknown version */
        json_object_set_new(json_object_get(c, "content"), "room_version", json_string("1"));
        assert_true(check(&r, json_incref(c)));
        /* v11: no creator needed (the sender is); before: refused without one. */
        json_object_del(json_object_get(c, "content"), "creator");
        assert_int_equal(check(&r, json_incref(c)), n >= 11);
        json_decref(c);
    }
}

static void test_creator_first_join_uses_the_creator_of_the_version(void **state)
{
    (void)state;
    FOR_EACH_VERSION(n) {
        room r = {.version = n};
        json_t *c = pdu(&r, "m.room.create", "", ALICE, n >= 11 ? "{}" : "{\"creator\":\"@bob:hs\"}");
        json_object_set_new(c, "prev_events", json_array());
        if (n <= 2) json_object_set_new(c, "event_id", json_string("$create:hs"));
        put(&r, c);
        char create_id[EVENT_ID_LEN];
        assert_int_equal(event_compute_id(ver(n), c, create_id), 0);
        /* Before v11 content.creator (Bob) is the creator; from v11 the sender (Alice). */
        const char *creator = n >= 11 ? ALICE : BOB, *other = n >= 11 ? BOB : ALICE;
        json_t *j = pdu(&r, "m.room.member", creator, creator, "{\"membership\":\"join\"}");
        json_object_set_new(j, "prev_events", n <= 2 ? json_pack("[[s,{}]]", create_id)
                                                     : json_pack("[s]", create_id));
        assert_true(check(&r, j));
        j = pdu(&r, "m.room.member", other, other, "{\"membership\":\"join\"}");
        json_object_set_new(j, "prev_events", n <= 2 ? json_pack("[[s,{}]]", create_id)
                                                     : json_pack("[s]", create_id));
        assert_false(check(&r, j));
        teardown(&r);
    }
}

/* ---- m.room.aliases ----------------------------------------------------------------- */

static void test_aliases_need_only_the_servers_own_state_key_before_v6(void **state)
{
    (void)state;
    FOR_EACH_VERSION(n) {
        room r;
        setup(&r, n, "invite");
        /* Dave is no member; in v1-5 his server may still publish its aliases. */
        assert_int_equal(check(&r, pdu(&r, "m.room.aliases", "other", DAVE, "{\"aliases\":[]}")), n <= 5);
        assert_false(check(&r, pdu(&r, "m.room.aliases", "hs", DAVE, "{\"aliases\":[]}")));
        /* From v6 it is an ordinary state event: Bob (50) may, Carol (0) may not. */
        assert_true(check(&r, pdu(&r, "m.room.aliases", "hs", BOB, "{\"aliases\":[]}")));
        assert_int_equal(check(&r, pdu(&r, "m.room.aliases", "hs", CAROL, "{\"aliases\":[]}")), n <= 5);
        teardown(&r);
    }
}

/* ---- knock, restricted, knock_restricted ---------------------------------------------- */

static void test_knock_exists_from_v7_and_knock_restricted_from_v10(void **state)
{
    (void)state;
    FOR_EACH_VERSION(n) {
        room r;
        setup(&r, n, "knock");
        assert_int_equal(check(&r, pdu(&r, "m.room.member", DAVE, DAVE, "{\"membership\":\"knock\"}")), n >= 7);
        assert_false(check(&r, pdu(&r, "m.room.member", DAVE, CAROL, "{\"membership\":\"knock\"}")));
        member(&r, DAVE, "knock");
        /* A knock is withdrawn by leaving (v7+), and an invite may follow it. */
        assert_int_equal(check(&r, pdu(&r, "m.room.member", DAVE, DAVE, "{\"membership\":\"leave\"}")), n >= 7);
        assert_true(check(&r, pdu(&r, "m.room.member", DAVE, BOB, "{\"membership\":\"invite\"}")));
        member(&r, DAVE, "invite");
        /* Join rule knock lets the invited in (v7+); before v7 it is no join rule at all. */
        assert_int_equal(check(&r, pdu(&r, "m.room.member", DAVE, DAVE, "{\"membership\":\"join\"}")), n >= 7);
        assert_false(check(&r, pdu(&r, "m.room.member", DAVE, DAVE, "{\"membership\":\"knock\"}")));
        member(&r, DAVE, "ban");
        assert_false(check(&r, pdu(&r, "m.room.member", DAVE, DAVE, "{\"membership\":\"knock\"}")));
        teardown(&r);

        setup(&r, n, "knock_restricted");
        assert_int_equal(check(&r, pdu(&r, "m.room.member", DAVE, DAVE, "{\"membership\":\"knock\"}")), n >= 10);
        teardown(&r);
        setup(&r, n, "public");
        assert_false(check(&r, pdu(&r, "m.room.member", DAVE, DAVE, "{\"membership\":\"knock\"}")));
        teardown(&r);
    }
}

static void test_restricted_joins_need_a_joined_authoriser_who_may_invite(void **state)
{
    (void)state;
    const char *via_bob = "{\"membership\":\"join\",\"join_authorised_via_users_server\":\"@bob:hs\"}";
    const char *via_carol = "{\"membership\":\"join\",\"join_authorised_via_users_server\":\"@carol:hs\"}";
    const char *via_erin = "{\"membership\":\"join\",\"join_authorised_via_users_server\":\"@erin:hs\"}";
    FOR_EACH_VERSION(n) {
        const char *rules[] = {"restricted", "knock_restricted"};
        for (int k = 0; k < 2; k++) {
            int from = k == 0 ? 8 : 10;
            room r;
            setup(&r, n, rules[k]);
            assert_int_equal(check(&r, pdu(&r, "m.room.member", DAVE, DAVE, via_bob)), n >= from);
            assert_false(check(&r, pdu(&r, "m.room.member", DAVE, DAVE, "{\"membership\":\"join\"}")));
            assert_false(check(&r, pdu(&r, "m.room.member", DAVE, DAVE, via_erin))); /* not joined */
            /* Carol (0) may invite while the invite level is 0, not once it is 50. */
            assert_int_equal(check(&r, pdu(&r, "m.room.member", DAVE, DAVE, via_carol)), n >= from);
            put(&r, pdu(&r, "m.room.power_levels", "", ALICE,
                        "{\"users\":{\"@alice:hs\":100,\"@bob:hs\":50},\"invite\":50}"));
            assert_false(check(&r, pdu(&r, "m.room.member", DAVE, DAVE, via_carol)));
            assert_int_equal(check(&r, pdu(&r, "m.room.member", DAVE, DAVE, via_bob)), n >= from);
            /* The invited join without an authoriser. */
            member(&r, DAVE, "invite");
            assert_int_equal(check(&r, pdu(&r, "m.room.member", DAVE, DAVE, "{\"membership\":\"join\"}")),
                             n >= from);
            member(&r, DAVE, "ban");
            assert_false(check(&r, pdu(&r, "m.room.member", DAVE, DAVE, via_bob)));
            teardown(&r);
        }
    }
}

/* ---- power levels --------------------------------------------------------------------- */

static void test_string_power_levels_count_before_v10_and_are_refused_from_it(void **state)
{
    (void)state;
    FOR_EACH_VERSION(n) {
        room r;
        setup(&r, n, "public");
        const char *stringy = "{\"users\":{\"@alice:hs\":\" +0100 \",\"@bob:hs\":\"50\"},"
                              "\"state_default\":\"50\",\"ban\":\"50\"}";
        assert_int_equal(check(&r, pdu(&r, "m.room.power_levels", "", ALICE, stringy)), n < 10);
        const char *bad_user = "{\"users\":{\"@alice:hs\":100,\"@bob:hs\":\"fifty\"}}";
        assert_false(check(&r, pdu(&r, "m.room.power_levels", "", ALICE, bad_user)));
        const char *not_user = "{\"users\":{\"alice\":100}}";
        assert_false(check(&r, pdu(&r, "m.room.power_levels", "", ALICE, not_user)));
        const char *events_str = "{\"users\":{\"@alice:hs\":100},\"events\":{\"m.room.name\":\"50\"}}";
        assert_int_equal(check(&r, pdu(&r, "m.room.power_levels", "", ALICE, events_str)), n < 10);
        /* Levels in the state are read as the version reads them: a string 100 before v10. */
        put(&r, pdu(&r, "m.room.power_levels", "", ALICE,
                    "{\"users\":{\"@alice:hs\":100,\"@carol:hs\":\"100\"},\"kick\":\"100\"}"));
        assert_int_equal(check(&r, pdu(&r, "m.room.member", BOB, CAROL, "{\"membership\":\"leave\"}")), n < 10);
        teardown(&r);
    }
    int64_t lv;
    json_t *real = json_real(50.57);
    assert_true(room_auth_level_value(ver(5), real, &lv) && lv == 50);
    json_decref(real);
    real = json_real(-3.9);
    assert_true(room_auth_level_value(ver(1), real, &lv) && lv == -3);
    assert_false(room_auth_level_value(ver(6), real, &lv));
    json_decref(real);
    json_t *s = json_string("-007");
    assert_true(room_auth_level_value(ver(9), s, &lv) && lv == -7);
    assert_false(room_auth_level_value(ver(10), s, &lv));
    json_decref(s);
    const char *bad[] = {"", " ", "+", "1.5", "1e2", "--1", "1 2", "0x10", "99999999999999999999"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        s = json_string(bad[i]);
        assert_false(room_auth_level_value(ver(1), s, &lv));
        json_decref(s);
    }
}

static void test_notifications_levels_are_guarded_from_v6(void **state)
{
    (void)state;
    FOR_EACH_VERSION(n) {
        room r;
        setup(&r, n, "public");
        /* Bob (50) may change power levels once the level to do so is 50. */
        put(&r, pdu(&r, "m.room.power_levels", "", ALICE,
                    "{\"users\":{\"@alice:hs\":100,\"@bob:hs\":50},\"notifications\":{\"room\":100}}"));
        const char *lower = "{\"users\":{\"@alice:hs\":100,\"@bob:hs\":50},\"notifications\":{\"room\":0}}";
        assert_int_equal(check(&r, pdu(&r, "m.room.power_levels", "", BOB, lower)), n < 6);
        const char *raise = "{\"users\":{\"@alice:hs\":100,\"@bob:hs\":50},\"notifications\":{\"room\":100,"
                            "\"x\":75}}";
        assert_int_equal(check(&r, pdu(&r, "m.room.power_levels", "", BOB, raise)), n < 6);
        teardown(&r);
    }
}

/* ---- redactions ----------------------------------------------------------------------- */

static void test_redaction_auth_rule_exists_only_in_v1_and_v2(void **state)
{
    (void)state;
    FOR_EACH_VERSION(n) {
        room r;
        setup(&r, n, "public");
        /* Carol (0 < redact 50) redacts an event of another server: only v1-2 refuse it
         * (v3+ leave redaction rights to the moment the redaction is applied). */
        json_t *red = pdu(&r, "m.room.redaction", NULL, CAROL, "{}");
        json_object_set_new(red, "redacts", json_string("$theirs:other"));
        assert_int_equal(check(&r, red), n > 2);
        red = pdu(&r, "m.room.redaction", NULL, CAROL, "{}");
        json_object_set_new(red, "redacts", json_string("$ours:hs"));
        assert_true(check(&r, red));
        red = pdu(&r, "m.room.redaction", NULL, BOB, "{}");
        json_object_set_new(red, "redacts", json_string("$theirs:other"));
        assert_true(check(&r, red));
        teardown(&r);
    }
}

/* ---- membership rules shared by all versions ------------------------------------------ */

static void test_unban_needs_the_kick_level_too(void **state)
{
    (void)state;
    FOR_EACH_VERSION(n) {
        room r;
        setup(&r, n, "public");
        put(&r, pdu(&r, "m.room.power_levels", "", ALICE,
                    "{\"users\":{\"@alice:hs\":100,\"@bob:hs\":50},\"ban\":50,\"kick\":75}"));
        member(&r, DAVE, "ban");
        assert_false(check(&r, pdu(&r, "m.room.member", DAVE, BOB, "{\"membership\":\"leave\"}")));
        assert_true(check(&r, pdu(&r, "m.room.member", DAVE, ALICE, "{\"membership\":\"leave\"}")));
        /* The banned cannot leave, join or be invited. */
        assert_false(check(&r, pdu(&r, "m.room.member", DAVE, DAVE, "{\"membership\":\"leave\"}")));
        assert_false(check(&r, pdu(&r, "m.room.member", DAVE, DAVE, "{\"membership\":\"join\"}")));
        assert_false(check(&r, pdu(&r, "m.room.member", DAVE, BOB, "{\"membership\":\"invite\"}")));
        /* A user-named state key belongs to that user; events need a joined sender. */
        assert_false(check(&r, pdu(&r, "x.state", CAROL, BOB, "{}")));
        assert_false(check(&r, pdu(&r, "m.room.message", NULL, DAVE, "{}")));
        teardown(&r);
    }
}

/* ---- third-party invites -------------------------------------------------------------- */

typedef struct idserver {
    unsigned char pk[crypto_sign_PUBLICKEYBYTES], sk[crypto_sign_SECRETKEYBYTES];
    char pk_b64[64];
} idserver;

static void idserver_new(idserver *ids)
{
    crypto_sign_keypair(ids->pk, ids->sk);
    cjson_b64(ids->pk, sizeof(ids->pk), false, ids->pk_b64, sizeof(ids->pk_b64));
}

/* The `signed` object an identity server hands the invited user's server. */
static json_t *signed_by(const idserver *ids, const char *mxid, const char *token)
{
    json_t *s = json_pack("{s:s, s:s, s:s}", "mxid", mxid, "token", token, "sender", ALICE);
    size_t len;
    char *canon = cjson_encode(s, &len);
    unsigned char sig[crypto_sign_BYTES];
    crypto_sign_detached(sig, NULL, (const unsigned char *)canon, len, ids->sk);
    free(canon);
    char sig_b64[128];
    cjson_b64(sig, sizeof(sig), false, sig_b64, sizeof(sig_b64));
    json_object_set_new(s, "signatures", json_pack("{s:{s:s}}", "id.example", "ed25519:0", sig_b64));
    return s;
}

static json_t *tp_invite(room *r, const char *sender, const char *target, json_t *signed_obj)
{
    json_t *ev = pdu(r, "m.room.member", target, sender, "{\"membership\":\"invite\"}");
    json_object_set_new(json_object_get(ev, "content"), "third_party_invite",
                        json_pack("{s:s, s:o}", "display_name", "d...@example.com", "signed", signed_obj));
    return ev;
}

static void test_third_party_invites_need_the_identity_servers_signature(void **state)
{
    (void)state;
    idserver ids, other;
    idserver_new(&ids);
    idserver_new(&other);
    FOR_EACH_VERSION(n) {
        room r;
        setup(&r, n, "invite");
        char content[256];
        snprintf(content, sizeof(content), "{\"display_name\":\"d...\",\"key_validity_url\":\"x\","
                 "\"public_key\":\"%s\",\"public_keys\":[]}", other.pk_b64);
        put(&r, pdu(&r, "m.room.third_party_invite", "tok", ALICE, content));
        /* A key in public_keys counts as much as public_key. */
        assert_false(check(&r, tp_invite(&r, ALICE, DAVE, signed_by(&ids, DAVE, "tok"))));
        snprintf(content, sizeof(content), "{\"display_name\":\"d...\",\"public_key\":\"%s\","
                 "\"public_keys\":[{\"public_key\":\"%s\"}]}", other.pk_b64, ids.pk_b64);
        put(&r, pdu(&r, "m.room.third_party_invite", "tok", ALICE, content));
        assert_true(check(&r, tp_invite(&r, ALICE, DAVE, signed_by(&ids, DAVE, "tok"))));
        /* Another user's signed token, an unknown token, another inviter, a tampered
         * object, a banned target: each refused. */
        assert_false(check(&r, tp_invite(&r, ALICE, CAROL, signed_by(&ids, DAVE, "tok"))));
        assert_false(check(&r, tp_invite(&r, ALICE, DAVE, signed_by(&ids, DAVE, "nope"))));
        assert_false(check(&r, tp_invite(&r, BOB, DAVE, signed_by(&ids, DAVE, "tok"))));
        json_t *s = signed_by(&ids, DAVE, "tok");
        json_object_set_new(s, "sender", json_string(BOB));
        assert_false(check(&r, tp_invite(&r, ALICE, DAVE, s)));
        s = signed_by(&ids, DAVE, "tok");
        json_object_del(s, "token");
        assert_false(check(&r, tp_invite(&r, ALICE, DAVE, s)));
        member(&r, DAVE, "ban");
        assert_false(check(&r, tp_invite(&r, ALICE, DAVE, signed_by(&ids, DAVE, "tok"))));
        /* m.room.third_party_invite itself needs the invite level. */
        put(&r, pdu(&r, "m.room.power_levels", "", ALICE, "{\"users\":{\"@alice:hs\":100},\"invite\":50}"));
        assert_false(check(&r, pdu(&r, "m.room.third_party_invite", "t2", CAROL, "{}")));
        assert_true(check(&r, pdu(&r, "m.room.third_party_invite", "t2", ALICE, "{}")));
        teardown(&r);
    }
}

/* ---- rule 2: the event's own auth events ----------------------------------------------- */

static bool auth_events_ok(room *r, json_t *ev, const json_t *const *auth, size_t n)
{
    char why[ROOM_AUTH_WHY_LEN];
    bool ok = room_auth_check_auth_events(ver(r->version), ev, auth, n, why);
    if (!ok && !why[0]) fail_msg("refusal without a reason");
    return ok;
}

static void test_auth_events_must_be_the_selected_ones_once_each(void **state)
{
    (void)state;
    FOR_EACH_VERSION(n) {
        room r;
        setup(&r, n, "restricted");
        const json_t *create = r.ev[0], *pl = r.ev[1], *jr = r.ev[2], *alice = r.ev[3], *bob = r.ev[4];
        json_t *msg = pdu(&r, "m.room.message", NULL, ALICE, "{}");
        const json_t *good[] = {create, pl, alice};
        assert_true(auth_events_ok(&r, msg, good, 3));
        const json_t *dup[] = {create, pl, alice, pl};
        assert_false(auth_events_ok(&r, msg, dup, 4));
        const json_t *no_create[] = {pl, alice};
        assert_false(auth_events_ok(&r, msg, no_create, 2));
        const json_t *extra[] = {create, pl, alice, jr};
        assert_false(auth_events_ok(&r, msg, extra, 4)); /* join rules: only for memberships */
        const json_t *bobs[] = {create, pl, bob};
        assert_false(auth_events_ok(&r, msg, bobs, 3));  /* someone else's membership */
        json_t *foreign = json_deep_copy(pl);
        json_object_set_new(foreign, "room_id", json_string("!other:hs"));
        const json_t *other_room[] = {create, foreign, alice};
        assert_false(auth_events_ok(&r, msg, other_room, 3));
        json_decref(foreign);
        json_decref(msg);

        /* A restricted join names its authoriser's membership: selected from v8. */
        json_t *join = pdu(&r, "m.room.member", DAVE, DAVE,
                           "{\"membership\":\"join\",\"join_authorised_via_users_server\":\"@bob:hs\"}");
        const json_t *with_via[] = {create, pl, jr, bob};
        assert_int_equal(auth_events_ok(&r, join, with_via, 4), n >= 8);
        const json_t *plain[] = {create, pl, jr};
        assert_true(auth_events_ok(&r, join, plain, 3));
        json_decref(join);
        /* The create event has none to check. */
        assert_true(auth_events_ok(&r, (json_t *)create, NULL, 0));
        teardown(&r);
    }
}

int main(void)
{
    if (sodium_init() < 0) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_event_rules),
        cmocka_unit_test(test_creator_first_join_uses_the_creator_of_the_version),
        cmocka_unit_test(test_aliases_need_only_the_servers_own_state_key_before_v6),
        cmocka_unit_test(test_knock_exists_from_v7_and_knock_restricted_from_v10),
        cmocka_unit_test(test_restricted_joins_need_a_joined_authoriser_who_may_invite),
        cmocka_unit_test(test_string_power_levels_count_before_v10_and_are_refused_from_it),
        cmocka_unit_test(test_notifications_levels_are_guarded_from_v6),
        cmocka_unit_test(test_redaction_auth_rule_exists_only_in_v1_and_v2),
        cmocka_unit_test(test_unban_needs_the_kick_level_too),
        cmocka_unit_test(test_third_party_invites_need_the_identity_servers_signature),
        cmocka_unit_test(test_auth_events_must_be_the_selected_ones_once_each),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
