/*
 * core/federation/fed_resolve.c - server discovery on the resolver's own thread: the
 * spec's algorithm as a chain of small steps, each waiting on at most one DNS query
 * (c-ares) or one .well-known fetch (the outbound client), with both kinds of answer
 * cached.
 *
 * One thread owns everything here: the c-ares channel, the caches, the discoveries in
 * flight. Callers hand it look-ups through a queue and an eventfd; the outbound client
 * hands it .well-known answers the same way (its callback runs on the client's I/O thread
 * and only copies and posts). The thread polls c-ares' sockets and the eventfd, so a slow
 * DNS server delays only the names waiting on it. Concurrent look-ups of one name join
 * one discovery (its waiters list), so a burst of requests to a new destination costs one
 * discovery.
 *
 * A discovery is freed when it has answered and nothing it started is still out: each
 * outstanding query or fetch, and each step running, holds a reference. Steps continue in
 * callbacks, sometimes synchronously (a cache hit, c-ares answering from /etc/hosts), so
 * no step touches its discovery after handing it to the next one.
 *
 * Caching policy (the spec's recommendations, and what Synapse operators know): DNS
 * answers for their TTL, "no such record" for FED_RESOLVE_DNS_NEGATIVE_MS, a stale answer
 * used when the DNS servers fail; a valid .well-known for its Cache-Control/Expires period
 * clamped to [min, 48 h] (24 h plus jitter by default), an invalid one (not 200, bad JSON,
 * bad m.server, a redirect loop) for 1 h, and a fetch that failed at the network level (or
 * a 5xx) for 2 min doubling at each consecutive failure up to 1 h, meanwhile using the
 * last valid delegation if it is recent. The pure rules are in fed_resolve_parse.c.
 */
#include <ares.h>
#include <arpa/inet.h>
#include <arpa/nameser.h>
#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "core/federation/fed_resolve.h"
#include "core/runtime/keytab.h"

#define FED_RESOLVE_DEFAULT_TIMEOUT_MS 15000
#define FED_RESOLVE_DEFAULT_WK_MAX_BYTES (50 * 1024)
#define FED_RESOLVE_DEFAULT_DNS_ENTRIES 4096
#define FED_RESOLVE_DEFAULT_WK_ENTRIES 1024
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

/* ---- bounded caches (resolver thread only) ----------------------------------------------- */

typedef struct cache_ent {
    rt_keyent ent; /* first: the table hands back &ent */
    struct cache_ent *older, *newer;
    int64_t expires_ms; /* monotonic; expired entries stay until evicted (stale use) */
    void *val;          /* one malloc'd block */
    char key[];
} cache_ent;

typedef struct cache {
    rt_keytab tab;
    cache_ent *oldest, *newest;
    size_t n, cap;
    rt_metric *m_hits, *m_misses, *m_size;
} cache;

static int cache_init(cache *c, size_t cap, rt_metrics *m, const char *label)
{
    memset(c, 0, sizeof *c);
    c->cap = cap;
    char l[RT_METRIC_LABELS_MAX_BYTES];
    rt_metric_label(l, sizeof l, "cache", label);
    c->m_hits = rt_metric_counter(m, "atrium_federation_discovery_cache_hits_total", l,
                                  "Discovery answers taken from a cache");
    c->m_misses = rt_metric_counter(m, "atrium_federation_discovery_cache_misses_total", l,
                                    "Discovery answers not cached (or expired)");
    c->m_size = rt_metric_gauge(m, "atrium_federation_discovery_cached_names", l,
                                "Names held in a discovery cache");
    return rt_keytab_init(&c->tab, cap);
}

static void cache_unlink(cache *c, cache_ent *e)
{
    if (e->older)
        e->older->newer = e->newer;
    else
        c->oldest = e->newer;
    if (e->newer)
        e->newer->older = e->older;
    else
        c->newest = e->older;
    e->older = e->newer = NULL;
}

static void cache_link_newest(cache *c, cache_ent *e)
{
    e->older = c->newest;
    e->newer = NULL;
    if (c->newest)
        c->newest->newer = e;
    else
        c->oldest = e;
    c->newest = e;
}

static void cache_drop(cache *c, cache_ent *e)
{
    rt_keytab_remove(&c->tab, &e->ent);
    cache_unlink(c, e);
    free(e->val);
    free(e);
    c->n--;
}

static cache_ent *cache_find(cache *c, const char *key)
{
    rt_keyent *k = rt_keytab_find(&c->tab, key, rt_keytab_hash(&c->tab, key));
    return (cache_ent *)k;
}

/* The value for key if it has not expired (counted as a hit), else NULL (a miss). */
static void *cache_get_fresh(cache *c, const char *key, int64_t now)
{
    cache_ent *e = cache_find(c, key);
    if (e && now < e->expires_ms) {
        rt_metric_add(c->m_hits, 1);
        return e->val;
    }
    rt_metric_add(c->m_misses, 1);
    return NULL;
}

/* Store val (taking it) under key until expires_ms; the oldest entry makes room. */
static void cache_put(cache *c, const char *key, void *val, int64_t expires_ms)
{
    cache_ent *e = cache_find(c, key);
    if (e) {
        free(e->val);
        e->val = val;
        e->expires_ms = expires_ms;
        cache_unlink(c, e);
        cache_link_newest(c, e);
        return;
    }
    size_t klen = strlen(key);
    e = calloc(1, sizeof *e + klen + 1);
    if (!e) {
        free(val);
        return; /* not cached: the next look-up asks again */
    }
    if (c->n >= c->cap)
        cache_drop(c, c->oldest);
    memcpy(e->key, key, klen + 1);
    e->ent.key = e->key;
    e->ent.hash = rt_keytab_hash(&c->tab, e->key);
    e->val = val;
    e->expires_ms = expires_ms;
    rt_keytab_insert(&c->tab, &e->ent);
    cache_link_newest(c, e);
    c->n++;
    rt_metric_set(c->m_size, (int64_t)c->n);
}

static void cache_destroy(cache *c)
{
    while (c->oldest)
        cache_drop(c, c->oldest);
    rt_keytab_destroy(&c->tab);
}

