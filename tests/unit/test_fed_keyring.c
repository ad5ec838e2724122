/*
 * tests/unit/test_fed_keyring.c - remote server keys: what a fetched key document must
 * satisfy (directly and through a notary), the coalescing of concurrent look-ups onto one
 * fetch, negative caching, validity, bounds, acting as a notary, and the PostgreSQL cache
 * (against the run's real PostgreSQL when ATRIUM_TEST_PG_CONNINFO is set, as tests/run.sh
 * does; skipped otherwise).
 *
 * The fetch hook here is the test's: it only counts what it is asked, and the test plays
 * the outbound client by calling fed_keyring_fetched with documents it signed itself.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <unistd.h>

#include "core/federation/transport/fed_keyring.h"
#include "core/federation/transport/fed_migrations.h"

#define T0 1700000000000LL
#define HOUR_MS (3600LL * 1000)
#define DAY_MS (24 * HOUR_MS)
#define WAIT_MS 10000

static _Atomic int64_t fake_now = T0;
static int64_t fake_clock(void) { return atomic_load(&fake_now); }

static fed_signing_key remote_key, remote_key2, notary_key, own_key;

static void make_key(fed_signing_key *k, const char *version, unsigned char fill)
{
    unsigned char seed[FED_SEED_BYTES];
    memset(seed, fill, sizeof(seed));
    assert_int_equal(fed_signing_key_from_seed(seed, version, k), 0);
}

static int setup(void **state)
{
    (void)state;
    make_key(&remote_key, "r1", 1);
    make_key(&remote_key2, "r2", 2);
    make_key(&notary_key, "n1", 3);
    make_key(&own_key, "own", 4);
    return 0;
}

/* A key document of server, valid until valid_until, signed by k. */
static json_t *doc_of(const char *server, const fed_signing_key *k, int64_t valid_until)
{
    json_t *d = fed_server_key_document(server, k, NULL, 0, valid_until, 0);
    assert_non_null(d);
    return d;
}

static fed_key_set *valid_set(const char *server, const fed_signing_key *k, int64_t valid_until)
{
    json_t *d = doc_of(server, k, valid_until);
    char why[FED_KEYRING_ERROR_MAX_BYTES];
    fed_key_set *s = fed_keyvalid_doc(d, server, atomic_load(&fake_now), why, sizeof(why));
    if (!s) fail_msg("%s", why);
    json_decref(d);
    return s;
}

/* ---- validation ------------------------------------------------------------------------- */

static void test_good_document_yields_keys_with_capped_validity(void **state)
{
    (void)state;
    fed_old_key old;
    char err[128], why[FED_KEYRING_ERROR_MAX_BYTES] = "";
    char pub_b64[FED_PUBLIC_KEY_B64_LEN];
    sodium_bin2base64(pub_b64, sizeof(pub_b64), remote_key2.public_key, FED_PUBLIC_KEY_BYTES,
                      sodium_base64_VARIANT_ORIGINAL_NO_PADDING);
    assert_int_equal(fed_old_key_parse("ed25519:r2", pub_b64, T0 - DAY_MS, &old, err,
                                       sizeof(err)), 0);
    /* valid_until_ts 30 days ahead: used for 7 days at most. */
    json_t *d = fed_server_key_document("remote.example", &remote_key, &old, 1, T0, 30 * DAY_MS);
    fed_key_set *s = fed_keyvalid_doc(d, "remote.example", T0, why, sizeof(why));
    assert_non_null(s);
    assert_int_equal(s->n, 2);
    assert_string_equal(s->keys[0].key_id, "ed25519:r1");
    assert_memory_equal(s->keys[0].public_key, remote_key.public_key, FED_PUBLIC_KEY_BYTES);
    assert_int_equal(s->keys[0].valid_until_ms, T0 + 7 * DAY_MS);
    assert_false(s->keys[0].old);
    assert_string_equal(s->keys[1].key_id, "ed25519:r2");
    assert_true(s->keys[1].old);
    assert_int_equal(s->keys[1].valid_until_ms, T0 - DAY_MS); /* its expired_ts */
    /* The document kept is the one the origin signed. */
    assert_int_equal(fed_verify_json(s->docs[0], "remote.example", "ed25519:r1",
                                     remote_key.public_key, NULL, 0), 0);
    fed_key_set_free(s);
    json_decref(d);

    /* valid_until_ts within the cap is used as is. */
    d = fed_server_key_document("remote.example", &remote_key, NULL, 0, T0, HOUR_MS);
    s = fed_keyvalid_doc(d, "remote.example", T0, why, sizeof(why));
    assert_non_null(s);
    assert_int_equal(s->keys[0].valid_until_ms, T0 + HOUR_MS);
    fed_key_set_free(s);
    json_decref(d);
}

static void expect_refused(const json_t *d, const char *server, const char *reason)
{
    char why[FED_KEYRING_ERROR_MAX_BYTES] = "";
    fed_key_set *s = fed_keyvalid_doc(d, server, T0, why, sizeof(why));
    if (s || !strstr(why, reason)) fail_msg("accepted or wrong reason: \"%s\" (wanted \"%s\")",
                                            why, reason);
}

static void test_document_for_another_server_is_refused(void **state)
{
    (void)state;
    json_t *d = doc_of("evil.example", &remote_key, T0 + DAY_MS);
    expect_refused(d, "remote.example", "names server \"evil.example\"");
    json_decref(d);
}

