/*
 * core/federation/transport/fed_keys.c - the signing key file, JSON signatures and our key document
 * (see fed_keys.h for the contract and the formats).
 *
 * The key file is parsed by hand rather than with sscanf so every way it can be wrong gets
 * its own sentence: an operator who copied a Synapse key with the wrong tool should learn
 * what is wrong with it, not that "the key is invalid". A new file is made crash-safe by
 * the usual write-temporary, fsync, publish, fsync-directory sequence, where publishing is
 * link(2), which refuses to replace a file: several processes sharing one data directory
 * (replicas starting at once) may each make a key, but only the first is published and
 * the others load that one, so they all sign with the key the document publishes. Where
 * the file system has no hard links, rename(2) publishes instead (and the race is back).
 */
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/rooms/canonical_json.h"
#include "core/runtime/base64.h"
#include "core/federation/transport/fed_keys.h"
#include "core/runtime/runtime.h"

_Static_assert(FED_SEED_BYTES == crypto_sign_SEEDBYTES, "seed size");
_Static_assert(FED_PUBLIC_KEY_BYTES == crypto_sign_PUBLICKEYBYTES, "public key size");
_Static_assert(FED_SECRET_KEY_BYTES == crypto_sign_SECRETKEYBYTES, "secret key size");
_Static_assert(FED_SIGNATURE_BYTES == crypto_sign_BYTES, "signature size");

#define KEY_FILE_MAX_BYTES 4096     /* a key line is ~60 bytes; anything this big is not one */
#define KEY_ALGORITHM "ed25519"
#define KEY_ID_PREFIX "ed25519:"
#define NEW_KEY_VERSION_PREFIX "a_" /* Synapse's shape for generated versions: a_ + 4 chars */
#define NEW_KEY_VERSION_RANDOM_CHARS 4
#define KEY_FILE_MODE 0600

static bool version_char(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
           c == '_';
}

static bool version_valid(const char *v, size_t len)
{
    if (len == 0 || len + sizeof(KEY_ID_PREFIX) > FED_KEY_ID_MAX_BYTES) return false;
    for (size_t i = 0; i < len; i++)
        if (!version_char(v[i])) return false;
    return true;
}

bool fed_key_id_valid(const char *key_id)
{
    if (!key_id || strncmp(key_id, KEY_ID_PREFIX, strlen(KEY_ID_PREFIX)) != 0) return false;
    const char *v = key_id + strlen(KEY_ID_PREFIX);
    return version_valid(v, strnlen(v, FED_KEY_ID_MAX_BYTES));
}

int fed_signing_key_from_seed(const unsigned char seed[FED_SEED_BYTES], const char *version,
                              fed_signing_key *key)
{
    memset(key, 0, sizeof(*key));
    if (!version_valid(version, strnlen(version, FED_KEY_ID_MAX_BYTES))) return ATRIUM_E_INVAL;
    snprintf(key->key_id, sizeof(key->key_id), KEY_ID_PREFIX "%s", version);
    if (crypto_sign_seed_keypair(key->public_key, key->secret_key, seed) != 0) {
        memset(key, 0, sizeof(*key));
        return ATRIUM_E_INVAL;
    }
    return 0;
}

void fed_signing_key_wipe(fed_signing_key *key)
{
    sodium_memzero(key->secret_key, sizeof(key->secret_key));
}

/* ---- the key file ---------------------------------------------------------------------- */

/* Split line (NUL-terminated, modified) into at most max words on spaces and tabs. */
static int split_words(char *line, char **words, int max)
{
    int n = 0;
    char *save = NULL;
    for (char *w = strtok_r(line, " \t\r", &save); w; w = strtok_r(NULL, " \t\r", &save)) {
        if (n == max) return max + 1;
        words[n++] = w;
    }
    return n;
}

