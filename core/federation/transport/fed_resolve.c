/*
 * core/federation/transport/fed_resolve.c - server discovery's thread, queue and public functions,
 * and the life of one discovery.
 *
 * One thread owns everything of the resolver: the c-ares channel, the caches, the
 * discoveries in flight. Callers hand it look-ups through a queue and an eventfd; the
 * outbound client hands it .well-known answers the same way (its callback runs on the
 * client's I/O thread and only copies and posts). The thread polls c-ares' sockets and the
 * eventfd, so a slow DNS server delays only the names waiting on it, and ends discoveries
 * at their deadline. Concurrent look-ups of one name join one discovery, so a burst of
 * requests to a new destination costs one discovery: the discovery is the work of the
 * name's single flight (core/runtime/flight.h, docs/adr/0029-single-flight.md), and each
 * look-up is a waiter on it, answered by its done when the flight finishes.
 *
 * A discovery is freed when it has answered and nothing it started is still out: each
 * outstanding query or fetch, and each step running, holds a reference. The steps
 * themselves are in fed_resolve_steps.c, the caches in fed_resolve_cache.c, the pure
 * rules in fed_resolve_parse.c.
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "core/federation/transport/fed_resolve_internal.h"

const char *const FED_RESOLVE_STEPS[FED_RESOLVE_N_STEPS] = {
    "ip-literal", "explicit-port",      "well-known", "well-known+srv", "well-known+srv-legacy",
    "well-known+default", "srv", "srv-legacy", "default"};

/* ---- discoveries: references, answers -------------------------------------------------------- */

void fed_disc_unref(fed_disc *d)
{
    RT_ASSERT(d->refs > 0, "discovery %s: reference count underflow", d->name);
    if (--d->refs > 0 || !d->done)
        return;
    fed_resolver *r = d->r;
    if (d->prev)
        d->prev->next = d->next;
    else
        r->discs = d->next;
    if (d->next)
        d->next->prev = d->prev;
    free(d);
}

void fed_disc_answer(fed_disc *d, int rc, const fed_target *t, const char *err)
{
    if (d->done)
        return;
    d->done = true;
    fed_resolver *r = d->r;
    if (rc == 0) {
        for (size_t i = 0; i < FED_RESOLVE_N_STEPS; i++)
            if (strcmp(FED_RESOLVE_STEPS[i], t->step) == 0)
                rt_metric_add(r->m_step[i], 1);
    } else {
        rt_metric_add(r->m_failed, 1);
        rt_log(ATRIUM_LOG_INFO, "core", "federation: discovery of %s failed: %s", d->name,
               err);
    }
    /* No memory for the answer: the waiters are told so instead of the target. */
    fed_resolve_answer *a = calloc(1, sizeof *a);
    if (a && rc == 0)
        a->t = *t;
    if (a && rc != 0)
        snprintf(a->err, sizeof a->err, "%s", err);
    rt_flight *f = d->flight;
    d->flight = NULL;
    /* The gauge before the answers (whoever reads it after one sees this one gone): only
     * this thread joins and finishes, so the count is exact. */
    rt_metric_set(r->m_in_flight, rt_flights_in_flight(r->flights) - 1);
    rt_flight_finish(f, a ? rc : ATRIUM_E_NOMEM, a, free); /* every waiter is answered */
}

void fed_disc_fail(fed_disc *d, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void fed_disc_fail(fed_disc *d, int rc, const char *fmt, ...)
{
    char err[FED_RESOLVE_ERR_BYTES];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, sizeof err, fmt, ap);
    va_end(ap);
    fed_disc_answer(d, rc, NULL, err);
}

/* The end of every successful path: a target needs at least one address. */
void fed_disc_found(fed_disc *d, const char *step, const char *tls_name, int port,
                       const char *host_header, const fed_dns_addrs *a)
{
    if (a->n == 0) {
        fed_disc_fail(d, ATRIUM_E_NOTFOUND, "%s has no address (step %s)", tls_name, step);
        return;
    }
    fed_target t;
    memset(&t, 0, sizeof t);
    snprintf(t.tls_name, sizeof t.tls_name, "%s", tls_name);
    snprintf(t.host_header, sizeof t.host_header, "%s", host_header);
    t.port = port;
    t.step = step;
    t.n_addrs = a->n;
    memcpy(t.addrs, a->a, sizeof t.addrs);
    fed_disc_answer(d, 0, &t, NULL);
}


static void wake(fed_resolver *r)
{
    uint64_t one = 1;
    ssize_t w = write(r->wake_fd, &one, sizeof one);
    (void)w; /* EAGAIN: the counter is full, which wakes the thread as well */
}

