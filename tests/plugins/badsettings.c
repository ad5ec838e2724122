/*
 * tests/plugins/badsettings.c - a plugin whose settings table (ABI 1.1) has a default
 * outside its own range, so the loader's refusal can be tested: a table that cannot be
 * trusted to read as documented stops start-up before init runs.
 */
#include <stddef.h>

#include "atrium/host.h"

struct badsettings_config {
    int slots;
};

static const atrium_setting BADSETTINGS_SETTINGS[] = {
    {.key = "slots", .type = ATRIUM_SETTING_INT,
     .offset = offsetof(struct badsettings_config, slots), .def = 0, .min = 1, .max = 8,
     .help = "Slots at once."},
};

static int never_init(const atrium_host *host, atrium_plugin *self, const atrium_config *cfg,
                      void **state)
{
    (void)host;
    (void)self;
    (void)cfg;
    (void)state;
    return ATRIUM_E_STATE; /* the loader must refuse before calling this */
}

ATRIUM_PLUGIN(.name = "badsettings", .version = "1.0.0", .init = never_init,
              .settings = BADSETTINGS_SETTINGS, .n_settings = 1)
