/*
 * core/runtime/clock.c - the two clocks of the runtime.
 *
 * Deadlines (request deadlines, admission waits, rate-limiter refills) are measured on
 * CLOCK_MONOTONIC so that an NTP step or an operator changing the date never makes a
 * request wait forever or expire at once; timestamps that people read (log lines, event
 * origin_server_ts) come from CLOCK_REALTIME. Both are plain milliseconds in an int64_t.
 * This file deliberately has no notion of time zones or formatting: log.c formats.
 */
#include <time.h>

#include "core/runtime/runtime.h"

enum { RT_MS_PER_S = 1000, RT_NS_PER_MS = 1000000 };

static int64_t clock_ms(clockid_t id)
{
    struct timespec ts;
    /* clock_gettime cannot fail for these two clocks on Linux; if it ever did, every
     * deadline in the server would be wrong, so do not limp on. */
    int rc = clock_gettime(id, &ts);
    RT_ASSERT(rc == 0, "clock_gettime(%d) failed", (int)id);
    return (int64_t)ts.tv_sec * RT_MS_PER_S + ts.tv_nsec / RT_NS_PER_MS;
}

int64_t rt_now_ms(void)
{
    return clock_ms(CLOCK_MONOTONIC);
}

int64_t rt_wall_ms(void)
{
    return clock_ms(CLOCK_REALTIME);
}
