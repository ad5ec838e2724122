/*
 * core/federation/transport/fed_xmatrix.c - X-Matrix parsing, building and checking (see
 * fed_xmatrix.h for the grammar accepted and why).
 *
 * The parser is a single left-to-right pass over a bounded string with one cursor; every
 * value is unescaped straight into its fixed-size field, so no input, however long or
 * broken, can make it allocate or write past a field. Unquoted values accept the RFC's
 * token characters plus ':' (the spec's compatibility rule for server names with ports)
 * and '/' and '=' (so a bare base64 signature reads as its sender meant).
 *
 * The object that is signed is built in one place, request_object, for both directions:
 * a mismatch between how we sign and how we check is then impossible by construction.
 */
#include <sodium.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/federation/transport/fed_xmatrix.h"
#include "core/rooms/canonical_json.h"
#include "core/runtime/base64.h"

#define SCHEME "X-Matrix"
#define PARAM_NAME_SHOWN_MAX_CHARS 32 /* of an unknown parameter's name, in a refusal */
#define NAME_SHOWN(len) ((int)((len) > PARAM_NAME_SHOWN_MAX_CHARS ? PARAM_NAME_SHOWN_MAX_CHARS : (len)))

#define WHY(...)                                                                        \
    do {                                                                                \
        if (why && why_len) snprintf(why, why_len, __VA_ARGS__);                        \
    } while (0)

/* RFC 9110 tchar. */
static bool tchar(unsigned char c)
{
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) return true;
    return c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static bool bare_value_char(unsigned char c)
{
    return tchar(c) || c == ':' || c == '/' || c == '=';
}

static bool ows(unsigned char c) { return c == ' ' || c == '\t'; }

/* A byte allowed inside a quoted string, escaped or not: not a control character (HTAB
 * excepted) and not DEL (RFC 9110 qdtext / quoted-pair). */
static bool quotable(unsigned char c)
{
    return c == '\t' || (c >= 0x20 && c != 0x7f);
}

enum param { P_ORIGIN, P_DESTINATION, P_KEY, P_SIG, P_UNKNOWN, P_COUNT = P_UNKNOWN };
static const char *const PARAM_NAMES[P_COUNT] = {"origin", "destination", "key", "sig"};

static enum param param_of(const char *name, size_t len)
{
    for (int i = 0; i < P_COUNT; i++)
        if (strlen(PARAM_NAMES[i]) == len && strncasecmp(PARAM_NAMES[i], name, len) == 0)
            return (enum param)i;
    return P_UNKNOWN;
}

/* Every refusal of a parse leaves *out zeroed (why is set by the caller). */
static int malformed(fed_xmatrix *out)
{
    memset(out, 0, sizeof(*out));
    return FED_XMATRIX_E_MALFORMED;
}

/* Read one parameter's value at *pp, quoted or bare, unescaped into dst (cap bytes; NULL
 * for an unknown parameter, whose value is only skipped), and move *pp past it. Adds its
 * length to *n_io and sets *too_long when it does not fit dst. false (why set, naming the
 * parameter) for a value that is not well formed. */
static bool read_value(const unsigned char **pp, char *dst, size_t cap, size_t *n_io,
                       bool *too_long, const unsigned char *name, size_t name_len, char *why,
                       size_t why_len)
{
    const unsigned char *p = *pp;
    size_t n = *n_io;
    if (*p == '"') {
        p++;
        for (;;) {
            unsigned char c = *p;
            if (c == '"') break;
            if (c == '\\') c = *++p;
            if (c == '\0') {
                WHY("the X-Matrix parameter \"%.*s\" has an unterminated quoted value",
                    NAME_SHOWN(name_len), (const char *)name);
                return false;
            }
            if (!quotable(c)) {
                WHY("the X-Matrix parameter \"%.*s\" holds a control character",
                    NAME_SHOWN(name_len), (const char *)name);
                return false;
            }
            if (dst && n + 1 < cap) dst[n] = (char)c;
            else if (dst) *too_long = true;
            n++;
            p++;
        }
        p++; /* the closing quote */
    } else {
        while (bare_value_char(*p)) {
            if (dst && n + 1 < cap) dst[n] = (char)*p;
            else if (dst) *too_long = true;
            n++;
            p++;
        }
    }
    *pp = p;
    *n_io = n;
    return true;
}

