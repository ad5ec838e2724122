/* The store of kept sliding-sync room results (core/client/sync/ssync_cache.c): held full,
 * it keeps at most its budget of bytes, pushes out the least recently read entries of a
 * set, answers only at the stamp an entry was kept with, counts all of it, and stays right
 * under threads. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/sync/ssync.h"
#include "metric_fixture.h"

static const ssync_stamp STAMP = {10, 1, 0, 5, 0};

/* About 5 KiB of text naming i: a set's share holds fewer than its slots. */
static void text_of(char *out, size_t cap, int i)
{
    int n = snprintf(out, cap, "{\"room\":%d,\"pad\":\"", i);
    while ((size_t)n < cap - 4 && n < 5000) out[n++] = 'x';
    snprintf(out + n, cap - (size_t)n, "\"}");
}

static void test_held_full_it_keeps_its_budget_and_the_newest_entries(void **state)
{
    (void)state;
    rt_metrics *reg = rt_metrics_new();
    size_t budget = 4 * SSYNC_CACHE_SET_BYTES; /* four sets */
    ssync_cache *c = ssync_cache_new(reg, budget);
    assert_non_null(c);
    char key[64], text[5100];
    for (int i = 0; i < 2000; i++) { /* about 10 MB asked of a 256 KiB store */
        snprintf(key, sizeof(key), "@u:x\x1f" "D\x1f!room%d:x\x1f" "1\x1f", i);
        text_of(text, sizeof(text), i);
        ssync_cache_put(c, key, &STAMP, text);
        assert_true(ssync_cache_bytes(c) <= budget);
        assert_true(metric(reg, "atrium_sliding_sync_cache_bytes") <= (long long)budget);
        assert_true(metric(reg, "atrium_sliding_sync_cache_entries") <= 4 * SSYNC_CACHE_WAYS);
    }
    assert_true(metric(reg, "atrium_sliding_sync_cache_evicted_total") >= 2000 - 4 * SSYNC_CACHE_WAYS);
    assert_true(ssync_cache_bytes(c) > budget * 3 / 4); /* full, not emptied */
    /* The newest is kept and read back as written; the first was pushed out long ago. */
    char *got = ssync_cache_get(c, key, &STAMP);
    assert_non_null(got);
    assert_string_equal(got, text);
    free(got);
    assert_null(ssync_cache_get(c, "@u:x\x1f" "D\x1f!room0:x\x1f" "1\x1f", &STAMP));
    assert_int_equal(metric(reg, "atrium_sliding_sync_cache_hits_total"), 1);
    assert_int_equal(metric(reg, "atrium_sliding_sync_cache_misses_total"), 1);
    /* One larger than a set's share is not kept, and pushes nothing out. */
    size_t big_len = SSYNC_CACHE_SET_BYTES + 10;
    char *big = malloc(big_len + 1);
    memset(big, 'y', big_len);
    big[big_len] = '\0';
    long long before = metric(reg, "atrium_sliding_sync_cache_entries");
    ssync_cache_put(c, "big", &STAMP, big);
    assert_null(ssync_cache_get(c, "big", &STAMP));
    assert_int_equal(metric(reg, "atrium_sliding_sync_cache_entries"), before);
    free(big);
    ssync_cache_free(c);
    rt_metrics_free(reg);
}

static void test_an_entry_answers_only_at_its_stamp_and_goes_at_another(void **state)
{
    (void)state;
    rt_metrics *reg = rt_metrics_new();
    ssync_cache *c = ssync_cache_new(reg, SSYNC_CACHE_SET_BYTES);
    assert_non_null(c);
    ssync_cache_put(c, "k", &STAMP, "{\"a\":1}");
    ssync_stamp later = STAMP;
    later.receipt = 7; /* a receipt after it was kept */
    assert_null(ssync_cache_get(c, "k", &later));
    assert_int_equal(metric(reg, "atrium_sliding_sync_cache_entries"), 0); /* removed */
    assert_null(ssync_cache_get(c, "k", &STAMP));
    ssync_cache_put(c, "k", &later, "{\"a\":2}");
    ssync_cache_put(c, "k", &later, "{\"a\":3}"); /* replaces, not a second entry */
    assert_int_equal(metric(reg, "atrium_sliding_sync_cache_entries"), 1);
    long long bytes = (long long)(strlen("k") + strlen("{\"a\":3}") + 2);
    assert_int_equal(metric(reg, "atrium_sliding_sync_cache_bytes"), bytes);
    char *got = ssync_cache_get(c, "k", &later);
    assert_string_equal(got, "{\"a\":3}");
    free(got);
    ssync_cache_free(c);
    rt_metrics_free(reg);
}

