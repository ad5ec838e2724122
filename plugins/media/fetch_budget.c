/*
 * plugins/media/fetch_budget.c - the fetch budget of remote media and its fair parked
 * line (docs/adr/0005-remote-media-fetch-pool.md).
 *
 * Decisions owned here:
 *   - a request that must fetch takes a slot first: at most media_fetch_max_in_flight
 *     (running or queued on the fetch pool, all clients) and media_fetch_max_per_client
 *     for one client key (the user ID: the token was checked before). The slot is a hold,
 *     given back by the core when the request ends (last byte sent, client gone, failure);
 *   - over a cap the request waits in a line, parked (host->req_wait: no thread, nothing
 *     answered yet), up to media_fetch_line_per_client of one client; slots that come back
 *     go round-robin across the clients that wait, oldest first within a client, skipping
 *     clients at their own cap, so one client's 150 images cannot starve another's one;
 *   - past the line the answer is 429 M_LIMIT_EXCEEDED with retry_after_ms 1000 and
 *     Retry-After: 1, at once; media_fetch_line_per_client 0 is the ADR's original rule
 *     (no line: refuse over a cap at once);
 *   - a waiter's deadline is its request's (remote_deadline_ms): then 504, as for any
 *     remote media that did not arrive in time.
 * The bookkeeping is one mutex over a small table of client keys with slots or waiters;
 * wake-ups (req_wake) are sent after the mutex is released.
 */
#include <stdlib.h>
#include <string.h>

#include "media.h"

#define FETCH_CLIENT_BUCKETS 256
#define FETCH_KEY_MAX 256
#define FETCH_RETRY_AFTER_MS 1000 /* the ADR's answer over a cap */

typedef struct fetch_client fetch_client;

struct fetch_waiter {
    atrium_req *req;
    fetch_client *client;
    fetch_waiter *next;
    bool queued;  /* in its client's queue (under the budget's lock) */
    bool granted; /* a slot was passed to it */
};

struct fetch_client {
    char key[FETCH_KEY_MAX];
    int in_flight, waiting;
    fetch_waiter *head, *tail;
    fetch_client *next;                 /* hash chain */
    fetch_client *ring_next, *ring_prev; /* clients with waiters, in serving order */
    bool in_ring;
};

struct fetch_budget {
    pthread_mutex_t mu;
    int in_flight, waiting;
    fetch_client *buckets[FETCH_CLIENT_BUCKETS];
    fetch_client *ring; /* the client served next */
};

struct fetch_hold {
    media *m;
    fetch_client *client;
    atomic_bool released; /* given back early (fetch_budget_leave) or by the host */
};

int fetch_budget_init(media *m)
{
    m->budget = calloc(1, sizeof(*m->budget));
    if (!m->budget) return ATRIUM_E_NOMEM;
    pthread_mutex_init(&m->budget->mu, NULL);
    return 0;
}

void fetch_budget_fini(media *m)
{
    fetch_budget *b = m->budget;
    if (!b) return;
    for (size_t i = 0; i < FETCH_CLIENT_BUCKETS; i++) {
        fetch_client *c = b->buckets[i];
        while (c) {
            fetch_client *next = c->next;
            free(c);
            c = next;
        }
    }
    pthread_mutex_destroy(&b->mu);
    free(b);
    m->budget = NULL;
}

/* ---- the client table (under mu) ----------------------------------------------------- */

static fetch_client **client_slot(fetch_budget *b, const char *key)
{
    fetch_client **pp = &b->buckets[media_bucket(key) * 131u % FETCH_CLIENT_BUCKETS];
    while (*pp && strcmp((*pp)->key, key) != 0) pp = &(*pp)->next;
    return pp;
}

static fetch_client *client_get(fetch_budget *b, const char *key)
{
    fetch_client **pp = client_slot(b, key);
    if (*pp) return *pp;
    fetch_client *c = calloc(1, sizeof(*c));
    if (!c) return NULL;
    snprintf(c->key, sizeof(c->key), "%s", key);
    *pp = c;
    return c;
}

static void ring_remove(fetch_budget *b, fetch_client *c)
{
    if (!c->in_ring) return;
    if (c->ring_next == c) {
        b->ring = NULL;
    } else {
        c->ring_prev->ring_next = c->ring_next;
        c->ring_next->ring_prev = c->ring_prev;
        if (b->ring == c) b->ring = c->ring_next;
    }
    c->in_ring = false;
}

