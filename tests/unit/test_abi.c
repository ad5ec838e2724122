/*
 * tests/unit/test_abi.c - the public ABI's layout is frozen for 1.x: the headers compile
 * alone (this file includes them first, before anything else), the 1.0 members of the
 * host table and the descriptor keep their offsets, and the macro fills in the handshake.
 * An accidental insertion into struct atrium_host fails this build.
 */
#include "atrium/host.h"
#include "atrium/plugin.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#define PTR sizeof(void *)
/* 1.0 layout: size (4) + major (2) + minor (2), then 60 function pointers. */
_Static_assert(offsetof(struct atrium_host, server_name) == 8, "host table header changed");
_Static_assert(offsetof(struct atrium_host, log) == 8 + 1 * PTR, "host 1.0 layout changed");
_Static_assert(offsetof(struct atrium_host, route_add) == 8 + 7 * PTR, "host 1.0 layout changed");
_Static_assert(offsetof(struct atrium_host, req_method) == 8 + 9 * PTR, "host 1.0 layout changed");
_Static_assert(offsetof(struct atrium_host, respond_header) == 8 + 28 * PTR, "host 1.0 layout");
_Static_assert(offsetof(struct atrium_host, handoff) == 8 + 41 * PTR, "host 1.0 layout changed");
_Static_assert(offsetof(struct atrium_host, db_release) == 8 + 59 * PTR, "host 1.0 layout changed");
/* 1.1 appends federation: req_origin first, right after the 1.0 members. */
_Static_assert(offsetof(struct atrium_host, req_origin) == 8 + 60 * PTR, "1.1 must append");
_Static_assert(offsetof(struct atrium_host, fed_verify_json) == 8 + 66 * PTR, "1.1 layout");
/* atrium_fed_request grows by appending after arg (its size field tells which it has). */
_Static_assert(offsetof(atrium_fed_request, url) == offsetof(atrium_fed_request, arg) + PTR,
               "atrium_fed_request must append");
_Static_assert(sizeof(struct atrium_host) == 8 + 67 * PTR, "members are appended only at a minor");
_Static_assert(offsetof(atrium_plugin_desc, name) == 24, "descriptor 1.0 layout changed");
_Static_assert(offsetof(atrium_plugin_desc, fini) == 72, "descriptor 1.0 layout changed");

static int noop_init(const atrium_host *h, atrium_plugin *s, const atrium_config *c, void **st)
{
    (void)h, (void)s, (void)c, (void)st;
    return 0;
}

ATRIUM_PLUGIN(.name = "abi-test", .version = "1", .init = noop_init)

static void test_the_plugin_macro_fills_in_the_handshake(void **state)
{
    (void)state;
    const atrium_plugin_desc *d = atrium_plugin_entry();
    assert_int_equal(d->magic, ATRIUM_PLUGIN_MAGIC);
    assert_int_equal(d->size, sizeof(atrium_plugin_desc));
    assert_int_equal(d->abi_major, ATRIUM_ABI_MAJOR);
    assert_int_equal(d->abi_minor, ATRIUM_ABI_MINOR);
    assert_string_equal(d->build_sig, ATRIUM_BUILD_SIG);
    assert_string_equal(d->name, "abi-test");
}

static void test_host_has_tells_present_members_from_absent_ones(void **state)
{
    (void)state;
    struct atrium_host full;
    memset(&full, 0, sizeof(full));
    full.size = sizeof(full);
    full.db_release = (void (*)(PGconn *))1;
    assert_true(ATRIUM_HOST_HAS(&full, db_release));
    /* A host from before db_release existed. */
    full.size = (uint32_t)offsetof(struct atrium_host, db_release);
    assert_false(ATRIUM_HOST_HAS(&full, db_release));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_plugin_macro_fills_in_the_handshake),
        cmocka_unit_test(test_host_has_tells_present_members_from_absent_ones),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
