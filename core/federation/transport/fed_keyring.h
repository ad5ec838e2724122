/*
 * core/federation/transport/fed_keyring.h - other servers' signing keys: checking a fetched key
 * document, the cache (bounded memory in front of PostgreSQL), one fetch per server no
 * matter how many requests wait for it, and the notary answer of /_matrix/key/v2/query.
 *
 * Validation (fed_keyvalid_doc, fed_keyvalid_notary) is pure: it turns a fetched JSON
 * document into a fed_key_set, the only form in which keys enter the ring, or says why
 * not. A document is accepted when its server_name is the one asked for, valid_until_ts is
 * there, and every ed25519 key in verify_keys has signed it; a notary's answer must also
 * carry a good signature of the notary by one of its configured keys. What a key may
 * verify is capped as the spec says: a current key verifies what was signed until
 * min(valid_until_ts, fetched + 7 days), an old key what was signed before its expired_ts.
 *
 * The ring answers "the key K of server S, valid until at least T" (fed_keyring_lookup):
 * at once from memory when it can; otherwise the waiter joins the one resolution in flight
 * for S: first a read of S's rows from PostgreSQL on the ring's own small pool (never on
 * the caller's thread), then, if still missing, the fetch hook. The fetch hook is the
 * integrator's: it fetches (directly, or through trusted key servers), validates with the
 * functions here, and calls fed_keyring_fetched exactly once. A failed fetch is remembered
 * for negative_ttl_ms so a dead origin is not asked at every request, and a server fetched
 * successfully is not fetched again for refetch_min_interval_ms (so requests signed with
 * made-up key IDs cannot make us hammer it). Fetched keys are written back to PostgreSQL,
 * with the whole document, on the same pool.
 *
 * Threads: every function may be called from any thread. Callbacks (lookup and notary)
 * run on the thread that completed the resolution: the ring's pool thread, or the thread
 * that called fed_keyring_fetched (the outbound client's I/O thread): they must be quick
 * and must not block (resume a parked request, no PostgreSQL). They are never called with
 * a ring lock held, so they may call into the ring again. Each file exports its own prefix:
 * fed_keyring_ (fed_keyring.c), fed_keyvalid_ (fed_keyvalid.c), fed_notary_ (fed_notary.c).
 *
 * Wiring, in outline (the integrator's fetch hook, on top of fed_http.h and discovery):
 *     static int fetch(void *arg, fed_keyring *ring, const char *server)
 *     {   submit GET /_matrix/key/v2/server (or POST /_matrix/key/v2/query to a trusted
 *         key server) and return 0; in the request's on_done (I/O thread):
 *             json_t *doc = json_loadb(res->body, res->body_len, 0, NULL);
 *             fed_key_set *k = doc ? fed_keyvalid_doc(doc, server, rt_wall_ms(), why,
 *                                                         sizeof(why)) : NULL;
 *             (or fed_keyvalid_notary; on failure try the next source)
 *             fed_keyring_fetched(ring, server, k, k ? NULL : why);
 *             json_decref(doc);
 *     }
 * and for an inbound request: fed_xmatrix_parse, then fed_keyring_lookup(origin, key,
 * now), then fed_xmatrix_verify with the key found.
 */
#ifndef ATRIUM_CORE_FED_KEYRING_H
#define ATRIUM_CORE_FED_KEYRING_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "atrium/host.h"
#include "core/federation/transport/fed_keys.h"
#include "core/runtime/runtime.h"
#include "core/store/db.h"

#define FED_KEYRING_KEYS_PER_SERVER_MAX 64 /* a document with more keys is refused */
#define FED_KEYRING_ERROR_MAX_BYTES 512
/* The spec's cap on how far ahead a fetched key may be used to verify. */
#define FED_KEYRING_VALIDITY_CAP_MS FED_KEY_VALIDITY_DEFAULT_MS
/* Defaults of fed_keyring_settings (a 0 field takes its default). */
#define FED_KEYRING_DEFAULT_MAX_SERVERS 1024
#define FED_KEYRING_DEFAULT_NEGATIVE_TTL_MS 60000
#define FED_KEYRING_DEFAULT_REFETCH_MIN_INTERVAL_MS 30000
#define FED_KEYRING_DEFAULT_MAX_WAITERS 4096
#define FED_KEYRING_DEFAULT_QUEUE_DEPTH 256
#define FED_KEYRING_DEFAULT_DB_TIMEOUT_MS 2000
#define FED_KEYRING_POOL_THREADS 2
/* The most (server, key) criteria one notary query may carry. */
#define FED_NOTARY_CRITERIA_MAX 100

