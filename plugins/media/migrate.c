/*
 * plugins/media/migrate.c - `atrium media migrate --to s3|local` (the program
 * atrium-media-migrate, migrate_cli.c): copies a library between the local folder
 * (store_path) and the object store while the server keeps running.
 * Decisions: docs/adr/0027-moving-a-media-library-between-stores.md; the operator's
 * procedure: plugins/media/README.md, "Moving a library".
 *
 * Decisions owned here:
 *   - what moves: every uploaded original (the rows of media_local, in media ID order, a
 *     page at a time), every thumbnail file (thumbnails/<sha256>/... both sides), and every
 *     cached remote copy a row names (migrate_remote.c, docs/adr/0032-remote-media-in-the-bucket.md);
 *   - resumption is the destination itself: an object (to s3) or a file (to local) that
 *     exists with the row's size is done and skipped, so a run killed anywhere is run again
 *     and goes on; nothing is recorded elsewhere. Both sides only ever show whole objects
 *     and files: an S3 PUT or a completed multipart upload is atomic, and a local file is
 *     named only once complete and fsynced (store_tmp_commit). A multipart upload a
 *     killed run left open is aborted by the next run (and by the server's orphan sweep),
 *     once older than orphan_min_age_ms;
 *   - every copy is checked against the row's SHA-256: to s3, the local file is hashed
 *     before it is sent (a damaged file is reported, never copied) and the object is read
 *     back whole and hashed (a mismatch is reported and the object deleted, so the next run
 *     sends it again); to local, the object is hashed as it lands and the file named only
 *     when it matches. Thumbnails have no row: to s3 the read-back is compared with the
 *     local file's hash, to local the size with the listing's;
 *   - uploads during the run: after the walk of every row, the rows uploaded since the run
 *     began (less MIGRATE_CATCHUP_MARGIN_MS, for a row whose upload time was taken before
 *     its commit) are walked again, until a walk copies nothing (at most
 *     MIGRATE_CATCHUP_ROUNDS). What arrives later is the next run's: the procedure runs
 *     migrate once more after the switch;
 *   - one object at a time, on this thread: the store's requests are bounded as in the
 *     server (s3_timeout_ms each, s3.c). A store or database that fails stops the run
 *     (exit 2: run it again); a problem with one original is listed and the run goes on.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "migrate.h"
#include "s3.h"

#define MIGRATE_CATCHUP_MARGIN_MS (10LL * 60 * 1000)
#define MIGRATE_CATCHUP_ROUNDS 5
#define MIGRATE_THUMB_DEPTH 4 /* thumbnails/<a>/<b>/<sha256>/<file> */

void migrate_problem(migrate_run *r, const char *kind, const char *name, const char *detail)
{
    r->problems++;
    printf("problem %s %s: %s\n", kind, name, detail);
}

void migrate_copied(migrate_run *r, const char *kind, const char *name, int64_t size)
{
    if (strcmp(kind, "original") == 0) r->copied++;
    else if (strcmp(kind, "remote") == 0) r->remote_copied++;
    else r->thumbs_copied++;
    r->bytes += size;
    printf("copied %s %s %" PRId64 "\n", kind, name, size);
}

/* Was the media deleted while the run went on? (A missing file is then no problem.) */
static bool row_gone(migrate_run *r, const char *media_id)
{
    const char *p[] = {media_id};
    PGresult *res = PQexecParams(r->db, "SELECT 1 FROM media_local WHERE media_id = $1", 1,
                                 NULL, p, NULL, NULL, 0);
    bool gone = PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 0;
    PQclear(res);
    return gone;
}

int migrate_check_copy(migrate_run *r, const char *kind, const char *name, const char *key,
                      const char *want_hex, int64_t want_size)
{
    char got[SHA256_HEX_CHARS + 1];
    int64_t got_size = -1;
    int rc = s3_object_sha256(r->m, key, got, &got_size);
    if (rc == S3_FAILED) return -1;
    if (rc == S3_NOT_FOUND || got_size != want_size || strcmp(got, want_hex) != 0) {
        migrate_problem(r, kind, name,
                "the object read back differs from what was sent: deleted, run again");
        s3_delete_object(r->m, key);
        return 0;
    }
    migrate_copied(r, kind, name, want_size);
    return 0;
}

