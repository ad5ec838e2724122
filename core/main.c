/*
 * core/main.c - the atrium executable: command line, start-up order, signals, shutdown.
 *
 * Start-up order: config (file, then environment) -> instance name and log level ->
 * descriptors, SIGPIPE, libcurl, stop signals blocked -> metrics -> HTTP server object and
 * the core's own routes (routes are registered before listening) -> PostgreSQL (bounded
 * retry) -> core migrations -> the lease service (core/store/lease.h) -> the notification
 * service (made, not started) -> the auth pool -> each client module in turn (init, its
 * migrations, start) -> federation (signing key, routes, the listener's certificate; its
 * migrations; its threads) -> plugins (init) -> the notification service starts listening
 * (every subscription made by now) -> plugin migrations -> plugins (pools, start) ->
 * listen (federation, then client). Any failure stops start-up with the line that says
 * why.
 * SIGHUP reloads the federation listener's certificate and changes nothing else.
 * Shutdown (SIGINT/SIGTERM): refuse new requests (503, Connection: close) -> answer every
 * parked and handed-off request -> let running requests finish within
 * server.shutdown_grace_ms -> stop the notification service (no callback after it) -> stop
 * plugins (their pools drain) -> stop client modules and
 * the auth pool -> a short drain for their answers -> stop libmicrohttpd -> stop
 * federation (outbound requests end) -> give up the leases (other processes take the
 * once-only jobs) -> fini plugins -> free federation -> close PostgreSQL. Why no
 * MHD_quiesce_daemon: docs/adr/0004-shutdown-without-quiesce.md.
 * Signals are blocked in every thread and taken here with sigwait, so no handler runs
 * inside library code.
 */
#include <curl/curl.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/cli/cli.h"
#include "core/client/appservice/appservice.h"
#include "core/client/auth/auth.h"
#include "core/client/client.h"
#include "core/client/ratelimits.h"
#include "core/client/sync/notifier.h"
#include "core/config/config.h"
#include "core/federation/rooms/fed_rooms.h"
#include "core/federation/transport/federation.h"
#include "core/http/http.h"
#include "core/plugins/plugins.h"
#include "core/runtime/runtime.h"
#include "core/store/db.h"
#include "core/store/lease.h"
#include "core/store/notify.h"

#ifndef ATRIUM_VERSION
#define ATRIUM_VERSION "dev"
#endif
#ifndef ATRIUM_DEFAULT_PLUGIN_DIR
#define ATRIUM_DEFAULT_PLUGIN_DIR "/usr/lib/atrium/plugins"
#endif

#define CFG_ERR_LEN 1024
#define AUTH_POOL_THREADS 2  /* at most two Argon2id hashes (64 MiB each) at once */
#define AUTH_POOL_QUEUE 64

extern char **environ;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: atrium --config FILE          run the server\n"
            "       atrium --generate-config FILE --server-name NAME\n"
            "              [--database-conninfo CONNINFO] [--plugin-dir DIR]\n"
            "                                      write a complete, commented config\n"
            "       atrium register-user --config FILE --user NAME [--password PW] [--admin]\n"
            "              [--url URL]            create an account on the running server\n"
            "       atrium verify-media --config FILE [--json]\n"
            "                                      check every original against its SHA-256\n"
            "       atrium PLUGIN COMMAND --config FILE [ARGS...]\n"
            "                                      run a plugin's command, e.g. atrium media\n"
            "                                      migrate --config FILE --to s3|local\n"
            "       atrium --print-config-table [PLUGIN] [--plugin-dir DIR]\n"
            "                                      print the settings as a Markdown table\n"
            "       atrium --version\n"
            "Any setting can be overridden from the environment: ATRIUM__SERVER__HTTP__PORT=8448\n"
            "sets server.http.port (segments joined by \"__\").\n");
}

static int generate_config(const char *path, const char *server_name, const char *conninfo,
                           const char *plugin_dir)
{
    if (!server_name) {
        fprintf(stderr, "atrium: --generate-config needs --server-name\n");
        return 2;
    }
    struct stat st;
    if (stat(path, &st) == 0) {
        fprintf(stderr, "atrium: %s already exists; not overwriting it\n", path);
        return 1;
    }
    FILE *f = fopen(path, "wx");
    if (!f) {
        fprintf(stderr, "atrium: cannot create %s: %s\n", path, strerror(errno));
        return 1;
    }
    /* Each generated plugin's settings, from its descriptor (none of its code runs). */
    struct cfg_plugin_doc docs[8];
    size_t n = 0;
    for (size_t i = 0; CFG_GENERATED_PLUGINS[i] && n < sizeof(docs) / sizeof(docs[0]); i++)
        if (plugins_describe(plugin_dir ? plugin_dir : ATRIUM_DEFAULT_PLUGIN_DIR,
                             CFG_GENERATED_PLUGINS[i], NULL, &docs[n]) == 0)
            n++;
        else
            fprintf(stderr, "atrium: plugins.%s: its settings are left out (see above)\n",
                    CFG_GENERATED_PLUGINS[i]);
    int rc = cfg_generate(f, server_name, conninfo ? conninfo : "", plugin_dir, docs, n);
    for (size_t i = 0; i < n; i++) plugins_describe_release(&docs[i]);
    if (fclose(f) != 0 || rc < 0) {
        fprintf(stderr, "atrium: writing %s failed\n", path);
        unlink(path);
        return 1;
    }
    fprintf(stderr, "atrium: wrote %s\n", path);
    return 0;
}

