/*
 * core/runtime/scope.c - thread-local scope frames and the wait that honours them.
 *
 * Owns the scopes of docs/architecture.md: values published for the duration of a call
 * (request, client key, deadline, the lock the request holds, ...) live in frames on the
 * caller's stack, chained through one thread-local pointer. RT_SCOPE pushes a frame and its
 * cleanup attribute pops it, so no return, break or goto can leak one; popping anything but the
 * innermost frame is a bug that would corrupt every later lookup, so it aborts. Lookups walk
 * the chain (it is a handful of frames deep), innermost first, so an inner frame shadows an
 * outer one.
 *
 * rt_scope_wait is the one place that waits on a condition variable on behalf of a request:
 * it releases the ATRIUM_SCOPE_LOCK mutex for the duration, so a request waiting for (say) a
 * coalesced fetch never blocks others that need the lock it holds. Deliberately not here:
 * what the values mean (the HTTP layer publishes them) and copying them to another thread
 * (core/http pushes a handoff's values again on the receiving thread).
 */
#include <errno.h>
#include <time.h>

#include "core/runtime/runtime.h"

enum { RT_SCOPE_MS_PER_S = 1000, RT_SCOPE_NS_PER_MS = 1000000 };

/* The innermost frame of the calling thread; NULL when nothing is published. */
static _Thread_local rt_scope_frame *rt_scope_top;

void rt_scope_push(rt_scope_frame *f, int key, void *value)
{
    RT_ASSERT(f != NULL, "rt_scope_push: NULL frame");
    RT_ASSERT(key > 0 && key < ATRIUM_SCOPE__COUNT, "rt_scope_push: unknown key %d", key);
    f->outer = rt_scope_top;
    f->key = key;
    f->value = value;
    rt_scope_top = f;
}

void rt_scope_pop(rt_scope_frame *f)
{
    RT_ASSERT(f == rt_scope_top,
              "rt_scope_pop: frame %p (key %d) is not the innermost frame %p (key %d)",
              (void *)f, f ? f->key : 0, (void *)rt_scope_top,
              rt_scope_top ? rt_scope_top->key : 0);
    rt_scope_top = f->outer;
}

void *rt_scope_get(int key)
{
    for (const rt_scope_frame *f = rt_scope_top; f != NULL; f = f->outer) {
        if (f->key == key)
            return f->value;
    }
    return NULL;
}

bool rt_scope_has(int key)
{
    for (const rt_scope_frame *f = rt_scope_top; f != NULL; f = f->outer) {
        if (f->key == key)
            return true;
    }
    return false;
}

rt_scope_frame *rt_scope_current(void)
{
    return rt_scope_top;
}

void rt_scope_set_current(rt_scope_frame *top)
{
    rt_scope_top = top;
}

int rt_cond_init(pthread_cond_t *cv)
{
    pthread_condattr_t attr;
    if (pthread_condattr_init(&attr) != 0)
        return ATRIUM_E_IO;
    int rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    if (rc == 0)
        rc = pthread_cond_init(cv, &attr);
    pthread_condattr_destroy(&attr);
    return rc == 0 ? 0 : ATRIUM_E_IO;
}

int rt_scope_wait(pthread_cond_t *cv, pthread_mutex_t *m, int64_t deadline_ms)
{
    RT_ASSERT(cv != NULL && m != NULL, "rt_scope_wait: NULL cv or mutex");
    pthread_mutex_t *held = rt_scope_get(ATRIUM_SCOPE_LOCK);
    if (held == m)
        held = NULL; /* the wait itself releases m */
    if (held != NULL)
        pthread_mutex_unlock(held);

    int rc;
    if (deadline_ms > 0) {
        struct timespec ts = {
            .tv_sec = (time_t)(deadline_ms / RT_SCOPE_MS_PER_S),
            .tv_nsec = (long)(deadline_ms % RT_SCOPE_MS_PER_S) * RT_SCOPE_NS_PER_MS,
        };
        rc = pthread_cond_timedwait(cv, m, &ts);
    } else {
        rc = pthread_cond_wait(cv, m);
    }
    RT_ASSERT(rc == 0 || rc == ETIMEDOUT, "rt_scope_wait: condition wait failed (%d)", rc);

    if (held != NULL) {
        /* The published lock is taken before m everywhere (a request holds it, then waits
         * on m), so re-take it in that order: dropping m for a moment is harmless because
         * the caller re-checks its condition after every wake, as with any cv wait. */
        pthread_mutex_unlock(m);
        pthread_mutex_lock(held);
        pthread_mutex_lock(m);
    }
    return rc == ETIMEDOUT ? ATRIUM_E_TIMEOUT : 0;
}
