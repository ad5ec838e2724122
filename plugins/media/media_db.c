/*
 * plugins/media/media_db.c - the media plugin's SQL: its migrations (owner "media") and every
 * query it runs.
 *
 * Tables: media_local holds one row per local media ID - who created it and when, and,
 * once its bytes arrived, their SHA-256, size, declared type, file name and image header
 * facts (width, height, frames); quarantine marks live on the row (by ID) or in
 * media_quarantined_hashes (by content, so a re-upload of refused bytes stays refused).
 * A row with uploaded_ts NULL is a reservation from /create waiting for its PUT.
 * media_remote is the remote cache: one row per (origin, media ID) whose copy is complete
 * and durable on disk (file_name, under the store), written only after the file was
 * committed, so a row always names a whole file; hash quarantine applies to it too.
 * media_remote_thumbnails holds the thumbnails origins made of their media, per
 * configured size, written the same way. media_claims says which process renders a
 * thumbnail or fetches a remote file for all of them (cluster.c), and keeps a failure's
 * result for a while. media_url_previews keeps URL preview answers for their TTL.
 *
 * Every function takes a connection the caller borrowed (db_acquire) and gives back
 * MEDIA_DB_OK / MEDIA_DB_NOTFOUND or ATRIUM_E_DB after logging PostgreSQL's message.
 * Parameters travel as text; no SQL is ever assembled from client input.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "media.h"

#define I64_CHARS 24

const atrium_migration MEDIA_MIGRATIONS[] = {
    {1, "media_local",
     "CREATE TABLE media_local ("
     " media_id text PRIMARY KEY,"
     " user_id text NOT NULL,"
     " created_ts bigint NOT NULL,"
     " expires_ts bigint,"
     " uploaded_ts bigint,"
     " content_type text,"
     " upload_name text,"
     " size_bytes bigint,"
     " sha256 text,"
     " width integer, height integer, frames integer,"
     " quarantined_by text,"
     " quarantined_ts bigint,"
     " safe_from_quarantine boolean NOT NULL DEFAULT false);"
     "CREATE INDEX media_local_user ON media_local (user_id, created_ts);"
     "CREATE INDEX media_local_sha256 ON media_local (sha256);"
     "CREATE TABLE media_quarantined_hashes ("
     " sha256 text PRIMARY KEY,"
     " quarantined_by text NOT NULL,"
     " quarantined_ts bigint NOT NULL);"},
    {2, "media_remote",
     "CREATE TABLE media_remote ("
     " origin text NOT NULL,"
     " media_id text NOT NULL,"
     " file_name text NOT NULL,"
     " content_type text,"
     " upload_name text,"
     " size_bytes bigint NOT NULL,"
     " sha256 text NOT NULL,"
     " width integer, height integer, frames integer,"
     " fetched_ts bigint NOT NULL,"
     " last_access_ts bigint NOT NULL,"
     " quarantined_by text,"
     " quarantined_ts bigint,"
     " PRIMARY KEY (origin, media_id));"
     "CREATE INDEX media_remote_last_access ON media_remote (last_access_ts);"
     "CREATE INDEX media_remote_sha256 ON media_remote (sha256);"},
    {3, "media_remote_thumbnails",
     "CREATE TABLE media_remote_thumbnails ("
     " origin text NOT NULL,"
     " media_id text NOT NULL,"
     " width integer NOT NULL, height integer NOT NULL,"
     " method text NOT NULL,"
     " animated boolean NOT NULL,"
     " file_name text NOT NULL,"
     " content_type text NOT NULL,"
     " size_bytes bigint NOT NULL,"
     " sha256 text NOT NULL,"
     " fetched_ts bigint NOT NULL,"
     " PRIMARY KEY (origin, media_id, width, height, method, animated));"},
    {4, "media_claims",
     /* Which process does a piece of work shared by all (cluster.c): a thumbnail's
      * render, a remote file's fetch. expires_ts is the database's clock (ms). */
     "CREATE TABLE media_claims ("
     " claim_key text PRIMARY KEY,"
     " owner text NOT NULL,"
     " expires_ts bigint NOT NULL,"
     " result integer);"},
    {5, "media_url_previews",
     /* URL preview answers (preview.c): one per URL and rounded ts, kept until
      * expires_ts (ms since the epoch); og is the JSON text answered. */
     "CREATE TABLE media_url_previews ("
     " url text NOT NULL,"
     " ts_bucket bigint NOT NULL,"
     " og text NOT NULL,"
     " fetched_ts bigint NOT NULL,"
     " expires_ts bigint NOT NULL,"
     " PRIMARY KEY (url, ts_bucket));"
     "CREATE INDEX media_url_previews_expires ON media_url_previews (expires_ts);"},
    {6, "media_remote_file_names",
     /* A cached copy by its file name, which is also its object key with storage: s3:
      * the orphan sweep asks which names rows hold (orphans_s3.c), and atrium media
      * migrate walks the copies in name order (migrate_remote.c). */
     "CREATE INDEX media_remote_file_name ON media_remote (file_name);"
     "CREATE INDEX media_remote_thumbnails_file_name ON media_remote_thumbnails (file_name);"},
};
const size_t MEDIA_N_MIGRATIONS = sizeof(MEDIA_MIGRATIONS) / sizeof(MEDIA_MIGRATIONS[0]);

