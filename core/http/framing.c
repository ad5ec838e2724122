/*
 * core/http/framing.c - the rules for how a request says where its body ends
 * (Content-Length, Transfer-Encoding), in one place for both places that judge them: the
 * gate, which reads the raw head of a client connection's first request (gate.c), and
 * server.c, which sees every request libmicrohttpd parsed (later requests on a kept-alive
 * connection, and the federation listener, which has no gate).
 *
 * The rules (RFC 9112, section 6): a Content-Length is decimal digits below 2^63 (a value
 * past that is a body too large, 413, not a malformed one); repeated, it must agree; the
 * last transfer coding must be chunked (else the body has no end: 400), once only (400),
 * and chunked is the only coding served (501 for any other before it); Content-Length
 * together with
 * Transfer-Encoding is a message framed two ways: 400. A refusal is an answer of its own:
 * these rules never say "let libmicrohttpd decide".
 *
 * Pure and thread-safe: the caller owns the http_framing and feeds it headers one by one.
 */
#include <string.h>
#include <strings.h>

#include "atrium/parse.h"
#include "core/http/http.h"

#define FRAMING_NUMBER_BYTES 32 /* a Content-Length value copied to be parsed */

static int refuse(http_framing *f, int status, const char *errcode, const char *msg)
{
    if (f->status) return f->status; /* the first refusal stands */
    f->status = status;
    f->errcode = errcode;
    f->msg = msg;
    return status;
}

static void trim(const char **v, size_t *len)
{
    while (*len && (**v == ' ' || **v == '\t')) (*v)++, (*len)--;
    while (*len && ((*v)[*len - 1] == ' ' || (*v)[*len - 1] == '\t')) (*len)--;
}

/* One Content-Length value: its number, or the refusal. */
static int content_length(http_framing *f, const char *v, size_t len)
{
    int64_t x = 0;
    int rc = ATRIUM_E_INVAL;
    if (len > 0 && len < FRAMING_NUMBER_BYTES) {
        char num[FRAMING_NUMBER_BYTES];
        memcpy(num, v, len);
        num[len] = '\0';
        rc = num[0] >= '0' && num[0] <= '9' ? atrium_parse_int64(num, 0, INT64_MAX, &x)
                                            : ATRIUM_E_INVAL;
    } else if (len > 0) {
        size_t digits = 0; /* values need not be NUL-terminated: a bounded scan */
        while (digits < len && v[digits] >= '0' && v[digits] <= '9') digits++;
        if (digits == len) rc = ATRIUM_E_LIMIT; /* all digits, just very many */
    }
    if (rc == ATRIUM_E_LIMIT)
        return refuse(f, 413, "M_TOO_LARGE", "The request body is too large");
    if (rc != 0) return refuse(f, 400, "M_UNKNOWN", "Content-Length is not a decimal number");
    if (f->have_length && x != f->length)
        return refuse(f, 400, "M_UNKNOWN", "Conflicting Content-Length headers");
    f->have_length = true;
    f->length = x;
    return 0;
}

/* One Transfer-Encoding line: its codings, comma-separated, in the order applied. */
static void transfer_codings(http_framing *f, const char *v, size_t len)
{
    f->have_coding = true;
    for (size_t at = 0; at <= len;) {
        const char *comma = memchr(v + at, ',', len - at);
        size_t end = comma ? (size_t)(comma - v) : len;
        const char *item = v + at;
        size_t item_len = end - at;
        trim(&item, &item_len);
        at = end + 1;
        if (item_len == 0) continue; /* "a, , b": empty list items are ignored */
        bool chunked = item_len == 7 && strncasecmp(item, "chunked", 7) == 0;
        f->chunked_last = chunked;
        if (chunked) f->chunked_count++;
        else f->other_coding = true;
    }
}

int http_framing_header(http_framing *f, const char *name, size_t name_len, const char *value,
                        size_t value_len)
{
    if (f->status) return f->status;
    trim(&value, &value_len);
    if (name_len == 14 && strncasecmp(name, "Content-Length", 14) == 0)
        return content_length(f, value, value_len);
    if (name_len == 17 && strncasecmp(name, "Transfer-Encoding", 17) == 0)
        transfer_codings(f, value, value_len);
    return 0;
}

int http_framing_end(http_framing *f)
{
    if (f->status) return f->status;
    if (f->have_length && f->have_coding)
        return refuse(f, 400, "M_UNKNOWN", "Both Content-Length and Transfer-Encoding were sent");
    if (f->have_coding && !f->chunked_last)
        return refuse(f, 400, "M_UNKNOWN", "Transfer-Encoding must end with chunked");
    if (f->chunked_count > 1)
        return refuse(f, 400, "M_UNKNOWN", "Transfer-Encoding names chunked more than once");
    if (f->have_coding && f->other_coding)
        return refuse(f, 501, "M_UNRECOGNIZED", "Only the chunked transfer coding is supported");
    return 0;
}

int http_head_limits(size_t head_bytes, size_t headers, size_t query_args, const char **errcode,
                     const char **msg)
{
    *errcode = "M_UNKNOWN";
    if (head_bytes > HTTP_MAX_HEAD_BYTES) {
        *msg = "The request headers are too large";
        return 431;
    }
    if (headers > HTTP_MAX_HEADERS) {
        *msg = "Too many request headers";
        return 431;
    }
    if (query_args > HTTP_MAX_QUERY_ARGS) {
        *errcode = "M_INVALID_PARAM";
        *msg = "Too many query parameters";
        return 400;
    }
    return 0;
}