int fed_xmatrix_parse(const char *header, fed_xmatrix *out, char *why, size_t why_len)
{
    memset(out, 0, sizeof(*out));
    if (!header || !*header) {
        WHY("no Authorization header");
        return FED_XMATRIX_E_MISSING;
    }
    size_t hlen = strnlen(header, FED_XMATRIX_HEADER_MAX_BYTES + 1);
    const unsigned char *p = (const unsigned char *)header;
    while (ows(*p)) p++;
    const unsigned char *scheme = p;
    while (tchar(*p)) p++;
    size_t scheme_len = (size_t)(p - scheme);
    if (scheme_len != strlen(SCHEME) || strncasecmp((const char *)scheme, SCHEME, scheme_len) != 0 ||
        (*p && !ows(*p))) {
        WHY("the Authorization header is not of the X-Matrix scheme");
        return FED_XMATRIX_E_MISSING;
    }
    if (hlen > FED_XMATRIX_HEADER_MAX_BYTES) {
        WHY("the X-Matrix header is longer than %d bytes", FED_XMATRIX_HEADER_MAX_BYTES);
        return malformed(out);
    }
    if (!ows(*p)) {
        WHY("the X-Matrix header has no parameters");
        return malformed(out);
    }

    char *fields[P_COUNT] = {out->origin, out->destination, out->key, out->sig};
    const size_t caps[P_COUNT] = {sizeof(out->origin), sizeof(out->destination),
                                  sizeof(out->key), sizeof(out->sig)};
    bool seen[P_COUNT] = {false};
    for (;;) {
        while (ows(*p)) p++;
        if (!*p) break;
        if (*p == ',') { /* an empty list element: allowed by the #rule */
            p++;
            continue;
        }
        const unsigned char *name = p;
        while (tchar(*p)) p++;
        size_t name_len = (size_t)(p - name);
        if (name_len == 0) {
            WHY("the X-Matrix header has an unexpected character at byte %zu",
                (size_t)(p - (const unsigned char *)header));
            return malformed(out);
        }
        enum param which = param_of((const char *)name, name_len);
        while (ows(*p)) p++;
        if (*p != '=') {
            WHY("the X-Matrix parameter \"%.*s\" has no value", NAME_SHOWN(name_len),
                (const char *)name);
            return malformed(out);
        }
        p++;
        while (ows(*p)) p++;
        if (which != P_UNKNOWN && seen[which]) {
            WHY("the X-Matrix parameter \"%s\" is given twice", PARAM_NAMES[which]);
            return malformed(out);
        }
        /* The value, unescaped into its field (or nowhere for an unknown parameter). */
        char *dst = which == P_UNKNOWN ? NULL : fields[which];
        size_t cap = which == P_UNKNOWN ? 0 : caps[which], n = 0;
        bool too_long = false;
        if (!read_value(&p, dst, cap, &n, &too_long, name, name_len, why, why_len))
            return malformed(out);
        if (which != P_UNKNOWN) {
            if (too_long) {
                WHY("the X-Matrix parameter \"%s\" is longer than %zu bytes", PARAM_NAMES[which],
                    cap - 1);
                return malformed(out);
            }
            if (n == 0) {
                WHY("the X-Matrix parameter \"%s\" is empty", PARAM_NAMES[which]);
                return malformed(out);
            }
            dst[n] = '\0';
            seen[which] = true;
        }
        while (ows(*p)) p++;
        if (*p && *p != ',') {
            WHY("the X-Matrix header has an unexpected character after parameter \"%.*s\"",
                NAME_SHOWN(name_len), (const char *)name);
            return malformed(out);
        }
    }
    static const enum param required[] = {P_ORIGIN, P_KEY, P_SIG};
    for (size_t i = 0; i < sizeof(required) / sizeof(required[0]); i++)
        if (!seen[required[i]]) {
            WHY("the X-Matrix header has no \"%s\" parameter", PARAM_NAMES[required[i]]);
            return malformed(out);
        }
    return 0;
}

/* The object a request's signature covers. A new reference, or NULL (out of memory). */
static json_t *request_object(const char *method, const char *uri, const char *origin,
                              const char *destination, const json_t *content)
{
    json_t *o = json_pack("{s:s, s:s, s:s, s:s}", "method", method, "uri", uri, "origin", origin,
                          "destination", destination);
    if (o && content && json_object_set(o, "content", (json_t *)content) < 0) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static bool sendable_quoted(const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p == '"' || *p == '\\' || !quotable(*p) || *p == '\t') return false;
    return *s != '\0';
}

