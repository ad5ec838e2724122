/*
 * core/config/schema.c - checking a configuration tree against what is expected: the typed
 * reads and the unknown-key check (for the core and for plugins alike), the core's own keys
 * with their defaults, units and ranges read into struct core_config, and --generate-config,
 * which writes those same keys with those same defaults as a commented file.
 *
 * Each integer's default and range is written once, in the settings below, and used by both
 * the loader and the generator, so a generated file always says what the loader would do. A
 * YAML null counts as absent: a typed read gives its default and cfg_check_keys sees an empty
 * map. Unknown keys are errors everywhere except inside plugins.<name>: there this file checks
 * only `enabled` and `path` (docs/architecture.md, 'The plugin seam') and leaves every
 * other key to the plugin, which
 * validates its subtree in init. It does not parse YAML or read the environment (config.c
 * built the tree and applied ATRIUM__* first), and it does not decide how a setting is used;
 * the comments say what its owner does with it. No global mutable state; any thread.
 */
#include "core/config/config.h"

#include <ctype.h>
#include <sodium.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#ifdef ATRIUM_DEFAULT_PLUGIN_DIR
#define CORE_DEFAULT_PLUGIN_DIR ATRIUM_DEFAULT_PLUGIN_DIR
#else
#define CORE_DEFAULT_PLUGIN_DIR "/usr/lib/atrium/plugins"
#endif

#define CORE_DEFAULT_PUBLIC_BASEURL ""
#define CORE_DEFAULT_BIND_ADDRESS "127.0.0.1"
#define CORE_DEFAULT_LOG_LEVEL "info"
#define CORE_DEFAULT_METRICS_ENABLED true
#define CORE_DEFAULT_RATELIMIT_ENABLED true
#define CORE_DEFAULT_ROOM_VERSION "10" /* checked by core/client/rooms/rooms.c */
#define CORE_DEFAULT_REGISTRATION_ENABLED false
#define CORE_DEFAULT_REGISTRATION_SHARED_SECRET ""
#define GENERATED_SHARED_SECRET_BYTES 32 /* random bytes, written as hex */
#define CORE_DEFAULT_PLUGIN_ENABLED false
#define CORE_DEFAULT_FED_BIND_ADDRESS "0.0.0.0"

enum {
    SCHEMA_TEXT_BYTES = 512,          /* scratch for paths, places and lists */
    SCHEMA_QUOTE_BYTES = 64,          /* a bad value is quoted up to this many bytes */
    SCHEMA_SUGGEST_MAX_DISTANCE = 2,  /* edits at most for a "did you mean" */
    SCHEMA_SUGGEST_MAX_KEY_BYTES = 64, /* longer keys get no suggestion */
};

static const char *const LOG_LEVELS[] = {"error", "warn", "info", "debug", NULL};
static const char *const DEFAULT_METRICS_ADDRESSES[] = {"127.0.0.1", "::1"};
/* Plugins that --generate-config enables. */
static const char *const GENERATED_PLUGINS[] = {"media", "directory", NULL};

/* ---- typed reads ---------------------------------------------------------------------- */

/* Decimal only: an optional sign and digits. 0, -1 for garbage, -2 for overflow. */
static int parse_decimal(const char *s, int64_t *out)
{
    const char *p = s + (*s == '-' || *s == '+');
    if (*p == '\0')
        return -1;
    for (; *p != '\0'; p++)
        if (!isdigit((unsigned char)*p))
            return -1;
    errno = 0;
    long long v = strtoll(s, NULL, 10);
    if (errno == ERANGE)
        return -2;
    *out = (int64_t)v;
    return 0;
}

int cfg_read_int(const cfg_node *n, const char *path, int64_t def, int64_t min, int64_t max,
                 int64_t *out, char *err, size_t errlen)
{
    *out = def; /* defined on every path, even an error */
    const cfg_node *v = cfg_get(n, path);
    if (cfg_is_absent(v))
        return 0;
    if (v->kind != CFG_SCALAR)
        return cfg_error(v, err, errlen, "expected an integer in %" PRId64 "..%" PRId64
                         ", found %s", min, max, cfg_kind_name(v));
    int64_t x = 0;
    int rc = parse_decimal(v->value, &x);
    if (rc == -1)
        return cfg_error(v, err, errlen, "expected a decimal integer in %" PRId64 "..%" PRId64
                         ", got \"%.*s\"", min, max, SCHEMA_QUOTE_BYTES, v->value);
    if (rc == -2 || x < min || x > max)
        return cfg_error(v, err, errlen, "%.*s is out of range (allowed %" PRId64 "..%" PRId64
                         ")", SCHEMA_QUOTE_BYTES, v->value, min, max);
    *out = x;
    return 0;
}

int cfg_read_bool(const cfg_node *n, const char *path, bool def, bool *out, char *err,
                  size_t errlen)
{
    static const char *const yes[] = {"true", "yes", "on"}, *const no[] = {"false", "no", "off"};
    *out = def; /* defined on every path, even an error */
    const cfg_node *v = cfg_get(n, path);
    if (cfg_is_absent(v))
        return 0;
    for (size_t i = 0; v->kind == CFG_SCALAR && i < sizeof yes / sizeof *yes; i++) {
        if (strcasecmp(v->value, yes[i]) == 0 || strcasecmp(v->value, no[i]) == 0) {
            *out = strcasecmp(v->value, yes[i]) == 0;
            return 0;
        }
    }
    if (v->kind != CFG_SCALAR)
        return cfg_error(v, err, errlen, "expected true or false, found %s", cfg_kind_name(v));
    return cfg_error(v, err, errlen, "expected true or false (yes/no and on/off also work), "
                     "got \"%.*s\"", SCHEMA_QUOTE_BYTES, v->value);
}

int cfg_read_string(const cfg_node *n, const char *path, const char *def, const char **out,
                    char *err, size_t errlen)
{
    *out = def; /* defined on every path, even an error */
    const cfg_node *v = cfg_get(n, path);
    if (cfg_is_absent(v))
        return 0;
    if (v->kind != CFG_SCALAR)
        return cfg_error(v, err, errlen, "expected a single value (a string), found %s",
                         cfg_kind_name(v));
    *out = v->value;
    return 0;
}

