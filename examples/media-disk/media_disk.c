/*
 * examples/media-disk/media_disk.c - a minimal media/1 plugin: uploads stored as files in
 * one folder, their metadata in one PostgreSQL table, authenticated downloads, no
 * thumbnails. The starting point for a third party's media plugin.
 *
 * It is built only from include/atrium/ (plus libc, jansson and libpq) and shows each
 * mechanism a media plugin needs, in the order a request meets them (docs/plugins.md
 * walks through it):
 *   - an upload (ATRIUM_ROUTE_STREAM_BODY | ATRIUM_ROUTE_HEADERS_FIRST) is authenticated
 *     when its headers arrive, so a stranger is refused before sending the body; the body
 *     is streamed into "<store>/.tmp-<id>" chunk by chunk (never buffered) and hashed as it
 *     goes (the host's SHA-256, ABI 1.5); a hold removes that file whatever ends the
 *     request (413, client gone, failure) unless it was committed; the commit (fsync,
 *     rename, folder fsync, row with the hash and a wall-clock created_ts) is slow disk
 *     work, so it is handed off to the plugin's "io" pool (ATRIUM_ROUTE_COMMITS: once
 *     started, only it answers) and the request thread is free meanwhile;
 *   - a download enters the "delivery" admission line first, before the token is checked
 *     (admission before authorization); the slot is a hold the core releases after the
 *     last byte, so a slow reader keeps its slot and the line bounds open files;
 *   - responses carry the headers of atrium/media.h; ETag (the media ID: content never
 *     changes), If-None-Match -> 304, one Range -> 206, a range past the end -> 416.
 * Every handler has the same shape (docs/plugins.md, "The re-run model"): it runs again
 * from the top after a park or a handoff, so it branches on req_run_reason and repeats
 * line_admit on every run; its steps return ATRIUM_CONTINUE or the outcome to return.
 * A store that cannot be written answers 503 (507 when the disk is full), as media.h says.
 * What it deliberately leaves out (optional in media/1): create + PUT, thumbnails (the
 * route answers 404), legacy paths, federation, remote media, admin endpoints.
 *
 * Built with the one line of docs/plugins.md (strict -std=c17: the POSIX names it uses,
 * O_CLOEXEC, O_DIRECTORY, dirfd, come from the feature macro below, not from the build).
 */
#define _POSIX_C_SOURCE 200809L

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "atrium/host.h"
#include "atrium/media.h"

#define PLUGIN_NAME "media_disk"
#define ID_CHARS 24                 /* letters and digits of a media ID this plugin mints */
#define ID_MAX_CHARS 255            /* longest media ID accepted in a path */
#define TYPE_MAX_BYTES 255          /* a stored Content-Type */
#define NAME_MAX_BYTES 255          /* a stored file name */
#define PATH_MAX_BYTES 1024         /* a file's path under store_path */
#define DISPOSITION_MAX_BYTES 1024  /* a Content-Disposition value */
#define RETRY_AFTER_MS 1000         /* what a 429 tells the client to wait */
#define IO_THREADS 2                /* commits (fsync, rename, row) at once */
#define IO_QUEUE 64                 /* commits waiting for an io thread */
#define DEFAULT_MAX_UPLOAD_BYTES (50LL * 1024 * 1024)
#define BODY_SLACK_BYTES 1          /* the core's cap sits just above ours: we answer 413 */

typedef struct settings {
    const char *store_path;
    int64_t max_upload_bytes;
    int delivery_slots, delivery_queue, delivery_queue_per_client;
    int64_t delivery_wait_ms;
} settings;

typedef struct plugin {
    const atrium_host *h;
    atrium_plugin *self;
    settings cfg;
    atrium_pool *io;
    atrium_line *delivery;
    atrium_metric *m_uploads, *m_downloads;
} plugin;

/* One upload, in the request's memory (req_alloc): it outlives the hold that cleans it. */
typedef struct upload {
    plugin *p;
    int fd;
    bool committed;
    int64_t size;
    atrium_sha256 sha; /* of the bytes as they arrive (host->sha256_*): kept in the row */
    char id[ID_CHARS + 1];
    char tmp_path[PATH_MAX_BYTES];
    char final_path[PATH_MAX_BYTES];
    char user[256];
    char content_type[TYPE_MAX_BYTES + 1];
    char name[NAME_MAX_BYTES + 1];
} upload;

