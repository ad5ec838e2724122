/*
 * plugins/media/s3_upstream.c - storage: s3, an upload above the part size goes to the store
 * as a multipart upload while its body arrives
 * (docs/adr/0031-streaming-media-to-and-from-the-object-store.md).
 *
 * upload.c writes the body into a part-sized spool file (unnamed, in the original's
 * folder); each time one is full and more comes, it is pushed here and a new one begun. A
 * sender task on the store pool takes the pushed parts in order: CreateMultipartUpload
 * before the first, then an UploadPart each (one request at a time per upload, each its own
 * slot and s3_timeout_ms), closing each spool once sent, so the local disk holds the parts
 * the store has not taken yet, never the whole upload unless the store is that much slower
 * than the client (the host cannot pause a request's body). Once the body is in, the last
 * part is pushed and the io worker waits (bounded) for the sender, then sends
 * CompleteMultipartUpload; only then is the row committed and the upload acknowledged.
 * Any failure, and an upload that ends without finishing (the client gone, 413, a refused
 * chunk), aborts the multipart upload; what a crash leaves open the orphan sweep aborts
 * (s3_multipart_sweep). Like s3_multipart_put, one upload gives up (and aborts) at
 * orphan_min_age_ms / 2 after its Create, so the sweep never aborts a live one.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "media.h"
#include "s3.h"
#include "s3_call.h"

typedef struct s3_part {
    int fd;
    int64_t len;
    int number;
    struct s3_part *next;
} s3_part;

struct s3_upstream {
    media *m;
    char key[S3_KEY_MAX];
    pthread_mutex_t mu;
    pthread_cond_t cv; /* CLOCK_MONOTONIC: the sender went idle */
    s3_part *head, *tail;
    int refs;     /* the upload's, and a sender task's */
    bool running; /* a sender task is submitted or running */
    bool created, failed, cancelled, done;
    bool completed; /* Complete succeeded */
    int pushed; /* parts numbered so far */
    int64_t give_up_at_ms;
    char id_q[S3_UPLOAD_ID_MAX * 3];
    char *xml; /* the Complete body so far: a <Part> per part sent */
    size_t xml_len, xml_cap;
};

int s3_upstream_init(media *m)
{
    if (!m->s3) return 0;
    const atrium_host *h = m->h;
    m->m_up_parts_waiting = h->metric_gauge(
        m->self, "atrium_media_store_upload_parts_waiting", NULL,
        "Parts of streamed uploads spooled on the local disk, not yet taken by the store");
    const char *help = "Uploads streamed to the store in parts, by how they ended (completed: "
                       "CompleteMultipartUpload succeeded; aborted: failed or abandoned)";
    m->m_up_completed = h->metric_counter(m->self, "atrium_media_store_upload_streams_total",
                                          "outcome=\"completed\"", help);
    m->m_up_aborted = h->metric_counter(m->self, "atrium_media_store_upload_streams_total",
                                        "outcome=\"aborted\"", help);
    return m->m_up_parts_waiting && m->m_up_completed && m->m_up_aborted ? 0 : ATRIUM_E_NOMEM;
}

/* A part leaves the local disk (sent, or dropped). */
static void part_gone(media *m, s3_part *p)
{
    close(p->fd);
    free(p);
    m->h->metric_add(m->m_up_parts_waiting, -1);
}

static void upstream_free(s3_upstream *u)
{
    for (s3_part *p = u->head, *next; p; p = next) {
        next = p->next;
        part_gone(u->m, p);
    }
    pthread_cond_destroy(&u->cv);
    pthread_mutex_destroy(&u->mu);
    free(u->xml);
    free(u);
}

/* [under u->mu] One reference fewer: true when it was the last (free after the unlock). */
static bool unref_locked(s3_upstream *u)
{
    return --u->refs == 0;
}

s3_upstream *s3_upstream_start(media *m, const char *media_id)
{
    s3_upstream *u = calloc(1, sizeof(*u));
    if (!u) return NULL;
    if (s3_original_key(media_id, u->key, sizeof(u->key)) < 0 || m->h->cond_init(&u->cv) != 0) {
        free(u);
        return NULL;
    }
    pthread_mutex_init(&u->mu, NULL);
    u->m = m;
    u->refs = 1;
    return u;
}

static bool xml_add(s3_upstream *u, int number, const char *etag)
{
    if (u->xml_cap - u->xml_len < S3_PART_XML_MAX + 64) {
        size_t cap = u->xml_cap ? u->xml_cap * 2 : 4096;
        char *x = realloc(u->xml, cap);
        if (!x) return false;
        u->xml = x;
        u->xml_cap = cap;
    }
    u->xml_len += (size_t)snprintf(u->xml + u->xml_len, u->xml_cap - u->xml_len,
                                   "<Part><PartNumber>%d</PartNumber><ETag>%s</ETag></Part>",
                                   number, etag);
    return true;
}

