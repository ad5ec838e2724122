/*
 * core/http/request.c - the request object: its arena, what it carries (method, path,
 * parameters, headers, query, body, client key), its holds, and running its handler
 * inside the request's scopes.
 *
 * A request lives from libmicrohttpd's first call for it to the request-completed
 * callback, plus as long as a pool task or the deadline timer still holds a reference.
 * Everything a handler reads is copied into the arena when the request arrives, so any
 * thread that owns the request can read it without touching libmicrohttpd. Holds are the
 * one place where resources tied to a request are given back: exactly once, at the end.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/http/http.h"

/* A request's arena comes in chunks of this size (2,032 bytes with the chunk's own header:
 * a 2 KiB malloc chunk). A parked /sync keeps its first chunk for as long as it waits, all
 * of it resident (malloc hands out memory the handlers touched before): 8 KiB chunks cost
 * about 6.4 KiB per parked request, these 2 KiB, and a parked /sync fits one
 * (docs/performance.md, 'Parked long-polls'). */
#define REQ_ARENA_CHUNK_BYTES 2000
/* Reset arenas kept for the next requests, instead of an 8 KiB malloc and free per
 * request (too big for malloc's per-thread cache: it showed in the profile of every
 * request). A thread uses one slot, picked once; with more threads than slots, some
 * share one. A global array, so what it keeps at exit is still reachable. Not under
 * AddressSanitizer, which should see request memory freed to catch late uses of it. */
#if defined(__SANITIZE_ADDRESS__)
#define REQ_SPARE_ARENAS 0
#else
#define REQ_SPARE_ARENAS 16
#endif

static atomic_ulong next_request_id = 1;

typedef struct kv_collect {
    atrium_req *r;
    http_kv *items;
    size_t n, cap;
    size_t expected; /* libmicrohttpd's count of them: the first array's size */
    bool decode;
} kv_collect;

static enum MHD_Result collect_kv(void *cls, enum MHD_ValueKind kind, const char *key,
                                  const char *value)
{
    (void)kind;
    kv_collect *k = cls;
    if (k->n == k->cap) {
        size_t cap = k->cap ? k->cap * 2 : k->expected ? k->expected : 16;
        http_kv *n = rt_arena_alloc(k->r->arena, cap * sizeof(*n));
        if (!n) return MHD_NO;
        if (k->n) memcpy(n, k->items, k->n * sizeof(*n));
        k->items = n;
        k->cap = cap;
    }
    char *name = rt_arena_strdup(k->r->arena, key ? key : "");
    char *val = rt_arena_strdup(k->r->arena, value ? value : "");
    if (!name || !val) return MHD_NO;
    if (k->decode) {
        /* The name as sent, for the error message when it is printable text itself. */
        const char *raw = k->r->invalid_arg || !http_utf8_valid(name)
                              ? NULL : rt_arena_strdup(k->r->arena, name);
        if (!http_decode_text(name) || !http_decode_text(val)) {
            if (!k->r->invalid_arg) k->r->invalid_arg = raw ? raw : "?";
            return MHD_YES; /* refused with 400 before any handler reads the query */
        }
    }
    k->items[k->n].name = name;
    k->items[k->n].value = val;
    k->n++;
    return MHD_YES;
}

/* The query string as the client sent it, rebuilt from libmicrohttpd's split (its unescape
 * callback is a no-op, so keys and values are still encoded): X-Matrix signs it verbatim. */
typedef struct raw_query {
    atrium_req *r;
    char *buf;
    size_t len, cap;
    size_t expected; /* its length with the terminator, measured first: the buffer's size */
    bool failed;
} raw_query;

static void raw_query_put(raw_query *q, const char *s, size_t n)
{
    if (q->failed) return;
    if (q->len + n + 1 > q->cap) {
        size_t cap = q->cap ? q->cap * 2 : q->expected ? q->expected : 256;
        while (cap < q->len + n + 1) cap *= 2;
        char *b = rt_arena_alloc(q->r->arena, cap);
        if (!b) {
            q->failed = true;
            return;
        }
        if (q->len) memcpy(b, q->buf, q->len);
        q->buf = b;
        q->cap = cap;
    }
    memcpy(q->buf + q->len, s, n);
    q->len += n;
    q->buf[q->len] = '\0';
}