/* ---- values ---------------------------------------------------------------------------- */

typedef struct dns_addrs { /* n == 0: the name has no address */
    int n;
    char a[FED_RESOLVE_MAX_ADDRS][64];
} dns_addrs;

typedef struct dns_srv { /* n == 0: no such record */
    size_t n;
    fed_srv_record r[];
} dns_srv;

typedef struct wk_val {
    bool delegated;
    char server[FED_RESOLVE_NAME_BYTES];
    int down_failures;      /* consecutive network-level failures */
    int64_t valid_until_ms; /* end of the last valid answer's period, 0 = never valid */
} wk_val;

/* ---- the resolver ------------------------------------------------------------------------ */

enum msg_kind { MSG_LOOKUP, MSG_WK_DONE };
enum wk_failure { WK_INVALID, WK_DOWN };

typedef struct disc disc;

typedef struct msg {
    struct msg *next;
    int kind;
    /* MSG_LOOKUP */
    fed_resolve_cb cb;
    void *arg;
    char name[FED_RESOLVE_NAME_BYTES];
    /* MSG_WK_DONE (the message is embedded in its discovery) */
    disc *d;
    int outcome, status;
    char *body, *location, *cache_control, *expires;
    size_t body_len;
    char error[FED_RESOLVE_ERR_BYTES];
} msg;

typedef struct waiter {
    struct waiter *next;
    fed_resolve_cb cb;
    void *arg;
} waiter;

typedef void (*addrs_cont)(disc *d, const dns_addrs *a, const char *err);

struct disc {
    rt_keyent ent; /* in r->inflight while !done; key = name */
    disc *prev, *next; /* r->discs: every discovery not yet freed */
    fed_resolver *r;
    char name[FED_RESOLVE_NAME_BYTES], host[FED_RESOLVE_NAME_BYTES];
    int port;
    int64_t deadline_ms;
    waiter *waiters;
    int refs; /* outstanding queries and fetches, and the step running */
    bool done;
    fed_url wk_url;
    int wk_hops;
    msg wk_msg;
    char delegated[FED_RESOLVE_NAME_BYTES]; /* the delegated server name, "" = none */
    char sname[FED_RESOLVE_NAME_BYTES];     /* the hostname SRV and 8448 work on */
    int dport;
    bool legacy;
    fed_srv_record srv[FED_RESOLVE_MAX_SRV];
    size_t n_srv, srv_i;
};

static const char *const STEPS[] = {"ip-literal",    "explicit-port",      "well-known",
                                    "well-known+srv", "well-known+srv-legacy",
                                    "well-known+default", "srv", "srv-legacy", "default"};
#define N_STEPS (sizeof STEPS / sizeof STEPS[0])

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
    msg *q_head, *q_tail; /* under mu */
    bool stopping, stopped; /* under mu */
    /* resolver thread only */
    ares_channel ch;
    bool ch_ok;
    cache dns, wk;
    rt_keytab inflight;
    disc *discs;
    rt_metric *m_step[N_STEPS], *m_failed;
};

/* ---- discoveries: references, answers ------------------------------------------------------ */

static void disc_unref(disc *d)
{
    RT_ASSERT(d->refs > 0, "discovery %s: reference count underflow", d->name);
    if (--d->refs > 0 || !d->done)
        return;
    fed_resolver *r = d->r;
    if (d->prev)
        d->prev->next = d->next;
    else
        r->discs = d->next;
    if (d->next)
        d->next->prev = d->prev;
    free(d);
}

static void disc_answer(disc *d, int rc, const fed_target *t, const char *err)
{
    if (d->done)
        return;
    d->done = true;
    fed_resolver *r = d->r;
    rt_keytab_remove(&r->inflight, &d->ent);
    if (rc == 0) {
        for (size_t i = 0; i < N_STEPS; i++)
            if (strcmp(STEPS[i], t->step) == 0)
                rt_metric_add(r->m_step[i], 1);
    } else {
        rt_metric_add(r->m_failed, 1);
        rt_log(ATRIUM_LOG_INFO, "core", "federation: discovery of %s failed: %s", d->name,
               err);
    }
    while (d->waiters) {
        waiter *w = d->waiters;
        d->waiters = w->next;
        w->cb(w->arg, rc, rc == 0 ? t : NULL, rc == 0 ? "" : err);
        free(w);
    }
}

static void disc_fail(disc *d, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void disc_fail(disc *d, int rc, const char *fmt, ...)
{
    char err[FED_RESOLVE_ERR_BYTES];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, sizeof err, fmt, ap);
    va_end(ap);
    disc_answer(d, rc, NULL, err);
}

/* The end of every successful path: a target needs at least one address. */
static void disc_found(disc *d, const char *step, const char *tls_name, int port,
                       const char *host_header, const dns_addrs *a)
{
    if (a->n == 0) {
        disc_fail(d, ATRIUM_E_NOTFOUND, "%s has no address (step %s)", tls_name, step);
        return;
    }
    fed_target t;
    memset(&t, 0, sizeof t);
    snprintf(t.tls_name, sizeof t.tls_name, "%s", tls_name);
    snprintf(t.host_header, sizeof t.host_header, "%s", host_header);
    t.port = port;
    t.step = step;
    t.n_addrs = a->n;
    memcpy(t.addrs, a->a, sizeof t.addrs);
    disc_answer(d, 0, &t, NULL);
}

/* ---- DNS: addresses ------------------------------------------------------------------------ */

typedef struct dns_query {
    disc *d;
    addrs_cont k;
    char key[FED_RESOLVE_NAME_BYTES + 48];
} dns_query;

static void lower_key(char *dst, size_t len, const char *prefix, const char *name)
{
    snprintf(dst, len, "%s%s", prefix, name);
    for (char *p = dst; *p; p++)
        *p = (char)tolower((unsigned char)*p);
}

static int64_t ttl_expiry_ms(int64_t ttl_s, int64_t now)
{
    int64_t ms = ttl_s < 0 ? 0 : ttl_s * 1000;
    return now + (ms > FED_RESOLVE_DNS_MAX_TTL_MS ? FED_RESOLVE_DNS_MAX_TTL_MS : ms);
}

