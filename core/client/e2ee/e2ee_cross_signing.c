/*
 * core/client/e2ee/e2ee_cross_signing.c - cross-signing: POST /keys/device_signing/upload (the
 * master, self-signing and user-signing keys) and POST /keys/signatures/upload.
 *
 * Owns the rule of when replacing cross-signing keys needs the account password
 * (needs_password): not while the user has no master key yet, and not for an upload whose
 * keys equal the stored ones (a client's retry); otherwise user-interactive auth with
 * m.login.password (uia.c), checked on the auth pool. Every stored change takes a stream
 * position for the owner (e2ee_record_key_change) so other users re-query.
 *
 * What it does not do: verify the ed25519 signatures themselves. The server checks that a
 * signature names the right signing key (a device is signed by its owner's self-signing
 * key, another user's master key by the signer's user-signing key, one's own master key by
 * one of one's devices) and that the signed object is the stored key; clients verify every
 * signature they rely on, so a forged one gains nothing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/accounts/accounts.h"
#include "core/client/e2ee/e2ee.h"

#define E2EE_SIGNATURES_MAX_KEYS 1000 /* signed keys per signatures/upload request */
#define XSIGN_UIA_PURPOSE "cross_signing_upload"

static const char *const XSIGN_TYPES[] = {"master", "self_signing", "user_signing"};
enum { XSIGN_N = 3 };

/* ---- the stored keys ---------------------------------------------------------------------- */

typedef struct xsign_keys {
    json_t *key[XSIGN_N];        /* stored key objects (owned), or NULL */
    const char *public[XSIGN_N]; /* their public keys (arena), or NULL */
} xsign_keys;

static void xsign_keys_free(xsign_keys *k)
{
    for (int i = 0; i < XSIGN_N; i++) json_decref(k->key[i]);
}

/* Load user's cross-signing keys. true, or false on a DB failure. */
static bool load_keys(atrium_req *r, PGconn *c, const char *user, xsign_keys *out)
{
    memset(out, 0, sizeof(*out));
    const char *p[1] = {user};
    PGresult *res = e2ee_sql(c, PGRES_TUPLES_OK,
                             "SELECT key_type, public_key, key_json FROM e2ee_cross_signing_keys"
                             " WHERE user_id = $1",
                             1, p);
    if (!res) return false;
    for (int i = 0; i < PQntuples(res); i++)
        for (int t = 0; t < XSIGN_N; t++)
            if (strcmp(PQgetvalue(res, i, 0), XSIGN_TYPES[t]) == 0) {
                out->public[t] = rt_arena_strdup(r->arena, PQgetvalue(res, i, 1));
                out->key[t] = json_loads(PQgetvalue(res, i, 2), 0, NULL);
            }
    PQclear(res);
    return true;
}

/* ---- keys/device_signing/upload -------------------------------------------------------- */

/* The keys of one upload, validated. */
typedef struct xsign_upload {
    const json_t *key[XSIGN_N];
    const char *public[XSIGN_N];
} xsign_upload;

/* Validate body's keys into up. NULL, or a message for the client. */
static const char *read_upload(atrium_req *r, const json_t *body, xsign_upload *up)
{
    static const char *const fields[XSIGN_N] = {"master_key", "self_signing_key",
                                                "user_signing_key"};
    memset(up, 0, sizeof(*up));
    bool any = false;
    for (int t = 0; t < XSIGN_N; t++) {
        const json_t *k = json_object_get(body, fields[t]);
        if (!k || json_is_null(k)) continue;
        const char *msg = e2ee_check_cross_signing_key(k, r->user, XSIGN_TYPES[t], &up->public[t]);
        if (msg) return rt_arena_printf(r->arena, "%s: %s", fields[t], msg);
        if (!e2ee_id_ok(up->public[t]))
            return rt_arena_printf(r->arena, "%s: the public key is too long", fields[t]);
        up->key[t] = k;
        any = true;
    }
    if (!any) return "Upload at least one of master_key, self_signing_key, user_signing_key";
    return NULL;
}

