/*
 * core/runtime/iface.h - the registry of interfaces: versioned structs of function pointers
 * that plugins and the core provide under a name ("directory/1") and others look up
 * (iface.c says how). It depends on nothing of the server, so every layer may use it: the
 * client's rooms provide "rooms/1" and find "directory/1" here, the plugin host serves
 * host->iface_provide / iface_get from it. Internal prefix: rt_iface_.
 */
#ifndef ATRIUM_CORE_RT_IFACE_H
#define ATRIUM_CORE_RT_IFACE_H

#include <stdint.h>

/* Register iface (its first field its size, >= 8) under
 * name for owner ("core" or a plugin's name): 0, ATRIUM_E_INVAL, ATRIUM_E_EXISTS (logged
 * with both owners), ATRIUM_E_LIMIT. Main thread, before the listener opens. */
int rt_iface_add(const char *owner, const char *name, const void *iface);
/* The interface registered under name whose size is >= min_size, or NULL. Any thread. */
const void *rt_iface_get(const char *name, uint32_t min_size);
/* Forget every interface (after the plugins' fini; for tests that start twice). */
void rt_iface_reset(void);

#endif