/* ---- keys and validation --------------------------------------------------------------- */

typedef struct fed_verify_key {
    char key_id[FED_KEY_ID_MAX_BYTES];
    unsigned char public_key[FED_PUBLIC_KEY_BYTES];
    /* Wall-clock ms: the key verifies what was signed up to this instant (the capped
     * valid_until_ts for a current key, expired_ts for an old one). */
    int64_t valid_until_ms;
    int64_t fetched_ms; /* when the document holding it was fetched (wall clock) */
    /* From old_verify_keys: such keys verify events only, so an inbound request signed
     * with one is refused whatever its expired_ts (the caller checks). */
    bool old;
} fed_verify_key;

/* A server's keys as validated; only the validators and the ring create these. */
typedef struct fed_key_set {
    char server_name[FED_SERVER_NAME_MAX_BYTES];
    size_t n;
    fed_verify_key keys[FED_KEYRING_KEYS_PER_SERVER_MAX];
    /* docs[i]: the signed document keys[i] came from, as the origin published it (a
     * reference owned by the set; keys of one document share it). Kept to be served when
     * this server acts as a notary. */
    json_t *docs[FED_KEYRING_KEYS_PER_SERVER_MAX];
} fed_key_set;

void fed_key_set_free(fed_key_set *s); /* NULL is fine */

/* Merge src's keys into dst (same server): per key ID the later fetch wins, within one
 * fetch the longer validity; a full dst gives up its shortest-lived key for a longer one.
 * Documents are shared by reference. Never fails. */
void fed_key_set_merge(fed_key_set *dst, const fed_key_set *src);

/* Validate a document fetched from GET /_matrix/key/v2/server of expected_server_name at
 * now_wall_ms (see the top of this file for the rules). A new set (the document is
 * copied; the caller keeps doc), or NULL with `why` (why_len bytes) set to a sentence
 * naming the server and the failed check (also on out-of-memory). */
fed_key_set *fed_keyvalid_doc(const json_t *doc, const char *expected_server_name,
                                  int64_t now_wall_ms, char *why, size_t why_len);

/* A trusted key server (federation.trusted_key_servers): its name and the keys it signs
 * with (at least one; a notary whose keys we do not know cannot vouch for anything). */
typedef struct fed_notary {
    const char *server_name;
    const fed_public_key *keys;
    size_t n_keys;
} fed_notary;

/* Validate a notary's answer (the body of its /_matrix/key/v2/query, {"server_keys":
 * [...]}) for expected_server_name: every document in it for that server must pass
 * fed_keyvalid_doc and carry a signature by the notary with one of notary->keys, all
 * such signatures present must verify, and there must be at least one such document
 * (documents for other servers are ignored). The keys of several documents are merged
 * (per key ID, the latest validity wins). A new set, or NULL with `why` set. */
fed_key_set *fed_keyvalid_notary(const json_t *response, const char *expected_server_name,
                                         const fed_notary *notary, int64_t now_wall_ms,
                                         char *why, size_t why_len);

/* ---- the ring -------------------------------------------------------------------------- */

typedef struct fed_keyring fed_keyring;

/* The fetch hook. Asked to fetch server_name's keys; must not block (submit an outbound
 * request and return). Return 0 when it will call fed_keyring_fetched(ring, server_name,
 * ...) exactly once (later, or even before returning); any other value means the fetch
 * could not start (counted as a failed fetch; fed_keyring_fetched must then not be
 * called). Called without ring locks held, on a looking-up thread or the ring's pool. */
typedef int (*fed_keyring_fetch_fn)(void *fetch_arg, fed_keyring *ring, const char *server_name);