static void test_document_missing_a_self_signature_is_refused(void **state)
{
    (void)state;
    /* Two verify keys, signed by only one of them. */
    json_t *d = doc_of("remote.example", &remote_key, T0 + DAY_MS);
    char b64[FED_PUBLIC_KEY_B64_LEN];
    sodium_bin2base64(b64, sizeof(b64), remote_key2.public_key, FED_PUBLIC_KEY_BYTES,
                      sodium_base64_VARIANT_ORIGINAL_NO_PADDING);
    json_object_del(d, "signatures");
    json_object_set_new(json_object_get(d, "verify_keys"), "ed25519:r2",
                        json_pack("{s:s}", "key", b64));
    assert_int_equal(fed_sign_json(d, "remote.example", &remote_key), 0);
    expect_refused(d, "remote.example", "not self-signed");
    /* Signed by both: accepted. */
    assert_int_equal(fed_sign_json(d, "remote.example", &remote_key2), 0);
    char why[FED_KEYRING_ERROR_MAX_BYTES];
    fed_key_set *s = fed_keyvalid_doc(d, "remote.example", T0, why, sizeof(why));
    assert_non_null(s);
    assert_int_equal(s->n, 2);
    fed_key_set_free(s);
    /* Altered after signing. */
    json_object_set_new(d, "valid_until_ts", json_integer(T0 + 365 * DAY_MS));
    expect_refused(d, "remote.example", "does not match");
    json_decref(d);
    /* Not signed at all. */
    d = doc_of("remote.example", &remote_key, T0 + DAY_MS);
    json_object_del(d, "signatures");
    expect_refused(d, "remote.example", "not self-signed");
    json_decref(d);
}

static void test_document_shape_is_checked(void **state)
{
    (void)state;
    json_t *d = doc_of("remote.example", &remote_key, T0 + DAY_MS);
    json_object_del(d, "valid_until_ts");
    expect_refused(d, "remote.example", "valid_until_ts");
    json_decref(d);

    d = json_pack("{s:s, s:{}, s:I}", "server_name", "remote.example", "verify_keys",
                  "valid_until_ts", (json_int_t)(T0 + DAY_MS));
    expect_refused(d, "remote.example", "no ed25519 verify key");
    json_decref(d);

    d = json_pack("{s:s, s:{s:{s:s}}, s:I}", "server_name", "remote.example", "verify_keys",
                  "ed25519:r1", "key", "Zm9v", "valid_until_ts", (json_int_t)(T0 + DAY_MS));
    expect_refused(d, "remote.example", "malformed verify key");
    json_decref(d);

    /* A key of another algorithm is skipped, not trusted and not fatal. */
    d = doc_of("remote.example", &remote_key, T0 + DAY_MS);
    json_object_del(d, "signatures");
    json_object_set_new(json_object_get(d, "verify_keys"), "curve9:x",
                        json_pack("{s:s}", "key", "whatever"));
    fed_sign_json(d, "remote.example", &remote_key);
    char why[FED_KEYRING_ERROR_MAX_BYTES];
    fed_key_set *s = fed_keyvalid_doc(d, "remote.example", T0, why, sizeof(why));
    assert_non_null(s);
    assert_int_equal(s->n, 1);
    fed_key_set_free(s);
    json_decref(d);

    /* A key ID outside the spec's [A-Za-z0-9_] (another implementation's) is still used. */
    fed_signing_key dashed = remote_key;
    snprintf(dashed.key_id, sizeof(dashed.key_id), "ed25519:auto-1");
    d = doc_of("remote.example", &dashed, T0 + DAY_MS);
    s = fed_keyvalid_doc(d, "remote.example", T0, why, sizeof(why));
    assert_non_null(s);
    assert_string_equal(s->keys[0].key_id, "ed25519:auto-1");
    fed_key_set_free(s);
    json_decref(d);
    snprintf(dashed.key_id, sizeof(dashed.key_id), "ed25519:a\"b");
    d = doc_of("remote.example", &dashed, T0 + DAY_MS);
    expect_refused(d, "remote.example", "malformed verify key");
    json_decref(d);

    d = doc_of("remote.example", &remote_key, T0 + DAY_MS);
    json_object_set_new(json_object_get(d, "old_verify_keys"), "ed25519:o",
                        json_pack("{s:s}", "key", "Zm9v"));
    json_object_del(d, "signatures");
    fed_sign_json(d, "remote.example", &remote_key);
    expect_refused(d, "remote.example", "malformed old verify key");
    json_decref(d);
}

static fed_public_key notary_pub(void)
{
    fed_public_key k;
    memcpy(k.key_id, notary_key.key_id, sizeof(k.key_id));
    memcpy(k.public_key, notary_key.public_key, FED_PUBLIC_KEY_BYTES);
    return k;
}

