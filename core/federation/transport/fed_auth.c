/*
 * core/federation/transport/fed_auth.c - the check that runs before every federation handler: the
 * request's X-Matrix signature (the server-server API, "Request Authentication").
 *
 * Order of the checks, each refusal logged with the check's name so an operator can tell a
 * misconfigured peer from an attack: an X-Matrix Authorization header that parses; a
 * destination naming this server (an absent one is accepted, as older servers send none);
 * an origin that is a server name, is not this server and is allowed by
 * federation.domain_whitelist (403 M_FORBIDDEN otherwise); a JSON body when there is a
 * body; the origin's key, valid now; the signature over method, URI (path and query as
 * sent), origin, destination and content (the content as this server encodes it in
 * canonical JSON or, failing that, the body's bytes as sent: fed_xmatrix_verify_raw).
 * Refusals are 401 M_UNAUTHORIZED, except bad
 * input rather than bad credentials, which is 400 as Synapse answers it: an origin that
 * is not a server name (M_UNAUTHORIZED, Synapse's "Malformed Authorization header"), a
 * body that is not JSON (M_NOT_JSON) or not a JSON object (M_BAD_JSON). "Not JSON"
 * includes what jansson refuses (invalid UTF-8, a \u0000, a lone surrogate, an integer
 * beyond 64 bits, NaN, nesting past its depth limit) and an object with a key twice: what
 * the origin signed (and hashed, for the PDUs inside) would depend on which of the two a
 * parser keeps, so such a body is refused whole rather than read one way here and another
 * elsewhere.
 *
 * A key not yet known is fetched (fed_keyring.h) while the request waits parked on the
 * module's key event, holding no thread; every end of a look-up signals that event and
 * the waiting requests run again from the top, now finding the key in the cache (or its
 * failure, remembered briefly). Only then does a handler see the request, with
 * r->origin set to the verified server.
 *
 * A verified request also says its origin is up: a backoff this server keeps for it is
 * forgotten and the sender woken (server_up), so what is queued for it goes now and a
 * request the handler makes back to it (an auth event the origin's PDU names) is not
 * refused by our own backoff. Synapse does the same; a server coming back from an
 * outage is otherwise left alone for its whole backoff, with its events for us failing.
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "core/federation/transport/fed_internal.h"
#include "core/federation/transport/fed_txn.h"

enum fed_auth_reason {
    FED_AUTH_MISSING = 0,
    FED_AUTH_MALFORMED,
    FED_AUTH_DESTINATION,
    FED_AUTH_NOT_ALLOWED,
    FED_AUTH_BODY,
    FED_AUTH_UNKNOWN_KEY,
    FED_AUTH_EXPIRED_KEY,
    FED_AUTH_BAD_SIGNATURE,
    FED_AUTH__COUNT
};

static const char *const REASON_NAMES[FED_AUTH__COUNT] = {
    "missing", "malformed", "destination", "not_allowed", "body", "unknown_key", "expired_key",
    "bad_signature"};

void fed_auth_metrics(fed_module *m)
{
    m->m_auth_ok = rt_metric_counter(m->metrics, "atrium_federation_inbound_verified_total", NULL,
                                     "Federation requests whose X-Matrix signature verified");
    for (int i = 0; i < FED_AUTH__COUNT; i++) {
        char labels[48];
        snprintf(labels, sizeof(labels), "reason=\"%s\"", REASON_NAMES[i]);
        m->m_auth_refused[i] =
            rt_metric_counter(m->metrics, "atrium_federation_inbound_refused_total", labels,
                              "Federation requests refused before their handler, by failed check");
    }
}

static int refuse(atrium_req *r, int reason, const char *origin, const char *detail)
{
    fed_module *m = fed_state();
    rt_metric_add(m->m_auth_refused[reason], 1);
    rt_log(ATRIUM_LOG_WARN, "federation", "%s %s from %s refused (check %s): %s", r->method,
           r->raw_path, origin ? origin : r->client_addr, REASON_NAMES[reason], detail);
    if (reason == FED_AUTH_NOT_ALLOWED)
        return http_respond_error(r, 403, "M_FORBIDDEN", "Federation with %s is not allowed",
                                  origin ? origin : "this server");
    return http_respond_error(r, 401, "M_UNAUTHORIZED", "%s", detail);
}

/* A refusal for bad input rather than bad credentials: 400 with errcode (counted and
 * logged as refuse does). */