static bool ares_says_no_record(int status)
{
    return status == ARES_ENOTFOUND || status == ARES_ENODATA || status == ARES_ENONAME;
}

static void gai_done(void *arg, int status, int timeouts, struct ares_addrinfo *res)
{
    (void)timeouts;
    dns_query *q = arg;
    disc *d = q->d;
    fed_resolver *r = d->r;
    int64_t now = rt_now_ms();
    dns_addrs *a = calloc(1, sizeof *a);
    const char *err = NULL;
    if (!a) {
        err = "out of memory";
    } else if (status == ARES_SUCCESS && res) {
        int64_t ttl = -1;
        for (struct ares_addrinfo_cname *c = res->cnames; c; c = c->next)
            if (ttl < 0 || c->ttl < ttl)
                ttl = c->ttl;
        for (struct ares_addrinfo_node *n = res->nodes; n && a->n < FED_RESOLVE_MAX_ADDRS;
             n = n->ai_next) {
            char ip[64] = "";
            if (n->ai_family == AF_INET)
                inet_ntop(AF_INET, &((struct sockaddr_in *)(void *)n->ai_addr)->sin_addr, ip,
                          sizeof ip);
            else if (n->ai_family == AF_INET6)
                inet_ntop(AF_INET6, &((struct sockaddr_in6 *)(void *)n->ai_addr)->sin6_addr,
                          ip, sizeof ip);
            if (!ip[0])
                continue;
            bool dup = false;
            for (int i = 0; i < a->n; i++)
                dup = dup || strcmp(a->a[i], ip) == 0;
            if (dup)
                continue;
            snprintf(a->a[a->n++], sizeof a->a[0], "%s", ip);
            if (ttl < 0 || n->ai_ttl < ttl)
                ttl = n->ai_ttl;
        }
        dns_addrs copy = *a;
        cache_put(&r->dns, q->key, a, ttl_expiry_ms(ttl, now));
        if (!d->done)
            q->k(d, &copy, NULL);
        a = NULL;
    } else if (ares_says_no_record(status)) {
        cache_put(&r->dns, q->key, a, now + FED_RESOLVE_DNS_NEGATIVE_MS);
        a = NULL;
        static const dns_addrs none;
        if (!d->done)
            q->k(d, &none, NULL);
    } else {
        cache_ent *stale = cache_find(&r->dns, q->key);
        if (stale && !d->done) {
            rt_log(ATRIUM_LOG_WARN, "core",
                   "federation: DNS failed for %s (%s); using the expired answer", q->key + 2,
                   ares_strerror(status));
            dns_addrs copy = *(dns_addrs *)stale->val;
            q->k(d, &copy, NULL);
        } else if (!d->done) {
            err = ares_strerror(status);
        }
    }
    if (err && !d->done)
        q->k(d, NULL, err);
    free(a);
    if (res)
        ares_freeaddrinfo(res);
    free(q);
    disc_unref(d);
}

/* Find the addresses of host (an IP literal is its own answer) and continue with k. */
static void addrs_lookup(disc *d, const char *host, addrs_cont k)
{
    fed_resolver *r = d->r;
    if (fed_host_is_ip_literal(host)) {
        dns_addrs a = {.n = 1};
        snprintf(a.a[0], sizeof a.a[0], "%.63s", host);
        k(d, &a, NULL);
        return;
    }
    dns_query *q = calloc(1, sizeof *q);
    if (!q) {
        k(d, NULL, "out of memory");
        return;
    }
    lower_key(q->key, sizeof q->key, "a:", host);
    const dns_addrs *hit = cache_get_fresh(&r->dns, q->key, rt_now_ms());
    if (hit) {
        dns_addrs copy = *hit;
        free(q);
        k(d, &copy, NULL);
        return;
    }
    q->d = d;
    q->k = k;
    d->refs++;
    struct ares_addrinfo_hints hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    ares_getaddrinfo(r->ch, host, NULL, &hints, gai_done, q); /* d may be gone after this */
}

/* ---- DNS: SRV -------------------------------------------------------------------------------- */

static void srv_have(disc *d, const dns_srv *s, const char *err);

static void srv_done(void *arg, int status, int timeouts, unsigned char *abuf, int alen)
{
    (void)timeouts;
    dns_query *q = arg;
    disc *d = q->d;
    fed_resolver *r = d->r;
    int64_t now = rt_now_ms();
    struct ares_srv_reply *reply = NULL;
    if (status == ARES_SUCCESS)
        status = ares_parse_srv_reply(abuf, alen, &reply);
    if (status == ARES_SUCCESS) {
        size_t n = 0;
        for (struct ares_srv_reply *p = reply; p && n < FED_RESOLVE_MAX_SRV; p = p->next)
            n++;
        dns_srv *s = calloc(1, sizeof *s + n * sizeof s->r[0]);
        if (s) {
            for (struct ares_srv_reply *p = reply; p && s->n < n; p = p->next) {
                fed_srv_record *rec = &s->r[s->n++];
                snprintf(rec->target, sizeof rec->target, "%s", p->host ? p->host : "");
                rec->port = p->port;
                rec->priority = p->priority;
                rec->weight = p->weight;
            }
            cache_put(&r->dns, q->key, s, ttl_expiry_ms(fed_dns_min_ttl(abuf, (size_t)alen, T_SRV), now));
            if (!d->done)
                srv_have(d, s, NULL); /* s stays valid: nothing touches the cache before */
        } else if (!d->done) {
            srv_have(d, NULL, "out of memory");
        }
    } else if (ares_says_no_record(status)) {
        dns_srv *s = calloc(1, sizeof *s);
        static const dns_srv none;
        if (s)
            cache_put(&r->dns, q->key, s, now + FED_RESOLVE_DNS_NEGATIVE_MS);
        if (!d->done)
            srv_have(d, &none, NULL);
    } else if (!d->done) {
        cache_ent *stale = cache_find(&r->dns, q->key);
        if (stale)
            rt_log(ATRIUM_LOG_WARN, "core",
                   "federation: DNS failed for %s (%s); using the expired answer", q->key + 4,
                   ares_strerror(status));
        srv_have(d, stale ? stale->val : NULL, stale ? NULL : ares_strerror(status));
    }
    if (reply)
        ares_free_data(reply);
    free(q);
    disc_unref(d);
}

