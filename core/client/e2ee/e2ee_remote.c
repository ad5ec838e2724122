/*
 * core/client/e2ee/e2ee_remote.c - asking other servers on a client's behalf: keys/query and
 * keys/claim for users of other servers fan out to each of those servers at once
 * (/_matrix/federation/v1/user/keys/query, .../claim), and the request waits parked
 * (susp_wait) until every server answered or its timeout passed, holding no thread.
 *
 * One fan-out per request, in r->core_state: a callback per server (on the federation
 * client's thread) stores that server's answer under the fan-out's lock; the last one to
 * come wakes the request (the wake is owed exactly once, even after the deadline already
 * resumed it). The handler's next run closes the fan-out, so a later answer is dropped,
 * and reads what came: answers by server, and a `failures` entry per server that could not
 * be asked, refused, or did not answer in time (status 504 then), as the spec's
 * keys/query and keys/claim describe. The state is freed with the request (its last
 * reference goes after the last callback's wake).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/e2ee/e2ee.h"
#include "core/federation/transport/fed_request.h"

#define E2EE_REMOTE_DEFAULT_TIMEOUT_MS 10000 /* the spec's default for keys/query, claim */
#define E2EE_REMOTE_MAX_TIMEOUT_MS 60000
#define E2EE_REMOTE_MAX_SERVERS 100 /* servers asked per request; the rest are failures */
#define E2EE_REMOTE_MAX_BODY_BYTES (4 * 1024 * 1024)

typedef struct fanout_dest {
    struct e2ee_fanout *f;
    char *server;
    json_t *answer; /* the server's 200 answer, owned */
    int status;     /* failure status for `failures` */
    char error[160];
    bool done;
} fanout_dest;

struct e2ee_fanout {
    pthread_mutex_t mu;
    atrium_req *r;
    int pending;
    bool closed;
    size_t n;
    fanout_dest *d;
};

static void fanout_free(void *arg)
{
    e2ee_fanout *f = arg;
    for (size_t i = 0; i < f->n; i++) {
        json_decref(f->d[i].answer);
        free(f->d[i].server);
    }
    free(f->d);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

/* One server's answer (or failure); the last one wakes the request. */
static void dest_done(fanout_dest *d, const fed_response *res, int fail_status,
                      const char *why)
{
    e2ee_fanout *f = d->f;
    pthread_mutex_lock(&f->mu);
    if (!f->closed) {
        if (res && res->outcome == FED_HTTP_OK && res->status == 200 && res->json) {
            d->answer = json_deep_copy(res->json);
        } else {
            d->status = fail_status;
            if (res && res->outcome == FED_HTTP_OK) {
                d->status = res->status;
                snprintf(d->error, sizeof(d->error), "%s answered %d", d->server, res->status);
            } else {
                snprintf(d->error, sizeof(d->error), "%s",
                         why ? why : res && res->error ? res->error : "failed");
                if (res && res->outcome == FED_HTTP_E_TIMEOUT) d->status = 504;
            }
        }
        d->done = true;
    }
    bool last = --f->pending == 0;
    atrium_req *r = f->r;
    pthread_mutex_unlock(&f->mu);
    if (last) susp_wake(r);
}

static void answered(void *arg, const fed_response *res)
{
    dest_done(arg, res, 503, NULL);
}

int e2ee_fanout_start(atrium_req *r, const char *uri, json_t *bodies, const json_t *timeout)
{
    int64_t ms = json_is_integer(timeout) ? json_integer_value(timeout)
                                          : E2EE_REMOTE_DEFAULT_TIMEOUT_MS;
    if (ms < 0) ms = 0;
    if (ms > E2EE_REMOTE_MAX_TIMEOUT_MS) ms = E2EE_REMOTE_MAX_TIMEOUT_MS;
    int64_t deadline = rt_now_ms() + ms;
    if (deadline > r->deadline_ms) deadline = r->deadline_ms;

    e2ee_fanout *f = calloc(1, sizeof(*f));
    size_t n = json_object_size(bodies);
    if (!f || !(f->d = calloc(n ? n : 1, sizeof(*f->d)))) {
        free(f);
        return ATRIUM_E_NOMEM;
    }
    pthread_mutex_init(&f->mu, NULL);
    f->r = r;
    const char *server;
    json_t *body;
    json_object_foreach(bodies, server, body) {
        if (f->n == n) break;
        fanout_dest *d = &f->d[f->n++];
        d->f = f;
        d->server = strdup(server);
        if (!d->server) {
            f->n--;
            break;
        }
    }
    f->pending = (int)f->n + 1; /* + this function, until every request is submitted */
    r->core_state = f;
    http_req_on_free(r, fanout_free, f);
    if (susp_wait(r, deadline) < 0) {
        f->closed = true;
        return ATRIUM_E_STOPPED;
    }
    for (size_t i = 0; i < f->n; i++) {
        fanout_dest *d = &f->d[i];
        fed_request_opts o = {.method = "POST",
                              .destination = d->server,
                              .uri = uri,
                              .body = json_object_get(bodies, d->server),
                              .deadline_ms = deadline,
                              .max_body_bytes = E2EE_REMOTE_MAX_BODY_BYTES,
                              .want_json = true,
                              .on_done = answered,
                              .arg = d};
        if (i >= E2EE_REMOTE_MAX_SERVERS)
            dest_done(d, NULL, 503, "too many servers in one request");
        else if (fed_request_submit(&o) < 0)
            dest_done(d, NULL, 503, "could not be asked");
    }
    pthread_mutex_lock(&f->mu);
    bool last = --f->pending == 0;
    pthread_mutex_unlock(&f->mu);
    if (last) susp_wake(r);
    return 0;
}

bool e2ee_fanout_pending(atrium_req *r)
{
    return r->core_state != NULL;
}

void e2ee_fanout_finish(atrium_req *r, json_t *answers, json_t *failures)
{
    e2ee_fanout *f = r->core_state;
    if (!f) return;
    pthread_mutex_lock(&f->mu);
    f->closed = true;
    for (size_t i = 0; i < f->n; i++) {
        fanout_dest *d = &f->d[i];
        if (d->answer) {
            json_object_set(answers, d->server, d->answer);
            continue;
        }
        bool stopping = r->run_reason == ATRIUM_RUN_SHUTDOWN;
        int status = d->done ? d->status : stopping ? 503 : 504;
        const char *why = d->done ? d->error : stopping ? "The server is stopping"
                                                        : "The server did not answer in time";
        json_object_set_new(failures, d->server,
                            json_pack("{s:i,s:s}", "status", status, "message", why));
    }
    pthread_mutex_unlock(&f->mu);
}
