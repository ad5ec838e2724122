/*
 * core/rooms/events.c - room versions, redaction, hashes and the client format of events
 * (see events.h for the decisions).
 *
 * The redaction algorithm is the one place that knows which keys survive a redaction in
 * each room version; the reference hash is computed over its output, so this table is also
 * what makes event IDs agree with other servers. Nothing here reads the database.
 */
#include <inttypes.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime/base64.h"
#include "core/rooms/canonical_json.h"
#include "core/rooms/events.h"

/* One row per stable room version; each differs from the row above it by what its spec
 * page lists under "added in" or "changed in". */
static const room_version VERSIONS[] = {
    {.id = "1", .number = 1, .event_id_format = ROOM_EVENT_ID_OPAQUE, .state_res = 1,
     .local_create = true,
     .redaction = ROOM_REDACT_V1, .redaction_auth_rule = true, .aliases_auth_rule = true},
    {.id = "2", .number = 2, .event_id_format = ROOM_EVENT_ID_OPAQUE, .state_res = 2,
     .local_create = true,
     .redaction = ROOM_REDACT_V1, .redaction_auth_rule = true, .aliases_auth_rule = true},
    {.id = "3", .number = 3, .event_id_format = ROOM_EVENT_ID_HASH_B64, .state_res = 2,
     .local_create = true,
     .redaction = ROOM_REDACT_V1, .aliases_auth_rule = true},
    {.id = "4", .number = 4, .event_id_format = ROOM_EVENT_ID_HASH_URLSAFE, .state_res = 2,
     .local_create = true,
     .redaction = ROOM_REDACT_V1, .aliases_auth_rule = true},
    {.id = "5", .number = 5, .event_id_format = ROOM_EVENT_ID_HASH_URLSAFE, .state_res = 2,
     .local_create = true,
     .redaction = ROOM_REDACT_V1, .aliases_auth_rule = true, .key_validity_enforced = true},
    {.id = "6", .number = 6, .event_id_format = ROOM_EVENT_ID_HASH_URLSAFE, .state_res = 2,
     .local_create = true,
     .redaction = ROOM_REDACT_V6, .key_validity_enforced = true,
     .notifications_power_levels = true, .strict_canonical_json = true},
    {.id = "7", .number = 7, .event_id_format = ROOM_EVENT_ID_HASH_URLSAFE, .state_res = 2,
     .local_create = true,
     .redaction = ROOM_REDACT_V6, .key_validity_enforced = true,
     .notifications_power_levels = true, .strict_canonical_json = true, .knock = true},
    {.id = "8", .number = 8, .event_id_format = ROOM_EVENT_ID_HASH_URLSAFE, .state_res = 2,
     .local_create = true,
     .redaction = ROOM_REDACT_V8, .key_validity_enforced = true,
     .notifications_power_levels = true, .strict_canonical_json = true, .knock = true,
     .restricted_join = true},
    {.id = "9", .number = 9, .event_id_format = ROOM_EVENT_ID_HASH_URLSAFE, .state_res = 2,
     .local_create = true,
     .redaction = ROOM_REDACT_V9, .key_validity_enforced = true,
     .notifications_power_levels = true, .strict_canonical_json = true, .knock = true,
     .restricted_join = true},
    {.id = "10", .number = 10, .event_id_format = ROOM_EVENT_ID_HASH_URLSAFE, .state_res = 2,
     .local_create = true,
     .redaction = ROOM_REDACT_V9, .key_validity_enforced = true,
     .notifications_power_levels = true, .strict_canonical_json = true, .knock = true,
     .restricted_join = true, .knock_restricted = true, .integer_power_levels = true},
    {.id = "11", .number = 11, .event_id_format = ROOM_EVENT_ID_HASH_URLSAFE, .state_res = 2,
     .local_create = true,
     .redaction = ROOM_REDACT_V11, .v11_redaction = true, .creator_is_sender = true,
     .redacts_in_content = true, .key_validity_enforced = true,
     .notifications_power_levels = true, .strict_canonical_json = true, .knock = true,
     .restricted_join = true, .knock_restricted = true, .integer_power_levels = true},
};

const char *const ROOM_VERSIONS_SUPPORTED[] = {"1", "2", "3", "4", "5", "6", "7", "8", "9",
                                               "10", "11", NULL};