static void test_a_set_pushes_out_its_least_recently_read_entry(void **state)
{
    (void)state;
    rt_metrics *reg = rt_metrics_new();
    ssync_cache *c = ssync_cache_new(reg, SSYNC_CACHE_SET_BYTES); /* one set */
    assert_non_null(c);
    char key[32];
    for (int i = 0; i < SSYNC_CACHE_WAYS; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        ssync_cache_put(c, key, &STAMP, "{}");
    }
    char *got = ssync_cache_get(c, "k0", &STAMP); /* read: now the newest */
    assert_non_null(got);
    free(got);
    ssync_cache_put(c, "new", &STAMP, "{}");
    assert_int_equal(metric(reg, "atrium_sliding_sync_cache_entries"), SSYNC_CACHE_WAYS);
    got = ssync_cache_get(c, "k0", &STAMP);
    assert_non_null(got);
    free(got);
    assert_null(ssync_cache_get(c, "k1", &STAMP)); /* the least recently read went */
    ssync_cache_free(c);
    rt_metrics_free(reg);
}

typedef struct worker {
    ssync_cache *c;
    int id;
    int wrong;
} worker;

static void *work(void *arg)
{
    worker *w = arg;
    char key[32], text[64];
    for (int i = 0; i < 3000; i++) {
        /* Mostly 24 keys, which fit the store (so reads hit whatever the threads'
         * timing), every tenth one of 5,000 others, which push entries out. */
        int k = i % 10 == 9 ? 1000 + (i * 13 + w->id) % 5000 : (i + w->id) % 24;
        snprintf(key, sizeof(key), "room%d", k);
        snprintf(text, sizeof(text), "{\"room\":%d}", k);
        char *got = ssync_cache_get(w->c, key, &STAMP);
        if (got && strcmp(got, text) != 0) w->wrong++;
        free(got);
        if (!got) ssync_cache_put(w->c, key, &STAMP, text);
    }
    return NULL;
}

static void test_threads_read_and_keep_at_once_and_read_only_what_was_kept(void **state)
{
    (void)state;
    rt_metrics *reg = rt_metrics_new();
    ssync_cache *c = ssync_cache_new(reg, 2 * SSYNC_CACHE_SET_BYTES);
    assert_non_null(c);
    pthread_t t[4];
    worker w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (worker){c, i, 0};
        assert_int_equal(pthread_create(&t[i], NULL, work, &w[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(w[i].wrong, 0);
    }
    long long hits = metric(reg, "atrium_sliding_sync_cache_hits_total");
    assert_true(hits > 0);
    assert_int_equal(hits + metric(reg, "atrium_sliding_sync_cache_misses_total"), 4 * 3000);
    assert_true(metric(reg, "atrium_sliding_sync_cache_entries") <= 2 * SSYNC_CACHE_WAYS);
    ssync_cache_free(c);
    rt_metrics_free(reg);
}

static void test_a_budget_below_one_set_keeps_nothing(void **state)
{
    (void)state;
    rt_metrics *reg = rt_metrics_new();
    assert_null(ssync_cache_new(reg, SSYNC_CACHE_SET_BYTES - 1));
    assert_null(ssync_cache_get(NULL, "k", &STAMP));
    ssync_cache_put(NULL, "k", &STAMP, "{}"); /* a no-op */
    rt_metrics_free(reg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_held_full_it_keeps_its_budget_and_the_newest_entries),
        cmocka_unit_test(test_an_entry_answers_only_at_its_stamp_and_goes_at_another),
        cmocka_unit_test(test_a_set_pushes_out_its_least_recently_read_entry),
        cmocka_unit_test(test_threads_read_and_keep_at_once_and_read_only_what_was_kept),
        cmocka_unit_test(test_a_budget_below_one_set_keeps_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
