/*
 * plugins/media/cluster.c - the media plugin when several Atrium processes share one
 * PostgreSQL and one media store (docs/architecture.md, "More than one process"): the
 * wake-ups that cross processes, the claims that make one process do a piece of work
 * for all, and the once-only eviction's lease. Everything goes through the host ABI
 * (1.3: notify_subscribe, notify_publish, notify_live, instance_name, lease_create,
 * lease_held); a host that offers none of it leaves the plugin working per process, as
 * it always did.
 *
 * Decisions owned here:
 *   - wake-ups are generations per event bucket (media_wake_gen / media_wake): whatever a
 *     parked request waits for (an upload landing, a render or a fetch ending elsewhere)
 *     bumps the generation of its key's bucket and signals that bucket's event, so a
 *     request that read "not yet" before the bump re-reads instead of parking, and one
 *     that parked is woken. A notification from any process (this one included) bumps
 *     them the same way; after the listening connection came back (payload NULL: some
 *     may have been missed) every bucket is bumped;
 *   - notifications carry only a key (a media ID, a thumbnail key, a remote file's key)
 *     and are published after the commit that made the change visible, so a woken
 *     request that reads the database or the shared store sees it;
 *   - a claim (media_claims, one row per piece of work) says which process does it: the
 *     one whose INSERT ... ON CONFLICT took the row or a lapsed one; the row names its
 *     owner and an expiry (so a dead owner's claim lapses and another process takes the
 *     work over) and no connection is held while the work runs. When the work ends the
 *     owner deletes the row, or keeps it with the result for a while when the result is
 *     worth remembering (a bad image, an origin's 404), so the other processes answer
 *     the same without doing the work again; then it publishes the key. Times are the
 *     database's clock, the one clock every process shares;
 *   - a failure to claim (no connection, an error) counts as "mine": the work is done
 *     here, as a single process would, rather than not at all;
 *   - remote-cache eviction runs only in the process holding the lease
 *     "remote_cache.evict" (cache.c asks cluster_evicts_here); the others announce what
 *     they stored on "cache.stored" so the holder looks at the total.
 * The callbacks run on the core's notification thread: they take a plugin mutex for a
 * moment, signal events or queue work, never touch PostgreSQL.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "media.h"
#include "s3.h"

#define CLUSTER_EVICT_LEASE "remote_cache.evict"
#define CLUSTER_EVICT_LEASE_TTL_MS 30000
#define CLUSTER_OWNER_RANDOM_BYTES 6

/* ---- wake-ups ------------------------------------------------------------------------ */

uint64_t media_wake_gen(media *m, const char *key)
{
    size_t b = media_bucket(key);
    pthread_mutex_lock(&m->wake_mu);
    uint64_t gen = m->wake_gen[b];
    pthread_mutex_unlock(&m->wake_mu);
    return gen;
}

void media_wake(media *m, const char *key)
{
    size_t b = media_bucket(key);
    pthread_mutex_lock(&m->wake_mu);
    m->wake_gen[b]++;
    pthread_mutex_unlock(&m->wake_mu);
    m->h->event_signal(m->events[b]);
}

static void wake_all(media *m)
{
    pthread_mutex_lock(&m->wake_mu);
    for (size_t b = 0; b < MEDIA_EVENT_BUCKETS; b++) m->wake_gen[b]++;
    pthread_mutex_unlock(&m->wake_mu);
    for (size_t b = 0; b < MEDIA_EVENT_BUCKETS; b++) m->h->event_signal(m->events[b]);
}

int media_park_unless_woken(media *m, atrium_req *req, const char *key, uint64_t gen,
                            int64_t until_ms)
{
    size_t b = media_bucket(key);
    /* Under wake_mu: a wake after our read bumped the generation (look again now); one
     * that comes later finds us linked to the event. */
    pthread_mutex_lock(&m->wake_mu);
    if (m->wake_gen[b] != gen) {
        pthread_mutex_unlock(&m->wake_mu);
        return PARK_WOKEN;
    }
    int rc = m->h->park(req, m->events[b], until_ms);
    pthread_mutex_unlock(&m->wake_mu);
    return rc == 0 ? ATRIUM_PARKED : ATRIUM_E_STOPPED;
}

/* ---- notifications ------------------------------------------------------------------- */

bool cluster_live(const media *m)
{
    return ATRIUM_HOST_HAS(m->h, notify_live) && m->h->notify_live() == 1;
}

void cluster_publish(media *m, const char *channel, const char *payload)
{
    const atrium_host *h = m->h;
    if (!ATRIUM_HOST_HAS(h, notify_publish)) return;
    int rc = h->notify_publish(m->self, NULL, channel, payload);
    /* Not fatal: the other processes' waiters look again on their own (re-checks, claim
     * expiry); they only learn it later. */
    if (rc < 0)
        h->log(m->self, ATRIUM_LOG_WARN, "cannot tell the other processes (%s %s): error %d",
               channel, payload, rc);
}

