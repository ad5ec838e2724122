/*
 * tests/unit/test_fed_http.c - the outbound client against real sockets: small HTTP
 * servers run in threads of the test on 127.0.0.1, and the client's I/O thread talks to
 * them. What is specified here: a buffered answer with its headers, a POST body arriving
 * as sent, deadlines that end a peer that never answers and give its connection slot back
 * (the per-host cap holding meanwhile, another host served at once), both kinds of body
 * cap, streaming chunks arriving before the end, the connect-time address rule (E_BLOCKED
 * with no connection made; allowed by the whitelist), cancel, stop with requests in
 * flight, and the queue bound. Every wait is on a condition variable with a deadline;
 * the only clock assertions are about deadlines, with slack for a loaded machine.
 */
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

#define WAIT_MS 3000          /* the most any wait in this file may take */
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

static int64_t now_ms(void)
{
    return rt_now_ms();
}

static void srv_listen(srv *s)
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
static bool srv_listen6(srv *s)
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

static void write_all(int fd, const char *p, size_t n)
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
static size_t read_request(srv *s, int fd)
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

static void serve_stream(srv *s, int fd)
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

static void *srv_main(void *arg)
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

static void srv_run(srv *s, enum srv_mode mode, const char *response, int hang_first)
{
    s->mode = mode;
    s->response = response;
    s->hang_first = hang_first;
    assert_int_equal(pthread_create(&s->th, NULL, srv_main, s), 0);
    s->threaded = true;
}

static void srv_start(srv *s, enum srv_mode mode, const char *response, int hang_first)
{
    srv_listen(s);
    srv_run(s, mode, response, hang_first);
}

static void srv_stop(srv *s)
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
static bool peer_closes(int fd)
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

static bool srv_wait_accepted(srv *s, int n)
{
    pthread_mutex_lock(&s->m);
    int64_t until = now_ms() + WAIT_MS;
    while (s->accepted < n && now_ms() < until) rt_scope_wait(&s->cv, &s->m, until);
    bool ok = s->accepted >= n;
    pthread_mutex_unlock(&s->m);
    return ok;
}

static int srv_accepted(srv *s)
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

static void rec_init(rec *r)
{
    memset(r, 0, sizeof(*r));
    pthread_mutex_init(&r->m, NULL);
    rt_cond_init(&r->cv);
}

static void rec_destroy(rec *r)
{
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->m);
}

static void copy_header(char *dst, size_t n, fed_http_handle *h, const char *name)
{
    const char *v = fed_http_handle_header(h, name);
    snprintf(dst, n, "%s", v ? v : "(none)");
}

static void on_done(void *arg, const fed_http_result *res)
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

static int on_chunk(void *arg, fed_http_handle *h, const char *data, size_t len)
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

static bool rec_wait(rec *r)
{
    pthread_mutex_lock(&r->m);
    int64_t until = now_ms() + WAIT_MS;
    while (r->calls == 0 && now_ms() < until) rt_scope_wait(&r->cv, &r->m, until);
    bool ok = r->calls > 0;
    pthread_mutex_unlock(&r->m);
    return ok;
}

static int rec_calls(rec *r)
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

static void env_open(env *e, int per_host, int queue_depth, const char *black,
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

static void env_close(env *e)
{
    fed_http_stop(e->c);
    fed_http_free(e->c);
    rt_iprange_free(e->black);
    rt_iprange_free(e->white);
    rt_metrics_free(e->metrics);
}

static int64_t metric(env *e, const char *name, const char *labels)
{
    return rt_metric_value(rt_metric_gauge(e->metrics, name, labels, NULL));
}

static int64_t counter(env *e, const char *name, const char *labels)
{
    return rt_metric_value(rt_metric_counter(e->metrics, name, labels, NULL));
}

static fed_http_req get(const char *url, rec *r, int64_t timeout_ms)
{
    return (fed_http_req){.method = "GET", .url = url, .deadline_ms = now_ms() + timeout_ms,
                          .max_body_bytes = 1 << 20, .verify_tls = true, .on_done = on_done,
                          .arg = r};
}

static void url_of(char *buf, size_t n, const char *host, int port, const char *path)
{
    snprintf(buf, n, "http://%s:%d%s", host, port, path);
}

/* ---- tests ------------------------------------------------------------------------------ */

static void test_a_200_with_body_and_headers_is_buffered(void **state)
{
    (void)state;
    srv s;
    srv_start(&s, SRV_CANNED,
              "HTTP/1.1 200 OK\r\nContent-Length: 11\r\nX-Final: yes\r\nConnection: close\r\n\r\n"
              "hello world",
              0);
    env e;
    env_open(&e, 2, 16, NULL, NULL, true);
    rec r;
    rec_init(&r);
    char url[128];
    url_of(url, sizeof(url), "127.0.0.1", s.port, "/_matrix/key/v2/server");
    fed_http_req q = get(url, &r, 2000);
    fed_http_handle *h = NULL;
    assert_int_equal(fed_http_submit(e.c, &q, &h), 0);
    assert_non_null(h);
    assert_true(rec_wait(&r));
    assert_int_equal(r.outcome, FED_HTTP_OK);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "hello world");
    assert_int_equal(r.body_len, 11);
    assert_string_equal(r.final_header, "yes");
    assert_string_equal(r.error, "");
    assert_true(strstr(s.request, "GET /_matrix/key/v2/server HTTP/1.1\r\n") == s.request);
    assert_int_equal(counter(&e, "atrium_federation_outbound_requests_total", "outcome=\"ok\""), 1);
    assert_int_equal(metric(&e, "atrium_federation_outbound_in_flight", NULL), 0);
    rec_destroy(&r);
    env_close(&e);
    srv_stop(&s);
}

