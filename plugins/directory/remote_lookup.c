/*
 * plugins/directory/remote_lookup.c - look-ups on other servers: publicRooms?server= (GET and
 * POST) and aliases of other servers (GET /directory/room/#a:other), asked with
 * /_matrix/federation/v1/publicRooms and /_matrix/federation/v1/query/directory.
 *
 * The decision this file owns is ADR-0079 (docs/adr/0079-outbound-budget.md), kept
 * exactly: every look-up that has to ask a peer first takes an outbound-budget slot
 * (host->outbound_acquire: half the request pool in all, one per client key), and over
 * either cap it is answered 429 at once with retry_after_ms and Retry-After, never queued.
 * While the peer thinks, the request waits parked (req_wait), holding no request-pool
 * thread but still its slot, until the federation client's on_done wakes it. A request
 * that needs several (the new aliases of other servers an m.room.canonical_alias event
 * names) makes them one after another under its one slot.
 *
 * Look-ups are shared: one per key (kind, server, limit, since, filter) at a time, the
 * host's single flight (ABI 1.8, flight_join; docs/adr/0029-single-flight.md). Requests
 * arriving while one is in flight join it, parked, instead of asking again (each within
 * its own deadline: past it, 504, and the look-up goes on for the others); a successful
 * answer is kept in the cache table and reused for `cache_ms` (30 s) by requests that then
 * need no slot at all. A look-up ends by `timeout_ms` (20 s, well under a client's own
 * timeout): 504, and a peer's refusal or a broken answer is 502, both with no-store; only
 * answers the peer gave with 200 are kept. An entry (the outcome) lives while the cache
 * table, its flight or a request refers to it (refs).
 */
#include <inttypes.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "directory.h"

#define h dir_host

#define DIR_RETRY_AFTER_MS 1000        /* what a refused look-up is told to wait */
#define DIR_WAKE_SLACK_MS 2000         /* a parked request's deadline past its look-up's */
#define DIR_CACHE_MAX_ENTRIES 1024     /* answered look-ups kept at most */
#define DIR_MAX_ANSWER_BYTES (4 << 20) /* a peer's answer at most */
#define DIR_MAX_LOOKUPS_PER_REQ 8      /* look-ups one request makes at most */
#define DIR_MAX_IN_FLIGHT 1024         /* distinct look-ups in flight at once */
#define DIR_MAX_JOINED 4096            /* requests waiting on a look-up another started */

dir_remote_settings dir_remote = {.timeout_ms = 20000, .cache_ms = 30000};

enum lookup_kind { LOOKUP_ROOMS = 0, LOOKUP_ALIAS = 1 };

/* A look-up and, once its flight ends, its outcome. */
typedef struct lookup {
    struct lookup *next; /* in the cache table while `listed` */
    char *key;
    int kind;
    bool listed;
    int refs;              /* the table's (while listed), its flight's, each request's hold */
    atrium_flight *flight; /* the one look-up of its key in flight */
    int64_t deadline_ms;   /* of the federation request */
    int64_t expires_ms;    /* reused until then (only 200 answers) */
    int status;            /* the status to answer */
    json_t *answer;        /* the body to answer */
} lookup;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static lookup *table; /* answered look-ups still fresh: the cache */
static int n_table;
static atrium_flights *flights;

static atrium_metric *m_ok, *m_refused, *m_timeout, *m_failed, *m_limited, *m_hits, *m_shared,
    *m_in_flight;

int dir_remote_init(void)
{
    static const char *const NAME = "atrium_directory_remote_lookups_total";
    static const char *const HELP = "Look-ups on other servers by how they ended.";
    m_ok = h->metric_counter(dir_self, NAME, "outcome=\"ok\"", HELP);
    m_refused = h->metric_counter(dir_self, NAME, "outcome=\"refused\"", HELP);
    m_timeout = h->metric_counter(dir_self, NAME, "outcome=\"timeout\"", HELP);
    m_failed = h->metric_counter(dir_self, NAME, "outcome=\"failed\"", HELP);
    m_limited = h->metric_counter(dir_self, "atrium_directory_remote_limited_total", NULL,
                                  "Look-ups refused with 429 by the outbound budget.");
    m_hits = h->metric_counter(dir_self, "atrium_directory_remote_cache_hits_total", NULL,
                               "Look-ups answered from a cached answer.");
    m_shared = h->metric_counter(dir_self, "atrium_directory_remote_shared_total", NULL,
                                 "Look-ups that joined an identical one in flight.");
    m_in_flight = h->metric_gauge(dir_self, "atrium_directory_remote_in_flight", NULL,
                                  "Look-ups waiting for another server now.");
    flights = h->flights_create(dir_self, "remote_lookups", DIR_MAX_IN_FLIGHT, DIR_MAX_JOINED);
    return m_ok && m_refused && m_timeout && m_failed && m_limited && m_hits && m_shared &&
                   m_in_flight && flights
               ? 0
               : ATRIUM_E_NOMEM;
}