static void test_notary_answer_needs_the_notary_signature(void **state)
{
    (void)state;
    fed_public_key nk = notary_pub();
    fed_notary notary = {"notary.example", &nk, 1};
    json_t *d = doc_of("remote.example", &remote_key, T0 + DAY_MS);
    json_t *other = doc_of("other.example", &remote_key2, T0 + DAY_MS);
    json_t *resp = json_pack("{s:[O, O]}", "server_keys", other, d);
    char why[FED_KEYRING_ERROR_MAX_BYTES] = "";
    /* Only the origin signed: refused. */
    assert_null(fed_keyvalid_notary(resp, "remote.example", &notary, T0, why, sizeof(why)));
    assert_non_null(strstr(why, "not signed with any of its configured keys"));
    /* The notary signs (its copy in the list). */
    json_t *listed = json_array_get(json_object_get(resp, "server_keys"), 1);
    assert_int_equal(fed_sign_json(listed, "notary.example", &notary_key), 0);
    fed_key_set *s = fed_keyvalid_notary(resp, "remote.example", &notary, T0, why,
                                                 sizeof(why));
    if (!s) fail_msg("%s", why);
    assert_int_equal(s->n, 1);
    assert_string_equal(s->server_name, "remote.example");
    fed_key_set_free(s);
    /* Two documents of the server (an old and a new answer): for one key, the longer
     * validity wins. */
    json_t *newer = doc_of("remote.example", &remote_key, T0 + 3 * DAY_MS);
    fed_sign_json(newer, "notary.example", &notary_key);
    json_array_append_new(json_object_get(resp, "server_keys"), newer);
    s = fed_keyvalid_notary(resp, "remote.example", &notary, T0, why, sizeof(why));
    if (!s) fail_msg("%s", why);
    assert_int_equal(s->n, 1);
    assert_int_equal(s->keys[0].valid_until_ms, T0 + 3 * DAY_MS);
    fed_key_set_free(s);
    json_array_remove(json_object_get(resp, "server_keys"), 2);
    /* A notary signature that does not match (the document changed after it signed). */
    json_object_set_new(json_object_get(json_object_get(listed, "signatures"), "notary.example"),
                        notary_key.key_id,
                        json_string("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"));
    assert_null(fed_keyvalid_notary(resp, "remote.example", &notary, T0, why, sizeof(why)));
    assert_non_null(strstr(why, "does not verify"));
    /* Nothing for the server asked about. */
    assert_null(fed_keyvalid_notary(resp, "third.example", &notary, T0, why, sizeof(why)));
    assert_non_null(strstr(why, "no keys for third.example"));
    /* A notary without configured keys cannot vouch. */
    fed_notary blind = {"notary.example", NULL, 0};
    assert_null(fed_keyvalid_notary(resp, "remote.example", &blind, T0, why, sizeof(why)));
    json_decref(resp);
    json_decref(d);
    json_decref(other);
}

/* ---- the ring --------------------------------------------------------------------------- */

typedef struct hook {
    atomic_int calls;
    char last[FED_SERVER_NAME_MAX_BYTES];
    pthread_mutex_t mu;
    int fail_start; /* return this from the hook */
} hook;

static hook H;

static int test_fetch(void *arg, fed_keyring *ring, const char *server)
{
    (void)ring;
    hook *h = arg;
    pthread_mutex_lock(&h->mu);
    snprintf(h->last, sizeof(h->last), "%s", server);
    pthread_mutex_unlock(&h->mu);
    atomic_fetch_add(&h->calls, 1);
    return h->fail_start;
}

typedef struct answers {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n, found, unreachable, unknown, stopped, busy;
    char last_error[FED_KEYRING_ERROR_MAX_BYTES];
} answers;

static void answers_init(answers *a)
{
    memset(a, 0, sizeof(*a));
    pthread_mutex_init(&a->mu, NULL);
    rt_cond_init(&a->cv);
}

static void count_status(answers *a, const fed_key_result *r)
{
    a->n++;
    if (r->status == FED_KEY_FOUND) a->found++;
    if (r->status == FED_KEY_E_UNREACHABLE) a->unreachable++;
    if (r->status == FED_KEY_E_UNKNOWN) a->unknown++;
    if (r->status == FED_KEY_E_STOPPED) a->stopped++;
    if (r->status == FED_KEY_E_BUSY) a->busy++;
    snprintf(a->last_error, sizeof(a->last_error), "%s", r->error);
}

