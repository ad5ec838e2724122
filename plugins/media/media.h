/*
 * plugins/media/media.h - what the files of the media plugin share: the plugin object,
 * its settings, the media row, the per-request state, and each file's entry points.
 *
 * The plugin is built only against include/atrium/ (plus libc, jansson, libpq, libvips
 * and libwebp); nothing here reaches into the core. One `media` object exists per loaded
 * plugin; every route carries it as its argument (req_route_arg), and pool tasks carry it
 * in their job, so no file keeps state of its own (media_host, the host table set once in
 * init, is the only global). Which file owns which decision:
 *   media.c     routes, lifecycle, the config endpoint
 *   media_settings.c every plugins.media setting (the descriptor's table)
 *   delivery.c  the delivery line, authorization after admission, the media look-up and
 *               the wait for asynchronous uploads (every GET/HEAD of content passes here)
 *   download.c  serving an original: conditional requests, ranges, the file
 *   headers.c   the header rules (disposition, inline list, ETag, Range parsing, IDs)
 *   sizes.c     thumbnail sizes: parsing the setting and choosing one for a request
 *   thumbnail.c thumbnail requests: one render per key, parked waiters, fallbacks
 *   render.c    decoding (libvips, untrusted loaders blocked) and WebP encoding (libwebp)
 *   canvas.c    the canvas an image container's header declares (pure; render_probe's)
 *   store.c     the files on disk: layout, durable atomic writes, the start-up sweep
 *   media_db.c  the SQL: migrations and every query
 *   upload.c    upload, create and the asynchronous upload PUT
 *   admin.c     the Synapse-shaped admin API
 *   verify.c    checking every original against its recorded SHA-256 (admin and CLI)
 *   verify_cli.c atrium-media-verify (`atrium verify-media`), the command around verify.c
 *   migrate.c   atrium media migrate: a library between the local folder and the bucket
 *   migrate_cli.c atrium-media-migrate, the command around migrate.c
 *   cli_host.c  what the commands stand on: the settings from stdin, a small host table
 *   fed_serve.c serving this server's media to other servers (multipart/mixed)
 *   remote.c    remote media on the request path: defer/admitted modes, the remote cache
 *               look-up, the negative cache, the join of the one fetch per file
 *   remote_fetch.c a fetch job: the transfer, the 429 retry, the commit, the per-origin cap
 *   remote_stream.c requests following a remote file as it is written
 *   remote.h    what those three share (no other file includes it)
 *   fetch_budget.c the fetch budget and its fair parked line
 *   multipart.c reading a multipart/mixed answer as it arrives (pure)
 *   cache.c     the remote cache's bound: batched last access, eviction, the purge
 *   cluster.c   several processes on one database: wake-ups by notification, claims of
 *               shared work, the eviction lease
 *   remote_claim.c one fetch per remote file across processes (a claim per file)
 *   timer.c     one timer thread: work due later (a fetch retried after a 429)
 *   orphans.c   the sweep of files no row names (originals, thumbnails, temp files)
 *   preview.c   URL previews: the endpoint, the bounded fetch of a page and its image,
 *               the cache of answers
 *   preview_html.c reading OpenGraph out of a page, and the URL rules (pure)
 *   rowcache.c  the media row cache: local rows for delivery, dropped across processes
 *   fdcache.c   the open-file cache: descriptors of the files served most recently
 *   s3.c        storage: s3 - the bucket checked at start, originals written to it and
 *               read through from it into the local folder (s3.h)
 *   s3_cache.c  storage: s3 - the local folder's bound: recency, eviction of originals
 *   s3_multipart.c storage: s3 - originals above the part size, and leftover uploads
 *   s3_stream.c storage: s3 - a download's miss streamed from the store as it arrives
 *   s3_upstream.c storage: s3 - an upload sent in parts while its body arrives
 *   remote_s3.c storage: s3 - cached remote copies in the bucket, read through (s3.h)
 *   store_gone.c storage: s3 - local copies every process drops when media goes (s3.h)
 *   orphans_s3.c storage: s3 - objects in the bucket no row names (the orphan sweep's)
 *   migrate_remote.c atrium media migrate: the cached remote copies
 */
#ifndef MEDIA_H
#define MEDIA_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "atrium/host.h"
#include "atrium/media.h" /* the media/1 contract this plugin implements */
#include "sha256.h"

/* A function whose result must be looked at: ignoring it loses an answer or a resource. */
#define MEDIA_MUST_CHECK __attribute__((warn_unused_result))

/* ---- what a step of a request returns ------------------------------------------------ */

/* The rule. A handler returns an enum atrium_outcome - ATRIUM_DONE (0) means "answered" -
 * or a negative atrium_err. A helper the handler calls on its way (delivery_enter,
 * remote_locate, fetch_budget_enter, ...) returns int: either what the handler must return
 * as it is (an atrium_outcome or an error: the helper answered, parked or handed off), or
 * a code of one of the enums below, saying how the caller goes on. So no helper uses 0
 * for "go on" (0 is ATRIUM_DONE), `rc != MEDIA_GO` always reads "return rc", and each code
 * is written out here, apart from the others and from every outcome and error: none is
 * made by arithmetic on another. A code of one enum is never returned where another
 * enum's is expected; the function's comment names which. */
enum media_step {
    MEDIA_GO = 100, /* nothing answered: the caller goes on */
};
/* delivery.c, waiting for an asynchronous upload: the row changed, read it again. */
enum delivery_step { LOCATE_AGAIN = 110 };
/* media_park_unless_woken: woken since the generation was read (it did not park). */
enum park_step { PARK_WOKEN = 120 };
/* remote.c, a look-up in the remote cache (original or the origin's thumbnail). */
enum lookup_step { LOOKUP_HIT = 130, LOOKUP_MISS = 131 };
/* remote.c, one look before a fetch: a fetch landed since the miss (look again), or a
 * miss in defer mode (take a fetch budget slot and hand the request off). */
enum look_step { LOOK_AGAIN = 140, LOOK_FETCH = 141 };

/* ---- limits ---------------------------------------------------------------------------- */

#define MEDIA_ID_GENERATED_CHARS 24 /* length of the IDs this server mints */
#define MEDIA_ID_MAX_CHARS 255      /* longest media ID accepted in a path */
#define MEDIA_SERVER_NAME_MAX_CHARS 255
#define MEDIA_USER_ID_MAX_BYTES 255 /* the spec's limit for user IDs */
#define MEDIA_TYPE_MAX_BYTES 255    /* a Content-Type stored with an upload */
#define MEDIA_NAME_MAX_BYTES 1023   /* an upload's file name (UTF-8) */
#define MEDIA_MAX_SIZES 16          /* configured thumbnail sizes */
#define MEDIA_THUMB_MAX_SIDE 10000  /* largest width/height a thumbnail request may ask */
#define MEDIA_EVENT_BUCKETS 64      /* events parked requests share, by key hash */
/* Longest wait for a database connection: the operator's database.checkout_timeout_ms. */
#define MEDIA_DB_WAIT_MS (media_host->db_wait_ms())
#define MEDIA_PATH_MAX 1024
#define MEDIA_FILE_NAME_MAX 640 /* a remote copy's path under store_path */
#define FDCACHE_SLOTS 32        /* descriptors the open-file cache keeps (fdcache.c) */
#define MEDIA_MAX_BLOCKED_ORIGINS 64
#define MEDIA_CLAIM_OWNER_MAX 96 /* "<instance>.<pid>.<random>" */
#define MEDIA_FETCH_VIA_KINDS 3 /* remote_fetch.c's phases: federation, legacy, location */
#define REMOTE_S3_EVENTS 4 /* remote_s3.c: stored, read_through, missing, deleted */
#define ORPHAN_KINDS 6 /* orphans.c: original, thumbnail, temp, multipart, object, remote */