/* ---- the queue ------------------------------------------------------------------------------- */

/* Append m and wake the thread; with refuse_if_stopping, ATRIUM_E_STOPPED once stopping
 * (a look-up), else queued even then (a fetch's answer, freed by fed_resolve_free). */
static int queue_push(fed_resolver *r, fed_resolve_msg *m, bool refuse_if_stopping)
{
    pthread_mutex_lock(&r->mu);
    if (refuse_if_stopping && (!r->started || r->stopping)) {
        pthread_mutex_unlock(&r->mu);
        return ATRIUM_E_STOPPED;
    }
    m->next = NULL;
    if (r->q_tail)
        r->q_tail->next = m;
    else
        r->q_head = m;
    r->q_tail = m;
    pthread_mutex_unlock(&r->mu);
    wake(r);
    return 0;
}

void fed_resolve_post(fed_resolver *r, fed_resolve_msg *m)
{
    queue_push(r, m, false);
}

static void msg_clear(fed_resolve_msg *m)
{
    free(m->body);
    free(m->location);
    free(m->cache_control);
    free(m->expires);
    m->body = m->location = m->cache_control = m->expires = NULL;
}

/* ---- the resolver thread --------------------------------------------------------------------- */

/* A look-up's answer: the flight of its name ended (the resolver's thread). */
static void waiter_done(void *arg)
{
    fed_resolve_waiter *w = arg;
    int rc = ATRIUM_E_NOMEM;
    void *value = NULL;
    rt_flight_waiter_result(&w->w, &rc, &value);
    const fed_resolve_answer *a = value;
    if (!a)
        w->cb(w->arg, rc, NULL, "out of memory");
    else
        w->cb(w->arg, rc, rc == 0 ? &a->t : NULL, rc == 0 ? "" : a->err);
    rt_flight_unref(w->f);
    free(w);
}

static void lookup_start(fed_resolver *r, fed_resolve_msg *m)
{
    fed_resolve_waiter *w = calloc(1, sizeof *w);
    fed_disc *d = calloc(1, sizeof *d);
    if (!w || !d) {
        free(w);
        free(d);
        m->cb(m->arg, ATRIUM_E_NOMEM, NULL, "out of memory");
        return;
    }
    w->cb = m->cb;
    w->arg = m->arg;
    w->w = (rt_flight_waiter){.done = waiter_done, .arg = w};
    /* Joins the discovery already running for this name, or leads a new one. */
    int rc = rt_flight_join(r->flights, m->name, 0, &w->w, &w->f);
    if (rc != RT_FLIGHT_LEAD)
        free(d);
    if (rc == RT_FLIGHT_JOINED)
        return;
    if (rc < 0) {
        free(w);
        if (rc == ATRIUM_E_LIMIT) /* names others choose: bounded */
            rt_metric_add(r->m_refused, 1);
        m->cb(m->arg, rc, NULL,
              rc == ATRIUM_E_LIMIT ? "too many server discoveries are running"
                                   : "out of memory");
        return;
    }
    rt_metric_set(r->m_in_flight, rt_flights_in_flight(r->flights));
    d->r = r;
    d->flight = w->f;
    snprintf(d->name, sizeof d->name, "%s", m->name);
    d->next = r->discs;
    if (r->discs)
        r->discs->prev = d;
    r->discs = d;
    d->deadline_ms = rt_now_ms() + r->timeout_ms;
    d->refs = 1; /* this step */
    fed_resolve_steps_begin(d);
    fed_disc_unref(d);
}

static void handle_msg(fed_resolver *r, fed_resolve_msg *m, bool stopping)
{
    if (m->kind == FED_MSG_LOOKUP) {
        if (stopping)
            m->cb(m->arg, ATRIUM_E_STOPPED, NULL, "the resolver is stopping");
        else
            lookup_start(r, m);
        free(m);
        return;
    }
    /* The message is embedded in its discovery, and answering it may submit the next
     * redirect hop at once, whose callback then fills the same message on the client's
     * thread: take the answer out of it first. */
    fed_resolve_msg answer = *m;
    m->body = m->location = m->cache_control = m->expires = NULL;
    fed_disc *d = answer.d; /* the fetch's reference */
    if (!d->done)
        fed_resolve_steps_well_known_answer(d, &answer);
    msg_clear(&answer);
    fed_disc_unref(d);
}

