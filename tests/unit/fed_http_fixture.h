/*
 * tests/unit/fed_http_fixture.h - what the outbound client's unit tests share
 * (test_fed_http.c, test_fed_http_refusals.c): a small HTTP server run in a thread of the
 * test on 127.0.0.1 (canned answers, chunked streaming released by the test, keep-alive,
 * connections accepted and never answered), a recorder of what a request's callbacks saw,
 * and the client opened with the caps, queue depth and address lists a test asks for.
 * Every wait is on a condition variable with a deadline. Functions are static inline: each
 * test file uses only some of them.
 */
#ifndef ATRIUM_TESTS_UNIT_FED_HTTP_FIXTURE_H
#define ATRIUM_TESTS_UNIT_FED_HTTP_FIXTURE_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <curl/curl.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/federation/transport/fed_http.h"
#include "core/runtime/iprange.h"

#define WAIT_MS 3000          /* the most any wait in these tests may take */
#define SLACK_MS 400          /* how late a deadline may fire on a loaded machine */
#define SERVER_MAX_CONNS 32
#define REQUEST_MAX_BYTES 16384

/* ---- a small HTTP server ---------------------------------------------------------------- */

enum srv_mode {
    SRV_CANNED,    /* read the request, write `response`, close */
    SRV_STREAM,    /* chunked: the first chunk, then wait for `go`, then the rest */
    SRV_KEEPALIVE, /* answer `response` to every request on a connection until it closes */
};

typedef struct srv {
    int lfd, port;
    pthread_t th;
    bool threaded;
    pthread_mutex_t m;
    pthread_cond_t cv;
    enum srv_mode mode;
    int hang_first;        /* the first N connections are accepted and never answered */
    const char *response;  /* SRV_CANNED */
    int accepted;
    char request[REQUEST_MAX_BYTES]; /* the last request read, headers and body */
    size_t request_len;
    int hung[SERVER_MAX_CONNS];
    int n_hung;
    bool go, stop;
} srv;

static inline int64_t now_ms(void)
{
    return rt_now_ms();
}

static inline void srv_listen(srv *s)
{
    memset(s, 0, sizeof(*s));
    pthread_mutex_init(&s->m, NULL);
    rt_cond_init(&s->cv);
    s->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(s->lfd >= 0);
    int one = 1;
    setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(s->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(s->lfd, 16), 0);
    socklen_t len = sizeof(a);
    getsockname(s->lfd, (struct sockaddr *)&a, &len);
    s->port = ntohs(a.sin_port);
}

/* The same on [::1]; false (and nothing listens) when the machine has no IPv6 loopback. */
static inline bool srv_listen6(srv *s)
{
    memset(s, 0, sizeof(*s));
    pthread_mutex_init(&s->m, NULL);
    rt_cond_init(&s->cv);
    s->lfd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    if (s->lfd < 0 || bind(s->lfd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        listen(s->lfd, 16) != 0) {
        if (s->lfd >= 0) close(s->lfd);
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->m);
        return false;
    }
    socklen_t len = sizeof(a);
    getsockname(s->lfd, (struct sockaddr *)&a, &len);
    s->port = ntohs(a.sin6_port);
    return true;
}

static inline void write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0) return;
        p += w;
        n -= (size_t)w;
    }
}

/* Read one request: headers, then Content-Length bytes of body. Its length (0: the
 * connection closed first). */
static inline size_t read_request(srv *s, int fd)
{
    char buf[REQUEST_MAX_BYTES];
    size_t len = 0, want = 0;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, WAIT_MS) <= 0) break;
        ssize_t r = recv(fd, buf + len, sizeof(buf) - 1 - len, 0);
        if (r <= 0) break;
        len += (size_t)r;
        buf[len] = '\0';
        char *end = strstr(buf, "\r\n\r\n");
        if (!end) continue;
        if (!want) {
            const char *cl = strcasestr(buf, "\r\ncontent-length:");
            want = (size_t)(end + 4 - buf) + (cl && cl < end ? strtoul(cl + 17, NULL, 10) : 0);
        }
        if (len >= want) break;
    }
    pthread_mutex_lock(&s->m);
    memcpy(s->request, buf, len);
    s->request[len] = '\0';
    s->request_len = len;
    pthread_mutex_unlock(&s->m);
    return len;
}