/* ---- settings ---------------------------------------------------------------------------- */

typedef struct media_size {
    int width, height;
    bool crop;     /* false: scale (fit in the box) */
    bool animated; /* a request's variant of a size: every frame (never set in settings) */
} media_size;

typedef struct media_config {
    int64_t max_upload_bytes;
    const char *store_path;
    int delivery_slots;
    int delivery_queue;            /* requests that may wait for a slot */
    int delivery_queue_per_client; /* of which from one client key (0 = no cap) */
    int64_t delivery_wait_ms;
    int64_t delivery_retry_after_ms; /* suggested to clients refused by a full line */
    const char *thumbnail_sizes; /* as configured; parsed into sizes */
    media_size sizes[MEDIA_MAX_SIZES];
    size_t n_sizes;
    int64_t max_image_pixels;
    int render_threads, render_queue;
    int64_t render_wait_ms; /* how long a thumbnail request waits for its render */
    int io_threads, io_queue;
    int max_pending_uploads;  /* created and not yet uploaded, per user */
    int upload_rate_per_minute, upload_rate_burst; /* the upload bucket, per user */
    int64_t upload_quota_bytes;     /* per user per window; 0 = no quota */
    int64_t upload_quota_window_ms; /* the quota's sliding window */
    int64_t unused_expiry_ms; /* how long a created media ID waits for its upload */
    int64_t upload_wait_default_ms, upload_wait_max_ms; /* timeout_ms on downloads */
    bool legacy_media;        /* serve the unauthenticated /_matrix/media/v3 paths */
    int64_t legacy_freeze_ts; /* media created at or after this (ms) is frozen there; 0 = none */
    /* remote media (remote.c, remote_fetch.c, fetch_budget.c) */
    bool remote_fetch_enabled;
    int fetch_threads;           /* media_fetch_threads */
    int fetch_max_in_flight;     /* media_fetch_max_in_flight: running or queued, all clients */
    int fetch_max_per_client;    /* media_fetch_max_per_client */
    int fetch_line_per_client;   /* media_fetch_line_per_client: parked over a cap; 0 = 429 */
    int64_t remote_fetch_timeout_ms; /* how long one fetch may take, whoever waits for it */
    int remote_fetch_max_per_origin; /* fetches of one origin at once */
    int64_t remote_not_found_cache_ms; /* a 404 / too large remembered (0 = not) */
    int64_t remote_failure_cache_ms;   /* unreachable / garbage remembered (0 = not) */
    int64_t remote_cache_max_bytes;    /* bound of the remote cache (0 = none) */
    const char *blocked_origins_text; /* prevent_media_downloads_from, as configured */
    const char *blocked_origins[MEDIA_MAX_BLOCKED_ORIGINS]; /* ... split (the plugin's copies) */
    size_t n_blocked_origins;
    /* URL previews (preview.c) */
    bool url_preview_enabled;
    int64_t url_preview_max_bytes;    /* a page or its image, each */
    int64_t url_preview_timeout_ms;   /* a whole preview: page, redirects, image */
    int url_preview_max_redirects;    /* followed per fetch */
    int url_preview_max_in_flight;    /* previews fetching at once, all users */
    int url_preview_max_per_user;     /* of which one user's */
    int url_preview_max_waiting;      /* requests waiting for another's fetch of their URL */
    int64_t url_preview_cache_ttl_ms; /* an answer is kept; ts is rounded down to it */
    /* the object store (s3.c; docs/adr/0011-media-on-an-object-store.md) */
    const char *storage; /* "local" or "s3" */
    const char *s3_endpoint, *s3_region, *s3_bucket, *s3_access_key_id;
    const char *s3_secret_access_key, *s3_secret_access_key_file, *s3_ca_file;
    bool s3_path_style;
    int64_t s3_part_size_bytes, s3_timeout_ms;
    int s3_max_concurrent;
    int64_t local_cache_max_bytes; /* the local folder's bound with s3 (0 = none) */
    /* the orphan sweep (orphans.c) */
    int64_t orphan_min_age_ms;      /* a file unchanged this long has no running upload */
    int64_t orphan_sweep_period_ms; /* between sweeps, in the lease holder */
} media_config;

/* ---- the plugin object -------------------------------------------------------------- */

typedef struct render_table render_table;
typedef struct remote_table remote_table;
typedef struct fetch_budget fetch_budget;
typedef struct remote_cache remote_cache;
typedef struct media_timer media_timer;
typedef struct rowcache rowcache;
typedef struct fdcache fdcache;
typedef struct media_s3 media_s3;
typedef struct s3_cache s3_cache;

