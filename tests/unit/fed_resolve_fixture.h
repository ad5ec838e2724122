/*
 * tests/unit/fed_resolve_fixture.h - what the resolver's discovery tests share
 * (test_fed_resolve.c, test_fed_resolve_timing.c): real servers on loopback, a tiny UDP
 * DNS server (answers A and SRV from a table the test fills, with TTLs, encoded by hand),
 * a tiny plain-HTTP server answering /.well-known/matrix/server per Host header, and one
 * on 127.0.0.2 that accepts and hangs up at once. The group set-up starts them and one
 * resolver, running its own thread and fetching through the real outbound client
 * (fed_http, loopback whitelisted); the well-known fetch is pointed at the HTTP server
 * with the resolver's test knobs (scheme http, the server's port).
 *
 * Every test uses names of its own, so the caches of the one resolver a group shares never
 * mix tests. Counters on both servers show what was (not) asked. Functions are static
 * inline: each test file uses only some of them.
 */
#ifndef ATRIUM_TESTS_UNIT_FED_RESOLVE_FIXTURE_H
#define ATRIUM_TESTS_UNIT_FED_RESOLVE_FIXTURE_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/federation/transport/fed_http.h"
#include "core/runtime/iprange.h"
#include "core/federation/transport/fed_resolve.h"

#define T_A 1
#define T_AAAA 28
#define T_SRV 33
#define MAX_RRS 128
#define MAX_HOSTS 64
#define WAIT_MS 10000
#define LOOKUP_TIMEOUT_MS 3000
#define SERVER_POLL_MS 50

static inline void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- the DNS server -------------------------------------------------------------------------- */

typedef struct rr {
    char name[128];
    int type;
    uint32_t ttl;
    char addr[64];          /* A */
    int prio, weight, port; /* SRV */
    char target[128];       /* SRV; "." for no service */
} rr;

typedef struct qcount {
    char name[256];
    int type, n;
} qcount;

static struct {
    int fd, port;
    pthread_t th;
    pthread_mutex_t mu;
    rr rrs[MAX_RRS];
    int n_rrs;
    qcount counts[MAX_RRS * 2];
    int n_counts;
    char blackhole[128]; /* a name never answered */
    atomic_int stop;
} dns = {.mu = PTHREAD_MUTEX_INITIALIZER};

static inline void dns_add_a(const char *name, const char *ip, uint32_t ttl)
{
    pthread_mutex_lock(&dns.mu);
    rr *r = &dns.rrs[dns.n_rrs++];
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", name);
    r->type = T_A;
    r->ttl = ttl;
    snprintf(r->addr, sizeof r->addr, "%s", ip);
    pthread_mutex_unlock(&dns.mu);
}

static inline void dns_set_a(const char *name, const char *ip)
{
    pthread_mutex_lock(&dns.mu);
    for (int i = 0; i < dns.n_rrs; i++)
        if (dns.rrs[i].type == T_A && strcasecmp(dns.rrs[i].name, name) == 0)
            snprintf(dns.rrs[i].addr, sizeof dns.rrs[i].addr, "%s", ip);
    pthread_mutex_unlock(&dns.mu);
}

static inline void dns_add_srv(const char *name, int prio, int weight, int port,
                               const char *target, uint32_t ttl)
{
    pthread_mutex_lock(&dns.mu);
    rr *r = &dns.rrs[dns.n_rrs++];
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", name);
    r->type = T_SRV;
    r->ttl = ttl;
    r->prio = prio;
    r->weight = weight;
    r->port = port;
    snprintf(r->target, sizeof r->target, "%s", target);
    pthread_mutex_unlock(&dns.mu);
}

static inline int dns_count(const char *name, int type)
{
    int n = 0;
    pthread_mutex_lock(&dns.mu);
    for (int i = 0; i < dns.n_counts; i++)
        if (dns.counts[i].type == type && strcasecmp(dns.counts[i].name, name) == 0)
            n = dns.counts[i].n;
    pthread_mutex_unlock(&dns.mu);
    return n;
}

