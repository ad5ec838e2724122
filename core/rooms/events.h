/*
 * core/rooms/events.h - room events as data: room versions, the redaction algorithm,
 * content hashes, reference hashes (event IDs) and the client format.
 *
 * Events are stored and hashed in the federation (PDU) format of room versions 4 and later:
 * the event ID is not part of the event but derived from it, "$" + URL-safe unpadded base64
 * of the SHA-256 of the canonical JSON of the *redacted* event without `signatures` and
 * `unsigned`. So an ID computed here is the one every other server computes, and a
 * redaction never changes an event's ID. Everything here is pure (no database, no request):
 * the write path lives in rooms_write.c, the rules of who may send what in room_auth.c.
 * Internal prefixes: room_version_, event_.
 *
 * Not done here yet: signing with the server's key (the `signatures` member). Signatures
 * are not covered by the reference hash, so adding them later changes no event ID.
 */
#ifndef ATRIUM_CORE_EVENTS_H
#define ATRIUM_CORE_EVENTS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define EVENT_MAX_PDU_BYTES 65536 /* canonical JSON of a whole event (spec "Size limits") */
#define EVENT_MAX_ID_BYTES 255    /* type, state_key, sender, room_id */
#define EVENT_ID_LEN 48           /* "$" + 43 characters of base64, plus NUL (and spare) */

/* What differs between the room versions this server creates and joins. */
typedef struct room_version {
    const char *id;         /* "10", "11" */
    bool v11_redaction;     /* the redaction algorithm of room version 11 */
    bool creator_is_sender; /* v11: m.room.create has no content.creator */
    bool redacts_in_content; /* v11: m.room.redaction carries content.redacts */
} room_version;

/* The version named id, or NULL when this server does not support it. */
const room_version *room_version_find(const char *id);
/* "10"-style IDs of every supported version, NULL-terminated (for /capabilities). */
extern const char *const ROOM_VERSIONS_SUPPORTED[];

/* The content of an event of `type` after redaction under v: a new object holding only
 * the keys that survive. */
json_t *event_redact_content(const room_version *v, const char *type, const json_t *content);
/* The whole event after redaction (top-level keys and content): a new object. */
json_t *event_redact(const room_version *v, const json_t *pdu);

/* Set pdu.hashes.sha256: standard unpadded base64 of the SHA-256 of the canonical JSON of
 * the event without unsigned, signatures and hashes. 0, or -1 when it is not canonical. */
int event_add_content_hash(json_t *pdu);
/* The event ID of pdu ("$" + reference hash) into out. 0, or -1 when not canonical. */
int event_compute_id(const room_version *v, const json_t *pdu, char out[EVENT_ID_LEN]);

/* The outcome of event_finalize. */
enum event_check {
    EVENT_OK = 0,
    EVENT_NOT_CANONICAL = -1, /* a value canonical JSON cannot carry */
    EVENT_TOO_LARGE = -2,     /* over EVENT_MAX_PDU_BYTES */
};
/* Add the content hash, check the size, compute the ID. *size_out (may be NULL) gets the
 * canonical size in bytes. */
int event_finalize(const room_version *v, json_t *pdu, char id_out[EVENT_ID_LEN],
                   size_t *size_out);

/* The client format of a stored event (no `unsigned`; the caller adds it): content
 * (redacted when `redacted`), event_id, origin_server_ts, sender, type, state_key when it
 * is a state event, room_id when with_room_id, and a top-level `redacts` for redactions in
 * every room version. A new object, or NULL on out-of-memory. */
json_t *event_client_format(const room_version *v, const json_t *pdu, const char *event_id,
                            bool redacted, bool with_room_id);

/* The state key of pdu, or NULL when it is not a state event. */
const char *event_state_key(const json_t *pdu);
/* The string member `key` of pdu's content, or NULL. */
const char *event_content_str(const json_t *pdu, const char *key);

#endif
