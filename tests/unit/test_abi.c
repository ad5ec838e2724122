/*
 * tests/unit/test_abi.c - the public ABI's layout is frozen for 1.x: the headers compile
 * alone (this file includes them first, before anything else), the 1.0 members of the
 * host table and the descriptor keep their offsets, the 1.1 members follow them, and the
 * macro fills in the handshake. An accidental insertion into struct atrium_host fails this
 * build. 1.2 added no host member: a route flag (ATRIUM_ROUTE_HEADERS_FIRST) and the
 * media/1 contract (atrium/media.h), whose route list is checked here too. 1.7 added none
 * either: plugin commands, whose program names and arguments are checked here.
 */
#include "atrium/host.h"
#include "atrium/plugin.h"
#include "atrium/directory.h"
#include "atrium/rooms.h"
#include "atrium/media.h"

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
/* 1.1, appended after the 60 members of 1.0: the settings table, then federation. */
_Static_assert(offsetof(struct atrium_host, config_load) == 8 + 60 * PTR, "host 1.1 layout");
_Static_assert(offsetof(struct atrium_host, db_wait_ms) == 8 + 61 * PTR, "host 1.1 layout");
_Static_assert(offsetof(struct atrium_host, req_origin) == 8 + 62 * PTR, "host 1.1 layout");
_Static_assert(offsetof(struct atrium_host, fed_verify_json) == 8 + 68 * PTR, "host 1.1 layout");
_Static_assert(offsetof(struct atrium_host, iface_provide) == 8 + 69 * PTR, "host 1.1 layout");
_Static_assert(offsetof(struct atrium_host, iface_get) == 8 + 70 * PTR, "host 1.1 layout");
/* 1.3, appended after iface_get: several processes on one database. */
_Static_assert(offsetof(struct atrium_host, instance_name) == 8 + 71 * PTR, "host 1.3 layout");
_Static_assert(offsetof(struct atrium_host, lease_held) == 8 + 76 * PTR, "host 1.3 layout");
_Static_assert(offsetof(struct atrium_host, respond_stream_wait) == 8 + 77 * PTR,
               "host 1.3 layout");
/* 1.4, appended after respond_stream_wait: the server-name grammar. */
_Static_assert(offsetof(struct atrium_host, server_name_valid) == 8 + 78 * PTR,
               "host 1.4 layout");
/* 1.5, appended after server_name_valid: the wall clock, then SHA-256 chunk by chunk. */
_Static_assert(offsetof(struct atrium_host, wall_ms) == 8 + 79 * PTR, "host 1.5 layout");
_Static_assert(offsetof(struct atrium_host, sha256_init) == 8 + 80 * PTR, "host 1.5 layout");
_Static_assert(offsetof(struct atrium_host, sha256_update) == 8 + 81 * PTR, "host 1.5 layout");
_Static_assert(offsetof(struct atrium_host, sha256_final) == 8 + 82 * PTR, "host 1.5 layout");
/* 1.6, appended after sha256_final: application services. */
_Static_assert(offsetof(struct atrium_host, req_appservice) == 8 + 83 * PTR, "host 1.6 layout");
_Static_assert(offsetof(struct atrium_host, alias_exclusive) == 8 + 84 * PTR, "host 1.6 layout");
_Static_assert(offsetof(struct atrium_host, alias_query) == 8 + 85 * PTR, "host 1.6 layout");
/* 1.7 added no host member: plugin commands (a program and its arguments, plugin.h). */
/* 1.8, appended after alias_query: single flight. */
_Static_assert(offsetof(struct atrium_host, flights_create) == 8 + 86 * PTR, "host 1.8 layout");
_Static_assert(offsetof(struct atrium_host, flight_join) == 8 + 87 * PTR, "host 1.8 layout");
_Static_assert(offsetof(struct atrium_host, flight_finish) == 8 + 88 * PTR, "host 1.8 layout");
_Static_assert(offsetof(struct atrium_host, flight_result) == 8 + 89 * PTR, "host 1.8 layout");
_Static_assert(offsetof(struct atrium_host, flight_wanted) == 8 + 90 * PTR, "host 1.8 layout");
_Static_assert(ATRIUM_FLIGHT_LEAD == 1 && ATRIUM_FLIGHT_JOINED == 2, "flight roles keep their values");
/* 1.9, appended after flight_wanted: a flight's early result. */
_Static_assert(offsetof(struct atrium_host, flight_publish) == 8 + 91 * PTR, "host 1.9 layout");
_Static_assert(offsetof(struct atrium_host, flight_unpublish) == 8 + 92 * PTR, "host 1.9 layout");
_Static_assert(ATRIUM_FLIGHT_PUBLISHED == 3 && ATRIUM_FLIGHT_RESULT_EARLY == 1 &&
                   ATRIUM_FLIGHT_JOIN_ONLY == 0x1u && ATRIUM_FLIGHT_EARLY == 0x2u &&
                   ATRIUM_FLIGHT_EARLY_ONLY == 0x4u,
               "flight roles and flags keep their values");