/* Drop one reference; the caller holds the lock. */
static void unref_locked(lookup *l)
{
    if (--l->refs > 0) return;
    json_decref(l->answer);
    free(l->key);
    free(l);
}

static void unlist_locked(lookup *l)
{
    if (!l->listed) return;
    for (lookup **p = &table; *p; p = &(*p)->next) {
        if (*p == l) {
            *p = l->next;
            break;
        }
    }
    l->listed = false;
    n_table--;
    unref_locked(l);
}

/* A request's hold on its entry, released when the request ends. */
static void release_hold(void *arg)
{
    pthread_mutex_lock(&lock);
    unref_locked(arg);
    pthread_mutex_unlock(&lock);
}

/* The cached entry for key that is still fresh; expired ones are dropped. */
static lookup *find_locked(const char *key, int64_t now)
{
    for (lookup *l = table, *next; l; l = next) {
        next = l->next;
        if (l->expires_ms <= now) {
            unlist_locked(l);
            continue;
        }
        if (strcmp(l->key, key) == 0) return l;
    }
    return NULL;
}

/* Set the outcome, keep a 200 in the cache, and end the flight: every request waiting on
 * it is woken and reads the outcome; the federation request's reference becomes the
 * flight's. Any thread. */
static void finish(lookup *l, int status, json_t *answer, atrium_metric *outcome)
{
    pthread_mutex_lock(&lock);
    l->status = status;
    l->answer = answer;
    int64_t now = h->now_ms();
    l->expires_ms = now + dir_remote.cache_ms;
    lookup *old = find_locked(l->key, now); /* a fresher look-up replaces the cached one */
    if (old) unlist_locked(old);
    if (status == 200 && dir_remote.cache_ms > 0 && n_table < DIR_CACHE_MAX_ENTRIES) {
        l->next = table;
        table = l;
        l->listed = true;
        l->refs++;
        n_table++;
    }
    pthread_mutex_unlock(&lock);
    h->metric_add(outcome, 1);
    h->metric_add(m_in_flight, -1);
    h->flight_finish(l->flight, 0, l, release_hold);
}

