/*
 * core/federation/transport/fed_keyring.c - the remote key cache and the coalescing of look-ups (see
 * fed_keyring.h for the contract).
 *
 * One mutex guards a hash table of per-server entries kept in least-recently-used order.
 * A server's resolution in flight is a flight of the core's single-flight table
 * (core/runtime/flight.h, docs/adr/0029-single-flight.md), keyed by the server name, in
 * one of two phases: loading (its rows are being read from PostgreSQL on the ring's pool,
 * once per entry's life in memory) or fetching (the fetch hook was asked and
 * fed_keyring_fetched has not come back). Every look-up that memory cannot answer joins
 * the flight, so one server is read and fetched once however many requests need its key.
 * When a phase ends, each waiter is judged on its own (waiter_done): answered by what is
 * known now, refused, or - after the read, when fetching is allowed - joined to the fetch
 * that the first of them starts. The rule "may this server be fetched now?" lives in
 * fetch_blocked (negative entries and the refetch interval) and the rule "does what we
 * know answer this waiter?" in answer_of.
 *
 * Flights end (and waiters are answered) with the ring's mutex released, and the fetch
 * hook and pool submissions happen unlocked too, so a callback or a hook that re-enters
 * the ring cannot deadlock; the ring's mutex is taken before the flight table's, never
 * after. Entries that are busy (a flight, or waiters still to be judged) are never
 * evicted, which is what makes holding an entry's name across an unlock safe; when memory
 * is full of busy entries a new server is answered BUSY.
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/rooms/canonical_json.h"
#include "core/runtime/flight.h"
#include "core/runtime/base64.h"
#include "core/federation/transport/fed_keyring.h"

#define LOG_ORIGIN "federation"
#define POOL_NAME "federation_keys"
#define HASH_LOAD_FACTOR 2 /* buckets per entry at max_servers */

/* A look-up waiting on its server's flight. */
typedef struct waiter {
    rt_flight_waiter fw;
    fed_keyring *ring;
    rt_flight *f; /* the flight it waits on (a reference) */
    char server[FED_SERVER_NAME_MAX_BYTES];
    fed_keyring_cb cb;
    void *arg;
    bool any_key;
    char key_id[FED_KEY_ID_MAX_BYTES];
    int64_t min_valid_ms;
    fed_key_result res; /* filled when answered */
} waiter;

/* How a flight's phase ended (its result). */
enum phase_end { END_LOADED = 1, END_FETCHED, END_STOPPED, END_BUSY };

typedef struct entry {
    char name[FED_SERVER_NAME_MAX_BYTES];
    struct entry *hnext;
    struct entry *lru_prev, *lru_next; /* most recent at lru.next */
    fed_key_set *keys;                 /* what we know; NULL = nothing yet */
    bool loaded;                       /* PostgreSQL's rows are merged (or there is no DB) */
    rt_flight *flight;                 /* the resolution in flight, or NULL */
    bool fetching;                     /* its phase: the fetch (else the read) */
    int n_waiters;                     /* look-ups on it still to be judged */
    /* After a fetch: no new fetch in [since, until) (a clock going back ends it). */
    int64_t no_fetch_since_ms, no_fetch_until_ms;
    bool last_fetch_failed;
    char last_error[FED_KEYRING_ERROR_MAX_BYTES];
} entry;

struct fed_keyring {
    fed_keyring_settings s;
    db_pool *db;
    rt_pool *pool;
    rt_flights *flights; /* one resolution per server */
    pthread_mutex_t mu;
    pthread_cond_t writes_cv; /* writes_pending dropped */
    entry **buckets;
    size_t n_buckets;
    entry lru; /* sentinel of the LRU list */
    int n_entries;
    int n_waiters;
    int writes_pending;
    bool stopped;
    rt_metric *m_hit, *m_miss, *m_negative, *m_busy, *m_fetch_ok, *m_fetch_failed;
    rt_metric *m_servers, *m_waiters;
};

/* ---- time, names, the table ------------------------------------------------------------- */

static int64_t now_ms(const fed_keyring *r)
{
    return r->s.clock_ms ? r->s.clock_ms() : rt_wall_ms();
}

static size_t hash_name(const char *s)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return (size_t)h;
}

/* A server name we are willing to look up: non-empty, bounded, printable, no '/' (it ends
 * up in URLs and log lines; discovery judges the rest). */
