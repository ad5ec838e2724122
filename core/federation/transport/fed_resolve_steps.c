/*
 * core/federation/transport/fed_resolve_steps.c - the spec's discovery algorithm as a chain of
 * steps, each waiting on at most one DNS query (c-ares) or one .well-known fetch (the
 * outbound client), and the caching policy of each answer.
 *
 * 2: hostname with a port: its addresses. 3: /.well-known/matrix/server (redirects
 * followed here, each hop resolved again so the client's address check applies to it);
 * a delegated name then goes through 3.1 IP literal, 3.2 explicit port, 3.3 SRV
 * _matrix-fed._tcp, 3.4 _matrix._tcp, 3.5 port 8448, never another .well-known, with Host
 * and certificate name the delegated name. Without delegation: 4 SRV _matrix-fed._tcp,
 * 5 _matrix._tcp, 6 port 8448, with Host and certificate name the hostname. (Step 1, an IP
 * literal, needs no thread: fed_resolve_lookup answers it.)
 *
 * A step continues in a callback, sometimes synchronously (a cache hit, c-ares answering
 * from /etc/hosts), so no step touches its discovery after handing it on; each query and
 * fetch out holds a reference (fed_disc_unref).
 *
 * Caching policy (the spec's recommendations, and what Synapse operators know): DNS
 * answers for their TTL, "no such record" for FED_RESOLVE_DNS_NEGATIVE_MS, a stale answer
 * used when the DNS servers fail; a valid .well-known for its Cache-Control/Expires period
 * clamped to [min, 48 h] (24 h plus jitter by default), an invalid one (not 200, bad JSON,
 * bad m.server, a redirect loop) for 1 h, and a fetch that failed at the network level (or
 * a 5xx) for 2 min doubling at each consecutive failure up to 1 h, meanwhile using the
 * last valid delegation if it is recent.
 */
#include <arpa/inet.h>
#include <arpa/nameser.h>
#include <ctype.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/federation/transport/fed_resolve_internal.h"

/* Why a .well-known gave no delegation: none published (404, or no address: the normal
 * case, logged at debug level), an invalid answer, or the peer's web server is down. */
enum wk_failure { WK_ABSENT, WK_INVALID, WK_DOWN };

/* ---- DNS: addresses -------------------------------------------------------------------------- */

