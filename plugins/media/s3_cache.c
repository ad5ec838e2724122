/*
 * plugins/media/s3_cache.c - storage: s3: the local folder's originals as a byte-bounded
 * cache of the bucket (plugins.media.local_cache_max_bytes; 0 = no bound). Decisions:
 * docs/adr/0011-media-on-an-object-store.md, "The local cache's bound".
 *
 * Decisions owned here:
 *   - recency is the file's mtime. A use (a download's hit, a render's source) sets it to
 *     now with utimensat when it is older than S3_CACHE_TOUCH_EVERY_MS: one metadata write
 *     per hot file per interval at most, no memory per file, and it survives a restart
 *     (atime is not used: relatime makes it coarse, noatime absent);
 *   - eviction runs on the plugin's "cache" pool (one worker), never on a request thread:
 *     a pass walks local/, counts its bytes and keeps the S3_CACHE_EVICT_BATCH oldest
 *     originals older than S3_CACHE_MIN_AGE_MS; past the bound it removes them, oldest
 *     first, until the folder is at most S3_CACHE_LOW_WATER_PCT % of the bound, and walks
 *     again (at most S3_CACHE_PASS_ROUNDS times) while over. A pass is queued when an
 *     original lands past the bound, and by a check on the plugin's timer every
 *     S3_CACHE_CHECK_MS (so a folder over the bound only with young files is looked at
 *     again once they are old enough);
 *   - only what is safely in the bucket goes: before a file is removed its object is
 *     HEADed, and a missing object or another size keeps the file (counted in
 *     atrium_media_store_cache_local_only, logged). An upload's file has no object until
 *     its PUT succeeded, so it is never evicted before; a store that fails a HEAD ends the
 *     pass (looked at again after S3_CACHE_RETRY_MS);
 *   - no reader is torn, and none misses a file it was told is there: a use's utimensat
 *     and an eviction's last look (same inode, same mtime and ctime) plus unlink run under
 *     one mutex. Either the eviction unlinked first, and the use's utimensat fails (a miss:
 *     read through), or the use touched first, and the eviction sees the new mtime and
 *     keeps the file; a touched file is then not old enough for S3_CACHE_MIN_AGE_MS, far
 *     longer than a request takes from its hit to open(2). A file already open is read to
 *     its end through its descriptor; the open-file cache (fdcache.c) is told at once,
 *     and drops a descriptor of an unlinked file anyway, so a file read through again
 *     under the same name is opened afresh.
 * The bound is per process: processes sharing one local folder each evict from it (the
 * mutex above is per process). Thumbnails and remote copies are not counted here.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "media.h"
#include "s3.h"

#define S3_CACHE_TOUCH_EVERY_MS 1000 /* a use moves a file's mtime at most this often */
#define S3_CACHE_MIN_AGE_MS 5000     /* a file used (or written) this recently stays */
#define S3_CACHE_EVICT_BATCH 256     /* victims one walk picks */
#define S3_CACHE_PASS_ROUNDS 16      /* walks one pass makes while over the bound */
#define S3_CACHE_LOW_WATER_PCT 90    /* a pass brings the folder down to this % of the bound */
#define S3_CACHE_CHECK_MS 1000       /* the timer's look at the count */
#define S3_CACHE_RETRY_MS 60000      /* after a pass the store failed */
#define S3_CACHE_POOL_QUEUE 4
#define S3_CACHE_KEY_MAX (MEDIA_ID_MAX_CHARS + 16)

typedef struct victim {
    int64_t mtime_ns, ctime_ns, size;
    ino_t ino;
    char id[MEDIA_ID_MAX_CHARS + 1];
} victim;

struct s3_cache {
    pthread_mutex_t mu; /* a use's touch vs an eviction's last look and unlink */
    atomic_llong bytes; /* the local originals: the last walk plus what landed since */
    atomic_bool queued; /* a pass is queued or running */
    atomic_llong next_pass_ms; /* monotonic: the timer queues no pass before this */
    atrium_pool *pool;
    victim *victims; /* S3_CACHE_EVICT_BATCH, the pass's (one worker) */
    char local_only_example[MEDIA_ID_MAX_CHARS + 1]; /* the pass's, for its log line */
    atrium_metric *m_bytes, *m_evictions, *m_evicted_bytes, *m_local_only;
};