int cfg_read_string_list(const cfg_node *n, const char *path, const char ***out,
                         size_t *n_out, char *err, size_t errlen)
{
    *out = NULL;
    *n_out = 0;
    const cfg_node *v = cfg_get(n, path);
    if (cfg_is_absent(v))
        return 0;
    if (v->kind == CFG_MAP)
        return cfg_error(v, err, errlen, "expected a list of strings, found a map");
    size_t count = 0;
    if (v->kind == CFG_SCALAR) {
        count = 1;
    } else {
        for (const cfg_node *c = v->first_child; c != NULL; c = c->next, count++)
            if (c->kind != CFG_SCALAR || c->null_value)
                return cfg_error(c, err, errlen, "expected a string, found %s", cfg_kind_name(c));
    }
    if (count == 0)
        return 0;
    const char **items = malloc(count * sizeof *items);
    if (items == NULL)
        return cfg_error(v, err, errlen, "out of memory");
    if (v->kind == CFG_SCALAR) {
        items[0] = v->value;
    } else {
        size_t i = 0;
        for (const cfg_node *c = v->first_child; c != NULL; c = c->next)
            items[i++] = c->value;
    }
    *out = items;
    *n_out = count;
    return 0;
}

/* ---- unknown keys ----------------------------------------------------------------------- */

/* Optimal string alignment distance (a swap of two neighbours is one edit), ignoring case;
 * INT_MAX for keys too long to be worth a suggestion. */
static int edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > SCHEMA_SUGGEST_MAX_KEY_BYTES || lb > SCHEMA_SUGGEST_MAX_KEY_BYTES)
        return INT_MAX;
    int d[SCHEMA_SUGGEST_MAX_KEY_BYTES + 1][SCHEMA_SUGGEST_MAX_KEY_BYTES + 1];
    for (size_t i = 0; i <= la; i++)
        d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        for (size_t j = 1; j <= lb; j++) {
            int ca = tolower((unsigned char)a[i - 1]), cb = tolower((unsigned char)b[j - 1]);
            int best = d[i - 1][j - 1] + (ca != cb);
            if (d[i - 1][j] + 1 < best)
                best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best)
                best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && ca == tolower((unsigned char)b[j - 2]) &&
                tolower((unsigned char)a[i - 2]) == cb && d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    }
    return d[la][lb];
}

/* The allowed key an operator most likely meant: a near spelling, or the key with its unit
 * suffix left off ("shutdown_grace" for "shutdown_grace_ms"). NULL when none is close. */
static const char *nearest_key(const char *const *allowed, const char *key)
{
    const char *best = NULL;
    int best_d = SCHEMA_SUGGEST_MAX_DISTANCE + 1;
    size_t klen = strlen(key);
    for (size_t i = 0; allowed[i] != NULL; i++) {
        int d = edit_distance(key, allowed[i]);
        if (strncmp(allowed[i], key, klen) == 0 && allowed[i][klen] == '_')
            d = 1;
        if (d < best_d && (size_t)d < strlen(allowed[i])) {
            best = allowed[i];
            best_d = d;
        }
    }
    return best;
}

int cfg_check_keys(const cfg_node *n, const char *const *allowed, char *err, size_t errlen)
{
    if (cfg_is_absent(n))
        return 0;
    if (n->kind != CFG_MAP)
        return cfg_error(n, err, errlen, "expected a map of keys, found %s", cfg_kind_name(n));
    for (const cfg_node *c = n->first_child; c != NULL; c = c->next) {
        bool known = false;
        for (size_t i = 0; allowed[i] != NULL && !known; i++)
            known = strcmp(allowed[i], c->key) == 0;
        if (known)
            continue;
        const char *near = nearest_key(allowed, c->key);
        if (near != NULL)
            return cfg_error(c, err, errlen, "unknown key (did you mean %s?)", near);
        char list[SCHEMA_TEXT_BYTES];
        size_t pos = 0;
        list[0] = '\0';
        for (size_t i = 0; allowed[i] != NULL && pos < sizeof list; i++)
            pos += (size_t)snprintf(list + pos, sizeof list - pos, "%s%s", i ? ", " : "",
                                    allowed[i]);
        return cfg_error(c, err, errlen, "unknown key (allowed here: %s)",
                         allowed[0] ? list : "none");
    }
    return 0;
}

/* ---- integer settings: one default and range for loader and generator -------------------- */

struct int_setting {
    const char *path;      /* dotted key */
    int64_t def, min, max; /* default and allowed range, inclusive */
    const char *doc;       /* the comment written above the key, with its unit */
};

static const struct int_setting HTTP_PORT = {
    "server.http.port", 8008, 0, 65535,
    "TCP port for plain client HTTP (TLS belongs in a proxy); 0 = any free port."};
static const struct int_setting HTTP_REQUEST_THREADS = {
    "server.http.request_threads", 4, 1, 256,
    "Threads handling client requests (the request pool), a count."};
static const struct int_setting HTTP_CONNECTION_TIMEOUT_S = {
    "server.http.connection_timeout_s", 60, 1, 3600,
    "Seconds a client connection may stay idle before it is closed."};
static const struct int_setting HTTP_MAX_CONNECTIONS = {
    "server.http.max_connections", 0, 0, 1000000,
    "Open client connections, a count; 0 = RLIMIT_NOFILE minus fd_reserve."};
static const struct int_setting HTTP_FD_RESERVE = {
    "server.http.fd_reserve", 128, 0, 65536,
    "File descriptors kept for files, PostgreSQL and peers, a count."};
static const struct int_setting HTTP_MAX_JSON_BODY_BYTES = {
    "server.http.max_json_body_bytes", INT64_C(1024) * 1024, 1024, INT64_C(64) * 1024 * 1024,
    "Largest JSON request body accepted, in bytes."};
static const struct int_setting HTTP_HANDOFF_DEADLINE_MS = {
    "server.http.handoff_deadline_ms", 60000, 100, 3600000,
    "Milliseconds a parked or handed-off request may wait before it fails."};
static const struct int_setting SHUTDOWN_GRACE_MS = {
    "server.shutdown_grace_ms", 10000, 0, 600000,
    "Milliseconds shutdown lets requests in flight finish."};
static const struct int_setting DB_POOL_SIZE = {
    "database.pool_size", 8, 1, 512,
    "PostgreSQL connections, shared by the core and the plugins, a count."};
static const struct int_setting DB_CHECKOUT_TIMEOUT_MS = {
    "database.checkout_timeout_ms", 5000, 1, 600000,
    "Milliseconds a request waits for a free database connection (then 503)."};
