/*
 * core/http/suspend.c - requests that wait without a thread: parking on an event, waiting
 * in an admission line, and handoff to a pool; the deadline timer that libmicrohttpd does
 * not provide for suspended connections; and shutdown of all of them.
 *
 * The rule this file owns: every suspend ends in exactly one resume. A suspended request
 * can be ended by several parties (a waker, a line releasing a slot, a pool worker, the
 * deadline timer, shutdown). Two mechanisms make exactly one of them win:
 *   - detach: a parked request is linked in exactly one waiting structure (an event's
 *     list or a line). Whoever unlinks it (the waker, the line's release, or the timer)
 *     is the one who resumes it; the others find it gone and do nothing.
 *   - state: susp_resume moves SUSPENDED -> RESUMING under the request's lock; a second
 *     caller (a pool worker finishing after the deadline answered 504) sees RESUMING and
 *     drops its response.
 *   - for a route flagged ATRIUM_ROUTE_COMMITS, a handoff's deadline (and shutdown)
 *     refuses only work that has not started: once a pool task runs the handler
 *     (worker_running, set under the request's lock where the task finds the request
 *     still suspended), the task alone answers. Otherwise a 504 could go out while the
 *     work commits, the request would complete under it and its holds (an upload's
 *     temporary file) be released beneath the work: the client told "failed" about work
 *     that was done, and a descriptor closed twice. Such work bounds its own waits (the
 *     database pool cuts a wait on a silent PostgreSQL: core/store/db.h).
 *   - a response that waits for its bytes (SUSP_STREAM, host->respond_stream_wait) is
 *     linked on its event like a park, and resumed without running anything again: the
 *     content reader is simply called again; its deadline cuts the response instead.
 * Lifetimes: a suspended request cannot complete (libmicrohttpd only completes it after a
 * resume), so whoever finds it linked may take a reference before unlocking.
 * Lock order: request mu -> event mu / line lock / timer mu. Never the reverse.
 *
 * What this file does not do: decide what to answer (handlers do, when they run again),
 * or queue responses (server.c does, on the connection's own thread).
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include "core/http/http.h"

#define PARK_MAX_MS (10 * 60 * 1000)
#define SHUTDOWN_EXPIRE_WAIT_MS 5000

struct atrium_event {
    http_server *srv;
    pthread_mutex_t mu;
    atrium_req *head;
    uint64_t gen; /* signals so far (mu): a waiting stream compares it (susp_stream_wait) */
    struct atrium_event *next_all;
};

typedef struct heap_item {
    int64_t deadline;
    atrium_req *r;
} heap_item;

struct susp_timer {
    http_server *srv;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_cond_t empty_cv;
    heap_item *heap;
    size_t n, cap;
    bool quit, stopping;
    pthread_t thread;
};

/* ---- deadline heap (timer mu held) -------------------------------------------------- */

static void heap_swap(susp_timer *t, size_t a, size_t b)
{
    heap_item tmp = t->heap[a];
    t->heap[a] = t->heap[b];
    t->heap[b] = tmp;
    t->heap[a].r->heap_idx = a;
    t->heap[b].r->heap_idx = b;
}

static void heap_up(susp_timer *t, size_t i)
{
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (t->heap[p].deadline <= t->heap[i].deadline) break;
        heap_swap(t, p, i);
        i = p;
    }
}

static void heap_down(susp_timer *t, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, rr = l + 1, m = i;
        if (l < t->n && t->heap[l].deadline < t->heap[m].deadline) m = l;
        if (rr < t->n && t->heap[rr].deadline < t->heap[m].deadline) m = rr;
        if (m == i) break;
        heap_swap(t, i, m);
        i = m;
    }
}

static void heap_remove_locked(susp_timer *t, atrium_req *r)
{
    size_t i = r->heap_idx;
    if (i == SIZE_MAX) return;
    r->heap_idx = SIZE_MAX;
    t->n--;
    if (i != t->n) {
        t->heap[i] = t->heap[t->n];
        t->heap[i].r->heap_idx = i;
        heap_down(t, i);
        heap_up(t, i);
    }
    if (t->n == 0) pthread_cond_broadcast(&t->empty_cv);
}