typedef struct media {
    const atrium_host *h;
    atrium_plugin *self;
    media_config cfg;
    char server_name[MEDIA_SERVER_NAME_MAX_CHARS + 1];

    atrium_line *delivery;
    atrium_pool *render_pool, *io_pool;
    atrium_event *events[MEDIA_EVENT_BUCKETS];
    /* Streams following a remote file being fetched wait on these (remote_stream.c), apart from
     * the upload waiters of `events`, which re-read the database when woken. */
    atrium_event *stream_events[MEDIA_EVENT_BUCKETS];
    bool can_stream; /* the host offers respond_stream_wait (ABI 1.3) */
    atrium_ratelimit *rl_upload;

    /* Wake-ups (cluster.c): a generation per event bucket, bumped when what parked
     * requests wait for happens here or in another process (an upload lands, a render or
     * a fetch ends), so a request that read "not yet" cannot miss the wake-up. */
    pthread_mutex_t wake_mu;
    uint64_t wake_gen[MEDIA_EVENT_BUCKETS];
    char claim_owner[MEDIA_CLAIM_OWNER_MAX]; /* this process, in media_claims rows */
    atrium_lease *evict_lease; /* NULL: the host has no leases (eviction runs here) */
    /* The orphan sweep (orphans.c): its pool, its lease (NULL: every process sweeps). */
    atrium_pool *orphan_pool;
    atrium_lease *orphan_lease;
    atomic_bool orphans_sweeping, orphans_swept_once;
    atrium_metric *m_orphans_removed[ORPHAN_KINDS]; /* kind: see orphans.c */
    atrium_metric *m_orphan_sweeps;

    media_s3 *s3;             /* NULL with storage: local (s3.c) */
    atrium_metric *m_store_remote[REMOTE_S3_EVENTS]; /* remote copies and the bucket */
    atrium_pool *store_pool;  /* s3: downloads that read an original through from the store */
    s3_cache *lcache;         /* s3: the local folder's byte bound (s3_cache.c) */
    struct s3_streams *s3_streams; /* s3: misses streaming from the store (s3_stream.c) */
    atrium_metric *m_up_parts_waiting, *m_up_completed, *m_up_aborted; /* s3_upstream.c */

    rowcache *rows; /* local media rows for delivery (rowcache.c) */
    fdcache *fds;   /* open descriptors of hot files (fdcache.c) */
    atrium_metric *m_row_hits, *m_row_misses;

    render_table *renders;
    atrium_flights *render_flights; /* one render per thumbnail key in this process */
    atrium_flights *remote_flights; /* one fetch per remote file in this process (remote.c) */
    bool vips_started;

    atrium_pool *fetch_pool; /* media_fetch_threads workers: start fetches, store them */
    remote_table *remote;    /* fetches under way, one per remote file */
    media_timer *timer;      /* fetches waiting to be asked again (429) */
    fetch_budget *budget;    /* the fetch budget and its parked line */
    remote_cache *cache;     /* the remote cache's bound and last-access batches */
    atrium_metric *m_remote_cache_bytes, *m_remote_evictions;
    atrium_metric *m_fetches_ok, *m_fetches_not_found, *m_fetches_failed, *m_fetches_too_large;
    atrium_metric *m_fetches_running, *m_fetch_coalesced, *m_fetch_bytes, *m_remote_hits;
    atrium_metric *m_fetch_in_flight, *m_fetch_in_flight_client_max, *m_fetch_line_waiting;
    atrium_metric *m_fetch_line_waits;
    atrium_metric *m_fetch_line_refused, *m_fetch_legacy, *m_fed_served, *m_negative_hits;
    atrium_metric *m_fetch_streamed, *m_fetch_retried;
    atrium_metric *m_fetched_via[MEDIA_FETCH_VIA_KINDS]; /* stored fetches by phase */

    atomic_int authorizing, authorizing_peak;
    atomic_int upload_waiters; /* requests waiting (with their slot) for an upload */
    atrium_metric *m_uploads, *m_upload_bytes, *m_downloads, *m_thumbnails;
    atrium_metric *m_renders_ok, *m_renders_failed, *m_renders_running, *m_render_coalesced;
    atrium_metric *m_authorizing, *m_authorizing_peak, *m_authorizations;
    atrium_metric *m_delivering, *m_fallback_nearest, *m_fallback_unavailable;
    atrium_metric *m_not_yet_uploaded, *m_refused_policy, *m_upload_waiters;

    /* URL previews (preview.c; NULL while url_preview_enabled is off) */
    atrium_pool *preview_pool;     /* judges answers, stores images, writes the cache */
    atrium_budget *preview_budget; /* previews fetching at once, and per user */
    /* The previews fetching, by (url, ts bucket): a second request for one joins it. */
    atrium_flights *preview_flights;
    atrium_metric *m_preview_cached, *m_preview_fetched, *m_preview_failed,
        *m_preview_refused, *m_preview_coalesced, *m_preview_requests_out;
} media;

/* ---- a media row ------------------------------------------------------------------- */

typedef struct media_row {
    char media_id[MEDIA_ID_MAX_CHARS + 1];
    char user_id[MEDIA_USER_ID_MAX_BYTES + 1];
    char content_type[MEDIA_TYPE_MAX_BYTES + 1]; /* "" when unknown */
    char upload_name[MEDIA_NAME_MAX_BYTES + 1];  /* "" when none */
    char sha256[SHA256_HEX_CHARS + 1];           /* "" until uploaded */
    int64_t created_ts, expires_ts, uploaded_ts; /* ms; uploaded_ts 0 = not yet */
    int64_t size_bytes;
    int width, height, frames; /* from the image header; 0 = not an image (or unknown) */
    bool uploaded;
    bool quarantined; /* by ID or by hash */
    char quarantined_by[MEDIA_USER_ID_MAX_BYTES + 1];
    bool safe_from_quarantine;
    /* remote media only: the cached copy's path under store_path ("" for local media) */
    char file_name[MEDIA_FILE_NAME_MAX];
} media_row;

/* ---- per-request state (req_state), kept across re-runs ------------------------------- */

typedef struct upload_state upload_state;
typedef struct fetch_waiter fetch_waiter;
typedef struct remote_landing remote_landing;
typedef struct fetch_hold fetch_hold;

typedef struct media_req {
    bool admitted;     /* holds a delivery slot (a hold, released after the body) */
    bool counted_auth; /* counted once in atrium_media_authorizations_total */
    bool have_row;
    media_row row;
    bool waiting_upload; /* parked for an asynchronous upload */
    int64_t upload_deadline_ms;
    bool waiting_render; /* parked for a thumbnail render */
    int64_t render_deadline_ms;
    atrium_flight *render_flight; /* the render it waits on (thumbnail.c), until read */
    upload_state *up; /* upload routes only */
    int64_t arrival_ms;   /* monotonic, the handler's first run */
    bool federation;      /* a federation route: answer multipart/mixed */
    /* remote media (remote.c): the fetch budget slot, the parked line, the fetch */
    bool fetch_slot;      /* holds a fetch budget slot (a hold) */
    fetch_hold *fetch_hold; /* that hold, to give the slot back early (fetch_budget_leave) */
    /* set by download.c: a plain GET of the whole original, which may follow a remote
     * file while it is being fetched (remote_stream.c) */
    bool stream_ok;
    remote_landing *landing; /* remote_stream.c: the file being fetched this request follows */
    struct s3_landing *s3l;  /* s3_stream.c: the store fetch this request follows */
    struct s3_waiter *s3w, *s3w_mem; /* s3_stream.c: waiting for its first bytes; its memory */
    fetch_waiter *fw;     /* waiting in the fetch line */
    atrium_flight *remote_flight; /* remote.c: the fetch of the file it waits for */
    int64_t remote_deadline_ms;
    int fetch_rounds; /* fetches this request waited for (a bound against loops) */
    uint64_t landed_seen; /* remote.c: the table's count of landed fetches at our last miss */
    int look_again;       /* remote.c: cache look-ups repeated because a fetch landed */
    uint64_t wake_gen;    /* remote.c: the wake generation of the file's key at the look-up */
    /* a thumbnail request (set by thumbnail.c before delivery_locate): the configured
     * size chosen; for remote media the origin's thumbnail of that size is fetched first */
    bool thumb_wanted;
    media_size thumb_size;
    bool thumb_fallback;   /* the origin has none: fetch the original and render here */
    bool row_is_thumbnail; /* remote_locate found the origin's thumbnail: st->row is it */
} media_req;

/* [req] The request's state, created on first use; NULL on OOM (a 500 is set). */
media_req *media_req_state(media *m, atrium_req *req) MEDIA_MUST_CHECK;
/* The host table, set once in init before any route can run and never changed: the one
 * way a handler reaches its plugin object. */
