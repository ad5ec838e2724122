/*
 * plugins/media/download.c - serving an original: GET/HEAD
 * /_matrix/client/v1/media/download/{serverName}/{mediaId}[/{fileName}] and, behind
 * plugins.media.legacy_media, the unauthenticated /_matrix/media/v3/download paths.
 *
 * After delivery.c admitted, authorized and located the media, this file decides the
 * answer: 304 when If-None-Match names the content hash (only now, after authorization,
 * so a 304 never confirms media to someone not allowed to see it), 206 for one satisfiable
 * byte range (If-Range must name the same hash), 416 for a range past the end, else 200.
 * The bytes go out with sendfile (host->respond_file); the delivery slot stays held until
 * the last one is sent. A plain GET of a remote original still being fetched is answered
 * at once with its bytes as they arrive (chunked, no ETag yet: remote_stream.c).
 * Content-Type is the type declared at upload; Content-Disposition follows headers.c (the
 * path's fileName wins over the upload's name).
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "media.h"
#include "s3.h"

#define DEFAULT_CONTENT_TYPE "application/octet-stream"
#define DISPOSITION_MAX_BYTES (3 * MEDIA_NAME_MAX_BYTES + 64)
#define READ_THROUGH_RETRY_MS 1000

/* The strong ETag of an original: its SHA-256, quoted. */
static void original_etag(const media_row *row, char *out, size_t cap)
{
    snprintf(out, cap, "\"%s\"", row->sha256);
}

/* Should a Range header be honoured? Not when If-Range names another representation
 * (a date never matches: originals carry no Last-Modified). */
static bool if_range_allows(const char *if_range, const char *etag)
{
    if (!if_range) return true;
    while (*if_range == ' ') if_range++;
    size_t n = strlen(if_range);
    while (n && if_range[n - 1] == ' ') n--;
    return n == strlen(etag) && memcmp(if_range, etag, n) == 0;
}

/* The type and Content-Disposition of an original (the path's fileName wins). */
static const char *answer_type(const media_row *row, const char *file_name, char *disposition,
                               size_t cap)
{
    const char *type = row->content_type[0] ? row->content_type : DEFAULT_CONTENT_TYPE;
    const char *name = file_name ? file_name : row->upload_name;
    if (media_content_disposition(disposition, cap, media_type_inline(type), name) < 0)
        media_content_disposition(disposition, cap, false, NULL);
    return type;
}

/* A remote original still being fetched: its bytes as they arrive (remote_stream.c). */
static int serve_streaming(media *m, atrium_req *req, media_req *st, const char *file_name)
{
    char disposition[DISPOSITION_MAX_BYTES];
    const char *type = answer_type(&st->row, file_name, disposition, sizeof(disposition));
    int rc = remote_respond_stream(m, req, st, type, disposition);
    if (rc < 0) return rc;
    m->h->metric_add(m->m_downloads, 1);
    return ATRIUM_DONE;
}

/* storage: s3 - an original not in the local folder: the request is handed off to a store
 * pool worker (no request-pool thread waits for the store), which fetches the object into
 * the local folder (durably, under a temp name until complete, so no reader ever sees it
 * torn); the handler then goes on there and serves the file as any other. Returns
 * MEDIA_GO, or what the handler returns. */
int download_read_through(media *m, atrium_req *req, const media_row *row, const char *path)
{
    const atrium_host *h = m->h;
    if (!s3_enabled(m) || row->file_name[0]) return MEDIA_GO; /* remote copies stay local */
    if (h->req_run_reason(req) != ATRIUM_RUN_HANDOFF) {
        if (s3_original_cached(m, path)) return MEDIA_GO;
        int rc = h->handoff(req, m->store_pool, NULL, 0);
        if (rc == 0) return ATRIUM_HANDED_OFF;
        if (rc == ATRIUM_E_LIMIT) {
            h->respond_limited(req, READ_THROUGH_RETRY_MS,
                               "Too many downloads are waiting for the media store; retry");
            return ATRIUM_DONE;
        }
        h->respond_error(req, 503, "M_UNKNOWN", "The server is stopping");
        return ATRIUM_DONE;
    }
    int rc = s3_fetch_original(m, row->media_id, path);
    if (rc == S3_OK) return MEDIA_GO;
    if (rc == S3_NOT_FOUND)
        h->respond_error(req, 404, "M_NOT_FOUND", "Media not found");
    else
        h->respond_error(req, 503, "M_UNKNOWN", "The media store is unreachable; retry later");
    return ATRIUM_DONE;
}

/* The answer's range: 200 (the whole of size), 206 with *start, *len and content_range,
 * or 416 (answered, with Content-Range). */
static int choose_range(media *m, atrium_req *req, const media_req *st, const char *etag,
                        uint64_t size, uint64_t *start, uint64_t *len, char *content_range,
                        size_t cap)
{
    const atrium_host *h = m->h;
    *start = 0;
    *len = size;
    const char *range = h->req_header(req, "Range");
    if (range && !if_range_allows(h->req_header(req, "If-Range"), etag)) range = NULL;
    if (st->federation) range = NULL; /* the federation answer is always the whole file */
    int ranged = media_parse_range(range, size, start, len);
    if (ranged == MEDIA_RANGE_UNSATISFIABLE) {
        h->respond_error(req, 416, "M_UNKNOWN", "The requested range is not satisfiable");
        snprintf(content_range, cap, "bytes */%" PRIu64, size);
        h->respond_header(req, "Content-Range", content_range);
        return 416;
    }
    if (ranged != MEDIA_RANGE_OK) return 200;
    snprintf(content_range, cap, "bytes %" PRIu64 "-%" PRIu64 "/%" PRIu64, *start,
             *start + *len - 1, size);
    return 206;
}