static bool name_ok(const char *name)
{
    size_t n = name ? strnlen(name, FED_SERVER_NAME_MAX_BYTES) : 0;
    if (n == 0 || n >= FED_SERVER_NAME_MAX_BYTES) return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)name[i];
        if (c <= 0x20 || c >= 0x7f || c == '/' || c == '"' || c == '\\') return false;
    }
    return true;
}

static entry *find_locked(fed_keyring *r, const char *name)
{
    for (entry *e = r->buckets[hash_name(name) & (r->n_buckets - 1)]; e; e = e->hnext)
        if (strcmp(e->name, name) == 0) return e;
    return NULL;
}

static void lru_unlink(entry *e)
{
    e->lru_prev->lru_next = e->lru_next;
    e->lru_next->lru_prev = e->lru_prev;
}

static void lru_push_front(fed_keyring *r, entry *e)
{
    e->lru_next = r->lru.lru_next;
    e->lru_prev = &r->lru;
    r->lru.lru_next->lru_prev = e;
    r->lru.lru_next = e;
}

static void remove_locked(fed_keyring *r, entry *e)
{
    entry **pp = &r->buckets[hash_name(e->name) & (r->n_buckets - 1)];
    while (*pp != e) pp = &(*pp)->hnext;
    *pp = e->hnext;
    lru_unlink(e);
    fed_key_set_free(e->keys);
    free(e);
    r->n_entries--;
    rt_metric_set(r->m_servers, r->n_entries);
}

static bool busy(const entry *e)
{
    return e->flight || e->n_waiters > 0;
}

/* A new entry for name, evicting the least recently used idle one when full; NULL when
 * every entry is busy (or out of memory). */
static entry *create_locked(fed_keyring *r, const char *name)
{
    if (r->n_entries >= r->s.max_servers) {
        entry *victim = r->lru.lru_prev;
        while (victim != &r->lru && busy(victim)) victim = victim->lru_prev;
        if (victim == &r->lru) return NULL;
        remove_locked(r, victim);
    }
    entry *e = calloc(1, sizeof(*e));
    if (!e) return NULL;
    snprintf(e->name, sizeof(e->name), "%s", name);
    e->loaded = r->db == NULL;
    size_t b = hash_name(name) & (r->n_buckets - 1);
    e->hnext = r->buckets[b];
    r->buckets[b] = e;
    lru_push_front(r, e);
    r->n_entries++;
    rt_metric_set(r->m_servers, r->n_entries);
    return e;
}

/* ---- the two rules ---------------------------------------------------------------------- */

/* May e be fetched now, or did it fail (or succeed) too recently? */
static bool fetch_blocked(const entry *e, int64_t now)
{
    return now >= e->no_fetch_since_ms && now < e->no_fetch_until_ms;
}

/* Does what e knows answer (key_id or any key, min_valid)? Fills r->key when it does. A
 * current key is preferred over an old one for "any key". */
static bool answer_of(const entry *e, bool any_key, const char *key_id, int64_t min_valid,
                      fed_key_result *res)
{
    if (!e->keys) return false;
    const fed_verify_key *best = NULL;
    for (size_t i = 0; i < e->keys->n; i++) {
        const fed_verify_key *k = &e->keys->keys[i];
        if (!any_key && strcmp(k->key_id, key_id) != 0) continue;
        if (k->valid_until_ms < min_valid) continue;
        if (!best || (best->old && !k->old)) best = k;
    }
    if (!best) return false;
    res->status = FED_KEY_FOUND;
    res->key = *best;
    res->error[0] = '\0';
    return true;
}

/* The refusal for a waiter that what we know does not answer (after a fetch, or while
 * fetching is blocked). */
static void refusal_of(const entry *e, bool any_key, const char *key_id, int64_t min_valid,
                       fed_key_result *res)
{
    memset(&res->key, 0, sizeof(res->key));
    if (e->last_fetch_failed) {
        res->status = FED_KEY_E_UNREACHABLE;
        snprintf(res->error, sizeof(res->error), "the keys of %.200s could not be fetched: %.250s",
                 e->name, e->last_error);
        return;
    }
    res->status = FED_KEY_E_UNKNOWN;
    snprintf(res->error, sizeof(res->error),
             "%.200s has no key %.64s valid until %" PRId64, e->name,
             any_key ? "(any)" : key_id, min_valid);
}

/* The refusal's sentence: "<why> (keys of <name>)". */
static void answer_status(waiter *w, int status, const char *why, const char *name)
{
    memset(&w->res, 0, sizeof(w->res));
    w->res.status = status;
    snprintf(w->res.error, sizeof(w->res.error), "%s (keys of %.200s)", why, name);
}