static json_t *error_body(const char *errcode, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static json_t *error_body(const char *errcode, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return json_pack("{s:s, s:s}", "errcode", errcode, "error", msg);
}

/* on_done of the federation request (an internal thread: quick, no blocking). */
static void on_answer(void *arg, const atrium_fed_response *res)
{
    lookup *l = arg;
    const char *server = res->destination ? res->destination : "the other server";
    if (res->outcome == ATRIUM_FED_E_TIMEOUT) {
        finish(l, 504, error_body("M_UNKNOWN", "%s did not answer in time", server),
               m_timeout);
        return;
    }
    if (res->outcome != ATRIUM_FED_OK) {
        finish(l, 502, error_body("M_UNKNOWN", "Could not ask %s: %s", server, res->error ? res->error : "failed"),
               m_failed);
        return;
    }
    const json_t *j = res->json;
    if (res->status == 200 && l->kind == LOOKUP_ROOMS && json_is_array(json_object_get(j, "chunk"))) {
        finish(l, 200, json_deep_copy(j), m_ok);
        return;
    }
    const char *room_id = json_string_value(json_object_get(j, "room_id"));
    if (res->status == 200 && l->kind == LOOKUP_ALIAS && room_id && room_id[0] == '!' &&
        strlen(room_id) <= ATRIUM_ROOM_ID_MAX_BYTES) {
        json_t *servers = json_object_get(j, "servers");
        json_t *a = json_is_array(servers)
                        ? json_pack("{s:s, s:O}", "room_id", room_id, "servers", servers)
                        : json_pack("{s:s, s:[s]}", "room_id", room_id, "servers", server);
        finish(l, 200, a, m_ok);
        return;
    }
    if (res->status == 404 && l->kind == LOOKUP_ALIAS) {
        finish(l, 404, error_body("M_NOT_FOUND", "%s has no such room alias", server),
               m_refused);
        return;
    }
    const char *errcode = json_string_value(json_object_get(j, "errcode"));
    char why[64];
    snprintf(why, sizeof(why), "HTTP %d %.40s", res->status, errcode ? errcode : "");
    finish(l, 502, error_body("M_UNKNOWN", "%s refused the look-up (%s)", server, why),
           res->status == 200 ? m_failed : m_refused);
}

/* The federation request's end: its outcome (its reference goes to the flight). */
static void on_done(void *arg, const atrium_fed_response *res)
{
    on_answer(arg, res);
}

/* Answer from a finished entry (a copy of its answer; the entry may be shared). */
static int answer_from(atrium_req *req, lookup *l)
{
    if (!l) return h->respond_error(req, 500, "M_UNKNOWN", "Out of memory");
    pthread_mutex_lock(&lock);
    int status = l->status;
    json_t *body = json_deep_copy(l->answer);
    pthread_mutex_unlock(&lock);
    if (!body) return h->respond_error(req, 500, "M_UNKNOWN", "Out of memory");
    if (status == 200) return h->respond_json(req, 200, body);
    const char *errcode = json_string_value(json_object_get(body, "errcode"));
    const char *error = json_string_value(json_object_get(body, "error"));
    int rc = h->respond_error(req, status, errcode ? errcode : "M_UNKNOWN", "%s",
                              error ? error : "The look-up failed");
    json_decref(body);
    return rc;
}

/* The percent-encoding of s for a query string, in request memory. */
static const char *url_encode(atrium_req *req, const char *s)
{
    size_t n = strlen(s);
    char *out = h->req_alloc(req, 3 * n + 1), *p = out;
    if (!out) return NULL;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
            c == '-' || c == '_' || c == '.' || c == '~')
            *p++ = (char)c;
        else
            p += sprintf(p, "%%%02X", c);
    }
    *p = '\0';
    return out;
}

/* One look-up of a request: the entry it was answered from, or the flight it waits on
 * (whose outcome, once read, stays valid while the request lives: its flight reference). */
typedef struct req_lookup {
    const char *key; /* request memory */
    lookup *l;
    atrium_flight *f;
} req_lookup;

/* What a request keeps across its runs (req_state): its look-ups in the order it made
 * them (a caller may resolve several aliases, one after another), and whether it holds
 * its outbound slot. In request memory. */
typedef struct req_lookups {
    req_lookup e[DIR_MAX_LOOKUPS_PER_REQ];
    int n;
    bool slot;
} req_lookups;

/* What to ask the peer for one look-up. */
typedef struct ask {
    int kind;
    const char *server, *method, *uri, *key;
    json_t *body;    /* POST content (borrowed), or NULL */
    json_t **result; /* where a 200 answer goes for the caller, or NULL: to the client */
} ask;

/* The outcome of a finished entry, to whom the look-up is for: a 200 answer to the caller
 * (a copy in *a->result: ATRIUM_DIRECTORY_RESOLVED), anything else to the client. */
static int deliver(atrium_req *req, lookup *l, const ask *a)
{
    if (a->result && l) {
        pthread_mutex_lock(&lock);
        bool ok = l->status == 200;
        json_t *copy = ok ? json_deep_copy(l->answer) : NULL;
        pthread_mutex_unlock(&lock);
        if (ok && !copy) return h->respond_error(req, 500, "M_UNKNOWN", "Out of memory");
        if (copy) {
            *a->result = copy;
            return ATRIUM_DIRECTORY_RESOLVED;
        }
    }
    return answer_from(req, l);
}

/* Deliver finished entry l (the caller holds a reference) and keep it in the request's
 * state, so a later run of the handler (after a handoff, when a caller goes on: a join)
 * gets the same answer even once the cache dropped it; the reference goes with the
 * request. When the state cannot take it, the reference is dropped now. */
static int deliver_kept(atrium_req *req, req_lookups **mine, lookup *l, const ask *a)
{
    int rc = deliver(req, l, a);
    if (!*mine && (*mine = h->req_alloc(req, sizeof(**mine)))) h->req_set_state(req, *mine);
    if (*mine && (*mine)->n < DIR_MAX_LOOKUPS_PER_REQ) {
        (*mine)->e[(*mine)->n++] = (req_lookup){.key = a->key, .l = l};
        h->req_hold(req, release_hold, l);
    } else {
        release_hold(l);
    }
    return rc;
}