static void ring_add(fetch_budget *b, fetch_client *c)
{
    if (c->in_ring) return;
    if (!b->ring) {
        c->ring_next = c->ring_prev = c;
        b->ring = c;
    } else { /* last in the serving order */
        c->ring_next = b->ring;
        c->ring_prev = b->ring->ring_prev;
        b->ring->ring_prev->ring_next = c;
        b->ring->ring_prev = c;
    }
    c->in_ring = true;
}

/* Forget a client with nothing in flight and nobody waiting. */
static void client_maybe_free(fetch_budget *b, fetch_client *c)
{
    if (c->in_flight > 0 || c->waiting > 0) return;
    ring_remove(b, c);
    fetch_client **pp = client_slot(b, c->key);
    if (*pp == c) *pp = c->next;
    free(c);
}

static void unlink_waiter(fetch_client *c, fetch_waiter *w)
{
    fetch_waiter **pp = &c->head, *prev = NULL;
    while (*pp && *pp != w) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (!*pp) return;
    *pp = w->next;
    if (c->tail == w) c->tail = prev;
    w->queued = false;
    c->waiting--;
}

/* The rule: may this client take a slot now? */
static bool fetch_budget_allows(const media *m, const fetch_budget *b, const fetch_client *c)
{
    return b->in_flight < m->cfg.fetch_max_in_flight && c->in_flight < m->cfg.fetch_max_per_client;
}

/* Pass free slots to waiters, round-robin across clients; returns the waiters to wake
 * (linked through next) - the caller wakes them after unlocking. */
static fetch_waiter *grant_waiters(media *m, fetch_budget *b)
{
    fetch_waiter *wake = NULL;
    while (b->ring && b->in_flight < m->cfg.fetch_max_in_flight) {
        fetch_client *start = b->ring, *c = start, *found = NULL;
        do {
            if (c->head && fetch_budget_allows(m, b, c)) found = c;
            else c = c->ring_next;
        } while (!found && c != start);
        if (!found) break;
        fetch_waiter *w = found->head;
        unlink_waiter(found, w);
        w->granted = true;
        found->in_flight++;
        b->in_flight++;
        b->waiting--;
        b->ring = found->ring_next; /* the next client goes first next time */
        if (!found->head) ring_remove(b, found);
        w->next = wake;
        wake = w;
    }
    return wake;
}

/* The gauges (under mu): slots held, the most one client holds, requests waiting. */
static void publish(media *m, fetch_budget *b)
{
    int most = 0;
    for (size_t i = 0; i < FETCH_CLIENT_BUCKETS; i++)
        for (const fetch_client *c = b->buckets[i]; c; c = c->next)
            if (c->in_flight > most) most = c->in_flight;
    m->h->metric_set(m->m_fetch_in_flight, b->in_flight);
    m->h->metric_set(m->m_fetch_in_flight_client_max, most);
    m->h->metric_set(m->m_fetch_line_waiting, b->waiting);
}

static void wake_all(media *m, fetch_waiter *w)
{
    while (w) {
        fetch_waiter *next = w->next;
        m->h->req_wake(w->req);
        w = next;
    }
}

/* ---- holds ----------------------------------------------------------------------------- */

static void fetch_hold_release(void *arg)
{
    fetch_hold *hd = arg;
    if (atomic_exchange(&hd->released, true)) return;
    media *m = hd->m;
    fetch_budget *b = m->budget;
    pthread_mutex_lock(&b->mu);
    hd->client->in_flight--;
    b->in_flight--;
    fetch_waiter *wake = grant_waiters(m, b);
    client_maybe_free(b, hd->client);
    publish(m, b);
    pthread_mutex_unlock(&b->mu);
    wake_all(m, wake);
}

/* The slot is now the request's: as a hold. */
static int take_hold(media *m, atrium_req *req, media_req *st, fetch_client *c)
{
    fetch_hold *hd = m->h->req_alloc(req, sizeof(*hd));
    if (!hd) {
        fetch_hold stack = {.m = m, .client = c};
        fetch_hold_release(&stack);
        m->h->respond_error(req, 500, "M_UNKNOWN", "Out of memory");
        return ATRIUM_DONE;
    }
    hd->m = m;
    hd->client = c;
    atomic_init(&hd->released, false);
    st->fetch_slot = true;
    st->fetch_hold = hd;
    /* On failure the host released the hold at once: answer from here. */
    if (m->h->req_hold(req, fetch_hold_release, hd) < 0) {
        m->h->respond_error(req, 503, "M_UNKNOWN", "The request ended");
        return ATRIUM_DONE;
    }
    return MEDIA_GO;
}

