/*
 * plugins/media/fdcache.c - the open-file cache: descriptors of the files served most
 * recently, so that a download of a hot file neither walks its path nor opens and closes
 * it for every request (nginx's open_file_cache, for media).
 *
 * Decisions owned here:
 *   - bounded: FDCACHE_SLOTS descriptors at most, in a table allocated once and looked up
 *     by path; a new file takes an empty slot or the least recently used one. The caller
 *     always gets a descriptor of its own (a duplicate of the cached one), which the
 *     response closes as before, so nothing that uses it changes;
 *   - hits run side by side: they only read the table, under the read side of a
 *     read-write lock (the duplicate is made under it, so a slot's descriptor cannot be
 *     closed and its number reused meanwhile), and store their use time atomically. The
 *     lock prefers writers, so a steady stream of hits never keeps a new file or the
 *     sweep out. (Under one mutex, the request threads queued here);
 *   - never stale: every hit is checked with fstat on the duplicate, and a file no longer
 *     linked anywhere (st_nlink 0: deleted, or replaced by a rename or a new link under
 *     its name, here or in another process) is dropped and its path opened afresh. Files
 *     in the store are written once under their final name (store.c), so a linked inode
 *     has the bytes its path names;
 *   - never holding disk space long: a slot unused for FDCACHE_IDLE_MS is closed by a
 *     sweep on the plugin's timer every FDCACHE_SWEEP_MS, and the plugin's own removals
 *     (an admin's deletion, the remote cache's eviction and purge) drop their paths at
 *     once (fdcache_forget, fdcache_forget_under);
 *   - its descriptors count against the media plugin's descriptor budget
 *     (check_descriptor_budget in media.c).
 * What it does not do: decide whether a file may be served (delivery.c), or read it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "media.h"

#define FDCACHE_IDLE_MS 10000 /* a slot unused this long is closed by the sweep */
#define FDCACHE_SWEEP_MS 5000 /* how often the sweep runs */

typedef struct fd_slot {
    int fd; /* -1: empty */
    uint64_t hash;
    int64_t used_ms; /* monotonic; stored atomically by hits under the read lock */
    char path[MEDIA_PATH_MAX];
} fd_slot;

struct fdcache {
    pthread_rwlock_t mu;
    fd_slot slots[FDCACHE_SLOTS];
};

static uint64_t path_hash(const char *path)
{
    uint64_t x = 1469598103934665603ull; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)path; *p; p++) {
        x ^= *p;
        x *= 1099511628211ull;
    }
    return x;
}

int fdcache_init(media *m)
{
    m->fds = calloc(1, sizeof(*m->fds));
    if (!m->fds) return ATRIUM_E_NOMEM;
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    int rc = pthread_rwlock_init(&m->fds->mu, &attr);
    pthread_rwlockattr_destroy(&attr);
    if (rc != 0) {
        free(m->fds);
        m->fds = NULL;
        return ATRIUM_E_NOMEM;
    }
    for (size_t i = 0; i < FDCACHE_SLOTS; i++) m->fds->slots[i].fd = -1;
    return 0;
}

void fdcache_fini(media *m)
{
    if (!m->fds) return;
    for (size_t i = 0; i < FDCACHE_SLOTS; i++)
        if (m->fds->slots[i].fd >= 0) close(m->fds->slots[i].fd);
    pthread_rwlock_destroy(&m->fds->mu);
    free(m->fds);
    m->fds = NULL;
}

/* The slot holding path, or NULL (under mu). */
static fd_slot *find(fdcache *c, const char *path, uint64_t hash)
{
    for (size_t i = 0; i < FDCACHE_SLOTS; i++) {
        fd_slot *s = &c->slots[i];
        if (s->fd >= 0 && s->hash == hash && strcmp(s->path, path) == 0) return s;
    }
    return NULL;
}

/* Empty a slot, handing back its descriptor for the caller to close outside the lock. */
static int take(fd_slot *s)
{
    int fd = s->fd;
    s->fd = -1;
    s->path[0] = '\0';
    return fd;
}

/* A duplicate of the cached descriptor of path, or -1 (not cached, or out of
 * descriptors: the caller opens the path itself and reports what that says). */