/* The columns media_row is read from, in parse_row's order. */
#define ROW_COLUMNS                                                                                \
    "m.media_id, m.user_id, coalesce(m.content_type, ''), coalesce(m.upload_name, ''),"            \
    " coalesce(m.sha256, ''), m.created_ts, coalesce(m.expires_ts, 0),"                            \
    " coalesce(m.uploaded_ts, 0), coalesce(m.size_bytes, 0), coalesce(m.width, 0),"                \
    " coalesce(m.height, 0), coalesce(m.frames, 0),"                                               \
    " coalesce(m.quarantined_by, q.quarantined_by, ''),"                                           \
    " (m.quarantined_by IS NOT NULL OR q.sha256 IS NOT NULL), m.safe_from_quarantine"
#define ROW_FROM " FROM media_local m LEFT JOIN media_quarantined_hashes q ON q.sha256 = m.sha256"

static PGresult *run(const atrium_host *h, atrium_plugin *self, PGconn *c, const char *sql, int n,
                     const char *const *params, ExecStatusType want)
{
    PGresult *res = PQexecParams(c, sql, n, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(res) == want) return res;
    h->log(self, ATRIUM_LOG_ERROR, "media query failed: %s",
           res ? PQresultErrorMessage(res) : PQerrorMessage(c));
    PQclear(res);
    return NULL;
}

static void copy_field(char *dst, size_t cap, const PGresult *res, int row, int col)
{
    snprintf(dst, cap, "%s", PQgetvalue(res, row, col));
}

static int64_t i64_field(const PGresult *res, int row, int col)
{
    return strtoll(PQgetvalue(res, row, col), NULL, 10);
}

static void parse_row(const PGresult *res, int i, media_row *r)
{
    memset(r, 0, sizeof(*r));
    copy_field(r->media_id, sizeof(r->media_id), res, i, 0);
    copy_field(r->user_id, sizeof(r->user_id), res, i, 1);
    copy_field(r->content_type, sizeof(r->content_type), res, i, 2);
    copy_field(r->upload_name, sizeof(r->upload_name), res, i, 3);
    copy_field(r->sha256, sizeof(r->sha256), res, i, 4);
    r->created_ts = i64_field(res, i, 5);
    r->expires_ts = i64_field(res, i, 6);
    r->uploaded_ts = i64_field(res, i, 7);
    r->uploaded = r->uploaded_ts > 0;
    r->size_bytes = i64_field(res, i, 8);
    r->width = (int)i64_field(res, i, 9);
    r->height = (int)i64_field(res, i, 10);
    r->frames = (int)i64_field(res, i, 11);
    copy_field(r->quarantined_by, sizeof(r->quarantined_by), res, i, 12);
    r->quarantined = PQgetvalue(res, i, 13)[0] == 't';
    r->safe_from_quarantine = PQgetvalue(res, i, 14)[0] == 't';
}

int media_db_get(const atrium_host *h, atrium_plugin *self, PGconn *c, const char *media_id,
                 media_row *out)
{
    const char *p[] = {media_id};
    PGresult *res = run(h, self, c, "SELECT " ROW_COLUMNS ROW_FROM " WHERE m.media_id = $1", 1, p,
                        PGRES_TUPLES_OK);
    if (!res) return ATRIUM_E_DB;
    int rc = PQntuples(res) == 1 ? MEDIA_DB_OK : MEDIA_DB_NOTFOUND;
    if (rc == MEDIA_DB_OK) parse_row(res, 0, out);
    PQclear(res);
    return rc;
}