extern const atrium_host *media_host;
/* [req] The plugin object behind a route (every route's argument). */
static inline media *media_of(atrium_req *req)
{
    return (media *)media_host->req_route_arg(req);
}
/* The event bucket for a key (a media ID, a thumbnail key). */
size_t media_bucket(const char *key);
/* Milliseconds since the Unix epoch (timestamps in rows). */
int64_t media_wall_ms(void);

/* ---- headers.c: the header rules (pure) --------------------------------------------- */

bool media_id_valid(const char *id);
/* Is name a server name? The core's grammar (host->server_name_valid, ABI 1.4), so a media
 * path's {serverName} is refused exactly when the core would refuse it (media.c). */
bool media_server_name_valid(const char *name);
/* Is the content type on the spec's inline allow-list (case-insensitive, parameters
 * ignored)? */
bool media_type_inline(const char *content_type);
/* Is the type one a thumbnail may be served as (jpeg, png, gif, webp)? */
bool media_type_thumbnail_safe(const char *content_type);
/* Is a client-supplied Content-Type acceptable to store (printable ASCII, bounded)? */
bool media_type_acceptable(const char *content_type);
/* Is a client-supplied file name acceptable (valid UTF-8, no control characters,
 * bounded)? */
bool media_name_acceptable(const char *name);
/* Content-Disposition: "inline"/"attachment", then filename="..." for ASCII names or
 * filename*=utf-8''... (RFC 6266 / 8187) for others; no filename when name is NULL or
 * empty. Returns 0, or -1 when out is too small. */
int media_content_disposition(char *out, size_t cap, bool is_inline, const char *name);
/* Does an If-None-Match header match the strong ETag (weak comparison, "*" matches)? */
bool media_etag_matches(const char *if_none_match, const char *etag);

enum media_range { MEDIA_RANGE_NONE = 0, MEDIA_RANGE_OK, MEDIA_RANGE_UNSATISFIABLE };
/* Parse a Range header against a body of `size` bytes: MEDIA_RANGE_NONE when absent,
 * malformed or multi-range (serve the whole body), _OK with [*start, *start + *len),
 * or _UNSATISFIABLE (answer 416). */
int media_parse_range(const char *range, uint64_t size, uint64_t *start, uint64_t *len);

/* ---- sizes.c ---------------------------------------------------------------------------- */

#define MEDIA_DEFAULT_SIZES "32x32 crop, 96x96 crop, 320x240 scale, 640x480 scale, 800x600 scale"
/* Parse "WxH method, ..." into out (at most MEDIA_MAX_SIZES). Returns the count, or -1
 * with err describing the first problem. */
int media_sizes_parse(const char *text, media_size *out, size_t cap, char *err, size_t errlen)
    MEDIA_MUST_CHECK;
/* The configured size for a request of w x h with this method: the smallest of that
 * method at least as large on both sides, else the largest of that method, else the
 * same among the other method. NULL only when none are configured. */
const media_size *media_size_choose(const media_size *sizes, size_t n, int w, int h, bool crop);
/* Does an original of ow x oh already fit inside w x h (so it is its own thumbnail)? */
bool media_fits_within(int ow, int oh, int w, int h);

/* ---- store.c ---------------------------------------------------------------------------- */

/* A file being written: unnamed (O_TMPFILE) until committed, or a ".tmp-" name in the
 * same folder where the file system cannot do unnamed files. Open for reading too: a
 * remote file's followers read it while it is written (remote_stream.c). */
typedef struct store_tmp {
    int fd;
    char dir[MEDIA_PATH_MAX];
    char named[MEDIA_PATH_MAX]; /* "" for an unnamed file */
    bool derived;               /* store_tmp_open_derived: no folder fsyncs */
} store_tmp;

int store_init(media *m);  /* [init/start] create the folders */
int store_sweep(media *m); /* [start] remove temp leftovers; returns count */
int store_original_path(const media *m, const char *media_id, char *out, size_t cap);
int store_thumb_dir(const media *m, const char *sha256, char *out, size_t cap);
/* "<W>x<H>-<method>[-anim].webp" in the SHA-256's thumbnail folder. */
int store_thumb_path(const media *m, const char *sha256, const media_size *s, char *out,
                     size_t cap);
/* Open a temp file in the folder of final_path (created durably when missing). 0, or a
 * negative errno (logged). */
int store_tmp_open(media *m, const char *final_path, store_tmp *t) MEDIA_MUST_CHECK;
/* The same for a derived file (a thumbnail: rendered again when it is missing): its
 * bytes are still fsynced before it is named in one step, so a name never shows a torn
 * file, but no folder is fsynced, neither new ones nor the one it is named in; after a
 * crash the name may be gone, never half there. */
int store_tmp_open_derived(media *m, const char *final_path, store_tmp *t) MEDIA_MUST_CHECK;
/* Make the temp file final_path: fsync the data, link it under its name (replacing an
 * existing file when `replace`), fsync the folder (not for a derived file). Consumes t (the fd is closed). 0, or
 * a negative errno: -EEXIST when final_path exists and !replace. */
int store_tmp_commit(media *m, store_tmp *t, const char *final_path, bool replace) MEDIA_MUST_CHECK;
/* Drop a temp file (close; unlink a named one). Idempotent. */
void store_tmp_discard(store_tmp *t);
/* Write all of buf; 0 or a negative errno. */
int store_write_all(int fd, const void *buf, size_t len) MEDIA_MUST_CHECK;
/* Remove an original; remove a SHA-256's thumbnails folder. */
int store_remove_original(media *m, const char *media_id);
void store_remove_thumbs(media *m, const char *sha256);

/* ---- media_db.c ------------------------------------------------------------------------- */

extern const atrium_migration MEDIA_MIGRATIONS[];

/* ---- media_settings.c ------------------------------------------------------------------ */

/* Every plugins.media setting (the descriptor's table). The count is spelled out because
 * the descriptor needs a constant; media_settings.c fails to build when it is wrong. */
#define MEDIA_N_SETTINGS 57
extern const atrium_setting MEDIA_SETTINGS[MEDIA_N_SETTINGS];
extern const size_t MEDIA_N_MIGRATIONS;

enum { MEDIA_DB_OK = 0, MEDIA_DB_NOTFOUND = 1 };
/* Each returns MEDIA_DB_OK, MEDIA_DB_NOTFOUND where stated, or ATRIUM_E_DB (logged). */
int media_db_get(const atrium_host *h, atrium_plugin *self, PGconn *c, const char *media_id,
                 media_row *out) MEDIA_MUST_CHECK;
int media_db_insert(const atrium_host *h, atrium_plugin *self, PGconn *c, const media_row *r)
    MEDIA_MUST_CHECK;
/* Bytes `user_id` uploaded (local media, uploaded_ts at or after since_ms) into *out.
 * MEDIA_DB_OK or ATRIUM_E_DB. */
int media_db_uploaded_since(const atrium_host *h, atrium_plugin *self, PGconn *c,
                            const char *user_id, int64_t since_ms, int64_t *out) MEDIA_MUST_CHECK;