static void heap_insert(susp_timer *t, atrium_req *r, int64_t deadline)
{
    pthread_mutex_lock(&t->mu);
    heap_remove_locked(t, r);
    if (t->stopping) deadline = 0; /* shutdown: expire at once */
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 256;
        heap_item *n = realloc(t->heap, cap * sizeof(*n));
        if (!n) {
            /* Cannot track its deadline: a suspended request nobody would ever answer is
             * worse than a loud crash, so stop here. */
            rt_log(ATRIUM_LOG_ERROR, "core", "out of memory tracking a deadline");
            abort();
        }
        t->heap = n;
        t->cap = cap;
    }
    t->heap[t->n] = (heap_item){.deadline = deadline, .r = r};
    r->heap_idx = t->n;
    heap_up(t, t->n++);
    if (r->heap_idx == 0) pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

static void heap_remove(susp_timer *t, atrium_req *r)
{
    pthread_mutex_lock(&t->mu);
    heap_remove_locked(t, r);
    pthread_mutex_unlock(&t->mu);
}

/* ---- suspend and resume ------------------------------------------------------------- */

void susp_suspend(atrium_req *r, int kind, int64_t deadline_ms)
{
    /* Caller holds r->mu. */
    if (r->susp == SUSP_ACTIVE) {
        MHD_suspend_connection(r->conn);
        r->susp = SUSP_SUSPENDED;
        rt_metric_add(kind == SUSP_HANDOFF ? r->srv->m_handed_off : r->srv->m_parked, 1);
    } else if (r->susp_kind != kind) {
        /* A handler on a pool parks: move it from one gauge to the other. */
        rt_metric_add(r->susp_kind == SUSP_HANDOFF ? r->srv->m_handed_off : r->srv->m_parked, -1);
        rt_metric_add(kind == SUSP_HANDOFF ? r->srv->m_handed_off : r->srv->m_parked, 1);
    }
    r->susp_kind = kind;
    r->susp_deadline = deadline_ms;
    r->worker_running = false; /* waiting again: its new deadline applies */
    heap_insert(r->srv->timer, r, deadline_ms);
}

/* Under r->mu, r suspended: SUSPENDED -> RESUMING with what to do. The caller unlocks,
 * then calls MHD_resume_connection (or http_resume). */
static void resume_locked(atrium_req *r, int action, int reason, int status,
                          struct MHD_Response *resp)
{
    rt_metric_add(r->susp_kind == SUSP_HANDOFF ? r->srv->m_handed_off : r->srv->m_parked, -1);
    r->susp = SUSP_RESUMING;
    r->action = action;
    r->resume_reason = reason;
    r->resume_status = status;
    r->resume_response = resp;
    heap_remove(r->srv->timer, r);
}

bool susp_resume(atrium_req *r, int action, int reason, int status, struct MHD_Response *resp)
{
    pthread_mutex_lock(&r->mu);
    if (r->susp != SUSP_SUSPENDED) {
        pthread_mutex_unlock(&r->mu);
        if (resp) MHD_destroy_response(resp);
        return false;
    }
    resume_locked(r, action, reason, status, resp);
    pthread_mutex_unlock(&r->mu);
    http_resume(r, action); /* a woken run may wait in its worker's line (resume_line.c) */
    return true;
}

static struct MHD_Response *unavailable(const char *msg)
{
    return http_error_response(503, "M_UNKNOWN", msg, 0);
}

/* ---- events ------------------------------------------------------------------------- */

struct atrium_event *susp_event_new(http_server *s)
{
    struct atrium_event *ev = calloc(1, sizeof(*ev));
    if (!ev) return NULL;
    ev->srv = s;
    pthread_mutex_init(&ev->mu, NULL);
    pthread_mutex_lock(&s->events_mu);
    ev->next_all = s->events;
    s->events = ev;
    pthread_mutex_unlock(&s->events_mu);
    return ev;
}

void susp_events_free(http_server *s)
{
    pthread_mutex_lock(&s->events_mu);
    struct atrium_event *ev = s->events;
    s->events = NULL;
    pthread_mutex_unlock(&s->events_mu);
    while (ev) {
        struct atrium_event *next = ev->next_all;
        pthread_mutex_destroy(&ev->mu);
        free(ev);
        ev = next;
    }
}

