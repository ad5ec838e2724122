/*
 * core/federation/transport/fed_resolve_internal.h - what the resolver's three files share: the
 * bounded caches (fed_resolve_cache.c), the discovery record and its references
 * (fed_resolve.c, with the thread and the public functions) and the spec's steps
 * (fed_resolve_steps.c).
 *
 * Internal to core/federation/fed_resolve*.c. Everything here belongs to the resolver's
 * thread except fed_resolve_post (any thread) and the fields marked "under mu".
 */
#ifndef ATRIUM_CORE_FED_RESOLVE_INTERNAL_H
#define ATRIUM_CORE_FED_RESOLVE_INTERNAL_H

#include <ares.h>
#include <pthread.h>

#include "core/federation/transport/fed_resolve.h"
#include "core/runtime/flight.h"
#include "core/runtime/keytab.h"

#define FED_RESOLVE_DEFAULT_TIMEOUT_MS 15000
#define FED_RESOLVE_DEFAULT_WK_MAX_BYTES (50 * 1024)
#define FED_RESOLVE_DEFAULT_DNS_ENTRIES 4096
#define FED_RESOLVE_DEFAULT_WK_ENTRIES 1024
#define FED_RESOLVE_DEFAULT_MAX_IN_FLIGHT 1024 /* discoveries of different names at once */
#define FED_RESOLVE_DNS_TRY_TIMEOUT_MS 2000 /* one try at one DNS server */
#define FED_RESOLVE_DNS_TRIES 3
#define FED_RESOLVE_DNS_NEGATIVE_MS (60 * 1000)
#define FED_RESOLVE_DNS_MAX_TTL_MS (24LL * 3600 * 1000)
#define FED_RESOLVE_MAX_SRV 16
#define FED_RESOLVE_WK_DEFAULT_CACHE_MS (24LL * 3600 * 1000)
#define FED_RESOLVE_WK_JITTER_PERCENT 10
#define FED_RESOLVE_WK_MAX_CACHE_MS (48LL * 3600 * 1000)
#define FED_RESOLVE_WK_MIN_CACHE_MS (5LL * 60 * 1000)
#define FED_RESOLVE_WK_INVALID_CACHE_MS (3600LL * 1000)
#define FED_RESOLVE_WK_DOWN_FIRST_MS (2LL * 60 * 1000)
#define FED_RESOLVE_WK_DOWN_MAX_MS (3600LL * 1000)
#define FED_RESOLVE_WK_STALE_GRACE_MS (2LL * 3600 * 1000) /* a delegation used while down */
#define FED_RESOLVE_WK_MAX_REDIRECTS 5
#define FED_RESOLVE_WK_PATH "/.well-known/matrix/server"
#define FED_RESOLVE_WK_SCHEME "https"
#define FED_RESOLVE_WK_PORT 443
#define FED_RESOLVE_URL_BYTES 1400
#define FED_RESOLVE_ERR_BYTES 320
#define FED_RESOLVE_CSV_BYTES 4096
#define FED_RESOLVE_MAX_POLL_MS 1000
/* Look-ups waiting on discoveries others started, per discovery allowed at once: a bound
 * far above what a burst needs (every caller of fed_resolve_lookup is bounded itself). */
#define FED_RESOLVE_WAITERS_PER_DISCOVERY 64
#define FED_RESOLVE_FLIGHTS_NAME "federation_discovery"

/* ---- bounded caches (fed_resolve_cache.c) ---------------------------------------------------- */

typedef struct fed_resolve_cache_ent {
    rt_keyent ent; /* first: the table hands back &ent */
    struct fed_resolve_cache_ent *older, *newer;
    int64_t expires_ms; /* monotonic; expired entries stay until evicted (stale use) */
    void *val;          /* one malloc'd block */
    char key[];
} fed_resolve_cache_ent;

typedef struct fed_resolve_cache {
    rt_keytab tab;
    fed_resolve_cache_ent *oldest, *newest;
    size_t n, cap;
    rt_metric *m_hits, *m_misses, *m_size;
} fed_resolve_cache;

/* Size the cache for cap entries and register its metrics (label cache="<label>"). 0 or
 * ATRIUM_E_NOMEM. */
int fed_resolve_cache_init(fed_resolve_cache *c, size_t cap, rt_metrics *m, const char *label);
/* The entry for key, fresh or expired (stale answers serve when a refresh fails), or NULL. */
fed_resolve_cache_ent *fed_resolve_cache_find(fed_resolve_cache *c, const char *key);
/* The value for key if it has not expired at now (counted as a hit), else NULL (a miss).
 * Valid until the next fed_resolve_cache_put on c. */
void *fed_resolve_cache_get(fed_resolve_cache *c, const char *key, int64_t now);
/* Store val (one malloc'd block, taken even on failure) under key until expires_ms; when
 * full the oldest entry makes room. */
void fed_resolve_cache_put(fed_resolve_cache *c, const char *key, void *val, int64_t expires_ms);
void fed_resolve_cache_destroy(fed_resolve_cache *c);

/* ---- values ---------------------------------------------------------------------------------- */

typedef struct fed_dns_addrs { /* n == 0: the name has no address */
    int n;
    char a[FED_RESOLVE_MAX_ADDRS][64];
} fed_dns_addrs;

