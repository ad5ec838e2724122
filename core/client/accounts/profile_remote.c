/*
 * core/client/accounts/profile_remote.c - profiles of users on other servers: GET
 * /profile/{userId}[/{field}] for a remote user asks the user's server
 * (/_matrix/federation/v1/query/profile) and answers with what it said.
 *
 * The request waits for the peer parked (susp_wait), holding no request-pool thread: the
 * federation client's callback stores the answer in the request's state and wakes it, and
 * the handler runs again to answer. The peer's refusals keep their status and errcode (a
 * 404 M_NOT_FOUND stays one); a peer that cannot be reached, or answers garbage, is 502; no
 * answer within the deadline is 504. It also answers other servers asking for our users'
 * profiles (GET /_matrix/federation/v1/query/profile). What this file does not do: cache
 * remote profiles.
 */
#include <stdio.h>
#include <string.h>

#include "core/client/accounts/accounts.h"
#include "core/federation/transport/fed_request.h"
#include "core/rooms/rooms.h"
#include "core/runtime/uri.h"

#define REMOTE_PROFILE_MAX_BYTES 4096 /* a larger profile answer is refused as garbage */
#define REMOTE_PROFILE_URI_BYTES 1024

typedef struct remote_profile {
    bool done;    /* the callback ran (written before the wake) */
    int outcome;  /* fed_response.outcome */
    int status;
    char body[REMOTE_PROFILE_MAX_BYTES]; /* the peer's JSON, re-encoded */
    char error[256];
} remote_profile;

static void remote_done(void *arg, const fed_response *res)
{
    atrium_req *r = arg;
    remote_profile *rp = r->core_state;
    rp->outcome = res->outcome;
    rp->status = res->status;
    snprintf(rp->error, sizeof(rp->error), "%s", res->error ? res->error : "");
    if (res->json &&
        json_dumpb(res->json, rp->body, sizeof(rp->body) - 1, JSON_COMPACT) >= sizeof(rp->body) - 1)
        rp->outcome = FED_REQ_E_NOT_JSON; /* too large: treated as garbage */
    rp->done = true;
    susp_wake(r);
}

static int answer(atrium_req *r, remote_profile *rp, const char *field)
{
    if (rp->outcome == FED_REQ_E_NOT_ALLOWED)
        return http_respond_error(r, 403, "M_FORBIDDEN", "Federation with that server is not "
                                                         "allowed");
    if (rp->outcome == FED_HTTP_E_TIMEOUT)
        return http_respond_error(r, 504, "M_UNKNOWN", "The user's server did not answer in time");
    if (rp->outcome != FED_HTTP_OK)
        return http_respond_error(r, 502, "M_UNKNOWN", "The user's server could not be asked: %s",
                                  rp->error);
    json_error_t jerr;
    json_t *j = json_loads(rp->body, 0, &jerr);
    if (rp->status != 200) {
        const char *code = json_string_value(json_object_get(j, "errcode"));
        const char *msg = json_string_value(json_object_get(j, "error"));
        int status = rp->status >= 400 && rp->status < 500 ? rp->status : 502;
        int rc = http_respond_error(r, status, code ? code : "M_UNKNOWN", "%s",
                                    msg ? msg : "The user's server refused");
        json_decref(j);
        return rc;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        return http_respond_error(r, 502, "M_UNKNOWN", "The user's server answered garbage");
    }
    json_t *out = json_object();
    static const char *const fields[] = {"displayname", "avatar_url"};
    for (size_t i = 0; i < 2; i++) {
        json_t *v = json_object_get(j, fields[i]);
        if (json_is_string(v) && (!field || strcmp(field, fields[i]) == 0))
            json_object_set(out, fields[i], v);
    }
    json_decref(j);
    if (field && !json_object_get(out, field)) {
        json_decref(out);
        return http_respond_error(r, 404, "M_NOT_FOUND", "%s is not set", field);
    }
    return http_respond_json(r, 200, out);
}

bool acc_is_local_user(atrium_req *r, const char *user_id)
{
    const char *server = user_id ? strchr(user_id, ':') : NULL;
    if (!server || user_id[0] != '@' || !server[1]) return true;
    return strcmp(server + 1, r->srv->cfg->server_name) == 0;
}