typedef struct fed_keyring_settings {
    int max_servers;                 /* servers kept in memory (least recently used go) */
    int64_t negative_ttl_ms;         /* a failed fetch is not retried before this */
    int64_t refetch_min_interval_ms; /* a fetched server is not refetched before this */
    int max_waiters;                 /* look-ups waiting on resolutions, all servers */
    int queue_depth;                 /* the ring's pool queue (reads and writes) */
    int64_t db_timeout_ms;           /* connection wait on the ring's pool thread */
    fed_keyring_fetch_fn fetch;      /* required */
    void *fetch_arg;
    /* Wall clock in ms (NULL = rt_wall_ms); tests substitute their own. Every time of the
     * ring is wall-clock; a clock that goes back ends negative entries early. */
    int64_t (*clock_ms)(void);
} fed_keyring_settings;

/* A ring: memory only when db is NULL (tests), else backed by federation_server_keys
 * (apply FED_MIGRATIONS of fed_migrations.h first: version 2 creates it). Copies settings. Metrics:
 * atrium_federation_key_lookups_total{result="hit|miss|negative|busy"},
 * atrium_federation_key_fetches_total{outcome="ok|failed"},
 * atrium_federation_key_cache_servers, atrium_federation_key_waiters, and the pool's
 * (pool="federation_keys"). NULL on a bad setting or out-of-memory (logged). */
fed_keyring *fed_keyring_new(const fed_keyring_settings *s, db_pool *db, rt_metrics *metrics);
/* Start the pool's threads: 0 or ATRIUM_E_IO. */
int fed_keyring_start(fed_keyring *ring);
/* Refuse new look-ups (answered FED_KEY_E_STOPPED), finish the pool's work, and answer
 * every waiter FED_KEY_E_STOPPED. fed_keyring_fetched stays safe to call (it then only
 * frees its set) until fed_keyring_free: stop the outbound client in between. */
void fed_keyring_stop(fed_keyring *ring);
void fed_keyring_free(fed_keyring *ring); /* after stop */

/* How a look-up ended (fed_key_result.status). */
enum fed_key_status {
    FED_KEY_FOUND = 0,
    FED_KEY_E_UNKNOWN = -120,     /* the server's keys are known; none matches */
    FED_KEY_E_UNREACHABLE = -121, /* the keys could not be fetched (now or recently) */
    FED_KEY_E_BUSY = -122,        /* too many waiters, memory full of busy servers, pool full */
    FED_KEY_E_STOPPED = -123,     /* the ring is stopping */
};

typedef struct fed_key_result {
    int status;         /* enum fed_key_status */
    fed_verify_key key; /* when FED_KEY_FOUND */
    char error[FED_KEYRING_ERROR_MAX_BYTES]; /* otherwise a sentence for the log */
} fed_key_result;

/* Called once with the answer of a pending look-up; res is valid during the call only. */
typedef void (*fed_keyring_cb)(void *arg, const fed_key_result *res);

enum { FED_KEYRING_ANSWERED = 0, FED_KEYRING_PENDING = 1 };

/* Find key key_id of server_name (key_id NULL: any key of the server) that verifies what
 * was signed at minimum_valid_until_ms (for an inbound request: now; for an event: its
 * origin_server_ts). Returns FED_KEYRING_ANSWERED with *now_out filled (found, or a
 * refusal: a recent failure, a fresh fetch that lacked the key, busy, stopped) and cb never
 * called; or FED_KEYRING_PENDING: cb(arg, result) will be called exactly once, on another
 * thread or on this one before the function returns (when the fetch hook answers at once);
 * *now_out is then untouched. Never blocks. An invalid server name or key ID is answered
 * FED_KEY_E_UNKNOWN. */
int fed_keyring_lookup(fed_keyring *ring, const char *server_name, const char *key_id,
                       int64_t minimum_valid_until_ms, fed_key_result *now_out,
                       fed_keyring_cb cb, void *arg);

/* The fetch hook's answer for server_name: keys (taken over; its server_name must be
 * server_name) from fed_keyvalid_doc or fed_keyvalid_notary, or NULL with error (a
 * sentence for the log) when every source failed. Merges the keys into memory, answers
 * the waiters (on this thread), and queues the write to PostgreSQL. Never blocks. */