static void on_answer(void *arg, const fed_key_result *r)
{
    answers *a = arg;
    pthread_mutex_lock(&a->mu);
    count_status(a, r);
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

static void wait_answers(answers *a, int n)
{
    int64_t deadline = rt_now_ms() + WAIT_MS;
    pthread_mutex_lock(&a->mu);
    while (a->n < n && rt_now_ms() < deadline) rt_scope_wait(&a->cv, &a->mu, deadline);
    int got = a->n;
    pthread_mutex_unlock(&a->mu);
    if (got < n) fail_msg("%d answers of %d", got, n);
}

/* Look up and count a synchronous answer like an asynchronous one. */
static int lookup(fed_keyring *ring, const char *server, const char *key_id, int64_t min,
                  answers *a)
{
    fed_key_result r;
    int rc = fed_keyring_lookup(ring, server, key_id, min, &r, on_answer, a);
    if (rc == FED_KEYRING_ANSWERED) on_answer(a, &r);
    return rc;
}

static fed_keyring *new_ring(db_pool *db, int max_servers, int max_waiters)
{
    memset(&H, 0, sizeof(H));
    pthread_mutex_init(&H.mu, NULL);
    atomic_store(&fake_now, T0);
    fed_keyring_settings s = {.max_servers = max_servers, .max_waiters = max_waiters,
                              .negative_ttl_ms = 60000, .refetch_min_interval_ms = 30000,
                              .fetch = test_fetch, .fetch_arg = &H, .clock_ms = fake_clock};
    fed_keyring *ring = fed_keyring_new(&s, db, NULL);
    assert_non_null(ring);
    assert_int_equal(fed_keyring_start(ring), 0);
    return ring;
}

static void end_ring(fed_keyring *ring)
{
    fed_keyring_stop(ring);
    fed_keyring_free(ring);
}

static void test_many_lookups_share_one_fetch_and_all_are_answered(void **state)
{
    (void)state;
    fed_keyring *ring = new_ring(NULL, 0, 0);
    answers a;
    answers_init(&a);
    enum { N = 10 };
    for (int i = 0; i < N; i++)
        assert_int_equal(lookup(ring, "remote.example", "ed25519:r1", T0, &a),
                         FED_KEYRING_PENDING);
    assert_int_equal(atomic_load(&H.calls), 1);
    assert_string_equal(H.last, "remote.example");
    assert_int_equal(a.n, 0);
    fed_keyring_fetched(ring, "remote.example", valid_set("remote.example", &remote_key, T0 + DAY_MS),
                        NULL);
    wait_answers(&a, N);
    assert_int_equal(a.found, N);
    /* Now memory answers at once, without a fetch. */
    fed_key_result r;
    assert_int_equal(fed_keyring_lookup(ring, "remote.example", "ed25519:r1", T0 + HOUR_MS, &r,
                                        on_answer, &a), FED_KEYRING_ANSWERED);
    assert_int_equal(r.status, FED_KEY_FOUND);
    assert_memory_equal(r.key.public_key, remote_key.public_key, FED_PUBLIC_KEY_BYTES);
    assert_int_equal(r.key.valid_until_ms, T0 + DAY_MS);
    assert_int_equal(atomic_load(&H.calls), 1);
    end_ring(ring);
}

typedef struct racer {
    fed_keyring *ring;
    answers *a;
    pthread_barrier_t *go;
} racer;

enum { RACERS = 8, LOOKUPS_PER_RACER = 50 };

static void *race(void *arg)
{
    racer *r = arg;
    pthread_barrier_wait(r->go);
    for (int i = 0; i < LOOKUPS_PER_RACER; i++)
        lookup(r->ring, "busy.example", "ed25519:r1", T0, r->a);
    return NULL;
}

static void test_concurrent_lookups_from_many_threads_share_one_fetch(void **state)
{
    (void)state;
    fed_keyring *ring = new_ring(NULL, 0, 0);
    answers a;
    answers_init(&a);
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, RACERS);
    pthread_t t[RACERS];
    racer r = {ring, &a, &go};
    for (int i = 0; i < RACERS; i++) pthread_create(&t[i], NULL, race, &r);
    for (int i = 0; i < RACERS; i++) pthread_join(t[i], NULL);
    pthread_barrier_destroy(&go);
    assert_int_equal(atomic_load(&H.calls), 1);
    fed_keyring_fetched(ring, "busy.example", valid_set("busy.example", &remote_key, T0 + DAY_MS),
                        NULL);
    wait_answers(&a, RACERS * LOOKUPS_PER_RACER);
    assert_int_equal(a.found, RACERS * LOOKUPS_PER_RACER);
    assert_int_equal(atomic_load(&H.calls), 1);
    end_ring(ring);
}

static void test_failed_fetch_is_cached_briefly(void **state)
{
    (void)state;
    fed_keyring *ring = new_ring(NULL, 0, 0);
    answers a;
    answers_init(&a);
    assert_int_equal(lookup(ring, "dead.example", "ed25519:r1", T0, &a), FED_KEYRING_PENDING);
    assert_int_equal(lookup(ring, "dead.example", "ed25519:r1", T0, &a), FED_KEYRING_PENDING);
    fed_keyring_fetched(ring, "dead.example", NULL, "connection refused");
    wait_answers(&a, 2);
    assert_int_equal(a.unreachable, 2);
    assert_non_null(strstr(a.last_error, "connection refused"));
    /* Within the negative TTL: answered at once, the origin is not asked again. */
    atomic_store(&fake_now, T0 + 59000);
    assert_int_equal(lookup(ring, "dead.example", "ed25519:r1", T0, &a), FED_KEYRING_ANSWERED);
    assert_int_equal(a.unreachable, 3);
    assert_int_equal(atomic_load(&H.calls), 1);
    /* After it: asked again. */
    atomic_store(&fake_now, T0 + 61000);
    assert_int_equal(lookup(ring, "dead.example", "ed25519:r1", T0, &a), FED_KEYRING_PENDING);
    assert_int_equal(atomic_load(&H.calls), 2);
    fed_keyring_fetched(ring, "dead.example", valid_set("dead.example", &remote_key, T0 + DAY_MS),
                        NULL);
    wait_answers(&a, 4);
    assert_int_equal(a.found, 1);
    end_ring(ring);
}

