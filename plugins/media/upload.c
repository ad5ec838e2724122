/*
 * plugins/media/upload.c - getting bytes in: POST /_matrix/media/v3/upload, the
 * asynchronous pair POST /_matrix/media/v1/create + PUT
 * /_matrix/media/v3/upload/{serverName}/{mediaId}.
 *
 * Decisions owned here (docs/architecture.md, "Media: the plugin's rules", Storage; the
 * Matrix client-server API, Content repository: upload, create and PUT upload):
 *   - an upload streams into a temporary file in its final folder as it arrives
 *     (ATRIUM_ROUTE_STREAM_BODY): never buffered whole in memory, hashed (SHA-256) chunk
 *     by chunk. The caller is authenticated when the headers have arrived
 *     (ATRIUM_ROUTE_HEADERS_FIRST), so a stranger's upload is answered 401 before its
 *     body is sent;
 *   - over max_upload_size: 413 M_TOO_LARGE; the temporary file is unnamed (or removed
 *     by the request's hold), so nothing partial is left, whatever the client does;
 *   - acknowledgement order: file fsynced, named, folder fsynced; then the row committed;
 *     then the answer. That slow part runs on the "io" pool (a handoff), never on a
 *     request-pool thread;
 *   - /create reserves an ID for its caller for unused_expiry_ms, at most
 *     max_pending_uploads pending per user (429 past it); the PUT must come from the same
 *     user (403), for a live reservation (404), once (409 M_CANNOT_OVERWRITE_MEDIA). The
 *     PUT's commit happens under the row's lock, so two PUTs cannot both win; it then
 *     wakes downloads parked on the ID (delivery.c).
 *   - uploads per user are a token bucket (ratelimit_upload_*, 429), and with
 *     upload_quota_bytes set, the bytes one user uploaded in upload_quota_window_ms are
 *     a quota (upload_quota_allows): an upload that would pass it is refused with 400
 *     M_RESOURCE_LIMIT_EXCEEDED before its bytes are written where Content-Length tells,
 *     and at the chunk that passes it otherwise. Uploads running at once are each judged
 *     against what was committed, so they may overshoot the quota by what they carry.
 * Image header facts (dimensions, frames) are read once here, at commit, so thumbnail
 * requests can decide quickly (thumbnail.c).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "media.h"
#include "s3.h"
#include "atrium/parse.h"

#define DEFAULT_CONTENT_TYPE "application/octet-stream"
#define ID_ALPHABET "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
#define ID_ALPHABET_LEN 62
#define ID_REJECT_FROM                                                                             \
    248 /* 4 * 62: bytes from here are redrawn, so every letter is equally likely */
#define BUSY_RETRY_AFTER_MS 1000
#define MXC_MAX (MEDIA_SERVER_NAME_MAX_CHARS + MEDIA_ID_MAX_CHARS + 8)

struct upload_state {
    store_tmp tmp;
    sha256_ctx sha;
    int64_t size;
    int64_t quota_left; /* bytes this upload may still carry under the quota; -1 = no quota */
    /* storage: s3, above the part size: sent in parts as it arrives (s3_upstream.c); tmp
     * is then the part being filled, of up to part_bytes */
    s3_upstream *stream;
    int64_t part_bytes; /* 0: not streamed (storage: local) */
    int64_t handed;     /* bytes already pushed as parts */
    int first_fd;       /* the first part, for the image probe (-1 none) */
    bool is_put;
    char media_id[MEDIA_ID_MAX_CHARS + 1];
    char final_path[MEDIA_PATH_MAX];
    char content_type[MEDIA_TYPE_MAX_BYTES + 1];
    char upload_name[MEDIA_NAME_MAX_BYTES + 1];
    char user_id[MEDIA_USER_ID_MAX_BYTES + 1];
};

/* A fresh media ID: MEDIA_ID_GENERATED_CHARS letters and digits from getrandom. */
int media_generate_id(char out[MEDIA_ID_GENERATED_CHARS + 1])
{
    size_t n = 0;
    unsigned char rnd[64];
    while (n < MEDIA_ID_GENERATED_CHARS) {
        if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd)) return ATRIUM_E_IO;
        for (size_t i = 0; i < sizeof(rnd) && n < MEDIA_ID_GENERATED_CHARS; i++)
            if (rnd[i] < ID_REJECT_FROM) out[n++] = ID_ALPHABET[rnd[i] % ID_ALPHABET_LEN];
    }
    out[n] = '\0';
    return 0;
}