static inline int dns_total(void)
{
    int n = 0;
    pthread_mutex_lock(&dns.mu);
    for (int i = 0; i < dns.n_counts; i++)
        n += dns.counts[i].n;
    pthread_mutex_unlock(&dns.mu);
    return n;
}

static inline void count_query(const char *name, int type)
{
    for (int i = 0; i < dns.n_counts; i++)
        if (dns.counts[i].type == type && strcasecmp(dns.counts[i].name, name) == 0) {
            dns.counts[i].n++;
            return;
        }
    if (dns.n_counts < (int)(sizeof dns.counts / sizeof dns.counts[0])) {
        qcount *c = &dns.counts[dns.n_counts++];
        snprintf(c->name, sizeof c->name, "%s", name);
        c->type = type;
        c->n = 1;
    }
}

static inline size_t put16(unsigned char *p, unsigned v)
{
    p[0] = (unsigned char)(v >> 8);
    p[1] = (unsigned char)v;
    return 2;
}

static inline size_t put32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
    return 4;
}

static inline size_t put_name(unsigned char *p, const char *name)
{
    size_t n = 0;
    if (strcmp(name, ".") == 0) {
        p[0] = 0;
        return 1;
    }
    const char *s = name;
    while (*s) {
        const char *dot = strchr(s, '.');
        size_t l = dot ? (size_t)(dot - s) : strlen(s);
        p[n++] = (unsigned char)l;
        memcpy(p + n, s, l);
        n += l;
        s += l;
        if (*s == '.')
            s++;
    }
    p[n++] = 0;
    return n;
}

/* Answer one query from the table: the question copied, its records with a pointer to the
 * question's name; NXDOMAIN for a name with no record of any type. */
static inline size_t dns_answer(const unsigned char *q, size_t qlen, unsigned char *out,
                                size_t cap, bool *drop)
{
    *drop = false;
    if (qlen < 12 || cap < 512)
        return 0;
    size_t off = 12;
    char name[256];
    size_t nl = 0;
    while (off < qlen && q[off] != 0) {
        unsigned l = q[off++];
        if (off + l > qlen || nl + l + 2 > sizeof name)
            return 0;
        if (nl)
            name[nl++] = '.';
        for (unsigned i = 0; i < l; i++)
            name[nl++] = (char)tolower(q[off + i]);
        off += l;
    }
    name[nl] = '\0';
    off++;
    if (off + 4 > qlen)
        return 0;
    int type = (q[off] << 8) | q[off + 1];
    size_t qend = off + 4;
    pthread_mutex_lock(&dns.mu);
    count_query(name, type);
    size_t name_len = strlen(name), bl = strlen(dns.blackhole);
    if (bl && name_len >= bl && strcasecmp(name + name_len - bl, dns.blackhole) == 0) {
        /* the name and the names below it are never answered */
        pthread_mutex_unlock(&dns.mu);
        *drop = true;
        return 0;
    }
    size_t n = qend;
    memcpy(out, q, qend);
    bool known = false;
    unsigned ancount = 0;
    for (int i = 0; i < dns.n_rrs; i++) {
        rr *r = &dns.rrs[i];
        if (strcasecmp(r->name, name) != 0)
            continue;
        known = true;
        if (r->type != type)
            continue;
        n += put16(out + n, 0xC00C);
        n += put16(out + n, (unsigned)type);
        n += put16(out + n, 1);
        n += put32(out + n, r->ttl);
        if (type == T_A) {
            n += put16(out + n, 4);
            inet_pton(AF_INET, r->addr, out + n);
            n += 4;
        } else {
            unsigned char rd[300];
            size_t rl = 0;
            rl += put16(rd + rl, (unsigned)r->prio);
            rl += put16(rd + rl, (unsigned)r->weight);
            rl += put16(rd + rl, (unsigned)r->port);
            rl += put_name(rd + rl, r->target);
            n += put16(out + n, (unsigned)rl);
            memcpy(out + n, rd, rl);
            n += rl;
        }
        ancount++;
    }
    pthread_mutex_unlock(&dns.mu);
    unsigned flags = 0x8000 | 0x0080 | (q[2] & 0x01) << 8; /* QR, RA, RD copied */
    if (!known)
        flags |= 3; /* NXDOMAIN */
    put16(out + 2, flags);
    put16(out + 4, 1);
    put16(out + 6, ancount);
    put16(out + 8, 0);
    put16(out + 10, 0);
    return n;
}