/* ev->mu held. */
static void event_unlink_locked(struct atrium_event *ev, atrium_req *r)
{
    if (r->ev_prev) r->ev_prev->ev_next = r->ev_next;
    else ev->head = r->ev_next;
    if (r->ev_next) r->ev_next->ev_prev = r->ev_prev;
    r->ev_prev = r->ev_next = NULL;
    r->ev_linked = false;
}

/* Put r at the head of ev's waiters (the twin of the unlink above). Both r->mu and ev->mu
 * held. */
static void event_link_locked(struct atrium_event *ev, atrium_req *r)
{
    r->ev = ev;
    r->ev_prev = NULL;
    r->ev_next = ev->head;
    if (ev->head) ev->head->ev_prev = r;
    ev->head = r;
    r->ev_linked = true;
}

int susp_park(atrium_req *r, struct atrium_event *ev, int64_t deadline_ms)
{
    if (!ev) return ATRIUM_E_INVAL;
    if (atomic_load(&r->srv->stopping)) return ATRIUM_E_STOPPED;
    int64_t cap = rt_now_ms() + PARK_MAX_MS;
    if (deadline_ms > cap) deadline_ms = cap;
    pthread_mutex_lock(&r->mu);
    pthread_mutex_lock(&ev->mu);
    event_link_locked(ev, r);
    pthread_mutex_unlock(&ev->mu);
    susp_suspend(r, SUSP_PARK, deadline_ms);
    pthread_mutex_unlock(&r->mu);
    return 0;
}

/* ---- streams that wait for their bytes ---------------------------------------------- */
/* A response being sent whose reader has no bytes yet (ATRIUM_STREAM_WAIT) waits like a
 * park: linked on an event, the connection suspended (libmicrohttpd allows that from
 * inside a content reader), its deadline in the heap. Unlike a park nothing runs again:
 * resuming only lets libmicrohttpd call the reader again; a cut one (deadline, shutdown)
 * finds stream_cut set and ends the response before its end. The detach rule holds as
 * for parks: whoever unlinks it from the event resumes it. */

uint64_t susp_event_gen(struct atrium_event *ev)
{
    pthread_mutex_lock(&ev->mu);
    uint64_t gen = ev->gen;
    pthread_mutex_unlock(&ev->mu);
    return gen;
}

bool susp_stream_wait(atrium_req *r, struct atrium_event *ev, uint64_t gen, int64_t deadline_ms)
{
    int64_t cap = rt_now_ms() + PARK_MAX_MS;
    if (deadline_ms > cap) deadline_ms = cap;
    pthread_mutex_lock(&r->mu);
    pthread_mutex_lock(&ev->mu);
    if (ev->gen != gen) { /* bytes may have landed since the read: read again */
        pthread_mutex_unlock(&ev->mu);
        pthread_mutex_unlock(&r->mu);
        return false;
    }
    event_link_locked(ev, r);
    pthread_mutex_unlock(&ev->mu);
    /* Still under r->mu: a waker that unlinked us meanwhile waits here, then resumes. */
    MHD_suspend_connection(r->conn);
    r->susp = SUSP_SUSPENDED;
    r->susp_kind = SUSP_STREAM;
    r->susp_deadline = deadline_ms;
    rt_metric_add(r->srv->m_streams_waiting, 1);
    heap_insert(r->srv->timer, r, deadline_ms);
    pthread_mutex_unlock(&r->mu);
    return true;
}

/* Resume a waiting stream (cut: its deadline or shutdown). false when r is not one. */
static bool stream_resume(atrium_req *r, bool cut)
{
    pthread_mutex_lock(&r->mu);
    if (r->susp != SUSP_SUSPENDED || r->susp_kind != SUSP_STREAM) {
        pthread_mutex_unlock(&r->mu);
        return false;
    }
    /* Straight back to ACTIVE: no handler runs, so nobody else would. Nobody can resume
     * it twice: the reader runs (and may wait again) only after the resume below. */
    r->susp = SUSP_ACTIVE;
    r->susp_kind = SUSP_NONE;
    if (cut) {
        r->stream_cut = true;
        rt_metric_add(r->srv->m_streams_cut, 1);
    }
    rt_metric_add(r->srv->m_streams_waiting, -1);
    heap_remove(r->srv->timer, r);
    pthread_mutex_unlock(&r->mu);
    MHD_resume_connection(r->conn);
    return true;
}