static void upload_release(void *arg)
{
    upload_state *up = arg;
    store_tmp_discard(&up->tmp); /* a committed one is already closed: no-op */
    s3_upstream_drop(up->stream); /* aborted unless completed */
    up->stream = NULL;
    if (up->first_fd >= 0) close(up->first_fd);
    up->first_fd = -1;
}

static int busy(media *m, atrium_req *req)
{
    m->h->respond_error(req, 503, "M_UNKNOWN", "The database is busy or unreachable; retry");
    return ATRIUM_DONE;
}

/* The rule for a PUT into a reservation, applied to its row. */
static int check_reservation(media *m, atrium_req *req, const media_row *row, const char *user)
{
    const atrium_host *h = m->h;
    if (strcmp(row->user_id, user) != 0) {
        h->respond_error(req, 403, "M_FORBIDDEN", "This media ID was created by another user");
        return ATRIUM_DONE;
    }
    if (row->uploaded) {
        h->respond_error(req, 409, "M_CANNOT_OVERWRITE_MEDIA",
                         "Content was already uploaded for this media ID");
        return ATRIUM_DONE;
    }
    if (row->expires_ts > 0 && row->expires_ts <= media_wall_ms()) {
        h->respond_error(req, 404, "M_NOT_FOUND", "This media ID expired; create a new one");
        return ATRIUM_DONE;
    }
    return MEDIA_GO;
}

/* The PUT's target, checked before its body is written. */
static int check_put_target(media *m, atrium_req *req, upload_state *up)
{
    const atrium_host *h = m->h;
    const char *server = h->req_param(req, "serverName");
    const char *id = h->req_param(req, "mediaId");
    if (!server || !media_server_name_valid(server) || !id || !media_id_valid(id)) {
        h->respond_error(req, 400, "M_INVALID_PARAM", "Invalid server name or media ID");
        return ATRIUM_DONE;
    }
    if (strcmp(server, m->server_name) != 0) {
        h->respond_error(req, 404, "M_NOT_FOUND", "Media IDs of %s cannot be uploaded here",
                         server);
        return ATRIUM_DONE;
    }
    snprintf(up->media_id, sizeof(up->media_id), "%s", id);
    PGconn *c = h->db_acquire(MEDIA_DB_WAIT_MS);
    if (!c) return busy(m, req);
    media_row row;
    int rc = media_db_get(h, m->self, c, id, &row);
    h->db_release(c);
    if (rc == ATRIUM_E_DB) return busy(m, req);
    if (rc == MEDIA_DB_NOTFOUND) {
        h->respond_error(req, 404, "M_NOT_FOUND",
                         "Unknown media ID: create one with /_matrix/media/v1/create");
        return ATRIUM_DONE;
    }
    return check_reservation(m, req, &row, up->user_id);
}

/* The authenticated user, within the upload rate limit; NULL after answering (401, 429). */
static const char *uploader(media *m, atrium_req *req)
{
    const char *user = media_authenticate(m, req);
    if (!user) return NULL;
    int64_t wait = m->h->ratelimit_check(req, m->rl_upload);
    if (wait <= 0) return user;
    m->h->respond_limited(req, wait, "Too many uploads");
    return NULL;
}

static int quota_refused(media *m, atrium_req *req)
{
    m->h->respond_error(req, 400, "M_RESOURCE_LIMIT_EXCEEDED",
                        "Upload quota exceeded: at most %lld bytes per %lld s",
                        (long long)m->cfg.upload_quota_bytes,
                        (long long)(m->cfg.upload_quota_window_ms / 1000));
    return ATRIUM_DONE;
}

/* The quota rule: how many bytes `user` may still upload now, into *left (-1 when there is
 * no quota); MEDIA_GO, or ATRIUM_DONE after answering (quota used up, database busy). */