static void test_keys_of_another_server_do_not_answer(void **state)
{
    (void)state;
    fed_keyring *ring = new_ring(NULL, 0, 0);
    answers a;
    answers_init(&a);
    lookup(ring, "remote.example", "ed25519:r1", T0, &a);
    fed_keyring_fetched(ring, "remote.example", valid_set("evil.example", &remote_key, T0 + DAY_MS),
                        NULL);
    wait_answers(&a, 1);
    assert_int_equal(a.unreachable, 1);
    assert_non_null(strstr(a.last_error, "evil.example"));
    end_ring(ring);
}

static void test_hook_that_cannot_start_fails_the_waiters(void **state)
{
    (void)state;
    fed_keyring *ring = new_ring(NULL, 0, 0);
    H.fail_start = -1;
    answers a;
    answers_init(&a);
    lookup(ring, "nowhere.example", "ed25519:r1", T0, &a);
    wait_answers(&a, 1);
    assert_int_equal(a.unreachable, 1);
    /* ...and counts as a failure: cached. */
    assert_int_equal(lookup(ring, "nowhere.example", "ed25519:r1", T0, &a), FED_KEYRING_ANSWERED);
    assert_int_equal(atomic_load(&H.calls), 1);
    end_ring(ring);
}

static void test_expired_validity_makes_a_refetch(void **state)
{
    (void)state;
    fed_keyring *ring = new_ring(NULL, 0, 0);
    answers a;
    answers_init(&a);
    lookup(ring, "remote.example", "ed25519:r1", T0, &a);
    fed_keyring_fetched(ring, "remote.example",
                        valid_set("remote.example", &remote_key, T0 + HOUR_MS), NULL);
    wait_answers(&a, 1);
    assert_int_equal(a.found, 1);
    /* What was signed within the validity still verifies without a fetch. */
    assert_int_equal(lookup(ring, "remote.example", "ed25519:r1", T0 + HOUR_MS, &a),
                     FED_KEYRING_ANSWERED);
    assert_int_equal(a.found, 2);
    /* Later than it: within the refetch interval, refused at once without asking... */
    assert_int_equal(lookup(ring, "remote.example", "ed25519:r1", T0 + HOUR_MS + 1, &a),
                     FED_KEYRING_ANSWERED);
    assert_int_equal(a.unknown, 1);
    assert_int_equal(atomic_load(&H.calls), 1);
    /* ...after it, fetched again; the new document answers. */
    atomic_store(&fake_now, T0 + HOUR_MS + 1);
    assert_int_equal(lookup(ring, "remote.example", "ed25519:r1", T0 + HOUR_MS + 1, &a),
                     FED_KEYRING_PENDING);
    assert_int_equal(atomic_load(&H.calls), 2);
    fed_keyring_fetched(ring, "remote.example",
                        valid_set("remote.example", &remote_key, T0 + 2 * DAY_MS), NULL);
    wait_answers(&a, 4);
    assert_int_equal(a.found, 3);
    end_ring(ring);
}

static void test_unknown_key_id_does_not_hammer_the_origin(void **state)
{
    (void)state;
    fed_keyring *ring = new_ring(NULL, 0, 0);
    answers a;
    answers_init(&a);
    lookup(ring, "remote.example", "ed25519:made_up", T0, &a);
    fed_keyring_fetched(ring, "remote.example",
                        valid_set("remote.example", &remote_key, T0 + DAY_MS), NULL);
    wait_answers(&a, 1);
    assert_int_equal(a.unknown, 1);
    assert_non_null(strstr(a.last_error, "ed25519:made_up"));
    for (int i = 0; i < 20; i++) lookup(ring, "remote.example", "ed25519:other", T0, &a);
    assert_int_equal(a.unknown, 21);
    assert_int_equal(atomic_load(&H.calls), 1);
    end_ring(ring);
}

static void test_waiters_and_memory_are_bounded(void **state)
{
    (void)state;
    /* At most 2 waiters. */
    fed_keyring *ring = new_ring(NULL, 2, 2);
    answers a;
    answers_init(&a);
    assert_int_equal(lookup(ring, "a.example", "ed25519:r1", T0, &a), FED_KEYRING_PENDING);
    assert_int_equal(lookup(ring, "b.example", "ed25519:r1", T0, &a), FED_KEYRING_PENDING);
    assert_int_equal(lookup(ring, "a.example", "ed25519:r1", T0, &a), FED_KEYRING_ANSWERED);
    assert_int_equal(a.busy, 1);
    /* At most 2 servers in memory, both busy: a third cannot even be asked for. */
    fed_keyring_fetched(ring, "a.example", valid_set("a.example", &remote_key, T0 + DAY_MS), NULL);
    assert_int_equal(lookup(ring, "c.example", "ed25519:r1", T0, &a), FED_KEYRING_PENDING);
    /* a.example was idle: evicted for c.example; b.example (fetching) stayed. */
    fed_keyring_fetched(ring, "b.example", valid_set("b.example", &remote_key, T0 + DAY_MS), NULL);
    fed_keyring_fetched(ring, "c.example", valid_set("c.example", &remote_key, T0 + DAY_MS), NULL);
    wait_answers(&a, 4);
    assert_int_equal(a.found, 3);
    int calls = atomic_load(&H.calls);
    assert_int_equal(lookup(ring, "a.example", "ed25519:r1", T0, &a), FED_KEYRING_PENDING);
    assert_int_equal(atomic_load(&H.calls), calls + 1); /* forgotten: asked again */
    assert_int_equal(lookup(ring, "c.example", "ed25519:r1", T0, &a), FED_KEYRING_ANSWERED);
    end_ring(ring);
}

