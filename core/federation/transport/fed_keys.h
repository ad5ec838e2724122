/*
 * core/federation/transport/fed_keys.h - this server's Ed25519 signing key, signed JSON, and the key
 * document served at GET /_matrix/key/v2/server.
 *
 * The key lives in a file in Synapse's format, one line `ed25519 <version> <seed>` (the
 * seed in unpadded base64), so an operator can move a key between Atrium and Synapse in
 * either direction. On first start the file does not exist and is created: a random seed,
 * written under a temporary name, fsynced, renamed into place with mode 0600, and the
 * directory fsynced, so a crash leaves either no key or the whole key, never half a file.
 * Keys the server used to sign with (rotated out) come from the configuration
 * (old_signing_keys); the caller fills fed_old_key entries with fed_old_key_parse.
 *
 * Signing JSON follows the appendix "Signing JSON": the canonical encoding of the object
 * without `signatures` and `unsigned` is signed, and the signature is added under
 * signatures.<server name>.<key id>, keeping every other signature. Verification is the
 * mirror image and says which check failed. What this file does not do: fetch or trust
 * other servers' keys (fed_keyring.h), or sign HTTP requests (fed_xmatrix.h).
 *
 * Internal prefix: fed_ (fed_signing_key_, fed_old_key_, fed_sign_, fed_verify_). Every
 * function is safe on any thread; a loaded key is immutable and may be shared.
 */
#ifndef ATRIUM_CORE_FED_KEYS_H
#define ATRIUM_CORE_FED_KEYS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "atrium/abi.h"

#define FED_SEED_BYTES 32        /* an Ed25519 seed (crypto_sign_SEEDBYTES) */
#define FED_PUBLIC_KEY_BYTES 32  /* crypto_sign_PUBLICKEYBYTES */
#define FED_SECRET_KEY_BYTES 64  /* libsodium's secret key: seed, then public key */
#define FED_SIGNATURE_BYTES 64   /* crypto_sign_BYTES */
#define FED_PUBLIC_KEY_B64_LEN 44 /* 43 characters of unpadded base64, plus NUL */
#define FED_SIGNATURE_B64_LEN 87  /* 86 characters of unpadded base64, plus NUL */
/* A server name (a host name of at most 255 characters and ":port"), with its NUL. */
#define FED_SERVER_NAME_MAX_BYTES 262
/* A key ID, "ed25519:" and a version of [A-Za-z0-9_], with its NUL. */
#define FED_KEY_ID_MAX_BYTES 64
/* 7 days: the default lifetime announced in valid_until_ts of our key document, and the
 * cap the spec puts on how long a fetched key may be used to verify. */
#define FED_KEY_VALIDITY_DEFAULT_MS (7LL * 24 * 3600 * 1000)

/* Verification outcomes other than 0 (fed_verify_json, fed_xmatrix_verify). */
enum fed_sig_err {
    FED_SIG_E_UNSIGNED = -100,      /* no signature by that server with that key ID */
    FED_SIG_E_BASE64 = -101,        /* the signature is not base64 of 64 bytes */
    FED_SIG_E_BAD = -102,           /* the signature does not match the object */
    FED_SIG_E_NOT_CANONICAL = -103, /* the object has no canonical encoding (floats, ...) */
    FED_SIG_E_ALGORITHM = -104,     /* the key ID names an algorithm other than ed25519 */
};

typedef struct fed_signing_key {
    char key_id[FED_KEY_ID_MAX_BYTES]; /* "ed25519:a_XyZ1" */
    unsigned char public_key[FED_PUBLIC_KEY_BYTES];
    unsigned char secret_key[FED_SECRET_KEY_BYTES];
} fed_signing_key;

/* A rotated-out key: still published (old_verify_keys) so what it signed stays checkable. */
typedef struct fed_old_key {
    char key_id[FED_KEY_ID_MAX_BYTES];
    unsigned char public_key[FED_PUBLIC_KEY_BYTES];
    int64_t expired_ts; /* ms since the epoch: when the server stopped signing with it */
} fed_old_key;