const room_version *room_version_find(const char *id)
{
    if (!id) return NULL;
    for (size_t i = 0; i < sizeof(VERSIONS) / sizeof(VERSIONS[0]); i++)
        if (strcmp(VERSIONS[i].id, id) == 0) return &VERSIONS[i];
    return NULL;
}

const room_version *room_version_find_creatable(const char *id)
{
    const room_version *v = room_version_find(id);
    return v && v->local_create ? v : NULL;
}

/* ---- redaction ---------------------------------------------------------------------- */

/* Top-level keys kept by the redaction algorithm: room versions 1-10, and 11. */
static const char *const KEEP_TOP_V1[] = {
    "event_id", "type", "room_id", "sender", "state_key", "content", "hashes", "signatures",
    "depth", "prev_events", "prev_state", "auth_events", "origin", "origin_server_ts",
    "membership", NULL};
static const char *const KEEP_TOP_V11[] = {
    "event_id", "type", "room_id", "sender", "state_key", "content", "hashes", "signatures",
    "depth", "prev_events", "auth_events", "origin_server_ts", NULL};

static const char *const ALL_KEYS[] = {NULL}; /* marker: keep the whole content */

static const char *const MEMBER_V1[] = {"membership", NULL};
static const char *const MEMBER_V9[] = {"membership", "join_authorised_via_users_server", NULL};
static const char *const MEMBER_V11[] = {"membership", "join_authorised_via_users_server",
                                         "third_party_invite", NULL};
static const char *const CREATE_V1[] = {"creator", NULL};
static const char *const JOIN_RULES_V1[] = {"join_rule", NULL};
static const char *const JOIN_RULES_V8[] = {"join_rule", "allow", NULL};
static const char *const PL_V1[] = {"ban", "events", "events_default", "kick", "redact",
                                    "state_default", "users", "users_default", NULL};
static const char *const PL_V11[] = {"ban", "events", "events_default", "invite", "kick",
                                     "redact", "state_default", "users", "users_default", NULL};
static const char *const ALIASES_V1[] = {"aliases", NULL};
static const char *const HISTORY[] = {"history_visibility", NULL};
static const char *const REDACTION_V11[] = {"redacts", NULL};

/* The content keys an event of `type` keeps under redaction variant r: NULL for none,
 * ALL_KEYS for the whole content. */
static const char *const *content_keep(enum room_redaction r, const char *type)
{
    if (strcmp(type, "m.room.member") == 0)
        return r >= ROOM_REDACT_V11 ? MEMBER_V11 : r >= ROOM_REDACT_V9 ? MEMBER_V9 : MEMBER_V1;
    if (strcmp(type, "m.room.create") == 0) return r >= ROOM_REDACT_V11 ? ALL_KEYS : CREATE_V1;
    if (strcmp(type, "m.room.join_rules") == 0)
        return r >= ROOM_REDACT_V8 ? JOIN_RULES_V8 : JOIN_RULES_V1;
    if (strcmp(type, "m.room.power_levels") == 0) return r >= ROOM_REDACT_V11 ? PL_V11 : PL_V1;
    if (strcmp(type, "m.room.aliases") == 0) return r < ROOM_REDACT_V6 ? ALIASES_V1 : NULL;
    if (strcmp(type, "m.room.history_visibility") == 0) return HISTORY;
    if (strcmp(type, "m.room.redaction") == 0) return r >= ROOM_REDACT_V11 ? REDACTION_V11 : NULL;
    return NULL;
}

static bool in_list(const char *const *list, const char *key)
{
    for (size_t i = 0; list[i]; i++)
        if (strcmp(list[i], key) == 0) return true;
    return false;
}

json_t *event_redact_content(const room_version *v, const char *type, const json_t *content)
{
    json_t *out = json_object();
    if (!out || !json_is_object(content) || !type) return out;
    const char *const *keep = content_keep(v->redaction, type);
    if (!keep) return out;
    /* Copies, not references: content may belong to a PDU shared between threads
     * (core/rooms/events_pdus.h), whose reference counts are not to be touched. */
    const char *k;
    json_t *val;
    json_object_foreach((json_t *)content, k, val) {
        if (keep != ALL_KEYS && !in_list(keep, k)) continue;
        if (v->redaction >= ROOM_REDACT_V11 && strcmp(type, "m.room.member") == 0 &&
            strcmp(k, "third_party_invite") == 0) {
            /* v11 keeps only third_party_invite.signed. */
            json_t *signed_part = json_is_object(val) ? json_object_get(val, "signed") : NULL;
            if (signed_part)
                json_object_set_new(out, k, json_pack("{s:o}", "signed", json_deep_copy(signed_part)));
            continue;
        }
        json_object_set_new(out, k, json_deep_copy(val));
    }
    return out;
}

