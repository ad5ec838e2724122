/*
 * core/client/accounts/accounts.h - what the account files share: who a login names, user
 * IDs (the localpart grammar, the server's name), short database helpers, creating accounts
 * and login sessions, and user-interactive auth. Reading a request (path parameters, query
 * arguments, the JSON body and its typed fields) is core/http/http.h, for every module.
 *
 * The account family is one client module (ACCOUNTS_MODULE in accounts.c) spread over files by
 * concern, each file X.c holding the functions acc_X_* (the file name is the prefix): register.c,
 * admin_register.c, login.c, devices.c, profile.c, filters.c, account_data.c, tags.c, misc.c,
 * user_directory.c, deactivate.c, openid.c, refresh.c, login_token.c,
 * registration_tokens.c; uia.c is uia_, and account_util.c the
 * acc_ helpers every file shares. The module also registers the push endpoints
 * (core/client/push/: their tables are this module's, and they use its database helpers).
 * Each file registers its own routes from an *_routes function called by the module's init.
 * Password work (Argon2id hashing and checking) always runs on the auth pool: a handler validates
 * on the request pool, hands the request off with susp_handoff(r, auth_pool(), ...), and finishes
 * when it runs again with run_reason ATRIUM_RUN_HANDOFF, reading what the first run decided from
 * r->core_state. This header does not hold the rate limiters (ratelimits.h) or token handling
 * (auth.h). Internal prefix: acc_ (and uia_ for user-interactive auth).
 */
#ifndef ATRIUM_CORE_ACCOUNTS_H
#define ATRIUM_CORE_ACCOUNTS_H

#include <jansson.h>
#include <stdbool.h>

#include "core/client/auth/auth.h"
#include "core/client/client.h"

#define ACC_MAX_BODY_BYTES (64 * 1024)    /* every account endpoint's JSON body */
#define ACC_USER_ID_MAX_BYTES 255         /* the spec's limit on a whole user ID */
#define ACC_PASSWORD_MAX_BYTES 512
#define ACC_DEVICE_ID_MAX_BYTES 128
#define ACC_DEVICE_NAME_MAX_BYTES 256
#define ACC_DISPLAYNAME_MAX_BYTES 256
#define ACC_AVATAR_URL_MAX_BYTES 1024
#define ACC_RANDOM_ID_CHARS 10            /* random localparts and device IDs */

/* ---- logins ------------------------------------------------------------------------------ */

/* [req] Who a login or an auth stage names: `identifier` {type: m.id.user, user}, else the
 * deprecated top-level `user` (*user NULL when neither is there). false after answering 400
 * (M_UNKNOWN for another identifier type). */
bool acc_user_identifier(atrium_req *r, json_t *obj, const char **user);

/* ---- user IDs ---------------------------------------------------------------------------- */

/* Is lp a localpart this server hands out (a-z 0-9 . _ = - / +, non-empty, short enough
 * that the whole user ID fits ACC_USER_ID_MAX_BYTES)? */
bool acc_localpart_ok(const struct core_config *cfg, const char *lp);
/* [req] "@<lp>:<server_name>" in r's arena (NULL on out of memory). */
char *acc_user_id(atrium_req *r, const char *localpart);
/* [req] The user ID a registration's username asks for: upper case folded, then checked
 * with acc_localpart_ok. NULL when the name is not a valid localpart (nothing answered). */
const char *acc_user_id_for_username(atrium_req *r, const char *username);
/* [req] A login's user (a localpart or a full user ID; upper case folded) as this server's
 * user ID, or NULL when it cannot be a local user. */
const char *acc_local_user(atrium_req *r, const char *user);
/* [req] False only for a well-formed user ID of another server ("@lp:other"): anything
 * else is this server's to answer (or to refuse as unknown). */
bool acc_is_local_user(atrium_req *r, const char *user_id);
/* [req] The profile of a local user as a new {displayname?, avatar_url?}; NULL after
 * answering (404 M_NOT_FOUND for an unknown user, 503 when the database fails). Shared by
 * GET /profile and the federation profile query. */
json_t *acc_profile_load(atrium_req *r, const char *user_id);
/* profile_remote.c: GET /_matrix/federation/v1/query/profile, other servers asking for
 * our users' profiles (registered at init; 0 or -1). */
int acc_profile_remote_routes(http_server *s);
/* [req] GET /profile for a user of another server, asked over federation while the request
 * waits parked (profile_remote.c); field NULL = the whole profile. */
int acc_profile_remote(atrium_req *r, const char *user_id, const char *field);
/* The localpart of a user ID of this server, into the arena; NULL when not local. */
const char *acc_localpart_of(atrium_req *r, const char *user_id);
/* Fill out with n random characters from a-z0-9 and a NUL. */
void acc_random_chars(char *out, size_t n);
/* A new device ID (ACC_RANDOM_ID_CHARS upper-case letters and digits) into out. */
void acc_random_device_id(char out[ACC_RANDOM_ID_CHARS + 1]);

/* ---- database ---------------------------------------------------------------------------- */

