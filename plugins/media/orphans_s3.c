/*
 * plugins/media/orphans_s3.c - storage: s3: objects in the bucket that no row names (the
 * orphan sweep's second half; orphans.c walks the local folder and calls this).
 *
 * What leaves such objects: a process killed between an original's PUT and its row's
 * commit (never acknowledged), a thumbnail PUT while its media was being deleted, a
 * remote copy whose row was evicted or purged while its DELETE failed, a copy PUT just
 * before its fetch's row could not be written. Nothing acknowledged is among them, but
 * the store keeps (and bills) them forever.
 *
 * Decisions owned here:
 *   - the bucket is listed a page at a time (ListObjectsV2, continuation tokens), under
 *     each prefix the plugin writes (originals/, thumbnails/, remote/), never whole in
 *     memory; keys are checked against the database ORPHAN_S3_BATCH at a time, one
 *     statement on a connection borrowed for it alone;
 *   - an object goes only when its LastModified (the store's clock) is older than
 *     orphan_min_age_ms AND no row names it: originals/<media ID> a media_local row (or
 *     only an expired reservation, as for local files), thumbnails/<sha256>/... a
 *     media_local or media_remote row of that content, remote/... a media_remote or
 *     media_remote_thumbnails row of that file name. An object appears only when its PUT
 *     or its multipart upload completes, and the row is committed at most s3_timeout_ms
 *     and the commit's bounded waits later; a running upload writes no object at all
 *     until then (its parts are not objects: s3_multipart_sweep's), so the age rule never
 *     takes one a running upload is writing;
 *   - a failure to list or to read the rows ends this sweep (logged); the next goes on.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "media.h"
#include "s3.h"
#include "s3_call.h"

#define ORPHAN_S3_BATCH 256
#define ORPHAN_S3_LIST_BODY_MAX (512 * 1024) /* one ListObjectsV2 answer (1000 keys) */

enum prefix_kind { P_ORIGINALS = 0, P_THUMBNAILS, P_REMOTE };

typedef struct s3_sweep {
    media *m;
    int kind; /* enum prefix_kind */
    int64_t cutoff_ms;
    size_t n;
    char key[ORPHAN_S3_BATCH][S3_KEY_MAX];
    char name[ORPHAN_S3_BATCH][S3_KEY_MAX]; /* what the rows hold: ID, hash, file name */
    long removed;
    bool failed;
} s3_sweep;

/* "2026-01-02T03:04:05.678Z" (ListObjectsV2's LastModified) in ms since the epoch; -1
 * when it is not that. */
static int64_t iso8601_ms(const char *s)
{
    struct tm tm;
    memset(&tm, 0, sizeof(tm));
    int ms = 0;
    if (sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
               &tm.tm_min, &tm.tm_sec) != 6)
        return -1;
    const char *dot = strchr(s, '.');
    if (dot) ms = atoi(dot + 1) % 1000;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    time_t t = timegm(&tm);
    return t < 0 ? -1 : (int64_t)t * 1000 + ms;
}

/* What a key's row would hold (its media ID, content hash or file name): false for a key
 * the plugin does not write (left alone). */
static bool name_of(int kind, const char *key, char *out, size_t cap)
{
    if (kind == P_ORIGINALS) {
        const char *id = key + strlen("originals/");
        return media_id_valid(id) && snprintf(out, cap, "%s", id) < (int)cap;
    }
    if (kind == P_THUMBNAILS) {
        const char *sha = key + strlen("thumbnails/");
        const char *slash = strchr(sha, '/');
        if (!slash || slash - sha != SHA256_HEX_CHARS) return false;
        snprintf(out, cap, "%.*s", SHA256_HEX_CHARS, sha);
        return true;
    }
    return remote_s3_key(key, out, cap) == 0;
}

/* Flags of the batch's names some row still wants. 0, or ATRIUM_E_DB / ATRIUM_E_NOMEM. */
static int rows_present(s3_sweep *s, bool *present)
{
    const atrium_host *h = s->m->h;
    size_t cap = s->n * (S3_KEY_MAX + 3) + 3, len = 0;
    char *arr = malloc(cap);
    if (!arr) return ATRIUM_E_NOMEM;
    arr[len++] = '{';
    /* Quoted; the names are [A-Za-z0-9_./-] (IDs, hex, remote file names): no escaping. */
    for (size_t i = 0; i < s->n; i++)
        len += (size_t)snprintf(arr + len, cap - len, "%s\"%s\"", i ? "," : "", s->name[i]);
    snprintf(arr + len, cap - len, "}");
    static const char *const SQL[] = {
        [P_ORIGINALS] = "SELECT media_id FROM media_local WHERE media_id = ANY($1::text[])"
                        " AND NOT (uploaded_ts IS NULL AND expires_ts IS NOT NULL"
                        " AND expires_ts < $2::bigint)",
        [P_THUMBNAILS] = "SELECT sha256 FROM media_local WHERE sha256 = ANY($1::text[])"
                         " AND $2::bigint IS NOT NULL"
                         " UNION SELECT sha256 FROM media_remote WHERE sha256 = ANY($1::text[])",
        [P_REMOTE] = "SELECT file_name FROM media_remote WHERE file_name = ANY($1::text[])"
                     " AND $2::bigint IS NOT NULL UNION SELECT file_name FROM"
                     " media_remote_thumbnails WHERE file_name = ANY($1::text[])",
    };
    char cutoff[24];
    snprintf(cutoff, sizeof(cutoff), "%lld", (long long)s->cutoff_ms);
    const char *p[] = {arr, cutoff};
    PGconn *c = h->db_acquire(MEDIA_DB_WAIT_MS);
    PGresult *res = c ? PQexecParams(c, SQL[s->kind], 2, NULL, p, NULL, NULL, 0) : NULL;
    int rc = res && PQresultStatus(res) == PGRES_TUPLES_OK ? 0 : ATRIUM_E_DB;
    if (rc < 0 && c)
        h->log(s->m->self, ATRIUM_LOG_WARN, "orphan sweep of the bucket: cannot read rows: %s",
               PQerrorMessage(c));
    for (int r = 0; rc == 0 && r < PQntuples(res); r++)
        for (size_t i = 0; i < s->n; i++)
            if (strcmp(PQgetvalue(res, r, 0), s->name[i]) == 0) present[i] = true;
    PQclear(res);
    if (c) h->db_release(c);
    free(arr);
    return rc;
}

