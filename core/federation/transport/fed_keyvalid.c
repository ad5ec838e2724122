/*
 * core/federation/transport/fed_keyvalid.c - checking fetched key documents, directly from their
 * origin or through a notary, and merging key sets (see fed_keyring.h for the rules).
 *
 * This is where a remote server's word becomes a key we will trust, so it is strict: a
 * document with a malformed ed25519 entry is refused whole rather than partly used, and
 * keys of algorithms other than ed25519 are skipped (the spec's "removes any signing key
 * identifiers with algorithms it doesn't understand"). It does no I/O and keeps no state.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime/base64.h"
#include "core/federation/transport/fed_keyring.h"

#define KEY_ID_PREFIX "ed25519:"

#define WHY(...)                                                                        \
    do {                                                                                \
        if (why && why_len) snprintf(why, why_len, __VA_ARGS__);                        \
    } while (0)

void fed_key_set_free(fed_key_set *s)
{
    if (!s) return;
    for (size_t i = 0; i < s->n; i++) json_decref(s->docs[i]);
    free(s);
}

static bool ed25519_id(const char *key_id)
{
    return strncmp(key_id, KEY_ID_PREFIX, strlen(KEY_ID_PREFIX)) == 0;
}

/* A key ID another server may use: the spec asks for [A-Za-z0-9_] versions, but other
 * implementations are not checked for it, and refusing a server over the spelling of its
 * key would cut it off; so any printable ASCII but the characters X-Matrix would have to
 * escape, within our bound. (Our own and configured IDs keep the strict fed_key_id_valid.) */
static bool remote_key_id_ok(const char *key_id)
{
    size_t n = strnlen(key_id, FED_KEY_ID_MAX_BYTES);
    if (n >= FED_KEY_ID_MAX_BYTES || n <= strlen(KEY_ID_PREFIX)) return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)key_id[i];
        if (c <= 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == ',') return false;
    }
    return true;
}

static fed_verify_key *find_key(fed_key_set *s, const char *key_id)
{
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->keys[i].key_id, key_id) == 0) return &s->keys[i];
    return NULL;
}

/* Does a replace b as what we know of one key? A later fetch wins; within one fetch, the
 * longer validity (a notary may hold two documents of one server). */
static bool supersedes(const fed_verify_key *a, const fed_verify_key *b)
{
    if (a->fetched_ms != b->fetched_ms) return a->fetched_ms > b->fetched_ms;
    return a->valid_until_ms > b->valid_until_ms;
}

void fed_key_set_merge(fed_key_set *dst, const fed_key_set *src)
{
    for (size_t i = 0; i < src->n; i++) {
        const fed_verify_key *k = &src->keys[i];
        fed_verify_key *have = find_key(dst, k->key_id);
        size_t slot;
        if (have) {
            if (!supersedes(k, have)) continue;
            slot = (size_t)(have - dst->keys);
        } else if (dst->n < FED_KEYRING_KEYS_PER_SERVER_MAX) {
            slot = dst->n++;
            dst->docs[slot] = NULL;
        } else {
            /* Full: the key that verifies the least (the shortest validity) makes room. */
            slot = 0;
            for (size_t j = 1; j < dst->n; j++)
                if (dst->keys[j].valid_until_ms < dst->keys[slot].valid_until_ms) slot = j;
            if (dst->keys[slot].valid_until_ms >= k->valid_until_ms) continue;
        }
        dst->keys[slot] = *k;
        json_incref(src->docs[i]);
        json_decref(dst->docs[slot]);
        dst->docs[slot] = src->docs[i];
    }
}

/* Append one key of doc to s. */
static bool add_key(fed_key_set *s, const char *key_id, const unsigned char *pub,
                    int64_t valid_until_ms, int64_t fetched_ms, bool old, json_t *doc)
{
    if (s->n == FED_KEYRING_KEYS_PER_SERVER_MAX) return false;
    fed_verify_key *k = &s->keys[s->n];
    memset(k, 0, sizeof(*k));
    snprintf(k->key_id, sizeof(k->key_id), "%s", key_id);
    memcpy(k->public_key, pub, FED_PUBLIC_KEY_BYTES);
    k->valid_until_ms = valid_until_ms;
    k->fetched_ms = fetched_ms;
    k->old = old;
    s->docs[s->n++] = json_incref(doc);
    return true;
}

