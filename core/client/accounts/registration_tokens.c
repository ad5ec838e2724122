/*
 * core/client/accounts/registration_tokens.c - tokens that open registration to invited
 * people: the admin API in Synapse's shape (GET /_synapse/admin/v1/registration_tokens,
 * POST .../new, GET, PUT and DELETE .../{token}), GET
 * /_matrix/client/v1/register/m.login.registration_token/validity, and the two steps the
 * m.login.registration_token stage of registration takes (register.c).
 *
 * A token is valid while it has not expired (expiry_time, ms since the epoch, NULL never)
 * and its uses (pending + completed) are below uses_allowed (NULL: unlimited). Completing
 * the stage reserves a use (pending + 1, in the same statement as the check, so two
 * registrations cannot both take a token's last use); the registration that follows turns
 * it into completed; a UIA session that expires unused gives it back (uia.c). Only server
 * admins reach the admin API (403 M_FORBIDDEN). The token list is bounded by
 * REGISTRATION_TOKENS_LIST_MAX rows. What this file does not do: decide whether
 * registration requires a token (registration.requires_token, register.c).
 */
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/accounts/accounts.h"
#include "core/client/ratelimits.h"

#define REGISTRATION_TOKEN_MAX_CHARS 64
#define REGISTRATION_TOKEN_DEFAULT_LENGTH 16
#define REGISTRATION_TOKENS_LIST_MAX 10000
#define TOKEN_COLUMNS "token, uses_allowed, pending, completed, expiry_time"
/* The validity rule, in SQL over a row of registration_tokens. */
#define TOKEN_VALID                                                                          \
    "(uses_allowed IS NULL OR pending + completed < uses_allowed) AND"                       \
    " (expiry_time IS NULL OR expiry_time > (extract(epoch from now()) * 1000)::bigint)"

static const char TOKEN_ALPHABET[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._~-";

int acc_registration_tokens_reserve(PGconn *c, const char *token)
{
    const char *p[1] = {token};
    PGresult *res = acc_q(c, "UPDATE registration_tokens SET pending = pending + 1"
                             " WHERE token = $1 AND " TOKEN_VALID " RETURNING 1", 1, p);
    if (!res) return ATRIUM_E_DB;
    int n = PQntuples(res);
    PQclear(res);
    return n == 1 ? 1 : 0;
}

bool acc_registration_tokens_complete(PGconn *c, const char *token)
{
    const char *p[1] = {token};
    return db_exec(c, "UPDATE registration_tokens SET pending = greatest(0, pending - 1),"
                      " completed = completed + 1 WHERE token = $1", 1, p);
}

/* true: only the token alphabet, 1 to REGISTRATION_TOKEN_MAX_CHARS characters. */
static bool token_ok(const char *t)
{
    size_t n = strlen(t);
    return n > 0 && n <= REGISTRATION_TOKEN_MAX_CHARS && strspn(t, TOKEN_ALPHABET) == n;
}

/* GET /_matrix/client/v1/register/m.login.registration_token/validity?token= */
static int get_validity(atrium_req *r)
{
    if (ratelimit_refused(r, ratelimit_register())) return ATRIUM_DONE;
    const char *token = http_req_query(r, "token");
    if (!token) return http_respond_error(r, 400, "M_MISSING_PARAM", "Missing 'token'");
    if (!token_ok(token)) return http_respond_json(r, 200, json_pack("{s:b}", "valid", 0));
    const char *p[1] = {token};
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    PGresult *res = acc_q(c, "SELECT 1 FROM registration_tokens WHERE token = $1 AND "
                             TOKEN_VALID, 1, p);
    http_db_checkin(c);
    if (!res) return acc_db_failed(r);
    bool valid = PQntuples(res) == 1;
    PQclear(res);
    return http_respond_json(r, 200, json_pack("{s:b}", "valid", valid));
}

/* ---- the admin API ------------------------------------------------------------------- */

/* true when the caller is a server admin; false after answering (401, 403, 503). */
static bool admin_only(atrium_req *r)
{
    if (!auth_request(r)) return false;
    int admin = auth_is_admin(r);
    if (admin < 0) http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    else if (!admin) http_respond_error(r, 403, "M_FORBIDDEN", "You are not a server admin");
    return admin == 1;
}

static json_t *int_or_null(const PGresult *res, int i, int col)
{
    if (PQgetisnull(res, i, col)) return json_null();
    return json_integer(strtoll(PQgetvalue(res, i, col), NULL, 10));
}

/* Row i of a TOKEN_COLUMNS result as the admin API's object. */
static json_t *token_json(const PGresult *res, int i)
{
    return json_pack("{s:s, s:o, s:o, s:o, s:o}", "token", PQgetvalue(res, i, 0),
                     "uses_allowed", int_or_null(res, i, 1), "pending", int_or_null(res, i, 2),
                     "completed", int_or_null(res, i, 3), "expiry_time", int_or_null(res, i, 4));
}

/* An optional non-negative integer or null field: *present false when absent, *out NULL
 * for null, else its decimal text (in r's arena). false after answering 400. */
static bool nullable_count(atrium_req *r, json_t *body, const char *key, bool *present,
                           const char **out)
{
    json_t *v = json_object_get(body, key);
    *present = v != NULL;
    *out = NULL;
    if (!v || json_is_null(v)) return true;
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
        http_respond_error(r, 400, "M_INVALID_PARAM", "%s must be a non-negative integer or null",
                           key);
        return false;
    }
    *out = rt_arena_printf(r->arena, "%lld", (long long)json_integer_value(v));
    return *out != NULL;
}

