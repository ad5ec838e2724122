/*
 * plugins/media/verify.c - does every original still hold the bytes its row promises: the
 * file in the local folder, or with storage: s3 the object in the bucket (read back whole;
 * the local folder is then only a cache)? Used by the admin endpoint (on the io pool) and
 * by the atrium-media-verify command (verify_cli.c), so both report the same facts; the
 * page of rows and the file hash are shared with atrium media migrate (migrate.c).
 *
 * For each uploaded row, in media ID order, a page at a time: the file must exist, have
 * the recorded size, and hash to the recorded SHA-256. The database connection is held
 * only while a page of rows is read, never while files are hashed. Nothing is repaired
 * here: the report names each problem so an operator can restore from a backup or delete
 * the media.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "media.h"
#include "s3.h"

int media_rows_page(PGconn *c, const char *after, int64_t uploaded_since, media_brief *items,
                    int *n, char *err, size_t errlen)
{
    char since[24];
    snprintf(since, sizeof(since), "%" PRId64, uploaded_since);
    const char *p[] = {after, since};
    PGresult *res = PQexecParams(c,
                                 "SELECT media_id, sha256, size_bytes FROM media_local"
                                 " WHERE uploaded_ts IS NOT NULL AND media_id > $1"
                                 " AND uploaded_ts >= $2::bigint"
                                 " ORDER BY media_id LIMIT " ATRIUM_STR(MEDIA_ROWS_PAGE),
                                 2, NULL, p, NULL, NULL, 0);
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        snprintf(err, errlen, "reading media rows failed: %s", PQresultErrorMessage(res));
        PQclear(res);
        return ATRIUM_E_DB;
    }
    *n = PQntuples(res);
    for (int i = 0; i < *n; i++) {
        snprintf(items[i].media_id, sizeof(items[i].media_id), "%s", PQgetvalue(res, i, 0));
        snprintf(items[i].sha256, sizeof(items[i].sha256), "%s", PQgetvalue(res, i, 1));
        items[i].size = strtoll(PQgetvalue(res, i, 2), NULL, 10);
    }
    PQclear(res);
    return 0;
}

int media_hash_file(const char *path, char hex[SHA256_HEX_CHARS + 1], int64_t *size, char *buf)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    sha256_ctx c;
    sha256_init(&c);
    *size = 0;
    for (;;) {
        ssize_t n = read(fd, buf, MEDIA_HASH_READ_BYTES);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            int e = errno;
            close(fd);
            return -e;
        }
        if (n == 0) break;
        sha256_update(&c, buf, (size_t)n);
        *size += n;
    }
    close(fd);
    sha256_final_hex(&c, hex);
    return 0;
}

static void add_problem(verify_report *rep, const char *media_id, const char *problem,
                        const char *detail)
{
    rep->problems++;
    if (json_array_size(rep->details) >= VERIFY_MAX_DETAILS) return;
    json_t *o = json_pack("{s:s, s:s}", "media_id", media_id, "problem", problem);
    if (o && detail) json_object_set_new(o, "detail", json_string(detail));
    if (o) json_array_append_new(rep->details, o);
}

/* With storage: s3 the original is its object: read back whole and hashed. 0 with hex and
 * size, -ENOENT when there is no object, -EIO when the store failed (logged). */
static int hash_object(media *m, const char *media_id, char hex[SHA256_HEX_CHARS + 1],
                       int64_t *size)
{
    char key[S3_KEY_MAX];
    if (s3_original_key(media_id, key, sizeof(key)) < 0) return -ENAMETOOLONG;
    int rc = s3_object_sha256(m, key, hex, size);
    return rc == S3_OK ? 0 : rc == S3_NOT_FOUND ? -ENOENT : -EIO;
}

static void check_item(media *m, const media_brief *it, verify_report *rep, char *buf)
{
    char path[MEDIA_PATH_MAX], hex[SHA256_HEX_CHARS + 1], detail[160];
    rep->checked++;
    int64_t size = 0;
    int rc;
    if (s3_enabled(m)) {
        rc = hash_object(m, it->media_id, hex, &size);
    } else if (store_original_path(m, it->media_id, path, sizeof(path)) < 0) {
        add_problem(rep, it->media_id, "unreadable", "path too long");
        return;
    } else {
        rc = media_hash_file(path, hex, &size, buf);
    }
    if (rc == -ENOENT) {
        add_problem(rep, it->media_id, "missing", s3_enabled(m) ? "no object in the bucket" : NULL);
    } else if (rc < 0) {
        add_problem(rep, it->media_id, "unreadable", strerror(-rc));
    } else if (size != it->size) {
        snprintf(detail, sizeof(detail), "file has %" PRId64 " bytes, row says %" PRId64, size,
                 it->size);
        add_problem(rep, it->media_id, "size", detail);
    } else if (strcmp(hex, it->sha256) != 0) {
        snprintf(detail, sizeof(detail), "file hashes to %s, row says %s", hex, it->sha256);
        add_problem(rep, it->media_id, "sha256", detail);
    }
}

int media_verify(media *m, verify_acquire_fn acquire, verify_release_fn release, void *ctx,
                 verify_report *rep, char *err, size_t errlen)
{
    memset(rep, 0, sizeof(*rep));
    rep->details = json_array();
    media_brief *items = calloc(MEDIA_ROWS_PAGE, sizeof(*items));
    char *buf = malloc(MEDIA_HASH_READ_BYTES);
    int rc = 0;
    if (!rep->details || !items || !buf) {
        snprintf(err, errlen, "out of memory");
        rc = ATRIUM_E_NOMEM;
        goto out;
    }
    char after[MEDIA_ID_MAX_CHARS + 1] = "";
    for (;;) {
        PGconn *c = acquire(ctx);
        if (!c) {
            snprintf(err, errlen, "no database connection");
            rc = ATRIUM_E_DB;
            goto out;
        }
        int n = 0;
        rc = media_rows_page(c, after, 0, items, &n, err, errlen);
        release(ctx, c);
        if (rc < 0) goto out;
        for (int i = 0; i < n; i++) check_item(m, &items[i], rep, buf);
        if (n < MEDIA_ROWS_PAGE) break;
        snprintf(after, sizeof(after), "%s", items[n - 1].media_id);
    }
out:
    free(items);
    free(buf);
    if (rc < 0) {
        json_decref(rep->details);
        rep->details = NULL;
    }
    return rc;
}