static int64_t ns_of(struct timespec ts)
{
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int64_t wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ns_of(ts);
}

int s3_cache_init(media *m)
{
    if (!s3_enabled(m)) return 0;
    const atrium_host *h = m->h;
    s3_cache *c = calloc(1, sizeof(*c));
    if (!c) return ATRIUM_E_NOMEM;
    c->victims = calloc(S3_CACHE_EVICT_BATCH, sizeof(*c->victims));
    c->pool = h->pool_create(m->self, "cache", 1, S3_CACHE_POOL_QUEUE);
    c->m_bytes = h->metric_gauge(m->self, "atrium_media_store_cache_bytes", NULL,
                                 "Bytes of originals in the local folder (the bucket's cache)");
    c->m_evictions = h->metric_counter(m->self, "atrium_media_store_cache_evictions_total", NULL,
                                       "Originals removed from the local folder past "
                                       "local_cache_max_bytes (they stay in the bucket)");
    c->m_evicted_bytes = h->metric_counter(m->self, "atrium_media_store_cache_evicted_bytes_total",
                                           NULL, "Bytes of the originals evicted");
    c->m_local_only = h->metric_gauge(m->self, "atrium_media_store_cache_local_only", NULL,
                                      "Originals the last eviction pass found only in the local "
                                      "folder (not in the bucket): never evicted");
    if (!c->victims || !c->pool || !c->m_bytes || !c->m_evictions || !c->m_evicted_bytes ||
        !c->m_local_only) {
        free(c->victims);
        free(c);
        return ATRIUM_E_NOMEM;
    }
    pthread_mutex_init(&c->mu, NULL);
    m->lcache = c;
    return 0;
}

void s3_cache_fini(media *m)
{
    s3_cache *c = m->lcache;
    if (!c) return;
    pthread_mutex_destroy(&c->mu);
    free(c->victims);
    free(c);
    m->lcache = NULL;
}

bool s3_cache_touch(media *m, const char *path)
{
    s3_cache *c = m->lcache;
    struct stat st;
    if (stat(path, &st) < 0) return false;
    if (!c || wall_ns() - ns_of(st.st_mtim) < S3_CACHE_TOUCH_EVERY_MS * 1000000LL) return true;
    pthread_mutex_lock(&c->mu);
    bool here = utimensat(AT_FDCWD, path, NULL, 0) == 0 || errno != ENOENT;
    pthread_mutex_unlock(&c->mu);
    return here;
}

static void pass_task(void *arg, bool cancelled);

/* Queue a pass unless one is queued or running. */
static void kick(media *m)
{
    s3_cache *c = m->lcache;
    if (atomic_exchange(&c->queued, true)) return;
    if (m->h->pool_submit(c->pool, pass_task, m) < 0) atomic_store(&c->queued, false);
}

static bool over_bound(const media *m)
{
    return m->cfg.local_cache_max_bytes > 0 &&
           atomic_load(&m->lcache->bytes) > m->cfg.local_cache_max_bytes;
}

/* Queue a pass when over the bound, unless the last one said to wait (young files only,
 * or a failing store). */
static void maybe_kick(media *m)
{
    if (over_bound(m) && m->h->now_ms() >= atomic_load(&m->lcache->next_pass_ms)) kick(m);
}

bool s3_original_cached(media *m, const char *path)
{
    bool hit = s3_cache_touch(m, path);
    s3_count_cache(m, hit);
    return hit;
}

int s3_fetch_original(media *m, const char *media_id, const char *path)
{
    if (s3_cache_touch(m, path)) return S3_OK; /* another fetch landed it meanwhile */
    char key[S3_KEY_MAX];
    if (s3_original_key(media_id, key, sizeof(key)) < 0) return S3_FAILED;
    int rc = s3_get_file(m, key, path);
    if (rc == S3_NOT_FOUND)
        m->h->log(m->self, ATRIUM_LOG_ERROR,
                  "object store: original %s has a row but no object %s: run "
                  "atrium verify-media",
                  media_id, key);
    struct stat st;
    if (rc == S3_OK && stat(path, &st) == 0) s3_cache_added(m, (int64_t)st.st_size);
    return rc;
}

