/*
 * plugins/media/multipart.c - reading the multipart/mixed answer of
 * /_matrix/federation/v1/media/{download,thumbnail} as it arrives, chunk by chunk, without
 * ever holding the file part in memory.
 *
 * The format (Matrix server-server API, "Content repository"; RFC 2046 §5.1): a
 * boundary from the Content-Type header; the body is "--boundary", CRLF, the first part's
 * headers, a blank line, the metadata (a JSON object), then CRLF "--boundary" and the
 * second part: either the file (its own Content-Type and Content-Disposition) or no bytes
 * and a Location header naming where the file can be fetched; then CRLF "--boundary--".
 * Whatever precedes the first delimiter (a preamble) or follows the last (an epilogue) is
 * ignored, as RFC 2046 says; parts after the second are ignored too.
 *
 * The parser keeps one buffer: bytes are appended to it, and while looking for the next
 * delimiter everything that cannot be its beginning is handed on (to on_body for the file
 * part), so at most MP_BUF_BYTES plus one header block are held at a time. Anything that
 * does not parse (no delimiter where one must be, a header block or metadata too long,
 * metadata that is not a JSON object) is an error: the caller answers 502 and stores
 * nothing. Pure: no host calls, no I/O (tests/unit/test_media_multipart.c).
 */
#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "media.h"

#define MP_PREAMBLE_MAX 4096 /* ignored bytes before the first delimiter, at most */

/* The boundary parameter of a Content-Type value, unquoted, into out. */
static int boundary_of(const char *ct, char *out, size_t cap)
{
    const char *p = ct;
    while (*p == ' ' || *p == '\t') p++;
    if (strncasecmp(p, "multipart/mixed", 15) != 0) return -1;
    p += 15;
    while (*p) {
        const char *semi = strchr(p, ';');
        if (!semi) return -1;
        p = semi + 1;
        while (*p == ' ' || *p == '\t') p++;
        if (strncasecmp(p, "boundary=", 9) != 0) continue;
        p += 9;
        size_t n = 0;
        if (*p == '"') {
            p++;
            while (*p && *p != '"' && n + 1 < cap) out[n++] = *p++;
            if (*p != '"') return -1;
        } else {
            while (*p && *p != ';' && *p != ' ' && *p != '\t' && n + 1 < cap) out[n++] = *p++;
        }
        out[n] = '\0';
        if (n == 0 || n > MP_BOUNDARY_MAX) return -1;
        return 0;
    }
    return -1;
}

int mp_init(mp_parser *p, const char *content_type)
{
    char b[MP_BOUNDARY_MAX + 2];
    memset(p->content_type, 0, sizeof(p->content_type));
    p->disposition[0] = p->location[0] = '\0';
    p->json_len = 0;
    p->json[0] = '\0';
    p->part = 0;
    p->body_bytes = 0;
    if (!content_type || boundary_of(content_type, b, sizeof(b)) < 0) {
        p->state = MP_ERROR;
        return -1;
    }
    p->dlen = (size_t)snprintf(p->delim, sizeof(p->delim), "\r\n--%s", b);
    /* The first delimiter needs no CRLF before it: pretend one came. */
    memcpy(p->buf, "\r\n", 2);
    p->len = 2;
    p->state = MP_PREAMBLE;
    return 0;
}

static void consume(mp_parser *p, size_t n)
{
    memmove(p->buf, p->buf + n, p->len - n);
    p->len -= n;
}

/* The value of a header line "Name: value" into out when the name matches. */
static void header_value(const char *line, size_t len, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);
    if (len <= nl || strncasecmp(line, name, nl) != 0 || line[nl] != ':') return;
    const char *v = line + nl + 1;
    const char *end = line + len;
    while (v < end && (*v == ' ' || *v == '\t')) v++;
    while (end > v && (end[-1] == ' ' || end[-1] == '\t')) end--;
    size_t n = (size_t)(end - v);
    if (n >= cap) n = cap - 1;
    memcpy(out, v, n);
    out[n] = '\0';
}

static void parse_headers(mp_parser *p, const char *block, size_t len)
{
    if (p->part != 2) return;
    const char *line = block;
    const char *end = block + len;
    while (line < end) {
        const char *eol = memmem(line, (size_t)(end - line), "\r\n", 2);
        size_t n = eol ? (size_t)(eol - line) : (size_t)(end - line);
        header_value(line, n, "Content-Type", p->content_type, sizeof(p->content_type));
        header_value(line, n, "Content-Disposition", p->disposition, sizeof(p->disposition));
        header_value(line, n, "Location", p->location, sizeof(p->location));
        line += n + 2;
    }
}