/* ---- PostgreSQL ------------------------------------------------------------------------- */

static const char *const SELECT_KEYS =
    "SELECT key_id, public_key, valid_until_ts, fetched_ts, key_json"
    " FROM federation_server_keys WHERE server_name = $1 ORDER BY fetched_ts DESC LIMIT 64";
_Static_assert(FED_KEYRING_KEYS_PER_SERVER_MAX == 64, "the LIMIT of SELECT_KEYS");

static const char *const UPSERT_KEY =
    "INSERT INTO federation_server_keys"
    " (server_name, key_id, public_key, valid_until_ts, fetched_ts, key_json)"
    " VALUES ($1, $2, $3, $4, $5, $6)"
    " ON CONFLICT (server_name, key_id) DO UPDATE SET public_key = EXCLUDED.public_key,"
    " valid_until_ts = EXCLUDED.valid_until_ts, fetched_ts = EXCLUDED.fetched_ts,"
    " key_json = EXCLUDED.key_json"
    " WHERE federation_server_keys.fetched_ts <= EXCLUDED.fetched_ts";

/* server's rows as a key set (NULL when there are none, or on failure: logged). The rows
 * were validated when they were fetched; they are not checked again. */
static fed_key_set *db_read(fed_keyring *r, const char *server)
{
    PGconn *c = db_acquire(r->db, r->s.db_timeout_ms);
    if (!c) {
        rt_log(ATRIUM_LOG_WARN, LOG_ORIGIN,
               "keys of %s: no database connection within %" PRId64 " ms; fetching instead",
               server, r->s.db_timeout_ms);
        return NULL;
    }
    const char *params[1] = {server};
    PGresult *res = db_query(c, SELECT_KEYS, 1, params);
    fed_key_set *s = NULL;
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        rt_log(ATRIUM_LOG_WARN, LOG_ORIGIN, "keys of %s: reading federation_server_keys: %s",
               server, PQresultErrorMessage(res));
    } else if (PQntuples(res) > 0 && (s = calloc(1, sizeof(*s)))) {
        snprintf(s->server_name, sizeof(s->server_name), "%s", server);
        for (int i = 0; i < PQntuples(res) && s->n < FED_KEYRING_KEYS_PER_SERVER_MAX; i++) {
            fed_verify_key k = {0};
            snprintf(k.key_id, sizeof(k.key_id), "%s", PQgetvalue(res, i, 0));
            const char *text = PQgetvalue(res, i, 4);
            if (rt_b64_decode_exact(PQgetvalue(res, i, 1), k.public_key, sizeof(k.public_key)) <
                0) {
                rt_log(ATRIUM_LOG_WARN, LOG_ORIGIN, "keys of %s: stored key %s is not base64",
                       server, k.key_id);
                continue;
            }
            k.valid_until_ms = strtoll(PQgetvalue(res, i, 2), NULL, 10);
            k.fetched_ms = strtoll(PQgetvalue(res, i, 3), NULL, 10);
            json_t *doc = NULL;
            for (int j = 0; j < i && !doc; j++) /* keys of one document share it */
                if (strcmp(PQgetvalue(res, j, 4), text) == 0)
                    for (size_t m = 0; m < s->n && !doc; m++)
                        if (strcmp(s->keys[m].key_id, PQgetvalue(res, j, 0)) == 0)
                            doc = json_incref(s->docs[m]);
            if (!doc) doc = json_loads(text, 0, NULL);
            if (!doc) {
                rt_log(ATRIUM_LOG_WARN, LOG_ORIGIN, "keys of %s: stored document of %s is not JSON",
                       server, k.key_id);
                continue;
            }
            k.old = !json_object_get(json_object_get(doc, "verify_keys"), k.key_id);
            s->keys[s->n] = k;
            s->docs[s->n++] = doc;
        }
    }
    PQclear(res);
    db_release(r->db, c);
    return s;
}

typedef struct write_row {
    char key_id[FED_KEY_ID_MAX_BYTES];
    char public_key[FED_PUBLIC_KEY_B64_LEN];
    char valid_until[24], fetched[24];
    char *key_json;
} write_row;

typedef struct write_task {
    fed_keyring *ring;
    char server[FED_SERVER_NAME_MAX_BYTES];
    size_t n;
    write_row rows[];
} write_task;

static void write_task_free(write_task *t)
{
    for (size_t i = 0; i < t->n; i++) free(t->rows[i].key_json);
    free(t);
}

