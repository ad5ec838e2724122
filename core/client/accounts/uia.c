/*
 * core/client/accounts/uia.c - user-interactive authentication: the 401 challenge, sessions, and
 * the flows Atrium offers (m.login.dummy for registration, after m.login.registration_token
 * when registration needs a token; m.login.password for an authenticated user's sensitive
 * operations). Every 401 lists the session's `completed` stages (uia_sessions.completed,
 * filled by uia_complete_stage for the flows of several stages).
 *
 * Sessions live in PostgreSQL (uia_sessions) with an expiry, so any process sharing the
 * database accepts a session another process issued (docs/architecture.md, 'More than one
 * process'). A session is bound to its
 * purpose ("register", "delete_devices", "password") and to its user ("" before login),
 * so a session issued to one user or for one operation is refused for another. Expired
 * sessions are deleted whenever a new one is created, which bounds the table. A request
 * that names no session is still accepted when a one-stage flow's stage passes: the
 * session carries no progress worth insisting on (a flow of several stages opens one). What this file does not do: check
 * the operation's own parameters, or hash anything (the password stage's check runs on
 * the auth pool through uia_password_verify).
 */
#include <sodium.h>
#include <stdio.h>
#include <string.h>

#include "core/client/accounts/accounts.h"

#define UIA_SESSION_BYTES 18 /* random bytes, base64url: 24 characters */
#define UIA_OPERATION_MAX_BYTES 1024

/* Body keys never stored with a session. */
static const char *const UIA_SECRET_KEYS[] = {"auth", "password", "new_password", NULL};

/* "METHOD /path" of the request, the operation a session is bound to. */
static const char *operation_of(atrium_req *r)
{
    char *op = rt_arena_printf(r->arena, "%s %s", r->method, r->path);
    if (op && strlen(op) > UIA_OPERATION_MAX_BYTES) op[UIA_OPERATION_MAX_BYTES] = '\0';
    return op ? op : "";
}

/* The request's parameters worth keeping with its session (JSON text, or NULL). */
static char *params_of(atrium_req *r)
{
    if (!json_is_object(r->json)) return NULL;
    json_t *copy = json_copy(r->json);
    if (!copy) return NULL;
    for (size_t i = 0; UIA_SECRET_KEYS[i]; i++) json_object_del(copy, UIA_SECRET_KEYS[i]);
    char *text = json_object_size(copy) > 0 ? json_dumps(copy, JSON_COMPACT) : NULL;
    json_decref(copy);
    char *kept = text ? rt_arena_strdup(r->arena, text) : NULL;
    free(text);
    return kept;
}

static char *new_session_id(atrium_req *r)
{
    unsigned char raw[UIA_SESSION_BYTES];
    randombytes_buf(raw, sizeof(raw));
    char b64[sodium_base64_ENCODED_LEN(UIA_SESSION_BYTES, sodium_base64_VARIANT_URLSAFE_NO_PADDING)];
    sodium_bin2base64(b64, sizeof(b64), raw, sizeof(raw), sodium_base64_VARIANT_URLSAFE_NO_PADDING);
    return rt_arena_strdup(r->arena, b64);
}

/* Store a new session for r's operation; false on database trouble. */
static bool store_session(atrium_req *r, PGconn *c, const char *session, const char *purpose,
                          const char *user)
{
    char ttl[32];
    snprintf(ttl, sizeof(ttl), "%d", UIA_SESSION_TTL_MS);
    const char *p[6] = {session, purpose, user, ttl, operation_of(r), params_of(r)};
    /* An expired session that reserved a registration token and registered no one gives
     * the use back (registration_tokens.c). */
    return db_exec(c, "WITH gone AS (DELETE FROM uia_sessions"
                      "  WHERE expires_ts < (extract(epoch from now()) * 1000)::bigint"
                      "  RETURNING registration_token, registered_user),"
                      " back AS (SELECT registration_token, count(*) AS n FROM gone"
                      "  WHERE registration_token IS NOT NULL AND registered_user IS NULL"
                      "  GROUP BY registration_token)"
                      " UPDATE registration_tokens t SET pending = greatest(0, t.pending - back.n)"
                      " FROM back WHERE t.token = back.registration_token",
                   0, NULL) &&
           db_exec(c,
                   "INSERT INTO uia_sessions (session_id, purpose, user_id, expires_ts,"
                   " operation, params) VALUES ($1, $2, $3,"
                   " (extract(epoch from now()) * 1000)::bigint + $4::bigint, $5, $6::jsonb)",
                   6, p);
}