static const struct int_setting DB_CONNECT_RETRY_S = {
    "database.connect_retry_s", 30, 0, 3600,
    "Seconds to keep retrying an unreachable PostgreSQL before giving up."};
/* Rate limits: a token bucket per client (address before login, user after) and action. */
static const struct int_setting RL_REGISTER_PER_MINUTE = {
    "ratelimit.register.per_minute", 30, 1, 1000000,
    "Registration requests (POST /register, admin nonce) refilled per minute, per address."};
static const struct int_setting RL_REGISTER_BURST = {
    "ratelimit.register.burst", 10, 1, 1000000,
    "Registration requests allowed at once before the rate applies, a count."};
static const struct int_setting RL_LOGIN_PER_MINUTE = {
    "ratelimit.login.per_minute", 30, 1, 1000000,
    "Login attempts (POST /login) refilled per minute, per address."};
static const struct int_setting RL_LOGIN_BURST = {
    "ratelimit.login.burst", 10, 1, 1000000,
    "Login attempts allowed at once before the rate applies, a count."};
static const struct int_setting RL_MESSAGE_PER_MINUTE = {
    "ratelimit.message.per_minute", 300, 1, 1000000,
    "Events sent into rooms refilled per minute, per user."};
static const struct int_setting RL_MESSAGE_BURST = {
    "ratelimit.message.burst", 30, 1, 1000000,
    "Events sent at once before the rate applies, a count."};
static const struct int_setting RL_SYNC_PER_MINUTE = {
    "ratelimit.sync.per_minute", 1200, 1, 1000000,
    "Sync requests refilled per minute, per user (a parked sync that wakes is not counted again)."};
static const struct int_setting RL_SYNC_BURST = {
    "ratelimit.sync.burst", 100, 1, 1000000,
    "Sync requests allowed at once before the rate applies, a count."};

/* Federation: the listener other servers reach, and the outbound side. */
static const struct int_setting FED_PORT = {
    "server.federation.port", 8448, 0, 65535,
    "TCP port of the federation listener (other servers and key look-ups); 0 = any free port."};
static const struct int_setting FED_REQUEST_THREADS = {
    "server.federation.request_threads", 2, 1, 256,
    "Threads handling requests from other servers (the federation listener's pool), a count."};
static const struct int_setting FED_KEY_VALID_MS = {
    "federation.key_valid_ms", INT64_C(7) * 24 * 3600 * 1000, 60000,
    INT64_C(30) * 24 * 3600 * 1000,
    "Milliseconds this server's published key stays valid (valid_until_ts), from each answer."};
static const struct int_setting FED_MAX_CONNECTIONS = {
    "federation.client.max_connections", 16, 1, 4096,
    "Outbound connections to other servers open at once, in all, a count."};
static const struct int_setting FED_MAX_CONNECTIONS_PER_HOST = {
    "federation.client.max_connections_per_host", 8, 1, 4096,
    "Outbound connections to one server at once, a count (one slow peer cannot take them all)."};
static const struct int_setting FED_REQUEST_TIMEOUT_MS = {
    "federation.client.request_timeout_ms", 60000, 100, 600000,
    "Milliseconds an outbound request to another server may take before it fails."};
static const struct int_setting FED_MIN_RETRY_MS = {
    "federation.destination_min_retry_interval_ms", 600000, 100, INT64_C(7) * 24 * 3600 * 1000,
    "Milliseconds a server that failed is left alone before the first retry."};
static const struct int_setting FED_RETRY_MULTIPLIER = {
    "federation.destination_retry_multiplier", 2, 1, 100,
    "Each further failure multiplies the wait by this factor."};
static const struct int_setting FED_MAX_RETRY_MS = {
    "federation.destination_max_retry_interval_ms", INT64_C(24) * 3600 * 1000, 100,
    INT64_C(30) * 24 * 3600 * 1000,
    "The longest wait between retries of a failing server, in milliseconds."};
static const struct int_setting FED_KEY_FAILURE_CACHE_MS = {
    "federation.key_fetch_failure_cache_ms", 60000, 0, 3600000,
    "Milliseconds a failed key look-up is remembered, so a dead server is not asked each time."};

/* ---- which keys exist ---------------------------------------------------------------------- */

static const char *const TOP_KEYS[] = {"server_name", "public_baseurl", "plugin_dir", "log",
                                       "server", "database", "registration", "ratelimit",
                                       "rooms", "plugins", "federation", NULL};
static const char *const LOG_KEYS[] = {"level", NULL};
static const char *const SERVER_KEYS[] = {"http", "metrics", "federation", "shutdown_grace_ms",
                                          NULL};
static const char *const FED_LISTENER_KEYS[] = {"bind_address", "port", "tls",
                                                "tls_certificate_path", "tls_private_key_path",
                                                "request_threads", NULL};
static const char *const FEDERATION_KEYS[] = {
    "signing_key_path", "key_valid_ms", "old_signing_keys", "verify_certificates",
    "custom_ca_list", "certificate_verification_whitelist", "ip_range_blacklist",
    "ip_range_whitelist", "domain_whitelist", "trusted_key_servers", "dns_servers", "client",
    "destination_min_retry_interval_ms", "destination_retry_multiplier",
    "destination_max_retry_interval_ms", "key_fetch_failure_cache_ms", NULL};
static const char *const FED_CLIENT_KEYS[] = {"max_connections", "max_connections_per_host",
                                              "request_timeout_ms", NULL};
static const char *const HTTP_KEYS[] = {"bind_address", "port", "request_threads",
                                        "connection_timeout_s", "max_connections",
                                        "fd_reserve", "max_json_body_bytes",
                                        "handoff_deadline_ms", "trusted_proxies", NULL};
static const char *const METRICS_KEYS[] = {"enabled", "allowed_addresses", NULL};
static const char *const DATABASE_KEYS[] = {"conninfo", "pool_size", "checkout_timeout_ms",
                                            "connect_retry_s", NULL};
static const char *const REGISTRATION_KEYS[] = {"enabled", "shared_secret", NULL};
static const char *const ROOMS_KEYS[] = {"default_version", NULL};
static const char *const RATELIMIT_KEYS[] = {"enabled", "register", "login", "message", "sync",
                                             NULL};