static inline void serve_stream(srv *s, int fd)
{
    const char *head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                       "6\r\nhello \r\n";
    write_all(fd, head, strlen(head));
    pthread_mutex_lock(&s->m);
    int64_t until = now_ms() + WAIT_MS;
    while (!s->go && !s->stop && now_ms() < until) rt_scope_wait(&s->cv, &s->m, until);
    pthread_mutex_unlock(&s->m);
    const char *rest = "5\r\nworld\r\n0\r\n\r\n";
    write_all(fd, rest, strlen(rest));
}

static inline void *srv_main(void *arg)
{
    srv *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->m);
        bool stop = s->stop;
        pthread_mutex_unlock(&s->m);
        if (stop) break;
        struct pollfd p = {.fd = s->lfd, .events = POLLIN};
        if (poll(&p, 1, 20) <= 0) continue;
        int fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) continue;
        pthread_mutex_lock(&s->m);
        int n = ++s->accepted;
        bool hang = n <= s->hang_first && s->n_hung < SERVER_MAX_CONNS;
        if (hang) s->hung[s->n_hung++] = fd;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->m);
        if (hang) continue;
        if (s->mode == SRV_KEEPALIVE) {
            while (read_request(s, fd) > 0) write_all(fd, s->response, strlen(s->response));
        } else {
            read_request(s, fd);
            if (s->mode == SRV_STREAM) serve_stream(s, fd);
            else write_all(fd, s->response, strlen(s->response));
        }
        shutdown(fd, SHUT_WR);
        close(fd);
    }
    return NULL;
}

static inline void srv_run(srv *s, enum srv_mode mode, const char *response, int hang_first)
{
    s->mode = mode;
    s->response = response;
    s->hang_first = hang_first;
    assert_int_equal(pthread_create(&s->th, NULL, srv_main, s), 0);
    s->threaded = true;
}

static inline void srv_start(srv *s, enum srv_mode mode, const char *response, int hang_first)
{
    srv_listen(s);
    srv_run(s, mode, response, hang_first);
}

static inline void srv_stop(srv *s)
{
    pthread_mutex_lock(&s->m);
    s->stop = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->m);
    if (s->threaded) pthread_join(s->th, NULL);
    for (int i = 0; i < s->n_hung; i++) close(s->hung[i]);
    close(s->lfd);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->m);
}

/* Read what the client sent until it closes the connection; false if it does not within
 * WAIT_MS. */
static inline bool peer_closes(int fd)
{
    char buf[1024];
    int64_t until = now_ms() + WAIT_MS;
    while (now_ms() < until) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, (int)(until - now_ms())) <= 0) return false;
        ssize_t r = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (r == 0 || (r < 0 && errno != EAGAIN)) return true;
    }
    return false;
}

static inline bool srv_wait_accepted(srv *s, int n)
{
    pthread_mutex_lock(&s->m);
    int64_t until = now_ms() + WAIT_MS;
    while (s->accepted < n && now_ms() < until) rt_scope_wait(&s->cv, &s->m, until);
    bool ok = s->accepted >= n;
    pthread_mutex_unlock(&s->m);
    return ok;
}

static inline int srv_accepted(srv *s)
{
    pthread_mutex_lock(&s->m);
    int n = s->accepted;
    pthread_mutex_unlock(&s->m);
    return n;
}

/* ---- what a request's callbacks saw ------------------------------------------------------ */

typedef struct rec {
    pthread_mutex_t m;
    pthread_cond_t cv;
    int calls;
    int outcome, status;
    bool body_null;
    char body[8192];
    size_t body_len;
    char error[512];
    char final_header[64], interim_header[64];
    int64_t done_at;
    /* streaming */
    char streamed[256];
    size_t streamed_len;
    int chunks;
    int chunk_status;
    srv *release; /* on the first chunk, let this server send the rest */
    int refuse_chunks;
} rec;

static inline void rec_init(rec *r)
{
    memset(r, 0, sizeof(*r));
    pthread_mutex_init(&r->m, NULL);
    rt_cond_init(&r->cv);
}

static inline void rec_destroy(rec *r)
{
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->m);
}