static plugin P; /* the one instance: a plugin is loaded once */

#define FIELD(f) offsetof(settings, f)
static const atrium_setting SETTINGS[] = {
    {.key = ATRIUM_MEDIA_SETTING_STORE_PATH, .type = ATRIUM_SETTING_STRING,
     .offset = FIELD(store_path), .def_string = "./media_disk",
     .help = "Folder of the uploaded files; relative to the server's working directory."},
    {.key = ATRIUM_MEDIA_SETTING_MAX_UPLOAD, .type = ATRIUM_SETTING_INT64,
     .offset = FIELD(max_upload_bytes), .def = DEFAULT_MAX_UPLOAD_BYTES, .min = 1,
     .max = INT64_C(1) << 32, .unit = "bytes", .help = "Largest upload (then 413 M_TOO_LARGE)."},
    {.key = ATRIUM_MEDIA_SETTING_SLOTS, .type = ATRIUM_SETTING_INT,
     .offset = FIELD(delivery_slots), .def = 32, .min = 1, .max = 100000, .unit = "requests",
     .help = "Downloads in flight at once (each holds one open file)."},
    {.key = ATRIUM_MEDIA_SETTING_QUEUE, .type = ATRIUM_SETTING_INT,
     .offset = FIELD(delivery_queue), .def = 256, .min = 0, .max = 1000000, .unit = "requests",
     .help = "Downloads that may wait, parked, for a slot."},
    {.key = ATRIUM_MEDIA_SETTING_QUEUE_PER_CLIENT, .type = ATRIUM_SETTING_INT,
     .offset = FIELD(delivery_queue_per_client), .def = 64, .min = 0, .max = 1000000,
     .unit = "requests",
     .help = "Of the waiting downloads, how many from one client (0 = no cap)."},
    {.key = ATRIUM_MEDIA_SETTING_WAIT_MS, .type = ATRIUM_SETTING_INT64,
     .offset = FIELD(delivery_wait_ms), .def = 30000, .min = 1, .max = 600000, .unit = "ms",
     .help = "Longest wait for a delivery slot (then 429)."},
};

static const atrium_migration MIGRATIONS[] = {
    {1, "files",
     "CREATE TABLE media_disk_files (media_id text PRIMARY KEY, user_id text NOT NULL, "
     "content_type text NOT NULL, upload_name text NOT NULL, size_bytes bigint NOT NULL, "
     "created_ts bigint NOT NULL)"},
    /* The content's SHA-256 (lower-case hex), for a checker comparing files with rows. */
    {2, "sha256", "ALTER TABLE media_disk_files ADD COLUMN sha256 text"},
};

/* ---- small rules ---------------------------------------------------------------------- */

static bool id_valid(const char *id)
{
    size_t n = 0;
    for (; id[n]; n++)
        if (n >= ID_MAX_CHARS || !(isalnum((unsigned char)id[n]) || id[n] == '_' || id[n] == '-'))
            return false;
    return n > 0;
}

static bool text_acceptable(const char *s, size_t max)
{
    size_t n = strlen(s);
    if (n > max) return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) return false;
    return true;
}

static int new_id(char out[ID_CHARS + 1])
{
    static const char ALPHABET[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    unsigned char rnd[ID_CHARS];
    if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd)) return ATRIUM_E_IO;
    for (size_t i = 0; i < ID_CHARS; i++) out[i] = ALPHABET[rnd[i] % 62]; /* slight bias: fine */
    out[ID_CHARS] = '\0';
    return 0;
}

/* `inline` only for the types of ATRIUM_MEDIA_INLINE_TYPES (type/subtype compared without
 * parameters, ignoring case); the file name quoted when it is plain ASCII, else as RFC 8187
 * filename*. */