static inline void *dns_main(void *arg)
{
    (void)arg;
    while (!dns.stop) {
        struct pollfd p = {.fd = dns.fd, .events = POLLIN};
        if (poll(&p, 1, SERVER_POLL_MS) <= 0)
            continue;
        unsigned char q[512], out[1500];
        struct sockaddr_in from;
        socklen_t fl = sizeof from;
        ssize_t got = recvfrom(dns.fd, q, sizeof q, 0, (struct sockaddr *)&from, &fl);
        if (got <= 0)
            continue;
        bool drop;
        size_t n = dns_answer(q, (size_t)got, out, sizeof out, &drop);
        if (n > 0 && !drop)
            sendto(dns.fd, out, n, 0, (struct sockaddr *)&from, fl);
    }
    return NULL;
}

static inline int listen_on_loopback(int type)
{
    int fd = socket(AF_INET, type, 0);
    assert_true(fd >= 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    if (type == SOCK_STREAM)
        assert_int_equal(listen(fd, 16), 0);
    return fd;
}

static inline int bound_port(int fd)
{
    struct sockaddr_in a;
    socklen_t l = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &l);
    return ntohs(a.sin_port);
}

/* ---- the .well-known server ------------------------------------------------------------------ */

typedef struct wk_host {
    char host[128];
    int status;
    char headers[512]; /* extra header lines, each ending in \r\n */
    char body[512];
    int delay_ms;
    int requests;
} wk_host;

static struct {
    int fd, port;
    pthread_t th;
    pthread_mutex_t mu;
    wk_host hosts[MAX_HOSTS];
    int n_hosts;
    atomic_int stop;
} web = {.mu = PTHREAD_MUTEX_INITIALIZER};

static inline void wk_set(const char *host, int status, const char *headers, const char *body)
{
    pthread_mutex_lock(&web.mu);
    wk_host *h = NULL;
    for (int i = 0; i < web.n_hosts; i++)
        if (strcasecmp(web.hosts[i].host, host) == 0)
            h = &web.hosts[i];
    if (!h) {
        h = &web.hosts[web.n_hosts++];
        memset(h, 0, sizeof *h);
        snprintf(h->host, sizeof h->host, "%s", host);
    }
    h->status = status;
    snprintf(h->headers, sizeof h->headers, "%s", headers ? headers : "");
    snprintf(h->body, sizeof h->body, "%s", body ? body : "");
    pthread_mutex_unlock(&web.mu);
}

static inline void wk_set_delay(const char *host, int delay_ms)
{
    pthread_mutex_lock(&web.mu);
    for (int i = 0; i < web.n_hosts; i++)
        if (strcasecmp(web.hosts[i].host, host) == 0)
            web.hosts[i].delay_ms = delay_ms;
    pthread_mutex_unlock(&web.mu);
}

static inline int wk_count(const char *host)
{
    int n = 0;
    pthread_mutex_lock(&web.mu);
    for (int i = 0; i < web.n_hosts; i++)
        if (strcasecmp(web.hosts[i].host, host) == 0)
            n = web.hosts[i].requests;
    pthread_mutex_unlock(&web.mu);
    return n;
}