/* Parse the file's text (NUL-terminated, modified) into *key. */
static int parse_key_file(char *text, const char *path, fed_signing_key *key, char *err,
                          size_t err_len)
{
    int keys = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *w[3];
        int n = split_words(line, w, 3);
        if (n == 0) continue; /* a blank line (or the trailing newline) */
        if (++keys > 1) {
            snprintf(err, err_len,
                     "signing key file %s holds more than one key: keep the current one "
                     "there and list the older ones under federation.old_signing_keys",
                     path);
            return ATRIUM_E_INVAL;
        }
        if (n != 3) {
            snprintf(err, err_len,
                     "signing key file %s is not in the format \"ed25519 <version> "
                     "<base64 seed>\" (found %d word%s on the key line)",
                     path, n > 3 ? 4 : n, n == 1 ? "" : "s");
            return ATRIUM_E_INVAL;
        }
        if (strcmp(w[0], KEY_ALGORITHM) != 0) {
            snprintf(err, err_len,
                     "signing key file %s holds a key for algorithm \"%.32s\": only ed25519 "
                     "keys are supported",
                     path, w[0]);
            return ATRIUM_E_INVAL;
        }
        if (!version_valid(w[1], strlen(w[1]))) {
            snprintf(err, err_len,
                     "signing key file %s: the key version \"%.64s\" must be 1 to %d "
                     "characters of A-Z, a-z, 0-9 and _",
                     path, w[1], (int)(FED_KEY_ID_MAX_BYTES - sizeof(KEY_ID_PREFIX)));
            return ATRIUM_E_INVAL;
        }
        unsigned char seed[FED_SEED_BYTES];
        if (rt_b64_decode_exact(w[2], seed, sizeof(seed)) < 0) {
            snprintf(err, err_len,
                     "signing key file %s: the seed is not base64 of %d bytes",
                     path, FED_SEED_BYTES);
            return ATRIUM_E_INVAL;
        }
        int rc = fed_signing_key_from_seed(seed, w[1], key);
        sodium_memzero(seed, sizeof(seed));
        if (rc < 0) {
            snprintf(err, err_len, "signing key file %s: the seed was refused", path);
            return rc;
        }
    }
    if (keys == 0) {
        snprintf(err, err_len,
                 "signing key file %s is empty: delete it to have a new key created, or "
                 "put the key line \"ed25519 <version> <base64 seed>\" in it",
                 path);
        return ATRIUM_E_INVAL;
    }
    return 0;
}

static int read_key_file(int fd, const char *path, fed_signing_key *key, char *err,
                         size_t err_len)
{
    struct stat st;
    if (fstat(fd, &st) < 0) {
        snprintf(err, err_len, "signing key file %s: fstat: %s", path, strerror(errno));
        return ATRIUM_E_IO;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, err_len, "signing key file %s is not a regular file", path);
        return ATRIUM_E_INVAL;
    }
    char text[KEY_FILE_MAX_BYTES + 1];
    size_t len = 0;
    for (;;) {
        ssize_t n = read(fd, text + len, sizeof(text) - len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            snprintf(err, err_len, "signing key file %s: read: %s", path, strerror(errno));
            return ATRIUM_E_IO;
        }
        if (n == 0) break;
        len += (size_t)n;
        if (len == sizeof(text)) {
            sodium_memzero(text, sizeof(text));
            snprintf(err, err_len,
                     "signing key file %s is larger than %d bytes: it is not a key file",
                     path, KEY_FILE_MAX_BYTES);
            return ATRIUM_E_INVAL;
        }
    }
    text[len] = '\0';
    if (memchr(text, '\0', len)) {
        sodium_memzero(text, sizeof(text));
        snprintf(err, err_len, "signing key file %s holds binary data: it is not a key file",
                 path);
        return ATRIUM_E_INVAL;
    }
    int rc = parse_key_file(text, path, key, err, err_len);
    sodium_memzero(text, sizeof(text));
    if (rc == 0 && (st.st_mode & 077))
        rt_log(ATRIUM_LOG_WARN, "federation",
               "signing key file %s is readable by other users (mode %03o): chmod 600 it",
               path, (unsigned)(st.st_mode & 0777));
    return rc;
}

/* The directory part of path ("." when it has none), into dir. */
static void dir_of(const char *path, char *dir, size_t dir_len)
{
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, dir_len, ".");
    else if (slash == path) snprintf(dir, dir_len, "/");
    else snprintf(dir, dir_len, "%.*s", (int)(slash - path), path);
}

static int write_all(int fd, const char *s, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, s, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return -1;
        s += w;
        n -= (size_t)w;
    }
    return 0;
}

/* The longest line of a key file this server writes: algorithm, version, seed. */
#define KEY_LINE_BYTES 128

/* A new key with a random version: into key, and as the key file's line (its length). The
 * caller wipes line once written. */