json_t *uia_body(atrium_req *r)
{
    json_t *body = r->body_len ? http_req_json(r) : (r->json = r->json ? r->json : json_object());
    if (!body) {
        if (!r->body_len) http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
        return NULL;
    }
    json_t *session = json_object_get(json_object_get(body, "auth"), "session");
    if (json_object_size(body) != 1 || !json_is_string(session)) return body;
    PGconn *c = http_db_checkout(r);
    if (!c) return NULL;
    const char *p[2] = {json_string_value(session), operation_of(r)};
    PGresult *res = acc_q(c, "SELECT params::text FROM uia_sessions WHERE session_id = $1"
                             " AND operation = $2 AND params IS NOT NULL", 2, p);
    http_db_checkin(c);
    if (!res) {
        acc_db_failed(r);
        return NULL;
    }
    json_t *kept = PQntuples(res) == 1 ? json_loads(PQgetvalue(res, 0, 0), 0, NULL) : NULL;
    PQclear(res);
    if (json_is_object(kept)) json_object_update_missing(body, kept);
    json_decref(kept);
    return body;
}

/* The stages session has completed, as a new JSON array ([] when none or unknown); NULL
 * on database trouble. */
static json_t *completed_of(PGconn *c, const char *session)
{
    const char *p[1] = {session};
    PGresult *res = acc_q(c, "SELECT array_to_json(completed)::text FROM uia_sessions"
                             " WHERE session_id = $1", 1, p);
    if (!res) return NULL;
    json_t *done = PQntuples(res) == 1 ? json_loads(PQgetvalue(res, 0, 0), 0, NULL) : NULL;
    PQclear(res);
    return json_is_array(done) ? done : (json_decref(done), json_array());
}

int uia_challenge_flow(atrium_req *r, const char *const *flow, const char *purpose,
                       const char *user_id, const char *session, const char *errcode,
                       const char *error)
{
    json_t *completed = NULL;
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    if (!session) {
        session = new_session_id(r);
        bool ok = session && store_session(r, c, session, purpose, user_id);
        http_db_checkin(c);
        if (!ok) return acc_db_failed(r);
        completed = json_array();
    } else {
        completed = completed_of(c, session);
        http_db_checkin(c);
        if (!completed) return acc_db_failed(r);
    }
    json_t *stages = json_array();
    for (size_t i = 0; stages && flow[i]; i++) json_array_append_new(stages, json_string(flow[i]));
    json_t *body = json_pack("{s:[{s:o}], s:{}, s:s, s:o}", "flows", "stages", stages, "params",
                             "session", session, "completed", completed);
    if (body && errcode) {
        json_object_set_new(body, "errcode", json_string(errcode));
        json_object_set_new(body, "error", json_string(error ? error : ""));
    }
    if (!body) return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    http_respond_json(r, 401, body);
    return ATRIUM_DONE;
}

int uia_challenge(atrium_req *r, const char *stage, const char *purpose, const char *user_id,
                  const char *session, const char *errcode, const char *error)
{
    const char *flow[2] = {stage, NULL};
    return uia_challenge_flow(r, flow, purpose, user_id, session, errcode, error);
}

enum { SESSION_UNKNOWN = 0, SESSION_LIVE = 1, SESSION_OTHER_OPERATION = 2 };

/* SESSION_LIVE: the session is live for (purpose, user) and was begun by this operation;
 * SESSION_OTHER_OPERATION: live for (purpose, user), begun by another; SESSION_UNKNOWN:
 * none; ATRIUM_E_DB. */
static int session_live(atrium_req *r, PGconn *c, const char *session, const char *purpose,
                        const char *user)
{
    const char *p[4] = {session, purpose, user, operation_of(r)};
    PGresult *res = acc_q(c,
                          "SELECT operation = $4 OR operation = '' FROM uia_sessions"
                          " WHERE session_id = $1 AND purpose = $2 AND user_id = $3"
                          " AND expires_ts >= (extract(epoch from now()) * 1000)::bigint",
                          4, p);
    if (!res) return ATRIUM_E_DB;
    int rc = PQntuples(res) == 0              ? SESSION_UNKNOWN
             : PQgetvalue(res, 0, 0)[0] == 't' ? SESSION_LIVE
                                               : SESSION_OTHER_OPERATION;
    PQclear(res);
    return rc;
}

static bool in_flow(const char *const *flow, const char *type)
{
    for (size_t i = 0; flow[i]; i++)
        if (strcmp(flow[i], type) == 0) return true;
    return false;
}

bool uia_check_flow(atrium_req *r, json_t *auth, const char *const *flow, const char *purpose,
                    const char *user_id, const char **session_out, const char **type_out)
{
    *session_out = NULL;
    *type_out = NULL;
    const char *type = NULL, *session = NULL;
    json_t *t = json_object_get(auth, "type"), *s = json_object_get(auth, "session");
    if (json_is_string(t)) type = json_string_value(t);
    if (json_is_string(s) && json_string_length(s) > 0) session = json_string_value(s);
    if ((s && !json_is_null(s) && !json_is_string(s)) || (t && !json_is_null(t) && !type)) {
        http_respond_error(r, 400, "M_BAD_JSON", "'auth.type' and 'auth.session' must be strings");
        return false;
    }
    if (session) {
        PGconn *c = http_db_checkout(r);
        if (!c) return false;
        int live = session_live(r, c, session, purpose, user_id);
        http_db_checkin(c);
        if (live < 0) {
            acc_db_failed(r);
            return false;
        }
        if (live == SESSION_OTHER_OPERATION) {
            http_respond_error(r, 403, "M_FORBIDDEN",
                               "This session was begun for another request; start again");
            return false;
        }
        if (live == SESSION_UNKNOWN) {
            uia_challenge_flow(r, flow, purpose, user_id, NULL, "M_UNKNOWN",
                               "Unknown or expired session; start again with the new one");
            return false;
        }
    }
    if (!type) { /* only the session: the client asks where it stands */
        uia_challenge_flow(r, flow, purpose, user_id, session, NULL, NULL);
        return false;
    }
    if (!in_flow(flow, type)) {
        uia_challenge_flow(r, flow, purpose, user_id, session, "M_UNKNOWN",
                           "That authentication type is not offered here");
        return false;
    }
    *session_out = session;
    *type_out = type;
    return true;
}