_Static_assert(sizeof(struct atrium_host) == 8 + 93 * PTR, "members are appended only at a minor");
/* The caller's SHA-256 context: plugins allocate it, so its size and alignment are ABI. */
_Static_assert(sizeof(atrium_sha256) == 128 && _Alignof(atrium_sha256) == 8,
               "atrium_sha256 layout changed");
_Static_assert(ATRIUM_SHA256_BYTES == 32 && ATRIUM_SHA256_HEX_BYTES == 65, "digest sizes");
/* Handler outcomes keep their values; ATRIUM_CONTINUE (1.5) is none of them. */
_Static_assert(ATRIUM_DONE == 0 && ATRIUM_PARKED == 1 && ATRIUM_HANDED_OFF == 2 &&
                   ATRIUM_CONTINUE == 3,
               "handler outcomes keep their values");
_Static_assert(ATRIUM_STREAM_END == -1 && ATRIUM_STREAM_ERROR == -2 && ATRIUM_STREAM_WAIT == -3,
               "stream reader answers keep their values");
/* Route flags and the route struct are frozen too: the host copies sizeof(atrium_route). */
_Static_assert(ATRIUM_ROUTE_STREAM_BODY == 0x1u && ATRIUM_ROUTE_FEDERATION == 0x2u &&
                   ATRIUM_ROUTE_HEADERS_FIRST == 0x4u,
               "route flags keep their bits");
_Static_assert(offsetof(atrium_route, body_chunk) == 5 * PTR && sizeof(atrium_route) == 7 * PTR,
               "atrium_route layout changed");
_Static_assert(ATRIUM_ABI_MAJOR == 1 && ATRIUM_ABI_MINOR == 9, "this file pins ABI 1.9");
/* Interfaces start with their size and version, then function pointers, appended only. */
_Static_assert(offsetof(atrium_directory, size) == 0 && offsetof(atrium_directory, version) == 4,
               "directory/1 header changed");
_Static_assert(offsetof(atrium_directory, alias_create) == 8, "directory/1 layout changed");
_Static_assert(offsetof(atrium_directory, may_publish) == 8 + 4 * PTR, "directory/1 layout");
_Static_assert(ATRIUM_DIRECTORY_V0_SIZE == 8 + 5 * PTR, "directory/1 version 0 is frozen");
_Static_assert(offsetof(atrium_directory, alias_resolve_remote) == 8 + 5 * PTR &&
                   offsetof(atrium_directory, room_listed) == 8 + 6 * PTR &&
                   offsetof(atrium_directory, room_aliases_delete) == 8 + 7 * PTR,
               "directory/1 version 1 layout");
_Static_assert(sizeof(atrium_directory) == 8 + 8 * PTR, "directory/1 members are appended");
_Static_assert(offsetof(atrium_rooms, room_summary) == 8, "rooms/1 layout changed");
_Static_assert(ATRIUM_ROOMS_V0_SIZE == 8 + 3 * PTR, "rooms/1 version 0 is frozen");
_Static_assert(offsetof(atrium_rooms, canonical_alias_drop) == 8 + 3 * PTR, "rooms/1 version 1");
_Static_assert(sizeof(atrium_rooms) == 8 + 4 * PTR, "rooms/1 members are appended");
/* atrium_fed_request grows by appending after arg (its size field tells which it has). */
_Static_assert(offsetof(atrium_fed_request, url) == offsetof(atrium_fed_request, arg) + PTR,
               "atrium_fed_request must append");
_Static_assert(offsetof(atrium_plugin_desc, name) == 24, "descriptor 1.0 layout changed");
_Static_assert(offsetof(atrium_plugin_desc, fini) == 72, "descriptor 1.0 layout changed");
_Static_assert(offsetof(atrium_plugin_desc, settings) == 80, "descriptor 1.1 layout changed");
_Static_assert(offsetof(atrium_plugin_desc, n_settings) == 88, "descriptor 1.1 layout changed");
_Static_assert(sizeof(atrium_plugin_desc) == 96, "descriptor fields are appended only");
/* A settings row (1.1) is frozen for the major: plugins' static tables use this layout. */
_Static_assert(offsetof(atrium_setting, type) == PTR, "setting row layout changed");
_Static_assert(offsetof(atrium_setting, offset) == 2 * PTR, "setting row layout changed");
_Static_assert(offsetof(atrium_setting, def) == 3 * PTR, "setting row layout changed");
_Static_assert(offsetof(atrium_setting, def_string) == 6 * PTR, "setting row layout changed");
_Static_assert(offsetof(atrium_setting, default_doc) == 9 * PTR, "setting row layout changed");
_Static_assert(sizeof(atrium_setting) == 10 * PTR, "setting row layout changed");