/* The rows of a fetched set, serialized now (the set is freed before the write runs). */
static write_task *write_task_new(fed_keyring *r, const fed_key_set *s)
{
    write_task *t = calloc(1, sizeof(*t) + s->n * sizeof(write_row));
    if (!t) return NULL;
    t->ring = r;
    snprintf(t->server, sizeof(t->server), "%s", s->server_name);
    for (size_t i = 0; i < s->n; i++) {
        write_row *w = &t->rows[t->n];
        const fed_verify_key *k = &s->keys[i];
        snprintf(w->key_id, sizeof(w->key_id), "%s", k->key_id);
        cjson_b64(k->public_key, sizeof(k->public_key), false, w->public_key,
                  sizeof(w->public_key));
        snprintf(w->valid_until, sizeof(w->valid_until), "%" PRId64, k->valid_until_ms);
        snprintf(w->fetched, sizeof(w->fetched), "%" PRId64, k->fetched_ms);
        w->key_json = json_dumps(s->docs[i], JSON_COMPACT | JSON_SORT_KEYS);
        if (!w->key_json) {
            write_task_free(t);
            return NULL;
        }
        t->n++;
    }
    return t;
}

static void db_write(fed_keyring *r, const write_task *t)
{
    PGconn *c = db_acquire(r->db, r->s.db_timeout_ms);
    if (!c) {
        rt_log(ATRIUM_LOG_WARN, LOG_ORIGIN,
               "keys of %s: no database connection within %" PRId64 " ms; not stored (they "
               "stay in memory)",
               t->server, r->s.db_timeout_ms);
        return;
    }
    char err[512] = "";
    bool ok = db_exec_quiet(c, "BEGIN", 0, NULL, err, sizeof(err));
    for (size_t i = 0; ok && i < t->n; i++) {
        const write_row *w = &t->rows[i];
        const char *params[6] = {t->server, w->key_id,  w->public_key,
                                 w->valid_until, w->fetched, w->key_json};
        ok = db_exec_quiet(c, UPSERT_KEY, 6, params, err, sizeof(err));
    }
    ok = ok && db_exec_quiet(c, "COMMIT", 0, NULL, err, sizeof(err));
    if (!ok) {
        rt_log(ATRIUM_LOG_WARN, LOG_ORIGIN, "keys of %s: storing in federation_server_keys: %s",
               t->server, err);
        db_rollback(c);
    }
    db_release(r->db, c);
}

static void write_run(void *arg, bool cancelled)
{
    write_task *t = arg;
    fed_keyring *r = t->ring;
    if (!cancelled) db_write(r, t);
    write_task_free(t);
    pthread_mutex_lock(&r->mu);
    r->writes_pending--;
    pthread_cond_broadcast(&r->writes_cv);
    pthread_mutex_unlock(&r->mu);
}

/* Queue the write of s's keys. Unlocked. */
static void queue_write(fed_keyring *r, const fed_key_set *s)
{
    if (!r->db) return;
    write_task *t = write_task_new(r, s);
    if (!t) {
        rt_log(ATRIUM_LOG_WARN, LOG_ORIGIN, "keys of %s: out of memory; not stored",
               s->server_name);
        return;
    }
    pthread_mutex_lock(&r->mu);
    r->writes_pending++;
    pthread_mutex_unlock(&r->mu);
    if (rt_pool_submit(r->pool, write_run, t) < 0) {
        rt_log(ATRIUM_LOG_WARN, LOG_ORIGIN,
               "keys of %s: the %s pool is full or stopping; not stored (they stay in memory)",
               s->server_name, POOL_NAME);
        write_task_free(t);
        pthread_mutex_lock(&r->mu);
        r->writes_pending--;
        pthread_cond_broadcast(&r->writes_cv);
        pthread_mutex_unlock(&r->mu);
    }
}

/* ---- resolution: load, then fetch ------------------------------------------------------- */

static void start_fetch(fed_keyring *r, const char *server)
{
    char name[FED_SERVER_NAME_MAX_BYTES];
    snprintf(name, sizeof(name), "%s", server); /* the hook may answer before it returns */
    if (r->s.fetch(r->s.fetch_arg, r, name) != 0)
        fed_keyring_fetched(r, name, NULL, "the fetch could not be started");
}

typedef struct load_task {
    fed_keyring *ring;
    char server[FED_SERVER_NAME_MAX_BYTES];
} load_task;

enum { ACT_NONE, ACT_LOAD, ACT_FETCH };