static void disposition(char *out, size_t cap, const char *type, const char *name)
{
    static const char *const INLINE[] = {ATRIUM_MEDIA_INLINE_TYPES, NULL};
    size_t base = strcspn(type, "; \t");
    bool is_inline = false;
    for (size_t i = 0; INLINE[i]; i++)
        if (strlen(INLINE[i]) == base && strncasecmp(type, INLINE[i], base) == 0)
            is_inline = true;
    size_t n = (size_t)snprintf(out, cap, "%s", is_inline ? "inline" : "attachment");
    if (!*name) return;
    bool plain = true;
    for (const char *c = name; *c; c++)
        if (!isalnum((unsigned char)*c) && !strchr(" ._-()", *c)) plain = false;
    if (plain) {
        snprintf(out + n, cap - n, "; filename=\"%s\"", name);
        return;
    }
    n += (size_t)snprintf(out + n, cap - n, "; filename*=utf-8''");
    for (const unsigned char *c = (const unsigned char *)name; *c && n + 4 < cap; c++)
        n += isalnum(*c) || strchr("._-", *c) ? (size_t)snprintf(out + n, cap - n, "%c", *c)
                                                : (size_t)snprintf(out + n, cap - n, "%%%02X", *c);
}

/* One byte range of `size` ("bytes=a-b", "bytes=a-", "bytes=-n"): 1 with start and len set,
 * 0 to serve it whole (absent, several ranges, malformed), -1 unsatisfiable. */
static int parse_range(const char *h, uint64_t size, uint64_t *start, uint64_t *len)
{
    unsigned long long a = 0, b = 0;
    int used = 0;
    if (!h || strncmp(h, "bytes=", 6) != 0 || strchr(h, ',')) return 0;
    h += 6;
    if (*h == '-') {
        if (sscanf(h + 1, "%llu%n", &b, &used) != 1 || h[1 + used] || b == 0) return b ? 0 : -1;
        if (b > size) b = size;
        if (size == 0) return -1;
        *start = size - b;
        *len = b;
        return 1;
    }
    if (sscanf(h, "%llu-%n", &a, &used) != 1) return 0;
    b = size ? size - 1 : 0;
    if (h[used] && (sscanf(h + used, "%llu", &b) != 1 || b < a)) return 0;
    if (a >= size) return -1;
    if (b >= size) b = size - 1;
    *start = a;
    *len = b - a + 1;
    return 1;
}

/* Storage or database unavailable: 503 (media.h), or 507 when the disk is full. */
static int unavailable(atrium_req *req, int err)
{
    if (err == ENOSPC)
        P.h->respond_error(req, 507, "M_UNKNOWN", "The server's storage is full");
    else
        P.h->respond_error(req, 503, "M_UNKNOWN", "Storage is unavailable; retry");
    return ATRIUM_DONE;
}

/* ---- upload ----------------------------------------------------------------------------- */

/* The hold: whatever ends the request, an upload that was not committed leaves nothing. */
static void upload_release(void *arg)
{
    upload *up = arg;
    if (up->fd >= 0) close(up->fd);
    up->fd = -1;
    if (!up->committed) unlink(up->tmp_path);
}