static int original_to_s3(migrate_run *r, const media_brief *it)
{
    char key[S3_KEY_MAX], path[MEDIA_PATH_MAX], hex[SHA256_HEX_CHARS + 1];
    char detail[MEDIA_PATH_MAX + 200];
    if (s3_original_key(it->media_id, key, sizeof(key)) < 0 ||
        store_original_path(r->m, it->media_id, path, sizeof(path)) < 0) {
        migrate_problem(r, "original", it->media_id, "its name is too long");
        return 0;
    }
    int64_t size = -1;
    int head = s3_head_object(r->m, key, &size);
    if (head == S3_FAILED) return -1;
    if (head == S3_OK && size == it->size) {
        if (!r->catching_up) r->present++;
        return 0;
    }
    int rc = media_hash_file(path, hex, &size, r->buf);
    if (rc == -ENOENT && row_gone(r, it->media_id)) return 0; /* deleted meanwhile */
    if (rc < 0) {
        snprintf(detail, sizeof(detail), "cannot read %s: %s", path, strerror(-rc));
        migrate_problem(r, "original", it->media_id, detail);
        return 0;
    }
    if (size != it->size || strcmp(hex, it->sha256) != 0) {
        snprintf(detail, sizeof(detail),
                 "the local file (%" PRId64 " bytes, SHA-256 %.12s...) differs from its row "
                 "(%" PRId64 " bytes, %.12s...): not copied",
                 size, hex, it->size, it->sha256);
        migrate_problem(r, "original", it->media_id, detail);
        return 0;
    }
    if (s3_put_file(r->m, key, path, size) < 0) return -1; /* logged */
    return migrate_check_copy(r, "original", it->media_id, key, it->sha256, it->size);
}

static int original_to_local(migrate_run *r, const media_brief *it)
{
    char key[S3_KEY_MAX], path[MEDIA_PATH_MAX], detail[200];
    if (s3_original_key(it->media_id, key, sizeof(key)) < 0 ||
        store_original_path(r->m, it->media_id, path, sizeof(path)) < 0) {
        migrate_problem(r, "original", it->media_id, "its name is too long");
        return 0;
    }
    struct stat st;
    if (stat(path, &st) == 0) {
        if (st.st_size == it->size) {
            if (!r->catching_up) r->present++;
        } else {
            snprintf(detail, sizeof(detail),
                     "the local file has %lld bytes, its row says %" PRId64
                     ": remove it and run again",
                     (long long)st.st_size, it->size);
            migrate_problem(r, "original", it->media_id, detail);
        }
        return 0;
    }
    int rc = s3_get_file_checked(r->m, key, path, it->sha256);
    if (rc == S3_FAILED) return -1;
    if (rc == S3_OK) migrate_copied(r, "original", it->media_id, it->size);
    else if (rc == S3_MISMATCH)
        migrate_problem(r, "original", it->media_id,
                "the object does not hash to its row's SHA-256: not copied");
    else if (!row_gone(r, it->media_id))
        migrate_problem(r, "original", it->media_id, "no object in the bucket");
    return 0;
}

/* Every uploaded original with uploaded_ts >= since, in media ID order. 0, or -1 when the
 * database or the store failed (err set, or logged). */
static int walk_originals(migrate_run *r, int64_t since, char *err, size_t errlen)
{
    media_brief *items = calloc(MEDIA_ROWS_PAGE, sizeof(*items));
    if (!items) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    char after[MEDIA_ID_MAX_CHARS + 1] = "";
    int rc = 0;
    for (;;) {
        int n = 0;
        if (media_rows_page(r->db, after, since, items, &n, err, errlen) < 0) {
            rc = -1;
            break;
        }
        for (int i = 0; i < n && rc == 0; i++) {
            if (!r->catching_up) r->originals++;
            rc = r->to_s3 ? original_to_s3(r, &items[i]) : original_to_local(r, &items[i]);
        }
        if (rc < 0) {
            snprintf(err, errlen, "the object store failed (see above): run migrate again, it "
                                  "goes on where it stopped");
            break;
        }
        if (n < MEDIA_ROWS_PAGE) break;
        snprintf(after, sizeof(after), "%s", items[n - 1].media_id);
    }
    free(items);
    return rc;
}

/* ---- thumbnails ------------------------------------------------------------------------ */

static int thumb_to_s3(migrate_run *r, const char *path)
{
    char key[S3_KEY_MAX], hex[SHA256_HEX_CHARS + 1], detail[MEDIA_PATH_MAX + 200];
    if (s3_thumbnail_key(path, key, sizeof(key)) < 0) return 0; /* not a thumbnail's place */
    r->thumbs++;
    int64_t size = -1, local = -1;
    int head = s3_head_object(r->m, key, &size);
    if (head == S3_FAILED) return -1;
    int rc = media_hash_file(path, hex, &local, r->buf);
    if (rc == -ENOENT) return 0; /* removed meanwhile (its media deleted) */
    if (rc < 0) {
        snprintf(detail, sizeof(detail), "cannot read %s: %s", path, strerror(-rc));
        migrate_problem(r, "thumbnail", key, detail);
        return 0;
    }
    if (head == S3_OK && size == local) {
        r->thumbs_present++;
        return 0;
    }
    if (s3_put_file(r->m, key, path, local) < 0) return -1;
    return migrate_check_copy(r, "thumbnail", key, key, hex, local);
}

