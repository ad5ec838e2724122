/*
 * plugins/media/media.c - the media plugin (provides "media/1"): its settings, its routes,
 * its pools, line and events, and its lifecycle; plus the media configuration endpoint.
 *
 * Decisions owned here: the names, defaults, ranges and help of every plugins.media
 * setting, declared once in MEDIA_SETTINGS (the host reads them and refuses unknown keys,
 * host->config_load, and documents them), and the bounds that follow from
 * them - delivery_slots requests hold a slot (and at most one file) at a time,
 * render_threads renders run at once, io_threads workers make uploads durable. The
 * behaviours live in the files media.h lists; this file only wires them to the host.
 * The plugin is built only against include/atrium/ (plus libc, jansson, libpq, libvips,
 * libwebp) and would work the same as a replacement plugin.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "media.h"
#include "s3.h"

#define DEFAULT_MAX_UPLOAD_BYTES (50LL * 1024 * 1024)
#define MAX_UPLOAD_BYTES_LIMIT (4LL * 1024 * 1024 * 1024)
#define DEFAULT_STORE_PATH "./media_store"
#define DEFAULT_DELIVERY_SLOTS 64
#define DEFAULT_DELIVERY_QUEUE 1024
#define DEFAULT_DELIVERY_QUEUE_PER_CLIENT 512
#define DEFAULT_DELIVERY_WAIT_MS 30000
#define DELIVERY_RETRY_AFTER_MS 1000
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
#define SECONDS_PER_MINUTE 60.0
#define FDS_PER_RENDER 4 /* original, output, libvips' own */
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
#define FETCH_POOL_SPARE_TASKS 64 /* beyond the budget: the end of fetches whose requests left */

const atrium_host *media_host;

static int get_config(atrium_req *req)
{
    media *m = media_of(req);
    if (!media_authenticate(m, req)) return ATRIUM_DONE;
    json_t *body = json_pack("{s:I}", "m.upload.size", (json_int_t)m->cfg.max_upload_bytes);
    return media_reply(m, req, body);
}

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