static void waiter_done(void *arg);

/* w joins e's flight, leading a new one when none is under way. ACT_NONE (joined),
 * ACT_LOAD or ACT_FETCH (the phase the caller starts after unlocking), or a negative
 * error (w is not linked). Locked. */
static int join_locked(fed_keyring *r, entry *e, waiter *w)
{
    w->fw = (rt_flight_waiter){.done = waiter_done, .arg = w};
    int rc = rt_flight_join(r->flights, e->name, 0, &w->fw, &w->f);
    if (rc < 0) return rc;
    e->n_waiters++;
    r->n_waiters++;
    rt_metric_set(r->m_waiters, r->n_waiters);
    if (rc == RT_FLIGHT_JOINED) return ACT_NONE;
    e->flight = w->f;
    e->fetching = e->loaded;
    return e->loaded ? ACT_FETCH : ACT_LOAD;
}

/* The end of e's current phase, taken off the entry under the lock; NULL when none. */
static rt_flight *take_flight_locked(entry *e)
{
    rt_flight *f = e->flight;
    e->flight = NULL;
    e->fetching = false;
    return f;
}

static void load_run(void *arg, bool cancelled);

/* Start the phase join_locked asked for (unlocked). A read the pool refuses ends the
 * flight at once: its waiters are answered BUSY. */
static void start_action(fed_keyring *r, const char *server, int action)
{
    if (action == ACT_FETCH) start_fetch(r, server);
    if (action != ACT_LOAD) return;
    load_task *t = calloc(1, sizeof(*t));
    if (t) {
        t->ring = r;
        snprintf(t->server, sizeof(t->server), "%s", server);
    }
    if (t && rt_pool_submit(r->pool, load_run, t) == 0) return;
    free(t);
    pthread_mutex_lock(&r->mu);
    rt_flight *f = take_flight_locked(find_locked(r, server));
    pthread_mutex_unlock(&r->mu);
    rt_metric_add(r->m_busy, 1);
    rt_flight_finish(f, END_BUSY, NULL, NULL);
}

/* A phase of w's flight ended: w is answered by what is known now, refused, or - after
 * the read, when fetching is allowed - joins the fetch (the first to do so starts it).
 * Called by rt_flight_finish, unlocked. */
static void waiter_done(void *arg)
{
    waiter *w = arg;
    fed_keyring *r = w->ring;
    int end = 0;
    rt_flight_ended(w->f, &end, NULL);
    rt_flight_unref(w->f);
    w->f = NULL;
    char name[FED_SERVER_NAME_MAX_BYTES];
    snprintf(name, sizeof(name), "%s", w->server); /* w may be answered and freed below */
    int action = -1;
    pthread_mutex_lock(&r->mu);
    entry *e = find_locked(r, w->server); /* kept: busy while it has waiters */
    RT_ASSERT(e && e->n_waiters > 0, "keyring entry %s lost under a waiter", w->server);
    e->n_waiters--;
    r->n_waiters--;
    if (end == END_STOPPED || r->stopped) {
        answer_status(w, FED_KEY_E_STOPPED, "the key ring is stopping", e->name);
    } else if (end == END_BUSY) {
        answer_status(w, FED_KEY_E_BUSY, "the key ring's pool is full", e->name);
    } else if (!answer_of(e, w->any_key, w->key_id, w->min_valid_ms, &w->res)) {
        if (end == END_LOADED && !fetch_blocked(e, now_ms(r)))
            action = join_locked(r, e, w); /* on to the fetch */
        if (action < 0) refusal_of(e, w->any_key, w->key_id, w->min_valid_ms, &w->res);
    }
    rt_metric_set(r->m_waiters, r->n_waiters);
    pthread_mutex_unlock(&r->mu);
    if (action >= 0) { /* it waits for the fetch now */
        start_action(r, name, action);
        return;
    }
    w->cb(w->arg, &w->res);
    free(w);
}

static void load_run(void *arg, bool cancelled)
{
    load_task *t = arg;
    fed_keyring *r = t->ring;
    fed_key_set *rows = cancelled ? NULL : db_read(r, t->server);
    pthread_mutex_lock(&r->mu);
    entry *e = find_locked(r, t->server);
    RT_ASSERT(e && e->flight && !e->fetching, "keyring entry %s lost while loading", t->server);
    e->loaded = true;
    if (rows && !e->keys) {
        e->keys = rows;
        rows = NULL;
    } else if (rows) {
        fed_key_set_merge(e->keys, rows);
    }
    int end = r->stopped || cancelled ? END_STOPPED : END_LOADED;
    rt_flight *f = take_flight_locked(e);
    pthread_mutex_unlock(&r->mu);
    fed_key_set_free(rows);
    rt_flight_finish(f, end, NULL, NULL);
    free(t);
}