static const char *opt(const char *s)
{
    return s && *s ? s : NULL; /* "" is stored as NULL */
}

static const char *dims(int v, char *buf)
{
    if (v <= 0) return NULL;
    snprintf(buf, I64_CHARS, "%d", v);
    return buf;
}

int media_db_insert(const atrium_host *h, atrium_plugin *self, PGconn *c, const media_row *r)
{
    char created[I64_CHARS], size[I64_CHARS], w[I64_CHARS], hh[I64_CHARS], f[I64_CHARS];
    snprintf(created, sizeof(created), "%" PRId64, r->created_ts);
    snprintf(size, sizeof(size), "%" PRId64, r->size_bytes);
    const char *p[] = {
        r->media_id, r->user_id, created,           opt(r->content_type), opt(r->upload_name),
        size,        r->sha256,  dims(r->width, w), dims(r->height, hh),  dims(r->frames, f)};
    PGresult *res = run(h, self, c,
                        "INSERT INTO media_local (media_id, user_id, created_ts, uploaded_ts,"
                        " content_type, upload_name, size_bytes, sha256, width, height, frames)"
                        " VALUES ($1, $2, $3, $3, $4, $5, $6, $7, $8, $9, $10)",
                        10, p, PGRES_COMMAND_OK);
    if (!res) return ATRIUM_E_DB;
    PQclear(res);
    return MEDIA_DB_OK;
}

int media_db_create(const atrium_host *h, atrium_plugin *self, PGconn *c, const char *media_id,
                    const char *user_id, int64_t now, int64_t expires, int max_pending)
{
    char now_s[I64_CHARS], exp_s[I64_CHARS], max_s[I64_CHARS];
    snprintf(now_s, sizeof(now_s), "%" PRId64, now);
    snprintf(exp_s, sizeof(exp_s), "%" PRId64, expires);
    snprintf(max_s, sizeof(max_s), "%d", max_pending);
    const char *p[] = {media_id, user_id, now_s, exp_s, max_s};
    /* The pending cap and the insert in one statement. */
    PGresult *res = run(h, self, c,
                        "INSERT INTO media_local (media_id, user_id, created_ts, expires_ts)"
                        " SELECT $1, $2, $3::bigint, $4::bigint WHERE (SELECT count(*)"
                        " FROM media_local WHERE user_id = $2 AND uploaded_ts IS NULL"
                        " AND expires_ts > $3::bigint) < $5::bigint",
                        5, p, PGRES_COMMAND_OK);
    if (!res) return ATRIUM_E_DB;
    int inserted = atoi(PQcmdTuples(res));
    PQclear(res);
    return inserted == 1 ? MEDIA_DB_OK : ATRIUM_E_LIMIT;
}

int media_db_uploaded_since(const atrium_host *h, atrium_plugin *self, PGconn *c,
                            const char *user_id, int64_t since_ms, int64_t *out)
{
    char since_s[I64_CHARS];
    snprintf(since_s, sizeof(since_s), "%" PRId64, since_ms);
    const char *p[] = {user_id, since_s};
    PGresult *res = run(h, self, c,
                        "SELECT coalesce(sum(size_bytes), 0) FROM media_local"
                        " WHERE user_id = $1 AND uploaded_ts >= $2::bigint",
                        2, p, PGRES_TUPLES_OK);
    if (!res) return ATRIUM_E_DB;
    *out = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
    PQclear(res);
    return MEDIA_DB_OK;
}

int media_db_exec(const atrium_host *h, atrium_plugin *self, PGconn *c, const char *sql)
{
    PGresult *res = run(h, self, c, sql, 0, NULL, PGRES_COMMAND_OK);
    if (!res) return ATRIUM_E_DB;
    PQclear(res);
    return MEDIA_DB_OK;
}

int media_db_lock_pending(const atrium_host *h, atrium_plugin *self, PGconn *c,
                          const char *media_id, media_row *out)
{
    const char *p[] = {media_id};
    PGresult *res =
        run(h, self, c, "SELECT " ROW_COLUMNS ROW_FROM " WHERE m.media_id = $1 FOR UPDATE OF m", 1,
            p, PGRES_TUPLES_OK);
    if (!res) return ATRIUM_E_DB;
    int rc = PQntuples(res) == 1 ? MEDIA_DB_OK : MEDIA_DB_NOTFOUND;
    if (rc == MEDIA_DB_OK) parse_row(res, 0, out);
    PQclear(res);
    return rc;
}