/* A run after waiting on e's flight (or after its outcome was read): the outcome. */
static int look_up_again(atrium_req *req, req_lookup *e, const ask *a)
{
    if (!e->l) {
        void *value = NULL;
        int rc = h->flight_result(req, e->f, NULL, &value);
        if (rc == ATRIUM_E_STOPPED)
            return h->respond_error(req, 503, "M_UNKNOWN", "The server is stopping");
        if (rc < 0) /* its own deadline passed: the look-up goes on for the others */
            return h->respond_error(req, 504, "M_UNKNOWN", "%s did not answer in time",
                                    a->server);
        if (!value) return h->respond_error(req, 500, "M_UNKNOWN", "Out of memory");
        e->l = value;
    }
    return deliver(req, e->l, a);
}

/* This request leads the look-up of flight f: ask the peer. ATRIUM_PARKED. */
static int ask_peer(const ask *a, atrium_flight *f, int64_t now)
{
    lookup *l = calloc(1, sizeof(*l));
    char *key = strdup(a->key);
    if (!l || !key) {
        free(l), free(key);
        h->flight_finish(f, 0, NULL, NULL); /* everyone who joined answers 500 */
        return ATRIUM_PARKED;
    }
    /* One reference: the federation request's, then its flight's (finish). */
    *l = (lookup){.key = key, .kind = a->kind, .refs = 1, .flight = f,
                  .deadline_ms = now + dir_remote.timeout_ms};
    h->metric_add(m_in_flight, 1);
    atrium_fed_request fr = {.size = sizeof(fr), .method = a->method, .destination = a->server,
                             .uri = a->uri, .body = a->body, .deadline_ms = l->deadline_ms,
                             .max_body_bytes = DIR_MAX_ANSWER_BYTES,
                             .flags = ATRIUM_FED_JSON | ATRIUM_FED_IGNORE_BACKOFF,
                             .on_done = on_done, .arg = l};
    int rc = h->fed_request(&fr);
    if (rc < 0)
        finish(l, rc == ATRIUM_E_LIMIT ? 503 : 502,
               error_body("M_UNKNOWN", "Could not ask %s%s", a->server,
                          rc == ATRIUM_E_LIMIT ? ": too many outbound requests" : ""),
               m_failed);
    return ATRIUM_PARKED;
}

/* The whole look-up; runs on every run of the handler (the first, and after parking). */
static int look_up(atrium_req *req, const ask *a)
{
    req_lookups *mine = h->req_state(req);
    for (int i = 0; mine && i < mine->n; i++)
        if (strcmp(mine->e[i].key, a->key) == 0) return look_up_again(req, &mine->e[i], a);
    int64_t now = h->now_ms();
    pthread_mutex_lock(&lock);
    lookup *l = find_locked(a->key, now);
    if (l) l->refs++;
    pthread_mutex_unlock(&lock);
    if (l) { /* cached: no peer is asked, so no slot is needed */
        h->metric_add(m_hits, 1);
        return deliver_kept(req, &mine, l, a);
    }
    if (!mine) {
        mine = h->req_alloc(req, sizeof(*mine));
        if (!mine) return h->respond_error(req, 500, "M_UNKNOWN", "Out of memory");
        h->req_set_state(req, mine);
    }
    if (mine->n == DIR_MAX_LOOKUPS_PER_REQ)
        return h->respond_error(req, 400, "M_INVALID_PARAM", "More than %d look-ups on other "
                                "servers in one request", DIR_MAX_LOOKUPS_PER_REQ);
    /* One slot per request (its look-ups run one after another), held until it ends. */
    if (!mine->slot && h->outbound_acquire(req) < 0) {
        h->metric_add(m_limited, 1);
        return h->respond_limited(req, DIR_RETRY_AFTER_MS,
                                  "Too many look-ups on other servers at once; retry");
    }
    mine->slot = true;
    atrium_flight *f = NULL;
    int rc = h->flight_join(req, flights, a->key, now + dir_remote.timeout_ms + DIR_WAKE_SLACK_MS,
                            0, &f);
    if (rc == ATRIUM_E_STOPPED)
        return h->respond_error(req, 503, "M_UNKNOWN", "The server is stopping");
    if (rc == ATRIUM_E_LIMIT) {
        h->metric_add(m_limited, 1);
        return h->respond_limited(req, DIR_RETRY_AFTER_MS,
                                  "Too many look-ups on other servers at once; retry");
    }
    if (rc < 0) return h->respond_error(req, 500, "M_UNKNOWN", "Out of memory");
    mine->e[mine->n++] = (req_lookup){.key = a->key, .f = f};
    if (rc == ATRIUM_FLIGHT_LEAD) return ask_peer(a, f, now);
    h->metric_add(m_shared, 1);
    return ATRIUM_PARKED;
}