void fed_keyring_notary_refetch(fed_keyring *r, const char *server_name, const char *key_id,
                                int64_t minimum_valid_until_ms)
{
    fed_key_result unused;
    pthread_mutex_lock(&r->mu);
    entry *e = find_locked(r, server_name);
    int64_t now = now_ms(r);
    if (e && e->loaded && e->keys && !e->last_fetch_failed &&
        now >= e->no_fetch_since_ms + FED_KEYRING_NOTARY_REFETCH_MIN_MS &&
        !answer_of(e, key_id == NULL, key_id, minimum_valid_until_ms, &unused))
        e->no_fetch_until_ms = now;
    pthread_mutex_unlock(&r->mu);
}

/* Fill an immediate refusal (busy, stopped): "<why> (keys of <name>)", like answer_status. */
static void answer_now(fed_key_result *out, int status, const char *why, const char *name)
{
    memset(out, 0, sizeof(*out));
    out->status = status;
    snprintf(out->error, sizeof(out->error), "%s (keys of %.200s)", why, name);
}

int fed_keyring_lookup(fed_keyring *r, const char *server_name, const char *key_id,
                       int64_t minimum_valid_until_ms, fed_key_result *now_out,
                       fed_keyring_cb cb, void *arg)
{
    if (!name_ok(server_name) || (key_id && strlen(key_id) >= FED_KEY_ID_MAX_BYTES)) {
        memset(now_out, 0, sizeof(*now_out));
        now_out->status = FED_KEY_E_UNKNOWN;
        snprintf(now_out->error, sizeof(now_out->error),
                 "not a server name or key ID that can be looked up");
        return FED_KEYRING_ANSWERED;
    }
    bool any = key_id == NULL;
    pthread_mutex_lock(&r->mu);
    if (r->stopped) {
        pthread_mutex_unlock(&r->mu);
        answer_now(now_out, FED_KEY_E_STOPPED, "the key ring is stopping",
                   server_name);
        return FED_KEYRING_ANSWERED;
    }
    entry *e = find_locked(r, server_name);
    if (e) {
        lru_unlink(e);
        lru_push_front(r, e);
        if (answer_of(e, any, key_id, minimum_valid_until_ms, now_out)) {
            pthread_mutex_unlock(&r->mu);
            rt_metric_add(r->m_hit, 1);
            return FED_KEYRING_ANSWERED;
        }
        if (!e->flight && e->loaded && fetch_blocked(e, now_ms(r))) {
            refusal_of(e, any, key_id, minimum_valid_until_ms, now_out);
            pthread_mutex_unlock(&r->mu);
            rt_metric_add(r->m_negative, 1);
            return FED_KEYRING_ANSWERED;
        }
    }
    waiter *w = NULL;
    int action = -1;
    if (r->n_waiters < r->s.max_waiters && (e || (e = create_locked(r, server_name))) &&
        (w = calloc(1, sizeof(*w)))) {
        w->ring = r;
        snprintf(w->server, sizeof(w->server), "%s", e->name);
        w->cb = cb;
        w->arg = arg;
        w->any_key = any;
        if (!any) snprintf(w->key_id, sizeof(w->key_id), "%s", key_id);
        w->min_valid_ms = minimum_valid_until_ms;
        action = join_locked(r, e, w);
    }
    pthread_mutex_unlock(&r->mu);
    if (action < 0) {
        free(w);
        rt_metric_add(r->m_busy, 1);
        answer_now(now_out, FED_KEY_E_BUSY, "too many key look-ups or servers in flight",
                   server_name);
        return FED_KEYRING_ANSWERED;
    }
    rt_metric_add(r->m_miss, 1);
    char name[FED_SERVER_NAME_MAX_BYTES];
    snprintf(name, sizeof(name), "%s", server_name);
    start_action(r, name, action);
    return FED_KEYRING_PENDING;
}

