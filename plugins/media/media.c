/*
 * plugins/media/media.c - the media plugin (provides "media/1").
 *
 * This first version owns the media settings and answers the media configuration
 * endpoints, so clients learn the upload limit from the plugin that will enforce it.
 * Uploads, downloads, thumbnails and the delivery line arrive with the media issue; the
 * plugin is built only against include/atrium/, as a replacement would be.
 */
#include <stdlib.h>

#include "atrium/host.h"

#define MEDIA_DEFAULT_MAX_UPLOAD_BYTES (50LL * 1024 * 1024)
#define MEDIA_MAX_UPLOAD_BYTES_LIMIT (4LL * 1024 * 1024 * 1024)

typedef struct media {
    const atrium_host *host;
    atrium_plugin *self;
    int64_t max_upload_size;
} media;

static const atrium_host *h; /* the host table, valid from init to fini */

static int get_config(atrium_req *req)
{
    media *m = h->req_route_arg(req);
    json_t *body = json_pack("{s:I}", "m.upload.size", (json_int_t)m->max_upload_size);
    return h->respond_json(req, 200, body);
}

static int media_init(const atrium_host *host, atrium_plugin *self, const atrium_config *cfg,
                      void **state)
{
    static const char *const keys[] = {"max_upload_size", NULL};
    if (host->config_check_keys(self, cfg, keys) < 0) return ATRIUM_E_INVAL;
    media *m = calloc(1, sizeof(*m));
    if (!m) return ATRIUM_E_NOMEM;
    m->host = host;
    m->self = self;
    if (host->config_int(self, cfg, "max_upload_size", MEDIA_DEFAULT_MAX_UPLOAD_BYTES, 1,
                         MEDIA_MAX_UPLOAD_BYTES_LIMIT, &m->max_upload_size) < 0) {
        free(m);
        return ATRIUM_E_INVAL;
    }
    h = host;
    const atrium_route routes[] = {
        {.method = "GET", .path = "/_matrix/client/v1/media/config", .handler = get_config, .arg = m},
        {.method = "GET", .path = "/_matrix/media/v3/config", .handler = get_config, .arg = m},
    };
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
        int rc = host->route_add(self, &routes[i]);
        if (rc < 0) {
            free(m);
            return rc;
        }
    }
    *state = m;
    return 0;
}

static void media_fini(void *state)
{
    free(state);
}

ATRIUM_PLUGIN(.name = "media", .version = "0.1.0", .provides = "media/1", .init = media_init,
              .fini = media_fini)