static int poll_timeout_ms(fed_resolver *r)
{
    struct timeval maxtv = {.tv_sec = FED_RESOLVE_MAX_POLL_MS / 1000,
                            .tv_usec = (FED_RESOLVE_MAX_POLL_MS % 1000) * 1000};
    struct timeval tv, *t = ares_timeout(r->ch, &maxtv, &tv);
    int64_t ms = (int64_t)t->tv_sec * 1000 + (t->tv_usec + 999) / 1000;
    int64_t now = rt_now_ms();
    for (fed_disc *d = r->discs; d; d = d->next)
        if (!d->done && d->deadline_ms - now < ms)
            ms = d->deadline_ms - now;
    return ms < 0 ? 0 : (int)ms;
}

static void *resolver_main(void *arg)
{
    fed_resolver *r = arg;
    for (;;) {
        struct pollfd pfd[1 + ARES_GETSOCK_MAXNUM];
        ares_socket_t socks[ARES_GETSOCK_MAXNUM];
        /* c-ares' ARES_GETSOCK_WRITABLE shifts a signed 1 into the sign bit for the 16th
         * socket (undefined behaviour): read the bits unsigned instead. */
        unsigned bits = (unsigned)ares_getsock(r->ch, socks, ARES_GETSOCK_MAXNUM);
        nfds_t n = 1;
        pfd[0] = (struct pollfd){.fd = r->wake_fd, .events = POLLIN};
        for (unsigned i = 0; i < ARES_GETSOCK_MAXNUM; i++) {
            bool rd = (bits >> i) & 1u, wr = (bits >> (i + ARES_GETSOCK_MAXNUM)) & 1u;
            short ev = (short)((rd ? POLLIN : 0) | (wr ? POLLOUT : 0));
            if (ev)
                pfd[n++] = (struct pollfd){.fd = socks[i], .events = ev};
        }
        int rc = poll(pfd, n, poll_timeout_ms(r));
        if (rc < 0 && errno != EINTR) {
            rt_log(ATRIUM_LOG_ERROR, "core", "federation resolver: poll: %s", strerror(errno));
            RT_ASSERT(false, "federation resolver: poll failed");
        }
        for (nfds_t i = 1; rc > 0 && i < n; i++) {
            if (!pfd[i].revents)
                continue;
            bool rd = pfd[i].revents & (POLLIN | POLLERR | POLLHUP);
            bool wr = pfd[i].revents & POLLOUT;
            ares_process_fd(r->ch, rd ? pfd[i].fd : ARES_SOCKET_BAD,
                            wr ? pfd[i].fd : ARES_SOCKET_BAD);
        }
        ares_process_fd(r->ch, ARES_SOCKET_BAD, ARES_SOCKET_BAD); /* timeouts */
        if (rc > 0 && pfd[0].revents) {
            uint64_t v;
            ssize_t got = read(r->wake_fd, &v, sizeof v);
            (void)got;
        }
        pthread_mutex_lock(&r->mu);
        fed_resolve_msg *m = r->q_head;
        r->q_head = r->q_tail = NULL;
        bool stopping = r->stopping;
        pthread_mutex_unlock(&r->mu);
        while (m) {
            fed_resolve_msg *next = m->next;
            handle_msg(r, m, false);
            m = next;
        }
        int64_t now = rt_now_ms();
        for (fed_disc *d = r->discs, *next; d; d = next) {
            next = d->next;
            if (d->done || now < d->deadline_ms)
                continue;
            d->refs++;
            fed_disc_fail(d, ATRIUM_E_TIMEOUT, "no answer within %lld ms",
                      (long long)r->timeout_ms);
            fed_disc_unref(d);
        }
        if (stopping)
            break;
    }
    /* Stop: every discovery answers now; c-ares ends its queries (their callbacks release
     * what they hold); fetches still out end when the outbound client stops. */
    for (fed_disc *d = r->discs, *next; d; d = next) {
        next = d->next;
        d->refs++;
        fed_disc_fail(d, ATRIUM_E_STOPPED, "the resolver is stopping");
        fed_disc_unref(d);
    }
    ares_cancel(r->ch);
    pthread_mutex_lock(&r->mu);
    r->stopped = true;
    fed_resolve_msg *m = r->q_head;
    r->q_head = r->q_tail = NULL;
    pthread_mutex_unlock(&r->mu);
    while (m) {
        fed_resolve_msg *next = m->next;
        handle_msg(r, m, true);
        m = next;
    }
    return NULL;
}

/* ---- the public functions -------------------------------------------------------------------- */

