/*
 * core/federation/federation.h - the federation module as the rest of the core sees it:
 * started once by main.c, it owns this server's signing key, the outbound client, server
 * discovery, remote keys and destination backoff, registers the federation and key routes
 * and the X-Matrix check that runs before every federation handler.
 *
 * The pieces, one file each: fed_keys (our key, signed JSON, the key document),
 * fed_xmatrix (request signatures), fed_keyring (other servers' keys), fed_http (the one
 * outbound client), fed_iprange (which addresses may be connected to), fed_resolve
 * (discovery), fed_backoff (destinations that failed), fed_request (one outbound
 * federation request end to end), fed_auth (the inbound check), fed_routes (the key
 * server, version and the first federation endpoints). This file's module, federation.c,
 * builds them from the configuration and holds them for the process (fed_internal.h).
 */
#ifndef ATRIUM_CORE_FEDERATION_H
#define ATRIUM_CORE_FEDERATION_H

#include "core/config/config.h"
#include "core/http/http.h"
#include "core/runtime/runtime.h"

/* Build everything from cfg (config_path locates a relative signing key path), register
 * routes on srv, and decide whether the federation listener runs (a certificate and key,
 * or server.federation.tls: false). Before listening. 0, or -1 with the reason logged. */
int federation_init(const struct core_config *cfg, const char *config_path, http_server *srv,
                    rt_metrics *metrics);
/* Migrations of the "federation" owner (remote keys, destinations). */
const atrium_migration *federation_migrations(size_t *n);
int federation_start(void); /* threads: outbound client, resolver, key store; after migrations */
/* SIGHUP: load the listener's certificate again (a failure keeps the old one, logged). */
void federation_reload_tls(void);
void federation_stop(void); /* end outbound requests (callbacks run), join threads */
void federation_free(void);

#endif