/* What collect_raw_query will write for one parameter: its '&' (or, for the first, the
 * terminator), key, '=' and value. */
static enum MHD_Result measure_raw_query(void *cls, enum MHD_ValueKind kind, const char *key,
                                         const char *value)
{
    (void)kind;
    raw_query *q = cls;
    q->expected += 1 + (key ? strlen(key) : 0) + (value ? 1 + strlen(value) : 0);
    return MHD_YES;
}

static size_t count_values(struct MHD_Connection *c, enum MHD_ValueKind kind)
{
    int n = MHD_get_connection_values(c, kind, NULL, NULL);
    return n > 0 ? (size_t)n : 0;
}

static enum MHD_Result collect_raw_query(void *cls, enum MHD_ValueKind kind, const char *key,
                                         const char *value)
{
    (void)kind;
    raw_query *q = cls;
    if (q->len) raw_query_put(q, "&", 1);
    raw_query_put(q, key ? key : "", key ? strlen(key) : 0);
    if (value) {
        raw_query_put(q, "=", 1);
        raw_query_put(q, value, strlen(value));
    }
    return MHD_YES;
}

/* Dotted-quad text of 4 address bytes, as inet_ntop writes it (it formats with sprintf,
 * which showed in the profile of every request). */
static void ipv4_text(const unsigned char *b, char *out)
{
    for (int i = 0; i < 4; i++) {
        unsigned v = b[i];
        if (v >= 100) *out++ = (char)('0' + v / 100);
        if (v >= 10) *out++ = (char)('0' + v / 10 % 10);
        *out++ = (char)('0' + v % 10);
        *out++ = i < 3 ? '.' : '\0';
    }
}

static const char *addr_to_string(rt_arena *a, const struct sockaddr *sa)
{
    char buf[INET6_ADDRSTRLEN] = "unknown";
    if (sa && sa->sa_family == AF_INET) {
        ipv4_text((const unsigned char *)&((const struct sockaddr_in *)sa)->sin_addr, buf);
    } else if (sa && sa->sa_family == AF_INET6) {
        const struct in6_addr *a6 = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(a6)) ipv4_text(&a6->s6_addr[12], buf);
        else inet_ntop(AF_INET6, a6, buf, sizeof(buf));
    }
    return rt_arena_strdup(a, buf);
}

bool http_addr_in_list(const char *addr, const char **list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(addr, list[i]) == 0) return true;
    return false;
}

/* The client's address: the peer's, or, when the peer is a trusted proxy, the rightmost
 * X-Forwarded-For entry that is not itself a trusted proxy. */
static const char *client_address(atrium_req *r, const char *peer)
{
    const struct core_config *cfg = r->srv->cfg;
    if (!http_addr_in_list(peer, cfg->http.trusted_proxies, cfg->http.n_trusted_proxies))
        return peer;
    const char *xff = http_req_header(r, "X-Forwarded-For");
    if (!xff) return peer;
    char *copy = rt_arena_strdup(r->arena, xff);
    if (!copy) return peer;
    const char *chosen = peer;
    for (;;) {
        char *comma = strrchr(copy, ',');
        char *item = comma ? comma + 1 : copy;
        while (*item == ' ' || *item == '\t') item++;
        size_t len = strlen(item);
        while (len && (item[len - 1] == ' ' || item[len - 1] == '\t')) item[--len] = '\0';
        if (len) {
            chosen = item;
            if (!http_addr_in_list(item, cfg->http.trusted_proxies,
                                   cfg->http.n_trusted_proxies))
                break;
        }
        if (!comma) break;
        *comma = '\0';
    }
    return chosen;
}

