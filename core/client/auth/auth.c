/*
 * core/client/auth/auth.c - access tokens and passwords (see auth.h for the decisions).
 *
 * Token look-ups use a prepared-free parameterized query on a pooled connection held only
 * for the query. The token's hash is the primary key, so the look-up is one index probe;
 * the same query reads the device's last_seen_ts for auth_seen_note (auth_seen.c).
 */
#include <pthread.h>
#include <sodium.h>
#include <strings.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/appservice/appservice.h"
#include "core/client/auth/auth.h"
#include "core/config/config.h"
#include "core/runtime/core_runtime.h"

rt_pool *auth_pool(void)
{
    core_runtime *rt = core_runtime_get();
    return rt ? rt->auth_pool : NULL;
}

/* The SHA-256 of a token in hex, the key of its row and of the token cache. Every
 * authenticated request needs it, and a kept-alive connection sends the same token again
 * and again, so each thread remembers the last one it computed - under a SipHash of the
 * token with a key made at start, never the token itself. A different token whose SipHash
 * matches would need the key: SipHash is a keyed pseudorandom function, and the 128-bit
 * variant is used. SHA-256 in libsodium's portable code was 2% of a cached download. */
static unsigned char memo_key[crypto_shorthash_siphashx24_KEYBYTES];
static pthread_once_t memo_once = PTHREAD_ONCE_INIT;
static _Thread_local unsigned char memo_tag[crypto_shorthash_siphashx24_BYTES];
static _Thread_local char memo_hex[65]; /* empty: nothing remembered yet */

static void make_memo_key(void)
{
    randombytes_buf(memo_key, sizeof(memo_key));
}

static void token_hash_hex(const char *token, char out[65])
{
    size_t len = strlen(token);
    unsigned char tag[crypto_shorthash_siphashx24_BYTES];
    pthread_once(&memo_once, make_memo_key);
    crypto_shorthash_siphashx24(tag, (const unsigned char *)token, len, memo_key);
    if (memo_hex[0] && sodium_memcmp(tag, memo_tag, sizeof(tag)) == 0) {
        memcpy(out, memo_hex, sizeof(memo_hex));
        return;
    }
    unsigned char h[crypto_hash_sha256_BYTES];
    crypto_hash_sha256(h, (const unsigned char *)token, len);
    sodium_bin2hex(out, 65, h, sizeof(h));
    memcpy(memo_tag, tag, sizeof(tag));
    memcpy(memo_hex, out, sizeof(memo_hex));
}

const char *auth_token_of(atrium_req *r)
{
    const char *hdr = http_req_header(r, "Authorization");
    if (hdr) {
        if (strncasecmp(hdr, "Bearer ", 7) != 0) return NULL;
        const char *t = hdr + 7;
        while (*t == ' ') t++;
        return *t ? t : NULL;
    }
    const char *q = http_req_query(r, "access_token");
    return q && *q ? q : NULL;
}

/* The guest rule at the door: a guest's request outside auth_guest_allows is refused. */
static const char *admit(atrium_req *r)
{
    if (!r->is_guest || auth_guest_allows(r)) return r->user;
    r->user = r->device = NULL; /* not authenticated for this request */
    r->is_guest = -1;             /* and refused: auth_request answers NULL from now on */
    http_respond_error(r, 403, "M_GUEST_ACCESS_FORBIDDEN", "Guests may not use this endpoint");
    return NULL;
}

