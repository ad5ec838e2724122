/*
 * core/federation/transport/federation.c - builds the federation module from the configuration and
 * holds it for the life of the process: the signing key (created on first start), the
 * address lists, the outbound client, discovery, backoff, the key ring and its fetches,
 * the routes, and the federation listener's certificate.
 *
 * Start-up order (main.c): federation_init before listening (routes and the listener are
 * registered then), the "federation" migrations, federation_start (threads), and at
 * shutdown federation_stop after the listeners stopped taking requests. The outbound side
 * exists even when no federation listener is served (no certificate): this server can
 * still ask others for keys and profiles.
 */
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/federation/transport/fed_internal.h"
#include "core/rooms/rooms_tx.h"
#include "core/store/db.h"

#define FED_HTTP_QUEUE_DEPTH 4096       /* outbound requests submitted, not yet started */
#define FED_RESOLVE_TIMEOUT_MS 15000     /* one discovery: DNS and .well-known */
#define FED_WELL_KNOWN_MAX_BYTES 65536   /* a larger .well-known answer is refused */
#define FED_KEY_FETCH_MAX_BYTES (256 * 1024) /* a key document larger than this is refused */
#define FED_KEY_FETCH_TIMEOUT_MS 10000
#define FED_BACKOFF_DRAIN_MS 2000            /* backoff writes still queued at shutdown */

#define FED_MAX_NOTARIES 8
#define FED_MAX_NOTARY_KEYS 8

static fed_module *fed;

/* federation.trusted_key_servers, parsed once. */
static fed_notary notaries[FED_MAX_NOTARIES];
static fed_public_key notary_keys[FED_MAX_NOTARIES][FED_MAX_NOTARY_KEYS];
static size_t n_notaries;

fed_module *fed_state(void)
{
    return fed;
}

/* ---- fetching other servers' keys (the key ring's hook) ------------------------------- */

typedef struct key_fetch {
    fed_keyring *ring;
    char server[FED_SERVER_NAME_MAX_BYTES];
    size_t notary; /* the next trusted key server to ask; n_notaries = the origin itself */
} key_fetch;

static void fetch_next(key_fetch *kf, const char *last_error);

static void fetch_done(void *arg, const fed_response *res)
{
    key_fetch *kf = arg;
    char why[FED_KEYRING_ERROR_MAX_BYTES];
    fed_key_set *set = NULL;
    bool via_notary = kf->notary < n_notaries;
    if (res->outcome != FED_HTTP_OK)
        snprintf(why, sizeof(why), "%s", res->error ? res->error : "failed");
    else if (res->status != 200 || !res->json)
        snprintf(why, sizeof(why), "%s answered %d", res->destination, res->status);
    else if (via_notary)
        set = fed_keyvalid_notary(res->json, kf->server, &notaries[kf->notary],
                                          rt_wall_ms(), why, sizeof(why));
    else
        set = fed_keyvalid_doc(res->json, kf->server, rt_wall_ms(), why, sizeof(why));
    if (set) {
        fed_keyring_fetched(kf->ring, kf->server, set, NULL);
        free(kf);
        return;
    }
    rt_log(ATRIUM_LOG_INFO, "federation", "keys of %s from %s: %s", kf->server,
           via_notary ? notaries[kf->notary].server_name : "the server itself", why);
    kf->notary++;
    fetch_next(kf, why);
}

/* Ask the next source: each trusted key server in turn, then the origin. */
static void fetch_next(key_fetch *kf, const char *last_error)
{
    while (kf->notary <= n_notaries) {
        bool via_notary = kf->notary < n_notaries;
        json_t *body = NULL;
        if (via_notary)
            body = json_pack("{s:{s:{}}}", "server_keys", kf->server);
        fed_request_opts o = {
            .method = via_notary ? "POST" : "GET",
            .destination = via_notary ? notaries[kf->notary].server_name : kf->server,
            .uri = via_notary ? "/_matrix/key/v2/query" : "/_matrix/key/v2/server",
            .body = body,
            .deadline_ms = rt_now_ms() + FED_KEY_FETCH_TIMEOUT_MS,
            .max_body_bytes = FED_KEY_FETCH_MAX_BYTES,
            .unsigned_request = true,
            .ignore_backoff = true, /* the peer's own request says it is up */
            .want_json = true,
            .on_done = fetch_done,
            .arg = kf,
        };
        int rc = fed_request_submit(&o);
        if (body) json_decref(body);
        if (rc == 0) return;
        kf->notary++;
    }
    fed_keyring_fetched(kf->ring, kf->server, NULL,
                        last_error ? last_error : "no key source could be asked");
    free(kf);
}