/* Check the batch, then DELETE what no row names. */
static void flush(s3_sweep *s)
{
    if (s->n == 0 || s->failed) return;
    bool present[ORPHAN_S3_BATCH] = {false};
    if (rows_present(s, present) < 0) {
        s->failed = true;
        return;
    }
    for (size_t i = 0; i < s->n; i++) {
        if (present[i]) continue;
        if (s3_delete_object(s->m, s->key[i]) < 0) { /* logged */
            s->failed = true;
            break;
        }
        s->removed++;
        s->m->h->log(s->m->self, ATRIUM_LOG_INFO, "orphan sweep: object %s (no row) deleted",
                     s->key[i]);
    }
    s->n = 0;
}

/* One page's <Contents>: the old enough keys the plugin writes join the batch. */
static void take_page(s3_sweep *s, const char *body)
{
    char key[S3_KEY_MAX], modified[64];
    for (const char *p = body; !s->failed && (p = strstr(p, "<Contents>")) != NULL; p += 10) {
        const char *end = strstr(p, "</Contents>");
        if (!s3_xml_text(p, end, "Key", key, sizeof(key)) ||
            !s3_xml_text(p, end, "LastModified", modified, sizeof(modified)))
            continue;
        int64_t at = iso8601_ms(modified);
        if (at < 0 || at >= s->cutoff_ms) continue; /* young (or unreadable): stays */
        if (!name_of(s->kind, key, s->name[s->n], sizeof(s->name[s->n]))) continue;
        snprintf(s->key[s->n], sizeof(s->key[s->n]), "%s", key);
        if (++s->n == ORPHAN_S3_BATCH) flush(s);
    }
}

/* Every page under prefix. */
static void sweep_prefix(s3_sweep *s, const char *prefix, char *body)
{
    char token[S3_KEY_MAX * 2] = "", token_esc[S3_KEY_MAX * 6], query[S3_KEY_MAX * 8];
    char truncated[8];
    do {
        /* Names in byte order: the signature's canonical query (s3_call.h). */
        if (token[0] && s3_query_escape(token, token_esc, sizeof(token_esc)) == 0)
            snprintf(query, sizeof(query), "continuation-token=%s&list-type=2&prefix=%s",
                     token_esc, prefix);
        else
            snprintf(query, sizeof(query), "list-type=2&prefix=%s", prefix);
        s3_call call = {.kind = S3_KIND_LIST, .query = query, .out_fd = -1, .resp = body,
                        .resp_cap = ORPHAN_S3_LIST_BODY_MAX};
        if (s3_perform(s->m, &call) != S3_OUT_OK || call.resp_truncated) {
            s3_log_failure(s->m, &call, "ListObjectsV2");
            s->failed = true;
            return;
        }
        take_page(s, body);
        token[0] = '\0';
        if (s3_xml_text(body, NULL, "IsTruncated", truncated, sizeof(truncated)) &&
            strcmp(truncated, "true") == 0 &&
            !s3_xml_text(body, NULL, "NextContinuationToken", token, sizeof(token)))
            s->failed = true; /* a truncated answer without its token: cannot go on */
    } while (!s->failed && token[0]);
    flush(s);
}

long orphans_s3_sweep(media *m, int64_t cutoff_ms)
{
    if (!s3_enabled(m)) return 0;
    s3_sweep *s = calloc(1, sizeof(*s));
    char *body = malloc(ORPHAN_S3_LIST_BODY_MAX);
    long removed = -1;
    if (s && body) {
        s->m = m;
        s->cutoff_ms = cutoff_ms;
        /* Prefixes are plain: already in the query's escaped form ('/' is %2F). */
        static const char *const PREFIXES[] = {
            [P_ORIGINALS] = "originals%2F", [P_THUMBNAILS] = "thumbnails%2F",
            [P_REMOTE] = "remote%2F"};
        for (int k = P_ORIGINALS; k <= P_REMOTE && !s->failed; k++) {
            s->kind = k;
            s->n = 0;
            sweep_prefix(s, PREFIXES[k], body);
        }
        removed = s->removed;
        if (s->failed)
            m->h->log(m->self, ATRIUM_LOG_WARN,
                      "orphan sweep of the bucket stopped after %ld object(s) (see above); the "
                      "next sweep goes on", removed);
    }
    free(body);
    free(s);
    return removed;
}
