/*
 * plugins/media/fed_serve.c - this server's media for other servers:
 * GET /_matrix/federation/v1/media/download/{mediaId} and .../thumbnail/{mediaId}
 * (routes flagged ATRIUM_ROUTE_FEDERATION: served on the federation listener, after the
 * core verified the caller's X-Matrix signature).
 *
 * Decisions owned here (Matrix server-server API, "Content repository"):
 *   - the answer is multipart/mixed: a first part of Content-Type application/json
 *     holding the metadata object (empty: the spec defines no fields yet), then the file
 *     part with its Content-Type and Content-Disposition; a fresh random boundary per
 *     answer, so no file can contain it by chance or design;
 *   - the file part is streamed from its open descriptor (pread, a chunk at a time),
 *     never read whole into memory; the total length is known, so the answer carries a
 *     Content-Length;
 *   - everything else is the local download's and thumbnail's: the delivery line (keyed
 *     by the calling server's address), the media row, quarantine as 404, the thumbnail
 *     choice and render; download.c and thumbnail.c run unchanged with st->federation
 *     set, and delivery_respond_file (here) turns their file answer into the multipart
 *     one. Only local media is served: a media ID is always this server's.
 * Range requests are not honoured here (the whole file is sent): the spec defines none.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "media.h"

#define FED_BOUNDARY_RANDOM_BYTES 16
#define FED_HEAD_MAX (MP_BOUNDARY_MAX + 3 * MEDIA_NAME_MAX_BYTES + MEDIA_TYPE_MAX_BYTES + 256)

/* The body being streamed: head (boundary, metadata part, file part headers), the file,
 * then the close delimiter. */
typedef struct fed_body {
    int fd;
    uint64_t offset, len;
    char head[FED_HEAD_MAX];
    size_t head_len;
    char tail[MP_BOUNDARY_MAX + 16];
    size_t tail_len;
} fed_body;

static void fed_body_free(void *arg)
{
    fed_body *b = arg;
    if (b->fd >= 0) close(b->fd);
    free(b);
}

/* Copy the slice [pos, pos + max) of a piece that covers [start, start + n). */
static size_t copy_piece(const char *piece, uint64_t start, size_t n, uint64_t pos, char *buf,
                         size_t max)
{
    if (pos < start || pos >= start + n) return 0;
    size_t off = (size_t)(pos - start), k = n - off;
    if (k > max) k = max;
    memcpy(buf, piece + off, k);
    return k;
}

static int64_t fed_body_read(void *arg, uint64_t pos, char *buf, size_t max)
{
    fed_body *b = arg;
    uint64_t file_end = b->head_len + b->len;
    if (pos < b->head_len) return (int64_t)copy_piece(b->head, 0, b->head_len, pos, buf, max);
    if (pos < file_end) {
        uint64_t want = file_end - pos;
        if (want > max) want = max;
        ssize_t n;
        do n = pread(b->fd, buf, (size_t)want, (off_t)(b->offset + pos - b->head_len));
        while (n < 0 && errno == EINTR);
        return n > 0 ? (int64_t)n : ATRIUM_STREAM_ERROR; /* 0: the file shrank */
    }
    if (pos < file_end + b->tail_len)
        return (int64_t)copy_piece(b->tail, file_end, b->tail_len, pos, buf, max);
    return ATRIUM_STREAM_END;
}

static int new_boundary(char *out, size_t cap)
{
    static const char HEX[] = "0123456789abcdef";
    unsigned char rnd[FED_BOUNDARY_RANDOM_BYTES];
    if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd)) return -1;
    if (cap < 2 * sizeof(rnd) + 1) return -1;
    for (size_t i = 0; i < sizeof(rnd); i++) {
        out[2 * i] = HEX[rnd[i] >> 4];
        out[2 * i + 1] = HEX[rnd[i] & 15];
    }
    out[2 * sizeof(rnd)] = '\0';
    return 0;
}

int fed_respond_multipart(media *m, atrium_req *req, const char *type, const char *disposition,
                          int fd, uint64_t offset, uint64_t len)
{
    const atrium_host *h = m->h;
    fed_body *b = calloc(1, sizeof(*b));
    char boundary[2 * FED_BOUNDARY_RANDOM_BYTES + 1];
    if (!b || new_boundary(boundary, sizeof(boundary)) < 0) {
        free(b);
        close(fd);
        return ATRIUM_E_NOMEM;
    }
    b->fd = fd;
    b->offset = offset;
    b->len = len;
    int n = snprintf(b->head, sizeof(b->head),
                     "--%s\r\nContent-Type: application/json\r\n\r\n{}\r\n"
                     "--%s\r\nContent-Type: %s\r\nContent-Disposition: %s\r\n\r\n",
                     boundary, boundary, type, disposition);
    if (n < 0 || (size_t)n >= sizeof(b->head)) {
        fed_body_free(b);
        return ATRIUM_E_INVAL;
    }
    b->head_len = (size_t)n;
    b->tail_len = (size_t)snprintf(b->tail, sizeof(b->tail), "\r\n--%s--\r\n", boundary);
    char ct[64 + sizeof(boundary)];
    snprintf(ct, sizeof(ct), "multipart/mixed; boundary=%s", boundary);
    int64_t total = (int64_t)(b->head_len + len + b->tail_len);
    int rc = h->respond_stream(req, 200, ct, total, fed_body_read, b, fed_body_free);
    if (rc == 0) h->metric_add(m->m_fed_served, 1);
    return rc;
}

int delivery_respond_file(media *m, atrium_req *req, int status, const char *type,
                          const char *disposition, int fd, uint64_t offset, uint64_t len)
{
    media_req *st = m->h->req_state(req);
    if (st && st->federation) return fed_respond_multipart(m, req, type, disposition, fd, offset, len);
    return m->h->respond_file(req, status, type, fd, offset, len);
}

/* The federation routes run the client routes' handlers: delivery_begin recognises them
 * by the verified origin (req_origin) and sets st->federation. */
int fed_download_handler(atrium_req *req)
{
    return download_handler(req);
}

int fed_thumbnail_handler(atrium_req *req)
{
    return thumbnail_handler(req);
}
