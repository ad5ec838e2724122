/*
 * plugins/media/remote_stream.c - requests following a remote file as it is written: the
 * landing a fetch opens once it has bytes to release, and the chunked answers that read
 * it (docs/adr/0005-remote-media-fetch-pool.md, "Waiters follow the bytes as they arrive").
 *
 * Waiters of an original that may stream (a plain GET of the whole file) join its flight
 * with ATRIUM_FLIGHT_EARLY; the landing is the flight's early result (REMOTE_STREAMING,
 * host->flight_publish), which wakes them as soon as it has bytes to release, and they
 * answer 200 at once with a
 * chunked body that follows the temporary file (host->respond_stream_wait): each read
 * returns what has been written, or WAIT; the writer signals the landing's event per
 * STREAM_SIGNAL_STEP_BYTES. The last STREAM_TAIL_HOLD_BYTES are released only once the
 * file is stored and its hash is not quarantined; a fetch that fails (cut off, too large,
 * garbage) or a quarantined hash ends every follower's body without its last chunk, so a
 * client can tell, and the cache keeps nothing. Requests that come while it streams follow
 * it too (a join with ATRIUM_FLIGHT_EARLY_ONLY, which never parks), without a fetch budget
 * slot; a follower gives its slot back when it starts. A fetch that starts over (never
 * expected once bytes flowed) withdraws its landing and opens no second one: its waiters
 * then wait for the end.
 * Requests waiting in another process do not follow: they read the stored copy.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "remote.h"

/* Streams to waiters: the last bytes are held back until the file is stored and its hash
 * checked against the quarantine, so no client gets a whole file that fails either; and a
 * wake-up is sent per this many new bytes (and at the end), not per write. */
#define STREAM_TAIL_HOLD_BYTES (64 * 1024)
#define STREAM_SIGNAL_STEP_BYTES (64 * 1024)
/* A stream may wait this long past its fetch's own deadline (the commit's fsync and row). */
#define STREAM_COMMIT_SLACK_MS 10000

static remote_landing *landing_ref(remote_landing *l)
{
    atomic_fetch_add(&l->refs, 1);
    return l;
}

static void landing_unref(remote_landing *l)
{
    if (!l || atomic_fetch_sub(&l->refs, 1) != 1) return;
    close(l->fd);
    free(l);
}

static void landing_free_arg(void *arg)
{
    landing_unref(arg);
}

/* [outbound thread] An original has bytes to release (more than the held tail landed):
 * its landing, published as the flight's early result, which wakes the waiters that may
 * follow it. So a small file, or a fetch that fails early, is answered with its exact code
 * as before; once a follower got its 200, a failure can only cut its body. Without memory
 * or a descriptor there is no landing: everyone waits for the end. */
static void landing_open(remote_job *j)
{
    media *m = j->m;
    if (!m->can_stream || j->thumb || j->published) return;
    remote_landing *l = calloc(1, sizeof(*l));
    if (!l) return;
    l->fd = fcntl(j->tmp.fd, F_DUPFD_CLOEXEC, 0);
    if (l->fd < 0) {
        free(l);
        return;
    }
    atomic_init(&l->refs, 1);
    atomic_init(&l->readable, 0);
    atomic_init(&l->state, LANDING_RUNNING);
    l->ev = m->stream_events[media_bucket(j->key)];
    l->deadline_ms = j->transfer_deadline_ms + STREAM_COMMIT_SLACK_MS;
    remote_job_meta(j, l->content_type, sizeof(l->content_type), l->upload_name,
                    sizeof(l->upload_name));
    pthread_mutex_lock(&m->remote->mu);
    j->landing = l;
    pthread_mutex_unlock(&m->remote->mu);
    j->published = true;
    /* The flight keeps a reference for whoever reads it, the job its own for writing. */
    if (m->h->flight_publish(j->flight, REMOTE_STREAMING, landing_ref(l), landing_free_arg) < 0)
        landing_unref(l);
}

/* [outbound thread] Bytes were written: release them to the followers (all but the held
 * tail), signalling per step. */
void remote_landing_advance(remote_job *j)
{
    int64_t readable = j->bytes - STREAM_TAIL_HOLD_BYTES;
    if (readable <= 0) return;
    if (!j->landing) landing_open(j); /* the first bytes to release: waiters may follow */
    remote_landing *l = j->landing;
    if (!l) return;
    atomic_store(&l->readable, readable);
    if (l->signalled == 0 || readable - l->signalled >= STREAM_SIGNAL_STEP_BYTES) {
        l->signalled = readable;
        j->m->h->event_signal(l->ev);
    }
}

/* The fetch ended (or starts over): the followers get the rest (stored) or are cut. */
void remote_landing_end(remote_job *j, bool stored)
{
    remote_table *t = j->m->remote;
    pthread_mutex_lock(&t->mu);
    remote_landing *l = j->landing;
    j->landing = NULL;
    pthread_mutex_unlock(&t->mu);
    if (!l) return;
    j->m->h->flight_unpublish(j->flight); /* no new followers */
    if (stored) atomic_store(&l->readable, j->bytes);
    atomic_store(&l->state, stored ? LANDING_DONE : LANDING_FAILED);
    j->m->h->event_signal(l->ev);
    landing_unref(l);
}

/* A follower's read (atrium_stream_read, on its request-pool thread): never blocks. */
static int64_t landing_read(void *arg, uint64_t pos, char *buf, size_t max)
{
    remote_landing *l = arg;
    int state = atomic_load(&l->state);
    /* readable is read after state: a landing marked done has published all its bytes. */
    return delivery_landing_read(l->fd, atomic_load(&l->readable), state == LANDING_DONE,
                                 state == LANDING_FAILED, pos, buf, max);
}

static void landing_hold_release(void *arg)
{
    media_req *st = arg;
    landing_unref(st->landing);
    st->landing = NULL;
}

/* The request follows the published landing (a reference of its own): MEDIA_GO with
 * st->row describing the file as far as it is known, for download.c to answer with
 * remote_respond_stream. */
int remote_follow_landing(media *m, atrium_req *req, media_req *st, void *value)
{
    remote_landing *l = landing_ref(value);
    st->landing = l;
    /* A hold, so the reference goes with the request whatever it answers. */
    if (m->h->req_hold(req, landing_hold_release, st) < 0 || !st->landing) {
        m->h->respond_error(req, 503, "M_UNKNOWN", "The request ended");
        return ATRIUM_DONE;
    }
    memset(&st->row, 0, sizeof(st->row));
    snprintf(st->row.content_type, sizeof(st->row.content_type), "%s", l->content_type);
    snprintf(st->row.upload_name, sizeof(st->row.upload_name), "%s", l->upload_name);
    st->have_row = true;
    return MEDIA_GO;
}

int remote_respond_stream(media *m, atrium_req *req, media_req *st, const char *type,
                          const char *disposition)
{
    const atrium_host *h = m->h;
    remote_landing *l = st->landing;
    st->landing = NULL; /* the response owns the reference from here */
    fetch_budget_leave(m, st); /* no fetch of its own: the slot is for others */
    int rc = h->respond_stream_wait(req, 200, type, -1, landing_read, l, landing_free_arg, l->ev,
                                    l->deadline_ms);
    if (rc < 0) return rc;
    delivery_success_headers(m, req, NULL); /* no ETag: the hash is not known yet */
    h->respond_header(req, "Content-Disposition", disposition);
    h->metric_add(m->m_fetch_streamed, 1);
    return ATRIUM_DONE;
}