static void test_stop_answers_every_waiter(void **state)
{
    (void)state;
    fed_keyring *ring = new_ring(NULL, 0, 0);
    answers a;
    answers_init(&a);
    for (int i = 0; i < 3; i++) lookup(ring, "slow.example", "ed25519:r1", T0, &a);
    fed_keyring_stop(ring);
    wait_answers(&a, 3);
    assert_int_equal(a.stopped, 3);
    /* The outbound client's late answer is harmless. */
    fed_keyring_fetched(ring, "slow.example", valid_set("slow.example", &remote_key, T0 + DAY_MS),
                        NULL);
    assert_int_equal(lookup(ring, "slow.example", "ed25519:r1", T0, &a), FED_KEYRING_ANSWERED);
    assert_int_equal(a.stopped, 4);
    fed_keyring_free(ring);
}

/* ---- acting as a notary ------------------------------------------------------------------ */

typedef struct notary_answer {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    json_t *resp;
} notary_answer;

static void on_notary(void *arg, json_t *resp)
{
    notary_answer *n = arg;
    pthread_mutex_lock(&n->mu);
    n->resp = resp;
    pthread_cond_broadcast(&n->cv);
    pthread_mutex_unlock(&n->mu);
}

static json_t *wait_notary(notary_answer *n)
{
    int64_t deadline = rt_now_ms() + WAIT_MS;
    pthread_mutex_lock(&n->mu);
    while (!n->resp && rt_now_ms() < deadline) rt_scope_wait(&n->cv, &n->mu, deadline);
    json_t *r = n->resp;
    n->resp = NULL;
    pthread_mutex_unlock(&n->mu);
    assert_non_null(r);
    return r;
}

static void test_notary_query_parse(void **state)
{
    (void)state;
    fed_notary_criterion c[FED_NOTARY_CRITERIA_MAX];
    char why[256];
    json_t *b = json_loads("{\"server_keys\": {\"a.example\": {\"ed25519:k1\": "
                           "{\"minimum_valid_until_ts\": 5}, \"ed25519:k2\": {}},"
                           " \"b.example\": {}}}", 0, NULL);
    assert_int_equal(fed_notary_query_parse(b, T0, c, why, sizeof(why)), 3);
    int seen_b = 0;
    for (int i = 0; i < 3; i++) {
        if (strcmp(c[i].server_name, "b.example") == 0) {
            seen_b++;
            assert_null(c[i].key_id);
            assert_int_equal(c[i].minimum_valid_until_ms, T0);
        } else if (strcmp(c[i].key_id, "ed25519:k1") == 0) {
            assert_int_equal(c[i].minimum_valid_until_ms, 5);
        } else {
            assert_string_equal(c[i].key_id, "ed25519:k2");
            assert_int_equal(c[i].minimum_valid_until_ms, T0); /* "MUST use the current time" */
        }
    }
    assert_int_equal(seen_b, 1);
    json_decref(b);
    b = json_loads("{\"server_keys\": {}}", 0, NULL);
    assert_int_equal(fed_notary_query_parse(b, T0, c, why, sizeof(why)), 0);
    json_decref(b);
    static const char *const bad[] = {
        "{}", "{\"server_keys\": []}", "{\"server_keys\": {\"a\": 1}}",
        "{\"server_keys\": {\"a\": {\"k\": 1}}}",
        "{\"server_keys\": {\"a\": {\"k\": {\"minimum_valid_until_ts\": \"soon\"}}}}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        b = json_loads(bad[i], 0, NULL);
        assert_int_equal(fed_notary_query_parse(b, T0, c, why, sizeof(why)), ATRIUM_E_INVAL);
        json_decref(b);
    }
    json_t *many = json_object();
    for (int i = 0; i <= FED_NOTARY_CRITERIA_MAX; i++) {
        char name[32];
        snprintf(name, sizeof(name), "s%d.example", i);
        json_object_set_new(many, name, json_object());
    }
    b = json_pack("{s:o}", "server_keys", many);
    assert_int_equal(fed_notary_query_parse(b, T0, c, why, sizeof(why)), ATRIUM_E_INVAL);
    assert_non_null(strstr(why, "at most"));
    json_decref(b);
}

