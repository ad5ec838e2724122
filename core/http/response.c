/*
 * core/http/response.c - building responses: JSON, bytes, files, streams and Matrix errors,
 * with the headers every response carries (CORS) and every failure carries (no-store).
 *
 * CORS headers are added in one place only, http_add_cors, which core/http/server.c calls
 * on every response right before MHD_queue_response (whoever built it: a handler, the
 * router's 404, a deadline's 504). Nothing else adds them: libmicrohttpd appends a header
 * each time it is added, and a browser refuses a response whose Access-Control-Allow-Origin
 * appears twice.
 *
 * Responses are built here on whichever thread owns the request and queued by
 * core/http/server.c on the request-pool thread that owns the connection: a pool thread
 * never calls MHD_queue_response (deprecated on suspended connections); it stores the
 * response and resumes. This file does not decide *when* a response goes out.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/http/http.h"

#define STREAM_BLOCK_BYTES (64 * 1024)

/* The CORS headers every answer carries, whichever way it is sent. */
static const char *const CORS_HEADERS[][2] = {
    {"Access-Control-Allow-Origin", "*"},
    {"Access-Control-Allow-Methods", "GET, HEAD, POST, PUT, DELETE, OPTIONS"},
    {"Access-Control-Allow-Headers", "X-Requested-With, Content-Type, Authorization, Date"},
    {"Access-Control-Expose-Headers", "Content-Disposition, Retry-After, ETag, Content-Range"},
};
#define N_CORS_HEADERS (sizeof(CORS_HEADERS) / sizeof(CORS_HEADERS[0]))

void http_add_cors(struct MHD_Response *resp)
{
    /* Idempotent: a response object queued again (or built by a plugin that set them
     * itself) keeps one copy. */
    if (MHD_get_response_header(resp, CORS_HEADERS[0][0])) return;
    for (size_t i = 0; i < N_CORS_HEADERS; i++)
        MHD_add_response_header(resp, CORS_HEADERS[i][0], CORS_HEADERS[i][1]);
}

static struct MHD_Response *json_response(json_t *body)
{
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    if (!text) return NULL;
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(text);
        return NULL;
    }
    MHD_add_response_header(resp, "Content-Type", "application/json");
    return resp;
}

/* The body of a Matrix error (malloc'd JSON text), or NULL. A message that is not UTF-8
 * (it may quote what the client sent) is replaced rather than losing the answer. */
static char *error_json(const char *errcode, const char *msg, int64_t retry_after_ms)
{
    json_t *body = json_pack("{s:s, s:s}", "errcode", errcode, "error", msg ? msg : "");
    if (!body) body = json_pack("{s:s, s:s}", "errcode", errcode, "error", "(unprintable)");
    if (!body) return NULL;
    if (retry_after_ms > 0) json_object_set_new(body, "retry_after_ms", json_integer(retry_after_ms));
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    return text;
}

/* Retry-After seconds of an error: from retry_after_ms, 1 for a bare 503, else 0. */
static int64_t retry_after_s(int status, int64_t retry_after_ms)
{
    if (retry_after_ms > 0) return (retry_after_ms + 999) / 1000;
    return status == 503 ? 1 : 0;
}

static struct MHD_Response *error_response_from(int status, char *text, int64_t retry_after_ms)
{
    if (!text) return NULL;
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(text);
        return NULL;
    }
    MHD_add_response_header(resp, "Content-Type", "application/json");
    MHD_add_response_header(resp, "Cache-Control", "no-store");
    int64_t secs = retry_after_s(status, retry_after_ms);
    if (secs > 0) {
        char v[32];
        snprintf(v, sizeof(v), "%lld", (long long)secs);
        MHD_add_response_header(resp, "Retry-After", v);
    }
    return resp;
}

struct MHD_Response *http_error_response(int status, const char *errcode, const char *msg,
                                         int64_t retry_after_ms)
{
    return error_response_from(status, error_json(errcode, msg, retry_after_ms), retry_after_ms);
}

const char *http_reason_phrase(int status)
{
    switch (status) {
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 414: return "URI Too Long";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
    }
}

