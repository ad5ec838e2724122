/*
 * tests/unit/test_fed_keys.c - the federation base64 decoder, the signing key file (Synapse's
 * format, creation on first start), signed JSON against the spec's own test vectors, and
 * the key document of GET /_matrix/key/v2/server.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <dirent.h>
#include <sodium.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "atrium/abi.h"
#include "core/runtime/base64.h"
#include "core/federation/transport/fed_keys.h"

/* The seed of the spec's "Cryptographic Test Vectors" appendix (server "domain", key
 * "ed25519:1"); note its last character carries non-zero trailing bits. */
#define SPEC_SEED_B64 "YJDBA9Xnr2sVqXD9Vj7XVUnmFZcZrlw8Md7kMW+3XA1"
#define SPEC_SIG_OF_EMPTY                                                                  \
    "K8280/U9SSy9IVtjBuVeLr+HpOB4BQFWbg+UZaADMtTdGYI7Geitb76LTrr5QV/7Xg4ahLwYGYZzuHGZKM5ZAQ"
#define SPEC_SIG_OF_ONE_TWO                                                                \
    "KqmLSbO39/Bzb0QIYE82zqLwsA+PDzYIpIRA2sRQ4sL53+sN6/fpNSoqE7BP7vBZhG6kYdD13EIMJpvhJI+6Bw"
/* Seed bytes 0x00..0x1f in base64, and its public key, computed independently with
 * PyNaCl: base64.b64encode(bytes(nacl.signing.SigningKey(bytes(range(32))).verify_key)). */
#define SEQ_SEED_B64 "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"
#define SEQ_PUBLIC_B64 "A6EHv/POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg"

static void spec_key(fed_signing_key *k)
{
    unsigned char seed[FED_SEED_BYTES];
    assert_int_equal(rt_b64_decode_exact(SPEC_SEED_B64, seed, sizeof(seed)), 0);
    assert_int_equal(fed_signing_key_from_seed(seed, "1", k), 0);
    assert_string_equal(k->key_id, "ed25519:1");
}

static long dec(const char *s, unsigned char *out, size_t cap)
{
    return rt_b64_decode(s, strlen(s), out, cap);
}

/* ---- base64 ----------------------------------------------------------------------------- */

static void test_b64_accepts_unpadded_padded_and_url_safe_forms(void **state)
{
    (void)state;
    unsigned char out[16];
    static const struct {
        const char *in, *want;
    } ok[] = {
        {"", ""},         {"Zg", "f"},        {"Zg==", "f"},       {"Zm8", "fo"},
        {"Zm8=", "fo"},   {"Zm9v", "foo"},    {"Zm9vYg", "foob"},  {"Zm9vYmE=", "fooba"},
        {"Zm9vYmFy", "foobar"},
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        long n = dec(ok[i].in, out, sizeof(out));
        assert_int_equal(n, (long)strlen(ok[i].want));
        assert_memory_equal(out, ok[i].want, (size_t)n);
    }
    /* 0xfb 0xff: "+/8" in the standard alphabet, "-_8" in the URL-safe one. */
    assert_int_equal(dec("+/8", out, sizeof(out)), 2);
    assert_int_equal(out[0], 0xfb);
    assert_int_equal(out[1], 0xff);
    memset(out, 0, sizeof(out));
    assert_int_equal(dec("-_8", out, sizeof(out)), 2);
    assert_int_equal(out[0], 0xfb);
    assert_int_equal(out[1], 0xff);
}

