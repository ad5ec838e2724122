/*
 * plugins/media/timer.c - "call this at that time": the media plugin's one timer thread,
 * for work that must wait a while without holding a pool thread (a fetch the origin
 * answered 429 is asked again after its Retry-After: remote_fetch.c).
 *
 * One thread sleeps on a condition variable until the earliest entry is due, then calls
 * its function on the timer thread, outside the lock; the function must be quick (submit
 * the real work to a pool). Entries are kept in a list sorted by due time: there are few
 * (at most one per fetch that waits to be retried). At stop, entries not yet due are
 * called at once on the stopping thread, so their owners are cleaned up (a retried fetch
 * then finds its pool stopped, and ends and frees itself).
 *
 * What this file does not do: know what its entries are, or run anything slow.
 */
#include <stdlib.h>
#include <time.h>

#include "media.h"

typedef struct timer_entry {
    int64_t due_ms;
    void (*fn)(void *arg);
    void *arg;
    struct timer_entry *next;
} timer_entry;

struct media_timer {
    const atrium_host *h;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* a CLOCK_MONOTONIC condition variable (host->cond_init) */
    timer_entry *head; /* by due_ms, earliest first */
    bool quit;
    pthread_t thread;
};

static void *timer_main(void *arg)
{
    media_timer *t = arg;
    pthread_mutex_lock(&t->mu);
    while (!t->quit) {
        if (!t->head) {
            pthread_cond_wait(&t->cv, &t->mu);
            continue;
        }
        int64_t now = t->h->now_ms();
        if (t->head->due_ms > now) {
            int64_t d = t->head->due_ms;
            struct timespec ts = {.tv_sec = d / 1000, .tv_nsec = (d % 1000) * 1000000L};
            pthread_cond_timedwait(&t->cv, &t->mu, &ts);
            continue;
        }
        timer_entry *e = t->head;
        t->head = e->next;
        pthread_mutex_unlock(&t->mu);
        e->fn(e->arg);
        free(e);
        pthread_mutex_lock(&t->mu);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

media_timer *media_timer_start(const atrium_host *h)
{
    media_timer *t = calloc(1, sizeof(*t));
    if (!t) return NULL;
    t->h = h;
    pthread_mutex_init(&t->mu, NULL);
    if (h->cond_init(&t->cv) != 0) {
        pthread_mutex_destroy(&t->mu);
        free(t);
        return NULL;
    }
    if (pthread_create(&t->thread, NULL, timer_main, t) != 0) {
        pthread_cond_destroy(&t->cv);
        pthread_mutex_destroy(&t->mu);
        free(t);
        return NULL;
    }
    return t;
}

int media_timer_add(media_timer *t, int64_t due_ms, void (*fn)(void *arg), void *arg)
{
    timer_entry *e = calloc(1, sizeof(*e));
    if (!e) return ATRIUM_E_NOMEM;
    e->due_ms = due_ms;
    e->fn = fn;
    e->arg = arg;
    pthread_mutex_lock(&t->mu);
    if (t->quit) {
        pthread_mutex_unlock(&t->mu);
        free(e);
        return ATRIUM_E_STOPPED;
    }
    timer_entry **pp = &t->head;
    while (*pp && (*pp)->due_ms <= due_ms) pp = &(*pp)->next;
    e->next = *pp;
    *pp = e;
    if (t->head == e) pthread_cond_signal(&t->cv); /* a new earliest: sleep less */
    pthread_mutex_unlock(&t->mu);
    return 0;
}

void media_timer_stop(media_timer *t)
{
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    t->quit = true;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->thread, NULL);
    for (timer_entry *e = t->head, *next; e; e = next) {
        next = e->next;
        e->fn(e->arg);
        free(e);
    }
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    free(t);
}