bool susp_stream_cut(atrium_req *r)
{
    pthread_mutex_lock(&r->mu);
    bool cut = r->stream_cut;
    pthread_mutex_unlock(&r->mu);
    return cut;
}

int susp_event_signal(struct atrium_event *ev)
{
    pthread_mutex_lock(&ev->mu);
    ev->gen++;
    atrium_req *list = ev->head;
    ev->head = NULL;
    for (atrium_req *r = list; r; r = r->ev_next) {
        http_req_ref(r);
        r->ev_linked = false;
    }
    pthread_mutex_unlock(&ev->mu);
    int woken = 0;
    while (list) {
        atrium_req *r = list;
        list = r->ev_next;
        r->ev_next = r->ev_prev = NULL;
        if (stream_resume(r, false) || susp_resume(r, ACT_REDISPATCH, ATRIUM_RUN_WOKEN, 0, NULL))
            woken++;
        http_req_unref(r);
    }
    return woken;
}

int susp_wait(atrium_req *r, int64_t deadline_ms)
{
    if (atomic_load(&r->srv->stopping)) return ATRIUM_E_STOPPED;
    int64_t cap = rt_now_ms() + PARK_MAX_MS;
    if (deadline_ms > cap) deadline_ms = cap;
    http_req_ref(r); /* the waker's */
    pthread_mutex_lock(&r->mu);
    r->wait_linked = true;
    susp_suspend(r, SUSP_WAIT, deadline_ms);
    pthread_mutex_unlock(&r->mu);
    return 0;
}

void susp_wake(atrium_req *r)
{
    pthread_mutex_lock(&r->mu);
    bool mine = r->wait_linked; /* the deadline may have taken it first */
    r->wait_linked = false;
    pthread_mutex_unlock(&r->mu);
    if (mine) susp_resume(r, ACT_REDISPATCH, ATRIUM_RUN_WOKEN, 0, NULL);
    http_req_unref(r);
}

/* ---- waiting on a flight (core/runtime/flight.h) ---------------------------------------- */

/* A request's wait on one flight, in request memory (valid until susp_wake's unref). */
typedef struct susp_flight_wait {
    rt_flight_waiter w;
    atrium_req *r;
    rt_flight *f;
    bool left; /* its deadline or shutdown answered it; the flight goes on */
    struct susp_flight_wait *next;
} susp_flight_wait;

/* Under the flight table's lock: park before the flight can end. */
static int flight_arm(void *arg)
{
    susp_flight_wait *fw = arg;
    return susp_wait(fw->r, fw->w.deadline_ms);
}

static void flight_done(void *arg)
{
    susp_flight_wait *fw = arg;
    susp_wake(fw->r);
}

static void flight_hold_release(void *arg)
{
    susp_flight_wait *fw = arg;
    rt_flight_unref(fw->f);
}

int susp_flight_join(atrium_req *r, rt_flights *t, const char *key, int64_t deadline_ms,
                     unsigned flags, rt_flight **out)
{
    int64_t cap = rt_now_ms() + PARK_MAX_MS;
    susp_flight_wait *fw = rt_arena_alloc(r->arena, sizeof(*fw));
    if (!fw) return ATRIUM_E_NOMEM;
    fw->r = r;
    fw->w = (rt_flight_waiter){.arm = flight_arm, .done = flight_done, .arg = fw,
                               .deadline_ms = deadline_ms < cap ? deadline_ms : cap};
    int rc = rt_flight_join(t, key, flags, &fw->w, &fw->f);
    if (rc < 0) return rc;
    fw->next = r->flight_waits;
    r->flight_waits = fw;
    /* Out of memory releases the hold at once: keep the reference then (a leak beats a
     * flight freed under a request that reads its result). */
    if (http_req_add_hold(r, flight_hold_release, fw) < 0) rt_flight_ref(fw->f);
    *out = fw->f;
    return rc;
}

