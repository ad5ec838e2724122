/*
 * tests/unit/test_accounts_config.c - the account settings of the configuration
 * (registration.*, ratelimit.<action>.*) and the localpart grammar, as specifications:
 * their defaults, what is refused, what --generate-config writes, and which user IDs the
 * server hands out.
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

#include "core/client/accounts/accounts.h"
#include "core/config/config.h"

enum { ERR_BYTES = 512 };

#define MINIMAL "server_name: example.org\ndatabase:\n  conninfo: dbname=atrium\n"

static int load(const char *text, struct core_config *c, char *err, cfg_node **root)
{
    *root = cfg_load_string(text, "test.yaml", err, ERR_BYTES);
    assert_non_null(*root);
    return core_config_load(*root, c, err, ERR_BYTES);
}

static void test_registration_is_closed_and_admin_registration_off_by_default(void **state)
{
    (void)state;
    char err[ERR_BYTES] = "";
    cfg_node *root;
    struct core_config c;
    assert_int_equal(load(MINIMAL, &c, err, &root), 0);
    assert_false(c.registration.enabled);
    assert_string_equal(c.registration.shared_secret, "");
    assert_true(c.ratelimit.enabled);
    assert_int_equal(c.ratelimit.registration.per_minute, 30);
    assert_int_equal(c.ratelimit.registration.burst, 10);
    assert_int_equal(c.ratelimit.login.per_minute, 30);
    assert_int_equal(c.ratelimit.message.burst, 30);
    core_config_release(&c);
    cfg_free(root);
}

static void test_account_keys_are_read(void **state)
{
    (void)state;
    char err[ERR_BYTES] = "";
    cfg_node *root;
    struct core_config c;
    assert_int_equal(load(MINIMAL "registration:\n  enabled: true\n  shared_secret: abc\n"
                                  "ratelimit:\n  login:\n    per_minute: 5\n    burst: 2\n"
                                  "  message:\n    per_minute: 600\n",
                          &c, err, &root), 0);
    assert_true(c.registration.enabled);
    assert_string_equal(c.registration.shared_secret, "abc");
    assert_int_equal(c.ratelimit.login.per_minute, 5);
    assert_int_equal(c.ratelimit.login.burst, 2);
    assert_int_equal(c.ratelimit.message.per_minute, 600);
    assert_int_equal(c.ratelimit.registration.per_minute, 30); /* untouched: default */
    core_config_release(&c);
    cfg_free(root);
}

static void test_bad_account_keys_are_refused_naming_the_key(void **state)
{
    (void)state;
    static const struct {
        const char *text, *needle;
    } cases[] = {
        {MINIMAL "registration:\n  enabled: maybe\n", "registration.enabled"},
        {MINIMAL "registration:\n  shared_secret: [a, b]\n", "registration.shared_secret"},
        {MINIMAL "registration:\n  enable: true\n", "did you mean enabled"},
        {MINIMAL "ratelimit:\n  login:\n    per_minute: 0\n", "ratelimit.login.per_minute"},
        {MINIMAL "ratelimit:\n  register:\n    burst: -1\n", "ratelimit.register.burst"},
        {MINIMAL "ratelimit:\n  message:\n    per_second: 3\n", "per_second"},
        {MINIMAL "ratelimit:\n  teleport:\n    burst: 3\n", "teleport"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char err[ERR_BYTES] = "";
        cfg_node *root;
        struct core_config c;
        assert_int_equal(load(cases[i].text, &c, err, &root), -1);
        if (!strstr(err, cases[i].needle)) fail_msg("\"%s\" does not name \"%s\"", err, cases[i].needle);
        cfg_free(root);
    }
}

static void test_generated_config_opens_registration_with_a_random_secret(void **state)
{
    (void)state;
    char path[64] = "/tmp/atrium_test_acc_gen_XXXXXX", err[ERR_BYTES] = "";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    assert_int_equal(cfg_generate(f, "example.org", "dbname=x", NULL, NULL, 0), 0);
    fclose(f);
    cfg_node *root = cfg_load_file(path, err, sizeof(err));
    assert_non_null(root);
    struct core_config c;
    assert_int_equal(core_config_load(root, &c, err, sizeof(err)), 0);
    assert_true(c.registration.enabled);
    assert_int_equal(strlen(c.registration.shared_secret), 64);
    static const char *const keys[] = {"ratelimit.register.per_minute", "ratelimit.register.burst",
                                       "ratelimit.login.per_minute", "ratelimit.login.burst",
                                       "ratelimit.message.per_minute", "ratelimit.message.burst",
                                       NULL};
    for (size_t i = 0; keys[i]; i++)
        if (!cfg_get(root, keys[i])) fail_msg("generated config lacks %s", keys[i]);
    char first[65];
    strcpy(first, c.registration.shared_secret);
    core_config_release(&c);
    cfg_free(root);
    unlink(path);
    /* A second file gets another secret. */
    fd = mkstemp(strcpy(path, "/tmp/atrium_test_acc_gen_XXXXXX"));
    f = fdopen(fd, "w");
    assert_int_equal(cfg_generate(f, "example.org", "dbname=x", NULL, NULL, 0), 0);
    fclose(f);
    root = cfg_load_file(path, err, sizeof(err));
    assert_int_equal(core_config_load(root, &c, err, sizeof(err)), 0);
    assert_string_not_equal(first, c.registration.shared_secret);
    core_config_release(&c);
    cfg_free(root);
    unlink(path);
}

static void test_localparts_follow_the_spec_grammar_and_length(void **state)
{
    (void)state;
    struct core_config c = {.server_name = "example.org"};
    assert_true(acc_localpart_ok(&c, "alice"));
    assert_true(acc_localpart_ok(&c, "a.b_c=d-e/f+g09"));
    assert_false(acc_localpart_ok(&c, ""));
    assert_false(acc_localpart_ok(&c, "Alice"));
    assert_false(acc_localpart_ok(&c, "al ice"));
    assert_false(acc_localpart_ok(&c, "al:ice"));
    assert_false(acc_localpart_ok(&c, "al@ice"));
    assert_false(acc_localpart_ok(&c, "\xc3\xbc"));
    /* "@" + localpart + ":example.org" may be 255 bytes, not 256 */
    char lp[300];
    size_t fits = 255 - strlen("@:example.org");
    memset(lp, 'a', fits);
    lp[fits] = '\0';
    assert_true(acc_localpart_ok(&c, lp));
    lp[fits] = 'a';
    lp[fits + 1] = '\0';
    assert_false(acc_localpart_ok(&c, lp));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registration_is_closed_and_admin_registration_off_by_default),
        cmocka_unit_test(test_account_keys_are_read),
        cmocka_unit_test(test_bad_account_keys_are_refused_naming_the_key),
        cmocka_unit_test(test_generated_config_opens_registration_with_a_random_secret),
        cmocka_unit_test(test_localparts_follow_the_spec_grammar_and_length),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
