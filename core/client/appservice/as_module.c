/*
 * core/client/appservice/as_module.c - the application services module: its tables, the
 * registry loaded at start-up (as_registry.c), each service's sender user made if missing,
 * the transaction sender (as_sender.c), acting as a service (as_authenticate, called by
 * auth_request for an as_token), and the client routes that belong to services:
 * POST /_matrix/client/v1/appservice/{appserviceId}/ping (the third-party endpoints are
 * as_thirdparty.c's).
 *
 * The registry is loaded by core/main.c with the configuration, before this module's init.
 * The ping waits for the service parked (susp_wait), holding no request-pool thread: the
 * outbound client's callback stores the answer and wakes the request, which then answers
 * as the spec says (200 {duration_ms}, 502 M_BAD_STATUS or M_CONNECTION_FAILED, 504
 * M_CONNECTION_TIMEOUT). The queries for unknown users and aliases (/_matrix/app/v1/users,
 * /rooms) are as_query.c's.
 */
#include <stdio.h>
#include <string.h>

#include "core/client/accounts/accounts.h"
#include "core/client/appservice/appservice.h"
#include "core/client/client.h"
#include "core/federation/transport/fed_request.h"

#define AS_PING_MAX_ANSWER_BYTES 4096
#define AS_PING_BODY_BYTES 1024 /* the service's refusal, quoted back to the caller */
#define AS_UNSTABLE_DEVICE_ID "org.matrix.msc3202.device_id"
#define AS_UNKNOWN_DEVICE "ORG.MATRIX.MSC4326.M_UNKNOWN_DEVICE"

static const atrium_migration MIGRATIONS[] = {
    {1, "appservice_state_txns",
     "CREATE TABLE appservice_state ("
     " as_id text PRIMARY KEY,"
     " stream_pos bigint NOT NULL,"
     " next_txn_id bigint NOT NULL DEFAULT 1);"
     "CREATE TABLE appservice_txns ("
     " as_id text PRIMARY KEY REFERENCES appservice_state (as_id),"
     " txn_id bigint NOT NULL,"
     " upto_pos bigint NOT NULL,"
     " body text NOT NULL,"
     " n_events int NOT NULL,"
     " attempts int NOT NULL DEFAULT 0,"
     " next_try_ts bigint NOT NULL DEFAULT 0);"},
    {2, "appservice_state_outcomes", /* the admin listing's (as_admin.c) */
     "ALTER TABLE appservice_state ADD COLUMN last_success_ts bigint,"
     " ADD COLUMN last_failure_ts bigint, ADD COLUMN last_error text;"},
};

/* ---- acting as a service --------------------------------------------------------------- */

/* [req] Is user_id registered and active (*active), and has it the device device_id
 * (*has_device; device_id NULL: not asked)? false after answering 503. */
static bool user_check(atrium_req *r, const char *user_id, const char *device_id, bool *active,
                       bool *has_device)
{
    PGconn *c = http_db_checkout(r);
    if (!c) return false;
    const char *p[2] = {user_id, device_id ? device_id : ""};
    PGresult *res = acc_q(c, "SELECT NOT u.deactivated, EXISTS (SELECT 1 FROM devices d"
                             " WHERE d.user_id = u.user_id AND d.device_id = $2)"
                             " FROM users u WHERE u.user_id = $1", 2, p);
    http_db_checkin(c);
    if (!res) {
        acc_db_failed(r);
        return false;
    }
    *active = PQntuples(res) == 1 && PQgetvalue(res, 0, 0)[0] == 't';
    *has_device = PQntuples(res) == 1 && PQgetvalue(res, 0, 1)[0] == 't';
    PQclear(res);
    return true;
}

const char *as_authenticate(atrium_req *r, const as_service *svc)
{
    const char *user = http_req_query(r, "user_id");
    /* MSC3202: act as one of the user's devices (the stable name first, as Synapse reads). */
    const char *device = http_req_query(r, "device_id");
    if (!device) device = http_req_query(r, AS_UNSTABLE_DEVICE_ID);
    if (device && !device[0]) device = NULL;
    if (!user || !user[0]) {
        user = svc->sender;
    } else if (!as_user_in(svc, user)) {
        http_respond_error(r, 403, "M_FORBIDDEN", "The application service may only act as "
                           "users in its namespaces");
        return NULL;
    }
    bool masquerading = strcmp(user, svc->sender) != 0;
    if (masquerading || device) {
        bool active = false, has_device = false;
        if (!user_check(r, user, device, &active, &has_device)) return NULL;
        if (!active) {
            http_respond_error(r, 403, "M_FORBIDDEN", "The application service has not "
                               "registered this user");
            return NULL;
        }
        if (device && !has_device) { /* Synapse's answer (MSC4326's code) */
            http_respond_error(r, 400, AS_UNKNOWN_DEVICE, "The user %s has no device %s", user,
                               device);
            return NULL;
        }
    }
    r->device = device ? rt_arena_strdup(r->arena, device)
                       : rt_arena_printf(r->arena, "AS_%s", svc->id);
    r->user = rt_arena_strdup(r->arena, user);
    r->is_admin = 0;
    r->is_guest = 0;
    if (!r->user || !r->device) {
        r->user = NULL;
        http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
        return NULL;
    }
    return r->user;
}

