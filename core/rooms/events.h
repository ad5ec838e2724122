/*
 * core/rooms/events.h - room events as data: room versions, the redaction algorithm,
 * content hashes, reference hashes (event IDs), the checks a receiver runs on a PDU before
 * the authorization rules (format, required signers, content hash) and the client format.
 *
 * Every stable room version, 1 to 11, is described by one room_version row: how its event
 * IDs are made, which state resolution and redaction algorithms it uses and which variant
 * of the authorization rules applies. Rooms of versions 3 and later name an event by its
 * reference hash: "$" + unpadded base64 (v3: standard alphabet; v4+: URL-safe) of the
 * SHA-256 of the canonical JSON of the *redacted* event without `signatures` and
 * `unsigned`, so an ID computed here is the one every other server computes and a
 * redaction never changes it. Rooms of versions 1 and 2 carry their own `event_id`
 * ("$opaque:domain", chosen by the server that created the event), which is checked here,
 * not computed (event_finalize picks one for the events this server writes). Everything
 * here is pure (no database, no request; only that pick draws random letters): the write
 * path lives in rooms_tx.c, the rules of who may send what in room_auth.c. Internal
 * prefixes: room_version_, event_.
 *
 * Signatures are made and checked in core/federation (fed_sign_json, fed_verify_json):
 * this file only says *which* servers must have signed a PDU (event_required_signers).
 */
#ifndef ATRIUM_CORE_EVENTS_H
#define ATRIUM_CORE_EVENTS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/rooms/canonical_json.h"

#define EVENT_MAX_PDU_BYTES 65536 /* canonical JSON of a whole event (spec "Size limits") */
#define EVENT_MAX_ID_BYTES 255    /* type, state_key, sender, room_id, event_id */
#define EVENT_ID_LEN 256          /* any event ID: at most EVENT_MAX_ID_BYTES, plus NUL */
#define EVENT_MAX_PREV_EVENTS 20  /* prev_events entries of one PDU */
#define EVENT_MAX_AUTH_EVENTS 10  /* auth_events entries of one PDU */
/* depth: v1-5 allow any non-negative 64-bit integer, v6+ (canonical JSON) up to 2^53 - 1.
 * This server's canonical JSON carries integers up to 2^53 - 1 only (canonical_json.h), so
 * a v1-5 event past that is refused as not canonical before its depth is looked at. */
#define EVENT_MAX_DEPTH_V1 INT64_MAX
#define EVENT_MAX_DEPTH_V6 INT64_C(9007199254740991)

/* How a room version names its events. */
enum room_event_id_format {
    ROOM_EVENT_ID_OPAQUE = 1,  /* v1-2: the PDU's own event_id, "$opaque:domain" */
    ROOM_EVENT_ID_HASH_B64,    /* v3: "$" + standard unpadded base64 of the reference hash */
    ROOM_EVENT_ID_HASH_URLSAFE /* v4+: "$" + URL-safe unpadded base64 of it */
};

/* Which keys the redaction algorithm keeps: each variant adds to or changes the last. */
enum room_redaction {
    ROOM_REDACT_V1 = 1, /* v1-5: also m.room.aliases' `aliases` */
    ROOM_REDACT_V6,     /* v6-7: m.room.aliases loses its special key */
    ROOM_REDACT_V8,     /* v8: m.room.join_rules keeps `allow` */
    ROOM_REDACT_V9,     /* v9-10: m.room.member keeps `join_authorised_via_users_server` */
    ROOM_REDACT_V11     /* v11: see event_redact */
};

/* What differs between the stable room versions 1 to 11 (the spec's "Room Versions"). */
typedef struct room_version {
    const char *id;                      /* "1" ... "11" */
    int number;                          /* 1 ... 11 */
    enum room_event_id_format event_id_format;
    int state_res;                       /* state resolution algorithm: 1 (v1) or 2 (v2+) */
    enum room_redaction redaction;
    bool v11_redaction;                  /* redaction == ROOM_REDACT_V11 */
    bool creator_is_sender;              /* v11: m.room.create has no content.creator */
    bool redacts_in_content;             /* v11: m.room.redaction carries content.redacts */
    bool redaction_auth_rule;            /* v1-2: the auth rules check m.room.redaction */
    bool aliases_auth_rule;              /* v1-5: m.room.aliases needs only the state key's domain */
    bool key_validity_enforced;          /* v5+: a key must be valid at origin_server_ts */
    bool notifications_power_levels;     /* v6+: power-level changes check `notifications` */
    bool strict_canonical_json;          /* v6+: events must be canonical JSON (no floats) */
    bool knock;                          /* v7+: membership knock and join rule knock */
    bool restricted_join;                /* v8+: join rule restricted, join_authorised_via_users_server */
    bool knock_restricted;               /* v10+: join rule knock_restricted */
    bool integer_power_levels;           /* v10+: power levels must be integers (no "50") */
    bool local_create;                   /* this server can create rooms of this version */
} room_version;

