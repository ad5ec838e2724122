/*
 * plugins/media/admin.c - the server admin's media API, shaped like Synapse's so existing
 * tools work:
 *   GET    /_synapse/admin/v1/media/{serverName}/{mediaId}              media info
 *   DELETE /_synapse/admin/v1/media/{serverName}/{mediaId}              delete media
 *   POST   /_synapse/admin/v1/media/quarantine/{serverName}/{mediaId}   quarantine by ID
 *   POST   /_synapse/admin/v1/media/unquarantine/{serverName}/{mediaId}
 *   GET    /_synapse/admin/v1/users/{userId}/media                      a user's media
 * and two of Atrium's own:
 *   POST   /_atrium/admin/v1/media/quarantine_hash/{sha256}             quarantine by content
 *   POST   /_atrium/admin/v1/media/unquarantine_hash/{sha256}
 *   POST   /_atrium/admin/v1/media/verify                               check every original
 * and the remote cache's purge (cache.c), as Synapse's:
 *   POST   /_synapse/admin/v1/purge_media_cache?before_ts=<ms>         {"deleted": n}
 *
 * Quarantine also takes another server's media (the cached copy's row in media_remote).
 * Every route requires an access token of a server admin (403 M_FORBIDDEN otherwise).
 * Quarantine takes effect at once for new requests: delivery.c reads the row (with the
 * hash list) for every request it serves. Deleting removes the row first, then the file,
 * then the thumbnails when no other media shares the content.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "media.h"
#include "s3.h"
#include "atrium/parse.h"

#define ADMIN_LIST_DEFAULT 100
#define ADMIN_LIST_MAX 1000

/* The caller must be a server admin: its user ID, or NULL with the response set. */
static const char *require_admin(media *m, atrium_req *req)
{
    const atrium_host *h = m->h;
    const char *user = media_authenticate(m, req);
    if (!user) return NULL;
    int admin = h->req_is_admin(req);
    if (admin < 0) {
        h->respond_error(req, 503, "M_UNKNOWN", "The database is busy or unreachable; retry");
        return NULL;
    }
    if (!admin) {
        h->respond_error(req, 403, "M_FORBIDDEN", "You are not a server admin");
        return NULL;
    }
    return user;
}

/* serverName/mediaId of a local media, or NULL with the response set. */
static const char *local_media_id(media *m, atrium_req *req)
{
    const atrium_host *h = m->h;
    const char *server = h->req_param(req, "serverName");
    const char *id = h->req_param(req, "mediaId");
    if (!server || !id || !media_server_name_valid(server) || !media_id_valid(id)) {
        h->respond_error(req, 400, "M_INVALID_PARAM", "Invalid server name or media ID");
        return NULL;
    }
    if (strcmp(server, m->server_name) != 0) {
        h->respond_error(req, 404, "M_NOT_FOUND", "Only local media is handled here");
        return NULL;
    }
    return id;
}

static int db_failed(media *m, atrium_req *req)
{
    m->h->respond_error(req, 503, "M_UNKNOWN", "The database is busy or unreachable; retry");
    return ATRIUM_DONE;
}

static int not_found(media *m, atrium_req *req)
{
    m->h->respond_error(req, 404, "M_NOT_FOUND", "Media not found");
    return ATRIUM_DONE;
}

static int media_info(atrium_req *req)
{
    media *m = media_of(req);
    const atrium_host *h = m->h;
    if (!require_admin(m, req)) return ATRIUM_DONE;
    const char *id = local_media_id(m, req);
    if (!id) return ATRIUM_DONE;
    PGconn *c = h->db_acquire(MEDIA_DB_WAIT_MS);
    if (!c) return db_failed(m, req);
    media_row r;
    int rc = media_db_get(h, m->self, c, id, &r);
    h->db_release(c);
    if (rc == ATRIUM_E_DB) return db_failed(m, req);
    if (rc == MEDIA_DB_NOTFOUND) return not_found(m, req);
    json_t *info = json_pack("{s:s, s:s, s:s, s:I, s:I, s:s, s:b, s:b, s:b}", "media_origin",
                             m->server_name, "user_id", r.user_id, "media_id", r.media_id,
                             "media_length", (json_int_t)r.size_bytes, "created_ts",
                             (json_int_t)r.created_ts, "filesystem_id", r.media_id, "url_cache", 0,
                             "authenticated", 1, "safe_from_quarantine", r.safe_from_quarantine);
    if (!info) return ATRIUM_E_NOMEM;
    json_object_set_new(info, "media_type",
                        r.content_type[0] ? json_string(r.content_type) : json_null());
    json_object_set_new(info, "upload_name",
                        r.upload_name[0] ? json_string(r.upload_name) : json_null());
    json_object_set_new(info, "quarantined_by",
                        r.quarantined ? json_string(r.quarantined_by) : json_null());
    json_object_set_new(info, "sha256", r.sha256[0] ? json_string(r.sha256) : json_null());
    json_object_set_new(info, "last_access_ts", json_null());
    json_object_set_new(info, "uploaded", json_boolean(r.uploaded));
    return media_reply(m, req, json_pack("{s:o}", "media_info", info));
}

