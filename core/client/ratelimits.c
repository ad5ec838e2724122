/*
 * core/client/ratelimits.c - the named client rate limiters (see ratelimits.h).
 *
 * Rates are configured per minute (ratelimit.<action>.per_minute, an integer an operator
 * reads at a glance) and converted to the token bucket's per-second refill here.
 */
#include "core/client/ratelimits.h"

#define SECONDS_PER_MINUTE 60.0

static rt_ratelimit *rl_register, *rl_login, *rl_message;

static rt_ratelimit *make(const char *name, const struct core_rate *rate, rt_metrics *metrics)
{
    return rt_ratelimit_new(name, rate->per_minute / SECONDS_PER_MINUTE, rate->burst,
                            RATELIMIT_MAX_KEYS, metrics);
}

int ratelimits_init(const struct core_config *cfg, rt_metrics *metrics)
{
    RT_ASSERT(!rl_register, "%s", "ratelimits_init called twice");
    rl_register = make("register", &cfg->ratelimit.registration, metrics);
    rl_login = make("login", &cfg->ratelimit.login, metrics);
    rl_message = make("message", &cfg->ratelimit.message, metrics);
    if (!rl_register || !rl_login || !rl_message) {
        rt_log(ATRIUM_LOG_ERROR, "core", "out of memory creating the rate limiters");
        return ATRIUM_E_NOMEM;
    }
    return 0;
}

rt_ratelimit *ratelimit_register(void) { return rl_register; }
rt_ratelimit *ratelimit_login(void) { return rl_login; }
rt_ratelimit *ratelimit_message(void) { return rl_message; }

bool ratelimit_refused(atrium_req *r, rt_ratelimit *rl)
{
    if (!rl) return false;
    int64_t wait_ms = http_req_ratelimit(r, rl);
    if (wait_ms <= 0) return false;
    http_respond_limited(r, wait_ms, "Too many requests; retry later");
    return true;
}