static int upload_quota_allows(media *m, atrium_req *req, const char *user, int64_t *left)
{
    *left = -1;
    if (m->cfg.upload_quota_bytes <= 0) return MEDIA_GO;
    const atrium_host *h = m->h;
    PGconn *c = h->db_acquire(MEDIA_DB_WAIT_MS);
    if (!c) return busy(m, req);
    int64_t used = 0;
    int rc = media_db_uploaded_since(h, m->self, c, user,
                                     media_wall_ms() - m->cfg.upload_quota_window_ms, &used);
    h->db_release(c);
    if (rc != MEDIA_DB_OK) return busy(m, req);
    *left = m->cfg.upload_quota_bytes - used;
    const char *cl = h->req_header(req, "Content-Length");
    int64_t announced = 0; /* past int64 reads as the largest: refused */
    if (cl && atrium_parse_int64(cl, 0, INT64_MAX, &announced) == ATRIUM_E_INVAL) announced = 0;
    if (*left <= 0 || announced > *left) return quota_refused(m, req);
    return MEDIA_GO;
}

/* First chunk (or an empty body): who is uploading what, and where it goes. */
static int upload_begin(media *m, atrium_req *req, media_req *st, bool is_put)
{
    const atrium_host *h = m->h;
    const char *user = uploader(m, req);
    if (!user) return ATRIUM_DONE;
    const char *type = h->req_header(req, "Content-Type");
    if (!type || !*type) type = DEFAULT_CONTENT_TYPE;
    if (!media_type_acceptable(type)) {
        h->respond_error(req, 400, "M_INVALID_PARAM", "Invalid Content-Type");
        return ATRIUM_DONE;
    }
    const char *name = h->req_query(req, "filename");
    if (name && !media_name_acceptable(name)) {
        h->respond_error(req, 400, "M_INVALID_PARAM",
                         "filename must be UTF-8 without control characters, at most %d bytes",
                         MEDIA_NAME_MAX_BYTES);
        return ATRIUM_DONE;
    }
    upload_state *up = h->req_alloc(req, sizeof(*up));
    if (!up) return ATRIUM_E_NOMEM;
    memset(up, 0, sizeof(*up));
    up->tmp.fd = -1;
    up->first_fd = -1;
    up->is_put = is_put;
    if (s3_enabled(m)) { /* parts of at least the setting, at most S3_PARTS_MAX of them */
        int64_t floor = (m->cfg.max_upload_bytes + S3_STREAM_PARTS_MAX - 1) / S3_STREAM_PARTS_MAX;
        up->part_bytes = m->cfg.s3_part_size_bytes > floor ? m->cfg.s3_part_size_bytes : floor;
    }
    snprintf(up->user_id, sizeof(up->user_id), "%s", user);
    snprintf(up->content_type, sizeof(up->content_type), "%s", type);
    snprintf(up->upload_name, sizeof(up->upload_name), "%s", name ? name : "");
    int rc = upload_quota_allows(m, req, user, &up->quota_left);
    if (rc != MEDIA_GO) return rc;
    rc = is_put ? check_put_target(m, req, up)
                    : (media_generate_id(up->media_id) < 0 ? ATRIUM_E_IO : MEDIA_GO);
    if (rc != MEDIA_GO) return rc;
    if (store_original_path(m, up->media_id, up->final_path, sizeof(up->final_path)) < 0)
        return ATRIUM_E_INVAL;
    if (store_tmp_open(m, up->final_path, &up->tmp) < 0) { /* media/1: unavailable = 503 */
        h->respond_error(req, 503, "M_UNKNOWN", "The server could not store the upload; retry");
        return ATRIUM_DONE;
    }
    sha256_init(&up->sha);
    st->up = up;
    if (h->req_hold(req, upload_release, up) < 0) return ATRIUM_E_EXPIRED;
    return MEDIA_GO;
}

/* storage: s3, the part being filled is full and more comes: push it to the store (the
 * upload's multipart upload begins with the first) and begin the next. 0, -EPIPE (the
 * store failed), or a negative errno. */
static int hand_over(media *m, upload_state *up)
{
    if (!up->stream) {
        if (!(up->stream = s3_upstream_start(m, up->media_id))) return -ENOMEM;
        up->first_fd = dup(up->tmp.fd); /* the image probe reads the first part at commit */
    }
    if (up->tmp.named[0]) unlink(up->tmp.named); /* the descriptor keeps the bytes */
    up->tmp.named[0] = '\0';
    int fd = up->tmp.fd;
    up->tmp.fd = -1;
    if (s3_upstream_push(up->stream, fd, up->size - up->handed) < 0) return -EPIPE;
    up->handed = up->size;
    return store_tmp_open(m, up->final_path, &up->tmp);
}