/* ---- POST /_matrix/client/v1/appservice/{appserviceId}/ping ----------------------------- */

typedef struct as_ping {
    bool done;
    int outcome, status;
    int64_t started_ms;
    char body[AS_PING_BODY_BYTES];
    char error[256];
} as_ping;

static void ping_done(void *arg, const fed_response *res)
{
    atrium_req *r = arg;
    as_ping *p = r->core_state;
    p->outcome = res->outcome;
    p->status = res->status;
    snprintf(p->error, sizeof(p->error), "%s", res->error ? res->error : "");
    snprintf(p->body, sizeof(p->body), "%.*s", (int)(res->body ? res->body_len : 0),
             res->body ? res->body : "");
    p->done = true;
    susp_wake(r);
}

static int ping_answer(atrium_req *r, as_ping *p)
{
    bool got = p->outcome == FED_HTTP_OK || p->outcome == FED_REQ_E_NOT_JSON;
    if (got && p->status >= 200 && p->status < 300)
        return http_respond_json(r, 200, json_pack("{s:I}", "duration_ms",
                                                   (json_int_t)(rt_now_ms() - p->started_ms)));
    if (got) {
        json_t *b = json_pack("{s:s, s:s, s:i, s:s}", "errcode", "M_BAD_STATUS", "error",
                              "The application service answered with an error", "status",
                              p->status, "body", p->body);
        return http_respond_json(r, 502, b);
    }
    if (p->outcome == FED_HTTP_E_TIMEOUT)
        return http_respond_error(r, 504, "M_CONNECTION_TIMEOUT",
                                  "The application service did not answer in time");
    return http_respond_error(r, 502, "M_CONNECTION_FAILED",
                              "The application service could not be reached: %s", p->error);
}

/* The ping's request to the service, submitted; the handler then parks. */
static int ping_send(atrium_req *r, const as_service *svc, const char *txn_id)
{
    as_ping *p = rt_arena_alloc(r->arena, sizeof(*p));
    if (!p) return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    memset(p, 0, sizeof(*p));
    char url[1024], auth[512];
    size_t ulen = strlen(svc->url);
    while (ulen > 0 && svc->url[ulen - 1] == '/') ulen--;
    int n = snprintf(url, sizeof(url), "%.*s/_matrix/app/v1/ping", (int)ulen, svc->url);
    int m = snprintf(auth, sizeof(auth), "Authorization: Bearer %s", svc->hs_token);
    if (n < 0 || (size_t)n >= sizeof(url) || m < 0 || (size_t)m >= sizeof(auth))
        return http_respond_error(r, 500, "M_UNKNOWN", "The service's url is too long");
    json_t *body = txn_id ? json_pack("{s:s}", "transaction_id", txn_id) : json_object();
    r->core_state = p;
    p->started_ms = rt_now_ms();
    int64_t deadline = p->started_ms + r->srv->cfg->appservice.request_timeout_ms;
    if (r->deadline_ms > 0 && r->deadline_ms < deadline) deadline = r->deadline_ms;
    if (susp_wait(r, deadline + 1000) < 0) { /* the outbound deadline answers first */
        json_decref(body);
        return http_respond_error(r, 503, "M_UNKNOWN", "The server is stopping");
    }
    fed_request_opts o = {.method = "POST", .url = url, .url_allow_http = true,
                          .url_header = auth, .operator_destination = true, .body = body,
                          .want_json = true, .deadline_ms = deadline,
                          .max_body_bytes = AS_PING_MAX_ANSWER_BYTES, .on_done = ping_done,
                          .arg = r};
    int rc = fed_request_submit(&o);
    json_decref(body);
    if (rc < 0) {
        p->outcome = FED_HTTP_E_INTERNAL;
        snprintf(p->error, sizeof(p->error), "the outbound client refused the request (%d)", rc);
        p->done = true;
        susp_wake(r);
    }
    return ATRIUM_PARKED;
}

/* The outbound budget's slot (ADR-0079: a request that waits on another server), held
 * until the answer is queued. false after answering 429. */
