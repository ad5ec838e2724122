/*
 * tests/unit/test_router.c - the router: templates, parameters, percent-decoding after
 * splitting, literal segments winning over parameters, 405 detection, duplicates.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "core/http/http.h"

static int dummy(atrium_req *r)
{
    (void)r;
    return 0;
}

static int other(atrium_req *r)
{
    (void)r;
    return 1;
}

typedef struct match {
    const route_entry *e;
    const char **names, **values;
    size_t n;
    bool wrong_method;
    const char *invalid;
} match;

static match do_match(router *rt, rt_arena *a, const char *method, const char *path)
{
    match m = {0};
    m.e = router_match(rt, method, path, a, &m.names, &m.values, &m.n, &m.wrong_method, &m.invalid);
    return m;
}

static void add(router *rt, const char *method, const char *path, atrium_handler h)
{
    char err[256];
    atrium_route r = {.method = method, .path = path, .handler = h};
    assert_int_equal(router_add(rt, &r, "test", err, sizeof(err)), 0);
}

static void test_parameters_are_decoded_after_the_path_is_split(void **state)
{
    (void)state;
    router *rt = router_new();
    rt_arena *a = rt_arena_new(1024);
    add(rt, "GET", "/_matrix/client/v3/rooms/{room}/state/{type}", dummy);
    match m = do_match(rt, a, "GET", "/_matrix/client/v3/rooms/%21abc%3Aex.org/state/m.a%2Fb");
    assert_non_null(m.e);
    assert_int_equal(m.n, 2);
    assert_string_equal(m.names[0], "room");
    assert_string_equal(m.values[0], "!abc:ex.org");
    assert_string_equal(m.names[1], "type");
    assert_string_equal(m.values[1], "m.a/b"); /* an encoded slash stays in its segment */
    rt_arena_free(a);
    router_free(rt);
}

static void test_literal_segments_win_over_parameters(void **state)
{
    (void)state;
    router *rt = router_new();
    rt_arena *a = rt_arena_new(1024);
    add(rt, "GET", "/rooms/{room}/{what}", dummy);
    add(rt, "GET", "/rooms/{room}/members", other);
    match m = do_match(rt, a, "GET", "/rooms/r1/members");
    assert_non_null(m.e);
    assert_ptr_equal(m.e->route.handler, other);
    m = do_match(rt, a, "GET", "/rooms/r1/state");
    assert_ptr_equal(m.e->route.handler, dummy);
    rt_arena_free(a);
    router_free(rt);
}

static void test_a_path_known_for_another_method_reports_wrong_method(void **state)
{
    (void)state;
    router *rt = router_new();
    rt_arena *a = rt_arena_new(1024);
    add(rt, "POST", "/login", dummy);
    match m = do_match(rt, a, "GET", "/login");
    assert_null(m.e);
    assert_true(m.wrong_method);
    m = do_match(rt, a, "GET", "/logout");
    assert_null(m.e);
    assert_false(m.wrong_method);
    rt_arena_free(a);
    router_free(rt);
}

static void test_head_is_served_by_get_routes(void **state)
{
    (void)state;
    router *rt = router_new();
    rt_arena *a = rt_arena_new(1024);
    add(rt, "GET", "/health", dummy);
    assert_non_null(do_match(rt, a, "HEAD", "/health").e);
    rt_arena_free(a);
    router_free(rt);
}

static void test_empty_segments_do_not_match(void **state)
{
    (void)state;
    router *rt = router_new();
    rt_arena *a = rt_arena_new(1024);
    add(rt, "GET", "/media/{server}/{id}", dummy);
    assert_null(do_match(rt, a, "GET", "/media//abc").e);     /* empty parameter */
    assert_null(do_match(rt, a, "GET", "/media/s/abc/").e);   /* trailing slash */
    match m = do_match(rt, a, "GET", "/media/s/abc");
    assert_non_null(m.e);
    assert_null(m.invalid);
    rt_arena_free(a);
    router_free(rt);
}

static void test_a_parameter_that_is_not_text_is_named_so_the_request_gets_400(void **state)
{
    (void)state;
    router *rt = router_new();
    rt_arena *a = rt_arena_new(1024);
    add(rt, "GET", "/media/{server}/{id}", dummy);
    add(rt, "GET", "/lit/x", dummy);
    static const char *const bad[] = {
        "/media/s/ab%zz",       /* bad escape */
        "/media/s/ab%00c",      /* embedded NUL */
        "/media/s/%FF",         /* not UTF-8 at all */
        "/media/s/%C0%AF",      /* overlong '/' */
        "/media/s/%ED%A0%80",   /* a UTF-16 surrogate */
        "/media/s/%F4%90%80%80", /* past U+10FFFF */
        "/media/s/%E2%82",      /* truncated sequence */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        match m = do_match(rt, a, "GET", bad[i]);
        assert_non_null(m.e);
        assert_non_null(m.invalid);
        assert_string_equal(m.invalid, "id");
    }
    match m = do_match(rt, a, "GET", "/media/%FF/x");
    assert_string_equal(m.invalid, "server");
    m = do_match(rt, a, "GET", "/media/s/caf%C3%A9%F0%9F%98%80"); /* é and an emoji: text */
    assert_null(m.invalid);
    assert_string_equal(m.values[1], "caf\xc3\xa9\xf0\x9f\x98\x80");
    assert_null(do_match(rt, a, "GET", "/lit/%FF").e); /* a literal never matches non-text */
    rt_arena_free(a);
    router_free(rt);
}