static int refuse_bad_input(atrium_req *r, int reason, const char *origin, const char *errcode,
                            const char *detail)
{
    fed_module *m = fed_state();
    rt_metric_add(m->m_auth_refused[reason], 1);
    rt_log(ATRIUM_LOG_WARN, "federation", "%s %s from %s refused (check %s): %s", r->method,
           r->raw_path, origin ? origin : r->client_addr, REASON_NAMES[reason], detail);
    return http_respond_error(r, 400, errcode, "%s", detail);
}

/* The first X-Matrix credential among the Authorization headers. */
static const char *xmatrix_header(atrium_req *r)
{
    for (size_t i = 0; i < r->n_headers; i++)
        if (strcasecmp(r->headers[i].name, "Authorization") == 0 &&
            strncasecmp(r->headers[i].value, "X-Matrix ", 9) == 0)
            return r->headers[i].value;
    return NULL;
}

/* The request's own state across its runs: the key look-up's answer. */
typedef struct fed_auth_state {
    fed_waiter w;
    fed_key_result res;
} fed_auth_state;

/* A pending key look-up ended (on the ring's or the outbound client's thread). */
static void key_looked_up(void *arg, const fed_key_result *res)
{
    fed_auth_state *st = arg;
    atrium_req *r = st->w.r;
    st->res = *res;
    fed_waiter_done(&st->w);
    http_req_unref(r);
}

static void ignore_result(void *arg, const fed_key_result *res)
{
    (void)arg;
    (void)res;
}

/* After a refusal: does the ring hold the key with any validity at all? Then it is known
 * but past its validity, which the log should say. Answered from memory. */
/* origin just proved it answers: forget its backoff and, when it had one, wake the
 * sender (its queue waited for that backoff). */
static void server_up(fed_module *m, const char *origin)
{
    if (m->backoff && fed_backoff_success(m->backoff, origin)) {
        rt_log(ATRIUM_LOG_INFO, "federation", "%s sent a signed request: its backoff is "
               "cleared", origin);
        fed_outbound_kick();
    }
}

static bool key_known_but_expired(fed_module *m, const fed_xmatrix *x)
{
    fed_key_result res;
    int rc = fed_keyring_lookup(m->keyring, x->origin, x->key, 0, &res, ignore_result, NULL);
    return rc == FED_KEYRING_ANSWERED && res.status == FED_KEY_FOUND;
}

static int park_for_key(atrium_req *r, fed_auth_state *st)
{
    int rc = fed_waiter_park(&st->w, r, r->deadline_ms);
    if (rc < 0) return http_respond_error(r, 503, "M_UNKNOWN", "The server is stopping");
    return ATRIUM_PARKED;
}

int fed_waiter_park(fed_waiter *w, atrium_req *r, int64_t deadline_ms)
{
    int rc = susp_wait(r, deadline_ms);
    if (rc < 0) return rc; /* the callback will find IDLE and wake nobody */
    if (atomic_exchange(&w->state, FED_WAITER_PARKED) == FED_WAITER_DONE) {
        atomic_store(&w->state, FED_WAITER_DONE);
        susp_wake(r); /* it answered before we parked: run again now */
    }
    return 0;
}

void fed_waiter_done(fed_waiter *w)
{
    if (atomic_exchange(&w->state, FED_WAITER_DONE) == FED_WAITER_PARKED) susp_wake(w->r);
}

