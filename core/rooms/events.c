/*
 * core/rooms/events.c - room versions, redaction, hashes and the client format of events
 * (see events.h for the decisions).
 *
 * The redaction algorithm is the one place that knows which keys survive a redaction in
 * each room version; the reference hash is computed over its output, so this table is also
 * what makes event IDs agree with other servers. Nothing here reads the database.
 */
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "core/rooms/canonical_json.h"
#include "core/rooms/events.h"

static const room_version VERSIONS[] = {
    {.id = "10"},
    {.id = "11", .v11_redaction = true, .creator_is_sender = true, .redacts_in_content = true},
};

const char *const ROOM_VERSIONS_SUPPORTED[] = {"10", "11", NULL};

const room_version *room_version_find(const char *id)
{
    if (!id) return NULL;
    for (size_t i = 0; i < sizeof(VERSIONS) / sizeof(VERSIONS[0]); i++)
        if (strcmp(VERSIONS[i].id, id) == 0) return &VERSIONS[i];
    return NULL;
}

/* ---- redaction ---------------------------------------------------------------------- */

/* Top-level keys kept by the redaction algorithm: room versions 1-10, and 11. */
static const char *const KEEP_TOP_V10[] = {
    "event_id", "type", "room_id", "sender", "state_key", "content", "hashes", "signatures",
    "depth", "prev_events", "prev_state", "auth_events", "origin", "origin_server_ts",
    "membership", NULL};
static const char *const KEEP_TOP_V11[] = {
    "event_id", "type", "room_id", "sender", "state_key", "content", "hashes", "signatures",
    "depth", "prev_events", "auth_events", "origin_server_ts", NULL};

typedef struct content_rule {
    const char *type;
    const char *const *keep_v10; /* NULL: nothing kept */
    const char *const *keep_v11; /* NULL: nothing kept; see ALL_KEYS */
} content_rule;

static const char *const ALL_KEYS[] = {NULL}; /* marker: keep the whole content */

static const char *const MEMBER_V10[] = {"membership", "join_authorised_via_users_server", NULL};
static const char *const MEMBER_V11[] = {"membership", "join_authorised_via_users_server",
                                         "third_party_invite", NULL};
static const char *const CREATE_V10[] = {"creator", NULL};
static const char *const JOIN_RULES[] = {"join_rule", "allow", NULL};
static const char *const PL_V10[] = {"ban", "events", "events_default", "kick", "redact",
                                     "state_default", "users", "users_default", NULL};
static const char *const PL_V11[] = {"ban", "events", "events_default", "invite", "kick",
                                     "redact", "state_default", "users", "users_default", NULL};
static const char *const HISTORY[] = {"history_visibility", NULL};
static const char *const REDACTION_V11[] = {"redacts", NULL};

static const content_rule CONTENT_RULES[] = {
    {"m.room.member", MEMBER_V10, MEMBER_V11},
    {"m.room.create", CREATE_V10, ALL_KEYS},
    {"m.room.join_rules", JOIN_RULES, JOIN_RULES},
    {"m.room.power_levels", PL_V10, PL_V11},
    {"m.room.history_visibility", HISTORY, HISTORY},
    {"m.room.redaction", NULL, REDACTION_V11},
};

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
    const char *const *keep = NULL;
    for (size_t i = 0; i < sizeof(CONTENT_RULES) / sizeof(CONTENT_RULES[0]); i++)
        if (strcmp(CONTENT_RULES[i].type, type) == 0)
            keep = v->v11_redaction ? CONTENT_RULES[i].keep_v11 : CONTENT_RULES[i].keep_v10;
    if (!keep) return out;
    if (keep == ALL_KEYS) {
        json_object_update(out, (json_t *)content);
        return out;
    }
    const char *k;
    json_t *val;
    json_object_foreach((json_t *)content, k, val) {
        if (!in_list(keep, k)) continue;
        if (v->v11_redaction && strcmp(type, "m.room.member") == 0 &&
            strcmp(k, "third_party_invite") == 0) {
            /* v11 keeps only third_party_invite.signed. */
            json_t *signed_part = json_is_object(val) ? json_object_get(val, "signed") : NULL;
            if (signed_part)
                json_object_set_new(out, k, json_pack("{s:O}", "signed", signed_part));
            continue;
        }
        json_object_set(out, k, val);
    }
    return out;
}

json_t *event_redact(const room_version *v, const json_t *pdu)
{
    const char *const *keep = v->v11_redaction ? KEEP_TOP_V11 : KEEP_TOP_V10;
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

int event_add_content_hash(json_t *pdu)
{
    json_t *copy = json_copy(pdu); /* shallow: only top-level keys are removed */
    if (!copy) return -1;
    json_object_del(copy, "unsigned");
    json_object_del(copy, "signatures");
    json_object_del(copy, "hashes");
    unsigned char h[CJSON_SHA256_BYTES];
    int rc = cjson_sha256(copy, h);
    json_decref(copy);
    if (rc < 0) return -1;
    char b64[CJSON_SHA256_B64_LEN];
    cjson_b64(h, sizeof(h), false, b64, sizeof(b64));
    json_object_set_new(pdu, "hashes", json_pack("{s:s}", "sha256", b64));
    return 0;
}

int event_compute_id(const room_version *v, const json_t *pdu, char out[EVENT_ID_LEN])
{
    json_t *red = event_redact(v, pdu);
    if (!red) return -1;
    json_object_del(red, "signatures");
    json_object_del(red, "unsigned");
    json_object_del(red, "event_id"); /* not part of the v3 event format */
    unsigned char h[CJSON_SHA256_BYTES];
    int rc = cjson_sha256(red, h);
    json_decref(red);
    if (rc < 0) return -1;
    out[0] = '$';
    cjson_b64(h, sizeof(h), true, out + 1, EVENT_ID_LEN - 1);
    return 0;
}

int event_finalize(const room_version *v, json_t *pdu, char id_out[EVENT_ID_LEN],
                   size_t *size_out)
{
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
    const char *type = json_string_value(json_object_get(pdu, "type"));
    json_t *content = json_object_get(pdu, "content");
    json_t *out = json_object();
    if (!out) return NULL;
    json_object_set_new(out, "content", redacted ? event_redact_content(v, type, content)
                                                 : json_deep_copy(content ? content : json_object()));
    json_object_set_new(out, "event_id", json_string(event_id));
    json_object_set(out, "origin_server_ts", json_object_get(pdu, "origin_server_ts"));
    json_object_set(out, "sender", json_object_get(pdu, "sender"));
    json_object_set(out, "type", json_object_get(pdu, "type"));
    json_t *sk = json_object_get(pdu, "state_key");
    if (sk) json_object_set(out, "state_key", sk);
    if (with_room_id) json_object_set(out, "room_id", json_object_get(pdu, "room_id"));
    if (type && strcmp(type, "m.room.redaction") == 0) {
        json_t *target = json_object_get(pdu, "redacts");
        if (!target && content) target = json_object_get(content, "redacts");
        if (json_is_string(target)) json_object_set(out, "redacts", target);
    }
    return out;
}