void fed_keyring_fetched(fed_keyring *r, const char *server_name, fed_key_set *keys,
                         const char *error)
{
    char why[FED_KEYRING_ERROR_MAX_BYTES];
    if (keys && strcmp(keys->server_name, server_name) != 0) {
        snprintf(why, sizeof(why), "the fetch hook answered with the keys of %.200s",
                 keys->server_name);
        rt_log(ATRIUM_LOG_ERROR, LOG_ORIGIN, "keys of %s: %s", server_name, why);
        fed_key_set_free(keys);
        keys = NULL;
        error = why;
    }
    rt_flight *ended = NULL;
    bool store = false;
    pthread_mutex_lock(&r->mu);
    entry *e = r->stopped ? NULL : find_locked(r, server_name);
    if (!e && !r->stopped && keys) e = create_locked(r, server_name); /* unasked: keep */
    if (e) {
        int64_t now = now_ms(r);
        e->no_fetch_since_ms = now;
        if (keys) {
            if (!e->keys) {
                e->keys = calloc(1, sizeof(*e->keys));
                if (e->keys) snprintf(e->keys->server_name, sizeof(e->keys->server_name), "%s",
                                      server_name);
            }
            if (e->keys) fed_key_set_merge(e->keys, keys);
            e->last_fetch_failed = false;
            e->last_error[0] = '\0';
            e->no_fetch_until_ms = now + r->s.refetch_min_interval_ms;
            store = true;
        } else {
            e->last_fetch_failed = true;
            snprintf(e->last_error, sizeof(e->last_error), "%s",
                     error && *error ? error : "unknown error");
            e->no_fetch_until_ms = now + r->s.negative_ttl_ms;
        }
        /* While the rows are being read, the answer only adds to what they bring. */
        if (e->fetching) ended = take_flight_locked(e);
    }
    pthread_mutex_unlock(&r->mu);
    rt_metric_add(keys ? r->m_fetch_ok : r->m_fetch_failed, 1);
    if (!keys && e)
        rt_log(ATRIUM_LOG_INFO, LOG_ORIGIN,
               "keys of %s could not be fetched (%s); not retried for %" PRId64 " ms",
               server_name, error && *error ? error : "unknown error", r->s.negative_ttl_ms);
    if (ended) rt_flight_finish(ended, END_FETCHED, NULL, NULL);
    if (store) queue_write(r, keys);
    fed_key_set_free(keys);
}

/* ---- life cycle ------------------------------------------------------------------------- */

fed_keyring *fed_keyring_new(const fed_keyring_settings *s, db_pool *db, rt_metrics *metrics)
{
    if (!s->fetch) {
        rt_log(ATRIUM_LOG_ERROR, LOG_ORIGIN, "key ring: no fetch hook");
        return NULL;
    }
    fed_keyring *r = calloc(1, sizeof(*r));
    if (!r) return NULL;
    r->s = *s;
#define DEFAULT(field, value)                                                           \
    if (r->s.field <= 0) r->s.field = (value)
    DEFAULT(max_servers, FED_KEYRING_DEFAULT_MAX_SERVERS);
    DEFAULT(negative_ttl_ms, FED_KEYRING_DEFAULT_NEGATIVE_TTL_MS);
    DEFAULT(refetch_min_interval_ms, FED_KEYRING_DEFAULT_REFETCH_MIN_INTERVAL_MS);
    DEFAULT(max_waiters, FED_KEYRING_DEFAULT_MAX_WAITERS);
    DEFAULT(queue_depth, FED_KEYRING_DEFAULT_QUEUE_DEPTH);
    DEFAULT(db_timeout_ms, FED_KEYRING_DEFAULT_DB_TIMEOUT_MS);
#undef DEFAULT
    r->db = db;
    r->n_buckets = 1;
    while (r->n_buckets < (size_t)r->s.max_servers * HASH_LOAD_FACTOR) r->n_buckets <<= 1;
    r->buckets = calloc(r->n_buckets, sizeof(entry *));
    r->pool = rt_pool_new(POOL_NAME, FED_KEYRING_POOL_THREADS, r->s.queue_depth, metrics);
    r->flights = rt_flights_new(POOL_NAME, r->s.max_servers, r->s.max_waiters, metrics);
    if (!r->buckets || !r->pool || !r->flights) {
        if (r->pool) rt_pool_free(r->pool);
        rt_flights_free(r->flights);
        free(r->buckets);
        free(r);
        return NULL;
    }
    r->lru.lru_next = r->lru.lru_prev = &r->lru;
    pthread_mutex_init(&r->mu, NULL);
    rt_cond_init(&r->writes_cv);
    static const char *const HELP_LOOKUPS = "Remote server key look-ups by how they were answered";
    r->m_hit = rt_metric_counter(metrics, "atrium_federation_key_lookups_total",
                                 "result=\"hit\"", HELP_LOOKUPS);
    r->m_miss = rt_metric_counter(metrics, "atrium_federation_key_lookups_total",
                                  "result=\"miss\"", HELP_LOOKUPS);
    r->m_negative = rt_metric_counter(metrics, "atrium_federation_key_lookups_total",
                                      "result=\"negative\"", HELP_LOOKUPS);
    r->m_busy = rt_metric_counter(metrics, "atrium_federation_key_lookups_total",
                                  "result=\"busy\"", HELP_LOOKUPS);
    static const char *const HELP_FETCHES = "Remote server key fetches by outcome";
    r->m_fetch_ok = rt_metric_counter(metrics, "atrium_federation_key_fetches_total",
                                      "outcome=\"ok\"", HELP_FETCHES);
    r->m_fetch_failed = rt_metric_counter(metrics, "atrium_federation_key_fetches_total",
                                          "outcome=\"failed\"", HELP_FETCHES);
    r->m_servers = rt_metric_gauge(metrics, "atrium_federation_key_cache_servers", NULL,
                                   "Servers whose keys are held in memory");
    r->m_waiters = rt_metric_gauge(metrics, "atrium_federation_key_waiters", NULL,
                                   "Key look-ups waiting for a read or a fetch");
    return r;
}

