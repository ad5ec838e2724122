/*
 * tests/unit/test_fed_http_refusals.c - the outbound client's requests that end without
 * an answer, against real sockets (tests/unit/fed_http_fixture.h): the connect-time
 * address rule (E_BLOCKED with no connection made, for IPv4 and IPv6; allowed by the
 * whitelist), the per-host gauges' bound, a refused connection, cancel (in flight and
 * while queued), stop with requests in flight, the queue bound, and malformed requests
 * refused at submit. Exchanges that get an answer are in test_fed_http.c. The only clock
 * assertions are about deadlines, with slack for a loaded machine.
 */
#include "fed_http_fixture.h"

/* ---- tests ------------------------------------------------------------------------------ */

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