static int new_key_line(fed_signing_key *key, char line[KEY_LINE_BYTES])
{
    static const char ALNUM[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    char version[sizeof(NEW_KEY_VERSION_PREFIX) + NEW_KEY_VERSION_RANDOM_CHARS];
    size_t pre = strlen(NEW_KEY_VERSION_PREFIX);
    memcpy(version, NEW_KEY_VERSION_PREFIX, pre);
    for (int i = 0; i < NEW_KEY_VERSION_RANDOM_CHARS; i++)
        version[pre + (size_t)i] = ALNUM[randombytes_uniform(sizeof(ALNUM) - 1)];
    version[pre + NEW_KEY_VERSION_RANDOM_CHARS] = '\0';

    unsigned char seed[FED_SEED_BYTES];
    randombytes_buf(seed, sizeof(seed));
    int rc = fed_signing_key_from_seed(seed, version, key);
    char seed_b64[FED_PUBLIC_KEY_B64_LEN];
    cjson_b64(seed, sizeof(seed), false, seed_b64, sizeof(seed_b64));
    sodium_memzero(seed, sizeof(seed));
    RT_ASSERT(rc == 0, "generated key version %s refused", version);

    int line_len = snprintf(line, KEY_LINE_BYTES, KEY_ALGORITHM " %s %s\n", version, seed_b64);
    sodium_memzero(seed_b64, sizeof(seed_b64));
    return line_len;
}

/* Another process published its key first: drop ours and load that one. 0, or an error
 * (err set; key zeroed). */
static int use_published_key(const char *path, fed_signing_key *key, char *err,
                             size_t err_len)
{
    fed_signing_key_wipe(key);
    memset(key, 0, sizeof(*key));
    int fd2 = open(path, O_RDONLY | O_CLOEXEC);
    if (fd2 < 0) {
        snprintf(err, err_len, "signing key file %s: open: %s", path, strerror(errno));
        return ATRIUM_E_IO;
    }
    int rc2 = read_key_file(fd2, path, key, err, err_len);
    close(fd2);
    if (rc2 < 0) {
        fed_signing_key_wipe(key);
        memset(key, 0, sizeof(*key));
    } else {
        rt_log(ATRIUM_LOG_INFO, "federation", "another process created the signing key "
               "%s first: using it", path);
    }
    return rc2;
}

/* The new file's directory entry made durable (a rename is durable only once it is). 0, or
 * -1 with err set and key wiped. */
static int sync_key_dir(const char *path, fed_signing_key *key, char *err, size_t err_len)
{
    char dir[4096];
    dir_of(path, dir, sizeof(dir));
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || fsync(dfd) < 0) {
        snprintf(err, err_len, "signing key file %s: fsync of directory %s: %s", path, dir,
                 strerror(errno));
        if (dfd >= 0) close(dfd);
        fed_signing_key_wipe(key);
        memset(key, 0, sizeof(*key));
        return -1;
    }
    close(dfd);
    return 0;
}

static int create_key_file(const char *path, fed_signing_key *key, char *err, size_t err_len)
{
    if (sodium_init() < 0) { /* idempotent; the random generator needs it */
        snprintf(err, err_len, "signing key file %s: libsodium could not initialise", path);
        return ATRIUM_E_IO;
    }
    char line[KEY_LINE_BYTES];
    int line_len = new_key_line(key, line);

    size_t tmp_len = strlen(path) + 48;
    char *tmp = malloc(tmp_len);
    if (!tmp) {
        sodium_memzero(line, sizeof(line));
        snprintf(err, err_len, "signing key file %s: out of memory", path);
        return ATRIUM_E_NOMEM;
    }
    /* Not the PID alone: processes in containers sharing the key's volume have the same
     * PIDs (test_deploy_podman.py saw two replicas write one temporary file). */
    snprintf(tmp, tmp_len, "%s.tmp.%ld.%08x", path, (long)getpid(),
             (unsigned)randombytes_random());
    const char *step = "create";
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, KEY_FILE_MODE);
    bool ok = fd >= 0;
    if (ok && (step = "chmod", fchmod(fd, KEY_FILE_MODE) < 0)) ok = false; /* despite umask */
    if (ok && (step = "write", write_all(fd, line, (size_t)line_len) < 0)) ok = false;
    if (ok && (step = "fsync", fsync(fd) < 0)) ok = false;
    int saved = errno;
    if (fd >= 0 && close(fd) < 0 && ok) {
        ok = false;
        step = "close";
        saved = errno;
    }
    sodium_memzero(line, sizeof(line));
    bool lost_race = false;
    if (ok && (step = "link", link(tmp, path) < 0)) {
        if (errno == EEXIST) { /* another process published its key first: use that one */
            lost_race = true;
        } else if ((errno == EPERM || errno == ENOTSUP || errno == EXDEV) &&
                   (step = "rename", rename(tmp, path) == 0)) {
            tmp[0] = '\0'; /* renamed: nothing left to remove */
        } else {
            ok = false;
            saved = errno;
        }
    }
    if (ok && tmp[0]) unlink(tmp);
    if (lost_race) {
        free(tmp);
        return use_published_key(path, key, err, err_len);
    }
    if (!ok) {
        snprintf(err, err_len,
                 "could not create signing key file %s (%s of %s: %s): check that its "
                 "directory exists and is writable",
                 path, step, tmp, strerror(saved));
        if (fd >= 0) unlink(tmp);
        free(tmp);
        fed_signing_key_wipe(key);
        memset(key, 0, sizeof(*key));
        return ATRIUM_E_IO;
    }
    free(tmp);

    if (sync_key_dir(path, key, err, err_len) < 0) return ATRIUM_E_IO;
    rt_log(ATRIUM_LOG_INFO, "federation", "created a new signing key %s in %s", key->key_id,
           path);
    return 0;
}

