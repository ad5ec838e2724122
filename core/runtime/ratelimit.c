/*
 * core/runtime/ratelimit.c - token buckets per client key, in a bounded table.
 *
 * Owns the rate-limiter rule (docs/architecture.md): each client key has a bucket of at most
 * `burst` tokens refilled continuously at `per_second`; a request takes one token or is refused
 * with the milliseconds until one is there (the retry_after_ms of the 429). Time is passed in,
 * so tests and callers decide the clock (core/http passes rt_now_ms()).
 *
 * The table is bounded by max_keys so that a flood of distinct addresses cannot grow it
 * without limit. A bucket that has refilled to full carries no state (a new bucket starts
 * full), so when the table is full such a bucket is dropped to make room; if none is full
 * yet, the newcomer is refused until the first one will be. To find a droppable bucket in
 * O(log n) instead of scanning the table, buckets sit in a min-heap ordered by the time
 * they will be full again. Deliberately not here: which action a request counts against and
 * whether a re-dispatched request is counted again (core/http reads the scope for that).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime/keytab.h"
#include "core/runtime/runtime.h"

#define RT_RATELIMIT_MS_PER_S 1000.0
#define RT_RATELIMIT_MAX_KEYS (1 << 22)
#define RT_RATELIMIT_HEAP_INITIAL 64

typedef struct rt_bucket {
    rt_keyent ent; /* first: the table hands back &ent */
    double tokens;
    int64_t last_ms;    /* when tokens was last brought up to date */
    int64_t full_at_ms; /* when tokens will be back to burst: the heap's order */
    size_t heap_i;
    char key[];
} rt_bucket;

struct rt_ratelimit {
    char *name;
    double per_second, burst;
    int max_keys;
    pthread_mutex_t lock;
    rt_keytab keys;
    rt_bucket **heap; /* min-heap on full_at_ms */
    size_t n, heap_cap;
    rt_metric *m_refused, *m_keys;
};

rt_ratelimit *rt_ratelimit_new(const char *name, double per_second, double burst,
                               int max_keys, rt_metrics *metrics)
{
    RT_ASSERT(name != NULL, "rt_ratelimit_new: NULL name");
    if (!(per_second > 0) || !isfinite(per_second) || !(burst >= 1) || !isfinite(burst) ||
        max_keys < 1 || max_keys > RT_RATELIMIT_MAX_KEYS) {
        rt_log(ATRIUM_LOG_ERROR, "core",
               "rate limit %s: per_second %g must be > 0, burst %g >= 1, max keys %d in "
               "1..%d; fix the configuration",
               name, per_second, burst, max_keys, RT_RATELIMIT_MAX_KEYS);
        return NULL;
    }
    rt_ratelimit *rl = calloc(1, sizeof(*rl));
    if (rl == NULL)
        return NULL;
    rl->name = strdup(name);
    if (rl->name == NULL || rt_keytab_init(&rl->keys, (size_t)max_keys) != 0) {
        free(rl->name);
        free(rl);
        return NULL;
    }
    if (pthread_mutex_init(&rl->lock, NULL) != 0) {
        rt_keytab_destroy(&rl->keys);
        free(rl->name);
        free(rl);
        return NULL;
    }
    rl->per_second = per_second;
    rl->burst = burst;
    rl->max_keys = max_keys;

    char labels[RT_METRIC_LABELS_MAX_BYTES];
    if (rt_metric_label(labels, sizeof(labels), "action", name) < 0)
        labels[0] = '\0';
    rl->m_refused = rt_metric_counter(metrics, "atrium_ratelimit_refused_total", labels,
                                      "Requests refused by the rate limiter.");
    rl->m_keys = rt_metric_gauge(metrics, "atrium_ratelimit_keys", labels,
                                 "Client keys the rate limiter tracks now.");
    rt_metric_set(rl->m_keys, 0);
    return rl;
}

/* ---- the heap of buckets by full_at_ms (caller holds rl->lock) ----------------------- */

static void heap_place(rt_ratelimit *rl, size_t i, rt_bucket *b)
{
    rl->heap[i] = b;
    b->heap_i = i;
}

static void heap_fix(rt_ratelimit *rl, size_t i)
{
    rt_bucket *b = rl->heap[i];
    while (i > 0 && rl->heap[(i - 1) / 2]->full_at_ms > b->full_at_ms) {
        heap_place(rl, i, rl->heap[(i - 1) / 2]);
        i = (i - 1) / 2;
    }
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= rl->n)
            break;
        if (c + 1 < rl->n && rl->heap[c + 1]->full_at_ms < rl->heap[c]->full_at_ms)
            c++;
        if (rl->heap[c]->full_at_ms >= b->full_at_ms)
            break;
        heap_place(rl, i, rl->heap[c]);
        i = c;
    }
    heap_place(rl, i, b);
}

