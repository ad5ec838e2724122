/*
 * core/runtime/core_runtime.c - the one binding of the runtime object (see
 * core_runtime.h): the only process-wide pointer to it, set by core/main.c.
 */
#include "core/runtime/core_runtime.h"

static core_runtime *bound;

void core_runtime_bind(core_runtime *rt)
{
    bound = rt;
}

core_runtime *core_runtime_get(void)
{
    return bound;
}