static int dup_cached(media *m, const char *path, uint64_t hash)
{
    fdcache *c = m->fds;
    int fd = -1;
    pthread_rwlock_rdlock(&c->mu);
    fd_slot *s = find(c, path, hash);
    if (s) {
        fd = fcntl(s->fd, F_DUPFD_CLOEXEC, 0);
        __atomic_store_n(&s->used_ms, m->h->now_ms(), __ATOMIC_RELAXED);
    }
    pthread_rwlock_unlock(&c->mu);
    return fd;
}

/* Keep a duplicate of fd (just opened for path) unless the path is cached already. */
static void keep(media *m, const char *path, uint64_t hash, int fd)
{
    if (strlen(path) >= MEDIA_PATH_MAX) return;
    fdcache *c = m->fds;
    int mine = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (mine < 0) return; /* short of descriptors: serve without caching */
    int old = -1;
    int64_t now = m->h->now_ms();
    pthread_rwlock_wrlock(&c->mu);
    if (find(c, path, hash)) {
        old = mine; /* another request cached it meanwhile */
    } else {
        fd_slot *victim = &c->slots[0];
        for (size_t i = 0; i < FDCACHE_SLOTS; i++) {
            fd_slot *s = &c->slots[i];
            if (s->fd < 0) {
                victim = s;
                break;
            }
            if (s->used_ms < victim->used_ms) victim = s;
        }
        if (victim->fd >= 0) old = take(victim);
        victim->fd = mine;
        victim->hash = hash;
        victim->used_ms = now;
        memcpy(victim->path, path, strlen(path) + 1);
    }
    pthread_rwlock_unlock(&c->mu);
    if (old >= 0) close(old);
}

void fdcache_forget(media *m, const char *path)
{
    fdcache *c = m->fds;
    if (!c) return;
    pthread_rwlock_wrlock(&c->mu);
    fd_slot *s = find(c, path, path_hash(path));
    int fd = s ? take(s) : -1;
    pthread_rwlock_unlock(&c->mu);
    if (fd >= 0) close(fd);
}

void fdcache_forget_under(media *m, const char *dir)
{
    fdcache *c = m->fds;
    if (!c) return;
    size_t n = strlen(dir);
    int gone[FDCACHE_SLOTS];
    size_t k = 0;
    pthread_rwlock_wrlock(&c->mu);
    for (size_t i = 0; i < FDCACHE_SLOTS; i++) {
        fd_slot *s = &c->slots[i];
        if (s->fd >= 0 && strncmp(s->path, dir, n) == 0 && s->path[n] == '/') gone[k++] = take(s);
    }
    pthread_rwlock_unlock(&c->mu);
    for (size_t i = 0; i < k; i++) close(gone[i]);
}

int fdcache_open(media *m, const char *path, uint64_t *size)
{
    uint64_t hash = path_hash(path);
    struct stat sb;
    int fd = m->fds ? dup_cached(m, path, hash) : -1;
    if (fd >= 0) {
        if (fstat(fd, &sb) == 0 && sb.st_nlink > 0) {
            *size = (uint64_t)sb.st_size;
            return fd;
        }
        close(fd); /* deleted or replaced since it was cached: open the path again */
        fdcache_forget(m, path);
    }
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    if (fstat(fd, &sb) < 0) {
        int err = errno;
        close(fd);
        errno = err;
        return -2;
    }
    *size = (uint64_t)sb.st_size;
    if (m->fds && S_ISREG(sb.st_mode)) keep(m, path, hash, fd);
    return fd;
}

/* The sweep: close what was not used for FDCACHE_IDLE_MS, then come back. At stop the
 * timer calls it once more and refuses the next one, which ends it. */
static void sweep(void *arg)
{
    media *m = arg;
    fdcache *c = m->fds;
    int idle[FDCACHE_SLOTS];
    size_t n = 0;
    int64_t now = m->h->now_ms();
    pthread_rwlock_wrlock(&c->mu);
    for (size_t i = 0; i < FDCACHE_SLOTS; i++) {
        fd_slot *s = &c->slots[i];
        if (s->fd >= 0 && now - s->used_ms >= FDCACHE_IDLE_MS) idle[n++] = take(s);
    }
    pthread_rwlock_unlock(&c->mu);
    for (size_t i = 0; i < n; i++) close(idle[i]);
    media_timer_add(m->timer, now + FDCACHE_SWEEP_MS, sweep, m);
}

int fdcache_start(media *m)
{
    if (!m->fds || !m->timer) return 0;
    return media_timer_add(m->timer, m->h->now_ms() + FDCACHE_SWEEP_MS, sweep, m);
}
