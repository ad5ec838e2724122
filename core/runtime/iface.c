/*
 * core/runtime/iface.c - the registry of interfaces: versioned structs of function
 * pointers that plugins (and the core) provide under a name ("directory/1") and others
 * look up (host->iface_provide / iface_get, include/atrium/host.h).
 *
 * This is how the core reaches a plugin's services without including its header: it asks
 * for "directory/1" and gets whatever enabled plugin provides it, or NULL. The registry
 * is written only on the main thread before the listener opens (module and plugin init)
 * and read from any thread after, so it needs no lock: the threads that read it are
 * started after the last write. It does not check what an interface's functions do; the
 * size check lets a caller refuse a provider built for an older minor.
 */
#include <string.h>

#include "core/runtime/iface.h"
#include "core/runtime/runtime.h"

#define IFACE_MAX 32          /* interfaces registered at most */
#define IFACE_HEADER_BYTES 8  /* uint32_t size, uint32_t version */

typedef struct iface_entry {
    const char *name;  /* static, or the providing plugin's descriptor string */
    const char *owner; /* "core" or the plugin's name */
    const void *iface;
} iface_entry;

static iface_entry registry[IFACE_MAX];
static size_t n_registry;

int rt_iface_add(const char *owner, const char *name, const void *iface)
{
    if (!name || !iface || *(const uint32_t *)iface < IFACE_HEADER_BYTES) return ATRIUM_E_INVAL;
    for (size_t i = 0; i < n_registry; i++) {
        if (strcmp(registry[i].name, name) == 0) {
            rt_log(ATRIUM_LOG_ERROR, "core", "%s and %s both provide interface \"%s\" - disable one",
                   registry[i].owner, owner, name);
            return ATRIUM_E_EXISTS;
        }
    }
    if (n_registry == IFACE_MAX) {
        rt_log(ATRIUM_LOG_ERROR, "core", "too many interfaces (at most %d)", IFACE_MAX);
        return ATRIUM_E_LIMIT;
    }
    registry[n_registry++] = (iface_entry){.name = name, .owner = owner, .iface = iface};
    return 0;
}

const void *rt_iface_get(const char *name, uint32_t min_size)
{
    if (!name) return NULL;
    for (size_t i = 0; i < n_registry; i++)
        if (strcmp(registry[i].name, name) == 0)
            return *(const uint32_t *)registry[i].iface >= min_size ? registry[i].iface : NULL;
    return NULL;
}

void rt_iface_reset(void)
{
    n_registry = 0;
}