static const char *const RATE_KEYS[] = {"per_minute", "burst", NULL};

static int check_core_keys(const cfg_node *root, char *err, size_t errlen)
{
    static const struct {
        const char *path;
        const char *const *allowed;
    } maps[] = {{"", TOP_KEYS},          {"log", LOG_KEYS},
                {"server", SERVER_KEYS}, {"server.http", HTTP_KEYS},
                {"server.metrics", METRICS_KEYS}, {"database", DATABASE_KEYS},
                {"registration", REGISTRATION_KEYS}, {"ratelimit", RATELIMIT_KEYS},
                {"ratelimit.register", RATE_KEYS}, {"ratelimit.login", RATE_KEYS},
                {"ratelimit.message", RATE_KEYS}, {"ratelimit.sync", RATE_KEYS},
                {"rooms", ROOMS_KEYS}, {"server.federation", FED_LISTENER_KEYS},
                {"federation", FEDERATION_KEYS}, {"federation.client", FED_CLIENT_KEYS}};
    for (size_t i = 0; i < sizeof maps / sizeof *maps; i++)
        if (cfg_check_keys(cfg_get(root, maps[i].path), maps[i].allowed, err, errlen) < 0)
            return -1;
    return 0;
}

/* plugins: a map of name -> map; only `enabled` and `path` are the core's to check. */
static int check_plugins(const cfg_node *root, char *err, size_t errlen)
{
    const cfg_node *plugins = cfg_get(root, "plugins");
    if (plugins == NULL || cfg_is_absent(plugins))
        return 0;
    if (plugins->kind != CFG_MAP)
        return cfg_error(plugins, err, errlen,
                         "expected a map of plugin names to their settings (media: {enabled: "
                         "true})");
    for (const cfg_node *p = plugins->first_child; p != NULL; p = p->next) {
        /* The name becomes <plugin_dir>/<name>.so: no path separators, no dots. */
        for (const char *c = p->key; *c != '\0'; c++)
            if (!isalnum((unsigned char)*c) && *c != '_' && *c != '-')
                return cfg_error(p, err, errlen, "a plugin name may only hold letters, digits, "
                                 "'_' and '-'; to load another file set path:");
        if (p->kind != CFG_MAP && !cfg_is_absent(p))
            return cfg_error(p, err, errlen, "expected the plugin's settings as a map "
                             "(enabled: true, ...)");
        bool enabled;
        const char *path;
        if (cfg_read_bool(p, "enabled", CORE_DEFAULT_PLUGIN_ENABLED, &enabled, err, errlen) < 0 ||
            cfg_read_string(p, "path", NULL, &path, err, errlen) < 0)
            return -1;
        if (path != NULL && path[0] == '\0')
            return cfg_error(cfg_get(p, "path"), err, errlen, "must not be empty; leave it out "
                             "to load %s.so from plugin_dir", p->key);
    }
    return 0;
}

/* ---- reading values ------------------------------------------------------------------------ */

static int read_int(const cfg_node *root, const struct int_setting *s, int *out, char *err,
                    size_t errlen)
{
    int64_t v;
    if (cfg_read_int(root, s->path, s->def, s->min, s->max, &v, err, errlen) < 0)
        return -1;
    *out = (int)v; /* every int setting's range fits an int */
    return 0;
}

/* A required key that is absent: reported at the nearest map that exists, with the
 * environment variable that could also set it. */
static int missing_key(const cfg_node *root, const char *path, const char *hint, char *err,
                       size_t errlen)
{
    char parent[SCHEMA_TEXT_BYTES], where[SCHEMA_TEXT_BYTES], env[SCHEMA_TEXT_BYTES];
    const cfg_node *at = root;
    snprintf(parent, sizeof parent, "%s", path);
    for (char *dot = strrchr(parent, '.'); dot != NULL; dot = strrchr(parent, '.')) {
        *dot = '\0';
        if ((at = cfg_get(root, parent)) != NULL)
            break;
        at = root;
    }
    size_t pos = (size_t)snprintf(env, sizeof env, "ATRIUM__");
    for (const char *c = path; *c != '\0' && pos + 2 < sizeof env; c++) {
        if (*c == '.') {
            env[pos++] = '_';
            env[pos++] = '_';
        } else {
            env[pos++] = (char)toupper((unsigned char)*c);
        }
    }
    env[pos] = '\0';
    return cfg_error(NULL, err, errlen, "%s: %s: required key is missing (%s; or set %s)",
                     cfg_where(at, where, sizeof where), path, hint, env);
}

static int read_required(const cfg_node *root, const char *path, const char *hint,
                         const char **out, char *err, size_t errlen)
{
    if (cfg_read_string(root, path, NULL, out, err, errlen) < 0)
        return -1;
    if (*out == NULL) {
        missing_key(root, path, hint, err, errlen);
        return -1;
    }
    if ((*out)[0] == '\0')
        return cfg_error(cfg_get(root, path), err, errlen, "must not be empty (%s)", hint);
    return 0;
}

static int read_nonempty(const cfg_node *root, const char *path, const char *def,
                         const char **out, char *err, size_t errlen)
{
    if (cfg_read_string(root, path, def, out, err, errlen) < 0)
        return -1;
    if ((*out)[0] == '\0')
        return cfg_error(cfg_get(root, path), err, errlen, "must not be empty; leave the key "
                         "out for the default (%s)", def);
    return 0;
}

static int read_top(const cfg_node *root, struct core_config *out, char *err, size_t errlen)
{
    if (read_required(root, "server_name", "the name in user IDs, like example.org in "
                      "@alice:example.org", &out->server_name, err, errlen) < 0)
        return -1;
    for (const char *c = out->server_name; *c != '\0'; c++)
        if (isspace((unsigned char)*c) || *c == '/' || *c == '@')
            return cfg_error(cfg_get(root, "server_name"), err, errlen, "\"%.64s\" is not a "
                             "server name; give a host with an optional port, like example.org "
                             "or example.org:8448", out->server_name);
    if (cfg_read_string(root, "public_baseurl", CORE_DEFAULT_PUBLIC_BASEURL,
                        &out->public_baseurl, err, errlen) < 0)
        return -1;
    if (out->public_baseurl[0] != '\0' && strncmp(out->public_baseurl, "https://", 8) != 0 &&
        strncmp(out->public_baseurl, "http://", 7) != 0)
        return cfg_error(cfg_get(root, "public_baseurl"), err, errlen, "expected a URL "
                         "starting with https:// (or \"\" for none)");
    if (read_nonempty(root, "plugin_dir", CORE_DEFAULT_PLUGIN_DIR, &out->plugin_dir, err,
                      errlen) < 0)
        return -1;
    const char *level;
    if (cfg_read_string(root, "log.level", CORE_DEFAULT_LOG_LEVEL, &level, err, errlen) < 0)
        return -1;
    for (size_t i = 0; LOG_LEVELS[i] != NULL; i++)
        if (strcasecmp(level, LOG_LEVELS[i]) == 0)
            out->log_level = LOG_LEVELS[i];
    if (out->log_level == NULL)
        return cfg_error(cfg_get(root, "log.level"), err, errlen, "\"%.64s\" is not a log "
                         "level (allowed: error, warn, info, debug)", level);
    return 0;
}

