/* The shared cache of parsed PDUs (core/rooms/events_pdus.c): bounded by its slots and
 * by the size of what it keeps, least recently read out first, counted, right under
 * threads. */
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

#include "core/rooms/events_pdus.h"
#include "metric_fixture.h"

static void pdu_text(char *out, size_t cap, int i)
{
    snprintf(out, cap, "{\"type\":\"m.room.message\",\"content\":{\"body\":\"message %d\"}}", i);
}

static void test_a_full_cache_keeps_at_most_its_slots_and_the_newest_events_hit(void **state)
{
    (void)state;
    rt_metrics *reg = rt_metrics_new();
    events_pdus *p = events_pdus_new(reg, 8, 4096);
    assert_non_null(p);
    char id[32], text[128];
    for (int i = 0; i < 100; i++) { /* far past its 8 slots */
        snprintf(id, sizeof(id), "$event%d", i);
        pdu_text(text, sizeof(text), i);
        json_t *pdu = events_pdus_get(p, id, text);
        assert_non_null(pdu);
        char body[32];
        snprintf(body, sizeof(body), "message %d", i);
        const json_t *content = json_object_get(pdu, "content");
        assert_string_equal(json_string_value(json_object_get(content, "body")), body);
        events_pdus_put(p, pdu);
        assert_true(metric(reg, "atrium_events_pdu_cache_entries") <= 8);
    }
    assert_int_equal(metric(reg, "atrium_events_pdu_cache_misses_total"), 100);
    assert_int_equal(metric(reg, "atrium_events_pdu_cache_hits_total"), 0);
    assert_true(metric(reg, "atrium_events_pdu_cache_entries") >= 1);
    /* The last event asked is in its slot: the same object again, not parsed. */
    json_t *a = events_pdus_get(p, "$event99", "not even JSON: never parsed on a hit");
    json_t *b = events_pdus_get(p, "$event99", "not even JSON: never parsed on a hit");
    assert_non_null(a);
    assert_ptr_equal(a, b);
    assert_int_equal(metric(reg, "atrium_events_pdu_cache_hits_total"), 2);
    events_pdus_put(p, a);
    events_pdus_put(p, b);
    events_pdus_free(p);
    rt_metrics_free(reg);
}

static void test_a_pdu_past_the_size_bound_or_not_json_is_not_kept(void **state)
{
    (void)state;
    rt_metrics *reg = rt_metrics_new();
    events_pdus *p = events_pdus_new(reg, 8, 64);
    char text[256];
    pdu_text(text, sizeof(text), 1234567); /* 60 bytes: kept */
    json_t *small = events_pdus_get(p, "$small", text);
    assert_non_null(small);
    events_pdus_put(p, small);
    char big[512];
    snprintf(big, sizeof(big), "{\"content\":{\"body\":\"%0200d\"}}", 7); /* > 64 bytes */
    json_t *large = events_pdus_get(p, "$large", big);
    assert_non_null(large); /* parsed for the caller */
    events_pdus_put(p, large);
    assert_null(events_pdus_get(p, "$broken", "{\"content\":"));
    assert_int_equal(metric(reg, "atrium_events_pdu_cache_entries"), 1);
    large = events_pdus_get(p, "$large", big);
    events_pdus_put(p, large);
    assert_int_equal(metric(reg, "atrium_events_pdu_cache_hits_total"), 0); /* parsed again */
    assert_null(events_pdus_get(NULL, "$any", "[")); /* no cache: parsed, nothing kept */
    json_t *none = events_pdus_get(NULL, "$any", text);
    assert_non_null(none);
    events_pdus_put(NULL, none);
    events_pdus_free(p);
    rt_metrics_free(reg);
}

