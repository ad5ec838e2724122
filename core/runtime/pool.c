/*
 * core/runtime/pool.c - named thread pools, bounded in threads and in queued tasks.
 *
 * Owns the pool rules (docs/architecture.md): at most `threads` workers, started as work
 * arrives and kept (ADR-0036: an idle server holds no thread for a pool it never used), a
 * FIFO queue of at most queue_depth tasks, and submission that never blocks - a full queue
 * or a stopped pool refuses at once so the caller can answer 429/503 instead of parking a
 * thread. A task queued when every worker is busy (or there is none) starts one more, up to
 * the limit; once a pool has a worker, a failure to start another only leaves the task
 * queued for the ones there are, and a pool that cannot start its first refuses.
 * For the handoff (suspend the connection, then enqueue) a caller reserves a queue slot first:
 * a reservation counts against the depth, so the later rt_pool_submit_reserved cannot fail.
 *
 * Every submitted task runs exactly once. After rt_pool_stop the workers drain the queue,
 * running what is left with cancelled=true (a handoff then only answers 503), and exit only
 * when the queue is empty and no reservation is outstanding, so a reservation taken before
 * the stop still reaches a worker. A pool that never started runs its leftovers inline in
 * rt_pool_stop (or in rt_pool_submit_reserved, after the stop), still cancelled.
 * Deliberately not here: what a task does with a request (core/http republishes its scope
 * values); each task starts with an empty scope chain.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime/runtime.h"

#define RT_POOL_MAX_THREADS 1024
#define RT_POOL_MAX_QUEUE_DEPTH (1 << 20)
#define RT_POOL_THREAD_NAME_BYTES 16 /* Linux limit, terminator included */

typedef struct rt_task {
    rt_task_fn fn;
    void *arg;
} rt_task;

struct rt_pool {
    char *name;
    int n_threads;
    int queue_depth;
    pthread_t *threads;
    int started;  /* threads created so far (threads[0..started)) */
    int live;     /* threads that have not exited their loop */
    int fresh;    /* created, not yet in their loop: each will take a queued task */
    int waiting;  /* workers asleep on `work` */
    bool running; /* rt_pool_start was called: tasks start workers from now on */
    bool told;    /* a failure to start a worker was logged (once per pool) */
    bool joined;

    pthread_mutex_t lock;
    pthread_cond_t work; /* queue gained a task, or stop, or last reservation gone */
    rt_task *ring;       /* queue_depth entries */
    int head, queued;
    int reserved;
    int busy;
    bool stopped;

    rt_metric *m_threads, *m_thread_limit, *m_busy, *m_queued, *m_queue_limit, *m_refused;
};

/* The pool whose worker the calling thread is, NULL elsewhere. */
static _Thread_local const rt_pool *rt_pool_self;

rt_pool *rt_pool_new(const char *name, int threads, int queue_depth, rt_metrics *metrics)
{
    RT_ASSERT(name != NULL, "rt_pool_new: NULL name");
    if (threads < 1 || threads > RT_POOL_MAX_THREADS || queue_depth < 1 ||
        queue_depth > RT_POOL_MAX_QUEUE_DEPTH) {
        rt_log(ATRIUM_LOG_ERROR, "core",
               "pool %s: %d threads / queue depth %d out of range (1..%d / 1..%d); fix the "
               "configuration",
               name, threads, queue_depth, RT_POOL_MAX_THREADS, RT_POOL_MAX_QUEUE_DEPTH);
        return NULL;
    }
    rt_pool *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return NULL;
    p->name = strdup(name);
    p->threads = calloc((size_t)threads, sizeof(pthread_t));
    p->ring = calloc((size_t)queue_depth, sizeof(rt_task));
    if (p->name == NULL || p->threads == NULL || p->ring == NULL)
        goto fail;
    p->n_threads = threads;
    p->queue_depth = queue_depth;
    if (pthread_mutex_init(&p->lock, NULL) != 0)
        goto fail;
    if (rt_cond_init(&p->work) != 0) {
        pthread_mutex_destroy(&p->lock);
        goto fail;
    }

    char labels[RT_METRIC_LABELS_MAX_BYTES];
    if (rt_metric_label(labels, sizeof(labels), "pool", name) < 0)
        labels[0] = '\0';
    p->m_threads = rt_metric_gauge(metrics, "atrium_pool_threads", labels,
                                   "Worker threads of the pool (started as work arrives).");
    p->m_thread_limit = rt_metric_gauge(metrics, "atrium_pool_threads_limit", labels,
                                        "Worker threads the pool may start.");
    p->m_busy = rt_metric_gauge(metrics, "atrium_pool_busy", labels,
                                "Workers running a task now.");
    p->m_queued = rt_metric_gauge(metrics, "atrium_pool_queued", labels,
                                  "Tasks waiting in the pool's queue.");
    p->m_queue_limit = rt_metric_gauge(metrics, "atrium_pool_queue_limit", labels,
                                       "Depth of the pool's queue.");
    p->m_refused = rt_metric_counter(metrics, "atrium_pool_refused_total", labels,
                                     "Submissions refused because the queue was full, the "
                                     "pool stopped or its first worker could not start.");
    rt_metric_set(p->m_threads, 0);
    rt_metric_set(p->m_thread_limit, threads);
    rt_metric_set(p->m_busy, 0);
    rt_metric_set(p->m_queued, 0);
    rt_metric_set(p->m_queue_limit, queue_depth);
    return p;
fail:
    free(p->name);
    free(p->threads);
    free(p->ring);
    free(p);
    return NULL;
}

