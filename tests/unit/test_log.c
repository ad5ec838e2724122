/*
 * tests/unit/test_log.c - the log line format (timestamp, level, origin, request id from the
 * scope), one line per call, level filtering, and the clocks the line is stamped with.
 * stderr is captured through a pipe for the length of each call.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <regex.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/runtime/runtime.h"

enum { CAPTURE_BYTES = 65536 }; /* a pipe's default capacity */
static char captured[CAPTURE_BYTES];

/* Everything written to stderr between begin and end lands in `captured`. */
static int capture_pipe[2], saved_stderr;

static void capture_begin(void)
{
    assert_int_equal(pipe(capture_pipe), 0);
    saved_stderr = dup(STDERR_FILENO);
    dup2(capture_pipe[1], STDERR_FILENO);
}

static const char *capture_end(void)
{
    dup2(saved_stderr, STDERR_FILENO);
    close(saved_stderr);
    close(capture_pipe[1]);
    size_t len = 0;
    ssize_t n;
    while ((n = read(capture_pipe[0], captured + len, sizeof(captured) - 1 - len)) > 0)
        len += (size_t)n;
    close(capture_pipe[0]);
    assert_true(len < sizeof(captured) - 1); /* nothing was cut off */
    captured[len] = '\0';
    return captured;
}

static void assert_matches(const char *text, const char *pattern)
{
    regex_t re;
    assert_int_equal(regcomp(&re, pattern, REG_EXTENDED | REG_NOSUB), 0);
    int rc = regexec(&re, text, 0, NULL, 0);
    regfree(&re);
    if (rc != 0)
        fail_msg("\"%s\" does not match /%s/", text, pattern);
}

#define TIMESTAMP "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z"

static void test_log_line_has_utc_timestamp_level_origin_and_message(void **state)
{
    (void)state;
    capture_begin();
    rt_log(ATRIUM_LOG_INFO, "media", "stored %d bytes", 42);
    const char *out = capture_end();
    assert_matches(out, "^" TIMESTAMP " INFO  media stored 42 bytes\n$");
}

static void test_log_line_carries_the_instance_name_once_set(void **state)
{
    (void)state;
    rt_log_set_instance("atrium-b");
    capture_begin();
    rt_log(ATRIUM_LOG_WARN, "core", "lease lost");
    const char *out = capture_end();
    rt_log_set_instance(""); /* the other tests expect no name column */
    assert_matches(out, "^" TIMESTAMP " atrium-b WARN  core lease lost\n$");
    assert_string_equal(rt_log_instance_name(), "");
}

static void test_log_line_without_origin_omits_it(void **state)
{
    (void)state;
    capture_begin();
    rt_log(ATRIUM_LOG_WARN, NULL, "careful");
    const char *out = capture_end();
    assert_matches(out, "^" TIMESTAMP " WARN  careful\n$");
}

static void test_log_line_carries_the_request_id_published_in_the_scope(void **state)
{
    (void)state;
    capture_begin();
    {
        RT_SCOPE(ATRIUM_SCOPE_REQUEST_ID, "7f3a");
        rt_log(ATRIUM_LOG_ERROR, "core", "failed");
    }
    rt_log(ATRIUM_LOG_ERROR, "core", "outside");
    const char *out = capture_end();
    assert_matches(out, "^" TIMESTAMP " ERROR core \\[req 7f3a\\] failed\n" TIMESTAMP
                        " ERROR core outside\n$");
}

static void test_log_drops_lines_above_the_configured_level(void **state)
{
    (void)state;
    int before = rt_log_level();
    rt_log_set_level(ATRIUM_LOG_WARN);
    capture_begin();
    rt_log(ATRIUM_LOG_INFO, "core", "hidden");
    rt_log(ATRIUM_LOG_DEBUG, "core", "hidden too");
    rt_log(ATRIUM_LOG_WARN, "core", "shown");
    const char *out = capture_end();
    rt_log_set_level(before);
    assert_null(strstr(out, "hidden"));
    assert_non_null(strstr(out, "shown"));
}

static void test_log_message_with_line_breaks_stays_one_line(void **state)
{
    (void)state;
    capture_begin();
    rt_log(ATRIUM_LOG_INFO, "core", "user said \"a\nb\r\n\"");
    const char *out = capture_end();
    assert_matches(out, "^" TIMESTAMP " INFO  core user said \"a b  \"\n$");
}

static void test_log_cuts_an_overlong_line_and_marks_it(void **state)
{
    (void)state;
    enum { LONG = 10000 };
    char *msg = malloc(LONG + 1);
    memset(msg, 'x', LONG);
    msg[LONG] = '\0';
    capture_begin();
    rt_log(ATRIUM_LOG_INFO, "core", "%s", msg);
    const char *out = capture_end();
    free(msg);
    size_t len = strlen(out);
    assert_true(len < LONG);
    assert_string_equal(out + len - 4, "...\n");
    assert_ptr_equal(strchr(out, '\n'), out + len - 1); /* still one line */
}