static void test_b64_refuses_what_no_encoder_writes(void **state)
{
    (void)state;
    unsigned char out[16];
    static const char *const bad[] = {
        "Z",        /* 4k+1 characters */
        "Zm9vY",    /* 4k+1 again */
        "Zg=",      /* half the padding */
        "Zg===",    /* too much */
        "Zm8==",    /* padding that does not complete a group of four */
        "Zm9v====", /* a whole group of padding */
        "Zg==Zg==", /* padding in the middle */
        "=",        "==",
        "Zm 9v",    /* whitespace */
        "Zm9v\n",   /* a newline */
        "Zm9v!",    /* a character of neither alphabet */
        "Zm.v",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(dec(bad[i], out, sizeof(out)), -1);
    /* A correct string that does not fit the output. */
    assert_int_equal(dec("Zm9vYmFy", out, 5), -1);
    unsigned char key[FED_PUBLIC_KEY_BYTES];
    assert_int_equal(rt_b64_decode_exact(SEQ_PUBLIC_B64, key, sizeof(key)), 0);
    assert_int_equal(rt_b64_decode_exact("Zm9v", key, sizeof(key)), -1); /* 3 bytes, not 32 */
}

/* ---- the key file ----------------------------------------------------------------------- */

static char tmpdir[64];

static int make_dir(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/atrium-fedkeys-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int remove_dir(void **state)
{
    (void)state;
    DIR *d = opendir(tmpdir);
    if (!d) return 0;
    struct dirent *e;
    char p[sizeof(tmpdir) + sizeof(e->d_name) + 2];
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(p, sizeof(p), "%s/%s", tmpdir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(tmpdir);
    return 0;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    chmod(path, 0600); /* as a key file should be (no warning) */
}

static int count_dir_entries(void)
{
    DIR *d = opendir(tmpdir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) n++;
    closedir(d);
    return n;
}

static void test_missing_key_file_is_created_private_and_reloads_the_same_key(void **state)
{
    (void)state;
    char path[128], err[512] = "";
    snprintf(path, sizeof(path), "%s/signing.key", tmpdir);
    fed_signing_key a, b;
    assert_int_equal(fed_signing_key_load_or_create(path, &a, err, sizeof(err)), 0);

    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(count_dir_entries(), 1); /* no temporary file left behind */

    /* Synapse's shape: "ed25519 a_XXXX <43 characters>\n". */
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char alg[16], version[16], seed[64];
    assert_int_equal(fscanf(f, "%15s %15s %63s", alg, version, seed), 3);
    fclose(f);
    assert_string_equal(alg, "ed25519");
    assert_int_equal(strlen(version), 6);
    assert_memory_equal(version, "a_", 2);
    assert_int_equal(strlen(seed), 43);
    char want_id[32];
    snprintf(want_id, sizeof(want_id), "ed25519:%s", version);
    assert_string_equal(a.key_id, want_id);

    assert_int_equal(fed_signing_key_load_or_create(path, &b, err, sizeof(err)), 0);
    assert_string_equal(a.key_id, b.key_id);
    assert_memory_equal(a.public_key, b.public_key, FED_PUBLIC_KEY_BYTES);
    assert_memory_equal(a.secret_key, b.secret_key, FED_SECRET_KEY_BYTES);
}

/* Replicas sharing one data directory start at once: every process must end up with the
 * one key the file holds (the one its document publishes), whichever created it. */
static void test_processes_creating_the_key_at_once_all_use_the_published_one(void **state)
{
    (void)state;
    enum { PROCESSES = 8, ROUNDS = 5 };
    for (int round = 0; round < ROUNDS; round++) {
        char path[128];
        snprintf(path, sizeof(path), "%s/race%d.key", tmpdir, round);
        int go[2], out[2];
        assert_int_equal(pipe(go), 0);
        assert_int_equal(pipe(out), 0);
        for (int i = 0; i < PROCESSES; i++) {
            pid_t pid = fork();
            assert_true(pid >= 0);
            if (pid == 0) {
                char b, err[512];
                close(go[1]);
                if (read(go[0], &b, 1) != 0) _exit(2); /* released by the close below */
                fed_signing_key k;
                if (fed_signing_key_load_or_create(path, &k, err, sizeof(err)) != 0) _exit(3);
                char line[FED_KEY_ID_MAX_BYTES + 1];
                snprintf(line, sizeof(line), "%-*s", FED_KEY_ID_MAX_BYTES - 1, k.key_id);
                line[FED_KEY_ID_MAX_BYTES - 1] = '\n';
                _exit(write(out[1], line, FED_KEY_ID_MAX_BYTES) == FED_KEY_ID_MAX_BYTES ? 0 : 4);
            }
        }
        close(go[0]);
        close(go[1]); /* every child's read returns now */
        close(out[1]);
        for (int i = 0; i < PROCESSES; i++) {
            int status = 0;
            wait(&status);
            assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        }
        char ids[PROCESSES][FED_KEY_ID_MAX_BYTES];
        for (int i = 0; i < PROCESSES; i++)
            assert_int_equal(read(out[0], ids[i], FED_KEY_ID_MAX_BYTES), FED_KEY_ID_MAX_BYTES);
        close(out[0]);
        fed_signing_key published;
        char err[512];
        assert_int_equal(fed_signing_key_load_or_create(path, &published, err, sizeof(err)), 0);
        for (int i = 0; i < PROCESSES; i++)
            assert_memory_equal(ids[i], published.key_id, strlen(published.key_id));
    }
    assert_int_equal(count_dir_entries(), ROUNDS); /* no temporary file left behind */
}

static void test_synapse_key_file_loads_with_or_without_trailing_newline(void **state)
{
    (void)state;
    char path[128], err[512] = "";
    snprintf(path, sizeof(path), "%s/synapse.key", tmpdir);
    unsigned char want_pub[FED_PUBLIC_KEY_BYTES];
    assert_int_equal(rt_b64_decode_exact(SEQ_PUBLIC_B64, want_pub, sizeof(want_pub)), 0);
    static const char *const forms[] = {
        "ed25519 a_AbC1 " SEQ_SEED_B64 "\n",
        "ed25519 a_AbC1 " SEQ_SEED_B64,
        "ed25519 a_AbC1 " SEQ_SEED_B64 "=\n", /* padded */
        "\ned25519\ta_AbC1  " SEQ_SEED_B64 "\r\n\n",
    };
    for (size_t i = 0; i < sizeof(forms) / sizeof(forms[0]); i++) {
        write_file(path, forms[i]);
        fed_signing_key k;
        assert_int_equal(fed_signing_key_load_or_create(path, &k, err, sizeof(err)), 0);
        assert_string_equal(k.key_id, "ed25519:a_AbC1");
        assert_memory_equal(k.public_key, want_pub, sizeof(want_pub));
    }
}

static void test_malformed_key_files_are_refused_with_a_reason(void **state)
{
    (void)state;
    char path[128];
    snprintf(path, sizeof(path), "%s/bad.key", tmpdir);
    static const struct {
        const char *text, *reason;
    } bad[] = {
        {"rsa a_AbC1 " SEQ_SEED_B64 "\n", "only ed25519"},
        {"ed25519 " SEQ_SEED_B64 "\n", "format"},
        {"ed25519 a_AbC1 " SEQ_SEED_B64 " extra\n", "format"},
        {"ed25519 a-b " SEQ_SEED_B64 "\n", "version"},
        {"ed25519 a_AbC1 AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHg\n", "32 bytes"}, /* 31 */
        {"ed25519 a_AbC1 not*base64\n", "32 bytes"},
        {"ed25519 a_AbC1 " SEQ_SEED_B64 "\ned25519 a_XyZ2 " SEQ_SEED_B64 "\n", "more than one"},
        {"", "empty"},
        {"\n  \n", "empty"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        write_file(path, bad[i].text);
        char err[512] = "";
        fed_signing_key k;
        memset(&k, 0xaa, sizeof(k));
        assert_int_equal(fed_signing_key_load_or_create(path, &k, err, sizeof(err)),
                         ATRIUM_E_INVAL);
        if (!strstr(err, bad[i].reason) || !strstr(err, path))
            fail_msg("case %zu: \"%s\" does not say \"%s\"", i, err, bad[i].reason);
        static const fed_signing_key zero;
        assert_memory_equal(&k, &zero, sizeof(k)); /* nothing half-filled */
    }
}

static void test_key_file_in_a_missing_directory_is_an_io_error(void **state)
{
    (void)state;
    char path[128], err[512] = "";
    snprintf(path, sizeof(path), "%s/no/such/dir/signing.key", tmpdir);
    fed_signing_key k;
    assert_int_equal(fed_signing_key_load_or_create(path, &k, err, sizeof(err)), ATRIUM_E_IO);
    assert_non_null(strstr(err, "could not create"));
    /* A directory where the file should be. */
    assert_int_equal(fed_signing_key_load_or_create(tmpdir, &k, err, sizeof(err)),
                     ATRIUM_E_INVAL);
}

static void test_old_key_entries_are_checked(void **state)
{
    (void)state;
    fed_old_key o;
    char err[256];
    assert_int_equal(fed_old_key_parse("ed25519:old1", SEQ_PUBLIC_B64, 1234, &o, err,
                                       sizeof(err)), 0);
    assert_string_equal(o.key_id, "ed25519:old1");
    assert_int_equal(o.expired_ts, 1234);
    assert_int_equal(fed_old_key_parse("old1", SEQ_PUBLIC_B64, 1, &o, err, sizeof(err)),
                     ATRIUM_E_INVAL);
    assert_int_equal(fed_old_key_parse("ed25519:", SEQ_PUBLIC_B64, 1, &o, err, sizeof(err)),
                     ATRIUM_E_INVAL);
    assert_int_equal(fed_old_key_parse("ed25519:old1", "Zm9v", 1, &o, err, sizeof(err)),
                     ATRIUM_E_INVAL);
    assert_non_null(strstr(err, "ed25519:old1"));
    assert_false(fed_key_id_valid("ed25519:a b"));
    assert_true(fed_key_id_valid("ed25519:a_XyZ1"));
}

/* ---- signed JSON ------------------------------------------------------------------------ */

static void assert_sig(const json_t *obj, const char *want)
{
    const json_t *s = json_object_get(json_object_get(json_object_get(obj, "signatures"),
                                                      "domain"),
                                      "ed25519:1");
    assert_non_null(s);
    assert_string_equal(json_string_value(s), want);
}

static void test_signing_matches_the_spec_test_vectors(void **state)
{
    (void)state;
    fed_signing_key k;
    spec_key(&k);
    json_t *empty = json_object();
    assert_int_equal(fed_sign_json(empty, "domain", &k), 0);
    assert_sig(empty, SPEC_SIG_OF_EMPTY);
    assert_int_equal(json_object_size(empty), 1); /* only "signatures" was added */

    json_t *one_two = json_pack("{s:i, s:s}", "one", 1, "two", "Two");
    assert_int_equal(fed_sign_json(one_two, "domain", &k), 0);
    assert_sig(one_two, SPEC_SIG_OF_ONE_TWO);
    assert_int_equal(fed_verify_json(one_two, "domain", "ed25519:1", k.public_key, NULL, 0), 0);
    json_decref(empty);
    json_decref(one_two);
}

static void test_signing_keeps_other_signatures_and_ignores_unsigned(void **state)
{
    (void)state;
    fed_signing_key k;
    spec_key(&k);
    json_t *o = json_pack("{s:i, s:s, s:{s:{s:s}}, s:{s:i}}", "one", 1, "two", "Two",
                          "signatures", "other.example", "ed25519:x", "c2lnbmF0dXJl",
                          "unsigned", "age", 5);
    assert_int_equal(fed_sign_json(o, "domain", &k), 0);
    /* unsigned and signatures are outside what is signed: same signature as without. */
    assert_sig(o, SPEC_SIG_OF_ONE_TWO);
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(json_object_get(o, "signatures"), "other.example"),
                            "ed25519:x")),
                        "c2lnbmF0dXJl");
    assert_int_equal(json_integer_value(json_object_get(json_object_get(o, "unsigned"), "age")),
                     5);
    /* Changing unsigned does not break it; changing content does. */
    json_object_set_new(json_object_get(o, "unsigned"), "age", json_integer(99));
    assert_int_equal(fed_verify_json(o, "domain", "ed25519:1", k.public_key, NULL, 0), 0);
    json_object_set_new(o, "two", json_string("Three"));
    char why[256] = "";
    assert_int_equal(fed_verify_json(o, "domain", "ed25519:1", k.public_key, why, sizeof(why)),
                     FED_SIG_E_BAD);
    assert_non_null(strstr(why, "does not match"));
    json_decref(o);
}

static void test_verification_names_each_failure(void **state)
{
    (void)state;
    fed_signing_key k;
    spec_key(&k);
    json_t *o = json_pack("{s:i}", "one", 1);
    assert_int_equal(fed_sign_json(o, "domain", &k), 0);
    char why[256];
    assert_int_equal(fed_verify_json(o, "elsewhere", "ed25519:1", k.public_key, why,
                                     sizeof(why)), FED_SIG_E_UNSIGNED);
    assert_non_null(strstr(why, "elsewhere"));
    assert_int_equal(fed_verify_json(o, "domain", "ed25519:2", k.public_key, why, sizeof(why)),
                     FED_SIG_E_UNSIGNED);
    assert_int_equal(fed_verify_json(o, "domain", "rsa:1", k.public_key, why, sizeof(why)),
                     FED_SIG_E_ALGORITHM);
    /* Another key's public half. */
    unsigned char other[FED_PUBLIC_KEY_BYTES];
    assert_int_equal(rt_b64_decode_exact(SEQ_PUBLIC_B64, other, sizeof(other)), 0);
    assert_int_equal(fed_verify_json(o, "domain", "ed25519:1", other, why, sizeof(why)),
                     FED_SIG_E_BAD);
    json_t *mine = json_object_get(json_object_get(o, "signatures"), "domain");
    json_object_set_new(mine, "ed25519:1", json_string("not base64!"));
    assert_int_equal(fed_verify_json(o, "domain", "ed25519:1", k.public_key, why, sizeof(why)),
                     FED_SIG_E_BASE64);
    json_object_set_new(mine, "ed25519:1", json_integer(7));
    assert_int_equal(fed_verify_json(o, "domain", "ed25519:1", k.public_key, why, sizeof(why)),
                     FED_SIG_E_UNSIGNED);
    json_decref(o);

    /* A float has no canonical form: neither signable nor verifiable. */
    json_t *f = json_pack("{s:f}", "x", 1.5);
    assert_int_equal(fed_sign_json(f, "domain", &k), ATRIUM_E_INVAL);
    assert_null(json_object_get(f, "signatures"));
    json_object_set_new(f, "signatures",
                        json_pack("{s:{s:s}}", "domain", "ed25519:1", SPEC_SIG_OF_EMPTY));
    assert_int_equal(fed_verify_json(f, "domain", "ed25519:1", k.public_key, why, sizeof(why)),
                     FED_SIG_E_NOT_CANONICAL);
    json_decref(f);
    /* signatures that is not an object cannot be signed into. */
    json_t *s = json_pack("{s:s}", "signatures", "x");
    assert_int_equal(fed_sign_json(s, "domain", &k), ATRIUM_E_INVAL);
    json_decref(s);
}

/* ---- the key document ------------------------------------------------------------------- */

static void test_key_document_lists_current_and_old_keys_and_is_signed(void **state)
{
    (void)state;
    fed_signing_key k;
    spec_key(&k);
    fed_old_key old[2];
    char err[128];
    assert_int_equal(fed_old_key_parse("ed25519:old", SEQ_PUBLIC_B64, 1000, &old[0], err,
                                       sizeof(err)), 0);
    /* An old entry with the current ID is not published twice. */
    assert_int_equal(fed_old_key_parse("ed25519:1", SEQ_PUBLIC_B64, 2000, &old[1], err,
                                       sizeof(err)), 0);
    const int64_t now = 1700000000000;
    json_t *doc = fed_server_key_document("domain", &k, old, 2, now, FED_KEY_VALIDITY_DEFAULT_MS);
    assert_non_null(doc);
    assert_string_equal(json_string_value(json_object_get(doc, "server_name")), "domain");
    assert_int_equal(json_integer_value(json_object_get(doc, "valid_until_ts")),
                     now + 7LL * 24 * 3600 * 1000);
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(json_object_get(doc, "verify_keys"), "ed25519:1"),
                            "key")),
                        "XGX0JRS2Af3be3knz2fBiRbApjm2Dh61gXDJA8kcJNI"); /* the spec seed's */
    json_t *olds = json_object_get(doc, "old_verify_keys");
    assert_int_equal(json_object_size(olds), 1);
    json_t *o = json_object_get(olds, "ed25519:old");
    assert_string_equal(json_string_value(json_object_get(o, "key")), SEQ_PUBLIC_B64);
    assert_int_equal(json_integer_value(json_object_get(o, "expired_ts")), 1000);
    assert_int_equal(fed_verify_json(doc, "domain", "ed25519:1", k.public_key, NULL, 0), 0);
    json_decref(doc);
}

int main(void)
{
    if (sodium_init() < 0) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_b64_accepts_unpadded_padded_and_url_safe_forms),
        cmocka_unit_test(test_b64_refuses_what_no_encoder_writes),
        cmocka_unit_test_setup_teardown(
            test_missing_key_file_is_created_private_and_reloads_the_same_key, make_dir,
            remove_dir),
        cmocka_unit_test_setup_teardown(
            test_processes_creating_the_key_at_once_all_use_the_published_one, make_dir,
            remove_dir),
        cmocka_unit_test_setup_teardown(
            test_synapse_key_file_loads_with_or_without_trailing_newline, make_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_malformed_key_files_are_refused_with_a_reason,
                                        make_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_key_file_in_a_missing_directory_is_an_io_error,
                                        make_dir, remove_dir),
        cmocka_unit_test(test_old_key_entries_are_checked),
        cmocka_unit_test(test_signing_matches_the_spec_test_vectors),
        cmocka_unit_test(test_signing_keeps_other_signatures_and_ignores_unsigned),
        cmocka_unit_test(test_verification_names_each_failure),
        cmocka_unit_test(test_key_document_lists_current_and_old_keys_and_is_signed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