int media_db_complete(const atrium_host *h, atrium_plugin *self, PGconn *c, const media_row *r)
{
    char up[I64_CHARS], size[I64_CHARS], w[I64_CHARS], hh[I64_CHARS], f[I64_CHARS];
    snprintf(up, sizeof(up), "%" PRId64, r->uploaded_ts);
    snprintf(size, sizeof(size), "%" PRId64, r->size_bytes);
    const char *p[] = {r->media_id,
                       up,
                       opt(r->content_type),
                       opt(r->upload_name),
                       size,
                       r->sha256,
                       dims(r->width, w),
                       dims(r->height, hh),
                       dims(r->frames, f)};
    PGresult *res = run(h, self, c,
                        "UPDATE media_local SET uploaded_ts = $2, expires_ts = NULL,"
                        " content_type = $3, upload_name = $4, size_bytes = $5, sha256 = $6,"
                        " width = $7, height = $8, frames = $9"
                        " WHERE media_id = $1 AND uploaded_ts IS NULL",
                        9, p, PGRES_COMMAND_OK);
    if (!res) return ATRIUM_E_DB;
    int n = atoi(PQcmdTuples(res));
    PQclear(res);
    return n == 1 ? MEDIA_DB_OK : MEDIA_DB_NOTFOUND;
}

int media_db_set_quarantine(const atrium_host *h, atrium_plugin *self, PGconn *c,
                            const char *media_id, const char *by)
{
    char now[I64_CHARS];
    snprintf(now, sizeof(now), "%" PRId64, media_wall_ms());
    const char *p[] = {media_id, by, by ? now : NULL};
    PGresult *res = run(h, self, c,
                        "UPDATE media_local SET quarantined_by = $2, quarantined_ts = $3"
                        " WHERE media_id = $1 AND ($2::text IS NULL OR NOT safe_from_quarantine)",
                        3, p, PGRES_COMMAND_OK);
    if (!res) return ATRIUM_E_DB;
    int n = atoi(PQcmdTuples(res));
    PQclear(res);
    return n == 1 ? MEDIA_DB_OK : MEDIA_DB_NOTFOUND;
}

int media_db_set_hash_quarantine(const atrium_host *h, atrium_plugin *self, PGconn *c,
                                 const char *sha256, const char *by)
{
    char now[I64_CHARS];
    snprintf(now, sizeof(now), "%" PRId64, media_wall_ms());
    const char *add[] = {sha256, by, now};
    const char *del[] = {sha256};
    PGresult *res =
        by ? run(h, self, c,
                 "INSERT INTO media_quarantined_hashes (sha256, quarantined_by, quarantined_ts)"
                 " VALUES ($1, $2, $3) ON CONFLICT (sha256) DO NOTHING",
                 3, add, PGRES_COMMAND_OK)
           : run(h, self, c, "DELETE FROM media_quarantined_hashes WHERE sha256 = $1", 1, del,
                 PGRES_COMMAND_OK);
    if (!res) return ATRIUM_E_DB;
    PQclear(res);
    return MEDIA_DB_OK;
}

int media_db_delete(const atrium_host *h, atrium_plugin *self, PGconn *c, const char *media_id,
                    bool *sha_still_used, char sha_out[SHA256_HEX_CHARS + 1])
{
    const char *p[] = {media_id};
    PGresult *res = run(h, self, c,
                        "DELETE FROM media_local WHERE media_id = $1 RETURNING"
                        " coalesce(sha256, ''), EXISTS (SELECT 1 FROM media_local o"
                        " WHERE o.sha256 = media_local.sha256 AND o.media_id <> $1)",
                        1, p, PGRES_TUPLES_OK);
    if (!res) return ATRIUM_E_DB;
    int rc = PQntuples(res) == 1 ? MEDIA_DB_OK : MEDIA_DB_NOTFOUND;
    if (rc == MEDIA_DB_OK) {
        snprintf(sha_out, SHA256_HEX_CHARS + 1, "%s", PQgetvalue(res, 0, 0));
        *sha_still_used = PQgetvalue(res, 0, 1)[0] == 't';
    }
    PQclear(res);
    return rc;
}

