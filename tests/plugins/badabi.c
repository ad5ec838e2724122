/*
 * tests/plugins/badabi.c - a plugin that targets the next ABI major, so the loader's
 * refusal line can be tested. It sets its target the way any plugin does
 * (ATRIUM_TARGET_ABI_MAJOR before the headers, atrium/plugin.h): the descriptor
 * ATRIUM_PLUGIN(...) writes then claims 2.0. tests/plugins/CMakeLists.txt also checks that
 * defining ATRIUM_ABI_MAJOR itself does not compile.
 */
#define ATRIUM_TARGET_ABI_MAJOR 2
#define ATRIUM_TARGET_ABI_MINOR 0
#include "atrium/host.h"

static int never_init(const atrium_host *host, atrium_plugin *self, const atrium_config *cfg,
                      void **state)
{
    (void)host;
    (void)self;
    (void)cfg;
    (void)state;
    return ATRIUM_E_STATE; /* the loader must refuse before calling this */
}

ATRIUM_PLUGIN(.name = "badabi", .version = "9.9.9", .init = never_init)
