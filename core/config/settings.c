/*
 * core/config/settings.c - the core's settings, each declared once: one row per key of
 * struct core_config (its path, type, range, default, unit, field and help), and what is
 * built from those rows: core_config_load, --generate-config and the README's table.
 *
 * Adding a core setting means adding its field to struct core_config and its row here;
 * reading, the unknown-key check, the generated file and `atrium --print-config-table`
 * (which README.md must match: tests/integration/test_config_docs.py) follow from the row.
 * Rows are grouped by map in the order the generated file shows them. Under plugins.<name>
 * the core reads only `enabled` and `path` (PLUGIN_COMMON_SETTINGS); every other key there
 * belongs to the plugin, whose rows come from its descriptor (core/plugins/plugin_settings.c).
 * Checks a type and range cannot express (a server name, a URL) are the rows' check
 * functions. No global mutable state; any thread.
 */
#include "core/config/config.h"
#include "core/runtime/iprange.h"
#include "core/runtime/server_name.h"

#include <ctype.h>
#include <sodium.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef ATRIUM_DEFAULT_PLUGIN_DIR
#define CORE_DEFAULT_PLUGIN_DIR ATRIUM_DEFAULT_PLUGIN_DIR
#else
#define CORE_DEFAULT_PLUGIN_DIR "/usr/lib/atrium/plugins"
#endif

#define GENERATED_SHARED_SECRET_BYTES 32 /* random bytes, written as hex */
#define RATE_MAX 1000000                 /* per_minute and burst, any action */
#define SETTINGS_TEXT_BYTES 256

static const char *const LOG_LEVELS[] = {"error", "warn", "info", "debug", NULL};
static const char *const DEFAULT_METRICS_ADDRESSES[] = {"127.0.0.1", "::1", NULL};
const char *const CFG_GENERATED_PLUGINS[] = {"media", "directory", NULL};

/* ---- checks beyond type and range ------------------------------------------------------- */

static int check_server_name(const cfg_node *n, const void *field, char *err, size_t errlen)
{
    const char *name = *(const char *const *)field;
    if (!rt_server_name_valid(name)) /* the one grammar: core/runtime/server_name.h */
        return cfg_error(n, err, errlen, "\"%.64s\" is not a server name; give a host with "
                         "an optional port, like example.org or example.org:8448", name);
    return 0;
}

static int check_base_url(const cfg_node *n, const void *field, char *err, size_t errlen)
{
    const char *url = *(const char *const *)field;
    if (url[0] != '\0' && strncmp(url, "https://", 8) != 0 && strncmp(url, "http://", 7) != 0)
        return cfg_error(n, err, errlen, "expected a URL starting with https:// (or \"\" for "
                         "none)");
    return 0;
}

/* "" or a server name (the delegation /.well-known/matrix/server answers with). */
static int check_delegated_name(const cfg_node *n, const void *field, char *err, size_t errlen)
{
    const char *name = *(const char *const *)field;
    if (name[0] != '\0' && !rt_server_name_valid(name))
        return cfg_error(n, err, errlen, "\"%.64s\" is not a server name; give a host with an "
                         "optional port, like matrix.example.org:443 (or \"\" for none)", name);
    return 0;
}

/* "" or a user ID ("@admin:example.org"). */
static int check_user_id(const cfg_node *n, const void *field, char *err, size_t errlen)
{
    const char *id = *(const char *const *)field;
    if (id[0] != '\0' && (id[0] != '@' || !rt_server_name_of_id_valid(id)))
        return cfg_error(n, err, errlen, "\"%.64s\" is not a user ID like @admin:example.org "
                         "(or \"\" for none)", id);
    return 0;
}

/* "" or something shaped like an e-mail address (one '@' with text either side). */
static int check_email(const cfg_node *n, const void *field, char *err, size_t errlen)
{
    const char *addr = *(const char *const *)field;
    const char *at = strchr(addr, '@');
    if (addr[0] != '\0' && (!at || at == addr || !at[1] || strchr(at + 1, '@') ||
                            strpbrk(addr, " \t\r\n")))
        return cfg_error(n, err, errlen, "\"%.64s\" is not an e-mail address (or \"\" for "
                         "none)", addr);
    return 0;
}

/* An instance name goes into log lines, a metric label and the lease table's holder
 * column: letters, digits, '.', '_' and '-' only, so none of those needs escaping. */
static bool instance_char_ok(char c)
{
    return isalnum((unsigned char)c) || c == '.' || c == '_' || c == '-';
}