#if REQ_SPARE_ARENAS > 0
static _Atomic(rt_arena *) spare_arenas[REQ_SPARE_ARENAS];
static atomic_uint next_spare_slot;
static _Thread_local int spare_slot = -1;

static _Atomic(rt_arena *) *my_spare(void)
{
    if (spare_slot < 0) spare_slot = (int)(atomic_fetch_add(&next_spare_slot, 1) % REQ_SPARE_ARENAS);
    return &spare_arenas[spare_slot];
}
#endif

/* An arena for a new request: this thread's spare one, else a new one. */
static rt_arena *arena_take(void)
{
#if REQ_SPARE_ARENAS > 0
    rt_arena *a = atomic_exchange(my_spare(), NULL);
    if (a) return a;
#endif
    return rt_arena_new(REQ_ARENA_CHUNK_BYTES);
}

/* A request's arena when it is freed: kept as this thread's spare if its slot is empty. */
static void arena_give(rt_arena *a)
{
#if REQ_SPARE_ARENAS > 0
    rt_arena_reset(a);
    rt_arena *none = NULL;
    if (rt_arena_usable(a) && atomic_compare_exchange_strong(my_spare(), &none, a)) return;
#endif
    rt_arena_free(a);
}

/* A request's ID as lowercase hex of at least 6 digits (printf's "%06lx", without
 * printf: this runs for every request). out holds 17 bytes. */
static void request_id_text(unsigned long n, char *out)
{
    char digits[16];
    int len = 0;
    do {
        digits[len++] = "0123456789abcdef"[n & 0xf];
        n >>= 4;
    } while (n && len < 16);
    while (len < 6) digits[len++] = '0';
    for (int i = 0; i < len; i++) out[i] = digits[len - 1 - i];
    out[len] = '\0';
}

atrium_req *http_req_new(http_server *s, struct MHD_Connection *c, const char *method,
                         const char *raw_url, int listener)
{
    rt_arena *arena = arena_take();
    if (!arena) return NULL;
    atrium_req *r = rt_arena_alloc(arena, sizeof(*r));
    if (!r) {
        arena_give(arena);
        return NULL;
    }
    r->srv = s;
    r->conn = c;
    r->listener = listener;
    r->arena = arena;
    atomic_init(&r->refs, 1);
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_init(&r->holds_mu, NULL);
    request_id_text((unsigned long)atomic_fetch_add(&next_request_id, 1), r->id);
    r->method = rt_arena_strdup(arena, method);
    r->raw_path = rt_arena_strdup(arena, raw_url);
    char *path = rt_arena_strdup(arena, raw_url);
    if (!r->method || !r->raw_path || !path) {
        http_req_unref(r);
        return NULL;
    }
    if (!http_percent_decode(path)) path = rt_arena_strdup(arena, raw_url);
    r->path = path;
    r->heap_idx = SIZE_MAX;
    r->sock_fd = -1;
    r->start_ms = rt_now_ms();
    r->deadline_ms = r->start_ms + s->cfg->http.handoff_deadline_ms;

    /* Arrays of the exact size (counted first): they stay as long as the request, a parked
     * one included. */
    kv_collect h = {.r = r, .expected = count_values(c, MHD_HEADER_KIND)};
    MHD_get_connection_values(c, MHD_HEADER_KIND, collect_kv, &h);
    r->headers = h.items;
    r->n_headers = h.n;
    kv_collect q = {.r = r, .decode = true, .expected = count_values(c, MHD_GET_ARGUMENT_KIND)};
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, collect_kv, &q);
    r->args = q.items;
    r->n_args = q.n;
    raw_query rq = {.r = r};
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, measure_raw_query, &rq);
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, collect_raw_query, &rq);
    r->raw_query = rq.buf && !rq.failed ? rq.buf : "";

    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    const char *peer = addr_to_string(arena, ci ? ci->client_addr : NULL);
    r->client_addr = client_address(r, peer ? peer : "unknown");
    ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci) r->sock_fd = ci->connect_fd;
    return r;
}

