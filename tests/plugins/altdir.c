/*
 * tests/plugins/altdir.c - a replacement room directory built only from include/atrium/:
 * it provides "directory/1" with aliases kept in memory (no tables, no routes), so a test
 * can show that the core creates and resolves aliases through whichever plugin provides
 * the interface, at the version the plugin was written for (0 here). GET /_altdir/calls
 * answers how often each function was called.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "atrium/directory.h"
#include "atrium/host.h"

#define ALTDIR_MAX_ALIASES 64

static const atrium_host *h;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    char alias[256], room_id[ATRIUM_ROOM_ID_MAX_BYTES + 1];
} aliases[ALTDIR_MAX_ALIASES];
static int n_aliases, n_create, n_resolve, n_publish, n_changed;

static int alt_create(PGconn *c, const char *alias, const char *room_id, const char *creator)
{
    (void)c, (void)creator;
    pthread_mutex_lock(&lock);
    n_create++;
    int rc = 0;
    for (int i = 0; i < n_aliases; i++)
        if (strcmp(aliases[i].alias, alias) == 0) rc = ATRIUM_E_EXISTS;
    if (rc == 0 && n_aliases == ALTDIR_MAX_ALIASES) rc = ATRIUM_E_LIMIT;
    if (rc == 0) {
        snprintf(aliases[n_aliases].alias, sizeof(aliases[0].alias), "%s", alias);
        snprintf(aliases[n_aliases].room_id, sizeof(aliases[0].room_id), "%s", room_id);
        n_aliases++;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

static int alt_resolve(PGconn *c, const char *alias, char room_id[ATRIUM_ROOM_ID_MAX_BYTES + 1])
{
    (void)c;
    pthread_mutex_lock(&lock);
    n_resolve++;
    int rc = ATRIUM_E_NOTFOUND;
    for (int i = 0; i < n_aliases; i++)
        if (strcmp(aliases[i].alias, alias) == 0) {
            snprintf(room_id, ATRIUM_ROOM_ID_MAX_BYTES + 1, "%s", aliases[i].room_id);
            rc = 0;
        }
    pthread_mutex_unlock(&lock);
    return rc;
}

static int alt_publish(PGconn *c, const char *room_id, bool visible)
{
    (void)c, (void)room_id, (void)visible;
    pthread_mutex_lock(&lock);
    n_publish++;
    pthread_mutex_unlock(&lock);
    return 0;
}

static int alt_changed(PGconn *c, const char *room_id)
{
    (void)c, (void)room_id;
    pthread_mutex_lock(&lock);
    n_changed++;
    pthread_mutex_unlock(&lock);
    return 0;
}

static int alt_may_publish(const char *user_id, bool server_admin)
{
    (void)user_id, (void)server_admin;
    return 1;
}

/* Built as a version-0 provider (the five functions directory/1 began with): the core
 * must use it for those and answer what needs a later member (a join by another server's
 * alias) without calling past its size. */
static const atrium_directory ALT = {
    .size = ATRIUM_DIRECTORY_V0_SIZE,
    .version = 0,
    .alias_create = alt_create,
    .alias_resolve = alt_resolve,
    .room_publish = alt_publish,
    .room_changed = alt_changed,
    .may_publish = alt_may_publish,
};

static int get_calls(atrium_req *req)
{
    pthread_mutex_lock(&lock);
    json_t *body = json_pack("{s:i, s:i, s:i, s:i}", "alias_create", n_create, "alias_resolve",
                             n_resolve, "room_publish", n_publish, "room_changed", n_changed);
    pthread_mutex_unlock(&lock);
    return h->respond_json(req, 200, body);
}

static int altdir_init(const atrium_host *host, atrium_plugin *self, const atrium_config *cfg,
                       void **state)
{
    h = host;
    *state = NULL;
    if (!ATRIUM_HOST_HAS(host, iface_provide)) return ATRIUM_E_STATE;
    if (host->config_load(self, cfg, NULL) < 0) return ATRIUM_E_INVAL;
    /* A plugin provides only the interface its descriptor names: this must be refused. */
    if (host->iface_provide(self, "media/1", &ALT) != ATRIUM_E_INVAL) return ATRIUM_E_STATE;
    int rc = host->iface_provide(self, ATRIUM_DIRECTORY_IFACE, &ALT);
    const atrium_route route = {.method = "GET", .path = "/_altdir/calls", .handler = get_calls};
    if (rc == 0) rc = host->route_add(self, &route);
    return rc;
}

static int altdir_start(void *state)
{
    (void)state;
    /* The interface this plugin provides is found by name, with its size checked. */
    if (h->iface_get(ATRIUM_DIRECTORY_IFACE, ATRIUM_DIRECTORY_V0_SIZE) != &ALT) return -1;
    if (h->iface_get(ATRIUM_DIRECTORY_IFACE, sizeof(atrium_directory)) != NULL) return -1;
    return h->iface_get("rooms/1", 8) ? 0 : -1;
}

ATRIUM_PLUGIN(.name = "altdir", .version = "1", .provides = ATRIUM_DIRECTORY_IFACE,
              .init = altdir_init, .start = altdir_start)