static void test_a_name_connects_to_the_given_address_with_its_host_header(void **state)
{
    (void)state;
    srv s;
    srv_start(&s, SRV_CANNED, "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n", 0);
    env e;
    env_open(&e, 2, 16, NULL, NULL, true);
    rec r;
    rec_init(&r);
    char url[128];
    url_of(url, sizeof(url), "peer.invalid", s.port, "/x");
    const char *addrs[] = {"127.0.0.1", NULL};
    fed_http_req q = get(url, &r, 2000);
    q.connect_addrs = addrs;
    q.host_header = "example.org";
    assert_int_equal(fed_http_submit(e.c, &q, NULL), 0);
    assert_true(rec_wait(&r));
    assert_int_equal(r.outcome, FED_HTTP_OK);
    assert_int_equal(r.status, 204);
    assert_non_null(strstr(s.request, "\r\nHost: example.org\r\n"));
    /* Without addresses a name is refused at submit: the client never resolves. */
    q.connect_addrs = NULL;
    assert_int_equal(fed_http_submit(e.c, &q, NULL), ATRIUM_E_INVAL);
    rec_destroy(&r);
    env_close(&e);
    srv_stop(&s);
}

static void test_a_connection_is_kept_alive_for_the_next_request(void **state)
{
    (void)state;
    srv s;
    srv_start(&s, SRV_KEEPALIVE, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nka", 0);
    env e;
    env_open(&e, 2, 16, NULL, NULL, true);
    char url[128];
    url_of(url, sizeof(url), "127.0.0.1", s.port, "/");
    for (int i = 0; i < 3; i++) {
        rec r;
        rec_init(&r);
        fed_http_req q = get(url, &r, 2000);
        assert_int_equal(fed_http_submit(e.c, &q, NULL), 0);
        assert_true(rec_wait(&r));
        assert_int_equal(r.outcome, FED_HTTP_OK);
        assert_string_equal(r.body, "ka");
        rec_destroy(&r);
    }
    assert_int_equal(srv_accepted(&s), 1);
    env_close(&e);
    srv_stop(&s);
}

static void test_a_post_body_arrives_as_sent(void **state)
{
    (void)state;
    srv s;
    srv_start(&s, SRV_CANNED,
              "HTTP/1.1 201 Created\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}", 0);
    env e;
    env_open(&e, 2, 16, NULL, NULL, true);
    rec r;
    rec_init(&r);
    char url[128];
    url_of(url, sizeof(url), "127.0.0.1", s.port, "/_matrix/key/v2/query");
    const char *headers[] = {"Authorization: X-Matrix origin=\"a\"", NULL};
    const char body[] = "{\"server_keys\":{\"b\":{}}}";
    fed_http_req q = get(url, &r, 2000);
    q.method = "POST";
    q.body = body;
    q.body_len = strlen(body);
    q.content_type = "application/json";
    q.headers = headers;
    assert_int_equal(fed_http_submit(e.c, &q, NULL), 0);
    assert_true(rec_wait(&r));
    assert_int_equal(r.outcome, FED_HTTP_OK);
    assert_int_equal(r.status, 201);
    assert_string_equal(r.body, "{}");
    assert_true(strstr(s.request, "POST /_matrix/key/v2/query HTTP/1.1\r\n") == s.request);
    assert_non_null(strstr(s.request, "\r\nContent-Type: application/json\r\n"));
    assert_non_null(strstr(s.request, "\r\nAuthorization: X-Matrix origin=\"a\"\r\n"));
    assert_null(strstr(s.request, "Expect:"));
    const char *sent = strstr(s.request, "\r\n\r\n");
    assert_non_null(sent);
    assert_string_equal(sent + 4, body);
    rec_destroy(&r);
    env_close(&e);
    srv_stop(&s);
}

static void test_headers_of_an_interim_response_are_not_kept(void **state)
{
    (void)state;
    srv s;
    srv_start(&s, SRV_CANNED,
              "HTTP/1.1 100 Continue\r\nX-Interim: 1\r\n\r\n"
              "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Final: 1\r\nConnection: close\r\n\r\nok",
              0);
    env e;
    env_open(&e, 2, 16, NULL, NULL, true);
    rec r;
    rec_init(&r);
    char url[128];
    url_of(url, sizeof(url), "127.0.0.1", s.port, "/");
    fed_http_req q = get(url, &r, 2000);
    q.method = "PUT";
    q.body = "x";
    q.body_len = 1;
    assert_int_equal(fed_http_submit(e.c, &q, NULL), 0);
    assert_true(rec_wait(&r));
    assert_int_equal(r.outcome, FED_HTTP_OK);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "ok");
    assert_string_equal(r.final_header, "1");
    assert_string_equal(r.interim_header, "(none)");
    assert_true(strstr(s.request, "PUT / HTTP/1.1\r\n") == s.request);
    rec_destroy(&r);
    env_close(&e);
    srv_stop(&s);
}

