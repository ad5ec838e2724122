/*
 * core/config/config.h - configuration: YAML read into one tree, environment overrides,
 * settings tables (one row per key) that drive reading, the unknown-key check,
 * --generate-config and the documentation tables.
 *
 * Every node remembers the file line it came from (or the environment variable), so every
 * error names the key and where it was set. Unknown keys are errors, never ignored. The core
 * validates its own keys into struct core_config; each plugin receives its subtree
 * (plugins.<name>) and validates it itself through the host table. Internal prefix: cfg_.
 *
 * Environment rule (one rule for every key): ATRIUM__<SEG>__<SEG>...=<value> sets the key
 * <seg>.<seg>... (segments lower-cased; "__" separates segments, a single "_" stays part of
 * the key). The value is read as YAML, so `[a, b]` is a list and `true` a boolean.
 * Example: ATRIUM__SERVER__HTTP__REQUEST_THREADS=8 sets server.http.request_threads.
 */
#ifndef ATRIUM_CORE_CONFIG_H
#define ATRIUM_CORE_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum { CFG_SCALAR = 1, CFG_MAP, CFG_SEQ } cfg_kind;

typedef struct cfg_node {
    cfg_kind kind;
    char *key;          /* key in the parent map; NULL for sequence items and the root */
    char *value;        /* scalar text (CFG_SCALAR); NULL otherwise; "" for an empty value */
    bool null_value;    /* the scalar was YAML null (~, null, or nothing) */
    int line;           /* 1-based line in `origin` (0 when set from the environment) */
    const char *origin; /* file path, or the environment variable's name */
    struct cfg_node *parent;
    struct cfg_node *first_child, *last_child, *next;
} cfg_node;

/* Errors are written to err as one line: "<origin>:<line>: <key path>: <message>". */
cfg_node *cfg_load_file(const char *path, char *err, size_t errlen);
cfg_node *cfg_load_string(const char *text, const char *origin, char *err, size_t errlen);
cfg_node *cfg_new_map(void); /* an empty root */
void cfg_free(cfg_node *root);

/* Apply every ATRIUM__* variable of envp (NULL-terminated, as `environ`). Creates missing
 * maps along the way; replaces existing values. 0 or -1 with err set. */
int cfg_apply_env(cfg_node *root, char *const *envp, char *err, size_t errlen);

/* True when n is NULL or a YAML null (`key:`, `~`, `null`): the key counts as not given, so
 * typed reads return their default and cfg_check_keys sees an empty map. */
bool cfg_is_absent(const cfg_node *n);
/* "a map", "a list", "a single value" or "an empty value", for error messages. */
const char *cfg_kind_name(const cfg_node *n);

/* Look-ups by dotted path relative to n ("server.http.port"); NULL when absent. */
cfg_node *cfg_get(const cfg_node *n, const char *path);
/* The dotted path of a node from the root ("plugins.media.delivery_slots"), into buf. */
const char *cfg_path(const cfg_node *n, char *buf, size_t len);
/* "<origin>:<line>" or "<origin>" for env, into buf. */
const char *cfg_where(const cfg_node *n, char *buf, size_t len);
/* Write the module's one error format about n into err: "<where>: <key path>: <message>"
 * (the path left out for the root; with n NULL, the message alone). For checks beyond the
 * typed reads, in schema.c and in plugins validating their subtree. Always returns -1, so a
 * check can `return cfg_error(...)`. Any thread; touches nothing but err. */