/* The password rule (see the file comment). */
static bool needs_password(const xsign_keys *stored, const xsign_upload *up)
{
    if (!stored->key[0]) return false;
    for (int t = 0; t < XSIGN_N; t++)
        if (up->key[t] && !(stored->key[t] && json_equal(stored->key[t], up->key[t])))
            return true;
    return false;
}

/* Store the uploaded keys and record the change. true, or false on a DB failure. */
static bool store_upload(PGconn *c, const char *user, const xsign_upload *up)
{
    for (int t = 0; t < XSIGN_N; t++) {
        if (!up->key[t]) continue;
        char *text = json_dumps(up->key[t], JSON_COMPACT);
        if (!text) return false;
        const char *p[4] = {user, XSIGN_TYPES[t], up->public[t], text};
        bool ok = db_exec(
            c,
            "INSERT INTO e2ee_cross_signing_keys (user_id, key_type, public_key, key_json)"
            " VALUES ($1, $2, $3, $4)"
            " ON CONFLICT (user_id, key_type) DO UPDATE SET public_key = EXCLUDED.public_key,"
            " key_json = EXCLUDED.key_json",
            4, p);
        free(text);
        if (!ok) return false;
    }
    return e2ee_record_key_change(c, user) == 0;
}

/* POST /_matrix/client/v3/keys/device_signing/upload. Runs twice when a password is needed:
 * first on the request pool (decides, hands off), then on the auth pool (checks, stores). */
static int post_device_signing_upload(atrium_req *r)
{
    if (!auth_request(r)) return ATRIUM_DONE;
    json_t *body = http_req_json(r);
    if (!body) return ATRIUM_DONE;
    xsign_upload up;
    const char *msg = read_upload(r, body, &up);
    if (msg) return http_respond_error(r, 400, "M_BAD_JSON", "%s", msg);

    /* Set only when this run is the one on the auth pool, after the first run's hand-off. */
    uia_password *pw = r->run_reason == ATRIUM_RUN_HANDOFF ? r->core_state : NULL;
    if (pw && !uia_password_verify(r, pw, XSIGN_UIA_PURPOSE)) return ATRIUM_DONE;
    PGconn *c = e2ee_db_begin(r);
    if (!c) return ATRIUM_DONE;
    /* Serialize a user's uploads: the decision below must see the keys it replaces. */
    const char *p[1] = {r->user};
    xsign_keys stored;
    if (!db_exec(c, "SELECT FROM users WHERE user_id = $1 FOR UPDATE", 1, p) ||
        !load_keys(r, c, r->user, &stored)) {
        e2ee_db_failed(r, c, true);
        http_db_checkin(c);
        return ATRIUM_DONE;
    }
    int outcome = 0; /* 0 store, 1 answered, 2 needs the password */
    if (!up.key[0] && !stored.key[0]) {
        http_respond_error(r, 400, "M_INVALID_PARAM", "Upload a master key first");
        outcome = 1;
    } else if (!pw && needs_password(&stored, &up)) {
        outcome = 2;
    }
    xsign_keys_free(&stored);
    if (outcome == 0 && (!store_upload(c, r->user, &up) || !db_commit(c))) {
        e2ee_db_failed(r, c, true);
        outcome = 1;
    } else if (outcome != 0) {
        db_rollback(c);
    }
    if (outcome == 0) {
        if (pw) uia_forget(c, pw->session);
        e2ee_wake_key_change(c, r->user);
        http_respond_json(r, 200, json_object());
    }
    http_db_checkin(c);
    if (outcome != 2) return ATRIUM_DONE;
    /* A password is needed: challenge, or check it on the auth pool and run again. */
    uia_password *state = rt_arena_alloc(r->arena, sizeof(*state));
    if (!state) return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    if (!uia_password_begin(r, body, XSIGN_UIA_PURPOSE, state)) return ATRIUM_DONE;
    return acc_to_auth_pool(r, state);
}

/* ---- keys/signatures/upload ---------------------------------------------------------------- */

/* A failure entry failures[user][key_id] = {errcode, error}. */
static void add_failure(json_t *failures, const char *user, const char *key_id,
                        const char *errcode, const char *error)
{
    json_t *per_user = json_object_get(failures, user);
    if (!per_user) {
        per_user = json_object();
        json_object_set_new(failures, user, per_user);
    }
    json_object_set_new(per_user, key_id, json_pack("{s:s, s:s}", "errcode", errcode, "error",
                                                    error));
}

