/*
 * core/federation/fed_internal.h - what the federation module's files share: the one
 * module object (built by federation.c from the configuration, alive from federation_init
 * to federation_free) and the headers of the pieces.
 *
 * Not for the rest of the core: it includes federation.h, fed_request.h and the ABI.
 */
#ifndef ATRIUM_CORE_FED_INTERNAL_H
#define ATRIUM_CORE_FED_INTERNAL_H

#include "core/federation/fed_backoff.h"
#include "core/federation/fed_http.h"
#include "core/federation/fed_iprange.h"
#include "core/federation/fed_keyring.h"
#include "core/federation/fed_keys.h"
#include "core/federation/fed_request.h"
#include "core/federation/fed_resolve.h"
#include "core/federation/fed_xmatrix.h"
#include "core/federation/federation.h"
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
    fed_iprange_list *blacklist, *whitelist;
    fed_http *http;
    fed_resolver *resolver;
    fed_backoff *backoff;
    fed_keyring *keyring;
    struct atrium_event *keys_event; /* signalled whenever a key look-up ends */
    rt_metric *m_auth_ok;
    rt_metric *m_auth_refused[8]; /* by enum fed_auth_reason */
} fed_module;

/* The module, or NULL before federation_init / after federation_free. */
fed_module *fed_state(void);

/* fed_auth.c: the X-Matrix check (http_fed_auth_fn) and the fallback for unknown paths. */
int fed_auth_check(atrium_req *r);
int fed_auth_unknown_path(atrium_req *r);
void fed_auth_metrics(fed_module *m);

/* fed_routes.c: the key server, version and profile routes. */
int fed_routes_register(fed_module *m);

#endif