/* The version named id ("1" ... "11"), or NULL when it is no stable version. */
const room_version *room_version_find(const char *id);
/* The version named id when this server can create rooms of it, else NULL. */
const room_version *room_version_find_creatable(const char *id);
/* "10"-style IDs of every supported version, NULL-terminated (for /capabilities): every
 * version this server joins and checks events of. */
extern const char *const ROOM_VERSIONS_SUPPORTED[];

/* The content of an event of `type` after redaction under v: a new object holding copies
 * of the keys that survive (v.redaction says which); nothing of content is referenced. */
json_t *event_redact_content(const room_version *v, const char *type, const json_t *content);
/* The whole event after redaction (top-level keys and content): a new object. */
json_t *event_redact(const room_version *v, const json_t *pdu);

/* Set pdu.hashes.sha256: standard unpadded base64 of the SHA-256 of the canonical JSON of
 * the event without unsigned, signatures and hashes. 0, or -1 when it is not canonical. */
int event_add_content_hash(json_t *pdu);
/* The event ID of pdu into out: v3+ "$" + the reference hash in the version's alphabet;
 * v1-2 the PDU's own event_id, which must have the shape event_opaque_id_valid checks.
 * 0, or -1 when the event is not canonical (v3+) or carries no valid event_id (v1-2). */
int event_compute_id(const room_version *v, const json_t *pdu, char out[EVENT_ID_LEN]);
/* The reference hash of pdu (SHA-256 of the canonical redacted event without signatures
 * and unsigned) in standard unpadded base64: what v1-2 prev_events/auth_events pairs
 * carry as {"sha256": ...}. 0, or -1 when not canonical. */
int event_reference_hash(const room_version *v, const json_t *pdu,
                         char out[CJSON_SHA256_B64_LEN]);
/* Is id a room version 1-2 event ID: "$" + a non-empty local part + ":" + a non-empty
 * server name, at most EVENT_MAX_ID_BYTES, no NUL or control characters? */
bool event_opaque_id_valid(const char *id);
/* The server name of a v1-2 event ID ("$abc:example.org" -> "example.org"), or "". */
const char *event_id_domain(const char *event_id);

/* ---- references between events ----------------------------------------------------
 * prev_events and auth_events name other events: room versions 3+ by plain event IDs, 1
 * and 2 by [event ID, {"sha256": reference hash}] pairs. A PDU is stored and served exactly
 * as signed, pairs included (docs/adr/0019-v1-event-references-stored-as-sent.md); every
 * reader of a reference goes through event_ref_id, so the rest of the server (auth rules,
 * state resolution, the graph, the client API) sees plain IDs only. */

/* The event ID of one prev_events/auth_events entry: the string itself, or the first
 * element of a [event ID, hashes] pair; NULL when it is neither. Borrowed from ref. */
const char *event_ref_id(const json_t *ref);
/* The IDs of pdu[key] ("prev_events", "auth_events") as a new array of strings, entries
 * that are no reference left out; an empty array when pdu has no such array. NULL on
 * out-of-memory. The caller owns the array. */
json_t *event_ref_ids(const json_t *pdu, const char *key);
/* The v1-2 reference to target (an event of room version v named id): a new
 * [id, {"sha256": target's reference hash}] pair, or NULL when target is not canonical. */
json_t *event_ref_pair(const room_version *v, const char *id, const json_t *target);
/* Give pdu (of a v1-2 room) the event ID of an event this server creates: "$" + random
 * letters + ":" + server_name, unless it has one already. 0, or -1 when server_name
 * makes the ID too long. */
int event_id_of_server(json_t *pdu, const char *server_name);

/* May an event of room version v named id come from origin, the server that made it
 * (an invite's, a send_join's)? v1-2: the ID's server must be origin's (the ID names the
 * server that created the event); v3+: always true (the ID is a hash). */