enum { LOGGERS = 4, LINES_PER_LOGGER = 50 };

static void *log_lines(void *arg)
{
    const char *name = arg;
    for (int i = 0; i < LINES_PER_LOGGER; i++)
        rt_log(ATRIUM_LOG_INFO, name, "line %d of a message long enough to be worth tearing", i);
    return NULL;
}

static void test_log_lines_from_concurrent_threads_never_interleave(void **state)
{
    (void)state;
    static const char *names[LOGGERS] = {"t0", "t1", "t2", "t3"};
    pthread_t t[LOGGERS];
    capture_begin();
    for (int i = 0; i < LOGGERS; i++)
        pthread_create(&t[i], NULL, log_lines, (void *)names[i]);
    for (int i = 0; i < LOGGERS; i++)
        pthread_join(t[i], NULL);
    char *out = (char *)capture_end();
    int lines = 0;
    for (char *save = NULL, *line = strtok_r(out, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        assert_matches(line, "^" TIMESTAMP " INFO  t[0-3] line [0-9]+ of a message long "
                             "enough to be worth tearing$");
        lines++;
    }
    assert_int_equal(lines, LOGGERS * LINES_PER_LOGGER);
}

static int count_lines(const char *out, const char *needle)
{
    int n = 0;
    for (const char *p = out; (p = strstr(p, needle)) != NULL; p += strlen(needle)) n++;
    return n;
}

static void test_repeated_error_lines_are_written_once_per_interval_with_a_count(void **state)
{
    (void)state;
    rt_log_set_repeat_interval_ms(300);
    capture_begin();
    for (int i = 0; i < 500; i++) {
        rt_log(ATRIUM_LOG_ERROR, "core", "the database failed: connection refused");
        rt_log(ATRIUM_LOG_ERROR, "core", "another failure");
    }
    rt_log(ATRIUM_LOG_INFO, "core", "info is never held back");
    rt_log(ATRIUM_LOG_INFO, "core", "info is never held back");
    usleep(350 * 1000);
    rt_log(ATRIUM_LOG_ERROR, "core", "the database failed: connection refused");
    char *out = (char *)capture_end();
    rt_log_set_repeat_interval_ms(0);
    assert_int_equal(count_lines(out, "the database failed: connection refused"), 2);
    assert_int_equal(count_lines(out, "another failure"), 1);
    assert_int_equal(count_lines(out, "info is never held back"), 2);
    assert_non_null(strstr(out, "connection refused (499 more like this in the last 1 s)\n"));
}

static void test_log_keeps_errno_for_the_caller(void **state)
{
    (void)state;
    capture_begin();
    errno = ENOENT;
    rt_log(ATRIUM_LOG_INFO, "core", "x");
    int seen = errno;
    capture_end();
    assert_int_equal(seen, ENOENT);
}

static void test_log_level_parse_accepts_the_four_names(void **state)
{
    (void)state;
    assert_int_equal(rt_log_level_parse("error"), ATRIUM_LOG_ERROR);
    assert_int_equal(rt_log_level_parse("warn"), ATRIUM_LOG_WARN);
    assert_int_equal(rt_log_level_parse("info"), ATRIUM_LOG_INFO);
    assert_int_equal(rt_log_level_parse("DEBUG"), ATRIUM_LOG_DEBUG);
    assert_int_equal(rt_log_level_parse("verbose"), -1);
    assert_int_equal(rt_log_level_parse(""), -1);
    assert_int_equal(rt_log_level_parse(NULL), -1);
}

static void test_clock_monotonic_never_goes_back_and_wall_clock_is_unix_time(void **state)
{
    (void)state;
    int64_t a = rt_now_ms(), b = rt_now_ms();
    assert_true(b >= a);
    int64_t wall = rt_wall_ms();
    int64_t unix_ms = (int64_t)time(NULL) * 1000;
    assert_true(wall >= unix_ms - 1000 && wall <= unix_ms + 2000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_log_line_has_utc_timestamp_level_origin_and_message),
        cmocka_unit_test(test_log_line_without_origin_omits_it),
        cmocka_unit_test(test_log_line_carries_the_instance_name_once_set),
        cmocka_unit_test(test_log_line_carries_the_request_id_published_in_the_scope),
        cmocka_unit_test(test_log_drops_lines_above_the_configured_level),
        cmocka_unit_test(test_log_message_with_line_breaks_stays_one_line),
        cmocka_unit_test(test_log_cuts_an_overlong_line_and_marks_it),
        cmocka_unit_test(test_log_lines_from_concurrent_threads_never_interleave),
        cmocka_unit_test(test_log_keeps_errno_for_the_caller),
        cmocka_unit_test(test_repeated_error_lines_are_written_once_per_interval_with_a_count),
        cmocka_unit_test(test_log_level_parse_accepts_the_four_names),
        cmocka_unit_test(test_clock_monotonic_never_goes_back_and_wall_clock_is_unix_time),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