/* The files under dir, depth folders down (thumbnails/<a>/<b>/<sha256>/<file>). */
static int walk_thumbs(migrate_run *r, const char *dir, int depth)
{
    DIR *d = opendir(dir);
    if (!d) {
        if (errno != ENOENT && errno != ENOTDIR) migrate_problem(r, "thumbnail", dir, strerror(errno));
        return 0;
    }
    int rc = 0;
    struct dirent *e;
    char path[MEDIA_PATH_MAX];
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue; /* ".", "..", and .tmp- files being written */
        if (snprintf(path, sizeof(path), "%s/%s", dir, e->d_name) >= (int)sizeof(path)) continue;
        if (depth > 1) rc = walk_thumbs(r, path, depth - 1);
        else rc = thumb_to_s3(r, path);
    }
    closedir(d);
    return rc;
}

/* One object of the listing under thumbnails/, to the local folder. */
static int thumb_to_local(void *arg, const char *key, int64_t size)
{
    migrate_run *r = arg;
    char dir[MEDIA_PATH_MAX], path[MEDIA_PATH_MAX], sha[SHA256_HEX_CHARS + 1];
    const char *rest = key + strlen("thumbnails/");
    const char *slash = strchr(rest, '/');
    if (!slash || slash - rest != SHA256_HEX_CHARS || strchr(slash + 1, '/') || !slash[1])
        return 0; /* not a key the plugin writes */
    memcpy(sha, rest, SHA256_HEX_CHARS);
    sha[SHA256_HEX_CHARS] = '\0';
    r->thumbs++;
    if (store_thumb_dir(r->m, sha, dir, sizeof(dir)) < 0 ||
        snprintf(path, sizeof(path), "%s/%s", dir, slash + 1) >= (int)sizeof(path)) {
        migrate_problem(r, "thumbnail", key, "its name is too long");
        return 0;
    }
    struct stat st;
    if (stat(path, &st) == 0 && st.st_size == size) {
        r->thumbs_present++;
        return 0;
    }
    int rc = s3_get_file(r->m, key, path);
    if (rc == S3_FAILED) return -1;
    if (rc == S3_NOT_FOUND) return 0; /* deleted since the listing */
    if (stat(path, &st) != 0 || st.st_size != size)
        migrate_problem(r, "thumbnail", key, "the local file differs from the bucket's size");
    else
        migrate_copied(r, "thumbnail", key, size);
    return 0;
}

static int move_thumbnails(migrate_run *r, char *err, size_t errlen)
{
    int rc;
    if (r->to_s3) {
        char dir[MEDIA_PATH_MAX];
        snprintf(dir, sizeof(dir), "%s/thumbnails", r->m->cfg.store_path);
        rc = walk_thumbs(r, dir, MIGRATE_THUMB_DEPTH);
    } else {
        rc = s3_list(r->m, "thumbnails/", thumb_to_local, r);
    }
    if (rc < 0)
        snprintf(err, errlen, "the object store failed (see above): run migrate again, it "
                              "goes on where it stopped");
    return rc;
}

int migrate_library(migrate_run *r, char *err, size_t errlen)
{
    r->buf = malloc(MEDIA_HASH_READ_BYTES);
    if (!r->buf) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int64_t started = r->m->h->wall_ms();
    /* Parts a killed run (or a crashed upload) left open, as the server's sweep would. */
    if (r->to_s3) s3_multipart_sweep(r->m, started - r->m->cfg.orphan_min_age_ms);
    int rc = walk_originals(r, 0, err, errlen);
    r->catching_up = true;
    for (int round = 0; rc == 0 && round < MIGRATE_CATCHUP_ROUNDS; round++) {
        int64_t before = r->copied;
        rc = walk_originals(r, started - MIGRATE_CATCHUP_MARGIN_MS, err, errlen);
        if (r->copied == before) break;
    }
    r->catching_up = false;
    if (rc == 0) rc = move_thumbnails(r, err, errlen);
    if (rc == 0) rc = migrate_remote_copies(r, err, errlen);
    free(r->buf);
    r->buf = NULL;
    return rc;
}