static void srv_begin(disc *d, bool legacy);
static void srv_try(disc *d);
static void srv_addrs(disc *d, const dns_addrs *a, const char *err);
static void default_addrs(disc *d, const dns_addrs *a, const char *err);

static void srv_begin(disc *d, bool legacy)
{
    fed_resolver *r = d->r;
    d->legacy = legacy;
    char qname[FED_RESOLVE_NAME_BYTES + 32];
    snprintf(qname, sizeof qname, "%s%s", legacy ? "_matrix._tcp." : "_matrix-fed._tcp.",
             d->sname);
    dns_query *q = calloc(1, sizeof *q);
    if (!q) {
        disc_fail(d, ATRIUM_E_NOMEM, "out of memory");
        return;
    }
    lower_key(q->key, sizeof q->key, "srv:", qname);
    const dns_srv *hit = cache_get_fresh(&r->dns, q->key, rt_now_ms());
    if (hit) {
        free(q);
        srv_have(d, hit, NULL);
        return;
    }
    q->d = d;
    d->refs++;
    ares_query(r->ch, qname, C_IN, T_SRV, srv_done, q); /* d may be gone after this */
}

static uint32_t srv_random(void *arg)
{
    (void)arg;
    return arc4random();
}

static void srv_have(disc *d, const dns_srv *s, const char *err)
{
    const char *kind = d->legacy ? "_matrix._tcp" : "_matrix-fed._tcp";
    if (!s) {
        disc_fail(d, ATRIUM_E_IO, "the DNS look-up of %s.%s failed: %s", kind, d->sname, err);
        return;
    }
    if (fed_srv_says_no_service(s->r, s->n)) {
        disc_fail(d, ATRIUM_E_NOTFOUND, "%s.%s says the service is not available (\".\")",
                  kind, d->sname);
        return;
    }
    if (s->n == 0) {
        if (!d->legacy)
            srv_begin(d, true);
        else
            addrs_lookup(d, d->sname, default_addrs);
        return;
    }
    d->n_srv = s->n < FED_RESOLVE_MAX_SRV ? s->n : FED_RESOLVE_MAX_SRV;
    memcpy(d->srv, s->r, d->n_srv * sizeof d->srv[0]);
    fed_srv_order(d->srv, d->n_srv, srv_random, NULL);
    d->srv_i = 0;
    srv_try(d);
}

static void srv_try(disc *d)
{
    /* a "." target among others is skipped: it names no host */
    while (d->srv_i < d->n_srv && (!d->srv[d->srv_i].target[0] ||
                                   strcmp(d->srv[d->srv_i].target, ".") == 0))
        d->srv_i++;
    if (d->srv_i >= d->n_srv) {
        disc_fail(d, ATRIUM_E_NOTFOUND, "no SRV target of %s%s resolves",
                  d->legacy ? "_matrix._tcp." : "_matrix-fed._tcp.", d->sname);
        return;
    }
    addrs_lookup(d, d->srv[d->srv_i].target, srv_addrs);
}

static void srv_addrs(disc *d, const dns_addrs *a, const char *err)
{
    (void)err;
    if (!a || a->n == 0) {
        d->srv_i++;
        srv_try(d);
        return;
    }
    const char *step = d->delegated[0] ? (d->legacy ? "well-known+srv-legacy" : "well-known+srv")
                                       : (d->legacy ? "srv-legacy" : "srv");
    /* The spec: connect to the SRV target, but Host and certificate are the name whose SRV
     * record it is. */
    disc_found(d, step, d->sname, d->srv[d->srv_i].port, d->sname, a);
}

static void default_addrs(disc *d, const dns_addrs *a, const char *err)
{
    if (!a) {
        disc_fail(d, ATRIUM_E_IO, "the DNS look-up of %s failed: %s", d->sname, err);
        return;
    }
    disc_found(d, d->delegated[0] ? "well-known+default" : "default", d->sname,
               FED_RESOLVE_DEFAULT_PORT, d->sname, a);
}

/* ---- the steps before SRV --------------------------------------------------------------------- */

static void explicit_port_addrs(disc *d, const dns_addrs *a, const char *err)
{
    if (!a) {
        disc_fail(d, ATRIUM_E_IO, "the DNS look-up of %s failed: %s", d->host, err);
        return;
    }
    disc_found(d, "explicit-port", d->host, d->port, d->name, a);
}

static void delegated_port_addrs(disc *d, const dns_addrs *a, const char *err)
{
    if (!a) {
        disc_fail(d, ATRIUM_E_IO, "the DNS look-up of %s failed: %s", d->sname, err);
        return;
    }
    disc_found(d, "well-known", d->sname, d->dport, d->delegated, a);
}

/* After .well-known: the delegated name goes through steps 3.1-3.5 (never another
 * .well-known), or the server name's hostname through 4-6. */
static void wk_decided(disc *d, const wk_val *v)
{
    if (!v->delegated) {
        d->delegated[0] = '\0';
        snprintf(d->sname, sizeof d->sname, "%s", d->host);
        srv_begin(d, false);
        return;
    }
    snprintf(d->delegated, sizeof d->delegated, "%s", v->server);
    if (!fed_server_name_split(d->delegated, d->sname, sizeof d->sname, &d->dport)) {
        disc_fail(d, ATRIUM_E_NOTFOUND, "the delegated name %s is invalid", d->delegated);
        return;
    }
    if (fed_host_is_ip_literal(d->sname)) {
        dns_addrs a = {.n = 1};
        snprintf(a.a[0], sizeof a.a[0], "%.63s", d->sname);
        disc_found(d, "well-known", d->sname, d->dport ? d->dport : FED_RESOLVE_DEFAULT_PORT,
                   d->delegated, &a);
    } else if (d->dport) {
        addrs_lookup(d, d->sname, delegated_port_addrs);
    } else {
        srv_begin(d, false);
    }
}

static int64_t jittered(int64_t ms)
{
    return ms + (int64_t)(arc4random() % (uint32_t)(ms / 100 * FED_RESOLVE_WK_JITTER_PERCENT + 1));
}