int susp_flight_result(atrium_req *r, rt_flight *f, int *result, void **value)
{
    susp_flight_wait *fw = r->flight_waits;
    while (fw && fw->f != f) fw = fw->next;
    if (!fw) return ATRIUM_E_INVAL;
    int why = r->run_reason == ATRIUM_RUN_SHUTDOWN ? ATRIUM_E_STOPPED : ATRIUM_E_TIMEOUT;
    if (fw->left) return why;
    if (rt_flight_leave(&fw->w)) {
        /* Unlinked before the end: its done will never come, so the wait's one wake (which
         * finds the request resumed already and only drops its reference) is ours. */
        fw->left = true;
        susp_wake(r);
        return why;
    }
    /* Handed over (its done has run or is running, or the join found the early result
     * out): the end's result, final, or the early one. */
    return rt_flight_waiter_result(&fw->w, result, value);
}

/* ---- admission lines ---------------------------------------------------------------- */

void susp_line_release(rt_line *line, const char *holder)
{
    rt_line_waiter *w = rt_line_release_for(line, holder);
    if (!w) return;
    /* The slot passed to w: we unlinked it, so we resume it (nobody else will). */
    atrium_req *r = w->ctx;
    susp_resume(r, ACT_REDISPATCH, ATRIUM_RUN_GRANTED, 0, NULL);
}

typedef struct line_hold {
    rt_line *line;
    const char *holder; /* the waiter's key (the request's arena: outlives its holds) */
} line_hold;

static void line_hold_release(void *arg)
{
    line_hold *lh = arg;
    susp_line_release(lh->line, lh->holder);
}

/* The slot becomes a hold: given back after the last byte or when the client leaves. */
static int line_take_hold(atrium_req *r, rt_line *line)
{
    line_hold *lh = rt_arena_alloc(r->arena, sizeof(*lh));
    if (!lh) {
        susp_line_release(line, r->waiter.key);
        return ATRIUM_E_NOMEM;
    }
    lh->line = line;
    lh->holder = r->waiter.key;
    int rc = http_req_add_hold(r, line_hold_release, lh);
    return rc == 0 ? ATRIUM_OK : rc;
}

int susp_line_admit(atrium_req *r, rt_line *line, int64_t max_wait_ms)
{
    if (r->line_waiting && r->line == line) {
        /* Second run after waiting: granted, or cancelled by the deadline or shutdown. */
        r->line_waiting = false;
        if (r->line_cancelled) {
            if (r->run_reason == ATRIUM_RUN_SHUTDOWN) return ATRIUM_E_STOPPED;
            rt_line_count_timeout(line);
            return ATRIUM_E_TIMEOUT;
        }
        return line_take_hold(r, line);
    }
    if (atomic_load(&r->srv->stopping)) return ATRIUM_E_STOPPED;
    memset(&r->waiter, 0, sizeof(r->waiter));
    r->waiter.key = http_req_client_key(r);
    r->waiter.ctx = r;
    pthread_mutex_lock(&r->mu);
    int rc = rt_line_enter(line, &r->waiter);
    if (rc == RT_LINE_ADMITTED) {
        pthread_mutex_unlock(&r->mu);
        return line_take_hold(r, line);
    }
    if (rc != RT_LINE_QUEUED) {
        pthread_mutex_unlock(&r->mu);
        return ATRIUM_E_LIMIT;
    }
    r->line = line;
    r->line_waiting = true;
    r->line_cancelled = false;
    susp_suspend(r, SUSP_LINE, rt_now_ms() + max_wait_ms);
    pthread_mutex_unlock(&r->mu);
    return ATRIUM_PARKED;
}

void susp_request_done(atrium_req *r)
{
    /* A handler that was granted a slot but never took it (it failed before calling
     * line_admit again) must not leak the slot. */
    if (r->line_waiting && r->line && !r->line_cancelled)
        susp_line_release(r->line, r->waiter.key);
    r->line_waiting = false;
}

/* ---- handoff ------------------------------------------------------------------------ */