static void *worker_main(void *arg);

/* One more worker, up to the limit. Caller holds p->lock (the new thread waits for it). */
static int spawn_locked(rt_pool *p)
{
    if (!p->running || p->stopped || p->started >= p->n_threads)
        return ATRIUM_E_STATE;
    int rc = pthread_create(&p->threads[p->started], NULL, worker_main, p);
    if (rc != 0) {
        if (!p->told)
            rt_log(ATRIUM_LOG_ERROR, "core",
                   "pool %s: could not start worker %d of %d (error %d); raise the process "
                   "or memory limits, or lower the pool's threads",
                   p->name, p->started + 1, p->n_threads, rc);
        p->told = true;
        return ATRIUM_E_IO;
    }
    char tname[RT_POOL_THREAD_NAME_BYTES];
    snprintf(tname, sizeof(tname), "%s", p->name);
    (void)pthread_setname_np(p->threads[p->started], tname); /* cosmetic (top -H, gdb) */
    p->started++;
    p->live++;
    p->fresh++;
    rt_metric_set(p->m_threads, p->started);
    return 0;
}

/* Caller holds p->lock. More tasks queued than workers free to take them: one more. */
static void push_locked(rt_pool *p, rt_task_fn fn, void *arg)
{
    RT_ASSERT(p->queued < p->queue_depth, "pool %s: queue overflow", p->name);
    p->ring[(p->head + p->queued) % p->queue_depth] = (rt_task){fn, arg};
    p->queued++;
    rt_metric_set(p->m_queued, p->queued);
    if (p->queued > p->waiting + p->fresh)
        (void)spawn_locked(p); /* best effort: the workers there are take it otherwise */
    pthread_cond_signal(&p->work);
}

/* Caller holds p->lock; returns false when the queue is empty. */
static bool pop_locked(rt_pool *p, rt_task *out)
{
    if (p->queued == 0)
        return false;
    *out = p->ring[p->head];
    p->head = (p->head + 1) % p->queue_depth;
    p->queued--;
    rt_metric_set(p->m_queued, p->queued);
    return true;
}

/* The admission rule shared by submit and reserve: refuse at once, never wait. A started
 * pool without a worker starts its first here, so what it admits has a thread to run it
 * (a reservation's later submit cannot fail). Caller holds p->lock. */
static int admit_locked(rt_pool *p)
{
    int rc = 0;
    if (p->stopped)
        rc = ATRIUM_E_STOPPED;
    else if (p->queued + p->reserved >= p->queue_depth)
        rc = ATRIUM_E_LIMIT;
    else if (p->running && p->live == 0)
        rc = spawn_locked(p);
    if (rc != 0)
        rt_metric_add(p->m_refused, 1);
    return rc;
}

/* Run one task with an empty scope chain, whichever thread runs it (a worker, or the
 * caller of stop/submit_reserved for leftovers), and give that thread its own chain back. */
static void run_task(rt_task t, bool cancelled)
{
    rt_scope_frame *saved = rt_scope_current();
    rt_scope_set_current(NULL);
    t.fn(t.arg, cancelled);
    rt_scope_set_current(saved);
}

static void *worker_main(void *arg)
{
    rt_pool *p = arg;
    rt_pool_self = p;
    pthread_mutex_lock(&p->lock);
    p->fresh--;
    for (;;) {
        rt_task t;
        if (pop_locked(p, &t)) {
            bool cancelled = p->stopped;
            p->busy++;
            rt_metric_set(p->m_busy, p->busy);
            pthread_mutex_unlock(&p->lock);
            run_task(t, cancelled);
            pthread_mutex_lock(&p->lock);
            p->busy--;
            rt_metric_set(p->m_busy, p->busy);
            continue;
        }
        if (p->stopped && p->reserved == 0)
            break; /* nothing queued and nothing can still be queued */
        p->waiting++;
        pthread_cond_wait(&p->work, &p->lock);
        p->waiting--;
    }
    p->live--;
    /* Wake the others so each sees the exit condition too. */
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->lock);
    rt_pool_self = NULL;
    return NULL;
}

/* From now on tasks start workers. What was queued or reserved before gets its workers
 * here (one per queued task up to the limit, one at least for a reservation); a failure to
 * start those is the caller's to handle (it stops and joins the pool). */