static const atrium_setting MEDIA_SETTINGS[] = {
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
#define MEDIA_N_SETTINGS (sizeof(MEDIA_SETTINGS) / sizeof(MEDIA_SETTINGS[0]))

/* prevent_media_downloads_from: server names separated by commas or spaces. The list is
 * kept in the plugin object (the host's string is split into copies). */
static int parse_origins(media *m, const char *text)
{
    media_config *c = &m->cfg;
    const char *p = text;
    while (*p) {
        while (*p == ',' || *p == ' ') p++;
        if (!*p) break;
        size_t n = strcspn(p, ", ");
        char *name = strndup(p, n);
        if (!name || !media_server_name_valid(name) || c->n_blocked_origins >= MEDIA_MAX_BLOCKED_ORIGINS) {
            m->h->log(m->self, ATRIUM_LOG_ERROR,
                      "invalid configuration: plugins.media.prevent_media_downloads_from: "
                      "\"%.*s\" is not a server name, or more than %d are listed",
                      (int)n, p, MEDIA_MAX_BLOCKED_ORIGINS);
            free(name);
            return ATRIUM_E_INVAL;
        }
        c->blocked_origins[c->n_blocked_origins++] = name;
        p += n;
    }
    return 0;
}

static int read_settings(media *m, const atrium_config *cfg)
{
    const atrium_host *h = m->h;
    atrium_plugin *self = m->self;
    media_config *c = &m->cfg;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    c->render_threads = cores < 1 ? 1 : cores > 256 ? 256 : (int)cores; /* unless configured */
    if (h->config_load(self, cfg, c) < 0) return ATRIUM_E_INVAL;
    if (parse_origins(m, c->blocked_origins_text ? c->blocked_origins_text : "") < 0)
        return ATRIUM_E_INVAL;
    c->delivery_retry_after_ms = DELIVERY_RETRY_AFTER_MS;
    char err[160];
    int n = media_sizes_parse(c->thumbnail_sizes, c->sizes, MEDIA_MAX_SIZES, err, sizeof(err));
    if (n < 0) {
        h->log(self, ATRIUM_LOG_ERROR,
               "invalid configuration: plugins.media.thumbnail_sizes: %s (expected e.g. \"%s\")",
               err, MEDIA_DEFAULT_SIZES);
        return ATRIUM_E_INVAL;
    }
    c->n_sizes = (size_t)n;
    if (s3_settings_check(m) < 0) return ATRIUM_E_INVAL;
    if (!*c->store_path || strchr(c->store_path, '[') ||
        strlen(c->store_path) > MEDIA_PATH_MAX / 2) {
        h->log(self, ATRIUM_LOG_ERROR,
               "invalid configuration: plugins.media.store_path must be a folder path of at "
               "most %d characters without '['",
               MEDIA_PATH_MAX / 2);
        return ATRIUM_E_INVAL;
    }
    return 0;
}

static int register_routes(media *m)
{
    int64_t body = m->cfg.max_upload_bytes;
    const atrium_route routes[] = {
        {.method = "GET", .path = ATRIUM_MEDIA_PATH_CONFIG, .handler = get_config},
        {.method = "GET", .path = ATRIUM_MEDIA_PATH_CONFIG_V3, .handler = get_config},
        {.method = "POST",
         .path = ATRIUM_MEDIA_PATH_UPLOAD,
         .handler = upload_handler,
         .max_body_bytes = body,
         .flags = ATRIUM_ROUTE_STREAM_BODY | ATRIUM_ROUTE_HEADERS_FIRST | ATRIUM_ROUTE_COMMITS,
         .body_chunk = upload_body_chunk},
        {.method = "PUT",
         .path = ATRIUM_MEDIA_PATH_UPLOAD_PUT,
         .handler = upload_put_handler,
         .max_body_bytes = body,
         .flags = ATRIUM_ROUTE_STREAM_BODY | ATRIUM_ROUTE_HEADERS_FIRST | ATRIUM_ROUTE_COMMITS,
         .body_chunk = upload_put_body_chunk},
        {.method = "POST", .path = ATRIUM_MEDIA_PATH_CREATE, .handler = create_handler},
        {.method = "GET",
         .path = ATRIUM_MEDIA_PATH_DOWNLOAD,
         .handler = download_handler},
        {.method = "GET",
         .path = ATRIUM_MEDIA_PATH_DOWNLOAD_NAMED,
         .handler = download_handler},
        {.method = "GET",
         .path = ATRIUM_MEDIA_PATH_THUMBNAIL,
         .handler = thumbnail_handler},
        {.method = "GET",
         .path = ATRIUM_MEDIA_PATH_LEGACY_DOWNLOAD,
         .handler = download_legacy_handler},
        {.method = "GET",
         .path = ATRIUM_MEDIA_PATH_LEGACY_DOWNLOAD_NAMED,
         .handler = download_legacy_handler},
        {.method = "GET",
         .path = ATRIUM_MEDIA_PATH_LEGACY_THUMBNAIL,
         .handler = thumbnail_legacy_handler},
        {.method = "GET",
         .path = ATRIUM_MEDIA_PATH_FED_DOWNLOAD,
         .handler = fed_download_handler,
         .flags = ATRIUM_ROUTE_FEDERATION},
        {.method = "GET",
         .path = ATRIUM_MEDIA_PATH_FED_THUMBNAIL,
         .handler = fed_thumbnail_handler,
         .flags = ATRIUM_ROUTE_FEDERATION},
    };
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
        atrium_route r = routes[i];
        r.arg = m;
        int rc = m->h->route_add(m->self, &r);
        if (rc < 0) return rc;
    }
    int rc = preview_init(m);
    return rc < 0 ? rc : admin_register(m);
}