static int read_server(const cfg_node *root, struct core_config *out, char *err,
                       size_t errlen)
{
    int64_t body_bytes;
    if (read_nonempty(root, "server.http.bind_address", CORE_DEFAULT_BIND_ADDRESS,
                      &out->http.bind_address, err, errlen) < 0 ||
        read_int(root, &HTTP_PORT, &out->http.port, err, errlen) < 0 ||
        read_int(root, &HTTP_REQUEST_THREADS, &out->http.request_threads, err, errlen) < 0 ||
        read_int(root, &HTTP_CONNECTION_TIMEOUT_S, &out->http.connection_timeout_s, err,
                 errlen) < 0 ||
        read_int(root, &HTTP_MAX_CONNECTIONS, &out->http.max_connections, err, errlen) < 0 ||
        read_int(root, &HTTP_FD_RESERVE, &out->http.fd_reserve, err, errlen) < 0 ||
        cfg_read_int(root, HTTP_MAX_JSON_BODY_BYTES.path, HTTP_MAX_JSON_BODY_BYTES.def,
                     HTTP_MAX_JSON_BODY_BYTES.min, HTTP_MAX_JSON_BODY_BYTES.max, &body_bytes,
                     err, errlen) < 0 ||
        read_int(root, &HTTP_HANDOFF_DEADLINE_MS, &out->http.handoff_deadline_ms, err,
                 errlen) < 0 ||
        cfg_read_string_list(root, "server.http.trusted_proxies", &out->http.trusted_proxies,
                             &out->http.n_trusted_proxies, err, errlen) < 0 ||
        cfg_read_bool(root, "server.metrics.enabled", CORE_DEFAULT_METRICS_ENABLED,
                      &out->metrics.enabled, err, errlen) < 0 ||
        read_int(root, &SHUTDOWN_GRACE_MS, &out->shutdown_grace_ms, err, errlen) < 0)
        return -1;
    out->http.max_json_body_bytes = body_bytes;

    const char *addresses = "server.metrics.allowed_addresses";
    const cfg_node *given = cfg_get(root, addresses);
    if (!cfg_is_absent(given))
        return cfg_read_string_list(root, addresses, &out->metrics.allowed_addresses,
                                    &out->metrics.n_allowed_addresses, err, errlen);
    size_t n = sizeof DEFAULT_METRICS_ADDRESSES / sizeof *DEFAULT_METRICS_ADDRESSES;
    out->metrics.allowed_addresses = malloc(sizeof DEFAULT_METRICS_ADDRESSES);
    if (out->metrics.allowed_addresses == NULL)
        return cfg_error(root, err, errlen, "out of memory");
    memcpy(out->metrics.allowed_addresses, DEFAULT_METRICS_ADDRESSES,
           sizeof DEFAULT_METRICS_ADDRESSES);
    out->metrics.n_allowed_addresses = n;
    return 0;
}

static int read_database(const cfg_node *root, struct core_config *out, char *err,
                         size_t errlen)
{
    if (read_required(root, "database.conninfo", "a libpq connection string, like "
                      "\"dbname=atrium\"", &out->database.conninfo, err, errlen) < 0 ||
        read_int(root, &DB_POOL_SIZE, &out->database.pool_size, err, errlen) < 0 ||
        read_int(root, &DB_CHECKOUT_TIMEOUT_MS, &out->database.checkout_timeout_ms, err,
                 errlen) < 0 ||
        read_int(root, &DB_CONNECT_RETRY_S, &out->database.connect_retry_s, err, errlen) < 0 ||
        cfg_read_bool(root, "ratelimit.enabled", CORE_DEFAULT_RATELIMIT_ENABLED,
                      &out->ratelimit.enabled, err, errlen) < 0)
        return -1;
    return 0;
}

static int read_accounts(const cfg_node *root, struct core_config *out, char *err,
                         size_t errlen)
{
    if (cfg_read_bool(root, "registration.enabled", CORE_DEFAULT_REGISTRATION_ENABLED,
                      &out->registration.enabled, err, errlen) < 0 ||
        cfg_read_string(root, "registration.shared_secret",
                        CORE_DEFAULT_REGISTRATION_SHARED_SECRET,
                        &out->registration.shared_secret, err, errlen) < 0 ||
        read_int(root, &RL_REGISTER_PER_MINUTE, &out->ratelimit.registration.per_minute, err,
                 errlen) < 0 ||
        read_int(root, &RL_REGISTER_BURST, &out->ratelimit.registration.burst, err, errlen) < 0 ||
        read_int(root, &RL_LOGIN_PER_MINUTE, &out->ratelimit.login.per_minute, err, errlen) < 0 ||
        read_int(root, &RL_LOGIN_BURST, &out->ratelimit.login.burst, err, errlen) < 0 ||
        read_int(root, &RL_MESSAGE_PER_MINUTE, &out->ratelimit.message.per_minute, err,
                 errlen) < 0 ||
        read_int(root, &RL_MESSAGE_BURST, &out->ratelimit.message.burst, err, errlen) < 0 ||
        read_int(root, &RL_SYNC_PER_MINUTE, &out->ratelimit.sync.per_minute, err, errlen) < 0 ||
        read_int(root, &RL_SYNC_BURST, &out->ratelimit.sync.burst, err, errlen) < 0 ||
        read_nonempty(root, "rooms.default_version", CORE_DEFAULT_ROOM_VERSION,
                      &out->rooms.default_version, err, errlen) < 0)
        return -1;
    return 0;
}

