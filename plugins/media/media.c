/*
 * plugins/media/media.c - the media plugin (provides "media/1"): its settings, its routes,
 * its pools, line and events, and its lifecycle; plus the media configuration endpoint.
 *
 * Decisions owned here: the names, defaults, ranges and help of every plugins.media
 * setting, declared once in MEDIA_SETTINGS (media_settings.c; the host reads them and refuses unknown keys,
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

#define DELIVERY_RETRY_AFTER_MS 1000
#define FETCH_POOL_SPARE_TASKS 64 /* beyond the budget: the end of fetches whose requests left */
#define SECONDS_PER_MINUTE 60.0
#define FDS_PER_RENDER 4 /* original, output, libvips' own */

const atrium_host *media_host;

static int get_config(atrium_req *req)
{
    media *m = media_of(req);
    if (!media_authenticate(m, req)) return ATRIUM_DONE;
    json_t *body = json_pack("{s:I}", "m.upload.size", (json_int_t)m->cfg.max_upload_bytes);
    return media_reply(m, req, body);
}


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
    s3_stream_fini(m);
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
    if (rc == 0) rc = remote_s3_init(m);
    if (rc == 0) rc = s3_cache_init(m);
    if (rc == 0) rc = s3_stream_init(m);
    if (rc == 0) rc = s3_upstream_init(m);
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
