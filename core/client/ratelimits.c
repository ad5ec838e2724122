/*
 * core/client/ratelimits.c - the named client rate limiters (see ratelimits.h).
 *
 * Rates are configured per minute (ratelimit.<action>.per_minute, an integer an operator
 * reads at a glance) and converted to the token bucket's per-second refill here.
 */
#include "core/client/appservice/appservice.h"
#include "core/client/ratelimits.h"

#define SECONDS_PER_MINUTE 60.0

static rt_ratelimit *make(const char *name, const struct core_rate *rate, rt_metrics *metrics)
{
    return rt_ratelimit_new(name, rate->per_minute / SECONDS_PER_MINUTE, rate->burst,
                            RATELIMIT_MAX_KEYS, metrics);
}

int ratelimits_init(core_runtime *rt)
{
    core_limits *l = &rt->limits;
    RT_ASSERT(!l->registration, "%s", "ratelimits_init called twice");
    l->registration = make("register", &rt->cfg->ratelimit.registration, rt->metrics);
    l->login = make("login", &rt->cfg->ratelimit.login, rt->metrics);
    l->message = make("message", &rt->cfg->ratelimit.message, rt->metrics);
    if (!l->registration || !l->login || !l->message) {
        rt_log(ATRIUM_LOG_ERROR, "core", "out of memory creating the rate limiters");
        return ATRIUM_E_NOMEM;
    }
    return 0;
}

void ratelimits_free(core_runtime *rt)
{
    core_limits *l = &rt->limits;
    rt_ratelimit_free(l->registration);
    rt_ratelimit_free(l->login);
    rt_ratelimit_free(l->message);
    rt_ratelimit_free(l->sync);
    *l = (core_limits){0};
}

static core_limits *limits(void)
{
    core_runtime *rt = core_runtime_get();
    return rt ? &rt->limits : NULL;
}

rt_ratelimit *ratelimit_register(void) { return limits() ? limits()->registration : NULL; }
rt_ratelimit *ratelimit_login(void) { return limits() ? limits()->login : NULL; }
rt_ratelimit *ratelimit_message(void) { return limits() ? limits()->message : NULL; }
rt_ratelimit *ratelimit_sync(void) { return limits() ? limits()->sync : NULL; }

bool ratelimit_refused(atrium_req *r, rt_ratelimit *rl)
{
    if (!rl) return false;
    const as_service *svc = as_of_request(r); /* rate_limited: false exempts a service */
    if (svc && !svc->rate_limited) return false;
    int64_t wait_ms = http_req_ratelimit(r, rl);
    if (wait_ms <= 0) return false;
    http_respond_limited(r, wait_ms, "Too many requests; retry later");
    return true;
}