size_t http_error_wire(atrium_req *r, int status, const char *errcode, const char *msg,
                       char *buf, size_t cap)
{
    char *own = NULL;
    const char *json;
    int64_t secs;
    if (errcode) {
        json = own = error_json(errcode, msg, 0);
        secs = retry_after_s(status, 0);
    } else {
        if (!r || !r->response || !r->error_json) return 0;
        status = r->status;
        json = r->error_json;
        secs = r->error_retry_after_s;
    }
    if (!json) return 0;
    char extra[512] = "";
    size_t at = 0;
    if (secs > 0)
        at += (size_t)snprintf(extra, sizeof(extra), "Retry-After: %lld\r\n", (long long)secs);
    for (size_t i = 0; i < N_CORS_HEADERS && at < sizeof(extra); i++)
        at += (size_t)snprintf(extra + at, sizeof(extra) - at, "%s: %s\r\n", CORS_HEADERS[i][0],
                               CORS_HEADERS[i][1]);
    int n = snprintf(buf, cap,
                     "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\nCache-Control: no-store\r\n"
                     "%s\r\n%s",
                     status, http_reason_phrase(status), strlen(json), extra, json);
    free(own);
    return n > 0 && (size_t)n < cap && at < sizeof(extra) ? (size_t)n : 0;
}

void http_set_response(atrium_req *r, int status, struct MHD_Response *resp)
{
    if (r->response) MHD_destroy_response(r->response);
    r->response = resp;
    r->status = status;
    r->response_file = false; /* http_respond_file says so after storing its own */
}

void http_finalize_response(atrium_req *r)
{
    if (!r->response) return;
    /* Custom headers were prepended; add them oldest first. */
    http_out_header *rev = NULL;
    for (http_out_header *h = r->out_headers; h;) {
        http_out_header *next = h->next;
        h->next = rev;
        rev = h;
        h = next;
    }
    for (http_out_header *h = rev; h; h = h->next)
        MHD_add_response_header(r->response, h->name, h->value);
    r->out_headers = NULL;
}

/* A response built on a pool thread after the core already answered is dropped. */
static bool answered_elsewhere(atrium_req *r)
{
    pthread_mutex_lock(&r->mu);
    bool gone = r->susp == SUSP_RESUMING;
    pthread_mutex_unlock(&r->mu);
    return gone;
}

static int store(atrium_req *r, int status, struct MHD_Response *resp)
{
    if (!resp) return ATRIUM_E_NOMEM;
    if (answered_elsewhere(r)) {
        MHD_destroy_response(resp);
        return ATRIUM_E_EXPIRED;
    }
    http_set_response(r, status, resp);
    r->error_json = NULL; /* an error sets it again right after */
    return 0;
}

/* Store a Matrix error built from text (consumed), remembering its JSON for
 * http_error_wire. */
static int store_error(atrium_req *r, int status, char *text, int64_t retry_after_ms)
{
    const char *copy = text ? rt_arena_strdup(r->arena, text) : NULL;
    int rc = store(r, status, error_response_from(status, text, retry_after_ms));
    if (rc == 0) {
        r->error_json = copy;
        r->error_retry_after_s = retry_after_s(status, retry_after_ms);
    }
    return rc;
}

int http_respond_json(atrium_req *r, int status, json_t *body)
{
    if (!body) return ATRIUM_E_INVAL;
    if (status >= 400) { /* an error of its own shape (M_UNKNOWN_TOKEN with soft_logout) */
        char *text = json_dumps(body, JSON_COMPACT);
        json_decref(body);
        return text ? store_error(r, status, text, 0) : ATRIUM_E_NOMEM;
    }
    return store(r, status, json_response(body));
}

int http_respond_error(atrium_req *r, int status, const char *errcode, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    r->out_headers = NULL; /* a failure does not carry the success headers */
    return store_error(r, status, error_json(errcode, msg, 0), 0);
}

int http_respond_limited(atrium_req *r, int64_t retry_after_ms, const char *message)
{
    if (retry_after_ms <= 0) retry_after_ms = 1000;
    r->out_headers = NULL;
    return store_error(r, 429,
                       error_json("M_LIMIT_EXCEEDED", message ? message : "Too many requests",
                                  retry_after_ms),
                       retry_after_ms);
}

int http_respond_header(atrium_req *r, const char *name, const char *value)
{
    http_out_header *h = rt_arena_alloc(r->arena, sizeof(*h));
    if (!h) return ATRIUM_E_NOMEM;
    h->name = rt_arena_strdup(r->arena, name);
    h->value = rt_arena_strdup(r->arena, value);
    if (!h->name || !h->value) return ATRIUM_E_NOMEM;
    h->next = r->out_headers;
    r->out_headers = h;
    return 0;
}

int http_respond_buffer(atrium_req *r, int status, const char *content_type, const void *data,
                        size_t len)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, (void *)data, MHD_RESPMEM_MUST_COPY);
    if (resp && content_type) MHD_add_response_header(resp, "Content-Type", content_type);
    return store(r, status, resp);
}

