/*
 * core/federation/transport/federation.h - the federation module as the rest of the core sees it:
 * started once by main.c, it owns this server's signing key, the outbound client, server
 * discovery, remote keys and destination backoff, registers the federation and key routes
 * and the X-Matrix check that runs before every federation handler.
 *
 * The pieces, one file each: fed_keys (our key, signed JSON, the key document),
 * fed_xmatrix (request signatures), fed_keyring (other servers' keys), fed_http (the one
 * outbound client; which addresses it may connect to is core/runtime/iprange.h), fed_resolve
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
/* Stop the pool of received transactions (those queued are answered 503): with the other
 * pools, before the listeners stop. */
void federation_stop_inbound(void);
void federation_stop(void); /* end outbound requests (callbacks run), join threads */
/* Sign obj as this server (signatures.<server_name>.<key id>). 0 or ATRIUM_E_INVAL (not an
 * object, no canonical encoding) / ATRIUM_E_STOPPED (no federation module). Any thread. */
int federation_sign_json(json_t *obj);
/* Is obj signed by server_name with a key valid at valid_at_ms (wall clock)? The key comes
 * from the key ring, fetched when needed: done(arg, 0 or a negative error, a reason) is
 * called exactly once, possibly before this returns, else on an internal thread (quick).
 * A negative return (not an object, out of memory): done is never called. Any thread. */
int federation_verify_json(const json_t *obj, const char *server_name, int64_t valid_at_ms,
                           void (*done)(void *arg, int result, const char *why), void *arg);
void federation_free(void);

#endif
