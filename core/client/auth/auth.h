/*
 * core/client/auth/auth.h - who is calling: access tokens, passwords, and the request's user.
 *
 * Access tokens are 256-bit random values; only their SHA-256 is stored (access_tokens),
 * so a database leak does not hand out sessions. An authenticated request finds its token
 * in a small cache (auth_cache.c) or in PostgreSQL; a token revoked by logout stops
 * working at once in this process, and in every other process sharing the database as
 * soon as PostgreSQL's NOTIFY reaches it (docs/architecture.md, 'More than one process').
 * Passwords are hashed with Argon2id
 * (libsodium); hashing runs on the small "auth" pool so its memory is bounded and no
 * request-pool thread waits on it. An authenticated request also keeps its device's
 * last_seen_ts/last_seen_ip current, writing at most once per AUTH_SEEN_REFRESH_MS
 * (auth_seen.c). Internal prefix: auth_.
 */
#ifndef ATRIUM_CORE_AUTH_H
#define ATRIUM_CORE_AUTH_H

#include <stdbool.h>
#include <stddef.h>

#include "core/http/http.h"
#include "core/store/db.h"

#define AUTH_TOKEN_PREFIX "atr_"
#define AUTH_TOKEN_CHARS 48 /* prefix + base64url of 32 random bytes */
#define AUTH_REFRESH_PREFIX "atrr_" /* refresh tokens: the same length */

/* [req] Authenticate r from "Authorization: Bearer <token>" or ?access_token=. On success
 * sets r->user and r->device (arena strings; the client key becomes the user) and returns
 * the user ID. An application service's as_token is that service's sender, or the user
 * ?user_id= names (as_authenticate, core/client/appservice/appservice.h). On failure sets the response (401 M_MISSING_TOKEN or M_UNKNOWN_TOKEN, or
 * 503 when the database cannot be reached) and returns NULL: the handler returns
 * ATRIUM_DONE. Idempotent: a second call returns the cached user. */
const char *auth_request(atrium_req *r);
/* [req] May the guest r->user call r's route (auth_guest.c holds the list)? */
bool auth_guest_allows(atrium_req *r);
/* [req] Is the authenticated user a server admin? 1, 0, or ATRIUM_E_DB. */
int auth_is_admin(atrium_req *r);

/* Mint a token for (user, device), store its hash. token_out gets the token text
 * (AUTH_TOKEN_CHARS + 1 bytes). 0 or ATRIUM_E_DB. conn: a connection the caller holds. */
int auth_issue_token(PGconn *conn, const char *user_id, const char *device_id,
                     char *token_out) RT_MUST_CHECK;
/* auth_issue_token for a refreshable session (core/client/accounts/refresh.c): the token
 * expires lifetime_ms from now (<= 0: never; past it auth_request answers 401
 * M_UNKNOWN_TOKEN with soft_logout: true), and at its first use retires the refresh token
 * whose hash is `retires` (NULL: none) with auth_retire_refresh. 0 or ATRIUM_E_DB. */
int auth_issue_token_ex(PGconn *conn, const char *user_id, const char *device_id,
                        int64_t lifetime_ms, const char *retires, char *token_out) RT_MUST_CHECK;
/* A new refresh token's text (AUTH_TOKEN_CHARS + 1 bytes; stored by the caller, hashed). */
void auth_mint_refresh_token(char *token_out);
/* The stored form of a token (access or refresh): lower-case hex of its SHA-256. */
void auth_token_hash(const char *token, char out[65]);
/* The refresh token whose hash is `retired` was replaced and its successor (the access
 * token whose hash is `successor`, or a refresh token naming it) used: delete it and the
 * access token minted with it, and clear the mark on its successors. conn held (outside a
 * transaction or inside the caller's). false on database trouble (logged). The caller
 * forgets the user's cached tokens after its commit. */
bool auth_retire_refresh(PGconn *conn, const char *retired, const char *successor) RT_MUST_CHECK;

/* Argon2id. hash_out must hold crypto_pwhash_STRBYTES (128). 0 or ATRIUM_E_NOMEM. Slow
 * and memory-hungry by design: call on the auth pool (auth_pool()). */
int auth_hash_password(const char *password, char *hash_out) RT_MUST_CHECK;
bool auth_check_password(const char *hash, const char *password) RT_MUST_CHECK;
/* The login rule: true only when hash (a stored Argon2id string) matches password. A NULL
 * hash (no such user, or no password set) costs the same time as a real check and returns
 * false, so an answer's timing does not tell whether a user exists. Auth pool only. */
bool auth_verify_password(const char *hash, const char *password) RT_MUST_CHECK;
/* Make the hash auth_verify_password checks unknown users against now, not at the first
 * failed login (which would then take longer and tell). Auth pool only; idempotent. */
void auth_prepare_dummy_hash(void);

/* The pool password hashing runs on (2 threads: at most 2 hashes' memory at once): the
 * runtime object's auth_pool, created by core/main.c. NULL when none is bound. */
rt_pool *auth_pool(void);

/* ---- the token cache (auth_cache.c) ------------------------------------------------- */
/* The cache is the runtime object's (rt->auth_cache); the look-ups below use the bound
 * object's and do nothing (miss) without one. */