fed_resolver *fed_resolve_new(const fed_resolve_settings *s, fed_http *http,
                              rt_metrics *metrics)
{
    fed_resolver *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->wake_fd = -1;
    pthread_mutex_init(&r->mu, NULL);
    r->http = http;
    r->timeout_ms =
        s->lookup_timeout_ms > 0 ? s->lookup_timeout_ms : FED_RESOLVE_DEFAULT_TIMEOUT_MS;
    r->wk_max_bytes = s->well_known_max_bytes > 0 ? s->well_known_max_bytes
                                                  : FED_RESOLVE_DEFAULT_WK_MAX_BYTES;
    r->wk_min_cache_ms = s->well_known_min_cache_ms == 0 ? FED_RESOLVE_WK_MIN_CACHE_MS
                         : s->well_known_min_cache_ms < 0 ? 0
                                                          : s->well_known_min_cache_ms;
    r->verify_tls = s->verify_tls;
    snprintf(r->wk_scheme, sizeof r->wk_scheme, "%s",
             s->well_known_scheme ? s->well_known_scheme : FED_RESOLVE_WK_SCHEME);
    r->wk_port = s->well_known_port > 0 ? s->well_known_port : FED_RESOLVE_WK_PORT;
    if (strcmp(r->wk_scheme, "https") != 0 && strcmp(r->wk_scheme, "http") != 0) {
        rt_log(ATRIUM_LOG_ERROR, "core", "federation resolver: well_known_scheme must be "
                                         "https or http");
        goto fail;
    }
    for (size_t i = 0; i < FED_RESOLVE_N_STEPS; i++) {
        char l[RT_METRIC_LABELS_MAX_BYTES];
        rt_metric_label(l, sizeof l, "step", FED_RESOLVE_STEPS[i]);
        r->m_step[i] = rt_metric_counter(metrics, "atrium_federation_discovery_total", l,
                                         "Server discoveries by the step that decided");
    }
    r->m_failed = rt_metric_counter(metrics, "atrium_federation_discovery_failed_total", "",
                                    "Server discoveries that found nothing");
    r->m_in_flight = rt_metric_gauge(metrics, "atrium_federation_discoveries_in_flight", "",
                                     "Server discoveries of different names running now");
    r->m_refused = rt_metric_counter(metrics, "atrium_federation_discoveries_refused_total", "",
                                     "Look-ups refused because max_in_flight discoveries ran");
    r->max_in_flight = s->max_in_flight > 0 ? (size_t)s->max_in_flight
                                            : FED_RESOLVE_DEFAULT_MAX_IN_FLIGHT;
    size_t dns_cap = s->dns_cache_entries > 0 ? (size_t)s->dns_cache_entries
                                              : FED_RESOLVE_DEFAULT_DNS_ENTRIES;
    size_t wk_cap = s->well_known_cache_entries > 0 ? (size_t)s->well_known_cache_entries
                                                    : FED_RESOLVE_DEFAULT_WK_ENTRIES;
    if (fed_resolve_cache_init(&r->dns, dns_cap, metrics, "dns") < 0 ||
        fed_resolve_cache_init(&r->wk, wk_cap, metrics, "well_known") < 0)
        goto fail;
    if (r->max_in_flight > INT_MAX / FED_RESOLVE_WAITERS_PER_DISCOVERY)
        r->max_in_flight = INT_MAX / FED_RESOLVE_WAITERS_PER_DISCOVERY;
    r->flights = rt_flights_new(FED_RESOLVE_FLIGHTS_NAME, (int)r->max_in_flight,
                                (int)r->max_in_flight * FED_RESOLVE_WAITERS_PER_DISCOVERY,
                                metrics);
    if (!r->flights)
        goto fail;
    r->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (r->wake_fd < 0) {
        rt_log(ATRIUM_LOG_ERROR, "core", "federation resolver: eventfd: %s", strerror(errno));
        goto fail;
    }
    int arc = ares_library_init(ARES_LIB_INIT_ALL);
    if (arc != ARES_SUCCESS) {
        rt_log(ATRIUM_LOG_ERROR, "core", "federation resolver: c-ares: %s", ares_strerror(arc));
        goto fail;
    }
    struct ares_options o = {.timeout = FED_RESOLVE_DNS_TRY_TIMEOUT_MS,
                             .tries = FED_RESOLVE_DNS_TRIES};
    arc = ares_init_options(&r->ch, &o, ARES_OPT_TIMEOUTMS | ARES_OPT_TRIES);
    if (arc != ARES_SUCCESS) {
        ares_library_cleanup();
        rt_log(ATRIUM_LOG_ERROR, "core",
               "federation resolver: c-ares could not start (%s); check /etc/resolv.conf",
               ares_strerror(arc));
        goto fail;
    }
    r->ch_ok = true;
    if (s->n_dns_servers > 0) {
        char csv[FED_RESOLVE_CSV_BYTES] = "";
        size_t used = 0;
        for (size_t i = 0; i < s->n_dns_servers; i++) {
            int w = snprintf(csv + used, sizeof csv - used, "%s%s", i ? "," : "",
                             s->dns_servers[i]);
            if (w < 0 || (size_t)w >= sizeof csv - used) {
                rt_log(ATRIUM_LOG_ERROR, "core", "federation resolver: too many DNS servers");
                goto fail;
            }
            used += (size_t)w;
        }
        arc = ares_set_servers_ports_csv(r->ch, csv);
        if (arc != ARES_SUCCESS) {
            rt_log(ATRIUM_LOG_ERROR, "core",
                   "federation resolver: bad DNS server list \"%s\" (%s); use ip or ip:port",
                   csv, ares_strerror(arc));
            goto fail;
        }
        r->dns_csv = strdup(csv);
    }
    return r;
fail:
    fed_resolve_free(r);
    return NULL;
}