/* The stored device keys of (user, device) as an object (owned), or NULL; *db_ok false on a
 * DB failure. */
static json_t *load_device_keys(PGconn *c, const char *user, const char *device, bool *db_ok)
{
    const char *p[2] = {user, device};
    PGresult *res = e2ee_sql(c, PGRES_TUPLES_OK,
                             "SELECT key_json FROM e2ee_device_keys"
                             " WHERE user_id = $1 AND device_id = $2",
                             2, p);
    if (!res) {
        *db_ok = false;
        return NULL;
    }
    json_t *k = PQntuples(res) ? json_loads(PQgetvalue(res, 0, 0), 0, NULL) : NULL;
    PQclear(res);
    return k;
}

/* Does signer_key_id name a key `signer` may sign target with? The signing rules (see the
 * file comment): `expect` is the public key ("ed25519:<pub>") that must sign, or NULL when
 * any of the signer's devices may ("ed25519:<device_id>" of a device with keys). */
static bool signer_key_ok(PGconn *c, const char *signer, const char *signer_key_id,
                          const char *expect_public, bool *db_ok)
{
    if (strncmp(signer_key_id, "ed25519:", 8) != 0) return false;
    const char *id = signer_key_id + 8;
    if (expect_public) return strcmp(id, expect_public) == 0;
    json_t *dev = load_device_keys(c, signer, id, db_ok);
    bool ok = dev != NULL;
    json_decref(dev);
    return ok;
}

typedef struct sig_ctx {
    atrium_req *r;
    PGconn *c;
    const xsign_keys *mine;
    json_t *failures;
    json_t *changed; /* set of user IDs whose keys got a signature */
    bool db_ok;
} sig_ctx;

/* Store the signatures by r->user in `signed_obj` on target (user, key_id). */
static void store_signatures(sig_ctx *x, const char *user, const char *key_id,
                             const json_t *signed_obj)
{
    const char *me = x->r->user;
    const json_t *mine = json_object_get(json_object_get(signed_obj, "signatures"), me);
    if (!json_is_object(mine) || json_object_size(mine) == 0) {
        add_failure(x->failures, user, key_id, "M_INVALID_SIGNATURE",
                    "The object carries no signature of yours");
        return;
    }
    /* What is being signed, and with which key it must be signed. */
    json_t *stored = NULL;
    const char *expect = NULL; /* NULL: one of my devices */
    bool own = strcmp(user, me) == 0;
    if (own && x->mine->public[0] && strcmp(key_id, x->mine->public[0]) == 0) {
        stored = json_incref(x->mine->key[0]);
    } else if (own) {
        stored = load_device_keys(x->c, user, key_id, &x->db_ok);
        expect = x->mine->public[1];
        if (stored && !expect) {
            json_decref(stored);
            add_failure(x->failures, user, key_id, "M_INVALID_SIGNATURE",
                        "Upload a self-signing key before signing devices");
            return;
        }
    } else {
        xsign_keys theirs;
        if (!load_keys(x->r, x->c, user, &theirs)) {
            x->db_ok = false;
            return;
        }
        if (theirs.public[0] && strcmp(key_id, theirs.public[0]) == 0)
            stored = json_incref(theirs.key[0]);
        xsign_keys_free(&theirs);
        expect = x->mine->public[2];
        if (stored && !expect) {
            json_decref(stored);
            add_failure(x->failures, user, key_id, "M_INVALID_SIGNATURE",
                        "Upload a user-signing key before signing other users");
            return;
        }
    }
    if (!x->db_ok) {
        json_decref(stored);
        return;
    }
    if (!stored) {
        add_failure(x->failures, user, key_id, "M_NOT_FOUND", "No such key");
        return;
    }
    bool same = json_equal(json_object_get(stored, "keys"), json_object_get(signed_obj, "keys"));
    json_decref(stored);
    if (!same) {
        add_failure(x->failures, user, key_id, "M_INVALID_SIGNATURE",
                    "The signed object is not the stored key");
        return;
    }
    const char *signer_key;
    json_t *sig;
    json_object_foreach((json_t *)mine, signer_key, sig) {
        if (!json_is_string(sig) || !e2ee_id_ok(signer_key) ||
            !signer_key_ok(x->c, me, signer_key, expect, &x->db_ok)) {
            if (x->db_ok)
                add_failure(x->failures, user, key_id, "M_INVALID_SIGNATURE",
                            "A signature names a key that may not sign this key");
            return;
        }
    }
    json_object_foreach((json_t *)mine, signer_key, sig) {
        const char *p[5] = {user, key_id, me, signer_key, json_string_value(sig)};
        if (!db_exec(x->c,
                     "INSERT INTO e2ee_signatures (target_user_id, target_key_id,"
                     " signer_user_id, signer_key_id, signature) VALUES ($1, $2, $3, $4, $5)"
                     " ON CONFLICT (target_user_id, target_key_id, signer_user_id, signer_key_id)"
                     " DO UPDATE SET signature = EXCLUDED.signature",
                     5, p)) {
            x->db_ok = false;
            return;
        }
    }
    json_object_set_new(x->changed, user, json_true());
}