/* `atrium --print-config-table [PLUGIN]`: the table README.md (or the plugin's README)
 * carries, generated from the same rows the loader reads. */
static int print_config_table(const char *plugin, const char *plugin_dir)
{
    if (!plugin) {
        cfg_print_core_table(stdout);
        return fflush(stdout) == 0 ? 0 : 1;
    }
    struct cfg_plugin_doc doc;
    if (plugins_describe(plugin_dir ? plugin_dir : ATRIUM_DEFAULT_PLUGIN_DIR, plugin, NULL,
                         &doc) < 0)
        return 1;
    cfg_settings_print_markdown(stdout, "", doc.rows, doc.n_rows);
    plugins_describe_release(&doc);
    return fflush(stdout) == 0 ? 0 : 1;
}

static void raise_nofile_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

static int serve(const char *config_path)
{
    char err[CFG_ERR_LEN];
    cfg_node *root = cfg_load_file(config_path, err, sizeof(err));
    if (!root) {
        fprintf(stderr, "atrium: %s\n", err);
        return 1;
    }
    if (cfg_apply_env(root, environ, err, sizeof(err)) < 0) {
        fprintf(stderr, "atrium: %s\n", err);
        cfg_free(root);
        return 1;
    }
    struct core_config cfg;
    if (core_config_load(root, &cfg, err, sizeof(err)) < 0) {
        fprintf(stderr, "atrium: %s\n", err);
        cfg_free(root);
        return 1;
    }
    /* The application services' registration files are configuration too: checked before
     * anything starts (core/client/appservice/as_registry.c). */
    if (as_registry_load(&cfg, err, sizeof(err)) < 0) {
        fprintf(stderr, "atrium: %s\n", err);
        as_registry_free();
        core_config_release(&cfg);
        cfg_free(root);
        return 1;
    }
    char instance[CORE_INSTANCE_NAME_MAX_BYTES + 1];
    rt_log_set_instance(core_instance_name(&cfg, instance, sizeof(instance)));
    rt_log_set_level(rt_log_level_parse(cfg.log_level));
    raise_nofile_limit();
    signal(SIGPIPE, SIG_IGN);
    curl_global_init(CURL_GLOBAL_DEFAULT);

    /* Block the stop signals in every thread created from here on. */
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGHUP); /* reload the federation certificate */
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);

    int exit_code = 1;
    rt_pool *auth_pool_obj = NULL;
    core_runtime rt = {.cfg = &cfg, .root = root};
    core_runtime_bind(&rt); /* before any module's init; unbound below, after every thread */
    rt.metrics = rt_metrics_new();
    char instance_label[RT_METRIC_LABELS_MAX_BYTES];
    if (rt.metrics && rt_metric_label(instance_label, sizeof(instance_label), "instance",
                                      instance) > 0)
        rt_metric_set(rt_metric_gauge(rt.metrics, "atrium_instance_info", instance_label,
                                      "This process's instance name (server.instance_name)"),
                      1);
    rt.http = rt.metrics ? http_server_new(&cfg, rt.metrics) : NULL;
    rt.notifier = notifier_new();
    if (!rt.notifier || !rt.http || http_builtin_routes(rt.http) < 0) goto out;
    rt_log(ATRIUM_LOG_INFO, "core", "Atrium %s starting for %s", ATRIUM_VERSION, cfg.server_name);

    rt.db = db_pool_new(cfg.database.conninfo, cfg.database.pool_size,
                        cfg.database.checkout_timeout_ms, rt.metrics);
    if (rt.db) {
        db_pool_tune(rt.db, cfg.database.unresponsive_ms, cfg.database.statement_timeout_ms);
        db_pool_prepare(rt.db, cfg.database.prepared_statements);
    }
    if (!rt.db || db_pool_connect(rt.db, cfg.database.connect_retry_s) < 0) goto out;
    if (db_core_migrate(rt.db) < 0) goto out;
    rt.leases = lease_service_new(rt.db, instance, rt.metrics);
    if (!rt.leases || lease_service_start(rt.leases) < 0) goto out;
    /* The notification service exists before any module's init (they subscribe there) and
     * listens once the plugins' inits are done (the subscriber set is fixed then). */
    if (!(rt.notify = notify_new(db_pool_conninfo(rt.db), cfg.database.unresponsive_ms,
                                       rt.metrics))) goto out;
    auth_pool_obj = rt_pool_new("core.auth", AUTH_POOL_THREADS, AUTH_POOL_QUEUE, rt.metrics);
    if (!auth_pool_obj || rt_pool_start(auth_pool_obj) < 0) goto stop_plugins;
    rt.auth_pool = auth_pool_obj;
    for (size_t i = 0; CLIENT_MODULES[i]; i++) {
        const client_module *m = CLIENT_MODULES[i];
        if (m->init(&rt) < 0 ||
            (m->n_migrations && db_migrate(rt.db, m->owner, m->migrations, m->n_migrations) < 0) ||
            (m->start && m->start(&rt) < 0))
            goto stop_plugins;
    }
    size_t n_fed_migrations = 0;
    const atrium_migration *fed_migrations = NULL;
    if (federation_init(&cfg, config_path, rt.http, rt.metrics) < 0 || fed_rooms_init() < 0 ||
        !(fed_migrations = federation_migrations(&n_fed_migrations)) ||
        db_migrate(rt.db, "federation", fed_migrations, n_fed_migrations) < 0 ||
        federation_start() < 0)
        goto stop_plugins;
    if (plugins_load_all(&rt) < 0 || notify_start(rt.notify) < 0 ||
        plugins_migrate_all(&rt) < 0 || plugins_start_all(&rt) < 0)
        goto stop_plugins;
    if (http_server_start(rt.http) < 0) goto stop_plugins;
    rt_log(ATRIUM_LOG_INFO, "core", "ready");

    int sig = 0;
    while (sigwait(&stop_signals, &sig) == 0 && sig == SIGHUP) federation_reload_tls();
    http_server_quiesce(rt.http); /* before the line: tests read it as "now refusing" */
    rt_log(ATRIUM_LOG_INFO, "core", "received %s; stopping (grace %d ms)", strsignal(sig),
           cfg.shutdown_grace_ms);
    http_server_expire_suspended(rt.http);
    http_server_drain(rt.http, cfg.shutdown_grace_ms);
    exit_code = 0;