int dir_remote_rooms(atrium_req *req, const char *server, long limit, const char *since,
                     const json_t *filter)
{
    char lim[24] = "";
    if (limit >= 0) snprintf(lim, sizeof(lim), "%ld", limit);
    char *f = filter ? json_dumps(filter, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    size_t klen = strlen(server) + strlen(lim) + (since ? strlen(since) : 0) + (f ? strlen(f) : 0) + 16;
    char *k = h->req_alloc(req, klen);
    if (k) snprintf(k, klen, "r|%s|%s|%s|%s", server, lim, since ? since : "", f ? f : "-");
    free(f);
    ask a = {.kind = LOOKUP_ROOMS, .server = server, .key = k};
    json_t *body = NULL;
    if (filter) {
        a.method = "POST";
        a.uri = "/_matrix/federation/v1/publicRooms";
        body = json_pack("{s:O}", "filter", (json_t *)filter);
        if (body && limit >= 0) json_object_set_new(body, "limit", json_integer(limit));
        if (body && since) json_object_set_new(body, "since", json_string(since));
        a.body = body;
    } else {
        a.method = "GET";
        const char *s = since ? url_encode(req, since) : NULL;
        size_t ulen = 64 + strlen(lim) + (s ? strlen(s) : 0);
        char *uri = h->req_alloc(req, ulen);
        if (uri)
            snprintf(uri, ulen, "/_matrix/federation/v1/publicRooms%s%s%s%s%s",
                     lim[0] || s ? "?" : "", lim[0] ? "limit=" : "", lim,
                     s ? (lim[0] ? "&since=" : "since=") : "", s ? s : "");
        a.uri = uri;
    }
    int rc = !a.key || !a.uri || (filter && !body)
                 ? h->respond_error(req, 500, "M_UNKNOWN", "Out of memory")
                 : look_up(req, &a);
    json_decref(body);
    return rc;
}

/* The alias look-up, for the client (result NULL) or for the caller. */
static int alias_look_up(atrium_req *req, const char *alias, const char *server, json_t **result)
{
    const char *enc = url_encode(req, alias);
    size_t ulen = enc ? strlen(enc) + 64 : 0, klen = strlen(alias) + 8;
    char *uri = enc ? h->req_alloc(req, ulen) : NULL, *key = h->req_alloc(req, klen);
    if (!uri || !key) return h->respond_error(req, 500, "M_UNKNOWN", "Out of memory");
    snprintf(uri, ulen, "/_matrix/federation/v1/query/directory?room_alias=%s", enc);
    snprintf(key, klen, "a|%s", alias);
    ask a = {.kind = LOOKUP_ALIAS, .server = server, .method = "GET", .uri = uri, .key = key,
             .result = result};
    return look_up(req, &a);
}

int dir_remote_alias(atrium_req *req, const char *alias, const char *server)
{
    return alias_look_up(req, alias, server, NULL);
}

int dir_remote_alias_resolve(atrium_req *req, const char *alias,
                             char room_id[ATRIUM_ROOM_ID_MAX_BYTES + 1], json_t **servers)
{
    *servers = NULL;
    const char *server = NULL;
    if (!dir_alias_ok(alias, &server))
        return h->respond_error(req, 400, "M_INVALID_PARAM", "Not a room alias");
    json_t *answer = NULL;
    int rc = alias_look_up(req, alias, server, &answer);
    if (rc != ATRIUM_DIRECTORY_RESOLVED) return rc;
    /* on_answer kept only answers with a room ID and a list of servers. */
    snprintf(room_id, ATRIUM_ROOM_ID_MAX_BYTES + 1, "%s",
             json_string_value(json_object_get(answer, "room_id")));
    *servers = json_incref(json_object_get(answer, "servers"));
    json_decref(answer);
    return ATRIUM_DIRECTORY_RESOLVED;
}