typedef struct auth_cache auth_cache;
/* An empty cache with its metrics registered, or NULL on out of memory. At start-up, before
 * requests (the accounts module's init). */
auth_cache *auth_cache_new(rt_metrics *metrics);
/* Hear revocations from other processes (NOTIFY atrium_auth) through the notification
 * service s (core/store/notify.h), before it starts. The cache answers nothing while s is
 * not live, nor once stopped. 0 or -1 (logged). Start-up. */
struct notify_service;
int auth_cache_listen(auth_cache *c, struct notify_service *s);
/* Empty the cache for good (look-ups miss from here on). Shutdown. */
void auth_cache_stop(auth_cache *c);
/* Stop (if running) and free c; NULL is fine. After every thread that could use it stopped. */
void auth_cache_free(auth_cache *c);
/* [req] A cached (user, device, admin) for the token hash, set on r; false on a miss.
 * *epoch_out is what auth_cache_store needs after the database look-up. */
bool auth_cache_lookup(atrium_req *r, const char *hash, uint64_t *epoch_out);
#define AUTH_FLAG_ADMIN 0x1
#define AUTH_FLAG_GUEST 0x2
/* valid_ms: how long the token stays valid (INT64_MAX: no expiry); the entry is trusted
 * no longer than that. */
void auth_cache_store(const char *hash, const char *user, const char *device, int flags,
                      uint64_t read_epoch, int64_t valid_ms);
/* Any thread: forget every cached token of user_id. Call after committing anything that
 * deletes a user's tokens or changes their admin or deactivated flag; other processes
 * learn it from the trigger's NOTIFY. */
void auth_cache_forget_user(const char *user_id);

/* ---- revocations confirmed by every process (auth_revoke.c) ------------------------- */
/* Hear other processes' acknowledgements (NOTIFY atrium_auth_ack) through s, and register
 * the metrics. Before s starts. 0 or -1 (logged). Start-up. */
int auth_revoke_listen(struct notify_service *s, rt_metrics *metrics);
/* [notification thread] Acknowledge revocation_id: this process dropped its tokens. */
void auth_revoke_ack(const char *revocation_id);
/* [req] After committing a transaction that deleted user_id's tokens (and forgetting them
 * here: acc_tokens_revoked), with c held outside a transaction: answer (status, body:
 * consumed) once every other live process acknowledged dropping them, or after the
 * bound. Parks r (no thread waits) and returns ATRIUM_PARKED, or answers at once and
 * returns ATRIUM_DONE. The handler must call auth_revoke_rerun first thing when it runs
 * again (before it authenticates: the token is gone). c may be released on return. */
int auth_revoke_answer(atrium_req *r, PGconn *c, const char *user_id, int status,
                       json_t *body);
/* [req] If r runs again after auth_revoke_answer parked it: answer, set *rc, true. */
bool auth_revoke_rerun(atrium_req *r, int *rc);

/* ---- when devices were last seen (auth_seen.c) ---------------------------------------- */
#define AUTH_SEEN_REFRESH_MS (5 * 60 * 1000) /* a device's row is rewritten at most this often */
#define AUTH_SEEN_RETRY_MS (30 * 1000)       /* after a refresh that could not be written */
#define AUTH_SEEN_UNKNOWN (-1)               /* no stored last_seen_ts at hand */
#define AUTH_USER_AGENT_MAX_BYTES 512        /* a stored User-Agent is cut here */

/* Key the table, register its metrics; 0. At start-up, before requests (the accounts
 * module's init). */
int auth_seen_init(rt_metrics *metrics);
/* [req] The request's User-Agent as the devices table keeps it (last_seen_user_agent):
 * printable ASCII only (other bytes become '?', so PostgreSQL always takes it as text), at
 * most AUTH_USER_AGENT_MAX_BYTES, in r's arena; NULL when the request names none. */
const char *auth_user_agent(atrium_req *r);
/* [req] r has just authenticated (r->user, r->device set): refresh the device's
 * last_seen_ts, last_seen_ip (r->client_addr) and last_seen_user_agent (auth_user_agent)
 * in PostgreSQL when auth_seen_due says so.
 * stored_ts: the devices row's last_seen_ts that the token look-up read (0 for NULL), or
 * AUTH_SEEN_UNKNOWN (a token from the cache). Never fails r and never sets a response; it
 * waits for a pooled connection only briefly and never for a locked row. */
void auth_seen_note(atrium_req *r, int64_t stored_ts);
/* The rule, with the wall clock passed in: true when the newest last-seen time known for
 * (user, device) - the one remembered here or stored_ts (>= 0, or AUTH_SEEN_UNKNOWN) - is
 * AUTH_SEEN_REFRESH_MS older than now_ms; the caller must then write now_ms, which is
 * remembered at once so concurrent requests do not write too. False when nothing is known.
 * Any thread. */
bool auth_seen_due(const char *user, const char *device, int64_t stored_ts, int64_t now_ms);
/* The write auth_seen_due asked for at due_ms failed: due again AUTH_SEEN_RETRY_MS later. */
void auth_seen_retry_later(const char *user, const char *device, int64_t due_ms);

/* The token of the request, or NULL. */
const char *auth_token_of(atrium_req *r);

#endif
