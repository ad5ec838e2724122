/*
 * tests/unit/test_media_multipart.c - reading the multipart/mixed answer of the federation
 * media endpoints (plugins/media/multipart.c): the file part is handed on exactly, however
 * the body is split into chunks; a Location part is recognised; truncated or malformed
 * bodies are errors, never a complete file.
 */
#include "plugins/media/multipart.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>

const atrium_host *media_host; /* declared by media.h; unused by the pure file */

typedef struct sink {
    char *data;
    size_t len, cap;
} sink;

static int collect(void *arg, const char *data, size_t len)
{
    sink *s = arg;
    /* Grown by doubling: a body fed a byte at a time would otherwise cost one realloc
     * (and, under ASan, one copy of everything so far) per byte. */
    if (s->len + len > s->cap) {
        s->cap = s->cap ? s->cap * 2 : 4096;
        if (s->cap < s->len + len) s->cap = s->len + len;
        s->data = realloc(s->data, s->cap);
        assert_non_null(s->data);
    }
    memcpy(s->data + s->len, data, len);
    s->len += len;
    return 0;
}

/* Parse body split into pieces of `step` bytes; returns the parser (caller frees). */
static mp_parser *parse(const char *ct, const char *body, size_t len, size_t step, sink *out,
                        int *rc)
{
    mp_parser *p = malloc(sizeof(*p));
    assert_int_equal(mp_init(p, ct), 0);
    p->on_body = collect;
    p->arg = out;
    *rc = 0;
    for (size_t off = 0; off < len && *rc == 0; off += step)
        *rc = mp_feed(p, body + off, len - off < step ? len - off : step);
    return p;
}

typedef struct capped {
    size_t len, cap;
    int calls;
} capped;

/* Takes bytes up to cap, then refuses with 1 (as the fetch does past max_upload_size). */
static int take_up_to_cap(void *arg, const char *data, size_t len)
{
    (void)data;
    capped *c = arg;
    c->calls++;
    if (c->len + len > c->cap) return 1;
    c->len += len;
    return 0;
}

static char *make_body(const char *boundary, const char *file, size_t file_len, size_t *len)
{
    char head[512], tail[128];
    int hn = snprintf(head, sizeof(head),
                      "--%s\r\nContent-Type: application/json\r\n\r\n{\"x\": 1}\r\n--%s\r\n"
                      "Content-Type: image/png\r\nContent-Disposition: inline; "
                      "filename=\"a.png\"\r\n\r\n",
                      boundary, boundary);
    int tn = snprintf(tail, sizeof(tail), "\r\n--%s--\r\n", boundary);
    char *b = malloc((size_t)hn + file_len + (size_t)tn);
    memcpy(b, head, (size_t)hn);
    memcpy(b + hn, file, file_len);
    memcpy(b + hn + file_len, tail, (size_t)tn);
    *len = (size_t)hn + file_len + (size_t)tn;
    return b;
}

/* on_body answering 1 must end the parse with 1 at once (a step's "progress" is also 1:
 * the two once looped forever on the outbound client's thread). */
static void a_refusal_of_1_from_on_body_stops_the_parse_and_is_returned(void **state)
{
    (void)state;
    size_t file_len = 200000;
    char *file = calloc(1, file_len);
    size_t len;
    char *body = make_body("bnd", file, file_len, &len);
    size_t steps[] = {16384, len};
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        mp_parser *p = malloc(sizeof(*p));
        assert_int_equal(mp_init(p, "multipart/mixed; boundary=bnd"), 0);
        capped c = {.cap = 50000};
        p->on_body = take_up_to_cap;
        p->arg = &c;
        int rc = 0;
        size_t off = 0;
        for (; off < len && rc == 0; off += steps[i])
            rc = mp_feed(p, body + off, len - off < steps[i] ? len - off : steps[i]);
        assert_int_equal(rc, 1);
        assert_true(c.len <= c.cap);
        assert_true(c.calls < 20); /* refused once, not again and again */
        assert_false(mp_complete(p));
        assert_int_equal(mp_feed(p, "x", 1), -1); /* stays failed */
        free(p);
    }
    free(body);
    free(file);
}