/* Per-host cap 2: two requests to A hang, a third to A waits for a slot without
 * connecting, B is served at once; at their deadline the two end, their connections
 * close, and the third gets a slot and its answer. */
static void test_a_silent_peer_ends_at_the_deadline_and_gives_its_slots_back(void **state)
{
    (void)state;
    srv a, b;
    srv_start(&a, SRV_CANNED,
              "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nthird", 2);
    srv_start(&b, SRV_CANNED, "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nConnection: close\r\n\r\nb", 0);
    env e;
    env_open(&e, 2, 16, NULL, NULL, true);
    rec hung[2], third, other;
    char url_a[128], url_b[128];
    url_of(url_a, sizeof(url_a), "127.0.0.1", a.port, "/hang");
    url_of(url_b, sizeof(url_b), "127.0.0.1", b.port, "/b");
    int64_t t0 = now_ms();
    const int64_t hang_ms = 500;
    for (int i = 0; i < 2; i++) {
        rec_init(&hung[i]);
        fed_http_req q = get(url_a, &hung[i], hang_ms);
        q.host_key = "server-a";
        assert_int_equal(fed_http_submit(e.c, &q, NULL), 0);
    }
    int64_t hung_deadline = t0 + hang_ms;
    rec_init(&third);
    fed_http_req q3 = get(url_a, &third, 2500);
    q3.host_key = "server-a";
    assert_int_equal(fed_http_submit(e.c, &q3, NULL), 0);
    assert_true(srv_wait_accepted(&a, 2));

    rec_init(&other);
    fed_http_req qb = get(url_b, &other, 2000);
    assert_int_equal(fed_http_submit(e.c, &qb, NULL), 0);
    assert_true(rec_wait(&other));
    assert_int_equal(other.outcome, FED_HTTP_OK);
    assert_string_equal(other.body, "b");
    /* B was answered while A's two hung and the third waited without a connection. */
    assert_true(other.done_at < hung_deadline);
    assert_int_equal(rec_calls(&hung[0]) + rec_calls(&hung[1]) + rec_calls(&third), 0);
    assert_int_equal(srv_accepted(&a), 2);
    assert_int_equal(metric(&e, "atrium_federation_outbound_host_in_flight", "host=\"server-a\""), 3);

    for (int i = 0; i < 2; i++) {
        assert_true(rec_wait(&hung[i]));
        assert_int_equal(hung[i].outcome, FED_HTTP_E_TIMEOUT);
        assert_int_equal(hung[i].status, 0);
        assert_true(hung[i].done_at >= hung_deadline - 5);
        assert_true(hung[i].done_at < hung_deadline + SLACK_MS);
    }
    assert_true(rec_wait(&third));
    assert_int_equal(third.outcome, FED_HTTP_OK);
    assert_string_equal(third.body, "third");
    assert_int_equal(srv_accepted(&a), 3);
    assert_int_equal(metric(&e, "atrium_federation_outbound_host_in_flight", "host=\"server-a\""), 0);
    assert_int_equal(counter(&e, "atrium_federation_outbound_requests_total", "outcome=\"timeout\""), 2);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(hung[i].calls, 1);
        rec_destroy(&hung[i]);
    }
    rec_destroy(&third);
    rec_destroy(&other);
    env_close(&e);
    srv_stop(&a);
    srv_stop(&b);
}