static int read_int64(const cfg_node *root, const struct int_setting *s, int64_t *out,
                      char *err, size_t errlen)
{
    return cfg_read_int(root, s->path, s->def, s->min, s->max, out, err, errlen);
}

/* A map (or absent) at path: the node, for its owner to read. */
static int read_map(const cfg_node *root, const char *path, const cfg_node **out, char *err,
                    size_t errlen)
{
    const cfg_node *n = cfg_get(root, path);
    *out = NULL;
    if (cfg_is_absent(n))
        return 0;
    if (n->kind != CFG_MAP)
        return cfg_error(n, err, errlen, "expected a map, found %s", cfg_kind_name(n));
    *out = n;
    return 0;
}

static int read_federation(const cfg_node *root, struct core_config *out, char *err,
                           size_t errlen)
{
    struct core_federation *f = &out->federation;
    struct core_fed_listener *l = &out->fed_listener;
    const cfg_node *tks = cfg_get(root, "federation.trusted_key_servers");
    if (!cfg_is_absent(tks) && tks->kind != CFG_SEQ)
        return cfg_error(tks, err, errlen, "expected a list of {server_name, verify_keys}");
    f->trusted_key_servers = cfg_is_absent(tks) ? NULL : tks;
    f->ip_range_blacklist_given = !cfg_is_absent(cfg_get(root, "federation.ip_range_blacklist"));
    int retry_multiplier;
    if (read_nonempty(root, "server.federation.bind_address", CORE_DEFAULT_FED_BIND_ADDRESS,
                      &l->bind_address, err, errlen) < 0 ||
        read_int(root, &FED_PORT, &l->port, err, errlen) < 0 ||
        cfg_read_bool(root, "server.federation.tls", true, &l->tls, err, errlen) < 0 ||
        cfg_read_string(root, "server.federation.tls_certificate_path", "",
                        &l->tls_certificate_path, err, errlen) < 0 ||
        cfg_read_string(root, "server.federation.tls_private_key_path", "",
                        &l->tls_private_key_path, err, errlen) < 0 ||
        read_int(root, &FED_REQUEST_THREADS, &l->request_threads, err, errlen) < 0 ||
        cfg_read_string(root, "federation.signing_key_path", "", &f->signing_key_path, err,
                        errlen) < 0 ||
        read_int64(root, &FED_KEY_VALID_MS, &f->key_valid_ms, err, errlen) < 0 ||
        read_map(root, "federation.old_signing_keys", &f->old_signing_keys, err, errlen) < 0 ||
        cfg_read_bool(root, "federation.verify_certificates", true, &f->verify_certificates,
                      err, errlen) < 0 ||
        cfg_read_string_list(root, "federation.custom_ca_list", &f->custom_ca_list,
                             &f->n_custom_ca_list, err, errlen) < 0 ||
        cfg_read_string_list(root, "federation.certificate_verification_whitelist",
                             &f->certificate_verification_whitelist,
                             &f->n_certificate_verification_whitelist, err, errlen) < 0 ||
        cfg_read_string_list(root, "federation.ip_range_blacklist", &f->ip_range_blacklist,
                             &f->n_ip_range_blacklist, err, errlen) < 0 ||
        cfg_read_string_list(root, "federation.ip_range_whitelist", &f->ip_range_whitelist,
                             &f->n_ip_range_whitelist, err, errlen) < 0 ||
        cfg_read_string_list(root, "federation.domain_whitelist", &f->domain_whitelist,
                             &f->n_domain_whitelist, err, errlen) < 0 ||
        cfg_read_string_list(root, "federation.dns_servers", &f->dns_servers,
                             &f->n_dns_servers, err, errlen) < 0 ||
        read_int(root, &FED_MAX_CONNECTIONS, &f->max_connections, err, errlen) < 0 ||
        read_int(root, &FED_MAX_CONNECTIONS_PER_HOST, &f->max_connections_per_host, err,
                 errlen) < 0 ||
        read_int(root, &FED_REQUEST_TIMEOUT_MS, &f->request_timeout_ms, err, errlen) < 0 ||
        read_int64(root, &FED_MIN_RETRY_MS, &f->min_retry_interval_ms, err, errlen) < 0 ||
        read_int(root, &FED_RETRY_MULTIPLIER, &retry_multiplier, err, errlen) < 0 ||
        read_int64(root, &FED_MAX_RETRY_MS, &f->max_retry_interval_ms, err, errlen) < 0 ||
        read_int(root, &FED_KEY_FAILURE_CACHE_MS, &f->key_fetch_failure_cache_ms, err,
                 errlen) < 0)
        return -1;
    f->retry_multiplier = retry_multiplier;
    if (l->tls && (l->tls_certificate_path[0] == '\0') != (l->tls_private_key_path[0] == '\0'))
        return cfg_error(cfg_get(root, "server.federation"), err, errlen,
                         "tls_certificate_path and tls_private_key_path go together: set both "
                         "(or neither, to serve no federation)");
    return 0;
}

int core_config_load(const cfg_node *root, struct core_config *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (root == NULL)
        return cfg_error(NULL, err, errlen, "no configuration");
    if (check_core_keys(root, err, errlen) < 0 || check_plugins(root, err, errlen) < 0)
        return -1;
    if (read_top(root, out, err, errlen) < 0 || read_server(root, out, err, errlen) < 0 ||
        read_database(root, out, err, errlen) < 0 || read_accounts(root, out, err, errlen) < 0 ||
        read_federation(root, out, err, errlen) < 0) {
        core_config_release(out);
        return -1;
    }
    return 0;
}

void core_config_release(struct core_config *c)
{
    if (c == NULL)
        return;
    free(c->http.trusted_proxies);
    c->http.trusted_proxies = NULL;
    c->http.n_trusted_proxies = 0;
    free(c->metrics.allowed_addresses);
    c->metrics.allowed_addresses = NULL;
    c->metrics.n_allowed_addresses = 0;
    const char ***lists[] = {&c->federation.custom_ca_list,
                             &c->federation.certificate_verification_whitelist,
                             &c->federation.ip_range_blacklist, &c->federation.ip_range_whitelist,
                             &c->federation.domain_whitelist, &c->federation.dns_servers};
    for (size_t i = 0; i < sizeof lists / sizeof *lists; i++) {
        free(*lists[i]);
        *lists[i] = NULL;
    }
}

