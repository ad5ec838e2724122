/*
 * tests/fuzz/fuzz_xmatrix.c - libFuzzer target: the X-Matrix Authorization header parser
 * (core/federation/transport/fed_xmatrix.c), which reads what any server on the internet sends.
 *
 * Checked: a parsed header has an origin and a key, NUL-terminated within their buffers;
 * a refusal says why.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/federation/transport/fed_xmatrix.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size); /* libFuzzer's entry */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *header = malloc(size + 1);
    if (!header) return 0;
    memcpy(header, data, size);
    header[size] = '\0';
    fed_xmatrix x;
    char why[256] = "";
    int rc = fed_xmatrix_parse(header, &x, why, sizeof(why));
    if (rc == 0) {
        if (!memchr(x.origin, '\0', sizeof(x.origin)) || !memchr(x.key, '\0', sizeof(x.key)) ||
            !memchr(x.sig, '\0', sizeof(x.sig)) || !x.origin[0] || !x.key[0])
            abort();
    } else if (size && !why[0] && rc != FED_XMATRIX_E_MISSING) {
        abort();
    }
    free(header);
    return 0;
}