/* Is body {user: {key_id: object}} within the caps? NULL, or a message. */
static const char *check_signatures(const json_t *body)
{
    size_t n = 0;
    const char *user;
    json_t *keys;
    json_object_foreach((json_t *)body, user, keys) {
        if (!json_is_object(keys)) return "the body must map user IDs to objects of keys";
        const char *key_id;
        json_t *obj;
        json_object_foreach(keys, key_id, obj) {
            if (!json_is_object(obj)) return "each signed key must be an object";
            if (++n > E2EE_SIGNATURES_MAX_KEYS) return "too many keys in one upload";
        }
    }
    return NULL;
}

/* POST /_matrix/client/v3/keys/signatures/upload */
static int post_signatures_upload(atrium_req *r)
{
    if (!auth_request(r)) return ATRIUM_DONE;
    json_t *body = http_req_json(r);
    if (!body) return ATRIUM_DONE;
    const char *msg = check_signatures(body);
    if (msg) return http_respond_error(r, 400, "M_BAD_JSON", "%s", msg);
    PGconn *c = e2ee_db_begin(r);
    if (!c) return ATRIUM_DONE;
    xsign_keys mine;
    if (!load_keys(r, c, r->user, &mine)) {
        e2ee_db_failed(r, c, true);
        http_db_checkin(c);
        return ATRIUM_DONE;
    }
    sig_ctx x = {.r = r, .c = c, .mine = &mine, .failures = json_object(),
                 .changed = json_object(), .db_ok = true};
    const char *user;
    json_t *keys;
    json_object_foreach(body, user, keys) {
        const char *key_id;
        json_t *obj;
        json_object_foreach(keys, key_id, obj) {
            if (!e2ee_user_is_local(r, user))
                add_failure(x.failures, user, key_id, "M_UNRECOGNIZED",
                            "Federation is not available on this server");
            else
                store_signatures(&x, user, key_id, obj);
            if (!x.db_ok) break;
        }
        if (!x.db_ok) break;
    }
    const char *changed;
    json_t *unused;
    if (x.db_ok)
        json_object_foreach(x.changed, changed, unused) if (e2ee_record_key_change(c, changed) < 0)
            x.db_ok = false;
    xsign_keys_free(&mine);
    if (!x.db_ok || !db_commit(c)) {
        e2ee_db_failed(r, c, true);
        json_decref(x.failures);
    } else {
        json_object_foreach(x.changed, changed, unused) e2ee_wake_key_change(c, changed);
        http_respond_json(r, 200, json_pack("{s:o}", "failures", x.failures));
    }
    json_decref(x.changed);
    http_db_checkin(c);
    return ATRIUM_DONE;
}

int e2ee_cross_signing_init(http_server *s)
{
    if (client_route(s, "POST", "/_matrix/client/v3/keys/device_signing/upload",
                     post_device_signing_upload, 0) < 0 ||
        client_route(s, "POST", "/_matrix/client/v3/keys/signatures/upload",
                     post_signatures_upload, 0) < 0)
        return -1;
    return 0;
}