static int check_instance_name(const cfg_node *n, const void *field, char *err, size_t errlen)
{
    const char *name = *(const char *const *)field;
    size_t len = strlen(name);
    bool ok = len <= CORE_INSTANCE_NAME_MAX_BYTES;
    for (const char *c = name; ok && *c != '\0'; c++) ok = instance_char_ok(*c);
    if (!ok)
        return cfg_error(n, err, errlen, "\"%.64s\" is not an instance name; give at most %d "
                         "letters, digits, '.', '_' or '-', like atrium-1 (or \"\" for "
                         "<hostname>-<pid>)", name, CORE_INSTANCE_NAME_MAX_BYTES);
    return 0;
}

const char *core_instance_name(const struct core_config *c, char *buf, size_t len)
{
    if (c->instance_name && c->instance_name[0] != '\0') {
        snprintf(buf, len, "%s", c->instance_name);
        return buf;
    }
    char host[CORE_INSTANCE_NAME_MAX_BYTES + 1] = "";
    if (gethostname(host, sizeof(host)) != 0) host[0] = '\0';
    host[sizeof(host) - 1] = '\0';
    size_t w = 0;
    for (size_t i = 0; host[i] != '\0' && host[i] != '.' && w + 1 < sizeof(host); i++)
        if (instance_char_ok(host[i])) host[w++] = host[i];
    host[w] = '\0';
    snprintf(buf, len, "%s-%ld", w ? host : "atrium", (long)getpid());
    return buf;
}

/* ---- the rows ------------------------------------------------------------------------------ */

#define FIELD(member) offsetof(struct core_config, member)
#define INT_ROW(p, member, d, lo, hi, u, h)                                                  \
    {.path = (p), .type = CFG_T_INT, .offset = FIELD(member), .def = (d), .min = (lo),       \
     .max = (hi), .unit = (u), .help = (h)}
#define BOOL_ROW(p, member, d, h)                                                            \
    {.path = (p), .type = CFG_T_BOOL, .offset = FIELD(member), .def = (d), .min = 0,         \
     .max = 1, .help = (h)}
#define RATE_ROWS(action, member, per_min, at_once, who)                                    \
    INT_ROW("ratelimit." action ".per_minute", ratelimit.member.per_minute, per_min, 1,      \
            RATE_MAX, "per minute", who ": how fast the bucket refills."),                            \
    INT_ROW("ratelimit." action ".burst", ratelimit.member.burst, at_once, 1, RATE_MAX,      \
            NULL, who ": how many at once before the rate applies.")