static inline void copy_header(char *dst, size_t n, fed_http_handle *h, const char *name)
{
    const char *v = fed_http_handle_header(h, name);
    snprintf(dst, n, "%s", v ? v : "(none)");
}

static inline void on_done(void *arg, const fed_http_result *res)
{
    rec *r = arg;
    pthread_mutex_lock(&r->m);
    r->calls++;
    r->outcome = res->outcome;
    r->status = res->status;
    r->body_null = res->body == NULL;
    r->body_len = res->body_len < sizeof(r->body) - 1 ? res->body_len : sizeof(r->body) - 1;
    if (res->body) memcpy(r->body, res->body, r->body_len);
    r->body[r->body_len] = '\0';
    snprintf(r->error, sizeof(r->error), "%s", res->error);
    copy_header(r->final_header, sizeof(r->final_header), res->handle, "x-final");
    copy_header(r->interim_header, sizeof(r->interim_header), res->handle, "X-Interim");
    r->done_at = now_ms();
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->m);
}

static inline int on_chunk(void *arg, fed_http_handle *h, const char *data, size_t len)
{
    rec *r = arg;
    pthread_mutex_lock(&r->m);
    r->chunks++;
    r->chunk_status = fed_http_handle_status(h);
    if (r->streamed_len + len < sizeof(r->streamed)) {
        memcpy(r->streamed + r->streamed_len, data, len);
        r->streamed_len += len;
    }
    srv *release = r->chunks == 1 ? r->release : NULL;
    int refuse = r->refuse_chunks;
    pthread_mutex_unlock(&r->m);
    if (release) {
        pthread_mutex_lock(&release->m);
        release->go = true;
        pthread_cond_broadcast(&release->cv);
        pthread_mutex_unlock(&release->m);
    }
    return refuse;
}

static inline bool rec_wait(rec *r)
{
    pthread_mutex_lock(&r->m);
    int64_t until = now_ms() + WAIT_MS;
    while (r->calls == 0 && now_ms() < until) rt_scope_wait(&r->cv, &r->m, until);
    bool ok = r->calls > 0;
    pthread_mutex_unlock(&r->m);
    return ok;
}

static inline int rec_calls(rec *r)
{
    pthread_mutex_lock(&r->m);
    int n = r->calls;
    pthread_mutex_unlock(&r->m);
    return n;
}

/* ---- the client ----------------------------------------------------------------------- */

typedef struct env {
    rt_metrics *metrics;
    fed_http *c;
    rt_iprange_list *black, *white;
} env;

static inline void env_open(env *e, int per_host, int queue_depth, const char *black,
                            const char *white, bool start)
{
    memset(e, 0, sizeof(*e));
    char err[128];
    if (black) e->black = rt_iprange_parse(&black, 1, err, sizeof(err));
    if (white) e->white = rt_iprange_parse(&white, 1, err, sizeof(err));
    e->metrics = rt_metrics_new();
    fed_http_settings s = {.max_connections = 16, .max_connections_per_host = per_host,
                           .queue_depth = queue_depth, .blacklist = e->black,
                           .whitelist = e->white};
    e->c = fed_http_new(&s, e->metrics);
    assert_non_null(e->c);
    if (start) assert_int_equal(fed_http_start(e->c), 0);
}

static inline void env_close(env *e)
{
    fed_http_stop(e->c);
    fed_http_free(e->c);
    rt_iprange_free(e->black);
    rt_iprange_free(e->white);
    rt_metrics_free(e->metrics);
}

static inline int64_t metric(env *e, const char *name, const char *labels)
{
    return rt_metric_value(rt_metric_gauge(e->metrics, name, labels, NULL));
}

static inline int64_t counter(env *e, const char *name, const char *labels)
{
    return rt_metric_value(rt_metric_counter(e->metrics, name, labels, NULL));
}

static inline fed_http_req get(const char *url, rec *r, int64_t timeout_ms)
{
    return (fed_http_req){.method = "GET", .url = url, .deadline_ms = now_ms() + timeout_ms,
                          .max_body_bytes = 1 << 20, .verify_tls = true, .on_done = on_done,
                          .arg = r};
}

static inline void url_of(char *buf, size_t n, const char *host, int port, const char *path)
{
    snprintf(buf, n, "http://%s:%d%s", host, port, path);
}

#endif
