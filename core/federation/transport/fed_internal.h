/*
 * core/federation/transport/fed_internal.h - what the federation module's files share: the one
 * module object (built by federation.c from the configuration, alive from federation_init
 * to federation_free) and the headers of the pieces.
 *
 * Not for the rest of the core: it includes federation.h, fed_request.h and the ABI.
 */
#ifndef ATRIUM_CORE_FED_INTERNAL_H
#define ATRIUM_CORE_FED_INTERNAL_H

#include <stdatomic.h>

#include "core/federation/transport/fed_backoff.h"
#include "core/federation/transport/fed_http.h"
#include "core/runtime/iprange.h"
#include "core/federation/transport/fed_keyring.h"
#include "core/federation/transport/fed_keys.h"
#include "core/federation/transport/fed_migrations.h"
#include "core/federation/transport/fed_request.h"
#include "core/federation/transport/fed_resolve.h"
#include "core/federation/transport/fed_xmatrix.h"
#include "core/federation/transport/federation.h"
#include "core/rooms/canonical_json.h"

#define FED_AUTH_HEADER_BYTES 1024 /* "Authorization: X-Matrix origin=...,sig=..." */
#define FED_MAX_OLD_KEYS 16

typedef struct fed_module {
    const struct core_config *cfg;
    const char *server_name;
    http_server *srv;
    rt_metrics *metrics;
    fed_signing_key key;
    fed_old_key old_keys[FED_MAX_OLD_KEYS];
    size_t n_old_keys;
    char key_path[4096];
    bool listener; /* the federation listener is served */
    rt_iprange_list *blacklist, *whitelist;
    fed_http *http;
    fed_resolver *resolver;
    fed_backoff *backoff;
    fed_keyring *keyring;
    struct fed_outbound *outbound; /* fed_outbound.c: the queue's sender */
    rt_pool *inbound_pool;         /* fed_inbound.c: received transactions run here */
    rt_metric *m_auth_ok;
    rt_metric *m_auth_refused[8]; /* by enum fed_auth_reason */
} fed_module;

/* A request waiting for a callback that may come before, during or after the handler
 * parks (fed_keyring_lookup's PENDING may answer on the calling thread). The callback
 * stores its result, then calls fed_waiter_done; the handler, after a PENDING, calls
 * fed_waiter_park. Whichever comes second wakes the request, exactly once. The caller
 * holds a reference on r (http_req_ref) for the callback, which drops it after
 * fed_waiter_done, so r outlives a callback that comes after r was answered. */
typedef struct fed_waiter {
    atomic_int state; /* FED_WAITER_* */
    atrium_req *r;
} fed_waiter;
enum { FED_WAITER_IDLE = 0, FED_WAITER_PARKED, FED_WAITER_DONE };
int fed_waiter_park(fed_waiter *w, atrium_req *r, int64_t deadline_ms);
void fed_waiter_done(fed_waiter *w);

/* The module, or NULL before federation_init / after federation_free. */
fed_module *fed_state(void);

/* fed_auth.c: the X-Matrix check (http_fed_auth_fn) and the fallback for unknown paths. */
int fed_auth_check(atrium_req *r);
int fed_auth_unknown_path(atrium_req *r);
void fed_auth_metrics(fed_module *m);

/* fed_routes.c: the key server, version and profile routes; fed_keyquery.c: key queries. */
int fed_routes_register(fed_module *m);
int fed_keyquery_routes(fed_module *m);
json_t *fed_own_key_document(fed_module *m); /* signed, a new reference */

/* fed_verify.c: is obj signed by server_name with a key valid at valid_at_ms (wall ms)?
 * done(arg, 0 or a negative error, why) exactly once, possibly before this returns; a
 * negative return (not an object, out of memory) calls nothing. Any thread. */
typedef void (*fed_verify_cb)(void *arg, int result, const char *why);
int fed_verify_signed(const json_t *obj, const char *server_name, int64_t valid_at_ms,
                      fed_verify_cb done, void *arg);

/* fed_outbound.c: the sender of the outbound queue (fed_txn.h). new: NULL on failure;
 * start: its thread (0 or ATRIUM_E_IO); stop: the thread joined (a transaction in flight
 * is answered later by the outbound client's stop, and sent again at the next start);
 * free: after the outbound client stopped (its callbacks write into the destinations). */
typedef struct fed_outbound fed_outbound;
fed_outbound *fed_outbound_new(db_pool *db, fed_backoff *backoff, const char *server_name,
                               int sender_groups, rt_metrics *metrics);
int fed_outbound_start(fed_outbound *o);
void fed_outbound_stop(fed_outbound *o);
void fed_outbound_free(fed_outbound *o);

/* fed_inbound.c: PUT /_matrix/federation/v1/send/{txnId} and its pool. routes: during
 * federation_init (0 or -1); start: the pool's threads; stop: queued transactions are
 * answered 503 and the pool joined (before the listeners stop); free: after stop. */
int fed_inbound_routes(fed_module *m);
int fed_inbound_start(fed_module *m);
void fed_inbound_stop(fed_module *m);
void fed_inbound_free(fed_module *m);

/* federation.c: the key ring's fetch hook (trusted key servers first, then the origin). */
int fed_fetch_keys(void *fetch_arg, fed_keyring *ring, const char *server_name);

#endif