const struct cfg_setting CORE_SETTINGS[] = {
    {.path = "server_name", .type = CFG_T_STRING, .flags = CFG_F_REQUIRED,
     .offset = FIELD(server_name), .check = check_server_name,
     .help = "This server's name, as in @alice:example.org; it cannot change once users "
             "exist."},
    {.path = "public_baseurl", .type = CFG_T_STRING, .offset = FIELD(public_baseurl),
     .def_string = "", .check = check_base_url,
     .help = "Base URL clients reach this server at, served at /.well-known/matrix/client; "
             "\"\" serves none."},
    {.path = "plugin_dir", .type = CFG_T_STRING, .flags = CFG_F_NONEMPTY,
     .offset = FIELD(plugin_dir), .def_string = CORE_DEFAULT_PLUGIN_DIR,
     .default_doc = "the build's `plugins/`",
     .help = "Folder where plugins are found as `<name>.so`."},
    {.path = "app_service_config_files", .type = CFG_T_STRING_LIST,
     .offset = FIELD(app_service_config_files),
     .count_offset = FIELD(n_app_service_config_files),
     .help = "Registration files (YAML) of the application services (bridges) this server "
             "serves, checked at start (README.md, Bridges)."},
    {.path = "log.level", .type = CFG_T_ENUM, .offset = FIELD(log_level), .def_string = "info",
     .values = LOG_LEVELS, .unit = "log level",
     .help = "Least severe messages written."},
    {.path = "well_known.server", .type = CFG_T_STRING, .offset = FIELD(well_known.server),
     .def_string = "", .check = check_delegated_name,
     .help = "Where other servers reach this one, served at /.well-known/matrix/server as "
             "m.server (like matrix.example.org:443); \"\" serves none (404)."},
    {.path = "well_known.support_page", .type = CFG_T_STRING,
     .offset = FIELD(well_known.support_page), .def_string = "", .check = check_base_url,
     .help = "URL of a page about getting help, served at /.well-known/matrix/support; \"\" = "
             "none."},
    {.path = "well_known.support_admin_matrix_id", .type = CFG_T_STRING,
     .offset = FIELD(well_known.admin_matrix_id), .def_string = "", .check = check_user_id,
     .help = "The administrator's Matrix ID, served at /.well-known/matrix/support as a "
             "contact with role m.role.admin; \"\" = none."},
    {.path = "well_known.support_admin_email", .type = CFG_T_STRING,
     .offset = FIELD(well_known.admin_email), .def_string = "", .check = check_email,
     .help = "The administrator's e-mail address, in the same contact; \"\" = none. With "
             "no contact and no support page, /.well-known/matrix/support is 404."},

    {.path = "server.http.bind_address", .type = CFG_T_STRING, .flags = CFG_F_NONEMPTY,
     .offset = FIELD(http.bind_address), .def_string = "127.0.0.1",
     .help = "Address the client listener binds, an IPv4 or IPv6 literal (plain HTTP; "
             "terminate TLS in a proxy)."},
    INT_ROW("server.http.port", http.port, 8008, 0, 65535, NULL,
            "TCP port of the client listener; 0 = any free port."),
    INT_ROW("server.http.request_threads", http.request_threads, 4, 1, 256, "threads",
            "The request pool: threads handling client requests (libmicrohttpd's pool)."),
    INT_ROW("server.http.woken_threads", http.woken_threads, 2, 1, 256, "threads",
            "Threads that run woken long-polls (/sync, sliding sync) again, so a message to a "
            "big room's parked members never holds the request pool."),
    INT_ROW("server.http.woken_queue", http.woken_queue, 8192, 1, 1000000, NULL,
            "Woken long-polls waiting for those threads at most; past it one runs on its "
            "request thread."),
    INT_ROW("server.http.connection_timeout_s", http.connection_timeout_s, 60, 1, 3600, "s",
            "An idle client connection is closed after this long."),
    INT_ROW("server.http.header_timeout_ms", http.header_timeout_ms, 10000, 100, 600000, "ms",
            "A new connection must send its complete request headers within this long, else "
            "it gets 408 and is closed (slow senders cannot hold connections)."),
    INT_ROW("server.http.max_connections", http.max_connections, 0, 0, 1000000, NULL,
            "Open client connections at most (more wait in the kernel's accept queue, never "
            "refused); 0 = RLIMIT_NOFILE minus fd_reserve, the database pool, outbound "
            "sockets and server.ops.max_connections."),
    INT_ROW("server.http.fd_reserve", http.fd_reserve, 128, 0, 65536, NULL,
            "File descriptors kept for files, PostgreSQL and peers."),
    {.path = "server.http.max_json_body_bytes", .type = CFG_T_INT64,
     .offset = FIELD(http.max_json_body_bytes), .def = INT64_C(1024) * 1024, .min = 1024,
     .max = INT64_C(64) * 1024 * 1024, .unit = "bytes",
     .help = "Largest JSON request body accepted (larger ones get 413)."},
    INT_ROW("server.http.handoff_deadline_ms", http.handoff_deadline_ms, 60000, 100, 3600000,
            "ms", "A parked or handed-off request not answered this long after its body "
                  "arrived gets 504."),
    INT_ROW("server.http.line_share_per_client_percent", http.line_share_per_client_percent,
            25, 1, 100, "%", "No client holds more than this share of an admission line's "
            "slots at once (at least one; the media delivery line): the rest stay free for "
            "others."),
    INT_ROW("server.http.send_stall_timeout_s", http.send_stall_timeout_s, 10, 1, 3600, "s",
            "A client that reads nothing of a response for this long is disconnected, and "
            "what its request held (a delivery slot) is freed."),
    INT_ROW("server.http.body_idle_timeout_s", http.body_idle_timeout_s, 15, 1, 3600, "s",
            "A client that sends no byte of its request body for this long is disconnected "
            "(however long a steady upload takes)."),
    {.path = "server.http.trusted_proxies", .type = CFG_T_STRING_LIST,
     .offset = FIELD(http.trusted_proxies), .count_offset = FIELD(http.n_trusted_proxies),
     .help = "Proxy addresses whose X-Forwarded-For is believed (for client keys)."},
    BOOL_ROW("server.metrics.enabled", metrics.enabled, true, "Serve Prometheus metrics at "
             "/metrics."),
    {.path = "server.metrics.allowed_addresses", .type = CFG_T_STRING_LIST,
     .offset = FIELD(metrics.allowed_addresses),
     .count_offset = FIELD(metrics.n_allowed_addresses), .values = DEFAULT_METRICS_ADDRESSES,
     .help = "Client addresses allowed to read /metrics."},
    BOOL_ROW("server.ops.enabled", ops.enabled, false,
             "Serve /health and /metrics on a listener of their own as well, for load "
             "balancers and monitoring: its connections are never queued behind clients'."),
    {.path = "server.ops.bind_address", .type = CFG_T_STRING, .flags = CFG_F_NONEMPTY,
     .offset = FIELD(ops.bind_address), .def_string = "127.0.0.1",
     .help = "Address the operational listener binds, an IPv4 or IPv6 literal (only the load "
             "balancer and monitoring should reach it)."},
    INT_ROW("server.ops.port", ops.port, 8009, 0, 65535, NULL,
            "TCP port of the operational listener; 0 = any free port."),
    INT_ROW("server.ops.max_connections", ops.max_connections, 8, 1, 256, NULL,
            "Connections the operational listener serves at once: descriptors kept for it "
            "out of the client connections' share."),
    {.path = "server.federation.bind_address", .type = CFG_T_STRING, .flags = CFG_F_NONEMPTY,
     .offset = FIELD(fed_listener.bind_address), .def_string = "0.0.0.0",
     .help = "Address the federation listener binds, an IPv4 or IPv6 literal."},
    INT_ROW("server.federation.port", fed_listener.port, 8448, 0, 65535, NULL,
            "TCP port other servers reach (federation and key paths only); 0 = any free port."),
    BOOL_ROW("server.federation.tls", fed_listener.tls, true,
             "Serve TLS on the federation port; false when a proxy in front terminates TLS."),
    {.path = "server.federation.tls_certificate_path", .type = CFG_T_STRING,
     .offset = FIELD(fed_listener.tls_certificate_path), .def_string = "",
     .help = "PEM certificate (or chain) of the federation listener, reloaded on SIGHUP; "
             "\"\" (with tls: true) serves no federation."},
    {.path = "server.federation.tls_private_key_path", .type = CFG_T_STRING,
     .offset = FIELD(fed_listener.tls_private_key_path), .def_string = "",
     .help = "PEM private key of that certificate, reloaded with it."},
    INT_ROW("server.federation.request_threads", fed_listener.request_threads, 2, 1, 256,
            "threads", "Threads handling requests from other servers."),
    INT_ROW("server.shutdown_grace_ms", shutdown_grace_ms, 10000, 0, 600000, "ms",
            "Running requests get this long after SIGTERM; new requests meanwhile get 503 "
            "with Connection: close."),
    {.path = "server.instance_name", .type = CFG_T_STRING, .offset = FIELD(instance_name),
     .def_string = "", .default_doc = "`<hostname>-<pid>`", .check = check_instance_name,
     .help = "This process's name among several sharing one database: in every log line, "
             "in /metrics (atrium_instance_info) and as the holder of its leases; letters, "
             "digits, '.', '_', '-'. Give each process its own."},
    INT_ROW("server.lease_ttl_ms", lease_ttl_ms, 30000, 1000, 600000, "ms",
            "Once-only background jobs (the typing reaper, each federation sender group) run "
            "in one process at a time under a lease renewed every quarter of this; when its "
            "holder dies another process takes the job over within this long."),

    {.path = "database.conninfo", .type = CFG_T_STRING, .flags = CFG_F_REQUIRED,
     .offset = FIELD(database.conninfo),
     .help = "A libpq connection string, like \"dbname=atrium\"."},
    INT_ROW("database.pool_size", database.pool_size, 8, 1, 512, NULL,
            "The most PostgreSQL connections the pool opens, shared by the core and the "
            "plugins: one at start, more as concurrent requests need them (a sliding-sync "
            "run also borrows a spare one for its parallel reads while another stays idle: "
            "docs/adr/0044-sliding-sync-reads-on-two-connections.md)."),
    INT_ROW("database.checkout_timeout_ms", database.checkout_timeout_ms, 2000, 1, 600000,
            "ms", "How long a client request waits for a free database connection before it "
                  "is answered 503."),
    INT_ROW("database.connect_retry_s", database.connect_retry_s, 30, 0, 3600, "s",
            "How long start-up keeps retrying an unreachable PostgreSQL."),
    INT_ROW("database.unresponsive_ms", database.unresponsive_ms, 1000, 100, 60000, "ms",
            "A PostgreSQL that does not answer a probe within this long counts as unavailable: "
            "queries waiting on it are cut and requests needing it get 503 at once until it "
            "answers again; the listening connection (notifications from other processes) "
            "counts as lost."),
    INT_ROW("database.statement_timeout_ms", database.statement_timeout_ms, 30000, 0, 3600000,
            "ms", "PostgreSQL cancels a statement running longer than this (its "
                  "statement_timeout; migrations excepted); 0 = no limit."),
    BOOL_ROW("database.prepared_statements", database.prepared_statements, true,
             "Prepare the core's statements once per pooled connection, so PostgreSQL plans "
             "each once; false for a connection pooler that cannot keep them (PgBouncer in "
             "transaction mode before 1.21)."),

    BOOL_ROW("registration.enabled", registration.enabled, false,
             "Let anyone create an account with POST /register."),
    BOOL_ROW("registration.guest_access", registration.guest_access, false,
             "Let anyone make a guest account (POST /register?kind=guest): no password, and "
             "only the endpoints the spec opens to guests (403 M_GUEST_ACCESS_FORBIDDEN "
             "elsewhere); guests join only rooms whose m.room.guest_access is can_join."),
    BOOL_ROW("registration.requires_token", registration.requires_token, false,
             "POST /register also asks for a registration token (the m.login.registration_token "
             "stage); server admins make tokens with /_synapse/admin/v1/registration_tokens."),
    {.path = "registration.shared_secret", .type = CFG_T_STRING,
     .offset = FIELD(registration.shared_secret), .def_string = "",
     .help = "Secret for admin registration (/_synapse/admin/v1/register and `atrium "
             "register-user`); \"\" turns it off. Keep it private."},

    INT_ROW("password_hashing.memory_kib", password_hashing.memory_kib, 65536, 8, 1048576,
            "KiB", "Memory of one Argon2id password hash. At most two hashes run at once (the "
                   "core.auth pool), so this bounds their memory. Lower values make stored "
                   "passwords cheaper to guess offline: lower it only for tests or a very small "
                   "machine. A stored hash keeps the cost it was made with."),
    INT_ROW("password_hashing.passes", password_hashing.passes, 2, 1, 16, NULL,
            "Argon2id passes over that memory per password hash (time cost)."),

    INT_ROW("auth.refreshable_access_token_lifetime_ms", auth.refreshable_access_token_lifetime_ms,
            300000, 1000, 86400000, "ms",
            "Lifetime of an access token issued with a refresh token (a client that sends "
            "refresh_token: true to /login or /register); past it the token answers 401 "
            "M_UNKNOWN_TOKEN with soft_logout: true and the client calls POST /refresh. "
            "Other access tokens never expire."),
    BOOL_ROW("auth.login_via_existing_session", auth.login_via_existing_session, false,
             "Let a signed-in user get a single-use login token (POST /login/get_token, after "
             "re-entering their password) to sign in another device with m.login.token."),
    INT_ROW("auth.login_token_lifetime_ms", auth.login_token_lifetime_ms, 300000, 1000,
            3600000, "ms", "How long a token from POST /login/get_token may be used."),

    BOOL_ROW("ratelimit.enabled", ratelimit.enabled, true,
             "Refuse clients over their rate with 429 (token buckets per client key and "
             "action)."),
    RATE_ROWS("register", registration, 30, 10,
              "Registration requests (POST /register, admin nonce) per address"),
    RATE_ROWS("login", login, 30, 10, "Login attempts (POST /login) per address"),
    RATE_ROWS("message", message, 300, 30, "Events sent into rooms per user"),
    RATE_ROWS("sync", sync, 1200, 100,
              "Sync requests per user (a parked sync that wakes is not counted again)"),

    BOOL_ROW("presence.enabled", presence.enabled, true,
             "Track and share presence (online, unavailable, offline): /presence and /sync's "
             "presence; off, every user reads as offline and nothing is stored."),

    INT_ROW("push.notifications_per_user_max", push.notifications_per_user_max, 1000, 1,
            1000000, NULL,
            "Notifications kept per user (GET /notifications, the unread count sent to push "
            "gateways): older ones are deleted, with their pushes not yet delivered, once a "
            "user has a tenth more than this."),

    INT_ROW("sliding_sync.cache_mb", sliding_sync.cache_mb, 64, 0, 65536, "MiB",
            "Memory for joined rooms' first sliding-sync results, kept per process and sent "
            "again while nothing of the room changed (its events, the user's receipt and "
            "account data): keys and JSON text at most this; 0 keeps nothing "
            "(docs/adr/0045-sliding-sync-keeps-first-results.md)."),

    INT_ROW("appservice.retry_min_ms", appservice.retry_min_ms, 1000, 10, 600000, "ms",
            "A transaction an application service did not take is sent again after this "
            "long, doubled per failure."),
    INT_ROW("appservice.retry_max_ms", appservice.retry_max_ms, 300000, 10, 3600000, "ms",
            "The longest wait between two tries of a transaction."),
    INT_ROW("appservice.request_timeout_ms", appservice.request_timeout_ms, 30000, 100,
            600000, "ms", "A request to an application service fails after this long."),

    {.path = "rooms.default_version", .type = CFG_T_STRING, .flags = CFG_F_NONEMPTY,
     .offset = FIELD(rooms.default_version), .def_string = "10",
     .help = "Room version of new rooms when createRoom names none (\"1\" to \"11\"; "
             "checked by the rooms module)."},
    {.path = "federation.signing_key_path", .type = CFG_T_STRING,
     .offset = FIELD(federation.signing_key_path), .def_string = "",
     .help = "This server's ed25519 signing key, in Synapse's file format; created on first "
             "start where it does not exist. \"\" = <server_name>.signing.key beside the "
             "config file (relative paths too are relative to it)."},
    {.path = "federation.key_valid_ms", .type = CFG_T_INT64,
     .offset = FIELD(federation.key_valid_ms), .def = INT64_C(7) * 24 * 3600 * 1000,
     .min = 60000, .max = INT64_C(30) * 24 * 3600 * 1000, .unit = "ms",
     .help = "How long the published key document is valid (valid_until_ts), from each answer."},
    {.path = "federation.old_signing_keys", .type = CFG_T_TREE,
     .offset = FIELD(federation.old_signing_keys), .def_string = "{}",
     .help = "Keys this server signed with before, still published so what they signed "
             "verifies: {\"ed25519:id\": {key: <unpadded base64 public key>, expired_ts: <ms>}}."},
    BOOL_ROW("federation.verify_certificates", federation.verify_certificates, true,
             "Check other servers' TLS certificates."),
    {.path = "federation.custom_ca_list", .type = CFG_T_STRING_LIST,
     .offset = FIELD(federation.custom_ca_list),
     .count_offset = FIELD(federation.n_custom_ca_list),
     .help = "PEM files of the CAs trusted for federation instead of the system's."},
    {.path = "federation.certificate_verification_whitelist", .type = CFG_T_STRING_LIST,
     .offset = FIELD(federation.certificate_verification_whitelist),
     .count_offset = FIELD(federation.n_certificate_verification_whitelist),
     .help = "Server names whose certificates are not checked: for development only (logged)."},
    {.path = "federation.ip_range_blacklist", .type = CFG_T_STRING_LIST,
     .offset = FIELD(federation.ip_range_blacklist),
     .count_offset = FIELD(federation.n_ip_range_blacklist),
     .values = RT_IPRANGE_DEFAULT_BLACKLIST,
     .default_doc = "loopback, RFC 1918, link-local, CGNAT, `0.0.0.0/8`, multicast, reserved "
                    "and their IPv6 and `::ffff:` forms",
     .help = "Addresses outbound connections never reach (CIDR list), checked at connect."},
    {.path = "federation.ip_range_whitelist", .type = CFG_T_STRING_LIST,
     .offset = FIELD(federation.ip_range_whitelist),
     .count_offset = FIELD(federation.n_ip_range_whitelist),
     .help = "Addresses allowed although the blacklist names them (CIDR list)."},
    {.path = "federation.domain_whitelist", .type = CFG_T_STRING_LIST,
     .offset = FIELD(federation.domain_whitelist),
     .count_offset = FIELD(federation.n_domain_whitelist),
     .help = "Server names to federate with, both ways; [] = every server."},
    {.path = "federation.trusted_key_servers", .type = CFG_T_TREE,
     .offset = FIELD(federation.trusted_key_servers), .def_string = "[]",
     .help = "Notaries asked for other servers' keys first, their signature checked: a list of "
             "{server_name, verify_keys: {\"ed25519:id\": <key>}}; [] = ask each server."},
    {.path = "federation.dns_servers", .type = CFG_T_STRING_LIST,
     .offset = FIELD(federation.dns_servers), .count_offset = FIELD(federation.n_dns_servers),
     .help = "DNS servers for server discovery (\"ip\" or \"ip:port\"); [] = /etc/resolv.conf."},
    INT_ROW("federation.client.max_connections", federation.max_connections, 16, 1, 4096, NULL,
            "Outbound connections to other servers open at once, in all."),
    INT_ROW("federation.client.max_connections_per_host", federation.max_connections_per_host,
            8, 1, 4096, NULL,
            "Outbound connections to one server at once (one slow peer cannot take them all)."),
    INT_ROW("federation.client.request_timeout_ms", federation.request_timeout_ms, 60000, 100,
            600000, "ms", "An outbound request to another server fails after this long."),
    {.path = "federation.destination_min_retry_interval_ms", .type = CFG_T_INT64,
     .offset = FIELD(federation.min_retry_interval_ms), .def = 600000, .min = 100,
     .max = INT64_C(7) * 24 * 3600 * 1000, .unit = "ms",
     .help = "A server that failed (no connection, TLS, timeout, 5xx) is left alone this long "
             "before the first retry."},
    INT_ROW("federation.destination_retry_multiplier", federation.retry_multiplier, 2, 1, 100,
            NULL, "Each further failure multiplies the wait by this."),
    {.path = "federation.destination_max_retry_interval_ms", .type = CFG_T_INT64,
     .offset = FIELD(federation.max_retry_interval_ms), .def = INT64_C(24) * 3600 * 1000,
     .min = 100, .max = INT64_C(30) * 24 * 3600 * 1000, .unit = "ms",
     .help = "The longest wait between retries of a failing server."},
    INT_ROW("federation.key_fetch_failure_cache_ms", federation.key_fetch_failure_cache_ms,
            60000, 0, 3600000, "ms",
            "A failed key look-up is remembered this long, so a dead server is not asked at "
            "every request."),
    INT_ROW("federation.sender_groups", federation.sender_groups, 16, 1, 1024, NULL,
            "Destinations are hashed into this many groups, each sent to by the one process "
            "holding its lease; live processes share the groups out. The same in every "
            "process."),
};
const size_t CORE_N_SETTINGS = sizeof CORE_SETTINGS / sizeof *CORE_SETTINGS;