/* Remember a failed .well-known and go on without delegation (or with the last valid one
 * while the peer's web server is down). */
static void wk_failed(disc *d, int kind, const char *why)
{
    fed_resolver *r = d->r;
    int64_t now = rt_now_ms();
    char key[FED_RESOLVE_NAME_BYTES + 4];
    lower_key(key, sizeof key, "", d->host);
    cache_ent *prev = cache_find(&r->wk, key);
    const wk_val *pv = prev ? prev->val : NULL;
    wk_val *v = calloc(1, sizeof *v);
    if (!v) {
        static const wk_val none;
        wk_decided(d, &none);
        return;
    }
    int64_t period = FED_RESOLVE_WK_INVALID_CACHE_MS;
    if (kind == WK_DOWN) {
        v->down_failures = (pv ? pv->down_failures : 0) + 1;
        period = FED_RESOLVE_WK_DOWN_FIRST_MS;
        for (int i = 1; i < v->down_failures && period < FED_RESOLVE_WK_DOWN_MAX_MS; i++)
            period *= 2;
        if (period > FED_RESOLVE_WK_DOWN_MAX_MS)
            period = FED_RESOLVE_WK_DOWN_MAX_MS;
        if (pv && pv->delegated && now - pv->valid_until_ms < FED_RESOLVE_WK_STALE_GRACE_MS) {
            v->delegated = true;
            v->valid_until_ms = pv->valid_until_ms;
            snprintf(v->server, sizeof v->server, "%s", pv->server);
        }
    }
    rt_log(ATRIUM_LOG_INFO, "core",
           "federation: no usable /.well-known/matrix/server for %s (%s); %s for %lld s", d->host,
           why, v->delegated ? "keeping the last delegation" : "going on without delegation",
           (long long)(period / 1000));
    wk_val copy = *v;
    cache_put(&r->wk, key, v, now + period);
    wk_decided(d, &copy);
}

static void wk_fetch(disc *d);

static void wk_on_done(void *arg, const fed_http_result *res)
{
    /* The outbound client's I/O thread: copy, post, wake; nothing else. */
    disc *d = arg;
    fed_resolver *r = d->r;
    msg *m = &d->wk_msg;
    m->kind = MSG_WK_DONE;
    m->d = d;
    m->outcome = res->outcome;
    m->status = res->status;
    snprintf(m->error, sizeof m->error, "%s", res->error ? res->error : "");
    m->body = NULL;
    m->body_len = 0;
    if (res->body && (m->body = malloc(res->body_len + 1))) {
        memcpy(m->body, res->body, res->body_len);
        m->body[res->body_len] = '\0';
        m->body_len = res->body_len;
    }
    const char *h = NULL;
    fed_http_handle *hh = res->handle;
#define WK_HEADER(name) ((hh && (h = fed_http_handle_header(hh, name))) ? strdup(h) : NULL)
    m->location = WK_HEADER("Location");
    m->cache_control = WK_HEADER("Cache-Control");
    m->expires = WK_HEADER("Expires");
#undef WK_HEADER
    pthread_mutex_lock(&r->mu);
    m->next = NULL;
    if (r->q_tail)
        r->q_tail->next = m;
    else
        r->q_head = m;
    r->q_tail = m;
    pthread_mutex_unlock(&r->mu);
    uint64_t one = 1;
    ssize_t w = write(r->wake_fd, &one, sizeof one);
    (void)w; /* a full eventfd counter still wakes the thread */
}

static void wk_msg_clear(msg *m)
{
    free(m->body);
    free(m->location);
    free(m->cache_control);
    free(m->expires);
    m->body = m->location = m->cache_control = m->expires = NULL;
}

static bool wk_scheme_allowed(const fed_resolver *r, const char *scheme)
{
    return strcmp(scheme, FED_RESOLVE_WK_SCHEME) == 0 || strcmp(scheme, r->wk_scheme) == 0;
}

/* A .well-known answer arrived (resolver thread; the fetch's reference is held). */
static void wk_response(disc *d, msg *m)
{
    fed_resolver *r = d->r;
    char why[FED_RESOLVE_ERR_BYTES];
    if (m->outcome != FED_HTTP_OK) {
        wk_failed(d, WK_DOWN, m->error[0] ? m->error : "the fetch failed");
        return;
    }
    if (m->status >= 300 && m->status < 400 && m->location) {
        fed_url next;
        if (++d->wk_hops > FED_RESOLVE_WK_MAX_REDIRECTS) {
            wk_failed(d, WK_INVALID, "more than 5 redirects");
        } else if (fed_url_resolve(&d->wk_url, m->location, &next) < 0 ||
                   !wk_scheme_allowed(r, next.scheme)) {
            snprintf(why, sizeof why, "a redirect to an unusable location (%.200s)",
                     m->location);
            wk_failed(d, WK_INVALID, why);
        } else {
            d->wk_url = next;
            wk_fetch(d); /* resolved again: the address check applies to this hop too */
        }
        return;
    }
    if (m->status >= 500) {
        snprintf(why, sizeof why, "HTTP %d", m->status);
        wk_failed(d, WK_DOWN, why);
        return;
    }
    if (m->status != 200) {
        snprintf(why, sizeof why, "HTTP %d", m->status);
        wk_failed(d, WK_INVALID, why);
        return;
    }
    wk_val *v = calloc(1, sizeof *v);
    if (!v) {
        wk_failed(d, WK_DOWN, "out of memory");
        return;
    }
    char perr[FED_RESOLVE_ERR_BYTES];
    if (!m->body || fed_well_known_parse(m->body, m->body_len, v->server, sizeof v->server,
                                         perr, sizeof perr) < 0) {
        free(v);
        wk_failed(d, WK_INVALID, m->body ? perr : "out of memory");
        return;
    }
    int64_t period = fed_resolve_cache_period_ms(m->cache_control, m->expires, rt_wall_ms());
    if (period < 0) {
        period = jittered(FED_RESOLVE_WK_DEFAULT_CACHE_MS);
    } else {
        if (period > FED_RESOLVE_WK_MAX_CACHE_MS)
            period = FED_RESOLVE_WK_MAX_CACHE_MS;
        if (period < r->wk_min_cache_ms)
            period = r->wk_min_cache_ms;
    }
    int64_t now = rt_now_ms();
    v->delegated = true;
    v->valid_until_ms = now + period;
    char key[FED_RESOLVE_NAME_BYTES + 4];
    lower_key(key, sizeof key, "", d->host);
    wk_val copy = *v;
    cache_put(&r->wk, key, v, now + period);
    wk_decided(d, &copy);
}