static void test_notary_serves_cached_documents_signed_by_us(void **state)
{
    (void)state;
    fed_keyring *ring = new_ring(NULL, 0, 0);
    /* remote.example's document, as it came through another notary. */
    json_t *d = doc_of("remote.example", &remote_key, T0 + DAY_MS);
    fed_sign_json(d, "notary.example", &notary_key);
    char why[FED_KEYRING_ERROR_MAX_BYTES];
    fed_keyring_fetched(ring, "remote.example",
                        fed_keyvalid_doc(d, "remote.example", T0, why, sizeof(why)), NULL);
    json_decref(d);
    json_t *own_doc = fed_server_key_document("me.example", &own_key, NULL, 0, T0, DAY_MS);

    fed_notary_criterion c[] = {{"remote.example", NULL, T0}, {"me.example", NULL, T0},
                                {"remote.example", "ed25519:r1", T0}};
    json_t *resp = NULL;
    notary_answer n = {.resp = NULL};
    pthread_mutex_init(&n.mu, NULL);
    rt_cond_init(&n.cv);
    assert_int_equal(fed_notary_query(ring, c, 3, "me.example", &own_key, own_doc, &resp,
                                              on_notary, &n), FED_KEYRING_ANSWERED);
    json_t *list = json_object_get(resp, "server_keys");
    assert_int_equal(json_array_size(list), 2); /* remote.example once, and ours */
    json_t *remote = json_array_get(list, 0);
    assert_string_equal(json_string_value(json_object_get(remote, "server_name")),
                        "remote.example");
    assert_int_equal(fed_verify_json(remote, "remote.example", "ed25519:r1",
                                     remote_key.public_key, NULL, 0), 0);
    assert_int_equal(fed_verify_json(remote, "me.example", "ed25519:own", own_key.public_key,
                                     NULL, 0), 0);
    assert_null(json_object_get(json_object_get(remote, "signatures"), "notary.example"));
    json_t *mine = json_array_get(list, 1);
    assert_string_equal(json_string_value(json_object_get(mine, "server_name")), "me.example");
    json_decref(resp);

    /* Not cached: fetched first (one fetch for both criteria), answered when it arrives. */
    fed_notary_criterion c2[] = {{"new.example", "ed25519:r2", T0}, {"new.example", NULL, T0}};
    resp = NULL;
    assert_int_equal(fed_notary_query(ring, c2, 2, "me.example", &own_key, own_doc, &resp,
                                              on_notary, &n), FED_KEYRING_PENDING);
    assert_int_equal(atomic_load(&H.calls), 1);
    fed_keyring_fetched(ring, "new.example", valid_set("new.example", &remote_key2, T0 + DAY_MS),
                        NULL);
    resp = wait_notary(&n);
    list = json_object_get(resp, "server_keys");
    assert_int_equal(json_array_size(list), 1);
    assert_int_equal(fed_verify_json(json_array_get(list, 0), "me.example", "ed25519:own",
                                     own_key.public_key, NULL, 0), 0);
    json_decref(resp);

    /* A server that cannot be reached and was never cached: an empty answer. */
    fed_notary_criterion c3[] = {{"dead.example", NULL, T0}};
    assert_int_equal(fed_notary_query(ring, c3, 1, "me.example", &own_key, own_doc, &resp,
                                              on_notary, &n), FED_KEYRING_PENDING);
    fed_keyring_fetched(ring, "dead.example", NULL, "timed out");
    resp = wait_notary(&n);
    assert_int_equal(json_array_size(json_object_get(resp, "server_keys")), 0);
    json_decref(resp);

    /* A cached server whose origin is down now keeps being served (its last answer). */
    atomic_store(&fake_now, T0 + 2 * DAY_MS);
    fed_notary_criterion c4[] = {{"remote.example", NULL, T0 + 2 * DAY_MS}};
    assert_int_equal(fed_notary_query(ring, c4, 1, "me.example", &own_key, own_doc, &resp,
                                              on_notary, &n), FED_KEYRING_PENDING);
    fed_keyring_fetched(ring, "remote.example", NULL, "connection refused");
    resp = wait_notary(&n);
    assert_int_equal(json_array_size(json_object_get(resp, "server_keys")), 1);
    json_decref(resp);
    json_decref(own_doc);
    end_ring(ring);
}

/* ---- PostgreSQL -------------------------------------------------------------------------- */

static char dbname[64];

static PGconn *admin_conn(void)
{
    const char *base = getenv("ATRIUM_TEST_PG_CONNINFO");
    char ci[1024];
    snprintf(ci, sizeof(ci), "%s dbname=postgres", base);
    PGconn *c = PQconnectdb(ci);
    if (PQstatus(c) != CONNECTION_OK) fail_msg("PostgreSQL: %s", PQerrorMessage(c));
    return c;
}

static void admin_exec(const char *sql)
{
    PGconn *c = admin_conn();
    PGresult *r = PQexec(c, sql);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) fail_msg("%s: %s", sql, PQresultErrorMessage(r));
    PQclear(r);
    PQfinish(c);
}