const char *auth_request(atrium_req *r)
{
    if (r->user) return r->user;
    if (r->is_guest < 0) return NULL; /* refused already (a guest outside the list) */
    const char *token = auth_token_of(r);
    if (!token) {
        http_respond_error(r, 401, "M_MISSING_TOKEN", "Missing access token");
        return NULL;
    }
    const as_service *svc = as_by_token(token); /* an application service (as_module.c) */
    if (svc) return as_authenticate(r, svc);
    char hex[65];
    token_hash_hex(token, hex);
    uint64_t epoch;
    if (auth_cache_lookup(r, hex, &epoch)) {
        auth_seen_note(r, AUTH_SEEN_UNKNOWN);
        return admit(r);
    }
    PGconn *c = http_db_checkout(r);
    if (!c) return NULL;
    const char *params[1] = {hex};
    PGresult *res = db_query(c,
                             "SELECT t.user_id, t.device_id, u.is_admin, d.last_seen_ts,"
                             " u.is_guest,"
                             " t.expires_ts - (extract(epoch from now()) * 1000)::bigint,"
                             " t.retires"
                             " FROM access_tokens t JOIN users u ON u.user_id = t.user_id"
                             " LEFT JOIN devices d ON d.user_id = t.user_id"
                             " AND d.device_id = t.device_id"
                             " WHERE t.token_hash = $1 AND NOT u.deactivated",
                             1, params);
    bool ok = PQresultStatus(res) == PGRES_TUPLES_OK;
    if (!ok) rt_log(ATRIUM_LOG_ERROR, "core", "token look-up failed: %s", PQresultErrorMessage(res));
    int64_t seen_ts = 0; /* NULL (never seen, or no device row): due */
    bool expired = false;
    if (ok && PQntuples(res) == 1) {
        int64_t valid_ms = PQgetisnull(res, 0, 5) ? INT64_MAX
                                                  : strtoll(PQgetvalue(res, 0, 5), NULL, 10);
        expired = valid_ms <= 0;
        if (!expired) {
            r->user = rt_arena_strdup(r->arena, PQgetvalue(res, 0, 0));
            r->device = rt_arena_strdup(r->arena, PQgetvalue(res, 0, 1));
            r->is_admin = PQgetvalue(res, 0, 2)[0] == 't' ? 1 : 0;
            r->is_guest = PQgetvalue(res, 0, 4)[0] == 't' ? 1 : 0;
        }
        int flags = (r->is_admin ? AUTH_FLAG_ADMIN : 0) | (r->is_guest ? AUTH_FLAG_GUEST : 0);
        if (r->user && r->device && !PQgetisnull(res, 0, 6)) {
            /* The first use of a refreshed token: its predecessors stop working now. */
            if (auth_retire_refresh(c, PQgetvalue(res, 0, 6), hex))
                auth_cache_forget_user(r->user); /* the old access token may be cached */
        } else if (r->user && r->device) {
            auth_cache_store(hex, r->user, r->device, flags, epoch, valid_ms);
        }
        if (!PQgetisnull(res, 0, 3)) seen_ts = strtoll(PQgetvalue(res, 0, 3), NULL, 10);
        if (seen_ts < 0) seen_ts = 0;
    }
    PQclear(res);
    http_db_checkin(c);
    if (r->user) auth_seen_note(r, seen_ts); /* after the release: it may take its own */
    if (!ok) {
        http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
        return NULL;
    }
    if (!r->user) {
        /* An expired token's client refreshes it (POST /refresh) without losing its data. */
        json_t *body = json_pack("{s:s, s:s, s:b}", "errcode", "M_UNKNOWN_TOKEN", "error",
                                 expired ? "The access token has expired; refresh it"
                                         : "Unknown or revoked access token",
                                 "soft_logout", expired);
        r->out_headers = NULL;
        if (http_respond_json(r, 401, body) == 0 && r->response)
            MHD_add_response_header(r->response, "Cache-Control", "no-store"); /* a failure */
        return NULL;
    }
    return admit(r);
}

int auth_is_admin(atrium_req *r)
{
    if (!r->user) return 0;
    return r->is_admin;
}

void auth_token_hash(const char *token, char out[65])
{
    token_hash_hex(token, out);
}

/* AUTH_TOKEN_PREFIX (or prefix) and base64url of 32 random bytes into token_out. */
static void mint(const char *prefix, char *token_out)
{
    unsigned char raw[32];
    randombytes_buf(raw, sizeof(raw));
    char b64[sodium_base64_ENCODED_LEN(32, sodium_base64_VARIANT_URLSAFE_NO_PADDING)];
    sodium_bin2base64(b64, sizeof(b64), raw, sizeof(raw), sodium_base64_VARIANT_URLSAFE_NO_PADDING);
    snprintf(token_out, AUTH_TOKEN_CHARS + 1, "%s%s", prefix, b64);
}