static int create_metrics(media *m)
{
    const atrium_host *h = m->h;
    atrium_plugin *s = m->self;
    m->m_uploads = h->metric_counter(s, "atrium_media_uploads_total", NULL, "Uploads stored");
    m->m_upload_bytes =
        h->metric_counter(s, "atrium_media_upload_bytes_total", NULL, "Bytes of uploads stored");
    m->m_downloads = h->metric_counter(s, "atrium_media_downloads_total", NULL, "Originals served");
    m->m_thumbnails = h->metric_counter(s, "atrium_media_thumbnails_total", NULL,
                                        "Thumbnail responses with a body");
    m->m_renders_ok =
        h->metric_counter(s, "atrium_media_renders_total", "result=\"ok\"", "Thumbnail renders");
    m->m_renders_failed = h->metric_counter(s, "atrium_media_renders_total", "result=\"failed\"",
                                            "Thumbnail renders");
    m->m_renders_running =
        h->metric_gauge(s, "atrium_media_renders_running", NULL, "Thumbnail renders running now");
    m->m_render_coalesced =
        h->metric_counter(s, "atrium_media_render_coalesced_total", NULL,
                          "Thumbnail requests that joined a render already under way");
    m->m_authorizing = h->metric_gauge(s, "atrium_media_authorizing", NULL,
                                       "Media requests whose access token is being checked now");
    m->m_authorizing_peak = h->metric_gauge(s, "atrium_media_authorizing_peak", NULL,
                                            "Most media authorizations ever running at once");
    m->m_authorizations = h->metric_counter(s, "atrium_media_authorizations_total", NULL,
                                            "Media content requests authorized (once per request)");
    m->m_delivering = h->metric_gauge(s, "atrium_media_delivering", NULL,
                                      "Media requests holding a delivery slot");
    m->m_fallback_nearest =
        h->metric_counter(s, "atrium_media_thumbnail_fallback_total", "kind=\"nearest\"",
                          "Thumbnail requests answered without their render");
    m->m_fallback_unavailable =
        h->metric_counter(s, "atrium_media_thumbnail_fallback_total", "kind=\"unavailable\"",
                          "Thumbnail requests answered without their render");
    m->m_not_yet_uploaded =
        h->metric_counter(s, "atrium_media_not_yet_uploaded_total", NULL,
                          "Downloads that gave up waiting for an asynchronous upload");
    m->m_upload_waiters =
        h->metric_gauge(s, "atrium_media_upload_waiters", NULL,
                        "Downloads waiting (with their delivery slot) for an asynchronous upload");
    m->m_row_hits = h->metric_counter(s, "atrium_media_row_cache_total", "result=\"hit\"",
                                      "Local media rows looked up in the row cache");
    m->m_row_misses = h->metric_counter(s, "atrium_media_row_cache_total", "result=\"miss\"",
                                        "Local media rows looked up in the row cache");
    m->m_refused_policy = h->metric_counter(s, "atrium_media_refused_quarantined_total", NULL,
                                            "Requests refused because the media is quarantined");
    m->m_fetches_ok = h->metric_counter(s, "atrium_media_remote_fetches_total", "outcome=\"ok\"",
                                        "Fetches of remote media, by outcome");
    m->m_fetches_not_found = h->metric_counter(s, "atrium_media_remote_fetches_total",
                                               "outcome=\"not_found\"",
                                               "Fetches of remote media, by outcome");
    m->m_fetches_too_large = h->metric_counter(s, "atrium_media_remote_fetches_total",
                                               "outcome=\"too_large\"",
                                               "Fetches of remote media, by outcome");
    m->m_fetches_failed = h->metric_counter(s, "atrium_media_remote_fetches_total",
                                            "outcome=\"failed\"",
                                            "Fetches of remote media, by outcome");
    m->m_fetches_running = h->metric_gauge(s, "atrium_media_remote_fetches_running", NULL,
                                           "Fetches of remote media under way");
    m->m_fetch_coalesced =
        h->metric_counter(s, "atrium_media_remote_fetch_coalesced_total", NULL,
                          "Requests that joined a fetch of the same remote file under way");
    m->m_fetch_bytes = h->metric_counter(s, "atrium_media_remote_fetch_bytes_total", NULL,
                                         "Bytes of remote media stored");
    m->m_remote_hits = h->metric_counter(s, "atrium_media_remote_cache_hits_total", NULL,
                                         "Remote media requests answered from the cache");
    m->m_fetch_legacy = h->metric_counter(s, "atrium_media_remote_fetch_legacy_total", NULL,
                                          "Fetches retried on the legacy download endpoint");
    m->m_fetch_in_flight = h->metric_gauge(s, "atrium_media_fetch_budget_in_flight", NULL,
                                           "Fetch budget slots held");
    m->m_fetch_line_waiting = h->metric_gauge(s, "atrium_media_fetch_line_waiting", NULL,
                                              "Requests waiting in the fetch line");
    m->m_fetch_in_flight_client_max =
        h->metric_gauge(s, "atrium_media_fetch_budget_in_flight_client_max", NULL,
                        "Fetch budget slots held by the client holding the most");
    m->m_fetch_line_waits = h->metric_counter(s, "atrium_media_fetch_line_waits_total", NULL,
                                              "Requests that waited in the fetch line");
    m->m_fetch_line_refused = h->metric_counter(s, "atrium_media_fetch_line_refused_total", NULL,
                                                "Requests refused (429) past the fetch line");
    m->m_fed_served = h->metric_counter(s, "atrium_media_federation_served_total", NULL,
                                        "Media answers sent to other servers");
    m->m_negative_hits = h->metric_counter(s, "atrium_media_remote_negative_hits_total", NULL,
                                           "Remote media answered from a remembered failure");
    m->m_fetch_retried =
        h->metric_counter(s, "atrium_media_remote_fetch_retried_total", NULL,
                          "Fetches asked again after the origin answered 429");
    m->m_fetch_streamed =
        h->metric_counter(s, "atrium_media_remote_streamed_total", NULL,
                          "Requests served a remote file while it was being fetched");
    static const char *const via[MEDIA_FETCH_VIA_KINDS] = {"via=\"federation\"", "via=\"legacy\"",
                                      "via=\"location\""};
    for (size_t i = 0; i < MEDIA_FETCH_VIA_KINDS; i++) {
        m->m_fetched_via[i] = h->metric_counter(
            s, "atrium_media_remote_fetched_total", via[i],
            "Remote files stored, by the answer that delivered them (the authenticated "
            "federation endpoint, the legacy one, or a Location / redirect followed)");
        if (!m->m_fetched_via[i]) return ATRIUM_E_INVAL;
    }
    m->m_remote_cache_bytes = h->metric_gauge(s, "atrium_media_remote_cache_bytes", NULL,
                                              "Bytes of remote media in the cache");
    m->m_remote_evictions = h->metric_counter(s, "atrium_media_remote_cache_evictions_total", NULL,
                                              "Remote copies removed to keep the cache in bounds");
    atrium_metric *remote_all[] = {m->m_negative_hits, m->m_remote_cache_bytes, m->m_remote_evictions,
        m->m_fetches_ok,      m->m_fetches_not_found, m->m_fetches_too_large,
        m->m_fetches_failed,  m->m_fetches_running,   m->m_fetch_coalesced,
        m->m_fetch_bytes,     m->m_remote_hits,       m->m_fetch_legacy,
        m->m_fetch_in_flight, m->m_fetch_line_waiting, m->m_fetch_line_refused,
        m->m_fetch_in_flight_client_max, m->m_fetch_line_waits,
        m->m_fed_served, m->m_fetch_streamed, m->m_fetch_retried};
    for (size_t i = 0; i < sizeof(remote_all) / sizeof(remote_all[0]); i++)
        if (!remote_all[i]) return ATRIUM_E_INVAL;
    atrium_metric *all[] = {m->m_uploads,          m->m_upload_bytes,         m->m_downloads,
                            m->m_thumbnails,       m->m_renders_ok,           m->m_renders_failed,
                            m->m_renders_running,  m->m_render_coalesced,     m->m_authorizing,
                            m->m_authorizing_peak, m->m_authorizations,       m->m_delivering,
                            m->m_fallback_nearest, m->m_fallback_unavailable, m->m_not_yet_uploaded,
                            m->m_refused_policy,   m->m_upload_waiters,
                            m->m_row_hits,         m->m_row_misses};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        if (!all[i]) return ATRIUM_E_INVAL;
    return 0;
}

