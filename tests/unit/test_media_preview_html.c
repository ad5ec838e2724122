/*
 * tests/unit/test_media_preview_html.c - the pure half of URL previews
 * (plugins/media/preview_html.c): OpenGraph read out of HTML (references decoded,
 * whitespace collapsed, comments and scripts skipped, every value valid UTF-8 and
 * bounded), and the URL rules (what is fetched, how relative references resolve).
 */
#include "plugins/media/preview_html.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>

const atrium_host *media_host; /* declared by media.h; unused by the pure file */

static json_t *og_of(const char *html, bool latin1)
{
    json_t *og = preview_html_og(html, strlen(html), latin1);
    assert_non_null(og);
    return og;
}

static const char *str(json_t *og, const char *key)
{
    return json_string_value(json_object_get(og, key));
}

static void opengraph_properties_are_read_decoded_and_the_first_of_each_wins(void **state)
{
    (void)state;
    json_t *og = og_of("<html><head><meta property=\"og:title\" content=\"A &amp; B &#x263A; &#169;\">"
                       "<META PROPERTY='OG:Description' CONTENT='  two\n\t lines  '>"
                       "<meta content=first property=og:site_name>"
                       "<meta property=\"og:site_name\" content=\"second\">"
                       "<meta property=\"og:image:width\" content=\"640\">"
                       "<meta property=\"og:image:height\" content=\"tall\">"
                       "<!-- <meta property=\"og:type\" content=\"comment\"> -->"
                       "<script>x = '<meta property=\"og:url\" content=\"script\">'</script>"
                       "<style>p{}</style><title>ignored</title></head></html>",
                       false);
    assert_string_equal(str(og, "og:title"), "A & B \xe2\x98\xba \xc2\xa9");
    assert_string_equal(str(og, "og:description"), "two lines");
    assert_string_equal(str(og, "og:site_name"), "first");
    assert_int_equal(json_integer_value(json_object_get(og, "og:image:width")), 640);
    assert_null(json_object_get(og, "og:image:height")); /* not a number */
    assert_null(json_object_get(og, "og:type"));
    assert_null(json_object_get(og, "og:url"));
    assert_int_equal(json_object_size(og), 4);
    json_decref(og);
}

static void title_and_meta_description_stand_in_for_missing_opengraph(void **state)
{
    (void)state;
    json_t *og = og_of("<title>\n  The   page\n</title><meta name=description content=\"Desc\">", false);
    assert_string_equal(str(og, "og:title"), "The page");
    assert_string_equal(str(og, "og:description"), "Desc");
    json_decref(og);
    og = og_of("<title>T</title><meta property=og:title content=OG>", false);
    assert_string_equal(str(og, "og:title"), "OG");
    json_decref(og);
}

static void bytes_that_are_not_utf8_become_replacement_characters_or_latin1(void **state)
{
    (void)state;
    json_t *og = og_of("<title>caf\xe9 \xc3\xa9 \xed\xa0\x80 \x01ok</title>", false);
    assert_string_equal(str(og, "og:title"), "caf\xef\xbf\xbd \xc3\xa9 \xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd ok");
    json_decref(og);
    og = og_of("<title>caf\xe9</title>", true);
    assert_string_equal(str(og, "og:title"), "caf\xc3\xa9");
    json_decref(og);
}

static void values_and_keys_are_bounded_whatever_the_page_holds(void **state)
{
    (void)state;
    size_t n = 200000;
    char *html = malloc(n + 200);
    int o = sprintf(html, "<meta property=og:description content=\"");
    memset(html + o, 'x', n);
    strcpy(html + o + n, "\">");
    json_t *og = og_of(html, false);
    assert_true(strlen(str(og, "og:description")) <= PREVIEW_FIELD_MAX_BYTES);
    json_decref(og);
    /* many distinct keys */
    char *p = html;
    for (int i = 0; i < 200; i++) p += sprintf(p, "<meta property=og:k%d content=v>", i);
    og = og_of(html, false);
    assert_int_equal(json_object_size(og), PREVIEW_OG_MAX_KEYS);
    json_decref(og);
    /* unterminated constructs end the scan without reading past the end */
    const char *cut[] = {"<meta property=og:title content=\"open", "<!-- never closed",
                         "<script>never closed", "<title>never closed", "<", "<meta"};
    for (size_t i = 0; i < sizeof(cut) / sizeof(cut[0]); i++) {
        og = og_of(cut[i], false);
        assert_int_equal(json_object_size(og), 0);
        json_decref(og);
    }
    free(html);
}

static void only_absolute_http_urls_without_user_information_are_fetched(void **state)
{
    (void)state;
    char out[PREVIEW_URL_MAX];
    assert_int_equal(preview_url_normalize("HTTPS://Example.ORG", out, sizeof(out)), 0);
    assert_string_equal(out, "https://example.org/");
    assert_int_equal(preview_url_normalize("https://example.org/a b?q=\xc3\xa9#frag", out, sizeof(out)), 0);
    assert_string_equal(out, "https://example.org/a%20b?q=%C3%A9");
    assert_int_equal(preview_url_normalize("https://example.org?x", out, sizeof(out)), 0);
    assert_string_equal(out, "https://example.org/?x");
    assert_int_equal(preview_url_normalize("http://example.org/", out, sizeof(out)),
                     PREVIEW_URL_PLAIN_HTTP);
    const char *bad[] = {"ftp://example.org/", "example.org", "https://", "https:///x",
                         "https://u:p@example.org/", "javascript:alert(1)", "data:image/png,xx"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(preview_url_normalize(bad[i], out, sizeof(out)), -1);
    char longer[PREVIEW_URL_MAX + 10];
    memset(longer, 'a', sizeof(longer) - 1);
    memcpy(longer, "https://x/", 10);
    longer[sizeof(longer) - 1] = '\0';
    assert_int_equal(preview_url_normalize(longer, out, sizeof(out)), -1);
}

static void relative_references_resolve_against_the_page(void **state)
{
    (void)state;
    char out[PREVIEW_URL_MAX];
    const char *base = "https://site.example:8443/dir/page.html?q=1";
    const struct {
        const char *ref, *want;
    } cases[] = {
        {"img.png", "https://site.example:8443/dir/img.png"},
        {"/img.png", "https://site.example:8443/img.png"},
        {"//cdn.example/x.png", "https://cdn.example/x.png"},
        {"?page=2", "https://site.example:8443/dir/page.html?page=2"},
        {"https://other.example/y", "https://other.example/y"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        assert_int_equal(preview_url_join(base, cases[i].ref, out, sizeof(out)), 0);
        assert_string_equal(out, cases[i].want);
    }
    assert_int_equal(preview_url_join("https://h", "a.png", out, sizeof(out)), 0);
    assert_string_equal(out, "https://h/a.png");
    assert_int_equal(preview_url_join(base, "http://plain.example/", out, sizeof(out)),
                     PREVIEW_URL_PLAIN_HTTP);
    assert_int_equal(preview_url_join(base, "data:image/png;base64,AAAA", out, sizeof(out)), -1);
    assert_int_equal(preview_url_join(base, "", out, sizeof(out)), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(opengraph_properties_are_read_decoded_and_the_first_of_each_wins),
        cmocka_unit_test(title_and_meta_description_stand_in_for_missing_opengraph),
        cmocka_unit_test(bytes_that_are_not_utf8_become_replacement_characters_or_latin1),
        cmocka_unit_test(values_and_keys_are_bounded_whatever_the_page_holds),
        cmocka_unit_test(only_absolute_http_urls_without_user_information_are_fetched),
        cmocka_unit_test(relative_references_resolve_against_the_page),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
