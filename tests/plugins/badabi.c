/*
 * tests/plugins/badabi.c - a plugin that claims the next ABI major, so the loader's
 * refusal line can be tested. Written without ATRIUM_PLUGIN(...) on purpose: the macro
 * always fills in the ABI this header defines.
 */
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

ATRIUM_EXPORT const atrium_plugin_desc *atrium_plugin_entry(void);
const atrium_plugin_desc *atrium_plugin_entry(void)
{
    static const atrium_plugin_desc d = {
        .magic = ATRIUM_PLUGIN_MAGIC,
        .size = sizeof(atrium_plugin_desc),
        .abi_major = ATRIUM_ABI_MAJOR + 1,
        .abi_minor = 0,
        .build_sig = ATRIUM_BUILD_SIG,
        .name = "badabi",
        .version = "9.9.9",
        .init = never_init,
    };
    return &d;
}