/* The headers of a 200 or 206 of an original, after its body was set. */
static void original_headers(media *m, atrium_req *req, const media_req *st, int status,
                             const char *etag, const char *disposition, const char *content_range)
{
    const atrium_host *h = m->h;
    delivery_success_headers(m, req, etag);
    if (st->federation) return;
    h->respond_header(req, "Content-Disposition", disposition);
    h->respond_header(req, "Accept-Ranges", "bytes");
    if (status == 206) h->respond_header(req, "Content-Range", content_range);
    h->metric_add(m->m_downloads, 1);
}

/* storage: s3: may a GET whose original is not in the local folder stream from the store
 * (s3_stream.c)? Not for the federation (a multipart answer) nor HEAD, nor remote copies,
 * nor a host without respond_stream_wait: those read through whole
 * (download_read_through). */
static bool miss_may_stream(media *m, atrium_req *req, const media_req *st)
{
    if (!s3_enabled(m) || !m->can_stream || st->row.file_name[0] || st->federation) return false;
    if (strcmp(m->h->req_method(req), "GET") != 0) return false;
    return m->h->req_run_reason(req) != ATRIUM_RUN_HANDOFF;
}

/* A miss streamed (or a run after waiting for its fetch): the bytes as they arrive from
 * the store, with the row's size, ETag and the headers of a local file. */
static int serve_miss(media *m, atrium_req *req, media_req *st, const char *file_name,
                      const char *etag, const char *path)
{
    uint64_t size = (uint64_t)st->row.size_bytes, start = 0, len = size;
    char content_range[96];
    int status = choose_range(m, req, st, etag, size, &start, &len, content_range,
                              sizeof(content_range));
    if (status == 416) return ATRIUM_DONE;
    int rc = s3_stream_miss(m, req, st, path, status == 206, start, len);
    if (rc != MEDIA_GO) return rc;
    char disposition[DISPOSITION_MAX_BYTES];
    const char *type = answer_type(&st->row, file_name, disposition, sizeof(disposition));
    rc = s3_stream_respond(m, req, st, status, type);
    if (rc < 0) return rc;
    original_headers(m, req, st, status, etag, disposition, content_range);
    return ATRIUM_DONE;
}

static int serve(media *m, atrium_req *req, bool legacy)
{
    const atrium_host *h = m->h;
    media_req *st = NULL;
    int rc = delivery_begin(m, req, legacy, &st);
    if (rc != MEDIA_GO) return rc;
    const char *file_name = h->req_param(req, "fileName");
    if (file_name && !media_name_acceptable(file_name)) {
        h->respond_error(req, 400, "M_INVALID_PARAM", "Invalid file name");
        return ATRIUM_DONE;
    }
    /* A plain GET of the whole file may follow a remote original while it is fetched. */
    st->stream_ok = !st->federation && strcmp(h->req_method(req), "GET") == 0 &&
                    !h->req_header(req, "Range");
    rc = delivery_locate(m, req, st, legacy);
    if (rc != MEDIA_GO) return rc;
    const media_row *row = &st->row;
    if (st->landing) return serve_streaming(m, req, st, file_name);

    char etag[SHA256_HEX_CHARS + 3];
    original_etag(row, etag, sizeof(etag));
    if (media_etag_matches(h->req_header(req, "If-None-Match"), etag))
        return delivery_not_modified(m, req, etag);

    char path[MEDIA_PATH_MAX];
    if (store_row_path(m, row, path, sizeof(path)) < 0) return ATRIUM_E_INVAL;
    if (st->s3l || st->s3w) return serve_miss(m, req, st, file_name, etag, path);
    if (miss_may_stream(m, req, st)) {
        if (!s3_original_cached(m, path)) return serve_miss(m, req, st, file_name, etag, path);
    } else {
        rc = download_read_through(m, req, row, path);
        if (rc != MEDIA_GO) return rc;
    }
    uint64_t size = 0;
    int fd = delivery_open(m, req, path, &size);
    if (fd < 0) return ATRIUM_DONE;
    if ((int64_t)size != row->size_bytes)
        h->log(m->self, ATRIUM_LOG_ERROR,
               "media %s: file is %" PRIu64 " bytes, its row says %" PRId64
               ": run atrium-media-verify",
               row->media_id, size, row->size_bytes);

    uint64_t start = 0, len = size;
    char content_range[96];
    int status = choose_range(m, req, st, etag, size, &start, &len, content_range,
                              sizeof(content_range));
    if (status == 416) {
        close(fd);
        return ATRIUM_DONE;
    }
    char disposition[DISPOSITION_MAX_BYTES];
    const char *type = answer_type(row, file_name, disposition, sizeof(disposition));
    rc = delivery_respond_file(m, req, status, type, disposition, fd, start, len);
    if (rc < 0) return rc;
    original_headers(m, req, st, status, etag, disposition, content_range);
    return ATRIUM_DONE;
}

int download_handler(atrium_req *req)
{
    return serve(media_of(req), req, false);
}

int download_legacy_handler(atrium_req *req)
{
    return serve(media_of(req), req, true);
}