static void url_format(const fed_url *u, char *buf, size_t len)
{
    bool v6 = strchr(u->host, ':') != NULL;
    bool default_port = (strcmp(u->scheme, "https") == 0 && u->port == 443) ||
                        (strcmp(u->scheme, "http") == 0 && u->port == 80);
    char port[16] = "";
    if (!default_port)
        snprintf(port, sizeof port, ":%d", u->port);
    snprintf(buf, len, "%s://%s%s%s%s%s", u->scheme, v6 ? "[" : "", u->host, v6 ? "]" : "",
             port, u->path);
}

static void wk_addrs(disc *d, const dns_addrs *a, const char *err)
{
    fed_resolver *r = d->r;
    if (!a) {
        wk_failed(d, WK_DOWN, err);
        return;
    }
    if (a->n == 0) {
        wk_failed(d, WK_INVALID, "the hostname has no address");
        return;
    }
    char url[FED_RESOLVE_URL_BYTES];
    url_format(&d->wk_url, url, sizeof url);
    const char *addrs[FED_RESOLVE_MAX_ADDRS + 1];
    for (int i = 0; i < a->n; i++)
        addrs[i] = a->a[i];
    addrs[a->n] = NULL;
    fed_http_req req = {
        .method = "GET",
        .url = url,
        .connect_addrs = addrs,
        .deadline_ms = d->deadline_ms,
        .max_body_bytes = r->wk_max_bytes,
        .verify_tls = r->verify_tls,
        .host_key = d->host,
        .on_done = wk_on_done,
        .arg = d,
    };
    d->refs++;
    int rc = fed_http_submit(r->http, &req, NULL);
    if (rc < 0) {
        d->refs--;
        wk_failed(d, WK_DOWN, rc == ATRIUM_E_LIMIT ? "the outbound queue is full"
                                                   : "the outbound client refused the fetch");
    }
}

static void wk_fetch(disc *d)
{
    addrs_lookup(d, d->wk_url.host, wk_addrs);
}

/* Step 3: the cached .well-known answer, or a fetch. */
static void wk_begin(disc *d)
{
    fed_resolver *r = d->r;
    char key[FED_RESOLVE_NAME_BYTES + 4];
    lower_key(key, sizeof key, "", d->host);
    const wk_val *hit = cache_get_fresh(&r->wk, key, rt_now_ms());
    if (hit) {
        wk_val copy = *hit;
        wk_decided(d, &copy);
        return;
    }
    memset(&d->wk_url, 0, sizeof d->wk_url);
    snprintf(d->wk_url.scheme, sizeof d->wk_url.scheme, "%s", r->wk_scheme);
    snprintf(d->wk_url.host, sizeof d->wk_url.host, "%s", d->host);
    d->wk_url.port = r->wk_port;
    snprintf(d->wk_url.path, sizeof d->wk_url.path, "%s", FED_RESOLVE_WK_PATH);
    d->wk_hops = 0;
    wk_fetch(d);
}

/* ---- the resolver thread ---------------------------------------------------------------------- */

static void lookup_start(fed_resolver *r, msg *m)
{
    rt_keyent *k = rt_keytab_find(&r->inflight, m->name, rt_keytab_hash(&r->inflight, m->name));
    waiter *w = calloc(1, sizeof *w);
    if (!w) {
        m->cb(m->arg, ATRIUM_E_NOMEM, NULL, "out of memory");
        return;
    }
    w->cb = m->cb;
    w->arg = m->arg;
    if (k) { /* joins the discovery already running for this name */
        disc *d = (disc *)k;
        w->next = d->waiters;
        d->waiters = w;
        return;
    }
    disc *d = calloc(1, sizeof *d);
    if (!d) {
        free(w);
        m->cb(m->arg, ATRIUM_E_NOMEM, NULL, "out of memory");
        return;
    }
    d->r = r;
    snprintf(d->name, sizeof d->name, "%s", m->name);
    d->ent.key = d->name;
    d->ent.hash = rt_keytab_hash(&r->inflight, d->name);
    rt_keytab_insert(&r->inflight, &d->ent);
    d->next = r->discs;
    if (r->discs)
        r->discs->prev = d;
    r->discs = d;
    d->waiters = w;
    d->deadline_ms = rt_now_ms() + r->timeout_ms;
    d->refs = 1; /* this step */
    if (!fed_server_name_split(d->name, d->host, sizeof d->host, &d->port))
        disc_fail(d, ATRIUM_E_INVAL, "not a valid server name");
    else if (d->port)
        addrs_lookup(d, d->host, explicit_port_addrs);
    else
        wk_begin(d);
    disc_unref(d);
}

static void handle_msg(fed_resolver *r, msg *m, bool stopping)
{
    if (m->kind == MSG_LOOKUP) {
        if (stopping)
            m->cb(m->arg, ATRIUM_E_STOPPED, NULL, "the resolver is stopping");
        else
            lookup_start(r, m);
        free(m);
        return;
    }
    disc *d = m->d; /* the fetch's reference */
    if (!d->done)
        wk_response(d, m);
    wk_msg_clear(m);
    disc_unref(d);
}

static int poll_timeout_ms(fed_resolver *r)
{
    struct timeval maxtv = {.tv_sec = FED_RESOLVE_MAX_POLL_MS / 1000,
                            .tv_usec = (FED_RESOLVE_MAX_POLL_MS % 1000) * 1000};
    struct timeval tv, *t = ares_timeout(r->ch, &maxtv, &tv);
    int64_t ms = (int64_t)t->tv_sec * 1000 + (t->tv_usec + 999) / 1000;
    int64_t now = rt_now_ms();
    for (disc *d = r->discs; d; d = d->next)
        if (!d->done && d->deadline_ms - now < ms)
            ms = d->deadline_ms - now;
    return ms < 0 ? 0 : (int)ms;
}