/* The public key of one verify_keys / old_verify_keys entry. */
static bool entry_key(const json_t *entry, unsigned char pub[FED_PUBLIC_KEY_BYTES])
{
    const json_t *key = json_object_get(entry, "key");
    return json_is_string(key) &&
           rt_b64_decode_exact(json_string_value(key), pub, FED_PUBLIC_KEY_BYTES) == 0;
}

/* Check one document of `server` and append its keys to s (whose n may be > 0). */
static int validate_into(const json_t *doc_in, const char *server, int64_t now_wall_ms,
                         fed_key_set *s, char *why, size_t why_len)
{
    if (!json_is_object(doc_in)) {
        WHY("the key document of %.255s is not a JSON object", server);
        return -1;
    }
    const char *name = json_string_value(json_object_get(doc_in, "server_name"));
    if (!name || strcmp(name, server) != 0) {
        WHY("the key document fetched for %.255s names server \"%.255s\"", server,
            name ? name : "(none)");
        return -1;
    }
    const json_t *until = json_object_get(doc_in, "valid_until_ts");
    if (!json_is_integer(until) || json_integer_value(until) < 0) {
        WHY("the key document of %.255s has no valid_until_ts", server);
        return -1;
    }
    const json_t *verify = json_object_get(doc_in, "verify_keys");
    if (!json_is_object(verify)) {
        WHY("the key document of %.255s has no verify_keys object", server);
        return -1;
    }
    const json_t *olds = json_object_get(doc_in, "old_verify_keys");
    if (olds && !json_is_object(olds)) {
        WHY("the key document of %.255s has an old_verify_keys that is not an object", server);
        return -1;
    }
    int64_t cap = now_wall_ms + FED_KEYRING_VALIDITY_CAP_MS;
    int64_t valid_until = json_integer_value(until) < cap ? json_integer_value(until) : cap;

    json_t *doc = json_deep_copy(doc_in);
    if (!doc) {
        WHY("out of memory checking the key document of %.255s", server);
        return -1;
    }
    size_t first = s->n;
    int current = 0, rc = 0;
    const char *key_id;
    const json_t *entry;
    json_object_foreach((json_t *)verify, key_id, entry) {
        if (!ed25519_id(key_id)) continue;
        unsigned char pub[FED_PUBLIC_KEY_BYTES];
        if (!remote_key_id_ok(key_id) || !entry_key(entry, pub)) {
            WHY("the key document of %.255s has a malformed verify key \"%.64s\"", server,
                key_id);
            rc = -1;
            break;
        }
        char sig_why[FED_KEYRING_ERROR_MAX_BYTES];
        if (fed_verify_json(doc, server, key_id, pub, sig_why, sizeof(sig_why)) < 0) {
            WHY("the key document of %.255s is not self-signed: %s", server, sig_why);
            rc = -1;
            break;
        }
        if (!add_key(s, key_id, pub, valid_until, now_wall_ms, false, doc)) {
            WHY("the key document of %.255s has more than %d keys", server,
                FED_KEYRING_KEYS_PER_SERVER_MAX);
            rc = -1;
            break;
        }
        current++;
    }
    if (rc == 0 && current == 0) {
        WHY("the key document of %.255s has no ed25519 verify key", server);
        rc = -1;
    }
    if (rc == 0 && olds) {
        json_object_foreach((json_t *)olds, key_id, entry) {
            if (!ed25519_id(key_id)) continue;
            unsigned char pub[FED_PUBLIC_KEY_BYTES];
            const json_t *expired = json_object_get(entry, "expired_ts");
            if (!remote_key_id_ok(key_id) || !entry_key(entry, pub) ||
                !json_is_integer(expired)) {
                WHY("the key document of %.255s has a malformed old verify key \"%.64s\"",
                    server, key_id);
                rc = -1;
                break;
            }
            if (json_object_get(verify, key_id)) continue; /* current wins over old */
            if (!add_key(s, key_id, pub, json_integer_value(expired), now_wall_ms, true, doc)) {
                WHY("the key document of %.255s has more than %d keys", server,
                    FED_KEYRING_KEYS_PER_SERVER_MAX);
                rc = -1;
                break;
            }
        }
    }
    if (rc < 0) { /* take back what this document added */
        for (size_t i = first; i < s->n; i++) json_decref(s->docs[i]);
        s->n = first;
    }
    json_decref(doc);
    return rc;
}