typedef struct dns_query {
    fed_disc *d;
    fed_addrs_cont k;
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
    fed_disc *d = q->d;
    fed_resolver *r = d->r;
    int64_t now = rt_now_ms();
    fed_dns_addrs *a = calloc(1, sizeof *a);
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
        fed_dns_addrs copy = *a;
        fed_resolve_cache_put(&r->dns, q->key, a, ttl_expiry_ms(ttl, now));
        if (!d->done)
            q->k(d, &copy, NULL);
        a = NULL;
    } else if (ares_says_no_record(status)) {
        fed_resolve_cache_put(&r->dns, q->key, a, now + FED_RESOLVE_DNS_NEGATIVE_MS);
        a = NULL;
        static const fed_dns_addrs none;
        if (!d->done)
            q->k(d, &none, NULL);
    } else {
        fed_resolve_cache_ent *stale = fed_resolve_cache_find(&r->dns, q->key);
        if (stale && !d->done) {
            rt_log(ATRIUM_LOG_WARN, "core",
                   "federation: DNS failed for %s (%s); using the expired answer", q->key + 2,
                   ares_strerror(status));
            fed_dns_addrs copy = *(fed_dns_addrs *)stale->val;
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
    fed_disc_unref(d);
}

/* Find the addresses of host (an IP literal is its own answer) and continue with k. */
static void addrs_lookup(fed_disc *d, const char *host, fed_addrs_cont k)
{
    fed_resolver *r = d->r;
    if (fed_host_is_ip_literal(host)) {
        fed_dns_addrs a = {.n = 1};
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
    const fed_dns_addrs *hit = fed_resolve_cache_get(&r->dns, q->key, rt_now_ms());
    if (hit) {
        fed_dns_addrs copy = *hit;
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

static void srv_have(fed_disc *d, const fed_dns_srv *s, const char *err);

static void srv_done(void *arg, int status, int timeouts, unsigned char *abuf, int alen)
{
    (void)timeouts;
    dns_query *q = arg;
    fed_disc *d = q->d;
    fed_resolver *r = d->r;
    int64_t now = rt_now_ms();
    struct ares_srv_reply *reply = NULL;
    if (status == ARES_SUCCESS)
        status = ares_parse_srv_reply(abuf, alen, &reply);
    if (status == ARES_SUCCESS) {
        size_t n = 0;
        for (struct ares_srv_reply *p = reply; p && n < FED_RESOLVE_MAX_SRV; p = p->next)
            n++;
        fed_dns_srv *s = calloc(1, sizeof *s + n * sizeof s->r[0]);
        if (s) {
            for (struct ares_srv_reply *p = reply; p && s->n < n; p = p->next) {
                fed_srv_record *rec = &s->r[s->n++];
                snprintf(rec->target, sizeof rec->target, "%s", p->host ? p->host : "");
                rec->port = p->port;
                rec->priority = p->priority;
                rec->weight = p->weight;
            }
            int64_t ttl = fed_dns_min_ttl(abuf, (size_t)alen, T_SRV);
            fed_resolve_cache_put(&r->dns, q->key, s, ttl_expiry_ms(ttl, now));
            if (!d->done)
                srv_have(d, s, NULL); /* s stays valid: nothing touches the cache before */
        } else if (!d->done) {
            srv_have(d, NULL, "out of memory");
        }
    } else if (ares_says_no_record(status)) {
        fed_dns_srv *s = calloc(1, sizeof *s);
        static const fed_dns_srv none;
        if (s)
            fed_resolve_cache_put(&r->dns, q->key, s, now + FED_RESOLVE_DNS_NEGATIVE_MS);
        if (!d->done)
            srv_have(d, &none, NULL);
    } else if (!d->done) {
        fed_resolve_cache_ent *stale = fed_resolve_cache_find(&r->dns, q->key);
        if (stale)
            rt_log(ATRIUM_LOG_WARN, "core",
                   "federation: DNS failed for %s (%s); using the expired answer", q->key + 4,
                   ares_strerror(status));
        srv_have(d, stale ? stale->val : NULL, stale ? NULL : ares_strerror(status));
    }
    if (reply)
        ares_free_data(reply);
    free(q);
    fed_disc_unref(d);
}

static void srv_begin(fed_disc *d, bool legacy);
static void srv_try(fed_disc *d);
static void srv_addrs(fed_disc *d, const fed_dns_addrs *a, const char *err);
static void default_addrs(fed_disc *d, const fed_dns_addrs *a, const char *err);

static void srv_begin(fed_disc *d, bool legacy)
{
    fed_resolver *r = d->r;
    d->legacy = legacy;
    char qname[FED_RESOLVE_NAME_BYTES + 32];
    snprintf(qname, sizeof qname, "%s%s", legacy ? "_matrix._tcp." : "_matrix-fed._tcp.",
             d->sname);
    dns_query *q = calloc(1, sizeof *q);
    if (!q) {
        fed_disc_fail(d, ATRIUM_E_NOMEM, "out of memory");
        return;
    }
    lower_key(q->key, sizeof q->key, "srv:", qname);
    const fed_dns_srv *hit = fed_resolve_cache_get(&r->dns, q->key, rt_now_ms());
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

static void srv_have(fed_disc *d, const fed_dns_srv *s, const char *err)
{
    const char *kind = d->legacy ? "_matrix._tcp" : "_matrix-fed._tcp";
    if (!s) {
        fed_disc_fail(d, ATRIUM_E_IO, "the DNS look-up of %s.%s failed: %s", kind, d->sname, err);
        return;
    }
    if (fed_srv_says_no_service(s->r, s->n)) {
        fed_disc_fail(d, ATRIUM_E_NOTFOUND, "%s.%s says the service is not available (\".\")",
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

static void srv_try(fed_disc *d)
{
    /* a "." target among others is skipped: it names no host */
    while (d->srv_i < d->n_srv && (!d->srv[d->srv_i].target[0] ||
                                   strcmp(d->srv[d->srv_i].target, ".") == 0))
        d->srv_i++;
    if (d->srv_i >= d->n_srv) {
        fed_disc_fail(d, ATRIUM_E_NOTFOUND, "no SRV target of %s%s resolves",
                  d->legacy ? "_matrix._tcp." : "_matrix-fed._tcp.", d->sname);
        return;
    }
    addrs_lookup(d, d->srv[d->srv_i].target, srv_addrs);
}

static void srv_addrs(fed_disc *d, const fed_dns_addrs *a, const char *err)
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
    fed_disc_found(d, step, d->sname, d->srv[d->srv_i].port, d->sname, a);
}

static void default_addrs(fed_disc *d, const fed_dns_addrs *a, const char *err)
{
    if (!a) {
        fed_disc_fail(d, ATRIUM_E_IO, "the DNS look-up of %s failed: %s", d->sname, err);
        return;
    }
    fed_disc_found(d, d->delegated[0] ? "well-known+default" : "default", d->sname,
               FED_RESOLVE_DEFAULT_PORT, d->sname, a);
}

/* ---- the steps before SRV -------------------------------------------------------------------- */

static void explicit_port_addrs(fed_disc *d, const fed_dns_addrs *a, const char *err)
{
    if (!a) {
        fed_disc_fail(d, ATRIUM_E_IO, "the DNS look-up of %s failed: %s", d->host, err);
        return;
    }
    fed_disc_found(d, "explicit-port", d->host, d->port, d->name, a);
}

static void delegated_port_addrs(fed_disc *d, const fed_dns_addrs *a, const char *err)
{
    if (!a) {
        fed_disc_fail(d, ATRIUM_E_IO, "the DNS look-up of %s failed: %s", d->sname, err);
        return;
    }
    fed_disc_found(d, "well-known", d->sname, d->dport, d->delegated, a);
}

/* After .well-known: the delegated name goes through steps 3.1-3.5 (never another
 * .well-known), or the server name's hostname through 4-6. */
static void wk_decided(fed_disc *d, const fed_wk_val *v)
{
    if (!v->delegated) {
        d->delegated[0] = '\0';
        snprintf(d->sname, sizeof d->sname, "%s", d->host);
        srv_begin(d, false);
        return;
    }
    snprintf(d->delegated, sizeof d->delegated, "%s", v->server);
    if (!fed_server_name_split(d->delegated, d->sname, sizeof d->sname, &d->dport)) {
        fed_disc_fail(d, ATRIUM_E_NOTFOUND, "the delegated name %s is invalid", d->delegated);
        return;
    }
    if (fed_host_is_ip_literal(d->sname)) {
        fed_dns_addrs a = {.n = 1};
        snprintf(a.a[0], sizeof a.a[0], "%.63s", d->sname);
        fed_disc_found(d, "well-known", d->sname, d->dport ? d->dport : FED_RESOLVE_DEFAULT_PORT,
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
static void wk_failed(fed_disc *d, int kind, const char *why)
{
    fed_resolver *r = d->r;
    int64_t now = rt_now_ms();
    char key[FED_RESOLVE_NAME_BYTES + 4];
    lower_key(key, sizeof key, "", d->host);
    fed_resolve_cache_ent *prev = fed_resolve_cache_find(&r->wk, key);
    const fed_wk_val *pv = prev ? prev->val : NULL;
    fed_wk_val *v = calloc(1, sizeof *v);
    if (!v) {
        static const fed_wk_val none;
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
    rt_log(kind == WK_ABSENT ? ATRIUM_LOG_DEBUG : ATRIUM_LOG_INFO, "core",
           "federation: no usable /.well-known/matrix/server for %s (%s); %s for %lld s", d->host,
           why, v->delegated ? "keeping the last delegation" : "going on without delegation",
           (long long)(period / 1000));
    fed_wk_val copy = *v;
    fed_resolve_cache_put(&r->wk, key, v, now + period);
    wk_decided(d, &copy);
}

static void wk_fetch(fed_disc *d);

static void wk_on_done(void *arg, const fed_http_result *res)
{
    /* The outbound client's I/O thread: copy, post, wake; nothing else. */
    fed_disc *d = arg;
    fed_resolver *r = d->r;
    fed_resolve_msg *m = &d->wk_msg;
    m->kind = FED_MSG_WK_DONE;
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
    fed_resolve_post(r, m);
}

static bool wk_scheme_allowed(const fed_resolver *r, const char *scheme)
{
    return strcmp(scheme, FED_RESOLVE_WK_SCHEME) == 0 || strcmp(scheme, r->wk_scheme) == 0;
}

void fed_resolve_steps_well_known_answer(fed_disc *d, fed_resolve_msg *m)
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
        wk_failed(d, m->status == 404 ? WK_ABSENT : WK_INVALID, why);
        return;
    }
    fed_wk_val *v = calloc(1, sizeof *v);
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
    fed_wk_val copy = *v;
    fed_resolve_cache_put(&r->wk, key, v, now + period);
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

static void wk_addrs(fed_disc *d, const fed_dns_addrs *a, const char *err)
{
    fed_resolver *r = d->r;
    if (!a) {
        wk_failed(d, WK_DOWN, err);
        return;
    }
    if (a->n == 0) {
        wk_failed(d, WK_ABSENT, "the hostname has no address");
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

static void wk_fetch(fed_disc *d)
{
    addrs_lookup(d, d->wk_url.host, wk_addrs);
}

/* Step 3: the cached .well-known answer, or a fetch. */
static void wk_begin(fed_disc *d)
{
    fed_resolver *r = d->r;
    char key[FED_RESOLVE_NAME_BYTES + 4];
    lower_key(key, sizeof key, "", d->host);
    const fed_wk_val *hit = fed_resolve_cache_get(&r->wk, key, rt_now_ms());
    if (hit) {
        fed_wk_val copy = *hit;
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

void fed_resolve_steps_begin(fed_disc *d)
{
    if (!fed_server_name_split(d->name, d->host, sizeof d->host, &d->port))
        fed_disc_fail(d, ATRIUM_E_INVAL, "not a valid server name");
    else if (d->port)
        addrs_lookup(d, d->host, explicit_port_addrs);
    else
        wk_begin(d);
}