stop_plugins:
    notify_stop(rt.notify); /* no subscriber callback runs past here */
    plugins_stop_all(&rt);
    federation_stop_inbound();
    for (size_t i = 0; CLIENT_MODULES[i]; i++)
        if (CLIENT_MODULES[i]->stop) CLIENT_MODULES[i]->stop(&rt);
    if (auth_pool_obj) {
        rt_pool_stop(auth_pool_obj);
        rt_pool_join(auth_pool_obj);
    }
    if (rt.http) http_server_drain(rt.http, 1000); /* answers from stopped pools go out */
    if (rt.http) http_server_stop(rt.http);
    federation_stop(); /* after the listeners: outbound callbacks may still resume requests */
    lease_service_stop(rt.leases); /* every job it guards stopped: others may take them */
    plugins_fini_all(&rt);
    federation_free();
    rt.auth_pool = NULL;
    if (auth_pool_obj) rt_pool_free(auth_pool_obj);
out:
    http_server_free(rt.http);
    notifier_free(rt.notifier);
    notify_free(rt.notify);
    auth_cache_free(rt.auth_cache);
    ratelimits_free(&rt);
    as_registry_free();
    core_runtime_bind(NULL);
    lease_service_free(rt.leases);
    db_pool_free(rt.db);
    rt_metrics_free(rt.metrics);
    core_config_release(&cfg);
    cfg_free(root);
    curl_global_cleanup();
    if (exit_code == 0) rt_log(ATRIUM_LOG_INFO, "core", "stopped");
    return exit_code;
}

int main(int argc, char **argv)
{
    const char *config = NULL, *gen = NULL, *server_name = NULL, *conninfo = NULL;
    const char *plugin_dir = NULL, *table_of = NULL;
    bool table = false;
    if (argc > 1 && strcmp(argv[1], "register-user") == 0)
        return cli_register_user(argc - 2, argv + 2);
    if (argc > 1 && strcmp(argv[1], "verify-media") == 0)
        return cli_verify_media(argc - 2, argv + 2);
    if (cli_is_plugin_command(argc, argv))
        return cli_plugin_command(argv[1], argv[2], argc - 3, argv + 3);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *next = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--version") == 0) {
            printf("atrium %s (plugin ABI %d.%d)\n", ATRIUM_VERSION, ATRIUM_ABI_MAJOR,
                   ATRIUM_ABI_MINOR);
            return 0;
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--print-config-table") == 0) {
            table = true;
            if (next && next[0] != '-') {
                table_of = next;
                i++;
            }
        } else if (strcmp(a, "--config") == 0 && next) {
            config = next;
            i++;
        } else if (strcmp(a, "--generate-config") == 0 && next) {
            gen = next;
            i++;
        } else if (strcmp(a, "--server-name") == 0 && next) {
            server_name = next;
            i++;
        } else if (strcmp(a, "--database-conninfo") == 0 && next) {
            conninfo = next;
            i++;
        } else if (strcmp(a, "--plugin-dir") == 0 && next) {
            plugin_dir = next;
            i++;
        } else {
            fprintf(stderr, "atrium: unknown or incomplete argument \"%s\"\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (table) return print_config_table(table_of, plugin_dir);
    if (gen) return generate_config(gen, server_name, conninfo, plugin_dir);
    if (!config) {
        usage(stderr);
        return 2;
    }
    return serve(config);
}