void s3_cache_added(media *m, int64_t bytes)
{
    s3_cache *c = m->lcache;
    if (!c) return;
    int64_t now = atomic_fetch_add(&c->bytes, bytes) + bytes;
    m->h->metric_set(c->m_bytes, now);
    maybe_kick(m);
}

/* ---- a pass ------------------------------------------------------------------------------ */

typedef struct walk {
    int64_t bytes;
    size_t n;              /* victims kept */
    size_t newest;         /* index of the newest kept (replaced by an older one) */
    int64_t young_until_ns; /* the earliest time a file too young now becomes old enough */
    int64_t now_ns;
} walk;

/* Keep the original id (st) among the oldest S3_CACHE_EVICT_BATCH. */
static void consider(s3_cache *c, walk *w, const char *id, const struct stat *st)
{
    int64_t mt = ns_of(st->st_mtim);
    if (w->now_ns - mt < S3_CACHE_MIN_AGE_MS * 1000000LL) {
        int64_t ready = mt + S3_CACHE_MIN_AGE_MS * 1000000LL;
        if (!w->young_until_ns || ready < w->young_until_ns) w->young_until_ns = ready;
        return;
    }
    victim *v;
    if (w->n < S3_CACHE_EVICT_BATCH) {
        v = &c->victims[w->n++];
    } else {
        if (mt >= c->victims[w->newest].mtime_ns) return;
        v = &c->victims[w->newest];
    }
    v->mtime_ns = mt;
    v->ctime_ns = ns_of(st->st_ctim);
    v->size = (int64_t)st->st_size;
    v->ino = st->st_ino;
    snprintf(v->id, sizeof(v->id), "%s", id);
    if (w->n == S3_CACHE_EVICT_BATCH) { /* the newest kept is the next to replace */
        w->newest = 0;
        for (size_t i = 1; i < w->n; i++)
            if (c->victims[i].mtime_ns > c->victims[w->newest].mtime_ns) w->newest = i;
    }
}

/* Walk local/<aa>/<bb>/<media ID>: count, and pick the oldest. depth 0 is local/. */
static void walk_dir(media *m, walk *w, const char *dir, int depth)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[MEDIA_PATH_MAX];
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue; /* ".", "..", and ".tmp-" files being written */
        if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, e->d_name) >= sizeof(path))
            continue;
        struct stat st;
        if (lstat(path, &st) < 0) continue;
        if (depth < 2 && S_ISDIR(st.st_mode)) {
            walk_dir(m, w, path, depth + 1);
        } else if (depth == 2 && S_ISREG(st.st_mode) && media_id_valid(e->d_name)) {
            w->bytes += (int64_t)st.st_size;
            consider(m->lcache, w, e->d_name, &st);
        }
    }
    closedir(d);
}

static int by_age(const void *a, const void *b)
{
    int64_t x = ((const victim *)a)->mtime_ns, y = ((const victim *)b)->mtime_ns;
    return x < y ? -1 : x > y;
}

/* The file is still the one the walk saw, unused since: unlink it (under mu). */
static bool unlink_unchanged(s3_cache *c, const char *path, const victim *v)
{
    struct stat st;
    bool gone = false;
    pthread_mutex_lock(&c->mu);
    if (stat(path, &st) == 0 && st.st_ino == v->ino && ns_of(st.st_mtim) == v->mtime_ns &&
        ns_of(st.st_ctim) == v->ctime_ns)
        gone = unlink(path) == 0;
    pthread_mutex_unlock(&c->mu);
    return gone;
}

enum evict_end { EVICT_DONE = 0, EVICT_STORE_FAILED = 1 };

