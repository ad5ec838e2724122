/*
 * core/client/auth/auth_seen.c - when a device was last used: devices.last_seen_ts and
 * last_seen_ip (and last_seen_user_agent, for GET /admin/whois) follow the requests a device
 * makes, not only its logins, at a bounded cost.
 *
 * Decisions owned here:
 *   - The rule (auth_seen_due): a device's row is refreshed when the newest last-seen time
 *     this process knows for it is AUTH_SEEN_REFRESH_MS old, so a busy device costs at most
 *     one UPDATE per interval. "Known" is the larger of what the token look-up read from
 *     PostgreSQL (a token cache miss reads devices.last_seen_ts in the same query, so a
 *     refresh by another process sharing the database counts too: docs/architecture.md,
 *     'More than one process') and what this
 *     process wrote last, remembered in a small bounded table. A request served from the
 *     token cache reads only that table: no database round trip within the interval. A
 *     device the table does not know (evicted by another, or after a restart) is left
 *     alone until its token's next cache miss, at most AUTH_CACHE_TTL_MS away, reads the
 *     stored value: forgetting a device never causes a write.
 *   - Where the write runs: on the request's own thread, right after authentication and
 *     before its handler, so the devices endpoints report it (a GET /devices that triggers
 *     a refresh shows it). It can neither fail nor hold up the request: a pooled connection
 *     is waited for at most AUTH_SEEN_DB_WAIT_MS, the UPDATE skips a row that another
 *     transaction has locked instead of waiting for it, and a failure is counted, logged
 *     and tried again AUTH_SEEN_RETRY_MS later while the request goes on. (On the auth
 *     pool the writes would compete with password hashing for its small queue, and the
 *     devices endpoints could answer before the write.)
 *   - The UPDATE never moves last_seen_ts backwards (a login's newer time stays).
 * last_seen_ip is the request's client address after trusted-proxy handling
 * (r->client_addr), as for rate limits; last_seen_user_agent its User-Agent header, made
 * safe to store (auth_user_agent). The table holds keyed hashes of (user, device)
 * and times only. What this file does not do: decide whether a token is valid (auth.c,
 * auth_cache.c), or write the row at login (account_util.c).
 */
#include <sodium.h>
#include <stdio.h>
#include <string.h>

#include "core/client/auth/auth.h"

#define AUTH_SEEN_SLOTS 16384   /* devices remembered at once (16 bytes each) */
#define AUTH_SEEN_DB_WAIT_MS 10 /* the longest a request waits for a pooled connection */

typedef struct seen_entry {
    uint64_t tag;    /* keyed hash of (user, device) */
    int64_t seen_ms; /* newest last-seen time known (wall clock); 0 = empty slot */
} seen_entry;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static seen_entry table[AUTH_SEEN_SLOTS];
static unsigned char hash_key[crypto_shorthash_siphashx24_KEYBYTES]; /* set once, before requests */
static rt_metric *m_writes, *m_failures;

int auth_seen_init(rt_metrics *metrics)
{
    randombytes_buf(hash_key, sizeof(hash_key)); /* nobody can aim device IDs at a slot */
    m_writes = rt_metric_counter(metrics, "atrium_device_seen_writes_total", NULL,
                                 "Device last-seen refreshes written to PostgreSQL");
    m_failures = rt_metric_counter(metrics, "atrium_device_seen_failures_total", NULL,
                                   "Device last-seen refreshes put off: no connection in time "
                                   "or the UPDATE failed");
    return 0;
}

/* The device's tag and slot, from keyed hashes (SipHash, as hash tables use: this runs on
 * every authenticated request): the user ID's, which keys the device ID's. */
static void locate(const char *user, const char *device, uint64_t *tag, size_t *slot)
{
    unsigned char user_h[crypto_shorthash_siphashx24_BYTES];
    unsigned char out[crypto_shorthash_siphashx24_BYTES];
    crypto_shorthash_siphashx24(user_h, (const unsigned char *)user, strlen(user), hash_key);
    crypto_shorthash_siphashx24(out, (const unsigned char *)device, strlen(device), user_h);
    uint64_t where;
    memcpy(tag, out, sizeof(*tag));
    memcpy(&where, out + 8, sizeof(where));
    *slot = (size_t)(where % AUTH_SEEN_SLOTS);
}

