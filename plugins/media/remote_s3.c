/*
 * plugins/media/remote_s3.c - storage: s3 and the remote-media cache: other servers'
 * media (and the origins' thumbnails of it) cached in the bucket, so that processes with
 * different local folders share one copy (docs/adr/0032-remote-media-in-the-bucket.md).
 *
 * Decisions owned here:
 *   - the object key of a cached copy is its row's file_name (media_remote,
 *     media_remote_thumbnails): "remote/<origin>/<id[0:2]>/<id[2:4]>/<media ID>-<random>",
 *     the origin's ':', '[' and ']' written '_' (store_remote_name), so a key needs no
 *     escaping in a URL or a signature. Every copy has a name of its own: a later copy
 *     gets another key and never overwrites an object a reader may be fetching;
 *   - a fetched copy is PUT to the bucket after its local file is durable and before its
 *     row is written (remote_fetch.c's commit): a row names only what is in the bucket, so
 *     another process that reads the row can read the copy through instead of asking the
 *     origin. A failed PUT fails the fetch (503 for its waiters; nothing recorded);
 *   - a process whose local folder lacks a copy a row names reads it through, on a
 *     plugin pool (a request-pool run is handed off to the store pool), into its local
 *     folder under the same name, hashed against the row as it lands (never torn, never
 *     wrong); a copy the bucket lacks (cached before this, or deleted) is fetched from
 *     its origin again, as a missing local file always was;
 *   - a copy whose row goes (eviction, purge, a replaced copy) loses its object too; a
 *     failed DELETE is logged and the object is left to the orphan sweep (orphans_s3.c).
 * Counted in atrium_media_store_remote_total{event} (stored, read_through, missing,
 * deleted) beside the store's request metrics (s3.c).
 *
 * What this file does not do: the fetch itself (remote_fetch.c), the cache look-up
 * (remote.c), the bound (cache.c).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "media.h"
#include "s3.h"

#define REMOTE_S3_RETRY_MS 1000 /* Retry-After when the store pool's queue is full */

enum { EV_STORED = 0, EV_READ_THROUGH, EV_MISSING, EV_DELETED };

int remote_s3_init(media *m)
{
    static const char *const EVENTS[REMOTE_S3_EVENTS] = {
        "event=\"stored\"", "event=\"read_through\"", "event=\"missing\"", "event=\"deleted\""};
    if (!s3_enabled(m)) return 0;
    for (int i = 0; i < REMOTE_S3_EVENTS; i++) {
        m->m_store_remote[i] = m->h->metric_counter(
            m->self, "atrium_media_store_remote_total", EVENTS[i],
            "Remote media copies and the bucket: stored (PUT before the row), read_through "
            "(into this local folder), missing (a row without its object: fetched again), "
            "deleted (with their rows)");
        if (!m->m_store_remote[i]) return ATRIUM_E_NOMEM;
    }
    return 0;
}

static void count(media *m, int event)
{
    if (m->m_store_remote[event]) m->h->metric_add(m->m_store_remote[event], 1);
}

/* The rule: a copy's object key is its row's file_name (checked to be one). */
int remote_s3_key(const char *file_name, char *out, size_t cap)
{
    if (strncmp(file_name, "remote/", 7) != 0 || strstr(file_name, "..")) return ATRIUM_E_INVAL;
    int n = snprintf(out, cap, "%s", file_name);
    return n < 0 || (size_t)n >= cap ? ATRIUM_E_INVAL : 0;
}

int remote_s3_put(media *m, const char *file_name, const char *path, int64_t size)
{
    if (!s3_enabled(m)) return 0;
    char key[S3_KEY_MAX];
    if (remote_s3_key(file_name, key, sizeof(key)) < 0) return -1;
    if (s3_put_file(m, key, path, size) < 0) { /* logged */
        m->h->log(m->self, ATRIUM_LOG_ERROR,
                  "remote media copy %s not stored: the bucket refused it (see above)", key);
        return -1;
    }
    count(m, EV_STORED);
    return 0;
}

void remote_s3_forget(media *m, const char *file_name)
{
    char key[S3_KEY_MAX];
    if (!s3_enabled(m) || !file_name[0] || remote_s3_key(file_name, key, sizeof(key)) < 0) return;
    if (s3_delete_object(m, key) == 0)
        count(m, EV_DELETED);
    else
        m->h->log(m->self, ATRIUM_LOG_WARN,
                  "remote media copy %s stays in the bucket until the orphan sweep", key);
}

bool remote_s3_in_bucket(media *m, const media_row *row)
{
    char key[S3_KEY_MAX];
    int64_t size = -1;
    return s3_enabled(m) && remote_s3_key(row->file_name, key, sizeof(key)) == 0 &&
           s3_head_object(m, key, &size) == S3_OK && size == row->size_bytes;
}

/* [pool] Read the copy row names into path: LOOKUP_HIT, LOOKUP_MISS (not in the bucket:
 * fetch it from its origin), or ATRIUM_DONE with 503 (the store failed). */
static int read_through(media *m, atrium_req *req, const media_row *row, const char *path)
{
    char key[S3_KEY_MAX];
    if (remote_s3_key(row->file_name, key, sizeof(key)) < 0) return LOOKUP_MISS;
    int rc = s3_get_file_checked(m, key, path, row->sha256[0] ? row->sha256 : NULL);
    if (rc == S3_OK) {
        count(m, EV_READ_THROUGH);
        return LOOKUP_HIT;
    }
    if (rc == S3_FAILED) {
        m->h->respond_error(req, 503, "M_UNKNOWN", "The media store is unreachable; retry later");
        return ATRIUM_DONE;
    }
    count(m, EV_MISSING);
    m->h->log(m->self, ATRIUM_LOG_INFO,
              "remote media copy %s: %s in the bucket; fetching it from its origin again", key,
              rc == S3_MISMATCH ? "another content" : "not");
    return LOOKUP_MISS;
}

int remote_s3_present(media *m, atrium_req *req, const media_row *row, const char *path)
{
    const atrium_host *h = m->h;
    if (access(path, F_OK) == 0) return LOOKUP_HIT;
    if (!s3_enabled(m) || !row->file_name[0]) return LOOKUP_MISS;
    if (h->req_run_reason(req) == ATRIUM_RUN_HANDOFF) /* a plugin pool: it may wait */
        return read_through(m, req, row, path);
    int rc = h->handoff(req, m->store_pool, NULL, 0); /* never on the request pool */
    if (rc == 0) return ATRIUM_HANDED_OFF;
    if (rc == ATRIUM_E_LIMIT)
        h->respond_limited(req, REMOTE_S3_RETRY_MS,
                           "Too many downloads are waiting for the media store; retry");
    else
        h->respond_error(req, 503, "M_UNKNOWN", "The server is stopping");
    return ATRIUM_DONE;
}