/* Hand on part bytes (the file part to on_body, the metadata to json). */
static int emit(mp_parser *p, const char *data, size_t len)
{
    if (len == 0) return 0;
    if (p->part == 1) {
        if (p->json_len + len > MP_JSON_MAX) return -1;
        memcpy(p->json + p->json_len, data, len);
        p->json_len += len;
        p->json[p->json_len] = '\0';
        return 0;
    }
    if (p->part == 2) {
        p->body_bytes += (int64_t)len;
        return p->on_body ? p->on_body(p->arg, data, len) : 0;
    }
    return 0;
}

#define STEP_STOPPED (-2) /* on_body refused: its value is in p->stopped */

/* emit's non-zero answer as a step result: -1 (malformed) stays, anything else from
 * on_body is kept for mp_feed to return. */
static int stopped(mp_parser *p, int rc)
{
    if (rc == -1) return -1;
    p->stopped = rc;
    return STEP_STOPPED;
}

static bool metadata_is_object(const mp_parser *p)
{
    json_error_t err;
    json_t *j = json_loadb(p->json, p->json_len, 0, &err);
    bool ok = j && json_is_object(j);
    json_decref(j);
    return ok;
}

/* Advance as far as the buffer allows: 1 = progress made, 0 = needs more bytes, -1 for a
 * malformed body, STEP_STOPPED when on_body refused (never on_body's value itself: a
 * refusal of 1 would read as progress and the same bytes be handed on forever). */
static int step(mp_parser *p)
{
    switch (p->state) {
    case MP_PREAMBLE:
    case MP_PART: {
        char *hit = memmem(p->buf, p->len, p->delim, p->dlen);
        size_t keep = p->dlen - 1;
        if (!hit) {
            if (p->len <= keep) return 0;
            size_t out = p->len - keep;
            if (p->state == MP_PREAMBLE) {
                if (p->body_bytes + (int64_t)out > MP_PREAMBLE_MAX) return -1;
                p->body_bytes += (int64_t)out;
            } else {
                int rc = emit(p, p->buf, out);
                if (rc) return stopped(p, rc);
            }
            consume(p, out);
            return 0;
        }
        size_t at = (size_t)(hit - p->buf);
        if (p->state == MP_PART) {
            int rc = emit(p, p->buf, at);
            if (rc) return stopped(p, rc);
            if (p->part == 1 && !metadata_is_object(p)) return -1;
        } else {
            p->body_bytes = 0;
        }
        consume(p, at + p->dlen);
        p->state = MP_AFTER_DELIM;
        return 1;
    }
    case MP_AFTER_DELIM: {
        size_t i = 0;
        while (i < p->len && (p->buf[i] == ' ' || p->buf[i] == '\t')) i++; /* padding */
        if (p->len < i + 2) return 0;
        if (p->buf[i] == '-' && p->buf[i + 1] == '-') {
            p->state = p->part >= 2 ? MP_DONE : MP_ERROR;
            p->len = 0;
            return p->state == MP_DONE ? 1 : -1;
        }
        if (p->buf[i] != '\r' || p->buf[i + 1] != '\n') return -1;
        consume(p, i + 2);
        p->part++;
        p->state = MP_HEADERS;
        return 1;
    }
    case MP_HEADERS: {
        if (p->len >= 2 && p->buf[0] == '\r' && p->buf[1] == '\n') { /* no headers */
            consume(p, 2);
            p->state = MP_PART;
            return 1;
        }
        char *end = memmem(p->buf, p->len, "\r\n\r\n", 4);
        if (!end) return p->len > MP_HEADERS_MAX ? -1 : 0;
        parse_headers(p, p->buf, (size_t)(end - p->buf));
        consume(p, (size_t)(end - p->buf) + 4);
        p->state = MP_PART;
        return 1;
    }
    case MP_DONE: p->len = 0; return 0;
    default: return -1;
    }
}

int mp_feed(mp_parser *p, const char *data, size_t len)
{
    if (p->state == MP_ERROR) return -1;
    while (len > 0 || p->state != MP_DONE) {
        size_t room = sizeof(p->buf) - p->len;
        size_t n = len < room ? len : room;
        memcpy(p->buf + p->len, data, n);
        p->len += n;
        data += n;
        len -= n;
        int rc;
        while ((rc = step(p)) == 1) {
        }
        if (rc != 0) {
            p->state = MP_ERROR;
            return rc == STEP_STOPPED ? p->stopped : rc;
        }
        if (p->state == MP_DONE) return 0;
        if (len == 0) break;
        if (p->len == sizeof(p->buf)) { /* nothing could be handed on: malformed */
            p->state = MP_ERROR;
            return -1;
        }
    }
    return 0;
}

bool mp_complete(const mp_parser *p)
{
    return p->state == MP_DONE && p->part >= 2;
}