/* A request's pooled connection: http_db_checkout / http_db_checkin (core/http/http.h).
 * Hold it only for queries: give it back before any handoff or password work. */
/* One parameterized statement (text parameters). The result (tuples or command OK), or
 * NULL after logging the failure. The caller PQclears a non-NULL result. */
PGresult *acc_q(PGconn *c, const char *sql, int n, const char *const *params) RT_MUST_CHECK;
/* A statement whose result is not needed: db_exec (core/store/db.h). */
/* [req] Answer 503 for a failed query (M_UNKNOWN, retry). Returns ATRIUM_DONE. */
int acc_db_failed(atrium_req *r);
/* Does user_id exist (deactivated or not)? 1, 0, or ATRIUM_E_DB. */
int acc_user_exists(PGconn *c, const char *user_id);

/* ---- accounts and login sessions -------------------------------------------------------- */

typedef struct acc_new_account {
    const char *user_id;
    const char *password;       /* hashed here (auth pool) */
    const char *device_id;      /* NULL: a random one */
    const char *device_name;    /* may be NULL */
    const char *displayname;    /* NULL: the localpart */
    bool admin;
    bool guest;                 /* a guest account: password NULL, a guest's rights */
    bool inhibit_login;         /* create no device and no token */
    bool with_home_server;      /* add home_server to the answer */
    bool refresh;               /* the client asked for a refresh token (refresh.c) */
    const char *uia_session;    /* marked as having registered the user; may be NULL */
    const char *password_hash;  /* instead of password: the hash the UIA session kept */
    const char *registration_token; /* its reserved use becomes a completed one */
} acc_new_account;

/* After committing anything that deleted user_id's devices or tokens: this process's token
 * cache forgets them at once (others hear the trigger's NOTIFY), and room-mates' parked
 * syncs learn that the user's device list changed. */
void acc_tokens_revoked(PGconn *c, const char *user_id);

/* [auth pool] Hash the password, create the user, its profile and (unless inhibit_login)
 * a device with a token in one transaction, and answer 200 {user_id, access_token,
 * device_id}; 400 M_USER_IN_USE when the user exists; 503 on database trouble. Returns
 * ATRIUM_DONE. */
int acc_create_account(atrium_req *r, const acc_new_account *a);
/* A login session for (user, device) with conn held inside a transaction the caller owns:
 * creates the device (or renames it when name is given), records where it was seen (ip,
 * user_agent: auth_user_agent's text or NULL), revokes the device's old tokens, and mints
 * a token into token_out (AUTH_TOKEN_CHARS + 1). 0 or ATRIUM_E_DB. */
int acc_open_session(PGconn *c, const char *user_id, const char *device_id, const char *name,
                     const char *ip, const char *user_agent, char *token_out) RT_MUST_CHECK;
/* refresh.c: make the session just opened (acc_open_session's token access_token)
 * refreshable, inside the caller's transaction: the access token expires lifetime_ms from
 * now, and a refresh token paired with it goes into refresh_out (AUTH_TOKEN_CHARS + 1).
 * 0 or ATRIUM_E_DB. */
int acc_session_refreshable(PGconn *c, const char *user_id, const char *device_id,
                            int64_t lifetime_ms, const char *access_token,
                            char *refresh_out) RT_MUST_CHECK;
/* login_token.c: consume the m.login.token `token` (single use) inside or outside a
 * transaction: 1 and *user_id (r's arena) for a live token of an active user, 0 for an
 * unknown, used or expired one, ATRIUM_E_DB. conn held. */
int acc_login_token_take(atrium_req *r, PGconn *c, const char *token, const char **user_id);
/* [req] Is m.login.token served (auth.login_via_existing_session)? */
bool acc_login_token_enabled(atrium_req *r);
/* Delete devices of user_id (all when device_ids is NULL, else the n listed; keep_device,
 * if not NULL, survives) and every token of theirs. conn held. true on success. */
bool acc_delete_devices(PGconn *c, const char *user_id, const char *const *device_ids,
                        size_t n, const char *keep_device) RT_MUST_CHECK;

/* [req] Hand r to the auth pool with state in r->core_state; answers 429/503 itself
 * when the pool refuses. Returns what the handler returns. */
int acc_to_auth_pool(atrium_req *r, void *state);

/* ---- user-interactive auth (uia.c) ------------------------------------------------------ */

#define UIA_STAGE_DUMMY "m.login.dummy"
#define UIA_STAGE_PASSWORD "m.login.password"
#define UIA_STAGE_REGISTRATION_TOKEN "m.login.registration_token"
#define UIA_SESSION_TTL_MS (30 * 60 * 1000)

/* [req] Answer 401 with the UIA body for the one-stage flow `stage`: a session (an existing
 * one when session is not NULL, else a new one stored for purpose and user_id, "" before
 * login) plus errcode/error when errcode is not NULL. Returns ATRIUM_DONE. */
int uia_challenge(atrium_req *r, const char *stage, const char *purpose, const char *user_id,
                  const char *session, const char *errcode, const char *error);
