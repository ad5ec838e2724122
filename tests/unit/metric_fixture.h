/*
 * tests/unit/metric_fixture.h - one unlabelled metric's value read from a registry's
 * rendering, for the unit tests of caches that count what they do (test_events_pdus.c,
 * test_ssync_cache.c).
 */
#ifndef ATRIUM_TESTS_UNIT_METRIC_FIXTURE_H
#define ATRIUM_TESTS_UNIT_METRIC_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime/runtime.h"

/* The value of one unlabelled metric in the registry's rendering (-1: absent). */
static inline long long metric(rt_metrics *reg, const char *name)
{
    size_t len = 0;
    char *text = rt_metrics_render(reg, &len);
    char want[128];
    snprintf(want, sizeof(want), "\n%s ", name);
    const char *at = text ? strstr(text, want) : NULL;
    long long v = at ? atoll(at + strlen(want)) : -1;
    free(text);
    return v;
}

#endif