/* Headers arrived (data == NULL): who uploads what, and the file it goes to. */
static int upload_begin(atrium_req *req)
{
    const atrium_host *h = P.h;
    const char *user = h->req_authenticate(req);
    if (!user) return ATRIUM_E_INVAL; /* 401 set */
    const char *type = h->req_header(req, "Content-Type");
    if (!type || !*type) type = "application/octet-stream";
    const char *name = h->req_query(req, "filename");
    if (!text_acceptable(type, TYPE_MAX_BYTES) || !strchr(type, '/') ||
        (name && !text_acceptable(name, NAME_MAX_BYTES))) {
        h->respond_error(req, 400, "M_INVALID_PARAM", "Invalid Content-Type or filename");
        return ATRIUM_E_INVAL;
    }
    upload *up = h->req_alloc(req, sizeof(*up));
    if (!up) return ATRIUM_E_NOMEM;
    memset(up, 0, sizeof(*up));
    up->p = &P;
    up->fd = -1;
    if (new_id(up->id) < 0 || h->sha256_init(&up->sha) < 0) return ATRIUM_E_IO;
    snprintf(up->user, sizeof(up->user), "%s", user);
    snprintf(up->content_type, sizeof(up->content_type), "%s", type);
    snprintf(up->name, sizeof(up->name), "%s", name ? name : "");
    snprintf(up->tmp_path, sizeof(up->tmp_path), "%s/%s%s", P.cfg.store_path,
             ATRIUM_MEDIA_TMP_PREFIX, up->id);
    snprintf(up->final_path, sizeof(up->final_path), "%s/%s", P.cfg.store_path, up->id);
    up->fd = open(up->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
    if (up->fd < 0) {
        int err = errno;
        h->log(P.self, ATRIUM_LOG_ERROR, "cannot create %s: %s", up->tmp_path, strerror(err));
        unavailable(req, err);
        return ATRIUM_E_IO;
    }
    h->req_set_state(req, up);
    return h->req_hold(req, upload_release, up); /* on failure it already ran */
}

static int upload_chunk(atrium_req *req, const char *data, size_t len)
{
    if (!data) return upload_begin(req);
    upload *up = P.h->req_state(req);
    if (!up || up->fd < 0) return ATRIUM_E_STATE;
    if (up->size + (int64_t)len > P.cfg.max_upload_bytes) {
        P.h->respond_error(req, 413, "M_TOO_LARGE", "The upload is larger than %" PRId64 " bytes",
                           P.cfg.max_upload_bytes);
        return ATRIUM_E_LIMIT; /* the hold removes the file */
    }
    for (size_t done = 0; done < len;) {
        ssize_t n = write(up->fd, data + done, len - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            unavailable(req, n < 0 ? errno : ENOSPC); /* a write of 0: no room */
            return ATRIUM_E_IO;
        }
        done += (size_t)n;
    }
    up->size += (int64_t)len;
    return P.h->sha256_update(&up->sha, data, len);
}

/* io pool: the file durable and named, then the row, then the answer. The route has
 * ATRIUM_ROUTE_COMMITS, so once this runs it alone answers: the request's deadline cannot
 * tell the client "failed" about an upload this then records. */
static int upload_commit(atrium_req *req, upload *up)
{
    const atrium_host *h = P.h;
    if (fsync(up->fd) < 0 || rename(up->tmp_path, up->final_path) < 0) {
        int err = errno;
        h->log(P.self, ATRIUM_LOG_ERROR, "cannot store %s: %s", up->id, strerror(err));
        return unavailable(req, err);
    }
    int dir = open(P.cfg.store_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir >= 0) {
        fsync(dir);
        close(dir);
    }
    unsigned char digest[ATRIUM_SHA256_BYTES];
    char sha[ATRIUM_SHA256_HEX_BYTES];
    if (h->sha256_final(&up->sha, digest) < 0) return unavailable(req, 0);
    atrium_sha256_hex(digest, sha);
    PGconn *c = h->db_acquire(h->db_wait_ms());
    PGresult *res = NULL;
    if (c) {
        char size[24], now[24];
        snprintf(size, sizeof(size), "%" PRId64, up->size);
        snprintf(now, sizeof(now), "%" PRId64, h->wall_ms()); /* a date: not now_ms */
        const char *vals[] = {up->id, up->user, up->content_type, up->name, size, now, sha};
        res = PQexecParams(c,
                           "INSERT INTO media_disk_files (media_id, user_id, content_type, "
                           "upload_name, size_bytes, created_ts, sha256) "
                           "VALUES ($1,$2,$3,$4,$5,$6,$7)",
                           7, NULL, vals, NULL, NULL, 0);
    }
    bool ok = res && PQresultStatus(res) == PGRES_COMMAND_OK;
    if (!ok && c)
        h->log(P.self, ATRIUM_LOG_ERROR, "cannot record %s: %s", up->id, PQerrorMessage(c));
    PQclear(res);
    if (c) h->db_release(c);
    if (!ok) {
        unlink(up->final_path); /* never acknowledged: leave nothing */
        return unavailable(req, 0);
    }
    up->committed = true;
    h->metric_add(P.m_uploads, 1);
    char uri[ID_CHARS + 300];
    snprintf(uri, sizeof(uri), "mxc://%s/%s", h->server_name(), up->id);
    h->respond_json(req, 200, json_pack("{s:s}", "content_uri", uri));
    return ATRIUM_DONE;
}

/* Runs twice: FIRST on the request pool (the body is in: hand the commit off), then
 * HANDOFF on the io pool (commit and answer). The upload's state survives in req_state. */
static int upload_handler(atrium_req *req)
{
    const atrium_host *h = P.h;
    upload *up = h->req_state(req);
    if (!up) return ATRIUM_E_STATE; /* the headers-first call always sets it */
    switch (h->req_run_reason(req)) {
    case ATRIUM_RUN_FIRST: break;
    case ATRIUM_RUN_HANDOFF: return upload_commit(req, up);
    default: return ATRIUM_E_STATE; /* it never parks */
    }
    int rc = h->handoff(req, P.io, NULL, 0);
    if (rc == 0) return ATRIUM_HANDED_OFF; /* runs again on io; touch nothing now */
    if (rc == ATRIUM_E_STOPPED) return rc;  /* the core answers 503 */
    if (rc != ATRIUM_E_LIMIT) return unavailable(req, 0);
    h->respond_limited(req, RETRY_AFTER_MS, "Too many uploads are being stored; retry");
    return ATRIUM_DONE;
}

/* ---- download ------------------------------------------------------------------------- */

/* Admission before authorization: the line first, on every run (FIRST, then GRANTED or
 * DEADLINE after a park: line_admit itself tells which). ATRIUM_CONTINUE with a slot
 * held, else the handler's outcome (ATRIUM_PARKED, or ATRIUM_DONE after answering). */
static int admit(atrium_req *req)
{
    const atrium_host *h = P.h;
    int rc = h->line_admit(req, P.delivery);
    if (rc == ATRIUM_OK) return ATRIUM_CONTINUE;
    if (rc == ATRIUM_PARKED) return ATRIUM_PARKED;
    if (rc == ATRIUM_E_STOPPED) {
        h->respond_error(req, 503, "M_UNKNOWN", "The server is stopping");
        return ATRIUM_DONE;
    }
    h->respond_limited(req, RETRY_AFTER_MS, "Too many media requests; retry");
    return ATRIUM_DONE;
}

typedef struct row {
    char content_type[TYPE_MAX_BYTES + 1];
    char name[NAME_MAX_BYTES + 1];
} row;

/* The media's row: 0, ATRIUM_E_NOTFOUND, or ATRIUM_E_DB. */
static int lookup(const char *id, row *out)
{
    const atrium_host *h = P.h;
    PGconn *c = h->db_acquire(h->db_wait_ms());
    if (!c) return ATRIUM_E_DB;
    const char *vals[] = {id};
    PGresult *res = PQexecParams(c,
                                 "SELECT content_type, upload_name FROM media_disk_files "
                                 "WHERE media_id = $1",
                                 1, NULL, vals, NULL, NULL, 0);
    int rc = ATRIUM_E_DB;
    if (PQresultStatus(res) == PGRES_TUPLES_OK) {
        rc = PQntuples(res) == 1 ? 0 : ATRIUM_E_NOTFOUND;
        if (rc == 0) {
            snprintf(out->content_type, sizeof(out->content_type), "%s", PQgetvalue(res, 0, 0));
            snprintf(out->name, sizeof(out->name), "%s", PQgetvalue(res, 0, 1));
        }
    }
    PQclear(res);
    h->db_release(c);
    return rc;
}

/* After the line and the token: ATRIUM_CONTINUE with the media's row, or ATRIUM_DONE
 * after answering. */
static int locate(atrium_req *req, row *r)
{
    const atrium_host *h = P.h;
    const char *server = h->req_param(req, "serverName");
    const char *id = h->req_param(req, "mediaId");
    if (!server || strcmp(server, h->server_name()) != 0 || !id || !id_valid(id)) {
        h->respond_error(req, 404, "M_NOT_FOUND", "Not found");
        return ATRIUM_DONE;
    }
    int rc = lookup(id, r);
    if (rc == ATRIUM_E_NOTFOUND) {
        h->respond_error(req, 404, "M_NOT_FOUND", "Not found");
        return ATRIUM_DONE;
    }
    return rc < 0 ? unavailable(req, 0) : ATRIUM_CONTINUE;
}

/* Runs FIRST; after a park in the line, again from the top (GRANTED, or DEADLINE and
 * SHUTDOWN which line_admit answers): nothing before admit may have effects. */
static int download_handler(atrium_req *req)
{
    const atrium_host *h = P.h;
    int rc = admit(req);
    if (rc != ATRIUM_CONTINUE) return rc;
    if (!h->req_authenticate(req)) return ATRIUM_DONE;
    row r;
    if ((rc = locate(req, &r)) != ATRIUM_CONTINUE) return rc;
    const char *id = h->req_param(req, "mediaId");
    char path[PATH_MAX_BYTES], etag[ID_MAX_CHARS + 3], disp[DISPOSITION_MAX_BYTES];
    snprintf(path, sizeof(path), "%s/%s", P.cfg.store_path, id);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        int err = errno;
        if (fd >= 0) close(fd);
        h->log(P.self, ATRIUM_LOG_ERROR, "media %s has a row but no file %s: %s", id, path,
               strerror(err));
        return unavailable(req, 0);
    }
    snprintf(etag, sizeof(etag), "\"%s\"", id); /* content never changes under an ID */
    const char *file_name = h->req_param(req, "fileName");
    disposition(disp, sizeof(disp), r.content_type, file_name ? file_name : r.name);
    h->respond_header(req, "Content-Security-Policy", ATRIUM_MEDIA_CSP);
    h->respond_header(req, "Cross-Origin-Resource-Policy", ATRIUM_MEDIA_CORP);
    h->respond_header(req, "X-Content-Type-Options", ATRIUM_MEDIA_NOSNIFF);
    h->respond_header(req, "Cache-Control", ATRIUM_MEDIA_CACHE_OK);
    h->respond_header(req, "Content-Disposition", disp);
    h->respond_header(req, "ETag", etag);
    h->respond_header(req, "Accept-Ranges", "bytes");
    const char *inm = h->req_header(req, "If-None-Match");
    if (inm && (strstr(inm, etag) || strcmp(inm, "*") == 0)) {
        close(fd);
        h->respond_buffer(req, 304, NULL, "", 0);
        return ATRIUM_DONE;
    }
    uint64_t size = (uint64_t)st.st_size, start = 0, len = size;
    int range = parse_range(h->req_header(req, "Range"), size, &start, &len);
    char content_range[80];
    if (range < 0) {
        close(fd);
        snprintf(content_range, sizeof(content_range), "bytes */%" PRIu64, size);
        h->respond_header(req, "Content-Range", content_range);
        h->respond_error(req, 416, "M_UNKNOWN", "Range not satisfiable");
        return ATRIUM_DONE;
    }
    if (range > 0) {
        snprintf(content_range, sizeof(content_range), "bytes %" PRIu64 "-%" PRIu64 "/%" PRIu64,
                 start, start + len - 1, size);
        h->respond_header(req, "Content-Range", content_range);
    }
    h->metric_add(P.m_downloads, 1);
    h->respond_file(req, range > 0 ? 206 : 200, r.content_type, fd, start, len);
    return ATRIUM_DONE;
}