int fed_resolve_start(fed_resolver *r)
{
    int rc = pthread_create(&r->thread, NULL, resolver_main, r);
    if (rc != 0) {
        rt_log(ATRIUM_LOG_ERROR, "core", "federation resolver: pthread_create: %s",
               strerror(rc));
        return ATRIUM_E_IO;
    }
    pthread_mutex_lock(&r->mu);
    r->started = true; /* read under mu by fed_resolve_lookup */
    pthread_mutex_unlock(&r->mu);
    return 0;
}

int fed_resolve_lookup(fed_resolver *r, const char *server_name, fed_resolve_cb cb, void *arg)
{
    char host[FED_RESOLVE_NAME_BYTES];
    int port;
    if (!server_name || strlen(server_name) >= FED_RESOLVE_NAME_BYTES ||
        !fed_server_name_split(server_name, host, sizeof host, &port)) {
        cb(arg, ATRIUM_E_INVAL, NULL, "not a valid server name");
        return 0;
    }
    if (fed_host_is_ip_literal(host)) { /* step 1: nothing to look up */
        fed_target t;
        memset(&t, 0, sizeof t);
        snprintf(t.tls_name, sizeof t.tls_name, "%s", host);
        snprintf(t.host_header, sizeof t.host_header, "%s", server_name);
        snprintf(t.addrs[0], sizeof t.addrs[0], "%.63s", host);
        t.n_addrs = 1;
        t.port = port ? port : FED_RESOLVE_DEFAULT_PORT;
        t.step = FED_RESOLVE_STEPS[0];
        rt_metric_add(r->m_step[0], 1);
        cb(arg, 0, &t, "");
        return 0;
    }
    fed_resolve_msg *m = calloc(1, sizeof *m);
    if (!m)
        return ATRIUM_E_NOMEM;
    m->kind = FED_MSG_LOOKUP;
    m->cb = cb;
    m->arg = arg;
    snprintf(m->name, sizeof m->name, "%s", server_name);
    int rc = queue_push(r, m, true);
    if (rc < 0)
        free(m);
    return rc;
}

void fed_resolve_stop(fed_resolver *r)
{
    if (!r || !r->started)
        return;
    pthread_mutex_lock(&r->mu);
    bool already = r->stopping;
    r->stopping = true;
    pthread_mutex_unlock(&r->mu);
    if (already)
        return;
    wake(r);
    pthread_join(r->thread, NULL);
}

void fed_resolve_free(fed_resolver *r)
{
    if (!r)
        return;
    /* .well-known answers that came after the thread stopped (fed_http_stop ends every
     * fetch): their discoveries have answered already. */
    fed_resolve_msg *m = r->q_head;
    while (m) {
        fed_resolve_msg *next = m->next;
        if (m->kind == FED_MSG_LOOKUP) {
            free(m);
        } else {
            msg_clear(m);
            fed_disc_unref(m->d);
        }
        m = next;
    }
    while (r->discs) { /* a fetch the client never ended: nothing will call back now */
        fed_disc *d = r->discs;
        r->discs = d->next;
        /* Answered already at the stop, unless the thread never ran: answer it now. */
        if (!d->done)
            fed_disc_fail(d, ATRIUM_E_STOPPED, "the resolver is stopping");
        free(d);
    }
    if (r->ch_ok) {
        ares_destroy(r->ch);
        ares_library_cleanup();
    }
    fed_resolve_cache_destroy(&r->dns);
    fed_resolve_cache_destroy(&r->wk);
    rt_flights_free(r->flights);
    if (r->wake_fd >= 0)
        close(r->wake_fd);
    pthread_mutex_destroy(&r->mu);
    free(r->dns_csv);
    free(r);
}
