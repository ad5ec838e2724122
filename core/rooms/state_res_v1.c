/*
 * core/rooms/state_res_v1.c - the original state resolution, the algorithm of room
 * version 1 (the spec's "State resolution" section of room version 1).
 *
 * R starts as the keys only one event ID holds (a key some states lack is not a conflict
 * here, unlike v2). Then the conflicted keys are resolved in passes: the power levels,
 * then the join rules, then the memberships, each key by `auth_pass`: its events sorted by
 * ascending depth and then descending SHA-1 of the event ID, the first taken as it is,
 * each next one taken while the rules allow it in R with the one before it, the pass over
 * that key ending at the first refusal. Every other conflicted key gets `normal_pick`: the
 * event of greatest depth, then smallest SHA-1 of its ID, that the rules allow in R. The
 * checks read R alone: v1 has no fallback to an event's own auth events, so a key still in
 * conflict reads as absent.
 *
 * Where the spec leaves a detail open this follows Synapse, whose servers created most
 * version 1 rooms: the keys of one pass are each resolved against R as it was before the
 * pass (R takes the pass's results at its end), and when the rules refuse every event of
 * a normal key, the last in that order (least depth) is taken. SHA-1 comes from
 * core/runtime/hmac_sha1.h; this algorithm is its only other use, because the spec
 * names it.
 */
#include <stdlib.h>
#include <string.h>

#include "core/runtime/hmac_sha1.h"
#include "core/rooms/state_res_internal.h"

typedef struct v1_key {
    int64_t depth;
    unsigned char sha1[RT_SHA1_DIGEST_BYTES];
    uint32_t e;
} v1_key;

/* Ascending depth, then descending SHA-1: the order of the auth passes. */
static int auth_order(const void *a, const void *b)
{
    const v1_key *x = a, *y = b;
    if (x->depth != y->depth) return x->depth < y->depth ? -1 : 1;
    return -memcmp(x->sha1, y->sha1, RT_SHA1_DIGEST_BYTES);
}

/* Descending depth, then ascending SHA-1: the order of the normal keys. */
static int normal_order(const void *a, const void *b)
{
    return -auth_order(a, b);
}

/* The events of one conflicted key, loaded and sorted by cmp into keys (room for k->n). */
static int sorted_events(sr_ctx *c, const sr_conflict *k, int (*cmp)(const void *, const void *),
                         v1_key *keys)
{
    for (size_t i = 0; i < k->n; i++) {
        int rc = sr_load(c, k->ids[i], &keys[i].e);
        if (rc != STATE_RES_OK) return rc;
        const sr_event *ev = &c->ev[keys[i].e];
        if (!ev->state_key || strcmp(ev->type, k->type) != 0 || strcmp(ev->state_key, k->state_key) != 0)
            return sr_fail(c, STATE_RES_E_BAD_EVENT, ev->id, "Event %.80s is not the state event "
                           "at (%.64s, %.64s)", ev->id, k->type, k->state_key);
        keys[i].depth = ev->depth;
        rt_sha1_ctx h;
        rt_sha1_init(&h);
        rt_sha1_update(&h, ev->id, strlen(ev->id));
        rt_sha1_final(&h, keys[i].sha1);
    }
    qsort(keys, k->n, sizeof(*keys), cmp);
    return STATE_RES_OK;
}

/* One key of an auth pass: the event it resolves to, into *pick. */
static int auth_pass(sr_ctx *c, const state_map *r, const sr_conflict *k, uint32_t *pick)
{
    v1_key *keys = malloc(k->n * sizeof(*keys));
    if (!keys) return sr_fail(c, STATE_RES_E_NOMEM, NULL, "Out of memory");
    int rc = sorted_events(c, k, auth_order, keys);
    if (rc == STATE_RES_OK) *pick = keys[0].e;
    for (size_t i = 1; rc == STATE_RES_OK && i < k->n; i++) {
        bool ok;
        rc = sr_allowed(c, keys[i].e, r, false, k->type, k->state_key, *pick, &ok);
        if (rc != STATE_RES_OK || !ok) break;
        *pick = keys[i].e;
    }
    free(keys);
    return rc;
}

/* A key outside the auth passes: the event it resolves to, into *pick. */
static int normal_pick(sr_ctx *c, const state_map *r, const sr_conflict *k, uint32_t *pick)
{
    v1_key *keys = malloc(k->n * sizeof(*keys));
    if (!keys) return sr_fail(c, STATE_RES_E_NOMEM, NULL, "Out of memory");
    int rc = sorted_events(c, k, normal_order, keys);
    if (rc == STATE_RES_OK) *pick = keys[k->n - 1].e; /* Synapse: when the rules refuse all */
    for (size_t i = 0; rc == STATE_RES_OK && i < k->n; i++) {
        bool ok;
        rc = sr_allowed(c, keys[i].e, r, false, NULL, NULL, 0, &ok);
        if (rc == STATE_RES_OK && ok) {
            *pick = keys[i].e;
            break;
        }
    }
    free(keys);
    return rc;
}

enum v1_pass { PASS_POWER_LEVELS, PASS_JOIN_RULES, PASS_MEMBERS, PASS_NORMAL, PASS_COUNT };

static enum v1_pass pass_of(const sr_conflict *k)
{
    if (strcmp(k->type, "m.room.power_levels") == 0 && k->state_key[0] == '\0')
        return PASS_POWER_LEVELS;
    if (strcmp(k->type, "m.room.join_rules") == 0) return PASS_JOIN_RULES;
    if (strcmp(k->type, "m.room.member") == 0) return PASS_MEMBERS;
    return PASS_NORMAL;
}

int sr_resolve_v1(sr_ctx *c, const state_map *unconflicted, const sr_conflict *conflicts,
                  size_t n_conflicts, state_map **out)
{
    state_map *r = state_map_copy(unconflicted);
    uint32_t *picks = malloc(n_conflicts * sizeof(*picks));
    int rc = r && picks ? STATE_RES_OK : sr_fail(c, STATE_RES_E_NOMEM, NULL, "Out of memory");
    for (int pass = 0; rc == STATE_RES_OK && pass < PASS_COUNT; pass++) {
        for (size_t k = 0; rc == STATE_RES_OK && k < n_conflicts; k++) {
            if (pass_of(&conflicts[k]) != (enum v1_pass)pass) continue;
            rc = pass == PASS_NORMAL ? normal_pick(c, r, &conflicts[k], &picks[k])
                                     : auth_pass(c, r, &conflicts[k], &picks[k]);
        }
        for (size_t k = 0; rc == STATE_RES_OK && k < n_conflicts; k++) {
            if (pass_of(&conflicts[k]) != (enum v1_pass)pass) continue;
            const sr_event *ev = &c->ev[picks[k]];
            if (state_map_set(r, ev->type, ev->state_key, ev->id) != 0)
                rc = sr_fail(c, STATE_RES_E_NOMEM, NULL, "Out of memory");
        }
    }
    free(picks);
    if (rc != STATE_RES_OK) {
        state_map_free(r);
        return rc;
    }
    *out = r;
    return STATE_RES_OK;
}