/* media/1: five routes required (config, upload, download twice, thumbnail), each
 * registered by the stock plugin and the example (the core checks at start-up). */
static void test_the_media_contract_lists_its_required_routes(void **state)
{
    (void)state;
    static const struct {
        const char *method, *path;
        int cls;
    } routes[] = {
#define ROW_(name, method, path, cls) {method, path, cls},
        ATRIUM_MEDIA_ROUTES(ROW_)
#undef ROW_
    };
    assert_int_equal(sizeof(routes) / sizeof(routes[0]), ATRIUM_MEDIA_ROUTE__COUNT);
    int required = 0;
    for (size_t i = 0; i < ATRIUM_MEDIA_ROUTE__COUNT; i++) {
        assert_true(routes[i].path[0] == '/');
        required += routes[i].cls == ATRIUM_MEDIA_REQUIRED;
    }
    assert_int_equal(required, 5);
    assert_string_equal(routes[ATRIUM_MEDIA_ROUTE_UPLOAD].path, "/_matrix/media/v3/upload");
    assert_string_equal(routes[ATRIUM_MEDIA_ROUTE_UPLOAD].method, "POST");
    assert_int_equal(routes[ATRIUM_MEDIA_ROUTE_CREATE].cls, ATRIUM_MEDIA_OPTIONAL);
}

/* Plugin commands (1.7): the program's name and arguments are the contract between the
 * core (core/cli/plugin_command.c) and the programs plugins ship; media/1 version 1 names
 * its two commands. */
static void test_plugin_commands_keep_their_program_names_and_arguments(void **state)
{
    (void)state;
    assert_string_equal(ATRIUM_COMMAND_PREFIX, "atrium-");
    assert_string_equal(ATRIUM_COMMAND_ARG_CONNINFO, "--conninfo");
    assert_string_equal(ATRIUM_COMMAND_ARG_SETTINGS, "--settings-stdin");
    assert_int_equal(ATRIUM_MEDIA_VERSION, 1);
    assert_string_equal(ATRIUM_COMMAND_PREFIX "media-" ATRIUM_MEDIA_COMMAND_VERIFY,
                        "atrium-media-verify");
    assert_string_equal(ATRIUM_COMMAND_PREFIX "media-" ATRIUM_MEDIA_COMMAND_MIGRATE,
                        "atrium-media-migrate");
}

/* Error names for log lines: every code has one, anything else is "unknown". */
static void test_every_error_code_has_a_name(void **state)
{
    (void)state;
    for (int e = ATRIUM_E_GONE; e <= ATRIUM_OK; e++) {
        const char *name = atrium_err_name(e);
        assert_true(strncmp(name, "ATRIUM_", 7) == 0);
    }
    assert_string_equal(atrium_err_name(ATRIUM_E_EXISTS), "ATRIUM_E_EXISTS (already registered)");
    assert_string_equal(atrium_err_name(-99), "unknown error");
}

static int noop_init(const atrium_host *h, atrium_plugin *s, const atrium_config *c, void **st)
{
    (void)h, (void)s, (void)c, (void)st;
    return 0;
}

struct abi_test_settings {
    int slots;
};
static const atrium_setting ABI_TEST_SETTINGS[] = {
    {.key = "slots", .type = ATRIUM_SETTING_INT, .offset = offsetof(struct abi_test_settings,
     slots), .def = 4, .min = 1, .max = 8, .help = "Slots."},
};

ATRIUM_PLUGIN(.name = "abi-test", .version = "1", .init = noop_init,
              .settings = ABI_TEST_SETTINGS, .n_settings = 1)

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
    assert_ptr_equal(d->settings, ABI_TEST_SETTINGS);
    assert_int_equal(d->n_settings, 1);
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
    /* A 1.0 host: the 1.1 members are absent even if the memory after it is not zero. */
    full.size = (uint32_t)offsetof(struct atrium_host, config_load);
    full.config_load = (int (*)(atrium_plugin *, const atrium_config *, void *))1;
    assert_false(ATRIUM_HOST_HAS(&full, config_load));
    full.size = sizeof(full);
    assert_true(ATRIUM_HOST_HAS(&full, config_load));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_plugin_macro_fills_in_the_handshake),
        cmocka_unit_test(test_host_has_tells_present_members_from_absent_ones),
        cmocka_unit_test(test_the_media_contract_lists_its_required_routes),
        cmocka_unit_test(test_every_error_code_has_a_name),
        cmocka_unit_test(test_plugin_commands_keep_their_program_names_and_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
