/*
 * core/federation/transport/fed_call.c - a federation request or signature check, waited for on a
 * pool thread (fed_call.h says which threads may): submit, then sleep on a condition
 * variable until the callback. The callback only copies the answer and signals, as the
 * outbound client's callbacks must be quick. Every wait goes through waiter_wait, the one
 * place where the caller's pooled connection is given back for the wait and borrowed
 * again after it.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core/federation/transport/fed_call.h"
#include "core/federation/transport/federation.h"
#include "core/rooms/room_auth.h"
#include "core/store/db.h"

typedef struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    fed_call_result *out;
    int verify_rc;
} waiter;

static void waiter_init(waiter *w, fed_call_result *out)
{
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->done = false;
    w->out = out;
}

static void waiter_signal(waiter *w)
{
    pthread_mutex_lock(&w->mu);
    w->done = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Wait for w's callback. Unless it came already (a key in memory, a refusal at submit),
 * the caller's connection (hold) is not pinned meanwhile: it goes back to the pool before
 * the wait and is borrowed again after it. */
static void waiter_wait(waiter *w, fed_call_hold *hold)
{
    pthread_mutex_lock(&w->mu);
    bool give_back = !w->done && hold && hold->c && *hold->c;
    pthread_mutex_unlock(&w->mu);
    if (give_back) {
        PGTransactionStatusType ts = PQtransactionStatus(*hold->c);
        RT_ASSERT(ts == PQTRANS_IDLE || ts == PQTRANS_UNKNOWN,
                  "fed_call: a connection inside a transaction (libpq status %d) would go back "
                  "to the pool while another server is waited for", (int)ts);
        db_release(db_global(), *hold->c);
        *hold->c = NULL;
        hold->given_back = true;
    }
    pthread_mutex_lock(&w->mu);
    while (!w->done) pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    if (give_back && !(*hold->c = db_acquire(db_global(), DB_WAIT_CONFIGURED)))
        rt_log(ATRIUM_LOG_WARN, "federation", "no database connection was free again after "
               "waiting for another server; what needed it is retried later");
}

static void call_done(void *arg, const fed_response *res)
{
    waiter *w = arg;
    w->out->outcome = res->outcome;
    w->out->status = res->status;
    w->out->json = res->json ? json_deep_copy(res->json) : NULL;
    snprintf(w->out->error, sizeof(w->out->error), "%s", res->error ? res->error : "");
    waiter_signal(w);
}

bool fed_call(const fed_request_opts *o, fed_call_hold *hold, fed_call_result *out)
{
    memset(out, 0, sizeof(*out));
    waiter w;
    waiter_init(&w, out);
    fed_request_opts copy = *o;
    copy.want_json = true;
    copy.on_done = call_done;
    copy.arg = &w;
    int rc = fed_request_submit(&copy);
    if (rc < 0) {
        snprintf(out->error, sizeof(out->error), "the outbound client refused the request (%d)", rc);
        out->outcome = FED_HTTP_E_INTERNAL;
        w.done = true;
        waiter_wait(&w, NULL);
        return false;
    }
    waiter_wait(&w, hold);
    return true;
}

bool fed_call_ok(const fed_call_result *res)
{
    return res->outcome == FED_HTTP_OK && res->status == 200 && json_is_object(res->json);
}

void fed_call_result_clear(fed_call_result *res)
{
    json_decref(res->json);
    res->json = NULL;
}

static void verify_done(void *arg, int result, const char *why)
{
    waiter *w = arg;
    w->verify_rc = result;
    snprintf(w->out->error, sizeof(w->out->error), "%s", why ? why : "");
    waiter_signal(w);
}

int fed_call_verify(const json_t *obj, const char *server_name, int64_t valid_at_ms,
                    fed_call_hold *hold, char why[FED_CALL_ERROR_BYTES])
{
    fed_call_result out = {0};
    waiter w;
    waiter_init(&w, &out);
    w.verify_rc = 0;
    int rc = federation_verify_json(obj, server_name, valid_at_ms, verify_done, &w);
    if (rc < 0) {
        w.done = true;
        waiter_wait(&w, NULL);
        snprintf(why, FED_CALL_ERROR_BYTES, "the signature could not be checked (%d)", rc);
        return rc;
    }
    waiter_wait(&w, hold);
    snprintf(why, FED_CALL_ERROR_BYTES, "%s", out.error);
    return w.verify_rc;
}

int fed_call_verify_event(const room_version *v, const json_t *pdu, fed_call_hold *hold,
                          char why[FED_CALL_ERROR_BYTES])
{
    json_t *signers = event_required_signers(v, pdu);
    if (!signers) {
        snprintf(why, FED_CALL_ERROR_BYTES, "the event has no sender");
        return ATRIUM_E_INVAL;
    }
    json_t *red = event_redact(v, pdu);
    if (!red) {
        json_decref(signers);
        return ATRIUM_E_NOMEM;
    }
    /* v5+: the key must be valid when the event says it was sent; before, any time. */
    int64_t ts = json_integer_value(json_object_get(pdu, "origin_server_ts"));
    int64_t valid_at = v->key_validity_enforced && ts > 0 ? ts : 0;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < json_array_size(signers); i++) {
        const char *server = json_string_value(json_array_get(signers, i));
        char inner[FED_CALL_ERROR_BYTES];
        rc = fed_call_verify(red, server, valid_at, hold, inner);
        if (rc < 0) snprintf(why, FED_CALL_ERROR_BYTES, "not signed by %.100s: %.120s", server, inner);
    }
    json_decref(red);
    json_decref(signers);
    return rc;
}
