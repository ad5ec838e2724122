/*
 * tests/fuzz/fuzz_gate.c - libFuzzer target: the gate's judgement of a request head
 * (core/http/gate.c), which sees every byte a client sends before anything else does.
 *
 * Checked: the head end is within the input, a refusal always names a Matrix error code
 * and a status libmicrohttpd is never asked to make up, and cheap-request detection never
 * reads past the head.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/http/http.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size); /* libFuzzer's entry */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* an exact-size heap copy, so a read past the end is an ASan report */
    char *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    size_t end = http_gate_head_end(buf, size);
    if (end > size) abort();
    size_t len = end ? end : size;
    const char *errcode = NULL;
    char msg[128];
    int status = http_gate_check_head(buf, len, &errcode, msg, sizeof(msg));
    if (status != 0) {
        if (!errcode || strncmp(errcode, "M_", 2) != 0) abort();
        if (status != 400 && status != 413 && status != 431 && status != 501 && status != 505)
            abort();
    }
    (void)http_gate_cheap_request(buf, len);
    free(buf);
    return 0;
}