/* What the core reads under plugins.<name>, into this. */
struct plugin_common {
    bool enabled;
    const char *path;
};

const struct cfg_setting PLUGIN_COMMON_SETTINGS[] = {
    {.path = "enabled", .type = CFG_T_BOOL, .offset = offsetof(struct plugin_common, enabled),
     .def = 0, .min = 0, .max = 1, .help = "Load the plugin (an explicit allow-list)."},
    {.path = "path", .type = CFG_T_STRING, .offset = offsetof(struct plugin_common, path),
     .default_doc = "`<plugin_dir>/<name>.so`",
     .help = "Load this shared object instead of the one in plugin_dir."},
};
const size_t PLUGIN_N_COMMON_SETTINGS =
    sizeof PLUGIN_COMMON_SETTINGS / sizeof *PLUGIN_COMMON_SETTINGS;

static const struct cfg_section CORE_SECTIONS[] = {
    {"log", "Logging."},
    {"server", "The HTTP front door."},
    {"server.http", "The client-server listener."},
    {"server.metrics", "Prometheus metrics at /metrics."},
    {"database", "PostgreSQL, shared by the core and the plugins."},
    {"registration", "Accounts."},
    {"ratelimit", "Per-client rate limits: a token bucket per client (address before login, "
                  "user after) and action."},
    {"presence", "Presence: whether users are online, shared with those they share a room with."},
    {"push", "Push notifications: what notified whom, and delivery to push gateways."},
    {"appservice", "Application services (bridges): delivery of their transactions."},
    {"rooms", "Rooms."},
    {"server.ops", "The operational listener: /health and /metrics for load balancers and "
                   "monitoring (docs/adr/0025-queue-past-the-connection-limit.md)."},
    {"server.federation", "The federation listener: other servers and key look-ups (TLS)."},
    {"federation", "Federation: talking to other Matrix servers (README.md, Federation)."},
    {"federation.client", "The one outbound client every request to another server uses."},
};