int cfg_error(const cfg_node *n, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Typed reads of `path` under n. When absent the default is stored and 0 returned. On a
 * wrong type or a value out of [min, max], -1 with err naming the key, its place and the
 * allowed range. */
int cfg_read_int(const cfg_node *n, const char *path, int64_t def, int64_t min, int64_t max,
                 int64_t *out, char *err, size_t errlen);
int cfg_read_bool(const cfg_node *n, const char *path, bool def, bool *out, char *err,
                  size_t errlen);
/* *out points into the tree (or at def); valid while the tree lives. */
int cfg_read_string(const cfg_node *n, const char *path, const char *def, const char **out,
                    char *err, size_t errlen);
/* A list of strings (a YAML sequence of scalars, or a single scalar taken as one item).
 * *out is malloc'd (array of pointers into the tree), *n_out its length; free(*out). */
int cfg_read_string_list(const cfg_node *n, const char *path, const char ***out,
                         size_t *n_out, char *err, size_t errlen);

/* The map n (absent is fine) may only hold keys in `allowed` (NULL-terminated). -1 with err
 * naming the first unknown key, its place, and the nearest allowed key when one is close
 * ("did you mean fetch_threads?"). A non-map n is also an error. */
int cfg_check_keys(const cfg_node *n, const char *const *allowed, char *err, size_t errlen);

/* ---- settings tables (schema.c) -------------------------------------------------------
 * A setting is declared once, as one row: its dotted key, type, range, default, unit, where
 * the value is stored (an offset into the destination struct) and its help text. The same
 * rows drive reading (cfg_settings_read), the unknown-key check (cfg_settings_check_keys),
 * the generated configuration (cfg_settings_write) and the documentation tables
 * (cfg_settings_print_markdown). The core's rows are in settings.c; a plugin's come from its
 * descriptor (core/plugins/plugin_settings.c converts them). */

typedef enum {
    CFG_T_INT = 1,     /* int */
    CFG_T_INT64,       /* int64_t */
    CFG_T_BOOL,        /* bool */
    CFG_T_STRING,      /* const char * (into the tree, or the row's def_string) */
    CFG_T_ENUM,        /* const char * pointing at one of `values` (matched ignoring case) */
    CFG_T_STRING_LIST, /* const char ** (malloc'd) and its size_t count at count_offset */
    CFG_T_TREE,        /* const cfg_node *: a map ("{}" as def_string) or a list ("[]") its
                          owner validates (NULL when absent); the keys below are not checked */
} cfg_type;

enum {
    CFG_F_REQUIRED = 1u << 0, /* no default: absent or empty is an error naming the env var */
    CFG_F_NONEMPTY = 1u << 1, /* a string that may be left out, but not given as "" */
    CFG_F_KEEP = 1u << 2,     /* absent: the field keeps what the caller put there (a default
                                 computed at start, described by default_doc) */
};

struct cfg_setting {
    const char *path;   /* dotted key, relative to the map the table is read from */
    cfg_type type;
    unsigned flags;     /* CFG_F_* */
    size_t offset;      /* where the value goes in the destination struct */
    size_t count_offset; /* CFG_T_STRING_LIST: where its size_t length goes */
    int64_t def, min, max; /* CFG_T_INT*, CFG_T_BOOL (0/1): default and inclusive range */
    const char *def_string; /* CFG_T_STRING, CFG_T_ENUM: the default */
    const char *const *values; /* CFG_T_ENUM: the allowed values; CFG_T_STRING_LIST: the
                                  default items (NULL-terminated; NULL = empty list) */
    const char *unit;   /* "ms", "s", "bytes", "count", ... (documentation), or NULL */
    const char *help;   /* one or two sentences: what it does, for operators */
    const char *default_doc; /* the default in words when it is not a value ("CPU cores") */
    /* An extra check of a value read without error, or NULL: 0, or -1 via cfg_error(n,...). */
    int (*check)(const cfg_node *n, const void *field, char *err, size_t errlen);
};

/* A comment for a map of a table ("server.http": "The client-server listener."), written
 * above it by cfg_settings_write. */
struct cfg_section {
    const char *path;
    const char *help;
};

/* A value --generate-config writes instead of a row's default (YAML text, already quoted as
 * needed), with a note for the comment above it (or NULL). A NULL yaml writes the key
 * commented out with its default. */
struct cfg_value {
    const char *path;
    const char *yaml;
    const char *note;
};

/* Read every row of the table from the map n (absent keys get their defaults) into the
 * struct at base. 0, or -1 with err naming the key, its place and what is allowed; string
 * lists read before the failure are left for the caller to free (cfg_settings_release). */
int cfg_settings_read(const cfg_node *n, const struct cfg_setting *rows, size_t n_rows,
                      void *base, char *err, size_t errlen);
/* Free what cfg_settings_read allocated in base (the string lists); idempotent. */
void cfg_settings_release(const struct cfg_setting *rows, size_t n_rows, void *base);
/* Refuse keys of the map n, and of every map below it that the rows reach, that no row
 * declares (the messages of cfg_check_keys). `extra` (NULL-terminated, or NULL) are more
 * keys allowed directly in n, which the caller checks itself ("plugins"). */
int cfg_settings_check_keys(const cfg_node *n, const struct cfg_setting *rows, size_t n_rows,
                            const char *const *extra, char *err, size_t errlen);
/* Write s as a YAML double-quoted string ('"' and '\\' escaped, control bytes as \xNN), so
 * any server name, conninfo or path reads back unchanged. The one quoter of the generated
 * configuration (schema.c); errors show in ferror(f). */
void cfg_yaml_quote(FILE *f, const char *s);
/* Write the rows as commented YAML at `indent` spaces: each map opened once, with its
 * section comment; each key with its help, allowed values and default (or its entry in
 * `values`). Rows of one map must be contiguous. */
void cfg_settings_write(FILE *f, int indent, const struct cfg_setting *rows, size_t n_rows,
                        const struct cfg_section *sections, size_t n_sections,
                        const struct cfg_value *values, size_t n_values);
/* A Markdown table (key, default, allowed, meaning), each key prefixed with `prefix`. */
void cfg_settings_print_markdown(FILE *f, const char *prefix, const struct cfg_setting *rows,
                                 size_t n_rows);
/* The row whose path is `path`, or NULL. */
const struct cfg_setting *cfg_settings_find(const struct cfg_setting *rows, size_t n_rows,
                                            const char *path);

/* ---- the core's own settings (settings.c) --------------------------------------------- */

struct core_config {
    const char *server_name;    /* server_name (required) */
    const char *public_baseurl; /* public_baseurl: "" = no /.well-known/matrix/client */
    const char *plugin_dir;     /* plugin_dir: where <name>.so are looked for */
    const char *log_level;      /* log.level: error|warn|info|debug */
    struct {
        const char *server;             /* well_known.server: "" = 404 */
        const char *support_page;       /* well_known.support_page: "" = none */
        const char *admin_matrix_id;    /* well_known.support_admin_matrix_id: "" = none */
        const char *admin_email;        /* well_known.support_admin_email: "" = none */
    } well_known;
    struct {
        const char *bind_address;     /* server.http.bind_address (default 127.0.0.1) */
        int port;                     /* server.http.port (default 8008) */
        int request_threads;          /* server.http.request_threads (default 4, 1..256) */
        int woken_threads;            /* server.http.woken_threads (default 2, 1..256) */
        int woken_queue;              /* server.http.woken_queue (default 8192) */
        int connection_timeout_s;     /* server.http.connection_timeout_s (default 60) */
        int header_timeout_ms;        /* server.http.header_timeout_ms (default 10000) */
        int max_connections;          /* server.http.max_connections (0 = from RLIMIT_NOFILE) */
        int fd_reserve;               /* server.http.fd_reserve (default 128) */
        int64_t max_json_body_bytes;  /* server.http.max_json_body_bytes (default 1 MiB) */
        int handoff_deadline_ms;      /* server.http.handoff_deadline_ms (default 60000),
                                         counted from the end of the request's body */
        int body_idle_timeout_s;      /* server.http.body_idle_timeout_s (default 15) */
        int send_stall_timeout_s;     /* server.http.send_stall_timeout_s (default 10) */
        int line_share_per_client_percent; /* server.http.line_share_per_client_percent (25) */
        const char **trusted_proxies; /* server.http.trusted_proxies (default []) */
        size_t n_trusted_proxies;
    } http;
    struct {
        bool enabled;                   /* server.metrics.enabled (default true) */
        const char **allowed_addresses; /* server.metrics.allowed_addresses (loopback) */
        size_t n_allowed_addresses;
    } metrics;
    struct {
        bool enabled;             /* server.ops.enabled (default false) */
        const char *bind_address; /* server.ops.bind_address (default 127.0.0.1) */
        int port;                 /* server.ops.port (default 8009) */
        int max_connections;      /* server.ops.max_connections (default 8) */
    } ops;
    struct core_fed_listener {
        const char *bind_address;          /* server.federation.bind_address (0.0.0.0) */
        int port;                          /* server.federation.port (default 8448) */
        bool tls;                          /* server.federation.tls (default true) */
        const char *tls_certificate_path;  /* server.federation.tls_certificate_path ("") */
        const char *tls_private_key_path;  /* server.federation.tls_private_key_path ("") */
        int request_threads;               /* server.federation.request_threads (default 2) */
    } fed_listener;
    int shutdown_grace_ms; /* server.shutdown_grace_ms (default 10000) */
    const char *instance_name; /* server.instance_name ("" = <hostname>-<pid>) */
    int lease_ttl_ms;          /* server.lease_ttl_ms (default 30000, 1000..600000) */
    struct {
        const char *conninfo;     /* database.conninfo (libpq string; required) */
        int pool_size;            /* database.pool_size (default 8, 1..512) */
        int checkout_timeout_ms;  /* database.checkout_timeout_ms (default 2000): request
                                     paths' wait for a pooled connection (DB_WAIT_CONFIGURED) */
        int connect_retry_s;      /* database.connect_retry_s (default 30) */
        int unresponsive_ms;      /* database.unresponsive_ms (default 1000): probe deadline */
        int statement_timeout_ms; /* database.statement_timeout_ms (default 30000; 0 none) */
        bool prepared_statements; /* database.prepared_statements (default true): db_query */
    } database;
    struct {
        const char *default_version; /* rooms.default_version (default "10"): createRoom */
    } rooms;
    struct {
        bool enabled;              /* registration.enabled (default false): POST /register */
        const char *shared_secret; /* registration.shared_secret ("" = admin registration off) */
        bool guest_access;         /* registration.guest_access (default false): guests */
        bool requires_token;       /* registration.requires_token (default false) */
    } registration;
    struct {
        int memory_kib; /* password_hashing.memory_kib (default 65536): Argon2id memory */
        int passes;     /* password_hashing.passes (default 2): Argon2id passes */
    } password_hashing;
    struct {
        int refreshable_access_token_lifetime_ms; /* auth.refreshable_access_token_lifetime_ms
                                                      (default 300000) */
        bool login_via_existing_session; /* auth.login_via_existing_session (default false) */
        int login_token_lifetime_ms;     /* auth.login_token_lifetime_ms (default 300000) */
    } auth;
    struct {
        bool enabled;         /* ratelimit.enabled (default true) */
        /* Token buckets per client: ratelimit.<action>.per_minute and .burst. */
        struct core_rate {
            int per_minute, burst;
        } registration, login, message, sync; /* ratelimit.register.*, .login.*,
                                                 .message.*, .sync.* */
    } ratelimit;
    struct {
        bool enabled; /* presence.enabled (default true) */
    } presence;
    struct {
        int notifications_per_user_max; /* push.notifications_per_user_max (default 1000) */
    } push;
    struct {
        int cache_mb; /* sliding_sync.cache_mb (default 64; 0 keeps nothing) */
    } sliding_sync;
    const char **app_service_config_files; /* app_service_config_files: registration files */
    size_t n_app_service_config_files;
    struct {
        int retry_min_ms;       /* appservice.retry_min_ms (default 1000) */
        int retry_max_ms;       /* appservice.retry_max_ms (default 300000) */
        int request_timeout_ms; /* appservice.request_timeout_ms (default 30000) */
    } appservice;
    struct core_federation {
        /* federation.signing_key_path: "" = "<server_name>.signing.key" beside the config
         * file; relative paths are relative to the config file's directory. */
        const char *signing_key_path;
        int64_t key_valid_ms;            /* federation.key_valid_ms (default 7 days) */
        const cfg_node *old_signing_keys; /* federation.old_signing_keys (a map, or NULL) */
        bool verify_certificates;        /* federation.verify_certificates (default true) */
        const char **custom_ca_list;     /* federation.custom_ca_list (PEM files) */
        size_t n_custom_ca_list;
        const char **certificate_verification_whitelist; /* server names, development only */
        size_t n_certificate_verification_whitelist;
        const char **ip_range_blacklist; /* federation.ip_range_blacklist (default: the list
                                            of core/runtime/iprange.h) */
        size_t n_ip_range_blacklist;
        const char **ip_range_whitelist; /* federation.ip_range_whitelist (default []) */
        size_t n_ip_range_whitelist;
        const char **domain_whitelist;   /* federation.domain_whitelist ([] = everyone) */
        size_t n_domain_whitelist;
        const cfg_node *trusted_key_servers; /* federation.trusted_key_servers (a list) */
        const char **dns_servers;        /* federation.dns_servers ([] = /etc/resolv.conf) */
        size_t n_dns_servers;
        int max_connections;             /* federation.client.max_connections (16) */
        int max_connections_per_host;    /* federation.client.max_connections_per_host (8) */
        int request_timeout_ms;          /* federation.client.request_timeout_ms (60000) */
        int64_t min_retry_interval_ms;   /* federation.destination_min_retry_interval_ms */
        int retry_multiplier;            /* federation.destination_retry_multiplier */
        int64_t max_retry_interval_ms;   /* federation.destination_max_retry_interval_ms */
        int key_fetch_failure_cache_ms;  /* federation.key_fetch_failure_cache_ms (60000) */
        int sender_groups;               /* federation.sender_groups (16): destinations are
                                          * hashed into this many groups, each sent by the
                                          * process holding its lease */
    } federation;
};

/* Validate every core key of root into *out (which points into root) and reject unknown
 * keys anywhere outside plugins.<name> subtrees. plugins.<name> must be maps; their
 * `enabled` (bool) and `path` (string) are checked here, the rest by the plugin.
 * 0, or -1 with err set. Free out->http.trusted_proxies and out->metrics.allowed_addresses
 * with core_config_release. */
int core_config_load(const cfg_node *root, struct core_config *out, char *err, size_t errlen);
void core_config_release(struct core_config *c);
/* The longest instance name (server.instance_name), in bytes. */
#define CORE_INSTANCE_NAME_MAX_BYTES 64
/* This process's instance name: server.instance_name, or "<hostname>-<pid>" (the host's
 * first label, reduced to the allowed characters) when that is "". Written into buf (at
 * least CORE_INSTANCE_NAME_MAX_BYTES + 1 bytes), which it returns. Any thread. */
const char *core_instance_name(const struct core_config *c, char *buf, size_t len);

/* The core's table: every key of struct core_config, one row each. */
extern const struct cfg_setting CORE_SETTINGS[];
extern const size_t CORE_N_SETTINGS;
/* What the core itself reads under every plugins.<name>: enabled and path. */
extern const struct cfg_setting PLUGIN_COMMON_SETTINGS[];
extern const size_t PLUGIN_N_COMMON_SETTINGS;
/* The plugins --generate-config enables (NULL-terminated). */
extern const char *const CFG_GENERATED_PLUGINS[];

/* One plugin's declared settings for --generate-config: rows NULL when its descriptor
 * could not be read (the file then points at the plugin's README instead). */
struct cfg_plugin_doc {
    const char *name;
    const struct cfg_setting *rows;
    size_t n_rows;
};

/* Write a complete, commented configuration with every default to f: every core key, and
 * for each plugin of CFG_GENERATED_PLUGINS its settings as `plugins` describes them (n may
 * be 0). 0, or -1 when writing failed. */
int cfg_generate(FILE *f, const char *server_name, const char *conninfo,
                 const char *plugin_dir, const struct cfg_plugin_doc *plugins, size_t n);

/* The Markdown table of the core's keys and of plugins.<name>.enabled/path, as README.md
 * carries it (`atrium --print-config-table`). */
void cfg_print_core_table(FILE *f);

#endif