int fed_signing_key_load_or_create(const char *path, fed_signing_key *key, char *err,
                                   size_t err_len)
{
    memset(key, 0, sizeof(*key));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) return create_key_file(path, key, err, err_len);
    if (fd < 0) {
        snprintf(err, err_len, "signing key file %s: open: %s", path, strerror(errno));
        return ATRIUM_E_IO;
    }
    int rc = read_key_file(fd, path, key, err, err_len);
    close(fd);
    if (rc < 0) {
        fed_signing_key_wipe(key);
        memset(key, 0, sizeof(*key));
    }
    return rc;
}

int fed_public_key_parse(const char *key_id, const char *key_b64, fed_public_key *out,
                         char *err, size_t err_len)
{
    memset(out, 0, sizeof(*out));
    if (!fed_key_id_valid(key_id)) {
        snprintf(err, err_len,
                 "key \"%.64s\": a key ID is \"ed25519:\" and a version of A-Z, a-z, 0-9 "
                 "and _",
                 key_id ? key_id : "");
        return ATRIUM_E_INVAL;
    }
    if (!key_b64 || rt_b64_decode_exact(key_b64, out->public_key, FED_PUBLIC_KEY_BYTES) < 0) {
        snprintf(err, err_len, "key %s: the key must be base64 of a %d-byte public key", key_id,
                 FED_PUBLIC_KEY_BYTES);
        memset(out, 0, sizeof(*out));
        return ATRIUM_E_INVAL;
    }
    snprintf(out->key_id, sizeof(out->key_id), "%s", key_id);
    return 0;
}

int fed_old_key_parse(const char *key_id, const char *key_b64, int64_t expired_ts,
                      fed_old_key *out, char *err, size_t err_len)
{
    memset(out, 0, sizeof(*out));
    fed_public_key k;
    int rc = fed_public_key_parse(key_id, key_b64, &k, err, err_len);
    if (rc < 0) return rc;
    memcpy(out->key_id, k.key_id, sizeof(out->key_id));
    memcpy(out->public_key, k.public_key, sizeof(out->public_key));
    out->expired_ts = expired_ts;
    return 0;
}

/* ---- signed JSON ----------------------------------------------------------------------- */

/* The canonical bytes a signature of obj covers: obj without signatures and unsigned.
 * malloc'd, or NULL (not canonical, or out of memory). */
static char *signed_bytes(const json_t *obj, size_t *len)
{
    json_t *copy = json_copy((json_t *)obj); /* shallow: the members are shared, not copied */
    if (!copy) return NULL;
    json_object_del(copy, "signatures");
    json_object_del(copy, "unsigned");
    char *bytes = cjson_encode(copy, len);
    json_decref(copy);
    return bytes;
}

