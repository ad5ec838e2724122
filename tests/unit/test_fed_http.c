/*
 * tests/unit/test_fed_http.c - the outbound client's exchanges against real sockets: small
 * HTTP servers run in threads of the test on 127.0.0.1 (tests/unit/fed_http_fixture.h),
 * and the client's I/O thread talks to them. What is specified here: a buffered answer
 * with its headers, a name connected to at the address given with its Host header,
 * keep-alive, a POST body arriving as sent, an interim response's headers not kept,
 * deadlines that end a peer that never answers and give its connection slot back (the
 * per-host cap holding meanwhile, another host served at once), both kinds of body cap,
 * and streaming chunks arriving before the end. The requests that end without an answer
 * (the address rule, cancel, stop, the queue bound, malformed requests) are in
 * test_fed_http_refusals.c. The only clock assertions are about deadlines, with slack for
 * a loaded machine.
 */
#include "fed_http_fixture.h"

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
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