static void test_a_request_waiting_for_a_slot_also_ends_at_its_deadline(void **state)
{
    (void)state;
    srv a;
    srv_start(&a, SRV_CANNED, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", 1);
    env e;
    env_open(&e, 1, 16, NULL, NULL, true);
    rec hung, waiting;
    rec_init(&hung);
    rec_init(&waiting);
    char url[128];
    url_of(url, sizeof(url), "127.0.0.1", a.port, "/");
    fed_http_req q1 = get(url, &hung, 2000);
    assert_int_equal(fed_http_submit(e.c, &q1, NULL), 0);
    assert_true(srv_wait_accepted(&a, 1));
    int64_t t0 = now_ms();
    fed_http_req q2 = get(url, &waiting, 200);
    assert_int_equal(fed_http_submit(e.c, &q2, NULL), 0);
    assert_true(rec_wait(&waiting));
    assert_int_equal(waiting.outcome, FED_HTTP_E_TIMEOUT);
    assert_true(waiting.done_at >= t0 + 195);
    assert_true(waiting.done_at < t0 + 200 + SLACK_MS);
    assert_int_equal(rec_calls(&hung), 0);
    assert_int_equal(srv_accepted(&a), 1);
    env_close(&e); /* ends the hung one */
    assert_int_equal(hung.calls, 1);
    assert_int_equal(hung.outcome, FED_HTTP_E_CANCELLED);
    rec_destroy(&hung);
    rec_destroy(&waiting);
    srv_stop(&a);
}

static void test_a_declared_too_large_body_is_refused_from_its_headers(void **state)
{
    (void)state;
    srv s;
    srv_start(&s, SRV_CANNED, "HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\nabc", 0);
    env e;
    env_open(&e, 2, 16, NULL, NULL, true);
    rec r;
    rec_init(&r);
    char url[128];
    url_of(url, sizeof(url), "127.0.0.1", s.port, "/big");
    fed_http_req q = get(url, &r, 2000);
    q.max_body_bytes = 1000;
    assert_int_equal(fed_http_submit(e.c, &q, NULL), 0);
    assert_true(rec_wait(&r));
    assert_int_equal(r.outcome, FED_HTTP_E_TOO_LARGE);
    assert_non_null(strstr(r.error, "declares 100000 bytes"));
    assert_true(r.body_null);
    rec_destroy(&r);
    env_close(&e);
    srv_stop(&s);
}

static const char *chunked_body(size_t chunks, size_t chunk_bytes)
{
    static char buf[8192];
    size_t len = (size_t)snprintf(buf, sizeof(buf),
                                  "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
                                  "Connection: close\r\n\r\n");
    for (size_t i = 0; i < chunks; i++) {
        len += (size_t)snprintf(buf + len, sizeof(buf) - len, "%zx\r\n", chunk_bytes);
        memset(buf + len, 'a' + (int)i, chunk_bytes);
        len += chunk_bytes;
        len += (size_t)snprintf(buf + len, sizeof(buf) - len, "\r\n");
    }
    snprintf(buf + len, sizeof(buf) - len, "0\r\n\r\n");
    return buf;
}

static void test_a_chunked_body_is_counted_while_read(void **state)
{
    (void)state;
    char *over = strdup(chunked_body(3, 400)); /* 1200 bytes */
    char *exact = strdup(chunked_body(2, 500)); /* 1000 bytes */
    srv s_over, s_exact;
    srv_start(&s_over, SRV_CANNED, over, 0);
    srv_start(&s_exact, SRV_CANNED, exact, 0);
    env e;
    env_open(&e, 2, 16, NULL, NULL, true);
    rec r_over, r_exact;
    rec_init(&r_over);
    rec_init(&r_exact);
    char url[128];
    url_of(url, sizeof(url), "127.0.0.1", s_over.port, "/");
    fed_http_req q = get(url, &r_over, 2000);
    q.max_body_bytes = 1000;
    assert_int_equal(fed_http_submit(e.c, &q, NULL), 0);
    char url2[128];
    url_of(url2, sizeof(url2), "127.0.0.1", s_exact.port, "/");
    fed_http_req q2 = get(url2, &r_exact, 2000);
    q2.max_body_bytes = 1000;
    assert_int_equal(fed_http_submit(e.c, &q2, NULL), 0);
    assert_true(rec_wait(&r_over));
    assert_true(rec_wait(&r_exact));
    assert_int_equal(r_over.outcome, FED_HTTP_E_TOO_LARGE);
    assert_non_null(strstr(r_over.error, "the cap is 1000"));
    assert_int_equal(r_exact.outcome, FED_HTTP_OK);
    assert_int_equal(r_exact.body_len, 1000);
    assert_int_equal(counter(&e, "atrium_federation_outbound_requests_total",
                             "outcome=\"too_large\""), 1);
    rec_destroy(&r_over);
    rec_destroy(&r_exact);
    env_close(&e);
    srv_stop(&s_over);
    srv_stop(&s_exact);
    free(over);
    free(exact);
}

static void test_streamed_chunks_arrive_before_the_end(void **state)
{
    (void)state;
    srv s;
    srv_start(&s, SRV_STREAM, NULL, 0);
    env e;
    env_open(&e, 2, 16, NULL, NULL, true);
    rec r;
    rec_init(&r);
    r.release = &s; /* the server sends the rest only after our first chunk arrived */
    char url[128];
    url_of(url, sizeof(url), "127.0.0.1", s.port, "/media");
    fed_http_req q = get(url, &r, 2000);
    q.on_chunk = on_chunk;
    assert_int_equal(fed_http_submit(e.c, &q, NULL), 0);
    assert_true(rec_wait(&r));
    assert_int_equal(r.outcome, FED_HTTP_OK);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.chunk_status, 200);
    assert_true(r.chunks >= 2);
    assert_int_equal(r.streamed_len, 11);
    assert_memory_equal(r.streamed, "hello world", 11);
    assert_true(r.body_null);
    rec_destroy(&r);
    env_close(&e);
    srv_stop(&s);
}