static bool heap_push(rt_ratelimit *rl, rt_bucket *b)
{
    if (rl->n == rl->heap_cap) {
        size_t cap = rl->heap_cap ? rl->heap_cap * 2 : RT_RATELIMIT_HEAP_INITIAL;
        rt_bucket **h = realloc(rl->heap, cap * sizeof(rt_bucket *));
        if (h == NULL)
            return false;
        rl->heap = h;
        rl->heap_cap = cap;
    }
    heap_place(rl, rl->n++, b);
    heap_fix(rl, b->heap_i);
    return true;
}

static void heap_remove(rt_ratelimit *rl, rt_bucket *b)
{
    size_t i = b->heap_i;
    RT_ASSERT(i < rl->n && rl->heap[i] == b, "rate limit %s: bucket not in heap", rl->name);
    rt_bucket *last = rl->heap[--rl->n];
    if (last != b) {
        heap_place(rl, i, last);
        heap_fix(rl, i);
    }
}

/* ---- buckets ------------------------------------------------------------------------- */

/* Bring tokens up to now and recompute when the bucket will be full. A clock that goes
 * backwards (an injected time in a test, a caller's stale now) adds nothing. */
static void refill(const rt_ratelimit *rl, rt_bucket *b, int64_t now_ms)
{
    if (now_ms > b->last_ms) {
        b->tokens += (double)(now_ms - b->last_ms) * rl->per_second / RT_RATELIMIT_MS_PER_S;
        if (b->tokens > rl->burst)
            b->tokens = rl->burst;
        b->last_ms = now_ms;
    }
}

static void update_full_at(const rt_ratelimit *rl, rt_bucket *b)
{
    double missing = rl->burst - b->tokens;
    b->full_at_ms = b->last_ms;
    if (missing > 0)
        b->full_at_ms += (int64_t)ceil(missing * RT_RATELIMIT_MS_PER_S / rl->per_second);
}

static void bucket_drop(rt_ratelimit *rl, rt_bucket *b)
{
    heap_remove(rl, b);
    rt_keytab_remove(&rl->keys, &b->ent);
    free(b);
}

/* Make room for one more key: drop the bucket that is full soonest if it is full by now.
 * Returns 0, or the milliseconds until a bucket will be droppable. */
static int64_t make_room_locked(rt_ratelimit *rl, int64_t now_ms)
{
    if (rl->n < (size_t)rl->max_keys)
        return 0;
    rt_bucket *soonest = rl->heap[0];
    if (soonest->full_at_ms > now_ms)
        return soonest->full_at_ms - now_ms;
    bucket_drop(rl, soonest);
    return 0;
}

int64_t rt_ratelimit_check(rt_ratelimit *rl, const char *key, int64_t now_ms)
{
    RT_ASSERT(key != NULL, "rate limit %s: NULL client key", rl->name);
    uint64_t hash = rt_keytab_hash(&rl->keys, key);
    int64_t retry_ms = 0;
    pthread_mutex_lock(&rl->lock);
    rt_bucket *b = (rt_bucket *)rt_keytab_find(&rl->keys, key, hash);
    if (b != NULL) {
        refill(rl, b, now_ms);
    } else {
        retry_ms = make_room_locked(rl, now_ms);
        if (retry_ms > 0)
            goto out;
        size_t len = strlen(key);
        b = calloc(1, sizeof(*b) + len + 1);
        if (b == NULL) {
            retry_ms = (int64_t)ceil(RT_RATELIMIT_MS_PER_S / rl->per_second);
            goto out;
        }
        memcpy(b->key, key, len + 1);
        b->ent.key = b->key;
        b->ent.hash = hash;
        b->tokens = rl->burst; /* a new bucket is a full one */
        b->last_ms = now_ms;
        update_full_at(rl, b);
        if (!heap_push(rl, b)) {
            free(b);
            retry_ms = (int64_t)ceil(RT_RATELIMIT_MS_PER_S / rl->per_second);
            goto out;
        }
        rt_keytab_insert(&rl->keys, &b->ent);
    }
    if (b->tokens >= 1.0) {
        b->tokens -= 1.0;
    } else {
        retry_ms = (int64_t)ceil((1.0 - b->tokens) * RT_RATELIMIT_MS_PER_S / rl->per_second);
        if (retry_ms < 1)
            retry_ms = 1;
    }
    update_full_at(rl, b);
    heap_fix(rl, b->heap_i);
out:
    if (retry_ms > 0)
        rt_metric_add(rl->m_refused, 1);
    rt_metric_set(rl->m_keys, (int64_t)rl->n);
    pthread_mutex_unlock(&rl->lock);
    return retry_ms;
}

int rt_ratelimit_keys(rt_ratelimit *rl)
{
    pthread_mutex_lock(&rl->lock);
    int n = (int)rl->n;
    pthread_mutex_unlock(&rl->lock);
    return n;
}

void rt_ratelimit_free(rt_ratelimit *rl)
{
    if (rl == NULL)
        return;
    while (rl->n > 0)
        bucket_drop(rl, rl->heap[rl->n - 1]);
    rt_keytab_destroy(&rl->keys);
    pthread_mutex_destroy(&rl->lock);
    free(rl->heap);
    free(rl->name);
    free(rl);
}
