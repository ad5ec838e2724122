/*
 * tests/fuzz/fuzz_config.c - libFuzzer target: the config reader, from YAML text to the
 * core's settings (core/config): cfg_load_string, then core_config_load over the tree.
 *
 * An error must come with a message; nothing may crash or leak whatever the file says.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/config/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size); /* libFuzzer's entry */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    char err[512] = "";
    cfg_node *root = cfg_load_string(text, "fuzz.yaml", err, sizeof(err));
    if (!root) {
        if (!err[0]) abort(); /* every refusal says why */
    } else {
        struct core_config cfg;
        memset(&cfg, 0, sizeof(cfg));
        err[0] = '\0';
        if (core_config_load(root, &cfg, err, sizeof(err)) != 0 && !err[0]) abort();
        core_config_release(&cfg);
        cfg_free(root);
    }
    free(text);
    return 0;
}
