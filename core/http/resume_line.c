/* The resume line: how many woken requests a client worker runs again at once.
 *
 * A message into a room wakes every parked long-poll of its members in one go
 * (susp_event_signal). Each woken request runs its handler again on its worker's one
 * thread; resumed all at once, a thousand of them were a thousand runs queued on four
 * threads, and a cheap request the gate handed to a worker waited behind every one of that
 * worker's (/versions up to 20 s, docs/performance.md, "The wake fan-out"). Here a worker
 * has at most HTTP_WORKER_RESUMES woken requests resumed whose run has not started; the
 * others stay suspended in its line, in wake order, costing nothing but a link, and each
 * run that starts (or connection that closes first) resumes the oldest. The place is given
 * back when the run starts, not when it ends: a run may park again and be woken again
 * before its handler returned, and its thread runs one request at a time anyway. The gate counts the woken runs in a worker's backlog (gate.c, pick_worker).
 *
 * The line's length is bounded by the requests parked on the worker (each was admitted
 * under the connection limit); atrium_http_resumes_waiting tells how many wait in lines.
 * A request in a line is SUSP_RESUMING: its deadline has left the timer and no waker or
 * deadline touches it again; its connection cannot close while suspended.
 * Only ACT_REDISPATCH resumes of the client workers are lined; answers (ACT_RESPOND) and
 * waiting streams cost a write, not a run, and are resumed at once. The core's long-polls
 * (/sync, sliding sync) hand a woken run on to their own pool as soon as it starts here
 * (docs/adr/0042-woken-long-polls-leave-the-request-pool.md), so for them a run on the
 * worker is a handoff, not their statements.
 */
#include <microhttpd.h>

#include "core/http/http.h"

void http_resume(atrium_req *r, int action)
{
    http_listener *w = r->worker;
    if (action != ACT_REDISPATCH || !w || atomic_load(&r->srv->stopping)) {
        MHD_resume_connection(r->conn);
        return;
    }
    pthread_mutex_lock(&w->resume_mu);
    r->resume_counted = true;
    bool now = atomic_load(&w->resumed) < HTTP_WORKER_RESUMES;
    if (now) {
        atomic_fetch_add(&w->resumed, 1);
    } else {
        r->rl_next = NULL;
        if (w->rl_tail) w->rl_tail->rl_next = r;
        else w->rl_head = r;
        w->rl_tail = r;
    }
    pthread_mutex_unlock(&w->resume_mu);
    if (now) MHD_resume_connection(r->conn);
    else rt_metric_add(r->srv->m_resumes_waiting, 1);
}

void http_resume_done(atrium_req *r)
{
    http_listener *w = r->worker;
    if (!w || !r->resume_counted) return;
    r->resume_counted = false;
    pthread_mutex_lock(&w->resume_mu);
    atrium_req *next = w->rl_head;
    if (next) {
        w->rl_head = next->rl_next;
        if (!w->rl_head) w->rl_tail = NULL;
        next->rl_next = NULL;
    } else {
        atomic_fetch_sub(&w->resumed, 1);
    }
    pthread_mutex_unlock(&w->resume_mu);
    if (next) {
        rt_metric_add(r->srv->m_resumes_waiting, -1);
        MHD_resume_connection(next->conn);
    }
    http_gate_poke(r->srv); /* its backlog fell (gate.c counts woken runs in it) */
}

void http_resume_flush(http_server *s)
{
    for (int i = 0; s->workers && i < s->n_workers; i++) {
        http_listener *w = &s->workers[i];
        pthread_mutex_lock(&w->resume_mu);
        atrium_req *list = w->rl_head;
        w->rl_head = w->rl_tail = NULL;
        for (atrium_req *r = list; r; r = r->rl_next) atomic_fetch_add(&w->resumed, 1);
        pthread_mutex_unlock(&w->resume_mu);
        while (list) {
            atrium_req *r = list;
            list = r->rl_next;
            r->rl_next = NULL;
            rt_metric_add(s->m_resumes_waiting, -1);
            MHD_resume_connection(r->conn);
        }
    }
}