bool uia_check(atrium_req *r, json_t *auth, const char *stage, const char *purpose,
               const char *user_id, const char **session_out)
{
    const char *flow[2] = {stage, NULL}, *type;
    return uia_check_flow(r, auth, flow, purpose, user_id, session_out, &type);
}

const char *uia_session_open(atrium_req *r, PGconn *c, const char *purpose, const char *user_id)
{
    const char *session = new_session_id(r);
    return session && store_session(r, c, session, purpose, user_id) ? session : NULL;
}

int uia_complete_stage(PGconn *c, const char *session, const char *stage,
                       const char *const *flow)
{
    /* The flow as an array literal: stage names are this server's constants, without
     * commas, braces or quotes. */
    char stages[256] = "{";
    for (size_t i = 0; flow[i]; i++) {
        size_t used = strlen(stages);
        snprintf(stages + used, sizeof(stages) - used, "%s%s", i ? "," : "", flow[i]);
    }
    strncat(stages, "}", sizeof(stages) - strlen(stages) - 1);
    const char *p[3] = {session, stage, stages};
    PGresult *res = acc_q(c, "UPDATE uia_sessions SET completed = CASE WHEN $2 = ANY(completed)"
                             " THEN completed ELSE array_append(completed, $2) END"
                             " WHERE session_id = $1 RETURNING $3::text[] <@ completed", 3, p);
    if (!res) return ATRIUM_E_DB;
    int all = PQntuples(res) == 1 && PQgetvalue(res, 0, 0)[0] == 't';
    PQclear(res);
    return all;
}

bool uia_registered(PGconn *c, const char *session, const char *user_id)
{
    if (!session) return true;
    const char *p[2] = {session, user_id};
    return db_exec(c, "UPDATE uia_sessions SET registered_user = $2 WHERE session_id = $1", 2, p);
}

void uia_forget(PGconn *c, const char *session)
{
    if (!session) return;
    const char *p[1] = {session};
    /* Best effort (logged): a session left behind expires at its expires_ts. */
    RT_IGNORE(db_exec(c, "DELETE FROM uia_sessions WHERE session_id = $1", 1, p));
}

/* ---- the password stage ------------------------------------------------------------------- */

bool uia_password_begin(atrium_req *r, json_t *body, const char *purpose, uia_password *p)
{
    json_t *auth;
    if (!http_field_object(r, body, "auth", false, &auth)) return false;
    if (!auth) {
        uia_challenge(r, UIA_STAGE_PASSWORD, purpose, r->user, NULL, NULL, NULL);
        return false;
    }
    if (!uia_check(r, auth, UIA_STAGE_PASSWORD, purpose, r->user, &p->session)) return false;
    const char *who;
    if (!acc_user_identifier(r, auth, &who)) return false;
    if (!http_field_string(r, auth, "password", true, ACC_PASSWORD_MAX_BYTES, &p->password))
        return false;
    const char *as = who ? acc_local_user(r, who) : r->user;
    if (!as || strcmp(as, r->user) != 0) { /* not a failed stage: a refusal */
        http_respond_error(r, 403, "M_FORBIDDEN", "You can only authenticate as yourself");
        return false;
    }
    return true;
}

bool uia_password_verify(atrium_req *r, const uia_password *p, const char *purpose)
{
    RT_ASSERT(rt_pool_on_worker(auth_pool()), "%s", "password check off the auth pool");
    PGconn *c = http_db_checkout(r);
    if (!c) return false;
    const char *params[1] = {r->user};
    PGresult *res = acc_q(c, "SELECT password_hash FROM users WHERE user_id = $1", 1, params);
    char *hash = NULL;
    if (res && PQntuples(res) == 1 && !PQgetisnull(res, 0, 0))
        hash = rt_arena_strdup(r->arena, PQgetvalue(res, 0, 0));
    PQclear(res);
    http_db_checkin(c); /* never held across the slow check */
    if (!res) {
        acc_db_failed(r);
        return false;
    }
    if (!auth_verify_password(hash, p->password)) {
        uia_challenge(r, UIA_STAGE_PASSWORD, purpose, r->user, p->session, "M_FORBIDDEN",
                      "Invalid password");
        return false;
    }
    return true;
}