/* ---- loading ------------------------------------------------------------------------------ */

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
        struct plugin_common common;
        if (cfg_settings_read(p, PLUGIN_COMMON_SETTINGS, PLUGIN_N_COMMON_SETTINGS, &common, err,
                              errlen) < 0)
            return -1;
        if (common.path != NULL && common.path[0] == '\0')
            return cfg_error(cfg_get(p, "path"), err, errlen, "must not be empty; leave it out "
                             "to load %s.so from plugin_dir", p->key);
    }
    return 0;
}

int core_config_load(const cfg_node *root, struct core_config *out, char *err, size_t errlen)
{
    static const char *const extra[] = {"plugins", NULL};
    memset(out, 0, sizeof *out);
    if (root == NULL)
        return cfg_error(NULL, err, errlen, "no configuration");
    if (cfg_settings_check_keys(root, CORE_SETTINGS, CORE_N_SETTINGS, extra, err, errlen) < 0 ||
        check_plugins(root, err, errlen) < 0)
        return -1;
    if (cfg_settings_read(root, CORE_SETTINGS, CORE_N_SETTINGS, out, err, errlen) < 0) {
        core_config_release(out);
        return -1;
    }
    return 0;
}

void core_config_release(struct core_config *c)
{
    if (c != NULL)
        cfg_settings_release(CORE_SETTINGS, CORE_N_SETTINGS, c);
}

