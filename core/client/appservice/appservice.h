/*
 * core/client/appservice/appservice.h - application services (spec v1.13, "Application
 * Service API"): the bridges and bots this server serves, each described by a registration
 * file the operator lists under app_service_config_files
 * (docs/adr/0014-application-services-in-the-core.md says why this lives in the core).
 *
 * The registry (as_registry.c) reads and checks every file once at start-up and is read-only
 * afterwards, so any thread reads it without a lock. A service's namespaces are POSIX
 * extended regular expressions (regcomp with REG_EXTENDED), anchored at the start only, the
 * way Synapse's Python re.match reads them: "@irc_.*" covers "@irc_bob:example.org".
 * The transaction sender is as_sender.c, the routes and the module as_module.c, the
 * queries about unknown users and aliases as_query.c, the admin listing as_admin.c.
 * Internal prefix: as_.
 */
#ifndef ATRIUM_CORE_APPSERVICE_H
#define ATRIUM_CORE_APPSERVICE_H

#include <regex.h>
#include <stdbool.h>
#include <stddef.h>

#include "core/config/config.h"
#include "core/http/http.h"
#include "core/runtime/core_runtime.h"

#define AS_LOGIN_TYPE "m.login.application_service" /* registration and login */
#define AS_ID_MAX_BYTES 128 /* a service's id: it names a lease-free row and a metric label */

typedef struct as_namespace {
    regex_t re;
    const char *regex; /* as the file wrote it (the configuration tree's) */
    bool exclusive;
} as_namespace;

typedef struct as_service {
    /* Strings point into the file's configuration tree, kept as long as the registry. */
    const char *id;
    const char *url;      /* NULL: nothing is pushed to it (url: null) */
    const char *as_token; /* what the service authenticates with here */
    const char *hs_token; /* what this server authenticates with there */
    char *sender;         /* "@<sender_localpart>:<server_name>" (malloc'd) */
    as_namespace *users, *aliases, *rooms;
    size_t n_users, n_aliases, n_rooms;
    const char **protocols; /* third-party protocols it bridges (malloc'd array) */
    size_t n_protocols;
    bool rate_limited;      /* default true; false exempts its requests from rate limits */
    bool receive_ephemeral; /* receipts, typing, presence, to-device in its transactions */
} as_service;

/* Read every file of cfg->app_service_config_files into the registry. 0, or -1 with err
 * holding one line naming the file (and line) and the key at fault: a file that cannot be
 * read, a missing or mistyped key, a regex regcomp refuses, an id, as_token or hs_token
 * already used by another service. Main thread, at start-up, once, right after the
 * configuration was read (core/main.c), before any module's init. */
int as_registry_load(const struct core_config *cfg, char *err, size_t errlen);
/* Free the registry. Main thread, after every thread that reads it stopped. */
void as_registry_free(void);

/* The services, in file order. Any thread once loaded. */
size_t as_count(void);
const as_service *as_at(size_t i);
const as_service *as_by_id(const char *id);
/* The service whose as_token is token, or NULL (compared in constant time). */
const as_service *as_by_token(const char *token);
/* [req] The service r authenticates as (its access token is an as_token), or NULL. */
const as_service *as_of_request(atrium_req *r);

/* [req] Authenticate r as svc (auth_request found its as_token): as the service's sender,
 * or as ?user_id= when that user is in its namespaces and registered (else 403
 * M_FORBIDDEN). Sets r->user and r->device and returns the user ID, or answers and returns
 * NULL (as_module.c). The device is "AS_<id>" (no device row), or, MSC3202-style, the one
 * ?device_id= (or org.matrix.msc3202.device_id=) names when the user has it (else 400
 * ORG.MATRIX.MSC4326.M_UNKNOWN_DEVICE, Synapse's answer): to-device messages, keys and
 * /sync then are that device's. */
const char *as_authenticate(atrium_req *r, const as_service *svc);

/* [req] Take a slot of the outbound budget (ADR-0079) for a request that waits on a
 * service, held to its last byte; false after answering 429 (as_module.c). */
bool as_outbound_hold(atrium_req *r);
/* [req] Ask a service about a local user (alias) this server may not know (as_query.c):
 * when a service with a url claims it in its namespaces, the user is not registered (for
 * aliases the caller found none) and r has not asked in an earlier run, GET
 * {url}/_matrix/app/v1/users/{userId} (rooms/{roomAlias}) and return ATRIUM_PARKED: the
 * handler runs again when the service answered or the deadline passed, and looks again.
 * Otherwise ATRIUM_CONTINUE: look no further (unknown stays unknown). ATRIUM_DONE after
 * answering (429 with the outbound budget full, 503 when the database fails or the server
 * stops). */
int as_query_user(atrium_req *r, const char *user_id);
int as_query_alias(atrium_req *r, const char *alias);

/* Register the third-party routes (as_thirdparty.c). 0 or -1. */
int as_thirdparty_routes(http_server *s);

/* Is user_id the service's (its sender, or in its user namespaces)? */
bool as_user_in(const as_service *s, const char *user_id);
bool as_alias_in(const as_service *s, const char *alias);
bool as_room_in(const as_service *s, const char *room_id);
/* Does some service other than `except` (NULL: any) claim user_id (alias) exclusively? */
bool as_user_exclusive_elsewhere(const char *user_id, const as_service *except);
bool as_alias_exclusive_elsewhere(const char *alias, const as_service *except);

/* ---- the transaction sender (as_sender.c) ---------------------------------------------- */

/* Start the sender thread (one for every service with a url) on rt->db under the lease
 * core.appservice_sender, and register its metrics. 0 or ATRIUM_E_IO (logged). Start-up,
 * after the module's migrations. Nothing to do (0) without a service with a url. */
int as_sender_start(core_runtime *rt);
/* Stop and join it; a request in flight ends later on the outbound client's thread and its
 * answer is forgotten (the transaction is sent again, with the same txnId, next run). */
void as_sender_stop(void);
/* Something was committed that may interest a service: run a pass soon. Any thread. */
void as_sender_kick(void);
/* Has this process service i's (the registry's index) transaction in flight now? Any
 * thread. */
bool as_sender_in_flight(size_t i);

/* Register GET /_atrium/admin/v1/appservices (as_admin.c). 0 or -1. */
int as_admin_routes(http_server *s);

#endif
