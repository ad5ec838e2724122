/*
 * tests/unit/test_fed_rooms_acl.c - the m.room.server_acl rule (fed_rooms_acl_content_allows):
 * ports ignored, IP literals by allow_ip_literals, deny before allow, '*' and '?' globs,
 * nothing allowed that no allow glob names, and glob characters the spec does not know
 * matched literally.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "core/federation/rooms/fed_rooms.h"

static bool allows(const char *acl_text, const char *server)
{
    json_t *acl = json_loads(acl_text, 0, NULL);
    if (!acl) fail_msg("bad test JSON: %s", acl_text);
    bool ok = fed_rooms_acl_content_allows(acl, server);
    json_decref(acl);
    return ok;
}

static void test_deny_wins_over_allow_and_ports_are_ignored(void **state)
{
    (void)state;
    const char *acl = "{\"allow\":[\"*\"],\"deny\":[\"evil.org\",\"*.evil.org\"]}";
    assert_true(allows(acl, "good.org"));
    assert_true(allows(acl, "good.org:8448"));
    assert_false(allows(acl, "evil.org"));
    assert_false(allows(acl, "evil.org:443"));
    assert_false(allows(acl, "a.b.evil.org"));
    assert_true(allows(acl, "notevil.org"));
}

static void test_only_what_an_allow_glob_names_is_allowed(void **state)
{
    (void)state;
    const char *acl = "{\"allow\":[\"*.example.org\",\"h?.net\"]}";
    assert_true(allows(acl, "matrix.example.org"));
    assert_false(allows(acl, "example.org"));
    assert_true(allows(acl, "h1.net"));
    assert_false(allows(acl, "h12.net"));
    assert_false(allows("{}", "anything.org"));            /* no allow: nothing */
    assert_false(allows("{\"allow\":[\"[a]\"]}", "a"));     /* no bracket classes */
    assert_true(allows("{\"allow\":[\"[a]\"]}", "[a]"));
}

static void test_ip_literals_follow_allow_ip_literals(void **state)
{
    (void)state;
    assert_true(allows("{\"allow\":[\"*\"]}", "127.0.0.1:8448"));
    assert_false(allows("{\"allow\":[\"*\"],\"allow_ip_literals\":false}", "127.0.0.1:8448"));
    assert_false(allows("{\"allow\":[\"*\"],\"allow_ip_literals\":false}", "[::1]:8448"));
    assert_true(allows("{\"allow\":[\"*\"],\"allow_ip_literals\":false}", "1.example.org"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deny_wins_over_allow_and_ports_are_ignored),
        cmocka_unit_test(test_only_what_an_allow_glob_names_is_allowed),
        cmocka_unit_test(test_ip_literals_follow_allow_ip_literals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