typedef struct fed_dns_srv { /* n == 0: no such record */
    size_t n;
    fed_srv_record r[];
} fed_dns_srv;

typedef struct fed_wk_val {
    bool delegated;
    char server[FED_RESOLVE_NAME_BYTES];
    int down_failures;      /* consecutive network-level failures */
    int64_t valid_until_ms; /* end of the last valid answer's period, 0 = never valid */
} fed_wk_val;

/* ---- the resolver ---------------------------------------------------------------------------- */

enum fed_resolve_msg_kind { FED_MSG_LOOKUP, FED_MSG_WK_DONE };


typedef struct fed_disc fed_disc;

typedef struct fed_resolve_msg {
    struct fed_resolve_msg *next;
    int kind;
    /* MSG_LOOKUP */
    fed_resolve_cb cb;
    void *arg;
    char name[FED_RESOLVE_NAME_BYTES];
    /* MSG_WK_DONE (the message is embedded in its discovery) */
    fed_disc *d;
    int outcome, status;
    char *body, *location, *cache_control, *expires;
    size_t body_len;
    char error[FED_RESOLVE_ERR_BYTES];
} fed_resolve_msg;

/* One look-up waiting on a discovery: a waiter of the name's flight (malloc'd; freed by
 * its done, which answers it). */
typedef struct fed_resolve_waiter {
    rt_flight_waiter w;
    rt_flight *f;
    fed_resolve_cb cb;
    void *arg;
} fed_resolve_waiter;

/* A discovery's answer: the value its flight ends with (the flight frees it). */
typedef struct fed_resolve_answer {
    fed_target t;
    char err[FED_RESOLVE_ERR_BYTES];
} fed_resolve_answer;

typedef void (*fed_addrs_cont)(fed_disc *d, const fed_dns_addrs *a, const char *err);

struct fed_disc {
    rt_flight *flight;     /* the name's flight, whose work this is, until it answers */
    fed_disc *prev, *next; /* r->discs: every discovery not yet freed */
    fed_resolver *r;
    char name[FED_RESOLVE_NAME_BYTES], host[FED_RESOLVE_NAME_BYTES];
    int port;
    int64_t deadline_ms;
    int refs; /* outstanding queries and fetches, and the step running */
    bool done;
    fed_url wk_url;
    int wk_hops;
    fed_resolve_msg wk_msg;
    char delegated[FED_RESOLVE_NAME_BYTES]; /* the delegated server name, "" = none */
    char sname[FED_RESOLVE_NAME_BYTES];     /* the hostname SRV and 8448 work on */
    int dport;
    bool legacy;
    fed_srv_record srv[FED_RESOLVE_MAX_SRV];
    size_t n_srv, srv_i;
};

/* The step names of fed_target.step, in the order of the metrics array. */
#define FED_RESOLVE_N_STEPS 9
extern const char *const FED_RESOLVE_STEPS[FED_RESOLVE_N_STEPS];

struct fed_resolver {
    /* settings */
    char *dns_csv;
    int64_t timeout_ms, wk_max_bytes, wk_min_cache_ms;
    bool verify_tls;
    char wk_scheme[8];
    int wk_port;
    fed_http *http;
    /* threads */
    pthread_t thread;
    bool started;
    int wake_fd;
    pthread_mutex_t mu;
    fed_resolve_msg *q_head, *q_tail; /* under mu */
    bool stopping, stopped; /* under mu */
    /* resolver thread only */
    ares_channel ch;
    bool ch_ok;
    fed_resolve_cache dns, wk;
    rt_flights *flights; /* one discovery per name: at most max_in_flight names at once */
    size_t max_in_flight;
    fed_disc *discs;
    rt_metric *m_step[FED_RESOLVE_N_STEPS], *m_failed, *m_in_flight, *m_refused;
};

/* ---- fed_resolve.c: a discovery's life ------------------------------------------------------- */
/* Drop one reference; the discovery is freed once it has answered and none is left. */
void fed_disc_unref(fed_disc *d);
/* Answer every waiter once (later calls do nothing): rc 0 with t, or an error; the
 * name's flight ends, so its next look-up starts a new discovery. */
void fed_disc_answer(fed_disc *d, int rc, const fed_target *t, const char *err);
void fed_disc_fail(fed_disc *d, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The end of every successful path; a target with no address fails ATRIUM_E_NOTFOUND. */
void fed_disc_found(fed_disc *d, const char *step, const char *tls_name, int port,
                    const char *host_header, const fed_dns_addrs *a);
/* Queue a message for the resolver's thread and wake it. Any thread. */
void fed_resolve_post(fed_resolver *r, fed_resolve_msg *m);

/* ---- fed_resolve_steps.c: the algorithm ------------------------------------------------------ */
/* Start a discovery (one reference held by the caller): step 2 or 3 onwards. */
void fed_resolve_steps_begin(fed_disc *d);
/* A .well-known answer posted by the outbound client's callback (the fetch's reference is
 * held by the caller; d has not answered yet). */
void fed_resolve_steps_well_known_answer(fed_disc *d, fed_resolve_msg *m);

#endif