/* [store worker] Send one part (creating the upload first). 0, or -1 (logged). */
static int send_part(s3_upstream *u, const s3_part *p, bool created)
{
    media *m = u->m;
    if (!created) {
        if (s3_mp_create(m, u->key, u->id_q, sizeof(u->id_q)) < 0) return -1;
        pthread_mutex_lock(&u->mu);
        u->created = true;
        u->give_up_at_ms = m->h->now_ms() + m->cfg.orphan_min_age_ms / 2;
        pthread_mutex_unlock(&u->mu);
    }
    if (m->h->now_ms() > u->give_up_at_ms) {
        m->h->log(m->self, ATRIUM_LOG_ERROR,
                  "object store: streamed upload of %s gave up at part %d: longer than "
                  "orphan_min_age_ms / 2",
                  u->key, p->number);
        return -1;
    }
    char etag[S3_ETAG_MAX];
    if (s3_mp_part(m, u->key, u->id_q, p->number, p->fd, 0, p->len, etag, sizeof(etag)) < 0)
        return -1;
    pthread_mutex_lock(&u->mu);
    bool ok = xml_add(u, p->number, etag);
    pthread_mutex_unlock(&u->mu);
    return ok ? 0 : -1;
}

/* [store worker] Send what was pushed, in order, until nothing is left; abort the upload
 * when it failed or was dropped. */
static void send_task(void *arg, bool cancelled)
{
    s3_upstream *u = arg;
    media *m = u->m;
    pthread_mutex_lock(&u->mu);
    if (cancelled) { /* stopping: clean up only; the orphan sweep aborts it later */
        u->failed = true;
        u->done = true;
    }
    for (;;) {
        if (u->failed || u->cancelled) {
            bool abort_it = u->created && !u->done;
            u->done = true;
            pthread_mutex_unlock(&u->mu);
            if (abort_it) s3_mp_abort(m, u->key, u->id_q);
            pthread_mutex_lock(&u->mu);
            break;
        }
        s3_part *p = u->head;
        if (!p) break;
        u->head = p->next;
        if (!u->head) u->tail = NULL;
        bool created = u->created;
        pthread_mutex_unlock(&u->mu);
        int rc = send_part(u, p, created);
        part_gone(m, p);
        pthread_mutex_lock(&u->mu);
        if (rc < 0) u->failed = true;
    }
    u->running = false;
    pthread_cond_broadcast(&u->cv);
    bool last = unref_locked(u);
    pthread_mutex_unlock(&u->mu);
    if (last) upstream_free(u);
}

/* [under u->mu] Make sure a sender runs. false when the pool refused (u->failed set). */
static bool kick_locked(s3_upstream *u)
{
    if (u->running) return true;
    u->running = true;
    u->refs++;
    if (u->m->h->pool_submit(u->m->store_pool, send_task, u) == 0) return true;
    u->running = false;
    u->refs--;
    u->failed = true;
    return false;
}

int s3_upstream_push(s3_upstream *u, int fd, int64_t len)
{
    s3_part *p = malloc(sizeof(*p));
    if (!p) {
        close(fd);
        return -1;
    }
    p->fd = fd;
    p->len = len;
    p->next = NULL;
    pthread_mutex_lock(&u->mu);
    if (u->failed || u->cancelled || u->done || u->pushed >= S3_PARTS_MAX) {
        u->failed = true;
        pthread_mutex_unlock(&u->mu);
        close(fd);
        free(p);
        return -1;
    }
    p->number = ++u->pushed;
    u->m->h->metric_add(u->m->m_up_parts_waiting, 1);
    if (u->tail)
        u->tail->next = p;
    else
        u->head = p;
    u->tail = p;
    bool ok = kick_locked(u);
    pthread_mutex_unlock(&u->mu);
    return ok ? 0 : -1;
}

int s3_upstream_finish(s3_upstream *u)
{
    media *m = u->m;
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    int64_t wait_ms = m->cfg.orphan_min_age_ms / 2 + m->cfg.s3_timeout_ms;
    until.tv_sec += wait_ms / 1000;
    pthread_mutex_lock(&u->mu);
    while (u->running) {
        if (pthread_cond_timedwait(&u->cv, &u->mu, &until) == ETIMEDOUT) {
            u->failed = true; /* the sender aborts once its part ends */
            break;
        }
    }
    bool ok = !u->failed && !u->cancelled && u->created && !u->done && !u->running;
    if (ok) u->done = true; /* from here finish alone sends Complete or Abort */
    pthread_mutex_unlock(&u->mu);
    if (!ok) {
        m->h->log(m->self, ATRIUM_LOG_ERROR, "object store: streamed upload of %s failed",
                  u->key);
        return -1;
    }
    static const char head[] = "<CompleteMultipartUpload>";
    static const char tail[] = "</CompleteMultipartUpload>";
    size_t len = strlen(head) + u->xml_len + strlen(tail);
    char *body = malloc(len + 1);
    int rc = -1;
    if (body) {
        snprintf(body, len + 1, "%s%.*s%s", head, (int)u->xml_len, u->xml ? u->xml : "", tail);
        rc = s3_mp_complete(m, u->key, u->id_q, body, len);
        free(body);
    }
    if (rc < 0) s3_mp_abort(m, u->key, u->id_q);
    pthread_mutex_lock(&u->mu);
    u->completed = rc == 0;
    pthread_mutex_unlock(&u->mu);
    return rc;
}

void s3_upstream_drop(s3_upstream *u)
{
    if (!u) return;
    pthread_mutex_lock(&u->mu);
    u->m->h->metric_add(u->completed ? u->m->m_up_completed : u->m->m_up_aborted, 1);
    u->cancelled = true;
    /* Not finished: abort what was created (a sender does it, never the caller's thread). */
    if (!u->done && !u->running && u->created) kick_locked(u);
    bool last = unref_locked(u);
    pthread_mutex_unlock(&u->mu);
    if (last) upstream_free(u);
}