int fed_auth_check(atrium_req *r)
{
    fed_module *m = fed_state();
    const char *hdr = xmatrix_header(r);
    if (!hdr) return refuse(r, FED_AUTH_MISSING, NULL, "No X-Matrix Authorization header");
    fed_xmatrix x;
    char why[256];
    if (fed_xmatrix_parse(hdr, &x, why, sizeof(why)) < 0)
        return refuse(r, FED_AUTH_MALFORMED, NULL, why);
    if (x.destination[0] && strcmp(x.destination, m->server_name) != 0) {
        snprintf(why, sizeof(why), "The request is for %.128s, not this server", x.destination);
        return refuse(r, FED_AUTH_DESTINATION, x.origin, why);
    }
    char host[FED_RESOLVE_NAME_BYTES];
    int port;
    if (!fed_server_name_split(x.origin, host, sizeof(host), &port))
        return refuse_bad_input(r, FED_AUTH_MALFORMED, NULL, "M_UNAUTHORIZED",
                                "The origin is not a server name");
    if (strcmp(x.origin, m->server_name) == 0)
        return refuse(r, FED_AUTH_NOT_ALLOWED, x.origin, "A request claiming to be from us");
    if (!fed_domain_allowed(x.origin))
        return refuse(r, FED_AUTH_NOT_ALLOWED, x.origin, "not in federation.domain_whitelist");
    json_t *content = NULL;
    if (r->body_len > 0) {
        json_error_t jerr;
        if (!r->json) r->json = json_loadb(r->body, r->body_len, JSON_REJECT_DUPLICATES, &jerr);
        if (!r->json)
            return refuse_bad_input(r, FED_AUTH_BODY, x.origin, "M_NOT_JSON",
                                    "The body is not JSON");
        if (!json_is_object(r->json))
            return refuse_bad_input(r, FED_AUTH_BODY, x.origin, "M_BAD_JSON",
                                    "The body is not a JSON object");
        content = r->json;
    }

    /* The origin's key: from the ring's memory at once, or fetched while the request
     * waits parked (no thread). A re-run after the wait finds the answer in its state. */
    fed_auth_state *st = r->core_state;
    if (!st) {
        st = rt_arena_alloc(r->arena, sizeof(*st));
        if (!st) return ATRIUM_E_NOMEM;
        r->core_state = st;
        http_req_ref(r); /* the look-up callback's */
        st->w.r = r;
        int lr = fed_keyring_lookup(m->keyring, x.origin, x.key, rt_wall_ms(), &st->res,
                                    key_looked_up, st);
        if (lr == FED_KEYRING_PENDING) return park_for_key(r, st);
        http_req_unref(r); /* answered now: no callback */
        atomic_store(&st->w.state, FED_WAITER_DONE);
    } else if (atomic_load(&st->w.state) != FED_WAITER_DONE) {
        if (r->run_reason == ATRIUM_RUN_SHUTDOWN)
            return http_respond_error(r, 503, "M_UNKNOWN", "The server is stopping");
        return refuse(r, FED_AUTH_UNKNOWN_KEY, x.origin,
                      "The origin's key could not be fetched in time");
    }
    if (st->res.status != FED_KEY_FOUND) {
        return refuse(r, key_known_but_expired(m, &x) ? FED_AUTH_EXPIRED_KEY
                                                      : FED_AUTH_UNKNOWN_KEY,
                      x.origin, st->res.error);
    }
    if (st->res.key.old) /* a rotated-out key still verifies events, never a request */
        return refuse(r, FED_AUTH_EXPIRED_KEY, x.origin,
                      "The key is one the origin retired (old_verify_keys): it signs no "
                      "requests");
    const unsigned char *pub = st->res.key.public_key;

    char uri[8192];
    int n = snprintf(uri, sizeof(uri), "%s%s%s", r->raw_path, r->raw_query[0] ? "?" : "",
                     r->raw_query);
    if (n < 0 || (size_t)n >= sizeof(uri))
        return refuse(r, FED_AUTH_MALFORMED, x.origin, "The request URI is too long");
    int vr = fed_xmatrix_verify(r->method, uri, m->server_name, content, &x, pub, why,
                                sizeof(why));
    /* A body with no canonical encoding here (an integer past 2^53, a real) is checked
     * over its bytes as sent, so that its PDUs are judged one by one, not the whole
     * transaction refused (fed_xmatrix_verify_raw). */
    if (vr < 0 && vr != FED_XMATRIX_E_DESTINATION && content &&
        fed_xmatrix_verify_raw(r->method, uri, m->server_name, r->body, r->body_len, &x, pub,
                               NULL, 0) == 0)
        vr = 0;
    if (vr < 0) return refuse(r, FED_AUTH_BAD_SIGNATURE, x.origin, why);
    r->origin = rt_arena_strdup(r->arena, x.origin);
    if (!r->origin) return ATRIUM_E_NOMEM;
    /* The core's slot was only borrowed for the key wait: the handler's from now on (a
     * core handler's core_state starts out NULL). The memory is the request's arena's. */
    r->core_state = NULL;
    rt_metric_add(m->m_auth_ok, 1);
    server_up(m, r->origin);
    return 0;
}

int fed_auth_unknown_path(atrium_req *r)
{
    return http_respond_error(r, 404, "M_UNRECOGNIZED", "Unrecognized request");
}
