/*
 * plugins/media/remote.h - what the three files of remote media share, and nothing else
 * includes: the fetch jobs, the per-origin cap, the negative cache and landings. One fetch
 * per remote file is the host's single flight (m->remote_flights, one flight per key): the
 * job is its work, requests are its waiters, and a landing is its early result.
 *   remote.c        the request path, the remote cache look-up, the negative cache
 *   remote_fetch.c  a fetch job: its transfer, the 429 retry, the commit, the per-origin cap
 *   remote_stream.c the landing: requests following a file as it is written
 * The design is docs/adr/0005-remote-media-fetch-pool.md.
 */
#ifndef MEDIA_REMOTE_H
#define MEDIA_REMOTE_H

#include "media.h"

#define REMOTE_TABLE_BUCKETS 256 /* the negative cache's */
#define REMOTE_KEY_MAX (MEDIA_SERVER_NAME_MAX_CHARS + MEDIA_ID_MAX_CHARS + 2)
#define REMOTE_ERROR_BODY_MAX 4096 /* an error answer's body kept to read its errcode */
#define REMOTE_ORIGIN_BUCKETS 64

/* How a fetch ended. The values are kept in media_claims rows for the other processes
 * (remote_claim.c), so each is written out and none may change. */
enum remote_result {
    REMOTE_STARTED = -1, /* not an end: a transfer is under way (remote_job_begin, job_judge) */
    REMOTE_OK = 0,
    REMOTE_NOT_FOUND = 1,    /* the origin says it does not exist */
    REMOTE_UNREACHABLE = 2,  /* no answer, or an answer other than the file */
    REMOTE_BAD_ANSWER = 3,   /* garbage, truncated */
    REMOTE_TOO_LARGE = 4,    /* past max_upload_size */
    REMOTE_INTERNAL = 5,     /* our disk or database */
    REMOTE_STOPPING = 6,
    REMOTE_ABANDONED = 7,    /* nobody waited for it any more: never started */
    REMOTE_NO_THUMBNAIL = 8, /* the origin has no thumbnail for it: fetch the original */
    REMOTE_ELSEWHERE = 9,    /* another process fetches it: wait for it (remote_claim.c) */
    REMOTE_ORIGIN_BUSY = 10, /* it kept answering 429 until the deadline (never remembered) */
    REMOTE_STREAMING = 11,   /* the flight's early result: follow the landing (its value) */
};

/* PHASE_LOCATION: the URL a multipart answer's Location part named (followed once). */
enum fetch_phase { PHASE_FEDERATION = 0, PHASE_LEGACY, PHASE_LOCATION };

/* A remote file being fetched, as its followers see it: the bytes written so far (a
 * descriptor of the temporary file, read with pread) and how the fetch ended. Shared by
 * the fetch and every stream following it (refs); freed by the last. The writer (the
 * outbound client's thread) raises `readable` and signals `ev`; readers (request-pool
 * threads) never block. */
enum landing_state { LANDING_RUNNING = 0, LANDING_DONE, LANDING_FAILED };
struct remote_landing {
    atomic_int refs;
    int fd;
    atomic_int_least64_t readable; /* bytes followers may read now */
    atomic_int state;              /* enum landing_state; readable is final once DONE */
    int64_t signalled;             /* readable at the last signal (the writer's only) */
    atrium_event *ev;
    int64_t deadline_ms; /* when a follower stops waiting for bytes */
    char content_type[MEDIA_TYPE_MAX_BYTES + 1];
    char upload_name[MEDIA_NAME_MAX_BYTES + 1];
};

/* Fetches of one origin: how many run, and those waiting for the per-origin cap. */
typedef struct remote_origin {
    char origin[MEDIA_SERVER_NAME_MAX_CHARS + 1];
    int running;
    struct remote_job *pending_head, *pending_tail;
    struct remote_origin *next;
} remote_origin;

/* A remembered failure of one remote file (the negative cache). */
typedef struct remote_negative {
    char key[REMOTE_KEY_MAX];
    int result;
    int64_t until_ms;
    struct remote_negative *next;
} remote_negative;

