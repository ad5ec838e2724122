/*
 * plugins/media/remote_claim.c - one fetch per remote file across the processes that
 * share one database and one media store (the mechanism is cluster.c's claims and
 * wake-ups; docs/architecture.md, "More than one process").
 *
 * Inside a process, remote.c already joins every request for a remote file to one fetch
 * job. Across processes, the job's first start claims the file's key ("fetch:<origin>/
 * <media ID>[/<size>]", a media_claims row) before asking the origin:
 *   - taken: this process fetches; when the job ends, the claim is deleted - or, for a
 *     result the negative cache remembers (a 404, a file too large, an unreachable
 *     origin), kept with that result for as long - and the key is published on "fetch";
 *   - taken, but the copy is in the cache already (another process stored it between our
 *     miss and our claim): nothing is fetched, the claim is given back, and the requests
 *     read that copy;
 *   - held by another process: the job ends with REMOTE_ELSEWHERE; each of its requests
 *     parks (no thread, its fetch budget slot kept) until the other process's
 *     notification, or REMOTE_RECHECK_LIVE_MS (REMOTE_RECHECK_MS while notifications may
 *     be missed), then looks at the cache again - a copy written by the other process is
 *     read from the shared store - and on a miss joins a fetch again, whose claim is
 *     then free unless the other process still fetches;
 *   - ended elsewhere with a remembered failure: that answer, as if fetched here.
 * A claim lapses after remote_fetch_timeout_ms plus REMOTE_CLAIM_MARGIN_MS (the holder
 * died); requests elsewhere meanwhile wait within their own deadlines.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "media.h"
#include "s3.h"

#define REMOTE_CLAIM_PREFIX "fetch:"
#define REMOTE_CLAIM_KEY_MAX (MEDIA_SERVER_NAME_MAX_CHARS + MEDIA_ID_MAX_CHARS + 64)
#define REMOTE_CLAIM_MARGIN_MS 10000 /* after the transfer: fsync, probe, the row */
#define REMOTE_RECHECK_LIVE_MS 2000
#define REMOTE_RECHECK_MS 250

/* Is there a cached copy (original, or the origin's thumbnail of thumb) whose file
 * exists, here or in the bucket? A database failure says no (the fetch goes on, as in
 * one process). */
static bool copy_exists(media *m, const char *origin, const char *media_id,
                        const media_size *thumb)
{
    const atrium_host *h = m->h;
    PGconn *c = h->db_acquire(MEDIA_DB_WAIT_MS);
    if (!c) return false;
    media_row row;
    int rc = thumb ? media_db_remote_thumb_get(h, m->self, c, origin, media_id, thumb, &row)
                   : media_db_remote_get(h, m->self, c, origin, media_id, &row);
    h->db_release(c);
    char path[MEDIA_PATH_MAX];
    /* storage: s3 - a copy in the bucket counts (each process reads it through). */
    return rc == MEDIA_DB_OK && store_row_path(m, &row, path, sizeof(path)) == 0 &&
           (access(path, F_OK) == 0 || remote_s3_in_bucket(m, &row));
}

int remote_claim_take(media *m, const char *key, const char *origin, const char *media_id,
                      const media_size *thumb, int *result)
{
    char claim[REMOTE_CLAIM_KEY_MAX];
    snprintf(claim, sizeof(claim), REMOTE_CLAIM_PREFIX "%s", key);
    int64_t left_ms = -1;
    int who = cluster_claim(m, claim, m->cfg.remote_fetch_timeout_ms + REMOTE_CLAIM_MARGIN_MS,
                            result, &left_ms);
    if (who == CLAIM_HELD) return REMOTE_CLAIM_HELD;
    if (who == CLAIM_RESULT) return REMOTE_CLAIM_RESULT;
    if (!copy_exists(m, origin, media_id, thumb)) return REMOTE_CLAIM_MINE;
    cluster_claim_end(m, MEDIA_CH_FETCH, claim, key, 0, 0);
    return REMOTE_CLAIM_LANDED;
}

void remote_claim_end(media *m, const char *key, int result, int64_t remember_ms)
{
    char claim[REMOTE_CLAIM_KEY_MAX];
    snprintf(claim, sizeof(claim), REMOTE_CLAIM_PREFIX "%s", key);
    cluster_claim_end(m, MEDIA_CH_FETCH, claim, key, result, remember_ms);
}

int remote_claim_wait(media *m, atrium_req *req, media_req *st, const char *key)
{
    const atrium_host *h = m->h;
    int64_t now = h->now_ms();
    int64_t until = now + (cluster_live(m) ? REMOTE_RECHECK_LIVE_MS : REMOTE_RECHECK_MS);
    if (until > st->remote_deadline_ms) until = st->remote_deadline_ms;
    int rc = media_park_unless_woken(m, req, key, st->wake_gen, until);
    if (rc == ATRIUM_PARKED) return ATRIUM_PARKED;
    if (rc == PARK_WOKEN) return MEDIA_GO; /* it ended meanwhile: look at the cache now */
    h->respond_error(req, 503, "M_UNKNOWN", "The server is stopping");
    return ATRIUM_DONE;
}