/* Remove the walk's victims, oldest first, while the folder is over target. */
static int evict(media *m, walk *w, int64_t target, int64_t *removed, int64_t *local_only)
{
    s3_cache *c = m->lcache;
    qsort(c->victims, w->n, sizeof(victim), by_age);
    char key[S3_CACHE_KEY_MAX], path[MEDIA_PATH_MAX];
    for (size_t i = 0; i < w->n && w->bytes > target; i++) {
        const victim *v = &c->victims[i];
        if (s3_original_key(v->id, key, sizeof(key)) < 0 ||
            store_original_path(m, v->id, path, sizeof(path)) < 0)
            continue;
        int64_t size = -1;
        int rc = s3_head_object(m, key, &size);
        if (rc == S3_FAILED) return EVICT_STORE_FAILED;
        if (rc == S3_NOT_FOUND || size != v->size) {
            if ((*local_only)++ == 0)
                snprintf(c->local_only_example, sizeof(c->local_only_example), "%s", v->id);
            continue;
        }
        if (!unlink_unchanged(c, path, v)) continue; /* used, replaced or gone meanwhile */
        fdcache_forget(m, path);
        w->bytes -= v->size;
        (*removed)++;
        m->h->metric_add(c->m_evictions, 1);
        m->h->metric_add(c->m_evicted_bytes, v->size);
    }
    return EVICT_DONE;
}

static void pass_task(void *arg, bool cancelled)
{
    media *m = arg;
    s3_cache *c = m->lcache;
    if (cancelled) {
        atomic_store(&c->queued, false);
        return;
    }
    const int64_t bound = m->cfg.local_cache_max_bytes;
    const int64_t target = bound / 100 * S3_CACHE_LOW_WATER_PCT;
    char dir[MEDIA_PATH_MAX];
    snprintf(dir, sizeof(dir), "%s/local", m->cfg.store_path);
    int64_t removed = 0, local_only = 0, removed_bytes = 0, next_ms = 0;
    walk w = {0};
    for (int round = 0; round < S3_CACHE_PASS_ROUNDS; round++) {
        int64_t before = atomic_load(&c->bytes);
        w = (walk){.now_ns = wall_ns()};
        walk_dir(m, &w, dir, 0);
        /* What landed during the walk may be counted twice: the next walk corrects it. */
        atomic_fetch_add(&c->bytes, w.bytes - before);
        if (bound <= 0 || w.bytes <= bound) break;
        local_only = 0;
        int64_t had = w.bytes, n = 0;
        int end = evict(m, &w, target, &n, &local_only);
        atomic_fetch_sub(&c->bytes, had - w.bytes);
        removed += n;
        removed_bytes += had - w.bytes;
        if (end == EVICT_STORE_FAILED) {
            next_ms = m->h->now_ms() + S3_CACHE_RETRY_MS;
            break;
        }
        if (n == 0 || w.bytes <= target) {
            /* Over only with files too young (or kept): look again once they are old. */
            if (w.bytes > bound && w.young_until_ns)
                next_ms = m->h->now_ms() + (w.young_until_ns - w.now_ns) / 1000000 + 1;
            else if (w.bytes > bound)
                next_ms = m->h->now_ms() + S3_CACHE_RETRY_MS;
            break;
        }
    }
    m->h->metric_set(c->m_bytes, atomic_load(&c->bytes));
    m->h->metric_set(c->m_local_only, local_only);
    if (local_only > 0)
        m->h->log(m->self, ATRIUM_LOG_WARN,
                  "local cache: %" PRId64 " original(s) among the least recently used (e.g. "
                  "%s) are not in the bucket with the same size: they are kept, never evicted "
                  "(check them with atrium-media-verify)",
                  local_only, c->local_only_example);
    if (removed > 0)
        m->h->log(m->self, ATRIUM_LOG_INFO,
                  "local cache over local_cache_max_bytes (%" PRId64 "): %" PRId64
                  " least recently used original(s), %" PRId64 " bytes, evicted; %" PRId64
                  " bytes remain",
                  bound, removed, removed_bytes, w.bytes);
    atomic_store(&c->next_pass_ms, next_ms);
    atomic_store(&c->queued, false);
}

/* The timer's look: queue a pass when over the bound and none is due later. */
static void check(void *arg)
{
    media *m = arg;
    maybe_kick(m);
    media_timer_add(m->timer, m->h->now_ms() + S3_CACHE_CHECK_MS, check, m);
}

int s3_cache_start(media *m)
{
    if (!m->lcache) return 0;
    kick(m); /* the first count */
    if (!m->timer || m->cfg.local_cache_max_bytes <= 0) return 0;
    return media_timer_add(m->timer, m->h->now_ms() + S3_CACHE_CHECK_MS, check, m);
}
