/*
 * tests/unit/test_config.c - the configuration module as a specification: how YAML becomes
 * the tree, how errors name the key and the place, how the environment overrides the file,
 * and what the core's schema accepts, defaults and refuses.
 *
 * Pure unit tests: files are written to a temporary directory and removed again; nothing
 * here starts the runtime or reads the process environment (env overrides are given as
 * explicit envp arrays).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/config/config.h"

enum { ERR_BYTES = 512 };

#define MINIMAL "server_name: example.org\ndatabase:\n  conninfo: dbname=atrium\n"

/* Writes text to a fresh temporary file; its path goes to path (at least 64 bytes). */
static void write_temp(const char *text, char *path)
{
    strcpy(path, "/tmp/atrium_test_config_XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    size_t len = strlen(text);
    assert_int_equal(write(fd, text, len), (ssize_t)len);
    close(fd);
}

static cfg_node *load(const char *text)
{
    char err[ERR_BYTES] = "";
    cfg_node *root = cfg_load_string(text, "test.yaml", err, sizeof err);
    if (root == NULL)
        fail_msg("unexpected load error: %s", err);
    return root;
}

/* Loads text, expects core_config_load to fail, and returns its message in err. */
static void expect_core_error(const char *text, char *err)
{
    cfg_node *root = load(text);
    struct core_config c;
    assert_int_equal(core_config_load(root, &c, err, ERR_BYTES), -1);
    cfg_free(root);
}

#define assert_contains(haystack, needle)                                                   \
    do {                                                                                    \
        if (strstr((haystack), (needle)) == NULL)                                           \
            fail_msg("\"%s\" does not contain \"%s\"", (haystack), (needle));               \
    } while (0)

/* ---- reading YAML ---------------------------------------------------------------------- */

static void test_valid_file_loads_into_a_tree_with_line_numbers(void **state)
{
    (void)state;
    char path[64], err[ERR_BYTES] = "", buf[128];
    write_temp("# comment\nserver_name: example.org\nserver:\n  http:\n    port: 8448\n"
               "    trusted_proxies:\n      - 10.0.0.1\n      - 10.0.0.2\n",
               path);
    cfg_node *root = cfg_load_file(path, err, sizeof err);
    assert_non_null(root);

    cfg_node *name = cfg_get(root, "server_name");
    assert_non_null(name);
    assert_int_equal(name->kind, CFG_SCALAR);
    assert_string_equal(name->value, "example.org");
    assert_int_equal(name->line, 2);
    assert_string_equal(name->origin, path);

    cfg_node *port = cfg_get(root, "server.http.port");
    assert_int_equal(port->line, 5);
    assert_string_equal(cfg_path(port, buf, sizeof buf), "server.http.port");
    char expected[128];
    snprintf(expected, sizeof expected, "%s:5", path);
    assert_string_equal(cfg_where(port, buf, sizeof buf), expected);

    cfg_node *second = cfg_get(root, "server.http.trusted_proxies")->first_child->next;
    assert_string_equal(second->value, "10.0.0.2");
    assert_int_equal(second->line, 8);
    assert_string_equal(cfg_path(second, buf, sizeof buf), "server.http.trusted_proxies[1]");
    cfg_free(root);
    unlink(path);
}

static void test_syntax_error_names_the_file_and_line(void **state)
{
    (void)state;
    char path[64], err[ERR_BYTES] = "", expected[96];
    write_temp("server_name: example.org\nserver:\n  http: [1, 2\n  port: 3\n", path);
    assert_null(cfg_load_file(path, err, sizeof err));
    snprintf(expected, sizeof expected, "%s:4: YAML syntax error", path);
    assert_contains(err, expected);
    unlink(path);
}

static void test_missing_file_is_an_error_naming_the_path(void **state)
{
    (void)state;
    char err[ERR_BYTES] = "";
    assert_null(cfg_load_file("/nonexistent/atrium.yaml", err, sizeof err));
    assert_contains(err, "/nonexistent/atrium.yaml: cannot open");
}

static void test_empty_file_is_an_empty_map(void **state)
{
    (void)state;
    char path[64], err[ERR_BYTES] = "";
    write_temp("", path);
    cfg_node *root = cfg_load_file(path, err, sizeof err);
    assert_non_null(root);
    assert_int_equal(root->kind, CFG_MAP);
    assert_null(root->first_child);
    cfg_free(root);
    unlink(path);

    root = load("# only a comment\n");
    assert_int_equal(root->kind, CFG_MAP);
    assert_null(root->first_child);
    cfg_free(root);
}

static void test_top_level_that_is_not_a_map_is_rejected(void **state)
{
    (void)state;
    char err[ERR_BYTES] = "";
    assert_null(cfg_load_string("- a\n- b\n", "list.yaml", err, sizeof err));
    assert_contains(err, "list.yaml:1: the top level must be a map");
    assert_null(cfg_load_string("just text\n", "scalar.yaml", err, sizeof err));
    assert_contains(err, "scalar.yaml:1: the top level must be a map");
}

static void test_duplicate_key_in_one_map_is_rejected_with_both_lines(void **state)
{
    (void)state;
    char err[ERR_BYTES] = "";
    assert_null(cfg_load_string("server:\n  http:\n    port: 1\n    port: 2\n", "dup.yaml", err,
                                sizeof err));
    assert_string_equal(err, "dup.yaml:4: server.http.port: duplicate key (first set at line 3)");
}

static void test_same_key_in_different_maps_is_fine(void **state)
{
    (void)state;
    cfg_node *root = load("a:\n  enabled: true\nb:\n  enabled: false\n");
    assert_string_equal(cfg_get(root, "b.enabled")->value, "false");
    cfg_free(root);
}

static void test_anchors_and_aliases_are_refused(void **state)
{
    (void)state;
    char err[ERR_BYTES] = "";
    assert_null(cfg_load_string("a: &x 1\nb: 2\n", "t.yaml", err, sizeof err));
    assert_contains(err, "t.yaml:1: a: anchors (&x) are not supported");
    assert_null(cfg_load_string("b: *x\n", "t.yaml", err, sizeof err));
    assert_contains(err, "t.yaml:1: b: aliases (*x) are not supported");
}

static void test_second_yaml_document_is_refused(void **state)
{
    (void)state;
    char err[ERR_BYTES] = "";
    assert_null(cfg_load_string("a: 1\n---\nb: 2\n", "t.yaml", err, sizeof err));
    assert_contains(err, "t.yaml:2: a second YAML document");
}

static void test_null_and_quoted_empty_values_are_told_apart(void **state)
{
    (void)state;
    cfg_node *root = load("a:\nb: ~\nc: \"\"\n");
    assert_true(cfg_get(root, "a")->null_value);
    assert_string_equal(cfg_get(root, "a")->value, "");
    assert_true(cfg_get(root, "b")->null_value);
    assert_false(cfg_get(root, "c")->null_value);
    assert_string_equal(cfg_get(root, "c")->value, "");
    cfg_free(root);
}

/* ---- typed reads ---------------------------------------------------------------------- */

static void test_int_of_wrong_type_names_the_key_the_line_and_the_range(void **state)
{
    (void)state;
    char err[ERR_BYTES] = "";
    cfg_node *root = load("server:\n  http:\n    port: abc\n");
    int64_t v;
    assert_int_equal(cfg_read_int(root, "server.http.port", 8008, 0, 65535, &v, err, sizeof err),
                     -1);
    assert_contains(err, "test.yaml:3: server.http.port:");
    assert_contains(err, "\"abc\"");
    assert_contains(err, "0..65535");
    cfg_free(root);
}

static void test_int_out_of_range_names_the_allowed_range(void **state)
{
    (void)state;
    char err[ERR_BYTES] = "";
    cfg_node *root = load("server:\n  http:\n    request_threads: 1000\n");
    int64_t v;
    assert_int_equal(cfg_read_int(root, "server.http.request_threads", 4, 1, 256, &v, err,
                                  sizeof err), -1);
    assert_string_equal(err, "test.yaml:3: server.http.request_threads: 1000 is out of range "
                             "(allowed 1..256)");
    cfg_free(root);
}

static void test_int_accepts_only_decimal_and_rejects_overflow(void **state)
{
    (void)state;
    char err[ERR_BYTES] = "";
    int64_t v = 0;
    cfg_node *root = load("ok: -42\nhex: 0x10\nfloat: 1.5\nspaced: \"1 2\"\n"
                          "huge: 99999999999999999999\nlist: [1]\n");
    assert_int_equal(cfg_read_int(root, "ok", 0, -100, 100, &v, err, sizeof err), 0);
    assert_int_equal(v, -42);
    assert_int_equal(cfg_read_int(root, "hex", 0, INT64_MIN, INT64_MAX, &v, err, sizeof err), -1);
    assert_int_equal(cfg_read_int(root, "float", 0, INT64_MIN, INT64_MAX, &v, err, sizeof err),
                     -1);
    assert_int_equal(cfg_read_int(root, "spaced", 0, INT64_MIN, INT64_MAX, &v, err, sizeof err),
                     -1);
    assert_int_equal(cfg_read_int(root, "huge", 0, INT64_MIN, INT64_MAX, &v, err, sizeof err), -1);
    assert_contains(err, "test.yaml:5: huge: 99999999999999999999 is out of range");
    assert_int_equal(cfg_read_int(root, "list", 0, 0, 9, &v, err, sizeof err), -1);
    assert_contains(err, "test.yaml:6: list: expected an integer in 0..9, found a list");
    cfg_free(root);
}

static void test_absent_or_null_key_reads_as_its_default(void **state)
{
    (void)state;
    char err[ERR_BYTES] = "";
    cfg_node *root = load("empty:\n");
    int64_t i;
    bool b;
    const char *s;
    assert_int_equal(cfg_read_int(root, "missing.deep", 7, 0, 9, &i, err, sizeof err), 0);
    assert_int_equal(i, 7);
    assert_int_equal(cfg_read_int(root, "empty", 8, 0, 9, &i, err, sizeof err), 0);
    assert_int_equal(i, 8);
    assert_int_equal(cfg_read_bool(root, "missing", true, &b, err, sizeof err), 0);
    assert_true(b);
    assert_int_equal(cfg_read_string(root, "missing", "dflt", &s, err, sizeof err), 0);
    assert_string_equal(s, "dflt");
    cfg_free(root);
}

static void test_bool_accepts_true_false_yes_no_on_off_in_any_case(void **state)
{
    (void)state;
    char err[ERR_BYTES] = "";
    cfg_node *root = load("a: TRUE\nb: no\nc: On\nd: off\ne: Yes\nf: maybe\n");
    bool v;
    assert_int_equal(cfg_read_bool(root, "a", false, &v, err, sizeof err), 0);
    assert_true(v);
    assert_int_equal(cfg_read_bool(root, "b", true, &v, err, sizeof err), 0);
    assert_false(v);
    assert_int_equal(cfg_read_bool(root, "c", false, &v, err, sizeof err), 0);
    assert_true(v);
    assert_int_equal(cfg_read_bool(root, "d", true, &v, err, sizeof err), 0);
    assert_false(v);
    assert_int_equal(cfg_read_bool(root, "e", false, &v, err, sizeof err), 0);
    assert_true(v);
    assert_int_equal(cfg_read_bool(root, "f", false, &v, err, sizeof err), -1);
    assert_contains(err, "test.yaml:6: f: expected true or false");
    assert_contains(err, "\"maybe\"");
    cfg_free(root);
}

static void test_string_read_refuses_a_map(void **state)
{
    (void)state;
    char err[ERR_BYTES] = "";
    const char *s;
    cfg_node *root = load("name:\n  x: 1\n");
    assert_int_equal(cfg_read_string(root, "name", NULL, &s, err, sizeof err), -1);
    assert_contains(err, "test.yaml:1: name: expected a single value (a string), found a map");
    cfg_free(root);
}

static void test_string_list_takes_a_sequence_or_a_single_value(void **state)
{
    (void)state;
    char err[ERR_BYTES] = "";
    const char **items;
    size_t n;
    cfg_node *root = load("many: [a, b, c]\none: solo\nnone: []\nbad: [a, [b]]\n");
    assert_int_equal(cfg_read_string_list(root, "many", &items, &n, err, sizeof err), 0);
    assert_int_equal(n, 3);
    assert_string_equal(items[2], "c");
    free(items);
    assert_int_equal(cfg_read_string_list(root, "one", &items, &n, err, sizeof err), 0);
    assert_int_equal(n, 1);
    assert_string_equal(items[0], "solo");
    free(items);
    assert_int_equal(cfg_read_string_list(root, "none", &items, &n, err, sizeof err), 0);
    assert_int_equal(n, 0);
    free(items);
    assert_int_equal(cfg_read_string_list(root, "absent", &items, &n, err, sizeof err), 0);
    assert_int_equal(n, 0);
    assert_int_equal(cfg_read_string_list(root, "bad", &items, &n, err, sizeof err), -1);
    assert_contains(err, "test.yaml:4: bad[1]: expected a string, found a list");
    cfg_free(root);
}

/* ---- unknown keys ---------------------------------------------------------------------- */

static void test_unknown_key_names_the_key_its_line_and_the_nearest_allowed_key(void **state)
{
    (void)state;
    char err[ERR_BYTES] = "";
    cfg_node *root = load("media:\n  delivery_slots: 4\n  fetch_thraeds: 8\n");
    static const char *const allowed[] = {"delivery_slots", "fetch_threads", NULL};
    assert_int_equal(cfg_check_keys(cfg_get(root, "media"), allowed, err, sizeof err), -1);
    assert_string_equal(err, "test.yaml:3: media.fetch_thraeds: unknown key "
                             "(did you mean fetch_threads?)");
    cfg_free(root);
}

static void test_unknown_key_with_no_near_match_lists_the_allowed_keys(void **state)
{
    (void)state;
    char err[ERR_BYTES] = "";
    cfg_node *root = load("log:\n  colour: blue\n");
    static const char *const allowed[] = {"level", NULL};
    assert_int_equal(cfg_check_keys(cfg_get(root, "log"), allowed, err, sizeof err), -1);
    assert_string_equal(err, "test.yaml:2: log.colour: unknown key (allowed here: level)");
    cfg_free(root);
}

static void test_unknown_core_key_is_rejected_with_a_suggestion(void **state)
{
    (void)state;
    char err[ERR_BYTES];
    expect_core_error(MINIMAL "server:\n  http:\n    prot: 8448\n", err);
    assert_string_equal(err, "test.yaml:6: server.http.prot: unknown key (did you mean port?)");
    expect_core_error(MINIMAL "server:\n  shutdown_grace: 5\n", err);
    assert_contains(err, "test.yaml:5: server.shutdown_grace: unknown key "
                         "(did you mean shutdown_grace_ms?)");
    expect_core_error(MINIMAL "databse:\n  pool_size: 3\n", err);
    assert_contains(err, "test.yaml:4: databse: unknown key (did you mean database?)");
}

static void test_unknown_keys_under_a_plugin_are_left_to_the_plugin(void **state)
{
    (void)state;
    char err[ERR_BYTES] = "";
    cfg_node *root = load(MINIMAL "plugins:\n  media:\n    enabled: true\n"
                                  "    delivery_slots: 12\n    anything: [goes, here]\n"
                                  "  directory:\n");
    struct core_config c;
    assert_int_equal(core_config_load(root, &c, err, sizeof err), 0);
    assert_string_equal(cfg_get(root, "plugins.media.delivery_slots")->value, "12");
    core_config_release(&c);
    cfg_free(root);
}

static void test_plugin_settings_must_be_a_map_with_a_boolean_enabled(void **state)
{
    (void)state;
    char err[ERR_BYTES];
    expect_core_error(MINIMAL "plugins:\n  media: true\n", err);
    assert_contains(err, "test.yaml:5: plugins.media: expected the plugin's settings as a map");
    expect_core_error(MINIMAL "plugins:\n  media:\n    enabled: perhaps\n", err);
    assert_contains(err, "test.yaml:6: plugins.media.enabled: expected true or false");
    expect_core_error(MINIMAL "plugins: [media]\n", err);
    assert_contains(err, "test.yaml:4: plugins: expected a map");
    expect_core_error(MINIMAL "plugins:\n  ../evil:\n    enabled: true\n", err);
    assert_contains(err, "plugins.../evil: a plugin name may only hold");
}

/* ---- environment ------------------------------------------------------------------------ */

static void test_env_override_replaces_the_file_value(void **state)
{
    (void)state;
    char err[ERR_BYTES] = "", buf[64];
    cfg_node *root = load(MINIMAL "server:\n  http:\n    port: 8008\n    request_threads: 2\n");
    char *envp[] = {"PATH=/bin", "ATRIUM__SERVER__HTTP__PORT=8448", NULL};
    assert_int_equal(cfg_apply_env(root, envp, err, sizeof err), 0);
    cfg_node *port = cfg_get(root, "server.http.port");
    assert_string_equal(port->value, "8448");
    assert_int_equal(port->line, 0);
    assert_string_equal(cfg_where(port, buf, sizeof buf), "ATRIUM__SERVER__HTTP__PORT");
    /* the sibling from the file stays, with its line */
    assert_int_equal(cfg_get(root, "server.http.request_threads")->line, 7);
    cfg_free(root);
}

static void test_env_override_creates_missing_maps_and_keeps_single_underscores(void **state)
{
    (void)state;
    char err[ERR_BYTES] = "";
    cfg_node *root = load(MINIMAL "plugins:\n  media:\n");
    char *envp[] = {"ATRIUM__SERVER__HTTP__REQUEST_THREADS=8",
                    "ATRIUM__PLUGINS__MEDIA__ENABLED=true", NULL};
    assert_int_equal(cfg_apply_env(root, envp, err, sizeof err), 0);
    cfg_node *threads = cfg_get(root, "server.http.request_threads");
    assert_non_null(threads);
    assert_string_equal(threads->value, "8");
    assert_int_equal(cfg_get(root, "server")->kind, CFG_MAP);
    /* a null `media:` in the file becomes the map the variable needs */
    assert_string_equal(cfg_get(root, "plugins.media.enabled")->value, "true");

    struct core_config c;
    assert_int_equal(core_config_load(root, &c, err, sizeof err), 0);
    assert_int_equal(c.http.request_threads, 8);
    core_config_release(&c);
    cfg_free(root);
}

static void test_env_override_value_is_yaml_so_brackets_make_a_list(void **state)
{
    (void)state;
    char err[ERR_BYTES] = "";
    cfg_node *root = cfg_new_map();
    char *envp[] = {"ATRIUM__SERVER_NAME=example.org", "ATRIUM__DATABASE__CONNINFO=dbname=x",
                    "ATRIUM__SERVER__HTTP__TRUSTED_PROXIES=[10.0.0.1, \"::1\"]", NULL};
    assert_int_equal(cfg_apply_env(root, envp, err, sizeof err), 0);
    struct core_config c;
    assert_int_equal(core_config_load(root, &c, err, sizeof err), 0);
    assert_int_equal(c.http.n_trusted_proxies, 2);
    assert_string_equal(c.http.trusted_proxies[0], "10.0.0.1");
    assert_string_equal(c.http.trusted_proxies[1], "::1");
    assert_string_equal(c.database.conninfo, "dbname=x");
    core_config_release(&c);
    cfg_free(root);
}

static void test_env_override_of_an_unknown_key_names_the_variable(void **state)
{
    (void)state;
    char err[ERR_BYTES] = "";
    cfg_node *root = load(MINIMAL);
    char *envp[] = {"ATRIUM__SERVER__HTTP__PROT=8448", NULL};
    assert_int_equal(cfg_apply_env(root, envp, err, sizeof err), 0);
    struct core_config c;
    assert_int_equal(core_config_load(root, &c, err, sizeof err), -1);
    assert_string_equal(err, "ATRIUM__SERVER__HTTP__PROT: server.http.prot: unknown key "
                             "(did you mean port?)");
    cfg_free(root);
}

static void test_env_override_with_a_bad_value_names_the_variable_and_key(void **state)
{
    (void)state;
    char err[ERR_BYTES] = "";
    cfg_node *root = load(MINIMAL);
    char *dup[] = {"ATRIUM__SERVER__HTTP={port: 1, port: 2}", NULL};
    assert_int_equal(cfg_apply_env(root, dup, err, sizeof err), -1);
    assert_string_equal(err, "ATRIUM__SERVER__HTTP: server.http.port: duplicate key");
    char *range[] = {"ATRIUM__DATABASE__POOL_SIZE=0", NULL};
    assert_int_equal(cfg_apply_env(root, range, err, sizeof err), 0);
    struct core_config c;
    assert_int_equal(core_config_load(root, &c, err, sizeof err), -1);
    assert_string_equal(err, "ATRIUM__DATABASE__POOL_SIZE: database.pool_size: 0 is out of "
                             "range (allowed 1..512)");
    cfg_free(root);
}

static void test_env_override_cannot_reach_below_a_value_or_use_empty_segments(void **state)
{
    (void)state;
    char err[ERR_BYTES] = "";
    cfg_node *root = load(MINIMAL);
    char *below[] = {"ATRIUM__SERVER_NAME__X=1", NULL};
    assert_int_equal(cfg_apply_env(root, below, err, sizeof err), -1);
    assert_contains(err, "ATRIUM__SERVER_NAME__X: server_name.x: cannot set this key: "
                         "server_name (set at test.yaml:1)");
    assert_string_equal(cfg_get(root, "server_name")->value, "example.org"); /* unchanged */
    char *empty[] = {"ATRIUM__SERVER____PORT=1", NULL};
    assert_int_equal(cfg_apply_env(root, empty, err, sizeof err), -1);
    assert_contains(err, "ATRIUM__SERVER____PORT: empty key segment");
    cfg_free(root);
}

static void test_env_variables_without_the_double_underscore_prefix_are_ignored(void **state)
{
    (void)state;
    char err[ERR_BYTES] = "";
    cfg_node *root = cfg_new_map();
    char *envp[] = {"ATRIUM_SERVER_NAME=x", "HOME=/root", "atrium__server_name=y", NULL};
    assert_int_equal(cfg_apply_env(root, envp, err, sizeof err), 0);
    assert_null(root->first_child);
    cfg_free(root);
}

static void test_env_overrides_apply_in_name_order_whatever_the_environ_order(void **state)
{
    (void)state;
    char err[ERR_BYTES] = "";
    cfg_node *root = cfg_new_map();
    /* the map first, then a deeper key: the deeper key lands inside the map */
    char *envp[] = {"ATRIUM__LOG__LEVEL=debug", "ATRIUM__LOG={level: warn}", NULL};
    assert_int_equal(cfg_apply_env(root, envp, err, sizeof err), 0);
    assert_string_equal(cfg_get(root, "log.level")->value, "debug");
    cfg_free(root);
}

/* ---- the core's schema ------------------------------------------------------------------ */

static void test_defaults_apply_when_keys_are_absent(void **state)
{
    (void)state;
    char err[ERR_BYTES] = "";
    cfg_node *root = load(MINIMAL);
    struct core_config c;
    assert_int_equal(core_config_load(root, &c, err, sizeof err), 0);
    assert_string_equal(c.server_name, "example.org");
    assert_string_equal(c.public_baseurl, "");
    assert_non_null(c.plugin_dir);
    assert_true(c.plugin_dir[0] != '\0');
    assert_string_equal(c.log_level, "info");
    assert_string_equal(c.http.bind_address, "127.0.0.1");
    assert_int_equal(c.http.port, 8008);
    assert_int_equal(c.http.request_threads, 4);
    assert_int_equal(c.http.connection_timeout_s, 60);
    assert_int_equal(c.http.max_connections, 0);
    assert_int_equal(c.http.fd_reserve, 128);
    assert_int_equal(c.http.max_json_body_bytes, 1024 * 1024);
    assert_int_equal(c.http.handoff_deadline_ms, 60000);
    assert_int_equal(c.http.n_trusted_proxies, 0);
    assert_false(c.ops.enabled); /* no port opened unasked (ADR-0025) */
    assert_string_equal(c.ops.bind_address, "127.0.0.1");
    assert_int_equal(c.ops.port, 8009);
    assert_int_equal(c.ops.max_connections, 8);
    assert_true(c.metrics.enabled);
    assert_int_equal(c.metrics.n_allowed_addresses, 2);
    assert_string_equal(c.metrics.allowed_addresses[0], "127.0.0.1");
    assert_string_equal(c.metrics.allowed_addresses[1], "::1");
    assert_int_equal(c.shutdown_grace_ms, 10000);
    assert_string_equal(c.database.conninfo, "dbname=atrium");
    assert_int_equal(c.database.pool_size, 8);
    assert_int_equal(c.database.checkout_timeout_ms, 2000);
    assert_int_equal(c.database.connect_retry_s, 30);
    assert_true(c.ratelimit.enabled);
    core_config_release(&c);
    cfg_free(root);
}

static void test_given_values_replace_the_defaults(void **state)
{
    (void)state;
    char err[ERR_BYTES] = "";
    cfg_node *root = load(MINIMAL "plugin_dir: /opt/p\nlog:\n  level: DEBUG\n"
                                  "server:\n  metrics:\n    enabled: off\n"
                                  "    allowed_addresses: []\n  shutdown_grace_ms: 0\n"
                                  "ratelimit:\n  enabled: no\n");
    struct core_config c;
    assert_int_equal(core_config_load(root, &c, err, sizeof err), 0);
    assert_string_equal(c.plugin_dir, "/opt/p");
    assert_string_equal(c.log_level, "debug");
    assert_false(c.metrics.enabled);
    assert_int_equal(c.metrics.n_allowed_addresses, 0);
    assert_int_equal(c.shutdown_grace_ms, 0);
    assert_false(c.ratelimit.enabled);
    core_config_release(&c);
    cfg_free(root);
}

static void test_wrong_type_in_a_core_key_names_the_key_and_line(void **state)
{
    (void)state;
    char err[ERR_BYTES];
    expect_core_error(MINIMAL "server:\n  http:\n    port: abc\n", err);
    assert_contains(err, "server.http.port");
    assert_contains(err, "test.yaml:6");
    assert_contains(err, "0..65535");
    expect_core_error(MINIMAL "server: 8008\n", err);
    assert_contains(err, "test.yaml:4: server: expected a map of keys, found a single value");
}

static void test_missing_server_name_is_an_error(void **state)
{
    (void)state;
    char err[ERR_BYTES];
    expect_core_error("database:\n  conninfo: dbname=atrium\n", err);
    assert_contains(err, "test.yaml: server_name: required key is missing");
    assert_contains(err, "ATRIUM__SERVER_NAME");
    expect_core_error("server_name:\ndatabase:\n  conninfo: dbname=atrium\n", err);
    assert_contains(err, "server_name: required key is missing");
    expect_core_error("server_name: https://example.org\ndatabase:\n  conninfo: x\n", err);
    assert_contains(err, "test.yaml:1: server_name: \"https://example.org\" is not a server name");
}

static void test_server_names_follow_the_one_grammar_and_well_known_values_are_checked(void **state)
{
    (void)state;
    char err[ERR_BYTES];
    expect_core_error("server_name: a..b\ndatabase:\n  conninfo: x\n", err);
    assert_contains(err, "server_name: \"a..b\" is not a server name");
    expect_core_error("server_name: example.org\nwell_known:\n  server: ../x\n"
                      "database:\n  conninfo: x\n", err);
    assert_contains(err, "well_known.server: \"../x\" is not a server name");
    expect_core_error("server_name: example.org\nwell_known:\n  support_admin_matrix_id: "
                      "admin\ndatabase:\n  conninfo: x\n", err);
    assert_contains(err, "well_known.support_admin_matrix_id: \"admin\" is not a user ID");
    expect_core_error("server_name: example.org\nwell_known:\n  support_admin_email: nobody\n"
                      "database:\n  conninfo: x\n", err);
    assert_contains(err, "well_known.support_admin_email: \"nobody\" is not an e-mail");
    expect_core_error("server_name: example.org\nwell_known:\n  support_page: ftp://x\n"
                      "database:\n  conninfo: x\n", err);
    assert_contains(err, "well_known.support_page");
    cfg_node *root = load("server_name: example.org\nwell_known:\n  server: m.example.org:443\n"
                          "  support_admin_email: admin@example.org\n"
                          "database:\n  conninfo: x\n");
    struct core_config c;
    assert_int_equal(core_config_load(root, &c, err, sizeof err), 0);
    assert_string_equal(c.well_known.server, "m.example.org:443");
    assert_string_equal(c.well_known.admin_email, "admin@example.org");
    assert_string_equal(c.well_known.support_page, "");
    core_config_release(&c);
    cfg_free(root);
}

static void test_missing_database_conninfo_is_an_error_at_its_map(void **state)
{
    (void)state;
    char err[ERR_BYTES];
    expect_core_error("server_name: example.org\ndatabase:\n  pool_size: 2\n", err);
    assert_contains(err, "test.yaml:2: database.conninfo: required key is missing");
    assert_contains(err, "ATRIUM__DATABASE__CONNINFO");
}

static void test_log_level_outside_the_allowed_set_is_rejected(void **state)
{
    (void)state;
    char err[ERR_BYTES];
    expect_core_error(MINIMAL "log:\n  level: verbose\n", err);
    assert_string_equal(err, "test.yaml:5: log.level: \"verbose\" is not a log level "
                             "(allowed: error, warn, info, debug)");
}

/* ---- settings tables ---------------------------------------------------------------------- */

/* A plugin-like table: what a descriptor's rows become. */
struct sample {
    int slots;
    int64_t wait_ms;
    bool legacy;
    const char *path;
    int threads; /* computed default, kept when absent */
};

static const struct cfg_setting SAMPLE[] = {
    {.path = "slots", .type = CFG_T_INT, .offset = offsetof(struct sample, slots), .def = 64,
     .min = 1, .max = 100, .unit = "requests", .help = "Slots at once."},
    {.path = "wait.max_ms", .type = CFG_T_INT64, .offset = offsetof(struct sample, wait_ms),
     .def = 30000, .min = 1, .max = 600000, .unit = "ms", .help = "Longest wait."},
    {.path = "legacy", .type = CFG_T_BOOL, .offset = offsetof(struct sample, legacy),
     .def = 0, .min = 0, .max = 1, .help = "Serve | legacy paths."},
    {.path = "path", .type = CFG_T_STRING, .offset = offsetof(struct sample, path),
     .def_string = "./store", .help = "Where."},
    {.path = "threads", .type = CFG_T_INT, .flags = CFG_F_KEEP,
     .offset = offsetof(struct sample, threads), .def = 1, .min = 1, .max = 256,
     .default_doc = "CPU cores", .help = "Threads."},
};
#define N_SAMPLE (sizeof SAMPLE / sizeof *SAMPLE)

static void test_a_table_reads_every_row_into_its_field_with_defaults(void **state)
{
    (void)state;
    char err[ERR_BYTES] = "";
    cfg_node *root = load("slots: 7\nwait:\n  max_ms: 5\n");
    struct sample s = {.threads = 12}; /* the computed default */
    assert_int_equal(cfg_settings_check_keys(root, SAMPLE, N_SAMPLE, NULL, err, sizeof err), 0);
    assert_int_equal(cfg_settings_read(root, SAMPLE, N_SAMPLE, &s, err, sizeof err), 0);
    assert_int_equal(s.slots, 7);
    assert_int_equal(s.wait_ms, 5);
    assert_false(s.legacy);
    assert_string_equal(s.path, "./store");
    assert_int_equal(s.threads, 12); /* absent: left as the caller computed it */
    cfg_free(root);
    root = load("threads: 3\nslots: 101\n");
    assert_int_equal(cfg_settings_read(root, SAMPLE, N_SAMPLE, &s, err, sizeof err), -1);
    assert_contains(err, "test.yaml:2: slots: 101 is out of range (allowed 1..100)");
    cfg_free(root);
}

static void test_a_table_refuses_keys_it_does_not_declare_at_every_level(void **state)
{
    (void)state;
    char err[ERR_BYTES] = "";
    static const char *const extra[] = {"enabled", NULL};
    cfg_node *root = load("enabled: true\nslot: 3\n");
    assert_int_equal(cfg_settings_check_keys(root, SAMPLE, N_SAMPLE, extra, err, sizeof err), -1);
    assert_contains(err, "test.yaml:2: slot: unknown key (did you mean slots?)");
    cfg_free(root);
    root = load("wait:\n  max: 3\n");
    assert_int_equal(cfg_settings_check_keys(root, SAMPLE, N_SAMPLE, extra, err, sizeof err), -1);
    assert_contains(err, "wait.max: unknown key (did you mean max_ms?)");
    cfg_free(root);
    root = load("wait: 5\n");
    assert_int_equal(cfg_settings_check_keys(root, SAMPLE, N_SAMPLE, extra, err, sizeof err), -1);
    assert_contains(err, "wait: expected a map of keys, found a single value");
    cfg_free(root);
}

static void test_a_table_is_printed_as_markdown_one_row_per_key(void **state)
{
    (void)state;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cfg_settings_print_markdown(f, "plugins.x.", SAMPLE, N_SAMPLE);
    fclose(f);
    assert_contains(text, "| key | default | allowed | meaning |\n| --- | --- | --- | --- |\n");
    assert_contains(text, "| `plugins.x.slots` | `64` | 1..100 requests | Slots at once. |\n");
    assert_contains(text, "| `plugins.x.wait.max_ms` | `30000` | 1..600000 ms | Longest wait. |");
    assert_contains(text, "| `plugins.x.legacy` | `false` | true or false | Serve \\| legacy");
    assert_contains(text, "| `plugins.x.threads` | CPU cores | 1..256 |");
    free(text);
}

/* ---- --generate-config ------------------------------------------------------------------- */

/* The one quoter of --generate-config: escapes exactly what a double-quoted YAML scalar
 * needs, and what it writes loads back as the original text. */
static void test_a_yaml_quoted_value_reads_back_unchanged(void **state)
{
    (void)state;
    const char *raw = "a \"b\" c\\d # e: f\tg\x7f";
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    fputs("k: ", f);
    cfg_yaml_quote(f, raw);
    fputc('\n', f);
    assert_int_equal(fclose(f), 0);
    assert_string_equal(text, "k: \"a \\\"b\\\" c\\\\d # e: f\\x09g\\x7f\"\n");
    cfg_node *root = load(text);
    assert_string_equal(cfg_get(root, "k")->value, raw);
    cfg_free(root);
    free(text);
}

/* quotes and spaces, so the generator must quote it for it to read back unchanged */
#define GENERATED_CONNINFO "host=/run/postgresql dbname=\"at rium\" # not a comment"

static void generate_to_file(const char *plugin_dir, char *path)
{
    strcpy(path, "/tmp/atrium_test_generated_XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    assert_non_null(f);
    assert_int_equal(cfg_generate(f, "matrix.example.org", GENERATED_CONNINFO, plugin_dir, NULL, 0), 0);
    fclose(f);
}

static void test_generated_config_loads_back_with_every_default(void **state)
{
    (void)state;
    char path[64], err[ERR_BYTES] = "";
    generate_to_file("/srv/atrium/plugins", path);
    cfg_node *root = cfg_load_file(path, err, sizeof err);
    if (root == NULL)
        fail_msg("generated config does not load: %s", err);
    struct core_config c;
    if (core_config_load(root, &c, err, sizeof err) != 0)
        fail_msg("generated config does not validate: %s", err);
    assert_string_equal(c.server_name, "matrix.example.org");
    assert_string_equal(c.database.conninfo, GENERATED_CONNINFO);
    assert_string_equal(c.plugin_dir, "/srv/atrium/plugins");
    assert_int_equal(c.http.port, 8008);
    assert_int_equal(c.http.max_json_body_bytes, 1024 * 1024);
    assert_int_equal(c.metrics.n_allowed_addresses, 2);
    assert_string_equal(c.metrics.allowed_addresses[1], "::1");
    assert_string_equal(cfg_get(root, "plugins.media.enabled")->value, "true");
    assert_string_equal(cfg_get(root, "plugins.directory.enabled")->value, "true");
    /* every key the schema reads is written out, not left to defaults */
    static const char *const keys[] = {
        "public_baseurl", "log.level", "server.http.bind_address", "server.http.port",
        "server.http.request_threads", "server.http.connection_timeout_s",
        "server.http.max_connections", "server.http.fd_reserve",
        "server.http.max_json_body_bytes", "server.http.handoff_deadline_ms",
        "server.http.trusted_proxies", "server.metrics.enabled",
        "server.metrics.allowed_addresses", "server.shutdown_grace_ms", "database.pool_size",
        "database.checkout_timeout_ms", "database.connect_retry_s", "ratelimit.enabled", NULL};
    for (size_t i = 0; keys[i] != NULL; i++)
        if (cfg_get(root, keys[i]) == NULL)
            fail_msg("generated config lacks %s", keys[i]);
    core_config_release(&c);
    cfg_free(root);
    unlink(path);
}

static void test_generated_config_writes_a_plugins_declared_settings_that_read_back(void **state)
{
    (void)state;
    char path[64], err[ERR_BYTES] = "";
    strcpy(path, "/tmp/atrium_test_generated_XXXXXX");
    FILE *f = fdopen(mkstemp(path), "w");
    assert_non_null(f);
    const struct cfg_plugin_doc docs[] = {{"media", SAMPLE, N_SAMPLE}};
    assert_int_equal(cfg_generate(f, "example.org", "dbname=x", NULL, docs, 1), 0);
    fclose(f);
    cfg_node *root = cfg_load_file(path, err, sizeof err);
    if (root == NULL)
        fail_msg("generated config does not load: %s", err);
    const cfg_node *media = cfg_get(root, "plugins.media");
    assert_string_equal(cfg_get(media, "slots")->value, "64");
    assert_string_equal(cfg_get(media, "wait.max_ms")->value, "30000");
    assert_null(cfg_get(media, "threads")); /* its default is computed: written commented */
    struct sample s = {.threads = 5};
    assert_int_equal(cfg_settings_read(media, SAMPLE, N_SAMPLE, &s, err, sizeof err), 0);
    assert_int_equal(s.slots, 64);
    assert_string_equal(s.path, "./store");
    assert_int_equal(s.threads, 5);
    /* a plugin that could not be described points at its README instead */
    assert_non_null(cfg_get(root, "plugins.directory.enabled"));
    cfg_free(root);
    unlink(path);
}

static void test_generated_config_without_plugin_dir_uses_the_default(void **state)
{
    (void)state;
    char path[64], err[ERR_BYTES] = "";
    generate_to_file(NULL, path);
    cfg_node *root = cfg_load_file(path, err, sizeof err);
    assert_non_null(root);
    assert_null(cfg_get(root, "plugin_dir"));
    struct core_config c;
    assert_int_equal(core_config_load(root, &c, err, sizeof err), 0);
    assert_true(c.plugin_dir[0] == '/');
    core_config_release(&c);
    cfg_free(root);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_file_loads_into_a_tree_with_line_numbers),
        cmocka_unit_test(test_syntax_error_names_the_file_and_line),
        cmocka_unit_test(test_missing_file_is_an_error_naming_the_path),
        cmocka_unit_test(test_empty_file_is_an_empty_map),
        cmocka_unit_test(test_top_level_that_is_not_a_map_is_rejected),
        cmocka_unit_test(test_duplicate_key_in_one_map_is_rejected_with_both_lines),
        cmocka_unit_test(test_same_key_in_different_maps_is_fine),
        cmocka_unit_test(test_anchors_and_aliases_are_refused),
        cmocka_unit_test(test_second_yaml_document_is_refused),
        cmocka_unit_test(test_null_and_quoted_empty_values_are_told_apart),
        cmocka_unit_test(test_int_of_wrong_type_names_the_key_the_line_and_the_range),
        cmocka_unit_test(test_int_out_of_range_names_the_allowed_range),
        cmocka_unit_test(test_int_accepts_only_decimal_and_rejects_overflow),
        cmocka_unit_test(test_absent_or_null_key_reads_as_its_default),
        cmocka_unit_test(test_bool_accepts_true_false_yes_no_on_off_in_any_case),
        cmocka_unit_test(test_string_read_refuses_a_map),
        cmocka_unit_test(test_string_list_takes_a_sequence_or_a_single_value),
        cmocka_unit_test(test_unknown_key_names_the_key_its_line_and_the_nearest_allowed_key),
        cmocka_unit_test(test_unknown_key_with_no_near_match_lists_the_allowed_keys),
        cmocka_unit_test(test_unknown_core_key_is_rejected_with_a_suggestion),
        cmocka_unit_test(test_unknown_keys_under_a_plugin_are_left_to_the_plugin),
        cmocka_unit_test(test_plugin_settings_must_be_a_map_with_a_boolean_enabled),
        cmocka_unit_test(test_env_override_replaces_the_file_value),
        cmocka_unit_test(test_env_override_creates_missing_maps_and_keeps_single_underscores),
        cmocka_unit_test(test_env_override_value_is_yaml_so_brackets_make_a_list),
        cmocka_unit_test(test_env_override_of_an_unknown_key_names_the_variable),
        cmocka_unit_test(test_env_override_with_a_bad_value_names_the_variable_and_key),
        cmocka_unit_test(test_env_override_cannot_reach_below_a_value_or_use_empty_segments),
        cmocka_unit_test(test_env_variables_without_the_double_underscore_prefix_are_ignored),
        cmocka_unit_test(test_env_overrides_apply_in_name_order_whatever_the_environ_order),
        cmocka_unit_test(test_defaults_apply_when_keys_are_absent),
        cmocka_unit_test(test_given_values_replace_the_defaults),
        cmocka_unit_test(test_wrong_type_in_a_core_key_names_the_key_and_line),
        cmocka_unit_test(test_missing_server_name_is_an_error),
        cmocka_unit_test(test_server_names_follow_the_one_grammar_and_well_known_values_are_checked),
        cmocka_unit_test(test_missing_database_conninfo_is_an_error_at_its_map),
        cmocka_unit_test(test_log_level_outside_the_allowed_set_is_rejected),
        cmocka_unit_test(test_a_table_reads_every_row_into_its_field_with_defaults),
        cmocka_unit_test(test_a_table_refuses_keys_it_does_not_declare_at_every_level),
        cmocka_unit_test(test_a_table_is_printed_as_markdown_one_row_per_key),
        cmocka_unit_test(test_a_yaml_quoted_value_reads_back_unchanged),
        cmocka_unit_test(test_generated_config_loads_back_with_every_default),
        cmocka_unit_test(test_generated_config_writes_a_plugins_declared_settings_that_read_back),
        cmocka_unit_test(test_generated_config_without_plugin_dir_uses_the_default),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