static void test_a_refusing_chunk_callback_cancels_the_request(void **state)
{
    (void)state;
    srv s;
    srv_start(&s, SRV_STREAM, NULL, 0);
    env e;
    env_open(&e, 2, 16, NULL, NULL, true);
    rec r;
    rec_init(&r);
    r.release = &s;
    r.refuse_chunks = 1;
    char url[128];
    url_of(url, sizeof(url), "127.0.0.1", s.port, "/media");
    fed_http_req q = get(url, &r, 2000);
    q.on_chunk = on_chunk;
    assert_int_equal(fed_http_submit(e.c, &q, NULL), 0);
    assert_true(rec_wait(&r));
    assert_int_equal(r.outcome, FED_HTTP_E_CANCELLED);
    assert_int_equal(r.chunks, 1);
    rec_destroy(&r);
    env_close(&e);
    srv_stop(&s);
}

/* No thread accepts on this listener: a connection, had one been made, would wait in its
 * backlog, and poll would see it. */
static bool listener_has_pending_connection(srv *s)
{
    struct pollfd p = {.fd = s->lfd, .events = POLLIN};
    return poll(&p, 1, 50) > 0;
}

static void test_a_blacklisted_address_is_refused_at_connect(void **state)
{
    (void)state;
    srv s;
    srv_listen(&s);
    env e;
    env_open(&e, 2, 16, "127.0.0.0/8", NULL, true);
    rec r, by_name;
    rec_init(&r);
    rec_init(&by_name);
    char url[128];
    url_of(url, sizeof(url), "127.0.0.1", s.port, "/");
    fed_http_req q = get(url, &r, 2000);
    assert_int_equal(fed_http_submit(e.c, &q, NULL), 0);
    /* A name whose address is blacklisted: the check is on the address connected to. */
    char url2[128];
    url_of(url2, sizeof(url2), "looks-public.example", s.port, "/");
    const char *addrs[] = {"127.0.0.1", NULL};
    fed_http_req q2 = get(url2, &by_name, 2000);
    q2.connect_addrs = addrs;
    assert_int_equal(fed_http_submit(e.c, &q2, NULL), 0);
    assert_true(rec_wait(&r));
    assert_true(rec_wait(&by_name));
    assert_int_equal(r.outcome, FED_HTTP_E_BLOCKED);
    assert_non_null(strstr(r.error, "127.0.0.1"));
    assert_non_null(strstr(r.error, "ip_range_blacklist"));
    assert_int_equal(by_name.outcome, FED_HTTP_E_BLOCKED);
    assert_false(listener_has_pending_connection(&s));
    assert_int_equal(counter(&e, "atrium_federation_outbound_requests_total",
                             "outcome=\"blocked\""), 2);
    rec_destroy(&r);
    rec_destroy(&by_name);
    env_close(&e);
    srv_stop(&s);
}