/* Another server's public key as configured (trusted_key_servers' verify_keys). */
typedef struct fed_public_key {
    char key_id[FED_KEY_ID_MAX_BYTES];
    unsigned char public_key[FED_PUBLIC_KEY_BYTES];
} fed_public_key;

/* Is key_id "ed25519:" followed by 1 to FED_KEY_ID_MAX_BYTES-9 characters of [A-Za-z0-9_]?
 * (The spec's grammar for key versions; ed25519 is the one algorithm in use.) */
bool fed_key_id_valid(const char *key_id);

/* Load the signing key from `path`, or create it there when the path does not exist (see
 * the top of this file). *key is filled on success. Returns 0; ATRIUM_E_INVAL when the
 * file exists but is not one well-formed ed25519 key line (another algorithm, a bad
 * version, a seed that is not 32 bytes of base64, several keys, a file too large);
 * ATRIUM_E_IO when reading, writing, syncing or renaming failed. On error `err` (err_len
 * bytes) holds one sentence naming the path and what to do; *key is left zeroed. A file
 * readable by group or others is used, with a warning logged. */
int fed_signing_key_load_or_create(const char *path, fed_signing_key *key, char *err,
                                   size_t err_len);

/* Derive a key from a seed (crypto_sign_seed_keypair) with ID "ed25519:<version>".
 * 0, or ATRIUM_E_INVAL when version is not a valid key version. */
int fed_signing_key_from_seed(const unsigned char seed[FED_SEED_BYTES], const char *version,
                              fed_signing_key *key);

/* Overwrite the secret part (sodium_memzero) when a key is no longer needed. */
void fed_signing_key_wipe(fed_signing_key *key);

/* Fill *out from one old_signing_keys entry of the configuration: key_id ("ed25519:abc"),
 * key (its public key in base64, padded or not) and expired_ts (ms). 0, or ATRIUM_E_INVAL
 * with err set (a sentence naming the key ID) when the ID or the key is malformed. */
int fed_old_key_parse(const char *key_id, const char *key_b64, int64_t expired_ts,
                      fed_old_key *out, char *err, size_t err_len);

/* Fill *out from a configured key ID and its public key in base64 (padded or not). 0, or
 * ATRIUM_E_INVAL with err set (a sentence naming the key ID). */
int fed_public_key_parse(const char *key_id, const char *key_b64, fed_public_key *out,
                         char *err, size_t err_len);

/* Sign obj (a JSON object) as server_name with k: adds signatures.<server_name>.<key id>,
 * replacing a previous signature by the same key and keeping all others. `unsigned` is
 * neither signed nor touched. Returns 0; ATRIUM_E_INVAL when obj is not an object, its
 * `signatures` member is not an object, or obj has no canonical encoding (a float, an
 * integer past 2^53); ATRIUM_E_NOMEM. obj is unchanged on error. */
int fed_sign_json(json_t *obj, const char *server_name, const fed_signing_key *k);

/* Check that obj carries a valid signature by server_name with key key_id, whose public key
 * is pub. Returns 0, or a negative enum fed_sig_err with `why` (why_len bytes; may be NULL)
 * set to a sentence naming the server and key: FED_SIG_E_UNSIGNED, _BASE64, _BAD,
 * _NOT_CANONICAL, _ALGORITHM. */
int fed_verify_json(const json_t *obj, const char *server_name, const char *key_id,
                    const unsigned char pub[FED_PUBLIC_KEY_BYTES], char *why, size_t why_len);

/* The body of GET /_matrix/key/v2/server: server_name, verify_keys {<current key ID>:
 * {key}}, old_verify_keys {<id>: {key, expired_ts}} (always present, possibly empty),
 * valid_until_ts = now_wall_ms + validity_ms, signed with `current`. A new reference the
 * caller owns, or NULL on out-of-memory. old may be NULL when n_old is 0; an old key with
 * the current key's ID is left out. */
json_t *fed_server_key_document(const char *server_name, const fed_signing_key *current,
                                const fed_old_key *old, size_t n_old, int64_t now_wall_ms,
                                int64_t validity_ms);

#endif
