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
    rc = download_read_through(m, req, row, path);
    if (rc != MEDIA_GO) return rc;
    uint64_t size = 0;
    int fd = delivery_open(m, req, path, &size);
    if (fd < 0) return ATRIUM_DONE;
    if ((int64_t)size != row->size_bytes)
        h->log(m->self, ATRIUM_LOG_ERROR,
               "media %s: file is %" PRIu64 " bytes, its row says %" PRId64
               ": run atrium-media-verify",
               row->media_id, size, row->size_bytes);

    uint64_t start = 0, len = size;
    const char *range = h->req_header(req, "Range");
    if (range && !if_range_allows(h->req_header(req, "If-Range"), etag)) range = NULL;
    if (st->federation) range = NULL; /* the federation answer is always the whole file */
    int ranged = media_parse_range(range, size, &start, &len);
    char content_range[96];
    if (ranged == MEDIA_RANGE_UNSATISFIABLE) {
        close(fd);
        h->respond_error(req, 416, "M_UNKNOWN", "The requested range is not satisfiable");
        snprintf(content_range, sizeof(content_range), "bytes */%" PRIu64, size);
        h->respond_header(req, "Content-Range", content_range);
        return ATRIUM_DONE;
    }
    char disposition[DISPOSITION_MAX_BYTES];
    const char *type = answer_type(row, file_name, disposition, sizeof(disposition));
    int status = 200;
    if (ranged == MEDIA_RANGE_OK) {
        status = 206;
        snprintf(content_range, sizeof(content_range), "bytes %" PRIu64 "-%" PRIu64 "/%" PRIu64,
                 start, start + len - 1, size);
    }
    rc = delivery_respond_file(m, req, status, type, disposition, fd, start, len);
    if (rc < 0) return rc;
    delivery_success_headers(m, req, etag);
    if (st->federation) return ATRIUM_DONE;
    h->respond_header(req, "Content-Disposition", disposition);
    h->respond_header(req, "Accept-Ranges", "bytes");
    if (status == 206) h->respond_header(req, "Content-Range", content_range);
    h->metric_add(m->m_downloads, 1);
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