/* Close what the open-file cache holds of deleted media: its original and, when no other
 * media shares its content, its thumbnails. */
static void forget_files(media *m, const char *id, const char *sha)
{
    char path[MEDIA_PATH_MAX];
    if (store_original_path(m, id, path, sizeof(path)) == 0) fdcache_forget(m, path);
    if (sha && sha[0] && store_thumb_dir(m, sha, path, sizeof(path)) == 0)
        fdcache_forget_under(m, path);
}

/* storage: s3 - the deleted media's objects: its original and, when no other media shares
 * its content, its thumbnails. A failure is logged: the objects stay (no row names them). */
static void delete_objects(media *m, const char *id, const char *sha)
{
    char key[MEDIA_PATH_MAX];
    int rc = s3_original_key(id, key, sizeof(key));
    if (rc == 0) rc = s3_delete_object(m, key);
    if (rc == 0 && sha && sha[0]) {
        snprintf(key, sizeof(key), "thumbnails/%s/", sha);
        if (s3_delete_prefix(m, key) < 0) rc = -1;
    }
    if (rc < 0)
        m->h->log(m->self, ATRIUM_LOG_ERROR,
                  "media %s deleted, but objects of it stay in the bucket (see above)", id);
}

static int media_delete(atrium_req *req)
{
    media *m = media_of(req);
    const atrium_host *h = m->h;
    if (h->req_run_reason(req) != ATRIUM_RUN_HANDOFF) {
        if (!require_admin(m, req) || !local_media_id(m, req)) return ATRIUM_DONE;
        if (s3_enabled(m)) { /* the bucket's DELETEs run on a store worker, never here */
            int rc = h->handoff(req, m->store_pool, NULL, 0);
            if (rc == 0) return ATRIUM_HANDED_OFF;
            h->respond_limited(req, 1000, "The media store is busy; retry");
            return ATRIUM_DONE;
        }
    }
    const char *id = local_media_id(m, req);
    if (!id) return ATRIUM_DONE;
    PGconn *c = h->db_acquire(MEDIA_DB_WAIT_MS);
    if (!c) return db_failed(m, req);
    bool shared = false;
    char sha[SHA256_HEX_CHARS + 1] = "";
    int rc = media_db_delete(h, m->self, c, id, &shared, sha);
    h->db_release(c);
    if (rc == ATRIUM_E_DB) return db_failed(m, req);
    if (rc == MEDIA_DB_NOTFOUND) return not_found(m, req);
    rowcache_changed(m, id);
    store_remove_original(m, id);
    if (!shared) store_remove_thumbs(m, sha);
    forget_files(m, id, shared ? NULL : sha);
    if (s3_enabled(m)) delete_objects(m, id, shared ? NULL : sha);
    store_gone_publish(m, 'o', id); /* the other processes' local folders (s3) */
    if (!shared && sha[0]) store_gone_publish(m, 't', sha);
    h->log(m->self, ATRIUM_LOG_INFO, "media %s deleted by %s", id, h->req_authenticate(req));
    return media_reply(m, req, json_pack("{s:[s], s:i}", "deleted_media", id, "total", 1));
}

/* Quarantine of another server's media: the cached copy's row (cache.c never serves a
 * quarantined copy: remote.c answers 404 like missing media); media not cached here is
 * 404 (there is nothing to mark yet). */
static int set_remote_quarantine(media *m, atrium_req *req, const char *admin, bool on)
{
    const atrium_host *h = m->h;
    const char *server = h->req_param(req, "serverName");
    const char *id = h->req_param(req, "mediaId");
    if (!server || !id || !media_server_name_valid(server) || !media_id_valid(id)) {
        h->respond_error(req, 400, "M_INVALID_PARAM", "Invalid server name or media ID");
        return ATRIUM_DONE;
    }
    PGconn *c = h->db_acquire(MEDIA_DB_WAIT_MS);
    if (!c) return db_failed(m, req);
    int rc = media_db_remote_set_quarantine(h, m->self, c, server, id, on ? admin : NULL);
    h->db_release(c);
    if (rc == ATRIUM_E_DB) return db_failed(m, req);
    if (rc == MEDIA_DB_NOTFOUND) return not_found(m, req);
    h->log(m->self, ATRIUM_LOG_INFO, "remote media %s/%s %s by %s", server, id,
           on ? "quarantined" : "released", admin);
    return media_reply(m, req, json_object());
}