static int create_mechanisms(media *m)
{
    const atrium_host *h = m->h;
    const media_config *c = &m->cfg;
    m->delivery = h->line_create(m->self, ATRIUM_MEDIA_DELIVERY_LINE, c->delivery_slots, c->delivery_queue,
                                 c->delivery_queue_per_client, c->delivery_wait_ms);
    m->render_pool = h->pool_create(m->self, "render", c->render_threads, c->render_queue);
    m->io_pool = h->pool_create(m->self, "io", c->io_threads, c->io_queue);
    /* As deep as the budget: an admitted handoff is never refused for queue space. */
    m->fetch_pool = h->pool_create(m->self, "fetch", c->fetch_threads,
                                   c->fetch_max_in_flight + FETCH_POOL_SPARE_TASKS);
    m->rl_upload = h->ratelimit_create(m->self, "upload",
                                       c->upload_rate_per_minute / SECONDS_PER_MINUTE,
                                       (double)c->upload_rate_burst);
    if (!m->delivery || !m->render_pool || !m->io_pool || !m->fetch_pool || !m->rl_upload)
        return ATRIUM_E_NOMEM;
    for (size_t i = 0; i < MEDIA_EVENT_BUCKETS; i++)
        if (!(m->events[i] = h->event_create(m->self)) ||
            !(m->stream_events[i] = h->event_create(m->self)))
            return ATRIUM_E_NOMEM;
    m->can_stream = ATRIUM_HOST_HAS(h, respond_stream_wait);
    return create_metrics(m);
}