int media_db_create(const atrium_host *h, atrium_plugin *self, PGconn *c, const char *media_id,
                    const char *user_id, int64_t now, int64_t expires, int max_pending)
    MEDIA_MUST_CHECK;
/* Locks the row of an asynchronous upload (inside a transaction the caller began). */
int media_db_lock_pending(const atrium_host *h, atrium_plugin *self, PGconn *c,
                          const char *media_id, media_row *out) MEDIA_MUST_CHECK;
int media_db_complete(const atrium_host *h, atrium_plugin *self, PGconn *c, const media_row *r)
    MEDIA_MUST_CHECK;
int media_db_exec(const atrium_host *h, atrium_plugin *self, PGconn *c, const char *sql);
int media_db_set_quarantine(const atrium_host *h, atrium_plugin *self, PGconn *c,
                            const char *media_id, const char *by);
int media_db_set_hash_quarantine(const atrium_host *h, atrium_plugin *self, PGconn *c,
                                 const char *sha256, const char *by);
int media_db_delete(const atrium_host *h, atrium_plugin *self, PGconn *c, const char *media_id,
                    bool *sha_still_used, char sha_out[SHA256_HEX_CHARS + 1]);
/* The remote cache row of origin/media_id (file_name set; quarantine by hash joined). */
int media_db_remote_get(const atrium_host *h, atrium_plugin *self, PGconn *c, const char *origin,
                        const char *media_id, media_row *out) MEDIA_MUST_CHECK;
/* Record a committed remote copy (r->file_name names it); old_file gets the name of the
 * copy it replaced ("" when none). */
int media_db_remote_put(const atrium_host *h, atrium_plugin *self, PGconn *c, const char *origin,
                        const media_row *r, char old_file[MEDIA_FILE_NAME_MAX],
                        int64_t *old_bytes) MEDIA_MUST_CHECK;
/* The origin's thumbnail of origin/media_id at a configured size, as a row (file_name,
 * content_type, sha256, size_bytes). */
int media_db_remote_thumb_get(const atrium_host *h, atrium_plugin *self, PGconn *c,
                              const char *origin, const char *media_id, const media_size *s,
                              media_row *out) MEDIA_MUST_CHECK;
int media_db_remote_thumb_put(const atrium_host *h, atrium_plugin *self, PGconn *c,
                              const char *origin, const media_size *s, const media_row *r)
    MEDIA_MUST_CHECK;
/* Quarantine (by = the admin) or release (by = NULL) a cached remote copy. */
int media_db_remote_set_quarantine(const atrium_host *h, atrium_plugin *self, PGconn *c,
                                   const char *origin, const char *media_id, const char *by);
/* A user's media for the admin API: a JSON array of Synapse-shaped objects. */
/* Claims (cluster.c): media_db_claim answers enum cluster_claim or ATRIUM_E_DB. */
int media_db_claim(const atrium_host *h, atrium_plugin *self, PGconn *c, const char *key,
                   const char *owner, int64_t ttl_ms, int *result, int64_t *left_ms);
int media_db_claim_end(const atrium_host *h, atrium_plugin *self, PGconn *c, const char *key,
                       const char *owner, int result, int64_t remember_ms);
/* Remove lapsed claims. */
int media_db_claims_prune(const atrium_host *h, atrium_plugin *self, PGconn *c);
/* URL previews: the cached answer of (url, ts_bucket) not expired at now_ms into *og
 * (malloc'd JSON text, the caller frees): MEDIA_DB_OK, MEDIA_DB_NOTFOUND or ATRIUM_E_DB. */
int media_db_preview_get(const atrium_host *h, atrium_plugin *self, PGconn *c, const char *url,
                         int64_t ts_bucket, int64_t now_ms, char **og) MEDIA_MUST_CHECK;
/* Keep og (JSON text) for (url, ts_bucket) until expires_ms, replacing an older answer,
 * and drop answers expired before now_ms. */
int media_db_preview_put(const atrium_host *h, atrium_plugin *self, PGconn *c, const char *url,
                         int64_t ts_bucket, const char *og, int64_t now_ms, int64_t expires_ms);
int media_db_list_user(const atrium_host *h, atrium_plugin *self, PGconn *c, const char *user_id,
                       int64_t from, int64_t limit, bool newest_first, json_t **out,
                       int64_t *total);

/* ---- delivery.c ------------------------------------------------------------------------ */

/* [req] Answer 200 with a JSON body (stolen; NULL = out of memory): ATRIUM_DONE, or
 * ATRIUM_E_NOMEM for the host to answer 500. */
int media_reply(media *m, atrium_req *req, json_t *body) MEDIA_MUST_CHECK;
/* [req] host->req_authenticate: the user ID, or NULL with the response (no-store) set
 * (return ATRIUM_DONE). */
const char *media_authenticate(media *m, atrium_req *req);

/* [req] The steps every GET/HEAD of media content starts with, in order: a delivery slot
 * (waiting parked in the line; 429 past it), then - when `authenticate` - the access
 * token (only after admission, so a token revoked while waiting is refused). Returns
 * MEDIA_GO or the outcome to return. */
int delivery_enter(media *m, atrium_req *req, media_req *st, bool authenticate) MEDIA_MUST_CHECK;
/* The start shared by every content handler (download, thumbnail): the legacy paths'
 * switch (404 unless legacy_media), the request's state, then delivery_enter. MEDIA_GO
 * with *st set, or the outcome the handler returns as it is. */
int delivery_begin(media *m, atrium_req *req, bool legacy, media_req **st) MEDIA_MUST_CHECK;
/* [req] Validate serverName/mediaId, read the row (cached in st), apply the
 * trust-and-safety policy and wait (parked, up to timeout_ms) for an asynchronous upload.
 * Returns MEDIA_GO with st->row filled, or the outcome to return. `legacy` applies the
 * freeze of the unauthenticated paths. */
int delivery_locate(media *m, atrium_req *req, media_req *st, bool legacy) MEDIA_MUST_CHECK;
/* [any] Wake downloads waiting for media_id's upload. */
void delivery_upload_landed(media *m, const char *media_id);
/* [req] The headers every successful media response carries (CSP, CORP, Cache-Control,
 * nosniff, ETag). */
void delivery_success_headers(media *m, atrium_req *req, const char *etag);
/* [req] 304 Not Modified for a matching If-None-Match. */
int delivery_not_modified(media *m, atrium_req *req, const char *etag);
/* [req] Open an original or thumbnail for serving: the fd, or -1 with the response set
 * (404 when missing - logged as a store inconsistency -, 503 when out of descriptors). */
int delivery_open(media *m, atrium_req *req, const char *path, uint64_t *size) MEDIA_MUST_CHECK;

/* [req] The request's timeout_ms (default upload_wait_default_ms, capped at
 * upload_wait_max_ms); -1 when it is not a non-negative integer. */
int64_t delivery_timeout_ms(media *m, atrium_req *req);
/* The path of a row's bytes: the remote copy's when file_name is set, else the local
 * original's. 0 or ATRIUM_E_INVAL (too long). */