void http_req_ref(atrium_req *r)
{
    atomic_fetch_add(&r->refs, 1);
}

void http_req_unref(atrium_req *r)
{
    if (atomic_fetch_sub(&r->refs, 1) != 1) return;
    if (r->on_free) r->on_free(r->on_free_arg);
    if (r->response) MHD_destroy_response(r->response);
    if (r->resume_response) MHD_destroy_response(r->resume_response);
    if (r->json) json_decref(r->json);
    free(r->body);
    pthread_mutex_destroy(&r->mu);
    pthread_mutex_destroy(&r->holds_mu);
    arena_give(r->arena);
}

void http_req_on_free(atrium_req *r, void (*fn)(void *), void *arg)
{
    r->on_free = fn;
    r->on_free_arg = arg;
}

static int add_hold(atrium_req *r, void (*release)(void *), void *arg, bool until_answer)
{
    pthread_mutex_lock(&r->holds_mu);
    if (r->completed) {
        pthread_mutex_unlock(&r->holds_mu);
        release(arg);
        return ATRIUM_E_EXPIRED;
    }
    http_hold *h = malloc(sizeof(*h));
    if (!h) {
        pthread_mutex_unlock(&r->holds_mu);
        release(arg);
        return ATRIUM_E_NOMEM;
    }
    h->release = release;
    h->arg = arg;
    h->until_answer = until_answer;
    h->next = r->holds;
    r->holds = h;
    rt_metric_add(r->srv->m_holds, 1);
    pthread_mutex_unlock(&r->holds_mu);
    return 0;
}

int http_req_add_hold(atrium_req *r, void (*release)(void *), void *arg)
{
    return add_hold(r, release, arg, false);
}

int http_req_add_answer_hold(atrium_req *r, void (*release)(void *), void *arg)
{
    return add_hold(r, release, arg, true);
}

static void release_list(atrium_req *r, http_hold *h);

/* Unlink r's answer holds (under holds_mu) and return them as a list. */
static http_hold *take_answer_holds(atrium_req *r)
{
    http_hold *taken = NULL, **p = &r->holds;
    while (*p) {
        http_hold *h = *p;
        if (h->until_answer) {
            *p = h->next;
            h->next = taken;
            taken = h;
        } else {
            p = &h->next;
        }
    }
    return taken;
}

void http_req_answered(atrium_req *r)
{
    pthread_mutex_lock(&r->holds_mu);
    http_hold *h = NULL;
    if (r->on_pool) r->answer_deferred = true; /* the deadline answered a running handler */
    else h = take_answer_holds(r);
    pthread_mutex_unlock(&r->holds_mu);
    release_list(r, h);
}

void http_req_release_holds(atrium_req *r)
{
    pthread_mutex_lock(&r->holds_mu);
    r->completed = true;
    if (r->on_pool) { /* never under a running handler: its pool thread releases them */
        r->holds_deferred = true;
        pthread_mutex_unlock(&r->holds_mu);
        return;
    }
    http_hold *h = r->holds;
    r->holds = NULL;
    pthread_mutex_unlock(&r->holds_mu);
    release_list(r, h);
}

bool http_req_pool_run_begin(atrium_req *r)
{
    pthread_mutex_lock(&r->holds_mu);
    bool live = !r->completed;
    if (live) r->on_pool++;
    pthread_mutex_unlock(&r->holds_mu);
    return live;
}

void http_req_pool_run_end(atrium_req *r)
{
    pthread_mutex_lock(&r->holds_mu);
    r->on_pool--;
    http_hold *h = NULL;
    if (r->on_pool == 0 && r->holds_deferred) {
        r->holds_deferred = false;
        r->answer_deferred = false;
        h = r->holds;
        r->holds = NULL;
    } else if (r->on_pool == 0 && r->answer_deferred) {
        r->answer_deferred = false;
        h = take_answer_holds(r);
    }
    pthread_mutex_unlock(&r->holds_mu);
    release_list(r, h);
}