static void test_the_whitelist_reopens_a_blacklisted_range(void **state)
{
    (void)state;
    srv s;
    srv_start(&s, SRV_CANNED, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok", 0);
    env e;
    env_open(&e, 2, 16, "127.0.0.0/8", "127.0.0.0/8", true);
    rec r;
    rec_init(&r);
    char url[128];
    url_of(url, sizeof(url), "127.0.0.1", s.port, "/");
    fed_http_req q = get(url, &r, 2000);
    assert_int_equal(fed_http_submit(e.c, &q, NULL), 0);
    assert_true(rec_wait(&r));
    assert_int_equal(r.outcome, FED_HTTP_OK);
    assert_string_equal(r.body, "ok");
    rec_destroy(&r);
    env_close(&e);
    srv_stop(&s);
}

static void test_ipv6_addresses_are_connected_to_and_checked(void **state)
{
    (void)state;
    srv s;
    if (!srv_listen6(&s)) {
        fprintf(stderr, "no IPv6 loopback on this machine: skipping\n");
        skip();
    }
    srv_run(&s, SRV_CANNED,
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nv6", 0);
    char by_name[128], literal[128];
    url_of(by_name, sizeof(by_name), "peer6.invalid", s.port, "/");
    snprintf(literal, sizeof(literal), "http://[::1]:%d/", s.port);
    const char *addrs[] = {"::1", NULL};

    env open;
    env_open(&open, 2, 16, NULL, NULL, true);
    rec r1, r2;
    rec_init(&r1);
    rec_init(&r2);
    fed_http_req q1 = get(by_name, &r1, 2000);
    q1.connect_addrs = addrs;
    assert_int_equal(fed_http_submit(open.c, &q1, NULL), 0);
    assert_true(rec_wait(&r1));
    assert_int_equal(r1.outcome, FED_HTTP_OK);
    assert_string_equal(r1.body, "v6");
    fed_http_req q2 = get(literal, &r2, 2000);
    assert_int_equal(fed_http_submit(open.c, &q2, NULL), 0);
    assert_true(rec_wait(&r2));
    assert_int_equal(r2.outcome, FED_HTTP_OK);
    env_close(&open);
    int served = srv_accepted(&s);
    assert_int_equal(served, 2);

    env shut;
    env_open(&shut, 2, 16, "::1/128", NULL, true);
    rec r3;
    rec_init(&r3);
    fed_http_req q3 = get(by_name, &r3, 2000);
    q3.connect_addrs = addrs;
    assert_int_equal(fed_http_submit(shut.c, &q3, NULL), 0);
    assert_true(rec_wait(&r3));
    assert_int_equal(r3.outcome, FED_HTTP_E_BLOCKED);
    assert_non_null(strstr(r3.error, "::1"));
    env_close(&shut);
    assert_int_equal(srv_accepted(&s), served);
    rec_destroy(&r1);
    rec_destroy(&r2);
    rec_destroy(&r3);
    srv_stop(&s);
}

/* One labelled gauge per host key, up to 256; the rest share host="other". */
static void test_per_host_gauges_are_bounded(void **state)
{
    (void)state;
    env e;
    env_open(&e, 2, 512, "0.0.0.0/0", NULL, true); /* every connect refused: quick ends */
    enum { N = 260 };
    rec *r = calloc(N, sizeof(rec));
    char keys[N][16];
    for (int i = 0; i < N; i++) {
        rec_init(&r[i]);
        snprintf(keys[i], sizeof(keys[i]), "h%d", i);
        fed_http_req q = get("http://127.0.0.1:9/", &r[i], 2000);
        q.host_key = keys[i];
        assert_int_equal(fed_http_submit(e.c, &q, NULL), 0);
    }
    for (int i = 0; i < N; i++) {
        assert_true(rec_wait(&r[i]));
        assert_int_equal(r[i].outcome, FED_HTTP_E_BLOCKED);
        rec_destroy(&r[i]);
    }
    free(r);
    size_t len;
    char *text = rt_metrics_render(e.metrics, &len);
    assert_non_null(strstr(text, "atrium_federation_outbound_host_in_flight{host=\"h0\"} 0\n"));
    assert_non_null(strstr(text, "atrium_federation_outbound_host_in_flight{host=\"h255\"} 0\n"));
    assert_null(strstr(text, "host=\"h256\""));
    assert_non_null(strstr(text, "atrium_federation_outbound_host_in_flight{host=\"other\"} 0\n"));
    free(text);
    env_close(&e);
}

static void test_a_refused_connection_is_a_connect_error(void **state)
{
    (void)state;
    srv s;
    srv_listen(&s);
    int port = s.port;
    srv_stop(&s); /* nothing listens there any more */
    env e;
    env_open(&e, 2, 16, NULL, NULL, true);
    rec r;
    rec_init(&r);
    char url[128];
    url_of(url, sizeof(url), "127.0.0.1", port, "/");
    fed_http_req q = get(url, &r, 2000);
    assert_int_equal(fed_http_submit(e.c, &q, NULL), 0);
    assert_true(rec_wait(&r));
    assert_int_equal(r.outcome, FED_HTTP_E_CONNECT);
    assert_true(r.error[0] != '\0');
    rec_destroy(&r);
    env_close(&e);
}

static void test_cancel_ends_a_request_at_once(void **state)
{
    (void)state;
    srv s;
    srv_start(&s, SRV_CANNED, "", 1);
    env e;
    env_open(&e, 2, 16, NULL, NULL, true);
    rec r;
    rec_init(&r);
    char url[128];
    url_of(url, sizeof(url), "127.0.0.1", s.port, "/");
    fed_http_req q = get(url, &r, 2500);
    fed_http_handle *h = NULL;
    assert_int_equal(fed_http_submit(e.c, &q, &h), 0);
    assert_true(srv_wait_accepted(&s, 1));
    int64_t t0 = now_ms();
    fed_http_cancel(e.c, h);
    assert_true(rec_wait(&r));
    assert_int_equal(r.outcome, FED_HTTP_E_CANCELLED);
    assert_true(r.done_at - t0 < SLACK_MS);
    /* The server sees its connection closed: the slot is given back. */
    assert_true(peer_closes(s.hung[0]));
    env_close(&e);
    assert_int_equal(r.calls, 1);
    rec_destroy(&r);
    srv_stop(&s);
}

static void test_a_request_cancelled_while_queued_never_connects(void **state)
{
    (void)state;
    srv s;
    srv_listen(&s); /* nobody accepts: a connection would wait in the backlog */
    env e;
    env_open(&e, 2, 16, NULL, NULL, false);
    rec r;
    rec_init(&r);
    char url[128];
    url_of(url, sizeof(url), "127.0.0.1", s.port, "/");
    fed_http_req q = get(url, &r, 2000);
    fed_http_handle *h = NULL;
    assert_int_equal(fed_http_submit(e.c, &q, &h), 0);
    fed_http_cancel(e.c, h);
    assert_int_equal(fed_http_start(e.c), 0);
    assert_true(rec_wait(&r));
    assert_int_equal(r.outcome, FED_HTTP_E_CANCELLED);
    assert_false(listener_has_pending_connection(&s));
    env_close(&e);
    assert_int_equal(r.calls, 1);
    rec_destroy(&r);
    srv_stop(&s);
}

static void test_stop_ends_every_request_once(void **state)
{
    (void)state;
    srv s;
    srv_start(&s, SRV_CANNED, "", 100);
    env e;
    env_open(&e, 2, 16, NULL, NULL, true);
    enum { N = 4 };
    rec r[N];
    char url[128];
    url_of(url, sizeof(url), "127.0.0.1", s.port, "/");
    for (int i = 0; i < N; i++) {
        rec_init(&r[i]);
        fed_http_req q = get(url, &r[i], 2500);
        assert_int_equal(fed_http_submit(e.c, &q, NULL), 0);
    }
    assert_true(srv_wait_accepted(&s, 2)); /* two connected, two wait for a slot */
    int64_t t0 = now_ms();
    fed_http_stop(e.c);
    assert_true(now_ms() - t0 < SLACK_MS);
    for (int i = 0; i < N; i++) {
        assert_int_equal(r[i].calls, 1);
        assert_int_equal(r[i].outcome, FED_HTTP_E_CANCELLED);
    }
    rec extra;
    rec_init(&extra);
    fed_http_req q = get(url, &extra, 1000);
    assert_int_equal(fed_http_submit(e.c, &q, NULL), ATRIUM_E_STOPPED);
    env_close(&e);
    for (int i = 0; i < N; i++) {
        assert_int_equal(r[i].calls, 1);
        rec_destroy(&r[i]);
    }
    assert_int_equal(extra.calls, 0);
    rec_destroy(&extra);
    srv_stop(&s);
}

static void test_a_full_queue_refuses_at_once(void **state)
{
    (void)state;
    env e;
    env_open(&e, 2, 2, NULL, NULL, false); /* not started: nothing leaves the queue */
    rec r[3];
    for (int i = 0; i < 3; i++) rec_init(&r[i]);
    fed_http_req q0 = get("http://127.0.0.1:9/", &r[0], 1000);
    fed_http_req q1 = get("http://127.0.0.1:9/", &r[1], 1000);
    fed_http_req q2 = get("http://127.0.0.1:9/", &r[2], 1000);
    assert_int_equal(fed_http_submit(e.c, &q0, NULL), 0);
    assert_int_equal(fed_http_submit(e.c, &q1, NULL), 0);
    fed_http_handle *h = (fed_http_handle *)(uintptr_t)1; /* cleared on refusal */
    assert_int_equal(fed_http_submit(e.c, &q2, &h), ATRIUM_E_LIMIT);
    assert_null(h);
    assert_int_equal(metric(&e, "atrium_federation_outbound_queued", NULL), 2);
    assert_int_equal(counter(&e, "atrium_federation_outbound_refused_total", NULL), 1);
    fed_http_stop(e.c); /* the queued two end, cancelled; the refused one never */
    assert_int_equal(r[0].calls, 1);
    assert_int_equal(r[1].calls, 1);
    assert_int_equal(r[0].outcome, FED_HTTP_E_CANCELLED);
    assert_int_equal(r[2].calls, 0);
    assert_int_equal(metric(&e, "atrium_federation_outbound_queued", NULL), 0);
    for (int i = 0; i < 3; i++) rec_destroy(&r[i]);
    env_close(&e);
}

static void test_malformed_requests_are_refused_at_submit(void **state)
{
    (void)state;
    env e;
    env_open(&e, 2, 16, NULL, NULL, false);
    rec r;
    rec_init(&r);
    fed_http_req ok = get("https://127.0.0.1:8448/", &r, 1000);
    fed_http_req q = ok;
    q.method = "PATCH";
    assert_int_equal(fed_http_submit(e.c, &q, NULL), ATRIUM_E_INVAL);
    q = ok;
    q.url = "ftp://127.0.0.1/";
    assert_int_equal(fed_http_submit(e.c, &q, NULL), ATRIUM_E_INVAL);
    q = ok;
    q.url = "not a url";
    assert_int_equal(fed_http_submit(e.c, &q, NULL), ATRIUM_E_INVAL);
    q = ok;
    const char *bad_headers[] = {"X-A: 1\r\nX-Injected: 2", NULL};
    q.headers = bad_headers;
    assert_int_equal(fed_http_submit(e.c, &q, NULL), ATRIUM_E_INVAL);
    q = ok;
    q.host_header = "a\r\nb";
    assert_int_equal(fed_http_submit(e.c, &q, NULL), ATRIUM_E_INVAL);
    q = ok;
    q.url = "https://example.org/";
    const char *not_ips[] = {"example.net", NULL};
    q.connect_addrs = not_ips;
    assert_int_equal(fed_http_submit(e.c, &q, NULL), ATRIUM_E_INVAL);
    q = ok;
    q.on_done = NULL;
    assert_int_equal(fed_http_submit(e.c, &q, NULL), ATRIUM_E_INVAL);
    q = ok;
    q.url = "https://[::1]:8448/";
    assert_int_equal(fed_http_submit(e.c, &q, NULL), 0); /* an IPv6 literal needs no address */
    env_close(&e);
    assert_int_equal(r.calls, 1);
    rec_destroy(&r);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_200_with_body_and_headers_is_buffered),
        cmocka_unit_test(test_a_name_connects_to_the_given_address_with_its_host_header),
        cmocka_unit_test(test_a_connection_is_kept_alive_for_the_next_request),
        cmocka_unit_test(test_a_post_body_arrives_as_sent),
        cmocka_unit_test(test_headers_of_an_interim_response_are_not_kept),
        cmocka_unit_test(test_a_silent_peer_ends_at_the_deadline_and_gives_its_slots_back),
        cmocka_unit_test(test_a_request_waiting_for_a_slot_also_ends_at_its_deadline),
        cmocka_unit_test(test_a_declared_too_large_body_is_refused_from_its_headers),
        cmocka_unit_test(test_a_chunked_body_is_counted_while_read),
        cmocka_unit_test(test_streamed_chunks_arrive_before_the_end),
        cmocka_unit_test(test_a_refusing_chunk_callback_cancels_the_request),
        cmocka_unit_test(test_a_blacklisted_address_is_refused_at_connect),
        cmocka_unit_test(test_the_whitelist_reopens_a_blacklisted_range),
        cmocka_unit_test(test_ipv6_addresses_are_connected_to_and_checked),
        cmocka_unit_test(test_per_host_gauges_are_bounded),
        cmocka_unit_test(test_a_refused_connection_is_a_connect_error),
        cmocka_unit_test(test_cancel_ends_a_request_at_once),
        cmocka_unit_test(test_a_request_cancelled_while_queued_never_connects),
        cmocka_unit_test(test_stop_ends_every_request_once),
        cmocka_unit_test(test_a_full_queue_refuses_at_once),
        cmocka_unit_test(test_malformed_requests_are_refused_at_submit),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