/* One row as the Synapse admin API shows a user's media. */
static json_t *admin_item(const media_row *r)
{
    json_t *o = json_pack("{s:s, s:I, s:I, s:b}", "media_id", r->media_id, "created_ts",
                          (json_int_t)r->created_ts, "media_length", (json_int_t)r->size_bytes,
                          "safe_from_quarantine", r->safe_from_quarantine);
    if (!o) return NULL;
    json_object_set_new(o, "media_type",
                        r->content_type[0] ? json_string(r->content_type) : json_null());
    json_object_set_new(o, "upload_name",
                        r->upload_name[0] ? json_string(r->upload_name) : json_null());
    json_object_set_new(o, "quarantined_by",
                        r->quarantined_by[0] ? json_string(r->quarantined_by) : json_null());
    json_object_set_new(o, "last_access_ts", json_null());
    return o;
}

int media_db_list_user(const atrium_host *h, atrium_plugin *self, PGconn *c, const char *user_id,
                       int64_t from, int64_t limit, bool newest_first, json_t **out, int64_t *total)
{
    char from_s[I64_CHARS], limit_s[I64_CHARS];
    snprintf(from_s, sizeof(from_s), "%" PRId64, from);
    snprintf(limit_s, sizeof(limit_s), "%" PRId64, limit);
    const char *p[] = {user_id, limit_s, from_s};
    PGresult *res = run(h, self, c,
                        newest_first ? "SELECT " ROW_COLUMNS ROW_FROM " WHERE m.user_id = $1"
                                       " ORDER BY m.created_ts DESC, m.media_id LIMIT $2 OFFSET $3"
                                     : "SELECT " ROW_COLUMNS ROW_FROM " WHERE m.user_id = $1"
                                       " ORDER BY m.created_ts ASC, m.media_id LIMIT $2 OFFSET $3",
                        3, p, PGRES_TUPLES_OK);
    if (!res) return ATRIUM_E_DB;
    json_t *arr = json_array();
    media_row r;
    for (int i = 0; arr && i < PQntuples(res); i++) {
        parse_row(res, i, &r);
        json_t *item = admin_item(&r);
        if (!item || json_array_append_new(arr, item) < 0) {
            json_decref(arr);
            arr = NULL;
        }
    }
    PQclear(res);
    if (!arr) return ATRIUM_E_NOMEM;
    res = run(h, self, c, "SELECT count(*) FROM media_local WHERE user_id = $1", 1, p,
              PGRES_TUPLES_OK);
    if (!res) {
        json_decref(arr);
        return ATRIUM_E_DB;
    }
    *total = i64_field(res, 0, 0);
    PQclear(res);
    *out = arr;
    return MEDIA_DB_OK;
}

/* ---- the remote cache ------------------------------------------------------------------ */

int media_db_remote_get(const atrium_host *h, atrium_plugin *self, PGconn *c, const char *origin,
                        const char *media_id, media_row *out)
{
    const char *p[] = {origin, media_id};
    PGresult *res = run(h, self, c,
                        "SELECT r.media_id, coalesce(r.content_type, ''),"
                        " coalesce(r.upload_name, ''), r.sha256, r.fetched_ts, r.size_bytes,"
                        " coalesce(r.width, 0), coalesce(r.height, 0), coalesce(r.frames, 0),"
                        " coalesce(r.quarantined_by, q.quarantined_by, ''),"
                        " (r.quarantined_by IS NOT NULL OR q.sha256 IS NOT NULL), r.file_name"
                        " FROM media_remote r LEFT JOIN media_quarantined_hashes q"
                        " ON q.sha256 = r.sha256 WHERE r.origin = $1 AND r.media_id = $2",
                        2, p, PGRES_TUPLES_OK);
    if (!res) return ATRIUM_E_DB;
    int rc = PQntuples(res) == 1 ? MEDIA_DB_OK : MEDIA_DB_NOTFOUND;
    if (rc == MEDIA_DB_OK) {
        memset(out, 0, sizeof(*out));
        copy_field(out->media_id, sizeof(out->media_id), res, 0, 0);
        copy_field(out->content_type, sizeof(out->content_type), res, 0, 1);
        copy_field(out->upload_name, sizeof(out->upload_name), res, 0, 2);
        copy_field(out->sha256, sizeof(out->sha256), res, 0, 3);
        out->created_ts = out->uploaded_ts = i64_field(res, 0, 4);
        out->size_bytes = i64_field(res, 0, 5);
        out->width = (int)i64_field(res, 0, 6);
        out->height = (int)i64_field(res, 0, 7);
        out->frames = (int)i64_field(res, 0, 8);
        copy_field(out->quarantined_by, sizeof(out->quarantined_by), res, 0, 9);
        out->quarantined = PQgetvalue(res, 0, 10)[0] == 't';
        copy_field(out->file_name, sizeof(out->file_name), res, 0, 11);
        out->uploaded = true;
    }
    PQclear(res);
    return rc;
}