static void *resolver_main(void *arg)
{
    fed_resolver *r = arg;
    for (;;) {
        struct pollfd pfd[1 + ARES_GETSOCK_MAXNUM];
        ares_socket_t socks[ARES_GETSOCK_MAXNUM];
        /* The bit tests by hand, in unsigned arithmetic: c-ares's ARES_GETSOCK_WRITABLE
         * shifts a signed 1 by up to 31 places (undefined behaviour). */
        unsigned bits = (unsigned)ares_getsock(r->ch, socks, ARES_GETSOCK_MAXNUM);
        nfds_t n = 1;
        pfd[0] = (struct pollfd){.fd = r->wake_fd, .events = POLLIN};
        for (unsigned i = 0; i < ARES_GETSOCK_MAXNUM; i++) {
            bool readable = bits & (1u << i);
            bool writable = bits & (1u << (i + ARES_GETSOCK_MAXNUM));
            short ev = (short)((readable ? POLLIN : 0) | (writable ? POLLOUT : 0));
            if (ev)
                pfd[n++] = (struct pollfd){.fd = socks[i], .events = ev};
        }
        int rc = poll(pfd, n, poll_timeout_ms(r));
        if (rc < 0 && errno != EINTR) {
            rt_log(ATRIUM_LOG_ERROR, "core", "federation resolver: poll: %s", strerror(errno));
            RT_ASSERT(false, "federation resolver: poll failed");
        }
        for (nfds_t i = 1; rc > 0 && i < n; i++) {
            if (!pfd[i].revents)
                continue;
            bool rd = pfd[i].revents & (POLLIN | POLLERR | POLLHUP);
            bool wr = pfd[i].revents & POLLOUT;
            ares_process_fd(r->ch, rd ? pfd[i].fd : ARES_SOCKET_BAD,
                            wr ? pfd[i].fd : ARES_SOCKET_BAD);
        }
        ares_process_fd(r->ch, ARES_SOCKET_BAD, ARES_SOCKET_BAD); /* timeouts */
        if (rc > 0 && pfd[0].revents) {
            uint64_t v;
            ssize_t got = read(r->wake_fd, &v, sizeof v);
            (void)got;
        }
        pthread_mutex_lock(&r->mu);
        msg *m = r->q_head;
        r->q_head = r->q_tail = NULL;
        bool stopping = r->stopping;
        pthread_mutex_unlock(&r->mu);
        while (m) {
            msg *next = m->next;
            handle_msg(r, m, false);
            m = next;
        }
        int64_t now = rt_now_ms();
        for (disc *d = r->discs, *next; d; d = next) {
            next = d->next;
            if (d->done || now < d->deadline_ms)
                continue;
            d->refs++;
            disc_fail(d, ATRIUM_E_TIMEOUT, "no answer within %lld ms",
                      (long long)r->timeout_ms);
            disc_unref(d);
        }
        if (stopping)
            break;
    }
    /* Stop: every discovery answers now; c-ares ends its queries (their callbacks release
     * what they hold); fetches still out end when the outbound client stops. */
    for (disc *d = r->discs, *next; d; d = next) {
        next = d->next;
        d->refs++;
        disc_fail(d, ATRIUM_E_STOPPED, "the resolver is stopping");
        disc_unref(d);
    }
    ares_cancel(r->ch);
    pthread_mutex_lock(&r->mu);
    r->stopped = true;
    msg *m = r->q_head;
    r->q_head = r->q_tail = NULL;
    pthread_mutex_unlock(&r->mu);
    while (m) {
        msg *next = m->next;
        handle_msg(r, m, true);
        m = next;
    }
    return NULL;
}

/* ---- the public functions ---------------------------------------------------------------------- */

fed_resolver *fed_resolve_new(const fed_resolve_settings *s, fed_http *http,
                              rt_metrics *metrics)
{
    fed_resolver *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->wake_fd = -1;
    r->http = http;
    r->timeout_ms = s->lookup_timeout_ms > 0 ? s->lookup_timeout_ms : FED_RESOLVE_DEFAULT_TIMEOUT_MS;
    r->wk_max_bytes = s->well_known_max_bytes > 0 ? s->well_known_max_bytes
                                                  : FED_RESOLVE_DEFAULT_WK_MAX_BYTES;
    r->wk_min_cache_ms = s->well_known_min_cache_ms == 0 ? FED_RESOLVE_WK_MIN_CACHE_MS
                         : s->well_known_min_cache_ms < 0 ? 0
                                                          : s->well_known_min_cache_ms;
    r->verify_tls = s->verify_tls;
    snprintf(r->wk_scheme, sizeof r->wk_scheme, "%s",
             s->well_known_scheme ? s->well_known_scheme : FED_RESOLVE_WK_SCHEME);
    r->wk_port = s->well_known_port > 0 ? s->well_known_port : FED_RESOLVE_WK_PORT;
    if (strcmp(r->wk_scheme, "https") != 0 && strcmp(r->wk_scheme, "http") != 0) {
        rt_log(ATRIUM_LOG_ERROR, "core", "federation resolver: well_known_scheme must be "
                                         "https or http");
        goto fail;
    }
    pthread_mutex_init(&r->mu, NULL);
    for (size_t i = 0; i < N_STEPS; i++) {
        char l[RT_METRIC_LABELS_MAX_BYTES];
        rt_metric_label(l, sizeof l, "step", STEPS[i]);
        r->m_step[i] = rt_metric_counter(metrics, "atrium_federation_discovery_total", l,
                                         "Server discoveries by the step that decided");
    }
    r->m_failed = rt_metric_counter(metrics, "atrium_federation_discovery_failed_total", "",
                                    "Server discoveries that found nothing");
    if (cache_init(&r->dns, s->dns_cache_entries > 0 ? (size_t)s->dns_cache_entries
                                                     : FED_RESOLVE_DEFAULT_DNS_ENTRIES,
                   metrics, "dns") < 0 ||
        cache_init(&r->wk, s->well_known_cache_entries > 0 ? (size_t)s->well_known_cache_entries
                                                           : FED_RESOLVE_DEFAULT_WK_ENTRIES,
                   metrics, "well_known") < 0 ||
        rt_keytab_init(&r->inflight, 256) < 0)
        goto fail;
    r->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (r->wake_fd < 0) {
        rt_log(ATRIUM_LOG_ERROR, "core", "federation resolver: eventfd: %s", strerror(errno));
        goto fail;
    }
    int arc = ares_library_init(ARES_LIB_INIT_ALL);
    if (arc != ARES_SUCCESS) {
        rt_log(ATRIUM_LOG_ERROR, "core", "federation resolver: c-ares: %s", ares_strerror(arc));
        goto fail;
    }
    struct ares_options o = {.timeout = FED_RESOLVE_DNS_TRY_TIMEOUT_MS,
                             .tries = FED_RESOLVE_DNS_TRIES};
    arc = ares_init_options(&r->ch, &o, ARES_OPT_TIMEOUTMS | ARES_OPT_TRIES);
    if (arc != ARES_SUCCESS) {
        ares_library_cleanup();
        rt_log(ATRIUM_LOG_ERROR, "core",
               "federation resolver: c-ares could not start (%s); check /etc/resolv.conf",
               ares_strerror(arc));
        goto fail;
    }
    r->ch_ok = true;
    if (s->n_dns_servers > 0) {
        char csv[FED_RESOLVE_CSV_BYTES] = "";
        size_t used = 0;
        for (size_t i = 0; i < s->n_dns_servers; i++) {
            int w = snprintf(csv + used, sizeof csv - used, "%s%s", i ? "," : "",
                             s->dns_servers[i]);
            if (w < 0 || (size_t)w >= sizeof csv - used) {
                rt_log(ATRIUM_LOG_ERROR, "core", "federation resolver: too many DNS servers");
                goto fail;
            }
            used += (size_t)w;
        }
        arc = ares_set_servers_ports_csv(r->ch, csv);
        if (arc != ARES_SUCCESS) {
            rt_log(ATRIUM_LOG_ERROR, "core",
                   "federation resolver: bad DNS server list \"%s\" (%s); use ip or ip:port",
                   csv, ares_strerror(arc));
            goto fail;
        }
        r->dns_csv = strdup(csv);
    }
    return r;
fail:
    fed_resolve_free(r);
    return NULL;
}