/* expiry_time must not be in the past (as Synapse). */
static bool expiry_ok(atrium_req *r, const char *expiry)
{
    if (!expiry || strtoll(expiry, NULL, 10) >= rt_wall_ms()) return true;
    http_respond_error(r, 400, "M_INVALID_PARAM", "expiry_time must not be in the past");
    return false;
}

/* Answer the one token `token` (404 M_NOT_FOUND when it does not exist). */
static int answer_token(atrium_req *r, PGconn *c, const char *token)
{
    const char *p[1] = {token};
    PGresult *res = acc_q(c, "SELECT " TOKEN_COLUMNS " FROM registration_tokens"
                             " WHERE token = $1", 1, p);
    http_db_checkin(c);
    if (!res) return acc_db_failed(r);
    json_t *body = PQntuples(res) == 1 ? token_json(res, 0) : NULL;
    bool found = PQntuples(res) == 1;
    PQclear(res);
    if (!found) return http_respond_error(r, 404, "M_NOT_FOUND", "No such registration token");
    return http_respond_json(r, 200, body);
}

/* GET /_synapse/admin/v1/registration_tokens[?valid=true|false] */
static int list_tokens(atrium_req *r)
{
    if (!admin_only(r)) return ATRIUM_DONE;
    const char *valid = http_req_query(r, "valid");
    const char *where = "";
    if (valid && strcmp(valid, "true") == 0) where = " WHERE " TOKEN_VALID;
    else if (valid && strcmp(valid, "false") == 0) where = " WHERE NOT (" TOKEN_VALID ")";
    else if (valid)
        return http_respond_error(r, 400, "M_INVALID_PARAM", "valid must be true or false");
    char sql[768];
    snprintf(sql, sizeof(sql), "SELECT " TOKEN_COLUMNS " FROM registration_tokens%s"
             " ORDER BY token LIMIT %d", where, REGISTRATION_TOKENS_LIST_MAX);
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    PGresult *res = acc_q(c, sql, 0, NULL);
    http_db_checkin(c);
    if (!res) return acc_db_failed(r);
    json_t *list = json_array();
    for (int i = 0; list && i < PQntuples(res); i++) json_array_append_new(list, token_json(res, i));
    PQclear(res);
    return http_respond_json(r, 200, json_pack("{s:o}", "registration_tokens", list));
}

/* POST /_synapse/admin/v1/registration_tokens/new {token?, uses_allowed?, expiry_time?,
 * length?} */
