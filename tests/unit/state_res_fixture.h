/*
 * tests/unit/state_res_fixture.h - the DAGs the state resolution tests build by hand from
 * real PDUs (test_state_res.c, test_state_res_failures.c), and the resolution calls and
 * checks they share.
 *
 * Every room starts from the same base (the events a room's creation writes, plus a topic
 * Bob set): create (Alice), Alice joins, power levels PL1 (Alice 100, Bob 50, ban/kick/
 * state_default 50), join rules public, Bob joins, Carol joins, Bob's topic. Forks are
 * branches of it; each event's auth events are chosen from its branch's state as the spec
 * says (create, power levels, the sender's membership, and for memberships the target's
 * and the join rules), and each is checked against that state when built, so the DAGs are
 * ones a correct server could produce. Functions are static inline: each test file uses
 * only some of them.
 */
#ifndef ATRIUM_TESTS_UNIT_STATE_RES_FIXTURE_H
#define ATRIUM_TESTS_UNIT_STATE_RES_FIXTURE_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rooms/room_auth.h"
#include "core/rooms/state_res.h"

#define ROOM "!room:hs"
#define ALICE "@alice:hs"
#define BOB "@bob:hs"
#define CAROL "@carol:hs"
#define DAVE "@dave:hs"
#define ERIN "@erin:hs"
#define DAG_MAX_EVENTS 1200
#define DEEP_CHAIN_EVENTS 1000

#define PL1_CONTENT                                                                           \
    "{\"users\":{\"@alice:hs\":100,\"@bob:hs\":50},\"users_default\":0,\"events\":{},"        \
    "\"events_default\":0,\"state_default\":50,\"ban\":50,\"kick\":50,\"redact\":50,"         \
    "\"invite\":0}"

typedef struct tev {
    char name[32];
    char id[EVENT_MAX_ID_BYTES + 1];
    json_t *pdu;
    bool rejected;
} tev;

typedef struct dag {
    const room_version *v;
    bool own_ids; /* versions 1, 2: "$name:hs" IDs in the PDU; later: reference hashes */
    tev *ev;      /* DAG_MAX_EVENTS, never moved: ids handed out stay valid */
    size_t n;
    const char *hide; /* an event ID the loader does not have */
    size_t loads;
} dag;

typedef struct branch {
    dag *d;
    state_map *state;
    char last[EVENT_MAX_ID_BYTES + 1];
    int64_t depth;
} branch;

static inline json_t *parse(const char *text)
{
    json_error_t err;
    json_t *j = json_loads(text, 0, &err);
    if (!j) fail_msg("bad test JSON: %s", err.text);
    return j;
}

static inline void dag_init(dag *d, const room_version *v)
{
    memset(d, 0, sizeof(*d));
    d->v = v;
    assert_non_null(v);
    d->own_ids = v->event_id_format == ROOM_EVENT_ID_OPAQUE;
    d->ev = calloc(DAG_MAX_EVENTS, sizeof(*d->ev));
    assert_non_null(d->ev);
}

static inline void dag_free(dag *d)
{
    for (size_t i = 0; i < d->n; i++) json_decref(d->ev[i].pdu);
    free(d->ev);
}

static inline tev *find_id(dag *d, const char *id)
{
    for (size_t i = 0; i < d->n; i++)
        if (strcmp(d->ev[i].id, id) == 0) return &d->ev[i];
    return NULL;
}

/* The ID of the event built under name. */
static inline const char *id_of(dag *d, const char *name)
{
    for (size_t i = 0; i < d->n; i++)
        if (strcmp(d->ev[i].name, name) == 0) return d->ev[i].id;
    fail_msg("no event named %s", name);
    return NULL;
}

static inline json_t *loader(void *ctx, const char *event_id, bool *rejected)
{
    dag *d = ctx;
    d->loads++;
    if (d->hide && strcmp(event_id, d->hide) == 0) return NULL;
    tev *e = find_id(d, event_id);
    if (!e) return NULL;
    *rejected = e->rejected;
    return json_incref(e->pdu);
}

static inline const json_t *branch_get(void *ctx, const char *type, const char *state_key)
{
    branch *b = ctx;
    const char *id = state_map_get(b->state, type, state_key);
    tev *e = id ? find_id(b->d, id) : NULL;
    return e ? e->pdu : NULL;
}

static inline void add_ref(branch *b, json_t *list, const char *id)
{
    if (!id) return;
    for (size_t i = 0; i < json_array_size(list); i++) {
        json_t *r = json_array_get(list, i);
        if (strcmp(json_string_value(json_is_array(r) ? json_array_get(r, 0) : r), id) == 0) return;
    }
    json_array_append_new(list, b->d->own_ids ? json_pack("[s,{s:s}]", id, "sha256", "AAAA")
                                              : json_string(id));
}

/* Build an event on branch b (its prev event is the branch's last), check that the rules
 * allow it in the branch's state, and apply it. Returns its ID. */