static int set_quarantine(atrium_req *req, bool on)
{
    media *m = media_of(req);
    const atrium_host *h = m->h;
    const char *admin = require_admin(m, req);
    if (!admin) return ATRIUM_DONE;
    const char *server = h->req_param(req, "serverName");
    if (server && strcmp(server, m->server_name) != 0)
        return set_remote_quarantine(m, req, admin, on);
    const char *id = local_media_id(m, req);
    if (!id) return ATRIUM_DONE;
    PGconn *c = h->db_acquire(MEDIA_DB_WAIT_MS);
    if (!c) return db_failed(m, req);
    int rc = media_db_set_quarantine(h, m->self, c, id, on ? admin : NULL);
    h->db_release(c);
    if (rc == ATRIUM_E_DB) return db_failed(m, req);
    if (rc == MEDIA_DB_NOTFOUND) {
        /* Unknown, or protected with safe_from_quarantine. */
        return not_found(m, req);
    }
    rowcache_changed(m, id);
    h->log(m->self, ATRIUM_LOG_INFO, "media %s %s by %s", id, on ? "quarantined" : "released",
           admin);
    return media_reply(m, req, json_object());
}

static int quarantine(atrium_req *req)
{
    return set_quarantine(req, true);
}

static int unquarantine(atrium_req *req)
{
    return set_quarantine(req, false);
}

static bool sha256_hex_valid(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++)
        if (!isxdigit((unsigned char)s[n]) || isupper((unsigned char)s[n])) return false;
    return n == SHA256_HEX_CHARS;
}

static int set_hash_quarantine(atrium_req *req, bool on)
{
    media *m = media_of(req);
    const atrium_host *h = m->h;
    const char *admin = require_admin(m, req);
    if (!admin) return ATRIUM_DONE;
    const char *sha = h->req_param(req, "sha256");
    if (!sha || !sha256_hex_valid(sha)) {
        h->respond_error(req, 400, "M_INVALID_PARAM", "Expected a lowercase hex SHA-256");
        return ATRIUM_DONE;
    }
    PGconn *c = h->db_acquire(MEDIA_DB_WAIT_MS);
    if (!c) return db_failed(m, req);
    int rc = media_db_set_hash_quarantine(h, m->self, c, sha, on ? admin : NULL);
    h->db_release(c);
    if (rc != MEDIA_DB_OK) return db_failed(m, req);
    rowcache_changed_hash(m, sha);
    h->log(m->self, ATRIUM_LOG_INFO, "content %s %s by %s", sha, on ? "quarantined" : "released",
           admin);
    return media_reply(m, req, json_object());
}

static int quarantine_hash(atrium_req *req)
{
    return set_hash_quarantine(req, true);
}

static int unquarantine_hash(atrium_req *req)
{
    return set_hash_quarantine(req, false);
}

/* A non-negative integer query parameter; def when absent, -1 when invalid. */
static int64_t query_int(const atrium_host *h, atrium_req *req, const char *name, int64_t def)
{
    const char *v = h->req_query(req, name);
    if (!v) return def;
    int64_t n;
    return atrium_parse_int64(v, 0, INT64_MAX, &n) == 0 ? n : -1;
}

static int user_media(atrium_req *req)
{
    media *m = media_of(req);
    const atrium_host *h = m->h;
    if (!require_admin(m, req)) return ATRIUM_DONE;
    const char *user = h->req_param(req, "userId");
    int64_t from = query_int(h, req, "from", 0);
    int64_t limit = query_int(h, req, "limit", ADMIN_LIST_DEFAULT);
    const char *dir = h->req_query(req, "dir");
    if (!user || from < 0 || limit < 0 || (dir && strcmp(dir, "f") != 0 && strcmp(dir, "b") != 0)) {
        h->respond_error(req, 400, "M_INVALID_PARAM",
                         "from and limit must be non-negative integers, dir f or b");
        return ATRIUM_DONE;
    }
    if (limit > ADMIN_LIST_MAX) limit = ADMIN_LIST_MAX;
    PGconn *c = h->db_acquire(MEDIA_DB_WAIT_MS);
    if (!c) return db_failed(m, req);
    json_t *list = NULL;
    int64_t total = 0;
    /* Synapse's default order: newest first (dir=b); dir=f is oldest first. */
    int rc = media_db_list_user(h, m->self, c, user, from, limit, !dir || strcmp(dir, "b") == 0,
                                &list, &total);
    h->db_release(c);
    if (rc == ATRIUM_E_NOMEM) return rc;
    if (rc != MEDIA_DB_OK) return db_failed(m, req);
    json_t *body = json_pack("{s:o, s:I}", "media", list, "total", (json_int_t)total);
    if (!body) return ATRIUM_E_NOMEM;
    int64_t next = from + (int64_t)json_array_size(list);
    if (next < total) json_object_set_new(body, "next_token", json_integer(next));
    return media_reply(m, req, body);
}