/* Has the client closed its side? libmicrohttpd does not notice while suspended. */
static bool client_gone(int fd)
{
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    int n = poll(&p, 1, 0);
    return n > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

static void handoff_task(void *arg, bool cancelled)
{
    atrium_req *r = arg;
    http_server *s = r->srv;
    if (cancelled) {
        rt_metric_add(s->m_handoff_cancelled, 1);
        susp_resume(r, ACT_RESPOND, 0, 503, unavailable("The server is stopping"));
        http_req_unref(r);
        return;
    }
    pthread_mutex_lock(&r->mu);
    bool live = r->susp == SUSP_SUSPENDED;
    bool gone = live && client_gone(r->sock_fd);
    if (live && !gone && (r->route->route.flags & ATRIUM_ROUTE_COMMITS))
        r->worker_running = true; /* from here the deadline leaves it to us */
    pthread_mutex_unlock(&r->mu);
    if (!live) { /* the deadline or shutdown answered already */
        http_req_unref(r);
        return;
    }
    if (gone) {
        rt_metric_add(s->m_handoff_client_gone, 1);
        rt_log(ATRIUM_LOG_DEBUG, "core", "[req %s] client left before its handoff ran", r->id);
        susp_resume(r, ACT_RESPOND, 0, 503, unavailable("Client went away"));
        http_req_unref(r);
        return;
    }
    /* The deadline may answer the request while the handler runs; its holds then wait
     * for the handler to return (http_req_pool_run_end), so nothing it uses through a
     * hold is released under it. */
    if (!http_req_pool_run_begin(r)) {
        http_req_unref(r);
        return;
    }
    r->run_reason = ATRIUM_RUN_HANDOFF;
    int rc = http_req_run(r);
    http_req_pool_run_end(r);
    /* worker_running stays set until the next suspend clears it: a request that parked or
     * was handed off again from here has cleared it already, and one answered below is
     * never suspended again before its next run. */
    if (rc == ATRIUM_PARKED || rc == ATRIUM_HANDED_OFF) {
        http_req_unref(r); /* someone else owns it now; our reference only */
        return;
    }
    if (rc < 0 || !r->response) {
        rt_log(ATRIUM_LOG_ERROR, "core", "[req %s] handler on pool failed (%d)", r->id, rc);
        http_respond_error(r, 500, "M_UNKNOWN", "Internal server error");
    }
    http_finalize_response(r);
    struct MHD_Response *resp = r->response;
    int status = r->status;
    r->response = NULL;
    if (!susp_resume(r, ACT_RESPOND, 0, status, resp))
        rt_log(ATRIUM_LOG_INFO, "core", "[req %s] answered after its deadline; dropped", r->id);
    http_req_unref(r);
}

int susp_handoff(atrium_req *r, rt_pool *pool, const atrium_scope_value *vals, size_t n)
{
    if (n > HTTP_MAX_HANDOFF_VALUES || (n && !vals)) return ATRIUM_E_INVAL;
    if (atomic_load(&r->srv->stopping)) return ATRIUM_E_STOPPED;
    int rc = rt_pool_reserve(pool);
    if (rc < 0) return rc;
    if (n) memcpy(r->hvals, vals, n * sizeof(*vals));
    r->n_hvals = n;
    r->pool = pool;
    http_req_ref(r); /* the task's */
    pthread_mutex_lock(&r->mu);
    susp_suspend(r, SUSP_HANDOFF, r->deadline_ms);
    pthread_mutex_unlock(&r->mu);
    rt_pool_submit_reserved(pool, handoff_task, r);
    return 0;
}

/* ---- the timer ---------------------------------------------------------------------- */

/* A request's deadline passed (or the server stops). Called with a reference held. */
static void expire(http_server *s, atrium_req *r, bool stopping)
{
    int reason = stopping ? ATRIUM_RUN_SHUTDOWN : ATRIUM_RUN_DEADLINE;
    pthread_mutex_lock(&r->mu);
    if (r->susp != SUSP_SUSPENDED) {
        pthread_mutex_unlock(&r->mu);
        return;
    }
    int kind = r->susp_kind;
    if (kind == SUSP_HANDOFF) {
        if (r->worker_running) {
            pthread_mutex_unlock(&r->mu); /* the running work answers (see the top) */
            return;
        }
        /* Answered under the same lock that saw no worker: a task that finds the request
         * after this sees it resuming and never starts the work. Deciding here and
         * resuming after an unlock let a task start an upload's commit in between, and the
         * client got 504 for an upload that was stored. */
        struct MHD_Response *resp =
            stopping ? unavailable("The server is stopping")
                     : http_error_response(504, "M_UNKNOWN", "The request timed out", 0);
        resume_locked(r, ACT_RESPOND, 0, stopping ? 503 : 504, resp);
        pthread_mutex_unlock(&r->mu);
        rt_metric_add(s->m_handoff_expired, 1);
        MHD_resume_connection(r->conn);
        return;
    }
    bool mine = false;
    if (kind == SUSP_PARK || kind == SUSP_STREAM) {
        struct atrium_event *ev = r->ev;
        pthread_mutex_lock(&ev->mu);
        if (r->ev_linked) {
            event_unlink_locked(ev, r);
            mine = true;
        }
        pthread_mutex_unlock(&ev->mu);
    } else if (kind == SUSP_LINE) {
        mine = rt_line_cancel(r->line, &r->waiter);
        if (mine) r->line_cancelled = true; /* tells line_admit: no slot */
    } else if (kind == SUSP_WAIT) {
        mine = r->wait_linked; /* the waker finds it gone and only drops its reference */
        r->wait_linked = false;
    }
    pthread_mutex_unlock(&r->mu);
    if (mine && kind == SUSP_STREAM) {
        stream_resume(r, true);
    } else if (mine) {
        susp_resume(r, ACT_REDISPATCH, reason, 0, NULL);
    }
    /* Not mine: a waker or the line unlinked it first and resumes it. */
}

static void *timer_main(void *arg)
{
    susp_timer *t = arg;
    pthread_mutex_lock(&t->mu);
    while (!t->quit) {
        if (t->n == 0) {
            pthread_cond_wait(&t->cv, &t->mu);
            continue;
        }
        int64_t now = rt_now_ms();
        if (t->heap[0].deadline > now) {
            int64_t d = t->heap[0].deadline;
            struct timespec ts = {.tv_sec = d / 1000, .tv_nsec = (d % 1000) * 1000000L};
            pthread_cond_timedwait(&t->cv, &t->mu, &ts);
            continue;
        }
        atrium_req *r = t->heap[0].r;
        heap_remove_locked(t, r);
        http_req_ref(r);
        bool stopping = t->stopping;
        pthread_mutex_unlock(&t->mu);
        expire(t->srv, r, stopping);
        http_req_unref(r);
        pthread_mutex_lock(&t->mu);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

susp_timer *susp_timer_new(http_server *s)
{
    susp_timer *t = calloc(1, sizeof(*t));
    if (!t) return NULL;
    t->srv = s;
    pthread_mutex_init(&t->mu, NULL);
    rt_cond_init(&t->cv);
    rt_cond_init(&t->empty_cv);
    if (pthread_create(&t->thread, NULL, timer_main, t) != 0) {
        free(t);
        return NULL;
    }
    return t;
}

void susp_timer_free(susp_timer *t)
{
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    t->quit = true;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->thread, NULL);
    free(t->heap);
    free(t);
}

void susp_expire_all(http_server *s)
{
    susp_timer *t = s->timer;
    atomic_store(&s->stopping, true);
    pthread_mutex_lock(&t->mu);
    t->stopping = true;
    for (size_t i = 0; i < t->n; i++) t->heap[i].deadline = 0;
    pthread_cond_signal(&t->cv);
    /* Wait (bounded) until the timer has answered every suspended request. */
    int64_t until = rt_now_ms() + SHUTDOWN_EXPIRE_WAIT_MS;
    while (t->n > 0) {
        struct timespec ts = {.tv_sec = until / 1000, .tv_nsec = (until % 1000) * 1000000L};
        if (pthread_cond_timedwait(&t->empty_cv, &t->mu, &ts) == ETIMEDOUT) break;
    }
    size_t left = t->n;
    pthread_mutex_unlock(&t->mu);
    if (left)
        rt_log(ATRIUM_LOG_WARN, "core", "%zu suspended requests still pending at shutdown", left);
}