/* No thumbnails (declared: --thumbnails no): 404 for every media, after the same line
 * and token as a download, so nothing about the media leaks. */
static int thumbnail_handler(atrium_req *req)
{
    int rc = admit(req);
    if (rc != ATRIUM_CONTINUE) return rc;
    if (!P.h->req_authenticate(req)) return ATRIUM_DONE;
    P.h->respond_error(req, 404, "M_NOT_FOUND", "This server makes no thumbnails");
    return ATRIUM_DONE;
}

static int config_handler(atrium_req *req)
{
    if (!P.h->req_authenticate(req)) return ATRIUM_DONE;
    P.h->respond_json(req, 200, json_pack("{s:I}", "m.upload.size",
                                          (json_int_t)P.cfg.max_upload_bytes));
    return ATRIUM_DONE;
}

/* ---- lifecycle ---------------------------------------------------------------------- */

static int media_init(const atrium_host *h, atrium_plugin *self, const atrium_config *cfg,
                      void **state)
{
    memset(&P, 0, sizeof(P));
    P.h = h;
    P.self = self;
    int rc = h->config_load(self, cfg, &P.cfg);
    if (rc < 0) return rc;
    const atrium_route routes[] = {
        {.method = "GET", .path = ATRIUM_MEDIA_PATH_CONFIG, .handler = config_handler},
        {.method = "POST", .path = ATRIUM_MEDIA_PATH_UPLOAD, .handler = upload_handler,
         .max_body_bytes = P.cfg.max_upload_bytes + BODY_SLACK_BYTES,
         .flags = ATRIUM_ROUTE_STREAM_BODY | ATRIUM_ROUTE_HEADERS_FIRST | ATRIUM_ROUTE_COMMITS,
         .body_chunk = upload_chunk},
        {.method = "GET", .path = ATRIUM_MEDIA_PATH_DOWNLOAD, .handler = download_handler},
        {.method = "GET", .path = ATRIUM_MEDIA_PATH_DOWNLOAD_NAMED, .handler = download_handler},
        {.method = "GET", .path = ATRIUM_MEDIA_PATH_THUMBNAIL, .handler = thumbnail_handler},
    };
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++)
        if ((rc = h->route_add(self, &routes[i])) < 0) return rc;
    if ((rc = h->db_migrations(self, MIGRATIONS, sizeof(MIGRATIONS) / sizeof(MIGRATIONS[0]))) < 0)
        return rc;
    P.io = h->pool_create(self, "io", IO_THREADS, IO_QUEUE);
    P.delivery = h->line_create(self, ATRIUM_MEDIA_DELIVERY_LINE, P.cfg.delivery_slots,
                                P.cfg.delivery_queue, P.cfg.delivery_queue_per_client,
                                P.cfg.delivery_wait_ms);
    P.m_uploads = h->metric_counter(self, "atrium_" PLUGIN_NAME ATRIUM_MEDIA_METRIC_UPLOADS, NULL,
                                    "Uploads stored");
    P.m_downloads = h->metric_counter(self, "atrium_" PLUGIN_NAME ATRIUM_MEDIA_METRIC_DOWNLOADS,
                                      NULL, "Downloads served");
    if (!P.io || !P.delivery || !P.m_uploads || !P.m_downloads) return ATRIUM_E_NOMEM;
    *state = &P;
    return 0;
}