int media_db_remote_put(const atrium_host *h, atrium_plugin *self, PGconn *c, const char *origin,
                        const media_row *r, char old_file[MEDIA_FILE_NAME_MAX],
                        int64_t *old_bytes)
{
    char now[I64_CHARS], size[I64_CHARS], w[I64_CHARS], hh[I64_CHARS], f[I64_CHARS];
    snprintf(now, sizeof(now), "%" PRId64, media_wall_ms());
    snprintf(size, sizeof(size), "%" PRId64, r->size_bytes);
    const char *p[] = {origin,    r->media_id,          r->file_name,         opt(r->content_type),
                       opt(r->upload_name), size,       r->sha256,            dims(r->width, w),
                       dims(r->height, hh), dims(r->frames, f), now};
    /* The old row's file name comes back so the caller can remove a replaced copy. */
    PGresult *res = run(h, self, c,
                        "WITH old AS (SELECT file_name, size_bytes FROM media_remote"
                        " WHERE origin = $1 AND media_id = $2 FOR UPDATE)"
                        " INSERT INTO media_remote (origin, media_id, file_name, content_type,"
                        " upload_name, size_bytes, sha256, width, height, frames, fetched_ts,"
                        " last_access_ts) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11,"
                        " $11) ON CONFLICT (origin, media_id) DO UPDATE SET"
                        " file_name = EXCLUDED.file_name, content_type = EXCLUDED.content_type,"
                        " upload_name = EXCLUDED.upload_name, size_bytes = EXCLUDED.size_bytes,"
                        " sha256 = EXCLUDED.sha256, width = EXCLUDED.width,"
                        " height = EXCLUDED.height, frames = EXCLUDED.frames,"
                        " fetched_ts = EXCLUDED.fetched_ts, last_access_ts = EXCLUDED.fetched_ts"
                        " RETURNING coalesce((SELECT file_name FROM old), ''),"
                        " coalesce((SELECT size_bytes FROM old), 0)",
                        11, p, PGRES_TUPLES_OK);
    if (!res) return ATRIUM_E_DB;
    old_file[0] = '\0';
    *old_bytes = 0;
    if (PQntuples(res) == 1) {
        snprintf(old_file, MEDIA_FILE_NAME_MAX, "%s", PQgetvalue(res, 0, 0));
        *old_bytes = i64_field(res, 0, 1);
    }
    PQclear(res);
    return MEDIA_DB_OK;
}

int media_db_remote_thumb_get(const atrium_host *h, atrium_plugin *self, PGconn *c,
                              const char *origin, const char *media_id, const media_size *s,
                              media_row *out)
{
    char w[I64_CHARS], hh[I64_CHARS];
    snprintf(w, sizeof(w), "%d", s->width);
    snprintf(hh, sizeof(hh), "%d", s->height);
    const char *p[] = {origin, media_id, w, hh, s->crop ? "crop" : "scale",
                       s->animated ? "true" : "false"};
    PGresult *res = run(h, self, c,
                        "SELECT t.file_name, t.content_type, t.sha256, t.size_bytes,"
                        " (q.sha256 IS NOT NULL OR r.quarantined_by IS NOT NULL)"
                        " FROM media_remote_thumbnails t"
                        " LEFT JOIN media_quarantined_hashes q ON q.sha256 = t.sha256"
                        " LEFT JOIN media_remote r ON r.origin = t.origin AND r.media_id = t.media_id"
                        " WHERE t.origin = $1 AND t.media_id = $2 AND t.width = $3"
                        " AND t.height = $4 AND t.method = $5 AND t.animated = $6",
                        6, p, PGRES_TUPLES_OK);
    if (!res) return ATRIUM_E_DB;
    int rc = PQntuples(res) == 1 ? MEDIA_DB_OK : MEDIA_DB_NOTFOUND;
    if (rc == MEDIA_DB_OK) {
        memset(out, 0, sizeof(*out));
        snprintf(out->media_id, sizeof(out->media_id), "%s", media_id);
        copy_field(out->file_name, sizeof(out->file_name), res, 0, 0);
        copy_field(out->content_type, sizeof(out->content_type), res, 0, 1);
        copy_field(out->sha256, sizeof(out->sha256), res, 0, 2);
        out->size_bytes = i64_field(res, 0, 3);
        out->quarantined = PQgetvalue(res, 0, 4)[0] == 't';
        out->uploaded = true;
    }
    PQclear(res);
    return rc;
}

