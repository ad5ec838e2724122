/*
 * plugins/media/migrate_remote.c - `atrium media migrate`: the cached remote copies
 * (other servers' media and the origins' thumbnails of it) between the local folder and
 * the bucket, after the originals and thumbnails (migrate.c owns the run and its rules;
 * docs/adr/0032-remote-media-in-the-bucket.md the key layout).
 *
 * Every copy a row of media_remote or media_remote_thumbnails names, in file name order a
 * page at a time: to s3, skipped when its object (key = the file name) exists with the
 * row's size; else the local file is hashed against the row's SHA-256, sent and read back
 * (migrate_check_copy). To local, skipped when the file exists with the row's size; else
 * the object is hashed as it lands and named only when it matches. A copy that is on
 * neither side is no problem: it is a cache, fetched from its origin again when asked
 * for; it is counted ("absent") and listed as "absent remote <file name>".
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "migrate.h"
#include "s3.h"

#define REMOTE_PAGE 256

typedef struct remote_item {
    char file_name[MEDIA_FILE_NAME_MAX];
    char sha256[SHA256_HEX_CHARS + 1];
    int64_t size;
} remote_item;

/* Up to REMOTE_PAGE copies of table with file names after `after`. 0, or -1 with err. */
static int remote_page(migrate_run *r, const char *table, const char *after, remote_item *items,
                       int *n, char *err, size_t errlen)
{
    char sql[256];
    snprintf(sql, sizeof(sql),
             "SELECT file_name, sha256, size_bytes FROM %s WHERE file_name > $1"
             " ORDER BY file_name LIMIT %d",
             table, REMOTE_PAGE);
    const char *p[] = {after};
    PGresult *res = PQexecParams(r->db, sql, 1, NULL, p, NULL, NULL, 0);
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        snprintf(err, errlen, "cannot read %s: %s", table, PQresultErrorMessage(res));
        PQclear(res);
        return -1;
    }
    *n = PQntuples(res);
    for (int i = 0; i < *n; i++) {
        snprintf(items[i].file_name, sizeof(items[i].file_name), "%s", PQgetvalue(res, i, 0));
        snprintf(items[i].sha256, sizeof(items[i].sha256), "%s", PQgetvalue(res, i, 1));
        items[i].size = strtoll(PQgetvalue(res, i, 2), NULL, 10);
    }
    PQclear(res);
    return 0;
}

static void absent(migrate_run *r, const char *file_name)
{
    r->remote_absent++;
    printf("absent remote %s\n", file_name);
}

static int copy_to_s3(migrate_run *r, const remote_item *it, const char *key, const char *path)
{
    char hex[SHA256_HEX_CHARS + 1], detail[MEDIA_PATH_MAX + 200];
    int64_t size = -1;
    int head = s3_head_object(r->m, key, &size);
    if (head == S3_FAILED) return -1;
    if (head == S3_OK && size == it->size) {
        r->remote_present++;
        return 0;
    }
    int rc = media_hash_file(path, hex, &size, r->buf);
    if (rc == -ENOENT) { /* not here (a cache): evicted, or never read through here */
        absent(r, it->file_name);
        return 0;
    }
    if (rc < 0) {
        snprintf(detail, sizeof(detail), "cannot read %s: %s", path, strerror(-rc));
        migrate_problem(r, "remote", it->file_name, detail);
        return 0;
    }
    if (size != it->size || strcmp(hex, it->sha256) != 0) {
        snprintf(detail, sizeof(detail),
                 "the local file (%" PRId64 " bytes) differs from its row (%" PRId64
                 " bytes, SHA-256 %.12s...): not copied",
                 size, it->size, it->sha256);
        migrate_problem(r, "remote", it->file_name, detail);
        return 0;
    }
    if (s3_put_file(r->m, key, path, size) < 0) return -1; /* logged */
    return migrate_check_copy(r, "remote", it->file_name, key, it->sha256, it->size);
}

static int copy_to_local(migrate_run *r, const remote_item *it, const char *key, const char *path)
{
    struct stat st;
    if (stat(path, &st) == 0 && st.st_size == it->size) {
        r->remote_present++;
        return 0;
    }
    int rc = s3_get_file_checked(r->m, key, path, it->sha256);
    if (rc == S3_FAILED) return -1;
    if (rc == S3_OK) migrate_copied(r, "remote", it->file_name, it->size);
    else if (rc == S3_MISMATCH)
        migrate_problem(r, "remote", it->file_name,
                        "the object does not hash to its row's SHA-256: not copied");
    else
        absent(r, it->file_name);
    return 0;
}

static int walk_table(migrate_run *r, const char *table, remote_item *items, char *err,
                      size_t errlen)
{
    char after[MEDIA_FILE_NAME_MAX] = "", key[S3_KEY_MAX], path[MEDIA_PATH_MAX];
    for (;;) {
        int n = 0;
        if (remote_page(r, table, after, items, &n, err, errlen) < 0) return -1;
        for (int i = 0; i < n; i++) {
            const remote_item *it = &items[i];
            r->remote++;
            if (remote_s3_key(it->file_name, key, sizeof(key)) < 0 ||
                snprintf(path, sizeof(path), "%s/%s", r->m->cfg.store_path, it->file_name) >=
                    (int)sizeof(path)) {
                migrate_problem(r, "remote", it->file_name, "not a remote copy's name");
                continue;
            }
            int rc = r->to_s3 ? copy_to_s3(r, it, key, path) : copy_to_local(r, it, key, path);
            if (rc < 0) {
                snprintf(err, errlen, "the object store failed (see above): run migrate "
                                      "again, it goes on where it stopped");
                return -1;
            }
        }
        if (n < REMOTE_PAGE) return 0;
        snprintf(after, sizeof(after), "%s", items[n - 1].file_name);
    }
}

int migrate_remote_copies(migrate_run *r, char *err, size_t errlen)
{
    remote_item *items = calloc(REMOTE_PAGE, sizeof(*items));
    if (!items) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int rc = walk_table(r, "media_remote", items, err, errlen);
    if (rc == 0) rc = walk_table(r, "media_remote_thumbnails", items, err, errlen);
    free(items);
    return rc;
}
