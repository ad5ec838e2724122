/*
 * core/client/ratelimits.h - the core's named rate limiters for client actions: account
 * registration and login (keyed by client address: those requests are unauthenticated)
 * and sending events into rooms (keyed by user). Their rates come from ratelimit.<action>.*
 * in the config; ratelimit.enabled: false turns every one of them off.
 *
 * This file owns which limiter exists and how a refusal is answered (429 M_LIMIT_EXCEEDED
 * with retry_after_ms and Retry-After). Counting a request once however often its handler
 * runs is http_req_ratelimit's rule (core/http), used here, not re-implemented.
 * Internal prefix: ratelimit_.
 */
#ifndef ATRIUM_CORE_RATELIMITS_H
#define ATRIUM_CORE_RATELIMITS_H

#include <stdbool.h>

#include "core/http/http.h"
#include "core/runtime/core_runtime.h"

#define RATELIMIT_MAX_KEYS 100000 /* clients tracked per limiter */

/* Create the limiters from rt->cfg into rt->limits (start-up, once; the accounts module's
 * init does it). 0 or ATRIUM_E_NOMEM. They live until ratelimits_free. */
int ratelimits_init(core_runtime *rt);
/* Free every limiter of rt->limits (the sync module's too) and clear them. core/main.c, at
 * the end, after every thread that counts requests stopped. */
void ratelimits_free(core_runtime *rt);

/* The bound runtime object's limiters (NULL before ratelimits_init). Any thread. */
rt_ratelimit *ratelimit_register(void);
rt_ratelimit *ratelimit_login(void);
rt_ratelimit *ratelimit_message(void);
rt_ratelimit *ratelimit_sync(void); /* created by the sync module (core/client/sync/sync.c) */

/* [req] Count r against rl: false = allowed; true = refused, and r has been answered 429
 * (the handler returns ATRIUM_DONE). A NULL rl allows everything. */
bool ratelimit_refused(atrium_req *r, rt_ratelimit *rl);

#endif