static void the_file_part_comes_out_exactly_however_the_body_is_split(void **state)
{
    (void)state;
    size_t file_len = 200000;
    char *file = malloc(file_len);
    for (size_t i = 0; i < file_len; i++) file[i] = (char)(i * 7 % 251);
    /* Bytes that look like the start of a delimiter inside the file. */
    memcpy(file + 1000, "\r\n--bn", 6); /* a delimiter cut short */
    memcpy(file + 150000, "\r\n-", 3);
    size_t len;
    char *body = make_body("bnd", file, file_len, &len);
    size_t steps[] = {1, 2, 7, 100, 4096, 65536, len};
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        sink s = {0};
        int rc;
        mp_parser *p = parse("multipart/mixed; boundary=bnd", body, len, steps[i], &s, &rc);
        assert_int_equal(rc, 0);
        assert_true(mp_complete(p));
        assert_int_equal(s.len, file_len);
        assert_memory_equal(s.data, file, file_len);
        assert_string_equal(p->content_type, "image/png");
        assert_string_equal(p->disposition, "inline; filename=\"a.png\"");
        assert_string_equal(p->json, "{\"x\": 1}");
        free(s.data);
        free(p);
    }
    free(body);
    free(file);
}

static void a_quoted_boundary_and_a_location_part_are_understood(void **state)
{
    (void)state;
    const char *body = "preamble\r\n--b 1\r\nContent-Type: application/json\r\n\r\n{}\r\n"
                       "--b 1\r\nLocation: https://cdn.example/f\r\n\r\n\r\n--b 1--\r\nepilogue";
    sink s = {0};
    int rc;
    mp_parser *p = parse("multipart/mixed; charset=x; boundary=\"b 1\"", body, strlen(body), 5, &s,
                         &rc);
    assert_int_equal(rc, 0);
    assert_true(mp_complete(p));
    assert_string_equal(p->location, "https://cdn.example/f");
    assert_int_equal(s.len, 0);
    free(p);
}

static void truncated_or_malformed_bodies_are_never_complete(void **state)
{
    (void)state;
    size_t len;
    char *body = make_body("zz", "hello", 5, &len);
    sink s = {0};
    int rc;
    /* Cut before the close delimiter: no error yet, but not complete. */
    mp_parser *p = parse("multipart/mixed; boundary=zz", body, len - 8, 3, &s, &rc);
    assert_int_equal(rc, 0);
    assert_false(mp_complete(p));
    free(p);
    free(s.data);
    /* Not multipart at all. */
    mp_parser q;
    assert_int_equal(mp_init(&q, "application/json"), -1);
    assert_int_equal(mp_init(&q, "multipart/mixed"), -1);
    /* The metadata part is not a JSON object. */
    const char *bad = "--zz\r\n\r\nnot json\r\n--zz\r\n\r\nabc\r\n--zz--\r\n";
    s = (sink){0};
    p = parse("multipart/mixed; boundary=zz", bad, strlen(bad), 4, &s, &rc);
    assert_int_equal(rc, -1);
    assert_false(mp_complete(p));
    free(p);
    /* Only the metadata part, then the close delimiter. */
    const char *one = "--zz\r\n\r\n{}\r\n--zz--\r\n";
    p = parse("multipart/mixed; boundary=zz", one, strlen(one), 100, &s, &rc);
    assert_int_equal(rc, -1);
    free(p);
    /* No delimiter anywhere in a long body. */
    char *junk = malloc(100000);
    memset(junk, 'j', 100000);
    p = parse("multipart/mixed; boundary=zz", junk, 100000, 4096, &s, &rc);
    assert_int_equal(rc, -1);
    free(p);
    free(junk);
    free(s.data);
    free(body);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_file_part_comes_out_exactly_however_the_body_is_split),
        cmocka_unit_test(a_refusal_of_1_from_on_body_stops_the_parse_and_is_returned),
        cmocka_unit_test(a_quoted_boundary_and_a_location_part_are_understood),
        cmocka_unit_test(truncated_or_malformed_bodies_are_never_complete),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