int fed_fetch_keys(void *fetch_arg, fed_keyring *ring, const char *server_name)
{
    (void)fetch_arg;
    key_fetch *kf = calloc(1, sizeof(*kf));
    if (!kf) return ATRIUM_E_NOMEM;
    kf->ring = ring;
    snprintf(kf->server, sizeof(kf->server), "%s", server_name);
    fetch_next(kf, NULL);
    return 0;
}

/* federation.trusted_key_servers: [{server_name, verify_keys: {id: key}}] */
static int load_notaries(fed_module *m)
{
    const cfg_node *list = m->cfg->federation.trusted_key_servers;
    n_notaries = 0;
    if (!list) return 0;
    char err[256], where[256];
    for (const cfg_node *e = list->first_child; e; e = e->next) {
        const char *name = NULL;
        const cfg_node *keys = cfg_get(e, "verify_keys");
        if (n_notaries == FED_MAX_NOTARIES || e->kind != CFG_MAP ||
            cfg_read_string(e, "server_name", NULL, &name, err, sizeof(err)) < 0 || !name ||
            !keys || keys->kind != CFG_MAP || !keys->first_child) {
            rt_log(ATRIUM_LOG_ERROR, "federation",
                   "%s: federation.trusted_key_servers: each entry needs server_name and "
                   "verify_keys {\"ed25519:id\": key} (at most %d entries)",
                   cfg_where(e, where, sizeof(where)), FED_MAX_NOTARIES);
            return -1;
        }
        size_t nk = 0;
        for (const cfg_node *k = keys->first_child; k; k = k->next) {
            if (nk == FED_MAX_NOTARY_KEYS || k->kind != CFG_SCALAR ||
                fed_public_key_parse(k->key, k->value, &notary_keys[n_notaries][nk], err,
                                     sizeof(err)) < 0) {
                rt_log(ATRIUM_LOG_ERROR, "federation",
                       "%s: federation.trusted_key_servers: %s", cfg_where(k, where, sizeof(where)),
                       nk == FED_MAX_NOTARY_KEYS ? "too many keys" : err);
                return -1;
            }
            nk++;
        }
        notaries[n_notaries] = (fed_notary){.server_name = name,
                                            .keys = notary_keys[n_notaries],
                                            .n_keys = nk};
        n_notaries++;
    }
    return 0;
}

static int load_old_keys(fed_module *m)
{
    const cfg_node *map = m->cfg->federation.old_signing_keys;
    if (!map) return 0;
    char err[256];
    for (const cfg_node *k = map->first_child; k; k = k->next) {
        if (m->n_old_keys == FED_MAX_OLD_KEYS) {
            rt_log(ATRIUM_LOG_ERROR, "federation", "federation.old_signing_keys: at most %d keys",
                   FED_MAX_OLD_KEYS);
            return -1;
        }
        const char *key = NULL;
        int64_t expired = 0;
        if (cfg_read_string(k, "key", NULL, &key, err, sizeof(err)) < 0 ||
            cfg_read_int(k, "expired_ts", 0, 0, INT64_MAX, &expired, err, sizeof(err)) < 0 ||
            !key) {
            rt_log(ATRIUM_LOG_ERROR, "federation",
                   "federation.old_signing_keys.%s: needs key (base64) and expired_ts (ms)%s%s",
                   k->key, key ? ": " : "", key ? err : "");
            return -1;
        }
        if (fed_old_key_parse(k->key, key, expired, &m->old_keys[m->n_old_keys], err,
                              sizeof(err)) < 0) {
            rt_log(ATRIUM_LOG_ERROR, "federation", "federation.old_signing_keys: %s", err);
            return -1;
        }
        m->n_old_keys++;
    }
    return 0;
}

/* federation.signing_key_path, relative to the config file's directory; by default
 * "<server_name>.signing.key" there. */
static int key_path(fed_module *m, const char *config_path)
{
    const char *given = m->cfg->federation.signing_key_path;
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s", config_path ? config_path : ".");
    const char *d = config_path ? dirname(dir) : ".";
    int n;
    if (!given || !*given)
        n = snprintf(m->key_path, sizeof(m->key_path), "%s/%s.signing.key", d, m->server_name);
    else if (given[0] == '/')
        n = snprintf(m->key_path, sizeof(m->key_path), "%s", given);
    else
        n = snprintf(m->key_path, sizeof(m->key_path), "%s/%s", d, given);
    return n > 0 && (size_t)n < sizeof(m->key_path) ? 0 : -1;
}

