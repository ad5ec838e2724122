/*
 * plugins/media/media_settings.c - every plugins.media setting, declared once: names,
 * defaults, ranges and help. The host reads them into media_config (config_load), refuses
 * unknown keys, and writes them with their defaults and help into --generate-config and
 * `atrium --print-config-table media` (plugins/media/README.md). In a file of its own so
 * that the plugin's commands (atrium-media-verify, atrium-media-migrate: cli_host.c) read
 * the settings the core hands them through the same rows, without linking the plugin.
 */
#include <stddef.h>

#include "media.h"

#define DEFAULT_MAX_UPLOAD_BYTES (50LL * 1024 * 1024)
#define MAX_UPLOAD_BYTES_LIMIT (4LL * 1024 * 1024 * 1024)
#define DEFAULT_STORE_PATH "./media_store"
#define DEFAULT_DELIVERY_SLOTS 64
#define DEFAULT_DELIVERY_QUEUE 1024
#define DEFAULT_DELIVERY_QUEUE_PER_CLIENT 512
#define DEFAULT_DELIVERY_WAIT_MS 30000
#define DEFAULT_MAX_IMAGE_PIXELS 32000000LL
#define DEFAULT_RENDER_QUEUE 512
#define DEFAULT_RENDER_WAIT_MS 15000
#define DEFAULT_IO_THREADS 4
#define DEFAULT_IO_QUEUE 256
#define DEFAULT_MAX_PENDING_UPLOADS 16
#define DEFAULT_UNUSED_EXPIRY_MS (24LL * 3600 * 1000) /* the spec's recommendation */
#define DEFAULT_UPLOAD_WAIT_MS 20000                  /* the spec's default timeout_ms */
#define DEFAULT_UPLOAD_WAIT_MAX_MS 60000
#define PARK_LIMIT_MS (10LL * 60 * 1000) /* the host caps a park at 10 minutes */
/* Uploads per user: 10 a second refill, and a burst that takes a 150-image album sent 8
 * at a time whole (test_media_limits.py); Synapse has no upload rate by default. */
#define DEFAULT_UPLOAD_RATE_PER_MINUTE 600
#define DEFAULT_UPLOAD_RATE_BURST 200
#define DEFAULT_UPLOAD_QUOTA_WINDOW_MS (24LL * 3600 * 1000)
#define UPLOAD_QUOTA_WINDOW_MAX_MS (366LL * 24 * 3600 * 1000)
#define DEFAULT_FETCH_THREADS 16
#define DEFAULT_FETCH_MAX_IN_FLIGHT 64
#define DEFAULT_FETCH_MAX_PER_CLIENT 8
#define DEFAULT_FETCH_LINE_PER_CLIENT 256
#define DEFAULT_REMOTE_FETCH_TIMEOUT_MS 60000
#define DEFAULT_REMOTE_FETCH_MAX_PER_ORIGIN 8
#define DEFAULT_REMOTE_NOT_FOUND_CACHE_MS 60000
#define DEFAULT_REMOTE_FAILURE_CACHE_MS 10000
#define DEFAULT_REMOTE_CACHE_MAX_BYTES (10LL * 1024 * 1024 * 1024)
#define DEFAULT_URL_PREVIEW_MAX_BYTES (1024LL * 1024)
#define URL_PREVIEW_MAX_BYTES_LIMIT (64LL * 1024 * 1024)
#define DEFAULT_URL_PREVIEW_TIMEOUT_MS 10000
/* A preview waits parked within the server's handoff deadline (60 s by default). */
#define URL_PREVIEW_TIMEOUT_LIMIT_MS 50000
#define DEFAULT_URL_PREVIEW_MAX_REDIRECTS 5
/* Each preview fetching holds one of the outbound client's connections, which federation
 * shares (federation.client.max_connections, 16 by default): previews take a few. */
#define DEFAULT_URL_PREVIEW_MAX_IN_FLIGHT 4
#define DEFAULT_URL_PREVIEW_MAX_PER_USER 2
/* A waiting request costs no thread and no connection, only its parked request. */
#define DEFAULT_URL_PREVIEW_MAX_WAITING 64
#define DEFAULT_URL_PREVIEW_CACHE_TTL_MS (3600LL * 1000) /* Synapse keeps answers an hour */
/* An upload leaves its file unchanged at most server.http.body_idle_timeout_s (15 s) while
 * its body arrives, and its row follows its last byte within handoff_deadline_ms (60 s)
 * plus its bounded waits (s3_timeout_ms, the database wait): about 2 minutes by default.
 * An hour is the margin (plugins/media/README.md, "Storage and crash safety"). */