int fed_xmatrix_header(const char *method, const char *uri, const char *origin,
                       const char *destination, const json_t *content,
                       const fed_signing_key *key, char *out, size_t out_len)
{
    if (out_len) out[0] = '\0';
    if (!sendable_quoted(origin) || !sendable_quoted(destination)) return ATRIUM_E_INVAL;
    json_t *o = request_object(method, uri, origin, destination, content);
    if (!o) return ATRIUM_E_NOMEM;
    int rc = fed_sign_json(o, origin, key);
    if (rc < 0) {
        json_decref(o);
        return rc;
    }
    const char *sig = json_string_value(
        json_object_get(json_object_get(json_object_get(o, "signatures"), origin), key->key_id));
    int n = snprintf(out, out_len, SCHEME " origin=\"%s\",destination=\"%s\",key=\"%s\",sig=\"%s\"",
                     origin, destination, key->key_id, sig ? sig : "");
    json_decref(o);
    if (!sig) return ATRIUM_E_NOMEM;
    if (n < 0 || (size_t)n >= out_len) {
        if (out_len) out[0] = '\0';
        return ATRIUM_E_LIMIT;
    }
    return 0;
}

/* The header's destination, when it names one, is this server (both checks below). */
static bool destination_ok(const fed_xmatrix *x, const char *destination, char *why,
                           size_t why_len)
{
    if (!x->destination[0] || strcmp(x->destination, destination) == 0) return true;
    WHY("the request from %.255s is addressed to %.255s, not to this server (%.255s)",
        x->origin, x->destination, destination);
    return false;
}

int fed_xmatrix_verify(const char *method, const char *uri, const char *destination,
                       const json_t *content, const fed_xmatrix *x,
                       const unsigned char pub[FED_PUBLIC_KEY_BYTES], char *why,
                       size_t why_len)
{
    if (!destination_ok(x, destination, why, why_len)) return FED_XMATRIX_E_DESTINATION;
    json_t *o = request_object(method, uri, x->origin, destination, content);
    if (!o) {
        WHY("out of memory checking the request from %.255s", x->origin);
        return ATRIUM_E_NOMEM;
    }
    int rc = json_object_set_new(
        o, "signatures", json_pack("{s:{s:s}}", x->origin, x->key, x->sig));
    if (rc < 0) {
        json_decref(o);
        WHY("out of memory checking the request from %.255s", x->origin);
        return ATRIUM_E_NOMEM;
    }
    rc = fed_verify_json(o, x->origin, x->key, pub, why, why_len);
    json_decref(o);
    return rc;
}

int fed_xmatrix_verify_raw(const char *method, const char *uri, const char *destination,
                           const char *body, size_t len, const fed_xmatrix *x,
                           const unsigned char pub[FED_PUBLIC_KEY_BYTES], char *why,
                           size_t why_len)
{
    if (!destination_ok(x, destination, why, why_len)) return FED_XMATRIX_E_DESTINATION;
    unsigned char sig[FED_SIGNATURE_BYTES];
    if (rt_b64_decode_exact(x->sig, sig, sizeof(sig)) < 0) {
        WHY("the signature by %.255s is not base64 of %d bytes", x->origin, FED_SIGNATURE_BYTES);
        return FED_SIG_E_BASE64;
    }
    /* "content" sorts before "destination", "method", "origin" and "uri": it comes first. */
    json_t *o = request_object(method, uri, x->origin, destination, NULL);
    size_t rest_len = 0;
    char *rest = o ? cjson_encode(o, &rest_len) : NULL;
    json_decref(o);
    static const char HEAD[] = "{\"content\":";
    size_t n = sizeof(HEAD) - 1 + len + 1 + (rest_len ? rest_len - 1 : 0);
    char *bytes = rest && rest_len > 2 ? malloc(n) : NULL;
    if (!bytes) {
        free(rest);
        WHY("out of memory checking the request from %.255s", x->origin);
        return ATRIUM_E_NOMEM;
    }
    memcpy(bytes, HEAD, sizeof(HEAD) - 1);
    memcpy(bytes + sizeof(HEAD) - 1, body, len);
    bytes[sizeof(HEAD) - 1 + len] = ',';
    memcpy(bytes + sizeof(HEAD) + len, rest + 1, rest_len - 1); /* after its '{' */
    free(rest);
    int rc = crypto_sign_verify_detached(sig, (const unsigned char *)bytes, n, pub);
    free(bytes);
    if (rc != 0) {
        WHY("the signature by %.255s with key %.64s does not match", x->origin, x->key);
        return FED_SIG_E_BAD;
    }
    return 0;
}

const char *fed_xmatrix_reason(int code)
{
    switch (code) {
    case FED_XMATRIX_E_MISSING: return "missing";
    case FED_XMATRIX_E_MALFORMED: return "malformed";
    case FED_XMATRIX_E_DESTINATION: return "destination";
    case FED_SIG_E_UNSIGNED: return "unsigned";
    case FED_SIG_E_BASE64: return "bad_base64";
    case FED_SIG_E_BAD: return "bad_signature";
    case FED_SIG_E_NOT_CANONICAL: return "not_canonical";
    case FED_SIG_E_ALGORITHM: return "algorithm";
    default: return "other";
    }
}