int fed_sign_json(json_t *obj, const char *server_name, const fed_signing_key *k)
{
    if (!json_is_object(obj)) return ATRIUM_E_INVAL;
    json_t *sigs = json_object_get(obj, "signatures");
    if (sigs && !json_is_object(sigs)) return ATRIUM_E_INVAL;
    json_t *mine = sigs ? json_object_get(sigs, server_name) : NULL;
    if (mine && !json_is_object(mine)) return ATRIUM_E_INVAL;

    size_t len = 0;
    char *bytes = signed_bytes(obj, &len);
    if (!bytes) return ATRIUM_E_INVAL;
    unsigned char sig[FED_SIGNATURE_BYTES];
    crypto_sign_detached(sig, NULL, (const unsigned char *)bytes, len, k->secret_key);
    free(bytes);
    char sig_b64[FED_SIGNATURE_B64_LEN];
    cjson_b64(sig, sizeof(sig), false, sig_b64, sizeof(sig_b64));

    json_t *value = json_string(sig_b64);
    if (!value) return ATRIUM_E_NOMEM;
    if (!sigs) {
        sigs = json_object();
        if (!sigs || json_object_set_new(obj, "signatures", sigs) < 0) {
            json_decref(value);
            return ATRIUM_E_NOMEM;
        }
    }
    if (!mine) {
        mine = json_object();
        if (!mine || json_object_set_new(sigs, server_name, mine) < 0) {
            json_decref(value);
            return ATRIUM_E_NOMEM;
        }
    }
    return json_object_set_new(mine, k->key_id, value) < 0 ? ATRIUM_E_NOMEM : 0;
}

#define WHY(...)                                                                        \
    do {                                                                                \
        if (why && why_len) snprintf(why, why_len, __VA_ARGS__);                        \
    } while (0)

int fed_verify_json(const json_t *obj, const char *server_name, const char *key_id,
                    const unsigned char pub[FED_PUBLIC_KEY_BYTES], char *why, size_t why_len)
{
    if (strncmp(key_id, KEY_ID_PREFIX, strlen(KEY_ID_PREFIX)) != 0) {
        WHY("key %.64s of %.255s is not an ed25519 key", key_id, server_name);
        return FED_SIG_E_ALGORITHM;
    }
    const json_t *sig = json_object_get(json_object_get(json_object_get(obj, "signatures"),
                                                        server_name),
                                        key_id);
    if (!json_is_string(sig)) {
        WHY("no signature by %.255s with key %.64s", server_name, key_id);
        return FED_SIG_E_UNSIGNED;
    }
    unsigned char raw[FED_SIGNATURE_BYTES];
    if (rt_b64_decode_exact(json_string_value(sig), raw, sizeof(raw)) < 0) {
        WHY("the signature by %.255s with key %.64s is not base64 of %d bytes", server_name,
            key_id, FED_SIGNATURE_BYTES);
        return FED_SIG_E_BASE64;
    }
    size_t len = 0;
    char *bytes = signed_bytes(obj, &len);
    if (!bytes) {
        WHY("the object signed by %.255s has no canonical JSON encoding", server_name);
        return FED_SIG_E_NOT_CANONICAL;
    }
    int rc = crypto_sign_verify_detached(raw, (const unsigned char *)bytes, len, pub);
    free(bytes);
    if (rc != 0) {
        WHY("the signature by %.255s with key %.64s does not match", server_name, key_id);
        return FED_SIG_E_BAD;
    }
    return 0;
}

/* ---- our key document ------------------------------------------------------------------ */

static void public_b64(const unsigned char pub[FED_PUBLIC_KEY_BYTES],
                       char out[FED_PUBLIC_KEY_B64_LEN])
{
    cjson_b64(pub, FED_PUBLIC_KEY_BYTES, false, out, FED_PUBLIC_KEY_B64_LEN);
}

json_t *fed_server_key_document(const char *server_name, const fed_signing_key *current,
                                const fed_old_key *old, size_t n_old, int64_t now_wall_ms,
                                int64_t validity_ms)
{
    json_t *verify = json_object(), *olds = json_object();
    json_t *doc = json_pack("{s:s, s:o, s:o, s:I}", "server_name", server_name, "verify_keys",
                            verify, "old_verify_keys", olds, "valid_until_ts",
                            (json_int_t)(now_wall_ms + validity_ms));
    if (!doc) return NULL; /* json_pack's "o" consumed verify and olds */
    char b64[FED_PUBLIC_KEY_B64_LEN];
    public_b64(current->public_key, b64);
    /* json_object_set_new takes the value's reference even when it fails. */
    bool ok = json_object_set_new(verify, current->key_id, json_pack("{s:s}", "key", b64)) == 0;
    for (size_t i = 0; ok && i < n_old; i++) {
        if (strcmp(old[i].key_id, current->key_id) == 0) continue;
        public_b64(old[i].public_key, b64);
        ok = json_object_set_new(olds, old[i].key_id,
                                 json_pack("{s:s, s:I}", "key", b64, "expired_ts",
                                           (json_int_t)old[i].expired_ts)) == 0;
    }
    if (!ok || fed_sign_json(doc, server_name, current) < 0) {
        json_decref(doc);
        return NULL;
    }
    return doc;
}