bool event_id_names_origin(const room_version *v, const char *id, const char *origin);

/* The outcome of event_finalize. */
enum event_check {
    EVENT_OK = 0,
    EVENT_NOT_CANONICAL = -1, /* a value canonical JSON cannot carry */
    EVENT_TOO_LARGE = -2,     /* over EVENT_MAX_PDU_BYTES */
};
/* Add the content hash, check the size, compute the ID. *size_out (may be NULL) gets the
 * canonical size in bytes. For v1-2 an event without an event_id first gets one
 * (event_id_of_server with the sender's server: the write path gives one of this server
 * first), and string entries left in its prev_events and auth_events become [event ID, {}]
 * pairs (the write path makes them [event ID, {"sha256": ...}] first, with
 * rooms_graph_refs_as_pairs). */
int event_finalize(const room_version *v, json_t *pdu, char id_out[EVENT_ID_LEN],
                   size_t *size_out);

/* The client format of a stored event (no `unsigned`; the caller adds it): content
 * (redacted when `redacted`), event_id, origin_server_ts, sender, type, state_key when it
 * is a state event, room_id when with_room_id, and for redactions `redacts` both at the top
 * level and (unless redacted) in content, in every room version. A new object that
 * references nothing of pdu (pdu may be shared, events_pdus.h), or NULL on out-of-memory. */
json_t *event_client_format(const room_version *v, const json_t *pdu, const char *event_id,
                            bool redacted, bool with_room_id);

/* ---- checks a receiver runs before the authorization rules ------------------------- */

/* The outcome of event_check_format. */
enum event_format_check {
    EVENT_FORMAT_OK = 0,
    EVENT_FORMAT_BAD = -1,           /* a required key missing or of the wrong type */
    EVENT_FORMAT_TOO_LARGE = -2,     /* the event, an ID, type or state_key over its limit */
    EVENT_FORMAT_NOT_CANONICAL = -3, /* a value canonical JSON cannot carry */
};
#define EVENT_WHY_LEN 160

/* Does pdu (federation format) have the event format of room version v? Checks the keys
 * every version requires and their types (room_id, sender, type, content, origin_server_ts,
 * depth, hashes.sha256, signatures, auth_events, prev_events; v1-2 also event_id, v1-10 a
 * string `redacts` when present, v11 a string content.redacts when present), IDs of the
 * right shape, the limits (canonical JSON at most EVENT_MAX_PDU_BYTES, room_id, sender,
 * type, state_key and event IDs at most EVENT_MAX_ID_BYTES, at most EVENT_MAX_PREV_EVENTS
 * prev_events and EVENT_MAX_AUTH_EVENTS auth_events, depth from 0 to the version's
 * maximum), and values canonical JSON can carry (v6+: no real at all, not even "1.0";
 * every version: no fraction, no integer beyond 2^53, no nesting past CJSON_MAX_DEPTH).
 * EVENT_FORMAT_OK, or a negative enum event_format_check with why set (a
 * sentence naming the key). Pure; any thread. */
int event_check_format(const room_version *v, const json_t *pdu, char why[EVENT_WHY_LEN]);

/* The servers whose signatures v requires on pdu, as a new JSON array of distinct server
 * names: the sender's server; for v1-2 also the server of the event ID; for v8+ an
 * m.room.member event carrying content.join_authorised_via_users_server (auth rule 4.2)
 * also that user's server. An invite
 * made from a third-party invite (m.room.member, membership invite, content.
 * third_party_invite) is exempt from the sender's server (its sender must match the
 * m.room.third_party_invite event's, which the auth rules check, and another server may
 * deliver it): for v3+ the array can then be empty. NULL on out-of-memory or when pdu has
 * no sender. The caller owns the array. */
json_t *event_required_signers(const room_version *v, const json_t *pdu);

/* Does pdu's hashes.sha256 (base64, either alphabet, padded or not) equal its content
 * hash? false too when it has none or is not canonical. On false the receiver goes on with
 * the redacted event (event_redact), as the spec's "Validating hashes" asks. */
bool event_content_hash_ok(const json_t *pdu);

/* The state key of pdu, or NULL when it is not a state event. */
const char *event_state_key(const json_t *pdu);
/* The string member `key` of pdu's content, or NULL. */
const char *event_content_str(const json_t *pdu, const char *key);

#endif