int http_respond_file(atrium_req *r, int status, const char *content_type, int fd,
                      uint64_t offset, uint64_t len)
{
    struct MHD_Response *resp = MHD_create_response_from_fd_at_offset64(len, fd, offset);
    if (!resp) {
        close(fd);
        return ATRIUM_E_NOMEM;
    }
    if (content_type) MHD_add_response_header(resp, "Content-Type", content_type);
    int rc = store(r, status, resp);
    if (rc == 0) r->response_file = true;
    return rc;
}

int http_respond_stream(atrium_req *r, int status, const char *content_type, int64_t size,
                        atrium_stream_read read, void *arg, void (*free_arg)(void *))
{
    /* ATRIUM_STREAM_END / _ERROR are MHD's END_OF_STREAM / END_WITH_ERROR values. */
    _Static_assert(ATRIUM_STREAM_END == (int64_t)MHD_CONTENT_READER_END_OF_STREAM, "stream end");
    _Static_assert(ATRIUM_STREAM_ERROR == (int64_t)MHD_CONTENT_READER_END_WITH_ERROR, "stream err");
    struct MHD_Response *resp = MHD_create_response_from_callback(
        size < 0 ? MHD_SIZE_UNKNOWN : (uint64_t)size, STREAM_BLOCK_BYTES,
        (MHD_ContentReaderCallback)read, arg, free_arg);
    if (!resp) {
        if (free_arg) free_arg(arg);
        return ATRIUM_E_NOMEM;
    }
    if (content_type) MHD_add_response_header(resp, "Content-Type", content_type);
    return store(r, status, resp);
}

/* A stream whose reader may wait (respond_stream_wait). Lives as long as the response;
 * r is used only from the content reader, which libmicrohttpd calls only while r's
 * request is being answered, so no reference is taken (the response may be destroyed
 * after r: the free callback never touches it). */
typedef struct wait_stream {
    atrium_req *r;
    atrium_stream_read read;
    void *arg;
    void (*free_arg)(void *);
    struct atrium_event *ev;
    int64_t deadline_ms;
} wait_stream;

#define STREAM_WAIT_RETRIES 8 /* reads in a row interrupted by a signal before giving up once */

static ssize_t wait_stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    wait_stream *w = cls;
    for (int i = 0; i < STREAM_WAIT_RETRIES; i++) {
        if (susp_stream_cut(w->r)) {
            rt_log(ATRIUM_LOG_DEBUG, "core", "[req %s] stream cut at byte %llu (deadline)",
                   w->r->id, (unsigned long long)pos);
            return MHD_CONTENT_READER_END_WITH_ERROR; /* closed before the end: truncated */
        }
        uint64_t gen = susp_event_gen(w->ev);
        int64_t n = w->read(w->arg, pos, buf, max);
        if (n > 0 || n == ATRIUM_STREAM_END) return (ssize_t)n;
        if (n != ATRIUM_STREAM_WAIT) return MHD_CONTENT_READER_END_WITH_ERROR; /* 0 too */
        if (rt_now_ms() >= w->deadline_ms) {
            rt_metric_add(w->r->srv->m_streams_cut, 1);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (susp_stream_wait(w->r, w->ev, gen, w->deadline_ms)) return 0; /* suspended */
    }
    /* Signalled again at every try (others' bytes on a shared event): let libmicrohttpd
     * call again once rather than loop here. */
    return 0;
}

static void wait_stream_free(void *cls)
{
    wait_stream *w = cls;
    if (w->free_arg) w->free_arg(w->arg);
    free(w);
}

int http_respond_stream_wait(atrium_req *r, int status, const char *content_type, int64_t size,
                             atrium_stream_read read, void *arg, void (*free_arg)(void *),
                             struct atrium_event *ev, int64_t deadline_ms)
{
    wait_stream *w = read && ev ? calloc(1, sizeof(*w)) : NULL;
    if (!w) {
        if (free_arg) free_arg(arg);
        return read && ev ? ATRIUM_E_NOMEM : ATRIUM_E_INVAL;
    }
    *w = (wait_stream){.r = r, .read = read, .arg = arg, .free_arg = free_arg, .ev = ev,
                       .deadline_ms = deadline_ms};
    struct MHD_Response *resp = MHD_create_response_from_callback(
        size < 0 ? MHD_SIZE_UNKNOWN : (uint64_t)size, STREAM_BLOCK_BYTES, wait_stream_read, w,
        wait_stream_free);
    if (!resp) {
        wait_stream_free(w);
        return ATRIUM_E_NOMEM;
    }
    if (content_type) MHD_add_response_header(resp, "Content-Type", content_type);
    return store(r, status, resp);
}

void http_count_status(http_server *s, int status)
{
    int cls = status / 100;
    if (cls >= 1 && cls <= 5) rt_metric_add(s->m_responses[cls], 1);
}
