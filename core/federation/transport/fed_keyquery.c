/*
 * core/federation/transport/fed_keyquery.c - this server as a notary: GET /_matrix/key/v2/query/
 * {serverName} and POST /_matrix/key/v2/query answer with other servers' key documents,
 * each carrying our signature besides its origin's.
 *
 * The key ring (fed_keyring.h) does the work: it answers from its cache, or fetches from
 * the origin on a miss, and signs what it serves. While it fetches, the request waits
 * parked (fed_waiter), holding no thread. Queries for our own name get our own key
 * document. A query for more than FED_NOTARY_CRITERIA_MAX keys is refused (400).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/federation/transport/fed_internal.h"
#include "atrium/parse.h"

typedef struct notary_state {
    fed_waiter w;
    json_t *response; /* the ring's answer, owned here until sent */
} notary_state;

static void notary_state_free(void *arg)
{
    notary_state *st = arg;
    if (st->response) json_decref(st->response);
}

static void notary_answered(void *arg, json_t *response)
{
    notary_state *st = arg;
    atrium_req *r = st->w.r;
    st->response = response;
    fed_waiter_done(&st->w);
    http_req_unref(r);
}

static int answer(atrium_req *r, notary_state *st)
{
    json_t *body = st->response;
    st->response = NULL;
    return http_respond_json(r, 200, body);
}

/* Run (or resume) a query for the criteria. */
static int query(atrium_req *r, const fed_notary_criterion *criteria, size_t n)
{
    fed_module *m = fed_state();
    notary_state *st = r->core_state;
    if (st) {
        if (atomic_load(&st->w.state) == FED_WAITER_DONE) return answer(r, st);
        if (r->run_reason == ATRIUM_RUN_SHUTDOWN)
            return http_respond_error(r, 503, "M_UNKNOWN", "The server is stopping");
        return http_respond_error(r, 504, "M_UNKNOWN", "The key servers did not answer in time");
    }
    st = rt_arena_alloc(r->arena, sizeof(*st));
    if (!st) return ATRIUM_E_NOMEM;
    r->core_state = st;
    st->w.r = r;
    http_req_on_free(r, notary_state_free, st);
    json_t *own = fed_own_key_document(m);
    http_req_ref(r); /* the callback's */
    int rc = fed_notary_query(m->keyring, criteria, n, m->server_name, &m->key, own,
                                      &st->response, notary_answered, st);
    if (own) json_decref(own);
    if (rc != FED_KEYRING_PENDING) {
        http_req_unref(r);
        return answer(r, st);
    }
    if (fed_waiter_park(&st->w, r, r->deadline_ms) < 0)
        return http_respond_error(r, 503, "M_UNKNOWN", "The server is stopping");
    return ATRIUM_PARKED;
}

/* minimum_valid_until_ts of the query string, or now. -1 when malformed. */
static int64_t minimum_valid_until(atrium_req *r)
{
    const char *v = http_req_query(r, "minimum_valid_until_ts");
    if (!v || !*v) return rt_wall_ms();
    int64_t n;
    return atrium_parse_int64(v, 0, INT64_MAX, &n) == 0 ? n : -1;
}

/* GET /_matrix/key/v2/query/{serverName}[/{keyId}] */
static int get_query(atrium_req *r)
{
    const char *server = http_req_param(r, "serverName");
    fed_notary_criterion c = {.server_name = server, .key_id = http_req_param(r, "keyId"),
                              .minimum_valid_until_ms = minimum_valid_until(r)};
    char host[FED_RESOLVE_NAME_BYTES];
    int port;
    if (!server || !fed_server_name_split(server, host, sizeof(host), &port))
        return http_respond_error(r, 400, "M_INVALID_PARAM", "Not a server name");
    if (c.minimum_valid_until_ms < 0)
        return http_respond_error(r, 400, "M_INVALID_PARAM",
                                  "minimum_valid_until_ts must be a non-negative integer");
    return query(r, &c, 1);
}

/* POST /_matrix/key/v2/query */
static int post_query(atrium_req *r)
{
    json_t *body = http_req_json(r);
    if (!body) return ATRIUM_DONE;
    fed_notary_criterion c[FED_NOTARY_CRITERIA_MAX];
    char why[256];
    int n = fed_notary_query_parse(body, rt_wall_ms(), c, why, sizeof(why));
    if (n < 0) return http_respond_error(r, 400, "M_BAD_JSON", "%s", why);
    return query(r, c, (size_t)n);
}

int fed_keyquery_routes(fed_module *m)
{
    static const atrium_route routes[] = {
        {.method = "GET", .path = "/_matrix/key/v2/query/{serverName}", .handler = get_query},
        {.method = "GET", .path = "/_matrix/key/v2/query/{serverName}/{keyId}",
         .handler = get_query},
        {.method = "POST", .path = "/_matrix/key/v2/query", .handler = post_query},
    };
    if (HTTP_ROUTES_ADD(m->srv, routes, "federation") < 0) return -1;
    return 0;
}