static int new_token(atrium_req *r)
{
    if (!admin_only(r)) return ATRIUM_DONE;
    json_t *body = http_req_json(r);
    if (!body) return ATRIUM_DONE;
    const char *token, *uses, *expiry;
    bool has_uses, has_expiry;
    if (!http_field_string(r, body, "token", false, 0, &token) ||
        !nullable_count(r, body, "uses_allowed", &has_uses, &uses) ||
        !nullable_count(r, body, "expiry_time", &has_expiry, &expiry) || !expiry_ok(r, expiry))
        return ATRIUM_DONE;
    json_t *length = json_object_get(body, "length");
    json_int_t n = REGISTRATION_TOKEN_DEFAULT_LENGTH;
    if (length && !token) {
        if (!json_is_integer(length) || json_integer_value(length) < 1 ||
            json_integer_value(length) > REGISTRATION_TOKEN_MAX_CHARS)
            return http_respond_error(r, 400, "M_INVALID_PARAM",
                                      "length must be an integer from 1 to %d",
                                      REGISTRATION_TOKEN_MAX_CHARS);
        n = json_integer_value(length);
    }
    char made[REGISTRATION_TOKEN_MAX_CHARS + 1];
    if (!token) {
        unsigned char raw[REGISTRATION_TOKEN_MAX_CHARS];
        randombytes_buf(raw, sizeof(raw));
        for (json_int_t i = 0; i < n; i++) made[i] = TOKEN_ALPHABET[raw[i] % (sizeof(TOKEN_ALPHABET) - 1)];
        made[n] = '\0';
        token = made;
    } else if (!token_ok(token)) {
        return http_respond_error(r, 400, "M_INVALID_PARAM", "A token holds 1 to %d of "
                                  "A-Z a-z 0-9 . _ ~ -", REGISTRATION_TOKEN_MAX_CHARS);
    }
    const char *p[3] = {token, uses, expiry};
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    PGresult *res = acc_q(c, "INSERT INTO registration_tokens (token, uses_allowed, expiry_time)"
                             " VALUES ($1, $2::int, $3::bigint) ON CONFLICT (token) DO NOTHING"
                             " RETURNING 1", 3, p);
    if (!res) {
        http_db_checkin(c);
        return acc_db_failed(r);
    }
    bool created = PQntuples(res) == 1;
    PQclear(res);
    if (!created) {
        http_db_checkin(c);
        return http_respond_error(r, 400, "M_INVALID_PARAM", "Token already in use");
    }
    return answer_token(r, c, token);
}

/* GET /_synapse/admin/v1/registration_tokens/{token} */
static int get_token(atrium_req *r)
{
    if (!admin_only(r)) return ATRIUM_DONE;
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    return answer_token(r, c, http_req_param(r, "token"));
}

/* PUT /_synapse/admin/v1/registration_tokens/{token} {uses_allowed?, expiry_time?} */
static int put_token(atrium_req *r)
{
    if (!admin_only(r)) return ATRIUM_DONE;
    json_t *body = http_req_json(r);
    if (!body) return ATRIUM_DONE;
    const char *uses, *expiry;
    bool has_uses, has_expiry;
    if (!nullable_count(r, body, "uses_allowed", &has_uses, &uses) ||
        !nullable_count(r, body, "expiry_time", &has_expiry, &expiry) || !expiry_ok(r, expiry))
        return ATRIUM_DONE;
    const char *p[5] = {http_req_param(r, "token"), uses, has_uses ? "t" : "f", expiry,
                        has_expiry ? "t" : "f"};
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    if (!db_exec(c, "UPDATE registration_tokens SET"
                    " uses_allowed = CASE WHEN $3::boolean THEN $2::int ELSE uses_allowed END,"
                    " expiry_time = CASE WHEN $5::boolean THEN $4::bigint ELSE expiry_time END"
                    " WHERE token = $1", 5, p)) {
        http_db_checkin(c);
        return acc_db_failed(r);
    }
    return answer_token(r, c, p[0]);
}

/* DELETE /_synapse/admin/v1/registration_tokens/{token} */
static int delete_token(atrium_req *r)
{
    if (!admin_only(r)) return ATRIUM_DONE;
    const char *p[1] = {http_req_param(r, "token")};
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    PGresult *res = acc_q(c, "DELETE FROM registration_tokens WHERE token = $1 RETURNING 1", 1, p);
    http_db_checkin(c);
    if (!res) return acc_db_failed(r);
    bool found = PQntuples(res) == 1;
    PQclear(res);
    if (!found) return http_respond_error(r, 404, "M_NOT_FOUND", "No such registration token");
    return http_respond_json(r, 200, json_object());
}

int acc_registration_tokens_routes(http_server *s)
{
    const char *one = "/_synapse/admin/v1/registration_tokens/{token}";
    return client_route(s, "GET",
                        "/_matrix/client/v1/register/m.login.registration_token/validity",
                        get_validity, 0) < 0 ||
                   client_route(s, "GET", "/_synapse/admin/v1/registration_tokens", list_tokens,
                                0) < 0 ||
                   client_route(s, "POST", "/_synapse/admin/v1/registration_tokens/new",
                                new_token, ACC_MAX_BODY_BYTES) < 0 ||
                   client_route(s, "GET", one, get_token, 0) < 0 ||
                   client_route(s, "PUT", one, put_token, ACC_MAX_BODY_BYTES) < 0 ||
                   client_route(s, "DELETE", one, delete_token, 0) < 0
               ? -1
               : 0;
}