static void test_keys_survive_in_postgresql_across_rings(void **state)
{
    (void)state;
    if (!getenv("ATRIUM_TEST_PG_CONNINFO")) {
        printf("ATRIUM_TEST_PG_CONNINFO not set (tests/run.sh sets it): skipped\n");
        skip();
    }
    snprintf(dbname, sizeof(dbname), "atrium_unit_fedkeys_%ld", (long)getpid());
    char sql[256];
    snprintf(sql, sizeof(sql), "DROP DATABASE IF EXISTS %s", dbname);
    admin_exec(sql);
    snprintf(sql, sizeof(sql), "CREATE DATABASE %s", dbname);
    admin_exec(sql);
    char ci[1024];
    snprintf(ci, sizeof(ci), "%s dbname=%s", getenv("ATRIUM_TEST_PG_CONNINFO"), dbname);
    db_pool *db = db_pool_new(ci, 2, 2000, NULL);
    assert_non_null(db);
    assert_int_equal(db_pool_connect(db, 10), 0);
    assert_int_equal(db_migrate(db, FED_MIGRATIONS_OWNER, FED_MIGRATIONS, FED_N_MIGRATIONS), 0);

    /* The first ring fetches remote.example (a current and an old key) and stores it. */
    fed_keyring *ring = new_ring(db, 0, 0);
    answers a;
    answers_init(&a);
    assert_int_equal(lookup(ring, "remote.example", "ed25519:r1", T0, &a), FED_KEYRING_PENDING);
    int64_t deadline = rt_now_ms() + WAIT_MS;
    while (atomic_load(&H.calls) == 0 && rt_now_ms() < deadline) usleep(1000); /* after the read */
    assert_int_equal(atomic_load(&H.calls), 1);
    fed_old_key old;
    char err[128], b64[FED_PUBLIC_KEY_B64_LEN];
    sodium_bin2base64(b64, sizeof(b64), remote_key2.public_key, FED_PUBLIC_KEY_BYTES,
                      sodium_base64_VARIANT_ORIGINAL_NO_PADDING);
    assert_int_equal(fed_old_key_parse("ed25519:r2", b64, T0 - HOUR_MS, &old, err, sizeof(err)),
                     0);
    json_t *d = fed_server_key_document("remote.example", &remote_key, &old, 1, T0, DAY_MS);
    char why[FED_KEYRING_ERROR_MAX_BYTES];
    fed_keyring_fetched(ring, "remote.example",
                        fed_keyvalid_doc(d, "remote.example", T0, why, sizeof(why)), NULL);
    json_decref(d);
    wait_answers(&a, 1);
    assert_int_equal(a.found, 1);
    assert_int_equal(fed_keyring_flush(ring, WAIT_MS), 0);
    end_ring(ring);

    PGconn *c = db_acquire(db, 1000);
    PGresult *r = PQexec(c, "SELECT key_id, valid_until_ts, fetched_ts FROM federation_server_keys"
                            " WHERE server_name = 'remote.example' ORDER BY key_id");
    assert_int_equal(PQntuples(r), 2);
    assert_string_equal(PQgetvalue(r, 0, 0), "ed25519:r1");
    char want[32];
    snprintf(want, sizeof(want), "%lld", T0 + DAY_MS);
    assert_string_equal(PQgetvalue(r, 0, 1), want);
    assert_string_equal(PQgetvalue(r, 1, 0), "ed25519:r2");
    PQclear(r);
    db_release(db, c);

    /* A second ring (a restart: empty memory) answers from PostgreSQL without fetching. */
    ring = new_ring(db, 0, 0);
    answers_init(&a);
    assert_int_equal(lookup(ring, "remote.example", "ed25519:r1", T0, &a), FED_KEYRING_PENDING);
    wait_answers(&a, 1);
    assert_int_equal(a.found, 1);
    assert_int_equal(lookup(ring, "remote.example", "ed25519:r2", T0 - 2 * HOUR_MS, &a),
                     FED_KEYRING_ANSWERED); /* the old key, for what it signed before expiry */
    assert_int_equal(a.found, 2);
    assert_int_equal(atomic_load(&H.calls), 0);
    /* The stored document is the origin's, intact: it still verifies. */
    json_t *docs = fed_keyring_cached_documents(ring, "remote.example", NULL, 0);
    assert_int_equal(json_array_size(docs), 1); /* both keys came from one document */
    assert_int_equal(fed_verify_json(json_array_get(docs, 0), "remote.example", "ed25519:r1",
                                     remote_key.public_key, NULL, 0), 0);
    json_decref(docs);
    /* Something not stored still goes to the fetch hook. */
    assert_int_equal(lookup(ring, "else.example", "ed25519:r1", T0, &a), FED_KEYRING_PENDING);
    deadline = rt_now_ms() + WAIT_MS;
    while (atomic_load(&H.calls) == 0 && rt_now_ms() < deadline) usleep(1000);
    assert_int_equal(atomic_load(&H.calls), 1);
    end_ring(ring);
    wait_answers(&a, 3);
    assert_int_equal(a.stopped, 1);

    db_pool_free(db);
    snprintf(sql, sizeof(sql), "DROP DATABASE %s", dbname);
    admin_exec(sql);
}

int main(void)
{
    if (sodium_init() < 0) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_document_yields_keys_with_capped_validity),
        cmocka_unit_test(test_document_for_another_server_is_refused),
        cmocka_unit_test(test_document_missing_a_self_signature_is_refused),
        cmocka_unit_test(test_document_shape_is_checked),
        cmocka_unit_test(test_notary_answer_needs_the_notary_signature),
        cmocka_unit_test(test_many_lookups_share_one_fetch_and_all_are_answered),
        cmocka_unit_test(test_concurrent_lookups_from_many_threads_share_one_fetch),
        cmocka_unit_test(test_failed_fetch_is_cached_briefly),
        cmocka_unit_test(test_keys_of_another_server_do_not_answer),
        cmocka_unit_test(test_hook_that_cannot_start_fails_the_waiters),
        cmocka_unit_test(test_expired_validity_makes_a_refetch),
        cmocka_unit_test(test_unknown_key_id_does_not_hammer_the_origin),
        cmocka_unit_test(test_waiters_and_memory_are_bounded),
        cmocka_unit_test(test_stop_answers_every_waiter),
        cmocka_unit_test(test_notary_query_parse),
        cmocka_unit_test(test_notary_serves_cached_documents_signed_by_us),
        cmocka_unit_test(test_keys_survive_in_postgresql_across_rings),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