static int build_ranges(fed_module *m)
{
    const struct core_federation *f = &m->cfg->federation;
    char err[256];
    m->blacklist = rt_iprange_parse(f->ip_range_blacklist, f->n_ip_range_blacklist, err,
                                     sizeof(err));
    if (!m->blacklist) {
        rt_log(ATRIUM_LOG_ERROR, "federation", "federation.ip_range_blacklist: %s", err);
        return -1;
    }
    m->whitelist = rt_iprange_parse(f->ip_range_whitelist, f->n_ip_range_whitelist, err,
                                     sizeof(err));
    if (!m->whitelist) {
        rt_log(ATRIUM_LOG_ERROR, "federation", "federation.ip_range_whitelist: %s", err);
        return -1;
    }
    return 0;
}

int federation_init(const struct core_config *cfg, const char *config_path, http_server *srv,
                    rt_metrics *metrics)
{
    fed_module *m = calloc(1, sizeof(*m));
    if (!m) return -1;
    fed = m;
    rooms_tx_set_signer(federation_sign_json); /* the write path signs our events */
    m->cfg = cfg;
    m->server_name = cfg->server_name;
    m->srv = srv;
    m->metrics = metrics;
    char err[512];
    if (key_path(m, config_path) < 0) {
        rt_log(ATRIUM_LOG_ERROR, "federation", "federation.signing_key_path is too long");
        return -1;
    }
    if (fed_signing_key_load_or_create(m->key_path, &m->key, err, sizeof(err)) < 0) {
        rt_log(ATRIUM_LOG_ERROR, "federation", "%s", err);
        return -1;
    }
    rt_log(ATRIUM_LOG_INFO, "federation", "signing key %s from %s", m->key.key_id, m->key_path);
    if (load_old_keys(m) < 0 || build_ranges(m) < 0 || load_notaries(m) < 0) return -1;

    const struct core_federation *f = &cfg->federation;
    fed_http_settings hs = {
        .max_connections = f->max_connections,
        .max_connections_per_host = f->max_connections_per_host,
        .queue_depth = FED_HTTP_QUEUE_DEPTH,
        .ca_files = f->custom_ca_list,
        .n_ca_files = f->n_custom_ca_list,
        .blacklist = m->blacklist,
        .whitelist = m->whitelist,
    };
    m->http = fed_http_new(&hs, metrics);
    fed_resolve_settings rs = {
        .dns_servers = f->dns_servers,
        .n_dns_servers = f->n_dns_servers,
        .lookup_timeout_ms = FED_RESOLVE_TIMEOUT_MS,
        .well_known_max_bytes = FED_WELL_KNOWN_MAX_BYTES,
        .verify_tls = f->verify_certificates,
    };
    m->resolver = m->http ? fed_resolve_new(&rs, m->http, metrics) : NULL;
    fed_backoff_settings bs;
    fed_backoff_settings_defaults(&bs);
    bs.min_interval_ms = f->min_retry_interval_ms;
    bs.multiplier = f->retry_multiplier;
    bs.max_interval_ms = f->max_retry_interval_ms;
    m->backoff = fed_backoff_new(&bs, db_global(), metrics);
    fed_keyring_settings ks = {
        .max_servers = FED_KEYRING_DEFAULT_MAX_SERVERS,
        .negative_ttl_ms = f->key_fetch_failure_cache_ms,
        .refetch_min_interval_ms = FED_KEYRING_DEFAULT_REFETCH_MIN_INTERVAL_MS,
        .max_waiters = FED_KEYRING_DEFAULT_MAX_WAITERS,
        .queue_depth = FED_KEYRING_DEFAULT_QUEUE_DEPTH,
        .db_timeout_ms = FED_KEYRING_DEFAULT_DB_TIMEOUT_MS,
        .fetch = fed_fetch_keys,
        .fetch_arg = m,
    };
    m->keyring = fed_keyring_new(&ks, db_global(), metrics);
    m->outbound = fed_outbound_new(db_global(), m->backoff, m->server_name,
                                   f->sender_groups, metrics);
    if (!m->http || !m->resolver || !m->backoff || !m->keyring || !m->outbound) {
        rt_log(ATRIUM_LOG_ERROR, "federation", "cannot set up the outbound side");
        return -1;
    }
    fed_auth_metrics(m);
    if (fed_routes_register(m) < 0 || fed_inbound_routes(m) < 0) return -1;

    const struct core_fed_listener *l = &cfg->fed_listener;
    if (l->tls && !l->tls_certificate_path[0] != !l->tls_private_key_path[0]) {
        rt_log(ATRIUM_LOG_ERROR, "federation",
               "server.federation: tls_certificate_path and tls_private_key_path go together: "
               "set both (or neither, to serve no federation)");
        return -1;
    }
    if (l->tls && !l->tls_certificate_path[0]) {
        rt_log(ATRIUM_LOG_WARN, "federation",
               "no federation listener: set server.federation.tls_certificate_path and "
               "tls_private_key_path (or server.federation.tls: false behind a TLS proxy) "
               "for other servers to reach this one");
        return 0;
    }
    if (l->tls && http_tls_load(l->tls_certificate_path, l->tls_private_key_path, err,
                                sizeof(err)) < 0) {
        rt_log(ATRIUM_LOG_ERROR, "federation", "server.federation: %s", err);
        return -1;
    }
    m->listener = true;
    http_server_set_federation(srv, fed_auth_check, fed_auth_unknown_path);
    return 0;
}