json_t *event_redact(const room_version *v, const json_t *pdu)
{
    const char *const *keep = v->redaction >= ROOM_REDACT_V11 ? KEEP_TOP_V11 : KEEP_TOP_V1;
    json_t *out = json_object();
    if (!out) return NULL;
    const char *k;
    json_t *val;
    json_object_foreach((json_t *)pdu, k, val) {
        if (!in_list(keep, k)) continue;
        if (strcmp(k, "content") == 0) {
            const char *type = json_string_value(json_object_get(pdu, "type"));
            json_object_set_new(out, k, event_redact_content(v, type, val));
        } else {
            json_object_set(out, k, val);
        }
    }
    if (!json_object_get(out, "content")) json_object_set_new(out, "content", json_object());
    return out;
}

/* ---- hashes ------------------------------------------------------------------------- */

/* SHA-256 of the event without unsigned, signatures and hashes. */
static int content_hash(const json_t *pdu, unsigned char h[CJSON_SHA256_BYTES])
{
    json_t *copy = json_copy((json_t *)pdu); /* shallow: only top-level keys are removed */
    if (!copy) return -1;
    json_object_del(copy, "unsigned");
    json_object_del(copy, "signatures");
    json_object_del(copy, "hashes");
    int rc = cjson_sha256(copy, h);
    json_decref(copy);
    return rc;
}

int event_add_content_hash(json_t *pdu)
{
    unsigned char h[CJSON_SHA256_BYTES];
    if (content_hash(pdu, h) < 0) return -1;
    char b64[CJSON_SHA256_B64_LEN];
    cjson_b64(h, sizeof(h), false, b64, sizeof(b64));
    json_object_set_new(pdu, "hashes", json_pack("{s:s}", "sha256", b64));
    return 0;
}

bool event_content_hash_ok(const json_t *pdu)
{
    const char *claimed = json_string_value(json_object_get(json_object_get(pdu, "hashes"), "sha256"));
    unsigned char want[CJSON_SHA256_BYTES], got[CJSON_SHA256_BYTES];
    if (!claimed || rt_b64_decode_exact(claimed, want, sizeof(want)) < 0) return false;
    if (content_hash(pdu, got) < 0) return false;
    return sodium_memcmp(want, got, sizeof(got)) == 0;
}

/* The reference hash: SHA-256 of the canonical redacted event without signatures and
 * unsigned. v3+ events have no event_id of their own; one a peer added is not hashed. */
static int reference_hash(const room_version *v, const json_t *pdu,
                          unsigned char h[CJSON_SHA256_BYTES])
{
    json_t *red = event_redact(v, pdu);
    if (!red) return -1;
    json_object_del(red, "signatures");
    json_object_del(red, "unsigned");
    if (v->event_id_format != ROOM_EVENT_ID_OPAQUE) json_object_del(red, "event_id");
    int rc = cjson_sha256(red, h);
    json_decref(red);
    return rc;
}

int event_reference_hash(const room_version *v, const json_t *pdu,
                         char out[CJSON_SHA256_B64_LEN])
{
    unsigned char h[CJSON_SHA256_BYTES];
    if (reference_hash(v, pdu, h) < 0) return -1;
    cjson_b64(h, sizeof(h), false, out, CJSON_SHA256_B64_LEN);
    return 0;
}

bool event_opaque_id_valid(const char *id)
{
    if (!id || id[0] != '$') return false;
    size_t len = strlen(id);
    if (len > EVENT_MAX_ID_BYTES) return false;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)id[i] < 0x20 || id[i] == 0x7f) return false;
    const char *colon = strchr(id, ':');
    return colon && colon > id + 1 && colon[1] != '\0';
}

const char *event_id_domain(const char *event_id)
{
    const char *c = event_id ? strchr(event_id, ':') : NULL;
    return c ? c + 1 : "";
}