static void media_free(media *m)
{
    thumbnails_fini(m);
    remote_fini(m);
    fetch_budget_fini(m);
    cache_fini(m);
    rowcache_fini(m);
    fdcache_fini(m); /* after remote_fini: the timer (and the sweep) has stopped */
    s3_cache_fini(m); /* after remote_fini: the timer (and its check) has stopped */
    s3_fini(m);
    for (size_t i = 0; i < m->cfg.n_blocked_origins; i++) free((char *)m->cfg.blocked_origins[i]);
    pthread_mutex_destroy(&m->wake_mu);
    free(m);
}

bool media_server_name_valid(const char *name)
{
    return name && media_host->server_name_valid(name) == 1;
}

static int media_init(const atrium_host *host, atrium_plugin *self, const atrium_config *cfg,
                      void **state)
{
    media *m = calloc(1, sizeof(*m));
    if (!m) return ATRIUM_E_NOMEM;
    m->h = host;
    m->self = self;
    pthread_mutex_init(&m->wake_mu, NULL);
    media_host = host;
    snprintf(m->server_name, sizeof(m->server_name), "%s", host->server_name());
    int rc = read_settings(m, cfg);
    if (rc == 0) rc = thumbnails_init(m);
    if (rc == 0) rc = remote_init(m);
    if (rc == 0) rc = fetch_budget_init(m);
    if (rc == 0) rc = cache_init(m);
    if (rc == 0) rc = rowcache_init(m);
    if (rc == 0) rc = fdcache_init(m);
    if (rc == 0) rc = s3_init(m);
    if (rc == 0) rc = s3_cache_init(m);
    if (rc == 0 && !ATRIUM_HOST_HAS(host, fed_request)) {
        host->log(self, ATRIUM_LOG_ERROR, "the media plugin needs host ABI 1.1 (federation)");
        rc = ATRIUM_E_STATE;
    }
    if (rc == 0) rc = create_mechanisms(m);
    if (rc == 0) rc = cluster_init(m);
    if (rc == 0) rc = orphans_init(m);
    if (rc == 0) rc = host->db_migrations(self, MEDIA_MIGRATIONS, MEDIA_N_MIGRATIONS);
    if (rc == 0) rc = register_routes(m);
    if (rc < 0) {
        media_free(m);
        return rc;
    }
    *state = m;
    return 0;
}

/* The descriptors media work may hold at once, against the process's limit. */
static void check_descriptor_budget(media *m)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0) return;
    long need = (long)m->cfg.delivery_slots + (long)m->cfg.render_threads * FDS_PER_RENDER +
                2L * m->cfg.io_threads + FDCACHE_SLOTS;
    if (need > (long)rl.rlim_cur / 2)
        m->h->log(m->self, ATRIUM_LOG_WARN,
                  "media may hold %ld file descriptors at once (delivery_slots + renders + io + "
                  "open-file cache) "
                  "of the %ld this process may open: lower plugins.media.delivery_slots or "
                  "raise the limit (ulimit -n), and keep server.http.fd_reserve above %ld",
                  need, (long)rl.rlim_cur, need);
}

static int media_start(void *state)
{
    media *m = state;
    int rc = render_global_init(m);
    if (rc < 0) return rc;
    m->vips_started = true;
    rc = store_init(m);
    if (rc < 0) return rc;
    int removed = store_sweep(m);
    rc = s3_start(m);
    if (rc < 0) return rc;
    rc = cache_start(m);
    if (rc < 0) return rc;
    rc = fdcache_start(m);
    if (rc < 0) return rc;
    rc = orphans_start(m);
    if (rc < 0) return rc;
    rc = s3_cache_start(m);
    if (rc < 0) return rc;
    m->h->log(m->self, ATRIUM_LOG_INFO,
              "media store %s ready (%d temp leftover(s) removed); %d delivery slots, %d "
              "render threads",
              m->cfg.store_path, removed, m->cfg.delivery_slots, m->cfg.render_threads);
    check_descriptor_budget(m);
    return 0;
}

static void media_fini(void *state)
{
    media *m = state;
    if (!m) return; /* init failed: nothing was kept */
    if (m->vips_started) render_global_fini();
    media_free(m);
}

ATRIUM_PLUGIN(.name = "media", .version = "1.0.0", .provides = ATRIUM_MEDIA_IFACE, .init = media_init,
              .start = media_start, .fini = media_fini, .settings = MEDIA_SETTINGS,
              .n_settings = MEDIA_N_SETTINGS)
