/*
 * core/federation/transport/fed_notary.c - this server acting as a notary: reading a
 * /_matrix/key/v2/query request and assembling its answer from the key ring (see
 * fed_keyring.h for the contract).
 *
 * A query is a fan-out of ordinary look-ups (so a notary query for a server shares the one
 * fetch with every inbound request needing the same key) joined by a countdown: the query
 * holds one count of its own while it issues them, so whichever thread brings the count to
 * zero assembles, and the issuing thread touches the query no more after dropping its
 * count. Each served document keeps only its origin's signatures plus ours: we vouch for
 * what the origin said, not for what another notary said about it.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/federation/transport/fed_keyring.h"

#define WHY(...)                                                                        \
    do {                                                                                \
        if (why && why_len) snprintf(why, why_len, __VA_ARGS__);                        \
    } while (0)

int fed_notary_query_parse(const json_t *body, int64_t now_wall_ms,
                           fed_notary_criterion out[FED_NOTARY_CRITERIA_MAX], char *why,
                           size_t why_len)
{
    const json_t *servers = json_object_get(body, "server_keys");
    if (!json_is_object(servers)) {
        WHY("server_keys must be an object of server names");
        return ATRIUM_E_INVAL;
    }
    int n = 0;
    const char *server;
    const json_t *keys;
    json_object_foreach((json_t *)servers, server, keys) {
        if (!json_is_object(keys)) {
            WHY("server_keys.%.255s must be an object of key IDs", server);
            return ATRIUM_E_INVAL;
        }
        if (json_object_size(keys) == 0) {
            if (n == FED_NOTARY_CRITERIA_MAX) goto too_many;
            out[n++] = (fed_notary_criterion){server, NULL, now_wall_ms};
            continue;
        }
        const char *key_id;
        const json_t *criteria;
        json_object_foreach((json_t *)keys, key_id, criteria) {
            if (!json_is_object(criteria)) {
                WHY("server_keys.%.255s.%.64s must be an object", server, key_id);
                return ATRIUM_E_INVAL;
            }
            const json_t *min = json_object_get(criteria, "minimum_valid_until_ts");
            if (min && !json_is_integer(min)) {
                WHY("minimum_valid_until_ts of %.255s %.64s must be an integer", server, key_id);
                return ATRIUM_E_INVAL;
            }
            if (n == FED_NOTARY_CRITERIA_MAX) goto too_many;
            out[n++] = (fed_notary_criterion){server, key_id,
                                              min ? json_integer_value(min) : now_wall_ms};
        }
    }
    return n;
too_many:
    WHY("a key query may ask for at most %d keys", FED_NOTARY_CRITERIA_MAX);
    return ATRIUM_E_INVAL;
}

typedef struct notary_query {
    fed_keyring *ring;
    atomic_int pending;
    size_t n;
    fed_notary_criterion *criteria; /* strings copied into `strings` */
    char *strings;
    char own_name[FED_SERVER_NAME_MAX_BYTES];
    fed_signing_key own_key;
    json_t *own_doc;
    fed_notary_cb cb;
    void *arg;
} notary_query;

static void query_free(notary_query *q)
{
    json_decref(q->own_doc);
    fed_signing_key_wipe(&q->own_key);
    free(q->criteria);
    free(q->strings);
    free(q);
}

/* Keep only the origin's signatures on doc, then add ours. */
static bool vouch(json_t *doc, const notary_query *q)
{
    const char *origin = json_string_value(json_object_get(doc, "server_name"));
    json_t *sigs = json_object_get(doc, "signatures");
    if (!origin || !json_is_object(sigs)) return false;
    json_t *theirs = json_incref(json_object_get(sigs, origin));
    json_object_clear(sigs);
    if (theirs && json_object_set_new(sigs, origin, theirs) < 0) return false;
    return fed_sign_json(doc, q->own_name, &q->own_key) == 0;
}