/* ---- --generate-config ------------------------------------------------------------------- */

/* A YAML double-quoted string, so any server name or conninfo reads back unchanged. */
static void put_quoted(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s != '\0'; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20 || c == 0x7f)
            fprintf(f, "\\x%02x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static void put_comment(FILE *f, int indent, const char *text)
{
    fprintf(f, "%*s# %s\n", indent, "", text);
}

static void put_string(FILE *f, int indent, const char *key, const char *value)
{
    fprintf(f, "%*s%s: ", indent, "", key);
    put_quoted(f, value);
    fputc('\n', f);
}

static void put_int(FILE *f, int indent, const struct int_setting *s)
{
    const char *leaf = strrchr(s->path, '.');
    fprintf(f, "%*s# %s Allowed: %" PRId64 "..%" PRId64 ".\n", indent, "", s->doc, s->min,
            s->max);
    fprintf(f, "%*s%s: %" PRId64 "\n", indent, "", leaf ? leaf + 1 : s->path, s->def);
}

static void put_bool(FILE *f, int indent, const char *key, bool value, const char *doc)
{
    put_comment(f, indent, doc);
    fprintf(f, "%*s%s: %s\n", indent, "", key, value ? "true" : "false");
}

static void generate_top(FILE *f, const char *server_name, const char *plugin_dir)
{
    put_comment(f, 0, "Atrium homeserver configuration, written by --generate-config.");
    put_comment(f, 0, "Every key the core reads is listed with its default. Any key can also "
                "be set");
    put_comment(f, 0, "from the environment: ATRIUM__SERVER__HTTP__PORT=8448 sets "
                "server.http.port");
    put_comment(f, 0, "(the value is read as YAML). Unknown keys stop start-up; they are "
                "never ignored.");
    fputc('\n', f);
    put_comment(f, 0, "This server's name, as in @alice:example.org. Required; it cannot");
    put_comment(f, 0, "change once users exist.");
    put_string(f, 0, "server_name", server_name);
    put_comment(f, 0, "Base URL clients reach this server at, for /.well-known/matrix/client;");
    put_comment(f, 0, "\"\" = serve no /.well-known/matrix/client.");
    put_string(f, 0, "public_baseurl", CORE_DEFAULT_PUBLIC_BASEURL);
    put_comment(f, 0, "Directory where plugins are found as <name>.so (a path).");
    if (plugin_dir != NULL) {
        put_string(f, 0, "plugin_dir", plugin_dir);
    } else {
        fputs("# plugin_dir: ", f);
        put_quoted(f, CORE_DEFAULT_PLUGIN_DIR);
        fputc('\n', f);
    }
    fputc('\n', f);
    put_comment(f, 0, "Logging.");
    fputs("log:\n", f);
    put_comment(f, 2, "Least severe messages written: error, warn, info or debug.");
    fprintf(f, "  level: %s\n\n", CORE_DEFAULT_LOG_LEVEL);
}

static void generate_server(FILE *f)
{
    put_comment(f, 0, "The HTTP front door.");
    fputs("server:\n", f);
    put_comment(f, 2, "The client-server listener.");
    fputs("  http:\n", f);
    put_comment(f, 4, "Address to listen on, an IPv4 or IPv6 literal.");
    put_string(f, 4, "bind_address", CORE_DEFAULT_BIND_ADDRESS);
    put_int(f, 4, &HTTP_PORT);
    put_int(f, 4, &HTTP_REQUEST_THREADS);
    put_int(f, 4, &HTTP_CONNECTION_TIMEOUT_S);
    put_int(f, 4, &HTTP_MAX_CONNECTIONS);
    put_int(f, 4, &HTTP_FD_RESERVE);
    put_int(f, 4, &HTTP_MAX_JSON_BODY_BYTES);
    put_int(f, 4, &HTTP_HANDOFF_DEADLINE_MS);
    put_comment(f, 4, "Proxy addresses whose X-Forwarded-For is believed (a list of "
                "addresses).");
    fputs("    trusted_proxies: []\n", f);
    put_comment(f, 2, "Prometheus metrics at /metrics.");
    fputs("  metrics:\n", f);
    put_bool(f, 4, "enabled", CORE_DEFAULT_METRICS_ENABLED, "Serve /metrics (true or false).");
    put_comment(f, 4, "Client addresses allowed to read /metrics (a list of addresses).");
    fputs("    allowed_addresses: [", f);
    for (size_t i = 0; i < sizeof DEFAULT_METRICS_ADDRESSES / sizeof *DEFAULT_METRICS_ADDRESSES;
         i++) {
        fputs(i ? ", " : "", f);
        put_quoted(f, DEFAULT_METRICS_ADDRESSES[i]);
    }
    fputs("]\n", f);
    put_comment(f, 2, "The federation listener: other servers and key look-ups (TLS). Without "
                "a certificate");
    put_comment(f, 2, "(and with tls: true) no federation is served and the server says so at "
                "start-up.");
    fputs("  federation:\n", f);
    put_comment(f, 4, "Address to listen on, an IPv4 or IPv6 literal.");
    put_string(f, 4, "bind_address", CORE_DEFAULT_FED_BIND_ADDRESS);
    put_int(f, 4, &FED_PORT);
    put_bool(f, 4, "tls", true, "Serve TLS here (false when a proxy in front terminates TLS).");
    put_comment(f, 4, "PEM certificate (or chain) and private key files; reloaded on SIGHUP.");
    put_string(f, 4, "tls_certificate_path", "");
    put_string(f, 4, "tls_private_key_path", "");
    put_int(f, 4, &FED_REQUEST_THREADS);
    put_int(f, 2, &SHUTDOWN_GRACE_MS);
    fputc('\n', f);
}

static void generate_federation(FILE *f)
{
    put_comment(f, 0, "Federation: talking to other Matrix servers.");
    fputs("federation:\n", f);
    put_comment(f, 2, "This server's ed25519 signing key (Synapse's file format); created on "
                "first start");
    put_comment(f, 2, "when the file does not exist. \"\" = <server_name>.signing.key beside "
                "this file.");
    put_string(f, 2, "signing_key_path", "");
    put_int(f, 2, &FED_KEY_VALID_MS);
    put_comment(f, 2, "Keys this server used before, still published so what they signed "
                "verifies:");
    put_comment(f, 2, "{\"ed25519:id\": {key: <unpadded base64 public key>, expired_ts: <ms>}}.");
    fputs("  old_signing_keys: {}\n", f);
    put_bool(f, 2, "verify_certificates", true,
             "Check other servers' TLS certificates (true or false).");
    put_comment(f, 2, "PEM files of the CAs trusted for federation instead of the system's "
                "(a list).");
    fputs("  custom_ca_list: []\n", f);
    put_comment(f, 2, "Server names whose certificates are not checked: for development only "
                "(logged).");
    fputs("  certificate_verification_whitelist: []\n", f);
    put_comment(f, 2, "Addresses never connected to (CIDR list). Leave it out for the "
                "defaults: loopback,");
    put_comment(f, 2, "private (RFC 1918), link-local, CGNAT, ULA, multicast and their "
                "::ffff: forms.");
    fputs("  # ip_range_blacklist: [\"127.0.0.0/8\", \"10.0.0.0/8\", ...]\n", f);
    put_comment(f, 2, "Addresses allowed even though the blacklist names them (CIDR list).");
    fputs("  ip_range_whitelist: []\n", f);
    put_comment(f, 2, "Server names to federate with, both ways; [] = every server.");
    fputs("  domain_whitelist: []\n", f);
    put_comment(f, 2, "Notaries asked for other servers' keys first: a list of {server_name, "
                "verify_keys:");
    put_comment(f, 2, "{\"ed25519:id\": <unpadded base64 key>}}; [] = ask each server "
                "itself.");
    fputs("  trusted_key_servers: []\n", f);
    put_comment(f, 2, "DNS servers for server discovery (\"ip\" or \"ip:port\"); [] = "
                "/etc/resolv.conf.");
    fputs("  dns_servers: []\n", f);
    fputs("  client:\n", f);
    put_int(f, 4, &FED_MAX_CONNECTIONS);
    put_int(f, 4, &FED_MAX_CONNECTIONS_PER_HOST);
    put_int(f, 4, &FED_REQUEST_TIMEOUT_MS);
    put_int(f, 2, &FED_MIN_RETRY_MS);
    put_int(f, 2, &FED_RETRY_MULTIPLIER);
    put_int(f, 2, &FED_MAX_RETRY_MS);
    put_int(f, 2, &FED_KEY_FAILURE_CACHE_MS);
    fputc('\n', f);
}

static int generate_rest(FILE *f, const char *conninfo)
{
    put_comment(f, 0, "PostgreSQL, shared by the core and the plugins.");
    fputs("database:\n", f);
    put_comment(f, 2, "libpq connection string (see the libpq docs). Required.");
    put_string(f, 2, "conninfo", conninfo);
    put_int(f, 2, &DB_POOL_SIZE);
    put_int(f, 2, &DB_CHECKOUT_TIMEOUT_MS);
    put_int(f, 2, &DB_CONNECT_RETRY_S);
    fputc('\n', f);
    put_comment(f, 0, "Accounts.");
    fputs("registration:\n", f);
    put_comment(f, 2, "Let anyone create an account with POST /register (true or false). "
                "The default is");
    put_comment(f, 2, "false; this generated file turns it on for a local server.");
    fputs("  enabled: true\n", f);
    put_comment(f, 2, "Secret for admin registration (/_synapse/admin/v1/register and "
                "`atrium register-user`);");
    put_comment(f, 2, "\"\" (the default) turns admin registration off. Keep it private.");
    unsigned char raw[GENERATED_SHARED_SECRET_BYTES];
    char hex[2 * GENERATED_SHARED_SECRET_BYTES + 1];
    if (sodium_init() < 0)
        return -1;
    randombytes_buf(raw, sizeof raw);
    sodium_bin2hex(hex, sizeof hex, raw, sizeof raw);
    put_string(f, 2, "shared_secret", hex);
    fputc('\n', f);
    put_comment(f, 0, "Per-client rate limits.");
    fputs("ratelimit:\n", f);
    put_bool(f, 2, "enabled", CORE_DEFAULT_RATELIMIT_ENABLED,
             "Refuse clients over their rate with 429 (true or false).");
    static const struct {
        const char *name;
        const struct int_setting *per_minute, *burst;
    } rates[] = {{"register", &RL_REGISTER_PER_MINUTE, &RL_REGISTER_BURST},
                 {"login", &RL_LOGIN_PER_MINUTE, &RL_LOGIN_BURST},
                 {"message", &RL_MESSAGE_PER_MINUTE, &RL_MESSAGE_BURST},
                 {"sync", &RL_SYNC_PER_MINUTE, &RL_SYNC_BURST}};
    for (size_t i = 0; i < sizeof rates / sizeof *rates; i++) {
        fprintf(f, "  %s:\n", rates[i].name);
        put_int(f, 4, rates[i].per_minute);
        put_int(f, 4, rates[i].burst);
    }
    fputc('\n', f);
    put_comment(f, 0, "Rooms.");
    fputs("rooms:\n", f);
    put_comment(f, 2, "Room version of new rooms when createRoom names none (\"10\" or \"11\").");
    put_string(f, 2, "default_version", CORE_DEFAULT_ROOM_VERSION);
    fputc('\n', f);
    put_comment(f, 0, "Plugins, one map per plugin name. Besides enabled and path, each "
                "plugin's keys are");
    put_comment(f, 0, "its own and are checked by the plugin at start-up.");
    fputs("plugins:\n", f);
    for (size_t i = 0; GENERATED_PLUGINS[i] != NULL; i++) {
        fprintf(f, "  %s:\n", GENERATED_PLUGINS[i]);
        fprintf(f, "    # Load %s.so from plugin_dir (true or false); path: loads another "
                ".so instead.\n", GENERATED_PLUGINS[i]);
        fputs("    enabled: true\n", f);
        fprintf(f, "    # Its own keys and their defaults: plugins/%s/README.md in Atrium's "
                "source.\n", GENERATED_PLUGINS[i]);
    }
    return 0;
}

int cfg_generate(FILE *f, const char *server_name, const char *conninfo,
                 const char *plugin_dir)
{
    if (f == NULL || server_name == NULL || conninfo == NULL)
        return -1;
    generate_top(f, server_name, plugin_dir);
    generate_server(f);
    generate_federation(f);
    if (generate_rest(f, conninfo) < 0)
        return -1;
    if (fflush(f) != 0 || ferror(f))
        return -1;
    return 0;
}
