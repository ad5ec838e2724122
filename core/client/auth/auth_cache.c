/*
 * core/client/auth/auth_cache.c - remembering which user an access token belongs to, so an
 * authenticated request does not cost a PostgreSQL round trip, without ever accepting a
 * revoked token.
 *
 * Decisions owned here:
 *   - Revocation in this process is immediate: code that deletes tokens calls
 *     auth_cache_forget_user after its commit, and an epoch counter stops a look-up that
 *     read the database before that commit from caching what it read.
 *   - Revocation in another process sharing the database arrives through PostgreSQL:
 *     a trigger on access_tokens (and on users' admin and deactivation flags) sends
 *     NOTIFY atrium_auth with the user ID; the process's notification service
 *     (core/store/notify.h) hands it here and this user is forgotten. While the service's
 *     listening connection is down the cache is off (notify_live), and it is emptied each
 *     time listening (re)starts, before the cache is back on, so a missed notification can
 *     never leave a stale entry (docs/architecture.md, 'More than one process').
 *   - A revoking request waits until every live process forgot the user (auth_revoke.c):
 *     its notification "<user> <revocation ID>" is acknowledged here after the forget.
 *   - Entries also expire after AUTH_CACHE_TTL_MS, as a last line.
 * The table is direct-mapped by the token hash (uniform: it is SHA-256), bounded, and
 * holds only hashes, user IDs and device IDs. It does not decide who may do what. It is
 * the runtime object's (rt->auth_cache: made by the accounts module's init, freed by
 * core/main.c at the very end, so a request still running at shutdown finds it).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/auth/auth.h"
#include "core/runtime/core_runtime.h"
#include "core/store/notify.h"

#define AUTH_CACHE_SLOTS 16384          /* tokens remembered at once */
#define AUTH_CACHE_TTL_MS (60 * 1000)   /* an entry is trusted this long at most */
#define AUTH_NOTIFY_CHANNEL "atrium_auth"

typedef struct cache_entry {
    char hash[65];
    char *user, *device;
    int flags; /* AUTH_FLAG_* */
    int64_t expires_ms;
} cache_entry;

struct auth_cache {
    pthread_mutex_t mu;
    cache_entry *slots; /* NULL once stopped */
    size_t used;        /* slots holding an entry: a forget skips the walk when none do */
    uint64_t epoch;     /* bumped by every forget: see auth_cache_store */
    rt_metric *m_hits, *m_misses, *m_forgets;
};

/* Caching is allowed: the notification service hears revocations from other processes. */
static bool listening(void) { return notify_live(notify_global()); }

/* The bound runtime object's cache, or NULL. */
static auth_cache *the_cache(void)
{
    core_runtime *rt = core_runtime_get();
    return rt ? rt->auth_cache : NULL;
}

/* The slot of a token hash: its first 32 bits (hex), which SHA-256 spreads evenly. */
static size_t slot_of(const char *hash)
{
    uint32_t v = 0;
    for (int i = 0; i < 8 && hash[i]; i++) {
        char c = hash[i];
        v = v * 16 + (uint32_t)(c <= '9' ? c - '0' : c - 'a' + 10);
    }
    return v % AUTH_CACHE_SLOTS;
}

/* c->mu held. */
static void clear_entry(auth_cache *c, cache_entry *e)
{
    if (e->user) c->used--;
    free(e->user);
    free(e->device);
    memset(e, 0, sizeof(*e));
}

auth_cache *auth_cache_new(rt_metrics *metrics)
{
    auth_cache *c = calloc(1, sizeof(*c));
    if (!c) return NULL;
    c->slots = calloc(AUTH_CACHE_SLOTS, sizeof(*c->slots));
    if (!c->slots) {
        free(c);
        return NULL;
    }
    pthread_mutex_init(&c->mu, NULL);
    c->m_hits = rt_metric_counter(metrics, "atrium_auth_cache_hits_total", NULL,
                                  "Authenticated requests answered from the token cache");
    c->m_misses = rt_metric_counter(metrics, "atrium_auth_cache_misses_total", NULL,
                                    "Authenticated requests that read the token from PostgreSQL");
    c->m_forgets = rt_metric_counter(metrics, "atrium_auth_cache_forgets_total", NULL,
                                     "Users forgotten by the token cache (revocations seen)");
    return c;
}

