/*
 * tests/plugins/badabi_compile.c - a plugin's smallest translation unit, compiled (never
 * built) by the unit.abi_refuses_* tests with a -D that must be refused by the headers.
 */
#include "atrium/host.h"

static int init(const atrium_host *host, atrium_plugin *self, const atrium_config *cfg,
                void **state)
{
    (void)host;
    (void)self;
    (void)cfg;
    *state = NULL;
    return 0;
}

ATRIUM_PLUGIN(.name = "abicompile", .version = "0", .init = init)
