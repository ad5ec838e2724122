/*
 * tests/fuzz/fuzz_multipart.c - libFuzzer target: the multipart/mixed reader of federation
 * media answers (plugins/media/multipart.c), fed in chunks as a socket would hand them on.
 *
 * Input: the first byte picks a chunk size (1 to 256 bytes, or all at once), the rest up to
 * the first newline is the Content-Type header, what follows is the body. Checked: the
 * file part handed on is never more than the body's length; a parse called complete holds
 * a JSON object as metadata; header values stay NUL-terminated within their buffers;
 * after an error every further feed is refused; the buffer is never overrun (ASan).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "plugins/media/multipart.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size); /* libFuzzer's entry */

static int count_body(void *arg, const char *data, size_t len)
{
    (void)data;
    *(size_t *)arg += len;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    size_t chunk = data[0] == 0 ? size : data[0];
    const char *rest = (const char *)data + 1;
    size_t rest_len = size - 1;
    const char *nl = memchr(rest, '\n', rest_len);
    if (!nl) return 0;
    size_t ct_len = (size_t)(nl - rest);
    char *ct = malloc(ct_len + 1);
    mp_parser *p = malloc(sizeof(*p));
    if (!ct || !p) abort();
    memcpy(ct, rest, ct_len);
    ct[ct_len] = '\0';
    const char *body = nl + 1;
    size_t body_len = rest_len - ct_len - 1;
    size_t handed = 0;
    if (mp_init(p, ct) == 0) {
        p->on_body = count_body;
        p->arg = &handed;
        bool failed = false;
        for (size_t off = 0; off < body_len; off += chunk) {
            size_t n = body_len - off < chunk ? body_len - off : chunk;
            int rc = mp_feed(p, body + off, n);
            if (failed && rc != -1) abort();
            if (rc != 0) failed = true;
        }
        if (handed > body_len) abort();
        if (mp_complete(p) && (failed || !metadata_is_object(p))) abort();
        if (!memchr(p->content_type, '\0', sizeof(p->content_type)) ||
            !memchr(p->location, '\0', sizeof(p->location)) ||
            !memchr(p->disposition, '\0', sizeof(p->disposition)))
            abort();
    }
    free(p);
    free(ct);
    return 0;
}