int media_db_remote_thumb_put(const atrium_host *h, atrium_plugin *self, PGconn *c,
                              const char *origin, const media_size *s, const media_row *r)
{
    char w[I64_CHARS], hh[I64_CHARS], size[I64_CHARS], now[I64_CHARS];
    snprintf(w, sizeof(w), "%d", s->width);
    snprintf(hh, sizeof(hh), "%d", s->height);
    snprintf(size, sizeof(size), "%" PRId64, r->size_bytes);
    snprintf(now, sizeof(now), "%" PRId64, media_wall_ms());
    const char *p[] = {origin, r->media_id, w, hh, s->crop ? "crop" : "scale",
                       s->animated ? "true" : "false", r->file_name, r->content_type, size,
                       r->sha256, now};
    PGresult *res = run(h, self, c,
                        "INSERT INTO media_remote_thumbnails (origin, media_id, width, height,"
                        " method, animated, file_name, content_type, size_bytes, sha256,"
                        " fetched_ts) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"
                        " ON CONFLICT (origin, media_id, width, height, method, animated)"
                        " DO UPDATE SET file_name = EXCLUDED.file_name,"
                        " content_type = EXCLUDED.content_type, size_bytes = EXCLUDED.size_bytes,"
                        " sha256 = EXCLUDED.sha256, fetched_ts = EXCLUDED.fetched_ts",
                        11, p, PGRES_COMMAND_OK);
    if (!res) return ATRIUM_E_DB;
    PQclear(res);
    return MEDIA_DB_OK;
}

int media_db_remote_set_quarantine(const atrium_host *h, atrium_plugin *self, PGconn *c,
                                   const char *origin, const char *media_id, const char *by)
{
    char now[I64_CHARS];
    snprintf(now, sizeof(now), "%" PRId64, media_wall_ms());
    const char *p[] = {origin, media_id, by, by ? now : NULL};
    PGresult *res = run(h, self, c,
                        "UPDATE media_remote SET quarantined_by = $3, quarantined_ts = $4"
                        " WHERE origin = $1 AND media_id = $2",
                        4, p, PGRES_COMMAND_OK);
    if (!res) return ATRIUM_E_DB;
    int n = atoi(PQcmdTuples(res));
    PQclear(res);
    return n == 1 ? MEDIA_DB_OK : MEDIA_DB_NOTFOUND;
}

/* ---- claims (cluster.c) ------------------------------------------------------------------ */

#define DB_NOW_MS "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"

int media_db_claim(const atrium_host *h, atrium_plugin *self, PGconn *c, const char *key,
                   const char *owner, int64_t ttl_ms, int *result, int64_t *left_ms)
{
    char ttl[I64_CHARS];
    snprintf(ttl, sizeof(ttl), "%" PRId64, ttl_ms);
    const char *p[] = {key, owner, ttl};
    /* Taken when the row is new or lapsed (EXCLUDED.expires_ts - ttl is now). Otherwise
     * the holder's row as this statement's snapshot saw it: absent when it was taken by
     * a transaction that committed after that (then: held, expiry unknown). */
    PGresult *res = run(h, self, c,
                        "WITH ins AS (INSERT INTO media_claims AS c (claim_key, owner, expires_ts)"
                        " VALUES ($1, $2, " DB_NOW_MS " + $3::bigint)"
                        " ON CONFLICT (claim_key) DO UPDATE SET owner = EXCLUDED.owner,"
                        " expires_ts = EXCLUDED.expires_ts, result = NULL"
                        " WHERE c.expires_ts <= EXCLUDED.expires_ts - $3::bigint RETURNING 1)"
                        " SELECT (SELECT count(*) FROM ins),"
                        " (SELECT result FROM media_claims WHERE claim_key = $1),"
                        " (SELECT expires_ts - " DB_NOW_MS " FROM media_claims WHERE claim_key = $1)",
                        3, p, PGRES_TUPLES_OK);
    if (!res) return ATRIUM_E_DB;
    int rc = CLAIM_MINE;
    *left_ms = -1;
    if (PQntuples(res) == 1 && strcmp(PQgetvalue(res, 0, 0), "0") == 0) {
        rc = CLAIM_HELD;
        if (!PQgetisnull(res, 0, 2)) *left_ms = strtoll(PQgetvalue(res, 0, 2), NULL, 10);
        if (!PQgetisnull(res, 0, 1)) {
            *result = atoi(PQgetvalue(res, 0, 1));
            rc = CLAIM_RESULT;
        }
    }
    PQclear(res);
    return rc;
}