bool auth_cache_lookup(atrium_req *r, const char *hash, uint64_t *epoch_out)
{
    auth_cache *c = the_cache();
    *epoch_out = 0;
    if (!c) return false;
    bool hit = false;
    pthread_mutex_lock(&c->mu);
    *epoch_out = c->epoch;
    cache_entry *e = c->slots ? &c->slots[slot_of(hash)] : NULL;
    if (e && e->user && listening() && strcmp(e->hash, hash) == 0 &&
        e->expires_ms > rt_now_ms()) {
        r->user = rt_arena_strdup(r->arena, e->user);
        r->device = rt_arena_strdup(r->arena, e->device);
        r->is_admin = (e->flags & AUTH_FLAG_ADMIN) != 0;
        r->is_guest = (e->flags & AUTH_FLAG_GUEST) != 0;
        hit = r->user && r->device;
    }
    pthread_mutex_unlock(&c->mu);
    rt_metric_add(hit ? c->m_hits : c->m_misses, 1);
    return hit;
}

void auth_cache_store(const char *hash, const char *user, const char *device, int flags,
                      uint64_t read_epoch, int64_t valid_ms)
{
    auth_cache *c = the_cache();
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    /* A forget since the look-up began may have revoked what the database said. */
    if (c->slots && c->epoch == read_epoch && listening()) {
        cache_entry *e = &c->slots[slot_of(hash)];
        clear_entry(c, e);
        e->user = strdup(user);
        e->device = strdup(device);
        if (e->user) c->used++;
        if (e->user && e->device) {
            memcpy(e->hash, hash, sizeof(e->hash));
            e->flags = flags;
            e->expires_ms = rt_now_ms() + (valid_ms < AUTH_CACHE_TTL_MS ? valid_ms
                                                                        : AUTH_CACHE_TTL_MS);
        } else {
            clear_entry(c, e);
        }
    }
    pthread_mutex_unlock(&c->mu);
}

/* c->mu held. user NULL = everyone. */
static void forget_locked(auth_cache *c, const char *user)
{
    c->epoch++;
    /* Empty (as when listening starts with the server): the table's pages stay untouched. */
    for (size_t i = 0; c->slots && c->used > 0 && i < AUTH_CACHE_SLOTS; i++)
        if (c->slots[i].user && (!user || strcmp(c->slots[i].user, user) == 0))
            clear_entry(c, &c->slots[i]);
}

static void forget_user(auth_cache *c, const char *user_id)
{
    pthread_mutex_lock(&c->mu);
    forget_locked(c, user_id);
    pthread_mutex_unlock(&c->mu);
    rt_metric_add(c->m_forgets, 1);
}

void auth_cache_forget_user(const char *user_id)
{
    auth_cache *c = the_cache();
    if (c) forget_user(c, user_id);
}

/* The service's callback: a user whose tokens changed, or NULL (listening (re)started:
 * whatever was missed meanwhile is unknown, so everyone is forgotten). */
static void on_auth_notify(void *arg, const char *payload)
{
    auth_cache *c = arg;
    if (payload) {
        /* "<user>" (the trigger) or "<user> <revocation ID>" (auth_revoke.c: ack it once
         * the user is forgotten). */
        const char *sp = strchr(payload, ' ');
        char user[NOTIFY_MAX_PAYLOAD_BYTES + 1];
        snprintf(user, sizeof(user), "%.*s", sp ? (int)(sp - payload) : (int)strlen(payload),
                 payload);
        forget_user(c, user);
        if (sp) auth_revoke_ack(sp + 1);
        return;
    }
    pthread_mutex_lock(&c->mu);
    forget_locked(c, NULL);
    pthread_mutex_unlock(&c->mu);
}

int auth_cache_listen(auth_cache *c, notify_service *s)
{
    return notify_subscribe(s, AUTH_NOTIFY_CHANNEL, 0, on_auth_notify, c);
}

void auth_cache_stop(auth_cache *c)
{
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    forget_locked(c, NULL);
    free(c->slots);
    c->slots = NULL;
    pthread_mutex_unlock(&c->mu);
}

void auth_cache_free(auth_cache *c)
{
    if (!c) return;
    auth_cache_stop(c);
    pthread_mutex_destroy(&c->mu);
    free(c);
}
