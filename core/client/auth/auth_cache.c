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
 *     NOTIFY atrium_auth with the user ID; a listener thread here forgets that user.
 *     While the listener has no connection the cache is off (and emptied when it comes
 *     back), so a missed notification can never leave a stale entry (docs/architecture.md,
 *     'More than one process').
 *   - Entries also expire after AUTH_CACHE_TTL_MS, as a last line.
 * The table is direct-mapped by the token hash (uniform: it is SHA-256), bounded, and
 * holds only hashes, user IDs and device IDs. It does not decide who may do what.
 */
#include <poll.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/auth/auth.h"

#define AUTH_CACHE_SLOTS 16384          /* tokens remembered at once */
#define AUTH_CACHE_TTL_MS (60 * 1000)   /* an entry is trusted this long at most */
#define AUTH_LISTEN_POLL_MS 500         /* how often the listener checks for stop */
#define AUTH_LISTEN_RETRY_MS 1000       /* reconnect pace while PostgreSQL is away */
#define AUTH_NOTIFY_CHANNEL "atrium_auth"

typedef struct cache_entry {
    char hash[65];
    char *user, *device;
    int admin;
    int64_t expires_ms;
} cache_entry;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static cache_entry *slots;
static uint64_t epoch;      /* bumped by every forget: see auth_cache_store */
static bool listening;      /* the listener is connected: caching is allowed */
static rt_metric *m_hits, *m_misses, *m_forgets;

static pthread_t listener;
static bool listener_started;
static atomic_bool listener_stop;
static char *listen_conninfo;

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

static void clear_entry(cache_entry *e)
{
    free(e->user);
    free(e->device);
    memset(e, 0, sizeof(*e));
}

int auth_cache_init(rt_metrics *metrics)
{
    slots = calloc(AUTH_CACHE_SLOTS, sizeof(*slots));
    if (!slots) return -1;
    m_hits = rt_metric_counter(metrics, "atrium_auth_cache_hits_total", NULL,
                               "Authenticated requests answered from the token cache");
    m_misses = rt_metric_counter(metrics, "atrium_auth_cache_misses_total", NULL,
                                 "Authenticated requests that read the token from PostgreSQL");
    m_forgets = rt_metric_counter(metrics, "atrium_auth_cache_forgets_total", NULL,
                                  "Users forgotten by the token cache (revocations seen)");
    return auth_seen_init(metrics);
}

bool auth_cache_lookup(atrium_req *r, const char *hash, uint64_t *epoch_out)
{
    bool hit = false;
    pthread_mutex_lock(&mu);
    *epoch_out = epoch;
    cache_entry *e = slots ? &slots[slot_of(hash)] : NULL;
    if (listening && e && e->user && strcmp(e->hash, hash) == 0 &&
        e->expires_ms > rt_now_ms()) {
        r->user = rt_arena_strdup(r->arena, e->user);
        r->device = rt_arena_strdup(r->arena, e->device);
        r->is_admin = e->admin;
        hit = r->user && r->device;
    }
    pthread_mutex_unlock(&mu);
    rt_metric_add(hit ? m_hits : m_misses, 1);
    return hit;
}

void auth_cache_store(const char *hash, const char *user, const char *device, int admin,
                      uint64_t read_epoch)
{
    pthread_mutex_lock(&mu);
    /* A forget since the look-up began may have revoked what the database said. */
    if (slots && listening && epoch == read_epoch) {
        cache_entry *e = &slots[slot_of(hash)];
        clear_entry(e);
        e->user = strdup(user);
        e->device = strdup(device);
        if (e->user && e->device) {
            memcpy(e->hash, hash, sizeof(e->hash));
            e->admin = admin;
            e->expires_ms = rt_now_ms() + AUTH_CACHE_TTL_MS;
        } else {
            clear_entry(e);
        }
    }
    pthread_mutex_unlock(&mu);
}

/* mu held. user NULL = everyone. */
static void forget_locked(const char *user)
{
    epoch++;
    if (!slots) return;
    for (size_t i = 0; i < AUTH_CACHE_SLOTS; i++)
        if (slots[i].user && (!user || strcmp(slots[i].user, user) == 0)) clear_entry(&slots[i]);
}

void auth_cache_forget_user(const char *user_id)
{
    pthread_mutex_lock(&mu);
    forget_locked(user_id);
    pthread_mutex_unlock(&mu);
    rt_metric_add(m_forgets, 1);
}

static void set_listening(bool on)
{
    pthread_mutex_lock(&mu);
    forget_locked(NULL); /* whatever was missed while away, or is no longer watched */
    listening = on;
    pthread_mutex_unlock(&mu);
}

static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static PGconn *listen_connect(void)
{
    PGconn *c = PQconnectdb(listen_conninfo);
    if (!c || PQstatus(c) != CONNECTION_OK) {
        if (c) PQfinish(c);
        return NULL;
    }
    PGresult *res = PQexec(c, "LISTEN " AUTH_NOTIFY_CHANNEL);
    bool ok = PQresultStatus(res) == PGRES_COMMAND_OK;
    PQclear(res);
    if (!ok) {
        PQfinish(c);
        return NULL;
    }
    return c;
}

static void *listen_main(void *arg)
{
    (void)arg;
    PGconn *c = NULL;
    while (!atomic_load(&listener_stop)) {
        if (!c) {
            c = listen_connect();
            if (!c) {
                sleep_ms(AUTH_LISTEN_RETRY_MS);
                continue;
            }
            set_listening(true);
        }
        struct pollfd p = {.fd = PQsocket(c), .events = POLLIN};
        int n = poll(&p, 1, AUTH_LISTEN_POLL_MS);
        if (n > 0 && !PQconsumeInput(c)) {
            rt_log(ATRIUM_LOG_WARN, "core", "token cache off: lost its PostgreSQL connection (%s)",
                   PQerrorMessage(c));
            set_listening(false);
            PQfinish(c);
            c = NULL;
            continue;
        }
        PGnotify *note;
        while ((note = PQnotifies(c)) != NULL) {
            auth_cache_forget_user(note->extra);
            PQfreemem(note);
        }
        if (PQstatus(c) != CONNECTION_OK) {
            set_listening(false);
            PQfinish(c);
            c = NULL;
        }
    }
    set_listening(false);
    if (c) PQfinish(c);
    return NULL;
}

int auth_cache_start(const char *conninfo)
{
    listen_conninfo = strdup(conninfo);
    if (!listen_conninfo) return -1;
    atomic_store(&listener_stop, false);
    if (pthread_create(&listener, NULL, listen_main, NULL) != 0) {
        rt_log(ATRIUM_LOG_ERROR, "core", "cannot start the token cache's listener thread");
        return -1;
    }
    listener_started = true;
    return 0;
}

void auth_cache_stop(void)
{
    if (listener_started) {
        atomic_store(&listener_stop, true);
        pthread_join(listener, NULL);
        listener_started = false;
    }
    pthread_mutex_lock(&mu);
    forget_locked(NULL);
    free(slots);
    slots = NULL;
    pthread_mutex_unlock(&mu);
    free(listen_conninfo);
    listen_conninfo = NULL;
}