int fed_keyring_start(fed_keyring *r)
{
    return rt_pool_start(r->pool);
}

void fed_keyring_stop(fed_keyring *r)
{
    pthread_mutex_lock(&r->mu);
    bool already = r->stopped;
    r->stopped = true;
    pthread_mutex_unlock(&r->mu);
    if (already) return;
    rt_pool_stop(r->pool);
    rt_pool_join(r->pool); /* reads still queued ran cancelled: their flights ended */
    for (;;) { /* the fetches still out: their waiters are answered STOPPED */
        rt_flight *f = NULL;
        pthread_mutex_lock(&r->mu);
        for (entry *e = r->lru.lru_next; e != &r->lru && !f; e = e->lru_next)
            if (e->flight) f = take_flight_locked(e);
        pthread_mutex_unlock(&r->mu);
        if (!f) break;
        rt_flight_finish(f, END_STOPPED, NULL, NULL);
    }
}

void fed_keyring_free(fed_keyring *r)
{
    if (!r) return;
    while (r->lru.lru_next != &r->lru) remove_locked(r, r->lru.lru_next);
    rt_pool_free(r->pool);
    rt_flights_free(r->flights);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->writes_cv);
    free(r->buckets);
    free(r);
}

int fed_keyring_flush(fed_keyring *r, int64_t timeout_ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t ns = (int64_t)ts.tv_nsec + (timeout_ms % 1000) * 1000000;
    ts.tv_sec += (time_t)(timeout_ms / 1000 + ns / 1000000000);
    ts.tv_nsec = (long)(ns % 1000000000);
    int rc = 0;
    pthread_mutex_lock(&r->mu);
    while (r->writes_pending > 0 && rc == 0)
        rc = pthread_cond_timedwait(&r->writes_cv, &r->mu, &ts);
    bool drained = r->writes_pending == 0;
    pthread_mutex_unlock(&r->mu);
    return drained ? 0 : ATRIUM_E_TIMEOUT;
}

json_t *fed_keyring_cached_documents(fed_keyring *r, const char *server_name,
                                     const char *const *key_ids, size_t n_key_ids)
{
    json_t *out = json_array();
    if (!out) return NULL;
    const json_t *seen[FED_KEYRING_KEYS_PER_SERVER_MAX];
    size_t n_seen = 0;
    bool ok = true;
    pthread_mutex_lock(&r->mu);
    entry *e = name_ok(server_name) ? find_locked(r, server_name) : NULL;
    for (size_t i = 0; ok && e && e->keys && i < e->keys->n; i++) {
        bool wanted = n_key_ids == 0;
        for (size_t j = 0; !wanted && j < n_key_ids; j++)
            wanted = strcmp(e->keys->keys[i].key_id, key_ids[j]) == 0;
        const json_t *doc = e->keys->docs[i];
        bool dup = false;
        for (size_t j = 0; !dup && j < n_seen; j++) dup = seen[j] == doc;
        if (!wanted || dup) continue;
        seen[n_seen++] = doc;
        ok = json_array_append_new(out, json_deep_copy(doc)) == 0;
    }
    pthread_mutex_unlock(&r->mu);
    if (!ok) {
        json_decref(out);
        return NULL;
    }
    return out;
}