static fed_key_set *new_set(const char *server, char *why, size_t why_len)
{
    if (strlen(server) >= FED_SERVER_NAME_MAX_BYTES) {
        WHY("the server name \"%.64s...\" is too long", server);
        return NULL;
    }
    fed_key_set *s = calloc(1, sizeof(*s));
    if (!s) {
        WHY("out of memory checking the keys of %.255s", server);
        return NULL;
    }
    snprintf(s->server_name, sizeof(s->server_name), "%s", server);
    return s;
}

fed_key_set *fed_keyvalid_doc(const json_t *doc, const char *expected_server_name,
                                  int64_t now_wall_ms, char *why, size_t why_len)
{
    fed_key_set *s = new_set(expected_server_name, why, why_len);
    if (s && validate_into(doc, expected_server_name, now_wall_ms, s, why, why_len) < 0) {
        fed_key_set_free(s);
        return NULL;
    }
    return s;
}

/* Is doc signed by the notary with one of its keys, and every such signature good? */
static int notary_signed(const json_t *doc, const fed_notary *notary, char *why, size_t why_len)
{
    int good = 0;
    for (size_t i = 0; i < notary->n_keys; i++) {
        const fed_public_key *k = &notary->keys[i];
        char sig_why[FED_KEYRING_ERROR_MAX_BYTES];
        int rc = fed_verify_json(doc, notary->server_name, k->key_id, k->public_key, sig_why,
                                 sizeof(sig_why));
        if (rc == FED_SIG_E_UNSIGNED) continue;
        if (rc < 0) {
            WHY("the answer of notary %.255s does not verify: %s", notary->server_name, sig_why);
            return -1;
        }
        good++;
    }
    if (good == 0) {
        WHY("the answer of notary %.255s is not signed with any of its configured keys",
            notary->server_name);
        return -1;
    }
    return 0;
}

fed_key_set *fed_keyvalid_notary(const json_t *response, const char *expected_server_name,
                                         const fed_notary *notary, int64_t now_wall_ms,
                                         char *why, size_t why_len)
{
    if (!notary || notary->n_keys == 0) {
        WHY("no key is configured for notary %.255s: its answers cannot be checked",
            notary && notary->server_name ? notary->server_name : "(none)");
        return NULL;
    }
    const json_t *docs = json_object_get(response, "server_keys");
    if (!json_is_array(docs)) {
        WHY("the answer of notary %.255s has no server_keys list", notary->server_name);
        return NULL;
    }
    fed_key_set *out = new_set(expected_server_name, why, why_len);
    fed_key_set *one = out ? new_set(expected_server_name, why, why_len) : NULL;
    if (!one) {
        fed_key_set_free(out);
        return NULL;
    }
    size_t i, matched = 0;
    const json_t *doc;
    json_array_foreach(docs, i, doc) {
        const char *name = json_string_value(json_object_get(doc, "server_name"));
        if (!name || strcmp(name, expected_server_name) != 0) continue;
        matched++;
        char doc_why[FED_KEYRING_ERROR_MAX_BYTES];
        if (validate_into(doc, expected_server_name, now_wall_ms, one, doc_why,
                          sizeof(doc_why)) < 0) {
            WHY("notary %.255s: %s", notary->server_name, doc_why);
            goto refuse;
        }
        if (notary_signed(doc, notary, why, why_len) < 0) goto refuse;
        fed_key_set_merge(out, one);
        for (size_t j = 0; j < one->n; j++) json_decref(one->docs[j]);
        one->n = 0;
    }
    if (matched == 0) {
        WHY("notary %.255s returned no keys for %.255s", notary->server_name,
            expected_server_name);
        goto refuse;
    }
    fed_key_set_free(one);
    return out;
refuse:
    fed_key_set_free(one);
    fed_key_set_free(out);
    return NULL;
}