/* The folder exists, and what a crash left half-written is gone. */
static int media_start(void *state)
{
    plugin *p = state;
    if (mkdir(p->cfg.store_path, 0750) < 0 && errno != EEXIST) {
        p->h->log(p->self, ATRIUM_LOG_ERROR, "cannot create store_path %s: %s",
                  p->cfg.store_path, strerror(errno));
        return ATRIUM_E_IO;
    }
    DIR *d = opendir(p->cfg.store_path);
    if (!d) {
        p->h->log(p->self, ATRIUM_LOG_ERROR, "cannot read store_path %s: %s", p->cfg.store_path,
                  strerror(errno));
        return ATRIUM_E_IO;
    }
    int removed = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, ATRIUM_MEDIA_TMP_PREFIX, strlen(ATRIUM_MEDIA_TMP_PREFIX)) != 0)
            continue;
        if (unlinkat(dirfd(d), e->d_name, 0) == 0) removed++;
    }
    closedir(d);
    if (removed) p->h->log(p->self, ATRIUM_LOG_INFO, "removed %d unfinished uploads", removed);
    return 0;
}

ATRIUM_PLUGIN(.name = PLUGIN_NAME, .version = "1.0.0", .provides = ATRIUM_MEDIA_IFACE,
              .init = media_init, .start = media_start, .settings = SETTINGS,
              .n_settings = sizeof(SETTINGS) / sizeof(SETTINGS[0]))