/* One set (4 slots): a new event takes the slot read least recently, not one just read. */
static void test_a_new_event_takes_the_slot_read_least_recently(void **state)
{
    (void)state;
    rt_metrics *reg = rt_metrics_new();
    assert_null(events_pdus_new(reg, 3, 4096)); /* less than one set */
    events_pdus *p = events_pdus_new(reg, 5, 4096); /* rounded down to one set of 4 */
    char id[32], text[128];
    for (int i = 1; i <= 5; i++) {
        if (i == 5) events_pdus_put(p, events_pdus_get(p, "$event1", "not JSON: a hit")); /* read again */
        snprintf(id, sizeof(id), "$event%d", i);
        pdu_text(text, sizeof(text), i);
        events_pdus_put(p, events_pdus_get(p, id, text));
    }
    assert_int_equal(metric(reg, "atrium_events_pdu_cache_entries"), 4);
    assert_int_equal(metric(reg, "atrium_events_pdu_cache_hits_total"), 1);
    /* $event2 was the least recently read when $event5 came: it went, $event1 stayed. */
    json_t *kept = events_pdus_get(p, "$event1", "not JSON: a hit");
    assert_non_null(kept);
    events_pdus_put(p, kept);
    long long misses = metric(reg, "atrium_events_pdu_cache_misses_total");
    assert_null(events_pdus_peek(p, "$event2")); /* not kept: NULL, and no miss counted */
    assert_int_equal(metric(reg, "atrium_events_pdu_cache_misses_total"), misses);
    assert_null(events_pdus_peek(NULL, "$event1"));
    assert_null(events_pdus_get(p, "$event2", "not JSON: it was parsed again"));
    for (int i = 3; i <= 5; i++) {
        snprintf(id, sizeof(id), "$event%d", i);
        json_t *pdu = i == 4 ? events_pdus_peek(p, id) : events_pdus_get(p, id, "not JSON: a hit");
        assert_non_null(pdu);
        events_pdus_put(p, pdu);
    }
    assert_int_equal(metric(reg, "atrium_events_pdu_cache_hits_total"), 5);
    events_pdus_free(p);
    rt_metrics_free(reg);
}

/* Threads asking for more events than there are slots: every answer is the right PDU. */
static events_pdus *g_shared;

static void *hammer(void *arg)
{
    int seed = *(int *)arg;
    char id[32], text[128], body[32];
    for (int n = 0; n < 4000; n++) {
        int i = (n * 7 + seed) % 48;
        snprintf(id, sizeof(id), "$event%d", i);
        pdu_text(text, sizeof(text), i);
        json_t *pdu = events_pdus_get(g_shared, id, text);
        snprintf(body, sizeof(body), "message %d", i);
        const char *got = json_string_value(json_object_get(json_object_get(pdu, "content"), "body"));
        bool right = got && strcmp(got, body) == 0;
        events_pdus_put(g_shared, pdu);
        if (!right) return (void *)1;
    }
    return NULL;
}

static void test_threads_sharing_the_cache_each_get_their_event(void **state)
{
    (void)state;
    rt_metrics *reg = rt_metrics_new();
    g_shared = events_pdus_new(reg, 16, 4096);
    pthread_t t[4];
    int seeds[4] = {0, 1, 2, 3};
    for (int i = 0; i < 4; i++) assert_int_equal(pthread_create(&t[i], NULL, hammer, &seeds[i]), 0);
    for (int i = 0; i < 4; i++) {
        void *bad = NULL;
        assert_int_equal(pthread_join(t[i], &bad), 0);
        assert_null(bad);
    }
    assert_int_equal(metric(reg, "atrium_events_pdu_cache_hits_total") +
                         metric(reg, "atrium_events_pdu_cache_misses_total"),
                     4 * 4000);
    assert_true(metric(reg, "atrium_events_pdu_cache_entries") <= 16);
    events_pdus_free(g_shared);
    rt_metrics_free(reg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_full_cache_keeps_at_most_its_slots_and_the_newest_events_hit),
        cmocka_unit_test(test_a_pdu_past_the_size_bound_or_not_json_is_not_kept),
        cmocka_unit_test(test_a_new_event_takes_the_slot_read_least_recently),
        cmocka_unit_test(test_threads_sharing_the_cache_each_get_their_event),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