/* ---- --generate-config and the README's table ---------------------------------------------- */

/* s as a YAML double-quoted string, into buf (NULL when it does not fit). */
static const char *quote(const char *s, char *buf, size_t len)
{
    FILE *f = fmemopen(buf, len, "w");
    if (f == NULL)
        return NULL;
    cfg_yaml_quote(f, s);
    bool ok = fflush(f) == 0 && ftell(f) < (long)len;
    fclose(f);
    return ok ? buf : NULL;
}

static void generate_plugins(FILE *f, const struct cfg_plugin_doc *plugins, size_t n)
{
    fputs("\n# Plugins, one map per plugin name. Besides enabled and path, each plugin's keys "
          "are its\n# own: the plugin declares them and they are checked when it starts.\n"
          "plugins:\n", f);
    for (size_t i = 0; CFG_GENERATED_PLUGINS[i] != NULL; i++) {
        const char *name = CFG_GENERATED_PLUGINS[i];
        const struct cfg_plugin_doc *doc = NULL;
        for (size_t k = 0; k < n && doc == NULL; k++)
            if (strcmp(plugins[k].name, name) == 0)
                doc = &plugins[k];
        fprintf(f, "  %s:\n", name);
        fprintf(f, "    # Load %s.so from plugin_dir (true or false); path: loads another "
                ".so instead.\n    enabled: true\n", name);
        if (doc != NULL && doc->rows != NULL)
            cfg_settings_write(f, 4, doc->rows, doc->n_rows, NULL, 0, NULL, 0);
        else
            fprintf(f, "    # Its own keys and their defaults: plugins/%s/README.md in "
                    "Atrium's source.\n", name);
    }
}