int acc_profile_remote(atrium_req *r, const char *user_id, const char *field)
{
    remote_profile *rp = r->core_state;
    if (rp && rp->done) return answer(r, rp, field);
    if (rp) /* woken without an answer: the deadline or shutdown */
        return r->run_reason == ATRIUM_RUN_SHUTDOWN
                   ? http_respond_error(r, 503, "M_UNKNOWN", "The server is stopping")
                   : http_respond_error(r, 504, "M_UNKNOWN",
                                        "The user's server did not answer in time");
    /* Checked before anything asks the server (no discovery, no backoff entry). */
    if (!rooms_user_id_ok(user_id))
        return http_respond_error(r, 400, "M_INVALID_PARAM",
                                  "Not a user ID: expected @localpart:server, the server a "
                                  "host name, IPv4 or [IPv6] address with an optional port");
    const char *server = strchr(user_id, ':');
    char enc[REMOTE_PROFILE_URI_BYTES / 2], uri[REMOTE_PROFILE_URI_BYTES];
    if (!rt_uri_encode(user_id, enc, sizeof(enc)))
        return http_respond_error(r, 400, "M_INVALID_PARAM", "The user ID is too long");
    snprintf(uri, sizeof(uri), "/_matrix/federation/v1/query/profile?user_id=%s%s%s", enc,
             field ? "&field=" : "", field ? field : "");
    rp = rt_arena_alloc(r->arena, sizeof(*rp));
    if (!rp) return ATRIUM_E_NOMEM;
    r->core_state = rp;
    if (susp_wait(r, r->deadline_ms) < 0)
        return http_respond_error(r, 503, "M_UNKNOWN", "The server is stopping");
    fed_request_opts o = {.method = "GET", .destination = server + 1, .uri = uri,
                          .want_json = true, .max_body_bytes = REMOTE_PROFILE_MAX_BYTES,
                          .on_done = remote_done, .arg = r};
    int rc = fed_request_submit(&o);
    if (rc < 0) {
        rp->outcome = rc == ATRIUM_E_LIMIT ? FED_HTTP_E_INTERNAL : FED_HTTP_E_CANCELLED;
        snprintf(rp->error, sizeof(rp->error), "the outbound client refused the request (%d)",
                 rc);
        rp->done = true;
        susp_wake(r);
    }
    return ATRIUM_PARKED;
}

/* ---- other servers asking for our users' profiles ------------------------------------ */

/* GET /_matrix/federation/v1/query/profile?user_id=...&field=... (signed) */
static int get_profile(atrium_req *r)
{
    const char *user = http_req_query(r, "user_id"), *field = http_req_query(r, "field");
    if (!user || !*user)
        return http_respond_error(r, 400, "M_MISSING_PARAM", "user_id is required");
    if (field && strcmp(field, "displayname") != 0 && strcmp(field, "avatar_url") != 0)
        return http_respond_error(r, 400, "M_INVALID_PARAM",
                                  "field must be displayname or avatar_url");
    const char *colon = strchr(user, ':');
    if (user[0] != '@' || !colon || strcmp(colon + 1, r->srv->cfg->server_name) != 0)
        return http_respond_error(r, 400, "M_INVALID_PARAM", "%s is not a user of this server",
                                  user);
    json_t *body = acc_profile_load(r, user);
    if (!body) return ATRIUM_DONE;
    if (field) { /* only the field asked for */
        json_t *v = json_incref(json_object_get(body, field));
        json_object_clear(body);
        if (v) json_object_set_new(body, field, v);
    }
    return http_respond_json(r, 200, body);
}

int acc_profile_remote_routes(http_server *s)
{
    /* An ATRIUM_ROUTE_FEDERATION route: the X-Matrix signature is checked before it runs
     * (core/federation/transport/fed_auth.c). */
    static const atrium_route route = {.method = "GET",
                                       .path = "/_matrix/federation/v1/query/profile",
                                       .handler = get_profile,
                                       .flags = ATRIUM_ROUTE_FEDERATION};
    char err[256];
    if (router_add(s->router, &route, "core", err, sizeof(err)) < 0) {
        rt_log(ATRIUM_LOG_ERROR, "accounts", "%s", err);
        return -1;
    }
    return 0;
}