static inline void web_serve(int c)
{
    char req[4096];
    size_t n = 0;
    req[0] = '\0';
    while (n < sizeof req - 1 && !strstr(req, "\r\n\r\n")) {
        struct pollfd p = {.fd = c, .events = POLLIN};
        if (poll(&p, 1, 2000) <= 0)
            return;
        ssize_t got = read(c, req + n, sizeof req - 1 - n);
        if (got <= 0)
            return;
        n += (size_t)got;
        req[n] = '\0';
    }
    char host[128] = "";
    const char *h = strcasestr(req, "\r\nHost:");
    if (h) {
        h += 7;
        while (*h == ' ')
            h++;
        size_t l = strcspn(h, ":\r\n");
        snprintf(host, sizeof host, "%.*s", (int)l, h);
    }
    int status = 404, delay = 0;
    char headers[512] = "", body[512] = "{}";
    pthread_mutex_lock(&web.mu);
    for (int i = 0; i < web.n_hosts; i++) {
        wk_host *w = &web.hosts[i];
        if (strcasecmp(w->host, host) != 0)
            continue;
        w->requests++;
        status = w->status;
        delay = w->delay_ms;
        snprintf(headers, sizeof headers, "%s", w->headers);
        snprintf(body, sizeof body, "%s", w->body);
    }
    pthread_mutex_unlock(&web.mu);
    if (delay)
        sleep_ms(delay);
    char resp[2048];
    int rl = snprintf(resp, sizeof resp,
                      "HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: "
                      "%zu\r\nConnection: close\r\n%s\r\n%s",
                      status, strlen(body), headers, body);
    ssize_t w = write(c, resp, (size_t)rl);
    (void)w;
}

static inline void *web_main(void *arg)
{
    (void)arg;
    while (!web.stop) {
        struct pollfd p = {.fd = web.fd, .events = POLLIN};
        if (poll(&p, 1, SERVER_POLL_MS) <= 0)
            continue;
        int c = accept(web.fd, NULL, NULL);
        if (c < 0)
            continue;
        web_serve(c);
        close(c);
    }
    return NULL;
}

/* A web server that is down in the way that matters: it accepts and hangs up at once
 * (on 127.0.0.2, same port), counting the connections. */
static struct {
    int fd;
    pthread_t th;
    atomic_int accepts, stop;
} dead = {.fd = -1};

static inline void *dead_main(void *arg)
{
    (void)arg;
    while (!dead.stop) {
        struct pollfd p = {.fd = dead.fd, .events = POLLIN};
        if (poll(&p, 1, SERVER_POLL_MS) <= 0)
            continue;
        int c = accept(dead.fd, NULL, NULL);
        if (c < 0)
            continue;
        atomic_fetch_add(&dead.accepts, 1);
        close(c);
    }
    return NULL;
}

static inline void dead_start(int port)
{
    dead.fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(dead.fd >= 0);
    int one = 1;
    setsockopt(dead.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.2", &a.sin_addr);
    assert_int_equal(bind(dead.fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(dead.fd, 16), 0);
    pthread_create(&dead.th, NULL, dead_main, NULL);
}

/* ---- the resolver under test ----------------------------------------------------------------- */

static struct {
    rt_metrics *metrics;
    rt_iprange_list *black, *white;
    fed_http *http;
    fed_resolver *r;
    char dns_server[64];
} g;

typedef struct result {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int rc;
    fed_target t;
    char err[256];
} result;

static inline void on_resolved(void *arg, int rc, const fed_target *t, const char *err)
{
    result *res = arg;
    pthread_mutex_lock(&res->mu);
    res->rc = rc;
    if (t)
        res->t = *t;
    snprintf(res->err, sizeof res->err, "%s", err ? err : "");
    res->done = true;
    pthread_cond_signal(&res->cv);
    pthread_mutex_unlock(&res->mu);
}

static inline void result_init(result *res)
{
    memset(res, 0, sizeof *res);
    pthread_mutex_init(&res->mu, NULL);
    rt_cond_init(&res->cv);
}

static inline void result_wait(result *res)
{
    int64_t deadline = rt_now_ms() + WAIT_MS;
    pthread_mutex_lock(&res->mu);
    while (!res->done && rt_now_ms() < deadline) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += 20 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&res->cv, &res->mu, &ts);
    }
    bool done = res->done;
    pthread_mutex_unlock(&res->mu);
    if (!done)
        fail_msg("no answer from the resolver within %d ms", WAIT_MS);
}