static int deadline_answer(media *m, atrium_req *req, int reason)
{
    if (reason == ATRIUM_RUN_SHUTDOWN)
        m->h->respond_error(req, 503, "M_UNKNOWN", "The server is stopping");
    else
        m->h->respond_error(req, 504, "M_UNKNOWN",
                            "Timed out waiting for the remote server; retry later");
    return ATRIUM_DONE;
}

/* A run after waiting in the line: the slot it was granted (MEDIA_GO, when woken for it),
 * or the answer to its deadline or the shutdown. */
static int leave_line(media *m, atrium_req *req, media_req *st)
{
    fetch_budget *b = m->budget;
    int reason = m->h->req_run_reason(req);
    fetch_waiter *w = st->fw;
    pthread_mutex_lock(&b->mu);
    bool granted = w->granted, queued = w->queued;
    if (queued) {
        unlink_waiter(w->client, w);
        b->waiting--;
        client_maybe_free(b, w->client);
        publish(m, b);
    }
    pthread_mutex_unlock(&b->mu);
    if (queued) m->h->req_wake(req); /* our req_wait's one wake: nobody else will send it */
    st->fw = NULL;
    if (granted) {
        int rc = take_hold(m, req, st, w->client);
        if (rc != MEDIA_GO || reason == ATRIUM_RUN_WOKEN) return rc;
    }
    return deadline_answer(m, req, reason);
}

int fetch_budget_enter(media *m, atrium_req *req, media_req *st)
{
    const atrium_host *h = m->h;
    fetch_budget *b = m->budget;
    if (st->fetch_slot) return MEDIA_GO;
    if (st->fw) return leave_line(m, req, st);
    const char *key = h->req_client_key(req);
    enum { LINE_PARKED, LINE_SLOT, LINE_NOMEM, LINE_FULL, LINE_STOPPING } got = LINE_PARKED;
    fetch_waiter *w = NULL;
    pthread_mutex_lock(&b->mu);
    fetch_client *c = client_get(b, key ? key : "");
    if (!c) {
        got = LINE_NOMEM;
        goto out;
    }
    if (fetch_budget_allows(m, b, c) && !c->head) {
        c->in_flight++;
        b->in_flight++;
        publish(m, b);
        got = LINE_SLOT;
        goto out;
    }
    if (c->waiting >= m->cfg.fetch_line_per_client) {
        client_maybe_free(b, c);
        got = LINE_FULL;
        goto out;
    }
    w = h->req_alloc(req, sizeof(*w));
    if (!w || h->req_wait(req, st->remote_deadline_ms) < 0) {
        client_maybe_free(b, c);
        got = LINE_STOPPING;
        goto out;
    }
    memset(w, 0, sizeof(*w));
    w->req = req;
    w->client = c;
    w->queued = true;
    if (c->tail) c->tail->next = w;
    else c->head = w;
    c->tail = w;
    c->waiting++;
    b->waiting++;
    ring_add(b, c);
    st->fw = w;
    publish(m, b);
out:
    pthread_mutex_unlock(&b->mu);
    switch (got) {
    case LINE_SLOT: return take_hold(m, req, st, c);
    case LINE_NOMEM: return ATRIUM_E_NOMEM;
    case LINE_FULL:
        h->metric_add(m->m_fetch_line_refused, 1);
        h->respond_limited(req, FETCH_RETRY_AFTER_MS,
                           "Too many remote media fetches in flight; retry shortly");
        return ATRIUM_DONE;
    case LINE_STOPPING:
        h->respond_error(req, 503, "M_UNKNOWN", w ? "The server is stopping" : "Out of memory");
        return ATRIUM_DONE;
    case LINE_PARKED: break;
    }
    h->metric_add(m->m_fetch_line_waits, 1);
    return ATRIUM_PARKED;
}

void fetch_budget_leave(media *m, media_req *st)
{
    (void)m;
    if (st->fetch_hold) fetch_hold_release(st->fetch_hold);
}
