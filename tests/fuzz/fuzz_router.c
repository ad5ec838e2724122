/*
 * tests/fuzz/fuzz_router.c - libFuzzer target: the router and path decoding.
 *
 * The input is split at the first newline into a method and a raw path (as the client sent
 * it, still percent-encoded); it is matched against a table shaped like the real one
 * (literal segments, parameters, a literal beating a parameter). Checked on every input:
 * a match's parameter values are all non-empty text (UTF-8, no NUL) unless the router
 * named the one that is not, and http_decode_text never writes past the string.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/http/http.h"

static int handler(atrium_req *r)
{
    (void)r;
    return 0;
}

static router *table(void)
{
    static router *rt;
    if (rt) return rt;
    rt = router_new();
    static const char *const routes[][2] = {
        {"GET", "/health"},
        {"GET", "/_matrix/client/versions"},
        {"PUT", "/_matrix/client/v3/rooms/{roomId}/send/{eventType}/{txnId}"},
        {"PUT", "/_matrix/client/v3/rooms/{roomId}/state/{eventType}/{stateKey}"},
        {"GET", "/_matrix/client/v3/rooms/{roomId}/state"},
        {"GET", "/_matrix/client/v3/rooms/{roomId}/members"},
        {"GET", "/_matrix/client/v3/rooms/{roomId}/{what}"},
        {"GET", "/_matrix/client/v1/media/download/{serverName}/{mediaId}/{fileName}"},
        {"POST", "/_matrix/client/v3/user/{userId}/filter"},
    };
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
        atrium_route r = {.method = routes[i][0], .path = routes[i][1], .handler = handler};
        char err[256];
        if (router_add(rt, &r, "fuzz", err, sizeof(err)) != 0) abort();
    }
    return rt;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size); /* libFuzzer's entry */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *in = malloc(size + 1);
    if (!in) return 0;
    memcpy(in, data, size);
    in[size] = '\0';
    char *nl = memchr(in, '\n', size);
    const char *method = "GET", *path = in;
    if (nl) {
        *nl = '\0';
        method = in;
        path = nl + 1;
    }
    rt_arena *a = rt_arena_new(1024);
    const char **names = NULL, **values = NULL, *invalid = NULL;
    size_t n = 0;
    bool wrong = false;
    const route_entry *e = router_match(table(), method, path, a, &names, &values, &n, &wrong,
                                        &invalid);
    if (e && !invalid)
        for (size_t i = 0; i < n; i++)
            if (!values[i][0] || !http_utf8_valid(values[i])) abort();
    if (e && wrong) abort(); /* a match is never also "wrong method" */
    char *copy = strdup(path);
    if (copy) {
        size_t before = strlen(copy);
        if (http_decode_text(copy) && (strlen(copy) > before || !http_utf8_valid(copy))) abort();
        free(copy);
    }
    rt_arena_free(a);
    free(in);
    return 0;
}