static PGconn *verify_acquire(void *ctx)
{
    media *m = ctx;
    return m->h->db_acquire(MEDIA_DB_WAIT_MS);
}

static void verify_release(void *ctx, PGconn *c)
{
    media *m = ctx;
    m->h->db_release(c);
}

static int verify(atrium_req *req)
{
    media *m = media_of(req);
    const atrium_host *h = m->h;
    if (h->req_run_reason(req) != ATRIUM_RUN_HANDOFF) {
        if (!require_admin(m, req)) return ATRIUM_DONE;
        int rc = h->handoff(req, m->io_pool, NULL, 0); /* file reads: not on the request pool */
        if (rc == 0) return ATRIUM_HANDED_OFF;
        h->respond_limited(req, 1000, "The server is busy storing media; retry");
        return ATRIUM_DONE;
    }
    verify_report rep;
    char err[256];
    if (media_verify(m, verify_acquire, verify_release, m, &rep, err, sizeof(err)) < 0) {
        h->log(m->self, ATRIUM_LOG_ERROR, "media verification failed: %s", err);
        return db_failed(m, req);
    }
    if (rep.problems)
        h->log(m->self, ATRIUM_LOG_ERROR,
               "media verification: %lld of %lld originals do not match their rows",
               (long long)rep.problems, (long long)rep.checked);
    return media_reply(m, req,
                       json_pack("{s:I, s:I, s:o}", "checked", (json_int_t)rep.checked, "problems",
                                 (json_int_t)rep.problems, "details", rep.details));
}

static int purge_media_cache(atrium_req *req)
{
    media *m = media_of(req);
    const atrium_host *h = m->h;
    if (h->req_run_reason(req) != ATRIUM_RUN_HANDOFF) {
        if (!require_admin(m, req)) return ATRIUM_DONE;
        if (query_int(h, req, "before_ts", -1) < 0) {
            h->respond_error(req, 400, "M_MISSING_PARAM",
                             "before_ts (ms since the epoch) is required");
            return ATRIUM_DONE;
        }
        int rc = h->handoff(req, m->io_pool, NULL, 0); /* unlinking files: not here */
        if (rc == 0) return ATRIUM_HANDED_OFF;
        h->respond_limited(req, 1000, "The server is busy storing media; retry");
        return ATRIUM_DONE;
    }
    int64_t deleted = 0;
    if (cache_purge(m, query_int(h, req, "before_ts", 0), &deleted) < 0) return db_failed(m, req);
    h->log(m->self, ATRIUM_LOG_INFO, "remote media cache purged: %lld cop%s removed",
           (long long)deleted, deleted == 1 ? "y" : "ies");
    return media_reply(m, req, json_pack("{s:I}", "deleted", (json_int_t)deleted));
}

int admin_register(media *m)
{
    const atrium_route routes[] = {
        {.method = "GET",
         .path = "/_synapse/admin/v1/media/{serverName}/{mediaId}",
         .handler = media_info},
        {.method = "DELETE",
         .path = "/_synapse/admin/v1/media/{serverName}/{mediaId}",
         .handler = media_delete},
        {.method = "POST",
         .path = "/_synapse/admin/v1/media/quarantine/{serverName}/{mediaId}",
         .handler = quarantine},
        {.method = "POST",
         .path = "/_synapse/admin/v1/media/unquarantine/{serverName}/{mediaId}",
         .handler = unquarantine},
        {.method = "GET", .path = "/_synapse/admin/v1/users/{userId}/media", .handler = user_media},
        {.method = "POST",
         .path = "/_atrium/admin/v1/media/quarantine_hash/{sha256}",
         .handler = quarantine_hash},
        {.method = "POST",
         .path = "/_atrium/admin/v1/media/unquarantine_hash/{sha256}",
         .handler = unquarantine_hash},
        {.method = "POST", .path = "/_atrium/admin/v1/media/verify", .handler = verify},
        {.method = "POST",
         .path = "/_synapse/admin/v1/purge_media_cache",
         .handler = purge_media_cache},
    };
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
        atrium_route r = routes[i];
        r.arg = m;
        int rc = m->h->route_add(m->self, &r);
        if (rc < 0) return rc;
    }
    return 0;
}
