/*
 * plugins/media/s3.h - media on an S3-compatible object store (plugins.media.storage: s3):
 * the settings check, the start-up look at the bucket, the requests the plugin makes
 * (HEAD bucket or object, PUT object, GET object into the local folder), and the local
 * folder's byte bound (s3_cache.c). Decisions:
 * docs/adr/0011-media-on-an-object-store.md; key layout: plugins/media/README.md.
 *
 * Every function that talks to the store blocks for at most s3_timeout_ms (plus the wait
 * for one of s3_max_concurrent request slots, bounded the same way): call them only on the
 * plugin's own pools (io, render, store) or in start(), never on a request-pool thread.
 */
#ifndef MEDIA_S3_H
#define MEDIA_S3_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct media media;
typedef struct media_s3 media_s3;

/* What s3_get_file answers. */
enum s3_result {
    S3_OK = 0,
    S3_NOT_FOUND = 1, /* the store has no such object */
    S3_FAILED = 2,    /* unreachable, timed out, refused, or a local write failed (logged) */
    S3_MISMATCH = 3,  /* s3_get_file_checked: the object's bytes hash to something else */
};

#define S3_KEY_MAX 320 /* an object key, with its NUL */

/* [init] Check the s3 settings (after config_load) and read the secret file; logs one line
 * naming the setting and returns ATRIUM_E_INVAL when they do not make sense. With
 * storage: local, only checks that storage is "local" or "s3". */
int s3_settings_check(media *m);
/* [init] The secret, the metrics and the store pool (storage: s3 only). */
int s3_init(media *m);
/* The store client alone, whatever storage says (the plugin's commands, migrate_cli.c):
 * checks the store's settings, reads the secret, makes the metrics; no pool. 0, or
 * ATRIUM_E_INVAL / ATRIUM_E_NOMEM after logging why. s3_fini frees it. */
int s3_client_init(media *m);
/* [start] HEAD the bucket: 0, or one line saying what is wrong (no such bucket, refused
 * credentials, unreachable) and ATRIUM_E_INVAL, so the server refuses to start. */
int s3_start(media *m);
void s3_fini(media *m);
/* Is storage: s3 configured? */
bool s3_enabled(const media *m);

/* The object key of a local original (plugins/media/README.md): "originals/<media ID>". */
int s3_original_key(const char *media_id, char *out, size_t cap);
/* [pool] PUT the file at path (size bytes) as key. 0, or -1 (logged, counted). */
int s3_put_file(media *m, const char *key, const char *path, int64_t size);
/* [pool] GET key into the local folder at final_path, durably and atomically (a reader
 * never sees a torn file). enum s3_result. */
int s3_get_file(media *m, const char *key, const char *final_path);
/* [pool] The same, and the file is named only when the bytes read hash to want_sha256
 * (hex; NULL: not checked): else S3_MISMATCH and nothing is left. */
int s3_get_file_checked(media *m, const char *key, const char *final_path,
                        const char *want_sha256);
/* [pool] Read key back whole and hash it (nothing is written): S3_OK with hex and *size,
 * S3_NOT_FOUND, S3_FAILED (logged). */
int s3_object_sha256(media *m, const char *key, char hex[65], int64_t *size);
/* Called by s3_list for each object: 0 to go on, anything else stops the listing and is
 * returned by s3_list. */
typedef int (*s3_list_fn)(void *arg, const char *key, int64_t size);
/* [pool] Every object whose key starts with prefix, a page (ListObjectsV2) at a time. 0,
 * -1 when a page could not be had (logged), or what fn returned to stop. */
int s3_list(media *m, const char *prefix, s3_list_fn fn, void *arg);
/* The object key of the thumbnail whose local file is path (store_thumb_path):
 * "thumbnails/<sha256>/<W>x<H>-<method>[-anim].webp". 0, or ATRIUM_E_INVAL. */
int s3_thumbnail_key(const char *path, char *out, size_t cap);
/* [pool] The thumbnail whose local file is path, read through from the bucket into it
 * (durably, never torn). S3_OK (counted: source="bucket"), S3_NOT_FOUND, S3_FAILED. */
int s3_thumbnail_fetch(media *m, const char *path);
/* [pool] A thumbnail just rendered to path: counted (source="render") and PUT to the
 * bucket. A failed PUT is logged only: the local file serves, others render again. */