/* The answer, from what the ring holds now. Never NULL unless out of memory. */
static json_t *assemble(notary_query *q)
{
    json_t *list = json_array();
    json_t *resp = list ? json_pack("{s:o}", "server_keys", list) : NULL;
    if (!resp) return NULL;
    bool own_done = false;
    for (size_t i = 0; i < q->n; i++) {
        const char *server = q->criteria[i].server_name;
        bool first = true; /* each server once, with the key IDs of all its criteria */
        for (size_t j = 0; j < i && first; j++)
            first = strcmp(q->criteria[j].server_name, server) != 0;
        if (!first) continue;
        if (strcmp(server, q->own_name) == 0) {
            if (q->own_doc && !own_done) json_array_append_new(list, json_deep_copy(q->own_doc));
            own_done = true;
            continue;
        }
        const char *ids[FED_NOTARY_CRITERIA_MAX];
        size_t n_ids = 0;
        bool all = false;
        for (size_t j = i; j < q->n; j++) {
            if (strcmp(q->criteria[j].server_name, server) != 0) continue;
            if (!q->criteria[j].key_id) all = true;
            else ids[n_ids++] = q->criteria[j].key_id;
        }
        json_t *docs = fed_keyring_cached_documents(q->ring, server, ids, all ? 0 : n_ids);
        size_t k;
        json_t *doc;
        json_array_foreach(docs, k, doc) {
            if (vouch(doc, q)) json_array_append(list, doc);
        }
        json_decref(docs);
    }
    return resp;
}

static json_t *empty_answer(void)
{
    return json_pack("{s:[]}", "server_keys");
}

static void looked_up(void *arg, const fed_key_result *res)
{
    (void)res; /* the answer is assembled from the cache, whatever this look-up found */
    notary_query *q = arg;
    if (atomic_fetch_sub(&q->pending, 1) != 1) return;
    json_t *resp = assemble(q);
    q->cb(q->arg, resp ? resp : empty_answer());
    query_free(q);
}

/* A query owning copies of the criteria (the caller's strings may die before it ends). */
static notary_query *query_new(const fed_notary_criterion *criteria, size_t n)
{
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++)
        bytes += strlen(criteria[i].server_name) + 1 +
                 (criteria[i].key_id ? strlen(criteria[i].key_id) + 1 : 0);
    notary_query *q = calloc(1, sizeof(*q));
    if (!q) return NULL;
    q->criteria = calloc(n ? n : 1, sizeof(*q->criteria));
    q->strings = malloc(bytes ? bytes : 1);
    if (!q->criteria || !q->strings) {
        query_free(q);
        return NULL;
    }
    char *p = q->strings;
    for (size_t i = 0; i < n; i++) {
        q->criteria[i] = criteria[i];
        size_t len = strlen(criteria[i].server_name) + 1;
        memcpy(p, criteria[i].server_name, len);
        q->criteria[i].server_name = p;
        p += len;
        if (criteria[i].key_id) {
            len = strlen(criteria[i].key_id) + 1;
            memcpy(p, criteria[i].key_id, len);
            q->criteria[i].key_id = p;
            p += len;
        }
    }
    q->n = n;
    return q;
}

int fed_notary_query(fed_keyring *ring, const fed_notary_criterion *criteria,
                             size_t n, const char *own_name, const fed_signing_key *own_key,
                             const json_t *own_doc, json_t **now_out, fed_notary_cb cb,
                             void *arg)
{
    notary_query *q = n <= FED_NOTARY_CRITERIA_MAX ? query_new(criteria, n) : NULL;
    if (!q) {
        *now_out = empty_answer();
        return FED_KEYRING_ANSWERED;
    }
    q->ring = ring;
    snprintf(q->own_name, sizeof(q->own_name), "%s", own_name);
    q->own_key = *own_key;
    q->own_doc = own_doc ? json_deep_copy(own_doc) : NULL;
    q->cb = cb;
    q->arg = arg;
    atomic_init(&q->pending, (int)n + 1);
    for (size_t i = 0; i < n; i++) {
        const fed_notary_criterion *c = &q->criteria[i];
        fed_key_result res;
        if (strcmp(c->server_name, own_name) != 0)
            fed_keyring_notary_refetch(ring, c->server_name, c->key_id,
                                       c->minimum_valid_until_ms);
        if (strcmp(c->server_name, own_name) == 0 ||
            fed_keyring_lookup(ring, c->server_name, c->key_id, c->minimum_valid_until_ms, &res,
                               looked_up, q) == FED_KEYRING_ANSWERED)
            atomic_fetch_sub(&q->pending, 1);
    }
    if (atomic_fetch_sub(&q->pending, 1) != 1) return FED_KEYRING_PENDING;
    json_t *resp = assemble(q);
    query_free(q);
    *now_out = resp ? resp : empty_answer();
    return FED_KEYRING_ANSWERED;
}
