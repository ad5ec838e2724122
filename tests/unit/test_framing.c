/*
 * tests/unit/test_framing.c - the rules for where a request's body ends
 * (core/http/framing.c), which the gate and the request pool both apply: each row is a
 * head's Content-Length and Transfer-Encoding lines and the status it must get.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "core/http/http.h"

typedef struct {
    const char *what;
    const char *lines[3][2]; /* name, value; NULL name ends */
    int status;
} framing_case;

static const framing_case CASES[] = {
    {"no body headers", {{NULL, NULL}}, 0},
    {"a length", {{"Content-Length", "12"}}, 0},
    {"a length with blanks around", {{"content-length", " \t12 "}}, 0},
    {"the same length twice", {{"Content-Length", "2"}, {"Content-Length", "2"}}, 0},
    {"lengths that disagree", {{"Content-Length", "2"}, {"Content-Length", "3"}}, 400},
    {"an empty length", {{"Content-Length", ""}}, 400},
    {"a length that is no number", {{"Content-Length", "abc"}}, 400},
    {"a negative length", {{"Content-Length", "-1"}}, 400},
    {"a signed length", {{"Content-Length", "+1"}}, 400},
    {"a length with trailing bytes", {{"Content-Length", "12x"}}, 400},
    {"the largest length", {{"Content-Length", "9223372036854775807"}}, 0},
    {"a length of 2^63", {{"Content-Length", "9223372036854775808"}}, 413},
    {"a length of 40 digits", {{"Content-Length", "1234567890123456789012345678901234567890"}}, 413},
    {"chunked", {{"Transfer-Encoding", "chunked"}}, 0},
    {"Chunked, any case", {{"transfer-encoding", "CHUNKED"}}, 0},
    {"gzip only", {{"Transfer-Encoding", "gzip"}}, 400},
    {"chunked then identity", {{"Transfer-Encoding", "chunked, identity"}}, 400},
    {"gzip then chunked", {{"Transfer-Encoding", "gzip, chunked"}}, 501},
    {"gzip then chunked, two lines", {{"Transfer-Encoding", "gzip"}, {"Transfer-Encoding", "chunked"}}, 501},
    {"chunked twice", {{"Transfer-Encoding", "chunked, chunked"}}, 400},
    {"chunked twice, two lines", {{"Transfer-Encoding", "chunked"}, {"Transfer-Encoding", "chunked"}}, 400},
    {"empty list items", {{"Transfer-Encoding", " , chunked , "}}, 0},
    {"an empty coding", {{"Transfer-Encoding", ""}}, 400},
    {"length and chunked", {{"Content-Length", "2"}, {"Transfer-Encoding", "chunked"}}, 400},
    {"chunked and length", {{"Transfer-Encoding", "chunked"}, {"Content-Length", "2"}}, 400},
    {"a bad length before chunked: the first refusal stands",
     {{"Content-Length", "x"}, {"Transfer-Encoding", "chunked"}}, 400},
};

static void test_every_row_gets_its_status(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(CASES) / sizeof(CASES[0]); i++) {
        const framing_case *c = &CASES[i];
        http_framing f = {0};
        for (int k = 0; k < 3 && c->lines[k][0]; k++)
            http_framing_header(&f, c->lines[k][0], strlen(c->lines[k][0]), c->lines[k][1],
                                strlen(c->lines[k][1]));
        int status = http_framing_end(&f);
        if (status != c->status) fail_msg("%s: %d, expected %d", c->what, status, c->status);
        if (status) {
            assert_non_null(f.errcode);
            assert_memory_equal(f.errcode, "M_", 2);
            assert_non_null(f.msg);
        }
    }
}

static void test_values_need_no_terminating_nul(void **state)
{
    (void)state;
    /* slices of a larger buffer, as the gate passes them */
    const char head[] = "Content-Length: 25xyz";
    http_framing f = {0};
    assert_int_equal(http_framing_header(&f, head, 14, head + 15, 3), 0);
    assert_int_equal(http_framing_end(&f), 0);
    assert_true(f.length == 25);
}

static void test_head_limits(void **state)
{
    (void)state;
    const char *code, *msg;
    assert_int_equal(http_head_limits(HTTP_MAX_HEAD_BYTES, HTTP_MAX_HEADERS, HTTP_MAX_QUERY_ARGS,
                                      &code, &msg),
                     0);
    assert_int_equal(http_head_limits(HTTP_MAX_HEAD_BYTES + 1, 0, 0, &code, &msg), 431);
    assert_int_equal(http_head_limits(100, HTTP_MAX_HEADERS + 1, 0, &code, &msg), 431);
    assert_int_equal(http_head_limits(100, 0, HTTP_MAX_QUERY_ARGS + 1, &code, &msg), 400);
    assert_string_equal(code, "M_INVALID_PARAM");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_row_gets_its_status),
        cmocka_unit_test(test_values_need_no_terminating_nul),
        cmocka_unit_test(test_head_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