void s3_thumbnail_store(media *m, const char *path);
/* [pool] DELETE key (a missing object is no failure). 0, or -1 (logged). */
int s3_delete_object(media *m, const char *key);
/* [pool] Delete every object whose key starts with prefix (ListObjectsV2, then a DELETE
 * each; at most S3_DELETE_PREFIX_MAX). Returns how many went, or -1 (logged). */
long s3_delete_prefix(media *m, const char *prefix);

/* [any] Is the original at path in the local folder? Counted as a cache hit or miss; a hit
 * is recorded as a use (s3_cache_touch). (s3_cache.c) */
bool s3_original_cached(media *m, const char *path);
/* [any] Count bytes read from the store (atrium_media_store_bytes_total{direction="down"}). */
void s3_count_down(media *m, int64_t bytes);
/* [any] Count an original asked of the local folder: found (hit) or read through. */
void s3_count_cache(media *m, bool hit);
/* [pool] HEAD key: S3_OK with *size its Content-Length (-1 unknown), S3_NOT_FOUND, or
 * S3_FAILED (logged). */
int s3_head_object(media *m, const char *key, int64_t *size);
/* [pool] Fetch the original of media_id from the store to path in the local folder
 * (unless it is there now). enum s3_result; S3_NOT_FOUND is logged (a row without its
 * object). (s3_cache.c) */
int s3_fetch_original(media *m, const char *media_id, const char *path);

/* ---- s3_multipart.c: originals above s3_part_size_bytes, and leftover uploads ---------- */

/* [pool] PUT size bytes of fd (read with pread) as key in parts: Create, UploadPart each,
 * Complete; on any failure the upload is aborted. 0, or -1 (logged, counted). */
int s3_multipart_put(media *m, const char *key, int fd, int64_t size);
/* [pool] Abort the multipart uploads under originals/ initiated before cutoff_ms (wall
 * clock, ms since the epoch): what a crash or a failed abort left. Returns how many were
 * aborted, or -1 when the store could not be listed (logged). */
long s3_multipart_sweep(media *m, int64_t cutoff_ms);

/* ---- s3_cache.c: the local folder as a byte-bounded cache of the bucket ---------------- */

/* [init] Its metrics and its one-worker pool (storage: s3 only). */
int s3_cache_init(media *m);
/* [start] Count the folder (and evict, past local_cache_max_bytes) on the cache pool;
 * schedule the check on the plugin's timer. */
int s3_cache_start(media *m);
void s3_cache_fini(media *m);
/* [any] The original at path is used now: true when it is in the local folder (its mtime
 * then says "used within S3_CACHE_TOUCH_EVERY_MS" and eviction leaves it for at least
 * S3_CACHE_MIN_AGE_MS), false when it is not (read it through). Cheap: a stat, and a
 * utimensat at most once per S3_CACHE_TOUCH_EVERY_MS per file. */
bool s3_cache_touch(media *m, const char *path);
/* [any] An original of `bytes` landed in the local folder (an upload in the bucket, or a
 * read-through): counted; past the bound, an eviction pass is queued (never run here). */
void s3_cache_added(media *m, int64_t bytes);

/* ---- s3_stream.c: a miss streamed to the client as it arrives from the store ----------- */

typedef struct atrium_req atrium_req;
typedef struct media_req media_req;
/* [init] Its table and metrics (storage: s3 only); s3_stream_fini frees them. */
int s3_stream_init(media *m);
void s3_stream_fini(media *m);
/* [req] A GET of an original missing from the local folder (st->row set; path its local
 * file): start the store's GET of it on the store pool, or follow the one under way (a
 * range: a ranged GET of start..start+len-1 of its own, not cached), and wait (no thread
 * waits) until it has bytes to release. MEDIA_GO: answer with s3_stream_respond now; else
 * the outcome to return (parked; or answered: 404 no object, 503, 504, 429). Call it again
 * on every run until it returns MEDIA_GO. */
int s3_stream_miss(media *m, atrium_req *req, media_req *st, const char *path, bool ranged,
                   uint64_t start, uint64_t len);