int store_row_path(const media *m, const media_row *row, char *out, size_t cap) MEDIA_MUST_CHECK;
/* A new, unused path for a remote copy of origin/media_id (a random suffix, so a later
 * copy never replaces a file a reader may have open): relative (under store_path) into
 * rel, and absolute into abs. */
int store_remote_name(const media *m, const char *origin, const char *media_id, char *rel,
                      size_t rel_cap, char *abs, size_t abs_cap) MEDIA_MUST_CHECK;

/* ---- fed_serve.c: this server's media for other servers ---------------------------- */

int fed_download_handler(atrium_req *req);
int fed_thumbnail_handler(atrium_req *req);
/* [req] Answer with `len` bytes of fd from `offset` as the file part of a multipart/mixed
 * body whose first part is the JSON object {} (the federation media format). Takes fd. */
int fed_respond_multipart(media *m, atrium_req *req, const char *type, const char *disposition,
                          int fd, uint64_t offset, uint64_t len);
/* [req] The content answer for a request: multipart for a federation route (st->federation),
 * else host->respond_file. Takes fd. */
int delivery_respond_file(media *m, atrium_req *req, int status, const char *type,
                          const char *disposition, int fd, uint64_t offset, uint64_t len);
/* [any] One read of a file still being written (a landing a stream follows): up to max
 * bytes at pos from fd, of which `readable` are written; ATRIUM_STREAM_WAIT when pos has
 * caught up and the file is not done, ATRIUM_STREAM_END when it is, ATRIUM_STREAM_ERROR
 * when it failed. Never blocks beyond the pread of written bytes. */
int64_t delivery_landing_read(int fd, int64_t readable, bool done, bool failed, uint64_t pos,
                              char *buf, size_t max);

/* ---- remote.c, remote_fetch.c, remote_stream.c ------------------------------------------ */

int remote_init(media *m);
void remote_fini(media *m);
/* [req] Another server's media: the refusals and policy, the cache look-up, and on a miss
 * the fetch (fetch budget, handoff to the fetch pool, one coalesced fetch, parked until
 * it lands). MEDIA_GO with st->row filled from the remote cache, or the outcome. */
int remote_locate(media *m, atrium_req *req, media_req *st, const char *origin,
                  const char *media_id) MEDIA_MUST_CHECK;
/* [req] After remote_locate returned MEDIA_GO with st->landing set (a request with
 * st->stream_ok whose file is still being fetched): answer 200 with the bytes as they
 * arrive (host->respond_stream_wait, chunked), cut before its end if the fetch fails.
 * `disposition` is the Content-Disposition download.c chose. ATRIUM_DONE or an error. */
int remote_respond_stream(media *m, atrium_req *req, media_req *st, const char *type,
                          const char *disposition) MEDIA_MUST_CHECK;

/* ---- preview.c / preview_html.c: URL previews ---------------------------------------- */

#define PREVIEW_URL_MAX 1024          /* longest URL previewed (the host's request-line bound) */
#define PREVIEW_FIELD_MAX_BYTES 2048  /* a title, description or other value, at most */
#define PREVIEW_OG_MAX_KEYS 50        /* og:* values kept from one page */
#define PREVIEW_URL_PLAIN_HTTP 1      /* preview_url_normalize: an http:// URL */

/* [init] The pool, budget and metrics, and the routes (only when url_preview_enabled). */
int preview_init(media *m);
/* The OpenGraph of an HTML document (len bytes; ISO-8859-1 when latin1, else UTF-8):
 * a new JSON object (empty when the page declares nothing), NULL on OOM. [any], pure. */
json_t *preview_html_og(const char *html, size_t len, bool latin1);
/* A requested URL made fetchable into out: 0 for https, PREVIEW_URL_PLAIN_HTTP for
 * http, -1 for anything else (another scheme, no host, user information, too long). */
int preview_url_normalize(const char *url, char *out, size_t cap);
/* ref (an og:image, a Location) resolved against the absolute URL base, then
 * normalised: preview_url_normalize's answers. */
int preview_url_join(const char *base, const char *ref, char *out, size_t cap);

/* ---- timer.c --------------------------------------------------------------------------- */

/* [init] Start the timer thread; NULL when it cannot be had. */
media_timer *media_timer_start(const atrium_host *h);
/* [any] Call fn(arg) on the timer thread once due_ms (monotonic, host->now_ms) has come:
 * fn must be quick (submit real work to a pool). 0, ATRIUM_E_NOMEM or ATRIUM_E_STOPPED
 * (then fn is never called). */
int media_timer_add(media_timer *t, int64_t due_ms, void (*fn)(void *arg), void *arg);
/* Stop and join the thread; entries not yet due are then called at once, on the calling
 * thread (their work must cope with stopped pools). NULL is fine. */
void media_timer_stop(media_timer *t);

/* ---- orphans.c ------------------------------------------------------------------------- */

/* [init] The sweep's pool (one thread), metrics and lease "store.orphans". 0 or an error. */
int orphans_init(media *m);
/* [start] Sweep once now (in the background), then every orphan_sweep_period_ms while this
 * process holds the lease. 0 or the timer's error. */
int orphans_start(media *m);
/* orphans_s3.c [orphans pool] storage: s3 - delete the bucket's objects under originals/,
 * thumbnails/ and remote/ last modified before cutoff_ms (wall clock, ms) that no row
 * names. Returns how many went (0 with storage: local), or -1 when nothing could be done
 * (logged); a sweep stopped midway by the store or the database returns what it did. */
long orphans_s3_sweep(media *m, int64_t cutoff_ms);

/* ---- cluster.c: several processes on one database ------------------------------------- */

/* Notification channels (the host scopes them to the plugin); each payload is a key. */
#define MEDIA_CH_UPLOAD "upload" /* a media ID whose asynchronous upload landed */
#define MEDIA_CH_RENDER "render" /* a thumbnail key whose render ended */
#define MEDIA_CH_FETCH "fetch"   /* a remote file's key whose fetch ended */
#define MEDIA_CH_STORED "cache.stored" /* a remote copy was stored: bytes (informative) */
#define MEDIA_CH_ROW "row" /* a local media ID, or "#" and a hash, whose rows changed */
#define MEDIA_CH_GONE "store.gone" /* files every local folder drops (store_gone.c) */

/* [init] Subscribe to the channels, create the eviction lease (where the host offers
 * them), name this process for claims. 0 or the host's error. */
int cluster_init(media *m);
/* [any] The wake generation of key's bucket: read it before looking at what may change. */
uint64_t media_wake_gen(media *m, const char *key);
/* [any] Wake requests waiting for key (bump its bucket's generation, signal its event). */
void media_wake(media *m, const char *key);
/* [req] Park on key's event until until_ms, unless woken since gen was read: ATRIUM_PARKED
 * (return it), PARK_WOKEN (woken meanwhile: look again now) or ATRIUM_E_STOPPED. */
int media_park_unless_woken(media *m, atrium_req *req, const char *key, uint64_t gen,
                            int64_t until_ms) MEDIA_MUST_CHECK;