#define DEFAULT_ORPHAN_MIN_AGE_MS (3600LL * 1000)
#define ORPHAN_MIN_AGE_FLOOR_MS 10000LL
#define DEFAULT_ORPHAN_SWEEP_PERIOD_MS (3600LL * 1000)
#define ORPHAN_LIMIT_MS (7LL * 24 * 3600 * 1000)

/* Every plugins.media setting, declared once: the host reads them into media_config
 * (config_load), refuses unknown keys, and writes them with their defaults and help into
 * --generate-config and `atrium --print-config-table media` (plugins/media/README.md). */
#define FIELD(f) offsetof(media_config, f)
#define INT_SETTING(k, f, d, lo, hi, u, h)                                                  \
    {.key = (k), .type = ATRIUM_SETTING_INT, .offset = FIELD(f), .def = (d), .min = (lo),  \
     .max = (hi), .unit = (u), .help = (h)}
#define INT64_SETTING(k, f, d, lo, hi, u, h)                                                \
    {.key = (k), .type = ATRIUM_SETTING_INT64, .offset = FIELD(f), .def = (d), .min = (lo), \
     .max = (hi), .unit = (u), .help = (h)}

const atrium_setting MEDIA_SETTINGS[] = {
    INT64_SETTING(ATRIUM_MEDIA_SETTING_MAX_UPLOAD, max_upload_bytes, DEFAULT_MAX_UPLOAD_BYTES, 1,
                  MAX_UPLOAD_BYTES_LIMIT, "bytes",
                  "Largest upload; a larger one gets 413 M_TOO_LARGE and leaves nothing behind."),
    {.key = ATRIUM_MEDIA_SETTING_STORE_PATH, .type = ATRIUM_SETTING_STRING, .offset = FIELD(store_path),
     .def_string = DEFAULT_STORE_PATH,
     .help = "Folder of originals (local/) and thumbnails (thumbnails/); relative to the "
             "server's working directory."},
    INT_SETTING(ATRIUM_MEDIA_SETTING_SLOTS, delivery_slots, DEFAULT_DELIVERY_SLOTS, 1, 100000, "requests",
                "Content responses in flight at once (each holds at most one open file)."),
    INT_SETTING(ATRIUM_MEDIA_SETTING_QUEUE, delivery_queue, DEFAULT_DELIVERY_QUEUE, 0, 1000000,
                "requests", "Requests that may wait, parked, for a delivery slot."),
    INT_SETTING(ATRIUM_MEDIA_SETTING_QUEUE_PER_CLIENT, delivery_queue_per_client,
                DEFAULT_DELIVERY_QUEUE_PER_CLIENT, 0, 1000000, "requests",
                "Of the waiting requests, how many may come from one client (0 = no cap)."),
    INT64_SETTING(ATRIUM_MEDIA_SETTING_WAIT_MS, delivery_wait_ms, DEFAULT_DELIVERY_WAIT_MS, 1,
                  PARK_LIMIT_MS, "ms", "Longest wait for a delivery slot (then 429)."),
    {.key = "thumbnail_sizes", .type = ATRIUM_SETTING_STRING, .offset = FIELD(thumbnail_sizes),
     .def_string = MEDIA_DEFAULT_SIZES,
     .help = "Thumbnail sizes rendered, as `<W>x<H> crop` or `<W>x<H> scale`, separated by commas."},
    INT64_SETTING("max_image_pixels", max_image_pixels, DEFAULT_MAX_IMAGE_PIXELS, 1,
                  100000LL * 100000LL, "pixels",
                  "Images whose header claims more pixels (a frame, or the declared canvas, as of a GIF's "
                  "screen) are not thumbnailed nor served as their own thumbnail (413)."),
    {.key = "render_threads", .type = ATRIUM_SETTING_INT, .offset = FIELD(render_threads),
     .def = 1, .min = 1, .max = 256, .unit = "threads", .default_doc = "CPU cores",
     .help = "Thumbnail renders at once (bounds the memory decoding takes)."},
    INT_SETTING("render_queue", render_queue, DEFAULT_RENDER_QUEUE, 1, 1000000, "renders",
                "Renders that may wait for a render thread."),
    INT64_SETTING("render_wait_ms", render_wait_ms, DEFAULT_RENDER_WAIT_MS, 0, PARK_LIMIT_MS,
                  "ms", "How long a thumbnail request waits for its render before it gets the "
                        "nearest size already rendered."),
    INT_SETTING("io_threads", io_threads, DEFAULT_IO_THREADS, 1, 256, "threads",
                "Workers that make uploads durable (fsync, rename)."),
    INT_SETTING("io_queue", io_queue, DEFAULT_IO_QUEUE, 1, 1000000, "tasks",
                "Uploads that may wait for an io thread."),
    INT_SETTING("ratelimit_upload_per_minute", upload_rate_per_minute,
                DEFAULT_UPLOAD_RATE_PER_MINUTE, 1, 1000000, "per minute",
                "Uploads (POST upload, create, PUT upload) per user: how fast the bucket "
                "refills (429 past it; off with ratelimit.enabled: false)."),
    INT_SETTING("ratelimit_upload_burst", upload_rate_burst, DEFAULT_UPLOAD_RATE_BURST, 1,
                1000000, "uploads",
                "Uploads per user: how many at once before the rate applies."),
    INT64_SETTING("upload_quota_bytes", upload_quota_bytes, 0, 0, INT64_MAX, "bytes",
                  "Bytes one user may upload per upload_quota_window_ms; past it 400 "
                  "M_RESOURCE_LIMIT_EXCEEDED (0 = no quota)."),
    INT64_SETTING("upload_quota_window_ms", upload_quota_window_ms,
                  DEFAULT_UPLOAD_QUOTA_WINDOW_MS, 1000, UPLOAD_QUOTA_WINDOW_MAX_MS, "ms",
                  "The sliding window upload_quota_bytes counts uploads in."),
    INT_SETTING("max_pending_uploads", max_pending_uploads, DEFAULT_MAX_PENDING_UPLOADS, 1,
                1000000, "IDs", "Created and not yet uploaded media IDs per user (then 429)."),
    INT64_SETTING("unused_upload_expiry_ms", unused_expiry_ms, DEFAULT_UNUSED_EXPIRY_MS, 1000,
                  365LL * 24 * 3600 * 1000, "ms", "Lifetime of a created media ID."),
    INT64_SETTING("upload_wait_default_ms", upload_wait_default_ms, DEFAULT_UPLOAD_WAIT_MS, 0,
                  PARK_LIMIT_MS, "ms",
                  "How long a download waits for an asynchronous upload when it gives no "
                  "timeout_ms."),
    INT64_SETTING("upload_wait_max_ms", upload_wait_max_ms, DEFAULT_UPLOAD_WAIT_MAX_MS, 0,
                  PARK_LIMIT_MS, "ms", "The most a download's timeout_ms may ask for."),
    {.key = "legacy_media", .type = ATRIUM_SETTING_BOOL, .offset = FIELD(legacy_media),
     .def = 0, .min = 0, .max = 1,
     .help = "Serve the unauthenticated legacy paths /_matrix/media/v3/download and "
             "/thumbnail."},
    INT64_SETTING("legacy_freeze_ts", legacy_freeze_ts, 0, 0, INT64_MAX, "ms since the epoch",
                  "Media created at or after this is not served on the legacy paths (0 = "
                  "none)."),
    {.key = "remote_fetch_enabled", .type = ATRIUM_SETTING_BOOL,
     .offset = FIELD(remote_fetch_enabled), .def = 1, .min = 0, .max = 1,
     .help = "Fetch other servers' media over federation (off: it is 404 M_NOT_FOUND)."},
    INT_SETTING("media_fetch_threads", fetch_threads, DEFAULT_FETCH_THREADS, 1, 1024, "threads",
                "Fetch pool workers: they start fetches and store what arrives; none ever "
                "waits on another server."),
    INT_SETTING("media_fetch_max_in_flight", fetch_max_in_flight, DEFAULT_FETCH_MAX_IN_FLIGHT, 1,
                100000, "requests",
                "Fetch budget: remote media requests fetching or queued, all clients."),
    INT_SETTING("media_fetch_max_per_client", fetch_max_per_client, DEFAULT_FETCH_MAX_PER_CLIENT,
                1, 100000, "requests", "Fetch budget: of which from one client (user)."),
    INT_SETTING("media_fetch_line_per_client", fetch_line_per_client,
                DEFAULT_FETCH_LINE_PER_CLIENT, 0, 100000, "requests",
                "Requests of one client that may wait, parked, for a fetch budget slot; past "
                "it 429 (0 = 429 at once over a cap)."),
    INT64_SETTING("remote_fetch_timeout_ms", remote_fetch_timeout_ms,
                  DEFAULT_REMOTE_FETCH_TIMEOUT_MS, 100, PARK_LIMIT_MS, "ms",
                  "Longest one fetch may take, whoever waits for it."),
    INT_SETTING("remote_fetch_max_per_origin", remote_fetch_max_per_origin,
                DEFAULT_REMOTE_FETCH_MAX_PER_ORIGIN, 1, 100000, "fetches",
                "Fetches of one origin at once; the next wait for one of them to end."),
    INT64_SETTING("remote_not_found_cache_ms", remote_not_found_cache_ms,
                  DEFAULT_REMOTE_NOT_FOUND_CACHE_MS, 0, 24LL * 3600 * 1000, "ms",
                  "How long an origin's 404, a too-large file or a missing thumbnail is "
                  "remembered (0 = not)."),
    INT64_SETTING("remote_failure_cache_ms", remote_failure_cache_ms,
                  DEFAULT_REMOTE_FAILURE_CACHE_MS, 0, 24LL * 3600 * 1000, "ms",
                  "How long an unreachable origin or a garbage answer is remembered (0 = not)."),
    INT64_SETTING("remote_cache_max_bytes", remote_cache_max_bytes,
                  DEFAULT_REMOTE_CACHE_MAX_BYTES, 0, INT64_MAX, "bytes",
                  "Bound of the remote cache; past it the least recently used copies go "
                  "(0 = no bound)."),
    {.key = "prevent_media_downloads_from", .type = ATRIUM_SETTING_STRING,
     .offset = FIELD(blocked_origins_text), .def_string = "",
     .help = "Origins (server names, separated by commas) whose media is never fetched."},
    {.key = "url_preview_enabled", .type = ATRIUM_SETTING_BOOL,
     .offset = FIELD(url_preview_enabled), .def = 0, .min = 0, .max = 1,
     .help = "Serve URL previews (GET /_matrix/client/v1/media/preview_url and "
             "/_matrix/media/v3/preview_url): this server then fetches the http(s) pages users name, "
             "under the federation address blacklist (off: 404 M_UNRECOGNIZED)."},
    INT64_SETTING("url_preview_max_bytes", url_preview_max_bytes, DEFAULT_URL_PREVIEW_MAX_BYTES,
                  1024, URL_PREVIEW_MAX_BYTES_LIMIT, "bytes",
                  "Largest page, and largest og:image, a preview reads (a larger page is 502 "
                  "M_TOO_LARGE; a larger image is left out)."),
    INT64_SETTING("url_preview_timeout_ms", url_preview_timeout_ms, DEFAULT_URL_PREVIEW_TIMEOUT_MS,
                  100, URL_PREVIEW_TIMEOUT_LIMIT_MS, "ms",
                  "Longest a whole preview (page, redirects, image) may take (then 504)."),
    INT_SETTING("url_preview_max_redirects", url_preview_max_redirects,
                DEFAULT_URL_PREVIEW_MAX_REDIRECTS, 0, 20, "redirects",
                "Redirects followed for a page, and for its image (past them 502)."),
    INT_SETTING("url_preview_max_in_flight", url_preview_max_in_flight,
                DEFAULT_URL_PREVIEW_MAX_IN_FLIGHT, 1, 100000, "previews",
                "Previews fetching at once, all users (past it 429); each holds one of the "
                "outbound connections federation uses (federation.client.max_connections)."),
    INT_SETTING("url_preview_max_per_user", url_preview_max_per_user,
                DEFAULT_URL_PREVIEW_MAX_PER_USER, 1, 100000, "previews",
                "Of which one user's (past it 429)."),
    INT_SETTING("url_preview_max_waiting", url_preview_max_waiting,
                DEFAULT_URL_PREVIEW_MAX_WAITING, 1, 100000, "requests",
                "Requests waiting, parked, for the fetch another request started for the same "
                "URL and ts bucket, all users (past it 429); they are answered from its result."),
    INT64_SETTING("url_preview_cache_ttl_ms", url_preview_cache_ttl_ms,
                  DEFAULT_URL_PREVIEW_CACHE_TTL_MS, 1000, 30LL * 24 * 3600 * 1000, "ms",
                  "How long a preview is kept and answered again without asking the site; a "
                  "request's ts is rounded down to a multiple of it."),
    /* The object store (s3.c; docs/adr/0011-media-on-an-object-store.md). */
    {.key = "storage", .type = ATRIUM_SETTING_STRING, .offset = FIELD(storage),
     .def_string = "local",
     .help = "Where originals live: `local` (store_path) or `s3` (the bucket below; "
             "store_path is then a cache of it)."},
    {.key = "s3_endpoint", .type = ATRIUM_SETTING_STRING, .offset = FIELD(s3_endpoint),
     .def_string = "", .help = "s3: the store's URL, e.g. `https://s3.example.org`."},
    {.key = "s3_region", .type = ATRIUM_SETTING_STRING, .offset = FIELD(s3_region),
     .def_string = "us-east-1", .help = "s3: the region requests are signed for (AWS Signature V4)."},
    {.key = "s3_bucket", .type = ATRIUM_SETTING_STRING, .offset = FIELD(s3_bucket),
     .def_string = "", .help = "s3: the bucket (it must exist; checked at start)."},
    {.key = "s3_access_key_id", .type = ATRIUM_SETTING_STRING, .offset = FIELD(s3_access_key_id),
     .def_string = "", .help = "s3: the access key."},
    {.key = "s3_secret_access_key", .type = ATRIUM_SETTING_STRING,
     .offset = FIELD(s3_secret_access_key), .def_string = "",
     .help = "s3: the secret key (never logged); or use s3_secret_access_key_file."},
    {.key = "s3_secret_access_key_file", .type = ATRIUM_SETTING_STRING,
     .offset = FIELD(s3_secret_access_key_file), .def_string = "",
     .help = "s3: a file whose first line is the secret key."},
    {.key = "s3_path_style", .type = ATRIUM_SETTING_BOOL, .offset = FIELD(s3_path_style),
     .def = 1, .min = 0, .max = 1,
     .help = "s3: address objects as `<endpoint>/<bucket>/<key>` (true) or "
             "`<bucket>.<endpoint host>/<key>` (false)."},
    {.key = "s3_ca_file", .type = ATRIUM_SETTING_STRING, .offset = FIELD(s3_ca_file),
     .def_string = "", .help = "s3: CA certificates to trust for an https endpoint (empty: the system's)."},
    INT64_SETTING("s3_part_size_bytes", s3_part_size_bytes, 8LL * 1024 * 1024, 1,
                  5LL * 1024 * 1024 * 1024, "bytes",
                  "s3: originals larger than this go to the bucket as a multipart upload of "
                  "parts this large; at least 5242880 (5 MiB, the smallest part S3 takes), "
                  "else the start is refused."),
    INT_SETTING("s3_max_concurrent", s3_max_concurrent, 8, 1, 256, "requests",
                "s3: requests to the store at once (the store pool's workers)."),
    INT64_SETTING("s3_timeout_ms", s3_timeout_ms, 30000, 100, 600000, "ms",
                  "s3: longest one store request may take, and longest wait for a free request "
                  "slot (then the upload or download gets 503)."),
    INT64_SETTING("local_cache_max_bytes", local_cache_max_bytes, 0, 0, INT64_MAX, "bytes",
                  "s3: bound of the local folder's originals as a cache of the bucket (0 = "
                  "none); past it the least recently used originals in the bucket are evicted."),
    INT64_SETTING("orphan_min_age_ms", orphan_min_age_ms, DEFAULT_ORPHAN_MIN_AGE_MS,
                  ORPHAN_MIN_AGE_FLOOR_MS, ORPHAN_LIMIT_MS, "ms",
                  "Files in the store that no row names (originals, thumbnails, .tmp- files) "
                  "are removed once unchanged this long; keep it above "
                  "server.http.body_idle_timeout_s + server.http.handoff_deadline_ms + "
                  "s3_timeout_ms, the longest a running upload leaves its file unchanged."),
    INT64_SETTING("orphan_sweep_period_ms", orphan_sweep_period_ms,
                  DEFAULT_ORPHAN_SWEEP_PERIOD_MS, 1000, ORPHAN_LIMIT_MS, "ms",
                  "How often the store is swept for such files (once at start in every "
                  "process, then in the one holding the lease store.orphans)."),
};
_Static_assert(sizeof(MEDIA_SETTINGS) / sizeof(MEDIA_SETTINGS[0]) == MEDIA_N_SETTINGS,
               "MEDIA_N_SETTINGS (media.h) must count the rows of MEDIA_SETTINGS");