static void release_list(atrium_req *r, http_hold *h)
{
    while (h) { /* newest first: reverse order of acquisition */
        http_hold *next = h->next;
        h->release(h->arg);
        rt_metric_add(r->srv->m_holds, -1);
        free(h);
        h = next;
    }
}

const char *http_req_param(atrium_req *r, const char *name)
{
    for (size_t i = 0; i < r->n_params; i++)
        if (strcmp(r->param_names[i], name) == 0) return r->param_values[i];
    return NULL;
}

const char *http_req_query(atrium_req *r, const char *name)
{
    for (size_t i = 0; i < r->n_args; i++) /* the first occurrence wins */
        if (strcmp(r->args[i].name, name) == 0) return r->args[i].value;
    return NULL;
}

const char *http_req_header(atrium_req *r, const char *name)
{
    for (size_t i = 0; i < r->n_headers; i++)
        if (strcasecmp(r->headers[i].name, name) == 0) return r->headers[i].value;
    return NULL;
}

const char *http_req_client_key(atrium_req *r)
{
    return r->user ? r->user : r->client_addr;
}

json_t *http_req_json(atrium_req *r)
{
    if (r->json) return r->json;
    json_error_t jerr;
    json_t *j = r->body_len ? json_loadb(r->body, r->body_len, 0, &jerr) : NULL;
    if (!j || !json_is_object(j)) {
        if (j) json_decref(j);
        http_respond_error(r, 400, "M_NOT_JSON", "The body is not a JSON object");
        return NULL;
    }
    r->json = j;
    return j;
}

int64_t http_req_ratelimit(atrium_req *r, rt_ratelimit *rl)
{
    if (!r->srv->ratelimit_enabled || rt_scope_get(ATRIUM_SCOPE_RATE_ADMITTED)) return 0;
    for (int i = 0; i < r->n_rl_counted; i++)
        if (r->rl_counted[i] == rl) return 0; /* a re-run is not counted twice */
    int64_t wait = rt_ratelimit_check(rl, http_req_client_key(r), rt_now_ms());
    if (wait == 0 && r->n_rl_counted < HTTP_MAX_RATELIMITS_PER_REQ)
        r->rl_counted[r->n_rl_counted++] = rl;
    return wait;
}

int http_req_run(atrium_req *r)
{
    RT_SCOPE(ATRIUM_SCOPE_REQUEST, r);
    RT_SCOPE(ATRIUM_SCOPE_REQUEST_ID, r->id);
    RT_SCOPE(ATRIUM_SCOPE_CLIENT_KEY, http_req_client_key(r));
    RT_SCOPE(ATRIUM_SCOPE_DEADLINE, (intptr_t)r->deadline_ms);
    RT_SCOPE(ATRIUM_SCOPE_USER, r->user);
    /* Values carried by a handoff, published only on the pool that received it. */
    rt_scope_frame frames[HTTP_MAX_HANDOFF_VALUES];
    size_t pushed = 0;
    if (r->run_reason == ATRIUM_RUN_HANDOFF) {
        for (; pushed < r->n_hvals; pushed++)
            rt_scope_push(&frames[pushed], r->hvals[pushed].key, r->hvals[pushed].value);
    }
    r->runs++;
    const route_entry *route = r->route;
    int rc;
    /* Federation routes: the signature is checked before the handler sees anything. The
     * check either sets r->origin, or answers (a refusal) or parks (a key is on its way:
     * the request runs again when it lands). */
    if ((route->route.flags & ATRIUM_ROUTE_FEDERATION) && !r->origin) {
        rc = r->srv->fed_auth ? r->srv->fed_auth(r)
                              : http_respond_error(r, 404, "M_UNRECOGNIZED",
                                                   "Federation is not served here");
        if (!r->origin) goto out;
    }
    rc = route->route.handler(r);
out:
    /* From here r may belong to another thread (parked, handed off): only the stack. */
    while (pushed) rt_scope_pop(&frames[--pushed]);
    return rc;
}