int event_compute_id(const room_version *v, const json_t *pdu, char out[EVENT_ID_LEN])
{
    if (v->event_id_format == ROOM_EVENT_ID_OPAQUE) {
        const char *id = json_string_value(json_object_get(pdu, "event_id"));
        if (!event_opaque_id_valid(id)) return -1;
        snprintf(out, EVENT_ID_LEN, "%s", id);
        return 0;
    }
    unsigned char h[CJSON_SHA256_BYTES];
    if (reference_hash(v, pdu, h) < 0) return -1;
    out[0] = '$';
    cjson_b64(h, sizeof(h), v->event_id_format == ROOM_EVENT_ID_HASH_URLSAFE, out + 1,
              EVENT_ID_LEN - 1);
    return 0;
}

/* Room versions 1-2 name an event by an ID its creator picks: "$" + this many random
 * letters + ":" + the creator's server (the sender's, for events this server writes). */
#define EVENT_OPAQUE_ID_LETTERS 18

/* Turn string entries of pdu[key] into the [event ID, {hashes}] pairs of v1-2, with an
 * empty hashes object: the fallback for references the write path did not pair
 * (rooms_graph_refs_as_pairs gives them the sha256 the spec's format lists). */
static void refs_as_pairs(json_t *pdu, const char *key)
{
    json_t *arr = json_object_get(pdu, key);
    for (size_t i = 0; i < json_array_size(arr); i++) {
        json_t *ref = json_array_get(arr, i);
        if (json_is_string(ref)) json_array_set_new(arr, i, json_pack("[O,{}]", ref));
    }
}