const atrium_migration *federation_migrations(size_t *n)
{
    *n = FED_N_MIGRATIONS;
    return FED_MIGRATIONS;
}

int federation_start(void)
{
    fed_module *m = fed;
    if (!m) return 0;
    if (fed_backoff_load(m->backoff) < 0) return -1; /* after the migrations */
    if (fed_http_start(m->http) < 0 || fed_resolve_start(m->resolver) < 0 ||
        fed_backoff_start(m->backoff) < 0 || fed_keyring_start(m->keyring) < 0 ||
        fed_inbound_start(m) < 0 || fed_outbound_start(m->outbound) < 0) {
        rt_log(ATRIUM_LOG_ERROR, "federation", "cannot start the federation threads");
        return -1;
    }
    return 0;
}

void federation_reload_tls(void)
{
    fed_module *m = fed;
    if (!m || !m->listener || !m->cfg->fed_listener.tls) return;
    char err[512];
    const struct core_fed_listener *l = &m->cfg->fed_listener;
    if (http_tls_load(l->tls_certificate_path, l->tls_private_key_path, err, sizeof(err)) < 0)
        rt_log(ATRIUM_LOG_ERROR, "federation",
               "SIGHUP: keeping the certificate in use, the new one failed: %s", err);
    else
        rt_log(ATRIUM_LOG_INFO, "federation", "SIGHUP: reloaded the certificate from %s",
               l->tls_certificate_path);
}

int federation_sign_json(json_t *obj)
{
    fed_module *m = fed;
    if (!m) return ATRIUM_E_STOPPED;
    return fed_sign_json(obj, m->server_name, &m->key);
}

int federation_verify_json(const json_t *obj, const char *server_name, int64_t valid_at_ms,
                           void (*done)(void *arg, int result, const char *why), void *arg)
{
    return fed_verify_signed(obj, server_name, valid_at_ms, done, arg);
}

void federation_stop_inbound(void)
{
    fed_module *m = fed;
    if (m) fed_inbound_stop(m);
}

void federation_stop(void)
{
    fed_module *m = fed;
    if (!m) return;
    fed_inbound_stop(m); /* idempotent: main.c stopped it before the listeners */
    /* The sender first: no new transactions; those in flight are answered by the client's
     * stop below (their rows stay queued for the next start). */
    if (m->outbound) fed_outbound_stop(m->outbound);
    /* The ring first (its waiters are answered), then what feeds it: a fetch that ends
     * while the client stops may still hand the ring its answer, which it then drops. */
    if (m->keyring) fed_keyring_stop(m->keyring);
    if (m->resolver) fed_resolve_stop(m->resolver);
    if (m->http) fed_http_stop(m->http);
    if (m->backoff) fed_backoff_stop(m->backoff, FED_BACKOFF_DRAIN_MS);
}

void federation_free(void)
{
    fed_module *m = fed;
    if (!m) return;
    fed_inbound_free(m);
    fed_outbound_free(m->outbound);
    if (m->keyring) fed_keyring_free(m->keyring);
    if (m->backoff) fed_backoff_free(m->backoff);
    if (m->resolver) fed_resolve_free(m->resolver);
    if (m->http) fed_http_free(m->http);
    rt_iprange_free(m->blacklist);
    rt_iprange_free(m->whitelist);
    fed_signing_key_wipe(&m->key);
    http_tls_free_all();
    fed = NULL;
    free(m);
}