/* The body's bytes, hashed, into the temp file (streamed: into parts of part_bytes). */
static int write_body(media *m, upload_state *up, const char *data, size_t len)
{
    while (len > 0) {
        size_t n = len;
        if (up->part_bytes > 0) {
            if (up->size - up->handed == up->part_bytes) {
                int rc = hand_over(m, up);
                if (rc < 0) return rc;
            }
            int64_t room = up->part_bytes - (up->size - up->handed);
            if ((int64_t)n > room) n = (size_t)room;
        }
        int rc = store_write_all(up->tmp.fd, data, n);
        if (rc < 0) return rc;
        sha256_update(&up->sha, data, n);
        up->size += (int64_t)n;
        data += n;
        len -= n;
    }
    return 0;
}

static int body_chunk(atrium_req *req, const char *data, size_t len, bool is_put)
{
    media *m = media_of(req);
    const atrium_host *h = m->h;
    media_req *st = media_req_state(m, req);
    if (!st) return ATRIUM_E_NOMEM;
    if (!st->up) { /* the headers-first call (ATRIUM_ROUTE_HEADERS_FIRST), before any byte */
        int rc = upload_begin(m, req, st, is_put);
        if (rc != MEDIA_GO) return rc < 0 ? rc : ATRIUM_E_INVAL;
    }
    if (!data) return 0;
    upload_state *up = st->up;
    if (up->tmp.fd < 0) return ATRIUM_E_STATE;
    if (up->size + (int64_t)len > m->cfg.max_upload_bytes) {
        store_tmp_discard(&up->tmp);
        h->respond_error(req, 413, "M_TOO_LARGE", "The upload is larger than %lld bytes",
                         (long long)m->cfg.max_upload_bytes);
        return ATRIUM_E_LIMIT;
    }
    if (up->quota_left >= 0 && up->size + (int64_t)len > up->quota_left) {
        store_tmp_discard(&up->tmp);
        quota_refused(m, req);
        return ATRIUM_E_LIMIT;
    }
    int rc = write_body(m, up, data, len);
    if (rc == -EPIPE) {
        store_tmp_discard(&up->tmp);
        h->respond_error(req, 503, "M_UNKNOWN", "The media store is unreachable; retry later");
        return ATRIUM_E_IO;
    }
    if (rc < 0) {
        h->log(m->self, ATRIUM_LOG_ERROR, "cannot write upload %s: %s", up->media_id,
               strerror(-rc));
        store_tmp_discard(&up->tmp);
        h->respond_error(req, rc == -ENOSPC ? 507 : 503, "M_UNKNOWN",
                         "The server could not store the upload");
        return ATRIUM_E_IO;
    }
    return 0;
}

int upload_body_chunk(atrium_req *req, const char *data, size_t len)
{
    return body_chunk(req, data, len, false);
}

int upload_put_body_chunk(atrium_req *req, const char *data, size_t len)
{
    return body_chunk(req, data, len, true);
}

/* The row the upload becomes, with the facts read from the committed file (streamed:
 * from its first part). */
static void fill_row(const upload_state *up, const char *sha, media_row *row)
{
    char probe[64];
    const char *path = up->final_path;
    if (up->first_fd >= 0) {
        snprintf(probe, sizeof(probe), "/proc/self/fd/%d", up->first_fd);
        path = probe;
    }
    memset(row, 0, sizeof(*row));
    snprintf(row->media_id, sizeof(row->media_id), "%s", up->media_id);
    snprintf(row->user_id, sizeof(row->user_id), "%s", up->user_id);
    snprintf(row->content_type, sizeof(row->content_type), "%s", up->content_type);
    snprintf(row->upload_name, sizeof(row->upload_name), "%s", up->upload_name);
    snprintf(row->sha256, sizeof(row->sha256), "%s", sha);
    row->created_ts = row->uploaded_ts = media_wall_ms();
    row->size_bytes = up->size;
    if (render_probe(path, &row->width, &row->height, &row->frames) != RENDER_OK)
        row->width = row->height = row->frames = 0;
}