/* [any] Are notifications from the other processes arriving now (the host offers them
 * and its listening connection is up)? While not, waiters re-check more often. */
bool cluster_live(const media *m);
/* [any] Publish payload on channel to every process (this one too), at once: call it
 * after the commit that made the change visible. Failures are logged, never fatal. */
void cluster_publish(media *m, const char *channel, const char *payload);

enum cluster_claim { CLAIM_MINE = 0, CLAIM_HELD = 1, CLAIM_RESULT = 2 };
/* [any, blocks on PostgreSQL] Claim the work named key for ttl_ms: CLAIM_MINE (do it,
 * then cluster_claim_end), CLAIM_HELD (another process does it; *left_ms until its claim
 * lapses, -1 unknown) or CLAIM_RESULT (it ended elsewhere with *result, still
 * remembered). A database failure answers CLAIM_MINE. */
int cluster_claim(media *m, const char *key, int64_t ttl_ms, int *result, int64_t *left_ms)
    MEDIA_MUST_CHECK;
/* [any, blocks on PostgreSQL] The claimed work ended: forget the claim, or keep result
 * for remember_ms (> 0) for the other processes; then publish payload on channel. */
void cluster_claim_end(media *m, const char *channel, const char *key, const char *payload,
                       int result, int64_t remember_ms);
/* [any] May this process evict from the remote cache now (it holds the eviction lease,
 * or the host has no leases)? */
bool cluster_evicts_here(const media *m);
/* [any] Is eviction shared through a lease (so the holder must hear of stores)? */
bool cluster_shared_eviction(const media *m);

/* ---- remote_claim.c: one fetch per remote file across processes ---------------------- */

enum remote_claim {
    REMOTE_CLAIM_MINE = 0,   /* fetch it, then remote_claim_end */
    REMOTE_CLAIM_HELD = 1,   /* another process fetches it */
    REMOTE_CLAIM_RESULT = 2, /* it ended elsewhere with *result, still remembered */
    REMOTE_CLAIM_LANDED = 3, /* the copy is cached already */
};
/* [fetch pool, blocks on PostgreSQL] Claim the fetch of key (remote.c's key of origin/
 * media_id, thumb = the origin's thumbnail of that size or NULL): an enum remote_claim. */
int remote_claim_take(media *m, const char *key, const char *origin, const char *media_id,
                      const media_size *thumb, int *result) MEDIA_MUST_CHECK;
/* [fetch pool, blocks on PostgreSQL] The claimed fetch ended with result: remembered for
 * remember_ms (> 0) for the others, else forgotten; the key is published. */
void remote_claim_end(media *m, const char *key, int result, int64_t remember_ms);
/* [req] Another process fetches key: park until its notification or the next re-check
 * (within the request's deadline). ATRIUM_PARKED, MEDIA_GO (it ended since st->wake_gen
 * was read: look at the cache now), or ATRIUM_DONE (503, stopping). */
int remote_claim_wait(media *m, atrium_req *req, media_req *st, const char *key) MEDIA_MUST_CHECK;

/* ---- cache.c --------------------------------------------------------------------------- */

int cache_init(media *m);
void cache_fini(media *m);
/* [start] Count the remote cache's bytes. */
int cache_start(media *m);
/* [any] A cache hit: recorded as last access, in a batch. */
void cache_touch(media *m, const char *origin, const char *media_id);
/* [fetch pool, io pool] A copy of `bytes` was recorded: count it; past
 * remote_cache_max_bytes, remove the least recently used copies (blocks on PostgreSQL and
 * the disk: never on a request-pool thread). */
void cache_stored(media *m, int64_t bytes);
/* [io pool] Remove every copy last accessed before before_ts (ms since the epoch);
 * *deleted = how many originals. 0 or ATRIUM_E_DB. */
int cache_purge(media *m, int64_t before_ts, int64_t *deleted);
/* [any, quick] Another process stored a remote copy: if this one holds the eviction
 * lease, look at the cache's total on the io pool. */
void cache_stored_elsewhere(media *m);

/* ---- fetch_budget.c ------------------------------------------------------------------- */

int fetch_budget_init(media *m);
void fetch_budget_fini(media *m);
/* [req] Hold a slot of the fetch budget: MEDIA_GO once held (a hold, given back when the
 * request ends), ATRIUM_PARKED while waiting in the fair line (the handler runs again and
 * calls this again), or ATRIUM_DONE with the answer set (429 past the line, 504 at the
 * request's deadline, 503 while stopping). */
int fetch_budget_enter(media *m, atrium_req *req, media_req *st) MEDIA_MUST_CHECK;
/* [req] Give the request's fetch budget slot back now (it no longer needs a fetch: it
 * follows one that is streaming); the hold then releases nothing. Idempotent. */
void fetch_budget_leave(media *m, media_req *st);

/* ---- multipart.c ---------------------------------------------------------------------- */

#define MP_BOUNDARY_MAX 70   /* RFC 2046 */
#define MP_BUF_BYTES 65536   /* carried between chunks while looking for a delimiter */
#define MP_HEADERS_MAX 8192  /* one part's header block */
#define MP_JSON_MAX 65536    /* the metadata part */
#define MP_HEADER_VALUE_MAX 2048

enum mp_state { MP_PREAMBLE = 0, MP_AFTER_DELIM, MP_HEADERS, MP_PART, MP_DONE, MP_ERROR };
typedef struct mp_parser {
    char delim[MP_BOUNDARY_MAX + 5]; /* "\r\n--" boundary */
    size_t dlen;
    int state;
    int part; /* 1 = metadata (JSON), 2 = the file, 3+ = ignored */
    char buf[MP_BUF_BYTES + MP_HEADERS_MAX];
    size_t len;
    char json[MP_JSON_MAX + 1];
    size_t json_len;
    char content_type[MP_HEADER_VALUE_MAX], disposition[MP_HEADER_VALUE_MAX],
        location[MP_HEADER_VALUE_MAX];
    int64_t body_bytes;
    int stopped; /* what on_body returned when it stopped the parse */
    /* each piece of the file part as it is found; non-zero stops the parse */
    int (*on_body)(void *arg, const char *data, size_t len);
    void *arg;
} mp_parser;
/* Start a parser for a Content-Type header ("multipart/mixed; boundary=..."): 0, or -1
 * when it is not multipart/mixed with a valid boundary. */
int mp_init(mp_parser *p, const char *content_type) MEDIA_MUST_CHECK;
/* Feed bytes: 0, -1 for a malformed body, or what on_body returned (non-zero). */
int mp_feed(mp_parser *p, const char *data, size_t len) MEDIA_MUST_CHECK;
/* Did the body end properly: the metadata and the file part, then the close delimiter? */
bool mp_complete(const mp_parser *p);

/* ---- verify.c ------------------------------------------------------------------------- */