static void test_the_same_route_twice_is_refused_naming_both_owners(void **state)
{
    (void)state;
    router *rt = router_new();
    char err[256];
    atrium_route r = {.method = "GET", .path = "/x/{a}", .handler = dummy};
    assert_int_equal(router_add(rt, &r, "media", err, sizeof(err)), 0);
    atrium_route same_shape = {.method = "GET", .path = "/x/{b}", .handler = other};
    assert_int_equal(router_add(rt, &same_shape, "other", err, sizeof(err)), ATRIUM_E_EXISTS);
    assert_non_null(strstr(err, "\"other\""));
    assert_non_null(strstr(err, "already registered by \"media\""));
    atrium_route post = {.method = "POST", .path = "/x/{a}", .handler = other};
    assert_int_equal(router_add(rt, &post, "other", err, sizeof(err)), 0);
    router_free(rt);
}

static void test_parameters_must_be_whole_segments(void **state)
{
    (void)state;
    router *rt = router_new();
    char err[256];
    atrium_route r = {.method = "GET", .path = "/x/a{b}", .handler = dummy};
    assert_int_equal(router_add(rt, &r, "t", err, sizeof(err)), ATRIUM_E_INVAL);
    atrium_route rel = {.method = "GET", .path = "x", .handler = dummy};
    assert_int_equal(router_add(rt, &rel, "t", err, sizeof(err)), ATRIUM_E_INVAL);
    router_free(rt);
}

static void test_v3_routes_are_served_under_r0_unless_newer_than_r0(void **state)
{
    (void)state;
    router *rt = router_new();
    rt_arena *a = rt_arena_new(1024);
    add(rt, "PUT", "/_matrix/client/v3/rooms/{roomId}/send/{eventType}/{txnId}", dummy);
    add(rt, "POST", "/_matrix/media/v3/upload", other);
    add(rt, "PUT", "/_matrix/media/v3/upload/{serverName}/{mediaId}", dummy);
    add(rt, "POST", "/_matrix/client/v3/keys/device_signing/upload", dummy);
    add(rt, "GET", "/_matrix/client/v1/media/config", dummy);
    match m = do_match(rt, a, "PUT", "/_matrix/client/r0/rooms/%21r%3Ax/send/m.room.message/t1");
    assert_non_null(m.e);
    assert_ptr_equal(m.e->route.handler, dummy);
    assert_int_equal(m.n, 3);
    assert_string_equal(m.values[0], "!r:x");
    m = do_match(rt, a, "POST", "/_matrix/media/r0/upload");
    assert_non_null(m.e);
    assert_ptr_equal(m.e->route.handler, other);
    /* Newer than r0, or not a v3 prefix: no twin. */
    assert_null(do_match(rt, a, "PUT", "/_matrix/media/r0/upload/x/y").e);
    assert_null(do_match(rt, a, "POST", "/_matrix/client/r0/keys/device_signing/upload").e);
    assert_null(do_match(rt, a, "GET", "/_matrix/client/r0/media/config").e);
    /* The twin is registered like any route: a duplicate v3 route is still refused once. */
    char err[256];
    atrium_route dup = {.method = "POST", .path = "/_matrix/media/v3/upload", .handler = dummy};
    assert_int_equal(router_add(rt, &dup, "again", err, sizeof(err)), ATRIUM_E_EXISTS);
    rt_arena_free(a);
    router_free(rt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parameters_are_decoded_after_the_path_is_split),
        cmocka_unit_test(test_literal_segments_win_over_parameters),
        cmocka_unit_test(test_a_path_known_for_another_method_reports_wrong_method),
        cmocka_unit_test(test_head_is_served_by_get_routes),
        cmocka_unit_test(test_empty_segments_do_not_match),
        cmocka_unit_test(test_a_parameter_that_is_not_text_is_named_so_the_request_gets_400),
        cmocka_unit_test(test_the_same_route_twice_is_refused_naming_both_owners),
        cmocka_unit_test(test_parameters_must_be_whole_segments),
        cmocka_unit_test(test_v3_routes_are_served_under_r0_unless_newer_than_r0),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