typedef struct outbound_slot {
    rt_budget *b;
    const char *key;
} outbound_slot;

static void outbound_release(void *arg)
{
    outbound_slot *h = arg;
    rt_budget_release(h->b, h->key);
}

bool as_outbound_hold(atrium_req *r)
{
    rt_budget *b = r->srv->outbound;
    if (!b) return true;
    const char *key = http_req_client_key(r);
    outbound_slot *h = rt_arena_alloc(r->arena, sizeof(*h));
    if (!h || rt_budget_try_acquire(b, key, NULL) < 0) {
        http_respond_limited(r, 1000, "Too many requests to other servers in progress; retry");
        return false;
    }
    *h = (outbound_slot){.b = b, .key = key};
    if (http_req_add_answer_hold(r, outbound_release, h) < 0) { /* released by it */
        http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
        return false;
    }
    return true;
}

static int post_ping(atrium_req *r)
{
    as_ping *p = r->core_state;
    if (p && p->done) return ping_answer(r, p);
    if (p)
        return r->run_reason == ATRIUM_RUN_SHUTDOWN
                   ? http_respond_error(r, 503, "M_UNKNOWN", "The server is stopping")
                   : http_respond_error(r, 504, "M_CONNECTION_TIMEOUT",
                                        "The application service did not answer in time");
    if (!auth_request(r)) return ATRIUM_DONE; /* for a service: its sender, the client key */
    const as_service *svc = as_of_request(r);
    if (!svc)
        return http_respond_error(r, 403, "M_FORBIDDEN", "Only an application service may "
                                  "ping itself");
    if (strcmp(svc->id, http_req_param(r, "appserviceId")) != 0)
        return http_respond_error(r, 403, "M_FORBIDDEN", "This is not the application "
                                  "service the access token belongs to");
    const char *txn_id = NULL;
    if (r->body_len) {
        json_t *body = http_req_json(r);
        if (!body ||
            !http_field_string(r, body, "transaction_id", false, 255, &txn_id))
            return ATRIUM_DONE;
    }
    if (!svc->url)
        return http_respond_error(r, 400, "M_URL_NOT_SET", "The application service has no "
                                  "url in its registration");
    if (!as_outbound_hold(r)) return ATRIUM_DONE;
    return ping_send(r, svc, txn_id);
}

/* ---- the module ------------------------------------------------------------------------- */

static int as_init(core_runtime *rt)
{
    http_server *s = rt->http; /* the registry was loaded with the configuration (main.c) */
    if (client_route(s, "POST", "/_matrix/client/v1/appservice/{appserviceId}/ping", post_ping,
                     ACC_MAX_BODY_BYTES) < 0 ||
        as_thirdparty_routes(s) < 0 || as_admin_routes(s) < 0)
        return -1;
    if (as_count())
        rt_log(ATRIUM_LOG_INFO, "core", "%zu application service(s) registered", as_count());
    return 0;
}

/* Every service's sender user exists (made with no password: it logs in with its
 * as_token only). */
static int make_senders(core_runtime *rt)
{
    if (!as_count()) return 0;
    PGconn *c = db_acquire(rt->db, DB_WAIT_CONFIGURED);
    if (!c) {
        rt_log(ATRIUM_LOG_ERROR, "core", "no database connection to make the application "
               "services' users");
        return -1;
    }
    bool ok = true;
    for (size_t i = 0; ok && i < as_count(); i++) {
        const as_service *s = as_at(i);
        const char *lp_end = strchr(s->sender, ':');
        char lp[256];
        snprintf(lp, sizeof(lp), "%.*s", (int)(lp_end - s->sender - 1), s->sender + 1);
        const char *p[2] = {s->sender, lp};
        ok = db_exec(c, "WITH u AS (INSERT INTO users (user_id, created_ts) VALUES ($1,"
                        " (extract(epoch from now()) * 1000)::bigint)"
                        " ON CONFLICT (user_id) DO NOTHING RETURNING user_id)"
                        " INSERT INTO profiles (user_id, displayname) SELECT user_id, $2 FROM u",
                     2, p);
    }
    db_release(rt->db, c);
    return ok ? 0 : -1;
}

static int as_start(core_runtime *rt)
{
    if (make_senders(rt) < 0) return -1;
    return as_sender_start(rt) < 0 ? -1 : 0;
}

static void as_stop(core_runtime *rt)
{
    (void)rt;
    as_sender_stop();
}

const client_module APPSERVICE_MODULE = {
    .owner = "appservice",
    .migrations = MIGRATIONS,
    .n_migrations = sizeof MIGRATIONS / sizeof *MIGRATIONS,
    .init = as_init,
    .start = as_start,
    .stop = as_stop,
};