static int store_failed(media *m, atrium_req *req)
{
    m->h->respond_error(req, 503, "M_UNKNOWN", "The server could not store the upload; retry");
    return ATRIUM_DONE;
}

/* io pool, storage: s3: the committed local file becomes its object (the local file stays,
 * as the first entry of the cache). 0, or -1 with the local file removed. */
static int put_object(media *m, const upload_state *up)
{
    char key[MEDIA_ID_MAX_CHARS + 16];
    if (s3_original_key(up->media_id, key, sizeof(key)) == 0 &&
        s3_put_file(m, key, up->final_path, up->size) == 0) {
        s3_cache_added(m, up->size); /* from now on it may be evicted (s3_cache.c) */
        return 0;
    }
    unlink(up->final_path); /* never acknowledged: leave nothing behind */
    return -1;
}

static int store_unreachable(media *m, atrium_req *req)
{
    m->h->respond_error(req, 503, "M_UNKNOWN", "The media store is unreachable; retry later");
    return ATRIUM_DONE;
}

/* io pool: the upload's bytes become the original, and row is filled: the local file
 * named (with storage: s3, then PUT), or, streamed, the last part sent and the multipart
 * upload completed (nothing stays local). MEDIA_GO, or the answer's outcome. */
static int land_original(media *m, atrium_req *req, upload_state *up, const char *sha,
                         media_row *row, bool replace)
{
    if (up->stream) {
        if (up->tmp.named[0]) unlink(up->tmp.named);
        up->tmp.named[0] = '\0';
        int fd = up->tmp.fd;
        up->tmp.fd = -1;
        fill_row(up, sha, row);
        if (s3_upstream_push(up->stream, fd, up->size - up->handed) < 0 ||
            s3_upstream_finish(up->stream) < 0)
            return store_unreachable(m, req);
        return MEDIA_GO;
    }
    if (store_tmp_commit(m, &up->tmp, up->final_path, replace) < 0) return store_failed(m, req);
    fill_row(up, sha, row); /* reads the file: before the PUT, after which it may be evicted */
    if (s3_enabled(m) && put_object(m, up) < 0) return store_unreachable(m, req);
    return MEDIA_GO;
}

/* The row could not be committed: what the upload left goes (never acknowledged). */
static void unland_original(media *m, upload_state *up)
{
    if (!up->stream) {
        unlink(up->final_path);
        return;
    }
    char key[S3_KEY_MAX];
    if (s3_original_key(up->media_id, key, sizeof(key)) == 0) s3_delete_object(m, key);
}

/* io pool: POST upload. File durable (in the bucket too, with storage: s3), then the row,
 * then the answer. */
static int commit_new(media *m, atrium_req *req, upload_state *up, const char *sha)
{
    const atrium_host *h = m->h;
    media_row row;
    int landed = land_original(m, req, up, sha, &row, false);
    if (landed != MEDIA_GO) return landed;
    PGconn *c = h->db_acquire(MEDIA_DB_WAIT_MS);
    int rc = c ? media_db_insert(h, m->self, c, &row) : ATRIUM_E_DB;
    if (c) h->db_release(c);
    if (rc != MEDIA_DB_OK) {
        unland_original(m, up); /* never acknowledged: leave nothing behind */
        return busy(m, req);
    }
    char mxc[MXC_MAX];
    snprintf(mxc, sizeof(mxc), "mxc://%s/%s", m->server_name, up->media_id);
    return media_reply(m, req, json_pack("{s:s}", "content_uri", mxc));
}