/* [req] After s3_stream_miss's MEDIA_GO: answer status with the bytes as they arrive (the
 * fetch's size as Content-Length; cut short if the fetch fails). 0 or an ATRIUM_E_ code. */
int s3_stream_respond(media *m, atrium_req *req, media_req *st, int status, const char *type);

/* ---- s3_upstream.c: an upload sent as a multipart upload while its body arrives -------- */

typedef struct s3_upstream s3_upstream;
/* [init] Its metrics (storage: s3 only). */
int s3_upstream_init(media *m);
#define S3_STREAM_PARTS_MAX 10000 /* S3's most parts in one upload (s3_call.h's S3_PARTS_MAX) */
/* [any] The multipart upload of originals/<media_id>, begun at its first part. NULL when
 * out of memory. Ended by s3_upstream_drop, once. */
s3_upstream *s3_upstream_start(media *m, const char *media_id);
/* [any] The next part: len bytes of fd from its start (fd is the upload's now: closed once
 * sent or dropped). Sent in order by a store worker. 0, or -1: the upload failed (answer
 * 503). */
int s3_upstream_push(s3_upstream *u, int fd, int64_t len);
/* [pool] The last part was pushed: wait for the parts to be sent, then Complete. 0 (the
 * object exists), or -1 (logged; the multipart upload aborted). */
int s3_upstream_finish(s3_upstream *u);
/* [any] The upload ends (after finish, or without): one not completed is aborted (on a
 * store worker). Frees u once its sender is done. */
void s3_upstream_drop(s3_upstream *u);

/* download.c: storage: s3 - fetch an original missing from the local folder on a store
 * pool worker (the request is handed off), then go on. MEDIA_GO or what to return. Also
 * used by thumbnail.c for an original served as its own thumbnail. */
typedef struct media_row media_row;
int download_read_through(media *m, atrium_req *req, const media_row *row, const char *path);

/* ---- remote_s3.c: storage: s3 - remote copies in the bucket ------------------------------ */

/* [init] Its metrics (storage: s3 only). 0 or ATRIUM_E_NOMEM. */
int remote_s3_init(media *m);
/* The object key of a cached copy: its row's file_name ("remote/..."). 0, or
 * ATRIUM_E_INVAL when file_name is not a remote copy's name or out is too small. */
int remote_s3_key(const char *file_name, char *out, size_t cap) MEDIA_MUST_CHECK;
/* [fetch pool] storage: s3 - PUT the copy just made durable at path (size bytes) under its
 * key, before its row is written. 0 (also with storage: local), or -1 (logged): the fetch
 * fails and its file is removed. */
int remote_s3_put(media *m, const char *file_name, const char *path, int64_t size)
    MEDIA_MUST_CHECK;
/* [pool] storage: s3 - DELETE the object of a copy whose row went (a failure is logged:
 * the orphan sweep takes it later). Nothing with storage: local or an empty name. */
void remote_s3_forget(media *m, const char *file_name);
/* [pool] storage: s3 - is row's copy in the bucket, whole (HEAD, its size)? */
bool remote_s3_in_bucket(media *m, const media_row *row);
/* [req or pool] The copy row names (path, in the local folder) for serving: LOOKUP_HIT
 * when the file is here (with storage: s3, after reading it through: a request-pool run is
 * handed off to the store pool first, ATRIUM_HANDED_OFF), LOOKUP_MISS when it is neither
 * here nor in the bucket (fetch it from its origin again), or ATRIUM_DONE with the
 * answer set (503, 429). */
int remote_s3_present(media *m, atrium_req *req, const media_row *row, const char *path)
    MEDIA_MUST_CHECK;

/* ---- store_gone.c: local copies every process drops when media goes ------------------ */

/* [any, after the commit] storage: s3 - tell every process (this one too) to remove its
 * local copy: kind 'o' the original of media ID name, 't' the thumbnails of SHA-256 name,
 * 'r' the remote copy whose file name (under store_path) is name. Nothing with storage:
 * local (every process shares the one folder the remover cleaned). */
void store_gone_publish(media *m, char kind, const char *name);
/* The MEDIA_CH_GONE subscriber (cluster.c subscribes it; arg is the media): the unlink is
 * queued on the io pool. */
void store_gone_on(void *arg, const char *payload);

#endif