void fed_keyring_fetched(fed_keyring *ring, const char *server_name, fed_key_set *keys,
                         const char *error);

/* Wait until the pool has finished every write queued so far, at most timeout_ms (for
 * tests and an orderly shutdown). 0 or ATRIUM_E_TIMEOUT. Not on a ring callback. */
int fed_keyring_flush(fed_keyring *ring, int64_t timeout_ms);

/* The table federation_server_keys (server_name, key_id, public_key, valid_until_ts,
 * fetched_ts, key_json; primary key (server_name, key_id)) is version 2 of the federation's
 * one migration list, fed_migrations.h. */

/* ---- acting as a notary (/_matrix/key/v2/query) ----------------------------------------- */

/* The cached documents of server_name holding any of key_ids (every key when n_key_ids is
 * 0), each once, as deep copies in a new JSON array (empty when nothing is cached in
 * memory), whatever their validity. NULL on out-of-memory. */
json_t *fed_keyring_cached_documents(fed_keyring *ring, const char *server_name,
                                     const char *const *key_ids, size_t n_key_ids);

typedef struct fed_notary_criterion {
    const char *server_name;        /* borrowed (from the request) */
    const char *key_id;             /* NULL = every key of the server */
    int64_t minimum_valid_until_ms; /* "if not supplied, the notary MUST use the current time" */
} fed_notary_criterion;

/* Read the body of POST /_matrix/key/v2/query ({"server_keys": {server: {key_id:
 * {"minimum_valid_until_ts": ms}}}}) into out (at most FED_NOTARY_CRITERIA_MAX entries;
 * strings borrowed from body): one criterion per key ID, or one with key_id NULL for a
 * server given no key IDs; a missing minimum_valid_until_ts becomes now_wall_ms. Returns
 * the count (0 for no servers), or ATRIUM_E_INVAL with `why` set (a sentence for
 * M_BAD_JSON / M_INVALID_PARAM) when the shape is wrong or there are too many criteria.
 * (For GET /query/{serverName}, fill one criterion with key_id NULL.) */
int fed_notary_query_parse(const json_t *body, int64_t now_wall_ms,
                           fed_notary_criterion out[FED_NOTARY_CRITERIA_MAX], char *why,
                           size_t why_len);

/* Called once with the answer of a pending notary query: {"server_keys": [...]}, a new
 * reference the callee owns (never NULL: on out-of-memory or stop, an empty list). */
typedef void (*fed_notary_cb)(void *arg, json_t *response);

/* A notary query needs server_name's key (key_id, NULL any) valid until minimum_valid_until_ms
 * and what is cached ends before: lift the refetch interval (refetch_min_interval_ms) so the
 * look-up that follows asks the origin again, as the spec has a notary do, unless the
 * server was fetched less than FED_KEYRING_NOTARY_REFETCH_MIN_MS ago or its last fetch
 * failed (then negative_ttl_ms stands). An unauthenticated querier can so make us ask one
 * origin at most once a second. */
#define FED_KEYRING_NOTARY_REFETCH_MIN_MS 1000
void fed_keyring_notary_refetch(fed_keyring *ring, const char *server_name, const char *key_id,
                                int64_t minimum_valid_until_ms);

/* Answer a notary query: for each criterion, look the server up (fetching from its origin
 * when nothing cached is valid until the criterion's minimum: fed_keyring_notary_refetch),
 * then answer with every
 * cached document holding a requested key (all keys when key_id is NULL), whether or not
 * the fetch succeeded (the spec asks notaries to keep serving the last answer of a server
 * that is down), each stripped of signatures other than its origin's and signed by us
 * (own_name, own_key). A criterion naming own_name is answered with own_doc (our key
 * document, already signed; NULL = left out). Servers with nothing cached are left out.
 * Returns FED_KEYRING_ANSWERED with *now_out set (a new reference) and cb never called,
 * or FED_KEYRING_PENDING: cb will be called once (possibly before this returns). */
int fed_notary_query(fed_keyring *ring, const fed_notary_criterion *criteria,
                             size_t n, const char *own_name, const fed_signing_key *own_key,
                             const json_t *own_doc, json_t **now_out, fed_notary_cb cb,
                             void *arg);

#endif