int rt_pool_start(rt_pool *p)
{
    int rc = 0;
    pthread_mutex_lock(&p->lock);
    if (p->running || p->stopped) {
        rc = ATRIUM_E_STATE;
        goto out;
    }
    p->running = true;
    int want = p->queued > 0 ? p->queued : (p->reserved > 0 ? 1 : 0);
    while (rc == 0 && p->started < want && p->started < p->n_threads)
        rc = spawn_locked(p);
out:
    pthread_mutex_unlock(&p->lock);
    return rc;
}

int rt_pool_submit(rt_pool *p, rt_task_fn fn, void *arg)
{
    RT_ASSERT(fn != NULL, "pool %s: NULL task", p->name);
    pthread_mutex_lock(&p->lock);
    int rc = admit_locked(p);
    if (rc == 0)
        push_locked(p, fn, arg);
    pthread_mutex_unlock(&p->lock);
    return rc;
}

int rt_pool_reserve(rt_pool *p)
{
    pthread_mutex_lock(&p->lock);
    int rc = admit_locked(p);
    if (rc == 0)
        p->reserved++;
    pthread_mutex_unlock(&p->lock);
    return rc;
}

void rt_pool_submit_reserved(rt_pool *p, rt_task_fn fn, void *arg)
{
    RT_ASSERT(fn != NULL, "pool %s: NULL task", p->name);
    pthread_mutex_lock(&p->lock);
    RT_ASSERT(p->reserved > 0, "pool %s: submit_reserved without a reservation", p->name);
    p->reserved--;
    /* Workers outlive every reservation, so no live worker means the pool stopped before
     * any thread started: nobody else will ever run it. */
    bool inline_run = p->stopped && p->live == 0;
    if (!inline_run)
        push_locked(p, fn, arg);
    pthread_mutex_unlock(&p->lock);
    if (inline_run)
        run_task((rt_task){fn, arg}, true);
}

void rt_pool_unreserve(rt_pool *p)
{
    pthread_mutex_lock(&p->lock);
    RT_ASSERT(p->reserved > 0, "pool %s: unreserve without a reservation", p->name);
    p->reserved--;
    if (p->reserved == 0 && p->stopped)
        pthread_cond_broadcast(&p->work); /* workers may be waiting only for this */
    pthread_mutex_unlock(&p->lock);
}

void rt_pool_stop(rt_pool *p)
{
    pthread_mutex_lock(&p->lock);
    p->stopped = true;
    pthread_cond_broadcast(&p->work);
    bool drain_here = p->live == 0;
    pthread_mutex_unlock(&p->lock);
    if (!drain_here)
        return;
    /* No worker will ever run the queue: run what is left here, cancelled. */
    for (;;) {
        rt_task t;
        pthread_mutex_lock(&p->lock);
        bool got = pop_locked(p, &t);
        pthread_mutex_unlock(&p->lock);
        if (!got)
            break;
        run_task(t, true);
    }
}

void rt_pool_join(rt_pool *p)
{
    RT_ASSERT(!rt_pool_on_worker(p), "pool %s: joined from its own worker", p->name);
    pthread_mutex_lock(&p->lock);
    RT_ASSERT(p->stopped, "pool %s: joined before stop", p->name);
    int started = p->started;
    bool joined = p->joined;
    p->joined = true;
    pthread_mutex_unlock(&p->lock);
    if (joined)
        return;
    for (int i = 0; i < started; i++)
        pthread_join(p->threads[i], NULL);
}

void rt_pool_free(rt_pool *p)
{
    if (p == NULL)
        return;
    RT_ASSERT(p->started == 0 || p->joined, "pool %s: freed before join", p->name);
    RT_ASSERT(p->queued == 0 && p->reserved == 0,
              "pool %s: freed with %d queued task(s) and %d reservation(s)", p->name,
              p->queued, p->reserved);
    pthread_cond_destroy(&p->work);
    pthread_mutex_destroy(&p->lock);
    free(p->name);
    free(p->threads);
    free(p->ring);
    free(p);
}

bool rt_pool_stopped(rt_pool *p)
{
    pthread_mutex_lock(&p->lock);
    bool stopped = p->stopped;
    pthread_mutex_unlock(&p->lock);
    return stopped;
}

bool rt_pool_on_worker(const rt_pool *p)
{
    return p != NULL && rt_pool_self == p;
}

const char *rt_pool_name(const rt_pool *p)
{
    return p->name;
}

int rt_pool_threads(const rt_pool *p)
{
    return p->n_threads;
}

int rt_pool_queued(rt_pool *p)
{
    pthread_mutex_lock(&p->lock);
    int n = p->queued;
    pthread_mutex_unlock(&p->lock);
    return n;
}

int rt_pool_busy(rt_pool *p)
{
    pthread_mutex_lock(&p->lock);
    int n = p->busy;
    pthread_mutex_unlock(&p->lock);
    return n;
}