static inline result resolve(const char *name)
{
    result res;
    result_init(&res);
    assert_int_equal(fed_resolve_lookup(g.r, name, on_resolved, &res), 0);
    result_wait(&res);
    if (res.rc != 0)
        print_message("lookup %s: rc %d: %s\n", name, res.rc, res.err);
    return res;
}

static inline void assert_target(const result *res, const char *step, const char *tls_name,
                                 int port, const char *host_header, const char *addr)
{
    assert_int_equal(res->rc, 0);
    assert_string_equal(res->t.step, step);
    assert_string_equal(res->t.tls_name, tls_name);
    assert_int_equal(res->t.port, port);
    assert_string_equal(res->t.host_header, host_header);
    assert_true(res->t.n_addrs >= 1);
    assert_string_equal(res->t.addrs[0], addr);
}

static inline int group_setup(void **state)
{
    (void)state;
    dns.fd = listen_on_loopback(SOCK_DGRAM);
    dns.port = bound_port(dns.fd);
    web.fd = listen_on_loopback(SOCK_STREAM);
    web.port = bound_port(web.fd);
    pthread_create(&dns.th, NULL, dns_main, NULL);
    pthread_create(&web.th, NULL, web_main, NULL);
    dead_start(web.port);

    g.metrics = rt_metrics_new();
    char err[256];
    size_t nb = 0;
    while (RT_IPRANGE_DEFAULT_BLACKLIST[nb])
        nb++;
    g.black = rt_iprange_parse(RT_IPRANGE_DEFAULT_BLACKLIST, nb, err, sizeof err);
    const char *const white[] = {"127.0.0.0/8"};
    g.white = rt_iprange_parse(white, 1, err, sizeof err);
    assert_non_null(g.black);
    assert_non_null(g.white);
    fed_http_settings hs = {.max_connections = 16,
                            .max_connections_per_host = 8,
                            .queue_depth = 64,
                            .blacklist = g.black,
                            .whitelist = g.white};
    g.http = fed_http_new(&hs, g.metrics);
    assert_non_null(g.http);
    assert_int_equal(fed_http_start(g.http), 0);

    snprintf(g.dns_server, sizeof g.dns_server, "127.0.0.1:%d", dns.port);
    const char *servers[] = {g.dns_server};
    fed_resolve_settings rs = {
        .dns_servers = servers,
        .n_dns_servers = 1,
        .lookup_timeout_ms = LOOKUP_TIMEOUT_MS,
        .verify_tls = true,
        .well_known_min_cache_ms = -1, /* no floor: max-age=1 means one second */
        .well_known_scheme = "http",
        .well_known_port = web.port,
    };
    g.r = fed_resolve_new(&rs, g.http, g.metrics);
    assert_non_null(g.r);
    assert_int_equal(fed_resolve_start(g.r), 0);
    return 0;
}

static inline int group_teardown(void **state)
{
    (void)state;
    fed_resolve_stop(g.r);
    fed_http_stop(g.http);
    fed_resolve_free(g.r);
    fed_http_free(g.http);
    rt_iprange_free(g.black);
    rt_iprange_free(g.white);
    rt_metrics_free(g.metrics);
    dns.stop = 1;
    web.stop = 1;
    pthread_join(dns.th, NULL);
    pthread_join(web.th, NULL);
    dead.stop = 1;
    pthread_join(dead.th, NULL);
    close(dead.fd);
    close(dns.fd);
    close(web.fd);
    return 0;
}

#endif