int cfg_generate(FILE *f, const char *server_name, const char *conninfo,
                 const char *plugin_dir, const struct cfg_plugin_doc *plugins, size_t n)
{
    if (f == NULL || server_name == NULL || conninfo == NULL)
        return -1;
    unsigned char raw[GENERATED_SHARED_SECRET_BYTES];
    char hex[2 * GENERATED_SHARED_SECRET_BYTES + 3];
    char name_q[SETTINGS_TEXT_BYTES], conninfo_q[4 * SETTINGS_TEXT_BYTES];
    char dir_q[4 * SETTINGS_TEXT_BYTES];
    if (sodium_init() < 0)
        return -1;
    randombytes_buf(raw, sizeof raw);
    hex[0] = '"';
    sodium_bin2hex(hex + 1, sizeof hex - 2, raw, sizeof raw);
    strcat(hex, "\"");
    const struct cfg_value values[] = {
        {"server_name", quote(server_name, name_q, sizeof name_q), NULL},
        {"database.conninfo", quote(conninfo, conninfo_q, sizeof conninfo_q), NULL},
        {"plugin_dir", plugin_dir ? quote(plugin_dir, dir_q, sizeof dir_q) : NULL, NULL},
        {"registration.enabled", "true", "This generated file turns it on for a local server."},
        {"registration.shared_secret", hex, "A random secret, made for this file."},
    };
    if (values[0].yaml == NULL || values[1].yaml == NULL || (plugin_dir && !values[2].yaml))
        return -1;
    fputs("# Atrium homeserver configuration, written by --generate-config.\n"
          "# Every key is listed with what it does, what it allows and its default. Any key "
          "can\n# also be set from the environment: ATRIUM__SERVER__HTTP__PORT=8448 sets "
          "server.http.port\n# (the value is read as YAML). Unknown keys stop start-up; they "
          "are never ignored.\n\n", f);
    cfg_settings_write(f, 0, CORE_SETTINGS, CORE_N_SETTINGS, CORE_SECTIONS,
                       sizeof CORE_SECTIONS / sizeof *CORE_SECTIONS, values,
                       sizeof values / sizeof *values);
    generate_plugins(f, plugins, n);
    if (fflush(f) != 0 || ferror(f))
        return -1;
    return 0;
}

void cfg_print_core_table(FILE *f)
{
    cfg_settings_print_markdown(f, "", CORE_SETTINGS, CORE_N_SETTINGS);
    /* the rows of plugins.<name>, without a second header */
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    if (m == NULL)
        return;
    cfg_settings_print_markdown(m, "plugins.<name>.", PLUGIN_COMMON_SETTINGS,
                                PLUGIN_N_COMMON_SETTINGS);
    fclose(m);
    const char *body = text;
    for (int skip = 0; skip < 2 && body != NULL; skip++)
        body = strchr(body, '\n') ? strchr(body, '\n') + 1 : NULL;
    if (body != NULL)
        fputs(body, f);
    fputs("| `plugins.<name>.*` | | | the plugin's own settings, declared and checked by the "
          "plugin |\n", f);
    free(text);
}