int auth_issue_token_ex(PGconn *conn, const char *user_id, const char *device_id,
                        int64_t lifetime_ms, const char *retires, char *token_out)
{
    mint(AUTH_TOKEN_PREFIX, token_out);
    char hex[65], lifetime[24];
    token_hash_hex(token_out, hex);
    snprintf(lifetime, sizeof(lifetime), "%lld", (long long)lifetime_ms);
    const char *params[5] = {hex, user_id, device_id, lifetime_ms > 0 ? lifetime : NULL, retires};
    PGresult *res = db_query(conn,
                             "INSERT INTO access_tokens (token_hash, user_id, device_id,"
                             " created_ts, expires_ts, retires)"
                             " VALUES ($1, $2, $3, (extract(epoch from now()) * 1000)::bigint,"
                             " (extract(epoch from now()) * 1000)::bigint + $4::bigint, $5)",
                             5, params);
    bool ok = PQresultStatus(res) == PGRES_COMMAND_OK;
    if (!ok) rt_log(ATRIUM_LOG_ERROR, "core", "storing a token failed: %s", PQresultErrorMessage(res));
    PQclear(res);
    return ok ? 0 : ATRIUM_E_DB;
}

int auth_issue_token(PGconn *conn, const char *user_id, const char *device_id, char *token_out)
{
    return auth_issue_token_ex(conn, user_id, device_id, 0, NULL, token_out);
}

void auth_mint_refresh_token(char *token_out)
{
    mint(AUTH_REFRESH_PREFIX, token_out);
}

bool auth_retire_refresh(PGconn *conn, const char *retired, const char *successor)
{
    /* One statement, so a retirement is whole or not at all: the refresh token that was
     * replaced goes with the access token minted beside it, and its successors (the access
     * token and the refresh token that replaced it) forget it. */
    const char *params[2] = {retired, successor};
    PGresult *res = db_query(conn,
                             "WITH old AS (DELETE FROM refresh_tokens WHERE token_hash = $1"
                             "  RETURNING access_hash),"
                             " gone AS (DELETE FROM access_tokens WHERE token_hash IN"
                             "  (SELECT access_hash FROM old)),"
                             " kept AS (UPDATE refresh_tokens SET retires = NULL"
                             "  WHERE retires = $1)"
                             " UPDATE access_tokens SET retires = NULL WHERE retires = $1"
                             " OR token_hash = $2",
                             2, params);
    bool ok = PQresultStatus(res) == PGRES_COMMAND_OK;
    if (!ok) rt_log(ATRIUM_LOG_ERROR, "core", "retiring a refresh token failed: %s",
                    PQresultErrorMessage(res));
    PQclear(res);
    return ok;
}

int auth_hash_password(const char *password, char *hash_out)
{
    /* The cost the operator set (password_hashing.*); libsodium's interactive cost (the
     * settings' defaults) when no runtime object is bound (unit tests, CLI subcommands). */
    unsigned long long passes = crypto_pwhash_OPSLIMIT_INTERACTIVE;
    size_t memory_bytes = crypto_pwhash_MEMLIMIT_INTERACTIVE;
    core_runtime *rt = core_runtime_get();
    if (rt && rt->cfg) {
        passes = (unsigned long long)rt->cfg->password_hashing.passes;
        memory_bytes = (size_t)rt->cfg->password_hashing.memory_kib * 1024;
    }
    if (crypto_pwhash_str(hash_out, password, strlen(password), passes, memory_bytes) != 0)
        return ATRIUM_E_NOMEM;
    return 0;
}

bool auth_check_password(const char *hash, const char *password)
{
    return crypto_pwhash_str_verify(hash, password, strlen(password)) == 0;
}

/* A hash of a random password, made once, for checks against users that do not exist. */
static char dummy_hash[crypto_pwhash_STRBYTES];
static bool dummy_ok;
static pthread_once_t dummy_once = PTHREAD_ONCE_INIT;

static void make_dummy_hash(void)
{
    char pw[33];
    unsigned char raw[16];
    randombytes_buf(raw, sizeof(raw));
    sodium_bin2hex(pw, sizeof(pw), raw, sizeof(raw));
    dummy_ok = auth_hash_password(pw, dummy_hash) == 0;
}

void auth_prepare_dummy_hash(void)
{
    pthread_once(&dummy_once, make_dummy_hash);
}

bool auth_verify_password(const char *hash, const char *password)
{
    if (hash && hash[0]) return auth_check_password(hash, password);
    pthread_once(&dummy_once, make_dummy_hash);
    /* The check only costs the time of a real one (no user tells itself apart by speed);
     * its answer is meaningless. */
    if (dummy_ok) RT_IGNORE(auth_check_password(dummy_hash, password));
    return false;
}