/* An uploaded original as its row describes it. */
typedef struct media_brief {
    char media_id[MEDIA_ID_MAX_CHARS + 1];
    char sha256[SHA256_HEX_CHARS + 1];
    int64_t size;
} media_brief;
#define MEDIA_ROWS_PAGE 256 /* rows read at once */
/* Up to MEDIA_ROWS_PAGE uploaded originals with media IDs after `after` ("" first) and
 * uploaded_ts at or after uploaded_since (ms; 0 all), in media ID order, into items (*n
 * of them). 0, or ATRIUM_E_DB with err set. */
int media_rows_page(PGconn *c, const char *after, int64_t uploaded_since, media_brief *items,
                    int *n, char *err, size_t errlen) MEDIA_MUST_CHECK;
#define MEDIA_HASH_READ_BYTES (256 * 1024) /* the buffer media_hash_file reads with */
/* Hash the file at path with buf (MEDIA_HASH_READ_BYTES): 0 with hex and *size, or a
 * negative errno. */
int media_hash_file(const char *path, char hex[SHA256_HEX_CHARS + 1], int64_t *size, char *buf);

typedef struct verify_report {
    int64_t checked;  /* originals looked at */
    int64_t problems; /* of which missing, of the wrong size, or with another SHA-256 */
    json_t *details;  /* [{"media_id", "problem", ...}], at most VERIFY_MAX_DETAILS */
} verify_report;
#define VERIFY_MAX_DETAILS 1000
typedef PGconn *(*verify_acquire_fn)(void *ctx);
typedef void (*verify_release_fn)(void *ctx, PGconn *c);
/* [pool] Check every uploaded original against its row (size, SHA-256): its file, or
 * with storage: s3 its object (read back). A connection is borrowed per page of rows and
 * given back before the files of the page are read. 0, or ATRIUM_E_DB / ATRIUM_E_NOMEM
 * with err set. rep->details is the caller's to decref. */
int media_verify(media *m, verify_acquire_fn acquire, verify_release_fn release, void *ctx,
                 verify_report *rep, char *err, size_t errlen) MEDIA_MUST_CHECK;

/* ---- handlers ------------------------------------------------------------------------ */

int download_handler(atrium_req *req);
int download_legacy_handler(atrium_req *req);
int thumbnail_handler(atrium_req *req);
int thumbnail_legacy_handler(atrium_req *req);
int upload_handler(atrium_req *req);
int upload_body_chunk(atrium_req *req, const char *data, size_t len);
int create_handler(atrium_req *req);
int upload_put_handler(atrium_req *req);
int upload_put_body_chunk(atrium_req *req, const char *data, size_t len);
int admin_register(media *m);
/* A fresh local media ID (MEDIA_ID_GENERATED_CHARS letters and digits): 0 or ATRIUM_E_IO. */
int media_generate_id(char out[MEDIA_ID_GENERATED_CHARS + 1]) MEDIA_MUST_CHECK;

/* ---- thumbnail.c / render.c ----------------------------------------------------------- */

int thumbnails_init(media *m);
void thumbnails_fini(media *m);
/* [any, quick] The render of thumbnail key (NULL: any) ended in another process: requests
 * here waiting for it look again (the notification callback). */
void thumbnails_ended_elsewhere(media *m, const char *key);

enum render_result {
    RENDER_OK = 0,
    RENDER_E_NOT_IMAGE = -1, /* no allowed decoder recognises it */
    RENDER_E_TOO_LARGE = -2, /* header claims more than max_image_pixels */
    RENDER_E_DECODE = -3,    /* truncated or corrupt */
    RENDER_E_NOMEM = -4,
    RENDER_E_IO = -5,
};
/* [init] Start libvips with only the trusted loaders (JPEG, PNG, GIF, WebP). */
int render_global_init(media *m);
void render_global_fini(void);
/* [any] Read an image header: dimensions (of one frame, or the container's declared
 * canvas where that is larger: canvas.c) and frame count. RENDER_OK or RENDER_E_NOT_IMAGE. */
int render_probe(const char *path, int *width, int *height, int *frames) MEDIA_MUST_CHECK;
/* canvas.c [any]: the canvas the container header in b[0..n) declares (GIF, PNG, WebP,
 * JPEG), 0 x 0 when it declares none. */
void canvas_of_buffer(const uint8_t *b, size_t n, uint32_t *w, uint32_t *h);
/* The same for the start of a file. 0, or ATRIUM_E_IO / ATRIUM_E_NOMEM (then 0 x 0). */
int canvas_of_file(const char *path, uint32_t *w, uint32_t *h) MEDIA_MUST_CHECK;
/* [any] Render path to a WebP thumbnail of at most s->width x s->height (crop: exactly the
 * box's aspect) honouring EXIF orientation, never upscaled; the first frame only, unless
 * s->animated (then every frame, as an animated WebP, when the frames fit
 * RENDER_MAX_ANIMATED_PIXELS; else the first). On RENDER_OK *out / *len hold the WebP
 * bytes (free with render_free). */
int render_thumbnail(const char *path, const media_size *s, int64_t max_pixels, uint8_t **out,
                     size_t *len) MEDIA_MUST_CHECK;
void render_free(uint8_t *buf);
const char *render_strerror(int rc);

/* ---- the media row cache (rowcache.c) -------------------------------------------- */

/* Allocate / free the cache (empty at first). */
int rowcache_init(media *m);
void rowcache_fini(media *m);
/* Fill *row from a fresh entry for (server, media_id) and count a hit; false (a miss) when
 * there is none or notifications are not live. Any thread. */
bool rowcache_get(media *m, const char *server, const char *media_id, media_row *row);
/* The generation to pass to rowcache_put: read it before the database read. */
uint64_t rowcache_gen(media *m);
/* Keep a row just read (only an uploaded, unquarantined local row, and only when no drop
 * happened since gen was read and notifications are live). */
void rowcache_put(media *m, const char *server, const media_row *row, uint64_t gen);
/* After the commit that changed a local media row (quarantine, release, deletion) or the
 * quarantine of a content hash: drop it here at once, then tell every process. */
void rowcache_changed(media *m, const char *media_id);
void rowcache_changed_hash(media *m, const char *sha256);
/* The MEDIA_CH_ROW subscriber (cluster.c subscribes it; arg is the media). */
void rowcache_on_row(void *arg, const char *payload);

/* ---- the open-file cache (fdcache.c) ------------------------------------------------- */

/* Allocate / free the cache (fini closes what it holds; after the timer stopped). */
int fdcache_init(media *m);
void fdcache_fini(media *m);
/* [start] Schedule the sweep that closes idle descriptors on m->timer. */
int fdcache_start(media *m);
/* [any] A descriptor of the file at path, the caller's own (close it, or hand it to a
 * response), from the cache when it holds the path and the file is still linked, else
 * opened now (and kept for the next request). *size is the file's size. -1 when open(2)
 * failed, -2 when fstat(2) did; errno says why. */
int fdcache_open(media *m, const char *path, uint64_t *size) MEDIA_MUST_CHECK;
/* [any] Close the cached descriptor of path, if any: call after unlinking it. */
void fdcache_forget(media *m, const char *path);
/* [any] The same for every cached path inside the folder dir (no trailing '/'). */
void fdcache_forget_under(media *m, const char *dir);

#endif