/* io pool: PUT upload, under the reservation's row lock. */
static int commit_put(media *m, atrium_req *req, upload_state *up, const char *sha)
{
    const atrium_host *h = m->h;
    PGconn *c = h->db_acquire(MEDIA_DB_WAIT_MS);
    if (!c) return busy(m, req);
    media_row row;
    int rc = media_db_exec(h, m->self, c, "BEGIN");
    if (rc == MEDIA_DB_OK) rc = media_db_lock_pending(h, m->self, c, up->media_id, &row);
    int outcome = MEDIA_GO;
    if (rc == MEDIA_DB_NOTFOUND) {
        h->respond_error(req, 404, "M_NOT_FOUND", "Unknown media ID");
        outcome = ATRIUM_DONE;
    } else if (rc != MEDIA_DB_OK) {
        outcome = busy(m, req);
    } else {
        outcome = check_reservation(m, req, &row, up->user_id);
    }
    if (outcome == MEDIA_GO) outcome = land_original(m, req, up, sha, &row, true);
    if (outcome == MEDIA_GO) {
        rc = media_db_complete(h, m->self, c, &row);
        if (rc == MEDIA_DB_OK) rc = media_db_exec(h, m->self, c, "COMMIT");
        if (rc != MEDIA_DB_OK) {
            if (up->stream) unland_original(m, up); /* never acknowledged */
            outcome = busy(m, req);
        }
    }
    if (outcome != MEDIA_GO) media_db_exec(h, m->self, c, "ROLLBACK");
    h->db_release(c);
    if (outcome != MEDIA_GO) return outcome;
    delivery_upload_landed(m, up->media_id);
    cluster_publish(m, MEDIA_CH_UPLOAD, up->media_id); /* downloads waiting in other processes */
    return media_reply(m, req, json_object());
}

static int handle(atrium_req *req, bool is_put)
{
    media *m = media_of(req);
    const atrium_host *h = m->h;
    media_req *st = media_req_state(m, req);
    if (!st) return ATRIUM_DONE;
    int reason = h->req_run_reason(req);
    if (reason == ATRIUM_RUN_HANDOFF) {
        upload_state *up = st->up;
        char sha[SHA256_HEX_CHARS + 1];
        sha256_final_hex(&up->sha, sha);
        int rc = up->is_put ? commit_put(m, req, up, sha) : commit_new(m, req, up, sha);
        if (rc == ATRIUM_DONE && !up->is_put) h->metric_add(m->m_uploads, 1);
        if (rc == ATRIUM_DONE) h->metric_add(m->m_upload_bytes, up->size);
        return rc;
    }
    if (reason == ATRIUM_RUN_SHUTDOWN) {
        h->respond_error(req, 503, "M_UNKNOWN", "The server is stopping");
        return ATRIUM_DONE;
    }
    if (!st->up) { /* an empty body: no chunk ever came */
        int rc = upload_begin(m, req, st, is_put);
        if (rc != MEDIA_GO) return rc;
    }
    int rc = h->handoff(req, m->io_pool, NULL, 0);
    if (rc == 0) return ATRIUM_HANDED_OFF;
    if (rc == ATRIUM_E_LIMIT) {
        h->respond_limited(req, BUSY_RETRY_AFTER_MS, "Too many uploads are being stored; retry");
        return ATRIUM_DONE;
    }
    h->respond_error(req, 503, "M_UNKNOWN", "The server is stopping");
    return ATRIUM_DONE;
}

int upload_handler(atrium_req *req)
{
    return handle(req, false);
}

int upload_put_handler(atrium_req *req)
{
    return handle(req, true);
}

int create_handler(atrium_req *req)
{
    media *m = media_of(req);
    const atrium_host *h = m->h;
    const char *user = uploader(m, req);
    if (!user) return ATRIUM_DONE;
    char id[MEDIA_ID_GENERATED_CHARS + 1];
    if (media_generate_id(id) < 0) return ATRIUM_E_IO;
    int64_t now = media_wall_ms(), expires = now + m->cfg.unused_expiry_ms;
    PGconn *c = h->db_acquire(MEDIA_DB_WAIT_MS);
    if (!c) return busy(m, req);
    int rc = media_db_create(h, m->self, c, id, user, now, expires, m->cfg.max_pending_uploads);
    h->db_release(c);
    if (rc == ATRIUM_E_LIMIT) {
        h->respond_limited(req, BUSY_RETRY_AFTER_MS,
                           "Too many media IDs are waiting for their upload; upload or let "
                           "them expire first");
        return ATRIUM_DONE;
    }
    if (rc != MEDIA_DB_OK) return busy(m, req);
    char mxc[MXC_MAX];
    snprintf(mxc, sizeof(mxc), "mxc://%s/%s", m->server_name, id);
    return media_reply(
        m, req,
        json_pack("{s:s, s:I}", "content_uri", mxc, "unused_expires_at", (json_int_t)expires));
}
