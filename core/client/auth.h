/*
 * core/client/auth.h - who is calling: access tokens, passwords, and the request's user.
 *
 * Access tokens are 256-bit random values; only their SHA-256 is stored (access_tokens),
 * so a database leak does not hand out sessions. Every authenticated request looks its
 * token up in PostgreSQL, so a token revoked by logout stops working at once in every
 * process that shares the database (a cache, when one comes, must be invalidated through
 * LISTEN/NOTIFY: DESIGN §8). Passwords are hashed with Argon2id (libsodium); hashing runs
 * on the small "auth" pool so its memory is bounded and no request-pool thread waits on it.
 * Internal prefix: auth_.
 */
#ifndef ATRIUM_CORE_AUTH_H
#define ATRIUM_CORE_AUTH_H

#include <stdbool.h>
#include <stddef.h>

#include "core/http/http.h"
#include "core/store/db.h"

#define AUTH_TOKEN_PREFIX "atr_"
#define AUTH_TOKEN_CHARS 48 /* prefix + base64url of 32 random bytes */
#define AUTH_DB_WAIT_MS 2000

/* [req] Authenticate r from "Authorization: Bearer <token>" or ?access_token=. On success
 * sets r->user and r->device (arena strings; the client key becomes the user) and returns
 * the user ID. On failure sets the response (401 M_MISSING_TOKEN or M_UNKNOWN_TOKEN, or
 * 503 when the database cannot be reached) and returns NULL: the handler returns
 * ATRIUM_DONE. Idempotent: a second call returns the cached user. */
const char *auth_request(atrium_req *r);
/* [req] Is the authenticated user a server admin? 1, 0, or ATRIUM_E_DB. */
int auth_is_admin(atrium_req *r);

/* Mint a token for (user, device), store its hash. token_out gets the token text
 * (AUTH_TOKEN_CHARS + 1 bytes). 0 or ATRIUM_E_DB. conn: a connection the caller holds. */
int auth_issue_token(PGconn *conn, const char *user_id, const char *device_id, char *token_out);
/* Forget one token / every token of a user (logout, logout/all). 0 or ATRIUM_E_DB. */
int auth_revoke_token(PGconn *conn, const char *token);
int auth_revoke_user_tokens(PGconn *conn, const char *user_id);

/* Argon2id. hash_out must hold crypto_pwhash_STRBYTES (128). 0 or ATRIUM_E_NOMEM. Slow
 * and memory-hungry by design: call on the auth pool (auth_pool()). */
int auth_hash_password(const char *password, char *hash_out);
bool auth_check_password(const char *hash, const char *password);
/* The login rule: true only when hash (a stored Argon2id string) matches password. A NULL
 * hash (no such user, or no password set) costs the same time as a real check and returns
 * false, so an answer's timing does not tell whether a user exists. Auth pool only. */
bool auth_verify_password(const char *hash, const char *password);
/* Make the hash auth_verify_password checks unknown users against now, not at the first
 * failed login (which would then take longer and tell). Auth pool only; idempotent. */
void auth_prepare_dummy_hash(void);

/* The pool password hashing runs on (2 threads: at most 2 hashes' memory at once). */
rt_pool *auth_pool(void);
void auth_set_pool(rt_pool *p);

/* The token of the request, or NULL. */
const char *auth_token_of(atrium_req *r);

#endif