int fed_resolve_start(fed_resolver *r)
{
    int rc = pthread_create(&r->thread, NULL, resolver_main, r);
    if (rc != 0) {
        rt_log(ATRIUM_LOG_ERROR, "core", "federation resolver: pthread_create: %s",
               strerror(rc));
        return ATRIUM_E_IO;
    }
    r->started = true;
    return 0;
}

int fed_resolve_lookup(fed_resolver *r, const char *server_name, fed_resolve_cb cb, void *arg)
{
    char host[FED_RESOLVE_NAME_BYTES];
    int port;
    if (!server_name || strlen(server_name) >= FED_RESOLVE_NAME_BYTES ||
        !fed_server_name_split(server_name, host, sizeof host, &port)) {
        cb(arg, ATRIUM_E_INVAL, NULL, "not a valid server name");
        return 0;
    }
    if (fed_host_is_ip_literal(host)) { /* step 1: nothing to look up */
        fed_target t;
        memset(&t, 0, sizeof t);
        snprintf(t.tls_name, sizeof t.tls_name, "%s", host);
        snprintf(t.host_header, sizeof t.host_header, "%s", server_name);
        snprintf(t.addrs[0], sizeof t.addrs[0], "%.63s", host);
        t.n_addrs = 1;
        t.port = port ? port : FED_RESOLVE_DEFAULT_PORT;
        t.step = STEPS[0];
        rt_metric_add(r->m_step[0], 1);
        cb(arg, 0, &t, "");
        return 0;
    }
    msg *m = calloc(1, sizeof *m);
    if (!m)
        return ATRIUM_E_NOMEM;
    m->kind = MSG_LOOKUP;
    m->cb = cb;
    m->arg = arg;
    snprintf(m->name, sizeof m->name, "%s", server_name);
    pthread_mutex_lock(&r->mu);
    if (!r->started || r->stopping) {
        pthread_mutex_unlock(&r->mu);
        free(m);
        return ATRIUM_E_STOPPED;
    }
    if (r->q_tail)
        r->q_tail->next = m;
    else
        r->q_head = m;
    r->q_tail = m;
    pthread_mutex_unlock(&r->mu);
    uint64_t one = 1;
    ssize_t w = write(r->wake_fd, &one, sizeof one);
    (void)w;
    return 0;
}

void fed_resolve_stop(fed_resolver *r)
{
    if (!r || !r->started)
        return;
    pthread_mutex_lock(&r->mu);
    bool already = r->stopping;
    r->stopping = true;
    pthread_mutex_unlock(&r->mu);
    if (already)
        return;
    uint64_t one = 1;
    ssize_t w = write(r->wake_fd, &one, sizeof one);
    (void)w;
    pthread_join(r->thread, NULL);
}

void fed_resolve_free(fed_resolver *r)
{
    if (!r)
        return;
    /* .well-known answers that came after the thread stopped (fed_http_stop ends every
     * fetch): their discoveries have answered already. */
    msg *m = r->q_head;
    while (m) {
        msg *next = m->next;
        if (m->kind == MSG_LOOKUP) {
            free(m);
        } else {
            wk_msg_clear(m);
            disc_unref(m->d);
        }
        m = next;
    }
    while (r->discs) { /* a fetch the client never ended: nothing will call back now */
        disc *d = r->discs;
        r->discs = d->next;
        while (d->waiters) {
            waiter *w = d->waiters;
            d->waiters = w->next;
            free(w);
        }
        free(d);
    }
    if (r->ch_ok) {
        ares_destroy(r->ch);
        ares_library_cleanup();
    }
    cache_destroy(&r->dns);
    cache_destroy(&r->wk);
    rt_keytab_destroy(&r->inflight);
    if (r->wake_fd >= 0)
        close(r->wake_fd);
    pthread_mutex_destroy(&r->mu);
    free(r->dns_csv);
    free(r);
}