static void on_upload(void *arg, const char *payload)
{
    media *m = arg;
    if (payload) media_wake(m, payload);
    else wake_all(m);
}

static void on_render(void *arg, const char *payload)
{
    media *m = arg;
    thumbnails_ended_elsewhere(m, payload);
    if (payload) media_wake(m, payload);
    else wake_all(m);
}

static void on_fetch(void *arg, const char *payload)
{
    media *m = arg;
    if (payload) media_wake(m, payload);
    else wake_all(m);
}

static void on_stored(void *arg, const char *payload)
{
    (void)payload; /* what was stored does not matter: the holder counts the total */
    cache_stored_elsewhere(arg);
}

/* ---- claims ---------------------------------------------------------------------------- */

int cluster_claim(media *m, const char *key, int64_t ttl_ms, int *result, int64_t *left_ms)
{
    const atrium_host *h = m->h;
    PGconn *c = h->db_acquire(MEDIA_DB_WAIT_MS);
    if (!c) return CLAIM_MINE;
    int rc = media_db_claim(h, m->self, c, key, m->claim_owner, ttl_ms, result, left_ms);
    h->db_release(c);
    return rc < 0 ? CLAIM_MINE : rc;
}

void cluster_claim_end(media *m, const char *channel, const char *key, const char *payload,
                       int result, int64_t remember_ms)
{
    const atrium_host *h = m->h;
    PGconn *c = h->db_acquire(MEDIA_DB_WAIT_MS);
    if (c) {
        media_db_claim_end(h, m->self, c, key, m->claim_owner, result, remember_ms);
        h->db_release(c);
    }
    /* Published also when the row could not be written: waiters elsewhere look again,
     * and a row left behind lapses at its expiry. */
    cluster_publish(m, channel, payload);
}

/* ---- the eviction lease ------------------------------------------------------------- */

bool cluster_evicts_here(const media *m)
{
    return !m->evict_lease || m->h->lease_held(m->evict_lease) == 1;
}

bool cluster_shared_eviction(const media *m)
{
    return m->evict_lease != NULL;
}

/* ---- set-up ---------------------------------------------------------------------------- */

/* "<instance>.<pid>.<random hex>": unique per process even where instance names repeat. */
static void make_owner(media *m)
{
    const atrium_host *h = m->h;
    const char *instance = ATRIUM_HOST_HAS(h, instance_name) ? h->instance_name() : NULL;
    unsigned char rnd[CLUSTER_OWNER_RANDOM_BYTES] = {0};
    FILE *f = fopen("/dev/urandom", "rb");
    if (f) {
        if (fread(rnd, 1, sizeof(rnd), f) != sizeof(rnd)) memset(rnd, 0, sizeof(rnd));
        fclose(f);
    }
    int n = snprintf(m->claim_owner, sizeof(m->claim_owner), "%.64s.%ld.",
                     instance && *instance ? instance : "atrium", (long)getpid());
    for (size_t i = 0; i < sizeof(rnd) && n > 0 && (size_t)n + 2 < sizeof(m->claim_owner); i++)
        n += snprintf(m->claim_owner + n, sizeof(m->claim_owner) - (size_t)n, "%02x", rnd[i]);
}

int cluster_init(media *m)
{
    const atrium_host *h = m->h;
    make_owner(m);
    if (ATRIUM_HOST_HAS(h, notify_subscribe)) {
        struct {
            const char *channel;
            void (*cb)(void *, const char *);
        } subs[] = {
            {MEDIA_CH_UPLOAD, on_upload},
            {MEDIA_CH_RENDER, on_render},
            {MEDIA_CH_FETCH, on_fetch},
            {MEDIA_CH_STORED, on_stored},
            {MEDIA_CH_ROW, rowcache_on_row},
            {MEDIA_CH_GONE, store_gone_on},
        };
        for (size_t i = 0; i < sizeof(subs) / sizeof(subs[0]); i++) {
            int rc = h->notify_subscribe(m->self, subs[i].channel, subs[i].cb, m);
            if (rc < 0) {
                h->log(m->self, ATRIUM_LOG_ERROR, "cannot subscribe to notifications %s: error %d",
                       subs[i].channel, rc);
                return rc;
            }
        }
    }
    if (ATRIUM_HOST_HAS(h, lease_create) && ATRIUM_HOST_HAS(h, lease_held)) {
        m->evict_lease = h->lease_create(m->self, CLUSTER_EVICT_LEASE, CLUSTER_EVICT_LEASE_TTL_MS);
        if (!m->evict_lease) {
            h->log(m->self, ATRIUM_LOG_ERROR, "cannot create the lease %s", CLUSTER_EVICT_LEASE);
            return ATRIUM_E_STATE;
        }
    }
    return 0;
}