bool auth_seen_due(const char *user, const char *device, int64_t stored_ts, int64_t now_ms)
{
    uint64_t tag;
    size_t slot;
    locate(user, device, &tag, &slot);
    pthread_mutex_lock(&mu);
    seen_entry *e = &table[slot];
    int64_t known = e->seen_ms && e->tag == tag ? e->seen_ms : AUTH_SEEN_UNKNOWN;
    if (stored_ts != AUTH_SEEN_UNKNOWN && stored_ts > known) known = stored_ts;
    bool due = known != AUTH_SEEN_UNKNOWN && now_ms - known >= AUTH_SEEN_REFRESH_MS;
    if (known != AUTH_SEEN_UNKNOWN) {
        /* Taken at once, before the write: a concurrent request of the device does not
         * write too. A known time of 0 (a NULL column) is always due, so never stored. */
        e->tag = tag;
        e->seen_ms = due ? now_ms : known;
    }
    pthread_mutex_unlock(&mu);
    return due;
}

void auth_seen_retry_later(const char *user, const char *device, int64_t due_ms)
{
    uint64_t tag;
    size_t slot;
    locate(user, device, &tag, &slot);
    pthread_mutex_lock(&mu);
    seen_entry *e = &table[slot];
    if (e->tag == tag && e->seen_ms == due_ms) /* not replaced meanwhile */
        e->seen_ms = due_ms - AUTH_SEEN_REFRESH_MS + AUTH_SEEN_RETRY_MS;
    pthread_mutex_unlock(&mu);
}

const char *auth_user_agent(atrium_req *r)
{
    const char *ua = http_req_header(r, "User-Agent");
    if (!ua) return NULL;
    size_t n = strnlen(ua, AUTH_USER_AGENT_MAX_BYTES);
    char *out = rt_arena_strndup(r->arena, ua, n);
    if (!out) return NULL; /* out of memory: the agent is merely not recorded */
    for (char *p = out; *p; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e) *p = '?';
    return out;
}

/* Write (now_ms, ip, user_agent) into the device's row unless it holds a newer time or
 * another transaction has it locked. 1 written, 0 left as it was, -1 failed. */
static int write_seen(const char *user, const char *device, const char *ip, const char *user_agent,
                      int64_t now_ms)
{
    PGconn *c = db_acquire(db_global(), AUTH_SEEN_DB_WAIT_MS);
    if (!c) return -1; /* the pool is busy now: not worth holding the request for */
    char ts[24];
    snprintf(ts, sizeof(ts), "%lld", (long long)now_ms);
    const char *params[5] = {user, device, ts, ip, user_agent};
    PGresult *res = db_query(c,
                             "UPDATE devices SET last_seen_ts = $3, last_seen_ip = $4,"
                             " last_seen_user_agent = $5"
                             " WHERE user_id = $1 AND device_id = $2 AND EXISTS ("
                             "SELECT 1 FROM devices WHERE user_id = $1 AND device_id = $2"
                             " AND (last_seen_ts IS NULL OR last_seen_ts < $3)"
                             " FOR UPDATE SKIP LOCKED)",
                             5, params);
    int rc = -1;
    if (PQresultStatus(res) == PGRES_COMMAND_OK)
        rc = strcmp(PQcmdTuples(res), "1") == 0 ? 1 : 0;
    else
        rt_log(ATRIUM_LOG_WARN, "core",
               "could not refresh the last-seen time of device %s of %s (tried again in %d s): "
               "%s", device, user, AUTH_SEEN_RETRY_MS / 1000, PQresultErrorMessage(res));
    PQclear(res);
    db_release(db_global(), c);
    return rc;
}

void auth_seen_note(atrium_req *r, int64_t stored_ts)
{
    if (!r->user || !r->device) return;
    int64_t now_ms = rt_wall_ms();
    if (!auth_seen_due(r->user, r->device, stored_ts, now_ms)) return;
    const char *ip = r->client_addr ? r->client_addr : "unknown";
    int rc = write_seen(r->user, r->device, ip, auth_user_agent(r), now_ms);
    if (rc > 0) {
        rt_metric_add(m_writes, 1);
    } else if (rc < 0) {
        rt_metric_add(m_failures, 1);
        auth_seen_retry_later(r->user, r->device, now_ms);
    }
    /* rc == 0: the row is newer, locked by another writer, or gone: nothing to retry. */
}