int media_db_claim_end(const atrium_host *h, atrium_plugin *self, PGconn *c, const char *key,
                       const char *owner, int result, int64_t remember_ms)
{
    char r[I64_CHARS], ttl[I64_CHARS];
    snprintf(r, sizeof(r), "%d", result);
    snprintf(ttl, sizeof(ttl), "%" PRId64, remember_ms);
    const char *p[] = {key, owner, r, ttl};
    /* Only our own row: a claim that lapsed and was taken by another is theirs. */
    PGresult *res = remember_ms > 0
                        ? run(h, self, c,
                              "UPDATE media_claims SET result = $3::integer,"
                              " expires_ts = " DB_NOW_MS " + $4::bigint"
                              " WHERE claim_key = $1 AND owner = $2",
                              4, p, PGRES_COMMAND_OK)
                        : run(h, self, c, "DELETE FROM media_claims WHERE claim_key = $1 AND owner = $2",
                              2, p, PGRES_COMMAND_OK);
    if (!res) return ATRIUM_E_DB;
    PQclear(res);
    return MEDIA_DB_OK;
}

int media_db_claims_prune(const atrium_host *h, atrium_plugin *self, PGconn *c)
{
    PGresult *res = run(h, self, c, "DELETE FROM media_claims WHERE expires_ts < " DB_NOW_MS, 0,
                        NULL, PGRES_COMMAND_OK);
    if (!res) return ATRIUM_E_DB;
    PQclear(res);
    return MEDIA_DB_OK;
}

int media_db_preview_get(const atrium_host *h, atrium_plugin *self, PGconn *c, const char *url,
                         int64_t ts_bucket, int64_t now_ms, char **og)
{
    char bucket[I64_CHARS], now[I64_CHARS];
    snprintf(bucket, sizeof(bucket), "%" PRId64, ts_bucket);
    snprintf(now, sizeof(now), "%" PRId64, now_ms);
    const char *p[] = {url, bucket, now};
    PGresult *res = run(h, self, c,
                        "SELECT og FROM media_url_previews WHERE url = $1 AND ts_bucket = $2"
                        " AND expires_ts > $3",
                        3, p, PGRES_TUPLES_OK);
    if (!res) return ATRIUM_E_DB;
    int rc = MEDIA_DB_NOTFOUND;
    if (PQntuples(res) == 1) {
        *og = strdup(PQgetvalue(res, 0, 0));
        rc = *og ? MEDIA_DB_OK : ATRIUM_E_DB;
    }
    PQclear(res);
    return rc;
}

int media_db_preview_put(const atrium_host *h, atrium_plugin *self, PGconn *c, const char *url,
                         int64_t ts_bucket, const char *og, int64_t now_ms, int64_t expires_ms)
{
    char bucket[I64_CHARS], now[I64_CHARS], expires[I64_CHARS];
    snprintf(bucket, sizeof(bucket), "%" PRId64, ts_bucket);
    snprintf(now, sizeof(now), "%" PRId64, now_ms);
    snprintf(expires, sizeof(expires), "%" PRId64, expires_ms);
    const char *p[] = {url, bucket, og, now, expires};
    PGresult *res = run(h, self, c,
                        "INSERT INTO media_url_previews (url, ts_bucket, og, fetched_ts, expires_ts)"
                        " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (url, ts_bucket) DO UPDATE"
                        " SET og = EXCLUDED.og, fetched_ts = EXCLUDED.fetched_ts,"
                        " expires_ts = EXCLUDED.expires_ts",
                        5, p, PGRES_COMMAND_OK);
    if (!res) return ATRIUM_E_DB;
    PQclear(res);
    const char *q[] = {now};
    res = run(h, self, c, "DELETE FROM media_url_previews WHERE expires_ts <= $1", 1, q,
              PGRES_COMMAND_OK);
    if (!res) return ATRIUM_E_DB;
    PQclear(res);
    return MEDIA_DB_OK;
}
