/*
 * core/client/appservice/as_query.c - asking an application service about a user or a
 * room alias this server does not know (spec v1.13, "Querying"):
 * GET {url}/_matrix/app/v1/users/{userId} and GET {url}/_matrix/app/v1/rooms/{roomAlias},
 * with "Authorization: Bearer <hs_token>". A bridge answers 200 after it made the user
 * (registered it) or the room (created it with that alias), so the caller looks again.
 *
 * The request that needs the answer waits parked (susp_wait) under the outbound budget
 * (ADR-0079), as the ping does (as_module.c): the query goes through the one outbound
 * client, whose callback only records that it ended and wakes the request; the handler then
 * runs again from the top and looks again. No request-pool thread and no database
 * connection waits on the service. Its answer's body is never read: 200 means "look again",
 * anything else (404, 500, garbage, no answer by appservice.request_timeout_ms or the
 * request's own deadline) means the thing stays unknown, and the caller answers as it would
 * have without services (404 M_NOT_FOUND). The progress lives in r->as_query, so a request
 * asks at most once, and a service that answers 200 without making anything cannot loop it.
 *
 * Which service is asked: the first (in file order) with a url whose namespaces claim the
 * ID (exclusive namespaces do not overlap in practice). Only local users and aliases are
 * asked about.
 */
#include <stdio.h>
#include <string.h>

#include "core/client/accounts/accounts.h"
#include "core/client/appservice/appservice.h"
#include "core/client/client.h"
#include "core/federation/transport/fed_request.h"
#include "core/runtime/uri.h"

#define AS_QUERY_MAX_ANSWER_BYTES 4096 /* its body is not read; a larger one is cut */
#define AS_QUERY_URL_BYTES 2048

/* One request's query (r->as_query, in request memory). */
typedef struct as_query {
    bool done; /* the outbound client called back */
    int outcome, status;
} as_query;

static void query_done(void *arg, const fed_response *res)
{
    atrium_req *r = arg;
    as_query *q = r->as_query;
    q->outcome = res->outcome;
    q->status = res->status;
    q->done = true;
    if (res->outcome != FED_HTTP_OK || (res->status != 404 && (res->status < 200 ||
                                                                res->status >= 300)))
        rt_log(ATRIUM_LOG_INFO, "core", "an application service did not answer a query: %s "
               "(status %d)", res->error ? res->error : "no error text", res->status);
    susp_wake(r);
}

/* The service to ask about id (is_user: a user ID, else an alias): the first with a url
 * whose namespaces claim it, or NULL. */
static const as_service *service_claiming(const char *id, bool is_user)
{
    for (size_t i = 0; i < as_count(); i++) {
        const as_service *s = as_at(i);
        if (s->url && (is_user ? as_user_in(s, id) : as_alias_in(s, id))) return s;
    }
    return NULL;
}

/* The ID's server is this one. */
static bool is_local(atrium_req *r, const char *id)
{
    const char *colon = strchr(id, ':');
    return colon && strcmp(colon + 1, r->srv->cfg->server_name) == 0;
}

/* Was r's query asked in an earlier run? Then ATRIUM_CONTINUE (look no further), or
 * ATRIUM_DONE after answering 503 when the server is stopping. -1: not asked yet. */
static int asked_before(atrium_req *r)
{
    if (!r->as_query) return -1;
    /* Its answer is not read here: the run after the deadline may come before it. */
    if (r->run_reason == ATRIUM_RUN_SHUTDOWN)
        return http_respond_error(r, 503, "M_UNKNOWN", "The server is stopping");
    return ATRIUM_CONTINUE;
}

/* Ask svc GET {url}/_matrix/app/v1/{kind}/{id} and park. */
static int ask(atrium_req *r, const as_service *svc, const char *kind, const char *id)
{
    char enc[1024], url[AS_QUERY_URL_BYTES], auth[512];
    size_t ulen = strlen(svc->url);
    while (ulen > 0 && svc->url[ulen - 1] == '/') ulen--;
    int n = rt_uri_encode(id, enc, sizeof(enc))
                ? snprintf(url, sizeof(url), "%.*s/_matrix/app/v1/%s/%s", (int)ulen, svc->url,
                           kind, enc)
                : -1;
    int m = snprintf(auth, sizeof(auth), "Authorization: Bearer %s", svc->hs_token);
    if (n < 0 || (size_t)n >= sizeof(url) || m < 0 || (size_t)m >= sizeof(auth))
        return ATRIUM_CONTINUE; /* not askable: unknown, as without services */
    as_query *q = rt_arena_alloc(r->arena, sizeof(*q));
    if (!q) return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    memset(q, 0, sizeof(*q));
    if (!as_outbound_hold(r)) return ATRIUM_DONE;
    r->as_query = q;
    int64_t deadline = rt_now_ms() + r->srv->cfg->appservice.request_timeout_ms;
    if (r->deadline_ms > 0 && r->deadline_ms < deadline) deadline = r->deadline_ms;
    if (susp_wait(r, deadline + 1000) < 0) /* the outbound deadline answers first */
        return http_respond_error(r, 503, "M_UNKNOWN", "The server is stopping");
    fed_request_opts o = {.method = "GET", .url = url, .url_allow_http = true,
                          .url_header = auth, .operator_destination = true,
                          .deadline_ms = deadline, .max_body_bytes = AS_QUERY_MAX_ANSWER_BYTES,
                          .on_done = query_done, .arg = r};
    if (fed_request_submit(&o) < 0) {
        q->outcome = FED_HTTP_E_INTERNAL;
        q->done = true;
        susp_wake(r); /* runs the handler again at once: unknown */
    }
    return ATRIUM_PARKED;
}

int as_query_alias(atrium_req *r, const char *alias)
{
    if (!as_count() || !alias || !is_local(r, alias)) return ATRIUM_CONTINUE;
    int before = asked_before(r);
    if (before >= 0) return before;
    const as_service *svc = service_claiming(alias, false);
    return svc ? ask(r, svc, "rooms", alias) : ATRIUM_CONTINUE;
}

int as_query_user(atrium_req *r, const char *user_id)
{
    if (!as_count() || !user_id || !is_local(r, user_id)) return ATRIUM_CONTINUE;
    int before = asked_before(r);
    if (before >= 0) return before;
    const as_service *svc = service_claiming(user_id, true);
    if (!svc || strcmp(user_id, svc->sender) == 0) return ATRIUM_CONTINUE;
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    const char *p[1] = {user_id};
    PGresult *res = acc_q(c, "SELECT 1 FROM users WHERE user_id = $1", 1, p);
    http_db_checkin(c);
    if (!res) {
        acc_db_failed(r);
        return ATRIUM_DONE;
    }
    bool known = PQntuples(res) > 0;
    PQclear(res);
    return known ? ATRIUM_CONTINUE : ask(r, svc, "users", user_id);
}