typedef struct remote_job {
    char key[REMOTE_KEY_MAX];
    char origin[MEDIA_SERVER_NAME_MAX_CHARS + 1];
    char media_id[MEDIA_ID_MAX_CHARS + 1];
    media *m;
    bool thumb;        /* the origin's thumbnail of `size`, not the original */
    media_size size;
    atrium_flight *flight; /* the flight whose work this is: finished by remote_job_complete */
    struct remote_job *pending_next; /* in its origin's pending list */
    bool running;                    /* counted in its origin's running fetches */
    bool counted;                    /* counted in atrium_media_remote_fetches_running */
    bool claimed;                    /* under this process's claim (remote_claim.c) */
    bool elsewhere;                  /* answered by another process's fetch: not counted */

    /* the transfer: written on the outbound client's thread, read after on_done */
    int phase;
    int outcome, status;
    bool started, bad, too_large, io_error;
    mp_parser *mp;
    store_tmp tmp;
    bool tmp_open;
    sha256_ctx sha;
    int64_t bytes;
    char content_type[MP_HEADER_VALUE_MAX], disposition[MP_HEADER_VALUE_MAX];
    char err_body[REMOTE_ERROR_BODY_MAX + 1];
    size_t err_len;
    char file_rel[MEDIA_FILE_NAME_MAX], file_abs[MEDIA_PATH_MAX];
    char location[MP_HEADER_VALUE_MAX]; /* PHASE_LOCATION's URL */
    char redirect[MP_HEADER_VALUE_MAX]; /* a 3xx answer's Location header */
    int64_t transfer_deadline_ms;       /* the current transfer's */
    remote_landing *landing; /* once file bytes flow (an original): set under the lock */
    bool published;          /* its landing was the flight's early result (once per flight) */
    bool quarantined;        /* job_commit (remote_fetch.c): its hash is quarantined */
    int tries_429;           /* answers of 429 so far */
} remote_job;

struct remote_table {
    pthread_mutex_t mu;
    remote_origin *origins[REMOTE_ORIGIN_BUCKETS];
    remote_negative *negative[REMOTE_TABLE_BUCKETS];
    size_t n_negative;
    uint64_t landed; /* fetches that stored a file: a miss older than one may be stale */
};

/* ---- remote.c ----------------------------------------------------------------------- */

/* What names one upstream resource: "<origin>/<media ID>" for the original,
 * "<origin>/<media ID>/<W>x<H>-<method>[-anim]" for the origin's thumbnail of a size. */
void remote_key(const char *origin, const char *media_id, const media_size *thumb, char *out,
                size_t cap);
/* How long a result is remembered by the negative cache: 0 = not at all. */
int64_t remote_negative_ttl_ms(const media *m, int result);
/* [under the table's lock] Remember result for key, when it is one to remember. */
void remote_negative_remember(media *m, remote_table *t, const char *key, int result);

/* ---- remote_fetch.c ----------------------------------------------------------------- */

/* A new job for key, the work of flight f; NULL without memory. */
remote_job *remote_job_new(media *m, atrium_flight *f, const char *key, const char *origin,
                           const char *media_id, const media_size *thumb);
/* Free a job that never started (or has ended): its temporary file is dropped. */
void remote_job_free(remote_job *j);
/* [under the table's lock] Count a new job against its origin's cap: true when it may
 * start now, false when it was queued behind the origin's running fetches (it starts
 * when one of them ends). */
bool remote_origin_admit(media *m, remote_table *t, remote_job *j);
/* [fetch pool] The first start of a fetch, claimed across processes first. REMOTE_STARTED,
 * or the result to complete the job with. */
int remote_job_begin(remote_job *j) MEDIA_MUST_CHECK;
/* The fetch ended with result: its flight finishes (every waiter is woken), the job is
 * freed. */
void remote_job_complete(remote_job *j, int result);
/* The type and file name the answer declared for the file, made safe to store and serve. */
void remote_job_meta(const remote_job *j, char *type, size_t type_cap, char *name,
                     size_t name_cap);

/* ---- remote_stream.c ---------------------------------------------------------------- */

/* [outbound thread] Bytes were written: release them to the followers (all but the held
 * tail); the first release publishes the landing as the flight's early result, which
 * wakes the waiters that may follow. */
void remote_landing_advance(remote_job *j);
/* The fetch ended (or starts over): the followers get the rest (stored) or are cut. */
void remote_landing_end(remote_job *j, bool stored);
/* [req] The request follows the landing a flight published (value, the flight's; a
 * reference of its own is taken): MEDIA_GO with st->row describing the file as far as it
 * is known, or ATRIUM_DONE with 503. */
int remote_follow_landing(media *m, atrium_req *req, media_req *st, void *value)
    MEDIA_MUST_CHECK;

#endif