int event_id_of_server(json_t *pdu, const char *server_name)
{
    if (json_object_get(pdu, "event_id")) return 0;
    if (!server_name || !server_name[0]) return -1;
    static const char LETTERS[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    char local[EVENT_OPAQUE_ID_LETTERS + 1];
    for (size_t i = 0; i < EVENT_OPAQUE_ID_LETTERS; i++)
        local[i] = LETTERS[randombytes_uniform(sizeof(LETTERS) - 1)];
    local[EVENT_OPAQUE_ID_LETTERS] = '\0';
    char id[EVENT_ID_LEN];
    int n = snprintf(id, sizeof(id), "$%s:%s", local, server_name);
    if (n < 0 || n > EVENT_MAX_ID_BYTES) return -1;
    json_object_set_new(pdu, "event_id", json_string(id));
    return 0;
}

static int give_opaque_id(json_t *pdu)
{
    const char *sender = json_string_value(json_object_get(pdu, "sender"));
    const char *colon = sender ? strchr(sender, ':') : NULL;
    if (!json_object_get(pdu, "event_id") && (!colon || event_id_of_server(pdu, colon + 1) < 0))
        return -1;
    refs_as_pairs(pdu, "prev_events");
    refs_as_pairs(pdu, "auth_events");
    return 0;
}

const char *event_ref_id(const json_t *ref)
{
    if (json_is_array(ref)) ref = json_array_get(ref, 0);
    return json_string_value(ref);
}

json_t *event_ref_ids(const json_t *pdu, const char *key)
{
    json_t *arr = json_object_get(pdu, key), *ids = json_array();
    if (!ids) return NULL;
    for (size_t i = 0; i < json_array_size(arr); i++) {
        const char *id = event_ref_id(json_array_get(arr, i));
        if (id && json_array_append_new(ids, json_string(id)) < 0) {
            json_decref(ids);
            return NULL;
        }
    }
    return ids;
}

json_t *event_ref_pair(const room_version *v, const char *id, const json_t *target)
{
    char hash[CJSON_SHA256_B64_LEN];
    if (!id || event_reference_hash(v, target, hash) < 0) return NULL;
    return json_pack("[s,{s:s}]", id, "sha256", hash);
}

bool event_id_names_origin(const room_version *v, const char *id, const char *origin)
{
    return v->event_id_format != ROOM_EVENT_ID_OPAQUE ||
           (origin && strcmp(event_id_domain(id), origin) == 0);
}

int event_finalize(const room_version *v, json_t *pdu, char id_out[EVENT_ID_LEN],
                   size_t *size_out)
{
    if (v->event_id_format == ROOM_EVENT_ID_OPAQUE && give_opaque_id(pdu) < 0)
        return EVENT_NOT_CANONICAL;
    if (event_add_content_hash(pdu) < 0) return EVENT_NOT_CANONICAL;
    size_t len;
    char *s = cjson_encode(pdu, &len);
    if (!s) return EVENT_NOT_CANONICAL;
    free(s);
    if (size_out) *size_out = len;
    if (len > EVENT_MAX_PDU_BYTES) return EVENT_TOO_LARGE;
    if (event_compute_id(v, pdu, id_out) < 0) return EVENT_NOT_CANONICAL;
    return EVENT_OK;
}

/* ---- checks before the authorization rules ------------------------------------------ */

static int bad_format(char why[EVENT_WHY_LEN], int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int bad_format(char why[EVENT_WHY_LEN], int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, EVENT_WHY_LEN, fmt, ap);
    va_end(ap);
    return rc;
}

/* An ID with a sigil and a server name: "@user:server", "!room:server". */
static bool sigil_id_ok(const char *id, char sigil)
{
    if (!id || id[0] != sigil) return false;
    const char *colon = strchr(id, ':');
    return colon && colon > id + 1 && colon[1] != '\0';
}

/* One entry of prev_events or auth_events: v1-2 [event ID, {hashes}], v3+ an event ID. */
static bool event_ref_shape_ok(const room_version *v, const json_t *ref)
{
    if (v->event_id_format == ROOM_EVENT_ID_OPAQUE) {
        return json_is_array(ref) && json_array_size(ref) == 2 &&
               event_opaque_id_valid(json_string_value(json_array_get(ref, 0))) &&
               json_is_object(json_array_get(ref, 1));
    }
    const char *id = json_string_value(ref);
    return id && id[0] == '$' && strlen(id) > 1 && strlen(id) <= EVENT_MAX_ID_BYTES;
}

static int check_refs(const room_version *v, const json_t *pdu, const char *key, size_t max,
                      char why[EVENT_WHY_LEN])
{
    const json_t *arr = json_object_get(pdu, key);
    if (!json_is_array(arr)) return bad_format(why, EVENT_FORMAT_BAD, "\"%s\" must be an array", key);
    if (json_array_size(arr) > max)
        return bad_format(why, EVENT_FORMAT_TOO_LARGE, "\"%s\" has more than %zu entries", key, max);
    for (size_t i = 0; i < json_array_size(arr); i++)
        if (!event_ref_shape_ok(v, json_array_get(arr, i)))
            return bad_format(why, EVENT_FORMAT_BAD, "\"%s\"[%zu] is not an event reference of "
                              "room version %s", key, i, v->id);
    return EVENT_FORMAT_OK;
}

/* signatures: {server: {key ID: signature}}, strings all the way down. */
static bool signatures_shape_ok(const json_t *sigs)
{
    if (!json_is_object(sigs)) return false;
    const char *server, *key_id;
    json_t *by_server, *sig;
    json_object_foreach((json_t *)sigs, server, by_server) {
        if (!json_is_object(by_server)) return false;
        json_object_foreach(by_server, key_id, sig)
            if (!json_is_string(sig)) return false;
    }
    return true;
}

/* A string member of pdu: present (when required), a string, at most EVENT_MAX_ID_BYTES. */
static int check_str(const json_t *pdu, const char *key, bool required, char why[EVENT_WHY_LEN])
{
    const json_t *val = json_object_get(pdu, key);
    if (!val) return required ? bad_format(why, EVENT_FORMAT_BAD, "\"%s\" is missing", key)
                              : EVENT_FORMAT_OK;
    if (!json_is_string(val)) return bad_format(why, EVENT_FORMAT_BAD, "\"%s\" must be a string", key);
    if (json_string_length(val) > EVENT_MAX_ID_BYTES)
        return bad_format(why, EVENT_FORMAT_TOO_LARGE, "\"%s\" is longer than %d bytes", key,
                          EVENT_MAX_ID_BYTES);
    return EVENT_FORMAT_OK;
}

/* Does v hold a number written as a real ("1.0", "1e3") anywhere? Called only on what
 * cjson_encode took, so the nesting is at most CJSON_MAX_DEPTH. */
static bool holds_real(const json_t *v)
{
    const char *k;
    json_t *item;
    size_t i;
    if (json_is_real(v)) return true;
    if (json_is_object(v)) {
        json_object_foreach((json_t *)v, k, item) if (holds_real(item)) return true;
    } else if (json_is_array(v)) {
        json_array_foreach(v, i, item) if (holds_real(item)) return true;
    }
    return false;
}

int event_check_format(const room_version *v, const json_t *pdu, char why[EVENT_WHY_LEN])
{
    why[0] = '\0';
    if (!json_is_object(pdu)) return bad_format(why, EVENT_FORMAT_BAD, "An event must be an object");
    size_t len = 0;
    char *canon = cjson_encode(pdu, &len);
    if (!canon)
        return bad_format(why, EVENT_FORMAT_NOT_CANONICAL, "The event holds a value canonical "
                          "JSON cannot carry (a fraction, an integer beyond 2^53, or nesting "
                          "deeper than %d)", CJSON_MAX_DEPTH);
    free(canon);
    /* Room versions 6 and later: canonical JSON strictly, so no number in the form of a
     * real even when its value is an integer (the sender hashed "1.0", which the
     * canonical form would turn into "1"). */
    if (v->strict_canonical_json && holds_real(pdu))
        return bad_format(why, EVENT_FORMAT_NOT_CANONICAL, "The event holds a number that is "
                          "not an integer (room version %s requires canonical JSON)", v->id);
    if (len > EVENT_MAX_PDU_BYTES)
        return bad_format(why, EVENT_FORMAT_TOO_LARGE, "The event is %zu bytes, over the limit "
                          "of %d", len, EVENT_MAX_PDU_BYTES);
    static const char *const REQUIRED_STR[] = {"room_id", "sender", "type", NULL};
    int rc;
    for (size_t i = 0; REQUIRED_STR[i]; i++)
        if ((rc = check_str(pdu, REQUIRED_STR[i], true, why)) != EVENT_FORMAT_OK) return rc;
    if ((rc = check_str(pdu, "state_key", false, why)) != EVENT_FORMAT_OK) return rc;
    if (!sigil_id_ok(json_string_value(json_object_get(pdu, "room_id")), '!'))
        return bad_format(why, EVENT_FORMAT_BAD, "\"room_id\" is not a room ID");
    if (!sigil_id_ok(json_string_value(json_object_get(pdu, "sender")), '@'))
        return bad_format(why, EVENT_FORMAT_BAD, "\"sender\" is not a user ID");
    if (!json_is_object(json_object_get(pdu, "content")))
        return bad_format(why, EVENT_FORMAT_BAD, "\"content\" must be an object");
    if (!json_is_integer(json_object_get(pdu, "origin_server_ts")))
        return bad_format(why, EVENT_FORMAT_BAD, "\"origin_server_ts\" must be an integer");
    const json_t *depth = json_object_get(pdu, "depth");
    int64_t max_depth = v->strict_canonical_json ? EVENT_MAX_DEPTH_V6 : EVENT_MAX_DEPTH_V1;
    if (!json_is_integer(depth) || json_integer_value(depth) < 0 ||
        json_integer_value(depth) > max_depth)
        return bad_format(why, EVENT_FORMAT_BAD, "\"depth\" must be an integer from 0 to %" PRId64,
                          max_depth);
    if (!json_is_string(json_object_get(json_object_get(pdu, "hashes"), "sha256")))
        return bad_format(why, EVENT_FORMAT_BAD, "\"hashes\" must hold a sha256 string");
    if (!signatures_shape_ok(json_object_get(pdu, "signatures")))
        return bad_format(why, EVENT_FORMAT_BAD, "\"signatures\" must map servers to key IDs "
                          "to strings");
    const json_t *uns = json_object_get(pdu, "unsigned");
    if (uns && !json_is_object(uns)) return bad_format(why, EVENT_FORMAT_BAD, "\"unsigned\" must be an object");
    if ((rc = check_refs(v, pdu, "prev_events", EVENT_MAX_PREV_EVENTS, why)) != EVENT_FORMAT_OK ||
        (rc = check_refs(v, pdu, "auth_events", EVENT_MAX_AUTH_EVENTS, why)) != EVENT_FORMAT_OK)
        return rc;
    if (v->event_id_format == ROOM_EVENT_ID_OPAQUE) {
        if ((rc = check_str(pdu, "event_id", true, why)) != EVENT_FORMAT_OK) return rc;
        if (!event_opaque_id_valid(json_string_value(json_object_get(pdu, "event_id"))))
            return bad_format(why, EVENT_FORMAT_BAD, "\"event_id\" is not of the form "
                              "$opaque:server");
    }
    if (v->redacts_in_content) {
        const json_t *r = json_object_get(json_object_get(pdu, "content"), "redacts");
        if (r && !json_is_string(r)) return bad_format(why, EVENT_FORMAT_BAD, "\"content.redacts\" must be a string");
    } else if ((rc = check_str(pdu, "redacts", false, why)) != EVENT_FORMAT_OK) {
        return rc;
    }
    return EVENT_FORMAT_OK;
}

/* Append name to the array unless it is there already. */
static void add_server(json_t *arr, const char *name)
{
    if (!name || !name[0]) return;
    for (size_t i = 0; i < json_array_size(arr); i++)
        if (strcmp(json_string_value(json_array_get(arr, i)), name) == 0) return;
    json_array_append_new(arr, json_string(name));
}

static const char *id_server(const char *id)
{
    const char *c = id ? strchr(id, ':') : NULL;
    return c ? c + 1 : "";
}

json_t *event_required_signers(const room_version *v, const json_t *pdu)
{
    const char *sender = json_string_value(json_object_get(pdu, "sender"));
    if (!sender) return NULL;
    json_t *out = json_array();
    if (!out) return NULL;
    const char *type = json_string_value(json_object_get(pdu, "type"));
    const json_t *content = json_object_get(pdu, "content");
    const char *membership = json_string_value(json_object_get(content, "membership"));
    bool member = type && strcmp(type, "m.room.member") == 0;
    bool tp_invite = member && membership && strcmp(membership, "invite") == 0 &&
                     json_object_get(content, "third_party_invite");
    if (!tp_invite) add_server(out, id_server(sender));
    /* Server-server API "Validating hashes and signatures on received events" asks for the
     * event ID's server "if it differs from the originating server"; Synapse requires it
     * always (so also on a third-party invite whose ID is of the sender's server), and so
     * does this. */
    if (v->event_id_format == ROOM_EVENT_ID_OPAQUE)
        add_server(out, event_id_domain(json_string_value(json_object_get(pdu, "event_id"))));
    /* Auth rule 4.2 (v8+): any membership event carrying the key, not only joins. */
    if (v->restricted_join && member) {
        const char *via = json_string_value(json_object_get(content, "join_authorised_via_users_server"));
        if (via) add_server(out, id_server(via));
    }
    return out;
}

/* ---- the client format -------------------------------------------------------------- */

const char *event_state_key(const json_t *pdu)
{
    return json_string_value(json_object_get(pdu, "state_key"));
}

const char *event_content_str(const json_t *pdu, const char *key)
{
    return json_string_value(json_object_get(json_object_get(pdu, "content"), key));
}

json_t *event_client_format(const room_version *v, const json_t *pdu, const char *event_id,
                            bool redacted, bool with_room_id)
{
    /* Nothing of pdu is referenced by the result (copies only): pdu may be shared between
     * threads (core/rooms/events_pdus.h), whose reference counts are not to be touched. */
    const char *type = json_string_value(json_object_get(pdu, "type"));
    json_t *content = json_object_get(pdu, "content");
    json_t *out = json_object();
    if (!out) return NULL;
    json_object_set_new(out, "content", redacted ? event_redact_content(v, type, content)
                                                 : json_deep_copy(content ? content : json_object()));
    json_object_set_new(out, "event_id", json_string(event_id));
    static const char *const copied[] = {"origin_server_ts", "sender", "type"};
    for (size_t i = 0; i < sizeof(copied) / sizeof(copied[0]); i++)
        json_object_set_new(out, copied[i], json_deep_copy(json_object_get(pdu, copied[i])));
    json_t *sk = json_object_get(pdu, "state_key");
    if (sk) json_object_set_new(out, "state_key", json_deep_copy(sk));
    if (with_room_id) json_object_set_new(out, "room_id", json_deep_copy(json_object_get(pdu, "room_id")));
    if (type && strcmp(type, "m.room.redaction") == 0) {
        json_t *target = json_object_get(pdu, "redacts");
        if (!target && content) target = json_object_get(content, "redacts");
        if (json_is_string(target)) json_object_set_new(out, "redacts", json_deep_copy(target));
        /* And under content in versions before 11, for clients that read it there only
         * (room version 11's "Event format" asks servers to). */
        json_t *out_content = json_object_get(out, "content");
        if (json_is_string(target) && !redacted && !json_object_get(out_content, "redacts"))
            json_object_set_new(out_content, "redacts", json_deep_copy(target));
    }
    return out;
}
