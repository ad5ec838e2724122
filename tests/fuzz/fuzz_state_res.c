/*
 * tests/fuzz/fuzz_state_res.c - libFuzzer target: state resolution
 * (core/rooms/state_res.c, state_res_v1.c, state_res_v2.c) on graphs built from the input.
 *
 * The input's bytes describe up to FZ_EVENTS events of room "!r:fz" (each: a type among
 * the state events the auth rules read, a sender among four users, a state key, a
 * timestamp, a membership or power level, and up to four auth events, any index, so auth
 * chains may form cycles or name events the loader does not have) and up to FZ_STATES
 * states mapping keys to those events. The room version alternates between 1 and 10.
 * Checked: every outcome is one of the documented ones; a failure names why; a success
 * gives the same map when the states are resolved again in reverse order; no resolution
 * loads more than its max_events bound or an event twice.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/rooms/state_res.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size); /* libFuzzer's entry */

#define FZ_EVENTS 24
#define FZ_STATES 4
#define FZ_MAX_EVENTS 40 /* max_events for the resolution: the bound is reached too */

typedef struct fz_input {
    const uint8_t *p;
    size_t n;
} fz_input;

static unsigned take(fz_input *in)
{
    if (!in->n) return 0;
    in->n--;
    return *in->p++;
}

typedef struct fz_dag {
    json_t *pdu[FZ_EVENTS];
    char id[FZ_EVENTS][16];
    bool rejected[FZ_EVENTS];
    unsigned loaded[FZ_EVENTS];
    size_t n, loads;
} fz_dag;

static const char *const USERS[] = {"@a:fz", "@b:fz", "@c:fz", "@d:hostile"};
static const char *const MEMBERSHIP[] = {"join", "leave", "ban", "invite", "knock"};

static json_t *fz_load(void *ctx, const char *event_id, bool *rejected)
{
    fz_dag *d = ctx;
    d->loads++;
    for (size_t i = 0; i < d->n; i++)
        if (strcmp(d->id[i], event_id) == 0) {
            if (++d->loaded[i] > 1) abort(); /* "at most once per event ID" */
            *rejected = d->rejected[i];
            return json_incref(d->pdu[i]);
        }
    return NULL;
}

static json_t *fz_event(fz_input *in, fz_dag *d, size_t i, const room_version *v)
{
    unsigned kind = take(in) % 6, who = take(in) % 4, target = take(in) % 4;
    const char *type = "m.room.topic", *sk = "";
    json_t *content = json_object();
    switch (kind) {
    case 0:
        type = "m.room.create";
        json_object_set_new(content, "creator", json_string(USERS[who]));
        json_object_set_new(content, "room_version", json_string(v->id));
        break;
    case 1:
        type = "m.room.member";
        sk = USERS[target];
        json_object_set_new(content, "membership", json_string(MEMBERSHIP[take(in) % 5]));
        break;
    case 2: {
        type = "m.room.power_levels";
        json_t *users = json_object();
        json_object_set_new(users, USERS[target], json_integer((json_int_t)(take(in) % 101)));
        json_object_set_new(content, "users", users);
        json_object_set_new(content, "state_default", json_integer((json_int_t)(take(in) % 101)));
        break;
    }
    case 3:
        type = "m.room.join_rules";
        json_object_set_new(content, "join_rule", json_string(take(in) & 1 ? "public" : "invite"));
        break;
    case 4: type = "m.room.topic"; break;
    default: type = "m.room.name"; sk = (take(in) & 1) ? "x" : ""; break;
    }
    json_t *auth = json_array();
    unsigned n_auth = take(in) % 5;
    for (unsigned k = 0; k < n_auth; k++) {
        unsigned to = take(in) % (FZ_EVENTS + 2); /* past the end: a missing event */
        char ref[16];
        snprintf(ref, sizeof(ref), "$e%u:fz", to);
        json_array_append_new(auth, v->event_id_format == ROOM_EVENT_ID_OPAQUE
                                        ? json_pack("[s,{s:s}]", ref, "sha256", "AAAA")
                                        : json_string(ref));
    }
    d->rejected[i] = (take(in) & 0x0f) == 0;
    return json_pack("{s:s, s:s, s:s, s:s, s:I, s:I, s:o, s:o, s:[], s:s}", "type", type,
                     "state_key", sk, "sender", USERS[who], "room_id", "!r:fz",
                     "origin_server_ts", (json_int_t)take(in), "depth", (json_int_t)(i + 1),
                     "content", content, "auth_events", auth, "prev_events", "event_id",
                     d->id[i]);
}

static int resolve(const room_version *v, fz_dag *d, const state_map *const *states, size_t n,
                   state_map **out, state_res_report *rep)
{
    memset(d->loaded, 0, sizeof(d->loaded));
    d->loads = 0;
    state_res_request rq = {.version = v, .room_id = "!r:fz", .states = states, .n_states = n,
                            .load = fz_load, .load_ctx = d, .max_events = FZ_MAX_EVENTS};
    int rc = state_res_resolve(&rq, out, rep);
    if (rc > 0 || rc < STATE_RES_E_VERSION) abort();
    if (rc != STATE_RES_OK && (!rep->why[0] || *out)) abort();
    if (d->loads > FZ_MAX_EVENTS + 1) abort();
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_input in = {data, size};
    const room_version *v = room_version_find(take(&in) & 1 ? "1" : "10");
    fz_dag d = {0};
    d.n = 1 + take(&in) % FZ_EVENTS;
    for (size_t i = 0; i < d.n; i++) snprintf(d.id[i], sizeof(d.id[i]), "$e%zu:fz", i);
    for (size_t i = 0; i < d.n; i++) d.pdu[i] = fz_event(&in, &d, i, v);
    size_t n_states = 1 + take(&in) % FZ_STATES;
    state_map *states[FZ_STATES] = {0};
    for (size_t s = 0; s < n_states; s++) {
        states[s] = state_map_new();
        unsigned entries = take(&in) % 8;
        for (unsigned k = 0; k < entries && states[s]; k++) {
            json_t *e = d.pdu[take(&in) % d.n];
            const char *type = json_string_value(json_object_get(e, "type"));
            const char *sk = json_string_value(json_object_get(e, "state_key"));
            const char *id = json_string_value(json_object_get(e, "event_id"));
            if (state_map_set(states[s], type, sk, id) != 0) abort();
        }
    }
    state_map *a = NULL, *b = NULL;
    state_res_report ra, rb;
    const state_map *fwd[FZ_STATES], *rev[FZ_STATES];
    for (size_t s = 0; s < n_states; s++) {
        fwd[s] = states[s];
        rev[s] = states[n_states - 1 - s];
    }
    int rc1 = resolve(v, &d, fwd, n_states, &a, &ra);
    int rc2 = resolve(v, &d, rev, n_states, &b, &rb);
    if (rc1 == STATE_RES_OK && rc2 == STATE_RES_OK) {
        if (state_map_count(a) != state_map_count(b)) abort();
        const char *type, *sk, *id;
        for (size_t i = 0; state_map_entry(a, i, &type, &sk, &id); i++) {
            const char *other = state_map_get(b, type, sk);
            if (!other || strcmp(other, id) != 0) abort();
        }
    }
    state_map_free(a);
    state_map_free(b);
    for (size_t s = 0; s < n_states; s++) state_map_free(states[s]);
    for (size_t i = 0; i < d.n; i++) json_decref(d.pdu[i]);
    return 0;
}
