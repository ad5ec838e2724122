/*
 * tests/unit/test_fed_resolve_cache.c - the resolver's bounded caches: fresh entries are
 * hits, expired ones misses but still found (for stale use), a full cache drops its oldest
 * entry, and replacing an entry makes it the newest. Time is passed in: no sleeps.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "core/federation/transport/fed_resolve_internal.h"

static int *boxed(int v)
{
    int *p = malloc(sizeof *p);
    assert_non_null(p);
    *p = v;
    return p;
}

static void test_cache_fresh_is_a_hit_expired_is_a_miss_but_kept(void **state)
{
    (void)state;
    rt_metrics *m = rt_metrics_new();
    fed_resolve_cache c;
    assert_int_equal(fed_resolve_cache_init(&c, 8, m, "dns"), 0);
    fed_resolve_cache_put(&c, "a:x.test", boxed(1), 1000);
    int *v = fed_resolve_cache_get(&c, "a:x.test", 999);
    assert_non_null(v);
    assert_int_equal(*v, 1);
    assert_null(fed_resolve_cache_get(&c, "a:x.test", 1000));
    assert_null(fed_resolve_cache_get(&c, "a:other.test", 0));
    fed_resolve_cache_ent *e = fed_resolve_cache_find(&c, "a:x.test");
    assert_non_null(e);
    assert_int_equal(*(int *)e->val, 1);
    assert_int_equal(rt_metric_value(c.m_hits), 1);
    assert_int_equal(rt_metric_value(c.m_misses), 2);
    fed_resolve_cache_destroy(&c);
    rt_metrics_free(m);
}

static void test_cache_full_drops_the_oldest_and_replace_renews(void **state)
{
    (void)state;
    rt_metrics *m = rt_metrics_new();
    fed_resolve_cache c;
    assert_int_equal(fed_resolve_cache_init(&c, 3, m, "well_known"), 0);
    fed_resolve_cache_put(&c, "a", boxed(1), 100);
    fed_resolve_cache_put(&c, "b", boxed(2), 100);
    fed_resolve_cache_put(&c, "c", boxed(3), 100);
    fed_resolve_cache_put(&c, "a", boxed(10), 100); /* a is now the newest */
    fed_resolve_cache_put(&c, "d", boxed(4), 100);  /* so b goes */
    assert_null(fed_resolve_cache_find(&c, "b"));
    assert_int_equal(*(int *)fed_resolve_cache_get(&c, "a", 0), 10);
    assert_non_null(fed_resolve_cache_find(&c, "c"));
    assert_non_null(fed_resolve_cache_find(&c, "d"));
    assert_int_equal(rt_metric_value(c.m_size), 3);
    fed_resolve_cache_destroy(&c);
    rt_metrics_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cache_fresh_is_a_hit_expired_is_a_miss_but_kept),
        cmocka_unit_test(test_cache_full_drops_the_oldest_and_replace_renews),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
