/*
 * core/federation/transport/fed_xmatrix.h - the X-Matrix Authorization header: parsing an inbound
 * one, building an outbound one, and checking a request against it.
 *
 * A federation request is signed as the JSON object {method, uri, origin, destination,
 * content} (content only when the request has a body), with the signing-JSON rules of
 * fed_keys.h, and the signature travels as
 *     Authorization: X-Matrix origin="a.example",destination="b.example",key="ed25519:k",sig="..."
 * `uri` is the request target exactly as sent: the path and the query string, still
 * percent-encoded ("/_matrix/federation/v1/query/profile?user_id=%40a%3Ab"), never the
 * decoded path. Server names are the names before delegation on both sides.
 *
 * Parsing follows the spec's grammar (RFC 9110 auth-params): the scheme case-insensitive,
 * parameter names case-insensitive and in any order, values quoted (with backslash
 * escapes) or bare tokens, spaces and tabs around commas, unknown parameters ignored. It
 * refuses what would make the header ambiguous or unbounded: a known parameter twice, a
 * value longer than its field, a missing origin, key or sig, an unterminated quote. A
 * missing `destination` is accepted (older servers omit it); one that is present must
 * name us. Building sends the compatible form: one space after the scheme, lower-case
 * names, every value quoted, no spaces around commas.
 *
 * What this file does not do: find the origin's public key (fed_keyring.h) or decide what
 * an HTTP answer to a refusal is (the caller maps the codes below to 401 M_UNAUTHORIZED).
 * Internal prefix: fed_xmatrix_. Any thread, no state.
 */
#ifndef ATRIUM_CORE_FED_XMATRIX_H
#define ATRIUM_CORE_FED_XMATRIX_H

#include <jansson.h>
#include <stddef.h>

#include "core/federation/transport/fed_keys.h"

/* An Authorization value longer than this is refused unread (a real one is ~200 bytes). */
#define FED_XMATRIX_HEADER_MAX_BYTES 2048
/* The longest sig value kept (88 characters of padded base64 for 64 bytes), with NUL. */
#define FED_XMATRIX_SIG_MAX_BYTES 96

/* Refusals particular to X-Matrix; signature failures are enum fed_sig_err (fed_keys.h). */
enum fed_xmatrix_err {
    FED_XMATRIX_E_MISSING = -110,     /* no Authorization header, or another scheme */
    FED_XMATRIX_E_MALFORMED = -111,   /* an X-Matrix header that does not parse */
    FED_XMATRIX_E_DESTINATION = -112, /* destination names another server */
};

/* A parsed header: NUL-terminated, unescaped values. */
typedef struct fed_xmatrix {
    char origin[FED_SERVER_NAME_MAX_BYTES];
    char destination[FED_SERVER_NAME_MAX_BYTES]; /* "" when the header has none */
    char key[FED_KEY_ID_MAX_BYTES];              /* "ed25519:abc" (not checked here) */
    char sig[FED_XMATRIX_SIG_MAX_BYTES];         /* base64 (decoded when verifying) */
} fed_xmatrix;

/* Parse an Authorization header value into *out. Returns 0; FED_XMATRIX_E_MISSING when
 * header is NULL, empty, or of another scheme ("Bearer ..."); FED_XMATRIX_E_MALFORMED for
 * an X-Matrix header that breaks the grammar or the rules above. On error `why` (why_len
 * bytes, may be NULL) says what was wrong, naming the parameter, and *out is zeroed. */
int fed_xmatrix_parse(const char *header, fed_xmatrix *out, char *why, size_t why_len);

/* Build the Authorization value of an outbound request into out (out_len bytes): sign
 * {method, uri, origin, destination, content} with key, content omitted when NULL.
 * Returns 0; ATRIUM_E_INVAL when content has no canonical encoding or a name contains a
 * character that cannot be sent quoted without escapes (a quote, a backslash, a control
 * character); ATRIUM_E_LIMIT when the value does not fit out (then out holds "");
 * ATRIUM_E_NOMEM. */
int fed_xmatrix_header(const char *method, const char *uri, const char *origin,
                       const char *destination, const json_t *content,
                       const fed_signing_key *key, char *out, size_t out_len);

/* Check a request against its parsed header x: `destination` is this server's name, and
 * when x names a destination it must be this one; the origin is x->origin and the key
 * x->key, whose public key (looked up by the caller) is pub. content is the request body
 * parsed as JSON, or NULL when the request has no body. Returns 0, or
 * FED_XMATRIX_E_DESTINATION, or a negative enum fed_sig_err (FED_SIG_E_BAD when the body,
 * method, uri or origin differ from what was signed), with `why` set to a sentence for
 * the log. */
int fed_xmatrix_verify(const char *method, const char *uri, const char *destination,
                       const json_t *content, const fed_xmatrix *x,
                       const unsigned char pub[FED_PUBLIC_KEY_BYTES], char *why,
                       size_t why_len);

/* The same check over the body's bytes as sent: the signed object's canonical encoding
 * with `"content":` followed by body[0..len) spliced in, which is what a sender that
 * sends the canonical JSON it signed (Synapse, this server) signed. For a body that is
 * JSON but has no canonical encoding here (an integer past 2^53, a real): its PDUs are
 * then judged one by one (event_check_format) instead of the whole transaction failing
 * authentication. Returns as fed_xmatrix_verify. */
int fed_xmatrix_verify_raw(const char *method, const char *uri, const char *destination,
                           const char *body, size_t len, const fed_xmatrix *x,
                           const unsigned char pub[FED_PUBLIC_KEY_BYTES], char *why,
                           size_t why_len);

/* A short label for a refusal code of this file or fed_sig_err, for metrics and logs
 * ("missing", "malformed", "destination", "unsigned", "bad_base64", "bad_signature",
 * "not_canonical", "algorithm"; "other" for any other code). Static. */
const char *fed_xmatrix_reason(int code);

#endif