static inline const char *emit(branch *b, const char *name, const char *type,
                               const char *state_key, const char *sender, int64_t ts,
                               const char *content)
{
    dag *d = b->d;
    assert_true(d->n < DAG_MAX_EVENTS);
    json_t *pdu = json_pack("{s:s, s:s, s:s, s:I, s:I, s:o}", "type", type, "sender", sender,
                            "room_id", ROOM, "origin_server_ts", (json_int_t)ts, "depth",
                            (json_int_t)(b->depth + 1), "content", parse(content));
    if (state_key) json_object_set_new(pdu, "state_key", json_string(state_key));
    json_t *auth = json_array(), *prev = json_array();
    if (strcmp(type, "m.room.create") != 0) {
        add_ref(b, auth, state_map_get(b->state, "m.room.create", ""));
        add_ref(b, auth, state_map_get(b->state, "m.room.power_levels", ""));
        add_ref(b, auth, state_map_get(b->state, "m.room.member", sender));
    }
    if (strcmp(type, "m.room.member") == 0) {
        const char *m = json_string_value(json_object_get(json_object_get(pdu, "content"),
                                                          "membership"));
        add_ref(b, auth, state_map_get(b->state, "m.room.member", state_key));
        if (strcmp(m, "join") == 0 || strcmp(m, "invite") == 0 || strcmp(m, "knock") == 0)
            add_ref(b, auth, state_map_get(b->state, "m.room.join_rules", ""));
    }
    if (b->last[0]) add_ref(b, prev, b->last);
    json_object_set_new(pdu, "auth_events", auth);
    json_object_set_new(pdu, "prev_events", prev);
    tev *e = &d->ev[d->n];
    snprintf(e->name, sizeof(e->name), "%s", name);
    if (d->own_ids) {
        snprintf(e->id, sizeof(e->id), "$%s:hs", name);
        json_object_set_new(pdu, "event_id", json_string(e->id));
        assert_int_equal(event_add_content_hash(pdu), 0);
    } else {
        char id[EVENT_ID_LEN];
        assert_int_equal(event_finalize(d->v, pdu, id, NULL), EVENT_OK);
        snprintf(e->id, sizeof(e->id), "%s", id);
    }
    char why[ROOM_AUTH_WHY_LEN];
    if (!room_auth_check_event(d->v, pdu, branch_get, b, why))
        fail_msg("test DAG: %s is not allowed on its branch: %s", name, why);
    e->pdu = pdu;
    d->n++;
    if (state_key) assert_int_equal(state_map_set(b->state, type, state_key, e->id), 0);
    snprintf(b->last, sizeof(b->last), "%s", e->id);
    b->depth++;
    return e->id;
}

static inline const char *join(branch *b, const char *name, const char *user, int64_t ts)
{
    return emit(b, name, "m.room.member", user, user, ts, "{\"membership\":\"join\"}");
}

/* The base room: depths 1..7, timestamps 1000..1006. */
static inline branch base_room(dag *d)
{
    branch b = {.d = d, .state = state_map_new()};
    assert_non_null(b.state);
    char create[128];
    snprintf(create, sizeof(create), "{\"creator\":\"%s\",\"room_version\":\"%s\"}", ALICE,
             d->v->id);
    emit(&b, "create", "m.room.create", "", ALICE, 1000, create);
    join(&b, "alice", ALICE, 1001);
    emit(&b, "pl1", "m.room.power_levels", "", ALICE, 1002, PL1_CONTENT);
    emit(&b, "jr", "m.room.join_rules", "", ALICE, 1003, "{\"join_rule\":\"public\"}");
    join(&b, "bob", BOB, 1004);
    join(&b, "carol", CAROL, 1005);
    emit(&b, "topic", "m.room.topic", "", BOB, 1006, "{\"topic\":\"base\"}");
    return b;
}

static inline branch fork_of(const branch *b)
{
    branch f = *b;
    f.state = state_map_copy(b->state);
    assert_non_null(f.state);
    return f;
}

static inline int resolve_states(dag *d, const state_map *const *states, size_t n,
                                 size_t max_events, state_map **out, state_res_report *rep)
{
    state_res_request rq = {.version = d->v, .room_id = ROOM, .states = states, .n_states = n,
                            .load = loader, .load_ctx = d, .max_events = max_events};
    return state_res_resolve(&rq, out, rep);
}

/* Resolve {x, y} and {y, x}: the answer must not depend on the order of the states.
 * Returns the first result; rep gets the first report. */
static inline state_map *resolve2(const branch *x, const branch *y, state_res_report *rep)
{
    const state_map *xy[] = {x->state, y->state}, *yx[] = {y->state, x->state};
    state_map *a, *b;
    state_res_report rep2;
    assert_int_equal(resolve_states(x->d, xy, 2, 0, &a, rep), STATE_RES_OK);
    assert_int_equal(resolve_states(x->d, yx, 2, 0, &b, &rep2), STATE_RES_OK);
    assert_int_equal(state_map_count(a), state_map_count(b));
    const char *type, *sk, *id;
    for (size_t i = 0; state_map_entry(a, i, &type, &sk, &id); i++)
        assert_string_equal(state_map_get(b, type, sk), id);
    state_map_free(b);
    return a;
}

static inline void assert_at(const state_map *m, const char *type, const char *state_key,
                             const char *want)
{
    const char *got = state_map_get(m, type, state_key);
    if (!want) {
        if (got) fail_msg("(%s, %s) is %s, expected nothing", type, state_key, got);
        return;
    }
    if (!got) fail_msg("(%s, %s) is missing, expected %s", type, state_key, want);
    assert_string_equal(got, want);
}

static inline void free_branches(branch *a, branch *b, branch *c)
{
    state_map_free(a->state);
    state_map_free(b->state);
    if (c) state_map_free(c->state);
}

static inline const room_version *v1(void)
{
    return room_version_find("1");
}

static inline const room_version *v2(void)
{
    return room_version_find("2");
}

#endif