/* [req] Check the auth dict of a request: its type must be `stage` and its session, when
 * given, one this server issued for purpose and user_id that has not expired, begun by a
 * request of the same method and path. true: go on (*session_out = the session or NULL);
 * false: answered (a fresh 401 challenge with an errcode, 403 for a session of another
 * operation, or 503). */
bool uia_check(atrium_req *r, json_t *auth, const char *stage, const char *purpose,
               const char *user_id, const char **session_out);
/* The same for a flow of several stages (flow: NULL-terminated), with the session's
 * `completed` stages in the answer; uia_challenge is the one-stage flow. */
int uia_challenge_flow(atrium_req *r, const char *const *flow, const char *purpose,
                       const char *user_id, const char *session, const char *errcode,
                       const char *error);
/* uia_check for a flow of several stages: auth.type must be one of them (*type_out). */
bool uia_check_flow(atrium_req *r, json_t *auth, const char *const *flow, const char *purpose,
                    const char *user_id, const char **session_out, const char **type_out);
/* A new session stored for purpose and user_id (conn held): its ID in r's arena, or NULL on
 * database trouble. */
const char *uia_session_open(atrium_req *r, PGconn *c, const char *purpose, const char *user_id);
/* Record that session completed stage (conn held, in the caller's transaction or not): 1
 * when every stage of flow is now completed, 0 when some are left, ATRIUM_E_DB. */
int uia_complete_stage(PGconn *c, const char *session, const char *stage,
                       const char *const *flow);
/* [req] The body of a request that may carry UIA (the handlers call it instead of
 * http_req_json): the parsed body ({} for an empty one). When it holds only `auth` with a
 * session this server issued, the parameters the session's first request gave (secrets
 * left out) are filled in, so a client may resubmit with auth alone. NULL after answering
 * 400. */
json_t *uia_body(atrium_req *r);
/* The registration session `session` created user_id (conn held, in the caller's
 * transaction): kept, so a retry of the finished registration is answered again
 * (register.c). true on success. */
bool uia_registered(PGconn *c, const char *session, const char *user_id);
/* Forget a session once its operation succeeded (conn held; NULL session is a no-op). */
void uia_forget(PGconn *c, const char *session);

/* Password UIA for an authenticated user's sensitive operation (device deletion, password
 * change). First run: uia_password_begin reads body.auth and returns true when the request
 * should go to the auth pool (p filled), false when it answered (401 challenge, 400).
 * On the auth pool: uia_password_verify checks the password; false when it answered (401
 * with M_FORBIDDEN, 503). */
typedef struct uia_password {
    const char *session;
    const char *password;
} uia_password;
bool uia_password_begin(atrium_req *r, json_t *body, const char *purpose, uia_password *p);
bool uia_password_verify(atrium_req *r, const uia_password *p, const char *purpose);

/* ---- registration tokens (registration_tokens.c) --------------------------------------- */

/* Reserve a use of a valid registration token (pending + 1): 1 done, 0 not valid,
 * ATRIUM_E_DB. conn held. */
int acc_registration_tokens_reserve(PGconn *c, const char *token);
/* A registration that reserved a use of token succeeded: pending - 1, completed + 1. conn
 * held, in the registration's transaction. */
bool acc_registration_tokens_complete(PGconn *c, const char *token) RT_MUST_CHECK;

/* ---- account data (account_data.c) -------------------------------------------------------- */

/* Upsert (user_id, room_id ("" = global), type) = content (JSON object text) with a new
 * stream position (nextval('stream_seq')). conn held, usually inside the caller's
 * transaction; the caller calls notifier_wake_user(user_id) after its commit. true on
 * success. */
bool acc_account_data_store(PGconn *c, const char *user_id, const char *room_id,
                            const char *type, const char *content);

/* ---- filters (filters.c) ------------------------------------------------------------------ */

/* The filter filter_id of user_id as stored, into *out (a new reference): 1 found, 0 no
 * such filter (*out NULL), ATRIUM_E_DB (logged). conn held. For /sync's ?filter=<id>. */
int acc_filter_load(PGconn *c, const char *user_id, const char *filter_id, json_t **out);

/* ---- route registration, one per file ------------------------------------------------------ */

int acc_register_routes(http_server *s);
int acc_admin_register_routes(http_server *s);
int acc_login_routes(http_server *s);
int acc_devices_routes(http_server *s);
int acc_profile_routes(http_server *s);
int acc_filters_routes(http_server *s);
int acc_account_data_routes(http_server *s);
int acc_tags_routes(http_server *s);
int acc_misc_routes(http_server *s);
int acc_whois_routes(http_server *s);
int acc_user_directory_routes(http_server *s);
int acc_deactivate_routes(http_server *s);
/* openid.c: the OpenID token endpoints, the client's and the federation userinfo. */
int acc_openid_routes(http_server *s);
/* refresh.c: POST /refresh. login_token.c: POST /login/get_token. */
int acc_refresh_routes(http_server *s);
int acc_login_token_routes(http_server *s);
/* registration_tokens.c: the validity check and the admin API. */
int acc_registration_tokens_routes(http_server *s);

#endif
